"""The four client workloads, driven with confluent-kafka (librdkafka) in its default configuration,
except linger.ms=5 on producers and acks where a workload names it.

Each workload returns a dict of plain figures (JSON-ready). Throughput counts value bytes only, as
Kafka's own perf tools do, and 1 MB = 2**20 bytes.

Whether the load generator is the bottleneck: each throughput workload reports the share of a core
its sending (or consuming) Python loop used (`client_loop_core_share`; near 1.0 the figure measures the
client). produce_throughput() can split its messages over several generator processes for that case.

The throughput producers register no delivery callback: a Python callback per message would cost the
client more CPU than the broker spends on it and measure the binding, not the broker. Instead every
run is checked afterwards with check_stored(): the fresh topic must hold exactly the messages sent.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import queue
import resource
import time
from functools import partial
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

MIB = 1 << 20
PRODUCER_LINGER_MS = 5
CLIENT_TIMEOUT_S = 30.0
# A workload that makes no progress for this long has hung; fail it instead of waiting forever.
STALL_TIMEOUT_S = 60.0
POLL_GRANULARITY_S = 0.001
# A consume(timeout=0.5) call this long waited for messages that were not there (the client's fetch back-off)
CONSUME_WAIT_S = 0.25
COORDINATOR_NOT_READY = frozenset(
    (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE)
)


class WorkloadFailed(RuntimeError):
    pass


def _producer(bootstrap: str, **settings: object) -> tuple[Producer, list[str]]:
    """A producer and the list its client-level errors (connection failures etc.) are collected in."""
    client_errors: list[str] = []
    config = {"bootstrap.servers": bootstrap, "linger.ms": PRODUCER_LINGER_MS, **settings}
    config["error_cb"] = lambda err: client_errors.append(str(err))
    return Producer(config), client_errors


def _admin(bootstrap: str) -> AdminClient:
    # log_level 5 (notice): leave out librdkafka's informational lines, such as the "Purging unserved
    # events" a short-lived admin client logs on close against Kafka.
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 5})


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create the topic with the AdminClient and wait until every partition has a leader."""
    admin = _admin(bootstrap)
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    futures[topic].result(timeout=CLIENT_TIMEOUT_S)
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while time.monotonic() < deadline:
        described = admin.list_topics(topic=topic, timeout=CLIENT_TIMEOUT_S).topics.get(topic)
        if (
            described is not None
            and described.error is None
            and len(described.partitions) == partitions
            and all(p.leader >= 0 and p.error is None for p in described.partitions.values())
        ):
            return
        time.sleep(0.05)
    raise WorkloadFailed(f"topic {topic} has no leader for every partition after {CLIENT_TIMEOUT_S} s")


def topic_config(bootstrap: str, topic: str) -> dict[str, str]:
    """The topic's effective configuration as the broker describes it (DescribeConfigs), so that the
    settings the two brokers gave the same topic can be compared."""
    resource = ConfigResource("topic", topic)
    admin = _admin(bootstrap)  # held until the answer: a destroyed client fails its pending futures
    entries = admin.describe_configs([resource])[resource].result(timeout=CLIENT_TIMEOUT_S)
    return {name: entry.value for name, entry in sorted(entries.items())}


def stored_message_count(bootstrap: str, topic: str, partitions: int) -> int:
    """Sum over the topic's partitions of latest minus earliest offset (AdminClient ListOffsets, so no
    consumer group and no group-coordinator work on the broker)."""
    admin = _admin(bootstrap)
    total = 0
    for spec, sign in ((OffsetSpec.latest(), 1), (OffsetSpec.earliest(), -1)):
        futures = admin.list_offsets({TopicPartition(topic, p): spec for p in range(partitions)})
        total += sign * sum(future.result(timeout=CLIENT_TIMEOUT_S).offset for future in futures.values())
    return total


def check_stored(bootstrap: str, topic: str, partitions: int, sent: int) -> None:
    """A throughput run counts only if the fresh topic holds exactly what was sent: nothing lost, and
    nothing stored twice by a retry."""
    stored = stored_message_count(bootstrap, topic, partitions)
    if stored != sent:
        raise WorkloadFailed(f"sent {sent} messages to {topic} but the broker stores {stored}")


def warm_group_coordinator(bootstrap: str, topic: str) -> None:
    """Commit one offset as a group, so the broker creates __consumer_offsets (50 partitions by default)
    now and not inside the first workload whose consumer has a group.id. While the topic's partitions
    are being created and loaded, a broker answers commits with a retriable error (Kafka:
    NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS): retry those until the deadline."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-warm-up"})
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    try:
        while True:
            try:
                consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
                return
            except KafkaException as exc:
                error = exc.args[0]
                retriable = error.retriable() or error.code() in COORDINATOR_NOT_READY
                if not retriable or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)
    finally:
        consumer.close()


def warm_transaction_coordinator(bootstrap: str) -> None:
    """Initialize one transactional producer, so the broker creates its transaction log (Kafka:
    __transaction_state, 50 partitions) now and not inside the transactional workload's CPU window."""
    producer, client_errors = _producer(bootstrap, **{"transactional.id": "bench-warm-up", "log_level": 3})
    try:
        producer.init_transactions(CLIENT_TIMEOUT_S)
    except KafkaException as exc:
        raise WorkloadFailed(f"init_transactions: {exc}; client errors: {client_errors[:5]}") from exc


def _enqueue(producer: Producer, topic: str, value: bytes, count: int) -> None:
    """Hand `count` copies of `value` to produce() as fast as it takes them (no flush)."""
    produce, poll = producer.produce, producer.poll
    sent = 0
    while sent < count:
        try:
            produce(topic, value)
        except BufferError:  # local queue full: let librdkafka drain delivery reports, then retry
            poll(0.001)
            continue
        sent += 1
        if not sent & 0x3FF:
            poll(0)


def _send(producer: Producer, topic: str, value: bytes, count: int) -> int:
    """Send `count` copies of `value` as fast as produce() takes them; the number left unacknowledged
    after flush()."""
    _enqueue(producer, topic, value, count)
    return producer.flush(STALL_TIMEOUT_S)


def _generator_process(
    bootstrap: str, topic: str, count: int, value_size: int, acks: str, ready: Queue, go: Event, results: Queue,
    settings: dict[str, object] | None = None,
) -> None:
    """One load-generator process of produce_throughput(): connect, say ready, wait for go, send."""
    producer, client_errors = _producer(bootstrap, **{"acks": acks, **(settings or {})})
    producer.list_topics(topic, timeout=CLIENT_TIMEOUT_S)
    value = os.urandom(value_size)
    ready.put(os.getpid())
    go.wait(CLIENT_TIMEOUT_S)
    cpu_before, loop_cpu_before = _process_cpu_seconds(), time.thread_time()
    started = time.perf_counter()  # CLOCK_MONOTONIC: comparable between processes
    unacked = _send(producer, topic, value, count)
    finished = time.perf_counter()
    results.put(
        {
            "started": started,
            "finished": finished,
            "unacked": unacked,
            "client_errors": client_errors[:5],
            "cpu_s": _process_cpu_seconds() - cpu_before,
            "loop_cpu_s": time.thread_time() - loop_cpu_before,
        }
    )


def _process_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _produce_in_processes(
    bootstrap: str, topic: str, count: int, value_size: int, acks: str, generators: int,
    settings: dict[str, object] | None = None,
) -> dict[str, float]:
    """Split `count` over `generators` spawned processes that start sending at one signal; the clock runs
    from the first process's start to the last one's flush()."""
    context = multiprocessing.get_context("spawn")  # no fork of a process that runs librdkafka threads
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    shares = [count // generators + (1 if index < count % generators else 0) for index in range(generators)]
    processes = [
        context.Process(target=_generator_process, args=(bootstrap, topic, share, value_size, acks, ready, go, results, settings))
        for share in shares
    ]
    for process in processes:
        process.start()
    try:
        for _ in processes:
            ready.get(timeout=CLIENT_TIMEOUT_S)
        go.set()
        reports = [results.get(timeout=STALL_TIMEOUT_S + CLIENT_TIMEOUT_S) for _ in processes]
    except queue.Empty as exc:
        raise WorkloadFailed("a load-generator process did not report in time") from exc
    finally:
        for process in processes:
            process.join(CLIENT_TIMEOUT_S)
            if process.is_alive():
                process.kill()
    unacked = sum(report["unacked"] for report in reports)
    if unacked:
        errors = [error for report in reports for error in report["client_errors"]]
        raise WorkloadFailed(f"{unacked} of {count} messages unacknowledged; client errors: {errors}")
    elapsed = max(r["finished"] for r in reports) - min(r["started"] for r in reports)
    return {
        "seconds": elapsed,
        "generator_processes_cpu_s": sum(r["cpu_s"] for r in reports),
        "client_loop_core_share": max(r["loop_cpu_s"] / (r["finished"] - r["started"]) for r in reports),
    }


def produce_throughput(
    bootstrap: str, topic: str, count: int, value_size: int, acks: str, generators: int = 1,
    settings: dict[str, object] | None = None,
) -> dict[str, float]:
    """Send `count` values of `value_size` bytes as fast as the client can, from this process or split
    over `generators` processes; the clock stops when all are acked. `settings`: more producer settings
    (e.g. {"enable.idempotence": True}). Check the result with check_stored() afterwards."""
    if generators > 1:
        figures = _produce_in_processes(bootstrap, topic, count, value_size, acks, generators, settings)
    else:
        producer, client_errors = _producer(bootstrap, **{"acks": acks, **(settings or {})})
        # Connect and learn the leaders before the clock starts, so the run measures steady-state sending.
        producer.list_topics(topic, timeout=CLIENT_TIMEOUT_S)
        value = os.urandom(value_size)
        loop_cpu_before = time.thread_time()
        started = time.perf_counter()
        unacked = _send(producer, topic, value, count)
        elapsed = time.perf_counter() - started
        if unacked:
            raise WorkloadFailed(f"{unacked} of {count} messages unacknowledged; client errors: {client_errors}")
        figures = {"seconds": elapsed, "client_loop_core_share": (time.thread_time() - loop_cpu_before) / elapsed}
    elapsed = figures["seconds"]
    return {
        **figures,
        "messages": count,
        "value_bytes": value_size,
        "generators": generators,
        "msgs_per_s": count / elapsed,
        "mb_per_s": count * value_size / MIB / elapsed,
    }


def transactional_produce_throughput(
    bootstrap: str, topic: str, count: int, value_size: int, per_transaction: int
) -> dict[str, float]:
    """Send `count` values of `value_size` bytes with a transactional producer (transactional.id set, so
    idempotent, acks=all), committing every `per_transaction` messages; the clock runs from the first
    begin_transaction() to the last commit_transaction() returning (every message acknowledged and
    committed). init_transactions() (FindCoordinator, InitProducerId, the transaction log's creation on a
    fresh broker) happens before the clock starts. Check the result with check_committed() afterwards."""
    producer, client_errors = _producer(bootstrap, **{"transactional.id": f"bench-txn-{topic}-{os.getpid()}"})
    producer.list_topics(topic, timeout=CLIENT_TIMEOUT_S)
    try:
        producer.init_transactions(CLIENT_TIMEOUT_S)
    except KafkaException as exc:
        raise WorkloadFailed(f"init_transactions: {exc}; client errors: {client_errors[:5]}") from exc
    value = os.urandom(value_size)
    transactions = 0
    loop_cpu_before = time.thread_time()
    started = time.perf_counter()
    sent = 0
    try:
        while sent < count:
            producer.begin_transaction()
            batch = min(per_transaction, count - sent)
            _enqueue(producer, topic, value, batch)
            sent += batch
            producer.commit_transaction(STALL_TIMEOUT_S)  # flushes, then EndTxn(commit)
            transactions += 1
    except KafkaException as exc:
        raise WorkloadFailed(f"after {transactions} transactions: {exc}; client errors: {client_errors[:5]}") from exc
    elapsed = time.perf_counter() - started
    loop_cpu = time.thread_time() - loop_cpu_before
    return {
        "seconds": elapsed,
        "client_loop_core_share": loop_cpu / elapsed,
        "messages": count,
        "value_bytes": value_size,
        "generators": 1,
        "transactions": transactions,
        "msgs_per_s": count / elapsed,
        "mb_per_s": count * value_size / MIB / elapsed,
        "transactions_per_s": transactions / elapsed,
    }


def check_committed(bootstrap: str, topic: str, partitions: int, sent: int) -> None:
    """A transactional run counts only if nothing is left open (every partition's last stable offset is
    its high watermark) and a read_committed consumer of the fresh topic reads exactly what was sent
    (the log also holds one commit marker per partition and transaction, so offsets do not count records)."""
    admin = _admin(bootstrap)
    ends = {}
    for isolation in (IsolationLevel.READ_UNCOMMITTED, IsolationLevel.READ_COMMITTED):
        futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)},
                                     isolation_level=isolation)
        ends[isolation] = {tp.partition: f.result(timeout=CLIENT_TIMEOUT_S).offset for tp, f in futures.items()}
    if ends[IsolationLevel.READ_COMMITTED] != ends[IsolationLevel.READ_UNCOMMITTED]:
        raise WorkloadFailed(f"{topic}: a transaction is still open: last stable offsets "
                             f"{ends[IsolationLevel.READ_COMMITTED]}, high watermarks {ends[IsolationLevel.READ_UNCOMMITTED]}")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-check-{topic}",
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        received, at_end, last_progress = 0, set(), time.monotonic()
        while len(at_end) < partitions:
            batch = consumer.consume(num_messages=1000, timeout=0.5)
            for message in batch:
                if message.error() is None:
                    received += 1
                elif message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                else:
                    raise WorkloadFailed(f"check of {topic}: consumer error: {message.error()}")
            if batch:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > STALL_TIMEOUT_S:
                raise WorkloadFailed(f"check of {topic}: consumer stalled at {received} messages")
    finally:
        consumer.close()
    if received != sent:
        raise WorkloadFailed(f"sent {sent} messages to {topic} in transactions but read_committed reads {received}")


def consume_throughput(bootstrap: str, topic: str, partitions: int, expected: int,
                       batch: int = 1000, settings: dict[str, object] | None = None) -> dict[str, float]:
    """Read the whole topic from offset 0 with assign(), ``consume(num_messages=batch, timeout=0.5)`` in a loop;
    clock runs from assign to the last message.

    Also counted: the consume() calls that took at least CONSUME_WAIT_S (half their timeout; a batch that is
    there takes milliseconds) and the time spent in them. A consumer whose client-side fetch queue fills up
    (librdkafka's queued.max.messages.kbytes, 64 MiB) stops fetching for fetch.queue.backoff.ms (1 s): each
    such pause shows as one or two waiting calls, whichever broker it reads from. ``settings``: more consumer
    settings (security.protocol and friends).
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-consume-{topic}-{batch}",
                         **(settings or {})})
    try:
        consumer.list_topics(topic, timeout=CLIENT_TIMEOUT_S)
        loop_cpu_before = time.thread_time()
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, partition, 0) for partition in range(partitions)])
        received = value_bytes = waiting_calls = 0
        waited = 0.0
        last_progress = started
        while received < expected:
            # Ask for no more than remain: consume() waits for a full batch until its timeout.
            asked = min(batch, expected - received)
            called = time.perf_counter()
            messages = consumer.consume(num_messages=asked, timeout=0.5)
            took = time.perf_counter() - called
            if took >= CONSUME_WAIT_S:
                waiting_calls += 1
                waited += took
            for message in messages:
                if message.error() is not None:
                    raise WorkloadFailed(f"consumer error: {message.error()}")
                value_bytes += len(message.value())
            if messages:
                received += len(messages)
                last_progress = time.perf_counter()
            elif time.perf_counter() - last_progress > STALL_TIMEOUT_S:
                raise WorkloadFailed(f"consumer stalled at {received} of {expected} messages")
        elapsed = time.perf_counter() - started
        loop_cpu = time.thread_time() - loop_cpu_before
    finally:
        consumer.close()
    return {
        "messages": received,
        "seconds": elapsed,
        "client_loop_core_share": loop_cpu / elapsed,
        "msgs_per_s": received / elapsed,
        "mb_per_s": value_bytes / MIB / elapsed,
        "waiting_calls": waiting_calls,
        "waiting_calls_s": waited,
    }


def _percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def delivery_latency(
    bootstrap: str, topic: str, rate: int, warmup_s: float, measure_s: float, value_size: int = 100
) -> dict[str, float]:
    """Send at a steady `rate` msgs/s (acks left at librdkafka's default, all); latency of a message is
    its delivery-callback time minus its send time. The warm-up's messages are sent but not counted."""
    producer, client_errors = _producer(bootstrap)
    producer.list_topics(topic, timeout=CLIENT_TIMEOUT_S)
    value = os.urandom(value_size)
    latencies: list[float] = []
    errors: list[str] = []

    def delivered(sent_at: float, counted: bool, err: object, _message: object) -> None:
        if err is not None:
            errors.append(str(err))
        elif counted:
            latencies.append(time.perf_counter() - sent_at)

    warmup_count = int(rate * warmup_s)
    total = warmup_count + int(rate * measure_s)
    produce, poll = producer.produce, producer.poll
    loop_cpu_before = time.thread_time()
    started = time.perf_counter()
    sent = 0
    while sent < total:
        due = min(total, int((time.perf_counter() - started) * rate) + 1)
        while sent < due:
            produce(topic, value, on_delivery=partial(delivered, time.perf_counter(), sent >= warmup_count))
            sent += 1
        # Sleep in poll() until the next message is due: delivery callbacks run the moment they arrive.
        # poll() counts whole milliseconds (a shorter timeout does not block), so wait at least 1 ms and
        # send what fell due meanwhile: without that the loop spins a whole core, which on a small
        # machine is taken from the broker under test.
        poll(max(POLL_GRANULARITY_S, started + sent / rate - time.perf_counter()))
    send_seconds = time.perf_counter() - started
    loop_cpu = time.thread_time() - loop_cpu_before
    unacked = producer.flush(STALL_TIMEOUT_S)
    if unacked or errors:
        raise WorkloadFailed(f"{unacked} unacknowledged, delivery errors: {errors[:5]} client errors: {client_errors}")
    latencies.sort()
    return {
        "messages": total,  # the warm-up's included: the broker handled them all
        "rate_target": rate,
        "rate_achieved": total / send_seconds,
        "client_loop_core_share": loop_cpu / send_seconds,
        "measured_messages": len(latencies),
        "p50_ms": _percentile(latencies, 0.50) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
        "max_ms": latencies[-1] * 1000,
    }

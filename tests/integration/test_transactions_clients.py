"""Transactions (KIP-98) end to end with real clients, against a real Apache Kafka 3.7.1 and against pykbroker
(txn_targets.py: the `target` fixture).

What each client does here is what applications do: confluent-kafka (librdkafka) transactions over two topics and
partitions with consumer-group offsets in the transaction, abort, fencing by a second producer with the same
transactional.id, read_committed vs read_uncommitted consumers, the last stable offset (LSO) holding
read_committed consumers back while a transaction is open, ListOffsets by isolation level; kafka-python 3,
aiokafka, KafkaJS (tests/js/txn_client.js) and the Java client 3.9 (tests/integration/java/TxnClient.java, run
as a single-file source program) each commit and abort and read back with read_committed; Kafka's own
kafka-transactions.sh lists and describes an open transaction.

Run: python3 -m pytest -q tests/integration/test_transactions_clients.py -k "not pykbroker"   (Kafka only)
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

import txn_targets

target = txn_targets.target  # the fixture: Kafka 3.7.1 and pykbroker
pytestmark = pytest.mark.timeout(300)

TIMEOUT_S = 60.0
# How long a read_committed consumer must stay without records to count as held back at the LSO: several fetch
# round trips of every client (fetch.wait.max.ms is 500 ms in librdkafka).
QUIET_S = 3.0
JS_DIR = Path(__file__).resolve().parents[1] / "js"
JAVA_SOURCE = Path(__file__).resolve().parent / "java" / "TxnClient.java"


# -- helpers ------------------------------------------------------------------------------------------------


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topics(bootstrap: str, topics: dict[str, int]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=n, replication_factor=1)
                                   for name, n in topics.items()])
    for future in futures.values():
        future.result(timeout=TIMEOUT_S)


def txn_producer(bootstrap: str, transactional_id: str, **config) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "linger.ms": 5, **config})
    producer.init_transactions(TIMEOUT_S)
    return producer


def produce_flushed(producer: Producer, messages: list[tuple[str, int, bytes]]) -> list[tuple[str, int, int]]:
    """Produce (topic, partition, value) in the open transaction and wait for every delivery report: the records
    are in the log (offsets returned), the transaction is not committed."""
    delivered, errors = [], []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            delivered.append((msg.topic(), msg.partition(), msg.offset()))

    for topic, partition, value in messages:
        producer.produce(topic, value=value, key=value, partition=partition, on_delivery=on_delivery)
    assert producer.flush(TIMEOUT_S) == 0, "messages still queued"
    assert not errors, f"delivery failed: {errors}"
    return delivered


def consumer(bootstrap: str, isolation: str, group: str | None = None, **config) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group or unique("reader"),
                     "isolation.level": isolation, "enable.auto.commit": False,
                     "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100, **config})


def read_values(bootstrap: str, partitions: list[tuple[str, int]], isolation: str, count: int,
                quiet: float = QUIET_S) -> list[tuple[str, int, int, bytes]]:
    """Everything a fresh consumer with that isolation level reads from the start of `partitions`: waits until
    `count` records came (or TIMEOUT_S), then `quiet` seconds more to catch any extra record."""
    reader = consumer(bootstrap, isolation)
    try:
        reader.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in partitions])
        return poll_until(reader, count, quiet)
    finally:
        reader.close()


def poll_until(reader: Consumer, count: int, quiet: float = QUIET_S) -> list[tuple[str, int, int, bytes]]:
    got: list[tuple[str, int, int, bytes]] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < count and time.monotonic() < deadline:
        got += _poll_once(reader)
    quiet_until = time.monotonic() + quiet
    while time.monotonic() < quiet_until:
        got += _poll_once(reader)
    return got


def _poll_once(reader: Consumer) -> list[tuple[str, int, int, bytes]]:
    got = []
    for msg in reader.consume(num_messages=500, timeout=0.2):
        if msg.error() is not None:
            if msg.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise AssertionError(f"consumer error: {msg.error()}")
        got.append((msg.topic(), msg.partition(), msg.offset(), msg.value()))
    return got


def list_offsets(bootstrap: str, topic: str, partition: int, isolation: IsolationLevel) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = TopicPartition(topic, partition)
    futures = admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=isolation, request_timeout=TIMEOUT_S)
    return futures[tp].result(timeout=TIMEOUT_S).offset


def committed_offsets(bootstrap: str, group: str, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The group's committed offsets as a read_committed consumer fetches them (OffsetFetch require_stable)."""
    reader = consumer(bootstrap, "read_committed", group=group)
    try:
        found = reader.committed([TopicPartition(t, p) for t, p in partitions], timeout=TIMEOUT_S)
        return {(tp.topic, tp.partition): tp.offset for tp in found}
    finally:
        reader.close()


def values_of(records) -> list[bytes]:
    return sorted(r[-1] for r in records)


# -- confluent-kafka -------------------------------------------------------------------------------------------


def test_confluent_commit_spans_topics_partitions_and_group_offsets(target):
    """One transaction: records to 2 partitions of one topic and 1 of another, plus a consumer group's offsets
    (send_offsets_to_transaction with the group metadata of a subscribed consumer); after commit a read_committed
    consumer reads all of it and the group's offsets are the ones sent."""
    out_a, out_b, source, group = unique("txn-a"), unique("txn-b"), unique("txn-in"), unique("txn-group")
    create_topics(target.bootstrap, {out_a: 2, out_b: 1, source: 1})
    plain = Producer({"bootstrap.servers": target.bootstrap})
    for i in range(5):
        plain.produce(source, value=f"in-{i}".encode(), partition=0)
    assert plain.flush(TIMEOUT_S) == 0

    member = consumer(target.bootstrap, "read_committed", group=group)
    member.subscribe([source])
    inputs = poll_until(member, 5, quiet=0)
    assert [v for *_, v in inputs] == [f"in-{i}".encode() for i in range(5)]

    producer = txn_producer(target.bootstrap, unique("tid-commit"))
    producer.begin_transaction()
    sent = [(out_a, 0, b"a0-0"), (out_a, 1, b"a1-0"), (out_b, 0, b"b0-0"), (out_a, 0, b"a0-1"), (out_b, 0, b"b0-1")]
    produce_flushed(producer, sent)
    producer.send_offsets_to_transaction([TopicPartition(source, 0, 5)], member.consumer_group_metadata(),
                                         TIMEOUT_S)
    producer.commit_transaction(TIMEOUT_S)
    member.close()

    read = read_values(target.bootstrap, [(out_a, 0), (out_a, 1), (out_b, 0)], "read_committed", len(sent))
    assert sorted((t, p, v) for t, p, _, v in read) == sorted(sent)
    # each partition's data records are at 0, 1, ...; the commit marker takes one more offset
    assert sorted((t, p, o) for t, p, o, _ in read) == sorted(
        [(out_a, 0, 0), (out_a, 0, 1), (out_a, 1, 0), (out_b, 0, 0), (out_b, 0, 1)])
    assert list_offsets(target.bootstrap, out_b, 0, IsolationLevel.READ_UNCOMMITTED) == 3
    assert list_offsets(target.bootstrap, out_b, 0, IsolationLevel.READ_COMMITTED) == 3
    assert committed_offsets(target.bootstrap, group, [(source, 0)]) == {(source, 0): 5}


def test_confluent_abort_hides_records_from_read_committed_only(target):
    """An aborted transaction's records (and offsets sent in it) are invisible to read_committed consumers and
    to the group; read_uncommitted consumers read them; the next transaction commits normally."""
    topic, source, group = unique("txn-abort"), unique("txn-abort-in"), unique("txn-abort-group")
    create_topics(target.bootstrap, {topic: 2, source: 1})
    producer = txn_producer(target.bootstrap, unique("tid-abort"))

    producer.begin_transaction()
    aborted = [(topic, 0, b"aborted-0"), (topic, 1, b"aborted-1"), (topic, 0, b"aborted-2")]
    produce_flushed(producer, aborted)
    reader = consumer(target.bootstrap, "read_committed", group=group)
    producer.send_offsets_to_transaction([TopicPartition(source, 0, 42)], reader.consumer_group_metadata(),
                                         TIMEOUT_S)
    reader.close()
    producer.abort_transaction(TIMEOUT_S)

    producer.begin_transaction()
    committed = [(topic, 0, b"committed-0"), (topic, 1, b"committed-1")]
    produce_flushed(producer, committed)
    producer.commit_transaction(TIMEOUT_S)

    parts = [(topic, 0), (topic, 1)]
    assert values_of(read_values(target.bootstrap, parts, "read_committed", 2)) == [b"committed-0", b"committed-1"]
    everything = read_values(target.bootstrap, parts, "read_uncommitted", 5)
    assert values_of(everything) == sorted(v for *_, v in aborted + committed)
    # partition 0: aborted-0 @0, aborted-2 @1, ABORT marker @2, committed-0 @3, COMMIT marker @4
    assert sorted(o for t, p, o, v in everything if p == 0) == [0, 1, 3]
    assert list_offsets(target.bootstrap, topic, 0, IsolationLevel.READ_COMMITTED) == 5
    assert committed_offsets(target.bootstrap, group, [(source, 0)]) == {(source, 0): -1001}  # none: aborted


def test_confluent_second_producer_fences_the_first(target):
    """A second producer with the same transactional.id (InitProducerId bumps the epoch) aborts the first one's
    open transaction; the first producer's next operation fails with a fatal (fenced) error."""
    topic, tid = unique("txn-fence"), unique("tid-fence")
    create_topics(target.bootstrap, {topic: 1})
    first = txn_producer(target.bootstrap, tid)
    first.begin_transaction()
    produce_flushed(first, [(topic, 0, b"zombie-0"), (topic, 0, b"zombie-1")])

    second = txn_producer(target.bootstrap, tid)

    with pytest.raises(KafkaException) as failed:
        first.produce(topic, value=b"zombie-2", partition=0)
        first.flush(TIMEOUT_S)
        first.commit_transaction(TIMEOUT_S)
    error = failed.value.args[0]
    assert error.fatal(), f"not fatal: {error}"
    assert error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH), error

    second.begin_transaction()
    produce_flushed(second, [(topic, 0, b"live-0")])
    second.commit_transaction(TIMEOUT_S)
    assert values_of(read_values(target.bootstrap, [(topic, 0)], "read_committed", 1)) == [b"live-0"]
    assert values_of(read_values(target.bootstrap, [(topic, 0)], "read_uncommitted", 3, quiet=1.0)) == [
        b"live-0", b"zombie-0", b"zombie-1"]


def test_confluent_open_transaction_holds_read_committed_at_the_lso(target):
    """While a transaction is open (records produced, not committed), a read_committed consumer stops at the
    last stable offset and ListOffsets(read_committed) answers the LSO, read_uncommitted reads on to the high
    watermark; the commit releases the read_committed consumer."""
    topic = unique("txn-lso")
    create_topics(target.bootstrap, {topic: 1})
    producer = txn_producer(target.bootstrap, unique("tid-lso"))
    producer.begin_transaction()
    produce_flushed(producer, [(topic, 0, b"first-%d" % i) for i in range(3)])
    producer.commit_transaction(TIMEOUT_S)          # offsets 0-2, COMMIT marker at 3
    producer.begin_transaction()
    produce_flushed(producer, [(topic, 0, b"open-%d" % i) for i in range(2)])  # offsets 4-5, open

    assert list_offsets(target.bootstrap, topic, 0, IsolationLevel.READ_COMMITTED) == 4  # the LSO
    assert list_offsets(target.bootstrap, topic, 0, IsolationLevel.READ_UNCOMMITTED) == 6  # the high watermark
    committed_reader = consumer(target.bootstrap, "read_committed")
    uncommitted_reader = consumer(target.bootstrap, "read_uncommitted")
    try:
        assert committed_reader.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S) == (0, 4)
        assert uncommitted_reader.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S) == (0, 6)
        committed_reader.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        uncommitted_reader.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        held = poll_until(committed_reader, 3)
        assert [(o, v) for _, _, o, v in held] == [(i, b"first-%d" % i) for i in range(3)]
        past = poll_until(uncommitted_reader, 5, quiet=0.5)
        assert [o for _, _, o, _ in past] == [0, 1, 2, 4, 5]

        producer.commit_transaction(TIMEOUT_S)       # COMMIT marker at 6
        released = poll_until(committed_reader, 2, quiet=0.5)
        assert [(o, v) for _, _, o, v in released] == [(4, b"open-0"), (5, b"open-1")]
    finally:
        committed_reader.close()
        uncommitted_reader.close()
    assert list_offsets(target.bootstrap, topic, 0, IsolationLevel.READ_COMMITTED) == 7
    assert list_offsets(target.bootstrap, topic, 0, IsolationLevel.READ_UNCOMMITTED) == 7


# -- kafka-python 3 ----------------------------------------------------------------------------------------------


def test_kafkapython_transactions_commit_abort_and_offsets(target):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.structs import OffsetAndMetadata
    from kafka.structs import TopicPartition as KTopicPartition

    topic, source, group = unique("txn-kpy"), unique("txn-kpy-in"), unique("txn-kpy-group")
    create_topics(target.bootstrap, {topic: 2, source: 1})
    producer = KafkaProducer(bootstrap_servers=target.bootstrap, transactional_id=unique("tid-kpy"),
                             request_timeout_ms=30000)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(4):
            producer.send(topic, value=f"kpy-commit-{i}".encode(), partition=i % 2)
        producer.send_offsets_to_transaction({KTopicPartition(source, 0): OffsetAndMetadata(7, "", -1)}, group)
        producer.commit_transaction()
        producer.begin_transaction()
        for i in range(3):
            producer.send(topic, value=f"kpy-abort-{i}".encode(), partition=i % 2)
        producer.send_offsets_to_transaction({KTopicPartition(source, 0): OffsetAndMetadata(9, "", -1)}, group)
        producer.flush()
        producer.abort_transaction()
    finally:
        producer.close(timeout=TIMEOUT_S)

    reader = KafkaConsumer(topic, bootstrap_servers=target.bootstrap, isolation_level="read_committed",
                           auto_offset_reset="earliest", consumer_timeout_ms=int(QUIET_S * 1000),
                           fetch_max_wait_ms=100)
    try:
        values = sorted(m.value for m in reader)
    finally:
        reader.close()
    assert values == [f"kpy-commit-{i}".encode() for i in range(4)]
    assert committed_offsets(target.bootstrap, group, [(source, 0)]) == {(source, 0): 7}
    everything = read_values(target.bootstrap, [(topic, 0), (topic, 1)], "read_uncommitted", 7, quiet=1.0)
    assert len(everything) == 7


# -- aiokafka ------------------------------------------------------------------------------------------------------


def test_aiokafka_transactions_commit_abort_and_offsets(target):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as ATopicPartition

    topic, source, group = unique("txn-aio"), unique("txn-aio-in"), unique("txn-aio-group")
    create_topics(target.bootstrap, {topic: 2, source: 1})

    class Rollback(Exception):
        pass

    async def scenario() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=target.bootstrap, transactional_id=unique("tid-aio"))
        await producer.start()
        try:
            async with producer.transaction():
                for i in range(4):
                    await producer.send_and_wait(topic, f"aio-commit-{i}".encode(), partition=i % 2)
                await producer.send_offsets_to_transaction({ATopicPartition(source, 0): 3}, group)
            with pytest.raises(Rollback):
                async with producer.transaction():  # an exception inside aborts the transaction
                    for i in range(2):
                        await producer.send_and_wait(topic, f"aio-abort-{i}".encode(), partition=i % 2)
                    await producer.send_offsets_to_transaction({ATopicPartition(source, 0): 5}, group)
                    raise Rollback()
        finally:
            await producer.stop()
        reader = AIOKafkaConsumer(topic, bootstrap_servers=target.bootstrap, isolation_level="read_committed",
                                  auto_offset_reset="earliest", fetch_max_wait_ms=100)
        await reader.start()
        got: list[bytes] = []
        try:
            deadline = time.monotonic() + TIMEOUT_S
            quiet_until = None
            while time.monotonic() < (quiet_until or deadline):
                batches = await reader.getmany(timeout_ms=200)
                got += [m.value for records in batches.values() for m in records]
                if len(got) >= 4 and quiet_until is None:
                    quiet_until = time.monotonic() + QUIET_S
        finally:
            await reader.stop()
        return got

    got = asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S * 2))
    assert sorted(got) == [f"aio-commit-{i}".encode() for i in range(4)]
    assert committed_offsets(target.bootstrap, group, [(source, 0)]) == {(source, 0): 3}


# -- KafkaJS -------------------------------------------------------------------------------------------------------


NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None or not (JS_DIR / "node_modules" / "kafkajs").is_dir(),
                    reason="needs node and `npm install --prefix tests/js` (kafkajs 2.2.4)")
def test_kafkajs_transactions_commit_abort_and_read_committed_consumer(target):
    topic, source, group = unique("txn-js"), unique("txn-js-in"), unique("txn-js-group")
    create_topics(target.bootstrap, {topic: 2, source: 1})
    options = {"brokers": [target.bootstrap], "topic": topic, "transactionalId": unique("tid-js"),
               "offsetsTopic": source, "offsetsGroup": group, "readerGroup": unique("txn-js-reader"),
               "quietMs": int(QUIET_S * 1000), "timeoutMs": int(TIMEOUT_S * 1000)}
    done = subprocess.run([NODE, str(JS_DIR / "txn_client.js"), json.dumps(options)], capture_output=True,
                          text=True, timeout=TIMEOUT_S * 3, cwd=JS_DIR)
    assert done.returncode == 0, f"txn_client.js exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(report["read"]) == sorted(f"js-commit-{i}" for i in range(4)), report
    assert committed_offsets(target.bootstrap, group, [(source, 0)]) == {(source, 0): 4}
    everything = read_values(target.bootstrap, [(topic, 0), (topic, 1)], "read_uncommitted", 6, quiet=1.0)
    assert values_of(everything) == sorted([f"js-commit-{i}".encode() for i in range(4)]
                                           + [f"js-abort-{i}".encode() for i in range(2)])


# -- the Java client 3.9 ----------------------------------------------------------------------------------------------


def java_client_or_skip() -> tuple[str, Path]:
    from kafka_tools import find_refkit

    lib = find_refkit() / "java-client" / "lib"
    java = shutil.which("java")
    if java is None or not (lib / "kafka-clients-3.9.0.jar").is_file():
        pytest.skip(f"needs java and the Java client at {lib} (the reference kit)")
    return java, lib


def test_java_client_transactions_commit_abort_and_read_committed_consumer(target, tmp_path):
    """KafkaProducer (transactional.id) commits 4 records with group offsets, aborts 2; a read_committed
    KafkaConsumer reads the 4. Run as Java 11+'s single-file source program (no build step)."""
    java, lib = java_client_or_skip()
    topic, source, group = unique("txn-java"), unique("txn-java-in"), unique("txn-java-group")
    create_topics(target.bootstrap, {topic: 2, source: 1})
    done = subprocess.run(
        [java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{lib}/*", str(JAVA_SOURCE),
         target.bootstrap, topic, unique("tid-java"), source, group, str(int(QUIET_S * 1000))],
        capture_output=True, text=True, timeout=TIMEOUT_S * 4, cwd=tmp_path)
    assert done.returncode == 0, f"TxnClient.java exited {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
    read = [line.removeprefix("read ") for line in done.stdout.splitlines() if line.startswith("read ")]
    assert sorted(read) == [f"java-commit-{i}" for i in range(4)], done.stdout
    assert committed_offsets(target.bootstrap, group, [(source, 0)]) == {(source, 0): 4}


# -- kafka-transactions.sh --------------------------------------------------------------------------------------------


def test_kafka_transactions_tool_lists_and_describes_an_open_transaction(target):
    """kafka-transactions.sh (ListTransactions, DescribeTransactions, DescribeProducers) while a transaction is open
    and after its commit: the transactional id's state, its partitions, the producer's open transaction start."""
    from kafka_tools import kafka_tools_or_skip

    tools = kafka_tools_or_skip()
    topic, tid = unique("txn-tool"), unique("tid-tool")
    create_topics(target.bootstrap, {topic: 2})
    # (a 10-minute transaction timeout: four JVM runs on a loaded machine must not outlast the open transaction)
    producer = txn_producer(target.bootstrap, tid, **{"transaction.timeout.ms": 600000})
    producer.begin_transaction()
    produce_flushed(producer, [(topic, 0, b"w"), (topic, 0, b"v")])
    producer.commit_transaction(TIMEOUT_S)                 # topic-0: w @0, v @1, COMMIT @2
    producer.begin_transaction()
    produce_flushed(producer, [(topic, 0, b"x"), (topic, 1, b"y")])   # open: x @3 of topic-0, y @0 of topic-1

    def run(*args: str) -> list[list[str]]:
        out = tools.run("kafka-transactions.sh", "--bootstrap-server", target.bootstrap, *args).stdout
        return [line.split() for line in out.splitlines() if line.strip()]

    listed = run("list")
    assert listed[0] == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"], listed
    rows = [row for row in listed[1:] if row[0] == tid]
    assert len(rows) == 1 and rows[0][3] == "Ongoing", listed
    producer_id = rows[0][2]

    header, *values = run("describe", "--transactional-id", tid)
    described = dict(zip(header, values[0][:len(header) - 1] + [" ".join(values[0][len(header) - 1:])]))
    assert described["TransactionState"] == "Ongoing" and described["ProducerId"] == producer_id, described
    assert described["TransactionTimeoutMs"] == "600000", described
    assert set(described["TopicPartitions"].split(",")) == {f"{topic}-0", f"{topic}-1"}, described

    header, *values = run("describe-producers", "--topic", topic, "--partition", "0")
    producers = [dict(zip(header, row)) for row in values]
    assert [(p["ProducerId"], p["LastSequence"], p["CurrentTransactionStartOffset"]) for p in producers] == [
        (producer_id, "2", "3")], producers
    header, *hanging = run("find-hanging", "--broker-id", "1")
    assert header[:2] == ["Topic", "Partition"] and not hanging, hanging  # open, but known to its coordinator

    producer.commit_transaction(TIMEOUT_S)
    header, *values = run("describe", "--transactional-id", tid)
    assert dict(zip(header, values[0]))["TransactionState"] == "CompleteCommit", values
    header, *values = run("describe-producers", "--topic", topic, "--partition", "0")
    assert [dict(zip(header, row))["CurrentTransactionStartOffset"] for row in values] == ["None"], values


# -- the coordinator's limits -------------------------------------------------------------------------------------------


def test_confluent_transaction_timeout_above_the_maximum_is_refused(target):
    """transaction.timeout.ms above the broker's transaction.max.timeout.ms (900000 by default): InitProducerId
    answers INVALID_TRANSACTION_TIMEOUT, fatal for the producer."""
    producer = Producer({"bootstrap.servers": target.bootstrap, "transactional.id": unique("tid-too-long"),
                         "transaction.timeout.ms": 900001})
    with pytest.raises(KafkaException) as failed:
        producer.init_transactions(TIMEOUT_S)
    assert failed.value.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT, failed.value.args[0]
    assert failed.value.args[0].fatal()


def test_confluent_open_transaction_is_aborted_after_its_timeout(target):
    """A transaction left open past its transaction.timeout.ms is aborted by the coordinator (Kafka checks every
    transaction.abort.timed.out.transaction.cleanup.interval.ms, 10 s by default) with an epoch bump: the last
    stable offset moves past it, read_committed never sees it, and the producer is fenced."""
    topic = unique("txn-timeout")
    create_topics(target.bootstrap, {topic: 1})
    producer = txn_producer(target.bootstrap, unique("tid-timeout"),
                            **{"transaction.timeout.ms": 10000, "message.timeout.ms": 10000})
    producer.begin_transaction()
    produce_flushed(producer, [(topic, 0, b"expired-0"), (topic, 0, b"expired-1")])
    assert list_offsets(target.bootstrap, topic, 0, IsolationLevel.READ_COMMITTED) == 0  # (10 s before the abort)

    def aborted() -> bool:
        return list_offsets(target.bootstrap, topic, 0, IsolationLevel.READ_COMMITTED) == 3  # after the ABORT @2
    deadline = time.monotonic() + TIMEOUT_S
    while not aborted():
        assert time.monotonic() < deadline, "the timed-out transaction was not aborted"
        time.sleep(0.2)
    assert list_offsets(target.bootstrap, topic, 0, IsolationLevel.READ_UNCOMMITTED) == 3

    with pytest.raises(KafkaException) as failed:
        producer.produce(topic, value=b"late", partition=0)
        producer.flush(TIMEOUT_S)
        producer.commit_transaction(TIMEOUT_S)
    assert failed.value.args[0].fatal(), failed.value.args[0]
    assert read_values(target.bootstrap, [(topic, 0)], "read_committed", 0, quiet=1.0) == []

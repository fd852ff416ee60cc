"""Log compaction with a real broker and real clients (confluent-kafka): compacted topics, null keys refused,
__consumer_offsets compacted, and a broker killed at each step of a cleaner swap losing nothing."""

from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from broker_process import BrokerProcess, wait_until
from pykbroker.log.segment import iter_file_headers
from pykbroker.protocol.records import InvalidRecordBatch

pytestmark = pytest.mark.timeout(240)

TIMEOUT_S = 60
CLEANER = {"log.cleaner.backoff.ms": 100}
# TAIL_ALONE: a 4,000-byte record is produced in a call of its own. Batched with up to 4 records before it
# (batch.num.messages 5, as the producer's timing happens to batch them) it would make a batch larger than
# segment.bytes 4096, refused with RECORD_LIST_TOO_LARGE as Kafka refuses it (seen once in a clean-clone run).
COMPACTED = {"cleanup.policy": "compact", "segment.bytes": "4096", "min.cleanable.dirty.ratio": "0.01",
             "delete.retention.ms": "0"}


def wait_for(condition, what: str) -> None:
    wait_until(condition, what, TIMEOUT_S)


def create_topic(bootstrap: str, topic: str, configs: dict, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.create_topics([NewTopic(topic, num_partitions=partitions, config=configs)]).values()
    future.result(timeout=TIMEOUT_S)


def produce(bootstrap: str, topic: str, pairs, **config) -> list:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 5, **config})
    errors = []

    def report(err, msg):
        if err is not None:
            errors.append(err)

    for key, value in pairs:
        producer.produce(topic, key=key, value=value, on_delivery=report)
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0
    return errors


def consume_all(bootstrap: str, topic: str, partition: int = 0) -> list[tuple[int, bytes | None, bytes | None]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    out = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(message.error())
            out.append((message.offset(), message.key(), message.value()))
    finally:
        consumer.close()
    raise AssertionError("did not reach the partition's end")


def latest_values(records) -> dict:
    values = {}
    for _, key, value in records:
        values[key] = value
    return values


def cleaned_up_to(broker: BrokerProcess, topic: str, partition: int = 0) -> int:
    path = broker.data_dir / "cleaner-offset-checkpoint"
    try:
        lines = path.read_text().splitlines()[2:]
    except FileNotFoundError:
        return -1
    for line in lines:
        name, index, offset = line.split()
        if name == topic and int(index) == partition:
            return int(offset)
    return -1


def updates(rounds: int, keys: int, size: int = 100):
    expected = {}
    pairs = []
    for round_ in range(rounds):
        for k in range(keys):
            key = f"key-{k}".encode()
            value = f"{round_}-".encode() + b"x" * size
            pairs.append((key, value))
            expected[key] = value
    return pairs, expected


# -- a compacted topic -----------------------------------------------------------------------------


def test_a_consumer_from_the_beginning_sees_the_latest_value_per_key(broker_factory, topic_name):
    broker = broker_factory.make(CLEANER)
    create_topic(broker.bootstrap, topic_name, COMPACTED)
    pairs, expected = updates(rounds=30, keys=10)
    pairs += [(b"key-3", None), (b"key-4", None)]  # tombstones
    expected[b"key-3"] = expected[b"key-4"] = None
    assert not produce(broker.bootstrap, topic_name, pairs)
    # a last record rolls the tombstones' segment out of the active one
    assert not produce(broker.bootstrap, topic_name, [(b"tail", b"x" * 4000)])
    expected[b"tail"] = b"x" * 4000
    end = len(pairs) + 1
    wait_for(lambda: cleaned_up_to(broker, topic_name) >= end - 1, "the cleaner to reach the last segment")
    records = consume_all(broker.bootstrap, topic_name)
    assert latest_values(records) == {k: v for k, v in expected.items()} or \
        latest_values(records) == {k: v for k, v in expected.items() if v is not None}
    assert len(records) < len(pairs) / 5  # the old values are gone
    offsets = [offset for offset, _, _ in records]
    assert offsets == sorted(offsets) and offsets[-1] == end - 1  # offsets kept, with gaps
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
    described = admin.describe_configs([resource])[resource].result(timeout=TIMEOUT_S)
    assert described["cleanup.policy"].value == "compact"
    assert described["min.cleanable.dirty.ratio"].value == "0.01"
    # tombstones go too, at a later cleaning (delete.retention.ms=0, Kafka's rule): more data, more cleaning
    checkpoint = cleaned_up_to(broker, topic_name)
    more, more_expected = updates(rounds=10, keys=2)
    assert not produce(broker.bootstrap, topic_name, more)
    assert not produce(broker.bootstrap, topic_name, [(b"tail", b"y" * 4000)])  # alone: see TAIL_ALONE
    wait_for(lambda: cleaned_up_to(broker, topic_name) > checkpoint, "a second cleaning")
    final = latest_values(consume_all(broker.bootstrap, topic_name))
    assert b"key-3" not in final and b"key-4" not in final
    assert final[b"key-0"] == more_expected[b"key-0"] and final[b"key-9"] == expected[b"key-9"]


def test_a_null_key_is_refused_with_invalid_record(broker_factory, topic_name):
    broker = broker_factory.make(CLEANER)
    create_topic(broker.bootstrap, topic_name, {"cleanup.policy": "compact"})
    errors = produce(broker.bootstrap, topic_name, [(None, b"no key")], retries=0)
    assert [error.code() for error in errors] == [KafkaError.INVALID_RECORD]
    assert not produce(broker.bootstrap, topic_name, [(b"k", b"with key")])
    assert consume_all(broker.bootstrap, topic_name) == [(0, b"k", b"with key")]  # nothing of the refused batch


def test_a_null_key_on_a_delete_topic_is_fine(broker_factory, topic_name):
    broker = broker_factory.make(CLEANER)
    create_topic(broker.bootstrap, topic_name, {"cleanup.policy": "delete"})
    assert not produce(broker.bootstrap, topic_name, [(None, b"no key")])


# -- rolls and retention of compacted topics -------------------------------------------------------


def produce_at(bootstrap: str, topic: str, records) -> None:
    """(key, value, CreateTime timestamp) each in its own produce request, in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    errors = []
    for key, value, timestamp in records:
        producer.produce(topic, key=key, value=value, timestamp=timestamp,
                         on_delivery=lambda err, msg: errors.append(err) if err is not None else None)
        assert producer.flush(TIMEOUT_S) == 0
    assert not errors


def segment_bases(broker: BrokerProcess, topic: str, partition: int = 0) -> list[int]:
    return sorted(int(path.stem) for path in (broker.data_dir / f"{topic}-{partition}").glob("*.log"))


def test_the_latest_updates_in_the_active_segment_of_a_compacted_topic_all_stay(broker_factory, topic_name):
    """Kafka rolls a segment by segment.ms only when an append finds it exceeded (LogSegment.shouldRoll), and
    never cleans the active segment: however long the cleaner runs, a consumer reading the tail of a
    compacted topic sees every recent update of a key."""
    broker = broker_factory.make(CLEANER)
    create_topic(broker.bootstrap, topic_name, {"cleanup.policy": "compact", "segment.ms": "100",
                                                "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0"})
    start = int(time.time() * 1000) - 60_000
    # Four segments, rolled by the records' own clock: each append comes 1 s after the previous one's.
    produce_at(broker.bootstrap, topic_name, [(b"k", b"old-%d" % i, start + 1_000 * i) for i in range(4)])
    # Five updates of the key within 100 ms of the first one: the first rolls, they all share the last segment.
    updates_at = start + 10_000
    produce_at(broker.bootstrap, topic_name, [(b"k", b"new-%d" % i, updates_at + i) for i in range(5)])
    written = time.monotonic()
    # (the cleaner may have merged the segments before the last already: only the last one's base is sure)
    assert segment_bases(broker, topic_name)[-1] == 4
    wait_for(lambda: cleaned_up_to(broker, topic_name) == 4, "the cleaner to clean the segments before the last")
    # Cleaner rounds for a few seconds (a roll by the clock alone would have come within one): a second
    # compacted topic, written round after round, gets cleaned each time.
    probe = topic_name + "-probe"
    create_topic(broker.bootstrap, probe, {"cleanup.policy": "compact", "segment.ms": "100",
                                           "min.cleanable.dirty.ratio": "0.01"})
    now = int(time.time() * 1000)
    rounds = 0
    while rounds < 2 or time.monotonic() - written < 3:
        produce_at(broker.bootstrap, probe, [(b"p", b"%d" % i, now + 1_000 * (2 * rounds + i)) for i in range(2)])
        wait_for(lambda: cleaned_up_to(broker, probe) == 2 * rounds + 1, f"cleaning {rounds + 1} of the probe topic")
        rounds += 1
    # The value of the last segment before the active one stays too: the cleaning that reached it had not
    # mapped the newer ones, which the active segment holds (as in Kafka).
    records = consume_all(broker.bootstrap, topic_name)
    assert records == [(3, b"k", b"old-3")] + [(4 + i, b"k", b"new-%d" % i) for i in range(5)]
    assert segment_bases(broker, topic_name)[-1] == 4 and cleaned_up_to(broker, topic_name) == 4
    # The next append past segment.ms rolls the segment, which then gets cleaned.
    produce_at(broker.bootstrap, topic_name, [(b"other", b"x", updates_at + 1_000)])
    wait_for(lambda: cleaned_up_to(broker, topic_name) == 9, "the cleaner to clean the rolled segment")
    assert consume_all(broker.bootstrap, topic_name) == [(8, b"k", b"new-4"), (9, b"other", b"x")]


def test_compact_delete_retention_runs_with_the_cleaner_not_the_retention_check(broker_factory, topic_name):
    """Kafka's cleaner thread applies retention to compact,delete logs at each of its rounds
    (LogCleaner.cleanFilthiestLog: deleteOldSegments on LogCleanerManager.deletableLogs), every
    log.cleaner.backoff.ms at most; the retention check (log.retention.check.interval.ms, 5 min) skips them."""
    broker = broker_factory.make({**CLEANER, "log.retention.check.interval.ms": 3_600_000})
    create_topic(broker.bootstrap, topic_name, {"cleanup.policy": "compact,delete", "retention.ms": "600000",
                                                "segment.ms": "60000"})
    now = int(time.time() * 1000)
    hour_ago = now - 3_600_000
    # The first segment holds records of an hour ago; a recent append rolls (segment.ms counts record time).
    produce_at(broker.bootstrap, topic_name, [(b"a", b"1", hour_ago), (b"b", b"2", hour_ago + 1)])
    assert not produce(broker.bootstrap, topic_name, [(b"c", b"3")])
    wait_for(lambda: segment_bases(broker, topic_name) == [2], "the expired segment to be deleted")
    assert consume_all(broker.bootstrap, topic_name) == [(2, b"c", b"3")]
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"w-{time.monotonic_ns()}"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=TIMEOUT_S)
    finally:
        consumer.close()
    assert (low, high) == (2, 3)


# -- __consumer_offsets ----------------------------------------------------------------------------


def commit_many(bootstrap: str, group: str, topic: str, commits: int) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        for offset in range(1, commits + 1):
            consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


def committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        (result,) = consumer.committed([TopicPartition(topic, 0)], timeout=TIMEOUT_S)
        return result.offset
    finally:
        consumer.close()


def set_topic_config(bootstrap: str, topic: str, name: str, value: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic,
                              incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=TIMEOUT_S)


def offsets_log_records(broker: BrokerProcess) -> int | None:
    """Records held in the __consumer_offsets segment files (None while a cleaning swaps files in)."""
    try:
        return sum(header.record_count for header in batch_headers(broker, "__consumer_offsets"))
    except (FileNotFoundError, InvalidRecordBatch):
        return None  # a segment replaced or a batch half-appended between the listing and the read


def test_consumer_offsets_compact_and_a_restart_loads_the_latest_commit(broker_factory, topic_name):
    # 600 commits of one group/partition: ~48 fit in a segment of 8 KiB, so once the cleaner has run the log
    # holds the latest commit plus the active segment's. (The cleaner may run while the commits go on: the
    # count of records is compared with what was committed, never with a size measured after the commits.)
    broker = broker_factory.make({**CLEANER, "offsets.topic.num.partitions": 1, "log.segment.bytes": 8192})
    create_topic(broker.bootstrap, topic_name, {})
    commit_many(broker.bootstrap, "g", topic_name, 600)
    wait_for(lambda: cleaned_up_to(broker, "__consumer_offsets") > 0, "__consumer_offsets to be cleaned")
    wait_for(lambda: (offsets_log_records(broker) or 600) < 600 / 3, "the offsets log to hold far fewer than 600 commits")
    assert committed(broker.bootstrap, "g", topic_name) == 600
    broker.restart()
    assert committed(broker.bootstrap, "g", topic_name) == 600
    wait_for(lambda: (offsets_log_records(broker) or 600) < 600 / 3, "the offsets log to stay small after the restart")


# -- crash safety ----------------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["cleaned", "swap", "deleted", "renamed"])
def test_a_broker_killed_during_a_swap_loses_nothing(tmp_path, monkeypatch, step):
    broker = BrokerProcess(tmp_path / "b", config=CLEANER)
    try:
        broker.start()
        # nothing is cleanable (min.compaction.lag.ms of an hour) until every record is in: the cleaning that
        # exits the broker must not cut the produce short
        create_topic(broker.bootstrap, "t", {**COMPACTED, "delete.retention.ms": "86400000",
                                             "min.compaction.lag.ms": "3600000"})
        pairs, expected = updates(rounds=20, keys=15)
        assert not produce(broker.bootstrap, "t", pairs)
        assert not produce(broker.bootstrap, "t", [(b"tail", b"z" * 4000)])  # alone: see TAIL_ALONE
        expected[b"tail"] = b"z" * 4000
        before = consume_all(broker.bootstrap, "t")
        assert latest_values(before) == expected
        # the next cleaning exits the broker at ``step`` (as kill -9 would leave it)
        more, more_expected = updates(rounds=5, keys=15)
        expected.update(more_expected)
        broker.stop()
        monkeypatch.setenv("PYKBROKER_CLEANER_CRASH_AT", step)
        broker.start()
        assert not produce(broker.bootstrap, "t", more)
        assert not produce(broker.bootstrap, "t", [(b"tail", b"w" * 4000)])  # alone: see TAIL_ALONE
        expected[b"tail"] = b"w" * 4000
        assert cleaned_up_to(broker, "t") <= 0
        set_topic_config(broker.bootstrap, "t", "min.compaction.lag.ms", "0")
        wait_for(lambda: broker.process.poll() is not None, f"the broker to exit at step {step!r}")
        monkeypatch.delenv("PYKBROKER_CLEANER_CRASH_AT")
        broker.start()
        records = consume_all(broker.bootstrap, "t")
        assert latest_values(records) == expected
        offsets = [offset for offset, _, _ in records]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
        leftovers = [p.name for p in (broker.data_dir / "t-0").iterdir() if p.name.endswith((".cleaned", ".swap"))]
        assert not leftovers
        assert "log cleaner: exiting at step" in broker.log_path.read_text()
    finally:
        broker.close()


# -- idempotent producers' batches -----------------------------------------------------------------


def kafka_python_values(bootstrap: str, topic: str) -> dict:
    from kafka import KafkaConsumer, TopicPartition as KpTopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    try:
        partition = KpTopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        end = consumer.end_offsets([partition])[partition]
        values = {}
        deadline = time.monotonic() + TIMEOUT_S
        while consumer.position(partition) < end and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    values[record.key] = record.value
        assert consumer.position(partition) >= end
        return values
    finally:
        consumer.close()


def batch_headers(broker: BrokerProcess, topic: str) -> list:
    headers = []
    for path in sorted((broker.data_dir / f"{topic}-0").glob("*.log")):
        fd = os.open(path, os.O_RDONLY)
        try:
            headers.extend(iter_file_headers(fd, 0, os.fstat(fd).st_size))
        finally:
            os.close(fd)
    return headers


def test_idempotent_producers_batches_survive_cleaning_and_clients_read_the_cleaned_log(broker_factory, topic_name):
    broker = broker_factory.make(CLEANER)
    create_topic(broker.bootstrap, topic_name, COMPACTED)
    pairs, expected = updates(rounds=20, keys=5)
    # an idempotent producer's values, all replaced by a plain producer's later ones
    assert not produce(broker.bootstrap, topic_name, pairs, **{"enable.idempotence": True})
    newer, expected = updates(rounds=20, keys=5)
    assert not produce(broker.bootstrap, topic_name, newer)
    assert not produce(broker.bootstrap, topic_name, [(b"tail", b"i" * 4000)])  # alone: see TAIL_ALONE
    expected[b"tail"] = b"i" * 4000
    end = len(pairs) + len(newer)
    wait_for(lambda: cleaned_up_to(broker, topic_name) >= end - 1, "the cleaner to reach the last segment")
    # the idempotent producer's last batch stays, emptied (Kafka's RETAIN_EMPTY): its state survives restarts
    kept = [h for h in batch_headers(broker, topic_name) if h.producer_id >= 0]
    assert len(kept) == 1 and kept[0].record_count == 0 and kept[0].last_offset == len(pairs) - 1
    # clients read a cleaned log with gaps and an empty batch
    assert latest_values(consume_all(broker.bootstrap, topic_name)) == expected
    assert kafka_python_values(broker.bootstrap, topic_name) == expected
    broker.restart()
    assert not produce(broker.bootstrap, topic_name, [(b"after", b"restart")], **{"enable.idempotence": True})
    assert latest_values(consume_all(broker.bootstrap, topic_name))[b"after"] == b"restart"


def test_kill_9_at_random_moments_of_cleanings_loses_nothing(tmp_path):
    import random

    rng = random.Random(12)
    broker = BrokerProcess(tmp_path / "b", config={**CLEANER, "log.cleaner.backoff.ms": 20})
    try:
        broker.start()
        create_topic(broker.bootstrap, "t", {**COMPACTED, "segment.bytes": "65536", "delete.retention.ms": "86400000"})
        expected: dict = {}
        for round_ in range(4):
            pairs, _ = updates(rounds=40, keys=200, size=rng.randint(50, 400))
            pairs = [(key, value + b"-%d" % round_) for key, value in pairs]
            assert not produce(broker.bootstrap, "t", pairs)
            expected.update(pairs)
            time.sleep(rng.uniform(0, 0.5))  # somewhere in a cleaning, or between two
            broker.restart(kill=True)
            records = consume_all(broker.bootstrap, "t")
            assert latest_values(records) == expected, f"round {round_}"
            offsets = [offset for offset, _, _ in records]
            assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
        wait_for(lambda: cleaned_up_to(broker, "t") > 0, "a cleaning to complete")
    finally:
        broker.close()


def test_invalid_cleaner_configs_are_refused_as_kafka_refuses_them(broker):
    """Kafka's rules (KafkaConfig.validateValues, LogCleaner.validateReconfiguration): more than 1 MiB of dedupe
    buffer per thread, a load factor in (0, 1], threads within [current / 2, current * 2]: INVALID_REQUEST."""
    from kio.schema.errors import ErrorCode
    from test_dynamic_configs import BROKER, raw_incremental

    set_ = 0

    def alter(key, value, validate_only=False):
        ((_, code, message),) = raw_incremental(broker.address, (BROKER, "1", [(key, set_, value)]),
                                                validate_only=validate_only)
        return code, message

    code, message = alter("log.cleaner.dedupe.buffer.size", "1048576")
    assert code == ErrorCode.invalid_request and "at least 1MB per cleaner thread" in message
    assert alter("log.cleaner.io.buffer.load.factor", "0")[0] == ErrorCode.invalid_request
    assert alter("log.cleaner.io.buffer.load.factor", "1.5")[0] == ErrorCode.invalid_request
    code, message = alter("log.cleaner.threads", "500")  # (Kafka checks the buffer per thread first, too)
    assert code == ErrorCode.invalid_request and "at least 1MB per cleaner thread" in message
    code, message = alter("log.cleaner.threads", "3")
    assert code == ErrorCode.invalid_request and "more than double the current value 1" in message
    assert alter("log.cleaner.threads", "0")[0] == ErrorCode.invalid_request
    assert alter("log.cleaner.threads", "2", validate_only=True)[0] == ErrorCode.none
    assert alter("log.cleaner.io.buffer.load.factor", "1.0")[0] == ErrorCode.none

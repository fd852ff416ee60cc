"""kafka-python 3.x against a pykbroker subprocess, with the client's defaults.

kafka-python 3.x defaults to enable_idempotence=True and acks=all, so every produce here goes through
InitProducerId and the broker's sequence checks. Only bootstrap_servers is set, plus group_id where a
test commits offsets. Consumers use assign/seek; subscribe() and group rebalancing are the next issue.
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, OffsetAndMetadata, OffsetSpec, TopicPartition

from broker_process import (
    Rec,
    assert_dense,
    assert_keyed_order,
    assert_same_log,
    batch_codecs,
    fetch_raw,
    init_producer_id,
    keyed_workload,
    list_offset,
    produce_raw,
)
from kio.schema.errors import ErrorCode
from pykbroker.protocol.records import build_batch

pytestmark = pytest.mark.timeout(90)

PARTITIONS = 4
BROKER_ID = 1
CONSUME_TIMEOUT_S = 30


# -- client helpers -----------------------------------------------------------------------------------


def create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    """CreateTopics through the admin client, replication factor left to the broker's default (-1)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        result = admin.create_topics({topic: {"num_partitions": partitions}})
        assert [(t["name"], t["error_code"]) for t in result["topics"]] == [(topic, 0)]
    finally:
        admin.close()


def produce(bootstrap: str, topic: str, messages: list[dict], **config) -> list[Rec]:
    """Send each dict as KafkaProducer.send() keyword arguments; return the acknowledgements in order."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, **config)
    try:
        return send_all(producer, topic, messages)
    finally:
        producer.close(timeout=10)


def send_all(producer: KafkaProducer, topic: str, messages: list[dict]) -> list[Rec]:
    futures = [producer.send(topic, **message) for message in messages]
    producer.flush(timeout=30)
    acked = []
    for future, message in zip(futures, messages):
        metadata = future.get(timeout=30)
        acked.append(Rec(metadata.partition, metadata.offset, message.get("key"), message.get("value"),
                         tuple(message.get("headers") or ())))
    return acked


def keyed_messages(pairs: list[tuple[bytes, bytes]]) -> list[dict]:
    return [{"key": key, "value": value} for key, value in pairs]


def consume(bootstrap: str, topic: str, count: int, *, partitions=range(PARTITIONS), start: int = 0,
            **config) -> list[Rec]:
    """assign() + seek(start) on the partitions, poll until `count` records arrived."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, **config)
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, start)
        got: list[Rec] = []
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while len(got) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got += [Rec(r.partition, r.offset, r.key, r.value, tuple(r.headers or ())) for r in records]
        assert len(got) >= count, f"read {len(got)} of {count} records within {CONSUME_TIMEOUT_S} s"
        return got
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str, partitions=range(PARTITIONS)) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in partitions])
        return {tp.partition: offset for tp, offset in ends.items()}
    finally:
        consumer.close()


def count_by_partition(records: list[Rec]) -> dict[int, int]:
    counts = {p: 0 for p in range(PARTITIONS)}
    for rec in records:
        counts[rec.partition] += 1
    return counts


# -- produce and consume --------------------------------------------------------------------------------


def test_keyed_messages_keep_order_and_dense_offsets(shared_broker, topic_name):
    create_topic(shared_broker.bootstrap, topic_name)
    sent = keyed_workload(keys=20, per_key=10)
    acked = produce(shared_broker.bootstrap, topic_name, keyed_messages(sent))
    assert_keyed_order(sent, acked)
    assert_dense(acked)

    consumed = consume(shared_broker.bootstrap, topic_name, len(acked))
    assert_same_log(acked, consumed)
    assert end_offsets(shared_broker.bootstrap, topic_name) == count_by_partition(acked)


def test_same_key_same_partition_across_producers(shared_broker, topic_name):
    create_topic(shared_broker.bootstrap, topic_name)
    keys = [f"user-{i}".encode() for i in range(16)]
    first = produce(shared_broker.bootstrap, topic_name, [{"key": k, "value": b"first"} for k in keys])
    second = produce(shared_broker.bootstrap, topic_name, [{"key": k, "value": b"second"} for k in keys])
    assert [r.partition for r in first] == [r.partition for r in second]
    assert len({r.partition for r in first}) > 1


def test_headers_null_key_null_value_and_large_value_round_trip(shared_broker, topic_name):
    create_topic(shared_broker.bootstrap, topic_name)
    large = bytes(range(256)) * (900 * 1024 // 256)  # 900 KiB, under the default 1 MiB request size
    messages = [
        {"key": b"h", "value": b"with headers",
         "headers": [("trace-id", b"abc123"), ("empty", b""), ("twice", b"1"), ("twice", b"2")]},
        {"key": None, "value": b"no key"},
        {"key": b"tombstone", "value": None},
        {"key": b"", "value": b""},
        {"key": b"large", "value": large},
        {"key": b"after-large", "value": b"still readable"},
    ]
    acked = produce(shared_broker.bootstrap, topic_name, [dict(m, partition=2) for m in messages])
    assert [r.offset for r in acked] == list(range(len(messages)))

    consumed = consume(shared_broker.bootstrap, topic_name, len(messages), partitions=[2])
    assert_same_log(acked, consumed)
    assert next(r for r in consumed if r.key == b"large").value == large


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_round_trip(shared_broker, topic_name, codec):
    create_topic(shared_broker.bootstrap, topic_name)
    sent = keyed_workload(keys=8, per_key=25, padding=200)
    acked = produce(shared_broker.bootstrap, topic_name, keyed_messages(sent), compression_type=codec)
    assert_keyed_order(sent, acked)
    assert_dense(acked)

    consumed = consume(shared_broker.bootstrap, topic_name, len(acked))
    assert_same_log(acked, consumed)
    # The broker stores and serves batches as the producer compressed them.
    for partition in {r.partition for r in acked}:
        codecs = batch_codecs(fetch_raw(shared_broker.address, topic_name, partition))
        assert codecs and set(codecs) == {codec}, f"partition {partition} serves batches {codecs}"


def test_auto_created_topic_gets_default_partitions(shared_broker, topic_name):
    acked = produce(shared_broker.bootstrap, topic_name, [{"key": b"k", "value": b"v"}])
    assert [(r.partition, r.offset) for r in acked] == [(0, 0)]
    consumer = KafkaConsumer(bootstrap_servers=shared_broker.bootstrap)
    try:
        assert consumer.partitions_for_topic(topic_name) == {0}  # num.partitions defaults to 1
    finally:
        consumer.close()


# -- offsets and metadata ---------------------------------------------------------------------------------


def test_list_offsets_earliest_latest_and_by_timestamp(shared_broker, topic_name):
    create_topic(shared_broker.bootstrap, topic_name)
    base = int(time.time() * 1000) - 60_000
    # Out of order on purpose: the max timestamp is not the last record's.
    timestamps = [base, base + 1000, base + 4000, base + 2000, base + 3000]
    acked = []
    for ts in timestamps:  # one batch per record, so each record has its own time index position
        acked += produce(shared_broker.bootstrap, topic_name,
                         [{"key": b"t", "value": str(ts).encode(), "partition": 0, "timestamp_ms": ts}])
    assert [r.offset for r in acked] == [0, 1, 2, 3, 4]

    tp, empty = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
    consumer = KafkaConsumer(bootstrap_servers=shared_broker.bootstrap)
    try:
        assert consumer.beginning_offsets([tp, empty]) == {tp: 0, empty: 0}
        assert consumer.end_offsets([tp, empty]) == {tp: 5, empty: 0}
        found = consumer.offsets_for_times({tp: base + 1500})[tp]
        assert (found.offset, found.timestamp) == (2, base + 4000)  # first offset with timestamp >= target
        found = consumer.offsets_for_times({tp: base})[tp]
        assert (found.offset, found.timestamp) == (0, base)
        assert consumer.offsets_for_times({tp: base + 10_000, empty: base}) == {tp: None, empty: None}
    finally:
        consumer.close()

    admin = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
    try:
        assert admin.list_partition_offsets({tp: OffsetSpec.EARLIEST})[tp].offset == 0
        answer = admin.list_partition_offsets({tp: OffsetSpec.MAX_TIMESTAMP})[tp]
        assert (answer.offset, answer.timestamp) == (2, base + 4000)
        assert admin.list_partition_offsets({tp: OffsetSpec.LATEST})[tp].offset == 5
    finally:
        admin.close()


def test_metadata_lists_leaders_and_the_broker(shared_broker, topic_name):
    create_topic(shared_broker.bootstrap, topic_name)
    admin = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
    try:
        (topic,) = admin.describe_topics([topic_name])
        assert topic["name"] == topic_name and topic["error_code"] == 0
        partitions = sorted(topic["partitions"], key=lambda p: p["partition_index"])
        assert [p["partition_index"] for p in partitions] == list(range(PARTITIONS))
        for p in partitions:
            assert (p["error_code"], p["leader_id"]) == (0, BROKER_ID), p
            assert p["replica_nodes"] == [BROKER_ID] and p["isr_nodes"] == [BROKER_ID], p

        cluster = admin.describe_cluster()
        brokers = [(b["broker_id"], b["host"], b["port"]) for b in cluster["brokers"]]
        assert brokers == [(BROKER_ID, shared_broker.host, shared_broker.port)]
        assert cluster["controller_id"] == BROKER_ID
        assert topic_name in admin.list_topics()
    finally:
        admin.close()


def test_assign_and_seek(shared_broker, topic_name):
    create_topic(shared_broker.bootstrap, topic_name)
    acked = produce(shared_broker.bootstrap, topic_name,
                    [{"value": f"v{i}".encode(), "partition": 1} for i in range(30)])
    assert [r.offset for r in acked] == list(range(30))

    consumed = consume(shared_broker.bootstrap, topic_name, 13, partitions=[1], start=17)
    assert [(r.offset, r.value) for r in consumed] == [(i, f"v{i}".encode()) for i in range(17, 30)]

    consumer = KafkaConsumer(bootstrap_servers=shared_broker.bootstrap)  # auto_offset_reset='latest'
    try:
        tp = TopicPartition(topic_name, 1)
        consumer.assign([tp])
        consumer.seek(tp, 1000)  # past the end: OFFSET_OUT_OF_RANGE, then reset to latest
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while consumer.position(tp, timeout_ms=1000) != 30 and time.monotonic() < deadline:
            assert consumer.poll(timeout_ms=200) == {}
        assert consumer.position(tp) == 30
    finally:
        consumer.close()


# -- idempotence ------------------------------------------------------------------------------------------


def test_retried_idempotent_batch_is_stored_once(shared_broker, topic_name):
    """A producer that resends a batch (same producer id, epoch, sequence) after a lost answer must get
    the first append's base offset back, and the log must not grow."""
    create_topic(shared_broker.bootstrap, topic_name)
    address, partition = shared_broker.address, 2
    producer_id, epoch = init_producer_id(address)
    assert producer_id >= 0 and epoch >= 0
    now = int(time.time() * 1000)

    def batch(base_sequence: int, count: int = 5) -> bytes:
        return bytes(build_batch(
            [(b"k", f"seq-{base_sequence + i}".encode()) for i in range(count)], timestamp_ms=now,
            producer_id=producer_id, producer_epoch=epoch, base_sequence=base_sequence))

    first = produce_raw(address, topic_name, partition, batch(0))
    assert (first.error_code, first.base_offset) == (ErrorCode.none, 0)
    retry = produce_raw(address, topic_name, partition, batch(0))
    assert (retry.error_code, retry.base_offset) == (ErrorCode.none, 0), "duplicate not recognised"
    assert list_offset(address, topic_name, partition, -1) == 5, "the duplicate was appended"

    following = produce_raw(address, topic_name, partition, batch(5))
    assert (following.error_code, following.base_offset) == (ErrorCode.none, 5)
    older_retry = produce_raw(address, topic_name, partition, batch(0))  # still among the last 5 batches
    assert (older_retry.error_code, older_retry.base_offset) == (ErrorCode.none, 0)
    gap = produce_raw(address, topic_name, partition, batch(20))
    assert gap.error_code == ErrorCode.out_of_order_sequence_number
    assert list_offset(address, topic_name, partition, -1) == 10

    consumed = consume(shared_broker.bootstrap, topic_name, 10, partitions=[partition])
    assert [(r.offset, r.value) for r in consumed] == [(i, f"seq-{i}".encode()) for i in range(10)]


# -- restarts -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_restart_keeps_acknowledged_records_and_offsets(broker, topic_name, how):
    create_topic(broker.bootstrap, topic_name)
    sent = keyed_workload(keys=12, per_key=10)
    acked = produce(broker.bootstrap, topic_name, keyed_messages(sent))

    broker.restart(kill=how == "kill9")

    consumed = consume(broker.bootstrap, topic_name, len(acked))
    assert_same_log(acked, consumed)
    assert end_offsets(broker.bootstrap, topic_name) == count_by_partition(acked)
    # New appends continue after the recovered log end: no offset is handed out twice.
    more = produce(broker.bootstrap, topic_name, keyed_messages(sent[:12]))
    assert_dense(acked + more)


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_idempotent_producer_continues_across_restart(broker, topic_name, how):
    """The same producer keeps its producer id and sequences across the restart: the broker must have
    rebuilt its producer state from the log, or the next batch fails with a sequence error."""
    create_topic(broker.bootstrap, topic_name)
    sent = keyed_workload(keys=8, per_key=10)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    try:
        before = send_all(producer, topic_name, keyed_messages(sent[:40]))
        broker.restart(kill=how == "kill9")
        after = send_all(producer, topic_name, keyed_messages(sent[40:]))
    finally:
        producer.close(timeout=10)
    acked = before + after
    assert_keyed_order(sent, acked)
    assert_dense(acked)
    assert_same_log(acked, consume(broker.bootstrap, topic_name, len(acked)))


def test_committed_offsets_survive_kill9(broker, topic_name):
    create_topic(broker.bootstrap, topic_name)
    group = f"{topic_name}-group"
    commits = {TopicPartition(topic_name, 0): OffsetAndMetadata(7, "first", -1),
               TopicPartition(topic_name, 3): OffsetAndMetadata(0, "", -1)}
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group)
    try:
        consumer.assign(list(commits))
        consumer.commit(commits)  # a "simple" commit: generation -1, no member id
    finally:
        consumer.close(autocommit=False)

    broker.restart(kill=True)

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group)
    try:
        for tp, committed in commits.items():
            answer = consumer.committed(tp, metadata=True)
            assert (answer.offset, answer.metadata) == (committed.offset, committed.metadata), tp
        assert consumer.committed(TopicPartition(topic_name, 1)) is None
    finally:
        consumer.close(autocommit=False)

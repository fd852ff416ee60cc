"""confluent-kafka (librdkafka) against a pykbroker subprocess, with the client's defaults.

Only bootstrap.servers is set, plus group.id on consumers because librdkafka's Consumer requires one.
With a group.id the consumer talks to the group coordinator even under assign(): FindCoordinator,
OffsetFetch and "simple" OffsetCommit (generation -1, empty member id). subscribe() is the next issue.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from broker_process import (
    Rec,
    assert_dense,
    assert_keyed_order,
    assert_same_log,
    batch_codecs,
    fetch_raw,
    keyed_workload,
)

pytestmark = pytest.mark.timeout(90)

PARTITIONS = 4
BROKER_ID = 1
TIMEOUT_S = 30


# -- client helpers -----------------------------------------------------------------------------------


def create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.create_topics([NewTopic(topic, num_partitions=partitions)]).values()
    future.result(timeout=TIMEOUT_S)  # raises KafkaException on a topic error


class AckCollector:
    """Delivery reports in the order messages were produced (callbacks may come in any order)."""

    def __init__(self):
        self.reports: dict[int, tuple] = {}
        self.errors: list = []

    def callback_for(self, index: int, headers):
        # librdkafka detaches headers from a message once it is produced, so take them from the input.
        def on_delivery(err, msg):
            if err is not None:
                self.errors.append((index, err))
            else:
                self.reports[index] = (msg.partition(), msg.offset(), msg.key(), msg.value(), tuple(headers or ()))
        return on_delivery

    def acked(self, expected: int) -> list[Rec]:
        assert not self.errors, f"delivery failed: {self.errors[:3]}"
        assert len(self.reports) == expected, f"{len(self.reports)} of {expected} messages acknowledged"
        return [Rec(*self.reports[i]) for i in range(expected)]


def send_all(producer: Producer, topic: str, messages: list[dict]) -> list[Rec]:
    collector = AckCollector()
    for index, message in enumerate(messages):
        producer.produce(topic, on_delivery=collector.callback_for(index, message.get("headers")), **message)
        producer.poll(0)
    remaining = producer.flush(TIMEOUT_S)
    assert remaining == 0, f"{remaining} messages still queued after {TIMEOUT_S} s"
    return collector.acked(len(messages))


def produce(bootstrap: str, topic: str, messages: list[dict], **config) -> list[Rec]:
    producer = Producer({"bootstrap.servers": bootstrap, **config})
    return send_all(producer, topic, messages)


def keyed_messages(pairs):
    return [{"key": key, "value": value} for key, value in pairs]


def new_consumer(bootstrap: str, group: str | None = None) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group or f"tests-{uuid.uuid4().hex[:8]}"})


def poll_records(consumer: Consumer, count: int) -> list[Rec]:
    got: list[Rec] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < count and time.monotonic() < deadline:
        for msg in consumer.consume(num_messages=500, timeout=0.2):
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise AssertionError(f"consumer error: {msg.error()}")
            got.append(Rec(msg.partition(), msg.offset(), msg.key(), msg.value(), tuple(msg.headers() or ())))
    assert len(got) >= count, f"read {len(got)} of {count} records within {TIMEOUT_S} s"
    return got


def consume(bootstrap: str, topic: str, count: int, *, partitions=range(PARTITIONS),
            start: int = OFFSET_BEGINNING) -> list[Rec]:
    consumer = new_consumer(bootstrap)
    try:
        consumer.assign([TopicPartition(topic, p, start) for p in partitions])
        return poll_records(consumer, count)
    finally:
        consumer.close()


def watermarks(bootstrap: str, topic: str, partitions=range(PARTITIONS)) -> dict[int, tuple[int, int]]:
    consumer = new_consumer(bootstrap)
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT_S)
                for p in partitions}
    finally:
        consumer.close()


def expected_watermarks(acked: list[Rec]) -> dict[int, tuple[int, int]]:
    return {p: (0, sum(1 for r in acked if r.partition == p)) for p in range(PARTITIONS)}


# -- produce and consume --------------------------------------------------------------------------------


def test_keyed_messages_keep_order_and_dense_offsets(shared_broker, topic_name):
    create_topic(shared_broker.bootstrap, topic_name)
    sent = keyed_workload(keys=20, per_key=10)
    acked = produce(shared_broker.bootstrap, topic_name, keyed_messages(sent))
    assert_keyed_order(sent, acked)
    assert_dense(acked)

    assert_same_log(acked, consume(shared_broker.bootstrap, topic_name, len(acked)))
    assert watermarks(shared_broker.bootstrap, topic_name) == expected_watermarks(acked)


def test_same_key_same_partition_across_producers(shared_broker, topic_name):
    create_topic(shared_broker.bootstrap, topic_name)
    keys = [f"user-{i}".encode() for i in range(16)]
    first = produce(shared_broker.bootstrap, topic_name, [{"key": k, "value": b"first"} for k in keys])
    second = produce(shared_broker.bootstrap, topic_name, [{"key": k, "value": b"second"} for k in keys])
    assert [r.partition for r in first] == [r.partition for r in second]
    assert len({r.partition for r in first}) > 1


def test_headers_null_key_null_value_and_large_value_round_trip(shared_broker, topic_name):
    create_topic(shared_broker.bootstrap, topic_name)
    large = bytes(range(256)) * (900 * 1024 // 256)  # 900 KiB, under message.max.bytes (1,000,000)
    messages = [
        {"key": b"h", "value": b"with headers",
         "headers": [("trace-id", b"abc123"), ("null-header", None), ("twice", b"1"), ("twice", b"2")]},
        {"key": None, "value": b"no key"},
        {"key": b"tombstone", "value": None},
        {"key": None, "value": None},
        {"key": b"", "value": b""},
        {"key": b"large", "value": large},
        {"key": b"after-large", "value": b"still readable"},
    ]
    acked = produce(shared_broker.bootstrap, topic_name, [dict(m, partition=1) for m in messages])
    assert [r.offset for r in acked] == list(range(len(messages)))

    consumed = consume(shared_broker.bootstrap, topic_name, len(messages), partitions=[1])
    # `acked` holds what the delivery reports echo, so both sides are as librdkafka presents them.
    assert_same_log(acked, consumed)
    assert next(r for r in consumed if r.key == b"large").value == large
    assert consumed[0].headers == (("trace-id", b"abc123"), ("null-header", None), ("twice", b"1"),
                                   ("twice", b"2"))


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_round_trip(shared_broker, topic_name, codec):
    create_topic(shared_broker.bootstrap, topic_name)
    sent = keyed_workload(keys=8, per_key=25, padding=200)
    acked = produce(shared_broker.bootstrap, topic_name, keyed_messages(sent), **{"compression.type": codec})
    assert_keyed_order(sent, acked)
    assert_dense(acked)

    assert_same_log(acked, consume(shared_broker.bootstrap, topic_name, len(acked)))
    for partition in {r.partition for r in acked}:
        codecs = batch_codecs(fetch_raw(shared_broker.address, topic_name, partition))
        assert codecs and set(codecs) == {codec}, f"partition {partition} serves batches {codecs}"


def test_auto_created_topic_on_produce(shared_broker, topic_name):
    acked = produce(shared_broker.bootstrap, topic_name, [{"key": b"k", "value": b"v"}])
    assert [(r.partition, r.offset) for r in acked] == [(0, 0)]
    metadata = new_consumer(shared_broker.bootstrap).list_topics(topic_name, timeout=TIMEOUT_S)
    assert sorted(metadata.topics[topic_name].partitions) == [0]  # num.partitions defaults to 1


# -- offsets and metadata ---------------------------------------------------------------------------------


def test_list_offsets_earliest_latest_and_by_timestamp(shared_broker, topic_name):
    create_topic(shared_broker.bootstrap, topic_name)
    base = int(time.time() * 1000) - 60_000
    timestamps = [base, base + 1000, base + 4000, base + 2000, base + 3000]  # max is not the last
    producer = Producer({"bootstrap.servers": shared_broker.bootstrap})
    acked = []
    for ts in timestamps:
        acked += send_all(producer, topic_name, [{"key": b"t", "value": str(ts).encode(), "partition": 0,
                                                  "timestamp": ts}])
    assert [r.offset for r in acked] == [0, 1, 2, 3, 4]

    consumer = new_consumer(shared_broker.bootstrap)
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=TIMEOUT_S) == (0, 5)
        assert consumer.get_watermark_offsets(TopicPartition(topic_name, 1), timeout=TIMEOUT_S) == (0, 0)
        found = consumer.offsets_for_times(
            [TopicPartition(topic_name, 0, base + 1500), TopicPartition(topic_name, 1, base),
             TopicPartition(topic_name, 2, base + 10_000)], timeout=TIMEOUT_S)
        assert [(tp.partition, tp.offset, tp.error) for tp in found] == [(0, 2, None), (1, -1, None),
                                                                          (2, -1, None)]
        (found,) = consumer.offsets_for_times([TopicPartition(topic_name, 0, base + 10_000)], timeout=TIMEOUT_S)
        assert found.offset == -1  # no record at or after that time
    finally:
        consumer.close()

    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    tp = TopicPartition(topic_name, 0)
    specs = {"earliest": OffsetSpec.earliest(), "latest": OffsetSpec.latest(),
             "max": OffsetSpec.max_timestamp(), "at": OffsetSpec.for_timestamp(base + 2500)}
    answers = {}
    for name, spec in specs.items():  # one spec per partition and call
        (future,) = admin.list_offsets({tp: spec}).values()
        answers[name] = future.result(timeout=TIMEOUT_S)
    assert answers["earliest"].offset == 0
    assert answers["latest"].offset == 5
    assert (answers["max"].offset, answers["max"].timestamp) == (2, base + 4000)
    assert (answers["at"].offset, answers["at"].timestamp) == (2, base + 4000)


def test_metadata_lists_leaders_and_the_broker(shared_broker, topic_name):
    create_topic(shared_broker.bootstrap, topic_name)
    consumer = new_consumer(shared_broker.bootstrap)
    try:
        metadata = consumer.list_topics(timeout=TIMEOUT_S)
    finally:
        consumer.close()
    assert [(b.id, b.host, b.port) for b in metadata.brokers.values()] == [
        (BROKER_ID, shared_broker.host, shared_broker.port)]
    assert metadata.controller_id == BROKER_ID
    topic = metadata.topics[topic_name]
    assert topic.error is None
    assert sorted(topic.partitions) == list(range(PARTITIONS))
    for partition in topic.partitions.values():
        assert (partition.error, partition.leader) == (None, BROKER_ID)
        assert partition.replicas == [BROKER_ID] and partition.isrs == [BROKER_ID]

    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    cluster = admin.describe_cluster().result(timeout=TIMEOUT_S)
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(BROKER_ID, shared_broker.host, shared_broker.port)]
    assert cluster.controller.id == BROKER_ID
    assert cluster.cluster_id


def test_assign_at_offset_and_seek(shared_broker, topic_name):
    create_topic(shared_broker.bootstrap, topic_name)
    acked = produce(shared_broker.bootstrap, topic_name,
                    [{"value": f"v{i}".encode(), "partition": 3} for i in range(30)])
    assert [r.offset for r in acked] == list(range(30))

    consumed = consume(shared_broker.bootstrap, topic_name, 13, partitions=[3], start=17)
    assert [(r.offset, r.value) for r in consumed] == [(i, f"v{i}".encode()) for i in range(17, 30)]

    consumer = new_consumer(shared_broker.bootstrap)
    try:
        consumer.assign([TopicPartition(topic_name, 3, 0)])
        first = poll_records(consumer, 1)[0]
        assert first.offset == 0
        consumer.seek(TopicPartition(topic_name, 3, 25))
        after_seek = poll_records(consumer, 5)
        assert [r.offset for r in after_seek][:5] == [25, 26, 27, 28, 29]
    finally:
        consumer.close()


# -- committed offsets ------------------------------------------------------------------------------------


def test_commit_of_consumed_positions_with_assign(shared_broker, topic_name):
    """The default consumer stores the offset of each consumed message; commit() sends them as a simple
    commit for a group with no members, and a new consumer of the group resumes there."""
    create_topic(shared_broker.bootstrap, topic_name)
    produce(shared_broker.bootstrap, topic_name, [{"value": f"v{i}".encode(), "partition": 0} for i in range(10)])
    group = f"{topic_name}-group"
    consumer = new_consumer(shared_broker.bootstrap, group)
    try:
        consumer.assign([TopicPartition(topic_name, 0, OFFSET_BEGINNING)])
        assert [r.offset for r in poll_records(consumer, 10)][:10] == list(range(10))
        committed = consumer.commit(asynchronous=False)
        assert [(tp.partition, tp.offset, tp.error) for tp in committed] == [(0, 10, None)]
    finally:
        consumer.close()

    consumer = new_consumer(shared_broker.bootstrap, group)
    try:
        (answer,) = consumer.committed([TopicPartition(topic_name, 0)], timeout=TIMEOUT_S)
        assert answer.offset == 10
    finally:
        consumer.close()


def test_committed_offsets_survive_kill9(broker, topic_name):
    create_topic(broker.bootstrap, topic_name)
    group = f"{topic_name}-group"
    offsets = [TopicPartition(topic_name, 0, 7, "first"), TopicPartition(topic_name, 2, 0),
               TopicPartition(topic_name, 3, 123456)]
    consumer = new_consumer(broker.bootstrap, group)
    try:
        consumer.assign([TopicPartition(topic_name, p) for p in range(PARTITIONS)])
        committed = consumer.commit(offsets=offsets, asynchronous=False)
        assert all(tp.error is None for tp in committed), committed
    finally:
        consumer.close()

    broker.restart(kill=True)

    consumer = new_consumer(broker.bootstrap, group)
    try:
        answers = consumer.committed([TopicPartition(topic_name, p) for p in range(PARTITIONS)],
                                     timeout=TIMEOUT_S)
    finally:
        consumer.close()
    assert all(tp.error is None for tp in answers), answers
    by_partition = {tp.partition: tp for tp in answers}
    assert (by_partition[0].offset, by_partition[0].metadata) == (7, "first")
    assert by_partition[2].offset == 0
    assert by_partition[3].offset == 123456
    assert by_partition[1].offset < 0  # never committed: OFFSET_INVALID


# -- restarts -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_restart_keeps_acknowledged_records_and_offsets(broker, topic_name, how):
    create_topic(broker.bootstrap, topic_name)
    sent = keyed_workload(keys=12, per_key=10)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    before = send_all(producer, topic_name, keyed_messages(sent[:60]))

    broker.restart(kill=how == "kill9")

    # The same producer reconnects and its new records continue after the recovered log end.
    after = send_all(producer, topic_name, keyed_messages(sent[60:]))
    acked = before + after
    assert_keyed_order(sent, acked)
    assert_dense(acked)
    assert_same_log(acked, consume(broker.bootstrap, topic_name, len(acked)))
    assert watermarks(broker.bootstrap, topic_name) == expected_watermarks(acked)

"""aiokafka 0.14 against a pykbroker subprocess, with the client's defaults.

aiokafka speaks only old, non-flexible API versions (ApiVersions v0, Metadata <= 5, Produce v7, Fetch v11,
ListOffsets v3, InitProducerId v0, OffsetCommit/OffsetFetch v2-3), so this module is what keeps those
versions working. Its producer defaults to acks=1 without idempotence; one test turns idempotence on
because its InitProducerId v0 path differs from the newer clients'. Each test drives its coroutine with
asyncio.run(); broker restarts happen on the main thread (see BrokerProcess.start).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

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


async def create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        # aiokafka sends CreateTopics v3 at most, where -1 ("broker default") is not yet allowed.
        response = await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
        assert [(t[0], t[1]) for t in response.topic_errors] == [(topic, 0)]
    finally:
        await admin.close()


async def send_all(producer: AIOKafkaProducer, topic: str, messages: list[dict]) -> list[Rec]:
    futures = [await producer.send(topic, **message) for message in messages]
    acked = []
    for future, message in zip(futures, messages):
        metadata = await asyncio.wait_for(future, TIMEOUT_S)
        acked.append(Rec(metadata.partition, metadata.offset, message.get("key"), message.get("value"),
                         tuple(message.get("headers") or ())))
    return acked


async def produce(bootstrap: str, topic: str, messages: list[dict], **config) -> list[Rec]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **config)
    await producer.start()
    try:
        return await send_all(producer, topic, messages)
    finally:
        await producer.stop()


def keyed_messages(pairs):
    return [{"key": key, "value": value} for key, value in pairs]


async def consume(bootstrap: str, topic: str, count: int, *, partitions=range(PARTITIONS),
                  start: int = 0, **config) -> list[Rec]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, **config)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, start)
        got: list[Rec] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < count and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                got += [Rec(r.partition, r.offset, r.key, r.value, tuple(r.headers or ())) for r in records]
        assert len(got) >= count, f"read {len(got)} of {count} records within {TIMEOUT_S} s"
        return got
    finally:
        await consumer.stop()


async def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])
        return {tp.partition: offset for tp, offset in ends.items()}
    finally:
        await consumer.stop()


def count_by_partition(records: list[Rec]) -> dict[int, int]:
    return {p: sum(1 for r in records if r.partition == p) for p in range(PARTITIONS)}


# -- produce and consume --------------------------------------------------------------------------------


def test_keyed_messages_keep_order_and_dense_offsets(shared_broker, topic_name):
    async def scenario():
        await create_topic(shared_broker.bootstrap, topic_name)
        sent = keyed_workload(keys=20, per_key=10)
        acked = await produce(shared_broker.bootstrap, topic_name, keyed_messages(sent))
        assert_keyed_order(sent, acked)
        assert_dense(acked)
        assert_same_log(acked, await consume(shared_broker.bootstrap, topic_name, len(acked)))
        assert await end_offsets(shared_broker.bootstrap, topic_name) == count_by_partition(acked)

    asyncio.run(scenario())


def test_same_key_same_partition_across_producers(shared_broker, topic_name):
    async def scenario():
        await create_topic(shared_broker.bootstrap, topic_name)
        keys = [f"user-{i}".encode() for i in range(16)]
        first = await produce(shared_broker.bootstrap, topic_name, [{"key": k, "value": b"1"} for k in keys])
        second = await produce(shared_broker.bootstrap, topic_name, [{"key": k, "value": b"2"} for k in keys])
        assert [r.partition for r in first] == [r.partition for r in second]
        assert len({r.partition for r in first}) > 1

    asyncio.run(scenario())


def test_headers_null_key_null_value_and_large_value_round_trip(shared_broker, topic_name):
    large = bytes(range(256)) * (900 * 1024 // 256)  # 900 KiB, under max_request_size (1 MiB)
    messages = [
        {"key": b"h", "value": b"with headers",
         "headers": [("trace-id", b"abc123"), ("empty", b""), ("twice", b"1"), ("twice", b"2")]},
        {"key": None, "value": b"no key"},
        {"key": b"tombstone", "value": None},
        {"key": b"", "value": b""},
        {"key": b"large", "value": large},
        {"key": b"after-large", "value": b"still readable"},
    ]

    async def scenario():
        await create_topic(shared_broker.bootstrap, topic_name)
        acked = await produce(shared_broker.bootstrap, topic_name, [dict(m, partition=3) for m in messages])
        assert [r.offset for r in acked] == list(range(len(messages)))
        consumed = await consume(shared_broker.bootstrap, topic_name, len(messages), partitions=[3])
        assert_same_log(acked, consumed)
        assert next(r for r in consumed if r.key == b"large").value == large

    asyncio.run(scenario())


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_round_trip(shared_broker, topic_name, codec):
    async def scenario():
        await create_topic(shared_broker.bootstrap, topic_name)
        sent = keyed_workload(keys=8, per_key=25, padding=200)
        acked = await produce(shared_broker.bootstrap, topic_name, keyed_messages(sent), compression_type=codec)
        assert_keyed_order(sent, acked)
        assert_dense(acked)
        assert_same_log(acked, await consume(shared_broker.bootstrap, topic_name, len(acked)))
        return acked

    acked = asyncio.run(scenario())
    for partition in {r.partition for r in acked}:
        codecs = batch_codecs(fetch_raw(shared_broker.address, topic_name, partition))
        assert codecs and set(codecs) == {codec}, f"partition {partition} serves batches {codecs}"


# -- offsets and metadata ---------------------------------------------------------------------------------


def test_list_offsets_earliest_latest_and_by_timestamp(shared_broker, topic_name):
    base = int(time.time() * 1000) - 60_000
    timestamps = [base, base + 1000, base + 4000, base + 2000, base + 3000]

    async def scenario():
        await create_topic(shared_broker.bootstrap, topic_name)
        producer = AIOKafkaProducer(bootstrap_servers=shared_broker.bootstrap)
        await producer.start()
        try:
            acked = []
            for ts in timestamps:  # one batch per record
                acked += await send_all(producer, topic_name, [
                    {"key": b"t", "value": str(ts).encode(), "partition": 0, "timestamp_ms": ts}])
        finally:
            await producer.stop()
        assert [r.offset for r in acked] == [0, 1, 2, 3, 4]

        tp, empty = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
        consumer = AIOKafkaConsumer(bootstrap_servers=shared_broker.bootstrap)
        await consumer.start()
        try:
            assert await consumer.beginning_offsets([tp, empty]) == {tp: 0, empty: 0}
            assert await consumer.end_offsets([tp, empty]) == {tp: 5, empty: 0}
            found = (await consumer.offsets_for_times({tp: base + 1500}))[tp]
            assert (found.offset, found.timestamp) == (2, base + 4000)
            found = (await consumer.offsets_for_times({tp: base}))[tp]
            assert (found.offset, found.timestamp) == (0, base)
            assert await consumer.offsets_for_times({tp: base + 10_000, empty: base}) == {tp: None, empty: None}
        finally:
            await consumer.stop()

    asyncio.run(scenario())


def test_metadata_lists_leaders_and_the_broker(shared_broker, topic_name):
    async def scenario():
        await create_topic(shared_broker.bootstrap, topic_name)
        admin = AIOKafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
        await admin.start()
        try:
            (topic,) = await admin.describe_topics([topic_name])
            cluster = await admin.describe_cluster()
        finally:
            await admin.close()
        assert (topic["topic"], topic["error_code"]) == (topic_name, 0)
        partitions = sorted(topic["partitions"], key=lambda p: p["partition"])
        assert [p["partition"] for p in partitions] == list(range(PARTITIONS))
        for p in partitions:
            assert (p["error_code"], p["leader"], p["replicas"], p["isr"]) == (0, BROKER_ID, [BROKER_ID],
                                                                               [BROKER_ID]), p
        assert [(b["node_id"], b["host"], b["port"]) for b in cluster["brokers"]] == [
            (BROKER_ID, shared_broker.host, shared_broker.port)]
        assert cluster["controller_id"] == BROKER_ID

        consumer = AIOKafkaConsumer(bootstrap_servers=shared_broker.bootstrap)
        await consumer.start()
        try:
            assert topic_name in await consumer.topics()  # a Metadata request for all topics
        finally:
            await consumer.stop()

    asyncio.run(scenario())


def test_assign_and_seek(shared_broker, topic_name):
    async def scenario():
        await create_topic(shared_broker.bootstrap, topic_name)
        acked = await produce(shared_broker.bootstrap, topic_name,
                              [{"value": f"v{i}".encode(), "partition": 2} for i in range(30)])
        assert [r.offset for r in acked] == list(range(30))
        consumed = await consume(shared_broker.bootstrap, topic_name, 13, partitions=[2], start=17)
        assert [(r.offset, r.value) for r in consumed] == [(i, f"v{i}".encode()) for i in range(17, 30)]

        consumer = AIOKafkaConsumer(bootstrap_servers=shared_broker.bootstrap)
        await consumer.start()
        try:
            tp = TopicPartition(topic_name, 2)
            consumer.assign([tp])
            await consumer.seek_to_end(tp)
            assert await consumer.position(tp) == 30
            await consumer.seek_to_beginning(tp)
            record = await asyncio.wait_for(consumer.getone(tp), TIMEOUT_S)
            assert (record.offset, record.value) == (0, b"v0")
        finally:
            await consumer.stop()

    asyncio.run(scenario())


# -- committed offsets, idempotence, restarts ------------------------------------------------------------------


def test_committed_offsets_survive_kill9(broker, topic_name):
    group = f"{topic_name}-group"
    tp0, tp3 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 3)

    async def commit():
        await create_topic(broker.bootstrap, topic_name)
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group)
        await consumer.start()
        try:
            consumer.assign([tp0, tp3])
            await consumer.commit({tp0: (7, "first"), tp3: 42})  # simple commit, generation -1
        finally:
            await consumer.stop()

    async def read_back():
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group)
        await consumer.start()
        try:
            consumer.assign([tp0, tp3, TopicPartition(topic_name, 1)])
            return [await consumer.committed(tp) for tp in (tp0, tp3, TopicPartition(topic_name, 1))]
        finally:
            await consumer.stop()

    asyncio.run(commit())
    broker.restart(kill=True)
    assert asyncio.run(read_back()) == [7, 42, None]


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_restart_keeps_acknowledged_records_and_offsets(broker, topic_name, how):
    sent = keyed_workload(keys=12, per_key=10)

    async def before_restart():
        await create_topic(broker.bootstrap, topic_name)
        return await produce(broker.bootstrap, topic_name, keyed_messages(sent[:60]))

    async def after_restart(before):
        after = await produce(broker.bootstrap, topic_name, keyed_messages(sent[60:]))
        acked = before + after
        assert_keyed_order(sent, acked)
        assert_dense(acked)
        assert_same_log(acked, await consume(broker.bootstrap, topic_name, len(acked)))
        assert await end_offsets(broker.bootstrap, topic_name) == count_by_partition(acked)

    before = asyncio.run(before_restart())
    broker.restart(kill=how == "kill9")
    asyncio.run(after_restart(before))


def test_idempotent_producer_continues_across_restart(broker, topic_name):
    """enable_idempotence=True (not the default): InitProducerId v0, then the same producer id and
    sequences must be accepted after a SIGTERM restart."""
    sent = keyed_workload(keys=8, per_key=10)

    async def scenario():
        await create_topic(broker.bootstrap, topic_name)
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            before = await send_all(producer, topic_name, keyed_messages(sent[:40]))
            broker.restart()  # blocks the loop on purpose: nothing is in flight
            after = await send_all(producer, topic_name, keyed_messages(sent[40:]))
        finally:
            await producer.stop()
        acked = before + after
        assert_keyed_order(sent, acked)
        assert_dense(acked)
        assert_same_log(acked, await consume(broker.bootstrap, topic_name, len(acked)))

    asyncio.run(scenario())

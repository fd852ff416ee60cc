"""The broker's own Kafka client (pykbroker/protocol/client.py) against a real pykbroker subprocess:
version negotiation, the requests a cluster's brokers send each other (Metadata, CreateTopics, Produce,
Fetch with replica_id -1), pipelining, a broker killed mid-request, a request timeout, and NodeClients
reconnecting after a restart. Fake-server cases (bad frames, bad correlation ids) are in
tests/unit/test_protocol_client.py."""

from __future__ import annotations

import asyncio
import datetime
import json
import time
import uuid

import pytest
from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from broker_process import REPO_ROOT
from pykbroker.protocol.client import (
    ConnectError,
    ConnectionLost,
    KafkaClientConnection,
    NodeClients,
    RequestTimedOut,
)
from pykbroker.protocol.records import build_batch, iter_headers, read_records

pytestmark = pytest.mark.timeout(90)


def run(coroutine, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coroutine, timeout))


def ms(milliseconds: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=milliseconds))


def metadata(names: list[str] | None, auto_create: bool = False) -> MetadataRequest:
    topics = None if names is None else tuple(MetadataRequestTopic(topic_id=None, name=n) for n in names)
    return MetadataRequest(topics=topics, allow_auto_topic_creation=auto_create,
                           include_topic_authorized_operations=False)


def create_topic(name: str, partitions: int = 1) -> CreateTopicsRequest:
    return CreateTopicsRequest(topics=(CreatableTopic(name=name, num_partitions=i32(partitions),
                                                      replication_factor=i16(1), assignments=(), configs=()),),
                               timeout=ms(10_000), validate_only=False)


def fetch(topic: str, offset: int = 0, max_wait_ms: int = 100) -> FetchRequest:
    return FetchRequest(cluster_id=None, replica_id=i32(-1), max_wait=ms(max_wait_ms), min_bytes=i32(1),
                        max_bytes=i32(1 << 20), isolation_level=i8(0), session_id=i32(0),
                        session_epoch=i32(-1), topics=(FetchTopic(topic=topic, partitions=(
                            FetchPartition(partition=i32(0), current_leader_epoch=i32(-1),
                                           fetch_offset=i64(offset), last_fetched_epoch=i32(-1),
                                           log_start_offset=i64(-1), partition_max_bytes=i32(1 << 20)),)),),
                        forgotten_topics_data=(), rack_id="")


def produce(topic: str, batch: bytes, acks: int = -1) -> ProduceRequest:
    return ProduceRequest(transactional_id=None, acks=i16(acks), timeout=ms(10_000), topic_data=(
        TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=i32(0), records=bytes(batch)),)),))


async def connect(broker, **options) -> KafkaClientConnection:
    options.setdefault("client_id", "1")
    return await KafkaClientConnection.connect(broker.host, broker.port, **options)


async def create(connection: KafkaClientConnection, topic: str) -> None:
    response = await connection.send(create_topic(topic))
    assert response.topics[0].error_code == ErrorCode.none, response


# ---------------------------------------------------------------------------------------------------


def test_api_versions_negotiation_learns_the_brokers_support_matrix(shared_broker):
    matrix = json.loads((REPO_ROOT / "protocol_specs" / "api_support.json").read_text())["apis"]

    async def scenario():
        connection = await connect(shared_broker)
        # A single broker advertises no cluster-only API (LeaderAndIsr, AlterPartition ...).
        assert connection.api_versions == {api["key"]: (api["min"], api["max"]) for api in matrix
                                           if not api.get("cluster_only")}
        assert connection.version_for(1, 12) == 12
        assert connection.version_for(3, 99) == max(api["max"] for api in matrix if api["key"] == 3)
        await connection.aclose()
        fixed = await connect(shared_broker, negotiate_versions=False)  # the controller's way
        assert fixed.api_versions is None and fixed.version_for(4, 7) == 7
        response = await fixed.send(metadata(None))
        assert [b.port for b in response.brokers] == [shared_broker.port]
        await fixed.aclose()

    run(scenario())


def test_create_topics_metadata_produce_and_fetch_back_as_a_replica_would(shared_broker, topic_name):
    async def scenario():
        connection = await connect(shared_broker)
        await create(connection, topic_name)
        response = await connection.send(metadata([topic_name]))
        (topic,) = response.topics
        assert (topic.name, topic.error_code, len(topic.partitions)) == (topic_name, ErrorCode.none, 1)
        assert topic.partitions[0].leader_id == response.brokers[0].node_id

        now = int(time.time() * 1000)
        batch = build_batch([(b"k1", b"first"), (None, b"second"), (b"k3", b"third")], timestamp_ms=now)
        answer = (await connection.send(produce(topic_name, batch))).responses[0].partition_responses[0]
        assert (answer.error_code, answer.base_offset) == (ErrorCode.none, 0)

        data = (await connection.send(fetch(topic_name))).responses[0].partitions[0]
        assert data.error_code == ErrorCode.none and data.high_watermark == 3
        (header,) = list(iter_headers(data.records))
        records = read_records(data.records, header)
        assert [(r.offset, r.key, r.value) for r in records] == [
            (0, b"k1", b"first"), (1, None, b"second"), (2, b"k3", b"third")]
        assert bytes(data.records)[61:header.size] == bytes(batch)[61:]  # the records as sent, byte for byte
        await connection.aclose()

    run(scenario())


def test_produce_with_acks_0_gets_no_response_and_keeps_the_pipeline_in_step(shared_broker, topic_name):
    async def scenario():
        connection = await connect(shared_broker)
        await create(connection, topic_name)
        assert await connection.send(produce(topic_name, build_batch([(None, b"a")]), acks=0)) is None
        assert connection.in_flight == 0
        answer = (await connection.send(produce(topic_name, build_batch([(None, b"b")])))).responses[0]
        assert answer.partition_responses[0].base_offset == 1
        await connection.aclose()

    run(scenario())


def test_100_pipelined_requests_get_100_answers_matched_to_their_requests(shared_broker):
    names = [f"absent-{uuid.uuid4().hex[:6]}-{i}" for i in range(100)]

    async def scenario():
        connection = await connect(shared_broker)
        futures = [connection.send_nowait(metadata([name])) for name in names]
        assert connection.in_flight == 100  # all written before any answer was read
        responses = await asyncio.gather(*futures)
        assert [r.topics[0].name for r in responses] == names
        assert {r.topics[0].error_code for r in responses} == {ErrorCode.unknown_topic_or_partition}
        assert connection.in_flight == 0 and not connection.closed
        await connection.aclose()

    run(scenario())


def test_a_broker_killed_mid_request_fails_the_pending_requests_promptly(broker, topic_name):
    async def scenario():
        connection = await connect(broker, request_timeout=30)
        await create(connection, topic_name)
        # Long polls on an empty partition: the broker holds them for up to 20 s.
        polls = [connection.send_nowait(fetch(topic_name, max_wait_ms=20_000)) for _ in range(3)]
        done, _ = await asyncio.wait(polls, timeout=0.5)
        assert not done, "the long polls should be parked in the broker"
        started = time.monotonic()
        broker.kill()
        results = await asyncio.gather(*polls, return_exceptions=True)
        assert time.monotonic() - started < 5
        assert all(isinstance(r, ConnectionLost) for r in results), results
        with pytest.raises(ConnectionLost):
            await connection.send(metadata(None))
        with pytest.raises(ConnectError):
            await connect(broker, connect_timeout=5)

    run(scenario())


def test_a_request_timeout_fires_and_closes_the_connection(shared_broker, topic_name):
    async def scenario():
        connection = await connect(shared_broker)
        await create(connection, topic_name)
        started = time.monotonic()
        with pytest.raises(RequestTimedOut, match="Fetch v12"):
            await connection.send(fetch(topic_name, max_wait_ms=10_000), timeout=0.3)
        assert 0.25 < time.monotonic() - started < 3
        assert connection.closed
        await connection.wait_closed()

    run(scenario())


def test_node_clients_reconnect_after_the_broker_restarts(broker):
    async def scenario():
        pool = NodeClients(0, {1: broker.address}, reconnect_backoff=0.05, reconnect_backoff_max=0.5)
        response = await pool.send(1, metadata(None))
        first = pool.connection(1)
        assert first is not None and response.controller_id == response.brokers[0].node_id

        broker.kill()
        await asyncio.wait_for(first.wait_closed(), 5)  # the pool's connection noticed the drop
        assert pool.connection(1) is None
        with pytest.raises(ConnectError):
            await pool.send(1, metadata(None))  # nobody listens: refused, not hung
        assert pool.backoff_remaining(1) > 0

        broker.start()  # same port, same data dir
        response = await pool.send(1, metadata(None))
        assert response.brokers[0].port == broker.port
        second = pool.connection(1)
        assert second is not None and second is not first and pool.connects(1) == 2
        await pool.close()
        assert second.closed

    run(scenario())

"""acks=all Produce requests pipelined on one connection to a leader of a replicated topic (server/connection.py):
an appended request that waits for the ISR lets the Produce requests behind it in, and the answers still leave
in request order. Real brokers (3, ZooKeeper mode), replication factor 3, min.insync.replicas 2.

What is checked, with both followers SIGSTOPped so that nothing can be acknowledged meanwhile:
  5 pipelined acks=all requests           all 5 are appended to the leader's segment file on disk before any
                                          answer (Kafka would read the 2nd only after answering the 1st); resumed,
                                          the answers come in request order with contiguous offsets, every
                                          record read back once, at its offset
  a Metadata request behind them           not pipelined: its answer comes after theirs
  a 6th Produce (past the cap of 5)        appended only after the first answer
Run: python3 -m pytest -q tests/cluster/test_pipelined_produce_cluster.py
"""

from __future__ import annotations

import asyncio
import datetime
import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import i16, i32, i32Timedelta

from broker_cluster import BrokerCluster
from pykbroker.protocol.client import KafkaClientConnection
from pykbroker.protocol.records import build_batch
from pykbroker.server.connection import MAX_PIPELINED_PRODUCES

OVERRIDES = {
    "min.insync.replicas": 2,
    "default.replication.factor": 3,
    "auto.create.topics.enable": "false",
    # the followers are paused for a few seconds of a loaded machine: they must stay in the ISR meanwhile
    "replica.lag.time.max.ms": 60000,
    "zookeeper.session.timeout.ms": 60000,
}
RECORDS_PER_REQUEST = 10
DEADLINE_S = 60.0

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def cluster(zk_connect, tmp_path):
    with BrokerCluster(zk_connect, tmp_path, n=3, overrides=OVERRIDES) as brokers:
        yield brokers


def produce_request(topic: str, request_index: int) -> ProduceRequest:
    batch = build_batch([(None, b"r%d-%d" % (request_index, i)) for i in range(RECORDS_PER_REQUEST)],
                        timestamp_ms=int(time.time() * 1000))
    return ProduceRequest(transactional_id=None, acks=i16(-1),
                          timeout=i32Timedelta.parse(datetime.timedelta(seconds=DEADLINE_S)),
                          topic_data=(TopicProduceData(name=topic, partition_data=(
                              PartitionProduceData(index=i32(0), records=bytes(batch)),)),))


def segment_bytes(cluster: BrokerCluster, broker_id: int, topic: str) -> int:
    return sum(path.stat().st_size for path in (cluster.brokers[broker_id].data_dir / f"{topic}-0").glob("*.log"))


async def until(predicate, what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_appended_acks_all_produces_are_pipelined_and_answered_in_request_order(cluster):
    topic = "pipelined"
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    leader = cluster.partition(topic, 0).leader
    followers = sorted(set(cluster.brokers) - {leader})
    one_request = len(produce_request(topic, 0).topic_data[0].partition_data[0].records)
    broker = cluster.brokers[leader]
    arrivals: list[str] = []

    async def run() -> list:
        connection = await KafkaClientConnection.connect(broker.host, broker.port, client_id="pipelined-test",
                                                         connect_timeout=10, request_timeout=DEADLINE_S + 30)
        try:
            for follower in followers:
                cluster.pause(follower)
            try:
                futures = []
                for index in range(MAX_PIPELINED_PRODUCES):
                    future = connection.send_nowait(produce_request(topic, index))
                    future.add_done_callback(lambda _, i=index: arrivals.append(f"produce {i}"))
                    futures.append(future)
                metadata = connection.send_nowait(MetadataRequest(
                    topics=(MetadataRequestTopic(topic_id=None, name=topic),), allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False))
                metadata.add_done_callback(lambda _: arrivals.append("metadata"))
                extra = connection.send_nowait(produce_request(topic, MAX_PIPELINED_PRODUCES))
                extra.add_done_callback(lambda _: arrivals.append(f"produce {MAX_PIPELINED_PRODUCES}"))
                # Every request up to the cap is appended on the leader while nothing can be acknowledged.
                capped = MAX_PIPELINED_PRODUCES * one_request
                await until(lambda: segment_bytes(cluster, leader, topic) >= capped,
                            f"{MAX_PIPELINED_PRODUCES} pipelined requests appended on leader {leader}")
                await asyncio.sleep(0.5)  # (what more would be appended has had time to be)
                assert arrivals == [], arrivals  # no answer yet: the followers have none of it
                # The Metadata request behind them was not taken, nor the Produce past the cap.
                assert segment_bytes(cluster, leader, topic) == capped
            finally:
                for follower in followers:
                    cluster.resume(follower)
            answers = [await future for future in futures]
            await metadata
            answers.append(await extra)
            return answers
        finally:
            await connection.aclose()

    answers = asyncio.run(run())
    assert arrivals == [f"produce {i}" for i in range(MAX_PIPELINED_PRODUCES)] + ["metadata",
                                                                                  f"produce {MAX_PIPELINED_PRODUCES}"]
    partitions = [answer.responses[0].partition_responses[0] for answer in answers]
    assert [p.error_code for p in partitions] == [ErrorCode.none] * len(partitions)
    assert [p.base_offset for p in partitions] == [i * RECORDS_PER_REQUEST for i in range(len(partitions))]

    total = len(partitions) * RECORDS_PER_REQUEST
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "pipelined-check",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(seen) < total and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                seen.append((message.offset(), message.value()))
    finally:
        consumer.close()
    assert seen == [(r * RECORDS_PER_REQUEST + i, b"r%d-%d" % (r, i))
                    for r in range(len(partitions)) for i in range(RECORDS_PER_REQUEST)]

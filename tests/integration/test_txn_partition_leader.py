"""The partition-leader side of transactions over the wire, on a real broker process: transactional Produce
(v9/v10), WriteTxnMarkers v1 sent as Kafka's coordinator sends it, then Fetch (isolation 0/1: records, LSO,
aborted_transactions) and ListOffsets (isolation 0/1), kill -9 and restart (the LSO and the aborted list
survive, an open transaction stays open), and the read_committed / read_uncommitted consumers of
confluent-kafka and kafka-python on the result. The transaction coordinator is not needed: the test plays
its part with raw requests."""

from __future__ import annotations

import datetime
import time

import pytest
from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest
from kio.schema.describe_producers.v0 import request as dp
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as f12
from kio.schema.list_offsets.v7 import request as l7
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.produce.v10.request import ProduceRequest as ProduceRequestV10
from kio.schema.produce.v10.request import PartitionProduceData as PartitionProduceDataV10
from kio.schema.produce.v10.request import TopicProduceData as TopicProduceDataV10
from kio.schema.write_txn_markers.v1 import request as wm
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from broker_process import init_producer_id, send_request, wait_until
from pykbroker.protocol.records import TRANSACTIONAL_MASK, build_batch, iter_headers, read_records


def ms(value: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=value))


def create_topic(address, name: str, partitions: int = 1) -> None:
    response = send_request(address, CreateTopicsRequest(topics=(CreatableTopic(
        name=name, num_partitions=i32(partitions), replication_factor=i16(1), assignments=(), configs=()),),
        timeout=ms(10_000), validate_only=False))
    assert response.topics[0].error_code == ErrorCode.none


def txn_records(pid: int, epoch: int, seq: int, values: list[bytes], *, transactional: bool = True) -> bytes:
    return bytes(build_batch([(None, v) for v in values], timestamp_ms=int(time.time() * 1000), producer_id=pid,
                             producer_epoch=epoch, base_sequence=seq,
                             attributes=TRANSACTIONAL_MASK if transactional else 0))


def produce(address, topic: str, records: bytes, *, transactional_id: str | None = "tx", version: int = 9):
    if version == 10:
        request = ProduceRequestV10(transactional_id=transactional_id, acks=i16(-1), timeout=ms(10_000),
                                    topic_data=(TopicProduceDataV10(name=topic, partition_data=(
                                        PartitionProduceDataV10(index=i32(0), records=records),)),))
    else:
        request = ProduceRequest(transactional_id=transactional_id, acks=i16(-1), timeout=ms(10_000),
                                 topic_data=(TopicProduceData(name=topic, partition_data=(
                                     PartitionProduceData(index=i32(0), records=records),)),))
    return send_request(address, request).responses[0].partition_responses[0]


def write_marker(address, topic: str, pid: int, epoch: int, commit: bool, *, coordinator_epoch: int = 0,
                 partitions=(0,)):
    response = send_request(address, wm.WriteTxnMarkersRequest(markers=(wm.WritableTxnMarker(
        producer_id=i64(pid), producer_epoch=i16(epoch), transaction_result=commit,
        topics=(wm.WritableTxnMarkerTopic(name=topic, partition_indexes=tuple(i32(p) for p in partitions)),),
        coordinator_epoch=i32(coordinator_epoch)),)), client_id="broker-1-txn-marker-sender")
    return [(p.partition_index, p.error_code) for p in response.markers[0].topics[0].partitions]


def fetch(address, topic: str, offset: int, isolation: int):
    response = send_request(address, f12.FetchRequest(
        cluster_id=None, replica_id=i32(-1), max_wait=ms(0), min_bytes=i32(0), max_bytes=i32(1 << 20),
        isolation_level=i8(isolation), session_id=i32(0), session_epoch=i32(-1),
        topics=(f12.FetchTopic(topic=topic, partitions=(f12.FetchPartition(
            partition=i32(0), current_leader_epoch=i32(-1), fetch_offset=i64(offset), last_fetched_epoch=i32(-1),
            log_start_offset=i64(-1), partition_max_bytes=i32(1 << 20)),)),),
        forgotten_topics_data=(), rack_id=""))
    return response.responses[0].partitions[0]


def values_of(part) -> list[bytes]:
    data = bytes(part.records or b"")
    out = []
    for header in iter_headers(data):
        if not header.is_control:
            out.extend(r.value for r in read_records(data, header))
    return out


def list_offset(address, topic: str, timestamp: int, isolation: int) -> int:
    response = send_request(address, l7.ListOffsetsRequest(replica_id=i32(-1), isolation_level=i8(isolation), topics=(
        l7.ListOffsetsTopic(name=topic, partitions=(l7.ListOffsetsPartition(
            partition_index=i32(0), current_leader_epoch=i32(-1), timestamp=i64(timestamp)),)),)))
    answer = response.topics[0].partitions[0]
    assert answer.error_code == ErrorCode.none
    return answer.offset


def producers(address, topic: str) -> dict[int, tuple[int, int]]:
    """DescribeProducers: producer id -> (coordinator epoch, current transaction start offset)."""
    response = send_request(address, dp.DescribeProducersRequest(topics=(
        dp.TopicRequest(name=topic, partition_indexes=(i32(0),)),)))
    part = response.topics[0].partitions[0]
    assert part.error_code == ErrorCode.none
    return {p.producer_id: (p.coordinator_epoch, p.current_txn_start_offset) for p in part.active_producers}


def summary(address, topic: str) -> tuple:
    """What a read_committed consumer is told: (HWM, LSO, aborted list, committed values)."""
    part = fetch(address, topic, 0, 1)
    return (part.high_watermark, part.last_stable_offset,
            [(a.producer_id, a.first_offset) for a in part.aborted_transactions], values_of(part))


def test_transactional_produce_markers_and_isolation(broker, topic_name):
    address = broker.address
    create_topic(address, topic_name)
    pid, epoch = init_producer_id(address)
    other, other_epoch = init_producer_id(address)
    # Transactional batches without the request's transactional id: Kafka refuses the whole request.
    refused = produce(address, topic_name, txn_records(pid, epoch, 0, [b"x"]), transactional_id=None)
    assert refused.error_code == ErrorCode.transactional_id_authorization_failed
    assert produce(address, topic_name, txn_records(pid, epoch, 0, [b"a1", b"a2"])).base_offset == 0  # aborted below
    assert produce(address, topic_name, txn_records(other, other_epoch, 0, [b"c1"]), version=10).base_offset == 2
    # A non-transactional batch from a producer with an open transaction: INVALID_TXN_STATE.
    wrong = produce(address, topic_name, txn_records(pid, epoch, 2, [b"no"], transactional=False), transactional_id=None)
    assert wrong.error_code == ErrorCode.invalid_txn_state
    assert list_offset(address, topic_name, -1, 1) == 0 and list_offset(address, topic_name, -1, 0) == 3
    assert producers(address, topic_name) == {pid: (-1, 0), other: (-1, 2)}
    part = fetch(address, topic_name, 0, 1)
    assert (part.high_watermark, part.last_stable_offset, values_of(part)) == (3, 0, [])

    assert write_marker(address, topic_name, pid, epoch, commit=False) == [(0, ErrorCode.none)]  # offset 3
    assert list_offset(address, topic_name, -1, 1) == 2  # the other transaction is still open
    assert write_marker(address, topic_name, other, other_epoch, commit=True) == [(0, ErrorCode.none)]  # offset 4
    assert list_offset(address, topic_name, -1, 1) == list_offset(address, topic_name, -1, 0) == 5
    assert producers(address, topic_name) == {pid: (0, -1), other: (0, -1)}
    assert summary(address, topic_name) == (5, 5, [(pid, 0)], [b"a1", b"a2", b"c1"])
    uncommitted = fetch(address, topic_name, 0, 0)
    assert uncommitted.aborted_transactions is None and uncommitted.last_stable_offset == 5
    assert values_of(uncommitted) == [b"a1", b"a2", b"c1"]
    # Marker errors, per partition.
    assert write_marker(address, topic_name, pid, epoch - 1, commit=True) == [(0, ErrorCode.invalid_producer_epoch)]
    assert write_marker(address, topic_name, pid, epoch, commit=True, coordinator_epoch=-3) == [
        (0, ErrorCode.transaction_coordinator_fenced)]
    assert write_marker(address, topic_name, pid, epoch, commit=True, partitions=(0, 9)) == [
        (0, ErrorCode.none), (9, ErrorCode.unknown_topic_or_partition)]
    assert write_marker(address, "no-such-topic", pid, epoch, commit=True) == [(0, ErrorCode.unknown_topic_or_partition)]

    # An open transaction and kill -9: the restarted broker knows it, and the aborted list.
    assert produce(address, topic_name, txn_records(other, other_epoch, 1, [b"open"])).base_offset == 6
    before = summary(address, topic_name)
    assert before[:3] == (7, 6, [(pid, 0)])
    broker.restart(kill=True)
    assert summary(address, topic_name) == before
    assert producers(address, topic_name) == {pid: (0, -1), other: (0, 6)}
    assert write_marker(address, topic_name, other, other_epoch, commit=False) == [(0, ErrorCode.none)]  # 7
    after = summary(address, topic_name)
    assert after[:3] == (8, 8, [(pid, 0), (other, 6)])
    assert (broker.data_dir / f"{topic_name}-0" / "00000000000000000000.txnindex").stat().st_size == 2 * 34
    broker.restart(kill=True)
    assert summary(address, topic_name) == after


def test_read_committed_consumers_skip_aborted_transactions(broker, topic_name):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    address = broker.address
    create_topic(address, topic_name)
    pid, epoch = init_producer_id(address)
    sequence = 0
    expected_committed = []
    everything = []
    for round_number in range(4):
        values = [b"r%d-%d" % (round_number, i) for i in range(3)]
        response = produce(address, topic_name, txn_records(pid, epoch, sequence, values))
        assert response.error_code == ErrorCode.none
        sequence += len(values)
        commit = round_number % 2 == 0
        assert write_marker(address, topic_name, pid, epoch, commit=commit) == [(0, ErrorCode.none)]
        everything += values
        if commit:
            expected_committed += values
    plain = produce(address, topic_name, txn_records(pid, epoch, sequence, [b"plain"], transactional=False),
                    transactional_id=None)
    assert plain.error_code == ErrorCode.none
    expected_committed.append(b"plain")
    everything.append(b"plain")

    def consume(isolation: str) -> list[bytes]:
        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": broker.bootstrap, "group.id": f"g-{isolation}-{topic_name}",
            "auto.offset.reset": "earliest", "isolation.level": isolation, "enable.auto.commit": False})
        got: list[bytes] = []
        try:
            consumer.subscribe([topic_name])
            deadline = time.monotonic() + 60
            while len(got) < len(everything) and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is None or message.error():
                    if got and got[-1] == b"plain":
                        break
                    continue
                got.append(message.value())
        finally:
            consumer.close()
        return got

    assert consume("read_committed") == expected_committed
    assert consume("read_uncommitted") == everything

    kafka = pytest.importorskip("kafka")
    for isolation, expected in (("read_committed", expected_committed), ("read_uncommitted", everything)):
        consumer = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, isolation_level=isolation,
                                       auto_offset_reset="earliest", enable_auto_commit=False)
        try:
            consumer.assign([kafka.TopicPartition(topic_name, 0)])
            got: list[bytes] = []
            deadline = time.monotonic() + 60
            while b"plain" not in got and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=500).values():
                    got.extend(r.value for r in records)
            assert got == expected, isolation
        finally:
            consumer.close()


def test_read_committed_long_poll_wakes_on_the_marker(broker, topic_name):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    address = broker.address
    create_topic(address, topic_name)
    pid, epoch = init_producer_id(address)
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic_name}", "auto.offset.reset": "earliest",
        "isolation.level": "read_committed", "fetch.wait.max.ms": 5000})
    try:
        consumer.subscribe([topic_name])
        assert produce(address, topic_name, txn_records(pid, epoch, 0, [b"late"])).error_code == ErrorCode.none
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            assert message is None or message.error() is not None, "read an open transaction's record"
        assert write_marker(address, topic_name, pid, epoch, commit=True) == [(0, ErrorCode.none)]
        got = []
        wait_until(lambda: _poll_into(consumer, got), "the committed record", 30)
        assert got == [b"late"]
    finally:
        consumer.close()


def _poll_into(consumer, got: list) -> bool:
    message = consumer.poll(0.2)
    if message is not None and not message.error():
        got.append(message.value())
    return bool(got)

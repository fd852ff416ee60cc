"""Producers' batches are validated record by record (issue 7: "a batch that lies about its records gets two
records at one offset"), through a real broker with raw Produce frames, read back with real clients.

A batch with a valid CRC whose header says 1 record but that holds 3 used to be appended; the next batch
then got an offset already taken. Now it is refused with INVALID_RECORD (CORRUPT_MESSAGE before Produce
v8), nothing is appended, and the next batch gets the next free offset.
"""

from __future__ import annotations

import datetime
import struct
import time

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode
from kio.schema.produce.v7.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import i16, i32, i32Timedelta

from broker_process import Rec, fetch_raw, produce_raw, send_request
from pykbroker.protocol import compression
from pykbroker.protocol.records import (
    BATCH_HEADER_SIZE,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    build_batch,
    crc32c,
    iter_headers,
)
from test_confluent_kafka import consume as confluent_consume
from test_kafka_python import consume as kafka_python_consume

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 30


def _create_topic(bootstrap: str, topic: str, config: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.create_topics([NewTopic(topic, num_partitions=1, config=config or {})]).values()
    future.result(timeout=TIMEOUT_S)


def _lying_batch(values: list[bytes], declared: int, codec: int = COMPRESSION_NONE) -> bytes:
    """A batch holding ``values`` whose header declares ``declared`` records, with a valid CRC."""
    batch = bytearray(build_batch([(None, v) for v in values], timestamp_ms=int(time.time() * 1000)))
    body = bytes(batch[BATCH_HEADER_SIZE:])
    if codec:
        body = compression.compress(codec, body)
    batch = batch[:BATCH_HEADER_SIZE] + body
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">h", batch, 21, codec)
    struct.pack_into(">i", batch, 23, declared - 1)
    struct.pack_into(">i", batch, 57, declared)
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[21:]))
    return bytes(batch)


def _good(*values: bytes) -> bytes:
    return bytes(build_batch([(None, v) for v in values], timestamp_ms=int(time.time() * 1000)))


def _values(records: list[Rec]) -> list[tuple[int, bytes]]:
    return sorted((r.offset, r.value) for r in records)


@pytest.mark.parametrize("codec", [COMPRESSION_NONE, COMPRESSION_LZ4], ids=["uncompressed", "lz4"])
def test_a_batch_that_lies_about_its_records_is_refused_and_the_next_gets_the_next_offset(shared_broker, topic_name, codec):
    address = shared_broker.address
    _create_topic(shared_broker.bootstrap, topic_name)
    assert produce_raw(address, topic_name, 0, _good(b"v0", b"v1"), acks=1).base_offset == 0

    answer = produce_raw(address, topic_name, 0, _lying_batch([b"x2", b"x3", b"x4"], declared=1, codec=codec), acks=1)
    assert answer.error_code == ErrorCode.invalid_record
    assert "remain after the declared 1 records" in answer.error_message

    answer = produce_raw(address, topic_name, 0, _good(b"v2"), acks=1)
    assert answer.error_code == ErrorCode.none and answer.base_offset == 2
    assert [(h.base_offset, h.record_count) for h in iter_headers(fetch_raw(address, topic_name, 0))] == [(0, 2), (2, 1)]

    expected = [(0, b"v0"), (1, b"v1"), (2, b"v2")]
    # librdkafka returned offset 3 twice and kafka-python skipped records before the fix.
    assert _values(confluent_consume(shared_broker.bootstrap, topic_name, 3, partitions=[0])) == expected
    assert _values(kafka_python_consume(shared_broker.bootstrap, topic_name, 3, partitions=[0])) == expected


def test_fewer_records_than_declared_and_old_produce_versions_get_corrupt_message(shared_broker, topic_name):
    address = shared_broker.address
    _create_topic(shared_broker.bootstrap, topic_name)
    answer = produce_raw(address, topic_name, 0, _lying_batch([b"a"], declared=4), acks=1)
    assert answer.error_code == ErrorCode.invalid_record
    # Produce v7 predates INVALID_RECORD (KIP-467): its clients get CORRUPT_MESSAGE.
    response = send_request(address, ProduceRequest(
        transactional_id=None, acks=i16(1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
        topic_data=(TopicProduceData(name=topic_name, partition_data=(
            PartitionProduceData(index=i32(0), records=_lying_batch([b"a", b"b"], declared=1)),)),)))
    assert response.responses[0].partition_responses[0].error_code == ErrorCode.corrupt_message
    assert fetch_raw(address, topic_name, 0) == b""
    assert produce_raw(address, topic_name, 0, _good(b"first"), acks=1).base_offset == 0


def test_timestamps_out_of_the_topics_window_get_record_errors(shared_broker, topic_name):
    address = shared_broker.address
    _create_topic(shared_broker.bootstrap, topic_name, {"message.timestamp.before.max.ms": "3600000"})
    day_old = int(time.time() * 1000) - 24 * 3600 * 1000
    stale = bytes(build_batch([(None, b"old-0"), (None, b"old-1")], timestamp_ms=day_old))
    answer = produce_raw(address, topic_name, 0, stale, acks=1)
    assert answer.error_code == ErrorCode.invalid_timestamp
    assert answer.error_message == "One or more records have been rejected due to invalid timestamp"
    assert [e.batch_index for e in answer.record_errors] == [0, 1]
    assert all("is out of range" in e.batch_index_error_message for e in answer.record_errors)
    assert produce_raw(address, topic_name, 0, _good(b"fresh"), acks=1).base_offset == 0


def test_two_batches_for_one_partition_are_refused(shared_broker, topic_name):
    # Produce v3+ carries exactly one batch per partition (Kafka's ProduceRequest.validateRecords).
    address = shared_broker.address
    _create_topic(shared_broker.bootstrap, topic_name)
    answer = produce_raw(address, topic_name, 0, _good(b"a") + _good(b"b"), acks=1)
    assert answer.error_code == ErrorCode.invalid_record
    assert "exactly one record batch per partition" in answer.error_message
    assert fetch_raw(address, topic_name, 0) == b""

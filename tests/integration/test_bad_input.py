"""Bad input over raw sockets: each case gets the protocol's error or a closed connection, and the broker
keeps serving every other connection (checked by a fresh ApiVersions and a produce/fetch after each)."""

from __future__ import annotations

import datetime
import io
import socket
import struct
import time

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from broker_process import fetch_raw, probe_api_versions, produce_raw, read_exact
from pykbroker.protocol.records import build_batch, iter_headers


def _frame(api_key: int, version: int, body, correlation_id: int) -> bytes:
    schema = load_request_schema(api_key, version)
    header_type = schema.__header_schema__
    out = io.BytesIO()
    entity_writer(header_type)(out, header_type(
        request_api_key=api_key, request_api_version=version, correlation_id=correlation_id, client_id="raw"))
    entity_writer(schema)(out, body)
    payload = out.getvalue()
    return struct.pack(">i", len(payload)) + payload


def _read_response(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", read_exact(sock, 4))[0]
    return read_exact(sock, size)


def _assert_closed(sock: socket.socket) -> None:
    sock.settimeout(10)
    try:
        assert sock.recv(1) == b""
    except ConnectionResetError:
        pass


def _assert_still_serving(broker) -> None:
    assert probe_api_versions(broker.address, timeout=5).error_code == ErrorCode.none


def _metadata_frame(correlation_id: int, topics=None) -> bytes:
    schema = load_request_schema(3, 12)
    return _frame(3, 12, schema(topics=topics, allow_auto_topic_creation=False, include_topic_authorized_operations=False), correlation_id)


@pytest.fixture
def sock(shared_broker):
    with socket.create_connection(shared_broker.address, timeout=10) as s:
        yield s


def test_oversized_frame_closes_connection(shared_broker, sock):
    sock.sendall(struct.pack(">i", 200 * 1024 * 1024) + b"\x00" * 16)
    _assert_closed(sock)
    _assert_still_serving(shared_broker)


def test_negative_size_closes_connection(shared_broker, sock):
    sock.sendall(struct.pack(">i", -5))
    _assert_closed(sock)
    _assert_still_serving(shared_broker)


def test_garbage_bytes_close_connection(shared_broker, sock):
    sock.sendall(struct.pack(">i", 12) + b"\xde\xad\xbe\xef" * 3)
    _assert_closed(sock)
    _assert_still_serving(shared_broker)


def test_unknown_api_key_closes_connection(shared_broker, sock):
    payload = struct.pack(">hhih", 4242, 0, 1, -1)
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    _assert_closed(sock)
    _assert_still_serving(shared_broker)


def test_unsupported_version_of_a_known_api_closes_connection(shared_broker, sock):
    payload = struct.pack(">hhih", 3, 99, 1, -1)  # Metadata v99
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    _assert_closed(sock)
    _assert_still_serving(shared_broker)


def test_truncated_request_closes_connection(shared_broker, sock):
    frame = _metadata_frame(3, topics=())
    truncated = frame[4:-3]
    sock.sendall(struct.pack(">i", len(truncated)) + truncated)
    _assert_closed(sock)
    _assert_still_serving(shared_broker)


def test_unknown_api_versions_version_gets_v0_error_35_and_connection_stays(shared_broker, sock):
    payload = struct.pack(">hhih", 18, 77, 11, -1)
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    answer = _read_response(sock)
    correlation_id, error, count, key, low, high = struct.unpack(">ihihhh", answer)
    assert (correlation_id, error, count, key, low, high) == (11, 35, 1, 18, 0, 4)
    # KIP-511: the client retries with a known version on the same connection.
    sock.sendall(_frame(18, 3, load_request_schema(18, 3)(client_software_name="raw", client_software_version="1"), 12))
    answer = _read_response(sock)
    response = load_response_schema(18, 3)
    header, n = entity_reader(response.__header_schema__)(answer, 0)
    body, _ = entity_reader(response)(answer, n)
    assert header.correlation_id == 12 and body.error_code == ErrorCode.none
    assert {k.api_key for k in body.api_keys} >= {0, 1, 2, 3, 18}


def test_corrupt_batch_gets_corrupt_message_and_appends_nothing(broker_factory, topic_name):
    broker = broker_factory.make({"num.partitions": 1})
    good = build_batch([(b"k", b"v")])
    assert produce_raw(broker.address, topic_name, 0, good, acks=1).error_code == ErrorCode.unknown_topic_or_partition
    # Metadata auto-creates; then produce works.
    with socket.create_connection(broker.address, timeout=10) as s:
        from kio.schema.metadata.v12.request import MetadataRequestTopic

        schema = load_request_schema(3, 12)
        s.sendall(_frame(3, 12, schema(topics=(MetadataRequestTopic(topic_id=None, name=topic_name),),
                                       allow_auto_topic_creation=True, include_topic_authorized_operations=False), 1))
        _read_response(s)
    assert produce_raw(broker.address, topic_name, 0, good, acks=1).error_code == ErrorCode.none
    corrupt = bytearray(build_batch([(b"k2", b"v2")]))
    corrupt[-1] ^= 0xFF
    answer = produce_raw(broker.address, topic_name, 0, bytes(corrupt), acks=1)
    assert answer.error_code == ErrorCode.corrupt_message
    truncated = bytes(build_batch([(b"k3", b"v3")]))[:-5]
    assert produce_raw(broker.address, topic_name, 0, truncated, acks=1).error_code == ErrorCode.corrupt_message
    stored = fetch_raw(broker.address, topic_name, 0, 0)
    assert [h.base_offset for h in iter_headers(stored)] == [0]
    _assert_still_serving(broker)


def test_pipelined_requests_are_answered_in_order_behind_a_long_poll(broker_factory, topic_name):
    broker = broker_factory.make({"num.partitions": 1})
    from kio.schema.metadata.v12.request import MetadataRequestTopic

    with socket.create_connection(broker.address, timeout=10) as s:
        schema = load_request_schema(3, 12)
        s.sendall(_frame(3, 12, schema(topics=(MetadataRequestTopic(topic_id=None, name=topic_name),),
                                       allow_auto_topic_creation=True, include_topic_authorized_operations=False), 2))
        _read_response(s)
        fetch_schema = load_request_schema(1, 4)
        from kio.schema.fetch.v4.request import FetchPartition, FetchTopic

        long_poll = fetch_schema(
            replica_id=-1, max_wait=datetime.timedelta(milliseconds=700), min_bytes=1, max_bytes=1 << 20,
            isolation_level=0,
            topics=(FetchTopic(topic=topic_name, partitions=(FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),)),),
        )
        started = time.monotonic()
        s.sendall(_frame(1, 4, long_poll, 10) + _metadata_frame(11, topics=()) + _metadata_frame(12, topics=()))
        order = [struct.unpack_from(">i", _read_response(s))[0] for _ in range(3)]
        elapsed = time.monotonic() - started
    assert order == [10, 11, 12]
    # The Metadata answers waited behind the parked Fetch: proof that order, not readiness, decides.
    assert elapsed >= 0.5


def test_acks_zero_produce_gets_no_response_but_is_stored(broker_factory, topic_name):
    broker = broker_factory.make({"num.partitions": 1})
    from kio.schema.metadata.v12.request import MetadataRequestTopic
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

    with socket.create_connection(broker.address, timeout=10) as s:
        schema = load_request_schema(3, 12)
        s.sendall(_frame(3, 12, schema(topics=(MetadataRequestTopic(topic_id=None, name=topic_name),),
                                       allow_auto_topic_creation=True, include_topic_authorized_operations=False), 1))
        _read_response(s)
        produce = ProduceRequest(transactional_id=None, acks=0, timeout=datetime.timedelta(seconds=5), topic_data=(
            TopicProduceData(name=topic_name, partition_data=(PartitionProduceData(index=0, records=bytes(build_batch([(b"a", b"b")]))),)),))
        s.sendall(_frame(0, 9, produce, 2) + _metadata_frame(3, topics=()))
        first = _read_response(s)
        assert struct.unpack_from(">i", first)[0] == 3  # the acks=0 produce had no answer
    assert [h.base_offset for h in iter_headers(fetch_raw(broker.address, topic_name, 0, 0))] == [0]

"""Requests with a null (-1) array where the schema allows none get Kafka's error answer, not a closed
connection: INVALID_REQUEST at every level of the response that has an error code, the request's topics
echoed, one log line, and the same connection then answers ApiVersions.

The frames are written by hand (kio's writer refuses a null where the schema forbids one). A null string
where the schema forbids one is not a request at all (the codec refuses it, as Kafka's parser does) and
closes the connection: that case belongs to test_bad_input.py.
"""

from __future__ import annotations

import dataclasses
import socket
import struct

import pytest
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from broker_process import read_exact

NULL_ARRAY = struct.pack(">i", -1)


def _header(api_key: int, version: int, correlation_id: int) -> bytes:
    return struct.pack(">hhih", api_key, version, correlation_id, 3) + b"raw"


def _string(value: bytes) -> bytes:
    return struct.pack(">h", len(value)) + value


def _one_topic(name: bytes, partitions: bytes) -> bytes:
    return struct.pack(">i", 1) + _string(name) + partitions


# (api key, version, body) of requests whose handler cannot serve them as they stand.
CASES = {
    "ListOffsets v1 topics": (2, 1, struct.pack(">i", -1) + NULL_ARRAY),
    "ListOffsets v1 partitions": (2, 1, struct.pack(">i", -1) + _one_topic(b"t", NULL_ARRAY)),
    "Fetch v7 topics": (1, 7, struct.pack(">iiiibii", -1, 100, 1, 1000, 0, 0, -1) + NULL_ARRAY + struct.pack(">i", 0)),
    "OffsetCommit v2 topics": (8, 2, _string(b"g") + struct.pack(">i", -1) + _string(b"") + struct.pack(">q", -1) + NULL_ARRAY),
    "OffsetCommit v2 partitions": (8, 2, _string(b"g") + struct.pack(">i", -1) + _string(b"") + struct.pack(">q", -1)
                                   + _one_topic(b"t", NULL_ARRAY)),
    "OffsetFetch v3 partitions": (9, 3, _string(b"g") + _one_topic(b"t", NULL_ARRAY)),
    "CreateTopics v2 topics": (19, 2, NULL_ARRAY + struct.pack(">ib", 1000, 0)),
    "JoinGroup v2 protocols": (11, 2, _string(b"g") + struct.pack(">ii", 10000, 10000) + _string(b"") + _string(b"consumer")
                               + NULL_ARRAY),
    "SyncGroup v1 assignments": (14, 1, _string(b"g") + struct.pack(">i", 1) + _string(b"m") + NULL_ARRAY),
    "DescribeGroups v0 groups": (15, 0, NULL_ARRAY),
    "DeleteGroups v0 groups": (42, 0, NULL_ARRAY),
}


def _exchange(sock: socket.socket, api_key: int, version: int, body: bytes, correlation_id: int):
    frame = _header(api_key, version, correlation_id) + body
    sock.sendall(struct.pack(">i", len(frame)) + frame)
    (size,) = struct.unpack(">i", read_exact(sock, 4))
    payload = read_exact(sock, size)
    schema = load_response_schema(api_key, version)
    header, used = entity_reader(schema.__header_schema__)(payload, 0)
    assert header.correlation_id == correlation_id
    response, body_size = entity_reader(schema)(payload, used)
    assert used + body_size == len(payload)
    return response


def _error_codes(entity) -> list[ErrorCode]:
    found = []
    for field in dataclasses.fields(entity):
        value = getattr(entity, field.name)
        if isinstance(value, ErrorCode):
            found.append(value)
        for item in value if isinstance(value, tuple) else ():
            if dataclasses.is_dataclass(item):
                found += _error_codes(item)
    return found


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_null_array_gets_invalid_request_and_the_connection_stays_usable(shared_broker, case):
    api_key, version, body = CASES[case]
    with socket.create_connection(shared_broker.address, timeout=20) as sock:
        response = _exchange(sock, api_key, version, body, correlation_id=41)
        assert set(_error_codes(response)) <= {ErrorCode.invalid_request}
        versions = _exchange(sock, 18, 0, b"", correlation_id=42)
        assert versions.error_code == ErrorCode.none and versions.api_keys
    assert f"api {api_key} v{version} (correlation id 41)" in shared_broker.log_tail(400)


def test_errors_are_set_where_the_response_has_them(shared_broker):
    with socket.create_connection(shared_broker.address, timeout=20) as sock:
        fetch = _exchange(sock, *CASES["Fetch v7 topics"][:2], CASES["Fetch v7 topics"][2], correlation_id=1)
        assert fetch.error_code == ErrorCode.invalid_request and fetch.responses == ()
        join = _exchange(sock, *CASES["JoinGroup v2 protocols"][:2], CASES["JoinGroup v2 protocols"][2], correlation_id=2)
        assert join.error_code == ErrorCode.invalid_request
        sync = _exchange(sock, *CASES["SyncGroup v1 assignments"][:2], CASES["SyncGroup v1 assignments"][2], correlation_id=3)
        assert sync.error_code == ErrorCode.invalid_request
        offsets = _exchange(sock, *CASES["ListOffsets v1 partitions"][:2], CASES["ListOffsets v1 partitions"][2], correlation_id=4)
        assert [t.name for t in offsets.topics] == ["t"] and offsets.topics[0].partitions == ()


def test_a_pipelined_burst_with_a_null_request_in_the_middle_is_answered_in_order(shared_broker):
    api_key, version, body = CASES["OffsetCommit v2 topics"]
    frames = b""
    for correlation_id, (key, ver, payload) in enumerate([(18, 0, b""), (api_key, version, body), (18, 0, b"")]):
        frame = _header(key, ver, correlation_id) + payload
        frames += struct.pack(">i", len(frame)) + frame
    with socket.create_connection(shared_broker.address, timeout=20) as sock:
        sock.sendall(frames)
        seen = []
        for _ in range(3):
            (size,) = struct.unpack(">i", read_exact(sock, 4))
            seen.append(struct.unpack(">i", read_exact(sock, size)[:4])[0])
    assert seen == [0, 1, 2]

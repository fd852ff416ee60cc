"""Kafka's error answer for a request whose handler raised, for every advertised API and version.

The answer is built generically from kio's schemas (server/error_answers.py); these tests prove that it
encodes for every (api, version) of protocol_specs/api_support.json, carries the error code at every level
that has one, echoes the request's topics and partitions, and that the code is INVALID_REQUEST exactly
when the request holds a null its schema forbids.
"""

import dataclasses
import datetime
import json
import struct
import typing
import uuid
from pathlib import Path

import pytest
from kio.serial import entity_reader

from pykbroker.protocol.apis import codec_for
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.framing import Request, encode_response
from pykbroker.server.dispatch import CloseConnection, load_handlers
from pykbroker.server.error_answers import build, error_response, has_illegal_null

SUPPORT = Path(__file__).resolve().parents[2] / "protocol_specs" / "api_support.json"
load_handlers()  # as the broker at start: a handler may register its API's error answer (error_answers.py)
ADVERTISED = [
    (api["key"], version)
    for api in json.loads(SUPPORT.read_text())["apis"]
    for version in range(api["min"], api["max"] + 1)
]


def _sample_value(hint, kafka_type: str):
    """A non-null value of a kio field type; arrays get one entry so that echoing is exercised."""
    if isinstance(hint, type(int | None)) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) is tuple:
        return (_sample_value(typing.get_args(hint)[0], kafka_type),)
    if dataclasses.is_dataclass(hint):
        return sample(hint)
    if kafka_type.startswith("timedelta"):
        return datetime.timedelta(milliseconds=5)
    if kafka_type.startswith("datetime"):
        return datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    if kafka_type == "records":
        return b""
    if hint is ErrorCode:
        return ErrorCode.none
    if kafka_type == "bool":
        return True
    if kafka_type == "uuid":
        return uuid.UUID(int=7)
    if kafka_type == "string":
        return hint("t")
    if kafka_type == "bytes":
        return b"m"
    if kafka_type == "float64":  # AlterClientQuotas' values
        return hint(3.0)
    return hint(3)


def sample(cls):
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: _sample_value(hints[f.name], f.metadata.get("kafka_type", "")) for f in dataclasses.fields(cls)})


def _error_codes(entity, found: list) -> list:
    for field in dataclasses.fields(entity):
        value = getattr(entity, field.name)
        if isinstance(value, ErrorCode):
            found.append(value)
        elif dataclasses.is_dataclass(value):
            _error_codes(value, found)
        elif isinstance(value, tuple):
            for item in value:
                if dataclasses.is_dataclass(item):
                    _error_codes(item, found)
    return found


def _request(api_key: int, version: int, body) -> Request:
    return Request(api_key, version, 11, "test", None, body, codec_for(api_key, version))


def test_the_support_matrix_is_read():
    assert len(ADVERTISED) > 100


@pytest.mark.parametrize(("api_key", "version"), ADVERTISED)
def test_every_api_version_gets_an_encodable_error_answer_with_the_code_everywhere(api_key, version):
    codec = codec_for(api_key, version)
    body = sample(codec.request_type)
    if api_key == 0:
        body = dataclasses.replace(body, acks=1)
    answer, code = error_response(_request(api_key, version, body))
    assert code == ErrorCode.unknown_server_error  # a complete request: the failure is ours
    frame = b"".join(encode_response(codec, 11, answer))
    (size, correlation_id) = struct.unpack_from(">ii", frame)
    assert size == len(frame) - 4 and correlation_id == 11
    body_start = 8 + (1 if codec.flexible_response_header else 0)
    decoded, _ = entity_reader(codec.response_type)(frame, body_start)
    codes = _error_codes(decoded, [])
    assert codes and set(codes) == {ErrorCode.unknown_server_error}


def test_per_partition_errors_echo_the_requested_topics_and_partitions():
    codec = codec_for(2, 7)  # ListOffsets
    module = __import__(codec.request_type.__module__, fromlist=["x"])
    body = codec.request_type(
        replica_id=-1, isolation_level=0,
        topics=(module.ListOffsetsTopic(name="a", partitions=(
            module.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-1),
            module.ListOffsetsPartition(partition_index=4, current_leader_epoch=-1, timestamp=-1))),),
    )
    answer = build(codec.response_type, body, ErrorCode.invalid_request)
    assert [t.name for t in answer.topics] == ["a"]
    assert [(p.partition_index, p.error_code) for p in answer.topics[0].partitions] == [
        (0, ErrorCode.invalid_request), (4, ErrorCode.invalid_request)]


def test_fetch_answers_per_partition_under_responses():
    codec = codec_for(1, 12)
    answer = build(codec.response_type, sample(codec.request_type), ErrorCode.unknown_server_error)
    assert answer.error_code == ErrorCode.unknown_server_error
    assert [p.partition_index for p in answer.responses[0].partitions] == [3]
    assert answer.responses[0].topic == "t"


def test_a_null_where_the_schema_forbids_one_is_an_invalid_request():
    codec = codec_for(9, 5)  # OffsetFetch v5: topics is nullable (all topics), group_id is not
    body = sample(codec.request_type)
    assert not has_illegal_null(body)
    assert not has_illegal_null(dataclasses.replace(body, topics=None))
    invalid = dataclasses.replace(body, group_id=None)
    assert has_illegal_null(invalid)
    assert error_response(_request(9, 5, invalid))[1] == ErrorCode.invalid_request
    topic = body.topics[0]
    nested = dataclasses.replace(body, topics=(dataclasses.replace(topic, partition_indexes=None),))
    assert has_illegal_null(nested)


def test_produce_with_acks_0_gets_no_answer_but_a_closed_connection():
    codec = codec_for(0, 9)
    body = dataclasses.replace(sample(codec.request_type), acks=0)
    answer, code = error_response(_request(0, 9, body))
    assert isinstance(answer, CloseConnection) and code.name in answer.reason


def _answer(api_key: int, version: int, **changes):
    codec = codec_for(api_key, version)
    body = dataclasses.replace(sample(codec.request_type), **changes)
    return error_response(_request(api_key, version, body))[0]


def test_none_values_are_minus_one_as_in_kafkas_error_responses_and_throttle_time_stays_0():
    coordinator = _answer(10, 4).coordinators[0]  # FindCoordinator v4: Node.noNode()
    assert (coordinator.node_id, coordinator.port, coordinator.host) == (-1, -1, "")
    coordinator = _answer(10, 2)  # v2: one coordinator at the top level
    assert (coordinator.node_id, coordinator.port) == (-1, -1)
    produced = _answer(0, 9, acks=1)
    partition = produced.responses[0].partition_responses[0]
    assert (partition.base_offset, partition.log_append_time, partition.log_start_offset) == (-1, None, -1)
    assert produced.throttle_time == datetime.timedelta(0)
    fetched = _answer(1, 12).responses[0].partitions[0]
    assert (fetched.high_watermark, fetched.last_stable_offset, fetched.log_start_offset) == (-1, -1, -1)
    listed = _answer(2, 7).topics[0].partitions[0]
    assert (listed.offset, listed.timestamp, listed.leader_epoch) == (-1, -1, -1)
    assert _answer(11, 5).generation_id == -1  # JoinGroup
    committed = _answer(9, 8).groups[0].topics[0].partitions[0]  # OffsetFetch v8
    assert (committed.committed_offset, committed.committed_leader_epoch) == (-1, -1)
    producer = _answer(22, 4)  # InitProducerId
    assert (producer.producer_id, producer.producer_epoch) == (-1, -1)


def test_a_failed_describe_user_scram_credentials_sets_only_the_top_level_error():
    """Kafka's DescribeUserScramCredentialsRequest.getErrorResponse: the top-level code and ApiError's message
    (UNKNOWN_SERVER_ERROR's own for an unexpected failure), no per-user results (not one per user named)."""
    codec = codec_for(50, 0)
    module = __import__(codec.request_type.__module__, fromlist=["x"])
    body = codec.request_type(users=(module.UserName(name="alice"), module.UserName(name="bob")))
    answer, code = error_response(_request(50, 0, body))
    assert code == ErrorCode.unknown_server_error
    assert (answer.error_code, answer.results) == (ErrorCode.unknown_server_error, ())
    assert answer.error_message == "The server experienced an unexpected error when processing the request."
    b"".join(encode_response(codec, 11, answer))  # encodable

"""Framing, request headers, the support matrix and response headers, with no broker running."""

import io
import struct

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from pykbroker.protocol.apis import SUPPORTED_APIS, apis_for, codec_for
from pykbroker.protocol.framing import FrameError, UnsupportedRequest, decode_request, encode_response, read_prefix
from pykbroker.server.dispatch import load_handlers
from pykbroker.server.handlers.api_versions import unsupported_api_versions_response


def _request_frame(api_key: int, version: int, body, correlation_id: int = 7, client_id: str = "test") -> bytes:
    schema = load_request_schema(api_key, version)
    header_type = schema.__header_schema__
    out = io.BytesIO()
    entity_writer(header_type)(
        out, header_type(request_api_key=api_key, request_api_version=version, correlation_id=correlation_id, client_id=client_id)
    )
    entity_writer(schema)(out, body)
    return out.getvalue()


def test_matrix_matches_the_issue_ranges():
    expected = {0: (3, 11), 1: (4, 16), 2: (1, 9), 3: (0, 12), 8: (2, 9), 9: (1, 9), 10: (0, 6), 18: (0, 4),
                19: (2, 7), 20: (1, 6), 22: (0, 5), 23: (2, 4), 28: (0, 3), 32: (1, 4), 37: (0, 3), 60: (0, 1),
                11: (0, 9), 12: (0, 4), 13: (0, 5), 14: (0, 5), 15: (0, 5), 16: (0, 5), 42: (0, 2), 47: (0, 0),
                21: (0, 2), 35: (1, 4), 43: (0, 2), 61: (0, 0), 75: (0, 0), 33: (0, 2), 44: (0, 1),
                45: (0, 0), 46: (0, 0), 27: (1, 1), 50: (0, 0), 51: (0, 0),
                24: (0, 4), 25: (0, 3), 26: (0, 3), 65: (0, 0), 66: (0, 0),  # the transaction coordinator
                29: (1, 3), 30: (1, 3), 31: (1, 3),  # ACLs (Kafka 3.7.1 also has v0; kio's codecs start at v1)
                48: (0, 1), 49: (0, 1),  # client quotas (KIP-546)
                17: (0, 1), 36: (0, 2),  # SASL (Kafka 3.7.1's ranges)
                68: (0, 1), 69: (0, 1)}  # the consumer group protocol (KIP-848, Kafka 4's ranges)
    assert {k: (a.min_version, a.max_version) for k, a in apis_for(cluster=False).items()} == expected
    # A cluster member also serves the controller's requests (the versions Kafka 3.7's controller sends),
    # ControlledShutdown and AlterPartition (brokers to the controller).
    cluster_only = {4: (7, 7), 5: (4, 4), 6: (8, 8), 7: (3, 3), 56: (3, 3)}
    assert {k: (a.min_version, a.max_version) for k, a in apis_for(cluster=True).items()} == {**expected, **cluster_only}


def test_every_advertised_api_has_a_handler_and_codecs_for_every_version():
    handlers = load_handlers()
    assert set(handlers) == set(SUPPORTED_APIS)
    for api in SUPPORTED_APIS.values():
        for version in range(api.min_version, api.max_version + 1):
            codec = codec_for(api.key, version)
            assert codec.request_type.__version__ == version


def test_metadata_request_round_trips_through_decode():
    schema = load_request_schema(3, 12)
    body = schema(topics=None, allow_auto_topic_creation=True, include_topic_authorized_operations=False)
    frame = _request_frame(3, 12, body, correlation_id=99, client_id="abc")
    prefix = read_prefix(frame)
    assert (prefix.api_key, prefix.api_version, prefix.correlation_id) == (3, 12, 99)
    request = decode_request(frame, prefix)
    assert request.client_id == "abc"
    assert request.body == body


def test_unknown_api_key_and_version_are_unsupported():
    with pytest.raises(UnsupportedRequest):
        decode_request(struct.pack(">hhi", 999, 0, 1) + b"\x00\x00", read_prefix(struct.pack(">hhi", 999, 0, 1)))
    frame = struct.pack(">hhih", 3, 13, 1, -1)
    with pytest.raises(UnsupportedRequest):
        decode_request(frame, read_prefix(frame))


def test_truncated_request_is_a_frame_error_but_trailing_bytes_are_ignored():
    schema = load_request_schema(3, 12)
    body = schema(topics=None, allow_auto_topic_creation=True, include_topic_authorized_operations=False)
    frame = _request_frame(3, 12, body)
    with pytest.raises(FrameError):
        decode_request(frame[:-2], read_prefix(frame))
    with pytest.raises(FrameError):
        read_prefix(b"\x00\x03")
    # librdkafka's all-topics Metadata v12 leaves three zero bytes after the body; Kafka answers it.
    assert decode_request(frame + b"\x00\x00\x00", read_prefix(frame)).body == body


@pytest.mark.parametrize("api_key,version,flexible", [(18, 3, False), (18, 0, False), (3, 12, True), (3, 8, False)])
def test_response_header_versions(api_key, version, flexible):
    codec = codec_for(api_key, version)
    assert codec.flexible_response_header is flexible


def test_encoded_response_decodes_with_kio():
    import datetime

    from kio.schema.errors import ErrorCode

    codec = codec_for(60, 1)
    schema = load_response_schema(60, 1)
    body = schema(
        throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, error_message=None, endpoint_type=1,
        cluster_id="c", controller_id=1, brokers=(), cluster_authorized_operations=-(2**31),
    )
    frame = b"".join(encode_response(codec, 42, body))
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    header, used = entity_reader(schema.__header_schema__)(frame, 4)
    assert header.correlation_id == 42
    decoded, n = entity_reader(schema)(frame, 4 + used)
    assert decoded == body and 4 + used + n == len(frame)


def test_unsupported_api_versions_answer_is_v0_with_error_35():
    frame = unsupported_api_versions_response(5)
    size, correlation_id, error, count, key, low, high = struct.unpack(">iihihhh", frame)
    assert (size, correlation_id, error, count, key) == (len(frame) - 4, 5, 35, 1, 18)
    assert (low, high) == (0, 4)

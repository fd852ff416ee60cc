"""Codecs for the ZooKeeper-mode inter-broker APIs that kio 0.6.5 lacks: LeaderAndIsr (4),
StopReplica (5), UpdateMetadata (6) and ControlledShutdown (7), every version Kafka 3.7 has.

The entity modules under this package (leader_and_isr/v7/request.py, ...) are generated from Kafka's
JSON message specs in protocol_specs/messages/ by scripts/generate_interbroker_codecs.py, in the same
representation as kio's own schemas, so kio's reader and writer (`kio.serial.entity_reader` /
`entity_writer`) decode and encode them. Only this file is written by hand.

These APIs are NOT in the client-facing support matrix (protocol_specs/api_support.json) and are not
advertised in ApiVersions: brokers of the cluster speak them to each other. Both directions are here:
the controller writes requests and reads responses, a broker reads requests and writes responses.

    codec = codec_for(4, 7)                   # LeaderAndIsr v7
    header, body = decode_request(frame)       # frame: bytes after the 4-byte size prefix
    frame = encode_request(body, correlation_id=1, client_id="1")   # with size prefix
    header, body = decode_response(4, 7, frame_without_size)
    codec.api_codec()                           # an apis.ApiCodec, for the server's dispatcher
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from functools import lru_cache
from importlib import import_module
from typing import Any, Callable

from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from pykbroker.protocol.guard import compile_entity_check
from pykbroker.protocol.interbroker._index import APIS, KAFKA_VERSION, ApiEntry

__all__ = ("APIS", "KAFKA_VERSION", "ApiEntry", "InterBrokerCodec", "UnknownInterBrokerApi", "codec_for",
           "decode_request", "decode_response", "encode_request", "encode_response", "load_request_schema",
           "load_response_schema")

LEADER_AND_ISR = 4
STOP_REPLICA = 5
UPDATE_METADATA = 6
CONTROLLED_SHUTDOWN = 7

# LeaderAndIsr v5+ `type_` and UpdateMetadata v8 tagged `type_` (KIP-866, ZooKeeper-to-KRaft migration):
# a ZooKeeper-mode controller always sends 0; KRaft controllers in migration send 1 or 2.
REQUEST_TYPE_UNKNOWN = 0
REQUEST_TYPE_INCREMENTAL = 1
REQUEST_TYPE_FULL = 2

_SIZE = struct.Struct(">i")
_PREFIX = struct.Struct(">hh")


class UnknownInterBrokerApi(LookupError):
    """An api key or version this package has no schema for."""


class TrailingBytes(ValueError):
    """A frame decoded but left bytes behind: the wrong schema, or a corrupt frame."""


def _entry(api_key: int, version: int) -> ApiEntry:
    entry = APIS.get(api_key)
    if entry is None or not entry.min_version <= version <= entry.max_version:
        raise UnknownInterBrokerApi(f"no inter-broker schema for api key {api_key} v{version}")
    return entry


def load_request_schema(api_key: int, version: int) -> type:
    entry = _entry(api_key, version)
    module = import_module(f"{__name__}.{entry.package}.v{version}.request")
    return getattr(module, entry.request_class)


def load_response_schema(api_key: int, version: int) -> type:
    entry = _entry(api_key, version)
    module = import_module(f"{__name__}.{entry.package}.v{version}.response")
    return getattr(module, entry.response_class)


@dataclass(frozen=True, slots=True)
class InterBrokerCodec:
    """Readers and writers of one API version, both directions, built once and cached."""

    api_key: int
    version: int
    name: str
    request_type: type
    response_type: type
    request_header_type: type
    response_header_type: type
    read_request_header: Callable[[Any, int], tuple[Any, int]]
    read_request_body: Callable[[Any, int], tuple[Any, int]]
    write_request_header: Callable[[Any, Any], None]
    write_request_body: Callable[[Any, Any], None]
    read_response_header: Callable[[Any, int], tuple[Any, int]]
    read_response_body: Callable[[Any, int], tuple[Any, int]]
    write_response_header: Callable[[Any, Any], None]
    write_response_body: Callable[[Any, Any], None]
    # The frame guard (protocol/guard.py) of each body, run before kio's reader: kio reserves memory for
    # any array count it reads, so one hostile count would abort the process. check(frame, body_start)
    # -> end of the body, or MalformedRequest.
    check_request_body: Callable[[Any, int], int]
    check_response_body: Callable[[Any, int], int]

    @property
    def flexible(self) -> bool:
        return self.request_type.__flexible__

    def api_codec(self):
        """The same codec as pykbroker.protocol.apis.ApiCodec, for the server's request dispatcher."""
        from pykbroker.protocol.apis import ApiCodec

        return ApiCodec(
            api_key=self.api_key,
            version=self.version,
            request_type=self.request_type,
            response_type=self.response_type,
            read_request_header=self.read_request_header,
            read_request_body=self.read_request_body,
            write_response_body=self.write_response_body,
            flexible_response_header=self.response_header_type.__flexible__,
            check_request_body=self.check_request_body,
        )

    def request_header(self, correlation_id: int, client_id: str | None) -> Any:
        """A request header of the version this API version uses (v0 has no client id)."""
        fields = {"request_api_key": i16(self.api_key), "request_api_version": i16(self.version),
                  "correlation_id": i32(correlation_id)}
        if "client_id" in self.request_header_type.__dataclass_fields__:
            fields["client_id"] = client_id
        return self.request_header_type(**fields)

    def response_header(self, correlation_id: int) -> Any:
        return self.response_header_type(correlation_id=i32(correlation_id))


@lru_cache(maxsize=None)
def codec_for(api_key: int, version: int) -> InterBrokerCodec:
    """The codec of LeaderAndIsr / StopReplica / UpdateMetadata / ControlledShutdown `version`;
    UnknownInterBrokerApi for any other key or a version Kafka 3.7 does not have."""
    request_type = load_request_schema(api_key, version)
    response_type = load_response_schema(api_key, version)
    request_header = request_type.__header_schema__
    response_header = response_type.__header_schema__
    return InterBrokerCodec(
        api_key=api_key,
        version=version,
        name=APIS[api_key].name,
        request_type=request_type,
        response_type=response_type,
        request_header_type=request_header,
        response_header_type=response_header,
        read_request_header=entity_reader(request_header),
        read_request_body=entity_reader(request_type),
        write_request_header=entity_writer(request_header),
        write_request_body=entity_writer(request_type),
        read_response_header=entity_reader(response_header),
        read_response_body=entity_reader(response_type),
        write_response_header=entity_writer(response_header),
        write_response_body=entity_writer(response_type),
        # No element budget (MAX_REQUEST_ELEMENTS is for clients' requests): the controller's
        # UpdateMetadata names every partition of the cluster with its replicas and ISR, 1.4 million
        # elements for 200,000 partitions. Every count is still bounded by the bytes left in the frame.
        check_request_body=compile_entity_check(request_type, max_elements=None),
        check_response_body=compile_entity_check(response_type, max_elements=None),
    )


def _check_consumed(frame, used: int, what: str) -> None:
    if used != len(frame):
        raise TrailingBytes(f"{what}: {len(frame) - used} bytes left after the body")


def decode_request(frame, *, strict: bool = True) -> tuple[Any, Any]:
    """(header, body) of a request frame given without its 4-byte size prefix; MalformedRequest
    (protocol/guard.py) when a length or count in the body does not fit the frame."""
    if len(frame) < _PREFIX.size:
        raise ValueError(f"frame of {len(frame)} bytes is too short for a request header")
    api_key, version = _PREFIX.unpack_from(frame, 0)
    codec = codec_for(api_key, version)
    header, header_size = codec.read_request_header(frame, 0)  # no arrays; kio bounds-checks its strings
    codec.check_request_body(frame, header_size)  # MalformedRequest before kio reserves anything
    body, body_size = codec.read_request_body(frame, header_size)  # kio readers return sizes
    if strict:
        _check_consumed(frame, header_size + body_size, f"{codec.name} v{version} request")
    return header, body


def decode_response(api_key: int, version: int, frame, *, strict: bool = True) -> tuple[Any, Any]:
    """(header, body) of a response frame without its size prefix; the api key and version are the
    request's (a response does not carry them). MalformedRequest as for decode_request."""
    codec = codec_for(api_key, version)
    header, header_size = codec.read_response_header(frame, 0)
    codec.check_response_body(frame, header_size)
    body, body_size = codec.read_response_body(frame, header_size)
    if strict:
        _check_consumed(frame, header_size + body_size, f"{codec.name} v{version} response")
    return header, body


def _framed(write: Callable[[io.BytesIO], None], size_prefix: bool) -> bytes:
    out = io.BytesIO()
    if size_prefix:
        out.write(b"\x00\x00\x00\x00")
    write(out)
    data = bytearray(out.getvalue())
    if size_prefix:
        _SIZE.pack_into(data, 0, len(data) - 4)
    return bytes(data)


def encode_request(body: Any, *, correlation_id: int | None = None, client_id: str | None = None,
                   header: Any = None, size_prefix: bool = True) -> bytes:
    """A request frame: header (built from correlation_id/client_id, or given) + body."""
    codec = codec_for(int(body.__api_key__), int(body.__version__))
    if header is None:
        if correlation_id is None:
            raise TypeError("give a header or a correlation_id")
        header = codec.request_header(correlation_id, client_id)

    def write(out: io.BytesIO) -> None:
        codec.write_request_header(out, header)
        codec.write_request_body(out, body)

    return _framed(write, size_prefix)


def encode_response(body: Any, *, correlation_id: int | None = None, header: Any = None,
                    size_prefix: bool = True) -> bytes:
    """A response frame: response header v0 (non-flexible) or v1 (flexible) + body."""
    codec = codec_for(int(body.__api_key__), int(body.__version__))
    if header is None:
        if correlation_id is None:
            raise TypeError("give a header or a correlation_id")
        header = codec.response_header(correlation_id)

    def write(out: io.BytesIO) -> None:
        codec.write_response_header(out, header)
        codec.write_response_body(out, body)

    return _framed(write, size_prefix)

"""Size-prefixed frames, request headers and response headers.

A request frame is `int32 size` + header + body. The header starts with api_key, api_version and
correlation_id in every version, so those are read first by hand: they decide which header version and
body schema apply, and they let us answer (or log) even when the rest cannot be decoded.

A response is encoded into pieces: bytes, and the body's Deferred values (a Fetch's record data left in
the segment files) kept by reference with their length counted, so that the record data is read only
when the connection writes it, chunk by chunk as the socket drains, and never copied into the frame.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Protocol, Union

from pykbroker.protocol.apis import SUPPORTED_APIS, ApiCodec, ApiSupport, codec_for

SIZE = struct.Struct(">i")
_HEADER_PREFIX = struct.Struct(">hhi")
_CORRELATION = struct.Struct(">i")


class FrameError(ValueError):
    """The bytes cannot be a valid request: the connection must be closed."""


class UnsupportedRequest(FrameError):
    """An api key or version the broker does not implement (other than ApiVersions)."""


@dataclass(frozen=True, slots=True)
class RequestPrefix:
    api_key: int
    api_version: int
    correlation_id: int


@dataclass(slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header: Any
    body: Any
    codec: ApiCodec


def read_prefix(frame) -> RequestPrefix:
    if len(frame) < _HEADER_PREFIX.size:
        raise FrameError(f"frame of {len(frame)} bytes is too short for a request header")
    return RequestPrefix(*_HEADER_PREFIX.unpack_from(frame, 0))


def frame_api_key(buffer, start: int, size: int) -> int | None:
    """The api key of the request frame of ``size`` bytes at ``start`` of ``buffer`` (after its size field),
    without copying it; None for a frame too short to be a request (read_prefix refuses it)."""
    if size < _HEADER_PREFIX.size:
        return None
    return _HEADER_PREFIX.unpack_from(buffer, start)[0]


def decode_request(frame, prefix: RequestPrefix, apis: Mapping[int, ApiSupport] = SUPPORTED_APIS) -> Request:
    """Decode header and body of a request ``apis`` supports; raises FrameError/UnsupportedRequest otherwise."""
    support = apis.get(prefix.api_key)
    if support is None:
        raise UnsupportedRequest(f"unknown api key {prefix.api_key}")
    if not support.supports(prefix.api_version):
        raise UnsupportedRequest(
            f"{support.name} v{prefix.api_version} is outside the supported range "
            f"{support.min_version}-{support.max_version}"
        )
    codec = codec_for(prefix.api_key, prefix.api_version)
    try:
        # The header holds no arrays, and kio bounds-checks its strings; the body's lengths and counts are
        # checked by the guard first, since kio's native reader reserves memory for any array count it reads.
        header, position = codec.read_request_header(frame, 0)
        codec.check_request_body(frame, position)
        body, used = codec.read_request_body(frame, position)
    except Exception as exc:  # the guard and kio raise assorted errors on truncated or garbled input
        raise FrameError(f"cannot decode {support.name} v{prefix.api_version}: {exc!r}") from exc
    # Bytes after the body are ignored, as Kafka ignores them: librdkafka's Metadata request for all
    # topics reserves a 4-byte array count and leaves three zero bytes behind after writing the null marker.
    return Request(
        prefix.api_key, prefix.api_version, prefix.correlation_id, header.client_id, header, body, codec
    )


class Deferred(Protocol):
    """Response bytes that are produced only as the socket drains (a Fetch's record data, still in the
    segment files): the encoder needs their length, the connection asks for them chunk by chunk."""

    def __len__(self) -> int: ...

    def chunks(self, size: int) -> Iterator[bytes]: ...


Piece = Union[bytearray, Deferred]


class _Pieces:
    """What kio writes into: plain bytes gather in one bytearray, a Deferred value is kept by reference."""

    def __init__(self) -> None:
        self.pieces: list[Piece] = [bytearray()]

    def write(self, data: Any) -> None:
        if isinstance(data, (bytes, bytearray, memoryview)):
            self.pieces[-1] += data
        else:
            self.pieces += (data, bytearray())


def encode_response(codec: ApiCodec, correlation_id: int, body: Any) -> list[Piece]:
    """Size prefix + response header (v0, or v1 with an empty tagged-field section) + body, as pieces to
    write in order: bytes, and the Deferred values of the body (record data) where they go."""
    out = _Pieces()
    out.write(b"\x00\x00\x00\x00")
    out.write(_CORRELATION.pack(correlation_id))
    if codec.flexible_response_header:
        out.write(b"\x00")
    codec.write_response_body(out, body)
    pieces = [piece for piece in out.pieces if len(piece)]
    SIZE.pack_into(pieces[0], 0, sum(len(piece) for piece in pieces) - SIZE.size)
    return pieces

"""Bounded decompression of record-batch payloads, for validation and for reading internal topics.

The broker stores what producers send as it is; it decompresses a batch only to check that its records
agree with its header (count, offset deltas, lengths, timestamps), as Kafka's LogValidator does. Every
codec here stops once the output would pass ``limit`` bytes and raises ``DecompressionError``, so a small
"zip bomb" batch cannot make the broker allocate more than ``limit`` (+1) bytes.

Codecs (the batch attributes' low three bits):
- 1 gzip: one or more gzip members (zlib, standard library).
- 2 snappy: the xerial framing the Java client writes (magic ``\\x82SNAPPY\\x00``, two int32 versions,
  then int32-length-prefixed raw snappy blocks), or one raw snappy block (what librdkafka writes; Kafka's
  xerial reader falls back to raw too). A raw block states its uncompressed length up front, which is
  checked against the bound before anything is allocated (cramjam).
- 3 lz4: the LZ4 frame format (Kafka's KafkaLZ4BlockOutputStream for magic v2 writes standard frames).
- 4 zstd: one or more zstd frames (zstandard), fed in slices so that the output bound holds.
Codecs 5-7 do not exist: ``UnknownCodec``.
"""

from __future__ import annotations

import struct
import zlib

import cramjam
import lz4.frame
import zstandard

GZIP, SNAPPY, LZ4, ZSTD = 1, 2, 3, 4

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16  # magic, int32 version, int32 minimum compatible version
_INT32 = struct.Struct(">i")
_ZSTD_SLICE = 4096


class DecompressionError(ValueError):
    """The payload is not valid data for its codec, is truncated, or decompresses past the bound."""


class UnknownCodec(DecompressionError):
    """The batch names a compression codec that Kafka does not define (5, 6 or 7)."""


def _too_large(limit: int) -> DecompressionError:
    return DecompressionError(f"decompresses to more than {limit} bytes")


def _gzip(data: bytes, limit: int) -> bytes:
    out = bytearray()
    while data:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            out += inflater.decompress(data, limit + 1 - len(out))
        except zlib.error as exc:
            raise DecompressionError(f"gzip: {exc}") from None
        if len(out) > limit:
            raise _too_large(limit)
        if not inflater.eof:
            if inflater.unconsumed_tail:  # output stopped at the bound with input left over
                raise _too_large(limit)
            raise DecompressionError("gzip: truncated stream")
        data = inflater.unused_data
    return bytes(out)


def _snappy_block(block, limit: int) -> bytes:
    try:
        size = cramjam.snappy.decompress_raw_len(block)
        if size > limit:
            raise _too_large(limit)
        return bytes(cramjam.snappy.decompress_raw(block))
    except cramjam.DecompressionError as exc:
        raise DecompressionError(f"snappy: {exc}") from None


def _snappy(data: bytes, limit: int) -> bytes:
    if not data.startswith(XERIAL_MAGIC):
        return _snappy_block(data, limit)
    view = memoryview(data)
    out = bytearray()
    pos = _XERIAL_HEADER_SIZE
    if len(data) < pos:
        raise DecompressionError("snappy: truncated xerial header")
    while pos < len(data):
        if pos + 4 > len(data):
            raise DecompressionError("snappy: truncated xerial block length")
        (length,) = _INT32.unpack_from(data, pos)
        pos += 4
        if length < 0 or pos + length > len(data):
            raise DecompressionError(f"snappy: xerial block of {length} bytes runs past the payload")
        out += _snappy_block(view[pos : pos + length], limit - len(out))
        pos += length
    return bytes(out)


def _lz4(data: bytes, limit: int) -> bytes:
    decompressor = lz4.frame.LZ4FrameDecompressor()
    try:
        out = decompressor.decompress(data, max_length=limit + 1)
    except RuntimeError as exc:  # python-lz4 reports malformed frames as RuntimeError
        raise DecompressionError(f"lz4: {exc}") from None
    if len(out) > limit:
        raise _too_large(limit)
    if not decompressor.eof:
        raise DecompressionError("lz4: truncated frame")
    if decompressor.unused_data:
        raise DecompressionError("lz4: bytes after the end of the frame")
    return out


def _zstd(data: bytes, limit: int) -> bytes:
    # zstandard's decompressobj has no output bound, so input goes in small slices and the output is
    # checked after each: one slice can inflate to at most ~256 times its size (RLE blocks).
    out = bytearray()
    view = memoryview(data)
    while view:
        decompressor = zstandard.ZstdDecompressor().decompressobj()
        try:
            while view and not decompressor.eof:
                out += decompressor.decompress(view[:_ZSTD_SLICE])
                view = view[_ZSTD_SLICE:]
                if len(out) > limit:
                    raise _too_large(limit)
        except zstandard.ZstdError as exc:
            raise DecompressionError(f"zstd: {exc}") from None
        if not decompressor.eof:
            raise DecompressionError("zstd: truncated frame")
        if decompressor.unused_data:  # the next frame began inside the last slice
            view = memoryview(decompressor.unused_data + view.tobytes())
    return bytes(out)


_CODECS = {GZIP: _gzip, SNAPPY: _snappy, LZ4: _lz4, ZSTD: _zstd}


def decompress(codec: int, data, limit: int) -> bytes:
    """The uncompressed bytes of ``data`` under ``codec`` (1-4); raises DecompressionError past ``limit``."""
    function = _CODECS.get(codec)
    if function is None:
        raise UnknownCodec(f"unknown compression codec {codec}")
    return function(bytes(data), limit)


def compress(codec: int, data) -> bytes:
    """Compress ``data`` the way Kafka's Java client frames it (tests and tools build batches with it)."""
    data = bytes(data)
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == SNAPPY:
        block = bytes(cramjam.snappy.compress_raw(data))
        return XERIAL_MAGIC + _INT32.pack(1) + _INT32.pack(1) + _INT32.pack(len(block)) + block
    if codec == LZ4:
        return lz4.frame.compress(data)
    if codec == ZSTD:
        return zstandard.ZstdCompressor().compress(data)
    raise UnknownCodec(f"unknown compression codec {codec}")

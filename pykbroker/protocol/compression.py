"""Bounded decompression of record-batch payloads, for validation and for reading internal topics.

The broker stores what producers send as it is; it decompresses a batch only to check that its records
agree with its header (count, offset deltas, lengths, timestamps), as Kafka's LogValidator does. Every
codec here stops once the output would pass ``limit`` bytes and raises ``DecompressionError``, so a small
"zip bomb" batch cannot make the broker allocate more than ``limit`` (+1) bytes. Input is walked by
position, never re-sliced by copying, and the number of concatenated frames, members or blocks is bounded,
so the work is linear in the payload and a batch of thousands of tiny frames is refused, not spun on.

Codecs (the batch attributes' low three bits):
- 1 gzip: one or more gzip members (zlib, standard library), at most MAX_FRAMES.
- 2 snappy: the xerial framing the Java client writes (magic ``\\x82SNAPPY\\x00``, two int32 versions,
  then int32-length-prefixed raw snappy blocks, at most MAX_XERIAL_BLOCKS), or one raw snappy block (what
  librdkafka writes; Kafka's xerial reader falls back to raw too). A raw block states its uncompressed
  length up front, which is checked against the bound before anything is allocated (cramjam).
- 3 lz4: the LZ4 frame format (Kafka's KafkaLZ4BlockOutputStream for magic v2 writes standard frames).
- 4 zstd: one or more zstd frames (zstandard), at most MAX_FRAMES, fed in slices so that the output bound
  holds.
Codecs 5-7 do not exist: ``UnknownCodec``.
"""

from __future__ import annotations

import struct
import threading
import zlib
from typing import Any, Callable

import cramjam
import lz4.frame
import zstandard

GZIP, SNAPPY, LZ4, ZSTD = 1, 2, 3, 4

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16  # magic, int32 version, int32 minimum compatible version
_INT32 = struct.Struct(">i")
_SLICE = 4096  # compressed bytes fed to gzip and zstd at a time
# Producers write one gzip member or zstd frame per batch (the Java client and librdkafka alike); Kafka's
# readers accept concatenated ones, and so does this module, up to this many. Without a bound a 1 MB batch
# of empty 9-byte zstd frames is 115,000 frames: seconds of the event loop for nothing.
MAX_FRAMES = 1000
# Xerial blocks hold 32 KiB of input each (snappy-java's default block size): 4096 of them are twice the
# 64 MiB the validator lets a batch inflate to. Empty blocks are otherwise ~200,000 a megabyte.
MAX_XERIAL_BLOCKS = 4096
_LZ4_STEP = 1 << 20  # most output asked of the lz4 decompressor at a time
_ZSTD_SHARED_WINDOW = 8 << 20  # frames declaring a larger window are decompressed with a context of their own
_thread_state = threading.local()  # each thread's zstd decompression context


class DecompressionError(ValueError):
    """The payload is not valid data for its codec, is truncated, or decompresses past the bound."""


class UnknownCodec(DecompressionError):
    """The batch names a compression codec that Kafka does not define (5, 6 or 7)."""


def _too_large(limit: int) -> DecompressionError:
    return DecompressionError(f"decompresses to more than {limit} bytes")


def _too_many_frames(codec: str, what: str) -> DecompressionError:
    limit = MAX_XERIAL_BLOCKS if codec == "snappy" else MAX_FRAMES
    return DecompressionError(f"{codec}: more than {limit} concatenated {what}")


def _concatenated(data: bytes, limit: int, codec: str, unit: str, start: Callable[[], Any],
                  feed: Callable[[Any, memoryview, int], bytes], error: type[Exception]) -> bytes:
    """Decode up to MAX_FRAMES concatenated gzip members or zstd frames, walking by position.

    Each ``unit`` is fed in slices of _SLICE bytes from its start (``feed(decoder, piece, room)``, where
    ``room`` is how much more output the bound allows); where it ends inside a slice, the decoder holds the
    rest in ``unused_data`` and the next one starts there. Feeding the whole rest at once instead would
    copy it into ``unused_data`` again after every unit: quadratic in the number of units.
    """
    out = bytearray()
    view = memoryview(data)
    position, end, units = 0, len(data), 0
    while position < end:
        units += 1
        if units > MAX_FRAMES:
            raise _too_many_frames(codec, unit + "s")
        decoder = start()
        try:
            while not decoder.eof:
                if position >= end:
                    raise DecompressionError(f"{codec}: truncated {unit}")
                piece = view[position : position + _SLICE]
                out += feed(decoder, piece, limit + 1 - len(out))
                position += len(piece)
                if len(out) > limit:  # (zlib stops at limit + 1, with input left over)
                    raise _too_large(limit)
        except error as exc:
            raise DecompressionError(f"{codec}: {exc}") from None
        position -= len(decoder.unused_data)
    return bytes(out)


def _gzip(data: bytes, limit: int) -> bytes:
    return _concatenated(data, limit, "gzip", "member", lambda: zlib.decompressobj(wbits=16 + zlib.MAX_WBITS),
                         lambda inflater, piece, room: inflater.decompress(piece, room), zlib.error)


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
    blocks = 0
    while pos < len(data):
        blocks += 1
        if blocks > MAX_XERIAL_BLOCKS:
            raise _too_many_frames("snappy", "xerial blocks")
        if pos + 4 > len(data):
            raise DecompressionError("snappy: truncated xerial block length")
        (length,) = _INT32.unpack_from(data, pos)
        pos += 4
        if length < 0 or pos + length > len(data):
            raise DecompressionError(f"snappy: xerial block of {length} bytes runs past the payload")
        out += _snappy_block(view[pos : pos + length], limit - len(out))
        pos += length
    return bytes(out)


_LZ4_MAGIC = b"\x04\x22\x4d\x18"  # 0x184D2204, little-endian
_LZ4_BLOCK_INDEPENDENT = 0x20  # the frame descriptor's FLG bit


def lz4_blocks_linked(data) -> bool:
    """Whether an lz4 frame declares linked (dependent) blocks, which Kafka's reader refuses ("Dependent block
    stream is unsupported"): a Java consumer cannot read such a batch. False when ``data`` is not an lz4 frame
    (decompression reports that)."""
    return len(data) >= 5 and bytes(data[:4]) == _LZ4_MAGIC and not data[4] & _LZ4_BLOCK_INDEPENDENT


def _lz4(data: bytes, limit: int) -> bytes:
    # The output is asked for in pieces: python-lz4 allocates max_length bytes up front, and asking for
    # limit + 1 (64 MiB) at once costs an mmap, page faults and an munmap per batch (~25 us, 30 times the
    # decompression of a 28 KB batch). The first piece is _LZ4_STEP or 4 times the input, then each piece as big
    # as all before it (python-lz4 copies the input left at each call: pieces of a fixed size made a 60 MiB
    # incompressible frame quadratic, 0.8 s). A bomb still stops at limit + 1 bytes.
    decompressor = lz4.frame.LZ4FrameDecompressor()
    room = limit + 1
    pieces = []
    step = max(_LZ4_STEP, 4 * len(data))
    produced = 0
    try:
        piece = decompressor.decompress(data, max_length=min(room, step))
        while True:
            pieces.append(piece)
            room -= len(piece)
            produced += len(piece)
            if room <= 0 or decompressor.eof or decompressor.needs_input or not piece:
                break
            step = max(step, produced)
            piece = decompressor.decompress(b"", max_length=min(room, step))
    except RuntimeError as exc:  # python-lz4 reports malformed frames as RuntimeError
        raise DecompressionError(f"lz4: {exc}") from None
    if room <= 0:
        raise _too_large(limit)
    if not decompressor.eof:
        raise DecompressionError("lz4: truncated frame")
    if decompressor.unused_data:
        raise DecompressionError("lz4: bytes after the end of the frame")
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _zstd(data: bytes, limit: int) -> bytes:
    # zstandard's decompressobj has no output bound, so input goes in small slices and the output is
    # checked after each: one slice can inflate to at most ~256 times its size (RLE blocks).
    # One context for all frames, used by one frame at a time (decompressobj resets it), kept per thread:
    # making one takes ~9 us, the decompression of a small batch less. (An instance of whatever
    # zstandard.ZstdDecompressor is now: tests replace the class to count the decompressor's calls.)
    # A frame declaring a window over _ZSTD_SHARED_WINDOW gets a context of its own: the shared one would keep
    # that window's buffer for the thread's life (a producer's zstd frames use a few MiB at most).
    context = getattr(_thread_state, "zstd", None)
    if not isinstance(context, zstandard.ZstdDecompressor):
        context = _thread_state.zstd = zstandard.ZstdDecompressor()
    try:
        if zstandard.get_frame_parameters(data).window_size > _ZSTD_SHARED_WINDOW:
            context = zstandard.ZstdDecompressor()
    except zstandard.ZstdError:
        pass  # not a frame header: the decompression below says what is wrong
    return _concatenated(data, limit, "zstd", "frame", context.decompressobj,
                         lambda decompressor, piece, room: decompressor.decompress(piece), zstandard.ZstdError)


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
        # Independent 64 KiB blocks, as Kafka's Lz4BlockOutputStream writes them: its reader refuses a frame of
        # linked blocks ("Dependent block stream is unsupported"), which python-lz4 writes by default for
        # input over one block.
        return lz4.frame.compress(data, block_linked=False)
    if codec == ZSTD:
        return zstandard.ZstdCompressor().compress(data)
    raise UnknownCodec(f"unknown compression codec {codec}")

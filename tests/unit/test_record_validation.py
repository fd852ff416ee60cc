"""Record-batch validation as Kafka's LogValidator does it for client appends (pykbroker.protocol.records).

Every rule is checked through both record walkers, the C one (pykbroker._speedups, when built) and its
pure-Python twin; a seeded corpus of valid and mutated batches shows that the two agree exactly.
"""

from __future__ import annotations

import gzip
import random
import struct
import zlib

import pytest
import zstandard

from pykbroker.log.config import LogConfig
from pykbroker.protocol import compression, records
from pykbroker.protocol.records import (
    BATCH_HEADER_SIZE,
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    CorruptRecordBatch,
    InvalidRecords,
    RecordErrors,
    build_batch,
    crc32c,
    read_header,
    read_records,
    validate_batches,
    validate_client_records,
)

try:
    from pykbroker._speedups import scan_records as c_scan
except ImportError:  # pragma: no cover - depends on the build
    c_scan = None

CODECS = [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD]
CODEC_IDS = [records.CODEC_NAMES[c] for c in CODECS]
NOW = 1_700_000_000_000
WALKERS = [
    pytest.param(records._scan_records_py, id="python"),
    pytest.param(c_scan, id="c", marks=pytest.mark.skipif(c_scan is None, reason="C extension not built")),
]


@pytest.fixture(params=WALKERS)
def walker(request, monkeypatch):
    """Run the test with one record walker installed as the validator's."""
    monkeypatch.setattr(records, "scan_records", request.param)
    return request.param


def _records(n: int, size: int = 100) -> list[tuple[bytes, bytes]]:
    return [(b"key-%d" % i, bytes([65 + i % 26]) * size) for i in range(n)]


def _reframe(body: bytes, *, count: int, last_offset_delta: int, codec: int = COMPRESSION_NONE,
             attributes: int = 0, base_timestamp: int = NOW, producer_id: int = -1, base_sequence: int = -1) -> bytes:
    """A batch around ``body`` (already compressed if ``codec``) with whatever header it is told, and a
    valid CRC: the lying batches a buggy or hostile producer could send."""
    batch = bytearray(BATCH_HEADER_SIZE) + body
    struct.pack_into(">qiibIhiqqqhii", batch, 0, 0, len(batch) - 12, -1, 2, 0, attributes | codec, last_offset_delta,
                     base_timestamp, base_timestamp, producer_id, -1 if producer_id < 0 else 0, base_sequence, count)
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[21:]))
    return bytes(batch)


def _body(batch) -> bytes:
    return bytes(batch[BATCH_HEADER_SIZE:])


def _validate(buf, **kwargs) -> None:
    kwargs.setdefault("now_ms", NOW)
    validate_client_records(buf, validate_batches(buf), **kwargs)


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_valid_batches_pass_and_read_back(walker, codec):
    batch = build_batch(_records(50), timestamp_ms=NOW, compression=codec)
    _validate(batch)
    assert [r.value for r in read_records(batch, read_header(batch))] == [v for _, v in _records(50)]


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
@pytest.mark.parametrize(("held", "declared", "error"), [
    (3, 1, "bytes remain after the declared 1 records"),  # the batch, valid CRC
    (2, 3, "record 2: malformed varint"),
], ids=["more-held-than-declared", "fewer-held-than-declared"])
def test_a_batch_that_lies_about_its_record_count_is_refused(walker, codec, held, declared, error):
    body = _body(build_batch(_records(held)))
    if codec:
        body = compression.compress(codec, body)
    with pytest.raises(InvalidRecords, match=error):
        _validate(_reframe(body, count=declared, last_offset_delta=declared - 1, codec=codec))


def test_count_must_match_last_offset_delta_and_be_positive(walker):
    body = _body(build_batch(_records(3)))
    with pytest.raises(InvalidRecords, match="inconsistent batch offset range"):
        _validate(_reframe(body, count=3, last_offset_delta=5))
    with pytest.raises(InvalidRecords, match="invalid reported count"):
        _validate(_reframe(b"", count=0, last_offset_delta=-1 & 0x7FFFFFFF))


def test_offset_deltas_must_be_dense(walker):
    batch = bytearray(build_batch(_records(3, size=10)))
    # Record 1's offset delta varint sits after its length varint, attributes byte and timestamp delta.
    first_length = batch[BATCH_HEADER_SIZE] >> 1
    second = BATCH_HEADER_SIZE + 1 + first_length
    assert batch[second + 3] == 2  # zigzag(1)
    batch[second + 3] = 4  # zigzag(2)
    with pytest.raises(InvalidRecords, match="record 1: offset delta 2, expected 1"):
        _validate(_reframe(_body(batch), count=3, last_offset_delta=2))


def test_record_length_must_match_its_fields(walker):
    batch = bytearray(build_batch(_records(2)))
    batch[BATCH_HEADER_SIZE] += 2  # record 0 claims one byte more (zigzag +1)
    with pytest.raises(InvalidRecords, match="record 0: size .* does not match|record 1"):
        _validate(_reframe(_body(batch), count=2, last_offset_delta=1))


def test_negative_header_count_and_key_size_are_refused(walker):
    def record(headers: bytes) -> bytes:
        fields = b"\x00\x00\x00" + b"\x01" + b"\x01" + headers  # attrs, ts delta, offset delta, null key, null value
        return bytes([len(fields) << 1]) + fields

    with pytest.raises(InvalidRecords, match="invalid number of headers -1"):
        _validate(_reframe(record(b"\x01"), count=1, last_offset_delta=0))
    with pytest.raises(InvalidRecords, match="invalid negative header key size -1"):
        _validate(_reframe(record(b"\x02\x01\x01"), count=1, last_offset_delta=0))


def test_unknown_codec_and_undecompressable_payloads_are_refused(walker):
    body = _body(build_batch(_records(2)))
    with pytest.raises(InvalidRecords, match="unknown compression codec 5"):
        _validate(_reframe(body, count=2, last_offset_delta=1, codec=5))
    for codec in CODECS[1:]:
        with pytest.raises(InvalidRecords, match=records.CODEC_NAMES[codec]):
            _validate(_reframe(b"\x00not compressed at all" * 3, count=2, last_offset_delta=1, codec=codec))


@pytest.mark.parametrize("codec", CODECS[1:], ids=CODEC_IDS[1:])
def test_a_small_batch_that_inflates_past_the_bound_is_refused(codec):
    bomb = compression.compress(codec, bytes(8 * 1024 * 1024))
    assert len(bomb) < 600 * 1024
    with pytest.raises(InvalidRecords, match="decompresses to more than 1048576 bytes"):
        _validate(_reframe(bomb, count=1, last_offset_delta=0, codec=codec), max_decompressed_bytes=1 << 20)


def test_an_lz4_frame_of_linked_blocks_is_refused_as_kafka_does(walker):
    """Kafka's lz4 reader refuses frames whose blocks depend on each other (a Java consumer could not read
    them); python-lz4 writes them by default above one 64 KiB block. Independent blocks pass."""
    import lz4.frame

    body = _body(build_batch(_records(1000)))
    assert len(body) > 64 * 1024
    linked = lz4.frame.compress(body, block_linked=True)
    assert compression.lz4_blocks_linked(linked)
    with pytest.raises(InvalidRecords, match="Dependent block stream is unsupported"):
        _validate(_reframe(linked, count=1000, last_offset_delta=999, codec=COMPRESSION_LZ4))
    independent = compression.compress(COMPRESSION_LZ4, body)
    assert not compression.lz4_blocks_linked(independent)
    _validate(_reframe(independent, count=1000, last_offset_delta=999, codec=COMPRESSION_LZ4))


def test_truncated_compressed_payloads_are_refused():
    data = random.Random(7).randbytes(5000)
    for codec in CODECS[1:]:
        whole = compression.compress(codec, data)
        assert compression.decompress(codec, whole, 10_000) == data
        with pytest.raises(compression.DecompressionError):
            compression.decompress(codec, whole[: len(whole) - 7], 10_000)


def test_snappy_raw_blocks_and_xerial_frames_both_decode():
    data = b"librdkafka writes raw snappy, the Java client xerial frames " * 50
    import cramjam

    raw = bytes(cramjam.snappy.compress_raw(data))
    assert compression.decompress(COMPRESSION_SNAPPY, raw, 1 << 20) == data
    framed = compression.compress(COMPRESSION_SNAPPY, data)
    assert framed.startswith(compression.XERIAL_MAGIC)
    assert compression.decompress(COMPRESSION_SNAPPY, framed, 1 << 20) == data


def test_gzip_members_may_be_concatenated():
    one, two = b"a" * 100, b"b" * 50
    data = zlib.compress(one, wbits=31) + compression.compress(COMPRESSION_GZIP, two)
    assert compression.decompress(COMPRESSION_GZIP, data, 1000) == one + two


class _CountingCodecs:
    """Counts the calls into zlib's and zstandard's decompressors (the work a payload makes), whatever
    object the compression module builds around them."""

    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        counter = self

        class Counted:
            def __init__(self, inner) -> None:
                self._inner = inner

            def decompress(self, *args):
                counter.calls += 1
                return self._inner.decompress(*args)

            def __getattr__(self, name):
                return getattr(self._inner, name)

        real_zlib = zlib.decompressobj
        real_zstd = zstandard.ZstdDecompressor

        class CountingZstd:
            def decompressobj(self):
                return Counted(real_zstd().decompressobj())

        monkeypatch.setattr(zlib, "decompressobj", lambda *a, **k: Counted(real_zlib(*a, **k)))
        monkeypatch.setattr(zstandard, "ZstdDecompressor", CountingZstd)


def _empty_unit(codec: int) -> bytes:
    """The smallest member or frame a codec has: 20-byte empty gzip members, 9-byte empty zstd frames."""
    if codec == COMPRESSION_GZIP:
        return gzip.compress(b"", mtime=0)
    return zstandard.ZstdCompressor().compress(b"")


@pytest.mark.parametrize("codec", [COMPRESSION_GZIP, COMPRESSION_ZSTD], ids=["gzip", "zstd"])
def test_a_megabyte_of_empty_frames_is_refused_after_a_bounded_number_of_decompressor_calls(codec, monkeypatch):
    # Within the default max.message.bytes; before the bound, zstd spun 14 s and gzip 1 s of event loop on it.
    unit = _empty_unit(codec)
    bomb = _reframe(unit * (1_040_000 // len(unit)), count=1, last_offset_delta=0, codec=codec)
    assert len(bomb) <= LogConfig().max_message_bytes
    counting = _CountingCodecs(monkeypatch)
    with pytest.raises(InvalidRecords, match=f"more than {compression.MAX_FRAMES} concatenated"):
        _validate(bomb)
    assert 0 < counting.calls <= compression.MAX_FRAMES + 1


@pytest.mark.parametrize("codec", [COMPRESSION_GZIP, COMPRESSION_ZSTD], ids=["gzip", "zstd"])
def test_concatenated_frames_up_to_the_bound_decode_wherever_their_boundaries_fall(codec):
    rng = random.Random(codec)
    pieces = [rng.randbytes(rng.choice((0, 1, 50, 3000, 9000))) for _ in range(compression.MAX_FRAMES)]
    frames = [compression.compress(codec, piece) for piece in pieces]
    data = b"".join(frames)
    assert len(data) > 4 * compression._SLICE  # boundaries fall inside and across the slices fed in
    assert compression.decompress(codec, data, 64 << 20) == b"".join(pieces)
    with pytest.raises(compression.DecompressionError, match="concatenated"):
        compression.decompress(codec, data + frames[0], 64 << 20)
    with pytest.raises(compression.DecompressionError):  # a truncated last frame is still refused
        compression.decompress(codec, data[:-3], 64 << 20)


def test_xerial_snappy_block_count_is_bounded():
    import cramjam

    block = bytes(cramjam.snappy.compress_raw(b"x"))
    header = compression.XERIAL_MAGIC + struct.pack(">ii", 1, 1)
    unit = struct.pack(">i", len(block)) + block
    at_bound = header + unit * compression.MAX_XERIAL_BLOCKS
    assert compression.decompress(COMPRESSION_SNAPPY, at_bound, 1 << 20) == b"x" * compression.MAX_XERIAL_BLOCKS
    with pytest.raises(compression.DecompressionError, match="more than 4096 concatenated xerial blocks"):
        compression.decompress(COMPRESSION_SNAPPY, at_bound + unit, 1 << 20)


def test_producer_id_without_sequence_is_refused(walker):
    body = _body(build_batch(_records(1)))
    with pytest.raises(InvalidRecords, match="invalid sequence number -1"):
        _validate(_reframe(body, count=1, last_offset_delta=0, producer_id=7, base_sequence=-1))


def test_timestamps_outside_the_configured_window_name_each_record(walker):
    batch = build_batch(_records(3), timestamp_ms=NOW - 10_000)
    _validate(batch, timestamp_before_max_ms=20_000)
    with pytest.raises(RecordErrors) as caught:
        _validate(batch, timestamp_before_max_ms=5_000)
    assert str(caught.value) == "One or more records have been rejected due to invalid timestamp"
    assert [index for index, _ in caught.value.errors] == [0, 1, 2]
    assert "is out of range" in caught.value.errors[0][1]
    future = build_batch(_records(2), timestamp_ms=NOW + 60_000)
    with pytest.raises(RecordErrors):
        _validate(future, timestamp_after_max_ms=1_000)
    # A LogAppendTime topic stamps batches itself: producer timestamps are not checked there.
    _validate(future, timestamp_after_max_ms=1_000, log_append_time=True)


def test_a_producer_may_not_set_log_append_time(walker):
    body = _body(build_batch(_records(2)))
    with pytest.raises(RecordErrors) as caught:
        _validate(_reframe(body, count=2, last_offset_delta=1, attributes=records.TIMESTAMP_TYPE_MASK))
    assert [index for index, _ in caught.value.errors] == [0, 1]


def test_crc_mismatch_stays_corrupt_message():
    batch = bytearray(build_batch(_records(2)))
    batch[-1] ^= 1
    with pytest.raises(CorruptRecordBatch):
        _validate(bytes(batch))


def _mutations(rng: random.Random, body: bytes):
    """Some damaged copies of ``body``: flipped, inserted, deleted bytes, cut ends, and varint soup."""
    yield body
    for _ in range(6):
        damaged = bytearray(body)
        for _ in range(rng.randint(1, 3)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        yield bytes(damaged)
    cut = rng.randrange(len(body))
    yield body[:cut]
    yield body + bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
    at = rng.randrange(len(body))
    yield body[:at] + bytes([rng.randrange(256)]) + body[at:]
    yield body[:at] + body[at + 1 :]
    yield bytes([0xFF] * rng.randint(1, 12)) + body
    yield bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))


@pytest.mark.skipif(c_scan is None, reason="C extension not built")
def test_c_and_python_walkers_agree_on_valid_and_mutated_batches():
    rng = random.Random(20261125)  # fixed seed: a disagreement replays
    checked = 0
    for _ in range(400):
        items = []
        for _ in range(rng.randint(1, 12)):
            key = rng.choice([None, rng.randbytes(rng.randint(0, 20))])
            value = rng.choice([None, rng.randbytes(rng.randint(0, 300))])
            headers = [(f"h{h}", rng.choice([None, rng.randbytes(rng.randint(0, 8))])) for h in range(rng.randint(0, 3))]
            items.append((key, value, headers))
        body = _body(build_batch(items, timestamp_ms=NOW))
        for data in _mutations(rng, body):
            for count in {len(items), len(items) - 1, len(items) + 1, rng.randint(0, 40)}:
                expected = records._scan_records_py(data, count)
                assert c_scan(data, count) == expected, (data.hex(), count)
                checked += 1
    assert checked > 5000


@pytest.mark.skipif(c_scan is None, reason="C extension not built")
def test_c_walker_reads_varints_as_kafka_does():
    # Five-byte int32 varints keep 32 bits; a sixth continuation byte is malformed; ten-byte timestamps.
    for data, count in [
        (b"\xff\xff\xff\xff\x0f", 1),
        (b"\xff\xff\xff\xff\xff\x01", 1),
        (b"\x18\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x00\x01\x01\x00", 1),
        (b"\x16\x00\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01\x00\x01\x01\x00", 1),
    ]:
        assert c_scan(data, count) == records._scan_records_py(data, count)


def test_the_log_refuses_a_lying_batch_and_corrects_a_wrong_max_timestamp(tmp_path):
    from pykbroker.log.config import LogConfig
    from pykbroker.log.partition_log import PartitionLog

    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    try:
        assert log.append(build_batch(_records(2), timestamp_ms=NOW), leader_epoch=0, now_ms=NOW).base_offset == 0
        with pytest.raises(InvalidRecords):
            log.append(_reframe(_body(build_batch(_records(3))), count=1, last_offset_delta=0), leader_epoch=0, now_ms=NOW)
        assert log.log_end_offset == 2
        # A header whose maxTimestamp is not its records' largest is rewritten, as Kafka does.
        lying = bytearray(build_batch(_records(1), timestamp_ms=NOW + 5))
        struct.pack_into(">q", lying, 35, NOW + 10**9)
        struct.pack_into(">I", lying, 17, crc32c(memoryview(lying)[21:]))
        result = log.append(bytes(lying), leader_epoch=0, now_ms=NOW)
        assert (result.base_offset, result.headers[0].max_timestamp) == (2, NOW + 5)
        assert log.max_timestamp_and_offset() == (NOW + 5, 2)
        stored = log.read(2, 1 << 20).read_bytes()
        assert read_header(stored).max_timestamp == NOW + 5 and validate_batches(stored)
    finally:
        log.close()


def test_more_than_one_batch_is_seen_only_after_a_whole_first_batch():
    one = bytes(build_batch(_records(1)))
    assert not records.more_than_one_batch(one)
    assert records.more_than_one_batch(one + one)
    assert records.more_than_one_batch(one + b"\x00")
    assert not records.more_than_one_batch(one[:30])  # not framed: validate_batches reports it

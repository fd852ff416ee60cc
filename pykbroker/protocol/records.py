"""Record batch v2: a read-only view over batch headers, validation, in-place patches, and a small builder.

The broker never re-encodes what producers send: it reads the 61-byte header, checks the CRC32C, and
patches base offset / partition leader epoch (outside the CRC) in place. Because offsets are assigned
from the header alone, a batch whose records disagree with its header would give two records one offset;
so a producer's batch is first validated as Kafka's LogValidator does for client appends
(``validate_batches`` then ``validate_client_records``):
- framing and CRC32C (``InvalidRecordBatch`` / ``CorruptRecordBatch`` -> CORRUPT_MESSAGE, as Kafka's
  CorruptRecordException);
- recordCount > 0 and equal to lastOffsetDelta + 1, a base sequence with a producer id, a known codec,
  and every record walked (inside compressed batches too, after a bounded decompression): record lengths,
  field lengths, offset delta i for record i, no bytes left over or missing (``InvalidRecords`` ->
  INVALID_RECORD, as Kafka's InvalidRecordException). Kafka rebuilds a compressed batch whose inner
  offsets are not dense; this broker never rebuilds, so it refuses such a batch instead;
- timestamps per message.timestamp.before/after.max.ms, and no LogAppendTime flag from a producer
  (``RecordErrors`` -> INVALID_TIMESTAMP with one record error per record, as Kafka's
  RecordValidationException).
The record walk is the C function ``pykbroker._speedups.scan_records`` when that extension was built, and
its pure-Python twin ``_scan_records_py`` otherwise; both give the same answers and messages.

Decoding records is only needed for the broker's own internal topics (committed offsets) and for tests:
the builder and reader below handle that (decompressing with pykbroker.protocol.compression).

Layout (big-endian), offsets from the batch start:
    0  baseOffset            int64
    8  batchLength           int32   bytes after this field
    12 partitionLeaderEpoch  int32
    16 magic                 int8    = 2
    17 crc                   uint32  CRC32C of everything from attributes to the end
    21 attributes            int16   bits 0-2 codec, 3 timestamp type, 4 transactional, 5 control
    23 lastOffsetDelta       int32
    27 baseTimestamp         int64
    35 maxTimestamp          int64
    43 producerId            int64
    51 producerEpoch         int16
    53 baseSequence          int32
    57 recordCount           int32
    61 records...
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator, NamedTuple

import crc32c as _crc32c

from pykbroker.protocol.compression import DecompressionError, compress, decompress, lz4_blocks_linked

BATCH_HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the part not counted in batchLength
MAGIC_V2 = 2
CRC_START = 21

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20

COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD = range(5)
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

_HEADER = struct.Struct(">qiibIhiqqqhii")
_BASE_OFFSET = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_UINT32 = struct.Struct(">I")


class InvalidRecordBatch(ValueError):
    """The bytes are not a well-formed record batch v2 (truncated, wrong magic, bad length)."""


class CorruptRecordBatch(InvalidRecordBatch):
    """The batch is well framed but its CRC32C does not match: Kafka's CORRUPT_MESSAGE."""


class InvalidRecords(InvalidRecordBatch):
    """A well-framed batch whose records disagree with its header or are malformed: Kafka's INVALID_RECORD."""


class NullKeyRecords(InvalidRecords):
    """Records without a key sent to a compacted topic: Kafka's INVALID_RECORD with one record error each
    (LogValidator.validateKey). ``errors`` as in RecordErrors."""

    def __init__(self, message: str, errors: list[tuple[int, str]]):
        super().__init__(message)
        self.errors = errors


class RecordErrors(InvalidRecordBatch):
    """Some records break a per-record rule (timestamps): Kafka's RecordValidationException.

    ``errors`` holds (index of the record in its batch, message) pairs for the produce response's
    record_errors; the exception's own message is Kafka's summary line.
    """

    def __init__(self, message: str, errors: list[tuple[int, str]]):
        super().__init__(message)
        self.errors = errors


def crc32c(data) -> int:
    return _crc32c.crc32c(data)


class BatchHeader(NamedTuple):
    """The decoded 61-byte header of one batch, plus where it sits in the buffer it came from."""

    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies, header included."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) % (1 << 31)


def peek_header(buf, at: int = 0, position: int | None = None) -> BatchHeader:
    """Decode and check the 61-byte header at ``buf[at:]`` without needing the batch body in ``buf``.

    The log's fetch path reads headers alone from segment files; ``position`` is what the returned header
    reports as its place (a file position there), ``at`` by default.
    """
    position = at if position is None else position
    if len(buf) - at < BATCH_HEADER_SIZE:
        raise InvalidRecordBatch(f"truncated batch header at {position}: {len(buf) - at} bytes")
    header = BatchHeader(position, *_HEADER.unpack_from(buf, at))
    if header.magic != MAGIC_V2:
        raise InvalidRecordBatch(f"unsupported record batch magic {header.magic} at {position} (only v2 is accepted)")
    if header.batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
        raise InvalidRecordBatch(f"batch length {header.batch_length} at {position} is shorter than a batch header")
    if header.last_offset_delta < 0 or header.record_count < 0:
        raise InvalidRecordBatch(f"negative lastOffsetDelta or record count at {position}")
    return header


def read_header(buf, position: int = 0) -> BatchHeader:
    """Decode the header of the whole batch at ``position``; raises InvalidRecordBatch if it is not one."""
    header = peek_header(buf, position)
    if position + header.size > len(buf):
        raise InvalidRecordBatch(f"batch at {position} claims {header.size} bytes, {len(buf) - position} remain")
    return header


def crc_matches(buf, header: BatchHeader) -> bool:
    start = header.position + CRC_START
    end = header.position + header.size
    return crc32c(memoryview(buf)[start:end]) == header.crc


def iter_headers(buf, position: int = 0, end: int | None = None) -> Iterator[BatchHeader]:
    """Walk consecutive batches; raises InvalidRecordBatch on the first malformed one."""
    end = len(buf) if end is None else end
    while position < end:
        header = read_header(memoryview(buf)[:end], position)
        yield header
        position += header.size


def more_than_one_batch(buf) -> bool:
    """True when bytes follow a well-framed first batch: Produce v3+ allows exactly one batch per partition.

    A first batch that is not well framed answers False; validate_batches then reports it.
    """
    try:
        return peek_header(buf).size < len(buf)
    except InvalidRecordBatch:
        return False


def validate_batches(buf) -> list[BatchHeader]:
    """Check a producer's records field: at least one batch, every batch well framed with a valid CRC.

    Raises CorruptRecordBatch for a CRC mismatch and InvalidRecordBatch for anything else.
    """
    headers = list(iter_headers(buf))
    if not headers:
        raise InvalidRecordBatch("no record batch in the records field")
    for header in headers:
        if not crc_matches(buf, header):
            raise CorruptRecordBatch(f"CRC32C mismatch in batch at {header.position}")
    return headers


# A compressed batch is decompressed to be validated; past this many bytes it is refused (INVALID_RECORD)
# so that a small batch that inflates enormously cannot exhaust memory. 64 MiB is 64 times Kafka's
# default max.message.bytes.
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024
LONG_MAX = (1 << 63) - 1


def validate_client_records(
    buf,
    headers: list[BatchHeader],
    *,
    now_ms: int,
    log_append_time: bool = False,
    timestamp_before_max_ms: int = LONG_MAX,
    timestamp_after_max_ms: int = LONG_MAX,
    max_decompressed_bytes: int = MAX_DECOMPRESSED_BYTES,
    check_sequence: bool = True,
    null_keys_of: str | None = None,
) -> list[int]:
    """Validate the records of a producer's batches as Kafka's LogValidator does for client appends.

    ``null_keys_of``: the topic partition ("topic-N") of a compacted topic, whose records must all have a
    key: keyless ones raise NullKeyRecords naming each one's index in its batch (after every other check;
    counted in C on the records already decompressed, the Python walk only names them).

    ``headers`` come from ``validate_batches`` (framing and CRC already checked). ``log_append_time``
    is the topic's message.timestamp.type: with LogAppendTime the broker stamps the batch and record
    timestamps are not checked. Raises InvalidRecords or RecordErrors. Returns each batch's true max
    timestamp (base timestamp + the largest record delta): Kafka rewrites a CreateTime batch's
    maxTimestamp to it when the producer's differs, and so does the log. ``check_sequence`` False: the group
    coordinator's transactional offset batches (Kafka's AppendOrigin.Coordinator) carry no sequence.
    """
    view = memoryview(buf)
    max_timestamps = []
    null_keys: list[tuple[int, str]] = []
    for header in headers:
        count = header.record_count
        if count <= 0:
            raise InvalidRecords(f"invalid reported count for record batch: {count}")
        if count != header.last_offset_delta + 1:
            raise InvalidRecords(
                f"inconsistent batch offset range [0, {header.last_offset_delta}] and count of records {count}"
            )
        if check_sequence and header.has_producer_id and header.base_sequence < 0:
            raise InvalidRecords(
                f"invalid sequence number {header.base_sequence} in record batch with producerId {header.producer_id}"
            )
        data = client_records_section(view, header, max_decompressed_bytes)
        result = scan_records(data, count)
        if isinstance(result, str):
            raise InvalidRecords(result)
        if header.log_append_time:
            _refuse_log_append_time(header)
        min_delta, max_delta = result
        if not log_append_time:
            lowest = now_ms - timestamp_before_max_ms
            highest = now_ms + timestamp_after_max_ms
            if header.base_timestamp + min_delta < lowest or header.base_timestamp + max_delta > highest:
                _refuse_timestamps(header, data, lowest, highest)
        max_timestamps.append(header.base_timestamp + max_delta)
        if null_keys_of is not None and not header.is_control and count_null_keys(data, count):
            message = f"Compacted topic cannot accept message without key in topic partition {null_keys_of}."
            null_keys.extend((index, message) for index in null_key_indexes(bytes(data), count))
    _refuse_null_keys(null_keys)
    return max_timestamps


def _refuse_null_keys(errors: list[tuple[int, str]]) -> None:
    """Kafka's answer to an append to a compacted topic with keyless records (``errors``: each keyless
    record's index in its batch, with its message)."""
    if errors:
        shown = ", ".join(f"RecordError(batchIndex={index}, message='{text}')" for index, text in errors[:3])
        raise NullKeyRecords(
            f"One or more records have been rejected due to {len(errors)} record errors in total, and only "
            f"showing the first three errors at most: [{shown}]", errors)


def _count_null_keys_py(data, count: int) -> int:
    """The pure-Python twin of ``pykbroker._speedups.count_null_keys``."""
    return len(null_key_indexes(bytes(data), count))


def null_key_indexes(data: bytes, count: int) -> list[int]:
    """Indexes of the records without a key in a batch's (decompressed, well-formed) records section: any
    negative key length, as Kafka's DefaultRecord reads it (-1, -2, or -1 in a longer varint such as 0x81 0x00)."""
    return [index for index, (_, key, _, _, _) in enumerate(walk_records(data, count)) if key is None]


def walk_records(data: bytes, count: int) -> list[tuple[int, bytes | None, bool, int, int]]:
    """(offset delta, key, value is null, start, end) of each record in a batch's decompressed records.

    Bounded: a record runs within the data, its fields within the record (a negative key or value length is
    null, as Kafka reads it); anything else raises ValueError. It serves the null-key check and the log
    cleaner's pure-Python map (the C OffsetMap walks records alike), so a damaged batch is never rewritten
    (with a fresh CRC) as if it were whole."""
    out = []
    pos = index = 0
    limit = len(data)
    try:
        for index in range(count):
            start = pos
            size, pos = _varint32(data, pos, limit)
            if size < 1 or size > limit - pos:
                raise ValueError(f"record {index}: invalid record size {size} with {limit - pos} bytes left")
            end = pos + size
            _, at = _varint64(data, pos + 1, end)  # (attributes,) timestamp delta
            delta, at = _varint32(data, at, end)
            key_length, at = _varint32(data, at, end)
            if key_length < 0:
                key = None
            elif key_length > end - at:
                raise ValueError(f"record {index}: key of {key_length} bytes runs past the record")
            else:
                key = data[at : at + key_length]
                at += key_length
            value_length, at = _varint32(data, at, end)
            if value_length > end - at:
                raise ValueError(f"record {index}: value of {value_length} bytes runs past the record")
            out.append((delta, key, value_length < 0, start, end))
            pos = end
    except _Malformed:
        raise ValueError(f"record {index}: malformed varint") from None
    return out


def client_records_section(view: memoryview, header: BatchHeader, max_decompressed_bytes: int):
    """A producer's batch's records section, decompressed (at most ``max_decompressed_bytes``, else
    InvalidRecords, as for any codec failure)."""
    data = view[header.position + BATCH_HEADER_SIZE : header.position + header.size]
    if header.compression == COMPRESSION_LZ4 and lz4_blocks_linked(data):
        # Kafka refuses it (its lz4 reader has no dependent blocks); stored, Java consumers could not read it
        raise InvalidRecords("lz4 batch: Dependent block stream is unsupported (Kafka reads independent blocks only)")
    if header.compression != COMPRESSION_NONE:
        try:
            data = decompress(header.compression, data, max_decompressed_bytes)
        except DecompressionError as exc:
            raise InvalidRecords(f"{CODEC_NAMES.get(header.compression, 'codec')} batch: {exc}") from None
    return data


def _refuse_log_append_time(header: BatchHeader) -> None:
    reason = "Producer should not set timestamp type to LogAppendTime."
    errors = [(index, f"Invalid timestamp type in record {index}. {reason}") for index in range(header.record_count)]
    raise RecordErrors("One or more records have been rejected due to invalid timestamp", errors)


def _refuse_timestamps(header: BatchHeader, data, lowest: int, highest: int) -> None:
    """The slow path, taken only for a batch already known to hold a timestamp out of range."""
    errors = []
    for record in _parse_records(bytes(data), header):
        if record.timestamp != -1 and not lowest <= record.timestamp <= highest:
            index = record.offset - header.base_offset
            errors.append((
                index,
                f"Timestamp {record.timestamp} of message with offset {record.offset} is out of range. "
                f"The timestamp should be within [{lowest}, {highest}]",
            ))
    if errors:
        raise RecordErrors("One or more records have been rejected due to invalid timestamp", errors)


def _scan_records_py(data, count: int):
    """The pure-Python twin of ``pykbroker._speedups.scan_records`` (the C file documents the rules)."""
    data = bytes(data)
    end = len(data)
    pos = 0
    min_delta = max_delta = 0
    for i in range(count):
        try:
            size, pos = _varint32(data, pos, end)
        except _Malformed:
            return f"record {i}: malformed varint"
        if size < 0 or size > end - pos:
            return f"record {i}: invalid record size {size} with {end - pos} bytes left in the batch"
        record_start = pos
        record_end = pos + size
        try:
            if pos >= record_end:
                raise _Malformed
            pos += 1  # attributes: unused in v2
            timestamp_delta, pos = _varint64(data, pos, record_end)
            offset_delta, pos = _varint32(data, pos, record_end)
            if offset_delta != i:
                return f"record {i}: offset delta {offset_delta}, expected {i}"
            for _ in range(2):  # key, value
                length, pos = _varint32(data, pos, record_end)
                pos = _skip_nullable(pos, record_end, length)
            header_count, pos = _varint32(data, pos, record_end)
            if header_count < 0:
                return f"record {i}: invalid number of headers {header_count}"
            for _ in range(header_count):
                length, pos = _varint32(data, pos, record_end)
                if length < 0:
                    return f"record {i}: invalid negative header key size {length}"
                pos = _skip_nullable(pos, record_end, length)
                length, pos = _varint32(data, pos, record_end)
                pos = _skip_nullable(pos, record_end, length)
        except _Malformed:
            return f"record {i}: a field runs past the record"
        if pos != record_end:
            return f"record {i}: size {size} does not match the {pos - record_start} bytes its fields take"
        if i == 0 or timestamp_delta < min_delta:
            min_delta = timestamp_delta
        if i == 0 or timestamp_delta > max_delta:
            max_delta = timestamp_delta
    if pos != end:
        return f"{end - pos} bytes remain after the declared {count} records"
    return min_delta, max_delta


class _Malformed(Exception):
    """A varint or field of the pure-Python walk runs past its limit."""


def _raw_varint(data: bytes, pos: int, limit: int, max_bytes: int) -> tuple[int, int]:
    raw = 0
    for shift in range(0, 7 * max_bytes, 7):
        if pos >= limit:
            raise _Malformed
        byte = data[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return raw, pos
    raise _Malformed


def _varint32(data: bytes, pos: int, limit: int) -> tuple[int, int]:
    raw, pos = _raw_varint(data, pos, limit, 5)
    raw &= 0xFFFFFFFF  # Kafka's readVarint keeps 32 bits
    return (raw >> 1) ^ -(raw & 1), pos


def _varint64(data: bytes, pos: int, limit: int) -> tuple[int, int]:
    raw, pos = _raw_varint(data, pos, limit, 10)
    raw &= 0xFFFFFFFFFFFFFFFF
    return (raw >> 1) ^ -(raw & 1), pos


def _skip_nullable(pos: int, limit: int, length: int) -> int:
    if length < 0:
        return pos
    if length > limit - pos:
        raise _Malformed
    return pos + length


try:
    from pykbroker._speedups import scan_records
except ImportError:  # built without a C compiler: the pure-Python twin does the same checks
    scan_records = _scan_records_py

try:  # (an extension built before count_null_keys existed lacks it)
    from pykbroker._speedups import count_null_keys
except ImportError:
    count_null_keys = _count_null_keys_py

ACCELERATED = scan_records is not _scan_records_py


def set_base_offset(buf: bytearray, position: int, base_offset: int) -> None:
    _BASE_OFFSET.pack_into(buf, position, base_offset)


def set_partition_leader_epoch(buf: bytearray, position: int, epoch: int) -> None:
    _INT32.pack_into(buf, position + 12, epoch)


def set_max_timestamp(buf: bytearray, position: int, timestamp_ms: int, *, log_append_time: bool = False) -> None:
    """Set the batch's max timestamp (and LogAppendTime type if asked), and recompute the CRC."""
    if log_append_time:
        attributes = struct.unpack_from(">h", buf, position + 21)[0]
        struct.pack_into(">h", buf, position + 21, attributes | TIMESTAMP_TYPE_MASK)
    _INT64.pack_into(buf, position + 35, timestamp_ms)
    batch_length = _INT32.unpack_from(buf, position + 8)[0]
    end = position + LOG_OVERHEAD + batch_length
    _UINT32.pack_into(buf, position + 17, crc32c(memoryview(buf)[position + CRC_START : end]))


# ---------------------------------------------------------------------------------------------------
# Records inside a batch: only for the broker's internal topics and for tests.


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


def _write_varint(out: bytearray, value: int) -> None:
    value = (value << 1) ^ (value >> 63)  # zigzag
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _read_varint(buf, pos: int) -> tuple[int, int]:
    """A zigzag varint of a record being decoded (the validating walk's reader, its errors as InvalidRecordBatch)."""
    try:
        return _varint64(buf, pos, len(buf))
    except _Malformed:
        raise InvalidRecordBatch("truncated or over-long varint in record") from None


def _write_bytes(out: bytearray, value: bytes | None) -> None:
    if value is None:
        _write_varint(out, -1)
    else:
        _write_varint(out, len(value))
        out += value


def _read_bytes(buf, pos: int) -> tuple[bytes | None, int]:
    length, pos = _read_varint(buf, pos)
    if length < 0:
        return None, pos
    if pos + length > len(buf):
        raise InvalidRecordBatch("record field runs past the batch")
    return bytes(buf[pos : pos + length]), pos + length


def build_batch(
    records: list[tuple[bytes | None, bytes | None]] | list[tuple[bytes | None, bytes | None, list]],
    *,
    base_offset: int = 0,
    timestamp_ms: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    attributes: int = 0,
    compression: int = COMPRESSION_NONE,
) -> bytearray:
    """Encode a record batch v2 of (key, value[, headers]) tuples, its records compressed with ``compression``."""
    if not records:
        raise ValueError("a batch needs at least one record")
    body = bytearray()
    for delta, item in enumerate(records):
        key, value = item[0], item[1]
        headers = item[2] if len(item) > 2 else []
        record = bytearray([0])  # attributes
        _write_varint(record, 0)  # timestamp delta
        _write_varint(record, delta)
        _write_bytes(record, key)
        _write_bytes(record, value)
        _write_varint(record, len(headers))
        for header_key, header_value in headers:
            _write_bytes(record, header_key.encode())
            _write_bytes(record, header_value)
        _write_varint(body, len(record))
        body += record
    if compression != COMPRESSION_NONE:
        body = compress(compression, body)
    batch = bytearray(BATCH_HEADER_SIZE) + body
    _HEADER.pack_into(
        batch, 0, base_offset, len(batch) - LOG_OVERHEAD, partition_leader_epoch, MAGIC_V2, 0, attributes | compression,
        len(records) - 1, timestamp_ms, timestamp_ms, producer_id, producer_epoch, base_sequence, len(records),
    )
    _UINT32.pack_into(batch, 17, crc32c(memoryview(batch)[CRC_START:]))
    return batch


def read_records(buf, header: BatchHeader) -> list[Record]:
    """Decode the records of one batch (decompressing if needed)."""
    start = header.position + BATCH_HEADER_SIZE
    data = memoryview(buf)[start : header.position + header.size]
    if header.compression != COMPRESSION_NONE:
        try:
            data = decompress(header.compression, data, MAX_DECOMPRESSED_BYTES)
        except DecompressionError as exc:
            raise InvalidRecordBatch(str(exc)) from None
    return _parse_records(bytes(data), header)


def _parse_records(data: bytes, header: BatchHeader) -> list[Record]:
    records = []
    pos = 0
    for _ in range(header.record_count):
        length, pos = _read_varint(data, pos)
        end = pos + length
        pos += 1  # record attributes, unused
        timestamp_delta, pos = _read_varint(data, pos)
        offset_delta, pos = _read_varint(data, pos)
        key, pos = _read_bytes(data, pos)
        value, pos = _read_bytes(data, pos)
        header_count, pos = _read_varint(data, pos)
        headers = []
        for _ in range(header_count):
            header_key, pos = _read_bytes(data, pos)
            header_value, pos = _read_bytes(data, pos)
            headers.append(((header_key or b"").decode(), header_value))
        if pos != end:
            raise InvalidRecordBatch("record length does not match its fields")
        records.append(
            Record(header.base_offset + offset_delta, header.base_timestamp + timestamp_delta, key, value, tuple(headers))
        )
    return records

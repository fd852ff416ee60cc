"""Log compaction: Kafka's LogCleaner, LogCleanerManager and Cleaner, for topics whose cleanup.policy has compact.

What it does, as Kafka does:
- Picks the dirtiest compacted log: the dirty section runs from the first dirty offset (the
  ``cleaner-offset-checkpoint`` of the data directory, Kafka's file and format, or the log start) up to the
  first uncleanable offset: min(active segment base, the partition's high watermark (the last stable
  offset once transactions exist), the base of the first segment holding a record younger than
  min.compaction.lag.ms). A log is cleaned when dirty bytes / (clean + dirty bytes) >
  min.cleanable.dirty.ratio, or when its first dirty segment holds a record older than max.compaction.lag.ms.
- Builds a key -> latest offset map over the dirty section, laid out and bounded as Kafka's SkimpyOffsetMap:
  ``OffsetMap`` (pykbroker/_speedups.c), one buffer of slots = log.cleaner.dedupe.buffer.size /
  log.cleaner.threads / 24 entries of 24 bytes (a 16-byte key digest + the offset), allocated once per
  cleaning, open addressing with linear probing, holding at most slots * log.cleaner.io.buffer.load.factor
  keys (0.9: about 26.7 bytes of buffer per key, so Kafka's default 128 MiB holds 5,033,164 keys, as
  Kafka's). Every key is digested, whatever its length: SipHash-2-4 with a 128-bit output under a random
  secret drawn for each map (Kafka uses MD5, whose collisions can be made: a producer could write a key
  whose digest equals another key's and so erase that key's latest value; without the secret, a SipHash
  collision cannot be chosen). The records of each batch are walked, digested and inserted in C
  (``add_records``); so is the rewrite's choice of the records to keep (``filter_records``). When the map is
  full, the cleaning ends where it got (the last offset of the last whole batch mapped, + 1) and the rest
  waits for the next round, as Kafka's; a map full in the first dirty batch rewrites nothing and backs off
  (Kafka: "Unable to build the offset map"). Built without a C compiler, a pure-Python twin (a dict of
  keyed BLAKE2b digests, about 128 bytes a key) stands in, its capacity computed from its own entry size.
  The map pass also keeps, for the batches wholly in the dirty section, a summary of 16 bytes a record (the
  key's map entry, the offset delta, a null-value flag; OffsetMap.map_records), up to SUMMARY_BUDGET (32 MiB)
  a cleaning: the rewrite counts from it (``kept_records``) how many records a batch keeps once the map is
  complete, and decompresses and walks again only the batches that keep some but not all of them (a batch
  kept whole is copied, one dropped whole goes, without reading its records). Kafka reads every batch twice.
- Rewrites every segment from the log start up to that end, grouped (Kafka's groupSegmentsBySize) into
  segments of at most segment.bytes whose indexes fit segment.index.bytes: a record is kept if it is past
  the map's latest offset, or if it is the latest offset of its key; keyless records go. Tombstones (null
  values) stay until delete.retention.ms after the clean section's last segment was last modified: Kafka's
  rule before KIP-534 (deleteHorizonMs = that segment's mtime - delete.retention.ms; a segment whose mtime
  is at or below the horizon loses its tombstones; a cleaned segment takes the mtime of the last segment it
  replaces). Offsets are kept (gaps are allowed); a batch keeps its header (base offset, last offset delta,
  timestamps, producer id, epoch, base sequence, attributes) and its kept records' bytes unchanged,
  recompressed with its own codec. A batch emptied of records goes, except the last batch of each producer
  id in the cleaned range still in the partition's producer state, which stays as an empty batch (Kafka's
  RETAIN_EMPTY for lastRecordsOfActiveProducers: idempotent producers' state survives a restart). Records of
  aborted transactions (PartitionLog.aborted_ranges) never enter the map and go. A COMMIT/ABORT marker whose
  transaction has no batch left goes once its segment is past the delete horizon (Kafka's
  CleanedTransactionMetadata), with the .txnindex entry of an ABORT marker; other control batches stay.
- Only logs the replica manager hosts are cleaned (their last stable offset is known); a truncation lowers
  the checkpoint (Kafka's maybeTruncateCheckpoint) and refuses a swap in flight; a cleaning that did not
  progress (failed, aborted, no room in the map) backs that log off for log.cleaner.backoff.ms.
- Each round (one cleaning, or none and log.cleaner.backoff.ms of sleep) ends with the retention pass of
  every compacted log no cleaning holds (Kafka's cleanFilthiestLog: deletableLogs, deleteOldSegments):
  segments below the log start, and for compact,delete the ones past retention.ms / retention.bytes. The
  log manager's retention check (log.retention.check.interval.ms) skips compacted logs, as Kafka's does; with
  log.cleaner.enable=false they get no retention at all, as in Kafka.
- Crash safety (Kafka's model): the worker writes ``<base>.log.cleaned`` with its ``.index.cleaned`` and
  ``.timeindex.cleaned`` and ``<base>.end.cleaned`` (the end offset of the segments it replaces, which
  Kafka derives from the swap segment's last batch: naming it survives a last segment emptied of all its
  records), fsyncs them and the directory. The broker then renames them to ``.swap`` (log last), deletes the
  replaced segments, renames the ``.swap`` files into place (log last) and drops ``.end.swap``. A load
  deletes ``.cleaned`` files and completes each ``.log.swap`` (PartitionLog._complete_swaps).

Where the work runs: reading, decompressing, hashing and writing run in worker processes
(log.cleaner.threads of them, a ProcessPoolExecutor started at the first cleaning): the GIL would let a
cleaning thread slow the event loop. The worker reads only non-active segments, which nothing rewrites
in place. The broker's event loop checks, before the swap, that every replaced segment is still in the log
unchanged (retention, DeleteRecords, truncation, topic deletion or a move abort the cleaning, as Kafka's
abortAndPauseCleaning) and then does the renames and the segment-list update in one step (a few renames and
unlinks, no data I/O); old segments' descriptors close in the log manager's I/O thread, and reads holding
one of them (FileSlice pins) keep reading the replaced data.
"""

from __future__ import annotations

import asyncio
import hashlib
from bisect import bisect_right
import logging
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable, NamedTuple

from pykbroker.log.checkpoint import CorruptCheckpoint, read_checkpoint, write_checkpoint
from pykbroker.log.index import OffsetIndex, TimeIndex
from pykbroker.log.segment import (
    INDEX_SUFFIX,
    INT32_MAX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    iter_file_headers,
    pread_exactly,
    segment_file_name,
)
from pykbroker.protocol.compression import compress, decompress
from pykbroker.protocol.records import (
    BATCH_HEADER_SIZE,
    COMPRESSION_MASK,
    COMPRESSION_NONE,
    CRC_START,
    LOG_OVERHEAD,
    MAX_DECOMPRESSED_BYTES,
    _HEADER,
    _UINT32,
    crc32c,
    peek_header,
    read_header,
    walk_records,
)
from pykbroker.protocol.control_records import read_marker

if TYPE_CHECKING:
    from pykbroker.log.partition_log import PartitionLog

log = logging.getLogger(__name__)

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
END_SUFFIX = ".end"  # <base>.end.cleaned / .end.swap: the end offset of the segments a cleaned one replaces
LONG_MAX = (1 << 63) - 1
# Test hook: the broker process exits (as kill -9 would leave it) at this step of a swap.
CRASH_ENV = "PYKBROKER_CLEANER_CRASH_AT"
SWAP_STEPS = ("cleaned", "swap", "deleted", "renamed")


# ---------------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class CleanerConfig:
    enable: bool = True  # log.cleaner.enable
    threads: int = 1  # log.cleaner.threads
    backoff_ms: int = 15000  # log.cleaner.backoff.ms
    dedupe_buffer_size: int = 134217728  # log.cleaner.dedupe.buffer.size
    io_buffer_size: int = 524288  # log.cleaner.io.buffer.size
    load_factor: float = 0.9  # log.cleaner.io.buffer.load.factor

    @classmethod
    def from_broker(cls, get: Callable[[str], object]) -> "CleanerConfig":
        return cls(
            enable=bool(get("log.cleaner.enable")),
            threads=int(get("log.cleaner.threads")),
            backoff_ms=int(get("log.cleaner.backoff.ms")),
            dedupe_buffer_size=int(get("log.cleaner.dedupe.buffer.size")),
            io_buffer_size=int(get("log.cleaner.io.buffer.size")),
            load_factor=float(get("log.cleaner.io.buffer.load.factor")),
        )

    @property
    def map_slots(self) -> int:
        """Entries of one cleaning's map buffer: the dedupe buffer split between the threads, over the bytes an
        entry takes (Kafka's SkimpyOffsetMap: slots = memory / bytesPerEntry)."""
        per_thread = min(self.dedupe_buffer_size // max(self.threads, 1), INT32_MAX)  # (Kafka's cap too)
        return max(per_thread // MAP_ENTRY_BYTES, 2)

    @property
    def map_capacity(self) -> int:
        """Keys one cleaning's map may hold: its slots times the load factor (Kafka's maxDesiredMapSize), below
        the slots (a probe always ends at a free slot)."""
        slots = self.map_slots
        return min(max(int(slots * self.load_factor), 1), slots - 1)


# ---------------------------------------------------------------------------------------------------
# The worker side: a pure function of the segment files (runs in a worker process)


class AbortedRange(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True)
class SegmentFile:
    base_offset: int
    size: int  # valid bytes (the file may not be longer: non-active segments are never appended to)
    end_offset: int  # the next segment's base: the offsets this segment covers end below it


@dataclass(frozen=True)
class CleanTask:
    directory: str
    segments: tuple[SegmentFile, ...]  # from the log's first segment, every one non-active and below the bound
    first_dirty: int
    end_bound: int  # first uncleanable offset
    map_capacity: int  # keys the map may hold (CleanerConfig.map_capacity)
    delete_retention_ms: int
    segment_bytes: int
    segment_index_bytes: int
    index_interval_bytes: int
    aborted: tuple[AbortedRange, ...] = ()
    io_buffer_size: int = 524288
    # Producer ids in the partition's producer state: only their last batch stays as an empty batch (Kafka's
    # lastRecordsOfActiveProducers); None keeps the last batch of every producer id.
    active_producers: frozenset[int] | None = None
    # Entries of the map's buffer (CleanerConfig.map_slots); 0: the capacity at Kafka's default load factor 0.9.
    map_slots: int = 0


@dataclass(frozen=True)
class CleanedSegment:
    base_offset: int
    replaces: tuple[int, ...]  # base offsets of the segments it replaces (the first is its own)
    end_offset: int
    size: int


@dataclass
class CleanResult:
    end_offset: int  # the new first dirty offset
    segments: list[CleanedSegment] = field(default_factory=list)
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    map_entries: int = 0
    seconds: float = 0.0
    # (producer id, marker offset) of the markers the cleaning removed: their .txnindex entries go too
    # (a consumer given an entry whose marker is gone would skip that producer's later transactions).
    removed_aborts: set[tuple[int, int]] = field(default_factory=set)


class _OffsetMapPy:
    """The pure-Python twin of ``pykbroker._speedups.OffsetMap`` (the C file documents it), for a build without
    a C compiler: a dict of keyed BLAKE2b digests (a PRF too) whose entry takes about 128 bytes (measured: the
    digest's bytes object, the int, the dict slot), so the same dedupe buffer holds about a fifth of the keys."""

    ENTRY_BYTES = 128

    def __init__(self, slots: int, capacity: int, secret: bytes) -> None:
        if len(secret) != 16:
            raise ValueError(f"the secret takes 16 bytes, not {len(secret)}")
        if not 1 <= capacity < slots:
            raise ValueError(f"an offset map needs 1 <= capacity < slots (capacity {capacity}, slots {slots})")
        self.slots, self.capacity, self._secret = slots, capacity, secret
        self._offsets: dict[bytes, int] = {}
        self.latest_offset = -1

    @property
    def nbytes(self) -> int:
        return self.slots * self.ENTRY_BYTES

    def __len__(self) -> int:
        return len(self._offsets)

    def _digest(self, key) -> bytes:
        return hashlib.blake2b(key, digest_size=16, key=self._secret).digest()

    def put(self, key, offset: int) -> bool:
        digest = self._digest(key)
        if len(self._offsets) >= self.capacity and digest not in self._offsets:
            return False
        self._offsets[digest] = offset
        self.latest_offset = offset
        return True

    def get(self, key, default: int = -1) -> int:
        return self._offsets.get(self._digest(key), default)

    def add_records(self, data: bytes, count: int, base_offset: int, start_offset: int) -> bool:
        return self.map_records(data, count, base_offset, start_offset) is not None

    def map_records(self, data: bytes, count: int, base_offset: int, start_offset: int) -> list | None:
        summary = []
        for delta, key, value_null, _, _ in walk_records(data, count):
            offset = base_offset + delta
            if key is None:
                summary.append((None, delta, value_null))
            elif offset < start_offset:
                summary.append((False, delta, value_null))  # not mapped
            elif self.put(key, offset):
                summary.append((self._digest(key), delta, value_null))
            else:
                return None
        return summary

    def kept_records(self, summary: list, base_offset: int, latest_in_map: int, retain_deletes: bool) -> int:
        kept = 0
        for digest, delta, value_null in summary:
            offset = base_offset + delta
            if offset > latest_in_map:
                kept += 1
            elif digest is False:
                return -1
            elif digest is not None:
                kept += offset >= self._offsets.get(digest, -1) and (not value_null or retain_deletes)
        return kept

    def filter_records(self, data: bytes, count: int, base_offset: int, latest_in_map: int,
                       retain_deletes: bool) -> tuple[int, bytes | None]:
        kept = []
        for delta, key, value_null, start, end in walk_records(data, count):
            offset = base_offset + delta
            if offset > latest_in_map or (key is not None and offset >= self.get(key)
                                          and (not value_null or retain_deletes)):
                kept.append((start, end))
        if len(kept) == count:
            return count, None
        return len(kept), b"".join(data[start:end] for start, end in kept)


try:
    from pykbroker._speedups import OffsetMap
except ImportError:  # built without a C compiler (or an extension built before OffsetMap existed)
    OffsetMap = _OffsetMapPy

MAP_ENTRY_BYTES = OffsetMap.ENTRY_BYTES  # 24 (Kafka's SkimpyOffsetMap: a 16-byte digest + an 8-byte offset)


class _Batch(NamedTuple):
    header: object  # BatchHeader (position within the segment file)
    data: bytes  # the whole batch


def _iter_segment(fd: int, size: int, chunk: int):
    """(header, whole batch bytes) of each batch of a segment file, reading ``chunk`` bytes at a time."""
    position = 0
    while position < size:
        buf = pread_exactly(fd, min(max(chunk, BATCH_HEADER_SIZE), size - position), position)
        at = 0
        while len(buf) - at >= BATCH_HEADER_SIZE:
            header = peek_header(buf, at, position + at)
            if at + header.size > len(buf):
                if at:
                    break
                buf = pread_exactly(fd, header.size, position)
            yield header, buf[at : at + header.size]
            at += header.size
        position += at


class _Aborted:
    """Which data batches belong to aborted transactions (the ranges sorted by first offset)."""

    def __init__(self, ranges: tuple[AbortedRange, ...]) -> None:
        by_producer: dict[int, list[tuple[int, int]]] = {}
        for item in ranges:
            by_producer.setdefault(item.producer_id, []).append((item.first_offset, item.last_offset))
        # A producer's transactions do not overlap: sorted first offsets, bisected (not a scan per batch).
        self._by_producer = {pid: ([f for f, _ in sorted(r)], [last for _, last in sorted(r)])
                             for pid, r in by_producer.items()}

    def contains(self, header) -> bool:
        if not header.is_transactional or not self._by_producer:
            return False
        found = self._by_producer.get(header.producer_id)
        if found is None:
            return False
        firsts, lasts = found
        at = bisect_right(firsts, header.base_offset) - 1
        return at >= 0 and header.base_offset <= lasts[at]


class _TxnTracker:
    """Kafka's CleanedTransactionMetadata: which transaction markers may go because no batch of their
    transaction is left in the log (read in log order over one cleaning)."""

    def __init__(self, ranges: tuple[AbortedRange, ...]) -> None:
        self._pending = sorted(ranges, key=lambda item: item.first_offset, reverse=True)  # popped from the end
        self._aborted: dict[int, bool] = {}  # producer id -> a batch of its ongoing aborted transaction seen
        self._committed: set[int] = set()  # producers with a batch of an ongoing (not aborted) transaction seen

    def _consume_up_to(self, offset: int) -> None:
        while self._pending and self._pending[-1].first_offset <= offset:
            self._aborted[self._pending.pop().producer_id] = False

    def discard(self, header, batch: bytes) -> bool:
        """True for a control batch whose transaction has no batch left (it may go once past the delete
        horizon); data batches only update the state (and are never discarded here)."""
        self._consume_up_to(header.last_offset)
        producer_id = header.producer_id
        if not header.is_control:
            if header.is_transactional:
                if producer_id in self._aborted:
                    self._aborted[producer_id] = True
                else:
                    self._committed.add(producer_id)
            return False
        if not header.record_count:
            return True  # an empty control batch
        marker = read_marker(batch, read_header(batch, 0))
        if marker is None:
            return False
        # A batch seen as committed may belong to an aborted transaction whose index entry a crash lost: that
        # ABORT marker stays too.
        seen = self._aborted.pop(producer_id, False) if not marker.commit else False
        if producer_id in self._committed:
            self._committed.discard(producer_id)
            seen = True
        return not seen


def _records_of(header, batch: bytes) -> bytes:
    body = memoryview(batch)[BATCH_HEADER_SIZE:]
    if header.compression != COMPRESSION_NONE:
        return bytes(decompress(header.compression, body, MAX_DECOMPRESSED_BYTES))
    return bytes(body)


# Bytes of record summaries one cleaning keeps from the map pass for the rewrite: 2M records, about 1 GB of log
# at 500-byte records. Batches past it are decompressed again. Each summary is charged what it takes: 16 bytes a
# record (OffsetMap.map_records), and per batch its bytes object, int key and dict entry (measured ~110 bytes:
# a log of one-record batches took 7 times the budget when only the 16 were counted); the pure-Python twin's
# tuples take ~150 bytes a record.
SUMMARY_BUDGET = 32 << 20
SUMMARY_BATCH_BYTES = 160
SUMMARY_RECORD_BYTES = 16 if OffsetMap is not _OffsetMapPy else 160


def build_offset_map(task: CleanTask, result: CleanResult,
                     summaries: dict[int, object] | None = None) -> tuple[OffsetMap, int]:
    """The key -> latest offset map of the dirty section and the offset the cleaning ends at (exclusive).

    With ``summaries``, the batches wholly in the dirty section leave there (base offset ->
    OffsetMap.map_records summary, up to SUMMARY_BUDGET bytes) what the rewrite needs to tell, without
    decompressing and walking them again, that a batch keeps all or none of its records (most batches of a
    log of frequently updated keys keep none)."""
    capacity = task.map_capacity
    offsets = OffsetMap(task.map_slots or capacity * 10 // 9 + 1, capacity, os.urandom(16))
    aborted = _Aborted(task.aborted)
    start = task.first_dirty
    latest = start - 1
    budget = SUMMARY_BUDGET
    directory = Path(task.directory)
    for segment in task.segments:
        if segment.end_offset <= start:
            continue
        fd = os.open(directory / segment_file_name(segment.base_offset, LOG_SUFFIX), os.O_RDONLY)
        try:
            for header, batch in _iter_segment(fd, segment.size, task.io_buffer_size):
                result.bytes_read += header.size
                if header.last_offset < start:
                    continue
                if not header.is_control and not aborted.contains(header) and header.record_count:
                    records = _records_of(header, batch)
                    cost = SUMMARY_BATCH_BYTES + SUMMARY_RECORD_BYTES * header.record_count
                    if summaries is not None and header.base_offset >= start and budget >= cost:
                        summary = offsets.map_records(records, header.record_count, header.base_offset, start)
                        if summary is None:
                            return offsets, latest + 1  # full: clean up to the last whole batch
                        summaries[header.base_offset] = summary
                        budget -= cost
                    elif not offsets.add_records(records, header.record_count, header.base_offset, start):
                        return offsets, latest + 1
                latest = max(latest, header.last_offset)
        finally:
            os.close(fd)
    return offsets, max(latest + 1, start)


def group_segments(task: CleanTask, end_offset: int) -> list[list[SegmentFile]]:
    """Kafka's groupSegmentsBySize over the segments below ``end_offset``: consecutive segments whose sizes
    add up to at most segment.bytes, whose index entries fit segment.index.bytes, and whose offsets stay
    within an int32 of the group's base."""
    directory = Path(task.directory)
    chosen = [segment for segment in task.segments if segment.base_offset < end_offset]
    groups: list[list[SegmentFile]] = []
    index_bytes: list[int] = []
    for segment in chosen:
        try:
            own_index = os.stat(directory / segment_file_name(segment.base_offset, INDEX_SUFFIX)).st_size
        except FileNotFoundError:
            own_index = 0
        if groups:
            group = groups[-1]
            if (
                sum(s.size for s in group) + segment.size <= task.segment_bytes
                and index_bytes[-1] + own_index <= task.segment_index_bytes
                and segment.end_offset - 1 - group[0].base_offset <= INT32_MAX
            ):
                group.append(segment)
                index_bytes[-1] += own_index
                continue
        groups.append([segment])
        index_bytes.append(own_index)
    return groups


def _empty_batch(header) -> bytes:
    """Kafka's DefaultRecordBatch.writeEmptyHeader: the batch's header with no records, uncompressed."""
    batch = bytearray(BATCH_HEADER_SIZE)
    _HEADER.pack_into(
        batch, 0, header.base_offset, BATCH_HEADER_SIZE - LOG_OVERHEAD, header.partition_leader_epoch, 2, 0,
        header.attributes & ~COMPRESSION_MASK, header.last_offset_delta, header.base_timestamp, header.max_timestamp,
        header.producer_id, header.producer_epoch, header.base_sequence, 0,
    )
    _UINT32.pack_into(batch, 17, crc32c(memoryview(batch)[CRC_START:]))
    return bytes(batch)


def _rebuilt_batch(header, kept_records: bytes, count: int) -> bytes:
    """The batch's header (offsets, timestamps, producer fields, attributes unchanged) over the kept records,
    compressed with the batch's own codec."""
    body = kept_records if header.compression == COMPRESSION_NONE else compress(header.compression, kept_records)
    batch = bytearray(BATCH_HEADER_SIZE) + body
    _HEADER.pack_into(
        batch, 0, header.base_offset, len(batch) - LOG_OVERHEAD, header.partition_leader_epoch, 2, 0,
        header.attributes, header.last_offset_delta, header.base_timestamp, header.max_timestamp,
        header.producer_id, header.producer_epoch, header.base_sequence, count,
    )
    _UINT32.pack_into(batch, 17, crc32c(memoryview(batch)[CRC_START:]))
    return bytes(batch)


def _last_batches_of_producers(task: CleanTask, segments: list[SegmentFile]) -> dict[int, int]:
    """producer id -> last offset of its last data batch in the segments being cleaned (headers only)."""
    directory = Path(task.directory)
    last: dict[int, int] = {}
    for segment in segments:
        fd = os.open(directory / segment_file_name(segment.base_offset, LOG_SUFFIX), os.O_RDONLY)
        try:
            for header in iter_file_headers(fd, 0, segment.size):
                if header.has_producer_id and not header.is_control:
                    last[header.producer_id] = header.last_offset
        finally:
            os.close(fd)
    return last


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def clean_log(task: CleanTask) -> CleanResult:
    """Write the cleaned segments of one log as ``.cleaned`` files (fsynced); the broker swaps them in."""
    started = time.monotonic()
    result = CleanResult(task.first_dirty)
    summaries: dict[int, object] = {}
    offsets, end_offset = build_offset_map(task, result, summaries)
    result.end_offset = end_offset
    result.map_entries = len(offsets)
    if end_offset <= task.first_dirty:  # no progress (nothing dirty, or the map filled in the first batch)
        result.seconds = time.monotonic() - started
        return result
    directory = Path(task.directory)
    groups = group_segments(task, end_offset)
    # Tombstones: Kafka's deleteHorizonMs before KIP-534, from the clean section's last segment.
    clean = [s for s in task.segments if s.end_offset <= task.first_dirty]
    horizon = 0
    if clean:
        horizon = int(os.stat(directory / segment_file_name(clean[-1].base_offset, LOG_SUFFIX)).st_mtime * 1000)
        horizon -= task.delete_retention_ms
    producers_last = _last_batches_of_producers(task, [s for group in groups for s in group])
    if task.active_producers is not None:
        producers_last = {pid: last for pid, last in producers_last.items() if pid in task.active_producers}
    txns = _TxnTracker(task.aborted)
    aborted = _Aborted(task.aborted)
    latest_in_map = end_offset - 1
    written_paths: list[Path] = []
    try:
        for group in groups:
            cleaned = _clean_group(task, group, offsets, latest_in_map, horizon, producers_last, aborted, txns,
                                   result, summaries)
            result.segments.append(cleaned)
            base = group[0].base_offset
            written_paths.extend(
                directory / (segment_file_name(base, suffix) + CLEANED_SUFFIX)
                for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, END_SUFFIX)
            )
        for path in written_paths:
            _fsync_path(path)
        _fsync_path(directory)
    except BaseException:
        for group in groups:
            for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, END_SUFFIX):
                (directory / (segment_file_name(group[0].base_offset, suffix) + CLEANED_SUFFIX)).unlink(missing_ok=True)
        raise
    result.seconds = time.monotonic() - started
    return result


def _clean_group(task: CleanTask, group: list[SegmentFile], offsets: OffsetMap, latest_in_map: int,
                 horizon: int, producers_last: dict[int, int], aborted: _Aborted, txns: "_TxnTracker",
                 result: CleanResult, summaries: dict[int, object]) -> CleanedSegment:
    directory = Path(task.directory)
    base = group[0].base_offset
    log_path = directory / (segment_file_name(base, LOG_SUFFIX) + CLEANED_SUFFIX)
    index = OffsetIndex.create(directory / (segment_file_name(base, INDEX_SUFFIX) + CLEANED_SUFFIX), base)
    time_index = TimeIndex.create(directory / (segment_file_name(base, TIME_INDEX_SUFFIX) + CLEANED_SUFFIX), base)
    interval = task.index_interval_bytes
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    pending = bytearray()
    position = 0  # bytes of the cleaned segment so far
    since_index = 0
    max_ts, max_ts_offset = -1, base
    latest_mtime = 0.0
    try:
        for segment in group:
            path = directory / segment_file_name(segment.base_offset, LOG_SUFFIX)
            fd = os.open(path, os.O_RDONLY)
            try:
                latest_mtime = max(latest_mtime, os.fstat(fd).st_mtime)
                retain_deletes = int(os.fstat(fd).st_mtime * 1000) > horizon
                for header, batch in _iter_segment(fd, segment.size, task.io_buffer_size):
                    if txns.discard(header, batch) and not retain_deletes:
                        # a marker whose transaction has no data left, past the delete horizon
                        result.removed_aborts.add((header.producer_id, header.last_offset))
                        continue
                    kept = _filter_batch(header, batch, offsets, latest_in_map, retain_deletes, producers_last,
                                         aborted, result, summaries.pop(header.base_offset, None))
                    if kept is None:
                        continue
                    if header.max_timestamp > max_ts:
                        max_ts, max_ts_offset = header.max_timestamp, header.last_offset
                    if since_index > interval:
                        index.append(header.last_offset, position)
                        time_index.maybe_append(max_ts, max_ts_offset)
                        since_index = 0
                    since_index += len(kept)
                    position += len(kept)
                    pending += kept
                    if len(pending) >= task.io_buffer_size:
                        _write_all(out, pending)
                        pending = bytearray()
            finally:
                os.close(fd)
        _write_all(out, pending)
    finally:
        os.close(out)
    time_index.maybe_append(max_ts, max_ts_offset)
    index.write_pending()
    time_index.write_pending()
    os.utime(log_path, (latest_mtime, latest_mtime))  # Kafka: the cleaned segment keeps the last one's mtime
    end_offset = group[-1].end_offset
    end_path = directory / (segment_file_name(base, END_SUFFIX) + CLEANED_SUFFIX)
    end_path.write_text(f"{end_offset}\n")
    result.bytes_written += position
    return CleanedSegment(base, tuple(s.base_offset for s in group), end_offset, position)


def _write_all(fd: int, data: bytearray) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _filter_batch(header, batch: bytes, offsets: OffsetMap, latest_in_map: int, retain_deletes: bool,
                  producers_last: dict[int, int], aborted: _Aborted, result: CleanResult,
                  summary: object = None) -> bytes | None:
    """The batch as the cleaned segment holds it (itself, rebuilt, or empty), or None to drop it. With the
    batch's ``summary`` from the map pass, a batch keeping all or none of its records is not decompressed."""
    if header.is_control:
        return batch
    keep_empty = header.has_producer_id and producers_last.get(header.producer_id) == header.last_offset
    result.records_read += header.record_count
    if header.record_count == 0 or aborted.contains(header):
        return _empty_batch(header) if keep_empty else None
    if header.base_offset > latest_in_map:  # past the map: kept whole
        result.records_kept += header.record_count
        return batch
    kept = -1 if summary is None else offsets.kept_records(summary, header.base_offset, latest_in_map, retain_deletes)
    if kept == header.record_count:
        records = None
    elif kept == 0:
        records = b""
    else:  # some records go (or no summary): the kept ones' bytes
        kept, records = offsets.filter_records(_records_of(header, batch), header.record_count, header.base_offset,
                                               latest_in_map, retain_deletes)
    result.records_kept += kept
    if records is None:  # every record kept
        return batch
    if crc32c(memoryview(batch)[CRC_START:]) != header.crc:
        # Rebuilt, the batch would get a fresh CRC over damaged bytes (bit rot made to look valid): the
        # partition is left uncleaned instead, with a warning (its consumers see the bad CRC as before).
        raise ValueError(f"batch at offset {header.base_offset}: CRC mismatch, its data is corrupt")
    if not kept:
        return _empty_batch(header) if keep_empty else None
    return _rebuilt_batch(header, records, kept)


# ---------------------------------------------------------------------------------------------------
# The broker side


def crash_point(step: str) -> None:
    """Test hook: exit the process at ``step`` of a swap, leaving files as kill -9 would (CRASH_ENV)."""
    if os.environ.get(CRASH_ENV) == step:
        log.error("log cleaner: exiting at step %r (%s is set)", step, CRASH_ENV)
        os._exit(137)


def _worker_init() -> None:
    """A cleaner worker dies with the broker (even a kill -9 of it), so none writes on after a restart."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the broker died before the call above
        os._exit(0)


@dataclass
class _Candidate:
    log: "PartitionLog"
    first_dirty: int
    bound: int
    ratio: float
    dirty_bytes: int


class LogCleaner:
    """Chooses compacted logs to clean, runs the cleanings in worker processes, swaps their results in."""

    def __init__(self, data_dir: Path, config: CleanerConfig, logs: Callable[[], list["PartitionLog"]],
                 stable_offset_of: Callable[[str, int], int | None],
                 run_file_work: Callable[[list["PartitionLog"]], "asyncio.Future"],
                 write_in_io_thread: Callable[[Callable[[], None]], "asyncio.Future"],
                 retain: Callable[[list["PartitionLog"]], Awaitable[None]] | None = None) -> None:
        self.data_dir = data_dir
        self.config = config
        self._logs = logs
        self._stable_offset_of = stable_offset_of  # the last stable offset: HWM and open transactions
        self._run_file_work = run_file_work
        self._write_in_io_thread = write_in_io_thread
        self._retain = retain  # the log manager's retention pass, for the compacted logs (each round)
        self._checkpoints: dict[tuple[str, int], int] = self._read_checkpoints()
        self._in_progress: set[tuple[str, int]] = set()
        self._uncleanable: set[tuple[str, int]] = set()  # their data could not be read (Kafka's uncleanable partitions)
        # Logs whose last cleaning made no progress (failed, aborted, map full): not chosen before this time (ms).
        self._backoff: dict[tuple[str, int], int] = {}
        self._pool: ProcessPoolExecutor | None = None
        self._reconfigured: asyncio.Event | None = None  # set by reconfigure: run() restarts the loops
        self.use_processes = True  # tests may clean in a thread instead
        self._closed = False
        self.cleanings = 0  # completed (swapped) cleanings, for tests and metrics
        self.aborted = 0
        self.last_result: CleanResult | None = None

    # -- checkpoint ----------------------------------------------------------------------------------

    def _read_checkpoints(self) -> dict[tuple[str, int], int]:
        try:
            rows = read_checkpoint(self.data_dir / CLEANER_CHECKPOINT, 3) or []
            return {(topic, int(partition)): int(offset) for topic, partition, offset in rows}
        except (CorruptCheckpoint, ValueError, OSError) as exc:
            log.warning("%s unreadable (%s): every compacted log is considered dirty",
                        self.data_dir / CLEANER_CHECKPOINT, exc)
            return {}

    def checkpoint_rows(self) -> list[tuple[str, int, int]]:
        live = {(pl.topic, pl.partition) for pl in self._logs()}
        return [(t, p, o) for (t, p), o in sorted(self._checkpoints.items()) if (t, p) in live]

    def forget(self, topic: str, partition: int) -> None:
        """The log was deleted (its topic, or the replica moved away): a new log of that name starts dirty."""
        self._checkpoints.pop((topic, partition), None)
        self._uncleanable.discard((topic, partition))
        self._backoff.pop((topic, partition), None)

    def truncate_checkpoint(self, topic: str, partition: int, offset: int) -> None:
        """The log was truncated to ``offset`` (Kafka's maybeTruncateCheckpoint): what is written there again
        is dirty."""
        key = (topic, partition)
        if self._checkpoints.get(key, 0) > offset:
            self._checkpoints[key] = offset

    def check_loaded(self, partition_log: "PartitionLog") -> None:
        """A loaded log ending below its checkpoint (a recovery cut it): the whole log is dirty again (Kafka's
        cleanableOffsets resets a checkpoint past the log end to the log start), and stays so as it refills."""
        key = (partition_log.topic, partition_log.partition)
        if self._checkpoints.get(key, 0) > partition_log.log_end_offset:
            log.warning("log cleaner: %s-%d ends at %d, below its cleaner checkpoint %d: cleaned again from its start",
                        key[0], key[1], partition_log.log_end_offset, self._checkpoints[key])
            self._checkpoints[key] = partition_log.log_start_offset

    def first_dirty_offset(self, partition_log: "PartitionLog") -> int:
        key = (partition_log.topic, partition_log.partition)
        if self._checkpoints.get(key, 0) > partition_log.log_end_offset:  # truncated below it unnoticed
            self.check_loaded(partition_log)
        return max(self._checkpoints.get(key, 0), partition_log.log_start_offset)

    # -- choosing ------------------------------------------------------------------------------------

    def candidate(self, partition_log: "PartitionLog", now_ms: int) -> _Candidate | None:
        """The log's cleanable state if it needs cleaning now (Kafka's LogCleanerManager.grabFilthiestCompactedLog)."""
        config = partition_log.config
        if not config.compact:
            return None
        segments = partition_log.segments_view()
        if len(segments) < 2:
            return None
        first_dirty = self.first_dirty_offset(partition_log)
        hwm = self._stable_offset_of(partition_log.topic, partition_log.partition)
        if hwm is None:  # not hosted (yet): no high watermark or producer state to bound a cleaning
            return None
        bound = min(segments[-1].base_offset, hwm)
        if config.min_compaction_lag_ms > 0:
            cutoff = now_ms - config.min_compaction_lag_ms
            for segment, end in zip(segments, [s.base_offset for s in segments[1:]]):
                if end > first_dirty and segment.max_timestamp_and_offset()[0] > cutoff:
                    bound = min(bound, segment.base_offset)
                    break
        clean_bytes = dirty_bytes = 0
        first_dirty_segment = None
        for segment, end in zip(segments, [s.base_offset for s in segments[1:]]):
            if end <= first_dirty:
                clean_bytes += segment.size
            elif end <= bound:
                dirty_bytes += segment.size
                if first_dirty_segment is None:
                    first_dirty_segment = segment
        if not dirty_bytes:
            return None
        ratio = dirty_bytes / (clean_bytes + dirty_bytes)
        must = False
        if config.max_compaction_lag_ms < LONG_MAX and first_dirty_segment is not None:
            first_ts = first_dirty_segment.first_batch_timestamp()
            must = first_ts is not None and 0 <= first_ts < now_ms - config.max_compaction_lag_ms
        if ratio <= config.min_cleanable_dirty_ratio and not must:  # (Kafka: cleanableRatio > minCleanableRatio)
            return None
        return _Candidate(partition_log, first_dirty, bound, ratio, dirty_bytes)

    def filthiest(self, now_ms: int) -> _Candidate | None:
        best = None
        for partition_log in self._logs():
            key = (partition_log.topic, partition_log.partition)
            if key in self._in_progress or key in self._uncleanable or self._backoff.get(key, 0) > now_ms:
                continue
            found = self.candidate(partition_log, now_ms)
            if found is not None and (best is None or found.ratio > best.ratio):
                best = found
        return best

    # -- running -------------------------------------------------------------------------------------

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=max(self.config.threads, 1),
                                             mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_worker_init)
        return self._pool

    async def run(self) -> None:
        """Log.cleaner.threads cleaning loops until cancelled; started again with the new settings after a
        ``reconfigure`` (Kafka's LogCleaner.reconfigure restarts its threads the same way)."""
        while not self._closed:
            self._reconfigured = asyncio.Event()
            loops = []
            if self.config.enable and self.config.threads >= 1:
                loops = [asyncio.ensure_future(self._loop()) for _ in range(self.config.threads)]
            try:
                await self._reconfigured.wait()
            finally:
                for task in loops:
                    task.cancel()
                await asyncio.gather(*loops, return_exceptions=True)
            # A cleaning cut short leaves .cleaned files, deleted at the next load. The joins (a stuck worker
            # takes up to 5 s) run in a thread, never on the event loop.
            processes = self._stop_workers()
            if processes:
                await asyncio.get_running_loop().run_in_executor(None, _join_all, processes)

    def reconfigure(self, config: CleanerConfig) -> None:
        """New cleaner settings (dynamic broker configs log.cleaner.*): the cleanings in flight stop, the
        workers are replaced, and the loops start again with ``config``."""
        if config == self.config:
            return
        log.info("log cleaner: reconfigured: %s", config)
        self.config = config
        if self._reconfigured is not None:
            self._reconfigured.set()

    async def _loop(self) -> None:
        while not self._closed:
            cleaned = False
            try:
                cleaned = await self.clean_filthiest()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one log's failure must not stop cleaning the others
                log.exception("log cleaner: a cleaning failed")
            if not cleaned:
                await asyncio.sleep(self.config.backoff_ms / 1000)

    async def clean_filthiest(self) -> bool:
        """One round (Kafka's cleanFilthiestLog): clean the dirtiest log, if one needs it, then apply retention
        to the compacted logs; True if a cleaning made progress. A cleaning that did not (failed, aborted, or a
        map full in the first dirty batch) backs off: that log is not chosen again for log.cleaner.backoff.ms,
        and the loop sleeps (no tight retry on a full disk)."""
        cleaned = await self._clean_filthiest()
        await self._retain_compacted()
        return cleaned

    async def _retain_compacted(self) -> None:
        """Retention of the compacted logs no cleaning holds (Kafka's deletableLogs then deleteOldSegments):
        below the log start, and by retention.ms / retention.bytes for compact,delete; so those logs lose
        expired segments every round, every log.cleaner.backoff.ms at most, not at the retention check
        (which skips them). A failure is logged; the next round tries again."""
        if self._retain is None:
            return
        logs = [partition_log for partition_log in self._logs()
                if partition_log.config.compact and not partition_log.closed
                and (partition_log.topic, partition_log.partition) not in self._in_progress | self._uncleanable]
        try:
            await self._retain(logs)
        except OSError as exc:
            log.warning("log cleaner: retention of compacted logs failed (%s); tried again next round", exc)

    async def _clean_filthiest(self) -> bool:
        candidate = self.filthiest(int(time.time() * 1000))
        if candidate is None:
            return False
        key = (candidate.log.topic, candidate.log.partition)
        self._in_progress.add(key)
        result = None
        try:
            result = await self.clean(candidate)
        finally:
            self._in_progress.discard(key)
            if result is None:
                self._backoff[key] = int(time.time() * 1000) + self.config.backoff_ms
            else:
                self._backoff.pop(key, None)
        return result is not None

    async def clean(self, candidate: _Candidate) -> CleanResult | None:
        """Clean one log; its result if the cleaning made progress (swapped in, checkpoint moved), else None."""
        partition_log = candidate.log
        config = partition_log.config
        truncations = partition_log.truncations
        snapshot = partition_log.cleanable_segments(candidate.bound)
        if not snapshot:
            return None
        files = tuple(SegmentFile(segment.base_offset, size, end) for segment, size, end in snapshot)
        task = CleanTask(
            directory=str(partition_log.directory),
            segments=files,
            first_dirty=candidate.first_dirty,
            end_bound=candidate.bound,
            map_capacity=self.config.map_capacity,
            map_slots=self.config.map_slots,
            delete_retention_ms=config.delete_retention_ms,
            segment_bytes=config.segment_bytes,
            segment_index_bytes=config.segment_index_bytes,
            index_interval_bytes=config.index_interval_bytes,
            aborted=tuple(AbortedRange(*item) for item in partition_log.aborted_ranges(files[0].base_offset, candidate.bound)),
            io_buffer_size=max(self.config.io_buffer_size // max(self.config.threads, 1), 65536),
            active_producers=frozenset(partition_log.producer_state.producer_ids()),
        )
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(self._executor() if self.use_processes else None, clean_log, task)
        except BrokenProcessPool:
            self._pool = None
            raise
        except OSError as exc:  # a segment deleted or the directory renamed meanwhile: tried again later
            log.info("log cleaner: cleaning %s-%d stopped: %s", partition_log.topic, partition_log.partition, exc)
            self.aborted += 1
            return None
        except Exception as exc:  # noqa: BLE001 - unreadable data: Kafka's markPartitionUncleanable
            if partition_log.closed or any(segment.deleted for segment, _, _ in snapshot):
                self.aborted += 1  # (read while retention or a truncation replaced it)
                return None
            self._uncleanable.add((partition_log.topic, partition_log.partition))
            log.warning("log cleaner: %s-%d is not cleaned again until a restart: %r",
                        partition_log.topic, partition_log.partition, exc)
            return None
        crash_point("cleaned")
        key = (partition_log.topic, partition_log.partition)
        if result.end_offset <= candidate.first_dirty:
            log.error("log cleaner: unable to build the offset map of %s-%d: the map is full in the first dirty "
                      "batch at offset %d; increase log.cleaner.dedupe.buffer.size", partition_log.topic,
                      partition_log.partition, candidate.first_dirty)
            return None
        if result.segments:
            swapped = partition_log.swap_cleaned(snapshot, result.segments, truncations, result.removed_aborts)
            if not swapped:
                self.aborted += 1
                log.info("log cleaner: cleaning of %s-%d aborted: its segments changed meanwhile",
                         partition_log.topic, partition_log.partition)
                await self._run_file_work([partition_log])
                return None
            await self._run_file_work([partition_log])
        elif partition_log.truncations != truncations:  # truncated meanwhile: its checkpoint went down
            self.aborted += 1
            return None
        if partition_log.truncations != truncations:
            # Truncated during the await after the swap: on_truncate lowered the checkpoint, which stays (what
            # is written again from the truncation point on is dirty).
            self._checkpoints[key] = min(self._checkpoints.get(key, 0), result.end_offset)
        else:
            self._checkpoints[key] = result.end_offset
        rows = self.checkpoint_rows()
        await self._write_in_io_thread(lambda: write_checkpoint(self.data_dir / CLEANER_CHECKPOINT, rows))
        self.cleanings += 1
        self.last_result = result
        mb = result.bytes_read / 1e6
        log.info(
            "log cleaner: cleaned %s-%d up to offset %d: %.1f MB read, %.1f MB written, %d of %d records kept, "
            "%d keys, %.2f s (%.1f MB/s)", partition_log.topic, partition_log.partition, result.end_offset, mb,
            result.bytes_written / 1e6, result.records_kept, result.records_read, result.map_entries, result.seconds,
            mb / result.seconds if result.seconds else 0.0,
        )
        return result

    def shutdown(self) -> None:
        """Stop the workers (a cleaning in flight leaves ``.cleaned`` files, which the next load deletes)."""
        self._closed = True
        _join_all(self._stop_workers())

    def _stop_workers(self) -> list:
        """Stop the pool and terminate its processes; the processes, for the caller to join."""
        pool, self._pool = self._pool, None
        if pool is None:
            return []
        processes = list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:  # our own workers: a long cleaning must not outlive the broker
            if process.is_alive():
                process.terminate()
        return processes


def _join_all(processes: list) -> None:
    for process in processes:
        process.join(5)

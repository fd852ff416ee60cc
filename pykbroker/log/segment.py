"""One log segment: ``<base>.log`` plus its ``.index`` and ``.timeindex``, in Kafka's layout.

The ``.log`` file is a plain concatenation of record batches v2. Reads never load batch bodies into Python:
they walk 61-byte batch headers with ``pread`` of small chunks, starting from the sparse offset index, and
hand back byte ranges (FileSlice) that the connection reads with ``pread`` as the socket drains. Writes are one ``pwrite()`` per append call, at the segment's
valid size: a write that fails half-way (disk full) is cut off again, and even if that cut fails the next
append overwrites the torn bytes instead of landing after them.

The ``.log`` descriptor is a LazyFile (pykbroker/log/files.py): opened on first use, closed by the
shared budget when the segment sits idle, and pinned while a generator or a FileSlice holds it.
"""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from pykbroker.log.files import LazyFile, Pin
from pykbroker.log.index import CorruptIndex, OffsetIndex, TimeIndex
from pykbroker.protocol.records import (
    BATCH_HEADER_SIZE,
    BatchHeader,
    InvalidRecordBatch,
    crc_matches,
    peek_header,
    read_header,
)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)
INT32_MAX = (1 << 31) - 1

# Header walks read this much at a time: one pread covers dozens of small batches, and for big batches the
# wasted tail is cheap next to the system call.
HEADER_CHUNK = 4096


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def parse_segment_file_name(name: str) -> int | None:
    """The base offset encoded in a ``.log`` file name, or None for any other file."""
    stem, dot, suffix = name.partition(".")
    if dot and "." + suffix == LOG_SUFFIX and len(stem) == 20 and stem.isdigit():
        return int(stem)
    return None


def iter_file_headers(fd: int, position: int, end: int) -> Iterator[BatchHeader]:
    """Headers of the batches in ``fd`` from ``position`` (a batch start) up to ``end`` (a batch end).

    Raises InvalidRecordBatch if a header is malformed or a batch runs past ``end``.
    """
    buf = b""
    buf_start = position
    while position < end:
        at = position - buf_start
        if len(buf) - at < BATCH_HEADER_SIZE:
            buf = os.pread(fd, min(HEADER_CHUNK, end - position), position)
            buf_start, at = position, 0
        header = peek_header(buf, at, position)
        position += header.size
        if position > end:
            raise InvalidRecordBatch(f"batch at file position {header.position} runs past {end}")
        yield header


def last_offset_in(fd: int, position: int, end: int) -> int | None:
    """The last offset of the batches from ``position`` as far as their headers can be read; None if none.

    Trusts the headers without checking CRCs: for reporting what a recovery cut, not for serving it.
    """
    last = None
    try:
        for header in iter_file_headers(fd, position, end):
            last = header.last_offset
    except InvalidRecordBatch:
        pass
    return last


@dataclass(frozen=True)
class RecoveryCut:
    """What recovery cut off a segment: from batch boundary ``position`` (offset ``first_offset``) on."""

    bytes_cut: int
    position: int
    first_offset: int
    last_offset: int | None  # the last offset the cut bytes' headers claim, None if none is readable
    reason: str


def pread_exactly(fd: int, length: int, position: int) -> bytes:
    data = os.pread(fd, length, position)
    if len(data) == length:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, position + got)
        if not more:
            raise InvalidRecordBatch(f"file ends {length - got} bytes short of {position + length}")
        parts.append(more)
        got += len(more)
    return b"".join(parts)


class Segment:
    """A segment's files and the little state the log needs about it.

    For the active segment the max timestamp, next offset and indexes are live in memory; for older segments
    they are read from the files on first use.
    """

    def __init__(self, directory: Path, base_offset: int, size: int, roll_jitter_ms: int = 0) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.log_path = directory / segment_file_name(base_offset, LOG_SUFFIX)
        self.index: OffsetIndex
        self.time_index: TimeIndex
        self.size = size
        self.next_offset: int | None = base_offset if size == 0 else None  # None: not known yet
        # Kafka's segment.ms clock (LogSegment's rollingBasedTimestamp, created and rollJitterMs): the largest
        # timestamp of the first append, read from the first batch while unknown (None); a first batch without
        # a timestamp (-1) makes the wall-clock time since the segment was created or opened count instead.
        self.rolling_base_ms: int | None = None
        self.created_ms = int(time.time() * 1000)
        self.roll_jitter_ms = roll_jitter_ms  # drawn from segment.jitter.ms when the segment is opened
        self._max_timestamp: tuple[int, int] | None = (-1, base_offset) if size == 0 else None
        self._bytes_since_index_entry = 0
        self._file = LazyFile(self.log_path, os.O_RDWR)
        self.needs_rebuild = False
        self.deleted = False
        self._scan_stop = ""  # why the last scan stopped before the file's end

    # -- lifecycle ---------------------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, base_offset: int, roll_jitter_ms: int = 0) -> "Segment":
        """A new empty segment and its files; if creating them fails (disk full), none is left behind."""
        segment = cls(directory, base_offset, 0, roll_jitter_ms)
        try:
            segment._file = LazyFile.create(segment.log_path, os.O_RDWR)
            segment.index = OffsetIndex.create(segment.path_for(INDEX_SUFFIX), base_offset)
            segment.time_index = TimeIndex.create(segment.path_for(TIME_INDEX_SUFFIX), base_offset)
        except OSError:
            segment.close()
            segment.delete_files()
            raise
        return segment

    @classmethod
    def open_existing(cls, directory: Path, base_offset: int, roll_jitter_ms: int = 0) -> "Segment":
        """Open a segment found on disk; its indexes load lazily (``needs_rebuild`` if they are unusable)."""
        log_path = directory / segment_file_name(base_offset, LOG_SUFFIX)
        segment = cls(directory, base_offset, os.stat(log_path).st_size, roll_jitter_ms)
        try:
            segment.index = OffsetIndex.open_lazily(segment.path_for(INDEX_SUFFIX), base_offset)
            segment.time_index = TimeIndex.open_lazily(segment.path_for(TIME_INDEX_SUFFIX), base_offset)
        except CorruptIndex:
            segment.index = OffsetIndex(segment.path_for(INDEX_SUFFIX), base_offset)
            segment.time_index = TimeIndex(segment.path_for(TIME_INDEX_SUFFIX), base_offset)
            segment.needs_rebuild = True
        return segment

    def path_for(self, suffix: str) -> Path:
        return self.directory / segment_file_name(self.base_offset, suffix)

    @property
    def fd(self) -> int:
        """The ``.log`` descriptor, opened if needed; valid until another segment file is opened.

        Use ``pin()`` to hold it longer (across a yield, or in a FileSlice).
        """
        return self._file.fd

    def pin(self) -> Pin:
        return self._file.pin()

    def close(self) -> None:
        """Close the descriptor (when the last pin goes, if pinned)."""
        self._file.close()

    def delete_files(self) -> None:
        """Unlink the files. A pinned descriptor keeps the data readable for fetches still in flight."""
        self.deleted = True
        self.unlink_files()

    def unlink_files(self) -> None:
        """Unlink the files, nothing else (any thread: it touches no state of the segment)."""
        for suffix in SEGMENT_SUFFIXES:
            self.path_for(suffix).unlink(missing_ok=True)

    def detach(self, closer: Callable[[int], None] | None = None) -> int:
        """Mark deleted and hand over the ``.log`` descriptor to close (-1 if none or pinned: then closed at
        the last unpin, through ``closer`` if given): see LazyFile.detach."""
        self.deleted = True
        return self._file.detach(closer)

    # -- indexes and recovery ----------------------------------------------------------------------------

    def ensure_indexes(self, index_interval_bytes: int) -> None:
        """Load the indexes from disk, rebuilding them from the log if they are missing or corrupt."""
        if self.index.loaded and self.time_index.loaded:
            return
        try:
            if self.needs_rebuild:
                raise CorruptIndex("flagged at open")
            self.index.load(self.size)
            self.time_index.load(self.size)
        except CorruptIndex:
            self.scan(index_interval_bytes, verify=False)

    def scan(
        self,
        index_interval_bytes: int,
        *,
        verify: bool,
        on_batch: Callable[[BatchHeader], None] | None = None,
    ) -> int:
        """Rebuild indexes, max timestamp and next offset from the log; returns the valid byte count.

        Stops at the first batch that is malformed, fails its CRC (with ``verify``), or whose offsets do not
        follow on: what lies beyond is a torn or corrupt tail.
        """
        self.index.reset()
        self.time_index.reset()
        self.needs_rebuild = False
        size = os.fstat(self.fd).st_size
        valid = 0
        last_indexed = 0
        max_ts, max_ts_offset = -1, self.base_offset
        next_offset = self.base_offset
        stop = ""
        if size:
            with mmap.mmap(self.fd, size, access=mmap.ACCESS_READ) as view:
                while valid < size:
                    try:
                        header = read_header(view, valid)
                    except InvalidRecordBatch as exc:
                        stop = f"malformed or torn batch ({exc})"
                        break
                    if verify and not crc_matches(view, header):
                        stop = f"CRC mismatch in the batch of offsets {header.base_offset}-{header.last_offset}"
                        break
                    if header.base_offset < next_offset or header.last_offset - self.base_offset > INT32_MAX:
                        stop = f"batch offset {header.base_offset} does not follow {next_offset - 1}"
                        break
                    if header.max_timestamp > max_ts:
                        max_ts, max_ts_offset = header.max_timestamp, header.last_offset
                    if valid - last_indexed > index_interval_bytes:
                        self.index.append(header.last_offset, valid)
                        self.time_index.maybe_append(max_ts, max_ts_offset)
                        last_indexed = valid
                    valid += header.size
                    next_offset = header.next_offset
                    if on_batch is not None:
                        on_batch(header)
        self.time_index.maybe_append(max_ts, max_ts_offset)
        self.size = valid
        self.next_offset = next_offset
        self._max_timestamp = (max_ts, max_ts_offset)
        self._bytes_since_index_entry = valid - last_indexed
        self._scan_stop = stop
        return valid

    def recover(
        self, index_interval_bytes: int, on_batch: Callable[[BatchHeader], None] | None = None
    ) -> RecoveryCut | None:
        """Validate every batch (CRC included), rebuild the indexes and cut a bad tail; what was cut, if any."""
        fd = self.fd
        on_disk = os.fstat(fd).st_size
        valid = self.scan(index_interval_bytes, verify=True, on_batch=on_batch)
        self.rolling_base_ms = None
        if valid == on_disk:
            return None
        last_cut = last_offset_in(fd, valid, on_disk)
        cut = RecoveryCut(on_disk - valid, valid, self.next_offset, last_cut, self._scan_stop)
        os.ftruncate(fd, valid)
        return cut

    def load_tail(self, index_interval_bytes: int) -> None:
        """Make the segment ready to be active: indexes in memory, and after a clean shutdown the next offset
        and max timestamp, found by walking the batches after the last index entry.

        Raises InvalidRecordBatch if the tail is not whole batches (the caller then recovers the segment).
        """
        self.ensure_indexes(index_interval_bytes)
        if os.fstat(self.fd).st_size != self.size:  # a rebuild stopped short of the file's end
            raise InvalidRecordBatch(f"{self.log_path} has bytes after its last whole batch")
        if self.next_offset is not None:
            return
        _, position = self.index.last_entry()
        next_offset = self.base_offset
        max_ts, max_ts_offset = self.max_timestamp_and_offset()
        for header in iter_file_headers(self.fd, position, self.size):
            next_offset = header.next_offset
            if header.max_timestamp > max_ts:
                max_ts, max_ts_offset = header.max_timestamp, header.last_offset
        self.next_offset = next_offset
        self._max_timestamp = (max_ts, max_ts_offset)
        self._bytes_since_index_entry = self.size - position

    def first_batch_timestamp(self) -> int | None:
        """Max timestamp of the first batch (Kafka's segment.ms clock after a restart); None if empty."""
        if self.size == 0:
            return None
        return peek_header(os.pread(self.fd, BATCH_HEADER_SIZE, 0), 0, 0).max_timestamp

    def time_waited_for_roll(self, now_ms: int, timestamp: int) -> int:
        """Kafka's timeWaitedForRoll, for an append whose largest timestamp is ``timestamp``: that timestamp
        minus the first batch's, or, when the first batch has no timestamp, the wall-clock time since the
        segment was created (or opened)."""
        if self.rolling_base_ms is None and self.size:
            self.rolling_base_ms = self.first_batch_timestamp()
        base = -1 if self.rolling_base_ms is None else self.rolling_base_ms
        return timestamp - base if base >= 0 else now_ms - self.created_ms

    # -- appends -----------------------------------------------------------------------------------------

    def append(self, buf: bytearray, headers: list[BatchHeader], index_interval_bytes: int) -> None:
        """Write ``buf`` (whole batches, offsets assigned; header positions are relative to ``buf``) in one write.

        On a failed write the file is cut back, so the segment is unchanged.
        """
        start = self.size
        fd = self.fd
        try:
            written = os.pwrite(fd, buf, start)
            while written < len(buf):
                written += os.pwrite(fd, memoryview(buf)[written:], start + written)
        except BaseException:
            os.ftruncate(fd, start)
            raise
        max_ts, max_ts_offset = self.max_timestamp_and_offset()
        since = self._bytes_since_index_entry
        index, time_index = self.index, self.time_index
        for header in headers:
            if header.max_timestamp > max_ts:
                max_ts, max_ts_offset = header.max_timestamp, header.last_offset
            if since > index_interval_bytes:
                index.append(header.last_offset, start + header.position)
                time_index.maybe_append(max_ts, max_ts_offset)
                since = 0
            since += header.size
        self._bytes_since_index_entry = since
        self._max_timestamp = (max_ts, max_ts_offset)
        self.size = start + len(buf)
        self.next_offset = headers[-1].next_offset
        if start == 0:  # the segment.ms clock starts at the first append's largest timestamp (Kafka's rule)
            self.rolling_base_ms = max(header.max_timestamp for header in headers)

    def seal(self) -> None:
        """The segment stops being active: its time index gets the final max timestamp (written at next flush)."""
        if self._max_timestamp is not None and self.time_index.loaded:
            self.time_index.maybe_append(*self._max_timestamp)

    def write_pending_indexes(self) -> list[Path]:
        """Write in-memory index entries to their files; returns the files that changed."""
        return [index.path for index in (self.index, self.time_index) if index.write_pending()]

    def is_index_full(self, segment_index_bytes: int) -> bool:
        return self.index.is_full(segment_index_bytes) or self.time_index.is_full(segment_index_bytes)

    # -- reads -------------------------------------------------------------------------------------------

    def max_timestamp_and_offset(self) -> tuple[int, int]:
        """(largest batch max timestamp, last offset of the first batch carrying it); (-1, base) if none."""
        if self._max_timestamp is None:
            self._max_timestamp = self.time_index.last_entry()
        return self._max_timestamp

    def locate(self, offset: int, end: int, index_interval_bytes: int) -> BatchHeader | None:
        """Header (with file position) of the first batch whose last offset >= ``offset``, within ``end`` bytes."""
        self.ensure_indexes(index_interval_bytes)
        _, position = self.index.lookup(offset)
        for header in iter_file_headers(self.fd, position, end):
            if header.last_offset >= offset:
                return header
        return None

    def extend_run(self, position: int, budget_end: int, limit_offset: int, end: int) -> tuple[int, int | None]:
        """Grow a run of whole batches from batch boundary ``position``.

        Takes batches while they end at or before ``budget_end`` and their last offset is below
        ``limit_offset``. Returns (end of run, refused) where ``refused`` is the base offset of the batch that
        was refused (the read must not continue into the next segment), None if the run reached ``end``.
        Jumps ahead with the offset index, so it walks at most about one index interval of headers.
        """
        budget_end = min(budget_end, end)
        _, jump_to = self.index.boundary_before(budget_end, limit_offset)
        if jump_to > position:
            position = jump_to
        for header in iter_file_headers(self.fd, position, end):
            if header.last_offset >= limit_offset or header.position + header.size > budget_end:
                return position, header.base_offset
            position = header.position + header.size
        return position, None

    def iter_batches(self, position: int, end: int, chunk: int = 1 << 20) -> Iterator[tuple[BatchHeader, bytes]]:
        """(header, batch bytes) for each batch from ``position`` to ``end``; header positions are 0 (in the bytes)."""
        with self.pin():
            yield from self._iter_batches(position, end, chunk)

    def _iter_batches(self, position: int, end: int, chunk: int) -> Iterator[tuple[BatchHeader, bytes]]:
        while position < end:
            buf = pread_exactly(self.fd, min(chunk, end - position), position)
            at = 0
            while len(buf) - at >= BATCH_HEADER_SIZE:
                size = peek_header(buf, at, position + at).size
                if at + size > len(buf):
                    if at:
                        break  # read the rest of this batch with the next chunk
                    if position + size > end:
                        raise InvalidRecordBatch(f"batch at file position {position} runs past {end}")
                    buf = pread_exactly(self.fd, size, position)  # one batch bigger than a chunk
                batch = buf[at : at + size]
                yield read_header(batch, 0), batch
                at += size
            if at == 0:
                raise InvalidRecordBatch(f"truncated batch at file position {position}")
            position += at

    def truncate_to(self, offset: int, index_interval_bytes: int) -> int:
        """Cut the segment before the batch holding ``offset``; returns bytes removed."""
        header = self.locate(offset, self.size, index_interval_bytes)
        cut = self.size if header is None else header.position
        on_disk = os.fstat(self.fd).st_size
        if cut == on_disk:
            return 0
        os.ftruncate(self.fd, cut)
        self.size = cut
        self.index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        # Recompute what the truncated tail may have carried: the max timestamp and the index spacing.
        max_ts, max_ts_offset = self.time_index.last_entry()
        _, position = self.index.lookup(max_ts_offset)
        next_offset = self.base_offset
        for walked in iter_file_headers(self.fd, position, self.size):
            next_offset = walked.next_offset
            if walked.max_timestamp > max_ts:
                max_ts, max_ts_offset = walked.max_timestamp, walked.last_offset
        self._max_timestamp = (max_ts, max_ts_offset)
        self.next_offset = next_offset if self.size else self.base_offset
        self._bytes_since_index_entry = self.size - self.index.last_entry()[1]
        self.rolling_base_ms = None
        if self.size == 0:  # emptied: its segment.ms clock starts again (Kafka's truncateTo)
            self.created_ms = int(time.time() * 1000)
        return on_disk - cut

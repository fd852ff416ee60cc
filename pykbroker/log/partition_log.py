"""The log of one partition: ordered segments in ``<data-dir>/<topic>-<partition>/``, Kafka's layout and rules.

Everything here runs on the event loop thread except ``FlushJob.run`` (fsyncs by path, one descriptor at
a time), which the LogManager may run in a worker thread. Appends and reads are therefore atomic to each
other.
"""

from __future__ import annotations

import logging
import os
import time
from bisect import bisect_right, insort
from dataclasses import dataclass, field
from pathlib import Path
from functools import partial
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from pykbroker.log.config import LogConfig
from pykbroker.log.errors import OffsetOutOfRange, RecordBatchTooLarge, RecordTooLarge, UnexpectedAppendOffset
from pykbroker.log.checkpoint import CorruptCheckpoint
from pykbroker.log.files import Pin, shared_budget
from pykbroker.log.leader_epoch import LeaderEpochCache
from pykbroker.log.producer_state import CompletedTxn, CorruptSnapshot, ProducerStateManager
from pykbroker.log.txn_index import TXN_INDEX_SUFFIX, AbortedTxn, TransactionIndex, TxnIndexEntry
from pykbroker.log.segment import (
    INDEX_SUFFIX,
    INT32_MAX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    SEGMENT_SUFFIXES,
    RecoveryCut,
    Segment,
    iter_file_headers,
    last_offset_in,
    parse_segment_file_name,
    pread_exactly,
    segment_file_name,
)
from pykbroker.protocol.control_records import Marker, marker_batch, read_marker
from pykbroker.protocol.records import (
    BatchHeader,
    InvalidRecordBatch,
    read_header,
    read_records,
    set_base_offset,
    set_max_timestamp,
    set_partition_leader_epoch,
    validate_batches,
    validate_client_records,
)

if TYPE_CHECKING:
    from pykbroker.log.cleaner import CleanedSegment

log = logging.getLogger(__name__)

FSYNC_POLICIES = ("always", "interval", "never")
# Files Kafka (or an interrupted run of ours) may leave behind mid-operation; none holds needed data.
LEFTOVER_SUFFIXES = (".tmp", ".deleted", ".cleaned", ".swap")
SNAPSHOT_SUFFIX = ".snapshot"  # <20-digit offset>.snapshot: the producer state as of that offset (Kafka's file)
# Producer snapshots kept: the newest ones (a follower's truncation reloads from one at or below its new end)
# and the newest one at or below the recovery point (what a start after a crash may use).
MAX_SNAPSHOTS = 3
# A flush also snapshots the producer state once this much was appended since the last snapshot: a segment
# (1 GiB by default) of small batches would otherwise be replayed whole after a crash or a follower's
# truncation, on the event loop. 16 MiB of the smallest batches is about 250,000 headers.
SNAPSHOT_INTERVAL_BYTES = 16 << 20


def log_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_log_dir_name(name: str) -> tuple[str, int] | None:
    """(topic, partition) from ``<topic>-<partition>``; None for anything else (``*-delete``, ``*-future``...)."""
    topic, dash, partition = name.rpartition("-")
    if not dash or not topic or not partition.isdigit():
        return None
    return topic, int(partition)


def run_file_work(work: Iterable[Callable[[], None]], *, ignore_errors: bool = False) -> None:
    """Run deferred file work (``PartitionLog.take_file_work``) in order, all of it even when one part fails
    (descriptors must close); the first OSError is raised at the end unless ``ignore_errors``."""
    failure: OSError | None = None
    for job in work:
        try:
            job()
        except OSError as exc:
            failure = failure or exc
    if failure is not None and not ignore_errors:
        raise failure


def _unlink_all(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


@dataclass(frozen=True)
class FileSlice:
    """A byte range of a segment file that ends at a batch boundary, read with ``pread`` on the segment's
    descriptor when the response is written.

    The slice pins that descriptor: it stays open (even if retention or a topic deletion unlinks the file
    meanwhile) for as long as the slice is referenced, and closes when the last pin goes if the segment was
    closed meanwhile. Keep the slice, not just its ``fd``, until the bytes are sent.
    """

    path: Path
    position: int
    length: int
    fd: int = field(compare=False, repr=False)
    pin: Pin = field(compare=False, repr=False)

    @classmethod
    def of(cls, segment: Segment, position: int, length: int) -> "FileSlice":
        pin = segment.pin()
        return cls(segment.log_path, position, length, pin.fd, pin)

    def chunks(self, size: int) -> Iterator[bytes]:
        """The slice's bytes, at most ``size`` at a time."""
        position, end = self.position, self.position + self.length
        while position < end:
            chunk = os.pread(self.fd, min(size, end - position), position)
            if not chunk:
                raise OSError(f"{self.path} ends at {position}, before the {end} bytes being sent")
            position += len(chunk)
            yield chunk


@dataclass
class ReadResult:
    slices: list[FileSlice]
    # No offset at or past this one is in the slices: the first offset of the batch after them (or the read's
    # bound when the read reached it), Kafka's fetch upper bound for the aborted transactions it collects.
    end_offset: int = -1

    def read_bytes(self) -> bytes:
        """The slices' bytes, concatenated (tests and tools; a fetch response sends them chunk by chunk)."""
        return b"".join(chunk for piece in self.slices for chunk in piece.chunks(max(piece.length, 1)))

    @property
    def size(self) -> int:
        return sum(piece.length for piece in self.slices)


@dataclass(frozen=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time_ms: int  # -1 unless the topic uses LogAppendTime
    log_start_offset: int
    headers: list[BatchHeader]  # after offset assignment; positions are within the appended records buffer


@dataclass
class FlushJob:
    """What one flush must make durable: files by path, so it is safe to fsync them off the loop.

    Each file is opened, fsynced and closed in turn, so a flush of thousands of segments (after recovery,
    or after many rolls) holds one descriptor. A file deleted or renamed meanwhile (retention, topic
    deletion) needs no fsync and is skipped.
    """

    paths: list[Path]
    target_offset: int
    segments: list[Segment]
    directory_changed: bool
    truncations: int
    snapshots: list[int] = field(default_factory=list)  # offsets of the producer snapshots written since the last flush

    def run(self) -> None:
        for path in self.paths:
            fsync_path(path)


def fsync_path(path: Path) -> None:
    """fsync a file or directory by path, holding one descriptor for the call; a missing one is skipped."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PartitionLog:
    def __init__(self, directory: Path, topic: str, partition: int, config: LogConfig, fsync: str) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {FSYNC_POLICIES}, not {fsync!r}")
        self.directory = directory
        self.topic = topic
        self.partition = partition
        self._config = config
        self._fsync = fsync
        self._segments: list[Segment] = []
        self._bases: list[int] = []  # segment base offsets, for bisect
        self._log_start_offset = 0
        self._log_end_offset = 0
        self._recovery_point = 0
        self._epochs = LeaderEpochCache(directory / LeaderEpochCache.FILE_NAME)
        self._dirty: set[Segment] = set()  # appended to since the last flush
        self._directory_changed = False  # segment files created or deleted since the last flush
        self._truncations = 0
        # Set by the log manager: called with the offset of each truncation (the cleaner lowers its checkpoint).
        self.on_truncate: Callable[[int], None] | None = None
        self._index_write_failed = False  # the last flush could not write index entries (warned once)
        self._closed = False
        # Closes the descriptor of a segment deleted while a read held it, when that read lets go (usually on
        # the event loop): LogManager sets one that queues it to its I/O thread; None closes at once.
        self.close_later: Callable[[int], None] | None = None
        # File work deferred to the log manager's I/O thread (unlinks and closes of deleted segments, the
        # leader-epoch checkpoint): ``take_file_work``, run in order by ``run_file_work``.
        self._file_work: list[Callable[[], None]] = []
        self.rolled_since_flush = False  # lets a "never" fsync policy still flush at rolls, as Kafka does
        # Producer state (idempotence and transactions): checked and updated by the Partition that owns the log.
        self.producer_state = ProducerStateManager()
        # Transaction indexes (.txnindex) of the segments that have any, by segment base offset.
        self._txn_indexes: dict[int, TransactionIndex] = {}
        # Producer-state snapshots present (offsets, ascending), those written since the last flush (fsynced by
        # it), whether the producer state covers the log (loaded: only then are snapshots written), the
        # recovery point the log was opened with, and how many batches the last load replayed.
        self._snapshots: list[int] = []
        self._unsynced_snapshots: list[int] = []
        self._appended_since_snapshot = 0  # bytes
        self._producer_state_loaded = False
        self._opened_recovery_point = 0
        self.producer_state_replayed = 0
        # The first marker whose transaction-index entry could not be written (disk full): no snapshot above
        # it is written, so a restart's replay passes the marker and writes the entry.
        self._unindexed_marker: int | None = None
        # The first batch written to the log whose append then failed (an fdatasync error): the producer state
        # may miss it, so no snapshot above it is written until a reload replays past it.
        self._state_gap: int | None = None

    # -- opening and recovery ----------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path,
        config: LogConfig,
        *,
        fsync: str = "interval",
        recovery_point: int = 0,
        clean_shutdown: bool = False,
        log_start_offset: int | None = None,
    ) -> "PartitionLog":
        """Open (creating if needed) and recover the log in ``directory``.

        After an unclean shutdown every segment that may hold offsets >= ``recovery_point`` is verified batch
        by batch (CRC included) and cut at the first torn or corrupt batch; later segments are then dropped.
        After a clean one only the active segment's tail is walked. Missing or corrupt indexes are rebuilt
        either way. ``log_start_offset`` is the checkpointed start (it may lie inside the first segment).
        """
        parsed = parse_log_dir_name(directory.name)
        if parsed is None:
            raise ValueError(f"{directory.name!r} is not a <topic>-<partition> directory name")
        directory.mkdir(parents=True, exist_ok=True)
        partition_log = cls(directory, parsed[0], parsed[1], config, fsync)
        partition_log._load(recovery_point, clean_shutdown, log_start_offset)
        return partition_log

    def _load(self, recovery_point: int, clean_shutdown: bool, log_start_offset: int | None) -> None:
        interval = self._config.index_interval_bytes
        bases = self._clean_directory()
        segments = [Segment.open_existing(self.directory, base, self._config.random_segment_jitter()) for base in bases]

        epoch_file_usable = (self.directory / LeaderEpochCache.FILE_NAME).exists()
        try:
            self._epochs = LeaderEpochCache.load(self.directory)
        except CorruptCheckpoint:
            epoch_file_usable = False
        note_epoch = self._epoch_recorder()

        recovered: list[Segment] = []
        first_unflushed = len(segments) if clean_shutdown else max(bisect_right(bases, recovery_point) - 1, 0)
        for segment in segments[:first_unflushed]:
            if segment.needs_rebuild:
                self._report_cut(segment, segment.recover(interval, note_epoch), [])
                recovered.append(segment)
        position = first_unflushed
        dropped_after_corruption = False
        while position < len(segments):
            segment = segments[position]
            cut = segment.recover(interval, note_epoch)
            recovered.append(segment)
            if cut:  # what follows a corrupt batch cannot be trusted
                later = segments[position + 1 :]
                self._report_cut(segment, cut, later)
                for dropped in later:
                    dropped.close()
                    dropped.delete_files()
                dropped_after_corruption = bool(later)
                del segments[position + 1 :]
            position += 1

        if not segments:
            segments.append(Segment.create(self.directory, max(log_start_offset or 0, 0), self._config.random_segment_jitter()))
            self._directory_changed = True
        active = segments[-1]
        try:
            active.load_tail(interval)  # appends need its indexes in memory
        except InvalidRecordBatch:
            self._report_cut(active, active.recover(interval, note_epoch), [])
            recovered.append(active)

        self._segments = segments
        self._bases = [segment.base_offset for segment in segments]
        self._log_end_offset = active.next_offset
        self._log_start_offset = max(log_start_offset or 0, segments[0].base_offset)
        self._load_snapshot_list()
        if self._log_start_offset > self._log_end_offset:
            self._truncate_fully_and_start_at(self._log_start_offset)

        if not epoch_file_usable:  # rebuild the whole cache from the batch headers
            self._epochs = LeaderEpochCache(self.directory / LeaderEpochCache.FILE_NAME)
            note_epoch = self._epoch_recorder()
            for segment in self._segments:
                for header in iter_file_headers(segment.fd, 0, segment.size):
                    note_epoch(header)
        self._epochs.truncate_from_end(self._log_end_offset)
        self._epochs.truncate_from_start(self._log_start_offset)
        if recovered or not epoch_file_usable:
            self._epochs.write()

        self._load_txn_indexes()

        self._dirty.update(segment for segment in recovered if segment in self._segments)
        if recovered or self._directory_changed:
            # As Kafka does, loading fsyncs nothing it recovered or created (thousands of small segments
            # took seconds of fsyncs): they are dirty, the next flush (off the event loop) makes them durable
            # and moves the recovery point, and a crash before that only recovers them again. Segments
            # deleted after a corrupt batch must not come back after a power loss: that is synced now.
            self._recovery_point = min(recovery_point, self._log_end_offset)
            self._directory_changed = True
            if dropped_after_corruption:
                fsync_path(self.directory)
        else:
            self._recovery_point = self._log_end_offset
        self._opened_recovery_point = self._recovery_point
        if not clean_shutdown:
            # Snapshots above the recovery point were not durable, and the transaction-index entries of the
            # markers below them may be lost: a later run must replay those markers again, so they go now (a
            # flush of this run moving the recovery point must not make them usable).
            self._delete_snapshots(lambda offset: offset > self._recovery_point)

    def _load_txn_indexes(self) -> None:
        """Load the segments' .txnindex files; entries past the log end (a recovery cut their markers) go, and
        a file whose segment is gone is deleted. Entries the log holds but a file lacks (a crash between the
        marker and the index write) come back when the owner replays the log (``index_aborted``)."""
        bases = set(self._bases)
        self._txn_indexes = {}
        for name in os.listdir(self.directory):
            if not name.endswith(TXN_INDEX_SUFFIX):
                continue
            base = parse_segment_file_name(name.removesuffix(TXN_INDEX_SUFFIX) + ".log")
            path = self.directory / name
            if base is None or base not in bases:
                path.unlink(missing_ok=True)
                continue
            index = TransactionIndex.load(path)
            index.truncate_to(self._log_end_offset)
            if index.entries:
                self._txn_indexes[base] = index

    def _report_cut(self, segment: Segment, cut: RecoveryCut | None, dropped: list[Segment]) -> None:
        """A WARN naming the partition, the offsets and the bytes a recovery cut (as Kafka logs it)."""
        if cut is None:
            return
        last = cut.last_offset
        dropped_bytes = sum(later.size for later in dropped)
        if dropped:
            last_dropped = last_offset_in(dropped[-1].fd, 0, dropped[-1].size)
            last = last if last_dropped is None else last_dropped
        offsets = f"offsets {cut.first_offset}-{last}" if last is not None else f"offsets from {cut.first_offset}"
        log.warning(
            "%s-%d: recovery truncated the log to end offset %d, cutting %s, %d bytes: %s at byte %d of %s%s",
            self.topic, self.partition, cut.first_offset, offsets, cut.bytes_cut + dropped_bytes, cut.reason,
            cut.position, segment.log_path.name,
            f"; {len(dropped)} later segment(s) ({dropped_bytes} bytes) deleted" if dropped else "",
        )

    def _clean_directory(self) -> list[int]:
        """Complete interrupted cleaner swaps, remove leftovers and orphan index files; return the base
        offsets of the segments present."""
        self._complete_swaps()
        bases = []
        names = os.listdir(self.directory)
        for name in names:
            base = parse_segment_file_name(name)
            if base is not None:
                bases.append(base)
        logs = {f"{base:020d}" for base in bases}
        for name in names:
            stem = name.partition(".")[0]
            leftover = name.endswith(LEFTOVER_SUFFIXES)
            orphan = any(name.endswith(suffix) for suffix in SEGMENT_SUFFIXES[1:]) and stem not in logs
            if leftover or orphan:
                (self.directory / name).unlink(missing_ok=True)
        return sorted(bases)

    def _complete_swaps(self) -> None:
        """Kafka's LogLoader rule for ``.swap`` files: a ``<base>.log.swap`` is a cleaned segment whose swap a
        crash interrupted after it became durable; the segments it replaces (bases in [base, end), end from
        ``<base>.end.swap``, else the swap's last batch) are deleted and the swap files renamed into place.
        ``.cleaned`` files (a swap that never started) are deleted with the other leftovers."""
        from pykbroker.log.cleaner import END_SUFFIX, SWAP_SUFFIX

        names = os.listdir(self.directory)
        bases = sorted(b for name in names if (b := parse_segment_file_name(name)) is not None)
        for name in names:
            if not name.endswith(LOG_SUFFIX + SWAP_SUFFIX):
                continue
            stem = name.partition(".")[0]
            if len(stem) != 20 or not stem.isdigit():
                continue
            base = int(stem)
            swap_log = self.directory / name
            end_path = self.directory / (segment_file_name(base, END_SUFFIX) + SWAP_SUFFIX)
            try:
                end = int(end_path.read_text().strip())
            except (FileNotFoundError, ValueError):
                fd = os.open(swap_log, os.O_RDONLY)
                try:
                    last = last_offset_in(fd, 0, os.fstat(fd).st_size)
                finally:
                    os.close(fd)
                end = base + 1 if last is None else last + 1
            for old in bases:
                if base < old < end:
                    for suffix in SEGMENT_SUFFIXES:
                        (self.directory / segment_file_name(old, suffix)).unlink(missing_ok=True)
            for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):  # rebuilt from the log: the pair may be mixed
                (self.directory / (segment_file_name(base, suffix) + SWAP_SUFFIX)).unlink(missing_ok=True)
                (self.directory / segment_file_name(base, suffix)).unlink(missing_ok=True)
            os.rename(swap_log, self.directory / segment_file_name(base, LOG_SUFFIX))
            end_path.unlink(missing_ok=True)
            log.warning("%s-%d: completed the log cleaner's interrupted swap of the segments at offsets %d-%d",
                        self.topic, self.partition, base, end - 1)
            self._directory_changed = True

    def _epoch_recorder(self) -> Callable[[BatchHeader], None]:
        """Records epochs met while loading; the cache is written once, at the end of the load."""
        epochs = self._epochs

        def note(header: BatchHeader) -> None:
            epoch = header.partition_leader_epoch
            if epoch >= 0 and epoch > epochs.latest_epoch:
                epochs.assign(epoch, header.base_offset, persist=False)

        return note

    # -- properties --------------------------------------------------------------------------------------

    @property
    def config(self) -> LogConfig:
        return self._config

    @config.setter
    def config(self, config: LogConfig) -> None:
        self._config = config

    @property
    def closed(self) -> bool:
        """Closed or abandoned (its topic deleted, or the broker shutting down)."""
        return self._closed

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        """The next offset to assign."""
        return self._log_end_offset

    @property
    def recovery_point(self) -> int:
        """Everything below this offset is known to be on disk (fsynced)."""
        return self._recovery_point

    @property
    def size_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    @property
    def segment_base_offsets(self) -> list[int]:
        return list(self._bases)

    @property
    def latest_epoch(self) -> int:
        return self._epochs.latest_epoch

    @property
    def leader_epochs(self) -> list[tuple[int, int]]:
        """The leader-epoch cache: (epoch, start offset) pairs."""
        return self._epochs.entries

    @property
    def _active(self) -> Segment:
        return self._segments[-1]

    # -- transactions ------------------------------------------------------------------------------------

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest transaction that is open or whose marker the high-water mark has
        not passed yet (Kafka's firstUnstableOffset); None when there is none. ``Partition.last_stable_offset``
        forgets the ended transactions below the HWM as it asks. Never below the log start offset (Kafka's
        maybeIncrementFirstUnstableOffset)."""
        first = self.producer_state.first_unstable_offset()
        return first if first is None else max(first, self._log_start_offset)

    def aborted_ranges(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """The aborted transactions overlapping [start_offset, end_offset): last offset >= start and first
        offset < end, from the transaction indexes of the segment holding ``start_offset`` onward (Kafka's
        collectAbortedTransactions), in marker order."""
        indexes = self._txn_indexes
        out: list[AbortedTxn] = []
        if not indexes:
            return out
        first_base = self._bases[max(bisect_right(self._bases, start_offset) - 1, 0)]
        for base in sorted(b for b in indexes if b >= first_base):
            if indexes[base].collect(start_offset, end_offset, out):
                break
        return out

    def index_aborted(self, txn: CompletedTxn, last_stable_offset: int) -> None:
        """Add an aborted transaction to the transaction index of the segment holding its marker (nothing
        if it is there already: replaying the log after a restart finds the markers again)."""
        if not txn.is_aborted or txn.last_offset < self._log_start_offset or txn.last_offset >= self._log_end_offset:
            return
        base = self._bases[max(bisect_right(self._bases, txn.last_offset) - 1, 0)]
        index = self._txn_indexes.get(base)
        if index is None:
            index = TransactionIndex(self.directory / segment_file_name(base, TXN_INDEX_SUFFIX))
        elif index.contains(txn.producer_id, txn.first_offset, txn.last_offset):
            return
        self._txn_indexes[base] = index
        self._dirty.add(self._segments[bisect_right(self._bases, base) - 1])
        try:
            index.append(TxnIndexEntry(txn.producer_id, txn.first_offset, txn.last_offset, last_stable_offset))
        except OSError as exc:  # the marker is in the log: a restart's replay writes the entry again
            if self._unindexed_marker is None or txn.last_offset < self._unindexed_marker:
                self._unindexed_marker = txn.last_offset
            log.warning("%s-%d: could not write %s (%s); fetches use the entry, a restart rewrites it",
                        self.topic, self.partition, index.path.name, exc)

    def append_marker(self, *, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                      leader_epoch: int, now_ms: int) -> AppendResult:
        """Append a COMMIT/ABORT control batch as leader (the caller checked it with the producer state)."""
        buf = marker_batch(producer_id=producer_id, producer_epoch=producer_epoch, commit=commit,
                           coordinator_epoch=coordinator_epoch, timestamp_ms=now_ms, partition_leader_epoch=leader_epoch)
        set_base_offset(buf, 0, self._log_end_offset)
        header = read_header(buf, 0)
        self._write(buf, [header], now_ms)
        return AppendResult(header.base_offset, header.last_offset, -1, self._log_start_offset, [header])

    def headers_and_markers(self, start_offset: int = 0) -> Iterator[tuple[BatchHeader, Marker | None]]:
        """``headers`` with, for each control batch, its COMMIT/ABORT marker (read from the file: control
        batches are tiny); what a producer-state replay needs."""
        for fd, header in self._headers_with_fd(start_offset):
            marker = None
            if header.is_control:
                data = pread_exactly(fd, header.size, header.position)
                marker = read_marker(data, read_header(data, 0))
            yield header, marker

    def _truncate_txn_indexes(self, offset: int) -> None:
        """Drop transaction-index entries whose marker is at or after ``offset`` (log truncation)."""
        for base in list(self._txn_indexes):
            index = self._txn_indexes[base]
            if base >= offset:
                index.delete()
                del self._txn_indexes[base]
            elif index.truncate_to(offset) and not index.entries:
                del self._txn_indexes[base]

    # -- producer-state snapshots (Kafka's ProducerStateManager snapshot files) ----------------------------

    def _snapshot_path(self, offset: int) -> Path:
        return self.directory / segment_file_name(offset, SNAPSHOT_SUFFIX)

    def _load_snapshot_list(self) -> None:
        """Find the snapshot files; those past the log end (a recovery cut the log they describe) or below its
        start are deleted, as Kafka's truncateAndReload does."""
        found = []
        for name in os.listdir(self.directory):
            if name.endswith(SNAPSHOT_SUFFIX):
                stem = name.removesuffix(SNAPSHOT_SUFFIX)
                if len(stem) == 20 and stem.isdigit():
                    found.append(int(stem))
        self._snapshots = sorted(found)
        self._delete_snapshots(lambda offset: offset > self._log_end_offset or offset < self._log_start_offset)

    @property
    def snapshot_offsets(self) -> list[int]:
        return list(self._snapshots)

    def load_producer_state(self, high_watermark: int | None = None) -> int:
        """Load the producer state from the newest usable snapshot, then replay the batches after it (all of
        the log if there is none); aborted transactions met in the replay go to the transaction index again
        (entries a crash lost). Returns the offset the replay started from.

        A snapshot is usable at or above the log start and at or below the high-water mark (the ended
        transactions it cannot hold are those whose marker is still above the HWM) and, on the first load,
        the recovery point the log was opened with: below it the log and its transaction indexes were fsynced,
        so the replay from the snapshot re-indexes every aborted transaction a crash can have lost. One that
        is corrupt is logged, deleted and the next older one tried (one that cannot be read now, an I/O error,
        is skipped and kept). Until the replay has finished no snapshot is written: a load that fails half way
        leaves a state that must not be saved.
        """
        state = self.producer_state
        bound = self._log_end_offset if high_watermark is None else min(high_watermark, self._log_end_offset)
        if not self._producer_state_loaded:
            bound = min(bound, self._opened_recovery_point)
        self._producer_state_loaded = False
        start = self._log_start_offset
        loaded_from = None
        state.clear()
        for offset in reversed(self._snapshots):
            if offset > bound:
                continue
            if offset < self._log_start_offset:
                break
            path = self._snapshot_path(offset)
            try:
                state.load_snapshot(path.read_bytes(), offset, log_append_time=self._config.log_append_time)
            except (OSError, CorruptSnapshot) as exc:
                log.warning("%s-%d: ignoring producer snapshot %s (%s)", self.topic, self.partition, path.name, exc)
                if isinstance(exc, CorruptSnapshot):
                    self._delete_snapshots(lambda o, bad=offset: o == bad)
                continue
            start = loaded_from = offset
            break
        replayed = [0]

        def counted(items: Iterator[tuple[BatchHeader, Marker | None]]) -> Iterator[tuple[BatchHeader, Marker | None]]:
            for item in items:
                replayed[0] += 1
                yield item

        state.replay_with_markers(counted(self.headers_and_markers(start)), on_completed=self.index_aborted,
                                  stable_below=high_watermark)
        self.producer_state_replayed = replayed[0]
        self._producer_state_loaded = True
        if self._state_gap is not None and start <= self._state_gap:
            self._state_gap = None  # the replay passed the batch the state had missed
        if replayed[0]:
            log.info("%s-%d: producer state loaded from %s, %d batches replayed from offset %d", self.topic,
                     self.partition, "the snapshot" if loaded_from is not None else "the log", replayed[0], start)
        return start

    def take_producer_snapshot(self, offset: int | None = None) -> None:
        """Write the producer state as ``<offset>.snapshot`` (default: the log end), unless the state was never
        loaded (it would not describe the log) or that snapshot exists. Written to a temporary file and
        renamed, on this thread (a few thousand producers are a few hundred KB); the next flush fsyncs it (off
        the event loop) with the directory. A snapshot that a crash leaves torn fails its CRC and is skipped.
        A failure (disk full) is logged: a restart replays more of the log."""
        if not self._producer_state_loaded or self._closed:
            return
        offset = self._log_end_offset if offset is None else offset
        if offset in self._snapshots:
            self._appended_since_snapshot = 0
            return
        if any(ceiling is not None and offset > ceiling for ceiling in (self._unindexed_marker, self._state_gap)):
            return
        path = self._snapshot_path(offset)
        temp = path.with_name(path.name + ".tmp")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(self.producer_state.snapshot())
                while view:  # a short write (disk filling up) must not install a torn file
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(temp, path)
        except OSError as exc:
            log.warning("%s-%d: could not write producer snapshot %s (%s)", self.topic, self.partition, path.name, exc)
            temp.unlink(missing_ok=True)
            return
        insort(self._snapshots, offset)
        self._unsynced_snapshots.append(offset)
        self._appended_since_snapshot = 0
        self._directory_changed = True
        keep = set(self._snapshots[-MAX_SNAPSHOTS:])
        durable = [o for o in self._snapshots if o <= self._recovery_point and o not in self._unsynced_snapshots]
        if durable:
            keep.add(durable[-1])
        self._delete_snapshots(lambda o: o not in keep)

    def _rewrite_unindexed(self) -> None:
        """A transaction-index entry could not be written (disk full): each flush rewrites the indexes from
        the one holding it on (their entries are whole in memory) until that works, then snapshots may be
        taken above it again. Small files, and only after such a failure."""
        first = self._bases[max(bisect_right(self._bases, self._unindexed_marker) - 1, 0)]
        try:
            for base in sorted(b for b in self._txn_indexes if b >= first):
                self._txn_indexes[base].rewrite()
        except OSError:
            return  # still failing: the next flush tries again
        self._dirty.update(segment for segment in self._segments if segment.base_offset >= first)
        log.info("%s-%d: transaction index entries written again", self.topic, self.partition)
        self._unindexed_marker = None

    def maybe_take_interval_snapshot(self) -> None:
        """Snapshot the producer state at the log end once SNAPSHOT_INTERVAL_BYTES were appended since the last
        snapshot (each flush asks; with fsync=never, where only rolled logs are flushed, the upkeep asks too)."""
        if self._appended_since_snapshot >= SNAPSHOT_INTERVAL_BYTES:
            self.take_producer_snapshot()

    def _forget_below_log_start(self) -> None:
        """The log start moved: snapshots below it are unusable (Kafka deletes them), and a failed index entry
        or append below it no longer holds snapshots back (a replay from the log start would not see it either)."""
        start = self._log_start_offset
        self._delete_snapshots(lambda o: o < start)
        self._lift_snapshot_ceilings(lambda ceiling: ceiling < start)

    def _lift_snapshot_ceilings(self, gone: Callable[[int], bool]) -> None:
        """Forget the failed index entry and the failed append that hold snapshots back when ``gone`` says
        their offset left the log (truncated, or below the log start)."""
        if self._unindexed_marker is not None and gone(self._unindexed_marker):
            self._unindexed_marker = None
        if self._state_gap is not None and gone(self._state_gap):
            self._state_gap = None

    def _delete_snapshots(self, doomed: Callable[[int], bool]) -> None:
        """Delete the snapshot files whose offset ``doomed`` picks (tiny files: unlinked at once; the next flush
        fsyncs the directory, so a snapshot deleted for describing a truncated history stays deleted)."""
        for offset in [o for o in self._snapshots if doomed(o)]:
            self._snapshots.remove(offset)
            if offset in self._unsynced_snapshots:
                self._unsynced_snapshots.remove(offset)
            self._directory_changed = True
            try:
                self._snapshot_path(offset).unlink(missing_ok=True)
            except OSError as exc:
                log.warning("%s-%d: could not delete producer snapshot at %d (%s)", self.topic, self.partition, offset, exc)

    # -- appends -----------------------------------------------------------------------------------------

    def append(self, records: bytes | bytearray | memoryview, *, leader_epoch: int, now_ms: int,
               check_sequence: bool = True) -> AppendResult:
        """Append a producer's batches as leader: validate, assign offsets and epoch in place, write once.
        ``check_sequence`` False for the group coordinator's batches (no sequence numbers).

        Raises CorruptRecordBatch / InvalidRecordBatch (InvalidRecords, RecordErrors) / RecordTooLarge /
        RecordBatchTooLarge (the records larger than segment.bytes, Kafka's check before maybeRoll) before
        anything is written.
        """
        config = self._config
        headers = validate_batches(records)
        limit = config.max_message_bytes
        for header in headers:
            if header.size > limit:
                raise RecordTooLarge(f"batch of {header.size} bytes exceeds max.message.bytes {limit}")
        max_timestamps = validate_client_records(
            records,
            headers,
            now_ms=now_ms,
            log_append_time=config.log_append_time,
            timestamp_before_max_ms=config.message_timestamp_before_max_ms,
            timestamp_after_max_ms=config.message_timestamp_after_max_ms,
            check_sequence=check_sequence,
            null_keys_of=f"{self.topic}-{self.partition}" if config.compact else None,
        )
        buf = bytearray(records)
        log_append_time = self._config.log_append_time
        next_offset = self._log_end_offset
        for header, max_timestamp in zip(headers, max_timestamps):
            set_base_offset(buf, header.position, next_offset)
            set_partition_leader_epoch(buf, header.position, leader_epoch)
            if log_append_time:
                set_max_timestamp(buf, header.position, now_ms, log_append_time=True)
            elif header.max_timestamp != max_timestamp:  # the time index must not trust a wrong header
                set_max_timestamp(buf, header.position, max_timestamp)
            next_offset += header.last_offset_delta + 1
        assigned = [read_header(buf, header.position) for header in headers]
        self._check_fits_a_segment(len(buf))
        self._write(buf, assigned, now_ms)
        return AppendResult(
            base_offset=assigned[0].base_offset,
            last_offset=assigned[-1].last_offset,
            log_append_time_ms=now_ms if log_append_time else -1,
            log_start_offset=self._log_start_offset,
            headers=assigned,
        )

    def append_as_follower(self, records: bytes | bytearray | memoryview, *, now_ms: int | None = None) -> AppendResult:
        """Append batches that already carry offsets and epochs (replication), as they are.

        Raises UnexpectedAppendOffset if they start below the log end offset (Kafka allows a gap above it),
        RecordBatchTooLarge for a batch larger than segment.bytes (nothing written). Kafka's leader answers a
        fetch from one segment, so what its follower appends at once fits one (the topic's segment.bytes
        is theirs both); a read here may span segments, so a fetch larger than segment.bytes is written in
        runs of whole batches that each fit one, each asking for its roll as a fetch of Kafka's would.
        """
        headers = validate_batches(records)
        if headers[0].base_offset < self._log_end_offset:
            raise UnexpectedAppendOffset(headers[0].base_offset, self._log_end_offset)
        for previous, header in zip(headers, headers[1:]):
            if header.base_offset < previous.next_offset:
                raise InvalidRecordBatch(f"batch offsets go backwards at {header.base_offset}")
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if len(records) <= self._config.segment_bytes:
            self._write(records, headers, now)
        else:
            self._write_in_runs(memoryview(records), headers, now)
        return AppendResult(headers[0].base_offset, headers[-1].last_offset, -1, self._log_start_offset, headers)

    def _check_fits_a_segment(self, size: int) -> None:
        limit = self._config.segment_bytes
        if size > limit:
            raise RecordBatchTooLarge(f"Message batch size is {size} bytes in append to partition {self.topic}-"
                                      f"{self.partition}, which exceeds the maximum configured segment size of {limit}.")

    def _write_in_runs(self, view: memoryview, headers: list[BatchHeader], now_ms: int) -> None:
        """A follower's fetch larger than segment.bytes: consecutive batches, each run at most segment.bytes.
        A storage error after a first run leaves those batches in the log without their producer state (the
        caller replays nothing): no producer snapshot may record the state past them until a replay."""
        for header in headers:
            self._check_fits_a_segment(header.size)
        limit = self._config.segment_bytes
        runs: list[list[BatchHeader]] = [[]]
        size = 0
        for header in headers:
            if runs[-1] and size + header.size > limit:
                runs.append([])
                size = 0
            runs[-1].append(header)
            size += header.size
        for number, run in enumerate(runs):
            start = run[0].position
            try:
                self._write(view[start : run[-1].position + run[-1].size],
                            [header._replace(position=header.position - start) for header in run], now_ms)
            except BaseException:
                if number and (self._state_gap is None or headers[0].base_offset < self._state_gap):
                    self._state_gap = headers[0].base_offset
                raise

    def _write(self, buf, headers: list[BatchHeader], now_ms: int) -> None:
        segment = self._active
        if self._should_roll(segment, len(buf), headers, now_ms):
            segment = self._roll(headers[0].base_offset)
        segment.append(buf, headers, self._config.index_interval_bytes)
        self._appended_since_snapshot += len(buf)
        self._log_end_offset = headers[-1].next_offset
        self._dirty.add(segment)
        epochs = self._epochs
        for header in headers:
            epoch = header.partition_leader_epoch
            if epoch > epochs.latest_epoch:  # latest_epoch is -1 when empty, so this also skips epoch -1
                self._assign_epoch(epoch, header.base_offset)
        if self._fsync == "always":
            try:
                os.fdatasync(segment.fd)
            except OSError:
                # The batches are in the log but the caller fails the append and its producer state misses
                # them: no snapshot may record that state past them (a reload's replay puts them back).
                if self._state_gap is None or headers[0].base_offset < self._state_gap:
                    self._state_gap = headers[0].base_offset
                raise

    def assign_epoch_start(self, epoch: int, start_offset: int) -> None:
        """A new leader's epoch starts at ``start_offset`` (its log end) before anything is written in it, so
        OffsetForLeaderEpoch answers for it at once (Kafka's maybeAssignEpochStartOffset). Older epochs are ignored."""
        if epoch > self._epochs.latest_epoch:
            self._assign_epoch(epoch, start_offset)

    def _assign_epoch(self, epoch: int, start_offset: int) -> None:
        """Record a new leader epoch met in an append that is already written.

        The batch is in the log, so a failure to write the checkpoint (disk full) must not fail the append:
        the cache stays right in memory and the stale file is removed, so a restart rebuilds it from the
        batch headers. The next epoch change writes the file again.
        """
        try:
            self._epochs.assign(epoch, start_offset)
        except OSError as exc:
            log.warning("%s-%d: could not write %s (%s); it will be rebuilt from the log if the broker restarts",
                        self.topic, self.partition, self._epochs.path.name, exc)
            self._epochs.path.unlink(missing_ok=True)

    def _should_roll(self, segment: Segment, append_size: int, headers: list[BatchHeader], now_ms: int) -> bool:
        """Kafka's LogSegment.shouldRoll, asked by each append (leader's or follower's) before it writes: the
        active segment rolls only here, or when retention deletes every segment (``_delete_leading``).

        segment.ms (``max_segment_ms``: max.compaction.lag.ms when lower on a compacted topic) counts from the
        segment's first batch to the largest timestamp of this append (the records' own clock: CreateTime as
        the producer set it, the append time on LogAppendTime topics; the wall-clock time since the segment
        was created when the first batch has no timestamp), less the segment's jitter (drawn from
        segment.jitter.ms against segment.ms). A segment is never rolled by the clock alone: an idle one stays active (and so
        is never compacted) until the next append."""
        config = self._config
        if headers[-1].last_offset - segment.base_offset > INT32_MAX:
            return True
        if segment.size == 0:
            return False
        largest_timestamp = max(header.max_timestamp for header in headers)
        return (
            segment.size + append_size > config.segment_bytes
            or segment.time_waited_for_roll(now_ms, largest_timestamp) > config.max_segment_ms - segment.roll_jitter_ms
            or segment.is_index_full(config.segment_index_bytes)
        )

    def _roll(self, base_offset: int | None = None) -> Segment:
        """Start a new active segment at ``base_offset`` (default: the log end offset).

        The new segment's files are created first: if that fails (disk full) the log is unchanged.
        """
        base = self._log_end_offset if base_offset is None else base_offset
        old = self._active
        if old.size == 0 and old.base_offset == base:
            return old
        segment = Segment.create(self.directory, base, self._config.random_segment_jitter())
        if old.size == 0:
            self._segments.pop()
            self._bases.pop()
            self._retire([old])
        else:
            old.seal()
        self._segments.append(segment)
        self._bases.append(base)
        self._directory_changed = True
        self.rolled_since_flush = True
        self.take_producer_snapshot(base)  # Kafka's roll: the state as of the new segment's base
        return segment

    def roll(self) -> None:
        """Force a new active segment now (if the current one has data)."""
        self._roll()

    # -- reads -------------------------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, *, upper_bound: int | None = None, min_one: bool = True) -> ReadResult:
        """Whole batches from the one containing ``offset``, up to ``max_bytes`` and below ``upper_bound``.

        Stops before any batch whose last offset >= ``upper_bound`` (exclusive, e.g. the high-water mark;
        None = log end), and before a further segment when the descriptor budget has no room for another
        pinned file. With ``min_one`` the first batch is returned whole even if larger than max_bytes.
        Raises OffsetOutOfRange outside [log start, log end]; a closed log (its topic deleted) reads empty.
        """
        log_end = self._log_end_offset
        if offset < self._log_start_offset or offset > log_end:
            raise OffsetOutOfRange(offset, self._log_start_offset, log_end)
        limit = log_end if upper_bound is None else min(upper_bound, log_end)
        slices: list[FileSlice] = []
        if offset >= limit or self._closed:  # closed: deleted under a long poll that still holds the log
            return ReadResult(slices, offset)
        interval = self._config.index_interval_bytes
        remaining = max_bytes
        found_first = False
        end_offset = limit  # lowered to the first batch left out when the read stops before the bound
        for segment in self._segments[max(bisect_right(self._bases, offset) - 1, 0) :]:
            if segment.base_offset >= limit or (slices and not shared_budget.can_pin_more()):
                end_offset = min(segment.base_offset, limit)
                break  # (each slice pins a descriptor: a read over many tiny segments stops at the budget)
            end = segment.size
            if not found_first:
                first = segment.locate(offset, end, interval)
                if first is None:
                    continue  # the offset lies past this segment's data: look in the next one
                found_first = True
                if first.last_offset >= limit:
                    end_offset = offset
                    break
                start = first.position
                if first.size > remaining:
                    if min_one:
                        slices.append(FileSlice.of(segment, start, first.size))
                    end_offset = first.next_offset if min_one else offset
                    break
                run_end, refused = segment.extend_run(start + first.size, start + remaining, limit, end)
            else:
                start = 0
                segment.ensure_indexes(interval)
                run_end, refused = segment.extend_run(0, remaining, limit, end)
            if run_end > start:
                slices.append(FileSlice.of(segment, start, run_end - start))
                remaining -= run_end - start
            if refused is not None:
                end_offset = refused if slices else offset
                break
            if remaining <= 0:
                end_offset = min(end_offset, self._next_base_after(segment.base_offset))
                break
        return ReadResult(slices, end_offset)

    def _next_base_after(self, base_offset: int) -> int:
        """The base offset of the segment after the one at ``base_offset``; the log end if it is the last."""
        at = bisect_right(self._bases, base_offset)
        return self._bases[at] if at < len(self._bases) else self._log_end_offset

    def batches(self, start_offset: int = 0) -> Iterator[tuple[BatchHeader, bytes]]:
        """Every batch holding offsets >= ``start_offset`` up to the log end at the time of the call.

        Yields (header, whole batch bytes) with header.position == 0, so ``read_records(data, header)`` works.
        """
        log_end = self._log_end_offset
        progress = [start_offset]
        for segment, position in self._segments_from(start_offset, progress):
            for header, data in segment.iter_batches(position, segment.size):
                if header.base_offset >= log_end:
                    return
                if header.last_offset >= progress[0]:
                    progress[0] = header.next_offset
                    yield header, data

    def headers(self, start_offset: int = 0) -> Iterator[BatchHeader]:
        """Like ``batches`` but reads only the 61-byte headers (positions are within their segment files).

        The cheap way to rebuild state that lives in headers, such as producer ids and sequences.
        """
        for _, header in self._headers_with_fd(start_offset):
            yield header

    def _headers_with_fd(self, start_offset: int) -> Iterator[tuple[int, BatchHeader]]:
        """(descriptor of its segment, pinned while yielded; header) for ``headers``."""
        log_end = self._log_end_offset
        progress = [start_offset]
        for segment, position in self._segments_from(start_offset, progress):
            with segment.pin() as fd:
                for header in iter_file_headers(fd, position, segment.size):
                    if header.base_offset >= log_end:
                        return
                    if header.last_offset >= progress[0]:
                        progress[0] = header.next_offset
                        yield fd, header

    def _segments_from(self, start_offset: int, progress: list[int]) -> Iterator[tuple[Segment, int]]:
        """(segment, position to start reading) for the segments that may hold ``start_offset`` and later.

        ``progress[0]`` is the offset after the last one the caller read: the next segment is looked up
        in the current segment list each time, so segments deleted (retention) meanwhile are skipped, and
        segments the cleaner replaced meanwhile are continued in the segment that replaced them.
        """
        read: set[Segment] = set()
        while True:
            wanted = progress[0]
            slot = max(bisect_right(self._bases, wanted) - 1, 0)
            while slot < len(self._segments) and self._segments[slot] in read:  # read to its end: the next one
                slot += 1
            if slot >= len(self._segments):
                return
            segment = self._segments[slot]
            read.add(segment)
            if wanted > segment.base_offset:
                segment.ensure_indexes(self._config.index_interval_bytes)
                yield segment, segment.index.lookup(wanted)[1]
            else:
                yield segment, 0

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """ListOffsets by time: (timestamp, offset) of the first record at or after ``timestamp_ms``.

        Finds the first batch whose max timestamp >= ``timestamp_ms`` (time index, then offset index, then a
        header walk) and, as Kafka does, the first record in it with a timestamp >= ``timestamp_ms``. Batches
        the broker cannot decode (an unavailable codec) answer at batch granularity: (max timestamp, base
        offset). None if no record is that recent.
        """
        start = self._log_start_offset
        interval = self._config.index_interval_bytes
        for segment in self._segments:
            if segment.max_timestamp_and_offset()[0] < timestamp_ms:
                continue
            segment.ensure_indexes(interval)
            _, indexed_offset = segment.time_index.lookup(timestamp_ms)
            _, position = segment.index.lookup(max(indexed_offset, start))
            for header in iter_file_headers(segment.fd, position, segment.size):
                if header.max_timestamp >= timestamp_ms and header.last_offset >= start:
                    return self._first_record_at_or_after(segment, header, timestamp_ms)
        return None

    def _first_record_at_or_after(self, segment: Segment, header: BatchHeader, timestamp_ms: int) -> tuple[int, int]:
        start = self._log_start_offset
        batch_answer = (header.max_timestamp, max(header.base_offset, start))
        if header.log_append_time:  # every record carries the batch's append time
            return batch_answer
        data = pread_exactly(segment.fd, header.size, header.position)
        try:
            records = read_records(data, read_header(data, 0))
        except Exception:  # noqa: BLE001 - codecs raise their own error types; batch granularity still answers
            return batch_answer
        for record in records:
            if record.timestamp >= timestamp_ms and record.offset >= start:
                return record.timestamp, record.offset
        return batch_answer

    def max_timestamp_and_offset(self) -> tuple[int, int]:
        """ListOffsets -3: (max timestamp, last offset of the first batch carrying it); (-1, -1) if none."""
        best = (-1, -1)
        for segment in self._segments:
            timestamp, offset = segment.max_timestamp_and_offset()
            if timestamp > best[0]:
                best = (timestamp, offset)
        return best

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (largest epoch <= ``epoch``, its end offset); see LeaderEpochCache.end_offset_for."""
        return self._epochs.end_offset_for(epoch, self._log_end_offset)

    def epoch_for_offset(self, offset: int) -> int:
        """The leader epoch the record at ``offset`` was written in (-1 if unknown)."""
        return self._epochs.epoch_for_offset(offset)

    # -- compaction (pykbroker/log/cleaner.py) -----------------------------------------------------------

    def segments_view(self) -> list[Segment]:
        """The current segments, oldest first (the last is the active one)."""
        return list(self._segments)

    def cleanable_segments(self, bound: int) -> list[tuple[Segment, int, int]]:
        """(segment, size, end offset) of the non-active segments, from the first, that lie wholly below
        ``bound``: what a cleaning may read and replace. The sizes are checked again at the swap."""
        chosen = []
        for segment, following in zip(self._segments, self._segments[1:]):
            if following.base_offset > bound:
                break
            chosen.append((segment, segment.size, following.base_offset))
        return chosen

    @property
    def truncations(self) -> int:
        """How many truncations this log had (truncate_to, truncate_fully_and_start_at): a cleaning refuses
        its swap if it changed since its snapshot (Kafka's abortAndPauseCleaning in truncateTo)."""
        return self._truncations

    def swap_cleaned(self, snapshot: list[tuple[Segment, int, int]], cleaned: list["CleanedSegment"],
                     truncations: int | None = None, removed_markers: set[tuple[int, int]] | None = None) -> bool:
        """Replace segments by the cleaner's ``.cleaned`` files (Kafka's replaceSegments), if every segment the
        cleaning read is still in the log unchanged and not active, and (``truncations``: the counter when
        the snapshot was taken) the log was not truncated meanwhile; else delete the ``.cleaned`` files
        (deferred file work) and return False. ``removed_markers``: (producer id, offset) of the markers the
        cleaning dropped, whose aborted-transaction entries go with them.

        Runs on the event loop: renames and unlinks only (the worker already fsynced the data); the replaced
        segments' descriptors close in the I/O thread once no read holds them."""
        from pykbroker.log.cleaner import CLEANED_SUFFIX, END_SUFFIX, SWAP_SUFFIX, crash_point

        suffixes = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, END_SUFFIX, LOG_SUFFIX)  # the log last
        by_base = {segment.base_offset: (segment, size) for segment, size, _ in snapshot}
        position = {id(segment): slot for slot, segment in enumerate(self._segments)}
        valid = not self._closed and (truncations is None or truncations == self._truncations)
        for item in cleaned:
            for base in item.replaces:
                segment, size = by_base.get(base, (None, -1))
                slot = position.get(id(segment)) if segment is not None else None
                if slot is None or slot == len(self._segments) - 1 or segment.deleted or segment.size != size:
                    valid = False
        directory = self.directory
        if not valid:
            paths = [directory / (segment_file_name(item.base_offset, suffix) + CLEANED_SUFFIX)
                     for item in cleaned for suffix in suffixes]
            self._file_work.append(partial(_unlink_all, paths))
            return False
        for item in cleaned:  # durable from here: a load completes the swap (_complete_swaps)
            for suffix in suffixes:
                name = segment_file_name(item.base_offset, suffix)
                os.rename(directory / (name + CLEANED_SUFFIX), directory / (name + SWAP_SUFFIX))
        fsync_path(directory)  # the renames are durable before the replaced segments' unlinks
        crash_point("swap")
        new_segments: dict[int, Segment] = {}
        for item in cleaned:
            replaced = [by_base[base][0] for base in item.replaces]
            for segment in replaced:
                self._dirty.discard(segment)
                segment.fd  # noqa: B018 - opened if closed: its blocks are freed at the close, in the I/O thread, not by the unlink here
                fd = segment.detach(self.close_later)
                if fd >= 0:
                    self._file_work.append(partial(os.close, fd))
                if segment.base_offset != item.base_offset:
                    segment.unlink_files()
            crash_point("deleted")
            for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, LOG_SUFFIX):
                name = segment_file_name(item.base_offset, suffix)
                os.replace(directory / (name + SWAP_SUFFIX), directory / name)
                crash_point("renamed")
            (directory / (segment_file_name(item.base_offset, END_SUFFIX) + SWAP_SUFFIX)).unlink(missing_ok=True)
            new_segments[item.base_offset] = Segment.open_existing(directory, item.base_offset)
        self._carry_txn_indexes(cleaned, removed_markers or set())
        replaced_bases = {base for item in cleaned for base in item.replaces}
        segments = []
        for segment in self._segments:
            if segment.base_offset in new_segments:
                segments.append(new_segments[segment.base_offset])
            elif segment.base_offset not in replaced_bases:
                segments.append(segment)
        self._segments = segments
        self._bases = [segment.base_offset for segment in segments]
        self._directory_changed = True
        # Snapshots strictly inside a cleaned range go (Kafka's replaceSegments): one taken inside a transaction
        # whose marker this cleaning removed would, loaded, keep that transaction open for good.
        self._delete_snapshots(lambda o: any(item.base_offset < o < item.end_offset for item in cleaned))
        return True

    def _carry_txn_indexes(self, cleaned: list["CleanedSegment"], removed_markers: set[tuple[int, int]]) -> None:
        """The aborted-transaction entries of the segments a cleaning replaced go to the segment that replaced
        them (Kafka's cleaner copies them into the cleaned segment's index). The file is rewritten whole
        (tmp + rename: small); a crash before it loses only entries of data the cleaning already dropped, as a
        cleaning drops every aborted record of the segments it rewrites."""
        for item in cleaned:
            entries = []
            for base in item.replaces:
                index = self._txn_indexes.pop(base, None)
                if index is not None:
                    entries.extend(e for e in index.entries if (e.producer_id, e.last_offset) not in removed_markers)
                    if base != item.base_offset:
                        index.delete()
            if entries:
                merged = TransactionIndex(TransactionIndex.for_segment(self.directory, item.base_offset).path,
                                          sorted(entries, key=lambda e: e.last_offset))
                merged.rewrite()
                self._txn_indexes[item.base_offset] = merged

    # -- truncation and retention ------------------------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Drop everything at or after ``offset`` (follower truncation); the log end offset becomes ``offset``.

        As in Kafka, a batch that straddles ``offset`` goes entirely.
        """
        if offset < 0:
            raise ValueError(f"cannot truncate to negative offset {offset}")
        if offset >= self._log_end_offset:
            return
        if offset < self._bases[0]:
            self._truncate_fully_and_start_at(offset)
            return
        keep = bisect_right(self._bases, offset)
        self._truncate_txn_indexes(offset)
        self._delete_snapshots(lambda o: o > offset)  # they describe batches that are gone
        self._lift_snapshot_ceilings(lambda ceiling: ceiling >= offset)
        self._retire(self._segments[keep:])
        del self._segments[keep:]
        del self._bases[keep:]
        active = self._active
        active.truncate_to(offset, self._config.index_interval_bytes)
        self._dirty.add(active)
        self._log_end_offset = offset
        self._log_start_offset = min(self._log_start_offset, offset)
        self._recovery_point = min(self._recovery_point, offset)
        self._truncations += 1
        self._epochs.truncate_from_end(offset)
        if self.on_truncate is not None:
            self.on_truncate(offset)

    def _truncate_fully_and_start_at(self, offset: int) -> None:
        self._retire(list(self._segments))
        self._delete_snapshots(lambda o: True)
        self._lift_snapshot_ceilings(lambda ceiling: True)
        segment = Segment.create(self.directory, offset, self._config.random_segment_jitter())
        self._segments = [segment]
        self._bases = [offset]
        self._log_start_offset = self._log_end_offset = self._recovery_point = offset
        self._truncations += 1
        self._directory_changed = True
        self._epochs.clear()
        if self.on_truncate is not None:
            self.on_truncate(offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop the whole log and continue at ``offset`` (a follower far behind the leader's log start)."""
        self._truncate_fully_and_start_at(offset)

    def delete_records_before(self, offset: int) -> None:
        """Move the log start offset up to ``offset`` (DeleteRecords / retention); whole segments below it go.

        The file work (unlinks, closes, the leader-epoch checkpoint) is left for ``take_file_work``: the caller
        runs it off the event loop (LogManager.run_file_work_async) and waits for it before answering.

        Raises OffsetOutOfRange beyond the log end (the caller bounds it by the high-water mark).
        """
        if offset < 0 or offset > self._log_end_offset:
            raise OffsetOutOfRange(offset, self._log_start_offset, self._log_end_offset)
        if offset <= self._log_start_offset:
            return
        self._log_start_offset = offset
        self._delete_leading(self._below_log_start, defer=True)
        self._forget_below_log_start()
        if self._epochs.truncate_from_start(offset, persist=False):
            self._file_work.append(partial(self._write_epochs, self._epochs.snapshot()))

    def apply_retention(self, now_ms: int, *, high_watermark: int | None = None, defer: bool = False) -> int:
        """Delete leading whole segments below the log start, then past retention.bytes, then past retention.ms
        (Kafka's deleteOldSegments, in its order; the log manager runs it for logs without compact, the cleaner for compacted ones).

        Time and size retention apply only when cleanup.policy includes delete. Never a segment holding
        offsets at or above ``high_watermark``; the active segment too once it is past retention, a new one
        being rolled first (see ``_delete_leading``). A segment's age is its max timestamp (its file's mtime
        when it has none). Returns how many were deleted.
        """
        config = self._config
        bound = self._log_end_offset if high_watermark is None else min(high_watermark, self._log_end_offset)
        deleted = self._delete_leading(self._below_log_start, bound, defer=defer)
        if not config.delete:  # compact-only: the cleaner, not retention, keeps the log small (as Kafka)
            return deleted
        if config.retention_bytes >= 0:  # size before time, Kafka's order (segments' ages need not grow)
            excess = self.size_bytes - config.retention_bytes

            def over_size(segment: Segment, following: Segment | None) -> bool:
                nonlocal excess
                if excess - segment.size < 0:
                    return False
                excess -= segment.size
                return True

            deleted += self._delete_leading(over_size, bound, defer=defer)
        if config.retention_ms >= 0:
            deleted += self._delete_leading(
                lambda segment, following: now_ms - self._segment_age_timestamp(segment) > config.retention_ms, bound, defer=defer
            )
        return deleted

    def _below_log_start(self, segment: Segment, following: Segment | None) -> bool:
        """The segment lies wholly below the log start (Kafka's log-start-offset breach): never the last one."""
        return following is not None and following.base_offset <= self._log_start_offset

    def _segment_age_timestamp(self, segment: Segment) -> int:
        timestamp = segment.max_timestamp_and_offset()[0]
        if timestamp >= 0:
            return timestamp
        return int(os.fstat(segment.fd).st_mtime * 1000)

    def _delete_leading(self, deletable: Callable[[Segment, Segment | None], bool], bound: int | None = None,
                        *, defer: bool = False) -> int:
        """Delete segments from the front while ``deletable(segment, next segment or None)`` holds and the
        segment ends at or below ``bound`` (default: the log end). The active segment is asked too, unless it is
        empty (Kafka's deletableSegments): when every segment goes, a new active segment is rolled first, at
        the log end (Kafka's deleteSegments), which becomes the log start. With ``defer`` the file work is left
        for ``take_file_work``."""
        bound = self._log_end_offset if bound is None else bound
        segments = self._segments
        count = 0
        while count < len(segments):
            segment = segments[count]
            following = segments[count + 1] if count + 1 < len(segments) else None
            if following is None and segment.size == 0:
                break
            end = self._log_end_offset if following is None else following.base_offset
            if end > bound or not deletable(segment, following):
                break
            count += 1
        if count == len(segments):
            self._roll()
        if count:
            self._retire(self._segments[:count], defer=defer)
            del self._segments[:count]
            del self._bases[:count]
            if self._bases[0] > self._log_start_offset:
                self._log_start_offset = self._bases[0]
                if self._epochs.truncate_from_start(self._log_start_offset, persist=not defer):
                    self._file_work.append(partial(self._write_epochs, self._epochs.snapshot()))
            self._forget_below_log_start()
        return count

    def _retire(self, segments: list[Segment], *, defer: bool = False) -> None:
        """Unlink deleted segments and close their descriptors now (with ``defer``: in ``take_file_work``).

        A fetch still sending one holds its FileSlice's pin: the descriptor then closes when that pin goes,
        so file.delete.delay.ms needs no timer here (Kafka renames the files and deletes them after that
        delay for the same reason: reads in flight).
        """
        for segment in segments:
            self._dirty.discard(segment)
            index = self._txn_indexes.pop(segment.base_offset, None)
            if index is not None:
                if defer:
                    self._file_work.append(partial(self._delete_txn_index, index))
                else:
                    index.delete()
            if defer:  # unlinked and closed in the I/O thread; no reader finds it from now on
                self._file_work.append(partial(self._delete_segment_files, segment, segment.detach(self.close_later)))
            else:
                segment.delete_files()
                segment.close()
        if segments:
            self._directory_changed = True

    def _delete_segment_files(self, segment: Segment, fd: int) -> None:
        """A retired segment's deferred file work (any thread): unlink its files unless the whole log was
        closed meanwhile (its directory renamed for deletion: the paths may name a new log's files), then
        close the descriptor it handed over."""
        try:
            if not self._closed:
                segment.unlink_files()
        finally:
            if fd >= 0:
                os.close(fd)

    def _delete_txn_index(self, index: TransactionIndex) -> None:
        if not self._closed:
            index.delete()

    def _write_epochs(self, snapshot: tuple[int, list[tuple[int, int]]]) -> None:
        """The deferred leader-epoch checkpoint write (any thread); nothing once the log was closed."""
        if not self._closed:
            self._epochs.write_snapshot(snapshot)

    @property
    def has_file_work(self) -> bool:
        return bool(self._file_work)

    def take_file_work(self) -> list[Callable[[], None]]:
        """The deferred file work, in order, for ``run_file_work`` (in any thread, one log's work in order)."""
        work, self._file_work = self._file_work, []
        return work

    # -- durability --------------------------------------------------------------------------------------

    def prepare_flush(self) -> FlushJob:
        """Write pending index entries and collect what to fsync; run the job (any thread), then complete it."""
        paths: list[Path] = []
        included: list[Segment] = []
        index_write_failed = False
        if self._unindexed_marker is not None:
            self._rewrite_unindexed()
        self.maybe_take_interval_snapshot()  # fsynced by this flush
        for segment in self._segments:
            try:
                changed_indexes = segment.write_pending_indexes()
            except OSError as exc:  # the entries stay pending; the log data is still flushed below
                if not (self._index_write_failed or index_write_failed):
                    log.warning("%s-%d: could not write index entries (%s); retrying at each flush",
                                self.topic, self.partition, exc)
                index_write_failed = True
                changed_indexes = []
            if changed_indexes or segment in self._dirty:
                included.append(segment)
                paths.extend(segment.path_for(suffix) for suffix in SEGMENT_SUFFIXES)
                if segment.base_offset in self._txn_indexes:
                    paths.append(self._txn_indexes[segment.base_offset].path)
        self._dirty.clear()
        self._index_write_failed = index_write_failed
        snapshots, self._unsynced_snapshots = self._unsynced_snapshots, []
        paths.extend(self._snapshot_path(offset) for offset in snapshots)
        directory_changed = self._directory_changed
        if directory_changed:
            paths.append(self.directory)
            self._directory_changed = False
        return FlushJob(paths, self._log_end_offset, included, directory_changed, self._truncations, snapshots)

    def complete_flush(self, job: FlushJob) -> None:
        """The job ran: advance the recovery point (unless the log was truncated meanwhile)."""
        self.rolled_since_flush = False
        if job.truncations == self._truncations:
            self._recovery_point = max(self._recovery_point, min(job.target_offset, self._log_end_offset))

    def abort_flush(self, job: FlushJob) -> None:
        """The job did not finish: keep its segments dirty for the next flush."""
        self._dirty.update(segment for segment in job.segments if segment in self._segments)
        self._directory_changed = self._directory_changed or job.directory_changed
        self._unsynced_snapshots[:0] = job.snapshots

    def flush(self) -> None:
        """Make everything appended so far durable (fsync) and advance the recovery point to the log end."""
        run_file_work(self.take_file_work())
        job = self.prepare_flush()
        try:
            job.run()
        except BaseException:
            self.abort_flush(job)
            raise
        self.complete_flush(job)

    def close(self) -> None:
        """Snapshot the producer state at the log end (a clean restart replays nothing), seal the active
        segment, flush, and close every file."""
        if self._closed:
            return
        self.take_producer_snapshot()
        self._active.seal()
        self.flush()
        self.abandon()

    def abandon(self) -> None:
        """Close every descriptor without writing anything (the log's directory is being deleted)."""
        self._closed = True
        run_file_work(self.take_file_work(), ignore_errors=True)  # closes the descriptors; unlinks nothing now
        for segment in self._segments:
            segment.close()

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self.topic}-{self.partition}, start={self._log_start_offset}, "
            f"end={self._log_end_offset}, segments={len(self._segments)})"
        )

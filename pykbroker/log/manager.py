"""All partition logs of one data directory: loading and recovery, creation and deletion, background upkeep.

Data-directory files, as Kafka writes them: ``recovery-point-offset-checkpoint`` and
``log-start-offset-checkpoint`` (checkpoint text format, "topic partition offset" lines),
``.kafka_cleanshutdown`` (present only between a clean shutdown and the next start) and ``.lock``; the log
cleaner's ``cleaner-offset-checkpoint`` (pykbroker/log/cleaner.py).
A corrupt offset checkpoint stops the start with one line (``CorruptFile``) saying it may be deleted.

Each partition directory holds Kafka's ``partition.metadata`` ("version: 0" / "topic_id: <base64 id>"),
written when the log is created. On load, given the topic id each partition must carry, a directory of
no known partition, or whose ``partition.metadata`` names another topic id (a deleted topic's log, or
every log after the metadata was lost), is never served: it is renamed aside to
``<topic>-<p>.<uuid>-stray`` with a WARN naming it, as Kafka does, so a re-created topic of that name
starts empty and the old data stays on disk for the operator. A log without the file (written by an
older pykbroker), or with an empty one (a power loss while an older pykbroker wrote it in place; it is
now written to ``partition.metadata.tmp`` and renamed, as Kafka does), is adopted by its topic and gets
the file, with a WARN for the empty one.

Deleting a topic renames its directories to ``*-delete`` at once (O(1) each, so a topic of that name can
be created again at once), but the files are removed only once the deletion is durable in the metadata
journal (Kafka's order: the deletion is committed before logs are deleted): the topic admin hands them to
``remove_deleted`` after its commit succeeded, and a worker thread removes them, so a large topic's
deletion never stalls the event loop. On load, a ``*-delete`` directory whose topic id is still the
partition's in the metadata (a crash, or a failed journal write, before the deletion was durable) is
renamed back and served, with a WARN; any other is removed.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import logging
import os
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

from pykbroker.log.cleaner import CLEANER_CHECKPOINT, CleanerConfig, LogCleaner
from pykbroker.log.config import LogConfig
from pykbroker.log.errors import LogDirectoryInUse
from pykbroker.log.checkpoint import CorruptCheckpoint, CorruptFile, read_checkpoint, write_atomically, write_checkpoint
from pykbroker.log.partition_log import (
    FSYNC_POLICIES,
    FlushJob,
    PartitionLog,
    log_dir_name,
    parse_log_dir_name,
    run_file_work,
)

log = logging.getLogger(__name__)

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEAN_SHUTDOWN_MARKER = ".kafka_cleanshutdown"
LOCK_FILE = ".lock"
DELETE_DIR_SUFFIX = "-delete"
STRAY_DIR_SUFFIX = "-stray"
PARTITION_METADATA = "partition.metadata"
_PARTITION_METADATA_VERSION = 0

TopicPartition = tuple[str, int]


def _run_flush_jobs(jobs: list[FlushJob]) -> None:
    for job in jobs:
        job.run()


def aside_dir_name(topic: str, partition: int, suffix: str) -> str:
    """``<topic>-<p>.<uuid><suffix>`` for a directory set aside, the topic cut so the name fits in 255
    bytes (Kafka's logDirNameWithSuffixCappedLength: a 249-character topic would not fit otherwise)."""
    tail = f"-{partition}.{uuid.uuid4().hex}{suffix}"
    return topic[: 255 - len(tail)] + tail


def kafka_uuid(topic_id: uuid.UUID) -> str:
    """Kafka's Uuid.toString: URL-safe base64 of the 16 bytes, without padding."""
    return base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")


def write_partition_metadata(directory: Path, topic_id: uuid.UUID) -> None:
    """Write ``partition.metadata.tmp``, fsync it and rename it over the file (Kafka's PartitionMetadataFile):
    a crash leaves the old file or the new one, never an empty one."""
    write_atomically(
        directory / PARTITION_METADATA, f"version: {_PARTITION_METADATA_VERSION}\ntopic_id: {kafka_uuid(topic_id)}\n"
    )


def read_partition_metadata(directory: Path) -> uuid.UUID | None:
    """The topic id in ``directory``'s partition.metadata; None if there is none (or it is empty: a crash
    while an older pykbroker wrote it in place, WARN); CorruptFile if unreadable."""
    path = directory / PARTITION_METADATA
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if not data:
        log.warning("%s is empty (a crash while it was written): the log is adopted by its topic as if it had none",
                    path)
        return None
    try:
        text = data.decode()
    except UnicodeDecodeError:
        text = ""
    fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    try:
        if int(fields["version"]) != _PARTITION_METADATA_VERSION:
            raise ValueError(fields["version"])
        raw = base64.urlsafe_b64decode(fields["topic_id"] + "==")
        return uuid.UUID(bytes=raw)
    except (KeyError, ValueError) as exc:
        raise CorruptFile(
            path, f"is not Kafka's partition.metadata (version: 0 / topic_id: <id>) ({exc!r})",
            "delete it to let the topic of this name adopt the log, or move the directory aside",
        ) from None



def lock_data_dir(data_dir: Path) -> int:
    """Take the data dir's lock (``LOCK_FILE``, held while the fd is open): LogDirectoryInUse if another process
    holds it, OSError if the file cannot be made. Returns the fd; closing it releases the lock."""
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise LogDirectoryInUse(f"{data_dir} is locked by another process") from exc
    return fd

class LogManager:
    def __init__(
        self,
        data_dir: Path,
        *,
        fsync: str = "interval",
        flush_interval_ms: int = 1000,
        retention_check_interval_ms: int = 300000,
        cleaner: CleanerConfig | None = None,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {FSYNC_POLICIES}, not {fsync!r}")
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.flush_interval_ms = flush_interval_ms
        self.retention_check_interval_ms = retention_check_interval_ms
        # Set by the replication layer: retention never deletes a segment at or above the high-water mark.
        self.high_watermark_of: Callable[[str, int], int | None] | None = None
        # Also set by it: the cleaner never cleans at or past the last stable offset (open transactions, HWM).
        self.last_stable_offset_of: Callable[[str, int], int | None] | None = None
        self._logs: dict[TopicPartition, PartitionLog] = {}
        self._awaiting_removal: list[Path] = []  # deleted logs' directories, removed once the deletion is durable
        # One worker: fsyncs and checkpoint writes leave the event loop but never overlap each other.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="log-flush")
        # Removing deleted topics' files can take long: its own worker, so flushes never wait for it.
        self._remover = ThreadPoolExecutor(max_workers=1, thread_name_prefix="log-delete")
        self._closed = False
        self._lock_fd = lock_data_dir(self.data_dir)
        # The log cleaner of compacted topics (pykbroker/log/cleaner.py); started by run_background.
        self.cleaner = LogCleaner(
            self.data_dir, cleaner or CleanerConfig(), self.logs,
            lambda topic, partition: self.last_stable_offset_of(topic, partition) if self.last_stable_offset_of else None,
            self.run_file_work_async, self._in_io_thread, retain=self._retain_compacted,
        )

    # -- loading -----------------------------------------------------------------------------------------

    def load_all(
        self,
        config_for_topic: Callable[[str], LogConfig],
        topic_id_of: Callable[[str, int], uuid.UUID | None] | None = None,
    ) -> list[PartitionLog]:
        """Open every ``<topic>-<partition>`` directory, recovering past the recovery point after a crash.

        With ``topic_id_of`` (the id a partition's log must carry, None for no such partition), logs of
        unknown partitions or of another topic id are set aside as ``-stray``. Finishes deleting
        ``*-delete`` directories. Removes the clean-shutdown marker once loaded.
        """
        marker = self.data_dir / CLEAN_SHUTDOWN_MARKER
        clean_shutdown = marker.exists()
        recovery_points = self._read_offsets(RECOVERY_POINT_CHECKPOINT)
        start_offsets = self._read_offsets(LOG_START_OFFSET_CHECKPOINT)
        loaded = []
        for entry in sorted(os.scandir(self.data_dir), key=lambda entry: entry.name):
            if entry.is_dir() and entry.name.endswith(DELETE_DIR_SUFFIX):
                self._finish_deletion(Path(entry.path), topic_id_of)
        for entry in sorted(os.scandir(self.data_dir), key=lambda entry: entry.name):
            if not entry.is_dir() or entry.name.endswith(DELETE_DIR_SUFFIX):
                continue
            parsed = parse_log_dir_name(entry.name)
            if parsed is None or parsed in self._logs:
                continue
            if topic_id_of is not None and not self._belongs(Path(entry.path), parsed, topic_id_of(*parsed)):
                continue
            partition_log = PartitionLog.open(
                Path(entry.path),
                config_for_topic(parsed[0]),
                fsync=self.fsync,
                recovery_point=recovery_points.get(parsed, 0),
                clean_shutdown=clean_shutdown,
                log_start_offset=start_offsets.get(parsed),
            )
            self._adopt(partition_log)
            self.cleaner.check_loaded(partition_log)  # a recovery cut it below its cleaner checkpoint
            self._logs[parsed] = partition_log
            loaded.append(partition_log)
        if not clean_shutdown and self._logs:
            log.info("recovered %d logs in %s after an unclean shutdown", len(loaded), self.data_dir)
        marker.unlink(missing_ok=True)
        self.write_checkpoints()
        return loaded

    def _finish_deletion(
        self, directory: Path, topic_id_of: Callable[[str, int], uuid.UUID | None] | None
    ) -> None:
        """Remove a ``*-delete`` directory, or rename it back if the metadata still holds its topic id."""
        key = parse_log_dir_name(directory.name[: -len(DELETE_DIR_SUFFIX)].rpartition(".")[0])
        expected = topic_id_of(*key) if key is not None and topic_id_of is not None else None
        if expected is not None:
            try:
                stored = read_partition_metadata(directory)
            except CorruptFile:
                stored = None
            live = self.data_dir / log_dir_name(*key)
            if stored == expected and not live.exists():
                os.rename(directory, live)
                log.warning(
                    "log directory %s was being deleted, but the deletion of topic %s never became durable in "
                    "the metadata (a crash or a failed metadata write): renamed back to %s and served",
                    directory, key[0], live.name,
                )
                return
        shutil.rmtree(directory, ignore_errors=True)

    def _belongs(self, directory: Path, key: TopicPartition, expected: uuid.UUID | None) -> bool:
        """Whether ``directory`` is the log of a known partition; sets it aside (WARN) if not."""
        stored = read_partition_metadata(directory) if expected is not None else None
        if expected is not None and stored in (None, expected):
            if stored is None:
                write_partition_metadata(directory, expected)
            return True
        aside = directory.with_name(aside_dir_name(*key, STRAY_DIR_SUFFIX))
        os.rename(directory, aside)
        reason = (
            "belongs to no topic partition in the cluster metadata" if expected is None
            else f"holds topic id {kafka_uuid(stored)}, not the topic's {kafka_uuid(expected)}"
        )
        log.warning(
            "log directory %s %s: not served, renamed to %s (delete it, or restore the metadata it belongs to)",
            directory, reason, aside.name,
        )
        return False

    def _read_offsets(self, name: str) -> dict[TopicPartition, int]:
        path = self.data_dir / name
        try:
            rows = read_checkpoint(path, 3) or []
            return {(topic, int(partition)): int(offset) for topic, partition, offset in rows}
        except (CorruptCheckpoint, ValueError) as exc:
            raise CorruptFile(
                path, f"is corrupt ({exc})", "delete it and every log is recovered from its segments at the next start"
            ) from None

    # -- registry ----------------------------------------------------------------------------------------

    def get(self, topic: str, partition: int) -> PartitionLog | None:
        return self._logs.get((topic, partition))

    def logs(self) -> list[PartitionLog]:
        return list(self._logs.values())

    def create(self, topic: str, partition: int, config: LogConfig, topic_id: uuid.UUID | None = None) -> PartitionLog:
        """The log of (topic, partition), created if it does not exist yet (idempotent); a new log of a
        topic with an id gets its partition.metadata."""
        existing = self._logs.get((topic, partition))
        if existing is not None:
            return existing
        if not topic or topic in (".", "..") or os.sep in topic or partition < 0:
            raise ValueError(f"invalid topic partition {topic!r}/{partition}")
        partition_log = PartitionLog.open(self.data_dir / log_dir_name(topic, partition), config, fsync=self.fsync)
        if topic_id is not None:
            write_partition_metadata(partition_log.directory, topic_id)
        self._adopt(partition_log)
        self.cleaner.check_loaded(partition_log)
        self._logs[(topic, partition)] = partition_log
        return partition_log

    def _adopt(self, partition_log: PartitionLog) -> None:
        partition_log.close_later = self._close_in_io_thread
        topic, partition = partition_log.topic, partition_log.partition
        partition_log.on_truncate = lambda offset: self.cleaner.truncate_checkpoint(topic, partition, offset)

    def delete_topic(self, topic: str) -> list[Path]:
        """Stop serving the topic's logs: rename each directory to ``<topic>-<p>.<uuid>-delete`` now and
        return them. Their files stay until ``remove_deleted`` (after the deletion is durable in the
        metadata; ``take_deleted`` hands them over) or the next load. The descriptors close now, except
        those pinned by fetches still sending them (FileSlice): those close when the fetch lets go.
        """
        return [doomed for key in [key for key in self._logs if key[0] == topic] if (doomed := self.delete(*key))]

    def delete(self, topic: str, partition: int) -> Path | None:
        """Stop serving one log as ``delete_topic`` does (StopReplica with delete_partition): its directory
        renamed aside now and returned, removed later; None if there is no such log."""
        partition_log = self._logs.pop((topic, partition), None)
        if partition_log is None:
            return None
        self.cleaner.forget(topic, partition)
        doomed = self.data_dir / aside_dir_name(topic, partition, DELETE_DIR_SUFFIX)
        os.rename(partition_log.directory, doomed)
        partition_log.abandon()
        self._awaiting_removal.append(doomed)
        return doomed

    def take_deleted(self) -> list[Path]:
        """The directories of deleted logs not yet handed over for removal (see ``delete_topic``)."""
        doomed, self._awaiting_removal = self._awaiting_removal, []
        return doomed

    def remove_deleted(self, directories: list[Path]) -> None:
        """Remove deleted logs' directories in the remover thread (any thread may call this). After
        shutdown they are left for the next load, which removes them."""
        for directory in directories:
            try:
                self._remover.submit(shutil.rmtree, directory, ignore_errors=True)
            except RuntimeError:  # shut down meanwhile
                return

    # -- upkeep ------------------------------------------------------------------------------------------

    async def run_background(self) -> None:
        """Flush per the fsync policy, apply retention, checkpoint recovery points, run the log cleaner.

        Segments roll only when an append asks (PartitionLog._should_roll) or retention empties a log.
        Retention here covers the logs without compact, every log.retention.check.interval.ms; compacted
        logs (compact and compact,delete) get theirs from the cleaner, at each of its rounds (Kafka's
        LogManager.cleanupLogs and LogCleaner.cleanFilthiestLog).

        Cancel-safe: an fsync cut short leaves its segments dirty for the next flush; checkpoints are
        replaced atomically. Cancel this task before calling shutdown().
        """
        cleaning = asyncio.ensure_future(self.cleaner.run())
        try:
            await self._upkeep()
        finally:
            cleaning.cancel()

    async def _in_io_thread(self, work: Callable[[], None]) -> None:
        """Run ``work`` in the I/O thread (a checkpoint write); nothing after shutdown."""
        try:
            await asyncio.wrap_future(self._executor.submit(work))
        except RuntimeError:
            return

    async def _upkeep(self) -> None:
        tick_s = min(self.flush_interval_ms, self.retention_check_interval_ms, 1000) / 1000
        next_flush = time.monotonic() + self.flush_interval_ms / 1000
        next_retention = time.monotonic() + self.retention_check_interval_ms / 1000
        failing = False  # a storage error (disk full) stops nothing: the next tick tries again
        while not self._closed:
            await asyncio.sleep(tick_s)
            try:
                if time.monotonic() >= next_retention:
                    not_compacted = [partition_log for partition_log in self.logs() if not partition_log.config.compact]
                    try:
                        self.apply_retention(int(time.time() * 1000), not_compacted, defer=True)
                    finally:  # what the pass deleted before any failure is deleted
                        await self.run_file_work_async()
                    next_retention = time.monotonic() + self.retention_check_interval_ms / 1000
                if time.monotonic() >= next_flush:
                    if self.fsync == "never":  # Kafka's default: no timed fsync, but flush what a roll completed
                        due = [partition_log for partition_log in self.logs() if partition_log.rolled_since_flush]
                        for partition_log in self.logs():  # (a big segment is not replayed whole after a truncation)
                            partition_log.maybe_take_interval_snapshot()
                    else:
                        due = self.logs()
                    await self.flush_async(due)
                    await self.write_checkpoints_async()
                    next_flush = time.monotonic() + self.flush_interval_ms / 1000
            except OSError as exc:
                if not failing:
                    log.warning("log upkeep in %s failed (%s); retrying every %.1f s", self.data_dir, exc, tick_s)
                failing = True
                continue
            if failing:
                log.info("log upkeep in %s works again", self.data_dir)
                failing = False

    def apply_retention(self, now_ms: int, logs: Iterable[PartitionLog] | None = None, *, defer: bool = False) -> int:
        """One retention pass over ``logs`` (default: every log); returns the number of segments deleted. With
        ``defer`` the file work is left for ``run_file_work_async``. A storage error in one log (the roll
        that retention of every segment needs, on a full disk) is logged and the pass goes on with the next
        log, as Kafka's; that log is tried again at the next pass."""
        deleted = 0
        for partition_log in list(self.logs() if logs is None else logs):
            try:
                deleted += partition_log.apply_retention(now_ms, high_watermark=self._retention_bound(partition_log),
                                                         defer=defer)
            except OSError as exc:
                log.warning("retention of %s-%d in %s failed (%s); tried again at the next pass",
                            partition_log.topic, partition_log.partition, self.data_dir, exc)
        return deleted

    def _retention_bound(self, partition_log: PartitionLog) -> int | None:
        """The high-water mark that bounds a log's retention (no segment at or above it goes). A log no
        partition hosts yet (loaded at startup before its LeaderAndIsr) has its log start as HWM, as Kafka's
        UnifiedLog until Partition.createLog sets it: only segments below the log start may go. None (the log
        end) when no replica manager is plugged in."""
        if self.high_watermark_of is None:
            return None
        high_watermark = self.high_watermark_of(partition_log.topic, partition_log.partition)
        return partition_log.log_start_offset if high_watermark is None else high_watermark

    async def _retain_compacted(self, logs: list[PartitionLog]) -> None:
        """The cleaner's retention pass over compacted logs (``apply_retention`` with the file work off the
        event loop)."""
        try:
            self.apply_retention(int(time.time() * 1000), logs, defer=True)
        finally:
            await self.run_file_work_async(logs)

    def _close_in_io_thread(self, fd: int) -> None:
        """Close a deleted segment's last descriptor in the I/O thread (freeing an unlinked file's blocks can
        take long): the last pin of a read still sending it goes on the event loop. Here once shut down."""
        try:
            self._executor.submit(os.close, fd)
        except RuntimeError:
            os.close(fd)

    async def run_file_work_async(self, logs: Iterable[PartitionLog] | None = None) -> None:
        """Run the logs' deferred file work (segments deleted by DeleteRecords, retention or a follower's
        new log start: unlinks, closes, leader-epoch checkpoints) in the worker thread and wait for it.
        A failure is logged: the log start already moved, files left behind go at the next load."""
        # Submitted even when empty: the worker runs in order, so work another caller took from these logs
        # first is done too when this returns.
        work = [job for partition_log in (self.logs() if logs is None else logs) for job in partition_log.take_file_work()]
        try:
            await asyncio.wrap_future(self._executor.submit(run_file_work, work))
        except RuntimeError:  # shut down meanwhile: the logs are closed, only descriptors are left to close
            run_file_work(work, ignore_errors=True)
        except OSError as exc:
            log.warning("deleting segment files in %s failed (%s)", self.data_dir, exc)

    async def flush_async(self, logs: list[PartitionLog] | None = None) -> None:
        """Flush logs with the fsyncs in the worker thread; the event loop only prepares and completes."""
        jobs = [(partition_log, partition_log.prepare_flush()) for partition_log in (self.logs() if logs is None else logs)]
        future = self._executor.submit(_run_flush_jobs, [job for _, job in jobs])
        try:
            await asyncio.wrap_future(future)
        except BaseException:
            future.cancel()  # a job that never started holds no descriptor: it names files by path
            for partition_log, job in jobs:
                partition_log.abort_flush(job)
            raise
        for partition_log, job in jobs:
            partition_log.complete_flush(job)

    def _checkpoint_rows(self) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]]:
        recovery = [(topic, partition, pl.recovery_point) for (topic, partition), pl in sorted(self._logs.items())]
        starts = [(topic, partition, pl.log_start_offset) for (topic, partition), pl in sorted(self._logs.items())]
        return recovery, starts

    def write_checkpoints(self) -> None:
        recovery, starts = self._checkpoint_rows()
        write_checkpoint(self.data_dir / RECOVERY_POINT_CHECKPOINT, recovery)
        write_checkpoint(self.data_dir / LOG_START_OFFSET_CHECKPOINT, starts)

    async def write_checkpoints_async(self) -> None:
        recovery, starts = self._checkpoint_rows()
        await asyncio.wrap_future(self._executor.submit(write_checkpoint, self.data_dir / RECOVERY_POINT_CHECKPOINT, recovery))
        await asyncio.wrap_future(self._executor.submit(write_checkpoint, self.data_dir / LOG_START_OFFSET_CHECKPOINT, starts))

    async def write_log_start_checkpoint_async(self) -> None:
        """Write the log-start-offset checkpoint in the worker thread (DeleteRecords moved a log start: a
        restart, even after a crash, must not serve the deleted records again). A failed write is logged and
        retried with the next checkpoint."""
        if self._closed:
            return  # shutdown() writes it
        _, starts = self._checkpoint_rows()
        try:
            await asyncio.wrap_future(
                self._executor.submit(write_checkpoint, self.data_dir / LOG_START_OFFSET_CHECKPOINT, starts))
        except RuntimeError:  # shut down meanwhile: shutdown() writes it
            return
        except OSError as exc:
            log.warning("writing %s failed (%s); retried with the next checkpoint", LOG_START_OFFSET_CHECKPOINT, exc)

    def shutdown(self) -> None:
        """Flush and close every log, write the checkpoints and the clean-shutdown marker, release the lock."""
        if self._closed:
            return
        self._closed = True
        self.cleaner.shutdown()
        self._executor.shutdown(wait=True)  # an fsync or checkpoint write still running finishes first
        self._remover.shutdown(wait=True)
        for partition_log in self._logs.values():
            partition_log.close()
        self.write_checkpoints()
        write_checkpoint(self.data_dir / CLEANER_CHECKPOINT, self.cleaner.checkpoint_rows())
        marker = self.data_dir / CLEAN_SHUTDOWN_MARKER
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        dir_fd = os.open(self.data_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._logs.clear()
        os.close(self._lock_fd)

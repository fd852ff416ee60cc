"""ReplicaManager: the partitions this broker hosts, their high-water marks, and the waits on them.

Handlers call this, never the log directly: it is where acks, the high-water mark, the idempotent
producer's sequence checks and long-poll wake-ups meet. On a single broker the ISR is just this broker,
so the high-water mark is the log end offset; in cluster mode followers' fetch positions move it.

A consumer's read is handed back as :class:`FileRecords`: the record data stays in the segment files
until the connection writes the response, and is then read chunk by chunk as the socket drains.

Storage faults: an append whose write fails (disk full, I/O error, EMFILE) answers KAFKA_STORAGE_ERROR
for that partition, a retriable error, so clients back off and retry instead of seeing a dropped
connection. The log has cut the partial write, so nothing half-written is ever served or acknowledged.
Kafka would mark the whole log dir offline and, with no log dir left, halt the broker; a single broker
that stops on a full disk is the outage we want to avoid, so here only the failing append is refused and
the partition retries the disk on its next append: it recovers by itself when space returns. Logging is
per log directory, not per partition (a full disk fails every partition on it: 10,000 partitions must not
mean 10,000 lines): one WARN when appends in a directory start failing, then at most one WARN a minute
with the count of appends and partitions refused meanwhile, and one INFO when an append in that directory
succeeds again (StorageErrorLog, which also bounds the lines of a directory that flaps).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from pykbroker.log.config import LogConfig
from pykbroker.log.errors import OffsetOutOfRange, RecordTooLarge
from pykbroker.log.manager import LogManager
from pykbroker.log.partition_log import PartitionLog, ReadResult
from pykbroker.log.producer_state import ProducerStateError, ProducerStateManager
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.records import (
    CorruptRecordBatch,
    InvalidRecordBatch,
    InvalidRecords,
    RecordErrors,
    iter_headers,
)

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    error: ErrorCode
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    message: str | None = None
    record_errors: tuple[tuple[int, str], ...] = ()  # (batch index, message): Kafka's RecordValidationException


class FileRecords:
    """The record data of a read, left in the segment files: its length now, its bytes chunk by chunk
    when the response is written (FileSlice.chunks: ``pread`` on the log's descriptors; each slice pins its
    segment file open, even if the segment is deleted meanwhile, for as long as this object is referenced,
    so a response being sent can always finish)."""

    __slots__ = ("slices", "_size")

    def __init__(self, read: ReadResult) -> None:
        self.slices = read.slices
        self._size = read.size

    def __len__(self) -> int:
        return self._size

    def chunks(self, size: int) -> Iterator[bytes]:
        for piece in self.slices:
            yield from piece.chunks(size)


@dataclass(slots=True)
class _DirectoryErrors:
    """Storage errors in one log directory."""

    failing: bool = False  # the last append in the directory failed
    announced: bool = False  # ... and a WARN said so
    refused: int = 0  # appends answered KAFKA_STORAGE_ERROR since the last line
    partitions: set[TopicPartition] = field(default_factory=set)  # ... to these partitions
    warned_at: float = float("-inf")  # clock time of the last WARN
    window_start: float = float("-inf")  # the current interval, for the WARNs of new episodes
    window_warnings: int = 0


class StorageErrorLog:
    """Storage-error lines per log directory, whatever the number of partitions on it.

    A WARN when appends there start failing; while they go on, one WARN an interval at most, counting the
    appends and partitions refused meanwhile; an INFO when an append there succeeds again. A directory
    that flaps (one partition failing while others append) gets at most ``burst`` failing/succeeding
    pairs an interval; failures beyond that are counted into the next WARN, and only an announced episode
    gets its INFO.
    """

    def __init__(self, interval_s: float = 60.0, burst: int = 3, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.burst = burst
        self._clock = clock
        self._directories: dict[Path, _DirectoryErrors] = {}
        self._failing = 0  # directories whose last append failed

    @property
    def any_failing(self) -> bool:
        return self._failing > 0

    def failed(self, directory: Path, tp: TopicPartition, exc: OSError) -> None:
        state = self._directories.get(directory)
        if state is None:
            state = self._directories[directory] = _DirectoryErrors()
        if not state.failing:
            state.failing = True
            self._failing += 1
        state.refused += 1
        state.partitions.add(tp)
        now = self._clock()
        if now - state.window_start >= self.interval_s:
            state.window_start, state.window_warnings = now, 0
        if state.announced:
            if now - state.warned_at < self.interval_s:
                return
            log.warning("log dir %s: appends still fail: %d append(s) to %d partition(s) refused in the last %.0f s "
                        "(last: %s-%d, %s)", directory, state.refused, len(state.partitions), now - state.warned_at,
                        *tp, exc)
        else:
            if state.window_warnings >= self.burst:
                return
            log.warning("log dir %s: append to %s-%d failed (%s); answering KAFKA_STORAGE_ERROR for appends that fail "
                        "there until one succeeds again, with one line a minute at most (%d append(s) to %d "
                        "partition(s) refused so far)", directory, *tp, exc, state.refused, len(state.partitions))
            state.announced = True
        state.window_warnings += 1
        state.refused = 0
        state.partitions.clear()
        state.warned_at = now

    def succeeded(self, directory: Path) -> None:
        state = self._directories.get(directory)
        if state is None or not state.failing:
            return
        state.failing = False
        self._failing -= 1
        if state.announced:
            log.info("log dir %s: appends succeed again after storage errors (%d more append(s) to %d partition(s) "
                     "refused since the last warning)", directory, state.refused, len(state.partitions))
            state.announced = False
            state.refused = 0
            state.partitions.clear()


class ControlBatchFromClient(InvalidRecordBatch):
    """Transaction markers are the broker's to write: Kafka answers INVALID_RECORD."""


class Partition:
    """One hosted partition: its log, producer state, leader epoch, and the fetchers parked on it."""

    def __init__(self, topic: str, index: int, log: PartitionLog, leader_epoch: int, isr_size: int = 1) -> None:
        self.topic = topic
        self.index = index
        self.log = log
        self.leader_epoch = leader_epoch
        self.isr_size = isr_size
        self.producer_state = ProducerStateManager()
        self._waiters: list[asyncio.Future] = []

    @property
    def high_watermark(self) -> int:
        return self.log.log_end_offset

    def rebuild_producer_state(self) -> None:
        self.producer_state.rebuild(self.log.headers(self.log.log_start_offset))

    def add_waiter(self, waiter: asyncio.Future) -> None:
        self._waiters.append(waiter)

    def remove_waiter(self, waiter: asyncio.Future) -> None:
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    def wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def append(self, records, now: int) -> AppendOutcome:
        headers = list(iter_headers(records))
        if not headers:
            raise InvalidRecordBatch("no record batch in the records field")
        if any(h.is_control for h in headers):
            raise ControlBatchFromClient("control batches are written by the broker, not by producers")
        idempotent = [h for h in headers if h.has_producer_id]
        if idempotent:
            # A retried batch is answered with its original offsets and nothing is appended (Kafka's rule).
            duplicate = self.producer_state.check_batches(idempotent)
            if duplicate is not None:
                return AppendOutcome(
                    ErrorCode.none, duplicate.base_offset, duplicate.log_append_time_ms, self.log.log_start_offset
                )
        result = self.log.append(records, leader_epoch=self.leader_epoch, now_ms=now)
        if idempotent:
            for header in result.headers:
                if header.has_producer_id:
                    self.producer_state.update(header, result.log_append_time_ms)
        self.wake_waiters()
        return AppendOutcome(ErrorCode.none, result.base_offset, result.log_append_time_ms, result.log_start_offset)


class ReplicaManager:
    def __init__(self, log_manager: LogManager, broker_id: int, log_config_for: Callable[[str], LogConfig]) -> None:
        self.log_manager = log_manager
        self.broker_id = broker_id
        self.log_config_for = log_config_for
        self._partitions: dict[TopicPartition, Partition] = {}
        self.storage_errors = StorageErrorLog()
        # Retention must never delete data consumers cannot see yet (above the high-water mark).
        log_manager.high_watermark_of = self._high_watermark_of

    def _high_watermark_of(self, topic: str, index: int) -> int | None:
        partition = self._partitions.get((topic, index))
        return partition.high_watermark if partition is not None else None

    # -- hosting ----------------------------------------------------------------------------------
    def partition(self, topic: str, index: int) -> Partition | None:
        return self._partitions.get((topic, index))

    def host(self, topic: str, index: int, leader_epoch: int, isr_size: int = 1) -> Partition:
        existing = self._partitions.get((topic, index))
        if existing is not None:
            existing.leader_epoch = leader_epoch
            existing.isr_size = isr_size
            return existing
        config = self.log_config_for(topic)
        partition_log = self.log_manager.get(topic, index) or self.log_manager.create(topic, index, config)
        partition_log.config = config
        partition = Partition(topic, index, partition_log, leader_epoch, isr_size)
        partition.rebuild_producer_state()
        self._partitions[(topic, index)] = partition
        return partition

    def drop_topic(self, topic: str) -> None:
        for key in [key for key in self._partitions if key[0] == topic]:
            self._partitions.pop(key).wake_waiters()
        self.log_manager.delete_topic(topic)

    def update_config(self, topic: str) -> None:
        config = self.log_config_for(topic)
        for (name, _), partition in self._partitions.items():
            if name == topic:
                partition.log.config = config

    def partitions(self) -> Iterable[Partition]:
        return self._partitions.values()

    # -- produce ----------------------------------------------------------------------------------
    def append(self, topic: str, index: int, records, *, acks: int, min_insync_replicas: int) -> AppendOutcome:
        partition = self._partitions.get((topic, index))
        if partition is None:
            return AppendOutcome(ErrorCode.unknown_topic_or_partition)
        if acks == -1 and partition.isr_size < min_insync_replicas:
            return AppendOutcome(
                ErrorCode.not_enough_replicas,
                message=f"ISR has {partition.isr_size} replicas, min.insync.replicas is {min_insync_replicas}",
            )
        try:
            outcome = partition.append(records, now_ms())
        except OSError as exc:
            log.debug("%s-%d: append refused with KAFKA_STORAGE_ERROR: %s", topic, index, exc)
            self.storage_errors.failed(partition.log.directory.parent, (topic, index), exc)
            return AppendOutcome(ErrorCode.kafka_storage_error, message=f"storage error: {exc.strerror or exc}")
        except ControlBatchFromClient as exc:
            return AppendOutcome(ErrorCode.invalid_record, message=str(exc))
        except CorruptRecordBatch as exc:
            return AppendOutcome(ErrorCode.corrupt_message, message=str(exc))
        except InvalidRecords as exc:
            return AppendOutcome(ErrorCode.invalid_record, message=str(exc))
        except RecordErrors as exc:
            return AppendOutcome(ErrorCode.invalid_timestamp, message=str(exc), record_errors=tuple(exc.errors))
        except InvalidRecordBatch as exc:
            return AppendOutcome(ErrorCode.corrupt_message, message=str(exc))
        except RecordTooLarge as exc:
            return AppendOutcome(ErrorCode.message_too_large, message=str(exc))
        except ProducerStateError as exc:
            return AppendOutcome(ErrorCode(exc.error_code), message=str(exc))
        if self.storage_errors.any_failing:  # (the produce path pays one attribute test)
            self.storage_errors.succeeded(partition.log.directory.parent)
        return outcome

    # -- fetch ------------------------------------------------------------------------------------
    def read(self, partition: Partition, offset: int, max_bytes: int, *, min_one: bool, up_to_hwm: bool = True) -> ReadResult:
        """Whole batches from ``offset``; consumers never see past the high-water mark. Raises OffsetOutOfRange."""
        upper = partition.high_watermark if up_to_hwm else None
        return partition.log.read(offset, max_bytes, upper_bound=upper, min_one=min_one)

    async def wait_for_appends(self, partitions: list[Partition], timeout_s: float) -> None:
        """Park until any of ``partitions`` gets an append, or the timeout passes."""
        if timeout_s <= 0 or not partitions:
            return
        waiter = asyncio.get_running_loop().create_future()
        for partition in partitions:
            partition.add_waiter(waiter)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except asyncio.TimeoutError:
            pass
        finally:
            for partition in partitions:
                partition.remove_waiter(waiter)


__all__ = ["ReplicaManager", "Partition", "AppendOutcome", "FileRecords", "OffsetOutOfRange", "now_ms"]

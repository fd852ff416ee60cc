"""ReplicaManager: the partitions this broker hosts, their high-water marks, and the waits on them.

The replication state of one partition (role, ISR, followers' progress, the HWM rules) is in
partition.py; the waiting acks=all produces and long polls in purgatory.py. High-water marks are
checkpointed in the data dir's ``replication-offset-checkpoint`` (Kafka's name and format: version 0, count,
"topic partition offset" lines) every replica.high.watermark.checkpoint.interval.ms and at clean shutdown,
and read at start: a partition's HWM starts there (bounded by its log), which is what a follower exposes
until its leader tells it more. A checkpoint that cannot be parsed stops the start with one line.

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

from pykbroker.log.checkpoint import CorruptCheckpoint, CorruptFile, read_checkpoint, write_checkpoint
from pykbroker.log.config import LogConfig
from pykbroker.log.errors import OffsetOutOfRange, RecordBatchTooLarge, RecordTooLarge
from pykbroker.log.manager import LogManager
from pykbroker.log.partition_log import ReadResult
from pykbroker.log.producer_state import NO_VERIFICATION, ProducerStateError, VerificationGuard
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.records import (
    CorruptRecordBatch,
    InvalidRecordBatch,
    InvalidRecords,
    RecordErrors,
)
from pykbroker.replication.partition import (
    DEFAULT_REPLICA_LAG_TIME_MAX_MS,
    AlterPartitionPort,
    AppendOutcome,
    ControlBatchFromClient,
    Partition,
)
from pykbroker.replication.purgatory import DelayedProduce, PartitionWatch, ProducePurgatory, wait_for_partitions
from pykbroker.replication.quota import ReplicationQuota

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


def now_ms() -> int:
    return int(time.time() * 1000)


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


HWM_CHECKPOINT = "replication-offset-checkpoint"


class ReplicaManager:
    def __init__(
        self,
        log_manager: LogManager,
        broker_id: int,
        log_config_for: Callable[[str], LogConfig],
        *,
        replica_lag_time_max_ms: int = DEFAULT_REPLICA_LAG_TIME_MAX_MS,
        alter_partition: AlterPartitionPort | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.log_manager = log_manager
        self.broker_id = broker_id
        self.log_config_for = log_config_for
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self._alter_partition = alter_partition  # the cluster layer's AlterPartition sender (None: single broker)
        # Whether a broker is alive (in a cluster: in the metadata cache); a dead one never holds the HWM back.
        self.is_alive: Callable[[int], bool] = lambda broker_id: True
        self.clock = clock
        self.purgatory = ProducePurgatory(clock)
        self._partitions: dict[TopicPartition, Partition] = {}
        self.storage_errors = StorageErrorLog()
        self._checkpointed_hwms: dict[TopicPartition, int] | None = None
        self.leader_quota: ReplicationQuota | None = None  # replication throttle of follower fetches (cluster)
        # Retention must never delete data consumers cannot see yet (above the high-water mark).
        log_manager.high_watermark_of = self._high_watermark_of
        log_manager.last_stable_offset_of = self._last_stable_offset_of  # the cleaner's bound

    @property
    def alter_partition(self) -> AlterPartitionPort | None:
        return self._alter_partition

    @alter_partition.setter
    def alter_partition(self, port: AlterPartitionPort | None) -> None:
        """Plug in (or out) the AlterPartition sender: partitions already hosted use it from now on too."""
        self._alter_partition = port
        for partition in self._partitions.values():
            partition.alter_partition = port

    def replica_isr_eligible(self, replica_id: int) -> bool:
        """Kafka's isReplicaIsrEligible; a cluster member asks its metadata cache (``is_alive``)."""
        return self.is_alive(replica_id)

    def _high_watermark_of(self, topic: str, index: int) -> int | None:
        partition = self._partitions.get((topic, index))
        return partition.high_watermark if partition is not None else None

    def _last_stable_offset_of(self, topic: str, index: int) -> int | None:
        partition = self._partitions.get((topic, index))
        return partition.last_stable_offset if partition is not None else None

    # -- high-water mark checkpoint ---------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.log_manager.data_dir / HWM_CHECKPOINT

    def load_high_watermarks(self) -> dict[TopicPartition, int]:
        """Read replication-offset-checkpoint (once); raises CorruptFile (one line) if it cannot be parsed."""
        if self._checkpointed_hwms is None:
            path = self.checkpoint_path
            try:
                rows = read_checkpoint(path, 3) or []
                self._checkpointed_hwms = {(topic, int(index)): int(offset) for topic, index, offset in rows}
            except (CorruptCheckpoint, ValueError) as exc:
                raise CorruptFile(
                    path, f"is corrupt ({exc})",
                    "delete it and high-water marks restart from the logs (leaders) or from the leaders (followers)",
                ) from None
        return self._checkpointed_hwms

    def _checkpoint_rows(self) -> list[tuple[str, int, int]]:
        return [(topic, index, p.high_watermark) for (topic, index), p in sorted(self._partitions.items())]

    def write_high_watermarks(self) -> None:
        write_checkpoint(self.checkpoint_path, self._checkpoint_rows())

    async def run_high_watermark_checkpoints(self, interval_ms: int) -> None:
        """Checkpoint the HWMs every ``interval_ms`` (the file is written off the event loop). Cancel-safe."""
        interval_s = max(interval_ms, 1) / 1000
        written = None
        while True:
            await asyncio.sleep(interval_s)
            rows = self._checkpoint_rows()
            if rows == written:
                continue  # nothing moved: no write, no fsync
            try:
                await asyncio.to_thread(write_checkpoint, self.checkpoint_path, rows)
                written = rows
            except OSError as exc:
                log.warning("could not write %s: %s", self.checkpoint_path, exc)

    async def run_isr_checks(self) -> None:
        """Every half replica.lag.time.max.ms, propose shrinking ISRs that hold lagging followers (Kafka's
        isr-expiration task). A single broker has no followers: each check is a loop over nothing to do."""
        interval_s = max(self.replica_lag_time_max_ms / 2, 1) / 1000
        while True:
            await asyncio.sleep(interval_s)
            self.maybe_shrink_isrs()

    def maybe_shrink_isrs(self, now: int | None = None) -> list:
        now = self.clock() if now is None else now
        changes = []
        for partition in self._partitions.values():
            if partition._remote:
                change = partition.maybe_shrink_isr(now)
                if change is not None:
                    changes.append(change)
        return changes

    # -- hosting ----------------------------------------------------------------------------------
    def partition(self, topic: str, index: int) -> Partition | None:
        return self._partitions.get((topic, index))

    def _open(self, topic: str, index: int, topic_id=None) -> Partition:
        existing = self._partitions.get((topic, index))
        if existing is not None:
            return existing
        config = self.log_config_for(topic)
        partition_log = self.log_manager.get(topic, index) or self.log_manager.create(topic, index, config, topic_id=topic_id)
        partition_log.config = config
        partition = Partition(
            topic, index, partition_log, broker_id=self.broker_id,
            high_watermark=self.load_high_watermarks().get((topic, index), 0),
            replica_lag_time_max_ms=self.replica_lag_time_max_ms, alter_partition=self._alter_partition,
            isr_eligible=self.replica_isr_eligible,
        )
        partition.rebuild_producer_state()
        self._partitions[(topic, index)] = partition
        return partition

    def host(self, topic: str, index: int, leader_epoch: int, isr_size: int = 1) -> Partition:
        """Single-broker hosting (the embedded metadata): this broker leads, alone in the ISR."""
        existing = self._partitions.get((topic, index))
        if existing is not None:
            existing.leader_epoch = leader_epoch
            return existing
        partition = self._open(topic, index)
        partition.init_single_broker(leader_epoch)
        return partition

    def become_leader(self, topic: str, index: int, leader_epoch: int, isr: Iterable[int], replicas: Iterable[int],
                      partition_epoch: int, *, topic_id=None) -> ErrorCode:
        """LeaderAndIsr naming this broker leader: NONE, STALE_CONTROLLER_EPOCH for an old leader epoch, or
        UNKNOWN_TOPIC_OR_PARTITION when this broker is not among the replicas (nothing is created then)."""
        replicas = tuple(replicas)
        if self.broker_id not in replicas:
            return ErrorCode.unknown_topic_or_partition
        partition = self._open(topic, index, topic_id)
        return partition.become_leader(leader_epoch, isr, replicas, partition_epoch, now_ms=self.clock())

    def become_follower(self, topic: str, index: int, leader: int, leader_epoch: int, isr: Iterable[int],
                        replicas: Iterable[int], partition_epoch: int, *, topic_id=None) -> ErrorCode:
        """LeaderAndIsr naming another leader: NONE (the caller restarts the fetcher), STALE_CONTROLLER_EPOCH,
        or UNKNOWN_TOPIC_OR_PARTITION when this broker is not among the replicas (Kafka's answers)."""
        replicas = tuple(replicas)
        if self.broker_id not in replicas:
            return ErrorCode.unknown_topic_or_partition
        partition = self._open(topic, index, topic_id)
        return partition.become_follower(leader, leader_epoch, isr, replicas, partition_epoch)

    def stop_replica(self, topic: str, index: int, *, delete: bool) -> ErrorCode:
        """StopReplica for one partition (Kafka's ReplicaManager.stopReplicas; the caller removed its fetcher
        first): stop serving it, so waiting produces and long polls answer at once (NOT_LEADER_OR_FOLLOWER,
        an empty fetch). Without ``delete`` the partition stays hosted, role NONE, its log and leader epoch
        kept for a later LeaderAndIsr (controlled shutdown); with it the partition is forgotten and its log
        deleted (renamed aside now, removed in the background). NONE, also for a partition not hosted."""
        partition = self._partitions.get((topic, index))
        if partition is not None:
            partition.stop()
        if delete:
            self._partitions.pop((topic, index), None)
            doomed = self.log_manager.delete(topic, index)
            if doomed is not None:
                self.log_manager.remove_deleted([doomed])
            if self._checkpointed_hwms is not None:
                self._checkpointed_hwms.pop((topic, index), None)
        return ErrorCode.none

    def drop_topic(self, topic: str) -> None:
        for key in [key for key in self._partitions if key[0] == topic]:
            self._partitions.pop(key).stop()
        self.log_manager.delete_topic(topic)

    def update_config(self, topic: str) -> None:
        config = self.log_config_for(topic)
        for (name, _), partition in self._partitions.items():
            if name == topic:
                partition.log.config = config

    def partitions(self) -> Iterable[Partition]:
        return self._partitions.values()

    # -- produce ----------------------------------------------------------------------------------
    def append(self, topic: str, index: int, records, *, acks: int, min_insync_replicas: int,
               origin: str = "client", verification: VerificationGuard = NO_VERIFICATION) -> AppendOutcome:
        """Append a records field as leader. ``origin="coordinator"`` (Kafka's AppendOrigin.Coordinator: the
        group coordinator's transactional offset batches) skips the sequence checks; epochs and the
        transaction rules still apply."""
        partition = self._partitions.get((topic, index))
        if partition is None:
            return AppendOutcome(ErrorCode.unknown_topic_or_partition)
        if not partition.is_leader:
            return AppendOutcome(ErrorCode.not_leader_or_follower)
        if acks == -1 and len(partition.isr) < min_insync_replicas:
            return AppendOutcome(
                ErrorCode.not_enough_replicas,
                message=f"ISR has {len(partition.isr)} replicas, min.insync.replicas is {min_insync_replicas}",
            )
        try:
            outcome = partition.append(records, now_ms(), check_sequence=origin != "coordinator",
                                       verification=verification)
        except OSError as exc:
            log.debug("%s-%d: append refused with KAFKA_STORAGE_ERROR: %s", topic, index, exc)
            self.storage_errors.failed(partition.log.directory.parent, (topic, index), exc)
            return AppendOutcome(ErrorCode.kafka_storage_error, message=f"storage error: {exc.strerror or exc}")
        except ControlBatchFromClient as exc:
            return AppendOutcome(ErrorCode.invalid_record, message=str(exc))
        except CorruptRecordBatch as exc:
            return AppendOutcome(ErrorCode.corrupt_message, message=str(exc))
        except InvalidRecords as exc:  # (NullKeyRecords, a compacted topic's keyless records, name them)
            return AppendOutcome(ErrorCode.invalid_record, message=str(exc), record_errors=tuple(getattr(exc, "errors", ())))
        except RecordErrors as exc:
            return AppendOutcome(ErrorCode.invalid_timestamp, message=str(exc), record_errors=tuple(exc.errors))
        except InvalidRecordBatch as exc:
            return AppendOutcome(ErrorCode.corrupt_message, message=str(exc))
        except RecordTooLarge as exc:
            return AppendOutcome(ErrorCode.message_too_large, message=str(exc))
        except RecordBatchTooLarge as exc:  # (no error_message: Kafka sends none for it)
            log.debug("%s-%d: append refused with RECORD_LIST_TOO_LARGE: %s", topic, index, exc)
            return AppendOutcome(ErrorCode.record_list_too_large)
        except ProducerStateError as exc:
            return AppendOutcome(ErrorCode(exc.error_code), message=str(exc))
        if self.storage_errors.any_failing:  # (the produce path pays one attribute test)
            self.storage_errors.succeeded(partition.log.directory.parent)
        return outcome

    def append_marker(self, topic: str, index: int, *, producer_id: int, producer_epoch: int, commit: bool,
                      coordinator_epoch: int, min_insync_replicas: int = 1) -> AppendOutcome:
        """Write a transaction marker as leader (WriteTxnMarkers): NOT_LEADER_OR_FOLLOWER,
        UNKNOWN_TOPIC_OR_PARTITION, INVALID_PRODUCER_EPOCH, TRANSACTION_COORDINATOR_FENCED,
        KAFKA_STORAGE_ERROR, or NONE with the marker's offset (the caller waits for the ISR)."""
        partition = self._partitions.get((topic, index))
        if partition is None:
            return AppendOutcome(ErrorCode.unknown_topic_or_partition)
        if not partition.is_leader:
            return AppendOutcome(ErrorCode.not_leader_or_follower)
        if len(partition.isr) < min_insync_replicas:
            return AppendOutcome(ErrorCode.not_enough_replicas)
        try:
            return partition.append_marker(producer_id, producer_epoch, commit, coordinator_epoch, now_ms())
        except ProducerStateError as exc:
            return AppendOutcome(ErrorCode(exc.error_code), message=str(exc))
        except OSError as exc:
            self.storage_errors.failed(partition.log.directory.parent, (topic, index), exc)
            return AppendOutcome(ErrorCode.kafka_storage_error, message=f"storage error: {exc.strerror or exc}")

    def needs_replication_wait(self, topic: str, index: int, outcome: AppendOutcome, min_insync_replicas: int) -> bool:
        """Whether an acks=all append must wait for the ISR (never on a single broker: its HWM is the log end)."""
        if outcome.error != ErrorCode.none or outcome.last_offset < 0:
            return False
        partition = self._partitions.get((topic, index))
        if partition is None or not partition._remote:  # no follower: the HWM is already the log end
            return False
        done, _ = partition.check_enough_replicas_reach_offset(outcome.last_offset + 1, min_insync_replicas)
        return not done or len(partition.maximal_isr) < min_insync_replicas

    def delay_produce(self, waits: list[tuple[str, int, int, int]], timeout_ms: int) -> DelayedProduce:
        """A delayed produce for ``(topic, index, last offset, min.insync.replicas)`` appends; await
        ``self.purgatory.wait(operation)`` for one ErrorCode per entry."""
        # Called in the same event-loop step as the appends: every partition is still hosted.
        entries = [(self._partitions[(topic, index)], last_offset + 1, min_isr) for topic, index, last_offset, min_isr in waits]
        return self.purgatory.watch(entries, timeout_ms)

    # -- DeleteRecords ----------------------------------------------------------------------------
    def delete_records(self, topic: str, index: int, offset: int) -> tuple[ErrorCode, int, int]:
        """Kafka's deleteRecordsOnLocalLog for one partition: (error, required offset, low watermark).
        The log start moves at once on this leader (the caller awaits ``log_manager.write_log_start_checkpoint_async``);
        followers adopt it from their next fetch's answer, and ``await_low_watermarks`` waits for that as
        Kafka's DelayedDeleteRecords does."""
        partition = self._partitions.get((topic, index))
        if partition is None or not partition.is_leader:
            return ErrorCode.not_leader_or_follower, -1, -1
        try:
            required = partition.delete_records_on_leader(offset)
        except OffsetOutOfRange:
            return ErrorCode.offset_out_of_range, -1, -1
        except OSError as exc:
            self.storage_errors.failed(partition.log.directory.parent, (topic, index), exc)
            return ErrorCode.kafka_storage_error, -1, -1
        return ErrorCode.none, required, partition.low_watermark

    async def await_low_watermarks(self, required: dict[TopicPartition, int], timeout_s: float,
                                   ) -> dict[TopicPartition, tuple[ErrorCode, int]]:
        """Kafka's DelayedDeleteRecords: per partition, (NONE, low watermark) once the log start of every
        replica on a live broker reached its required offset, NOT_LEADER_OR_FOLLOWER if this broker stopped
        leading it meanwhile, REQUEST_TIMED_OUT (with the low watermark then) if the timeout passed first."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        results: dict[TopicPartition, tuple[ErrorCode, int]] = {}
        while True:
            pending = []
            for tp, offset in required.items():
                if tp in results:
                    continue
                partition = self._partitions.get(tp)
                if partition is None or not partition.is_leader:
                    results[tp] = (ErrorCode.not_leader_or_follower, -1)
                elif partition.low_watermark >= offset:
                    results[tp] = (ErrorCode.none, partition.low_watermark)
                else:
                    pending.append(partition)
            remaining = deadline - time.monotonic()
            if not pending or remaining <= 0:
                for partition in pending:
                    results[(partition.topic, partition.index)] = (ErrorCode.request_timed_out, partition.low_watermark)
                return results
            waiter = asyncio.get_running_loop().create_future()
            for partition in pending:
                partition.add_low_watermark_waiter(waiter)
            try:
                await asyncio.wait_for(waiter, remaining)
            except asyncio.TimeoutError:
                pass
            finally:
                for partition in pending:
                    partition.remove_low_watermark_waiter(waiter)

    # -- fetch ------------------------------------------------------------------------------------
    def read(self, partition: Partition, offset: int, max_bytes: int, *, min_one: bool, up_to_hwm: bool = True,
             read_committed: bool = False) -> ReadResult:
        """Whole batches from ``offset``; consumers never see past the high-water mark, read_committed ones
        past the last stable offset. Raises OffsetOutOfRange."""
        if read_committed:
            upper = partition.last_stable_offset
        else:
            upper = partition.high_watermark if up_to_hwm else None
        return partition.log.read(offset, max_bytes, upper_bound=upper, min_one=min_one)

    def watch(self, partitions: list[Partition], *, follower: bool = False) -> PartitionWatch:
        """A long poll's wake-up, registered now: create it in the same event-loop step as the read that found
        too little, then ``await watch.wait(timeout)``."""
        return PartitionWatch(partitions, follower=follower)

    async def wait_for_appends(self, partitions: list[Partition], timeout_s: float, *, follower: bool = False) -> None:
        """Park until one of ``partitions`` moves its HWM (consumers) or log end (followers), or the timeout."""
        await wait_for_partitions(partitions, timeout_s, follower=follower)


__all__ = [
    "ReplicaManager", "Partition", "AppendOutcome", "FileRecords", "OffsetOutOfRange", "now_ms", "HWM_CHECKPOINT",
]

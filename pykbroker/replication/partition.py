"""One hosted partition: its log, its role in the cluster, the ISR, followers' progress and the high-water mark.

Kafka's ``kafka.cluster.Partition`` (3.7, ZooKeeper mode) is the reference for every rule here:

* Role: LEADER, FOLLOWER or NONE, set by :meth:`Partition.become_leader` / :meth:`Partition.become_follower`
  (the LeaderAndIsr a controller sends). A state whose leader epoch is older than, or equal to, the one the
  partition has is ignored and answered STALE_CONTROLLER_EPOCH for that partition, as Kafka's
  ReplicaManager.becomeLeaderOrFollower does.
* Followers' progress (Kafka's Replica / ReplicaState): each remote replica's log end offset is the offset it
  fetches from; ``last_caught_up_time_ms`` moves to the fetch time when the fetch reached the leader's log end
  at the time of the read, or to the previous fetch's time when this fetch reached what the leader's log end
  was at that previous fetch. A follower is "caught up" when its log end is the leader's or it caught up
  within ``replica.lag.time.max.ms``.
* The high-water mark on the leader (maybeIncrementLeaderHW): the smallest log end offset over the leader
  and every follower that is in the *maximal* ISR (the committed ISR plus a replica whose addition is in
  flight) or that is caught up and so about to join; it never moves backwards and never passes the leader's
  log end. With no remote replica at all (the single broker) it is the log end offset, at once, as before.
  A follower takes the leader's HWM from its fetch responses, bounded by its own log end.
* ISR changes are *decisions*: shrink candidates are ISR followers no longer caught up; an expansion
  candidate is a follower not in the ISR whose log end reached the HWM and the start offset of the current
  leader epoch (so a replica that misses committed data of this epoch never joins). With an
  ``AlterPartitionPort`` plugged in (the cluster layer), a decision is made pending (Kafka's
  PendingShrinkIsr / PendingExpandIsr: one change in flight at a time) and submitted; the cluster layer
  answers with :meth:`isr_change_committed` or :meth:`isr_change_failed`. Without a port (the single
  broker) nothing is ever submitted, and with no followers there is nothing to shrink.
* Leader epochs (OffsetForLeaderEpoch, and fetches naming their last fetched epoch): the end of an epoch is the
  next epoch's start in the leader-epoch cache, the log end for the current one; a fetch whose last epoch ended
  below its fetch offset here gets that (epoch, end) back as its diverging epoch (Kafka's readRecords).
* Follower side (replication/fetcher.py drives it): append the leader's batches as they are, take its HWM and
  log start offset bounded by our own log, truncate to where the logs agree.
* acks=all produces wait in this partition's delayed-produce list (see purgatory.py) until the HWM reaches
  the end of their batches; long polls wait for an HWM move (consumers) or a log end move (followers).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Callable, Iterable, Protocol

from pykbroker.log.errors import OffsetOutOfRange
from pykbroker.log.partition_log import AppendResult, PartitionLog
from pykbroker.log.producer_state import NO_VERIFICATION, VerificationGuard
from pykbroker.protocol.control_records import Marker, read_marker
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.records import InvalidRecordBatch, iter_headers

if TYPE_CHECKING:
    from pykbroker.replication.purgatory import DelayedProduce

log = logging.getLogger(__name__)

DEFAULT_REPLICA_LAG_TIME_MAX_MS = 30000
UNKNOWN_OFFSET = -1
NO_LEADER = -1
NO_EPOCH = -1

# Committed ISR shrinks and expansions of partitions led here, per broker id (Kafka's IsrShrinksPerSec and
# IsrExpandsPerSec, read by pykbroker/metrics): counted when the controller accepts the change.
ISR_SHRINKS: Counter[int] = Counter()
ISR_EXPANDS: Counter[int] = Counter()


class Role(Enum):
    NONE = "none"
    LEADER = "leader"
    FOLLOWER = "follower"


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    error: ErrorCode
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    message: str | None = None
    record_errors: tuple[tuple[int, str], ...] = ()  # (batch index, message): Kafka's RecordValidationException
    last_offset: int = -1  # the last offset appended (acks=all waits for the HWM to pass it)
    has_followers: bool = False  # appended by a leader with remote replicas: acks=all may have to wait


class ControlBatchFromClient(InvalidRecordBatch):
    """Transaction markers are the broker's to write: Kafka answers INVALID_RECORD."""


class FollowerState:
    """What the leader knows of one remote replica (Kafka's ReplicaState), fed by that replica's fetches."""

    __slots__ = (
        "replica_id", "log_end_offset", "log_start_offset", "last_fetch_leader_log_end_offset",
        "last_fetch_time_ms", "last_caught_up_time_ms",
    )

    def __init__(self, replica_id: int) -> None:
        self.replica_id = replica_id
        self.log_end_offset = UNKNOWN_OFFSET
        self.log_start_offset = UNKNOWN_OFFSET
        self.last_fetch_leader_log_end_offset = UNKNOWN_OFFSET
        self.last_fetch_time_ms = 0
        self.last_caught_up_time_ms = 0

    def is_caught_up(self, leader_end_offset: int, now_ms: int, max_lag_ms: int) -> bool:
        return self.log_end_offset == leader_end_offset or now_ms - self.last_caught_up_time_ms <= max_lag_ms

    def update_fetch_state(self, fetch_offset: int, log_start_offset: int, fetch_time_ms: int, leader_end_offset: int) -> None:
        """A fetch at ``fetch_offset`` read while the leader's log ended at ``leader_end_offset``."""
        if fetch_offset >= leader_end_offset:
            caught_up = max(self.last_caught_up_time_ms, fetch_time_ms)
        elif fetch_offset >= self.last_fetch_leader_log_end_offset:
            caught_up = max(self.last_caught_up_time_ms, self.last_fetch_time_ms)
        else:
            caught_up = self.last_caught_up_time_ms
        self.log_end_offset = fetch_offset
        self.log_start_offset = log_start_offset
        self.last_fetch_leader_log_end_offset = max(leader_end_offset, self.last_fetch_leader_log_end_offset)
        self.last_fetch_time_ms = fetch_time_ms
        self.last_caught_up_time_ms = caught_up

    def reset(self, now_ms: int, leader_end_offset: int, *, new_leader: bool, in_sync: bool) -> None:
        """On a leadership change: an ISR member counts as caught up now, any other not at all (so it never
        holds the HWM back); a new leader forgets what an earlier leadership learned of the follower."""
        self.last_caught_up_time_ms = now_ms if in_sync else 0
        if new_leader:
            self.log_end_offset = UNKNOWN_OFFSET
            self.log_start_offset = UNKNOWN_OFFSET
            self.last_fetch_leader_log_end_offset = UNKNOWN_OFFSET
            self.last_fetch_time_ms = 0
        else:
            self.last_fetch_leader_log_end_offset = leader_end_offset
            self.last_fetch_time_ms = now_ms

    def __repr__(self) -> str:
        return (f"FollowerState({self.replica_id}, leo={self.log_end_offset}, "
                f"caught_up_at={self.last_caught_up_time_ms})")


@dataclass(frozen=True, slots=True)
class IsrChange:
    """A proposed ISR for the controller (the body of one AlterPartition partition entry)."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]
    added: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()

    @property
    def is_expand(self) -> bool:
        return bool(self.added)


class AlterPartitionPort(Protocol):
    """Where ISR decisions go (the cluster layer's AlterPartition sender). It must answer later, through
    Partition.isr_change_committed or Partition.isr_change_failed; submit itself must not block."""

    def submit(self, partition: "Partition", change: IsrChange) -> None: ...


class Partition:
    """One hosted partition: its log, producer state, replication state, and the requests waiting on it."""

    def __init__(
        self,
        topic: str,
        index: int,
        log: PartitionLog,
        *,
        broker_id: int,
        high_watermark: int = 0,
        replica_lag_time_max_ms: int = DEFAULT_REPLICA_LAG_TIME_MAX_MS,
        alter_partition: AlterPartitionPort | None = None,
        isr_eligible: Callable[[int], bool] = lambda replica_id: True,
    ) -> None:
        self.topic = topic
        self.index = index
        self.log = log
        self.broker_id = broker_id
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.alter_partition = alter_partition
        # Kafka's isReplicaIsrEligible (ZooKeeper mode: the broker is alive in the metadata cache): only such
        # a replica may join the ISR, and only such a caught-up replica holds the HWM back before it joins.
        self.isr_eligible = isr_eligible
        self.producer_state = log.producer_state
        # Replication state.
        self.role = Role.NONE
        self.is_leader = False
        self._hwm_is_log_end = False  # a leader without remote replicas: the HWM is the log end, at once
        self.leader_id = NO_LEADER
        self.leader_epoch = NO_EPOCH
        self.partition_epoch = -1  # Kafka's partition epoch (the zkVersion of the partition's state znode)
        self.replicas: tuple[int, ...] = ()
        self.isr: tuple[int, ...] = ()  # the committed ISR
        self.pending_isr_change: IsrChange | None = None
        self.leader_epoch_start_offset = UNKNOWN_OFFSET
        self._remote: dict[int, FollowerState] = {}
        self._hwm = max(min(high_watermark, log.log_end_offset), log.log_start_offset)
        # Waiters: consumers' long polls (woken when the HWM moves), followers' (when the log end moves).
        self._hwm_waiters: list[asyncio.Future] = []
        self._leo_waiters: list[asyncio.Future] = []
        self._lwm_waiters: list[asyncio.Future] = []  # DeleteRecords: woken when a follower's log start moves
        self.delayed_produces: list["DelayedProduce"] = []

    # -- state ------------------------------------------------------------------------------------
    @property
    def high_watermark(self) -> int:
        # A leader with no remote replica (the single broker) exposes its whole log at once, as Kafka's
        # maybeIncrementLeaderHW would compute right after every append.
        return self.log.log_end_offset if self._hwm_is_log_end else self._hwm

    def _set_role(self, role: Role) -> None:
        if self._hwm_is_log_end:
            self._hwm = self.log.log_end_offset  # what was exposed stays exposed
        self.role = role
        self.is_leader = role is Role.LEADER
        self._hwm_is_log_end = self.is_leader and not self._remote

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The ISR the HWM and acks=all must respect: a pending expansion counts, a pending shrink does not yet."""
        pending = self.pending_isr_change
        if pending is not None and pending.added:
            return self.isr + tuple(r for r in pending.added if r not in self.isr)
        return self.isr

    @property
    def high_watermark_lags_epoch_start(self) -> bool:
        """A new leader whose HWM is still below the start of its epoch: Kafka answers a consumer's ListOffsets
        (latest, or by timestamp) OFFSET_NOT_AVAILABLE meanwhile (for the cluster layer's ListOffsets)."""
        return self.role is Role.LEADER and self.leader_epoch_start_offset > self.high_watermark

    @property
    def isr_size(self) -> int:
        return len(self.isr)

    def follower_state(self, replica_id: int) -> FollowerState | None:
        return self._remote.get(replica_id)

    def followers(self) -> list[FollowerState]:
        return list(self._remote.values())

    def rebuild_producer_state(self) -> None:
        """Load the producer state from the log's newest usable snapshot and replay the batch headers (and
        markers) after it: open transactions come back, and aborted ones whose transaction-index entry a
        crash lost are indexed again (PartitionLog.load_producer_state)."""
        self.log.load_producer_state(self.high_watermark)

    @property
    def last_stable_offset(self) -> int:
        """min(high-water mark, first unstable offset): consumers reading committed data stop here. The first
        unstable offset is never below the log start (Kafka's maybeIncrementFirstUnstableOffset: DeleteRecords
        or retention past an open transaction's start)."""
        hwm = self.high_watermark
        state = self.producer_state
        if not state.has_unstable:
            return hwm
        first = state.first_unstable_offset(hwm)
        return hwm if first is None else min(hwm, max(first, self.log.log_start_offset))

    # -- LeaderAndIsr -----------------------------------------------------------------------------
    def init_single_broker(self, leader_epoch: int) -> None:
        """The embedded single-node default: leader, sole replica and ISR; nothing written to the log."""
        self.leader_id = self.broker_id
        self.leader_epoch = leader_epoch
        self.replicas = (self.broker_id,)
        self.isr = (self.broker_id,)
        self.leader_epoch_start_offset = self.log.log_end_offset
        self._remote.clear()
        self._set_role(Role.LEADER)

    def _stale(self, leader_epoch: int, action: str) -> ErrorCode | None:
        if leader_epoch <= self.leader_epoch:
            log.info("%s-%d: ignoring %s with leader epoch %d: not newer than the current leader epoch %d",
                     self.topic, self.index, action, leader_epoch, self.leader_epoch)
            return ErrorCode.stale_controller_epoch
        return None

    def become_leader(
        self,
        leader_epoch: int,
        isr: Iterable[int],
        replicas: Iterable[int],
        partition_epoch: int,
        *,
        now_ms: int,
    ) -> ErrorCode:
        """Kafka's makeLeader. NONE, or STALE_CONTROLLER_EPOCH (and nothing changes) for an old epoch."""
        stale = self._stale(leader_epoch, "become-leader")
        if stale is not None:
            return stale
        replicas = tuple(replicas)
        isr = tuple(isr)
        new_leader = self.role is not Role.LEADER
        followers = [r for r in replicas if r != self.broker_id]
        self._remote = {r: self._remote.get(r) or FollowerState(r) for r in followers}
        self.replicas = replicas
        self.isr = isr
        self.pending_isr_change = None
        self.partition_epoch = partition_epoch
        self.leader_epoch = leader_epoch
        self.leader_id = self.broker_id
        self._set_role(Role.LEADER)
        end = self.log.log_end_offset
        self.leader_epoch_start_offset = end
        # The new epoch starts at the log end, before anything is written in it (OffsetForLeaderEpoch).
        self.log.assign_epoch_start(leader_epoch, end)
        for state in self._remote.values():
            state.reset(now_ms, end, new_leader=new_leader, in_sync=state.replica_id in isr)
        self._hwm = max(min(self._hwm, end), self.log.log_start_offset)
        log.info("%s-%d: leader in epoch %d from offset %d, ISR %s, replicas %s, high-water mark %d",
                 self.topic, self.index, leader_epoch, end, list(isr), list(replicas), self._hwm)
        # The ISR may be down to this broker alone: the HWM may move, and waiting requests with it.
        self._maybe_increment_hwm(now_ms)
        self._after_state_change()
        return ErrorCode.none

    def become_follower(
        self,
        leader: int,
        leader_epoch: int,
        isr: Iterable[int],
        replicas: Iterable[int],
        partition_epoch: int,
    ) -> ErrorCode:
        """Kafka's makeFollower. NONE, or STALE_CONTROLLER_EPOCH for an old epoch. The caller (re)starts the
        fetcher from ``leader``: every accepted call is a new leader epoch."""
        stale = self._stale(leader_epoch, "become-follower")
        if stale is not None:
            return stale
        self._remote.clear()
        self.replicas = tuple(replicas)
        self.isr = tuple(isr)
        self.pending_isr_change = None
        self.partition_epoch = partition_epoch
        self.leader_epoch = leader_epoch
        self.leader_id = leader
        self._set_role(Role.FOLLOWER)
        self.leader_epoch_start_offset = UNKNOWN_OFFSET
        self._hwm = max(min(self._hwm, self.log.log_end_offset), self.log.log_start_offset)
        log.info("%s-%d: follower of broker %d in epoch %d, log end %d, high-water mark %d",
                 self.topic, self.index, leader, leader_epoch, self.log.log_end_offset, self._hwm)
        self._after_state_change()
        return ErrorCode.none

    def stop(self) -> None:
        """No longer hosted here (StopReplica, topic deleted): waiting requests answer at once."""
        self.leader_id = NO_LEADER
        self._remote.clear()
        self._set_role(Role.NONE)
        self._after_state_change()

    def _after_state_change(self) -> None:
        self.complete_delayed_produces()
        self._wake(self._hwm_waiters)
        self._wake(self._leo_waiters)
        self._wake(self._lwm_waiters)

    # -- high-water mark --------------------------------------------------------------------------
    def _maybe_increment_hwm(self, now_ms: int) -> bool:
        """Kafka's maybeIncrementLeaderHW; True if the HWM moved (the caller completes waiting requests)."""
        end = self.log.log_end_offset
        new = end
        maximal = self.maximal_isr
        lag = self.replica_lag_time_max_ms
        for replica_id, state in self._remote.items():
            if state.log_end_offset < new and (
                    replica_id in maximal or (state.is_caught_up(end, now_ms, lag) and self.isr_eligible(replica_id))):
                new = state.log_end_offset
        if new > self._hwm:
            self._hwm = new
            return True
        return False

    def _hwm_moved(self) -> None:
        self._stabilize()
        self.complete_delayed_produces()
        self._wake(self._hwm_waiters)

    def _stabilize(self) -> None:
        """Ended transactions whose marker is now below the HWM are stable (Kafka's onHighWatermarkUpdated),
        so ``log.first_unstable_offset`` is current without a ``last_stable_offset`` call."""
        if self.producer_state.has_unstable:
            self.producer_state.first_unstable_offset(self.high_watermark)

    def update_follower_fetch_state(
        self, replica_id: int, fetch_offset: int, log_start_offset: int, now_ms: int, leader_end_offset: int
    ) -> None:
        """A follower's fetch at ``fetch_offset`` was read (``leader_end_offset``: the log end before the read).

        Records its progress, may decide an ISR expansion, may move the HWM. The caller checked with
        :meth:`follower_fetch_error` that the replica is assigned.
        """
        state = self._remote.get(replica_id)
        if state is None or self.role is not Role.LEADER:
            return
        previous = state.log_end_offset
        previous_start = state.log_start_offset
        state.update_fetch_state(fetch_offset, log_start_offset, now_ms, leader_end_offset)
        if self._lwm_waiters and state.log_start_offset != previous_start:
            self._wake(self._lwm_waiters)
        self.maybe_expand_isr(replica_id)
        if previous != fetch_offset and self._maybe_increment_hwm(now_ms):
            self._hwm_moved()

    def follower_fetch_error(self, replica_id: int, current_leader_epoch: int) -> ErrorCode:
        """Kafka's followerReplicaOrThrow: a replica that is not assigned gets UNKNOWN_LEADER_EPOCH when its
        request named a leader epoch (it may be ahead of us), NOT_LEADER_OR_FOLLOWER when it did not."""
        if self.role is not Role.LEADER:
            return ErrorCode.not_leader_or_follower
        if replica_id in self._remote:
            return ErrorCode.none
        return ErrorCode.unknown_leader_epoch if current_leader_epoch != NO_EPOCH else ErrorCode.not_leader_or_follower

    # -- leader epochs (OffsetForLeaderEpoch, fetches naming their last fetched epoch) -------------
    def last_offset_for_leader_epoch(self, requested_epoch: int) -> tuple[int, int]:
        """(largest epoch <= ``requested_epoch``, the offset where it ends), (-1, -1) when unknown.

        Kafka's UnifiedLog.endOffsetForEpoch over the leader-epoch cache: the current epoch ends at the log end,
        a newer epoch than ours is unknown. A log nothing was ever appended to (the single broker's new
        partition, whose cache is empty) belongs wholly to the current epoch."""
        if requested_epoch == self.leader_epoch:
            return self.leader_epoch, self.log.log_end_offset
        if requested_epoch > self.leader_epoch:
            return NO_EPOCH, UNKNOWN_OFFSET
        epoch, end_offset = self.log.end_offset_for_epoch(requested_epoch)
        if epoch < 0 and self.log.latest_epoch < 0:
            return self.leader_epoch, self.log.log_end_offset
        return epoch, end_offset

    def diverging_epoch(self, fetch_offset: int, last_fetched_epoch: int) -> tuple[int, int] | None:
        """Kafka's Partition.readRecords check for a fetch that names its last fetched epoch (Fetch v12+).

        Returns None when the fetcher's log agrees with ours up to ``fetch_offset``, or the (epoch, end offset)
        it must truncate to (the response's diverging_epoch, no records). Raises OffsetOutOfRange when that
        epoch's end cannot be found or the fetch offset is below our log start, as Kafka does."""
        epoch, end_offset = self.last_offset_for_leader_epoch(last_fetched_epoch)
        log_start, log_end = self.log.log_start_offset, self.log.log_end_offset
        if epoch == NO_EPOCH or end_offset == UNKNOWN_OFFSET or fetch_offset < log_start:
            raise OffsetOutOfRange(fetch_offset, log_start, log_end)
        if epoch < last_fetched_epoch or end_offset < fetch_offset:
            return epoch, end_offset
        return None

    # -- ISR decisions ----------------------------------------------------------------------------
    def isr_shrink_candidates(self, now_ms: int) -> tuple[int, ...]:
        """ISR followers that are no longer caught up (Kafka's getOutOfSyncReplicas); none while a change is
        in flight, and none for a partition this broker does not lead."""
        if self.role is not Role.LEADER or self.pending_isr_change is not None:
            return ()
        end = self.log.log_end_offset
        lag = self.replica_lag_time_max_ms
        out = []
        for replica_id in self.isr:
            if replica_id == self.broker_id:
                continue
            state = self._remote.get(replica_id)
            if state is None or not state.is_caught_up(end, now_ms, lag):
                out.append(replica_id)
        return tuple(out)

    def is_expand_candidate(self, replica_id: int) -> bool:
        """Kafka's needsExpandIsr: not in the ISR, nothing in flight, and caught up to the HWM and to the start
        of the current leader epoch."""
        if self.role is not Role.LEADER or self.pending_isr_change is not None or replica_id in self.isr:
            return False
        state = self._remote.get(replica_id)
        if state is None or not self.isr_eligible(replica_id):
            return False
        end = state.log_end_offset
        return end >= self.high_watermark and self.leader_epoch_start_offset != UNKNOWN_OFFSET and end >= self.leader_epoch_start_offset

    def isr_expand_candidates(self) -> tuple[int, ...]:
        return tuple(r for r in self._remote if self.is_expand_candidate(r))

    def _change(self, isr: tuple[int, ...], added=(), removed=()) -> IsrChange:
        return IsrChange(self.topic, self.index, self.broker_id, self.leader_epoch, self.partition_epoch,
                         isr, tuple(added), tuple(removed))

    def maybe_shrink_isr(self, now_ms: int) -> IsrChange | None:
        """Propose the ISR without the lagging followers (through the port); None if nothing to do or no port."""
        out = self.isr_shrink_candidates(now_ms)
        if not out or self.alter_partition is None:
            return None
        change = self._change(tuple(r for r in self.isr if r not in out), removed=out)
        log.info("%s-%d: proposing ISR shrink from %s to %s (out of sync: %s)",
                 self.topic, self.index, list(self.isr), list(change.isr), list(out))
        self.pending_isr_change = change
        self.alter_partition.submit(self, change)
        return change

    def maybe_expand_isr(self, replica_id: int) -> IsrChange | None:
        if self.alter_partition is None or not self.is_expand_candidate(replica_id):
            return None
        change = self._change(self.isr + (replica_id,), added=(replica_id,))
        log.info("%s-%d: proposing ISR expansion from %s to %s", self.topic, self.index, list(self.isr), list(change.isr))
        # The maximal ISR now includes the replica: the HWM waits for it even before the controller agrees.
        self.pending_isr_change = change
        self.alter_partition.submit(self, change)
        return change

    def isr_change_committed(self, isr: Iterable[int], partition_epoch: int, *, now_ms: int) -> None:
        """The controller accepted an ISR (AlterPartition answered it with its new partition epoch)."""
        isr = tuple(isr)
        if len(isr) < len(self.isr):
            ISR_SHRINKS[self.broker_id] += 1
        elif len(isr) > len(self.isr):
            ISR_EXPANDS[self.broker_id] += 1
        self.isr = isr
        self.partition_epoch = partition_epoch
        self.pending_isr_change = None
        log.info("%s-%d: ISR is now %s (partition epoch %d)", self.topic, self.index, list(self.isr), partition_epoch)
        if self._maybe_increment_hwm(now_ms):
            self._hwm_moved()
        else:
            self.complete_delayed_produces()  # a smaller ISR may answer NOT_ENOUGH_REPLICAS_AFTER_APPEND

    def isr_change_failed(self) -> None:
        """The proposal was refused or lost: back to the committed ISR; the next fetch or check may retry."""
        self.pending_isr_change = None

    # -- leader appends ---------------------------------------------------------------------------
    def append(self, records, now: int, *, check_sequence: bool = True,
               verification: VerificationGuard = NO_VERIFICATION) -> AppendOutcome:
        """Append a producer's records field as leader; ``check_sequence`` False for the group coordinator's
        transactional offset batches (Kafka's AppendOrigin.Coordinator); ``verification`` the guard of a
        transactional produce verified with the coordinator (see ProducerStateManager.check_batches)."""
        headers = list(iter_headers(records))
        if not headers:
            raise InvalidRecordBatch("no record batch in the records field")
        if any(h.is_control for h in headers):
            raise ControlBatchFromClient("control batches are written by the broker, not by producers")
        idempotent = [h for h in headers if h.has_producer_id]
        if idempotent:
            # A retried batch is answered with its original offsets and nothing is appended (Kafka's rule).
            duplicate = self.producer_state.check_batches(idempotent, check_sequence=check_sequence,
                                                          verification=verification)
            if duplicate is not None:
                return AppendOutcome(
                    ErrorCode.none, duplicate.base_offset, duplicate.log_append_time_ms, self.log.log_start_offset,
                    last_offset=duplicate.last_offset, has_followers=bool(self._remote),
                )
        result = self.log.append(records, leader_epoch=self.leader_epoch, now_ms=now, check_sequence=check_sequence)
        if idempotent:
            for header in result.headers:
                if header.has_producer_id:
                    self.producer_state.update(header, result.log_append_time_ms)
        self._appended(now)
        return AppendOutcome(ErrorCode.none, result.base_offset, result.log_append_time_ms, result.log_start_offset,
                             last_offset=result.last_offset, has_followers=bool(self._remote))

    def _appended(self, now: int) -> None:
        if self._remote:
            self._wake(self._leo_waiters)
            if self._maybe_increment_hwm(now):
                self._hwm_moved()
        else:  # the HWM is the log end: it moved
            if self._hwm_waiters:
                self._wake(self._hwm_waiters)
            if self._leo_waiters:
                self._wake(self._leo_waiters)

    def append_marker(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                      now: int) -> AppendOutcome:
        """Write a COMMIT/ABORT marker as leader (WriteTxnMarkers): Kafka's checks first (raises
        ProducerStateError 47 / 52), then the control batch; the producer's transaction here ends, an abort
        is added to the transaction index, and the LSO moves once the HWM passes the marker."""
        state = self.producer_state
        state.check_marker(producer_id, producer_epoch, coordinator_epoch)
        result = self.log.append_marker(producer_id=producer_id, producer_epoch=producer_epoch, commit=commit,
                                        coordinator_epoch=coordinator_epoch, leader_epoch=self.leader_epoch, now_ms=now)
        header = result.headers[0]
        txn = state.update(header, -1, Marker(commit, coordinator_epoch))
        if txn is not None:
            self.log.index_aborted(txn, state.last_stable_offset_after(txn))
        self._appended(now)
        self._stabilize()
        return AppendOutcome(ErrorCode.none, result.base_offset, -1, result.log_start_offset,
                             last_offset=result.last_offset, has_followers=bool(self._remote))

    # -- DeleteRecords (leader side) ---------------------------------------------------------------
    def delete_records_on_leader(self, offset: int) -> int:
        """Kafka's Partition.deleteRecordsOnLeader: move the log start up to ``offset`` (-1: the HWM), whole
        segments below it deleted. Returns the offset; raises OffsetOutOfRange for a negative one or one past
        the HWM (the log start never passes it)."""
        hwm = self.high_watermark
        wanted = hwm if offset == -1 else offset
        if wanted < 0 or wanted > hwm:
            raise OffsetOutOfRange(wanted, self.log.log_start_offset, hwm)
        self.log.delete_records_before(wanted)
        return wanted

    @property
    def low_watermark(self) -> int:
        """Kafka's lowWatermarkIfLeader: the smallest log start offset of this replica and the remote
        replicas on live brokers (their log starts as their fetches report them)."""
        low = self.log.log_start_offset
        for replica_id, state in self._remote.items():
            if state.log_start_offset < low and self.isr_eligible(replica_id):
                low = state.log_start_offset
        return low

    def add_low_watermark_waiter(self, waiter: asyncio.Future) -> None:
        """``waiter`` gets a result when a follower reports another log start, or the role changes."""
        self._lwm_waiters.append(waiter)

    def remove_low_watermark_waiter(self, waiter: asyncio.Future) -> None:
        try:
            self._lwm_waiters.remove(waiter)
        except ValueError:
            pass

    # -- follower side (for the fetcher) ----------------------------------------------------------
    def append_as_follower(self, records, *, now_ms: int | None = None) -> AppendResult:
        """Append batches fetched from the leader as they are (offsets and epochs kept); raises the log's
        UnexpectedAppendOffset / InvalidRecordBatch. Producer state follows, so this replica can lead later."""
        result = self.log.append_as_follower(records, now_ms=now_ms)
        self.producer_state.replay_with_markers(
            ((h, read_marker(records, h) if h.is_control else None) for h in result.headers if h.has_producer_id),
            on_completed=self.log.index_aborted,
        )
        self._wake(self._leo_waiters)
        return result

    def update_high_watermark_from_leader(self, leader_high_watermark: int) -> bool:
        """A follower takes the HWM its leader sent, bounded by its own log (Kafka's updateHighWatermark)."""
        new = max(min(leader_high_watermark, self.log.log_end_offset), self.log.log_start_offset)
        if new == self._hwm:
            return False
        self._hwm = new
        self._stabilize()
        self._wake(self._hwm_waiters)
        return True

    def update_log_start_offset_from_leader(self, leader_log_start_offset: int) -> bool:
        """A follower moves its log start up to its leader's (Kafka's maybeIncrementLogStartOffset with
        LeaderOffsetIncremented), never past its own HWM (Kafka refuses that move; the next fetch's HWM
        allows it). True if it moved."""
        new = min(leader_log_start_offset, self.high_watermark)
        if new <= self.log.log_start_offset:
            return False
        self.log.delete_records_before(new)
        return True

    def truncate_to(self, offset: int) -> None:
        """Drop the log from ``offset`` on (diverging epochs); the HWM never stays above the log end. The
        producer state reloads from the newest snapshot at or below the new end (the log deleted those above)."""
        if offset >= self.log.log_end_offset:
            return
        self.log.truncate_to(offset)
        self._hwm = min(self._hwm, self.log.log_end_offset)
        self.rebuild_producer_state()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop the whole log and continue at ``offset`` (the leader's log start is past our log end)."""
        self.log.truncate_fully_and_start_at(offset)
        self._hwm = offset
        self.producer_state.rebuild(())

    # -- waiting ----------------------------------------------------------------------------------
    @staticmethod
    def _wake(waiters: list[asyncio.Future]) -> None:
        if not waiters:
            return
        pending = waiters[:]
        waiters.clear()
        for waiter in pending:
            if not waiter.done():
                waiter.set_result(None)

    def add_waiter(self, waiter: asyncio.Future, *, follower: bool = False) -> None:
        (self._leo_waiters if follower else self._hwm_waiters).append(waiter)

    def remove_waiter(self, waiter: asyncio.Future) -> None:
        for waiters in (self._hwm_waiters, self._leo_waiters):
            try:
                waiters.remove(waiter)
            except ValueError:
                pass

    def wake_waiters(self) -> None:
        self._wake(self._hwm_waiters)
        self._wake(self._leo_waiters)

    def complete_delayed_produces(self) -> None:
        if self.delayed_produces:
            for operation in self.delayed_produces[:]:
                operation.try_complete()

    def check_enough_replicas_reach_offset(self, required_offset: int, min_insync_replicas: int) -> tuple[bool, ErrorCode]:
        """Kafka's checkEnoughReplicasReachOffset: (done, error) for an acks=all append ending at
        ``required_offset`` (exclusive)."""
        if not self.is_leader:
            return True, ErrorCode.not_leader_or_follower
        if self.high_watermark >= required_offset:
            if min_insync_replicas <= len(self.maximal_isr):
                return True, ErrorCode.none
            return True, ErrorCode.not_enough_replicas_after_append
        return False, ErrorCode.none

    def __repr__(self) -> str:
        return (f"Partition({self.topic}-{self.index}, {self.role.value}, epoch={self.leader_epoch}, "
                f"isr={list(self.isr)}, hwm={self.high_watermark}, leo={self.log.log_end_offset})")


__all__ = [
    "AlterPartitionPort", "AppendOutcome", "ControlBatchFromClient", "FollowerState", "IsrChange", "Partition", "Role",
    "DEFAULT_REPLICA_LAG_TIME_MAX_MS",
]

"""Kafka's TransactionMetadata (TransactionMetadata.scala): one transactional id's state and its transitions.

A change is prepared first (``prepare_*`` returns a TxnTransit and sets the pending state, which makes
concurrent requests wait with CONCURRENT_TRANSACTIONS), written to __transaction_state, and applied with
``complete_transition`` once the append is acknowledged (or dropped with ``pending_state = None`` if it
failed). Valid previous states and the checks of ``complete_transition`` are Kafka's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
SHORT_MAX = 32767

TopicPartition = tuple[str, int]


class TransactionState(enum.Enum):
    EMPTY = (0, "Empty")
    ONGOING = (1, "Ongoing")
    PREPARE_COMMIT = (2, "PrepareCommit")
    PREPARE_ABORT = (3, "PrepareAbort")
    COMPLETE_COMMIT = (4, "CompleteCommit")
    COMPLETE_ABORT = (5, "CompleteAbort")
    DEAD = (6, "Dead")
    PREPARE_EPOCH_FENCE = (7, "PrepareEpochFence")

    @property
    def code(self) -> int:
        return self.value[0]

    @property
    def state_name(self) -> str:
        return self.value[1]

    @classmethod
    def from_code(cls, code: int) -> "TransactionState":
        for state in cls:
            if state.code == code:
                return state
        raise ValueError(f"unknown transaction status {code}")

    @classmethod
    def from_name(cls, name: str) -> "TransactionState | None":
        for state in cls:
            if state.state_name == name:
                return state
        return None


S = TransactionState
VALID_PREVIOUS_STATES: dict[TransactionState, frozenset[TransactionState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}
EXPIRATION_ALLOWED = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka keeps the last epoch free so that a fence (epoch + 1) never overflows."""
    return epoch >= SHORT_MAX - 1


class IllegalTransition(RuntimeError):
    """A transition Kafka's TransactionMetadata refuses (a bug, never a client's fault)."""


@dataclass(frozen=True)
class TxnTransit:
    """Kafka's TxnTransitMetadata: the state a prepared change writes to the log."""

    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TransactionState
    partitions: frozenset[TopicPartition]
    start_ms: int
    last_update_ms: int


class TransactionMetadata:
    def __init__(self, transactional_id: str, producer_id: int, last_producer_id: int, producer_epoch: int,
                 last_producer_epoch: int, timeout_ms: int, state: TransactionState,
                 partitions: set[TopicPartition] | frozenset[TopicPartition] = frozenset(),
                 start_ms: int = -1, last_update_ms: int = -1) -> None:
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.last_producer_id = last_producer_id
        self.producer_epoch = producer_epoch
        self.last_producer_epoch = last_producer_epoch
        self.timeout_ms = timeout_ms
        self.state = state
        self.partitions: set[TopicPartition] = set(partitions)
        self.start_ms = start_ms
        self.last_update_ms = last_update_ms
        self.pending_state: TransactionState | None = None
        self.has_failed_epoch_fence = False

    def __repr__(self) -> str:
        return (f"TransactionMetadata({self.transactional_id!r}, pid={self.producer_id}, epoch={self.producer_epoch}, "
                f"state={self.state.state_name}, pending={self.pending_state and self.pending_state.state_name}, "
                f"partitions={sorted(self.partitions)})")

    @property
    def pending_transition_in_progress(self) -> bool:
        return self.pending_state is not None

    @property
    def producer_epoch_exhausted(self) -> bool:
        return is_epoch_exhausted(self.producer_epoch)

    @property
    def has_pending_transaction(self) -> bool:
        return self.state in (S.ONGOING, S.PREPARE_ABORT, S.PREPARE_COMMIT)

    def remove_partition(self, tp: TopicPartition) -> None:
        self.partitions.discard(tp)

    # -- preparing changes ---------------------------------------------------------------------------

    def prepare_no_transit(self) -> TxnTransit:
        return TxnTransit(self.producer_id, self.last_producer_id, self.producer_epoch, self.last_producer_epoch,
                          self.timeout_ms, self.state, frozenset(self.partitions), self.start_ms, self.last_update_ms)

    def prepare_fence_producer_epoch(self) -> TxnTransit:
        if self.producer_epoch == SHORT_MAX:
            raise IllegalTransition("cannot fence a producer whose epoch is Short.MaxValue")
        # A fence whose write failed already bumped the epoch in memory: not again (never returned to a client).
        bumped = self.producer_epoch if self.has_failed_epoch_fence else self.producer_epoch + 1
        return self._prepare(S.PREPARE_EPOCH_FENCE, self.producer_id, bumped, NO_PRODUCER_EPOCH, self.timeout_ms,
                             self.partitions, self.start_ms, self.last_update_ms)

    def prepare_increment_producer_epoch(self, timeout_ms: int, expected_epoch: int | None,
                                         now_ms: int) -> TxnTransit | str:
        """The transit, or "PRODUCER_FENCED" (Kafka's Left)."""
        if self.producer_epoch_exhausted:
            raise IllegalTransition(f"no producer epoch left for producer id {self.producer_id}")
        bumped = self.producer_epoch + 1
        if expected_epoch is None:
            next_epoch, last_epoch = bumped, NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            next_epoch, last_epoch = bumped, self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:  # a retry of a bump whose answer was lost
            next_epoch, last_epoch = self.producer_epoch, self.last_producer_epoch
        else:
            return "PRODUCER_FENCED"
        return self._prepare(S.EMPTY, self.producer_id, next_epoch, last_epoch, timeout_ms, frozenset(), -1, now_ms)

    def prepare_producer_id_rotation(self, new_producer_id: int, timeout_ms: int, now_ms: int,
                                     record_last_epoch: bool) -> TxnTransit:
        if self.has_pending_transaction:
            raise IllegalTransition("cannot rotate producer ids while a transaction is still pending")
        return self._prepare(S.EMPTY, new_producer_id, 0, self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
                             timeout_ms, frozenset(), -1, now_ms)

    def prepare_add_partitions(self, added: set[TopicPartition] | frozenset[TopicPartition], now_ms: int) -> TxnTransit:
        start = now_ms if self.state in (S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT) else self.start_ms
        return self._prepare(S.ONGOING, self.producer_id, self.producer_epoch, self.last_producer_epoch,
                             self.timeout_ms, self.partitions | set(added), start, now_ms)

    def prepare_abort_or_commit(self, new_state: TransactionState, now_ms: int) -> TxnTransit:
        return self._prepare(new_state, self.producer_id, self.producer_epoch, self.last_producer_epoch,
                             self.timeout_ms, self.partitions, self.start_ms, now_ms)

    def prepare_complete(self, now_ms: int) -> TxnTransit:
        new_state = S.COMPLETE_COMMIT if self.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
        self.has_failed_epoch_fence = False  # the state change was written: a later fence bumps again
        return self._prepare(new_state, self.producer_id, self.producer_epoch, self.last_producer_epoch,
                             self.timeout_ms, frozenset(), self.start_ms, now_ms)

    def prepare_dead(self) -> TxnTransit:
        return self._prepare(S.DEAD, self.producer_id, self.producer_epoch, self.last_producer_epoch, self.timeout_ms,
                             frozenset(), self.start_ms, self.last_update_ms)

    def _prepare(self, state: TransactionState, producer_id: int, epoch: int, last_epoch: int, timeout_ms: int,
                 partitions, start_ms: int, last_update_ms: int) -> TxnTransit:
        if self.pending_state is not None:
            raise IllegalTransition(f"{self.transactional_id}: a transition to {self.pending_state.state_name} "
                                    f"is pending, cannot prepare {state.state_name}")
        if state is not S.DEAD and epoch < 0:
            raise IllegalTransition(f"{self.transactional_id}: producer epoch {epoch} for {state.state_name}")
        if timeout_ms <= 0:
            raise IllegalTransition(f"{self.transactional_id}: transaction timeout {timeout_ms}")
        if self.state not in VALID_PREVIOUS_STATES[state]:
            raise IllegalTransition(f"{self.transactional_id}: {self.state.state_name} -> {state.state_name}")
        self.pending_state = state
        return TxnTransit(producer_id, self.producer_id, epoch, last_epoch, timeout_ms, state, frozenset(partitions),
                          start_ms, last_update_ms)

    # -- applying a written change -------------------------------------------------------------------

    def complete_transition(self, transit: TxnTransit) -> None:
        """Kafka's completeTransitionTo: apply a change whose log append was acknowledged."""
        to = transit.state
        if self.pending_state is not to:
            raise IllegalTransition(f"{self.transactional_id}: completing {to.state_name}, pending "
                                    f"{self.pending_state and self.pending_state.state_name}")
        if to is S.EMPTY:
            if ((self.producer_epoch != transit.producer_epoch and not self._valid_epoch_bump(transit))
                    or transit.partitions or transit.start_ms != -1):
                self._fail(transit)
        elif to is S.ONGOING:
            if (not self._same_producer(transit) or not transit.partitions.issuperset(self.partitions)
                    or self.timeout_ms != transit.timeout_ms):
                self._fail(transit)
            self.start_ms = transit.start_ms
            self.partitions = set(transit.partitions)
        elif to in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            if not self._same_producer(transit) or transit.start_ms != self.start_ms:
                self._fail(transit)
        elif to in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            if not self._same_producer(transit) or transit.start_ms != self.start_ms:
                self._fail(transit)
            self.partitions.clear()
        elif to is S.DEAD:
            if not self._same_producer(transit) or transit.partitions or transit.start_ms != self.start_ms:
                self._fail(transit)
        else:
            self._fail(transit)
        self.timeout_ms = transit.timeout_ms
        self.producer_id = transit.producer_id
        self.last_producer_id = transit.last_producer_id
        self.producer_epoch = transit.producer_epoch
        self.last_producer_epoch = transit.last_producer_epoch
        self.last_update_ms = transit.last_update_ms
        self.pending_state = None
        self.state = to

    def _same_producer(self, transit: TxnTransit) -> bool:
        return self.producer_id == transit.producer_id and self.producer_epoch == transit.producer_epoch

    def _valid_epoch_bump(self, transit: TxnTransit) -> bool:
        # A new producer id starts at 0; the same id goes up by one, or stays for a retried bump.
        if transit.producer_id != self.producer_id:
            return transit.producer_epoch == 0
        return transit.producer_epoch in (self.producer_epoch + 1, self.producer_epoch)

    def _fail(self, transit: TxnTransit) -> None:
        raise IllegalTransition(f"{self.transactional_id}: cannot complete {self.state.state_name} -> "
                                f"{transit.state.state_name} with {transit}")

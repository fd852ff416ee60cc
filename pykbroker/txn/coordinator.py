"""Kafka's TransactionCoordinator (TransactionCoordinator.scala), rule for rule, on the broker's loop.

Where Kafka takes the metadata's lock, a request here runs without awaiting between its checks and its
``prepare_*`` (the pending state then keeps concurrent requests out: CONCURRENT_TRANSACTIONS); the log
append is awaited and applied by the state manager. Errors are Kafka's (PRODUCER_FENCED is mapped to
INVALID_PRODUCER_EPOCH for old request versions by the handlers, as KafkaApis does).

* InitProducerId: a new id gets a fresh producer id and epoch 0; an existing one's epoch is bumped
  (fencing the previous producer), a new producer id when the epoch is exhausted. An Ongoing transaction
  is aborted first with a bumped epoch (markers carry it) and the caller gets CONCURRENT_TRANSACTIONS until
  it is complete; PrepareCommit/PrepareAbort: CONCURRENT_TRANSACTIONS. KIP-360 (v3+): a known producer id
  and epoch re-initialise without fencing, a stale one is PRODUCER_FENCED.
* AddPartitionsToTxn / AddOffsetsToTxn: Ongoing with the partitions added; verification (v4 verify_only)
  answers per partition whether it is in the transaction.
* EndTxn: PrepareCommit/PrepareAbort written, answered, markers sent; then CompleteCommit/CompleteAbort.
  A retried EndTxn after completion is answered NONE (same result) or INVALID_TXN_STATE.
* Every transaction.abort.timed.out.transaction.cleanup.interval.ms, Ongoing transactions older than their
  timeout are aborted with a bumped epoch; every transaction.remove.expired.transaction.cleanup.interval.ms
  ids idle for transactional.id.expiration.ms are removed (a tombstone).
* Leadership of a __transaction_state partition loads it (COORDINATOR_LOAD_IN_PROGRESS meanwhile) and then
  resends the markers of its transactions in PrepareCommit/PrepareAbort; losing it unloads it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable

from pykbroker.protocol.errors import ErrorCode
from pykbroker.txn.log import TRANSACTION_STATE_TOPIC
from pykbroker.txn.markers import MarkerSender, PendingCompleteTxn
from pykbroker.txn.metadata import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    IllegalTransition,
    TopicPartition,
    TransactionMetadata,
    TransactionState,
    is_epoch_exhausted,
)
from pykbroker.txn.state_manager import TransactionStateManager

log = logging.getLogger(__name__)

S = TransactionState


@dataclass(frozen=True)
class TxnConfig:
    max_timeout_ms: int = 900000  # transaction.max.timeout.ms
    id_expiration_ms: int = 604800000  # transactional.id.expiration.ms
    abort_interval_ms: int = 10000  # transaction.abort.timed.out.transaction.cleanup.interval.ms
    remove_expired_interval_ms: int = 3600000  # transaction.remove.expired.transaction.cleanup.interval.ms

    @classmethod
    def from_broker_config(cls, config) -> "TxnConfig":
        return cls(
            max_timeout_ms=int(config.get("transaction.max.timeout.ms")),
            id_expiration_ms=int(config.get("transactional.id.expiration.ms")),
            abort_interval_ms=int(config.get("transaction.abort.timed.out.transaction.cleanup.interval.ms")),
            remove_expired_interval_ms=int(config.get("transaction.remove.expired.transaction.cleanup.interval.ms")),
        )


class TransactionCoordinator:
    """``new_producer_id()`` returns (error, producer id) (cluster/producer_ids.ProducerRegistry.new_id);
    ``leader_epoch(index)`` the leader epoch of a __transaction_state partition led here (the coordinator
    epoch), None if not led; ``markers`` is built by the caller with ``is_current``/``write_completion``
    bound to this coordinator (see ``make_marker_sender``)."""

    def __init__(self, state: TransactionStateManager, new_producer_id: Callable[[], Awaitable[tuple[ErrorCode, int]]],
                 leader_epoch: Callable[[int], int | None], config: TxnConfig | None = None,
                 now_ms: Callable[[], int] | None = None) -> None:
        self.state = state
        self._new_producer_id = new_producer_id
        self._leader_epoch = leader_epoch
        self.config = config or TxnConfig()
        self._now = now_ms or (lambda: int(time.time() * 1000))
        self.markers: MarkerSender | None = None
        self._loading: dict[int, asyncio.Task] = {}
        self._loading_epochs: dict[int, int] = {}  # the coordinator epoch each load in progress loads with
        self._tasks: set[asyncio.Task] = set()
        self.active = True

    def make_marker_sender(self, broker_id: int, **kwargs) -> MarkerSender:
        self.markers = MarkerSender(broker_id, is_current=self._is_current, write_completion=self._write_completion,
                                    **kwargs)
        return self.markers

    def _spawn(self, work) -> asyncio.Task:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("transaction coordinator task failed", exc_info=task.exception())

    # ==================================================================================================
    # Leadership of __transaction_state partitions

    def on_leadership_change(self, topic: str, index: int, is_leader: bool) -> None:
        if topic != TRANSACTION_STATE_TOPIC or not 0 <= index < self.state.num_partitions:
            return
        if is_leader:
            # Kafka's onElection: load with the partition's leader epoch as the coordinator epoch; nothing to do
            # if loaded or loading with that epoch already, a reload for a newer one.
            epoch = self._leader_epoch(index)
            if epoch is None or self._loading_epochs.get(index, self.state.coordinator_epoch(index)) == epoch:
                return
            self._unload(index)
            self._loading_epochs[index] = epoch
            self._loading[index] = self._spawn(self._load(index, epoch))
            return
        self._unload(index)

    def _unload(self, index: int) -> None:
        loading = self._loading.pop(index, None)
        self._loading_epochs.pop(index, None)
        if loading is not None:
            loading.cancel()
        self.state.unload_partition(index)
        if self.markers is not None:
            self.markers.remove_for_txn_partition(index)

    async def _load(self, index: int, coordinator_epoch: int) -> None:
        started = time.monotonic()
        try:
            loaded = await self.state.load_partition(index, coordinator_epoch)
        finally:
            if self._loading.get(index) is asyncio.current_task():
                del self._loading[index]
                del self._loading_epochs[index]
        if loaded is None:
            return
        log.info("transaction coordinator loaded %d transactional ids of %s-%d (coordinator epoch %d) in %.0f ms",
                 len(loaded), TRANSACTION_STATE_TOPIC, index, coordinator_epoch, (time.monotonic() - started) * 1000)
        now = self._now()
        for metadata in loaded.values():  # failover: finish what the previous coordinator prepared
            if metadata.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT) and metadata.pending_state is None:
                commit = metadata.state is S.PREPARE_COMMIT
                self._send_markers(coordinator_epoch, commit, metadata, metadata.prepare_complete(now))

    @property
    def loading_partitions(self) -> frozenset[int]:
        return frozenset(self.state.loading)

    # ==================================================================================================
    # InitProducerId

    async def handle_init_producer_id(self, transactional_id: str, timeout_ms: int, producer_id: int = NO_PRODUCER_ID,
                                      producer_epoch: int = NO_PRODUCER_EPOCH) -> tuple[ErrorCode, int, int]:
        """(error, producer id, epoch) for a non-null transactional id."""
        failed = (NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
        if transactional_id == "":
            return (ErrorCode.invalid_request, *failed)
        if (producer_id == NO_PRODUCER_ID) != (producer_epoch == NO_PRODUCER_EPOCH):
            return (ErrorCode.invalid_request, *failed)
        expected = None if producer_id == NO_PRODUCER_ID else (producer_id, producer_epoch)
        if not 0 < timeout_ms <= self.config.max_timeout_ms:
            return (ErrorCode.invalid_transaction_timeout, *failed)
        error, epoch, metadata = self.state.get_state(transactional_id)
        if error != ErrorCode.none:
            return (error, *failed)
        fresh_id = None
        if metadata is None or (metadata.producer_epoch_exhausted and not metadata.pending_transition_in_progress):
            error, fresh_id = await self._new_producer_id()  # may wait for a block of ids
            if error != ErrorCode.none:
                return (error, *failed)
            error, epoch, metadata = self.state.get_state(transactional_id)  # again, after the wait
            if error != ErrorCode.none:
                return (error, *failed)
        now = self._now()
        if metadata is None:
            metadata = TransactionMetadata(transactional_id, fresh_id, NO_PRODUCER_ID, NO_PRODUCER_EPOCH,
                                           NO_PRODUCER_EPOCH, timeout_ms, S.EMPTY, last_update_ms=now)
            epoch, metadata = self.state.put_if_absent(metadata)
        if metadata.pending_transition_in_progress:
            return (ErrorCode.concurrent_transactions, *failed)
        if expected is not None and not _is_valid_producer_id(metadata, *expected):
            return (ErrorCode.producer_fenced, *failed)
        if metadata.state in (S.PREPARE_ABORT, S.PREPARE_COMMIT):
            return (ErrorCode.concurrent_transactions, *failed)
        if metadata.state is S.ONGOING:
            # Abort it first with a bumped epoch (never returned); the client retries and bumps again.
            transit = metadata.prepare_fence_producer_epoch()
            error = await self.handle_end_txn(transactional_id, transit.producer_id, transit.producer_epoch,
                                              commit=False, from_client=False)
            return (error if error != ErrorCode.none else ErrorCode.concurrent_transactions, *failed)
        if metadata.state not in (S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT):
            log.error("InitProducerId for %s in state %s", transactional_id, metadata.state.state_name)
            return (ErrorCode.unknown_server_error, *failed)
        if metadata.producer_epoch_exhausted and (expected is None or expected[1] == metadata.producer_epoch):
            if fresh_id is None:  # became exhausted while the id was allocated for another reason: ask again
                return (ErrorCode.concurrent_transactions, *failed)
            transit = metadata.prepare_producer_id_rotation(fresh_id, timeout_ms, now, expected is not None)
        else:
            transit = metadata.prepare_increment_producer_epoch(timeout_ms, None if expected is None else expected[1], now)
            if isinstance(transit, str):
                return (ErrorCode.producer_fenced, *failed)
        error = await self.state.append(transactional_id, epoch, transit, now)
        if error != ErrorCode.none:
            return (error, *failed)
        return ErrorCode.none, transit.producer_id, transit.producer_epoch

    # ==================================================================================================
    # AddPartitionsToTxn, AddOffsetsToTxn and their verification

    async def handle_add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                    partitions: Iterable[TopicPartition]) -> ErrorCode:
        partitions = set(partitions)
        if not transactional_id:
            return ErrorCode.invalid_request
        error, epoch, metadata = self.state.get_state(transactional_id)
        if error != ErrorCode.none:
            return error
        if metadata is None or metadata.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping
        if metadata.producer_epoch != producer_epoch:
            return ErrorCode.producer_fenced
        if metadata.pending_transition_in_progress or metadata.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return ErrorCode.concurrent_transactions
        if metadata.state is S.ONGOING and partitions <= metadata.partitions:
            return ErrorCode.none
        if metadata.state not in (S.EMPTY, S.ONGOING, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            return ErrorCode.invalid_txn_state
        now = self._now()
        return await self.state.append(transactional_id, epoch, metadata.prepare_add_partitions(partitions, now), now)

    def handle_verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                 partitions: Iterable[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        partitions = list(partitions)
        if not transactional_id:
            return {tp: ErrorCode.invalid_request for tp in partitions}
        error, _, metadata = self.state.get_state(transactional_id)
        if error == ErrorCode.none:
            if metadata is None or metadata.producer_id != producer_id:
                error = ErrorCode.invalid_producer_id_mapping
            elif metadata.producer_epoch != producer_epoch:
                error = ErrorCode.producer_fenced
            elif metadata.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                error = ErrorCode.concurrent_transactions
        if error != ErrorCode.none:
            return {tp: error for tp in partitions}
        return {tp: ErrorCode.none if tp in metadata.partitions else ErrorCode.invalid_txn_state for tp in partitions}

    # ==================================================================================================
    # EndTxn

    async def handle_end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
                             from_client: bool = True) -> ErrorCode:
        if not transactional_id:
            return ErrorCode.invalid_request
        error, coordinator_epoch, metadata = self.state.get_state(transactional_id)
        if error != ErrorCode.none:
            return error
        if metadata is None or metadata.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping
        # Clients must match the epoch exactly; the coordinator's own abort (a fence) carries a bumped one.
        if (from_client and producer_epoch != metadata.producer_epoch) or producer_epoch < metadata.producer_epoch:
            return ErrorCode.producer_fenced
        # Kafka lets only the fence's own abort through a pending PrepareEpochFence (its window between the
        # lock and endTransaction is a thread's; here the fence's task runs an iteration later): a client's
        # EndTxn meanwhile gets CONCURRENT_TRANSACTIONS, as for any pending transition.
        if metadata.pending_transition_in_progress and (from_client or metadata.pending_state is not S.PREPARE_EPOCH_FENCE):
            return ErrorCode.concurrent_transactions
        state = metadata.state
        is_epoch_fence = False
        if state is S.ONGOING:
            if not commit and metadata.pending_state is S.PREPARE_EPOCH_FENCE:
                is_epoch_fence = True
                metadata.pending_state = None
                metadata.producer_epoch = producer_epoch
                metadata.last_producer_epoch = NO_PRODUCER_EPOCH
            now = self._now()
            transit = metadata.prepare_abort_or_commit(S.PREPARE_COMMIT if commit else S.PREPARE_ABORT, now)
        elif state is S.COMPLETE_COMMIT:
            return ErrorCode.none if commit else self._invalid_state(transactional_id, state, commit)
        elif state is S.COMPLETE_ABORT:
            return ErrorCode.none if not commit else self._invalid_state(transactional_id, state, commit)
        elif state is S.PREPARE_COMMIT:
            return ErrorCode.concurrent_transactions if commit else self._invalid_state(transactional_id, state, commit)
        elif state is S.PREPARE_ABORT:
            return ErrorCode.concurrent_transactions if not commit else self._invalid_state(transactional_id, state, commit)
        else:  # Empty (Dead, PrepareEpochFence are never current states of a live id)
            return self._invalid_state(transactional_id, state, commit)
        error = await self.state.append(transactional_id, coordinator_epoch, transit, now)
        if error != ErrorCode.none:
            if is_epoch_fence:
                err, epoch, current = self.state.get_state(transactional_id)
                if err == ErrorCode.none and current is not None and epoch == coordinator_epoch:
                    current.has_failed_epoch_fence = True
            return error
        # Written: the transaction is PrepareCommit/PrepareAbort; check nothing moved, then send the markers.
        error, epoch, current = self.state.get_state(transactional_id)
        if error != ErrorCode.none:
            return error
        if current is None or epoch != coordinator_epoch:
            return ErrorCode.not_coordinator
        if current.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping
        if current.producer_epoch != producer_epoch:
            return ErrorCode.producer_fenced
        if current.pending_transition_in_progress:
            return ErrorCode.concurrent_transactions
        expected = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        if current.state is not expected:
            return self._invalid_state(transactional_id, current.state, commit)
        self._send_markers(coordinator_epoch, commit, current, current.prepare_complete(self._now()))
        return ErrorCode.none

    @staticmethod
    def _invalid_state(transactional_id: str, state: TransactionState, commit: bool) -> ErrorCode:
        log.debug("EndTxn(%s) of %s in state %s: INVALID_TXN_STATE", "commit" if commit else "abort",
                  transactional_id, state.state_name)
        return ErrorCode.invalid_txn_state

    # ==================================================================================================
    # Markers and completion

    def _send_markers(self, coordinator_epoch: int, commit: bool, metadata: TransactionMetadata, transit) -> None:
        pending = PendingCompleteTxn(metadata.transactional_id, coordinator_epoch, metadata, transit, commit,
                                     txn_partition=self.state.partition_for(metadata.transactional_id))
        if self.markers is None:
            raise RuntimeError("no marker sender")
        self.markers.add_markers(pending)

    def _is_current(self, pending: PendingCompleteTxn) -> bool:
        return self.state.is_coordinator_epoch(pending.transactional_id, pending.coordinator_epoch)

    def _write_completion(self, pending: PendingCompleteTxn) -> None:
        self._spawn(self._complete(pending))

    async def _complete(self, pending: PendingCompleteTxn) -> None:
        """Kafka's writeTxnCompletion: retried while the log is unavailable; given up when another
        coordinator has the id (it completes the transaction after loading)."""
        delay = 0.1
        while True:
            error = await self.state.append(pending.transactional_id, pending.coordinator_epoch, pending.transit,
                                            self._now(),
                                            retry_on_error=lambda e: e == ErrorCode.coordinator_not_available)
            if error != ErrorCode.coordinator_not_available:
                break
            log.warning("writing the completion of %s failed (%s): retrying", pending.transactional_id, error.name)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        if error != ErrorCode.none:
            log.info("completion of %s not written (%s): another coordinator has it", pending.transactional_id,
                     error.name)

    # ==================================================================================================
    # Describe and list

    def describe(self, transactional_id: str) -> tuple[ErrorCode, TransactionMetadata | None]:
        if not self.active:
            return ErrorCode.coordinator_not_available, None
        if not transactional_id:
            return ErrorCode.transactional_id_not_found, None
        error, _, metadata = self.state.get_state(transactional_id)
        if error != ErrorCode.none:
            return error, None
        if metadata is None or metadata.state is S.DEAD:
            return ErrorCode.transactional_id_not_found, None
        return ErrorCode.none, metadata

    def list_transactions(self, states: list[str], producer_ids: list[int]):
        if not self.active:
            return ErrorCode.coordinator_not_available, [], []
        return self.state.list_transactions(states, producer_ids)

    # ==================================================================================================
    # Timeouts and expiration

    def abort_timed_out_transactions(self) -> int:
        """Abort (with a bumped epoch) every Ongoing transaction older than its timeout; returns how many."""
        now = self._now()
        count = 0
        for _, metadata in self.state.all_transactions():
            if metadata.pending_transition_in_progress or metadata.state is not S.ONGOING:
                continue
            if metadata.start_ms + metadata.timeout_ms >= now:
                continue
            try:
                transit = metadata.prepare_fence_producer_epoch()
            except IllegalTransition as exc:
                log.error("cannot abort timed-out transaction %s: %s", metadata.transactional_id, exc)
                continue
            log.info("aborting transaction %s (producer id %d): older than its timeout of %d ms",
                     metadata.transactional_id, metadata.producer_id, metadata.timeout_ms)
            count += 1
            self._spawn(self._abort_timed_out(metadata.transactional_id, transit.producer_id, transit.producer_epoch))
        return count

    async def _abort_timed_out(self, transactional_id: str, producer_id: int, producer_epoch: int) -> None:
        error = await self.handle_end_txn(transactional_id, producer_id, producer_epoch, commit=False, from_client=False)
        if error != ErrorCode.none:
            log.info("aborting timed-out transaction %s: %s", transactional_id, error.name)

    def remove_expired_transactional_ids(self) -> int:
        now = self._now()
        count = 0
        for epoch, metadata in self.state.expirable(now, self.config.id_expiration_ms):
            transit = metadata.prepare_dead()
            count += 1
            self._spawn(self._expire(metadata.transactional_id, epoch, transit, now))
        return count

    async def _expire(self, transactional_id: str, epoch: int, transit, now: int) -> None:
        error = await self.state.append(transactional_id, epoch, transit, now)
        if error == ErrorCode.none:
            self.state.remove_if_dead(transactional_id, epoch)
            log.info("transactional id %s expired", transactional_id)

    async def run(self) -> None:
        """The background task: timeouts and expiration."""
        abort_s = self.config.abort_interval_ms / 1000
        expire_s = self.config.remove_expired_interval_ms / 1000
        loop = asyncio.get_running_loop()
        next_expire = loop.time() + expire_s
        try:
            while True:
                await asyncio.sleep(min(abort_s, max(next_expire - loop.time(), 0)))
                try:
                    self.abort_timed_out_transactions()
                    if loop.time() >= next_expire:
                        next_expire = loop.time() + expire_s
                        self.remove_expired_transactional_ids()
                except Exception:
                    log.exception("transaction timeout check failed")
        finally:
            await self.close()

    async def close(self) -> None:
        self.active = False
        for task in list(self._loading.values()) + list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._loading.values(), *self._tasks, return_exceptions=True)
        self._loading.clear()
        if self.markers is not None:
            await self.markers.close()


def _is_valid_producer_id(metadata: TransactionMetadata, producer_id: int, producer_epoch: int) -> bool:
    """Kafka's isValidProducerId for a KIP-360 re-initialisation."""
    return (metadata.producer_epoch == NO_PRODUCER_EPOCH or producer_id == metadata.producer_id
            or (producer_id == metadata.last_producer_id and is_epoch_exhausted(producer_epoch)))

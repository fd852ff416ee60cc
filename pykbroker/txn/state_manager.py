"""Kafka's TransactionStateManager: the transactional ids of the __transaction_state partitions this broker
leads, loaded from and written to that topic.

* ``partition_for(id)`` = ``Utils.abs(id.hashCode()) % partitions`` (the groups' hash).
* Leadership: ``load_partition`` replays a partition's log (COORDINATOR_LOAD_IN_PROGRESS for its ids
  meanwhile) and keeps it with its coordinator epoch (the partition's leader epoch);
  ``unload_partition`` forgets it (NOT_COORDINATOR from then on).
* ``append`` writes one transit as one record with acks=all (transaction.state.log.min.isr applies) and,
  once the append is acknowledged (replicated to the ISR in a cluster), applies it to memory, but only if
  the partition is still loaded with the same coordinator epoch; the log's errors are mapped as Kafka maps
  them (COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, UNKNOWN_SERVER_ERROR). A failed append clears the
  pending state unless the caller retries it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Callable

from pykbroker.groups.offset_store import partition_for_group
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.records import build_batch, read_records
from pykbroker.txn.log import TRANSACTION_STATE_TOPIC, TxnLogValue, decode_key, decode_value, encode_key, encode_value
from pykbroker.txn.metadata import (
    EXPIRATION_ALLOWED,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TransactionMetadata,
    TransactionState,
    TxnTransit,
)

log = logging.getLogger(__name__)

DEFAULT_PARTITIONS = 50  # transaction.state.log.num.partitions
LOAD_BATCHES_PER_STEP = 64


def append_error(error: ErrorCode) -> ErrorCode:
    """TransactionStateManager.appendTransactionToLog's mapping of a failed append."""
    if error in (ErrorCode.unknown_topic_or_partition, ErrorCode.not_enough_replicas,
                 ErrorCode.not_enough_replicas_after_append, ErrorCode.request_timed_out):
        return ErrorCode.coordinator_not_available
    if error in (ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error):
        return ErrorCode.not_coordinator
    if error in (ErrorCode.message_too_large, ErrorCode.record_list_too_large):
        return ErrorCode.unknown_server_error
    return error


@dataclass
class _PartitionCache:
    coordinator_epoch: int
    ids: dict[str, TransactionMetadata] = field(default_factory=dict)


def metadata_from_log(transactional_id: str, value: TxnLogValue) -> TransactionMetadata:
    """TransactionLog.readTxnRecordValue: the last producer id and epoch are not in the record."""
    return TransactionMetadata(transactional_id, value.producer_id, NO_PRODUCER_ID, value.producer_epoch,
                               NO_PRODUCER_EPOCH, value.timeout_ms, value.state, set(value.partitions),
                               value.start_ms, value.last_update_ms)


class TransactionStateManager:
    def __init__(self, replicas, num_partitions: int = DEFAULT_PARTITIONS, *,
                 min_insync_replicas: Callable[[], int] = lambda: 1, append_timeout_ms: int = 30000) -> None:
        self._replicas = replicas
        self.num_partitions = num_partitions
        self._min_insync_replicas = min_insync_replicas
        self._append_timeout_ms = append_timeout_ms
        self._cache: dict[int, _PartitionCache] = {}
        self.loading: set[int] = set()

    def set_partition_count(self, num_partitions: int) -> None:
        if self._cache or self.loading:
            raise RuntimeError("the transaction topic's partition count changes only before any partition is loaded")
        self.num_partitions = num_partitions

    def partition_for(self, transactional_id: str) -> int:
        return partition_for_group(transactional_id, self.num_partitions)

    @property
    def owned_partitions(self) -> frozenset[int]:
        return frozenset(self._cache)

    def coordinator_epoch(self, partition: int) -> int | None:
        """The coordinator epoch a loaded partition was loaded with; None if it is not loaded."""
        cache = self._cache.get(partition)
        return cache.coordinator_epoch if cache is not None else None

    # -- lookups --------------------------------------------------------------------------------------

    def get_state(self, transactional_id: str) -> tuple[ErrorCode, int, TransactionMetadata | None]:
        """Kafka's getTransactionState: (error, coordinator epoch, metadata or None when unknown here)."""
        partition = self.partition_for(transactional_id)
        if partition in self.loading:
            return ErrorCode.coordinator_load_in_progress, -1, None
        cache = self._cache.get(partition)
        if cache is None:
            return ErrorCode.not_coordinator, -1, None
        return ErrorCode.none, cache.coordinator_epoch, cache.ids.get(transactional_id)

    def put_if_absent(self, metadata: TransactionMetadata) -> tuple[int, TransactionMetadata]:
        cache = self._cache[self.partition_for(metadata.transactional_id)]
        return cache.coordinator_epoch, cache.ids.setdefault(metadata.transactional_id, metadata)

    def all_transactions(self) -> list[tuple[int, TransactionMetadata]]:
        """(coordinator epoch, metadata) of every loaded id."""
        return [(cache.coordinator_epoch, m) for cache in self._cache.values() for m in cache.ids.values()]

    def list_transactions(self, states: list[str], producer_ids: list[int]) -> tuple[ErrorCode, list[str], list[TransactionMetadata]]:
        """Kafka's listTransactionStates: (error, unknown state filters, matching transactions); Dead ones
        are never listed."""
        if self.loading:
            return ErrorCode.coordinator_load_in_progress, [], []
        wanted: set[TransactionState] = set()
        unknown: list[str] = []
        for name in states:
            state = TransactionState.from_name(name)
            if state is None:
                unknown.append(name)
            else:
                wanted.add(state)
        pids = set(producer_ids)
        found = [m for _, m in self.all_transactions()
                 if m.state is not TransactionState.DEAD and (not pids or m.producer_id in pids)
                 and (not wanted or m.state in wanted)]
        return ErrorCode.none, unknown, sorted(found, key=lambda m: m.transactional_id)

    # -- leadership -----------------------------------------------------------------------------------

    async def load_partition(self, partition: int, coordinator_epoch: int) -> dict[str, TransactionMetadata] | None:
        """Replay the partition's log up to its end; the loaded ids replace whatever was known. Returns them,
        or None if the load was abandoned (unloaded meanwhile)."""
        self._cache.pop(partition, None)
        self.loading.add(partition)
        loaded: dict[str, TransactionMetadata] = {}
        try:
            hosted = self._replicas.partition(TRANSACTION_STATE_TOPIC, partition)
            if hosted is not None:
                for count, (header, data) in enumerate(hosted.log.batches(), 1):
                    if not header.is_control:
                        for record in read_records(data, header):
                            _replay(loaded, record.key, record.value, partition, record.offset)
                    if count % LOAD_BATCHES_PER_STEP == 0:
                        await asyncio.sleep(0)
                        if partition not in self.loading:
                            return None
        except BaseException:
            self.loading.discard(partition)
            raise
        if partition not in self.loading:
            return None
        self.loading.discard(partition)
        self._cache[partition] = _PartitionCache(coordinator_epoch, loaded)
        return loaded

    def unload_partition(self, partition: int) -> None:
        self.loading.discard(partition)
        self._cache.pop(partition, None)

    def is_coordinator_epoch(self, transactional_id: str, coordinator_epoch: int) -> bool:
        error, epoch, metadata = self.get_state(transactional_id)
        return error == ErrorCode.none and metadata is not None and epoch == coordinator_epoch

    # -- writes ---------------------------------------------------------------------------------------

    async def append(self, transactional_id: str, coordinator_epoch: int, transit: TxnTransit, now_ms: int,
                     retry_on_error: Callable[[ErrorCode], bool] = lambda error: False) -> ErrorCode:
        """Kafka's appendTransactionToLog: write ``transit`` (a tombstone for Dead), then apply it."""
        error, epoch, metadata = self.get_state(transactional_id)
        if error != ErrorCode.none:
            return error
        if metadata is None or epoch != coordinator_epoch:
            return ErrorCode.not_coordinator
        partition = self.partition_for(transactional_id)
        value = None if transit.state is TransactionState.DEAD else encode_value(TxnLogValue(
            transit.producer_id, transit.producer_epoch, transit.timeout_ms, transit.state, transit.partitions,
            transit.last_update_ms, transit.start_ms))
        error = await self._append(partition, [(encode_key(transactional_id), value)], now_ms)
        error = append_error(error)
        current_error, epoch, current = self.get_state(transactional_id)
        if error == ErrorCode.none:
            if current_error != ErrorCode.none:
                return current_error
            if current is None or epoch != coordinator_epoch:
                return ErrorCode.not_coordinator  # moved away and maybe back: the new load has the state
            current.complete_transition(transit)
            return ErrorCode.none
        if current is not None and epoch == coordinator_epoch and not retry_on_error(error):
            current.pending_state = None
        return error

    async def _append(self, partition: int, records, now_ms: int) -> ErrorCode:
        min_isr = self._min_insync_replicas()
        outcome = self._replicas.append(TRANSACTION_STATE_TOPIC, partition, build_batch(records, timestamp_ms=now_ms),
                                        acks=-1, min_insync_replicas=min_isr)
        if outcome.has_followers and self._replicas.needs_replication_wait(TRANSACTION_STATE_TOPIC, partition, outcome,
                                                                           min_isr):
            operation = self._replicas.delay_produce([(TRANSACTION_STATE_TOPIC, partition, outcome.last_offset, min_isr)],
                                                     self._append_timeout_ms)
            (error,) = await self._replicas.purgatory.wait(operation)
            return error
        return outcome.error

    def expirable(self, now_ms: int, expiration_ms: int) -> list[tuple[int, TransactionMetadata]]:
        return [(epoch, m) for epoch, m in self.all_transactions()
                if m.state in EXPIRATION_ALLOWED and m.pending_state is None
                and m.last_update_ms <= now_ms - expiration_ms]

    def remove_if_dead(self, transactional_id: str, coordinator_epoch: int) -> None:
        """After an expired id's tombstone is written: forget it (if nothing changed it meanwhile)."""
        error, epoch, metadata = self.get_state(transactional_id)
        if error == ErrorCode.none and metadata is not None and epoch == coordinator_epoch \
                and metadata.state is TransactionState.DEAD:
            del self._cache[self.partition_for(transactional_id)].ids[transactional_id]


def _replay(loaded: dict[str, TransactionMetadata], key: bytes | None, value: bytes | None, partition: int,
            offset: int) -> None:
    if key is None:
        return
    try:
        transactional_id = decode_key(key)
        if transactional_id is None:
            return
        if value is None:
            loaded.pop(transactional_id, None)
        else:
            loaded[transactional_id] = metadata_from_log(transactional_id, decode_value(value))
    except (ValueError, UnicodeDecodeError) as exc:
        log.warning("skipping unreadable record at %s-%d offset %d: %s", TRANSACTION_STATE_TOPIC, partition, offset, exc)

"""Kafka's TransactionMarkerChannelManager and TransactionMarkerRequestCompletionHandler: the commit/abort
markers of a transaction in PrepareCommit/PrepareAbort, sent as WriteTxnMarkers v1 to the leader of every
partition in it, then the completion (CompleteCommit/CompleteAbort) written to __transaction_state.

* Leaders come from the metadata cache (``leader_of``: None for a partition not in it, -1 for one without
  a leader just now, retried later); markers are queued per broker and each broker's
  queue is sent as one request (several transactions' markers batched, as Kafka does), one request in
  flight per broker, over ``NodeClients`` (the same path to this broker itself on a single node, as Kafka
  does: its coordinator sends WriteTxnMarkers to itself through the network too).
* Per partition: NONE removes the partition from the transaction; UNKNOWN_TOPIC_OR_PARTITION,
  NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS(_AFTER_APPEND), REQUEST_TIMED_OUT, KAFKA_STORAGE_ERROR are
  retried after ``retry_backoff_s`` with the leader looked up again; a request that fails as a whole
  (connection lost, timeout, leader without an address) retries all its markers the same way. A partition
  without a leader in the metadata (a deleted topic) counts as done, as Kafka skips it.
  INVALID_PRODUCER_EPOCH / TRANSACTION_COORDINATOR_FENCED: a newer coordinator has the transaction; this one
  stops sending for it (and writes no completion; Kafka 3.7.1's rule even when this coordinator is current,
  so the transaction stays in Prepare* until its __transaction_state partition is reloaded).
  UNSUPPORTED_FOR_MESSAGE_FORMAT / UNSUPPORTED_VERSION: the partition is done, as Kafka counts it.
* Before each send and on each answer, a transaction whose id this broker no longer coordinates with the
  same coordinator epoch is dropped (``is_current``): the new coordinator resends after loading.
* When no partition is left, ``write_completion(pending)`` is called (once).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from kio.schema.write_txn_markers.v1 import request as wtm

from pykbroker.protocol.client import ClientError, ClientSecurity, NodeClients
from pykbroker.protocol.errors import ErrorCode
from pykbroker.txn.metadata import TopicPartition, TransactionMetadata, TxnTransit

log = logging.getLogger(__name__)

RETRIABLE = frozenset({
    ErrorCode.unknown_topic_or_partition, ErrorCode.not_leader_or_follower, ErrorCode.not_enough_replicas,
    ErrorCode.not_enough_replicas_after_append, ErrorCode.request_timed_out, ErrorCode.kafka_storage_error,
})
FENCED = frozenset({ErrorCode.invalid_producer_epoch, ErrorCode.transaction_coordinator_fenced})
NOT_SUPPORTED = frozenset({ErrorCode.unsupported_for_message_format, ErrorCode.unsupported_version})
DEFAULT_RETRY_BACKOFF_S = 0.1


@dataclass(eq=False)
class PendingCompleteTxn:
    transactional_id: str
    coordinator_epoch: int
    metadata: TransactionMetadata
    transit: TxnTransit  # the completion to write once every marker is written
    commit: bool
    producer_id: int = 0
    producer_epoch: int = 0
    txn_partition: int = 0


@dataclass
class _Entry:
    pending: PendingCompleteTxn
    partitions: set[TopicPartition] = field(default_factory=set)


class MarkerSender:
    """Sends the markers (``send``) over ``clients`` unless given another ``send_request`` (tests)."""

    def __init__(self, broker_id: int, *, leader_of: Callable[[str, int], int | None],
                 address_of: Callable[[int], tuple[str, int] | None],
                 is_current: Callable[[PendingCompleteTxn], bool],
                 write_completion: Callable[[PendingCompleteTxn], None],
                 send_request: Callable[[int, object], Awaitable[object]] | None = None,
                 retry_backoff_s: float = DEFAULT_RETRY_BACKOFF_S, request_timeout_s: float = 30.0,
                 security: ClientSecurity | None = None) -> None:
        self.broker_id = broker_id
        self._leader_of = leader_of
        self._address_of = address_of
        self._is_current = is_current
        self._write_completion = write_completion
        self._retry_backoff_s = retry_backoff_s
        self._clients: NodeClients | None = None
        if send_request is None:
            self._clients = NodeClients(broker_id, client_id=f"broker-{broker_id}-txn-marker-sender",
                                        request_timeout=request_timeout_s, security=security)
            send_request = self._send_over_network
        self._send_request = send_request
        self._pending: dict[str, PendingCompleteTxn] = {}  # transactional id -> its markers being written
        self._queues: dict[int, dict[int, _Entry]] = {}  # broker -> id(pending) -> partitions to send there
        self._drains: dict[int, asyncio.Task] = {}
        self._timers: set[asyncio.TimerHandle] = set()
        self._closed = False

    @property
    def pending_ids(self) -> frozenset[str]:
        return frozenset(self._pending)

    def has_pending(self, transactional_id: str) -> bool:
        return transactional_id in self._pending

    # -- queueing -------------------------------------------------------------------------------------

    def add_markers(self, pending: PendingCompleteTxn) -> None:
        """Kafka's addTxnMarkersToSend: markers for every partition still in the transaction."""
        pending.producer_id = pending.metadata.producer_id
        pending.producer_epoch = pending.metadata.producer_epoch
        self._pending[pending.transactional_id] = pending
        self._enqueue(pending, set(pending.metadata.partitions))
        self._maybe_complete(pending)

    def remove_for_txn_partition(self, txn_partition: int) -> None:
        """This broker no longer coordinates that __transaction_state partition: drop its markers."""
        for tid, pending in list(self._pending.items()):
            if pending.txn_partition == txn_partition:
                self._remove(pending)

    def _remove(self, pending: PendingCompleteTxn) -> None:
        if self._pending.get(pending.transactional_id) is pending:
            del self._pending[pending.transactional_id]
        for queue in self._queues.values():
            queue.pop(id(pending), None)

    def _enqueue(self, pending: PendingCompleteTxn, partitions: set[TopicPartition]) -> None:
        if self._closed or self._pending.get(pending.transactional_id) is not pending:
            return
        if not self._is_current(pending):
            self._remove(pending)
            return
        for tp in sorted(partitions):
            leader = self._leader_of(*tp)
            if leader is None:
                # Not in the metadata: the topic is most likely deleted; skip it, as Kafka does.
                log.info("%s-%d is not in the metadata: skipping its %s marker of %s (deleted topic?)", tp[0], tp[1],
                         "commit" if pending.commit else "abort", pending.transactional_id)
                pending.metadata.remove_partition(tp)
                continue
            if leader < 0:  # no leader just now (Kafka's unknown-broker queue): look again later
                self._retry_later(pending, {tp})
                continue
            queue = self._queues.setdefault(leader, {})
            queue.setdefault(id(pending), _Entry(pending)).partitions.add(tp)
            if leader not in self._drains:
                task = asyncio.ensure_future(self._drain(leader))
                self._drains[leader] = task
                task.add_done_callback(lambda t, b=leader: self._drain_done(b, t))

    def _drain_done(self, broker: int, task: asyncio.Task) -> None:
        if self._drains.get(broker) is task:
            del self._drains[broker]
        if not task.cancelled() and task.exception() is not None:
            log.error("marker sender for broker %d failed: %r", broker, task.exception())
        if self._queues.get(broker) and not self._closed:  # queued after the drain's last look
            self._drains[broker] = t = asyncio.ensure_future(self._drain(broker))
            t.add_done_callback(lambda t, b=broker: self._drain_done(b, t))

    def _retry_later(self, pending: PendingCompleteTxn, partitions: set[TopicPartition]) -> None:
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle | None = None

        def fire() -> None:
            self._timers.discard(handle)
            self._enqueue(pending, partitions)

        handle = loop.call_later(self._retry_backoff_s, fire)
        self._timers.add(handle)

    # -- sending --------------------------------------------------------------------------------------

    async def _drain(self, broker: int) -> None:
        while not self._closed:
            queue = self._queues.pop(broker, None)
            if not queue:
                return
            entries = [e for e in queue.values() if self._pending.get(e.pending.transactional_id) is e.pending]
            entries = [e for e in entries if self._current_or_drop(e.pending)]
            if not entries:
                continue
            request = wtm.WriteTxnMarkersRequest(markers=tuple(
                wtm.WritableTxnMarker(
                    producer_id=e.pending.producer_id, producer_epoch=e.pending.producer_epoch,
                    transaction_result=e.pending.commit, coordinator_epoch=e.pending.coordinator_epoch,
                    topics=tuple(wtm.WritableTxnMarkerTopic(name=topic, partition_indexes=tuple(
                        p for t, p in sorted(e.partitions) if t == topic))
                        for topic in sorted({t for t, _ in e.partitions})))
                for e in entries))
            try:
                response = await self._send_request(broker, request)
            except (ClientError, OSError) as exc:
                log.info("WriteTxnMarkers to broker %d failed (%s): retrying %d transaction(s)", broker, exc,
                         len(entries))
                for e in entries:
                    self._retry_later(e.pending, e.partitions)
                continue
            except Exception:  # a bug must not lose the markers: they stay pending and are retried
                log.exception("WriteTxnMarkers to broker %d failed: retrying %d transaction(s)", broker, len(entries))
                for e in entries:
                    self._retry_later(e.pending, e.partitions)
                continue
            results = {m.producer_id: m for m in response.markers}
            for e in entries:
                result = results.get(e.pending.producer_id)
                errors = {(t.name, p.partition_index): ErrorCode(p.error_code)
                          for t in (result.topics if result is not None else ()) for p in t.partitions}
                self.on_response(e.pending, {tp: errors.get(tp, ErrorCode.request_timed_out) for tp in e.partitions})

    def _current_or_drop(self, pending: PendingCompleteTxn) -> bool:
        if self._is_current(pending):
            return True
        self._remove(pending)
        return False

    def on_response(self, pending: PendingCompleteTxn, errors: dict[TopicPartition, ErrorCode]) -> None:
        """Kafka's TransactionMarkerRequestCompletionHandler for one transaction's markers to one broker."""
        if self._pending.get(pending.transactional_id) is not pending or not self._current_or_drop(pending):
            return
        retry: set[TopicPartition] = set()
        for tp, error in errors.items():
            if error == ErrorCode.none:
                pending.metadata.remove_partition(tp)
            elif error in FENCED:
                log.info("%s markers of %s: %s from the leader of %s-%d, a newer coordinator has it; stop sending",
                         "commit" if pending.commit else "abort", pending.transactional_id, error.name, *tp)
                self._remove(pending)
                return
            elif error in RETRIABLE:
                retry.add(tp)
            elif error in NOT_SUPPORTED:  # Kafka: the producer could not have written there either: done
                log.info("%s marker of %s for %s-%d: %s, the partition is done", "commit" if pending.commit else "abort",
                         pending.transactional_id, *tp, error.name)
                pending.metadata.remove_partition(tp)
            else:
                # Kafka throws (a bug); a broker must not stall the transaction forever: retry and say so.
                log.error("unexpected %s writing a marker of %s to %s-%d: retrying", error.name,
                          pending.transactional_id, *tp)
                retry.add(tp)
        if retry:
            self._retry_later(pending, retry)
        else:
            self._maybe_complete(pending)

    def _maybe_complete(self, pending: PendingCompleteTxn) -> None:
        if not pending.metadata.partitions and self._pending.get(pending.transactional_id) is pending:
            del self._pending[pending.transactional_id]
            self._write_completion(pending)

    async def send(self, broker: int, request: object) -> object:
        """Send any request to a broker over these clients (the transaction verifier's too)."""
        return await self._send_over_network(broker, request)

    async def _send_over_network(self, broker: int, request: object) -> object:
        address = self._address_of(broker)
        if address is None:
            raise ConnectionError(f"no address for broker {broker}")
        self._clients.set_address(broker, *address)
        return await self._clients.send(broker, request)

    async def close(self) -> None:
        self._closed = True
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
        drains = list(self._drains.values())
        for task in drains:
            task.cancel()
        await asyncio.gather(*drains, return_exceptions=True)
        if self._clients is not None:
            await self._clients.close()

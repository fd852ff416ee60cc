"""Transaction verification (KIP-890 part 1, Kafka 3.7.1's ``transaction.partition.verification.enable``):
Kafka's AddPartitionsToTxnManager and ReplicaManager.maybeStartTransactionVerificationForPartition(s).

Before a producer's first transactional write to a partition in a transaction (no open transaction of
that producer there: the producer state's ``maybe_start_verification`` gives a guard), the leader asks the
coordinator of the request's transactional id whether the partition is in the ongoing transaction
(AddPartitionsToTxn v4 with ``verify_only``). Later batches of the same transaction skip it: the open
transaction in the producer state is the cache, and the hot path pays nothing.

* The coordinator is the leader of the id's __transaction_state partition: this broker's coordinator is
  called directly (no network); another broker gets AddPartitionsToTxn v4 over the marker sender's
  ``NodeClients`` (``send``), one request in flight per coordinator broker with the waiting transactions
  batched into the next one, as Kafka's manager does. A second verification of the same transactional id
  while one is queued replaces it: the queued one gets NETWORK_EXCEPTION (same epoch) or
  INVALID_PRODUCER_EPOCH (older epoch); an older newcomer gets INVALID_PRODUCER_EPOCH.
* No __transaction_state or no leader for it: COORDINATOR_NOT_AVAILABLE; a lost connection or timeout:
  NETWORK_EXCEPTION; PRODUCER_FENCED from the coordinator becomes INVALID_PRODUCER_EPOCH (Kafka 3.7.1).
* ``produce_error`` is ReplicaManager's translation for the Produce response: INVALID_TXN_STATE
  ("Partition was not added to the transaction"); CONCURRENT_TRANSACTIONS, COORDINATOR_LOAD_IN_PROGRESS,
  COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, NETWORK_EXCEPTION become NOT_ENOUGH_REPLICAS (retriable, no metadata refresh).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from kio.schema.add_partitions_to_txn.v4 import request as apt

from pykbroker.protocol.errors import ErrorCode
from pykbroker.txn.metadata import TopicPartition

log = logging.getLogger(__name__)

Result = dict[TopicPartition, ErrorCode]

_TO_NOT_ENOUGH_REPLICAS = frozenset({
    ErrorCode.concurrent_transactions, ErrorCode.coordinator_load_in_progress,
    ErrorCode.coordinator_not_available, ErrorCode.not_coordinator,
    ErrorCode.network_exception,  # Kafka 3.7.1 ReplicaManager.appendEntries: older clients do not retry it
})


def produce_error(error: ErrorCode) -> tuple[ErrorCode, str | None]:
    """ReplicaManager's translation of a verification error for the Produce response (error, message)."""
    if error == ErrorCode.invalid_txn_state:
        return error, "Partition was not added to the transaction"
    if error in _TO_NOT_ENOUGH_REPLICAS:
        return (ErrorCode.not_enough_replicas,
                f"Unable to verify the partition has been added to the transaction. Underlying error: {error.name.upper()}")
    return error, None


def _fenced(error: ErrorCode) -> ErrorCode:
    return ErrorCode.invalid_producer_epoch if error == ErrorCode.producer_fenced else error


@dataclass(eq=False)
class _Txn:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: list[TopicPartition]
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def answer(self, errors: Result) -> None:
        if not self.future.done():
            self.future.set_result(errors)

    def answer_all(self, error: ErrorCode) -> None:
        self.answer({tp: error for tp in self.partitions})


class TransactionVerifier:
    """``coordinator_of(id)``: the broker leading the id's __transaction_state partition (None: no such
    topic or no leader); ``local`` the TransactionCoordinator; ``send(broker, request)`` sends a request to
    another broker (the marker sender's)."""

    def __init__(self, broker_id: int, *, coordinator_of: Callable[[str], int | None], local,
                 send: Callable[[int, object], Awaitable[object]]) -> None:
        self.broker_id = broker_id
        self._coordinator_of = coordinator_of
        self._local = local
        self._send = send
        self._queues: dict[int, dict[str, _Txn]] = {}  # coordinator broker -> transactional id -> waiting
        self._drains: dict[int, asyncio.Task] = {}

    async def verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
                     partitions: list[TopicPartition]) -> Result:
        broker = self._coordinator_of(transactional_id)
        if broker is None or broker < 0:
            return {tp: ErrorCode.coordinator_not_available for tp in partitions}
        if broker == self.broker_id:
            errors = self._local.handle_verify_partitions(transactional_id, producer_id, producer_epoch, partitions)
            return {tp: _fenced(error) for tp, error in errors.items()}
        txn = _Txn(transactional_id, producer_id, producer_epoch, list(partitions))
        queue = self._queues.setdefault(broker, {})
        queued = queue.get(transactional_id)
        if queued is not None:  # Kafka's AddPartitionsToTxnManager.addTxnData
            if queued.producer_epoch > producer_epoch:
                txn.answer_all(ErrorCode.invalid_producer_epoch)
                return txn.future.result()
            queued.answer_all(ErrorCode.invalid_producer_epoch if queued.producer_epoch < producer_epoch
                              else ErrorCode.network_exception)
        queue[transactional_id] = txn
        task = self._drains.get(broker)
        if task is None or task.done():  # a finished drain is absent (its queue was found empty)
            self._drains[broker] = asyncio.ensure_future(self._drain(broker))
        return await txn.future

    async def _drain(self, broker: int) -> None:
        while True:
            batch = self._queues.pop(broker, None)
            if not batch:
                # Leave in the same loop step the queue is found empty: a verify() queued later starts a drain.
                if self._drains.get(broker) is asyncio.current_task():
                    del self._drains[broker]
                return
            txns = list(batch.values())
            try:
                response = await self._send(broker, _request(txns))
                _answer(txns, response)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # connection lost, timeout, no address (Kafka's wasDisconnected/wasTimedOut), bad answer
                log.debug("transaction verification with broker %d failed: %s", broker, exc)
            finally:  # every waiter of the batch is answered (no-op for those already answered)
                for txn in txns:
                    txn.answer_all(ErrorCode.network_exception)

    async def close(self) -> None:
        drains = list(self._drains.values())
        for task in drains:
            task.cancel()
        await asyncio.gather(*drains, return_exceptions=True)
        for queue in self._queues.values():
            for txn in queue.values():
                txn.answer_all(ErrorCode.network_exception)
        self._queues.clear()


def _request(txns: list[_Txn]) -> apt.AddPartitionsToTxnRequest:
    transactions = []
    for txn in txns:
        by_topic: dict[str, list[int]] = {}
        for topic, index in txn.partitions:
            by_topic.setdefault(topic, []).append(index)
        transactions.append(apt.AddPartitionsToTxnTransaction(
            transactional_id=txn.transactional_id, producer_id=txn.producer_id, producer_epoch=txn.producer_epoch,
            verify_only=True,
            topics=tuple(apt.AddPartitionsToTxnTopic(name=name, partitions=tuple(indexes))
                         for name, indexes in by_topic.items())))
    return apt.AddPartitionsToTxnRequest(transactions=tuple(transactions))


def _answer(txns: list[_Txn], response) -> None:
    """Kafka's AddPartitionsToTxnHandler.onComplete: a top-level error for all, else per partition; a
    partition the answer does not mention is UNKNOWN_SERVER_ERROR."""
    if response.error_code != ErrorCode.none:
        error = _fenced(ErrorCode(response.error_code))
        for txn in txns:
            txn.answer_all(error)
        return
    results = {result.transactional_id: result for result in response.results_by_transaction}
    for txn in txns:
        result = results.get(txn.transactional_id)
        errors: Result = {}
        if result is not None:
            for topic in result.topic_results:
                for partition in topic.results_by_partition:
                    errors[(topic.name, partition.partition_index)] = _fenced(ErrorCode(partition.partition_error_code))
        txn.answer({tp: errors.get(tp, ErrorCode.unknown_server_error) for tp in txn.partitions})

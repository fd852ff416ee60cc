"""ISR changes proposed by this broker's leaders, sent to the controller (Kafka's DefaultAlterPartitionManager,
3.7, ZooKeeper mode).

A leader's Partition decides an ISR shrink or expansion and hands it to :meth:`AlterPartitionManager.submit`
(the AlterPartitionPort of replication/partition.py); it makes no other change until the answer. Here, as in
Kafka:

* Pending changes are batched: one AlterPartition v3 request carries every change not yet sent, and only one
  request is in flight at a time, so a partition never has two unanswered changes. A change submitted for a
  partition whose earlier change is still waiting to be sent replaces it (the partition moved on: a
  LeaderAndIsr reset it in between).
* The request goes to the current controller (``controller_id()``, reached at ``address_of(id)``) on this
  broker's controller channel (client id = broker id, versions negotiated with ApiVersions first, as the 3.7.1
  capture shows), with our broker id and broker epoch; ISR members carry broker epoch -1 (ZooKeeper mode).
  Topics are named by id.
* No controller known, a connection failure or timeout, or a top-level error (NOT_CONTROLLER,
  STALE_BROKER_EPOCH, ...): the same changes are sent again after a 50 ms backoff (Kafka's scheduleOnce of
  50 ms; its controller channel retries lost connections itself). A partition left out of an answer is sent
  again too.
* Per partition: NONE → ``Partition.isr_change_committed`` (unless the answer's leader epoch is not the
  partition's, or its partition epoch is older: Kafka ignores those and the partition stays pending);
  OPERATION_NOT_ATTEMPTED, INELIGIBLE_REPLICA and unexpected errors → ``Partition.isr_change_failed`` (back to
  the committed ISR; the next fetch or ISR check proposes again, Kafka's retry); FENCED_LEADER_EPOCH,
  INVALID_UPDATE_VERSION, UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST, INVALID_REPLICA_ASSIGNMENT, NEW_LEADER_ELECTED
  → no retry: the change stays pending until the LeaderAndIsr that must follow resets the partition (Kafka's
  handleAlterPartitionError returns false for these). An answer for a change the partition no longer has
  pending (a LeaderAndIsr came meanwhile) is ignored.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING, Callable

from kio.schema.alter_partition.v3 import request as alter_request

from pykbroker.protocol.client import ClientError, ClientSecurity, NodeClients
from pykbroker.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from pykbroker.replication.partition import IsrChange, Partition

log = logging.getLogger(__name__)

RETRY_BACKOFF_S = 0.05  # Kafka's 50 ms before resending after a top-level error
NO_BROKER_EPOCH = -1  # ISR members' broker epochs in ZooKeeper mode

# Partition errors after which the change waits for a LeaderAndIsr instead of being proposed again.
_WAIT_FOR_LEADER_AND_ISR = frozenset({
    ErrorCode.fenced_leader_epoch, ErrorCode.invalid_update_version, ErrorCode.unknown_topic_or_partition,
    ErrorCode.invalid_request, ErrorCode.invalid_replica_assignment, ErrorCode.new_leader_elected,
})

TopicPartition = tuple[str, int]


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


class AlterPartitionManager:
    """The AlterPartitionPort of the cluster layer: see the module docstring."""

    def __init__(
        self,
        broker_id: int,
        broker_epoch: Callable[[], int],
        controller_id: Callable[[], int | None],
        address_of: Callable[[int], tuple[str, int] | None],
        topic_id_of: Callable[[str], uuid.UUID | None],
        *,
        clock: Callable[[], int] = _wall_clock_ms,
        security: ClientSecurity | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self.controller_id = controller_id
        self.address_of = address_of
        self.topic_id_of = topic_id_of
        self.clock = clock
        self.clients = NodeClients(broker_id, security=security)
        self._unsent: dict[TopicPartition, tuple["Partition", "IsrChange"]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closed = False
        self._controller: int | None = None  # the controller the last request went to

    @property
    def pending(self) -> int:
        """Changes waiting to be sent (the one request in flight not counted)."""
        return len(self._unsent)

    def submit(self, partition: "Partition", change: "IsrChange") -> None:
        """Queue ``change`` for the controller; never blocks. The answer reaches the partition later."""
        if self._closed:
            return
        self._unsent[(change.topic, change.partition)] = (partition, change)
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"alter-partition-{self.broker_id}")

    async def _run(self) -> None:
        while not self._closed:
            if not self._unsent:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch, self._unsent = self._unsent, {}
            try:
                sent = await self._send(batch)
            except Exception as exc:  # never lose the changes to a bug in one answer
                log.warning("broker %d: AlterPartition handling failed: %r", self.broker_id, exc)
                sent = False
            if not sent:
                for tp, item in batch.items():
                    self._unsent.setdefault(tp, item)  # a newer change submitted meanwhile wins
                await asyncio.sleep(RETRY_BACKOFF_S)

    def _request(self, batch: dict[TopicPartition, tuple["Partition", "IsrChange"]]):
        """The AlterPartition v3 request for ``batch``; changes of topics without an id fail at once."""
        topics: dict[uuid.UUID, list] = {}
        for (topic, index), (partition, change) in list(batch.items()):
            topic_id = self.topic_id_of(topic)
            if topic_id is None:
                log.warning("broker %d: no topic id for %s: ISR change to %s dropped", self.broker_id, topic,
                            list(change.isr))
                del batch[(topic, index)]
                if partition.pending_isr_change is change:
                    partition.isr_change_failed()
                continue
            topics.setdefault(topic_id, []).append(alter_request.PartitionData(
                partition_index=index, leader_epoch=change.leader_epoch,
                new_isr_with_epochs=tuple(alter_request.BrokerState(broker_id=r, broker_epoch=NO_BROKER_EPOCH)
                                          for r in change.isr),
                leader_recovery_state=0, partition_epoch=change.partition_epoch,
            ))
        if not topics:
            return None
        return alter_request.AlterPartitionRequest(
            broker_id=self.broker_id, broker_epoch=self.broker_epoch(),
            topics=tuple(alter_request.TopicData(topic_id=topic_id, partitions=tuple(parts))
                         for topic_id, parts in topics.items()),
        )

    async def _send(self, batch: dict[TopicPartition, tuple["Partition", "IsrChange"]]) -> bool:
        """Send ``batch`` and apply the answer; False when all of it must be sent again (requeued by the
        caller); partitions left out of an answer are requeued here."""
        request = self._request(batch)
        if request is None:
            return True
        controller = self.controller_id()
        address = self.address_of(controller) if controller is not None else None
        if address is None:
            log.debug("broker %d: no controller reachable for AlterPartition (controller %s)", self.broker_id, controller)
            return False
        if self._controller is not None and self._controller != controller:
            self.clients.remove(self._controller)  # the controller moved: no connection kept to the old one
        self._controller = controller
        self.clients.set_address(controller, *address)
        try:
            response = await self.clients.send(controller, request)
        except ClientError as exc:
            log.info("broker %d: AlterPartition to controller %d failed (%s): retrying", self.broker_id, controller, exc)
            return False
        if response.error_code != ErrorCode.none:
            log.warning("broker %d: controller %d answered AlterPartition with %s: retrying", self.broker_id, controller,
                        ErrorCode(response.error_code).name)
            return False
        answers = {(topic.topic_id, p.partition_index): p for topic in response.topics for p in topic.partitions}
        for tp, (partition, change) in batch.items():
            answer = answers.get((self.topic_id_of(tp[0]), tp[1]))
            if answer is None:
                log.warning("broker %d: %s-%d was sent in AlterPartition but not answered: sending again",
                            self.broker_id, *tp)
                self._unsent.setdefault(tp, (partition, change))
                continue
            self._apply(partition, change, answer)
        return True

    def _apply(self, partition: "Partition", change: "IsrChange", answer) -> None:
        """One partition's answer (Kafka's Partition.sendAlterPartitionRequest completion)."""
        name = f"{change.topic}-{change.partition}"
        if partition.pending_isr_change is not change:
            log.debug("broker %d: %s: ignoring the AlterPartition answer for %s: the partition moved on",
                      self.broker_id, name, list(change.isr))
            return
        error = ErrorCode(answer.error_code)
        if error == ErrorCode.none:
            if answer.leader_epoch != partition.leader_epoch or answer.partition_epoch < partition.partition_epoch:
                log.info("broker %d: %s: ignoring ISR %s (leader epoch %d, partition epoch %d): ours are %d and %d",
                         self.broker_id, name, list(answer.isr), answer.leader_epoch, answer.partition_epoch,
                         partition.leader_epoch, partition.partition_epoch)
                return
            partition.isr_change_committed(tuple(answer.isr), answer.partition_epoch, now_ms=self.clock())
        elif error in _WAIT_FOR_LEADER_AND_ISR:
            log.info("broker %d: %s: ISR change to %s refused with %s: waiting for a LeaderAndIsr", self.broker_id,
                     name, list(change.isr), error.name)
        else:
            log.info("broker %d: %s: ISR change to %s failed with %s: back to ISR %s", self.broker_id, name,
                     list(change.isr), error.name, list(partition.isr))
            partition.isr_change_failed()

    async def close(self) -> None:
        """Stop sending (changes not yet answered are dropped: the next leader decides again)."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        await self.clients.close()


__all__ = ["AlterPartitionManager"]

"""The ZooKeeper-mode controller (Kafka 3.7's KafkaController with its partition and replica state machines,
ControllerEventManager and ControllerChannelManager), one per broker; the one that wins /controller is active.

Election: every broker watches /controller; when it is absent each tries KafkaZkClient.try_become_controller
(one transaction creates /controller and bumps /controller_epoch, so exactly one wins and the epoch moves by
one). The winner loads the cluster from ZooKeeper (live brokers with their epochs = czxid, every topic's
assignment and partition state), creates missing partition states, elects leaders for partitions without a
live leader, and tells the brokers: LeaderAndIsr to the live replicas of every partition, UpdateMetadata with
every partition to every live broker.

One event queue: ZooKeeper watches, broker requests (AlterPartition, ControlledShutdown, ElectLeaders), the
leader-rebalance timer and the election all become events processed one at a time, as Kafka's
ControllerEventManager does, so the in-memory context never sees two changes interleaved. Every ZooKeeper
write of the controller is a transaction fenced by the /controller_epoch zkVersion (``guarded_multi``); a
ControllerMoved from any write, another broker's id in /controller, or our session expiring makes us resign:
``active`` goes False, the channel forgets every broker (nothing more is sent), and the /controller watch
stays so that we run again when it is free.

Each batch of state changes is sent as Kafka's ControllerBrokerRequestBatch does: LeaderAndIsr (v7) to the
affected live replicas first, then UpdateMetadata (v8) for those partitions to every live broker, then
StopReplica (v4). Every request carries our id and epoch and the RECEIVING broker's epoch.

Partition reassignment (cluster/reassignment.py, mixed in) follows Kafka's onPartitionReassignment, through
AlterPartitionReassignments and the legacy /admin/reassign_partitions znode.

What we do not do (Kafka does): log-dir failure events, ISR change notifications
from pre-2.7 brokers, /feature and producer-id block allocation (AllocateProducerIds), AlterPartition v0/v1
(kio has no schema for them; they name topics instead of ids), and waiting for StopReplica answers before a
deleted topic's znodes go (Kafka retries deletion of replicas on dead brokers and waits for them; we delete
the znodes once the requests are queued).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable

from kazoo.exceptions import NoNodeError, NodeExistsError
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i16, i32, i64

from pykbroker.cluster.reassignment import ReassignmentMixin
from pykbroker.cluster.zookeeper import (
    LEADER_RECOVERED,
    LEADER_RECOVERING,
    NO_LEADER,
    BrokerRegistration,
    ControllerLeadership,
    ControllerMoved,
    KafkaZkClient,
    PartitionState,
    SessionEvent,
    StaleZkVersion,
    TopicAssignment,
    delete_topic_path,
    kafka_uuid_to_uuid,
    uuid_to_kafka,
)
from pykbroker.config import BrokerConfig
from pykbroker.protocol.client import ClientError, ClientSecurity, ConnectError, NodeClients
from pykbroker.protocol.interbroker.leader_and_isr.v7 import request as lai
from pykbroker.protocol.interbroker.stop_replica.v4 import request as sr
from pykbroker.protocol.interbroker.update_metadata.v8 import request as um

if TYPE_CHECKING:
    from pykbroker.cluster.dynamic_configs import DynamicConfigs

log = logging.getLogger(__name__)

LEADER_DURING_DELETE = -2  # LeaderAndIsr.LeaderDuringDelete: UpdateMetadata of a topic being deleted
PREFERRED_ELECTION = 0  # ElectionType.PREFERRED
UNCLEAN_ELECTION = 1  # ElectionType.UNCLEAN
SECURITY_PROTOCOL_IDS = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}
CHANNEL_RETRY_BACKOFF_S = 0.1  # Kafka's RequestSendThread waits 100 ms before resending after a failure
RETRY_FAILOVER_S = 1.0  # after a failed event the controller steps back and runs its failover again this much later

TopicPartition = tuple[str, int]


# ---- the channel: one ordered queue and one sender per broker (Kafka's ControllerChannelManager) ------


class ControllerChannel:
    """The controller's connections to the brokers. ``send`` puts a request into the destination's queue and
    returns at once; one task per broker sends its queue in order, one request at a time, and resends a
    request after a connection failure or timeout (with backoff) until it is answered or the broker is
    removed (Kafka's RequestSendThread). Errors in answers are logged; the brokers act on them themselves."""

    def __init__(self, broker_id: int, *, request_timeout_s: float = 30.0,
                 retry_backoff_s: float = CHANNEL_RETRY_BACKOFF_S, security: ClientSecurity | None = None) -> None:
        self.broker_id = broker_id
        self.request_timeout_s = request_timeout_s
        self.retry_backoff_s = retry_backoff_s
        self._clients = NodeClients(broker_id, client_id=str(broker_id), negotiate_versions=False,
                                    request_timeout=request_timeout_s, security=security)
        self._queues: dict[int, asyncio.Queue] = {}
        self._senders: dict[int, asyncio.Task] = {}
        self._connect_failures: dict[int, str] = {}  # broker -> the connection failure last logged as a warning

    def add_broker(self, broker_id: int, host: str, port: int) -> None:
        """Start sending to broker_id at host:port (a new address for a known broker replaces the old)."""
        self._clients.set_address(broker_id, host, port)
        if broker_id not in self._senders:
            queue: asyncio.Queue = asyncio.Queue()
            self._queues[broker_id] = queue
            self._senders[broker_id] = asyncio.get_running_loop().create_task(
                self._send_loop(broker_id, queue), name=f"controller-{self.broker_id}-to-{broker_id}")

    def remove_broker(self, broker_id: int) -> None:
        """Stop sending to broker_id: its queue is dropped, the request in flight abandoned."""
        task = self._senders.pop(broker_id, None)
        self._queues.pop(broker_id, None)
        if task is not None:
            task.cancel()
        self._connect_failures.pop(broker_id, None)
        self._clients.remove(broker_id)

    def send(self, broker_id: int, request: Any) -> None:
        """Queue request for broker_id (dropped, with a debug log, if the broker is not in the channel)."""
        queue = self._queues.get(broker_id)
        if queue is None:
            log.debug("controller %d: no channel to broker %d, %s dropped", self.broker_id, broker_id,
                      type(request).__name__)
            return
        queue.put_nowait(request)

    async def close(self) -> None:
        tasks = list(self._senders.values())
        for broker_id in list(self._senders):
            self.remove_broker(broker_id)
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._clients.close()

    async def _send_loop(self, broker_id: int, queue: asyncio.Queue) -> None:
        while True:
            request = await queue.get()
            while True:
                try:
                    response = await self._clients.send(broker_id, request, timeout=self.request_timeout_s)
                except ClientError as exc:
                    # A peer that cannot be reached fails every retry the same way: one warning per peer and
                    # reason (NodeClients logs the attempt itself), the repeats at INFO.
                    repeated = isinstance(exc, ConnectError) and self._connect_failures.get(broker_id) == str(exc)
                    if isinstance(exc, ConnectError):
                        self._connect_failures[broker_id] = str(exc)
                    log.log(logging.INFO if repeated else logging.WARNING,
                            "controller %d: %s to broker %d failed (%s); resending", self.broker_id,
                            type(request).__name__, broker_id, exc)
                    await asyncio.sleep(self.retry_backoff_s)
                    continue
                self._connect_failures.pop(broker_id, None)
                _log_response_errors(self.broker_id, broker_id, request, response)
                break


def _log_response_errors(controller_id: int, broker_id: int, request: Any, response: Any) -> None:
    errors = []
    if response.error_code != ErrorCode.none:
        errors.append(f"error {response.error_code.name}")
    for topic in getattr(response, "topics", ()):
        errors += [f"partition {p.partition_index}: {p.error_code.name}" for p in topic.partition_errors
                   if p.error_code != ErrorCode.none]
    errors += [f"{p.topic_name}-{p.partition_index}: {p.error_code.name}"
               for p in getattr(response, "partition_errors", ()) if p.error_code != ErrorCode.none]
    if errors:
        log.warning("controller %d: broker %d answered %s with %s", controller_id, broker_id,
                    type(request).__name__, ", ".join(errors))


# ---- one batch of requests (Kafka's ControllerBrokerRequestBatch) -----------------------------------


@dataclass
class _Batch:
    """The requests one state change makes: LeaderAndIsr per broker (each partition listed there also goes
    into the UpdateMetadata, as addLeaderAndIsrRequestForBrokers does), UpdateMetadata (to every live broker
    unless the brokers are named), StopReplica per broker. ``Controller._send`` turns it into requests."""

    leader_and_isr: dict[int, dict[TopicPartition, bool]] = field(default_factory=dict)  # broker -> tp -> is_new
    update_metadata: set[TopicPartition] = field(default_factory=set)
    update_metadata_brokers: set[int] | None = None  # None: every live broker
    stop_replica: dict[int, dict[TopicPartition, bool]] = field(default_factory=dict)  # broker -> tp -> delete

    def add_leader_and_isr(self, brokers: Iterable[int], tp: TopicPartition, *, is_new: bool = False) -> None:
        for b in brokers:
            parts = self.leader_and_isr.setdefault(b, {})
            parts[tp] = parts.get(tp, False) or is_new  # a partition created in this batch stays new
        self.update_metadata.add(tp)

    def add_stop_replica(self, broker: int, tp: TopicPartition, *, delete: bool) -> None:
        self.stop_replica.setdefault(broker, {})[tp] = delete


# ---- elections (Kafka's PartitionLeaderElectionAlgorithms) -------------------------------------------


def offline_partition_leader(assignment: list[int], isr: Iterable[int], live: set[int],
                             unclean: bool) -> tuple[int, tuple[int, ...], bool] | None:
    """offlinePartitionLeaderElection: the first replica (assignment order) that is live and in the ISR,
    the new ISR being the live part of the ISR; else, if unclean election is on, the first live replica with
    an ISR of itself (the third value says the election was unclean). None if nobody can lead."""
    isr = tuple(isr)
    leader = next((r for r in assignment if r in live and r in isr), None)
    if leader is not None:
        return leader, tuple(r for r in isr if r in live), False
    if unclean:
        leader = next((r for r in assignment if r in live), None)
        if leader is not None:
            return leader, (leader,), True
    return None


def controlled_shutdown_leader(assignment: list[int], isr: Iterable[int], live: set[int],
                               shutting_down: set[int]) -> tuple[int, tuple[int, ...]] | None:
    """controlledShutdownPartitionLeaderElection: the first replica in the ISR that is live and not shutting
    down; the new ISR leaves out the brokers shutting down."""
    isr = tuple(isr)
    leader = next((r for r in assignment if r in isr and r in live and r not in shutting_down), None)
    if leader is None:
        return None
    return leader, tuple(r for r in isr if r not in shutting_down)


# ---- the controller -----------------------------------------------------------------------------------


class Controller(ReassignmentMixin):
    """See the module docstring. ``active`` says whether this broker is the controller, ``epoch`` is the
    controller epoch we won (or the last one we knew)."""

    def __init__(self, zk: KafkaZkClient, broker_id: int, config: BrokerConfig, *, listener_name: str,
                 channel: ControllerChannel | None = None, security: ClientSecurity | None = None) -> None:
        self.zk = zk
        self.broker_id = broker_id
        self.config = config
        # the broker's DynamicConfigs (set by the broker once built): the configs Kafka's controller reads from
        # its reconfigurable KafkaConfig (unclean.leader.election.enable) come from it, else from ``config``
        self.dynamic_configs: DynamicConfigs | None = None
        self.listener_name = listener_name
        self.channel = channel if channel is not None else ControllerChannel(
            broker_id, request_timeout_s=config.get("controller.socket.timeout.ms") / 1000, security=security)
        self.active = False
        self.epoch = 0
        self._leadership: ControllerLeadership | None = None
        self._queue: asyncio.Queue = asyncio.Queue()
        self._processor: asyncio.Task | None = None
        self._rebalance_timer: asyncio.Task | None = None
        self._stopping = False
        self._watched_topics: set[str] = set()
        self._watched_brokers: set[int] = set()
        self._reset_context()

    def _reset_context(self) -> None:
        """Kafka's ControllerContext: what the active controller knows, loaded at failover."""
        self._brokers: dict[int, BrokerRegistration] = {}  # live brokers (shutting-down ones included)
        self._shutting_down: set[int] = set()
        self._assignments: dict[str, dict[int, list[int]]] = {}
        self._topic_ids: dict[str, uuid.UUID] = {}
        self._states: dict[TopicPartition, PartitionState] = {}
        self._deleting: set[str] = set()
        self._channel_brokers: set[int] = set()
        self._adding: dict[TopicPartition, tuple[int, ...]] = {}  # reassignments: AR per partition
        self._removing: dict[TopicPartition, tuple[int, ...]] = {}  # and RR

    # -- lifecycle --

    async def start(self) -> None:
        """Start the event processor, queue an election, and set the watches (an absent /controller later
        makes us try again). Returns without waiting for the election."""
        self._processor = asyncio.get_running_loop().create_task(self._process_events(),
                                                                 name=f"controller-{self.broker_id}-events")
        self.zk.add_session_listener(self._on_session_event)
        self._enqueue("Startup", self._elect)  # Kafka's Startup event: elect (a no-op if someone else is controller)
        self.zk.watch_controller(self._on_controller_change)
        self.zk.watch_brokers(lambda ids: self._enqueue("BrokerChange", self._on_broker_change))
        self.zk.watch_topics(lambda topics: self._enqueue("TopicChange", self._on_topic_change))
        self.zk.watch_topic_deletions(lambda topics: self._enqueue("TopicDeletion", self._on_topic_deletion))
        self._watch_zk_reassignment()

    async def stop(self) -> None:
        """Resign if active (deleting /controller only if it is still ours), stop the processor, close the
        channel."""
        if self._stopping:
            return
        self._stopping = True
        if self._processor is not None and not self._processor.done():
            try:
                await asyncio.wait_for(self._run("Shutdown", lambda: self._resign(delete_znode=True)), 10.0)
            except Exception as exc:  # noqa: BLE001 - shutting down anyway: a session already gone, a timeout
                log.warning("controller %d: resigning at shutdown failed: %r", self.broker_id, exc)
            self._processor.cancel()
            await asyncio.gather(self._processor, return_exceptions=True)
        self._cancel_rebalance_timer()
        await self.channel.close()

    # -- the event queue (Kafka's ControllerEventManager) --

    def _enqueue(self, name: str, handler: Callable[[], Awaitable[Any]], *, awaited: bool = False) -> asyncio.Future:
        """Queue an event; its future settles when processed. Watches and timers do not await theirs
        (their failures are logged by the processor)."""
        future = asyncio.get_running_loop().create_future()
        if not awaited:
            future.add_done_callback(lambda f: f.cancelled() or f.exception())
        if self._stopping and name != "Shutdown":
            future.cancel()
            return future
        self._queue.put_nowait((name, handler, future))
        return future

    async def _run(self, name: str, handler: Callable[[], Awaitable[Any]]) -> Any:
        return await self._enqueue(name, handler, awaited=True)

    async def _process_events(self) -> None:
        while True:
            name, handler, future = await self._queue.get()
            if future.cancelled():
                continue
            try:
                result = await handler()
            except ControllerMoved as exc:
                log.info("controller %d: %s: controller moved (%s); resigning", self.broker_id, name, exc)
                await self._resign(delete_znode=False)
                if not future.done():
                    future.set_exception(exc)
            except asyncio.CancelledError:
                if not future.done():
                    future.cancel()
                raise
            except Exception as exc:
                log.exception("controller %d: event %s failed", self.broker_id, name)
                if not future.done():
                    future.set_exception(exc)
                if self.active:
                    # Half-done (a ZooKeeper connection loss fails writes whose effect is unknown): step back
                    # and run the failover again, which reloads ZooKeeper and resends every partition's state.
                    # /controller stays ours, so the election takes it back unless our session ended.
                    await self._resign(delete_znode=False)
                    asyncio.get_running_loop().call_later(
                        RETRY_FAILOVER_S, lambda: self._stopping or self._enqueue("Elect", self._elect))
            else:
                if not future.done():
                    future.set_result(result)

    # -- election and resignation --

    def _on_controller_change(self, controller_id: int | None) -> None:
        if controller_id is None or (controller_id == self.broker_id and not self.active):
            self._enqueue("Elect", self._elect)
        elif controller_id != self.broker_id and self.active:
            self._enqueue("ControllerChange", lambda: self._resign(delete_znode=False))

    def _on_session_event(self, event: str) -> None:
        if event == SessionEvent.EXPIRED:
            # Kafka's Expire event: our /controller is gone with the session; nothing we write may land.
            self._enqueue("Expire", lambda: self._resign(delete_znode=False))
        elif event == SessionEvent.RECONNECTED:
            self._enqueue("Elect", self._elect)

    async def _elect(self) -> None:
        if self.active or self._stopping:
            return
        leadership = await self.zk.try_become_controller(self.broker_id)
        if leadership is None:
            current = await self.zk.get_controller_epoch()
            if current is not None:
                self.epoch = current[0]
            return
        self._leadership, self.active, self.epoch = leadership, True, leadership.epoch
        log.info("controller %d: elected, epoch %d (zkVersion %d)", self.broker_id, leadership.epoch,
                 leadership.epoch_zk_version)
        try:
            await self._on_failover()
        except ControllerMoved:
            raise
        except Exception:
            # Kafka's onControllerFailover error path: resign and let the election run again.
            log.exception("controller %d: failover failed; resigning", self.broker_id)
            await self._resign(delete_znode=True)

    async def _resign(self, *, delete_znode: bool) -> None:
        """Kafka's onControllerResignation: stop acting as controller."""
        if not self.active:
            return
        leadership = self._leadership
        self.active, self._leadership = False, None
        self._cancel_rebalance_timer()
        for broker_id in list(self._channel_brokers):
            self.channel.remove_broker(broker_id)
        self._reset_context()
        log.info("controller %d: resigned (epoch %d)", self.broker_id, self.epoch)
        if delete_znode and leadership is not None:
            await self.zk.resign_controller(leadership)

    @property
    def _zkv(self) -> int:
        if self._leadership is None:
            raise ControllerMoved("not the controller")
        return self._leadership.epoch_zk_version

    # -- failover (Kafka's onControllerFailover) --

    async def _on_failover(self) -> None:
        brokers = await self.zk.live_brokers()
        for broker_id, reg in brokers.items():
            self._add_live_broker(reg)
        topics = await self.zk.all_topics()
        for topic in topics:
            await self._load_topic(topic)
        self._deleting = set(await self.zk.topics_marked_for_deletion()) & set(self._assignments)
        # Partitions without a state get one; those without a live leader get a leader if one is possible.
        batch = _Batch()
        for topic in sorted(self._assignments):
            if topic not in self._deleting:
                await self._initialize_partitions(topic, sorted(self._assignments[topic]), batch)
        await self._elect_offline_partitions(batch)
        await self._drop_dead_replicas_from_isrs()
        for tp in sorted(self._states):
            if tp[0] not in self._deleting:
                batch.add_leader_and_isr(self._live_replicas(tp), tp)
        batch.update_metadata |= set(self._states)
        batch.update_metadata_brokers = set(self._brokers)  # even with no partition: who is alive
        self._send(batch)
        self._start_rebalance_timer()
        await self._resume_reassignments()
        if self._deleting:
            await self._on_topic_deletion()

    async def _drop_dead_replicas_from_isrs(self) -> None:
        """Kafka's ReplicaStateMachine.startup at failover: replicas on brokers that are not alive go offline
        and leave the ISR of partitions whose leader is alive (leader epoch + 1). A follower that died with
        the previous controller is otherwise never removed from an idle partition's ISR: its log end still
        equals the leader's, so the leader never finds it out of sync."""
        live = set(self._brokers)
        changes: dict[TopicPartition, PartitionState] = {}
        for tp in self._partitions():
            state = self._states.get(tp)
            if state is None or tp[0] in self._deleting or state.leader not in live:
                continue
            isr = tuple(r for r in state.isr if r in live)
            if isr and isr != tuple(state.isr):
                changes[tp] = self._next_state(tp, state.leader, isr)
        await self._write_states(changes)

    async def _load_topic(self, topic: str) -> TopicAssignment | None:
        assignment = await self.zk.get_topic_assignment(topic)
        if assignment is None:
            return None
        if assignment.topic_id is None:
            # Kafka's controller gives topics created by old tools an id (setTopicIds).
            assignment = dataclasses.replace(assignment, topic_id=uuid_to_kafka(uuid.uuid4()))
            await self.zk.set_topic_assignment(topic, assignment, assignment.zk_version, self._zkv)
        self._assignments[topic] = dict(assignment.partitions)
        self._topic_ids[topic] = kafka_uuid_to_uuid(assignment.topic_id)
        self._load_reassignment(topic, assignment.adding_replicas, assignment.removing_replicas)
        for p in assignment.partitions:
            state = await self.zk.get_partition_state(topic, p)
            if state is not None:
                self._states[(topic, p)] = state
        self._watch_topic(topic)
        return assignment

    def _watch_topic(self, topic: str) -> None:
        if topic not in self._watched_topics:
            self._watched_topics.add(topic)
            self.zk.watch_topic_assignment(
                topic, lambda _a, t=topic: self._enqueue(f"PartitionModifications({t})",
                                                         lambda: self._on_partition_modifications(t)))

    # -- the context's questions --

    def _live(self) -> set[int]:
        """Brokers that may lead or join an ISR: live and not shutting down."""
        return set(self._brokers) - self._shutting_down

    def _live_replicas(self, tp: TopicPartition) -> list[int]:
        """Replicas on live brokers, shutting-down ones included (they still get requests)."""
        return [r for r in self._assignments[tp[0]][tp[1]] if r in self._brokers]

    def _partitions(self) -> list[TopicPartition]:
        return [(t, p) for t, parts in sorted(self._assignments.items()) for p in sorted(parts)]

    async def _unclean_enabled(self, topic: str) -> bool:
        config = await self.zk.get_topic_config(topic)
        value = config.get("unclean.leader.election.enable")
        if value is None:  # the broker default, dynamic (AlterConfigs) or static, as Kafka's controller reads it
            value_of = self.dynamic_configs.value if self.dynamic_configs is not None else self.config.get
            return bool(value_of("unclean.leader.election.enable"))
        return value.strip().lower() == "true"

    def _add_live_broker(self, reg: BrokerRegistration) -> None:
        self._brokers[reg.broker_id] = reg
        if reg.broker_id not in self._watched_brokers:
            self._watched_brokers.add(reg.broker_id)
            self.zk.watch_broker(reg.broker_id, lambda _r, b=reg.broker_id: self._enqueue(
                f"BrokerModifications({b})", lambda: self._on_broker_modification(b)))
        endpoint = reg.endpoint(self.listener_name)
        if endpoint is None:
            log.warning("controller %d: broker %d has no %s endpoint", self.broker_id, reg.broker_id,
                        self.listener_name)
            return
        self.channel.add_broker(reg.broker_id, endpoint.host, endpoint.port)
        self._channel_brokers.add(reg.broker_id)

    def _remove_live_broker(self, broker_id: int) -> None:
        self._brokers.pop(broker_id, None)
        self._shutting_down.discard(broker_id)
        if broker_id in self._channel_brokers:
            self._channel_brokers.discard(broker_id)
            self.channel.remove_broker(broker_id)

    # -- partition state writes --

    async def _write_states(self, changes: dict[TopicPartition, PartitionState]) -> dict[TopicPartition, PartitionState]:
        """Conditional writes of new leader/ISR states (on the zkVersion we hold, fenced by our epoch).
        Returns the states written, with their new zkVersion (partition epoch). A partition whose znode
        moved under us (StaleZkVersion) is re-read and left out."""
        zkv = self._zkv

        async def write(tp: TopicPartition, state: PartitionState) -> PartitionState | None:
            current = self._states[tp]
            try:
                version = await self.zk.update_partition_state(tp[0], tp[1], state, current.zk_version, zkv)
            except StaleZkVersion:
                fresh = await self.zk.get_partition_state(*tp)
                if fresh is not None:
                    self._states[tp] = fresh
                log.warning("controller %d: state of %s-%d changed under us; not updated", self.broker_id, *tp)
                return None
            written = dataclasses.replace(state, zk_version=version)
            self._states[tp] = written
            return written

        tps = list(changes)
        results = await asyncio.gather(*(write(tp, changes[tp]) for tp in tps), return_exceptions=True)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:  # raised once every write has settled, so none lands after a resignation
            raise failure
        return {tp: s for tp, s in zip(tps, results) if s is not None}

    def _next_state(self, tp: TopicPartition, leader: int, isr: Iterable[int],
                    recovery: int | None = None) -> PartitionState:
        old = self._states[tp]
        return PartitionState(leader=leader, leader_epoch=old.leader_epoch + 1, isr=tuple(isr),
                              controller_epoch=self.epoch,
                              leader_recovery_state=old.leader_recovery_state if recovery is None else recovery)

    async def _initialize_partitions(self, topic: str, partitions: list[int], batch: _Batch) -> None:
        """Kafka's NewPartition -> OnlinePartition: leader = first live replica, ISR = live replicas, epochs
        0, created with one transaction; LeaderAndIsr(is_new) to the live replicas. A partition with no
        live replica stays without a state until one comes up."""
        live = self._live()
        new: dict[int, PartitionState] = {}
        for p in partitions:
            if (topic, p) in self._states:
                continue
            replicas = [r for r in self._assignments[topic][p] if r in live]
            if not replicas:
                log.info("controller %d: no live replica for new partition %s-%d", self.broker_id, topic, p)
                continue
            new[p] = PartitionState(leader=replicas[0], leader_epoch=0, isr=tuple(replicas),
                                    controller_epoch=self.epoch)
        if not new:
            return
        try:
            await self.zk.create_partition_states(topic, new, self._zkv)
            created = {p: dataclasses.replace(s, zk_version=0) for p, s in new.items()}
        except NodeExistsError:  # (partly) created by an earlier controller: take what is there
            created = {}
            for p in new:
                state = await self.zk.get_partition_state(topic, p)
                if state is None:
                    (version,) = (await self.zk.create_partition_states(topic, {p: new[p]}, self._zkv)).values()
                    state = dataclasses.replace(new[p], zk_version=version)
                created[p] = state
        for p, state in created.items():
            self._states[(topic, p)] = state
            batch.add_leader_and_isr(self._live_replicas((topic, p)), (topic, p), is_new=True)

    async def _elect_offline_partitions(self, batch: _Batch) -> None:
        """Kafka's triggerOnlinePartitionStateChange: every partition without a live leader (or without a
        state) gets one if it can."""
        live = self._live()
        changes: dict[TopicPartition, PartitionState] = {}
        uninitialized: dict[str, list[int]] = {}
        for tp in self._partitions():
            if tp[0] in self._deleting:
                continue
            state = self._states.get(tp)
            if state is None:
                uninitialized.setdefault(tp[0], []).append(tp[1])
                continue
            if state.leader in self._brokers:  # a leader in controlled shutdown is still online (isReplicaOnline)
                continue
            chosen = offline_partition_leader(self._assignments[tp[0]][tp[1]], state.isr, live,
                                              await self._unclean_enabled(tp[0]))
            if chosen is not None:
                leader, isr, unclean = chosen
                changes[tp] = self._next_state(tp, leader, isr, LEADER_RECOVERING if unclean else None)
        for topic, parts in uninitialized.items():
            await self._initialize_partitions(topic, parts, batch)
        for tp in await self._write_states(changes):
            batch.add_leader_and_isr(self._live_replicas(tp), tp)

    # -- sending --

    def _send(self, batch: _Batch) -> None:
        """LeaderAndIsr to each broker for its partitions, then UpdateMetadata to every live broker, then
        StopReplica (Kafka's ControllerBrokerRequestBatch.sendRequestsToBrokers)."""
        if not self.active:
            return
        for broker_id, parts in sorted(batch.leader_and_isr.items()):
            if broker_id in self._brokers:
                self.channel.send(broker_id, self._leader_and_isr_request(broker_id, parts))
        if batch.update_metadata_brokers is not None or batch.update_metadata:
            brokers = set(self._brokers) if batch.update_metadata_brokers is None else batch.update_metadata_brokers
            for broker_id in sorted(brokers & set(self._brokers)):
                self.channel.send(broker_id, self._update_metadata_request(broker_id, batch.update_metadata))
        for broker_id, parts in sorted(batch.stop_replica.items()):
            if broker_id in self._brokers:
                self.channel.send(broker_id, self._stop_replica_request(broker_id, parts))

    def _broker_epoch(self, broker_id: int) -> i64:
        return i64(self._brokers[broker_id].epoch)

    def _leader_and_isr_request(self, broker_id: int, parts: dict[TopicPartition, bool]) -> Any:
        topics: dict[str, list] = {}
        leaders: set[int] = set()
        for (topic, p), is_new in sorted(parts.items()):
            state = self._states[(topic, p)]
            leaders.add(state.leader)
            topics.setdefault(topic, []).append(lai.LeaderAndIsrPartitionState(
                partition_index=i32(p), controller_epoch=i32(state.controller_epoch), leader=i32(state.leader),
                leader_epoch=i32(state.leader_epoch), isr=tuple(i32(r) for r in state.isr),
                partition_epoch=i32(state.zk_version),
                replicas=tuple(i32(r) for r in self._assignments[topic][p]),
                **{k: tuple(i32(r) for r in v) for k, v in self._reassignment_fields((topic, p)).items()},
                is_new=is_new,
                leader_recovery_state=i8(state.leader_recovery_state)))
        live_leaders = []
        for leader in sorted(leaders):
            reg = self._brokers.get(leader)
            endpoint = reg.endpoint(self.listener_name) if reg is not None else None
            if endpoint is not None:
                live_leaders.append(lai.LeaderAndIsrLiveLeader(broker_id=i32(leader), host_name=endpoint.host,
                                                               port=i32(endpoint.port)))
        return lai.LeaderAndIsrRequest(
            controller_id=i32(self.broker_id), is_k_raft_controller=False, controller_epoch=i32(self.epoch),
            broker_epoch=self._broker_epoch(broker_id), type_=i8(0),
            topic_states=tuple(lai.LeaderAndIsrTopicState(topic_name=t, topic_id=self._topic_ids.get(t),
                                                          partition_states=tuple(ps))
                               for t, ps in topics.items()),
            live_leaders=tuple(live_leaders))

    def _update_metadata_request(self, broker_id: int, partitions: set[TopicPartition]) -> Any:
        topics: dict[str, list] = {}
        for topic, p in sorted(partitions):
            state = self._states.get((topic, p))
            if state is None or topic not in self._assignments:
                continue
            replicas = self._assignments[topic][p]
            leader = LEADER_DURING_DELETE if topic in self._deleting else state.leader
            topics.setdefault(topic, []).append(um.UpdateMetadataPartitionState(
                partition_index=i32(p), controller_epoch=i32(state.controller_epoch), leader=i32(leader),
                leader_epoch=i32(state.leader_epoch), isr=tuple(i32(r) for r in state.isr),
                zk_version=i32(state.zk_version), replicas=tuple(i32(r) for r in replicas),
                offline_replicas=tuple(i32(r) for r in replicas if r not in self._brokers)))
        brokers = tuple(
            um.UpdateMetadataBroker(
                id_=i32(reg.broker_id), rack=reg.rack,
                endpoints=tuple(um.UpdateMetadataEndpoint(
                    port=i32(e.port), host=e.host, listener=e.name,
                    security_protocol=i16(SECURITY_PROTOCOL_IDS.get(e.security_protocol, 0)))
                    for e in reg.endpoints))
            for _, reg in sorted(self._brokers.items()))
        return um.UpdateMetadataRequest(
            controller_id=i32(self.broker_id), is_k_raft_controller=False, type_=i8(0),
            controller_epoch=i32(self.epoch), broker_epoch=self._broker_epoch(broker_id),
            topic_states=tuple(um.UpdateMetadataTopicState(topic_name=t, topic_id=self._topic_ids.get(t),
                                                           partition_states=tuple(ps))
                               for t, ps in topics.items()),
            live_brokers=brokers)

    def _stop_replica_request(self, broker_id: int, parts: dict[TopicPartition, bool]) -> Any:
        topics: dict[str, list] = {}
        for (topic, p), delete in sorted(parts.items()):
            state = self._states.get((topic, p))
            # Kafka sends LeaderEpochDuringDelete (-2) for a deleted topic, else the current epoch (a replica
            # removed by a reassignment is deleted with the current epoch: its broker keeps the topic).
            epoch = -2 if delete and topic in self._deleting else (state.leader_epoch if state is not None else -1)
            topics.setdefault(topic, []).append(sr.StopReplicaPartitionState(
                partition_index=i32(p), leader_epoch=i32(epoch), delete_partition=delete))
        return sr.StopReplicaRequest(
            controller_id=i32(self.broker_id), is_k_raft_controller=False, controller_epoch=i32(self.epoch),
            broker_epoch=self._broker_epoch(broker_id),
            topic_states=tuple(sr.StopReplicaTopicState(topic_name=t, partition_states=tuple(ps))
                               for t, ps in topics.items()))

    # -- brokers coming and going (Kafka's BrokerChange: onBrokerStartup / onBrokerFailure) --

    async def _on_broker_change(self) -> None:
        if not self.active:
            return
        current = await self.zk.live_brokers()
        dead = {b for b in self._brokers if b not in current}
        # A broker that re-registered (new czxid) bounced: it is handled as dead, then as new (Kafka does).
        bounced = {b for b, reg in current.items() if b in self._brokers and reg.epoch != self._brokers[b].epoch}
        new = {b for b in current if b not in self._brokers} | bounced
        for broker_id in dead | bounced:
            self._remove_live_broker(broker_id)
        if dead | bounced:
            log.info("controller %d: brokers gone: %s", self.broker_id, sorted(dead | bounced))
            await self._on_broker_failure(dead | bounced)
        if new:
            log.info("controller %d: new brokers: %s", self.broker_id, sorted(new))
            for broker_id in new:
                self._add_live_broker(current[broker_id])
            await self._on_broker_startup(new)

    async def _on_broker_modification(self, broker_id: int) -> None:
        """Kafka's BrokerModifications / onBrokerUpdate: a live broker rewrote its registration (same epoch)
        with other endpoints or rack: the channel uses the new address, every broker gets UpdateMetadata."""
        old = self._brokers.get(broker_id)
        if not self.active or old is None:
            return
        reg = await self.zk.get_broker(broker_id)
        if reg is None or reg.epoch != old.epoch or (reg.endpoints, reg.rack) == (old.endpoints, old.rack):
            return  # gone or re-registered (BrokerChange handles those), or nothing we use changed
        log.info("controller %d: broker %d changed its registration: %s", self.broker_id, broker_id,
                 [str(e) for e in reg.endpoints])
        self._add_live_broker(reg)
        self._send(_Batch(update_metadata_brokers=set(self._brokers)))

    async def _on_broker_failure(self, dead: set[int]) -> None:
        """Partitions led by a dead broker get a new leader from the live ISR (or from any live replica if
        unclean election is on), else leader -1 with the ISR kept; partitions where it was a follower in the
        ISR drop it. Both bump the leader epoch. LeaderAndIsr to the live replicas, UpdateMetadata to all,
        even when no partition changed (no topic, none on the dead broker): Kafka's onReplicasBecomeOffline
        then sends an UpdateMetadata of its own, so every broker stops listing the dead one."""
        live = self._live()
        batch = _Batch(update_metadata_brokers=set(self._brokers))
        changes: dict[TopicPartition, PartitionState] = {}
        for tp in self._partitions():
            state = self._states.get(tp)
            if state is None or tp[0] in self._deleting:
                continue
            replicas = self._assignments[tp[0]][tp[1]]
            if dead & set(replicas):
                batch.update_metadata.add(tp)  # its offline_replicas change
            if state.leader in dead:
                chosen = offline_partition_leader(replicas, state.isr, live, await self._unclean_enabled(tp[0]))
                if chosen is None:
                    changes[tp] = self._next_state(tp, NO_LEADER, state.isr)
                else:
                    leader, isr, unclean = chosen
                    changes[tp] = self._next_state(tp, leader, isr, LEADER_RECOVERING if unclean else None)
            elif dead & set(state.isr):
                isr = tuple(r for r in state.isr if r not in dead)
                if isr:
                    changes[tp] = self._next_state(tp, state.leader, isr)
        for tp in await self._write_states(changes):
            batch.add_leader_and_isr(self._live_replicas(tp), tp)
        self._send(batch)

    async def _on_broker_startup(self, new: set[int]) -> None:
        """UpdateMetadata with the brokers only to the others and with every partition to the new ones,
        LeaderAndIsr (not new) to the new brokers for all their replicas, then elections for the partitions
        they can lead now."""
        old = set(self._brokers) - new
        if old:
            self._send(_Batch(update_metadata_brokers=old))
        known = {tp for tp in self._states if tp[0] not in self._deleting}
        self._send(_Batch(update_metadata=known, update_metadata_brokers=set(new)))
        batch = _Batch()
        for tp in sorted(known):
            receivers = [b for b in self._assignments[tp[0]][tp[1]] if b in new]
            if receivers:
                batch.add_leader_and_isr(receivers, tp)
        self._send(batch)
        batch = _Batch()
        await self._elect_offline_partitions(batch)
        self._send(batch)

    # -- topics (Kafka's TopicChange, PartitionModifications, TopicDeletion) --

    async def _on_topic_change(self) -> None:
        if not self.active:
            return
        topics = set(await self.zk.all_topics())
        for gone in set(self._assignments) - topics:  # deleted behind our back: forget it
            self._forget_topic(gone)
        batch = _Batch()
        for topic in sorted(topics - set(self._assignments)):
            assignment = await self._load_topic(topic)
            if assignment is not None:
                log.info("controller %d: new topic %s: %s", self.broker_id, topic, assignment.partitions)
                await self._initialize_partitions(topic, sorted(assignment.partitions), batch)
        self._send(batch)

    async def _on_partition_modifications(self, topic: str) -> None:
        if not self.active or topic not in self._assignments or topic in self._deleting:
            return
        assignment = await self.zk.get_topic_assignment(topic)
        if assignment is None:
            return
        added = sorted(set(assignment.partitions) - set(self._assignments[topic]))
        if not added:
            return
        log.info("controller %d: partitions added to %s: %s", self.broker_id, topic, added)
        for p in added:
            self._assignments[topic][p] = list(assignment.partitions[p])
        batch = _Batch()
        await self._initialize_partitions(topic, added, batch)
        self._send(batch)

    async def _on_topic_deletion(self) -> None:
        """UpdateMetadata with leader -2 for the topic's partitions to every live broker, StopReplica
        (delete) to its live replicas, then the topic's znodes, config and marker go."""
        if not self.active:
            return
        if not self.config.get("delete.topic.enable"):
            for topic in await self.zk.topics_marked_for_deletion():
                await self.zk.guarded_multi(self._zkv, [("delete", delete_topic_path(topic), -1)])
            return
        for topic in await self.zk.topics_marked_for_deletion():
            # Its entries in the legacy reassignment document go too: they would apply to a topic created
            # later under the same name (the in-memory AR/RR go with _forget_topic).
            await self._remove_from_zk_reassignment(lambda tp, gone=topic: tp[0] == gone)
            if topic not in self._assignments and await self._load_topic(topic) is None:
                try:  # no such topic: only the marker goes
                    await self.zk.delete_topic_znodes(topic, self._zkv)
                except NoNodeError:
                    pass
                continue
            log.info("controller %d: deleting topic %s", self.broker_id, topic)
            self._deleting.add(topic)
            batch = _Batch()
            for p in sorted(self._assignments[topic]):
                batch.update_metadata.add((topic, p))
                for r in self._live_replicas((topic, p)):
                    batch.add_stop_replica(r, (topic, p), delete=True)
            self._send(batch)
            await self.zk.delete_topic_znodes(topic, self._zkv)
            self._forget_topic(topic)

    def _forget_topic(self, topic: str) -> None:
        for p in self._assignments.pop(topic, {}):
            self._states.pop((topic, p), None)
            self._adding.pop((topic, p), None)
            self._removing.pop((topic, p), None)
        self._topic_ids.pop(topic, None)
        self._deleting.discard(topic)

    # -- AlterPartition (Kafka's processAlterPartition, ZooKeeper mode) --

    async def alter_partition(self, request: Any) -> Any:
        """AlterPartition v2/v3 (the versions kio has; both name topics by id) -> the response of the same
        version, answered after UpdateMetadata with the new ISRs went into the brokers' queues."""
        version = int(request.__version__)
        schema = importlib.import_module(f"kio.schema.alter_partition.v{version}.response")
        if not self.active:
            return schema.AlterPartitionResponse(throttle_time=timedelta(0), error_code=ErrorCode.not_controller,
                                                 topics=())
        try:
            return await self._run("AlterPartition", lambda: self._alter_partition(request, schema))
        except (ControllerMoved, asyncio.CancelledError):
            return schema.AlterPartitionResponse(throttle_time=timedelta(0), error_code=ErrorCode.not_controller,
                                                 topics=())

    async def _alter_partition(self, request: Any, schema: Any) -> Any:
        def top(error: ErrorCode) -> Any:
            return schema.AlterPartitionResponse(throttle_time=timedelta(0), error_code=error, topics=())

        if not self.active:
            return top(ErrorCode.not_controller)
        sender = self._brokers.get(int(request.broker_id))
        if sender is None or int(request.broker_epoch) != sender.epoch:
            return top(ErrorCode.stale_broker_epoch)
        by_id = {tid: t for t, tid in self._topic_ids.items()}
        answers: list[tuple[Any, list[tuple[int, ErrorCode | TopicPartition]]]] = []
        changes: dict[TopicPartition, PartitionState] = {}
        for topic_data in request.topics:
            name = by_id.get(topic_data.topic_id)
            results: list[tuple[int, ErrorCode | TopicPartition]] = []
            for part in topic_data.partitions:
                index = int(part.partition_index)
                tp = (name, index)
                state = self._states.get(tp) if name is not None else None
                if state is None or name in self._deleting:
                    results.append((index, ErrorCode.unknown_topic_id if name is None
                                    else ErrorCode.unknown_topic_or_partition))
                    continue
                error = self._check_alter(tp, state, part)
                if error is not None:
                    results.append((index, error))
                    continue
                isr = _new_isr(part)
                if (isr, int(part.leader_recovery_state)) != (state.isr, state.leader_recovery_state):
                    changes[tp] = PartitionState(leader=state.leader, leader_epoch=state.leader_epoch, isr=isr,
                                                 controller_epoch=self.epoch,
                                                 leader_recovery_state=int(part.leader_recovery_state))
                results.append((index, tp))
            answers.append((topic_data, results))
        written = await self._write_states(changes)
        if written:
            self._send(_Batch(update_metadata=set(written)))
        topics = []
        for topic_data, results in answers:
            parts = []
            for index, outcome in results:
                if isinstance(outcome, tuple) and outcome in changes and outcome not in written:
                    outcome = ErrorCode.invalid_update_version
                if isinstance(outcome, tuple):
                    s = self._states[outcome]
                    parts.append(schema.PartitionData(
                        partition_index=i32(index), error_code=ErrorCode.none, leader_id=i32(s.leader),
                        leader_epoch=i32(s.leader_epoch), isr=tuple(i32(r) for r in s.isr),
                        leader_recovery_state=i8(s.leader_recovery_state), partition_epoch=i32(s.zk_version)))
                else:
                    parts.append(schema.PartitionData(partition_index=i32(index), error_code=outcome,
                                                      leader_id=i32(0), leader_epoch=i32(0), isr=(),
                                                      leader_recovery_state=i8(0), partition_epoch=i32(0)))
            topics.append(schema.TopicData(topic_id=topic_data.topic_id, partitions=tuple(parts)))
        # Reassignments waiting for their target replicas in the ISR may complete now (after the answer is built:
        # it carries the state the leader asked for, the completion's LeaderAndIsr follows).
        await self._maybe_complete_reassignments(written)
        return schema.AlterPartitionResponse(throttle_time=timedelta(0), error_code=ErrorCode.none,
                                             topics=tuple(topics))

    def _check_alter(self, tp: TopicPartition, state: PartitionState, part: Any) -> ErrorCode | None:
        if int(part.leader_epoch) != state.leader_epoch:
            return ErrorCode.fenced_leader_epoch
        isr = _new_isr(part)
        recovery = int(part.leader_recovery_state)
        if (isr, recovery) == (state.isr, state.leader_recovery_state):
            return None  # already so (a retried request): answer the current state, stale partition epoch or not
        if int(part.partition_epoch) != state.zk_version:
            return ErrorCode.invalid_update_version
        if recovery == LEADER_RECOVERING and len(isr) > 1:
            return ErrorCode.invalid_request
        if state.leader_recovery_state == LEADER_RECOVERED and recovery == LEADER_RECOVERING:
            return ErrorCode.invalid_request
        replicas = self._assignments[tp[0]][tp[1]]
        epochs = {int(b.broker_id): int(b.broker_epoch) for b in getattr(part, "new_isr_with_epochs", ())}
        live = self._live()
        for r in isr:
            if r not in replicas or r not in live or epochs.get(r, -1) not in (-1, self._brokers[r].epoch):
                return ErrorCode.ineligible_replica
        return None

    # -- ControlledShutdown (Kafka's doControlledShutdown) --

    async def controlled_shutdown(self, broker_id: int, broker_epoch: int) -> tuple[ErrorCode, list[TopicPartition]]:
        """Move leaderships off broker_id and drop it from the ISRs; returns NONE and the partitions (with
        more than one replica) it still leads, as Kafka does; STALE_BROKER_EPOCH for an old epoch,
        BROKER_NOT_AVAILABLE for a broker that is not registered, NOT_CONTROLLER when not active."""
        if not self.active:
            return ErrorCode.not_controller, []
        try:
            return await self._run("ControlledShutdown", lambda: self._controlled_shutdown(broker_id, broker_epoch))
        except (ControllerMoved, asyncio.CancelledError):
            return ErrorCode.not_controller, []

    async def _controlled_shutdown(self, broker_id: int, broker_epoch: int) -> tuple[ErrorCode, list[TopicPartition]]:
        if not self.active:
            return ErrorCode.not_controller, []
        reg = self._brokers.get(broker_id)
        if reg is None:
            return ErrorCode.broker_not_available, []
        if broker_epoch != -1 and broker_epoch < reg.epoch:
            return ErrorCode.stale_broker_epoch, []
        self._shutting_down.add(broker_id)
        log.info("controller %d: controlled shutdown of broker %d", self.broker_id, broker_id)
        live = self._live()
        hosted = [tp for tp in self._partitions() if tp in self._states and tp[0] not in self._deleting
                  and broker_id in self._assignments[tp[0]][tp[1]] and len(self._assignments[tp[0]][tp[1]]) > 1]
        led = [tp for tp in hosted if self._states[tp].leader == broker_id]
        followed = [tp for tp in hosted if self._states[tp].leader != broker_id]
        moves: dict[TopicPartition, PartitionState] = {}
        for tp in led:
            chosen = controlled_shutdown_leader(self._assignments[tp[0]][tp[1]], self._states[tp].isr, live,
                                                self._shutting_down)
            if chosen is not None:
                moves[tp] = self._next_state(tp, chosen[0], chosen[1])
        batch = _Batch()
        for tp in await self._write_states(moves):
            batch.add_leader_and_isr(self._live_replicas(tp), tp)
        self._send(batch)
        # Its follower replicas go offline: StopReplica (no delete) to it, and it leaves their ISRs.
        batch = _Batch()
        shrinks: dict[TopicPartition, PartitionState] = {}
        for tp in followed:
            state = self._states[tp]
            batch.add_stop_replica(broker_id, tp, delete=False)
            if broker_id in state.isr and len(state.isr) > 1:
                shrinks[tp] = self._next_state(tp, state.leader, [r for r in state.isr if r != broker_id])
        for tp in await self._write_states(shrinks):
            batch.add_leader_and_isr([r for r in self._live_replicas(tp) if r != broker_id], tp)
        self._send(batch)
        remaining = [tp for tp in led if self._states[tp].leader == broker_id]
        return ErrorCode.none, remaining

    # -- ElectLeaders --

    async def elect_leaders(self, election_type: int,
                            partitions: list[TopicPartition] | None) -> dict[TopicPartition, tuple[ErrorCode, str | None]]:
        """Preferred (0) or unclean (1) election for the partitions (None: all). Per partition: NONE,
        ELECTION_NOT_NEEDED, PREFERRED_LEADER_NOT_AVAILABLE / ELIGIBLE_LEADERS_NOT_AVAILABLE,
        UNKNOWN_TOPIC_OR_PARTITION; NOT_CONTROLLER for every one when not active."""
        def all_failed(error: ErrorCode) -> dict[TopicPartition, tuple[ErrorCode, str | None]]:
            return {tp: (error, None) for tp in (partitions or [])}

        if not self.active:
            return all_failed(ErrorCode.not_controller)
        try:
            return await self._run("ElectLeaders", lambda: self._elect_leaders(election_type, partitions))
        except (ControllerMoved, asyncio.CancelledError):
            return all_failed(ErrorCode.not_controller)

    async def _elect_leaders(self, election_type: int, partitions: list[TopicPartition] | None,
                             ) -> dict[TopicPartition, tuple[ErrorCode, str | None]]:
        if not self.active:
            return {tp: (ErrorCode.not_controller, None) for tp in (partitions or [])}
        if election_type not in (PREFERRED_ELECTION, UNCLEAN_ELECTION):
            return {tp: (ErrorCode.invalid_request, f"Unknown election type {election_type}")
                    for tp in (partitions or [])}
        wanted = self._partitions() if partitions is None else list(dict.fromkeys(partitions))
        results: dict[TopicPartition, tuple[ErrorCode, str | None]] = {}
        changes: dict[TopicPartition, PartitionState] = {}
        live = self._live()
        for tp in wanted:
            state = self._states.get(tp)
            if state is None or tp[0] in self._deleting:
                results[tp] = (ErrorCode.unknown_topic_or_partition,
                               "The partition does not exist.")
                continue
            replicas = self._assignments[tp[0]][tp[1]]
            if election_type == PREFERRED_ELECTION:
                preferred = replicas[0]
                if state.leader == preferred:
                    results[tp] = (ErrorCode.election_not_needed, "Leader election not needed for topic partition.")
                elif preferred in live and preferred in state.isr:
                    changes[tp] = self._next_state(tp, preferred, state.isr)
                else:
                    results[tp] = (ErrorCode.preferred_leader_not_available,
                                   f"Failed to elect leader for partition {tp[0]}-{tp[1]} under strategy "
                                   "PreferredReplicaPartitionLeaderElectionStrategy")
            else:
                if state.leader in live:
                    results[tp] = (ErrorCode.election_not_needed, "Leader election not needed for topic partition.")
                    continue
                chosen = offline_partition_leader(replicas, state.isr, live, unclean=True)
                if chosen is None:
                    results[tp] = (ErrorCode.eligible_leaders_not_available,
                                   f"Failed to elect leader for partition {tp[0]}-{tp[1]} under strategy "
                                   "OfflinePartitionLeaderElectionStrategy(true)")
                else:
                    leader, isr, unclean = chosen
                    changes[tp] = self._next_state(tp, leader, isr, LEADER_RECOVERING if unclean else None)
        written = await self._write_states(changes)
        batch = _Batch()
        for tp in written:
            batch.add_leader_and_isr(self._live_replicas(tp), tp)
        self._send(batch)
        for tp in changes:
            results[tp] = (ErrorCode.none, None) if tp in written else (
                ErrorCode.invalid_update_version, "The partition state changed during the election.")
        return results

    # -- auto leader rebalance (Kafka's checkAndTriggerAutoLeaderRebalance) --

    def _start_rebalance_timer(self) -> None:
        if not self.config.get("auto.leader.rebalance.enable"):
            return
        interval = float(self.config.get("leader.imbalance.check.interval.seconds"))

        async def tick() -> None:
            while True:
                await asyncio.sleep(interval)
                self._enqueue("AutoPreferredReplicaLeaderElection", self._auto_rebalance)

        self._rebalance_timer = asyncio.get_running_loop().create_task(tick())

    def _cancel_rebalance_timer(self) -> None:
        if self._rebalance_timer is not None:
            self._rebalance_timer.cancel()
            self._rebalance_timer = None

    async def _auto_rebalance(self) -> None:
        """For every broker preferred by some partitions: if the share of those it does not lead exceeds
        leader.imbalance.per.broker.percentage, preferred elections for those whose preferred replica is
        live, in the ISR and not shutting down (no topic being deleted, no partition being reassigned)."""
        if not self.active:
            return
        threshold = float(self.config.get("leader.imbalance.per.broker.percentage")) / 100
        live = self._live()
        reassigning = set(self._reassigning())  # Kafka's checkAndTriggerAutoLeaderRebalance leaves them alone
        by_preferred: dict[int, list[TopicPartition]] = {}
        for tp in self._partitions():
            if tp in self._states and tp[0] not in self._deleting and tp not in reassigning:
                by_preferred.setdefault(self._assignments[tp[0]][tp[1]][0], []).append(tp)
        candidates: list[TopicPartition] = []
        for broker_id, tps in sorted(by_preferred.items()):
            not_led = [tp for tp in tps if self._states[tp].leader != broker_id]
            ratio = len(not_led) / len(tps)
            log.debug("controller %d: leader imbalance ratio of broker %d: %.3f", self.broker_id, broker_id, ratio)
            if ratio > threshold and broker_id in live:
                candidates += [tp for tp in not_led if broker_id in self._states[tp].isr]
        if candidates and not self._deleting:
            await self._elect_leaders(PREFERRED_ELECTION, candidates)


def _new_isr(part: Any) -> tuple[int, ...]:
    """The proposed ISR of an AlterPartition partition: v3 names brokers with their epochs, v0-2 bare ids."""
    with_epochs = getattr(part, "new_isr_with_epochs", None)
    if with_epochs is not None:
        return tuple(int(b.broker_id) for b in with_epochs)
    return tuple(int(b) for b in part.new_isr)

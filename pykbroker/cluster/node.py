"""One broker's part in a ZooKeeper cluster: the composition of the cluster parts, and what a broker does
with the controller's requests.

Built by the broker (server/broker.py) when ``zookeeper.connect`` is set; without it none of this exists
and the broker is the embedded single node. Kafka's KafkaServer (ZooKeeper mode) and ReplicaManager are the
reference:

- Start: connect to ZooKeeper (``zookeeper.session.timeout.ms``), read or create the cluster id (a data dir
  that belongs to another cluster is refused, as Kafka's InconsistentClusterIdException), then, with the
  listeners bound but not yet accepting (Kafka processes requests only once registered), register
  ``/brokers/ids/<id>`` (ephemeral; its czxid is the broker epoch) and start the controller elector. From then on the broker learns everything from the controller:
  UpdateMetadata fills the metadata cache, LeaderAndIsr makes it leader or follower of its replicas,
  StopReplica stops (and deletes) them.
- Fencing: a request from a controller whose epoch is older than the newest this broker has seen gets
  STALE_CONTROLLER_EPOCH and changes nothing (a paused or partitioned old controller cannot undo the new
  one's decisions); one stamped with an older broker epoch than ours (meant for a previous incarnation of
  this broker) gets STALE_BROKER_EPOCH. Per partition, LeaderAndIsr applies only a newer leader epoch.
- ZooKeeper session expiry: the ephemeral registration is gone and the controller treats the broker as
  dead; when kazoo has a new session, the broker registers again (new broker epoch) and the controller
  sends it its state anew (its leaderships have moved meanwhile; the fetchers truncate what the new
  leaders do not have).
- Stop: controlled shutdown first (``controlled.shutdown.enable``): ControlledShutdown to the controller,
  retried ``controlled.shutdown.max.retries`` times ``controlled.shutdown.retry.backoff.ms`` apart, until
  no partition is led here any more, so that clients move to the new leaders before this broker goes.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Callable

from pykbroker.cluster.alter_partition import AlterPartitionManager
from pykbroker.cluster.controller import Controller
from pykbroker.cluster.zk_metadata import MetadataStartError, ZkMetadata
from pykbroker.cluster.zookeeper import BrokerIdInUse, Endpoint, KafkaZkClient, SessionEvent
from pykbroker.protocol.client import ClientError, NodeClients
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.interbroker import load_request_schema
from pykbroker.replication.fetcher import ReplicaFetcherManager
from pykbroker.replication.quota import quotas_for

if TYPE_CHECKING:
    from pykbroker.server.broker import Broker

log = logging.getLogger(__name__)

NO_LEADER = -1
LEADER_DURING_DELETE = -2  # the leader UpdateMetadata names for partitions of a topic being deleted
EPOCH_DURING_DELETE = -2  # StopReplica's leader epoch for a deletion: applies whatever the local epoch
CONTROLLED_SHUTDOWN_VERSION = 3

LeadershipListener = Callable[[str, int, bool], None]


class ClusterStartError(Exception):
    """The broker cannot join the cluster (ZooKeeper unreachable, id in use, data dir of another cluster)."""


class StartCancelled(Exception):
    """Stop was asked for (SIGTERM, Ctrl-C) while the broker waited for its registration: it serves nothing."""


class ClusterNode:
    def __init__(self, broker: "Broker") -> None:
        config = broker.config
        self.broker = broker
        self.config = config
        self.broker_id = config.broker_id
        self.broker_epoch = -1
        self.controller_epoch = -1  # the newest controller epoch this broker has seen
        self.inter_broker_listener = broker.inter_broker.listener  # Kafka's rule (config.inter_broker_listener_name)
        self.security = broker.inter_broker.security  # TLS / SASL of every connection to another broker
        self.zk = KafkaZkClient(
            config.zookeeper_connect,
            session_timeout_ms=int(config.get("zookeeper.session.timeout.ms")),
            connection_timeout_ms=config.get("zookeeper.connection.timeout.ms"),
        )
        self.metadata = ZkMetadata(self.zk, self.broker_id, "", inter_broker_listener=self.inter_broker_listener)
        self.controller = Controller(self.zk, self.broker_id, config, listener_name=self.inter_broker_listener,
                                     security=self.security)
        replicas = broker.replicas
        self.fetchers = ReplicaFetcherManager(
            self.broker_id, replicas, self.metadata.address_of, self._topic_id_of, config,
            broker_epoch=lambda: self.broker_epoch, security=self.security,
        )
        self.alter_partition = AlterPartitionManager(
            self.broker_id, lambda: self.broker_epoch, lambda: self.metadata.controller_id,
            self.metadata.address_of, self._topic_id_of, security=self.security,
        )
        replicas.alter_partition = self.alter_partition
        # Replication throttles (reassignments): the leader's on follower fetches, the follower's on its own.
        replicas.leader_quota, self.fetchers.quota = quotas_for(broker, self.metadata.topic_configs)
        replicas.is_alive = self.metadata.is_alive
        self.on_leadership_change: list[LeadershipListener] = []
        self._topic_ids: dict[str, uuid.UUID] = {}
        self._endpoints: list[Endpoint] = []
        self._reregistering: asyncio.Task | None = None
        self._stopping = False

    def _topic_id_of(self, topic: str) -> uuid.UUID | None:
        """From LeaderAndIsr (which comes before the UpdateMetadata that shows a new topic), else the cache."""
        return self._topic_ids.get(topic) or self.metadata.topic_id_of(topic)

    # -- start and stop ---------------------------------------------------------------------------
    async def connect(self, stored_cluster_id: str | None) -> str:
        """Connect to ZooKeeper and agree on the cluster id (before the logs are served)."""
        try:
            await self.zk.start()
        except Exception as exc:  # kazoo's timeout or a refused connection
            raise ClusterStartError(f"cannot connect to ZooKeeper at {self.zk.connect_string}: {exc!r}") from None
        # As Kafka's getOrGenerateClusterId: a new cluster gets a new id, never the one a data dir brings
        # (a mistyped chroot must not quietly become a new cluster holding old data).
        cluster_id = await self.zk.get_or_create_cluster_id()
        if stored_cluster_id is not None and stored_cluster_id != cluster_id:
            await self.zk.close()
            raise ClusterStartError(
                f"The Cluster ID {cluster_id} doesn't match stored clusterId Some({stored_cluster_id}) in "
                f"meta.properties. The broker is trying to join the wrong cluster. Configured zookeeper.connect "
                f"may be wrong."
            )
        self.metadata.cluster_id = cluster_id
        return cluster_id

    async def start(self, endpoints: list[Endpoint], stop: asyncio.Event | None = None) -> None:
        """Register this broker (its listeners are bound; the broker accepts connections once this returns, as
        Kafka enables request processing after registering) and run for controller. StartCancelled when
        ``stop`` is set while the registration waits for an earlier session to expire."""
        self._endpoints = endpoints
        try:
            await self.metadata.start()
        except MetadataStartError as exc:
            raise ClusterStartError(str(exc)) from None
        self.zk.add_session_listener(self._on_session_event)
        self.broker_epoch = await self._register_first_time(endpoints, stop)
        log.info("broker %d registered in ZooKeeper with broker epoch %d", self.broker_id, self.broker_epoch)
        await self.controller.start()

    async def _register_first_time(self, endpoints: list[Endpoint], stop: asyncio.Event | None = None) -> int:
        """Register; if the id is still held by the session of this broker's previous process (killed, so its
        session lives until it times out), wait for that session to expire instead of failing as Kafka
        does: a broker restarted right after a crash rejoins on its own. Another live broker with the same
        id keeps it: after that wait, start fails with Kafka's message. ``stop`` set meanwhile (SIGTERM,
        Ctrl-C) ends the wait: StartCancelled."""
        deadline = asyncio.get_running_loop().time() + self.zk.session_timeout_ms / 1000 * 1.5 + 1.0
        announced = False
        while True:
            try:
                return await self.zk.register_broker(self.broker_id, endpoints, self.config.get("broker.rack"))
            except BrokerIdInUse as exc:
                if asyncio.get_running_loop().time() > deadline:
                    raise ClusterStartError(str(exc)) from None
                if not announced:
                    log.info("broker id %d is still registered by an earlier ZooKeeper session (a previous process "
                             "of this broker?): waiting up to %.0f s for it to expire", self.broker_id,
                             self.zk.session_timeout_ms / 1000 * 1.5)
                    announced = True
                if stop is None:
                    await asyncio.sleep(0.25)
                    continue
                try:
                    await asyncio.wait_for(stop.wait(), 0.25)
                except asyncio.TimeoutError:
                    continue
                raise StartCancelled(f"stopped while broker id {self.broker_id} waited for its registration")

    def _on_session_event(self, event: str) -> None:
        if event == SessionEvent.RECONNECTED and not self._stopping and self._reregistering is None:
            self._reregistering = asyncio.ensure_future(self._register_again())

    async def _register_again(self) -> None:
        """Kafka's SessionExpirationHandler: a new session means a new registration (and broker epoch)."""
        try:
            while not self._stopping:
                try:
                    self.broker_epoch = await self.zk.register_broker(
                        self.broker_id, self._endpoints, self.config.get("broker.rack"))
                    log.info("broker %d registered again after its ZooKeeper session expired, broker epoch %d",
                             self.broker_id, self.broker_epoch)
                    return
                except Exception as exc:  # ZooKeeper lost again, or the old session's ephemeral lingers a moment
                    log.warning("broker %d: registering again failed (%r); retrying", self.broker_id, exc)
                    await asyncio.sleep(1.0)
        finally:
            self._reregistering = None

    async def stop(self, *, controlled: bool) -> None:
        """Leave the cluster: controlled shutdown first (if asked and enabled), then stop every part."""
        self._stopping = True
        if controlled and self.config.get("controlled.shutdown.enable") and self.broker_epoch >= 0:
            await self._controlled_shutdown()
        await self.fetchers.close()
        await self.alter_partition.close()
        await self.controller.stop()
        await self.metadata.close()
        if self._reregistering is not None:
            self._reregistering.cancel()
            await asyncio.gather(self._reregistering, return_exceptions=True)
        await self.zk.close()

    async def _controlled_shutdown(self) -> None:
        """Ask the controller to move this broker's leaderships away (Kafka's KafkaServer.controlledShutdown)."""
        request_type = load_request_schema(7, CONTROLLED_SHUTDOWN_VERSION)
        retries = int(self.config.get("controlled.shutdown.max.retries"))
        backoff_s = int(self.config.get("controlled.shutdown.retry.backoff.ms")) / 1000
        timeout_s = int(self.config.get("controller.socket.timeout.ms")) / 1000
        clients = NodeClients(self.broker_id, negotiate_versions=False, request_timeout=timeout_s,
                              security=self.security)
        try:
            for attempt in range(1, retries + 1):
                controller = self.metadata.controller_id
                address = self.metadata.address_of(controller) if controller is not None and controller >= 0 else None
                if address is not None:
                    clients.set_address(controller, *address)
                    try:
                        response = await clients.send(controller, request_type(
                            broker_id=self.broker_id, broker_epoch=self.broker_epoch))
                        if response.error_code == ErrorCode.none and not response.remaining_partitions:
                            log.info("controlled shutdown of broker %d succeeded", self.broker_id)
                            return
                        log.info("controlled shutdown of broker %d: %s, %d partition(s) still led here",
                                 self.broker_id, ErrorCode(response.error_code).name,
                                 len(response.remaining_partitions))
                    except ClientError as exc:
                        log.info("controlled shutdown of broker %d: controller %s unreachable (%s)",
                                 self.broker_id, controller, exc)
                if attempt < retries:
                    await asyncio.sleep(backoff_s)
            log.warning("controlled shutdown of broker %d did not complete after %d attempt(s); stopping anyway",
                        self.broker_id, retries)
        finally:
            await clients.close()

    # -- fencing ----------------------------------------------------------------------------------
    def _fence(self, request) -> ErrorCode | None:
        """STALE_CONTROLLER_EPOCH / STALE_BROKER_EPOCH for a request the current controller did not send to
        this incarnation of the broker; None when it may be applied (the epoch is then remembered)."""
        if request.controller_epoch < self.controller_epoch:
            log.info("broker %d: ignoring a request of controller %d with stale controller epoch %d (current %d)",
                     self.broker_id, request.controller_id, request.controller_epoch, self.controller_epoch)
            return ErrorCode.stale_controller_epoch
        if request.broker_epoch != -1 and request.broker_epoch < self.broker_epoch:
            log.info("broker %d: ignoring a controller request for broker epoch %d (current %d)",
                     self.broker_id, request.broker_epoch, self.broker_epoch)
            return ErrorCode.stale_broker_epoch
        self.controller_epoch = request.controller_epoch
        return None

    # -- UpdateMetadata ---------------------------------------------------------------------------
    # Each handle_* takes the request entity and the module of its response version's entities.
    def handle_update_metadata(self, request, schema):
        error = self._fence(request)
        if error is not None:
            return schema.UpdateMetadataResponse(error_code=error)
        self.metadata.apply_update_metadata(request)
        return schema.UpdateMetadataResponse(error_code=ErrorCode.none)

    # -- LeaderAndIsr -----------------------------------------------------------------------------
    async def handle_leader_and_isr(self, request, schema):
        """Kafka's ReplicaManager.becomeLeaderOrFollower: leaders stop fetching and start serving; followers
        start fetching from their leader (truncating what diverges); one error per partition. A new
        topic's config overrides are read from ZooKeeper first, so its log is created with them."""
        error = self._fence(request)
        if error is not None:
            return schema.LeaderAndIsrResponse(error_code=error, topics=())
        for topic_state in request.topic_states:
            if topic_state.topic_id is not None and topic_state.topic_id.int != 0:
                self._topic_ids[topic_state.topic_name] = topic_state.topic_id
            if self.metadata.topic_configs(topic_state.topic_name) is None:
                await self.metadata.load_topic_config(topic_state.topic_name)
        if self._fence(request) is not None:  # a newer controller spoke while the configs were read
            return schema.LeaderAndIsrResponse(error_code=ErrorCode.stale_controller_epoch, topics=())
        replicas = self.broker.replicas
        topics = []
        follow: dict[tuple[str, int], int] = {}
        changes: list[tuple[str, int, bool]] = []
        for topic_state in request.topic_states:
            name = topic_state.topic_name
            errors = []
            for state in topic_state.partition_states:
                index = state.partition_index
                partition = replicas.partition(name, index)
                mismatch = self._topic_id_mismatch(name, index, topic_state.topic_id)
                if mismatch:
                    errors.append((index, ErrorCode.inconsistent_topic_id))
                    continue
                was_leader = partition is not None and partition.is_leader
                if state.leader == self.broker_id:
                    if partition is None or state.leader_epoch > partition.leader_epoch:
                        self.fetchers.remove_partitions([(name, index)])  # before the role changes (a newer epoch)
                    code = replicas.become_leader(name, index, state.leader_epoch, state.isr, state.replicas,
                                                  state.partition_epoch, topic_id=topic_state.topic_id)
                    if code == ErrorCode.none:
                        changes.append((name, index, True))
                else:
                    code = replicas.become_follower(name, index, state.leader, state.leader_epoch, state.isr,
                                                    state.replicas, state.partition_epoch, topic_id=topic_state.topic_id)
                    if code == ErrorCode.none:
                        # The fetch from the old leader stops now; the new one starts below, after every state.
                        self.fetchers.remove_partitions([(name, index)])
                        if state.leader >= 0:
                            follow[(name, index)] = state.leader
                        if was_leader or partition is None:
                            changes.append((name, index, False))
                errors.append((index, code))
                if partition is None:
                    # Opening a partition replays its log for the producer state: let other requests run
                    # between partitions (a restart's first LeaderAndIsr names all of them).
                    await asyncio.sleep(0)
            topics.append(schema.LeaderAndIsrTopicError(
                topic_id=topic_state.topic_id,
                partition_errors=tuple(schema.LeaderAndIsrPartitionError(partition_index=i, error_code=e)
                                       for i, e in errors)))
        if follow:
            self.fetchers.add_partitions(follow)
        for name, index, is_leader in changes:
            for listener in self.on_leadership_change:
                listener(name, index, is_leader)
        return schema.LeaderAndIsrResponse(error_code=ErrorCode.none, topics=tuple(topics))

    def _topic_id_mismatch(self, topic: str, index: int, topic_id: uuid.UUID | None) -> bool:
        """A log that carries another topic id than the controller's (a topic deleted and re-created while
        this broker was away): Kafka answers INCONSISTENT_TOPIC_ID and leaves the log alone."""
        if topic_id is None or topic_id.int == 0:
            return False
        partition_log = self.broker.log_manager.get(topic, index)
        stored = getattr(partition_log, "topic_id", None) if partition_log is not None else None
        return stored is not None and stored != topic_id

    # -- StopReplica ------------------------------------------------------------------------------
    def handle_stop_replica(self, request, schema):
        """Kafka's ReplicaManager.stopReplicas: stop fetching and serving; delete the log when asked."""
        error = self._fence(request)
        if error is not None:
            return schema.StopReplicaResponse(error_code=error, partition_errors=())
        replicas = self.broker.replicas
        results = []
        stopped: list[tuple[str, int]] = []
        for topic_state in request.topic_states:
            name = topic_state.topic_name
            for state in topic_state.partition_states:
                index = state.partition_index
                partition = replicas.partition(name, index)
                epoch = state.leader_epoch
                if (partition is not None and epoch not in (NO_LEADER, EPOCH_DURING_DELETE)
                        and epoch < partition.leader_epoch):
                    results.append((name, index, ErrorCode.fenced_leader_epoch))
                    continue
                stopped.append((name, index))
                self.fetchers.remove_partitions([(name, index)])
                results.append((name, index, replicas.stop_replica(name, index, delete=state.delete_partition)))
        for name, index in stopped:
            for listener in self.on_leadership_change:
                listener(name, index, False)
        # Kafka's GroupCoordinator.onPartitionsDeleted: committed offsets of a deleted topic go with it (a deleted
        # topic's StopReplica carries EPOCH_DURING_DELETE; a replica a reassignment removes, the current epoch).
        for name in {topic_state.topic_name for topic_state in request.topic_states
                     if any(state.delete_partition and state.leader_epoch == EPOCH_DURING_DELETE
                            for state in topic_state.partition_states)}:
            self.broker.forget_topic(name)
            self._topic_ids.pop(name, None)
        return schema.StopReplicaResponse(error_code=ErrorCode.none, partition_errors=tuple(
            schema.StopReplicaPartitionError(topic_name=name, partition_index=index, error_code=code)
            for name, index, code in results))

"""The composition root: builds the broker's parts from a BrokerConfig, serves, and shuts down cleanly.

Start-up order: every listener's port is bound first (so a port in use or an unresolvable host fails
before anything is written into a fresh data dir), then the data dir is created and locked with its
``.lock`` file as Kafka does (by the log manager, built first; a second broker on the same dir is
refused), then logs are loaded (and recovered) before anything is hosted, producer state is rebuilt from
the logs, the group coordinator is told it leads every __consumer_offsets partition (it loads committed
offsets and groups in the background, answering COORDINATOR_LOAD_IN_PROGRESS meanwhile), and the listeners
accept connections. Each of those start-up failures is a
StartupError whose message names the thing (the CLI prints it as one line and exits 1).

Each listener is one server socket; a connection knows the listener it arrived on, and Metadata,
DescribeCluster and FindCoordinator answer with that listener's advertised endpoints (``brokers_on``).

SSL listeners: one TlsContextHolder per SSL listener is built before the data dir is opened, from that
listener's view of Kafka's ``ssl.*`` settings (``listener.name.<listener>.ssl.*`` wins); a bad setting is a
StartupError. An accepted socket on an SSL listener gets its TLS handshake in a task of its own (the accept
loop goes straight back to accepting), bounded by ``TLS_HANDSHAKE_TIMEOUT_S`` or ``connections.max.idle.ms``
when that is shorter (Kafka has no handshake timeout of its own: its idle expiry closes a channel stuck in its
handshake after connections.max.idle.ms, 10 minutes by default, which is too long to hold a socket for a peer
that never speaks TLS). A handshake that fails or times out (a plaintext client, garbage bytes, a missing or
untrusted client certificate under ``ssl.client.auth=required``) costs that socket only, with one log line.
Handshakes in progress count towards ``max.connections`` and ``max.connections.per.ip`` (Kafka counts a
connection from its accept, before any handshake).

Shutdown stops accepting, closes connections, flushes every log, writes the clean-shutdown marker and
releases the data dir lock (the log manager's shutdown).

Connection bookkeeping lives here too. Each listener is served by an accept loop of our own
(``loop.sock_accept`` then ``loop.connect_accepted_socket``, both public asyncio API that uvloop also
implements; asyncio's Server has no way to pause accepting): while ``max.connections`` connections are
open, it stops accepting, as Kafka's Acceptor does since KIP-402, so new connections wait in the listen
backlog until a connection closes instead of being accepted and closed. A new connection beyond
``max.connections.per.ip`` is accepted and closed with a log line, as in Kafka. An idle sweep aborts
connections with no socket activity for ``connections.max.idle.ms`` (unsent bytes are dropped, so a client
that never reads is closed too). Request bytes of all connections share one ``queued.max.request.bytes``
bound (see server/connection.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import functools
import logging
import shlex
import signal
import socket
import ssl
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Coroutine, TypeVar

from pykbroker import __version__
from pykbroker.cluster.dynamic_configs import DynamicConfigs
from pykbroker.cluster.metadata import BrokerEndpoint, ClusterMetadata, EmbeddedMetadata
from pykbroker.cluster.producer_ids import ProducerIdAllocator, ProducerRegistry, ZkProducerIdAllocator
from pykbroker.cluster.topic_admin import TopicAdmin
from pykbroker.config import BrokerConfig, ConfigError, Listener, controller_listener_names
from pykbroker.groups.classic.coordinator import GroupConfig, GroupCoordinator
from pykbroker.groups.configs import GroupConfigs
from pykbroker.groups.consumer.coordinator import ConsumerGroupConfig, ConsumerGroupCoordinator
from pykbroker.groups.offset_store import OffsetStore
from pykbroker.log.cleaner import CleanerConfig
from pykbroker.log.errors import LogDirectoryInUse
from pykbroker.log.files import raise_descriptor_limit
from pykbroker.log.manager import LOCK_FILE, LogManager
from pykbroker.metrics.stats import BrokerStats
from pykbroker.protocol import records
from pykbroker.protocol.apis import apis_for
from pykbroker.replication.replica_manager import ReplicaManager
from pykbroker.security import client_entities
from pykbroker.security.authorizer import AUTHORIZER_CLASS_NAMES, AclAuthorizer
from pykbroker.security.credentials import ScramCredentialCache
from pykbroker.security.quotas import ClientQuotas
from pykbroker.security.sasl.authenticator import SaslListener
from pykbroker.server.connection import KafkaConnection, RequestMemory
from pykbroker.server.dispatch import load_handlers
from pykbroker.server.throttling import with_client_quotas
from pykbroker.txn.coordinator import TransactionCoordinator, TxnConfig
from pykbroker.txn.log import TRANSACTION_STATE_TOPIC
from pykbroker.txn.state_manager import TransactionStateManager
from pykbroker.txn.verification import TransactionVerifier

if TYPE_CHECKING:
    from pykbroker.cluster.node import ClusterNode
    from pykbroker.metrics.http import MetricsServer
    from pykbroker.security.inter_broker import InterBrokerClient
    from pykbroker.security.tls import TlsContextHolder

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
VERIFICATION_CONFIG = "transaction.partition.verification.enable"
T = TypeVar("T")
LISTEN_BACKLOG = 100


def speedups_missing_message() -> str:
    """The warning of a broker whose C record walker is missing, with the way to build it for the very
    package that was imported: a source checkout (setup.py beside the package) builds it in place; an
    installed package is reinstalled where a C compiler is present."""
    package = Path(records.__file__).resolve().parents[1]
    checkout = package.parent
    python = shlex.quote(sys.executable)  # the Python that runs this broker, whose extension is missing
    # The extension is optional: without a C compiler and the Python headers a build "succeeds" without it.
    needs = "a C compiler and the Python headers (e.g. apt-get install gcc python3-dev)"
    if (checkout / "setup.py").is_file():
        fix = (f"build it for this source tree, with {needs} present: cd {shlex.quote(str(checkout))} && "
               f"{python} setup.py build_ext --inplace")
    else:
        fix = (f"reinstall pykbroker where {needs} are present: {python} -m pip install --force-reinstall "
               f"--no-deps <the source you installed from>")
    return (f"the C record walker (pykbroker._speedups) is not built for {package / '__init__.py'}: records are "
            f"validated in pure Python, several times slower; {fix}")


# The longest a TLS handshake may take on an SSL listener (see the module docstring).
TLS_HANDSHAKE_TIMEOUT_S = 10.0


class StartupError(Exception):
    """The broker cannot start; the message names what is wrong (a port, a host, the data dir)."""


def bind_listener(listener: Listener) -> socket.socket:
    """A listening socket for ``listener``. An empty host binds every interface (IPv6 and IPv4 where the
    machine has both), a host name binds the first address it resolves to, as Kafka does."""
    try:
        if listener.host == "":
            dual = socket.has_dualstack_ipv6()
            family, address = (socket.AF_INET6, ("::", listener.port)) if dual else (socket.AF_INET, ("0.0.0.0", listener.port))
        else:
            dual = False
            info = socket.getaddrinfo(listener.host, listener.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
            family, address = info[0], info[4]
    except socket.gaierror as exc:
        raise StartupError(f"cannot resolve host {listener.host!r} of listener {listener}: {exc.strerror}") from None
    try:
        return socket.create_server(address, family=family, backlog=LISTEN_BACKLOG, dualstack_ipv6=dual)
    except OSError as exc:
        reason = "the port is in use by another process" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise StartupError(f"cannot listen on {listener}: {reason}") from None


def make_authorizer(config: BrokerConfig) -> AclAuthorizer | None:
    """The ACL authorizer ``authorizer.class.name`` asks for (Kafka's AclAuthorizer or StandardAuthorizer:
    both give Kafka's ZooKeeper-mode ACL semantics here), None when it is empty; StartupError for another
    class or a bad ``super.users`` / ``allow.everyone.if.no.acl.found``."""
    class_name = (config.get("authorizer.class.name") or "").strip()
    if not class_name:
        return None
    if class_name not in AUTHORIZER_CLASS_NAMES:
        raise StartupError(f"authorizer.class.name={class_name}: pykbroker's authorizer serves "
                           f"{' or '.join(sorted(AUTHORIZER_CLASS_NAMES))} (Kafka's ACL semantics), no other class")
    try:
        authorizer = AclAuthorizer.from_config(config.values)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    from pykbroker.security.inter_broker import inter_broker_principal

    principal, listener, protocol = inter_broker_principal(config)
    if principal is not None and not authorizer.is_super_user(principal):
        # Brokers reach each other (and a single broker itself: transaction markers) on the inter-broker
        # listener as this principal; Kafka needs the brokers' principal in super.users (or CLUSTER_ACTION ACLs).
        log.warning("authorizer on and %s is not in super.users: brokers' requests to each other (and a broker's "
                    "transaction markers to itself) come from %s over %s (%s) and need CLUSTER_ACTION; add it to "
                    "super.users (or allow it CLUSTER_ACTION), as Kafka requires of the brokers' principal",
                    principal, principal, listener, protocol)
    return authorizer


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        authorizer = make_authorizer(config)  # before the data dir is opened: a bad setting writes nothing
        self.broker_id = config.broker_id
        data_dir = Path(config.data_dir)
        self.data_dir = data_dir
        # The log manager first: it takes the data dir's lock before anything else writes there.
        self.log_manager = LogManager(
            data_dir,
            fsync=config.fsync,
            flush_interval_ms=int(config.get("log.flush.interval.ms") or 1000),
            retention_check_interval_ms=int(config.get("log.retention.check.interval.ms")),
            cleaner=CleanerConfig.from_broker(config.get),
        )
        self.replicas = ReplicaManager(
            self.log_manager, config.broker_id, lambda topic: self.topics.log_config(topic),
            replica_lag_time_max_ms=int(config.get("replica.lag.time.max.ms")),
        )
        # How this broker's own client reaches brokers (itself too, for transaction markers): the inter-broker
        # listener's security (TLS, SASL), for every NodeClients pool (security/inter_broker.py).
        self.inter_broker = inter_broker_client(config)
        self.cluster: ClusterNode | None = None  # the ZooKeeper cluster's parts, in cluster mode only
        if config.zookeeper_connect:
            from pykbroker.cluster import node  # kazoo and the controller: cluster mode only

            self.cluster = node.ClusterNode(self)
            self.metadata: ClusterMetadata = self.cluster.metadata
        else:
            self.metadata = EmbeddedMetadata(data_dir, config.broker_id, config.advertised_host, config.advertised_port)
        self.apis = apis_for(cluster=self.cluster is not None)  # what ApiVersions advertises and we serve
        # The broker configs with their dynamic layers (AlterConfigs): value(name), add_listener(callback).
        self.dynamic_configs = DynamicConfigs(config, self.metadata)
        self.dynamic_configs.add_listener(self._cleaner_configs_changed)
        if self.cluster is not None:  # the controller reads unclean.leader.election.enable's dynamic value
            self.cluster.controller.dynamic_configs = self.dynamic_configs
        self.topics = TopicAdmin(config, self.metadata, self.replicas, self.dynamic_configs)
        if self.cluster is not None:  # blocks of ids reserved in ZooKeeper: unique across the cluster
            self.producer_ids = ProducerRegistry(ZkProducerIdAllocator(self.cluster.zk, config.broker_id))
        else:
            self.producer_ids = ProducerRegistry(ProducerIdAllocator(data_dir / "producer-id-block"))
        self.offsets_partitions = int(config.get("offsets.topic.num.partitions"))
        offsets_info = self.metadata.topic(OFFSETS_TOPIC)
        self.offset_store = OffsetStore(
            self.replicas, len(offsets_info.partitions) if offsets_info is not None else self.offsets_partitions,
            min_insync_replicas=lambda: self.topics.min_insync_replicas(OFFSETS_TOPIC),
            commit_timeout_ms=int(config.get("offsets.commit.timeout.ms")),
        )
        self._internal_creations: dict[str, asyncio.Task] = {}  # internal topics being created (create_internal_topic)
        self.groups = GroupCoordinator(
            self.offset_store, self._partition_exists,
            GroupConfig.from_broker_config(config),
            lead_offsets_topic=self._lead_offsets_topic_now if self.cluster is None else None,
        )
        # The consumer groups of the new protocol (KIP-848) beside the classic ones: same partitions, same offsets.
        try:
            consumer_group_config = ConsumerGroupConfig.from_broker_config(config)
        except ValueError as exc:  # Kafka's GroupCoordinatorConfig checks: refused at start
            raise StartupError(str(exc)) from None
        self.consumer_groups = ConsumerGroupCoordinator(self.groups, self.metadata.topics, consumer_group_config,
                                                        topics_version=lambda: self.metadata.topics_version)
        self.groups.consumer_groups = self.consumer_groups
        # Per-group overrides of the consumer group configs (the GROUP config resource), followed from the metadata.
        self.group_configs = GroupConfigs(self.consumer_groups.config, self.metadata)
        self.consumer_groups.group_configs = self.group_configs
        if self.cluster is not None:  # the coordinator follows the offsets partitions' leadership
            self.cluster.on_leadership_change.append(self.groups.on_leadership_change)
            self.cluster.on_leadership_change.append(self.consumer_groups.on_leadership_change)
        # The transaction coordinator (pykbroker/txn): the __transaction_state partitions led here.
        self.transaction_partitions = int(config.get("transaction.state.log.num.partitions"))
        txn_info = self.metadata.topic(TRANSACTION_STATE_TOPIC)
        self.txn_state = TransactionStateManager(
            self.replicas, len(txn_info.partitions) if txn_info is not None else self.transaction_partitions,
            min_insync_replicas=lambda: self.topics.min_insync_replicas(TRANSACTION_STATE_TOPIC),
        )
        self.transactions = TransactionCoordinator(self.txn_state, self.producer_ids.new_id, self._txn_leader_epoch,
                                                   TxnConfig.from_broker_config(config))
        self.transactions.make_marker_sender(config.broker_id, leader_of=self._leader_of, address_of=self._address_of,
                                             security=self.inter_broker.security)
        # KIP-890 partition verification of transactional produces (pykbroker/txn/verification.py); None: off.
        # A dynamic broker config, as in Kafka: _verification_config_changed switches it on and off live.
        self._verifier = TransactionVerifier(config.broker_id, coordinator_of=self._txn_coordinator_of,
                                             local=self.transactions, send=self.transactions.markers.send)
        self.txn_verifier: TransactionVerifier | None = None
        self._verification_config_changed({VERIFICATION_CONFIG})
        self.dynamic_configs.add_listener(self._verification_config_changed)
        if self.cluster is not None:
            self.cluster.on_leadership_change.append(self.transactions.on_leadership_change)
        # Security (pykbroker/security): SCRAM credentials the SASL listeners check (fed from the journal or
        # ZooKeeper's /config/users), the client quotas every request is measured against (fed from the
        # users/clients entity configs), and the ACL authorizer, None unless authorizer.class.name names one.
        self.scram_credentials = ScramCredentialCache()
        self.quotas = ClientQuotas.from_config(config.get)
        self.authorizer: AclAuthorizer | None = authorizer
        self.acl_store = None  # where the authorizer's ACLs live (cluster/acls.py), with an authorizer only
        if authorizer is not None:
            from pykbroker.cluster.acls import EmbeddedAclStore, ZkAclStore

            self.acl_store = (EmbeddedAclStore(self.metadata, authorizer.cache) if self.cluster is None
                              else ZkAclStore(self.cluster.zk, authorizer.cache))
        client_entities.follow(self.metadata, self.scram_credentials, self.quotas)
        self.connections: set[KafkaConnection] = set()
        self._connections_per_host: Counter[str] = Counter()
        self.request_memory = RequestMemory(int(config.get("queued.max.request.bytes")))
        self.handlers = with_client_quotas(load_handlers())  # client quotas on the request path (throttling.py)
        self._acceptors: list[asyncio.Task] = []  # one accept loop per listener
        self._handshakes: dict[asyncio.Task, str] = {}  # TLS handshakes in progress (SSL listeners) -> peer host
        self._handshaking_per_host: Counter[str] = Counter()
        self.tls: dict[str, TlsContextHolder] | None = None  # SSL listener name -> its TLS context (tls_holders)
        self.sasl: dict[str, SaslListener] | None = None  # SASL listener name -> its mechanisms (sasl_listeners)
        self._slot_freed = asyncio.Event()  # set when a connection closes: an acceptor at max.connections goes on
        self.advertised: dict[str, BrokerEndpoint] = {}  # listener name -> this broker's endpoint there
        self._background: list[asyncio.Task] = []
        self._self_address: tuple | None = None  # where this broker reaches itself (see _address_of)
        self._owned: set[asyncio.Task] = set()  # work a request started that must finish (see run_owned)
        # Metrics (pykbroker/metrics): counters while metrics.port is set; the endpoint's readiness flags.
        self.stats: BrokerStats | None = BrokerStats() if config.get("metrics.port") else None
        self.metrics_server: MetricsServer | None = None
        self.serving = False  # the listeners accept clients
        self.stopping = False

    # -- start ------------------------------------------------------------------------------------
    def load(self) -> None:
        if self.cluster is not None:
            # Every log is loaded; which ones this broker leads or follows, the controller says (LeaderAndIsr).
            self.log_manager.load_all(self.topics.log_config)
            self.replicas.load_high_watermarks()
            return
        self.log_manager.load_all(self.topics.log_config, self.topics.topic_id_of)
        self.replicas.load_high_watermarks()  # a corrupt replication-offset-checkpoint stops the start here
        self.topics.host_all()

    def _verification_config_changed(self, names: set[str]) -> None:
        if VERIFICATION_CONFIG in names:
            self.txn_verifier = self._verifier if self.dynamic_configs.value(VERIFICATION_CONFIG) else None

    def _cleaner_configs_changed(self, names: set[str]) -> None:
        """Dynamic log.cleaner.* settings: the cleaner restarts its loops and workers with them."""
        if any(name.startswith("log.cleaner.") for name in names):
            self.log_manager.cleaner.reconfigure(CleanerConfig.from_broker(self.dynamic_configs.value))

    def _partition_exists(self, topic: str, index: int) -> bool:
        """Whether offsets may be committed for a partition: it exists in the cluster (Kafka asks its metadata
        cache), wherever its replicas are; a group's coordinator need not host it."""
        info = self.metadata.topic(topic)
        return info is not None and 0 <= index < len(info.partitions)

    def _lead_offsets_partitions(self) -> None:
        """Single broker: this broker leads every __consumer_offsets and __transaction_state partition; the
        coordinators load them. (In a cluster, LeaderAndIsr says which ones: cluster/node.py tells them.)"""
        if self.cluster is not None:
            return
        for topic, coordinator in ((OFFSETS_TOPIC, self.groups), (TRANSACTION_STATE_TOPIC, self.transactions)):
            info = self.metadata.topic(topic)
            for index in range(len(info.partitions) if info is not None else 0):
                coordinator.on_leadership_change(topic, index, True)

    def _lead_offsets_topic_now(self) -> None:
        """Single broker: a group request came before any FindCoordinator: create __consumer_offsets at once."""
        self.topics.ensure_internal(OFFSETS_TOPIC, self.offsets_partitions)
        self._lead_offsets_partitions()

    def _transaction_topic_configs(self, replication_factor: int) -> dict[str, str]:
        """Kafka's TransactionLog.transactionTopicConfigs (min.insync.replicas capped at the replication
        factor, so that a topic with fewer replicas than transaction.state.log.min.isr still takes writes)."""
        return {
            "cleanup.policy": "compact",
            "min.insync.replicas": str(min(int(self.config.get("transaction.state.log.min.isr")), replication_factor)),
            "segment.bytes": str(self.config.get("transaction.state.log.segment.bytes")),
            "unclean.leader.election.enable": "false",
            "compression.type": "uncompressed",
        }

    async def create_internal_topic(self, name: str) -> None:
        """Create __consumer_offsets or __transaction_state (FindCoordinator's first use, as in Kafka): 50
        partitions by default, a few fsyncs each, hosted one at a time in a broker-owned task so other clients
        are served meanwhile; the requests that asked wait for it."""
        if name not in self._internal_creations:
            self._internal_creations[name] = self.run_owned(self._create_internal_topic(name))
        await asyncio.shield(self._internal_creations[name])

    async def create_offsets_topic(self) -> None:
        await self.create_internal_topic(OFFSETS_TOPIC)

    async def _create_internal_topic(self, name: str) -> None:
        try:
            if name == TRANSACTION_STATE_TOPIC:
                rf = self.topics.internal_replication_factor("transaction.state.log.replication.factor")
                await self.topics.ensure_internal_async(name, self.transaction_partitions, rf,
                                                        configs=self._transaction_topic_configs(rf))
            else:
                await self.topics.ensure_internal_async(OFFSETS_TOPIC, self.offsets_partitions)
            self._lead_offsets_partitions()
        finally:
            self._internal_creations.pop(name, None)

    def _txn_leader_epoch(self, index: int) -> int | None:
        """The coordinator epoch of a __transaction_state partition: its leader epoch, if led here."""
        partition = self.replicas.partition(TRANSACTION_STATE_TOPIC, index)
        return partition.leader_epoch if partition is not None and partition.is_leader else None

    def _txn_coordinator_of(self, transactional_id: str) -> int | None:
        """The broker leading the id's __transaction_state partition (None: no such topic or no leader)."""
        leader = self._leader_of(TRANSACTION_STATE_TOPIC, self.txn_state.partition_for(transactional_id))
        return None if leader is None or leader < 0 else leader

    def _leader_of(self, topic: str, index: int) -> int | None:
        """The partition's leader from the metadata cache (for the marker sender): None for a partition the
        cache does not have (a deleted topic), -1 for one without a leader just now."""
        info = self.metadata.topic(topic)
        if info is None or not 0 <= index < len(info.partitions):
            return None
        if self.cluster is None:
            return self.broker_id
        leader = self.cluster.metadata.leader_of(topic, index)
        return -1 if leader is None else leader

    def _address_of(self, broker_id: int) -> tuple | None:
        """Where the marker sender reaches a broker: its inter-broker listener; the single node reaches itself
        on the address its inter-broker listener is bound to (the loopback for a wildcard), which works
        whatever it advertises (a container's published name may not resolve inside it), checking a TLS
        certificate against the advertised host: (host, port, advertised host)."""
        if self.cluster is not None:
            return self.cluster.metadata.address_of(broker_id)
        return self._self_address if broker_id == self.broker_id else None

    def run_owned(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``work`` in a task the broker owns: it finishes even if the request that started it is
        cancelled (its client went away), and ``stop`` waits for it. Await it through ``asyncio.shield``."""
        task = asyncio.ensure_future(work)
        self._owned.add(task)
        task.add_done_callback(self._owned_done)
        return task

    def _owned_done(self, task: asyncio.Task) -> None:
        self._owned.discard(task)
        if not task.cancelled() and task.exception() is not None:  # retrieved, so never "never retrieved"
            log.warning("broker-owned task failed: %r", task.exception())

    def forget_topic(self, name: str) -> None:
        """After a topic is deleted: drop the committed offsets that named it and its metrics."""
        self.offset_store.delete_topic(name)
        if self.stats is not None:
            self.stats.forget_topic(name)

    async def start(self, listening: list[tuple[Listener, socket.socket]], stop: asyncio.Event | None = None) -> None:
        """Load the logs, then serve every listener on its bound socket (see bind_listener). A cluster
        broker whose ``stop`` is set while it waits for its registration returns without serving
        (``serving`` stays False); ``stop()`` then ends it cleanly."""
        raise_descriptor_limit()
        log.info("pykbroker %s from %s (C record walker: %s)", __version__, Path(records.__file__).resolve().parents[1],
                 "built" if records.ACCELERATED else "not built")
        if not records.ACCELERATED:
            log.warning("%s", speedups_missing_message())
        if self.cluster is not None:
            await self._join_cluster_first()
        if self.acl_store is not None:  # every ACL in the cache before the first request is served
            await self.acl_store.start()
        if self.tls is None:
            self.tls = tls_holders(self.config)
        if self.sasl is None:
            self.sasl = sasl_listeners(self.config, BrokerCredentials(self))
        self.load()
        self._lead_offsets_partitions()
        max_request = int(self.config.get("socket.request.max.bytes"))
        bound_ports = {listener.name: sock.getsockname()[1] for listener, sock in listening}
        self._reach_self(listening)
        self._watch_tls_configs()
        for advertised in self.config.advertised_listeners:
            # Port 0 means any free port: advertise the one the listener of that name got.
            self.advertised[advertised.name] = BrokerEndpoint(
                self.broker_id, advertised.host, advertised.port or bound_ports[advertised.name], self.config.get("broker.rack")
            )
        self._background.append(asyncio.ensure_future(self.log_manager.run_background()))
        self._background.append(asyncio.ensure_future(self._expire_producers()))
        self._background.append(asyncio.ensure_future(self.replicas.run_high_watermark_checkpoints(
            int(self.config.get("replica.high.watermark.checkpoint.interval.ms")))))
        self._background.append(asyncio.ensure_future(self.replicas.run_isr_checks()))
        self._background.append(asyncio.ensure_future(self.groups.run()))
        self._background.append(asyncio.ensure_future(self.transactions.run()))
        self._background.append(asyncio.ensure_future(self._close_idle_connections()))
        if self.cluster is not None:
            # Kafka's KafkaServer.startup enables request processing only after the registration: until
            # then connections wait in the listen backlog. Answering earlier would tell clients of no
            # broker and no topic (an empty metadata cache: librdkafka then drops every broker and what
            # it had in flight) and refuse the controller's first requests (no broker epoch yet).
            if not await self._register_in_cluster(stop):
                return
        for listener, sock in listening:
            holder = self.tls.get(listener.name)
            factory = functools.partial(KafkaConnection, self, self.handlers, max_request, self.request_memory,
                                        listener=listener.name, tls=holder, sasl=self.sasl.get(listener.name))
            self._acceptors.append(asyncio.ensure_future(self._accept(sock, factory, holder)))
            endpoint = self.advertised.get(listener.name)
            if listener.binds_all and endpoint is not None:
                log.info("listener %s binds every interface; advertised as %s (the canonical host name)",
                         listener, _host_port(endpoint.host, endpoint.port))
            if endpoint is None:
                log.warning("listener %s is not in advertised.listeners: clients that connect through it are told of "
                            "no brokers", listener)
        controllers = controller_listener_names(self.config.values)
        if controllers:  # config.listeners leaves them out
            log.info("KRaft controller listeners (controller.listener.names: %s) are not served: pykbroker runs as a "
                     "single node or in ZooKeeper mode", ",".join(sorted(controllers)))
        self.serving = True
        log.info(
            "pykbroker broker %d listening on %s (advertised %s), data dir %s, cluster id %s",
            self.broker_id,
            ", ".join(f"{listener.name}://{_host_port(*sock.getsockname()[:2])}" for listener, sock in listening),
            ", ".join(f"{name}://{_host_port(e.host, e.port)}" for name, e in self.advertised.items()),
            self.data_dir,
            self.metadata.cluster_id,
        )

    def _reach_self(self, listening: list[tuple[Listener, socket.socket]]) -> None:
        """The single node's marker sender reaches itself on its inter-broker listener's bound socket."""
        own = [(listener, sock) for listener, sock in listening if listener.name == self.inter_broker.listener]
        if own:
            listener, sock = own[0]
            bound_host = sock.getsockname()[0]
            if listener.binds_all:
                bound_host = "::1" if listener.host == "::" else "127.0.0.1"  # "" binds IPv4 too
            advertised = self.config.inter_broker_listener
            self._self_address = (bound_host, sock.getsockname()[1], advertised.host if advertised else None)

    def _watch_tls_configs(self) -> None:
        """Dynamic ``listener.name.<l>.ssl.*`` updates reload the listeners' TLS contexts and the inter-broker
        client's (security/tls.py ListenerTlsReloader): validated before they are stored, files changed in place
        reloaded, stored changes (this broker's or the cluster default's) applied."""
        from pykbroker.security.tls import ListenerTlsReloader

        client = self.inter_broker.tls
        if not self.tls and client is None:
            return
        protocols = {listener.name: listener.security_protocol for listener in self.config.listeners}
        reloader = ListenerTlsReloader(self.tls or {}, protocols,
                                       (self.inter_broker.listener, client) if client is not None else None)
        concerns = lambda name: "ssl." in name  # noqa: E731 - ssl.* and listener.name.<l>.ssl.*
        self.dynamic_configs.add_reconfigurable(concerns, reloader.validate, reloader.reconfigure)
        self.dynamic_configs.add_listener(lambda names: reloader.reconfigure_soon(self.dynamic_configs.config.values)
                                          if any(map(concerns, names)) else None)
        reloader.reconfigure(self.dynamic_configs.config.values)  # dynamic ones stored before this start

    async def _join_cluster_first(self) -> None:
        """Cluster mode, before the logs load: connect to ZooKeeper and agree on the cluster id."""
        from pykbroker.cluster.metadata import read_meta_properties, write_meta_properties
        from pykbroker.cluster.node import ClusterStartError

        stored = read_meta_properties(self.data_dir, self.broker_id)  # CorruptFile: one line, as on a single node
        try:
            cluster_id = await self.cluster.connect(stored_cluster_id=stored)
        except ClusterStartError as exc:
            raise StartupError(str(exc)) from None
        if stored is None:
            write_meta_properties(self.data_dir, cluster_id, self.broker_id, kraft_style=False)
        offsets = await self.cluster.zk.get_topic_assignment(OFFSETS_TOPIC)
        if offsets is not None:  # the cluster's offsets topic decides which partition holds a group
            self.offset_store.set_partition_count(len(offsets.partitions))
        transactions = await self.cluster.zk.get_topic_assignment(TRANSACTION_STATE_TOPIC)
        if transactions is not None:  # likewise for a transactional id
            self.txn_state.set_partition_count(len(transactions.partitions))

    async def _register_in_cluster(self, stop: asyncio.Event | None) -> bool:
        """Cluster mode, with the listeners bound but not accepting yet: register and run for controller.
        False when ``stop`` was set while the registration waited (see ClusterNode.start)."""
        from pykbroker.cluster.node import ClusterStartError, StartCancelled

        # The advertised listeners, with the port each one got where it asked for any free port (0).
        endpoints = [dataclasses.replace(listener, port=self.advertised[listener.name].port)
                     for listener in self.config.advertised_listeners]
        try:
            await self.cluster.start(endpoints, stop)
        except StartCancelled as exc:
            log.info("%s: not serving", exc)
            return False
        except ClusterStartError as exc:
            raise StartupError(str(exc)) from None
        return True

    def brokers_on(self, listener: str) -> list[BrokerEndpoint]:
        """The live brokers as a client connected through ``listener`` must reach them (Kafka answers with
        the endpoints of the listener a request arrived on); a broker not advertised there is left out."""
        if self.cluster is not None:
            return self.cluster.metadata.brokers_on(listener)
        brokers = []
        for broker in self.metadata.brokers():
            if broker.broker_id != self.broker_id:
                brokers.append(broker)
            elif listener in self.advertised:
                brokers.append(self.advertised[listener])
        return brokers

    # -- connections ------------------------------------------------------------------------------
    async def _accept(self, sock: socket.socket, factory, tls: TlsContextHolder | None = None) -> None:
        """Accept connections on ``sock`` while fewer than max.connections are open (Kafka's KIP-402); on an
        SSL listener (``tls``) each accepted socket's handshake runs in a task of its own (_handshake)."""
        loop = asyncio.get_running_loop()
        max_total = int(self.config.get("max.connections"))
        sock.setblocking(False)
        while True:
            while len(self.connections) + len(self._handshakes) >= max_total:
                self._slot_freed.clear()
                await self._slot_freed.wait()
            try:
                accepted, address = await loop.sock_accept(sock)
            except OSError as exc:  # out of descriptors, or the peer gave up in the backlog: keep serving
                log.warning("accepting a connection failed: %s", exc)
                await asyncio.sleep(0.1)  # do not spin while descriptors are exhausted
                continue
            if tls is not None:
                host = address[0]
                refusal = self._per_ip_refusal(host, self._handshaking_per_host[host])
                if refusal is not None:  # before the handshake: a flood of stalled ones from one host is bounded
                    log.warning("refusing connection from %s:%s: %s", host, address[1], refusal)
                    accepted.close()
                    continue
                task = asyncio.ensure_future(self._handshake(accepted, address, factory, tls))
                self._handshakes[task] = host
                self._handshaking_per_host[host] += 1
                task.add_done_callback(self._handshake_done)
                continue
            try:
                await loop.connect_accepted_socket(factory, accepted)
            except OSError as exc:
                log.warning("cannot serve an accepted connection: %s", exc)
                accepted.close()

    def _handshake_timeout_s(self) -> float:
        idle_ms = int(self.config.get("connections.max.idle.ms"))
        return TLS_HANDSHAKE_TIMEOUT_S if idle_ms < 0 else max(min(idle_ms / 1000, TLS_HANDSHAKE_TIMEOUT_S), 0.1)

    async def _handshake(self, accepted: socket.socket, address: tuple, factory, tls: TlsContextHolder) -> None:
        """Serve one accepted socket of an SSL listener: the TLS handshake (with the listener's current context,
        read once here: that is the reload's atomic swap), then the Kafka connection. A failed or timed-out
        handshake closes this socket only, with one log line (a peer that just closes, e.g. a TCP health
        check, at INFO; Kafka logs these at debug/info)."""
        peer = "%s:%s" % tuple(address[:2])
        handshake = asyncio.current_task()
        made: list[KafkaConnection] = []

        def connection() -> KafkaConnection:
            made.append(factory())
            made[0].handshake = handshake  # admit() takes this handshake out of the per-host count at once
            return made[0]

        timeout_s = self._handshake_timeout_s()
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                connection, accepted, ssl=tls.context, ssl_handshake_timeout=timeout_s)
        except asyncio.CancelledError:
            if not made:  # broker stopping before a transport owns the socket; after, stop() closes the connection
                accepted.close()
            raise
        except (ssl.SSLError, OSError, EOFError) as exc:  # the timeout too: "SSL handshake is taking longer than"
            if isinstance(exc, (ConnectionResetError, EOFError)) or not str(exc):
                log.info("closing connection from %s: the peer closed it during the TLS handshake (%s)", peer,
                         type(exc).__name__)
            else:
                log.warning("closing connection from %s: TLS handshake failed: %s", peer, exc)
            if not made:  # the transport closes its socket on any later failure
                accepted.close()

    def _handover(self, handshake: asyncio.Task) -> None:
        """A TLS connection admitted: its handshake no longer counts (the connection does), at once, so a
        client's next connection is not refused by max.connections.per.ip meanwhile."""
        host = self._handshakes.pop(handshake, None)
        if host is None:
            return
        self._handshaking_per_host[host] -= 1
        if not self._handshaking_per_host[host]:
            del self._handshaking_per_host[host]

    def _handshake_done(self, task: asyncio.Task) -> None:
        self._handover(task)  # (a no-op for an admitted connection's)
        self._slot_freed.set()
        if not task.cancelled() and task.exception() is not None:  # unexpected: say so, keep serving
            log.warning("TLS connection setup failed: %r", task.exception())

    def admit(self, connection: KafkaConnection) -> str | None:
        """Count a new connection in, or say why it must be closed (max.connections, max.connections.per.ip)."""
        max_total = int(self.config.get("max.connections"))
        if len(self.connections) >= max_total:
            return f"max.connections {max_total} reached"
        refusal = self._per_ip_refusal(connection.host)
        if refusal is not None:
            return refusal
        self.connections.add(connection)
        self._connections_per_host[connection.host] += 1
        if connection.handshake is not None:
            self._handover(connection.handshake)
        return None

    def _per_ip_refusal(self, host: str, pending: int = 0) -> str | None:
        """Why a new connection from ``host`` is refused (max.connections.per.ip), counting ``pending`` ones of
        that host not yet admitted (TLS handshakes in progress), or None."""
        max_per_ip = int(self.config.get("max.connections.per.ip"))
        if self._connections_per_host[host] + pending >= max_per_ip:
            return f"max.connections.per.ip {max_per_ip} reached for {host}"
        return None

    def release(self, connection: KafkaConnection) -> None:
        if connection in self.connections:
            self.connections.discard(connection)
            self._slot_freed.set()
            self._connections_per_host[connection.host] -= 1
            if not self._connections_per_host[connection.host]:
                del self._connections_per_host[connection.host]

    async def _close_idle_connections(self) -> None:
        """Close connections that made no progress for connections.max.idle.ms, as Kafka's selector does."""
        idle_s = int(self.config.get("connections.max.idle.ms")) / 1000
        if idle_s < 0:
            return  # Kafka's -1: connections never expire
        interval_s = min(max(idle_s / 4, 0.05), 30.0)
        while True:
            await asyncio.sleep(interval_s)
            now = time.monotonic()
            for connection in list(self.connections):
                since = connection.idle_since
                if since is not None and now - since > idle_s:
                    log.info("closing connection from %s: idle for more than connections.max.idle.ms (%d ms)",
                             connection.peer, idle_s * 1000)
                    connection.close()

    async def _expire_producers(self) -> None:
        """Forget idle producers' sequence state, as Kafka does (producer.id.expiration.ms)."""
        interval_s = int(self.config.get("producer.id.expiration.check.interval.ms")) / 1000
        expiration_ms = int(self.config.get("producer.id.expiration.ms"))
        while True:
            await asyncio.sleep(interval_s)
            now = int(time.time() * 1000)
            for partition in self.replicas.partitions():
                partition.producer_state.expire(now, expiration_ms)

    # -- stop -------------------------------------------------------------------------------------
    async def serve_metrics(self, sock: socket.socket) -> None:
        """Serve /metrics, /health and /ready on ``sock`` (see bind_metrics) until ``stop``."""
        from pykbroker.metrics.http import MetricsServer

        self.metrics_server = MetricsServer(self, sock)
        await self.metrics_server.start()
        log.info("metrics on http://%s/metrics (/health, /ready)", _host_port(*sock.getsockname()[:2]))

    async def stop(self) -> None:
        self.stopping = True
        if self.acl_store is not None:  # its watch reads ZooKeeper: stopped before the cluster parts close it
            await self.acl_store.close()
        if self.cluster is not None:
            # Controlled shutdown while still serving (the controller's requests reach us), then leave.
            await self.cluster.stop(controlled=True)
        for acceptor in self._acceptors:
            acceptor.cancel()
        await asyncio.gather(*self._acceptors, return_exceptions=True)
        for handshake in list(self._handshakes):
            handshake.cancel()
        await asyncio.gather(*self._handshakes, return_exceptions=True)
        for connection in list(self.connections):
            connection.close()
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self._verifier.close()  # produces waiting for a verification get NETWORK_EXCEPTION
        while self._owned:  # topic creations whose clients left: their partitions get hosted and committed
            await asyncio.gather(*self._owned, return_exceptions=True)
        try:
            self.replicas.write_high_watermarks()
        except OSError as exc:
            log.warning("could not write %s at shutdown: %s", self.replicas.checkpoint_path, exc)
        self.log_manager.shutdown()
        if self.cluster is None:  # (a cluster member's metadata cache was closed with the cluster parts)
            self.metadata.close()
        if self.metrics_server is not None:
            await self.metrics_server.close()
        log.info("pykbroker broker %d stopped cleanly", self.broker_id)


def tls_holders(config: BrokerConfig) -> dict[str, TlsContextHolder]:
    """One TLS context holder per SSL listener, from that listener's ``ssl.*`` settings; a setting TLS cannot
    use (no key store, a wrong password, an unreadable file...) is a StartupError naming the listener."""
    from pykbroker.security.tls import TlsContextHolder, listener_ssl_configs

    holders: dict[str, TlsContextHolder] = {}
    inter_broker = config.inter_broker_listener
    for listener in config.listeners:
        if listener.security_protocol not in ("SSL", "SASL_SSL"):
            continue
        try:  # the inter-broker listener's own client must be able to connect to it (Kafka's SslFactory check)
            holders[listener.name] = TlsContextHolder(
                listener_ssl_configs(config.values, listener.name, listener.security_protocol),
                inter_broker=inter_broker is not None and listener.name == inter_broker.name)
        except ConfigError as exc:
            raise StartupError(f"listener {listener}: {exc.message}") from None
    return holders


def inter_broker_client(config: BrokerConfig) -> InterBrokerClient:
    """The broker's own client settings (security/inter_broker.py); a setting that cannot work is a
    StartupError naming the inter-broker listener."""
    from pykbroker.security.inter_broker import InterBrokerClient

    try:
        return InterBrokerClient.from_config(config)
    except ConfigError as exc:
        raise StartupError(exc.message) from None


class BrokerCredentials:
    """The SCRAM credentials SASL listeners check: the broker's ``scram_credentials`` at each look-up (the
    mechanisms are built, and their settings checked, before the broker and its data dir exist)."""

    def __init__(self, broker: Broker | None = None) -> None:
        self.broker = broker

    def get(self, mechanism: str, user: str) -> Any:
        return None if self.broker is None else self.broker.scram_credentials.get(mechanism, user)


def sasl_listeners(config: BrokerConfig, credentials: BrokerCredentials) -> dict[str, SaslListener]:
    """One SaslListener per SASL_PLAINTEXT or SASL_SSL listener (its enabled mechanisms from
    ``sasl.enabled.mechanisms``, its JAAS strings, ...); what Kafka refuses at start (GSSAPI, an enabled mechanism
    without a JAAS entry, ...) is a StartupError naming the listener."""
    from pykbroker.security.jaas import JaasConfigError
    from pykbroker.security.sasl import SaslConfigError

    listeners: dict[str, SaslListener] = {}
    for listener in config.listeners:
        if listener.security_protocol not in ("SASL_PLAINTEXT", "SASL_SSL"):
            continue
        try:
            listeners[listener.name] = SaslListener.from_configs(listener.name, config.values, credentials=credentials)
        except (SaslConfigError, JaasConfigError) as exc:
            raise StartupError(f"listener {listener}: {exc}") from None
    return listeners


def open_broker(config: BrokerConfig) -> Broker:
    """Broker(config), with the data dir's problems (locked by another broker, not writable) as StartupError."""
    try:
        return Broker(config)
    except LogDirectoryInUse:
        raise StartupError(f"data dir {config.data_dir} is locked by another broker ({config.data_dir / LOCK_FILE}); "
                           "stop that broker or choose another data dir") from None
    except OSError as exc:
        problem = "is not writable" if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else "cannot be used"
        raise StartupError(f"data dir {config.data_dir} {problem}: {exc.filename}: {exc.strerror}") from None


def bind_metrics(config: BrokerConfig) -> socket.socket | None:
    """The metrics endpoint's listening socket (metrics.host, default the broker's host), or None when
    metrics.port is 0 (off). A port in use or an unresolvable host is a StartupError naming METRICS://host:port."""
    port = int(config.get("metrics.port"))
    if not port:
        return None
    host = config.get("metrics.host")
    return bind_listener(Listener("METRICS", config.host if host is None else host, port, "HTTP"))


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def log_stacks() -> None:
    """SIGUSR1: log where every asyncio task and thread is, for a broker that hangs (e.g. in its shutdown)."""
    import io
    import sys
    import threading
    import traceback

    out = io.StringIO()
    tasks = asyncio.all_tasks()
    out.write(f"stacks on SIGUSR1: {len(tasks)} asyncio task(s)\n")
    for task in tasks:
        task.print_stack(limit=12, file=out)
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        out.write(f"thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame, limit=12))}")
    log.warning("%s", out.getvalue())


async def serve(config: BrokerConfig, ready: asyncio.Event | None = None) -> None:
    """Run a broker until SIGTERM/SIGINT. Raises StartupError if it cannot start."""
    started = time.monotonic()
    # Signals first: the ports accept connections (into the backlog) from the moment they are bound, and a
    # SIGTERM that arrives while the logs load must still end in a clean shutdown.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, log_stacks)
    listening: list[tuple[Listener, socket.socket]] = []
    metrics_sock: socket.socket | None = None
    try:
        for listener in config.listeners:
            listening.append((listener, bind_listener(listener)))
        metrics_sock = bind_metrics(config)
        tls = tls_holders(config)  # before the data dir is opened: a bad ssl.* setting writes nothing
        credentials = BrokerCredentials()
        sasl = sasl_listeners(config, credentials)  # likewise a bad SASL setting
        broker = open_broker(config)
        broker.tls = tls
        credentials.broker = broker
        broker.sasl = sasl
        if metrics_sock is not None:  # from now on: /health answers, /ready says why not yet
            await broker.serve_metrics(metrics_sock)
        await broker.start(listening, stop)
        if broker.serving:
            log.info("ready in %.3f s", time.monotonic() - started)
            if ready is not None:
                ready.set()
        await stop.wait()
        log.info("shutting down")
        await broker.stop()
    finally:
        for _, sock in listening:
            sock.close()
        if metrics_sock is not None:
            metrics_sock.close()


def run_broker(config: BrokerConfig) -> None:
    """Run until SIGTERM/SIGINT. Uses uvloop where it is installed. Raises StartupError."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        pass
    asyncio.run(serve(config))

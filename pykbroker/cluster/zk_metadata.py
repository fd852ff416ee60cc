"""The broker's metadata cache in cluster (ZooKeeper) mode, and the ZooKeeper side of topic admin.

Kafka's ZkMetadataCache, rule for rule where it matters to clients:
- The cache is filled ONLY by UpdateMetadata from the controller (``apply_update_metadata``, any version
  0-8). Each request replaces the live brokers with their endpoints per listener; partition states are
  upserted; a partition whose leader is -2 (LeaderAndIsr.LeaderDuringDelete) is removed, and a topic left
  without partitions with it; topic ids come from v7+ topic states (a zero id forgets the topic's id); a
  negative controller id means no controller is known (-1 in answers).
- Before v3 endpoints carry no listener name: the listener is named after the security protocol
  (ListenerName.forSecurityProtocol); v0 brokers have one PLAINTEXT host and port.
- Topic configs are not part of UpdateMetadata: they are read from ``/config/topics/<t>`` when a topic first
  appears in the cache (``load_topic_config`` lets the node load them before it creates a log) and re-read
  when a ``/config/changes/config_change_<seq>`` notification names the topic (Kafka's
  ZkConfigManager / ZkNodeChangeNotificationListener: notifications are processed in sequence order, each
  once; the ones present at start-up are processed then). Config listeners are told after each change.
  A notification is done only once its entity was read: if ZooKeeper cannot be read meanwhile (a lost
  connection), processing stops at that notification and is retried (backoff 0.1 s doubling up to 5 s),
  as Kafka's ZooKeeper client blocks until it is connected again: no change is skipped.
- Dynamic broker configs: ``/config/brokers/<default>`` and ``/config/brokers/<this broker's id>`` are read
  at ``start`` (before the broker registers, so before any LeaderAndIsr) and re-read when a notification
  names ``brokers/<default>`` or ``brokers/<id>``; broker config listeners are told after each read.
- Client entity configs (SCRAM credentials and client quotas: ``/config/users/<u>``,
  ``/config/users/<u>/clients/<c>``, ``/config/clients/<c>``, ``/config/ips/<ip>``): every one is read at
  ``start`` and re-read when a notification names it (``users/alice/clients/app``); client entity listeners
  are told after each read ({} for an entity that is gone). Reads carry generations as topic configs do.
  After a new ZooKeeper session (the old one expired: notifications may have been purged meanwhile) every
  client entity is read again, so a revoked credential or a changed quota is not kept until a restart.
- AlterConfigs writes go through the broker that got the request, as Kafka's ZkAdminManager: the config
  znode, then a change notification (AdminZkClient.changeEntityConfig); that broker applies the change
  to its own cache at once (its next DescribeConfigs shows it), the others when they see the notification.
- Config change notifications older than 15 minutes (``change_expiration_ms``) are deleted after each
  round of processing, as Kafka's ZkNodeChangeNotificationListener.purgeObsoleteNotifications does (their
  creation time is ZooKeeper's ctime): they do not pile up, and a starting broker replays only recent ones.
- Reads of a topic's config carry a generation from one counter that only grows: a read (or a config
  write through this broker) applies its result to the cache only if the topic's generation is still
  the one it started with, so a topic deleted meanwhile (and maybe created again) never gets the
  configs of its former incarnation.
- AlterConfigs / IncrementalAlterConfigs read the entity's configs from ZooKeeper
  (``read_entity_configs_async``, Kafka's fetchEntityConfig), not from this cache, which may be behind;
  IncrementalAlterConfigs writes conditionally on the zkVersion read (StaleConfigVersion: read again).
- ``topic(name)`` shows the partitions known so far, from 0 up to the first one not known yet (the
  controller sends every partition of a topic in one request, so in practice all of them).

Admin changes are written to ZooKeeper as Kafka's AdminZkClient writes them, and become visible here only
when the controller has acted on them and sent UpdateMetadata (``wait_until``):
- create: ``/config/topics/<t>`` then ``/brokers/topics/<t>`` with a new topic id; replicas placed by
  ``assign_replicas_to_brokers`` (Kafka's AdminUtils.assignReplicasToBrokers, rack-unaware) over the live
  brokers of the cache; TOPIC_ALREADY_EXISTS if the assignment znode exists or the topic is marked for
  deletion, INVALID_TOPIC_EXCEPTION for a name colliding with one in ZooKeeper (AdminZkClient's
  validateTopicCreate).
- delete: ``/admin/delete_topics/<t>`` (a marker already there is fine, as in Kafka).
- add partitions: the assignment znode rewritten with the existing replicas plus the new partitions', placed
  from the broker at or after the first replica of partition 0 (AdminZkClient.createNewPartitionsAssignment);
  REASSIGNMENT_IN_PROGRESS while replicas are being moved. The write is conditional on the version read,
  and retried if another write came in between; it goes through KafkaZkClient.set_topic_assignment with
  any controller epoch (-1), which still needs ``/controller_epoch`` to exist (a controller was elected).
A wait still pending when the cache closes ends as a timeout does.
Not done: rack-aware placement (racks are carried in endpoints but placement ignores them).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import random
import time
import uuid
from concurrent.futures import Future
from typing import Callable, Sequence

from pykbroker.cluster.metadata import (
    DEFAULT_BROKER_ENTITY,
    GROUP_ENTITY_PREFIX,
    BrokerEndpoint,
    PartitionState,
    StaleConfigVersion,
    TopicIndex,
    TopicInfo,
    client_entity_type,
    collision_key,
)
from pykbroker.cluster.change_notifications import NOTIFICATION_EXPIRATION_MS, ChangeNotificationListener
from pykbroker.cluster.zookeeper import (
    CONFIG_CHANGE_PREFIX,
    CONFIG_CHANGES_PATH,
    CONFIG_PATH,
    KafkaZkClient,
    SessionEvent,
    StaleZkVersion,
    TopicAssignment,
    TopicExists,
    delete_topic_path,
)
from pykbroker.protocol.errors import ErrorCode, KafkaError
from pykbroker.security.credentials import desanitize, sanitize

log = logging.getLogger(__name__)

NO_CONTROLLER = -1  # MetadataResponse.NO_CONTROLLER_ID
LEADER_DURING_DELETE = -2  # LeaderAndIsr.LeaderDuringDelete
NO_TOPIC_ID = uuid.UUID(int=0)
# Kafka's SecurityProtocol ids, whose names are the listener names of UpdateMetadata before v3.
SECURITY_PROTOCOLS = {0: "PLAINTEXT", 1: "SSL", 2: "SASL_PLAINTEXT", 3: "SASL_SSL"}
_ASSIGNMENT_WRITE_ATTEMPTS = 5
START_CONFIG_READ_TIMEOUT_S = 60.0  # how long start retries reading the dynamic broker configs



# A group's configs znode /config/groups/<name>: its id sanitized as Kafka's Sanitizer does, except that a
# whole name of "." or ".." (which ZooKeeper takes as path steps) is written %2E / %2E%2E (desanitize reads
# them back). Its length is bounded: every name under /config/groups comes back in one getChildren answer,
# which must fit ZooKeeper's jute.maxbuffer (1 MiB by default), so one name may take at most 1 KiB.
MAX_GROUP_ZNODE_NAME = 1024


def group_znode_name(group_id: str, *, check_length: bool = True) -> str:
    """The znode name of a group's configs; KafkaError (INVALID_REQUEST) if it is too long for ZooKeeper
    (``check_length``: a name read back from ZooKeeper is taken as it is)."""
    name = sanitize(group_id)
    if name in (".", ".."):
        name = "%2E" * len(name)
    if check_length and len(name.encode()) > MAX_GROUP_ZNODE_NAME:
        raise KafkaError(ErrorCode.invalid_request,
                         f"Group id too long for its configs in ZooKeeper: {len(name.encode())} bytes sanitized, "
                         f"at most {MAX_GROUP_ZNODE_NAME}.")
    return name

class MetadataStartError(Exception):
    """The cache cannot start (the dynamic broker configs could not be read from ZooKeeper)."""


def assign_replicas_to_brokers(
    broker_ids: Sequence[int],
    partitions: int,
    replication_factor: int,
    *,
    start_index: int = -1,
    start_partition: int = 0,
    rng: random.Random | None = None,
) -> dict[int, list[int]]:
    """Kafka's AdminUtils.assignReplicasToBrokersRackUnaware: partition p's first replica is broker
    ``(p + start) % n`` of the sorted broker list, the others follow it at a shift that grows by one every
    n partitions, so leaders and followers spread evenly. ``start_index`` -1 picks the start and the shift
    at random, as Kafka does for a new topic. The caller checks 0 < replication_factor <= len(broker_ids)."""
    brokers = sorted(broker_ids)
    n = len(brokers)
    rng = rng or random.Random()
    start = start_index if start_index >= 0 else rng.randrange(n)
    shift = start_index if start_index >= 0 else rng.randrange(n)
    assignment: dict[int, list[int]] = {}
    for partition in range(max(0, start_partition), max(0, start_partition) + partitions):
        if partition > 0 and partition % n == 0:
            shift += 1
        first = (partition + start) % n
        replicas = [brokers[first]]
        for j in range(replication_factor - 1):
            replicas.append(brokers[(first + 1 + (shift + j) % (n - 1)) % n])
        assignment[partition] = replicas
    return assignment


def _endpoint_listener(endpoint, version: int) -> str:
    if version >= 3:
        return endpoint.listener
    return SECURITY_PROTOCOLS.get(endpoint.security_protocol, str(endpoint.security_protocol))


def _partition_states(request) -> list[tuple[str, object]]:
    """(topic, partition state entity) of an UpdateMetadata request of any version."""
    ungrouped = getattr(request, "ungrouped_partition_states", None)
    if ungrouped is not None:
        return [(state.topic_name, state) for state in ungrouped]
    return [(topic.topic_name, state) for topic in request.topic_states for state in topic.partition_states]


class ConfigReadFailed(Exception):
    """A change notification's entity could not be read (reported where it failed): processed again."""


class ZkMetadata(TopicIndex):
    """The metadata cache of a broker in a ZooKeeper cluster (see the module docstring)."""

    local_leadership = False  # LeaderAndIsr from the controller hosts partitions, through the node

    def __init__(self, zk: KafkaZkClient, broker_id: int, cluster_id: str, *, inter_broker_listener: str,
                 change_expiration_ms: int = NOTIFICATION_EXPIRATION_MS, clock_ms: Callable[[], int] | None = None,
                 start_timeout_s: float = START_CONFIG_READ_TIMEOUT_S) -> None:
        self.zk = zk
        self.broker_id = broker_id
        self.cluster_id = cluster_id
        self.inter_broker_listener = inter_broker_listener
        self.controller_id = NO_CONTROLLER
        self._brokers: dict[int, dict[str, BrokerEndpoint]] = {}  # live broker -> listener -> endpoint
        self._states: dict[str, dict[int, PartitionState]] = {}
        self._topic_ids: dict[str, uuid.UUID] = {}
        super().__init__()
        self._configs: dict[str, dict[str, str]] = {}  # topic -> overrides, once read from ZooKeeper
        # topic / broker entity -> generation of its last read or write started, from one counter that only
        # grows (a topic deleted and created again never gets a generation it had before)
        self._generations = itertools.count(1)
        self._config_generation: dict[str, int] = {}
        self.change_expiration_ms = change_expiration_ms
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        # /config/changes, as Kafka's ZkNodeChangeNotificationListener follows it (cluster/change_notifications.py)
        self._changes = ChangeNotificationListener(zk, CONFIG_CHANGES_PATH, CONFIG_CHANGE_PREFIX, self._process_change,
                                                   name="config", expiration_ms=change_expiration_ms,
                                                   clock_ms=lambda: self.clock_ms(), max_backoff_s=5.0)
        self.start_timeout_s = start_timeout_s
        self._listeners: list[Callable[[], None]] = []
        self._config_listeners: list[Callable[[str], None]] = []
        self._broker_configs: dict[str, dict[str, str]] = {}  # DEFAULT_BROKER_ENTITY / own id -> configs
        self._broker_config_generation: dict[str, int] = {}
        self._broker_config_listeners: list[Callable[[str, dict[str, str]], None]] = []
        self._client_entities: dict[str, dict[str, str]] = {}  # entity path -> configs (users/alice, ...)
        self._client_entity_generation: dict[str, int] = {}
        self._client_entity_listeners: list[Callable[[str, dict[str, str]], None]] = []
        self._group_configs: dict[str, dict[str, str]] = {}  # group id -> configs (/config/groups/<group>)
        self._group_config_generation: dict[str, int] = {}
        self._group_config_listeners: list[Callable[[str, dict[str, str]], None]] = []
        self._reread_task: asyncio.Task | None = None
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future]] = []
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Read the dynamic broker configs and the client entity configs, then watch ``/config/changes`` (the watch fires once at once:
        notifications present now are processed). A failed read is retried (backoff 0.1 s doubling up to
        5 s) for ``start_timeout_s``; then MetadataStartError: a broker must not run without the dynamic
        configs the cluster set for it (a lowered retention, a throttle)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout_s
        reads = [(functools.partial(self._load_broker_config, entity),
                  f"the dynamic broker configs /config/brokers/{entity}") for entity in self._broker_entities()]
        reads.append((self._load_client_entities,
                      "the client entity configs (SCRAM credentials, client quotas) under /config"))
        reads.append((self._load_group_configs, "the group configs under /config/groups"))
        for read, what in reads:
            backoff = 0.1
            while not await read():
                if loop.time() + backoff > deadline:
                    raise MetadataStartError(
                        f"Cannot read {what} from ZooKeeper within {self.start_timeout_s:g} s (see the warnings "
                        f"above); not starting without them."
                    )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        self.zk.add_session_listener(self._on_session_event)
        self._changes.start()

    async def close(self) -> None:
        self._closed = True
        for _, waiter in self._waiters:  # their admin requests answer now (REQUEST_TIMED_OUT, as at a timeout)
            if not waiter.done():
                waiter.set_result(None)
        await self._changes.close()
        tasks = [*self._tasks, *([self._reread_task] if self._reread_task else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- UpdateMetadata ---------------------------------------------------------------------------
    def apply_update_metadata(self, request) -> None:
        """Apply an UpdateMetadata request (v0-8 entity) as Kafka's ZkMetadataCache.updateMetadata does,
        then wake the waiters and tell the listeners."""
        version = int(type(request).__version__)
        brokers: dict[int, dict[str, BrokerEndpoint]] = {}
        for broker in request.live_brokers:
            rack = getattr(broker, "rack", None)
            if version == 0:
                brokers[broker.id_] = {"PLAINTEXT": BrokerEndpoint(broker.id_, broker.v0_host, broker.v0_port, rack)}
                continue
            brokers[broker.id_] = {
                _endpoint_listener(ep, version): BrokerEndpoint(broker.id_, ep.host, ep.port, rack)
                for ep in broker.endpoints
            }
        self._brokers = brokers
        self.controller_id = request.controller_id if request.controller_id >= 0 else NO_CONTROLLER
        touched: set[str] = set()
        for topic in getattr(request, "topic_states", ()):
            topic_id = getattr(topic, "topic_id", None)
            if topic_id is None:
                continue
            touched.add(topic.topic_name)
            if topic_id == NO_TOPIC_ID:
                self._topic_ids.pop(topic.topic_name, None)
            else:
                self._topic_ids[topic.topic_name] = topic_id
        for name, state in _partition_states(request):
            touched.add(name)
            if state.leader == LEADER_DURING_DELETE:
                partitions = self._states.get(name)
                if partitions is not None:
                    partitions.pop(state.partition_index, None)
                    if not partitions:
                        del self._states[name]
                continue
            self._states.setdefault(name, {})[state.partition_index] = PartitionState(
                state.leader, state.leader_epoch, list(state.replicas), list(state.isr),
                list(getattr(state, "offline_replicas", ())), state.zk_version,
            )
        for name in touched:
            self._reindex(name)
        self._wake()
        for callback in list(self._listeners):
            callback()

    def _reindex(self, name: str) -> None:
        """Rebuild ``name``'s TopicInfo from its partition states, or forget the topic if it has none."""
        old = self._unindex(name)
        partitions = self._states.get(name)
        if not partitions:
            self._topic_ids.pop(name, None)
            self._configs.pop(name, None)
            self._config_generation.pop(name, None)  # a read in flight is dropped
            return
        known: list[PartitionState] = []
        while len(known) in partitions:
            known.append(partitions[len(known)])
        info = TopicInfo(name, self._topic_ids.get(name, NO_TOPIC_ID), known, self._configs.get(name, {}))
        self._index(info)
        if old is None and name not in self._configs:
            self._spawn(self._load_config(name))

    def add_listener(self, callback: Callable[[], None]) -> None:
        """``callback()`` after each applied UpdateMetadata."""
        self._listeners.append(callback)

    # -- queries ----------------------------------------------------------------------------------
    def brokers(self) -> list[BrokerEndpoint]:
        """The live brokers, each at its inter-broker listener (or its first endpoint if it has none there)."""
        result = []
        for broker_id in sorted(self._brokers):
            endpoints = self._brokers[broker_id]
            endpoint = endpoints.get(self.inter_broker_listener) or next(iter(endpoints.values()), None)
            if endpoint is not None:
                result.append(endpoint)
        return result

    def is_alive(self, broker_id: int) -> bool:
        """Whether the controller's last UpdateMetadata listed the broker (Kafka's hasAliveBroker)."""
        return broker_id in self._brokers

    def brokers_on(self, listener: str) -> list[BrokerEndpoint]:
        """The live brokers' endpoints on ``listener``; a broker without that listener is left out (Kafka)."""
        return [eps[listener] for _, eps in sorted(self._brokers.items()) if listener in eps]

    def endpoint(self, broker_id: int, listener: str) -> BrokerEndpoint | None:
        return self._brokers.get(broker_id, {}).get(listener)

    def address_of(self, broker_id: int) -> tuple[str, int] | None:
        """Host and port of a live broker's inter-broker listener, or None."""
        endpoint = self.endpoint(broker_id, self.inter_broker_listener)
        return (endpoint.host, endpoint.port) if endpoint is not None else None

    def leader_of(self, topic: str, index: int) -> int | None:
        """The partition's leader, or None if the partition is unknown or has no leader (-1)."""
        state = self._states.get(topic, {}).get(index)
        return state.leader if state is not None and state.leader >= 0 else None

    def topic_configs(self, name: str) -> dict[str, str] | None:
        """The overrides read from ZooKeeper, also for a topic LeaderAndIsr names before UpdateMetadata does."""
        return self._configs.get(name)

    def topic_id_of(self, name: str) -> uuid.UUID | None:
        """The topic's id, as the fetcher puts it in Fetch requests; None if unknown."""
        return self._topic_ids.get(name)

    def commit(self) -> Future:
        """Admin changes are durable once ZooKeeper acknowledged them: nothing left to make durable."""
        done: Future = Future()
        done.set_result(None)
        return done

    # -- waiting for the controller ---------------------------------------------------------------
    async def wait_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Whether ``condition()`` became true within ``timeout_s``, checked after each UpdateMetadata."""
        if condition():
            return True
        if timeout_s <= 0 or self._closed:
            return False
        waiter = asyncio.get_running_loop().create_future()
        entry = (condition, waiter)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except asyncio.TimeoutError:
            return False
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)
        return condition()  # woken by a matching update, or by close

    def _wake(self) -> None:
        for condition, waiter in list(self._waiters):
            if not waiter.done() and condition():
                waiter.set_result(None)

    # -- topic configs ----------------------------------------------------------------------------
    def add_config_listener(self, callback: Callable[[str], None]) -> None:
        """``callback(topic)`` after a topic's config overrides were (re)loaded from ZooKeeper."""
        self._config_listeners.append(callback)

    async def load_topic_config(self, name: str) -> dict[str, str]:
        """The topic's overrides, read from ZooKeeper if not read yet (the node awaits this before it
        creates a log for a LeaderAndIsr, which comes before the UpdateMetadata that shows the topic)."""
        if name in self._configs:
            return self._configs[name]
        await self._load_config(name)
        return self._configs.get(name, {})

    async def _load_config(self, name: str) -> bool:
        """Read /config/topics/<name>; of two reads in flight, the one started last wins. False if ZooKeeper
        could not be read (reported; the configs known are kept)."""
        generation = self._config_generation[name] = next(self._generations)
        try:
            configs = await self.zk.get_topic_config(name)
        except Exception as exc:  # noqa: BLE001 - a ZooKeeper failure keeps the configs known and is reported
            log.warning("cannot read the config of topic %s from ZooKeeper: %r", name, exc)
            return False
        if self._config_generation.get(name) != generation:
            return True
        self._configs[name] = configs
        info = self._topics.get(name)
        if info is not None:
            info.configs = configs
        for callback in list(self._config_listeners):
            callback(name)
        return True

    @property
    def last_config_change(self) -> int:
        """The sequence number of the last /config/changes notification processed (-1: none yet)."""
        return self._changes.last_processed

    async def _process_change(self, child: str, data: bytes | None) -> None:
        """One /config/changes notification: a ``topics/<t>`` entity reloads that topic's config (if the cache has
        the topic: others are read when they appear), a broker entity of this broker or a client entity its
        configs. An entity that could not be read raises: the listener retries from this notification."""
        entity_type, name = _changed_entity(data) or ("", "")
        loaded = True
        if entity_type == "topics" and name in self._topics:
            loaded = await self._load_config(name)
        elif entity_type == "brokers" and name in self._broker_entities():
            loaded = await self._load_broker_config(name)
        elif client_entity_type(f"{entity_type}/{name}") is not None:
            loaded = await self._load_client_entity(f"{entity_type}/{name}")
        elif entity_type + "/" == GROUP_ENTITY_PREFIX:
            loaded = await self._load_group_config(desanitize(name))
        if not loaded:
            raise ConfigReadFailed(f"the configs of {entity_type}/{name} ({child}) could not be read from ZooKeeper")

    # -- dynamic broker configs -------------------------------------------------------------------
    def _broker_entities(self) -> tuple[str, str]:
        return DEFAULT_BROKER_ENTITY, str(self.broker_id)

    def broker_configs(self, entity: str) -> dict[str, str]:
        """The dynamic broker configs of the cluster default or this broker, as last read."""
        return dict(self._broker_configs.get(entity, {}))

    def add_broker_config_listener(self, callback: Callable[[str, dict[str, str]], None]) -> None:
        """``callback(entity, configs)`` after the default's or this broker's dynamic configs were read."""
        self._broker_config_listeners.append(callback)

    async def _load_broker_config(self, entity: str) -> bool:
        """Read /config/brokers/<entity> and apply it (unless a newer read or write started meanwhile);
        False if ZooKeeper could not be read (reported; the configs known are kept)."""
        return await self._read_entity_config(self._broker_config_generation, entity, f"brokers/{entity}",
                                              self._apply_broker_configs)

    async def _read_entity_config(self, generations: dict[str, int], key: str, entity_path: str,
                                  apply: Callable[[str, dict[str, str]], None]) -> bool:
        """Read /config/<entity_path> and ``apply(key, configs)`` unless a newer read or write of ``key`` started
        meanwhile (``generations``); False if ZooKeeper could not be read (reported; what is known is kept)."""
        generation = generations[key] = next(self._generations)
        entity_type, _, name = entity_path.partition("/")
        try:
            configs = await self.zk.get_entity_config(entity_type, name)
        except Exception as exc:  # noqa: BLE001 - a ZooKeeper failure keeps the configs known and is reported
            log.warning("cannot read the configs of %s from ZooKeeper: %r", entity_path, exc)
            return False
        if generations.get(key) == generation:
            apply(key, configs)
        return True

    def _apply_broker_configs(self, entity: str, configs: dict[str, str]) -> None:
        self._broker_configs[entity] = dict(configs)
        for callback in list(self._broker_config_listeners):
            callback(entity, dict(configs))

    # -- client entity configs (SCRAM credentials, client quotas) ----------------------------------
    def client_entity_configs(self) -> dict[str, dict[str, str]]:
        """Every client entity's configs by entity path, as last read (entities with no configs left out)."""
        return {path: dict(configs) for path, configs in self._client_entities.items()}

    def add_client_entity_listener(self, callback: Callable[[str, dict[str, str]], None]) -> None:
        """``callback(entity_path, configs)`` after a client entity's configs were read ({}: none, or gone)."""
        self._client_entity_listeners.append(callback)

    async def _load_client_entities(self, forget: set[str] = frozenset()) -> bool:
        """Read every client entity under /config (at start, and after a new session); those of ``forget``
        that are no longer there are gone ({}). False if ZooKeeper could not be read."""
        try:
            paths = await self.zk.client_entity_paths()
        except Exception as exc:  # noqa: BLE001 - reported; the caller retries
            log.warning("cannot list the client entity configs under /config in ZooKeeper: %r", exc)
            return False
        for path in paths:
            if not await self._load_client_entity(path):
                return False
        for path in sorted(forget - set(paths)):
            if not await self._load_client_entity(path):  # a read, not a blind removal: a write may race
                return False
        return True

    def _on_session_event(self, event: str) -> None:
        """A new session (the old one expired): re-read every client entity (retried until it succeeds) and
        the notifications (the watch is set again by kazoo; this makes sure a round runs)."""
        if event != SessionEvent.RECONNECTED or self._closed:
            return
        if self._reread_task is None or self._reread_task.done():
            self._reread_task = asyncio.ensure_future(self._reread_client_entities())
        self._changes.changed()

    async def _reread_client_entities(self) -> None:
        backoff = 0.1
        while not self._closed:
            known = set(self._client_entities)
            if await self._load_client_entities(forget=known) and await self._load_group_configs(
                    forget=set(self._group_configs)):
                log.info("client entity configs read again after a new ZooKeeper session")
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def _load_client_entity(self, entity_path: str) -> bool:
        return await self._read_entity_config(self._client_entity_generation, entity_path, entity_path,
                                              self._apply_client_entity)

    def _apply_client_entity(self, entity_path: str, configs: dict[str, str]) -> None:
        if configs:
            self._client_entities[entity_path] = dict(configs)
        elif self._client_entities.pop(entity_path, None) is None:
            return  # nothing known, nothing to tell (a parent znode made on the way, or an unchanged absence)
        for callback in list(self._client_entity_listeners):
            callback(entity_path, dict(configs))

    async def set_client_entity_configs_async(self, entity_path: str, configs: dict[str, str], *,
                                              version: int | None = None) -> None:
        """Write ``/config/<entity_path>`` and its change notification (conditional on ``version`` as
        ``read_entity_configs_async`` gave it, StaleConfigVersion if it changed), then apply it here at once."""
        kind, _, name = entity_path.partition("/")
        if client_entity_type(entity_path) is None:
            raise ValueError(f"not a client entity path: {entity_path!r}")
        generation = self._client_entity_generation.get(entity_path)
        await self._write_entity_config(kind, name, configs, version)
        if self._client_entity_generation.get(entity_path) == generation:
            self._client_entity_generation[entity_path] = next(self._generations)
            self._apply_client_entity(entity_path, configs)

    async def read_entity_configs_async(self, entity_type: str, name: str) -> tuple[dict[str, str], int]:
        """``/config/<entity_type>/<name>`` as ZooKeeper has it now, and its zkVersion (-1: no znode); a group's
        name is its id (sanitized here for its znode)."""
        if entity_type + "/" == GROUP_ENTITY_PREFIX:
            name = group_znode_name(name)
        return await self.zk.get_entity_config_versioned(entity_type, name)

    # -- group configs (/config/groups/<sanitized group id>) ----------------------------------------
    def group_configs(self) -> dict[str, dict[str, str]]:
        """Every group's configs by group id, as last read (groups with no configs left out)."""
        return {group: dict(configs) for group, configs in self._group_configs.items()}

    def add_group_config_listener(self, callback: Callable[[str, dict[str, str]], None]) -> None:
        """``callback(group_id, configs)`` after a group's configs were read ({}: none, or gone)."""
        self._group_config_listeners.append(callback)

    async def _load_group_configs(self, forget: set[str] = frozenset()) -> bool:
        """Read every group's configs under /config/groups (at start, after a new session); those of ``forget``
        no longer there are gone. False if ZooKeeper could not be read."""
        try:
            groups = [desanitize(name) for name in await self.zk.children(f"{CONFIG_PATH}/groups")]
        except Exception as exc:  # noqa: BLE001 - reported; the caller retries
            log.warning("cannot list the group configs under /config/groups in ZooKeeper: %r", exc)
            return False
        for group in [*groups, *sorted(forget - set(groups))]:
            if not await self._load_group_config(group):
                return False
        return True

    async def _load_group_config(self, group_id: str) -> bool:
        return await self._read_entity_config(self._group_config_generation, group_id,
                                              GROUP_ENTITY_PREFIX + group_znode_name(group_id, check_length=False),
                                              self._apply_group_config)

    def _apply_group_config(self, group_id: str, configs: dict[str, str]) -> None:
        if configs:
            self._group_configs[group_id] = dict(configs)
        elif self._group_configs.pop(group_id, None) is None:
            return
        for callback in list(self._group_config_listeners):
            callback(group_id, dict(configs))

    async def set_group_configs_async(self, group_id: str, configs: dict[str, str], *,
                                      version: int | None = None) -> None:
        """Write ``/config/groups/<group>`` and its change notification (conditional on ``version``:
        StaleConfigVersion if it changed), then apply it here at once."""
        generation = self._group_config_generation.get(group_id)
        await self._write_entity_config("groups", group_znode_name(group_id), configs, version)
        if self._group_config_generation.get(group_id) == generation:
            self._group_config_generation[group_id] = next(self._generations)
            self._apply_group_config(group_id, configs)

    async def read_client_entity_configs_async(self, entity_type: str) -> dict[str, dict[str, str]]:
        """Every ``<entity_type>/<name>`` entity (``users``, ``clients``, ``ips``; not the users' client
        sub-entities) as ZooKeeper has it now, by entity path (Kafka's fetchAllEntityConfigs: the children of
        /config/<entity_type>, then each one's configs; one that vanished meanwhile is {})."""
        names = await self.zk.children(f"{CONFIG_PATH}/{entity_type}")
        configs = await asyncio.gather(*(self.zk.get_entity_config(entity_type, name) for name in names))
        return {f"{entity_type}/{name}": config for name, config in zip(names, configs)}

    async def _write_entity_config(self, entity_type: str, name: str, configs: dict[str, str],
                                   version: int | None) -> None:
        try:
            await self.zk.set_entity_config(entity_type, name, configs, version=version)
        except StaleZkVersion as exc:
            raise StaleConfigVersion(str(exc)) from exc

    async def set_broker_configs_async(self, entity: str, configs: dict[str, str], *,
                                       version: int | None = None) -> None:
        """ZkAdminManager.alterBrokerConfigs: write ``/config/brokers/<entity>`` (conditional on ``version``,
        see ClusterMetadata) and the notification; applied here at once when it is the default or this
        broker and no read started meanwhile (the notification re-reads it)."""
        generation = self._broker_config_generation.get(entity)
        await self._write_entity_config("brokers", entity, configs, version)
        if entity in self._broker_entities() and self._broker_config_generation.get(entity) == generation:
            self._broker_config_generation[entity] = next(self._generations)
            self._apply_broker_configs(entity, configs)

    async def set_topic_configs_async(self, name: str, configs: dict[str, str], *, version: int | None = None) -> None:
        """AdminZkClient.changeTopicConfig, then the change applied here at once (others: by notification),
        if the topic is still known and its generation unchanged: a topic deleted during the write must not
        keep these overrides for a topic created again with its name, and a read started meanwhile (a
        notification) has the newer word."""
        generation = self._config_generation.get(name)
        await self._write_entity_config("topics", name, configs, version)
        if name not in self._topics or generation is None or self._config_generation.get(name) != generation:
            return
        self._config_generation[name] = next(self._generations)  # a read in flight is stale
        self._configs[name] = dict(configs)
        self._topics[name].configs = self._configs[name]
        for callback in list(self._config_listeners):
            callback(name)

    # -- admin writes (AdminZkClient) -------------------------------------------------------------
    async def create_topic_async(self, name: str, partitions: int, replication_factor: int,
                                 configs: dict[str, str], assignment: dict[int, list[int]] | None = None) -> None:
        """Write the topic to ZooKeeper (config, then assignment with a new topic id): the replicas as
        ``assignment`` names them (the controller creates the partitions from it), else placed as Kafka's
        AdminUtils does."""
        found = await self.zk.get_or_none(delete_topic_path(name))
        if found is not None:
            raise KafkaError(ErrorCode.topic_already_exists, f"Topic '{name}' is marked for deletion.")
        colliding = sorted(
            other for other in await self.zk.all_topics()
            if other != name and collision_key(other) == collision_key(name)
        )
        if colliding:
            raise KafkaError(
                ErrorCode.invalid_topic_exception, f"Topic '{name}' collides with existing topics: {', '.join(colliding)}"
            )
        brokers = [b.broker_id for b in self.brokers()]
        if assignment is None:
            if replication_factor > len(brokers):  # the live brokers changed since TopicAdmin's check
                raise KafkaError(
                    ErrorCode.invalid_replication_factor,
                    f"Replication factor: {replication_factor} larger than available brokers: {len(brokers)}.",
                )
            assignment = assign_replicas_to_brokers(brokers, partitions, replication_factor)
        try:
            await self.zk.create_topic(name, assignment, uuid.uuid4(), configs)
        except TopicExists:
            raise KafkaError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.") from None

    async def delete_topic_async(self, name: str) -> None:
        """Mark the topic for deletion; the controller deletes it and tells the brokers."""
        await self.zk.mark_topic_for_deletion(name)

    def not_an_increase(self, name: str, current: int, requested: int) -> KafkaError:
        """ZkAdminManager.createPartitions' messages (Kafka 3.7.1 in ZooKeeper mode)."""
        if requested == current:
            return KafkaError(ErrorCode.invalid_partitions, f"Topic already has {current} partitions.")
        return KafkaError(ErrorCode.invalid_partitions,
                          f"Topic currently has {current} partitions, which is higher than the requested {requested}.")

    async def add_partitions_async(self, name: str, total: int,
                                   assignment: dict[int, list[int]] | None = None) -> None:
        """Rewrite the assignment znode with ``total`` partitions, conditional on the version read; the new
        partitions' replicas as ``assignment`` names them, else placed as Kafka's AdminUtils does."""
        for _ in range(_ASSIGNMENT_WRITE_ATTEMPTS):
            current = await self.zk.get_topic_assignment(name)
            if current is None:
                raise KafkaError(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
            if any(current.adding_replicas.values()) or any(current.removing_replicas.values()):
                raise KafkaError(ErrorCode.reassignment_in_progress,
                                 f"A partition reassignment is in progress for the topic '{name}'.")
            existing = len(current.partitions)
            if total <= existing:
                raise self.not_an_increase(name, existing, total)
            brokers = sorted(b.broker_id for b in self.brokers())
            first = current.partitions.get(0, [])
            replication_factor = len(first)
            if not 0 < replication_factor <= len(brokers):
                raise KafkaError(
                    ErrorCode.invalid_replication_factor,
                    f"Replication factor: {replication_factor} larger than available brokers: {len(brokers)}.",
                )
            if assignment is not None:
                if sorted(assignment) != list(range(existing, total)):  # partitions added since TopicAdmin's check
                    raise KafkaError(ErrorCode.invalid_replica_assignment,
                                     f"Attempted to add {total - existing} additional partition(s), but only "
                                     f"{len(assignment)} assignment(s) were specified.")
                added = assignment
            else:
                start = next((i for i, b in enumerate(brokers) if b >= first[0]), 0)
                added = assign_replicas_to_brokers(
                    brokers, total - existing, replication_factor, start_index=start, start_partition=existing
                )
            updated = TopicAssignment(name, current.topic_id, {**current.partitions, **added})
            try:
                await self.zk.set_topic_assignment(name, updated, current.zk_version, -1)
                return
            except StaleZkVersion:
                continue  # another write came in between: read again
        raise KafkaError(ErrorCode.unknown_server_error, f"The assignment of topic '{name}' kept changing; try again.")

    def _spawn(self, work) -> None:
        if self._closed:
            work.close()
            return
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _changed_entity(data: bytes | None) -> tuple[str, str] | None:
    """The (entity type, name) a config change notification names: v2 ``{"entity_path":"topics/<t>"}``
    (``brokers/<id>``, ...), v1 ``{"entity_type":"topics","entity_name":"<t>"}``; None if malformed."""
    try:
        doc = json.loads(data) if data else None
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    path = doc.get("entity_path")
    if isinstance(path, str):
        kind, _, name = path.partition("/")
        return (kind, name) if kind and name else None
    if isinstance(doc.get("entity_type"), str) and isinstance(doc.get("entity_name"), str):
        return doc["entity_type"], doc["entity_name"]
    return None


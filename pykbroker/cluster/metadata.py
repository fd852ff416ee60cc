"""Cluster metadata: brokers, topics (with stable UUIDs), partition leadership and topic config overrides.

``ClusterMetadata`` is what the rest of the broker asks; ``EmbeddedMetadata`` is the single-node backend,
persisted in the data dir so topic ids and configs survive restarts; ``ZkMetadata`` (zk_metadata.py) is
the cluster backend, a cache of what the controller sends. Both make admin changes the same way for
TopicAdmin: ``create_topic_async`` / ``delete_topic_async`` / ``add_partitions_async`` make a change
durable, ``wait_until`` awaits its visibility (here: at once, the change is applied in memory when made),
and ``local_leadership`` says whether this broker decides leadership and hosts partitions itself (here:
yes; in cluster mode LeaderAndIsr from the controller does). Files, as Kafka lays them out where it can:
    <data-dir>/meta.properties               cluster.id, node.id (Kafka's format)
    <data-dir>/__cluster_metadata.snapshot   topics, partition states, config overrides ...
    <data-dir>/__cluster_metadata.log        ... and the changes since (see metadata_log.py)

Dynamic broker configs (AlterConfigs on a BROKER resource) are kept per entity, Kafka's ZooKeeper names:
``DEFAULT_BROKER_ENTITY`` ("<default>", the cluster-wide default) or a broker id ("1"); both backends
store them (here in the journal, in ZooKeeper under /config/brokers/<entity>) and tell the broker config
listeners; cluster/dynamic_configs.py turns them into the broker's effective configuration.

Client entity configs (Kafka's ``/config/users/<user>``, ``/config/users/<user>/clients/<client>``,
``/config/clients/<client>``, ``/config/ips/<ip>``: SCRAM credentials and client quotas) are kept by entity
path, the sanitized path under /config (``users/alice``, ``users/<default>/clients/app``); both backends store
them (here in the journal, in ZooKeeper under /config with change notifications) and tell the listeners of
``add_client_entity_listener``, which pykbroker/security/client_entities.py feeds to the SCRAM credential
cache and the client quotas.

Group configs (the GROUP config resource, Kafka 4's per-group overrides, pykbroker/groups/configs.py) are kept
by group id; both backends store them (here in the journal as entity ``groups/<group>``, in ZooKeeper under
``/config/groups/<sanitized group>`` with change notifications) and tell the listeners of
``add_group_config_listener``.

Changes are applied in memory at once (so the next request sees them) and journalled; ``commit`` returns
a future that completes when they are durable, which CreateTopics and friends await before answering.
Topic names that differ only by '.' versus '_' collide (Kafka's rule: both map to the same metric
names), so the store indexes names by that key to answer ``colliding_topics`` in O(1).
"""

from __future__ import annotations

import base64
import re
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from pykbroker.cluster.metadata_log import RESTORE_HINT, MetadataLog
from pykbroker.log.checkpoint import CorruptFile, write_atomically
from pykbroker.protocol.errors import ErrorCode, KafkaError

TOPIC_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME_LENGTH = 249
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
# The entity types under /config that hold client entity configs (SCRAM credentials, client quotas).
CLIENT_ENTITY_TYPES = ("users", "clients", "ips")
GROUP_ENTITY_PREFIX = "groups/"  # group configs: the entity ``groups/<group>``


def client_entity_type(entity_path: str) -> str | None:
    """The entity type of a client entity path (``users/alice/clients/app`` -> "users"), None for another."""
    kind, _, name = entity_path.partition("/")
    return kind if kind in CLIENT_ENTITY_TYPES and name else None

# Each internal topic's role in words and the broker config setting its replication factor.
INTERNAL_TOPIC_ROLES = {
    "__consumer_offsets": ("the offsets topic", "offsets.topic.replication.factor"),
    "__transaction_state": ("the transaction state topic", "transaction.state.log.replication.factor"),
}


def internal_topic_shortfall(name: str, live_brokers: int, replication_factor: int) -> str:
    """Why internal topic ``name`` cannot be created while ``live_brokers`` are fewer than its replication
    factor: a broker's FindCoordinator error_message and log line, and the CLI's and console's explanation."""
    role, key = INTERNAL_TOPIC_ROLES[name]
    return (f"{role} {name} cannot be created yet: {live_brokers} live broker{'s' if live_brokers != 1 else ''}, "
            f"{key}={replication_factor} (start the missing brokers, or lower {key})")
DEFAULT_BROKER_ENTITY = "<default>"  # Kafka's ConfigEntityName.Default: the cluster-wide broker configs


def topic_name_error(name: str | None) -> str | None:
    """Why ``name`` is not a legal topic name (Kafka's Topic.validate), or None if it is."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return "Topic name cannot be \".\" or \"..\""
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters"
    if not TOPIC_NAME_PATTERN.match(name):
        return f"Topic name \"{name}\" is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
    return None


def collision_key(name: str) -> str:
    """Kafka's Topic.unifyCollisionChars: '.' and '_' are the same character in metric names."""
    return name.replace(".", "_")


@dataclass(frozen=True, slots=True)
class BrokerEndpoint:
    broker_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(slots=True)
class PartitionState:
    """A partition's leadership. ``offline_replicas`` (replicas on dead brokers, Metadata v5+) and
    ``partition_epoch`` (the zkVersion of its state znode) come from UpdateMetadata in cluster mode; the
    single node has neither, and does not persist them."""

    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    offline_replicas: list[int] = field(default_factory=list)
    partition_epoch: int = 0

    def to_json(self) -> dict:
        return {"leader": self.leader, "leader_epoch": self.leader_epoch, "replicas": self.replicas, "isr": self.isr}

    @classmethod
    def from_json(cls, data: dict) -> "PartitionState":
        return cls(data["leader"], data["leader_epoch"], list(data["replicas"]), list(data["isr"]))


@dataclass(slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: list[PartitionState]
    configs: dict[str, str] = field(default_factory=dict)  # overrides only; defaults come from the broker

    @property
    def internal(self) -> bool:
        return self.name in INTERNAL_TOPICS

    @property
    def replication_factor(self) -> int:
        return len(self.partitions[0].replicas) if self.partitions else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topic_id": str(self.topic_id),
            "partitions": [p.to_json() for p in self.partitions],
            "configs": self.configs,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "TopicInfo":
        return cls(
            data["name"],
            uuid.UUID(data["topic_id"]),
            [PartitionState.from_json(p) for p in data["partitions"]],
            {str(k): str(v) for k, v in data.get("configs", {}).items()},
        )


class StaleConfigVersion(Exception):
    """A conditional config write found the configs changed since they were read: read again and retry."""


class ClusterMetadata(Protocol):
    """What handlers and TopicAdmin ask, in both modes. ``controller_id`` is -1 while no controller is
    known; ``brokers`` are the live brokers (one endpoint each)."""

    cluster_id: str
    controller_id: int
    local_leadership: bool
    topics_version: int  # goes up whenever a topic is created, deleted or changed

    def brokers(self) -> list[BrokerEndpoint]: ...
    def topics(self) -> list[TopicInfo]: ...
    def topic(self, name: str) -> TopicInfo | None: ...
    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None: ...
    def topic_configs(self, name: str) -> dict[str, str] | None: ...  # a topic's overrides, None if unknown
    def colliding_topics(self, name: str) -> list[str]: ...
    def partition_count(self) -> int: ...
    # CreatePartitions asking for no more partitions than the topic has: INVALID_PARTITIONS, worded as this
    # mode's Kafka words it
    def not_an_increase(self, name: str, current: int, requested: int) -> KafkaError: ...
    # ``assignment``: partition -> replicas named by the client (TopicAdmin validated it), else the backend's own
    async def create_topic_async(self, name: str, partitions: int, replication_factor: int,
                                 configs: dict[str, str], assignment: dict[int, list[int]] | None = None) -> None: ...
    async def delete_topic_async(self, name: str) -> None: ...
    async def add_partitions_async(self, name: str, total: int,
                                   assignment: dict[int, list[int]] | None = None) -> None: ...
    async def wait_until(self, condition: Callable[[], bool], timeout_s: float) -> bool: ...
    def add_config_listener(self, callback: Callable[[str], None]) -> None: ...
    # Read-modify-write of an entity's configs (``topics``/<topic> or ``brokers``/<entity>): the stored
    # configs and a version from the store itself (not a cache); the set_* with ``version`` raise
    # StaleConfigVersion if the configs changed since, with None they write whatever is there.
    async def read_entity_configs_async(self, entity_type: str, name: str) -> tuple[dict[str, str], int | None]: ...
    async def set_topic_configs_async(self, name: str, configs: dict[str, str], *, version: int | None = None) -> None: ...
    def broker_configs(self, entity: str) -> dict[str, str]: ...  # DEFAULT_BROKER_ENTITY or a broker id
    async def set_broker_configs_async(self, entity: str, configs: dict[str, str], *,
                                       version: int | None = None) -> None: ...
    def add_broker_config_listener(self, callback: Callable[[str, dict[str, str]], None]) -> None: ...
    # Client entity configs by entity path (users/<u>, users/<u>/clients/<c>, clients/<c>, ips/<ip>):
    def client_entity_configs(self) -> dict[str, dict[str, str]]: ...
    async def set_client_entity_configs_async(self, entity_path: str, configs: dict[str, str], *,
                                              version: int | None = None) -> None: ...
    def add_client_entity_listener(self, callback: Callable[[str, dict[str, str]], None]) -> None: ...
    # Group configs by group id (read-modify-write through read_entity_configs_async("groups", <group>)):
    def group_configs(self) -> dict[str, dict[str, str]]: ...
    async def set_group_configs_async(self, group_id: str, configs: dict[str, str], *,
                                      version: int | None = None) -> None: ...
    def add_group_config_listener(self, callback: Callable[[str, dict[str, str]], None]) -> None: ...
    def commit(self) -> Future: ...


def new_cluster_id() -> str:
    """Kafka's format: a random UUID as 22 characters of URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class TopicIndex:
    """Topics by name, by id and by collision key, and their partition count: what both metadata backends
    answer from memory (EmbeddedMetadata from its journal, ZkMetadata from the controller's UpdateMetadata)."""

    def __init__(self) -> None:
        self._topics: dict[str, TopicInfo] = {}
        self._by_id: dict[uuid.UUID, TopicInfo] = {}
        self._by_collision_key: dict[str, set[str]] = {}
        self._partitions = 0
        self.topics_version = 0  # goes up on every change of the topics (consumer groups recompute on it)

    def _index(self, info: TopicInfo) -> None:
        """Add or replace a topic (a topic id of all zeros, not known yet, is not indexed by id)."""
        self._unindex(info.name)
        self.topics_version += 1
        self._topics[info.name] = info
        if info.topic_id.int != 0:
            self._by_id[info.topic_id] = info
        self._by_collision_key.setdefault(collision_key(info.name), set()).add(info.name)
        self._partitions += len(info.partitions)

    def _unindex(self, name: str) -> TopicInfo | None:
        info = self._topics.pop(name, None)
        if info is None:
            return None
        self.topics_version += 1
        if self._by_id.get(info.topic_id) is info:
            del self._by_id[info.topic_id]
        names = self._by_collision_key[collision_key(name)]
        names.discard(name)
        if not names:
            del self._by_collision_key[collision_key(name)]
        self._partitions -= len(info.partitions)
        return info

    def topics(self) -> list[TopicInfo]:
        return list(self._topics.values())

    def topic(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self._by_id.get(topic_id)

    def colliding_topics(self, name: str) -> list[str]:
        """Existing topics other than ``name`` whose names differ from it only by '.' versus '_'."""
        return sorted(other for other in self._by_collision_key.get(collision_key(name), ()) if other != name)

    def partition_count(self) -> int:
        """Partitions of every topic together."""
        return self._partitions


class EmbeddedMetadata(TopicIndex):
    """Single-node metadata: this broker is the only broker, the controller and every partition's leader."""

    local_leadership = True  # this broker leads every partition and hosts it itself (TopicAdmin does)

    def __init__(self, data_dir: Path, broker_id: int, host: str, port: int) -> None:
        self.data_dir = data_dir
        self.broker_id = broker_id
        self.controller_id = broker_id
        self._config_listeners: list[Callable[[str], None]] = []
        self._broker_configs: dict[str, dict[str, str]] = {}  # entity -> dynamic broker configs
        self._broker_config_listeners: list[Callable[[str, dict[str, str]], None]] = []
        self._client_entities: dict[str, dict[str, str]] = {}  # entity path -> configs (users/alice, ...)
        self._client_entity_listeners: list[Callable[[str, dict[str, str]], None]] = []
        self._group_configs: dict[str, dict[str, str]] = {}  # group id -> configs
        self._group_config_listeners: list[Callable[[str, dict[str, str]], None]] = []
        self._endpoint = BrokerEndpoint(broker_id, host, port)
        self._init_acls()
        super().__init__()
        self.cluster_id = self._load_meta_properties()
        self._log = MetadataLog(data_dir)
        self._load_state()

    # -- persistence ------------------------------------------------------------------------------
    def _load_meta_properties(self) -> str:
        cluster_id = read_meta_properties(self.data_dir, self.broker_id)
        if cluster_id is None:
            cluster_id = new_cluster_id()
            write_meta_properties(self.data_dir, cluster_id, self.broker_id, kraft_style=True)
        return cluster_id

    def _load_state(self) -> None:
        topics, records = self._log.load()
        try:
            for entry in topics:
                self._index(TopicInfo.from_json(entry))
            for record in records:
                if record["op"] == "topic":
                    self._index(TopicInfo.from_json(record["topic"]))
                elif record["op"] == "acl":
                    self._replay_acl(record)
                elif record["op"] == "config":
                    entity = record["entity"]
                    configs = {str(k): str(v) for k, v in record["config"].items()}
                    if entity.startswith("brokers/"):
                        store, entity = self._broker_configs, entity[len("brokers/"):]
                    elif client_entity_type(entity) is not None:
                        store = self._client_entities
                    elif entity.startswith(GROUP_ENTITY_PREFIX):
                        store, entity = self._group_configs, entity[len(GROUP_ENTITY_PREFIX):]
                    else:
                        raise ValueError(f"a config record of an unknown entity {entity!r}")
                    if configs:
                        store[entity] = configs
                    else:
                        store.pop(entity, None)
                elif record["name"] in self._topics:
                    self._unindex(record["name"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptFile(
                self._log.snapshot_path, f"or {self._log.journal_path.name} holds a malformed topic entry ({exc!r})",
                RESTORE_HINT,
            ) from None

    def _journal(self, info: TopicInfo) -> None:
        self._log.append({"op": "topic", "topic": info.to_json()})

    def commit(self) -> Future:
        """Make every change so far durable, off the event loop; the future completes when it is."""
        return self._log.commit(
            len(self._topics), lambda: [info.to_json() for info in self._topics.values()],
            lambda: {**{f"brokers/{entity}": dict(configs) for entity, configs in self._broker_configs.items()},
                     **{path: dict(configs) for path, configs in self._client_entities.items()},
                     **{GROUP_ENTITY_PREFIX + group: dict(configs) for group, configs in self._group_configs.items()}},
            acls_of=self._acl_records,
        )

    def close(self) -> None:
        self.commit()
        self._log.close()

    # -- queries ----------------------------------------------------------------------------------
    def brokers(self) -> list[BrokerEndpoint]:
        return [self._endpoint]

    def topic_configs(self, name: str) -> dict[str, str] | None:
        info = self._topics.get(name)
        return info.configs if info is not None else None

    # -- changes ----------------------------------------------------------------------------------
    def _new_partition(self) -> PartitionState:
        return PartitionState(self.broker_id, 0, [self.broker_id], [self.broker_id])

    def create_topic(self, name: str, partitions: int, replication_factor: int, configs: dict[str, str]) -> TopicInfo:
        if name in self._topics:
            raise ValueError(f"topic {name} exists")
        info = TopicInfo(name, uuid.uuid4(), [self._new_partition() for _ in range(partitions)], dict(configs))
        self._index(info)
        self._journal(info)
        return info

    def delete_topic(self, name: str) -> None:
        info = self._topics[name]
        self._unindex(name)
        self._log.append({"op": "delete", "name": name, "topic_id": str(info.topic_id)})

    def not_an_increase(self, name: str, current: int, requested: int) -> KafkaError:
        """KRaft's ReplicationControlManager.createPartitions messages (Kafka 3.7.1)."""
        if requested == current:
            return KafkaError(ErrorCode.invalid_partitions, f"Topic already has {current} partition(s).")
        return KafkaError(ErrorCode.invalid_partitions, f"The topic {name} currently has {current} partition(s); "
                                                        f"{requested} would not be an increase.")

    def add_partitions(self, name: str, total: int) -> TopicInfo:
        info = self._topics[name]
        added = total - len(info.partitions)
        info.partitions.extend(self._new_partition() for _ in range(added))
        self._partitions += added
        self.topics_version += 1
        self._journal(info)
        return info

    def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        info = self._topics[name]
        info.configs = dict(configs)
        self._journal(info)
        for callback in self._config_listeners:
            callback(name)

    def add_config_listener(self, callback: Callable[[str], None]) -> None:
        """``callback(topic)`` after a topic's config overrides changed."""
        self._config_listeners.append(callback)

    async def read_entity_configs_async(self, entity_type: str, name: str) -> tuple[dict[str, str], int | None]:
        """The stored configs (this journal is the store: no version needed, nothing else writes it)."""
        if entity_type == "topics":
            return dict(self.topic_configs(name) or {}), None
        if entity_type in CLIENT_ENTITY_TYPES:
            return dict(self._client_entities.get(f"{entity_type}/{name}", {})), None
        if entity_type + "/" == GROUP_ENTITY_PREFIX:
            return dict(self._group_configs.get(name, {})), None
        return self.broker_configs(name), None

    async def set_topic_configs_async(self, name: str, configs: dict[str, str], *, version: int | None = None) -> None:
        self.set_topic_configs(name, configs)

    def broker_configs(self, entity: str) -> dict[str, str]:
        """The dynamic broker configs of ``entity`` (DEFAULT_BROKER_ENTITY or a broker id), as stored."""
        return dict(self._broker_configs.get(entity, {}))

    def set_broker_configs(self, entity: str, configs: dict[str, str]) -> None:
        """Replace ``entity``'s dynamic broker configs (empty: remove them), journal, tell the listeners."""
        if configs:
            self._broker_configs[entity] = dict(configs)
        else:
            self._broker_configs.pop(entity, None)
        self._log.append({"op": "config", "entity": f"brokers/{entity}", "config": dict(configs)})
        for callback in list(self._broker_config_listeners):
            callback(entity, dict(configs))

    async def set_broker_configs_async(self, entity: str, configs: dict[str, str], *,
                                       version: int | None = None) -> None:
        self.set_broker_configs(entity, configs)

    def add_broker_config_listener(self, callback: Callable[[str, dict[str, str]], None]) -> None:
        """``callback(entity, configs)`` after an entity's dynamic broker configs changed."""
        self._broker_config_listeners.append(callback)

    def client_entity_configs(self) -> dict[str, dict[str, str]]:
        """Every client entity's configs by entity path (users/alice, clients/app, ...), as stored."""
        return {path: dict(configs) for path, configs in self._client_entities.items()}

    async def set_client_entity_configs_async(self, entity_path: str, configs: dict[str, str], *,
                                              version: int | None = None) -> None:
        """Replace a client entity's configs (empty: remove it), journal, tell the listeners."""
        if client_entity_type(entity_path) is None:
            raise ValueError(f"not a client entity path: {entity_path!r}")
        if configs:
            self._client_entities[entity_path] = dict(configs)
        else:
            self._client_entities.pop(entity_path, None)
        self._log.append({"op": "config", "entity": entity_path, "config": dict(configs)})
        for callback in list(self._client_entity_listeners):
            callback(entity_path, dict(configs))

    def add_client_entity_listener(self, callback: Callable[[str, dict[str, str]], None]) -> None:
        """``callback(entity_path, configs)`` after a client entity's configs changed ({}: removed)."""
        self._client_entity_listeners.append(callback)

    def group_configs(self) -> dict[str, dict[str, str]]:
        """Every group's configs by group id, as stored."""
        return {group: dict(configs) for group, configs in self._group_configs.items()}

    async def set_group_configs_async(self, group_id: str, configs: dict[str, str], *,
                                      version: int | None = None) -> None:
        """Replace a group's configs (empty: remove them), journal, tell the listeners."""
        if configs:
            self._group_configs[group_id] = dict(configs)
        else:
            self._group_configs.pop(group_id, None)
        self._log.append({"op": "config", "entity": GROUP_ENTITY_PREFIX + group_id, "config": dict(configs)})
        for callback in list(self._group_config_listeners):
            callback(group_id, dict(configs))

    def add_group_config_listener(self, callback: Callable[[str, dict[str, str]], None]) -> None:
        """``callback(group_id, configs)`` after a group's configs changed ({}: removed)."""
        self._group_config_listeners.append(callback)

    # -- the admin interface both backends share (see the module docstring) ---------------------------
    async def create_topic_async(self, name: str, partitions: int, replication_factor: int,
                                 configs: dict[str, str], assignment: dict[int, list[int]] | None = None) -> None:
        # An assignment validated here can only name this broker, which hosts every partition anyway.
        self.create_topic(name, partitions, replication_factor, configs)

    async def delete_topic_async(self, name: str) -> None:
        self.delete_topic(name)

    async def add_partitions_async(self, name: str, total: int,
                                   assignment: dict[int, list[int]] | None = None) -> None:
        self.add_partitions(name, total)

    # -- ACLs (the authorizer's store on a single node: cluster/acls.py EmbeddedAclStore) ----------------
    # One "acl" record per change holds one resource pattern's whole ACL set, as Kafka's ZooKeeper mode keeps
    # one znode per pattern: {"op": "acl", "pattern": [resource type, pattern type, name], "acls": [entry
    # objects as in the znode's "acls" list]}; an empty list removes the pattern. Opaque here: the codecs
    # are security/acl_store.py's.
    def _init_acls(self) -> None:
        self._acls: dict[tuple[str, str, str], list[dict[str, str]]] = {}

    def _replay_acl(self, record: dict[str, Any]) -> None:
        resource_type, pattern_type, name = record["pattern"]
        acls = record["acls"]
        if not isinstance(acls, list) or not all(isinstance(a, str) for a in (resource_type, pattern_type, name)):
            raise ValueError(f"malformed acl record for {record['pattern']!r}")
        self._set_acls((resource_type, pattern_type, name), acls)

    def _set_acls(self, key: tuple[str, str, str], acls: list[dict[str, str]]) -> None:
        if acls:
            self._acls[key] = list(acls)
        else:
            self._acls.pop(key, None)

    def _acl_records(self) -> list[dict[str, Any]]:
        return [{"op": "acl", "pattern": list(key), "acls": acls} for key, acls in self._acls.items()]

    def acl_sets(self) -> list[tuple[tuple[str, str, str], list[dict[str, str]]]]:
        """Every stored pattern (resource type, pattern type, name) with its ACL entry objects."""
        return list(self._acls.items())

    def set_acls(self, key: tuple[str, str, str], acls: list[dict[str, str]]) -> Future:
        """Replace one pattern's ACL set (empty: remove it); the future completes when it is durable."""
        self._set_acls(key, acls)
        self._log.append({"op": "acl", "pattern": list(key), "acls": list(acls)})
        return self.commit()

    async def wait_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Changes are visible as soon as they are made: nothing to wait for."""
        return condition()


_META_PROPERTIES_HINT = "restore it from a backup, or write cluster.id=<id> and node.id=<broker id> lines"
META_PROPERTIES = "meta.properties"


def meta_properties(data_dir: Path) -> dict[str, str] | None:
    """The keys of ``<data-dir>/meta.properties``, None if there is no such file; CorruptFile (one line) if it
    cannot be read."""
    path = data_dir / META_PROPERTIES
    try:
        text = path.read_bytes().decode()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise CorruptFile(path, "is not text", _META_PROPERTIES_HINT) from None
    props: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, equals, value = line.partition("=")
        if not equals:
            raise CorruptFile(path, f"line {number} is not key=value", _META_PROPERTIES_HINT)
        props[key.strip()] = value.strip()
    return props


def read_meta_properties(data_dir: Path, broker_id: int) -> str | None:
    """The cluster id stored in ``<data-dir>/meta.properties``, None if there is no such file. Raises
    CorruptFile (one line) if it cannot be read or belongs to another broker id."""
    path = data_dir / META_PROPERTIES
    props = meta_properties(data_dir)
    if props is None:
        return None
    if not props.get("cluster.id"):
        raise CorruptFile(path, "has no cluster.id", _META_PROPERTIES_HINT)
    raw_id = props.get("node.id", props.get("broker.id", str(broker_id)))
    try:
        stored_id = int(raw_id)
    except ValueError:
        raise CorruptFile(path, f"has a node.id that is not a number ({raw_id!r})", _META_PROPERTIES_HINT) from None
    if stored_id != broker_id:
        raise CorruptFile(
            path, f"belongs to broker {stored_id}, not {broker_id}",
            f"start with --broker-id {stored_id}, or use another data dir",
        )
    return props["cluster.id"]


def write_meta_properties(data_dir: Path, cluster_id: str, broker_id: int, *, kraft_style: bool) -> None:
    """Kafka's two formats: version 1 with node.id (KRaft; the single node), version 0 with broker.id
    (ZooKeeper mode)."""
    if kraft_style:
        text = f"#pykbroker\nversion=1\ncluster.id={cluster_id}\nnode.id={broker_id}\n"
    else:
        text = f"#pykbroker\nversion=0\nbroker.id={broker_id}\ncluster.id={cluster_id}\n"
    write_atomically(data_dir / META_PROPERTIES, text)

"""Cluster metadata: brokers, topics (with stable UUIDs), partition leadership and topic config overrides.

``ClusterMetadata`` is what the rest of the broker asks; ``EmbeddedMetadata`` is the single-node backend,
persisted in the data dir so topic ids and configs survive restarts (a ZooKeeper backend implements the
same interface for cluster mode). Files, as Kafka lays them out where it can:
    <data-dir>/meta.properties          cluster.id, node.id (Kafka's format)
    <data-dir>/__cluster_metadata.json   topics, partition states, config overrides
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pykbroker.log.checkpoint import write_atomically

TOPIC_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME_LENGTH = 249
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


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


@dataclass(frozen=True, slots=True)
class BrokerEndpoint:
    broker_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(slots=True)
class PartitionState:
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]

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


class ClusterMetadata(Protocol):
    cluster_id: str
    controller_id: int

    def brokers(self) -> list[BrokerEndpoint]: ...
    def topics(self) -> list[TopicInfo]: ...
    def topic(self, name: str) -> TopicInfo | None: ...
    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None: ...
    def create_topic(self, name: str, partitions: int, replication_factor: int, configs: dict[str, str]) -> TopicInfo: ...
    def delete_topic(self, name: str) -> None: ...
    def add_partitions(self, name: str, total: int) -> TopicInfo: ...
    def set_topic_configs(self, name: str, configs: dict[str, str]) -> None: ...


def new_cluster_id() -> str:
    """Kafka's format: a random UUID as 22 characters of URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class EmbeddedMetadata:
    """Single-node metadata: this broker is the only broker, the controller and every partition's leader."""

    STATE_FILE = "__cluster_metadata.json"

    def __init__(self, data_dir: Path, broker_id: int, host: str, port: int) -> None:
        self.data_dir = data_dir
        self.broker_id = broker_id
        self.controller_id = broker_id
        self._endpoint = BrokerEndpoint(broker_id, host, port)
        self._topics: dict[str, TopicInfo] = {}
        self._by_id: dict[uuid.UUID, TopicInfo] = {}
        self.cluster_id = self._load_meta_properties()
        self._load_state()

    # -- persistence ------------------------------------------------------------------------------
    def _load_meta_properties(self) -> str:
        path = self.data_dir / "meta.properties"
        if path.exists():
            props = dict(
                line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and not line.startswith("#")
            )
            stored_id = int(props.get("node.id", props.get("broker.id", self.broker_id)))
            if stored_id != self.broker_id:
                raise RuntimeError(
                    f"{path} belongs to broker {stored_id}, not {self.broker_id}: refusing to mix data dirs"
                )
            return props["cluster.id"]
        cluster_id = new_cluster_id()
        write_atomically(path, f"#pykbroker\nversion=1\ncluster.id={cluster_id}\nnode.id={self.broker_id}\n")
        return cluster_id

    def _load_state(self) -> None:
        path = self.data_dir / self.STATE_FILE
        if not path.exists():
            return
        data = json.loads(path.read_text())
        for entry in data["topics"]:
            info = TopicInfo(
                entry["name"],
                uuid.UUID(entry["topic_id"]),
                [PartitionState.from_json(p) for p in entry["partitions"]],
                dict(entry.get("configs", {})),
            )
            self._index(info)

    def _save(self) -> None:
        data = {
            "version": 1,
            "topics": [
                {
                    "name": info.name,
                    "topic_id": str(info.topic_id),
                    "partitions": [p.to_json() for p in info.partitions],
                    "configs": info.configs,
                }
                for info in self._topics.values()
            ],
        }
        write_atomically(self.data_dir / self.STATE_FILE, json.dumps(data, indent=1))

    def _index(self, info: TopicInfo) -> None:
        self._topics[info.name] = info
        self._by_id[info.topic_id] = info

    # -- queries ----------------------------------------------------------------------------------
    def brokers(self) -> list[BrokerEndpoint]:
        return [self._endpoint]

    def topics(self) -> list[TopicInfo]:
        return list(self._topics.values())

    def topic(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self._by_id.get(topic_id)

    # -- changes ----------------------------------------------------------------------------------
    def _new_partition(self) -> PartitionState:
        return PartitionState(self.broker_id, 0, [self.broker_id], [self.broker_id])

    def create_topic(self, name: str, partitions: int, replication_factor: int, configs: dict[str, str]) -> TopicInfo:
        if name in self._topics:
            raise ValueError(f"topic {name} exists")
        info = TopicInfo(name, uuid.uuid4(), [self._new_partition() for _ in range(partitions)], dict(configs))
        self._index(info)
        self._save()
        return info

    def delete_topic(self, name: str) -> None:
        info = self._topics.pop(name)
        self._by_id.pop(info.topic_id, None)
        self._save()

    def add_partitions(self, name: str, total: int) -> TopicInfo:
        info = self._topics[name]
        info.partitions.extend(self._new_partition() for _ in range(total - len(info.partitions)))
        self._save()
        return info

    def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        self._topics[name].configs = dict(configs)
        self._save()

"""Topic lifecycle: create (explicitly or by auto-creation), add partitions, delete, resolve configs.

Handlers for Metadata, CreateTopics, CreatePartitions and DeleteTopics all come here, so the rules
(legal names, partition counts, replication factor against live brokers, valid configs) live once.
"""

from __future__ import annotations

import logging
from typing import Any

from pykbroker.cluster.metadata import ClusterMetadata, TopicInfo, topic_name_error
from pykbroker.config import TOPIC_CONFIGS, BrokerConfig, ConfigError, ConfigSource, validate_topic_configs
from pykbroker.log.config import LogConfig
from pykbroker.protocol.errors import ErrorCode, KafkaError
from pykbroker.replication.replica_manager import ReplicaManager

log = logging.getLogger(__name__)

MAX_PARTITIONS = 100_000


class TopicAdmin:
    def __init__(self, config: BrokerConfig, metadata: ClusterMetadata, replicas: ReplicaManager) -> None:
        self.config = config
        self.metadata = metadata
        self.replicas = replicas
        self._effective_cache: dict[str, dict[str, Any]] = {}

    # -- configs ----------------------------------------------------------------------------------
    def _overrides(self, name: str) -> dict[str, str]:
        info = self.metadata.topic(name)
        return info.configs if info is not None else {}

    def effective_configs(self, name: str) -> dict[str, tuple[Any, ConfigSource]]:
        """Every topic config with its typed value and DescribeConfigs source."""
        overrides = validate_topic_configs(self._overrides(name))
        result: dict[str, tuple[Any, ConfigSource]] = {}
        for key in TOPIC_CONFIGS:
            if key in overrides:
                result[key] = (overrides[key], ConfigSource.DYNAMIC_TOPIC_CONFIG)
            else:
                result[key] = self.config.topic_config_source(key)
        return result

    def _effective(self, name: str) -> dict[str, Any]:
        # Produce asks for min.insync.replicas on every request: resolve a topic's configs once, and
        # forget them whenever the topic is created, deleted or reconfigured.
        effective = self._effective_cache.get(name)
        if effective is None:
            effective = self._effective_cache[name] = self.config.effective_topic_config(self._overrides(name))
        return effective

    def log_config(self, name: str) -> LogConfig:
        return LogConfig.from_topic_configs(self._effective(name))

    def min_insync_replicas(self, name: str) -> int:
        return int(self._effective(name)["min.insync.replicas"])

    # -- lifecycle --------------------------------------------------------------------------------
    def create(
        self,
        name: str,
        partitions: int = -1,
        replication_factor: int = -1,
        configs: dict[str, str | None] | None = None,
        *,
        validate_only: bool = False,
    ) -> TopicInfo | None:
        error = topic_name_error(name)
        if error:
            raise KafkaError(ErrorCode.invalid_topic_exception, error)
        if self.metadata.topic(name) is not None:
            raise KafkaError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
        if partitions == -1:
            partitions = int(self.config.get("num.partitions"))
        if replication_factor == -1:
            replication_factor = int(self.config.get("default.replication.factor"))
        if partitions <= 0 or partitions > MAX_PARTITIONS:
            raise KafkaError(ErrorCode.invalid_partitions, "Number of partitions must be larger than 0.")
        if replication_factor <= 0:
            raise KafkaError(ErrorCode.invalid_replication_factor, "Replication factor must be larger than 0.")
        brokers = len(self.metadata.brokers())
        if replication_factor > brokers:
            raise KafkaError(
                ErrorCode.invalid_replication_factor,
                f"Unable to replicate the partition {replication_factor} time(s): The target replication factor "
                f"of {replication_factor} cannot be reached because only {brokers} broker(s) are registered.",
            )
        overrides = {k: v for k, v in (configs or {}).items() if v is not None}
        try:
            validate_topic_configs(overrides)
        except ConfigError as exc:
            raise KafkaError(ErrorCode.invalid_config, str(exc)) from exc
        if validate_only:
            return None
        self._effective_cache.pop(name, None)
        info = self.metadata.create_topic(name, partitions, replication_factor, overrides)
        self._host(info)
        log.info("created topic %s with %d partitions", name, partitions)
        return info

    def auto_create(self, name: str) -> TopicInfo:
        return self.create(name)  # type: ignore[return-value]

    def ensure_internal(self, name: str, partitions: int) -> TopicInfo:
        info = self.metadata.topic(name)
        if info is None:
            # Kafka compacts __consumer_offsets; pykbroker has no compaction yet, so the internal topic keeps
            # its segments forever instead (time retention would silently drop committed offsets).
            self._effective_cache.pop(name, None)
            info = self.metadata.create_topic(name, partitions, 1, {"retention.ms": "-1"})
            self._host(info)
        return info

    def add_partitions(self, name: str, total: int, *, validate_only: bool = False) -> None:
        info = self.metadata.topic(name)
        if info is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
        current = len(info.partitions)
        if total <= current:
            raise KafkaError(
                ErrorCode.invalid_partitions,
                f"Topic currently has {current} partitions, which is higher than the requested {total}.",
            )
        if total > MAX_PARTITIONS:
            raise KafkaError(ErrorCode.invalid_partitions, f"At most {MAX_PARTITIONS} partitions per topic.")
        if validate_only:
            return
        self._host(self.metadata.add_partitions(name, total))

    def delete(self, name: str) -> None:
        info = self.metadata.topic(name)
        if info is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, "This server does not host this topic-partition.")
        if info.internal:
            raise KafkaError(ErrorCode.invalid_topic_exception, f"Internal topic {name} cannot be deleted.")
        if not self.config.get("delete.topic.enable"):
            raise KafkaError(ErrorCode.topic_deletion_disabled, "Topic deletion is disabled.")
        self.metadata.delete_topic(name)
        self._effective_cache.pop(name, None)
        self.replicas.drop_topic(name)
        log.info("deleted topic %s", name)

    def host_all(self) -> None:
        """On start: host every partition the metadata says is ours."""
        for info in self.metadata.topics():
            self._host(info)

    def _host(self, info: TopicInfo) -> None:
        for index, state in enumerate(info.partitions):
            if state.leader == self.replicas.broker_id:
                self.replicas.host(info.name, index, state.leader_epoch, len(state.isr))

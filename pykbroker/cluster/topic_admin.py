"""Topic lifecycle: create (explicitly or by auto-creation), add partitions, delete, resolve configs.

Handlers for Metadata, CreateTopics, CreatePartitions and DeleteTopics all come here, so the rules
(legal names, partition counts, replication factor against live brokers, valid configs) live once.
Kafka's rules followed here:
- a name that differs from an existing topic's only by '.' versus '_' is refused (INVALID_TOPIC_EXCEPTION,
  "Topic 'a_b' collides with existing topics: a.b"), also on auto-creation;
- one request creates at most 10,000 partitions (Kafka's MAX_PARTITIONS_PER_BATCH: POLICY_VIOLATION,
  "Excessively large number of partitions per request.");
- ``cleanup.policy`` with ``compact`` is refused (INVALID_CONFIG, see config.py) until compaction exists.
  A topic stored with it by an older pykbroker keeps its data: it is served with time and size
  retention off, and a WARN says so.
pykbroker's own limit: the broker hosts at most ``max.broker.partitions`` partitions (the name KIP-578
proposed; Kafka 3.7 has no such limit); a change beyond it gets POLICY_VIOLATION naming the key.
Changes are applied at once and made durable by ``commit()``, which the admin handlers await; a deleted
topic stops being served at once, and its log directories are removed once the deletion is durable.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from concurrent.futures import Future
from typing import Any

from pykbroker.cluster.metadata import ClusterMetadata, TopicInfo, topic_name_error
from pykbroker.config import TOPIC_CONFIGS, BrokerConfig, ConfigError, ConfigSource, validate_topic_configs
from pykbroker.log.config import LogConfig
from pykbroker.protocol.errors import ErrorCode, KafkaError
from pykbroker.replication.replica_manager import ReplicaManager

log = logging.getLogger(__name__)

MAX_PARTITIONS_PER_REQUEST = 10_000  # Kafka's ReplicationControlManager.MAX_PARTITIONS_PER_BATCH
# Stored overrides that replace a compact cleanup.policy of a topic created before it was refused.
_KEEP_FOREVER = {"retention.ms": "-1", "retention.bytes": "-1"}


def too_many_partitions_per_request(total: int) -> KafkaError | None:
    """Kafka's bound on the partitions one CreateTopics or CreatePartitions request may add: the error
    every topic of the request gets when ``total`` is beyond it, else None."""
    if total > MAX_PARTITIONS_PER_REQUEST:
        return KafkaError(ErrorCode.policy_violation, "Excessively large number of partitions per request.")
    return None


class TopicAdmin:
    def __init__(self, config: BrokerConfig, metadata: ClusterMetadata, replicas: ReplicaManager) -> None:
        self.config = config
        self.metadata = metadata
        self.replicas = replicas
        self._effective_cache: dict[str, dict[str, Any]] = {}
        self.max_partitions = int(config.get("max.broker.partitions"))
        self._warned_compact: set[str] = set()

    # -- configs ----------------------------------------------------------------------------------
    def _overrides(self, name: str) -> dict[str, str]:
        info = self.metadata.topic(name)
        if info is None:
            return {}
        if "compact" not in info.configs.get("cleanup.policy", ""):
            return info.configs
        if name not in self._warned_compact:
            self._warned_compact.add(name)
            log.warning(
                "topic %s has cleanup.policy=%s, which pykbroker does not support yet: serving it with "
                "cleanup.policy=delete and retention off, so that none of its data is deleted",
                name, info.configs["cleanup.policy"],
            )
        kept = {key: value for key, value in info.configs.items() if key != "cleanup.policy"}
        return {**kept, **_KEEP_FOREVER}

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
        colliding = self.metadata.colliding_topics(name)
        if colliding:
            raise KafkaError(
                ErrorCode.invalid_topic_exception, f"Topic '{name}' collides with existing topics: {', '.join(colliding)}"
            )
        if partitions == -1:
            partitions = int(self.config.get("num.partitions"))
        if replication_factor == -1:
            replication_factor = int(self.config.get("default.replication.factor"))
        if partitions <= 0:
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
        self._check_broker_limit(partitions)
        if validate_only:
            return None
        self._effective_cache.pop(name, None)
        info = self.metadata.create_topic(name, partitions, replication_factor, overrides)
        log.info("created topic %s with %d partitions", name, partitions)
        return info

    def auto_create(self, name: str) -> TopicInfo:
        """Create with the broker defaults and host at once (Metadata); durable shortly after, unawaited."""
        info = self.create(name)
        assert info is not None
        self._host(info)
        self.metadata.commit()
        return info

    def commit(self) -> Future:
        """Make every change so far durable (off the event loop); the future completes when it is.

        Deleted topics' log directories are removed only once this commit succeeded (Kafka's order: the
        deletion is committed before logs are deleted); if it fails they stay on disk, and the next start
        serves them again or removes them, as the metadata then says.
        """
        log_manager = self.replicas.log_manager
        doomed = log_manager.take_deleted()
        future = self.metadata.commit()
        if doomed:
            def remove_if_durable(done: Future) -> None:  # runs in the metadata writer's thread
                if not done.cancelled() and done.exception() is None:
                    log_manager.remove_deleted(doomed)
                else:
                    log.warning("topic deletion not durable yet: %d log directories kept until the next start",
                                len(doomed))

            future.add_done_callback(remove_if_durable)
        return future

    def _check_broker_limit(self, adding: int) -> None:
        total = self.metadata.partition_count() + adding
        if total > self.max_partitions:
            raise KafkaError(
                ErrorCode.policy_violation,
                f"Adding {adding} partition(s) would make this broker host {total} partitions, more than "
                f"max.broker.partitions={self.max_partitions}; delete topics or raise the limit.",
            )

    def ensure_internal(self, name: str, partitions: int) -> TopicInfo:
        """The internal topic, created if absent and every partition hosted, at once (see
        ``ensure_internal_async`` for the way that lets other requests run in between)."""
        info = self._internal(name, partitions)
        self._host(info)  # hosting is idempotent: finishes what an async creation has not hosted yet
        return info

    async def ensure_internal_async(self, name: str, partitions: int) -> TopicInfo:
        """The internal topic, created if absent, its partitions hosted one at a time (``host_async``)."""
        info = self._internal(name, partitions)
        await self.host_async(info)
        return info

    def _internal(self, name: str, partitions: int) -> TopicInfo:
        info = self.metadata.topic(name)
        if info is None:
            # Kafka compacts __consumer_offsets; pykbroker has no compaction yet, so the internal topic keeps
            # its segments forever instead (time retention would silently drop committed offsets).
            self._effective_cache.pop(name, None)
            info = self.metadata.create_topic(name, partitions, 1, {"retention.ms": "-1"})
            self.metadata.commit()
        return info

    def add_partitions(self, name: str, total: int, *, validate_only: bool = False) -> TopicInfo | None:
        """Validate and record the new partitions; host them with ``host_async``."""
        info = self.metadata.topic(name)
        if info is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
        current = len(info.partitions)
        if total <= current:
            raise KafkaError(
                ErrorCode.invalid_partitions,
                f"Topic currently has {current} partitions, which is higher than the requested {total}.",
            )
        self._check_broker_limit(total - current)
        if validate_only:
            return None
        return self.metadata.add_partitions(name, total)

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

    def topic_id_of(self, name: str, partition: int) -> uuid.UUID | None:
        """The topic id a log directory of (name, partition) must carry, or None if no such partition exists."""
        info = self.metadata.topic(name)
        return info.topic_id if info is not None and 0 <= partition < len(info.partitions) else None

    async def host_async(self, info: TopicInfo) -> None:
        """Host a topic's partitions one at a time, letting other requests run in between: a new
        partition's files cost a few fsyncs, and a big topic must not stall every other client.

        A storage error (disk full, EMFILE) stops at that partition with KafkaError KAFKA_STORAGE_ERROR,
        as Kafka's LogManager answers ("Error while creating log for ..."); the topic stays in the metadata
        and its partitions not hosted yet are hosted at the next start (Kafka: the log dir goes offline
        until a restart).
        """
        for index in range(len(info.partitions)):
            if self.metadata.topic(info.name) is not info:  # deleted (or re-created) meanwhile
                return
            try:
                self._host_partition(info, index)
            except OSError as exc:
                message = (f"Error while creating log for {info.name}-{index} in dir "
                           f"{self.replicas.log_manager.data_dir}: {exc.strerror or exc}")
                log.warning("%s; the topic's partitions not hosted yet are hosted at the next start", message)
                raise KafkaError(ErrorCode.kafka_storage_error, message) from exc
            await asyncio.sleep(0)

    def _host(self, info: TopicInfo) -> None:
        for index in range(len(info.partitions)):
            self._host_partition(info, index)

    def _host_partition(self, info: TopicInfo, index: int) -> None:
        state = info.partitions[index]
        if state.leader != self.replicas.broker_id:
            return
        log_manager = self.replicas.log_manager
        if log_manager.get(info.name, index) is None:  # a new partition's log carries its topic id
            log_manager.create(info.name, index, self.log_config(info.name), topic_id=info.topic_id)
        self.replicas.host(info.name, index, state.leader_epoch, len(state.isr))

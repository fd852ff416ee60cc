"""Topic lifecycle: create (explicitly or by auto-creation), add partitions, delete, resolve configs.

Handlers for Metadata, CreateTopics, CreatePartitions and DeleteTopics all come here, so the rules
(legal names, partition counts, replication factor against live brokers, valid configs) live once, for
both modes. Kafka's rules followed here:
- a name that differs from an existing topic's only by '.' versus '_' is refused (INVALID_TOPIC_EXCEPTION,
  "Topic 'a_b' collides with existing topics: a.b"), also on auto-creation;
- one request creates at most 10,000 partitions (Kafka's MAX_PARTITIONS_PER_BATCH: POLICY_VIOLATION,
  "Excessively large number of partitions per request.");
- ``cleanup.policy`` delete, compact or both (pykbroker/log/cleaner.py); the internal topics are compacted.
pykbroker's own limit: at most ``max.broker.partitions`` partitions (the name KIP-578 proposed; Kafka 3.7
has no such limit; in cluster mode counted over the whole cluster); a change beyond it gets
POLICY_VIOLATION naming the key.

Configs: a topic's effective configs are its overrides over the broker's topic defaults, which come from
the broker's current configuration with its dynamic configs (``dynamic``, cluster/dynamic_configs.py).
``alter_configs_async`` replaces a topic's overrides (AlterConfigs / IncrementalAlterConfigs); the live
logs of the topic take the new configs at once (the metadata's config listener), and when a dynamic
broker config that is a topic default changes (``log.retention.ms``), every live log takes it too, so
that e.g. a lowered retention deletes old segments at the next retention check, without a restart.

How a change becomes durable and visible is the metadata backend's part (cluster/metadata.py):
- single node (EmbeddedMetadata): applied at once and made durable by ``commit()``, which the admin handlers
  await; this broker hosts the new partitions itself; a deleted topic stops being served at once, and its
  log directories are removed once the deletion is durable.
- cluster (ZkMetadata): written to ZooKeeper as Kafka's AdminZkClient does, then awaited in the metadata
  cache until the controller's UpdateMetadata shows it (every new partition with a leader, the deleted
  topic gone), bounded by the request's timeout: past it the answer is REQUEST_TIMED_OUT, the change going
  on anyway (Kafka's DelayedCreatePartitions / DelayedDeleteTopics; a timeout of 0 answers it at once).
  Partitions are hosted by LeaderAndIsr from the controller, never here. Auto-creation (Metadata) writes
  ZooKeeper and does not wait: LEADER_NOT_AVAILABLE until the leaders are known, as Kafka answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import Future
from typing import Any

from pykbroker.cluster.dynamic_configs import DynamicConfigs
from pykbroker.cluster.metadata import (
    INTERNAL_TOPIC_ROLES, INTERNAL_TOPICS, ClusterMetadata, TopicInfo, internal_topic_shortfall, topic_name_error,
)
from pykbroker.config import TOPIC_CONFIGS, BrokerConfig, ConfigError, ConfigSource, validate_topic_configs
from pykbroker.log.config import LogConfig
from pykbroker.protocol.errors import ErrorCode, KafkaError
from pykbroker.replication.replica_manager import ReplicaManager

log = logging.getLogger(__name__)

MAX_PARTITIONS_PER_REQUEST = 10_000  # Kafka's ReplicationControlManager.MAX_PARTITIONS_PER_BATCH
# Kafka compacts its internal topics (__consumer_offsets, __transaction_state): created with this override,
# and served with it whatever their stored overrides say (an AlterConfigs may have replaced them, or they
# were created by an older pykbroker with retention.ms=-1 instead). A compact-only topic has no time or size
# retention, as in Kafka.
_INTERNAL_CONFIGS = {"cleanup.policy": "compact"}
_OFFSETS_REPLICATION_KEY = "offsets.topic.replication.factor"
# What each internal topic is called in a message, and the key of its replication factor.
_PROBLEM_LOG_INTERVAL_S = 60.0  # an internal topic that cannot be created is logged at most this often
_TOPIC_DEFAULT_KEYS = frozenset(key for definition in TOPIC_CONFIGS.values() for key in definition.synonyms)


def too_many_partitions_per_request(total: int) -> KafkaError | None:
    """Kafka's bound on the partitions one CreateTopics or CreatePartitions request may add: the error
    every topic of the request gets when ``total`` is beyond it, else None."""
    if total > MAX_PARTITIONS_PER_REQUEST:
        return KafkaError(ErrorCode.policy_violation, "Excessively large number of partitions per request.")
    return None


class TopicAdmin:
    def __init__(self, config: BrokerConfig, metadata: ClusterMetadata, replicas: ReplicaManager,
                 dynamic: DynamicConfigs | None = None) -> None:
        self.config = config
        self.dynamic = dynamic if dynamic is not None else DynamicConfigs(config, metadata)
        self.metadata = metadata
        self.replicas = replicas
        # topic -> (the overrides dict it was resolved from, the effective configs)
        self._effective_cache: dict[str, tuple[dict[str, str] | None, dict[str, Any]]] = {}
        self.max_partitions = int(config.get("max.broker.partitions"))
        # internal topic -> (why it could not be created, when that was last logged)
        self._internal_problems: dict[str, tuple[str, float]] = {}
        metadata.add_config_listener(self.replicas.update_config)  # hosted logs take a topic's new configs
        self.dynamic.add_listener(self._broker_configs_changed)

    def _broker_configs_changed(self, names: set[str]) -> None:
        """A dynamic broker config changed: if it is a topic default, every live log takes its new configs."""
        if not names & _TOPIC_DEFAULT_KEYS:
            return
        self._effective_cache.clear()
        for partition_log in self.replicas.log_manager.logs():
            partition_log.config = self.log_config(partition_log.topic)

    async def alter_configs_async(self, name: str, configs: dict[str, str], *, validate_only: bool = False,
                                  version: int | None = None) -> None:
        """Replace the topic's config overrides (AlterConfigs semantics; IncrementalAlterConfigs computes the
        full set first, from the overrides read at ``version``: StaleConfigVersion if they changed since).
        KafkaError: UNKNOWN_TOPIC_OR_PARTITION, INVALID_CONFIG for a bad name or value."""
        if self.metadata.topic(name) is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
        try:
            validate_topic_configs(configs)
        except ConfigError as exc:
            raise KafkaError(ErrorCode.invalid_config, str(exc)) from exc
        if validate_only:
            return
        log.info("updating configs of topic %s: %s", name, configs)
        await self.metadata.set_topic_configs_async(name, dict(configs), version=version)

    # -- configs ----------------------------------------------------------------------------------
    def _overrides(self, name: str) -> dict[str, str]:
        """The overrides the topic is served with: the stored ones, but internal topics are compacted."""
        configs = self.metadata.topic_configs(name)
        if configs is None:
            configs = {}
        if name in INTERNAL_TOPICS:
            configs = {**configs, **_INTERNAL_CONFIGS}
        return configs

    def effective_configs(self, name: str) -> dict[str, tuple[Any, ConfigSource]]:
        """Every topic config with its typed value and DescribeConfigs source."""
        overrides = validate_topic_configs(self._overrides(name))
        result: dict[str, tuple[Any, ConfigSource]] = {}
        for key in TOPIC_CONFIGS:
            if key in overrides:
                result[key] = (overrides[key], ConfigSource.DYNAMIC_TOPIC_CONFIG)
            else:
                result[key] = self.dynamic.config.topic_config_source(key)
        return result

    def _effective(self, name: str) -> dict[str, Any]:
        # Produce asks for min.insync.replicas on every request: resolve a topic's configs once, again
        # whenever its overrides are another dict (both backends replace the dict when they change, and a
        # topic created, re-created or deleted has another one, or none).
        source = self.metadata.topic_configs(name)
        cached = self._effective_cache.get(name)
        if cached is None or cached[0] is not source:
            cached = self._effective_cache[name] = (source, self.dynamic.config.effective_topic_config(self._overrides(name)))
        return cached[1]

    def log_config(self, name: str) -> LogConfig:
        return LogConfig.from_topic_configs(self._effective(name))

    def min_insync_replicas(self, name: str) -> int:
        return int(self._effective(name)["min.insync.replicas"])

    # -- rules ------------------------------------------------------------------------------------
    def _check_create(
        self, name: str, partitions: int, replication_factor: int, configs: dict[str, str | None] | None
    ) -> tuple[int, int, dict[str, str]]:
        """Kafka's checks of a new topic; (partitions, replication factor, overrides) with the broker
        defaults filled in, or KafkaError."""
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
        return partitions, replication_factor, overrides

    def _check_add_partitions(self, name: str, total: int) -> None:
        info = self.metadata.topic(name)
        if info is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
        current = len(info.partitions)
        if total <= current:
            raise self.metadata.not_an_increase(name, current, total)
        self._check_broker_limit(total - current)

    def _check_delete(self, name: str) -> None:
        info = self.metadata.topic(name)
        if info is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, "This server does not host this topic-partition.")
        if info.internal:
            raise KafkaError(ErrorCode.invalid_topic_exception, f"Internal topic {name} cannot be deleted.")
        if not self.config.get("delete.topic.enable"):
            raise KafkaError(ErrorCode.topic_deletion_disabled, "Topic deletion is disabled.")

    def _check_broker_limit(self, adding: int) -> None:
        total = self.metadata.partition_count() + adding
        if total > self.max_partitions:
            raise KafkaError(
                ErrorCode.policy_violation,
                f"Adding {adding} partition(s) would make this broker host {total} partitions, more than "
                f"max.broker.partitions={self.max_partitions}; delete topics or raise the limit.",
            )

    def _has_leaders(self, name: str, partitions: int) -> bool:
        """The cache shows ``name`` with ``partitions`` partitions, each with a leader (Kafka's
        DelayedCreatePartitions completes on that)."""
        info = self.metadata.topic(name)
        return info is not None and len(info.partitions) >= partitions and all(
            state.leader >= 0 for state in info.partitions
        )

    async def _await_visible(self, condition, timeout_s: float) -> None:
        if not await self.metadata.wait_until(condition, timeout_s):
            raise KafkaError(ErrorCode.request_timed_out)

    # -- manual replica assignments ---------------------------------------------------------------
    def _check_replicas(self, partition: int, replicas: list[int], expected_factor: int | None) -> None:
        """One partition's manual replicas, as KRaft's validateManualPartitionAssignment checks them."""
        if not replicas:
            raise KafkaError(ErrorCode.invalid_replica_assignment,
                             "The manual partition assignment includes an empty replica list.")
        registered = {b.broker_id for b in self.metadata.brokers()}
        previous = None
        for broker_id in sorted(replicas):
            if broker_id not in registered:
                raise KafkaError(ErrorCode.invalid_replica_assignment,
                                 f"The manual partition assignment includes broker {broker_id}, but no such broker "
                                 "is registered.")
            if broker_id == previous:
                raise KafkaError(ErrorCode.invalid_replica_assignment,
                                 f"The manual partition assignment includes the broker {broker_id} more than once.")
            previous = broker_id
        if expected_factor is not None and len(replicas) != expected_factor:
            raise KafkaError(ErrorCode.invalid_replica_assignment,
                             f"The manual partition assignment includes a partition with {len(replicas)} replica(s), "
                             f"but this is not consistent with previous partitions, which have {expected_factor} "
                             "replica(s).")

    def check_create_assignment(self, partitions: int, replication_factor: int,
                                assignments: list[tuple[int, list[int]]]) -> dict[int, list[int]]:
        """CreateTopics' manual assignment ``(partition index, broker ids)``: the assignment, or KafkaError
        (INVALID_REQUEST with a partition count or replication factor too, INVALID_REPLICA_ASSIGNMENT for
        duplicate partitions or brokers, unknown brokers, uneven replica counts, indexes not 0..n-1),
        with KRaft's ReplicationControlManager messages."""
        if partitions != -1:
            raise KafkaError(ErrorCode.invalid_request,
                             "A manual partition assignment was specified, but numPartitions was not set to -1.")
        if replication_factor != -1:
            raise KafkaError(ErrorCode.invalid_request,
                             "A manual partition assignment was specified, but replication factor was not set to -1.")
        result: dict[int, list[int]] = {}
        factor = None
        for index, replicas in assignments:
            if index in result:
                raise KafkaError(ErrorCode.invalid_replica_assignment,
                                 f"Found multiple manual partition assignments for partition {index}")
            self._check_replicas(index, replicas, factor)
            factor = len(replicas)
            result[index] = list(replicas)
        if sorted(result) != list(range(len(result))):
            raise KafkaError(ErrorCode.invalid_replica_assignment,
                             "partitions should be a consecutive 0-based integer sequence")
        return result

    def check_added_assignment(self, name: str, total: int, assignments: list[list[int]]) -> dict[int, list[int]]:
        """CreatePartitions' assignments of the new partitions, in order: partition -> replicas, or KafkaError
        (INVALID_REPLICA_ASSIGNMENT: not one per new partition, unknown or duplicate brokers, another
        replication factor than the topic's), with KRaft's ReplicationControlManager messages."""
        self._check_add_partitions(name, total)
        info = self.metadata.topic(name)
        existing = len(info.partitions)
        if len(assignments) != total - existing:
            raise KafkaError(ErrorCode.invalid_replica_assignment,
                             f"Attempted to add {total - existing} additional partition(s), but only "
                             f"{len(assignments)} assignment(s) were specified.")
        result = {}
        for offset, replicas in enumerate(assignments):
            self._check_replicas(existing + offset, replicas, info.replication_factor)
            result[existing + offset] = list(replicas)
        return result

    # -- lifecycle, both modes (the admin handlers) -------------------------------------------------
    async def create_async(
        self,
        name: str,
        partitions: int = -1,
        replication_factor: int = -1,
        configs: dict[str, str | None] | None = None,
        *,
        assignment: dict[int, list[int]] | None = None,
        validate_only: bool = False,
        timeout_s: float = 0.0,
    ) -> TopicInfo | None:
        """Create the topic and await it (every partition led, and hosted here in single-node mode), at
        most ``timeout_s`` (REQUEST_TIMED_OUT past it); None when only validated. ``assignment`` (from
        ``check_create_assignment``) places the replicas as named."""
        if assignment is not None:
            partitions, replication_factor = len(assignment), len(assignment[0])
        partitions, replication_factor, overrides = self._check_create(name, partitions, replication_factor, configs)
        if validate_only:
            return None
        await self.metadata.create_topic_async(name, partitions, replication_factor, overrides, assignment)
        log.info("created topic %s with %d partitions", name, partitions)
        await self._await_visible(lambda: self._has_leaders(name, partitions), timeout_s)
        info = self.metadata.topic(name)
        assert info is not None
        await self.host_async(info)
        return info

    async def auto_create_async(self, name: str) -> TopicInfo | None:
        """Metadata's auto-creation with the broker defaults: the topic if its leaders are known already
        (single node: created and hosted at once, durable shortly after, unawaited), None when the answer
        is LEADER_NOT_AVAILABLE (cluster: written to ZooKeeper, or already there, leaders not known yet)."""
        partitions, replication_factor, overrides = self._check_create(name, -1, -1, None)
        try:
            await self.metadata.create_topic_async(name, partitions, replication_factor, overrides)
        except KafkaError as exc:
            if exc.code != ErrorCode.topic_already_exists:
                raise
            return None
        if not self._has_leaders(name, partitions):
            return None
        info = self.metadata.topic(name)
        self._host(info)
        self.metadata.commit()
        return info

    async def add_partitions_async(
        self, name: str, total: int, *, assignment: dict[int, list[int]] | None = None,
        validate_only: bool = False, timeout_s: float = 0.0
    ) -> TopicInfo | None:
        """Add partitions up to ``total`` and await them as ``create_async`` does; None when only validated.
        ``assignment`` (from ``check_added_assignment``) places the new replicas as named."""
        self._check_add_partitions(name, total)
        if validate_only:
            return None
        await self.metadata.add_partitions_async(name, total, assignment)
        await self._await_visible(lambda: self._has_leaders(name, total), timeout_s)
        info = self.metadata.topic(name)
        assert info is not None
        await self.host_async(info)
        return info

    async def delete_async(self, name: str, *, timeout_s: float = 0.0) -> None:
        """Delete the topic and await its disappearance from the metadata, at most ``timeout_s``."""
        self._check_delete(name)
        await self.metadata.delete_topic_async(name)
        self._dropped(name)
        await self._await_visible(lambda: self.metadata.topic(name) is None, timeout_s)

    def _dropped(self, name: str) -> None:
        self._effective_cache.pop(name, None)
        if self.metadata.local_leadership:
            self.replicas.drop_topic(name)
        log.info("deleted topic %s", name)

    # -- single node, synchronous ---------------------------------------------------------------------
    def create(
        self,
        name: str,
        partitions: int = -1,
        replication_factor: int = -1,
        configs: dict[str, str | None] | None = None,
    ) -> TopicInfo:
        """Single node only: create at once (hosting with ``host_async`` or at the next start)."""
        partitions, replication_factor, overrides = self._check_create(name, partitions, replication_factor, configs)
        info = self.metadata.create_topic(name, partitions, replication_factor, overrides)
        log.info("created topic %s with %d partitions", name, partitions)
        return info

    def delete(self, name: str) -> None:
        """Single node only: delete at once (no longer served; directories removed after ``commit``)."""
        self._check_delete(name)
        self.metadata.delete_topic(name)
        self._dropped(name)

    def commit(self) -> Future:
        """Make every change so far durable (off the event loop); the future completes when it is.

        Deleted topics' log directories are removed only once this commit succeeded (Kafka's order: the
        deletion is committed before logs are deleted); if it fails they stay on disk, and the next start
        serves them again or removes them, as the metadata then says. (In cluster mode the changes are
        durable in ZooKeeper already, and StopReplica from the controller deletes logs.)
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

    # -- internal topics ------------------------------------------------------------------------------
    def ensure_internal(self, name: str, partitions: int, configs: dict[str, str] | None = None) -> TopicInfo:
        """Single node only: the internal topic, created if absent and every partition hosted, at once (see
        ``ensure_internal_async`` for the way that lets other requests run in between). ``configs``: its
        overrides beyond the internal topics' own (__transaction_state's cleanup.policy, min.insync.replicas)."""
        info = self.metadata.topic(name)
        if info is None:
            self.metadata.create_topic(name, partitions, 1, {**_INTERNAL_CONFIGS, **(configs or {})})
            self.metadata.commit()
            info = self.metadata.topic(name)
        self._host(info)  # hosting is idempotent: finishes what an async creation has not hosted yet
        return info

    async def ensure_internal_async(
        self, name: str, partitions: int, replication_factor: int | None = None,
        configs: dict[str, str] | None = None,
    ) -> TopicInfo | None:
        """The internal topic, created if absent. Single node: created and its partitions hosted one at a
        time (``host_async``), returned. Cluster: written to ZooKeeper if absent, not awaited: None until
        the cache has it with every leader (the groups coordinator asks again).

        The replication factor, unless given: ``offsets.topic.replication.factor`` if the broker config sets
        it, else Kafka's default 3 capped at the live brokers (so a small cluster works out of the box);
        the single node has one replica whatever the setting, as before. An internal topic that cannot be
        created (too few brokers for the configured factor) is logged and None returned."""
        if self.metadata.topic(name) is None:
            if replication_factor is None:
                replication_factor = self.internal_replication_factor()
            try:
                await self.metadata.create_topic_async(name, partitions, replication_factor,
                                                       {**_INTERNAL_CONFIGS, **(configs or {})})
                log.info("created internal topic %s with %d partitions, replication factor %d",
                         name, partitions, replication_factor)
            except KafkaError as exc:
                if exc.code != ErrorCode.topic_already_exists:
                    self._internal_topic_failed(name, replication_factor, exc)
                    return None
            except Exception as exc:  # noqa: BLE001 - ZooKeeper unreachable: its session lost (a broker paused past
                # it), the connection closing. Kafka's createTopicsInZk logs any such error and FindCoordinator
                # answers COORDINATOR_NOT_AVAILABLE (retriable): the client asks again, never an unknown error.
                self._internal_topic_failed(name, replication_factor, exc)
                return None
            self.metadata.commit()
        self._internal_problems.pop(name, None)
        if not self._has_leaders(name, 1):
            return None
        info = self.metadata.topic(name)
        await self.host_async(info)
        return info

    def _internal_topic_failed(self, name: str, replication_factor: int, exc: Exception) -> None:
        """Keep why the internal topic cannot be created (FindCoordinator tells it) and log it, at most once
        a minute while it stays the same: clients ask again every few hundred milliseconds."""
        if getattr(exc, "code", None) == ErrorCode.invalid_replication_factor and name in INTERNAL_TOPIC_ROLES:
            problem = internal_topic_shortfall(name, len(self.metadata.brokers()), replication_factor)
        else:
            role = INTERNAL_TOPIC_ROLES.get(name, ("the internal topic", None))[0]
            cause = str(exc) if isinstance(exc, KafkaError) else f"the metadata store failed: {exc!r}"
            problem = f"{role} {name} cannot be created: {cause}"
        now = time.monotonic()
        previous = self._internal_problems.get(name)
        if previous is None or previous[0] != problem or now - previous[1] >= _PROBLEM_LOG_INTERVAL_S:
            log.warning("%s; clients needing it get COORDINATOR_NOT_AVAILABLE until it exists", problem)
            self._internal_problems[name] = (problem, now)

    def internal_topic_problem(self, name: str) -> str | None:
        """Why the internal topic ``name`` could not be created at the last attempt, None if it exists or
        no attempt failed."""
        if self.metadata.topic(name) is not None:
            return None
        found = self._internal_problems.get(name)
        return found[0] if found else None

    def internal_replication_factor(self, key: str = _OFFSETS_REPLICATION_KEY) -> int:
        """The replication factor of a new internal topic: 1 on the single node, else ``key``
        (offsets.topic.replication.factor, transaction.state.log.replication.factor): Kafka's default of 3 for
        both in a cluster (offsets: config.CLUSTER_DEFAULTS; transaction state: its table default), whatever the brokers alive now, so an offsets topic created
        while brokers are still starting is not stuck with fewer replicas. Until that many brokers are up,
        group requests get COORDINATOR_NOT_AVAILABLE (retriable); a smaller cluster sets the key."""
        if self.metadata.local_leadership:
            return 1
        return int(self.config.get(key))

    # -- hosting (single node: in cluster mode LeaderAndIsr from the controller hosts partitions) -----------
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
        if not self.metadata.local_leadership:
            return
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
        if not self.metadata.local_leadership:
            return
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

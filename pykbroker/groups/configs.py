"""Per-group configs: the GROUP config resource (ConfigResource.Type.GROUP, resource type 32) of Kafka 4
(KIP-848's dynamic group configs, Kafka's GroupConfig / GroupConfigManager).

* Names: ``consumer.session.timeout.ms`` and ``consumer.heartbeat.interval.ms`` (INT, at least 1), the two
  consumer group configs of Kafka 4.0's GroupConfig. Its ``share.*`` configs (share groups, KIP-932) and the
  ``streams.*`` ones of later versions (KIP-1071) are for kinds of group pykbroker does not have: they are
  neither listed nor accepted ("Unknown group config name").
* Defaults: the broker's ``group.consumer.session.timeout.ms`` / ``group.consumer.heartbeat.interval.ms``
  (Kafka's extractGroupConfigMap). DescribeConfigs lists both with source GROUP_CONFIG (8) when the group
  overrides it, else DEFAULT_CONFIG (5), one synonym of that source, never read-only; a group needs not exist.
* Validation (Kafka 4's GroupConfigManager.validate: the broker's group.consumer.session.timeout.ms /
  heartbeat.interval.ms, then the group's whole set of overrides after the change): INVALID_CONFIG with Kafka's
  messages for an unknown name, a value that is not an INT or below 1, a heartbeat interval outside
  ``group.consumer.min/max.heartbeat.interval.ms``, a session timeout outside
  ``group.consumer.min/max.session.timeout.ms``, and a session timeout not above the heartbeat interval.
  An empty group name: INVALID_REQUEST "Default group resources are not allowed."
* Storage: the metadata backend, by group id: the single node's journal, or ZooKeeper's
  ``/config/groups/<group>`` with a ``/config/changes`` notification (cluster/metadata.py,
  cluster/zk_metadata.py: the id sanitized, ``.`` / ``..`` as ``%2E`` / ``%2E%2E``, at most 1 KiB so sanitized,
  else INVALID_REQUEST); the backend's listener is the one path that applies them; every broker follows the backend's changes, so the coordinator of the group, on
  whichever broker, reads the group's values through ``session_timeout_ms`` / ``heartbeat_interval_ms``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping

from pykbroker.config import ConfigDef, ConfigError, ConfigSource, Range
from pykbroker.groups.consumer.coordinator import ConsumerGroupConfig
from pykbroker.protocol.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

GROUP_RESOURCE = 32  # ConfigResource.Type.GROUP
GROUP_ENTITY_TYPE = "groups"  # the entity type of the stored configs (ZooKeeper: /config/groups/<group>)

CONSUMER_SESSION_TIMEOUT_MS = "consumer.session.timeout.ms"
CONSUMER_HEARTBEAT_INTERVAL_MS = "consumer.heartbeat.interval.ms"

# Kafka's GroupConfig definitions (their own defaults are GroupCoordinatorConfig's; validation and DescribeConfigs
# use the broker's group.consumer.* values instead).
GROUP_CONFIGS: dict[str, ConfigDef] = {
    CONSUMER_SESSION_TIMEOUT_MS: ConfigDef(
        CONSUMER_SESSION_TIMEOUT_MS, "int", 45000,
        "The timeout to detect client failures when using the consumer group protocol.", Range(min=1)),
    CONSUMER_HEARTBEAT_INTERVAL_MS: ConfigDef(
        CONSUMER_HEARTBEAT_INTERVAL_MS, "int", 5000,
        "The heartbeat interval given to the members of a consumer group.", Range(min=1)),
}
# The broker's value (a ConsumerGroupConfig field) each group config defaults to.
_BROKER_DEFAULT_FIELD = {
    CONSUMER_SESSION_TIMEOUT_MS: "session_timeout_ms",
    CONSUMER_HEARTBEAT_INTERVAL_MS: "heartbeat_interval_ms",
}


def _invalid(message: str) -> KafkaError:
    return KafkaError(ErrorCode.invalid_config, message)


def validate(configs: Mapping[str, str], bounds: ConsumerGroupConfig) -> dict[str, int]:
    """A group's overrides, typed; KafkaError (INVALID_CONFIG, Kafka's message) if Kafka refuses them."""
    for name in configs:
        if name not in GROUP_CONFIGS:
            raise _invalid(f"Unknown group config name: {name}")
    typed: dict[str, int] = {}
    for name, raw in configs.items():
        try:
            typed[name] = GROUP_CONFIGS[name].parse(raw.strip() if isinstance(raw, str) else raw, kafka_wording=True)
        except ConfigError as exc:
            raise _invalid(exc.message) from None
    # the broker's values where the group has none (extractConsumerGroupConfigMap, then the new configs)
    heartbeat = typed.get(CONSUMER_HEARTBEAT_INTERVAL_MS, bounds.heartbeat_interval_ms)
    session = typed.get(CONSUMER_SESSION_TIMEOUT_MS, bounds.session_timeout_ms)
    checks = (
        (heartbeat < bounds.min_heartbeat_interval_ms,
         f"{CONSUMER_HEARTBEAT_INTERVAL_MS} must be greater than or equal to group.consumer.min.heartbeat.interval.ms"),
        (heartbeat > bounds.max_heartbeat_interval_ms,
         f"{CONSUMER_HEARTBEAT_INTERVAL_MS} must be less than or equal to group.consumer.max.heartbeat.interval.ms"),
        (session < bounds.min_session_timeout_ms,
         f"{CONSUMER_SESSION_TIMEOUT_MS} must be greater than or equal to group.consumer.min.session.timeout.ms"),
        (session > bounds.max_session_timeout_ms,
         f"{CONSUMER_SESSION_TIMEOUT_MS} must be less than or equal to group.consumer.max.session.timeout.ms"),
        (session <= heartbeat, f"{CONSUMER_SESSION_TIMEOUT_MS} must be greater than {CONSUMER_HEARTBEAT_INTERVAL_MS}"),
    )
    for failed, message in checks:
        if failed:
            raise _invalid(message)
    return typed


def check_group_name(name: str) -> None:
    if not name:
        raise KafkaError(ErrorCode.invalid_request, "Default group resources are not allowed.")


class GroupConfigs:
    """Every group's overrides as the metadata backend stores them, followed as they change; the values the
    consumer group coordinator uses for a group (``session_timeout_ms``, ``heartbeat_interval_ms``)."""

    def __init__(self, bounds: ConsumerGroupConfig, metadata) -> None:
        self.bounds = bounds
        self.metadata = metadata
        self._typed: dict[str, dict[str, int]] = {}
        for group_id, configs in metadata.group_configs().items():
            self._stored(group_id, configs)
        metadata.add_group_config_listener(self._stored)

    def _stored(self, group_id: str, configs: Mapping[str, str]) -> None:
        typed: dict[str, int] = {}
        for name, raw in configs.items():  # each on its own: a bad one (written by another tool) is skipped
            definition = GROUP_CONFIGS.get(name)
            try:
                if definition is None:
                    raise ConfigError(name, f"Unknown group config name: {name}")
                typed[name] = definition.parse(raw, kafka_wording=True)
            except ConfigError as exc:
                log.warning("ignoring the stored config %s=%r of group %s: %s", name, raw, group_id, exc.message)
        if typed:
            self._typed[group_id] = typed
        else:
            self._typed.pop(group_id, None)

    # -- the values a group runs with -------------------------------------------------------------------
    def value(self, group_id: str, name: str) -> int:
        override = self._typed.get(group_id, {}).get(name)
        return override if override is not None else getattr(self.bounds, _BROKER_DEFAULT_FIELD[name])

    def session_timeout_ms(self, group_id: str) -> int:
        return self.value(group_id, CONSUMER_SESSION_TIMEOUT_MS)

    def heartbeat_interval_ms(self, group_id: str) -> int:
        return self.value(group_id, CONSUMER_HEARTBEAT_INTERVAL_MS)

    def overridden(self) -> dict[str, dict[str, int]]:
        """The groups with overrides, and their values (the console and the CLI show them)."""
        return {group_id: dict(values) for group_id, values in self._typed.items()}

    # -- DescribeConfigs ----------------------------------------------------------------------------------
    def describe(self, group_id: str) -> list[tuple[ConfigDef, Any, ConfigSource]]:
        """(definition, value, source) of every group config (ConfigHelper's GROUP branch)."""
        if not group_id:
            raise KafkaError(ErrorCode.invalid_request, "Group name must not be empty")
        overrides = self._typed.get(group_id, {})
        return [(definition, self.value(group_id, name),
                 ConfigSource.GROUP_CONFIG if name in overrides else ConfigSource.DEFAULT_CONFIG)
                for name, definition in GROUP_CONFIGS.items()]

    # -- AlterConfigs / IncrementalAlterConfigs -----------------------------------------------------------
    async def alter_async(self, group_id: str, configs: dict[str, str], *, validate_only: bool = False,
                          version: int | None = None) -> None:
        """Replace the group's overrides (validated first: KafkaError); ``version`` as the backend read it
        (StaleConfigVersion if they changed since)."""
        check_group_name(group_id)
        validate(configs, self.bounds)
        if validate_only:
            return
        log.info("updating the configs of group %s: %s", group_id, configs)
        # the backend tells its listeners (``_stored``): the one path that applies configs, so a write that
        # ZooKeeper's staleness guard drops is not applied here either
        await self.metadata.set_group_configs_async(group_id, dict(configs), version=version)


__all__ = ["GROUP_RESOURCE", "GROUP_ENTITY_TYPE", "GROUP_CONFIGS", "GroupConfigs", "validate",
           "CONSUMER_SESSION_TIMEOUT_MS", "CONSUMER_HEARTBEAT_INTERVAL_MS", "check_group_name"]

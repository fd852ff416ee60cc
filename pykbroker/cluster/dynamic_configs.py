"""Dynamic broker configs: Kafka's per-broker and cluster-default configs that AlterConfigs and
IncrementalAlterConfigs change while brokers run (``kafka-configs.sh --entity-type brokers``).

Interface for the rest of the broker (``broker.dynamic_configs``):

* ``value(name: str) -> Any`` — the effective typed value of a broker config: this broker's dynamic
  config > the cluster-default dynamic config > the static config (flags, env, file) > the default.
  E.g. ``value("leader.replication.throttled.rate")`` (a long, Long.MAX_VALUE unless set, as in Kafka).
* ``add_listener(callback: Callable[[set[str]], None])`` — ``callback(names)`` after a change, with
  the names whose effective value changed (a change the broker makes itself, or one another broker
  wrote to ZooKeeper, or the stored configs read at start).
* ``config`` — the current BrokerConfig (the static one ``with_dynamic`` layers), whose topic defaults,
  sources and synonyms DescribeConfigs and TopicAdmin use.

Which configs are dynamic: those Kafka 3.7.1 marks dynamic (config.DYNAMIC_BROKER_CONFIG_NAMES, read_only
false in DescribeConfigs, from its catalogue in kafka_broker_configs.py) and the two replication throttles.
pykbroker applies config.APPLIED_DYNAMIC_CONFIG_NAMES while it runs (the log.* topic defaults,
message.max.bytes, compression.type, min.insync.replicas, the throttles, the cleaner's settings, and a
listener's ``listener.name.<l>.ssl.*`` through ``add_reconfigurable``: the broker validates and reloads its TLS
contexts with them); the others (listeners, connection limits, thread counts, SASL settings, ...) are stored
and described, and their doc says a new value has no effect here. Kafka's listener overrides (``listener.name.<listener>.<config>``)
are accepted too, typed as their base config (``listener.name.<listener>.<mechanism>.sasl.jaas.config`` as
sasl.jaas.config, as Kafka's ListenerMechanismConfigs). Refusals follow Kafka (parse_dynamic_configs, then
``alter_async`` against this broker's current configs): INVALID_REQUEST for a read-only key ("Cannot update
these configs dynamically"), an SSL store setting without a listener prefix, an invalid value, a per-broker
key as the cluster default, a thread count beyond half or double its current value or a cleaner setting
Kafka's LogCleaner refuses (in Kafka's wrapping of such a refusal), listener configs that do not parse;
INVALID_CONFIG for a password config (Kafka in ZooKeeper mode stores them encrypted with
password.encoder.secret and refuses them without one; pykbroker never stores them) and for an unknown key
(Kafka would store an unknown broker key for plugins; pykbroker has none to read it, and refuses a typo
rather than storing it).
A BROKER resource names this broker's id or "" (the cluster default);
another id or a non-numeric one is INVALID_REQUEST, as Kafka's ZkAdminManager.getBrokerId.

Storage is the metadata backend's (cluster/metadata.py): single node, the metadata journal; cluster,
ZooKeeper's ``/config/brokers/<id>`` and ``/config/brokers/<default>`` with change notifications, which every
broker follows. A stored value that is no longer valid (written by another version) is ignored with a
warning rather than refusing to start.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping

from pykbroker.cluster.metadata import DEFAULT_BROKER_ENTITY, ClusterMetadata
from pykbroker.config import (
    BROKER_CONFIGS,
    CLUSTER_LEVEL_LISTENER_CONFIGS,
    PER_BROKER_CONFIG_NAMES,
    TOPIC_CONFIGS,
    BrokerConfig,
    ConfigError,
    broker_config_def,
    ReconfigurationError,
    check_cleaner_configs,
    check_thread_pool_configs,
    listed_names,
    KafkaRequirement,
    check_listener_update,
    listener_override_base,
    to_topic_unit,
)
from pykbroker.kafka_broker_configs import LISTENER_PREFIX_ONLY_CONFIGS
from pykbroker.protocol.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

_LISTENER_CONFIGS = ("listeners", "advertised.listeners", "listener.security.protocol.map")


def broker_entity(resource_name: str, broker_id: int) -> str:
    """The stored entity a BROKER resource names: DEFAULT_BROKER_ENTITY for "", else this broker's id.
    KafkaError INVALID_REQUEST for a name that is not an integer or another broker's id (Kafka's words)."""
    if not resource_name:
        return DEFAULT_BROKER_ENTITY
    try:
        requested = int(resource_name)
    except ValueError:
        raise KafkaError(ErrorCode.invalid_request, f"Node id must be an integer, but it is: {resource_name}") from None
    if requested != broker_id:
        raise KafkaError(
            ErrorCode.invalid_request, f"Unexpected broker id, expected {broker_id}, but received {resource_name}"
        )
    return str(broker_id)


def parse_dynamic_configs(configs: Mapping[str, str], *, per_broker: bool = True) -> dict[str, Any]:
    """Typed values of the dynamic configs of one broker (``per_broker``) or of the cluster default, checked
    in Kafka 3.7.1's order (DynamicBrokerConfig.validateConfigs; its answers in ZooKeeper and KRaft mode
    alike), each failure a KafkaError INVALID_REQUEST: a known key that is not dynamic; an SSL key store or
    trust store setting without a listener prefix; an invalid value (in Kafka's words); a per-broker key
    as the cluster default. After Kafka's first two (which look at known keys only), INVALID_CONFIG for an
    unknown key (Kafka would store it for plugins; pykbroker has none to read it)."""

    def refuse(names: Iterable[str], message: str, set_name: str = "Set") -> None:
        names = sorted(names)
        if names:
            raise KafkaError(ErrorCode.invalid_request, f"{message}: {set_name}({listed_names(names)})")

    refuse((name for name in configs if name in BROKER_CONFIGS and BROKER_CONFIGS[name].read_only),
           "Cannot update these configs dynamically")  # a listener override is always dynamic
    refuse((name for name in configs if name in LISTENER_PREFIX_ONLY_CONFIGS),
           "These security configs can be dynamically updated only per-listener using the listener prefix", "HashSet")
    unknown = sorted(name for name in configs if broker_config_def(name) is None)
    if unknown:
        raise KafkaError(ErrorCode.invalid_config, f"Unknown broker config name: {listed_names(unknown)}")
    try:
        typed = {name: replace(broker_config_def(name), name=listener_override_base(name) or name)
                 .parse(raw, kafka_wording=True) for name, raw in configs.items()}  # an override as its base
        for name, value in typed.items():  # as Kafka's DynamicLogConfig: the topic default must be valid too
            for definition in TOPIC_CONFIGS.values():
                if name in definition.synonyms and value is not None:
                    try:
                        definition.parse(to_topic_unit(name, value))
                    except ConfigError as exc:
                        raise ConfigError(name, f"{name} supplies the topic default {exc.message}") from None
    except ConfigError as exc:
        raise KafkaError(ErrorCode.invalid_request, str(exc)) from None
    if not per_broker:
        refuse((name for name in configs if name in PER_BROKER_CONFIG_NAMES or (
                   name not in BROKER_CONFIGS and listener_override_base(name) not in CLUSTER_LEVEL_LISTENER_CONFIGS)),
               "Cannot update these configs at default cluster level, broker id must be specified")
    return typed


class DynamicConfigs:
    """This broker's effective configuration with its dynamic configs (see the module docstring)."""

    def __init__(self, config: BrokerConfig, metadata: ClusterMetadata) -> None:
        self.static = config
        self.config = config
        self.metadata = metadata
        self.entity = str(config.broker_id)
        self._typed: dict[str, dict[str, Any]] = {DEFAULT_BROKER_ENTITY: {}, self.entity: {}}
        self._listeners: list[Callable[[set[str]], None]] = []
        self._reconfigurables: list[tuple[Callable[[str], bool], Callable[[Mapping[str, Any]], None],
                                          Callable[[Mapping[str, Any]], Any]]] = []
        metadata.add_broker_config_listener(self._stored)
        for entity in (DEFAULT_BROKER_ENTITY, self.entity):  # what the single node's journal holds already
            self._stored(entity, metadata.broker_configs(entity))

    # -- the interface ----------------------------------------------------------------------------
    def value(self, name: str) -> Any:
        """The effective typed value of a broker config (KeyError for an unknown name)."""
        return self.config.get(name)

    def add_listener(self, callback: Callable[[set[str]], None]) -> None:
        """``callback(changed names)`` after the effective value of some broker configs changed."""
        self._listeners.append(callback)

    def add_reconfigurable(self, concerns: Callable[[str], bool], validate: Callable[[Mapping[str, Any]], None],
                           reload: Callable[[Mapping[str, Any]], Any]) -> None:
        """A component Kafka reconfigures with validation (its Reconfigurable), given the effective configs
        (``values``) after an update: ``validate(values)`` before anything is stored when a config it
        ``concerns`` changes, or on any update of this broker's own configs, which reloads files changed in
        place (ConfigError: the update is refused as Kafka refuses an invalid dynamic configuration);
        ``reload(values)`` before such a per-broker update is stored when none of the values it concerns
        changes (Kafka's reloadUpdatedFilesWithoutConfigChange: SSL key and trust stores changed in place).
        Both run in a worker thread (they may read files and build TLS contexts): they must be thread-safe.
        Apply changed values through ``add_listener`` as usual (after they are stored)."""
        self._reconfigurables.append((concerns, validate, reload))

    # -- changes ----------------------------------------------------------------------------------
    def stored(self, entity: str) -> dict[str, str]:
        """The dynamic configs stored for ``entity`` (as strings, as AlterConfigs gave them)."""
        return self.metadata.broker_configs(entity)

    async def alter_async(self, entity: str, configs: dict[str, str], *, validate_only: bool = False,
                          version: int | None = None) -> None:
        """Replace ``entity``'s dynamic configs with ``configs`` (validated first; KafkaError); ``version``:
        only if the stored configs are still the ones read at that version (StaleConfigVersion)."""
        typed = parse_dynamic_configs(configs, per_broker=entity != DEFAULT_BROKER_ENTITY)
        if entity in self._typed:  # this broker's effective configs after the change must be valid as a whole
            broker = typed if entity == self.entity else self._typed[self.entity]
            default = typed if entity == DEFAULT_BROKER_ENTITY else self._typed[DEFAULT_BROKER_ENTITY]
            after, now = self.static.with_dynamic(broker, default).values, self.config.values
            try:
                if any(after[name] != now[name] for name in after if name.startswith("log.cleaner.")):
                    check_cleaner_configs(after, now)
                check_thread_pool_configs(after, now)
                if any(after[name] != now[name] for name in _LISTENER_CONFIGS):
                    check_listener_update(after, self.config)
                for concerns, validate, _ in self._reconfigurables:
                    if entity == self.entity or any(concerns(name) and after[name] != now.get(name) for name in after):
                        try:  # a worker thread: validating may read files and build TLS contexts
                            await asyncio.to_thread(validate, after)
                        except ConfigError as exc:
                            raise ReconfigurationError(exc.name, exc.message) from None
            except ReconfigurationError as exc:  # Kafka wraps a reconfigurable's refusal this way
                raise KafkaError(ErrorCode.invalid_request, f"Invalid value org.apache.kafka.common.config."
                                 f"ConfigException: {exc.message} for configuration Invalid dynamic configuration") from None
            except KafkaRequirement as exc:  # KafkaConfig's own requirements, as Kafka words a failed one
                raise KafkaError(ErrorCode.invalid_request, f"requirement failed: {exc.message}") from None
            except ConfigError as exc:  # Kafka's words already (listener configs that do not parse)
                raise KafkaError(ErrorCode.invalid_request, exc.message) from None
        if validate_only:
            return
        passwords = sorted(name for name in configs if broker_config_def(name).sensitive)
        if passwords:  # Kafka (ZooKeeper mode) stores them encrypted with password.encoder.secret, or refuses
            resource = "" if entity == DEFAULT_BROKER_ENTITY else entity
            reason = ("Password encoder secret not configured" if not self.config.get("password.encoder.secret") else
                      f"pykbroker does not store password configs ({listed_names(passwords)}): it would keep them unencrypted")
            raise KafkaError(ErrorCode.invalid_config,
                             f"Invalid config value for resource ConfigResource(type=BROKER, name='{resource}'): {reason}")
        if entity == self.entity:
            # Kafka's reloadUpdatedFilesWithoutConfigChange: a store file changed in place is reloaded now even
            # when no value changed - only by a component none of whose values change. Changed values apply
            # once stored (the change's notification), never before: a failed write must not leave the broker
            # serving what its stored configs do not say.
            after, now = self.static.with_dynamic(typed, self._typed[DEFAULT_BROKER_ENTITY]).values, self.config.values
            for concerns, _, reload in self._reconfigurables:
                if not any(concerns(name) and after.get(name) != now.get(name) for name in after.keys() | now.keys()):
                    await asyncio.to_thread(reload, after)
        log.info("updating dynamic configs of broker %s: %s", entity, configs)
        await self.metadata.set_broker_configs_async(entity, dict(configs), version=version)

    def _stored(self, entity: str, configs: Mapping[str, str]) -> None:
        """The backend's configs of ``entity`` (at start, or changed): apply the valid ones."""
        if entity not in self._typed:
            return
        typed: dict[str, Any] = {}
        for name, raw in configs.items():
            try:
                typed.update(parse_dynamic_configs({name: raw}, per_broker=entity != DEFAULT_BROKER_ENTITY))
            except KafkaError as exc:
                log.warning("ignoring the stored dynamic config %s=%r of broker entity %s: %s", name, raw, entity, exc)
        self._typed[entity] = typed
        before = self.config.values
        self.config = self.static.with_dynamic(self._typed[self.entity], self._typed[DEFAULT_BROKER_ENTITY])
        changed = {name for name, value in self.config.values.items() if before.get(name) != value}
        if changed:
            for callback in list(self._listeners):
                try:
                    callback(changed)
                except Exception:  # noqa: BLE001 - one listener's bug must not keep the others uninformed
                    log.exception("dynamic config listener %r failed", callback)

"""AlterConfigs (key 33) v0-2 and IncrementalAlterConfigs (key 44) v0-1: topic configs, dynamic broker
configs and group configs, as ``kafka-configs.sh --alter`` and the admin clients change them.

Behaviour (Kafka 3.7.1's ZkAdminManager / ConfigAdminManager):
- TOPIC resources: the topic's overrides are replaced by the request's (AlterConfigs) or by its current
  overrides with the operations applied (IncrementalAlterConfigs: SET, DELETE, APPEND and SUBTRACT, the
  last two for list configs only, from the current override or else the config's default).
  UNKNOWN_TOPIC_OR_PARTITION for a topic that does not exist; INVALID_CONFIG for an unknown name or an
  invalid value (cluster/topic_admin.py); the topic's live logs take the new configs at once. Kafka 3.7.1's
  deprecated topic configs are accepted and stored like the others: message.format.version (any version
  Kafka knows, "0.10.0.0" included) has no effect, and one older than 0.11 is logged as ignored, as Kafka
  logs it; message.timestamp.difference.max.ms bounds timestamps both ways where message.timestamp.before/
  after.max.ms are left at their default (log/config.py); message.downconversion.enable has no effect
  (pykbroker serves no fetch version that down-converts).
- BROKER resources: this broker's id, or "" for the cluster-wide default: its dynamic configs, validated
  and stored by cluster/dynamic_configs.py (every name Kafka 3.7.1 defines is known; INVALID_REQUEST for
  another broker's id, a config that is not dynamic, an SSL store setting without a listener prefix, an
  invalid value or a per-broker config as the cluster default, in Kafka's words; INVALID_CONFIG for an
  unknown name).
- GROUP resources (Kafka 4's per-group configs, both APIs as Kafka 4 accepts them; groups/configs.py):
  ``consumer.session.timeout.ms`` and ``consumer.heartbeat.interval.ms``, the group's whole set of overrides
  validated after the change (INVALID_CONFIG in Kafka's words: an unknown name, not an INT, outside the
  broker's group.consumer.min/max bounds, a session timeout not above the heartbeat interval); the group
  needs not exist; an empty group name is INVALID_REQUEST ("Default group resources are not allowed.");
  AlterConfigs with a null value: INVALID_REQUEST "Null value not supported for : <names>" as for the other
  types (Kafka 4's broker refuses it in ConfigAdminManager.preprocess before forwarding the request, so the
  controller's INVALID_CONFIG "Null value not supported for group configs" is only seen by a client talking
  to a controller); ALTER_CONFIGS on the group, else GROUP_AUTHORIZATION_FAILED (checked before the name).
- INVALID_REQUEST, as Kafka: a resource named twice in one request (every occurrence: "Each resource must
  appear at most once."), a config named twice in one resource (both APIs: "Error due to duplicate config
  keys", ConfigAdminManager.preprocess), a null value (except DELETE), an unknown operation, a TOPIC
  resource with an empty name ("Default topic resources are not allowed."), any other resource type.
  APPEND or SUBTRACT of a config that is not a list: INVALID_CONFIG. (Codes and messages checked against
  Kafka 3.7.1 in ZooKeeper and KRaft mode.) Error messages list at most 10 names.
- IncrementalAlterConfigs starts from the configs as the store has them now (cluster: the znode read from
  ZooKeeper, as Kafka's adminZkClient.fetchEntityConfig, not this broker's cache, which may be behind) and
  writes conditionally on the version read; if another write came in between, it reads and applies the
  operations again (up to 5 times, then UNKNOWN_SERVER_ERROR).
- Any other failure of one resource (ZooKeeper unreachable, ...) answers UNKNOWN_SERVER_ERROR for that
  resource only, without a message (Kafka's ApiError.fromThrowable), and is logged; the others are
  answered as usual.
- ``validate_only`` checks everything and changes nothing. Resources are independent: each gets its
  own error. Single node: the answer waits until the changes are durable (KAFKA_STORAGE_ERROR for every
  changed resource if the journal write failed); cluster: once ZooKeeper has them, as Kafka.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any, Awaitable, Callable

from pykbroker.cluster.dynamic_configs import broker_entity
from pykbroker.cluster.metadata import StaleConfigVersion
from pykbroker.config import TOPIC_CONFIGS, ConfigDef, broker_config_def, listed_names, warn_ignored_topic_configs
from pykbroker.groups.configs import GROUP_CONFIGS, GROUP_ENTITY_TYPE, GROUP_RESOURCE, check_group_name
from pykbroker.protocol.errors import ErrorCode, KafkaError
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, config_resource_denied
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers.topics_admin import _commit

log = logging.getLogger(__name__)

TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
_WRITE_ATTEMPTS = 5  # IncrementalAlterConfigs: reads and conditional writes before giving up


def _entity(ctx: RequestContext, resource) -> tuple[str, str, Callable[[str], ConfigDef | None], str]:
    """(stored entity type, entity name, a config name's definition or None, what the names are called) of a
    TOPIC or BROKER resource that may be changed here (a broker's listener overrides are typed as their base);
    KafkaError otherwise."""
    if resource.resource_type == TOPIC_RESOURCE:
        if not resource.resource_name:
            raise KafkaError(ErrorCode.invalid_request, "Default topic resources are not allowed.")
        if ctx.broker.metadata.topic(resource.resource_name) is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"The topic '{resource.resource_name}' does not exist.")
        return "topics", resource.resource_name, TOPIC_CONFIGS.get, "topic"
    if resource.resource_type == BROKER_RESOURCE:
        return "brokers", broker_entity(resource.resource_name, ctx.broker.broker_id), broker_config_def, "broker"
    if resource.resource_type == GROUP_RESOURCE:
        check_group_name(resource.resource_name)
        return GROUP_ENTITY_TYPE, resource.resource_name, GROUP_CONFIGS.get, "group"
    raise KafkaError(
        ErrorCode.invalid_request,
        f"Unknown resource type {resource.resource_type}",
    )


async def _replace(ctx: RequestContext, resource, configs: dict[str, str], validate_only: bool,
                   version: int | None = None) -> None:
    entity_type, name, _, _ = _entity(ctx, resource)
    if entity_type == "topics":
        await ctx.broker.topics.alter_configs_async(name, configs, validate_only=validate_only, version=version)
        if not validate_only:
            warn_ignored_topic_configs(name, configs, ctx.broker.dynamic_configs.value("inter.broker.protocol.version"))
    elif entity_type == GROUP_ENTITY_TYPE:
        await ctx.broker.group_configs.alter_async(name, configs, validate_only=validate_only, version=version)
    else:
        await ctx.broker.dynamic_configs.alter_async(name, configs, validate_only=validate_only, version=version)


def _preprocess(configs, null_allowed=lambda entry: False) -> None:
    """Kafka's ConfigAdminManager.preprocess, before anything about the resource itself is checked."""
    _check_duplicates(entry.name for entry in configs)
    _check_nulls(configs, null_allowed)


def _check_duplicates(names) -> None:
    """Kafka's containsDuplicates, in linear time (a request may name tens of thousands of configs)."""
    if any(count > 1 for count in Counter(names).values()):
        raise KafkaError(ErrorCode.invalid_request, "Error due to duplicate config keys")


def _check_nulls(entries, allowed=lambda entry: False) -> None:
    nulls = [entry.name for entry in entries if entry.value is None and not allowed(entry)]
    if nulls:
        raise KafkaError(ErrorCode.invalid_request, f"Null value not supported for : {listed_names(nulls)}")


def _items(text: str | None) -> list[str]:
    return [item.strip() for item in (text or "").split(",") if item.strip()]


def _apply_operations(configs: dict[str, str], operations, definition_of: Callable[[str], ConfigDef | None],
                      kind: str) -> dict[str, str]:
    """Kafka's prepareIncrementalConfigs on a copy of ``configs`` (``_preprocess`` checked the operations)."""
    result = dict(configs)
    for op in operations:
        if op.config_operation == SET:
            result[op.name] = op.value
        elif op.config_operation == DELETE:
            result.pop(op.name, None)
        elif op.config_operation in (APPEND, SUBTRACT):
            definition = definition_of(op.name)
            if definition is None:
                raise KafkaError(ErrorCode.invalid_config, f"Unknown {kind} config name: {op.name}")
            verb = "append" if op.config_operation == APPEND else "subtract"
            if definition.type != "list":
                raise KafkaError(ErrorCode.invalid_config, f"Config value {verb} is not allowed for config key: {op.name}")
            old = _items(result[op.name]) if op.name in result else list(definition.default or [])
            if op.config_operation == APPEND:
                new = old + _items(op.value)
            else:
                removed = _items(op.value)
                new = [item for item in old if item not in removed]
            result[op.name] = ",".join(new)
        else:
            raise KafkaError(ErrorCode.invalid_request, f"Unknown config operation {op.config_operation} for {op.name}")
    return result


async def _alter(ctx: RequestContext, request, change: Callable[[Any], Awaitable[None]]) -> list[tuple[Any, KafkaError | None]]:
    """Run ``change(resource)`` per resource (duplicates refused first); then await durability."""
    seen: dict[tuple[int, str], int] = {}
    for resource in request.resources:
        key = (resource.resource_type, resource.resource_name)
        seen[key] = seen.get(key, 0) + 1
    results: list[tuple[Any, KafkaError | None]] = []
    changed: list[int] = []
    for resource in request.resources:
        if seen[(resource.resource_type, resource.resource_name)] > 1:
            results.append((resource, KafkaError(ErrorCode.invalid_request, "Each resource must appear at most once.")))
            continue
        denied = config_resource_denied(ctx, AclOperation.ALTER_CONFIGS, resource.resource_type,
                                        resource.resource_name)
        if denied is not None:  # Kafka: ALTER_CONFIGS on the topic, or on the cluster for a broker
            results.append((resource, KafkaError(denied[0], None)))
            continue
        try:
            await change(resource)
        except KafkaError as exc:
            results.append((resource, exc))
            continue
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - Kafka's ApiError.fromThrowable: this resource fails, not the request
            log.exception("cannot alter the configs of resource type %s name %r",
                          resource.resource_type, resource.resource_name)
            results.append((resource, KafkaError(ErrorCode.unknown_server_error, None)))
            continue
        results.append((resource, None))
        if not request.validate_only:
            changed.append(len(results) - 1)
    if changed:
        not_durable = await _commit(ctx)
        if not_durable is not None:
            for index in changed:
                results[index] = (results[index][0], not_durable)
    return results


def _response(ctx: RequestContext, schema, response_type, results) -> object:
    return make(
        response_type,
        throttle_time=0,
        responses=tuple(
            make(
                schema.AlterConfigsResourceResponse,
                error_code=error.code if error is not None else ErrorCode.none,
                error_message=(error.message if error is not None else None),
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
            )
            for resource, error in results
        ),
    )


@handles(33)
async def alter_configs(ctx: RequestContext, request) -> object:
    async def change(resource) -> None:
        _preprocess(resource.configs)  # Kafka 4's broker: before forwarding, GROUP resources too
        _entity(ctx, resource)  # the resource exists and may be changed here
        await _replace(ctx, resource, {entry.name: entry.value for entry in resource.configs}, request.validate_only)

    schema = response_module(ctx)
    return _response(ctx, schema, schema.AlterConfigsResponse, await _alter(ctx, request, change))


@handles(44)
async def incremental_alter_configs(ctx: RequestContext, request) -> object:
    async def change(resource) -> None:
        _preprocess(resource.configs, lambda op: op.config_operation == DELETE)
        entity_type, name, definition_of, kind = _entity(ctx, resource)
        for _ in range(_WRITE_ATTEMPTS):
            current, version = await ctx.broker.metadata.read_entity_configs_async(entity_type, name)
            configs = _apply_operations(current, resource.configs, definition_of, kind)
            try:
                await _replace(ctx, resource, configs, request.validate_only, version)
                return
            except StaleConfigVersion:
                continue  # another write came in between: read again
        raise KafkaError(ErrorCode.unknown_server_error, f"The configs of {kind} '{name}' kept changing; try again.")

    schema = response_module(ctx)
    return _response(ctx, schema, schema.IncrementalAlterConfigsResponse, await _alter(ctx, request, change))

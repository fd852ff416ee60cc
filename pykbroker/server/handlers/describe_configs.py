"""DescribeConfigs (key 32), v1-4.

Behaviour: TOPIC resources list every topic config with its value and source (TOPIC_CONFIG for an
override; else, as Kafka's ConfigHelper, the source at the head of its broker synonyms:
DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG, or DEFAULT_CONFIG; so a
retention that only ``log.retention.hours`` sets shows DEFAULT_CONFIG, as in Kafka, where CreateTopics
says STATIC_BROKER_CONFIG), with synonyms when asked and types/documentation from v3. BROKER resources, as Kafka's ConfigHelper: this broker's id lists every
broker config with its effective value (dynamic configs included), its source and Kafka's synonyms
(the key's synonym group, layer by layer: this broker's dynamic configs, the cluster default's, static,
default); "" (the cluster default) lists only the dynamic default configs that are set. Dynamic
configs (cluster/dynamic_configs.py) have read_only false. Listener overrides set in the config file or
dynamically (``listener.name.<listener>.<config>``) follow the broker's configs, read-only with their base as a synonym,
as Kafka lists them. GROUP resources (Kafka 4, groups/configs.py): ``consumer.session.timeout.ms`` and
``consumer.heartbeat.interval.ms``, GROUP_CONFIG where the group overrides them, else DEFAULT_CONFIG (the broker's
group.consumer.* values), whether the group exists or not; an empty name is INVALID_REQUEST; DESCRIBE_CONFIGS on
the group, else GROUP_AUTHORIZATION_FAILED. Unknown topic: UNKNOWN_TOPIC_OR_PARTITION;
another broker's id: INVALID_REQUEST; other resource types: INVALID_REQUEST. Sensitive values are null.
"""

from __future__ import annotations

from typing import Any

from pykbroker.config import BROKER_CONFIGS, TOPIC_CONFIGS, ConfigDef, ConfigSource, broker_config_def
from pykbroker.groups.configs import GROUP_RESOURCE
from pykbroker.protocol.errors import ErrorCode, KafkaError
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, config_resource_denied
from pykbroker.server.handlers._build import make, response_module

TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4


def _entry(schema, definition: ConfigDef, value: Any, source: int, synonyms: list, include_docs: bool) -> object:
    """One config entry; ``value`` is typed (or a raw override string), ``synonyms`` (name, text, source)."""
    return make(
        schema.DescribeConfigsResourceResult,
        name=definition.name,
        value=definition.format(value),
        read_only=definition.read_only,
        config_source=int(source),
        is_default=source == ConfigSource.DEFAULT_CONFIG,
        is_sensitive=definition.sensitive,
        synonyms=tuple(make(schema.DescribeConfigsSynonym, name=n, value=v, source=int(s)) for n, v, s in synonyms),
        config_type=definition.type_id,
        documentation=definition.doc if include_docs else None,
    )


def _topic_configs(ctx: RequestContext, schema, name: str, keys, request) -> tuple[ErrorCode, str | None, tuple]:
    broker = ctx.broker
    info = broker.metadata.topic(name)
    if info is None:
        return ErrorCode.unknown_topic_or_partition, f"Topic {name} does not exist", ()
    include_synonyms = getattr(request, "include_synonyms", False)
    include_docs = getattr(request, "include_documentation", False)
    entries = []
    for key, (value, source) in broker.topics.effective_configs(name).items():
        if keys is not None and key not in keys:
            continue
        definition = TOPIC_CONFIGS[key]
        synonyms = broker.dynamic_configs.config.topic_config_synonyms(key)
        if key in info.configs:
            synonyms.insert(0, (key, definition.format(value), ConfigSource.DYNAMIC_TOPIC_CONFIG))
        if source != ConfigSource.DYNAMIC_TOPIC_CONFIG:  # Kafka: the head of the synonyms, not the supplier
            source = synonyms[0][2] if synonyms else ConfigSource.DEFAULT_CONFIG
        entries.append(_entry(schema, definition, value, source, synonyms if include_synonyms else [], include_docs))
    return ErrorCode.none, None, tuple(entries)


def _broker_configs(ctx: RequestContext, schema, name: str, keys, request) -> tuple[ErrorCode, str | None, tuple]:
    config = ctx.broker.dynamic_configs.config
    if name not in ("", str(ctx.broker.broker_id)):
        return ErrorCode.invalid_request, f"Unexpected broker id, expected {ctx.broker.broker_id} but received {name}", ()
    include_docs = getattr(request, "include_documentation", False)
    include_synonyms = getattr(request, "include_synonyms", False)
    per_broker = name != ""
    entries = []
    set_here = (*config.dynamic_broker, *config.explicit) if per_broker else ()  # the static ones: a config file's
    overrides = sorted({*config.dynamic_default, *set_here} - BROKER_CONFIGS.keys())
    for key, definition in [*BROKER_CONFIGS.items(), *((name, broker_config_def(name)) for name in overrides)]:
        if keys is not None and key not in keys:
            continue
        if not per_broker and key not in config.dynamic_default:
            continue
        synonyms = config.broker_config_synonyms(key, per_broker=per_broker)
        source = synonyms[0][2] if synonyms else ConfigSource.DEFAULT_CONFIG
        value = config.get(key) if per_broker else config.dynamic_default[key]
        entries.append(_entry(schema, definition, value, source, synonyms if include_synonyms else [], include_docs))
    return ErrorCode.none, None, tuple(entries)


def _group_configs(ctx: RequestContext, schema, name: str, keys, request) -> tuple[ErrorCode, str | None, tuple]:
    """Kafka's ConfigHelper GROUP branch: every group config, its one synonym of its own source."""
    include_docs = getattr(request, "include_documentation", False)
    include_synonyms = getattr(request, "include_synonyms", False)
    entries = []
    for definition, value, source in ctx.broker.group_configs.describe(name):
        if keys and definition.name not in keys:
            continue
        synonyms = [(definition.name, definition.format(value), source)] if include_synonyms else []
        entries.append(_entry(schema, definition, value, source, synonyms, include_docs))
    return ErrorCode.none, None, tuple(entries)


@handles(32)
def describe_configs(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    results = []
    for resource in request.resources:
        keys = set(resource.configuration_keys) if resource.configuration_keys is not None else None
        denied = config_resource_denied(ctx, AclOperation.DESCRIBE_CONFIGS, resource.resource_type,
                                        resource.resource_name)
        if denied is not None:  # Kafka: DESCRIBE_CONFIGS on the topic, or on the cluster for a broker
            (error, message), configs = denied, ()
        elif resource.resource_type == TOPIC_RESOURCE:
            error, message, configs = _topic_configs(ctx, schema, resource.resource_name, keys, request)
        elif resource.resource_type == BROKER_RESOURCE:
            error, message, configs = _broker_configs(ctx, schema, resource.resource_name, keys, request)
        elif resource.resource_type == GROUP_RESOURCE:
            try:
                error, message, configs = _group_configs(ctx, schema, resource.resource_name, keys, request)
            except KafkaError as exc:
                error, message, configs = exc.code, exc.message, ()
        else:
            error, message, configs = ErrorCode.invalid_request, f"Unsupported resource type {resource.resource_type}", ()
        results.append(
            make(
                schema.DescribeConfigsResult,
                error_code=error,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
                configs=configs,
            )
        )
    return make(schema.DescribeConfigsResponse, throttle_time=0, results=tuple(results))

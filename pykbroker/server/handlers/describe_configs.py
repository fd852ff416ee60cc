"""DescribeConfigs (key 32), v1-4.

Behaviour: TOPIC resources list every topic config with its value and source (TOPIC_CONFIG for an
override, STATIC_BROKER_CONFIG when the broker file set the synonym, DEFAULT_CONFIG otherwise), with
synonyms when asked and types/documentation from v3. BROKER resources (name = this broker's id, or ""
for cluster defaults) list the broker configs. Unknown topic: UNKNOWN_TOPIC_OR_PARTITION; another
broker's id: INVALID_REQUEST; other resource types: INVALID_REQUEST. Sensitive values are null.
"""

from __future__ import annotations

from typing import Any

from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._build import make, response_module

TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
SOURCE_TOPIC, SOURCE_STATIC_BROKER, SOURCE_DEFAULT = 1, 4, 5
CONFIG_TYPES = {"boolean": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6, "list": 7, "class": 8, "password": 9}


def config_string(value: Any) -> str | None:
    """A config value as Kafka prints it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def is_sensitive(definition) -> bool:
    return getattr(definition, "type", "") == "password" or bool(getattr(definition, "sensitive", False))


def _entry(schema, definition, name: str, value: Any, source: int, synonyms: list, include_docs: bool) -> object:
    sensitive = is_sensitive(definition)
    return make(
        schema.DescribeConfigsResourceResult,
        name=name,
        value=None if sensitive else config_string(value),
        read_only=bool(getattr(definition, "read_only", False)),
        config_source=source,
        is_default=source == SOURCE_DEFAULT,
        is_sensitive=sensitive,
        synonyms=tuple(
            make(schema.DescribeConfigsSynonym, name=n, value=None if sensitive else config_string(v), source=s)
            for n, v, s in synonyms
        ),
        config_type=CONFIG_TYPES.get(getattr(definition, "type", "string"), 0),
        documentation=getattr(definition, "doc", None) if include_docs else None,
    )


def _topic_configs(ctx: RequestContext, schema, name: str, keys, request) -> tuple[ErrorCode, str | None, tuple]:
    from pykbroker.config import TOPIC_CONFIGS

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
        synonyms = []
        if include_synonyms:
            if key in info.configs:
                synonyms.append((key, info.configs[key], SOURCE_TOPIC))
            broker_value, broker_source = broker.config.topic_config_source(key)
            synonym_names = getattr(TOPIC_CONFIGS[key], "synonyms", ()) or ()
            if broker_source == SOURCE_STATIC_BROKER:
                synonyms.extend((syn, broker_value, SOURCE_STATIC_BROKER) for syn in synonym_names[:1])
            synonyms.extend((syn, broker_value, SOURCE_DEFAULT) for syn in synonym_names[:1])
        entries.append(_entry(schema, TOPIC_CONFIGS[key], key, value, source, synonyms, include_docs))
    return ErrorCode.none, None, tuple(entries)


def _broker_configs(ctx: RequestContext, schema, name: str, keys, request) -> tuple[ErrorCode, str | None, tuple]:
    from pykbroker.config import BROKER_CONFIGS

    config = ctx.broker.config
    if name not in ("", str(ctx.broker.broker_id)):
        return ErrorCode.invalid_request, f"Unexpected broker id, expected {ctx.broker.broker_id} but received {name}", ()
    include_docs = getattr(request, "include_documentation", False)
    include_synonyms = getattr(request, "include_synonyms", False)
    entries = []
    for key, definition in BROKER_CONFIGS.items():
        if keys is not None and key not in keys:
            continue
        value = config.get(key)
        source = SOURCE_STATIC_BROKER if key in config.explicit else SOURCE_DEFAULT
        synonyms = [(key, value, source)] if include_synonyms else []
        entries.append(_entry(schema, definition, key, value, source, synonyms, include_docs))
    return ErrorCode.none, None, tuple(entries)


@handles(32)
def describe_configs(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    results = []
    for resource in request.resources:
        keys = set(resource.configuration_keys) if resource.configuration_keys is not None else None
        if resource.resource_type == TOPIC_RESOURCE:
            error, message, configs = _topic_configs(ctx, schema, resource.resource_name, keys, request)
        elif resource.resource_type == BROKER_RESOURCE:
            error, message, configs = _broker_configs(ctx, schema, resource.resource_name, keys, request)
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

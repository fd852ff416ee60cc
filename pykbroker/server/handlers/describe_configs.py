"""DescribeConfigs (key 32), v1-4.

Behaviour: TOPIC resources list every topic config with its value and source (TOPIC_CONFIG for an
override, STATIC_BROKER_CONFIG when the broker file set the synonym, DEFAULT_CONFIG otherwise), with
synonyms when asked and types/documentation from v3. BROKER resources (name = this broker's id, or ""
for cluster defaults) list the broker configs. Unknown topic: UNKNOWN_TOPIC_OR_PARTITION; another
broker's id: INVALID_REQUEST; other resource types: INVALID_REQUEST. Sensitive values are null.
"""

from __future__ import annotations

from typing import Any

from pykbroker.config import BROKER_CONFIGS, TOPIC_CONFIGS, ConfigDef, ConfigSource
from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
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
        synonyms = []
        if include_synonyms:
            if key in info.configs:
                synonyms.append((key, definition.format(value), ConfigSource.DYNAMIC_TOPIC_CONFIG))
            synonyms.extend(broker.config.topic_config_synonyms(key))
        entries.append(_entry(schema, definition, value, source, synonyms, include_docs))
    return ErrorCode.none, None, tuple(entries)


def _broker_configs(ctx: RequestContext, schema, name: str, keys, request) -> tuple[ErrorCode, str | None, tuple]:
    config = ctx.broker.config
    if name not in ("", str(ctx.broker.broker_id)):
        return ErrorCode.invalid_request, f"Unexpected broker id, expected {ctx.broker.broker_id} but received {name}", ()
    include_docs = getattr(request, "include_documentation", False)
    include_synonyms = getattr(request, "include_synonyms", False)
    entries = []
    for key, definition in BROKER_CONFIGS.items():
        if keys is not None and key not in keys:
            continue
        value, source = config.broker_config_source(key)
        synonyms = [(key, definition.format(value), source)] if include_synonyms else []
        entries.append(_entry(schema, definition, value, source, synonyms, include_docs))
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

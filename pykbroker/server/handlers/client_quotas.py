"""DescribeClientQuotas (key 48) v0-1 and AlterClientQuotas (key 49) v0-1 (KIP-546), as Kafka 3.7.1 in
ZooKeeper mode answers them (KafkaApis.handleDescribeClientQuotasRequest / handleAlterClientQuotasRequest over
ZkAdminManager); the semantics are security/quota_store.py's ``describe`` and ``plan_alter``.

Behaviour: any broker serves both. With an authorizer, AlterClientQuotas needs ALTER_CONFIGS and
DescribeClientQuotas DESCRIBE_CONFIGS on the cluster, else CLUSTER_AUTHORIZATION_FAILED (for every entry of an
alter, as Kafka's getErrorResponse). AlterClientQuotas reads each named entity's whole stored config from the
store itself (the journal, or ZooKeeper's /config/users|clients|ips znode with its zkVersion), applies the
entry's ops, and writes the whole config back (a user's SCRAM credentials in the same znode are kept), with
Kafka's change notification; a write that meets a concurrent change (zkVersion moved) is planned again from
what is stored now. Errors are per entity: INVALID_REQUEST with Kafka's messages (unknown key, a byte rate
that is not a whole number, an empty or bad entity), UNKNOWN_SERVER_ERROR for a SCRAM key, as Kafka.
Several entries for one entity are written once, the entity's final config, conditionally. On a single node the
answer waits for the metadata journal's commit (as AlterConfigs); a failed commit turns each changed entity's
success into its error. ``validate_only`` checks and writes nothing. The change reaches this broker's quotas at once and every other
broker's through the change notification (security/client_entities.py).
DescribeClientQuotas answers from the entity configs this broker follows (the journal; in a cluster, the
configs read from ZooKeeper at start and on each change notification, so a change made through another broker
shows once its notification arrived here, normally within a second); a filter Kafka refuses gets its error
and message for the whole response, with null entries.
"""

from __future__ import annotations

import dataclasses
import logging

from pykbroker.cluster.metadata import StaleConfigVersion
from pykbroker.protocol.errors import ErrorCode
from pykbroker.security.acl import AclOperation
from pykbroker.security.quota_store import (
    QuotaRequestError,
    alterations_from_request,
    components_from_request,
    config_path,
    describe,
    plan_alter,
)
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import cluster_allowed, denied_answer
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers.topics_admin import _commit

log = logging.getLogger(__name__)

CONFIG_PREFIX = "/config/"
MAX_WRITE_ATTEMPTS = 5  # plans made again after a concurrent change of a znode (Kafka retries none: it races)


def _entity_data(cls, entity: dict) -> tuple:
    return tuple(make(cls, entity_type=kind, entity_name=name) for kind, name in entity.items())


@handles(48)
def describe_client_quotas(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    if not cluster_allowed(ctx, AclOperation.DESCRIBE_CONFIGS):
        # Kafka's getErrorResponse answers null entries (error_answers' build gives an empty array)
        return dataclasses.replace(denied_answer(ctx, ErrorCode.cluster_authorization_failed), entries=None)
    table = ctx.broker.metadata.client_entity_configs()
    try:
        found = describe(components_from_request(request.components), request.strict, table)
    except QuotaRequestError as exc:
        return make(schema.DescribeClientQuotasResponse, throttle_time=0, error_code=ErrorCode(exc.error_code),
                    error_message=exc.message, entries=None)
    entries = tuple(
        make(schema.EntryData, entity=_entity_data(schema.EntityData, entity),
             values=tuple(make(schema.ValueData, key=key, value=value) for key, value in values.items()))
        for entity, values in found
    )
    # Kafka leaves the message at the schema's default, "" (not null), when the description succeeds
    return make(schema.DescribeClientQuotasResponse, throttle_time=0, error_code=ErrorCode.none,
                error_message="", entries=entries)


@handles(49)
async def alter_client_quotas(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    if not cluster_allowed(ctx, AclOperation.ALTER_CONFIGS):
        return denied_answer(ctx, ErrorCode.cluster_authorization_failed)
    alterations = alterations_from_request(request.entries)
    metadata = ctx.broker.metadata
    for attempt in range(MAX_WRITE_ATTEMPTS):
        stored: dict[str, tuple[dict[str, str], int | None]] = {}
        plan = plan_alter(alterations, lambda path: _read_later(stored, path), validate_only=request.validate_only)
        # The plan asked for the entity paths it needs; read them from the store (not a cache), then plan again
        # over what is stored, so that the versions written against are the ones read.
        for path in list(stored):
            stored[path] = await metadata.read_entity_configs_async(*path[len(CONFIG_PREFIX):].split("/", 1))
        plan = plan_alter(alterations, lambda path: stored[path][0] if path in stored else {},
                          validate_only=request.validate_only)
        try:
            await _write(metadata, plan.writes, stored)
        except StaleConfigVersion:
            if attempt + 1 == MAX_WRITE_ATTEMPTS:
                raise
            log.debug("AlterClientQuotas: an entity changed while it was altered; planning again")
            continue
        break
    results = plan.results
    if plan.writes:
        # As AlterConfigs: answered once the change is durable (the single-node journal), else the changed
        # entities get the commit's error.
        not_durable = await _commit(ctx)
        if not_durable is not None:
            results = [(entity, int(not_durable.code), not_durable.message) if code == 0 else (entity, code, message)
                       for entity, code, message in results]
    entries = tuple(
        make(schema.EntryData, error_code=ErrorCode(code), error_message=message, entity=_entity_data(schema.EntityData, entity))
        for entity, code, message in results
    )
    return make(schema.AlterClientQuotasResponse, throttle_time=0, entries=entries)


def _read_later(stored: dict, path: str) -> dict[str, str]:
    """The first planning pass only collects the paths to read."""
    stored.setdefault(path, ({}, None))
    return {}


async def _write(metadata, writes, stored: dict) -> None:
    """Each entity's whole new config, conditional on the version read. Several entries for one entity: the
    plan's last config for it holds them all, written once (a second, unconditional write after an await could
    overwrite a concurrent change of the entity, e.g. a user's SCRAM credentials)."""
    final: dict[str, dict[str, str]] = {}
    for entity, config in writes:
        final[config_path(entity)] = config
    for path, config in final.items():
        await metadata.set_client_entity_configs_async(path[len(CONFIG_PREFIX):], config,
                                                       version=stored.get(path, ({}, None))[1])

"""DescribeAcls (key 29), CreateAcls (key 30), DeleteAcls (key 31), v1-3.

Behaviour (Kafka 3.7.1's AclApis in ZooKeeper mode): DescribeAcls needs DESCRIBE on the cluster,
CreateAcls and DeleteAcls ALTER on the cluster (else CLUSTER_AUTHORIZATION_FAILED for the whole request:
DescribeAcls' error, each creation's / filter's error). Without an authorizer (``authorizer.class.name``
empty) they answer SECURITY_DISABLED ("No Authorizer is configured on the broker" / "No Authorizer is
configured."). The request fields become bindings and filters as security/acl.py reads them (a request
Kafka cannot parse - an UNKNOWN code - closes the connection, as Kafka's does); the authorizer plans each
change (security/authorizer.py plan_create / plan_delete: Kafka's per-binding errors) and the broker's ACL
store (cluster/acls.py: the journal on a single node, ZooKeeper's /kafka-acl in a cluster) persists each
changed resource pattern before it is answered, both under the store's lock, each change applied to the
pattern's ACLs as the store reads them (two requests at once keep each other's ACLs); a pattern that cannot be persisted answers
UNKNOWN_SERVER_ERROR for its bindings. Kafka 3.7.1 also advertises version 0 of the three (literal
patterns only); pykbroker's codecs (kio) start at version 1, which every client since Kafka 2.0 sends.
"""

from __future__ import annotations

import logging

from pykbroker.protocol.errors import ErrorCode, KafkaError
from pykbroker.security.acl import (
    AclBinding, MalformedAclRequest, creation_bindings, delete_filters, describe_filter,
)
from pykbroker.security.acl_store import check_storable
from pykbroker.server.dispatch import CloseConnection, RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, cluster_allowed, enabled
from pykbroker.server.handlers._build import make, response_module

log = logging.getLogger(__name__)

_NO_AUTHORIZER = "No Authorizer is configured."


def _denied(ctx: RequestContext) -> KafkaError:
    return KafkaError(ErrorCode.cluster_authorization_failed,
                      f"Request of {ctx.principal} from {ctx.peer} is not authorized.")


def _check(ctx: RequestContext, operation: AclOperation) -> KafkaError | None:
    """Kafka's order: the cluster permission first (always granted without an authorizer), then whether
    there is an authorizer at all."""
    if not cluster_allowed(ctx, operation):
        return _denied(ctx)
    if not enabled(ctx):
        return KafkaError(ErrorCode.security_disabled, _NO_AUTHORIZER)
    return None


def _code(error: KafkaError | None) -> tuple[ErrorCode, str | None]:
    return (ErrorCode.none, None) if error is None else (error.code, error.message)


async def _change(ctx: RequestContext, make_plan):
    """Plan and persist one request's ACL changes under the store's lock (Kafka's createAcls / deleteAcls
    hold the authorizer's lock), each pattern's change applied by the store to the set it reads; a failure
    fails that pattern only. Returns the plan."""
    store = ctx.broker.acl_store
    async with store.lock:
        plan = make_plan()
        for pattern, change in list(plan.changes.items()):
            try:
                await store.update(pattern, change)
            except Exception as exc:  # noqa: BLE001 - ZooKeeper or the disk failed: Kafka answers UNKNOWN_SERVER_ERROR
                log.warning("cannot store the ACLs of %s: %r", pattern, exc)
                plan.fail(pattern, KafkaError(ErrorCode.unknown_server_error, f"Failed to update ACLs: {exc}"))
    return plan


def _read(ctx: RequestContext, what: str, parse, operation: AclOperation):
    """(the request read as security/acl.py reads it, None, the error refusing it whole or None); or (None,
    the connection closed, None), as Kafka closes it for a request it cannot parse."""
    try:
        return parse(), None, _check(ctx, operation)
    except MalformedAclRequest as exc:
        return None, CloseConnection(f"malformed {what} request: {exc}"), None


@handles(29)
def describe_acls(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    binding_filter, closed, error = _read(ctx, "DescribeAcls", lambda: describe_filter(request, ctx.version),
                                          AclOperation.DESCRIBE)
    if closed is not None:
        return closed
    if error is not None:
        code, message = _code(error)
        if code == ErrorCode.security_disabled:
            message = "No Authorizer is configured on the broker"
        return make(schema.DescribeAclsResponse, throttle_time=0, error_code=code, error_message=message,
                    resources=())
    by_pattern: dict = {}
    for binding in ctx.broker.authorizer.acls(binding_filter):
        by_pattern.setdefault(binding.pattern, []).append(binding.entry)
    resources = tuple(
        make(schema.DescribeAclsResource, resource_type=int(pattern.resource_type), resource_name=pattern.name,
             pattern_type=int(pattern.pattern_type),
             acls=tuple(make(schema.AclDescription, principal=e.principal, host=e.host, operation=int(e.operation),
                             permission_type=int(e.permission_type)) for e in entries))
        for pattern, entries in by_pattern.items())
    return make(schema.DescribeAclsResponse, throttle_time=0, error_code=ErrorCode.none, error_message=None,
                resources=resources)


@handles(30)
async def create_acls(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    parsed, closed, error = _read(ctx, "CreateAcls", lambda: creation_bindings(request.creations, ctx.version),
                                  AclOperation.ALTER)
    if closed is not None:
        return closed

    def answer(errors: list[KafkaError | None]) -> object:
        return make(schema.CreateAclsResponse, throttle_time=0, results=tuple(
            make(schema.AclCreationResult, error_code=_code(e)[0], error_message=_code(e)[1]) for e in errors))

    if error is not None:
        return answer([error] * len(parsed))
    results: list[KafkaError | None] = [item if isinstance(item, KafkaError) else None for item in parsed]
    valid = [(index, item) for index, item in enumerate(parsed) if isinstance(item, AclBinding)]
    if valid:
        plan = await _change(ctx, lambda: ctx.broker.authorizer.plan_create([binding for _, binding in valid],
                                                                            check=check_storable))
        for (index, _), result in zip(valid, plan.results):
            results[index] = result
    return answer(results)


@handles(31)
async def delete_acls(ctx: RequestContext, request) -> object:
    filters, closed, error = _read(ctx, "DeleteAcls", lambda: delete_filters(request.filters, ctx.version),
                                   AclOperation.ALTER)
    if closed is not None:
        return closed
    schema = response_module(ctx)
    if error is not None:
        code, message = _code(error)
        return make(schema.DeleteAclsResponse, throttle_time=0, filter_results=tuple(
            make(schema.DeleteAclsFilterResult, error_code=code, error_message=message, matching_acls=())
            for _ in filters))
    plan = await _change(ctx, lambda: ctx.broker.authorizer.plan_delete(filters))

    def matching(binding: AclBinding, error: KafkaError | None):
        code, message = _code(error)
        pattern, entry = binding.pattern, binding.entry
        return make(schema.DeleteAclsMatchingAcl, error_code=code, error_message=message,
                    resource_type=int(pattern.resource_type), resource_name=pattern.name,
                    pattern_type=int(pattern.pattern_type), principal=entry.principal, host=entry.host,
                    operation=int(entry.operation), permission_type=int(entry.permission_type))

    return make(schema.DeleteAclsResponse, throttle_time=0, filter_results=tuple(
        make(schema.DeleteAclsFilterResult, error_code=ErrorCode.none, error_message=None,
             matching_acls=tuple(matching(binding, err) for binding, err in deleted))
        for deleted in plan.results))

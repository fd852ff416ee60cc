"""Authorization for the handlers: the one place a handler asks "may this request's principal do that?".

Every check goes through the broker's authorizer (``ctx.broker.authorizer``, an AclAuthorizer; None when
``authorizer.class.name`` is empty, and then everything is allowed, as a Kafka broker without an
authorizer allows it). The principal is the request's (``ctx.principal``), the host the peer address as
Java prints it (Kafka compares ACL hosts with ``InetAddress.getHostAddress()``), the request name the
ApiKeys name Kafka's audit lines carry ("PRODUCE"). Which operation on which resource each API needs is
Kafka 3.7.1's KafkaApis: each handler asks where it decides, with these helpers:

    if not allowed(ctx, AclOperation.WRITE, ResourceType.TOPIC, topic): ...TOPIC_AUTHORIZATION_FAILED
    permitted = allowed_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, names)   # Kafka's filterByAuthorized
    cluster_allowed(ctx, AclOperation.CLUSTER_ACTION)                                  # the cluster resource
    operations(ctx, ResourceType.GROUP, group, GROUP_OPERATIONS)                       # authorized-operations bits
"""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING, Iterable

from pykbroker.protocol.apis import SUPPORTED_APIS
from pykbroker.protocol.errors import ErrorCode
from pykbroker.security.acl import AUTHORIZATION_ERRORS, CLUSTER_NAME, AclOperation, Resource, ResourceType
from pykbroker.security.authorizer import java_host_address

if TYPE_CHECKING:
    from pykbroker.server.dispatch import RequestContext

__all__ = ("AclOperation", "ResourceType", "enabled", "allowed", "allowed_names", "cluster_allowed",
           "operations", "idempotent_write_allowed", "any_allowed", "denied_error", "CLUSTER_DENIED_MESSAGE")

_SNAKE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _request_name(ctx: "RequestContext") -> str:
    api = SUPPORTED_APIS.get(ctx.request.api_key)
    return _SNAKE.sub("_", api.name).upper() if api is not None else str(ctx.request.api_key)


def _host(ctx: "RequestContext") -> str:
    return java_host_address(ctx.peer.rpartition(":")[0] or ctx.peer)


def _authorizer(ctx: "RequestContext"):
    # (getattr: the handlers' unit tests run them on a stand-in broker without the attribute)
    return getattr(ctx.broker, "authorizer", None)


def enabled(ctx: "RequestContext") -> bool:
    """Whether the broker has an authorizer (without one every check below allows)."""
    return _authorizer(ctx) is not None


def allowed(ctx: "RequestContext", operation: AclOperation, resource_type: ResourceType, name: str, *,
            ref_count: int = 1, log_if_denied: bool = True) -> bool:
    """May the request's principal do ``operation`` on the resource (Kafka's AuthHelper.authorize)?"""
    authorizer = _authorizer(ctx)
    if authorizer is None:
        return True
    return authorizer.authorize(ctx.principal, _host(ctx), operation, Resource(resource_type, name),
                                request=_request_name(ctx), ref_count=ref_count, log_if_denied=log_if_denied)


def cluster_allowed(ctx: "RequestContext", operation: AclOperation, *, log_if_denied: bool = True) -> bool:
    return allowed(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME, log_if_denied=log_if_denied)


def allowed_names(ctx: "RequestContext", operation: AclOperation, resource_type: ResourceType,
                  names: Iterable[str], *, log_if_denied: bool = True) -> set[str]:
    """The names among ``names`` the principal may do ``operation`` on, each asked once with its count
    (Kafka's AuthHelper.filterByAuthorized)."""
    authorizer = _authorizer(ctx)
    if authorizer is None:
        return set(names)
    host, request = _host(ctx), _request_name(ctx)  # once for the request, not per name
    return {name for name, count in Counter(names).items()
            if authorizer.authorize(ctx.principal, host, operation, Resource(resource_type, name), request=request,
                                    ref_count=count, log_if_denied=log_if_denied)}


def any_allowed(ctx: "RequestContext", operation: AclOperation, resource_type: ResourceType) -> bool:
    """May the principal do ``operation`` on some resource of the type (Kafka's authorizeByResourceType)?"""
    authorizer = _authorizer(ctx)
    if authorizer is None:
        return True
    return authorizer.authorize_by_resource_type(ctx.principal, _host(ctx), operation, resource_type,
                                                 request=_request_name(ctx))


def idempotent_write_allowed(ctx: "RequestContext") -> bool:
    """InitProducerId without a transactional id: IDEMPOTENT_WRITE on the cluster or WRITE on any topic."""
    authorizer = _authorizer(ctx)
    if authorizer is None:
        return True
    return authorizer.authorize_idempotent_producer(ctx.principal, _host(ctx), request=_request_name(ctx))


def operations(ctx: "RequestContext", resource_type: ResourceType, name: str, supported: int) -> int:
    """The authorized-operations bit field of a resource: ``supported`` (every operation the type
    supports) without an authorizer, else what the principal's ACLs allow (Kafka's authorizedOperations)."""
    authorizer = _authorizer(ctx)
    if authorizer is None:
        return supported
    return authorizer.authorized_operations(ctx.principal, _host(ctx), Resource(resource_type, name))


def denied_error(resource_type: ResourceType) -> ErrorCode:
    """The error a denied request gets for a resource of this type (TOPIC_AUTHORIZATION_FAILED, ...)."""
    return AUTHORIZATION_ERRORS[resource_type]


def denied_answer(ctx: "RequestContext", code: ErrorCode) -> object:
    """The whole request refused with ``code`` as Kafka's getErrorResponse answers it (the error at every
    level of the response that has one), for the APIs Kafka refuses whole (authorizeClusterOperation, ...)."""
    from pykbroker.server.error_answers import build

    return build(ctx.request.codec.response_type, ctx.request.body, code)


# ConfigResource.Type codes -> the ACL resource guarding them (Kafka's ConfigHelper / configsAuthorizationApiError)
_CONFIG_RESOURCES = {2: ResourceType.TOPIC, 4: ResourceType.CLUSTER, 8: ResourceType.CLUSTER, 32: ResourceType.GROUP}
CLUSTER_DENIED_MESSAGE = "Cluster authorization failed."  # Errors.CLUSTER_AUTHORIZATION_FAILED.message()
_DENIED_MESSAGES = {ResourceType.TOPIC: "Topic authorization failed.", ResourceType.CLUSTER: CLUSTER_DENIED_MESSAGE,
                    ResourceType.GROUP: "Group authorization failed."}


def config_resource_denied(ctx: "RequestContext", operation: AclOperation, config_type: int,
                           name: str) -> tuple[ErrorCode, str] | None:
    """DescribeConfigs (DESCRIBE_CONFIGS) / AlterConfigs (ALTER_CONFIGS) on one config resource: None when
    allowed (or not a type an ACL guards: the handler refuses it), else Kafka's error and message."""
    resource_type = _CONFIG_RESOURCES.get(int(config_type))
    if resource_type is None:
        return None
    if allowed(ctx, operation, resource_type, CLUSTER_NAME if resource_type == ResourceType.CLUSTER else name):
        return None
    return denied_error(resource_type), _DENIED_MESSAGES[resource_type]

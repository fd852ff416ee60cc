"""Classic consumer groups: JoinGroup (11) v0-9, SyncGroup (14) v0-5, Heartbeat (12) v0-4, LeaveGroup (13)
v0-5; both kinds of group (classic and consumer): ListGroups (16) v0-5, DescribeGroups (15) v0-5, DeleteGroups
(42) v0-2, OffsetDelete (47) v0.

Behaviour lives in pykbroker/groups/coordinator.py (a port of Kafka's classic group coordinator); these
handlers translate versions, as Kafka's request/response classes do. Every group request for a group whose
__consumer_offsets partition this broker does not lead is answered NOT_COORDINATOR, and
COORDINATOR_LOAD_IN_PROGRESS while that partition's groups are being loaded (ListGroups: with the groups
known so far).

* JoinGroup v0 has no rebalance timeout: the session timeout is used. MEMBER_ID_REQUIRED only from v4
  (for dynamic members); ``skip_assignment`` from v9. The protocol name is "" before v7 and null from v7
  when there is none. JoinGroup and SyncGroup answer when the rebalance step ends (async handlers).
* SyncGroup v5 must name protocol type and name, else INCONSISTENT_GROUP_PROTOCOL.
* LeaveGroup before v3 names one member; its error is the top-level error. From v3 members are batched
  and may be named by group instance id alone.
* ListGroups v4 filters by state (case-insensitive), v5 also by type ("classic", "consumer"; case-insensitive,
  an unknown type matches nothing) and answers each group's type; every version lists both kinds, as Kafka 4
  (a consumer group's protocol type is "consumer"). DescribeGroups (v0-5) answers a consumer group "Dead" with
  no error, as Kafka 4 does before v6 (v6: GROUP_ID_NOT_FOUND "Group <id> is not a classic group.").
  DescribeGroups reports a group it does not know
  as "Dead" with no error, and from v3 ``authorized_operations`` when asked (no authorizer: READ,
  DESCRIBE and DELETE; otherwise Kafka's "not requested" INT32_MIN).
* Authorization (Kafka's KafkaApis): JoinGroup, SyncGroup (after its protocol check), Heartbeat and
  LeaveGroup need READ on the group, DescribeGroups DESCRIBE (per group), DeleteGroups DELETE (per group),
  OffsetDelete DELETE on the group and READ on each topic; GROUP_AUTHORIZATION_FAILED /
  TOPIC_AUTHORIZATION_FAILED. ListGroups lists every group with DESCRIBE on the cluster, else only the
  groups the principal may DESCRIBE. DescribeGroups' authorized operations are the principal's.
* DeleteGroups: GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP per group. OffsetDelete: UNKNOWN_TOPIC_OR_PARTITION for
  partitions that do not exist, GROUP_SUBSCRIBED_TO_TOPIC for topics a live consumer group reads; a
  group-level error answers with no topics.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, Callable

from pykbroker.groups.classic.coordinator import JoinRequest, LeavingMember
from pykbroker.groups.classic.group import JoinResult, SyncResult
from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, allowed, allowed_names, cluster_allowed
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers._operations import (
    GROUP_OPERATIONS, NOT_REQUESTED as AUTHORIZED_OPERATIONS_OMITTED, authorized_if,
)

_DENIED = ErrorCode.group_authorization_failed


def _group_allowed(ctx: RequestContext, operation: AclOperation, group_id: str) -> bool:
    return allowed(ctx, operation, ResourceType.GROUP, group_id)


def _ms(value: Any) -> int:
    """kio decodes timeouts as timedeltas; the coordinator counts milliseconds."""
    return value // timedelta(milliseconds=1) if isinstance(value, timedelta) else int(value)


def _client_host(ctx: RequestContext) -> str:
    """Kafka shows the client's address as Java's InetAddress.toString() does: "/127.0.0.1"."""
    return "/" + ctx.peer.rsplit(":", 1)[0]


def answer_later(start: Callable[[Callable[[Any], None]], None], build: Callable[[Any], Any]) -> Any:
    """Run a coordinator call that answers through a callback: the response now if it answered at once,
    else a coroutine that waits for the answer (the connection handles nothing else meanwhile, as Kafka's
    muted channel: a Heartbeat pipelined behind a parked JoinGroup meets the new generation)."""
    future = asyncio.get_running_loop().create_future()

    def respond(result: Any) -> None:
        if not future.done():  # the client may have gone away and its request been cancelled
            future.set_result(result)

    start(respond)
    if future.done():
        return build(future.result())

    async def wait() -> Any:
        return build(await future)

    return wait()


# -- JoinGroup ------------------------------------------------------------------------------------------


@handles(11)
def join_group(ctx: RequestContext, request) -> Any:
    schema = response_module(ctx)
    version = ctx.version
    session_timeout = _ms(request.session_timeout)
    instance_id = getattr(request, "group_instance_id", None)
    join = JoinRequest(
        group_id=request.group_id,
        member_id=request.member_id,
        protocol_type=request.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in request.protocols],
        session_timeout_ms=session_timeout,
        rebalance_timeout_ms=session_timeout if version == 0 else _ms(request.rebalance_timeout),
        group_instance_id=instance_id,
        client_id=ctx.request.client_id or "",
        client_host=_client_host(ctx),
        require_known_member_id=version >= 4 and instance_id is None,
        supports_skipping_assignment=version >= 9,
        reason=getattr(request, "reason", None),
    )

    def build(result: JoinResult) -> Any:
        protocol_name = result.protocol_name
        if version < 7:
            protocol_name = protocol_name or ""
        elif not protocol_name:
            protocol_name = None
        return make(
            schema.JoinGroupResponse,
            throttle_time=0,
            error_code=result.error,
            generation_id=result.generation_id,
            protocol_type=result.protocol_type,
            protocol_name=protocol_name,
            leader=result.leader,
            skip_assignment=result.skip_assignment,
            member_id=result.member_id,
            members=tuple(
                make(schema.JoinGroupResponseMember, member_id=member_id, group_instance_id=group_instance_id,
                     metadata=metadata)
                for member_id, group_instance_id, metadata in result.members
            ),
        )

    if not _group_allowed(ctx, AclOperation.READ, request.group_id):
        return build(JoinResult(_DENIED, ""))
    return answer_later(lambda respond: ctx.broker.groups.join_group(join, respond), build)


# -- SyncGroup ------------------------------------------------------------------------------------------


@handles(14)
def sync_group(ctx: RequestContext, request) -> Any:
    schema = response_module(ctx)

    def build(result: SyncResult) -> Any:
        return make(schema.SyncGroupResponse, throttle_time=0, error_code=result.error,
                    protocol_type=result.protocol_type, protocol_name=result.protocol_name,
                    assignment=result.assignment)

    protocol_type = getattr(request, "protocol_type", None)
    protocol_name = getattr(request, "protocol_name", None)
    if ctx.version >= 5 and (protocol_type is None or protocol_name is None):
        return build(SyncResult(ErrorCode.inconsistent_group_protocol))
    if not _group_allowed(ctx, AclOperation.READ, request.group_id):
        return build(SyncResult(_DENIED))
    assignments = {a.member_id: bytes(a.assignment) for a in request.assignments}
    return answer_later(
        lambda respond: ctx.broker.groups.sync_group(
            request.group_id, request.generation_id, request.member_id, protocol_type, protocol_name,
            getattr(request, "group_instance_id", None), assignments, respond),
        build,
    )


# -- Heartbeat, LeaveGroup --------------------------------------------------------------------------------


@handles(12)
def heartbeat(ctx: RequestContext, request) -> Any:
    if not _group_allowed(ctx, AclOperation.READ, request.group_id):
        return make(response_module(ctx).HeartbeatResponse, throttle_time=0, error_code=_DENIED)
    error = ctx.broker.groups.heartbeat(request.group_id, request.member_id,
                                        getattr(request, "group_instance_id", None), request.generation_id)
    return make(response_module(ctx).HeartbeatResponse, throttle_time=0, error_code=error)


@handles(13)
def leave_group(ctx: RequestContext, request) -> Any:
    schema = response_module(ctx)
    if not _group_allowed(ctx, AclOperation.READ, request.group_id):
        return make(schema.LeaveGroupResponse, throttle_time=0, error_code=_DENIED, members=())
    if ctx.version < 3:
        leaving = [LeavingMember(request.member_id)]
    else:
        leaving = [LeavingMember(m.member_id, m.group_instance_id, getattr(m, "reason", None))
                   for m in request.members]
    error, results = ctx.broker.groups.leave_group(request.group_id, leaving)
    if ctx.version < 3:
        # One member: its error is the answer (older clients cannot read member-level errors).
        if error == ErrorCode.none:
            error = next((e for _, e in results if e != ErrorCode.none), ErrorCode.none)
        return make(schema.LeaveGroupResponse, throttle_time=0, error_code=error)
    return make(
        schema.LeaveGroupResponse,
        throttle_time=0,
        error_code=error,
        members=tuple(
            make(schema.MemberResponse, member_id=m.member_id, group_instance_id=m.group_instance_id, error_code=e)
            for m, e in results
        ),
    )


# -- ListGroups, DescribeGroups, DeleteGroups ----------------------------------------------------------------


@handles(16)
def list_groups(ctx: RequestContext, request) -> Any:
    schema = response_module(ctx)
    error, groups = ctx.broker.groups.list_groups(getattr(request, "states_filter", None) or ())
    types = {kind.lower() for kind in getattr(request, "types_filter", None) or ()}
    if types:  # Kafka's Group.GroupType.parse: case-insensitive, an unknown name matches no group
        groups = [g for g in groups if g.group_type in types]
    if not cluster_allowed(ctx, AclOperation.DESCRIBE, log_if_denied=False):
        visible = allowed_names(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, (g.group_id for g in groups),
                                log_if_denied=False)
        groups = [g for g in groups if g.group_id in visible]
    return make(
        schema.ListGroupsResponse,
        throttle_time=0,
        error_code=error,
        groups=tuple(
            make(schema.ListedGroup, group_id=g.group_id, protocol_type=g.protocol_type, group_state=g.state,
                 group_type=g.group_type)
            for g in groups
        ),
    )


@handles(15)
def describe_groups(ctx: RequestContext, request) -> Any:
    schema = response_module(ctx)
    include_operations = getattr(request, "include_authorized_operations", False)
    described = []
    for group_id in request.groups:
        if not _group_allowed(ctx, AclOperation.DESCRIBE, group_id):
            described.append(make(schema.DescribedGroup, error_code=_DENIED, group_id=group_id, group_state="",
                                  protocol_type="", protocol_data="", members=(),
                                  authorized_operations=AUTHORIZED_OPERATIONS_OMITTED))
            continue
        error, summary = ctx.broker.groups.describe_group(group_id)
        described.append(make(
            schema.DescribedGroup,
            error_code=error,
            group_id=group_id,
            group_state=summary.state,
            protocol_type=summary.protocol_type,
            protocol_data=summary.protocol,
            members=tuple(
                make(schema.DescribedGroupMember, member_id=m.member_id, group_instance_id=m.group_instance_id,
                     client_id=m.client_id, client_host=m.client_host, member_metadata=m.metadata,
                     member_assignment=m.assignment)
                for m in summary.members
            ),
            authorized_operations=authorized_if(ctx, include_operations and error == ErrorCode.none,
                                                ResourceType.GROUP, group_id, GROUP_OPERATIONS),
        ))
    return make(schema.DescribeGroupsResponse, throttle_time=0, groups=tuple(described))


@handles(42)
def delete_groups(ctx: RequestContext, request) -> Any:
    schema = response_module(ctx)
    names = list(dict.fromkeys(request.groups_names))
    permitted = allowed_names(ctx, AclOperation.DELETE, ResourceType.GROUP, names)
    results = ctx.broker.groups.delete_groups([g for g in names if g in permitted])
    results.update({g: _DENIED for g in names if g not in permitted})
    return make(
        schema.DeleteGroupsResponse,
        throttle_time=0,
        results=tuple(make(schema.DeletableGroupResult, group_id=g, error_code=e) for g, e in results.items()),
    )


# -- OffsetDelete --------------------------------------------------------------------------------------------


@handles(47)
def offset_delete(ctx: RequestContext, request) -> Any:
    schema = response_module(ctx)
    if not _group_allowed(ctx, AclOperation.DELETE, request.group_id):
        return make(schema.OffsetDeleteResponse, throttle_time=0, error_code=_DENIED, topics=())
    exists = ctx.broker.groups.partition_exists
    readable = allowed_names(ctx, AclOperation.READ, ResourceType.TOPIC, (t.name for t in request.topics))
    errors: dict[tuple[str, int], ErrorCode] = {}
    valid = []
    for topic in request.topics:
        for p in topic.partitions:
            tp = (topic.name, p.partition_index)
            if topic.name not in readable:
                errors[tp] = ErrorCode.topic_authorization_failed
            elif exists(*tp):
                valid.append(tp)
            else:
                errors[tp] = ErrorCode.unknown_topic_or_partition
    error, deleted = ctx.broker.groups.delete_offsets(request.group_id, valid)
    if error != ErrorCode.none:
        return make(schema.OffsetDeleteResponse, throttle_time=0, error_code=error, topics=())
    errors.update(deleted)
    by_topic: dict[str, list] = {}
    for (name, partition), e in errors.items():
        by_topic.setdefault(name, []).append(
            make(schema.OffsetDeleteResponsePartition, partition_index=partition, error_code=e))
    return make(
        schema.OffsetDeleteResponse,
        throttle_time=0,
        error_code=ErrorCode.none,
        topics=tuple(make(schema.OffsetDeleteResponseTopic, name=name, partitions=tuple(parts))
                     for name, parts in by_topic.items()),
    )

"""ConsumerGroupHeartbeat (key 68) v0-1 and ConsumerGroupDescribe (key 69) v0-1: the consumer group protocol
of KIP-848 (``group.protocol=consumer``), served by groups/consumer/coordinator.py.

Behaviour: a heartbeat joins (epoch 0), stays in (its current epoch, plus only the fields that changed) or
leaves (-1; -2 for a static member coming back) a consumer group; the answer carries the member's epoch, the
heartbeat interval (``group.consumer.heartbeat.interval.ms``) and, when it changed or the heartbeat was a full
one, the partitions the member may own, by topic id. In v1 the client chooses the member id (Kafka 4); v0
lets the coordinator make one for an empty id. Errors carry Kafka 4's messages (INVALID_REQUEST,
UNSUPPORTED_ASSIGNOR, GROUP_ID_NOT_FOUND, UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH, UNRELEASED_INSTANCE_ID,
FENCED_INSTANCE_ID, GROUP_MAX_SIZE_REACHED, INVALID_REGULAR_EXPRESSION, NOT_COORDINATOR,
COORDINATOR_LOAD_IN_PROGRESS). Authorization as Kafka 4's KafkaApis: READ on the group
(GROUP_AUTHORIZATION_FAILED), DESCRIBE on every subscribed topic name (TOPIC_AUTHORIZATION_FAILED); a regex
matches only the topics the principal of the heartbeat that resolved it may DESCRIBE.

ConsumerGroupDescribe answers each group with its state, epochs, assignor and members (current and target
assignment, topic ids with names); GROUP_ID_NOT_FOUND for an unknown group or a classic one; DESCRIBE on the
group is needed (GROUP_AUTHORIZATION_FAILED), and the authorized operations when asked.
"""

from __future__ import annotations

import uuid
from typing import Any, Mapping

from pykbroker.groups.consumer.coordinator import HeartbeatRequest
from pykbroker.log.manager import kafka_uuid
from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, allowed, allowed_names, enabled
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers._operations import GROUP_OPERATIONS, authorized_if
from pykbroker.server.handlers.groups import _client_host, _ms, answer_later


def _owned(topic_partitions) -> dict[uuid.UUID, tuple[int, ...]] | None:
    if topic_partitions is None:
        return None
    owned: dict[uuid.UUID, list[int]] = {}
    for topic in topic_partitions:
        owned.setdefault(topic.topic_id, []).extend(topic.partitions)
    return {topic_id: tuple(parts) for topic_id, parts in owned.items()}


def _topic_partitions(cls, assignment: Mapping[uuid.UUID, frozenset[int]], names=None) -> tuple:
    return tuple(make(cls, topic_id=topic_id, topic_name=(names or {}).get(topic_id, ""),
                      partitions=tuple(sorted(parts)))
                 for topic_id, parts in sorted(assignment.items(), key=lambda item: str(item[0])))


def _describable(ctx: RequestContext):
    """What a regex resolved for this heartbeat may keep: the topics its principal may DESCRIBE (Kafka 4's
    filterTopicDescribeAuthorizedTopics); None without an authorizer."""
    if not enabled(ctx):
        return None
    return lambda names: allowed_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, names, log_if_denied=False)


@handles(68)
def consumer_group_heartbeat(ctx: RequestContext, request) -> Any:
    schema = response_module(ctx)

    def error_answer(code: ErrorCode, message: str | None = None) -> Any:
        return make(schema.ConsumerGroupHeartbeatResponse, throttle_time=0, error_code=code, error_message=message,
                    member_id=None, member_epoch=0, heartbeat_interval=0)

    if not allowed(ctx, AclOperation.READ, ResourceType.GROUP, request.group_id):
        return error_answer(ErrorCode.group_authorization_failed)
    names = request.subscribed_topic_names
    if names and len(allowed_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, names)) != len(set(names)):
        return error_answer(ErrorCode.topic_authorization_failed)
    member_id = request.member_id
    if ctx.version == 0 and not member_id and request.member_epoch == 0:
        member_id = kafka_uuid(uuid.uuid4())  # v0: the coordinator makes the id (Kafka 3.7-3.9's Uuid.toString)
    heartbeat = HeartbeatRequest(
        group_id=request.group_id,
        member_id=member_id,
        member_epoch=request.member_epoch,
        instance_id=request.instance_id,
        rack_id=request.rack_id,
        rebalance_timeout_ms=_ms(request.rebalance_timeout),
        subscribed_topic_names=tuple(names) if names is not None else None,
        subscribed_topic_regex=getattr(request, "subscribed_topic_regex", None),
        server_assignor=request.server_assignor,
        owned=_owned(request.topic_partitions),
        client_id=ctx.request.client_id or "",
        client_host=_client_host(ctx),
        version=ctx.version,
        describable=_describable(ctx),
    )

    def build(result) -> Any:
        if result.error != ErrorCode.none:
            return error_answer(result.error, result.message)
        assignment = None
        if result.assignment is not None:
            assignment = make(schema.Assignment,
                              topic_partitions=_topic_partitions(schema.TopicPartitions, result.assignment))
        return make(schema.ConsumerGroupHeartbeatResponse, throttle_time=0, error_code=ErrorCode.none,
                    error_message=None, member_id=result.member_id, member_epoch=result.member_epoch,
                    heartbeat_interval=result.heartbeat_interval_ms, assignment=assignment)

    # answered once the group's records are stored (with followers: replicated to the ISR)
    return answer_later(lambda respond: ctx.broker.consumer_groups.heartbeat(heartbeat, respond), build)


@handles(69)
def consumer_group_describe(ctx: RequestContext, request) -> Any:
    schema = response_module(ctx)
    asked = request.include_authorized_operations
    permitted = [g for g in request.group_ids if allowed(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, g)]
    described = {d.group_id: d for d in ctx.broker.consumer_groups.describe(dict.fromkeys(permitted))}
    names = {info.topic_id: info.name for info in ctx.broker.metadata.topics()}
    groups = []
    for group_id in request.group_ids:
        d = described.get(group_id)
        if d is None or d.error != ErrorCode.none:
            groups.append(make(schema.DescribedGroup, group_id=group_id,
                               error_code=ErrorCode.group_authorization_failed if d is None else d.error,
                               error_message=None if d is None else d.message, group_state="", group_epoch=0,
                               assignment_epoch=0, assignor_name="", members=()))  # Kafka's defaults
            continue
        group = d.group
        members = tuple(
            make(schema.Member, member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id,
                 member_epoch=m.member_epoch, client_id=m.client_id, client_host=m.client_host,
                 subscribed_topic_names=tuple(m.subscribed_topic_names), subscribed_topic_regex=m.subscribed_topic_regex,
                 assignment=make(schema.Assignment, topic_partitions=_topic_partitions(
                     schema.TopicPartitions, m.assigned, names)),
                 target_assignment=make(schema.Assignment, topic_partitions=_topic_partitions(
                     schema.TopicPartitions, group.target_of(m.member_id), names)),
                 member_type=0 if m.uses_classic_protocol else 1)  # Kafka 4: 0 classic, 1 consumer
            for m in group.members.values())
        groups.append(make(schema.DescribedGroup, group_id=group_id, error_code=ErrorCode.none, error_message=None,
                           group_state=group.state.value, group_epoch=group.group_epoch,
                           assignment_epoch=group.assignment_epoch,
                           assignor_name=group.preferred_assignor(ctx.broker.consumer_groups.config.assignors[0]),
                           members=members,
                           authorized_operations=authorized_if(ctx, asked, ResourceType.GROUP, group_id,
                                                               GROUP_OPERATIONS)))
    return make(schema.ConsumerGroupDescribeResponse, throttle_time=0, groups=tuple(groups))

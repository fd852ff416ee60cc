"""OffsetCommit (key 8) v2-9 and OffsetFetch (key 9) v1-9: committed offsets of consumer groups.

Behaviour: commits go to the group coordinator, which checks member id, generation and group instance id
(v7+) against the group and stores them in __consumer_offsets; errors are per partition
(UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS,
FENCED_INSTANCE_ID, OFFSET_METADATA_TOO_LARGE). A "simple" commit (generation -1, empty member id) is valid
while the group has no members. v2-4 may set retention_time: the offset then expires that long after the
commit (Kafka's expire timestamp) instead of by the broker's offsets retention.
The answer comes once the commit is stored in __consumer_offsets (with followers: replicated to the ISR):
NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS / COORDINATOR_NOT_AVAILABLE per partition when this broker
cannot store it (see groups/coordinator.py). OffsetFetch answers offset -1 and empty metadata for partitions without a commit; a null topic list
(v2+) returns everything the group committed; v8 batches several groups in one request. v7+ with require_stable
answers UNSTABLE_OFFSET_COMMIT (offset -1) for a partition with transactional offsets (TxnOffsetCommit)
still awaiting their transaction's marker, as Kafka does. v9's member id
and epoch belong to the new consumer protocol (KIP-848): for a consumer group, OffsetCommit's
generation is the member epoch and both APIs answer UNKNOWN_MEMBER_ID / STALE_MEMBER_EPOCH for a member that
is not in the group or not at its current epoch (a commit without a member only while the group is empty, and
a consumer-protocol member commits with v9+: UNSUPPORTED_VERSION before), as Kafka 4; classic groups are not
checked on them, as in Kafka.
A coordinator error (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS) is the top-level error from v2 (the
group's error in v8+), and each requested partition's error in v1, which has no top-level error.
Authorization (Kafka's KafkaApis): OffsetCommit needs READ on the group (else every partition answers
GROUP_AUTHORIZATION_FAILED) and READ on each topic (TOPIC_AUTHORIZATION_FAILED, nothing committed for it);
OffsetFetch DESCRIBE on the group (GROUP_AUTHORIZATION_FAILED as a coordinator error is answered) and
DESCRIBE on each topic (a named one answers TOPIC_AUTHORIZATION_FAILED with offset -1; with every topic
asked for, the others are left out).
"""

from __future__ import annotations

import time
from datetime import timedelta

from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, allowed, allowed_names
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers.groups import answer_later

NO_OFFSET = -1
NO_EPOCH = -1
DEFAULT_RETENTION_TIME = -1  # OffsetCommit v2-4: use the broker's retention


def requested_offsets(topics) -> dict[tuple[str, int], tuple[int, int, str | None]]:
    """(topic, partition) -> (offset, leader epoch, metadata) of an OffsetCommit / TxnOffsetCommit request."""
    return {
        (topic.name, p.partition_index): (p.committed_offset, getattr(p, "committed_leader_epoch", NO_EPOCH),
                                          p.committed_metadata)
        for topic in topics
        for p in topic.partitions
    }


def answer_commit(ctx: RequestContext, request, api: str, start, transactional_id: str | None = None) -> object:
    """Run a commit (``start(respond, offsets)``: the requested offsets of the topics the principal may
    READ) and answer it as ``{api}Response``: each requested partition with its error, in the request's order
    (OffsetCommit, TxnOffsetCommit). Authorization first, as Kafka's: WRITE on ``transactional_id`` (when
    given: TxnOffsetCommit), READ on the group, READ on each topic."""
    schema = response_module(ctx)
    topic_cls, partition_cls = getattr(schema, f"{api}ResponseTopic"), getattr(schema, f"{api}ResponsePartition")

    def build(errors) -> object:
        topics = tuple(
            make(topic_cls, name=topic.name, partitions=tuple(
                make(partition_cls, partition_index=p.partition_index,
                     error_code=errors[(topic.name, p.partition_index)])
                for p in topic.partitions))
            for topic in request.topics
        )
        return make(getattr(schema, f"{api}Response"), throttle_time=0, topics=topics)

    offsets = requested_offsets(request.topics)
    if transactional_id is not None and not allowed(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID,
                                                    transactional_id):
        return build(dict.fromkeys(offsets, ErrorCode.transactional_id_authorization_failed))
    if not allowed(ctx, AclOperation.READ, ResourceType.GROUP, request.group_id):
        return build(dict.fromkeys(offsets, ErrorCode.group_authorization_failed))
    readable = allowed_names(ctx, AclOperation.READ, ResourceType.TOPIC, (t.name for t in request.topics))
    denied = {tp: ErrorCode.topic_authorization_failed for tp in offsets if tp[0] not in readable}
    if not denied:
        return answer_later(lambda respond: start(respond, offsets), build)
    offsets = {tp: value for tp, value in offsets.items() if tp not in denied}

    def start_readable(respond) -> None:
        if offsets:
            start(lambda errors: respond({**errors, **denied}), offsets)
        else:
            respond(denied)

    return answer_later(start_readable, build)


@handles(8)
def offset_commit(ctx: RequestContext, request) -> object:
    retention = getattr(request, "retention_time", DEFAULT_RETENTION_TIME)
    retention_ms = retention // timedelta(milliseconds=1) if isinstance(retention, timedelta) else int(retention)
    expire_timestamp = -1 if retention_ms == DEFAULT_RETENTION_TIME else int(time.time() * 1000) + retention_ms
    return answer_commit(ctx, request, "OffsetCommit", lambda respond, offsets: ctx.broker.groups.commit_offsets(
        request.group_id, request.generation_id_or_member_epoch, request.member_id, offsets,
        respond, group_instance_id=getattr(request, "group_instance_id", None), expire_timestamp_ms=expire_timestamp,
        api_version=ctx.version))


def _group_topics(ctx: RequestContext, group_id: str, requested, partition_cls, topic_cls,
                  require_stable: bool = False, member: tuple[str | None, int] = (None, -1)) -> tuple[ErrorCode, tuple]:
    """(the coordinator's error, the topics to answer); with an error, the requested partitions carry it
    (what OffsetFetch v1, without a top-level error, shows). With ``require_stable`` (v7+) a partition with
    transactional offsets awaiting their marker answers UNSTABLE_OFFSET_COMMIT, offset -1."""
    wanted = denied = None
    if requested is not None:
        wanted = [(t.name, p) for t in requested for p in t.partition_indexes]
    if not allowed(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
        error, committed = ErrorCode.group_authorization_failed, {}
    else:
        if wanted is not None:
            visible = allowed_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, (t.name for t in requested))
            denied = [tp for tp in wanted if tp[0] not in visible]
            wanted = [tp for tp in wanted if tp[0] in visible]
        # v9: a member of a consumer group (KIP-848) fetches at its current epoch (Kafka 4's validateOffsetFetch)
        member_error = ctx.broker.consumer_groups.validate_offset_fetch(group_id, *member)
        if member_error is not None:
            error, committed = member_error, {}
        else:
            error, committed = ctx.broker.groups.fetch_offsets(group_id, wanted)
        if error == ErrorCode.none and wanted is None:  # every topic: those it may not DESCRIBE left out
            visible = allowed_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, (tp[0] for tp in committed),
                                    log_if_denied=False)
            committed = {tp: value for tp, value in committed.items() if tp[0] in visible}
    if error != ErrorCode.none:
        committed = dict.fromkeys((wanted or []) + (denied or []))
        denied = None
    unstable = ctx.broker.groups.unstable_offsets(group_id, committed) if require_stable and error == ErrorCode.none else ()
    by_topic: dict[str, list] = {}
    for (topic, partition), value in [*committed.items(), *((tp, None) for tp in denied or ())]:
        if denied and (topic, partition) in denied:
            partition_error = ErrorCode.topic_authorization_failed
        elif (topic, partition) in unstable:
            value, partition_error = None, ErrorCode.unstable_offset_commit
        else:
            partition_error = error
        by_topic.setdefault(topic, []).append(
            make(
                partition_cls,
                partition_index=partition,
                committed_offset=value.offset if value else NO_OFFSET,
                committed_leader_epoch=value.leader_epoch if value else NO_EPOCH,
                metadata=(value.metadata if value and value.metadata is not None else ""),
                error_code=partition_error,
            )
        )
    return error, tuple(make(topic_cls, name=name, partitions=tuple(parts)) for name, parts in by_topic.items())


@handles(9)
def offset_fetch(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    if ctx.version >= 8:
        groups = []
        for group in request.groups:
            error, topics = _group_topics(ctx, group.group_id, group.topics, schema.OffsetFetchResponsePartitions,
                                          schema.OffsetFetchResponseTopics, request.require_stable,
                                          (getattr(group, "member_id", None), getattr(group, "member_epoch", -1)))
            groups.append(make(schema.OffsetFetchResponseGroup, group_id=group.group_id,
                               topics=() if error != ErrorCode.none else topics, error_code=error))
        return make(schema.OffsetFetchResponse, throttle_time=0, groups=tuple(groups))
    error, topics = _group_topics(ctx, request.group_id, request.topics, schema.OffsetFetchResponsePartition,
                                  schema.OffsetFetchResponseTopic, getattr(request, "require_stable", False))
    if ctx.version >= 2 and error != ErrorCode.none:
        topics = ()
    return make(schema.OffsetFetchResponse, throttle_time=0, topics=topics, error_code=error)

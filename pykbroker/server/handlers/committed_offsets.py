"""OffsetCommit (key 8) v2-8 and OffsetFetch (key 9) v1-8: committed offsets of consumer groups.

Behaviour: commits go to the group coordinator, which stores them in __consumer_offsets; errors are per
partition (INVALID_GROUP_ID, ILLEGAL_GENERATION, UNKNOWN_TOPIC_OR_PARTITION, OFFSET_METADATA_TOO_LARGE).
OffsetFetch answers offset -1 and empty metadata for partitions without a commit; a null topic list
(v2+) returns everything the group committed; v8 batches several groups in one request.
"""

from __future__ import annotations

from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._build import make, response_module

NO_OFFSET = -1
NO_EPOCH = -1


@handles(8)
def offset_commit(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    generation = getattr(request, "generation_id_or_member_epoch", None)
    if generation is None:
        generation = request.generation_id
    offsets = {
        (topic.name, p.partition_index): (p.committed_offset, getattr(p, "committed_leader_epoch", NO_EPOCH), p.committed_metadata)
        for topic in request.topics
        for p in topic.partitions
    }
    errors = ctx.broker.groups.commit_offsets(request.group_id, generation, request.member_id, offsets)
    topics = tuple(
        make(
            schema.OffsetCommitResponseTopic,
            name=topic.name,
            partitions=tuple(
                make(
                    schema.OffsetCommitResponsePartition,
                    partition_index=p.partition_index,
                    error_code=errors[(topic.name, p.partition_index)],
                )
                for p in topic.partitions
            ),
        )
        for topic in request.topics
    )
    return make(schema.OffsetCommitResponse, throttle_time=0, topics=topics)


def _group_topics(ctx: RequestContext, schema, group_id: str, requested, partition_cls, topic_cls) -> tuple:
    wanted = None
    if requested is not None:
        wanted = [(t.name, p) for t in requested for p in t.partition_indexes]
    committed = ctx.broker.groups.fetch_offsets(group_id, wanted)
    by_topic: dict[str, list] = {}
    for (topic, partition), value in committed.items():
        by_topic.setdefault(topic, []).append(
            make(
                partition_cls,
                partition_index=partition,
                committed_offset=value.offset if value else NO_OFFSET,
                committed_leader_epoch=value.leader_epoch if value else NO_EPOCH,
                metadata=(value.metadata if value and value.metadata is not None else ""),
                error_code=ErrorCode.none,
            )
        )
    return tuple(make(topic_cls, name=name, partitions=tuple(parts)) for name, parts in by_topic.items())


@handles(9)
def offset_fetch(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    if ctx.version >= 8:
        groups = tuple(
            make(
                schema.OffsetFetchResponseGroup,
                group_id=group.group_id,
                topics=_group_topics(
                    ctx, schema, group.group_id, group.topics,
                    schema.OffsetFetchResponsePartitions, schema.OffsetFetchResponseTopics,
                ),
                error_code=ErrorCode.none,
            )
            for group in request.groups
        )
        return make(schema.OffsetFetchResponse, throttle_time=0, groups=groups)
    topics = _group_topics(
        ctx, schema, request.group_id, request.topics, schema.OffsetFetchResponsePartition, schema.OffsetFetchResponseTopic
    )
    return make(schema.OffsetFetchResponse, throttle_time=0, topics=topics, error_code=ErrorCode.none)

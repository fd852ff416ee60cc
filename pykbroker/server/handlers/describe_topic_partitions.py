"""DescribeTopicPartitions (key 75), v0: the paginated topic describe of KIP-966 (Kafka 3.8+; Kafka 3.7.1's
brokers do not know the key yet), which the 3.8+ Java admin client's describeTopics uses when the broker
offers it (checked with kafka-clients 3.9: pages of ``partitionSizeLimitPerResponse``, authorized operations).

Behaviour, as Kafka's DescribeTopicPartitionsRequestHandler and KRaftMetadataCache: the named topics (an
empty list: every topic), sorted by name, from the cursor's topic and partition on; at most
min(response_partition_limit, 2000) partitions (at least 1) in all, then ``next_cursor`` names where to
go on (the next partition of a cut topic, or the next topic's partition 0). Each partition as Metadata
describes it (leader, epoch, replicas, ISR, offline replicas; LEADER_NOT_AVAILABLE / LISTENER_NOT_FOUND with
leader -1), empty eligible-leader lists (no ELR). A named topic that does not exist answers
UNKNOWN_TOPIC_OR_PARTITION (INVALID_TOPIC_EXCEPTION for an illegal name); with every topic asked for,
there are none. Every topic carries its authorized operations (no authorizer: all a topic supports). A
cursor with a negative partition, or naming a topic not in the list, gets INVALID_REQUEST for every topic
named, as Kafka's error response. A topic the principal may not DESCRIBE is left out (named:
TOPIC_AUTHORIZATION_FAILED, after the page, without its id), as Kafka 3.8's handler answers.
"""

from __future__ import annotations

import dataclasses
import uuid

from pykbroker.cluster.metadata import INTERNAL_TOPICS, topic_name_error
from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, allowed_names
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers._operations import NOT_REQUESTED, TOPIC_OPERATIONS, authorized_if
from pykbroker.server.handlers.metadata import _Reach

MAX_REQUEST_PARTITION_SIZE_LIMIT = 2000  # Kafka's max.request.partition.size.limit default
NO_TOPIC_ID = uuid.UUID(int=0)
LATEST_METADATA_VERSION = 12  # partition errors as Metadata's newest version answers them


def _topic_entry(schema, name: str, error: ErrorCode, topic_id: uuid.UUID | None = None, partitions=(),
                 operations: int = TOPIC_OPERATIONS) -> object:
    return make(schema.DescribeTopicPartitionsResponseTopic, error_code=error, name=name,
                topic_id=topic_id or NO_TOPIC_ID, is_internal=name in INTERNAL_TOPICS, partitions=tuple(partitions),
                topic_authorized_operations=operations)


@handles(75)
def describe_topic_partitions(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    metadata = ctx.broker.metadata
    cursor = request.cursor
    cursor_topic = cursor.topic_name if cursor is not None else ""
    fetch_all = not request.topics
    if fetch_all:
        names = sorted(info.name for info in metadata.topics() if info.name >= cursor_topic)
    else:
        names = sorted({t.name for t in request.topics if t.name >= cursor_topic})
    if cursor is not None and (cursor.partition_index < 0 or (not fetch_all and cursor_topic not in names)):
        return make(schema.DescribeTopicPartitionsResponse, throttle_time=0, next_cursor=None, topics=tuple(
            make(schema.DescribeTopicPartitionsResponseTopic, error_code=ErrorCode.invalid_request, name=t.name,
                 topic_id=NO_TOPIC_ID, is_internal=False, partitions=())
            for t in request.topics))
    permitted = allowed_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, names, log_if_denied=not fetch_all)
    denied = [name for name in names if name not in permitted]
    names = [name for name in names if name in permitted]
    reach = _Reach(ctx, LATEST_METADATA_VERSION)
    remaining = max(min(MAX_REQUEST_PARTITION_SIZE_LIMIT, request.response_partition_limit), 1)
    topics, next_cursor = [], None
    for name in names:
        if remaining == 0:  # the next page starts at this topic
            next_cursor = make(schema.Cursor, topic_name=name, partition_index=0)
            break
        info = metadata.topic(name)
        if info is None:
            if not fetch_all:
                error = ErrorCode.invalid_topic_exception if topic_name_error(name) else ErrorCode.unknown_topic_or_partition
                topics.append(_topic_entry(schema, name, error, operations=authorized_if(
                    ctx, True, ResourceType.TOPIC, name, TOPIC_OPERATIONS)))
            continue
        start = cursor.partition_index if cursor is not None and name == cursor_topic else 0
        end = min(len(info.partitions), start + remaining)
        partitions = [  # no ELR: empty lists, as KRaft sends them (the Java admin client reads them)
            dataclasses.replace(
                reach.partition(schema, index, info.partitions[index], schema.DescribeTopicPartitionsResponsePartition),
                eligible_leader_replicas=(), last_known_elr=())
            for index in range(start, end)
        ]
        topics.append(_topic_entry(schema, name, ErrorCode.none, info.topic_id, partitions,
                                   authorized_if(ctx, True, ResourceType.TOPIC, name, TOPIC_OPERATIONS)))
        if end < len(info.partitions):
            next_cursor = make(schema.Cursor, topic_name=name, partition_index=end)
            break
        remaining -= len(partitions)
    if not fetch_all:
        topics.extend(_topic_entry(schema, name, ErrorCode.topic_authorization_failed, operations=NOT_REQUESTED)
                      for name in denied)
    return make(schema.DescribeTopicPartitionsResponse, throttle_time=0, topics=tuple(topics), next_cursor=next_cursor)

"""DescribeProducers (key 61), v0: ``kafka-transactions.sh describe-producers``, AdminClient.describeProducers.

Behaviour, as Kafka's ReplicaManager.activeProducerState: per partition this broker leads, the producer ids
its producer state holds (their epoch, last sequence, the max timestamp of their last batch, the coordinator
epoch of their last marker, -1 before any) and the first offset of their open transaction (-1: none). Errors:
UNKNOWN_TOPIC_OR_PARTITION for a partition not in the metadata, NOT_LEADER_OR_FOLLOWER for one not led here.
"""

from __future__ import annotations

from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, allowed_names
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers._epochs import leader_partition

def _partition(ctx: RequestContext, schema, topic: str, index: int, readable: bool) -> object:
    info = ctx.broker.metadata.topic(topic)
    producers, message = (), None
    if not readable:  # Kafka: READ on the topic
        error = ErrorCode.topic_authorization_failed
    elif info is None or not 0 <= index < len(info.partitions):
        error = ErrorCode.unknown_topic_or_partition
        if info is None:  # what Kafka 3.7 answers (only for an unknown topic)
            message = "This server does not host this topic-partition."
    else:
        partition, error = leader_partition(ctx.broker.replicas, topic, index)
        if partition is None:
            error = ErrorCode.not_leader_or_follower  # in the metadata, not led here
        else:
            state = partition.producer_state
            producers = tuple(
                make(schema.ProducerState, producer_id=entry.producer_id, producer_epoch=entry.epoch,
                     last_sequence=entry.last_seq, last_timestamp=entry.last_timestamp,
                     coordinator_epoch=entry.coordinator_epoch,
                     current_txn_start_offset=entry.current_txn_first_offset)
                for entry in (state.entry(pid) for pid in state.producer_ids()) if entry is not None
            )
    return make(schema.PartitionResponse, partition_index=index, error_code=error, error_message=message,
                active_producers=producers)


@handles(61)
def describe_producers(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    readable = allowed_names(ctx, AclOperation.READ, ResourceType.TOPIC, (t.name for t in request.topics))
    return make(schema.DescribeProducersResponse, throttle_time=0, topics=tuple(
        make(schema.TopicResponse, name=topic.name,
             partitions=tuple(_partition(ctx, schema, topic.name, index, topic.name in readable)
                              for index in topic.partition_indexes))
        for topic in request.topics))

"""OffsetForLeaderEpoch (key 23), v2-4.

Behaviour: for each partition, the largest epoch <= the requested one and the offset where it ended
(the next epoch's start, or the log end offset for the current epoch), so clients (Java, librdkafka
>= 2.1, kafka-python 3) can validate their position after a leader change and followers can truncate.
A requested epoch newer than ours answers (-1, -1); current_leader_epoch fences as in Fetch. Only the leader
answers, followers' requests (replica_id >= 0, v3+) included: Kafka's ReplicaManager.lastOffsetForLeaderEpoch
always reads with fetchOnlyFromLeader = true, so a follower gets NOT_LEADER_OR_FOLLOWER.
"""

from __future__ import annotations

from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, allowed_names, cluster_allowed
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers._epochs import leader_partition


@handles(23)
def offset_for_leader_epoch(ctx: RequestContext, request) -> object:
    broker = ctx.broker
    schema = response_module(ctx)
    topics = []
    # Kafka: CLUSTER_ACTION on the cluster (a follower) or DESCRIBE on each topic
    permitted = None if cluster_allowed(ctx, AclOperation.CLUSTER_ACTION, log_if_denied=False) else allowed_names(
        ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, (t.topic for t in request.topics))
    for topic in request.topics:
        partitions = []
        for p in topic.partitions:
            if permitted is not None and topic.topic not in permitted:
                partition, error = None, ErrorCode.topic_authorization_failed
            else:
                partition, error = leader_partition(broker.replicas, topic.topic, p.partition, p.current_leader_epoch)
            epoch, end_offset = partition.last_offset_for_leader_epoch(p.leader_epoch) if partition is not None else (-1, -1)
            partitions.append(
                make(schema.EpochEndOffset, error_code=error, partition=p.partition, leader_epoch=epoch, end_offset=end_offset)
            )
        topics.append(make(schema.OffsetForLeaderTopicResult, topic=topic.topic, partitions=tuple(partitions)))
    return make(schema.OffsetForLeaderEpochResponse, throttle_time=0, topics=tuple(topics))

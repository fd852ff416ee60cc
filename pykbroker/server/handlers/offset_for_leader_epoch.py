"""OffsetForLeaderEpoch (key 23), v2-4.

Behaviour: for each partition, the largest epoch <= the requested one and the offset where it ended
(the next epoch's start, or the log end offset for the current epoch), so clients (Java, librdkafka
>= 2.1, kafka-python 3) can validate their position after a leader change and followers can truncate.
A requested epoch newer than ours answers (-1, -1); current_leader_epoch fences as in Fetch.
"""

from __future__ import annotations

from pykbroker.replication.replica_manager import Partition
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers._epochs import leader_partition


def end_offset_for(partition: Partition, requested_epoch: int) -> tuple[int, int]:
    if requested_epoch == partition.leader_epoch:
        return partition.leader_epoch, partition.log.log_end_offset
    if requested_epoch > partition.leader_epoch:
        return -1, -1
    epoch, end_offset = partition.log.end_offset_for_epoch(requested_epoch)
    if epoch < 0 and partition.log.latest_epoch < 0:
        # Nothing was ever appended: the whole (empty) log belongs to the current epoch.
        return partition.leader_epoch, partition.log.log_end_offset
    return epoch, end_offset


@handles(23)
def offset_for_leader_epoch(ctx: RequestContext, request) -> object:
    broker = ctx.broker
    schema = response_module(ctx)
    topics = []
    for topic in request.topics:
        partitions = []
        for p in topic.partitions:
            partition, error = leader_partition(broker.replicas, topic.topic, p.partition, p.current_leader_epoch)
            epoch, end_offset = end_offset_for(partition, p.leader_epoch) if partition is not None else (-1, -1)
            partitions.append(
                make(schema.EpochEndOffset, error_code=error, partition=p.partition, leader_epoch=epoch, end_offset=end_offset)
            )
        topics.append(make(schema.OffsetForLeaderTopicResult, topic=topic.topic, partitions=tuple(partitions)))
    return make(schema.OffsetForLeaderEpochResponse, throttle_time=0, topics=tuple(topics))

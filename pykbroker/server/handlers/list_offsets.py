"""ListOffsets (key 2), v1-9.

Behaviour per partition: timestamp -1 (LATEST) answers the high-water mark (the last stable offset is the
same: no transactions); -2 (EARLIEST) and -4 (EARLIEST_LOCAL) the log start offset; -3 (MAX_TIMESTAMP,
v7+) the offset of the record with the largest timestamp; -5 (LATEST_TIERED, v9) -1 since nothing is
tiered; any other timestamp the first offset whose timestamp is >= it, through the time index, or -1 if
none. Errors: UNKNOWN_TOPIC_OR_PARTITION, FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH (v4+).
"""

from __future__ import annotations

from pykbroker.replication.replica_manager import Partition
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers._epochs import NO_EPOCH, leader_partition

LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5


def _lookup(partition: Partition, timestamp: int) -> tuple[int, int]:
    """(timestamp, offset) answered for one partition."""
    log = partition.log
    if timestamp == LATEST:
        return -1, partition.high_watermark
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return -1, log.log_start_offset
    if timestamp == MAX_TIMESTAMP:
        return log.max_timestamp_and_offset()
    if timestamp == LATEST_TIERED or timestamp < 0:
        return -1, -1
    found = log.offset_for_timestamp(timestamp)
    if found is None or found[1] >= partition.high_watermark:
        return -1, -1
    return found


@handles(2)
def list_offsets(ctx: RequestContext, request) -> object:
    broker = ctx.broker
    schema = response_module(ctx)
    topics = []
    for topic in request.topics:
        partitions = []
        for p in topic.partitions:
            partition, error = leader_partition(
                broker.replicas, topic.name, p.partition_index, getattr(p, "current_leader_epoch", NO_EPOCH)
            )
            timestamp, offset, epoch = -1, -1, -1
            if partition is not None:
                timestamp, offset = _lookup(partition, p.timestamp)
                epoch = partition.leader_epoch
            partitions.append(
                make(
                    schema.ListOffsetsPartitionResponse,
                    partition_index=p.partition_index,
                    error_code=error,
                    timestamp=timestamp,
                    offset=offset,
                    leader_epoch=epoch,
                )
            )
        topics.append(make(schema.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(partitions)))
    return make(schema.ListOffsetsResponse, throttle_time=0, topics=tuple(topics))

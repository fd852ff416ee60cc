"""ListOffsets (key 2), v1-9.

Behaviour per partition: timestamp -1 (LATEST) answers the high-water mark, or the last stable offset for
isolation_level 1 (read_committed, v2+), as Kafka's fetchOffsetForTimestamp; a timestamp lookup never
answers an offset at or past that bound either; -2 (EARLIEST) and -4 (EARLIEST_LOCAL) the log start offset; -3 (MAX_TIMESTAMP,
v7+) the offset of the record with the largest timestamp; -5 (LATEST_TIERED, v9) -1 since nothing is
tiered; any other timestamp the first offset whose timestamp is >= it, through the time index, or -1 if
none. Errors: UNKNOWN_TOPIC_OR_PARTITION, FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH (v4+),
NOT_LEADER_OR_FOLLOWER from a broker that does not lead the partition (except for replica id -2, the
debugging consumer, which may read a follower), OFFSET_NOT_AVAILABLE for a client while a new leader's HWM
is below its epoch's start. Clients (replica id -1) see up to the high-water mark, follower fetchers
(replica id >= 0, after OFFSET_OUT_OF_RANGE) up to the log end, as Kafka's fetchOffsetForTimestamp.
"""

from __future__ import annotations

from pykbroker.protocol.errors import ErrorCode
from pykbroker.replication.replica_manager import Partition
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, allowed_names
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers._epochs import NO_EPOCH, leader_partition

LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5
CONSUMER_REPLICA_ID, DEBUGGING_REPLICA_ID = -1, -2
READ_COMMITTED = 1


def _lookup(partition: Partition, timestamp: int, from_client: bool, read_committed: bool = False,
            ) -> tuple[ErrorCode, int, int]:
    """(error, timestamp, offset) answered for one partition (Kafka's Partition.fetchOffsetForTimestamp).

    A client's lookups stop at the high-water mark, a replica's at the log end; a client asking a new leader
    whose HWM is still below the start of its epoch gets OFFSET_NOT_AVAILABLE for LATEST, and for a timestamp
    whose offset is not below the HWM."""
    log = partition.log
    if not from_client:
        last_fetchable = log.log_end_offset
    elif read_committed:
        last_fetchable = partition.last_stable_offset
    else:
        last_fetchable = partition.high_watermark
    lagging = from_client and partition.high_watermark_lags_epoch_start
    if timestamp == LATEST:
        return (ErrorCode.offset_not_available, -1, -1) if lagging else (ErrorCode.none, -1, last_fetchable)
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return ErrorCode.none, -1, log.log_start_offset
    if timestamp == MAX_TIMESTAMP:
        return (ErrorCode.none, *log.max_timestamp_and_offset())
    if timestamp == LATEST_TIERED or timestamp < 0:
        return ErrorCode.none, -1, -1
    found = log.offset_for_timestamp(timestamp)
    if found is None or found[1] >= last_fetchable:
        return (ErrorCode.offset_not_available, -1, -1) if lagging else (ErrorCode.none, -1, -1)
    return (ErrorCode.none, *found)


@handles(2)
def list_offsets(ctx: RequestContext, request) -> object:
    broker = ctx.broker
    schema = response_module(ctx)
    replica_id = getattr(request, "replica_id", CONSUMER_REPLICA_ID)
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    topics = []
    permitted = allowed_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, (t.name for t in request.topics))
    for topic in request.topics:
        partitions = []
        for p in topic.partitions:
            if topic.name in permitted:
                partition, error = leader_partition(
                    broker.replicas, topic.name, p.partition_index, getattr(p, "current_leader_epoch", NO_EPOCH),
                    require_leader=replica_id != DEBUGGING_REPLICA_ID,
                )
            else:  # Kafka: DESCRIBE on the topic, before anything else
                partition, error = None, ErrorCode.topic_authorization_failed
            timestamp, offset, epoch = -1, -1, -1
            if partition is not None:
                error, timestamp, offset = _lookup(partition, p.timestamp, replica_id == CONSUMER_REPLICA_ID,
                                                   read_committed)
                epoch = partition.leader_epoch if error == ErrorCode.none else -1
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

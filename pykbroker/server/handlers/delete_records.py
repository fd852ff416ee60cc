"""DeleteRecords (key 21), v0-2: ``kafka-delete-records.sh``, AdminClient.delete_records.

Behaviour, per partition, as Kafka's ReplicaManager.deleteRecords: the leader moves its log start offset up
to the requested offset (-1: the high-water mark) at once, whole segments below it deleted, the new start
checkpointed (``log-start-offset-checkpoint``: a restart keeps it); ListOffsets EARLIEST and Fetch answer from
it. Followers adopt the leader's log start from their fetch answers and report theirs in their next fetch;
the answer waits (Kafka's DelayedDeleteRecords) until the low watermark, the smallest log start of the
replicas on live brokers, reached the offset, or the request's timeout (REQUEST_TIMED_OUT with the low
watermark then). Errors: UNKNOWN_TOPIC_OR_PARTITION (not in the metadata), INVALID_TOPIC_EXCEPTION for an
internal topic, NOT_LEADER_OR_FOLLOWER (not led here), OFFSET_OUT_OF_RANGE for an offset below -1 or past the
high-water mark; low watermark -1 with an error. An offset at or below the current log start changes nothing.
"""

from __future__ import annotations

from pykbroker.cluster.metadata import INTERNAL_TOPICS
from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, allowed_names
from pykbroker.server.handlers._build import make, response_module


@handles(21)
async def delete_records(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    metadata, replicas = ctx.broker.metadata, ctx.broker.replicas
    results: dict[tuple[str, int], tuple[ErrorCode, int]] = {}
    required: dict[tuple[str, int], int] = {}
    wanted = {(topic.name, p.partition_index): p.offset for topic in request.topics for p in topic.partitions}
    permitted = allowed_names(ctx, AclOperation.DELETE, ResourceType.TOPIC, (t.name for t in request.topics))
    for (name, index), requested in wanted.items():  # a partition named twice: the last offset, as Kafka's map
        info = metadata.topic(name)
        if name not in permitted:  # Kafka: DELETE on the topic, before anything else
            results[(name, index)] = (ErrorCode.topic_authorization_failed, -1)
        elif info is None or not 0 <= index < len(info.partitions):
            results[(name, index)] = (ErrorCode.unknown_topic_or_partition, -1)
        elif name in INTERNAL_TOPICS:
            results[(name, index)] = (ErrorCode.invalid_topic_exception, -1)
        else:
            error, offset, low_watermark = replicas.delete_records(name, index, requested)
            results[(name, index)] = (error, low_watermark)
            if error == ErrorCode.none:
                required[(name, index)] = offset
    if required:
        logs = [replicas.partition(*tp).log for tp in required]  # before any await: all still hosted
        # The new log starts are durable first, then the segments below them go (off the event loop): a
        # crash at any point never brings deleted records back once the answer was sent.
        await replicas.log_manager.write_log_start_checkpoint_async()
        await replicas.log_manager.run_file_work_async(logs)
        results.update(await replicas.await_low_watermarks(required, request.timeout.total_seconds()))
    by_topic: dict[str, list] = {}
    for (name, index), (error, low_watermark) in results.items():
        by_topic.setdefault(name, []).append(make(
            schema.DeleteRecordsPartitionResult, partition_index=index, low_watermark=low_watermark, error_code=error))
    return make(schema.DeleteRecordsResponse, throttle_time=0, topics=tuple(
        make(schema.DeleteRecordsTopicResult, name=name, partitions=tuple(parts)) for name, parts in by_topic.items()))

"""DescribeLogDirs (key 35), v1-4 (kio has no v0): ``kafka-log-dirs.sh``, AdminClient.describeLogDirs.

Behaviour, as Kafka's ReplicaManager.describeLogDirs: one result, the broker's data dir (absolute path), with
every log it holds (leader and follower replicas): size of its segments, offset lag as Kafka's
getLogEndOffsetLag: max(HWM - log end, 0) (0 for a current log) where this broker hosts the partition, and -1
(INVALID_OFFSET_LAG) for a log it holds but hosts no partition for (loaded at start, not (yet) named by a
LeaderAndIsr); is_future false (no AlterReplicaLogDirs); v4 the volume's total and usable bytes.
A null topic list means every log; otherwise only the named partitions this broker holds are described: a
topic none of whose named partitions is here is left out (Kafka 3.7.1 drops topics with no partitions from
the answer), so an empty list, or only unknown topics or partitions, answers the dir with no topics. A dir
that cannot be read answers KAFKA_STORAGE_ERROR for that dir.
"""

from __future__ import annotations

import os
import shutil

from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, cluster_allowed
from pykbroker.server.handlers._build import make, response_module

INVALID_OFFSET_LAG = -1  # Kafka's DescribeLogDirsResponse.INVALID_OFFSET_LAG: no hosted partition for the log


@handles(35)
def describe_log_dirs(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    if not cluster_allowed(ctx, AclOperation.DESCRIBE):  # Kafka: no dirs, the error at the top (v3+)
        return make(schema.DescribeLogDirsResponse, throttle_time=0, error_code=ErrorCode.cluster_authorization_failed,
                    results=())
    replicas = ctx.broker.replicas
    log_manager = replicas.log_manager
    wanted = None
    if request.topics is not None:
        wanted = {(t.topic, index) for t in request.topics for index in t.partitions}
    log_dir = os.path.abspath(log_manager.data_dir)
    try:
        usage = shutil.disk_usage(log_dir)
    except OSError:
        result = make(schema.DescribeLogDirsResult, error_code=ErrorCode.kafka_storage_error, log_dir=log_dir,
                      topics=(), total_bytes=-1, usable_bytes=-1)
    else:
        by_topic: dict[str, list] = {}
        for partition_log in log_manager.logs():
            if wanted is not None and (partition_log.topic, partition_log.partition) not in wanted:
                continue
            parts = by_topic.setdefault(partition_log.topic, [])
            partition = replicas.partition(partition_log.topic, partition_log.partition)
            lag = max(partition.high_watermark - partition_log.log_end_offset, 0) if partition is not None \
                else INVALID_OFFSET_LAG
            parts.append(make(schema.DescribeLogDirsPartition, partition_index=partition_log.partition,
                              partition_size=partition_log.size_bytes, offset_lag=lag, is_future_key=False))
        result = make(
            schema.DescribeLogDirsResult, error_code=ErrorCode.none, log_dir=log_dir,
            topics=tuple(make(schema.DescribeLogDirsTopic, name=name, partitions=tuple(parts))
                         for name, parts in by_topic.items()),
            total_bytes=usage.total, usable_bytes=usage.free,
        )
    return make(schema.DescribeLogDirsResponse, throttle_time=0, error_code=ErrorCode.none, results=(result,))

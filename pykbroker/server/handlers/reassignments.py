"""AlterPartitionReassignments (key 45) v0 and ListPartitionReassignments (key 46) v0.

Cluster mode, as Kafka's KafkaApis in ZooKeeper mode: only the active controller answers (the controller does
the work: cluster/reassignment.py); any other broker answers NOT_CONTROLLER at the top level and the admin
client retries at the controller named by Metadata. Per partition: UNKNOWN_TOPIC_OR_PARTITION,
INVALID_REPLICA_ASSIGNMENT (empty, duplicates, negative ids, new replicas on brokers that are not alive),
NO_REASSIGNMENT_IN_PROGRESS for a cancel of a partition not being reassigned.

Single broker (embedded metadata, no controller): nothing can move, so a reassignment to this broker alone
completes at once (NONE), any other replica list is INVALID_REPLICA_ASSIGNMENT, a cancel is
NO_REASSIGNMENT_IN_PROGRESS and the list of ongoing reassignments is always empty (kafka-topics.sh
--describe asks for it).
"""

from __future__ import annotations

from pykbroker.cluster.reassignment import invalid_replicas
from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, cluster_allowed, denied_answer
from pykbroker.server.handlers._build import make, response_module

NO_SUCH_PARTITION = "The partition does not exist."


def _single_broker_alter(ctx: RequestContext, tp: tuple[str, int], replicas) -> tuple[ErrorCode, str | None]:
    info = ctx.broker.metadata.topic(tp[0])
    if info is None or not 0 <= tp[1] < len(info.partitions):
        return ErrorCode.unknown_topic_or_partition, NO_SUCH_PARTITION
    if replicas is None:
        return ErrorCode.no_reassignment_in_progress, f"No reassignment in progress for partition {tp[0]}-{tp[1]}"
    own = ctx.broker.config.broker_id
    current = tuple(info.partitions[tp[1]].replicas)
    adding = tuple(r for r in replicas if r not in current)
    message = invalid_replicas(list(replicas), adding, {own})
    if message is None and list(replicas) != [own]:
        message = f"Replica list {list(replicas)} is not this single broker [{own}]"
    if message is not None:
        return ErrorCode.invalid_replica_assignment, message
    return ErrorCode.none, None


@handles(45)
async def alter_partition_reassignments(ctx: RequestContext, request) -> object:
    if not cluster_allowed(ctx, AclOperation.ALTER):  # Kafka: ALTER on the cluster
        return denied_answer(ctx, ErrorCode.cluster_authorization_failed)
    schema = response_module(ctx)
    wanted = {(topic.name, int(p.partition_index)): (None if p.replicas is None else [int(r) for r in p.replicas])
              for topic in request.topics for p in topic.partitions}
    cluster = ctx.broker.cluster
    if cluster is None:
        results = {tp: _single_broker_alter(ctx, tp, replicas) for tp, replicas in wanted.items()}
    else:
        results = await cluster.controller.alter_partition_reassignments(wanted)
    if isinstance(results, ErrorCode):
        return make(schema.AlterPartitionReassignmentsResponse, throttle_time=0, error_code=results,
                    error_message=None, responses=())
    by_topic: dict[str, list] = {}
    for (topic, index), (error, message) in results.items():
        by_topic.setdefault(topic, []).append(make(
            schema.ReassignablePartitionResponse, partition_index=index, error_code=error, error_message=message))
    return make(
        schema.AlterPartitionReassignmentsResponse, throttle_time=0, error_code=ErrorCode.none, error_message=None,
        responses=tuple(make(schema.ReassignableTopicResponse, name=topic, partitions=tuple(parts))
                        for topic, parts in by_topic.items()),
    )


@handles(46)
async def list_partition_reassignments(ctx: RequestContext, request) -> object:
    if not cluster_allowed(ctx, AclOperation.DESCRIBE):  # Kafka: DESCRIBE on the cluster
        return denied_answer(ctx, ErrorCode.cluster_authorization_failed)
    schema = response_module(ctx)
    wanted = None
    if request.topics is not None:
        wanted = [(t.name, int(i)) for t in request.topics for i in t.partition_indexes]
    cluster = ctx.broker.cluster
    ongoing = {} if cluster is None else await cluster.controller.list_partition_reassignments(wanted)
    if isinstance(ongoing, ErrorCode):
        return make(schema.ListPartitionReassignmentsResponse, throttle_time=0, error_code=ongoing,
                    error_message=None, topics=())
    by_topic: dict[str, list] = {}
    for (topic, index), assignment in sorted(ongoing.items()):
        by_topic.setdefault(topic, []).append(make(
            schema.OngoingPartitionReassignment, partition_index=index, replicas=assignment.replicas,
            adding_replicas=assignment.adding, removing_replicas=assignment.removing))
    return make(
        schema.ListPartitionReassignmentsResponse, throttle_time=0, error_code=ErrorCode.none, error_message=None,
        topics=tuple(make(schema.OngoingTopicReassignment, name=topic, partitions=tuple(parts))
                     for topic, parts in by_topic.items()),
    )

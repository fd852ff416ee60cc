"""The cluster's own APIs, served only when the broker is in a ZooKeeper cluster (``cluster_only`` in the
support matrix): what the controller tells brokers, and what brokers and admin clients ask the controller;
ElectLeaders also on the single broker.

- LeaderAndIsr (4) v7, StopReplica (5) v4, UpdateMetadata (6) v8: from the controller to every broker,
  applied by cluster/node.py (STALE_CONTROLLER_EPOCH / STALE_BROKER_EPOCH for a fenced sender). The codecs
  are generated from Kafka's message specs (protocol/interbroker); only the versions our controller sends
  (Kafka 3.7's, inter.broker.protocol.version 3.7) are advertised.
- ControlledShutdown (7) v3, AlterPartition (56) v3: from brokers to the controller; ElectLeaders (43)
  v0-2: from admin clients (kafka-leader-election.sh) to the controller. A broker that is not the active
  controller answers NOT_CONTROLLER, and the sender looks the controller up again, as with Kafka.
"""

from __future__ import annotations

from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, cluster_allowed, denied_answer
from pykbroker.server.handlers._build import make, response_module

PREFERRED, UNCLEAN = 0, 1


@handles(4)
async def leader_and_isr(ctx: RequestContext, request) -> object:
    if not cluster_allowed(ctx, AclOperation.CLUSTER_ACTION):  # Kafka: CLUSTER_ACTION on the cluster
        return denied_answer(ctx, ErrorCode.cluster_authorization_failed)
    return await ctx.broker.cluster.handle_leader_and_isr(request, response_module(ctx))


@handles(5)
def stop_replica(ctx: RequestContext, request) -> object:
    if not cluster_allowed(ctx, AclOperation.CLUSTER_ACTION):  # Kafka: CLUSTER_ACTION on the cluster
        return denied_answer(ctx, ErrorCode.cluster_authorization_failed)
    return ctx.broker.cluster.handle_stop_replica(request, response_module(ctx))


@handles(6)
def update_metadata(ctx: RequestContext, request) -> object:
    if not cluster_allowed(ctx, AclOperation.CLUSTER_ACTION):  # Kafka: CLUSTER_ACTION on the cluster
        return denied_answer(ctx, ErrorCode.cluster_authorization_failed)
    return ctx.broker.cluster.handle_update_metadata(request, response_module(ctx))


@handles(7)
async def controlled_shutdown(ctx: RequestContext, request) -> object:
    if not cluster_allowed(ctx, AclOperation.CLUSTER_ACTION):  # Kafka: CLUSTER_ACTION on the cluster
        return denied_answer(ctx, ErrorCode.cluster_authorization_failed)
    schema = response_module(ctx)
    controller = ctx.broker.cluster.controller
    if not controller.active:
        return schema.ControlledShutdownResponse(error_code=ErrorCode.not_controller, remaining_partitions=())
    error, remaining = await controller.controlled_shutdown(request.broker_id, request.broker_epoch)
    return schema.ControlledShutdownResponse(error_code=error, remaining_partitions=tuple(
        schema.RemainingPartition(topic_name=topic, partition_index=index) for topic, index in remaining))


@handles(56)
async def alter_partition(ctx: RequestContext, request) -> object:
    if not cluster_allowed(ctx, AclOperation.CLUSTER_ACTION):  # Kafka: CLUSTER_ACTION on the cluster
        return denied_answer(ctx, ErrorCode.cluster_authorization_failed)
    controller = ctx.broker.cluster.controller
    if not controller.active:
        schema = response_module(ctx)
        return make(schema.AlterPartitionResponse, throttle_time=0, error_code=ErrorCode.not_controller, topics=())
    return await controller.alter_partition(request)


@handles(43)
async def elect_leaders(ctx: RequestContext, request) -> object:
    if not cluster_allowed(ctx, AclOperation.ALTER):  # Kafka: ALTER on the cluster
        return denied_answer(ctx, ErrorCode.cluster_authorization_failed)
    schema = response_module(ctx)
    election_type = getattr(request, "election_type", PREFERRED)
    wanted = None
    if request.topic_partitions is not None:
        wanted = [(entry.topic, index) for entry in request.topic_partitions for index in entry.partitions]
    by_topic: dict[str, list] = {}
    cluster = ctx.broker.cluster
    if cluster is None:
        results = _single_node_elections(ctx.broker.metadata, election_type, wanted)
        if wanted is None:  # KRaft lists every topic, leaving out the partitions needing no election
            by_topic = {info.name: [] for info in ctx.broker.metadata.topics()}
        active = True
    else:
        controller = cluster.controller
        active = controller.active
        if active:
            results = await controller.elect_leaders(election_type, wanted)
        else:
            results = {tp: (ErrorCode.not_controller, None) for tp in wanted or ()}
    for (topic, index), (error, message) in sorted(results.items()):
        by_topic.setdefault(topic, []).append(
            make(schema.PartitionResult, partition_id=index, error_code=error, error_message=message))
    if election_type not in (PREFERRED, UNCLEAN):  # every partition has it too
        top_error = ErrorCode.invalid_request
    else:
        top_error = ErrorCode.none if active or wanted else ErrorCode.not_controller
    return make(
        schema.ElectLeadersResponse, throttle_time=0, error_code=top_error,
        replica_election_results=tuple(
            make(schema.ReplicaElectionResult, topic=topic, partition_result=tuple(parts))
            for topic, parts in by_topic.items()),
    )


def _single_node_elections(metadata, election_type: int, wanted: list[tuple[str, int]] | None,
                           ) -> dict[tuple[str, int], tuple[ErrorCode, str | None]]:
    """The single broker leads every partition, which is its only (so preferred) replica: as KRaft's
    ReplicationControlManager answers, ELECTION_NOT_NEEDED for each partition named (preferred or unclean:
    the leader is alive), UNKNOWN_TOPIC_OR_PARTITION for one that does not exist; with every partition
    asked for (null), those needing no election are left out."""
    if election_type not in (PREFERRED, UNCLEAN):
        return {tp: (ErrorCode.invalid_request, f"Unknown election type {election_type}") for tp in wanted or ()}
    if wanted is None:
        return {}
    results = {}
    for topic, index in wanted:
        info = metadata.topic(topic)
        if info is None:
            results[(topic, index)] = (ErrorCode.unknown_topic_or_partition, f"No such topic as {topic}")
        elif not 0 <= index < len(info.partitions):
            results[(topic, index)] = (ErrorCode.unknown_topic_or_partition, f"No such partition as {topic}-{index}")
        else:
            results[(topic, index)] = (ErrorCode.election_not_needed, "Leader election not needed for topic partition.")
    return results

"""Metadata (key 3), v0-12.

Behaviour: brokers (their endpoints on the listener the request arrived on, as Kafka answers), cluster
id, controller (-1 while none is known), and for each requested topic its id, partitions, leader, leader
epoch (v7+), replicas, ISR and offline replicas (v5+). A null topic list (v1+) or an empty one (v0) means
every topic. Partition errors as Kafka's MetadataCache.getPartitionMetadata gives them: a leader that is
not a live broker (-1 while none is elected) answers LEADER_NOT_AVAILABLE with leader -1; a live leader
not reachable on this listener answers LISTENER_NOT_FOUND (v6+; LEADER_NOT_AVAILABLE before); v0 lists
only the replicas and ISR members reachable on this listener and answers REPLICA_NOT_AVAILABLE when
some are not (later versions list them all).
Unknown topics are created when the request allows it (always before v4, the flag from v4) and
auto.create.topics.enable is on; the topic then appears at once when its leaders are known (single node),
else LEADER_NOT_AVAILABLE until they are (cluster: the controller elects them, as in Kafka); a name Kafka
would reject gets INVALID_TOPIC_EXCEPTION, a failed creation its error (e.g. INVALID_REPLICATION_FACTOR).
Topics can be asked for by id from v10 (unknown id: UNKNOWN_TOPIC_ID). Authorized operations (v8+, the
cluster's until v10) when asked: the principal's (every operation the resource supports without an
authorizer, see _operations.py).
Authorization, as Kafka's handleTopicMetadataRequest: a topic the principal may not DESCRIBE is left out of
an all-topics answer and answers TOPIC_AUTHORIZATION_FAILED when named (without its id; by id: without its
name), before its existence is checked; auto-creation needs CREATE on the cluster or on the topic, else
TOPIC_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

import uuid

from pykbroker.cluster.metadata import PartitionState, TopicInfo, topic_name_error
from pykbroker.protocol.errors import ErrorCode, KafkaError
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, allowed_names, cluster_allowed
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers._operations import (
    NOT_REQUESTED, TOPIC_OPERATIONS, authorized_if, cluster_operations_if,
)

NO_TOPIC_ID = uuid.UUID(int=0)
NO_LEADER = -1


class _Reach:
    """Which brokers are alive, and which of them can be reached on the request's listener."""

    def __init__(self, ctx: RequestContext, metadata_version: int | None = None, request=None) -> None:
        self.version = ctx.version if metadata_version is None else metadata_version  # DescribeTopicPartitions: 12
        self.alive = {b.broker_id for b in ctx.broker.metadata.brokers()}
        self.reachable = {b.broker_id for b in ctx.broker.brokers_on(ctx.listener)}
        self.ctx = ctx
        self.operations_asked = bool(getattr(request, "include_topic_authorized_operations", False))

    def topic_operations(self, name: str | None) -> int:
        return authorized_if(self.ctx, self.operations_asked and name is not None, ResourceType.TOPIC, name,
                             TOPIC_OPERATIONS)

    def partition(self, schema, index: int, state: PartitionState, cls: type | None = None) -> object:
        replicas, isr = state.replicas, state.isr
        if self.version == 0:  # Kafka's errorUnavailableEndpoints
            replicas = [r for r in replicas if r in self.reachable]
            isr = [r for r in isr if r in self.reachable]
        leader = state.leader
        if leader not in self.reachable:
            if leader in self.alive and self.version >= 6:
                error = ErrorCode.listener_not_found
            else:
                error = ErrorCode.leader_not_available
            leader = NO_LEADER
        elif len(replicas) < len(state.replicas) or len(isr) < len(state.isr):
            error = ErrorCode.replica_not_available
        else:
            error = ErrorCode.none
        return make(
            cls or schema.MetadataResponsePartition,
            error_code=error,
            partition_index=index,
            leader_id=leader,
            leader_epoch=state.leader_epoch,
            replica_nodes=tuple(replicas),
            isr_nodes=tuple(isr),
            offline_replicas=tuple(state.offline_replicas),
        )

    def topic(self, schema, info: TopicInfo) -> object:
        return make(
            schema.MetadataResponseTopic,
            error_code=ErrorCode.none,
            name=info.name,
            topic_id=info.topic_id,
            is_internal=info.internal,
            partitions=tuple(self.partition(schema, index, state) for index, state in enumerate(info.partitions)),
            topic_authorized_operations=self.topic_operations(info.name),
        )


def _error_entry(reach: _Reach, schema, code: ErrorCode, name: str | None, topic_id: uuid.UUID | None = None) -> object:
    return make(
        schema.MetadataResponseTopic,
        error_code=code,
        name=name,
        topic_id=topic_id or NO_TOPIC_ID,
        is_internal=False,
        partitions=(),
        topic_authorized_operations=(NOT_REQUESTED if code == ErrorCode.topic_authorization_failed
                                     else reach.topic_operations(name)),
    )


@handles(3)
async def metadata(ctx: RequestContext, request) -> object:
    broker = ctx.broker
    schema = response_module(ctx)
    version = ctx.version
    reach = _Reach(ctx, request=request)
    requested = request.topics
    if requested is None or (version == 0 and not requested):
        infos = broker.metadata.topics()
        permitted = allowed_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, (i.name for i in infos),
                                  log_if_denied=False)
        topics = tuple(reach.topic(schema, info) for info in infos if info.name in permitted)
    else:
        allow_auto_create = getattr(request, "allow_auto_topic_creation", True) and bool(
            broker.config.get("auto.create.topics.enable")
        )
        by_name = [wanted.name for wanted in requested if wanted.name is not None]
        by_id = {wanted.topic_id: broker.metadata.topic_by_id(wanted.topic_id) for wanted in requested
                 if wanted.name is None and getattr(wanted, "topic_id", None)}
        permitted = allowed_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC,
                                  by_name + [info.name for info in by_id.values() if info is not None])
        may_create_any = None  # CREATE on the cluster, asked once when a topic is to be created
        entries = []
        for wanted in requested:
            name = wanted.name
            topic_id = getattr(wanted, "topic_id", None)
            if name is None:
                info = by_id.get(topic_id) if topic_id else None
                if info is None:
                    entries.append(_error_entry(reach, schema, ErrorCode.unknown_topic_id, None, topic_id))
                elif info.name not in permitted:
                    entries.append(_error_entry(reach, schema, ErrorCode.topic_authorization_failed, None, topic_id))
                else:
                    entries.append(reach.topic(schema, info))
                continue
            if name not in permitted:
                entries.append(_error_entry(reach, schema, ErrorCode.topic_authorization_failed, name))
                continue
            info = broker.metadata.topic(name)
            if info is None and allow_auto_create:
                if may_create_any is None:
                    may_create_any = cluster_allowed(ctx, AclOperation.CREATE, log_if_denied=False)
                if not may_create_any and not allowed_names(ctx, AclOperation.CREATE, ResourceType.TOPIC, [name]):
                    entries.append(_error_entry(reach, schema, ErrorCode.topic_authorization_failed, name))
                    continue
            if info is None:
                if topic_name_error(name):
                    entries.append(_error_entry(reach, schema, ErrorCode.invalid_topic_exception, name))
                    continue
                if not allow_auto_create:
                    entries.append(_error_entry(reach, schema, ErrorCode.unknown_topic_or_partition, name))
                    continue
                try:
                    info = await broker.topics.auto_create_async(name)
                except KafkaError as exc:
                    entries.append(_error_entry(reach, schema, exc.code, name))
                    continue
                if info is None:
                    entries.append(_error_entry(reach, schema, ErrorCode.leader_not_available, name))
                    continue
            entries.append(reach.topic(schema, info))
        topics = tuple(entries)
    brokers = tuple(
        make(schema.MetadataResponseBroker, node_id=b.broker_id, host=b.host, port=b.port, rack=b.rack)
        for b in broker.brokers_on(ctx.listener)
    )
    return make(
        schema.MetadataResponse,
        throttle_time=0,
        brokers=brokers,
        cluster_id=broker.metadata.cluster_id,
        controller_id=broker.metadata.controller_id,
        topics=topics,
        cluster_authorized_operations=cluster_operations_if(
            ctx, version <= 10 and getattr(request, "include_cluster_authorized_operations", False)),
    )

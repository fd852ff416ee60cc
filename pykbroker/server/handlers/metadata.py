"""Metadata (key 3), v0-12.

Behaviour: brokers (their endpoints on the listener the request arrived on, as Kafka answers), cluster
id, controller, and for each requested topic its id, partitions, leader, leader epoch (v7+), replicas
and ISR. A null topic list (v1+) or an empty one (v0) means every topic.
Unknown topics are created when the request allows it (always before v4, the flag from v4) and
auto.create.topics.enable is on; a name Kafka would reject gets INVALID_TOPIC_EXCEPTION. Topics can be
asked for by id from v10 (unknown id: UNKNOWN_TOPIC_ID).
"""

from __future__ import annotations

import uuid

from pykbroker.cluster.metadata import TopicInfo, topic_name_error
from pykbroker.protocol.errors import ErrorCode, KafkaError
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._build import make, response_module

NO_TOPIC_ID = uuid.UUID(int=0)


def _topic_entry(schema, info: TopicInfo) -> object:
    partitions = tuple(
        make(
            schema.MetadataResponsePartition,
            error_code=ErrorCode.none,
            partition_index=index,
            leader_id=state.leader,
            leader_epoch=state.leader_epoch,
            replica_nodes=tuple(state.replicas),
            isr_nodes=tuple(state.isr),
            offline_replicas=(),
        )
        for index, state in enumerate(info.partitions)
    )
    return make(
        schema.MetadataResponseTopic,
        error_code=ErrorCode.none,
        name=info.name,
        topic_id=info.topic_id,
        is_internal=info.internal,
        partitions=partitions,
    )


def _error_entry(schema, code: ErrorCode, name: str | None, topic_id: uuid.UUID | None = None) -> object:
    return make(
        schema.MetadataResponseTopic,
        error_code=code,
        name=name,
        topic_id=topic_id or NO_TOPIC_ID,
        is_internal=False,
        partitions=(),
    )


@handles(3)
def metadata(ctx: RequestContext, request) -> object:
    broker = ctx.broker
    schema = response_module(ctx)
    version = ctx.version
    requested = request.topics
    if requested is None or (version == 0 and not requested):
        topics = tuple(_topic_entry(schema, info) for info in broker.metadata.topics())
    else:
        allow_auto_create = getattr(request, "allow_auto_topic_creation", True) and bool(
            broker.config.get("auto.create.topics.enable")
        )
        entries = []
        for wanted in requested:
            name = wanted.name
            topic_id = getattr(wanted, "topic_id", None)
            if name is None:
                info = broker.metadata.topic_by_id(topic_id) if topic_id else None
                entries.append(
                    _topic_entry(schema, info) if info else _error_entry(schema, ErrorCode.unknown_topic_id, None, topic_id)
                )
                continue
            info = broker.metadata.topic(name)
            if info is None:
                if topic_name_error(name):
                    entries.append(_error_entry(schema, ErrorCode.invalid_topic_exception, name))
                    continue
                if not allow_auto_create:
                    entries.append(_error_entry(schema, ErrorCode.unknown_topic_or_partition, name))
                    continue
                try:
                    info = broker.topics.auto_create(name)
                except KafkaError as exc:
                    entries.append(_error_entry(schema, exc.code, name))
                    continue
            entries.append(_topic_entry(schema, info))
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
    )

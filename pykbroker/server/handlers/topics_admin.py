"""CreateTopics (key 19) v2-7, DeleteTopics (key 20) v1-6, CreatePartitions (key 37) v0-3.

Behaviour: the rules live in cluster/topic_admin.py; these handlers decode, call it per topic, and put
its KafkaError code and message on that topic's entry. CreateTopics v5+ echoes the partition count,
replication factor and the full config list with sources (what the Java admin shows after create), v7
the new topic id; num_partitions / replication_factor -1 take the broker defaults. Manual replica
assignments (CreateTopics' with num_partitions and replication_factor -1, CreatePartitions' one per new
partition) place the replicas exactly as named; bad ones get INVALID_REPLICA_ASSIGNMENT (INVALID_REQUEST with
a partition count or factor too), as KRaft / ZkAdminManager check them (cluster/topic_admin.py). The single
broker accepts only its own id.
DeleteTopics v6 accepts topics by name or id. A name (or id) given twice deletes nothing and is answered
once, INVALID_REQUEST "Duplicate topic name." ("Duplicate topic id.", without a name), before the other
topics, as Kafka's ControllerApis.deleteTopics (KRaft; Kafka 3.7's ZooKeeper mode answers each
occurrence, which librdkafka rejects: "Broker returned topic ... multiple times"). A request that would add more than 10,000 partitions is
refused whole with POLICY_VIOLATION, as Kafka does. Each handler answers only after its metadata
changes are durable (awaited off the event loop, so other clients are served meanwhile) and visible: in
cluster mode, once the controller's UpdateMetadata shows them, within the request's timeout shared by its
topics (REQUEST_TIMED_OUT for a topic not visible by then; the change goes on, as in Kafka).

Client quotas (KIP-599, server/throttling.py): with a controller_mutation_rate, each topic's partitions (created,
added, or those of a deleted topic) are taken from the client's quota after the topic was validated and before
it is changed, as ZkAdminManager does; CreateTopics v6+, CreatePartitions v3+ and DeleteTopics v5+ refuse a topic
with THROTTLING_QUOTA_EXCEEDED once the quota is used up, older versions go on and are throttled.
validate_only takes nothing.

CreateTopics and CreatePartitions change the metadata, host the new partitions and commit in a task the
broker owns (``Broker.run_owned``), awaited through ``asyncio.shield``: a client that disconnects
mid-request (connection_lost cancels its handler) never leaves partitions in the metadata unhosted, and
the broker's stop waits for the task. A storage error while hosting a topic's partitions answers
KAFKA_STORAGE_ERROR for that topic only (Kafka's KafkaStorageException from its LogManager); a journal
write that fails answers KAFKA_STORAGE_ERROR for every topic the request changed, also in DeleteTopics (the
change is applied and retried with the next commit, but it is not durable).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter

from pykbroker.cluster.topic_admin import too_many_partitions_per_request
from pykbroker.protocol.errors import ErrorCode, KafkaError
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, allowed_names, cluster_allowed
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.throttling import mutation_quota, record_mutation
from pykbroker.config import TOPIC_CONFIGS


def _created_configs(ctx: RequestContext, schema, name: str) -> tuple | None:
    if not hasattr(schema, "CreatableTopicConfigs"):  # the config list arrived in v5
        return None
    return tuple(
        make(
            schema.CreatableTopicConfigs,
            name=key,
            value=TOPIC_CONFIGS[key].format(value),
            read_only=False,
            config_source=int(source),
            is_sensitive=TOPIC_CONFIGS[key].sensitive,
        )
        for key, (value, source) in ctx.broker.topics.effective_configs(name).items()
    )


def _not_durable(exc: OSError) -> KafkaError:
    return KafkaError(
        ErrorCode.kafka_storage_error,
        f"The change is applied but not durable: the metadata journal write failed ({exc.strerror or exc}); "
        "it is retried with the next change.",
    )


async def _commit(ctx: RequestContext) -> KafkaError | None:
    """Await the durability of every change so far; the error for the changed topics if it failed."""
    try:
        await asyncio.wrap_future(ctx.broker.topics.commit())
    except OSError as exc:
        return _not_durable(exc)
    return None


class _Deadline:
    """The request's timeout, shared by its topics (Kafka waits for all of them in one delayed operation)."""

    def __init__(self, request) -> None:
        self._end = time.monotonic() + request.timeout.total_seconds()

    def remaining(self) -> float:
        return max(0.0, self._end - time.monotonic())


def _counted(topic):
    """A CreateTopics entry with its manual assignment's partition count and replication factor."""
    return dataclasses.replace(topic, num_partitions=len(topic.assignments),
                               replication_factor=len(topic.assignments[0].broker_ids))


@handles(19)
async def create_topics(ctx: RequestContext, request) -> object:
    return await asyncio.shield(ctx.broker.run_owned(_create_topics(ctx, request)))


async def _create_topics(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    outcomes: list[tuple[object, KafkaError | None, object]] = []  # (request topic, error, created info)
    deadline = _Deadline(request)
    seen: set[str] = set()
    default_partitions = int(ctx.broker.config.get("num.partitions"))
    too_many = too_many_partitions_per_request(
        sum(len(t.assignments) if t.assignments else default_partitions if t.num_partitions == -1
            else max(t.num_partitions, 0) for t in request.topics)
    )
    # Kafka: CREATE on the cluster or on each topic; the created configs and counts only with DESCRIBE_CONFIGS
    names = [t.name for t in request.topics]
    creatable = (set(names) if cluster_allowed(ctx, AclOperation.CREATE, log_if_denied=False)
                 else allowed_names(ctx, AclOperation.CREATE, ResourceType.TOPIC, names))
    describable = allowed_names(ctx, AclOperation.DESCRIBE_CONFIGS, ResourceType.TOPIC, names, log_if_denied=False)
    quota = mutation_quota(ctx, "CreateTopics")  # KIP-599's controller_mutation_rate (None: no client quotas)
    validate_only = request.validate_only if hasattr(request, "validate_only") else False
    attempted: set[int] = set()  # (ids of) the request's topics Kafka's admin manager is asked to create
    for topic in request.topics:
        info = None
        try:
            if too_many is not None:
                raise too_many
            if topic.name in seen:
                raise KafkaError(ErrorCode.invalid_request, f"Duplicate topic name {topic.name} in request")
            seen.add(topic.name)
            if topic.name not in creatable:
                raise KafkaError(ErrorCode.topic_authorization_failed, "Authorization failed.")
            attempted.add(id(topic))
            assignment = None
            if topic.assignments:
                assignment = ctx.broker.topics.check_create_assignment(
                    topic.num_partitions, topic.replication_factor,
                    [(a.partition_index, list(a.broker_ids)) for a in topic.assignments])
            if quota is not None and not validate_only:  # validated, then its partitions taken from the quota
                await ctx.broker.topics.create_async(
                    topic.name, topic.num_partitions, topic.replication_factor, {c.name: c.value for c in topic.configs},
                    assignment=assignment, validate_only=True)
                record_mutation(quota, len(assignment) if assignment else
                                default_partitions if topic.num_partitions == -1 else topic.num_partitions)
            info = await ctx.broker.topics.create_async(
                topic.name,
                topic.num_partitions,
                topic.replication_factor,
                {c.name: c.value for c in topic.configs},
                assignment=assignment,
                validate_only=validate_only,
                timeout_s=deadline.remaining(),
            )
        except KafkaError as exc:
            outcomes.append((topic, exc, None))
        else:
            outcomes.append((topic, None, info))
    not_durable = await _commit(ctx)
    results = []
    for topic, error, info in outcomes:
        if info is not None and not_durable is not None:
            error, info = not_durable, None
        ok = error is None
        if ok and info is None and topic.assignments:  # validated only: the counts the assignment gives
            topic = _counted(topic)
        if topic.name not in describable:
            # KafkaApis resets the config error of a topic whose creation was attempted and failed
            config_error = (ErrorCode.none if not ok and id(topic) in attempted
                            else ErrorCode.topic_authorization_failed)
            results.append(make(schema.CreatableTopicResult, name=topic.name, topic_id=info.topic_id if info else None,
                                error_code=ErrorCode.none if ok else error.code,
                                error_message=None if ok else error.message, num_partitions=-1, replication_factor=-1,
                                configs=None, topic_config_error_code=config_error))
            continue
        results.append(
            make(
                schema.CreatableTopicResult,
                name=topic.name,
                topic_id=info.topic_id if info else None,
                error_code=ErrorCode.none if ok else error.code,
                error_message=None if ok else error.message,
                num_partitions=len(info.partitions) if info else (topic.num_partitions if ok else -1),
                replication_factor=info.replication_factor if info else (topic.replication_factor if ok else -1),
                configs=_created_configs(ctx, schema, topic.name) if info else None,
            )
        )
    return make(schema.CreateTopicsResponse, throttle_time=0, topics=tuple(results))


@handles(20)
async def delete_topics(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    metadata = ctx.broker.metadata
    deadline = _Deadline(request)
    if ctx.version >= 6:
        wanted = [(t.name, t.topic_id) for t in request.topics]
    else:
        wanted = [(name, None) for name in request.topic_names]
    counts = Counter(name if name is not None else topic_id for name, topic_id in wanted)
    # Kafka: DELETE on each topic; named by id, DESCRIBE too, else the answer does not name it
    named = [name if name is not None else getattr(metadata.topic_by_id(topic_id), "name", None)
             for name, topic_id in wanted]
    describable = allowed_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, (n for n in named if n is not None))
    deletable = allowed_names(ctx, AclOperation.DELETE, ResourceType.TOPIC, (n for n in named if n is not None))
    outcomes = []
    quota = mutation_quota(ctx, "DeleteTopics")  # KIP-599's controller_mutation_rate (None: no client quotas)
    for name, topic_id in dict.fromkeys(wanted):  # each duplicate once, in request order
        if counts[name if name is not None else topic_id] > 1:
            outcomes.append((name, topic_id, ErrorCode.invalid_request,
                             "Duplicate topic name." if name is not None else "Duplicate topic id."))
    for name, topic_id in wanted:
        if counts[name if name is not None else topic_id] > 1:
            continue
        error, message = ErrorCode.none, None
        if name is None and topic_id is not None:
            info = metadata.topic_by_id(topic_id)
            name = info.name if info else None
            if info is None:
                error, message = ErrorCode.unknown_topic_id, "This server does not host this topic ID."
            elif name not in describable:
                name, error, message = None, ErrorCode.topic_authorization_failed, None
            elif name not in deletable:
                error, message = ErrorCode.topic_authorization_failed, None
        elif name not in deletable:
            error, message = ErrorCode.topic_authorization_failed, None
        else:
            info = metadata.topic(name)
            topic_id = info.topic_id if info else topic_id
        if error == ErrorCode.none:
            try:
                if info is not None:
                    record_mutation(quota, len(info.partitions))
                await ctx.broker.topics.delete_async(name, timeout_s=deadline.remaining())
                ctx.broker.forget_topic(name)
            except KafkaError as exc:
                error, message = exc.code, exc.message
        outcomes.append((name, topic_id, error, message))
    not_durable = await _commit(ctx)  # the deleted topics' directories are removed only if it succeeded
    results = []
    for name, topic_id, error, message in outcomes:
        if error == ErrorCode.none and not_durable is not None:
            error, message = not_durable.code, not_durable.message
        results.append(
            make(schema.DeletableTopicResult, name=name, topic_id=topic_id, error_code=error, error_message=message)
        )
    return make(schema.DeleteTopicsResponse, throttle_time=0, responses=tuple(results))


@handles(37)
async def create_partitions(ctx: RequestContext, request) -> object:
    return await asyncio.shield(ctx.broker.run_owned(_create_partitions(ctx, request)))


async def _create_partitions(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    outcomes: list[tuple[str, KafkaError | None, bool]] = []  # (topic, error, changed)
    metadata = ctx.broker.metadata
    deadline = _Deadline(request)
    too_many = too_many_partitions_per_request(sum(
        topic.count - len(info.partitions)
        for topic in request.topics
        if (info := metadata.topic(topic.name)) is not None and topic.count > len(info.partitions)
    ))
    alterable = allowed_names(ctx, AclOperation.ALTER, ResourceType.TOPIC, (t.name for t in request.topics))
    quota = mutation_quota(ctx, "CreatePartitions")  # KIP-599's controller_mutation_rate (None: no client quotas)
    for topic in request.topics:
        info = None
        try:
            if too_many is not None:
                raise too_many
            if topic.name not in alterable:  # Kafka: ALTER on the topic
                raise KafkaError(ErrorCode.topic_authorization_failed, "The topic authorization is failed.")
            assignment = None
            if topic.assignments is not None:  # null: placed by the broker; else one per new partition
                assignment = ctx.broker.topics.check_added_assignment(
                    topic.name, topic.count, [list(a.broker_ids) for a in topic.assignments])
            if quota is not None and not request.validate_only:  # validated, then the new partitions taken
                await ctx.broker.topics.add_partitions_async(topic.name, topic.count, assignment=assignment,
                                                             validate_only=True)
                record_mutation(quota, topic.count - len(metadata.topic(topic.name).partitions))
            info = await ctx.broker.topics.add_partitions_async(
                topic.name, topic.count, assignment=assignment, validate_only=request.validate_only,
                timeout_s=deadline.remaining()
            )
        except KafkaError as exc:
            outcomes.append((topic.name, exc, False))
        else:
            outcomes.append((topic.name, None, info is not None))
    not_durable = await _commit(ctx)
    results = []
    for name, error, changed in outcomes:
        if changed and not_durable is not None:
            error = not_durable
        results.append(make(
            schema.CreatePartitionsTopicResult, name=name, error_code=error.code if error else ErrorCode.none,
            error_message=error.message if error else None,
        ))
    return make(schema.CreatePartitionsResponse, throttle_time=0, results=tuple(results))

"""AddPartitionsToTxn (key 24), v0-4, as Kafka 3.7.1's KafkaApis and TransactionCoordinator answer it.

v0-3 (clients): one transaction; a partition not in the metadata makes the whole request fail with
UNKNOWN_TOPIC_OR_PARTITION for it and OPERATION_NOT_ATTEMPTED for the others; otherwise every partition
gets the coordinator's answer (INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED - INVALID_PRODUCER_EPOCH before
v2 -, CONCURRENT_TRANSACTIONS, COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR...). v4 (brokers verifying a
transactional produce, KIP-890): a batch of transactions, each answered the same way, or with
``verify_only`` per partition whether it is already in the transaction (INVALID_TXN_STATE if not).
Authorization (Kafka's): v0-3 need WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED for
every partition) and WRITE on each topic (internal topics never pass): a refused topic's partitions answer
TOPIC_AUTHORIZATION_FAILED, the request fails as for an unknown partition; v4 needs CLUSTER_ACTION.
"""

from __future__ import annotations

import asyncio

from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.cluster.metadata import INTERNAL_TOPICS
from pykbroker.server.handlers._authorize import (
    AclOperation, ResourceType, allowed, allowed_names, cluster_allowed, denied_answer,
)
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers.init_producer_id import fenced_for_version


def _missing(ctx: RequestContext, partitions, check_topics: bool) -> dict:
    """Kafka's checks of the topics' authorization (``check_topics``) and against the metadata cache: refused
    and unknown partitions, and OPERATION_NOT_ATTEMPTED for the rest."""
    permitted = None
    if check_topics:
        permitted = allowed_names(ctx, AclOperation.WRITE, ResourceType.TOPIC,
                                  (tp[0] for tp in partitions if tp[0] not in INTERNAL_TOPICS))
    errors = {}
    for tp in partitions:
        if permitted is not None and tp[0] not in permitted:
            errors[tp] = ErrorCode.topic_authorization_failed
        elif (info := ctx.broker.metadata.topic(tp[0])) is None or not 0 <= tp[1] < len(info.partitions):
            errors[tp] = ErrorCode.unknown_topic_or_partition
    if not errors:
        return {}
    return {tp: errors.get(tp, ErrorCode.operation_not_attempted) for tp in partitions}


async def _transaction(ctx: RequestContext, transactional_id, producer_id: int, producer_epoch: int, topics,
                       verify_only: bool) -> dict:
    partitions = [(topic.name, index) for topic in topics for index in topic.partitions]
    if not verify_only and ctx.version < 4 and not allowed(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID,
                                                            transactional_id):
        return dict.fromkeys(partitions, ErrorCode.transactional_id_authorization_failed)
    errors = _missing(ctx, partitions, ctx.version < 4)
    if errors:
        return errors
    coordinator = ctx.broker.transactions
    if verify_only:
        return coordinator.handle_verify_partitions(transactional_id, producer_id, producer_epoch, partitions)
    error = await coordinator.handle_add_partitions(transactional_id, producer_id, producer_epoch, partitions)
    error = fenced_for_version(error, ctx.version, 2)
    return {tp: error for tp in partitions}


def _topic_results(schema, errors: dict) -> tuple:
    by_topic: dict[str, list] = {}
    for (topic, index), error in errors.items():
        by_topic.setdefault(topic, []).append(make(schema.AddPartitionsToTxnPartitionResult, partition_index=index,
                                                   partition_error_code=error))
    return tuple(make(schema.AddPartitionsToTxnTopicResult, name=topic, results_by_partition=tuple(results))
                 for topic, results in by_topic.items())


@handles(24)
async def add_partitions_to_txn(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    if ctx.version < 4:
        errors = await _transaction(ctx, request.v3_and_below_transactional_id, request.v3_and_below_producer_id,
                                    request.v3_and_below_producer_epoch, request.v3_and_below_topics, False)
        return make(schema.AddPartitionsToTxnResponse, throttle_time=0,
                    results_by_topic_v3_and_below=_topic_results(schema, errors))
    if not cluster_allowed(ctx, AclOperation.CLUSTER_ACTION):
        return denied_answer(ctx, ErrorCode.cluster_authorization_failed)
    results = await asyncio.gather(*(
        _transaction(ctx, t.transactional_id, t.producer_id, t.producer_epoch, t.topics, t.verify_only)
        for t in request.transactions))
    return make(schema.AddPartitionsToTxnResponse, throttle_time=0, error_code=ErrorCode.none,
                results_by_transaction=tuple(
                    make(schema.AddPartitionsToTxnResult, transactional_id=t.transactional_id,
                         topic_results=_topic_results(schema, errors))
                    for t, errors in zip(request.transactions, results)))

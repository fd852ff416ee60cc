"""DescribeTransactions (key 65), v0: ``kafka-transactions.sh describe``. Per transactional id, as Kafka's
TransactionCoordinator.handleDescribeTransactions: its state name, producer id and epoch, timeout, start
time and partitions; TRANSACTIONAL_ID_NOT_FOUND for an unknown (or expiring) id, NOT_COORDINATOR /
COORDINATOR_LOAD_IN_PROGRESS when this broker does not (yet) coordinate it."""

from __future__ import annotations

import datetime

from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, allowed, allowed_names
from pykbroker.server.handlers._build import make, response_module


def _time(ms: int) -> datetime.datetime:
    """An int64 timestamp as kio's (non-nullable) datetime field, -1 ("not started") included."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)


def _state(ctx: RequestContext, schema, transactional_id: str) -> object:
    if not allowed(ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id):
        error, metadata = ErrorCode.transactional_id_authorization_failed, None
    else:
        error, metadata = ctx.broker.transactions.describe(transactional_id)
    if metadata is None:  # the message's defaults (zeros) beside the error, as Kafka answers
        return make(schema.TransactionState, error_code=error, transactional_id=transactional_id, transaction_state="",
                    transaction_timeout=0, transaction_start_time=_time(0), producer_id=0, producer_epoch=0, topics=())
    by_topic: dict[str, list[int]] = {}
    visible = allowed_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, (t for t, _ in metadata.partitions))
    for topic, index in sorted(metadata.partitions):  # only the topics the principal may DESCRIBE, as Kafka
        if topic in visible:
            by_topic.setdefault(topic, []).append(index)
    return make(schema.TransactionState, error_code=ErrorCode.none, transactional_id=transactional_id,
                transaction_state=metadata.state.state_name, transaction_timeout=metadata.timeout_ms,
                transaction_start_time=_time(metadata.start_ms), producer_id=metadata.producer_id,
                producer_epoch=metadata.producer_epoch,
                topics=tuple(make(schema.TopicData, topic=topic, partitions=tuple(indexes))
                             for topic, indexes in by_topic.items()))


@handles(65)
def describe_transactions(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    return make(schema.DescribeTransactionsResponse, throttle_time=0,
                transaction_states=tuple(_state(ctx, schema, tid) for tid in request.transactional_ids))

"""InitProducerId (key 22), v0-5.

Behaviour: a null transactional id gets a fresh producer id (never reused across restarts, nor across the
brokers of a cluster) with epoch 0, which is what idempotent producers (the Java client, Spark's sink,
kafka-python 3) need by default. The id comes from a reserved block, so the answer is immediate except when
a new block must first be reserved (a file write on a single broker, a ZooKeeper write in a cluster, where
the next block is prefetched before the current one runs out). A transactional id goes to the transaction
coordinator (pykbroker/txn/coordinator.py): epoch bump and fencing, transaction.timeout.ms checked against
transaction.max.timeout.ms, KIP-360 re-initialisation. Before v4, PRODUCER_FENCED is answered as
INVALID_PRODUCER_EPOCH, as KafkaApis does for clients that do not know the newer code.
"""

from __future__ import annotations

from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import (
    AclOperation, ResourceType, allowed, denied_answer, idempotent_write_allowed,
)
from pykbroker.server.handlers._build import make, response_module


def fenced_for_version(error: ErrorCode, version: int, first_with_fenced: int) -> ErrorCode:
    """KafkaApis: requests older than ``first_with_fenced`` get INVALID_PRODUCER_EPOCH for PRODUCER_FENCED."""
    if version < first_with_fenced and error == ErrorCode.producer_fenced:
        return ErrorCode.invalid_producer_epoch
    return error


@handles(22)
async def init_producer_id(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    producer_id = getattr(request, "producer_id", -1)
    producer_epoch = getattr(request, "producer_epoch", -1)
    if request.transactional_id is not None:
        if not allowed(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id):
            return denied_answer(ctx, ErrorCode.transactional_id_authorization_failed)
    elif not idempotent_write_allowed(ctx):
        return denied_answer(ctx, ErrorCode.cluster_authorization_failed)
    if request.transactional_id is None:
        error, producer_id, epoch = await ctx.broker.producer_ids.init_producer_id(None, producer_id, producer_epoch)
    else:
        timeout = request.transaction_timeout
        timeout_ms = int(timeout.total_seconds() * 1000) if hasattr(timeout, "total_seconds") else int(timeout)
        error, producer_id, epoch = await ctx.broker.transactions.handle_init_producer_id(
            request.transactional_id, timeout_ms, producer_id, producer_epoch)
    return make(
        schema.InitProducerIdResponse,
        throttle_time=0,
        error_code=fenced_for_version(ErrorCode(error), ctx.version, 4),
        producer_id=producer_id,
        producer_epoch=epoch,
    )

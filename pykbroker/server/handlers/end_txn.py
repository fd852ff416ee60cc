"""EndTxn (key 26), v0-3: commit or abort (pykbroker/txn/coordinator.py handle_end_txn): answered once
PrepareCommit/PrepareAbort is written; the markers and the completion follow. PRODUCER_FENCED is answered
as INVALID_PRODUCER_EPOCH before v2, as KafkaApis does."""

from __future__ import annotations

from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, allowed
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers.init_producer_id import fenced_for_version


@handles(26)
async def end_txn(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    if not allowed(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id):
        return make(schema.EndTxnResponse, throttle_time=0, error_code=ErrorCode.transactional_id_authorization_failed)
    error = await ctx.broker.transactions.handle_end_txn(
        request.transactional_id, request.producer_id, request.producer_epoch, bool(request.committed))
    return make(schema.EndTxnResponse, throttle_time=0, error_code=fenced_for_version(error, ctx.version, 2))

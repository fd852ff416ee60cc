"""AddOffsetsToTxn (key 25), v0-3: adds the group's __consumer_offsets partition (``partition_for_group``
over the offsets topic's partition count) to the transaction, with AddPartitionsToTxn's rules and errors
(PRODUCER_FENCED answered as INVALID_PRODUCER_EPOCH before v2, as KafkaApis does)."""

from __future__ import annotations

from pykbroker.groups.offset_store import OFFSETS_TOPIC
from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, allowed
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers.init_producer_id import fenced_for_version


@handles(25)
async def add_offsets_to_txn(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    if not allowed(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id):
        return make(schema.AddOffsetsToTxnResponse, throttle_time=0,
                    error_code=ErrorCode.transactional_id_authorization_failed)
    if not allowed(ctx, AclOperation.READ, ResourceType.GROUP, request.group_id):
        return make(schema.AddOffsetsToTxnResponse, throttle_time=0, error_code=ErrorCode.group_authorization_failed)
    partition = (OFFSETS_TOPIC, ctx.broker.offset_store.partition_for(request.group_id))
    error = await ctx.broker.transactions.handle_add_partitions(
        request.transactional_id, request.producer_id, request.producer_epoch, [partition])
    return make(schema.AddOffsetsToTxnResponse, throttle_time=0, error_code=fenced_for_version(error, ctx.version, 2))

"""InitProducerId (key 22), v0-5.

Behaviour: a null transactional id gets a fresh producer id (never reused across restarts, nor across the
brokers of a cluster) with epoch 0, which is what idempotent producers (the Java client, Spark's sink,
kafka-python 3) need by default. The id comes from a reserved block, so the answer is immediate except when
a new block must first be reserved (a file write on a single broker, a ZooKeeper write in a cluster, where
the next block is prefetched before the current one runs out). Transactional ids are refused with
TRANSACTIONAL_ID_AUTHORIZATION_FAILED: transactions are not implemented, and that code makes clients fail
fast rather than retry (see cluster/producer_ids.py).
"""

from __future__ import annotations

from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._build import make, response_module


@handles(22)
async def init_producer_id(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    error, producer_id, epoch = await ctx.broker.producer_ids.init_producer_id(
        request.transactional_id, getattr(request, "producer_id", -1), getattr(request, "producer_epoch", -1)
    )
    return make(
        schema.InitProducerIdResponse,
        throttle_time=0,
        error_code=ErrorCode(error),
        producer_id=producer_id,
        producer_epoch=epoch,
    )

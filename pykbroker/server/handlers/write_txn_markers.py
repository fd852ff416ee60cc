"""WriteTxnMarkers (key 27), v1: the transaction coordinator asks this broker, as partition leader, to write
COMMIT/ABORT markers (pykbroker/replication/txn_markers.py). Answered per marker and partition once every
marker is replicated to the ISR, or with that partition's error. Advertised on the client listener, as Kafka
3.7.1 does (a single broker's coordinator may send it to itself). Kafka 3.7.1 advertises v0-1; kio has no v0
codec (v0 is v1 without the flexible encoding) and Kafka's own marker sender sends v1.
"""

from __future__ import annotations

from pykbroker.replication.txn_markers import write_markers
from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, cluster_allowed, denied_answer
from pykbroker.server.handlers._build import make, response_module


@handles(27)
def write_txn_markers(ctx: RequestContext, request) -> object:
    if not cluster_allowed(ctx, AclOperation.CLUSTER_ACTION):  # Kafka: CLUSTER_ACTION on the cluster
        return denied_answer(ctx, ErrorCode.cluster_authorization_failed)
    return _answer(ctx, response_module(ctx), request)


async def _answer(ctx: RequestContext, schema, request) -> object:
    results = await write_markers(ctx.broker, request.markers)
    return make(schema.WriteTxnMarkersResponse, markers=tuple(
        make(schema.WritableTxnMarkerResult, producer_id=result.producer_id, topics=tuple(
            make(schema.WritableTxnMarkerTopicResult, name=name, partitions=tuple(
                make(schema.WritableTxnMarkerPartitionResult, partition_index=index, error_code=error)
                for index, error in answers))
            for name, answers in result.topics))
        for result in results))

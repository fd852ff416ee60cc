"""DescribeCluster (key 60), v0-1.

Behaviour: cluster id, controller (from the metadata: in cluster mode the id the last UpdateMetadata named,
-1 while none is known) and live brokers (their endpoints on the listener the request arrived on); the
Java admin client and Spark's driver call it before every offset query. endpoint_type (v1) 1 = brokers is
the only kind served; 2 (controllers) gets UNSUPPORTED_ENDPOINT_TYPE, as a broker answers in Kafka. The
cluster's authorized operations when asked: the principal's, 0 without DESCRIBE on it (see _operations.py).
"""

from __future__ import annotations

from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers._operations import cluster_operations_if

BROKER_ENDPOINTS = 1


@handles(60)
def describe_cluster(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    metadata = ctx.broker.metadata
    endpoint_type = getattr(request, "endpoint_type", BROKER_ENDPOINTS)
    error = ErrorCode.none if endpoint_type == BROKER_ENDPOINTS else ErrorCode.unsupported_endpoint_type
    brokers = tuple(
        make(schema.DescribeClusterBroker, broker_id=b.broker_id, host=b.host, port=b.port, rack=b.rack)
        for b in (ctx.broker.brokers_on(ctx.listener) if error == ErrorCode.none else [])
    )
    return make(
        schema.DescribeClusterResponse,
        throttle_time=0,
        error_code=error,
        error_message=None,
        endpoint_type=endpoint_type,
        cluster_id=metadata.cluster_id,
        controller_id=metadata.controller_id,
        brokers=brokers,
        cluster_authorized_operations=cluster_operations_if(ctx, request.include_cluster_authorized_operations),
    )

"""FindCoordinator (key 10), v0-6 (batched coordinator_keys from v4).

Behaviour: on a single broker this broker coordinates every group; asking creates __consumer_offsets
if it does not exist yet (as Kafka does). Transaction coordinators (key_type 1) are not offered:
COORDINATOR_NOT_AVAILABLE, since transactions are not implemented. An empty group id: INVALID_REQUEST.
Success carries error_message "NONE" before v4 and "" from v4, as Kafka 3.7 answers.
"""

from __future__ import annotations

from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._build import make, response_module

GROUP_KEY = 0


def _locate(ctx: RequestContext, key: str, key_type: int) -> tuple[ErrorCode, object | None]:
    if key_type != GROUP_KEY:
        return ErrorCode.coordinator_not_available, None
    if not key:
        return ErrorCode.invalid_request, None
    ctx.broker.offset_store  # creates __consumer_offsets on first use
    return ErrorCode.none, ctx.broker.metadata.brokers()[0]


@handles(10)
def find_coordinator(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    key_type = getattr(request, "key_type", GROUP_KEY)
    if ctx.version >= 4:
        coordinators = []
        for key in request.coordinator_keys:
            error, node = _locate(ctx, key, key_type)
            coordinators.append(
                make(
                    schema.Coordinator,
                    key=key,
                    node_id=node.broker_id if node else -1,
                    host=node.host if node else "",
                    port=node.port if node else -1,
                    error_code=error,
                    error_message="" if error == ErrorCode.none else error.name.upper(),
                )
            )
        return make(schema.FindCoordinatorResponse, throttle_time=0, coordinators=tuple(coordinators))
    error, node = _locate(ctx, request.key, key_type)
    return make(
        schema.FindCoordinatorResponse,
        throttle_time=0,
        error_code=error,
        error_message=error.name.upper(),
        node_id=node.broker_id if node else -1,
        host=node.host if node else "",
        port=node.port if node else -1,
    )

"""FindCoordinator (key 10), v0-6 (batched coordinator_keys from v4).

Behaviour: on a single broker this broker coordinates every group; asking creates __consumer_offsets
if it does not exist yet (as Kafka does): the answer waits until its partitions are hosted, which
happens one partition at a time so that other clients are served meanwhile. The endpoint given is the one of the listener the request
arrived on, as Kafka answers. An empty group id: INVALID_REQUEST; an unknown key type: INVALID_REQUEST.
Success carries error_message "NONE" before v4 and "" from v4, as Kafka 3.7 answers.

Transactions are not implemented, so a transaction coordinator (key_type 1) is refused with
TRANSACTIONAL_ID_AUTHORIZATION_FAILED and a message saying why: Kafka's own answer to a transactional id
the client may not use, and one every client treats as fatal at once (librdkafka, kafka-python and the
Java client fail ``init_transactions()`` within milliseconds). COORDINATOR_NOT_AVAILABLE, the retriable
answer, made them retry for their whole timeout (10-60 s). InitProducerId refuses transactional ids the
same way (cluster/producer_ids.py).
"""

from __future__ import annotations

from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._build import make, response_module

GROUP_KEY = 0
TRANSACTION_KEY = 1


TRANSACTIONS_UNSUPPORTED = "pykbroker does not support transactions (transactional id {key!r})"


def _locate(ctx: RequestContext, key: str, key_type: int) -> tuple[ErrorCode, str | None, object | None]:
    """(error, error message or None for the error's name, coordinator endpoint or None)."""
    if key_type == TRANSACTION_KEY:
        return ErrorCode.transactional_id_authorization_failed, TRANSACTIONS_UNSUPPORTED.format(key=key), None
    if key_type != GROUP_KEY:
        return ErrorCode.invalid_request, f"Unknown coordinator type received: {key_type}", None
    if not key:
        return ErrorCode.invalid_request, None, None
    own = [b for b in ctx.broker.brokers_on(ctx.listener) if b.broker_id == ctx.broker.broker_id]
    if not own:  # this listener is not advertised: no endpoint to give
        return ErrorCode.coordinator_not_available, None, None
    return ErrorCode.none, None, own[0]


@handles(10)
def find_coordinator(ctx: RequestContext, request) -> object:
    answer = _answer(ctx, request)
    if ctx.broker.offset_store_open or not _found_a_group_coordinator(answer, ctx.version):
        return answer
    return _after_offsets_topic(ctx, answer)


def _found_a_group_coordinator(answer, version: int) -> bool:
    if version >= 4:
        return any(c.error_code == ErrorCode.none for c in answer.coordinators)
    return answer.error_code == ErrorCode.none


async def _after_offsets_topic(ctx: RequestContext, answer) -> object:
    await ctx.broker.open_offset_store()  # creates __consumer_offsets on first use
    return answer


def _answer(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    key_type = getattr(request, "key_type", GROUP_KEY)
    if ctx.version >= 4:
        coordinators = []
        for key in request.coordinator_keys:
            error, message, node = _locate(ctx, key, key_type)
            coordinators.append(
                make(
                    schema.Coordinator,
                    key=key,
                    node_id=node.broker_id if node else -1,
                    host=node.host if node else "",
                    port=node.port if node else -1,
                    error_code=error,
                    error_message="" if error == ErrorCode.none else message or error.name.upper(),
                )
            )
        return make(schema.FindCoordinatorResponse, throttle_time=0, coordinators=tuple(coordinators))
    error, message, node = _locate(ctx, request.key, key_type)
    return make(
        schema.FindCoordinatorResponse,
        throttle_time=0,
        error_code=error,
        error_message=message or error.name.upper(),
        node_id=node.broker_id if node else -1,
        host=node.host if node else "",
        port=node.port if node else -1,
    )

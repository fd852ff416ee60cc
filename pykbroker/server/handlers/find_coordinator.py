"""FindCoordinator (key 10), v0-6 (batched coordinator_keys from v4).

Behaviour: the coordinator of a group is the leader of its __consumer_offsets partition
(``abs(hash(group)) % partitions``), as in Kafka; the endpoint given is that broker's on the listener the
request arrived on, as Kafka answers. Asking creates __consumer_offsets if it does not exist yet (as Kafka
does): on a single broker the answer waits until its partitions are hosted (one at a time, so other clients
are served meanwhile); in a cluster the creation is written to ZooKeeper and the answer is
COORDINATOR_NOT_AVAILABLE until the partition has a leader (the client retries), as it is for a leader that
has no endpoint on this listener. An empty group id: INVALID_REQUEST; an unknown key type:
INVALID_REQUEST. Success carries error_message "NONE" before v4 and "" from v4, as Kafka 3.7 answers.

Transactions are not implemented, so a transaction coordinator (key_type 1) is refused with
TRANSACTIONAL_ID_AUTHORIZATION_FAILED and a message saying why: Kafka's own answer to a transactional id
the client may not use, and one every client treats as fatal at once (librdkafka, kafka-python and the
Java client fail ``init_transactions()`` within milliseconds). COORDINATOR_NOT_AVAILABLE, the retriable
answer, made them retry for their whole timeout (10-60 s). InitProducerId refuses transactional ids the
same way (cluster/producer_ids.py).
"""

from __future__ import annotations

from pykbroker.groups.offset_store import OFFSETS_TOPIC, partition_for_group
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
    info = ctx.broker.metadata.topic(OFFSETS_TOPIC)
    if info is None:
        return ErrorCode.coordinator_not_available, None, None
    leader = info.partitions[partition_for_group(key, len(info.partitions))].leader
    found = [b for b in ctx.broker.brokers_on(ctx.listener) if b.broker_id == leader]
    if not found:  # no leader yet, or the leader is not reachable through this listener
        return ErrorCode.coordinator_not_available, None, None
    return ErrorCode.none, None, found[0]


def _asks_for_groups(request, version: int) -> bool:
    if getattr(request, "key_type", GROUP_KEY) != GROUP_KEY:
        return False
    keys = request.coordinator_keys if version >= 4 else (request.key,)
    return any(keys)


@handles(10)
def find_coordinator(ctx: RequestContext, request) -> object:
    if ctx.broker.metadata.topic(OFFSETS_TOPIC) is None and _asks_for_groups(request, ctx.version):
        return _after_offsets_topic(ctx, request)
    return _answer(ctx, request)


async def _after_offsets_topic(ctx: RequestContext, request) -> object:
    await ctx.broker.create_offsets_topic()
    return _answer(ctx, request)


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

"""FindCoordinator (key 10), v0-6 (batched coordinator_keys from v4).

Behaviour: the coordinator of a group is the leader of its __consumer_offsets partition
(``abs(hash(group)) % partitions``), as in Kafka; the endpoint given is that broker's on the listener the
request arrived on, as Kafka answers. Asking creates __consumer_offsets if it does not exist yet (as Kafka
does): on a single broker the answer waits until its partitions are hosted (one at a time, so other clients
are served meanwhile); in a cluster the creation is written to ZooKeeper and the answer is
COORDINATOR_NOT_AVAILABLE until the partition has a leader (the client retries), as it is for a leader that
has no endpoint on this listener. When the creation itself fails - Kafka's rule: the topic needs as many live
brokers as offsets.topic.replication.factor (3 by default), kept here - the answer stays
COORDINATOR_NOT_AVAILABLE, its error_message (v1+; per key from v4) naming the cause, e.g. "the offsets
topic __consumer_offsets cannot be created yet: 2 live brokers, offsets.topic.replication.factor=3 (start
the missing brokers, or lower offsets.topic.replication.factor)"; the broker logs it at most once a minute
(cluster/topic_admin.py). An empty group id: INVALID_REQUEST (Kafka 3.7.1 answers it as any other key); an
unknown key type: INVALID_REQUEST. Any other error_message is Kafka 3.7.1's (compared with it): v1-3 carry the
error's own text (Errors.message(): "NONE" on success, "The coordinator is not available."), v4 only "" per
key, except an unknown key type, which fails the whole request in Kafka and so carries the text in v4 too.

A transaction coordinator (key_type 1) is found the same way: the leader of the transactional id's
__transaction_state partition (same hash, transaction.state.log.num.partitions), the topic being created on
the first such request, as Kafka does.
"""

from __future__ import annotations

from pykbroker.groups.offset_store import OFFSETS_TOPIC, partition_for_group
from pykbroker.txn.log import TRANSACTION_STATE_TOPIC
from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, allowed
from pykbroker.server.handlers._build import make, response_module

GROUP_KEY = 0
TRANSACTION_KEY = 1
_TOPIC_OF = {GROUP_KEY: OFFSETS_TOPIC, TRANSACTION_KEY: TRANSACTION_STATE_TOPIC}
# Kafka's Errors.message() of the errors answered here: the error_message of v1-3.
_KAFKA_MESSAGES = {
    ErrorCode.none: "NONE",
    ErrorCode.coordinator_not_available: "The coordinator is not available.",
    ErrorCode.group_authorization_failed: "Group authorization failed.",
    ErrorCode.transactional_id_authorization_failed: "Transactional Id authorization failed.",
    ErrorCode.invalid_request: "This most likely occurs because of a request being malformed by the client library "
                               "or the message was sent to an incompatible broker. See the broker logs for more details.",
}


def _locate(ctx: RequestContext, key: str, key_type: int) -> tuple[ErrorCode, str | None, object | None]:
    """(error, error message or None for Kafka's generic one, coordinator endpoint or None)."""
    topic = _TOPIC_OF.get(key_type)
    if topic is None:  # Kafka: an InvalidRequestException failing the request, its text in every version
        return ErrorCode.invalid_request, _KAFKA_MESSAGES[ErrorCode.invalid_request], None
    # Kafka's getCoordinator: DESCRIBE on the group / transactional id first
    if key_type == GROUP_KEY and not allowed(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, key):
        return ErrorCode.group_authorization_failed, None, None
    if key_type == TRANSACTION_KEY and not allowed(ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, key):
        return ErrorCode.transactional_id_authorization_failed, None, None
    if not key:
        return ErrorCode.invalid_request, None, None
    info = ctx.broker.metadata.topic(topic)
    if info is None:  # not created (yet): why, when its creation failed (too few live brokers)
        return ErrorCode.coordinator_not_available, ctx.broker.topics.internal_topic_problem(topic), None
    leader = info.partitions[partition_for_group(key, len(info.partitions))].leader
    found = [b for b in ctx.broker.brokers_on(ctx.listener) if b.broker_id == leader]
    if not found:  # no leader yet, or the leader is not reachable through this listener
        return ErrorCode.coordinator_not_available, None, None
    return ErrorCode.none, None, found[0]


def _topic_to_create(ctx: RequestContext, request) -> str | None:
    """The internal topic this request needs and the cache does not show yet (created first, as Kafka does)."""
    topic = _TOPIC_OF.get(getattr(request, "key_type", GROUP_KEY))
    keys = request.coordinator_keys if ctx.version >= 4 else (request.key,)
    if topic is None or not any(keys) or ctx.broker.metadata.topic(topic) is not None:
        return None
    return topic


@handles(10)
def find_coordinator(ctx: RequestContext, request) -> object:
    topic = _topic_to_create(ctx, request)
    if topic is not None:
        return _after_internal_topic(ctx, request, topic)
    return _answer(ctx, request)


async def _after_internal_topic(ctx: RequestContext, request, topic: str) -> object:
    await ctx.broker.create_internal_topic(topic)
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
                    error_message=message or "",
                )
            )
        return make(schema.FindCoordinatorResponse, throttle_time=0, coordinators=tuple(coordinators))
    error, message, node = _locate(ctx, request.key, key_type)
    return make(
        schema.FindCoordinatorResponse,
        throttle_time=0,
        error_code=error,
        error_message=message or _KAFKA_MESSAGES[error],
        node_id=node.broker_id if node else -1,
        host=node.host if node else "",
        port=node.port if node else -1,
    )

"""TxnOffsetCommit (key 28) v0-3: a transactional producer commits a consumer group's offsets as part of its
transaction (``send_offsets_to_transaction``), after AddOffsetsToTxn added the group's __consumer_offsets
partition to the transaction.

Behaviour, as Kafka's KafkaApis.handleTxnOffsetCommitRequest and GroupCoordinator.handleTxnCommitOffsets:
partitions that do not exist get UNKNOWN_TOPIC_OR_PARTITION first; then per partition the group's errors:
INVALID_GROUP_ID (empty group id), NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, and from v3 (which carries
the consumer's member id, generation and group instance id, KIP-447) UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
FENCED_INSTANCE_ID; OFFSET_METADATA_TOO_LARGE for metadata over offset.metadata.max.bytes. The accepted
offsets are appended to the group's partition as one transactional batch of the producer and answered once
replicated (errors of the append as for OffsetCommit, INVALID_PRODUCER_EPOCH / PRODUCER_FENCED passed
through). They become visible to OffsetFetch only when the transaction commits (its marker in that
partition); an abort drops them. See groups/coordinator.py and groups/offset_store.py.
"""

from __future__ import annotations

import asyncio
import logging

from pykbroker.groups.offset_store import OFFSETS_TOPIC, coordinator_error
from pykbroker.log.producer_state import SENTINEL
from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers.committed_offsets import answer_commit

log = logging.getLogger(__name__)

NO_GENERATION = -1
NO_MEMBER_ID = ""


_COMMIT_ERRORS = frozenset({
    ErrorCode.unknown_topic_or_partition, ErrorCode.not_enough_replicas, ErrorCode.not_enough_replicas_after_append,
    ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error, ErrorCode.message_too_large,
    ErrorCode.record_list_too_large, ErrorCode.invalid_fetch_size,
})


def _verification_error(error: ErrorCode) -> ErrorCode:
    """Kafka's GroupMetadataManager.maybeConvertOffsetCommitError for a failed verification."""
    if error == ErrorCode.network_exception:
        return ErrorCode.coordinator_load_in_progress
    return coordinator_error(error, offsets=True) if error in _COMMIT_ERRORS else error


def _verification_needed(ctx: RequestContext, request):
    """The producer state of the group's __consumer_offsets partition led here, and the guard, when the
    commit must be verified; None otherwise (verification off, no producer, partition not led here: the
    group coordinator answers NOT_COORDINATOR, or a transaction already open there)."""
    broker = ctx.broker
    if broker.txn_verifier is None or request.producer_id < 0 or not request.group_id or not request.transactional_id:
        return None
    partition = broker.replicas.partition(OFFSETS_TOPIC, broker.offset_store.partition_for(request.group_id))
    if partition is None or not partition.is_leader:
        return None
    state = partition.producer_state
    guard = state.maybe_start_verification(request.producer_id, -1, request.producer_epoch)
    return None if guard is SENTINEL else (partition, state, guard)


@handles(28)
def txn_offset_commit(ctx: RequestContext, request) -> object:
    def commit(respond, offsets, verification=None) -> None:
        ctx.broker.groups.commit_transactional_offsets(
            request.group_id, request.producer_id, request.producer_epoch,
            getattr(request, "generation_id", NO_GENERATION), getattr(request, "member_id", NO_MEMBER_ID),
            offsets, respond, group_instance_id=getattr(request, "group_instance_id", None),
            verification=verification)

    async def verify_then_commit(respond, offsets, partition, state, guard) -> None:
        tp = (OFFSETS_TOPIC, partition.index)
        try:
            errors = await ctx.broker.txn_verifier.verify(request.transactional_id, request.producer_id,
                                                          request.producer_epoch, [tp])
        except Exception:  # never leave the request unanswered
            log.exception("verifying the transaction of %s failed", request.transactional_id)
            errors = {}
        error = errors.get(tp, ErrorCode.unknown_server_error)
        if error == ErrorCode.none:
            def answered(results) -> None:
                # Appended: the entry is gone already; refused by the group or the append: drop it.
                state.release_verification(request.producer_id, guard)
                respond(results)

            commit(answered, offsets, guard)  # the append checks the guard, as a produce's (Kafka's appendForGroup)
            return
        # A failed verification keeps the entry (shared with the producer's other requests; expiry drops it).
        error = _verification_error(error)
        metadata = ctx.broker.metadata
        respond({(name, index):
                 error if (info := metadata.topic(name)) is not None and 0 <= index < len(info.partitions)
                 else ErrorCode.unknown_topic_or_partition
                 for name, index in offsets})

    def start(respond, offsets) -> None:
        # Called once authorized (answer_commit: WRITE on the transactional id, READ on the group and topics,
        # as KafkaApis before the coordinator): only then is a verification entry made.
        verification = _verification_needed(ctx, request)
        if verification is None:
            commit(respond, offsets)
        else:
            asyncio.ensure_future(verify_then_commit(respond, offsets, *verification))

    return answer_commit(ctx, request, "TxnOffsetCommit", start, request.transactional_id)

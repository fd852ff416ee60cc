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

from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers.committed_offsets import answer_commit, requested_offsets

NO_GENERATION = -1
NO_MEMBER_ID = ""


@handles(28)
def txn_offset_commit(ctx: RequestContext, request) -> object:
    return answer_commit(ctx, request, "TxnOffsetCommit", lambda respond: ctx.broker.groups.commit_transactional_offsets(
        request.group_id, request.producer_id, request.producer_epoch, getattr(request, "generation_id", NO_GENERATION),
        getattr(request, "member_id", NO_MEMBER_ID), requested_offsets(request.topics), respond,
        group_instance_id=getattr(request, "group_instance_id", None)))

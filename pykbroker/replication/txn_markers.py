"""Writing transaction markers as partition leader: the broker side of WriteTxnMarkers (Kafka's
KafkaApis.handleWriteTxnMarkersRequest).

The transaction coordinator asks each partition leader to end a producer's transaction in the partitions it
wrote to: for each marker (producer id, producer epoch, COMMIT or ABORT, coordinator epoch) and each of its
partitions, the leader appends a control batch (replication/partition.py ``append_marker``) with acks=all
semantics: the answer for the partition comes once the ISR has the marker (min.insync.replicas applies), or
with the error. Errors per partition: UNKNOWN_TOPIC_OR_PARTITION (not in the metadata),
NOT_LEADER_OR_FOLLOWER (not led here), INVALID_PRODUCER_EPOCH (the marker's producer epoch is older than the
producer's), TRANSACTION_COORDINATOR_FENCED (its coordinator epoch is older than the last one seen for the
producer), NOT_ENOUGH_REPLICAS(_AFTER_APPEND), REQUEST_TIMED_OUT, KAFKA_STORAGE_ERROR.

Once a marker is replicated in a ``__consumer_offsets`` partition, the group coordinator applies (commit) or
drops (abort) the producer's pending transactional offsets there: ``broker.groups.on_transaction_marker``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pykbroker.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
MARKER_TIMEOUT_MS = 30_000  # Kafka appends markers with request.timeout.ms (30 s by default) as the wait


@dataclass
class MarkerResult:
    """The answer for one marker: per topic, (partition index, error) in request order."""

    producer_id: int
    topics: list[tuple[str, list[tuple[int, ErrorCode]]]] = field(default_factory=list)


async def write_markers(broker, markers) -> list[MarkerResult]:
    """Append each marker to each of its partitions as leader; one MarkerResult per marker, in order.

    ``markers``: objects shaped like WriteTxnMarkers' WritableTxnMarker (producer_id, producer_epoch,
    transaction_result (True = COMMIT), coordinator_epoch, topics of (name, partition_indexes)).
    """
    replicas = broker.replicas
    results: list[MarkerResult] = []
    waits = []  # (topic, index, last offset, min ISR) of appends awaiting the ISR
    slots = []  # where each wait's answer goes: (result list, position, marker, topic)
    applied = []  # (marker, partition index, result list, position) of __consumer_offsets markers
    for marker in markers:
        result = MarkerResult(marker.producer_id)
        results.append(result)
        commit = bool(marker.transaction_result)
        for topic in marker.topics:
            name = topic.name
            answers: list[tuple[int, ErrorCode]] = []
            result.topics.append((name, answers))
            info = broker.metadata.topic(name)
            min_isr = broker.topics.min_insync_replicas(name) if info is not None else 1
            for index in topic.partition_indexes:
                if info is None or not 0 <= index < len(info.partitions):
                    answers.append((index, ErrorCode.unknown_topic_or_partition))
                    continue
                outcome = replicas.append_marker(
                    name, index, producer_id=marker.producer_id, producer_epoch=marker.producer_epoch,
                    commit=commit, coordinator_epoch=marker.coordinator_epoch, min_insync_replicas=min_isr,
                )
                error = outcome.error
                if error == ErrorCode.unknown_topic_or_partition:  # in the metadata but not hosted here
                    error = ErrorCode.not_leader_or_follower
                if error != ErrorCode.none:
                    log.debug("%s-%d: marker of producer %d refused: %s", name, index, marker.producer_id,
                              outcome.message or error.name)
                answers.append((index, error))
                if error == ErrorCode.none:
                    if replicas.needs_replication_wait(name, index, outcome, min_isr):
                        waits.append((name, index, outcome.last_offset, min_isr))
                        slots.append((answers, len(answers) - 1))
                    if name == OFFSETS_TOPIC:
                        applied.append((marker.producer_id, commit, index, answers, len(answers) - 1))
    if waits:
        operation = replicas.delay_produce(waits, MARKER_TIMEOUT_MS)
        errors = await replicas.purgatory.wait(operation)
        for (answers, position), error in zip(slots, errors):
            if error != ErrorCode.none:
                answers[position] = (answers[position][0], error)
    on_marker = getattr(getattr(broker, "groups", None), "on_transaction_marker", None)
    if on_marker is not None:
        for producer_id, commit, index, answers, position in applied:
            if answers[position][1] == ErrorCode.none:
                on_marker(index, producer_id, commit)
    return results

"""Produce (key 0), v3-11.

Behaviour: each partition's records field (one or more record-batch v2) is validated (framing, CRC32C,
max.message.bytes, then every record against its batch header as Kafka's LogValidator does: see
pykbroker.protocol.records), checked against the idempotent producer's sequence rules, and appended with
offsets assigned in place. A retried idempotent batch gets its original base offset and appends nothing.
Errors are per partition, and a partition with an error appends nothing: UNKNOWN_TOPIC_OR_PARTITION
(Produce never auto-creates), CORRUPT_MESSAGE (bad framing or CRC), INVALID_RECORD (more than one batch
for a partition, which Produce v3+ forbids as Kafka's ProduceRequest.validateRecords does; records that
disagree with their header, malformed records, an unknown codec, a compressed batch that does not decompress or
inflates past the bound, control batches; CORRUPT_MESSAGE below v8, which predates it), INVALID_TIMESTAMP
with record_errors naming each refused record (v8+) and Kafka's summary as error_message,
MESSAGE_TOO_LARGE, OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH, NOT_ENOUGH_REPLICAS (acks=all
with fewer in-sync replicas than min.insync.replicas), INVALID_TOPIC_EXCEPTION for internal topics,
INVALID_REQUIRED_ACKS for acks outside -1/0/1. acks=0 gets no response at all, as the protocol says; if
any of its partitions has an error, the connection is closed instead (CloseConnection), as Kafka does.
acks=all with followers waits until the HWM passes the batch (replication/purgatory.py): then NONE,
NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR shrank below min.insync.replicas meanwhile, REQUEST_TIMED_OUT
after the request's timeout; NOT_LEADER_OR_FOLLOWER from a broker that does not lead the partition.
Transactions (KIP-98): transactional batches need the request's transactional_id, else the whole request
gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED (Kafka's KafkaApis.handleProduceRequest); a transactional batch
starts or continues its producer's transaction in the partition, and a non-transactional batch from a
producer whose transaction there is open gets INVALID_TXN_STATE (replication/partition.py, Kafka's
ProducerAppendInfo). Partition verification (KIP-890 part 1, ``transaction.partition.verification.enable``,
Kafka 3.7.1's ReplicaManager.handleProduceAppend): a producer's first transactional batch in a partition
(no transaction of it open there) is verified with the transactional id's coordinator before anything of
the request is appended (pykbroker/txn/verification.py; the request waits on the loop, other clients go on,
the connection's answers stay in order); a partition the coordinator does not have in the transaction gets
INVALID_TXN_STATE, a fenced epoch INVALID_PRODUCER_EPOCH, a coordinator that cannot answer just now
NOT_ENOUGH_REPLICAS (retriable, NETWORK_EXCEPTION included); transactional batches of more than one producer id in one request:
INVALID_PRODUCER_ID_MAPPING for every partition.
Client quotas: producer_byte_rate (the request's size) and request_percentage are recorded once the answer is
ready (server/throttling.py), which puts the throttle in throttle_time_ms; acks=0 is not request-metered but its
connection is muted for a byte-rate throttle all the same.
"""

from __future__ import annotations

import dataclasses
import inspect

from pykbroker.log.producer_state import NO_VERIFICATION, SENTINEL
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.records import TRANSACTIONAL_MASK, more_than_one_batch, read_header
from pykbroker.txn.verification import produce_error
from pykbroker.replication.replica_manager import AppendOutcome
from pykbroker.server.dispatch import NO_RESPONSE, CloseConnection, RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, allowed, allowed_names, enabled
from pykbroker.server.handlers._build import make, response_module


def _outcome_for_request(ctx: RequestContext, request) -> ErrorCode | None:
    if request.acks not in (-1, 0, 1):
        return ErrorCode.invalid_required_acks
    if _has_transactional_records(request) and (
            request.transactional_id is None
            or not allowed(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id)):
        return ErrorCode.transactional_id_authorization_failed
    return None


_ATTRIBUTES_LOW_BYTE = 22  # a batch's int16 attributes sit at bytes 21-22; the transactional bit is in the low byte


def _is_transactional(records) -> bool:
    return records is not None and len(records) > _ATTRIBUTES_LOW_BYTE and records[_ATTRIBUTES_LOW_BYTE] & TRANSACTIONAL_MASK


def _has_transactional_records(request) -> bool:
    """Kafka's ProduceRequest.hasTransactionalRecords, on each partition's first batch (v3+ allows one)."""
    for topic_data in request.topic_data:
        for partition_data in topic_data.partition_data:
            if _is_transactional(partition_data.records):
                return True
    return False


def _start_verification(ctx: RequestContext, request, guards: dict,
                        permitted: set[str] | None) -> tuple[ErrorCode | None, list, int, int]:
    """Kafka's handleProduceAppend up to the verification: the guard of each transactional partition led
    here (``guards``) of a topic the principal may WRITE (``permitted``; None: every topic), the partitions
    still to verify, the producer (id, epoch of its first batch); INVALID_PRODUCER_ID_MAPPING when the
    transactional batches come from more than one producer id, checked before any guard is made (nothing
    to release)."""
    replicas = ctx.broker.replicas
    producer_id = producer_epoch = -1
    transactional = []
    for topic_data in request.topic_data:
        if permitted is not None and topic_data.name not in permitted:
            continue  # answered TOPIC_AUTHORIZATION_FAILED by _append, never verified
        for partition_data in topic_data.partition_data:
            records = partition_data.records
            if not _is_transactional(records):
                continue
            try:
                header = read_header(records)
            except Exception:  # framing errors are the append's to answer
                continue
            if producer_id == -1:
                producer_id, producer_epoch = header.producer_id, header.producer_epoch
            elif header.producer_id != producer_id:
                return ErrorCode.invalid_producer_id_mapping, [], -1, -1
            transactional.append((topic_data.name, partition_data.index, header))
    to_verify = []
    for name, index, header in transactional:
        partition = replicas.partition(name, index)
        if partition is None or not partition.is_leader:
            continue
        guard = partition.producer_state.maybe_start_verification(
            header.producer_id, header.base_sequence, header.producer_epoch)
        guards[(name, index)] = guard
        if guard is not SENTINEL:
            to_verify.append((name, index))
    return None, to_verify, producer_id, producer_epoch


def _for_version(error: ErrorCode, version: int) -> ErrorCode:
    """INVALID_RECORD came with Produce v8 (KIP-467); older clients get CORRUPT_MESSAGE for it."""
    if error == ErrorCode.invalid_record and version < 8:
        return ErrorCode.corrupt_message
    return error


def _record_errors(schema, errors: tuple[tuple[int, str], ...]) -> tuple:
    """Per-record errors as v8+ responses carry them; older versions have no such field."""
    if not errors or not hasattr(schema, "BatchIndexAndErrorMessage"):
        return ()
    return tuple(
        make(schema.BatchIndexAndErrorMessage, batch_index=index, batch_index_error_message=text) for index, text in errors
    )


def _response(schema, version: int, topics: list[tuple[str, list[tuple[int, AppendOutcome]]]]) -> object:
    responses = []
    for name, outcomes in topics:
        partitions = []
        for index, outcome in outcomes:
            partitions.append(
                make(
                    schema.PartitionProduceResponse,
                    index=index,
                    error_code=_for_version(outcome.error, version),
                    base_offset=outcome.base_offset,
                    log_append_time=outcome.log_append_time_ms,
                    log_start_offset=outcome.log_start_offset,
                    record_errors=_record_errors(schema, outcome.record_errors),
                    error_message=outcome.message,
                )
            )
        responses.append(make(schema.TopicProduceResponse, name=name, partition_responses=tuple(partitions)))
    return make(schema.ProduceResponse, responses=tuple(responses), throttle_time=0)


@handles(0)
def produce(ctx: RequestContext, request) -> object:
    # Authorization first (KafkaApis.handleProduceRequest): only the topics the principal may WRITE are verified
    request_error = _outcome_for_request(ctx, request)
    permitted = (allowed_names(ctx, AclOperation.WRITE, ResourceType.TOPIC, (t.name for t in request.topic_data))
                 if request_error is None and enabled(ctx) else None)
    verifier = ctx.broker.txn_verifier
    if request_error is None and request.transactional_id is not None and verifier is not None:
        guards: dict = {}
        request_error, to_verify, producer_id, producer_epoch = _start_verification(ctx, request, guards, permitted)
        if to_verify and request_error is None:
            return _verify_then_append(ctx, request, verifier, guards, to_verify, producer_id, producer_epoch,
                                       permitted)
        return _append(ctx, request, request_error, guards, {}, permitted)
    return _append(ctx, request, request_error, None, None, permitted)


async def _verify_then_append(ctx: RequestContext, request, verifier, guards: dict, to_verify: list,
                              producer_id: int, producer_epoch: int, permitted: set[str] | None) -> object:
    errors = await verifier.verify(request.transactional_id, producer_id, producer_epoch, to_verify)
    # A failed verification keeps its entry: other requests of the producer may share it (expiry drops it).
    failed = {key: produce_error(error) for key, error in errors.items() if error != ErrorCode.none}
    result = _append(ctx, request, None, guards, failed, permitted)
    # The leader's appends are done: a verified entry still there was not used (the append was refused).
    for key in to_verify:
        if key not in failed:
            partition = ctx.broker.replicas.partition(*key)
            if partition is not None:
                partition.producer_state.release_verification(producer_id, guards[key])
    return await result if inspect.isawaitable(result) else result


def _append(ctx: RequestContext, request, request_error: ErrorCode | None, guards: dict | None,
            failed: dict | None, permitted: set[str] | None) -> object:
    """Append every partition (``guards``: the verification guard of each transactional partition;
    ``failed``: the partitions whose verification failed, (error, message); ``permitted``: the topics the
    principal may WRITE, None: every one) and answer, or wait for acks=all."""
    broker = ctx.broker
    replicas = broker.replicas
    stats = broker.stats  # messages and bytes in per topic for /metrics (None: metrics off)
    schema = response_module(ctx)
    version = ctx.version
    acks_all = request.acks == -1
    waits = None  # (topic, index, last offset, min.insync.replicas, where the outcome is) of appends awaiting the ISR
    topics = []
    for topic_data in request.topic_data:
        name = topic_data.name
        info = broker.metadata.topic(name)
        min_isr = broker.topics.min_insync_replicas(name) if info is not None else 1
        outcomes = []
        for partition_data in topic_data.partition_data:
            if request_error is not None:
                outcome = AppendOutcome(request_error)
            elif permitted is not None and name not in permitted:
                outcome = AppendOutcome(ErrorCode.topic_authorization_failed)
            elif info is None:
                outcome = AppendOutcome(ErrorCode.unknown_topic_or_partition)
            elif info.internal:
                outcome = AppendOutcome(ErrorCode.invalid_topic_exception, message=f"Cannot append to internal topic {name}")
            elif partition_data.records is None:
                outcome = AppendOutcome(ErrorCode.corrupt_message, message="null records")
            elif more_than_one_batch(partition_data.records):
                outcome = AppendOutcome(
                    ErrorCode.invalid_record,
                    message=f"Produce requests with version {version} are only allowed to contain exactly one "
                    "record batch per partition",
                )
            elif failed and (name, partition_data.index) in failed:
                error, message = failed[(name, partition_data.index)]
                outcome = AppendOutcome(error, message=message)
            else:
                outcome = replicas.append(
                    name, partition_data.index, partition_data.records, acks=request.acks, min_insync_replicas=min_isr,
                    verification=NO_VERIFICATION if guards is None else guards.get((name, partition_data.index), NO_VERIFICATION),
                )
                if stats is not None and outcome.error == ErrorCode.none:
                    stats.produced(name, outcome.last_offset - outcome.base_offset + 1, len(partition_data.records))
                if acks_all and outcome.has_followers and replicas.needs_replication_wait(
                    name, partition_data.index, outcome, min_isr
                ):
                    if waits is None:
                        waits = []
                    waits.append((name, partition_data.index, outcome.last_offset, min_isr, outcomes, len(outcomes)))
            outcomes.append((partition_data.index, outcome))
        topics.append((name, outcomes))
    if request.acks == 0:
        # Kafka (KafkaApis.handleProduceRequest) closes the connection when an acks=0 request has any
        # partition error: the producer reads no answer, but notices the close and refreshes its metadata.
        failures = [f"{name}-{index}: {outcome.error.name}" for name, outcomes in topics for index, outcome in outcomes
                    if outcome.error != ErrorCode.none]
        if failures:
            return CloseConnection("acks=0 produce failed for " + ", ".join(failures))
        return NO_RESPONSE
    if waits is not None:
        timeout_ms = int(request.timeout.total_seconds() * 1000)
        operation = replicas.delay_produce([w[:4] for w in waits], timeout_ms)
        ctx.appended = True  # every record is in the log: the connection may take the next Produce meanwhile
        return _after_replication(replicas, operation, schema, version, topics, waits)
    return _response(schema, version, topics)


async def _after_replication(replicas, operation, schema, version: int, topics, waits) -> object:
    """acks=all: answer once the ISR has the records (or the error the wait ended with)."""
    errors = await replicas.purgatory.wait(operation)
    for (_, _, _, _, outcomes, position), error in zip(waits, errors):
        if error != ErrorCode.none:
            index, outcome = outcomes[position]
            outcomes[position] = (index, dataclasses.replace(outcome, error=error))
    return _response(schema, version, topics)

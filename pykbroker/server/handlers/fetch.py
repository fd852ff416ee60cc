"""Fetch (key 1), v4-16.

Behaviour: for each partition, whole record batches from the one containing fetch_offset, never past
the high-water mark for consumers (followers, replica_id >= 0, read to the log end). Limits: the
request's max_bytes across partitions and partition_max_bytes per partition, except that the first
batch found is returned whole even if larger (KIP-74), so a consumer never stalls on a big batch. Long
polls: with fewer than min_bytes available, the request parks until the HWM of one of its partitions moves
(a follower's: until the log end moves) or max_wait_ms, then answers with what there is. Followers: a
fetch from a replica id that is not an assigned replica of the partition gets UNKNOWN_LEADER_EPOCH when it
names a current leader epoch and NOT_LEADER_OR_FOLLOWER when it does not (Kafka's
Partition.followerReplicaOrThrow); an assigned follower's fetch offset is its log end offset for the HWM
and the ISR (replication/partition.py). Record data is not read here: the response carries
FileRecords, read from the segment files as the connection sends them. v13+ names topics by id (UNKNOWN_TOPIC_ID when unknown).
Fetch sessions (KIP-227): we never create one and answer session id 0, which tells clients to send full
fetches; closing a session (epoch -1) is answered with an empty response, an unknown session id with
FETCH_SESSION_ID_NOT_FOUND. Errors per partition: OFFSET_OUT_OF_RANGE outside [log start, log end],
FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH for a stale or future current_leader_epoch (checked again, with
leadership, each time a long poll wakes, as Kafka's DelayedFetch does). v12+: a fetch whose
last_fetched_epoch ended below its fetch offset on this leader gets diverging_epoch (KIP-595's truncation on
fetch; followers truncate to it, see replication/fetcher.py).
Transactions: isolation_level 1 (read_committed) reads up to the last stable offset, never past it, and gets
aborted_transactions (producer id, first offset) of the aborted transactions overlapping what it read, from
the transaction indexes (an empty list when there are none; null for read_uncommitted, as Kafka answers);
every fetch answers the partition's last stable offset.
Client quotas (server/throttling.py, KafkaApis.handleFetchRequest): a consumer's max_bytes is capped at what its
consumer_byte_rate allows in a quota window (min_bytes with it); a fetch whose answer would go over its fetch or
request quota is answered empty (no partitions, session id 0, NONE) with the throttle time, its bytes not
counted; followers' fetches are exempt. A read_committed long poll parked for data wakes
when the HWM moves (which is when the LSO can move: a marker is stable once the HWM passes it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pykbroker.log.errors import OffsetOutOfRange
from pykbroker.log.partition_log import ReadResult
from pykbroker.protocol.errors import ErrorCode
from pykbroker.replication.replica_manager import FileRecords, Partition
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import (
    AclOperation, ResourceType, allowed_names, cluster_allowed, enabled,
)
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers._epochs import NO_EPOCH, leader_partition
from pykbroker.server.throttling import consumer_fetch_max_bytes, fetch_exempt, fetch_throttle, throttled

FINAL_EPOCH = -1  # session_epoch -1 closes a fetch session
NO_SESSION = 0
READ_COMMITTED = 1


@dataclass(slots=True)
class _Wanted:
    topic_key: object  # name (<= v12) or topic id (v13+), echoed back
    index: int
    partition: Partition | None
    error: ErrorCode
    offset: int
    max_bytes: int
    current_leader_epoch: int
    log_start_offset: int  # a follower's (-1 from consumers)
    last_fetched_epoch: int  # v12+: the epoch of the fetcher's last batch (-1: not given)


def _resolve(ctx: RequestContext, request, replica_id: int) -> list[list[_Wanted]]:
    """Each partition's leader replica here, or its error. Authorization as Kafka's handleFetchRequest: a
    follower needs CLUSTER_ACTION on the cluster, a consumer READ on each topic (TOPIC_AUTHORIZATION_FAILED;
    an unknown topic id answers UNKNOWN_TOPIC_ID first, an unknown name only once READ is allowed)."""
    broker = ctx.broker
    by_id = ctx.version >= 13
    resolved = []
    for topic in request.topics:
        if by_id:
            info = broker.metadata.topic_by_id(topic.topic_id)
            resolved.append((topic, info, topic.topic_id, ErrorCode.unknown_topic_id, info.name if info else None))
        else:
            info = broker.metadata.topic(topic.topic)
            resolved.append((topic, info, topic.topic, ErrorCode.unknown_topic_or_partition, topic.topic))
    if not enabled(ctx):  # (the hot path without an authorizer asks nothing)
        denied = frozenset()
    elif replica_id >= 0:
        denied = set() if cluster_allowed(ctx, AclOperation.CLUSTER_ACTION) else {name for *_, name in resolved}
    else:
        names = [name for *_, name in resolved if name is not None]
        denied = set(names) - allowed_names(ctx, AclOperation.READ, ResourceType.TOPIC, names)
    topics = []
    for topic, info, key, missing, name in resolved:
        wanted = []
        for p in topic.partitions:
            epoch = getattr(p, "current_leader_epoch", NO_EPOCH)
            if name is not None and name in denied:
                partition, error = None, ErrorCode.topic_authorization_failed
            elif info is None:
                partition, error = None, missing
            else:
                partition, error = leader_partition(broker.replicas, info.name, p.partition, epoch)
            wanted.append(_Wanted(
                key, p.partition, partition, error, p.fetch_offset, p.partition_max_bytes, epoch,
                getattr(p, "log_start_offset", -1), getattr(p, "last_fetched_epoch", NO_EPOCH),
            ))
        topics.append(wanted)
    return topics


def _read_all(ctx: RequestContext, topics: list[list[_Wanted]], max_bytes: int, replica_id: int, *,
              recheck: bool = False):
    """One pass over every partition; returns (per-partition results, bytes read, answer now).

    A follower's read (replica_id >= 0) goes to the log end and tells the partition how far that replica
    has come (which may move the HWM and the ISR); a replica that is not assigned gets Kafka's error. A
    fetch naming its last fetched epoch whose log diverged from ours gets the diverging epoch and no
    records (and, from a follower, does not count as progress), as Kafka's Partition.fetchRecords. An error
    or a diverging epoch answers at once (no long poll).

    ``recheck`` (a long poll's later passes): the partition's leader epoch and leadership are checked again,
    as Kafka's DelayedFetch does before it completes: a fetch accepted in one leader epoch never returns
    records written in a later one (a consumer would take their epoch for its position's while its
    OffsetForLeaderEpoch, sent with the older epoch, answers where that older epoch ended: a false "log
    truncation detected").
    """
    replicas = ctx.broker.replicas
    is_follower = replica_id >= 0
    read_committed = not is_follower and getattr(ctx.request.body, "isolation_level", 0) == READ_COMMITTED
    now = replicas.clock() if is_follower else 0
    quota = replicas.leader_quota if is_follower else None
    throttled_bytes = 0
    remaining = max_bytes
    total = 0
    answer_now = False
    results = []
    for wanted_topic in topics:
        topic_results = []
        for wanted in wanted_topic:
            records = b""
            diverging = None
            aborted = ()
            error = wanted.error
            partition = wanted.partition
            if error == ErrorCode.none and partition is not None and replicas.partition(partition.topic, partition.index) is not partition:
                error = ErrorCode.unknown_topic_or_partition  # deleted while a long poll waited on it
            if recheck and error == ErrorCode.none and partition is not None:
                error = leader_partition(replicas, partition.topic, partition.index, wanted.current_leader_epoch)[1]
            if is_follower and error == ErrorCode.none and partition is not None:
                error = partition.follower_fetch_error(replica_id, wanted.current_leader_epoch)
            if error == ErrorCode.none and partition is not None:
                try:
                    if wanted.last_fetched_epoch >= 0:
                        diverging = partition.diverging_epoch(wanted.offset, wanted.last_fetched_epoch)
                    if diverging is None:
                        read = _read_one(replicas, partition, wanted, min(wanted.max_bytes, remaining),
                                         total == 0, replica_id, now, read_committed)
                        records = FileRecords(read) if read.slices else b""
                        if read_committed and records:
                            # Kafka's collectAbortedTransactions(fetch offset, upper bound of what was read)
                            aborted = partition.log.aborted_ranges(wanted.offset, read.end_offset)
                        if quota is not None and quota.is_throttled(partition.topic, partition.index):
                            # Kafka's shouldLeaderThrottle: a follower outside the ISR gets nothing while the
                            # leader's replication quota is exceeded (its fetch state was still updated).
                            if replica_id not in partition.isr and quota.is_quota_exceeded():
                                records = b""
                            throttled_bytes += len(records)
                except OffsetOutOfRange:
                    error = ErrorCode.offset_out_of_range
            if error != ErrorCode.none or diverging is not None:
                answer_now = True
            total += len(records)
            remaining -= len(records)
            topic_results.append((wanted, error, records, diverging, aborted))
        results.append(topic_results)
    if throttled_bytes:
        quota.record(throttled_bytes)
    return results, total, answer_now


def _read_one(replicas, partition: Partition, wanted: _Wanted, limit: int, min_one: bool, replica_id: int, now: int,
              read_committed: bool = False) -> ReadResult:
    """One partition's read; a follower's read goes to the log end and records its progress."""
    if replica_id >= 0:
        leader_end = partition.log.log_end_offset  # before the read, as Kafka's readRecords
        read = replicas.read(partition, wanted.offset, max(limit, 0), min_one=min_one, up_to_hwm=False)
        partition.update_follower_fetch_state(replica_id, wanted.offset, wanted.log_start_offset, now, leader_end)
        return read
    return replicas.read(partition, wanted.offset, max(limit, 0), min_one=min_one, read_committed=read_committed)


def _count_out(stats, results, replica_id: int) -> None:
    """Record bytes sent, for /metrics: per topic to consumers, in total to followers (as Kafka splits them)."""
    for topic_results in results:
        for wanted, _, records, _, _ in topic_results:
            if records and wanted.partition is not None:
                if replica_id >= 0:
                    stats.replication_bytes_out += len(records)
                else:
                    stats.fetched(wanted.partition.topic, len(records))


def _respond(ctx: RequestContext, schema, results, session_id: int = NO_SESSION, error=ErrorCode.none,
             replica_id: int = -1) -> object:
    response = _response(ctx, schema, results, session_id, error)
    if replica_id >= 0:
        fetch_exempt(ctx)
    else:
        throttle = fetch_throttle(ctx, response)  # client quotas: a throttled consumer gets an empty answer
        if throttle > 0:
            return throttled(ctx, make(schema.FetchResponse, throttle_time=0, error_code=ErrorCode.none,
                                       session_id=NO_SESSION, responses=()), throttle)
    stats = ctx.broker.stats
    if stats is not None:
        _count_out(stats, results, replica_id)
    return response


def _response(ctx: RequestContext, schema, results, session_id: int, error) -> object:
    by_id = ctx.version >= 13
    # Kafka sends an empty aborted-transactions list to read_committed fetchers and null to the others.
    read_committed = getattr(ctx.request.body, "isolation_level", 0) == READ_COMMITTED
    responses = []
    for topic_results in results:
        partitions = []
        for wanted, code, records, diverging, aborted in topic_results:
            partition = wanted.partition
            hwm = partition.high_watermark if partition is not None else -1
            lso = partition.last_stable_offset if partition is not None else -1
            partitions.append(
                make(
                    schema.PartitionData,
                    partition_index=wanted.index,
                    error_code=code,
                    high_watermark=hwm,
                    last_stable_offset=lso,
                    log_start_offset=partition.log.log_start_offset if partition is not None else -1,
                    aborted_transactions=tuple(
                        make(schema.AbortedTransaction, producer_id=txn.producer_id, first_offset=txn.first_offset)
                        for txn in aborted) if read_committed else None,
                    preferred_read_replica=-1,
                    records=records,
                    **({} if diverging is None else {
                        "diverging_epoch": make(schema.EpochEndOffset, epoch=diverging[0], end_offset=diverging[1])}),
                )
            )
        key = topic_results[0][0].topic_key if topic_results else None
        if by_id:
            responses.append(make(schema.FetchableTopicResponse, topic_id=key, partitions=tuple(partitions)))
        else:
            responses.append(make(schema.FetchableTopicResponse, topic=key, partitions=tuple(partitions)))
    return make(
        schema.FetchResponse, throttle_time=0, error_code=error, session_id=session_id, responses=tuple(responses)
    )


@handles(1)
def fetch(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    session_id = getattr(request, "session_id", NO_SESSION)
    session_epoch = getattr(request, "session_epoch", -1)
    if session_id != NO_SESSION:
        if session_epoch == FINAL_EPOCH:
            return _respond(ctx, schema, [])
        return _respond(ctx, schema, [], error=ErrorCode.fetch_session_id_not_found)
    replica_id = getattr(request, "replica_id", -1)
    if replica_id is None or replica_id == -1:
        replica_state = getattr(request, "replica_state", None)
        replica_id = replica_state.replica_id if replica_state is not None else -1
    if replica_id is None or replica_id < 0:
        replica_id = -1
    topics = _resolve(ctx, request, replica_id)
    max_bytes = request.max_bytes if replica_id >= 0 else consumer_fetch_max_bytes(ctx, request.max_bytes)
    min_bytes = min(request.min_bytes, max_bytes)  # Kafka's fetchMinBytes
    results, total, answer_now = _read_all(ctx, topics, max_bytes, replica_id)
    max_wait_ms = int(request.max_wait.total_seconds() * 1000)
    if total >= min_bytes or answer_now or max_wait_ms <= 0 or not topics:
        return _respond(ctx, schema, results, replica_id=replica_id)
    # Watch the partitions now, in the step that read them: an append right after this step must wake us.
    partitions = [w.partition for topic in topics for w in topic if w.partition is not None]
    watch = ctx.broker.replicas.watch(partitions, follower=replica_id >= 0)
    return _long_poll(ctx, schema, request, topics, replica_id, max_wait_ms, partitions, watch, (min_bytes, max_bytes))


async def _long_poll(ctx: RequestContext, schema, request, topics, replica_id: int, max_wait_ms: int,
                     partitions, watch, limits: tuple[int, int]) -> object:
    min_bytes, max_bytes = limits
    deadline = time.monotonic() + max_wait_ms / 1000
    stats = ctx.broker.stats
    if stats is not None:
        stats.fetches_waiting += 1  # the fetch purgatory's size for /metrics
    try:
        while True:
            await watch.wait(deadline - time.monotonic())
            results, total, answer_now = _read_all(ctx, topics, max_bytes, replica_id, recheck=True)
            if total >= min_bytes or answer_now or time.monotonic() >= deadline:
                return _respond(ctx, schema, results, replica_id=replica_id)
            watch = ctx.broker.replicas.watch(partitions, follower=replica_id >= 0)
    finally:
        watch.close()
        if stats is not None:
            stats.fetches_waiting -= 1


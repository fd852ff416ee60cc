"""Committed offsets, kept durably in the internal topic ``__consumer_offsets`` and replayed by the broker
that leads their partition.

The records use Kafka's own coordinator schemas, so Kafka's tools (kafka-console-consumer with the
OffsetsMessageFormatter, kafka-dump-log --offsets-decoder) can read our partitions:

    key    int16 version 1 (0 also read), string group, string topic, int32 partition     OffsetCommitKey
    value  int16 version 3, int64 offset, int32 leader epoch, string metadata,
           int64 commit timestamp                                                          OffsetCommitValue v3
           (version 1, written when an explicit expire timestamp is set: int64 offset, string metadata,
           int64 commit timestamp, int64 expire timestamp; versions 0-4 are read)
    key    int16 version 2, string group                                                  GroupMetadataKey
    value  opaque bytes owned by the group coordinator                                    (GroupMetadataValue)
    key    int16 record type 3-8 or 16, string group, ...     the consumer groups' records (KIP-848)
    value  opaque bytes owned by the consumer group coordinator                          (groups/consumer/records.py)

Strings are int16 length + UTF-8. A record with a null value (tombstone) deletes its key. All records of a
group live in partition ``abs(groupId.hashCode()) % partitions``, so a group's history is totally ordered.

Writes go through the ReplicaManager like any produce, never straight into a log, as Kafka's
GroupMetadataManager does: commits and group metadata are appended with acks=all (the offsets topic's
min.insync.replicas applies) as one batch per request, and memory changes only once the append is
acknowledged; with followers in the ISR that is when the high-water mark passes the batch (the
ReplicaManager's produce purgatory, bounded by offsets.commit.timeout.ms). On a single broker nothing waits:
the answer comes in the same loop step. Tombstones of deletions and expiry are Kafka's cleanupGroupMetadata:
memory first, then the append, not waited on (Kafka appends them with requiredAcks=0). Failed appends are
mapped as GroupMetadataManager maps them (``coordinator_error``).

Memory holds only the partitions this broker leads and has loaded: ``load_partition`` replays one
partition's log (yielding to the loop), ``unload_partition`` forgets it. A per-partition epoch, bumped by
both, keeps a write acknowledged after its partition was unloaded (or reloaded) out of memory.

Transactional offsets (TxnOffsetCommit, KIP-98/447) follow Kafka's GroupMetadataManager and GroupMetadata:
they are appended as one transactional batch (the producer's id and epoch, no sequence) and stay *pending*
for (group, producer id), invisible to OffsetFetch, until the transaction's marker reaches this partition:
COMMIT makes them committed offsets, ABORT drops them (``complete_transaction``). Every committed offset
remembers the base offset of the batch that wrote it (Kafka's CommitRecordMetadataAndOffset): an offset
replaces another only if its batch comes later in the log, so a transactional commit whose marker arrives
after a newer plain commit of the same partition does not undo it. Loading replays the same rules from the
log: transactional batches go to pending per producer id, control batches (markers) commit or drop them,
and whatever is still pending at the end stays pending (its marker will come).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, NamedTuple

from pykbroker.log.producer_state import NO_VERIFICATION
from pykbroker.protocol.control_records import read_marker
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.records import TRANSACTIONAL_MASK, build_batch, read_records

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
DEFAULT_OFFSETS_PARTITIONS = 50  # offsets.topic.num.partitions
DEFAULT_OFFSETS_RETENTION_MS = 7 * 24 * 60 * 60 * 1000  # offsets.retention.minutes = 10080

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY = 1

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")

TopicPartition = tuple[str, int]


DEFAULT_COMMIT_TIMEOUT_MS = 5000  # offsets.commit.timeout.ms
LOAD_BATCHES_PER_STEP = 64  # batches replayed between two yields to the loop while loading a partition

Done = Callable[[ErrorCode], None]


def coordinator_error(error: ErrorCode, *, offsets: bool) -> ErrorCode:
    """What a client is told when an append to __consumer_offsets failed, as Kafka's GroupMetadataManager
    maps it (storeOffsets for ``offsets``, storeGroup otherwise): no ISR or no answer in time means "the
    coordinator is not available" (retry), a moved leader or a failed disk "ask for the coordinator again",
    a batch too large INVALID_COMMIT_OFFSET_SIZE for a commit and UNKNOWN_SERVER_ERROR for group metadata."""
    if error in (ErrorCode.unknown_topic_or_partition, ErrorCode.not_enough_replicas,
                 ErrorCode.not_enough_replicas_after_append, ErrorCode.request_timed_out):
        return ErrorCode.coordinator_not_available
    if error in (ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error):
        return ErrorCode.not_coordinator
    if error in (ErrorCode.message_too_large, ErrorCode.record_list_too_large, ErrorCode.invalid_fetch_size):
        return ErrorCode.invalid_commit_offset_size if offsets else ErrorCode.unknown_server_error
    if error != ErrorCode.none:  # Kafka passes anything else through, with an error in its log
        log.error("unexpected error %s appending to %s", error.name, OFFSETS_TOPIC)
    return error


@dataclass(frozen=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_timestamp_ms: int
    expire_timestamp_ms: int = -1
    # The base offset, in __consumer_offsets, of the batch that wrote this commit (Kafka's appendedBatchOffset);
    # -1 before it is appended. Not part of the value: two commits of the same offset are equal.
    record_offset: int = field(default=-1, compare=False)

    def older_than(self, other: "CommittedOffset") -> bool:
        """Kafka's CommitRecordMetadataAndOffset.olderThan: written earlier in the log."""
        return self.record_offset < other.record_offset


class OffsetKey(NamedTuple):
    group: str
    topic: str
    partition: int


class GroupMetadataKey(NamedTuple):
    group: str


# --------------------------------------------------------------------------------------------------
# Java's String.hashCode and Kafka's partition choice.


def java_string_hash(text: str) -> int:
    """``String.hashCode()``: h = 31*h + c over the UTF-16 code units, in signed 32-bit arithmetic."""
    units = text.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def kafka_abs(n: int) -> int:
    """Kafka's ``Utils.abs``: Math.abs, except that Integer.MIN_VALUE maps to 0 (not to itself)."""
    return 0 if n == -(1 << 31) else abs(n)


def partition_for_group(group_id: str, num_partitions: int) -> int:
    """The ``__consumer_offsets`` partition of a group: ``Utils.abs(groupId.hashCode()) % partitions``."""
    return kafka_abs(java_string_hash(group_id)) % num_partitions


# --------------------------------------------------------------------------------------------------
# Record encoding (Kafka's coordinator schemas).


def encode_string(text: str) -> bytes:
    """A Kafka ``string``: int16 length + UTF-8."""
    data = text.encode()
    if len(data) > 0x7FFF:
        raise ValueError(f"string of {len(data)} bytes does not fit an int16 length")
    return _INT16.pack(len(data)) + data


class RecordReader:
    """Reads the fields of Kafka's coordinator record schemas (big-endian, int16-length strings)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError("truncated coordinator record")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def int16(self) -> int:
        return _INT16.unpack(self._take(2))[0]

    def int32(self) -> int:
        return _INT32.unpack(self._take(4))[0]

    def int64(self) -> int:
        return _INT64.unpack(self._take(8))[0]

    def string(self) -> str:
        length = self.int16()
        if length < 0:
            raise ValueError("null in a non-nullable string field")
        return self._take(length).decode()

    def nullable_string(self) -> str | None:
        length = self.int16()
        return None if length < 0 else self._take(length).decode()

    def bytes_field(self) -> bytes:
        """A Kafka ``bytes``: int32 length + data (a null reads as empty)."""
        length = self.int32()
        return b"" if length < 0 else self._take(length)

    def at_end(self) -> bool:
        return self.pos == len(self.data)

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            byte = self._take(1)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    def compact_string(self) -> str:
        length = self.uvarint() - 1
        if length < 0:
            raise ValueError("null in a non-nullable string field")
        return self._take(length).decode()

    def compact_nullable_string(self) -> str | None:
        length = self.uvarint() - 1
        return None if length < 0 else self._take(length).decode()

    def compact_bytes(self) -> bytes:
        length = self.uvarint() - 1
        return b"" if length < 0 else self._take(length)

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self._take(self.uvarint())


def encode_offset_key(group: str, topic: str, partition: int) -> bytes:
    return _INT16.pack(OFFSET_COMMIT_KEY_VERSION) + encode_string(group) + encode_string(topic) + _INT32.pack(partition)


def encode_group_metadata_key(group: str) -> bytes:
    return _INT16.pack(GROUP_METADATA_KEY_VERSION) + encode_string(group)


def decode_key(data: bytes) -> OffsetKey | GroupMetadataKey | None:
    """The key of a ``__consumer_offsets`` record; None for record types this store does not own."""
    reader = RecordReader(data)
    version = reader.int16()
    if version in (0, 1):
        return OffsetKey(reader.string(), reader.string(), reader.int32())
    if version == GROUP_METADATA_KEY_VERSION:
        return GroupMetadataKey(reader.string())
    return None


def encode_offset_value(committed: CommittedOffset) -> bytes:
    metadata = encode_string(committed.metadata or "")
    if committed.expire_timestamp_ms != -1:
        # Only version 1 has the field; like Kafka, such a commit does not record the leader epoch.
        return (
            _INT16.pack(OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY) + _INT64.pack(committed.offset) + metadata
            + _INT64.pack(committed.commit_timestamp_ms) + _INT64.pack(committed.expire_timestamp_ms)
        )
    return (
        _INT16.pack(OFFSET_COMMIT_VALUE_VERSION) + _INT64.pack(committed.offset) + _INT32.pack(committed.leader_epoch)
        + metadata + _INT64.pack(committed.commit_timestamp_ms)
    )


def decode_offset_value(data: bytes) -> CommittedOffset:
    reader = RecordReader(data)
    version = reader.int16()
    offset = reader.int64()
    leader_epoch, expire = -1, -1
    if version in (0, 1, 2):
        metadata = reader.string()
        commit_timestamp = reader.int64()
        if version == 1:
            expire = reader.int64()
    elif version == 3:
        leader_epoch = reader.int32()
        metadata = reader.string()
        commit_timestamp = reader.int64()
    elif version == 4:  # the first flexible version: compact string and trailing tagged fields
        leader_epoch = reader.int32()
        metadata = reader.compact_string()
        commit_timestamp = reader.int64()
        reader.skip_tagged_fields()
    else:
        raise ValueError(f"unknown OffsetCommitValue version {version}")
    return CommittedOffset(offset, leader_epoch, metadata, commit_timestamp, expire)


# --------------------------------------------------------------------------------------------------


def _now_ms() -> int:
    return int(time.time() * 1000)


class OffsetStore:
    """The committed offsets (and opaque group metadata) of the groups whose ``__consumer_offsets``
    partition this broker leads and has loaded.

    ``replicas`` is the broker's ReplicaManager (``append``, ``needs_replication_wait``, ``delay_produce``,
    ``purgatory``, ``partition``); ``min_insync_replicas()`` the offsets topic's min.insync.replicas;
    ``commit_timeout_ms`` bounds the wait for followers (offsets.commit.timeout.ms).
    """

    def __init__(
        self,
        replicas,
        num_partitions: int = DEFAULT_OFFSETS_PARTITIONS,
        *,
        min_insync_replicas: Callable[[], int] = lambda: 1,
        commit_timeout_ms: int = DEFAULT_COMMIT_TIMEOUT_MS,
    ) -> None:
        if num_partitions < 1:
            raise ValueError("the offsets topic needs at least one partition")
        self._replicas = replicas
        self.num_partitions = num_partitions
        self._min_insync_replicas = min_insync_replicas
        self._commit_timeout_ms = commit_timeout_ms
        self._offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        # Transactional offsets waiting for their marker: producer id -> group -> partition -> offset (Kafka's
        # pendingTransactionalOffsetCommits, indexed by producer as its openGroupsForProducer).
        self._pending: dict[int, dict[str, dict[TopicPartition, CommittedOffset]]] = {}
        # Plain commits appended but not yet acknowledged, per group and partition (Kafka's
        # pendingOffsetCommits): unstable for require_stable, like pending transactional offsets.
        self._inflight: dict[str, Counter[TopicPartition]] = {}
        self._group_metadata: dict[str, bytes] = {}
        # The consumer groups' records (key types 3+) a load found, per partition, until their coordinator
        # takes them (``take_group_records``): group -> key bytes -> value bytes, in log order.
        self._loaded_group_records: dict[int, dict[str, dict[bytes, bytes]]] = {}
        self._epochs = [0] * num_partitions  # bumped by every load and unload of a partition
        self._waiting: set[asyncio.Task] = set()  # appends waiting for the ISR

    def partition_for(self, group_id: str) -> int:
        return partition_for_group(group_id, self.num_partitions)

    def set_partition_count(self, num_partitions: int) -> None:
        """The offsets topic's partition count as the cluster has it (a cluster member learns it from
        ZooKeeper once connected, as Kafka does), before any partition is loaded."""
        if num_partitions < 1:
            raise ValueError("the offsets topic needs at least one partition")
        if any(self._epochs):
            raise RuntimeError("the offsets topic's partition count changes only before any partition is loaded")
        self.num_partitions = num_partitions
        self._epochs = [0] * num_partitions

    # -- loading and unloading (leadership of a partition) -------------------------------------------------

    def load_if_empty(self, partition: int) -> bool:
        """Load the partition at once if its log is empty (a new offsets topic: nobody needs to wait);
        returns whether it did."""
        hosted = self._replicas.partition(OFFSETS_TOPIC, partition)
        if hosted is None or hosted.log.log_end_offset != hosted.log.log_start_offset:
            return False
        self.unload_partition(partition)  # a new epoch, and nothing in memory
        return True

    async def load_partition(self, partition: int) -> bool:
        """Replay one partition's log, oldest record first, up to its log end (as Kafka's
        doLoadGroupsAndOffsets, which reads until the end it sees at each step: markers appended while
        loading are replayed too), yielding to the loop every few batches. The replayed state replaces that
        partition's groups in memory at the end, and only if nothing unloaded or reloaded the partition
        meanwhile: returns False then (the load was abandoned)."""
        self._epochs[partition] += 1
        epoch = self._epochs[partition]
        replay = _Replay(partition)
        hosted = self._replicas.partition(OFFSETS_TOPIC, partition)
        if hosted is not None:
            next_offset, count, progressed = 0, 0, True
            while progressed:  # until a pass finds nothing appended since the previous one
                progressed = False
                for header, data in hosted.log.batches(next_offset):
                    progressed = True
                    replay.batch(header, data)
                    next_offset = header.next_offset
                    count += 1
                    if count % LOAD_BATCHES_PER_STEP == 0:
                        await asyncio.sleep(0)
                        if self._epochs[partition] != epoch:
                            return False
        if self._epochs[partition] != epoch:
            return False
        self._forget_partition(partition)
        self._offsets.update(replay.offsets)
        self._group_metadata.update(replay.metadata)
        self._loaded_group_records[partition] = replay.group_records
        for producer_id, groups in replay.pending.items():
            for group, offsets in groups.items():
                if offsets:
                    self._pending.setdefault(producer_id, {})[group] = offsets
        return True

    def unload_partition(self, partition: int) -> list[str]:
        """Forget the partition's groups (this broker no longer leads it); returns the groups forgotten.
        Writes still waiting for followers will not change memory when they complete."""
        self._epochs[partition] += 1
        return self._forget_partition(partition)

    def _forget_partition(self, partition: int) -> list[str]:
        self._loaded_group_records.pop(partition, None)
        groups = self.groups(partition)
        for group in groups:
            self._offsets.pop(group, None)
            self._group_metadata.pop(group, None)
            self._drop_pending(group)
        return groups

    # -- offsets --------------------------------------------------------------------------------------

    def commit(self, group_id: str, offsets: Mapping[TopicPartition, CommittedOffset], now_ms: int,
               done: Done) -> None:
        """Persist one request's offsets as one batch in the group's partition; they become visible, and
        ``done`` is called, once the append is acknowledged (at once on a single broker). ``done`` gets NONE
        or the client's error (``coordinator_error``).

        A null metadata is stored as "" (the field is not nullable in Kafka's schema), so what a fetch
        returns is the same before and after a restart.
        """
        if not offsets:
            done(ErrorCode.none)
            return
        normalized = _with_metadata(offsets)
        batch = build_batch(self._offset_records(group_id, normalized), timestamp_ms=now_ms)
        inflight = self._inflight.setdefault(group_id, Counter())
        inflight.update(normalized.keys())

        def apply(record_offset: int) -> None:
            _apply_newer(self._offsets, group_id,
                         {tp: replace(c, record_offset=record_offset) for tp, c in normalized.items()})

        def finished(error: ErrorCode) -> None:
            inflight.subtract(normalized.keys())
            for tp in normalized:
                if inflight[tp] <= 0:
                    del inflight[tp]
            if not inflight and self._inflight.get(group_id) is inflight:
                del self._inflight[group_id]
            done(error)

        self._write(self.partition_for(group_id), batch, apply, finished, offsets=True)

    def commit_transactional(self, group_id: str, producer_id: int, producer_epoch: int,
                             offsets: Mapping[TopicPartition, CommittedOffset], now_ms: int, done: Done,
                             *, verification=None) -> None:
        """TxnOffsetCommit (Kafka's storeOffsets with a producer id): the offsets go to the group's partition
        as one transactional batch of that producer (appended with the coordinator's origin: no sequence),
        and are pending for (group, producer) from the append on, invisible to ``fetch``, until
        ``complete_transaction``. ``done`` is called once the append is acknowledged; if it fails they are
        no longer pending (Kafka's failPendingTxnOffsetCommit). ``verification``: the guard of the
        TxnOffsetCommit's verification, checked by the append as for a produce (Kafka's appendForGroup)."""
        if not offsets:
            done(ErrorCode.none)
            return
        normalized = _with_metadata(offsets)
        batch = build_batch(self._offset_records(group_id, normalized), timestamp_ms=now_ms, producer_id=producer_id,
                            producer_epoch=producer_epoch, base_sequence=-1, attributes=TRANSACTIONAL_MASK)
        prepared: dict[TopicPartition, CommittedOffset] = {}

        def prepare(record_offset: int) -> None:  # Kafka's prepareTxnOffsetCommit + onTxnOffsetCommitAppend
            prepared.update({tp: replace(c, record_offset=record_offset) for tp, c in normalized.items()})
            self._pending.setdefault(producer_id, {}).setdefault(group_id, {}).update(prepared)

        def fail() -> None:  # Kafka's failPendingTxnOffsetCommit: only what this request made pending
            groups = self._pending.get(producer_id, {})
            pending = groups.get(group_id, {})
            for tp, committed in prepared.items():
                if pending.get(tp) is committed:
                    del pending[tp]
            if not pending:
                groups.pop(group_id, None)
            if not groups:
                self._pending.pop(producer_id, None)

        self._write(self.partition_for(group_id), batch, lambda _offset: None, done, offsets=True,
                    transactional=True, on_append=prepare, on_failure=fail, verification=verification)

    def complete_transaction(self, partition: int, producer_id: int, commit: bool) -> list[str]:
        """The transaction marker of ``producer_id`` is written (and replicated) in ``partition``: its
        pending offsets there become committed where nothing later in the log was committed (``commit``), or
        are dropped. Returns the groups concerned (Kafka's handleTxnCompletion)."""
        groups = self._pending.get(producer_id)
        if not groups:
            return []
        completed = [group for group in groups if self.partition_for(group) == partition]
        for group in completed:
            offsets = groups.pop(group)
            if commit:
                _apply_newer(self._offsets, group, offsets)
        if not groups:
            del self._pending[producer_id]
        return sorted(completed)

    def has_pending(self, group_id: str, tp: TopicPartition | None = None) -> bool:
        """Whether offsets of the group (for partition ``tp``, or any) are not settled yet: transactional ones
        awaiting their marker, or a plain commit awaiting its acknowledgement (Kafka's
        hasPendingOffsetCommitsForTopicPartition)."""
        inflight = self._inflight.get(group_id)
        if inflight and (tp is None or tp in inflight):
            return True
        for groups in self._pending.values():
            pending = groups.get(group_id)
            if pending and (tp is None or tp in pending):
                return True
        return False

    def pending_producers(self, group_id: str) -> list[int]:
        """The producer ids with transactional offsets of the group awaiting their marker."""
        return sorted(pid for pid, groups in self._pending.items() if groups.get(group_id))

    def has_offsets(self, group_id: str) -> bool:
        """Kafka's GroupMetadata.hasOffsets: committed offsets, or offsets not settled yet (``has_pending``)."""
        return bool(self._offsets.get(group_id)) or self.has_pending(group_id)

    def fetch(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, CommittedOffset]:
        """The group's committed offsets; ``None`` = all of them. Partitions with no commit are left out."""
        committed = self._offsets.get(group_id, {})
        if partitions is None:
            return dict(committed)
        return {tp: committed[tp] for tp in partitions if tp in committed}

    def delete(self, group_id: str, partitions: Iterable[TopicPartition] | None = None, now_ms: int | None = None) -> None:
        """Tombstone some offsets of a group (OffsetDelete), or with ``None`` the whole group (DeleteGroups):
        all its offsets and its group metadata, in one batch."""
        wanted = None if partitions is None else set(partitions)
        committed = self._offsets.get(group_id, {})
        targets = list(committed) if wanted is None else [tp for tp in committed if tp in wanted]
        records = [(encode_offset_key(group_id, topic, partition), None) for topic, partition in targets]
        if partitions is None and group_id in self._group_metadata:
            records.append((encode_group_metadata_key(group_id), None))
            del self._group_metadata[group_id]
        for tp in targets:
            self._forget_offset(group_id, tp)
        # Kafka's removeOffsets / removeAllOffsets: pending transactional offsets of those partitions go too
        # (a marker coming later finds nothing).
        self._drop_pending(group_id, wanted)
        if records:
            self._tombstone(self.partition_for(group_id), records, _now_ms() if now_ms is None else now_ms)

    def delete_topic(self, topic: str, now_ms: int | None = None) -> int:
        """Tombstone every group's offsets for a deleted topic; returns how many offsets were removed."""
        doomed = {
            group: [tp for tp in committed if tp[0] == topic]
            for group, committed in self._offsets.items()
        }
        for groups in list(self._pending.values()):
            for group, pending in list(groups.items()):
                self._drop_pending(group, {tp for tp in pending if tp[0] == topic})
        return self._remove({group: tps for group, tps in doomed.items() if tps}, _now_ms() if now_ms is None else now_ms)

    def groups(self, partition: int | None = None) -> list[str]:
        """Every group (of one offsets partition) with committed offsets, pending transactional offsets or
        stored group metadata."""
        groups = self._offsets.keys() | self._group_metadata.keys()
        for pending in self._pending.values():
            groups |= pending.keys()
        return sorted(g for g in groups if partition is None or self.partition_for(g) == partition)

    def expire(
        self,
        now_ms: int,
        retention_ms: int,
        is_group_empty: Callable[[str], bool],
        empty_since_ms: Callable[[str], int | None] | None = None,
    ) -> int:
        """Remove offsets of groups without members, as Kafka does for ``offsets.retention.minutes``.

        An offset expires when ``now - base >= retention``, with base the time the group became empty if
        ``empty_since_ms`` knows it (a consumer group that lost its members), else the commit timestamp (a
        group that only ever did "simple" commits); an offset committed with an explicit expire timestamp
        expires at that time instead. Returns how many offsets were removed.
        """
        doomed: dict[str, list[TopicPartition]] = {}
        for group, committed in self._offsets.items():
            if not is_group_empty(group):
                continue
            since = empty_since_ms(group) if empty_since_ms is not None else None
            inflight = self._inflight.get(group, {})  # a commit being written is no time to expire (Kafka's rule)
            expired = [
                tp for tp, c in committed.items()
                if tp not in inflight
                and (now_ms >= c.expire_timestamp_ms if c.expire_timestamp_ms != -1
                     else now_ms - (since if since is not None else c.commit_timestamp_ms) >= retention_ms)
            ]
            if expired:
                doomed[group] = expired
        return self._remove(doomed, now_ms)

    # -- opaque group metadata for the group coordinator -----------------------------------------------

    def put_group_metadata(self, group_id: str, value: bytes, now_ms: int, done: Done,
                           before: list[tuple[bytes, bytes | None]] = ()) -> None:
        """Persist the coordinator's serialized group state (a GroupMetadataValue), as Kafka's storeGroup:
        kept in memory and ``done`` called once the append is acknowledged; ``before``: records (a downgraded
        consumer group's tombstones) written ahead of it in the same batch."""
        value = bytes(value)

        def apply(_record_offset: int) -> None:
            self._group_metadata[group_id] = value

        self._write(self.partition_for(group_id),
                    build_batch([*before, (encode_group_metadata_key(group_id), value)], timestamp_ms=now_ms), apply,
                    done, offsets=False)

    def delete_group_metadata(self, group_id: str, now_ms: int | None = None) -> None:
        """Tombstone a group's metadata (a group that died), forgotten at once."""
        if self._group_metadata.pop(group_id, None) is not None:
            self._tombstone(self.partition_for(group_id), [(encode_group_metadata_key(group_id), None)],
                            _now_ms() if now_ms is None else now_ms)

    def take_group_records(self, partition: int) -> dict[str, dict[bytes, bytes]]:
        """The consumer groups' records (record types 3 and up) the last load of ``partition`` replayed, for
        their coordinator to rebuild its groups from (once: the store keeps no copy)."""
        return self._loaded_group_records.pop(partition, {})

    def append_group_records(self, group_id: str, records: list[tuple[bytes, bytes | None]], now_ms: int,
                             done: Done | None = None) -> None:
        """Persist a consumer group's records (KIP-848; tombstones as None) as one batch in its partition,
        through the replica manager with acks=all as commits are; ``done`` gets the outcome once acknowledged
        (Kafka's storeGroup error mapping), or failures are logged when nobody waits."""
        def logged(error: ErrorCode) -> None:
            if error != ErrorCode.none:
                log.warning("group %s: writing %d records failed: %s", group_id, len(records), error.name)

        self._write(self.partition_for(group_id), build_batch(records, timestamp_ms=now_ms), lambda _offset: None,
                    done or logged, offsets=False)

    def get_group_metadata(self, group_id: str) -> bytes | None:
        return self._group_metadata.get(group_id)

    def group_metadata(self, partition: int | None = None) -> dict[str, bytes]:
        """The stored metadata of every loaded group (of one offsets partition): what the coordinator
        rebuilds groups from."""
        return {g: v for g, v in self._group_metadata.items()
                if partition is None or self.partition_for(g) == partition}

    # -- internals ------------------------------------------------------------------------------------

    def _remove(self, doomed: Mapping[str, list[TopicPartition]], now_ms: int) -> int:
        """Forget the given offsets and tombstone them with one batch per offsets partition."""
        by_partition: dict[int, list[tuple[str, TopicPartition]]] = {}
        for group, tps in doomed.items():
            by_partition.setdefault(self.partition_for(group), []).extend((group, tp) for tp in tps)
        removed = 0
        for partition, entries in by_partition.items():
            for group, tp in entries:
                self._forget_offset(group, tp)
            self._tombstone(partition, [(encode_offset_key(group, topic, p), None) for group, (topic, p) in entries],
                            now_ms)
            removed += len(entries)
        return removed

    def _drop_pending(self, group: str, partitions: set[TopicPartition] | None = None) -> None:
        """Forget the group's pending transactional offsets (of ``partitions``, or all), of every producer."""
        for producer_id in list(self._pending):
            groups = self._pending[producer_id]
            pending = groups.get(group)
            if pending is None:
                continue
            if partitions is None:
                pending.clear()
            else:
                for tp in partitions & pending.keys():
                    del pending[tp]
            if not pending:
                del groups[group]
            if not groups:
                del self._pending[producer_id]

    def _offset_records(self, group_id: str, offsets: Mapping[TopicPartition, CommittedOffset]) -> list[tuple[bytes, bytes]]:
        return [(encode_offset_key(group_id, topic, partition), encode_offset_value(committed))
                for (topic, partition), committed in offsets.items()]

    def _forget_offset(self, group: str, tp: TopicPartition) -> None:
        committed = self._offsets.get(group)
        if committed is not None:
            committed.pop(tp, None)
            if not committed:
                del self._offsets[group]

    def _tombstone(self, partition: int, records: list[tuple[bytes, bytes | None]], now_ms: int) -> None:
        """Kafka's cleanupGroupMetadata: append the tombstones on the leader, wait for nobody."""
        outcome = self._replicas.append(OFFSETS_TOPIC, partition, build_batch(records, timestamp_ms=now_ms),
                                        acks=1, min_insync_replicas=1)
        if outcome.error != ErrorCode.none:
            log.warning("writing %d tombstones to %s-%d failed: %s", len(records), OFFSETS_TOPIC, partition,
                        outcome.error.name)

    def _write(self, partition: int, batch: bytearray, apply: Callable[[int], None], done: Done, *, offsets: bool,
               transactional: bool = False, on_append: Callable[[int], None] | None = None,
               on_failure: Callable[[], None] | None = None, verification=None) -> None:
        """Append with acks=all; once acknowledged, ``apply(base offset of the batch)`` (unless the partition
        was unloaded or reloaded meanwhile: NOT_COORDINATOR then), then ``done``. ``on_append`` runs as soon
        as the leader has appended (before followers acknowledge), ``on_failure`` when the write fails after
        that or before. A transactional batch is appended with the coordinator's origin (Kafka's
        AppendOrigin.Coordinator: no sequence numbers, the producer epoch still checked)."""
        epoch = self._epochs[partition]
        min_isr = self._min_insync_replicas()
        outcome = self._replicas.append(OFFSETS_TOPIC, partition, batch, acks=-1, min_insync_replicas=min_isr,
                                        origin="coordinator" if transactional else "client",
                                        verification=NO_VERIFICATION if verification is None else verification)
        step = _WriteStep(partition, epoch, outcome.base_offset, apply, done, offsets, on_failure)
        if outcome.error == ErrorCode.none and on_append is not None:
            on_append(outcome.base_offset)
        if outcome.has_followers and self._replicas.needs_replication_wait(OFFSETS_TOPIC, partition, outcome, min_isr):
            operation = self._replicas.delay_produce([(OFFSETS_TOPIC, partition, outcome.last_offset, min_isr)],
                                                     self._commit_timeout_ms)
            task = asyncio.ensure_future(self._after_replication(operation, step))
            self._waiting.add(task)
            task.add_done_callback(self._waiting.discard)
            return
        self._complete(outcome.error, step)

    async def _after_replication(self, operation, step: "_WriteStep") -> None:
        (error,) = await self._replicas.purgatory.wait(operation)
        self._complete(error, step)

    def _complete(self, error: ErrorCode, step: "_WriteStep") -> None:
        if error == ErrorCode.none and self._epochs[step.partition] != step.epoch:
            error = ErrorCode.not_leader_or_follower  # unloaded meanwhile: the new coordinator has it
        if error == ErrorCode.none:
            step.apply(step.record_offset)
        elif step.on_failure is not None:
            step.on_failure()
        step.done(coordinator_error(error, offsets=step.offsets))


@dataclass(frozen=True)
class _WriteStep:
    """What an append to __consumer_offsets does once acknowledged (or failed)."""

    partition: int
    epoch: int
    record_offset: int
    apply: Callable[[int], None]
    done: Done
    offsets: bool
    on_failure: Callable[[], None] | None


class _Replay:
    """The state being loaded from one __consumer_offsets partition, batch by batch (Kafka's
    doLoadGroupsAndOffsets): plain records apply in log order; a transactional batch's offsets go to
    ``pending`` for its producer; a COMMIT marker moves them to ``offsets`` where they are newer, an ABORT
    marker drops them. A tombstone deletes its key (in ``pending`` for a transactional batch)."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        self.metadata: dict[str, bytes] = {}
        self.pending: dict[int, dict[str, dict[TopicPartition, CommittedOffset]]] = {}
        self.group_records: dict[str, dict[bytes, bytes]] = {}  # record types 3+: group -> key -> value

    def batch(self, header, data) -> None:
        """One batch, as ``PartitionLog.batches`` yields it (alone, at position 0)."""
        if header.is_control:
            marker = read_marker(data, header)
            if marker is not None:
                groups = self.pending.pop(header.producer_id, {})
                if marker.commit:
                    for group, offsets in groups.items():
                        _apply_newer(self.offsets, group, offsets)
            return
        transactional = header.is_transactional
        for record in read_records(data, header):
            if transactional:
                target = self.pending.setdefault(header.producer_id, {})
            else:
                target = self.offsets
            self._record(target, record.key, record.value, header.base_offset, record.offset)

    def _record(self, offsets: dict[str, dict[TopicPartition, CommittedOffset]], key_bytes: bytes | None,
                value: bytes | None, batch_offset: int, offset: int) -> None:
        if key_bytes is None:
            return
        try:
            key = decode_key(key_bytes)
            if isinstance(key, OffsetKey):
                tp = (key.topic, key.partition)
                if value is None:
                    committed = offsets.get(key.group)
                    if committed is not None:
                        committed.pop(tp, None)
                        if not committed:
                            del offsets[key.group]
                else:
                    offsets.setdefault(key.group, {})[tp] = replace(decode_offset_value(value),
                                                                   record_offset=batch_offset)
            elif isinstance(key, GroupMetadataKey):
                if value is None:
                    self.metadata.pop(key.group, None)
                else:
                    self.metadata[key.group] = value
            else:  # a consumer group's record (types 3 and up): the group id comes first in every such key
                reader = RecordReader(key_bytes)
                reader.int16()
                records = self.group_records.setdefault(reader.string(), {})
                if value is None:
                    records.pop(bytes(key_bytes), None)
                else:
                    records[bytes(key_bytes)] = bytes(value)
        except (ValueError, UnicodeDecodeError) as exc:
            # One bad record must not keep every group of this partition from loading.
            log.warning("skipping unreadable record at %s-%d offset %d: %s", OFFSETS_TOPIC, self.partition, offset,
                        exc)


def _with_metadata(offsets: Mapping[TopicPartition, CommittedOffset]) -> dict[TopicPartition, CommittedOffset]:
    """A null metadata stored as "" (the field is not nullable in Kafka's schema)."""
    return {tp: committed if committed.metadata is not None else replace(committed, metadata="")
            for tp, committed in offsets.items()}


def _apply_newer(offsets: dict[str, dict[TopicPartition, CommittedOffset]], group: str,
                 candidates: Mapping[TopicPartition, CommittedOffset]) -> None:
    """Make ``candidates`` the group's committed offsets where no offset written later in the log is there
    (Kafka's completePendingTxnOffsetCommit / onOffsetCommitAppend rule)."""
    if not candidates:
        return
    committed = offsets.setdefault(group, {})
    for tp, candidate in candidates.items():
        current = committed.get(tp)
        if current is None or current.older_than(candidate):
            committed[tp] = candidate

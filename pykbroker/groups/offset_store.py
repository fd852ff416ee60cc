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
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping, NamedTuple

from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.records import build_batch, read_records

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
        self._group_metadata: dict[str, bytes] = {}
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
        """Replay one partition's log, oldest record first, up to its log end when the load starts (as
        Kafka's doLoadGroupsAndOffsets), yielding to the loop every few batches. The replayed state replaces
        that partition's groups in memory at the end, and only if nothing unloaded or reloaded the partition
        meanwhile: returns False then (the load was abandoned)."""
        self._epochs[partition] += 1
        epoch = self._epochs[partition]
        offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        metadata: dict[str, bytes] = {}
        hosted = self._replicas.partition(OFFSETS_TOPIC, partition)
        if hosted is not None:
            for count, (header, data) in enumerate(hosted.log.batches(), 1):
                if not header.is_control:  # transaction markers: no offsets in them
                    for record in read_records(data, header):  # batches() yields each batch alone, at position 0
                        _replay(offsets, metadata, record.key, record.value, partition, record.offset)
                if count % LOAD_BATCHES_PER_STEP == 0:
                    await asyncio.sleep(0)
                    if self._epochs[partition] != epoch:
                        return False
        if self._epochs[partition] != epoch:
            return False
        self._forget_partition(partition)
        self._offsets.update(offsets)
        self._group_metadata.update(metadata)
        return True

    def unload_partition(self, partition: int) -> list[str]:
        """Forget the partition's groups (this broker no longer leads it); returns the groups forgotten.
        Writes still waiting for followers will not change memory when they complete."""
        self._epochs[partition] += 1
        return self._forget_partition(partition)

    def _forget_partition(self, partition: int) -> list[str]:
        groups = [g for g in self._offsets.keys() | self._group_metadata.keys() if self.partition_for(g) == partition]
        for group in groups:
            self._offsets.pop(group, None)
            self._group_metadata.pop(group, None)
        return sorted(groups)

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
        normalized = {
            tp: committed if committed.metadata is not None else replace(committed, metadata="")
            for tp, committed in offsets.items()
        }
        records = [
            (encode_offset_key(group_id, topic, partition), encode_offset_value(committed))
            for (topic, partition), committed in normalized.items()
        ]

        def apply() -> None:
            self._offsets.setdefault(group_id, {}).update(normalized)

        self._write(self.partition_for(group_id), records, now_ms, apply, done, offsets=True)

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
        committed = self._offsets.get(group_id, {})
        targets = list(committed) if partitions is None else [tp for tp in partitions if tp in committed]
        records = [(encode_offset_key(group_id, topic, partition), None) for topic, partition in targets]
        if partitions is None and group_id in self._group_metadata:
            records.append((encode_group_metadata_key(group_id), None))
            del self._group_metadata[group_id]
        for tp in targets:
            self._forget_offset(group_id, tp)
        if records:
            self._tombstone(self.partition_for(group_id), records, _now_ms() if now_ms is None else now_ms)

    def delete_topic(self, topic: str, now_ms: int | None = None) -> int:
        """Tombstone every group's offsets for a deleted topic; returns how many offsets were removed."""
        doomed = {
            group: [tp for tp in committed if tp[0] == topic]
            for group, committed in self._offsets.items()
        }
        return self._remove({group: tps for group, tps in doomed.items() if tps}, _now_ms() if now_ms is None else now_ms)

    def groups(self, partition: int | None = None) -> list[str]:
        """Every group (of one offsets partition) with committed offsets or stored group metadata."""
        groups = self._offsets.keys() | self._group_metadata.keys()
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
            expired = [
                tp for tp, c in committed.items()
                if (now_ms >= c.expire_timestamp_ms if c.expire_timestamp_ms != -1
                    else now_ms - (since if since is not None else c.commit_timestamp_ms) >= retention_ms)
            ]
            if expired:
                doomed[group] = expired
        return self._remove(doomed, now_ms)

    # -- opaque group metadata for the group coordinator -----------------------------------------------

    def put_group_metadata(self, group_id: str, value: bytes, now_ms: int, done: Done) -> None:
        """Persist the coordinator's serialized group state (a GroupMetadataValue), as Kafka's storeGroup:
        kept in memory and ``done`` called once the append is acknowledged."""
        value = bytes(value)

        def apply() -> None:
            self._group_metadata[group_id] = value

        self._write(self.partition_for(group_id), [(encode_group_metadata_key(group_id), value)], now_ms, apply,
                    done, offsets=False)

    def delete_group_metadata(self, group_id: str, now_ms: int | None = None) -> None:
        """Tombstone a group's metadata (a group that died), forgotten at once."""
        if self._group_metadata.pop(group_id, None) is not None:
            self._tombstone(self.partition_for(group_id), [(encode_group_metadata_key(group_id), None)],
                            _now_ms() if now_ms is None else now_ms)

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

    def _write(self, partition: int, records: list[tuple[bytes, bytes | None]], now_ms: int,
               apply: Callable[[], None], done: Done, *, offsets: bool) -> None:
        """Append with acks=all; once acknowledged, ``apply`` (unless the partition was unloaded or
        reloaded meanwhile: NOT_COORDINATOR then), then ``done``."""
        epoch = self._epochs[partition]
        min_isr = self._min_insync_replicas()
        outcome = self._replicas.append(OFFSETS_TOPIC, partition, build_batch(records, timestamp_ms=now_ms),
                                        acks=-1, min_insync_replicas=min_isr)
        if outcome.has_followers and self._replicas.needs_replication_wait(OFFSETS_TOPIC, partition, outcome, min_isr):
            operation = self._replicas.delay_produce([(OFFSETS_TOPIC, partition, outcome.last_offset, min_isr)],
                                                     self._commit_timeout_ms)
            task = asyncio.ensure_future(self._after_replication(operation, partition, epoch, apply, done, offsets))
            self._waiting.add(task)
            task.add_done_callback(self._waiting.discard)
            return
        self._complete(outcome.error, partition, epoch, apply, done, offsets)

    async def _after_replication(self, operation, partition: int, epoch: int, apply: Callable[[], None], done: Done,
                                 offsets: bool) -> None:
        (error,) = await self._replicas.purgatory.wait(operation)
        self._complete(error, partition, epoch, apply, done, offsets)

    def _complete(self, error: ErrorCode, partition: int, epoch: int, apply: Callable[[], None], done: Done,
                  offsets: bool) -> None:
        if error == ErrorCode.none and self._epochs[partition] != epoch:
            error = ErrorCode.not_leader_or_follower  # unloaded meanwhile: the new coordinator has it
        if error == ErrorCode.none:
            apply()
        done(coordinator_error(error, offsets=offsets))


def _replay(offsets: dict[str, dict[TopicPartition, CommittedOffset]], metadata: dict[str, bytes],
            key_bytes: bytes | None, value: bytes | None, partition: int, offset: int) -> None:
    """Apply one record of __consumer_offsets to the state being loaded; a tombstone deletes its key."""
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
                offsets.setdefault(key.group, {})[tp] = decode_offset_value(value)
        elif isinstance(key, GroupMetadataKey):
            if value is None:
                metadata.pop(key.group, None)
            else:
                metadata[key.group] = value
    except (ValueError, UnicodeDecodeError) as exc:
        # One bad record must not keep every group of this partition from loading.
        log.warning("skipping unreadable record at %s-%d offset %d: %s", OFFSETS_TOPIC, partition, offset, exc)

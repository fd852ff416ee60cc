"""Committed offsets, kept durably in the internal topic ``__consumer_offsets`` and replayed on start.

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

Each call that changes state appends ONE batch per touched partition before it changes memory: a commit
request is atomic, and an exception from the log leaves memory as it was.
"""

from __future__ import annotations

import logging
import struct
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping, NamedTuple, Protocol

from pykbroker.protocol.records import BatchHeader, build_batch, read_records

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


class PartitionLogLike(Protocol):
    """What the store needs of a ``pykbroker.log`` PartitionLog."""

    def append(self, records, *, leader_epoch: int, now_ms: int): ...

    def batches(self, start_offset: int = 0) -> Iterable[tuple[BatchHeader, bytes]]: ...


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
    """The committed offsets (and opaque group metadata) of every group, backed by ``__consumer_offsets``.

    ``logs(p)`` returns the log of partition p (the caller creates it); ``leader_epoch(p)`` the epoch to
    stamp on appended batches (0 for a single node).
    """

    def __init__(
        self,
        logs: Callable[[int], PartitionLogLike],
        num_partitions: int = DEFAULT_OFFSETS_PARTITIONS,
        *,
        leader_epoch: Callable[[int], int] = lambda partition: 0,
    ) -> None:
        if num_partitions < 1:
            raise ValueError("the offsets topic needs at least one partition")
        self._logs = logs
        self.num_partitions = num_partitions
        self._leader_epoch = leader_epoch
        self._offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        self._group_metadata: dict[str, bytes] = {}

    def partition_for(self, group_id: str) -> int:
        return partition_for_group(group_id, self.num_partitions)

    # -- start ------------------------------------------------------------------------------------------

    def load(self) -> None:
        """Forget memory and replay every partition of the offsets topic, oldest record first."""
        self._offsets.clear()
        self._group_metadata.clear()
        for partition in range(self.num_partitions):
            for header, data in self._logs(partition).batches():
                if header.is_control:
                    continue  # transaction markers: no offsets in them
                for record in read_records(data, header):  # batches() yields each batch alone, at position 0
                    self._apply(record.key, record.value, partition, record.offset)

    def _apply(self, key_bytes: bytes | None, value: bytes | None, partition: int, offset: int) -> None:
        if key_bytes is None:
            return
        try:
            key = decode_key(key_bytes)
            if isinstance(key, OffsetKey):
                tp = (key.topic, key.partition)
                if value is None:
                    self._forget_offset(key.group, tp)
                else:
                    self._offsets.setdefault(key.group, {})[tp] = decode_offset_value(value)
            elif isinstance(key, GroupMetadataKey):
                if value is None:
                    self._group_metadata.pop(key.group, None)
                else:
                    self._group_metadata[key.group] = value
        except (ValueError, UnicodeDecodeError) as exc:
            # One bad record must not keep every group of this partition from loading.
            log.warning("skipping unreadable record at %s-%d offset %d: %s", OFFSETS_TOPIC, partition, offset, exc)

    # -- offsets --------------------------------------------------------------------------------------

    def commit(self, group_id: str, offsets: Mapping[TopicPartition, CommittedOffset], now_ms: int) -> None:
        """Persist one request's offsets as one batch in the group's partition, then make them visible.

        A null metadata is stored as "" (the field is not nullable in Kafka's schema), so what a fetch
        returns is the same before and after a restart.
        """
        if not offsets:
            return
        normalized = {
            tp: committed if committed.metadata is not None else replace(committed, metadata="")
            for tp, committed in offsets.items()
        }
        records = [
            (encode_offset_key(group_id, topic, partition), encode_offset_value(committed))
            for (topic, partition), committed in normalized.items()
        ]
        self._append(self.partition_for(group_id), records, now_ms)
        self._offsets.setdefault(group_id, {}).update(normalized)

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
        drop_metadata = partitions is None and group_id in self._group_metadata
        if drop_metadata:
            records.append((encode_group_metadata_key(group_id), None))
        if not records:
            return
        self._append(self.partition_for(group_id), records, _now_ms() if now_ms is None else now_ms)
        for tp in targets:
            self._forget_offset(group_id, tp)
        if drop_metadata:
            del self._group_metadata[group_id]

    def delete_topic(self, topic: str, now_ms: int | None = None) -> int:
        """Tombstone every group's offsets for a deleted topic; returns how many offsets were removed."""
        doomed = {
            group: [tp for tp in committed if tp[0] == topic]
            for group, committed in self._offsets.items()
        }
        return self._remove({group: tps for group, tps in doomed.items() if tps}, _now_ms() if now_ms is None else now_ms)

    def groups(self) -> list[str]:
        """Every group with committed offsets or stored group metadata."""
        return sorted(self._offsets.keys() | self._group_metadata.keys())

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

    def put_group_metadata(self, group_id: str, value: bytes | None, now_ms: int | None = None) -> None:
        """Persist the coordinator's serialized group state (a GroupMetadataValue); ``None`` deletes it."""
        if value is None and group_id not in self._group_metadata:
            return
        self._append(
            self.partition_for(group_id),
            [(encode_group_metadata_key(group_id), None if value is None else bytes(value))],
            _now_ms() if now_ms is None else now_ms,
        )
        if value is None:
            del self._group_metadata[group_id]
        else:
            self._group_metadata[group_id] = bytes(value)

    def get_group_metadata(self, group_id: str) -> bytes | None:
        return self._group_metadata.get(group_id)

    def group_metadata(self) -> dict[str, bytes]:
        """Every group's stored metadata, as replayed by ``load``: what the coordinator rebuilds from."""
        return dict(self._group_metadata)

    # -- internals ------------------------------------------------------------------------------------

    def _remove(self, doomed: Mapping[str, list[TopicPartition]], now_ms: int) -> int:
        """Tombstone the given offsets with one batch per offsets partition, forgetting each batch's offsets
        as soon as it is appended (so a failure part-way leaves memory matching the log)."""
        by_partition: dict[int, list[tuple[str, TopicPartition]]] = {}
        for group, tps in doomed.items():
            by_partition.setdefault(self.partition_for(group), []).extend((group, tp) for tp in tps)
        removed = 0
        for partition, entries in by_partition.items():
            records = [(encode_offset_key(group, topic, p), None) for group, (topic, p) in entries]
            self._append(partition, records, now_ms)
            for group, tp in entries:
                self._forget_offset(group, tp)
            removed += len(entries)
        return removed

    def _forget_offset(self, group: str, tp: TopicPartition) -> None:
        committed = self._offsets.get(group)
        if committed is not None:
            committed.pop(tp, None)
            if not committed:
                del self._offsets[group]

    def _append(self, partition: int, records: list[tuple[bytes, bytes | None]], now_ms: int) -> None:
        batch = build_batch(records, timestamp_ms=now_ms)
        self._logs(partition).append(batch, leader_epoch=self._leader_epoch(partition), now_ms=now_ms)


"""The ``__consumer_offsets`` records of consumer groups (KIP-848), in Kafka 4's layout, so a group
written by either broker loads in the other and Kafka's tools (kafka-dump-log --offsets-decoder) read
ours. Pure codecs: the coordinator decides what to write and replays what it reads.

A record's key is the record type (int16) followed by the key's fields, every one a Kafka ``string``
(int16 length + UTF-8), as Kafka's ``MessageUtil.toCoordinatorTypePrefixedBytes`` writes it:

    type  key                                           value (version 0, the only one Kafka 4 has)
    3     ConsumerGroupMetadataKey(group)                epoch int32; tag 0: metadata_hash int64 (4.1+)
    4     ConsumerGroupPartitionMetadataKey(group)       topics [topic_id uuid, topic_name, num_partitions
                                                          int32, partition_metadata [partition, racks]]
    5     ConsumerGroupMemberMetadataKey(group, member)  instance_id?, rack_id?, client_id, client_host,
                                                          subscribed_topic_names [string], subscribed_topic_
                                                          regex?, rebalance_timeout_ms int32, server_assignor?;
                                                          tag 0: classic_member_metadata? (session_timeout_ms,
                                                          supported_protocols [name, metadata bytes])
    6     ConsumerGroupTargetAssignmentMetadataKey(group)  assignment_epoch int32
    7     ConsumerGroupTargetAssignmentMemberKey(group, member)  topic_partitions [topic_id, partitions [int32]]
    8     ConsumerGroupCurrentMemberAssignmentKey(group, member) member_epoch int32, previous_member_epoch
                                                          int32, state int8, assigned_partitions and
                                                          partitions_pending_revocation [topic_id, partitions]
    16    ConsumerGroupRegularExpressionKey(group, regex)  topics [string], version int64, timestamp int64

A value is its version (int16, always 0) followed by the fields in the flexible encoding: compact
strings, bytes and arrays (unsigned varint length + 1, 0 for null), 16-byte UUIDs, and after every struct
its tagged fields (a count, then tag, size, bytes each). A tagged field at its default is not written
(metadata_hash 0, classic_member_metadata null); a nullable struct in a tagged field starts with the
marker varint 1. Tagged fields this codec does not know (those later Kafka versions add, such as 4.3's
AssignmentTimestamp) are skipped, as Kafka's generated readers do. A null value (``None``) is a tombstone:
it deletes its key, and Kafka writes one for each of a leaving member's records (5, 7, 8) and for every
record of a deleted group. Bytes after the last field are ignored, as Kafka ignores them.

Kafka sorts ``subscribed_topic_names`` and the regular expression's ``topics`` before writing
(GroupCoordinatorRecordHelpers); these codecs write sequences in the order they are given, so a value
round-trips exactly. ``state`` is Kafka's MemberState: 0 STABLE, 1 UNREVOKED_PARTITIONS,
2 UNRELEASED_PARTITIONS (127 UNKNOWN). Since Kafka 4.1 (KIP-1101) ConsumerGroupPartitionMetadata is no
longer written, the metadata hash in ConsumerGroupMetadata replaces it; it is still read, and Kafka 4.1
tombstones the record of a group that still has one.

Bad input (a truncated record, an unknown value version, a null where the schema has none) raises a
``ValueError`` that names the record type; the loader logs it and skips the record.
"""

from __future__ import annotations

import io
import struct
import uuid
from dataclasses import dataclass, fields
from typing import Callable, ClassVar, TypeVar, Union

from kio.serial.writers import (
    write_compact_array_length,
    write_compact_string,
    write_int8,
    write_int16,
    write_int32,
    write_int64,
    write_nullable_compact_string,
    write_unsigned_varint,
    write_uuid,
)

from pykbroker.groups.offset_store import RecordReader, encode_string

CONSUMER_GROUP_METADATA = 3
CONSUMER_GROUP_PARTITION_METADATA = 4
CONSUMER_GROUP_MEMBER_METADATA = 5
CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA = 6
CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER = 7
CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT = 8
CONSUMER_GROUP_REGULAR_EXPRESSION = 16

VALUE_VERSION = 0  # every consumer group value has version 0 only, in Kafka 4.0 and 4.1

_INT16 = struct.Struct(">h")
_INT8 = struct.Struct(">b")

T = TypeVar("T")


# --------------------------------------------------------------------------------------------------
# Reading and writing the flexible encoding.


class _Reader(RecordReader):
    """The offset store's coordinator-record reader, with what the flexible consumer group values add."""

    def int8(self) -> int:
        return _INT8.unpack(self._take(1))[0]

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=self._take(16))

    def array(self, read_item: Callable[["_Reader"], T]) -> tuple[T, ...]:
        """A non-nullable compact array; every item takes at least one byte, so a count larger than the
        bytes left is refused before anything is read."""
        count = self.uvarint() - 1
        if count < 0:
            raise ValueError("null in a non-nullable array")
        if count > len(self.data) - self.pos:
            raise ValueError(f"array of {count} items in {len(self.data) - self.pos} bytes")
        return tuple(read_item(self) for _ in range(count))

    def tagged_fields(self) -> dict[int, bytes]:
        """The struct's tagged fields, tag -> raw bytes; the caller reads those it knows."""
        found = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            found[tag] = self._take(self.uvarint())
        return found


def _write_array(out: io.BytesIO, items, write_item: Callable[[io.BytesIO, T], None]) -> None:
    write_compact_array_length(out, len(items))
    for item in items:
        write_item(out, item)


def _write_tagged_fields(out: io.BytesIO, tagged: dict[int, bytes]) -> None:
    """The tagged fields of a struct, in ascending tag order (the fields at their default left out)."""
    write_unsigned_varint(out, len(tagged))
    for tag in sorted(tagged):
        write_unsigned_varint(out, tag)
        write_unsigned_varint(out, len(tagged[tag]))
        out.write(tagged[tag])


def _write_struct(out: io.BytesIO, item) -> None:
    item._write(out)


def _read_int32(reader: _Reader) -> int:
    return reader.int32()


def _read_string(reader: _Reader) -> str:
    return reader.compact_string()


# --------------------------------------------------------------------------------------------------
# Keys: the record type, then the key's strings.


@dataclass(frozen=True)
class ConsumerGroupMetadataKey:
    record_type: ClassVar[int] = CONSUMER_GROUP_METADATA
    group_id: str


@dataclass(frozen=True)
class ConsumerGroupPartitionMetadataKey:
    record_type: ClassVar[int] = CONSUMER_GROUP_PARTITION_METADATA
    group_id: str


@dataclass(frozen=True)
class ConsumerGroupMemberMetadataKey:
    record_type: ClassVar[int] = CONSUMER_GROUP_MEMBER_METADATA
    group_id: str
    member_id: str


@dataclass(frozen=True)
class ConsumerGroupTargetAssignmentMetadataKey:
    record_type: ClassVar[int] = CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA
    group_id: str


@dataclass(frozen=True)
class ConsumerGroupTargetAssignmentMemberKey:
    record_type: ClassVar[int] = CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER
    group_id: str
    member_id: str


@dataclass(frozen=True)
class ConsumerGroupCurrentMemberAssignmentKey:
    record_type: ClassVar[int] = CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT
    group_id: str
    member_id: str


@dataclass(frozen=True)
class ConsumerGroupRegularExpressionKey:
    record_type: ClassVar[int] = CONSUMER_GROUP_REGULAR_EXPRESSION
    group_id: str
    regular_expression: str


ConsumerGroupKey = Union[
    ConsumerGroupMetadataKey, ConsumerGroupPartitionMetadataKey, ConsumerGroupMemberMetadataKey,
    ConsumerGroupTargetAssignmentMetadataKey, ConsumerGroupTargetAssignmentMemberKey,
    ConsumerGroupCurrentMemberAssignmentKey, ConsumerGroupRegularExpressionKey,
]

_KEY_CLASSES: dict[int, type] = {
    cls.record_type: cls
    for cls in (ConsumerGroupMetadataKey, ConsumerGroupPartitionMetadataKey, ConsumerGroupMemberMetadataKey,
                ConsumerGroupTargetAssignmentMetadataKey, ConsumerGroupTargetAssignmentMemberKey,
                ConsumerGroupCurrentMemberAssignmentKey, ConsumerGroupRegularExpressionKey)
}
KEY_TYPES = frozenset(_KEY_CLASSES)


def encode_key(key: ConsumerGroupKey) -> bytes:
    return _INT16.pack(key.record_type) + b"".join(encode_string(getattr(key, f.name)) for f in fields(key))


def decode_key(data: bytes) -> ConsumerGroupKey | None:
    """The key of a consumer group record; None for the record types of other groups and of offsets."""
    reader = _Reader(data)
    try:
        record_type = reader.int16()
    except ValueError as error:
        raise ValueError(f"__consumer_offsets record key: {error}") from error
    cls = _KEY_CLASSES.get(record_type)
    if cls is None:
        return None
    try:
        return cls(*(reader.string() for _ in fields(cls)))
    except ValueError as error:
        raise ValueError(f"{cls.__name__} (record type {record_type}): {error}") from error


# --------------------------------------------------------------------------------------------------
# Values. Each struct writes itself (``_write``) and reads itself (``_read``) in the flexible encoding.


@dataclass(frozen=True)
class ConsumerGroupMetadataValue:
    epoch: int
    metadata_hash: int = 0  # Kafka 4.1 (KIP-1101): tagged field 0, not written when 0

    def _write(self, out: io.BytesIO) -> None:
        write_int32(out, self.epoch)
        _write_tagged_fields(out, {0: struct.pack(">q", self.metadata_hash)} if self.metadata_hash else {})

    @classmethod
    def _read(cls, reader: _Reader) -> ConsumerGroupMetadataValue:
        epoch = reader.int32()
        tagged = reader.tagged_fields()
        return cls(epoch, _Reader(tagged[0]).int64() if 0 in tagged else 0)


@dataclass(frozen=True)
class PartitionMetadata:
    partition: int
    racks: tuple[str, ...]

    def _write(self, out: io.BytesIO) -> None:
        write_int32(out, self.partition)
        _write_array(out, self.racks, write_compact_string)
        _write_tagged_fields(out, {})

    @classmethod
    def _read(cls, reader: _Reader) -> PartitionMetadata:
        value = cls(reader.int32(), reader.array(_read_string))
        reader.tagged_fields()
        return value


@dataclass(frozen=True)
class TopicMetadata:
    topic_id: uuid.UUID
    topic_name: str
    num_partitions: int
    partition_metadata: tuple[PartitionMetadata, ...] = ()  # racks per partition; Kafka 4 writes none

    def _write(self, out: io.BytesIO) -> None:
        write_uuid(out, self.topic_id)
        write_compact_string(out, self.topic_name)
        write_int32(out, self.num_partitions)
        _write_array(out, self.partition_metadata, _write_struct)
        _write_tagged_fields(out, {})

    @classmethod
    def _read(cls, reader: _Reader) -> TopicMetadata:
        value = cls(reader.uuid(), reader.compact_string(), reader.int32(), reader.array(PartitionMetadata._read))
        reader.tagged_fields()
        return value


@dataclass(frozen=True)
class ConsumerGroupPartitionMetadataValue:
    topics: tuple[TopicMetadata, ...]

    def _write(self, out: io.BytesIO) -> None:
        _write_array(out, self.topics, _write_struct)
        _write_tagged_fields(out, {})

    @classmethod
    def _read(cls, reader: _Reader) -> ConsumerGroupPartitionMetadataValue:
        value = cls(reader.array(TopicMetadata._read))
        reader.tagged_fields()
        return value


@dataclass(frozen=True)
class ClassicProtocol:
    name: str
    metadata: bytes

    def _write(self, out: io.BytesIO) -> None:
        write_compact_string(out, self.name)
        write_compact_string(out, bytes(self.metadata))  # compact bytes: the same layout
        _write_tagged_fields(out, {})

    @classmethod
    def _read(cls, reader: _Reader) -> ClassicProtocol:
        value = cls(reader.compact_string(), reader.compact_bytes())
        reader.tagged_fields()
        return value


@dataclass(frozen=True)
class ClassicMemberMetadata:
    """What a member of a consumer group that still speaks the classic protocol (an upgraded group) sent
    in its JoinGroup; null for members of the consumer protocol."""

    session_timeout_ms: int
    supported_protocols: tuple[ClassicProtocol, ...]

    def _write(self, out: io.BytesIO) -> None:
        write_int32(out, self.session_timeout_ms)
        _write_array(out, self.supported_protocols, _write_struct)
        _write_tagged_fields(out, {})

    @classmethod
    def _read(cls, reader: _Reader) -> ClassicMemberMetadata:
        value = cls(reader.int32(), reader.array(ClassicProtocol._read))
        reader.tagged_fields()
        return value


@dataclass(frozen=True)
class ConsumerGroupMemberMetadataValue:
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None
    classic_member_metadata: ClassicMemberMetadata | None = None  # tagged field 0

    def _write(self, out: io.BytesIO) -> None:
        write_nullable_compact_string(out, self.instance_id)
        write_nullable_compact_string(out, self.rack_id)
        write_compact_string(out, self.client_id)
        write_compact_string(out, self.client_host)
        _write_array(out, self.subscribed_topic_names, write_compact_string)
        write_nullable_compact_string(out, self.subscribed_topic_regex)
        write_int32(out, self.rebalance_timeout_ms)
        write_nullable_compact_string(out, self.server_assignor)
        tagged = {}
        if self.classic_member_metadata is not None:  # a nullable struct: the marker 1, then the struct
            field = io.BytesIO()
            write_unsigned_varint(field, 1)
            self.classic_member_metadata._write(field)
            tagged[0] = field.getvalue()
        _write_tagged_fields(out, tagged)

    @classmethod
    def _read(cls, reader: _Reader) -> ConsumerGroupMemberMetadataValue:
        instance_id = reader.compact_nullable_string()
        rack_id = reader.compact_nullable_string()
        client_id = reader.compact_string()
        client_host = reader.compact_string()
        topic_names = reader.array(_read_string)
        topic_regex = reader.compact_nullable_string()
        rebalance_timeout_ms = reader.int32()
        server_assignor = reader.compact_nullable_string()
        classic = None
        tagged = reader.tagged_fields()
        if 0 in tagged:
            field = _Reader(tagged[0])
            if field.uvarint() > 0:  # Kafka reads a marker <= 0 as null
                classic = ClassicMemberMetadata._read(field)
        return cls(instance_id, rack_id, client_id, client_host, topic_names, topic_regex, rebalance_timeout_ms,
                   server_assignor, classic)


@dataclass(frozen=True)
class ConsumerGroupTargetAssignmentMetadataValue:
    assignment_epoch: int

    def _write(self, out: io.BytesIO) -> None:
        write_int32(out, self.assignment_epoch)
        _write_tagged_fields(out, {})

    @classmethod
    def _read(cls, reader: _Reader) -> ConsumerGroupTargetAssignmentMetadataValue:
        value = cls(reader.int32())
        reader.tagged_fields()
        return value


@dataclass(frozen=True)
class TopicPartitions:
    """A topic's partitions: Kafka's TopicPartition of the target assignment and TopicPartitions of the
    current assignment, which have the same layout."""

    topic_id: uuid.UUID
    partitions: tuple[int, ...]

    def _write(self, out: io.BytesIO) -> None:
        write_uuid(out, self.topic_id)
        _write_array(out, self.partitions, write_int32)
        _write_tagged_fields(out, {})

    @classmethod
    def _read(cls, reader: _Reader) -> TopicPartitions:
        value = cls(reader.uuid(), reader.array(_read_int32))
        reader.tagged_fields()
        return value


@dataclass(frozen=True)
class ConsumerGroupTargetAssignmentMemberValue:
    topic_partitions: tuple[TopicPartitions, ...]

    def _write(self, out: io.BytesIO) -> None:
        _write_array(out, self.topic_partitions, _write_struct)
        _write_tagged_fields(out, {})

    @classmethod
    def _read(cls, reader: _Reader) -> ConsumerGroupTargetAssignmentMemberValue:
        value = cls(reader.array(TopicPartitions._read))
        reader.tagged_fields()
        return value


@dataclass(frozen=True)
class ConsumerGroupCurrentMemberAssignmentValue:
    member_epoch: int
    previous_member_epoch: int
    state: int  # Kafka's MemberState value (int8)
    assigned_partitions: tuple[TopicPartitions, ...]
    partitions_pending_revocation: tuple[TopicPartitions, ...]

    def _write(self, out: io.BytesIO) -> None:
        write_int32(out, self.member_epoch)
        write_int32(out, self.previous_member_epoch)
        write_int8(out, self.state)
        _write_array(out, self.assigned_partitions, _write_struct)
        _write_array(out, self.partitions_pending_revocation, _write_struct)
        _write_tagged_fields(out, {})

    @classmethod
    def _read(cls, reader: _Reader) -> ConsumerGroupCurrentMemberAssignmentValue:
        value = cls(reader.int32(), reader.int32(), reader.int8(), reader.array(TopicPartitions._read),
                    reader.array(TopicPartitions._read))
        reader.tagged_fields()
        return value


@dataclass(frozen=True)
class ConsumerGroupRegularExpressionValue:
    """The topics a subscribed regular expression matched, resolved at ``version`` (the metadata image
    version) and ``timestamp`` (ms)."""

    topics: tuple[str, ...]
    version: int
    timestamp: int

    def _write(self, out: io.BytesIO) -> None:
        _write_array(out, self.topics, write_compact_string)
        write_int64(out, self.version)
        write_int64(out, self.timestamp)
        _write_tagged_fields(out, {})

    @classmethod
    def _read(cls, reader: _Reader) -> ConsumerGroupRegularExpressionValue:
        value = cls(reader.array(_read_string), reader.int64(), reader.int64())
        reader.tagged_fields()
        return value


ConsumerGroupValue = Union[
    ConsumerGroupMetadataValue, ConsumerGroupPartitionMetadataValue, ConsumerGroupMemberMetadataValue,
    ConsumerGroupTargetAssignmentMetadataValue, ConsumerGroupTargetAssignmentMemberValue,
    ConsumerGroupCurrentMemberAssignmentValue, ConsumerGroupRegularExpressionValue,
]

_VALUE_CLASSES: dict[int, type] = {
    CONSUMER_GROUP_METADATA: ConsumerGroupMetadataValue,
    CONSUMER_GROUP_PARTITION_METADATA: ConsumerGroupPartitionMetadataValue,
    CONSUMER_GROUP_MEMBER_METADATA: ConsumerGroupMemberMetadataValue,
    CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA: ConsumerGroupTargetAssignmentMetadataValue,
    CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER: ConsumerGroupTargetAssignmentMemberValue,
    CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT: ConsumerGroupCurrentMemberAssignmentValue,
    CONSUMER_GROUP_REGULAR_EXPRESSION: ConsumerGroupRegularExpressionValue,
}


def encode_value(value: ConsumerGroupValue) -> bytes:
    out = io.BytesIO()
    write_int16(out, VALUE_VERSION)
    try:
        value._write(out)
    except (struct.error, TypeError) as error:  # a number out of its field's range, a None where none fits
        raise ValueError(f"{type(value).__name__}: {error}") from error
    return out.getvalue()


def decode_value(key: ConsumerGroupKey, data: bytes | None) -> ConsumerGroupValue | None:
    """The value of ``key``'s record; None for a tombstone (a null value)."""
    if data is None:
        return None
    cls = _VALUE_CLASSES[key.record_type]
    reader = _Reader(data)
    try:
        version = reader.int16()
        if version != VALUE_VERSION:
            raise ValueError(f"unknown value version {version}")
        return cls._read(reader)
    except ValueError as error:
        raise ValueError(f"{cls.__name__} (record type {key.record_type}): {error}") from error

"""A group's membership as one ``__consumer_offsets`` record: Kafka's GroupMetadataValue.

The offset store keeps these values opaque under the GroupMetadataKey (version 2, group id); this
module gives them Kafka's own layout, so Kafka's tools can read our offsets topic and a group written by
either broker loads in the other. We write version 3 (what Kafka 2.3 to 3.x writes) and read 0-4:

    int16  version
    string protocol_type
    int32  generation
    nullable string protocol       (null when the group is Empty)
    nullable string leader         (null when the group is Empty)
    int64  current_state_timestamp (v2+; -1 = unknown)
    int32  member count, then per member:
        string member_id, nullable string group_instance_id (v3+), string client_id, string client_host,
        int32 rebalance_timeout (v1+), int32 session_timeout, bytes subscription, bytes assignment
    (v4 is the flexible form: compact strings/bytes/array and tagged fields)

A group is written when it becomes Stable (with the assignment the leader sent) and when it becomes
Empty, as Kafka does, so after a restart a Stable group comes back with its members, generation and
assignments, and an Empty group keeps its generation and the time it became empty.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pykbroker.groups.classic.group import ClassicGroup, GroupState, Member
from pykbroker.groups.offset_store import RecordReader, encode_string

GROUP_METADATA_VALUE_VERSION = 3

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")


@dataclass(frozen=True)
class MemberRecord:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupRecord:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp_ms: int  # -1: unknown
    members: tuple[MemberRecord, ...]


def _nullable_string(text: str | None) -> bytes:
    return _INT16.pack(-1) if text is None else encode_string(text)


def _bytes(data: bytes) -> bytes:
    return _INT32.pack(len(data)) + bytes(data)


def encode_group_record(record: GroupRecord) -> bytes:
    parts = [
        _INT16.pack(GROUP_METADATA_VALUE_VERSION),
        encode_string(record.protocol_type),
        _INT32.pack(record.generation),
        _nullable_string(record.protocol),
        _nullable_string(record.leader),
        _INT64.pack(record.current_state_timestamp_ms),
        _INT32.pack(len(record.members)),
    ]
    for m in record.members:
        parts += [
            encode_string(m.member_id), _nullable_string(m.group_instance_id), encode_string(m.client_id),
            encode_string(m.client_host), _INT32.pack(m.rebalance_timeout_ms), _INT32.pack(m.session_timeout_ms),
            _bytes(m.subscription), _bytes(m.assignment),
        ]
    return b"".join(parts)


def decode_group_record(data: bytes) -> GroupRecord:
    reader = RecordReader(data)
    version = reader.int16()
    if not 0 <= version <= 4:
        raise ValueError(f"unknown GroupMetadataValue version {version}")
    flexible = version >= 4
    string = reader.compact_string if flexible else reader.string
    nullable = reader.compact_nullable_string if flexible else reader.nullable_string
    blob = reader.compact_bytes if flexible else reader.bytes_field
    protocol_type = string()
    generation = reader.int32()
    protocol = nullable()
    leader = nullable()
    timestamp = reader.int64() if version >= 2 else -1
    count = reader.uvarint() - 1 if flexible else reader.int32()
    members = []
    for _ in range(max(count, 0)):
        member_id = string()
        instance_id = nullable() if version >= 3 else None
        client_id = string()
        client_host = string()
        rebalance_timeout = reader.int32() if version >= 1 else -1
        session_timeout = reader.int32()
        subscription = blob()
        assignment = blob()
        if flexible:
            reader.skip_tagged_fields()
        members.append(MemberRecord(member_id, instance_id, client_id, client_host,
                                    session_timeout if rebalance_timeout < 0 else rebalance_timeout,
                                    session_timeout, subscription, assignment))
    if flexible:
        reader.skip_tagged_fields()
    return GroupRecord(protocol_type, generation, protocol, leader, timestamp, tuple(members))


def record_of(group: ClassicGroup, assignment: dict[str, bytes]) -> GroupRecord:
    """The record Kafka's storeGroup writes: each member's metadata for the chosen protocol and its
    assignment (``assignment`` maps member id to bytes; absent members get none)."""
    protocol = group.protocol_name
    members = tuple(
        MemberRecord(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                     m.session_timeout_ms, m.metadata(protocol) if protocol is not None else b"",
                     assignment.get(m.member_id, b""))
        for m in group.members.values()
    )
    return GroupRecord(group.protocol_type or "", group.generation_id, protocol, group.leader_id,
                       group.state_timestamp_ms if group.state_timestamp_ms is not None else -1, members)


def group_from_record(group_id: str, record: GroupRecord) -> ClassicGroup:
    """Kafka's loadGroup: a group with members comes back Stable, one without comes back Empty."""
    group = ClassicGroup(group_id, GroupState.STABLE if record.members else GroupState.EMPTY,
                         record.current_state_timestamp_ms if record.current_state_timestamp_ms >= 0 else None)
    group.generation_id = record.generation
    group.protocol_type = record.protocol_type or None
    group.protocol_name = record.protocol
    group.leader_id = record.leader
    for m in record.members:
        protocols = [(record.protocol, m.subscription)] if record.protocol is not None else []
        member = Member(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                        m.session_timeout_ms, record.protocol_type, protocols, assignment=m.assignment)
        group.add(member)
    group.subscribed_topics = group.compute_subscribed_topics()
    return group

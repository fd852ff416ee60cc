"""A consumer group's state as Kafka 4's records in ``__consumer_offsets`` (records.py has their codecs):
what to write after a change, and the group rebuilt from what a load replayed.

Which records a change writes, as Kafka's GroupCoordinatorRecordHelpers (each key holds the latest state of
one thing, so compaction keeps a group small):

* ConsumerGroupMemberMetadata (5): a member's subscription and client fields, when they change;
* ConsumerGroupPartitionMetadata (4): the subscribed topics' ids, names and partition counts (the layout
  Kafka 4.0 writes; 4.1 replaced it by a hash in the group metadata and still reads it);
* ConsumerGroupMetadata (3): the group epoch;
* ConsumerGroupTargetAssignmentMember (7) per member whose target changed, then
  ConsumerGroupTargetAssignmentMetadata (6): the assignment epoch;
* ConsumerGroupCurrentMemberAssignment (8): a member's epochs, state and partitions;
* a member that leaves: tombstones of its 8, 7 and 5 records.

``changes`` compares the group with a ``snapshot`` taken before the change, so every path that changes a
group (heartbeat, leave, timeouts) writes exactly what changed. After a write that failed the log's state is
not known: the next write of the group is a ``rewrite``, the whole group.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, replace
from typing import Iterable, Mapping

from pykbroker.groups.consumer import records as r
from pykbroker.groups.consumer.group import (
    ConsumerGroup, ConsumerGroupMember, MemberState, PartitionOwnedError, TopicMetadata, freeze,
)

log = logging.getLogger(__name__)

Record = tuple[bytes, "bytes | None"]


@dataclass(frozen=True)
class Snapshot:
    group_epoch: int
    assignment_epoch: int
    members: dict[str, ConsumerGroupMember]
    target_assignment: dict[str, Mapping[uuid.UUID, frozenset[int]]]
    subscription_metadata: dict[str, TopicMetadata]


def snapshot(group: ConsumerGroup | None) -> Snapshot:
    if group is None:
        return Snapshot(0, 0, {}, {}, {})
    return Snapshot(group.group_epoch, group.assignment_epoch, dict(group.members), dict(group.target_assignment),
                    dict(group.subscription_metadata))


def _topic_partitions(assignment: Mapping[uuid.UUID, frozenset[int]]) -> tuple[r.TopicPartitions, ...]:
    return tuple(r.TopicPartitions(topic_id, tuple(sorted(parts)))
                 for topic_id, parts in sorted(assignment.items(), key=lambda item: str(item[0])) if parts)


def _metadata_fields(member: ConsumerGroupMember) -> tuple:
    return (member.instance_id, member.rack_id, member.client_id, member.client_host, member.subscribed_topic_names,
            member.subscribed_topic_regex, member.rebalance_timeout_ms, member.server_assignor,
            member.classic_session_timeout_ms, member.classic_protocols)


def _classic_metadata(member: ConsumerGroupMember) -> r.ClassicMemberMetadata | None:
    if member.classic_protocols is None:
        return None
    return r.ClassicMemberMetadata(member.classic_session_timeout_ms or 0, tuple(
        r.ClassicProtocol(name, metadata) for name, metadata in member.classic_protocols))


def _assignment_fields(member: ConsumerGroupMember) -> tuple:
    return (member.member_epoch, member.previous_member_epoch, member.state, dict(member.assigned),
            dict(member.pending_revocation))


def _record(key, value) -> Record:
    return r.encode_key(key), None if value is None else r.encode_value(value)


def changes(before: Snapshot, group: ConsumerGroup) -> list[Record]:
    """The records that take the stored group from ``before`` to ``group``, in Kafka's order."""
    gid = group.group_id
    out: list[Record] = []
    for member_id, old in before.members.items():
        if member_id not in group.members:
            out.append(_record(r.ConsumerGroupCurrentMemberAssignmentKey(gid, member_id), None))
            out.append(_record(r.ConsumerGroupTargetAssignmentMemberKey(gid, member_id), None))
            out.append(_record(r.ConsumerGroupMemberMetadataKey(gid, member_id), None))
    for member_id, member in group.members.items():
        old = before.members.get(member_id)
        if old is None or _metadata_fields(old) != _metadata_fields(member):
            out.append(_record(r.ConsumerGroupMemberMetadataKey(gid, member_id), r.ConsumerGroupMemberMetadataValue(
                instance_id=member.instance_id, rack_id=member.rack_id, client_id=member.client_id,
                client_host=member.client_host, subscribed_topic_names=tuple(sorted(member.subscribed_topic_names)),
                subscribed_topic_regex=member.subscribed_topic_regex,
                rebalance_timeout_ms=member.rebalance_timeout_ms, server_assignor=member.server_assignor,
                classic_member_metadata=_classic_metadata(member))))
    if group.subscription_metadata != before.subscription_metadata:
        out.append(_record(r.ConsumerGroupPartitionMetadataKey(gid), r.ConsumerGroupPartitionMetadataValue(tuple(
            r.TopicMetadata(t.topic_id, t.name, t.num_partitions) for t in group.subscription_metadata.values()))))
    if group.group_epoch != before.group_epoch:
        out.append(_record(r.ConsumerGroupMetadataKey(gid), r.ConsumerGroupMetadataValue(group.group_epoch)))
    if group.assignment_epoch != before.assignment_epoch:
        for member_id in group.members:
            target = dict(group.target_of(member_id))
            if member_id not in before.target_assignment or dict(before.target_assignment[member_id]) != target:
                out.append(_record(r.ConsumerGroupTargetAssignmentMemberKey(gid, member_id),
                                   r.ConsumerGroupTargetAssignmentMemberValue(_topic_partitions(target))))
        out.append(_record(r.ConsumerGroupTargetAssignmentMetadataKey(gid),
                           r.ConsumerGroupTargetAssignmentMetadataValue(group.assignment_epoch)))
    else:  # a static member's new id takes the old one's target without a new assignment
        for member_id in group.members:
            if member_id not in before.target_assignment and member_id in group.target_assignment:
                out.append(_record(r.ConsumerGroupTargetAssignmentMemberKey(gid, member_id),
                                   r.ConsumerGroupTargetAssignmentMemberValue(
                                       _topic_partitions(group.target_of(member_id)))))
    for member_id, member in group.members.items():
        old = before.members.get(member_id)
        if old is None or _assignment_fields(old) != _assignment_fields(member):
            out.append(_record(r.ConsumerGroupCurrentMemberAssignmentKey(gid, member_id),
                               r.ConsumerGroupCurrentMemberAssignmentValue(
                                   member_epoch=member.member_epoch, previous_member_epoch=member.previous_member_epoch,
                                   state=int(member.state), assigned_partitions=_topic_partitions(member.assigned),
                                   partitions_pending_revocation=_topic_partitions(member.pending_revocation))))
    return out


def rewrite(group: ConsumerGroup, stored_member_ids: Iterable[str]) -> list[Record]:
    """Every record of the group as it is now, and tombstones for the other members the log may hold
    (``stored_member_ids``): what follows a failed write, after which the log's state is not known."""
    gone = {member_id: None for member_id in stored_member_ids if member_id not in group.members}
    return changes(Snapshot(-1, -1, gone, {}, None), group)  # type: ignore[arg-type]  (every field differs)


def _assignment(topic_partitions) -> dict[uuid.UUID, frozenset[int]]:
    return freeze({tp.topic_id: tp.partitions for tp in topic_partitions})


def replay(group_id: str, stored: Mapping[bytes, bytes]) -> ConsumerGroup | None:
    """The group rebuilt from its latest records (key -> value, tombstones already applied); None when
    they hold no group (only tombstones were left, or only records of types this coordinator does not
    know). An unreadable record is logged and skipped, as Kafka's loader skips it."""
    group = ConsumerGroup(group_id)
    metadata: dict[str, r.ConsumerGroupMemberMetadataValue] = {}
    current: dict[str, r.ConsumerGroupCurrentMemberAssignmentValue] = {}
    found = False
    for key_bytes, value_bytes in stored.items():
        try:
            key = r.decode_key(key_bytes)
            if key is None:
                continue
            value = r.decode_value(key, value_bytes)
        except (ValueError, UnicodeDecodeError) as exc:
            log.warning("group %s: skipping an unreadable record: %s", group_id, exc)
            continue
        found = True
        if isinstance(value, r.ConsumerGroupMetadataValue):
            group.group_epoch = value.epoch
        elif isinstance(value, r.ConsumerGroupPartitionMetadataValue):
            group.subscription_metadata = {t.topic_name: TopicMetadata(t.topic_id, t.topic_name, t.num_partitions)
                                           for t in value.topics}
        elif isinstance(value, r.ConsumerGroupMemberMetadataValue):
            metadata[key.member_id] = value
        elif isinstance(value, r.ConsumerGroupTargetAssignmentMetadataValue):
            group.assignment_epoch = value.assignment_epoch
        elif isinstance(value, r.ConsumerGroupTargetAssignmentMemberValue):
            group.target_assignment[key.member_id] = _assignment(value.topic_partitions)
        elif isinstance(value, r.ConsumerGroupCurrentMemberAssignmentValue):
            current[key.member_id] = value
    if not found:
        return None
    for member_id, meta in metadata.items():
        assignment = current.get(member_id)
        try:
            state = MemberState(assignment.state) if assignment is not None else MemberState.STABLE
        except ValueError:
            state = MemberState.UNKNOWN
        member = ConsumerGroupMember(
            member_id, instance_id=meta.instance_id, rack_id=meta.rack_id,
            rebalance_timeout_ms=meta.rebalance_timeout_ms, client_id=meta.client_id, client_host=meta.client_host,
            subscribed_topic_names=tuple(meta.subscribed_topic_names), subscribed_topic_regex=meta.subscribed_topic_regex,
            server_assignor=meta.server_assignor,
            classic_session_timeout_ms=(meta.classic_member_metadata.session_timeout_ms
                                        if meta.classic_member_metadata is not None else None),
            classic_protocols=(tuple((p.name, bytes(p.metadata)) for p in meta.classic_member_metadata.supported_protocols)
                               if meta.classic_member_metadata is not None else None),
            member_epoch=assignment.member_epoch if assignment is not None else 0,
            previous_member_epoch=assignment.previous_member_epoch if assignment is not None else 0,
            state=state,
            assigned=_assignment(assignment.assigned_partitions) if assignment is not None else {},
            pending_revocation=_assignment(assignment.partitions_pending_revocation) if assignment is not None else {})
        try:
            group.update_member(member)
        except PartitionOwnedError as exc:  # records of two members holding one partition: the first keeps it
            log.warning("group %s: member %s loaded without its partitions: %s", group_id, member_id, exc)
            group.update_member(replace(member, assigned={}, pending_revocation={}))
    group.target_assignment = {m: t for m, t in group.target_assignment.items() if m in group.members}
    return group


def tombstones(group: ConsumerGroup, stored_member_ids: Iterable[str] = ()) -> list[Record]:
    """Every record of a group, deleted (a group removed), with those of other members the log may hold."""
    gid = group.group_id
    out: list[Record] = []
    for member_id in dict.fromkeys([*group.members, *stored_member_ids]):
        out.append(_record(r.ConsumerGroupCurrentMemberAssignmentKey(gid, member_id), None))
        out.append(_record(r.ConsumerGroupTargetAssignmentMemberKey(gid, member_id), None))
        out.append(_record(r.ConsumerGroupMemberMetadataKey(gid, member_id), None))
    out.append(_record(r.ConsumerGroupTargetAssignmentMetadataKey(gid), None))
    out.append(_record(r.ConsumerGroupPartitionMetadataKey(gid), None))
    out.append(_record(r.ConsumerGroupMetadataKey(gid), None))
    return out

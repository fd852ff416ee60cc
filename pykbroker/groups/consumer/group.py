"""One consumer group of the new protocol (KIP-848) and its members, as Kafka 4's modern/consumer/ConsumerGroup,
ConsumerGroupMember and CurrentAssignmentBuilder keep them.

Epochs. The *group epoch* goes up whenever what the assignment depends on changes (a member joins or
leaves, a subscription changes, a subscribed topic is created, deleted or grows). The *target assignment*
is computed by the server-side assignor for one group epoch (the *assignment epoch*). Each member has its
own *member epoch*: the target epoch it has reconciled to. A member moves towards its target partition by
partition, as ``reconcile`` (Kafka's CurrentAssignmentBuilder) says:

* partitions it owns that its target no longer has are first *revoked* (state UNREVOKED_PARTITIONS; the
  member stays at its epoch until a heartbeat no longer reports them as owned),
* partitions of its target still held (at any epoch) by another member are *unreleased*: they are given
  only once that member has given them up (state UNRELEASED_PARTITIONS),
* otherwise the member gets its whole target and the target's epoch (STABLE).

So no partition is ever owned by two members at once. ``partition_epochs`` is Kafka's
currentPartitionEpoch: who holds each partition (assigned or pending revocation), at which member epoch.
"""

from __future__ import annotations

import copy
import enum
import uuid
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping

Assignment = Mapping[uuid.UUID, frozenset[int]]  # topic id -> partitions

JOIN_GROUP_MEMBER_EPOCH = 0
LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2
NO_PARTITION_EPOCH = -1


class PartitionOwnedError(Exception):
    """A member given a partition another member still holds (Kafka's IllegalStateException of
    addPartitionEpochs): a bug, refused rather than overwriting who holds the partition."""


class MemberFencedError(Exception):
    """Kafka's FencedMemberEpochException out of reconciliation: the member must rejoin."""


class MemberState(enum.IntEnum):
    """Kafka's modern MemberState (the byte stored in ConsumerGroupCurrentMemberAssignmentValue.State)."""

    STABLE = 0
    UNREVOKED_PARTITIONS = 1
    UNRELEASED_PARTITIONS = 2
    UNKNOWN = 127


class GroupState(enum.Enum):
    """Kafka's ConsumerGroup.ConsumerGroupState, by the names ListGroups / ConsumerGroupDescribe show."""

    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


def freeze(assignment: Mapping[uuid.UUID, Iterable[int]]) -> dict[uuid.UUID, frozenset[int]]:
    """An assignment without empty topics, each topic's partitions a frozenset."""
    return {topic_id: frozenset(parts) for topic_id, parts in assignment.items() if parts}


def is_subset(owned: Mapping[uuid.UUID, Iterable[int]], assigned: Assignment) -> bool:
    return all(set(parts) <= assigned.get(topic_id, frozenset()) for topic_id, parts in owned.items())


@dataclass(frozen=True)
class ConsumerGroupMember:
    """Kafka's ConsumerGroupMember: immutable, replaced as a whole by each change."""

    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    assigned: Mapping[uuid.UUID, frozenset[int]] = field(default_factory=dict)
    pending_revocation: Mapping[uuid.UUID, frozenset[int]] = field(default_factory=dict)
    # A member still speaking the classic protocol (JoinGroup / SyncGroup / Heartbeat) in a consumer group:
    # its JoinGroup's session timeout and protocols (Kafka's classicMemberMetadata); None for the new protocol.
    classic_session_timeout_ms: int | None = None
    classic_protocols: tuple[tuple[str, bytes], ...] | None = None

    @property
    def uses_classic_protocol(self) -> bool:
        return self.classic_protocols is not None

    def with_epoch(self, epoch: int, **changes) -> "ConsumerGroupMember":
        """Kafka's Builder.updateMemberEpoch: the previous epoch remembers the current one."""
        return replace(self, member_epoch=epoch, previous_member_epoch=self.member_epoch, **changes)

    def is_reconciled_to(self, target_epoch: int) -> bool:
        return self.state is MemberState.STABLE and self.member_epoch == target_epoch


def reconcile(member: ConsumerGroupMember, target_epoch: int, target: Assignment,
              partition_epoch: Callable[[uuid.UUID, int], int],
              owned: Mapping[uuid.UUID, Iterable[int]] | None) -> ConsumerGroupMember:
    """Kafka's CurrentAssignmentBuilder.build: the member's next step towards its target assignment.
    ``owned``: the partitions the heartbeat says the member owns (None: it did not say). A member in the
    UNKNOWN state that still owns partitions (or did not say) is fenced: MemberFencedError."""

    def owns_any(revocation: Assignment) -> bool:
        if owned is None:
            return True  # Kafka's rule: without the owned partitions, assume nothing was revoked yet
        return any(p in revocation.get(topic_id, ()) for topic_id, parts in owned.items() for p in parts)

    def next_assignment(epoch: int, current: Assignment) -> ConsumerGroupMember:
        unreleased = False
        assigned: dict[uuid.UUID, frozenset[int]] = {}
        revoking: dict[uuid.UUID, frozenset[int]] = {}
        adding: dict[uuid.UUID, frozenset[int]] = {}
        for topic_id in set(target) | set(current):
            wanted = target.get(topic_id, frozenset())
            have = current.get(topic_id, frozenset())
            keep = have & wanted
            pending = wanted - keep
            free = frozenset(p for p in pending if partition_epoch(topic_id, p) == NO_PARTITION_EPOCH
                             or p in member.pending_revocation.get(topic_id, ()))  # only it holds them: released
            unreleased = unreleased or free != pending
            if keep:
                assigned[topic_id] = keep
            if have - keep:
                revoking[topic_id] = have - keep
            if free:
                adding[topic_id] = free
        if revoking and owns_any(revoking):
            return member.with_epoch(epoch, state=MemberState.UNREVOKED_PARTITIONS, assigned=assigned,
                                     pending_revocation=revoking)
        for topic_id, parts in adding.items():
            assigned[topic_id] = assigned.get(topic_id, frozenset()) | parts
        state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
        return member.with_epoch(target_epoch, state=state, assigned=assigned, pending_revocation={})

    if member.state is MemberState.STABLE:
        if member.member_epoch != target_epoch:
            return next_assignment(member.member_epoch, member.assigned)
        return member
    if member.state is MemberState.UNREVOKED_PARTITIONS:
        if owns_any(member.pending_revocation):
            return member
        return next_assignment(min(member.member_epoch + 1, target_epoch), member.assigned)
    if member.state is MemberState.UNRELEASED_PARTITIONS:
        return next_assignment(member.member_epoch, member.assigned)
    if owned is None or owned:  # UNKNOWN (a state of a newer Kafka): it starts again from no partitions
        raise MemberFencedError("The consumer group member is in a unknown state. The member must abandon all its "
                                "partitions and rejoin.")
    return next_assignment(target_epoch, member.assigned)


@dataclass(frozen=True)
class TopicMetadata:
    """A subscribed topic as the group saw it when it last computed its assignment."""

    topic_id: uuid.UUID
    name: str
    num_partitions: int


class ConsumerGroup:
    """Kafka's ConsumerGroup: the members, the epochs, the target assignment and who holds each partition."""

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, ConsumerGroupMember] = {}
        self.static_members: dict[str, str] = {}  # instance id -> member id
        self.target_assignment: dict[str, dict[uuid.UUID, frozenset[int]]] = {}  # member id -> target
        self.partition_epochs: dict[tuple[uuid.UUID, int], int] = {}
        self.subscription_metadata: dict[str, TopicMetadata] = {}  # topic name -> metadata
        self.resolved_regexes: dict[str, frozenset[str]] = {}  # regex -> the topic names it matched
        self.subscribers: dict[str, int] = {}  # topic name -> how many members subscribe to it by name
        self.regex_subscribers: dict[str, int] = {}  # regex -> how many members subscribe with it
        self.subscriptions_version = 0  # goes up whenever a member's subscription changes
        self.subscription_key: tuple | None = None  # (topics version, subscriptions version) of the metadata

    @property
    def state(self) -> GroupState:
        if not self.members:
            return GroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return GroupState.ASSIGNING
        if any(not m.is_reconciled_to(self.assignment_epoch) for m in self.members.values()):
            return GroupState.RECONCILING
        return GroupState.STABLE

    def is_empty(self) -> bool:
        return not self.members

    def checkpoint(self) -> dict:
        """The group's state, for ``restore`` if a change fails midway (without the subscriber counts, which can
        be large and are counted again from the members)."""
        return {name: copy.copy(value) for name, value in vars(self).items()
                if name not in ("subscribers", "regex_subscribers")}

    def restore(self, saved: dict) -> None:
        vars(self).clear()
        vars(self).update(saved)
        self.subscribers, self.regex_subscribers = {}, {}
        for member in self.members.values():
            self._count_subscription(member, 1)

    def static_member(self, instance_id: str | None) -> ConsumerGroupMember | None:
        member_id = self.static_members.get(instance_id) if instance_id is not None else None
        return self.members.get(member_id) if member_id is not None else None

    def partition_epoch(self, topic_id: uuid.UUID, partition: int) -> int:
        return self.partition_epochs.get((topic_id, partition), NO_PARTITION_EPOCH)

    def update_member(self, new: ConsumerGroupMember) -> None:
        """Add or replace a member (Kafka's updateMember), keeping who-holds-what current; a partition another
        member still holds is refused (PartitionOwnedError, nothing changed), as Kafka's addPartitionEpochs."""
        old = self.members.get(new.member_id)
        self._check_unowned(old, new)
        if old is None or (old.subscribed_topic_names, old.subscribed_topic_regex) != (
                new.subscribed_topic_names, new.subscribed_topic_regex):
            if old is not None:
                self._count_subscription(old, -1)
            self._count_subscription(new, 1)
        if old is not None:
            self._drop_partition_epochs(old)
        self.members[new.member_id] = new
        if new.instance_id is not None:
            self.static_members[new.instance_id] = new.member_id
        for assignment in (new.assigned, new.pending_revocation):
            for topic_id, parts in assignment.items():
                for p in parts:
                    self.partition_epochs[(topic_id, p)] = new.member_epoch

    def remove_member(self, member_id: str) -> ConsumerGroupMember | None:
        old = self.members.pop(member_id, None)
        if old is None:
            return None
        self._count_subscription(old, -1)
        self._drop_partition_epochs(old)
        if old.instance_id is not None and self.static_members.get(old.instance_id) == member_id:
            del self.static_members[old.instance_id]
        self.target_assignment.pop(member_id, None)
        return old

    def _check_unowned(self, old: ConsumerGroupMember | None, new: ConsumerGroupMember) -> None:
        """Every partition ``new`` holds is free once ``old`` (the member's previous state) gave its own up."""
        for assignment in (new.assigned, new.pending_revocation):
            for topic_id, parts in assignment.items():
                for p in parts:
                    epoch = self.partition_epochs.get((topic_id, p))
                    if epoch is None or (old is not None and epoch == old.member_epoch
                                         and (p in old.assigned.get(topic_id, ())
                                              or p in old.pending_revocation.get(topic_id, ()))):
                        continue
                    raise PartitionOwnedError(f"Cannot set the epoch of {topic_id}-{p} to {new.member_epoch} for "
                                              f"member {new.member_id} because the partition is still owned at "
                                              f"epoch {epoch}.")

    def _count_subscription(self, member: ConsumerGroupMember, delta: int) -> None:
        """Keep the per-topic and per-regex subscriber counts of the group as ``member`` comes (1) or goes (-1)."""
        counts = [(self.subscribers, name) for name in member.subscribed_topic_names]
        if member.subscribed_topic_regex:
            counts.append((self.regex_subscribers, member.subscribed_topic_regex))
        for table, key in counts:
            left = table.get(key, 0) + delta
            if left > 0:
                table[key] = left
            else:
                table.pop(key, None)
        self.subscriptions_version += 1

    def _drop_partition_epochs(self, member: ConsumerGroupMember) -> None:
        for assignment in (member.assigned, member.pending_revocation):
            for topic_id, parts in assignment.items():
                for p in parts:
                    if self.partition_epochs.get((topic_id, p)) == member.member_epoch:
                        del self.partition_epochs[(topic_id, p)]

    def waiting_on_unreleased_partition(self, member: ConsumerGroupMember) -> bool:
        """Kafka's waitingOnUnreleasedPartition: a partition of the member's target not yet given to it is still
        held by another member."""
        if member.state is not MemberState.UNRELEASED_PARTITIONS:
            return False
        for topic_id, parts in self.target_of(member.member_id).items():
            have = member.assigned.get(topic_id, frozenset())
            if any(p not in have and self.partition_epoch(topic_id, p) != NO_PARTITION_EPOCH for p in parts):
                return True
        return False

    def target_of(self, member_id: str) -> Mapping[uuid.UUID, frozenset[int]]:
        return self.target_assignment.get(member_id, {})

    def preferred_assignor(self, default: str) -> str:
        """Kafka's computePreferredServerAssignor: the assignor most members name, else the default."""
        counts: dict[str, int] = {}
        for member in self.members.values():
            if member.server_assignor is not None:
                counts[member.server_assignor] = counts.get(member.server_assignor, 0) + 1
        if not counts:
            return default
        return max(counts.items(), key=lambda item: (item[1], item[0]))[0]

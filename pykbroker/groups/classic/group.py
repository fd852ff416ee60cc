"""One classic consumer group: its members, state machine, generation and protocol choice.

This is the data half of Kafka's classic group coordinator (``GroupMetadata`` and ``MemberMetadata`` in
Kafka 3.x): what a group knows and the rules for changing it. The coordinator (coordinator.py) drives
it from requests and timers; nothing here does I/O or knows about time beyond the timestamps it is given.

States and what moves a group between them (Kafka's own table):

    Empty               no members (or only offsets, a "simple" group)     -> PreparingRebalance on a join
    PreparingRebalance  waiting for every known member to (re)join          -> CompletingRebalance, Empty
    CompletingRebalance joined; waiting for the leader's SyncGroup          -> Stable, PreparingRebalance
    Stable              assignments handed out; heartbeats keep members     -> PreparingRebalance
    Dead                removed (deleted, or expired with no offsets left)

A member waiting for its JoinGroup or SyncGroup answer holds a callback; the coordinator calls it once,
through ``invoke_join_callback`` / ``invoke_sync_callback``, and the group counts members awaiting a join
the way Kafka does (``num_awaiting_join``), because "has everybody rejoined" decides when a rebalance ends.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from pykbroker.groups.consumer_protocol import decode_subscription
from pykbroker.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

CONSUMER_PROTOCOL_TYPE = "consumer"
NO_GENERATION = -1
UNKNOWN_MEMBER_ID = ""


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_VALID_PREVIOUS_STATES = {
    GroupState.PREPARING_REBALANCE: {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY},
    GroupState.COMPLETING_REBALANCE: {GroupState.PREPARING_REBALANCE},
    GroupState.STABLE: {GroupState.COMPLETING_REBALANCE},
    GroupState.DEAD: set(GroupState),
    GroupState.EMPTY: {GroupState.PREPARING_REBALANCE},
}


@dataclass(frozen=True)
class JoinResult:
    """The answer to one JoinGroup. ``members`` (member id, group instance id, metadata) goes to the leader."""

    error: ErrorCode
    member_id: str
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    members: tuple[tuple[str, str | None, bytes], ...] = ()


@dataclass(frozen=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


JoinCallback = Callable[[JoinResult], None]
SyncCallback = Callable[[SyncResult], None]
Protocols = list[tuple[str, bytes]]


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    assignment: bytes = b""
    awaiting_join: JoinCallback | None = None
    awaiting_sync: SyncCallback | None = None
    # A member added by a JoinGroup still in flight: its session timer is the new-member join timeout and
    # "awaiting join" does not count as a heartbeat (it could be a client that gave up and retried).
    is_new: bool = False
    # Liveness since the session timer was last armed (Kafka's heartbeatSatisfied).
    heartbeat_satisfied: bool = False
    heartbeat_timer: Any = None  # the coordinator's handle for this member's session timer

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    @property
    def is_awaiting_join(self) -> bool:
        return self.awaiting_join is not None

    @property
    def is_awaiting_sync(self) -> bool:
        return self.awaiting_sync is not None

    def has_satisfied_heartbeat(self) -> bool:
        if self.is_new:
            return self.heartbeat_satisfied
        if self.is_awaiting_join or self.is_awaiting_sync:
            return True  # a member parked in a rebalance step cannot heartbeat on that connection
        return self.heartbeat_satisfied

    def metadata(self, protocol: str) -> bytes:
        for name, data in self.protocols:
            if name == protocol:
                return data
        raise ValueError(f"member {self.member_id} does not support protocol {protocol}")

    def matches(self, protocols: Protocols) -> bool:
        """Same protocols, in the same order, with the same metadata."""
        return [(n, bytes(m)) for n, m in protocols] == [(n, bytes(m)) for n, m in self.protocols]

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol (its list is in preference order) among the candidates."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")


@dataclass(frozen=True)
class MemberSummary:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupSummary:
    """What DescribeGroups shows: metadata and assignments only for a Stable group, as Kafka does."""

    state: str
    protocol_type: str
    protocol: str
    members: tuple[MemberSummary, ...] = ()


DEAD_GROUP_SUMMARY = GroupSummary(GroupState.DEAD.value, "", "")


@dataclass(frozen=True)
class GroupOverview:
    """One ListGroups entry."""

    group_id: str
    protocol_type: str
    state: str
    group_type: str = "classic"


class ClassicGroup:
    def __init__(self, group_id: str, state: GroupState = GroupState.EMPTY, now_ms: int | None = None) -> None:
        self.group_id = group_id
        self.state = state
        # When the group entered its state; for an Empty group, offsets retention counts from here.
        # None only for a group loaded from a record too old to carry it.
        self.state_timestamp_ms: int | None = now_ms
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.generation_id = 0
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}  # group.instance.id -> member id
        self.pending_members: set[str] = set()  # got MEMBER_ID_REQUIRED, not joined yet
        self.pending_sync_members: set[str] = set()  # joined this generation, SyncGroup not seen yet
        self.num_awaiting_join = 0
        self._protocol_support: Counter[str] = Counter()
        self.subscribed_topics: frozenset[str] | None = None
        self.new_member_added = False  # a member joined during the initial rebalance delay
        # The coordinator's timers for this group: the join phase and the sync phase.
        self.join_timer: Any = None
        self.sync_timer: Any = None

    def __repr__(self) -> str:
        return (f"ClassicGroup({self.group_id!r}, {self.state.value}, generation={self.generation_id}, "
                f"members={list(self.members)})")

    # -- questions --------------------------------------------------------------------------------------

    def is_state(self, *states: GroupState) -> bool:
        return self.state in states

    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def get(self, member_id: str) -> Member:
        return self.members[member_id]

    def size(self) -> int:
        return len(self.members)

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def can_rebalance(self) -> bool:
        return self.state in _VALID_PREVIOUS_STATES[GroupState.PREPARING_REBALANCE]

    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.num_awaiting_join and not self.pending_members

    def not_yet_rejoined(self) -> list[Member]:
        return [m for m in self.members.values() if not m.is_awaiting_join]

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def is_consumer_group(self) -> bool:
        return self.protocol_type == CONSUMER_PROTOCOL_TYPE

    def is_subscribed_to(self, topic: str) -> bool:
        """True when unknown: a group whose subscriptions cannot be read keeps every topic, to be safe."""
        return self.subscribed_topics is None or topic in self.subscribed_topics

    def static_member_id(self, group_instance_id: str | None) -> str | None:
        return None if group_instance_id is None else self.static_members.get(group_instance_id)

    def supports_protocols(self, protocol_type: str, protocols: Iterable[str]) -> bool:
        names = set(protocols)
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(names)
        return self.protocol_type == protocol_type and any(
            self._protocol_support[name] == len(self.members) for name in names)

    def select_protocol(self) -> str:
        """The protocol every member supports that most members prefer (Kafka's vote)."""
        if not self.members:
            raise ValueError("cannot select a protocol for an empty group")
        candidates = {name for name, count in self._protocol_support.items() if count == len(self.members)}
        votes = Counter(member.vote(candidates) for member in self.members.values())
        return max(votes, key=lambda name: votes[name])  # ties: the first protocol voted for

    def has_received_sync_from_all_members(self) -> bool:
        return not self.pending_sync_members

    # -- changes ----------------------------------------------------------------------------------------

    def transition_to(self, state: GroupState, now_ms: int) -> None:
        if self.state not in _VALID_PREVIOUS_STATES[state]:
            raise ValueError(f"group {self.group_id} cannot move from {self.state.value} to {state.value}")
        self.state = state
        self.state_timestamp_ms = now_ms

    def generate_member_id(self, client_id: str, group_instance_id: str | None) -> str:
        return f"{group_instance_id if group_instance_id is not None else client_id}-{uuid.uuid4()}"

    def add(self, member: Member, callback: JoinCallback | None = None) -> None:
        if member.group_instance_id is not None:
            if member.group_instance_id in self.static_members:
                raise ValueError(f"static member {member.group_instance_id} is already in group {self.group_id}")
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self._protocol_support.update(name for name, _ in member.protocols)
        member.awaiting_join = callback
        if callback is not None:
            self.num_awaiting_join += 1
        self.pending_members.discard(member.member_id)

    def remove(self, member_id: str) -> None:
        member = self.members.pop(member_id, None)
        if member is not None:
            self._protocol_support.subtract(name for name, _ in member.protocols)
            if member.is_awaiting_join:
                self.num_awaiting_join -= 1
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_members.discard(member_id)
        self.pending_sync_members.discard(member_id)

    def update_member(self, member: Member, protocols: Protocols, rebalance_timeout_ms: int,
                      session_timeout_ms: int, callback: JoinCallback | None) -> None:
        self._protocol_support.subtract(name for name, _ in member.protocols)
        member.protocols = list(protocols)
        self._protocol_support.update(name for name, _ in member.protocols)
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        if callback is not None and not member.is_awaiting_join:
            self.num_awaiting_join += 1
        elif callback is None and member.is_awaiting_join:
            self.num_awaiting_join -= 1
        member.awaiting_join = callback

    def replace_static_member(self, group_instance_id: str, old_member_id: str, new_member_id: str) -> Member:
        """A static member came back with a new member id: the old id is fenced, everything else is kept."""
        member = self.members.pop(old_member_id)
        # Fence a duplicate instance still waiting for an answer under the old id.
        self.invoke_join_callback(member, JoinResult(ErrorCode.fenced_instance_id, old_member_id))
        self.invoke_sync_callback(member, SyncResult(ErrorCode.fenced_instance_id))
        member.member_id = new_member_id
        self.members[new_member_id] = member
        if self.leader_id == old_member_id:
            self.leader_id = new_member_id
        self.static_members[group_instance_id] = new_member_id
        return member

    def add_pending_member(self, member_id: str) -> None:
        if member_id in self.members:
            raise ValueError(f"pending member {member_id} is already a member of {self.group_id}")
        self.pending_members.add(member_id)

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep the leader if it rejoined, else pick any member that did; False if nobody rejoined."""
        if self.leader_id is None:
            return False
        if self.members[self.leader_id].is_awaiting_join:
            return True
        for member_id, member in self.members.items():
            if member.is_awaiting_join:
                log.info("group %s: leader %s did not rejoin in time; %s leads now", self.group_id,
                         self.leader_id, member_id)
                self.leader_id = member_id
                return True
        return False

    def invoke_join_callback(self, member: Member, result: JoinResult) -> None:
        callback = member.awaiting_join
        if callback is not None:
            member.awaiting_join = None
            self.num_awaiting_join -= 1
            callback(result)

    def invoke_sync_callback(self, member: Member, result: SyncResult) -> bool:
        callback = member.awaiting_sync
        if callback is None:
            return False
        member.awaiting_sync = None
        callback(result)
        return True

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(GroupState.EMPTY, now_ms)
        self.pending_sync_members.clear()

    def compute_subscribed_topics(self) -> frozenset[str] | None:
        """Topics the members subscribe to (consumer protocol only); None when that cannot be known."""
        if not (self.is_consumer_group() and self.members and self.protocol_name):
            return None
        topics: set[str] = set()
        for member in self.members.values():
            found = subscription_topics(member.metadata(self.protocol_name))
            if found is None:
                return None
            topics.update(found)
        return frozenset(topics)

    # -- views ------------------------------------------------------------------------------------------

    def current_member_metadata(self) -> tuple[tuple[str, str | None, bytes], ...]:
        """What the leader gets in its JoinGroup answer: every member's metadata for the chosen protocol."""
        if self.state in (GroupState.DEAD, GroupState.PREPARING_REBALANCE) or self.protocol_name is None:
            raise ValueError(f"no member metadata for group {self.group_id} in state {self.state.value}")
        return tuple((m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
                     for m in self.members.values())

    def summary(self) -> GroupSummary:
        if self.state is GroupState.STABLE and self.protocol_name is not None:
            members = tuple(MemberSummary(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                          m.metadata(self.protocol_name), m.assignment)
                            for m in self.members.values())
            return GroupSummary(self.state.value, self.protocol_type or "", self.protocol_name, members)
        members = tuple(MemberSummary(m.member_id, m.group_instance_id, m.client_id, m.client_host, b"", b"")
                        for m in self.members.values())
        return GroupSummary(self.state.value, self.protocol_type or "", "", members)

    def overview(self) -> GroupOverview:
        return GroupOverview(self.group_id, self.protocol_type or "", self.state.value)


def subscription_topics(metadata: bytes) -> list[str] | None:
    """The topics of a consumer protocol Subscription; None if the bytes are not one."""
    try:
        return list(decode_subscription(metadata).topics)
    except ValueError:
        return None

"""The group coordinator: classic consumer groups (JoinGroup/SyncGroup/Heartbeat/LeaveGroup) and their
committed offsets.

A port of Kafka 3.x's classic ``GroupCoordinator`` (core/src/main/scala/kafka/coordinator/group), rule for
rule, onto one asyncio loop: where Kafka holds a group lock we run to completion, where Kafka parks a
delayed operation in a purgatory we arm a timer. The rules worth knowing:

* JoinGroup v4+ without a member id gets MEMBER_ID_REQUIRED and a fresh id (``client.id-<uuid>``; a static
  member's is ``group.instance.id-<uuid>``); the id is "pending" until it joins again, for one session
  timeout. A join moves the group to PreparingRebalance; the join phase ends when every known member has
  rejoined and no pending member is left, or at the rebalance timeout (the largest ``rebalance_timeout``
  of the members), when dynamic members that did not rejoin are dropped. An Empty group first waits
  ``group.initial.rebalance.delay.ms``, extended by the same again while new members keep arriving, up to
  the rebalance timeout. Then the generation goes up, the protocol every member supports that most members
  prefer is chosen, and the leader (the first member, or any rejoined one if it did not) gets every
  member's metadata in its JoinGroup answer.
* SyncGroup from the leader carries the assignment; every member gets its part (an empty byte string if
  the leader named none). Members that do not send SyncGroup within the rebalance timeout are dropped.
* Each member has a session timer, re-armed by heartbeats, commits and rebalance steps; a member whose
  timer runs out is removed and the group rebalances. A member parked in JoinGroup/SyncGroup counts as
  alive (except a brand-new one, which has five minutes to finish its first join).
* Static members (``group.instance.id``) keep their place: rejoining with a new member id replaces the
  old one without a rebalance when nothing changed, and the old id is FENCED_INSTANCE_ID from then on.
  Only dynamic members are dropped for not rejoining in time.
* Offsets: a commit with generation -1 and no member id is a "simple" commit, valid only while the group
  has no members; otherwise member id and generation must be current (UNKNOWN_MEMBER_ID,
  ILLEGAL_GENERATION) and the group not waiting for its SyncGroup (REBALANCE_IN_PROGRESS).
* Transactional offsets (TxnOffsetCommit) are checked like commits (from v3: member id, generation, group
  instance id) and stored pending for (group, producer id) until the transaction's marker is written to the
  group's partition: ``on_transaction_marker`` commits or drops them (offset_store.py has the rules). A
  group with pending transactional offsets is not removed as finished; OffsetFetch with require_stable
  answers UNSTABLE_OFFSET_COMMIT for partitions that have some (``unstable_offsets``).
* A group's membership is written to ``__consumer_offsets`` (Kafka's GroupMetadataValue, see
  group_record.py) when it becomes Stable or Empty, and reloaded with its partition (see below): members of
  a loaded Stable group keep their generation and must heartbeat within their session timeout.
* Every ``offsets.retention.check.interval.ms`` offsets expire: those of an Empty group
  ``offsets.retention.minutes`` after it became empty, those of a "simple" group that long after their
  commit, and in a Stable consumer group those of topics nobody subscribes to any more; an Empty group
  left without offsets is then removed.

Which groups this broker coordinates (Kafka's GroupMetadataManager ownership): those whose
``__consumer_offsets`` partition it leads. ``on_leadership_change`` is called for every such partition
(by the cluster node after each LeaderAndIsr; on a single broker, for every partition at start and when the
topic is created). Becoming leader loads the partition's groups and offsets from its log in a background
task: COORDINATOR_LOAD_IN_PROGRESS for those groups meanwhile. Becoming follower unloads them as Kafka's
onResignation does: each group goes Dead, members parked in JoinGroup/SyncGroup are answered
NOT_COORDINATOR, timers stop. A group whose partition this broker does not lead gets NOT_COORDINATOR (the
client asks FindCoordinator again). Commits and group metadata are answered only once their append to
``__consumer_offsets`` is acknowledged (with followers: replicated to the ISR), with Kafka's error mapping
(offset_store.coordinator_error): an answer may therefore come in a later loop step, through the same
callbacks JoinGroup and SyncGroup already use.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Protocol

from pykbroker.groups.classic.group import (
    DEAD_GROUP_SUMMARY,
    NO_GENERATION,
    UNKNOWN_MEMBER_ID,
    ClassicGroup,
    GroupOverview,
    GroupState,
    GroupSummary,
    JoinCallback,
    JoinResult,
    Member,
    Protocols,
    SyncCallback,
    SyncResult,
)
from pykbroker.groups.classic.records import decode_group_record, encode_group_record, group_from_record, record_of
from pykbroker.groups.consumer_protocol import encode_assignment, subscription_version
from pykbroker.groups.offset_store import OFFSETS_TOPIC, CommittedOffset, OffsetStore
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.records import NO_PRODUCER_ID

log = logging.getLogger(__name__)

OFFSET_METADATA_MAX_BYTES = 4096  # Kafka's offset.metadata.max.bytes
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000  # Kafka's GroupCoordinator.NewMemberJoinTimeoutMs
INT32_MAX = 2**31 - 1

TopicPartition = tuple[str, int]

# APIs whose group id may be empty (Kafka keeps "" legal there for old clients and admin tools);
# everything else needs a non-empty id.
_EMPTY_GROUP_ID_ALLOWED = frozenset({"offset_commit", "offset_fetch", "describe_groups", "delete_groups"})
TopicPartitionOffsets = Mapping[TopicPartition, tuple[int, int, str | None]]  # (offset, leader epoch, metadata)


@dataclass(frozen=True)
class GroupConfig:
    """The broker configs the coordinator reads (Kafka's names and defaults)."""

    min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1800000  # group.max.session.timeout.ms
    max_size: int = INT32_MAX  # group.max.size
    initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    offsets_retention_ms: int = 10080 * 60 * 1000  # offsets.retention.minutes
    offsets_retention_check_interval_ms: int = 600000  # offsets.retention.check.interval.ms

    @classmethod
    def from_broker_config(cls, config) -> "GroupConfig":
        return cls(
            min_session_timeout_ms=int(config.get("group.min.session.timeout.ms")),
            max_session_timeout_ms=int(config.get("group.max.session.timeout.ms")),
            max_size=int(config.get("group.max.size")),
            initial_rebalance_delay_ms=int(config.get("group.initial.rebalance.delay.ms")),
            offsets_retention_ms=int(config.get("offsets.retention.minutes")) * 60 * 1000,
            offsets_retention_check_interval_ms=int(config.get("offsets.retention.check.interval.ms")),
        )


class Timer(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """The coordinator's clock: wall time in ms and one-shot timers."""

    def now_ms(self) -> int: ...

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> Timer: ...


class LoopScheduler:
    """Timers on the running asyncio loop (requests and the background task always run inside it)."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(max(delay_ms, 0) / 1000, callback)


@dataclass(frozen=True)
class JoinRequest:
    group_id: str
    member_id: str
    protocol_type: str
    protocols: Protocols
    session_timeout_ms: int
    rebalance_timeout_ms: int
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    require_known_member_id: bool = True  # JoinGroup v4+ for a dynamic member
    supports_skipping_assignment: bool = False  # JoinGroup v9+
    reason: str | None = None


@dataclass(frozen=True)
class LeavingMember:
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass
class _DelayedJoin:
    """The join phase's pending completion. ``initial``: the delay of a group leaving Empty, which only
    ends at its deadline (then maybe extends); otherwise it ends as soon as every member has joined."""

    timer: Timer | None
    initial: bool
    delay_ms: int = 0
    remaining_ms: int = 0


@dataclass
class _GroupTimers:
    join: _DelayedJoin | None = None
    sync: Timer | None = None
    pending: dict[str, Timer] = field(default_factory=dict)  # pending member id -> expiry

    def cancel_all(self) -> None:
        if self.join is not None and self.join.timer is not None:
            self.join.timer.cancel()
        if self.sync is not None:
            self.sync.cancel()
        for timer in self.pending.values():
            timer.cancel()


class GroupCoordinator:
    """Owns the classic groups of the ``__consumer_offsets`` partitions this broker leads. ``store`` is the
    offset store over them; ``partition_exists(topic, partition)`` says whether offsets can be committed.

    ``lead_offsets_topic`` (single broker only) creates __consumer_offsets at once if needed and calls
    ``on_leadership_change`` for its partitions: it is called when a group request finds its partition
    neither led nor loading, so that a client that never asked FindCoordinator (which creates the topic, as
    in Kafka) is still served, as pykbroker always did. In a cluster it is None: NOT_COORDINATOR then.
    """

    def __init__(
        self,
        store: OffsetStore,
        partition_exists: Callable[[str, int], bool],
        config: GroupConfig | None = None,
        *,
        lead_offsets_topic: Callable[[], None] | None = None,
        scheduler: Scheduler | None = None,
    ) -> None:
        self.store = store
        self._lead_offsets_topic = lead_offsets_topic
        self.partition_exists = partition_exists
        self.config = config or GroupConfig()
        self._scheduler = scheduler or LoopScheduler()
        self._groups: dict[str, ClassicGroup] = {}
        self._timers: dict[str, _GroupTimers] = {}
        self._owned: set[int] = set()  # offsets partitions led here and loaded
        self._loading: dict[int, asyncio.Task] = {}  # offsets partitions led here, being loaded
        # The consumer groups of the new protocol (groups/consumer), which share the group ids and offsets:
        # a group id belongs to one protocol at a time. None: no such groups (tests of the classic side).
        self.consumer_groups = None

    # ==================================================================================================
    # Leadership of __consumer_offsets partitions: loading and unloading groups

    def on_leadership_change(self, topic: str, index: int, is_leader: bool) -> None:
        """This broker became leader (``is_leader``) or follower of a partition. For an offsets partition:
        load its groups (Kafka's onElection: nothing to do if already owned or loading) or unload them
        (onResignation). A quick lead-follow-lead abandons the first load: the second starts over."""
        if topic != OFFSETS_TOPIC or not 0 <= index < self.store.num_partitions:
            return
        if is_leader:
            if index in self._owned or index in self._loading:
                return
            if self.store.load_if_empty(index):  # a new partition: no need to make anyone wait
                self._owned.add(index)
                return
            self._loading[index] = asyncio.ensure_future(self._load(index))
            return
        loading = self._loading.pop(index, None)
        if loading is not None:
            loading.cancel()
        self._owned.discard(index)
        self.store.unload_partition(index)
        unloaded = [g for g in self._groups.values() if self.store.partition_for(g.group_id) == index]
        for group in unloaded:
            self._unload_group(group)
        if unloaded:
            log.info("group coordinator unloaded %d groups of %s-%d", len(unloaded), OFFSETS_TOPIC, index)

    async def _load(self, index: int) -> None:
        started = time.monotonic()
        try:
            loaded = await self.store.load_partition(index)
        except Exception:
            log.exception("loading the groups of %s-%d failed", OFFSETS_TOPIC, index)
            loaded = False
        finally:
            if self._loading.get(index) is asyncio.current_task():
                del self._loading[index]
        if not loaded:
            return
        self._owned.add(index)
        count = self._build_groups(index)
        log.info("group coordinator loaded %d groups of %s-%d in %.0f ms", count, OFFSETS_TOPIC, index,
                 (time.monotonic() - started) * 1000)

    def _build_groups(self, index: int) -> int:
        """Rebuild the groups of a freshly loaded offsets partition from the store."""
        now = self._now()
        for group_id, value in self.store.group_metadata(index).items():
            try:
                group = group_from_record(group_id, decode_group_record(value))
            except (ValueError, UnicodeDecodeError) as exc:
                log.warning("group %s: unreadable group metadata, starting it empty: %s", group_id, exc)
                group = ClassicGroup(group_id, GroupState.EMPTY, now)
            self._groups[group_id] = group
            self._on_group_loaded(group)
        modern = self.consumer_groups
        stored = self.store.take_group_records(index)
        if modern is not None:
            modern.load(index, stored)
        groups = self.store.groups(index)
        for group_id in groups:
            if group_id not in self._groups and (modern is None or not modern.has_group(group_id)):
                self._groups[group_id] = ClassicGroup(group_id, GroupState.EMPTY, now)  # offsets only: "simple"
        return len(groups)

    def _unload_group(self, group: ClassicGroup) -> None:
        """Kafka's onGroupUnloaded: the group is Dead here; whoever waits in a rebalance step is told to
        find the new coordinator."""
        previous = group.state
        group.transition_to(GroupState.DEAD, self._now())
        for member in list(group.members.values()):
            if previous is GroupState.PREPARING_REBALANCE:
                group.invoke_join_callback(member, JoinResult(ErrorCode.not_coordinator, member.member_id))
            elif previous in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
                group.invoke_sync_callback(member, SyncResult(ErrorCode.not_coordinator))
            self._cancel_heartbeat(member)
        self._drop_group(group)

    def _coordinator_error(self, group_id: str) -> ErrorCode | None:
        """Kafka's validateGroupStatus, after the group id check: is this broker the group's coordinator?"""
        partition = self.store.partition_for(group_id)
        if partition not in self._owned and partition not in self._loading and self._lead_offsets_topic is not None:
            self._lead_offsets_topic()
        if partition in self._owned:
            return None
        if partition in self._loading:
            return ErrorCode.coordinator_load_in_progress
        return ErrorCode.not_coordinator

    coordinator_error = _coordinator_error  # for the consumer group coordinator, which shares the ownership

    def release_empty_group(self, group_id: str) -> bool:
        """A consumer-protocol member wants this group id (Kafka's maybeDeleteEmptyClassicGroup): an Empty
        classic group gives it up (its group metadata tombstoned, its offsets kept for the consumer group);
        returns False while it has members."""
        group = self._groups.get(group_id)
        if group is None:
            return True
        if not group.is_state(GroupState.EMPTY, GroupState.DEAD):
            return False
        self.store.delete_group_metadata(group_id, self._now())
        group.transition_to(GroupState.DEAD, self._now())
        self._drop_group(group)
        return True

    def release_group_for_upgrade(self, group_id: str) -> ClassicGroup:
        """A running classic group becomes a consumer group (Kafka 4's convertToConsumerGroup, the classic half):
        members waiting in JoinGroup or SyncGroup are answered REBALANCE_IN_PROGRESS (they rejoin, now into the
        consumer group), the group's timers stop, its metadata record is tombstoned (offsets stay) and it
        leaves this coordinator. Returns it, for its members and assignments."""
        group = self._groups[group_id]
        for member in list(group.members.values()):
            group.invoke_join_callback(member, JoinResult(ErrorCode.rebalance_in_progress, member.member_id))
            group.invoke_sync_callback(member, SyncResult(ErrorCode.rebalance_in_progress))
            self._cancel_heartbeat(member)
        self.store.delete_group_metadata(group_id, self._now())
        group.transition_to(GroupState.DEAD, self._now())
        self._drop_group(group)
        return group

    def adopt_downgraded_group(self, group_id: str, generation: int, members: Iterable[Member],
                               assignments: Mapping[str, Mapping[str, tuple[int, ...]]], tombstones: list = (),
                               done: Callable[[ErrorCode], None] = lambda error: None) -> None:
        """A consumer group whose last consumer-protocol member left becomes a classic group again (Kafka 4's
        convertToClassicGroup and ClassicGroup.fromConsumerGroup, the classic half): Stable at the consumer
        group's epoch as generation, its classic members with their ``assignments`` (member id -> topic ->
        partitions, each encoded in the version of its metadata for the selected protocol), the protocol they
        all support; its record is stored, every member's session timer armed, and a rebalance prepared so
        that they rejoin under a leader of their own. Its record is written in one batch after the consumer
        group's ``tombstones`` (Kafka's convertToClassicGroup records); ``done`` gets the outcome."""
        group = ClassicGroup(group_id, GroupState.STABLE, self._now())
        for member in members:
            group.add(member)
        group.generation_id = generation
        group.protocol_name = group.select_protocol()
        for member in group.members.values():
            member.assignment = encode_assignment(assignments.get(member.member_id, {}),
                                                  subscription_version(member.metadata(group.protocol_name)))
        group.subscribed_topics = group.compute_subscribed_topics()
        self._groups[group_id] = group
        self._store_group(group, {m.member_id: m.assignment for m in group.members.values()}, done, tombstones)
        for member in group.members.values():
            self._complete_and_schedule_next_heartbeat(group, member)
        log.info("group %s: the consumer group is a classic group again, generation %d with %d members", group_id,
                 generation, group.size())
        self._prepare_rebalance(group, "the group was downgraded to a classic group")

    @property
    def loading_partitions(self) -> frozenset[int]:
        """The offsets partitions whose groups are being loaded."""
        return frozenset(self._loading)

    def _on_group_loaded(self, group: ClassicGroup) -> None:
        if group.size() > self.config.max_size:
            self._prepare_rebalance(group, "freshly-loaded group is over capacity")
        for member in list(group.members.values()):
            self._complete_and_schedule_next_heartbeat(group, member)

    async def run(self) -> None:
        """The coordinator's background task: expire offsets periodically."""
        try:
            while True:
                await asyncio.sleep(self.config.offsets_retention_check_interval_ms / 1000)
                try:
                    removed = self.expire_offsets()
                    if removed:
                        log.info("removed %d expired offsets", removed)
                except Exception:
                    log.exception("offset expiration failed")
        finally:
            self.close()

    def close(self) -> None:
        """Cancel every timer and load (broker shutdown)."""
        if self.consumer_groups is not None:
            self.consumer_groups.close()
        for loading in self._loading.values():
            loading.cancel()
        self._loading.clear()
        for timers in self._timers.values():
            timers.cancel_all()
        self._timers.clear()
        for group in self._groups.values():
            for member in group.members.values():
                self._cancel_heartbeat(member)

    # ==================================================================================================
    # Helpers

    def _now(self) -> int:
        return self._scheduler.now_ms()

    def _group_timers(self, group: ClassicGroup) -> _GroupTimers:
        return self._timers.setdefault(group.group_id, _GroupTimers())

    @staticmethod
    def _invalid_group_id(group_id: str | None, api: str) -> ErrorCode | None:
        if group_id is None or (not group_id and api not in _EMPTY_GROUP_ID_ALLOWED):
            return ErrorCode.invalid_group_id
        return None

    def _add_group(self, group_id: str) -> ClassicGroup:
        group = ClassicGroup(group_id, GroupState.EMPTY, self._now())
        self._groups[group_id] = group
        return group

    def _drop_group(self, group: ClassicGroup) -> None:
        """A Dead group leaves the coordinator (its records are already tombstoned)."""
        if self._groups.get(group.group_id) is group:
            del self._groups[group.group_id]
        timers = self._timers.pop(group.group_id, None)
        if timers is not None:
            timers.cancel_all()

    def group(self, group_id: str) -> ClassicGroup | None:
        """The group, if this coordinator knows it (read-only use: tests, tools)."""
        return self._groups.get(group_id)

    @staticmethod
    def _validate_current_member(group: ClassicGroup, member_id: str, group_instance_id: str | None) -> ErrorCode | None:
        """A static member's instance id must map to this member id (else FENCED_INSTANCE_ID, or
        UNKNOWN_MEMBER_ID if the instance is unknown); a member id must be in the group."""
        if group_instance_id is not None:
            current = group.static_member_id(group_instance_id)
            if current is None:
                return ErrorCode.unknown_member_id
            if current != member_id:
                return ErrorCode.fenced_instance_id
        if not group.has(member_id):
            return ErrorCode.unknown_member_id
        return None

    def _store_group(self, group: ClassicGroup, assignment: Mapping[str, bytes], done: Callable[[ErrorCode], None],
                     before: list = ()) -> None:
        """Kafka's storeGroup: persist the group's membership (after the records ``before``, in one batch);
        ``done`` gets the outcome once acknowledged."""
        def stored(error: ErrorCode) -> None:
            if error != ErrorCode.none:
                log.warning("group %s: writing group metadata failed: %s", group.group_id, error.name)
            done(error)

        self.store.put_group_metadata(group.group_id, encode_group_record(record_of(group, dict(assignment))),
                                      self._now(), stored, before)

    # ==================================================================================================
    # JoinGroup

    def _accept_joining_member(self, group: ClassicGroup, member_id: str) -> bool:
        if group.is_state(GroupState.EMPTY, GroupState.DEAD):
            return True
        if group.is_state(GroupState.PREPARING_REBALANCE):
            # Count members that have rejoined, so the last ones to rejoin an oversized group are shed.
            return ((group.has(member_id) and group.get(member_id).is_awaiting_join)
                    or group.num_awaiting_join < self.config.max_size)
        return group.has(member_id) or group.size() < self.config.max_size

    def join_group(self, request: JoinRequest, respond: JoinCallback) -> None:
        """Handle a JoinGroup; ``respond`` is called once, now or when the join phase ends."""
        member_id = request.member_id
        error = self._invalid_group_id(request.group_id, "join_group") or self._coordinator_error(request.group_id)
        if error is not None:
            respond(JoinResult(error, member_id))
            return
        if not self.config.min_session_timeout_ms <= request.session_timeout_ms <= self.config.max_session_timeout_ms:
            respond(JoinResult(ErrorCode.invalid_session_timeout, member_id))
            return
        if self.consumer_groups is not None and not self.consumer_groups.release_empty_group(request.group_id):
            # A consumer group with members: the member joins it with the classic protocol (Kafka 4).
            self.consumer_groups.classic_join(request, respond)
            return
        is_unknown_member = member_id == UNKNOWN_MEMBER_ID
        group = self._groups.get(request.group_id)
        if group is None:
            if not is_unknown_member:  # a member id for a group that does not exist
                respond(JoinResult(ErrorCode.unknown_member_id, member_id))
                return
            group = self._add_group(request.group_id)
        if not self._accept_joining_member(group, member_id):
            member = group.members.get(member_id)
            group.remove(member_id)
            if member is not None:
                self._cancel_heartbeat(member)
            respond(JoinResult(ErrorCode.group_max_size_reached, UNKNOWN_MEMBER_ID))
        elif group.is_state(GroupState.DEAD):
            respond(JoinResult(ErrorCode.coordinator_not_available, member_id))
        elif not group.supports_protocols(request.protocol_type, (name for name, _ in request.protocols)):
            respond(JoinResult(ErrorCode.inconsistent_group_protocol, member_id))
        elif is_unknown_member:
            self._new_member_join(group, request, respond)
        else:
            self._current_member_join(group, request, respond)
        if group.is_state(GroupState.PREPARING_REBALANCE):
            self._check_join_complete(group)

    def _new_member_join(self, group: ClassicGroup, request: JoinRequest, respond: JoinCallback) -> None:
        new_member_id = group.generate_member_id(request.client_id, request.group_instance_id)
        if request.group_instance_id is not None:
            old_member_id = group.static_member_id(request.group_instance_id)
            if old_member_id is not None:
                log.info("group %s: static member %s rejoins with a new member id %s, replacing %s",
                         group.group_id, request.group_instance_id, new_member_id, old_member_id)
                self._update_static_member_and_rebalance(group, old_member_id, new_member_id, request, respond)
            else:
                self._add_member_and_rebalance(group, new_member_id, request, respond)
        elif request.require_known_member_id:
            group.add_pending_member(new_member_id)
            self._schedule_pending_member_expiration(group, new_member_id, request.session_timeout_ms)
            respond(JoinResult(ErrorCode.member_id_required, new_member_id))
        else:
            self._add_member_and_rebalance(group, new_member_id, request, respond)

    def _current_member_join(self, group: ClassicGroup, request: JoinRequest, respond: JoinCallback) -> None:
        member_id = request.member_id
        if member_id in group.pending_members:
            if request.group_instance_id is not None:
                # Kafka raises here (a pending id is never a static member's); the client sees this.
                respond(JoinResult(ErrorCode.unknown_server_error, member_id))
                return
            self._add_member_and_rebalance(group, member_id, request, respond)
            return
        error = self._validate_current_member(group, member_id, request.group_instance_id)
        if error is not None:
            respond(JoinResult(error, member_id))
            return
        member = group.get(member_id)
        if group.is_state(GroupState.PREPARING_REBALANCE):
            self._update_member_and_rebalance(group, member, request, respond)
        elif group.is_state(GroupState.COMPLETING_REBALANCE):
            if member.matches(request.protocols):
                # The member missed its JoinGroup answer: send the current generation again.
                respond(self._join_result(group, member_id, leader_gets_members=True))
            else:
                self._update_member_and_rebalance(group, member, request, respond)
        elif group.is_state(GroupState.STABLE):
            if group.is_leader(member_id) or not member.matches(request.protocols):
                # A rejoining leader forces a rebalance: that is how it reacts to metadata changes
                # (new partitions) that do not change its own subscription.
                self._update_member_and_rebalance(group, member, request, respond)
            else:
                respond(self._join_result(group, member_id, leader_gets_members=False))
        else:  # Empty: the member is not in the group any more; let it start over
            respond(JoinResult(ErrorCode.unknown_member_id, member_id))

    def _join_result(self, group: ClassicGroup, member_id: str, *, leader_gets_members: bool) -> JoinResult:
        members = group.current_member_metadata() if leader_gets_members and group.is_leader(member_id) else ()
        return JoinResult(ErrorCode.none, member_id, group.generation_id, group.protocol_type, group.protocol_name,
                          group.leader_id or "", False, members)

    def _add_member_and_rebalance(self, group: ClassicGroup, member_id: str, request: JoinRequest,
                                  respond: JoinCallback) -> None:
        member = Member(member_id, request.group_instance_id, request.client_id, request.client_host,
                        request.rebalance_timeout_ms, request.session_timeout_ms, request.protocol_type,
                        list(request.protocols))
        member.is_new = True
        if group.is_state(GroupState.PREPARING_REBALANCE) and group.generation_id == 0:
            group.new_member_added = True  # lets the initial delay extend
        group.add(member, respond)
        pending = self._group_timers(group).pending.pop(member_id, None)
        if pending is not None:
            pending.cancel()
        # A new member cannot heartbeat before its first join completes, and a client that gave up on a
        # long rebalance may retry under a new id: bound its first join instead of its session.
        self._complete_and_schedule_next_expiration(group, member, NEW_MEMBER_JOIN_TIMEOUT_MS)
        self._maybe_prepare_rebalance(group, f"adding new member {member_id} ({request.reason or 'no reason'})")

    def _update_member_and_rebalance(self, group: ClassicGroup, member: Member, request: JoinRequest,
                                     respond: JoinCallback) -> None:
        group.update_member(member, request.protocols, request.rebalance_timeout_ms, request.session_timeout_ms,
                            respond)
        self._maybe_prepare_rebalance(group, f"member {member.member_id} rejoins ({request.reason or 'no reason'})")

    def _update_static_member_and_rebalance(self, group: ClassicGroup, old_member_id: str, new_member_id: str,
                                            request: JoinRequest, respond: JoinCallback) -> None:
        instance_id = request.group_instance_id
        assert instance_id is not None
        current_leader = group.leader_id or ""
        member = group.replace_static_member(instance_id, old_member_id, new_member_id)
        self._complete_and_schedule_next_heartbeat(group, member)
        old_protocols, old_rebalance, old_session = member.protocols, member.rebalance_timeout_ms, member.session_timeout_ms
        group.update_member(member, request.protocols, request.rebalance_timeout_ms, request.session_timeout_ms, respond)
        if group.is_state(GroupState.STABLE):
            if group.protocol_name == group.select_protocol():
                # Nothing the assignment depends on changed: persist the new member id, no rebalance.
                def stored(error: ErrorCode) -> None:
                    if group.is_state(GroupState.DEAD):
                        group.invoke_join_callback(member, JoinResult(ErrorCode.not_coordinator, new_member_id))
                    elif error != ErrorCode.none:
                        group.update_member(member, old_protocols, old_rebalance, old_session, None)
                        old = group.replace_static_member(instance_id, new_member_id, old_member_id)
                        self._complete_and_schedule_next_heartbeat(group, old)
                        respond(JoinResult(error, UNKNOWN_MEMBER_ID, group.generation_id, group.protocol_type,
                                           group.protocol_name, current_leader))
                    elif request.supports_skipping_assignment:
                        # v9+: tell a returning leader it leads, but that it must not reassign (the group is
                        # Stable and would ignore a new assignment).
                        is_leader = group.is_leader(new_member_id)
                        group.invoke_join_callback(member, JoinResult(
                            ErrorCode.none, new_member_id, group.generation_id, group.protocol_type,
                            group.protocol_name, group.leader_id or "", is_leader,
                            group.current_member_metadata() if is_leader else ()))
                    else:
                        # Before v9: answer with the old leader id, so a returning leader does not assign.
                        group.invoke_join_callback(member, JoinResult(
                            ErrorCode.none, new_member_id, group.generation_id, group.protocol_type,
                            group.protocol_name, current_leader))

                self._store_group(group, {m.member_id: m.assignment for m in group.members.values()}, stored)
            else:
                self._maybe_prepare_rebalance(group, f"static member {instance_id} rejoins with other protocols")
        elif group.is_state(GroupState.COMPLETING_REBALANCE):
            # The old id may already be in the leader's assignment: rebalance so the new id gets one.
            self._prepare_rebalance(group, f"static member {instance_id} rejoins during CompletingRebalance")
        # PreparingRebalance: the member simply takes part in the join phase under its new id.

    # -- the join phase ---------------------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.is_state(GroupState.COMPLETING_REBALANCE):
            self._reset_and_propagate_assignment_error(group, ErrorCode.rebalance_in_progress)
        self._remove_sync_expiration(group)
        was_empty = group.is_state(GroupState.EMPTY)
        rebalance_timeout = group.rebalance_timeout_ms()
        group.transition_to(GroupState.PREPARING_REBALANCE, self._now())
        log.info("group %s: preparing to rebalance, old generation %d (%s)", group.group_id, group.generation_id, reason)
        if was_empty:
            delay = self.config.initial_rebalance_delay_ms
            self._schedule_initial_join(group, delay, max(rebalance_timeout - delay, 0))
        else:
            self._schedule_join(group, rebalance_timeout)

    def _schedule_join(self, group: ClassicGroup, timeout_ms: int) -> None:
        """Kafka's DelayedJoin: done now if everyone has joined, else at the deadline or when they have."""
        timers = self._group_timers(group)
        if group.has_all_members_joined():
            timers.join = None
            self._complete_join(group)
            return
        timers.join = _DelayedJoin(None, initial=False)
        timers.join.timer = self._scheduler.call_later(timeout_ms, lambda: self._on_join_deadline(group))

    def _schedule_initial_join(self, group: ClassicGroup, delay_ms: int, remaining_ms: int) -> None:
        """Kafka's InitialDelayedJoin: waits out its delay whatever happens, then maybe extends."""
        timers = self._group_timers(group)
        join = _DelayedJoin(None, initial=True, delay_ms=delay_ms, remaining_ms=remaining_ms)
        timers.join = join
        join.timer = self._scheduler.call_later(delay_ms, lambda: self._on_join_deadline(group))

    def _check_join_complete(self, group: ClassicGroup) -> None:
        join = self._group_timers(group).join
        if join is not None and not join.initial and group.has_all_members_joined():
            if join.timer is not None:
                join.timer.cancel()
            self._group_timers(group).join = None
            self._complete_join(group)

    def _on_join_deadline(self, group: ClassicGroup) -> None:
        timers = self._timers.get(group.group_id)
        join = timers.join if timers is not None else None
        if join is None or self._groups.get(group.group_id) is not group:
            return
        timers.join = None
        if join.initial and group.new_member_added and join.remaining_ms != 0:
            group.new_member_added = False
            self._schedule_initial_join(group, min(self.config.initial_rebalance_delay_ms, join.remaining_ms),
                                        max(join.remaining_ms - join.delay_ms, 0))
            return
        self._complete_join(group)

    def _complete_join(self, group: ClassicGroup) -> None:
        """The join phase is over: drop dynamic members that did not rejoin, start the next generation."""
        for member in [m for m in group.not_yet_rejoined() if not m.is_static]:
            log.info("group %s: removing member %s, which did not rejoin in time", group.group_id, member.member_id)
            group.remove(member.member_id)
            self._cancel_heartbeat(member)
        if group.is_state(GroupState.DEAD):
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Only static members are left and none rejoined: wait again until sessions expire them.
            log.warning("group %s: no member rejoined; waiting another rebalance timeout", group.group_id)
            self._schedule_join(group, group.rebalance_timeout_ms())
            return
        group.init_next_generation(self._now())
        if group.is_state(GroupState.EMPTY):
            log.info("group %s: generation %d is empty", group.group_id, group.generation_id)
            self._store_group(group, {}, lambda error: None)  # a failure is logged; nobody waits for it
            return
        log.info("group %s: generation %d with %d members, protocol %s, leader %s", group.group_id,
                 group.generation_id, group.size(), group.protocol_name, group.leader_id)
        for member in list(group.members.values()):
            group.invoke_join_callback(member, self._join_result(group, member.member_id, leader_gets_members=True))
            self._complete_and_schedule_next_heartbeat(group, member)
            member.is_new = False
            group.pending_sync_members.add(member.member_id)
        self._schedule_pending_sync(group)

    # ==================================================================================================
    # SyncGroup

    def sync_group(self, group_id: str, generation_id: int, member_id: str, protocol_type: str | None,
                   protocol_name: str | None, group_instance_id: str | None, assignments: Mapping[str, bytes],
                   respond: SyncCallback) -> None:
        """Handle a SyncGroup; ``respond`` is called once, now or when the leader's assignment arrives."""
        error = self._invalid_group_id(group_id, "sync_group") or self._coordinator_error(group_id)
        if error is not None:
            respond(SyncResult(error))
            return
        if self.consumer_groups is not None and self.consumer_groups.has_members(group_id):
            self.consumer_groups.classic_sync(group_id, generation_id, member_id, protocol_type, protocol_name,
                                              group_instance_id, respond)
            return
        group = self._groups.get(group_id)
        if group is None:
            respond(SyncResult(ErrorCode.unknown_member_id))
            return
        if group.is_state(GroupState.DEAD):
            respond(SyncResult(ErrorCode.coordinator_not_available))
            return
        error = self._validate_current_member(group, member_id, group_instance_id)
        if error is None and generation_id != group.generation_id:
            error = ErrorCode.illegal_generation
        if error is None and ((protocol_type is not None and protocol_type != group.protocol_type)
                              or (protocol_name is not None and protocol_name != group.protocol_name)):
            error = ErrorCode.inconsistent_group_protocol
        if error is not None:
            respond(SyncResult(error))
            return
        if group.is_state(GroupState.EMPTY):
            respond(SyncResult(ErrorCode.unknown_member_id))
        elif group.is_state(GroupState.PREPARING_REBALANCE):
            respond(SyncResult(ErrorCode.rebalance_in_progress))
        elif group.is_state(GroupState.COMPLETING_REBALANCE):
            group.get(member_id).awaiting_sync = respond
            self._remove_pending_sync_member(group, member_id)
            if group.is_leader(member_id):
                missing = [m for m in group.members if m not in assignments]
                if missing:
                    log.warning("group %s: empty assignment for members %s in generation %d", group_id, missing,
                                generation_id)
                assignment = {m: bytes(assignments.get(m, b"")) for m in group.members}

                def stored(error: ErrorCode) -> None:
                    # The group may have moved on (or been unloaded) while the assignment was written.
                    if group.is_state(GroupState.COMPLETING_REBALANCE) and generation_id == group.generation_id:
                        if error != ErrorCode.none:
                            self._reset_and_propagate_assignment_error(group, error)
                            self._maybe_prepare_rebalance(group, f"storing the assignment failed: {error.name}")
                        else:
                            self._set_and_propagate_assignment(group, assignment)
                            group.transition_to(GroupState.STABLE, self._now())

                self._store_group(group, assignment, stored)
        else:  # Stable: hand out the current assignment again
            self._remove_pending_sync_member(group, member_id)
            member = group.get(member_id)
            respond(SyncResult(ErrorCode.none, group.protocol_type, group.protocol_name, member.assignment))
            self._complete_and_schedule_next_heartbeat(group, member)

    def _set_and_propagate_assignment(self, group: ClassicGroup, assignment: Mapping[str, bytes]) -> None:
        for member in group.members.values():
            member.assignment = assignment.get(member.member_id, b"")
        self._propagate_assignment(group, ErrorCode.none)

    def _reset_and_propagate_assignment_error(self, group: ClassicGroup, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: ClassicGroup, error: ErrorCode) -> None:
        ok = error == ErrorCode.none
        for member in list(group.members.values()):
            result = SyncResult(error, group.protocol_type if ok else None, group.protocol_name if ok else None,
                                member.assignment)
            if group.invoke_sync_callback(member, result):
                # Sessions that ran out while the member waited for this answer were ignored: restart them.
                self._complete_and_schedule_next_heartbeat(group, member)

    def _schedule_pending_sync(self, group: ClassicGroup) -> None:
        timers = self._group_timers(group)
        if timers.sync is not None:
            timers.sync.cancel()
        generation = group.generation_id
        timers.sync = self._scheduler.call_later(group.rebalance_timeout_ms(),
                                                 lambda: self._on_sync_deadline(group, generation))

    def _remove_pending_sync_member(self, group: ClassicGroup, member_id: str) -> None:
        group.pending_sync_members.discard(member_id)
        if group.has_received_sync_from_all_members():
            self._cancel_sync_timer(group)

    def _remove_sync_expiration(self, group: ClassicGroup) -> None:
        group.pending_sync_members.clear()
        self._cancel_sync_timer(group)

    def _cancel_sync_timer(self, group: ClassicGroup) -> None:
        timers = self._timers.get(group.group_id)
        if timers is not None and timers.sync is not None:
            timers.sync.cancel()
            timers.sync = None

    def _on_sync_deadline(self, group: ClassicGroup, generation: int) -> None:
        timers = self._timers.get(group.group_id)
        if timers is not None:
            timers.sync = None
        if generation != group.generation_id or self._groups.get(group.group_id) is not group:
            return
        if group.is_state(GroupState.COMPLETING_REBALANCE, GroupState.STABLE) and group.pending_sync_members:
            late = list(group.pending_sync_members)
            for member_id in late:
                member = group.members.get(member_id)
                group.remove(member_id)
                if member is not None:
                    self._cancel_heartbeat(member)
            self._prepare_rebalance(group, f"members {late} sent no SyncGroup in time")

    # ==================================================================================================
    # Heartbeats and sessions

    def heartbeat(self, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int) -> ErrorCode:
        error = self._invalid_group_id(group_id, "heartbeat") or self._coordinator_error(group_id)
        if error is not None:
            return error
        if self.consumer_groups is not None and self.consumer_groups.has_members(group_id):
            return self.consumer_groups.classic_heartbeat(group_id, member_id, group_instance_id, generation_id)
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        if group.is_state(GroupState.DEAD):
            return ErrorCode.coordinator_not_available
        error = self._validate_current_member(group, member_id, group_instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if group.is_state(GroupState.EMPTY):
            return ErrorCode.unknown_member_id
        self._complete_and_schedule_next_heartbeat(group, group.get(member_id))
        if group.is_state(GroupState.PREPARING_REBALANCE):
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def _complete_and_schedule_next_heartbeat(self, group: ClassicGroup, member: Member) -> None:
        self._complete_and_schedule_next_expiration(group, member, member.session_timeout_ms)

    def _complete_and_schedule_next_expiration(self, group: ClassicGroup, member: Member, timeout_ms: int) -> None:
        """The member showed it is alive: restart its session timer. As in Kafka's purgatory, no timer is
        kept while the member waits in JoinGroup/SyncGroup (unless it is new): it is alive by definition,
        and the next rebalance step arms the timer again."""
        self._cancel_heartbeat(member)
        member.heartbeat_satisfied = False
        if member.has_satisfied_heartbeat():
            return
        member.heartbeat_timer = self._scheduler.call_later(
            timeout_ms, lambda: self._on_session_deadline(group, member))

    @staticmethod
    def _cancel_heartbeat(member: Member) -> None:
        if member.heartbeat_timer is not None:
            member.heartbeat_timer.cancel()
            member.heartbeat_timer = None

    def _on_session_deadline(self, group: ClassicGroup, member: Member) -> None:
        member.heartbeat_timer = None
        if group.is_state(GroupState.DEAD) or group.members.get(member.member_id) is not member:
            return
        if not member.has_satisfied_heartbeat():
            log.info("group %s: member %s failed (no heartbeat within %d ms), removing it", group.group_id,
                     member.member_id, member.session_timeout_ms)
            self._remove_member_and_update_group(group, member, "session timeout")

    def _schedule_pending_member_expiration(self, group: ClassicGroup, member_id: str, timeout_ms: int) -> None:
        def expire() -> None:
            timers.pending.pop(member_id, None)
            if member_id in group.pending_members and self._groups.get(group.group_id) is group:
                log.info("group %s: pending member %s did not join within its session timeout", group.group_id,
                         member_id)
                self._remove_pending_member_and_update_group(group, member_id)

        timers = self._group_timers(group)
        timers.pending[member_id] = self._scheduler.call_later(timeout_ms, expire)

    def _remove_member_and_update_group(self, group: ClassicGroup, member: Member, reason: str) -> None:
        # A new member may still wait for its first join: answer it so it can retry.
        group.invoke_join_callback(member, JoinResult(ErrorCode.unknown_member_id, UNKNOWN_MEMBER_ID))
        group.remove(member.member_id)
        self._cancel_heartbeat(member)
        if group.is_state(GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, f"removing member {member.member_id}: {reason}")
        elif group.is_state(GroupState.PREPARING_REBALANCE):
            self._check_join_complete(group)

    def _remove_pending_member_and_update_group(self, group: ClassicGroup, member_id: str) -> None:
        group.remove(member_id)
        timer = self._group_timers(group).pending.pop(member_id, None)
        if timer is not None:
            timer.cancel()
        if group.is_state(GroupState.PREPARING_REBALANCE):
            self._check_join_complete(group)

    # ==================================================================================================
    # LeaveGroup

    def leave_group(self, group_id: str, members: Iterable[LeavingMember]) -> tuple[ErrorCode, list[tuple[LeavingMember, ErrorCode]]]:
        """Remove members (by member id, or by group instance id alone, as admin tools do). Returns the
        top-level error and one error per member."""
        members = list(members)
        error = self._invalid_group_id(group_id, "leave_group") or self._coordinator_error(group_id)
        if error is not None:
            return error, []
        if self.consumer_groups is not None and self.consumer_groups.has_members(group_id):
            return ErrorCode.none, list(zip(members, self.consumer_groups.classic_leave(group_id, members)))
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.none, [(m, ErrorCode.unknown_member_id) for m in members]
        if group.is_state(GroupState.DEAD):
            return ErrorCode.coordinator_not_available, []
        results = []
        for leaving in members:
            if leaving.member_id == UNKNOWN_MEMBER_ID:
                current = group.static_member_id(leaving.group_instance_id)
                if current is None:
                    results.append((leaving, ErrorCode.unknown_member_id))
                else:
                    self._remove_current_member(group, current, leaving.reason)
                    results.append((leaving, ErrorCode.none))
            elif leaving.member_id in group.pending_members:
                self._remove_pending_member_and_update_group(group, leaving.member_id)
                results.append((leaving, ErrorCode.none))
            else:
                error = self._validate_current_member(group, leaving.member_id, leaving.group_instance_id)
                if error is None:
                    self._remove_current_member(group, leaving.member_id, leaving.reason)
                results.append((leaving, error or ErrorCode.none))
        return ErrorCode.none, results

    def _remove_current_member(self, group: ClassicGroup, member_id: str, reason: str | None) -> None:
        log.info("group %s: member %s leaves (%s)", group.group_id, member_id, reason or "no reason given")
        self._remove_member_and_update_group(group, group.get(member_id), f"LeaveGroup: {reason or 'no reason'}")

    # ==================================================================================================
    # Offsets

    def commit_offsets(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        offsets: TopicPartitionOffsets,
        respond: Callable[[dict[TopicPartition, ErrorCode]], None],
        *,
        group_instance_id: str | None = None,
        expire_timestamp_ms: int = -1,
        api_version: int = 9,
    ) -> None:
        """offsets: (topic, partition) -> (offset, leader epoch, metadata). ``respond`` gets an error per
        partition, once the commit is stored (at once when nothing is written or nothing must wait). For a
        consumer group of the new protocol, ``generation`` is the member epoch, checked by that protocol."""
        admitted = self._admit_commit(group_id, "offset_commit", offsets, respond)
        if admitted is None:
            return
        results, known = admitted
        if self.consumer_groups is not None and self.consumer_groups.has_group(group_id):
            error = self.consumer_groups.validate_offset_commit(group_id, member_id, generation, api_version)
            if error is not None:
                results.update({tp: error for tp in known})
                respond(results)
                return
            self._store_commit(group_id, known, expire_timestamp_ms, results, respond)
            return
        group = self._groups.get(group_id)
        if group is None:
            if generation >= 0:  # a generation of a group that does not exist: stale, reject (Kafka 4: v9+ says so)
                error = ErrorCode.group_id_not_found if api_version >= 9 else ErrorCode.illegal_generation
                results.update({tp: error for tp in known})
                respond(results)
                return
            group = self._add_group(group_id)  # a "simple" group: Kafka only for offset storage
        error = self._validate_offset_commit(group, generation, member_id, group_instance_id)
        if error is None and group.is_state(GroupState.COMPLETING_REBALANCE):
            # The member has its new generation but no assignment yet: it must not commit for the old one.
            error = ErrorCode.rebalance_in_progress
        if error is not None:
            results.update({tp: error for tp in known})
            respond(results)
            return
        if group.is_state(GroupState.STABLE, GroupState.PREPARING_REBALANCE):
            # Commits are allowed while preparing: the next heartbeat tells the member to rejoin.
            self._complete_and_schedule_next_heartbeat(group, group.get(member_id))
        self._store_commit(group_id, known, expire_timestamp_ms, results, respond)

    def _store_commit(self, group_id: str, known: TopicPartitionOffsets, expire_timestamp_ms: int,
                      results: dict[TopicPartition, ErrorCode],
                      respond: Callable[[dict[TopicPartition, ErrorCode]], None]) -> None:
        now = self._now()
        accepted = self._accepted_offsets(known, now, expire_timestamp_ms, results)
        if accepted:
            self.store.commit(group_id, accepted, now, self._stored(group_id, accepted, results, respond))
        else:
            respond(results)

    def commit_transactional_offsets(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        generation: int,
        member_id: str,
        offsets: TopicPartitionOffsets,
        respond: Callable[[dict[TopicPartition, ErrorCode]], None],
        *,
        group_instance_id: str | None = None,
        verification=None,
    ) -> None:
        """TxnOffsetCommit (Kafka's handleTxnCommitOffsets): offsets a transactional producer commits for the
        group as part of its transaction. They are appended to the group's partition as one transactional
        batch and stay pending (invisible to OffsetFetch) until the transaction's marker
        (``on_transaction_marker``); with producer id -1 they are a plain commit, as in Kafka. Versions
        before 3 carry no member id / generation (-1, ""): nothing is checked against the group then;
        otherwise they must be current, as for a commit (but a group waiting for its SyncGroup is no reason
        to refuse, and an unknown group is created Empty)."""
        admitted = self._admit_commit(group_id, "txn_offset_commit", offsets, respond)
        if admitted is None:
            return
        results, known = admitted
        if self.consumer_groups is not None and self.consumer_groups.has_group(group_id):
            error = self.consumer_groups.validate_offset_commit(group_id, member_id, generation, None)
        else:
            group = self._groups.get(group_id) or self._add_group(group_id)
            error = self._validate_offset_commit(group, generation, member_id, group_instance_id, transactional=True)
        if error is not None:
            results.update({tp: error for tp in known})
            respond(results)
            return
        now = self._now()
        accepted = self._accepted_offsets(known, now, -1, results)
        if not accepted:
            respond(results)
        elif producer_id == NO_PRODUCER_ID:  # Kafka's storeOffsets: no producer, so a plain commit
            self.store.commit(group_id, accepted, now, self._stored(group_id, accepted, results, respond))
        else:
            self.store.commit_transactional(group_id, producer_id, producer_epoch, accepted, now,
                                            self._stored(group_id, accepted, results, respond),
                                            verification=verification)

    def on_transaction_marker(self, offsets_partition: int, producer_id: int, commit: bool) -> None:
        """A COMMIT (``commit``) or ABORT marker of ``producer_id`` was appended and replicated to
        ``__consumer_offsets`` partition ``offsets_partition`` (called by the partition-leader side once
        WriteTxnMarkers is done there): that producer's pending transactional offsets of the partition's
        groups become committed offsets, or are dropped (Kafka's handleTxnCompletion). A partition that is
        not loaded here is ignored: its loading replays the marker from the log."""
        if offsets_partition not in self._owned:
            return
        groups = self.store.complete_transaction(offsets_partition, producer_id, commit)
        if groups:
            log.debug("producer %d: transactional offsets of groups %s %s", producer_id, groups,
                      "committed" if commit else "aborted")

    def _admit_commit(self, group_id: str, api: str, offsets: TopicPartitionOffsets,
                      respond: Callable[[dict[TopicPartition, ErrorCode]], None],
                      ) -> tuple[dict[TopicPartition, ErrorCode], dict] | None:
        """The checks before the group is looked at, in Kafka's order: partitions that do not exist
        (UNKNOWN_TOPIC_OR_PARTITION, KafkaApis), then the group id and whether this broker is the group's
        coordinator (validateGroupStatus). Returns (the answers so far, the offsets of existing partitions),
        or None when it has answered."""
        results: dict[TopicPartition, ErrorCode] = {}
        known = {}
        for tp, value in offsets.items():
            if self.partition_exists(*tp):
                known[tp] = value
            else:
                results[tp] = ErrorCode.unknown_topic_or_partition
        if not known:
            respond(results)  # Kafka does not consult the coordinator then (no group is created)
            return None
        error = self._invalid_group_id(group_id, api) or self._coordinator_error(group_id)
        if error is not None:
            results.update({tp: error for tp in known})
            respond(results)
            return None
        return results, known

    @staticmethod
    def _accepted_offsets(known: TopicPartitionOffsets, now: int, expire_timestamp_ms: int,
                          results: dict[TopicPartition, ErrorCode]) -> dict[TopicPartition, CommittedOffset]:
        """The offsets to store; OFFSET_METADATA_TOO_LARGE in ``results`` for the others."""
        accepted: dict[TopicPartition, CommittedOffset] = {}
        for tp, (offset, leader_epoch, metadata) in known.items():
            if metadata is not None and len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                results[tp] = ErrorCode.offset_metadata_too_large
            else:
                accepted[tp] = CommittedOffset(offset, leader_epoch, metadata, now, expire_timestamp_ms)
        return accepted

    @staticmethod
    def _stored(group_id: str, accepted: Mapping[TopicPartition, CommittedOffset],
                results: dict[TopicPartition, ErrorCode],
                respond: Callable[[dict[TopicPartition, ErrorCode]], None]) -> Callable[[ErrorCode], None]:
        def stored(outcome: ErrorCode) -> None:
            if outcome != ErrorCode.none:
                log.warning("group %s: storing offsets failed: %s", group_id, outcome.name)
            results.update({tp: outcome for tp in accepted})
            respond(results)

        return stored

    def _validate_offset_commit(self, group: ClassicGroup, generation: int, member_id: str,
                                group_instance_id: str | None, *, transactional: bool = False) -> ErrorCode | None:
        if group.is_state(GroupState.DEAD):
            return ErrorCode.coordinator_not_available
        if generation < 0 and group.is_state(GroupState.EMPTY):
            return None  # admin tools and consumers without group management (transactional too: Kafka 3.7.1)
        if generation >= 0 or member_id != UNKNOWN_MEMBER_ID or group_instance_id is not None:
            error = self._validate_current_member(group, member_id, group_instance_id)
            if error is None and generation != group.generation_id:
                error = ErrorCode.illegal_generation
            return error
        if not transactional and not group.is_state(GroupState.EMPTY):
            # Only members may commit to a group that has members; transactional commits before v3 name none.
            return ErrorCode.unknown_member_id
        return None

    def fetch_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None
    ) -> tuple[ErrorCode, dict[TopicPartition, CommittedOffset | None]]:
        """Committed offsets of the group, whatever its state; None for a requested partition without one.
        The error is the coordinator's (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS), with no offsets."""
        error = self._coordinator_error(group_id)
        if error is not None:
            return error, {}
        wanted = None if partitions is None else list(partitions)
        committed = self.store.fetch(group_id, wanted)
        if wanted is None:
            return ErrorCode.none, dict(committed)
        return ErrorCode.none, {tp: committed.get(tp) for tp in wanted}

    def unstable_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> set[TopicPartition]:
        """Those of ``partitions`` with transactional offsets of the group awaiting their marker: OffsetFetch
        v7+ with require_stable answers them UNSTABLE_OFFSET_COMMIT (Kafka's rule: what a read_committed
        consumer must not start from yet)."""
        return {tp for tp in partitions if self.store.has_pending(group_id, tp)}

    def delete_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """OffsetDelete: offsets of topics the group does not consume (any, if it is Empty)."""
        partitions = list(partitions)
        error = self._invalid_group_id(group_id, "offset_delete") or self._coordinator_error(group_id)
        if error is not None:
            return error, {}
        results: dict[TopicPartition, ErrorCode] = {}
        if self.consumer_groups is not None and self.consumer_groups.has_group(group_id):
            subscribed = self.consumer_groups.subscribed_topics(group_id)
            results.update({tp: ErrorCode.group_subscribed_to_topic for tp in partitions if tp[0] in subscribed})
            eligible = [tp for tp in partitions if tp[0] not in subscribed]
            if eligible:
                self.store.delete(group_id, eligible, self._now())
                results.update({tp: ErrorCode.none for tp in eligible})
            return ErrorCode.none, results
        group = self._groups.get(group_id)
        if group is None or group.is_state(GroupState.DEAD):
            return ErrorCode.group_id_not_found, {}
        if group.is_state(GroupState.EMPTY):
            eligible = partitions
        elif group.is_consumer_group():
            eligible = [tp for tp in partitions if not group.is_subscribed_to(tp[0])]
            results.update({tp: ErrorCode.group_subscribed_to_topic for tp in partitions if group.is_subscribed_to(tp[0])})
        else:
            return ErrorCode.non_empty_group, {}
        if eligible:
            self.store.delete(group_id, eligible, self._now())
            results.update({tp: ErrorCode.none for tp in eligible})
            self._remove_if_finished(group)
        return ErrorCode.none, results

    def expire_offsets(self, now_ms: int | None = None) -> int:
        """Kafka's periodic cleanup (``offsets.retention.minutes``); returns how many offsets were removed."""
        store = self.store
        now = self._now() if now_ms is None else now_ms
        retention = self.config.offsets_retention_ms

        def is_empty(group_id: str) -> bool:
            if self.consumer_groups is not None and self.consumer_groups.has_group(group_id):
                return self.consumer_groups.group(group_id).is_empty()
            group = self._groups.get(group_id)
            return group is None or group.is_state(GroupState.EMPTY)

        def empty_since(group_id: str) -> int | None:
            group = self._groups.get(group_id)
            # A consumer group counts from when it lost its last member; a "simple" group (no protocol
            # type) from each commit.
            return group.state_timestamp_ms if group is not None and group.protocol_type else None

        removed = store.expire(now, retention, is_empty, empty_since)
        for group in list(self._groups.values()):
            if group.is_state(GroupState.STABLE) and group.is_consumer_group() and group.subscribed_topics is not None:
                stale = [
                    tp for tp, c in store.fetch(group.group_id).items()
                    if tp[0] not in group.subscribed_topics
                    and (now >= c.expire_timestamp_ms if c.expire_timestamp_ms != -1
                         else now - c.commit_timestamp_ms >= retention)
                ]
                if stale:
                    store.delete(group.group_id, stale, now)
                    removed += len(stale)
            self._remove_if_finished(group)
        if self.consumer_groups is not None:
            for group in self.consumer_groups.groups():
                self.consumer_groups.remove_if_finished(group.group_id)
        return removed

    def _remove_if_finished(self, group: ClassicGroup) -> None:
        """An Empty group without offsets (committed, or transactional awaiting their marker) is Dead: forget
        it and tombstone its metadata."""
        if not group.is_state(GroupState.EMPTY) or self.store.has_offsets(group.group_id):
            return  # (pending transactional offsets count: the group stays until their marker)
        group.transition_to(GroupState.DEAD, self._now())
        self.store.delete_group_metadata(group.group_id, self._now())
        self._drop_group(group)
        log.info("group %s: no members and no offsets left, removed", group.group_id)

    # ==================================================================================================
    # Admin: ListGroups, DescribeGroups, DeleteGroups

    def list_groups(self, states: Iterable[str] = ()) -> tuple[ErrorCode, list[GroupOverview]]:
        """Every group coordinated here, or those in the given states (compared case-insensitively, as Kafka
        does); COORDINATOR_LOAD_IN_PROGRESS while a partition is loading (with the groups known so far)."""
        wanted = {state.lower() for state in states}
        error = ErrorCode.coordinator_load_in_progress if self._loading else ErrorCode.none
        overviews = [group.overview() for group in self._groups.values()]
        if self.consumer_groups is not None:  # the consumer groups of the new protocol are listed too (Kafka 4)
            overviews += [GroupOverview(group.group_id, "consumer", group.state.value, "consumer")
                          for group in self.consumer_groups.groups()]
        return error, [overview for overview in overviews if not wanted or overview.state.lower() in wanted]

    def describe_group(self, group_id: str) -> tuple[ErrorCode, GroupSummary]:
        error = self._invalid_group_id(group_id, "describe_groups") or self._coordinator_error(group_id)
        if error is not None:
            return error, GroupSummary("", "", "")
        group = self._groups.get(group_id)
        return ErrorCode.none, group.summary() if group is not None else DEAD_GROUP_SUMMARY

    def delete_groups(self, group_ids: Iterable[str]) -> dict[str, ErrorCode]:
        """Delete Empty groups with their offsets; NON_EMPTY_GROUP for groups with members."""
        results: dict[str, ErrorCode] = {}
        for group_id in dict.fromkeys(group_ids):
            error = self._invalid_group_id(group_id, "delete_groups") or self._coordinator_error(group_id)
            group = self._groups.get(group_id) if error is None else None
            if error is not None:
                results[group_id] = error
            elif self.consumer_groups is not None and self.consumer_groups.has_group(group_id):
                results[group_id] = self.consumer_groups.delete_group(group_id)
            elif group is None or group.is_state(GroupState.DEAD):
                results[group_id] = ErrorCode.group_id_not_found
            elif not group.is_state(GroupState.EMPTY):
                results[group_id] = ErrorCode.non_empty_group
            else:
                self.store.delete(group_id, None, self._now())  # offsets and group metadata, tombstoned
                group.transition_to(GroupState.DEAD, self._now())
                self._drop_group(group)
                results[group_id] = ErrorCode.none
        return results


__all__ = [
    "GroupConfig", "GroupCoordinator", "JoinRequest", "LeavingMember", "LoopScheduler", "Scheduler",
    "JoinResult", "SyncResult", "NO_GENERATION",
]

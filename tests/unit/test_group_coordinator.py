"""The classic group coordinator, driven request by request on a manual clock (as Kafka's own
GroupCoordinatorTest drives it with MockTime): joins, the member-id dance, protocol votes, syncs, session
and rebalance timeouts, the initial rebalance delay, static membership, offset commit checks, persistence
across a restart, admin APIs and offsets retention. The offset store is the real one, on real logs."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import struct

import pytest

from pykbroker.groups.classic.coordinator import GroupConfig, GroupCoordinator, JoinRequest, LeavingMember
from pykbroker.groups.classic.group import GroupState
from pykbroker.groups.offset_store import OFFSETS_TOPIC, OffsetStore
from pykbroker.protocol.errors import ErrorCode
from tests.unit.test_offset_store import OffsetsLogs

PARTITIONS = 4
SESSION_MS = 10_000
REBALANCE_MS = 30_000
TOPIC = "orders"


class ManualClock:
    """Wall time that only moves when a test says so; timers fire in deadline order as it moves."""

    class _Timer:
        def __init__(self) -> None:
            self.cancelled = False

        def cancel(self) -> None:
            self.cancelled = True

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now = now_ms
        self._queue: list = []
        self._order = itertools.count()

    def now_ms(self) -> int:
        return self.now

    def call_later(self, delay_ms: int, callback):
        timer = self._Timer()
        heapq.heappush(self._queue, (self.now + max(delay_ms, 0), next(self._order), timer, callback))
        return timer

    def advance(self, ms: int = 0) -> None:
        target = self.now + ms
        while self._queue and self._queue[0][0] <= target:
            deadline, _, timer, callback = heapq.heappop(self._queue)
            self.now = max(self.now, deadline)
            if not timer.cancelled:
                callback()
        self.now = target


class Answer:
    """One request's answer, filled when the coordinator responds (maybe later)."""

    def __init__(self) -> None:
        self.result = None

    def __call__(self, result) -> None:
        assert self.result is None, "answered twice"
        self.result = result

    @property
    def error(self):
        assert self.result is not None, "not answered yet"
        return self.result.error


def subscription(*topics: str) -> bytes:
    """A consumer protocol Subscription v0: version, topics, null user data."""
    data = struct.pack(">hi", 0, len(topics))
    for topic in topics:
        data += struct.pack(">h", len(topic)) + topic.encode()
    return data + struct.pack(">i", -1)


class Harness:
    def __init__(self, logs: OffsetsLogs, **config) -> None:
        self.logs = logs
        self.clock = ManualClock()
        config.setdefault("initial_rebalance_delay_ms", 0)
        config.setdefault("min_session_timeout_ms", 1_000)
        self.config = GroupConfig(**config)
        self.coordinator = self._new_coordinator()

    def _new_coordinator(self) -> GroupCoordinator:
        store = OffsetStore(self.logs.replicas, PARTITIONS)
        self.store = store
        coordinator = GroupCoordinator(store, lambda topic, partition: topic == TOPIC and 0 <= partition < 4,
                                       self.config, scheduler=self.clock)

        async def lead_every_partition() -> None:  # what a single broker does at start
            for partition in range(PARTITIONS):
                coordinator.on_leadership_change(OFFSETS_TOPIC, partition, True)
            while coordinator.loading_partitions:
                await asyncio.sleep(0)

        asyncio.run(lead_every_partition())
        return coordinator

    def restart(self) -> None:
        self.coordinator.close()
        self.logs.reopen()
        self.coordinator = self._new_coordinator()

    def join(self, group: str = "g", member_id: str = "", *, protocols=None, instance: str | None = None,
             session: int = SESSION_MS, rebalance: int = REBALANCE_MS, client: str = "client",
             known_id_required: bool = True, skipping: bool = False, protocol_type: str = "consumer") -> Answer:
        answer = Answer()
        request = JoinRequest(group, member_id, protocol_type,
                              list(protocols if protocols is not None else [("range", subscription(TOPIC))]),
                              session, rebalance, instance, client, "/127.0.0.1",
                              known_id_required and instance is None, skipping)
        self.coordinator.join_group(request, answer)
        return answer

    def join_new(self, group: str = "g", **kwargs) -> Answer:
        """A new member's join: for a dynamic member the KIP-394 dance (MEMBER_ID_REQUIRED, then join with
        the given id); a static member joins at once."""
        first = self.join(group, **kwargs)
        if kwargs.get("instance") is not None:
            return first
        assert first.error == ErrorCode.member_id_required
        return self.join(group, first.result.member_id, **kwargs)

    def sync(self, group: str, member_id: str, generation: int, assignments=None, *, instance=None) -> Answer:
        answer = Answer()
        self.coordinator.sync_group(group, generation, member_id, "consumer", None, instance, assignments or {},
                                    answer)
        return answer

    def heartbeat(self, group: str, member_id: str, generation: int, instance=None) -> ErrorCode:
        return self.coordinator.heartbeat(group, member_id, instance, generation)

    def commit(self, group: str, generation: int, member_id: str, offset: int = 5, instance=None,
               partition: int = 0, api_version: int = 9) -> ErrorCode:
        answers = []
        self.coordinator.commit_offsets(group, generation, member_id, {(TOPIC, partition): (offset, -1, "")}, answers.append,
                                        group_instance_id=instance, api_version=api_version)
        ((error,),) = [list(answer.values()) for answer in answers]  # answered at once: nothing waits here
        return error

    def stable_member(self, group: str = "g", **kwargs) -> tuple[str, int]:
        """A single member that joined and synced: (member id, generation)."""
        joined = self.join_new(group, **kwargs)
        self.clock.advance(0)
        assert joined.error == ErrorCode.none
        member, generation = joined.result.member_id, joined.result.generation_id
        assert self.sync(group, member, generation, {member: b"all"}).error == ErrorCode.none
        return member, generation

    def pass_time(self, ms: int, *alive: tuple[str, str, int]) -> None:
        """Let ``ms`` go by while the given (group, member, generation) members heartbeat regularly."""
        step = SESSION_MS // 3
        while ms > 0:
            self.clock.advance(min(step, ms))
            ms -= step
            for group, member, generation in alive:
                self.heartbeat(group, member, generation)

    def state(self, group: str = "g") -> GroupState | None:
        found = self.coordinator.group(group)
        return found.state if found is not None else None


@pytest.fixture
def logs(tmp_path):
    opened = OffsetsLogs(tmp_path / "data", PARTITIONS)
    yield opened
    opened.close()


@pytest.fixture
def h(logs) -> Harness:
    return Harness(logs)


def two_stable_members(h: Harness, group: str = "g") -> tuple[str, str, int]:
    """Leader A and follower B in a Stable generation: (A, B, generation)."""
    a, _ = h.stable_member(group)
    first_b = h.join(group, client="b")
    b_join = h.join(group, first_b.result.member_id, client="b")
    assert b_join.result is None  # parked: A must rejoin first
    assert h.heartbeat(group, a, 1) == ErrorCode.rebalance_in_progress
    a_join = h.join(group, a)
    assert a_join.error == ErrorCode.none and b_join.error == ErrorCode.none
    generation = a_join.result.generation_id
    assert generation == 2 and b_join.result.generation_id == 2
    b = b_join.result.member_id
    leader = a_join.result.leader
    assert leader == a and b_join.result.leader == a
    assert {m[0] for m in a_join.result.members} == {a, b} and b_join.result.members == ()
    follower_sync = h.sync(group, b, generation)
    assert follower_sync.result is None  # waits for the leader's assignment
    assert h.sync(group, a, generation, {a: b"p0,p1", b: b"p2,p3"}).result.assignment == b"p0,p1"
    assert follower_sync.result.assignment == b"p2,p3"
    assert h.state(group) is GroupState.STABLE
    return a, b, generation


# -- joining ----------------------------------------------------------------------------------------------


def test_first_join_needs_a_member_id_then_forms_generation_one(h):
    first = h.join(client="my-client")
    assert first.error == ErrorCode.member_id_required
    assert first.result.member_id.startswith("my-client-") and first.result.generation_id == -1
    joined = h.join(member_id=first.result.member_id, client="my-client")
    h.clock.advance(0)  # group.initial.rebalance.delay.ms = 0: the join phase ends on the next tick
    result = joined.result
    assert (result.error, result.generation_id, result.protocol_type, result.protocol_name) == (
        ErrorCode.none, 1, "consumer", "range")
    assert result.leader == result.member_id == first.result.member_id
    assert result.members == ((result.member_id, None, subscription(TOPIC)),)
    assert h.state() is GroupState.COMPLETING_REBALANCE


def test_before_v4_a_member_joins_without_the_member_id_round_trip(h):
    joined = h.join(known_id_required=False)
    h.clock.advance(0)
    assert joined.error == ErrorCode.none and joined.result.generation_id == 1


def test_join_errors(h):
    assert h.join(member_id="never-issued").error == ErrorCode.unknown_member_id
    assert h.join(session=999).error == ErrorCode.invalid_session_timeout
    assert h.join(session=1_800_001).error == ErrorCode.invalid_session_timeout
    assert h.join(group="").error == ErrorCode.invalid_group_id
    assert h.join(protocols=[]).error == ErrorCode.inconsistent_group_protocol
    h.stable_member()
    assert h.join(protocols=[("roundrobin", b"")]).error == ErrorCode.inconsistent_group_protocol
    assert h.join(protocol_type="connect").error == ErrorCode.inconsistent_group_protocol


def test_the_protocol_is_one_every_member_supports_chosen_by_vote(h):
    # A and B prefer roundrobin, C prefers range: both are common, roundrobin wins 2 to 1.
    both = [("roundrobin", b"rr"), ("range", b"r")]
    answers = [h.join(known_id_required=False, protocols=p)
               for p in (both, both, [("range", b"r"), ("roundrobin", b"rr")])]
    h.clock.advance(0)
    assert {a.result.protocol_name for a in answers} == {"roundrobin"}
    leader = next(a for a in answers if a.result.members)
    assert sorted(m[2] for m in leader.result.members) == [b"rr"] * 3  # metadata of the chosen protocol


def test_only_a_protocol_all_members_support_can_be_chosen(h):
    answers = [h.join(known_id_required=False, protocols=p)
               for p in ([("roundrobin", b""), ("sticky", b"")], [("sticky", b""), ("roundrobin", b"")])]
    answers.append(h.join(known_id_required=False, protocols=[("sticky", b"")]))
    h.clock.advance(0)
    assert {a.result.protocol_name for a in answers} == {"sticky"}


def test_two_members_rebalance_and_split_the_assignment(h):
    a, b, generation = two_stable_members(h)
    group = h.coordinator.group("g")
    assert {m.member_id: m.assignment for m in group.members.values()} == {a: b"p0,p1", b: b"p2,p3"}
    assert h.heartbeat("g", b, generation) == ErrorCode.none


def test_a_member_the_leader_assigned_nothing_gets_an_empty_assignment(h):
    a, _ = h.stable_member()
    b_join = h.join_new(client="b")
    a_join = h.join("g", a)
    b = b_join.result.member_id
    b_sync = h.sync("g", b, a_join.result.generation_id)
    h.sync("g", a, a_join.result.generation_id, {a: b"everything"})
    assert (b_sync.error, b_sync.result.assignment) == (ErrorCode.none, b"")


def test_a_join_during_completing_rebalance_sends_members_waiting_for_sync_back_to_join(h):
    a, _ = h.stable_member()
    b = h.join_new(client="b")
    a_again = h.join("g", a)
    generation = a_again.result.generation_id
    waiting = h.sync("g", b.result.member_id, generation)  # follower waits for the leader...
    h.join_new(client="c")  # ...when a third member arrives
    assert waiting.error == ErrorCode.rebalance_in_progress
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert h.sync("g", a, generation, {a: b"x"}).error == ErrorCode.rebalance_in_progress


def test_a_member_that_missed_its_join_answer_gets_the_generation_again(h):
    a, _ = h.stable_member()
    h.join_new(client="b")
    first = h.join("g", a)
    again = h.join("g", a)  # same protocols, group still CompletingRebalance
    assert again.result == first.result


# -- sessions, rebalance and sync deadlines ------------------------------------------------------------------


def test_a_silent_member_is_evicted_after_its_session_timeout_and_the_other_takes_over(h):
    a, b, generation = two_stable_members(h)
    for _ in range(2):  # A keeps heartbeating, B says nothing after its SyncGroup
        h.clock.advance(SESSION_MS * 4 // 10)
        assert h.heartbeat("g", a, generation) == ErrorCode.none
    h.clock.advance(SESSION_MS * 2 // 10 - 1)
    assert h.coordinator.group("g").has(b)
    h.clock.advance(1)
    assert not h.coordinator.group("g").has(b)
    assert h.heartbeat("g", a, generation) == ErrorCode.rebalance_in_progress
    rejoined = h.join("g", a)
    assert (rejoined.error, rejoined.result.generation_id) == (ErrorCode.none, generation + 1)
    assert [m[0] for m in rejoined.result.members] == [a]
    assert h.heartbeat("g", b, generation) == ErrorCode.unknown_member_id


def test_the_rebalance_timeout_drops_dynamic_members_that_do_not_rejoin(h):
    a, b, generation = two_stable_members(h)
    c = h.join_new(client="c")  # forces a rebalance: A rejoins, B never does (but heartbeats)
    a_join = h.join("g", a)
    for _ in range(REBALANCE_MS // 5_000 - 1):
        h.clock.advance(5_000)
        assert h.heartbeat("g", b, generation) == ErrorCode.rebalance_in_progress
    assert a_join.result is None
    h.clock.advance(5_000)
    assert a_join.error == ErrorCode.none and c.error == ErrorCode.none
    assert {m[0] for m in a_join.result.members} == {a, c.result.member_id}
    assert h.heartbeat("g", b, generation) == ErrorCode.unknown_member_id


def test_a_member_that_never_sends_sync_group_is_removed_at_the_rebalance_timeout(h):
    a, _ = h.stable_member()
    b = h.join_new(client="b")
    a_join = h.join("g", a)
    generation = a_join.result.generation_id
    h.sync("g", a, generation, {a: b"a"})
    assert h.state() is GroupState.STABLE  # the leader's assignment makes the group Stable at once
    # B stays alive but never asks for its assignment.
    h.pass_time(REBALANCE_MS, ("g", a, generation), ("g", b.result.member_id, generation))
    assert not h.coordinator.group("g").has(b.result.member_id)
    assert h.state() is GroupState.PREPARING_REBALANCE


def test_a_pending_member_that_never_rejoins_stops_blocking_the_rebalance(h):
    a, _ = h.stable_member()
    ghost = h.join(client="ghost")  # MEMBER_ID_REQUIRED, then silence
    assert ghost.error == ErrorCode.member_id_required
    real = h.join_new(client="real")
    a_join = h.join("g", a)
    assert a_join.result is None  # the pending ghost could still join
    h.clock.advance(SESSION_MS)
    assert a_join.error == ErrorCode.none and real.error == ErrorCode.none
    assert len(a_join.result.members) == 2


def test_the_initial_rebalance_delay_collects_members_and_extends_while_they_keep_coming(logs):
    h = Harness(logs, initial_rebalance_delay_ms=3_000)
    first = h.join_new(client="a")
    h.clock.advance(2_000)
    second = h.join_new(client="b")  # arrives within the delay: the delay is extended once more
    h.clock.advance(1_000)
    assert first.result is None and second.result is None
    h.clock.advance(2_999)
    assert first.result is None
    h.clock.advance(1)
    assert first.error == ErrorCode.none and second.error == ErrorCode.none
    assert first.result.generation_id == second.result.generation_id == 1


def test_the_initial_delay_never_exceeds_the_rebalance_timeout(logs):
    h = Harness(logs, initial_rebalance_delay_ms=3_000)
    answers = [h.join_new(client="first", rebalance=5_000)]
    for _ in range(4):  # a new member every second keeps the delay going...
        h.clock.advance(1_000)
        answers.append(h.join_new(client="next", rebalance=5_000))
    h.clock.advance(1_000)  # ...but only up to the 5 s rebalance timeout (3 s + the 2 s left)
    assert all(a.error == ErrorCode.none for a in answers)


# -- static membership ---------------------------------------------------------------------------------------


def test_a_static_member_rejoining_with_a_new_id_fences_the_old_id_without_a_rebalance(h):
    a, generation = h.stable_member(instance="instance-a")
    assert a.startswith("instance-a-")
    back = h.join(instance="instance-a", client="restarted")
    assert back.error == ErrorCode.none
    assert back.result.generation_id == generation and back.result.member_id != a
    assert back.result.leader == a  # the old leader id: before v9 a returning leader must not reassign
    assert h.state() is GroupState.STABLE
    assert h.heartbeat("g", a, generation, "instance-a") == ErrorCode.fenced_instance_id
    assert h.commit("g", generation, a, instance="instance-a") == ErrorCode.fenced_instance_id
    new_id = back.result.member_id
    assert h.sync("g", new_id, generation, instance="instance-a").result.assignment == b"all"
    assert h.heartbeat("g", new_id, generation, "instance-a") == ErrorCode.none


def test_from_v9_a_returning_static_leader_is_told_to_skip_the_assignment(h):
    h.stable_member(instance="instance-a")
    back = h.join(instance="instance-a", skipping=True)
    assert back.result.skip_assignment and back.result.leader == back.result.member_id
    assert len(back.result.members) == 1


def test_static_members_survive_the_rebalance_timeout_but_not_their_session(h):
    a, generation = h.stable_member(instance="a")
    dynamic = h.join_new(client="dynamic")
    h.pass_time(REBALANCE_MS, ("g", a, generation))  # A heartbeats but never rejoins; it is static: kept
    assert h.coordinator.group("g").static_member_id("a") == a
    assert dynamic.error == ErrorCode.none and dynamic.result.leader == dynamic.result.member_id
    h.clock.advance(SESSION_MS)
    assert h.coordinator.group("g").static_member_id("a") is None


def test_a_static_member_leaves_by_instance_id_alone(h):
    h.stable_member(instance="a")
    error, results = h.coordinator.leave_group("g", [LeavingMember("", "a"), LeavingMember("", "b")])
    assert error == ErrorCode.none
    assert [e for _, e in results] == [ErrorCode.none, ErrorCode.unknown_member_id]
    assert h.state() is GroupState.EMPTY


# -- leaving -----------------------------------------------------------------------------------------------


def test_the_last_member_leaving_empties_the_group_at_the_next_generation(h):
    a, generation = h.stable_member()
    error, results = h.coordinator.leave_group("g", [LeavingMember(a, reason="closing")])
    assert (error, [e for _, e in results]) == (ErrorCode.none, [ErrorCode.none])
    group = h.coordinator.group("g")
    assert (group.state, group.generation_id, group.protocol_name) == (GroupState.EMPTY, generation + 1, None)
    assert h.sync("g", a, generation + 1).error == ErrorCode.unknown_member_id
    error, results = h.coordinator.leave_group("g", [LeavingMember(a)])
    assert [e for _, e in results] == [ErrorCode.unknown_member_id]
    assert h.coordinator.leave_group("nope", [LeavingMember("x")])[1][0][1] == ErrorCode.unknown_member_id


def test_a_member_leaving_hands_its_partitions_to_the_rest(h):
    a, b, generation = two_stable_members(h)
    h.coordinator.leave_group("g", [LeavingMember(b)])
    assert h.heartbeat("g", a, generation) == ErrorCode.rebalance_in_progress
    rejoined = h.join("g", a)
    assert rejoined.result.generation_id == generation + 1 and len(rejoined.result.members) == 1


# -- offset commits ------------------------------------------------------------------------------------------


def test_simple_commits_are_valid_only_while_the_group_has_no_members(h):
    assert h.commit("g", -1, "") == ErrorCode.none  # creates a "simple" group
    assert h.state() is GroupState.EMPTY
    a, generation = h.stable_member()
    assert h.commit("g", -1, "") == ErrorCode.unknown_member_id
    assert h.commit("g", generation, a, offset=9) == ErrorCode.none
    assert h.coordinator.fetch_offsets("g", [(TOPIC, 0)])[1][(TOPIC, 0)].offset == 9


def test_commits_name_the_current_member_and_generation(h):
    a, b, generation = two_stable_members(h)
    assert h.commit("g", generation - 1, a) == ErrorCode.illegal_generation
    assert h.commit("g", generation, "someone-else") == ErrorCode.unknown_member_id
    # A generation of a group that does not exist: GROUP_ID_NOT_FOUND from OffsetCommit v9 (Kafka 4's
    # validateOffsetCommit), ILLEGAL_GENERATION below.
    assert h.commit("never-joined", 3, a) == ErrorCode.group_id_not_found
    assert h.commit("never-joined", 3, a, api_version=8) == ErrorCode.illegal_generation
    assert h.coordinator.group("never-joined") is None
    h.join_new(client="c")  # PreparingRebalance: commits of the current generation are still accepted
    assert h.commit("g", generation, b) == ErrorCode.none
    a_join = h.join("g", a)
    h.join("g", b)
    new_generation = a_join.result.generation_id
    assert h.state() is GroupState.COMPLETING_REBALANCE
    assert h.commit("g", new_generation, a) == ErrorCode.rebalance_in_progress
    assert h.commit("g", generation, a) == ErrorCode.illegal_generation


def test_a_member_left_behind_by_a_rebalance_cannot_commit_once_the_next_generation_exists(h):
    """The integration scenario's loaded-machine case: B's client gives up its member id (after an
    ILLEGAL_GENERATION) and joins again under a new one while the old id, silent, holds the rebalance
    until its session expires. The old id may commit while its generation is current (Kafka allows
    commits during PreparingRebalance); from the moment it is evicted, and for every member once the next
    generation exists, commits naming the old generation are refused, so no offset committed in the new
    generation can be overwritten by a stale one."""
    a, old_b, generation = two_stable_members(h)
    first = h.join("g", client="b")
    new_b = h.join("g", first.result.member_id, client="b")
    assert h.state() is GroupState.PREPARING_REBALANCE and new_b.result is None
    a_join = h.join("g", a)
    assert a_join.result is None  # waits for the old id, which never rejoins
    assert h.commit("g", generation, old_b, offset=7) == ErrorCode.none
    h.clock.advance(SESSION_MS)  # the old id's session runs out: evicted, and the join completes
    assert not h.coordinator.group("g").has(old_b)
    new_generation = a_join.result.generation_id
    assert new_generation == generation + 1 and new_b.result.generation_id == new_generation
    assert h.commit("g", generation, old_b, offset=3) == ErrorCode.unknown_member_id
    assert h.commit("g", generation, a, offset=3) == ErrorCode.illegal_generation
    assert h.commit("g", new_generation, new_b.result.member_id, offset=3) == ErrorCode.rebalance_in_progress
    h.sync("g", a, new_generation, {a: b"p0,p1", new_b.result.member_id: b"p2,p3"})
    assert h.commit("g", new_generation, new_b.result.member_id, offset=9) == ErrorCode.none
    assert h.commit("g", generation, old_b, offset=3) == ErrorCode.unknown_member_id
    assert h.coordinator.fetch_offsets("g", [(TOPIC, 0)])[1][(TOPIC, 0)].offset == 9


def test_unknown_partitions_and_large_metadata_are_refused_per_partition(h):
    answers = []
    h.coordinator.commit_offsets("g", -1, "", {(TOPIC, 0): (1, -1, "x" * 4097), (TOPIC, 9): (1, -1, ""),
                                               ("other", 0): (1, -1, ""), (TOPIC, 1): (1, -1, "ok")}, answers.append)
    (errors,) = answers
    assert errors == {(TOPIC, 0): ErrorCode.offset_metadata_too_large, (TOPIC, 9): ErrorCode.unknown_topic_or_partition,
                      ("other", 0): ErrorCode.unknown_topic_or_partition, (TOPIC, 1): ErrorCode.none}


# -- restart ----------------------------------------------------------------------------------------------------


def test_a_stable_group_comes_back_after_a_restart_and_expires_members_that_went_away(h):
    a, b, generation = two_stable_members(h)
    h.restart()
    group = h.coordinator.group("g")
    assert (group.state, group.generation_id, group.leader_id, group.protocol_name) == (
        GroupState.STABLE, generation, a, "range")
    assert {m.member_id: m.assignment for m in group.members.values()} == {a: b"p0,p1", b: b"p2,p3"}
    assert h.sync("g", b, generation).result.assignment == b"p2,p3"
    assert h.commit("g", generation, a) == ErrorCode.none
    h.clock.advance(SESSION_MS // 2)
    assert h.heartbeat("g", a, generation) == ErrorCode.none
    h.clock.advance(SESSION_MS // 2)  # B's session ran out (sync re-armed it 10 s ago): removed
    assert h.heartbeat("g", a, generation) == ErrorCode.rebalance_in_progress


def test_an_empty_group_keeps_its_generation_across_a_restart(h):
    a, generation = h.stable_member()
    h.coordinator.leave_group("g", [LeavingMember(a)])
    h.restart()
    group = h.coordinator.group("g")
    assert (group.state, group.generation_id, group.protocol_type) == (GroupState.EMPTY, generation + 1, "consumer")
    again = h.join_new()
    h.clock.advance(0)
    assert again.result.generation_id == generation + 2


# -- admin -----------------------------------------------------------------------------------------------------


def test_list_describe_and_delete_groups(h):
    a, _ = h.stable_member("live")
    h.commit("offsets-only", -1, "")
    listed = {g.group_id: (g.protocol_type, g.state) for g in h.coordinator.list_groups()[1]}
    assert listed == {"live": ("consumer", "Stable"), "offsets-only": ("", "Empty")}
    assert [g.group_id for g in h.coordinator.list_groups(["STABLE"])[1]] == ["live"]
    error, summary = h.coordinator.describe_group("live")
    assert (error, summary.state, summary.protocol) == (ErrorCode.none, "Stable", "range")
    (member,) = summary.members
    assert (member.member_id, member.client_host, member.metadata, member.assignment) == (
        a, "/127.0.0.1", subscription(TOPIC), b"all")
    assert h.coordinator.describe_group("nobody")[1].state == "Dead"
    results = h.coordinator.delete_groups(["live", "offsets-only", "nobody", "offsets-only"])
    assert results == {"live": ErrorCode.non_empty_group, "offsets-only": ErrorCode.none,
                       "nobody": ErrorCode.group_id_not_found}
    assert h.store.fetch("offsets-only") == {}
    assert h.coordinator.group("offsets-only") is None


def test_offset_delete_refuses_topics_a_live_consumer_group_reads(h):
    h.stable_member(protocols=[("range", subscription(TOPIC))])
    assert h.commit("g", 1, h.coordinator.group("g").leader_id, offset=1) == ErrorCode.none
    error, results = h.coordinator.delete_offsets("g", [(TOPIC, 0)])
    assert (error, results) == (ErrorCode.none, {(TOPIC, 0): ErrorCode.group_subscribed_to_topic})
    assert h.coordinator.delete_offsets("nobody", [(TOPIC, 0)]) == (ErrorCode.group_id_not_found, {})


def test_offset_delete_of_the_last_offsets_of_an_empty_group_removes_it(h):
    h.commit("g", -1, "")
    assert h.coordinator.delete_offsets("g", [(TOPIC, 0)]) == (ErrorCode.none, {(TOPIC, 0): ErrorCode.none})
    assert h.coordinator.group("g") is None and h.store.fetch("g") == {}


def test_the_group_max_size_turns_extra_members_away(logs):
    h = Harness(logs, max_size=1)
    h.stable_member()
    assert h.join(client="second").error == ErrorCode.group_max_size_reached


# -- offsets retention ---------------------------------------------------------------------------------------


def test_offsets_of_an_empty_group_expire_retention_after_it_emptied_then_the_group_goes(logs):
    h = Harness(logs, offsets_retention_ms=60_000)
    a, generation = h.stable_member()
    h.commit("g", generation, a)
    h.pass_time(120_000, ("g", a, generation))  # an old commit, but the group has a member: nothing expires
    assert h.coordinator.expire_offsets() == 0
    h.coordinator.leave_group("g", [LeavingMember(a)])
    h.clock.advance(59_999)
    assert h.coordinator.expire_offsets() == 0
    h.clock.advance(1)
    assert h.coordinator.expire_offsets() == 1
    assert h.coordinator.group("g") is None
    h.restart()
    assert h.coordinator.group("g") is None  # its metadata was tombstoned too


def test_simple_group_offsets_expire_by_commit_time(logs):
    h = Harness(logs, offsets_retention_ms=60_000)
    h.commit("simple", -1, "")
    h.clock.advance(30_000)
    assert h.commit("simple", -1, "", offset=3, partition=1) == ErrorCode.none
    h.clock.advance(30_000)
    assert h.coordinator.expire_offsets() == 1
    assert list(h.coordinator.fetch_offsets("simple", None)[1]) == [(TOPIC, 1)]


def test_a_stable_consumer_group_loses_offsets_of_topics_it_no_longer_reads(logs):
    h = Harness(logs, offsets_retention_ms=60_000)
    h.commit("g", -1, "")  # a commit for TOPIC while the group was empty
    assert h.commit("g", -1, "", offset=3, partition=1) == ErrorCode.none
    a, generation = h.stable_member(protocols=[("range", subscription("elsewhere"))])
    h.pass_time(60_000, ("g", a, generation))
    assert h.coordinator.expire_offsets() == 2
    assert h.coordinator.group("g").state is GroupState.STABLE

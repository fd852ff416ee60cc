"""The consumer group coordinator (KIP-848), driven heartbeat by heartbeat on a manual clock, as Kafka's
GroupMetadataManagerTest drives it: joins, epochs, the target assignment, reconciliation (revoke before
reassign), session and rebalance timeouts, leaving, static members, subscriptions by name and regex, topic
changes, the shared group ids with the classic protocol and the member-epoch checks of OffsetCommit v9.
The offset store and the classic coordinator are the real ones, on real logs."""

from __future__ import annotations

import asyncio
import struct
import uuid
from dataclasses import replace

import pytest

from pykbroker.cluster.metadata import PartitionState, TopicInfo
from pykbroker.groups.assignors import PartitionAssignorError
from pykbroker.groups.classic.coordinator import GroupConfig, GroupCoordinator, JoinRequest, LeavingMember
from pykbroker.groups.consumer.coordinator import (
    ConsumerGroupConfig, ConsumerGroupCoordinator, HeartbeatRequest, assignor_name, compile_topic_regex,
)
from pykbroker.groups.consumer.group import ConsumerGroupMember, GroupState, MemberState, reconcile
from pykbroker.groups.consumer_protocol import decode_assignment, encode_assignment, subscription_version
from pykbroker.groups.offset_store import OFFSETS_TOPIC, OffsetStore
from pykbroker.protocol.errors import ErrorCode
from tests.unit.test_group_coordinator import PARTITIONS, ManualClock, logs, subscription  # noqa: F401 (logs: fixture)
from tests.unit.test_offset_store import OffsetsLogs

REBALANCE_MS = 30_000
SESSION_MS = 45_000


def topic(name: str, partitions: int) -> TopicInfo:
    return TopicInfo(name, uuid.uuid4(), [PartitionState(0, 0, [0], [0]) for _ in range(partitions)])


class Harness:
    def __init__(self, logs: OffsetsLogs, **config) -> None:
        self.logs = logs
        self.config = config
        self.clock = ManualClock()
        self.topics: dict[str, TopicInfo] = {"orders": topic("orders", 4)}
        self._start()

    def _start(self) -> None:
        store = OffsetStore(self.logs.replicas, PARTITIONS)
        self.classic = GroupCoordinator(store, lambda t, p: t in self.topics and p < len(self.topics[t].partitions),
                                        GroupConfig(initial_rebalance_delay_ms=0, min_session_timeout_ms=1000),
                                        scheduler=self.clock)
        self.coordinator = ConsumerGroupCoordinator(self.classic, lambda: list(self.topics.values()),
                                                    ConsumerGroupConfig(**self.config), scheduler=self.clock)
        self.classic.consumer_groups = self.coordinator

        async def lead() -> None:  # what a single broker does at start
            for partition in range(PARTITIONS):
                self.classic.on_leadership_change(OFFSETS_TOPIC, partition, True)
            while self.classic.loading_partitions:
                await asyncio.sleep(0)

        asyncio.run(lead())

    def restart(self) -> None:
        self.classic.close()
        self.logs.reopen()
        self._start()

    def id_of(self, name: str = "orders") -> uuid.UUID:
        return self.topics[name].topic_id

    def heartbeat(self, request: HeartbeatRequest):
        answers = []
        self.coordinator.heartbeat(request, answers.append)
        (answer,) = answers  # on one broker the records are stored at once: answered now
        return answer

    def join(self, member: str, *, group: str = "g", topics=("orders",), regex=None, instance=None,
             assignor=None, version: int = 1):
        return self.heartbeat(HeartbeatRequest(
            group, member, 0, instance_id=instance, rebalance_timeout_ms=REBALANCE_MS,
            subscribed_topic_names=tuple(topics) if topics is not None else None, subscribed_topic_regex=regex,
            server_assignor=assignor, owned={}, version=version))

    def beat(self, member: str, epoch: int, owned=None, *, group: str = "g", instance=None, **fields):
        return self.heartbeat(HeartbeatRequest(group, member, epoch, instance_id=instance, owned=owned,
                                                           **fields))

    def group(self, group: str = "g"):
        return self.coordinator.group(group)


@pytest.fixture
def h(logs) -> Harness:
    return Harness(logs)


def parts(result, topic_id) -> set[int]:
    return set(result.assignment.get(topic_id, ())) if result.assignment is not None else None


# -- joining and the first assignment ---------------------------------------------------------------------


def test_a_first_member_gets_every_partition_at_epoch_one(h):
    joined = h.join("m1")
    assert (joined.error, joined.member_id, joined.member_epoch, joined.heartbeat_interval_ms) == (
        ErrorCode.none, "m1", 1, 5000)
    assert parts(joined, h.id_of()) == {0, 1, 2, 3}
    # A heartbeat carrying only what changed: nothing changed, so no assignment in the answer.
    again = h.beat("m1", 1, {h.id_of(): (0, 1, 2, 3)})
    assert (again.error, again.member_epoch, again.assignment) == (ErrorCode.none, 1, None)
    assert h.group().state is GroupState.STABLE
    assert (h.group().group_epoch, h.group().assignment_epoch) == (1, 1)


def test_partitions_move_only_after_their_owner_revoked_them(h):
    tid = h.id_of()
    h.join("m1")
    second = h.join("m2")
    # m2 is at the new epoch but its target partitions are still m1's: it gets none of them yet.
    assert second.member_epoch == 2 and parts(second, tid) == set()
    assert h.group().members["m2"].state is MemberState.UNRELEASED_PARTITIONS
    target_m2 = set(h.group().target_of("m2")[tid])
    assert len(target_m2) == 2
    # m1 is asked to give them up and stays at epoch 1 until it has.
    revoke = h.beat("m1", 1, {tid: (0, 1, 2, 3)})
    assert revoke.member_epoch == 1 and parts(revoke, tid) == {0, 1, 2, 3} - target_m2
    assert h.group().members["m1"].state is MemberState.UNREVOKED_PARTITIONS
    assert parts(h.beat("m2", 2, {}), tid) is None  # still held by m1: nothing new
    done = h.beat("m1", 1, {tid: tuple(sorted({0, 1, 2, 3} - target_m2))})
    assert done.member_epoch == 2 and done.assignment is None
    got = h.beat("m2", 2, {})
    assert got.member_epoch == 2 and parts(got, tid) == target_m2
    assert h.group().state is GroupState.STABLE


def test_a_wrong_epoch_is_fenced_but_the_previous_one_with_a_subset_is_accepted(h):
    tid = h.id_of()
    h.join("m1")
    assert h.beat("m1", 2, {}).error == ErrorCode.fenced_member_epoch
    h.join("m2")
    h.beat("m1", 1, {tid: (0, 1, 2, 3)})
    kept = sorted(h.group().members["m1"].assigned[tid])
    assert h.beat("m1", 1, {tid: tuple(kept)}).member_epoch == 2
    # The answer that moved m1 to epoch 2 may be lost: epoch 1 with a subset of its partitions is fine...
    assert h.beat("m1", 1, {tid: tuple(kept)}).error == ErrorCode.none
    # ...but not without saying what it owns (Kafka's isSubset of null is false), nor with partitions it does
    # not have.
    assert h.beat("m1", 1, None).error == ErrorCode.fenced_member_epoch
    fenced = h.beat("m1", 1, {tid: (0, 1, 2, 3)})
    assert fenced.error == ErrorCode.fenced_member_epoch and "smaller member epoch (1)" in fenced.message
    # A fenced member rejoins with epoch 0 under its id and gets its partitions again.
    rejoined = h.join("m1")
    assert rejoined.error == ErrorCode.none and parts(rejoined, tid) == set(kept)


def test_unknown_members_and_groups(h):
    assert h.beat("m1", 1, {}).error == ErrorCode.group_id_not_found
    h.join("m1")
    unknown = h.beat("m9", 1, {})
    assert unknown.error == ErrorCode.unknown_member_id and unknown.message == "Member m9 is not a member of group g."


def test_partitions_pending_revocation_by_the_member_itself_are_not_unreleased(h):
    """Kafka's computeNextAssignment: what only this member holds, pending its own revocation, is free for it."""
    tid = h.id_of()
    h.join("a")
    h.join("b")
    revoking = h.beat("a", 1, {tid: (0, 1, 2, 3)})
    a = h.group().members["a"]
    assert a.state is MemberState.UNREVOKED_PARTITIONS and revoking.member_epoch == 1
    kept = tuple(sorted(a.assigned[tid]))
    h.beat("b", -1)  # before a revoked: a's target is all four again, two of them pending its own revocation
    back = h.beat("a", 1, {tid: kept})
    assert (back.member_epoch, parts(back, tid)) == (3, {0, 1, 2, 3})
    assert h.group().members["a"].state is MemberState.STABLE


def test_a_member_in_an_unknown_state_is_fenced_unless_it_owns_nothing(h):
    """Kafka's CurrentAssignmentBuilder: the UNKNOWN state (a newer Kafka's) starts again from no partitions."""
    tid = h.id_of()
    h.join("m1")
    group = h.group()
    group.update_member(replace(group.members["m1"], state=MemberState.UNKNOWN))
    assert h.beat("m1", 1, {tid: (0, 1, 2, 3)}).error == ErrorCode.fenced_member_epoch
    assert h.beat("m1", 1, None).error == ErrorCode.fenced_member_epoch
    fresh = h.beat("m1", 1, {})
    assert (fresh.error, fresh.member_epoch) == (ErrorCode.none, 1)
    assert h.group().members["m1"].state is MemberState.STABLE and h.group().members["m1"].assigned[tid] == {0, 1, 2, 3}


def test_a_member_done_revoking_moves_one_epoch_at_most_to_its_target_epoch():
    tid = uuid.uuid4()
    member = ConsumerGroupMember("m", member_epoch=3, previous_member_epoch=2, state=MemberState.UNREVOKED_PARTITIONS,
                                 assigned={tid: frozenset({0})}, pending_revocation={tid: frozenset({1})})
    # The target moved on twice (epoch 5) and now takes partition 0 away too: revoke it at epoch 4, not 5.
    nxt = reconcile(member, 5, {tid: frozenset({2})}, lambda t, p: -1, {tid: (0,)})
    assert (nxt.state, nxt.member_epoch, dict(nxt.pending_revocation)) == (
        MemberState.UNREVOKED_PARTITIONS, 4, {tid: frozenset({0})})
    # A target epoch not above the member's: it stays there (min(epoch + 1, target)).
    assert reconcile(member, 3, {tid: frozenset({2})}, lambda t, p: -1, {tid: (0,)}).member_epoch == 3


# -- leaving and timeouts ----------------------------------------------------------------------------------


def test_leave_removes_the_member_and_bumps_the_epoch(h):
    h.join("m1")
    h.join("m2")
    left = h.beat("m2", -1)
    assert (left.error, left.member_id, left.member_epoch, left.heartbeat_interval_ms) == (ErrorCode.none, "m2", -1, 0)
    assert set(h.group().members) == {"m1"} and h.group().group_epoch == 3
    assert h.beat("m2", 2, {}).error == ErrorCode.unknown_member_id
    assert h.beat("m2", -1).error == ErrorCode.unknown_member_id


def test_a_silent_member_is_removed_after_its_session_timeout(h):
    tid = h.id_of()
    h.join("m1")
    h.join("m2")
    for _ in range(2):  # m1 keeps heartbeating, m2 does not
        h.clock.advance(SESSION_MS // 3)
        owned = {tid: tuple(sorted(h.group().members["m1"].assigned.get(tid, ())))}
        h.beat("m1", h.group().members["m1"].member_epoch, owned)
    h.clock.advance(SESSION_MS // 3 - 1)
    assert set(h.group().members) == {"m1", "m2"}
    h.clock.advance(1)
    assert set(h.group().members) == {"m1"}
    back = h.beat("m1", h.group().members["m1"].member_epoch, {tid: tuple(h.group().members["m1"].assigned[tid])})
    assert back.member_epoch == 3 and parts(back, tid) == {0, 1, 2, 3}


def test_a_member_that_does_not_revoke_within_its_rebalance_timeout_is_fenced(h):
    tid = h.id_of()
    h.join("m1")
    h.join("m2")
    h.beat("m1", 1, {tid: (0, 1, 2, 3)})  # asked to revoke
    h.clock.advance(REBALANCE_MS // 2)
    h.beat("m1", 1, {tid: (0, 1, 2, 3)})  # still owns them
    h.beat("m2", 2, {})
    h.clock.advance(REBALANCE_MS // 2 + 1)
    assert "m1" not in h.group().members
    got = h.beat("m2", 2, {})
    assert got.error == ErrorCode.none and parts(got, tid) == {0, 1, 2, 3} and got.member_epoch == 3


class FailingAssignor:
    def assign(self, *args, **kwargs):
        raise PartitionAssignorError("boom")


def test_a_heartbeat_failing_midway_leaves_the_group_and_its_timers_as_they_were(h, monkeypatch):
    """Kafka applies a heartbeat's records only once it succeeded: an assignor's error changes nothing."""
    import pykbroker.groups.consumer.coordinator as coordinator

    h.join("m1")
    h.join("s1", instance="i1")
    h.beat("s1", -2, instance="i1")
    before = stored_view(h.group())
    monkeypatch.setattr(coordinator, "assignor_for", lambda name: FailingAssignor())
    failed = h.join("m2")
    assert (failed.error, failed.message) == (
        ErrorCode.unknown_server_error, f"Failed to compute a new target assignment for epoch {before[0] + 1}: boom.")
    # The static member's return under a new id, with a new subscription: it took s1's place, then failed.
    h.topics["other"] = topic("other", 1)
    assert h.join("s2", instance="i1", topics=("other",)).error == ErrorCode.unknown_server_error
    assert stored_view(h.group()) == before and h.group().static_member("i1").member_id == "s1"
    assert h.group().subscribers == {"orders": 2}
    assert sorted(k for k in h.coordinator._session_timers if k[0] == "g") == [("g", "m1"), ("g", "s1")]
    monkeypatch.undo()
    assert h.join("m3", group="new").error == ErrorCode.none  # (other groups carry on)
    h.clock.advance(SESSION_MS + 1)  # m1 and the parked s1 still have their session timers: both go
    assert h.group().is_empty()


# -- static members ---------------------------------------------------------------------------------------


def test_a_restarted_static_member_keeps_its_partitions(h):
    tid = h.id_of()
    h.join("s1", instance="i1")
    h.join("m2")
    h.beat("s1", 1, {tid: (0, 1, 2, 3)}, instance="i1")
    kept = set(h.group().members["s1"].assigned[tid])
    h.beat("s1", 1, {tid: tuple(kept)}, instance="i1")
    # Another process cannot take the instance id while it is held.
    taken = h.join("s2", instance="i1")
    assert taken.error == ErrorCode.unreleased_instance_id
    left = h.beat("s1", -2, instance="i1")
    assert (left.error, left.member_epoch) == (ErrorCode.none, -2)
    epoch = h.group().group_epoch
    back = h.join("s2", instance="i1")
    assert back.error == ErrorCode.none and parts(back, tid) == kept
    assert set(h.group().members) == {"s2", "m2"} and h.group().group_epoch == epoch  # no rebalance
    assert h.beat("s1", 2, {}, instance="i1").error == ErrorCode.fenced_instance_id


def test_a_bad_regex_of_a_returning_static_member_changes_nothing(h):
    h.join("s1", instance="i1")
    h.beat("s1", -2, instance="i1")
    refused = h.join("s2", instance="i1", topics=None, regex="(?<=x)y")
    assert refused.error == ErrorCode.invalid_regular_expression
    assert refused.message.startswith("SubscribedTopicRegex `(?<=x)y` is not a valid regular expression: ")
    assert set(h.group().members) == {"s1"} and h.group().members["s1"].member_epoch == -2


def test_a_static_member_that_never_comes_back_is_removed_after_its_session_timeout(h):
    h.join("s1", instance="i1")
    h.beat("s1", -2, instance="i1")
    h.clock.advance(SESSION_MS + 1)
    assert h.group().is_empty() and h.group().state is GroupState.EMPTY


# -- subscriptions and topic changes ---------------------------------------------------------------------


def test_a_regex_subscription_follows_topics_as_they_are_created(h):
    joined = h.join("m1", topics=None, regex="ord.*")
    assert parts(joined, h.id_of()) == {0, 1, 2, 3}
    h.topics["ordinals"] = topic("ordinals", 2)
    h.topics["other"] = topic("other", 2)
    grown = h.beat("m1", 1, {h.id_of(): (0, 1, 2, 3)})
    assert grown.member_epoch == 2 and parts(grown, h.id_of("ordinals")) == {0, 1}
    assert h.id_of("other") not in grown.assignment


@pytest.mark.timeout(60)  # Python's backtracking re took ~2^n steps here: the broker's event loop froze
def test_a_catastrophic_regex_matches_long_topic_names_in_linear_time(h):
    """RE2 (Kafka's RE2/J) matches without backtracking: ``([a-z-]+)+!`` over 200-character names completes."""
    for i in range(20):
        h.topics["a" * 200 + f"-{i:02d}"] = topic("a" * 200 + f"-{i:02d}", 1)
    h.topics["ab-!"] = topic("ab-!", 1)
    joined = h.join("m1", topics=None, regex="([a-z-]+)+!")
    assert joined.error == ErrorCode.none and set(joined.assignment) == {h.id_of("ab-!")}


def test_what_re2_refuses_is_an_invalid_regular_expression(h, capfd):
    for pattern in ("(?=orders)o.*", "(?<!x)orders", "(o)\\1rders", "(?>orders)", "orders++"):
        refused = h.join("m1", topics=None, regex=pattern)
        assert refused.error == ErrorCode.invalid_regular_expression, pattern
    assert h.group() is None
    with pytest.raises(ValueError, match="invalid perl operator"):
        compile_topic_regex("(?=orders)o.*")
    assert compile_topic_regex(r"\Qor.ers\E").fullmatch("or.ers")  # RE2/J's quoting, which Python's re lacks
    assert "Error parsing" not in capfd.readouterr().err  # RE2 logs nothing itself: the answer says why


def test_heartbeats_read_the_topics_only_when_they_or_a_subscription_changed(h):
    """The subscription metadata is computed again only on a new topics version (the broker's metadata counts
    its changes) or a changed subscription, so one member's huge subscription does not slow every heartbeat;
    a regex keeps one resolution, the latest."""
    reads = []
    version = [0]

    def topics():
        reads.append(version[0])
        return list(h.topics.values())

    h.coordinator._topics, h.coordinator._topics_version = topics, lambda: version[0]
    tid = h.id_of()
    h.join("m1")
    h.join("big", topics=("orders", *(f"nope{i}" for i in range(1000))))
    h.join("rx", topics=None, regex="ord.*")
    group = h.group()
    assert group.subscribers["orders"] == 2 and group.subscribers["nope999"] == 1 and group.regex_subscribers == {
        "ord.*": 1}
    reads.clear()
    for _ in range(3):
        for member in ("m1", "big", "rx"):
            assert h.beat(member, group.members[member].member_epoch, None).error == ErrorCode.none
    assert reads == []
    for i in range(5):  # topics come and go: one new read each time, one regex resolution kept
        h.topics[f"ordinal{i}"] = topic(f"ordinal{i}", 1)
        version[0] += 1
        h.beat("m1", group.members["m1"].member_epoch, None)
    assert reads == [1, 2, 3, 4, 5] and set(h.coordinator._resolved) == {"ord.*"}
    assert "ordinal4" in group.subscription_metadata and group.group_epoch == 3 + 5
    h.topics["nope7"] = topic("nope7", 2)
    version[0] += 1
    h.beat("big", group.members["big"].member_epoch, None)
    assert "nope7" in group.subscription_metadata
    h.beat("big", -1)  # its names go with it
    assert "nope7" not in group.subscription_metadata and "nope7" not in group.subscribers
    assert set(group.subscription_metadata) >= {"orders", "ordinal0"} and tid in group.target_of("m1")


def test_a_regex_keeps_only_the_topics_its_heartbeats_principal_may_describe(h):
    """Kafka 4's filterTopicDescribeAuthorizedTopics, with the principal of the heartbeat resolving the regex."""
    h.topics["ordinals"] = topic("ordinals", 2)
    asked = []

    def describable(names):
        asked.append(sorted(names))
        return {name for name in names if name != "ordinals"}

    joined = h.heartbeat(HeartbeatRequest("g", "m1", 0, rebalance_timeout_ms=REBALANCE_MS, subscribed_topic_regex="ord.*",
                                          owned={}, describable=describable))
    assert set(joined.assignment) == {h.id_of()} and asked == [["orders", "ordinals"]]
    assert set(h.group().subscription_metadata) == {"orders"}
    # A heartbeat of a principal that may describe everything (no authorizer) resolves it next time.
    h.topics["ordnance"] = topic("ordnance", 1)
    grown = h.beat("m1", 1, {h.id_of(): (0, 1, 2, 3)})
    assert set(grown.assignment) == {h.id_of(), h.id_of("ordinals"), h.id_of("ordnance")}


def test_partitions_added_and_a_topic_deleted_bump_the_group_epoch(h):
    tid = h.id_of()
    h.join("m1")
    h.topics["orders"].partitions.append(PartitionState(0, 0, [0], [0]))
    grown = h.beat("m1", 1, {tid: (0, 1, 2, 3)})
    assert grown.member_epoch == 2 and parts(grown, tid) == {0, 1, 2, 3, 4}
    del h.topics["orders"]
    gone = h.beat("m1", 2, {tid: (0, 1, 2, 3, 4)})
    assert (gone.member_epoch, gone.assignment) == (2, {})  # asked to revoke everything first
    assert h.beat("m1", 2, {}).member_epoch == 3


def test_bad_requests_get_kafkas_errors(h):
    def join(**fields):
        base = dict(rebalance_timeout_ms=REBALANCE_MS, subscribed_topic_names=("orders",), owned={})
        base.update(fields)
        return h.heartbeat(HeartbeatRequest(base.pop("group", "g"), base.pop("member", "m1"), 0, **base))

    cases = [
        (join(member=""), ErrorCode.invalid_request, "MemberId can't be empty."),
        (join(group=""), ErrorCode.invalid_request, "GroupId can't be empty."),
        (join(instance_id=""), ErrorCode.invalid_request, "InstanceId can't be empty."),
        (join(rebalance_timeout_ms=-1), ErrorCode.invalid_request, "RebalanceTimeoutMs must be provided in first request."),
        (join(owned={h.id_of(): (0,)}), ErrorCode.invalid_request, "TopicPartitions must be empty when (re-)joining."),
        (join(owned=None), ErrorCode.invalid_request, "TopicPartitions must be empty when (re-)joining."),
        (join(owned={h.id_of(): ()}), ErrorCode.invalid_request, "TopicPartitions must be empty when (re-)joining."),
        (join(subscribed_topic_names=None), ErrorCode.invalid_request,
         "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when (re-)joining."),
        (h.beat("m1", -2), ErrorCode.invalid_request, "InstanceId can't be null."),
        (h.beat("m1", -3), ErrorCode.invalid_request, "MemberEpoch is invalid."),
        (join(server_assignor="sticky"), ErrorCode.unsupported_assignor,
         "ServerAssignor sticky is not supported. Supported assignors: uniform, range."),
        (join(subscribed_topic_regex="(unclosed"), ErrorCode.invalid_regular_expression, None),
        (join(subscribed_topic_regex="(?=lookahead)x"), ErrorCode.invalid_regular_expression, None),
    ]
    for result, error, message in cases:
        assert result.error == error, (result, error)
        if message is not None:
            assert result.message == message
    assert h.group() is None  # nothing was created by any of them
    # v0 lets the coordinator choose the id: an empty one is no error there.
    assert h.heartbeat(HeartbeatRequest("g", "x", 0, rebalance_timeout_ms=1, subscribed_topic_names=(),
                                                    owned={}, version=0)).error == ErrorCode.none


def test_the_group_size_is_bounded(logs):
    h = Harness(logs, max_size=1)
    h.join("m1")
    full = h.join("m2")
    assert full.error == ErrorCode.group_max_size_reached
    assert full.message == "The consumer group has reached its maximum capacity of 1 members."


def test_a_static_member_rejoining_under_a_new_member_id_into_a_full_group_is_refused(logs):
    """Kafka 4's throwIfConsumerGroupIsFull counts by member id: a static member's new id is a new member."""
    h = Harness(logs, max_size=1)
    h.join("s1", instance="i1")
    h.beat("s1", -2, instance="i1")
    assert h.join("s2", instance="i1").error == ErrorCode.group_max_size_reached
    assert set(h.group().members) == {"s1"}


def test_the_assignor_is_the_one_most_members_name(h):
    tid = h.id_of()
    h.join("a", assignor="range")
    h.join("b", assignor="range")
    assert h.group().preferred_assignor("uniform") == "range"
    assert sorted(h.group().target_of("a")[tid]) == [0, 1]  # range: contiguous, in member order


def test_config_names_and_bounds():
    assert assignor_name("org.apache.kafka.coordinator.group.assignor.UniformAssignor") == "uniform"
    assert assignor_name("range") == "range"
    with pytest.raises(ValueError):
        ConsumerGroupConfig(session_timeout_ms=1000)
    with pytest.raises(ValueError, match="unknown assignor"):
        ConsumerGroupConfig(assignors=("uniform", "sticky"))
    with pytest.raises(ValueError, match="invalid escape sequence"):
        compile_topic_regex(r"(a)\1")
    assert compile_topic_regex("orders-.*").fullmatch("orders-eu")


# -- the classic protocol beside it ----------------------------------------------------------------------


def classic_join(h: Harness, group: str = "g", member_id: str = "", protocol_type: str = "consumer"):
    answers = []
    h.classic.join_group(JoinRequest(group, member_id, protocol_type, [("range", subscription("orders"))], 10_000,
                                     30_000, None, "c", "/127.0.0.1", False), answers.append)
    h.clock.advance(0)
    return answers[0] if answers else None


def test_a_group_id_belongs_to_one_protocol_at_a_time(h):
    classic = classic_join(h, "cg", protocol_type="connect")
    assert classic.error == ErrorCode.none
    refused = h.join("m1", group="cg")
    assert (refused.error, refused.message) == (
        ErrorCode.group_id_not_found,
        "Cannot upgrade classic group cg to consumer group because the group does not use the consumer embedded "
        "protocol.")
    # An empty group of either kind gives its id up.
    h.join("m1", group="ng")
    h.beat("m1", -1, group="ng")
    assert classic_join(h, "ng").error == ErrorCode.none and not h.coordinator.has_group("ng")


def running_classic_group(h: Harness, group: str = "cg", members: int = 1, protocol_type: str = "consumer") -> None:
    """A classic group with ``members`` members (joined, some still rebalancing: members all the same)."""
    for _ in range(members):
        h.classic.join_group(JoinRequest(group, "", protocol_type, [("range", subscription("orders"))], 10_000,
                                         30_000, None, "c", "/127.0.0.1", False), lambda answer: None)
        h.clock.advance(0)
    assert h.classic.group(group).size() == members


@pytest.mark.parametrize("policy", ["disabled", "downgrade"])
def test_a_running_classic_group_is_not_upgraded_when_the_policy_forbids_it(logs, policy):
    h = Harness(logs, migration_policy=policy)
    running_classic_group(h)
    refused = h.join("m1", group="cg")
    # Kafka 4's validateOnlineUpgrade: GROUP_ID_NOT_FOUND, the reason in the message; the classic group stays.
    assert (refused.error, refused.message) == (
        ErrorCode.group_id_not_found,
        "Cannot upgrade classic group cg to consumer group because online upgrade is disabled.")
    assert h.classic.group("cg").size() == 1 and not h.coordinator.has_group("cg")


def test_a_running_classic_group_of_another_protocol_type_or_too_large_is_not_upgraded(logs):
    h = Harness(logs, migration_policy="upgrade", max_size=1)
    running_classic_group(h, "connect-group", protocol_type="connect")
    refused = h.join("m1", group="connect-group")
    assert (refused.error, refused.message) == (
        ErrorCode.group_id_not_found, "Cannot upgrade classic group connect-group to consumer group because the "
                                      "group does not use the consumer embedded protocol.")
    running_classic_group(h, "big", members=2)
    refused = h.join("m1", group="big")
    assert (refused.error, refused.message) == (
        ErrorCode.group_id_not_found, "Cannot upgrade classic group big to consumer group because the group size "
                                      "exceeds the consumer group maximum size.")


@pytest.mark.parametrize("policy", ["disabled", "upgrade", "downgrade", "bidirectional"])
def test_empty_groups_change_protocol_whatever_the_migration_policy(logs, policy):
    h = Harness(logs, migration_policy=policy)
    assert classic_join(h, "g").error == ErrorCode.none
    h.classic.leave_group("g", [LeavingMember(h.classic.group("g").leader_id)])
    assert h.join("m1").error == ErrorCode.none and h.classic.group("g") is None
    assert h.beat("m1", -1).error == ErrorCode.none
    assert classic_join(h, "g").error == ErrorCode.none and not h.coordinator.has_group("g")


def test_a_join_with_a_bad_regex_leaves_an_empty_classic_group_alone(h):
    assert classic_join(h, "g").error == ErrorCode.none
    h.classic.leave_group("g", [LeavingMember(h.classic.group("g").leader_id)])
    assert h.join("m1", topics=None, regex="(?=x)").error == ErrorCode.invalid_regular_expression
    assert h.classic.group("g") is not None and not h.coordinator.has_group("g")


def test_the_migration_policy_is_checked_at_start():
    assert ConsumerGroupConfig().migration_policy == "bidirectional"  # Kafka 4.0's default
    assert (ConsumerGroupConfig(migration_policy="upgrade").upgrade_enabled,
            ConsumerGroupConfig(migration_policy="upgrade").downgrade_enabled) == (True, False)
    with pytest.raises(ValueError, match="group.consumer.migration.policy"):
        ConsumerGroupConfig(migration_policy="sideways")


def test_an_empty_classic_group_becomes_a_consumer_group_and_keeps_its_offsets(h):
    answers = []
    h.classic.commit_offsets("g", -1, "", {("orders", 0): (42, -1, "")}, answers.append)
    assert answers == [{("orders", 0): ErrorCode.none}]
    assert h.join("m1").error == ErrorCode.none
    assert h.classic.group("g") is None
    assert h.classic.fetch_offsets("g", [("orders", 0)])[1][("orders", 0)].offset == 42


def test_offset_commits_of_a_consumer_group_check_the_member_epoch(h):
    tid = h.id_of()
    h.join("m1")

    def commit(member, epoch, version=9):
        answers = []
        h.classic.commit_offsets("g", epoch, member, {("orders", 0): (7, -1, "")}, answers.append, api_version=version)
        return answers[0][("orders", 0)]

    assert commit("m1", 1) == ErrorCode.none
    assert commit("m1", 0) == ErrorCode.stale_member_epoch
    assert commit("m1", 2) == ErrorCode.stale_member_epoch
    assert commit("m9", 1) == ErrorCode.unknown_member_id
    assert commit("", -1) == ErrorCode.unknown_member_id  # no "simple" commits while it has members
    assert commit("m1", 1, version=8) == ErrorCode.unsupported_version
    assert h.coordinator.validate_offset_fetch("g", "m1", 1) is None
    assert h.coordinator.validate_offset_fetch("g", "m1", 0) == ErrorCode.stale_member_epoch
    assert h.coordinator.validate_offset_fetch("g", "m9", 1) == ErrorCode.unknown_member_id
    assert h.coordinator.validate_offset_fetch("g", None, -1) is None
    h.beat("m1", -1)
    assert commit("", -1) == ErrorCode.none
    del tid


# -- persistence ------------------------------------------------------------------------------------------


def test_a_restart_resumes_every_group_where_it_was(h):
    tid = h.id_of()
    h.join("m1")
    h.join("s1", instance="i1")
    h.beat("m1", 1, {tid: (0, 1, 2, 3)})  # m1 revoking: UNREVOKED_PARTITIONS at epoch 1
    h.join("gone", group="other")
    h.beat("gone", -1, group="other")
    before = h.group()
    members = dict(before.members)
    targets = {m: dict(t) for m, t in before.target_assignment.items()}
    epochs = (before.group_epoch, before.assignment_epoch)
    h.restart()
    after = h.group()
    assert (after.group_epoch, after.assignment_epoch) == epochs
    assert after.members == members
    assert {m: dict(t) for m, t in after.target_assignment.items()} == targets
    assert after.members["s1"].instance_id == "i1" and after.static_member("i1") is after.members["s1"]
    assert after.subscription_metadata == before.subscription_metadata
    # The member that left stays gone; its empty group is still there (its offsets could be).
    assert h.group("other").is_empty() and h.group("other").group_epoch == 2
    # The members carry on at their epochs: m1 finishes its revocation, s1 then gets its partitions.
    kept = tuple(sorted(after.members["m1"].assigned[tid]))
    assert h.beat("m1", 1, {tid: kept}).member_epoch == 2
    got = h.beat("s1", 2, {})
    assert got.error == ErrorCode.none and parts(got, tid) == set(after.target_of("s1")[tid])


def stored_view(group):
    return (group.group_epoch, group.assignment_epoch, dict(group.members),
            {m: dict(t) for m, t in group.target_assignment.items()}, dict(group.subscription_metadata))


@pytest.mark.parametrize("error", [ErrorCode.not_coordinator, ErrorCode.not_enough_replicas])
def test_after_a_failed_write_the_next_one_stores_the_whole_group(h, error):
    """A write that failed leaves the log behind memory: the group's next write is all of it, so a restart
    resumes the group memory has (the changes alone would miss what the failed write held)."""
    tid = h.id_of()
    h.join("m1")
    store = h.classic.store
    real = store.append_group_records

    def failing(group_id, records, now_ms, done=None):
        if done is not None:
            done(error)

    store.append_group_records = failing
    assert h.join("m2").error == error  # m2's join, its new target and the group epoch: not stored
    assert h.beat("m1", 1, {tid: (0, 1, 2, 3)}).error == error
    store.append_group_records = real
    retried = h.join("m2")  # the client retries; memory already has m2, so this changes nothing more
    assert retried.error == ErrorCode.none
    memory = stored_view(h.group())
    h.restart()
    assert stored_view(h.group()) == memory and set(h.group().members) == {"m1", "m2"}


def test_a_member_removed_by_a_failed_write_is_tombstoned_by_the_next(h):
    h.join("m1")
    h.join("m2")
    store = h.classic.store
    real = store.append_group_records
    store.append_group_records = lambda group_id, records, now_ms, done=None: done(ErrorCode.not_enough_replicas)
    assert h.beat("m1", -1).error == ErrorCode.not_enough_replicas
    store.append_group_records = real
    assert h.beat("m2", 2, None).error == ErrorCode.none
    memory = stored_view(h.group())
    h.restart()
    assert stored_view(h.group()) == memory and set(h.group().members) == {"m2"}


def test_a_partition_another_member_holds_is_refused():
    from pykbroker.groups.consumer.group import ConsumerGroup, ConsumerGroupMember, PartitionOwnedError

    tid = uuid.uuid4()
    group = ConsumerGroup("g")
    group.update_member(ConsumerGroupMember("a", member_epoch=3, assigned={tid: frozenset({0, 1})}))
    b = ConsumerGroupMember("b", member_epoch=4, assigned={tid: frozenset({1, 2})})
    with pytest.raises(PartitionOwnedError, match="still owned at epoch 3"):
        group.update_member(b)
    assert "b" not in group.members and group.partition_epoch(tid, 1) == 3 and group.partition_epoch(tid, 2) == -1
    group.update_member(ConsumerGroupMember("a", member_epoch=4, assigned={tid: frozenset({1, 2})}))  # its own
    assert group.partition_epoch(tid, 0) == -1 and group.partition_epoch(tid, 2) == 4


def test_members_restored_by_a_load_must_heartbeat_within_their_session(h):
    h.join("m1")
    h.restart()
    h.clock.advance(SESSION_MS + 1)
    assert h.group().is_empty()
    h.restart()
    assert h.group().is_empty() and h.group().group_epoch == 2  # the removal was stored too


def test_an_empty_group_without_offsets_is_removed_with_its_records(h):
    h.join("m1")
    h.beat("m1", -1)
    h.classic.expire_offsets()
    assert h.group() is None
    h.restart()
    assert h.group() is None and h.classic.group("g") is None


def test_offsets_of_a_consumer_group_with_members_do_not_expire(h):
    h.join("m1")
    answers = []
    h.classic.commit_offsets("g", 1, "m1", {("orders", 0): (9, -1, "")}, answers.append)
    assert answers == [{("orders", 0): ErrorCode.none}]
    h.clock.now += h.classic.config.offsets_retention_ms + 1
    h.beat("m1", 1, {h.id_of(): (0, 1, 2, 3)})  # (its session timer is not due: the manual clock jumped)
    assert h.classic.expire_offsets() == 0
    assert h.classic.fetch_offsets("g", [("orders", 0)])[1][("orders", 0)].offset == 9
    h.beat("m1", -1)
    assert h.classic.expire_offsets(h.clock.now + h.classic.config.offsets_retention_ms + 1) == 1
    assert h.group() is None  # empty and without offsets: removed


def test_a_coordinator_that_loses_the_partition_forgets_its_groups_and_a_new_one_loads_them(h):
    tid = h.id_of()
    h.join("m1")
    partition = h.classic.store.partition_for("g")
    for coordinator in (h.classic, h.coordinator):  # what a LeaderAndIsr making this broker a follower does
        coordinator.on_leadership_change(OFFSETS_TOPIC, partition, False)
    assert h.group() is None
    assert h.beat("m1", 1, {tid: (0, 1, 2, 3)}).error == ErrorCode.not_coordinator
    h.clock.advance(SESSION_MS + 1)  # no timer of the unloaded group fires here

    async def lead_again() -> None:
        h.classic.on_leadership_change(OFFSETS_TOPIC, partition, True)
        while h.classic.loading_partitions:
            await asyncio.sleep(0)

    asyncio.run(lead_again())
    back = h.beat("m1", 1, {tid: (0, 1, 2, 3)})
    assert (back.error, back.member_epoch) == (ErrorCode.none, 1)


def test_transactional_offset_commits_of_a_consumer_group_check_the_member_epoch(h):
    h.join("m1")

    def txn_commit(member, epoch):
        answers = []
        h.classic.commit_transactional_offsets("g", 5000, 0, epoch, member, {("orders", 0): (7, -1, "")},
                                               answers.append)
        return answers[0][("orders", 0)]

    assert txn_commit("m1", 0) == ErrorCode.stale_member_epoch
    assert txn_commit("m9", 1) == ErrorCode.unknown_member_id
    assert txn_commit("", -1) == ErrorCode.unknown_member_id  # TxnOffsetCommit v0-2 names no member
    assert txn_commit("m1", 1) == ErrorCode.none
    assert h.classic.group("g") is None  # no classic group was made up for the consumer group's id
    assert h.classic.store.pending_producers("g") == [5000]


def test_delete_groups_and_offset_delete_on_a_consumer_group(h):
    h.topics["other"] = topic("other", 1)
    h.join("m1")
    answers = []
    h.classic.commit_offsets("g", 1, "m1", {("orders", 0): (1, -1, ""), ("other", 0): (2, -1, "")}, answers.append)
    assert h.classic.delete_groups(["g"]) == {"g": ErrorCode.non_empty_group}
    assert h.classic.delete_offsets("g", [("orders", 0), ("other", 0)]) == (
        ErrorCode.none, {("orders", 0): ErrorCode.group_subscribed_to_topic, ("other", 0): ErrorCode.none})
    h.beat("m1", -1)
    assert h.classic.delete_groups(["g"]) == {"g": ErrorCode.none}
    assert h.group() is None and h.classic.fetch_offsets("g", None)[1] == {}
    h.restart()
    assert h.group() is None and h.classic.group("g") is None


def test_list_groups_shows_consumer_groups_beside_classic_ones(h):
    h.join("m1")
    classic_join(h, "cg")
    error, overviews = h.classic.list_groups()
    assert error == ErrorCode.none
    assert {(o.group_id, o.protocol_type, o.state, o.group_type) for o in overviews} == {
        ("g", "consumer", "Stable", "consumer"), ("cg", "consumer", "CompletingRebalance", "classic")}
    assert [o.group_id for o in h.classic.list_groups(["stable"])[1]] == ["g"]


@pytest.mark.parametrize("seed", range(5))
def test_random_churn_never_gives_a_partition_to_two_members_and_settles(h, seed):
    """Members join, leave, lag behind and heartbeat in random order while a topic grows: at every step each
    partition is held (assigned or being revoked) by at most one member, and once everyone heartbeats the
    group is Stable with every partition assigned exactly once."""
    import random

    rng = random.Random(seed)
    tid = h.id_of()
    owned: dict[str, set[int]] = {}  # what each client believes it owns
    epochs: dict[str, int] = {}

    latest: dict[str, set[int]] = {}  # the last assignment a client was given, applied with a delay

    def beat(member: str, *, lag: bool = True) -> None:
        if member in latest and not (lag and rng.random() < 0.4):  # a slow on_revoke: still owned a while
            owned[member] = latest.pop(member)
        result = h.beat(member, epochs[member], {tid: tuple(sorted(owned[member]))})
        assert result.error == ErrorCode.none, result
        epochs[member] = result.member_epoch
        if result.assignment is not None:
            latest[member] = set(result.assignment.get(tid, ()))

    def check_exclusive() -> None:
        holders: dict[int, str] = {}
        for member in (h.group().members.values() if h.group() is not None else ()):
            for p in set(member.assigned.get(tid, ())) | set(member.pending_revocation.get(tid, ())):
                assert p not in holders, (p, holders[p], member.member_id)
                holders[p] = member.member_id

    for step in range(200):
        action = rng.random()
        if action < 0.15 and len(owned) < 6:
            name = f"m{step}"
            joined = h.join(name)
            epochs[name], owned[name] = joined.member_epoch, set(joined.assignment.get(tid, ()))
        elif action < 0.22 and owned:
            name = rng.choice(sorted(owned))
            h.beat(name, -1)
            del owned[name], epochs[name]
            latest.pop(name, None)
        elif action < 0.25:
            h.topics["orders"].partitions.append(PartitionState(0, 0, [0], [0]))
        elif owned:
            beat(rng.choice(sorted(owned)))
        check_exclusive()
    if not owned:
        joined = h.join("last")
        epochs["last"], owned["last"] = joined.member_epoch, set(joined.assignment.get(tid, ()))
    for _ in range(4):
        for name in sorted(owned):
            beat(name, lag=False)
    assert h.group().state is GroupState.STABLE
    everything = sorted(p for name in owned for p in latest.get(name, owned[name]))
    assert everything == list(range(len(h.topics["orders"].partitions)))


def test_heartbeats_wait_while_the_groups_partition_loads(h):
    h.join("m1")
    partition = h.classic.store.partition_for("g")
    h.classic.on_leadership_change(OFFSETS_TOPIC, partition, False)
    h.coordinator.on_leadership_change(OFFSETS_TOPIC, partition, False)

    async def lead_again() -> tuple:
        h.classic.on_leadership_change(OFFSETS_TOPIC, partition, True)  # the load runs in a task
        during = h.beat("m1", 1, {h.id_of(): (0, 1, 2, 3)})
        while h.classic.loading_partitions:
            await asyncio.sleep(0)
        return during, h.beat("m1", 1, {h.id_of(): (0, 1, 2, 3)})

    during, after = asyncio.run(lead_again())
    assert during.error == ErrorCode.coordinator_load_in_progress
    assert (after.error, after.member_epoch) == (ErrorCode.none, 1)


# -- classic members inside a consumer group (Kafka 4's classicGroup*ToConsumerGroup) ---------------------


def cooperative_subscription(topics=("orders",), owned=()) -> bytes:
    """A consumer protocol Subscription v1 (cooperative clients): topics, null user data, owned partitions."""
    data = struct.pack(">hi", 1, len(topics))
    for name in topics:
        data += struct.pack(">h", len(name)) + name.encode()
    data += struct.pack(">i", -1) + struct.pack(">i", 1 if owned else 0)
    if owned:
        data += struct.pack(">h", len(topics[0])) + topics[0].encode()
        data += struct.pack(f">i{len(owned)}i", len(owned), *owned)
    return data


def classic_member_join(h: Harness, member_id: str = "", *, owned=(), group: str = "g", protocols=None,
                        protocol_type: str = "consumer", session_ms: int = 10_000, known_id: bool = True,
                        instance: str | None = None):
    answers = []
    protocols = protocols or [("cooperative-sticky", cooperative_subscription(owned=owned)), ("range", subscription("orders"))]
    h.classic.join_group(JoinRequest(group, member_id, protocol_type, protocols, session_ms, REBALANCE_MS, instance, "c",
                                     "/127.0.0.1", known_id), answers.append)
    (answer,) = answers
    return answer


def classic_member_sync(h: Harness, member_id: str, generation: int, *, group: str = "g",
                        protocol: str | None = "cooperative-sticky"):
    answers = []
    h.classic.sync_group(group, generation, member_id, "consumer", protocol, None, {}, answers.append)
    (answer,) = answers
    return answer


def test_a_classic_consumer_joins_a_consumer_group_and_gets_partitions_once_released(h):
    tid = h.id_of()
    h.join("m1")
    required = classic_member_join(h)
    assert required.error == ErrorCode.member_id_required and uuid.UUID(required.member_id)
    joined = classic_member_join(h, required.member_id)
    c1 = joined.member_id
    # Generation = member epoch, protocol = its first one, no leader: the server assigns.
    assert (joined.error, joined.generation_id, joined.protocol_type, joined.protocol_name, joined.leader,
            joined.members) == (ErrorCode.none, 2, "consumer", "cooperative-sticky", "", ())
    member = h.group().members[c1]
    assert member.uses_classic_protocol and member.classic_session_timeout_ms == 10_000
    assert member.state is MemberState.UNRELEASED_PARTITIONS
    synced = classic_member_sync(h, c1, 2)
    assert synced.error == ErrorCode.none and decode_assignment(synced.assignment) == {}
    assert subscription_version(synced.assignment) == 1  # the version of its first protocol's Subscription
    assert h.classic.heartbeat("g", c1, None, 2) == ErrorCode.none  # still waiting on m1
    # m1 revokes what the classic member is to get; then the classic member is told to rejoin.
    revoking = h.beat("m1", 1, {tid: (0, 1, 2, 3)})
    kept = parts(revoking, tid)
    h.beat("m1", 1, {tid: tuple(kept)})
    assert h.classic.heartbeat("g", c1, None, 2) == ErrorCode.rebalance_in_progress
    rejoined = classic_member_join(h, c1)
    assert (rejoined.error, rejoined.generation_id) == (ErrorCode.none, 2)
    got = decode_assignment(classic_member_sync(h, c1, 2).assignment)
    assert set(got["orders"]) == {0, 1, 2, 3} - kept and len(got["orders"]) == 2
    assert h.classic.heartbeat("g", c1, None, 2) == ErrorCode.none
    assert h.group().state is GroupState.STABLE


def test_a_classic_member_revokes_by_rejoining_without_the_partitions(h):
    tid = h.id_of()
    c1 = mixed_group(h)
    owned = tuple(sorted(h.group().members[c1].assigned[tid]))
    h.beat("m1", 2, {tid: tuple(h.group().members["m1"].assigned[tid])})
    # Two more members: the classic member must give one partition up. Its heartbeat says rejoin.
    h.join("m3")
    h.join("m4")
    assert h.classic.heartbeat("g", c1, None, 2) == ErrorCode.rebalance_in_progress
    still = classic_member_join(h, c1, owned=owned)
    assert h.group().members[c1].state is MemberState.UNREVOKED_PARTITIONS
    kept = decode_assignment(classic_member_sync(h, c1, still.generation_id).assignment)["orders"]
    assert len(kept) < len(owned)
    assert h.classic.heartbeat("g", c1, None, still.generation_id) == ErrorCode.rebalance_in_progress
    done = classic_member_join(h, c1, owned=kept)
    assert done.generation_id == 4 and h.group().members[c1].state is not MemberState.UNREVOKED_PARTITIONS


def test_classic_requests_to_a_consumer_group_get_kafkas_errors(h):
    h.join("m1")
    c1 = classic_member_join(h, known_id=False).member_id
    assert classic_member_sync(h, c1, 7).error == ErrorCode.illegal_generation
    assert classic_member_sync(h, c1, 2, protocol="range").error == ErrorCode.inconsistent_group_protocol
    assert classic_member_sync(h, "nobody", 2).error == ErrorCode.unknown_member_id
    assert classic_member_sync(h, "m1", 1).error == ErrorCode.unknown_member_id  # not a classic member
    assert h.classic.heartbeat("g", c1, None, 1) == ErrorCode.illegal_generation
    assert h.classic.heartbeat("g", "nobody", None, 2) == ErrorCode.unknown_member_id
    assert classic_member_join(h, "m1").error == ErrorCode.unknown_member_id  # a consumer-protocol member
    # Not the consumer protocol type, no protocol shared with the classic members, or unreadable metadata.
    assert classic_member_join(h, protocol_type="connect", known_id=False).error == \
        ErrorCode.inconsistent_group_protocol
    assert classic_member_join(h, protocols=[("roundrobin", subscription("orders"))], known_id=False).error == \
        ErrorCode.inconsistent_group_protocol
    assert classic_member_join(h, protocols=[("range", b"\x00")], known_id=False).error == \
        ErrorCode.inconsistent_group_protocol
    assert set(h.group().members) == {"m1", c1}


def test_a_classic_member_commits_offsets_with_its_member_epoch_as_generation(h):
    h.join("m1")
    c1 = classic_member_join(h, known_id=False).member_id

    def commit(generation, member=c1):
        answers = []
        h.classic.commit_offsets("g", generation, member, {("orders", 0): (5, -1, "")}, answers.append, api_version=8)
        return set(answers[0].values())

    assert commit(2) == {ErrorCode.none}
    assert commit(1) == {ErrorCode.illegal_generation}
    assert commit(2, "nobody") == {ErrorCode.unknown_member_id}
    assert commit(1, "m1") == {ErrorCode.unsupported_version}  # a consumer-protocol member still needs v9


def test_a_classic_member_leaves_and_its_partitions_go_to_the_others(h):
    tid = h.id_of()
    h.join("m1")
    c1 = classic_member_join(h, known_id=False).member_id
    epoch = h.group().group_epoch
    error, results = h.classic.leave_group("g", [LeavingMember(c1), LeavingMember("m1"), LeavingMember("x")])
    assert error == ErrorCode.none
    assert [e for _, e in results] == [ErrorCode.none, ErrorCode.unknown_member_id, ErrorCode.unknown_member_id]
    assert c1 not in h.group().members and h.group().group_epoch == epoch + 1
    assert h.beat("m1", 1, {tid: (0, 1, 2, 3)}).member_epoch == epoch + 1
    assert h.group().target_of("m1") == {tid: frozenset({0, 1, 2, 3})}


def test_a_classic_member_is_fenced_after_its_own_session_timeout_or_without_sync_or_rejoin(h):
    h.join("m1")
    c1 = classic_member_join(h, known_id=False, session_ms=45_000).member_id
    h.clock.advance(REBALANCE_MS - 1)  # no SyncGroup within the rebalance timeout
    h.beat("m1", 2, {})
    assert c1 in h.group().members
    h.clock.advance(1)
    assert c1 not in h.group().members
    c2 = classic_member_join(h, known_id=False, session_ms=10_000).member_id
    classic_member_sync(h, c2, h.group().members[c2].member_epoch)
    h.clock.advance(9_999)
    h.beat("m1", h.group().members["m1"].member_epoch, {})
    assert c2 in h.group().members
    h.clock.advance(1)  # its classic session timeout, not group.consumer.session.timeout.ms
    assert c2 not in h.group().members


def test_a_classic_member_told_to_rejoin_is_fenced_if_it_does_not(h):
    h.join("m1")
    c1 = classic_member_join(h, known_id=False).member_id
    classic_member_sync(h, c1, 2)
    h.join("m3")
    assert h.classic.heartbeat("g", c1, None, 2) == ErrorCode.rebalance_in_progress
    for _ in range(3):
        h.clock.advance(9_000)
        assert h.classic.heartbeat("g", c1, None, 2) == ErrorCode.rebalance_in_progress
        h.beat("m1", h.group().members["m1"].member_epoch, {})
        h.beat("m3", h.group().members["m3"].member_epoch, {})
    h.clock.advance(REBALANCE_MS - 27_000)
    assert c1 not in h.group().members


def test_a_classic_member_is_stored_and_back_after_a_restart(h):
    h.join("m1")
    c1 = classic_member_join(h, known_id=False, session_ms=12_000).member_id
    before = h.group().members[c1]
    h.restart()
    after = h.group().members[c1]
    assert after == before and after.classic_protocols[0][0] == "cooperative-sticky"
    assert classic_member_sync(h, c1, 2).error == ErrorCode.none
    h.clock.advance(12_000)
    assert c1 not in h.group().members


# -- online upgrade: a running classic group becomes a consumer group ---------------------------------------


def test_a_running_classic_group_becomes_a_consumer_group_and_its_members_stay(h):
    tid = h.id_of()
    first = classic_join(h, "g")
    c1 = first.member_id
    synced = []
    h.classic.sync_group("g", first.generation_id, c1, "consumer", "range", None,
                         {c1: encode_assignment({"orders": (0, 1, 2, 3)}, 0)}, synced.append)
    assert synced[0].error == ErrorCode.none
    generation = first.generation_id
    # A second classic member is waiting in its JoinGroup when the consumer-protocol member arrives.
    waiting = []
    h.classic.join_group(JoinRequest("g", "", "consumer", [("range", subscription("orders"))], 10_000, 30_000, None,
                                     "c", "/127.0.0.1", False), waiting.append)
    joined = h.join("m1")
    assert h.classic.group("g") is None and h.coordinator.has_group("g")
    assert [w.error for w in waiting] == [ErrorCode.rebalance_in_progress]
    group = h.group()
    c2 = waiting[0].member_id
    assert set(group.members) == {c1, c2, "m1"}
    member = group.members[c1]
    assert (member.uses_classic_protocol, member.member_epoch, dict(member.assigned),
            member.classic_session_timeout_ms) == (True, generation, {tid: frozenset({0, 1, 2, 3})}, 10_000)
    # m1 joined at the next epoch and waits for partitions c1 still holds.
    assert joined.member_epoch == group.group_epoch > generation and parts(joined, tid) == set()
    assert h.classic.heartbeat("g", c1, None, generation) == ErrorCode.rebalance_in_progress
    # c1 (an eager client: it revoked everything before rejoining) rejoins, c2 too; everyone gets its share.
    rejoined = classic_join(h, "g", c1)
    assert (rejoined.error, rejoined.generation_id, rejoined.leader) == (ErrorCode.none, group.group_epoch, "")
    assert classic_join(h, "g", c2).error == ErrorCode.none
    got1 = set(decode_assignment(classic_member_sync(h, c1, rejoined.generation_id, protocol="range").assignment)
               .get("orders", ()))
    beat = h.beat("m1", joined.member_epoch, {})
    got_m1 = parts(beat, tid)
    assert got1 and got_m1 and not got1 & got_m1
    # The conversion is stored: after a restart the group is back, its classic members too.
    h.restart()
    assert h.group().members[c1].uses_classic_protocol and h.classic.group("g") is None



# -- online downgrade: the last consumer-protocol member leaves ---------------------------------------------


def mixed_group(h: Harness) -> str:
    """m1 (consumer protocol) and a classic member c1, both with their partitions; returns c1's id."""
    tid = h.id_of()
    h.join("m1")
    c1 = classic_member_join(h, known_id=False).member_id
    h.beat("m1", 1, {tid: (0, 1, 2, 3)})
    h.beat("m1", 1, {tid: tuple(h.group().members["m1"].assigned[tid])})
    classic_member_join(h, c1)
    classic_member_sync(h, c1, 2)
    assert h.group().state is GroupState.STABLE
    return c1


def test_the_last_consumer_member_leaving_makes_the_group_classic_again(h):
    c1 = mixed_group(h)
    epoch = h.group().group_epoch
    owned = tuple(sorted(h.group().members[c1].assigned[h.id_of()]))
    assert h.beat("m1", -1).error == ErrorCode.none
    assert not h.coordinator.has_group("g")
    classic = h.classic.group("g")
    assert (classic.generation_id, classic.protocol_name, set(classic.members)) == (epoch, "cooperative-sticky", {c1})
    assert decode_assignment(classic.members[c1].assignment) == {"orders": owned}
    # The group rebalances: c1 is told so and rejoins as the only member (and leader) of the classic group.
    assert h.classic.heartbeat("g", c1, None, epoch) == ErrorCode.rebalance_in_progress
    rejoined = classic_member_join(h, c1)
    h.clock.advance(0)
    assert (rejoined.error, rejoined.generation_id, rejoined.leader) == (ErrorCode.none, epoch + 1, c1)
    # Stored: a restart finds the classic group, not the consumer group.
    h.restart()
    assert h.classic.group("g") is not None and not h.coordinator.has_group("g")


def test_a_fenced_last_consumer_member_makes_the_group_classic_again(h):
    c1 = mixed_group(h)
    for _ in range(4):  # m1 stops heartbeating; c1 keeps its session
        h.clock.advance(9_000)
        assert h.classic.heartbeat("g", c1, None, 2) == ErrorCode.none
    h.clock.advance(SESSION_MS - 36_000)  # m1's session expires
    assert h.classic.group("g") is not None and not h.coordinator.has_group("g")
    assert h.classic.heartbeat("g", c1, None, 2) == ErrorCode.rebalance_in_progress


def test_no_downgrade_when_the_policy_forbids_it(logs):
    h = Harness(logs, migration_policy="upgrade")
    c1 = mixed_group(h)
    h.beat("m1", -1)
    assert h.classic.group("g") is None and set(h.group().members) == {c1}


def test_a_refused_consumer_member_leaves_the_classic_group_as_it_was(logs):
    """A heartbeat that fails after the upgrade would start (the new member does not fit, its regex is invalid)
    changes nothing: Kafka reverts the conversion with the failed heartbeat."""
    h = Harness(logs, max_size=2)
    running_classic_group(h, "g", members=2)
    full = h.join("m1")
    assert (full.error, full.message) == (ErrorCode.group_max_size_reached,
                                          "The consumer group has reached its maximum capacity of 2 members.")
    bad = h.join("m1", topics=None, regex="(a)\\1")
    assert bad.error == ErrorCode.invalid_regular_expression
    assert h.classic.group("g").size() == 2 and not h.coordinator.has_group("g")


def test_a_heartbeat_failing_after_it_converted_a_classic_group_leaves_the_converted_group(logs, monkeypatch):
    """The conversion's records are written before the heartbeat's own changes: a heartbeat that fails after it
    (an assignor's error) leaves the consumer group as the conversion made it, in memory as in the log."""
    import pykbroker.groups.consumer.coordinator as coordinator

    h = Harness(logs)
    running_classic_group(h, "g", members=1)
    (classic_id,) = h.classic.group("g").members
    monkeypatch.setattr(coordinator, "assignor_for", lambda name: FailingAssignor())
    assert h.join("m1").error == ErrorCode.unknown_server_error
    assert h.classic.group("g") is None and set(h.group().members) == {classic_id}
    assert sorted(k for k in h.coordinator._session_timers if k[0] == "g") == [("g", classic_id)]
    converted = stored_view(h.group())
    monkeypatch.undo()
    h.restart()
    assert stored_view(h.group()) == converted
    assert h.join("m1").error == ErrorCode.none and set(h.group().members) == {classic_id, "m1"}


def test_only_a_classic_join_without_member_id_takes_a_static_members_instance_over(h):
    h.join("m1")
    first = classic_member_join(h, instance="inst")
    assert first.error == ErrorCode.none
    restarted = classic_member_join(h, instance="inst")  # the instance restarted: a new member id replaces it
    assert restarted.error == ErrorCode.none and restarted.member_id != first.member_id
    held = dict(h.group().members[restarted.member_id].assigned)
    zombie = classic_member_join(h, first.member_id, instance="inst")  # the old process, with its old id
    assert zombie.error == ErrorCode.fenced_instance_id
    assert set(h.group().members) == {"m1", restarted.member_id}
    assert dict(h.group().members[restarted.member_id].assigned) == held
    made_up = classic_member_join(h, "made-up", instance="inst2")  # a member id for an instance never seen
    assert made_up.error == ErrorCode.unknown_member_id
    assert set(h.group().members) == {"m1", restarted.member_id}


def test_a_classic_join_failing_midway_is_answered_and_leaves_the_group_and_its_timers_as_they_were(h, monkeypatch):
    """As a heartbeat: an assignor's error answers the JoinGroup UNKNOWN_SERVER_ERROR and changes nothing."""
    import pykbroker.groups.consumer.coordinator as coordinator

    h.join("m1")
    static = classic_member_join(h, instance="i1")
    assert static.error == ErrorCode.none
    before = stored_view(h.group())
    timers = {name: sorted(k for k in getattr(h.coordinator, name) if k[0] == "g")
              for name in ("_session_timers", "_rebalance_timers", "_join_timers", "_sync_timers")}
    monkeypatch.setattr(coordinator, "assignor_for", lambda name: FailingAssignor())
    assert classic_member_join(h, "c2").error == ErrorCode.unknown_server_error  # a new member
    h.topics["other"] = topic("other", 1)
    # the static member back under a new id with a new subscription: it took i1's place, then failed
    protocols = [("cooperative-sticky", cooperative_subscription(topics=("other",)))]
    assert classic_member_join(h, protocols=protocols, instance="i1").error == ErrorCode.unknown_server_error
    del h.topics["other"]
    assert stored_view(h.group()) == before and h.group().static_member("i1").member_id == static.member_id
    assert {name: sorted(k for k in getattr(h.coordinator, name) if k[0] == "g") for name in timers} == timers
    monkeypatch.undo()
    memory = stored_view(h.group())
    h.restart()  # nothing of the failed joins was written either
    assert stored_view(h.group()) == memory


@pytest.mark.parametrize("broken", ["assignment", "subscription"])
def test_a_classic_group_whose_consumer_protocol_is_malformed_is_not_upgraded(h, broken):
    """Kafka 4's convertToConsumerGroup: a member's subscription or assignment that is not the consumer protocol's
    refuses the upgrade (GROUP_ID_NOT_FOUND) and leaves the classic group as it was; its partitions stay its."""
    if broken == "subscription":
        answers = []
        h.classic.join_group(JoinRequest("g", "", "consumer", [("range", b"\x00\x00\x00")], 10_000, 30_000, None,
                                         "c", "/127.0.0.1", False), answers.append)
        h.clock.advance(0)
        (first,) = answers
        assignment = encode_assignment({"orders": [0, 1, 2, 3]}, 0)
    else:
        first = classic_join(h, "g")
        assignment = b"\x00\x00\x00\x00\x00\x01\x00"  # a truncated Assignment
    synced = []
    h.classic.sync_group("g", first.generation_id, first.member_id, "consumer", "range", None,
                         {first.member_id: assignment}, synced.append)
    assert synced[0].error == ErrorCode.none
    classic = h.classic.group("g")
    before = (classic.generation_id, set(classic.members), classic.members[first.member_id].assignment)
    refused = h.join("m1")
    assert (refused.error, refused.message) == (
        ErrorCode.group_id_not_found,
        "Cannot upgrade classic group g to consumer group because the embedded consumer protocol is malformed.")
    classic = h.classic.group("g")
    assert (classic.generation_id, set(classic.members), classic.members[first.member_id].assignment) == before
    assert not h.coordinator.has_group("g")
    h.restart()  # nothing was written either
    assert h.classic.group("g").generation_id == before[0] and not h.coordinator.has_group("g")


def test_a_failed_write_of_an_upgrade_makes_the_next_write_store_the_whole_group(h):
    """The conversion's records not stored: the joining member's write stores the converted members too, so a
    restart finds the group memory has."""
    first = classic_join(h, "g")
    synced = []
    h.classic.sync_group("g", first.generation_id, first.member_id, "consumer", "range", None,
                         {first.member_id: encode_assignment({"orders": (0, 1, 2, 3)}, 0)}, synced.append)
    store = h.classic.store
    real = store.append_group_records
    calls = []

    def first_fails(group_id, records, now_ms, done=None):
        calls.append(len(records))
        if len(calls) == 1:
            if done is not None:
                done(ErrorCode.not_enough_replicas)
        else:
            real(group_id, records, now_ms, done)

    store.append_group_records = first_fails
    assert h.join("m1").error == ErrorCode.none
    store.append_group_records = real
    memory = stored_view(h.group())
    assert set(h.group().members) == {first.member_id, "m1"}
    h.restart()
    assert stored_view(h.group()) == memory


def test_a_failed_tombstoning_of_a_downgraded_group_is_redone_by_the_ids_next_consumer_group(h):
    """The consumer group's records may still be in the log: the next consumer group of that id is written whole,
    its old members tombstoned, so a restart does not bring them back."""
    c1 = mixed_group(h)
    store = h.classic.store
    real = store.put_group_metadata
    batches = []

    def failing(group_id, value, now_ms, done, before=()):  # the tombstones and the classic record: one batch
        batches.append(len(before))
        done(ErrorCode.not_enough_replicas)

    store.put_group_metadata = failing
    assert h.beat("m1", -1).error == ErrorCode.none
    store.put_group_metadata = real
    assert batches and batches[0] > 0
    assert not h.coordinator.has_group("g")
    h.classic.leave_group("g", [LeavingMember(c1)])
    assert h.join("m2").error == ErrorCode.none
    h.restart()
    assert set(h.group().members) == {"m2"}


def test_a_downgraded_members_assignment_is_in_the_version_of_the_selected_protocols_metadata(h):
    """ClassicGroup.fromConsumerGroup: each assignment is serialized in the version of the member's metadata for
    the protocol the classic group selected, not of its first protocol."""
    h.join("m1")
    both = [("range", subscription("orders")), ("cooperative-sticky", cooperative_subscription())]  # v0, then v1
    c1 = classic_member_join(h, protocols=both, known_id=False).member_id
    c2 = classic_member_join(h, protocols=[("cooperative-sticky", cooperative_subscription())],
                             known_id=False).member_id
    assert h.beat("m1", -1).error == ErrorCode.none
    classic = h.classic.group("g")
    assert classic.protocol_name == "cooperative-sticky" and set(classic.members) == {c1, c2}
    assert [subscription_version(classic.members[m].assignment) for m in (c1, c2)] == [1, 1]

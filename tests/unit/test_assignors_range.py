"""The range assignor on the scenarios of Kafka's RangeAssignorTest (Kafka 4's server-side RangeAssignor), with
their expected assignments, plus member ordering (static members first, Java's String order) and bad input."""

import uuid

import pytest

from pykbroker.groups.assignors import (
    GroupSpec,
    MemberSubscription,
    PartitionAssignorError,
    TopicMetadata,
    assignor_for,
)

# Kafka's RangeAssignorTest uses random topic ids: its expectations hold whatever their order.
T1, T2, T3 = (uuid.uuid4() for _ in range(3))

range_assignor = assignor_for("range")


def topics(**partitions):
    ids = {"t1": T1, "t2": T2, "t3": T3}
    return {ids[name]: TopicMetadata(name, n) for name, n in partitions.items()}


def member(subscribed, assigned=None, instance_id=None):
    return MemberSubscription(
        frozenset(subscribed), {t: frozenset(ps) for t, ps in (assigned or {}).items()}, instance_id=instance_id
    )


def assign(members, metadata):
    return range_assignor.assign(GroupSpec(members), metadata)


def test_one_member_no_topic():
    assert assign({"A": member([])}, topics(t1=3)) == {"A": {}}


def test_one_member_subscribed_to_nonexistent_topic_gets_nothing():
    # Kafka throws; its coordinator never passes a missing topic. We ignore it.
    assert assign({"A": member([T2])}, topics(t1=3)) == {"A": {}}


def test_empty_group():
    assert assign({}, topics(t1=3)) == {}


def test_first_assignment_two_members_two_topics_same_subscriptions():
    result = assign({"A": member([T1, T3]), "B": member([T1, T3])}, topics(t1=3, t3=2))
    assert result == {"A": {T1: {0, 1}, T3: {0}}, "B": {T1: {2}, T3: {1}}}


def test_first_assignment_three_members_three_topics_different_subscriptions():
    members = {"A": member([T1, T2]), "B": member([T3]), "C": member([T2, T3])}
    result = assign(members, topics(t1=3, t2=3, t3=2))
    assert result == {"A": {T1: {0, 1, 2}, T2: {0, 1}}, "B": {T3: {0}}, "C": {T2: {2}, T3: {1}}}


def test_first_assignment_more_members_than_partitions():
    members = {m: member([T1, T3]) for m in "ABC"}
    result = assign(members, topics(t1=3, t3=2))
    assert result == {"A": {T1: {0}, T3: {0}}, "B": {T1: {1}, T3: {1}}, "C": {T1: {2}}}


def test_static_member_rejoining_under_a_new_member_id_gets_its_partitions_back():
    metadata = topics(t1=3)
    members = {"A": member([T1], instance_id="instanceA"), "B": member([T1], instance_id="instanceB")}
    before = assign(members, metadata)
    del members["A"]
    members["memberA1"] = member([T1], instance_id="instanceA")
    after = assign(members, metadata)
    assert after["memberA1"] == before["A"] and after["B"] == before["B"]
    assert before == {"A": {T1: {0, 1}}, "B": {T1: {2}}}


def test_mixed_static_membership():
    metadata = topics(t1=5)
    members = {
        "A": member([T1], instance_id="instanceA"),
        "C": member([T1], instance_id="instanceC"),
        "B": member([T1]),
    }
    before = assign(members, metadata)
    del members["A"]
    members["memberA1"] = member([T1], instance_id="instanceA")
    after = assign(members, metadata)
    assert after["memberA1"] == before["A"] and after["B"] == before["B"] and after["C"] == before["C"]
    # Static members first by instance id, then the dynamic one: A, C, B.
    assert before == {"A": {T1: {0, 1}}, "C": {T1: {2, 3}}, "B": {T1: {4}}}


def test_reassignment_more_members_than_partitions_when_one_member_added():
    members = {
        "A": member([T1, T2], {T1: [0], T2: [0]}),
        "B": member([T1, T2], {T1: [1], T2: [1]}),
        "C": member([T1, T2]),
    }
    result = assign(members, topics(t1=2, t2=2))
    assert result == {"A": {T1: {0}, T2: {0}}, "B": {T1: {1}, T2: {1}}, "C": {}}


def test_reassignment_when_one_partition_added():
    members = {
        "A": member([T1, T2], {T1: [0, 1], T2: [0, 1]}),
        "B": member([T1, T2], {T1: [2], T2: [2]}),
    }
    result = assign(members, topics(t1=4, t2=4))
    assert result == {"A": {T1: {0, 1}, T2: {0, 1}}, "B": {T1: {2, 3}, T2: {2, 3}}}


def test_reassignment_when_one_member_added():
    members = {
        "A": member([T1, T2], {T1: [0, 1], T2: [0, 1]}),
        "B": member([T1, T2], {T1: [2], T2: [2]}),
        "C": member([T1, T2]),
    }
    result = assign(members, topics(t1=3, t2=3))
    assert result == {"A": {T1: {0}, T2: {0}}, "B": {T1: {1}, T2: {1}}, "C": {T1: {2}, T2: {2}}}


def test_reassignment_when_one_member_added_and_one_partition():
    members = {
        "A": member([T1, T2], {T1: [0, 1], T2: [0, 1]}),
        "B": member([T1, T2], {T1: [2], T2: [2]}),
        "C": member([T1]),
    }
    result = assign(members, topics(t1=4, t2=3))
    assert result == {"A": {T1: {0, 1}, T2: {0, 1}}, "B": {T1: {2}, T2: {2}}, "C": {T1: {3}}}


def test_reassignment_when_one_member_removed():
    members = {"B": member([T1, T2], {T1: [2], T2: [2]})}
    result = assign(members, topics(t1=3, t2=3))
    assert result == {"B": {T1: {0, 1, 2}, T2: {0, 1, 2}}}


def test_reassignment_when_multiple_subscriptions_removed():
    members = {
        "A": member([T1], {T1: [0, 1, 2], T2: [0]}),
        "B": member([T1, T2, T3], {T2: [1]}),
        "C": member([T2], {T2: [2], T3: [0, 1]}),
    }
    result = assign(members, topics(t1=3, t2=3, t3=2))
    assert result == {"A": {T1: {0, 1}}, "B": {T1: {2}, T2: {0, 1}, T3: {0, 1}}, "C": {T2: {2}}}


def test_co_partitioning_of_topics_with_equal_partition_counts():
    metadata = topics(t1=10, t2=10, t3=7)
    members = {f"m{i}": member([T1, T2, T3]) for i in range(4)}
    result = assign(members, metadata)
    for assignment in result.values():
        assert assignment[T1] == assignment[T2]
        assert sorted(assignment[T1]) == list(range(min(assignment[T1]), max(assignment[T1]) + 1))


def test_members_are_ordered_as_java_strings():
    # U+FF5E (one UTF-16 unit) sorts after U+1F600 (a surrogate pair, 0xD83D...) in Java, before it in Python.
    members = {"\uff5e": member([T1]), "\U0001f600": member([T1])}
    result = assign(members, topics(t1=2))
    assert result == {"\U0001f600": {T1: {0}}, "\uff5e": {T1: {1}}}


def test_current_assignment_is_not_read():
    # Kafka 4's range assignor recomputes from the member order alone: a stale assignment changes nothing.
    metadata = topics(t1=4)
    fresh = assign({"A": member([T1]), "B": member([T1])}, metadata)
    stale = assign({"A": member([T1], {T1: [2, 3, 9]}), "B": member([T1], {T1: [0, 1], T3: [0]})}, metadata)
    assert fresh == stale == {"A": {T1: {0, 1}}, "B": {T1: {2, 3}}}


def test_bad_partition_count_is_a_partition_assignor_error():
    with pytest.raises(PartitionAssignorError, match="invalid partition count"):
        assign({"A": member([T1])}, {T1: TopicMetadata("t1", -3)})


def test_large_group_is_co_partitioned():
    metadata = {uuid.UUID(int=i + 1): TopicMetadata(f"topic-{i}", 100) for i in range(100)}
    members = {f"member-{i:03d}": member(metadata) for i in range(500)}
    result = assign(members, metadata)
    owners = [m for m in sorted(members) if result[m]]
    assert len(owners) == 100  # 100 partitions per topic: the first 100 members in order get one of each topic
    for i, m in enumerate(owners):
        assert result[m] == {t: frozenset([i]) for t in metadata}

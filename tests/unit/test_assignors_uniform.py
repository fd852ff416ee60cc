"""The uniform assignor on the scenarios of Kafka's own tests (OptimizedUniformAssignmentBuilderTest, i.e. the
homogeneous builder, and UniformHeterogeneousAssignmentBuilderTest), with their expected assignments, plus what it
does with input Kafka's coordinator never hands its assignors (missing topics, claims of one partition by two
members, partitions that do not exist, bad metadata)."""

import base64
import uuid

import pytest

from pykbroker.groups.assignors import (
    ASSIGNORS,
    DEFAULT_ASSIGNORS,
    GroupSpec,
    MemberSubscription,
    PartitionAssignorError,
    TopicMetadata,
    UnknownAssignorError,
    assignor_for,
)


def kafka_uuid(text):
    """Kafka's Uuid.fromString: URL-safe base64 of the 16 bytes."""
    return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=="))


# The topic ids of Kafka's tests (their order, by Kafka's Uuid.compareTo, is T1 < T2 < T3 < T4).
T1 = kafka_uuid("T1-A4s3VTwiI5CTbEp6POw")
T2 = kafka_uuid("T2-B4s3VTwiI5YHbPp6YUe")
T3 = kafka_uuid("T3-CU8fVTLCz5YMkLoDQsa")
T4 = kafka_uuid("T4-Tw9fVTLCz5HbPp6YQsa")

uniform = assignor_for("uniform")


def topics(**partitions):
    ids = {"t1": T1, "t2": T2, "t3": T3, "t4": T4}
    return {ids[name]: TopicMetadata(name, n) for name, n in partitions.items()}


def member(subscribed, assigned=None, **kw):
    return MemberSubscription(
        frozenset(subscribed), {t: frozenset(ps) for t, ps in (assigned or {}).items()}, **kw
    )


def assign(members, metadata):
    return uniform.assign(GroupSpec(members), metadata)


def check_valid(members, metadata, result):
    """Kafka's checkValidityAndBalance, validity half: only subscribers get a topic, no partition twice,
    every partition of a subscribed topic assigned."""
    assert set(result) == set(members)
    seen = set()
    for member_id, assignment in result.items():
        for topic_id, partitions in assignment.items():
            assert topic_id in members[member_id].subscribed_topic_ids
            assert partitions, "empty partition sets are left out"
            for p in partitions:
                assert (topic_id, p) not in seen
                seen.add((topic_id, p))
    subscribed = set().union(*(m.subscribed_topic_ids for m in members.values())) & set(metadata)
    assert seen == {(t, p) for t in subscribed for p in range(metadata[t].num_partitions)}


def sizes(result):
    return {m: sum(len(ps) for ps in a.values()) for m, a in result.items()}


# --- the registry ---------------------------------------------------------------------------------------------


def test_registry_names_and_default_order():
    assert DEFAULT_ASSIGNORS == ("uniform", "range")
    assert set(ASSIGNORS) == {"uniform", "range"}
    assert assignor_for("range").name == "range" and uniform.name == "uniform"


@pytest.mark.parametrize("name", ["sticky", "", "Uniform", None])
def test_unknown_assignor_name_is_a_key_error(name):
    with pytest.raises(UnknownAssignorError) as info:
        assignor_for(name)
    assert isinstance(info.value, KeyError)


# --- homogeneous (OptimizedUniformAssignmentBuilderTest) -------------------------------------------------------


def test_one_member_no_topic_subscription():
    assert assign({"A": member([])}, topics(t1=3)) == {"A": {}}


def test_empty_group():
    assert assign({}, topics(t1=3)) == {}


def test_one_member_subscribed_to_nonexistent_topic_gets_nothing():
    # Kafka's assignor throws here; its coordinator never passes such a topic. We ignore the missing topic.
    assert assign({"A": member([T2])}, topics(t1=3)) == {"A": {}}


# (members, partition counts, expected assignment): Kafka's scenarios with Kafka's expectations unless said.
KAFKA_SCENARIOS = [
    # --- homogeneous (OptimizedUniformAssignmentBuilderTest) ---
    pytest.param(
        {"A": member([T1, T3]), "B": member([T1, T3])},
        topics(t1=3, t3=2),
        # Kafka expects A {T1: 0; T3: 0,1}, B {T1: 1,2}: the free partitions listed topic by topic, in Java's
        # HashSet order of the topic ids there (T3 first), in topic-id order here (T1 first).
        {"A": {T1: {0, 1, 2}}, "B": {T3: {0, 1}}},
        id="first-assignment-two-members-two-topics",
    ),
    pytest.param(
        {m: member([T3]) for m in "ABC"},
        topics(t3=2),
        {"A": {T3: {0}}, "B": {T3: {1}}, "C": {}},
        id="first-assignment-more-members-than-partitions",
    ),
    pytest.param(
        {"A": member([T1, T2], {T1: [0, 1], T2: [0, 1]}), "B": member([T1, T2], {T1: [2], T2: [2]})},
        topics(t1=3, t2=3),
        {"A": {T1: {0, 1}, T2: {0}}, "B": {T1: {2}, T2: {1, 2}}},
        id="unbalanced-previous-assignment",
    ),
    pytest.param(
        {"A": member([T1, T2], {T1: [0, 2], T2: [0]}), "B": member([T1, T2], {T1: [1], T2: [1, 2]})},
        topics(t1=6, t2=5),
        # Kafka expects A {T1: 0,2,3; T2: 0,3,4}, B {T1: 1,4,5; T2: 1,2}: the same counts and kept partitions,
        # the new ones listed in Java's HashSet order of the topic ids there, in topic-id order here.
        {"A": {T1: {0, 2, 3, 4, 5}, T2: {0}}, "B": {T1: {1}, T2: {1, 2, 3, 4}}},
        id="partitions-added",
    ),
    pytest.param(
        {
            "A": member([T1, T2], {T1: [0, 2], T2: [0]}),
            "B": member([T1, T2], {T1: [1], T2: [1, 2]}),
            "C": member([T1, T2]),
        },
        topics(t1=3, t2=3),
        {"A": {T1: {0, 2}}, "B": {T1: {1}, T2: {1}}, "C": {T2: {0, 2}}},
        id="one-member-added",
    ),
    pytest.param(
        {"A": member([T1, T2], {T1: [0], T2: [0]}), "B": member([T1, T2], {T1: [1], T2: [1]})},
        topics(t1=3, t2=3),
        # Kafka gives A T2:2 and B T1:2 (Java's HashSet order of the topic ids); each keeps what it had.
        {"A": {T1: {0, 2}, T2: {0}}, "B": {T1: {1}, T2: {1, 2}}},
        id="one-member-removed",
    ),
    pytest.param(
        {"A": member([T2], {T1: [0], T2: [0]}), "B": member([T2], {T1: [1], T2: [1]})},
        topics(t1=2, t2=2),
        {"A": {T2: {0}}, "B": {T2: {1}}},
        id="one-subscription-removed",
    ),
    # --- heterogeneous (UniformHeterogeneousAssignmentBuilderTest): all of Kafka's expectations, exactly ---
    pytest.param(
        {"A": member([T1, T3]), "B": member([T3])},
        topics(t1=3, t3=6),
        {"A": {T1: {0, 1, 2}, T3: {4}}, "B": {T3: {0, 1, 2, 3, 5}}},
        id="heterogeneous-first-assignment-two-members-two-topics",
    ),
    pytest.param(
        {"A": member([T3]), "B": member([T3]), "C": member([T1])},
        topics(t3=1, t1=2),
        {"A": {T3: {0}}, "B": {}, "C": {T1: {0, 1}}},
        id="heterogeneous-first-assignment-more-members-than-partitions",
    ),
    pytest.param(
        {
            "A": member([T1], {T1: [0, 1, 2]}),
            "B": member([T1, T2], {T1: [3], T2: [0]}),
            "C": member([T1, T2, T3], {T1: [4, 5], T2: [1, 2, 3], T3: [0, 1, 2, 3]}),
        },
        topics(t1=6, t2=4, t3=4),
        {"A": {T1: {0, 1, 2, 5}}, "B": {T1: {3}, T2: {0, 1, 2, 3}}, "C": {T1: {4}, T3: {0, 1, 2, 3}}},
        id="heterogeneous-unbalanced-previous-assignment",
    ),
    pytest.param(
        {
            "A": member([T1, T3], {T1: [0, 1, 2, 3], T3: [0, 1]}),
            "B": member([T1, T2, T3, T4], {T2: [0, 1, 2], T4: [0, 1, 2]}),
        },
        topics(t1=6, t2=5, t3=3, t4=3),
        {"A": {T1: {0, 1, 2, 3, 4, 5}, T3: {0, 1, 2}}, "B": {T2: {0, 1, 2, 3, 4}, T4: {0, 1, 2}}},
        id="heterogeneous-partitions-added",
    ),
    pytest.param(
        {
            "A": member([T1], {T1: [0, 2], T2: [0]}),
            "B": member([T1, T2], {T1: [1], T2: [1, 2]}),
            "C": member([T1, T2]),
        },
        topics(t1=6, t2=7),
        {"A": {T1: {0, 2, 3, 4, 5}}, "B": {T1: {1}, T2: {1, 2, 6}}, "C": {T2: {0, 3, 4, 5}}},
        id="heterogeneous-member-and-partitions-added",
    ),
    pytest.param(
        {"A": member([T1, T3], {T1: [0, 1, 2], T3: [0, 1]}), "B": member([T2], {T2: [3, 4, 5, 6]})},
        topics(t1=3, t2=8, t3=3),
        {"A": {T1: {0, 1, 2}, T3: {0, 1, 2}}, "B": {T2: set(range(8))}},
        id="heterogeneous-member-removed",
    ),
    pytest.param(
        {"A": member([T1], {T1: [0, 2], T2: [1, 3]}), "B": member([T1, T2], {T1: [1], T2: [0, 2, 4]})},
        topics(t1=3, t2=5),
        {"A": {T1: {0, 1, 2}}, "B": {T2: {0, 1, 2, 3, 4}}},
        id="heterogeneous-subscription-removed",
    ),
    pytest.param(
        {"A": member([T1]), "B": member([])},
        topics(t1=3),
        {"A": {T1: {0, 1, 2}}, "B": {}},
        id="heterogeneous-member-without-subscription",
    ),
]


@pytest.mark.parametrize("members, metadata, expected", KAFKA_SCENARIOS)
def test_kafka_scenario(members, metadata, expected):
    result = assign(members, metadata)
    assert result == expected
    check_valid(members, metadata, result)


def test_large_sample_is_valid_and_balanced():
    metadata = {uuid.UUID(int=i * 7919 + 1): TopicMetadata(f"topic-{i}", 3) for i in range(1, 100)}
    members = {f"member{i}": member(metadata) for i in range(1, 50)}
    result = assign(members, metadata)
    check_valid(members, metadata, result)
    assert max(sizes(result).values()) - min(sizes(result).values()) <= 1


def test_balanced_group_keeps_everything_whoever_holds_the_extra_partitions():
    # KAFKA-18688: with 7 partitions on 2 members, the member holding 4 keeps them even when it sorts last.
    members = {"A": member([T1], {T1: [0, 1, 2]}), "B": member([T1], {T1: [3, 4, 5, 6]})}
    result = assign(members, topics(t1=7))
    assert result == {"A": {T1: {0, 1, 2}}, "B": {T1: {3, 4, 5, 6}}}


def test_join_moves_only_what_the_newcomer_gets():
    # 7 partitions on B (4) and C (3); A joins and sorts first: A gets 2, B keeps 3, C keeps 2 (3 moves
    # under Kafka 4.0's rule, which gave the larger share to A by iteration order).
    members = {"A": member([T1]), "B": member([T1], {T1: [0, 1, 2, 3]}), "C": member([T1], {T1: [4, 5, 6]})}
    result = assign(members, topics(t1=7))
    assert sizes(result) == {"A": 2, "B": 3, "C": 2}
    assert result["B"][T1] < {0, 1, 2, 3} and result["C"][T1] < {4, 5, 6}


# --- heterogeneous (UniformHeterogeneousAssignmentBuilderTest) -------------------------------------------------


def test_two_members_no_topic_subscription():
    assert assign({"A": member([]), "B": member([])}, topics(t1=3)) == {"A": {}, "B": {}}


def test_two_members_subscribed_to_nonexistent_topics_get_nothing():
    assert assign({"A": member([T3]), "B": member([T2])}, topics(t1=3)) == {"A": {}, "B": {}}


def test_heterogeneous_topic_partitions_run_out_before_balance():
    # Kafka's edge case: B has none of T1 and T1 runs out before A and B are balanced; T2 finishes the job.
    members = {
        "A": member([T1, T2, T3], {T1: [0, 1], T2: [0, 1], T3: [0, 1]}),
        "B": member([T1, T2, T3]),
    }
    # Subscriptions are equal, so this is homogeneous for us; Kafka's test forces the heterogeneous builder.
    # The homogeneous builder answers with the same balance, keeping A's lowest partitions.
    result = assign(members, topics(t1=2, t2=2, t3=2))
    assert sizes(result) == {"A": 3, "B": 3}
    assert result["A"] == {T1: {0, 1}, T2: {0}}
    # The heterogeneous path on the same shape: a third member subscribed elsewhere makes the group heterogeneous.
    members["C"] = member([T4])
    result = assign(members, topics(t1=2, t2=2, t3=2, t4=1))
    assert result == {"A": {T2: {0}, T3: {0, 1}}, "B": {T1: {0, 1}, T2: {1}}, "C": {T4: {0}}}


# --- input Kafka's coordinator never hands its assignors -------------------------------------------------------


@pytest.mark.parametrize("shape", ["homogeneous", "heterogeneous"])
@pytest.mark.parametrize(
    "held_a, held_b, partitions, expected_a, expected_b",
    [
        pytest.param([0, 1], [1, 2], 4, {0, 1}, {2, 3}, id="claimed-twice-first-member-in-order-keeps-it"),
        pytest.param([0, 7, -1], [1], 2, {0}, {1}, id="partitions-that-do-not-exist-are-dropped"),
    ],
)
def test_inconsistent_current_assignments(shape, held_a, held_b, partitions, expected_a, expected_b):
    members = {"A": member([T1], {T1: held_a}), "B": member([T1], {T1: held_b})}
    metadata = topics(t1=partitions)
    if shape == "heterogeneous":
        members["C"] = member([T2])
        metadata = topics(t1=partitions, t2=1)
    result = assign(members, metadata)
    check_valid(members, metadata, result)
    assert result["A"] == {T1: expected_a} and result["B"] == {T1: expected_b}


def test_a_deleted_topic_is_dropped_from_assignments():
    members = {"A": member([T1, T2], {T1: [0], T2: [0]}), "B": member([T1, T2], {T1: [1], T2: [1]})}
    result = assign(members, topics(t1=2))  # T2 deleted: no longer in the metadata
    assert result == {"A": {T1: {0}}, "B": {T1: {1}}}


@pytest.mark.parametrize("bad", [-1, None, 2.0])
def test_bad_partition_count_is_a_partition_assignor_error(bad):
    with pytest.raises(PartitionAssignorError, match="invalid partition count"):
        assign({"A": member([T1])}, {T1: TopicMetadata("t1", bad)})


def test_topic_with_no_partitions():
    assert assign({"A": member([T1]), "B": member([T1])}, topics(t1=0)) == {"A": {}, "B": {}}


def test_equal_inputs_give_equal_outputs_whatever_the_mapping_order():
    metadata = topics(t1=5, t2=3, t3=4)
    forward = {
        m: member([T1, T2], {T1: [i]}) if m < "D" else member([T2, T3]) for i, m in enumerate("ABCDEF")
    }
    backward = dict(reversed(list(forward.items())))
    assert assign(forward, metadata) == assign(backward, dict(reversed(list(metadata.items()))))


# --- a large group: 500 members, 10,000 partitions --------------------------------------------------------------


def large_group(subscription_of):
    metadata = {uuid.UUID(int=(i + 1) * 0x9E3779B97F4A7C15): TopicMetadata(f"topic-{i}", 100) for i in range(100)}
    topic_ids = sorted(metadata, key=str)
    members = {f"member-{i:03d}": member(subscription_of(i, topic_ids)) for i in range(500)}
    return members, metadata


def test_large_homogeneous_group_join_and_leave():
    members, metadata = large_group(lambda i, topic_ids: topic_ids)
    first = assign(members, metadata)
    check_valid(members, metadata, first)
    assert set(sizes(first).values()) == {20}
    settled = {m: member(s.subscribed_topic_ids, first[m]) for m, s in members.items()}
    settled["member-new"] = member(next(iter(members.values())).subscribed_topic_ids)
    joined = assign(settled, metadata)
    check_valid(settled, metadata, joined)
    assert sorted(set(sizes(joined).values())) == [19, 20]
    taken = sum(len(first[m][t] - joined[m].get(t, frozenset())) for m in first for t in first[m])
    assert taken == sizes(joined)["member-new"] == 10_000 // 501
    settled = {m: member(s.subscribed_topic_ids, joined[m]) for m, s in settled.items() if m != "member-000"}
    left = assign(settled, metadata)
    check_valid(settled, metadata, left)
    assert all(left[m][t] >= ps for m in settled for t, ps in joined[m].items())


def test_large_heterogeneous_group_is_balanced_topic_by_topic():
    members, metadata = large_group(lambda i, topic_ids: [t for j, t in enumerate(topic_ids) if (i + j) % 3])
    result = assign(members, metadata)
    check_valid(members, metadata, result)
    load = sizes(result)
    for topic_id in metadata:
        subscribers = [m for m, s in members.items() if topic_id in s.subscribed_topic_ids]
        least = min(load[m] for m in subscribers)
        assert all(load[m] - least <= 1 for m in subscribers if result[m].get(topic_id))

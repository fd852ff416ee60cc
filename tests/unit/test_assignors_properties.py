"""Properties of the server-side assignors on generated groups (hypothesis): every subscribed partition assigned
exactly once and only to a subscriber, balance, stickiness when one member joins or leaves, determinism, and the
assignors' own output being a fixed point."""

import uuid
from collections import Counter

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pykbroker.groups.assignors import ASSIGNORS, GroupSpec, MemberSubscription, TopicMetadata, assignor_for

TOPIC_POOL = [uuid.UUID(int=(i * 0x9E3779B97F4A7C15 << 64) % (1 << 128) | i) for i in range(1, 7)]
MISSING_TOPIC = uuid.UUID(int=0xDEAD)  # subscribed to but absent from the metadata (deleted, not created yet)
MEMBER_POOL = [f"member-{c}" for c in "abcdefghij"]

uniform = assignor_for("uniform")
range_assignor = assignor_for("range")
PROPERTY_SETTINGS = settings(
    max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


@st.composite
def metadata(draw):
    topic_ids = draw(st.lists(st.sampled_from(TOPIC_POOL), min_size=1, max_size=5, unique=True))
    return {t: TopicMetadata(f"topic-{i}", draw(st.integers(0, 12))) for i, t in enumerate(topic_ids)}


@st.composite
def groups(draw, homogeneous=False, with_assignments=True):
    """A group (member id -> subscription) and its topics; current assignments are arbitrary: overlapping,
    of unsubscribed topics, of partitions that do not exist."""
    topics = draw(metadata())
    candidates = sorted(topics, key=str) + [MISSING_TOPIC]
    member_ids = draw(st.lists(st.sampled_from(MEMBER_POOL), min_size=1, max_size=8, unique=True))
    shared = frozenset(draw(st.lists(st.sampled_from(candidates), unique=True)))
    members = {}
    for member_id in member_ids:
        subscribed = shared if homogeneous else frozenset(draw(st.lists(st.sampled_from(candidates), unique=True)))
        assigned = {}
        if with_assignments:
            for topic_id in draw(st.lists(st.sampled_from(candidates), unique=True, max_size=3)):
                assigned[topic_id] = frozenset(draw(st.lists(st.integers(-1, 14), max_size=6)))
        instance_id = draw(st.none() | st.sampled_from(["i1", "i2", "i3"]))
        if instance_id in {m.instance_id for m in members.values()}:
            instance_id = None
        members[member_id] = MemberSubscription(subscribed, assigned, instance_id=instance_id)
    return members, topics


def with_current(members, result):
    """The group with each member's current assignment replaced by ``result`` (what the coordinator does
    once it has installed a target assignment)."""
    return {
        m: MemberSubscription(s.subscribed_topic_ids, result[m], s.rack_id, s.instance_id)
        for m, s in members.items()
    }


def loads(result):
    return {m: sum(len(ps) for ps in a.values()) for m, a in result.items()}


def check_valid(members, topics, result):
    assert set(result) == set(members)
    owners = Counter()
    for member_id, assignment in result.items():
        for topic_id, partitions in assignment.items():
            assert topic_id in members[member_id].subscribed_topic_ids, "only subscribers get a topic"
            assert partitions and isinstance(partitions, frozenset)
            for p in partitions:
                owners[topic_id, p] += 1
    subscribed = set().union(*(m.subscribed_topic_ids for m in members.values())) & set(topics)
    expected = {(t, p) for t in subscribed for p in range(topics[t].num_partitions)}
    assert set(owners) == expected, "every subscribed partition assigned, nothing else"
    assert all(n == 1 for n in owners.values()), "no partition assigned twice"


@PROPERTY_SETTINGS
@given(groups(), st.sampled_from(sorted(ASSIGNORS)), st.randoms(use_true_random=False))
def test_valid_and_deterministic(group, name, rnd):
    members, topics = group
    result = ASSIGNORS[name].assign(GroupSpec(members), topics)
    check_valid(members, topics, result)
    shuffled_members = list(members.items())
    rnd.shuffle(shuffled_members)
    shuffled_topics = list(topics.items())
    rnd.shuffle(shuffled_topics)
    assert ASSIGNORS[name].assign(GroupSpec(dict(shuffled_members)), dict(shuffled_topics)) == result


@PROPERTY_SETTINGS
@given(groups(homogeneous=True))
def test_uniform_homogeneous_is_balanced(group):
    members, topics = group
    counts = loads(uniform.assign(GroupSpec(members), topics)).values()
    assert max(counts) - min(counts) <= 1


@PROPERTY_SETTINGS
@given(groups())
def test_uniform_heterogeneous_is_balanced_topic_by_topic(group):
    """Kafka's heterogeneous balance: no partition of a topic can move from its owner to another subscriber of
    the topic holding two or more partitions fewer in all."""
    members, topics = group
    result = uniform.assign(GroupSpec(members), topics)
    load = loads(result)
    for topic_id in topics:
        subscribers = [m for m, s in members.items() if topic_id in s.subscribed_topic_ids]
        owners = [m for m in subscribers if result[m].get(topic_id)]
        for owner in owners:
            for other in subscribers:
                assert load[owner] - load[other] <= 1, (topic_id, owner, other)


@PROPERTY_SETTINGS
@given(groups(), st.sampled_from(sorted(ASSIGNORS)))
def test_own_output_is_a_fixed_point(group, name):
    members, topics = group
    assignor = ASSIGNORS[name]
    result = assignor.assign(GroupSpec(members), topics)
    assert assignor.assign(GroupSpec(with_current(members, result)), topics) == result


def moved(before, after):
    """Partitions a member held before and holds no more, over the members present in both."""
    return sum(
        len(partitions - after[m].get(t, frozenset()))
        for m in before.keys() & after.keys()
        for t, partitions in before[m].items()
    )


@PROPERTY_SETTINGS
@given(groups(homogeneous=True), st.data())
def test_uniform_homogeneous_join_moves_only_what_the_newcomer_gets(group, data):
    members, topics = group
    assume(len(members) < len(MEMBER_POOL))
    settled = uniform.assign(GroupSpec(members), topics)
    newcomer = data.draw(st.sampled_from([m for m in MEMBER_POOL if m not in members]))
    grown = with_current(members, settled)
    grown[newcomer] = MemberSubscription(next(iter(members.values())).subscribed_topic_ids, {})
    after = uniform.assign(GroupSpec(grown), topics)
    total = sum(loads(settled).values())
    assert moved(settled, after) == loads(after)[newcomer] == total // len(grown)


@PROPERTY_SETTINGS
@given(groups(homogeneous=True), st.data())
def test_uniform_homogeneous_leave_moves_only_the_leavers_partitions(group, data):
    members, topics = group
    assume(len(members) > 1)
    settled = uniform.assign(GroupSpec(members), topics)
    leaver = data.draw(st.sampled_from(sorted(members)))
    shrunk = with_current(members, settled)
    del shrunk[leaver]
    after = uniform.assign(GroupSpec(shrunk), topics)
    assert moved(settled, after) == 0
    for m in shrunk:
        assert all(ps <= after[m].get(t, frozenset()) for t, ps in settled[m].items())


@PROPERTY_SETTINGS
@given(groups(with_assignments=False))
def test_range_gives_contiguous_balanced_ranges_in_member_order(group):
    members, topics = group
    result = range_assignor.assign(GroupSpec(members), topics)
    order = sorted(members, key=lambda m: (members[m].instance_id is None, members[m].instance_id or "", m))
    for topic_id, meta in topics.items():
        subscribers = [m for m in order if topic_id in members[m].subscribed_topic_ids]
        if not subscribers:
            continue
        quota, extra = divmod(meta.num_partitions, len(subscribers))
        start = 0
        for i, m in enumerate(subscribers):
            size = quota + (1 if i < extra else 0)
            assert result[m].get(topic_id, frozenset()) == frozenset(range(start, start + size))
            start += size


@PROPERTY_SETTINGS
@given(groups(homogeneous=True, with_assignments=False), st.integers(1, 12))
def test_range_co_partitions_topics_with_equal_partition_counts(group, partitions):
    members, topics = group
    topics = {t: TopicMetadata(meta.name, partitions) for t, meta in topics.items()}
    result = range_assignor.assign(GroupSpec(members), topics)
    for assignment in result.values():
        assert len(set(assignment.values())) <= 1
        assert len(assignment) in (0, len(next(iter(members.values())).subscribed_topic_ids & set(topics)))

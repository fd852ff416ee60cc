"""Group membership as a __consumer_offsets record (Kafka's GroupMetadataValue), the group state rules that
do not need a coordinator, and reading topics out of consumer protocol subscriptions."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pykbroker.groups.classic.group import ClassicGroup, GroupState, Member, subscription_topics
from pykbroker.groups.classic.records import (
    GroupRecord,
    MemberRecord,
    decode_group_record,
    encode_group_record,
    group_from_record,
    record_of,
)


def s16(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    return struct.pack(">h", len(text.encode())) + text.encode()


def b32(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


MEMBER = MemberRecord("m-1", "inst", "client", "/10.0.0.1", 300_000, 45_000, b"\x00\x01sub", b"\x00\x02asg")
RECORD = GroupRecord("consumer", 7, "range", "m-1", 1_700_000_000_123, (MEMBER,))


def test_version_3_layout_is_kafkas_group_metadata_value():
    expected = (
        struct.pack(">h", 3) + s16("consumer") + struct.pack(">i", 7) + s16("range") + s16("m-1")
        + struct.pack(">q", 1_700_000_000_123) + struct.pack(">i", 1)
        + s16("m-1") + s16("inst") + s16("client") + s16("/10.0.0.1") + struct.pack(">ii", 300_000, 45_000)
        + b32(b"\x00\x01sub") + b32(b"\x00\x02asg")
    )
    assert encode_group_record(RECORD) == expected
    assert decode_group_record(expected) == RECORD


def test_an_empty_group_has_null_protocol_and_leader():
    empty = GroupRecord("consumer", 8, None, None, 5, ())
    data = encode_group_record(empty)
    assert data == struct.pack(">h", 3) + s16("consumer") + struct.pack(">i", 8) + s16(None) + s16(None) \
        + struct.pack(">qi", 5, 0)
    assert decode_group_record(data) == empty


def test_older_versions_kafka_may_have_written_are_read():
    # v0: no state timestamp, no instance id, no rebalance timeout (the session timeout stands in).
    v0 = (struct.pack(">h", 0) + s16("consumer") + struct.pack(">i", 2) + s16("range") + s16("m")
          + struct.pack(">i", 1) + s16("m") + s16("c") + s16("/h") + struct.pack(">i", 10_000) + b32(b"s") + b32(b"a"))
    record = decode_group_record(v0)
    assert record.current_state_timestamp_ms == -1
    assert record.members == (MemberRecord("m", None, "c", "/h", 10_000, 10_000, b"s", b"a"),)
    # v4: the flexible form (compact strings and bytes, tagged fields).
    v4 = (struct.pack(">h", 4) + b"\x09consumer" + struct.pack(">i", 3) + b"\x00" + b"\x00"
          + struct.pack(">q", 9) + b"\x01" + b"\x00")
    assert decode_group_record(v4) == GroupRecord("consumer", 3, None, None, 9, ())
    with pytest.raises(ValueError):
        decode_group_record(struct.pack(">h", 5))
    with pytest.raises(ValueError):
        decode_group_record(v0[:-3])


names = st.text(min_size=0, max_size=12)
members = st.builds(MemberRecord, names, st.none() | names, names, names, st.integers(0, 2**31 - 1),
                    st.integers(0, 2**31 - 1), st.binary(max_size=20), st.binary(max_size=20))


@given(st.builds(GroupRecord, names, st.integers(-1, 2**31 - 1), st.none() | names, st.none() | names,
                 st.integers(-1, 2**62), st.lists(members, max_size=4).map(tuple)))
def test_every_record_round_trips(record):
    assert decode_group_record(encode_group_record(record)) == record


def test_a_stable_group_written_and_loaded_keeps_members_generation_and_assignments():
    group = ClassicGroup("g", GroupState.EMPTY, 1)
    for member_id, instance in (("a", None), ("b", "static-b")):
        group.add(Member(member_id, instance, "client", "/127.0.0.1", 30_000, 10_000, "consumer",
                         [("roundrobin", b"rr-" + member_id.encode()), ("range", b"r")]))
    group.transition_to(GroupState.PREPARING_REBALANCE, 2)
    group.init_next_generation(3)
    assert group.protocol_name == "roundrobin"
    loaded = group_from_record("g", decode_group_record(encode_group_record(record_of(group, {"a": b"A"}))))
    assert (loaded.state, loaded.generation_id, loaded.protocol_type, loaded.protocol_name, loaded.leader_id) == (
        GroupState.STABLE, 1, "consumer", "roundrobin", "a")
    assert loaded.state_timestamp_ms == 3
    assert {m.member_id: (m.assignment, m.protocols) for m in loaded.members.values()} == {
        "a": (b"A", [("roundrobin", b"rr-a")]), "b": (b"", [("roundrobin", b"rr-b")])}
    assert loaded.static_member_id("static-b") == "b"


def test_an_empty_group_loads_empty_with_its_generation():
    loaded = group_from_record("g", GroupRecord("consumer", 4, None, None, 77, ()))
    assert (loaded.state, loaded.generation_id, loaded.state_timestamp_ms, loaded.leader_id) == (
        GroupState.EMPTY, 4, 77, None)


# -- group rules -------------------------------------------------------------------------------------------


def test_state_transitions_follow_kafkas_table():
    group = ClassicGroup("g", GroupState.EMPTY, 0)
    with pytest.raises(ValueError):
        group.transition_to(GroupState.STABLE, 1)
    group.transition_to(GroupState.PREPARING_REBALANCE, 1)
    assert not group.can_rebalance()
    group.transition_to(GroupState.COMPLETING_REBALANCE, 2)
    group.transition_to(GroupState.STABLE, 3)
    assert group.can_rebalance() and group.state_timestamp_ms == 3
    group.transition_to(GroupState.DEAD, 4)


def test_leadership_passes_on_when_the_leader_leaves():
    group = ClassicGroup("g")
    for member_id in ("a", "b"):
        group.add(Member(member_id, None, "c", "/h", 1, 1, "consumer", [("range", b"")]))
    assert group.leader_id == "a"
    group.remove("a")
    assert group.leader_id == "b"
    group.remove("b")
    assert group.leader_id is None


def test_subscription_topics_are_read_from_every_consumer_protocol_version():
    v0 = struct.pack(">hi", 0, 2) + s16("a") + s16("b") + struct.pack(">i", -1)
    v3 = struct.pack(">hi", 3, 1) + s16("t") + b32(b"user") + struct.pack(">i", 0) + struct.pack(">i", 5) + s16("rack")
    assert subscription_topics(v0) == ["a", "b"]
    assert subscription_topics(v3) == ["t"]
    assert subscription_topics(b"\x00") is None
    assert subscription_topics(struct.pack(">hi", 0, 1) + struct.pack(">h", 9) + b"ab") is None

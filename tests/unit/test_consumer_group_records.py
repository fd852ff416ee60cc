"""The __consumer_offsets records of consumer groups (KIP-848) in Kafka 4's layout.

No Kafka 4 binary is on this machine, so the fixtures are written out by hand from Kafka 4.0/4.1's
message specs (group-coordinator/src/main/resources/common/message/ConsumerGroup*.json) and the way
Kafka 4 prefixes them (the record type before the key, the value version before the value). Kafka's own
serializer checked them once (KAFKA_SERIALIZED below): Kafka 3.7.1's generated classes (in
../shared/refkit) for the keys and for the two values whose schema Kafka 4 kept unchanged, and Kafka
3.7.1's generic Schema/Struct writer, given Kafka 4's schemas field by field, for the others.
"""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pykbroker.groups import offset_store
from pykbroker.groups.consumer.records import (
    KEY_TYPES,
    ClassicMemberMetadata,
    ClassicProtocol,
    ConsumerGroupCurrentMemberAssignmentKey,
    ConsumerGroupCurrentMemberAssignmentValue,
    ConsumerGroupMemberMetadataKey,
    ConsumerGroupMemberMetadataValue,
    ConsumerGroupMetadataKey,
    ConsumerGroupMetadataValue,
    ConsumerGroupPartitionMetadataKey,
    ConsumerGroupPartitionMetadataValue,
    ConsumerGroupRegularExpressionKey,
    ConsumerGroupRegularExpressionValue,
    ConsumerGroupTargetAssignmentMemberKey,
    ConsumerGroupTargetAssignmentMemberValue,
    ConsumerGroupTargetAssignmentMetadataKey,
    ConsumerGroupTargetAssignmentMetadataValue,
    PartitionMetadata,
    TopicMetadata,
    TopicPartitions,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)

# --------------------------------------------------------------------------------------------------
# The encodings, spelled out (independently of the code under test).


def i8(n: int) -> bytes:
    return struct.pack(">b", n)


def i16(n: int) -> bytes:
    return struct.pack(">h", n)


def i32(n: int) -> bytes:
    return struct.pack(">i", n)


def i64(n: int) -> bytes:
    return struct.pack(">q", n)


def s16(text: str) -> bytes:
    """A key field: int16 length + UTF-8."""
    return i16(len(text.encode())) + text.encode()


def cs(text: str | bytes | None) -> bytes:
    """A compact (nullable) string or bytes of fewer than 127 bytes: one length byte (length + 1, 0 = null)."""
    if text is None:
        return b"\x00"
    data = text.encode() if isinstance(text, str) else text
    assert len(data) < 127
    return bytes([len(data) + 1]) + data


def arr(*items: bytes) -> bytes:
    """A compact array of fewer than 127 encoded items."""
    return bytes([len(items) + 1]) + b"".join(items)


NO_TAGS = b"\x00"
V0 = i16(0)  # the value version Kafka 4 writes for every consumer group record
TOPIC_A = uuid.UUID("00010203-0405-0607-0809-0a0b0c0d0e0f")
TOPIC_B = uuid.UUID("f0e1d2c3-b4a5-9687-7869-5a4b3c2d1e0f")


# --------------------------------------------------------------------------------------------------
# Keys.

KEYS = [
    (ConsumerGroupMetadataKey("grp"), i16(3) + s16("grp")),
    (ConsumerGroupPartitionMetadataKey("grp"), i16(4) + s16("grp")),
    (ConsumerGroupMemberMetadataKey("grp", "m-1"), i16(5) + s16("grp") + s16("m-1")),
    (ConsumerGroupTargetAssignmentMetadataKey("grp"), i16(6) + s16("grp")),
    (ConsumerGroupTargetAssignmentMemberKey("grp", "m-1"), i16(7) + s16("grp") + s16("m-1")),
    (ConsumerGroupCurrentMemberAssignmentKey("grp", "m-1"), i16(8) + s16("grp") + s16("m-1")),
    (ConsumerGroupRegularExpressionKey("grp", "^t.*"), i16(16) + s16("grp") + s16("^t.*")),
]


@pytest.mark.parametrize(("key", "data"), KEYS, ids=[type(k).__name__ for k, _ in KEYS])
def test_a_key_is_its_record_type_then_its_strings(key, data):
    assert encode_key(key) == data
    assert decode_key(data) == key


def test_the_record_types_are_kafkas():
    assert KEY_TYPES == {3, 4, 5, 6, 7, 8, 16}
    assert {type(k).record_type for k, _ in KEYS} == KEY_TYPES


def test_keys_of_other_records_are_not_ours_and_ours_are_not_the_offset_stores():
    assert decode_key(offset_store.encode_offset_key("grp", "t", 0)) is None  # type 1
    assert decode_key(i16(0) + s16("grp") + s16("t") + i32(0)) is None  # type 0
    assert decode_key(offset_store.encode_group_metadata_key("grp")) is None  # type 2
    assert decode_key(i16(11) + s16("share-group")) is None  # ShareGroupMetadataKey
    assert decode_key(i16(17) + s16("streams-group")) is None  # StreamsGroupMetadataKey
    for key, data in KEYS:  # the offset store's loader leaves ours alone
        assert offset_store.decode_key(data) is None


def test_a_truncated_key_is_refused_naming_its_record_type():
    with pytest.raises(ValueError, match="ConsumerGroupMemberMetadataKey"):
        decode_key(i16(5) + s16("grp"))  # no member id
    with pytest.raises(ValueError, match="ConsumerGroupRegularExpressionKey"):
        decode_key(i16(16) + s16("grp") + i16(9) + b"^t")  # 9 bytes announced, 2 present
    with pytest.raises(ValueError, match="ConsumerGroupMetadataKey"):
        decode_key(i16(3) + i16(-1))  # a null group id
    with pytest.raises(ValueError, match="record key"):
        decode_key(b"\x00")  # not even a record type


# --------------------------------------------------------------------------------------------------
# Values, byte for byte.

MEMBER = ConsumerGroupMemberMetadataValue(
    instance_id=None, rack_id="rack-1", client_id="cli", client_host="/10.0.0.1",
    subscribed_topic_names=("bar", "foo"), subscribed_topic_regex=None, rebalance_timeout_ms=300_000,
    server_assignor="uniform",
)
CLASSIC_MEMBER = ConsumerGroupMemberMetadataValue(
    instance_id="inst-1", rack_id=None, client_id="cli", client_host="/h", subscribed_topic_names=("foo",),
    subscribed_topic_regex="^f.*", rebalance_timeout_ms=60_000, server_assignor=None,
    classic_member_metadata=ClassicMemberMetadata(45_000, (ClassicProtocol("range", b"\x00\x03sub"),)),
)

VALUES = [
    (ConsumerGroupMetadataKey("g"), ConsumerGroupMetadataValue(42),
     V0 + i32(42) + NO_TAGS),
    # Kafka 4.1's metadata hash: tagged field 0, an int64 of 8 bytes.
    (ConsumerGroupMetadataKey("g"), ConsumerGroupMetadataValue(42, metadata_hash=0x0102030405060708),
     V0 + i32(42) + b"\x01" + b"\x00" + b"\x08" + i64(0x0102030405060708)),
    (ConsumerGroupPartitionMetadataKey("g"),
     ConsumerGroupPartitionMetadataValue((TopicMetadata(TOPIC_A, "foo", 3),)),
     V0 + arr(TOPIC_A.bytes + cs("foo") + i32(3) + arr() + NO_TAGS) + NO_TAGS),
    (ConsumerGroupPartitionMetadataKey("g"),  # racks, as Kafka 3.x wrote them
     ConsumerGroupPartitionMetadataValue((TopicMetadata(TOPIC_B, "bar", 1, (PartitionMetadata(0, ("r1", "r2")),)),)),
     V0 + arr(TOPIC_B.bytes + cs("bar") + i32(1) + arr(i32(0) + arr(cs("r1"), cs("r2")) + NO_TAGS) + NO_TAGS)
     + NO_TAGS),
    (ConsumerGroupMemberMetadataKey("g", "m"), MEMBER,
     V0 + cs(None) + cs("rack-1") + cs("cli") + cs("/10.0.0.1") + arr(cs("bar"), cs("foo")) + cs(None)
     + i32(300_000) + cs("uniform") + NO_TAGS),
    # A classic member of an upgraded group: tagged field 0 holds the nullable struct, marker 1 first.
    (ConsumerGroupMemberMetadataKey("g", "m"), CLASSIC_MEMBER,
     V0 + cs("inst-1") + cs(None) + cs("cli") + cs("/h") + arr(cs("foo")) + cs("^f.*") + i32(60_000) + cs(None)
     + b"\x01" + b"\x00" + bytes([1 + 4 + 1 + 6 + 6 + 1 + 1]) + b"\x01" + i32(45_000)
     + arr(cs("range") + cs(b"\x00\x03sub") + NO_TAGS) + NO_TAGS),
    (ConsumerGroupTargetAssignmentMetadataKey("g"), ConsumerGroupTargetAssignmentMetadataValue(7),
     V0 + i32(7) + NO_TAGS),
    (ConsumerGroupTargetAssignmentMemberKey("g", "m"),
     ConsumerGroupTargetAssignmentMemberValue((TopicPartitions(TOPIC_A, (0, 2)), TopicPartitions(TOPIC_B, ()))),
     V0 + arr(TOPIC_A.bytes + arr(i32(0), i32(2)) + NO_TAGS, TOPIC_B.bytes + arr() + NO_TAGS) + NO_TAGS),
    (ConsumerGroupCurrentMemberAssignmentKey("g", "m"),
     ConsumerGroupCurrentMemberAssignmentValue(11, 10, 1, (TopicPartitions(TOPIC_A, (1,)),),
                                               (TopicPartitions(TOPIC_B, (0, 5)),)),
     V0 + i32(11) + i32(10) + i8(1) + arr(TOPIC_A.bytes + arr(i32(1)) + NO_TAGS)
     + arr(TOPIC_B.bytes + arr(i32(0), i32(5)) + NO_TAGS) + NO_TAGS),
    (ConsumerGroupRegularExpressionKey("g", "^f.*"),
     ConsumerGroupRegularExpressionValue(("foo", "fuzz"), 1234, 1_700_000_000_000),
     V0 + arr(cs("foo"), cs("fuzz")) + i64(1234) + i64(1_700_000_000_000) + NO_TAGS),
]


@pytest.mark.parametrize(("key", "value", "data"), VALUES, ids=[type(v).__name__ for _, v, _ in VALUES])
def test_a_value_is_version_0_in_the_flexible_encoding(key, value, data):
    assert encode_value(value) == data
    assert decode_value(key, data) == value


# What Kafka's serializer wrote for the same keys and values (MessageUtil.toVersionPrefixedBytes with the
# record type as the key's prefix and 0 as the value's), see the module docstring. The classic member
# metadata (a nullable struct in a tagged field) has no Kafka 3.7 counterpart and is not among them.
KAFKA_SERIALIZED = {
    KEYS[0][0]: "00030003677270",
    KEYS[1][0]: "00040003677270",
    KEYS[2][0]: "0005000367727000036d2d31",
    KEYS[3][0]: "00060003677270",
    KEYS[4][0]: "0007000367727000036d2d31",
    KEYS[5][0]: "0008000367727000036d2d31",
    VALUES[0][1]: "00000000002a00",
    VALUES[1][1]: "00000000002a0100080102030405060708",
    VALUES[3][1]: "000002f0e1d2c3b4a5968778695a4b3c2d1e0f0462617200000001020000000003037231037232000000",
    VALUES[4][1]: "000000077261636b2d3104636c690a2f31302e302e302e31030462617204666f6f00000493e008756e69666f726d00",
    VALUES[6][1]: "00000000000700",
    VALUES[7][1]: "000003000102030405060708090a0b0c0d0e0f03000000000000000200f0e1d2c3b4a5968778695a4b3c2d1e0f010000",
    VALUES[8][1]: "00000000000b0000000a0102000102030405060708090a0b0c0d0e0f0200000001000"
                  "2f0e1d2c3b4a5968778695a4b3c2d1e0f0300000000000000050000",
    VALUES[9][1]: "00000304666f6f0566757a7a00000000000004d20000018bcfe5680000",
}


def test_the_fixtures_are_what_kafkas_serializer_writes():
    fixtures = {**{key: data for key, data in KEYS}, **{value: data for _, value, data in VALUES}}
    for record, kafka in KAFKA_SERIALIZED.items():
        assert fixtures[record].hex() == kafka, record


def test_long_lengths_take_several_varint_bytes():
    names = tuple(f"topic-{i:03d}" for i in range(200))  # 201 = 0xc9 0x01 as an unsigned varint
    value = ConsumerGroupRegularExpressionValue(names, 1, 2)
    data = encode_value(value)
    assert data[:4] == V0 + b"\xc9\x01"
    assert decode_value(ConsumerGroupRegularExpressionKey("g", "x"), data) == value


def test_a_tombstone_has_no_value():
    for key, _ in KEYS:
        assert decode_value(key, None) is None


# --------------------------------------------------------------------------------------------------
# Tagged fields that later Kafka versions add are skipped, as Kafka's readers skip unknown tags.


def test_unknown_tagged_fields_are_skipped():
    # Kafka 4.3's ConsumerGroupMetadataValue: CreationTimeMs as tag 1 after the metadata hash (tag 0).
    data = V0 + i32(9) + b"\x02" + b"\x00\x08" + i64(77) + b"\x01\x08" + i64(1_700_000_000_000)
    assert decode_value(ConsumerGroupMetadataKey("g"), data) == ConsumerGroupMetadataValue(9, 77)
    # Kafka 4.3's ConsumerGroupTargetAssignmentMetadataValue: AssignmentTimestamp as tag 0.
    data = V0 + i32(7) + b"\x01" + b"\x00\x08" + i64(1_700_000_000_000)
    assert decode_value(ConsumerGroupTargetAssignmentMetadataKey("g"), data) == \
        ConsumerGroupTargetAssignmentMetadataValue(7)
    # KIP-1251's AssignmentEpochs, tag 0 inside each TopicPartitions of the current assignment.
    epochs = arr(i32(11), i32(11))
    data = (V0 + i32(11) + i32(10) + i8(0) + arr(TOPIC_A.bytes + arr(i32(0), i32(1)) + b"\x01\x00"
            + bytes([len(epochs)]) + epochs) + arr() + NO_TAGS)
    assert decode_value(ConsumerGroupCurrentMemberAssignmentKey("g", "m"), data) == \
        ConsumerGroupCurrentMemberAssignmentValue(11, 10, 0, (TopicPartitions(TOPIC_A, (0, 1)),), ())
    # An unknown tag beside a known one in a member's metadata.
    data = encode_value(CLASSIC_MEMBER)
    tags = data.index(b"\x01\x00", len(data) - 30)  # the tagged fields count and the first tag
    widened = data[:tags] + b"\x02" + data[tags + 1:] + b"\x05\x03abc"
    assert decode_value(ConsumerGroupMemberMetadataKey("g", "m"), widened) == CLASSIC_MEMBER


def test_a_tagged_null_classic_member_metadata_reads_as_null():
    # Kafka reads a marker <= 0 as null (it never writes one: a null tagged field is left out).
    data = V0 + cs(None) + cs(None) + cs("c") + cs("/h") + arr() + cs(None) + i32(1) + cs(None) + b"\x01\x00\x01\x00"
    assert decode_value(ConsumerGroupMemberMetadataKey("g", "m"), data).classic_member_metadata is None


# --------------------------------------------------------------------------------------------------
# Bad input: a ValueError naming the record type (the loader logs it and skips the record).


@pytest.mark.parametrize(("key", "value", "data"), VALUES, ids=[type(v).__name__ for _, v, _ in VALUES])
def test_every_truncation_is_refused_naming_the_record_type(key, value, data):
    for end in range(len(data)):
        with pytest.raises(ValueError, match=type(value).__name__):
            decode_value(key, data[:end])


def test_an_unknown_value_version_is_refused():
    key = ConsumerGroupCurrentMemberAssignmentKey("g", "m")
    with pytest.raises(ValueError, match=r"ConsumerGroupCurrentMemberAssignmentValue .*version 1"):
        decode_value(key, i16(1) + i32(11) + i32(10) + i8(0) + arr() + arr() + NO_TAGS)
    with pytest.raises(ValueError, match="ConsumerGroupMetadataValue .*version -1"):
        decode_value(ConsumerGroupMetadataKey("g"), i16(-1) + i32(1) + NO_TAGS)


def test_nulls_and_impossible_counts_are_refused():
    member = ConsumerGroupMemberMetadataKey("g", "m")
    with pytest.raises(ValueError, match="ConsumerGroupMemberMetadataValue.*null"):  # a null client id
        decode_value(member, V0 + cs(None) + cs(None) + cs(None) + cs("/h") + arr() + cs(None) + i32(1) + cs(None)
                     + NO_TAGS)
    with pytest.raises(ValueError, match="ConsumerGroupTargetAssignmentMemberValue.*null"):  # a null array
        decode_value(ConsumerGroupTargetAssignmentMemberKey("g", "m"), V0 + b"\x00" + NO_TAGS)
    # Two billion partitions announced in a few bytes: refused before anything is read.
    huge = V0 + b"\x02" + TOPIC_A.bytes + b"\xff\xff\xff\xff\x07" + i32(0) + NO_TAGS + NO_TAGS
    with pytest.raises(ValueError, match="ConsumerGroupTargetAssignmentMemberValue.*array"):
        decode_value(ConsumerGroupTargetAssignmentMemberKey("g", "m"), huge)
    with pytest.raises(ValueError, match="ConsumerGroupRegularExpressionValue"):  # not UTF-8
        decode_value(ConsumerGroupRegularExpressionKey("g", "x"), V0 + arr(b"\x03\xff\xfe") + i64(1) + i64(2)
                     + NO_TAGS)


def test_a_value_that_does_not_fit_its_fields_is_refused_naming_the_record_type():
    with pytest.raises(ValueError, match="ConsumerGroupMetadataValue"):
        encode_value(ConsumerGroupMetadataValue(2**31))
    with pytest.raises(ValueError, match="ConsumerGroupCurrentMemberAssignmentValue"):
        encode_value(ConsumerGroupCurrentMemberAssignmentValue(1, 0, 128, (), ()))
    with pytest.raises(ValueError, match="ConsumerGroupMemberMetadataValue"):
        encode_value(ConsumerGroupMemberMetadataValue(None, None, None, "/h", (), None, 1, None))


# --------------------------------------------------------------------------------------------------
# Round trips.

names = st.text(max_size=10)
nullable_names = st.none() | names
int32s = st.integers(-(2**31), 2**31 - 1)
int64s = st.integers(-(2**63), 2**63 - 1)
uuids = st.uuids()
topic_partitions = st.builds(TopicPartitions, uuids, st.lists(int32s, max_size=5).map(tuple))
topic_partitions_list = st.lists(topic_partitions, max_size=3).map(tuple)
classic = st.builds(ClassicMemberMetadata, int32s,
                    st.lists(st.builds(ClassicProtocol, names, st.binary(max_size=20)), max_size=3).map(tuple))

values = st.one_of(
    st.builds(lambda v: (ConsumerGroupMetadataKey("g"), v), st.builds(ConsumerGroupMetadataValue, int32s, int64s)),
    st.builds(lambda v: (ConsumerGroupPartitionMetadataKey("g"), v), st.builds(
        ConsumerGroupPartitionMetadataValue, st.lists(st.builds(
            TopicMetadata, uuids, names, int32s, st.lists(st.builds(
                PartitionMetadata, int32s, st.lists(names, max_size=3).map(tuple)), max_size=3).map(tuple)),
            max_size=3).map(tuple))),
    st.builds(lambda v: (ConsumerGroupMemberMetadataKey("g", "m"), v), st.builds(
        ConsumerGroupMemberMetadataValue, nullable_names, nullable_names, names, names,
        st.lists(names, max_size=4).map(tuple), nullable_names, int32s, nullable_names, st.none() | classic)),
    st.builds(lambda v: (ConsumerGroupTargetAssignmentMetadataKey("g"), v),
              st.builds(ConsumerGroupTargetAssignmentMetadataValue, int32s)),
    st.builds(lambda v: (ConsumerGroupTargetAssignmentMemberKey("g", "m"), v),
              st.builds(ConsumerGroupTargetAssignmentMemberValue, topic_partitions_list)),
    st.builds(lambda v: (ConsumerGroupCurrentMemberAssignmentKey("g", "m"), v), st.builds(
        ConsumerGroupCurrentMemberAssignmentValue, int32s, int32s, st.integers(-128, 127), topic_partitions_list,
        topic_partitions_list)),
    st.builds(lambda v: (ConsumerGroupRegularExpressionKey("g", "r"), v), st.builds(
        ConsumerGroupRegularExpressionValue, st.lists(names, max_size=4).map(tuple), int64s, int64s)),
)


@given(values)
def test_every_value_round_trips(pair):
    key, value = pair
    assert decode_value(key, encode_value(value)) == value


keys = st.one_of(
    st.builds(ConsumerGroupMetadataKey, names), st.builds(ConsumerGroupPartitionMetadataKey, names),
    st.builds(ConsumerGroupMemberMetadataKey, names, names),
    st.builds(ConsumerGroupTargetAssignmentMetadataKey, names),
    st.builds(ConsumerGroupTargetAssignmentMemberKey, names, names),
    st.builds(ConsumerGroupCurrentMemberAssignmentKey, names, names),
    st.builds(ConsumerGroupRegularExpressionKey, names, names),
)


@given(keys)
def test_every_key_round_trips(key):
    assert decode_key(encode_key(key)) == key


@given(values, st.data())
def test_garbage_after_a_valid_prefix_never_crashes_the_decoder(pair, data):
    # Whatever the bytes, the decoder answers a value or a ValueError (nothing else escapes to the loader).
    key, value = pair
    encoded = encode_value(value)
    cut = data.draw(st.integers(0, len(encoded)))
    noisy = encoded[:cut] + data.draw(st.binary(max_size=40))
    try:
        decode_value(key, noisy)
    except ValueError as error:
        assert type(value).__name__ in str(error)

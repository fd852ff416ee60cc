"""Committed offsets in __consumer_offsets: Kafka's record schemas, partitioning, and replay on start. The
store writes through a real ReplicaManager hosting the partitions as a single broker does."""

from __future__ import annotations

import asyncio
import os
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pykbroker.groups.offset_store import (
    OFFSETS_TOPIC,
    CommittedOffset,
    GroupMetadataKey,
    OffsetKey,
    OffsetStore,
    decode_key,
    decode_offset_value,
    encode_group_metadata_key,
    encode_offset_key,
    encode_offset_value,
    java_string_hash,
    kafka_abs,
    partition_for_group,
)
from pykbroker.log.config import LogConfig
from pykbroker.log.manager import LogManager
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.records import build_batch, read_records
from pykbroker.replication.replica_manager import ReplicaManager

PARTITIONS = 8


class OffsetsLogs:
    """__consumer_offsets on disk, hosted by a real ReplicaManager as on a single broker (it leads every
    partition); ``reopen`` is a broker restart (``crash``: logs dropped without a flush or a clean-shutdown
    marker, so the next start recovers them)."""

    def __init__(self, root: Path, partitions: int) -> None:
        self.root = root
        self.partitions = partitions
        self.replicas = self._open()

    def _open(self) -> ReplicaManager:
        replicas = ReplicaManager(LogManager(self.root, fsync="never"), 1, lambda topic: LogConfig())
        replicas.log_manager.load_all(lambda topic: LogConfig())
        for partition in range(self.partitions):
            replicas.host(OFFSETS_TOPIC, partition, 0)
        return replicas

    def get(self, partition: int):
        return self.replicas.partition(OFFSETS_TOPIC, partition).log

    def reopen(self, *, crash: bool = False) -> None:
        manager = self.replicas.log_manager
        if crash:
            for partition_log in manager.logs():
                partition_log.abandon()
            manager._executor.shutdown()
            manager._remover.shutdown()
            os.close(manager._lock_fd)  # the lock a dead process would lose
        else:
            manager.shutdown()
        self.replicas = self._open()

    def close(self) -> None:
        self.replicas.log_manager.shutdown()


@pytest.fixture
def logs(tmp_path):
    opened = OffsetsLogs(tmp_path / "data", PARTITIONS)
    yield opened
    opened.close()


def load_all(store: OffsetStore) -> OffsetStore:
    """Load every partition, as a broker that leads them all does at start."""
    async def load() -> None:
        for partition in range(store.num_partitions):
            assert await store.load_partition(partition)

    asyncio.run(load())
    return store


def new_store(logs: OffsetsLogs) -> OffsetStore:
    return load_all(OffsetStore(logs.replicas, PARTITIONS))


def reopened(logs: OffsetsLogs, *, crash: bool = False) -> OffsetStore:
    """A store over the same files after a restart: logs closed (or dropped), reopened from disk, replayed."""
    logs.reopen(crash=crash)
    return new_store(logs)


def commit(store: OffsetStore, group: str, offsets, now_ms: int) -> None:
    """A commit that must be acknowledged at once (a single broker: nothing to wait for)."""
    answers = []
    store.commit(group, offsets, now_ms, answers.append)
    assert answers == [ErrorCode.none]


def put_group_metadata(store: OffsetStore, group: str, value: bytes, now_ms: int) -> None:
    answers = []
    store.put_group_metadata(group, value, now_ms, answers.append)
    assert answers == [ErrorCode.none]


def committed(offset: int, *, epoch: int = 3, metadata: str | None = "m", ts: int = 1_000, expire: int = -1):
    return CommittedOffset(offset, epoch, metadata, ts, expire)


# --------------------------------------------------------------------------------------------------
# Java's String.hashCode and Kafka's partition choice. Expected values printed by Java 17:
#   System.out.println(s.hashCode() + " " + (Utils.abs(s.hashCode()) % 50))


@pytest.mark.parametrize(
    "group, java_hash, partition_of_50",
    [
        ("test-group", 627841412, 12),
        ("", 0, 0),
        ("Hello World", -862545276, 26),  # negative: Utils.abs gives 26; masking with 0x7fffffff would give 22
        ("polygenelubricants", -(1 << 31), 0),  # Integer.MIN_VALUE: Utils.abs maps it to 0
        ("\u00e9t\u00e9-\u7ec4", 218893909, 9),  # BMP characters above Latin-1
        ("\U0001F600 group", -1570619006, 6),  # outside the BMP: hashed as a UTF-16 surrogate pair
        ("console-consumer-12345", 158455506, 6),
        ("my-group", -1906497762, 12),
    ],
)
def test_group_partition_matches_java_and_kafka(group, java_hash, partition_of_50):
    assert java_string_hash(group) == java_hash
    assert partition_for_group(group, 50) == partition_of_50
    assert OffsetStore(None, 50).partition_for(group) == partition_of_50


def test_kafka_abs_differs_from_masking_only_where_kafka_says():
    assert kafka_abs(-1) == 1
    assert kafka_abs(-(1 << 31)) == 0
    assert kafka_abs(5) == 5


@settings(max_examples=200)
@given(st.text())
def test_java_hash_is_the_polynomial_over_utf16_code_units(text):
    units = struct.unpack(f">{len(text.encode('utf-16-be', 'surrogatepass')) // 2}H", text.encode("utf-16-be", "surrogatepass"))
    n = len(units)
    expected = sum(u * pow(31, n - 1 - i, 1 << 32) for i, u in enumerate(units)) % (1 << 32)
    expected -= (1 << 32) if expected >= (1 << 31) else 0
    assert java_string_hash(text) == expected


# --------------------------------------------------------------------------------------------------
# Record schemas, byte for byte.


def test_offset_key_layout_is_kafkas_offset_commit_key():
    assert encode_offset_key("g", "tp", 7) == b"\x00\x01" + b"\x00\x01g" + b"\x00\x02tp" + b"\x00\x00\x00\x07"
    assert decode_key(encode_offset_key("g", "tp", 7)) == OffsetKey("g", "tp", 7)
    # Version 0 keys (older Kafka) have the same fields.
    assert decode_key(b"\x00\x00\x00\x01g\x00\x01t\x00\x00\x00\x02") == OffsetKey("g", "t", 2)


def test_group_metadata_key_layout_is_kafkas_group_metadata_key():
    assert encode_group_metadata_key("grp") == b"\x00\x02\x00\x03grp"
    assert decode_key(b"\x00\x02\x00\x03grp") == GroupMetadataKey("grp")
    assert decode_key(b"\x00\x05\x00\x03grp") is None  # another coordinator's record type: not ours


def test_offset_value_v3_layout():
    value = encode_offset_value(CommittedOffset(42, 5, "meta", 1_700_000_000_000))
    expected = struct.pack(">hqih", 3, 42, 5, 4) + b"meta" + struct.pack(">q", 1_700_000_000_000)
    assert value == expected
    assert decode_offset_value(value) == CommittedOffset(42, 5, "meta", 1_700_000_000_000, -1)


def test_offset_value_with_expire_timestamp_is_written_as_v1():
    value = encode_offset_value(CommittedOffset(42, 5, "", 1_000, 9_000))
    assert value == struct.pack(">hqhqq", 1, 42, 0, 1_000, 9_000)
    assert decode_offset_value(value) == CommittedOffset(42, -1, "", 1_000, 9_000)  # v1 has no leader epoch


def test_offset_value_other_versions_kafka_may_have_written():
    v0 = struct.pack(">hqh", 0, 7, 1) + b"x" + struct.pack(">q", 50)
    assert decode_offset_value(v0) == CommittedOffset(7, -1, "x", 50, -1)
    v4 = struct.pack(">hqi", 4, 7, 2) + bytes([3]) + b"ab" + struct.pack(">q", 50) + bytes([1, 0, 1, 0xFF])
    assert decode_offset_value(v4) == CommittedOffset(7, 2, "ab", 50, -1)
    with pytest.raises(ValueError):
        decode_offset_value(struct.pack(">hq", 9, 7))


# --------------------------------------------------------------------------------------------------
# The store over real logs.


def test_commit_appends_one_batch_to_the_groups_partition(logs):
    store = new_store(logs)
    group = "test-group"
    home = store.partition_for(group)
    offsets = {("orders", 0): committed(10), ("orders", 1): committed(20), ("audit", 0): committed(5)}
    commit(store, group, offsets, now_ms=1_000)
    batches = list(logs.get(home).batches())
    assert len(batches) == 1
    header, data = batches[0]
    assert header.record_count == 3
    assert all(not list(logs.get(p).batches()) for p in range(PARTITIONS) if p != home)
    assert store.fetch(group) == offsets
    assert store.fetch(group, [("orders", 1), ("missing", 0)]) == {("orders", 1): committed(20)}
    assert store.fetch("other-group") == {}


def test_offsets_survive_recreating_the_store_over_the_same_logs(logs):
    store = new_store(logs)
    commit(store, "a", {("t", 0): committed(1), ("t", 1): committed(2)}, now_ms=1_000)
    commit(store, "b", {("t", 0): committed(100, epoch=7, metadata="hello")}, now_ms=2_000)
    commit(store, "a", {("t", 0): committed(3, ts=3_000)}, now_ms=3_000)  # a later commit wins
    expected = {group: store.fetch(group) for group in store.groups()}
    again = reopened(logs)
    assert again.groups() == ["a", "b"]
    after_crash = reopened(logs, crash=True)  # descriptors dropped without a flush: the recovery path
    assert {group: after_crash.fetch(group) for group in after_crash.groups()} == expected
    assert {group: again.fetch(group) for group in again.groups()} == expected
    assert again.fetch("a")[("t", 0)] == committed(3, ts=3_000)


def test_null_metadata_is_stored_as_empty_string_like_kafka(logs):
    store = new_store(logs)
    commit(store, "g", {("t", 0): committed(1, metadata=None)}, now_ms=1)
    assert store.fetch("g")[("t", 0)].metadata == ""
    assert reopened(logs).fetch("g")[("t", 0)].metadata == ""


def test_delete_some_offsets_writes_tombstones(logs):
    store = new_store(logs)
    commit(store, "g", {("t", 0): committed(1), ("t", 1): committed(2)}, now_ms=1)
    store.delete("g", [("t", 0), ("never", 3)], now_ms=2)
    assert store.fetch("g") == {("t", 1): committed(2)}
    last_header, last_data = list(logs.get(store.partition_for("g")).batches())[-1]
    records = read_records(last_data, last_header)
    assert [(decode_key(r.key), r.value) for r in records] == [(OffsetKey("g", "t", 0), None)]
    assert reopened(logs).fetch("g") == {("t", 1): committed(2)}


def test_deleting_a_whole_group_removes_offsets_and_group_metadata(logs):
    store = new_store(logs)
    commit(store, "g", {("t", 0): committed(1)}, now_ms=1)
    put_group_metadata(store, "g", b"state-1", now_ms=1)
    commit(store, "keep", {("t", 0): committed(9)}, now_ms=1)
    store.delete("g", now_ms=2)
    assert store.groups() == ["keep"]
    again = reopened(logs)
    assert again.groups() == ["keep"]
    assert again.get_group_metadata("g") is None


def test_delete_topic_removes_that_topic_for_every_group(logs):
    store = new_store(logs)
    groups = ["g1", "g2", "g3", "g4"]
    for group in groups:
        commit(store, group, {("gone", 0): committed(1), ("gone", 1): committed(2), ("kept", 0): committed(3)}, now_ms=1)
    assert len({store.partition_for(g) for g in groups}) > 1  # the tombstones span several partitions
    assert store.delete_topic("gone", now_ms=2) == 8
    for group in groups:
        assert store.fetch(group) == {("kept", 0): committed(3)}
    again = reopened(logs)
    assert all(again.fetch(g) == {("kept", 0): committed(3)} for g in groups)


def test_group_metadata_is_stored_replayed_and_deleted(logs):
    store = new_store(logs)
    put_group_metadata(store, "g", b"generation-1", now_ms=1)
    put_group_metadata(store, "g", b"generation-2", now_ms=2)
    put_group_metadata(store, "h", b"\x00\xffbinary", now_ms=3)
    assert store.groups() == ["g", "h"]
    again = reopened(logs)
    assert again.group_metadata() == {"g": b"generation-2", "h": b"\x00\xffbinary"}
    again.delete_group_metadata("g", now_ms=4)
    assert reopened(logs).group_metadata() == {"h": b"\x00\xffbinary"}


def test_expire_removes_old_offsets_of_empty_groups_only(logs):
    store = new_store(logs)
    commit(store, "empty-old", {("t", 0): committed(1, ts=1_000)}, now_ms=1_000)
    commit(store, "empty-fresh", {("t", 0): committed(1, ts=9_500)}, now_ms=9_500)
    commit(store, "active-old", {("t", 0): committed(1, ts=1_000)}, now_ms=1_000)
    commit(store, "explicit", {("t", 0): committed(1, ts=9_900, expire=9_950)}, now_ms=9_900)
    removed = store.expire(now_ms=10_000, retention_ms=5_000, is_group_empty=lambda g: not g.startswith("active"))
    assert removed == 2
    assert store.groups() == ["active-old", "empty-fresh"]
    assert reopened(logs).groups() == ["active-old", "empty-fresh"]


def test_expire_counts_from_when_a_consumer_group_became_empty(logs):
    store = new_store(logs)
    commit(store, "g", {("t", 0): committed(1, ts=1_000)}, now_ms=1_000)
    since = {"g": 8_000}
    assert store.expire(10_000, 5_000, lambda g: True, empty_since_ms=since.get) == 0
    assert store.expire(13_000, 5_000, lambda g: True, empty_since_ms=since.get) == 1
    assert store.groups() == []


def test_load_skips_records_it_cannot_read_and_keeps_the_rest(logs):
    store = new_store(logs)
    commit(store, "g", {("t", 0): committed(1)}, now_ms=1)
    home = store.partition_for("g")
    junk = build_batch([(b"\x00\x01\x00", b"torn key"), (None, b"no key"), (b"\x00\x07future", b"?")], timestamp_ms=2)
    assert logs.replicas.append(OFFSETS_TOPIC, home, junk, acks=1, min_insync_replicas=1).error == ErrorCode.none
    commit(store, "g", {("t", 1): committed(2)}, now_ms=3)
    assert reopened(logs).fetch("g") == {("t", 0): committed(1), ("t", 1): committed(2)}


def test_commit_of_nothing_appends_nothing(logs):
    store = new_store(logs)
    commit(store, "g", {}, now_ms=1)
    store.delete("g", now_ms=1)
    store.delete_group_metadata("g", now_ms=1)
    assert all(not list(logs.get(p).batches()) for p in range(PARTITIONS))


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["commit", "delete", "delete-group", "meta"]),
            st.sampled_from(["g1", "g2", "grp", "\u7ec4"]),
            st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 2), st.integers(0, 1_000)), max_size=4),
        ),
        max_size=15,
    )
)
def test_a_reopened_store_equals_the_one_that_wrote(tmp_path_factory, ops):
    logs = OffsetsLogs(tmp_path_factory.mktemp("offsets"), PARTITIONS)
    try:
        store = new_store(logs)
        for now, (op, group, items) in enumerate(ops):
            if op == "commit":
                commit(store, group, {(t, p): committed(o, ts=now) for t, p, o in items}, now_ms=now)
            elif op == "delete":
                store.delete(group, [(t, p) for t, p, _ in items], now_ms=now)
            elif op == "delete-group":
                store.delete(group, now_ms=now)
            else:
                put_group_metadata(store, group, str(items).encode(), now_ms=now)
        again = reopened(logs)
        assert again.groups() == store.groups()
        assert again.group_metadata() == store.group_metadata()
        for group in store.groups():
            assert again.fetch(group) == store.fetch(group)
    finally:
        logs.close()

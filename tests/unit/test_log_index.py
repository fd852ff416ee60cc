"""Indexes, the leader-epoch cache, checkpoint files and topic config parsing of the log layer."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pykbroker.log.config import LogConfig
from pykbroker.log.index import CorruptIndex, OffsetIndex, TimeIndex
from pykbroker.log.checkpoint import CorruptCheckpoint, read_checkpoint, write_checkpoint
from pykbroker.log.leader_epoch import LeaderEpochCache


def test_offset_index_lookup_and_file_format(tmp_path):
    index = OffsetIndex.create(tmp_path / "00000000000000000100.index", 100)
    assert index.lookup(150) == (100, 0)  # no entry: the segment start
    for offset, position in [(104, 500), (110, 1200), (131, 2600)]:
        index.append(offset, position)
    assert index.lookup(103) == (100, 0)
    assert index.lookup(104) == (104, 500)
    assert index.lookup(130) == (110, 1200)
    assert index.lookup(10**6) == (131, 2600)
    with pytest.raises(ValueError):
        index.append(131, 3000)  # offsets must increase
    assert index.write_pending()
    assert (tmp_path / "00000000000000000100.index").read_bytes() == struct.pack(">iiiiii", 4, 500, 10, 1200, 31, 2600)
    assert not index.write_pending()  # nothing new


def test_offset_index_boundary_before(tmp_path):
    index = OffsetIndex.create(tmp_path / "0.index", 0)
    for offset, position in [(9, 100), (19, 200), (29, 300)]:
        index.append(offset, position)
    assert index.boundary_before(250, 100) == (19, 200)
    assert index.boundary_before(300, 100) == (29, 300)
    assert index.boundary_before(1000, 20) == (19, 200)  # bounded by offset as well
    assert index.boundary_before(99, 100) == (-1, -1)


def test_offset_index_truncate_and_reload(tmp_path):
    path = tmp_path / "00000000000000000000.index"
    index = OffsetIndex.create(path, 0)
    for i in range(1, 6):
        index.append(i * 10 + 9, i * 100)
    index.write_pending()
    index.truncate_to(39)  # drops entries for batches ending at 39 and later
    assert index.last_entry() == (29, 200)
    assert path.stat().st_size == 2 * 8
    index.append(35, 250)
    index.write_pending()
    reloaded = OffsetIndex.open_lazily(path, 0)
    assert reloaded.last_entry() == (35, 250)  # read from the file's tail without a full load
    reloaded.load(log_size=1000)
    assert reloaded.lookup(36) == (35, 250)


@pytest.mark.parametrize(
    "content",
    [b"\x00" * 5, struct.pack(">iiii", 5, 100, 5, 200), struct.pack(">iiii", 5, 100, 6, 90), struct.pack(">ii", 5, 5000)],
)
def test_corrupt_offset_index_is_detected(tmp_path, content):
    path = tmp_path / "0.index"
    path.write_bytes(content)
    with pytest.raises(CorruptIndex):
        OffsetIndex.open_lazily(path, 0).load(log_size=1000)


def test_missing_index_is_corrupt(tmp_path):
    with pytest.raises(CorruptIndex):
        TimeIndex.open_lazily(tmp_path / "0.timeindex", 0)


def test_time_index_keeps_only_growing_timestamps(tmp_path):
    path = tmp_path / "00000000000000000050.timeindex"
    index = TimeIndex.create(path, 50)
    index.maybe_append(-1, 50)  # no timestamp: nothing to index
    index.maybe_append(1_000, 55)
    index.maybe_append(900, 60)  # not larger: ignored
    index.maybe_append(1_000, 61)
    index.maybe_append(2_000, 70)
    assert index.entries == 2
    assert index.lookup(999) == (-1, 50)
    assert index.lookup(1_500) == (1_000, 55)
    assert index.last_entry() == (2_000, 70)
    index.write_pending()
    assert path.read_bytes() == struct.pack(">qiqi", 1_000, 5, 2_000, 20)
    index.truncate_to(70)
    assert index.last_entry() == (1_000, 55)
    bad = tmp_path / "bad.timeindex"
    bad.write_bytes(struct.pack(">qiqi", 2_000, 5, 1_000, 20))
    with pytest.raises(CorruptIndex):
        TimeIndex.open_lazily(bad, 0).load(log_size=100)


def test_index_fullness_follows_segment_index_bytes(tmp_path):
    index = OffsetIndex.create(tmp_path / "0.index", 0)
    index.append(1, 10)
    assert not index.is_full(16)
    index.append(2, 20)
    assert index.is_full(16)


# -- leader epochs -------------------------------------------------------------------------------------


def test_epoch_cache_assign_follows_kafka(tmp_path):
    cache = LeaderEpochCache(tmp_path / "leader-epoch-checkpoint")
    assert cache.assign(1, 0)
    assert not cache.assign(1, 5)  # same epoch, later offset: nothing to record
    assert cache.assign(3, 10)
    assert cache.assign(2, 8)  # an older epoch arriving late replaces what contradicts it
    assert cache.entries == [(1, 0), (2, 8)]
    assert cache.assign(4, 8)  # same start offset: the newer epoch wins
    assert cache.entries == [(1, 0), (4, 8)]
    assert not cache.assign(-1, 20)
    assert LeaderEpochCache.load(tmp_path).entries == [(1, 0), (4, 8)]


def test_epoch_cache_end_offsets_and_truncation(tmp_path):
    cache = LeaderEpochCache(tmp_path / "leader-epoch-checkpoint", [(2, 10), (5, 20), (6, 35)])
    assert cache.end_offset_for(5, 50) == (5, 35)
    assert cache.end_offset_for(4, 50) == (2, 20)
    assert cache.end_offset_for(6, 50) == (6, 50)
    assert cache.end_offset_for(1, 50) == (1, 10)
    assert cache.end_offset_for(7, 50) == (-1, -1)
    assert cache.end_offset_for(-1, 50) == (-1, -1)
    assert cache.epoch_for_offset(25) == 5 and cache.epoch_for_offset(3) == -1
    cache.truncate_from_start(25)
    assert cache.entries == [(5, 25), (6, 35)]
    cache.truncate_from_end(35)
    assert cache.entries == [(5, 25)]
    assert LeaderEpochCache.load(tmp_path).entries == [(5, 25)]


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 100)), max_size=30))
def test_epoch_cache_stays_strictly_increasing(assignments):
    cache = LeaderEpochCache(None)  # type: ignore[arg-type]  # no persistence in this property
    for epoch, start in assignments:
        cache.assign(epoch, start, persist=False)
    entries = cache.entries
    assert all(e1 < e2 and s1 < s2 for (e1, s1), (e2, s2) in zip(entries, entries[1:]))
    if assignments:  # the last assignment always decides the latest epoch, starting no later than it said
        assert cache.latest_epoch == assignments[-1][0] and entries[-1][1] <= assignments[-1][1]


def test_checkpoint_file_format(tmp_path):
    path = tmp_path / "recovery-point-offset-checkpoint"
    write_checkpoint(path, [("orders", 0, 120), ("a-b", 3, 7)])
    assert path.read_text() == "0\n2\norders 0 120\na-b 3 7\n"
    assert read_checkpoint(path, 3) == [["orders", "0", "120"], ["a-b", "3", "7"]]
    assert read_checkpoint(tmp_path / "absent", 3) is None
    path.write_text("0\n3\norders 0 120\n")
    with pytest.raises(CorruptCheckpoint):
        read_checkpoint(path, 3)
    (tmp_path / "leader-epoch-checkpoint").write_text("0\n2\n5 10\n4 20\n")
    with pytest.raises(CorruptCheckpoint):
        LeaderEpochCache.load(tmp_path)


# -- config --------------------------------------------------------------------------------------------


def test_config_from_topic_configs():
    config = LogConfig.from_topic_configs(
        {"segment.bytes": "2048", "retention.ms": -1, "message.timestamp.type": "LogAppendTime",
         "cleanup.policy": "delete", "max.message.bytes": 500}
    )
    assert config.segment_bytes == 2048 and config.retention_ms == -1 and config.max_message_bytes == 500
    assert config.log_append_time
    assert config.index_interval_bytes == LogConfig().index_interval_bytes
    with pytest.raises(ValueError):
        LogConfig.from_topic_configs({"message.timestamp.type": "WallClock"})

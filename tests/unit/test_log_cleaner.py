"""The log cleaner (pykbroker/log/cleaner.py) on real segment files: offset map, segment rewrite, tombstones,
producer batches, aborted transactions, the swap, and recovery of ``.cleaned`` / ``.swap`` files."""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import pytest

from pykbroker.log.cleaner import (
    CLEANER_CHECKPOINT,
    MAP_ENTRY_BYTES,
    OffsetMap,
    AbortedRange,
    CleanerConfig,
    CleanTask,
    LogCleaner,
    SegmentFile,
    build_offset_map,
    clean_log,
    CleanResult,
    walk_records,
)
from pykbroker.log.config import LogConfig
from pykbroker.log.partition_log import AbortedTxn, PartitionLog
from pykbroker.log.producer_state import CompletedTxn
from pykbroker.protocol.records import (
    COMPRESSION_NONE,
    TRANSACTIONAL_MASK,
    InvalidRecords,
    NullKeyRecords,
    build_batch,
    read_records,
)

COMPRESSION_GZIP = 1


def records_accelerated() -> bool:
    """The C offset map is in use (pykbroker._speedups built with it)."""
    from pykbroker.log import cleaner

    return cleaner.OffsetMap is not cleaner._OffsetMapPy

COMPRESSION_LZ4 = 3

NOW = int(time.time() * 1000)


_opened: list[PartitionLog] = []


@pytest.fixture(autouse=True)
def _close_logs():
    """Every log a test opened is closed after it: no descriptor outlives the test."""
    yield
    while _opened:
        partition_log = _opened.pop()
        partition_log.abandon()
        for segment in partition_log.segments_view():
            segment.close()


def open_log(path: Path, name: str = "t-0", **config) -> PartitionLog:
    settings = {"segment_bytes": 1 << 20, "cleanup_policy": "compact", "index_interval_bytes": 100}
    settings.update(config)
    partition_log = PartitionLog.open(path / name, LogConfig(**settings))
    _opened.append(partition_log)
    return partition_log


def append(plog: PartitionLog, records, **batch) -> None:
    plog.append(build_batch(records, timestamp_ms=NOW, **batch), leader_epoch=0, now_ms=NOW)


def four_segments(tmp_path: Path, compression: int = COMPRESSION_NONE, **config) -> PartitionLog:
    """A log of four one-record segments (values v0-v3 of key k) and an empty active segment."""
    plog = open_log(tmp_path, **config)
    for i in range(4):
        append(plog, [(b"k", f"v{i}".encode())], compression=compression)
        plog.roll()
    return plog


def contents(plog: PartitionLog) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for header, data in plog.batches() if not header.is_control
            for r in read_records(data, header)]


def latest(plog: PartitionLog) -> dict[bytes, bytes | None]:
    values = {}
    for _, key, value in contents(plog):
        values[key] = value
    return values


class FakeManager:
    def __init__(self, logs, hwm=1 << 62):  # hosted logs, bounded by their active segment only
        self.logs = logs
        self.hwm = hwm

    async def run_file_work(self, logs):
        from pykbroker.log.partition_log import run_file_work

        for partition_log in logs:
            run_file_work(partition_log.take_file_work())

    async def in_io_thread(self, work):
        work()


def make_cleaner(tmp_path: Path, logs: list[PartitionLog], **config) -> LogCleaner:
    fake = FakeManager(logs)
    cleaner = LogCleaner(tmp_path, CleanerConfig(**config), lambda: list(logs), lambda t, p: fake.hwm,
                         fake.run_file_work, fake.in_io_thread)
    cleaner.use_processes = False
    return cleaner


def clean_task(plog: PartitionLog, snapshot, *, first_dirty: int, end_bound: int, map_capacity: int) -> CleanTask:
    """What the broker hands a cleaner worker for ``plog``'s cleanable segments ``snapshot`` (1 MiB segments and
    indexes, tombstones kept no time)."""
    return CleanTask(str(plog.directory), tuple(SegmentFile(s.base_offset, size, end) for s, size, end in snapshot),
                     first_dirty=first_dirty, end_bound=end_bound, map_capacity=map_capacity, delete_retention_ms=0,
                     segment_bytes=1 << 20, segment_index_bytes=1 << 20, index_interval_bytes=100)


def clean_once(cleaner: LogCleaner) -> bool:
    return asyncio.run(cleaner.clean_filthiest())


# -- record walk -----------------------------------------------------------------------------------


def test_walk_records_reads_keys_and_tombstones():
    batch = build_batch([(b"a", b"1"), (None, b"2"), (b"k" * 300, None)])
    from pykbroker.protocol.records import BATCH_HEADER_SIZE

    walked = walk_records(bytes(batch[BATCH_HEADER_SIZE:]), 3)
    assert [(delta, key, null) for delta, key, null, _, _ in walked] == [(0, b"a", False), (1, None, False), (2, b"k" * 300, True)]
    assert walked[-1][4] == len(batch) - BATCH_HEADER_SIZE


# -- the map ---------------------------------------------------------------------------------------


def test_offset_map_holds_the_latest_offset_of_each_key_of_the_dirty_section(tmp_path):
    plog = open_log(tmp_path)
    for round_ in range(5):
        append(plog, [(f"k{i}".encode(), f"v{round_}".encode()) for i in range(3)])
    plog.roll()
    snapshot = plog.cleanable_segments(plog.log_end_offset)
    task = clean_task(plog, snapshot, first_dirty=3, end_bound=plog.log_end_offset, map_capacity=100)
    offsets, end = build_offset_map(task, CleanResult(3))
    assert len(offsets) == 3 and [offsets.get(b"k%d" % i) for i in range(3)] == [12, 13, 14]
    assert end == 15


def test_a_full_map_ends_the_cleaning_at_the_last_whole_batch(tmp_path):
    plog = open_log(tmp_path)
    for i in range(10):
        append(plog, [(f"k{i}".encode(), b"v")])
    plog.roll()
    snapshot = plog.cleanable_segments(plog.log_end_offset)
    task = clean_task(plog, snapshot, first_dirty=0, end_bound=10, map_capacity=4)
    offsets, end = build_offset_map(task, CleanResult(0))
    assert len(offsets) == 4 and end == 4


def test_map_capacity_is_the_dedupe_buffer_split_between_threads_over_the_entry_size():
    config = CleanerConfig(dedupe_buffer_size=128_000, threads=2, load_factor=0.9)
    assert config.map_slots == 64_000 // MAP_ENTRY_BYTES
    assert config.map_capacity == int(64_000 // MAP_ENTRY_BYTES * 0.9)
    if records_accelerated():
        assert (config.map_slots, config.map_capacity) == (2666, 2399)


def test_the_map_stays_within_the_dedupe_buffer():
    import tracemalloc

    config = CleanerConfig(dedupe_buffer_size=8 << 20, threads=1, load_factor=1.0)
    capacity = config.map_capacity
    assert capacity == config.map_slots - 1  # (a load factor of 1 leaves one free slot: probes end)
    tracemalloc.start()
    try:
        offsets = OffsetMap(config.map_slots, capacity, os.urandom(16))
        assert all(offsets.put(b"key-%010d" % i, 10**12 + i) for i in range(capacity))
        used = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(offsets) == capacity and offsets.nbytes <= 8 << 20
    assert used <= (8 << 20) + 1024  # the buffer, and the few Python objects around it
    assert not offsets.put(b"one more", 1)


def test_a_default_dedupe_buffer_maps_over_four_times_the_keys_of_the_dict_in_one_pass(tmp_path):
    """Kafka's default 128 MiB buffer: slots of 24 bytes at a load factor 0.9, 5,033,164 keys (the dict map
    held 943,718); scaled down to 1 MiB here, one cleaning maps every key of a log of 39,000 distinct keys."""
    config = CleanerConfig(dedupe_buffer_size=1 << 20, threads=1, load_factor=0.9)
    if not records_accelerated():
        pytest.skip("the C offset map is not built")
    assert CleanerConfig().map_capacity == 134217728 // 24 * 9 // 10 == 5_033_164
    assert config.map_capacity == (1 << 20) // 24 * 9 // 10 == 39_321
    assert config.map_capacity > 4 * int((1 << 20) // 128 * 0.9)
    plog = open_log(tmp_path, segment_bytes=1 << 30)
    for first in range(0, 39_000, 500):
        append(plog, [(b"key-%08d" % i, b"v") for i in range(first, first + 500)])
    plog.roll()
    append(plog, [(b"key-00000000", b"new")])
    plog.roll()
    append(plog, [(b"z", b"1")])
    cleaner = make_cleaner(tmp_path, [plog], dedupe_buffer_size=1 << 20)
    assert clean_once(cleaner)
    assert cleaner.last_result.map_entries == 39_000
    assert cleaner._checkpoints[("t", 0)] == 39_001  # every dirty key in one pass
    assert cleaner.last_result.records_kept == 39_000 and latest(plog)[b"key-00000000"] == b"new"


# -- the rewrite -----------------------------------------------------------------------------------


def test_many_updates_to_few_keys_over_several_segments_keep_the_latest_value_per_key(tmp_path):
    plog = open_log(tmp_path, segment_bytes=1000)
    expected = {}
    for round_ in range(60):
        key = f"key-{round_ % 5}".encode()
        value = f"value-{round_}".encode() * 3
        append(plog, [(key, value)])
        expected[key] = value
    active_base = plog.segment_base_offsets[-1]
    active_before = [(o, k, v) for o, k, v in contents(plog) if o >= active_base]
    assert len(plog.segment_base_offsets) > 3
    size_before = plog.size_bytes
    cleaner = make_cleaner(tmp_path, [plog])
    assert clean_once(cleaner)
    assert latest(plog) == expected
    after = contents(plog)
    offsets = [o for o, _, _ in after]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)  # offsets kept, in order
    below_active = [o for o in offsets if o < active_base]
    assert len(below_active) <= 5  # one per key in the cleaned part
    assert [(o, k, v) for o, k, v in after if o >= active_base] == active_before  # active untouched
    assert plog.size_bytes < size_before
    assert plog.log_end_offset == 60
    # the checkpoint names where the clean part ends
    rows = (tmp_path / CLEANER_CHECKPOINT).read_text().split("\n")
    assert rows[2] == f"t 0 {active_base}"
    # nothing left dirty: a second round has nothing to do
    assert not clean_once(cleaner)
    # the cleaned log loads again and reads the same
    plog.close()
    again = open_log(tmp_path, segment_bytes=1000)
    assert contents(again) == after


def test_producer_snapshots_inside_a_cleaned_range_go(tmp_path):
    """As Kafka's replaceSegments: a snapshot strictly inside the offsets a cleaned segment replaces is deleted
    (it could lie inside a transaction whose marker the cleaning removed); those at its bounds stay."""
    plog = open_log(tmp_path, segment_bytes=100_000)
    plog.load_producer_state()  # (hosted: rolls snapshot its producer state)
    for round_ in range(60):
        append(plog, [(f"key-{round_ % 5}".encode(), f"value-{round_}".encode() * 3)])
        if round_ % 10 == 9:
            plog.roll()  # small segments: the cleaning groups them
    before = plog.snapshot_offsets
    segments_before = plog.segment_base_offsets
    assert before == segments_before[-len(before):]  # the newest rolls' (older ones were deleted: at most 4)
    cleaner = make_cleaner(tmp_path, [plog])
    assert clean_once(cleaner)
    bases = plog.segment_base_offsets
    assert len(bases) < len(segments_before)  # small cleaned segments were grouped
    gone = [o for o in before if o not in bases]
    assert gone  # at the base of a replaced segment inside a group
    assert plog.snapshot_offsets == [o for o in before if o in bases]
    assert sorted(int(p.name[:20]) for p in plog.directory.glob("*.snapshot")) == plog.snapshot_offsets


def test_cleaned_batches_keep_their_metadata_and_codec(tmp_path):
    plog = open_log(tmp_path)
    append(plog, [(b"a", b"1"), (b"b", b"1"), (b"a", b"2")], producer_id=7, producer_epoch=3, base_sequence=0,
           compression=COMPRESSION_GZIP)
    append(plog, [(b"c", b"1")], producer_id=7, producer_epoch=3, base_sequence=3)
    plog.roll()
    append(plog, [(b"z", b"1")])
    assert clean_once(make_cleaner(tmp_path, [plog]))
    headers = list(plog.headers())
    first = headers[0]
    assert (first.base_offset, first.last_offset_delta, first.producer_id, first.producer_epoch, first.base_sequence,
            first.record_count, first.compression) == (0, 2, 7, 3, 0, 2, COMPRESSION_GZIP)
    assert contents(plog) == [(1, b"b", b"1"), (2, b"a", b"2"), (3, b"c", b"1"), (4, b"z", b"1")]


def test_the_last_batch_of_a_producer_stays_even_when_emptied(tmp_path):
    plog = open_log(tmp_path)
    append(plog, [(b"a", b"1")], producer_id=5, producer_epoch=0, base_sequence=0)
    append(plog, [(b"b", b"1")], producer_id=5, producer_epoch=0, base_sequence=1)  # last of producer 5
    append(plog, [(b"c", b"1")], producer_id=6, producer_epoch=0, base_sequence=0)  # emptied, not the last of 6
    append(plog, [(b"c", b"2")], producer_id=6, producer_epoch=0, base_sequence=1)
    append(plog, [(b"b", b"2"), (b"a", b"2")])
    plog.roll()
    append(plog, [(b"z", b"1")])
    plog.producer_state.rebuild(plog.headers())  # as the Partition owning the log keeps it
    assert clean_once(make_cleaner(tmp_path, [plog]))
    headers = [(h.base_offset, h.producer_id, h.base_sequence, h.record_count) for h in plog.headers()]
    assert headers == [(1, 5, 1, 0), (3, 6, 1, 1), (4, -1, -1, 2), (6, -1, -1, 1)]
    assert latest(plog) == {b"a": b"2", b"b": b"2", b"c": b"2", b"z": b"1"}


def test_the_emptied_last_batch_of_an_expired_producer_goes(tmp_path):
    """Kafka keeps the emptied last batch only for producers still in the producer state: an idempotent
    producer restarting (a new id each time) must not leave a batch behind forever."""
    plog = open_log(tmp_path)
    append(plog, [(b"a", b"1")], producer_id=5, producer_epoch=0, base_sequence=0)  # producer 5: expired
    append(plog, [(b"a", b"2")], producer_id=6, producer_epoch=0, base_sequence=0)  # producer 6: emptied, active
    append(plog, [(b"a", b"3")])
    plog.roll()
    append(plog, [(b"z", b"1")])
    plog.producer_state.rebuild(plog.headers())
    plog.producer_state.expire(NOW + 10**9, expiration_ms=1)
    plog.producer_state.rebuild([h for h in plog.headers() if h.producer_id == 6])
    assert plog.producer_state.producer_ids() == [6]
    assert clean_once(make_cleaner(tmp_path, [plog]))
    headers = [(h.base_offset, h.producer_id, h.record_count) for h in plog.headers()]
    assert headers == [(1, 6, 0), (2, -1, 1), (3, -1, 1)]


def test_control_batches_are_kept_and_aborted_records_dropped(tmp_path, monkeypatch):
    from pykbroker.protocol.control_records import marker_batch

    plog = open_log(tmp_path)
    append(plog, [(b"a", b"committed")])
    append(plog, [(b"a", b"aborted"), (b"b", b"aborted")], producer_id=9, producer_epoch=0, base_sequence=0,
           attributes=TRANSACTIONAL_MASK)  # offsets 1-2
    plog.append_as_follower(_at_offset(marker_batch(producer_id=9, producer_epoch=0, commit=False,
                                                    coordinator_epoch=0, timestamp_ms=NOW), 3))
    append(plog, [(b"c", b"1")])
    plog.roll()
    append(plog, [(b"z", b"1")])
    monkeypatch.setattr(plog, "aborted_ranges", lambda start, end: [AbortedTxn(9, 1, 3)])
    plog.producer_state.rebuild(plog.headers())
    assert clean_once(make_cleaner(tmp_path, [plog]))
    assert latest(plog) == {b"a": b"committed", b"c": b"1", b"z": b"1"}
    kinds = [(h.base_offset, h.is_control, h.record_count) for h in plog.headers()]
    assert (3, True, 1) in kinds  # the marker stays
    assert (1, False, 0) in kinds  # the aborted batch: its producer's last, kept empty


def _at_offset(batch, offset: int) -> bytearray:
    from pykbroker.protocol.records import set_base_offset

    batch = bytearray(batch)
    set_base_offset(batch, 0, offset)
    return batch


def test_tombstones_stay_until_delete_retention_ms_after_their_segment_was_cleaned(tmp_path):
    plog = open_log(tmp_path, delete_retention_ms=0, min_cleanable_dirty_ratio=0.01)
    append(plog, [(b"a", b"1"), (b"b", b"1"), (b"c", b"1")])
    append(plog, [(b"a", None)])  # tombstone
    plog.roll()
    append(plog, [(b"z", b"1")])
    cleaner = make_cleaner(tmp_path, [plog])
    assert clean_once(cleaner)
    assert latest(plog) == {b"a": None, b"b": b"1", b"c": b"1", b"z": b"1"}  # first cleaning keeps it
    # segment mtimes have one-second granularity on some file systems: make the clean part older
    old = time.time() - 10
    for base in plog.segment_base_offsets[:-1]:
        os.utime(plog.directory / f"{base:020d}.log", (old, old))
    append(plog, [(b"d", b"1")])
    plog.roll()
    append(plog, [(b"y", b"1")])
    assert clean_once(cleaner)
    assert latest(plog) == {b"b": b"1", b"c": b"1", b"z": b"1", b"d": b"1", b"y": b"1"}  # gone


def test_tombstones_stay_within_delete_retention_ms(tmp_path):
    plog = open_log(tmp_path, delete_retention_ms=3_600_000, min_cleanable_dirty_ratio=0.01)
    append(plog, [(b"a", b"1"), (b"a", None)])
    plog.roll()
    append(plog, [(b"z", b"1")])
    cleaner = make_cleaner(tmp_path, [plog])
    assert clean_once(cleaner)
    append(plog, [(b"d", b"1")])
    plog.roll()
    append(plog, [(b"y", b"1")])
    assert clean_once(cleaner)
    assert latest(plog)[b"a"] is None


def test_small_cleaned_segments_are_grouped_up_to_segment_bytes(tmp_path):
    # Kafka groups by the segments' sizes before cleaning: a first cleaning shrinks them, the next groups them
    plog = open_log(tmp_path, segment_bytes=300, min_cleanable_dirty_ratio=0.01)
    for i in range(80):
        append(plog, [(b"same", f"v{i}".encode())])
    segments_before = len(plog.segment_base_offsets)
    assert segments_before > 10
    cleaner = make_cleaner(tmp_path, [plog])
    assert clean_once(cleaner)
    assert len(plog.segment_base_offsets) == segments_before
    for i in range(80, 84):
        append(plog, [(b"same", f"v{i}".encode())])
    assert clean_once(cleaner)
    assert len(plog.segment_base_offsets) <= 3
    assert latest(plog) == {b"same": b"v83"}


def test_no_cleaning_below_the_dirty_ratio_or_of_delete_topics(tmp_path):
    plog = four_segments(tmp_path, min_cleanable_dirty_ratio=0.9)
    cleaner = make_cleaner(tmp_path, [plog])
    cleaner._checkpoints[("t", 0)] = 2  # half of it clean already
    assert cleaner.candidate(plog, NOW) is None
    plog.config = LogConfig(cleanup_policy="delete")
    cleaner._checkpoints.clear()
    assert cleaner.candidate(plog, NOW) is None


def test_the_high_watermark_and_min_compaction_lag_bound_the_cleaning(tmp_path):
    plog = four_segments(tmp_path)
    cleaner = make_cleaner(tmp_path, [plog])
    cleaner._stable_offset_of = lambda t, p: 2
    assert cleaner.candidate(plog, NOW).bound == 2
    cleaner._stable_offset_of = lambda t, p: 1 << 62
    plog.config = LogConfig(cleanup_policy="compact", min_compaction_lag_ms=60_000)
    assert cleaner.candidate(plog, NOW) is None  # every record is younger than a minute
    assert cleaner.candidate(plog, NOW + 120_000).bound == 4


def test_max_compaction_lag_cleans_below_the_dirty_ratio(tmp_path):
    plog = four_segments(tmp_path, min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=1000)
    cleaner = make_cleaner(tmp_path, [plog])
    cleaner._checkpoints[("t", 0)] = 2
    assert cleaner.candidate(plog, NOW) is None
    assert cleaner.candidate(plog, NOW + 5000) is not None


# -- aborting and reads during a swap --------------------------------------------------------------


def test_a_cleaning_whose_segments_changed_meanwhile_is_aborted(tmp_path):
    plog = open_log(tmp_path)
    for i in range(6):
        append(plog, [(b"k", f"v{i}".encode())])
        plog.roll()
    snapshot = plog.cleanable_segments(plog.log_end_offset)
    task = clean_task(plog, snapshot, first_dirty=0, end_bound=6, map_capacity=100)
    result = clean_log(task)
    assert any(name.endswith(".cleaned") for name in os.listdir(plog.directory))
    plog.delete_records_before(2)  # retention / DeleteRecords removed segments meanwhile
    assert not plog.swap_cleaned(snapshot, result.segments)
    from pykbroker.log.partition_log import run_file_work

    run_file_work(plog.take_file_work())
    assert not any(name.endswith((".cleaned", ".swap")) for name in os.listdir(plog.directory))
    assert [v for _, _, v in contents(plog)] == [b"v2", b"v3", b"v4", b"v5"]


def test_a_read_in_progress_continues_in_the_replacing_segment(tmp_path):
    plog = open_log(tmp_path)
    for i in range(6):
        append(plog, [(f"k{i % 2}".encode(), f"v{i}".encode())])
        plog.roll()
    reader = plog.batches()
    header, _ = next(reader)  # holds segment 0
    assert header.base_offset == 0
    fetched = plog.read(1, 1 << 20)  # a fetch's slices pin the old files
    before = fetched.read_bytes()
    assert clean_once(make_cleaner(tmp_path, [plog]))
    rest = [h.base_offset for h, _ in reader]
    assert rest == [4, 5]  # continued after offset 0 in the cleaned segment: only the latest per key
    assert fetched.read_bytes() == before


# -- recovery --------------------------------------------------------------------------------------


def _cleaned_but_not_swapped(tmp_path):
    plog = open_log(tmp_path)
    for i in range(6):
        append(plog, [(f"k{i % 2}".encode(), f"v{i}".encode())])
        plog.roll()
    append(plog, [(b"k9", b"active")])
    snapshot = plog.cleanable_segments(plog.log_end_offset)
    task = clean_task(plog, snapshot, first_dirty=0, end_bound=6, map_capacity=100)
    result = clean_log(task)
    return plog, snapshot, result


def test_cleaned_files_are_deleted_at_load(tmp_path):
    plog, _, _ = _cleaned_but_not_swapped(tmp_path)
    before = contents(plog)
    plog.close()
    again = open_log(tmp_path)
    assert contents(again) == before
    assert not any(name.endswith(".cleaned") for name in os.listdir(again.directory))


@pytest.mark.parametrize("step", ["swap", "deleted", "renamed"])
def test_an_interrupted_swap_completes_at_load(tmp_path, monkeypatch, step):
    plog, snapshot, result = _cleaned_but_not_swapped(tmp_path)
    expected = {b"k0": b"v4", b"k1": b"v5", b"k9": b"active"}

    class Crash(Exception):
        pass

    def crash(at):
        if at == step:
            raise Crash(at)

    monkeypatch.setattr("pykbroker.log.cleaner.crash_point", crash)
    with pytest.raises(Crash):
        plog.swap_cleaned(snapshot, result.segments)
    for segment in plog.segments_view():
        segment.close()
    again = open_log(tmp_path)
    assert latest(again) == expected
    assert [o for o, _, _ in contents(again)] == [4, 5, 6]
    names = os.listdir(again.directory)
    assert not any(name.endswith((".cleaned", ".swap")) for name in names)


# -- null keys ------------------------------------------------------------------------------------


def test_a_compacted_topic_refuses_null_keys_naming_each_record(tmp_path):
    plog = open_log(tmp_path)
    with pytest.raises(NullKeyRecords) as refused:
        append(plog, [(b"a", b"1"), (None, b"2"), (None, b"3")], compression=COMPRESSION_LZ4)
    assert isinstance(refused.value, InvalidRecords)
    assert [index for index, _ in refused.value.errors] == [1, 2]
    assert refused.value.errors[0][1] == "Compacted topic cannot accept message without key in topic partition t-0."
    assert plog.log_end_offset == 0  # nothing appended
    delete_log = open_log(tmp_path, "d-0", cleanup_policy="delete")
    delete_log.append(build_batch([(None, b"1")], timestamp_ms=NOW), leader_epoch=0, now_ms=NOW)
    assert delete_log.log_end_offset == 1


def _zigzag(value: int) -> bytes:
    raw = ((value << 1) ^ (value >> 63)) & ((1 << 64) - 1)
    out = bytearray()
    while raw >= 0x80:
        out.append(raw & 0x7F | 0x80)
        raw >>= 7
    return bytes(out + bytes([raw]))


@pytest.mark.parametrize("accelerated", [True, False])
def test_null_keys_in_any_encoding_are_refused(tmp_path, monkeypatch, accelerated):
    """Kafka reads any negative key length as a null key: -2, or -1 written in two bytes (0x81 0x00), is no key
    either, so a compacted topic refuses them too (the cleaner would otherwise drop them as keyless: an
    acknowledged write lost)."""
    import struct

    from pykbroker.protocol import records

    if not accelerated:
        monkeypatch.setattr(records, "count_null_keys", records._count_null_keys_py)
    keys = [_zigzag(1) + b"k", _zigzag(-2), b"\x81\x00", _zigzag(-1)]
    body = b""
    for delta, key in enumerate(keys):
        record = b"\x00" + _zigzag(0) + _zigzag(delta) + key + _zigzag(1) + b"v" + b"\x00"
        body += _zigzag(len(record)) + record
    batch = bytearray(build_batch([(b"k", b"v")] * len(keys), timestamp_ms=NOW)[:records.BATCH_HEADER_SIZE]) + body
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">I", batch, 17, records.crc32c(memoryview(batch)[records.CRC_START:]))
    plog = open_log(tmp_path)
    with pytest.raises(NullKeyRecords) as refused:
        plog.append(batch, leader_epoch=0, now_ms=NOW)
    assert [index for index, _ in refused.value.errors] == [1, 2, 3]
    assert plog.log_end_offset == 0


def test_compact_only_topics_have_no_time_retention(tmp_path):
    plog = open_log(tmp_path, retention_ms=1)
    append(plog, [(b"a", b"1")])
    plog.roll()
    append(plog, [(b"b", b"1")])
    assert plog.apply_retention(NOW + 10_000) == 0
    plog.config = LogConfig(cleanup_policy="compact,delete", retention_ms=1)
    assert plog.apply_retention(NOW + 10_000) == 2  # the active one too, a new one rolled first (Kafka's rule)
    assert plog.segment_base_offsets == [2] and plog.log_start_offset == 2


def test_aborted_range_matching():
    from pykbroker.log.cleaner import _Aborted

    aborted = _Aborted((AbortedRange(1, 10, 20),))
    header = build_batch([(b"a", b"1")], producer_id=1, producer_epoch=0, base_sequence=0, attributes=TRANSACTIONAL_MASK,
                         base_offset=15)
    from pykbroker.protocol.records import read_header

    assert aborted.contains(read_header(header))
    assert not aborted.contains(read_header(build_batch([(b"a", b"1")], base_offset=15)))
    assert COMPRESSION_NONE == 0


def test_aborted_range_matching_bisects_many_ranges():
    from pykbroker.log.cleaner import _Aborted
    from pykbroker.protocol.records import read_header

    aborted = _Aborted(tuple(AbortedRange(1, first, first + 5) for first in range(10_000, 0, -10)))

    def at(offset, producer_id=1):
        return read_header(build_batch([(b"a", b"1")], producer_id=producer_id, producer_epoch=0, base_sequence=0,
                                       attributes=TRANSACTIONAL_MASK, base_offset=offset))

    assert aborted.contains(at(10)) and aborted.contains(at(15)) and aborted.contains(at(9995))
    assert not aborted.contains(at(16)) and not aborted.contains(at(9)) and not aborted.contains(at(10_006))
    assert not aborted.contains(at(15, producer_id=2))


def test_a_log_whose_data_cannot_be_read_is_not_cleaned_again(tmp_path):
    plog = four_segments(tmp_path, COMPRESSION_GZIP)
    first = plog.directory / "00000000000000000000.log"
    data = bytearray(first.read_bytes())
    data[70:80] = b"\xff" * 10  # inside the gzip stream (the CRC is not checked by the cleaner)
    first.write_bytes(bytes(data))
    cleaner = make_cleaner(tmp_path, [plog])
    assert not clean_once(cleaner)  # no progress
    assert ("t", 0) in cleaner._uncleanable
    assert not clean_once(cleaner)  # skipped from now on
    assert not any(name.endswith(".cleaned") for name in os.listdir(plog.directory))


def test_a_batch_with_a_bad_crc_is_never_rewritten_under_a_fresh_one(tmp_path):
    """Bit rot inside an uncompressed value still parses: rebuilt, the batch would carry a valid CRC over the
    damaged bytes. The cleaner checks the CRC of every batch it rewrites and leaves the partition uncleaned."""
    plog = open_log(tmp_path)
    append(plog, [(b"k", b"old-value"), (b"j", b"kept-value")])  # k's record goes in the cleaning: rebuilt
    plog.roll()
    append(plog, [(b"k", b"new-value")])
    plog.roll()
    first = plog.directory / "00000000000000000000.log"
    data = bytearray(first.read_bytes())
    at = data.index(b"kept-value")
    data[at] ^= 0x01  # "jept-value": a damaged value the walk reads as well as the real one
    first.write_bytes(bytes(data))
    cleaner = make_cleaner(tmp_path, [plog])
    assert not clean_once(cleaner)
    assert ("t", 0) in cleaner._uncleanable
    assert first.read_bytes() == bytes(data)  # left as it was: consumers still see the bad CRC


def test_a_dirty_ratio_equal_to_the_minimum_is_not_enough_as_in_kafka(tmp_path):
    plog = four_segments(tmp_path, min_cleanable_dirty_ratio=0.5)
    cleaner = make_cleaner(tmp_path, [plog])
    cleaner._checkpoints[("t", 0)] = 2  # two clean segments, two dirty ones of the same size
    assert cleaner.candidate(plog, NOW) is None
    cleaner._checkpoints[("t", 0)] = 1
    assert cleaner.candidate(plog, NOW).ratio == 0.75


def test_aborted_entries_of_replaced_segments_move_to_the_replacing_segments_index(tmp_path):
    """The transaction index (.txnindex) of segments a cleaning replaces is carried to the segment that replaced
    them: fetches keep getting the aborted transaction, and no index file of a replaced base is left behind."""
    from pykbroker.log.producer_state import CompletedTxn
    from pykbroker.log.txn_index import TXN_INDEX_SUFFIX

    plog = open_log(tmp_path)
    append(plog, [(b"a", b"1")])
    plog.roll()
    append(plog, [(b"a", b"2")])
    plog.roll()  # segment 2 holds an aborted transaction's data (offset 2) and its marker (offset 3)
    append(plog, [(b"b", b"x")], producer_id=9, producer_epoch=0, base_sequence=0, attributes=TRANSACTIONAL_MASK)
    plog.append_as_follower(_at_offset(marker_batch_for(9, commit=False), 3))
    plog.index_aborted(CompletedTxn(producer_id=9, first_offset=2, last_offset=3, is_aborted=True), 4)
    plog.roll()
    append(plog, [(b"a", b"3")])
    plog.roll()
    append(plog, [(b"z", b"active")])
    assert [(t.producer_id, t.first_offset) for t in plog.aborted_ranges(0, 10)] == [(9, 2)]
    assert (tmp_path / "t-0" / f"{2:020d}{TXN_INDEX_SUFFIX}").exists()
    assert clean_once(make_cleaner(tmp_path, [plog], dedupe_buffer_size=1 << 20))
    bases = [segment.base_offset for segment in plog.segments_view()]
    assert 2 not in bases  # grouped into the first cleaned segment
    assert [(t.producer_id, t.first_offset, t.last_offset) for t in plog.aborted_ranges(0, 10)] == [(9, 2, 3)]
    index_files = sorted(p.name for p in (tmp_path / "t-0").iterdir() if p.name.endswith(TXN_INDEX_SUFFIX))
    assert index_files == [f"{bases[0]:020d}{TXN_INDEX_SUFFIX}"]
    assert latest(plog) == {b"a": b"3", b"z": b"active"}  # the aborted record is gone


def marker_batch_for(producer_id: int, *, commit: bool) -> bytearray:
    from pykbroker.protocol.control_records import marker_batch

    return marker_batch(producer_id=producer_id, producer_epoch=0, commit=commit, coordinator_epoch=0, timestamp_ms=NOW)


def test_reconfigure_restarts_the_cleaning_loops_with_the_new_settings(tmp_path):
    """Dynamic log.cleaner.* configs: the loops stop and start again with the new thread count and backoff
    (Kafka's LogCleaner.reconfigure); an unchanged config changes nothing."""
    plog = four_segments(tmp_path)
    cleaner = make_cleaner(tmp_path, [plog], threads=1, backoff_ms=60_000)
    started = []
    original_loop = cleaner._loop

    async def counting_loop():
        started.append(cleaner.config.threads)
        await original_loop()

    cleaner._loop = counting_loop

    async def scenario():
        runner = asyncio.ensure_future(cleaner.run())
        deadline = time.monotonic() + 10
        while cleaner.cleanings < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert cleaner.cleanings == 1 and started == [1]
        cleaner.reconfigure(cleaner.config)  # the same settings: no restart
        await asyncio.sleep(0.05)
        assert started == [1]
        cleaner.reconfigure(CleanerConfig(threads=2, backoff_ms=60_000))
        while len(started) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert started == [1, 2, 2]
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

    asyncio.run(scenario())


# -- review findings (issue 12): each test failed before its fix ------------------------------------


def test_a_16_byte_key_equal_to_a_long_keys_digest_does_not_supersede_it(tmp_path):
    import hashlib

    victim = b"connect-offsets-for-some-connector-partition-0"
    plog = open_log(tmp_path)
    append(plog, [(victim, b"latest-value")])
    plog.roll()
    append(plog, [(hashlib.blake2b(victim, digest_size=16).digest(), b"x")])
    plog.roll()
    append(plog, [(b"z", b"1")])
    assert clean_once(make_cleaner(tmp_path, [plog]))
    assert latest(plog)[victim] == b"latest-value"


def test_a_log_not_hosted_yet_is_not_cleaned(tmp_path):
    """No high watermark or producer state yet (cluster start before LeaderAndIsr): an open transaction's
    record must not remove the committed value."""
    plog = open_log(tmp_path)
    append(plog, [(b"k", b"committed")])
    plog.roll()
    append(plog, [(b"k", b"open-txn")], producer_id=5, producer_epoch=0, base_sequence=0, attributes=TRANSACTIONAL_MASK)
    plog.roll()
    append(plog, [(b"z", b"1")])
    cleaner = make_cleaner(tmp_path, [plog])
    cleaner._stable_offset_of = lambda t, p: None
    assert cleaner.candidate(plog, NOW) is None
    assert not clean_once(cleaner)
    assert (0, b"k", b"committed") in contents(plog)


def _follower_batch(key: bytes, value: bytes, offset: int):
    return _at_offset(build_batch([(key, value)], timestamp_ms=NOW), offset)


def test_a_truncation_and_refill_of_the_same_size_refuses_the_swap(tmp_path):
    plog = open_log(tmp_path)
    for i in range(4):
        append(plog, [(b"k%d" % i, b"old%d" % i)])
    plog.roll()
    for i in range(4, 8):
        append(plog, [(b"k%d" % i, b"old%d" % i)])
    plog.roll()
    append(plog, [(b"x", b"1")])
    truncations = plog.truncations
    snapshot = plog.cleanable_segments(plog.log_end_offset)
    task = clean_task(plog, snapshot, first_dirty=0, end_bound=8, map_capacity=1000)
    result = clean_log(task)
    plog.truncate_to(6)  # meanwhile: a new leader; the follower fetches other records of the same size
    for i in range(6, 8):
        plog.append_as_follower(_follower_batch(b"k%d" % i, b"NEW%d" % i, i))
    plog.roll()
    append(plog, [(b"y", b"1")])
    assert [s.size for s, _, _ in plog.cleanable_segments(plog.log_end_offset)] == [s.size for s in task.segments]
    assert not plog.swap_cleaned(snapshot, result.segments, truncations)
    assert latest(plog)[b"k6"] == b"NEW6" and latest(plog)[b"k7"] == b"NEW7"


def _cleanable_log_with_truncation_hook(tmp_path):
    """Seven cleanable one-batch segments (offsets 0-6) and an active one; the cleaner's checkpoint follows
    truncations (``on_truncate``, as LogManager sets it)."""
    plog = open_log(tmp_path, delete_retention_ms=0, min_cleanable_dirty_ratio=0.01)
    append(plog, [(b"k", b"v1")])
    plog.roll()
    for i in range(6):
        append(plog, [(b"f%d" % i, b"x")])
        plog.roll()
    append(plog, [(b"z", b"1")])
    cleaner = make_cleaner(tmp_path, [plog])
    plog.on_truncate = lambda offset: cleaner.truncate_checkpoint("t", 0, offset)  # as LogManager sets it
    return plog, cleaner


def test_the_checkpoint_goes_down_with_a_truncation_so_a_tombstone_written_again_deletes(tmp_path):
    plog, cleaner = _cleanable_log_with_truncation_hook(tmp_path)
    assert clean_once(cleaner)
    assert cleaner._checkpoints[("t", 0)] == 7
    plog.truncate_to(3)
    assert cleaner._checkpoints[("t", 0)] == 3
    append(plog, [(b"k", None)])  # a tombstone of k at offset 3
    plog.roll()
    for i in range(6):
        append(plog, [(b"g%d" % i, b"x")])
        plog.roll()
    append(plog, [(b"z", b"2")])
    old = time.time() - 3600
    for segment in plog.segments_view()[:-1]:
        os.utime(segment.log_path, (old, old))
    for _ in range(3):
        clean_once(cleaner)
        cleaner._backoff.clear()
    assert b"k" not in latest(plog) or latest(plog)[b"k"] is None


def test_a_checkpoint_past_the_end_of_a_loaded_log_is_reset(tmp_path):
    plog = four_segments(tmp_path)
    cleaner = make_cleaner(tmp_path, [plog])
    cleaner._checkpoints[("t", 0)] = 100  # a recovery cut the log below it
    cleaner.check_loaded(plog)
    assert cleaner._checkpoints[("t", 0)] == plog.log_start_offset
    for i in range(200):  # refilled past the old checkpoint: still dirty from the start
        append(plog, [(b"k", b"%d" % i)])
    assert cleaner.first_dirty_offset(plog) == 0


def test_a_map_full_in_the_first_dirty_batch_makes_no_progress_and_backs_off(tmp_path):
    plog = open_log(tmp_path)
    append(plog, [(b"a", b"1")])
    plog.roll()
    append(plog, [(f"k{i}".encode(), b"v") for i in range(50)])
    plog.roll()
    append(plog, [(b"z", b"1")])
    cleaner = make_cleaner(tmp_path, [plog], dedupe_buffer_size=128 * 10, backoff_ms=60_000)  # 47 keys (9 in Python)
    files = sorted(os.listdir(plog.directory))
    assert clean_once(cleaner)  # offset 0 (the first batch fits)
    assert cleaner._checkpoints[("t", 0)] == 1
    written = cleaner.cleanings
    assert not clean_once(cleaner)  # the 50-key batch never fits: nothing rewritten, no progress
    assert cleaner.cleanings == written and cleaner._checkpoints[("t", 0)] == 1
    assert ("t", 0) in cleaner._backoff
    assert cleaner.filthiest(NOW) is None  # not chosen again before the backoff
    assert sorted(os.listdir(plog.directory)) == files


def test_an_aborted_cleaning_backs_off(tmp_path, monkeypatch):
    plog = four_segments(tmp_path)
    cleaner = make_cleaner(tmp_path, [plog], backoff_ms=60_000)

    def full_disk(task):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("pykbroker.log.cleaner.clean_log", full_disk)
    assert not clean_once(cleaner)
    assert cleaner.filthiest(int(time.time() * 1000)) is None
    monkeypatch.undo()
    cleaner._backoff.clear()
    assert clean_once(cleaner)


def _txn_log(tmp_path, commit: bool):
    """k=v0; a transaction of producer 9 writing k (offset 1) and its marker (2); k=v3 supersedes it."""
    from pykbroker.protocol.control_records import marker_batch

    plog = open_log(tmp_path, delete_retention_ms=0, min_cleanable_dirty_ratio=0.01)
    append(plog, [(b"k", b"v0")])
    append(plog, [(b"k", b"txn")], producer_id=9, producer_epoch=0, base_sequence=0, attributes=TRANSACTIONAL_MASK)
    plog.append_as_follower(_at_offset(marker_batch(producer_id=9, producer_epoch=0, commit=commit,
                                                    coordinator_epoch=0, timestamp_ms=NOW), 2))
    append(plog, [(b"k", b"v3")])
    plog.roll()
    append(plog, [(b"z", b"1")])
    return plog


@pytest.mark.parametrize("commit", [True, False])
def test_a_marker_goes_once_its_transaction_has_no_data_left_past_the_delete_horizon(tmp_path, commit):
    plog = _txn_log(tmp_path, commit)
    if not commit:
        plog.index_aborted(CompletedTxn(9, 1, 2, True), 1)
        assert plog.aborted_ranges(0, 10) == [AbortedTxn(9, 1, 2)]
    # producer 9 expired: its emptied batch goes in the first cleaning, its marker stays (a batch was read)
    cleaner = make_cleaner(tmp_path, [plog], backoff_ms=0)
    assert clean_once(cleaner)
    assert any(h.is_control for h in plog.headers())
    append(plog, [(b"k2", b"1")])  # more dirty data, so the log is cleaned again
    plog.roll()
    append(plog, [(b"z", b"2")])
    old = time.time() - 3600
    for segment in plog.segments_view()[:-1]:
        os.utime(segment.log_path, (old, old))
    assert clean_once(cleaner)
    assert not any(h.is_control for h in plog.headers())
    assert latest(plog)[b"k"] == b"v3"
    # a fetch never gets an aborted-transaction entry whose marker is gone
    assert plog.aborted_ranges(0, plog.log_end_offset) == []


def test_a_marker_stays_while_its_transaction_has_data(tmp_path):
    from pykbroker.protocol.control_records import marker_batch

    plog = open_log(tmp_path, delete_retention_ms=0)
    append(plog, [(b"t", b"1")], producer_id=9, producer_epoch=0, base_sequence=0, attributes=TRANSACTIONAL_MASK)
    plog.append_as_follower(_at_offset(marker_batch(producer_id=9, producer_epoch=0, commit=True,
                                                    coordinator_epoch=0, timestamp_ms=NOW), 1))
    append(plog, [(b"k", b"1")])
    append(plog, [(b"k", b"2")])
    plog.roll()
    append(plog, [(b"z", b"1")])
    old = time.time() - 3600
    for segment in plog.segments_view()[:-1]:
        os.utime(segment.log_path, (old, old))
    cleaner = make_cleaner(tmp_path, [plog], backoff_ms=0)
    for _ in range(2):
        clean_once(cleaner)
        append(plog, [(b"k", b"3")])
        plog.roll()
    assert (0, b"t", b"1") in contents(plog)
    assert any(h.is_control for h in plog.headers())


def test_reconfiguring_joins_the_workers_off_the_event_loop(tmp_path, monkeypatch):
    import threading

    cleaner = make_cleaner(tmp_path, [])
    joined_in = []

    class Process:
        def is_alive(self):
            return True

        def terminate(self):
            pass

        def join(self, timeout=None):
            joined_in.append(threading.current_thread())

    monkeypatch.setattr(cleaner, "_stop_workers", lambda: [Process()])

    async def main():
        run = asyncio.ensure_future(cleaner.run())
        await asyncio.sleep(0)
        cleaner.reconfigure(CleanerConfig(enable=False, backoff_ms=1))
        deadline = time.monotonic() + 30
        while not joined_in and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        cleaner._closed = True
        cleaner.reconfigure(CleanerConfig(enable=False, backoff_ms=2))
        await asyncio.wait_for(run, 30)

    asyncio.run(main())
    assert joined_in and all(thread is not threading.main_thread() for thread in joined_in)


def test_the_null_key_check_reuses_the_validation_walk(tmp_path, monkeypatch):
    """A compacted topic's append decompresses each batch once (the null keys are counted in the walk over
    the records validation already decompressed), and still names every keyless record."""
    from pykbroker.protocol import records

    plog = open_log(tmp_path)
    calls = []
    original = records.client_records_section
    monkeypatch.setattr(records, "client_records_section", lambda *a: calls.append(1) or original(*a))
    append(plog, [(b"k%d" % i, b"v") for i in range(1000)], compression=COMPRESSION_GZIP)
    assert len(calls) == 1
    with pytest.raises(NullKeyRecords) as info:
        append(plog, [(b"a", b"1"), (None, b"2"), (b"b", b"3"), (None, b"4")], compression=COMPRESSION_GZIP)
    assert [index for index, _ in info.value.errors] == [1, 3]


@pytest.mark.parametrize("compression", [COMPRESSION_NONE, COMPRESSION_GZIP])
def test_null_keys_are_counted_alike_in_c_and_python(compression):
    from pykbroker.protocol import records

    batch = build_batch([(None if i % 7 == 0 else b"k", None if i % 3 else b"v") for i in range(100)],
                        compression=compression)
    header = records.validate_batches(batch)[0]
    data = bytes(records.client_records_section(memoryview(batch), header, records.MAX_DECOMPRESSED_BYTES))
    expected = len(records.null_key_indexes(data, 100))
    assert expected == 15
    assert records._count_null_keys_py(data, 100) == expected
    if records.ACCELERATED:
        from pykbroker._speedups import count_null_keys

        assert count_null_keys(data, 100) == expected


def test_a_truncation_during_the_await_after_the_swap_keeps_the_lowered_checkpoint(tmp_path):
    plog, cleaner = _cleanable_log_with_truncation_hook(tmp_path)
    cleaner._checkpoints[("t", 0)] = 1
    run_file_work = cleaner._run_file_work
    truncated = []

    async def truncating_file_work(logs):  # a follower truncation while the swap's file work runs
        if not truncated:
            truncated.append(plog.truncate_to(3))
        return await run_file_work(logs)

    cleaner._run_file_work = truncating_file_work
    assert clean_once(cleaner)
    assert truncated
    assert cleaner._checkpoints[("t", 0)] <= 3  # not raised back to the cleaned end (7) above the truncation


# -- lz4 decompression in bounded pieces (protocol/compression.py _lz4, which the cleaner calls twice a batch) --


def _lz4_frame(data: bytes) -> bytes:
    import lz4.frame

    return lz4.frame.compress(data, store_size=False, block_linked=False)  # as Kafka's Java client writes it


def _count_lz4_requests(monkeypatch) -> list[int]:
    """The max_length of every call to the lz4 decompressor."""
    import lz4.frame

    asked: list[int] = []
    real = lz4.frame.LZ4FrameDecompressor.decompress

    def spy(self, data, max_length=-1):
        asked.append(max_length)
        return real(self, data, max_length=max_length)

    monkeypatch.setattr(lz4.frame.LZ4FrameDecompressor, "decompress", spy)
    return asked


@pytest.mark.parametrize("pieces", [0, 1, 3])
def test_lz4_output_larger_than_one_step_reads_back_whole_and_holds_the_bound(monkeypatch, pieces):
    from pykbroker.protocol import compression

    data = bytes(range(256)) * ((pieces * compression._LZ4_STEP + 1000) // 256)
    frame = _lz4_frame(data)
    asked = _count_lz4_requests(monkeypatch)
    assert compression.decompress(COMPRESSION_LZ4, frame, len(data)) == data  # exactly at the bound
    first = max(compression._LZ4_STEP, 4 * len(frame))
    assert asked[0] == min(first, len(data) + 1)  # never the whole bound at once
    for index in range(1, len(asked)):  # then each piece at most as big as all the output before it
        assert asked[index] <= max(first, sum(min(a, len(data)) for a in asked[:index]))
    assert len(asked) <= 2 + pieces
    with pytest.raises(compression.DecompressionError, match=f"decompresses to more than {len(data) - 1} bytes"):
        compression.decompress(COMPRESSION_LZ4, frame, len(data) - 1)


def test_an_lz4_bomb_stops_at_the_bound_in_steps(monkeypatch):
    from pykbroker.protocol import compression

    bomb = _lz4_frame(bytes(16 * compression._LZ4_STEP))
    assert len(bomb) < 100_000
    asked = _count_lz4_requests(monkeypatch)
    limit = 2 * compression._LZ4_STEP + 5
    with pytest.raises(compression.DecompressionError, match=f"more than {limit} bytes"):
        compression.decompress(COMPRESSION_LZ4, bomb, limit)
    assert sum(asked) == limit + 1 and len(asked) == 3  # stopped at limit + 1 bytes, not at the frame's end


def test_a_large_incompressible_lz4_frame_is_asked_for_in_growing_pieces(monkeypatch):
    """python-lz4 copies the input left at each call: fixed 1 MiB pieces over a 12 MiB incompressible frame took
    a dozen copies of the input; growing pieces take a handful."""
    from pykbroker.protocol import compression

    data = random.Random(3).randbytes(12 * compression._LZ4_STEP)
    frame = _lz4_frame(data)
    asked = _count_lz4_requests(monkeypatch)
    assert compression.decompress(COMPRESSION_LZ4, frame, 64 << 20) == data
    assert len(asked) <= 3


def test_damaged_lz4_frames_raise_a_decompression_error():
    from pykbroker.protocol import compression

    data = b"some record bytes " * 5000
    frame = _lz4_frame(data)
    with pytest.raises(compression.DecompressionError, match="lz4: truncated frame"):
        compression.decompress(COMPRESSION_LZ4, frame[:-20], len(data))
    with pytest.raises(compression.DecompressionError, match="lz4: bytes after the end of the frame"):
        compression.decompress(COMPRESSION_LZ4, frame + b"xx", len(data))
    damaged = bytearray(frame)
    damaged[4] ^= 0xFF  # the frame descriptor's flags: its header checksum no longer matches
    with pytest.raises(compression.DecompressionError, match="lz4: "):
        compression.decompress(COMPRESSION_LZ4, bytes(damaged), len(data))
    assert issubclass(compression.DecompressionError, ValueError)


def test_a_log_with_a_damaged_lz4_batch_is_not_cleaned_again(tmp_path):
    plog = four_segments(tmp_path, COMPRESSION_LZ4)
    first = plog.directory / "00000000000000000000.log"
    data = bytearray(first.read_bytes())
    data[61 + 4] ^= 0xFF  # the lz4 frame's flags, right after its magic (the cleaner reads them before the CRC)
    first.write_bytes(bytes(data))
    cleaner = make_cleaner(tmp_path, [plog])
    assert not clean_once(cleaner)
    assert ("t", 0) in cleaner._uncleanable
    assert first.read_bytes() == bytes(data)
    assert not any(name.endswith(".cleaned") for name in os.listdir(plog.directory))


def test_a_compressed_log_cleans_to_the_latest_values_in_each_codec(tmp_path):
    for codec in (1, 2, COMPRESSION_LZ4, 4):
        plog = open_log(tmp_path, name=f"t-{codec}")
        for round_ in range(3):
            append(plog, [(f"k{i}".encode(), f"v{round_}-{i}".encode() * 50) for i in range(40)], compression=codec)
            append(plog, [(f"k{i}".encode(), f"w{round_}-{i}".encode() * 50) for i in range(0, 40, 3)],
                   compression=codec)
            plog.roll()
        append(plog, [(b"tail", b"x")])
        assert clean_once(make_cleaner(tmp_path, [plog]))
        expected = {f"k{i}".encode(): (f"w2-{i}" if i % 3 == 0 else f"v2-{i}").encode() * 50 for i in range(40)}
        expected[b"tail"] = b"x"
        assert latest(plog) == expected
        assert len(contents(plog)) == 41
        assert {h.compression for h in plog.headers() if h.record_count and h.base_offset < 162} == {codec}  # (the tail: none)


# -- record summaries from the map pass (no second decompression of batches kept whole or dropped whole) --


def _updates_log(path: Path, codec: int, **config) -> PartitionLog:
    """Batches dropped whole (every key updated later), kept whole (the last updates), partly kept, with
    tombstones; three segments and an active one."""
    plog = open_log(path, **config)
    for round_ in range(3):
        append(plog, [(f"k{i}".encode(), f"v{round_}-{i}".encode() * 30) for i in range(20)], compression=codec)
        append(plog, [(f"k{i}".encode(), None if i % 5 == 0 else f"w{round_}-{i}".encode()) for i in range(0, 20, 2)]
               + [(f"only{round_}".encode(), b"x")], compression=codec)
        plog.roll()
    append(plog, [(b"tail", b"x")])
    return plog


@pytest.mark.parametrize("accelerated", [True, False])
@pytest.mark.parametrize("codec", [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_LZ4, 4])
def test_summaries_write_the_same_segments_and_spare_the_second_decompression(tmp_path, monkeypatch, codec,
                                                                              accelerated):
    from pykbroker.log import cleaner as cleaner_module

    if not accelerated:
        monkeypatch.setattr(cleaner_module, "OffsetMap", cleaner_module._OffsetMapPy)

    written = {}
    decompressions = {}
    real = cleaner_module._records_of
    for budget in (0, cleaner_module.SUMMARY_BUDGET):
        monkeypatch.setattr(cleaner_module, "SUMMARY_BUDGET", budget)
        calls = []
        monkeypatch.setattr(cleaner_module, "_records_of", lambda header, batch: calls.append(header) or real(header, batch))
        plog = _updates_log(tmp_path / f"b{budget}", codec)
        assert clean_once(make_cleaner(tmp_path / f"b{budget}", [plog]))
        written[budget] = [(p.name, p.read_bytes()) for p in sorted(plog.directory.iterdir()) if p.suffix == ".log"]
        decompressions[budget] = len(calls)
    assert written[0] == written[cleaner_module.SUMMARY_BUDGET]
    # Six dirty batches are read by the map pass; without summaries the rewrite reads all six again, with
    # them only the three partly kept ones: the second batches of rounds 0 and 1 (only0, only1 stay) and the
    # first of round 2 (its odd keys stay). Round 0's and 1's first go whole, round 2's second stays whole.
    assert decompressions[0] == 12
    assert decompressions[cleaner_module.SUMMARY_BUDGET] == 6 + 3
    headers = [h for h in _opened[-1].headers() if h.record_count]
    assert [h.record_count for h in headers] == [1, 1, 10, 11, 1]


@pytest.mark.parametrize("accelerated", [True, False])
def test_summaries_of_one_record_batches_stay_within_the_budget(tmp_path, monkeypatch, accelerated):
    """Each summary is charged what it takes (its object, key and dict entry with its records), so many one-record
    batches, common on compacted topics, cannot take several times the budget."""
    import sys

    from pykbroker.log import cleaner as cleaner_module

    if not accelerated:
        monkeypatch.setattr(cleaner_module, "OffsetMap", cleaner_module._OffsetMapPy)
        monkeypatch.setattr(cleaner_module, "SUMMARY_RECORD_BYTES", 160)
    budget = 100_000
    monkeypatch.setattr(cleaner_module, "SUMMARY_BUDGET", budget)
    plog = open_log(tmp_path)
    for i in range(3000):
        append(plog, [(f"k{i % 50}".encode(), b"v")])
    plog.roll()
    snapshot = plog.cleanable_segments(plog.log_end_offset)
    task = clean_task(plog, snapshot, first_dirty=0, end_bound=plog.log_end_offset, map_capacity=100)
    summaries = {}
    build_offset_map(task, CleanResult(0), summaries)
    assert 100 < len(summaries) < 3000  # some batches summarised, the budget stopped the rest

    def deep(value) -> int:
        if isinstance(value, (list, tuple)):
            return sys.getsizeof(value) + sum(deep(item) for item in value)
        return sys.getsizeof(value)

    taken = sys.getsizeof(summaries) + sum(deep(key) + deep(value) for key, value in summaries.items())
    assert taken <= budget, taken


def test_a_second_cleaning_reads_the_clean_section_without_summaries_and_keeps_the_latest(tmp_path):
    plog = _updates_log(tmp_path, COMPRESSION_LZ4, min_cleanable_dirty_ratio=0.01)
    cleaner = make_cleaner(tmp_path, [plog])
    assert clean_once(cleaner)
    first = latest(plog)
    append(plog, [(b"k1", b"newest"), (b"k0", b"back")], compression=COMPRESSION_LZ4)
    plog.roll()
    append(plog, [(b"tail2", b"y")])
    assert clean_once(cleaner)
    first.update({b"k1": b"newest", b"k0": b"back", b"tail2": b"y"})
    assert latest(plog) == first


def test_the_per_thread_zstd_context_survives_failed_frames_and_is_not_shared_between_threads():
    import threading

    import zstandard

    from pykbroker.protocol import compression

    data = b"record bytes " * 2000
    frame = zstandard.ZstdCompressor().compress(data)
    for damaged in (frame[: len(frame) // 2], b"\x28\xb5\x2f\xfd" + b"\xff" * 40):  # truncated; bad header
        with pytest.raises(compression.DecompressionError, match="zstd"):
            compression.decompress(4, damaged, len(data))
        assert compression.decompress(4, frame + frame, 2 * len(data)) == data + data  # the context is reset
    contexts = [compression._thread_state.zstd]

    def other_thread():
        assert compression.decompress(4, frame, len(data)) == data
        contexts.append(compression._thread_state.zstd)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert len(contexts) == 2 and contexts[0] is not contexts[1]


def test_a_zstd_frame_with_a_large_window_does_not_use_the_shared_context(monkeypatch):
    """The thread's shared context would keep a large frame window's buffer for good: such frames get their own."""
    import zstandard

    from pykbroker.protocol import compression

    small = zstandard.ZstdCompressor().compress(b"small " * 100)
    assert compression.decompress(4, small, 1000) == b"small " * 100
    shared = compression._thread_state.zstd
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=26, write_content_size=False)
    streamed = zstandard.ZstdCompressor(compression_params=params).compressobj()
    data = b"big window " * 1000
    big = streamed.compress(data) + streamed.flush()
    assert zstandard.get_frame_parameters(big).window_size == 1 << 26
    used = []
    real = type(shared).decompressobj
    monkeypatch.setattr(type(shared), "decompressobj", lambda self, *a, **k: used.append(self) or real(self, *a, **k))
    assert compression.decompress(4, big, len(data)) == data
    assert used and shared not in used
    assert compression.decompress(4, small, 1000) == b"small " * 100
    assert used[-1] is shared and compression._thread_state.zstd is shared


def _blocks_as_kafkas_java_reader_reads_them(frame: bytes) -> bytes:
    """Kafka's Lz4BlockInputStream: FLG must say independent blocks; each block decompressed alone."""
    import struct

    import lz4.block

    flg = frame[4]
    assert flg & 0x20, "Dependent block stream is unsupported"
    pos = 4 + 2 + (8 if flg & 0x08 else 0) + 1
    out = b""
    while True:
        (size,) = struct.unpack_from("<I", frame, pos)
        pos += 4
        if size == 0:
            return out
        raw, size = size & 0x80000000, size & 0x7FFFFFFF
        block = frame[pos : pos + size]
        out += block if raw else lz4.block.decompress(block, uncompressed_size=1 << 16)
        pos += size


def test_a_rebuilt_lz4_batch_over_one_block_is_readable_by_kafkas_java_reader(tmp_path):
    plog = open_log(tmp_path, segment_bytes=8 << 20)
    values = [(f"k{i}".encode(), (f"value {i} " * 2000).encode()) for i in range(20)]  # ~300 KB, compressible
    append(plog, values + [(b"k0", b"old")], compression=COMPRESSION_LZ4)
    append(plog, [(b"k0", b"new")])
    plog.roll()
    append(plog, [(b"tail", b"x")])
    assert clean_once(make_cleaner(tmp_path, [plog]))
    header, data = next(iter(plog.batches()))
    assert header.compression == COMPRESSION_LZ4 and header.record_count == 19  # rebuilt: k0's two records went
    from pykbroker.protocol.records import BATCH_HEADER_SIZE

    records = _blocks_as_kafkas_java_reader_reads_them(bytes(data[BATCH_HEADER_SIZE:]))
    assert len(records) > 4 * (1 << 16)
    assert [(k, v) for _, k, v in contents(plog)][:19] == values[1:]

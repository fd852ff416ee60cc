"""PartitionLog: appends, reads, rolls, recovery, retention and the other queries, on real files."""

from __future__ import annotations

import errno
import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pykbroker.log.config import LogConfig
from pykbroker.log.errors import OffsetOutOfRange, RecordBatchTooLarge, RecordTooLarge, UnexpectedAppendOffset
from pykbroker.log.partition_log import PartitionLog, run_file_work
from pykbroker.replication.replica_manager import FileRecords
from pykbroker.protocol.records import (
    TIMESTAMP_TYPE_MASK,
    CorruptRecordBatch,
    InvalidRecordBatch,
    build_batch,
    crc_matches,
    iter_headers,
    read_records,
    validate_batches,
)

SMALL = LogConfig(segment_bytes=1024, index_interval_bytes=128)
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def batch(values: list[bytes], ts: int = 1_000) -> bytearray:
    return build_batch([(None, value) for value in values], timestamp_ms=ts)


def decode(data: bytes) -> list[tuple[int, list[bytes]]]:
    """(base offset, record values) of each batch; also checks every CRC."""
    if data:
        validate_batches(data)
    return [(header.base_offset, [record.value for record in read_records(data, header)]) for header in iter_headers(data)]


def read_all(log: PartitionLog, start: int | None = None, max_bytes: int = 1 << 30) -> list[tuple[int, list[bytes]]]:
    return decode(log.read(log.log_start_offset if start is None else start, max_bytes).read_bytes())


def open_log(root: Path, config: LogConfig = SMALL, **kwargs) -> PartitionLog:
    return PartitionLog.open(root / "topic.a-3", config, **kwargs)


def fill(log: PartitionLog, sizes: list[int], *, epoch: int = 0, ts: int = 1_000) -> list[tuple[int, list[bytes]]]:
    """Append one batch per entry of ``sizes`` (that many records); returns what the log should hold."""
    expected = []
    for number, count in enumerate(sizes):
        values = [b"b%d-r%d-" % (number, i) + b"x" * (number % 7) for i in range(count)]
        result = log.append(batch(values, ts + number), leader_epoch=epoch, now_ms=ts + number)
        expected.append((result.base_offset, values))
    return expected


# -- appends and reads ---------------------------------------------------------------------------------


def test_directory_name_gives_topic_and_partition(tmp_path):
    log = open_log(tmp_path)
    assert (log.topic, log.partition) == ("topic.a", 3)
    assert (tmp_path / "topic.a-3" / "00000000000000000000.log").exists()
    log.close()


def test_offsets_are_dense_and_returned(tmp_path):
    log = open_log(tmp_path)
    first = log.append(batch([b"a", b"b", b"c"]), leader_epoch=0, now_ms=1)
    second = log.append(batch([b"d"]) + batch([b"e", b"f"]), leader_epoch=0, now_ms=2)
    assert (first.base_offset, first.last_offset) == (0, 2)
    assert (second.base_offset, second.last_offset) == (3, 5)
    assert [(h.base_offset, h.last_offset) for h in second.headers] == [(3, 3), (4, 5)]
    assert first.log_append_time_ms == -1 and first.log_start_offset == 0
    assert log.log_end_offset == 6
    assert read_all(log) == [(0, [b"a", b"b", b"c"]), (3, [b"d"]), (4, [b"e", b"f"])]
    log.close()


@PROPERTY
@given(
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=40),
    segment_bytes=st.integers(303, 3000),  # (fill's largest batch is 303 bytes: a larger one is refused)
    interval=st.integers(0, 600),
    chunk=st.integers(1, 4000),
)
def test_append_then_read_across_rolls(sizes, segment_bytes, interval, chunk):
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=interval)
    with tempfile.TemporaryDirectory() as root:
        log = open_log(Path(root), config)
        expected = fill(log, sizes)
        offsets = [base for base, _ in expected]
        assert offsets == [sum(sizes[:i]) for i in range(len(sizes))]  # dense
        assert read_all(log) == expected
        # Reading chunk by chunk (max_bytes = chunk, min_one) walks every batch exactly once.
        seen, offset = [], 0
        while offset < log.log_end_offset:
            got = decode(log.read(offset, chunk).read_bytes())
            assert got, "min_one must always make progress"
            seen += got
            offset = got[-1][0] + len(got[-1][1])
        assert seen == expected
        # Any offset is served by the batch that contains it.
        for base, values in expected:
            for inside in range(base, base + len(values)):
                assert decode(log.read(inside, 1).read_bytes()) == [(base, values)]
        log.close()
        reopened = open_log(Path(root), config, clean_shutdown=True)
        assert reopened.log_end_offset == sum(sizes)
        assert read_all(reopened) == expected
        reopened.close()


@PROPERTY
@given(
    sizes=st.lists(st.integers(1, 8), min_size=1, max_size=40),
    segment_bytes=st.integers(309, 2500),  # (the largest batch is 309 bytes: a larger one is refused)
    interval=st.integers(0, 400),
    queries=st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 3000), st.one_of(st.none(), st.integers(0, 200)), st.booleans()),
        min_size=1,
        max_size=25,
    ),
)
def test_read_matches_a_model(sizes, segment_bytes, interval, queries):
    """read() against a plain list of batches: containing batch first, whole batches, max_bytes, upper bound,
    and the end offset (the first offset after the data, the fetch's bound for aborted transactions)."""
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=interval)
    with tempfile.TemporaryDirectory() as root:
        log = open_log(Path(root), config)
        model = []  # (base offset, last offset, size)
        for count in sizes:
            data = batch([b"r" * (count * 3)] * count)
            result = log.append(data, leader_epoch=0, now_ms=0)
            model.append((result.base_offset, result.last_offset, len(data)))
        log_end = log.log_end_offset
        for raw_offset, max_bytes, upper_bound, min_one in queries:
            offset = raw_offset % (log_end + 1)
            limit = log_end if upper_bound is None else min(upper_bound, log_end)
            expected, total = [], 0
            for base, last, size in model:
                if last < offset:
                    continue
                if last >= limit or not ((min_one and not expected) or total + size <= max_bytes):
                    break
                expected.append(base)
                total += size
                next_offset = last + 1
            result = log.read(offset, max_bytes, upper_bound=upper_bound, min_one=min_one)
            assert [h.base_offset for h in iter_headers(result.read_bytes())] == expected
            assert result.size == total
            if expected:  # offsets are dense here: what was read ends right before the end offset
                assert result.end_offset == next_offset
        log.close()


def test_rolls_create_kafka_named_segments(tmp_path):
    log = open_log(tmp_path)
    fill(log, [5] * 30)
    bases = log.segment_base_offsets
    assert len(bases) > 2 and bases[0] == 0
    names = sorted(p.name for p in log.directory.iterdir() if p.suffix == ".log")
    assert names == [f"{base:020d}.log" for base in bases]
    for base in bases:
        assert os.path.getsize(log.directory / f"{base:020d}.log") <= SMALL.segment_bytes
    log.close()


def test_read_from_inside_a_batch_returns_the_whole_batch(tmp_path):
    log = open_log(tmp_path)
    log.append(batch([b"a", b"b"]), leader_epoch=0, now_ms=1)
    log.append(batch([b"c", b"d", b"e"]), leader_epoch=0, now_ms=1)
    assert read_all(log, start=3) == [(2, [b"c", b"d", b"e"])]
    assert read_all(log, start=1) == [(0, [b"a", b"b"]), (2, [b"c", b"d", b"e"])]
    log.close()


def test_max_bytes_min_one_and_upper_bound(tmp_path):
    log = open_log(tmp_path, LogConfig())
    for i in range(5):
        log.append(batch([b"%d" % i] * 2), leader_epoch=0, now_ms=1)  # offsets 2i, 2i+1
    one = len(batch([b"0"] * 2))
    assert decode(log.read(0, one * 2).read_bytes()) == [(0, [b"0"] * 2), (2, [b"1"] * 2)]
    assert decode(log.read(0, one * 2 + one - 1).read_bytes()) == [(0, [b"0"] * 2), (2, [b"1"] * 2)]
    # The first batch is returned whole even when larger than max_bytes, unless min_one is off.
    assert decode(log.read(4, 1).read_bytes()) == [(4, [b"2"] * 2)]
    assert log.read(4, 1, min_one=False).slices == []
    assert log.read(4, 1).size == one
    # upper_bound (the high-water mark) is exclusive and never splits a batch.
    assert [base for base, _ in decode(log.read(0, 1 << 20, upper_bound=6).read_bytes())] == [0, 2, 4]
    assert [base for base, _ in decode(log.read(0, 1 << 20, upper_bound=5).read_bytes())] == [0, 2]
    assert log.read(6, 1 << 20, upper_bound=6).slices == []
    assert log.read(10, 1 << 20).slices == []  # at the log end: nothing yet, not an error
    log.close()


def test_read_slices_end_at_batch_boundaries_and_span_segments(tmp_path):
    log = open_log(tmp_path)
    expected = fill(log, [3] * 20)
    result = log.read(0, 1 << 20)
    assert len(result.slices) == len(log.segment_base_offsets)
    for piece in result.slices:
        data = os.pread(piece.fd, piece.length, piece.position)
        assert sum(h.size for h in iter_headers(data)) == piece.length
    assert decode(result.read_bytes()) == expected
    log.close()


def test_offset_out_of_range(tmp_path):
    log = open_log(tmp_path)
    fill(log, [2, 2])
    with pytest.raises(OffsetOutOfRange):
        log.read(5, 100)
    with pytest.raises(OffsetOutOfRange):
        log.read(-1, 100)
    log.delete_records_before(2)
    with pytest.raises(OffsetOutOfRange) as info:
        log.read(1, 100)
    assert (info.value.log_start_offset, info.value.log_end_offset) == (2, 4)
    log.close()


def test_corrupt_input_batch_raises_and_appends_nothing(tmp_path):
    log = open_log(tmp_path)
    fill(log, [2])
    size_before = log.size_bytes
    good, bad = batch([b"fine"]), batch([b"flipped"])
    bad[-2] ^= 0xFF
    with pytest.raises(CorruptRecordBatch):
        log.append(good + bad, leader_epoch=0, now_ms=1)
    not_v2 = batch([b"x"])
    not_v2[16] = 1  # magic
    with pytest.raises(InvalidRecordBatch):
        log.append(not_v2, leader_epoch=0, now_ms=1)
    assert (log.log_end_offset, log.size_bytes) == (2, size_before)
    assert len(read_all(log)) == 1
    log.close()


def test_record_too_large(tmp_path):
    log = open_log(tmp_path, LogConfig(max_message_bytes=100))
    with pytest.raises(RecordTooLarge):
        log.append(batch([b"x" * 100]), leader_epoch=0, now_ms=1)
    assert log.log_end_offset == 0 and log.size_bytes == 0
    log.close()


def test_an_append_larger_than_segment_bytes_is_refused_before_anything_is_written(tmp_path):
    """Kafka's UnifiedLog.append: records larger than segment.bytes could fit no segment, RecordBatchTooLarge
    (RECORD_LIST_TOO_LARGE) before maybeRoll; the whole append counts, not each batch."""
    one = batch([b"x" * 40])
    log = open_log(tmp_path, LogConfig(segment_bytes=len(one) + 10))
    log.append(batch([b"x" * 40]), leader_epoch=0, now_ms=1)
    with pytest.raises(RecordBatchTooLarge, match=rf"Message batch size is {2 * len(one)} bytes in append to "
                       rf"partition topic.a-3, which exceeds the maximum configured segment size of {len(one) + 10}"):
        log.append(batch([b"x" * 40]) + batch([b"x" * 40]), leader_epoch=0, now_ms=1)
    with pytest.raises(RecordBatchTooLarge):
        log.append(batch([b"x" * 60]), leader_epoch=0, now_ms=1)
    assert (log.log_end_offset, log.segment_base_offsets, log.size_bytes) == (1, [0], len(one))
    log.append(batch([b"x" * 40]), leader_epoch=0, now_ms=1)  # one batch that fits: a new segment
    assert log.segment_base_offsets == [0, 1]
    log.close()


def test_a_follower_writes_a_fetch_larger_than_segment_bytes_in_runs_that_each_fit_a_segment(tmp_path):
    """Kafka's leader answers a fetch from one segment, so its follower never gets more than segment.bytes
    at once; a read here spans segments, so the follower writes such a fetch in runs of whole batches, each
    within segment.bytes, and its segments stay as small as the leader's. A single batch larger than
    segment.bytes (the leader's segment.bytes was larger when it took it) is refused, nothing written."""
    one = batch([b"x" * 40])
    config = LogConfig(segment_bytes=2 * len(one) + 10)
    leader = PartitionLog.open(tmp_path / "leader" / "t-0", config)
    for _ in range(7):
        leader.append(batch([b"x" * 40]), leader_epoch=0, now_ms=1)
    assert leader.segment_base_offsets == [0, 2, 4, 6]
    fetched = leader.read(0, 1 << 20).read_bytes()
    assert len(fetched) == 7 * len(one) > config.segment_bytes
    follower = PartitionLog.open(tmp_path / "follower" / "t-0", config)
    result = follower.append_as_follower(fetched, now_ms=1)
    assert (result.base_offset, result.last_offset, [h.position for h in result.headers]) == \
        (0, 6, [len(one) * i for i in range(7)])
    assert follower.segment_base_offsets == [0, 2, 4, 6]
    assert all(segment.size <= config.segment_bytes for segment in follower.segments_view())
    assert read_all(follower) == read_all(leader)
    smaller = PartitionLog.open(tmp_path / "smaller" / "t-0", LogConfig(segment_bytes=len(one) - 1))
    with pytest.raises(RecordBatchTooLarge):
        smaller.append_as_follower(fetched, now_ms=1)
    assert (smaller.log_end_offset, smaller.size_bytes) == (0, 0)
    for log in (leader, follower, smaller):
        log.close()


def test_log_append_time_rewrites_timestamp_with_valid_crc(tmp_path):
    log = open_log(tmp_path, LogConfig(message_timestamp_type="LogAppendTime"))
    result = log.append(batch([b"a", b"b"], ts=1_000), leader_epoch=0, now_ms=55_555)
    assert result.log_append_time_ms == 55_555
    data = log.read(0, 1 << 20).read_bytes()
    (header,) = validate_batches(data)  # raises if the CRC were stale
    assert crc_matches(data, header)
    assert header.attributes & TIMESTAMP_TYPE_MASK and header.max_timestamp == 55_555
    assert log.max_timestamp_and_offset() == (55_555, 1)
    log.close()


def test_partition_leader_epoch_is_stamped(tmp_path):
    log = open_log(tmp_path)
    log.append(batch([b"a"]), leader_epoch=7, now_ms=1)
    (header,) = iter_headers(log.read(0, 100).read_bytes())
    assert header.partition_leader_epoch == 7
    log.close()


def test_batches_iterates_from_an_offset(tmp_path):
    log = open_log(tmp_path)
    expected = fill(log, [2] * 25)
    got = [(h.base_offset, [r.value for r in read_records(data, h)]) for h, data in log.batches(11)]
    assert got == expected[5:]
    assert [h.position for h, _ in log.batches()] == [0] * 25
    assert [h.base_offset for h in log.headers(11)] == [base for base, _ in expected[5:]]
    assert [h._replace(position=0) for h in log.headers()] == [h for h, _ in log.batches()]
    log.close()


def test_index_entries_are_kafka_compatible(tmp_path):
    """Each .index entry points at a batch start and holds that batch's last offset, as Kafka writes it."""
    log = open_log(tmp_path, LogConfig(index_interval_bytes=100))
    fill(log, [3] * 40)
    log.close()
    directory = tmp_path / "topic.a-3"
    data = (directory / "00000000000000000000.log").read_bytes()
    last_offset_at = {h.position: h.last_offset for h in iter_headers(data)}
    entries = list(struct.iter_unpack(">ii", (directory / "00000000000000000000.index").read_bytes()))
    assert len(entries) > 10
    assert all(last_offset_at[position] == relative for relative, position in entries)
    times = list(struct.iter_unpack(">qi", (directory / "00000000000000000000.timeindex").read_bytes()))
    assert times[-1] == (1_000 + 39, 119)  # the final entry: max timestamp and its batch's last offset


# -- time and epoch queries ----------------------------------------------------------------------------


@PROPERTY
@given(
    timestamps=st.lists(st.integers(0, 50), min_size=1, max_size=30),
    target=st.integers(-1, 52),
    interval=st.integers(0, 200),
)
def test_offset_for_timestamp_matches_a_scan(timestamps, target, interval):
    config = LogConfig(segment_bytes=500, index_interval_bytes=interval)
    with tempfile.TemporaryDirectory() as root:
        log = open_log(Path(root), config)
        bases = [log.append(batch([b"v", b"w"], ts), leader_epoch=0, now_ms=0).base_offset for ts in timestamps]
        expected = next(((ts, base) for ts, base in zip(timestamps, bases) if ts >= target), None)
        assert log.offset_for_timestamp(target) == expected
        top = max(timestamps)
        assert log.max_timestamp_and_offset() == (top, bases[timestamps.index(top)] + 1)
        log.close()
        reopened = open_log(Path(root), config, clean_shutdown=True)
        assert reopened.offset_for_timestamp(target) == expected
        reopened.close()


def test_empty_log_queries(tmp_path):
    log = open_log(tmp_path)
    assert log.offset_for_timestamp(0) is None
    assert log.max_timestamp_and_offset() == (-1, -1)
    assert log.end_offset_for_epoch(0) == (-1, -1)
    assert log.latest_epoch == -1
    assert log.read(0, 100).slices == []
    log.close()


def test_leader_epoch_end_offsets(tmp_path):
    log = open_log(tmp_path)
    fill(log, [2, 2], epoch=2)  # offsets 0-3
    fill(log, [3], epoch=4)  # 4-6
    fill(log, [1], epoch=7)  # 7
    assert log.leader_epochs == [(2, 0), (4, 4), (7, 7)]
    assert log.latest_epoch == 7
    assert log.end_offset_for_epoch(2) == (2, 4)
    assert log.end_offset_for_epoch(3) == (2, 4)  # unknown epoch: the largest one below it
    assert log.end_offset_for_epoch(4) == (4, 7)
    assert log.end_offset_for_epoch(7) == (7, 8)  # the latest epoch ends at the log end
    assert log.end_offset_for_epoch(9) == (-1, -1)
    assert log.end_offset_for_epoch(1) == (1, 0)  # older than all cached: Kafka answers the first start
    assert log.epoch_for_offset(5) == 4
    assert (log.directory / "leader-epoch-checkpoint").read_text() == "0\n3\n2 0\n4 4\n7 7\n"
    log.close()
    reopened = open_log(tmp_path, clean_shutdown=True)
    assert reopened.leader_epochs == [(2, 0), (4, 4), (7, 7)]
    reopened.close()


def test_missing_epoch_checkpoint_is_rebuilt_from_batches(tmp_path):
    log = open_log(tmp_path)
    fill(log, [2] * 10, epoch=1)
    fill(log, [2] * 10, epoch=3)
    log.close()
    (tmp_path / "topic.a-3" / "leader-epoch-checkpoint").unlink()
    reopened = open_log(tmp_path, clean_shutdown=True)
    assert reopened.leader_epochs == [(1, 0), (3, 20)]
    reopened.close()


# -- recovery ------------------------------------------------------------------------------------------


@PROPERTY
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=30), cut=st.floats(0, 1))
def test_recovery_after_a_torn_tail_keeps_a_prefix(sizes, cut):
    with tempfile.TemporaryDirectory() as root:
        log = open_log(Path(root))
        expected = fill(log, sizes)
        log.close()
        directory = Path(root) / "topic.a-3"
        last = directory / f"{log.segment_base_offsets[-1]:020d}.log"
        length = os.path.getsize(last)
        os.truncate(last, int(length * cut))
        recovered = open_log(Path(root))  # unclean: no clean-shutdown flag, recovery point 0
        got = read_all(recovered)
        assert got == expected[: len(got)]
        survivors = len(expected) - len([b for b in expected if b[0] >= log.segment_base_offsets[-1]])
        assert len(got) >= survivors  # only the cut segment lost data
        assert recovered.log_end_offset == (got[-1][0] + len(got[-1][1]) if got else 0)
        # The log keeps working: new appends continue densely after what survived.
        result = recovered.append(batch([b"after"]), leader_epoch=0, now_ms=1)
        assert result.base_offset == recovered.log_end_offset - 1 == (got[-1][0] + len(got[-1][1]) if got else 0)
        assert read_all(recovered) == got + [(result.base_offset, [b"after"])]
        recovered.close()


def test_corrupt_crc_in_the_tail_is_truncated(tmp_path, caplog):
    log = open_log(tmp_path, LogConfig())
    expected = fill(log, [2] * 6)
    log.close()
    path = tmp_path / "topic.a-3" / "00000000000000000000.log"
    data = bytearray(path.read_bytes())
    fourth = list(iter_headers(data))[3]
    data[fourth.position + fourth.size - 1] ^= 0x55
    path.write_bytes(data)
    caplog.set_level("WARNING", logger="pykbroker.log.partition_log")
    recovered = open_log(tmp_path, LogConfig())
    assert read_all(recovered) == expected[:3]
    assert recovered.log_end_offset == 6
    assert os.path.getsize(path) == fourth.position
    # The cut is not silent: partition, offsets, bytes and the reason, in one WARN.
    cut = len(data) - fourth.position
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"topic.a-3: recovery truncated the log to end offset 6, cutting offsets 6-11, {cut} bytes: "
        f"CRC mismatch in the batch of offsets 6-7 at byte {fourth.position} of 00000000000000000000.log"
    ]
    recovered.close()


def test_recovery_point_limits_the_scan_and_later_segments_go_after_corruption(tmp_path, caplog):
    log = open_log(tmp_path)
    expected = fill(log, [4] * 30)
    bases = log.segment_base_offsets
    log.close()
    directory = tmp_path / "topic.a-3"
    # Corrupt a batch in the second segment: with recovery point inside it, it and all later data go.
    second = directory / f"{bases[1]:020d}.log"
    data = bytearray(second.read_bytes())
    data[-3] ^= 0xFF  # last batch of the second segment
    second.write_bytes(data)
    recovered = open_log(tmp_path, recovery_point=bases[1] + 1)
    got = read_all(recovered)
    assert got == expected[: len(got)]
    assert recovered.segment_base_offsets == bases[:2]
    assert got[-1][0] < bases[2]
    end = got[-1][0] + len(got[-1][1])
    warning = next(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert warning.startswith(f"topic.a-3: recovery truncated the log to end offset {end}, cutting offsets {end}-119, ")
    assert f"; {len(bases) - 2} later segment(s) (" in warning
    recovered.close()


def test_deleted_indexes_are_rebuilt_identically(tmp_path):
    log = open_log(tmp_path)
    expected = fill(log, [3] * 40)
    bases = log.segment_base_offsets
    log.close()
    directory = tmp_path / "topic.a-3"
    originals = {p.name: p.read_bytes() for p in directory.iterdir() if p.suffix in (".index", ".timeindex")}
    for name in originals:
        (directory / name).unlink()
    (directory / f"{bases[1]:020d}.index").write_bytes(b"\x00" * 5)  # torn, not merely missing
    reopened = open_log(tmp_path, clean_shutdown=True)
    assert read_all(reopened) == expected
    for base, values in expected:
        assert decode(reopened.read(base + 1, 1).read_bytes())[0][0] == base
    assert reopened.offset_for_timestamp(1_020) == (1_020, expected[20][0])
    reopened.flush()
    rebuilt = {name: (directory / name).read_bytes() for name in originals}
    assert rebuilt == originals
    reopened.close()


def test_reopen_after_clean_close_keeps_offsets_and_appends_continue(tmp_path):
    log = open_log(tmp_path)
    expected = fill(log, [3] * 12)
    end = log.log_end_offset
    log.close()
    reopened = open_log(tmp_path, clean_shutdown=True, recovery_point=end)
    assert (reopened.log_start_offset, reopened.log_end_offset, reopened.recovery_point) == (0, end, end)
    more = reopened.append(batch([b"z"]), leader_epoch=1, now_ms=1)
    assert more.base_offset == end
    assert read_all(reopened) == expected + [(end, [b"z"])]
    reopened.close()


# -- truncation, follower appends, deletion and retention ----------------------------------------------


def test_truncate_to_drops_the_tail_and_epochs(tmp_path):
    log = open_log(tmp_path)
    expected = fill(log, [3] * 10, epoch=1)
    fill(log, [3] * 10, epoch=2)
    log.truncate_to(15)  # a batch boundary in epoch 1
    assert log.log_end_offset == 15
    assert read_all(log) == expected[:5]
    assert log.leader_epochs == [(1, 0)]
    log.truncate_to(13)  # inside the batch 12-14: the whole batch goes, as in Kafka
    assert log.log_end_offset == 13
    assert read_all(log) == expected[:4]
    assert log.append(batch([b"new"]), leader_epoch=3, now_ms=1).base_offset == 13
    log.close()
    reopened = open_log(tmp_path, clean_shutdown=True)
    assert read_all(reopened) == expected[:4] + [(13, [b"new"])]
    reopened.close()


def test_truncate_below_the_first_segment_starts_over(tmp_path):
    log = open_log(tmp_path)
    fill(log, [3] * 10)
    log.delete_records_before(29)
    log.apply_retention(0)
    first_base = log.segment_base_offsets[0]
    assert first_base > 0
    log.truncate_to(first_base - 1)
    assert (log.log_start_offset, log.log_end_offset, log.segment_base_offsets) == (first_base - 1,) * 2 + ([first_base - 1],)
    assert log.append(batch([b"x"]), leader_epoch=0, now_ms=1).base_offset == first_base - 1
    log.close()


def test_follower_append_keeps_offsets_and_epochs(tmp_path):
    leader = PartitionLog.open(tmp_path / "leader" / "t-0", SMALL)
    expected = fill(leader, [2] * 10, epoch=5)
    follower = PartitionLog.open(tmp_path / "follower" / "t-0", SMALL)
    for _, data in leader.batches():
        follower.append_as_follower(data)
    assert read_all(follower) == expected
    assert follower.leader_epochs == [(5, 0)]
    _, first = next(leader.batches())
    with pytest.raises(UnexpectedAppendOffset):
        follower.append_as_follower(first)
    leader.close()
    follower.close()


def test_delete_records_before_moves_log_start(tmp_path):
    log = open_log(tmp_path)
    expected = fill(log, [2] * 30)
    log.delete_records_before(21)
    assert log.log_start_offset == 21
    assert log.segment_base_offsets[0] <= 21  # the segment holding 21 stays
    assert read_all(log)[0] == expected[10]  # the batch 20-21 holds the start
    with pytest.raises(OffsetOutOfRange):
        log.delete_records_before(61)
    log.close()


def test_retention_by_time_moves_log_start(tmp_path):
    config = LogConfig(segment_bytes=1024, index_interval_bytes=128, retention_ms=1_000)
    log = open_log(tmp_path, config)
    fill(log, [3] * 20, ts=10_000)  # offsets 0-59, timestamps 10_000 .. 10_019
    recent = fill(log, [3] * 20, ts=50_000)  # offsets 60-119
    bases = log.segment_base_offsets
    deleted = log.apply_retention(now_ms=50_500)
    assert deleted > 0
    assert log.segment_base_offsets == bases[deleted:]
    assert log.log_start_offset == log.segment_base_offsets[0] > 0
    # Exactly the segments holding only old data went: the first survivor reaches recent data.
    assert bases[deleted] <= 60 < bases[deleted + 1]
    assert read_all(log)[-len(recent) :] == recent
    with pytest.raises(OffsetOutOfRange):
        log.read(0, 100)
    assert not (tmp_path / "topic.a-3" / "00000000000000000000.log").exists()
    assert log.apply_retention(now_ms=50_500) == 0
    remaining = len(log.segment_base_offsets)
    # Every segment expired, the active one too: Kafka's deleteSegments rolls a new one at the log end first.
    assert log.apply_retention(now_ms=10**9) == remaining
    assert log.log_start_offset == log.log_end_offset == 120 and log.segment_base_offsets == [120]
    assert log.apply_retention(now_ms=10**9) == 0  # an empty active segment is never deleted
    assert log.append(batch([b"after"]), leader_epoch=0, now_ms=10**9).base_offset == 120
    log.close()


def test_retention_deletes_the_expired_active_segment_only_once_the_high_watermark_reaches_the_log_end(tmp_path):
    log = open_log(tmp_path, LogConfig(retention_ms=1_000))
    fill(log, [2] * 3, ts=0)  # one segment, offsets 0-5
    assert log.apply_retention(10**9, high_watermark=5) == 0
    assert log.segment_base_offsets == [0] and log.log_start_offset == 0
    assert log.apply_retention(10**9, high_watermark=6) == 1
    assert (log.segment_base_offsets, log.log_start_offset, log.log_end_offset) == ([6], 6, 6)
    assert not (tmp_path / "topic.a-3" / "00000000000000000000.log").exists()
    log.close()
    reopened = open_log(tmp_path, LogConfig(retention_ms=1_000), clean_shutdown=True)
    assert (reopened.segment_base_offsets, reopened.log_end_offset) == ([6], 6)
    reopened.close()


def test_retention_by_size_and_high_watermark(tmp_path):
    config = LogConfig(segment_bytes=1024, index_interval_bytes=128, retention_bytes=2048, retention_ms=-1)
    log = open_log(tmp_path, config)
    fill(log, [3] * 60)
    segments = len(log.segment_base_offsets)
    assert log.apply_retention(0, high_watermark=0) == 0  # nothing below the high-water mark yet
    deleted = log.apply_retention(0)
    assert deleted == segments - 3  # whole segments go while the rest still exceeds 2048 bytes
    assert log.size_bytes > 2048 - 1024
    assert log.log_start_offset == log.segment_base_offsets[0]
    log.close()


def test_retention_by_size_runs_before_retention_by_time(tmp_path):
    """Kafka's deleteOldSegments: log start, then retention.bytes, then retention.ms. Segment ages need not
    grow: a recent first segment stops the time rule at once, so only the size rule, going first, lets the
    time rule reach the expired segment behind it in the same pass."""
    log = open_log(tmp_path, LogConfig(retention_ms=1_000))
    for ts in (50_000, 10_000, 50_000):  # recent, expired, recent; then an empty active segment
        log.append(batch([b"v"], ts=ts), leader_epoch=0, now_ms=ts)
        log.roll()
    first = log.segments_view()[0].size
    log.config = LogConfig(retention_ms=1_000, retention_bytes=log.size_bytes - first)  # the first one too many
    assert log.apply_retention(now_ms=50_500) == 2
    assert log.segment_base_offsets == [2, 3] and log.log_start_offset == 2
    log.close()


def _open_files_under(directory: Path) -> int:
    """This process's descriptors on files that are, or were before being unlinked, under ``directory``."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{name}").startswith(str(directory) + "/")
        except OSError:  # the listing's own descriptor, gone already
            pass
    return count


def test_deleted_segment_stays_readable_for_a_fetch_in_flight_and_closes_when_the_fetch_lets_go(tmp_path):
    # Pins, not a file.delete.delay.ms timer, keep in-flight reads working.
    config = LogConfig(segment_bytes=1024, index_interval_bytes=128, retention_ms=0)
    log = open_log(tmp_path, config)
    expected = fill(log, [3] * 20, ts=0)
    in_flight = log.read(0, 1 << 20)
    pinned = len(in_flight.slices)
    assert pinned > 1
    assert log.apply_retention(now_ms=10**9) > 0
    assert not (tmp_path / "topic.a-3" / "00000000000000000000.log").exists()
    assert decode(in_flight.read_bytes()) == expected
    files = FileRecords(in_flight)
    assert b"".join(files.chunks(7)) == in_flight.read_bytes()  # one pread walk serves both
    # Deleted segments' descriptors are held by the slices only, then closed when they go.
    assert _open_files_under(tmp_path) <= pinned + 1  # + the active segment
    del in_flight, files
    assert _open_files_under(tmp_path) <= 1
    log.close()
    assert _open_files_under(tmp_path) == 0


def test_a_file_slice_always_holds_its_pin(tmp_path):
    log = open_log(tmp_path, SMALL)
    fill(log, [3])
    (piece,) = log.read(0, 1 << 20).slices
    assert piece.fd == piece.pin.fd >= 0
    with pytest.raises(TypeError):
        type(piece)(piece.path, 0, 10)  # no descriptor, no pin: nothing could read it
    log.close()


def test_an_append_rolls_by_segment_ms_counted_in_record_timestamps(tmp_path):
    """Kafka's LogSegment.shouldRoll: segment.ms runs from the first batch's timestamp to the appended
    batch's largest timestamp; the wall clock does not count while the records carry timestamps."""
    config = LogConfig(segment_ms=1_000)
    log = open_log(tmp_path, config)
    log.append(batch([b"a"], ts=10_000), leader_epoch=0, now_ms=10_000)
    log.append(batch([b"b"], ts=11_000), leader_epoch=0, now_ms=99_999)  # 1000 ms of record time: not more
    assert log.segment_base_offsets == [0]
    log.append(batch([b"c"], ts=11_001), leader_epoch=0, now_ms=11_001)
    assert log.segment_base_offsets == [0, 2]  # the append that found segment.ms exceeded went to a new segment
    log.append(batch([b"d"], ts=5_000), leader_epoch=0, now_ms=10**9)  # older records: no roll
    log.append(batch([b"e"], ts=12_001), leader_epoch=0, now_ms=10**9)
    assert log.segment_base_offsets == [0, 2]
    # The largest timestamp of an append decides, wherever it is in the append.
    log.append(batch([b"f"], ts=12_002) + batch([b"g"], ts=11_100), leader_epoch=0, now_ms=0)
    assert log.segment_base_offsets == [0, 2, 5]
    log.close()
    # After a restart the clock is the first batch's timestamp, not the time of the load.
    reopened = open_log(tmp_path, config, clean_shutdown=True)
    reopened.append(batch([b"h"], ts=13_002), leader_epoch=0, now_ms=13_002)
    assert reopened.segment_base_offsets == [0, 2, 5]
    reopened.append(batch([b"i"], ts=13_003), leader_epoch=0, now_ms=13_003)
    assert reopened.segment_base_offsets == [0, 2, 5, 8]
    reopened.close()


def test_a_compacted_topic_rolls_by_max_compaction_lag_ms_when_lower_than_segment_ms(tmp_path):
    """Kafka's LogConfig.maxSegmentMs: min(max.compaction.lag.ms, segment.ms) on a compacted topic, so
    the active segment becomes cleanable within max.compaction.lag.ms; segment.ms alone otherwise."""
    compacted = LogConfig(cleanup_policy="compact", max_compaction_lag_ms=1_000)
    log = open_log(tmp_path, compacted)
    log.append(build_batch([(b"k", b"a")], timestamp_ms=10_000), leader_epoch=0, now_ms=10_000)
    log.append(build_batch([(b"k", b"b")], timestamp_ms=11_000), leader_epoch=0, now_ms=11_000)
    log.append(build_batch([(b"k", b"c")], timestamp_ms=12_000), leader_epoch=0, now_ms=12_000)
    assert log.segment_base_offsets == [0, 2]
    log.close()
    assert compacted.max_segment_ms == 1_000
    assert LogConfig(cleanup_policy="compact", max_compaction_lag_ms=5_000, segment_ms=2_000).max_segment_ms == 2_000
    assert LogConfig(cleanup_policy="delete", max_compaction_lag_ms=1_000, segment_ms=2_000).max_segment_ms == 2_000
    assert LogConfig(cleanup_policy="compact", max_compaction_lag_ms=0, segment_ms=2_000).max_segment_ms == 2_000
    deleting = open_log(tmp_path / "delete", LogConfig(max_compaction_lag_ms=1_000))
    deleting.append(batch([b"a"], ts=10_000), leader_epoch=0, now_ms=10_000)
    deleting.append(batch([b"b"], ts=12_000), leader_epoch=0, now_ms=12_000)
    assert deleting.segment_base_offsets == [0]  # not compacted: max.compaction.lag.ms plays no part
    deleting.close()


def test_log_append_time_rolls_by_the_append_time(tmp_path):
    log = open_log(tmp_path, LogConfig(segment_ms=1_000, message_timestamp_type="LogAppendTime"))
    log.append(batch([b"a"], ts=0), leader_epoch=0, now_ms=10_000)
    log.append(batch([b"b"], ts=0), leader_epoch=0, now_ms=11_000)
    assert log.segment_base_offsets == [0]
    log.append(batch([b"c"], ts=0), leader_epoch=0, now_ms=11_001)
    assert log.segment_base_offsets == [0, 2]
    log.close()


def test_a_first_batch_without_timestamp_rolls_by_the_time_since_the_segment_was_created(tmp_path):
    log = open_log(tmp_path, LogConfig(segment_ms=1_000))
    created = log.segments_view()[-1].created_ms
    log.append_as_follower(batch([b"a"], ts=-1), now_ms=created + 10)
    log.append_as_follower(_at_offset(batch([b"b"], ts=50_000), 1), now_ms=created + 1_000)
    assert log.segment_base_offsets == [0]
    log.append_as_follower(_at_offset(batch([b"c"], ts=-1), 2), now_ms=created + 1_001)
    assert log.segment_base_offsets == [0, 2]
    log.close()


def _at_offset(data: bytearray, base_offset: int) -> bytearray:
    """A batch as a leader would have written it at ``base_offset`` (the header's base offset set; no CRC change)."""
    data[0:8] = base_offset.to_bytes(8, "big")
    return data


def test_segment_jitter_ms_makes_each_segment_roll_up_to_that_much_earlier(tmp_path, monkeypatch):
    """Kafka's randomSegmentJitter: each segment draws its jitter in [0, min(segment.jitter.ms, segment.ms))
    when it is opened, and rolls at segment.ms less it."""
    draws = []
    monkeypatch.setattr("random.randrange", lambda stop: draws.append(stop) or 300)
    config = LogConfig(segment_ms=1_000, segment_jitter_ms=600)
    log = open_log(tmp_path, config)
    assert draws == [600] and log.segments_view()[-1].roll_jitter_ms == 300
    log.append(batch([b"a"], ts=10_000), leader_epoch=0, now_ms=0)
    log.append(batch([b"b"], ts=10_700), leader_epoch=0, now_ms=0)
    assert log.segment_base_offsets == [0]
    log.append(batch([b"c"], ts=10_701), leader_epoch=0, now_ms=0)
    assert log.segment_base_offsets == [0, 2] and draws == [600, 600]
    log.close()
    assert LogConfig(segment_ms=1_000, segment_jitter_ms=5_000).random_segment_jitter() == 300
    assert draws[-1] == 1_000  # never more than segment.ms
    assert LogConfig(segment_ms=1_000).random_segment_jitter() == 0 and len(draws) == 3
    assert LogConfig.from_topic_configs({"segment.jitter.ms": "600", "segment.ms": 1_000}) == config


def test_a_follower_rolls_as_the_leaders_batches_arrive(tmp_path):
    """Followers append through the same rule: the leader's batch timestamps decide their rolls too."""
    config = LogConfig(segment_ms=1_000)
    leader = PartitionLog.open(tmp_path / "leader" / "t-0", config)
    for i in range(6):
        leader.append(batch([b"v%d" % i], ts=10_000 + 600 * i), leader_epoch=0, now_ms=10_000 + 600 * i)
    assert leader.segment_base_offsets == [0, 2, 4]
    follower = PartitionLog.open(tmp_path / "follower" / "t-0", config)
    for _, data in leader.batches():
        follower.append_as_follower(data, now_ms=10**9)
    assert follower.segment_base_offsets == leader.segment_base_offsets
    assert read_all(follower) == read_all(leader)
    leader.close()
    follower.close()


def test_flush_advances_the_recovery_point(tmp_path):
    log = open_log(tmp_path)
    fill(log, [2] * 5)
    assert log.recovery_point == 0
    log.flush()
    assert log.recovery_point == 10
    fill(log, [1])
    log.truncate_to(4)
    assert log.recovery_point == 4
    log.close()


def test_fsync_always_policy_appends(tmp_path):
    log = open_log(tmp_path, fsync="always")
    assert fill(log, [1, 2]) == read_all(log)
    log.close()
    with pytest.raises(ValueError):
        open_log(tmp_path, fsync="sometimes")


def test_empty_active_segment_reopened_keeps_indexing(tmp_path):
    config = LogConfig(segment_ms=1_000, index_interval_bytes=64)
    log = open_log(tmp_path, config)
    log.append(batch([b"a"]), leader_epoch=0, now_ms=0)
    log.roll()
    log.close()
    reopened = open_log(tmp_path, config, clean_shutdown=True)
    assert reopened.segment_base_offsets == [0, 1]
    expected = fill(reopened, [2] * 10)
    reopened.close()
    index = (tmp_path / "topic.a-3" / "00000000000000000001.index").read_bytes()
    assert len(index) >= 8 * 5
    again = open_log(tmp_path, config, clean_shutdown=True)
    assert read_all(again, 1) == expected
    again.close()


def test_torn_active_segment_with_a_bad_index_is_cut_even_after_clean_shutdown(tmp_path):
    log = open_log(tmp_path, LogConfig(index_interval_bytes=64))
    expected = fill(log, [2] * 8)
    log.close()
    directory = tmp_path / "topic.a-3"
    with open(directory / "00000000000000000000.log", "ab") as file:
        file.write(b"\x00" * 30)  # a torn write that the marker did not know about
    (directory / "00000000000000000000.index").write_bytes(struct.pack(">iiii", 5, 300, 4, 200))
    reopened = open_log(tmp_path, LogConfig(index_interval_bytes=64), clean_shutdown=True)
    more = reopened.append(batch([b"next"]), leader_epoch=0, now_ms=1)
    assert more.base_offset == 16
    reopened.close()
    again = open_log(tmp_path, LogConfig(index_interval_bytes=64))  # unclean: verifies every batch
    assert read_all(again) == expected + [(16, [b"next"])]
    again.close()


def test_a_write_that_fails_part_way_is_cut_and_the_log_goes_on(tmp_path, monkeypatch):
    """Disk full in the middle of an append: the partial batch is cut off, nothing is assigned, and the next
    append (once space is back) lands right after the last whole batch, also as seen after a restart."""
    log = open_log(tmp_path)
    expected = fill(log, [2] * 3)
    path = tmp_path / "topic.a-3" / f"{log.segment_base_offsets[-1]:020d}.log"
    size = path.stat().st_size
    real_pwrite = os.pwrite

    def short_then_full(fd, data, offset):
        if len(data) > 40:
            return real_pwrite(fd, bytes(data[:40]), offset)  # a short write, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "pwrite", short_then_full)
        with pytest.raises(OSError):
            log.append(batch([b"does not fit"] * 3), leader_epoch=0, now_ms=1)
    assert path.stat().st_size == size
    assert log.log_end_offset == 6
    result = log.append(batch([b"after"]), leader_epoch=0, now_ms=1)
    assert result.base_offset == 6
    assert read_all(log) == expected + [(6, [b"after"])]
    log.abandon()
    reopened = open_log(tmp_path)
    assert read_all(reopened) == expected + [(6, [b"after"])]
    reopened.close()


def test_recovery_fsyncs_nothing_and_leaves_the_recovery_point_to_the_next_flush(tmp_path, monkeypatch):
    """As Kafka: loading after a crash verifies and rebuilds, but syncs nothing (thousands of small segments
    made that seconds of fsyncs before the broker could answer); the next flush syncs and moves the point."""
    log = open_log(tmp_path)
    expected = fill(log, [2] * 30)
    assert len(log.segment_base_offsets) > 1
    log.abandon()
    synced = []
    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", synced.append)
        recovered = open_log(tmp_path, recovery_point=0)
    assert len(synced) == 2  # only the leader-epoch checkpoint's atomic replace (file, directory), not per segment
    assert recovered.recovery_point == 0
    assert read_all(recovered) == expected
    recovered.flush()
    assert recovered.recovery_point == recovered.log_end_offset == 60
    recovered.close()


def test_delete_records_before_leaves_its_file_work_for_the_io_thread(tmp_path, monkeypatch):
    """DeleteRecords / a follower's new log start touch no file on the calling (event-loop) thread: the
    unlinks, closes and the leader-epoch checkpoint come back from ``take_file_work``, run in order later."""
    log = open_log(tmp_path)
    fill(log, [2] * 30, epoch=0)
    log.append(batch([b"e1"]), leader_epoch=1, now_ms=2_000)  # epochs (0, 0), (1, 60)
    directory = tmp_path / "topic.a-3"
    first = directory / "00000000000000000000.log"
    log.read(0, 1 << 20).read_bytes()  # the first segment's descriptor is open
    touched = []
    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", lambda fd: touched.append(("fsync", fd)))
        patch.setattr(os, "close", lambda fd: touched.append(("close", fd)))
        patch.setattr(Path, "unlink", lambda self, missing_ok=False: touched.append(("unlink", self)))
        log.delete_records_before(41)
    assert touched == []
    assert log.log_start_offset == 41 and log.has_file_work
    assert first.exists() and log.segment_base_offsets[0] > 0
    assert read_all(log)[0][0] == 40  # readers already see the new start
    open_before = _open_files_under(tmp_path)
    run_file_work(log.take_file_work())
    assert not log.has_file_work
    assert not first.exists()
    assert _open_files_under(tmp_path) < open_before
    assert (directory / "leader-epoch-checkpoint").read_text().split("\n")[2:4] == ["0 41", "1 60"]
    log.close()
    reopened = open_log(tmp_path, log_start_offset=41)
    assert reopened.log_start_offset == 41
    assert reopened.end_offset_for_epoch(0) == (0, 60)
    reopened.close()


def test_a_deferred_epoch_checkpoint_never_replaces_a_newer_one(tmp_path):
    log = open_log(tmp_path)
    fill(log, [2] * 10, epoch=0)
    log.delete_records_before(5)
    stale = log.take_file_work()  # the checkpoint with (0, 5), not yet written
    log.truncate_to(8)
    log.append(batch([b"e3"]), leader_epoch=3, now_ms=2_000)  # written at once: (0, 5), (3, 8)
    run_file_work(stale)
    assert (tmp_path / "topic.a-3" / "leader-epoch-checkpoint").read_text().split("\n")[2:4] == ["0 5", "3 8"]
    log.close()


def test_a_closed_log_runs_its_pending_file_work_and_abandon_closes_descriptors(tmp_path):
    log = open_log(tmp_path)
    fill(log, [2] * 30)
    log.read(0, 1 << 20).read_bytes()
    log.delete_records_before(41)
    assert log.has_file_work
    log.close()  # flushes: the pending work runs first
    assert not (tmp_path / "topic.a-3" / "00000000000000000000.log").exists()
    assert _open_files_under(tmp_path) == 0
    other = PartitionLog.open(tmp_path / "topic.b-0", SMALL)
    fill(other, [2] * 30)
    other.read(0, 1 << 20).read_bytes()
    other.delete_records_before(41)
    other.abandon()  # the directory is being deleted: descriptors close, nothing is unlinked by path
    assert (tmp_path / "topic.b-0" / "00000000000000000000.log").exists()
    assert _open_files_under(tmp_path) == 0


def test_a_segment_deleted_while_a_read_holds_it_is_closed_through_close_later(tmp_path):
    """DeleteRecords while a fetch still sends the first segment: its descriptor closes when the fetch lets
    go, and not on the releasing (event-loop) thread but through ``close_later`` (the LogManager's I/O thread)."""
    import threading

    from pykbroker.log.manager import LogManager

    log = open_log(tmp_path)
    fill(log, [2] * 30, epoch=0)
    queued = []
    log.close_later = queued.append
    in_flight = log.read(0, 1 << 20)
    log.delete_records_before(41)
    run_file_work(log.take_file_work())
    assert not (tmp_path / "topic.a-3" / "00000000000000000000.log").exists()
    assert queued == []  # still pinned: open
    del in_flight
    assert len(queued) >= 1  # handed over, not closed here: still open
    assert _open_files_under(tmp_path) >= len(queued)
    for fd in queued:
        os.close(fd)
    log.close()
    assert _open_files_under(tmp_path) == 0

    # The LogManager's logs close those descriptors in its I/O thread.
    manager = LogManager(tmp_path / "data")
    try:
        managed = manager.create("m", 0, LogConfig())
        threads = []
        real_close = os.close
        fd = os.open(tmp_path / "data", os.O_RDONLY)

        def close(fd_):
            threads.append((fd_, threading.current_thread().name))
            real_close(fd_)

        os.close = close
        try:
            managed.close_later(fd)
            manager._executor.submit(lambda: None).result(timeout=30)  # the I/O thread ran what was queued
        finally:
            os.close = real_close
        assert [name for closed, name in threads if closed == fd][0].startswith("log-flush")
    finally:
        manager.shutdown()

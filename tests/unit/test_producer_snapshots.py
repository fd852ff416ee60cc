"""Producer-state snapshots (Kafka's ``<offset>.snapshot`` files): the format, when they are written (roll,
clean shutdown), which one a start or a truncation loads (at or below the recovery point and the HWM), how
they are deleted (truncation, retention, DeleteRecords, the bound on their number), and that loading one then
replaying the log after it gives the state a replay of the whole log gives. Kafka 3.7's ProducerStateManager
(PID_SNAPSHOT_MAP_SCHEMA, writeSnapshot/readSnapshot, truncateAndReload) is the reference."""

from __future__ import annotations

import logging
import random
import struct
from pathlib import Path

import pytest

from pykbroker.log.config import LogConfig
from pykbroker.log.partition_log import MAX_SNAPSHOTS, PartitionLog
from pykbroker.log.producer_state import (
    CompletedTxn,
    CorruptSnapshot,
    ProducerStateManager,
    decode_snapshot,
)
from pykbroker.protocol.records import build_batch, crc32c, read_header
from pykbroker.replication.partition import Partition
from pykbroker.log.txn_index import ENTRY_SIZE, AbortedTxn
from test_transactions_log import T0, abort_while_the_disk_is_full, append, manager, marker, plain, restart, txn_batch

SMALL_SEGMENTS = LogConfig(segment_bytes=400)


def idem(pid: int, seq: int, count: int = 1, *, epoch: int = 0) -> bytearray:
    return build_batch([(None, b"i%d" % i) for i in range(count)], timestamp_ms=T0 + seq, producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq)


def snapshots(tmp_path: Path) -> list[int]:
    return sorted(int(p.name.removesuffix(".snapshot")) for p in (tmp_path / "t-0").glob("*.snapshot"))


def full_replay(log: PartitionLog, high_watermark: int) -> tuple[ProducerStateManager, list[AbortedTxn]]:
    """What the whole log gives: the state and the aborted transactions (the reference for every load)."""
    state = ProducerStateManager()
    aborted: list[AbortedTxn] = []

    def completed(txn: CompletedTxn, lso: int) -> None:
        if txn.is_aborted:
            aborted.append(AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset))

    state.replay_with_markers(log.headers_and_markers(log.log_start_offset), on_completed=completed,
                              stable_below=high_watermark)
    return state, aborted


def assert_same_as_full_replay(p: Partition) -> None:
    expected, aborted = full_replay(p.log, p.high_watermark)
    state = p.producer_state
    assert state.snapshot() == expected.snapshot()  # every producer's epoch, last batch, coordinator epoch, txn
    assert state.ongoing_transactions() == expected.ongoing_transactions()
    assert state.first_unstable_offset(p.high_watermark) == expected.first_unstable_offset(p.high_watermark)
    assert p.log.aborted_ranges(0, p.log.log_end_offset + 1) == aborted


# -- the file format -----------------------------------------------------------------------------------


def test_format_is_kafkas_schema_field_by_field():
    state = ProducerStateManager()
    state.update(read_header(idem(7, 2_147_483_646, 3))._replace(base_offset=10), -1)  # sequence wraps
    state.update(read_header(txn_batch(3, 2, epoch=4))._replace(base_offset=13), -1)  # open transaction
    data = state.snapshot()
    version, crc, count = struct.unpack_from(">hIi", data)
    assert (version, count) == (1, 2)
    assert crc == crc32c(data[6:])  # CRC32C of everything after the CRC field
    assert len(data) == 10 + 2 * 46
    fields = struct.unpack_from(">qhiqiqiq", data, 10)
    # producer_id, epoch, last_sequence, last_offset, offset_delta, timestamp, coordinator_epoch, txn first offset
    assert fields == (3, 4, 1, 14, 1, T0, -1, 13)
    assert struct.unpack_from(">qhiqiqiq", data, 56) == (7, 0, 0, 12, 2, T0 + 2_147_483_646, -1, -1)


def test_round_trip_keeps_dedup_epochs_and_open_transactions():
    state = ProducerStateManager()
    state.update(read_header(idem(7, 0, 2))._replace(base_offset=0), -1)
    state.update(read_header(idem(7, 2_147_483_647, 2))._replace(base_offset=2), -1)  # wraps to 0
    state.update(read_header(txn_batch(3, 2))._replace(base_offset=4), -1)
    from pykbroker.protocol.control_records import Marker, marker_batch
    ended = read_header(marker_batch(producer_id=9, producer_epoch=2, commit=False, coordinator_epoch=5,
                                     timestamp_ms=T0))._replace(base_offset=6)
    state.update(ended, -1, Marker(False, 5))  # a producer with only a marker: no batch
    restored = ProducerStateManager()
    restored.load_snapshot(state.snapshot(), 7)
    assert restored.snapshot() == state.snapshot() and restored.next_offset == 7
    duplicate = restored.check(read_header(idem(7, 2_147_483_647, 2)))
    assert (duplicate.base_offset, duplicate.last_offset, duplicate.log_append_time_ms) == (2, 3, -1)
    assert restored.entry(7).batches[-1].first_seq == 2_147_483_647
    assert restored.ongoing_transactions() == [(3, 4)] and restored.first_unstable_offset() == 4
    assert restored.entry(9).epoch == 2 and restored.entry(9).coordinator_epoch == 5
    assert not restored.entry(9).batches
    with_append_time = ProducerStateManager()
    with_append_time.load_snapshot(state.snapshot(), 7, log_append_time=True)
    assert with_append_time.check(read_header(idem(7, 2_147_483_647, 2))).log_append_time_ms == T0 + 2_147_483_647


@pytest.mark.parametrize("damage", ["crc", "truncated", "version", "short", "count"])
def test_decoding_refuses_damaged_snapshots(damage):
    state = ProducerStateManager()
    state.update(read_header(idem(7, 0))._replace(base_offset=0), -1)
    data = bytearray(state.snapshot())
    if damage == "crc":
        data[-1] ^= 1
    elif damage == "truncated":
        data = data[:-3]
    elif damage == "version":
        data[1] = 2
    elif damage == "short":
        data = data[:5]
    else:  # a count that does not match the bytes, with a CRC that does
        struct.pack_into(">i", data, 6, 2)
        struct.pack_into(">I", data, 2, crc32c(bytes(data[6:])))
    with pytest.raises(CorruptSnapshot):
        decode_snapshot(bytes(data))
    restored = ProducerStateManager()
    restored.load_snapshot(state.snapshot(), 1)
    with pytest.raises(CorruptSnapshot):
        restored.load_snapshot(bytes(data), 1)
    assert restored.entry(7) is not None  # nothing changed


KAFKA_SNAPSHOT = Path(__file__).parent / "data" / "kafka-3.7.1-snap-0"


def kafka_reads(data: bytes) -> list[tuple]:
    """What Kafka's ProducerStateManager.readSnapshot takes from a file: version 1, the CRC32C of everything
    after the CRC field, the entry array; bytes after the array are not read (the schema is not flexible)."""
    version, crc, count = struct.unpack_from(">hIi", data)
    assert version == 1 and crc == crc32c(data[6:])
    return [struct.unpack_from(">qhiqiqiq", data, 10 + 46 * i) for i in range(count)]


def test_older_batches_survive_a_snapshot_so_retries_of_them_are_duplicates():
    """Kafka's entry holds a producer's last batch only: a retry of one of the four before it, after a restart
    from a snapshot, would get OUT_OF_ORDER_SEQUENCE. pykbroker's extension keeps them."""
    state = ProducerStateManager()
    for seq in range(0, 10, 2):
        state.update(read_header(idem(7, seq, 2))._replace(base_offset=seq), -1)
    data = state.snapshot()
    assert [entry[:5] for entry in kafka_reads(data)] == [(7, 0, 9, 9, 1)]  # Kafka's view: the last batch
    restored = ProducerStateManager()
    restored.load_snapshot(data, 10)
    assert [(b.first_seq, b.last_offset) for b in restored.entry(7).batches] == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    duplicate = restored.check(read_header(idem(7, 4, 2)))
    assert duplicate is not None and (duplicate.base_offset, duplicate.last_offset) == (4, 5)
    assert restored.snapshot() == data
    one_batch = ProducerStateManager()
    one_batch.update(read_header(idem(8, 0, 2))._replace(base_offset=0), -1)
    assert len(one_batch.snapshot()) == 10 + 46  # nothing beyond Kafka's format when it holds the state whole


@pytest.mark.parametrize("damage", ["magic", "version", "short", "long"])
def test_a_damaged_extension_is_refused_with_a_valid_crc(damage):
    state = ProducerStateManager()
    for seq in range(0, 4, 2):
        state.update(read_header(idem(7, seq, 2))._replace(base_offset=seq), -1)
    data = bytearray(state.snapshot())
    extension = 10 + 46
    if damage == "magic":
        data[extension] ^= 1
    elif damage == "version":
        data[extension + 5] = 9
    elif damage == "short":
        data = data[:-3]
    else:
        data += b"\x00"
    struct.pack_into(">I", data, 2, crc32c(bytes(data[6:])))
    with pytest.raises(CorruptSnapshot):
        decode_snapshot(bytes(data))


def test_byte_exact_against_the_snapshots_kafka_wrote(tmp_path):
    """Kafka 3.7.1 wrote ``6.snapshot`` at a roll and ``8.snapshot`` at its clean shutdown after idempotent
    batches (producer 0), an aborted transaction then one left open (producer 1): a replay of its log up to each offset gives the same bytes, and loading each file gives that state."""
    directory = tmp_path / "snap-0"
    directory.mkdir()
    for segment in KAFKA_SNAPSHOT.glob("*.log"):
        (directory / segment.name).write_bytes(segment.read_bytes())
    log = PartitionLog.open(directory, LogConfig(), fsync="never")
    try:
        assert log.log_end_offset == 8
        for kafka_file in sorted(KAFKA_SNAPSHOT.glob("*.snapshot")):
            offset = int(kafka_file.name.removesuffix(".snapshot"))
            state = ProducerStateManager()
            state.replay_with_markers((h, m) for h, m in log.headers_and_markers(0) if h.base_offset < offset)
            ours, theirs = state.snapshot(), kafka_file.read_bytes()
            # Kafka's part byte for byte (the CRC also covers pykbroker's extension of older batches after it)
            assert ours[:2] + ours[6:len(theirs)] == theirs[:2] + theirs[6:]
            assert kafka_reads(ours) == kafka_reads(theirs)  # Kafka's reader takes our file as its own
            loaded = ProducerStateManager()
            loaded.load_snapshot(theirs, offset)
            assert loaded.snapshot() == theirs  # a file Kafka wrote (no extension): loaded and written back alike
            assert loaded.ongoing_transactions() == state.ongoing_transactions() == [(1, offset - 1)]
        assert (loaded.entry(1).last_seq, loaded.entry(1).coordinator_epoch) == (1, 0)  # after the abort marker
        assert loaded.entry(0).last_seq == 4 and loaded.entry(0).batches[-1].last_offset == 4
    finally:
        log.close()


# -- when they are written and used --------------------------------------------------------------------


def test_clean_restart_replays_nothing(tmp_path):
    rm = manager(tmp_path, SMALL_SEGMENTS)
    p = rm.host("t", 0, 0)
    for seq in range(40):
        append(rm, idem(seq % 3, seq // 3))
    append(rm, txn_batch(5, 2))  # left open
    assert len(p.log.segment_base_offsets) > 3
    assert p.log.producer_state_replayed == 0
    rm = restart(rm, tmp_path, SMALL_SEGMENTS)
    p = rm.partition("t", 0)
    assert p.log.log_end_offset in snapshots(tmp_path)  # the shutdown's
    assert p.log.producer_state_replayed == 0
    assert_same_as_full_replay(p)
    assert p.last_stable_offset == 40
    assert append(rm, idem(0, 13)).base_offset == 39  # a retry of producer 0's last batch: deduplicated
    assert append(rm, idem(0, 14)).base_offset == 42


def test_restart_after_a_crash_replays_from_the_newest_snapshot_at_or_below_the_recovery_point(tmp_path):
    rm = manager(tmp_path, SMALL_SEGMENTS)
    p = rm.host("t", 0, 0)
    for seq in range(30):
        append(rm, idem(seq % 2, seq // 2))
    p.log.flush()
    rm.log_manager.write_checkpoints()
    rm.write_high_watermarks()
    recovery_point = p.log.recovery_point
    for seq in range(30, 60):  # after the last flush: rolls write snapshots above the recovery point
        append(rm, idem(seq % 2, seq // 2))
    above = [o for o in snapshots(tmp_path) if o > recovery_point]
    assert above
    usable = max(o for o in snapshots(tmp_path) if o <= recovery_point)
    rm = restart(rm, tmp_path, SMALL_SEGMENTS, clean=False)
    p = rm.partition("t", 0)
    assert p.log.producer_state_replayed == 60 - usable  # one batch per offset here
    assert_same_as_full_replay(p)
    assert append(rm, idem(1, 29)).base_offset == 59  # deduplicated after the crash


def test_a_snapshot_above_the_checkpointed_high_watermark_is_not_used(tmp_path):
    """A transaction whose marker is at or above the HWM stays unstable (it bounds the LSO) until the HWM
    passes the marker; a snapshot cannot hold such ended transactions (Kafka's format has only open ones), so
    only a snapshot at or below the HWM is loaded, and the LSO is the one a full replay gives."""
    from pykbroker.log.checkpoint import write_checkpoint

    rm = manager(tmp_path, SMALL_SEGMENTS)
    p = rm.host("t", 0, 0)
    append(rm, txn_batch(1, 2))  # 0, 1
    marker(rm, 1, commit=True)  # 2
    p.log.roll()  # a snapshot at 3: the transaction ended
    for seq in range(3):
        append(rm, idem(2, seq))  # 3-5
    p.log.flush()
    rm.log_manager.write_checkpoints()  # recovery point 6
    write_checkpoint(rm.checkpoint_path, [("t", 0, 2)])  # the HWM was last checkpointed below the marker
    rm = restart(rm, tmp_path, SMALL_SEGMENTS, clean=False)
    p = rm.partition("t", 0)
    assert 3 in snapshots(tmp_path)
    assert p.log.producer_state_replayed == 5  # every batch: no snapshot at or below 2
    # Loaded with the HWM at 2, the committed transaction is unstable (a follower's LSO stays at 0 until its
    # leader's HWM passes the marker); this single broker's HWM is its log end once it leads.
    assert p.producer_state.first_unstable_offset() == 0
    assert p.last_stable_offset == p.high_watermark == 6
    assert_same_as_full_replay(p)


def test_a_log_whose_state_was_never_loaded_writes_no_snapshot(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", SMALL_SEGMENTS, fsync="never")
    for seq in range(10):
        log.append(idem(1, seq), leader_epoch=0, now_ms=T0)  # the state is not kept: it would be wrong
    log.roll()
    log.close()
    assert snapshots(tmp_path) == []
    log = PartitionLog.open(tmp_path / "t-0", SMALL_SEGMENTS, fsync="never")
    assert log.load_producer_state() == 0 and log.producer_state_replayed == 10
    log.close()
    assert snapshots(tmp_path) == [10]


def test_a_corrupt_snapshot_is_logged_deleted_and_an_older_one_or_the_log_used(tmp_path, caplog):
    rm = manager(tmp_path, SMALL_SEGMENTS)
    rm.host("t", 0, 0)
    for seq in range(30):
        append(rm, idem(1, seq))
    rm = restart(rm, tmp_path, SMALL_SEGMENTS)
    newest, older = snapshots(tmp_path)[-1], snapshots(tmp_path)[-2]
    path = tmp_path / "t-0" / f"{newest:020d}.snapshot"
    damaged = bytearray(path.read_bytes())
    damaged[-1] ^= 1
    path.write_bytes(damaged)  # a bad CRC
    caplog.set_level(logging.WARNING, "pykbroker.log.partition_log")
    rm = restart(rm, tmp_path, SMALL_SEGMENTS, clean=False)
    p = rm.partition("t", 0)
    assert f"ignoring producer snapshot {path.name}" in caplog.text and "CRC" in caplog.text
    assert not path.exists()
    assert p.log.producer_state_replayed == newest - older
    assert_same_as_full_replay(p)
    for name in snapshots(tmp_path):  # every one unreadable: a replay of the whole log
        (tmp_path / "t-0" / f"{name:020d}.snapshot").write_bytes(b"\x00\x01garbage")
    rm = restart(rm, tmp_path, SMALL_SEGMENTS, clean=False)
    p = rm.partition("t", 0)
    assert p.log.producer_state_replayed == 30 and snapshots(tmp_path) == []
    assert_same_as_full_replay(p)


def test_a_snapshot_that_cannot_be_written_fails_nothing(tmp_path, monkeypatch, caplog):
    import pykbroker.log.partition_log as partition_log_module

    rm = manager(tmp_path, SMALL_SEGMENTS)
    p = rm.host("t", 0, 0)
    real_open = partition_log_module.os.open

    def full_disk(path, *args, **kwargs):
        if str(path).endswith(".snapshot.tmp"):
            raise OSError(28, "No space left on device")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(partition_log_module.os, "open", full_disk)
    for seq in range(20):  # the rolls go on
        assert append(rm, idem(1, seq)).error == 0
    monkeypatch.undo()
    assert len(p.log.segment_base_offsets) > 2 and snapshots(tmp_path) == []
    assert "could not write producer snapshot" in caplog.text
    assert not list((tmp_path / "t-0").glob("*.tmp"))
    rm = restart(rm, tmp_path, SMALL_SEGMENTS)
    assert rm.partition("t", 0).log.producer_state_replayed == 0  # the disk has room again at shutdown


def test_truncation_deletes_snapshots_above_and_reloads_from_the_newest_below(tmp_path):
    rm = manager(tmp_path, SMALL_SEGMENTS)
    p = rm.host("t", 0, 0)
    append(rm, txn_batch(9, 1))  # open from offset 0 on
    for seq in range(30):
        append(rm, idem(1, seq))
    taken = snapshots(tmp_path)
    cut = taken[-1] - 2
    below = max(o for o in taken if o <= cut)
    p.truncate_to(cut)
    assert snapshots(tmp_path) == [o for o in taken if o <= cut]
    assert p.log.producer_state_replayed == cut - below
    assert_same_as_full_replay(p)
    assert p.producer_state.entry(1).last_seq == cut - 2
    assert p.last_stable_offset == 0
    p.truncate_fully_and_start_at(100)
    assert snapshots(tmp_path) == [] and len(p.producer_state) == 0


def test_retention_and_delete_records_delete_snapshots_below_the_log_start(tmp_path):
    rm = manager(tmp_path, SMALL_SEGMENTS)
    p = rm.host("t", 0, 0)
    for seq in range(30):
        append(rm, idem(1, seq))
    p.log.flush()  # every snapshot durable: the bound keeps the newest ones
    taken = snapshots(tmp_path)
    target = taken[-2] + 1
    p.delete_records_on_leader(target)
    rm.log_manager.apply_retention(T0)
    assert all(o >= target for o in snapshots(tmp_path)) and snapshots(tmp_path)
    assert p.log.log_start_offset == target


def test_the_number_of_snapshots_is_bounded(tmp_path):
    rm = manager(tmp_path, SMALL_SEGMENTS)
    p = rm.host("t", 0, 0)
    for seq in range(20):
        append(rm, idem(1, seq))
    p.log.flush()
    # The newest snapshot this flush made durable; the next append rolls at the recovery point (20), but that
    # roll's snapshot is written after the flush: until a flush fsyncs it, it is not the one a crash can load.
    durable = max(p.log.snapshot_offsets)
    assert durable < p.log.recovery_point == 20
    for seq in range(20, 200):
        append(rm, idem(1, seq))
    assert len(p.log.segment_base_offsets) > 30
    kept = snapshots(tmp_path)
    assert len(kept) == MAX_SNAPSHOTS + 1 and kept == p.log.snapshot_offsets
    assert kept[-MAX_SNAPSHOTS:] == p.log.segment_base_offsets[-MAX_SNAPSHOTS:]
    assert kept[0] == durable  # the newest at or below the recovery point: what a crash now would load
    p.log.flush()
    append(rm, idem(1, 200))
    p.log.roll()
    assert len(snapshots(tmp_path)) == MAX_SNAPSHOTS  # the durable one is among the newest now


def test_a_flush_snapshots_after_enough_bytes_within_one_segment(tmp_path, monkeypatch):
    """A big segment of small batches is not replayed whole after a crash or a truncation: once
    SNAPSHOT_INTERVAL_BYTES were appended, the next flush writes a snapshot at the log end (and fsyncs it)."""
    monkeypatch.setattr("pykbroker.log.partition_log.SNAPSHOT_INTERVAL_BYTES", 1000)
    rm = manager(tmp_path)
    p = rm.host("t", 0, 0)
    for seq in range(10):
        append(rm, idem(1, seq))
    p.log.flush()
    assert snapshots(tmp_path) == []  # under 1000 bytes
    for seq in range(10, 30):
        append(rm, idem(1, seq))
    job = p.log.prepare_flush()
    assert snapshots(tmp_path) == [30] and tmp_path / "t-0" / f"{30:020d}.snapshot" in job.paths
    job.run()
    p.log.complete_flush(job)
    assert len(p.log.segment_base_offsets) == 1
    for seq in range(30, 33):
        append(rm, idem(1, seq))
    p.truncate_to(32)
    assert p.log.producer_state_replayed == 2
    assert_same_as_full_replay(p)


def test_a_follower_takes_snapshots_at_its_own_rolls(tmp_path):
    leader_log = PartitionLog.open(tmp_path / "l" / "t-0", SMALL_SEGMENTS, fsync="never")
    records = []
    for seq in range(20):
        result = leader_log.append(idem(4, seq), leader_epoch=0, now_ms=T0)
        records.append((result.base_offset, result))
    batches = [data for _, data in leader_log.batches(0)]
    leader_log.close()
    follower_log = PartitionLog.open(tmp_path / "t-0", SMALL_SEGMENTS, fsync="never")
    follower = Partition("t", 0, follower_log, broker_id=2)
    follower.rebuild_producer_state()
    for data in batches:
        follower.append_as_follower(bytes(data))
    taken = snapshots(tmp_path)
    assert taken and taken == follower_log.segment_base_offsets[1:][-len(taken):]
    restored = ProducerStateManager()
    restored.load_snapshot((tmp_path / "t-0" / f"{taken[-1]:020d}.snapshot").read_bytes(), taken[-1])
    assert restored.entry(4).last_seq == taken[-1] - 1
    follower_log.close()


# -- against a replay of the whole log, over random histories ------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_random_histories_load_the_state_a_full_replay_gives(tmp_path, seed):
    """Seeded random produce (idempotent, transactional, plain), commits and aborts, rolls, flushes,
    truncations and clean or crash restarts: after each restart or truncation, the state, LSO and aborted
    ranges are those of a replay of the whole log."""
    rng = random.Random(seed)
    rm = manager(tmp_path, SMALL_SEGMENTS)
    p = rm.host("t", 0, 0)
    seqs: dict[int, int] = {}
    open_txn: set[int] = set()
    loads = 0
    for _ in range(120):
        action = rng.choice(["idem"] * 4 + ["txn"] * 3 + ["end"] * 2 + ["plain", "roll", "flush", "truncate",
                                                                         "clean", "crash"])
        if action == "idem":
            pid = rng.randrange(10, 13)
            count = rng.randrange(1, 4)
            assert append(rm, idem(pid, seqs.get(pid, 0), count)).error == 0
            seqs[pid] = seqs.get(pid, 0) + count
        elif action == "txn":
            pid = rng.randrange(1, 4)
            count = rng.randrange(1, 3)
            assert append(rm, txn_batch(pid, count, seq=seqs.get(pid, 0))).error == 0
            seqs[pid] = seqs.get(pid, 0) + count
            open_txn.add(pid)
        elif action == "end" and open_txn:
            pid = rng.choice(sorted(open_txn))
            assert marker(rm, pid, commit=rng.random() < 0.5).error == 0
            open_txn.discard(pid)
        elif action == "plain":
            append(rm, plain(rng.randrange(1, 4)))
        elif action == "roll":
            p.log.roll()
        elif action == "flush":
            p.log.flush()
            rm.log_manager.write_checkpoints()
            rm.write_high_watermarks()
        elif action == "truncate" and p.log.log_end_offset > 0:
            # A follower truncates at a batch boundary (the leader's epoch end offsets).
            p.truncate_to(rng.choice([h.base_offset for h in p.log.headers(max(p.log.log_end_offset - 12, 0))]))
            loads += 1
        elif action in ("clean", "crash"):
            rm = restart(rm, tmp_path, SMALL_SEGMENTS, clean=action == "clean")
            p = rm.partition("t", 0)
            if action == "clean":
                assert p.log.producer_state_replayed == 0
            loads += 1
        else:
            continue
        if action in ("truncate", "clean", "crash"):
            assert_same_as_full_replay(p)
            # The producers' own view follows the log that is left (a truncation dropped batches).
            seqs = {pid: entry.last_seq + 1 for pid in p.producer_state.producer_ids()
                    if (entry := p.producer_state.entry(pid)).batches}
            open_txn = {pid for pid, _ in p.producer_state.ongoing_transactions()}
        assert len(snapshots(tmp_path)) <= MAX_SNAPSHOTS + 2
    assert loads


# -- review fixes: states that must never be saved, deletions that must last --------------------------------------


def test_a_reload_that_fails_half_way_writes_no_snapshot_of_its_partial_state(tmp_path, monkeypatch):
    rm = manager(tmp_path)
    p = rm.host("t", 0, 0)
    for pid in range(1, 6):
        append(rm, idem(pid, 0))
    real = PartitionLog.headers_and_markers

    def failing(self, start=0):
        for index, item in enumerate(real(self, start)):
            if index == 2:
                raise OSError(5, "Input/output error")  # EIO reading a segment during the truncation's reload
            yield item

    monkeypatch.setattr(PartitionLog, "headers_and_markers", failing)
    with pytest.raises(OSError):
        p.truncate_to(4)
    monkeypatch.setattr(PartitionLog, "headers_and_markers", real)
    assert p.producer_state.producer_ids() == [1, 2]  # half loaded
    p.log.roll()
    p.log.take_producer_snapshot()
    assert p.log.snapshot_offsets == []  # neither the roll nor an explicit snapshot saved it
    rm = restart(rm, tmp_path)  # (nor the close)
    assert rm.partition("t", 0).producer_state.producer_ids() == [1, 2, 3, 4]


def test_a_failed_fdatasync_holds_snapshots_back_until_a_reload_covers_the_batch(tmp_path, monkeypatch):
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), fsync="always")
    log.load_producer_state()
    log.append(idem(1, 0), leader_epoch=0, now_ms=T0)

    def failing(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("pykbroker.log.partition_log.os.fdatasync", failing)
    with pytest.raises(OSError):
        log.append(idem(2, 0), leader_epoch=0, now_ms=T0)  # written, failed: the caller skips its state update
    monkeypatch.undo()
    assert log.log_end_offset == 2
    log.take_producer_snapshot()
    assert log.snapshot_offsets == []  # the state misses producer 2's batch at offset 1
    log.take_producer_snapshot(1)
    assert log.snapshot_offsets == [1]  # at or below the gap is fine
    log.load_producer_state()  # the replay from 1 covers the batch: snapshots above it again
    assert log.producer_state.entry(2) is not None
    log.take_producer_snapshot()
    assert log.snapshot_offsets == [1, 2]
    log.close()


def test_a_deleted_snapshot_is_made_durable_by_the_next_flush(tmp_path):
    rm = manager(tmp_path)
    p = rm.host("t", 0, 0)
    for seq in range(6):
        append(rm, idem(7, seq))
    p.log.take_producer_snapshot()  # at 6
    for seq in range(6, 9):
        append(rm, idem(7, seq))
    p.log.flush()
    p.truncate_to(3)  # inside the active segment: no segment file goes, only the snapshot at 6
    assert 6 not in snapshots(tmp_path)
    assert p.log.directory in p.log.prepare_flush().paths  # the unlink is fsynced, as a segment's would be


def test_snapshots_above_the_recovery_point_go_after_a_crash(tmp_path):
    rm = manager(tmp_path, SMALL_SEGMENTS)
    p = rm.host("t", 0, 0)
    for seq in range(10):
        append(rm, idem(1, seq))
    p.log.flush()
    flushed = p.log.recovery_point
    for seq in range(10, 40):
        append(rm, idem(1, seq))  # rolls: snapshots above the recovery point, never fsynced
    assert max(snapshots(tmp_path)) > flushed
    rm = restart(rm, tmp_path, clean=False)
    # A later run's flush moves the recovery point past them: they must not be usable then (the markers below
    # them may have lost their index entries), so the crash recovery deleted them.
    assert all(offset <= flushed for offset in snapshots(tmp_path))


def test_a_snapshot_that_cannot_be_read_now_is_kept(tmp_path, monkeypatch, caplog):
    rm = manager(tmp_path, SMALL_SEGMENTS)
    p = rm.host("t", 0, 0)
    for seq in range(30):
        append(rm, idem(1, seq))
    newest = max(snapshots(tmp_path))
    real = Path.read_bytes

    def failing(self):
        if self.name.endswith(".snapshot"):
            raise OSError(24, "Too many open files")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", failing)
    with caplog.at_level(logging.WARNING):
        p.log.load_producer_state(p.high_watermark)
    monkeypatch.undo()
    assert "Too many open files" in caplog.text
    assert newest in snapshots(tmp_path)  # not corrupt: kept (a corrupt one is deleted)
    assert p.log.producer_state_replayed == 30  # the whole log instead


def test_a_failed_index_entry_is_written_again_by_the_next_flush_and_snapshots_resume(tmp_path, monkeypatch):
    _, p = abort_while_the_disk_is_full(tmp_path, monkeypatch)  # aborted 0..2: its index entry in memory only
    index = tmp_path / "t-0" / "00000000000000000000.txnindex"
    assert not index.exists()
    p.log.take_producer_snapshot()
    assert p.log.snapshot_offsets == []  # a restart loading it would skip the marker: the entry lost for good
    p.log.flush()  # the disk has room again: the entry is written, then snapshots resume
    assert index.stat().st_size == ENTRY_SIZE
    p.log.take_producer_snapshot()
    assert p.log.snapshot_offsets == [3]

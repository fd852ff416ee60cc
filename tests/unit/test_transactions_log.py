"""The partition-leader side of transactions on real logs: producer state with open transactions, markers and
their checks, the transaction index (.txnindex) through appends, restarts, truncation and retention, the LSO
against the high-water mark, and what Fetch / ListOffsets answer with isolation levels. Kafka 3.7's
ProducerStateManager / ProducerAppendInfo / TransactionIndex / UnifiedLog are the reference."""

from __future__ import annotations

import asyncio
import datetime
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from kio.schema.fetch.v16 import request as fr
from kio.schema.list_offsets.v8 import request as lr

from pykbroker.log.config import LogConfig
from pykbroker.log.manager import LogManager
from pykbroker.log.producer_state import (
    INVALID_PRODUCER_EPOCH,
    INVALID_TXN_STATE,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    TRANSACTION_COORDINATOR_FENCED,
    CompletedTxn,
    ProducerStateError,
    ProducerStateManager,
)
from pykbroker.log.txn_index import ENTRY_SIZE, AbortedTxn, TransactionIndex, TxnIndexEntry
from pykbroker.protocol.apis import codec_for
from pykbroker.protocol.control_records import Marker, read_marker
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.framing import Request
from pykbroker.protocol.records import TRANSACTIONAL_MASK, build_batch, iter_headers, read_header
from pykbroker.replication.replica_manager import ReplicaManager
from pykbroker.replication.txn_markers import write_markers
from pykbroker.server.dispatch import RequestContext
from pykbroker.server.handlers.fetch import fetch as fetch_handler
from pykbroker.server.handlers.list_offsets import list_offsets as list_offsets_handler

T0 = int(time.time() * 1000)  # (markers carry the wall-clock time: a segment.ms apart from T0 would roll)
TOPIC_ID = __import__("uuid").UUID("7f3e2a55-0000-4000-8000-0000000000aa")


def manager(path: Path, config: LogConfig | None = None) -> ReplicaManager:
    rm = ReplicaManager(LogManager(path), 1, lambda topic: config or LogConfig(), clock=lambda: T0)
    return rm


def restart(rm: ReplicaManager, path: Path, config: LogConfig | None = None, *, clean: bool = True) -> ReplicaManager:
    if clean:
        rm.write_high_watermarks()
        rm.log_manager.shutdown()
    else:  # a crash: nothing flushed or checkpointed beyond what is on disk; release the lock only
        for log in rm.log_manager.logs():
            log.abandon()
        rm.log_manager._executor.shutdown(wait=True)
        import os
        os.close(rm.log_manager._lock_fd)
    new = manager(path, config)
    new.log_manager.load_all(lambda topic: config or LogConfig())
    new.host("t", 0, 0)
    return new


def txn_batch(pid: int, count: int, *, epoch: int = 0, seq: int = 0, transactional: bool = True) -> bytearray:
    return build_batch([(None, b"v%d" % i) for i in range(count)], timestamp_ms=T0, producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq, attributes=TRANSACTIONAL_MASK if transactional else 0)


def plain(count: int) -> bytearray:
    return build_batch([(None, b"p%d" % i) for i in range(count)], timestamp_ms=T0)


def append(rm: ReplicaManager, records, **kwargs):
    return rm.append("t", 0, records, acks=1, min_insync_replicas=1, **kwargs)


def marker(rm: ReplicaManager, pid: int, commit: bool, *, epoch: int = 0, coordinator_epoch: int = 0):
    return rm.append_marker("t", 0, producer_id=pid, producer_epoch=epoch, commit=commit,
                            coordinator_epoch=coordinator_epoch)


def header(records, base_offset: int = 0):
    h = next(iter_headers(records))
    return h._replace(base_offset=base_offset)


# -- producer state ---------------------------------------------------------------------------------


def test_producer_state_transaction_lifecycle():
    state = ProducerStateManager()
    first = header(txn_batch(7, 3), 10)
    state.check_batches([first])
    state.update(first, -1)
    assert state.entry(7).current_txn_first_offset == 10
    assert state.first_unstable_offset() == 10
    second = header(txn_batch(7, 2, seq=3), 13)
    state.check_batches([second])
    state.update(second, -1)
    assert state.entry(7).current_txn_first_offset == 10  # continues the same transaction
    # A non-transactional batch while the transaction is open: INVALID_TXN_STATE.
    with pytest.raises(ProducerStateError) as raised:
        state.check_batches([header(txn_batch(7, 1, seq=5, transactional=False), 15)])
    assert raised.value.error_code == INVALID_TXN_STATE
    control = header(_marker_bytes(7, False, 0), 15)
    completed = state.update(control, -1, Marker(False, 0))
    assert completed == CompletedTxn(7, 10, 15, True)
    assert state.entry(7).current_txn_first_offset == -1
    assert state.entry(7).coordinator_epoch == 0
    # Ended but the HWM has not passed the marker: still unstable.
    assert state.first_unstable_offset(high_watermark=15) == 10
    assert state.first_unstable_offset(high_watermark=16) is None
    assert not state.has_unstable
    # After the marker, a non-transactional batch is fine again.
    state.check_batches([header(txn_batch(7, 1, seq=5, transactional=False), 16)])


def test_first_unstable_offset_is_the_earliest_of_several_transactions():
    state = ProducerStateManager()
    for pid, offset in ((1, 5), (2, 3)):
        state.update(header(txn_batch(pid, 1), offset), -1)
    assert state.first_unstable_offset() == 3
    assert state.ongoing_transactions() == [(2, 3), (1, 5)]
    state.update(header(_marker_bytes(2, True, 0), 6), -1, Marker(True, 0))
    assert state.first_unstable_offset(high_watermark=7) == 5
    # The LSO stored in the index for a completed transaction: the other open one's first offset.
    assert state.last_stable_offset_after(CompletedTxn(2, 3, 6, False)) == 5


def test_marker_checks():
    state = ProducerStateManager()
    state.update(header(txn_batch(9, 1, epoch=3), 0), -1)
    state.update(header(_marker_bytes(9, True, 5, epoch=3), 1), -1, Marker(True, 5))
    with pytest.raises(ProducerStateError) as raised:
        state.check_marker(9, 2, 5)
    assert raised.value.error_code == INVALID_PRODUCER_EPOCH
    with pytest.raises(ProducerStateError) as raised:
        state.check_marker(9, 3, 4)
    assert raised.value.error_code == TRANSACTION_COORDINATOR_FENCED
    state.check_marker(9, 4, 5)  # a bumped epoch (the coordinator aborting a fenced producer) passes
    state.check_marker(12345, 0, 0)  # unknown producer: Kafka writes the marker


def test_coordinator_origin_skips_sequences_not_epochs():
    state = ProducerStateManager()
    state.update(header(txn_batch(4, 1, epoch=1, seq=0), 0), -1)
    late = header(txn_batch(4, 1, epoch=1, seq=-1), 1)
    with pytest.raises(ProducerStateError) as raised:
        state.check_batches([late])
    assert raised.value.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
    state.check_batches([late], check_sequence=False)
    with pytest.raises(ProducerStateError) as raised:
        state.check_batches([header(txn_batch(4, 1, epoch=0, seq=-1), 1)], check_sequence=False)
    assert raised.value.error_code == INVALID_PRODUCER_EPOCH


def test_expiry_keeps_producers_with_open_transactions_and_snapshot_keeps_them():
    state = ProducerStateManager()
    state.update(header(txn_batch(1, 1), 0), -1)
    state.update(header(txn_batch(2, 1, transactional=False), 1), -1)
    assert state.expire(T0 + 10**10, 1000) == 1
    assert state.producer_ids() == [1]
    restored = ProducerStateManager()
    restored.load_snapshot(state.snapshot(), state.next_offset)
    assert restored.entry(1).current_txn_first_offset == 0
    assert restored.first_unstable_offset() == 0


def _marker_bytes(pid: int, commit: bool, coordinator_epoch: int, *, epoch: int = 0) -> bytearray:
    from pykbroker.protocol.control_records import marker_batch
    return marker_batch(producer_id=pid, producer_epoch=epoch, commit=commit, coordinator_epoch=coordinator_epoch,
                        timestamp_ms=T0)


# -- the transaction index file ---------------------------------------------------------------------


def test_txn_index_round_trip_truncate_and_corruption(tmp_path):
    index = TransactionIndex.for_segment(tmp_path, 0)
    entries = [TxnIndexEntry(1, 0, 5, 6), TxnIndexEntry(2, 3, 9, 10), TxnIndexEntry(3, 10, 12, 13)]
    for entry in entries:
        index.append(entry)
    index.append(entries[0])  # already there: nothing written
    assert index.path.name == "00000000000000000000.txnindex"
    assert index.path.stat().st_size == 3 * ENTRY_SIZE == 102
    assert TransactionIndex.load(index.path).entries == entries
    raw = index.path.read_bytes()
    assert raw[:2] == b"\x00\x00" and int.from_bytes(raw[2:10], "big") == 1  # version 0, producer id
    out: list[AbortedTxn] = []
    assert not index.collect(6, 14, out)
    assert out == [AbortedTxn(2, 3, 9), AbortedTxn(3, 10, 12)]
    out = []
    assert index.collect(0, 6, out)  # the first entry's LSO reached the upper bound: complete
    assert out == [AbortedTxn(1, 0, 5)]
    assert index.truncate_to(9)
    assert TransactionIndex.load(index.path).entries == entries[:1]
    # An entry older than the last one (a replay re-finding a marker a crash lost): put in order.
    index.append(TxnIndexEntry(9, 1, 2, 3))
    assert [e.last_offset for e in TransactionIndex.load(index.path).entries] == [2, 5]
    index.path.write_bytes(raw[:ENTRY_SIZE] + b"\x00\x07" + raw[ENTRY_SIZE + 2:])  # a bad version
    assert TransactionIndex.load(index.path).entries == []
    assert not index.path.exists()


# -- the partition: markers, LSO, aborted ranges, restarts --------------------------------------------


def test_commit_and_abort_move_the_lso_and_fill_the_index(tmp_path):
    rm = manager(tmp_path)
    p = rm.host("t", 0, 0)
    assert append(rm, plain(2)).base_offset == 0
    assert append(rm, txn_batch(1, 3)).base_offset == 2
    assert p.last_stable_offset == 2 and p.high_watermark == 5
    assert p.log.first_unstable_offset == 2
    assert append(rm, txn_batch(2, 2)).base_offset == 5
    # A non-transactional produce of producer 1 while its transaction is open.
    assert append(rm, txn_batch(1, 1, seq=3, transactional=False)).error == ErrorCode.invalid_txn_state
    assert marker(rm, 1, commit=True).error == ErrorCode.none  # offset 7
    assert p.last_stable_offset == 5  # producer 2 still open
    out = marker(rm, 2, commit=False)  # offset 8
    assert (out.error, out.base_offset) == (ErrorCode.none, 8)
    assert p.log.first_unstable_offset is None
    assert p.last_stable_offset == p.high_watermark == 9
    assert p.log.aborted_ranges(0, 9) == [AbortedTxn(2, 5, 8)]
    assert p.log.aborted_ranges(9, 20) == [] and p.log.aborted_ranges(0, 5) == []
    assert (tmp_path / "t-0" / "00000000000000000000.txnindex").stat().st_size == ENTRY_SIZE
    # The markers are in the log as control batches.
    markers = [m for h, m in p.log.headers_and_markers(0) if h.is_control]
    assert markers == [Marker(True, 0), Marker(False, 0)]
    # Marker checks through the ReplicaManager.
    assert marker(rm, 2, commit=False, epoch=-1).error == ErrorCode.invalid_producer_epoch
    assert marker(rm, 2, commit=False, coordinator_epoch=-5).error == ErrorCode.transaction_coordinator_fenced
    assert rm.append_marker("nope", 0, producer_id=1, producer_epoch=0, commit=True,
                            coordinator_epoch=0).error == ErrorCode.unknown_topic_or_partition


def test_restart_rebuilds_open_transactions_and_a_lost_index(tmp_path):
    rm = manager(tmp_path)
    rm.host("t", 0, 0)
    append(rm, txn_batch(1, 2))
    marker(rm, 1, commit=False)  # aborted 0..2
    append(rm, txn_batch(3, 2))  # open at 3
    rm = restart(rm, tmp_path)
    p = rm.partition("t", 0)
    assert p.last_stable_offset == 3
    assert p.producer_state.entry(3).current_txn_first_offset == 3
    assert p.log.aborted_ranges(0, 10) == [AbortedTxn(1, 0, 2)]
    marker(rm, 3, commit=False)  # aborted 3..5, after the recovery point (5, the clean shutdown's log end)
    assert p.last_stable_offset == p.high_watermark == 6
    # A crash lost the index entry written after the last flush: the replay of the log from the snapshot at
    # or below the recovery point (here the shutdown's, at 5) puts it back.
    index_path = max((tmp_path / "t-0").glob("*.txnindex"))  # the segment holding the marker
    lost = index_path.read_bytes()
    index_path.write_bytes(lost[:-ENTRY_SIZE])
    rm = restart(rm, tmp_path, clean=False)
    p = rm.partition("t", 0)
    assert p.log.producer_state_replayed == 1
    assert p.log.aborted_ranges(0, 10) == [AbortedTxn(1, 0, 2), AbortedTxn(3, 3, 5)]
    assert index_path.read_bytes() == lost
    assert p.last_stable_offset == p.high_watermark == 6


def test_restart_without_snapshots_rebuilds_a_lost_index_file(tmp_path):
    rm = manager(tmp_path)
    rm.host("t", 0, 0)
    append(rm, txn_batch(1, 2))
    marker(rm, 1, commit=False)  # aborted 0..2
    rm = restart(rm, tmp_path)
    for snapshot in (tmp_path / "t-0").glob("*.snapshot"):
        snapshot.unlink()
    (tmp_path / "t-0" / "00000000000000000000.txnindex").unlink()
    rm = restart(rm, tmp_path, clean=False)
    p = rm.partition("t", 0)
    assert p.log.producer_state_replayed == 2
    assert p.log.aborted_ranges(0, 10) == [AbortedTxn(1, 0, 2)]
    assert (tmp_path / "t-0" / "00000000000000000000.txnindex").exists()


def test_index_entries_past_the_recovered_log_end_are_dropped(tmp_path):
    rm = manager(tmp_path)
    p = rm.host("t", 0, 0)
    append(rm, txn_batch(1, 2))
    marker(rm, 1, commit=False)  # 2
    index = tmp_path / "t-0" / "00000000000000000000.txnindex"
    # An entry whose marker never reached the disk (the index was written, the log was cut by recovery).
    index.write_bytes(index.read_bytes() + TxnIndexEntry(7, 3, 40, 41).pack())
    orphan = tmp_path / "t-0" / "00000000000000000999.txnindex"
    orphan.write_bytes(TxnIndexEntry(8, 999, 1000, 1001).pack())
    rm = restart(rm, tmp_path, clean=False)
    p = rm.partition("t", 0)
    assert p.log.aborted_ranges(0, 100) == [AbortedTxn(1, 0, 2)]
    assert index.stat().st_size == ENTRY_SIZE
    assert not orphan.exists()  # no segment of its own: deleted


def test_index_follows_segments_truncation_and_retention(tmp_path):
    config = LogConfig(segment_bytes=200)
    rm = manager(tmp_path, config)
    p = rm.host("t", 0, 0)
    for pid in range(1, 6):
        append(rm, txn_batch(pid, 2))
        marker(rm, pid, commit=pid % 2 == 0)  # 1, 3, 5 aborted
    bases = p.log.segment_base_offsets
    assert len(bases) > 2
    ranges = p.log.aborted_ranges(0, p.log.log_end_offset)
    assert [a.producer_id for a in ranges] == [1, 3, 5]
    # Each entry lives in the index of the segment holding its marker.
    files = sorted(f.name for f in (tmp_path / "t-0").iterdir() if f.suffix == ".txnindex")
    assert files and all(int(name.split(".")[0]) in bases for name in files)
    # Only the index files from the fetch offset's segment on are read.
    last = ranges[-1]
    assert p.log.aborted_ranges(last.last_offset, last.last_offset + 1) == [last]
    # Truncation (a follower's) drops the entries of markers cut.
    p.truncate_to(last.last_offset)
    assert [a.producer_id for a in p.log.aborted_ranges(0, 100)] == [1, 3]
    assert p.producer_state.entry(5).current_txn_first_offset == last.first_offset  # open again
    assert p.last_stable_offset == last.first_offset
    # DeleteRecords past the first segments deletes their index files with them.
    first_file = tmp_path / "t-0" / files[0]
    assert first_file.exists()
    p.delete_records_on_leader(last.first_offset)
    from pykbroker.log.partition_log import run_file_work
    run_file_work(p.log.take_file_work())
    assert not first_file.exists()
    # Truncating the whole log drops every index.
    p.truncate_fully_and_start_at(50)
    assert p.log.aborted_ranges(0, 100) == []
    assert not [f for f in (tmp_path / "t-0").iterdir() if f.suffix == ".txnindex"]
    assert not p.producer_state.has_unstable


def test_follower_appends_replay_transactions_and_markers(tmp_path):
    leader = manager(tmp_path / "a")
    lp = leader.host("t", 0, 0)
    append(leader, txn_batch(1, 2))
    marker(leader, 1, commit=False)
    append(leader, txn_batch(2, 2))
    data = lp.log.read(0, 1 << 20).read_bytes()
    follower = manager(tmp_path / "b")
    fp = follower.host("t", 0, 0)
    fp.stop()
    fp.append_as_follower(data)
    fp.update_high_watermark_from_leader(lp.high_watermark)
    assert fp.log.aborted_ranges(0, 10) == [AbortedTxn(1, 0, 2)]
    assert fp.producer_state.entry(2).current_txn_first_offset == 3
    assert fp.last_stable_offset == 3
    assert read_marker(data, read_header(data, 2 * 0 + _second_batch_position(data))) == Marker(False, 0)


def _second_batch_position(data) -> int:
    return list(iter_headers(data))[1].position


def test_lso_waits_for_the_high_watermark_with_followers(tmp_path):
    rm = manager(tmp_path)
    rm.become_leader("t", 0, 1, [1, 2], [1, 2], 0)
    p = rm.partition("t", 0)
    append(rm, txn_batch(1, 2))
    marker(rm, 1, commit=True)  # offset 2
    assert p.high_watermark == 0 and p.last_stable_offset == 0
    p.update_follower_fetch_state(2, 2, 0, T0, p.log.log_end_offset)
    assert p.high_watermark == 2 and p.last_stable_offset == 0  # the marker itself is not replicated yet
    assert p.log.first_unstable_offset == 0
    p.update_follower_fetch_state(2, 3, 0, T0, p.log.log_end_offset)
    assert p.log.first_unstable_offset is None  # stable as the HWM passed the marker, before anyone asked
    assert p.high_watermark == 3 and p.last_stable_offset == 3


def test_coordinator_origin_append(tmp_path):
    rm = manager(tmp_path)
    rm.host("t", 0, 0)
    assert append(rm, txn_batch(5, 1, seq=-1), origin="coordinator").error == ErrorCode.none
    assert append(rm, txn_batch(5, 1, seq=-1), origin="coordinator").base_offset == 1  # no duplicate check
    assert rm.partition("t", 0).producer_state.entry(5).current_txn_first_offset == 0


# -- Fetch and ListOffsets through the handlers ---------------------------------------------------------


def _broker(rm: ReplicaManager, groups=None) -> SimpleNamespace:
    info = SimpleNamespace(name="t", topic_id=TOPIC_ID, internal=False, partitions=[0])
    offsets = SimpleNamespace(name="__consumer_offsets", topic_id=None, internal=True, partitions=[0])
    topics = {"t": info, "__consumer_offsets": offsets}
    return SimpleNamespace(
        replicas=rm, stats=None, groups=groups,
        topics=SimpleNamespace(min_insync_replicas=lambda name: 1),
        metadata=SimpleNamespace(topic=topics.get, topic_by_id=lambda tid: info if tid == TOPIC_ID else None))


def _call(handler, rm, api_key, version, body):
    request = Request(api_key, version, 1, "test", None, body, codec_for(api_key, version))
    return handler(RequestContext(_broker(rm), request, "test"), body)


def _fetch(rm, offset: int, isolation: int, partition_max_bytes: int = 1 << 20):
    body = fr.FetchRequest(
        replica_state=fr.ReplicaState(replica_id=-1), max_wait=datetime.timedelta(0), min_bytes=0,
        max_bytes=1 << 20, isolation_level=isolation, session_id=0, session_epoch=-1,
        topics=(fr.FetchTopic(topic_id=TOPIC_ID, partitions=(fr.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
            log_start_offset=-1, partition_max_bytes=partition_max_bytes),)),),
        forgotten_topics_data=(), rack_id="")
    return _call(fetch_handler, rm, 1, 16, body).responses[0].partitions[0]


def _list_offsets(rm, timestamp: int, isolation: int) -> int:
    body = lr.ListOffsetsRequest(replica_id=-1, isolation_level=isolation, topics=(lr.ListOffsetsTopic(
        name="t", partitions=(lr.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1,
                                                      timestamp=timestamp),)),))
    return _call(list_offsets_handler, rm, 2, 8, body).topics[0].partitions[0].offset


def _offsets(records) -> list[int]:
    data = b"".join(records.chunks(1 << 20)) if records else b""
    return [h.base_offset for h in iter_headers(data)] if data else []


def test_fetch_and_list_offsets_by_isolation(tmp_path):
    rm = manager(tmp_path)
    rm.host("t", 0, 0)
    append(rm, plain(1))  # 0
    append(rm, txn_batch(1, 2))  # 1-2, aborted below
    append(rm, txn_batch(2, 2))  # 3-4, open
    marker(rm, 1, commit=False)  # 5
    committed = _fetch(rm, 0, 1)
    uncommitted = _fetch(rm, 0, 0)
    assert committed.high_watermark == uncommitted.high_watermark == 6
    assert committed.last_stable_offset == uncommitted.last_stable_offset == 3
    assert _offsets(committed.records) == [0, 1]  # never past the LSO
    assert [(a.producer_id, a.first_offset) for a in committed.aborted_transactions] == [(1, 1)]
    assert uncommitted.aborted_transactions is None
    assert _offsets(uncommitted.records) == [0, 1, 3, 5]
    at_lso = _fetch(rm, 3, 1)
    assert at_lso.error_code == ErrorCode.none and not at_lso.records and at_lso.aborted_transactions == ()
    assert _list_offsets(rm, -1, 1) == 3 and _list_offsets(rm, -1, 0) == 6
    assert _list_offsets(rm, T0, 1) == 0
    marker(rm, 2, commit=True)  # 6
    assert _list_offsets(rm, -1, 1) == 7
    after = _fetch(rm, 3, 1)
    assert _offsets(after.records) == [3, 5, 6]
    assert [(a.producer_id, a.first_offset) for a in after.aborted_transactions] == [(1, 1)]


def test_read_committed_fetch_lists_only_the_aborted_transactions_overlapping_what_it_read(tmp_path):
    # 200 aborted one-record transactions: a fetch that reads a few batches gets their aborted transactions,
    # not the whole partition's (Kafka's upper bound: the first offset after the data read), so the list
    # never outgrows what the fetch's max bytes allows.
    rm = manager(tmp_path)
    rm.host("t", 0, 0)
    for pid in range(1, 201):
        append(rm, txn_batch(pid, 1))  # 2 * (pid - 1)
        marker(rm, pid, commit=False)  # 2 * (pid - 1) + 1
    batch = len(txn_batch(1, 1))
    part = _fetch(rm, 0, 1, partition_max_bytes=3 * batch + 2 * len(_marker_bytes(1, False, 0)))
    assert _offsets(part.records) == [0, 1, 2, 3, 4]
    assert [(a.producer_id, a.first_offset) for a in part.aborted_transactions] == [(1, 0), (2, 2), (3, 4)]
    middle = _fetch(rm, 201, 1, partition_max_bytes=1)  # min one batch: the marker at 201 alone
    assert _offsets(middle.records) == [201]
    assert [(a.producer_id, a.first_offset) for a in middle.aborted_transactions] == [(101, 200)]
    whole = _fetch(rm, 0, 1)
    assert len(whole.aborted_transactions) == 200


def test_read_committed_long_poll_wakes_when_a_marker_makes_data_stable(tmp_path):
    rm = manager(tmp_path)
    rm.host("t", 0, 0)
    append(rm, txn_batch(1, 2))

    async def scenario():
        body = fr.FetchRequest(
            replica_state=fr.ReplicaState(replica_id=-1), max_wait=datetime.timedelta(seconds=30), min_bytes=1,
            max_bytes=1 << 20, isolation_level=1, session_id=0, session_epoch=-1,
            topics=(fr.FetchTopic(topic_id=TOPIC_ID, partitions=(fr.FetchPartition(
                partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                log_start_offset=-1, partition_max_bytes=1 << 20),)),),
            forgotten_topics_data=(), rack_id="")
        pending = asyncio.ensure_future(_call(fetch_handler, rm, 1, 16, body))
        await asyncio.sleep(0.05)
        assert not pending.done()  # the open transaction's data is not stable: parked
        append(rm, txn_batch(1, 1, seq=2))
        await asyncio.sleep(0.05)
        assert not pending.done()  # the HWM moved, the LSO did not: parked again
        marker(rm, 1, commit=True)
        response = await asyncio.wait_for(pending, 10)
        part = response.responses[0].partitions[0]
        assert _offsets(part.records) == [0, 2, 3] and part.last_stable_offset == 4

    asyncio.run(scenario())


def test_write_markers_answers_per_partition_and_applies_offsets_markers(tmp_path):
    rm = manager(tmp_path)
    rm.host("t", 0, 0)
    rm.host("__consumer_offsets", 0, 0)
    append(rm, txn_batch(1, 1))
    rm.append("__consumer_offsets", 0, txn_batch(1, 1, seq=-1), acks=-1, min_insync_replicas=1, origin="coordinator")
    calls = []
    groups = SimpleNamespace(on_transaction_marker=lambda *args: calls.append(args))
    markers = [SimpleNamespace(producer_id=1, producer_epoch=0, transaction_result=True, coordinator_epoch=0,
                               topics=[SimpleNamespace(name="t", partition_indexes=[0, 7]),
                                       SimpleNamespace(name="__consumer_offsets", partition_indexes=[0]),
                                       SimpleNamespace(name="gone", partition_indexes=[0])]),
               SimpleNamespace(producer_id=1, producer_epoch=0, transaction_result=False, coordinator_epoch=-1,
                               topics=[SimpleNamespace(name="t", partition_indexes=[0])])]
    results = asyncio.run(write_markers(_broker(rm, groups), markers))
    assert results[0].topics == [("t", [(0, ErrorCode.none), (7, ErrorCode.unknown_topic_or_partition)]),
                                 ("__consumer_offsets", [(0, ErrorCode.none)]),
                                 ("gone", [(0, ErrorCode.unknown_topic_or_partition)])]
    assert results[1].topics == [("t", [(0, ErrorCode.transaction_coordinator_fenced)])]
    assert calls == [(0, 1, True)]
    assert rm.partition("__consumer_offsets", 0).last_stable_offset == 2


def abort_while_the_disk_is_full(tmp_path, monkeypatch):
    """A partition t-0 with producer 1's transaction 0..1 aborted (marker at 2) while its .txnindex file
    could not be written (ENOSPC); the disk has room again afterwards."""
    import pykbroker.log.txn_index as txn_index_module

    rm = manager(tmp_path)
    p = rm.host("t", 0, 0)
    append(rm, txn_batch(1, 2))

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(txn_index_module.os, "open", full_disk)
    assert marker(rm, 1, commit=False).error == ErrorCode.none
    monkeypatch.undo()
    return rm, p


def test_a_failing_index_write_keeps_the_marker_and_the_entry_in_memory(tmp_path, monkeypatch):
    rm, p = abort_while_the_disk_is_full(tmp_path, monkeypatch)
    assert p.log.aborted_ranges(0, 10) == [AbortedTxn(1, 0, 2)] and p.last_stable_offset == 3
    assert not (tmp_path / "t-0" / "00000000000000000000.txnindex").exists()
    rm = restart(rm, tmp_path)  # the replay writes the entry
    assert rm.partition("t", 0).log.aborted_ranges(0, 10) == [AbortedTxn(1, 0, 2)]
    assert (tmp_path / "t-0" / "00000000000000000000.txnindex").stat().st_size == ENTRY_SIZE

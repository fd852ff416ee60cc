"""Idempotent-producer rules of one partition, as Kafka's ProducerStateManager applies them."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pykbroker.cluster.producer_ids import (
    PRODUCER_ID_BLOCK_SIZE,
    ProducerIdAllocator,
    ProducerRegistry,
)
from pykbroker.log.producer_state import (
    INT32_MAX,
    INVALID_PRODUCER_EPOCH,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    DuplicateBatch,
    ProducerStateError,
    ProducerStateManager,
    in_sequence,
)
from pykbroker.log.config import LogConfig
from pykbroker.log.partition_log import PartitionLog
from pykbroker.protocol.records import TIMESTAMP_TYPE_MASK, BatchHeader, build_batch, read_header, validate_batches


def header(pid: int, epoch: int, seq: int, count: int = 1, *, offset: int = 0, ts: int = 1_000, attributes: int = 0) -> BatchHeader:
    records = [(None, b"v%d" % i) for i in range(count)]
    return read_header(
        build_batch(records, base_offset=offset, timestamp_ms=ts, producer_id=pid, producer_epoch=epoch,
                    base_sequence=seq, attributes=attributes)
    )


class Partition:
    """Drives a ProducerStateManager the way a partition log does: check, assign offsets, update."""

    def __init__(self) -> None:
        self.state = ProducerStateManager()
        self.log: list[BatchHeader] = []
        self.end = 0

    def produce(self, *batches: tuple[int, int, int, int]) -> DuplicateBatch | None:
        """Each batch is (producer id, epoch, base sequence, record count)."""
        headers = [header(pid, epoch, seq, count) for pid, epoch, seq, count in batches]
        duplicate = self.state.check_batches(headers)
        if duplicate is not None:
            return duplicate
        for h in headers:
            appended = h._replace(base_offset=self.end)
            self.end = appended.next_offset
            self.log.append(appended)
            self.state.update(appended, -1)
        return None


def error_of(call) -> int:
    with pytest.raises(ProducerStateError) as caught:
        call()
    return caught.value.error_code


def test_in_order_batches_are_accepted_and_recorded():
    p = Partition()
    assert p.produce((7, 0, 0, 3)) is None
    assert p.produce((7, 0, 3, 2)) is None
    entry = p.state.entry(7)
    assert entry.epoch == 0 and entry.last_seq == 4
    assert p.state.next_offset == 5


def test_retry_returns_the_original_offsets_and_appends_nothing():
    p = Partition()
    p.produce((7, 0, 0, 3))  # offsets 0-2
    p.produce((9, 0, 0, 1))  # offset 3, another producer in between
    p.produce((7, 0, 3, 2))  # offsets 4-5
    assert p.produce((7, 0, 0, 3)) == DuplicateBatch(0, 2, -1)
    assert p.produce((7, 0, 3, 2)) == DuplicateBatch(4, 5, -1)
    assert p.end == 6


def test_retry_of_a_log_append_time_batch_reports_the_original_append_time():
    state = ProducerStateManager()
    h = header(3, 0, 0, 2, attributes=TIMESTAMP_TYPE_MASK)
    state.update(h._replace(base_offset=40), 123_456)
    assert state.check(h) == DuplicateBatch(40, 41, 123_456)


def test_duplicate_anywhere_in_a_records_field_answers_the_whole_field():
    p = Partition()
    p.produce((7, 0, 0, 1))
    p.produce((7, 0, 1, 1))
    # Kafka returns the first duplicate found, even if an earlier batch of the same field is new.
    assert p.produce((8, 0, 0, 1), (7, 0, 1, 1)) == DuplicateBatch(1, 1, -1)
    assert p.state.entry(8) is None


def test_only_the_last_five_batches_are_remembered():
    p = Partition()
    for seq in range(6):
        p.produce((7, 0, seq, 1))
    assert p.produce((7, 0, 1, 1)) == DuplicateBatch(1, 1, -1)
    # The first batch fell out of the cache: a retry of it now looks like a sequence going backwards.
    assert error_of(lambda: p.produce((7, 0, 0, 1))) == OUT_OF_ORDER_SEQUENCE_NUMBER


def test_a_gap_in_sequence_is_out_of_order():
    p = Partition()
    p.produce((7, 0, 0, 2))
    assert error_of(lambda: p.produce((7, 0, 3, 1))) == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert error_of(lambda: p.produce((7, 0, 1, 1))) == OUT_OF_ORDER_SEQUENCE_NUMBER  # overlaps, not a duplicate
    assert p.end == 2


def test_a_stale_epoch_is_fenced_even_for_a_retry():
    p = Partition()
    p.produce((7, 0, 0, 1))
    p.produce((7, 1, 0, 1))
    assert error_of(lambda: p.produce((7, 0, 1, 1))) == INVALID_PRODUCER_EPOCH
    assert error_of(lambda: p.produce((7, 0, 0, 1))) == INVALID_PRODUCER_EPOCH


def test_a_new_epoch_must_restart_at_sequence_zero():
    p = Partition()
    p.produce((7, 0, 0, 5))
    assert error_of(lambda: p.produce((7, 1, 5, 1))) == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert p.produce((7, 1, 0, 1)) is None
    entry = p.state.entry(7)
    assert entry.epoch == 1 and len(entry.batches) == 1  # the old epoch's batches are forgotten


def test_sequence_wraps_after_int32_max():
    assert in_sequence(INT32_MAX, 0)
    assert not in_sequence(INT32_MAX - 1, 0)
    p = Partition()
    p.produce((7, 0, INT32_MAX - 1, 2))  # sequences 2**31-2 and 2**31-1
    assert p.produce((7, 0, 0, 3)) is None  # wraps to 0
    assert p.produce((7, 0, 3, 1)) is None
    # A batch that itself straddles the wrap ends at a small last sequence.
    q = Partition()
    q.produce((5, 0, INT32_MAX, 3))
    assert q.state.entry(5).last_seq == 1
    assert q.produce((5, 0, INT32_MAX, 3)) == DuplicateBatch(0, 2, -1)
    assert q.produce((5, 0, 2, 1)) is None


def test_unknown_producer_is_accepted_at_any_sequence():
    # KIP-360 / Kafka 3.x: no state for the producer (new, or expired) means no sequence to check against.
    p = Partition()
    assert p.produce((7, 3, 42, 2)) is None
    assert p.produce((7, 3, 44, 1)) is None
    assert error_of(lambda: p.produce((7, 3, 50, 1))) == OUT_OF_ORDER_SEQUENCE_NUMBER


def test_batches_of_one_field_are_checked_in_order():
    p = Partition()
    p.produce((7, 0, 0, 1))
    assert p.produce((7, 0, 1, 2), (7, 0, 3, 1)) is None
    assert p.state.entry(7).last_seq == 3
    before = p.state.snapshot()
    assert error_of(lambda: p.produce((7, 0, 4, 1), (7, 0, 6, 1))) == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert error_of(lambda: p.produce((7, 1, 0, 1), (7, 0, 5, 1))) == INVALID_PRODUCER_EPOCH
    assert p.state.snapshot() == before  # checking changes nothing


def test_batches_without_producer_id_pass_through():
    state = ProducerStateManager()
    plain = read_header(build_batch([(None, b"x")]))
    assert state.check(plain) is None
    state.update(plain._replace(base_offset=10), -1)
    assert len(state) == 0 and state.next_offset == 11


def test_expire_drops_idle_producers_by_their_last_batch_timestamp():
    state = ProducerStateManager()
    state.update(header(1, 0, 0, ts=1_000), -1)
    state.update(header(2, 0, 0, ts=5_000, offset=1), -1)
    assert state.expire(now_ms=10_000, expiration_ms=6_000) == 1
    assert state.producer_ids() == [2]
    # An expired producer is unknown again, so any sequence is accepted.
    assert state.check(header(1, 0, 17)) is None


def test_expire_boundary_is_inclusive():
    state = ProducerStateManager()
    state.update(header(1, 0, 0, ts=1_000), -1)
    assert state.expire(now_ms=1_999, expiration_ms=1_000) == 0
    assert state.expire(now_ms=2_000, expiration_ms=1_000) == 1


def test_snapshot_round_trip_then_replay_the_tail():
    p = Partition()
    for seq in range(0, 12, 2):
        p.produce((7, 0, seq, 2))
    p.produce((8, 2, 0, 1))
    restored = ProducerStateManager()
    restored.load_snapshot(p.state.snapshot(), p.state.next_offset)
    assert restored.snapshot() == p.state.snapshot()
    assert restored.check(header(7, 0, 10, 2)) == DuplicateBatch(10, 11, -1)
    tail = header(8, 2, 1, offset=restored.next_offset)
    restored.replay([tail])
    assert restored.entry(8).last_seq == 1


# --------------------------------------------------------------------------------------------------
# Properties: any accepted history, replayed from the log, gives the same answers.

produce_steps = st.lists(
    st.tuples(
        st.integers(0, 3),  # producer id
        st.sampled_from(["next", "retry", "bump", "gap", "stale"]),
        st.integers(1, 4),  # records in the batch
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(produce_steps)
def test_rebuild_from_the_log_restores_the_same_state(steps):
    p = Partition()
    known: dict[int, tuple[int, int]] = {}  # pid -> (epoch, next sequence), the producer's own view
    sent: dict[int, list[tuple[int, int, int]]] = {}  # pid -> batches sent in the current epoch
    for pid, action, count in steps:
        epoch, next_seq = known.get(pid, (0, 0))
        if action == "retry" and sent.get(pid):
            e, seq, n = sent[pid][-1]
            assert isinstance(p.produce((pid, e, seq, n)), DuplicateBatch)
            continue
        if action == "bump" and pid in known:
            epoch, next_seq = epoch + 1, 0
            sent[pid] = []
        if action == "gap" and pid in known:
            assert error_of(lambda: p.produce((pid, epoch, next_seq + 1, count))) == OUT_OF_ORDER_SEQUENCE_NUMBER
            continue
        if action == "stale" and pid in known and epoch > 0:
            assert error_of(lambda: p.produce((pid, epoch - 1, 0, count))) == INVALID_PRODUCER_EPOCH
            continue
        assert p.produce((pid, epoch, next_seq, count)) is None
        sent.setdefault(pid, []).append((epoch, next_seq, count))
        known[pid] = (epoch, next_seq + count)

    rebuilt = ProducerStateManager()
    rebuilt.rebuild(p.log)
    assert rebuilt.snapshot() == p.state.snapshot()
    for pid, batches in sent.items():
        for epoch, seq, count in batches[-5:]:
            probe = header(pid, epoch, seq, count)
            assert rebuilt.check(probe) == p.state.check(probe)
            assert rebuilt.check(probe) is not None


# --------------------------------------------------------------------------------------------------
# Producer ids: unique across restarts; InitProducerId as Kafka answers it without transactions.


def test_producer_ids_increase_and_continue_after_the_reserved_block(tmp_path):
    path = tmp_path / "producer-id-block"
    first = ProducerIdAllocator(path)
    ids = [first.allocate() for _ in range(3)]
    assert ids == [0, 1, 2]
    assert path.read_text() == "0\n1\n0 999\n"  # Kafka's checkpoint format: version, count, "start end"
    # A crash mid-block: nothing else is written; the restarted allocator skips the rest of the block.
    second = ProducerIdAllocator(path)
    assert second.allocate() == PRODUCER_ID_BLOCK_SIZE
    assert ProducerIdAllocator(path).allocate() == 2 * PRODUCER_ID_BLOCK_SIZE


def test_producer_ids_cross_block_boundaries_on_disk(tmp_path):
    path = tmp_path / "ids"
    allocator = ProducerIdAllocator(path, block_size=10)
    ids = [allocator.allocate() for _ in range(25)]
    assert ids == list(range(25))
    assert path.read_text().splitlines()[-1] == "20 29"
    assert ProducerIdAllocator(path, block_size=10).allocate() == 30


def test_a_torn_reservation_leaves_the_previous_block_in_force(tmp_path):
    path = tmp_path / "ids"
    ProducerIdAllocator(path).allocate()
    # A crash between writing the temporary file and renaming it leaves junk beside the real file.
    (tmp_path / "ids.tmp").write_bytes(b"0\n1\n1000 19")
    assert ProducerIdAllocator(path).allocate() == 1000


def test_an_unreadable_block_file_refuses_to_start_rather_than_reuse_ids(tmp_path):
    path = tmp_path / "ids"
    for junk in (b"garbage", b"0\n1\nnot-a-number 5\n", b"0\n1\n0 -7\n"):
        path.write_bytes(junk)
        with pytest.raises(ValueError):
            ProducerIdAllocator(path)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 25), min_size=1, max_size=8))
def test_producer_ids_are_never_reused_across_restarts(tmp_path_factory, runs):
    path = tmp_path_factory.mktemp("ids") / "block"
    seen: list[int] = []
    for count in runs:  # each run is one broker lifetime that ends in a crash
        allocator = ProducerIdAllocator(path, block_size=7)
        seen.extend(allocator.allocate() for _ in range(count))
    assert seen == sorted(set(seen))


def test_init_producer_id_without_transactional_id_always_gives_a_new_id_at_epoch_zero(tmp_path):
    registry = ProducerRegistry(ProducerIdAllocator(tmp_path / "ids"))
    assert asyncio.run(registry.init_producer_id(None)) == (0, 0, 0)
    # KIP-360 re-init with the current id and epoch: Kafka ignores them for non-transactional producers.
    assert asyncio.run(registry.init_producer_id(None, producer_id=0, producer_epoch=4)) == (0, 1, 0)


def test_transactional_ids_are_the_transaction_coordinators(tmp_path):
    registry = ProducerRegistry(ProducerIdAllocator(tmp_path / "ids"))
    with pytest.raises(ValueError):
        asyncio.run(registry.init_producer_id("tx-1"))
    assert asyncio.run(registry.new_id()) == (0, 0)  # the coordinator's ids come from the same blocks
    assert asyncio.run(registry.init_producer_id(None))[1] == 1


def test_rebuild_from_a_real_partition_log_after_restart(tmp_path):
    directory = tmp_path / "orders-0"
    log = PartitionLog.open(directory, LogConfig(message_timestamp_type="LogAppendTime"), fsync="never")
    state = ProducerStateManager()
    for pid, epoch, seq, count in [(7, 0, 0, 3), (9, 0, 0, 1), (7, 0, 3, 2), (7, 1, 0, 1)]:
        records = build_batch([(None, b"x")] * count, producer_id=pid, producer_epoch=epoch, base_sequence=seq)
        assert state.check_batches(validate_batches(records)) is None
        result = log.append(records, leader_epoch=0, now_ms=50_000 + seq)
        for appended in result.headers:
            state.update(appended, result.log_append_time_ms)
    log.close()

    reopened = PartitionLog.open(directory, LogConfig(message_timestamp_type="LogAppendTime"), fsync="never")
    try:
        rebuilt = ProducerStateManager()
        rebuilt.rebuild(header for header, _ in reopened.batches(reopened.log_start_offset))
        assert rebuilt.snapshot() == state.snapshot()
        assert rebuilt.check(header(9, 0, 0, 1)) == DuplicateBatch(3, 3, 50_000)
        assert rebuilt.check(header(7, 1, 0, 1)) == DuplicateBatch(6, 6, 50_000)
        assert error_of(lambda: rebuilt.check(header(7, 0, 5, 1))) == INVALID_PRODUCER_EPOCH
    finally:
        reopened.close()

"""Replication state (pykbroker/replication/partition.py) and the purgatory, on real logs and a manual clock.

The rules come from Kafka 3.7's Partition / Replica / DelayedProduce (ZooKeeper mode); each test names the
rule it pins down.
"""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from pykbroker.log.checkpoint import CorruptFile
from pykbroker.log.config import LogConfig
from pykbroker.log.manager import LogManager
from pykbroker.log.partition_log import PartitionLog
from pykbroker.protocol.apis import codec_for
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.framing import Request
from pykbroker.protocol.records import build_batch, iter_headers, read_records
from pykbroker.replication.partition import IsrChange, Partition, Role
from pykbroker.replication.purgatory import ProducePurgatory, wait_for_partitions
from pykbroker.replication.replica_manager import HWM_CHECKPOINT, ReplicaManager
from pykbroker.server.dispatch import RequestContext
from pykbroker.server.handlers.fetch import fetch as fetch_handler

LAG = 30_000
T0 = 1_700_000_000_000


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


class Port:
    """The cluster layer's AlterPartition sender, as a list of what was proposed."""

    def __init__(self) -> None:
        self.proposed: list[IsrChange] = []

    def submit(self, partition: Partition, change: IsrChange) -> None:
        self.proposed.append(change)


def batch(count: int, ts: int = T0) -> bytearray:
    return build_batch([(None, b"v%d" % i) for i in range(count)], timestamp_ms=ts)


def leader_partition(tmp_path: Path, clock: Clock, *, isr=(1, 2, 3), replicas=(1, 2, 3), epoch: int = 1,
                     port: Port | None = None, records: int = 0) -> Partition:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    partition = Partition("t", 0, log, broker_id=1, replica_lag_time_max_ms=LAG, alter_partition=port)
    if records:
        log.append(batch(records), leader_epoch=0, now_ms=clock())
    assert partition.become_leader(epoch, isr, replicas, 0, now_ms=clock()) == ErrorCode.none
    return partition


def fetched(partition: Partition, replica: int, offset: int, clock: Clock) -> None:
    """What the fetch path does for a follower's fetch at ``offset`` (the leader's log end read first)."""
    assert partition.follower_fetch_error(replica, -1) == ErrorCode.none
    partition.update_follower_fetch_state(replica, offset, 0, clock(), partition.log.log_end_offset)


# -- the leader's high-water mark -------------------------------------------------------------------------

def test_hwm_is_the_smallest_log_end_over_the_isr(tmp_path):
    clock = Clock()
    p = leader_partition(tmp_path, clock)
    p.append(batch(10), clock())
    assert p.log.log_end_offset == 10
    assert p.high_watermark == 0  # new leader: followers' log ends are unknown
    fetched(p, 2, 10, clock)
    assert p.high_watermark == 0  # follower 3 still unknown
    fetched(p, 3, 4, clock)
    assert p.high_watermark == 4
    fetched(p, 3, 7, clock)
    assert p.high_watermark == 7
    fetched(p, 2, 10, clock)  # nothing new from 2
    fetched(p, 3, 10, clock)
    assert p.high_watermark == 10


def test_hwm_never_moves_backwards(tmp_path):
    clock = Clock()
    p = leader_partition(tmp_path, clock)
    p.append(batch(10), clock())
    fetched(p, 2, 8, clock)
    fetched(p, 3, 9, clock)
    assert p.high_watermark == 8
    fetched(p, 2, 3, clock)  # a follower that truncated and refetches lower
    assert p.high_watermark == 8
    # A new epoch with the same leader keeps what it knew of the followers (Kafka: not a new leader).
    assert p.become_leader(2, (1, 2, 3), (1, 2, 3), 1, now_ms=clock()) == ErrorCode.none
    assert p.high_watermark == 8 and p.follower_state(2).log_end_offset == 3
    # Leading again after following forgets them (log ends unknown, -1): the HWM still stays where it was.
    assert p.become_follower(2, 3, (1, 2, 3), (1, 2, 3), 2) == ErrorCode.none
    assert p.become_leader(4, (1, 2, 3), (1, 2, 3), 3, now_ms=clock()) == ErrorCode.none
    assert p.follower_state(2).log_end_offset == -1 and p.high_watermark == 8
    fetched(p, 2, 9, clock)
    fetched(p, 3, 9, clock)
    assert p.high_watermark == 9


def test_caught_up_follower_outside_the_isr_holds_the_hwm_and_a_lagging_one_does_not(tmp_path):
    clock = Clock()
    p = leader_partition(tmp_path, clock, isr=(1, 2))
    p.append(batch(10), clock())
    fetched(p, 2, 10, clock)
    assert p.high_watermark == 10  # 3 is outside the ISR and never caught up (last caught up time 0)
    p.append(batch(5), clock())
    fetched(p, 3, 15, clock)  # 3 caught up with the log end: it is about to join, so it now counts
    fetched(p, 2, 12, clock)
    assert p.high_watermark == 12
    p.append(batch(5), clock())  # log end 20
    fetched(p, 2, 20, clock)
    assert p.high_watermark == 15  # 3, caught up 0 ms ago, holds the HWM at its log end
    clock.advance(LAG + 1)
    p.append(batch(1), clock())
    fetched(p, 2, 21, clock)
    assert p.high_watermark == 21  # 3 lagged longer than replica.lag.time.max.ms: no longer waited for


def test_single_broker_hwm_is_the_log_end_at_once_and_nothing_shrinks(tmp_path):
    clock = Clock()
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    p = Partition("t", 0, log, broker_id=1, alter_partition=Port())
    p.init_single_broker(0)
    for n in range(3):
        p.append(batch(4), clock())
        assert p.high_watermark == 4 * (n + 1)
    clock.advance(10 * LAG)
    assert p.isr_shrink_candidates(clock()) == ()
    assert p.maybe_shrink_isr(clock()) is None
    assert p.check_enough_replicas_reach_offset(12, 1) == (True, ErrorCode.none)
    # Joined by followers (cluster mode): what was exposed stays exposed, what follows waits for the ISR.
    assert p.become_leader(1, (1, 2), (1, 2), 0, now_ms=clock()) == ErrorCode.none
    assert p.high_watermark == 12
    p.append(batch(3), clock())
    assert p.high_watermark == 12
    fetched(p, 2, 15, clock)
    assert p.high_watermark == 15


# -- ISR decisions ----------------------------------------------------------------------------------------

def test_shrink_candidates_after_replica_lag_time_max_ms(tmp_path):
    clock = Clock()
    port = Port()
    p = leader_partition(tmp_path, clock, port=port)
    p.append(batch(10), clock())
    fetched(p, 2, 10, clock)
    fetched(p, 3, 10, clock)
    p.append(batch(10), clock())
    clock.advance(LAG)
    fetched(p, 2, 20, clock)
    assert p.isr_shrink_candidates(clock()) == ()  # 3 caught up exactly replica.lag.time.max.ms ago
    clock.advance(1)
    assert p.isr_shrink_candidates(clock()) == (3,)
    change = p.maybe_shrink_isr(clock())
    assert change == IsrChange("t", 0, 1, 1, 0, (1, 2), removed=(3,))
    assert port.proposed == [change]
    # In flight: nothing more is proposed, and the maximal ISR is still the committed one (3 holds the HWM).
    assert p.isr_shrink_candidates(clock()) == ()
    assert p.maximal_isr == (1, 2, 3)
    assert p.high_watermark == 10
    p.isr_change_committed((1, 2), 1, now_ms=clock())
    assert (p.isr, p.partition_epoch, p.pending_isr_change) == ((1, 2), 1, None)
    assert p.high_watermark == 20  # 3 is out and lagging: the HWM follows the ISR


def test_a_follower_that_keeps_fetching_behind_a_busy_leader_stays_in_sync(tmp_path):
    """lastCaughtUpTimeMs moves to the previous fetch's time when this fetch reached the log end seen then."""
    clock = Clock()
    p = leader_partition(tmp_path, clock)
    fetched(p, 3, 0, clock)
    for _ in range(10):
        p.append(batch(5), clock())
        clock.advance(LAG // 3)
        fetched(p, 2, p.log.log_end_offset, clock)
        fetched(p, 3, p.log.log_end_offset - 5, clock)  # always one batch behind, never at the end
    assert p.isr_shrink_candidates(clock()) == ()
    clock.advance(LAG + 1)
    assert p.isr_shrink_candidates(clock()) == (3,)


def test_expand_candidate_needs_the_hwm_and_the_leader_epoch_start(tmp_path):
    clock = Clock()
    port = Port()
    p = leader_partition(tmp_path, clock, isr=(1, 2), port=port, epoch=1)
    p.append(batch(10), clock())
    fetched(p, 2, 6, clock)
    assert p.high_watermark == 6
    # Re-elected in epoch 2 (ISR 1, 2): the epoch starts at the log end, 10, above the HWM.
    assert p.become_leader(2, (1, 2), (1, 2, 3), 1, now_ms=clock()) == ErrorCode.none
    assert p.leader_epoch_start_offset == 10
    assert p.log.leader_epochs[-1] == (2, 10)  # in the epoch cache before anything is written in it
    assert p.high_watermark_lags_epoch_start
    fetched(p, 3, 6, clock)  # at the HWM, but short of this epoch's start: it could miss committed data
    assert not p.is_expand_candidate(3) and port.proposed == []
    fetched(p, 3, 9, clock)
    assert port.proposed == []
    fetched(p, 3, 10, clock)
    assert port.proposed == [IsrChange("t", 0, 1, 2, 1, (1, 2, 3), added=(3,))]
    # Pending expansion: the maximal ISR includes 3 at once, so it holds the HWM from now on.
    assert p.maximal_isr == (1, 2, 3) and p.isr == (1, 2)
    p.append(batch(5), clock())
    fetched(p, 2, 15, clock)
    assert p.high_watermark == 10
    assert p.isr_expand_candidates() == ()  # one change in flight at a time
    assert not p.high_watermark_lags_epoch_start
    p.isr_change_committed((1, 2, 3), 2, now_ms=clock())
    assert p.isr == (1, 2, 3) and p.pending_isr_change is None
    fetched(p, 3, 15, clock)
    assert p.high_watermark == 15


def test_a_failed_isr_change_goes_back_to_the_committed_isr(tmp_path):
    clock = Clock()
    port = Port()
    p = leader_partition(tmp_path, clock, port=port)
    clock.advance(LAG + 1)
    assert p.maybe_shrink_isr(clock()).isr == (1,)
    p.isr_change_failed()
    assert p.isr == (1, 2, 3) and p.pending_isr_change is None
    assert p.isr_shrink_candidates(clock()) == (2, 3)


# -- LeaderAndIsr epochs ----------------------------------------------------------------------------------

def test_older_or_equal_leader_epochs_are_ignored_as_stale(tmp_path):
    clock = Clock()
    p = leader_partition(tmp_path, clock, epoch=5)
    assert p.become_leader(5, (1,), (1, 2, 3), 9, now_ms=clock()) == ErrorCode.stale_controller_epoch
    assert p.become_leader(4, (1,), (1, 2, 3), 9, now_ms=clock()) == ErrorCode.stale_controller_epoch
    assert p.become_follower(2, 5, (2,), (1, 2, 3), 9) == ErrorCode.stale_controller_epoch
    assert (p.role, p.leader_epoch, p.isr, p.partition_epoch) == (Role.LEADER, 5, (1, 2, 3), 0)
    assert p.become_follower(2, 6, (2, 3), (1, 2, 3), 9) == ErrorCode.none
    assert (p.role, p.leader_id, p.leader_epoch, p.isr, p.partition_epoch) == (Role.FOLLOWER, 2, 6, (2, 3), 9)
    assert p.follower_fetch_error(3, -1) == ErrorCode.not_leader_or_follower
    assert p.become_leader(6, (1,), (1, 2, 3), 10, now_ms=clock()) == ErrorCode.stale_controller_epoch
    assert p.become_leader(7, (1, 3), (1, 2, 3), 10, now_ms=clock()) == ErrorCode.none
    assert p.role is Role.LEADER and p.leader_epoch == 7


def test_fetch_from_a_replica_that_is_not_assigned(tmp_path):
    clock = Clock()
    p = leader_partition(tmp_path, clock, replicas=(1, 2, 3))
    assert p.follower_fetch_error(2, 1) == ErrorCode.none
    assert p.follower_fetch_error(4, -1) == ErrorCode.not_leader_or_follower
    assert p.follower_fetch_error(4, 1) == ErrorCode.unknown_leader_epoch


# -- follower side ----------------------------------------------------------------------------------------

def test_follower_hwm_comes_from_the_leader_bounded_by_its_log_and_truncation(tmp_path):
    clock = Clock()
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    p = Partition("t", 0, log, broker_id=2, high_watermark=50)
    assert p.high_watermark == 0  # a checkpoint above the log end is bounded by it
    assert p.become_follower(1, 3, (1, 2), (1, 2), 0) == ErrorCode.none
    leader_batches = bytearray(build_batch([(None, b"a")] * 5, timestamp_ms=T0, partition_leader_epoch=3))
    assert p.append_as_follower(leader_batches, now_ms=clock()).last_offset == 4
    assert p.update_high_watermark_from_leader(9) and p.high_watermark == 5
    p.update_high_watermark_from_leader(3)
    assert p.high_watermark == 3
    p.truncate_to(2)
    assert (p.log.log_end_offset, p.high_watermark) == (2, 2)


# -- the purgatory ----------------------------------------------------------------------------------------

def test_delayed_produce_completes_when_the_hwm_reaches_the_batch(tmp_path):
    clock = Clock()
    purgatory = ProducePurgatory(clock)
    p = leader_partition(tmp_path, clock)
    outcome = p.append(batch(10), clock())
    op = purgatory.watch([(p, outcome.last_offset + 1, 2)], 30_000)
    assert not op.completed and len(purgatory) == 1
    fetched(p, 2, 10, clock)
    fetched(p, 3, 9, clock)
    assert not op.completed
    fetched(p, 3, 10, clock)
    assert op.completed and op.results == [ErrorCode.none]
    assert len(purgatory) == 0 and p.delayed_produces == []


def test_delayed_produce_times_out(tmp_path):
    clock = Clock()
    purgatory = ProducePurgatory(clock)
    p = leader_partition(tmp_path, clock)
    q = leader_partition(tmp_path / "q", clock)
    a = p.append(batch(3), clock())
    b = q.append(batch(3), clock())
    for f in (2, 3):
        fetched(q, f, 3, clock)  # q is replicated at once, p never is
    op = purgatory.watch([(p, a.last_offset + 1, 1), (q, b.last_offset + 1, 1)], 1_000)
    assert op.completed is False
    clock.advance(999)
    assert purgatory.expire_due() == 0
    clock.advance(1)
    assert purgatory.expire_due() == 1
    assert op.results == [ErrorCode.request_timed_out, ErrorCode.none]
    assert p.delayed_produces == [] and len(purgatory) == 0


def test_delayed_produce_not_enough_replicas_after_append(tmp_path):
    clock = Clock()
    purgatory = ProducePurgatory(clock)
    port = Port()
    p = leader_partition(tmp_path, clock, isr=(1, 2), replicas=(1, 2), port=port)
    outcome = p.append(batch(2), clock())
    op = purgatory.watch([(p, outcome.last_offset + 1, 2)], 30_000)
    clock.advance(LAG + 1)
    p.maybe_shrink_isr(clock())
    assert not op.completed  # a pending shrink does not count yet
    p.isr_change_committed((1,), 1, now_ms=clock())
    assert op.completed and op.results == [ErrorCode.not_enough_replicas_after_append]


def test_delayed_produce_answers_not_leader_when_leadership_moves(tmp_path):
    clock = Clock()
    purgatory = ProducePurgatory(clock)
    p = leader_partition(tmp_path, clock)
    outcome = p.append(batch(2), clock())
    op = purgatory.watch([(p, outcome.last_offset + 1, 1)], 30_000)
    p.become_follower(2, 2, (2, 3), (1, 2, 3), 1)
    assert op.results == [ErrorCode.not_leader_or_follower]


def test_consumers_long_poll_wakes_on_hwm_moves_followers_on_log_end_moves(tmp_path):
    clock = Clock()
    p = leader_partition(tmp_path, clock)

    async def scenario():
        consumer = asyncio.ensure_future(wait_for_partitions([p], 60, follower=False))
        follower = asyncio.ensure_future(wait_for_partitions([p], 60, follower=True))
        await asyncio.sleep(0)
        p.append(batch(2), clock())
        await asyncio.wait_for(follower, 5)
        assert not consumer.done()  # an append moves the log end, not the HWM
        assert p._hwm_waiters  # the consumer is still parked
        fetched(p, 2, 2, clock)
        assert p._hwm_waiters and not consumer.done()
        fetched(p, 3, 2, clock)  # the HWM moves
        await asyncio.wait_for(consumer, 5)

    asyncio.run(scenario())


def test_purgatory_wait_arms_a_timer_and_cleans_up(tmp_path):
    clock = Clock()
    purgatory = ProducePurgatory(clock)
    p = leader_partition(tmp_path, clock)
    outcome = p.append(batch(1), clock())

    async def scenario():
        op = purgatory.watch([(p, outcome.last_offset + 1, 1)], 0)  # deadline now: the timer fires at once
        return await asyncio.wait_for(purgatory.wait(op), 5)

    assert asyncio.run(scenario()) == [ErrorCode.request_timed_out]
    assert p.delayed_produces == []


# -- the checkpoint ---------------------------------------------------------------------------------------

def _manager(data_dir: Path, clock: Clock, broker_id: int = 1) -> ReplicaManager:
    return ReplicaManager(LogManager(data_dir), broker_id, lambda topic: LogConfig(), clock=clock)


def test_hwm_checkpoint_round_trip_and_a_follower_starts_there(tmp_path):
    clock = Clock()
    rm = _manager(tmp_path, clock)
    p = rm.partition("t", 0) or rm.host("t", 0, 0)
    p.append(batch(7), clock())
    q = rm.host("u", 2, 0)
    q.append(batch(3), clock())
    rm.write_high_watermarks()
    assert (tmp_path / HWM_CHECKPOINT).read_text() == "0\n2\nt 0 7\nu 2 3\n"
    rm.log_manager.shutdown()

    again = _manager(tmp_path, clock, broker_id=2)
    again.log_manager.load_all(lambda topic: LogConfig())
    assert again.load_high_watermarks() == {("t", 0): 7, ("u", 2): 3}
    assert again.become_follower("t", 0, 1, 1, (1, 2), (1, 2), 0) == ErrorCode.none
    follower = again.partition("t", 0)
    assert follower.high_watermark == 7 and follower.role is Role.FOLLOWER
    again.log_manager.shutdown()


def test_a_garbage_checkpoint_is_refused_with_one_line(tmp_path):
    (tmp_path / HWM_CHECKPOINT).write_text("0\n1\nt zero 5\n")
    rm = _manager(tmp_path, Clock())
    with pytest.raises(CorruptFile) as caught:
        rm.load_high_watermarks()
    message = str(caught.value)
    assert "\n" not in message and str(tmp_path / HWM_CHECKPOINT) in message and "delete it" in message
    (tmp_path / HWM_CHECKPOINT).write_bytes(b"\xff\xfe garbage")
    rm._checkpointed_hwms = None
    with pytest.raises(CorruptFile):
        rm.load_high_watermarks()
    rm.log_manager.shutdown()


# -- two brokers: a follower fetching through the real fetch path -----------------------------------------

def _broker(rm: ReplicaManager) -> SimpleNamespace:
    return SimpleNamespace(replicas=rm, stats=None, txn_verifier=None, metadata=SimpleNamespace(topic=lambda name: SimpleNamespace(name=name)))


def _follower_fetch(leader_rm: ReplicaManager, replica_id: int, offset: int, leader_epoch: int = -1):
    from kio.schema.fetch.v12 import request as fr

    body = fr.FetchRequest(
        cluster_id=None, replica_id=replica_id, max_wait=datetime.timedelta(0), min_bytes=1, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
        topics=(fr.FetchTopic(topic="t", partitions=(fr.FetchPartition(
            partition=0, current_leader_epoch=leader_epoch, fetch_offset=offset, last_fetched_epoch=-1,
            log_start_offset=0, partition_max_bytes=1 << 20,
        ),)),),
        forgotten_topics_data=(),
    )
    request = Request(1, 12, 7, "follower", None, body, codec_for(1, 12))
    response = fetch_handler(RequestContext(_broker(leader_rm), request, "test"), body)
    data = response.responses[0].partitions[0]
    records = b"".join(data.records.chunks(1 << 16)) if data.records else b""
    return data.error_code, data.high_watermark, records


def test_follower_fetches_and_appends_and_the_leader_completes_an_acks_all_produce(tmp_path):
    clock = Clock()
    leader_rm = _manager(tmp_path / "b1", clock, broker_id=1)
    follower_rm = _manager(tmp_path / "b2", clock, broker_id=2)
    assert leader_rm.become_leader("t", 0, 1, (2, 3), (2, 3), 0) == ErrorCode.unknown_topic_or_partition
    assert leader_rm.partition("t", 0) is None  # not a replica here: nothing created
    assert leader_rm.become_leader("t", 0, 1, (1, 2), (1, 2), 0) == ErrorCode.none
    assert leader_rm.become_leader("t", 0, 1, (1, 2), (1, 2), 0) == ErrorCode.stale_controller_epoch
    assert follower_rm.become_follower("t", 0, 1, 1, (1, 2), (1, 2), 0) == ErrorCode.none
    leader, follower = leader_rm.partition("t", 0), follower_rm.partition("t", 0)

    outcome = leader_rm.append("t", 0, batch(5), acks=-1, min_insync_replicas=2)
    assert outcome.error == ErrorCode.none and outcome.last_offset == 4
    assert leader_rm.needs_replication_wait("t", 0, outcome, 2)
    op = leader_rm.delay_produce([("t", 0, outcome.last_offset, 2)], 30_000)
    assert not op.completed and leader.high_watermark == 0

    # A stranger is refused; the follower reads to the log end (past the HWM, unlike a consumer).
    assert _follower_fetch(leader_rm, 3, 0)[0] == ErrorCode.not_leader_or_follower
    assert _follower_fetch(leader_rm, 3, 0, leader_epoch=1)[0] == ErrorCode.unknown_leader_epoch
    error, hwm, records = _follower_fetch(leader_rm, 2, 0, leader_epoch=1)
    assert (error, hwm) == (ErrorCode.none, 0)
    assert [h.base_offset for h in iter_headers(records)] == [0]
    follower.append_as_follower(records, now_ms=clock())
    follower.update_high_watermark_from_leader(hwm)
    assert follower.log.log_end_offset == 5 and not op.completed

    # The next fetch, at the follower's new log end, moves the leader's HWM: the produce completes.
    error, hwm, records = _follower_fetch(leader_rm, 2, 5, leader_epoch=1)
    assert (error, hwm, records) == (ErrorCode.none, 5, b"")
    assert op.completed and op.results == [ErrorCode.none]
    follower.update_high_watermark_from_leader(hwm)
    assert follower.high_watermark == 5
    header = next(iter_headers(follower.log.read(0, 1 << 20).read_bytes()))
    assert header.partition_leader_epoch == 1
    values = [r.value for r in read_records(follower.log.read(0, 1 << 20).read_bytes(), header)]
    assert values == [b"v%d" % i for i in range(5)]
    # The follower refuses produces; consumers of the leader see everything now.
    assert follower_rm.append("t", 0, batch(1), acks=1, min_insync_replicas=1).error == ErrorCode.not_leader_or_follower
    leader_rm.log_manager.shutdown()
    follower_rm.log_manager.shutdown()


def _produce(leader_rm: ReplicaManager, timeout_ms: int, acks: int = -1):
    from kio.schema.produce.v9 import request as pr

    from pykbroker.server.handlers.produce import produce as produce_handler

    body = pr.ProduceRequest(
        transactional_id=None, acks=acks, timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=(pr.TopicProduceData(name="t", partition_data=(pr.PartitionProduceData(index=0, records=bytes(batch(3))),)),),
    )
    broker = _broker(leader_rm)
    broker.metadata = SimpleNamespace(topic=lambda name: SimpleNamespace(name=name, internal=False))
    broker.topics = SimpleNamespace(min_insync_replicas=lambda name: 2)
    request = Request(0, 9, 8, "producer", None, body, codec_for(0, 9))
    return produce_handler(RequestContext(broker, request, "test"), body)


def test_acks_all_produce_handler_waits_for_the_follower_and_keeps_acks_1_immediate(tmp_path):
    clock = Clock()
    leader_rm = _manager(tmp_path, clock, broker_id=1)
    leader_rm.become_leader("t", 0, 1, (1, 2), (1, 2), 0)

    async def scenario():
        quick = _produce(leader_rm, 30_000, acks=1)
        assert not asyncio.iscoroutine(quick)  # acks=1 answers at once
        assert quick.responses[0].partition_responses[0].base_offset == 0
        waiting = _produce(leader_rm, 30_000)
        assert asyncio.iscoroutine(waiting)
        task = asyncio.ensure_future(waiting)
        await asyncio.sleep(0)
        assert not task.done()
        _follower_fetch(leader_rm, 2, 6, leader_epoch=1)  # the follower has everything: the HWM passes the batch
        response = await asyncio.wait_for(task, 5)
        partition = response.responses[0].partition_responses[0]
        assert (partition.error_code, partition.base_offset) == (ErrorCode.none, 3)
        late = _produce(leader_rm, 0)  # nobody fetches it: the request's timeout ends the wait
        partition = (await asyncio.wait_for(late, 5)).responses[0].partition_responses[0]
        assert (partition.error_code, partition.base_offset) == (ErrorCode.request_timed_out, 6)

    asyncio.run(scenario())
    assert leader_rm.partition("t", 0).high_watermark == 6
    leader_rm.log_manager.shutdown()


def test_high_water_marks_are_checkpointed_periodically(tmp_path):
    clock = Clock()
    rm = _manager(tmp_path, clock)
    p = rm.host("t", 0, 0)
    path = tmp_path / HWM_CHECKPOINT

    async def until(condition, what):
        deadline = asyncio.get_running_loop().time() + 10
        while not condition():
            assert asyncio.get_running_loop().time() < deadline, what
            await asyncio.sleep(0.005)

    async def scenario():
        task = asyncio.ensure_future(rm.run_high_watermark_checkpoints(10))
        try:
            await until(lambda: path.exists() and path.read_text() == "0\n1\nt 0 0\n", "first checkpoint")
            p.append(batch(4), clock())
            await until(lambda: path.read_text() == "0\n1\nt 0 4\n", "checkpoint after the HWM moved")
        finally:
            task.cancel()

    asyncio.run(scenario())
    rm.log_manager.shutdown()

"""The leader side of replication through the real handlers (Fetch, ListOffsets, OffsetForLeaderEpoch, Produce)
on real logs: diverging epochs in fetch answers, what replicas and clients see in ListOffsets, StopReplica, the
AlterPartition port plugged in after partitions exist. Kafka 3.7's Partition / ReplicaManager are the reference."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path
from types import SimpleNamespace

from kio.schema.fetch.v16 import request as fr
from kio.schema.list_offsets.v8 import request as lr
from kio.schema.offset_for_leader_epoch.v4 import request as er

from pykbroker.log.config import LogConfig
from pykbroker.log.manager import LogManager
from pykbroker.protocol.apis import codec_for
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.framing import Request
from pykbroker.protocol.records import build_batch, iter_headers
from pykbroker.replication.partition import IsrChange, Role
from pykbroker.replication.replica_manager import ReplicaManager
from pykbroker.server.dispatch import RequestContext
from pykbroker.server.handlers.fetch import fetch as fetch_handler
from pykbroker.server.handlers.list_offsets import list_offsets as list_offsets_handler
from pykbroker.server.handlers.offset_for_leader_epoch import offset_for_leader_epoch as epoch_handler

T0 = 1_700_000_000_000
TOPIC_ID = __import__("uuid").UUID("7f3e2a55-0000-4000-8000-000000000001")


class Clock:
    now = T0

    def __call__(self) -> int:
        return self.now


def manager(path: Path, broker_id: int = 1) -> ReplicaManager:
    return ReplicaManager(LogManager(path), broker_id, lambda topic: LogConfig(), clock=Clock())


def batch(count: int, **options) -> bytearray:
    return build_batch([(None, b"v%d" % i) for i in range(count)], timestamp_ms=T0, **options)


def broker(rm: ReplicaManager) -> SimpleNamespace:
    info = SimpleNamespace(name="t", topic_id=TOPIC_ID, internal=False)
    return SimpleNamespace(replicas=rm, stats=None, metadata=SimpleNamespace(
        topic=lambda name: info if name == "t" else None, topic_by_id=lambda tid: info if tid == TOPIC_ID else None))


def call(handler, rm: ReplicaManager, api_key: int, version: int, body):
    request = Request(api_key, version, 1, "test", None, body, codec_for(api_key, version))
    return handler(RequestContext(broker(rm), request, "test"), body)


def fetch(rm: ReplicaManager, offset: int, *, replica_id: int = 2, epoch: int = -1, last_fetched_epoch: int = -1):
    body = fr.FetchRequest(
        replica_state=fr.ReplicaState(replica_id=replica_id, replica_epoch=9), max_wait=datetime.timedelta(0),
        min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
        forgotten_topics_data=(), rack_id="",
        topics=(fr.FetchTopic(topic_id=TOPIC_ID, partitions=(fr.FetchPartition(
            partition=0, current_leader_epoch=epoch, fetch_offset=offset, last_fetched_epoch=last_fetched_epoch,
            log_start_offset=0, partition_max_bytes=1 << 20),)),),
    )
    return call(fetch_handler, rm, 1, 16, body).responses[0].partitions[0]


def list_offset(rm: ReplicaManager, timestamp: int, *, replica_id: int = -1, epoch: int = -1):
    body = lr.ListOffsetsRequest(replica_id=replica_id, isolation_level=0, topics=(lr.ListOffsetsTopic(
        name="t", partitions=(lr.ListOffsetsPartition(partition_index=0, current_leader_epoch=epoch,
                                                      timestamp=timestamp),)),))
    data = call(list_offsets_handler, rm, 2, 8, body).topics[0].partitions[0]
    return data.error_code, data.offset


def epoch_end(rm: ReplicaManager, leader_epoch: int, *, replica_id: int = 2, epoch: int = -1):
    body = er.OffsetForLeaderEpochRequest(replica_id=replica_id, topics=(er.OffsetForLeaderTopic(
        topic="t", partitions=(er.OffsetForLeaderPartition(partition=0, current_leader_epoch=epoch,
                                                           leader_epoch=leader_epoch),)),))
    data = call(epoch_handler, rm, 23, 4, body).topics[0].partitions[0]
    return data.error_code, data.leader_epoch, data.end_offset


def leader_with_two_epochs(tmp_path) -> ReplicaManager:
    """Leader of t-0 (replicas 1, 2): offsets 0-4 written in epoch 1, 5-7 in epoch 3."""
    rm = manager(tmp_path)
    assert rm.become_leader("t", 0, 1, (1, 2), (1, 2), 0, topic_id=TOPIC_ID) == ErrorCode.none
    p = rm.partition("t", 0)
    p.append(batch(5), T0)
    assert rm.become_leader("t", 0, 3, (1, 2), (1, 2), 1) == ErrorCode.none
    p.append(batch(3), T0)
    return rm


def test_a_fetch_whose_last_epoch_diverged_gets_the_diverging_epoch_and_no_progress(tmp_path):
    rm = leader_with_two_epochs(tmp_path)
    p = rm.partition("t", 0)
    # A follower at 8 whose last batch is of epoch 1: epoch 1 ended at 5 here.
    data = fetch(rm, 8, epoch=3, last_fetched_epoch=1)
    assert data.error_code == ErrorCode.none and not data.records
    assert (data.diverging_epoch.epoch, data.diverging_epoch.end_offset) == (1, 5)
    assert p.follower_state(2).log_end_offset == -1  # a diverging fetch is no progress (Kafka)
    # An epoch we never had (2, between 1 and 3): the largest below it, 1, ending at 5.
    data = fetch(rm, 5, epoch=3, last_fetched_epoch=2)
    assert (data.diverging_epoch.epoch, data.diverging_epoch.end_offset) == (1, 5)
    # At 5 with epoch 1: consistent; records from 5 and the follower's progress recorded.
    data = fetch(rm, 5, epoch=3, last_fetched_epoch=1)
    assert data.diverging_epoch.epoch == -1 and data.diverging_epoch.end_offset == -1
    assert [h.base_offset for h in iter_headers(bytes(b"".join(data.records.chunks(1 << 16))))] == [5]
    assert p.follower_state(2).log_end_offset == 5
    # A last fetched epoch newer than any we know: Kafka answers OFFSET_OUT_OF_RANGE.
    assert fetch(rm, 8, epoch=3, last_fetched_epoch=4).error_code == ErrorCode.offset_out_of_range
    assert fetch(rm, 8, epoch=2, last_fetched_epoch=1).error_code == ErrorCode.fenced_leader_epoch  # checked first
    # Consumers (replica id -1) get diverging epochs too (KIP-320 validation).
    data = fetch(rm, 8, replica_id=-1, last_fetched_epoch=1)
    assert (data.diverging_epoch.epoch, data.diverging_epoch.end_offset) == (1, 5)
    rm.log_manager.shutdown()


def test_list_offsets_replicas_see_the_log_end_clients_the_hwm(tmp_path):
    rm = leader_with_two_epochs(tmp_path)
    p = rm.partition("t", 0)
    # Epoch 3 started at 5, the HWM is still 0: clients get OFFSET_NOT_AVAILABLE for LATEST (Kafka).
    assert p.high_watermark == 0 and p.high_watermark_lags_epoch_start
    assert list_offset(rm, -1) == (ErrorCode.offset_not_available, -1)
    assert list_offset(rm, -1, replica_id=2) == (ErrorCode.none, 8)  # a follower: the log end
    assert list_offset(rm, -2, replica_id=2) == (ErrorCode.none, 0)
    assert list_offset(rm, -1, replica_id=2, epoch=2) == (ErrorCode.fenced_leader_epoch, -1)
    assert list_offset(rm, -1, replica_id=2, epoch=4) == (ErrorCode.unknown_leader_epoch, -1)
    p.update_follower_fetch_state(2, 8, 0, T0, 8)
    assert p.high_watermark == 8
    assert list_offset(rm, -1) == (ErrorCode.none, 8)
    rm.log_manager.shutdown()


def test_a_follower_refuses_clients_and_offset_for_leader_epoch(tmp_path):
    rm = manager(tmp_path, broker_id=2)
    assert rm.become_follower("t", 0, 1, 3, (1, 2), (1, 2), 0) == ErrorCode.none
    rm.partition("t", 0).append_as_follower(batch(4, partition_leader_epoch=3))
    assert list_offset(rm, -1) == (ErrorCode.not_leader_or_follower, -1)
    assert list_offset(rm, -1, replica_id=3) == (ErrorCode.not_leader_or_follower, -1)
    assert list_offset(rm, -1, replica_id=-2) == (ErrorCode.none, 4)  # the debugging consumer may read a follower
    assert fetch(rm, 0, replica_id=-1).error_code == ErrorCode.not_leader_or_follower
    assert fetch(rm, 0, replica_id=3).error_code == ErrorCode.not_leader_or_follower
    # Kafka's OffsetForLeaderEpoch always needs the leader (fetchOnlyFromLeader = true), followers' requests too.
    assert epoch_end(rm, 3)[0] == ErrorCode.not_leader_or_follower
    assert epoch_end(rm, 3, epoch=2)[0] == ErrorCode.fenced_leader_epoch
    rm.log_manager.shutdown()


def test_offset_for_leader_epoch_on_the_leader(tmp_path):
    rm = leader_with_two_epochs(tmp_path)
    assert epoch_end(rm, 1) == (ErrorCode.none, 1, 5)
    assert epoch_end(rm, 2) == (ErrorCode.none, 1, 5)
    assert epoch_end(rm, 3) == (ErrorCode.none, 3, 8)
    assert epoch_end(rm, 4) == (ErrorCode.none, -1, -1)
    assert epoch_end(rm, 3, epoch=4)[0] == ErrorCode.unknown_leader_epoch
    rm.log_manager.shutdown()


def test_stop_replica_answers_waiting_requests_and_deletes_when_asked(tmp_path):
    rm = manager(tmp_path)
    assert rm.become_leader("t", 0, 1, (1, 2), (1, 2), 0) == ErrorCode.none
    assert rm.become_leader("t", 1, 1, (1, 2), (1, 2), 0) == ErrorCode.none
    outcome = rm.append("t", 0, batch(2), acks=-1, min_insync_replicas=1)
    operation = rm.delay_produce([("t", 0, outcome.last_offset, 1)], 30_000)
    assert not operation.completed
    assert rm.stop_replica("t", 0, delete=False) == ErrorCode.none
    assert operation.results == [ErrorCode.not_leader_or_follower]
    kept = rm.partition("t", 0)
    assert kept.role is Role.NONE and kept.log.log_end_offset == 2 and (tmp_path / "t-0").is_dir()
    assert fetch(rm, 0).error_code == ErrorCode.not_leader_or_follower
    # Led again later (controlled shutdown, then back): the log is still there.
    assert rm.become_leader("t", 0, 2, (1, 2), (1, 2), 1) == ErrorCode.none and kept.log.log_end_offset == 2

    assert rm.stop_replica("t", 1, delete=True) == ErrorCode.none
    assert rm.partition("t", 1) is None and rm.log_manager.get("t", 1) is None
    assert not (tmp_path / "t-1").exists()
    assert rm.stop_replica("t", 7, delete=True) == ErrorCode.none  # not hosted: nothing to do
    rm.log_manager.shutdown()


def test_the_alter_partition_port_reaches_partitions_created_before_it(tmp_path):
    proposed: list[IsrChange] = []
    rm = manager(tmp_path)
    assert rm.become_leader("t", 0, 1, (1,), (1, 2), 0) == ErrorCode.none
    rm.alter_partition = SimpleNamespace(submit=lambda partition, change: proposed.append(change))
    p = rm.partition("t", 0)
    p.update_follower_fetch_state(2, 0, 0, T0, 0)
    assert proposed == [IsrChange("t", 0, 1, 1, 0, (1, 2), added=(2,))]
    assert rm.become_leader("t", 1, 1, (1,), (1, 2), 0) == ErrorCode.none
    assert rm.partition("t", 1).alter_partition is rm.alter_partition
    rm.log_manager.shutdown()


def test_follower_log_start_follows_the_leader_up_to_its_hwm(tmp_path):
    rm = manager(tmp_path, broker_id=2)
    assert rm.become_follower("t", 0, 1, 1, (1, 2), (1, 2), 0) == ErrorCode.none
    p = rm.partition("t", 0)
    p.append_as_follower(batch(10, partition_leader_epoch=1))
    p.update_high_watermark_from_leader(4)
    assert p.update_log_start_offset_from_leader(6) and p.log.log_start_offset == 4  # bounded by the HWM
    p.update_high_watermark_from_leader(10)
    assert p.update_log_start_offset_from_leader(6) and p.log.log_start_offset == 6
    assert not p.update_log_start_offset_from_leader(3)

    async def long_poll():  # an HWM move from the leader wakes consumers parked on the follower
        waiter = asyncio.ensure_future(rm.wait_for_appends([p], 10))
        await asyncio.sleep(0)
        p.append_as_follower(batch(2, base_offset=10, partition_leader_epoch=1))
        assert not waiter.done()
        p.update_high_watermark_from_leader(12)
        await asyncio.wait_for(waiter, 5)

    asyncio.run(long_poll())
    rm.log_manager.shutdown()


def test_acks_all_below_min_insync_replicas_is_refused_before_the_append(tmp_path):
    rm = manager(tmp_path)
    assert rm.become_leader("t", 0, 1, (1,), (1, 2), 0) == ErrorCode.none
    refused = rm.append("t", 0, batch(2), acks=-1, min_insync_replicas=2)
    assert refused.error == ErrorCode.not_enough_replicas and rm.partition("t", 0).log.log_end_offset == 0
    accepted = rm.append("t", 0, batch(2), acks=1, min_insync_replicas=2)  # acks=1 does not look at the ISR
    assert accepted.error == ErrorCode.none and accepted.last_offset == 1
    rm.log_manager.shutdown()


def test_delete_records_waits_for_the_followers_log_start(tmp_path):
    """Kafka's deleteRecordsOnLeader + DelayedDeleteRecords: the leader's log start moves at once, the answer
    waits until every replica on a live broker reported a log start at or past it (the low watermark)."""
    rm = leader_with_two_epochs(tmp_path)
    p = rm.partition("t", 0)
    p.update_follower_fetch_state(2, 8, 0, T0, 8)  # follower 2 caught up, its log start 0: HWM 8
    assert rm.delete_records("t", 0, 9) == (ErrorCode.offset_out_of_range, -1, -1)  # past the HWM
    assert rm.delete_records("t", 0, -2) == (ErrorCode.offset_out_of_range, -1, -1)
    assert rm.delete_records("t", 1, 0) == (ErrorCode.not_leader_or_follower, -1, -1)
    assert rm.delete_records("t", 0, 6) == (ErrorCode.none, 6, 0)  # the low watermark: follower 2's start
    assert p.log.log_start_offset == 6 and p.low_watermark == 0

    async def scenario():
        timed_out = await rm.await_low_watermarks({("t", 0): 6}, 0.05)
        waiting = asyncio.ensure_future(rm.await_low_watermarks({("t", 0): 6}, 30))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        p.update_follower_fetch_state(2, 8, 6, T0, 8)  # the follower's next fetch reports its new start
        return timed_out, await asyncio.wait_for(waiting, 5)

    assert asyncio.run(scenario()) == ({("t", 0): (ErrorCode.request_timed_out, 0)}, {("t", 0): (ErrorCode.none, 6)})
    assert rm.delete_records("t", 0, -1) == (ErrorCode.none, 8, 6)  # -1: up to the HWM
    rm.is_alive = lambda broker_id: broker_id != 2  # a dead broker's replica does not hold it back
    assert p.low_watermark == 8

    async def leadership_lost():
        waiting = asyncio.ensure_future(rm.await_low_watermarks({("t", 0): 9}, 30))
        await asyncio.sleep(0.01)
        assert rm.become_follower("t", 0, 2, 4, (1, 2), (1, 2), 2) == ErrorCode.none
        return await asyncio.wait_for(waiting, 5)

    rm.is_alive = lambda broker_id: True
    assert asyncio.run(leadership_lost()) == {("t", 0): (ErrorCode.not_leader_or_follower, -1)}
    rm.log_manager.shutdown()


def test_a_parked_consumer_fetch_never_returns_records_of_a_later_leader_epoch(tmp_path):
    """Kafka's DelayedFetch checks the fetch's current leader epoch and leadership again before completing.
    Without that, a librdkafka consumer parked at the HWM in epoch 1 got records written in epoch 2, took
    their epoch for its position's, and its OffsetForLeaderEpoch sent with epoch 1 then answered "epoch 1 ends
    at <where epoch 2 started>": a false "log truncation detected" (seed 140 of the rolling-restart test)."""
    rm = manager(tmp_path)
    assert rm.become_leader("t", 0, 1, (1,), (1, 2), 0, topic_id=TOPIC_ID) == ErrorCode.none
    p = rm.partition("t", 0)
    p.append(batch(3), T0)

    def consumer_fetch(offset: int, epoch: int):
        body = fr.FetchRequest(
            replica_state=fr.ReplicaState(replica_id=-1, replica_epoch=-1), max_wait=datetime.timedelta(seconds=30),
            min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
            forgotten_topics_data=(), rack_id="",
            topics=(fr.FetchTopic(topic_id=TOPIC_ID, partitions=(fr.FetchPartition(
                partition=0, current_leader_epoch=epoch, fetch_offset=offset, last_fetched_epoch=-1,
                log_start_offset=-1, partition_max_bytes=1 << 20),)),),
        )
        return call(fetch_handler, rm, 1, 16, body)

    async def scenario(epoch: int, change_role, write, expected: ErrorCode):
        parked = asyncio.ensure_future(consumer_fetch(p.log.log_end_offset, epoch))  # at the HWM: a long poll
        await asyncio.sleep(0)
        assert not parked.done()
        change_role()
        write()  # records of the new epoch, below the HWM
        data = (await asyncio.wait_for(parked, 5)).responses[0].partitions[0]
        assert data.error_code == expected
        assert not data.records

    # The same broker leads again in epoch 2 (controlled shutdown of another replica): FENCED_LEADER_EPOCH.
    asyncio.run(scenario(1, lambda: rm.become_leader("t", 0, 2, (1,), (1, 2), 1), lambda: p.append(batch(2), T0),
                         ErrorCode.fenced_leader_epoch))
    assert p.log.leader_epochs == [(1, 0), (2, 3)] and p.log.log_end_offset == 5

    # A fetch naming no epoch, parked on the leader, which becomes a follower: NOT_LEADER_OR_FOLLOWER.
    def follow():
        p.append_as_follower(batch(2, base_offset=5, partition_leader_epoch=3))
        p.update_high_watermark_from_leader(7)

    asyncio.run(scenario(-1, lambda: rm.become_follower("t", 0, 2, 3, (1, 2), (1, 2), 2), follow,
                         ErrorCode.not_leader_or_follower))
    assert p.log.log_end_offset == 7 and p.high_watermark == 7
    rm.log_manager.shutdown()

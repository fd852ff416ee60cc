"""The follower fetcher (pykbroker/replication/fetcher.py) against a real pykbroker leader.

The leader is a whole Broker running in this process on a real socket (its connections, dispatcher and Fetch /
ListOffsets / Produce handlers), whose partition a LeaderAndIsr-style ``become_leader`` makes leader of
replicas [1, 2]. The follower is a ReplicaManager on its own data dir with a ReplicaFetcherManager fetching over
TCP, as a second broker's would. Producers reach the leader through the broker's own client. Every wait is
bounded (cluster_helpers.wait_for, asyncio.wait_for).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import sys
from pathlib import Path

import pytest
from kio.schema.fetch.v16 import request as fetch_request
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from pykbroker.config import BrokerConfig
from pykbroker.log.config import LogConfig
from pykbroker.log.manager import LogManager
from pykbroker.protocol.client import NodeClients
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.records import build_batch, iter_headers
from pykbroker.replication.fetcher import ReplicaFetcherManager
from pykbroker.replication.partition import IsrChange
from pykbroker.replication.replica_manager import ReplicaManager
from pykbroker.server.broker import Broker, bind_listener

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "cluster"))
from cluster_helpers import wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(90)

LEADER, FOLLOWER = 1, 2
FAST = {"replica.fetch.wait.max.ms": 100, "replica.fetch.backoff.ms": 50}


def run(coroutine, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coroutine, timeout))


@contextlib.asynccontextmanager
async def leader_broker(path: Path, topic: str = "t", *, isr=(LEADER, FOLLOWER), replicas=(LEADER, FOLLOWER),
                        epoch: int = 1, **values):
    """A Broker (id 1) serving on a free port, leader of ``topic``-0 in ``epoch``; yields (broker, port, topic id)."""
    config = BrokerConfig(data_dir=path, port=0, broker_id=LEADER, values=values)
    listening = [(listener, bind_listener(listener)) for listener in config.listeners]
    broker = Broker(config)
    try:
        await broker.start(listening)
        info = await broker.topics.auto_create_async(topic)
        assert broker.replicas.become_leader(topic, 0, epoch, isr, replicas, 0) == ErrorCode.none
        yield broker, listening[0][1].getsockname()[1], info.topic_id
    finally:
        await broker.stop()
        for _, sock in listening:
            sock.close()


class Follower:
    """A second broker's replication side: its ReplicaManager and fetchers, nothing else."""

    def __init__(self, path: Path, leader_port: int, topic_id, broker_id: int = FOLLOWER, values=FAST) -> None:
        self.replicas = ReplicaManager(LogManager(path), broker_id, lambda topic: LogConfig())
        config = BrokerConfig(data_dir=path, broker_id=broker_id, values=values)
        self.fetchers = ReplicaFetcherManager(
            broker_id, self.replicas, lambda node: ("127.0.0.1", leader_port) if node == LEADER else None,
            lambda name: topic_id, config, broker_epoch=lambda: 42,
        )

    def follow(self, topic: str = "t", epoch: int = 1, replicas=(LEADER, FOLLOWER)):
        assert self.replicas.become_follower(topic, 0, LEADER, epoch, replicas, replicas, 0) == ErrorCode.none
        self.fetchers.add_partitions({(topic, 0): LEADER})
        return self.replicas.partition(topic, 0)

    async def close(self) -> None:
        await self.fetchers.close()
        self.replicas.log_manager.shutdown()


def batch(count: int, start: int = 0, **options) -> bytearray:
    return build_batch([(None, b"v%d" % i) for i in range(start, start + count)], timestamp_ms=1_700_000_000_000,
                       **options)


async def produce(port: int, records: bytes, *, acks: int = -1, timeout_ms: int = 10_000, topic: str = "t"):
    clients = NodeClients(99, {LEADER: ("127.0.0.1", port)})
    try:
        request = ProduceRequest(
            transactional_id=None, acks=acks, timeout=datetime.timedelta(milliseconds=timeout_ms),
            topic_data=(TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=0, records=bytes(records)),)),),
        )
        response = await clients.send(LEADER, request, timeout=timeout_ms / 1000 + 10)
        return response.responses[0].partition_responses[0]
    finally:
        await clients.close()


def log_bytes(partition) -> bytes:
    return partition.log.read(partition.log.log_start_offset, 1 << 24).read_bytes()


def test_follower_replicates_byte_identical_and_acks_all_waits_for_it(tmp_path):
    async def scenario():
        async with leader_broker(tmp_path / "leader", **{"min.insync.replicas": 2}) as (broker, port, topic_id):
            leader = broker.replicas.partition("t", 0)
            # No follower fetches yet: the HWM cannot pass the batch, acks=all times out (records stay).
            late = await produce(port, batch(3), timeout_ms=300)
            assert (late.error_code, late.base_offset) == (ErrorCode.request_timed_out, 0)
            assert leader.log.log_end_offset == 3 and leader.high_watermark == 0

            follower = Follower(tmp_path / "follower", port, topic_id)
            try:
                replica = follower.follow()
                answer = await produce(port, batch(4, 3))
                assert (answer.error_code, answer.base_offset) == (ErrorCode.none, 3)
                # The leader answered only once the follower had the batch (its fetch at 7 moved the HWM).
                assert replica.log.log_end_offset == 7
                assert leader.high_watermark == 7 and leader.follower_state(FOLLOWER).log_end_offset == 7
                await wait_for(lambda: replica.high_watermark == 7, what="the leader's HWM on the follower")
                assert log_bytes(replica) == log_bytes(leader)  # offsets, epochs, CRCs: byte for byte
                assert [h.partition_leader_epoch for h in iter_headers(log_bytes(replica))] == [1, 1]
                state = follower.fetchers.fetch_state("t", 0)
                assert (state.fetch_offset, state.last_fetched_epoch, state.leader_epoch) == (7, 1, 1)

                # Consumers of the follower are refused; removing the partition stops its fetch at once.
                assert follower.replicas.append("t", 0, batch(1), acks=1, min_insync_replicas=1).error == \
                    ErrorCode.not_leader_or_follower
                follower.fetchers.remove_partitions([("t", 0)])
                assert follower.fetchers.fetch_state("t", 0) is None
                source = follower.fetchers._sources[LEADER]
                await wait_for(lambda: source.task.done(), what="the idle fetch task to end")
                assert follower.fetchers.clients.connection(LEADER) is None
                assert (await produce(port, batch(2), acks=1)).error_code == ErrorCode.none
                assert replica.log.log_end_offset == 7
            finally:
                await follower.close()

    run(scenario())


def test_follower_with_uncommitted_records_of_an_old_epoch_truncates_on_the_diverging_epoch(tmp_path):
    async def scenario():
        async with leader_broker(tmp_path / "leader") as (broker, port, topic_id):
            leader = broker.replicas.partition("t", 0)
            leader.append(batch(5), 0)  # epoch 1: offsets 0-4, which both replicas have
            common = log_bytes(leader)

            follower = Follower(tmp_path / "follower", port, topic_id)
            try:
                old = follower.replicas
                assert old.become_follower("t", 0, LEADER, 1, (1, 2), (1, 2), 0) == ErrorCode.none
                replica = old.partition("t", 0)
                replica.append_as_follower(common)
                # Offsets 5-7 of epoch 1 that never reached the leader (the follower led briefly, say).
                replica.append_as_follower(batch(3, 5, base_offset=5, partition_leader_epoch=1))
                assert (replica.log.log_end_offset, replica.log.latest_epoch) == (8, 1)

                # The leader is re-elected in epoch 3 and writes offsets 5-8 there.
                assert broker.replicas.become_leader("t", 0, 3, (1, 2), (1, 2), 1) == ErrorCode.none
                leader.append(batch(4, 100), 0)
                assert leader.log.leader_epochs == [(1, 0), (3, 5)]

                assert old.become_follower("t", 0, LEADER, 3, (1, 2), (1, 2), 1) == ErrorCode.none
                follower.fetchers.add_partitions({("t", 0): LEADER})
                await wait_for(lambda: replica.log.log_end_offset == 9 and replica.high_watermark == 9,
                               what="the follower to truncate and catch up")
                assert log_bytes(replica) == log_bytes(leader)
                assert replica.log.leader_epochs == [(1, 0), (3, 5)]
                assert leader.high_watermark == 9
            finally:
                await follower.close()

    run(scenario())


def test_follower_that_never_had_the_leaders_epochs_truncates_step_by_step(tmp_path):
    """Kafka's getOffsetTruncationState when the follower does not know the epoch the leader answers: back to
    the end of its own largest epoch below it, fetch again naming that epoch, until the logs agree."""
    async def scenario():
        async with leader_broker(tmp_path / "leader") as (broker, port, topic_id):
            leader = broker.replicas.partition("t", 0)
            leader.append(batch(6), 0)  # epoch 1: 0-5
            assert broker.replicas.become_leader("t", 0, 3, (1, 2), (1, 2), 1) == ErrorCode.none
            leader.append(batch(3, 6), 0)  # epoch 3: 6-8
            follower = Follower(tmp_path / "follower", port, topic_id)
            try:
                assert follower.replicas.become_follower("t", 0, LEADER, 3, (1, 2), (1, 2), 1) == ErrorCode.none
                replica = follower.replicas.partition("t", 0)
                replica.append_as_follower(batch(5, 50, partition_leader_epoch=0))  # epoch 0: 0-4
                replica.append_as_follower(batch(3, 55, base_offset=5, partition_leader_epoch=2))  # epoch 2: 5-7
                follower.fetchers.add_partitions({("t", 0): LEADER})
                # (1, 6) from the leader → our epoch 0 ends at 5 → (0, 0) from the leader → truncate to 0.
                await wait_for(lambda: replica.log.log_end_offset == 9, what="the follower to converge")
                assert log_bytes(replica) == log_bytes(leader)
                assert replica.log.leader_epochs == [(1, 0), (3, 6)]
            finally:
                await follower.close()

    run(scenario())


def test_a_leader_without_an_address_or_not_listening_is_retried_after_the_backoff(tmp_path):
    async def scenario():
        async with leader_broker(tmp_path / "leader") as (broker, port, topic_id):
            broker.replicas.partition("t", 0).append(batch(4), 0)
            follower = Follower(tmp_path / "follower", port, topic_id)
            where = {"address": None}
            follower.fetchers.address_of = lambda node: where["address"]
            try:
                replica = follower.follow()
                state = follower.fetchers.fetch_state("t", 0)
                await wait_for(lambda: state.delayed_until > 0, what="a backoff with no address known")
                closed = bind_listener(broker.config.listeners[0])  # a port nobody accepts on
                where["address"] = ("127.0.0.1", closed.getsockname()[1])
                closed.close()
                first_backoff = state.delayed_until
                await wait_for(lambda: state.delayed_until > first_backoff, what="a backoff after a refused connection")
                assert replica.log.log_end_offset == 0
                where["address"] = ("127.0.0.1", port)
                await wait_for(lambda: replica.log.log_end_offset == 4, what="replication once the leader is reachable")
            finally:
                await follower.close()

    run(scenario())


def test_follower_behind_the_leaders_log_start_starts_over_there(tmp_path):
    async def scenario():
        async with leader_broker(tmp_path / "leader", **{"segment.bytes": 1 << 20}) as (broker, port, topic_id):
            leader = broker.replicas.partition("t", 0)
            for n in range(4):
                leader.append(batch(5, 5 * n), 0)
            leader.log.delete_records_before(10)  # DeleteRecords / retention moved the leader's log start
            follower = Follower(tmp_path / "follower", port, topic_id)
            try:
                replica = follower.follow()
                # Fetch at 0 → OFFSET_OUT_OF_RANGE → ListOffsets: the leader ends at 20, starts at 10.
                await wait_for(lambda: replica.log.log_end_offset == 20, what="the follower to catch up from 10")
                assert replica.log.log_start_offset == 10
                assert log_bytes(replica) == leader.log.read(10, 1 << 24).read_bytes()
                assert [h.base_offset for h in iter_headers(log_bytes(replica))] == [10, 15]
            finally:
                await follower.close()

    run(scenario())


def test_a_replica_that_is_not_assigned_is_refused_and_backs_off(tmp_path):
    async def scenario():
        async with leader_broker(tmp_path / "leader") as (broker, port, topic_id):
            leader = broker.replicas.partition("t", 0)
            leader.append(batch(3), 0)

            def raw_fetch(replica_id: int, epoch: int):
                return fetch_request.FetchRequest(
                    replica_state=fetch_request.ReplicaState(replica_id=replica_id, replica_epoch=7),
                    max_wait=datetime.timedelta(0), min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                    session_id=0, session_epoch=-1, forgotten_topics_data=(), rack_id="",
                    topics=(fetch_request.FetchTopic(topic_id=topic_id, partitions=(fetch_request.FetchPartition(
                        partition=0, current_leader_epoch=epoch, fetch_offset=0, last_fetched_epoch=-1,
                        log_start_offset=0, partition_max_bytes=1 << 20),)),),
                )

            clients = NodeClients(3, {LEADER: ("127.0.0.1", port)}, client_id="broker-3-fetcher-0",
                                  negotiate_versions=False)
            try:
                for epoch, error in ((1, ErrorCode.unknown_leader_epoch), (-1, ErrorCode.not_leader_or_follower)):
                    answer = (await clients.send(LEADER, raw_fetch(3, epoch))).responses[0].partitions[0]
                    assert answer.error_code == error and not answer.records
                answer = (await clients.send(LEADER, raw_fetch(2, 1))).responses[0].partitions[0]
                assert answer.error_code == ErrorCode.none and len(answer.records) > 0
            finally:
                await clients.close()
            assert leader.follower_state(3) is None

            # Broker 3's fetcher gets UNKNOWN_LEADER_EPOCH: it keeps the partition, backs off, appends nothing.
            stranger = Follower(tmp_path / "stranger", port, topic_id, broker_id=3)
            try:
                replica = stranger.follow(replicas=(LEADER, 3))
                await wait_for(lambda: stranger.fetchers.fetch_state("t", 0).delayed_until > 0,
                               what="the refused fetcher to back off")
                assert replica.log.log_end_offset == 0 and stranger.fetchers.fetch_state("t", 0).fetch_offset == 0
            finally:
                await stranger.close()

    run(scenario())


class Controller:
    """The AlterPartition port as a controller that accepts every change at once (partition epoch + 1)."""

    def __init__(self) -> None:
        self.changes: list[IsrChange] = []

    def submit(self, partition, change: IsrChange) -> None:
        self.changes.append(change)
        asyncio.get_running_loop().call_soon(
            lambda: partition.isr_change_committed(change.isr, change.partition_epoch + 1, now_ms=partition_now()))


def partition_now() -> int:
    import time

    return int(time.time() * 1000)


def test_a_follower_that_catches_up_is_added_to_the_isr_and_then_holds_the_hwm(tmp_path):
    async def scenario():
        async with leader_broker(tmp_path / "leader", isr=(LEADER,)) as (broker, port, topic_id):
            controller = Controller()
            broker.replicas.alter_partition = controller  # reaches the partition created before
            leader = broker.replicas.partition("t", 0)
            assert (await produce(port, batch(5))).error_code == ErrorCode.none  # ISR of one: at once
            follower = Follower(tmp_path / "follower", port, topic_id)
            try:
                replica = follower.follow()
                await wait_for(lambda: leader.isr == (LEADER, FOLLOWER), what="the ISR expansion")
                assert controller.changes == [IsrChange("t", 0, LEADER, 1, 0, (LEADER, FOLLOWER), added=(FOLLOWER,))]
                assert leader.partition_epoch == 1
                answer = await produce(port, batch(2, 5))
                assert answer.error_code == ErrorCode.none and replica.log.log_end_offset == 7
            finally:
                await follower.close()

    run(scenario())


def test_pipelined_acks_all_produces_are_not_held_by_a_parked_follower_fetch(tmp_path):
    """Five acks=all produces pipelined on one connection (the Java producer's max.in.flight default): each
    append must wake the follower's parked fetch. Before the long poll registered its wake-up in the same
    event-loop step as its read, an append landing in between was missed and every produce after the second
    waited out the follower's whole max_wait: here a 60 s wait against a 20 s produce timeout."""

    async def scenario():
        async with leader_broker(tmp_path / "leader", **{"min.insync.replicas": 2}) as (broker, port, topic_id):
            # A parked follower fetch answers only when woken (or after 60 s).
            follower = Follower(tmp_path / "follower", port, topic_id, values={**FAST, "replica.fetch.wait.max.ms": 60_000})
            try:
                follower.follow()
                clients = NodeClients(99, {LEADER: ("127.0.0.1", port)})
                try:
                    connection = await clients.get(LEADER)
                    requests = [ProduceRequest(
                        transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=20),
                        topic_data=(TopicProduceData(name="t", partition_data=(
                            PartitionProduceData(index=0, records=bytes(batch(1, n))),)),),
                    ) for n in range(5)]
                    answers = await asyncio.gather(*(connection.send_nowait(r, timeout=40) for r in requests))
                finally:
                    await clients.close()
                parts = [a.responses[0].partition_responses[0] for a in answers]
                assert [(p.error_code, p.base_offset) for p in parts] == [(ErrorCode.none, n) for n in range(5)]
            finally:
                await follower.close()

    run(scenario(), timeout=80)


def test_file_work_of_a_response_is_run_even_when_a_later_partition_fails():
    """_fetch_once: partition 0's new log start queued file work; partition 1's processing raises. The
    queued work still goes to the I/O thread (before: skipped, its descriptors and files left behind)."""
    import uuid
    from types import SimpleNamespace

    from pykbroker.replication.fetcher import FetchState, _SourceFetcher

    topic_id = uuid.uuid4()
    logs = {0: SimpleNamespace(has_file_work=True, name="log-0"), 1: SimpleNamespace(has_file_work=False)}
    ran = []

    async def run_file_work_async(pending):
        ran.append([log.name for log in pending])

    manager = SimpleNamespace(
        broker_id=FOLLOWER,
        replicas=SimpleNamespace(partition=lambda topic, index: SimpleNamespace(log=logs[index]),
                                 log_manager=SimpleNamespace(run_file_work_async=run_file_work_async)))

    async def scenario():
        fetcher = _SourceFetcher(manager, LEADER)
        states = {i: FetchState("t", i, LEADER, fetch_offset=0, leader_epoch=1, last_fetched_epoch=-1)
                  for i in (0, 1)}
        for state in states.values():
            fetcher.add(state)
        sent = {(topic_id, i): (state, 0) for i, state in states.items()}
        fetcher._build = lambda ready: (object(), sent)

        async def send(request):
            return SimpleNamespace(error_code=ErrorCode.none, responses=[SimpleNamespace(
                topic_id=topic_id, partitions=[SimpleNamespace(partition_index=0), SimpleNamespace(partition_index=1)])])

        async def process(state, data):
            if state.index == 1:
                raise RuntimeError("test: processing partition 1 fails")

        fetcher._send, fetcher._process = send, process
        with pytest.raises(RuntimeError, match="partition 1 fails"):
            await fetcher._fetch_once(list(states.values()))
        assert ran == [["log-0"]]

    run(scenario())

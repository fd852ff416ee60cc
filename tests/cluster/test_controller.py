"""The ZooKeeper-mode controller against a real ZooKeeper.

Brokers are simulated: each registers /brokers/ids/<id> with a KafkaZkClient session of its own (closing it is
the broker dying), and the controller's requests go into a recording channel. One test uses the real channel
against an asyncio TCP server that decodes the frames with the inter-broker codecs and answers them."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import uuid

import pytest

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install kazoo, or the project's test extra)")

from kazoo.client import KazooClient
from kio.schema.alter_partition.v3 import request as apr
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64

from pykbroker.cluster.controller import Controller, ControllerChannel
from pykbroker.cluster.zookeeper import (ControllerMoved, Endpoint, KafkaZkClient, encode_topic_assignment,
                                         kafka_uuid_to_uuid)
from pykbroker.config import BrokerConfig
from pykbroker.protocol import interbroker as ib
from pykbroker.protocol.interbroker.leader_and_isr.v7 import response as lai_resp
from pykbroker.protocol.interbroker.stop_replica.v4 import response as sr_resp
from pykbroker.protocol.interbroker.update_metadata.v8 import response as um_resp
from cluster_helpers import wait_for

LAI, STOP, UM = 4, 5, 6


class RecordingChannel:
    """The ControllerChannel interface, recording (broker id, request) in send order."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, object]] = []
        self.brokers: dict[int, tuple[str, int]] = {}
        self.closed = False

    def add_broker(self, broker_id: int, host: str, port: int) -> None:
        self.brokers[broker_id] = (host, port)

    def remove_broker(self, broker_id: int) -> None:
        self.brokers.pop(broker_id, None)

    def send(self, broker_id: int, request) -> None:
        self.sent.append((broker_id, request))

    async def close(self) -> None:
        self.closed = True

    def requests(self, api_key: int, broker_id: int | None = None, since: int = 0) -> list:
        return [r for b, r in self.sent[since:] if int(r.__api_key__) == api_key and broker_id in (None, b)]

    def partitions(self, api_key: int, broker_id: int | None = None, since: int = 0) -> dict:
        """(topic, index) -> the last partition state sent (LeaderAndIsr / UpdateMetadata)."""
        out = {}
        for r in self.requests(api_key, broker_id, since):
            for t in r.topic_states:
                for p in t.partition_states:
                    out[(t.topic_name, p.partition_index)] = p
        return out


class Cluster:
    """Brokers registered in ZooKeeper, one session each, and the controllers under test."""

    def __init__(self, connect: str, tmp_path) -> None:
        self.connect = connect
        self.tmp_path = tmp_path
        self.brokers: dict[int, KafkaZkClient] = {}
        self.epochs: dict[int, int] = {}
        self.clients: list[KafkaZkClient] = []
        self.controllers: list[Controller] = []

    async def client(self) -> KafkaZkClient:
        zk = KafkaZkClient(self.connect, session_timeout_ms=6000)
        await zk.start()
        self.clients.append(zk)
        return zk

    async def add_broker(self, broker_id: int, port: int | None = None) -> int:
        zk = await self.client()
        self.epochs[broker_id] = await zk.register_broker(
            broker_id, [Endpoint("PLAINTEXT", "127.0.0.1", port or 19000 + broker_id)])
        self.brokers[broker_id] = zk
        return self.epochs[broker_id]

    async def kill_broker(self, broker_id: int) -> None:
        await self.brokers.pop(broker_id).close()

    async def controller(self, broker_id: int, channel=None, **values) -> tuple[Controller, RecordingChannel]:
        zk = await self.client()
        channel = RecordingChannel() if channel is None else channel
        config = BrokerConfig(data_dir=self.tmp_path, port=0, broker_id=broker_id, values=values)
        c = Controller(zk, broker_id, config, listener_name="PLAINTEXT", channel=channel)
        self.controllers.append(c)
        await c.start()
        return c, channel

    async def run(self, test) -> None:
        """Run a test coroutine, then stop everything on the same loop (the clients are bound to it)."""
        try:
            await test
        finally:
            await self.close()

    async def close(self) -> None:
        for c in self.controllers:
            await c.stop()
        for zk in self.clients:
            await zk.close()


async def active(controller: Controller) -> Controller:
    await wait_for(lambda: controller.active, 15, "the controller to be active")
    return controller


async def state_of(zk: KafkaZkClient, topic: str, index: int, **expected):
    async def matches():
        s = await zk.get_partition_state(topic, index)
        return s if s is not None and all(getattr(s, k) == v for k, v in expected.items()) else None

    return await wait_for(matches, 15, f"{topic}-{index} state {expected}")


def alter(broker_id: int, broker_epoch: int, topic_id, index: int, leader_epoch: int, isr: dict[int, int],
          partition_epoch: int) -> apr.AlterPartitionRequest:
    return apr.AlterPartitionRequest(
        broker_id=i32(broker_id), broker_epoch=i64(broker_epoch),
        topics=(apr.TopicData(topic_id=topic_id, partitions=(apr.PartitionData(
            partition_index=i32(index), leader_epoch=i32(leader_epoch),
            new_isr_with_epochs=tuple(apr.BrokerState(broker_id=i32(b), broker_epoch=i64(e)) for b, e in isr.items()),
            partition_epoch=i32(partition_epoch)),)),))


@pytest.fixture
def cluster(zk_connect, tmp_path, run_async):
    return Cluster(zk_connect, tmp_path)


# ---- election ---------------------------------------------------------------------------------------


def test_one_of_three_controllers_wins_and_each_election_bumps_the_epoch(cluster, run_async):
    async def body():
        await cluster.add_broker(1)
        trio = [(await cluster.controller(i))[0] for i in (1, 2, 3)]
        # Every one has run its election once it knows epoch 1 (the losers read it after losing).
        await wait_for(lambda: all(c.epoch == 1 for c in trio), 15, "three elections")
        assert sum(c.active for c in trio) == 1
        [winner] = [c for c in trio if c.active]
        zk = await cluster.client()
        assert await zk.get_controller_id() == winner.broker_id
        assert (await zk.get_controller_epoch())[0] == winner.epoch == 1
        await winner.stop()  # resigns: deletes /controller, another one takes over with epoch 2
        assert await zk.get_controller_id() != winner.broker_id
        await wait_for(lambda: sum(c.active for c in trio if c is not winner) == 1, 15, "a second controller")
        [second] = [c for c in trio if c.active]
        assert second.epoch == 2 and (await zk.get_controller_epoch())[0] == 2
        assert await zk.get_controller_id() == second.broker_id
        # The new controller told every live broker who is alive (UpdateMetadata with its epoch).
        chan = second.channel
        # active is set when the election is won, before the failover has read ZooKeeper and sent.
        await wait_for(lambda: chan.requests(UM, 1), 15, "the new controller's UpdateMetadata")
        [update] = chan.requests(UM, 1)
        assert (update.controller_id, update.controller_epoch, update.broker_epoch) == (
            second.broker_id, 2, cluster.epochs[1])
        assert [b.id_ for b in update.live_brokers] == [1]

    run_async(cluster.run(body()))


def test_failover_when_the_controllers_session_ends(cluster, run_async):
    async def body():
        await cluster.add_broker(1)
        first, _ = await cluster.controller(1)
        await active(first)
        second, _ = await cluster.controller(2)
        await wait_for(lambda: second.epoch == first.epoch, 15, "the second one to lose its election")
        assert not second.active
        await first.zk.close()  # the session ends: /controller goes with it
        await active(second)
        assert second.epoch == first.epoch + 1

    run_async(cluster.run(body()))


def test_a_new_controller_loads_the_cluster_and_repairs_what_changed_without_a_controller(cluster, run_async):
    async def body():
        for b in (1, 2, 3):
            await cluster.add_broker(b)
        first, _ = await cluster.controller(1)
        await active(first)
        zk = await cluster.client()
        await zk.create_topic("kept", {0: [1, 2], 1: [3, 2]})
        await state_of(zk, "kept", 1, leader=3)
        await first.stop()
        # With no controller: a topic is created and the leader of kept-1 dies.
        await zk.create_topic("late", {0: [2, 1]})
        await cluster.kill_broker(3)
        second, chan = await cluster.controller(2)
        await active(second)
        assert second.epoch == first.epoch + 1
        late = await state_of(zk, "late", 0, leader=2)
        assert (late.isr, late.leader_epoch, late.controller_epoch) == ((2, 1), 0, second.epoch)
        k1 = await state_of(zk, "kept", 1, leader=2)
        assert (k1.isr, k1.leader_epoch) == ((2,), 1)
        await wait_for(lambda: len(chan.requests(UM)) == 2, 15, "UpdateMetadata to the two live brokers")
        assert [(b, int(r.__api_key__)) for b, r in chan.sent] == [(1, LAI), (2, LAI), (1, UM), (2, UM)]
        assert set(chan.partitions(LAI, 2)) == {("kept", 0), ("kept", 1), ("late", 0)}
        assert set(chan.partitions(LAI, 1)) == {("kept", 0), ("late", 0)}
        assert chan.partitions(LAI, 1)[("late", 0)].is_new and not chan.partitions(LAI, 1)[("kept", 0)].is_new
        um = chan.partitions(UM, 1)
        assert set(um) == {("kept", 0), ("kept", 1), ("late", 0)}
        assert (um[("kept", 1)].leader, um[("kept", 1)].offline_replicas) == (2, (3,))
        assert all(r.controller_epoch == second.epoch for _, r in chan.sent)

    run_async(cluster.run(body()))


def test_a_new_controller_drops_followers_that_died_with_the_old_one_from_the_isr(cluster, run_async):
    """Kafka's ReplicaStateMachine.startup: a follower that died while there was no controller leaves the ISR
    at failover. Its log end still equals an idle leader's, so the leader would never find it out of sync."""

    async def body():
        for b in (1, 2, 3):
            await cluster.add_broker(b)
        first, _ = await cluster.controller(1)
        await active(first)
        zk = await cluster.client()
        await zk.create_topic("idle", {0: [3, 1, 2]})
        await state_of(zk, "idle", 0, leader=3, isr=(3, 1, 2))
        await first.stop()
        await cluster.kill_broker(2)  # a follower dies with no controller to notice
        second, chan = await cluster.controller(1)
        await active(second)
        state = await state_of(zk, "idle", 0, leader=3, isr=(3, 1))
        assert state.leader_epoch == 1
        await wait_for(lambda: chan.partitions(LAI, 3).get(("idle", 0)) is not None, 15, "LeaderAndIsr to the leader")
        assert tuple(chan.partitions(LAI, 3)[("idle", 0)].isr) == (3, 1)

    run_async(cluster.run(body()))


def expire_session(zk: KafkaZkClient) -> None:
    """Make the server expire zk's session: another client joins the session with its id and password and
    closes it (the classic ZooKeeper test trick); zk then finds its session expired when it reconnects."""
    intruder = KazooClient(hosts=zk.hosts + (zk.chroot or ""), client_id=zk.kazoo.client_id, timeout=6)
    intruder.start(15)
    intruder.stop()
    intruder.close()


def test_a_controller_whose_session_expires_resigns_and_another_takes_over(cluster, run_async):
    async def body():
        await cluster.add_broker(1)
        first, chan = await cluster.controller(1)
        await active(first)
        second, _ = await cluster.controller(2)
        await wait_for(lambda: second.epoch == first.epoch, 15, "the second one to lose its election")
        old_epoch = first.epoch
        await asyncio.get_running_loop().run_in_executor(None, expire_session, first.zk)
        await wait_for(lambda: second.active or first.epoch > old_epoch, 20, "a new election")
        winner = second if second.active else first
        assert winner.epoch == old_epoch + 1
        if winner is second:
            await wait_for(lambda: not first.active, 20, "the expired controller to resign")
            assert chan.brokers == {}

    run_async(cluster.run(body()))


def test_a_controller_whose_epoch_moved_is_fenced_and_resigns(cluster, run_async):
    async def body():
        await cluster.add_broker(1)
        c, chan = await cluster.controller(1)
        await active(c)
        zk = await cluster.client()
        stale_zkv = c._leadership.epoch_zk_version
        # Another controller was elected meanwhile (the epoch moved) but this one has not noticed yet.
        data, stat = await zk.get("/controller_epoch")
        await zk._await(zk.kazoo.set_async("/controller_epoch", b"7", version=stat.version))
        with pytest.raises(ControllerMoved):
            await zk.guarded_multi(stale_zkv, [("check", "/controller", -1)])
        sent = len(chan.sent)
        await zk.create_topic("fenced", {0: [1]})
        await wait_for(lambda: not c.active, 15, "the fenced controller to resign")
        assert await zk.get_partition_state("fenced", 0) is None  # its write was refused
        assert chan.requests(LAI, since=sent) == []
        assert chan.brokers == {}  # the channel forgot every broker

    run_async(cluster.run(body()))


# ---- topics -----------------------------------------------------------------------------------------


def test_topic_creation_writes_states_and_sends_leader_and_isr_then_update_metadata(cluster, run_async):
    async def body():
        for b in (1, 2, 3):
            await cluster.add_broker(b)
        c, chan = await cluster.controller(1)
        await active(c)
        zk = await cluster.client()
        start = len(chan.sent)
        tid = await zk.create_topic("t", {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 9]})  # broker 9 does not exist
        s0 = await state_of(zk, "t", 0, leader=1)
        assert (s0.isr, s0.leader_epoch, s0.controller_epoch, s0.zk_version) == ((1, 2, 3), 0, c.epoch, 0)
        s1 = await state_of(zk, "t", 1, leader=2)
        assert s1.isr == (2, 3, 1)
        s2 = await state_of(zk, "t", 2, leader=3)
        assert s2.isr == (3,)  # only live replicas
        await wait_for(lambda: len(chan.requests(UM, since=start)) == 3, 15, "UpdateMetadata to 3 brokers")
        sent = chan.sent[start:]
        kinds = [(b, int(r.__api_key__)) for b, r in sent]
        assert kinds == [(1, LAI), (2, LAI), (3, LAI), (1, UM), (2, UM), (3, UM)]
        to2 = chan.requests(LAI, 2, start)[0]
        assert (to2.controller_id, to2.controller_epoch, to2.broker_epoch, to2.type_) == (
            1, c.epoch, cluster.epochs[2], 0)
        [topic] = to2.topic_states
        assert topic.topic_name == "t" and topic.topic_id == kafka_uuid_to_uuid(tid)
        parts = {p.partition_index: p for p in topic.partition_states}
        assert set(parts) == {0, 1}  # broker 2 hosts 0 and 1, not 2
        assert all(p.is_new and p.partition_epoch == 0 and p.leader_epoch == 0 for p in parts.values())
        assert parts[1].replicas == (2, 3, 1) and parts[1].isr == (2, 3, 1)
        assert sorted(leader.broker_id for leader in to2.live_leaders) == [1, 2]  # leaders of its partitions
        assert {(leader.host_name, leader.port) for leader in to2.live_leaders} == {("127.0.0.1", 19001),
                                                                                 ("127.0.0.1", 19002)}
        update = chan.requests(UM, 3, start)[0]
        assert update.broker_epoch == cluster.epochs[3]
        assert [b.id_ for b in update.live_brokers] == [1, 2, 3]
        assert [(e.listener, e.port, e.security_protocol) for e in update.live_brokers[2].endpoints] == [
            ("PLAINTEXT", 19003, 0)]
        ups = chan.partitions(UM, 3, start)
        assert ups[("t", 2)].offline_replicas == (9,) and ups[("t", 2)].zk_version == 0
        assert ups[("t", 0)].offline_replicas == ()

        # Added partitions (the assignment znode rewritten) get states and is_new LeaderAndIsr too.
        assignment = await zk.get_topic_assignment("t")
        more = dict(assignment.partitions)
        more[3] = [2, 1]
        mark = len(chan.sent)
        await zk._await(zk.kazoo.set_async("/brokers/topics/t", encode_topic_assignment(more, tid)))
        s3 = await state_of(zk, "t", 3, leader=2)
        assert s3.isr == (2, 1)
        await wait_for(lambda: chan.partitions(LAI, 1, mark).get(("t", 3)), 15, "LeaderAndIsr for t-3")
        assert chan.partitions(LAI, 1, mark)[("t", 3)].is_new

    run_async(cluster.run(body()))


def test_topic_deletion_stops_replicas_and_removes_the_znodes(cluster, run_async):
    async def body():
        for b in (1, 2):
            await cluster.add_broker(b)
        c, chan = await cluster.controller(1)
        await active(c)
        zk = await cluster.client()
        await zk.create_topic("gone", {0: [1, 2]}, config={"retention.ms": "1000"})
        await state_of(zk, "gone", 0, leader=1)
        mark = len(chan.sent)
        await zk.mark_topic_for_deletion("gone")

        async def deleted():
            return (await zk.get_or_none("/brokers/topics/gone") is None
                    and await zk.get_or_none("/config/topics/gone") is None
                    and await zk.topics_marked_for_deletion() == [])

        await wait_for(deleted, 15, "the topic's znodes to go")
        assert chan.partitions(UM, 2, mark)[("gone", 0)].leader == -2
        stops = chan.requests(STOP, 2, mark)
        assert [(t.topic_name, p.partition_index, p.delete_partition) for r in stops for t in r.topic_states
                for p in t.partition_states] == [("gone", 0, True)]
        kinds = [int(r.__api_key__) for b, r in chan.sent[mark:] if b == 2]
        assert kinds.index(UM) < kinds.index(STOP)

    run_async(cluster.run(body()))


# ---- brokers going and coming -----------------------------------------------------------------------


def test_broker_death_elects_from_the_isr_and_leaves_partitions_offline_when_none_is_alive(cluster, run_async):
    async def body():
        for b in (1, 2, 3):
            await cluster.add_broker(b)
        c, chan = await cluster.controller(1)
        await active(c)
        zk = await cluster.client()
        await zk.create_topic("t", {0: [1, 2, 3], 1: [2, 1, 3]})
        await zk.create_topic("solo", {0: [3]})
        await state_of(zk, "t", 1, leader=2)
        await state_of(zk, "solo", 0, leader=3)
        mark = len(chan.sent)
        await cluster.kill_broker(1)
        s0 = await state_of(zk, "t", 0, leader=2)  # first live ISR member in assignment order
        assert (s0.isr, s0.leader_epoch, s0.zk_version) == ((2, 3), 1, 1)
        s1 = await state_of(zk, "t", 1, isr=(2, 3))  # a follower left the ISR: leader epoch + 1 too
        assert (s1.leader, s1.leader_epoch) == (2, 1)
        await wait_for(lambda: chan.partitions(UM, 3, mark).get(("t", 0)), 15, "UpdateMetadata after the death")
        to3 = chan.partitions(LAI, 3, mark)
        assert (to3[("t", 0)].leader, to3[("t", 0)].leader_epoch, to3[("t", 0)].partition_epoch) == (2, 1, 1)
        assert chan.requests(LAI, 1, mark) == [] and chan.requests(UM, 1, mark) == []
        um3 = chan.partitions(UM, 3, mark)
        assert um3[("t", 0)].offline_replicas == (1,) and um3[("t", 0)].leader == 2
        kinds = [int(r.__api_key__) for b, r in chan.sent[mark:] if b == 3]
        assert kinds[:2] == [LAI, UM]

        await cluster.kill_broker(3)
        solo = await state_of(zk, "solo", 0, leader=-1)  # nobody left to lead: offline, ISR kept
        assert (solo.isr, solo.leader_epoch) == ((3,), 1)
        await cluster.kill_broker(2)
        s0 = await state_of(zk, "t", 0, leader=-1)
        assert s0.leader_epoch == 3

        # Broker 3 comes back: it gets the metadata, then LeaderAndIsr for its replicas, then leads solo-0 again.
        mark = len(chan.sent)
        await cluster.add_broker(3)
        solo = await state_of(zk, "solo", 0, leader=3)
        assert (solo.isr, solo.leader_epoch) == ((3,), 2)
        await wait_for(lambda: chan.partitions(LAI, 3, mark).get(("solo", 0), None) is not None
                       and chan.partitions(LAI, 3, mark)[("solo", 0)].leader == 3, 15, "solo-0 led by 3")
        first = chan.sent[mark:]
        assert int(first[0][1].__api_key__) == UM and first[0][1].broker_epoch == cluster.epochs[3]
        rejoin = chan.requests(LAI, 3, mark)[0]
        assert not any(p.is_new for t in rejoin.topic_states for p in t.partition_states)
        # t-0 lost 3 from its ISR while 2 led, then 2 died last: ISR (2,), so the returning 3 may not lead it.
        t0 = await zk.get_partition_state("t", 0)
        assert (t0.leader, t0.isr) == (-1, (2,))

    run_async(cluster.run(body()))


def test_broker_death_without_any_partition_still_tells_every_broker_it_is_gone(cluster, run_async):
    """No topic at all (so no partition state changes): Kafka's onReplicasBecomeOffline still sends an
    UpdateMetadata to the live brokers, else they list the dead broker forever."""
    async def body():
        for b in (1, 2, 3):
            await cluster.add_broker(b)
        c, chan = await cluster.controller(1)
        await active(c)
        mark = len(chan.sent)
        await cluster.kill_broker(3)
        await wait_for(lambda: len(chan.requests(UM, since=mark)) == 2, 15, "UpdateMetadata to brokers 1 and 2")
        for b in (1, 2):
            update = chan.requests(UM, b, mark)[0]
            assert sorted(int(x.id_) for x in update.live_brokers) == [1, 2]
            assert update.broker_epoch == cluster.epochs[b]
        assert chan.requests(UM, 3, mark) == []

    run_async(cluster.run(body()))


def test_a_broker_that_changes_its_endpoints_is_reached_at_the_new_address(cluster, run_async):
    async def body():
        for b in (1, 2):
            await cluster.add_broker(b)
        c, chan = await cluster.controller(1)
        await active(c)
        mark = len(chan.sent)
        await cluster.brokers[2].update_broker_registration(2, [Endpoint("PLAINTEXT", "127.0.0.1", 29002)])
        await wait_for(lambda: chan.brokers.get(2) == ("127.0.0.1", 29002), 15, "the channel to use the new port")
        await wait_for(lambda: len(chan.requests(UM, since=mark)) == 2, 15, "UpdateMetadata to both brokers")
        update = chan.requests(UM, 1, mark)[0]
        assert [(b.id_, b.endpoints[0].port) for b in update.live_brokers] == [(1, 19001), (2, 29002)]

    run_async(cluster.run(body()))


@pytest.mark.parametrize("where", ["topic", "dynamic broker default"])
def test_unclean_election_when_the_topic_or_the_dynamic_broker_default_allows_it(cluster, run_async, tmp_path, where):
    """unclean.leader.election.enable of the topic, else the broker's, dynamic (AlterConfigs, here the cluster
    default) as Kafka's controller reads its reconfigured KafkaConfig."""
    from pykbroker.cluster.dynamic_configs import DynamicConfigs
    from pykbroker.cluster.metadata import DEFAULT_BROKER_ENTITY, EmbeddedMetadata

    async def body():
        for b in (1, 2):
            await cluster.add_broker(b)
        c, chan = await cluster.controller(1)
        if where != "topic":
            (tmp_path / "dynamic").mkdir()
            c.dynamic_configs = DynamicConfigs(c.config, EmbeddedMetadata(tmp_path / "dynamic", 1, "127.0.0.1", 9092))
            await c.dynamic_configs.alter_async(DEFAULT_BROKER_ENTITY, {"unclean.leader.election.enable": "true"})
        await active(c)
        zk = await cluster.client()
        config = {"unclean.leader.election.enable": "true"} if where == "topic" else {}
        tid = await zk.create_topic("u", {0: [1, 2]}, config=config)
        s = await state_of(zk, "u", 0, leader=1)
        # The leader drops 2 from the ISR, then dies: only the out-of-sync 2 is left.
        resp = await c.alter_partition(alter(1, cluster.epochs[1], kafka_uuid_to_uuid(tid), 0, 0, {1: cluster.epochs[1]},
                                             s.zk_version))
        assert resp.topics[0].partitions[0].error_code == ErrorCode.none
        await cluster.kill_broker(1)
        s = await state_of(zk, "u", 0, leader=2)
        assert (s.isr, s.leader_recovery_state) == ((2,), 1)

    run_async(cluster.run(body()))


# ---- AlterPartition ---------------------------------------------------------------------------------


def test_alter_partition_accepts_a_new_isr_and_fences_stale_requests(cluster, run_async):
    async def body():
        for b in (1, 2, 3):
            await cluster.add_broker(b)
        c, chan = await cluster.controller(1)
        await active(c)
        zk = await cluster.client()
        tid = kafka_uuid_to_uuid(await zk.create_topic("a", {0: [1, 2, 3]}))
        await state_of(zk, "a", 0, leader=1)
        e = cluster.epochs
        mark = len(chan.sent)
        resp = await c.alter_partition(alter(1, e[1], tid, 0, 0, {1: e[1], 2: e[2]}, 0))
        assert resp.error_code == ErrorCode.none
        [part] = resp.topics[0].partitions
        assert resp.topics[0].topic_id == tid
        assert (part.error_code, part.leader_id, part.leader_epoch, part.isr, part.partition_epoch) == (
            ErrorCode.none, 1, 0, (1, 2), 1)
        s = await zk.get_partition_state("a", 0)
        assert (s.isr, s.leader_epoch, s.zk_version) == ((1, 2), 0, 1)
        # UpdateMetadata with the new ISR went to every broker before the answer; no LeaderAndIsr.
        assert [b for b, r in chan.sent[mark:]] == [1, 2, 3]
        assert chan.partitions(UM, 2, mark)[("a", 0)].isr == (1, 2)
        assert chan.requests(LAI, since=mark) == []

        async def error(request):
            r = await c.alter_partition(request)
            return r.error_code if r.error_code != ErrorCode.none else r.topics[0].partitions[0].error_code

        assert await error(alter(1, e[1] + 1000, tid, 0, 0, {1: e[1]}, 1)) == ErrorCode.stale_broker_epoch
        assert await error(alter(1, e[1], tid, 0, 5, {1: e[1]}, 1)) == ErrorCode.fenced_leader_epoch
        assert await error(alter(1, e[1], tid, 0, 0, {1: e[1]}, 0)) == ErrorCode.invalid_update_version
        assert await error(alter(1, e[1], tid, 0, 0, {1: e[1], 9: -1}, 1)) == ErrorCode.ineligible_replica
        assert await error(alter(1, e[1], tid, 0, 0, {1: e[1], 3: e[3] + 1}, 1)) == ErrorCode.ineligible_replica
        assert await error(alter(1, e[1], uuid.uuid4(), 0, 0, {1: e[1]}, 1)) == ErrorCode.unknown_topic_id
        assert await error(alter(1, e[1], tid, 7, 0, {1: e[1]}, 1)) == ErrorCode.unknown_topic_or_partition
        # A retried request for the ISR already written answers the current state.
        again = await c.alter_partition(alter(1, e[1], tid, 0, 0, {1: e[1], 2: e[2]}, 0))
        assert again.topics[0].partitions[0].error_code == ErrorCode.none
        assert again.topics[0].partitions[0].partition_epoch == 1
        s = await zk.get_partition_state("a", 0)
        assert s.zk_version == 1  # nothing rewritten by the refused ones

        other, _ = await cluster.controller(2)
        refused = await other.alter_partition(alter(1, e[1], tid, 0, 0, {1: e[1]}, 1))
        assert refused.error_code == ErrorCode.not_controller

    run_async(cluster.run(body()))


# ---- ControlledShutdown and elections ---------------------------------------------------------------


def test_controlled_shutdown_moves_leaderships_and_preferred_election_moves_them_back(cluster, run_async):
    async def body():
        for b in (1, 2):
            await cluster.add_broker(b)
        c, chan = await cluster.controller(1)
        await active(c)
        zk = await cluster.client()
        tid = kafka_uuid_to_uuid(await zk.create_topic("s", {0: [1, 2], 1: [2, 1], 2: [1]}))
        for p, leader in ((0, 1), (1, 2), (2, 1)):
            await state_of(zk, "s", p, leader=leader)
        assert await c.controlled_shutdown(1, cluster.epochs[1] - 1) == (ErrorCode.stale_broker_epoch, [])
        mark = len(chan.sent)
        assert await c.controlled_shutdown(1, cluster.epochs[1]) == (ErrorCode.none, [])  # s-2 (RF 1) not counted
        s0 = await zk.get_partition_state("s", 0)
        assert (s0.leader, s0.isr, s0.leader_epoch) == (2, (2,), 1)
        s1 = await zk.get_partition_state("s", 1)
        assert (s1.leader, s1.isr, s1.leader_epoch) == (2, (2,), 1)
        assert (await zk.get_partition_state("s", 2)).leader == 1
        # The leaving broker hears about the move, and StopReplica (no delete) for its follower replica.
        assert chan.partitions(LAI, 1, mark)[("s", 0)].leader == 2
        stops = chan.requests(STOP, 1, mark)
        assert [(t.topic_name, p.partition_index, p.delete_partition) for r in stops for t in r.topic_states
                for p in t.partition_states] == [("s", 1, False)]
        # Shutting down: not eligible for the ISR.
        refused = await c.alter_partition(alter(2, cluster.epochs[2], tid, 0, 1, {2: cluster.epochs[2], 1: -1},
                                                s0.zk_version))
        assert refused.topics[0].partitions[0].error_code == ErrorCode.ineligible_replica
        assert (await c.elect_leaders(0, [("s", 0)]))[("s", 0)][0] == ErrorCode.preferred_leader_not_available

        # Broker 1 restarts (a new registration), catches up, and the preferred election moves s-0 back.
        await cluster.kill_broker(1)
        await cluster.add_broker(1)
        await wait_for(lambda: c._brokers.get(1) is not None and c._brokers[1].epoch == cluster.epochs[1], 15,
                       "the controller to see broker 1 again")
        s0 = await zk.get_partition_state("s", 0)
        ok = await c.alter_partition(alter(2, cluster.epochs[2], tid, 0, s0.leader_epoch,
                                           {2: cluster.epochs[2], 1: cluster.epochs[1]}, s0.zk_version))
        assert ok.topics[0].partitions[0].error_code == ErrorCode.none
        mark = len(chan.sent)
        results = await c.elect_leaders(0, [("s", 0), ("s", 2), ("nope", 0)])
        assert results[("s", 0)] == (ErrorCode.none, None)
        assert results[("s", 2)][0] == ErrorCode.election_not_needed
        assert results[("nope", 0)][0] == ErrorCode.unknown_topic_or_partition
        after = await zk.get_partition_state("s", 0)
        assert (after.leader, after.leader_epoch, after.isr) == (1, s0.leader_epoch + 1, (2, 1))
        sent = chan.partitions(LAI, 2, mark)[("s", 0)]
        assert (sent.leader, sent.leader_epoch, sent.partition_epoch) == (1, after.leader_epoch, after.zk_version)
        assert (await c.elect_leaders(0, [("s", 0)]))[("s", 0)][0] == ErrorCode.election_not_needed

    run_async(cluster.run(body()))


def test_auto_leader_rebalance_moves_leadership_to_the_preferred_replica(cluster, run_async):
    async def body():
        for b in (1, 2):
            await cluster.add_broker(b)
        c, chan = await cluster.controller(1, **{"leader.imbalance.check.interval.seconds": 1})
        await active(c)
        zk = await cluster.client()
        tid = kafka_uuid_to_uuid(await zk.create_topic("r", {0: [1, 2]}))
        await state_of(zk, "r", 0, leader=1)
        await cluster.kill_broker(1)
        s = await state_of(zk, "r", 0, leader=2)
        await cluster.add_broker(1)
        await wait_for(lambda: c._brokers.get(1) is not None and c._brokers[1].epoch == cluster.epochs[1], 15,
                       "the controller to see broker 1 again")
        ok = await c.alter_partition(alter(2, cluster.epochs[2], tid, 0, s.leader_epoch,
                                           {2: cluster.epochs[2], 1: cluster.epochs[1]}, s.zk_version))
        assert ok.topics[0].partitions[0].error_code == ErrorCode.none
        s = await state_of(zk, "r", 0, leader=1)  # within a few check intervals
        assert s.isr == (2, 1)

    run_async(cluster.run(body()))


# ---- the real channel -------------------------------------------------------------------------------


class FakeBroker:
    """A TCP server that decodes inter-broker request frames and answers each with no error."""

    def __init__(self) -> None:
        self.received: list[tuple[object, object]] = []
        self.server: asyncio.AbstractServer | None = None

    async def start(self, port: int = 0) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                header, body = ib.decode_request(await reader.readexactly(size))
                self.received.append((header, body))
                key = int(body.__api_key__)
                if key == LAI:
                    answer = lai_resp.LeaderAndIsrResponse(error_code=ErrorCode.none, topics=tuple(
                        lai_resp.LeaderAndIsrTopicError(topic_id=t.topic_id, partition_errors=tuple(
                            lai_resp.LeaderAndIsrPartitionError(partition_index=p.partition_index,
                                                                error_code=ErrorCode.none)
                            for p in t.partition_states)) for t in body.topic_states))
                elif key == UM:
                    answer = um_resp.UpdateMetadataResponse(error_code=ErrorCode.none)
                else:
                    answer = sr_resp.StopReplicaResponse(error_code=ErrorCode.none, partition_errors=())
                writer.write(ib.encode_response(answer, correlation_id=header.correlation_id))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def test_the_real_channel_delivers_in_order_and_resends_until_the_broker_answers(cluster, run_async):
    async def body():
        fake = FakeBroker()
        port = await fake.start()
        await fake.close()  # nothing listens there yet: the first attempts fail
        await cluster.add_broker(1, port=port)
        channel = ControllerChannel(1, request_timeout_s=5, retry_backoff_s=0.05)
        c, _ = await cluster.controller(1, channel=channel)
        await active(c)
        zk = await cluster.client()
        await zk.create_topic("wire", {0: [1], 1: [1]})
        await state_of(zk, "wire", 1, leader=1)
        fake = FakeBroker()
        await fake.start(port)
        try:
            await wait_for(lambda: len(fake.received) >= 3, 20, "UpdateMetadata, LeaderAndIsr, UpdateMetadata")
            headers = [h for h, _ in fake.received]
            bodies = [b for _, b in fake.received]
            assert [int(b.__api_key__) for b in bodies[:3]] == [UM, LAI, UM]
            assert [h.request_api_version for h in headers[:3]] == [8, 7, 8]
            assert [h.correlation_id for h in headers] == list(range(len(headers)))  # one connection, in order
            assert {h.client_id for h in headers} == {"1"}
            assert bodies[0].topic_states == () and [b.id_ for b in bodies[0].live_brokers] == [1]
            assert bodies[1].broker_epoch == cluster.epochs[1]
            assert [p.partition_index for p in bodies[1].topic_states[0].partition_states] == [0, 1]
        finally:
            await c.stop()
            await fake.close()

    run_async(cluster.run(body()))


# ---- reassignment: failed ZooKeeper writes -----------------------------------------------------------


async def three_brokers(cluster: Cluster, **values) -> tuple[Controller, RecordingChannel, KafkaZkClient]:
    """Brokers 1-3 registered, broker 1's controller active, and a ZooKeeper client."""
    for b in (1, 2, 3):
        await cluster.add_broker(b)
    c, chan = await cluster.controller(1, **values)
    await active(c)
    return c, chan, await cluster.client()


@contextlib.contextmanager
def raw_zookeeper(cluster: Cluster):
    """A plain kazoo client, for what the controller's client does not write (another writer, the legacy znode)."""
    kazoo = KazooClient(hosts=cluster.connect)
    kazoo.start()
    try:
        yield kazoo
    finally:
        kazoo.stop()
        kazoo.close()


def _stops(chan: RecordingChannel, broker_id: int, since: int) -> list:
    return [(t.topic_name, p.partition_index, p.delete_partition) for r in chan.requests(STOP, broker_id, since)
            for t in r.topic_states for p in t.partition_states]


def test_reassignment_completion_whose_leader_isr_write_fails_stops_nothing_and_keeps_ar_rr(cluster, run_async):
    """The completion's leader/ISR write loses (the znode moved): the removed replica (here the leader) is
    not deleted and RS/AR/RR stay in ZooKeeper; the next ISR change completes it."""
    async def body():
        c, chan, zk = await three_brokers(cluster)
        tid = kafka_uuid_to_uuid(await zk.create_topic("m", {0: [1, 2, 3]}))
        await state_of(zk, "m", 0, leader=1, isr=(1, 2, 3))
        with raw_zookeeper(cluster) as kazoo:
            original = c._write_states
            moved = []

            async def write_after_someone_else(changes):
                if not moved:  # another writer gets there first: our zkVersion is stale
                    moved.append(True)
                    path = "/brokers/topics/m/partitions/0/state"
                    raw, _ = kazoo.get(path)
                    kazoo.set(path, raw)
                return await original(changes)

            c._write_states = write_after_someone_else
            mark = len(chan.sent)
            # Target [2, 3] is already in the ISR: the reassignment completes at once, with 1 (the leader) removed.
            assert await c.alter_partition_reassignments({("m", 0): [2, 3]}) == {("m", 0): (ErrorCode.none, None)}
            assert moved
            assert _stops(chan, 1, mark) == []  # the leader's replica is not deleted
            stored = await zk.get_topic_assignment("m")
            assert (stored.partitions[0], stored.removing_replicas.get(0)) == ([2, 3, 1], [1])
            assert c._full_assignment(("m", 0)).being_reassigned
            assert (await zk.get_partition_state("m", 0)).leader == 1

            # The next ISR change retries: now it completes, and 1 is stopped and deleted.
            c._write_states = original
            e = cluster.epochs
            for isr in ({1: e[1], 2: e[2]}, {1: e[1], 2: e[2], 3: e[3]}):  # 3 falls behind and catches up
                s = await zk.get_partition_state("m", 0)
                ok = await c.alter_partition(alter(1, e[1], tid, 0, s.leader_epoch, isr, s.zk_version))
                assert ok.topics[0].partitions[0].error_code == ErrorCode.none
            await state_of(zk, "m", 0, leader=2)
            assert ("m", 0, True) in _stops(chan, 1, mark)
            stored = await zk.get_topic_assignment("m")
            assert (stored.partitions[0], stored.removing_replicas.get(0)) == ([2, 3], None)

    run_async(cluster.run(body()))


def test_reassignment_whose_assignment_write_fails_fails_over_and_resends_the_written_state(cluster, run_async):
    """/brokers/topics/<t> cannot be written at completion (after the new leader epoch was): the failure
    is not swallowed; the controller fails over from ZooKeeper and every replica hears of the epoch that
    ZooKeeper has (else AlterPartition would be fenced for good)."""
    from pykbroker.cluster.zookeeper import StaleZkVersion

    async def body():
        c, chan, zk = await three_brokers(cluster)
        await zk.create_topic("w", {0: [1, 2, 3]})
        await state_of(zk, "w", 0, leader=1, isr=(1, 2, 3))
        original = c.zk.set_topic_assignment
        calls = []

        async def failing(*args, **kwargs):
            calls.append(1)
            if len(calls) > 1:  # the first (RS/AR/RR) lands, the completion's (RS = TRS) never does
                raise StaleZkVersion("test: /brokers/topics/w changed")
            return await original(*args, **kwargs)

        c.zk.set_topic_assignment = failing
        result = await c.alter_partition_reassignments({("w", 0): [2, 3]})
        c.zk.set_topic_assignment = original
        assert result != {("w", 0): (ErrorCode.none, None)}  # not reported done

        async def settled():
            state = await zk.get_partition_state("w", 0)
            sent = chan.partitions(LAI, 2).get(("w", 0))
            stored = await zk.get_topic_assignment("w")
            return (c.active and sent is not None and sent.leader_epoch == state.leader_epoch
                    and stored.partitions[0] == [2, 3] and not stored.removing_replicas)

        await wait_for(settled, 30, "the failover to complete the reassignment and resend the state")

    run_async(cluster.run(body()))


def test_auto_leader_rebalance_leaves_partitions_being_reassigned_alone(cluster, run_async):
    async def body():
        c, chan, zk = await three_brokers(cluster, **{"leader.imbalance.check.interval.seconds": 3600})
        await zk.create_topic("q", {0: [2, 1]})
        await state_of(zk, "q", 0, leader=2, isr=(2, 1))
        # To [1, 2, 3]: 3 is not in the ISR, so the reassignment stays under way with RS [1, 2, 3], leader 2.
        assert await c.alter_partition_reassignments({("q", 0): [1, 2, 3]}) == {("q", 0): (ErrorCode.none, None)}
        assert c._full_assignment(("q", 0)).being_reassigned
        before = await zk.get_partition_state("q", 0)
        await c._run("AutoPreferredReplicaLeaderElection", c._auto_rebalance)  # preferred 1 is live and in the ISR
        after = await zk.get_partition_state("q", 0)
        assert (after.leader, after.leader_epoch) == (2, before.leader_epoch)

    run_async(cluster.run(body()))


def test_deleting_a_topic_mid_reassignment_clears_it_from_the_legacy_document(cluster, run_async):
    from pykbroker.cluster.reassignment import REASSIGN_PARTITIONS_PATH, decode_reassignment_znode, \
        encode_reassignment_znode

    async def body():
        c, chan, zk = await three_brokers(cluster)
        await zk.create_topic("d", {0: [1, 2]})
        await zk.create_topic("keep", {0: [1, 2]})
        await state_of(zk, "d", 0, leader=1)
        await state_of(zk, "keep", 0, leader=1)
        with raw_zookeeper(cluster) as kazoo:
            # Both go to [2, 3]: 3 never joins the ISR here, so both stay under way and in the document.
            kazoo.create(REASSIGN_PARTITIONS_PATH, encode_reassignment_znode({("d", 0): [2, 3], ("keep", 0): [2, 3]}))
            await wait_for(lambda: ("d", 0) in c._adding and ("keep", 0) in c._adding, 15,
                           "the reassignments to start")
            await zk.mark_topic_for_deletion("d")
            await wait_for(lambda: "d" not in c._assignments, 15, "the topic to be deleted")
            raw, _ = kazoo.get(REASSIGN_PARTITIONS_PATH)
            assert decode_reassignment_znode(raw) == {("keep", 0): [2, 3]}
            assert not [tp for tp in (*c._adding, *c._removing) if tp[0] == "d"]

    run_async(cluster.run(body()))


"""KafkaZkClient against a real ZooKeeper: registration, election, fencing, conditional writes, producer-id
blocks, topics and configs, session expiry. Each test works under its own chroot on the shared server,
except the fault tests, which pause their own server."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install kazoo, or the project's test extra)")
from kazoo.client import KazooClient

from pykbroker.cluster import zookeeper as zkm
from pykbroker.cluster.zk_server import four_letter_word
from pykbroker.cluster.zookeeper import (
    BrokerIdInUse,
    ControllerMoved,
    Endpoint,
    KafkaZkClient,
    PartitionState,
    SessionEvent,
    StaleZkVersion,
)
from cluster_helpers import wait_for

EP = [Endpoint("PLAINTEXT", "127.0.0.1", 19092)]


async def started(connect: str, **kw) -> KafkaZkClient:
    c = KafkaZkClient(connect, session_timeout_ms=kw.pop("session_timeout_ms", 6000), **kw)
    await c.start()
    return c


def raw_client(hosts: str) -> KazooClient:
    k = KazooClient(hosts=hosts, timeout=6)
    k.start(15)
    return k


# ---- the server runner ------------------------------------------------------------------------------


def test_server_answers_restarts_and_stops(zk_server_fresh):
    srv = zk_server_fresh
    assert four_letter_word(srv.host, srv.port, "ruok") == "imok"
    assert "Mode: standalone" in four_letter_word(srv.host, srv.port, "srvr")
    k = raw_client(srv.connect_string)
    k.create("/kept", b"x")
    k.stop()
    k.close()
    old_pid = srv.pid
    srv.restart()
    assert srv.pid != old_pid
    k = raw_client(srv.connect_string)
    try:
        assert k.get("/kept")[0] == b"x"  # same data dir: znodes survive a restart
    finally:
        k.stop()
        k.close()
    proc = srv.proc
    srv.stop()
    assert proc.poll() is not None
    assert not srv.answers()


def test_pause_makes_server_silent_and_resume_brings_it_back(zk_server_fresh):
    srv = zk_server_fresh
    srv.pause()
    try:
        assert not srv.answers()
    finally:
        srv.resume()
    srv.wait_serving(10)
    assert srv.answers()


# ---- chroot, top-level paths, cluster id -------------------------------------------------------------


def test_chroot_is_created_with_kafkas_persistent_paths(zk_server, zk_connect, run_async):
    async def scenario():
        c = await started(zk_connect)
        try:
            assert c.chroot and zk_connect.endswith(c.chroot)
            for path in zkm.PERSISTENT_PATHS:
                found = await c.get_or_none(path)
                assert found is not None, path
                assert found[0] is None, f"{path} must hold null data as Kafka writes it, not {found[0]!r}"
        finally:
            await c.close()
        k = raw_client(zk_server.connect_string)  # outside the chroot: it is a real znode there
        try:
            assert k.exists(c.chroot + "/brokers/ids") is not None
            assert k.exists("/brokers") is None
        finally:
            k.stop()
            k.close()

    run_async(scenario())


def test_cluster_id_is_created_once_and_shared(zk_connect, run_async):
    async def scenario():
        a, b = await started(zk_connect), await started(zk_connect)
        try:
            ids = await asyncio.gather(a.get_or_create_cluster_id(), b.get_or_create_cluster_id())
            assert ids[0] == ids[1]
            assert len(zkm.kafka_uuid_to_uuid(ids[0]).bytes) == 16
            data, _ = await a.get(zkm.CLUSTER_ID_PATH)
            assert json.loads(data) == {"version": "1", "id": ids[0]}
            assert await b.get_or_create_cluster_id("ignored-since-one-exists") == ids[0]
        finally:
            await a.close()
            await b.close()

    run_async(scenario())


# ---- broker registration ----------------------------------------------------------------------------


def test_registration_epoch_watch_duplicate_and_removal_on_close(zk_connect, run_async):
    async def scenario():
        observer = await started(zk_connect)
        seen: list[list[int]] = []
        observer.watch_brokers(seen.append)
        await wait_for(lambda: seen and seen[-1] == [], what="initial empty broker list")

        b1 = await started(zk_connect)
        epoch = await b1.register_broker(1, EP, rack="r1")
        data, stat = await observer.get(zkm.broker_path(1))
        assert stat.ephemeralOwner == b1.session_id
        assert epoch == stat.czxid
        assert stat.version == 1  # created, then its data set at version 0, in one transaction (as Kafka)
        doc = json.loads(data)
        assert doc["version"] == 5 and doc["host"] == "127.0.0.1" and doc["port"] == 19092
        assert doc["endpoints"] == ["PLAINTEXT://127.0.0.1:19092"] and doc["rack"] == "r1"
        reg = await observer.get_broker(1)
        assert reg.epoch == epoch and reg.endpoint().port == 19092
        await wait_for(lambda: seen[-1] == [1], what="watch to report broker 1")

        b1_again = await started(zk_connect)
        try:
            with pytest.raises(BrokerIdInUse, match=r"Error while creating ephemeral at /brokers/ids/1, node already exists"):
                await b1_again.register_broker(1, EP)
            # the same session registering twice (a retried create) gets its own epoch back
            assert await b1.register_broker(1, EP) == epoch
            b2 = await started(zk_connect)
            epoch2 = await b2.register_broker(2, [Endpoint("PLAINTEXT", "127.0.0.1", 19093)])
            assert epoch2 > epoch
            await wait_for(lambda: seen[-1] == [1, 2], what="watch to report brokers 1 and 2")
            assert set(await observer.live_brokers()) == {1, 2}
            await b2.update_broker_registration(2, [Endpoint("PLAINTEXT", "127.0.0.1", 19094)], rack="r2")
            moved = await observer.get_broker(2)
            assert moved.endpoint().port == 19094 and moved.rack == "r2" and moved.epoch == epoch2

            await b1.close()  # closing the session removes the ephemeral registration at once
            await wait_for(lambda: seen[-1] == [2], what="watch to report broker 1 gone")
            assert await observer.get_broker(1) is None
            # now the id is free again, with a new (larger) epoch
            assert await b1_again.register_broker(1, EP) > epoch2
            await b2.close()
        finally:
            await b1_again.close()
            await observer.close()

    run_async(scenario())


# ---- controller election and fencing -----------------------------------------------------------------


def test_controller_race_has_exactly_one_winner_and_epoch_goes_up_by_one(zk_connect, run_async):
    async def scenario():
        clients = [await started(zk_connect) for _ in range(4)]
        observer = await started(zk_connect)
        try:
            changes: list[int | None] = []
            observer.watch_controller(changes.append)
            await wait_for(lambda: changes == [None], what="controller watch to report no controller")
            assert await observer.get_controller_epoch() is None

            results = await asyncio.gather(*(c.try_become_controller(i + 1) for i, c in enumerate(clients)))
            winners = [r for r in results if r is not None]
            assert len(winners) == 1, results
            first = winners[0]
            assert first.epoch == 1
            assert await observer.get_controller_epoch() == (1, first.epoch_zk_version)
            assert await observer.get_controller_id() == first.broker_id
            data, stat = await observer.get(zkm.CONTROLLER_PATH)
            assert json.loads(data)["brokerid"] == first.broker_id
            assert stat.ephemeralOwner == clients[first.broker_id - 1].session_id
            await wait_for(lambda: changes and changes[-1] == first.broker_id, what="controller watch")

            # the controller goes away; the others race again: one wins with epoch 2
            await clients[first.broker_id - 1].close()
            await wait_for(lambda: changes[-1] is None, what="controller watch to see it gone")
            rest = [(i + 1, c) for i, c in enumerate(clients) if i + 1 != first.broker_id]
            results = await asyncio.gather(*(c.try_become_controller(bid) for bid, c in rest))
            winners = [r for r in results if r is not None]
            assert len(winners) == 1, results
            assert winners[0].epoch == 2
            assert (await rest[0][1].get_controller_epoch())[0] == 2
            await wait_for(lambda: changes[-1] == winners[0].broker_id, what="controller watch to see the new one")
        finally:
            for c in clients + [observer]:
                await c.close()

    run_async(scenario())


def test_stale_controller_writes_fail_after_another_controller_bumped_the_epoch(zk_server, zk_connect, run_async):
    async def scenario():
        a, b = await started(zk_connect), await started(zk_connect)
        try:
            lead_a = await a.try_become_controller(1)
            assert lead_a is not None and lead_a.epoch == 1
            await a.create_topic("t", {0: [1, 2]})
            state = PartitionState(leader=1, leader_epoch=0, isr=(1, 2), controller_epoch=lead_a.epoch)
            assert await a.create_partition_states("t", {0: state}, lead_a.epoch_zk_version) == {0: 0}

            assert await b.try_become_controller(2) is None  # a still holds /controller
            # a loses /controller (as when its session expires, or an operator deletes it in zkCli)
            k = raw_client(zk_server.connect_string + a.chroot)
            k.delete(zkm.CONTROLLER_PATH)
            k.stop()
            k.close()
            lead_b = await b.try_become_controller(2)
            assert lead_b is not None and lead_b.epoch == 2

            moved = PartitionState(leader=2, leader_epoch=1, isr=(2,), controller_epoch=lead_a.epoch)
            with pytest.raises(ControllerMoved):
                await a.update_partition_state("t", 0, moved, 0, lead_a.epoch_zk_version)
            with pytest.raises(ControllerMoved):
                await a.create_partition_states("t2", {0: state}, lead_a.epoch_zk_version)
            after = await b.get_partition_state("t", 0)
            assert after.leader == 1 and after.zk_version == 0  # nothing of the stale write landed
            assert await b.get_or_none(zkm.partition_state_path("t2", 0)) is None

            fresh = PartitionState(leader=2, leader_epoch=1, isr=(2,), controller_epoch=lead_b.epoch)
            assert await b.update_partition_state("t", 0, fresh, 0, lead_b.epoch_zk_version) == 1
            got = await a.get_partition_state("t", 0)
            assert (got.leader, got.leader_epoch, got.isr, got.controller_epoch, got.zk_version) == (2, 1, (2,), 2, 1)
        finally:
            await a.close()
            await b.close()

    run_async(scenario())


# ---- partition state ---------------------------------------------------------------------------------


def test_partition_state_changes_only_with_the_expected_zk_version(zk_connect, run_async):
    async def scenario():
        c = await started(zk_connect)
        try:
            lead = await c.try_become_controller(1)
            s0 = PartitionState(leader=1, leader_epoch=0, isr=(1, 2, 3), controller_epoch=lead.epoch)
            await c.create_partition_states("p", {0: s0, 1: s0}, lead.epoch_zk_version)
            s1 = PartitionState(leader=1, leader_epoch=0, isr=(1, 2), controller_epoch=lead.epoch)
            v1 = await c.update_partition_state("p", 0, s1, expected_zk_version=0)  # a leader's ISR shrink
            assert v1 == 1
            s2 = PartitionState(leader=1, leader_epoch=0, isr=(1,), controller_epoch=lead.epoch)
            with pytest.raises(StaleZkVersion):
                await c.update_partition_state("p", 0, s2, expected_zk_version=0)
            with pytest.raises(StaleZkVersion):
                await c.update_partition_state("p", 0, s2, expected_zk_version=0, controller_epoch_zk_version=lead.epoch_zk_version)
            got = await c.get_partition_state("p", 0)
            assert got.isr == (1, 2) and got.zk_version == 1
            assert await c.update_partition_state("p", 0, s2, 1, lead.epoch_zk_version) == 2
            assert (await c.get_partition_state("p", 1)).zk_version == 0  # untouched neighbour
            with pytest.raises(zkm.NodeExistsError):  # creating an existing state is refused, not overwritten
                await c.create_partition_states("p", {1: s2}, lead.epoch_zk_version)
            seen: list = []
            c.watch_partition_state("p", 0, seen.append)
            await wait_for(lambda: seen and seen[-1].zk_version == 2, what="state watch")
            s3 = PartitionState(leader=2, leader_epoch=1, isr=(2,), controller_epoch=lead.epoch, leader_recovery_state=1)
            await c.update_partition_state("p", 0, s3, 2, lead.epoch_zk_version)
            await wait_for(lambda: seen[-1].leader == 2 and seen[-1].leader_recovery_state == 1, what="state watch update")
        finally:
            await c.close()

    run_async(scenario())


# ---- producer ids ------------------------------------------------------------------------------------


def test_producer_id_blocks_from_two_clients_never_overlap(zk_connect, run_async):
    async def scenario():
        a, b = await started(zk_connect), await started(zk_connect)
        try:
            async def take(client, broker_id, n):
                return [await client.allocate_producer_id_block(broker_id) for _ in range(n)]

            blocks_a, blocks_b = await asyncio.gather(take(a, 1, 15), take(b, 2, 15))
            blocks = sorted(blocks_a + blocks_b, key=lambda blk: blk.first)
            assert [blk.first for blk in blocks] == [i * 1000 for i in range(30)]
            assert all(blk.size == 1000 for blk in blocks)
            ids = set()
            for blk in blocks:
                r = set(range(blk.first, blk.last + 1))
                assert not (ids & r)
                ids |= r
            assert {blk.broker_id for blk in blocks_a} == {1} and {blk.broker_id for blk in blocks_b} == {2}
            data, _ = await a.get(zkm.PRODUCER_ID_BLOCK_PATH)
            last = max(blocks, key=lambda blk: blk.last)
            assert json.loads(data) == {
                "version": 1, "broker": last.broker_id, "block_start": str(last.first), "block_end": str(last.last)
            }
        finally:
            await a.close()
            await b.close()

    run_async(scenario())


# ---- topics, configs, deletion -----------------------------------------------------------------------


def test_topic_assignment_config_changes_and_deletion(zk_connect, run_async):
    async def scenario():
        c = await started(zk_connect)
        try:
            topics_seen: list[list[str]] = []
            c.watch_topics(topics_seen.append)
            tid = await c.create_topic("orders", {0: [1, 2, 3], 1: [2, 3, 1]}, config={"retention.ms": "1000"})
            with pytest.raises(zkm.TopicExists):
                await c.create_topic("orders", {0: [1]})
            data, _ = await c.get(zkm.topic_path("orders"))
            assert json.loads(data) == {
                "partitions": {"0": [1, 2, 3], "1": [2, 3, 1]}, "topic_id": tid,
                "adding_replicas": {}, "removing_replicas": {}, "version": 3,
            }
            a = await c.get_topic_assignment("orders")
            assert a.partitions == {0: [1, 2, 3], 1: [2, 3, 1]} and a.topic_id == tid
            await wait_for(lambda: topics_seen and topics_seen[-1] == ["orders"], what="topic watch")
            assert await c.get_topic_config("orders") == {"retention.ms": "1000"}
            assert await c.children(zkm.CONFIG_CHANGES_PATH) == []  # creation writes no notification (as Kafka)

            changes: list[list[str]] = []
            c.watch_children(zkm.CONFIG_CHANGES_PATH, changes.append)
            name = await c.set_topic_config("orders", {"retention.ms": "2000", "cleanup.policy": "compact"})
            assert name.startswith("config_change_") and len(name) == len("config_change_") + 10
            data, _ = await c.get(f"{zkm.CONFIG_CHANGES_PATH}/{name}")
            assert json.loads(data) == {"version": 2, "entity_path": "topics/orders"}
            data, _ = await c.get(zkm.topic_config_path("orders"))
            assert json.loads(data) == {"version": 1, "config": {"retention.ms": "2000", "cleanup.policy": "compact"}}
            await wait_for(lambda: changes and changes[-1] == [name], what="config change watch")

            lead = await c.try_become_controller(1)
            st = PartitionState(leader=1, leader_epoch=0, isr=(1, 2, 3), controller_epoch=lead.epoch)
            await c.create_partition_states("orders", {0: st, 1: st}, lead.epoch_zk_version)
            deletions: list[list[str]] = []
            c.watch_topic_deletions(deletions.append)
            await c.mark_topic_for_deletion("orders")
            await wait_for(lambda: deletions and deletions[-1] == ["orders"], what="deletion watch")
            assert (await c.get(zkm.delete_topic_path("orders")))[0] is None  # null data, as Kafka
            await c.delete_topic_znodes("orders", lead.epoch_zk_version)
            assert await c.get_topic_assignment("orders") is None
            assert await c.get_or_none(zkm.topic_config_path("orders")) is None
            assert await c.topics_marked_for_deletion() == []
            await wait_for(lambda: topics_seen[-1] == [], what="topic watch to see it deleted")
        finally:
            await c.close()

    run_async(scenario())


# ---- session expiry ----------------------------------------------------------------------------------


def expire_session(client: KafkaZkClient) -> None:
    """Make the server expire ``client``'s session now (kazoo's test-harness trick): a second connection
    attaches to the same session id and password and closes it. The server drops the first connection,
    and the client, reconnecting, is told its session has expired."""
    session_id, password = client.kazoo.client_id
    twin = KazooClient(hosts=client.hosts, client_id=(session_id, password), timeout=client.session_timeout_ms / 1000)
    twin.start(15)
    twin.stop()
    twin.close()


def test_session_expiry_reaches_the_loop_and_removes_ephemerals(zk_connect, run_async):
    """The session expires: the EXPIRED event arrives on the asyncio loop's thread, the registration and
    /controller are gone, and after kazoo's new session the broker registers again with a larger epoch and
    wins the controller again with the next epoch."""

    async def scenario():
        loop_thread = threading.get_ident()
        c = await started(zk_connect)
        observer = await started(zk_connect)
        events: list[tuple[str, int]] = []
        c.add_session_listener(lambda e: events.append((e, threading.get_ident())))
        brokers_seen: list[list[int]] = []
        observer.watch_brokers(brokers_seen.append)
        own_seen: list[list[int]] = []
        c.watch_brokers(own_seen.append)  # a watch of the expiring client: it must survive the new session
        try:
            epoch = await c.register_broker(1, EP)
            lead = await c.try_become_controller(1)
            assert lead is not None
            await wait_for(lambda: brokers_seen and brokers_seen[-1] == [1], what="broker 1 registered")
            old_session = c.session_id

            await asyncio.get_running_loop().run_in_executor(None, expire_session, c)

            await wait_for(lambda: any(e == SessionEvent.EXPIRED for e, _ in events), what="EXPIRED on the loop")
            assert all(tid == loop_thread for _, tid in events), "session events must run on the loop thread"
            await wait_for(lambda: brokers_seen[-1] == [], what="the registration to vanish")
            assert await observer.get_controller_id() is None

            await wait_for(lambda: events[-1][0] == SessionEvent.RECONNECTED, what="RECONNECTED")
            assert c.session_id != old_session
            assert await c.register_broker(1, EP) > epoch
            again = await c.try_become_controller(1)
            assert again is not None and again.epoch == lead.epoch + 1
            await wait_for(lambda: own_seen[-1] == [1], what="the expired client's own watch to fire again")
            assert [] in own_seen
        finally:
            await c.close()
            await observer.close()

    run_async(scenario())


PAUSED_BROKER = r"""
import asyncio, json, sys, threading
from pykbroker.cluster.zookeeper import Endpoint, KafkaZkClient, SessionEvent

async def main(connect):
    loop_thread = threading.get_ident()
    c = KafkaZkClient(connect, session_timeout_ms=2000)
    await c.start()
    def say(**kw):
        print(json.dumps(kw), flush=True)
    def on_event(e):
        say(event=e, on_loop=threading.get_ident() == loop_thread)
        if e == SessionEvent.RECONNECTED:
            async def again():
                say(reregistered=await c.register_broker(7, [Endpoint("PLAINTEXT", "127.0.0.1", 1)]))
            asyncio.ensure_future(again())
    c.add_session_listener(on_event)
    say(registered=await c.register_broker(7, [Endpoint("PLAINTEXT", "127.0.0.1", 1)]))
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes stdin
    await c.close()

asyncio.run(main(sys.argv[1]))
"""


def test_a_paused_broker_loses_its_session_and_registers_again_when_resumed(zk_connect, run_async, tmp_path):
    """The broker process (not ZooKeeper) is paused with SIGSTOP beyond its 2 s session timeout, as the
    cluster fault tests will do: ZooKeeper expires the session and deletes the registration; on SIGCONT the
    client learns of the expiry on its loop, gets a new session and registers again with a new epoch."""
    import os
    import queue
    import signal
    import subprocess
    import sys

    script = tmp_path / "paused_broker.py"
    script.write_text(PAUSED_BROKER)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen(
        [sys.executable, str(script), zk_connect], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONPATH": repo},
    )
    lines: "queue.Queue[dict]" = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(json.loads(x)) for x in proc.stdout], daemon=True)
    reader.start()

    def next_line(what: str, timeout: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"timed out waiting for {what}") from None
            if what in msg or msg.get("event") == what:
                return msg

    async def scenario():
        observer = await started(zk_connect)
        seen: list[list[int]] = []
        observer.watch_brokers(seen.append)
        try:
            first = next_line("registered")["registered"]
            await wait_for(lambda: seen and seen[-1] == [7], what="broker 7 registered")
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                await wait_for(lambda: seen[-1] == [], timeout=20, what="ZooKeeper to expire the paused broker")
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            loop = asyncio.get_running_loop()
            expired = await loop.run_in_executor(None, next_line, SessionEvent.EXPIRED)
            assert expired["on_loop"] is True
            again = (await loop.run_in_executor(None, next_line, "reregistered"))["reregistered"]
            assert again > first
            await wait_for(lambda: seen[-1] == [7], what="broker 7 registered again")
        finally:
            await observer.close()

    try:
        run_async(scenario())
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def test_a_short_zookeeper_pause_suspends_but_keeps_the_session(zk_server_fresh, run_async):
    """ZooKeeper paused for less than the session timeout: SUSPENDED, then CONNECTED with the same session;
    the ephemeral registration survives."""
    srv = zk_server_fresh

    async def scenario():
        # kazoo notices the silence after 2/3 of the session timeout; the rest is the margin to reconnect
        c = await started(srv.connect_string + "/kafka", session_timeout_ms=10000)
        events: list[str] = []
        c.add_session_listener(events.append)
        try:
            epoch = await c.register_broker(1, EP)
            session = c.session_id
            srv.pause()
            try:
                await wait_for(lambda: SessionEvent.SUSPENDED in events, timeout=15, what="SUSPENDED")
            finally:
                srv.resume()
            await wait_for(lambda: events[-1] == SessionEvent.CONNECTED, timeout=15, what="CONNECTED again")
            assert SessionEvent.EXPIRED not in events
            assert c.session_id == session
            assert (await c.get_broker(1)).epoch == epoch
        finally:
            await c.close()

    run_async(scenario())


def test_a_server_that_cannot_start_fails_with_its_log(zk_server, tmp_path):
    """A port already taken is refused up front (the server there answers ruok, but it is not ours); a
    server that dies at start fails start() with its log instead of hanging."""
    from pykbroker.cluster.zk_server import ZooKeeperServer, ZooKeeperStartError

    clash = ZooKeeperServer(data_dir=tmp_path / "clash", port=zk_server.port, install=zk_server.install)
    broken = ZooKeeperServer(data_dir=tmp_path / "broken", install=zk_server.install, heap="1k")  # the JVM refuses
    try:
        with pytest.raises(ZooKeeperStartError, match="cannot start ZooKeeper on"):
            clash.start(timeout=30)
        assert clash.proc is None
        assert zk_server.answers()  # the real one is untouched

        with pytest.raises(ZooKeeperStartError, match="ZooKeeper exited with") as info:
            broken.start(timeout=30)
        assert broken.proc is None
        assert "log:" in str(info.value)
    finally:  # should start() wrongly succeed, no server may outlive the test
        clash.stop()
        broken.stop()

"""TopicAdmin in cluster mode against a real ZooKeeper: CreateTopics / DeleteTopics / CreatePartitions write
Kafka's znodes (as AdminZkClient does) and answer once the metadata cache shows the change, which here a
stand-in controller publishes as UpdateMetadata after reading ZooKeeper; without it the wait ends with
REQUEST_TIMED_OUT. Config change notifications reload a topic's config in the cache and in hosted logs."""

from __future__ import annotations

import asyncio
import json
import time
import types
from collections import Counter

import pytest

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install kazoo, or the project's test extra)")

from kio.schema.incremental_alter_configs.v1 import request as iac
from kio.static.primitive import i8

from pykbroker.cluster import zookeeper as zkm
from pykbroker.cluster.topic_admin import TopicAdmin
from pykbroker.cluster.zk_metadata import ZkMetadata
from pykbroker.cluster.zookeeper import KafkaZkClient, kafka_uuid_to_uuid
from pykbroker.config import BrokerConfig
from pykbroker.log.manager import LogManager
from pykbroker.protocol.errors import ErrorCode, KafkaError
from pykbroker.protocol.apis import codec_for
from pykbroker.protocol.interbroker.update_metadata.v8 import request as um8
from pykbroker.server.dispatch import RequestContext
from pykbroker.server.handlers.alter_configs import incremental_alter_configs
from pykbroker.replication.replica_manager import ReplicaManager
from cluster_helpers import wait_for

BROKERS = (1, 2, 3)


def update_metadata(topics: dict[str, tuple[str | None, dict[int, list[int]]]], *, deleted: dict[str, list[int]] | None = None):
    """What the controller sends after acting on ZooKeeper: every partition led by its first replica, all
    replicas in sync; ``deleted`` partitions with leader -2 (LeaderDuringDelete)."""
    states = []
    for name, (topic_id, partitions) in topics.items():
        states.append(um8.UpdateMetadataTopicState(
            topic_name=name, topic_id=kafka_uuid_to_uuid(topic_id) if topic_id else None,
            partition_states=tuple(um8.UpdateMetadataPartitionState(
                partition_index=p, controller_epoch=1, leader=replicas[0], leader_epoch=0, isr=tuple(replicas),
                zk_version=0, replicas=tuple(replicas), offline_replicas=()) for p, replicas in partitions.items())))
    for name, indexes in (deleted or {}).items():
        states.append(um8.UpdateMetadataTopicState(topic_name=name, topic_id=None, partition_states=tuple(
            um8.UpdateMetadataPartitionState(partition_index=p, controller_epoch=1, leader=-2, leader_epoch=0, isr=(),
                                             zk_version=0, replicas=(), offline_replicas=()) for p in indexes)))
    return um8.UpdateMetadataRequest(
        controller_id=1, controller_epoch=1, broker_epoch=1, topic_states=tuple(states),
        live_brokers=tuple(um8.UpdateMetadataBroker(id_=b, rack=None, endpoints=(um8.UpdateMetadataEndpoint(
            port=9090 + b, host="127.0.0.1", listener="PLAINTEXT", security_protocol=0),)) for b in BROKERS))


class Node:
    """One broker's cache and TopicAdmin on a real ZooKeeper, plus a stand-in controller."""

    def __init__(self, zk: KafkaZkClient, data_dir, **config) -> None:
        self.zk = zk
        self.metadata = ZkMetadata(zk, 1, "cid", inter_broker_listener="PLAINTEXT")
        self.logs = LogManager(data_dir)
        self.replicas = ReplicaManager(self.logs, 1, lambda topic: self.admin.log_config(topic))
        # A cluster member: zookeeper.connect set (it gives the cluster's defaults, e.g. the offsets topic's 3
        # replicas); this stand-in reaches ZooKeeper through ``zk``, so the string is not dialled.
        values = {"zookeeper.connect": "127.0.0.1:2181", **config}
        self.admin = TopicAdmin(BrokerConfig(data_dir=data_dir, port=0, values=values, explicit=frozenset(config)),
                                self.metadata, self.replicas)
        self.metadata.apply_update_metadata(update_metadata({}))

    async def publish_when_written(self, topic: str, partitions: int) -> zkm.TopicAssignment:
        """The controller's part: once /brokers/topics/<t> has ``partitions`` partitions, UpdateMetadata."""
        async def written():
            found = await self.zk.get_topic_assignment(topic)
            return found if found is not None and len(found.partitions) >= partitions else None

        assignment = await wait_for(written, what=f"{topic} written with {partitions} partitions")
        self.metadata.apply_update_metadata(update_metadata({topic: (assignment.topic_id, assignment.partitions)}))
        return assignment

    async def close(self) -> None:
        await self.metadata.close()
        self.logs.shutdown()


@pytest.fixture
def node_on(zk_connect, run_async, tmp_path):
    """run(scenario(node)) with a started ZooKeeper client and a Node; everything closed after."""
    def run(scenario, **config):
        async def main():
            zk = KafkaZkClient(zk_connect, session_timeout_ms=6000)
            await zk.start()
            node = Node(zk, tmp_path, **config)
            await node.metadata.start()
            try:
                return await scenario(node)
            finally:
                await node.close()
                await zk.close()

        return run_async(main(), timeout=60)

    return run


def test_create_writes_kafkas_znodes_spreads_leaders_and_answers_when_the_cache_has_every_leader(node_on):
    async def scenario(node: Node):
        controller = asyncio.ensure_future(node.publish_when_written("orders", 6))
        info = await node.admin.create_async("orders", 6, 2, {"retention.ms": "1000"}, timeout_s=20)
        assignment = await controller
        assert info is node.metadata.topic("orders") and len(info.partitions) == 6
        data, _ = await node.zk.get(zkm.topic_config_path("orders"))
        assert json.loads(data) == {"version": 1, "config": {"retention.ms": "1000"}}
        data, _ = await node.zk.get(zkm.topic_path("orders"))
        doc = json.loads(data)
        assert set(doc) == {"partitions", "topic_id", "adding_replicas", "removing_replicas", "version"}
        assert doc["version"] == 3 and doc["adding_replicas"] == {} and doc["removing_replicas"] == {}
        assert kafka_uuid_to_uuid(doc["topic_id"]) == info.topic_id
        replicas = {int(p): r for p, r in doc["partitions"].items()}
        assert sorted(replicas) == list(range(6)) and replicas == assignment.partitions
        assert all(len(set(r)) == 2 and set(r) <= set(BROKERS) for r in replicas.values())
        assert Counter(r[0] for r in replicas.values()) == {1: 2, 2: 2, 3: 2}  # every broker leads 2
        assert await node.zk.children(zkm.CONFIG_CHANGES_PATH) == []  # creation writes no notification (Kafka)
        # the topic's config is read from ZooKeeper once it appears, and resolves the topic's log config
        await wait_for(lambda: node.metadata.topic("orders").configs == {"retention.ms": "1000"}, what="config")
        assert node.admin.log_config("orders").retention_ms == 1000
        assert node.replicas.partition("orders", 0) is None  # LeaderAndIsr hosts partitions, not TopicAdmin
        with pytest.raises(KafkaError) as raised:
            await node.admin.create_async("orders", 1, 1, timeout_s=1)
        assert raised.value.code == ErrorCode.topic_already_exists

    node_on(scenario)


def test_without_the_controller_create_times_out_but_the_topic_is_written_and_exists(node_on):
    async def scenario(node: Node):
        with pytest.raises(KafkaError) as raised:
            await node.admin.create_async("slow", 3, 3, timeout_s=0.3)
        assert raised.value.code == ErrorCode.request_timed_out
        assignment = await node.zk.get_topic_assignment("slow")
        assert assignment is not None and all(sorted(r) == [1, 2, 3] for r in assignment.partitions.values())
        with pytest.raises(KafkaError) as raised:  # not in the cache, but ZooKeeper has it
            await node.admin.create_async("slow", 3, 3, timeout_s=0.3)
        assert raised.value.code == ErrorCode.topic_already_exists
        with pytest.raises(KafkaError) as raised:  # a timeout of 0 answers at once, as Kafka does
            await node.admin.create_async("in.stant", 1, 1, timeout_s=0)
        assert raised.value.code == ErrorCode.request_timed_out
        assert await node.zk.get_topic_assignment("in.stant") is not None
        with pytest.raises(KafkaError) as raised:
            await node.admin.create_async("big", 1, 4, timeout_s=1)
        assert raised.value.code == ErrorCode.invalid_replication_factor
        assert await node.zk.get_topic_assignment("big") is None
        with pytest.raises(KafkaError) as raised:  # collides with a topic only ZooKeeper knows yet
            await node.admin.create_async("in_stant", 1, 1, timeout_s=1)
        assert raised.value.code == ErrorCode.invalid_topic_exception

    node_on(scenario)


def test_auto_creation_writes_zookeeper_and_answers_leader_not_available_until_the_leaders_are_known(node_on):
    async def scenario(node: Node):
        assert await node.admin.auto_create_async("auto") is None
        assignment = await node.zk.get_topic_assignment("auto")
        assert assignment is not None and len(assignment.partitions) == 1  # num.partitions
        assert await node.admin.auto_create_async("auto") is None  # written already: still no leader
        node.metadata.apply_update_metadata(update_metadata({"auto": (assignment.topic_id, assignment.partitions)}))
        assert node.metadata.topic("auto") is not None

    node_on(scenario)


def test_delete_marks_the_topic_and_answers_when_the_controller_removed_it(node_on):
    async def scenario(node: Node):
        controller = asyncio.ensure_future(node.publish_when_written("gone", 2))
        await node.admin.create_async("gone", 2, 1, timeout_s=20)
        await controller

        async def controller_deletes():
            await wait_for(lambda: node.zk.get_or_none(zkm.delete_topic_path("gone")), what="deletion marker")
            node.metadata.apply_update_metadata(update_metadata({}, deleted={"gone": [0, 1]}))

        marker = asyncio.ensure_future(controller_deletes())
        await node.admin.delete_async("gone", timeout_s=20)
        await marker
        assert node.metadata.topic("gone") is None
        data, _ = await node.zk.get(zkm.delete_topic_path("gone"))
        assert data is None  # null data, as Kafka writes the marker
        with pytest.raises(KafkaError) as raised:
            await node.admin.delete_async("gone", timeout_s=1)
        assert raised.value.code == ErrorCode.unknown_topic_or_partition

    node_on(scenario)


def test_delete_without_the_controller_times_out(node_on):
    async def scenario(node: Node):
        controller = asyncio.ensure_future(node.publish_when_written("stays", 1))
        await node.admin.create_async("stays", 1, 1, timeout_s=20)
        await controller
        with pytest.raises(KafkaError) as raised:
            await node.admin.delete_async("stays", timeout_s=0.3)
        assert raised.value.code == ErrorCode.request_timed_out
        assert await node.zk.topics_marked_for_deletion() == ["stays"]

    node_on(scenario)


def test_add_partitions_keeps_the_existing_replicas_places_the_new_ones_and_waits_for_their_leaders(node_on):
    async def scenario(node: Node):
        await node.zk.try_become_controller(1)  # the assignment write is checked against /controller_epoch
        controller = asyncio.ensure_future(node.publish_when_written("grow", 3))
        await node.admin.create_async("grow", 3, 2, timeout_s=20)
        before = await controller
        controller = asyncio.ensure_future(node.publish_when_written("grow", 6))
        info = await node.admin.add_partitions_async("grow", 6, timeout_s=20)
        after = await controller
        assert len(info.partitions) == 6 and after.topic_id == before.topic_id
        assert {p: after.partitions[p] for p in range(3)} == before.partitions
        added = [after.partitions[p] for p in range(3, 6)]
        assert all(len(set(r)) == 2 for r in added)
        assert Counter(r[0] for r in added) == {1: 1, 2: 1, 3: 1}
        # ZooKeeper-mode Kafka's words (ZkAdminManager.createPartitions), not KRaft's
        with pytest.raises(KafkaError) as raised:
            await node.admin.add_partitions_async("grow", 6, timeout_s=1)
        assert (raised.value.code, raised.value.message) == (ErrorCode.invalid_partitions,
                                                             "Topic already has 6 partitions.")
        with pytest.raises(KafkaError) as raised:
            await node.admin.add_partitions_async("grow", 5, timeout_s=1)
        assert (raised.value.code, raised.value.message) == (
            ErrorCode.invalid_partitions, "Topic currently has 6 partitions, which is higher than the requested 5.")
        with pytest.raises(KafkaError) as raised:
            await node.admin.add_partitions_async("grow", 7, timeout_s=0.3)
        assert raised.value.code == ErrorCode.request_timed_out
        assert len((await node.zk.get_topic_assignment("grow")).partitions) == 7

    node_on(scenario)


def test_a_config_change_notification_reloads_the_topics_config_in_the_cache_and_its_log_config(node_on):
    async def scenario(node: Node):
        controller = asyncio.ensure_future(node.publish_when_written("conf", 1))
        await node.admin.create_async("conf", 1, 1, {"retention.ms": "1000"}, timeout_s=20)
        await controller
        await wait_for(lambda: node.admin.log_config("conf").retention_ms == 1000, what="config loaded")
        told: list[str] = []
        node.metadata.add_config_listener(told.append)
        await node.zk.set_topic_config("conf", {"retention.ms": "5000", "max.message.bytes": "2048"})
        await wait_for(lambda: node.admin.log_config("conf").retention_ms == 5000, what="config reloaded")
        assert node.metadata.topic("conf").configs == {"retention.ms": "5000", "max.message.bytes": "2048"}
        assert told == ["conf"]
        await node.zk.set_topic_config("unknown-here", {"retention.ms": "1"})  # not in the cache: ignored
        await node.zk.set_topic_config("conf", {})
        await wait_for(lambda: node.metadata.topic("conf").configs == {}, what="overrides removed")
        assert told == ["conf", "conf"]

    node_on(scenario)


def test_the_internal_topic_is_written_with_the_default_replication_factor_and_not_awaited(node_on):
    async def scenario(node: Node):
        assert await node.admin.ensure_internal_async("__consumer_offsets", 5) is None
        assignment = await node.zk.get_topic_assignment("__consumer_offsets")
        assert len(assignment.partitions) == 5 and all(len(r) == 3 for r in assignment.partitions.values())
        assert await node.zk.get_topic_config("__consumer_offsets") == {"cleanup.policy": "compact"}
        assert await node.admin.ensure_internal_async("__consumer_offsets", 5) is None  # written; no leaders yet
        node.metadata.apply_update_metadata(update_metadata(
            {"__consumer_offsets": (assignment.topic_id, assignment.partitions)}))
        info = await node.admin.ensure_internal_async("__consumer_offsets", 5)
        assert info is node.metadata.topic("__consumer_offsets") and info.internal

    node_on(scenario)


def test_the_internal_topic_when_zookeeper_is_unreachable_is_a_kept_problem_not_an_exception(node_on):
    """A broker whose ZooKeeper connection is gone (its session lost while it was paused, as in the fault
    run) cannot write the topic: Kafka logs it and FindCoordinator answers COORDINATOR_NOT_AVAILABLE, so
    ensure_internal_async returns None with the cause kept for the error_message, and does not raise (an
    exception there was answered UNKNOWN_SERVER_ERROR, which librdkafka reports to the application)."""
    async def scenario(node: Node):
        await node.zk.close()
        assert await node.admin.ensure_internal_async("__consumer_offsets", 5) is None
        problem = node.admin.internal_topic_problem("__consumer_offsets")
        assert problem is not None and "__consumer_offsets cannot be created: the metadata store failed" in problem

    node_on(scenario)


def test_an_explicit_offsets_replication_factor_is_used(node_on):
    async def scenario(node: Node):
        await node.admin.ensure_internal_async("__consumer_offsets", 2)
        assignment = await node.zk.get_topic_assignment("__consumer_offsets")
        assert all(len(r) == 1 for r in assignment.partitions.values())

    node_on(scenario, **{"offsets.topic.replication.factor": 1})


# -- AlterConfigs read-modify-write against ZooKeeper, config change notifications purged ----------------


async def incremental_alter(node: Node, kind: int, name: str, key: str, value: str):
    """IncrementalAlterConfigs SET through the real handler, on this node."""
    broker = types.SimpleNamespace(metadata=node.metadata, topics=node.admin, dynamic_configs=node.admin.dynamic,
                                   broker_id=1)
    body = iac.IncrementalAlterConfigsRequest(resources=(iac.AlterConfigsResource(
        resource_type=i8(kind), resource_name=name, configs=(iac.AlterableConfig(name=key, config_operation=i8(0),
                                                                                 value=value),)),), validate_only=False)
    envelope = types.SimpleNamespace(api_key=44, api_version=1, body=body, codec=codec_for(44, 1))
    response = await incremental_alter_configs(RequestContext(broker, envelope, "peer"), body)
    return [(r.error_code, r.error_message) for r in response.responses]


def test_incremental_alter_configs_starts_from_zookeeper_not_from_a_stale_cache(node_on):
    async def scenario(node: Node):
        controller = asyncio.ensure_future(node.publish_when_written("stale", 1))
        await node.admin.create_async("stale", 1, 1, {"retention.ms": "1000"}, timeout_s=20)
        await controller
        await wait_for(lambda: node.metadata.topic_configs("stale") == {"retention.ms": "1000"}, what="config read")
        # other brokers' changes this broker has not seen (no notification, as if its read had failed)
        node.zk._zk.set("/config/topics/stale", zkm.encode_topic_config({"retention.ms": "1000", "segment.bytes": "1048576"}))
        node.zk._zk.create("/config/brokers/<default>", zkm.encode_topic_config({"log.retention.ms": "60000"}),
                           makepath=True)
        assert await incremental_alter(node, 2, "stale", "max.message.bytes", "2048") == [(ErrorCode.none, None)]
        assert await node.zk.get_topic_config("stale") == {
            "retention.ms": "1000", "segment.bytes": "1048576", "max.message.bytes": "2048"}
        assert node.metadata.topic_configs("stale") == await node.zk.get_topic_config("stale")
        assert await incremental_alter(node, 4, "", "log.segment.bytes", "2097152") == [(ErrorCode.none, None)]
        assert await node.zk.get_entity_config("brokers", "<default>") == {
            "log.retention.ms": "60000", "log.segment.bytes": "2097152"}

    node_on(scenario)


def test_a_conditional_config_write_on_a_changed_znode_writes_nothing(node_on):
    async def scenario(node: Node):
        assert await node.zk.get_entity_config_versioned("brokers", "7") == ({}, -1)
        await node.zk.set_entity_config("brokers", "7", {"log.retention.ms": "1"}, version=-1)
        configs, version = await node.zk.get_entity_config_versioned("brokers", "7")
        assert configs == {"log.retention.ms": "1"}
        notifications = await node.zk.children(zkm.CONFIG_CHANGES_PATH)
        for stale in (-1, version + 1):
            with pytest.raises(zkm.StaleZkVersion):
                await node.zk.set_entity_config("brokers", "7", {"log.retention.ms": "2"}, version=stale)
        assert await node.zk.get_entity_config("brokers", "7") == {"log.retention.ms": "1"}
        assert await node.zk.children(zkm.CONFIG_CHANGES_PATH) == notifications  # no notification either
        await node.zk.set_entity_config("brokers", "7", {"log.retention.ms": "3"}, version=version)
        assert await node.zk.get_entity_config("brokers", "7") == {"log.retention.ms": "3"}

    node_on(scenario)


def test_config_change_notifications_older_than_the_expiration_are_purged_after_processing(node_on):
    async def scenario(node: Node):
        assert node.metadata.change_expiration_ms == 15 * 60 * 1000  # Kafka's
        first = await node.zk.set_entity_config("brokers", "<default>", {"log.retention.ms": "60000"})
        await wait_for(lambda: node.metadata.broker_configs("<default>") == {"log.retention.ms": "60000"},
                       what="first change processed")
        _, stat = await node.zk.get(f"{zkm.CONFIG_CHANGES_PATH}/{first}")
        assert first in await node.zk.children(zkm.CONFIG_CHANGES_PATH)  # processed, younger than 15 minutes

        # 15 minutes and 1 ms after the first one was created, the next change is processed
        node.metadata.clock_ms = lambda: stat.ctime + 15 * 60 * 1000 + 1
        await wait_for(lambda: time.time() * 1000 > stat.ctime + 5, what="ZooKeeper's clock moved on")
        second = await node.zk.set_entity_config("brokers", "<default>", {"log.retention.ms": "120000"})
        await wait_for(lambda: node.metadata.broker_configs("<default>") == {"log.retention.ms": "120000"},
                       what="second change processed")

        async def only_the_second_is_left():
            return await node.zk.children(zkm.CONFIG_CHANGES_PATH) == [second]

        await wait_for(only_the_second_is_left, what="the first notification purged")

    node_on(scenario)

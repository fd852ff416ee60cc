"""ZkMetadata, the cluster-mode metadata cache: UpdateMetadata requests (built with the inter-broker codec
entities, or decoded from a real Kafka 3.7.1 cluster's capture) in, Metadata answers out through the real
handler; Kafka's replica placement; the waits admin requests make; TopicAdmin's rules against the cache.
ZooKeeper itself is a small in-memory stand-in here (only topic configs are read from it); the ZooKeeper
writes are tested against a real server in tests/cluster/test_zk_topic_admin.py."""

from __future__ import annotations

import asyncio
import functools
import json
import types
import uuid
from collections import Counter
from pathlib import Path

import pytest
from kio.schema.metadata.v12 import request as m12
from kio.schema.metadata.v0 import request as m0
from kio.schema.metadata.v5 import request as m5

from pykbroker.cluster.topic_admin import TopicAdmin
from pykbroker.cluster.zk_metadata import MetadataStartError, ZkMetadata, assign_replicas_to_brokers
from pykbroker.config import BrokerConfig
from pykbroker.log.manager import LogManager
from pykbroker.protocol import interbroker as ib
from pykbroker.protocol.apis import codec_for
from pykbroker.protocol.errors import ErrorCode, KafkaError
from pykbroker.protocol.interbroker.update_metadata.v4 import request as um4
from pykbroker.protocol.interbroker.update_metadata.v8 import request as um8
from pykbroker.replication.replica_manager import ReplicaManager
from pykbroker.server.dispatch import RequestContext
from pykbroker.server.handlers.metadata import metadata as metadata_handler

REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO.parent / "shared" / "wire-captures" / "16-zk-cluster-3.7.1.jsonl"
if not CAPTURE.exists():  # a worktree sits one level deeper than the main checkout
    CAPTURE = REPO.parents[1] / "shared" / "wire-captures" / "16-zk-cluster-3.7.1.jsonl"
TOPIC_ID = uuid.UUID("0743ca48-008c-4a6c-901a-080ecd72b738")


class FakeZk:
    """Topic configs as /config/topics/<t> would hold them; counts the reads."""

    def __init__(self, configs: dict[str, dict[str, str]] | None = None) -> None:
        self.configs = configs or {}
        self.reads: Counter[str] = Counter()

    async def get_topic_config(self, topic: str) -> dict[str, str]:
        self.reads[topic] += 1
        return dict(self.configs.get(topic, {}))


def update_metadata(brokers, topics, controller_id: int = 1):
    """UpdateMetadata v8. brokers: {id: {listener: (host, port)}}; topics: {name: (topic id,
    {partition: (leader, isr, replicas, offline)})}."""
    return um8.UpdateMetadataRequest(
        controller_id=controller_id, controller_epoch=1, broker_epoch=10,
        topic_states=tuple(
            um8.UpdateMetadataTopicState(topic_name=name, topic_id=topic_id, partition_states=tuple(
                um8.UpdateMetadataPartitionState(
                    partition_index=index, controller_epoch=1, leader=leader, leader_epoch=3, isr=tuple(isr),
                    zk_version=7, replicas=tuple(replicas), offline_replicas=tuple(offline))
                for index, (leader, isr, replicas, offline) in partitions.items()))
            for name, (topic_id, partitions) in topics.items()),
        live_brokers=tuple(
            um8.UpdateMetadataBroker(id_=broker_id, rack=None, endpoints=tuple(
                um8.UpdateMetadataEndpoint(port=port, host=host, listener=listener, security_protocol=0)
                for listener, (host, port) in endpoints.items()))
            for broker_id, endpoints in brokers.items()),
    )


THREE = {b: {"PLAINTEXT": ("127.0.0.1", 9090 + b)} for b in (1, 2, 3)}


def cache(zk: FakeZk | None = None) -> ZkMetadata:
    return ZkMetadata(zk or FakeZk(), 1, "cluster-x", inter_broker_listener="PLAINTEXT")


def fake_broker(metadata: ZkMetadata, **config) -> types.SimpleNamespace:
    broker_config = BrokerConfig(data_dir=Path("/nonexistent"), port=0, values={"auto.create.topics.enable": False, **config},
                                 explicit=frozenset(config))
    return types.SimpleNamespace(metadata=metadata, brokers_on=metadata.brokers_on, config=broker_config, topics=None)


def in_loop(test):
    """Run an ``async def`` test on a fresh event loop (the cache lives on the broker's loop)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return run


async def ask_metadata(broker, version: int, topics, listener: str = "PLAINTEXT"):
    module = {0: m0, 5: m5, 12: m12}[version]
    if version == 0:
        body = module.MetadataRequest(topics=tuple(module.MetadataRequestTopic(name=t) for t in topics))
    elif version == 5:
        body = module.MetadataRequest(topics=tuple(module.MetadataRequestTopic(name=t) for t in topics),
                                      allow_auto_topic_creation=False)
    else:
        body = module.MetadataRequest(
            topics=tuple(module.MetadataRequestTopic(name=t, topic_id=uuid.UUID(int=0)) for t in topics),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    envelope = types.SimpleNamespace(api_key=3, api_version=version, body=body, codec=codec_for(3, version))
    return await metadata_handler(RequestContext(broker, envelope, "peer", listener), body)


def partitions_of(response, name: str) -> dict[int, object]:
    (topic,) = [t for t in response.topics if t.name == name]
    return {p.partition_index: p for p in topic.partitions}


# -- UpdateMetadata in, Metadata out ---------------------------------------------------------------------


@in_loop
async def test_leaders_isr_and_offline_replicas_are_served_and_a_partition_without_leader_is_leader_not_available():
    zkm = cache()
    zkm.apply_update_metadata(update_metadata(THREE, {"t": (TOPIC_ID, {
        0: (1, [1, 2], [1, 2, 3], [3]),
        1: (-1, [2], [2, 3], [])})}, controller_id=2))
    response = await ask_metadata(fake_broker(zkm), 12, ["t"])
    assert response.controller_id == 2 and response.cluster_id == "cluster-x"
    assert [(b.node_id, b.port) for b in response.brokers] == [(1, 9091), (2, 9092), (3, 9093)]
    (topic,) = response.topics
    assert topic.error_code == ErrorCode.none and topic.topic_id == TOPIC_ID
    p = partitions_of(response, "t")
    assert (p[0].error_code, p[0].leader_id, p[0].leader_epoch) == (ErrorCode.none, 1, 3)
    assert (p[0].replica_nodes, p[0].isr_nodes, p[0].offline_replicas) == ((1, 2, 3), (1, 2), (3,))
    assert (p[1].error_code, p[1].leader_id, p[1].replica_nodes) == (ErrorCode.leader_not_available, -1, (2, 3))
    assert zkm.leader_of("t", 0) == 1 and zkm.leader_of("t", 1) is None and zkm.leader_of("t", 9) is None
    assert zkm.topic_by_id(TOPIC_ID).name == "t" and zkm.partition_count() == 2


@in_loop
async def test_a_leader_that_is_not_live_is_leader_not_available_and_v0_filters_replicas_not_reachable():
    zkm = cache()
    two = {b: THREE[b] for b in (1, 2)}  # broker 3 is down
    zkm.apply_update_metadata(update_metadata(two, {"t": (TOPIC_ID, {
        0: (3, [3], [3, 1], [3]),
        1: (1, [1, 3], [1, 3], [3])})}))
    broker = fake_broker(zkm)
    p = partitions_of(await ask_metadata(broker, 12, ["t"]), "t")
    assert (p[0].error_code, p[0].leader_id) == (ErrorCode.leader_not_available, -1)
    assert (p[1].error_code, p[1].replica_nodes, p[1].isr_nodes) == (ErrorCode.none, (1, 3), (1, 3))
    p0 = partitions_of(await ask_metadata(broker, 0, ["t"]), "t")  # Kafka's errorUnavailableEndpoints
    assert (p0[1].error_code, p0[1].replica_nodes, p0[1].isr_nodes) == (ErrorCode.replica_not_available, (1,), (1,))


@in_loop
async def test_a_live_leader_without_the_requests_listener_is_listener_not_found_from_v6():
    zkm = cache()
    brokers = {1: {"PLAINTEXT": ("h1", 1), "EXTERNAL": ("e1", 11)}, 2: {"PLAINTEXT": ("h2", 2)}}
    zkm.apply_update_metadata(update_metadata(brokers, {"t": (TOPIC_ID, {0: (1, [1, 2], [1, 2], []),
                                                                       1: (2, [2, 1], [2, 1], [])})}))
    broker = fake_broker(zkm)
    response = await ask_metadata(broker, 12, ["t"], listener="EXTERNAL")
    assert [(b.node_id, b.host, b.port) for b in response.brokers] == [(1, "e1", 11)]
    p = partitions_of(response, "t")
    assert (p[0].error_code, p[0].leader_id) == (ErrorCode.none, 1)
    assert (p[1].error_code, p[1].leader_id) == (ErrorCode.listener_not_found, -1)
    assert partitions_of(await ask_metadata(broker, 5, ["t"], listener="EXTERNAL"), "t")[1].error_code == ErrorCode.leader_not_available
    assert zkm.endpoint(1, "EXTERNAL").host == "e1" and zkm.endpoint(2, "EXTERNAL") is None
    assert zkm.address_of(2) == ("h2", 2) and zkm.address_of(7) is None


@in_loop
async def test_leader_during_delete_removes_partitions_then_the_topic_and_brokers_are_replaced_each_time():
    zkm = cache()
    seen = []
    zkm.add_listener(lambda: seen.append(sorted(t.name for t in zkm.topics())))
    zkm.apply_update_metadata(update_metadata(THREE, {"a.b": (TOPIC_ID, {0: (1, [1], [1], []), 1: (2, [2], [2], [])})}))
    assert zkm.colliding_topics("a_b") == ["a.b"]
    zkm.apply_update_metadata(update_metadata({1: THREE[1]}, {"a.b": (TOPIC_ID, {1: (-2, [2], [2], [])})}))
    assert len(zkm.topic("a.b").partitions) == 1 and [b.broker_id for b in zkm.brokers()] == [1]
    zkm.apply_update_metadata(update_metadata(THREE, {"a.b": (TOPIC_ID, {0: (-2, [1], [1], [])})}))
    assert zkm.topic("a.b") is None and zkm.topic_by_id(TOPIC_ID) is None and zkm.colliding_topics("a_b") == []
    assert zkm.partition_count() == 0 and seen == [["a.b"], ["a.b"], []]
    assert (await ask_metadata(fake_broker(zkm), 12, ["a.b"])).topics[0].error_code == ErrorCode.unknown_topic_or_partition


@in_loop
async def test_pre_v3_endpoints_are_named_after_their_security_protocol_and_v0_5_states_are_ungrouped():
    zkm = cache()
    request = um4.UpdateMetadataRequest(
        controller_id=-1, controller_epoch=1,
        ungrouped_partition_states=(um4.UpdateMetadataPartitionState(
            topic_name="t", partition_index=0, controller_epoch=1, leader=1, leader_epoch=0, isr=(1,), zk_version=0,
            replicas=(1,), offline_replicas=()),),
        live_brokers=(um4.UpdateMetadataBroker(id_=1, rack="r1", endpoints=(
            um4.UpdateMetadataEndpoint(port=9, host="h", listener="INTERNAL", security_protocol=0),)),))
    zkm.apply_update_metadata(request)
    assert zkm.controller_id == -1 and zkm.topic("t").topic_id == uuid.UUID(int=0)
    assert zkm.brokers_on("INTERNAL")[0].rack == "r1"
    from pykbroker.protocol.interbroker.update_metadata.v2 import request as um2
    from pykbroker.protocol.interbroker.update_metadata.v0 import request as um0
    zkm.apply_update_metadata(um2.UpdateMetadataRequest(
        controller_id=1, controller_epoch=1, ungrouped_partition_states=(),
        live_brokers=(um2.UpdateMetadataBroker(id_=1, rack=None, endpoints=(
            um2.UpdateMetadataEndpoint(port=9, host="h", security_protocol=1),)),)))
    assert [e.port for e in zkm.brokers_on("SSL")] == [9] and zkm.brokers_on("INTERNAL") == []
    zkm.apply_update_metadata(um0.UpdateMetadataRequest(
        controller_id=1, controller_epoch=1, ungrouped_partition_states=(),
        live_brokers=(um0.UpdateMetadataBroker(id_=4, v0_host="old", v0_port=1),)))
    assert zkm.brokers_on("PLAINTEXT") == [zkm.endpoint(4, "PLAINTEXT")] and zkm.address_of(4) == ("old", 1)


@pytest.mark.skipif(not CAPTURE.exists(), reason="../shared/wire-captures is absent")
@in_loop
async def test_the_update_metadata_requests_of_a_real_cluster_leave_the_cache_as_the_controller_last_described_it():
    frames = [json.loads(line) for line in CAPTURE.read_text().splitlines() if line.strip()]
    to_broker_2 = sorted((f for f in frames if f["api_key"] == 6 and f["dir"] == "request" and f["broker"] == 2),
                         key=lambda f: f["seq"])
    assert to_broker_2
    zkm = ZkMetadata(FakeZk(), 2, "c", inter_broker_listener="PLAINTEXT")
    last_state: dict[tuple[str, int], object] = {}
    for frame in to_broker_2:
        _, request = ib.decode_request(bytes.fromhex(frame["hex"]))
        zkm.apply_update_metadata(request)
        for topic in request.topic_states:
            for state in topic.partition_states:
                last_state[(topic.topic_name, state.partition_index)] = (topic.topic_id, state)
    assert sorted(b.broker_id for b in zkm.brokers()) == sorted(b.id_ for b in request.live_brokers)
    assert zkm.controller_id == request.controller_id
    for (name, index), (topic_id, state) in last_state.items():
        info = zkm.topic(name)
        assert info.topic_id == topic_id
        cached = info.partitions[index]
        assert (cached.leader, cached.leader_epoch, cached.isr, cached.replicas, cached.offline_replicas,
                cached.partition_epoch) == (state.leader, state.leader_epoch, list(state.isr), list(state.replicas),
                                            list(state.offline_replicas), state.zk_version)


# -- topic configs ---------------------------------------------------------------------------------------


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)



def test_a_topics_config_is_read_once_when_it_appears_and_the_listeners_are_told():
    async def main():
        zk = FakeZk({"t": {"retention.ms": "1000"}})
        zkm = cache(zk)
        changed = []
        zkm.add_config_listener(changed.append)
        zkm.apply_update_metadata(update_metadata(THREE, {"t": (TOPIC_ID, {0: (1, [1], [1], [])})}))
        await asyncio.wait_for(_until(lambda: changed), 10)
        assert zkm.topic("t").configs == {"retention.ms": "1000"} and changed == ["t"]
        zkm.apply_update_metadata(update_metadata(THREE, {"t": (TOPIC_ID, {0: (2, [2], [1, 2], [])})}))
        assert zkm.topic("t").configs == {"retention.ms": "1000"} and zk.reads["t"] == 1
        assert await zkm.load_topic_config("t") == {"retention.ms": "1000"} and zk.reads["t"] == 1
        await zkm.close()

    asyncio.run(main())


# -- waiting for the controller --------------------------------------------------------------------------


def test_wait_until_completes_on_the_matching_update_and_times_out_without_it():
    async def main():
        zkm = cache()
        waiting = asyncio.ensure_future(zkm.wait_until(lambda: zkm.topic("t") is not None, 10))
        await asyncio.sleep(0)
        zkm.apply_update_metadata(update_metadata(THREE, {"u": (TOPIC_ID, {0: (1, [1], [1], [])})}))
        await asyncio.sleep(0)
        assert not waiting.done()
        zkm.apply_update_metadata(update_metadata(THREE, {"t": (uuid.uuid4(), {0: (1, [1], [1], [])})}))
        assert await asyncio.wait_for(waiting, 5) is True
        assert await zkm.wait_until(lambda: zkm.topic("never") is not None, 0.05) is False
        assert await zkm.wait_until(lambda: zkm.topic("never") is not None, 0) is False
        assert zkm._waiters == []
        pending = asyncio.ensure_future(zkm.wait_until(lambda: zkm.topic("never") is not None, 30))
        await asyncio.sleep(0)
        await zkm.close()  # a wait pending at close ends as a timeout
        assert await asyncio.wait_for(pending, 5) is False

    asyncio.run(main())


# -- replica placement (Kafka's AdminUtils.assignReplicasToBrokers, rack-unaware) -------------------------


def test_fixed_start_placement_is_kafkas_documented_example():
    # AdminUtils' scaladoc: 5 brokers, 10 partitions, 3 replicas, start index 0.
    got = assign_replicas_to_brokers([0, 1, 2, 3, 4], 10, 3, start_index=0)
    assert got[0] == [0, 1, 2] and got[4] == [4, 0, 1]
    assert got[5] == [0, 2, 3] and got[9] == [4, 1, 2]


@pytest.mark.parametrize("seed", range(5))
def test_random_start_placement_spreads_leaders_and_replicas_evenly(seed):
    import random

    got = assign_replicas_to_brokers([3, 1, 2], 12, 2, rng=random.Random(seed))
    assert sorted(got) == list(range(12))
    assert all(len(set(replicas)) == 2 for replicas in got.values())
    assert Counter(r[0] for r in got.values()) == {1: 4, 2: 4, 3: 4}
    assert Counter(b for r in got.values() for b in r) == {1: 8, 2: 8, 3: 8}


def test_added_partitions_continue_from_the_given_partition_id():
    got = assign_replicas_to_brokers([1, 2, 3], 2, 3, start_index=1, start_partition=3)
    assert sorted(got) == [3, 4] and all(sorted(r) == [1, 2, 3] for r in got.values())


# -- TopicAdmin's rules on the cache ---------------------------------------------------------------------


@pytest.fixture
def cluster_admin(tmp_path):
    logs = LogManager(tmp_path)
    made = []

    def make(**config):
        zkm = cache()
        zkm.apply_update_metadata(update_metadata({b: THREE[b] for b in (1, 2)}, {}))
        values = {"zookeeper.connect": "127.0.0.1:2181", **config}  # a cluster member (its defaults); not dialled
        broker_config = BrokerConfig(data_dir=tmp_path, port=0, values=values, explicit=frozenset(config))
        replicas = ReplicaManager(logs, 1, lambda topic: admin.log_config(topic))
        admin = TopicAdmin(broker_config, zkm, replicas)
        made.append(zkm)
        return admin

    yield make
    logs.shutdown()


def test_a_replication_factor_beyond_the_live_brokers_is_refused_before_zookeeper_is_touched(cluster_admin):
    admin = cluster_admin()
    with pytest.raises(KafkaError) as raised:
        asyncio.run(admin.create_async("t", 1, 3, timeout_s=1))
    assert raised.value.code == ErrorCode.invalid_replication_factor
    assert "only 2 broker(s)" in raised.value.message
    assert asyncio.run(admin.create_async("t", 1, 2, validate_only=True)) is None


def test_the_internal_topics_replication_factor_is_kafkas_3_unless_set(cluster_admin):
    # Not capped at the 2 live brokers: an offsets topic created while brokers start keeps 3 replicas.
    assert cluster_admin().internal_replication_factor() == 3
    assert cluster_admin(**{"offsets.topic.replication.factor": 1}).internal_replication_factor() == 1
    assert cluster_admin(**{"offsets.topic.replication.factor": 3}).internal_replication_factor() == 3


# -- config writes and reads racing with UpdateMetadata, the start's read of the broker configs -------------


class WritingZk(FakeZk):
    """FakeZk whose config writes wait for ``release`` (an UpdateMetadata can come in meanwhile), and whose
    broker config reads fail ``failures`` times first."""

    def __init__(self, configs=None, failures: int = 0) -> None:
        super().__init__(configs)
        self.release = asyncio.Event()
        self.failures = failures

    async def set_entity_config(self, entity_type, name, config, *, version=None):
        await self.release.wait()
        self.configs[name] = dict(config)

    async def set_topic_config(self, name, config):
        await self.set_entity_config("topics", name, config)

    async def client_entity_paths(self):
        return []

    async def children(self, path):  # no group configs under /config/groups
        return []

    def add_session_listener(self, callback):
        pass

    async def get_entity_config(self, entity_type, name):
        if self.failures:
            self.failures -= 1
            raise ConnectionError("ZooKeeper connection lost")
        return {"log.retention.ms": "60000"} if name == "<default>" else {}


async def cache_with_topic_t(zk: WritingZk) -> ZkMetadata:
    """A cache that knows topic t and has read its config."""
    zkm = cache(zk)
    zkm.apply_update_metadata(update_metadata(THREE, {"t": (TOPIC_ID, {0: (1, [1], [1], [])})}))
    await asyncio.wait_for(_until(lambda: zk.reads["t"] == 1), 10)
    return zkm


def test_a_topic_deleted_during_a_config_write_does_not_pass_its_overrides_to_a_new_topic_of_its_name():
    async def main():
        zk = WritingZk({"t": {}})
        zkm = await cache_with_topic_t(zk)
        write = asyncio.ensure_future(zkm.set_topic_configs_async("t", {"retention.ms": "1000"}))
        await asyncio.sleep(0)
        zkm.apply_update_metadata(update_metadata(THREE, {"t": (TOPIC_ID, {0: (-2, [], [], [])})}))  # deleted
        zk.release.set()
        await write  # landed while the topic was being deleted: the cache must not keep it
        assert zkm.topic_configs("t") is None
        zk.configs["t"] = {"segment.bytes": "1048576"}  # created again, with its own configs
        assert await zkm.load_topic_config("t") == {"segment.bytes": "1048576"}
        await zkm.close()

    asyncio.run(main())


def test_a_config_write_applies_to_the_cache_at_once_when_nothing_came_in_between():
    async def main():
        zk = WritingZk({"t": {}})
        zkm = await cache_with_topic_t(zk)
        zk.release.set()
        await zkm.set_topic_configs_async("t", {"retention.ms": "1000"})
        assert zkm.topic("t").configs == {"retention.ms": "1000"} == zkm.topic_configs("t")
        await zkm.close()

    asyncio.run(main())


def test_start_retries_reading_the_dynamic_broker_configs_and_fails_clearly_if_it_never_can():
    async def main():
        zk = WritingZk(failures=3)
        zk.watch_children = lambda path, callback: None
        zkm = ZkMetadata(zk, 1, "cluster-x", inter_broker_listener="PLAINTEXT", start_timeout_s=30)
        await zkm.start()
        assert zkm.broker_configs("<default>") == {"log.retention.ms": "60000"}
        await zkm.close()

        zk = WritingZk(failures=1000)
        zkm = ZkMetadata(zk, 1, "cluster-x", inter_broker_listener="PLAINTEXT", start_timeout_s=0.5)
        with pytest.raises(MetadataStartError, match=r"/config/brokers/<default> from ZooKeeper within 0.5 s"):
            await zkm.start()
        await zkm.close()

    asyncio.run(main())

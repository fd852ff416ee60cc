"""Against a live Apache Kafka 3.7.1 in ZooKeeper mode (the refkit), sharing one ZooKeeper with our client:

- every znode Kafka writes has the shape our encoders produce (same keys, same JSON types);
- Kafka reads what WE write: a broker we register shows in Kafka's Metadata with our host/port; a topic
  we create (assignment + config) is picked up by Kafka's controller, which writes its partition state
  and serves our config; our config change notification is applied; our deletion marker deletes it.

Skips when the refkit (../shared/refkit beside the project, or $PYKBROKER_KAFKA_HOME) or java is absent:
a fresh clone relies on the captured fixtures (tests/unit/test_zk_codecs.py) instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install kazoo, or the project's test extra)")

from pykbroker.cluster import zookeeper as zkm
from pykbroker.cluster.zk_server import free_port
from pykbroker.cluster.zookeeper import Endpoint, KafkaZkClient
from cluster_helpers import wait_for


pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
KAFKA_DIR_NAME = "kafka_2.13-3.7.1"


def kafka_home() -> Path | None:
    env = os.environ.get("PYKBROKER_KAFKA_HOME")
    candidates = [Path(env)] if env else []
    candidates += [REPO.parent / "shared" / "refkit" / KAFKA_DIR_NAME, REPO.parent.parent / "shared" / "refkit" / KAFKA_DIR_NAME]
    return next((c for c in candidates if (c / "bin" / "kafka-server-start.sh").is_file()), None)


def shape(value):
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return ["list", sorted({json.dumps(shape(v), sort_keys=True) for v in value})]
    return "null" if value is None else type(value).__name__


class KafkaBroker:
    def __init__(self, home: Path, root: Path, zk_connect: str, broker_id: int = 1):
        self.home, self.root, self.zk_connect = home, root, zk_connect
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        root.mkdir(parents=True, exist_ok=True)
        self.config = root / "server.properties"
        self.config.write_text(
            "\n".join(
                [
                    f"broker.id={broker_id}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    f"log.dirs={root / 'data'}",
                    f"zookeeper.connect={zk_connect}",
                    "zookeeper.session.timeout.ms=6000",
                    "num.partitions=1",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "broker.rack=rack1",
                    "",
                ]
            )
        )
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {**os.environ, "KAFKA_HEAP_OPTS": "-Xmx512m", "LOG_DIR": str(self.root / "logs")}
        self.log = open(self.root / "kafka.out", "wb")
        self.proc = subprocess.Popen(
            [str(self.home / "bin" / "kafka-server-start.sh"), str(self.config)],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join((self.root / "kafka.out").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@pytest.fixture
def kafka(zk_server, tmp_path):
    home = kafka_home()
    if home is None:
        pytest.skip("Kafka 3.7.1 refkit not found (../shared/refkit or $PYKBROKER_KAFKA_HOME)")
    if shutil.which("java") is None:
        pytest.skip("no java runtime")
    chroot = f"/kafka-{tmp_path.name}"
    broker = KafkaBroker(home, tmp_path / "kafka", zk_server.connect_string + chroot)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def test_kafka_writes_our_shapes_and_reads_what_we_write(kafka, zk_server, run_async):
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

    connect = kafka.zk_connect

    async def scenario():
        c = KafkaZkClient(connect, session_timeout_ms=6000)
        await c.start()
        loop = asyncio.get_running_loop()
        try:
            try:
                await wait_for(lambda: c.get_or_none(zkm.broker_path(1)), timeout=90, what="Kafka to register")
                await wait_for(lambda: c.get_or_none(zkm.CONTROLLER_PATH), timeout=60, what="Kafka's controller")
            except AssertionError:
                raise AssertionError("Kafka did not start; its log:\n" + kafka.tail())

            async def data(path):
                d, _ = await c.get(path)
                return json.loads(d)

            # --- Kafka's start-up znodes have our shapes
            assert shape(await data(zkm.CLUSTER_ID_PATH)) == shape(json.loads(zkm.encode_cluster_id("x")))
            reg_doc = await data(zkm.broker_path(1))
            ours = json.loads(zkm.encode_broker_registration(1, [Endpoint("PLAINTEXT", "127.0.0.1", kafka.port)], rack="rack1"))
            assert shape(reg_doc) == shape(ours)
            assert {k: v for k, v in reg_doc.items() if k != "timestamp"} == {k: v for k, v in ours.items() if k != "timestamp"}
            reg = await c.get_broker(1)
            _, stat = await c.get(zkm.broker_path(1))
            assert reg.epoch == stat.czxid and reg.endpoint().port == kafka.port
            assert shape(await data(zkm.CONTROLLER_PATH)) == shape(json.loads(zkm.encode_controller(1)))
            epoch, epoch_version = await c.get_controller_epoch()
            assert epoch >= 1 and epoch_version == epoch  # created with 0, bumped once per election
            # our client cannot take over a live Kafka controller
            assert await c.try_become_controller(99) is None

            # --- a broker registered by us appears in Kafka's Metadata
            admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
            fake = KafkaZkClient(connect, session_timeout_ms=6000)
            await fake.start()
            fake_port = free_port()
            await fake.register_broker(2, [Endpoint("PLAINTEXT", "127.0.0.1", fake_port)], rack="rack2")

            def kafka_brokers():
                md = admin.list_topics(timeout=10)
                return {b.id: (b.host, b.port) for b in md.brokers.values()}

            async def sees_fake():
                return (await loop.run_in_executor(None, kafka_brokers)).get(2) == ("127.0.0.1", fake_port)

            await wait_for(sees_fake, timeout=30, what="Kafka's Metadata to list the broker we registered")
            await fake.close()

            async def fake_gone():
                return 2 not in await loop.run_in_executor(None, kafka_brokers)

            await wait_for(fake_gone, timeout=30, what="Kafka to drop the broker when its session closed")

            # --- Kafka's topic, config, change notification and producer-id block have our shapes
            def create_theirs():
                fs = admin.create_topics([NewTopic("theirs", 2, 1, config={"retention.ms": "86400000"})])
                fs["theirs"].result(30)
                res = ConfigResource(ConfigResource.Type.TOPIC, "theirs", incremental_configs=[
                    ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
                admin.incremental_alter_configs([res])[res].result(30)
                p = ck.Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
                p.produce("theirs", key=b"k", value=b"v")
                left = p.flush(30)
                assert left == 0, f"produce failed; brokers {kafka_brokers()}"

            await loop.run_in_executor(None, create_theirs)
            await wait_for(lambda: c.get_or_none(zkm.partition_state_path("theirs", 1)), what="partition state")
            assign = await data(zkm.topic_path("theirs"))
            assert shape(assign) == shape(json.loads(zkm.encode_topic_assignment({0: [1], 1: [1]}, assign["topic_id"])))
            state_doc = await data(zkm.partition_state_path("theirs", 0))
            st = zkm.decode_partition_state(json.dumps(state_doc).encode())
            assert shape(state_doc) == shape(json.loads(zkm.encode_partition_state(st)))
            assert json.loads(zkm.encode_partition_state(st)) == state_doc
            cfg = await data(zkm.topic_config_path("theirs"))
            assert shape(cfg) == shape(json.loads(zkm.encode_topic_config(cfg["config"])))
            assert cfg["config"] == {"retention.ms": "86400000", "cleanup.policy": "compact"}
            notes = await c.children(zkm.CONFIG_CHANGES_PATH)
            assert notes, "the alter wrote a change notification"
            assert await data(f"{zkm.CONFIG_CHANGES_PATH}/{notes[-1]}") == json.loads(zkm.encode_config_change("topics/theirs"))
            await wait_for(lambda: _nonempty(c), what="Kafka's producer-id block")
            block_doc = await data(zkm.PRODUCER_ID_BLOCK_PATH)
            assert shape(block_doc) == shape(json.loads(zkm.encode_producer_id_block(zkm.ProducerIdBlock(1, 0, 999))))
            # our allocator continues after Kafka's block, never overlapping it
            ours_block = await c.allocate_producer_id_block(42)
            assert ours_block.first == int(block_doc["block_end"]) + 1

            # --- Kafka's controller takes a topic we create, with our config
            tid = await c.create_topic("ours", {0: [1]}, config={"retention.ms": "12345"})
            await wait_for(lambda: c.get_or_none(zkm.partition_state_path("ours", 0)), timeout=30,
                           what="Kafka's controller to create the partition state of our topic")
            st = await c.get_partition_state("ours", 0)
            assert (st.leader, st.isr, st.leader_epoch) == (1, (1,), 0)

            def topic_config(name):
                res = ConfigResource(ConfigResource.Type.TOPIC, "ours")
                try:
                    return admin.describe_configs([res])[res].result(30)[name].value
                except ck.KafkaException:  # UNKNOWN_TOPIC_OR_PART until the broker's metadata has it
                    return None

            async def config_is(value):
                return await loop.run_in_executor(None, topic_config, "retention.ms") == value

            await wait_for(lambda: config_is("12345"), timeout=30, what="Kafka to serve our topic's config")
            md_topic = await loop.run_in_executor(None, lambda: admin.list_topics("ours", timeout=10).topics["ours"])
            assert md_topic.error is None and list(md_topic.partitions) == [0]
            assert (await c.get_topic_assignment("ours")).topic_id == tid

            await c.set_topic_config("ours", {"retention.ms": "54321"})

            # describe_configs reads /config/topics straight from ZooKeeper; the broker's own log shows it
            # processed our change notification (ZkConfigManager)
            await wait_for(lambda: config_is("54321"), timeout=30, what="Kafka to read our new config")
            await wait_for(lambda: "Processing override for entityPath: topics/ours with config: HashMap(retention.ms -> 54321)"
                           in kafka.tail(2000), timeout=30, what="Kafka to process our config change notification")

            # --- and deletes it when we mark it
            await c.mark_topic_for_deletion("ours")
            await wait_for(lambda: _gone(c, zkm.topic_path("ours")), timeout=30, what="Kafka to delete our topic")
            await wait_for(lambda: _gone(c, zkm.delete_topic_path("ours")), timeout=30, what="the deletion marker to go")
        finally:
            await c.close()

    run_async(scenario(), timeout=200)


async def _nonempty(c: KafkaZkClient) -> bool:
    d, _ = await c.get(zkm.PRODUCER_ID_BLOCK_PATH)
    return bool(d)


async def _gone(c: KafkaZkClient, path: str) -> bool:
    return await c.get_or_none(path) is None

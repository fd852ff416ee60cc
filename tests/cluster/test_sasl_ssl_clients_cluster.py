"""Every stock client over SASL_SSL on a 3-broker ZooKeeper cluster: kafka-python, aiokafka, kcat, KafkaJS and the
Java client (confluent-kafka has its own cluster tests) produce to a topic replicated on all three brokers through
one broker's SASL_SSL listener and read it back through another's, with PLAIN and SCRAM-SHA-512 (credentials stored
through a third broker into ZooKeeper's /config/users). The brokers talk to each other on PLAINTEXT; each client
learns every broker's SASL_SSL endpoint from Metadata, so leaders on other brokers are reached over TLS + SASL too."""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
pytest.importorskip("cryptography", reason="certificates for these tests are built with cryptography")
from confluent_kafka.admin import (  # noqa: E402
    AdminClient, NewTopic, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion,
)

from broker_cluster import BrokerCluster  # noqa: E402
from broker_process import wait_until  # noqa: E402
from cluster_helpers import add_client_listener  # noqa: E402
from tls_helpers import standard_pki  # noqa: E402

TIMEOUT_S = 60.0
USERS = {"alice": "alice-pw-3"}
SCRAM = ("sue", "sue-scram-pw-3")
PLAIN_JAAS = f'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="{USERS["alice"]}";'
SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
TESTS = Path(__file__).resolve().parents[1]
NODE = shutil.which("node")


@pytest.fixture(scope="module")
def secured(tmp_path_factory, zk_server):
    """A started 3-broker cluster with a SASL_SSL client listener (PLAIN and SCRAM-SHA-512) on each broker."""
    tmp = tmp_path_factory.mktemp("sasl-ssl-cluster")
    (tmp / "pki").mkdir()
    pki = standard_pki(tmp / "pki")
    chroot = f"/t-sasl-ssl-clients-{uuid.uuid4().hex[:8]}"  # a chroot of its own on the session's ZooKeeper
    cluster = BrokerCluster(zk_server.connect_string + chroot, tmp, n=3, overrides={
        "ssl.keystore.type": "PEM", "ssl.keystore.location": pki.broker_pem_file,
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
        "offsets.topic.replication.factor": 3, "offsets.topic.num.partitions": 2,
        "default.replication.factor": 3, "num.partitions": 3})
    ports = add_client_listener(cluster, "SASL_SSL")  # PLAINTEXT stays the inter-broker listener
    with cluster:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{cluster.brokers[3].port}"})
        upsertion = UserScramCredentialUpsertion(SCRAM[0], ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                                                 SCRAM[1].encode())
        for future in admin.alter_user_scram_credentials([upsertion]).values():
            future.result(timeout=TIMEOUT_S)
        scram = {"security.protocol": "SASL_SSL", "ssl.ca.location": pki.ca_file, "sasl.mechanism": "SCRAM-SHA-512",
                 "sasl.username": SCRAM[0], "sasl.password": SCRAM[1]}

        def every_broker_knows_sue() -> bool:
            for port in ports.values():
                try:
                    AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", **scram}).list_topics(timeout=5)
                except confluent_kafka.KafkaException:
                    return False
            return True

        wait_until(every_broker_knows_sue, "sue's credentials on every broker", TIMEOUT_S)
        yield cluster, ports, pki


def replicated_topic(cluster) -> str:
    """A new topic with 3 partitions, each on all 3 brokers (leaders spread: the clients must reach every broker)."""
    topic = f"sasl-ssl-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{cluster.brokers[1].port}"})
    admin.create_topics([NewTopic(topic, 3, 3)])[topic].result(timeout=TIMEOUT_S)
    for partition in range(3):
        cluster.wait_for_isr(topic, partition, {1, 2, 3})
    return topic


def test_kafka_python_and_aiokafka(secured):
    kafka = pytest.importorskip("kafka")
    aiokafka = pytest.importorskip("aiokafka")
    from aiokafka.helpers import create_ssl_context

    cluster, ports, pki = secured
    for mechanism, user, password in (("PLAIN", "alice", USERS["alice"]), ("SCRAM-SHA-512", *SCRAM)):
        topic = replicated_topic(cluster)
        settings = {"security_protocol": "SASL_SSL", "ssl_cafile": pki.ca_file, "sasl_mechanism": mechanism,
                    "sasl_plain_username": user, "sasl_plain_password": password}
        producer = kafka.KafkaProducer(bootstrap_servers=f"127.0.0.1:{ports[1]}", acks="all", **settings)
        for index in range(9):
            producer.send(topic, f"kp{index}".encode(), partition=index % 3).get(timeout=TIMEOUT_S)
        producer.close()
        consumer = kafka.KafkaConsumer(topic, bootstrap_servers=f"127.0.0.1:{ports[2]}", auto_offset_reset="earliest",
                                       consumer_timeout_ms=20000, **settings)
        values = sorted(message.value for message in itertools.islice(consumer, 9))  # not waiting out the timeout
        consumer.close()
        assert values == sorted(f"kp{index}".encode() for index in range(9)), mechanism

        async def aiokafka_round_trip() -> list[bytes]:
            aio = {"security_protocol": "SASL_SSL", "ssl_context": create_ssl_context(cafile=pki.ca_file),
                   "sasl_mechanism": mechanism, "sasl_plain_username": user, "sasl_plain_password": password}
            producer = aiokafka.AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{ports[3]}", acks="all", **aio)
            await producer.start()
            try:
                for index in range(9):
                    await producer.send_and_wait(topic, f"ak{index}".encode(), partition=index % 3)
            finally:
                await producer.stop()
            consumer = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=f"127.0.0.1:{ports[1]}",
                                                 auto_offset_reset="earliest", **aio)
            await consumer.start()
            seen: list[bytes] = []
            try:
                async with asyncio.timeout(TIMEOUT_S):
                    async for message in consumer:
                        seen.append(message.value)
                        if len(seen) == 18:
                            return seen
            finally:
                await consumer.stop()
            return seen

        assert sorted(asyncio.run(aiokafka_round_trip())) == sorted(
            [f"kp{index}".encode() for index in range(9)] + [f"ak{index}".encode() for index in range(9)]), mechanism


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed")
def test_kcat(secured):
    cluster, ports, pki = secured
    topic = replicated_topic(cluster)
    auth = ["-X", "security.protocol=SASL_SSL", "-X", f"ssl.ca.location={pki.ca_file}",
            "-X", "sasl.mechanisms=SCRAM-SHA-512", "-X", f"sasl.username={SCRAM[0]}", "-X", f"sasl.password={SCRAM[1]}"]
    lines = [f"k{index}" for index in range(9)]
    done = subprocess.run(["kcat", "-b", f"127.0.0.1:{ports[1]}", *auth, "-X", "acks=all", "-P", "-t", topic],
                          input="\n".join(lines).encode() + b"\n", timeout=TIMEOUT_S, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    out = subprocess.run(["kcat", "-b", f"127.0.0.1:{ports[2]}", *auth, "-C", "-t", topic, "-o", "beginning",
                          "-c", "9", "-e"], timeout=TIMEOUT_S, capture_output=True)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert sorted(out.stdout.decode().split()) == sorted(lines)


@pytest.mark.skipif(NODE is None or not (TESTS / "js" / "node_modules" / "kafkajs").is_dir(),
                    reason="needs node and `npm install --prefix tests/js` (kafkajs)")
def test_kafkajs(secured):
    cluster, ports, pki = secured
    tls = {"ca": [Path(pki.ca_file).read_text()]}
    for sasl in ({"mechanism": "plain", "username": "alice", "password": USERS["alice"]},
                 {"mechanism": "scram-sha-512", "username": SCRAM[0], "password": SCRAM[1]}):
        options = {"brokers": [f"127.0.0.1:{ports[2]}"], "topic": replicated_topic(cluster), "count": 6,
                   "sasl": sasl, "ssl": tls, "timeoutMs": int(TIMEOUT_S * 1000)}
        done = subprocess.run([NODE, str(TESTS / "js" / "sasl_client.js"), json.dumps(options)], capture_output=True,
                              text=True, timeout=TIMEOUT_S * 2)
        assert done.returncode == 0, f"sasl_client.js exited {done.returncode}\n{done.stdout}\n{done.stderr}"
        assert sorted(json.loads(done.stdout.strip().splitlines()[-1])["read"]) == [f"js-{i}" for i in range(6)], sasl


def test_java_client(secured, tmp_path):
    from test_transactions_clients import java_client_or_skip

    java, lib = java_client_or_skip()
    cluster, ports, pki = secured
    for mechanism, module, user, password in (
            ("PLAIN", "plain.PlainLoginModule", "alice", USERS["alice"]),
            ("SCRAM-SHA-512", "scram.ScramLoginModule", *SCRAM)):
        settings = ["security.protocol=SASL_SSL", f"sasl.mechanism={mechanism}", "ssl.truststore.type=PEM",
                    f"ssl.truststore.location={pki.ca_file}",
                    f"sasl.jaas.config=org.apache.kafka.common.security.{module} required "
                    f'username="{user}" password="{password}";']
        done = subprocess.run(
            [java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{lib}/*",
             str(TESTS / "integration" / "java" / "SaslClient.java"), f"127.0.0.1:{ports[3]}",
             replicated_topic(cluster), "6", *settings],
            capture_output=True, text=True, timeout=TIMEOUT_S * 4, cwd=tmp_path)
        assert done.returncode == 0, f"SaslClient.java exited {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
        read = sorted(line.removeprefix("read ") for line in done.stdout.splitlines() if line.startswith("read "))
        assert read == [f"java-{i}" for i in range(6)], (mechanism, done.stdout)

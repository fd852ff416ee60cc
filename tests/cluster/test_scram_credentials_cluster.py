"""SCRAM credentials in a 3-broker ZooKeeper cluster, kept as Kafka 3.7.1 keeps them (/config/users/<user> with
change notifications): a credential altered through one broker is described by every broker (describe reads
ZooKeeper, as Kafka's; the credential caches are checked in test_client_entities_zk.py), survives restarts,
keeps the user's quota keys;
``pykbroker scram add --zookeeper`` bootstraps the first user before any broker runs and adds one to a running
cluster. The raw cases of tests/integration/test_scram_credentials.py get the same answers through a cluster
broker, and (opt-in, PYKBROKER_REFERENCE_CLUSTER=1: a JVM) from Kafka 3.7.1 in ZooKeeper mode."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

import pytest

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install kazoo, or the project's test extra)")

from broker_cluster import BrokerCluster  # noqa: E402 - puts tests/integration on sys.path
from broker_process import wait_until  # noqa: E402
from kafka_tools import find_refkit, unavailable_reason  # noqa: E402
from pykbroker.cluster.zookeeper import KafkaZkClient  # noqa: E402
from pykbroker.devcluster import child_env, pykbroker_command  # noqa: E402
import test_scram_credentials as s  # noqa: E402

TIMEOUT = 30.0


def wait_described(cluster: BrokerCluster, user: str, expected, via=None) -> None:
    """Until every broker (or those of ``via``) describes ``user`` with ``expected`` (None: no credential).
    Describe reads ZooKeeper, as Kafka's does: this checks what every broker answers, not its credential
    cache; that each broker's cache follows the change notifications is checked in process, on the caches
    themselves (test_client_entities_zk.py), until a SASL/SCRAM login can check it here."""
    for broker_id in via or sorted(cluster.brokers):
        address = cluster.brokers[broker_id].address
        wait_until(lambda: s.described(address, user) == expected,
                   f"broker {broker_id} describes {user}'s credentials as {expected}", TIMEOUT)


def zk_user_config(cluster: BrokerCluster, user: str) -> dict[str, str]:
    return json.loads(cluster.zk().get(f"/config/users/{user}")[0])["config"]


def scram_add_zk(zk_connect: str, *arguments: str) -> subprocess.CompletedProcess:
    done = subprocess.run(pykbroker_command("scram", "add", "--zookeeper", zk_connect, *arguments), env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def test_credentials_altered_through_one_broker_reach_every_broker_and_survive_restarts(zk_connect, tmp_path):
    async def seed():  # carol's quota and the first admin, before any broker runs
        writer = KafkaZkClient(zk_connect, session_timeout_ms=6000)
        await writer.start()
        try:
            await writer.set_entity_config("users", "carol", {"producer_byte_rate": "1024"})
        finally:
            await writer.close()

    asyncio.run(seed())
    scram_add_zk(zk_connect, "SCRAM-SHA-256=[name=admin,password=admin-secret]")
    with BrokerCluster(zk_connect, tmp_path, n=3) as cluster:
        address = {i: broker.address for i, broker in cluster.brokers.items()}
        wait_described(cluster, "admin", [(s.SHA256, 4096)])  # read at start

        # Kafka's answers, through a broker that may not be the controller (every user: admin too)
        every_user = (s.OK, "", [("admin", s.OK, "", [(s.SHA256, 4096)]), *s.EVERY_USER[2]])
        assert s.run_cases(address[2]) == {**s.EXPECTED, "describe null": every_user, "describe empty": every_user}

        # altered through broker 1: every broker has it; the quota key stays
        assert s.alter(address[1], [s.upsertion("carol", s.SHA256, 8192, password=b"carol-secret")]) == [
            ("carol", s.OK, "")]
        wait_described(cluster, "carol", [(s.SHA256, 8192)])
        config = zk_user_config(cluster, "carol")
        assert config["producer_byte_rate"] == "1024" and s._checks_password(config, "SCRAM-SHA-256", "carol-secret")

        # broker 3 restarted: read again at start
        cluster.restart(3)
        assert s.described(address[3], "carol") == [(s.SHA256, 8192)]
        # changed while broker 2 is down: broker 2 has it once started again
        cluster.stop(2)
        assert s.alter(address[1], [s.upsertion("carol", s.SHA512, 4096)]) == [("carol", s.OK, "")]
        cluster.start_broker(2)
        wait_described(cluster, "carol", [(s.SHA256, 8192), (s.SHA512, 4096)])

        # added with the CLI to the running cluster: the change notification brings it to every broker
        scram_add_zk(zk_connect, "SCRAM-SHA-512=[name=ops,password=ops-secret]")
        wait_described(cluster, "ops", [(s.SHA512, 4096)])

        # deleted through broker 2: gone everywhere, the quota key kept
        assert s.alter(address[2], deletions=[s.deletion("carol", s.SHA256), s.deletion("carol", s.SHA512)]) == [
            ("carol", s.OK, "")]
        wait_described(cluster, "carol", None)
        assert zk_user_config(cluster, "carol") == {"producer_byte_rate": "1024"}


def test_concurrent_changes_of_one_user_through_two_brokers_lose_nothing_and_confluent_kafka(zk_connect, tmp_path):
    """Each change is a read-modify-write of /config/users/<user> conditional on its zkVersion: two brokers
    changing the same user's two credentials at the same moment keep both (a blind write would drop one).
    librdkafka sends AlterUserScramCredentials to the controller and describes through any broker."""
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion
    from kio.schema.alter_user_scram_credentials.v0 import request as alter_v0
    from broker_process import send_request_now

    with BrokerCluster(zk_connect, tmp_path, n=3) as cluster:
        for round_ in range(15):
            iterations = 4096 + round_
            answers = [send_request_now(cluster.brokers[broker_id].address, alter_v0.AlterUserScramCredentialsRequest(
                deletions=(), upsertions=(s.upsertion("racy", mechanism, iterations),)))
                for broker_id, mechanism in ((1, s.SHA256), (2, s.SHA512))]
            assert [[(r.user, r.error_code) for r in answer().results] for answer in answers] == [[("racy", 0)]] * 2
            wait_described(cluster, "racy", [(s.SHA256, iterations), (s.SHA512, iterations)], via=[3])

        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        futures = admin.alter_user_scram_credentials([
            UserScramCredentialUpsertion("dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 12000), b"dave-pw")])
        assert futures["dave"].result(TIMEOUT) is None
        wait_described(cluster, "dave", [(s.SHA512, 12000)])
        description = admin.describe_user_scram_credentials(["dave"])["dave"].result(TIMEOUT)
        assert [(i.mechanism, i.iterations) for i in description.scram_credential_infos] == [
            (ScramMechanism.SCRAM_SHA_512, 12000)]


def test_describe_reads_zookeeper_and_unreadable_user_znodes_stop_nothing(zk_connect, tmp_path):
    """Before the broker starts, /config/users holds a znode that is not JSON (Kafka: a user without configs)
    and a user whose name is not a sanitized one (%FF) with a credential. The broker starts; describing every
    user leaves the badly named one out (a warning) and answers the others; an alteration of the unreadable
    user overwrites it (Kafka answers 0). Describe reads ZooKeeper as Kafka does: a credential written there
    whose notification this broker has not processed is described at once."""
    from pykbroker.cluster.zookeeper import encode_topic_config
    from pykbroker.security.credentials import generate_credential, user_config_with

    zk_credential = user_config_with({}, "SCRAM-SHA-512", generate_credential("SCRAM-SHA-512", "pw", 8192))
    with BrokerCluster(zk_connect, tmp_path, n=1) as cluster:
        zk = cluster.zk()
        zk.create("/config/users/mallory", b"{not json", makepath=True)
        zk.create("/config/users/%FF", encode_topic_config(zk_credential), makepath=True)
        zk.create("/config/users/good", encode_topic_config(zk_credential), makepath=True)
        cluster.restart(1)  # read at start: one unreadable znode must not keep it from starting
        address = cluster.brokers[1].address
        assert s.describe(address) == (s.OK, "", [("good", s.OK, "", [(s.SHA512, 8192)])])
        assert "/config/users/mallory" in cluster.brokers[1].log_tail(4000)
        assert "'users/%FF'" in cluster.brokers[1].log_tail(4000)
        assert s.alter(address, [s.upsertion("mallory", s.SHA256, 4096, password=b"m-pw")]) == [("mallory", s.OK, "")]
        assert s._checks_password(zk_user_config(cluster, "mallory"), "SCRAM-SHA-256", "m-pw")
        # written in ZooKeeper without a change notification (one not yet seen): described at once
        zk.create("/config/users/late", encode_topic_config(zk_credential), makepath=True)
        assert s.described(address, "late") == [(s.SHA512, 8192)]
        assert ("late", s.OK, "", [(s.SHA512, 8192)]) in s.describe(address)[2]
        assert "Traceback" not in cluster.brokers[1].log_tail(4000)


@pytest.mark.timeout(600)
@pytest.mark.skipif(not os.environ.get("PYKBROKER_REFERENCE_CLUSTER"),
                    reason="opt-in (a JVM): set PYKBROKER_REFERENCE_CLUSTER=1")
@pytest.mark.skipif(unavailable_reason(find_refkit()) is not None, reason=str(unavailable_reason(find_refkit())))
def test_reference_kafka_in_zookeeper_mode_gives_the_expected_answers(zk_connect, tmp_path):
    """The proof that EXPECTED is Kafka 3.7.1's (ZooKeeper mode, one broker, the controller)."""
    from test_transactions_cluster_reference import KafkaZkCluster

    with KafkaZkCluster(zk_connect, tmp_path, n=1, overrides={"offsets.topic.replication.factor": "1"}) as kafka:
        assert "(kafka.server.KafkaServer)" in kafka.brokers[1].log_tail(2000)  # Kafka itself answered
        assert s.run_cases(kafka.brokers[1].address) == s.EXPECTED

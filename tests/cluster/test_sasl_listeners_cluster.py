"""SASL_PLAINTEXT listeners for clients on a 3-broker ZooKeeper cluster whose brokers talk to each other on
PLAINTEXT: each broker advertises its SASL listener to clients that came in through it; confluent-kafka produces to
a replicated topic with PLAIN and consumes it through another broker with SCRAM-SHA-512, whose credentials were
stored through a third broker (ZooKeeper's /config/users, seen by every broker)."""

from __future__ import annotations

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import (  # noqa: E402
    AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion,
)

from broker_cluster import BrokerCluster  # noqa: E402
from broker_process import wait_until  # noqa: E402
from cluster_helpers import add_client_listener, produce_through_listener  # noqa: E402
from test_tls_listeners import consume_values  # noqa: E402

TIMEOUT_S = 60.0
PLAIN_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-pw";'
SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


@pytest.mark.timeout(300)
def test_clients_use_every_brokers_sasl_listener(zk_connect, tmp_path):
    cluster = BrokerCluster(zk_connect, tmp_path, n=3, overrides={
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
        "offsets.topic.replication.factor": 3, "offsets.topic.num.partitions": 2,
        "default.replication.factor": 3, "num.partitions": 1})
    sasl_ports = add_client_listener(cluster, "SASL_PLAINTEXT")  # PLAINTEXT stays the inter-broker listener
    plain = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "alice",
             "sasl.password": "alice-pw"}
    scram = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "sue",
             "sasl.password": "sue-pw"}
    with cluster:
        topic = produce_through_listener(sasl_ports, plain, "sasl")
        cluster.wait_for_isr(topic, 0, {1, 2, 3})  # replicated between the brokers over PLAINTEXT
        # SCRAM credentials stored through broker 3 (ZooKeeper), used on broker 2 as soon as it has them.
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{cluster.brokers[3].port}"})
        upsertion = UserScramCredentialUpsertion("sue", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                                                 b"sue-pw")
        for future in admin.alter_user_scram_credentials([upsertion]).values():
            future.result(timeout=TIMEOUT_S)

        def sue_logs_in_on_broker_2() -> bool:  # broker 2 has seen the credentials in ZooKeeper
            client = AdminClient({"bootstrap.servers": f"127.0.0.1:{sasl_ports[2]}", **scram})
            try:
                client.list_topics(timeout=5)
                return True
            except confluent_kafka.KafkaException:
                return False

        wait_until(sue_logs_in_on_broker_2, "sue's credentials on broker 2", TIMEOUT_S)
        values = consume_values(f"127.0.0.1:{sasl_ports[2]}", scram, topic, 10)
        assert values == [f"v{index}".encode() for index in range(10)]

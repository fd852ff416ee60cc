"""SSL listeners for clients on a ZooKeeper cluster whose brokers talk to each other on PLAINTEXT (inter-broker
TLS: test_inter_broker_tls_cluster.py): each broker advertises its SSL
listener to clients that came in through it, and confluent-kafka produces to a replicated topic and consumes it
over TLS only."""

from __future__ import annotations


import pytest

pytest.importorskip("cryptography", reason="certificates for these tests are built with cryptography")
confluent_kafka = pytest.importorskip("confluent_kafka")

from broker_cluster import BrokerCluster  # noqa: E402
from cluster_helpers import add_client_listener, produce_through_listener  # noqa: E402
from test_tls_listeners import consume_values  # noqa: E402
from tls_helpers import standard_pki  # noqa: E402

TIMEOUT_S = 60.0


@pytest.mark.timeout(300)
def test_clients_use_every_brokers_ssl_listener(zk_connect, tmp_path):
    (tmp_path / "pki").mkdir()
    pki = standard_pki(tmp_path / "pki")
    cluster = BrokerCluster(zk_connect, tmp_path, n=2, overrides={
        "ssl.keystore.type": "PEM", "ssl.keystore.location": pki.broker_pem_file,
        "offsets.topic.replication.factor": 2, "offsets.topic.num.partitions": 2,
        "default.replication.factor": 2, "num.partitions": 1})
    ssl_ports = add_client_listener(cluster, "SSL")  # PLAINTEXT stays the inter-broker listener
    settings = {"security.protocol": "SSL", "ssl.ca.location": pki.ca_file}
    with cluster:
        topic = produce_through_listener(ssl_ports, settings, "tls")
        values = consume_values(f"127.0.0.1:{ssl_ports[2]}", settings, topic, 10)
        assert values == [f"v{index}".encode() for index in range(10)]
        cluster.wait_for_isr(topic, 0, {1, 2})  # replicated between the brokers over PLAINTEXT

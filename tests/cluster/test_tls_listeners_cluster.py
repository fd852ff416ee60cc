"""SSL listeners for clients on a ZooKeeper cluster whose brokers talk to each other on PLAINTEXT (inter-broker
TLS: test_inter_broker_tls_cluster.py): each broker advertises its SSL
listener to clients that came in through it, and confluent-kafka produces to a replicated topic and consumes it
over TLS only."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("cryptography", reason="certificates for these tests are built with cryptography")
confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402

from broker_cluster import BrokerCluster  # noqa: E402
from broker_process import free_port  # noqa: E402
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
    ssl_ports = {}
    for broker_id, broker in cluster.brokers.items():
        ssl_ports[broker_id] = free_port()
        listeners = f"PLAINTEXT://127.0.0.1:{broker.port},SSL://127.0.0.1:{ssl_ports[broker_id]}"
        command = broker.command  # the PLAINTEXT listener stays first: it is the inter-broker listener
        broker.command = lambda command=command, listeners=listeners: [
            listeners if arg.startswith("PLAINTEXT://") else arg for arg in command()]
    settings = {"security.protocol": "SSL", "ssl.ca.location": pki.ca_file}
    with cluster:
        bootstrap = f"127.0.0.1:{ssl_ports[1]}"
        brokers = AdminClient({"bootstrap.servers": bootstrap, **settings}).list_topics(timeout=TIMEOUT_S).brokers
        assert sorted((b.id, b.port) for b in brokers.values()) == sorted(ssl_ports.items())
        topic = f"tls-{uuid.uuid4().hex[:8]}"
        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", **settings})
        for index in range(10):
            producer.produce(topic, f"v{index}".encode())
        assert producer.flush(TIMEOUT_S) == 0
        values = consume_values(f"127.0.0.1:{ssl_ports[2]}", settings, topic, 10)
        assert values == [f"v{index}".encode() for index in range(10)]
        cluster.wait_for_isr(topic, 0, {1, 2})  # replicated between the brokers over PLAINTEXT

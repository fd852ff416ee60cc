"""A cluster broker takes requests only once it is registered in ZooKeeper, as Kafka's KafkaServer.startup
enables request processing after the registration: before that its metadata cache is empty, and a Metadata
answer listing no broker makes librdkafka (>= 2.10) drop every broker it knows, with the requests it had in
flight (a fault run's consumer then read nothing while a killed broker restarted and waited for its previous
ZooKeeper session to expire)."""

from __future__ import annotations

import pytest

pytest.importorskip("kazoo", reason="kazoo is not installed")

from kazoo.client import KazooClient

from broker_cluster import ClusterBroker, wait_until
from broker_process import ProtocolError, send_request
from kio.schema.metadata.v12.request import MetadataRequest


def metadata_brokers(broker: ClusterBroker, timeout: float) -> list[int]:
    answer = send_request(broker.address, MetadataRequest(topics=(), allow_auto_topic_creation=False,
                                                          include_topic_authorized_operations=False),
                          timeout=timeout)
    return sorted(int(b.node_id) for b in answer.brokers)


def test_a_broker_waiting_for_its_registration_answers_no_client_until_registered(zk_connect, tmp_path):
    hosts, _, chroot = zk_connect.partition("/")
    holder = KazooClient(hosts=hosts, timeout=10)
    holder.start(timeout=10)
    broker = ClusterBroker(tmp_path / "broker-1", 1, zk_connect, {"zookeeper.session.timeout.ms": 6000})
    try:
        # Another session holds /brokers/ids/1, as a killed process's session does until it times out.
        holder.create(f"/{chroot}/brokers/ids/1", b"", ephemeral=True, makepath=True)
        broker.start(wait=False)
        wait_until(lambda: "still registered by an earlier ZooKeeper session" in broker.log_path.read_text(
            errors="replace"), "the broker to wait for the registration", 30)
        with pytest.raises((OSError, ProtocolError)):  # accepted into the backlog, not answered
            metadata_brokers(broker, timeout=1.0)

        holder.stop()  # the old session ends: the broker registers, then answers
        seen = []
        wait_until(lambda: seen.append(metadata_brokers(broker, timeout=5.0)) or seen[-1] == [1],
                   "the registered broker to list itself", 30)
    finally:
        holder.stop()
        holder.close()
        broker.stop()

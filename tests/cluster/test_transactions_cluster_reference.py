"""The cluster transaction tests (test_transactions_cluster.py) against a 3-broker Apache Kafka 3.7.1 in ZooKeeper
mode (../shared/refkit), with the same overrides and the same ZooKeeper fixture: the proof that those tests hold
where Kafka is the broker. Opt-in, since it starts three JVMs (~50 s of a 2-core machine):

    PYKBROKER_REFERENCE_CLUSTER=1 python3 -m pytest -q tests/cluster/test_transactions_cluster_reference.py

Kafka 3.7.1, seen here: a confluent-kafka commit_transaction() called after the coordinator was SIGKILLed
succeeds (librdkafka finds the new coordinator and retries EndTxn); the records are read exactly once. A new
incarnation's init_transactions() through the new coordinator aborts the open transaction.
"""
from __future__ import annotations

import os

import pytest

from broker_cluster import BrokerCluster, ClusterBroker
import test_transactions_cluster as t
from kafka_tools import KAFKA_DIST, find_refkit, unavailable_reason

REFKIT = find_refkit()
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(not os.environ.get("PYKBROKER_REFERENCE_CLUSTER"),
                       reason="opt-in (3 JVMs): set PYKBROKER_REFERENCE_CLUSTER=1"),
    pytest.mark.skipif(unavailable_reason(REFKIT) is not None, reason=str(unavailable_reason(REFKIT))),
]


class KafkaZkBroker(ClusterBroker):
    """Kafka in ZooKeeper mode as a ClusterBroker: the same id, ZooKeeper chroot, port, data dir and overrides."""

    def command(self):
        env = {"LOG_DIR": str(self.workdir / "run"), "KAFKA_HEAP_OPTS": "-Xmx384m",
               "KAFKA_JVM_PERFORMANCE_OPTS": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto"}
        return ["env", *(f"{k}={v}" for k, v in env.items()),
                str(REFKIT / KAFKA_DIST / "bin" / "kafka-server-start.sh"), str(self.workdir / "server.properties")]

    def start(self, timeout=120.0, *, wait=True):
        props = {"broker.id": self.broker_id, "zookeeper.connect": self.zk_connect,
                 "listeners": f"PLAINTEXT://{self.host}:{self.port}", "log.dirs": str(self.data_dir),
                 **{k: v for k, v in self.overrides.items()}}
        (self.workdir / "server.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return super().start(timeout, wait=wait)


class KafkaZkCluster(BrokerCluster):
    """A BrokerCluster of Kafka brokers: everything the tests read (Metadata, FindCoordinator, ZooKeeper) is the
    same protocol."""

    def __init__(self, zk_connect, tmp_path, n=3, overrides=None):
        super().__init__(zk_connect, tmp_path, n, overrides)
        self.brokers = {i: KafkaZkBroker(self.root / f"kafka-{i}", i, zk_connect, overrides) for i in range(1, n + 1)}

    def start(self, timeout=180.0):
        return super().start(timeout)


@pytest.fixture
def cluster(zk_connect, tmp_path):
    with KafkaZkCluster(zk_connect, tmp_path, n=3, overrides=t.OVERRIDES) as brokers:
        yield brokers


test_reference_transaction_across_partitions_led_by_different_brokers = (
    t.test_transaction_across_partitions_led_by_different_brokers)
test_reference_coordinator_killed_during_a_transaction = t.test_coordinator_killed_during_a_transaction

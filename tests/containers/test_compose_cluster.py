"""docker/compose.yaml: ZooKeeper and 3 brokers started with docker-compose on the host's network (free
127.0.0.1 ports chosen through the file's environment variables), reached by stock clients, surviving
`docker kill` of a partition leader, stopping with controlled shutdown, keeping their data across down/up.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
import time
import uuid

import pytest
from docker_helpers import (
    REPO_ROOT,
    SESSION_ID,
    SESSION_LABEL,
    SUITE_LABELS,
    compose_cli,
    consume_confluent,
    create_topic,
    free_port,
    produce_confluent,
    wait_healthy,
    wait_until,
)

COMPOSE_FILE = REPO_ROOT / "docker" / "compose.yaml"
BROKER_IDS = (1, 2, 3)
SERVICES = ("zookeeper", *(f"broker-{i}" for i in BROKER_IDS))
VOLUMES = ("zookeeper-data", *(f"broker-{i}-data" for i in BROKER_IDS))
log = logging.getLogger(__name__)


def suite_labels_override() -> str:
    """A compose file, merged after docker/compose.yaml (which users run unchanged), that gives every container
    and volume of the cluster the suite's labels: the session-end clean-up finds what a failed test left."""
    override = {"services": {service: {"labels": SUITE_LABELS} for service in SERVICES},
                "volumes": {volume: {"labels": SUITE_LABELS} for volume in VOLUMES}}
    with tempfile.NamedTemporaryFile("w", prefix="compose-suite-labels-", suffix=".yaml", delete=False) as file:
        json.dump(override, file)   # JSON is YAML
    return file.name


class ComposeCluster:
    def __init__(self, client, broker_image: str, zookeeper_image: str):
        self.client = client
        self.project = f"pykbroker-test-{uuid.uuid4().hex[:8]}"
        self.ports = {broker_id: free_port() for broker_id in BROKER_IDS}
        self.env = {
            "BROKER_IMAGE": broker_image, "ZOOKEEPER_IMAGE": zookeeper_image, "ZOOKEEPER_PORT": str(free_port()),
            **{f"BROKER_{i}_PORT": str(port) for i, port in self.ports.items()},
            **{f"BROKER_{i}_METRICS_PORT": str(free_port()) for i in BROKER_IDS},
        }
        self.bootstrap = ",".join(f"127.0.0.1:{port}" for port in self.ports.values())
        self.override = suite_labels_override()

    def compose(self, *args: str, timeout: float = 180, check: bool = True) -> str:
        done = subprocess.run([*compose_cli(), "-p", self.project, "-f", str(COMPOSE_FILE), "-f", self.override,
                               *args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env})
        message = f"docker-compose {' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}"
        if check:
            assert done.returncode == 0, message
        elif done.returncode != 0:
            log.warning("%s", message)
        return done.stdout

    def container(self, service: str):
        found = self.client.containers.list(all=True, filters={
            "label": [f"com.docker.compose.project={self.project}", f"com.docker.compose.service={service}"]})
        assert len(found) == 1, (service, found)
        return found[0]

    def broker(self, broker_id: int):
        return self.container(f"broker-{broker_id}")

    def up(self) -> None:
        """`up -d` (the images are the session's builds: --no-build) and every service healthy; also starts
        again what a test stopped or killed."""
        self.compose("up", "-d", "--no-build")
        for service in SERVICES:
            wait_healthy(self.container(service), timeout=180)
        wait_until(lambda: self.broker_count() == 3, "3 brokers in Metadata", timeout=60)

    def broker_count(self) -> int:
        """The brokers Metadata lists; 0 while it fails (a broker just started or restarted: partial answer)."""
        from confluent_kafka import KafkaException

        try:
            return len(self.metadata().brokers)
        except KafkaException as error:
            log.info("Metadata while the cluster starts: %s", error)
            return 0

    def metadata(self, topic: str | None = None):
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(topic, timeout=20)

    def leader(self, topic: str, partition: int) -> int:
        return self.metadata(topic).topics[topic].partitions[partition].leader


@pytest.fixture(scope="module")
def compose_cluster(docker_client, pykbroker_image, zookeeper_image):
    cluster = ComposeCluster(docker_client, pykbroker_image, zookeeper_image)
    try:
        cluster.up()
        yield cluster
    finally:
        # Not asserting: a failure here must not hide the one that ended the test (it is logged).
        cluster.compose("down", "-v", "--timeout", "60", check=False)
        os.unlink(cluster.override)


def test_cluster_carries_the_suite_labels(compose_cluster):
    labelled = compose_cluster.client.containers.list(all=True, filters={"label": [
        f"com.docker.compose.project={compose_cluster.project}", f"{SESSION_LABEL}={SESSION_ID}"]})
    assert sorted(c.labels["com.docker.compose.service"] for c in labelled) == sorted(SERVICES)
    volumes = compose_cluster.client.volumes.list(filters={"label": [
        f"com.docker.compose.project={compose_cluster.project}", f"{SESSION_LABEL}={SESSION_ID}"]})
    assert len(volumes) == len(VOLUMES), [v.name for v in volumes]


def test_stock_clients_and_leader_killed(compose_cluster):
    topic = "compose-failover"
    create_topic(compose_cluster.bootstrap, topic, partitions=3, replication_factor=3)
    acked = produce_confluent(compose_cluster.bootstrap, topic, [f"before {i}".encode() for i in range(300)])
    assert len(acked) == 300

    old_leader = compose_cluster.leader(topic, 0)
    victim = compose_cluster.broker(old_leader)
    victim.kill()   # SIGKILL: no controlled shutdown, the controller finds out through ZooKeeper
    victim.reload()
    assert victim.attrs["State"]["Status"] == "exited"

    # Writes with acks=all go on once a new leader is elected (min.insync.replicas=2 of 3 replicas).
    acked += produce_confluent(compose_cluster.bootstrap, topic, [f"after {i}".encode() for i in range(300)],
                               timeout=90)
    assert len(acked) == 600
    new_leader = compose_cluster.leader(topic, 0)
    assert new_leader in BROKER_IDS and new_leader != old_leader
    consumed = consume_confluent(compose_cluster.bootstrap, topic, partitions=3, expected=len(acked), timeout=90)
    assert sorted(consumed) == sorted(acked)

    # The killed broker comes back and rejoins (docker kill is a manual stop: no restart policy applies).
    victim.start()
    wait_healthy(victim, timeout=120)
    wait_until(lambda: compose_cluster.broker_count() == 3, "the killed broker back in Metadata",
               timeout=60)


def test_controlled_shutdown_and_data_kept_across_down_up(compose_cluster):
    compose_cluster.up()   # every broker running, whatever the test before left
    topic = "compose-kept"
    create_topic(compose_cluster.bootstrap, topic, partitions=3, replication_factor=3)
    acked = produce_confluent(compose_cluster.bootstrap, topic, [f"kept {i}".encode() for i in range(300)])
    assert len(acked) == 300

    compose_cluster.compose("stop", "--timeout", "60")
    for broker_id in BROKER_IDS:
        broker = compose_cluster.broker(broker_id)
        broker.reload()
        logs = broker.logs(since=int(time.time()) - 300).decode(errors="replace")
        assert broker.attrs["State"]["ExitCode"] == 0, logs[-3000:]
        assert f"pykbroker broker {broker_id} stopped cleanly" in logs
    # Every broker but the last one stopping hands its leaderships over before it leaves.
    controlled = [i for i in BROKER_IDS
                  if f"controlled shutdown of broker {i} succeeded" in compose_cluster.broker(i).logs().decode()]
    assert len(controlled) >= 2, controlled

    compose_cluster.compose("down")   # containers gone, named volumes kept
    assert not compose_cluster.client.containers.list(
        all=True, filters={"label": f"com.docker.compose.project={compose_cluster.project}"})
    compose_cluster.up()
    consumed = consume_confluent(compose_cluster.bootstrap, topic, partitions=3, expected=300, timeout=90)
    assert sorted(consumed) == sorted(acked)

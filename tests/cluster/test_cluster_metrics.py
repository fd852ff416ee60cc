"""Metrics of a 3-broker ZooKeeper cluster, each broker with its own metrics.port: exactly one active
controller, leader counts that add up to the partitions, under-replicated partitions while a follower is
down and none once it is back (ISR expansions counted), /ready on every member; each member's own process_*
series and build info."""

from __future__ import annotations

import http.client

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker_cluster import BrokerCluster, wait_until
from broker_process import HOST, free_port

pytestmark = pytest.mark.timeout(240)

TIMEOUT_S = 60.0
TOPIC = "metered"
PARTITIONS = 3


def get(port: int, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(HOST, port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def scrape(port: int) -> dict[str, float]:
    """Sample name -> the sum over its label sets (enough for the broker-wide gauges asked here)."""
    status, body = get(port, "/metrics")
    assert status == 200
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


@pytest.fixture
def cluster(zk_connect, tmp_path):
    cluster = BrokerCluster(zk_connect, tmp_path, n=3, overrides={
        "zookeeper.session.timeout.ms": 6000, "replica.lag.time.max.ms": 4000})
    for broker in cluster.brokers.values():
        broker.overrides["metrics.port"] = free_port()
    with cluster:
        yield cluster


def metrics_port(cluster, broker_id: int) -> int:
    return cluster.brokers[broker_id].overrides["metrics.port"]


def scrape_live(cluster) -> dict[int, dict[str, float]]:
    return {i: scrape(metrics_port(cluster, i)) for i in sorted(cluster.live_ids())}


def test_controller_leaders_and_under_replication(cluster):
    for broker_id in cluster.brokers:
        wait_until(lambda: get(metrics_port(cluster, broker_id), "/ready") == (200, b"ready\n"),
                   f"broker {broker_id} ready", TIMEOUT_S)
    cluster.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)

    def settled() -> bool:
        scraped = scrape_live(cluster)
        active = [i for i, s in scraped.items() if s["kafka_controller_kafkacontroller_activecontrollercount"] == 1]
        if len(active) != 1 or active[0] != cluster.controller_id():
            return False
        total = scraped[active[0]]["kafka_controller_kafkacontroller_globalpartitioncount"]
        leaders = sum(s["kafka_server_replicamanager_leadercount"] for s in scraped.values())
        return total >= PARTITIONS and leaders == total and all(
            s["kafka_server_replicamanager_underreplicatedpartitions"] == 0 for s in scraped.values())

    wait_until(settled, "one active controller, leader counts adding up to the partitions", TIMEOUT_S)
    scraped = scrape_live(cluster)
    assert sum(s["kafka_controller_kafkacontroller_activecontrollercount"] for s in scraped.values()) == 1
    assert all(s["kafka_server_replicamanager_partitioncount"] >= PARTITIONS for s in scraped.values())
    expands_before = sum(s["kafka_server_replicamanager_isrexpands_total"] for s in scraped.values())
    # every member reports its own process and build
    assert all(s["pykbroker_build_info"] == 1 and s["process_open_fds"] > 0 and s["process_cpu_seconds_total"] > 0
               for s in scraped.values()), scraped

    # Kill a broker that is not the controller: the partitions it followed are under-replicated on their leaders.
    victim = next(i for i in sorted(cluster.brokers) if i != cluster.controller_id())
    victim_started = scraped[victim]["process_start_time_seconds"]
    cluster.kill(victim)

    def under_replicated() -> bool:
        return sum(s["kafka_server_replicamanager_underreplicatedpartitions"]
                   for s in scrape_live(cluster).values()) >= 1

    wait_until(under_replicated, "under-replicated partitions after a follower died", TIMEOUT_S)
    scraped = scrape_live(cluster)
    assert sum(s["kafka_controller_kafkacontroller_activecontrollercount"] for s in scraped.values()) == 1

    cluster.start_broker(victim)
    wait_until(lambda: get(metrics_port(cluster, victim), "/ready")[0] == 200, "the restarted broker ready", TIMEOUT_S)

    def healed() -> bool:
        scraped = scrape_live(cluster)
        return len(scraped) == 3 and all(
            s["kafka_server_replicamanager_underreplicatedpartitions"] == 0 for s in scraped.values())

    wait_until(healed, "no under-replicated partition once the follower is back", TIMEOUT_S)
    scraped = scrape_live(cluster)
    # It rejoined the ISRs through the leaders' AlterPartition: expansions were counted.
    assert sum(s["kafka_server_replicamanager_isrexpands_total"] for s in scraped.values()) > expands_before
    assert scraped[victim]["process_start_time_seconds"] > victim_started  # a new process answers
    total = max(s["kafka_controller_kafkacontroller_globalpartitioncount"] for s in scraped.values())
    wait_until(lambda: sum(s["kafka_server_replicamanager_leadercount"] for s in scrape_live(cluster).values()) == total,
               "leader counts adding up again", TIMEOUT_S)


def test_not_ready_while_joining_the_cluster(tmp_path):
    """A member that cannot reach ZooKeeper yet is alive (/health) but not ready (/ready 503, with the reason)."""
    from broker_cluster import ClusterBroker

    nobody = free_port()  # no ZooKeeper there
    port = free_port()
    broker = ClusterBroker(tmp_path / "broker-1", 1, f"127.0.0.1:{nobody}",
                           {"metrics.port": port, "zookeeper.connection.timeout.ms": 60000})
    try:
        broker.start(wait=False)

        def health() -> bool:
            try:
                return get(port, "/health")[0] == 200
            except OSError:
                return False

        wait_until(health, "/health answers", TIMEOUT_S)
        status, body = get(port, "/ready")
        assert status == 503
        assert body == b"starting: loading logs and joining the cluster\n"
    finally:
        broker.kill()

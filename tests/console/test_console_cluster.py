"""The console against a 3-broker pykbroker cluster (ZooKeeper mode): every broker with its address, the
controller, replicas and ISR, and an under-replicated partition once a broker is gone. Read over HTTP as
the browser would get it; the browser tests cover rendering."""

from __future__ import annotations

import os

import pytest
from console_helpers import assert_size_cell, rows, status, text, wait_for

from broker_cluster import BrokerCluster
from pykbroker.cluster.zk_server import ZooKeeperServer, ZooKeeperUnavailable, find_install

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def zk_connect(tmp_path):
    try:
        install = find_install()
    except ZooKeeperUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have ZooKeeper: {exc}")
        pytest.skip(str(exc))
    server = ZooKeeperServer(data_dir=tmp_path / "zookeeper", install=install)
    server.start()
    try:
        yield server.connect_string + "/console"
    finally:
        server.stop()


def test_cluster_pages(zk_connect, tmp_path, console_server):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    overrides = {"replica.lag.time.max.ms": 2000, "zookeeper.session.timeout.ms": 6000}
    with BrokerCluster(zk_connect, tmp_path, n=3, overrides=overrides) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic("replicated", 2, 3)])["replicated"].result(60)
        for index in (0, 1):
            cluster.wait_for_isr("replicated", index, {1, 2, 3})
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
        for i in range(5):
            producer.produce("replicated", value=f"m{i}", partition=i % 2)
        assert producer.flush(60) == 0
        base = console_server(cluster.bootstrap).url

        controller = cluster.controller_id()
        brokers = [row for row in rows(base, "/") if len(row) == 4]
        assert [row[:2] for row in brokers] == [[str(i), f"127.0.0.1:{cluster.brokers[i].port}"] for i in (1, 2, 3)]
        assert [row[0] for row in brokers if row[3] == "controller"] == [str(controller)]

        topic = {row[0]: row for row in rows(base, "/topics")}["replicated"]
        assert topic[1:4] + topic[5:6] == ["2", "3", "0", "5"]
        assert_size_cell(topic[4], *cluster.brokers[1].address)
        partitions = [row for row in rows(base, "/topics/replicated") if len(row) == 9]
        assert [(row[0], sorted(row[2].split(", ")), sorted(row[3].split(", ")), row[5]) for row in partitions] == [
            ("0", ["1", "2", "3"], ["1", "2", "3"], "3"), ("1", ["1", "2", "3"], ["1", "2", "3"], "2")]

        # A broker gone: it leaves the ISR of its partitions (a new leader where it led) and show as under-replicated
        victim = next(i for i in (1, 2, 3) if i != controller)
        cluster.kill(victim)
        for index in (0, 1):
            cluster.wait_for_isr("replicated", index, {1, 2, 3} - {victim})
        wait_for(lambda: {r[0]: r for r in rows(base, "/topics")}["replicated"][3] == "2",
                 "two under-replicated partitions on the topics page")
        assert [row[0] for row in rows(base, "/") if len(row) == 4] == [str(i) for i in (1, 2, 3) if i != victim]
        assert f"Brokers {len(cluster.brokers) - 1} " in text(base, "/")


def test_groups_pages_say_why_groups_cannot_start_while_a_broker_is_missing(zk_connect, tmp_path, console_server):
    """No __consumer_offsets yet and 2 of 3 brokers live: Kafka's rule (3 live brokers for the offsets topic)
    keeps groups waiting; the groups page says why (live brokers from Metadata, the factor from DescribeConfigs:
    pykbroker.ctl.coordination) and a group's page answers at once with it (503), not after a describe
    timeout. With the third broker back, it goes."""
    cause = ("the offsets topic __consumer_offsets cannot be created yet: 2 live brokers, "
             "offsets.topic.replication.factor=3")
    with BrokerCluster(zk_connect, tmp_path, n=3) as cluster:
        assert cluster.stop(3) == 0  # controlled shutdown: ZooKeeper drops it at once
        cluster.wait_ready()  # brokers 1 and 2 list only each other
        base = console_server(cluster.bootstrap).url

        page = text(base, "/groups")
        assert f"consumer groups cannot start: {cause}" in page, page
        code, body, _ = status(base, "/groups/billing")
        assert code == 503 and cause in body, (code, body)

        cluster.start_broker(3)
        cluster.wait_ready()
        wait_for(lambda: "cannot start" not in text(base, "/groups"), "the groups page without the warning", 60)


def test_groups_pages_of_a_fresh_healthy_cluster_warn_of_nothing_and_create_nothing(zk_connect, tmp_path,
                                                                                   console_server):
    """3 live brokers, no __consumer_offsets yet (no group ever): groups can start, so no warning; and looking
    (read-only) does not create the topic (before: the console asked FindCoordinator, which starts creating
    it and answers a bare COORDINATOR_NOT_AVAILABLE meanwhile: a false warning)."""
    from confluent_kafka.admin import AdminClient

    with BrokerCluster(zk_connect, tmp_path, n=3) as cluster:
        base = console_server(cluster.bootstrap).url
        for _ in range(2):
            page = text(base, "/groups")
            assert "cannot start" not in page and "COORDINATOR_NOT_AVAILABLE" not in page, page
        topics = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=30).topics
        assert "__consumer_offsets" not in topics, sorted(topics)

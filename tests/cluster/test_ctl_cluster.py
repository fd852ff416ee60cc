"""`pykbroker cluster info` and `pykbroker topic create|describe` (pykbroker/ctl) against a 3-broker cluster:
the controller, every broker and its API versions; a replicated topic's leaders, replicas and ISR as the
brokers' own Metadata reports them.

Run: python3 -m pytest -q tests/cluster/test_ctl_cluster.py
"""

from __future__ import annotations

import pytest

from broker_cluster import BrokerCluster, wait_until
from broker_process import probe_api_versions
from ctl_runner import ctl

pytestmark = pytest.mark.timeout(300)


def test_cluster_info_and_topic_describe_on_three_brokers(zk_connect, tmp_path):
    with BrokerCluster(zk_connect, tmp_path, n=3) as cluster:
        bootstrap = cluster.bootstrap

        info = ctl(bootstrap, "cluster", "info", "--format", "json")
        assert info.returncode == 0, info
        data = info.json()
        controller = cluster.controller_id()
        assert data["controller"] == controller
        assert sorted((b["id"], b["port"]) for b in data["brokers"]) == sorted(
            (i, b.port) for i, b in cluster.brokers.items())
        assert [b["id"] for b in data["brokers"] if b["controller"]] == [controller]
        for entry in data["brokers"]:
            advertised = {int(k.api_key): (int(k.min_version), int(k.max_version))
                          for k in probe_api_versions(cluster.brokers[entry["id"]].address).api_keys}
            assert {v["api_key"]: (v["min"], v["max"]) for v in entry["api_versions"]} == advertised
            assert 4 in advertised  # LeaderAndIsr: a cluster member's API, listed by name
            assert {"api_key": 4, "name": "LeaderAndIsr", "min": advertised[4][0], "max": advertised[4][1]} \
                in entry["api_versions"]
        table = ctl(bootstrap, "cluster", "info", "--no-api-versions")
        stars = [row for row in table.rows() if row[-1] == "*"]
        assert [row[0] for row in stars] == [str(controller)], table

        created = ctl(bootstrap, "topic", "create", "replicated", "-p", "3", "-r", "3", "-c", "min.insync.replicas=2")
        assert created.returncode == 0, created
        for index in range(3):
            leader = cluster.wait_for_leader("replicated", index)
            cluster.wait_for_isr("replicated", index, cluster.partition("replicated", index, leader).replicas)

        def described():
            result = ctl(bootstrap, "topic", "describe", "replicated", "--format", "json")
            assert result.returncode == 0, result
            return result.json()

        wait_until(lambda: all(len(p["isr"]) == 3 for p in described()["partitions"]), "full ISR in describe", 60)
        data = described()
        assert data["replication_factor"] == 3
        for partition in data["partitions"]:
            truth = cluster.partition("replicated", partition["partition"])
            assert partition["leader"] == truth.leader
            assert partition["replicas"] == list(truth.replicas)
            assert sorted(partition["isr"]) == sorted(truth.isr) == [1, 2, 3]
        leaders = {p["leader"] for p in data["partitions"]}
        assert len(leaders) == 3  # one partition led by each broker, as Kafka spreads them
        assert {"name": "min.insync.replicas", "value": "2"}.items() <= next(
            c for c in data["configs"] if c["name"] == "min.insync.replicas").items()

        table = ctl(bootstrap, "topic", "describe", "replicated")
        rows = table.rows()
        for partition in data["partitions"]:
            assert [str(partition["partition"]), str(partition["leader"]), ",".join(map(str, partition["replicas"])),
                    ",".join(map(str, partition["isr"])), "0", "0"] in rows


COORDINATOR_TIMEOUT_S = 30  # the --timeout given: the commands must end long before it
QUICK_S = 15.0  # a Python start and the short wait for __consumer_offsets, on a loaded machine


def test_group_commands_say_why_the_coordinator_cannot_be_found(zk_connect, tmp_path):
    """One live broker and offsets.topic.replication.factor=3: by Kafka's rule __consumer_offsets cannot be
    created, so no group has a coordinator. librdkafka would retry until --timeout and say _TIMED_OUT; the
    group commands (and consume -g) ask FindCoordinator themselves and say the broker's error (and its
    error_message, whatever the broker words it) well before --timeout."""
    import time

    with BrokerCluster(zk_connect, tmp_path, n=1, overrides={"offsets.topic.replication.factor": 3}) as cluster:
        bootstrap = cluster.bootstrap
        created = ctl(bootstrap, "topic", "create", "orders", "-r", "1")
        assert created.returncode == 0, created
        cluster.wait_for_leader("orders", 0)
        for args in (["group", "describe", "billing"], ["group", "seek", "billing", "--to", "earliest", "-t", "orders"],
                     ["group", "delete", "billing", "audit"], ["consume", "orders", "-g", "billing", "-e"]):
            started = time.monotonic()
            result = ctl(bootstrap, *args, "--timeout", str(COORDINATOR_TIMEOUT_S))
            took = time.monotonic() - started
            assert result.returncode == 1, result
            assert took < QUICK_S, f"{args} took {took:.1f} s"
            said = "cannot find the coordinator of group 'billing': COORDINATOR_NOT_AVAILABLE"
            if args[:2] == ["group", "delete"]:  # each group its row, as every delete says its errors
                assert [line.split("  ")[0] for line in result.stdout.splitlines()] == ["GROUP", "billing", "audit"]
                assert said in result.stdout and "group 'audit': COORDINATOR_NOT_AVAILABLE" in result.stdout, result
            else:
                assert f"Error: {said}" in result.stderr, result
            assert "_TIMED_OUT" not in result.stderr and "Traceback" not in result.stderr, result
        # a group command that needs no coordinator still works
        listed = ctl(bootstrap, "group", "list", "--format", "json")
        assert listed.returncode == 0 and listed.json() == [], listed


def test_group_delete_deletes_the_groups_whose_coordinator_is_found(zk_connect, tmp_path):
    """Two brokers, __consumer_offsets with one replica per partition, one broker stopped: the groups whose
    offsets partition it led have no coordinator. Deleting such a group with another one deletes the other
    one and says, in its own row, why the first could not be."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    from pykbroker.groups.offset_store import OFFSETS_TOPIC, partition_for_group

    overrides = {"offsets.topic.num.partitions": 2, "offsets.topic.replication.factor": 1}
    with BrokerCluster(zk_connect, tmp_path, n=2, overrides=overrides) as cluster:
        assert ctl(cluster.bootstrap, "topic", "create", "orders", "-r", "2").returncode == 0
        cluster.wait_for_leader("orders", 0)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})

        def commit(group_id: str) -> None:
            request = ConsumerGroupTopicPartitions(group_id, [TopicPartition("orders", 0, 1)])
            admin.alter_consumer_group_offsets([request])[group_id].result(60)

        commit("first")  # creates __consumer_offsets
        leaders = {p: cluster.wait_for_leader(OFFSETS_TOPIC, p) for p in (0, 1)}
        if len(set(leaders.values())) != 2:
            pytest.skip(f"both {OFFSETS_TOPIC} partitions on one broker: {leaders}")
        names = (f"g{i}" for i in range(1000))
        kept, lost = (next(name for name in names if leaders[partition_for_group(name, 2)] == broker)
                      for broker in (1, 2))
        commit(kept)
        commit(lost)
        assert cluster.stop(2) == 0
        cluster.wait_ready()

        result = ctl(cluster.bootstrap, "group", "delete", lost, kept, "--timeout", "5", "--format", "json")
        assert result.returncode == 1, result
        rows = {row["group"]: row for row in result.json()}
        assert rows[kept] == {"group": kept, "status": "deleted", "error": None}, result
        assert rows[lost]["status"].startswith(
            f"cannot find the coordinator of group {lost!r}: COORDINATOR_NOT_AVAILABLE"), result
        gone = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(kept)])[kept].result(60)
        assert [tp.offset for tp in gone.topic_partitions if tp.offset >= 0] == []


def test_the_zookeeper_port_is_said_not_to_be_a_kafka_listener(zk_connect):
    """`pykbroker cluster` prints ZooKeeper's address next to the brokers': given by mistake as -b, the CLI
    says that port does not answer ApiVersions, at once, instead of librdkafka's _TRANSPORT after --timeout."""
    import time

    zookeeper = zk_connect.split("/", 1)[0]
    started = time.monotonic()
    result = ctl(zookeeper, "topic", "list", "--timeout", "30")
    took = time.monotonic() - started
    assert result.returncode == 4, result
    assert took < QUICK_S, f"took {took:.1f} s"
    assert result.stderr == (f"Error: cannot reach any broker: {zookeeper}: accepts connections but did not answer "
                             "ApiVersions (not a Kafka listener?)\n"), result

"""Kafka 3.7.1's own shell tools, unmodified, against a 3-broker pykbroker cluster (ZooKeeper mode).

What a cluster adds to tests/integration/test_kafka_tools.py: kafka-topics shows three replicas and the ISR, and
the ISR shrinking when a broker stops; the group tools find the group's coordinator (any of the brokers) and
reset offsets there; the console tools, kafka-get-offsets and the perf tools reach each partition's leader.
Skips with the reason without ../shared/refkit, Java or ZooKeeper.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from broker_cluster import BrokerCluster
from kafka_tools import kafka_tools_or_skip

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


def describe_lines(out: str, topic: str) -> tuple[re.Match, dict[int, tuple[int, list[int], list[int]]]]:
    """kafka-topics --describe: the topic line, and per partition (leader, replicas, isr)."""
    lines = out.strip().splitlines()
    head = re.fullmatch(rf"Topic: {topic}\tTopicId: \S+\tPartitionCount: (\d+)\tReplicationFactor: (\d+)\t"
                        r"Configs: (\S*)", lines[0])
    assert head, out
    partitions = {}
    for line in lines[1:]:
        m = re.fullmatch(rf"\tTopic: {topic}\tPartition: (\d+)\tLeader: (-?\d+|none)\tReplicas: ([\d,]+)\t"
                         r"Isr: ([\d,]*)(\tOffline: [\d,]*)?", line)
        assert m, line
        ids = lambda text: [int(i) for i in text.split(",") if i]  # noqa: E731
        partitions[int(m.group(1))] = (int(m.group(2)) if m.group(2) != "none" else -1, ids(m.group(3)), ids(m.group(4)))
    return head, partitions


def test_kafka_tools_against_a_cluster(zk_connect, tmp_path):
    tools = kafka_tools_or_skip()
    topic, group = f"tools-rf3-{uuid.uuid4().hex[:6]}", f"tools-group-{uuid.uuid4().hex[:6]}"
    overrides = {"zookeeper.session.timeout.ms": 6000, "group.initial.rebalance.delay.ms": 0}
    with BrokerCluster(zk_connect, tmp_path, n=3, overrides=overrides) as cluster:
        def run(tool, *args, **kwargs):
            return tools.run(tool, "--bootstrap-server", cluster.bootstrap, *args, **kwargs)

        out = run("kafka-topics.sh", "--create", "--topic", topic, "--partitions", "3", "--replication-factor", "3",
                  "--config", "min.insync.replicas=2").stdout
        assert out.strip() == f"Created topic {topic}."
        for index in range(3):
            leader = cluster.wait_for_leader(topic, index)
            cluster.wait_for_isr(topic, index, cluster.partition(topic, index, leader).replicas)

        head, partitions = describe_lines(run("kafka-topics.sh", "--describe", "--topic", topic).stdout, topic)
        assert head.groups() == ("3", "3", "min.insync.replicas=2")
        for index, (leader, replicas, isr) in partitions.items():
            assert sorted(replicas) == [1, 2, 3] and sorted(isr) == [1, 2, 3]
            assert leader == replicas[0], "a new topic's leader is its preferred replica"
            assert cluster.partition(topic, index).leader == leader
        # replicas are spread: each broker is the preferred leader of one partition
        assert sorted(p[1][0] for p in partitions.values()) == [1, 2, 3]

        lines = [f"k{i % 4}:v{i}" for i in range(20)]
        run("kafka-console-producer.sh", "--topic", topic, "--property", "parse.key=true", "--property",
            "key.separator=:", "--producer-property", "acks=all", input="\n".join(lines) + "\n")
        out = run("kafka-console-consumer.sh", "--topic", topic, "--from-beginning", "--group", group,
                  "--max-messages", "20", "--property", "print.key=true", "--timeout-ms", "60000").stdout
        assert sorted(out.split("\n")[:-1]) == sorted(line.replace(":", "\t") for line in lines)

        offsets = dict(line.rsplit(":", 1) for line in run("kafka-get-offsets.sh", "--topic", topic).stdout.split())
        ends = {int(k.rsplit(":", 1)[1]): int(v) for k, v in offsets.items()}
        assert sum(ends.values()) == 20

        coordinator = cluster.find_coordinator(group)
        out = run("kafka-consumer-groups.sh", "--describe", "--group", group, "--state").stdout
        assert re.search(rf"{re.escape(group)}\s+127\.0\.0\.1:{cluster.brokers[coordinator].port}\s+\({coordinator}\)"
                         r"\s+Empty\s+0", out), out
        out = run("kafka-consumer-groups.sh", "--describe", "--group", group).stdout
        described = {int(m.group(1)): (int(m.group(2)), int(m.group(3)), m.group(4)) for m in re.finditer(
            rf"{re.escape(group)}\s+{re.escape(topic)}\s+(\d)\s+(\d+)\s+(\d+)\s+(\d+)", out)}
        assert described == {p: (ends[p], ends[p], "0") for p in range(3)}, out

        # reset on the coordinator, whichever broker it is; a stock consumer sees the new offsets
        out = run("kafka-consumer-groups.sh", "--group", group, "--reset-offsets", "--shift-by", "-1", "--topic",
                  f"{topic}:0,1", "--execute").stdout
        assert re.search(rf"{re.escape(topic)}\s+0\s+{ends[0] - 1}", out), out
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
        try:
            seen = {tp.partition: tp.offset for tp in consumer.committed(
                [TopicPartition(topic, p) for p in range(3)], timeout=15)}
        finally:
            consumer.close()
        assert seen == {0: ends[0] - 1, 1: ends[1] - 1, 2: ends[2]}

        # the group's coordinator stops (controlled shutdown): another broker takes the group over, with its
        # committed offsets; describe shows the ISR without the stopped broker and leaders elsewhere
        victim = coordinator
        assert cluster.stop(victim) == 0
        for index in range(3):
            cluster.wait_for_leader(topic, index, exclude={victim})
        out = run("kafka-consumer-groups.sh", "--describe", "--group", group).stdout
        described = {int(m.group(1)): int(m.group(2)) for m in re.finditer(
            rf"{re.escape(group)}\s+{re.escape(topic)}\s+(\d)\s+(\d+)\s+", out)}
        assert described == seen, out
        assert cluster.find_coordinator(group) != victim
        _, after = describe_lines(run("kafka-topics.sh", "--describe", "--topic", topic).stdout, topic)
        for index, (leader, replicas, isr) in after.items():
            assert leader != victim and victim not in isr and sorted(replicas) == [1, 2, 3], after
        out = run("kafka-topics.sh", "--describe", "--under-replicated-partitions").stdout
        assert {int(p) for p in re.findall(rf"Topic: {re.escape(topic)}\tPartition: (\d)", out)} == {0, 1, 2}, out

        # the API versions the cluster members serve include the broker-to-broker ones
        out = run("kafka-broker-api-versions.sh").stdout
        support = json.loads((REPO_ROOT / "protocol_specs" / "api_support.json").read_text())["apis"]
        for entry in support:
            if entry.get("cluster_only"):
                shown = f"{entry['min']} to {entry['max']}" if entry["min"] != entry["max"] else f"{entry['min']}"
                assert re.search(rf"\({entry['key']}\): {shown} \[usable: \d+\]", out), (entry, out)
        assert out.count("(id: ") == 2, "the stopped broker is not listed"

        out = tools.run("kafka-producer-perf-test.sh", "--topic", topic, "--num-records", "500", "--record-size", "50",
                        "--throughput", "-1", "--producer-props", f"bootstrap.servers={cluster.bootstrap}",
                        "acks=all").stdout
        assert re.search(r"^500 records sent", out, re.M), out

        cluster.start_broker(victim)
        for index in range(3):
            cluster.wait_for_isr(topic, index, after[index][1])
        run("kafka-topics.sh", "--alter", "--topic", topic, "--partitions", "4")
        leader = cluster.wait_for_leader(topic, 3)
        assert sorted(cluster.partition(topic, 3, leader).replicas) == [1, 2, 3]
        run("kafka-topics.sh", "--delete", "--topic", topic)
        assert topic not in run("kafka-topics.sh", "--list").stdout.split()

"""Kafka 3.7.1's own shell tools, unmodified, against one pykbroker (embedded metadata).

Each test groups several tool runs (each one a JVM start) and checks both what the tool prints - the
lines Kafka's tools print against Kafka - and the effect, as a stock client (confluent-kafka) sees it.
The tools come from ../shared/refkit; without it or a Java runtime the tests skip with the reason.
Tools covered: kafka-topics, kafka-consumer-groups (list, describe, every --reset-offsets mode,
--delete-offsets, --delete), kafka-console-producer / -consumer, kafka-get-offsets,
kafka-producer-perf-test / kafka-consumer-perf-test, kafka-broker-api-versions.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from broker_process import BrokerProcess
from kafka_tools import kafka_tools_or_skip

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tools():
    return kafka_tools_or_skip()


@pytest.fixture(scope="module")
def kbroker(tmp_path_factory):
    # Kafka's perf and console consumers join groups: no 3 s initial rebalance delay in a test
    with BrokerProcess(tmp_path_factory.mktemp("kafka-tools"), config={"group.initial.rebalance.delay.ms": 0},
                       log_level="info") as broker:
        yield broker


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run(tools, broker, tool: str, *args: str, **kwargs):
    return tools.run(tool, "--bootstrap-server", broker.bootstrap, *args, **kwargs)


def table(stdout: str) -> list[dict[str, str]]:
    """The rows of a kafka-consumer-groups table (header line of upper-case column names, then rows)."""
    rows, header = [], None
    for line in stdout.splitlines():
        fields = line.split()
        if fields and fields[0] == "GROUP":
            header = fields
        elif header and len(fields) == len(header):
            rows.append(dict(zip(header, fields)))
    return rows


def offsets_of(rows, column="NEW-OFFSET") -> dict[int, int]:
    return {int(r["PARTITION"]): int(r[column]) for r in rows}


def committed(broker, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets as a stock consumer reads them (-1001 when none)."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=15)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found}


def commit(broker, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def produce(broker, topic: str, records) -> None:
    """records: (partition, key, value, timestamp ms or None)."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for partition, key, value, timestamp in records:
        producer.produce(topic, key=key, value=value, partition=partition, timestamp=timestamp or 0)
    assert producer.flush(30) == 0


def topic_metadata(broker, topic: str):
    return AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(topic, timeout=10).topics[topic]


def test_kafka_topics(tools, kbroker):
    topic = unique("tools-topic")
    out = run(tools, kbroker, "kafka-topics.sh", "--create", "--topic", topic, "--partitions", "3",
              "--replication-factor", "1", "--config", "retention.ms=86400000",
              "--config", "max.message.bytes=200000").stdout
    assert out.strip() == f"Created topic {topic}."

    assert topic in run(tools, kbroker, "kafka-topics.sh", "--list").stdout.split()

    out = run(tools, kbroker, "kafka-topics.sh", "--describe", "--topic", topic).stdout
    lines = out.strip().splitlines()
    head = re.fullmatch(rf"Topic: {topic}\tTopicId: (\S+)\tPartitionCount: 3\tReplicationFactor: 1\t"
                        r"Configs: (\S+)", lines[0])
    assert head, out
    # Kafka lists the topic's own (non-default) configs, in the order DescribeConfigs answers them
    assert sorted(head.group(2).split(",")) == ["max.message.bytes=200000", "retention.ms=86400000"]
    assert lines[1:] == [f"\tTopic: {topic}\tPartition: {p}\tLeader: 1\tReplicas: 1\tIsr: 1" for p in range(3)]

    # creating it again: Kafka's message, exit status 1
    again = run(tools, kbroker, "kafka-topics.sh", "--create", "--topic", topic, check=False)
    assert again.returncode == 1
    assert f"Topic '{topic}' already exists." in again.stdout + again.stderr

    run(tools, kbroker, "kafka-topics.sh", "--alter", "--topic", topic, "--partitions", "5")
    assert sorted(topic_metadata(kbroker, topic).partitions) == [0, 1, 2, 3, 4]
    # the count it has already: exit status 1 and the message a single KRaft 3.7.1 node gives
    same = run(tools, kbroker, "kafka-topics.sh", "--alter", "--topic", topic, "--partitions", "5", check=False)
    assert same.returncode == 1
    assert "Topic already has 5 partition(s)." in same.stdout + same.stderr
    admin = AdminClient({"bootstrap.servers": kbroker.bootstrap})
    configs = admin.describe_configs([ConfigResource("topic", topic)])
    described = next(iter(configs.values())).result(10)
    assert described["retention.ms"].value == "86400000"
    assert described["max.message.bytes"].value == "200000"

    run(tools, kbroker, "kafka-topics.sh", "--delete", "--topic", topic)
    deadline = time.monotonic() + 30
    while topic in AdminClient({"bootstrap.servers": kbroker.bootstrap}).list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, "topic still listed after kafka-topics.sh --delete"
        time.sleep(0.1)


def test_console_producer_and_consumer_with_a_group(tools, kbroker):
    topic, group = unique("tools-console"), unique("console-group")
    run(tools, kbroker, "kafka-topics.sh", "--create", "--topic", topic, "--partitions", "2")
    lines = [f"key-{i % 3}:value-{i}" for i in range(9)]
    run(tools, kbroker, "kafka-console-producer.sh", "--topic", topic, "--property", "parse.key=true",
        "--property", "key.separator=:", input="\n".join(lines) + "\n")

    out = run(tools, kbroker, "kafka-console-consumer.sh", "--topic", topic, "--from-beginning", "--group", group,
              "--max-messages", "9", "--property", "print.key=true", "--timeout-ms", "60000")
    printed = out.stdout.strip().splitlines()
    assert sorted(printed) == sorted(line.replace(":", "\t") for line in lines)
    assert "Processed a total of 9 messages" in out.stderr
    # keys were sent as keys: a key always lands on one partition, so records with one key stay in order
    for k in range(3):
        of_key = [p.split("\t")[1] for p in printed if p.startswith(f"key-{k}\t")]
        assert of_key == [f"value-{i}" for i in range(9) if i % 3 == k]

    # the group committed what it read: kafka-consumer-groups and a stock consumer agree, no lag
    rows = table(run(tools, kbroker, "kafka-consumer-groups.sh", "--describe", "--group", group).stdout)
    assert {r["TOPIC"] for r in rows} == {topic} and len(rows) == 2
    assert all(r["LAG"] == "0" and r["CURRENT-OFFSET"] == r["LOG-END-OFFSET"] for r in rows), rows
    assert sum(int(r["CURRENT-OFFSET"]) for r in rows) == 9
    assert committed(kbroker, group, topic, 2) == offsets_of(rows, "CURRENT-OFFSET")

    # without a group, --max-messages stops it; --partition / --offset read a slice
    out = run(tools, kbroker, "kafka-console-consumer.sh", "--topic", topic, "--partition", "0", "--offset", "1",
              "--max-messages", "1", "--timeout-ms", "30000")
    first_of_p0 = out.stdout.strip()
    assert first_of_p0 in {line.split(":")[1] for line in lines}


def ts(hour: int) -> int:
    return int(datetime(2020, 1, 1, hour, tzinfo=timezone.utc).timestamp() * 1000)


def test_consumer_groups_reset_offsets_in_every_mode(tools, kbroker, tmp_path):
    topic, other, group = unique("tools-reset"), unique("tools-reset-other"), unique("reset-group")
    for name in (topic, other):
        run(tools, kbroker, "kafka-topics.sh", "--create", "--topic", name, "--partitions", "2")
    # 6 records per partition, record i at 2020-01-01 i:00 UTC; other: 4 records in partition 0
    produce(kbroker, topic, [(p, None, f"{p}-{i}".encode(), ts(i)) for p in range(2) for i in range(6)])
    produce(kbroker, other, [(0, None, b"x", ts(i)) for i in range(4)])
    commit(kbroker, group, topic, {0: 4, 1: 5})
    commit(kbroker, group, other, {0: 2})

    def reset(*args):
        return run(tools, kbroker, "kafka-consumer-groups.sh", "--group", group, "--reset-offsets", *args).stdout

    # --dry-run (the default) prints the plan and changes nothing
    rows = table(reset("--to-earliest", "--all-topics", "--dry-run"))
    assert {(r["TOPIC"], int(r["PARTITION"]), int(r["NEW-OFFSET"])) for r in rows} == {
        (topic, 0, 0), (topic, 1, 0), (other, 0, 0)}
    assert committed(kbroker, group, topic, 2) == {0: 4, 1: 5}

    assert offsets_of(table(reset("--to-offset", "3", "--topic", f"{topic}:0", "--execute"))) == {0: 3}
    assert committed(kbroker, group, topic, 2) == {0: 3, 1: 5}

    assert offsets_of(table(reset("--shift-by", "-2", "--topic", topic, "--execute"))) == {0: 1, 1: 3}
    assert committed(kbroker, group, topic, 2) == {0: 1, 1: 3}

    # the first record at or after 02:30 is record 3 (03:00)
    assert offsets_of(table(reset("--to-datetime", "2020-01-01T02:30:00.000Z", "--topic", topic,
                                  "--execute"))) == {0: 3, 1: 3}
    assert committed(kbroker, group, topic, 2) == {0: 3, 1: 3}

    # every record is years older than now - 1 day: no offset for that time, the end offset instead
    out = reset("--by-duration", "P1D", "--topic", f"{topic}:1", "--execute")
    assert offsets_of(table(out)) == {1: 6}

    assert offsets_of(table(reset("--to-latest", "--topic", f"{topic}:0", "--execute"))) == {0: 6}
    assert committed(kbroker, group, topic, 2) == {0: 6, 1: 6}

    assert offsets_of(table(reset("--to-current", "--topic", topic, "--dry-run"))) == {0: 6, 1: 6}

    # --export writes the plan as CSV; --from-file applies such a file
    exported = reset("--to-earliest", "--topic", f"{other}:0", "--export", "--dry-run")
    assert exported.strip().replace('"', "") == f"{other},0,0"  # Kafka's CSV writer quotes names with a '-'
    plan = tmp_path / "plan.csv"
    plan.write_text(f"{topic},0,2\n{topic},1,4\n{exported.strip()}\n")
    rows = table(reset("--from-file", str(plan), "--execute"))
    assert {(r["TOPIC"], int(r["PARTITION"]), int(r["NEW-OFFSET"])) for r in rows} == {
        (topic, 0, 2), (topic, 1, 4), (other, 0, 0)}
    assert committed(kbroker, group, topic, 2) == {0: 2, 1: 4}
    assert committed(kbroker, group, other, 1) == {0: 0}

    # a stock consumer of the group starts where the reset put it
    consumer = Consumer({"bootstrap.servers": kbroker.bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0)])
    try:
        message = None
        for _ in range(20):
            message = consumer.poll(1)
            if message is not None:
                break
        assert message is not None and message.error() is None
        assert (message.offset(), message.value()) == (2, b"0-2")
    finally:
        consumer.close()

    # --delete-offsets of one partition, then --delete of the whole group
    out = run(tools, kbroker, "kafka-consumer-groups.sh", "--group", group, "--delete-offsets", "--topic",
              f"{topic}:1").stdout
    assert f"Request succeed for deleting offsets with topic {topic}:1 group {group}" in out
    assert re.search(rf"{re.escape(topic)}\s+1\s+Successful", out), out
    assert committed(kbroker, group, topic, 2) == {0: 2, 1: -1001}

    out = run(tools, kbroker, "kafka-consumer-groups.sh", "--delete", "--group", group).stdout
    assert f"Deletion of requested consumer groups ('{group}') was successful." in out
    assert group not in run(tools, kbroker, "kafka-consumer-groups.sh", "--list").stdout.split()
    assert committed(kbroker, group, topic, 2) == {0: -1001, 1: -1001}


def test_consumer_groups_describe_an_active_group_and_refuse_to_reset_it(tools, kbroker):
    topic, group = unique("tools-active"), unique("active-group")
    run(tools, kbroker, "kafka-topics.sh", "--create", "--topic", topic, "--partitions", "2")
    produce(kbroker, topic, [(p, None, b"v", None) for p in range(2) for _ in range(5)])
    consumer = Consumer({"bootstrap.servers": kbroker.bootstrap, "group.id": group, "client.id": "the-app",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    try:
        read = 0
        deadline = time.monotonic() + 60
        while read < 4:
            assert time.monotonic() < deadline, "the consumer did not read"
            message = consumer.poll(0.5)
            if message is not None and message.error() is None and message.partition() == 0:
                read += 1
        consumer.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)

        groups = run(tools, kbroker, "kafka-consumer-groups.sh", "--list").stdout.split()
        assert group in groups
        out = run(tools, kbroker, "kafka-consumer-groups.sh", "--describe", "--group", group).stdout
        rows = {int(r["PARTITION"]): r for r in table(out)}
        assert set(rows) == {0, 1}
        assert (rows[0]["CURRENT-OFFSET"], rows[0]["LOG-END-OFFSET"], rows[0]["LAG"]) == ("4", "5", "1")
        assert (rows[1]["CURRENT-OFFSET"], rows[1]["LOG-END-OFFSET"], rows[1]["LAG"]) == ("-", "5", "-")
        assert all(r["CLIENT-ID"] == "the-app" and r["HOST"] == "/127.0.0.1" and r["CONSUMER-ID"].startswith("the-app-")
                   for r in rows.values()), rows

        refused = run(tools, kbroker, "kafka-consumer-groups.sh", "--group", group, "--reset-offsets",
                      "--to-earliest", "--topic", topic, "--execute", check=False)
        assert (f"Assignments can only be reset if the group '{group}' is inactive, but the current state is "
                "Stable.") in refused.stdout + refused.stderr
    finally:
        consumer.close()
    assert committed(kbroker, group, topic, 1) == {0: 4}, "a refused reset changed the offsets"

    out = run(tools, kbroker, "kafka-consumer-groups.sh", "--describe", "--group", group, "--state").stdout
    state = table(out)
    # with no member left: Kafka's columns; ASSIGNMENT-STRATEGY is empty, so the row has one field less
    assert re.search(rf"{re.escape(group)}\s+\S+:\d+\s+\(1\)\s+Empty\s+0", out), out
    assert state == [] or state[0]["STATE"] == "Empty"


def test_get_offsets_api_versions_and_perf_tests(tools, kbroker):
    topic = unique("tools-offsets")
    run(tools, kbroker, "kafka-topics.sh", "--create", "--topic", topic, "--partitions", "3")
    # one batch each: Kafka 3.7 answers MAX_TIMESTAMP with the last offset of the batch holding it
    for record in [(0, None, b"a", ts(1)), (0, None, b"b", ts(3)), (0, None, b"c", ts(2)), (1, None, b"d", ts(1))]:
        produce(kbroker, topic, [record])

    def get_offsets(*args):
        out = run(tools, kbroker, "kafka-get-offsets.sh", *args).stdout
        return dict(line.rsplit(":", 1) for line in out.split())

    assert get_offsets("--topic", topic) == {f"{topic}:0": "3", f"{topic}:1": "1", f"{topic}:2": "0"}
    assert get_offsets("--topic-partitions", f"{topic}:0,{topic}:1", "--time", "-2") == {f"{topic}:0": "0", f"{topic}:1": "0"}
    # by timestamp: the first offset at or after it; an empty partition has none and is left out
    assert get_offsets("--topic", topic, "--time", str(ts(2))) == {f"{topic}:0": "1"}
    # -3: the offset of the record with the largest timestamp
    assert get_offsets("--topic", f"^{topic}$", "--time", "-3")[f"{topic}:0"] == "1"

    out = run(tools, kbroker, "kafka-broker-api-versions.sh").stdout
    support = json.loads((REPO_ROOT / "protocol_specs" / "api_support.json").read_text())
    entries = support["apis"]
    assert out.startswith(f"{kbroker.bootstrap} (id: 1 rack: null) -> (")
    for entry in entries:
        if entry.get("cluster_only"):  # served by brokers of a ZooKeeper cluster only
            assert re.search(rf"\({entry['key']}\): UNSUPPORTED", out), entry
            continue
        key, low, high = entry["key"], entry["min"], entry["max"]
        shown = f"{low} to {high}" if low != high else f"{low}"
        if key > 74:  # newer than the 3.7.1 tool (DescribeTopicPartitions came in 3.8): shown without its name
            assert re.search(rf"UNKNOWN\({key}\): {shown}\b", out), (entry, out)
            continue
        assert re.search(rf"\({key}\): {shown} \[usable: \d+\]", out), (entry, out)
    assert "UNSUPPORTED" in out  # the APIs pykbroker does not have are shown as such, not as an error

    perf = unique("tools-perf")
    out = tools.run("kafka-producer-perf-test.sh", "--topic", perf, "--num-records", "2000", "--record-size", "100",
                    "--throughput", "-1", "--producer-props", f"bootstrap.servers={kbroker.bootstrap}",
                    "acks=all", "linger.ms=5").stdout
    assert re.search(r"^2000 records sent, [\d.]+ records/sec", out, re.M), out
    out = run(tools, kbroker, "kafka-consumer-perf-test.sh", "--topic", perf, "--messages", "2000",
              "--group", unique("perf-group"), "--timeout", "60000").stdout
    header, values = out.strip().splitlines()[-2:]
    result = dict(zip([h.strip() for h in header.split(",")], [v.strip() for v in values.split(",")]))
    assert result["data.consumed.in.nMsg"] == "2000"
    assert float(result["data.consumed.in.MB"]) == pytest.approx(2000 * 100 / 1024 / 1024, abs=0.001)

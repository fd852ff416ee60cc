"""Kafka 3.7.1's kafka-consumer-groups.sh (refkit) beside a consumer-protocol group: ``--list`` and ``--list
--state`` show it next to a classic group (ListGroups v4 lists both kinds, as Kafka 4); ``--describe`` says it
does not exist, as against Kafka 4 (DescribeGroups before v6 answers a consumer group Dead: the 3.7.1 admin
client knows no ConsumerGroupDescribe), while the classic group is described with its members."""

from __future__ import annotations

import time

from confluent_kafka import Consumer

from test_kafka_tools import kbroker, run, table, tools, unique  # noqa: F401 - the fixtures
from test_confluent_kafka import create_topic


def _member(bootstrap: str, group: str, topic: str, **config) -> Consumer:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **config})
    consumer.subscribe([topic])
    deadline = time.monotonic() + 60
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.2)
    assert consumer.assignment(), f"{group}: no assignment"
    return consumer


def test_kafka_consumer_groups_lists_both_kinds(tools, kbroker):
    topic, modern, classic = unique("kinds"), unique("modern"), unique("classic")
    create_topic(kbroker.bootstrap, topic, 2)
    members = [_member(kbroker.bootstrap, modern, topic, **{"group.protocol": "consumer"}),
               _member(kbroker.bootstrap, classic, topic)]
    try:
        listed = run(tools, kbroker, "kafka-consumer-groups.sh", "--list")
        assert {modern, classic} <= set(listed.stdout.split()), listed.stdout
        states = {row["GROUP"]: row["STATE"] for row in
                  table(run(tools, kbroker, "kafka-consumer-groups.sh", "--list", "--state").stdout)}
        assert states[modern] == "Stable" and states[classic] == "Stable", states
        described = run(tools, kbroker, "kafka-consumer-groups.sh", "--describe", "--group", modern, "--members")
        assert f"Consumer group '{modern}' does not exist." in described.stdout + described.stderr, described
        rows = table(run(tools, kbroker, "kafka-consumer-groups.sh", "--describe", "--group", classic,
                         "--members").stdout)
        assert [(row["GROUP"], row["#PARTITIONS"]) for row in rows] == [(classic, "2")], rows
    finally:
        for member in members:
            member.close()

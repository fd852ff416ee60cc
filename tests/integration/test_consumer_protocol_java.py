"""The Java client 3.9 (the reference kit's) with ``group.protocol=consumer``: its AsyncKafkaConsumer speaks
ConsumerGroupHeartbeat v0 (the only version 3.9 knows), subscribes, reads, commits with OffsetCommit v9 at its
member epoch and leaves on close."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from confluent_kafka import Consumer, TopicPartition

from test_confluent_kafka import create_topic
from test_consumer_protocol_confluent import produce
from test_transactions_clients import java_client_or_skip

pytestmark = pytest.mark.timeout(180)

JAVA_SOURCE = Path(__file__).resolve().parent / "java" / "ConsumerProtocolClient.java"


def test_the_java_client_joins_reads_commits_and_leaves(shared_broker, topic_name, tmp_path):
    java, lib = java_client_or_skip()
    create_topic(shared_broker.bootstrap, topic_name, 2)
    values = produce(shared_broker.bootstrap, topic_name, 10, partitions=2)
    group = f"java-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{lib}/*", str(JAVA_SOURCE),
         shared_broker.bootstrap, group, topic_name, str(len(values))],
        capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert done.returncode == 0, f"exited {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
    lines = done.stdout.splitlines()
    assert sorted(line.removeprefix("read ") for line in lines if line.startswith("read ")) == sorted(values)
    assert sorted(line for line in lines if line.startswith("assigned ")) == [
        f"assigned {topic_name}-0", f"assigned {topic_name}-1"]
    (member,) = [line.removeprefix("member ") for line in lines if line.startswith("member ")]
    assert len(member) == 22  # a Kafka Uuid.toString
    reader = Consumer({"bootstrap.servers": shared_broker.bootstrap, "group.id": group, "group.protocol": "consumer"})
    try:
        committed = reader.committed([TopicPartition(topic_name, p) for p in range(2)], timeout=30)
        assert [tp.offset for tp in committed] == [5, 5]
    finally:
        reader.close()

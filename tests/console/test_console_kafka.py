"""The console against Apache Kafka 3.7.1 (KRaft, one node, from ../shared/refkit): it is a client like any
other, so the same pages work there, and Kafka answers DescribeLogDirs, so partition and topic sizes show.
Skips with the reason where the reference kit or Java is absent."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest
from console_helpers import GROUP, REPO_ROOT, TOPIC, fill_broker
from console_helpers import rows, text

sys.path.insert(0, str(REPO_ROOT / "integration" / "bench"))
from brokers import KafkaBroker, default_refkit, kafka_unavailable_reason  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@dataclass
class SmallKafka(KafkaBroker):
    def environment(self, workdir):
        return {**super().environment(workdir), "KAFKA_HEAP_OPTS": "-Xmx512m -Xms256m"}


@pytest.fixture
def kafka():
    reason = kafka_unavailable_reason(default_refkit())
    if reason:
        pytest.skip(reason)
    with SmallKafka(extra_args=["group.initial.rebalance.delay.ms=0", "offsets.topic.num.partitions=3"]) as broker:
        yield broker


def test_pages_against_apache_kafka(kafka, console_server):
    expected = fill_broker(kafka.bootstrap)
    base = console_server(kafka.bootstrap).url

    assert "Brokers 1 " in text(base, "/") and kafka.bootstrap in text(base, "/")
    topic = {row[0]: row for row in rows(base, "/topics")}[TOPIC]
    assert topic[1:4] == ["3", "1", "0"] and topic[5] == "8"
    assert topic[4].endswith(("B", "KiB")) and topic[4] != "—"  # DescribeLogDirs: the size on disk
    partitions = [row for row in rows(base, f"/topics/{TOPIC}") if len(row) == 9]
    assert [row[5] for row in partitions] == [str(end) for end in expected["ends"].values()]
    assert all(row[7] != "—" for row in partitions)
    assert "retention.ms 3600000 DYNAMIC_TOPIC_CONFIG" in text(base, f"/topics/{TOPIC}")
    assert {row[0]: row for row in rows(base, "/groups")}[GROUP][1:5] == ["classic", "EMPTY", "0", "4"]
    assert [row[:5] for row in rows(base, f"/groups/{GROUP}")[1:]] == [[TOPIC, "0", "2", "6", "4"],
                                                                      [TOPIC, "1", "1", "1", "0"]]
    page = text(base, f"/messages?topic={TOPIC}&partition=0&limit=2")
    assert "2 message(s)" in page and "order-5" in page and "order-4" in page and "order-3" not in page


def test_why_groups_cannot_start_against_apache_kafka(console_server):
    """Kafka with offsets.topic.replication.factor=3 on its one node cannot create __consumer_offsets. The
    console's groups page and the CLI's group commands say why from the same helper (pykbroker.ctl.coordination:
    Metadata and DescribeConfigs, nothing created): Kafka's FindCoordinator says only COORDINATOR_NOT_AVAILABLE."""
    from ctl_runner import ctl

    reason = kafka_unavailable_reason(default_refkit())
    if reason:
        pytest.skip(reason)
    cause = ("the offsets topic __consumer_offsets cannot be created yet: 1 live broker, "
             "offsets.topic.replication.factor=3 (start the missing brokers, or lower offsets.topic.replication.factor)")
    with SmallKafka(extra_args=["offsets.topic.replication.factor=3"]) as kafka:
        base = console_server(kafka.bootstrap).url
        assert f"consumer groups cannot start: {cause}" in text(base, "/groups")
        result = ctl(kafka.bootstrap, "group", "describe", "billing", "--timeout", "30")
        assert result.returncode == 1, result
        assert f"Error: cannot find the coordinator of group 'billing': COORDINATOR_NOT_AVAILABLE ({cause})" in \
            result.stderr, result

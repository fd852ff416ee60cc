"""KafkaJS 2.2.4 consumers in groups against pykbroker (KafkaJS speaks JoinGroup v5, SyncGroup v3,
Heartbeat v3, LeaveGroup v3, OffsetCommit v5, OffsetFetch v4). Each member is a node process running
tests/js/group_member.js, which reports its assignment, the messages it reads and its commits as JSON
lines. Two members split a 4-partition topic; the member left after a leave (SIGTERM: disconnect) or a
crash (SIGKILL: only the session timeout tells) gets everything; committed offsets are resumed by a new
member after a broker kill -9; a second group reads everything independently; members joining at the same
moment or during a rebalance never share a partition.

Settings beyond the defaults: sessionTimeout 4 s and heartbeatInterval 300 ms (KafkaJS heartbeats between
fetches, so its fetch wait is shortened too), subscriptions from the beginning."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from kafka import KafkaAdminClient

from test_groups_common import (
    ALL,
    BROKER_CONFIG,
    PARTITIONS,
    TIMEOUT_S,
    MemberLog,
    assert_no_message_read_twice_between_commits,
    one_owner_each,
    split_among,
    wait_until,
)
from test_kafka_python import create_topic, produce

JS_DIR = Path(__file__).resolve().parents[1] / "js"
NODE = shutil.which("node")

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(NODE is None or not (JS_DIR / "node_modules" / "kafkajs").is_dir(),
                       reason="needs node and `npm install --prefix tests/js` (kafkajs 2.2.4)"),
]


def produce_values(bootstrap: str, topic: str, values: list[str]) -> None:
    produce(bootstrap, topic, [{"key": v.encode(), "value": v.encode()} for v in values])


class NodeMember(MemberLog):
    """A KafkaJS group member in a node process; its reports fill this log."""

    def __init__(self, bootstrap: str, group: str, topic: str, name: str) -> None:
        super().__init__(name)
        options = {"brokers": [bootstrap], "groupId": group, "topic": topic, "clientId": name,
                   "sessionTimeout": 4000, "heartbeatInterval": 300}
        self.process = subprocess.Popen([NODE, str(JS_DIR / "group_member.js"), json.dumps(options)],
                                        stdout=subprocess.PIPE, text=True, cwd=JS_DIR)
        self._reader = threading.Thread(target=self._read_reports, daemon=True)
        self._reader.start()

    def _read_reports(self) -> None:
        for line in self.process.stdout:
            report = json.loads(line)
            if "assigned" in report:
                new = set(report["assigned"])
                self.revoked(self.partitions() - new)
                self.assigned(new)
            elif "read" in report:
                self.read(*report["read"])
            elif "committed" in report:
                for partition, offset in report["committed"]:
                    self.committed(partition, offset)
            elif "error" in report:
                self.errors.append(report["error"])

    def stop(self) -> None:
        """A clean close: KafkaJS commits and sends LeaveGroup."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(TIMEOUT_S) == 0, f"{self.name} exited with {self.process.returncode}"
        self._reader.join(TIMEOUT_S)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(TIMEOUT_S)


def stop_all(*members: NodeMember) -> None:
    for member in members:
        member.stop()
    for member in members:
        assert not member.errors, member.errors


@pytest.fixture
def group_broker(broker_factory):
    return broker_factory.make(config=BROKER_CONFIG)


def test_two_members_split_the_topic_and_the_one_left_after_a_leave_gets_everything(group_broker, topic_name):
    create_topic(group_broker.bootstrap, topic_name, PARTITIONS)
    group = f"{topic_name}-g"
    a, b = (NodeMember(group_broker.bootstrap, group, topic_name, name) for name in ("a", "b"))
    try:
        wait_until(lambda: split_among(a, b), "a and b to split the partitions")
        first = [f"first-{i}" for i in range(40)]
        produce_values(group_broker.bootstrap, topic_name, first)
        wait_until(lambda: sorted(a.values() + b.values()) == sorted(first), "the first batch, read once")
        assert {r[0] for r in a.records} <= a.partitions() and {r[0] for r in b.records} <= b.partitions()
        b.stop()  # disconnect(): commits, then LeaveGroup
        wait_until(lambda: a.partitions() == ALL, "a to own every partition")
        second = [f"second-{i}" for i in range(40)]
        produce_values(group_broker.bootstrap, topic_name, second)
        wait_until(lambda: set(second) <= set(a.values()), "a to read the second batch")
        assert sorted(a.values() + b.values()) == sorted(first + second)  # resumed at b's commits
    finally:
        a.kill()
        b.kill()
    assert not a.errors and not b.errors


def test_a_member_that_dies_is_evicted_at_its_session_timeout_and_the_other_gets_everything(group_broker,
                                                                                              topic_name):
    create_topic(group_broker.bootstrap, topic_name, PARTITIONS)
    group = f"{topic_name}-g"
    a = NodeMember(group_broker.bootstrap, group, topic_name, "a")
    victim = None
    try:
        wait_until(lambda: a.partitions() == ALL, "a to own every partition first")
        victim = NodeMember(group_broker.bootstrap, group, topic_name, "victim")
        wait_until(lambda: split_among(a, victim), "the second member to take its share")
        victim.kill()  # no LeaveGroup
        wait_until(lambda: a.partitions() == ALL, "a to get every partition back after the session timeout")
        after = [f"after-{i}" for i in range(20)]
        produce_values(group_broker.bootstrap, topic_name, after)
        wait_until(lambda: set(after) <= set(a.values()), "a to read everything")
        stop_all(a)
    finally:
        a.kill()
        if victim is not None:
            victim.kill()


def test_committed_offsets_are_resumed_by_a_new_member_after_a_broker_kill9(group_broker, topic_name):
    create_topic(group_broker.bootstrap, topic_name, PARTITIONS)
    group = f"{topic_name}-g"
    first = [f"first-{i}" for i in range(30)]
    produce_values(group_broker.bootstrap, topic_name, first)
    reader = NodeMember(group_broker.bootstrap, group, topic_name, "reader")
    try:
        wait_until(lambda: sorted(reader.values()) == sorted(first), "every message read")
        wait_until(reader.all_reads_committed, "the reads to be committed")
        stop_all(reader)
    finally:
        reader.kill()
    group_broker.restart(kill=True)
    second = [f"second-{i}" for i in range(20)]
    produce_values(group_broker.bootstrap, topic_name, second)
    successor = NodeMember(group_broker.bootstrap, group, topic_name, "successor")
    try:
        wait_until(lambda: len(successor.values()) >= len(second), "the successor to read the new messages")
        time.sleep(0.5)  # anything before the committed offsets would arrive with the rest
        assert sorted(successor.values()) == sorted(second)
        stop_all(successor)
    finally:
        successor.kill()


def test_a_second_group_reads_everything_independently(group_broker, topic_name):
    create_topic(group_broker.bootstrap, topic_name, PARTITIONS)
    values = [f"v-{i}" for i in range(40)]
    produce_values(group_broker.bootstrap, topic_name, values)
    one, two = (NodeMember(group_broker.bootstrap, f"{topic_name}-{n}", topic_name, n) for n in ("one", "two"))
    try:
        wait_until(lambda: len(one.values()) == len(two.values()) == len(values), "both groups to read all")
        assert sorted(one.values()) == sorted(two.values()) == sorted(values)
        stop_all(one, two)
    finally:
        one.kill()
        two.kill()


def test_simultaneous_joins_and_a_join_during_a_rebalance_keep_one_owner_per_partition(broker_factory, topic_name):
    # A real initial rebalance delay keeps the first rebalance open long enough to join it.
    broker = broker_factory.make(config={**BROKER_CONFIG, "group.initial.rebalance.delay.ms": 1500})
    create_topic(broker.bootstrap, topic_name, PARTITIONS)
    group = f"{topic_name}-g"
    values = [f"v-{i}" for i in range(200)]
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    members = [NodeMember(broker.bootstrap, group, topic_name, name) for name in "ab"]  # the same moment
    try:
        wait_until(lambda: admin.describe_groups([group])[group]["group_state"] == "PreparingRebalance",
                   "the first rebalance to begin")
        members.append(NodeMember(broker.bootstrap, group, topic_name, "c"))  # joins it
        for i in range(0, len(values), 20):
            produce_values(broker.bootstrap, topic_name, values[i:i + 20])
        wait_until(lambda: one_owner_each(*members), "every partition to have exactly one owner")
        wait_until(lambda: {v for m in members for v in m.values()} == set(values), "every message read")
        assert_no_message_read_twice_between_commits(members)
        stop_all(*members)
    finally:
        admin.close()
        for member in members:
            member.kill()

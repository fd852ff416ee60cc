"""kafka-python consumers in groups against pykbroker: two members split a 4-partition topic, the member
left after a leave or a crash (session timeout) gets everything, committed offsets are resumed by a new
member after a broker kill -9, a second group reads everything independently (and kafka-python's admin
client lists, describes and deletes the groups), and members joining at the same moment or during a
rebalance never share a partition.

Settings beyond the defaults: short session timeouts and heartbeat intervals, and
auto_offset_reset='earliest'. Run as ``python test_groups_kafka_python.py member BOOTSTRAP GROUP TOPIC`` this
file is one group member that prints its assignment (the crash test kills it)."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from kafka import ConsumerRebalanceListener, KafkaAdminClient, KafkaConsumer, OffsetAndMetadata, TopicPartition
from kafka.errors import CommitFailedError, KafkaError

from test_groups_common import (
    ALL,
    BROKER_CONFIG,
    HEARTBEAT_INTERVAL_MS,
    PARTITIONS,
    SESSION_TIMEOUT_MS,
    TIMEOUT_S,
    MemberLog,
    MemberProcess,
    assert_no_message_read_twice_between_commits,
    one_owner_each,
    print_assignment,
    split_among,
    wait_until,
)
from test_kafka_python import create_topic, produce

pytestmark = pytest.mark.timeout(120)

FAST_GROUP = {"session_timeout_ms": SESSION_TIMEOUT_MS, "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
              "auto_offset_reset": "earliest", "metadata_max_age_ms": 1000}


def produce_values(bootstrap: str, topic: str, values: list[str]) -> None:
    produce(bootstrap, topic, [{"key": v.encode(), "value": v.encode()} for v in values])


class _Listener(ConsumerRebalanceListener):
    def __init__(self, log: MemberLog) -> None:
        self.log = log

    def on_partitions_revoked(self, revoked):
        self.log.revoked(tp.partition for tp in revoked)

    def on_partitions_assigned(self, assigned):
        self.log.assigned(tp.partition for tp in assigned)


class Member(MemberLog, threading.Thread):
    """One KafkaConsumer polling in its own thread (kafka-python consumers are not shared between threads)."""

    def __init__(self, bootstrap: str, group: str, topic: str, name: str, *, commit_each: bool = False) -> None:
        threading.Thread.__init__(self, name=name, daemon=True)
        MemberLog.__init__(self, name)
        self.settings = {"bootstrap_servers": bootstrap, "group_id": group, "client_id": name, **FAST_GROUP}
        if commit_each:
            self.settings["enable_auto_commit"] = False
        self.topic = topic
        self.commit_each = commit_each
        self.stopping = threading.Event()

    def run(self) -> None:
        consumer = KafkaConsumer(**self.settings)
        consumer.subscribe([self.topic], listener=_Listener(self))
        try:
            while not self.stopping.is_set():
                for tp, records in consumer.poll(timeout_ms=50).items():
                    for record in records:
                        self.read(tp.partition, record.offset, record.value.decode())
                        if self.commit_each:
                            try:
                                consumer.commit({tp: OffsetAndMetadata(record.offset + 1, None, -1)})
                            except (CommitFailedError, KafkaError):
                                continue  # the group rebalanced: not committed
                            self.committed(tp.partition, record.offset + 1)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)
        finally:
            consumer.close()  # commits (auto-commit) and leaves the group

    def stop(self) -> None:
        self.stopping.set()
        self.join(TIMEOUT_S)
        assert not self.is_alive(), f"{self.name} did not close"


@pytest.fixture
def group_broker(broker_factory):
    return broker_factory.make(config=BROKER_CONFIG)


def stop_all(*members: Member) -> None:
    for member in members:
        if member.is_alive():
            member.stop()
    for member in members:
        assert not member.errors, member.errors


def test_two_members_split_the_topic_and_the_one_left_after_a_leave_gets_everything(group_broker, topic_name):
    create_topic(group_broker.bootstrap, topic_name, PARTITIONS)
    group = f"{topic_name}-g"
    a, b = (Member(group_broker.bootstrap, group, topic_name, name) for name in ("a", "b"))
    a.start()
    b.start()
    try:
        wait_until(lambda: split_among(a, b), "a and b to split the partitions")
        first = [f"first-{i}" for i in range(40)]
        produce_values(group_broker.bootstrap, topic_name, first)
        wait_until(lambda: sorted(a.values() + b.values()) == sorted(first), "the first batch, read once")
        assert {r[0] for r in a.records} <= a.partitions() and {r[0] for r in b.records} <= b.partitions()
        b.stop()  # close(): commits, then LeaveGroup
        wait_until(lambda: a.partitions() == ALL, "a to own every partition")
        second = [f"second-{i}" for i in range(40)]
        produce_values(group_broker.bootstrap, topic_name, second)
        wait_until(lambda: set(second) <= set(a.values()), "a to read the second batch")
        assert sorted(a.values() + b.values()) == sorted(first + second)  # resumed at b's commits
    finally:
        stop_all(a, b)


def test_a_member_that_dies_is_evicted_at_its_session_timeout_and_the_other_gets_everything(group_broker,
                                                                                              topic_name):
    create_topic(group_broker.bootstrap, topic_name, PARTITIONS)
    group = f"{topic_name}-g"
    a = Member(group_broker.bootstrap, group, topic_name, "a")
    a.start()
    victim = None
    try:
        wait_until(lambda: a.partitions() == ALL, "a to own every partition first")
        victim = MemberProcess(__file__, group_broker.bootstrap, group, topic_name)
        wait_until(lambda: victim.partitions() and a.partitions() and a.partitions().isdisjoint(victim.partitions())
                   and a.partitions() | victim.partitions() == ALL, "the second member to take its share")
        victim.kill()
        wait_until(lambda: a.partitions() == ALL, "a to get every partition back after the session timeout")
        after = [f"after-{i}" for i in range(20)]
        produce_values(group_broker.bootstrap, topic_name, after)
        wait_until(lambda: set(after) <= set(a.values()), "a to read everything")
    finally:
        if victim is not None:
            victim.kill()
        stop_all(a)


def test_committed_offsets_are_resumed_by_a_new_member_after_a_broker_kill9(group_broker, topic_name):
    create_topic(group_broker.bootstrap, topic_name, PARTITIONS)
    group = f"{topic_name}-g"
    first = [f"first-{i}" for i in range(30)]
    produce_values(group_broker.bootstrap, topic_name, first)
    reader = Member(group_broker.bootstrap, group, topic_name, "reader", commit_each=True)
    reader.start()
    wait_until(lambda: len(reader.commits) == len(first), "every message read and committed")
    stop_all(reader)
    group_broker.restart(kill=True)
    second = [f"second-{i}" for i in range(20)]
    produce_values(group_broker.bootstrap, topic_name, second)
    successor = Member(group_broker.bootstrap, group, topic_name, "successor")
    successor.start()
    try:
        wait_until(lambda: len(successor.values()) >= len(second), "the successor to read the new messages")
        time.sleep(0.5)  # anything before the committed offsets would arrive with the rest
        assert sorted(successor.values()) == sorted(second)
    finally:
        stop_all(successor)


def test_a_second_group_reads_everything_independently(group_broker, topic_name):
    create_topic(group_broker.bootstrap, topic_name, PARTITIONS)
    values = [f"v-{i}" for i in range(40)]
    produce_values(group_broker.bootstrap, topic_name, values)
    groups = (f"{topic_name}-one", f"{topic_name}-two")
    one, two = (Member(group_broker.bootstrap, group, topic_name, group[-3:]) for group in groups)
    one.start()
    two.start()
    admin = KafkaAdminClient(bootstrap_servers=group_broker.bootstrap)
    try:
        wait_until(lambda: len(one.values()) == len(two.values()) == len(values), "both groups to read all")
        assert sorted(one.values()) == sorted(two.values()) == sorted(values)
        listed = {g["group_id"] for g in admin.list_groups()}
        assert set(groups) <= listed
        described = admin.describe_groups([groups[0]])[groups[0]]
        assert described["group_state"] == "Stable" and len(described["members"]) == 1
        stop_all(one, two)
        assert admin.delete_groups(list(groups)) == {group: "OK" for group in groups}
        consumer = KafkaConsumer(bootstrap_servers=group_broker.bootstrap, group_id=groups[0])
        try:  # the group's offsets went with it
            assert consumer.committed(TopicPartition(topic_name, 0)) is None
        finally:
            consumer.close()
    finally:
        stop_all(one, two)
        admin.close()


def test_simultaneous_joins_and_a_join_during_a_rebalance_keep_one_owner_per_partition(broker_factory, topic_name):
    # A real initial rebalance delay keeps the first rebalance open long enough to join it for sure.
    broker = broker_factory.make(config={**BROKER_CONFIG, "group.initial.rebalance.delay.ms": 1500})
    create_topic(broker.bootstrap, topic_name, PARTITIONS)
    group = f"{topic_name}-g"
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    members = [Member(broker.bootstrap, group, topic_name, name, commit_each=True) for name in "abc"]
    values = [f"v-{i}" for i in range(200)]
    try:
        members[0].start()
        members[1].start()  # two members at the same moment
        wait_until(lambda: admin.describe_groups([group])[group]["group_state"] == "PreparingRebalance",
                   "the first rebalance to begin")
        members[2].start()  # joins the rebalance in progress
        for i in range(0, len(values), 20):
            produce_values(broker.bootstrap, topic_name, values[i:i + 20])
        wait_until(lambda: one_owner_each(*members), "every partition to have exactly one owner")
        wait_until(lambda: {v for m in members for v in m.values()} == set(values), "every message to be read")
        assert_no_message_read_twice_between_commits(members)
    finally:
        admin.close()
        stop_all(*members)


def _member_main(bootstrap: str, group: str, topic: str) -> None:
    """A member that reports each change of its assignment on stdout until it is killed."""
    owned: set[int] = set()

    class Report(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            owned.difference_update(tp.partition for tp in revoked)
            print_assignment(owned)

        def on_partitions_assigned(self, assigned):
            owned.update(tp.partition for tp in assigned)
            print_assignment(owned)

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, **FAST_GROUP)
    consumer.subscribe([topic], listener=Report())
    while True:
        consumer.poll(timeout_ms=100)


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "member":
    _member_main(*sys.argv[2:])

"""confluent-kafka (librdkafka) consumers in groups against pykbroker: members share a 4-partition topic,
the survivor of a leave or of a crash (session timeout) takes every partition, committed offsets are
resumed after a broker kill -9, two groups read independently, cooperative-sticky moves only what it must,
and members joining at the same moment or during a rebalance never share a partition.

Settings beyond the defaults: short session timeouts and heartbeat intervals so the test does not wait
45 s for a dead member (the broker allows them through group.min.session.timeout.ms), and
auto.offset.reset=earliest so messages produced before a member's first assignment are read.

Run as a script (``python test_groups_confluent.py member BOOTSTRAP GROUP TOPIC``) this file is one group
member that prints its assignment as JSON lines: the tests kill it with SIGKILL to make a member die.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from test_confluent_kafka import create_topic
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

pytestmark = pytest.mark.timeout(120)

FAST_GROUP = {"session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
              "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 1000}


def produce_values(bootstrap: str, topic: str, values: list[str]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, key=value.encode(), value=value.encode())
    assert producer.flush(TIMEOUT_S) == 0


class Member(MemberLog, threading.Thread):
    """One group member polling in its own thread, recording what it owns, reads and commits."""

    def __init__(self, bootstrap: str, group: str, topic: str, name: str, *, commit_each: bool = False,
                 **config) -> None:
        threading.Thread.__init__(self, name=name, daemon=True)
        MemberLog.__init__(self, name)
        settings = {"bootstrap.servers": bootstrap, "group.id": group, "client.id": name, **FAST_GROUP, **config}
        if commit_each:
            settings["enable.auto.commit"] = False
        self.consumer = Consumer(settings)
        self.topic = topic
        self.commit_each = commit_each
        self.stopping = threading.Event()

    def run(self) -> None:
        self.consumer.subscribe(
            [self.topic], on_assign=lambda c, partitions: self.assigned(p.partition for p in partitions),
            on_revoke=lambda c, partitions: self.revoked(p.partition for p in partitions),
            on_lost=lambda c, partitions: self.revoked(p.partition for p in partitions))
        try:
            while not self.stopping.is_set():
                msg = self.consumer.poll(0.05)
                if msg is None:
                    continue
                if msg.error() is not None:
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        self.errors.append(msg.error())
                    continue
                self.read(msg.partition(), msg.offset(), msg.value().decode())
                if self.commit_each:
                    try:
                        self.consumer.commit(message=msg, asynchronous=False)
                    except KafkaException:
                        continue  # e.g. REBALANCE_IN_PROGRESS: the message was not committed
                    self.committed(msg.partition(), msg.offset() + 1)
        finally:
            self.consumer.close()  # leaves the group (LeaveGroup), committing first with auto-commit

    def stop(self) -> None:
        self.stopping.set()
        self.join(TIMEOUT_S)
        assert not self.is_alive(), f"{self.name} did not close"


@pytest.fixture
def group_broker(broker_factory):
    return broker_factory.make(config=BROKER_CONFIG)


def start(*members: Member) -> None:
    for member in members:
        member.start()


# -- two members, a leave, a crash -------------------------------------------------------------------------


def test_two_members_split_the_topic_and_the_one_left_after_a_leave_gets_everything(group_broker, topic_name):
    create_topic(group_broker.bootstrap, topic_name, PARTITIONS)
    group = f"{topic_name}-g"
    a, b = (Member(group_broker.bootstrap, group, topic_name, name) for name in ("a", "b"))
    start(a, b)
    try:
        wait_until(lambda: split_among(a, b), "a and b to split the partitions")
        assert a.partitions().isdisjoint(b.partitions())
        first = [f"first-{i}" for i in range(40)]
        produce_values(group_broker.bootstrap, topic_name, first)
        wait_until(lambda: len(a.values()) + len(b.values()) == len(first), "the first batch")
        assert sorted(a.values() + b.values()) == sorted(first)
        assert {r[0] for r in a.records} <= a.partitions() and {r[0] for r in b.records} <= b.partitions()
        b.stop()  # close(): commits, then LeaveGroup
        wait_until(lambda: a.partitions() == ALL, "a to own every partition")
        second = [f"second-{i}" for i in range(40)]
        produce_values(group_broker.bootstrap, topic_name, second)
        wait_until(lambda: set(second) <= set(a.values()), "a to read the second batch")
        # b committed what it read when it closed: a resumed there and read nothing twice.
        assert sorted(a.values() + b.values()) == sorted(first + second)
    finally:
        for member in (a, b):
            if member.is_alive():
                member.stop()
    assert not a.errors and not b.errors


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
        victim.kill()  # no LeaveGroup: only the session timeout can tell
        wait_until(lambda: a.partitions() == ALL, "a to get every partition back after the session timeout")
        produce_values(group_broker.bootstrap, topic_name, [f"after-{i}" for i in range(20)])
        wait_until(lambda: {f"after-{i}" for i in range(20)} <= set(a.values()), "a to read everything")
    finally:
        if victim is not None:
            victim.kill()
        a.stop()


# -- offsets across a broker crash; independent groups ------------------------------------------------------


def test_committed_offsets_are_resumed_by_a_new_member_after_a_broker_kill9(group_broker, topic_name):
    create_topic(group_broker.bootstrap, topic_name, PARTITIONS)
    group = f"{topic_name}-g"
    first = [f"first-{i}" for i in range(30)]
    produce_values(group_broker.bootstrap, topic_name, first)
    reader = Member(group_broker.bootstrap, group, topic_name, "reader", commit_each=True)
    reader.start()
    wait_until(lambda: len(reader.commits) == len(first), "every message read and committed")
    reader.stop()
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
        successor.stop()


def test_a_second_group_reads_everything_independently(group_broker, topic_name):
    create_topic(group_broker.bootstrap, topic_name, PARTITIONS)
    values = [f"v-{i}" for i in range(40)]
    produce_values(group_broker.bootstrap, topic_name, values)
    one = Member(group_broker.bootstrap, f"{topic_name}-one", topic_name, "one")
    two = Member(group_broker.bootstrap, f"{topic_name}-two", topic_name, "two")
    start(one, two)
    try:
        wait_until(lambda: len(one.values()) == len(two.values()) == len(values), "both groups to read all")
        assert sorted(one.values()) == sorted(two.values()) == sorted(values)
        admin = AdminClient({"bootstrap.servers": group_broker.bootstrap})
        listed = admin.list_consumer_groups().result(timeout=TIMEOUT_S)
        assert {f"{topic_name}-one", f"{topic_name}-two"} <= {g.group_id for g in listed.valid}
        described = admin.describe_consumer_groups([f"{topic_name}-one"])[f"{topic_name}-one"].result(TIMEOUT_S)
        assert described.state.name == "STABLE" and len(described.members) == 1
        assert {tp.partition for tp in described.members[0].assignment.topic_partitions} == ALL
    finally:
        one.stop()
        two.stop()


# -- cooperative-sticky ----------------------------------------------------------------------------------------


def test_cooperative_sticky_moves_only_the_partitions_that_change_owner(group_broker, topic_name):
    create_topic(group_broker.bootstrap, topic_name, PARTITIONS)
    group = f"{topic_name}-g"
    sticky = {"partition.assignment.strategy": "cooperative-sticky"}
    a = Member(group_broker.bootstrap, group, topic_name, "a", **sticky)
    a.start()
    b = Member(group_broker.bootstrap, group, topic_name, "b", **sticky)
    try:
        wait_until(lambda: a.partitions() == ALL, "a to own every partition")
        kept_before = a.partitions()
        b.start()
        wait_until(lambda: split_among(a, b), "the incremental rebalance")
        # a gave up only what b took: one incremental revocation of two partitions, the rest kept throughout.
        assert a.revocations == [b.partitions()] and len(b.partitions()) == 2
        assert a.partitions() <= kept_before
        values = [f"v-{i}" for i in range(40)]
        produce_values(group_broker.bootstrap, topic_name, values)
        wait_until(lambda: len(a.values()) + len(b.values()) == len(values), "the messages")
        assert sorted(a.values() + b.values()) == sorted(values)
        b.stop()
        wait_until(lambda: a.partitions() == ALL, "a to take b's partitions back")
    finally:
        for member in (a, b):
            if member.is_alive():
                member.stop()
    assert not a.errors and not b.errors


# -- concurrency: simultaneous joins, a join during a rebalance -----------------------------------------------


def group_state(admin: AdminClient, group: str) -> str:
    return admin.describe_consumer_groups([group])[group].result(TIMEOUT_S).state.name


def test_simultaneous_joins_and_joins_during_a_rebalance_keep_one_owner_per_partition(broker_factory, topic_name):
    # A real initial rebalance delay keeps the first rebalance open long enough to join it for sure.
    broker = broker_factory.make(config={**BROKER_CONFIG, "group.initial.rebalance.delay.ms": 1500})
    create_topic(broker.bootstrap, topic_name, PARTITIONS)
    group = f"{topic_name}-g"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    members = [Member(broker.bootstrap, group, topic_name, name, commit_each=True) for name in "abcde"]
    values = [f"v-{i}" for i in range(400)]
    producer = threading.Thread(target=lambda: [produce_values(broker.bootstrap, topic_name, values[i:i + 20])
                                                or time.sleep(0.05) for i in range(0, len(values), 20)])
    rebalancing = ("PREPARING_REBALANCING", "COMPLETING_REBALANCING")
    try:
        producer.start()
        start(members[0], members[1])  # two members at the same moment
        wait_until(lambda: group_state(admin, group) in rebalancing, "the first rebalance to begin")
        members[2].start()  # joins the rebalance in progress
        wait_until(lambda: one_owner_each(*members[:3]), "a, b and c to settle")
        members[3].start()
        wait_until(lambda: group_state(admin, group) in rebalancing, "d's rebalance to begin")
        members[4].start()  # joins while d's rebalance is in progress
        producer.join(TIMEOUT_S)
        wait_until(lambda: one_owner_each(*members), "every partition to have exactly one owner")
        read = lambda: {v for m in members for v in m.values()}  # noqa: E731
        wait_until(lambda: read() == set(values), "every message to be read")
        assert_no_message_read_twice_between_commits(members)
    finally:
        for member in members:
            if member.is_alive():
                member.stop()
    for member in members:
        assert not member.errors, member.errors


# -- the member process ------------------------------------------------------------------------------------------


def _member_main(bootstrap: str, group: str, topic: str) -> None:
    """A member that reports each change of its assignment on stdout until it is killed."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **FAST_GROUP})
    owned: set[int] = set()

    def on_assign(consumer, partitions):
        owned.update(p.partition for p in partitions)
        print_assignment(owned)

    def on_revoke(consumer, partitions):
        owned.difference_update(p.partition for p in partitions)
        print_assignment(owned)

    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    while True:
        consumer.poll(0.1)


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "member":
    _member_main(*sys.argv[2:])

"""confluent-kafka (librdkafka) consumers in groups against pykbroker: ``CONFLUENT``, the client that
test_groups_scenarios.py runs the group scenarios with (its admin client lists and describes the groups
there), and cooperative-sticky rebalancing, which only librdkafka of these clients offers.

Settings beyond the defaults: short session timeouts and heartbeat intervals so the test does not wait
45 s for a dead member (the broker allows them through group.min.session.timeout.ms), and
auto.offset.reset=earliest so messages produced before a member's first assignment are read.

Run as ``python test_groups_confluent.py member BOOTSTRAP GROUP TOPIC`` this file is one group member that
prints its assignment: the crash scenario kills it with SIGKILL.
"""

from __future__ import annotations

import sys
import threading

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from test_confluent_kafka import create_topic
from test_groups_common import (
    ALL,
    BROKER_CONFIG,
    HEARTBEAT_INTERVAL_MS,
    SESSION_TIMEOUT_MS,
    TIMEOUT_S,
    GroupClient,
    MemberLog,
    MemberProcess,
    print_assignment,
    split_among,
    stop_all,
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


def start_member(bootstrap: str, group: str, topic: str, name: str, commit_each: bool = False, **config) -> Member:
    member = Member(bootstrap, group, topic, name, commit_each=commit_each, **config)
    member.start()
    return member


def admin_view(broker, topic: str, groups: tuple[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    listed = admin.list_consumer_groups().result(timeout=TIMEOUT_S)
    assert set(groups) <= {g.group_id for g in listed.valid}
    described = admin.describe_consumer_groups([groups[0]])[groups[0]].result(TIMEOUT_S)
    assert described.state.name == "STABLE" and len(described.members) == 1
    assert {tp.partition for tp in described.members[0].assignment.topic_partitions} == ALL


CONFLUENT = GroupClient(create_topic=create_topic, produce_values=produce_values, member=start_member,
                        victim=lambda bootstrap, group, topic: MemberProcess(__file__, bootstrap, group, topic),
                        admin_view=admin_view)


@pytest.fixture
def group_broker(broker_factory):
    return broker_factory.make(config=BROKER_CONFIG)


# -- cooperative-sticky ----------------------------------------------------------------------------------------


def test_cooperative_sticky_moves_only_the_partitions_that_change_owner(group_broker, topic_name):
    create_topic(group_broker.bootstrap, topic_name)
    group = f"{topic_name}-g"
    sticky = {"partition.assignment.strategy": "cooperative-sticky"}
    a = start_member(group_broker.bootstrap, group, topic_name, "a", **sticky)
    b = None
    try:
        wait_until(lambda: a.partitions() == ALL, "a to own every partition")
        kept_before = a.partitions()
        b = start_member(group_broker.bootstrap, group, topic_name, "b", **sticky)
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
        stop_all(*(m for m in (a, b) if m is not None))


# -- concurrency: simultaneous joins, a join during a rebalance -----------------------------------------------


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

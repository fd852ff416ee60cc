"""confluent-kafka 2.16 consumers with ``group.protocol=consumer`` (KIP-848) against one pykbroker broker:
joining, the server-side assignment split between members, incremental assign/revoke callbacks, commits at
the member epoch, leaving, subscriptions by regex (a topic created later joins the assignment), static
members, and ConsumerGroupDescribe through the admin client.

Broker settings beyond the defaults: short consumer-group heartbeat intervals and session timeouts (with
their minimums lowered) so the group reacts in fractions of a second instead of Kafka's 5 s / 45 s.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from broker_process import wait_until
from test_confluent_kafka import create_topic

pytestmark = pytest.mark.timeout(180)

TIMEOUT_S = 40
PARTITIONS = 4
BROKER_CONFIG = {
    "group.consumer.heartbeat.interval.ms": 300,
    "group.consumer.min.heartbeat.interval.ms": 100,
    "group.consumer.session.timeout.ms": 4000,
    "group.consumer.min.session.timeout.ms": 1000,
}


@pytest.fixture(scope="module")
def consumer_broker(tmp_path_factory):
    from broker_process import BrokerProcess

    broker = BrokerProcess(tmp_path_factory.mktemp("consumer-protocol"), config=BROKER_CONFIG)
    with broker:
        yield broker


def produce(bootstrap: str, topic: str, count: int, partitions: int = PARTITIONS) -> list[str]:
    producer = Producer({"bootstrap.servers": bootstrap})
    values = [f"{topic}-{i}-{uuid.uuid4().hex[:4]}" for i in range(count)]
    for i, value in enumerate(values):
        producer.produce(topic, value=value.encode(), partition=i % partitions)
    assert producer.flush(TIMEOUT_S) == 0
    return values


class Member(threading.Thread):
    """A consumer of the new protocol polling in its own thread; records what it owns (from the incremental
    callbacks), what it read and the errors it saw."""

    def __init__(self, bootstrap: str, group: str, subscription: list[str], name: str, **config) -> None:
        super().__init__(name=name, daemon=True)
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": name,
                                  "group.protocol": "consumer", "auto.offset.reset": "earliest",
                                  "enable.auto.commit": False, "topic.metadata.refresh.interval.ms": 1000,
                                  "on_commit": self.on_commit, **config})
        self.subscription = subscription
        self.owned: set[tuple[str, int]] = set()
        self.assigned_events: list[set] = []
        self.revoked_events: list[set] = []
        self.read: list[str] = []
        self.errors: list = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.close_on_stop = True

    def on_commit(self, error, partitions) -> None:
        failed = [p.error for p in partitions if p.error is not None]
        if error is not None and error.code() != KafkaError._NO_OFFSET:
            self.errors.append(error)
        self.errors.extend(failed)

    def on_assign(self, consumer, partitions) -> None:
        with self.lock:
            added = {(p.topic, p.partition) for p in partitions}
            assert not (added & self.owned), "assigned a partition it already owns"
            self.owned |= added
            self.assigned_events.append(added)

    def on_revoke(self, consumer, partitions) -> None:
        with self.lock:
            removed = {(p.topic, p.partition) for p in partitions}
            self.owned -= removed
            self.revoked_events.append(removed)

    def run(self) -> None:
        self.consumer.subscribe(self.subscription, on_assign=self.on_assign, on_revoke=self.on_revoke,
                                on_lost=self.on_revoke)
        try:
            while not self.stopping.is_set():
                message = self.consumer.poll(0.1)
                if message is None:
                    continue
                if message.error():
                    self.errors.append(message.error())
                    continue
                with self.lock:
                    self.read.append(message.value().decode())
                self.consumer.commit(message=message, asynchronous=True)
        except KafkaException as exc:
            self.errors.append(exc.args[0])
        finally:
            if self.close_on_stop:
                if self.read:  # what the asynchronous commits may not have sent yet
                    try:
                        self.consumer.commit(asynchronous=False)
                    except KafkaException as exc:
                        if exc.args[0].code() != KafkaError._NO_OFFSET:
                            self.errors.append(exc.args[0])
                self.consumer.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(TIMEOUT_S)
        assert not self.is_alive()

    def owns(self) -> set[tuple[str, int]]:
        with self.lock:
            return set(self.owned)


def split_evenly(members: list[Member], topic: str, partitions: int = PARTITIONS) -> bool:
    owned = [m.owns() for m in members]
    every = set().union(*owned)
    return (every == {(topic, p) for p in range(partitions)} and sum(map(len, owned)) == partitions
            and max(map(len, owned)) - min(map(len, owned)) <= 1)


def test_two_members_split_a_topic_commit_and_hand_over_on_leave(consumer_broker, topic_name):
    bootstrap = consumer_broker.bootstrap
    create_topic(bootstrap, topic_name, PARTITIONS)
    values = produce(bootstrap, topic_name, 40)
    group = f"g-{uuid.uuid4().hex[:8]}"
    first = Member(bootstrap, group, [topic_name], "first")
    first.start()
    wait_until(lambda: len(first.owns()) == PARTITIONS, "the first member owns every partition", TIMEOUT_S)
    second = Member(bootstrap, group, [topic_name], "second")
    second.start()
    try:
        wait_until(lambda: split_evenly([first, second], topic_name), "two members split the topic", TIMEOUT_S)
        # The first member gave partitions up through on_revoke (incremental: only the ones that moved).
        assert first.revoked_events and all(len(event) < PARTITIONS for event in first.revoked_events)
        wait_until(lambda: len(first.read) + len(second.read) >= len(values), "every value read", TIMEOUT_S)
        more = produce(bootstrap, topic_name, 8)
        second.stop()  # leaves the group (epoch -1): the first takes everything back
        wait_until(lambda: len(first.owns()) == PARTITIONS, "the first member owns everything again", TIMEOUT_S)
        wait_until(lambda: set(first.read) | set(second.read) >= set(values) | set(more), "everything read",
                   TIMEOUT_S)
        assert first.errors == [] and second.errors == []
    finally:
        first.stop()
        if second.is_alive():
            second.stop()
    # The commits were accepted at the member epoch: a new member of the group resumes at their end.
    resumed = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer"})
    try:
        committed = resumed.committed([TopicPartition(topic_name, p) for p in range(PARTITIONS)], timeout=TIMEOUT_S)
        assert sorted((tp.partition, tp.offset) for tp in committed) == [(p, 12) for p in range(PARTITIONS)]
    finally:
        resumed.close()


def test_a_regex_subscription_picks_up_a_topic_created_later(consumer_broker, topic_name):
    bootstrap = consumer_broker.bootstrap
    create_topic(bootstrap, f"{topic_name}-a", 2)
    member = Member(bootstrap, f"g-{uuid.uuid4().hex[:8]}", [f"^{topic_name}-.*"], "regex")
    member.start()
    try:
        wait_until(lambda: member.owns() == {(f"{topic_name}-a", 0), (f"{topic_name}-a", 1)},
                   "the regex member owns the first topic", TIMEOUT_S)
        create_topic(bootstrap, f"{topic_name}-b", 3)
        wait_until(lambda: {tp for tp in member.owns() if tp[0] == f"{topic_name}-b"} == {
            (f"{topic_name}-b", p) for p in range(3)}, "the topic created later is assigned", TIMEOUT_S)
        values = produce(bootstrap, f"{topic_name}-b", 6, partitions=3)
        wait_until(lambda: set(values) <= set(member.read), "its values read", TIMEOUT_S)
    finally:
        member.stop()


def test_a_restarted_static_member_gets_its_partitions_back(consumer_broker, topic_name):
    bootstrap = consumer_broker.bootstrap
    create_topic(bootstrap, topic_name, PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    a = Member(bootstrap, group, [topic_name], "static-a", **{"group.instance.id": "a"})
    b = Member(bootstrap, group, [topic_name], "static-b", **{"group.instance.id": "b"})
    a.start()
    b.start()
    wait_until(lambda: split_evenly([a, b], topic_name), "two static members split the topic", TIMEOUT_S)
    before = a.owns()
    a.stop()  # a static member's close leaves with epoch -2: its partitions stay reserved
    again = Member(bootstrap, group, [topic_name], "static-a2", **{"group.instance.id": "a"})
    again.start()
    try:
        wait_until(lambda: again.owns() == before, "the restarted static member owns the same partitions", TIMEOUT_S)
        assert b.owns() == {(topic_name, p) for p in range(PARTITIONS)} - before
    finally:
        again.stop()
        b.stop()


def test_the_admin_client_describes_a_consumer_group(consumer_broker, topic_name):
    bootstrap = consumer_broker.bootstrap
    create_topic(bootstrap, topic_name, PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    member = Member(bootstrap, group, [topic_name], "described")
    member.start()
    try:
        wait_until(lambda: len(member.owns()) == PARTITIONS, "the member owns every partition", TIMEOUT_S)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        description = admin.describe_consumer_groups([group])[group].result(timeout=TIMEOUT_S)
        assert description.state == ConsumerGroupState.STABLE
        assert description.partition_assignor == "uniform"
        (described,) = description.members
        assert described.client_id == "described"
        assert {(tp.topic, tp.partition) for tp in described.assignment.topic_partitions} == member.owns()
    finally:
        member.stop()


def test_an_unknown_assignor_is_refused(consumer_broker, topic_name):
    bootstrap = consumer_broker.bootstrap
    create_topic(bootstrap, topic_name, 1)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "group.protocol": "consumer", "group.remote.assignor": "sticky"})
    try:
        consumer.subscribe([topic_name])
        errors = []

        def saw_error() -> bool:
            try:
                message = consumer.poll(0.2)
            except KafkaException as exc:
                errors.append(exc.args[0])
                return True
            if message is not None and message.error():
                errors.append(message.error())
                return True
            return False

        wait_until(saw_error, "the consumer is told its assignor is unsupported", TIMEOUT_S)
        # librdkafka makes UNSUPPORTED_ASSIGNOR (112) of its heartbeat a fatal error of the consumer.
        assert errors[0].code() == KafkaError._FATAL
        assert "ConsumerGroupHeartbeat fatal error" in errors[0].str() and "assignor" in errors[0].str()
    finally:
        consumer.close()


def test_a_broker_restart_resumes_the_group_without_a_rebalance(broker_factory, topic_name):
    broker = broker_factory(BROKER_CONFIG)
    bootstrap = broker.bootstrap
    create_topic(bootstrap, topic_name, PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    a = Member(bootstrap, group, [topic_name], "resume-a")
    b = Member(bootstrap, group, [topic_name], "resume-b")
    a.start()
    b.start()
    try:
        wait_until(lambda: split_evenly([a, b], topic_name), "two members split the topic", TIMEOUT_S)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        before = admin.describe_consumer_groups([group])[group].result(timeout=TIMEOUT_S)
        owned = (a.owns(), b.owns())
        events = (len(a.revoked_events), len(b.revoked_events))
        broker.restart()  # the group's records are replayed from __consumer_offsets
        values = produce(bootstrap, topic_name, 8)
        wait_until(lambda: set(values) <= set(a.read) | set(b.read), "the members read on after the restart",
                   TIMEOUT_S)
        # A new admin client: librdkafka 2.16's, when its only broker went away, re-bootstraps and decommissions
        # the broker it had cached as the group's coordinator, and its next DescribeConsumerGroups waits on that
        # dead broker handle until it times out (confluentinc/librdkafka#5511, seen here once in ~30 restarts; the
        # call never reaches the broker). The group's state, not that client bug, is under test.
        admin = AdminClient({"bootstrap.servers": bootstrap})
        after = admin.describe_consumer_groups([group])[group].result(timeout=TIMEOUT_S)
        assert sorted(m.member_id for m in after.members) == sorted(m.member_id for m in before.members)
        assert (a.owns(), b.owns()) == owned
        assert (len(a.revoked_events), len(b.revoked_events)) == events  # nothing was revoked or lost
    finally:
        a.stop()
        b.stop()

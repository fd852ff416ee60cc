"""Online migration between the classic and the consumer group protocol (KIP-848, as Kafka 4 runs it), with
real clients: a running classic group of confluent-kafka consumers (cooperative-sticky) receives a
``group.protocol=consumer`` member; the group becomes a consumer group, the classic members go on with their
JoinGroup / SyncGroup / Heartbeat and share the partitions with the new member, no partition is owned by two
members at once (from the times the clients' callbacks report), every record is read and committed; when the
new member leaves, the group is a classic group again. A broker restart in the middle resumes the mixed group.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, ConsumerGroupType, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from kio.schema.consumer_group_describe.v1 import request as describe_v1

from broker_process import send_request, wait_until
from test_confluent_kafka import create_topic
from test_consumer_protocol_confluent import BROKER_CONFIG, PARTITIONS, TIMEOUT_S, Member, produce, split_evenly

pytestmark = pytest.mark.timeout(240)

CONFIG = {**BROKER_CONFIG, "group.initial.rebalance.delay.ms": 0}
CLASSIC = {"group.protocol": "classic", "partition.assignment.strategy": "cooperative-sticky",
           "session.timeout.ms": 6000, "heartbeat.interval.ms": 300}


class Timeline:
    """When each member's callbacks gave and took partitions (monotonic clock, at the callback's entry)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, str, frozenset]] = []
        self.lock = threading.Lock()

    def watch(self, member: Member) -> Member:
        assign, revoke = member.on_assign, member.on_revoke

        def on_assign(consumer, partitions):
            with self.lock:
                self.events.append((time.monotonic(), member.name, "assign",
                                    frozenset((p.topic, p.partition) for p in partitions)))
            assign(consumer, partitions)

        def on_revoke(consumer, partitions):
            with self.lock:
                self.events.append((time.monotonic(), member.name, "revoke",
                                    frozenset((p.topic, p.partition) for p in partitions)))
            revoke(consumer, partitions)

        member.on_assign, member.on_revoke = on_assign, on_revoke
        return member

    def double_owners(self) -> list:
        """Every moment a partition was given to a member while another still owned it."""
        owner: dict[tuple[str, int], str] = {}
        clashes = []
        with self.lock:
            events = sorted(self.events)
        for at, name, kind, partitions in events:
            for tp in partitions:
                if kind == "assign":
                    if owner.get(tp) not in (None, name):
                        clashes.append((at, tp, owner[tp], name))
                    owner[tp] = name
                elif owner.get(tp) == name:
                    del owner[tp]
        return clashes


def unexpected(member: Member) -> list:
    """The errors a member saw besides asynchronous commits refused for a generation a rebalance just ended
    (classic consumers see those with every broker; later commits carry the offsets)."""
    return [e for e in member.errors if e.code() not in (KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS)]


def group_type(admin: AdminClient, group: str):
    return admin.describe_consumer_groups([group])[group].result(timeout=TIMEOUT_S).type


def test_a_running_classic_group_takes_a_consumer_member_and_goes_back_when_it_leaves(broker_factory, topic_name):
    broker = broker_factory(CONFIG)
    bootstrap = broker.bootstrap
    create_topic(bootstrap, topic_name, PARTITIONS)
    values = produce(bootstrap, topic_name, 40)
    group = f"g-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    timeline = Timeline()
    c1 = timeline.watch(Member(bootstrap, group, [topic_name], "classic-1", **CLASSIC))
    c2 = timeline.watch(Member(bootstrap, group, [topic_name], "classic-2", **CLASSIC))
    new = timeline.watch(Member(bootstrap, group, [topic_name], "consumer-1"))
    c1.start()
    c2.start()
    try:
        wait_until(lambda: split_evenly([c1, c2], topic_name), "two classic members split the topic", TIMEOUT_S)
        assert group_type(admin, group) == ConsumerGroupType.CLASSIC
        new.start()
        wait_until(lambda: split_evenly([c1, c2, new], topic_name) and all(m.owns() for m in (c1, c2, new)),
                   "the classic members and the consumer member share the topic", TIMEOUT_S)
        assert group_type(admin, group) == ConsumerGroupType.CONSUMER
        more = produce(bootstrap, topic_name, 20)
        wait_until(lambda: set(values) | set(more) <= set(c1.read) | set(c2.read) | set(new.read),
                   "every record read by the mixed group", TIMEOUT_S)
        new.stop()  # leaves (epoch -1): the last consumer-protocol member; the group is classic again
        wait_until(lambda: split_evenly([c1, c2], topic_name), "the classic members take everything back", TIMEOUT_S)
        wait_until(lambda: group_type(admin, group) == ConsumerGroupType.CLASSIC, "the group is classic again",
                   TIMEOUT_S)
        last = produce(bootstrap, topic_name, 20)
        wait_until(lambda: set(last) <= set(c1.read) | set(c2.read), "the classic group reads on", TIMEOUT_S)
        assert timeline.double_owners() == []
        assert unexpected(c1) == [] and unexpected(c2) == [] and new.errors == []
    finally:
        for member in (c1, c2, new):
            if member.is_alive():
                member.stop()
    # The commits were accepted (classic members commit with their member epoch as generation).
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        offsets = reader.committed([TopicPartition(topic_name, p) for p in range(PARTITIONS)], timeout=TIMEOUT_S)
        assert sorted((tp.partition, tp.offset) for tp in offsets) == [(p, 20) for p in range(PARTITIONS)]
    finally:
        reader.close()


def test_a_broker_restart_resumes_a_mixed_group(broker_factory, topic_name):
    broker = broker_factory(CONFIG)
    bootstrap = broker.bootstrap
    create_topic(bootstrap, topic_name, PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    timeline = Timeline()
    classic = timeline.watch(Member(bootstrap, group, [topic_name], "classic-1", **CLASSIC))
    new = timeline.watch(Member(bootstrap, group, [topic_name], "consumer-1"))
    classic.start()
    try:
        wait_until(lambda: len(classic.owns()) == PARTITIONS, "the classic member owns the topic", TIMEOUT_S)
        new.start()
        wait_until(lambda: split_evenly([classic, new], topic_name), "the mixed group splits the topic", TIMEOUT_S)
        broker.restart()  # the consumer group and its classic member are replayed from __consumer_offsets
        values = produce(bootstrap, topic_name, 20)
        wait_until(lambda: set(values) <= set(classic.read) | set(new.read), "the members read on after the restart",
                   TIMEOUT_S)
        assert split_evenly([classic, new], topic_name)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        assert group_type(admin, group) == ConsumerGroupType.CONSUMER
        assert timeline.double_owners() == []
    finally:
        classic.stop()
        new.stop()


def test_a_kafka_python_consumer_keeps_its_classic_protocol_in_an_upgraded_group(broker_factory, topic_name):
    """An eager classic client (kafka-python, range): it gives everything up before each JoinGroup and gets its
    share of the consumer group's partitions through SyncGroup."""
    from kafka import KafkaConsumer
    from kafka.version import __version__ as kafka_version

    broker = broker_factory(CONFIG)
    bootstrap = broker.bootstrap
    create_topic(bootstrap, topic_name, PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    classic = KafkaConsumer(topic_name, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                            session_timeout_ms=6000, heartbeat_interval_ms=300, consumer_timeout_ms=100)
    new = Member(bootstrap, group, [topic_name], "consumer-1")
    read: list[str] = []

    def poll_classic() -> set[int]:
        for records in classic.poll(timeout_ms=100).values():
            read.extend(r.value.decode() for r in records)
        return {tp.partition for tp in classic.assignment()}

    try:
        wait_until(lambda: len(poll_classic()) == PARTITIONS, "the kafka-python consumer owns the topic", TIMEOUT_S)
        new.start()
        wait_until(lambda: (lambda mine: mine and new.owns() and not mine & {p for _, p in new.owns()}
                            and len(mine) + len(new.owns()) == PARTITIONS)(poll_classic()),
                   "the kafka-python consumer and the consumer member split the topic", TIMEOUT_S)
        values = produce(bootstrap, topic_name, 20)
        wait_until(lambda: poll_classic() is not None and set(values) <= set(read) | set(new.read),
                   "every record read by the two protocols", TIMEOUT_S)
        classic.commit()  # a classic commit at its generation (the member epoch) is accepted
        # ConsumerGroupDescribe tells the two kinds of member apart (Kafka 4's MemberType: 0 classic, 1 consumer).
        (described,) = send_request(broker.address, describe_v1.ConsumerGroupDescribeRequest(
            group_ids=(group,), include_authorized_operations=False)).groups
        assert sorted((m.member_type, m.client_id) for m in described.members) == [
            (0, "kafka-python-" + kafka_version), (1, "consumer-1")]
        assert new.errors == []
    finally:
        new.stop()
        classic.close()

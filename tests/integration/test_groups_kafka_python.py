"""kafka-python consumers in groups against pykbroker: ``KAFKA_PYTHON``, the client that
test_groups_scenarios.py runs the group scenarios with; its admin client lists, describes and deletes the
groups there.

Settings beyond the defaults: short session timeouts and heartbeat intervals, and
auto_offset_reset='earliest'. Run as ``python test_groups_kafka_python.py member BOOTSTRAP GROUP TOPIC`` this
file is one group member that prints its assignment (the crash scenario kills it).

kafka-python 3.0.12 can lose a join it started itself, and the member then hangs without a word: members
here poll through ``poll`` below, which takes the client out of that state (see ``lost_join``)."""

from __future__ import annotations

import logging
import sys
import threading
import time

from kafka import ConsumerRebalanceListener, KafkaAdminClient, KafkaConsumer, OffsetAndMetadata, TopicPartition
from kafka.coordinator.base import MemberState
from kafka.errors import CommitFailedError, KafkaError

from test_groups_common import (
    ALL,
    BROKER_CONFIG,
    HEARTBEAT_INTERVAL_MS,
    SESSION_TIMEOUT_MS,
    TIMEOUT_S,
    GroupClient,
    MemberLog,
    MemberProcess,
    group_state,
    print_assignment,
    wait_until,
)
from test_kafka_python import create_topic, produce

log = logging.getLogger(__name__)

FAST_GROUP = {"session_timeout_ms": SESSION_TIMEOUT_MS, "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
              "auto_offset_reset": "earliest", "metadata_max_age_ms": 1000}


def lost_join(consumer: KafkaConsumer) -> bool:
    """The client's join finished but its result was never taken in: kafka-python 3.0.12 will not go on.

    How it happens (kafka/coordinator/base.py and consumer.py of 3.0.12):
    * the leader records the metadata its assignment used (consumer.py:473), but that snapshot is rebuilt only
      when a metadata update arrives (consumer.py:203), so the first assignment after subscribe() records
      one without the topic ({}); at the next metadata refresh (metadata_max_age_ms) need_rejoin() sees
      the difference and the leader rejoins: a second rebalance right after the first, in every group;
    * a rejoin asked for by ConsumerCoordinator.need_rejoin because the metadata changed since the leader's
      assignment (consumer.py:605-609) leaves the base flag ``rejoin_needed`` False (set at base.py:544);
    * join_group_async (base.py:480) runs the JoinGroup -> SyncGroup task; poll's timer expires while it is
      in flight and, by design, the task is left running for the next poll to await again (base.py:510-515);
    * inside the task the leader's _perform_assignment sets ``_assignment_snapshot = _metadata_snapshot``
      (consumer.py:473), so need_rejoin() is now False;
    * the next poll asks need_rejoin() (consumer.py:408), gets False and never awaits the task again, so what
      follows a join (base.py:540-551: state STABLE, heartbeats enabled, the assignment applied) never runs.
    The member sits in REBALANCING with heartbeats disabled since the join began (base.py:505), sends
    nothing, is evicted at its session timeout and, still not needing a rejoin, never comes back. The broker
    answered JoinGroup and SyncGroup at once and in order; Kafka's answers would be the same."""
    coordinator = consumer._coordinator
    task = coordinator._join_task
    return (coordinator.state is MemberState.REBALANCING and task is not None and task.is_done
            and not coordinator.need_rejoin())


def poll(consumer: KafkaConsumer, timeout_ms: int) -> dict:
    """consumer.poll, then out of a lost join (``lost_join``) by asking for a rejoin, as kafka-python would
    if it had kept the flag: the next poll joins again (a new generation) and this time waits for it."""
    records = consumer.poll(timeout_ms=timeout_ms)
    if lost_join(consumer):
        log.warning("%s: kafka-python lost its join (generation %s); asking for a rejoin",
                    consumer.config["client_id"], consumer._coordinator._generation.generation_id)
        consumer._coordinator.request_rejoin()
    return records


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
                for tp, records in poll(consumer, 50).items():
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


def start_member(bootstrap: str, group: str, topic: str, name: str, commit_each: bool = False) -> Member:
    member = Member(bootstrap, group, topic, name, commit_each=commit_each)
    member.start()
    return member


def admin_view(broker, topic: str, groups: tuple[str, str]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        assert set(groups) <= {g["group_id"] for g in admin.list_groups()}
        described = admin.describe_groups([groups[0]])[groups[0]]
        assert described["group_state"] == "Stable" and len(described["members"]) == 1
        assert admin.delete_groups(list(groups)) == {group: "NonEmptyGroupError" for group in groups}
    finally:
        admin.close()


def admin_after(broker, topic: str, groups: tuple[str, str]) -> None:
    """The members are gone: the groups can be deleted, and their offsets go with them."""
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=groups[0])
    try:
        assert consumer.committed(TopicPartition(topic, 0)) is not None
        assert admin.delete_groups(list(groups)) == {group: "OK" for group in groups}
        assert consumer.committed(TopicPartition(topic, 0)) is None
    finally:
        consumer.close()
        admin.close()


KAFKA_PYTHON = GroupClient(create_topic=create_topic, produce_values=produce_values, member=start_member,
                           victim=lambda bootstrap, group, topic: MemberProcess(__file__, bootstrap, group, topic),
                           admin_view=admin_view, admin_after=admin_after)



def test_a_join_kafka_python_lost_is_made_again_by_the_members_poll(broker_factory, topic_name):
    """kafka-python's lost join (``lost_join``) made on purpose, on an idle machine: the client alone stays
    out of the group for good; the members' ``poll`` brings it back in a new generation with every
    partition. On a loaded machine the same state arises by itself: before the members' ``poll``, 2 of 29
    runs of the five kafka-python group scenarios under stress-ng (2 cores) hung a member this way."""
    broker = broker_factory.make(config=BROKER_CONFIG)
    create_topic(broker.bootstrap, topic_name)
    group = f"{topic_name}-g"
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, **FAST_GROUP)
    try:
        consumer.subscribe([topic_name])
        coordinator = consumer._coordinator
        wait_until(lambda: poll(consumer, 50) is not None and coordinator.state is MemberState.STABLE
                   and {tp.partition for tp in consumer.assignment()} == ALL, "the first assignment")
        first_generation = coordinator._generation.generation_id
        # The metadata changed since the leader assigned (consumer.py:605-609): a rejoin that only
        # need_rejoin() asks for, the base flag left False.
        coordinator._assignment_snapshot = {topic_name: set()}
        assert coordinator.need_rejoin() and not coordinator.rejoin_needed
        # A poll whose time runs out while its JoinGroup -> SyncGroup task is in flight (no time at all: always).
        consumer.poll(timeout_ms=0)
        assert coordinator._join_task is not None
        wait_until(lambda: coordinator._join_task.is_done, "the join task to finish")
        assert lost_join(consumer)
        # kafka-python alone: no heartbeat, no rejoin; the broker evicts it and it never notices.
        deadline = time.monotonic() + SESSION_TIMEOUT_MS / 1000 + 1.5
        while time.monotonic() < deadline:
            consumer.poll(timeout_ms=50)
        assert lost_join(consumer) and group_state(broker.address, group) == "Empty"
        # The members' poll: a new generation, every partition.
        wait_until(lambda: poll(consumer, 50) is not None and coordinator.state is MemberState.STABLE
                   and {tp.partition for tp in consumer.assignment()} == ALL, "the member to be back")
        assert coordinator._generation.generation_id > first_generation
        assert group_state(broker.address, group) == "Stable"
    finally:
        consumer.close()


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
        poll(consumer, 100)


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "member":
    _member_main(*sys.argv[2:])

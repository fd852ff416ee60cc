"""kafka-python consumers in groups against pykbroker: ``KAFKA_PYTHON``, the client that
test_groups_scenarios.py runs the group scenarios with; its admin client lists, describes and deletes the
groups there.

Settings beyond the defaults: short session timeouts and heartbeat intervals, and
auto_offset_reset='earliest'. Run as ``python test_groups_kafka_python.py member BOOTSTRAP GROUP TOPIC`` this
file is one group member that prints its assignment (the crash scenario kills it)."""

from __future__ import annotations

import sys
import threading

from kafka import ConsumerRebalanceListener, KafkaAdminClient, KafkaConsumer, OffsetAndMetadata, TopicPartition
from kafka.errors import CommitFailedError, KafkaError

from test_groups_common import (
    HEARTBEAT_INTERVAL_MS,
    SESSION_TIMEOUT_MS,
    TIMEOUT_S,
    GroupClient,
    MemberLog,
    MemberProcess,
    print_assignment,
)
from test_kafka_python import create_topic, produce

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

"""aiokafka consumers in groups against pykbroker (aiokafka 0.14 speaks JoinGroup v5, SyncGroup v3,
Heartbeat and LeaveGroup v1, OffsetCommit/OffsetFetch v2-3): two members split a 4-partition topic, the
member left after a leave or a crash (session timeout) gets everything, committed offsets are resumed by a
new member after a broker kill -9, a second group reads everything independently, and members joining at
the same moment or during a rebalance never share a partition.

Settings beyond the defaults: short session timeouts and heartbeat intervals, and
auto_offset_reset='earliest'. Run as ``python test_groups_aiokafka.py member BOOTSTRAP GROUP TOPIC`` this
file is one group member that prints its assignment (the crash test kills it)."""

from __future__ import annotations

import asyncio
import sys

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import CommitFailedError, KafkaError

from test_aiokafka import create_topic, produce
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
    wait_for,
)

pytestmark = pytest.mark.timeout(120)

FAST_GROUP = {"session_timeout_ms": SESSION_TIMEOUT_MS, "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
              "auto_offset_reset": "earliest", "metadata_max_age_ms": 1000}


async def produce_values(bootstrap: str, topic: str, values: list[str]) -> None:
    await produce(bootstrap, topic, [{"key": v.encode(), "value": v.encode()} for v in values])


class _Listener(ConsumerRebalanceListener):
    def __init__(self, log: MemberLog) -> None:
        self.log = log

    def on_partitions_revoked(self, revoked):
        self.log.revoked(tp.partition for tp in revoked)

    def on_partitions_assigned(self, assigned):
        self.log.assigned(tp.partition for tp in assigned)


class Member(MemberLog):
    """One AIOKafkaConsumer reading in its own task."""

    def __init__(self, bootstrap: str, group: str, topic: str, name: str, *, commit_each: bool = False) -> None:
        super().__init__(name)
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, client_id=name,
                                         enable_auto_commit=not commit_each, **FAST_GROUP)
        self.topic = topic
        self.commit_each = commit_each
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.subscribe([self.topic], listener=_Listener(self))
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=50)
            for tp, records in batches.items():
                for record in records:
                    self.read(tp.partition, record.offset, record.value.decode())
                    if self.commit_each:
                        try:
                            await self.consumer.commit({tp: record.offset + 1})
                        except (CommitFailedError, KafkaError):
                            continue  # the group rebalanced: not committed
                        self.committed(tp.partition, record.offset + 1)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
            except Exception as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(exc)
            self.task = None
        await self.consumer.stop()  # commits (auto-commit) and leaves the group


async def stop_all(*members: Member) -> None:
    for member in members:
        await member.stop()
    for member in members:
        assert not member.errors, member.errors


@pytest.fixture
def group_broker(broker_factory):
    return broker_factory.make(config=BROKER_CONFIG)


def test_two_members_split_the_topic_and_the_one_left_after_a_leave_gets_everything(group_broker, topic_name):
    async def scenario():
        await create_topic(group_broker.bootstrap, topic_name, PARTITIONS)
        group = f"{topic_name}-g"
        a, b = (Member(group_broker.bootstrap, group, topic_name, name) for name in ("a", "b"))
        await a.start()
        await b.start()
        try:
            await wait_for(lambda: split_among(a, b), "a and b to split the partitions")
            first = [f"first-{i}" for i in range(40)]
            await produce_values(group_broker.bootstrap, topic_name, first)
            await wait_for(lambda: sorted(a.values() + b.values()) == sorted(first), "the first batch, read once")
            assert {r[0] for r in a.records} <= a.partitions() and {r[0] for r in b.records} <= b.partitions()
            await b.stop()  # commits, then LeaveGroup
            await wait_for(lambda: a.partitions() == ALL, "a to own every partition")
            second = [f"second-{i}" for i in range(40)]
            await produce_values(group_broker.bootstrap, topic_name, second)
            await wait_for(lambda: set(second) <= set(a.values()), "a to read the second batch")
            assert sorted(a.values() + b.values()) == sorted(first + second)  # resumed at b's commits
        finally:
            await stop_all(a)

    asyncio.run(scenario())


def test_a_member_that_dies_is_evicted_at_its_session_timeout_and_the_other_gets_everything(group_broker,
                                                                                              topic_name):
    async def scenario():
        await create_topic(group_broker.bootstrap, topic_name, PARTITIONS)
        group = f"{topic_name}-g"
        a = Member(group_broker.bootstrap, group, topic_name, "a")
        await a.start()
        victim = None
        try:
            await wait_for(lambda: a.partitions() == ALL, "a to own every partition first")
            victim = MemberProcess(__file__, group_broker.bootstrap, group, topic_name)
            await wait_for(lambda: victim.partitions() and a.partitions()
                           and a.partitions().isdisjoint(victim.partitions())
                           and a.partitions() | victim.partitions() == ALL, "the second member to take its share")
            victim.kill()
            await wait_for(lambda: a.partitions() == ALL, "a to get every partition back after the session timeout")
            after = [f"after-{i}" for i in range(20)]
            await produce_values(group_broker.bootstrap, topic_name, after)
            await wait_for(lambda: set(after) <= set(a.values()), "a to read everything")
        finally:
            if victim is not None:
                victim.kill()
            await stop_all(a)

    asyncio.run(scenario())


def test_committed_offsets_are_resumed_by_a_new_member_after_a_broker_kill9(group_broker, topic_name):
    group = f"{topic_name}-g"
    first = [f"first-{i}" for i in range(30)]
    second = [f"second-{i}" for i in range(20)]

    async def before():
        await create_topic(group_broker.bootstrap, topic_name, PARTITIONS)
        await produce_values(group_broker.bootstrap, topic_name, first)
        reader = Member(group_broker.bootstrap, group, topic_name, "reader", commit_each=True)
        await reader.start()
        await wait_for(lambda: len(reader.commits) == len(first), "every message read and committed")
        await stop_all(reader)

    async def after():
        await produce_values(group_broker.bootstrap, topic_name, second)
        successor = Member(group_broker.bootstrap, group, topic_name, "successor")
        await successor.start()
        try:
            await wait_for(lambda: len(successor.values()) >= len(second), "the successor to read the new messages")
            await asyncio.sleep(0.5)  # anything before the committed offsets would arrive with the rest
            assert sorted(successor.values()) == sorted(second)
        finally:
            await stop_all(successor)

    asyncio.run(before())
    group_broker.restart(kill=True)
    asyncio.run(after())


def test_a_second_group_reads_everything_independently(group_broker, topic_name):
    async def scenario():
        await create_topic(group_broker.bootstrap, topic_name, PARTITIONS)
        values = [f"v-{i}" for i in range(40)]
        await produce_values(group_broker.bootstrap, topic_name, values)
        one, two = (Member(group_broker.bootstrap, f"{topic_name}-{n}", topic_name, n) for n in ("one", "two"))
        await one.start()
        await two.start()
        try:
            await wait_for(lambda: len(one.values()) == len(two.values()) == len(values), "both groups to read all")
            assert sorted(one.values()) == sorted(two.values()) == sorted(values)
        finally:
            await stop_all(one, two)

    asyncio.run(scenario())


def test_simultaneous_joins_and_a_join_during_a_rebalance_keep_one_owner_per_partition(broker_factory, topic_name):
    # A real initial rebalance delay keeps the first rebalance open long enough to join it.
    broker = broker_factory.make(config={**BROKER_CONFIG, "group.initial.rebalance.delay.ms": 1500})

    async def scenario():
        await create_topic(broker.bootstrap, topic_name, PARTITIONS)
        group = f"{topic_name}-g"
        members = [Member(broker.bootstrap, group, topic_name, name, commit_each=True) for name in "abc"]
        values = [f"v-{i}" for i in range(200)]
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()

        async def rebalance_begun() -> None:
            while True:
                (answer,) = await admin.describe_consumer_groups([group])
                if answer.groups[0][2] == "PreparingRebalance":  # DescribeGroups v2: error, group, state, ...
                    return

        try:
            await asyncio.gather(members[0].start(), members[1].start())  # two at the same moment
            await asyncio.wait_for(rebalance_begun(), TIMEOUT_S)
            await members[2].start()  # joins the rebalance in progress
            for i in range(0, len(values), 20):
                await produce_values(broker.bootstrap, topic_name, values[i:i + 20])
            await wait_for(lambda: one_owner_each(*members), "every partition to have exactly one owner")
            await wait_for(lambda: {v for m in members for v in m.values()} == set(values), "every message read")
            assert_no_message_read_twice_between_commits(members)
        finally:
            await admin.close()
            await stop_all(*members)

    asyncio.run(scenario())


async def _member_main(bootstrap: str, group: str, topic: str) -> None:
    """A member that reports each change of its assignment on stdout until it is killed."""
    owned: set[int] = set()

    class Report(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            owned.difference_update(tp.partition for tp in revoked)
            print_assignment(owned)

        def on_partitions_assigned(self, assigned):
            owned.update(tp.partition for tp in assigned)
            print_assignment(owned)

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, **FAST_GROUP)
    await consumer.start()
    consumer.subscribe([topic], listener=Report())
    while True:
        await consumer.getmany(timeout_ms=100)


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "member":
    asyncio.run(_member_main(*sys.argv[2:]))

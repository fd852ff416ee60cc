"""aiokafka consumers in groups against pykbroker (aiokafka 0.14 speaks JoinGroup v5, SyncGroup v3,
Heartbeat and LeaveGroup v1, OffsetCommit/OffsetFetch v2-3): ``AIOKAFKA``, the client that
test_groups_scenarios.py runs the group scenarios with. Each member runs on its own asyncio loop in a
thread, so the scenarios drive it like the other clients.

Settings beyond the defaults: short session timeouts and heartbeat intervals, and
auto_offset_reset='earliest'. Run as ``python test_groups_aiokafka.py member BOOTSTRAP GROUP TOPIC`` this
file is one group member that prints its assignment (the crash scenario kills it)."""

from __future__ import annotations

import asyncio
import sys
import threading

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, KafkaError

import test_aiokafka
from test_groups_common import (
    HEARTBEAT_INTERVAL_MS,
    SESSION_TIMEOUT_MS,
    TIMEOUT_S,
    GroupClient,
    MemberLog,
    MemberProcess,
    print_assignment,
)

FAST_GROUP = {"session_timeout_ms": SESSION_TIMEOUT_MS, "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
              "auto_offset_reset": "earliest", "metadata_max_age_ms": 1000}


def create_topic(bootstrap: str, topic: str) -> None:
    asyncio.run(test_aiokafka.create_topic(bootstrap, topic))


def produce_values(bootstrap: str, topic: str, values: list[str]) -> None:
    asyncio.run(test_aiokafka.produce(bootstrap, topic, [{"key": v.encode(), "value": v.encode()} for v in values]))


class _Listener(ConsumerRebalanceListener):
    def __init__(self, log: MemberLog) -> None:
        self.log = log

    def on_partitions_revoked(self, revoked):
        self.log.revoked(tp.partition for tp in revoked)

    def on_partitions_assigned(self, assigned):
        self.log.assigned(tp.partition for tp in assigned)


class Member(MemberLog):
    """One AIOKafkaConsumer reading in a task on its own event loop, in its own thread."""

    def __init__(self, bootstrap: str, group: str, topic: str, name: str, commit_each: bool = False) -> None:
        super().__init__(name)
        self.settings = {"bootstrap_servers": bootstrap, "group_id": group, "client_id": name,
                         "enable_auto_commit": not commit_each, **FAST_GROUP}
        self.topic = topic
        self.commit_each = commit_each
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()
        self.consumer: AIOKafkaConsumer | None = None
        self.task: asyncio.Task | None = None
        self._call(self._start())

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(TIMEOUT_S)

    async def _start(self) -> None:
        self.consumer = AIOKafkaConsumer(**self.settings)
        await self.consumer.start()
        self.consumer.subscribe([self.topic], listener=_Listener(self))
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=50)
            # The group rejoins in the background while a batch is processed: records delivered before a
            # revocation are dropped, as an aiokafka application must (whoever owns the partition next
            # reads them again from the committed offset). Otherwise a commit for one of them would go out
            # with the next generation, which is valid if the partition came back to this member.
            delivered_in = len(self.revocations)
            for tp, records in batches.items():
                for record in records:
                    if len(self.revocations) != delivered_in:
                        break
                    self.read(tp.partition, record.offset, record.value.decode())
                    if self.commit_each:
                        try:
                            await self.consumer.commit({tp: record.offset + 1})
                        except (CommitFailedError, KafkaError):
                            continue  # the group rebalanced: not committed
                        self.committed(tp.partition, record.offset + 1)

    async def _stop(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # noqa: BLE001 - reported by the scenario
            self.errors.append(exc)
        await self.consumer.stop()  # commits (auto-commit) and leaves the group

    def stop(self) -> None:
        if not self.loop.is_running():
            return
        try:
            self._call(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(TIMEOUT_S)
            self.loop.close()


AIOKAFKA = GroupClient(create_topic=create_topic, produce_values=produce_values, member=Member,
                       victim=lambda bootstrap, group, topic: MemberProcess(__file__, bootstrap, group, topic))


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

"""Change notifications followed as Kafka's ZkNodeChangeNotificationListener does, against a real ZooKeeper:
in sequence order, a notification counted processed only once processing it succeeded (a ZooKeeper error
while re-reading what it names is retried, never skipped: here through the ACL store of a second broker
whose client fails one read), processed ones older than the expiry deleted, other nodes ignored. And the ACL
store's conditional writes: retried as Kafka's updateResourceAcls retries them, then given up."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install kazoo, or the project's test extra)")
from kazoo.exceptions import ConnectionLoss  # noqa: E402

from pykbroker.cluster.acls import ZkAclStore  # noqa: E402
from pykbroker.cluster.change_notifications import ChangeNotificationListener  # noqa: E402
from pykbroker.cluster.zookeeper import KafkaZkClient  # noqa: E402
from pykbroker.security.acl import (  # noqa: E402
    AccessControlEntry, AclOperation, AclPermissionType, PatternType, ResourcePattern, ResourceType,
)
from pykbroker.security.authorizer import AclCache  # noqa: E402

ORDERS = ResourcePattern(ResourceType.TOPIC, "orders", PatternType.LITERAL)
ALICE = AccessControlEntry("User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW)


async def until(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not {what} after {timeout} s"
        await asyncio.sleep(0.05)


class FailingOnce(KafkaZkClient):
    """The real client, whose first read of ``path`` fails as a lost connection fails it."""

    def __init__(self, *args, path: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.failing_path, self.failures = path, 0

    async def get(self, path: str):
        if path == self.failing_path and self.failures == 0:
            self.failures += 1
            raise ConnectionLoss()
        return await super().get(path)


def test_a_zookeeper_error_while_following_an_acl_change_is_retried_not_skipped(zk_connect, run_async):
    async def scenario():
        writer_zk = KafkaZkClient(zk_connect, session_timeout_ms=6000)
        reader_zk = FailingOnce(zk_connect, session_timeout_ms=6000, path="/kafka-acl/Topic/orders")
        await writer_zk.start()
        await reader_zk.start()
        writer, reader = ZkAclStore(writer_zk, AclCache()), ZkAclStore(reader_zk, AclCache())
        try:
            await writer.start()
            await reader.start()
            await writer.update(ORDERS, lambda current: current | {ALICE})
            await until(lambda: reader_zk.failures == 1, "the reader's read failing")
            await until(lambda: reader.cache.get(ORDERS) == {ALICE}, "the ACL on the reader after the retry")
            literal = reader.listeners["/kafka-acl-changes"]
            assert literal.last_processed == 0
        finally:
            await writer.close()
            await reader.close()
            await writer_zk.close()
            await reader_zk.close()

    run_async(scenario())


def test_notifications_are_processed_in_order_once_and_purged_when_expired(zk_connect, run_async):
    async def scenario():
        zk = KafkaZkClient(zk_connect, session_timeout_ms=6000)
        await zk.start()
        seen: list[tuple[str, bytes | None]] = []
        now = [0]

        async def process(child: str, data: bytes | None) -> None:
            seen.append((child, data))

        listener = ChangeNotificationListener(zk, "/changes", "change_", process, expiration_ms=60_000,
                                              clock_ms=lambda: now[0])
        try:
            await zk.ensure_acl_paths(["/changes"])
            for n in range(3):
                await zk.create_acl_change("/changes/change_", f"n{n}".encode())
            await zk.create_acl_change("/changes/other_", b"not a notification")
            now[0] = int(time.time() * 1000)  # the ones made: not expired
            listener.start()
            await until(lambda: len(seen) == 3, "three notifications processed")
            assert [data for _, data in seen] == [b"n0", b"n1", b"n2"]
            await zk.create_acl_change("/changes/change_", b"n3")
            await until(lambda: len(seen) == 4, "the new one processed")
            assert seen[-1] == ("change_0000000004", b"n3") and listener.last_processed == 4
            assert len(await zk.children("/changes")) == 5
            now[0] += 61_000  # all expired: the next pass deletes the processed ones, not the other node
            await zk.create_acl_change("/changes/change_", b"n5")
            await until(lambda: len(seen) == 5, "the last one processed")
            await until(lambda: listener._task.done(), "the pass over")
            assert await zk.children("/changes") == ["other_0000000003"]
            assert [child for child, _ in seen] == [f"change_{n:010d}" for n in (0, 1, 2, 4, 5)]
        finally:
            await listener.close()
            await zk.close()

    run_async(scenario())


class Contended(KafkaZkClient):
    """The real client, with another writer changing the ACL znode just before each of its writes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.writes = 0

    async def write_acl_znode(self, path: str, data: bytes | None, version: int | None) -> bool:
        self.writes += 1
        found = await self.get_or_none(path)
        if found is not None:  # the other writer: the same data, a new version
            await self._await(self._zk.set_async(path, found[0]))
        return await super().write_acl_znode(path, data, version)


def test_an_acl_write_losing_every_race_gives_up_after_kafkas_ten_retries(zk_connect, run_async):
    """AclAuthorizer.updateResourceAcls: 10 retries, each after 100-150 ms, then the change fails."""
    from pykbroker.cluster.acls import AclUpdateConflict

    async def scenario():
        zk = Contended(zk_connect, session_timeout_ms=6000)
        await zk.start()
        store = ZkAclStore(zk, AclCache())
        try:
            await store.start()
            await store.update(ORDERS, lambda current: current | {ALICE})  # created: no version to lose to
            assert zk.writes == 1
            bob = AccessControlEntry("User:bob", "*", AclOperation.READ, AclPermissionType.ALLOW)
            started = time.monotonic()
            with pytest.raises(AclUpdateConflict, match="after trying a maximum of 10 times"):
                await store.update(ORDERS, lambda current: current | {bob})
            assert zk.writes == 1 + 11 and time.monotonic() - started >= 1.0
            assert store.cache.get(ORDERS) == {ALICE}
        finally:
            await store.close()
            await zk.close()

    run_async(scenario())

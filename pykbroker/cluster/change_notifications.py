"""Kafka's ZkNodeChangeNotificationListener: follow a ZooKeeper root of persistent sequential change
notifications (``/kafka-acl-changes/acl_changes_0000000042``, ``/config/changes/config_change_...``).

One listener per root. ``start()`` watches the root's children; every change of them (and the start itself)
marks the root pending and runs one task (never two at once) that lists the children, takes those whose
sequence number is above the last one processed, in sequence order (ZooKeeper lists children in any order),
reads each and awaits ``process(child, data)`` (data None: the notification vanished meanwhile). The last
processed number advances only after ``process`` returned: a ZooKeeper error (reading the notification or
in ``process`` - which handles data it cannot decode itself: logs it and returns) leaves it where it was,
and the listener tries again after a backoff (``retry_backoff_s``, doubling up to ``max_backoff_s``), so a
ZooKeeper hiccup never makes the broker skip a change. After each pass, the processed notifications older
than ``expiration_ms`` (by their ZooKeeper ctime; Kafka's 15 minutes) are deleted: every broker does it, one
already deleted by another is fine (Kafka's purgeObsoleteNotifications).

Wiring::

    listener = ChangeNotificationListener(zk, "/kafka-acl-changes", "acl_changes_", process, name="ACL")
    listener.start()      # on the event loop, after the initial load
    await listener.close()

cluster/zk_metadata.py's config-change processing can use the same class: root ``CONFIG_CHANGES_PATH``,
prefix ``CONFIG_CHANGE_PREFIX``, ``process`` reloading the entity the notification names, ``clock_ms`` its
clock, ``expiration_ms`` its ``change_expiration_ms``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Awaitable, Callable

if TYPE_CHECKING:
    from pykbroker.cluster.zookeeper import KafkaZkClient

log = logging.getLogger(__name__)

__all__ = ("ChangeNotificationListener", "NOTIFICATION_EXPIRATION_MS")

NOTIFICATION_EXPIRATION_MS = 15 * 60 * 1000  # Kafka's ZkNodeChangeNotificationListener default


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


class ChangeNotificationListener:
    """Processes the notifications under ``root`` named ``prefix`` + sequence number (see the module)."""

    def __init__(self, zk: "KafkaZkClient", root: str, prefix: str,
                 process: Callable[[str, bytes | None], Awaitable[None]], *, name: str = "change",
                 expiration_ms: int = NOTIFICATION_EXPIRATION_MS, clock_ms: Callable[[], int] = _wall_clock_ms,
                 retry_backoff_s: float = 0.1, max_backoff_s: float = 10.0) -> None:
        self.zk, self.root, self.prefix, self.process = zk, root, prefix, process
        self.name = name
        self.expiration_ms, self.clock_ms = expiration_ms, clock_ms
        self.retry_backoff_s, self.max_backoff_s = retry_backoff_s, max_backoff_s
        self.last_processed = -1  # the sequence number of the last notification processed
        self._ctimes: dict[str, int] = {}  # processed notification (child name) -> its ZooKeeper ctime (ms)
        self._pending = False
        self._task: asyncio.Task | None = None
        self._closed = False

    def sequence(self, child: str) -> int | None:
        """The sequence number of a notification's node name; None for another node."""
        digits = child[len(self.prefix):] if child.startswith(self.prefix) else ""
        return int(digits) if digits.isascii() and digits.isdigit() else None

    def start(self) -> None:
        """Watch the root (the watch fires once at once: the notifications already there are processed)."""
        self.zk.watch_children(self.root, lambda children: self.changed())

    def changed(self) -> None:
        """The root's children changed: process the new notifications (one task at a time)."""
        if self._closed:
            return
        self._pending = True
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        backoff = self.retry_backoff_s
        while self._pending and not self._closed:
            self._pending = False
            try:
                await self.process_new()
                backoff = self.retry_backoff_s
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - ZooKeeper failed: nothing skipped, tried again
                log.warning("cannot process %s change notifications under %s (retrying in %.1f s): %r",
                            self.name, self.root, backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
                self._pending = True

    async def process_new(self) -> None:
        """One pass: the new notifications in sequence order, then the purge of the expired ones."""
        children = await self.zk.children(self.root)
        changes = sorted((seq, child) for child in children if (seq := self.sequence(child)) is not None)
        for sequence, child in changes:
            if sequence <= self.last_processed:
                continue
            found = await self.zk.get_or_none(f"{self.root}/{child}")
            if found is not None:
                self._ctimes[child] = found[1].ctime
            await self.process(child, found[0] if found is not None else None)
            self.last_processed = sequence  # only now: a failure above processes it again
        await self._purge(children)

    async def _purge(self, children: list[str]) -> None:
        present = set(children)
        for child in [c for c in self._ctimes if c not in present]:  # purged by another broker
            del self._ctimes[child]
        now = self.clock_ms()
        for child, ctime in sorted(self._ctimes.items()):
            if now - ctime > self.expiration_ms:
                log.debug("purging %s change notification %s/%s", self.name, self.root, child)
                await self.zk.delete_if_present(f"{self.root}/{child}")
                del self._ctimes[child]

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

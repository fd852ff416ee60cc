"""Where the authorizer's ACLs live, and how every broker's ACL cache follows them.

Two stores with one interface (``start()`` fills the cache, ``update(pattern, change)`` persists a change
to one resource pattern - ``change`` makes the new ACL set from the set the store reads when it writes,
Kafka's updateResourceAcls function - puts the new whole set in the cache and returns it, ``close()``;
``lock`` serialises the ACL changes made through one broker: the handler plans and persists under it):

* :class:`EmbeddedAclStore` (single node): the metadata journal's "acl" records (cluster/metadata.py,
  one record per changed pattern holding its whole set, in the snapshot too).
* :class:`ZkAclStore` (cluster): Kafka 3.7's ZooKeeper layout (security/acl_store.py): one znode per
  pattern under ``/kafka-acl`` / ``/kafka-acl-extended/prefixed``, written conditionally on the version read
  (a concurrent change by another broker is re-read and the change applied to it, as Kafka's
  updateResourceAcls does: up to 10 retries, each after 100-150 ms), then a sequential notification under
  ``/kafka-acl-changes`` (LITERAL) or ``/kafka-acl-extended-changes`` (PREFIXED). Every broker watches both change roots and re-reads the
  patterns the new notifications name (cluster/change_notifications.py, Kafka's
  ZkNodeChangeNotificationListener: in sequence order, a notification counted processed only once its
  pattern was re-read - a ZooKeeper error retries it - and processed ones older than 15 minutes deleted),
  so a change made through any broker (or by Kafka's own tools writing ZooKeeper) is enforced everywhere
  within a ZooKeeper round trip. A znode or notification that does not decode is skipped with a WARN (the
  broker keeps the rest).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from typing import TYPE_CHECKING

from pykbroker.cluster.change_notifications import NOTIFICATION_EXPIRATION_MS, ChangeNotificationListener
from pykbroker.security import acl_store
from pykbroker.security.acl import AccessControlEntry, PatternType, ResourcePattern, ResourceType
from pykbroker.security.authorizer import AclCache, AclChange

if TYPE_CHECKING:
    from pykbroker.cluster.metadata import EmbeddedMetadata
    from pykbroker.cluster.zookeeper import KafkaZkClient

log = logging.getLogger(__name__)

__all__ = ("EmbeddedAclStore", "ZkAclStore", "AclUpdateConflict")


# AclAuthorizer.updateResourceAcls: a conditional write that lost to another broker's is retried this many
# times, each after 100 ms plus up to 50 ms of jitter, then the change fails (UNKNOWN_SERVER_ERROR)
MAX_UPDATE_RETRIES = 10
RETRY_BACKOFF_MS, RETRY_BACKOFF_JITTER_MS = 100, 50


class AclUpdateConflict(RuntimeError):
    """Every conditional write of a pattern's znode lost to another writer (Kafka's IllegalStateException)."""


class EmbeddedAclStore:
    """ACLs in the single-node metadata journal."""

    def __init__(self, metadata: "EmbeddedMetadata", cache: AclCache) -> None:
        self.metadata = metadata
        self.cache = cache
        self.lock = asyncio.Lock()

    @staticmethod
    def _key(pattern: ResourcePattern) -> tuple[str, str, str]:
        return (pattern.resource_type.name, pattern.pattern_type.name, pattern.name)

    async def start(self) -> None:
        for (resource_type, pattern_type, name), acls in self.metadata.acl_sets():
            where = f"the metadata journal's ACLs of {resource_type}:{pattern_type}:{name}"
            try:
                pattern = ResourcePattern(ResourceType.from_string(resource_type), name,
                                          PatternType.from_string(pattern_type))
                decoded = acl_store.decode_acls(json.dumps({"version": 1, "acls": acls}).encode(), where=where)
                self.cache.set(pattern, decoded.entries)
            except ValueError as exc:
                log.warning("skipping %s: %s", where, exc)

    async def update(self, pattern: ResourcePattern, change: AclChange) -> frozenset[AccessControlEntry]:
        current = self.cache.get(pattern)  # the journal's state: every change goes through this store
        new = change(current)
        if new != current:
            acls = json.loads(acl_store.encode_acls(new))["acls"]
            await asyncio.wrap_future(self.metadata.set_acls(self._key(pattern), acls))
            self.cache.set(pattern, new)
        return new

    async def close(self) -> None:
        pass


class ZkAclStore:
    """ACLs in ZooKeeper, Kafka's layout, with the change-notification watcher."""

    ROOTS = (acl_store.LITERAL_CHANGES_ROOT, acl_store.EXTENDED_CHANGES_ROOT)

    def __init__(self, zk: "KafkaZkClient", cache: AclCache, *,
                 expiration_ms: int = NOTIFICATION_EXPIRATION_MS) -> None:
        self.zk = zk
        self.cache = cache
        self.lock = asyncio.Lock()
        self.listeners = {root: ChangeNotificationListener(
            zk, root, acl_store.CHANGE_PREFIX, lambda child, data, root=root: self._on_change(root, child, data),
            name="ACL", expiration_ms=expiration_ms) for root in self.ROOTS}

    async def start(self) -> None:
        """Create Kafka's ACL paths, load every pattern's ACLs, then watch the change roots."""
        await self.zk.ensure_acl_paths(acl_store.paths_to_create())
        for pattern_type in (PatternType.LITERAL, PatternType.PREFIXED):
            root = acl_store.store_root(pattern_type)
            for type_name in await self.zk.children(root):
                if acl_store.resource_type_from_znode(type_name) is None:
                    continue
                for name in await self.zk.children(f"{root}/{type_name}"):
                    await self._reload(f"{root}/{type_name}/{name}")
        for listener in self.listeners.values():
            listener.start()

    async def _read(self, path: str) -> tuple[frozenset[AccessControlEntry], int | None]:
        found = await self.zk.get_or_none(path)
        if found is None:
            return frozenset(), None
        data, stat = found
        decoded = acl_store.decode_acls(data, where=path)
        for skipped in decoded.skipped:
            log.warning("ACL znode %s: %s left out", path, skipped)
        return decoded.entries, stat.version

    async def _reload(self, path: str) -> None:
        try:
            pattern = acl_store.pattern_from_path(path)
            entries, _ = await self._read(path)
        except acl_store.AclStoreError as exc:
            log.warning("skipping ACL znode %s: %s", path, exc)
            return
        self.cache.set(pattern, entries)

    async def update(self, pattern: ResourcePattern, change: AclChange) -> frozenset[AccessControlEntry]:
        path = acl_store.acl_path(pattern)
        for attempt in range(MAX_UPDATE_RETRIES + 1):
            if attempt:  # the znode changed since it was read (another broker): wait, read it again
                await asyncio.sleep((RETRY_BACKOFF_MS + random.randrange(RETRY_BACKOFF_JITTER_MS)) / 1000)
            try:
                current, version = await self._read(path)
            except acl_store.AclStoreError as exc:  # a damaged znode: replaced by what this broker knows
                log.warning("rewriting ACL znode %s: %s", path, exc)
                found = await self.zk.get_or_none(path)
                current, version = self.cache.get(pattern), (found[1].version if found else None)
            new = change(current)  # applied again to the set read again after a conflicting write
            if (new == current and version is not None) or (not new and version is None):
                break  # nothing to write
            data = acl_store.encode_acls(new) if new else None
            if await self.zk.write_acl_znode(path, data, version):
                prefix, event = acl_store.change_notification(pattern)
                await self.zk.create_acl_change(prefix, event)
                break
        else:
            raise AclUpdateConflict(f"Failed to update ACLs for {pattern} after trying a maximum of "
                                    f"{MAX_UPDATE_RETRIES} times")
        self.cache.set(pattern, new)
        return new

    async def _on_change(self, root: str, child: str, data: bytes | None) -> None:
        """One change notification: re-read the pattern it names (ZooKeeper errors propagate: the listener
        retries it); one that does not decode is skipped with a WARN."""
        if data is None:
            return
        try:
            pattern = acl_store.decode_change(root, data)
        except acl_store.AclStoreError as exc:
            log.warning("skipping ACL change notification %s/%s: %s", root, child, exc)
            return
        await self._reload(acl_store.acl_path(pattern))

    async def close(self) -> None:
        await asyncio.gather(*(listener.close() for listener in self.listeners.values()))

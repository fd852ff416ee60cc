"""The group coordinator: owns consumer groups and their committed offsets.

This first version knows no members yet (membership and rebalancing arrive with JoinGroup/SyncGroup),
so every group is Empty and only "simple" commits are valid: generation -1 and an empty member id, what
librdkafka sends with assign() and auto-commit. A commit naming a generation gets ILLEGAL_GENERATION, as
Kafka answers for a group without that generation.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Mapping

from pykbroker.groups.offset_store import CommittedOffset, OffsetStore
from pykbroker.protocol.errors import ErrorCode

NO_GENERATION = -1
OFFSET_METADATA_MAX_BYTES = 4096  # Kafka's offset.metadata.max.bytes


class GroupCoordinator:
    def __init__(self, store: Callable[[], OffsetStore], partition_exists: Callable[[str, int], bool]) -> None:
        self._store = store  # lazily created: __consumer_offsets appears on first use, as in Kafka
        self._partition_exists = partition_exists

    def commit_offsets(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        offsets: Mapping[tuple[str, int], tuple[int, int, str | None]],
    ) -> dict[tuple[str, int], ErrorCode]:
        """offsets: (topic, partition) -> (offset, leader epoch, metadata). Returns an error per partition."""
        if not group_id:
            return {tp: ErrorCode.invalid_group_id for tp in offsets}
        if generation != NO_GENERATION or member_id:
            return {tp: ErrorCode.illegal_generation for tp in offsets}
        now = int(time.time() * 1000)
        results: dict[tuple[str, int], ErrorCode] = {}
        accepted: dict[tuple[str, int], CommittedOffset] = {}
        for tp, (offset, leader_epoch, metadata) in offsets.items():
            if not self._partition_exists(*tp):
                results[tp] = ErrorCode.unknown_topic_or_partition
            elif metadata is not None and len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                results[tp] = ErrorCode.offset_metadata_too_large
            else:
                accepted[tp] = CommittedOffset(offset, leader_epoch, metadata, now)
                results[tp] = ErrorCode.none
        if accepted:
            self._store().commit(group_id, accepted, now)
        return results

    def fetch_offsets(
        self, group_id: str, partitions: Iterable[tuple[str, int]] | None
    ) -> dict[tuple[str, int], CommittedOffset | None]:
        """Committed offsets of the group; None for a requested partition without one."""
        committed = self._store().fetch(group_id, None if partitions is None else list(partitions))
        if partitions is None:
            return dict(committed)
        return {tp: committed.get(tp) for tp in partitions}

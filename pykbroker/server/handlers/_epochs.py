"""Finding the partition a request names and fencing it by leader epoch (KIP-320).

Shared by Fetch, ListOffsets and OffsetForLeaderEpoch. Not an API handler: the matrix names no API for
this module, so the dispatcher never imports it as one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pykbroker.protocol.errors import ErrorCode
from pykbroker.replication.partition import Role

if TYPE_CHECKING:
    from pykbroker.replication.replica_manager import Partition, ReplicaManager

NO_EPOCH = -1


def epoch_error(requested: int, current: int) -> ErrorCode:
    """A client's current_leader_epoch older than ours is fenced; a newer one means we are behind."""
    if requested == NO_EPOCH or requested == current:
        return ErrorCode.none
    return ErrorCode.fenced_leader_epoch if requested < current else ErrorCode.unknown_leader_epoch


def leader_partition(
    replicas: "ReplicaManager", topic: str, index: int, current_leader_epoch: int = NO_EPOCH, *,
    require_leader: bool = True,
) -> tuple["Partition | None", ErrorCode]:
    """The hosted partition and NONE, or None and why it cannot serve this request (Kafka's
    Partition.getLocalLog: the epoch check first, then leadership unless ``require_leader`` is False, as for
    ListOffsets from the debugging replica id -2; a partition this broker stopped hosting is not served)."""
    partition = replicas.partition(topic, index)
    if partition is None:
        return None, ErrorCode.unknown_topic_or_partition
    error = epoch_error(current_leader_epoch, partition.leader_epoch)
    if error == ErrorCode.none and (require_leader and not partition.is_leader or partition.role is Role.NONE):
        error = ErrorCode.not_leader_or_follower  # no fetching from followers (KIP-392) here
    return (partition if error == ErrorCode.none else None), error

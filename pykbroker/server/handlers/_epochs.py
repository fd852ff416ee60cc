"""Leader-epoch fencing shared by Fetch, ListOffsets and OffsetForLeaderEpoch (KIP-320).

Not an API handler itself: the matrix names no API for it, so the dispatcher never imports it as one.
"""

from pykbroker.protocol.errors import ErrorCode

NO_EPOCH = -1


def epoch_error(requested: int, current: int) -> ErrorCode:
    """A client's current_leader_epoch older than ours is fenced; a newer one means we are behind."""
    if requested == NO_EPOCH or requested == current:
        return ErrorCode.none
    return ErrorCode.fenced_leader_epoch if requested < current else ErrorCode.unknown_leader_epoch

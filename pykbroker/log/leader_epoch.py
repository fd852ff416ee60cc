"""The leader-epoch cache of one partition (epoch -> first offset written in it), kept in Kafka's
``leader-epoch-checkpoint`` file (format in pykbroker/log/checkpoint.py)."""

from __future__ import annotations

import threading
from bisect import bisect_right
from pathlib import Path

from pykbroker.log.checkpoint import CorruptCheckpoint, read_checkpoint, write_checkpoint

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochCache:
    """Kafka's LeaderEpochFileCache: ordered (epoch, start offset) entries, both strictly increasing."""

    FILE_NAME = "leader-epoch-checkpoint"

    def __init__(self, path: Path, entries: list[tuple[int, int]] | None = None) -> None:
        self.path = path
        self._epochs: list[int] = []
        self._starts: list[int] = []
        # Writes may run in the log's I/O thread (``snapshot`` now, ``write_snapshot`` there): each change
        # has a version and an older snapshot never replaces a newer file.
        self._version = 0
        self._written_version = -1
        self._write_lock = threading.Lock()
        for epoch, start in entries or []:
            self._epochs.append(epoch)
            self._starts.append(start)

    @classmethod
    def load(cls, directory: Path) -> "LeaderEpochCache":
        """Read the partition's checkpoint; raises CorruptCheckpoint (the caller rebuilds from the log)."""
        path = directory / cls.FILE_NAME
        rows = read_checkpoint(path, 2) or []
        try:
            entries = [(int(epoch), int(start)) for epoch, start in rows]
        except ValueError as exc:
            raise CorruptCheckpoint(f"{path}: non-numeric entry") from exc
        for (e1, s1), (e2, s2) in zip(entries, entries[1:]):
            if e2 <= e1 or s2 < s1:
                raise CorruptCheckpoint(f"{path}: entries do not increase")
        return cls(path, entries)

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts))

    @property
    def latest_epoch(self) -> int:
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    @property
    def earliest_epoch(self) -> int:
        return self._epochs[0] if self._epochs else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int, *, persist: bool = True) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; True if the cache changed.

        As Kafka does, a new entry removes any later entries it contradicts (epoch or start offset not below it).
        """
        if epoch < 0 or start_offset < 0:
            return False
        if self._epochs and epoch == self._epochs[-1] and start_offset >= self._starts[-1]:
            return False
        while self._epochs and (self._epochs[-1] >= epoch or self._starts[-1] >= start_offset):
            self._epochs.pop()
            self._starts.pop()
        self._epochs.append(epoch)
        self._starts.append(start_offset)
        if persist:
            self.write()
        return True

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (largest known epoch <= ``epoch``, the offset where that epoch ends).

        Kafka's rules: the latest epoch ends at the log end offset; an epoch older than every cached one answers
        with the start offset of the first cached epoch (its data is gone; the follower starts there); an unknown
        newer epoch, or an empty cache, answers (-1, -1).
        """
        if epoch == UNDEFINED_EPOCH or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if epoch == self._epochs[-1]:
            return epoch, log_end_offset
        higher = bisect_right(self._epochs, epoch)
        if higher == len(self._epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return epoch, self._starts[0]
        return self._epochs[higher - 1], self._starts[higher]

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch the record at ``offset`` was written in (-1 if unknown)."""
        slot = bisect_right(self._starts, offset) - 1
        return self._epochs[slot] if slot >= 0 else UNDEFINED_EPOCH

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs starting at or after ``end_offset`` (the log was truncated there)."""
        count = len(self._starts)
        while count and self._starts[count - 1] >= end_offset:
            count -= 1
        if count != len(self._starts):
            del self._epochs[count:]
            del self._starts[count:]
            self.write()

    def truncate_from_start(self, start_offset: int, *, persist: bool = True) -> bool:
        """The log now starts at ``start_offset``: the epoch in force there starts there; older ones go.
        True if the cache changed (written now with ``persist``, else the caller writes a ``snapshot``)."""
        covered = bisect_right(self._starts, start_offset)
        if covered == 0 or (covered == 1 and self._starts[0] == start_offset):
            return False
        del self._epochs[: covered - 1]
        del self._starts[: covered - 1]
        self._starts[0] = start_offset
        self._version += 1
        if persist:
            self.write()
        return True

    def clear(self) -> None:
        if self._epochs:
            self._epochs.clear()
            self._starts.clear()
            self.write()

    def write(self) -> None:
        self._version += 1
        self.write_snapshot(self.snapshot())

    def snapshot(self) -> tuple[int, list[tuple[int, int]]]:
        """The entries now, to write later with ``write_snapshot`` (in any thread)."""
        return self._version, self.entries

    def write_snapshot(self, snapshot: tuple[int, list[tuple[int, int]]]) -> None:
        """Write a snapshot unless a newer one was written already (any thread)."""
        version, entries = snapshot
        with self._write_lock:
            if version <= self._written_version:
                return
            write_checkpoint(self.path, entries)
            self._written_version = version

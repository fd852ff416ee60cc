"""Sparse per-segment indexes, in Kafka's file formats.

``.index``     entries of (int32 offset relative to the segment base, int32 file position of a batch start);
               the offset is that batch's LAST offset, as Kafka writes it (its DumpLogSegments checks this).
``.timeindex`` entries of (int64 timestamp, int32 relative offset): the segment's max timestamp so far and the
               last offset of the batch that first reached it. Timestamps strictly increase.

Entries live in memory (typed arrays, binary-searched) and reach the file in bulk on flush, so an append
costs no system call for its index entries. Any prefix of a sparse index is still a correct sparse index,
which is why a crash that loses the unwritten tail only makes lookups walk a little further. Indexes of
segments that are not active are read from disk lazily, on their first lookup.
"""

from __future__ import annotations

import errno
import os
import struct
from array import array
from bisect import bisect_right
from pathlib import Path


class CorruptIndex(Exception):
    """The index file is not a valid index of its segment; the caller rebuilds it from the log."""


class _SparseIndex:
    ENTRY: struct.Struct
    KEY_TYPE: str
    VALUE_TYPE: str

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._keys = array(self.KEY_TYPE)
        self._values = array(self.VALUE_TYPE)
        self._written = 0  # entries already in the file; the rest are pending
        self._loaded = False

    # -- lifecycle ---------------------------------------------------------------------------------------

    @classmethod
    def create(cls, path: Path, base_offset: int) -> "_SparseIndex":
        """A new, empty index (the file is created now, as Kafka does when it rolls a segment)."""
        index = cls(path, base_offset)
        with open(path, "wb"):
            pass
        index._loaded = True
        return index

    @classmethod
    def open_lazily(cls, path: Path, base_offset: int) -> "_SparseIndex":
        """An index whose entries are read on first use; raises CorruptIndex if the file is missing or torn."""
        try:
            size = os.stat(path).st_size
        except FileNotFoundError as exc:
            raise CorruptIndex(f"{path} is missing") from exc
        if size % cls.ENTRY.size:
            raise CorruptIndex(f"{path} has {size} bytes, not a multiple of {cls.ENTRY.size}")
        return cls(path, base_offset)

    def load(self, log_size: int) -> None:
        """Read and check the file's entries (no-op when already in memory); raises CorruptIndex."""
        if self._loaded:
            return
        try:
            data = self.path.read_bytes()
        except FileNotFoundError as exc:
            raise CorruptIndex(f"{self.path} is missing") from exc
        if len(data) % self.ENTRY.size:
            raise CorruptIndex(f"{self.path} has {len(data)} bytes, not a multiple of {self.ENTRY.size}")
        keys = array(self.KEY_TYPE)
        values = array(self.VALUE_TYPE)
        for key, value in self.ENTRY.iter_unpack(data):
            keys.append(key)
            values.append(value)
        self._check(keys, values, log_size)
        self._keys, self._values = keys, values
        self._written = len(keys)
        self._loaded = True

    def reset(self) -> None:
        """Drop every entry, in memory and on disk (before a rebuild from the log)."""
        with open(self.path, "wb"):
            pass
        self._keys = array(self.KEY_TYPE)
        self._values = array(self.VALUE_TYPE)
        self._written = 0
        self._loaded = True

    def write_pending(self) -> bool:
        """Write the entries not yet in the file after those that are; True if anything was written.

        The write lands at the end of the written entries, so after a failed or short write (disk full) the
        entries stay pending and the next attempt overwrites whatever part of them reached the file.
        """
        if not self._loaded or self._written == len(self._keys):
            return False
        pending = b"".join(
            self.ENTRY.pack(self._keys[i], self._values[i]) for i in range(self._written, len(self._keys))
        )
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if os.pwrite(fd, pending, self._written * self.ENTRY.size) != len(pending):
                raise OSError(errno.ENOSPC, f"short write to {self.path}")
        finally:
            os.close(fd)
        self._written = len(self._keys)
        return True

    # -- queries -----------------------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._loaded

    @property
    def entries(self) -> int:
        return len(self._keys)

    def is_full(self, max_index_bytes: int) -> bool:
        return len(self._keys) >= max_index_bytes // self.ENTRY.size

    def _last_pair(self) -> tuple[int, int] | None:
        """The last entry, read from the file's tail when the index is not loaded (no full load needed)."""
        if self._loaded:
            return (self._keys[-1], self._values[-1]) if self._keys else None
        with open(self.path, "rb") as file:
            size = file.seek(0, os.SEEK_END)
            if size < self.ENTRY.size:
                return None
            file.seek(size - self.ENTRY.size)
            return self.ENTRY.unpack(file.read(self.ENTRY.size))

    def _append(self, key: int, value: int) -> None:
        self._keys.append(key)
        self._values.append(value)

    def _keep(self, count: int) -> None:
        """Keep the first ``count`` entries, shrinking the file if it holds more."""
        del self._keys[count:]
        del self._values[count:]
        if self._written > count:
            os.truncate(self.path, count * self.ENTRY.size)
            self._written = count

    def _check(self, keys: array, values: array, log_size: int) -> None:
        raise NotImplementedError


class OffsetIndex(_SparseIndex):
    ENTRY = struct.Struct(">ii")
    KEY_TYPE = "i"  # relative offset
    VALUE_TYPE = "i"  # position

    def append(self, offset: int, position: int) -> None:
        """Index the batch starting at ``position`` whose last offset is ``offset``."""
        relative = offset - self.base_offset
        if self._keys and (relative <= self._keys[-1] or position <= self._values[-1]):
            raise ValueError(f"index entry ({offset}, {position}) does not follow the last one")
        self._append(relative, position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last entry whose offset <= ``offset``; (base offset, 0) when none.

        The batch holding ``offset`` starts at or after that position.
        """
        slot = bisect_right(self._keys, offset - self.base_offset) - 1
        if slot < 0:
            return self.base_offset, 0
        return self.base_offset + self._keys[slot], self._values[slot]

    def boundary_before(self, max_position: int, max_offset: int) -> tuple[int, int]:
        """The last batch start P with P <= max_position whose batch's last offset <= max_offset; (-1, -1) if none.

        Every batch before P then ends at or before P and has a last offset < max_offset: the fetch path jumps
        there instead of walking headers.
        """
        slot = min(bisect_right(self._values, max_position), bisect_right(self._keys, max_offset - self.base_offset)) - 1
        if slot < 0:
            return -1, -1
        return self.base_offset + self._keys[slot], self._values[slot]

    def last_entry(self) -> tuple[int, int]:
        pair = self._last_pair()
        if pair is None:
            return self.base_offset, 0
        return self.base_offset + pair[0], pair[1]

    def truncate_to(self, offset: int) -> None:
        """Remove entries for batches whose last offset >= ``offset``."""
        self._keep(bisect_right(self._keys, offset - self.base_offset - 1))

    def _check(self, keys: array, values: array, log_size: int) -> None:
        for i in range(len(keys)):
            if keys[i] < 0 or values[i] < 0 or values[i] >= max(log_size, 1):
                raise CorruptIndex(f"{self.path}: entry {i} ({keys[i]}, {values[i]}) is out of range")
            if i and (keys[i] <= keys[i - 1] or values[i] <= values[i - 1]):
                raise CorruptIndex(f"{self.path}: entry {i} does not increase")


class TimeIndex(_SparseIndex):
    ENTRY = struct.Struct(">qi")
    KEY_TYPE = "q"  # timestamp
    VALUE_TYPE = "i"  # relative offset

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Record (max timestamp so far, its offset) if the timestamp grew since the last entry."""
        if timestamp <= (self._keys[-1] if self._keys else -1):
            return
        relative = offset - self.base_offset
        if self._values and relative < self._values[-1]:
            raise ValueError(f"time index offset {offset} goes backwards")
        self._append(timestamp, relative)

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """(timestamp, offset) of the last entry with timestamp <= ``timestamp``; (-1, base offset) when none."""
        slot = bisect_right(self._keys, timestamp) - 1
        if slot < 0:
            return -1, self.base_offset
        return self._keys[slot], self.base_offset + self._values[slot]

    def last_entry(self) -> tuple[int, int]:
        """(max timestamp, its offset) as last recorded; (-1, base offset) when empty."""
        pair = self._last_pair()
        if pair is None:
            return -1, self.base_offset
        return pair[0], self.base_offset + pair[1]

    def truncate_to(self, offset: int) -> None:
        """Remove entries whose offset >= ``offset``."""
        count = len(self._values)
        while count and self._values[count - 1] >= offset - self.base_offset:
            count -= 1
        self._keep(count)

    def _check(self, keys: array, values: array, log_size: int) -> None:
        for i in range(len(keys)):
            if values[i] < 0:
                raise CorruptIndex(f"{self.path}: entry {i} has a negative offset")
            if i and (keys[i] <= keys[i - 1] or values[i] < values[i - 1]):
                raise CorruptIndex(f"{self.path}: entry {i} does not increase")

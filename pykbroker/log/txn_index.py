"""The transaction index of one segment: Kafka's ``<base offset>.txnindex`` (TransactionIndex.java).

One fixed-size entry per aborted transaction whose ABORT marker is in the segment, in marker order:

    version int16 (0), producer id int64, first offset int64, last offset int64, last stable offset int64

34 bytes, big-endian. ``first offset`` is the transaction's first offset in the partition (it may lie in
an earlier segment), ``last offset`` the marker's offset, ``last stable offset`` the LSO once the
transaction completed. A read_committed Fetch answers, from these files, the aborted transactions that
overlap the fetched range (Kafka's collectAbortedTransactions), so consumers can drop the aborted records.

The entries of a segment are few (one per aborted transaction), so they are kept in memory as well: a
fetch never reads the file. The file is appended to with the marker (34 bytes, like an offset-index entry)
and rewritten whole only when a truncation cuts entries; it is loaded when the log is opened (off the
event loop: logs open in the log manager's loading threads), and what recovery cut from the log is cut
from the index too (``truncate_to``).
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_left
from pathlib import Path
from typing import Iterable, NamedTuple

TXN_INDEX_SUFFIX = ".txnindex"
_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = _ENTRY.size  # 34
VERSION = 0


class AbortedTxn(NamedTuple):
    """An aborted transaction overlapping a range (``PartitionLog.aborted_ranges``)."""

    producer_id: int
    first_offset: int
    last_offset: int


class TxnIndexEntry(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def pack(self) -> bytes:
        return _ENTRY.pack(VERSION, *self)


class CorruptTxnIndex(ValueError):
    pass


def parse_entries(data: bytes) -> list[TxnIndexEntry]:
    """The entries of a ``.txnindex`` file; a torn last entry is ignored; a wrong version is CorruptTxnIndex."""
    entries = []
    for position in range(0, len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
        version, *fields = _ENTRY.unpack_from(data, position)
        if version != VERSION:
            raise CorruptTxnIndex(f"transaction index entry version {version} at byte {position}")
        entries.append(TxnIndexEntry(*fields))
    return entries


class TransactionIndex:
    """The aborted transactions of one segment, in memory and in its ``.txnindex`` file."""

    __slots__ = ("path", "entries", "_keys", "_lasts")

    def __init__(self, path: Path, entries: Iterable[TxnIndexEntry] = ()) -> None:
        self.path = path
        self._set(list(entries))

    def _set(self, entries: list[TxnIndexEntry]) -> None:
        self.entries = entries
        self._keys = {(e.producer_id, e.first_offset, e.last_offset) for e in entries}
        self._lasts = [e.last_offset for e in entries]  # ascending: a fetch bisects to its start offset

    @classmethod
    def for_segment(cls, directory: Path, base_offset: int) -> "TransactionIndex":
        return cls(directory / f"{base_offset:020d}{TXN_INDEX_SUFFIX}")

    @classmethod
    def load(cls, path: Path) -> "TransactionIndex":
        """Read a ``.txnindex`` file (an unreadable one starts empty: recovery rebuilds the entries it needs)."""
        try:
            entries = parse_entries(path.read_bytes())
        except (OSError, CorruptTxnIndex):
            entries = []
            path.unlink(missing_ok=True)
        return cls(path, entries)

    def __len__(self) -> int:
        return len(self.entries)

    def contains(self, producer_id: int, first_offset: int, last_offset: int) -> bool:
        return (producer_id, first_offset, last_offset) in self._keys

    def append(self, entry: TxnIndexEntry) -> None:
        """Add an entry (its marker is being appended to the segment): kept in memory, then written to the file
        (an OSError leaves it in memory only). An entry older than the last one (a replay found a marker whose
        entry a crash lost) is put in order and the file rewritten."""
        if (entry.producer_id, entry.first_offset, entry.last_offset) in self._keys:
            return
        if self.entries and entry.last_offset < self.entries[-1].last_offset:
            self._set(sorted([*self.entries, entry], key=lambda e: e.last_offset))
            self.rewrite()
            return
        self.entries.append(entry)  # in memory first: fetches see it even if the file write fails
        self._keys.add((entry.producer_id, entry.first_offset, entry.last_offset))
        self._lasts.append(entry.last_offset)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, entry.pack())
        finally:
            os.close(fd)

    def truncate_to(self, offset: int) -> bool:
        """Drop the entries whose marker is at or after ``offset`` (Kafka's truncateTo); True if any went."""
        keep = bisect_left(self._lasts, offset)
        if keep == len(self.entries):
            return False
        self._set(self.entries[:keep])
        self.rewrite()
        return True

    def rewrite(self) -> None:
        if not self.entries:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_bytes(b"".join(e.pack() for e in self.entries))
        os.replace(tmp, self.path)

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)

    def collect(self, start_offset: int, upper_bound: int, out: list[AbortedTxn]) -> bool:
        """Kafka's TransactionIndex.collectAbortedTxns: append the entries with last offset >= ``start_offset``
        and first offset < ``upper_bound``; True when an entry's LSO reached ``upper_bound`` (later segments
        cannot add any: Kafka's isComplete). Entries whose marker is below ``start_offset`` are skipped by
        bisection (Kafka walks them for their LSO only: later segments may then be read for nothing)."""
        for e in self.entries[bisect_left(self._lasts, start_offset):]:
            if e.last_offset >= start_offset and e.first_offset < upper_bound:
                out.append(AbortedTxn(e.producer_id, e.first_offset, e.last_offset))
            if e.last_stable_offset >= upper_bound:
                return True
        return False

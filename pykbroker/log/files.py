"""Descriptors for segment files: the process limit, and a budget of open files with LRU closing.

Kafka keeps every segment file open and asks operators to raise ``ulimit -n``; with a tiny
``segment.bytes`` or many partitions such a broker runs out of descriptors (EMFILE), refuses every new
connection, and cannot even restart. Here:

- ``raise_descriptor_limit()``, called once at broker start, raises the soft RLIMIT_NOFILE to the hard
  limit, logs both, and sizes the shared budget from the new limit: half the descriptors may hold segment
  files, the other half stays free for sockets and for the short-lived descriptors of index, checkpoint
  and fsync work (each of those is open only for one call).
- A ``LazyFile`` is opened on first use. Open lazy files form an LRU; opening one when the budget is
  used up closes the least recently used unpinned ones, which are reopened on their next use. A segment
  being appended to or read is touched on every use, so busy segments stay open and the produce and
  fetch paths cost one dictionary move per call; idle segments cost no descriptor.
- A descriptor that outlives the call that got it (a generator suspended between batches, a FileSlice
  waiting to be sent) is held through a ``Pin``: a pinned file is never closed by the budget, and a
  ``close()`` asked while it is pinned happens when the last pin goes. A pin is released by ``release()``
  or when it is dropped (reference counting), so the budget counts exactly the pins still held.
"""

from __future__ import annotations

import logging
import os
import resource
from collections import OrderedDict
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

# Never fewer than this many segment files open at once, whatever the limit: a log needs its active
# segment and the segment being read, and a fetch spanning a few segments must not thrash.
MIN_BUDGET = 8
# What an unlimited (RLIM_INFINITY) hard limit is taken to be: Linux's default fs.nr_open.
UNLIMITED_AS = 1 << 20


def budget_for_limit(limit: int) -> int:
    """How many segment files may be open under a descriptor limit."""
    if limit == resource.RLIM_INFINITY:
        limit = UNLIMITED_AS
    return max(limit // 2, MIN_BUDGET)


class DescriptorBudget:
    """The open lazy files: unpinned ones in LRU order (least recent first), pinned ones counted."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._idle: OrderedDict[LazyFile, None] = OrderedDict()
        self.pinned = 0

    @property
    def open_files(self) -> int:
        return len(self._idle) + self.pinned

    def can_pin_more(self) -> bool:
        """True while pins leave room in the budget (readers spanning many segments stop when it is False)."""
        return self.pinned < self.limit - 1

    def resize(self, limit: int) -> None:
        self.limit = limit
        self._make_room(0)

    def _make_room(self, wanted: int) -> None:
        """Close least recently used unpinned files until ``wanted`` more fit (pinned ones never close)."""
        idle = self._idle
        while idle and len(idle) + self.pinned + wanted > self.limit:
            oldest = next(iter(idle))
            oldest._close_now()


def _soft_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


shared_budget = DescriptorBudget(budget_for_limit(_soft_limit()))


def raise_descriptor_limit(budget: DescriptorBudget = shared_budget) -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit, size ``budget`` from it and log it; (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_AS if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
        else:
            log.info("raised the open-file limit (RLIMIT_NOFILE) from %d to the hard limit %d", soft, target)
            soft = target
    budget.resize(budget_for_limit(soft))
    log.info("open-file limit %d: up to %d segment files open at once, idle ones closed", soft, budget.limit)
    return soft, hard


class LazyFile:
    """A file opened on first use of ``fd`` and closed again when the budget needs room."""

    __slots__ = ("path", "_flags", "_budget", "_fd", "_pins", "_close_when_unpinned", "_closer")

    def __init__(self, path: Path, flags: int, budget: DescriptorBudget = shared_budget) -> None:
        self.path = path
        self._flags = flags
        self._budget = budget
        self._closer: Callable[[int], None] | None = None  # closes the fd after the last pin (detach)
        self._fd = -1
        self._pins = 0
        self._close_when_unpinned = False

    @classmethod
    def create(cls, path: Path, flags: int, budget: DescriptorBudget = shared_budget) -> "LazyFile":
        """Create (or empty) the file now and keep it open."""
        file = cls(path, flags, budget)
        file._open(flags | os.O_CREAT | os.O_TRUNC)
        return file

    @property
    def is_open(self) -> bool:
        return self._fd >= 0

    @property
    def fd(self) -> int:
        """The descriptor, opened now if needed; valid until the budget's next open unless pinned."""
        fd = self._fd
        if fd < 0:
            return self._open(self._flags)
        if not self._pins:
            self._budget._idle.move_to_end(self)
        return fd

    def _open(self, flags: int) -> int:
        """Open the file (never pinned here: a pinned file is never closed) as the most recently used."""
        budget = self._budget
        budget._make_room(1)
        self._fd = os.open(self.path, flags, 0o644)
        budget._idle[self] = None
        return self._fd

    def pin(self) -> "Pin":
        """Keep the file open until the returned pin is released or dropped."""
        fd = self.fd
        if not self._pins:
            del self._budget._idle[self]
            self._budget.pinned += 1
        self._pins += 1
        return Pin(self, fd)

    def _unpin(self) -> None:
        self._pins -= 1
        if self._pins:
            return
        self._budget.pinned -= 1
        if self._close_when_unpinned:
            self._release_fd()
        else:
            self._budget._idle[self] = None

    def close(self) -> None:
        """Close now, or when the last pin goes."""
        if self._pins:
            self._close_when_unpinned = True
        elif self._fd >= 0:
            self._close_now()

    def _close_now(self) -> None:
        del self._budget._idle[self]
        self._release_fd()

    def detach(self, closer: Callable[[int], None] | None = None) -> int:
        """Give up the descriptor without closing it: the caller closes it (in any thread: closing the last
        descriptor of an unlinked file frees its blocks, which can take long). -1 if the file is not open or
        pinned: then it closes when the last pin goes, as ``close``, through ``closer`` if given (e.g. one
        that queues the close to an I/O thread, since the last pin usually goes on the event loop)."""
        if self._pins:
            self._close_when_unpinned = True
            self._closer = closer
            return -1
        fd = self._fd
        if fd >= 0:
            del self._budget._idle[self]
            self._fd = -1
        return fd

    def _release_fd(self) -> None:
        fd, self._fd = self._fd, -1
        closer, self._closer = self._closer, None
        self._close_when_unpinned = False
        (closer or os.close)(fd)


class Pin:
    """An open descriptor of a LazyFile held beyond one call; ``with file.pin() as fd:`` or keep the object."""

    __slots__ = ("_file", "fd")

    def __init__(self, file: LazyFile, fd: int) -> None:
        self._file: LazyFile | None = file
        self.fd = fd

    def release(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file._unpin()

    def __enter__(self) -> int:
        return self.fd

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()

"""Processes seen through Linux's /proc, for tests that check what a command left running."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator


def each_process(name: str) -> Iterator[tuple[int, bytes]]:
    """(pid, the bytes of /proc/<pid>/<name>) for every process that is still there when its file is read."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            yield int(entry.name), (entry / name).read_bytes()
        except OSError:
            continue  # it exited meanwhile

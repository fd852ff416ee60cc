"""Small files that must never be seen half-written: Kafka's checkpoint text format and atomic replacement.

Kafka's checkpoint format, used for ``leader-epoch-checkpoint`` and the data directory's
``recovery-point-offset-checkpoint`` / ``log-start-offset-checkpoint`` (and pykbroker's producer-id block):
a version line ("0"), a count line, then one whitespace-separated entry per line. Every file here is
replaced atomically: temp file, fsync, rename, fsync of the directory so the rename survives a crash.
``CorruptFile`` is how any data-dir file that cannot be trusted stops the broker at start with one line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

CHECKPOINT_VERSION = 0


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: readers (and a restart after a crash) see the old or the new file."""
    temp = path.with_name(path.name + ".tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself must survive a crash
    finally:
        os.close(dir_fd)


class CorruptCheckpoint(ValueError):
    """A checkpoint file that cannot be parsed; the caller decides whether to rebuild or refuse."""


class CorruptFile(ValueError):
    """A data-dir file that is not what the broker wrote and cannot be rebuilt: the broker refuses to start.

    The message is one line: the file, what is wrong with it, and what the operator can do.
    """

    def __init__(self, path: Path, problem: str, remedy: str) -> None:
        super().__init__(f"{path} {problem}: {remedy}")
        self.path = path


def write_checkpoint(path: Path, entries: Iterable[Sequence[object]]) -> None:
    """Atomically replace ``path`` with a checkpoint holding ``entries`` (each a sequence of fields)."""
    lines = [" ".join(str(field) for field in entry) for entry in entries]
    write_atomically(path, f"{CHECKPOINT_VERSION}\n{len(lines)}\n" + "".join(line + "\n" for line in lines))


def read_checkpoint(path: Path, fields: int) -> list[list[str]] | None:
    """The entries of a checkpoint file (None if it does not exist); raises CorruptCheckpoint."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise CorruptCheckpoint(f"{path}: not text") from exc
    try:
        version, count = int(lines[0]), int(lines[1])
    except (IndexError, ValueError) as exc:
        raise CorruptCheckpoint(f"{path}: bad header") from exc
    if version != CHECKPOINT_VERSION:
        raise CorruptCheckpoint(f"{path}: unknown version {version}")
    entries = [line.split() for line in lines[2:] if line.strip()]
    if len(entries) != count or any(len(entry) != fields for entry in entries):
        raise CorruptCheckpoint(f"{path}: expected {count} entries of {fields} fields")
    return entries

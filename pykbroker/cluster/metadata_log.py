"""The embedded metadata store on disk: an append-only record journal plus a compacting snapshot.

Kafka keeps cluster metadata in a log (``__cluster_metadata``) and snapshots it when it grows; this is the
single-node equivalent, so that a change costs O(change) instead of rewriting every topic:

    <data-dir>/__cluster_metadata.snapshot   {"version": 1, "topics": [...]}, replaced atomically
    <data-dir>/__cluster_metadata.log        one record per line: "<crc32 hex> <json>\\n"

A record is the full state of one topic (``{"op": "topic", "topic": {...}}``), its removal
(``{"op": "delete", "name": ...}``) or the full set of dynamic broker configs of one entity
(``{"op": "config", "entity": "brokers/<id>" or "brokers/<default>", "config": {name: value}}``, Kafka's
ZooKeeper entity paths; an empty config removes the entity). The snapshot holds the latter as
``"configs": {entity: {name: value}}``; a snapshot or journal written before dynamic configs existed has
none, and loads as it did. ACLs: ``{"op": "acl", "pattern": [resource type, pattern type, name], "acls": [...]}``,
one resource pattern's whole ACL set (empty: none left); the snapshot holds them as ``"acls": [records]``. Records are idempotent, so replaying the journal on a snapshot that
already holds some of them gives the same state: the snapshot can be written first and the journal
truncated after it without any window where a crash loses a change.

Writes leave the event loop: ``append`` only buffers, ``commit`` hands the buffer to one worker thread
that writes and fsyncs it (changes made meanwhile share that fsync), and the returned future completes
when the records are durable. Once the journal holds more records than ``max(SNAPSHOT_MIN_RECORDS,
2 x topics)``, the next commit serialises a snapshot (on the caller's thread, so it is consistent) and
the worker writes it and empties the journal: snapshots cost O(1) amortised per change.

A write that fails (disk full) is cut back, and its records are written again by the next ``commit``,
even one with nothing new to write (so a CreateTopics that changes nothing still gets a fresh attempt,
never the stale failure); ``close`` makes a final attempt and logs an ERROR if the changes are still
not durable (they are then lost: the next start does not know them).

On load, a journal whose end is torn (a crash in the middle of a write: a last line without its
newline, or zeros) is cut back to its last whole record with a WARN. A whole line that is not a record,
or a snapshot/legacy file that is not what we wrote, raises ``CorruptFile`` (the broker refuses to
start and says which file and what to do). A data dir of an older pykbroker holds ``__cluster_metadata.json`` (the
snapshot format, rewritten on every change): it is read once, written as the snapshot, and removed.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from pykbroker.log.checkpoint import CorruptFile, write_atomically

log = logging.getLogger(__name__)

JOURNAL_FILE = "__cluster_metadata.log"
SNAPSHOT_FILE = "__cluster_metadata.snapshot"
LEGACY_FILE = "__cluster_metadata.json"
SNAPSHOT_VERSION = 1
SNAPSHOT_MIN_RECORDS = 1000

RESTORE_HINT = "restore the data dir from a backup, or move it aside to start an empty broker"


def encode_record(record: dict[str, Any]) -> bytes:
    body = json.dumps(record, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def _decode_line(line: bytes) -> dict[str, Any] | None:
    """The record on one journal line (without its newline), or None if the line is not a whole record."""
    crc, _, body = line.partition(b" ")
    try:
        if len(crc) != 8 or int(crc, 16) != zlib.crc32(body):
            return None
        record = json.loads(body)
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get("op") in ("topic", "delete", "config", "acl") else None


def read_snapshot_topics(path: Path) -> list[dict[str, Any]] | None:
    """The topic entries of a snapshot (or legacy metadata file); None if it does not exist."""
    document = read_snapshot(path)
    return None if document is None else document["topics"]


def read_snapshot(path: Path) -> dict[str, Any] | None:
    """A snapshot (or legacy metadata file) document, ``topics`` checked to be a list; None if absent."""
    try:
        text = path.read_bytes().decode()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise CorruptFile(path, "is not text", RESTORE_HINT) from None
    try:
        data = json.loads(text)
        topics = data["topics"]
        if data.get("version") != SNAPSHOT_VERSION or not isinstance(topics, list):
            raise ValueError(f"unknown version {data.get('version')!r}")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptFile(path, f"is not a pykbroker metadata snapshot ({exc})", RESTORE_HINT) from None
    return data


def _log_failure(future: Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("cannot write the metadata journal (retried with the next commit): %s", future.exception())


class MetadataLog:
    """The journal and snapshot of one data dir. ``load`` once, then ``append`` and ``commit``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.journal_path = self.data_dir / JOURNAL_FILE
        self.snapshot_path = self.data_dir / SNAPSHOT_FILE
        self._pending: list[bytes] = []  # append and commit run on the event loop only; the worker gets bytes
        self._journal_records = 0
        self._fd: int | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metadata-log")
        self._unwritten = b""  # worker thread only: records of a failed write, written with the next one
        self._last: Future = Future()
        self._last.set_result(None)

    # -- loading ---------------------------------------------------------------------------------------
    def load(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(snapshot topic entries, records after them: the snapshot's dynamic configs as config records,
        then the journal's), migrating a legacy file first."""
        snapshot = read_snapshot(self.snapshot_path)
        topics = None if snapshot is None else snapshot["topics"]
        configs = (snapshot or {}).get("configs") or {}
        if not isinstance(configs, dict):
            raise CorruptFile(self.snapshot_path, "holds malformed dynamic configs", RESTORE_HINT)
        legacy = self.data_dir / LEGACY_FILE
        if topics is None and legacy.exists():
            topics = read_snapshot_topics(legacy) or []
            write_atomically(self.snapshot_path, json.dumps({"version": SNAPSHOT_VERSION, "topics": topics}))
            legacy.unlink()
            log.info("converted %s (%d topics) to the metadata snapshot and journal", legacy, len(topics))
        records = self._read_journal()
        self._journal_records = len(records)
        records = [{"op": "config", "entity": entity, "config": config} for entity, config in configs.items()] + records
        acls = (snapshot or {}).get("acls") or []
        if not isinstance(acls, list) or not all(isinstance(r, dict) and r.get("op") == "acl" for r in acls):
            raise CorruptFile(self.snapshot_path, "holds malformed ACL records", RESTORE_HINT)
        records = acls + records
        self._fd = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return topics or [], records

    def _read_journal(self) -> list[dict[str, Any]]:
        try:
            data = self.journal_path.read_bytes()
        except FileNotFoundError:
            return []
        records: list[dict[str, Any]] = []
        position = 0
        while position < len(data):
            end = data.find(b"\n", position)
            record = _decode_line(data[position:end]) if end >= 0 else None
            if record is None:
                tail = data[position:]
                if end >= 0 and tail.strip(b"\0"):  # a whole line that is not a record: not a torn write
                    raise CorruptFile(
                        self.journal_path, f"holds a damaged record at byte {position}", RESTORE_HINT
                    )
                log.warning(
                    "%s: cutting a torn last record (%d bytes at byte %d), left by a crash in the middle of a write",
                    self.journal_path, len(tail), position,
                )
                os.truncate(self.journal_path, position)
                break
            records.append(record)
            position = end + 1
        return records

    # -- writing ---------------------------------------------------------------------------------------
    def append(self, record: dict[str, Any]) -> None:
        """Buffer one record (event loop); it is written by the next ``commit``."""
        self._pending.append(encode_record(record))

    def commit(self, topic_count: int, snapshot_of: Callable[[], list[dict[str, Any]]],
               configs_of: Callable[[], dict[str, dict[str, str]]] | None = None,
               acls_of: Callable[[], list[dict[str, Any]]] | None = None) -> Future:
        """Write what is buffered (in the worker thread); the future completes once it is fsynced.

        ``snapshot_of`` returns every topic's entry; it is called here, on the caller's thread, only when
        the journal has outgrown ``max(SNAPSHOT_MIN_RECORDS, 2 x topic_count)``, so the snapshot is
        consistent with the buffered records; so are ``configs_of``, the dynamic configs by entity, and
        ``acls_of``, the "acl" records of every resource pattern with ACLs.
        """
        pending, self._pending = self._pending, []
        if not pending and not self._last_failed():
            return self._last
        self._journal_records += len(pending)
        snapshot: str | None = None
        if self._journal_records > max(SNAPSHOT_MIN_RECORDS, 2 * topic_count):
            document: dict[str, Any] = {"version": SNAPSHOT_VERSION, "topics": snapshot_of()}
            configs = configs_of() if configs_of is not None else {}
            if configs:
                document["configs"] = configs
            acls = acls_of() if acls_of is not None else []
            if acls:
                document["acls"] = acls
            snapshot = json.dumps(document)
            self._journal_records = 0
        self._last = self._executor.submit(self._write, b"".join(pending), snapshot)
        self._last.add_done_callback(_log_failure)
        return self._last

    def _last_failed(self) -> bool:
        last = self._last
        return last.done() and (last.cancelled() or last.exception() is not None)

    def _write(self, data: bytes, snapshot: str | None) -> None:
        """Worker thread. A failed write (disk full) is cut back and retried with the next commit."""
        assert self._fd is not None, "load() first"
        data = self._unwritten = self._unwritten + data
        if snapshot is None:
            size = os.fstat(self._fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view):]
                os.fsync(self._fd)
            except OSError:
                os.ftruncate(self._fd, size)  # no half record left behind
                raise
        else:
            # The snapshot holds everything buffered so far, these records included: write it, then empty
            # the journal. A crash in between replays old (idempotent) records on the new snapshot.
            write_atomically(self.snapshot_path, snapshot)
            os.ftruncate(self._fd, 0)
            os.fsync(self._fd)
        self._unwritten = b""

    def close(self) -> None:
        """Wait for every commit to be durable and release the journal. Call ``commit`` first: it is the
        final attempt at a write that failed; if that fails too, the changes are lost and an ERROR says so."""
        self._executor.shutdown(wait=True)
        if self._last_failed():
            log.error(
                "%s: metadata changes are lost, the last journal write failed at shutdown (%s); the next start "
                "does not know them", self.journal_path, "cancelled" if self._last.cancelled() else self._last.exception(),
            )
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

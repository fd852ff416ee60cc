"""LogManager and topic ids: partition.metadata, logs set aside as -stray, names that fit in 255 bytes."""

from __future__ import annotations

import logging
import uuid

import pytest

from pykbroker.log import checkpoint
from pykbroker.log.checkpoint import CorruptFile
from pykbroker.log.config import LogConfig
from pykbroker.log.manager import LogManager, read_partition_metadata, write_partition_metadata
from pykbroker.protocol.records import build_batch

CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=256)
LONG = "x" * 249  # Kafka's longest legal topic name


def config_for(_topic: str) -> LogConfig:
    return CONFIG


def write_logs(path, logs: dict[tuple[str, int], uuid.UUID | None]) -> None:
    manager = LogManager(path)
    for (topic, partition), topic_id in logs.items():
        log = manager.create(topic, partition, CONFIG, topic_id=topic_id)
        log.append(build_batch([(None, b"v")]), leader_epoch=0, now_ms=0)
    manager.shutdown()


def test_logs_are_kept_adopted_or_set_aside_by_topic_id(tmp_path, caplog):
    ours, other = uuid.uuid4(), uuid.uuid4()
    write_logs(tmp_path, {("kept", 0): ours, ("old", 0): None, ("kept", 1): other, ("kept", 7): ours,
                          ("gone", 0): ours, (LONG, 0): ours})
    known = {("kept", 0): ours, ("kept", 1): ours, ("old", 0): ours}
    manager = LogManager(tmp_path)
    with caplog.at_level(logging.WARNING):
        loaded = manager.load_all(config_for, lambda topic, partition: known.get((topic, partition)))
    assert sorted((log.topic, log.partition) for log in loaded) == [("kept", 0), ("old", 0)]
    assert read_partition_metadata(tmp_path / "old-0") == ours  # an older pykbroker's log: adopted
    strays = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith("-stray"))
    assert [name.rsplit(".", 1)[0] for name in strays[:3]] == ["gone-0", "kept-1", "kept-7"]
    assert strays[3].startswith("x" * 200) and len(strays[3]) == 255  # cut to fit, as Kafka does
    assert caplog.text.count("not served") == 4 and "not the topic's" in caplog.text
    manager.shutdown()


def test_deleting_a_topic_with_the_longest_name(tmp_path):
    write_logs(tmp_path, {(LONG, 0): uuid.uuid4()})
    manager = LogManager(tmp_path)
    manager.load_all(config_for)
    manager.remove_deleted(manager.delete_topic(LONG))
    manager.shutdown()
    assert not any(tmp_path.glob("x*"))


def test_an_unreadable_partition_metadata_stops_the_load(tmp_path):
    ours = uuid.uuid4()
    write_logs(tmp_path, {("t", 0): ours})
    (tmp_path / "t-0" / "partition.metadata").write_text("topic_id: !!\n")
    manager = LogManager(tmp_path)
    with pytest.raises(CorruptFile, match="partition.metadata"):
        manager.load_all(config_for, lambda topic, partition: ours)
    manager.shutdown()


def test_partition_metadata_is_replaced_atomically(tmp_path, monkeypatch):
    """Written to partition.metadata.tmp and renamed over the file: a failure part-way keeps the old file."""
    old, new = uuid.uuid4(), uuid.uuid4()
    write_partition_metadata(tmp_path, old)

    def crash(src, dst):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(checkpoint.os, "replace", crash)
    with pytest.raises(OSError):
        write_partition_metadata(tmp_path, new)
    assert read_partition_metadata(tmp_path) == old
    monkeypatch.undo()
    write_partition_metadata(tmp_path, new)
    assert read_partition_metadata(tmp_path) == new
    assert sorted(p.name for p in tmp_path.iterdir()) == ["partition.metadata"]


def test_an_empty_partition_metadata_is_adopted_and_rewritten(tmp_path, caplog):
    ours = uuid.uuid4()
    write_logs(tmp_path, {("t", 0): ours})
    (tmp_path / "t-0" / "partition.metadata").write_bytes(b"")
    manager = LogManager(tmp_path)
    with caplog.at_level(logging.WARNING):
        loaded = manager.load_all(config_for, lambda topic, partition: ours)
    assert [(log.topic, log.partition, log.log_end_offset) for log in loaded] == [("t", 0, 1)]
    assert read_partition_metadata(tmp_path / "t-0") == ours
    assert "is empty" in caplog.text
    manager.shutdown()

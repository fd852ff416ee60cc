"""Topic deletion and the metadata journal: log directories go only once the deletion is durable.

Kafka's order: the deletion is committed (metadata log) before any log is deleted. A deleted topic stops
being served at once; its directories are renamed to ``*-delete`` and removed after the commit succeeded.
If the journal write fails (disk full) they stay, and a restart with the deletion lost serves them again.
"""

from __future__ import annotations

import logging
import time

import pytest

from pykbroker.cluster import metadata_log
from pykbroker.cluster.metadata import EmbeddedMetadata
from pykbroker.cluster.topic_admin import TopicAdmin
from pykbroker.config import BrokerConfig
from pykbroker.log.manager import LogManager
from pykbroker.protocol.records import build_batch
from pykbroker.replication.replica_manager import ReplicaManager


class Node:
    """The storage half of a broker: log manager, metadata, replicas and the topic admin."""

    def __init__(self, path) -> None:
        self.logs = LogManager(path)
        self.metadata = EmbeddedMetadata(path, 1, "127.0.0.1", 9092)
        self.replicas = ReplicaManager(self.logs, 1, lambda topic: self.admin.log_config(topic))
        self.admin = TopicAdmin(BrokerConfig(data_dir=path, port=0), self.metadata, self.replicas)
        self.logs.load_all(self.admin.log_config, self.admin.topic_id_of)
        self.admin.host_all()

    def close(self) -> None:
        self.logs.shutdown()
        self.metadata.close()


def log_dirs(path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.is_dir() and p.name.startswith("t-"))


def disk_full(fd, data):
    raise OSError(28, "No space left on device")


@pytest.fixture
def node_with_topic(tmp_path):
    node = Node(tmp_path)
    info = node.admin.create("t", 2)
    node.admin._host(info)
    node.admin.commit().result(10)
    node.replicas.partition("t", 0).log.append(build_batch([(None, b"kept")] * 3), leader_epoch=0, now_ms=0)
    return node


def test_a_deletion_whose_journal_write_fails_keeps_the_directories(tmp_path, node_with_topic, monkeypatch, caplog):
    node = node_with_topic
    monkeypatch.setattr(metadata_log.os, "write", disk_full)
    node.admin.delete("t")
    assert node.replicas.partition("t", 0) is None  # no longer served, at once
    with pytest.raises(OSError):
        node.admin.commit().result(10)
    with caplog.at_level(logging.ERROR):
        node.metadata.close()  # the final journal attempt fails too: the deletion is lost
    assert "metadata changes are lost" in caplog.text
    monkeypatch.undo()  # os.write is every module's: the log manager's checkpoints need it back
    node.logs.shutdown()
    dirs = log_dirs(tmp_path)
    assert len(dirs) == 2 and all(name.endswith("-delete") for name in dirs), dirs
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again = Node(tmp_path)  # the metadata still has t: its logs are served again, data intact
    assert again.metadata.topic("t") is not None
    assert log_dirs(tmp_path) == ["t-0", "t-1"]
    assert again.replicas.partition("t", 0).log.log_end_offset == 3
    assert caplog.text.count("renamed back") == 2
    again.close()


def test_a_durable_deletion_removes_the_directories(tmp_path, node_with_topic):
    node = node_with_topic
    node.admin.delete("t")
    node.admin.commit().result(10)
    deadline = time.monotonic() + 10  # the commit's callback hands them to the remover thread
    while log_dirs(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log_dirs(tmp_path) == []
    node.close()
    again = Node(tmp_path)
    assert again.metadata.topic("t") is None and log_dirs(tmp_path) == []
    again.close()


def test_a_deletion_made_durable_by_a_later_commit_is_finished_at_the_next_start(tmp_path, node_with_topic, monkeypatch):
    node = node_with_topic
    real_write = metadata_log.os.write
    monkeypatch.setattr(metadata_log.os, "write", disk_full)
    node.admin.delete("t")
    with pytest.raises(OSError):
        node.admin.commit().result(10)
    monkeypatch.setattr(metadata_log.os, "write", real_write)
    node.close()  # the final attempt succeeds: the deletion is durable, its directories left for the load
    again = Node(tmp_path)
    assert again.metadata.topic("t") is None and log_dirs(tmp_path) == []
    again.close()


def test_a_topic_re_created_before_the_deletion_is_durable_starts_empty(tmp_path, node_with_topic):
    node = node_with_topic
    node.admin.delete("t")
    info = node.admin.create("t", 1)
    node.admin._host(info)
    assert node.replicas.partition("t", 0).log.log_end_offset == 0
    node.admin.commit().result(10)
    node.close()
    again = Node(tmp_path)
    assert again.metadata.topic("t").topic_id == info.topic_id
    assert log_dirs(tmp_path) == ["t-0"] and again.replicas.partition("t", 0).log.log_end_offset == 0
    again.close()

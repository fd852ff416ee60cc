"""A storage error during an append (disk full) is a per-partition KAFKA_STORAGE_ERROR, not a crash.

The integration test (tests/integration/test_storage_faults.py) fills a real tmpfs; this one injects ENOSPC
so the mapping is checked also where mounting is not permitted.
"""

from __future__ import annotations

import errno
import os

from pykbroker.log.config import LogConfig
from pykbroker.log.manager import LogManager
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.records import build_batch
from pykbroker.replication.replica_manager import ReplicaManager


def test_enospc_answers_kafka_storage_error_once_logged_and_the_partition_recovers(tmp_path, monkeypatch, caplog):
    manager = LogManager(tmp_path / "data")
    replicas = ReplicaManager(manager, 1, lambda topic: LogConfig())
    replicas.host("t", 0, leader_epoch=0)

    def append(value: bytes):
        return replicas.append("t", 0, build_batch([(None, value)]), acks=-1, min_insync_replicas=1)

    assert append(b"first").base_offset == 0

    def disk_full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    caplog.set_level("INFO", logger="pykbroker.replication.replica_manager")
    with monkeypatch.context() as patch:
        patch.setattr(os, "pwrite", disk_full)
        refused = [append(b"refused") for _ in range(3)]
    assert [outcome.error for outcome in refused] == [ErrorCode.kafka_storage_error] * 3
    assert all("No space left on device" in outcome.message for outcome in refused)
    assert (append(b"second").error, append(b"third").base_offset) == (ErrorCode.none, 2)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "t-0: append failed ([Errno 28] No space left on device); "
                    "answering KAFKA_STORAGE_ERROR until appends succeed again"),
        ("INFO", "t-0: appends succeed again after storage errors"),
    ]
    assert replicas.partition("t", 0).log.log_end_offset == 3
    manager.shutdown()

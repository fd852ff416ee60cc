"""A storage error during an append (disk full) is a per-partition KAFKA_STORAGE_ERROR, not a crash, logged
per log directory, not per partition.

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
from pykbroker.replication.replica_manager import ReplicaManager, StorageErrorLog


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
    data = tmp_path / "data"
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"log dir {data}: append to t-0 failed ([Errno 28] No space left on device); answering "
                    "KAFKA_STORAGE_ERROR for appends that fail there until one succeeds again, with one line a "
                    "minute at most (1 append(s) to 1 partition(s) refused so far)"),
        ("INFO", f"log dir {data}: appends succeed again after storage errors "
                 "(2 more append(s) to 1 partition(s) refused since the last warning)"),
    ]
    assert replicas.partition("t", 0).log.log_end_offset == 3
    manager.shutdown()


def test_a_full_disk_under_many_partitions_logs_per_directory_not_per_partition(tmp_path, monkeypatch, caplog):
    manager = LogManager(tmp_path / "data")
    replicas = ReplicaManager(manager, 1, lambda topic: LogConfig())
    clock = [1000.0]
    replicas.storage_errors = StorageErrorLog(interval_s=60, clock=lambda: clock[0])
    partitions = 40
    for index in range(partitions):
        replicas.host("t", index, leader_epoch=0)

    def append_everywhere() -> list[ErrorCode]:
        return [replicas.append("t", index, build_batch([(None, b"v")]), acks=-1, min_insync_replicas=1).error
                for index in range(partitions)]

    def disk_full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    caplog.set_level("INFO", logger="pykbroker.replication.replica_manager")
    with monkeypatch.context() as patch:
        patch.setattr(os, "pwrite", disk_full)
        assert set(append_everywhere()) == {ErrorCode.kafka_storage_error}
        assert [r.levelname for r in caplog.records] == ["WARNING"]  # one line, not one per partition
        clock[0] += 30
        append_everywhere()
        assert len(caplog.records) == 1  # within the minute: counted, not logged
        clock[0] += 31
        assert set(append_everywhere()) == {ErrorCode.kafka_storage_error}
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING"]  # the first refusal past the minute
    assert "appends still fail: 80 append(s) to 40 partition(s) refused in the last 61 s" in \
        caplog.records[1].getMessage()
    assert set(append_everywhere()) == {ErrorCode.none}  # space is back: every partition appends again
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING", "INFO"]
    assert "appends succeed again after storage errors (39 more append(s) to 39 partition(s)" in \
        caplog.records[2].getMessage()
    manager.shutdown()


def test_a_directory_that_flaps_logs_a_bounded_number_of_lines_an_interval(tmp_path, caplog):
    clock = [5.0]
    errors = StorageErrorLog(interval_s=60, burst=3, clock=lambda: clock[0])
    caplog.set_level("INFO", logger="pykbroker.replication.replica_manager")
    failure = OSError(errno.EIO, "Input/output error")
    for _ in range(100):  # one partition keeps failing while another appends
        errors.failed(tmp_path, ("t", 0), failure)
        errors.succeeded(tmp_path)
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"] * 3
    assert not errors.any_failing
    clock[0] += 60
    errors.failed(tmp_path, ("t", 1), failure)  # a new interval: the count of what went unlogged
    assert errors.any_failing
    assert caplog.records[-1].getMessage().endswith("(98 append(s) to 2 partition(s) refused so far)")

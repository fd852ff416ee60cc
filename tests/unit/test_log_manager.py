"""LogManager: loading, clean and unclean restarts, checkpoints, topic deletion, background upkeep."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pykbroker.log.config import LogConfig
from pykbroker.log.errors import LogDirectoryInUse
from pykbroker.log.manager import CLEAN_SHUTDOWN_MARKER, RECOVERY_POINT_CHECKPOINT, LogManager
from pykbroker.protocol.records import build_batch, iter_headers

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=256)


def config_for(_topic: str) -> LogConfig:
    return CONFIG


def produce(manager: LogManager, topic: str, partition: int, count: int) -> None:
    log = manager.create(topic, partition, CONFIG)
    for i in range(count):
        log.append(build_batch([(None, b"%s-%d" % (topic.encode(), i))] * 2, timestamp_ms=i), leader_epoch=0, now_ms=i)


def base_offsets(manager: LogManager, topic: str, partition: int) -> list[int]:
    log = manager.get(topic, partition)
    return [h.base_offset for h in iter_headers(log.read(log.log_start_offset, 1 << 30).read_bytes())]


def test_create_is_idempotent_and_uses_kafka_dir_names(tmp_path):
    manager = LogManager(tmp_path)
    log = manager.create("orders", 2, CONFIG)
    assert manager.create("orders", 2, CONFIG) is log
    assert manager.get("orders", 2) is log and manager.get("orders", 3) is None
    assert (tmp_path / "orders-2" / "00000000000000000000.log").exists()
    assert manager.logs() == [log]
    manager.shutdown()


def test_clean_shutdown_then_load_keeps_offsets(tmp_path):
    manager = LogManager(tmp_path)
    produce(manager, "a", 0, 40)
    produce(manager, "b.c-d", 1, 3)
    manager.shutdown()
    assert (tmp_path / CLEAN_SHUTDOWN_MARKER).exists()
    checkpoint = (tmp_path / RECOVERY_POINT_CHECKPOINT).read_text().splitlines()
    assert checkpoint[:2] == ["0", "2"] and sorted(checkpoint[2:]) == ["a 0 80", "b.c-d 1 6"]

    again = LogManager(tmp_path)
    loaded = again.load_all(config_for)
    assert sorted((log.topic, log.partition, log.log_end_offset) for log in loaded) == [("a", 0, 80), ("b.c-d", 1, 6)]
    assert not (tmp_path / CLEAN_SHUTDOWN_MARKER).exists()  # written again only at the next clean shutdown
    assert base_offsets(again, "a", 0) == list(range(0, 80, 2))
    produce(again, "a", 0, 1)
    assert again.get("a", 0).log_end_offset == 82
    again.shutdown()


CRASHING_BROKER = """
import os, sys
from pykbroker.log.config import LogConfig
from pykbroker.log.manager import LogManager
from pykbroker.protocol.records import build_batch
manager = LogManager(sys.argv[1])
log = manager.create("t", 0, LogConfig(segment_bytes=2048, index_interval_bytes=256))
for i in range(30):
    log.append(build_batch([(None, b"t-%d" % i)] * 2, timestamp_ms=i), leader_epoch=0, now_ms=i)
log.flush()
manager.write_checkpoints()
for i in range(30, 35):  # appended after the last checkpoint, never flushed
    log.append(build_batch([(None, b"t-%d" % i)] * 2, timestamp_ms=i), leader_epoch=0, now_ms=i)
os._exit(0)  # dies: no shutdown, no clean-shutdown marker
"""


def test_unclean_restart_recovers_a_torn_tail(tmp_path):
    subprocess.run([sys.executable, "-c", CRASHING_BROKER, str(tmp_path)], check=True, cwd=REPO_ROOT)
    assert not (tmp_path / CLEAN_SHUTDOWN_MARKER).exists()
    segments = sorted((tmp_path / "t-0").glob("*.log"))
    intact_size = os.path.getsize(segments[-1])
    with open(segments[-1], "ab") as file:
        file.write(b"\x00\x00\x00\x00\x00\x00\x00\x3c\x00\x00\x01")  # a torn batch header
    again = LogManager(tmp_path)
    (recovered,) = again.load_all(config_for)
    assert recovered.log_end_offset == 70
    assert base_offsets(again, "t", 0) == list(range(0, 70, 2))
    assert os.path.getsize(segments[-1]) == intact_size
    assert (tmp_path / CLEAN_SHUTDOWN_MARKER).exists() is False
    again.shutdown()


def test_log_start_offset_survives_restart(tmp_path):
    manager = LogManager(tmp_path)
    produce(manager, "t", 0, 10)
    manager.get("t", 0).delete_records_before(7)
    manager.shutdown()
    again = LogManager(tmp_path)
    again.load_all(config_for)
    assert again.get("t", 0).log_start_offset == 7
    again.shutdown()


def _open_segments_named(fragment: str) -> int:
    """This process's descriptors on segment files whose path contains ``fragment`` (not the directories
    that the remover thread's rmtree may hold open)."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
            count += fragment in link and ".log" in link
        except OSError:  # the listing's own descriptor, gone already
            pass
    return count


def test_delete_topic_removes_directories_but_keeps_fetches_in_flight_readable(tmp_path):
    manager = LogManager(tmp_path)
    produce(manager, "gone", 0, 5)
    produce(manager, "gone", 1, 5)
    produce(manager, "kept", 0, 5)
    in_flight = manager.get("gone", 1).read(0, 1 << 20)
    long_poll = manager.get("gone", 0)  # a parked fetch still holds the partition's log
    doomed = manager.delete_topic("gone")
    assert manager.get("gone", 0) is None and manager.get("gone", 1) is None
    # Renamed aside at once; the files go (in the remover thread, which shutdown waits for) only when the
    # deletion is durable and the topic admin hands them to remove_deleted.
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir() and p.name.endswith("-delete")) == \
        sorted(d.name for d in doomed)
    assert manager.take_deleted() == doomed and manager.take_deleted() == []
    # Closed at once but for the pinned one, which the fetch in flight still reads.
    assert _open_segments_named("/gone-") == 1
    assert [h.base_offset for h in iter_headers(in_flight.read_bytes())] == [0, 2, 4, 6, 8]
    assert long_poll.read(0, 1 << 20).slices == []  # reads empty, does not reopen a deleted file
    del in_flight
    assert _open_segments_named("/gone-") == 0
    manager.remove_deleted(doomed)
    manager.shutdown()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["kept-0"]


def test_load_finishes_interrupted_deletions(tmp_path):
    (tmp_path / "old-0.0123456789abcdef0123456789abcdef-delete").mkdir()
    (tmp_path / "old-0.0123456789abcdef0123456789abcdef-delete" / "00000000000000000000.log").write_bytes(b"x")
    (tmp_path / "not a log dir").mkdir()
    manager = LogManager(tmp_path)
    assert manager.load_all(config_for) == []
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["not a log dir"]
    manager.shutdown()


def test_data_dir_lock(tmp_path):
    manager = LogManager(tmp_path)
    with pytest.raises(LogDirectoryInUse):
        LogManager(tmp_path)
    manager.shutdown()
    LogManager(tmp_path).shutdown()  # released at shutdown


def test_background_task_flushes_checkpoints_and_applies_retention(tmp_path):
    async def scenario() -> None:
        manager = LogManager(tmp_path, flush_interval_ms=20, retention_check_interval_ms=20)
        retained = LogConfig(segment_bytes=2048, index_interval_bytes=256, retention_ms=1_000)
        log = manager.create("t", 0, retained)
        for i in range(60):
            log.append(build_batch([(None, b"v" * 20)] * 2, timestamp_ms=i), leader_epoch=0, now_ms=i)
        task = asyncio.create_task(manager.run_background())
        checkpoint = tmp_path / RECOVERY_POINT_CHECKPOINT
        for _ in range(500):  # wait for the condition, not for a duration
            await asyncio.sleep(0.01)
            if checkpoint.exists() and "t 0 120" in checkpoint.read_text() and len(log.segment_base_offsets) == 1:
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert log.recovery_point == 120
        assert "t 0 120" in checkpoint.read_text()
        assert len(log.segment_base_offsets) == 1 and log.log_start_offset > 0  # old segments expired
        manager.shutdown()

    asyncio.run(scenario())


def test_with_fsync_never_the_upkeep_still_takes_interval_producer_snapshots(tmp_path, monkeypatch):
    """fsync=never flushes only rolled logs; a big active segment still gets a producer snapshot every
    SNAPSHOT_INTERVAL_BYTES, so a truncation does not replay it whole."""
    monkeypatch.setattr("pykbroker.log.partition_log.SNAPSHOT_INTERVAL_BYTES", 1000)

    async def scenario() -> None:
        manager = LogManager(tmp_path, fsync="never", flush_interval_ms=20, retention_check_interval_ms=10_000)
        log = manager.create("t", 0, LogConfig())
        log.load_producer_state()  # (hosted: its producer state covers the log)
        now = int(time.time() * 1000)  # (no roll by segment.ms)
        for seq in range(40):
            batch = build_batch([(None, b"v" * 20)], timestamp_ms=now, producer_id=1, producer_epoch=0, base_sequence=seq)
            log.producer_state.update(log.append(batch, leader_epoch=0, now_ms=now).headers[0], -1)
        task = asyncio.create_task(manager.run_background())
        for _ in range(500):  # wait for the condition, not for a duration
            await asyncio.sleep(0.01)
            if log.snapshot_offsets:
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert log.snapshot_offsets == [40] and len(log.segment_base_offsets) == 1
        manager.shutdown()

    asyncio.run(scenario())


def test_the_upkeep_never_rolls_an_idle_segment(tmp_path):
    """Kafka rolls by segment.ms only when an append finds it exceeded: an idle active segment stays active
    (so the cleaner never compacts it) however old it gets."""

    async def scenario() -> None:
        manager = LogManager(tmp_path, flush_interval_ms=20, retention_check_interval_ms=20)
        log = manager.create("t", 0, LogConfig(segment_ms=1, cleanup_policy="compact"))
        log.append(build_batch([(b"k", b"v")], timestamp_ms=0), leader_epoch=0, now_ms=0)
        task = asyncio.create_task(manager.run_background())
        for _ in range(500):  # a flush or two: the upkeep has had its rounds
            await asyncio.sleep(0.01)
            if log.recovery_point == 1 and (tmp_path / RECOVERY_POINT_CHECKPOINT).exists():
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert log.recovery_point == 1
        assert log.segment_base_offsets == [0]
        log.append(build_batch([(b"k", b"w")], timestamp_ms=2), leader_epoch=0, now_ms=2)  # the next append rolls
        assert log.segment_base_offsets == [0, 1]
        manager.shutdown()

    asyncio.run(scenario())


def _with_expired_segment(manager: LogManager, topic: str, config: LogConfig):
    """A log whose first segment is past retention.ms (records an hour old) and whose second is recent."""
    log = manager.create(topic, 0, config)
    now = int(time.time() * 1000)
    log.append(build_batch([(b"k", b"old")], timestamp_ms=now - 3_600_000), leader_epoch=0, now_ms=now)
    log.roll()
    log.append(build_batch([(b"k", b"new")], timestamp_ms=now), leader_epoch=0, now_ms=now)
    return log


def test_the_retention_check_skips_compacted_logs_whose_retention_is_the_cleaners(tmp_path):
    """Kafka's LogManager.cleanupLogs covers the logs without compact only; with the cleaner disabled a
    compact,delete log keeps its expired segments, as in Kafka."""
    from pykbroker.log.cleaner import CleanerConfig

    async def scenario() -> None:
        manager = LogManager(tmp_path, retention_check_interval_ms=20, cleaner=CleanerConfig(enable=False))
        deleting = _with_expired_segment(manager, "d", LogConfig(retention_ms=600_000))
        both = _with_expired_segment(manager, "cd", LogConfig(retention_ms=600_000, cleanup_policy="compact,delete"))
        task = asyncio.create_task(manager.run_background())
        for _ in range(500):
            await asyncio.sleep(0.01)
            if deleting.log_start_offset == 1:
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert deleting.segment_base_offsets == [1] and deleting.log_start_offset == 1
        assert both.segment_base_offsets == [0, 1] and both.log_start_offset == 0
        manager.shutdown()

    asyncio.run(scenario())


def test_the_cleaner_applies_retention_to_compacted_logs_every_round(tmp_path):
    """Kafka's LogCleaner.cleanFilthiestLog: after each round's cleaning (or none), deleteOldSegments on every
    compacted log (retention.ms and retention.bytes only for compact,delete)."""
    manager = LogManager(tmp_path, retention_check_interval_ms=3_600_000)
    manager.cleaner.use_processes = False
    both = _with_expired_segment(manager, "cd", LogConfig(retention_ms=600_000, cleanup_policy="compact,delete"))
    compact = _with_expired_segment(manager, "c", LogConfig(retention_ms=600_000, cleanup_policy="compact"))
    deleting = _with_expired_segment(manager, "d", LogConfig(retention_ms=600_000))
    manager.cleaner._in_progress.add(("cd", 0))  # a log another cleaner loop is cleaning is left alone
    assert asyncio.run(manager.cleaner.clean_filthiest()) is False  # nothing to clean: still a round
    assert both.segment_base_offsets == [0, 1]
    manager.cleaner._in_progress.clear()
    assert asyncio.run(manager.cleaner.clean_filthiest()) is False
    assert both.segment_base_offsets == [1] and both.log_start_offset == 1
    assert compact.segment_base_offsets == [0, 1]  # compact only: no time retention
    assert deleting.segment_base_offsets == [0, 1]  # the retention check's, not the cleaner's
    assert not (tmp_path / "cd-0" / "00000000000000000000.log").exists()
    manager.shutdown()


def test_retention_respects_the_high_watermark(tmp_path):
    manager = LogManager(tmp_path)
    retained = LogConfig(segment_bytes=2048, index_interval_bytes=256, retention_ms=0)
    log = manager.create("t", 0, retained)
    for i in range(60):
        log.append(build_batch([(None, b"v" * 20)] * 2, timestamp_ms=0), leader_epoch=0, now_ms=0)
    manager.high_watermark_of = lambda topic, partition: 0
    assert manager.apply_retention(10**9) == 0
    manager.high_watermark_of = lambda topic, partition: log.log_end_offset
    assert manager.apply_retention(10**9) > 0
    manager.shutdown()


def test_retention_leaves_a_log_no_partition_hosts_yet_above_its_log_start(tmp_path):
    """At startup every log is loaded before LeaderAndIsr hosts it; until then Kafka's HWM is the log start
    (Partition.createLog sets it), so neither the retention check nor the cleaner's round may delete an
    expired segment past it, nor roll and move the log start to the log end."""
    from pykbroker.replication.replica_manager import ReplicaManager

    manager = LogManager(tmp_path, retention_check_interval_ms=3_600_000)
    manager.cleaner.use_processes = False
    expired = LogConfig(retention_ms=600_000, cleanup_policy="compact,delete")
    configs = {"cd": expired, "d": LogConfig(retention_ms=600_000)}
    replicas = ReplicaManager(manager, 1, lambda topic: configs[topic])
    old = int(time.time() * 1000) - 3_600_000
    logs = {}
    for topic, config in configs.items():  # every segment expired, the active one too
        log = logs[topic] = manager.create(topic, 0, config)
        for value in (b"a", b"b"):
            log.append(build_batch([(b"k", value)], timestamp_ms=old), leader_epoch=0, now_ms=old)
            log.roll()
        log.append(build_batch([(b"k", b"c")], timestamp_ms=old), leader_epoch=0, now_ms=old)
    logs["d"].delete_records_before(1)  # (its first segment is below the log start: that one may go)
    assert manager.apply_retention(int(time.time() * 1000)) == 0
    assert asyncio.run(manager.cleaner.clean_filthiest()) is False
    assert logs["cd"].segment_base_offsets == [0, 1, 2] and logs["cd"].log_start_offset == 0
    assert logs["d"].segment_base_offsets == [1, 2] and logs["d"].log_start_offset == 1
    for topic in configs:  # hosted: the HWM is the log end and retention empties both logs
        replicas.host(topic, 0, leader_epoch=0)
    assert manager.apply_retention(int(time.time() * 1000), [logs["d"]]) == 2
    asyncio.run(manager.cleaner.clean_filthiest())  # (a cleaning of "cd" now, then its retention)
    assert [(log.segment_base_offsets, log.log_start_offset) for log in logs.values()] == [([3], 3), ([3], 3)]
    manager.shutdown()


def test_a_storage_error_in_one_logs_retention_does_not_stop_the_others(tmp_path, monkeypatch, caplog):
    """Retention of every segment rolls a new one first; on a full disk that roll fails for one log: the
    pass logs it and goes on with the next logs (their deleted files removed too), in the retention check
    and in the cleaner's round, and the failing log is tried again at the next pass."""

    async def scenario() -> None:
        manager = LogManager(tmp_path, retention_check_interval_ms=20)
        manager.cleaner.use_processes = False
        old = int(time.time() * 1000) - 3_600_000
        logs = {}
        for topic, policy in (("a", "delete"), ("b", "delete"), ("ca", "compact,delete"), ("cb", "compact,delete")):
            log = logs[topic] = manager.create(topic, 0, LogConfig(retention_ms=600_000, cleanup_policy=policy))
            log.append(build_batch([(b"k", b"v")], timestamp_ms=old), leader_epoch=0, now_ms=old)
            log.roll()
            log.append(build_batch([(b"j", b"v")], timestamp_ms=old), leader_epoch=0, now_ms=old)
        failing = {tmp_path / "a-0", tmp_path / "ca-0"}
        real_open = os.open

        def disk_full_in_a_and_ca(path, *args, **kwargs):
            if Path(path).parent in failing:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_open(path, *args, **kwargs)

        caplog.set_level("WARNING", logger="pykbroker.log.manager")
        with monkeypatch.context() as patch:
            patch.setattr(os, "open", disk_full_in_a_and_ca)
            task = asyncio.create_task(manager.run_background())
            for _ in range(500):
                await asyncio.sleep(0.01)
                if logs["b"].segment_base_offsets == [2] and not (tmp_path / "b-0" / "00000000000000000000.log").exists():
                    break
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await manager.cleaner.clean_filthiest()
            assert [logs[topic].segment_base_offsets for topic in ("a", "b", "ca", "cb")] == [[0, 1], [2], [0, 1], [2]]
            assert not (tmp_path / "b-0" / "00000000000000000000.log").exists()
            assert not (tmp_path / "cb-0" / "00000000000000000001.log").exists()
        messages = {record.getMessage() for record in caplog.records}
        assert f"retention of a-0 in {tmp_path} failed ([Errno 28] No space left on device); tried again at the " \
               "next pass" in messages
        assert any(message.startswith("retention of ca-0 ") for message in messages)
        assert manager.apply_retention(int(time.time() * 1000), [logs["a"]]) == 2  # room again: it goes
        assert logs["a"].segment_base_offsets == [2] and logs["a"].log_start_offset == 2
        manager.shutdown()

    asyncio.run(scenario())

"""The benchmark's broker set-up (integration/bench/brokers.py) that needs no running broker: why Kafka
would be skipped, its KRaft properties and cluster id, and the /proc readings."""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration" / "bench"))

import brokers  # noqa: E402
from brokers import KAFKA_DIST, kafka_unavailable_reason, kraft_cluster_id, kraft_properties, read_cpu  # noqa: E402


def _fake_kit(root: Path, executable: bool) -> Path:
    script = root / KAFKA_DIST / "bin" / "kafka-server-start.sh"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755 if executable else 0o644)
    return root


def test_kafka_is_skipped_with_the_reason_when_the_kit_is_absent(tmp_path):
    reason = kafka_unavailable_reason(tmp_path / "nowhere")
    assert reason is not None and "no Apache Kafka" in reason and str(tmp_path / "nowhere") in reason


def test_kafka_is_skipped_when_its_scripts_are_not_executable(tmp_path):
    reason = kafka_unavailable_reason(_fake_kit(tmp_path, executable=False))
    assert reason is not None and "chmod +x" in reason


def test_kafka_is_skipped_when_java_is_absent(tmp_path, monkeypatch):
    monkeypatch.setattr(brokers.shutil, "which", lambda name: None)
    reason = kafka_unavailable_reason(_fake_kit(tmp_path, executable=True))
    assert reason is not None and "java" in reason


def test_kafka_runs_when_kit_and_java_are_there(tmp_path, monkeypatch):
    monkeypatch.setattr(brokers.shutil, "which", lambda name: "/usr/bin/java")
    assert kafka_unavailable_reason(_fake_kit(tmp_path, executable=True)) is None


def test_cluster_id_is_sixteen_bytes_in_url_safe_base64_without_padding():
    cluster_id = kraft_cluster_id()
    assert len(cluster_id) == 22 and "=" not in cluster_id
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
    assert kraft_cluster_id() != cluster_id


def test_kraft_properties_bind_loopback_ports_and_keep_kafkas_workload_defaults(tmp_path):
    lines = kraft_properties("127.0.0.1", 40001, 40002, tmp_path).splitlines()
    settings = dict(line.split("=", 1) for line in lines if line)
    assert settings["listeners"] == "PLAINTEXT://127.0.0.1:40001,CONTROLLER://127.0.0.1:40002"
    assert settings["advertised.listeners"] == "PLAINTEXT://127.0.0.1:40001"
    assert settings["controller.quorum.voters"] == "1@127.0.0.1:40002"
    assert settings["log.dirs"] == str(tmp_path)
    assert settings["offsets.topic.replication.factor"] == "1"
    # What shapes the workloads stays at Kafka's defaults, which pykbroker shares.
    assert not any(key.startswith(("log.flush", "num.partitions", "log.segment", "offsets.topic.num")) for key in settings)


def test_cpu_of_this_process_is_read_from_proc_as_the_kernel_reports_it():
    times = os.times()
    sample = read_cpu(os.getpid())
    # utime + stime of /proc/<pid>/stat, fields 14 and 15: what os.times() reports for this process.
    assert abs(sample.seconds - (times.user + times.system)) < 0.1


def test_cluster_ids_never_start_with_a_dash(monkeypatch):
    """kafka-storage.sh format -t <id> reads an id starting with "-" as an option (seen once in 64 runs):
    such ids are drawn again, as Kafka's Uuid.randomUuid does."""
    import uuid

    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=bytes(16))])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(draws))
    assert kraft_cluster_id() == "AAAAAAAAAAAAAAAAAAAAAA"

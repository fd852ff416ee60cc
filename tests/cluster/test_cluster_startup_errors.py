"""A broker that cannot join its cluster says why in one error line and exits 1, writing nothing it should
not: ZooKeeper unreachable, a data dir that belongs to another cluster (Kafka's
InconsistentClusterIdException), a broker id held by a live broker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("kazoo", reason="kazoo is not installed")

from kazoo.client import KazooClient

from pykbroker.cluster.zk_server import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
FAIL_TIMEOUT_S = 60.0  # every failure below must end long before this, even on a loaded machine


def serve(data_dir: Path, zookeeper: str, *overrides: str) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYKBROKER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "pykbroker", "serve", "--broker-id", "1", "--zookeeper", zookeeper,
               "--data-dir", str(data_dir), "--port", str(free_port()), "--log-level", "warning"]
    for item in overrides:
        command += ["--override", item]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=FAIL_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)


def error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


def test_unreachable_zookeeper_is_named(tmp_path):
    port = free_port()  # nothing listens there
    result = serve(tmp_path / "data", f"127.0.0.1:{port}", "zookeeper.connection.timeout.ms=2000")
    assert f"cannot connect to ZooKeeper at 127.0.0.1:{port}" in error_line(result)
    assert not (tmp_path / "data" / "meta.properties").exists()


def test_a_data_dir_of_another_cluster_is_refused(zk_connect, tmp_path):
    # (A new cluster's id is generated, as Kafka does, never taken from a data dir: here the two differ.)
    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.properties").write_text("version=0\nbroker.id=1\ncluster.id=SomeOtherClusterId0000\n")
    line = error_line(serve(data, zk_connect))
    assert "doesn't match stored clusterId Some(SomeOtherClusterId0000)" in line
    assert "trying to join the wrong cluster" in line
    assert "SomeOtherClusterId0000" in (data / "meta.properties").read_text()  # left as it was


def test_a_broker_id_held_by_a_live_broker_is_refused_after_a_session_timeout(zk_connect, tmp_path):
    hosts, _, chroot = zk_connect.partition("/")
    holder = KazooClient(hosts=hosts, timeout=10)
    holder.start(timeout=10)
    try:
        holder.create(f"/{chroot}/brokers/ids/1", b"", ephemeral=True, makepath=True)
        # It waits 1.5 session timeouts for the holder's session to end (a crashed predecessor's would), then fails.
        line = error_line(serve(tmp_path / "data", zk_connect, "zookeeper.session.timeout.ms=2000"))
        assert "Error while creating ephemeral at /brokers/ids/1, node already exists" in line
        assert holder.exists(f"/{chroot}/brokers/ids/1") is not None  # the live holder keeps its registration
    finally:
        holder.stop()
        holder.close()

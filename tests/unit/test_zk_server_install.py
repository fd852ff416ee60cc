"""zk_server says clearly when ZooKeeper or java is absent (no ZooKeeper needed to run these)."""

from __future__ import annotations

import pytest

from pykbroker.cluster import zk_server
from pykbroker.cluster.zk_server import ZooKeeperServer, ZooKeeperUnavailable, find_install


def test_missing_jar_names_the_debian_package(tmp_path):
    with pytest.raises(ZooKeeperUnavailable, match=r"apt-get install zookeeper.*not found"):
        find_install(jar=tmp_path / "zookeeper.jar")


def test_missing_java_is_reported(tmp_path, monkeypatch):
    jar = tmp_path / "zookeeper.jar"
    jar.write_bytes(b"PK")
    monkeypatch.setattr(zk_server.shutil, "which", lambda name: None)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(ZooKeeperUnavailable, match="no java runtime"):
        find_install(jar=jar)


def test_env_var_points_at_another_install(tmp_path, monkeypatch):
    jar = tmp_path / "zk.jar"
    jar.write_bytes(b"PK")
    monkeypatch.setenv("PYKBROKER_ZOOKEEPER_JAR", str(jar))
    monkeypatch.setattr(zk_server.shutil, "which", lambda name: "/usr/bin/java")
    install = find_install()
    assert install.java == "/usr/bin/java" and install.classpath.split(":")[0] == str(jar)


def test_start_without_an_install_raises_before_touching_anything(tmp_path, monkeypatch):
    monkeypatch.setenv("PYKBROKER_ZOOKEEPER_JAR", str(tmp_path / "absent.jar"))
    server = ZooKeeperServer(data_dir=tmp_path / "zk")
    with pytest.raises(ZooKeeperUnavailable):
        server.start()
    assert server.proc is None and not (tmp_path / "zk").exists()


def test_free_ports_of_concurrent_test_workers_never_meet(monkeypatch):
    """pytest-xdist's workers (PYTEST_XDIST_WORKER=gw<i>, PYTEST_XDIST_WORKER_COUNT=n) each take only the
    ports p % n == i: a port one worker picked and has not bound yet is never another's."""
    assert zk_server.port_slice({}) == (0, 1)
    assert zk_server.port_slice({"PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2"}) == (1, 2)
    assert zk_server.port_slice({"PYTEST_XDIST_WORKER": "master", "PYTEST_XDIST_WORKER_COUNT": "2"}) == (0, 1)
    low, high = zk_server.ephemeral_port_range()
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
        ports = {zk_server._free_port_now("127.0.0.1") for _ in range(50)}
        assert {port % 3 for port in ports} == {int(worker[2:])}
        assert all(1024 <= port < low or high < port <= 65535 for port in ports)

"""Fixtures for cluster tests: a real Apache ZooKeeper server (Debian's package) on a free port.

Fixtures:
  zk_server        one ZooKeeper per test session, shared; tests isolate themselves with a chroot
  zk_connect       "127.0.0.1:PORT/<unique chroot>" for one test on the shared server
  zk_server_fresh  a ZooKeeper of the test's own, for fault tests (pause with SIGSTOP, resume, restart)
  run_async        run(coro, timeout=...) for tests written as coroutines (no pytest-asyncio needed)

Without ZooKeeper (or java) the tests skip with the reason; under CI (env CI set) that is a failure, since
scripts/install-test-deps.sh installs Debian's zookeeper there. Every server is stopped (SIGTERM, then
SIGKILL) at teardown and its data dir removed, even when the test failed; on failure the tail of the
server log is attached to the report.
"""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from pykbroker.cluster.zk_server import ZooKeeperServer, ZooKeeperUnavailable, find_install


def _install_or_skip():
    try:
        return find_install()
    except ZooKeeperUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have ZooKeeper (scripts/install-test-deps.sh): {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory):
    install = _install_or_skip()
    server = ZooKeeperServer(data_dir=tmp_path_factory.mktemp("zookeeper"), install=install)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_connect(zk_server, request):
    if not zk_server.answers():  # a test left it paused or stopped: make it usable again
        zk_server.resume()
        zk_server.wait_serving()
    chroot = f"/t-{request.node.name[:40].replace('[', '-').replace(']', '')}-{uuid.uuid4().hex[:8]}"
    return zk_server.connect_string + chroot


@pytest.fixture
def zk_server_fresh(tmp_path):
    install = _install_or_skip()
    server = ZooKeeperServer(data_dir=tmp_path / "zookeeper", install=install)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" and rep.failed:
        for name in ("zk_server_fresh", "zk_server"):
            server = getattr(item, "funcargs", {}).get(name)
            if server is not None:
                rep.sections.append((f"{name} log", server.log_tail(60)))
        for value in getattr(item, "funcargs", {}).values():  # broker_cluster.BrokerCluster and the like
            if callable(getattr(value, "failure_sections", None)):
                rep.sections.extend(value.failure_sections())


@pytest.fixture
def run_async():
    def run(coro, timeout: float = 60.0):
        async def bounded():
            return await asyncio.wait_for(coro, timeout)

        return asyncio.run(bounded())

    return run

"""`pykbroker cluster --brokers 3` (pykbroker/devcluster.py) as a user runs it: it starts ZooKeeper and three
brokers, prints a bootstrap string that stock clients use for a replication-factor-3 topic, and Ctrl-C (SIGINT)
stops everything: exit status 0 and no process of the cluster left.

Run: python3 -m pytest -q tests/cluster/test_cluster_cli.py
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from broker_cluster import REPO_ROOT, wait_until
from pykbroker.cluster.zk_server import ZooKeeperUnavailable, find_install
from workload import produce_batch, read_log

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0


def processes_using(path: Path) -> set[int]:
    """Processes other than this one whose command line mentions path: the command, ZooKeeper (its zoo.cfg
    is under the data dir) and the brokers (--data-dir), wherever they were reparented to."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if str(path).encode() in (entry / "cmdline").read_bytes():
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


class ClusterCommand:
    """`python -m pykbroker cluster ...` in the background, its output collected line by line."""

    def __init__(self, args: list[str]):
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "pykbroker", "cluster", *args], cwd=REPO_ROOT, env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def bootstrap(self) -> str | None:
        for line in self.lines:
            match = re.fullmatch(r"bootstrap servers: (\S+)", line)
            if match:
                return match.group(1)
        if self.proc.poll() is not None:
            raise AssertionError(f"pykbroker cluster exited with {self.proc.returncode}:\n{self.output}")
        return None

    def kill_all(self, path: Path) -> None:
        """Teardown of last resort: SIGKILL the command and everything it started (all mention path)."""
        for pid in processes_using(path) | {self.proc.pid}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


@pytest.fixture
def zookeeper_installed():
    try:
        find_install()
    except ZooKeeperUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have ZooKeeper: {exc}")
        pytest.skip(str(exc))


@pytest.mark.timeout(300)
def test_cluster_command_serves_a_replicated_topic_and_ctrl_c_stops_everything(zookeeper_installed, tmp_path):
    data_dir = tmp_path / "cluster"
    command = ClusterCommand(["--brokers", "3", "--data-dir", str(data_dir)])
    try:
        wait_until(command.bootstrap, "the bootstrap servers line", START_TIMEOUT_S)
        bootstrap = command.bootstrap()
        assert len(bootstrap.split(",")) == 3 and all(re.fullmatch(r"127\.0\.0\.1:\d+", a) for a in bootstrap.split(","))
        running = processes_using(data_dir) - {command.proc.pid}
        assert len(running) == 4, f"expected ZooKeeper and 3 brokers, found {running}"

        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("cli-rf3", 3, 3)], operation_timeout=30)["cli-rf3"].result(60)
        metadata = admin.list_topics("cli-rf3", timeout=30).topics["cli-rf3"]
        assert all(len(p.replicas) == 3 for p in metadata.partitions.values()), metadata.partitions
        acked, refused = produce_batch(bootstrap, "cli-rf3", [0, 1, 2], "cli", 60)
        assert not refused and len(acked) == 60
        log = read_log(bootstrap, "cli-rf3", [0, 1, 2])
        assert sorted(v for records in log.values() for _, v in records) == sorted(r.value for r in acked)

        command.proc.send_signal(signal.SIGINT)
        assert command.proc.wait(STOP_TIMEOUT_S) == 0, command.output
        assert not processes_using(data_dir), "processes left after Ctrl-C"
        assert "cluster stopped" in command.output
    finally:
        if command.proc.poll() is None:
            command.kill_all(data_dir)


def test_cluster_command_reports_a_broker_that_cannot_start(zookeeper_installed, tmp_path):
    """A broker that exits while starting: exit status 1, the reason on the output, nothing left running."""
    data_dir = tmp_path / "cluster"
    command = ClusterCommand(["--brokers", "2", "--data-dir", str(data_dir),
                              "--override", "num.partitions=not-a-number"])
    try:
        assert command.proc.wait(START_TIMEOUT_S) == 1
        command._reader.join(10)
        assert "cluster did not start: broker" in command.output
        assert "num.partitions" in command.output, command.output  # the broker's own reason, from its log
        assert not processes_using(data_dir)
    finally:
        if command.proc.poll() is None:
            command.kill_all(data_dir)

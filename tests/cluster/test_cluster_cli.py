"""`pykbroker cluster --brokers 3` (pykbroker/devcluster.py) as a user runs it: it starts ZooKeeper and three
brokers, prints a bootstrap string that stock clients use for a replication-factor-3 topic, and Ctrl-C (SIGINT)
stops everything: exit status 0 and no process of the cluster left.

Run: python3 -m pytest -q tests/cluster/test_cluster_cli.py
"""

from __future__ import annotations

import os
import re
import shutil
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
    """`pykbroker cluster ...` (this checkout's, whatever ``cwd``, as the installed console script runs)
    in the background, its output collected line by line."""

    def __init__(self, args: list[str], cwd: Path = REPO_ROOT):
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-P", "-m", "pykbroker", "cluster", *args], cwd=cwd, env=env,
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


def source_copy_without_speedups(into: Path, with_setup: bool = True) -> Path:
    """A copy of this checkout's pykbroker package (and setup.py) without its built C extension: what a
    fresh clone looks like beside an installed pykbroker."""
    shutil.copytree(REPO_ROOT / "pykbroker", into / "pykbroker",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    if with_setup:
        shutil.copy(REPO_ROOT / "setup.py", into / "setup.py")
    return into


@pytest.mark.timeout(300)
def test_cluster_brokers_run_the_commands_pykbroker_not_the_source_tree_in_the_working_directory(
        zookeeper_installed, tmp_path):
    """Started from a folder holding a pykbroker source tree without its C extension, the brokers still run
    the command's own package (here this checkout, with the extension): its file in their start line, and no
    "not built" warning."""
    from pykbroker.protocol import records

    if not records.ACCELERATED:
        pytest.skip("this checkout's C extension is not built (python3 setup.py build_ext --inplace)")
    checkout = source_copy_without_speedups(tmp_path / "clone")
    data_dir = tmp_path / "cluster"
    command = ClusterCommand(["--brokers", "1", "--data-dir", str(data_dir)], cwd=checkout)
    try:
        wait_until(command.bootstrap, "the bootstrap servers line", START_TIMEOUT_S)
        log = (data_dir / "logs" / "broker-1.log").read_text()
        assert f"from {REPO_ROOT / 'pykbroker'} (C record walker: built)" in log, log
        assert "is not built" not in log, log
        command.proc.send_signal(signal.SIGINT)
        assert command.proc.wait(STOP_TIMEOUT_S) == 0, command.output
    finally:
        if command.proc.poll() is None:
            command.kill_all(data_dir)


@pytest.mark.parametrize("checkout", [True, False], ids=["source-tree", "installed"])
def test_missing_speedups_warning_names_the_imported_file_and_the_command_that_builds_it(tmp_path, checkout):
    tree = source_copy_without_speedups(tmp_path / "tree", with_setup=checkout)
    code = "from pykbroker.server.broker import speedups_missing_message as m; print(m())"
    out = subprocess.run([sys.executable, "-P", "-c", code], env=dict(os.environ, PYTHONPATH=str(tree)),
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert f"is not built for {tree / 'pykbroker' / '__init__.py'}:" in out, out
    if checkout:
        assert f"cd {tree} && python3 setup.py build_ext --inplace" in out, out
    else:
        assert "reinstall pykbroker where a C compiler" in out and "build_ext" not in out, out

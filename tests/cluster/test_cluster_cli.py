"""`pykbroker cluster --brokers 3` (pykbroker/devcluster.py) as a user runs it: it starts ZooKeeper and three
brokers, prints a bootstrap string that stock clients use for a replication-factor-3 topic, and Ctrl-C (SIGINT)
stops everything: exit status 0 and no process of the cluster left.

Run: python3 -m pytest -q tests/cluster/test_cluster_cli.py
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from broker_cluster import REPO_ROOT, wait_until
from pykbroker.cluster.zk_server import ZooKeeperUnavailable, find_install
from tests.proc_helpers import each_process
from workload import produce_batch, read_log

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0


def processes_using(path: Path) -> set[int]:
    """Processes other than this one whose command line mentions path: the command, ZooKeeper (its zoo.cfg
    is under the data dir) and the brokers (--data-dir), wherever they were reparented to."""
    return {pid for pid, cmdline in each_process("cmdline") if pid != os.getpid() and str(path).encode() in cmdline}


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
    the command's own package (here this checkout): its file in their start line, and (with this checkout's
    extension built) no "not built" warning."""
    from pykbroker.protocol import records

    checkout = source_copy_without_speedups(tmp_path / "clone")
    data_dir = tmp_path / "cluster"
    command = ClusterCommand(["--brokers", "1", "--data-dir", str(data_dir)], cwd=checkout)
    try:
        wait_until(command.bootstrap, "the bootstrap servers line", START_TIMEOUT_S)
        log = (data_dir / "logs" / "broker-1.log").read_text()
        built = "built" if records.ACCELERATED else "not built"
        assert f"from {REPO_ROOT / 'pykbroker'} (C record walker: {built})" in log, log
        if records.ACCELERATED:
            assert "is not built" not in log, log
        else:  # the warning names this checkout's file, not the clone's
            assert f"is not built for {REPO_ROOT / 'pykbroker' / '__init__.py'}" in log, log
        # a cluster smaller than 3 gets its internal topics with as many replicas as it has brokers
        wait_until(lambda: find_coordinator(command.bootstrap(), 4, "payments", key_type=1)[0] == 0,
                   "a transaction coordinator", START_TIMEOUT_S)
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
    # the Python that runs the broker (not whatever python3 is first on PATH), and what the build needs: the
    # extension is optional, so a build without a compiler "succeeds" without it
    assert "a C compiler and the Python headers" in out, out
    if checkout:
        assert f"cd {tree} && {shlex.quote(sys.executable)} setup.py build_ext --inplace" in out, out
    else:
        assert f"{shlex.quote(sys.executable)} -m pip install --force-reinstall" in out, out
        assert "build_ext" not in out, out


# -- a broker that dies: the supervisor, and FindCoordinator's reason while __consumer_offsets cannot be created --

# ZooKeeper drops a killed broker after its session timeout: 6 s instead of Kafka's 18 s keeps the tests short.
# A stop with a broker missing retries controlled shutdown: half a second apart instead of 5 s.
FAST_FAILOVER = ["--override", "zookeeper.session.timeout.ms=6000",
                 "--override", "controlled.shutdown.retry.backoff.ms=500"]
FAILOVER_TIMEOUT_S = 90.0
NO_OFFSETS_TOPIC = ("the offsets topic __consumer_offsets cannot be created yet: 2 live brokers, "
                    "offsets.topic.replication.factor=3 (start the missing brokers, or lower "
                    "offsets.topic.replication.factor)")


def broker_pid(data_dir: Path, broker_id: int) -> int:
    found = processes_using(data_dir / f"broker-{broker_id}")
    assert len(found) == 1, f"broker {broker_id}: processes {found}"
    return found.pop()


def listed_brokers(address: str) -> set[int] | None:
    from pykbroker.devcluster import live_broker_ids

    host, port = address.rsplit(":", 1)
    return live_broker_ids(host, int(port))


def find_coordinator(address: str, version: int, key: str, key_type: int = 0):
    """A raw FindCoordinator of this version for a group (key_type 1: a transactional id) with pykbroker's
    protocol client: (error code, error message) of the key's answer."""
    import asyncio
    import importlib

    from pykbroker.protocol.client import KafkaClientConnection

    schema = importlib.import_module(f"kio.schema.find_coordinator.v{version}.request")
    request = (schema.FindCoordinatorRequest(key_type=key_type, coordinator_keys=(key,)) if version >= 4
               else schema.FindCoordinatorRequest(key=key, key_type=key_type))

    async def ask():
        host, port = address.rsplit(":", 1)
        connection = await KafkaClientConnection.connect(host, int(port), client_id="test-cluster-cli",
                                                         connect_timeout=10, request_timeout=30,
                                                         negotiate_versions=False)
        try:
            return await connection.send(request)
        finally:
            await connection.aclose()

    response = asyncio.run(ask())
    answer = response.coordinators[0] if version >= 4 else response
    return int(answer.error_code), answer.error_message


def group_works(bootstrap: str, topic: str, group: str) -> None:
    """A consumer group reads a record of a replication-factor-3 topic and commits its offset."""
    from confluent_kafka import Consumer, Producer

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3)], operation_timeout=30)[topic].result(60)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, key=b"k", value=b"hello")
    assert producer.flush(60) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + FAILOVER_TIMEOUT_S
        record = None
        while record is None or record.error() is not None:
            assert time.monotonic() < deadline, f"group {group} read nothing within {FAILOVER_TIMEOUT_S} s"
            record = consumer.poll(1.0)
        assert record.value() == b"hello"
        committed = consumer.commit(message=record, asynchronous=False)
        assert [tp.offset for tp in committed] == [1]
    finally:
        consumer.close()


def line_after(command: ClusterCommand, prefix: str) -> str | None:
    """The output line following the first that starts with prefix (a printed restart command)."""
    for line, following in zip(command.lines, command.lines[1:]):
        if line.startswith(prefix):
            return following.strip()
    return None


@pytest.mark.timeout(420)
def test_killed_broker_without_offsets_topic_says_why_groups_wait_and_prints_its_restart_command(
        zookeeper_installed, tmp_path):
    """--no-restart: broker 3 is SIGKILLed before any group exists. The command reports the signal and prints
    the command that restarts broker 3; FindCoordinator answers COORDINATOR_NOT_AVAILABLE (Kafka's rule kept:
    3 live brokers needed) with the reason as error_message, logged once; the printed command brings broker 3
    back, and then a group works."""
    data_dir = tmp_path / "cluster"
    command = ClusterCommand(["--brokers", "3", "--data-dir", str(data_dir), "--no-restart", *FAST_FAILOVER])
    manual = None
    try:
        wait_until(command.bootstrap, "the bootstrap servers line", START_TIMEOUT_S)
        bootstrap = command.bootstrap()
        first = bootstrap.split(",")[0]
        os.kill(broker_pid(data_dir, 3), signal.SIGKILL)
        wait_until(lambda: line_after(command, "not restarting it (--no-restart); restart broker 3 by hand with:"),
                   "the restart command", FAILOVER_TIMEOUT_S)
        assert "broker 3 was killed by signal SIGKILL; the others keep running." in command.output, command.output
        restart = line_after(command, "not restarting it (--no-restart); restart broker 3 by hand with:")

        # no FindCoordinator before ZooKeeper dropped broker 3: it would create the topic on 3 registered brokers
        wait_until(lambda: listed_brokers(first) == {1, 2}, "the cluster to drop broker 3", FAILOVER_TIMEOUT_S)
        for version in (4, 4, 3, 1):
            assert find_coordinator(first, version, "billing") == (15, NO_OFFSETS_TOPIC)  # COORDINATOR_NOT_AVAILABLE
        assert find_coordinator(first, 4, "payments", key_type=1) == (15, (
            "the transaction state topic __transaction_state cannot be created yet: 2 live brokers, "
            "transaction.state.log.replication.factor=3 (start the missing brokers, or lower "
            "transaction.state.log.replication.factor)"))
        logged = (data_dir / "logs" / "broker-1.log").read_text().count("__consumer_offsets cannot be created yet: 2 live brokers")
        assert logged == 1, f"the reason logged {logged} times"

        manual = subprocess.Popen(restart, shell=True, cwd=tmp_path, start_new_session=True)
        wait_until(lambda: listed_brokers(first) == {1, 2, 3}, "broker 3 back", FAILOVER_TIMEOUT_S)
        group_works(bootstrap, "after-restart", "billing")
        assert find_coordinator(first, 4, "billing")[0] == 0

        os.killpg(manual.pid, signal.SIGTERM)  # ours, not the command's: stopped before its ZooKeeper
        manual.wait(STOP_TIMEOUT_S)
        command.proc.send_signal(signal.SIGINT)
        assert command.proc.wait(STOP_TIMEOUT_S) == 1, command.output  # a broker died while it ran
        assert not processes_using(data_dir)
    finally:
        if manual is not None and manual.poll() is None:
            os.killpg(manual.pid, signal.SIGKILL)
            manual.wait()
        if command.proc.poll() is None:
            command.kill_all(data_dir)


@pytest.mark.timeout(420)
def test_cluster_restarts_a_killed_broker_and_gives_up_on_one_that_crashes_at_start(zookeeper_installed, tmp_path):
    data_dir = tmp_path / "cluster"
    command = ClusterCommand(["--brokers", "3", "--data-dir", str(data_dir), *FAST_FAILOVER])
    try:
        wait_until(command.bootstrap, "the bootstrap servers line", START_TIMEOUT_S)
        bootstrap = command.bootstrap()
        killed = broker_pid(data_dir, 3)
        os.kill(killed, signal.SIGKILL)
        wait_until(lambda: "broker 3 is serving again" in command.output, "broker 3 restarted", FAILOVER_TIMEOUT_S)
        assert "broker 3 was killed by signal SIGKILL; the others keep running." in command.output, command.output
        assert "restarted broker 3 (pid" in command.output
        assert "got no response" not in command.output  # the probes of a restarting broker are no warnings
        assert broker_pid(data_dir, 3) != killed
        group_works(bootstrap, "after-restart", "billing")

        # A broker that cannot start (here: an unreadable meta.properties) is restarted twice, then left down at
        # its third death within the window (the kill included).
        (data_dir / "broker-2" / "meta.properties").write_text("not a properties line\n")
        os.kill(broker_pid(data_dir, 2), signal.SIGKILL)
        gave_up = "broker 2 died 3 times within 5 minutes: not restarting it again"
        wait_until(lambda: gave_up in command.output, "the supervisor to give up on broker 2", FAILOVER_TIMEOUT_S)
        assert "broker 2 was killed by signal SIGKILL; the others keep running." in command.output, command.output
        assert command.output.count("broker 2 exited with status 1 before serving again") == 2, command.output
        assert "meta.properties" in command.output  # the broker's own reason, from its log
        assert line_after(command, f"broker 2 died 3 times").startswith("PYTHONUNBUFFERED=1 PYTHONPATH="), command.output

        command.proc.send_signal(signal.SIGINT)
        assert command.proc.wait(STOP_TIMEOUT_S) == 1, command.output
        assert not processes_using(data_dir)
    finally:
        if command.proc.poll() is None:
            command.kill_all(data_dir)


# -- the supervisor in process, on a one-broker DevCluster of the tests' ZooKeeper --

@pytest.fixture
def dev_cluster(zk_connect, tmp_path):
    from pykbroker.devcluster import DevCluster

    said: list[str] = []
    cluster = DevCluster(1, tmp_path / "cluster", zookeeper=zk_connect, say=said.append,
                         overrides=("zookeeper.session.timeout.ms=6000", "controlled.shutdown.retry.backoff.ms=500"))
    cluster.start(START_TIMEOUT_S)
    try:
        yield cluster, said
    finally:
        cluster.stop()


def supervise_until(supervisor, said: list[str], text: str, timeout: float = FAILOVER_TIMEOUT_S) -> float:
    """poll() until ``text`` is said; returns the longest poll()."""
    longest = 0.0
    deadline = time.monotonic() + timeout
    while not any(text in line for line in said):
        assert time.monotonic() < deadline, f"no {text!r} within {timeout:.0f} s:\n" + "\n".join(said)
        started = time.monotonic()
        supervisor.poll()
        longest = max(longest, time.monotonic() - started)
        time.sleep(0.05)
    return longest


@pytest.mark.timeout(300)
def test_supervisor_counts_deaths_after_serving_backs_off_and_gives_up_after_3_in_the_window(dev_cluster):
    """A broker that serves and dies again and again is restarted after 1 s, then 2 s, and left down at its third
    death within 5 minutes (before: the count restarted once it served, so it was restarted forever). While
    the restarted broker waits for its registration (connections unanswered), a poll() stays short."""
    from pykbroker.devcluster import Supervisor

    cluster, said = dev_cluster
    broker = cluster.brokers[0]
    supervisor = Supervisor(cluster, said.append)
    for death, delay in ((1, 1), (2, 2)):
        broker.proc.kill()
        supervise_until(supervisor, said, f"restarting broker 1 in {delay} s")
        assert supervisor.deaths == death
        longest = supervise_until(supervisor, said, "restarted broker 1 (pid")
        longest = max(longest, supervise_until(supervisor, said, "broker 1 is serving again"))
        assert longest < 1.5, f"a poll() took {longest:.1f} s"  # before: a 2 s probe per poll while starting
        said.clear()  # the next round looks for its own lines
    broker.proc.kill()
    supervise_until(supervisor, said, "broker 1 died 3 times within 5 minutes: not restarting it again")
    assert broker.state == "down" and supervisor.deaths == 3
    text = "\n".join(said)
    assert "restart broker 1 by hand with:\n  PYTHONUNBUFFERED=1 " in text, text
    assert "is not supervised" in text, text
    for _ in range(3):  # left down
        supervisor.poll()
    assert not broker.running()


@pytest.mark.timeout(300)
def test_supervisor_leaves_a_broker_that_exited_with_status_0_down(dev_cluster):
    """Exit status 0 is a requested shutdown (SIGTERM: Kafka's controlled shutdown), not a failure: the
    broker is not restarted (systemd's on-failure) and the command's exit status does not count it."""
    from pykbroker.devcluster import Supervisor

    cluster, said = dev_cluster
    broker = cluster.brokers[0]
    supervisor = Supervisor(cluster, said.append)
    broker.proc.terminate()
    broker.proc.wait(STOP_TIMEOUT_S)
    supervisor.poll()
    text = "\n".join(said)
    assert "broker 1 exited with status 0" in text, text
    assert "it exited with status 0 (a requested shutdown): not restarting it; restart broker 1 by hand" in text
    assert broker.state == "down" and supervisor.deaths == 0 and not broker.running()


@pytest.mark.timeout(300)
def test_supervisor_counts_a_restart_that_fails_with_an_os_error_as_a_death(dev_cluster, tmp_path):
    """A restart whose data dir cannot be made (here: below a file) is reported and counted as a death, not a
    traceback that ends the command; at the third death the broker is left down."""
    from pykbroker.devcluster import Supervisor

    cluster, said = dev_cluster
    broker = cluster.brokers[0]
    supervisor = Supervisor(cluster, said.append)
    (tmp_path / "a-file").write_text("")
    broker.data_dir = tmp_path / "a-file" / "broker-1"
    broker.proc.kill()
    supervise_until(supervisor, said, "broker 1 died 3 times within 5 minutes: not restarting it again")
    text = "\n".join(said)
    assert text.count("broker 1 could not be started again: [Errno 20] Not a directory") == 2, text
    assert "restarting broker 1 in 1 s" in text and "restarting broker 1 in 2 s" in text, text
    assert broker.state == "down" and supervisor.deaths == 3


def test_an_installed_pykbroker_is_not_put_on_the_childrens_pythonpath():
    """site-packages on PYTHONPATH would come before the standard library: an installed package is found by
    the child's Python anyway (-P only drops the working directory); a checkout's parent is put first."""
    import site

    from pykbroker.devcluster import _path_entry_for

    # The user site counts only where this Python reads it (not in a virtualenv, where ENABLE_USER_SITE is off).
    user_site = (site.getusersitepackages(),) if site.ENABLE_USER_SITE else ()
    for installed in (*site.getsitepackages(), *user_site):
        assert _path_entry_for(Path(installed)) is None
    assert _path_entry_for(REPO_ROOT) == str(REPO_ROOT)


def test_log_tail_reads_the_end_of_a_large_log(tmp_path):
    from pykbroker.devcluster import LOG_TAIL_BYTES, DevBroker

    broker = DevBroker(1, "127.0.0.1", 1, tmp_path / "data", tmp_path / "broker-1.log")
    assert broker.log_tail() == "(no log)"
    lines = [f"line {i} " + "x" * 90 for i in range(50_000)]  # ~5 MB
    broker.log_path.write_text("\n".join(lines) + "\n")
    assert broker.log_tail(3) == "\n".join(lines[-3:])
    assert broker.log_tail(10_000).splitlines()[0] in lines[-(LOG_TAIL_BYTES // 90):]  # no cut first line
    broker.log_path.write_text("short\nlog")
    assert broker.log_tail() == "short\nlog"

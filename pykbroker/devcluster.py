"""``pykbroker cluster``: a local development cluster of N brokers coordinated by ZooKeeper.

What it runs: unless ``--zookeeper`` names one, a standalone ZooKeeper from Debian's package
(``pykbroker.cluster.zk_server``) with its data in ``D/zookeeper``; then brokers 1..N, each a
``python -P -m pykbroker serve --broker-id N --zookeeper ... --listeners PLAINTEXT://HOST:PORT`` process with
its data in ``D/broker-N`` and its output in ``D/logs/broker-N.log``. The brokers run this command's Python and
this command's pykbroker package (its directory first on PYTHONPATH, and ``-P`` keeps the working directory,
perhaps a source checkout without the built C extension, off sys.path), wherever the command is started. It waits until every broker answers
Metadata listing all N brokers (that is: registered in ZooKeeper and told about each other by the
controller's UpdateMetadata), prints the bootstrap string, and runs until Ctrl-C or SIGTERM. Stopping sends
SIGTERM to every broker (Kafka's controlled shutdown, while ZooKeeper is still up), SIGKILLs those still
running after a grace period, then stops ZooKeeper.

A broker that dies while the cluster runs (killed to try a failover, or crashed) is reported with how it
ended (exit status or signal) and the end of its log; the others keep serving, as a real cluster does. The
supervisor (:class:`Supervisor`) restarts it, unless ``--no-restart``; a broker that dies MAX_FAILED_STARTS times in a row before serving is
not restarted again. A broker not restarted gets the exact command that restarts it by hand.

Exit status: 0 after a requested stop; 1 when ZooKeeper or a broker cannot start, the cluster is not ready
in time, or a broker died while the cluster ran (even if restarted). Brokers are started in
their own sessions (a terminal's Ctrl-C reaches only this command, which stops them in order) and are
SIGKILLed by Linux if this command dies without stopping them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

from kio.schema.metadata.v12.request import MetadataRequest

from pykbroker.cluster.zk_server import (
    ZooKeeperServer,
    ZooKeeperStartError,
    ZooKeeperUnavailable,
    die_with_parent,
    free_port,
)
from pykbroker.protocol.client import ClientError, KafkaClientConnection

DEFAULT_HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 30.0
POLL_S = 0.2
MAX_FAILED_STARTS = 3  # a broker that dies this many times in a row before serving is not restarted again
PACKAGE_PARENT = str(Path(__file__).resolve().parents[1])


class ClusterStartError(RuntimeError):
    """ZooKeeper or a broker did not start, or the cluster did not become ready in time."""


class _StopRequested(Exception):
    """SIGINT or SIGTERM arrived while the cluster was starting."""


def pykbroker_command(*args: str) -> list[str]:
    """The argv that runs ``pykbroker ARGS`` with this very Python and (with child_env) this very pykbroker
    package, whatever the working directory: ``-P`` keeps ``python -m`` from putting the working directory
    first on sys.path, where a source checkout (perhaps without its built C extension) would win."""
    return [sys.executable, "-P", "-m", "pykbroker", *args]


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a pykbroker child process: the directory holding the running pykbroker package
    first on PYTHONPATH (installed or a checkout), output unbuffered."""
    env = dict(os.environ if env is None else env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
    return env


# In a broker's child before exec: SIGKILL it if the process that started it dies (PR_SET_PDEATHSIG), so a
# crashed ``pykbroker cluster`` (or killed test run) leaves no broker behind; our ZooKeeper gets the same.
_die_with_parent = die_with_parent


async def _metadata(host: str, port: int, timeout: float):
    connection = await KafkaClientConnection.connect(
        host, port, client_id="pykbroker-cluster", connect_timeout=timeout, request_timeout=timeout,
        negotiate_versions=False)
    try:
        return await connection.send(MetadataRequest(
            topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    finally:
        await connection.aclose()


def live_broker_ids(host: str, port: int, timeout: float = 2.0) -> set[int] | None:
    """The broker ids a Metadata v12 answer of the broker at host:port lists, or None when it does not
    answer (not listening yet, or not able to serve Metadata)."""
    try:
        response = asyncio.run(_metadata(host, port, timeout))
    except (ClientError, OSError, asyncio.TimeoutError):
        return None
    return {int(b.node_id) for b in response.brokers}


@dataclass
class DevBroker:
    """One broker process of the dev cluster: a fixed id, port and data dir across restarts."""

    broker_id: int
    host: str
    port: int
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen | None = field(default=None, init=False)
    # the supervisor's view (Supervisor): running | starting (restarted, not serving yet) | down
    state: str = field(default="running", init=False)
    restarts: int = field(default=0, init=False)
    failed_starts: int = field(default=0, init=False)  # deaths in a row before serving again

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self, zookeeper: str, overrides: tuple[str, ...], log_level: str) -> list[str]:
        cmd = pykbroker_command("serve", "--broker-id", str(self.broker_id),
                                "--zookeeper", zookeeper, "--data-dir", str(self.data_dir),
                                "--listeners", f"PLAINTEXT://{self.host}:{self.port}", "--log-level", log_level)
        for item in overrides:
            cmd += ["--override", item]
        return cmd

    def shell_command(self, zookeeper: str, overrides: tuple[str, ...], log_level: str) -> str:
        """The command line that starts this broker by hand as this command starts it (same Python, same
        pykbroker, same options, output appended to its log)."""
        return (f"PYTHONPATH={shlex.quote(child_env()['PYTHONPATH'])} "
                f"{shlex.join(self.command(zookeeper, overrides, log_level))} >> {shlex.quote(str(self.log_path))} 2>&1")

    def start(self, zookeeper: str, overrides: tuple[str, ...] = (), log_level: str = "INFO") -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(zookeeper, overrides, log_level), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, env=child_env(), start_new_session=True, preexec_fn=_die_with_parent)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_description(self) -> str:
        """How the process ended: "exited with status N" or "was killed by signal SIGNAME"."""
        code = self.proc.returncode if self.proc is not None else None
        if code is not None and code < 0:
            try:
                return f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with status {code}"

    def signal(self, sig: int) -> None:
        if self.running():
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class DevCluster:
    """ZooKeeper (own or given) + brokers 1..n under data_dir. start() raises ClusterStartError after having
    stopped whatever it started; stop() is idempotent."""

    def __init__(self, brokers: int, data_dir: Path, *, zookeeper: str | None = None, host: str = DEFAULT_HOST,
                 base_port: int | None = None, overrides: tuple[str, ...] = (), log_level: str = "INFO",
                 say: Callable[[str], None] = print, on_zookeeper_spawn: Callable[[int], None] | None = None):
        if brokers < 1:
            raise ValueError("a cluster needs at least one broker")
        self.data_dir = Path(data_dir).resolve()
        self.zookeeper_connect = zookeeper
        # Kafka's internal topics want 3 replicas: a smaller development cluster gets as many as it has
        # (a --override of the key wins, coming later on the command line).
        smaller = () if brokers >= 3 else (f"offsets.topic.replication.factor={brokers}",
                                           f"transaction.state.log.replication.factor={brokers}")
        self.overrides = (*smaller, *overrides)
        self.log_level = log_level
        self.say = say
        self.on_zookeeper_spawn = on_zookeeper_spawn  # our ZooKeeper's pid, as soon as it is spawned
        self.zk: ZooKeeperServer | None = None
        self.brokers = [
            DevBroker(broker_id=i, host=host, port=(base_port + i - 1) if base_port else free_port(host),
                      data_dir=self.data_dir / f"broker-{i}", log_path=self.data_dir / "logs" / f"broker-{i}.log")
            for i in range(1, brokers + 1)
        ]

    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers)

    def start(self, timeout: float = READY_TIMEOUT_S) -> None:
        try:
            if self.zookeeper_connect is None:
                self.zk = ZooKeeperServer(data_dir=self.data_dir / "zookeeper", die_with_parent=True,
                                          on_spawn=self.on_zookeeper_spawn)
                self.say(f"starting ZooKeeper (data {self.zk.data_dir}) ...")
                self.zk.start()
                self.zookeeper_connect = self.zk.connect_string + "/pykbroker"
                self.say(f"ZooKeeper serves on {self.zk.connect_string} (log {self.zk.log_path})")
            for broker in self.brokers:
                broker.start(self.zookeeper_connect, self.overrides, self.log_level)
                self.say(f"broker {broker.broker_id} starting on {broker.address} "
                         f"(data {broker.data_dir}, log {broker.log_path})")
            self.wait_ready(timeout)
        except (ZooKeeperUnavailable, ZooKeeperStartError) as exc:
            self.stop()
            raise ClusterStartError(f"ZooKeeper: {exc}") from None
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout: float) -> None:
        """Until every broker's Metadata lists all brokers; ClusterStartError if one exits or time runs out."""
        expected = {b.broker_id for b in self.brokers}
        deadline = time.monotonic() + timeout
        pending = list(self.brokers)
        while pending:
            for broker in list(pending):
                dead = self.dead_broker()
                if dead is not None:
                    raise ClusterStartError(
                        f"broker {dead.broker_id} {dead.exit_description()} while starting; "
                        f"last lines of {dead.log_path}:\n{dead.log_tail()}")
                if live_broker_ids(broker.host, broker.port) == expected:
                    pending.remove(broker)
            if not pending:
                return
            if time.monotonic() > deadline:
                names = ", ".join(str(b.broker_id) for b in pending)
                raise ClusterStartError(
                    f"broker(s) {names} did not list all {len(expected)} brokers in Metadata within {timeout:.0f} s; "
                    f"see {self.data_dir / 'logs'}")
            time.sleep(POLL_S)

    def dead_broker(self) -> DevBroker | None:
        return next((b for b in self.brokers if b.proc is not None and b.proc.poll() is not None), None)

    def start_broker(self, broker: DevBroker) -> None:
        """Start one broker (again) as start() does: same command, data dir, port and log."""
        broker.start(self.zookeeper_connect, self.overrides, self.log_level)

    def restart_command(self, broker: DevBroker) -> str:
        """The shell command that starts ``broker`` by hand as this command does."""
        return broker.shell_command(self.zookeeper_connect, self.overrides, self.log_level)

    def stop(self, grace: float = STOP_GRACE_S) -> list[int]:
        """SIGTERM every running broker, SIGKILL those left after grace seconds, then stop our ZooKeeper.
        Returns the ids of the brokers that had to be killed."""
        for broker in self.brokers:
            broker.signal(signal.SIGCONT)  # a paused broker cannot handle SIGTERM
            broker.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        killed = []
        for broker in self.brokers:
            if broker.proc is None:
                continue
            try:
                broker.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                broker.proc.kill()
                broker.proc.wait()
                killed.append(broker.broker_id)
        if self.zk is not None:
            self.zk.stop()
        return killed


class Supervisor:
    """Watches the brokers of a running DevCluster (``poll`` from the command's loop): a broker that dies is
    reported (exit status or signal, end of its log) and, with ``restart``, started again at once (a killed
    broker's ZooKeeper registration lasts until its session expires: the new process waits for that itself,
    cluster/node.py). A broker that dies MAX_FAILED_STARTS times in a row before serving again (it crashes at
    start) is not restarted again; neither is any broker without ``restart``: both get the command that
    restarts it by hand."""

    def __init__(self, cluster: DevCluster, say: Callable[[str], None], restart: bool = True) -> None:
        self.cluster = cluster
        self.say = say
        self.restart = restart
        self.deaths = 0

    def poll(self) -> None:
        for broker in self.cluster.brokers:
            if broker.state in ("running", "starting") and not broker.running():
                self._died(broker)
            elif broker.state == "starting" and broker.broker_id in (live_broker_ids(broker.host, broker.port) or ()):
                broker.state, broker.failed_starts = "running", 0
                self.say(f"broker {broker.broker_id} is serving again on {broker.address}")

    def _died(self, broker: DevBroker) -> None:
        self.deaths += 1
        before_serving = broker.state == "starting"
        if before_serving:
            broker.failed_starts += 1
        self.say(f"broker {broker.broker_id} {broker.exit_description()}"
                 f"{' before serving again' if before_serving else ''}; the others keep running. "
                 f"Last lines of {broker.log_path}:\n{broker.log_tail()}")
        command = self.cluster.restart_command(broker)
        if not self.restart:
            broker.state = "down"
            self.say(f"not restarting it (--no-restart); restart broker {broker.broker_id} with:\n  {command}")
        elif broker.failed_starts >= MAX_FAILED_STARTS:
            broker.state = "down"
            self.say(f"broker {broker.broker_id} died {broker.failed_starts} times in a row before serving: not "
                     f"restarting it again; fix the cause (see {broker.log_path}), then restart it with:\n  {command}")
        else:
            self._restart(broker)

    def _restart(self, broker: DevBroker) -> None:
        self.cluster.start_broker(broker)
        broker.restarts += 1
        broker.state = "starting"
        self.say(f"restarted broker {broker.broker_id} (pid {broker.proc.pid}, restart {broker.restarts}); it "
                 f"rejoins once ZooKeeper has dropped its previous registration (zookeeper.session.timeout.ms)")


def run(brokers: int, data_dir: Path, *, zookeeper: str | None, base_port: int | None, host: str,
        overrides: tuple[str, ...], log_level: str, ready_timeout: float = READY_TIMEOUT_S,
        out: TextIO = sys.stdout, restart: bool = True) -> int:
    """The ``pykbroker cluster`` command: start, report, run until SIGINT/SIGTERM, stop. Returns the exit status."""

    def say(message: str) -> None:
        print(message, file=out, flush=True)

    # The readiness probes ask brokers that may not answer yet (starting, restarted): their timeouts are
    # expected, not warnings for the user's terminal.
    logging.getLogger("pykbroker.protocol.client").setLevel(logging.ERROR)

    cluster = DevCluster(brokers, data_dir, zookeeper=zookeeper, host=host, base_port=base_port,
                         overrides=overrides, log_level=log_level, say=say)
    stop_requested: list[int] = []
    started = False

    def request_stop(signum, _frame) -> None:
        stop_requested.append(signum)
        if not started:
            raise _StopRequested()  # interrupts start(), which stops what it had started

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            cluster.start(ready_timeout)
        except ClusterStartError as exc:
            say(f"cluster did not start: {exc}")
            return 1
        except _StopRequested:
            say(f"{signal.Signals(stop_requested[0]).name} while starting: stopped")
            return 0
        started = True
        say(f"cluster ready: {brokers} broker(s), ZooKeeper {cluster.zookeeper_connect}")
        say(f"bootstrap servers: {cluster.bootstrap}")
        say("Ctrl-C stops the cluster")
        supervisor = Supervisor(cluster, say, restart)
        while not stop_requested:
            supervisor.poll()
            time.sleep(POLL_S)
        say(f"{signal.Signals(stop_requested[0]).name}: stopping brokers (controlled shutdown) and ZooKeeper ...")
        killed = cluster.stop()
        if killed:
            say(f"broker(s) {', '.join(map(str, killed))} did not stop within {STOP_GRACE_S:.0f} s and were killed")
        say("cluster stopped")
        return 1 if supervisor.deaths else 0
    finally:
        cluster.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

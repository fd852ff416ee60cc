"""``pykbroker cluster``: a local development cluster of N brokers coordinated by ZooKeeper.

What it runs: unless ``--zookeeper`` names one, a standalone ZooKeeper from Debian's package
(``pykbroker.cluster.zk_server``) with its data in ``D/zookeeper``; then brokers 1..N, each a
``python -P -m pykbroker serve --broker-id N --zookeeper ... --listeners PLAINTEXT://HOST:PORT`` process with
its data in ``D/broker-N`` and its output in ``D/logs/broker-N.log``. The brokers run this command's Python and
this command's pykbroker package (a checkout's directory first on PYTHONPATH, an installed one found in
site-packages, and ``-P`` keeps the working directory, perhaps a source checkout without the built C
extension, off sys.path), wherever the command is started. It waits until every broker answers
Metadata listing all N brokers (that is: registered in ZooKeeper and told about each other by the
controller's UpdateMetadata), prints the bootstrap string, and runs until Ctrl-C or SIGTERM. Stopping sends
SIGTERM to every broker (Kafka's controlled shutdown, while ZooKeeper is still up), SIGKILLs those still
running after a grace period, then stops ZooKeeper.

A broker that dies while the cluster runs (killed to try a failover, or crashed) is reported with how it
ended (exit status or signal) and the end of its log; the others keep serving, as a real cluster does. The
supervisor (:class:`Supervisor`) restarts it after a back-off, unless ``--no-restart``, it exited with status 0
(a requested shutdown) or it died MAX_DEATHS times within RESTART_WINDOW_S. A broker not restarted gets the
exact command that restarts it by hand (such a broker is not supervised, nor stopped with the cluster).

Exit status: 0 after a requested stop; 1 when ZooKeeper or a broker cannot start, the cluster is not ready
in time, or a broker failed while the cluster ran (even if restarted; not one that exited with status 0). Brokers are started in
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
# The supervisor (systemd's Restart=on-failure with StartLimitBurst/StartLimitIntervalSec): a broker that exits
# with a failure (non-zero status or a signal) is restarted after RESTART_BACKOFF_S, doubling with each death in
# the window (at most RESTART_BACKOFF_MAX_S), until it has died MAX_DEATHS times within RESTART_WINDOW_S.
MAX_DEATHS = 3
RESTART_WINDOW_S = 300.0
RESTART_BACKOFF_S = 1.0
RESTART_BACKOFF_MAX_S = 30.0
# A restarted broker is asked whether it serves at most once a PROBE_INTERVAL_S, each probe at most
# PROBE_TIMEOUT_S: one that waits for its registration holds connections unanswered, and the supervisor's
# loop must keep watching the other brokers (and Ctrl-C).
PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 0.4
LOG_TAIL_BYTES = 32 * 1024  # a dead broker's report shows the end of its log: read no more than this


def _path_entry_for(package_parent: Path) -> str | None:
    """The PYTHONPATH entry that makes a child import the pykbroker package found in package_parent: None for
    a site-packages directory (an installed package is found there anyway, and putting site-packages on
    PYTHONPATH would put it before the standard library)."""
    import site

    site_dirs = {Path(p).resolve() for p in site.getsitepackages()}
    if site.ENABLE_USER_SITE:
        site_dirs.add(Path(site.getusersitepackages()).resolve())
    return None if package_parent.resolve() in site_dirs else str(package_parent)


PACKAGE_PARENT = _path_entry_for(Path(__file__).resolve().parents[1])


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
    first on PYTHONPATH (a checkout; not a site-packages dir, see _path_entry_for), output unbuffered."""
    env = dict(os.environ if env is None else env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    entries = [PACKAGE_PARENT, *(env.get("PYTHONPATH") or "").split(os.pathsep)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in entries if p))  # (each once, in order)
    if not env["PYTHONPATH"]:
        del env["PYTHONPATH"]
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
    # waiting: dead, to be restarted at restart_at (back-off)
    state: str = field(default="running", init=False)
    restarts: int = field(default=0, init=False)
    deaths: list[float] = field(default_factory=list, init=False)  # monotonic times, within RESTART_WINDOW_S
    restart_at: float = field(default=0.0, init=False)
    probed_at: float = field(default=0.0, init=False)

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
        pykbroker, same options, output appended to its log as it is written)."""
        env = child_env()
        assignments = " ".join(f"{key}={shlex.quote(env[key])}" for key in ("PYTHONUNBUFFERED", "PYTHONPATH")
                               if env.get(key))
        return (f"{assignments} {shlex.join(self.command(zookeeper, overrides, log_level))} "
                f">> {shlex.quote(str(self.log_path))} 2>&1")

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
        """The last ``lines`` lines of the log, from its last LOG_TAIL_BYTES."""
        try:
            with open(self.log_path, "rb") as log:
                size = log.seek(0, os.SEEK_END)
                log.seek(max(0, size - LOG_TAIL_BYTES))
                text = log.read().decode(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        if size > LOG_TAIL_BYTES:
            text = text[1:]  # (the first line read may be cut)
        return "\n".join(text[-lines:])


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
    """Watches the brokers of a running DevCluster (``poll`` from the command's loop), as systemd's
    Restart=on-failure does a service: a broker that dies is reported (exit status or signal, end of its log)
    and, with ``restart``, started again after a back-off (RESTART_BACKOFF_S, doubled with each death in the
    window); a killed broker's ZooKeeper registration lasts until its session expires, and the new process
    waits for that itself (cluster/node.py). A broker that died MAX_DEATHS times within RESTART_WINDOW_S
    (crashing at start or some time after serving), one that exited with status 0 (a requested shutdown,
    not a failure) and any broker without ``restart`` is not restarted: each gets the command that
    restarts it by hand. A start that fails here (OSError: the data dir, the log, the Python) counts as a
    death. ``deaths`` counts the failures (not an exit with status 0)."""

    def __init__(self, cluster: DevCluster, say: Callable[[str], None], restart: bool = True) -> None:
        self.cluster = cluster
        self.say = say
        self.restart = restart
        self.deaths = 0

    def poll(self) -> None:
        for broker in self.cluster.brokers:
            now = time.monotonic()
            if broker.state in ("running", "starting") and not broker.running():
                self._died(broker, now)
            elif broker.state == "waiting" and now >= broker.restart_at:
                self._restart(broker)
            elif broker.state == "starting" and now - broker.probed_at >= PROBE_INTERVAL_S:
                broker.probed_at = now
                if broker.broker_id in (live_broker_ids(broker.host, broker.port, PROBE_TIMEOUT_S) or ()):
                    broker.state = "running"
                    self.say(f"broker {broker.broker_id} is serving again on {broker.address}")

    def _died(self, broker: DevBroker, now: float) -> None:
        before_serving = broker.state == "starting"
        stopped = broker.proc.returncode == 0
        self.say(f"broker {broker.broker_id} {broker.exit_description()}"
                 f"{' before serving again' if before_serving else ''}; the others keep running. "
                 f"Last lines of {broker.log_path}:\n{broker.log_tail()}")
        if stopped:  # Kafka's controlled shutdown on SIGTERM: asked for, not a failure (systemd's on-failure)
            self._leave_down(broker, "it exited with status 0 (a requested shutdown): not restarting it")
        else:
            self._failed(broker, now)

    def _failed(self, broker: DevBroker, now: float) -> None:
        """Count a death (or a failed start) and restart after the back-off, or leave the broker down."""
        self.deaths += 1
        broker.deaths = [t for t in broker.deaths if now - t < RESTART_WINDOW_S] + [now]
        if not self.restart:
            self._leave_down(broker, "not restarting it (--no-restart)")
        elif len(broker.deaths) >= MAX_DEATHS:
            self._leave_down(broker, f"broker {broker.broker_id} died {len(broker.deaths)} times within "
                                     f"{RESTART_WINDOW_S / 60:.0f} minutes: not restarting it again; fix the cause "
                                     f"(see {broker.log_path})")
        else:
            delay = min(RESTART_BACKOFF_S * 2 ** (len(broker.deaths) - 1), RESTART_BACKOFF_MAX_S)
            broker.state, broker.restart_at = "waiting", now + delay
            self.say(f"restarting broker {broker.broker_id} in {delay:.0f} s")

    def _leave_down(self, broker: DevBroker, why: str) -> None:
        broker.state = "down"
        self.say(f"{why}; restart broker {broker.broker_id} by hand with:\n"
                 f"  {self.cluster.restart_command(broker)}\n"
                 f"(a broker started by hand is not supervised: this command neither restarts it nor stops it "
                 f"with the cluster; stop it with kill PID, which is Kafka's controlled shutdown)")

    def _restart(self, broker: DevBroker) -> None:
        try:
            self.cluster.start_broker(broker)
        except OSError as exc:  # the data dir or log cannot be made, the Python cannot be run
            self.say(f"broker {broker.broker_id} could not be started again: {exc}")
            self._failed(broker, time.monotonic())
            return
        broker.restarts += 1
        broker.state, broker.probed_at = "starting", 0.0
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

"""Run a real, standalone Apache ZooKeeper server from Debian's ``zookeeper`` package.

Used by the cluster tests (tests/cluster/conftest.py) and meant for the ``pykbroker cluster`` dev command.
It starts ``java -cp <zookeeper.jar> org.apache.zookeeper.server.ZooKeeperServerMain <zoo.cfg>`` on a
free port of 127.0.0.1 with its own data dir, the admin (Jetty) server disabled and a small heap, waits
until the server answers the ``ruok`` four-letter word with ``imok`` and ``srvr`` says it serves, and
stops it with SIGTERM, then SIGKILL after a grace period. For fault tests it can be paused (SIGSTOP: the
process stays, clients' sessions run out because nobody answers their pings), resumed (SIGCONT) and
restarted on the same port and data dir (znodes and sessions survive a restart, as on a real ensemble
member).

Debian's zookeeper.jar lists its dependencies in its manifest's Class-Path, so the jar alone is the
class path; slf4j-simple is added when present so the server's warnings land in ``zookeeper.log``.
"""

from __future__ import annotations

import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
DEBIAN_JAR = Path("/usr/share/java/zookeeper.jar")
DEBIAN_SLF4J_BINDING = Path("/usr/share/java/slf4j-simple.jar")
INSTALL_HINT = (
    "Apache ZooKeeper is not installed: install Debian's package (apt-get install zookeeper, or "
    "scripts/install-test-deps.sh), which provides /usr/share/java/zookeeper.jar and a Java runtime"
)


def die_with_parent() -> None:
    """In a child before exec: SIGKILL it when the thread that started it ends, with its process killed
    too (Linux's PR_SET_PDEATHSIG); elsewhere nothing."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class ZooKeeperUnavailable(RuntimeError):
    """No ZooKeeper install (or no java) was found on this machine."""


class ZooKeeperStartError(RuntimeError):
    """The server process exited or never answered."""


class ZooKeeperPortTaken(ZooKeeperStartError):
    """Something listens on the port already."""


@dataclass(frozen=True)
class ZooKeeperInstall:
    java: str
    classpath: str


def find_install(jar: Path | str | None = None) -> ZooKeeperInstall:
    """Locate java and Debian's ZooKeeper jar (or ``jar``, or $PYKBROKER_ZOOKEEPER_JAR); raise
    ZooKeeperUnavailable saying what is missing."""
    jar_path = Path(jar or os.environ.get("PYKBROKER_ZOOKEEPER_JAR") or DEBIAN_JAR)
    if not jar_path.is_file():
        raise ZooKeeperUnavailable(f"{INSTALL_HINT} ({jar_path} not found)")
    java = shutil.which("java")
    if java is None:
        java_home = os.environ.get("JAVA_HOME")
        if java_home and Path(java_home, "bin", "java").is_file():
            java = str(Path(java_home, "bin", "java"))
    if java is None:
        raise ZooKeeperUnavailable("no java runtime found on PATH (apt-get install default-jre-headless)")
    parts = [str(jar_path)]
    if DEBIAN_SLF4J_BINDING.is_file():
        parts.append(str(DEBIAN_SLF4J_BINDING))
    return ZooKeeperInstall(java=java, classpath=os.pathsep.join(parts))


EPHEMERAL_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (Linux's default when unknown)."""
    try:
        low, high = (int(field) for field in EPHEMERAL_PORT_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


_HANDED_OUT: set[int] = set()  # every port free_port returned in this process


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, outside the ephemeral range when one is free there: a server restarted
    on it later never finds it taken as the local port of some outgoing connection (which a port the kernel
    picked, inside that range, could be); never one this process was handed before (servers that ask in turn,
    before any binds, never get the same one)."""
    for _ in range(100):
        port = _free_port_now(host)
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free port on {host} that was not handed out before ({len(_HANDED_OUT)} were)")


def port_slice(env=os.environ) -> tuple[int, int]:
    """(i, n): this process takes only ports p with p % n == i. The tests run in n concurrent pytest-xdist
    workers (PYTEST_XDIST_WORKER=gw<i>, PYTEST_XDIST_WORKER_COUNT=n, inherited by the processes they start):
    a port one worker picked and has not bound yet (a broker starting, or restarting after a kill) is never
    picked by another. (0, 1) otherwise."""
    worker, count = env.get("PYTEST_XDIST_WORKER", ""), env.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1:
        return int(worker[2:]) % int(count), int(count)
    return 0, 1


def _free_port_now(host: str) -> int:
    low, high = ephemeral_port_range()
    candidates = [range(1024, min(low, 65536)), range(max(high + 1, 1024), 65536)]
    total = sum(len(part) for part in candidates)
    index, count = port_slice()
    for _ in range(64 if total else 0):
        number = random.randrange(total)
        port = number + candidates[0].start if number < len(candidates[0]) else \
            number - len(candidates[0]) + candidates[1].start
        port += (index - port) % count  # up to this worker's slice; past the end of its part: try again
        if not any(port in part for part in candidates):
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def four_letter_word(host: str, port: int, word: str, timeout: float = 1.0) -> str:
    """Send a four-letter command (ruok, srvr, stat, mntr) and return the whole answer."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(word.encode("ascii"))
        chunks = []
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


@dataclass
class ZooKeeperServer:
    """One standalone ZooKeeper server process. Use as a context manager or call start()/stop()."""

    data_dir: Path | None = None
    port: int = 0
    host: str = "127.0.0.1"
    tick_time_ms: int = 500
    min_session_timeout_ms: int = 1000
    max_session_timeout_ms: int = 60000
    heap: str = "128m"
    install: ZooKeeperInstall | None = None
    # The JVM is SIGKILLed when the thread that started it ends (a killed test run, a crashed dev cluster).
    die_with_parent: bool = False
    # Called with the JVM's pid as soon as it is spawned, before it answers (to record it for a later sweep).
    on_spawn: Callable[[int], None] | None = None
    proc: subprocess.Popen | None = field(default=None, init=False)
    _own_dir: bool = field(default=False, init=False)
    _log_file: object | None = field(default=None, init=False)

    @property
    def connect_string(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def log_path(self) -> Path:
        assert self.data_dir is not None
        return self.data_dir / "zookeeper.log"

    def _write_config(self) -> Path:
        assert self.data_dir is not None
        cfg = self.data_dir / "zoo.cfg"
        cfg.write_text(
            "\n".join(
                [
                    f"tickTime={self.tick_time_ms}",
                    f"dataDir={self.data_dir / 'data'}",
                    f"clientPort={self.port}",
                    f"clientPortAddress={self.host}",
                    f"minSessionTimeout={self.min_session_timeout_ms}",
                    f"maxSessionTimeout={self.max_session_timeout_ms}",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=ruok,srvr,stat,mntr,cons,conf",
                    "maxClientCnxns=0",
                    "",
                ]
            )
        )
        return cfg

    def start(self, timeout: float = 30.0) -> "ZooKeeperServer":
        if self.install is None:
            self.install = find_install()
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="pykbroker-zk-"))
            self._own_dir = True
        self.data_dir = Path(self.data_dir)
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        chosen_port = not self.port
        try:
            for attempt in range(3):
                if chosen_port:
                    self.port = free_port(self.host)
                try:
                    self._spawn(timeout)
                    return self
                except ZooKeeperPortTaken:
                    if not chosen_port or attempt == 2:
                        raise  # a free port taken between our probe and the bind: try another
        except BaseException:
            if self._own_dir:
                shutil.rmtree(self.data_dir, ignore_errors=True)
            raise
        return self

    def _spawn(self, timeout: float) -> None:
        assert self.install is not None
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((self.host, self.port))
            except OSError as exc:
                raise ZooKeeperPortTaken(f"cannot start ZooKeeper on {self.connect_string}: {exc}") from None
        cfg = self._write_config()
        cmd = [
            self.install.java,
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Dzookeeper.admin.enableServer=false",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-cp",
            self.install.classpath,
            MAIN_CLASS,
            str(cfg),
        ]
        self._log_file = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=die_with_parent if self.die_with_parent else None,
        )
        try:
            if self.on_spawn is not None:
                self.on_spawn(self.proc.pid)
            self.wait_serving(timeout)
        except BaseException:
            self._terminate()
            raise

    def answers(self) -> bool:
        try:
            return four_letter_word(self.host, self.port, "ruok", timeout=0.5) == "imok"
        except OSError:
            return False

    def wait_serving(self, timeout: float = 30.0) -> None:
        """Block until ruok answers imok and srvr reports a mode (the server accepts sessions)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise ZooKeeperStartError(
                    f"ZooKeeper exited with {self.proc.returncode}; log:\n{self.log_tail()}"
                )
            if self.answers():
                try:
                    # ours, not another server on the same port: `conf` names our data dir
                    if str(self.data_dir / "data") in four_letter_word(self.host, self.port, "conf", timeout=0.5):
                        if "Mode:" in four_letter_word(self.host, self.port, "srvr", timeout=0.5):
                            return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise ZooKeeperStartError(
                    f"ZooKeeper did not answer on {self.connect_string} within {timeout}s; log:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def pause(self, timeout: float = 5.0) -> None:
        """SIGSTOP the server: connections stay open but nothing answers. Returns once every thread of the
        JVM is stopped (the signal is delivered asynchronously: a thread could still answer meanwhile)."""
        assert self.proc is not None and self.proc.poll() is None
        os.kill(self.proc.pid, signal.SIGSTOP)
        self._wait_threads(stopped=True, timeout=timeout)

    def resume(self, timeout: float = 5.0) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)
        self._wait_threads(stopped=False, timeout=timeout)

    def _wait_threads(self, stopped: bool, timeout: float) -> None:
        """Wait until all threads are (or none is) in state T, read from /proc (Linux); elsewhere, no wait."""
        assert self.proc is not None
        task_dir = Path(f"/proc/{self.proc.pid}/task")
        if not task_dir.is_dir():
            return
        deadline = time.monotonic() + timeout
        while True:
            states = []
            for task in task_dir.iterdir():
                try:
                    # the state follows the parenthesised command name, which may itself hold spaces
                    states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
                except (OSError, IndexError):
                    continue
            if states and all((st in "tT") == stopped for st in states):
                return
            if time.monotonic() > deadline:
                raise ZooKeeperStartError(f"ZooKeeper threads not {'stopped' if stopped else 'running'}: {states}")
            time.sleep(0.01)

    def restart(self, timeout: float = 30.0) -> None:
        """Stop the process and start it again on the same port and data dir."""
        self._terminate()
        self._spawn(timeout)

    def _terminate(self, grace: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGCONT)  # a paused JVM cannot handle SIGTERM
                proc.terminate()
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(grace)
            except ProcessLookupError:
                pass
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period; remove the data dir if this object made it."""
        self._terminate()
        if self._own_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "ZooKeeperServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m pykbroker.cluster.zk_server [--port N] [--data-dir D]``: a development ZooKeeper in the
    foreground; prints the connect string, stops on Ctrl-C or SIGTERM."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m pykbroker.cluster.zk_server", description=main.__doc__)
    parser.add_argument("--port", type=int, default=0, help="client port (default: a free one)")
    parser.add_argument("--data-dir", type=Path, default=None, help="data dir (default: a temp dir, removed at exit)")
    args = parser.parse_args(argv)
    try:
        server = ZooKeeperServer(data_dir=args.data_dir, port=args.port)
        server.start()
    except (ZooKeeperUnavailable, ZooKeeperStartError) as exc:
        print(f"zk_server: {exc}", file=sys.stderr)
        return 1
    stop_requested = []
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.append(True))
    print(f"ZooKeeper {server.connect_string} (data {server.data_dir}, log {server.log_path})", flush=True)
    try:
        while not stop_requested and server.proc is not None and server.proc.poll() is None:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

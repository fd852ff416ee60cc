"""The brokers under test as child processes: spawn on a free port, wait until they answer, read their
resource use from /proc, stop them.

Two kinds, driven identically by the benchmark:
  BrokerProcess  pykbroker from this checkout (`python -m pykbroker serve`)
  KafkaBroker    Apache Kafka 3.7.1 from the reference kit (../shared/refkit): one KRaft node that is
                 both broker and controller, `bin/kafka-server-start.sh`, whose shell scripts `exec`
                 the JVM, so the spawned pid is the java process and /proc/<pid> is Kafka's own CPU
                 and memory. Its storage is formatted before the clock of start-to-ready starts.

Readiness is defined as the spec defines it: the broker answers an ApiVersions request. A listening
socket alone is not enough, because a broker may accept connections before it can serve them.
Each broker gets a fresh temporary working directory (data dir, logs) that stop() removes.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parents[2]
KAFKA_DIST = "kafka_2.13-3.7.1"
# Kafka's own start script default (kafka-server-start.sh), set explicitly so that a KAFKA_HEAP_OPTS in
# the caller's environment cannot change what is measured.
KAFKA_HEAP_OPTS = "-Xmx1g -Xms1g"

API_VERSIONS_KEY = 18
CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


class BrokerFailed(RuntimeError):
    """The broker exited or never became ready; the message carries the tail of its log."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _api_versions_v0_request(correlation_id: int) -> bytes:
    client_id = b"pykbroker-bench"
    # Request header v1: api key, api version, correlation id, nullable string client id. v0 has no body.
    payload = struct.pack(">hhih", API_VERSIONS_KEY, 0, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(payload)) + payload


def _recv_exactly(sock: socket.socket, count: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < count:
        chunk = sock.recv(count - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        chunks += chunk
    return bytes(chunks)


def answers_api_versions(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when a broker at host:port answers ApiVersions v0 with error code 0."""
    correlation_id = 7
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(_api_versions_v0_request(correlation_id))
            (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
            body = _recv_exactly(sock, size)
    except OSError:
        return False
    # Response header v0 (correlation id), then ApiVersions v0: int16 error code, array of ranges.
    if len(body) < 6:
        return False
    answered_id, error_code = struct.unpack_from(">ih", body)
    return answered_id == correlation_id and error_code == 0


@dataclass(frozen=True)
class CpuSample:
    """Broker CPU seconds (user + system, all threads) at one instant."""

    seconds: float

    def since(self, earlier: "CpuSample") -> float:
        return self.seconds - earlier.seconds


def read_cpu(pid: int) -> CpuSample:
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) is in parentheses and may contain spaces: split after the last ')'.
    fields_after_name = stat[stat.rindex(")") + 2 :].split()
    # utime and stime are fields 14 and 15 of the whole line, i.e. 12 and 13 after pid and name.
    utime, stime = int(fields_after_name[11]), int(fields_after_name[12])
    return CpuSample((utime + stime) / CLOCK_TICKS_PER_SECOND)


def read_status_kib(pid: int, key: str) -> int:
    """A 'kB' line of /proc/<pid>/status, e.g. VmHWM (peak resident set) or VmRSS."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


@dataclass
class BrokerProcess:
    """One pykbroker on a fresh data dir and a free port. Use as a context manager."""

    name = "pykbroker"
    extra_args: list[str] = field(default_factory=list)
    ready_timeout: float = 30.0
    stop_timeout: float = 10.0
    host: str = "127.0.0.1"
    port: int = 0
    start_to_ready_s: float = 0.0
    process: subprocess.Popen | None = None
    _workdir: Path | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def log_path(self) -> Path:
        assert self._workdir is not None
        return self._workdir / "broker.log"

    def command(self, workdir: Path) -> list[str]:
        return [
            sys.executable, "-m", "pykbroker", "serve",
            "--host", self.host, "--port", str(self.port), "--data-dir", str(workdir / "data"),
            "--log-level", "warning", *self.extra_args,
        ]  # fmt: skip

    def environment(self, workdir: Path) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        return env

    def prepare(self, workdir: Path) -> None:
        """Work done before the start-to-ready clock starts (none for pykbroker: it formats nothing)."""

    def start(self) -> "BrokerProcess":
        self._workdir = Path(tempfile.mkdtemp(prefix=f"{self.name}-bench-"))
        self.port = free_port()
        try:
            self.prepare(self._workdir)
        except (OSError, subprocess.SubprocessError, BrokerFailed) as exc:
            self.stop()
            raise BrokerFailed(f"{self.name} could not be prepared: {exc}") from exc
        env = self.environment(self._workdir)
        log_file = open(self.log_path, "wb")
        spawned_at = time.perf_counter()
        self.process = subprocess.Popen(
            self.command(self._workdir), cwd=self._workdir, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
        log_file.close()
        deadline = spawned_at + self.ready_timeout
        while not answers_api_versions(self.host, self.port):
            problem = None
            if self.process.poll() is not None:
                problem = f"{self.name} exited with {self.process.returncode} before ready"
            elif time.perf_counter() > deadline:
                problem = f"{self.name} not ready after {self.ready_timeout:.0f} s"
            if problem:
                tail = self.log_tail()
                self.stop()
                raise BrokerFailed(f"{problem}:\n{tail}")
            time.sleep(0.002)
        self.start_to_ready_s = time.perf_counter() - spawned_at
        return self

    def cpu(self) -> CpuSample:
        return read_cpu(self.pid)

    def peak_rss_mib(self) -> float:
        return read_status_kib(self.pid, "VmHWM") / 1024

    def rss_mib(self) -> float:
        return read_status_kib(self.pid, "VmRSS") / 1024

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise BrokerFailed(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no broker log)"

    def stop(self) -> None:
        """SIGTERM (the broker's clean shutdown), SIGKILL if it lingers; then remove the data dir."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def __enter__(self) -> "BrokerProcess":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def default_refkit() -> Path:
    """../shared/refkit beside the project; from a worktree under <root>/wt/<name>, <root>/shared/refkit."""
    for base in (REPO_ROOT.parent, REPO_ROOT.parent.parent):
        if (base / "shared" / "refkit").is_dir():
            return base / "shared" / "refkit"
    return REPO_ROOT.parent / "shared" / "refkit"


def kafka_unavailable_reason(refkit: Path) -> str | None:
    """Why Apache Kafka cannot be run from `refkit`, or None when it can."""
    start_script = refkit / KAFKA_DIST / "bin" / "kafka-server-start.sh"
    if not start_script.is_file():
        return f"no Apache Kafka at {refkit / KAFKA_DIST} (the reference kit is not on this machine)"
    if not os.access(start_script, os.X_OK):
        return f"{start_script} is not executable (chmod +x {start_script.parent}/*.sh)"
    if shutil.which("java") is None:
        return "java is not installed (Kafka 3.7 needs Java 17: apt-get install -y openjdk-17-jre-headless)"
    return None


def kraft_cluster_id() -> str:
    """A cluster id as `kafka-storage.sh random-uuid` prints it: 16 random bytes, URL-safe base64, no
    padding (made here to save a JVM start per broker). Like Kafka's Uuid.randomUuid, never one starting
    with "-": kafka-storage.sh's argument parser would take it for an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def kraft_properties(host: str, port: int, controller_port: int, log_dirs: Path) -> str:
    """server.properties of a single KRaft node. Only what a one-node cluster needs differs from
    Kafka's defaults (replication factor 1 for the internal topics); everything that shapes the
    workloads is Kafka's default and matches pykbroker's: num.partitions=1, 50 partitions of
    __consumer_offsets, 1 GiB segments, no fsync (log.flush.* unset)."""
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@{host}:{controller_port}",
        f"listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        f"advertised.listeners=PLAINTEXT://{host}:{port}",
        "inter.broker.listener.name=PLAINTEXT",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        f"log.dirs={log_dirs}",
        "offsets.topic.replication.factor=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "",
    ])  # fmt: skip


@dataclass
class KafkaBroker(BrokerProcess):
    """Apache Kafka 3.7.1 (KRaft, one node) from the reference kit, on a fresh data dir and free ports.
    `extra_args` are extra server.properties lines (key=value)."""

    name = "kafka"
    refkit: Path = field(default_factory=default_refkit)
    ready_timeout: float = 120.0  # 5-10 s on an idle 2-core machine, far more on a loaded one
    stop_timeout: float = 30.0  # a controlled shutdown

    @property
    def kafka_home(self) -> Path:
        return self.refkit / KAFKA_DIST

    def _properties_path(self, workdir: Path) -> Path:
        return workdir / "server.properties"

    def environment(self, workdir: Path) -> dict[str, str]:
        # Kafka's scripts read KAFKA_* variables; none of the caller's may change the broker measured.
        env = {key: value for key, value in os.environ.items() if not key.startswith("KAFKA_")}
        env.update(KAFKA_HEAP_OPTS=KAFKA_HEAP_OPTS, LOG_DIR=str(workdir / "kafka-logs"))
        return env

    def server_properties(self, workdir: Path) -> str:
        """The node's server.properties: kraft_properties, then the ``extra_args`` lines (later keys win)."""
        properties = kraft_properties(self.host, self.port, free_port(), workdir / "data")
        return properties + "".join(f"{line}\n" for line in self.extra_args)

    def prepare(self, workdir: Path) -> None:
        self._properties_path(workdir).write_text(self.server_properties(workdir))
        env = self.environment(workdir)
        env["KAFKA_HEAP_OPTS"] = "-Xmx256m"  # the formatting tool only
        done = subprocess.run(
            [str(self.kafka_home / "bin" / "kafka-storage.sh"), "format", "-t", kraft_cluster_id(),
             "-c", str(self._properties_path(workdir))],
            cwd=workdir, env=env, capture_output=True, text=True, timeout=self.ready_timeout,
        )  # fmt: skip
        if done.returncode != 0:
            raise BrokerFailed(f"kafka-storage.sh format failed ({done.returncode}): {done.stdout}{done.stderr}")

    def command(self, workdir: Path) -> list[str]:
        return [str(self.kafka_home / "bin" / "kafka-server-start.sh"), str(self._properties_path(workdir))]


def measure_start_to_ready(make_broker: Callable[[], BrokerProcess]) -> float:
    """Spawn a broker on a fresh data dir, time it until ApiVersions answers, stop it."""
    with make_broker() as broker:
        return broker.start_to_ready_s

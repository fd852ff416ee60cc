"""The broker under test as a child process: spawn on a free port, wait until it answers, read its
resource use from /proc, stop it.

Readiness is defined as the spec defines it: the broker answers an ApiVersions request. A listening
socket alone is not enough, because a broker may accept connections before it can serve them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

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
    """One broker on a fresh data dir and a free port. Use as a context manager."""

    extra_args: list[str] = field(default_factory=list)
    ready_timeout: float = 30.0
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

    def command(self, data_dir: Path) -> list[str]:
        return [
            sys.executable, "-m", "pykbroker", "serve",
            "--host", self.host, "--port", str(self.port), "--data-dir", str(data_dir),
            "--log-level", "warning", *self.extra_args,
        ]  # fmt: skip

    def start(self) -> "BrokerProcess":
        self._workdir = Path(tempfile.mkdtemp(prefix="pykbroker-bench-"))
        data_dir = self._workdir / "data"
        self.port = free_port()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        log_file = open(self.log_path, "wb")
        spawned_at = time.perf_counter()
        self.process = subprocess.Popen(
            self.command(data_dir), cwd=self._workdir, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
        log_file.close()
        deadline = spawned_at + self.ready_timeout
        while not answers_api_versions(self.host, self.port):
            problem = None
            if self.process.poll() is not None:
                problem = f"broker exited with {self.process.returncode} before ready"
            elif time.perf_counter() > deadline:
                problem = f"broker not ready after {self.ready_timeout:.0f} s"
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
            raise BrokerFailed(f"broker exited with {self.process.returncode}:\n{self.log_tail()}")

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
                self.process.wait(timeout=10)
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


def measure_start_to_ready(extra_args: list[str]) -> float:
    """Spawn a broker on a fresh data dir, time it until ApiVersions answers, stop it."""
    with BrokerProcess(extra_args=list(extra_args)) as broker:
        return broker.start_to_ready_s

"""Run pykbroker as a real subprocess for integration tests, and talk to it at the raw protocol level.

`BrokerProcess` owns one broker: a port on 127.0.0.1 and a data dir that stay the same across
stop/kill/restart, so a restarted broker is the "same" broker to clients. Its stdout and stderr go to a
log file (appended across restarts, each start marked) whose tail the pytest hook in conftest.py
attaches to failing tests.

The readiness check is the CLI contract: the broker is ready when it accepts a TCP connection and
answers an ApiVersions v0 request. `send_request` is the small kio-based client used for that probe and
for the few tests that must speak the protocol directly (replaying an idempotent batch, fetching the
stored batch bytes).
"""

from __future__ import annotations

import atexit
import ctypes
import datetime
import os
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

from kio.index import load_response_from_request
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v4.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.list_offsets.v1.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.serial import entity_reader
from kio.static.primitive import i16, i32, i32Timedelta, i64

from pykbroker.cluster.zk_server import free_port as zk_free_port
from pykbroker.devcluster import child_env, pykbroker_command
from pykbroker.protocol.client import encode_request
from pykbroker.protocol.records import CODEC_NAMES, LOG_OVERHEAD, read_header

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
READY_TIMEOUT_S = 30.0
# The contract says SIGTERM stops the broker within 5 s; we wait longer before calling it hung so a slow
# CI machine does not turn into a flaky test, and the test that checks clean shutdown asserts the exit code.
STOP_TIMEOUT_S = 15.0
LOG_LEVEL = os.environ.get("PYKBROKER_TEST_LOG_LEVEL", "debug")

_live_brokers: set["BrokerProcess"] = set()


def wait_until(condition, what: str, timeout: float) -> None:
    """Poll condition() until it is true; AssertionError naming what was awaited after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class BrokerError(RuntimeError):
    """The broker process did not start, did not stop, or died; the message carries its log tail."""


def free_port(host: str = HOST) -> int:
    """A port free on ``host`` now, never one this process handed out before (two brokers of a cluster asking
    in turn never get the same one), outside the kernel's ephemeral range when possible (a broker restarted on
    it never finds it taken by an outgoing connection): pykbroker's own ``zk_server.free_port``."""
    return zk_free_port(host)


def _die_with_parent() -> None:
    """Runs in the child before exec: ask Linux to SIGKILL the broker if the test runner dies.

    Without this, a test run killed by pytest-timeout's thread method (os._exit, no teardown) or by CI
    would leave brokers running in their own session.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


class BrokerProcess:
    """One pykbroker subprocess on a fixed port and data dir.

    config: Kafka config keys (e.g. {"num.partitions": 4}) written to a TOML file passed with --config.
    """

    def __init__(self, workdir: Path, *, config: dict | None = None, port: int | None = None,
                 log_level: str = LOG_LEVEL):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / "broker.log"
        self.host = HOST
        self.port = port if port is not None else free_port()
        self.log_level = log_level
        self.config_path: Path | None = None
        if config:
            self.config_path = self.workdir / "broker.toml"
            self.config_path.write_text("".join(f'"{k}" = {_toml_value(v)}\n' for k, v in config.items()))
        self.process: subprocess.Popen | None = None
        self.starts = 0

    # -- addresses ---------------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    # -- lifecycle ---------------------------------------------------------------------------------

    def command(self) -> list[str]:
        cmd = pykbroker_command("serve", "--host", self.host, "--port", str(self.port),
                                "--data-dir", str(self.data_dir), "--log-level", self.log_level)
        if self.config_path is not None:
            cmd += ["--config", str(self.config_path)]
        return cmd

    def start(self, timeout: float = READY_TIMEOUT_S) -> "BrokerProcess":
        """Spawn the broker and wait until it answers ApiVersions.

        Call it from the main thread: the child is set to die with the thread that spawned it (see
        _die_with_parent), so a broker started from a short-lived worker thread would be killed with it.
        """
        if self.is_running():
            raise BrokerError(f"broker on {self.bootstrap} is already running")
        self.starts += 1
        env = child_env()  # the checkout under test (conftest puts it first on sys.path), even when not installed
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start #{self.starts}: {' '.join(self.command())}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.command(), cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent,
            )
        _live_brokers.add(self)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrokerError(
                    f"broker exited with code {self.process.returncode} before it was ready\n{self.log_tail()}")
            try:
                probe_api_versions(self.address, timeout=1.0)
                return
            except (OSError, ProtocolError) as exc:
                last_error = exc
                time.sleep(0.05)
        self.kill()
        raise BrokerError(f"broker on {self.bootstrap} not ready after {timeout:.0f} s "
                          f"(last probe error: {last_error!r})\n{self.log_tail()}")

    def stop(self, timeout: float = STOP_TIMEOUT_S, sig: int = signal.SIGTERM) -> int:
        """Signal (SIGTERM, or SIGINT) and wait; returns the exit code. A broker that does not exit is
        killed and reported."""
        if not self.is_running():
            return self.process.returncode if self.process else 0
        self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._log_stacks()
            self.kill()
            raise BrokerError(f"broker did not exit within {timeout:.0f} s of {signal.Signals(sig).name}\n"
                              f"{self.log_tail(400)}")
        _live_brokers.discard(self)
        return code

    def _log_stacks(self, wait_s: float = 2.0) -> None:
        """Ask a hung broker where it is (SIGUSR1: its asyncio tasks and threads go to its log)."""
        try:
            size = self.log_path.stat().st_size
            self.process.send_signal(signal.SIGUSR1)
        except OSError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and self.log_path.stat().st_size == size:
            time.sleep(0.05)
        time.sleep(0.2)  # the rest of the dump

    def kill(self) -> None:
        """SIGKILL: no flush, no shutdown hook. What the broker acknowledged must survive this."""
        if self.is_running():
            self.process.kill()
            self.process.wait()
        _live_brokers.discard(self)

    def restart(self, *, kill: bool = False) -> "BrokerProcess":
        """Stop (SIGTERM, or SIGKILL with kill=True) and start again on the same port and data dir."""
        if kill:
            self.kill()
        else:
            self.stop()
        return self.start()

    def close(self) -> None:
        """Teardown: stop gracefully if possible, never leave the process behind."""
        try:
            self.stop()
        finally:
            self.kill()

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 80) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no broker log)"
        tail = text.splitlines()[-lines:]
        return f"--- last {len(tail)} lines of {self.log_path} ---\n" + "\n".join(tail)

    def __enter__(self) -> "BrokerProcess":
        return self if self.is_running() else self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"BrokerProcess({self.bootstrap}, {state}, data_dir={self.data_dir})"


@atexit.register
def _kill_leftovers() -> None:
    for broker in list(_live_brokers):
        broker.kill()


# ---------------------------------------------------------------------------------------------------
# Raw protocol: one request, one response, over a fresh connection.


class ProtocolError(RuntimeError):
    """The broker's answer could not be read as the expected response."""


def read_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ProtocolError(f"connection closed after {len(chunks)} of {size} bytes")
        chunks += chunk
    return bytes(chunks)


def send_request(address: tuple[str, int], request, *, correlation_id: int = 1,
                 client_id: str = "pykbroker-tests", timeout: float = 10.0):
    """Encode `request` (a kio request entity) with the header version its API version requires, send it,
    and decode the answer as the matching kio response entity."""
    return send_request_now(address, request, correlation_id=correlation_id, client_id=client_id,
                            timeout=timeout)()


def send_request_now(address: tuple[str, int], request, *, correlation_id: int = 1,
                     client_id: str = "pykbroker-tests", timeout: float = 10.0):
    """Send `request` now on a new connection; returns a function that waits for and decodes its answer
    (so a test can do something else while the request is with the broker)."""
    response_type = load_response_from_request(type(request))
    sock = socket.create_connection(address, timeout=timeout)
    sock.sendall(encode_request(request, correlation_id, client_id))

    def answer():
        with sock:
            (size,) = struct.unpack(">i", read_exact(sock, 4))
            payload = read_exact(sock, size)
        header, header_size = entity_reader(response_type.__header_schema__)(payload, 0)
        if header.correlation_id != correlation_id:
            raise ProtocolError(f"correlation id {header.correlation_id}, expected {correlation_id}")
        response, body_size = entity_reader(response_type)(payload, header_size)
        if header_size + body_size != len(payload):
            raise ProtocolError(f"{response_type.__name__}: {len(payload) - header_size - body_size} "
                                "trailing bytes after the response body")
        return response

    return answer


def probe_api_versions(address: tuple[str, int], timeout: float = 1.0):
    """The readiness probe: an ApiVersions v0 request must be answered with error code NONE."""
    response = send_request(address, ApiVersionsRequest(), timeout=timeout)
    if response.error_code != ErrorCode.none:
        raise ProtocolError(f"ApiVersions v0 answered with {response.error_code!r}")
    return response


def list_offset(address: tuple[str, int], topic: str, partition: int, timestamp: int) -> int:
    """ListOffsets v1 for one partition: timestamp -1 = log end offset, -2 = log start offset."""
    response = send_request(address, ListOffsetsRequest(replica_id=-1, topics=(
        ListOffsetsTopic(name=topic, partitions=(
            ListOffsetsPartition(partition_index=i32(partition), timestamp=i64(timestamp)),)),)))
    answer = response.topics[0].partitions[0]
    if answer.error_code != ErrorCode.none:
        raise ProtocolError(f"ListOffsets {topic}-{partition} at {timestamp}: {answer.error_code!r}")
    return answer.offset


def fetch_raw(address: tuple[str, int], topic: str, partition: int, offset: int = 0,
              max_bytes: int = 4 * 1024 * 1024) -> bytes:
    """Fetch v4 for one partition: the record-batch bytes exactly as the broker serves them."""
    response = send_request(address, FetchRequest(
        replica_id=-1, max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=100)), min_bytes=i32(1),
        max_bytes=i32(max_bytes), isolation_level=0, topics=(FetchTopic(topic=topic, partitions=(
            FetchPartition(partition=i32(partition), fetch_offset=i64(offset),
                           partition_max_bytes=i32(max_bytes)),)),)))
    answer = response.responses[0].partitions[0]
    if answer.error_code != ErrorCode.none:
        raise ProtocolError(f"Fetch {topic}-{partition} at {offset}: {answer.error_code!r}")
    return bytes(answer.records or b"")


def init_producer_id(address: tuple[str, int]) -> tuple[int, int]:
    """InitProducerId v4 without a transactional id, as an idempotent producer sends it: (id, epoch)."""
    response = send_request(address, InitProducerIdRequest(
        transactional_id=None, transaction_timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=60000))))
    if response.error_code != ErrorCode.none:
        raise ProtocolError(f"InitProducerId: {response.error_code!r}")
    return response.producer_id, response.producer_epoch


def produce_raw(address: tuple[str, int], topic: str, partition: int, batch: bytes, *, acks: int = -1):
    """Produce v9 of one record batch to one partition; returns that partition's response entity."""
    response = send_request(address, ProduceRequest(
        transactional_id=None, acks=i16(acks), timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
        topic_data=(TopicProduceData(name=topic, partition_data=(
            PartitionProduceData(index=i32(partition), records=bytes(batch)),)),)))
    return response.responses[0].partition_responses[0]


def batch_codecs(records: bytes) -> list[str]:
    """The compression codec of each record batch in fetched bytes, in order. A partial trailing batch,
    which Fetch may return when it reaches max bytes, is skipped; any other malformed batch raises."""
    codecs, position = [], 0
    while position + LOG_OVERHEAD <= len(records):
        (batch_length,) = struct.unpack_from(">i", records, position + 8)
        if position + LOG_OVERHEAD + batch_length > len(records):
            break
        header = read_header(records, position)
        codecs.append(CODEC_NAMES[header.compression])
        position += header.size
    return codecs


# ---------------------------------------------------------------------------------------------------
# Checks shared by the client modules. Each module turns its client's acknowledgements and consumed
# messages into `Rec`s, so the invariants are written once.


class Rec(NamedTuple):
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


def keyed_workload(keys: int = 20, per_key: int = 10, padding: int = 0) -> list[tuple[bytes, bytes]]:
    """(key, value) pairs, keys interleaved, each value naming its key and its rank for that key.

    padding appends that many repetitive bytes to each value: clients send a batch uncompressed when
    compression would not shrink it, so compression tests need values that compress even alone."""
    pad = b"|" + b"abcd" * (padding // 4) if padding else b""
    return [(f"key-{k}".encode(), f"key-{k}:{n}".encode() + pad) for n in range(per_key) for k in range(keys)]


def assert_keyed_order(sent: list[tuple[bytes, bytes]], acked: list[Rec]) -> None:
    """acked[i] is the acknowledgement of sent[i]: a key always lands on one partition, and each
    partition holds its records in the order they were sent."""
    assert [(r.key, r.value) for r in acked] == sent, "acknowledgements do not match what was sent"
    partitions_of_key: dict[bytes, set[int]] = {}
    for rec in acked:
        partitions_of_key.setdefault(rec.key, set()).add(rec.partition)
    split = {key: parts for key, parts in partitions_of_key.items() if len(parts) > 1}
    assert not split, f"keys spread over several partitions: {split}"
    assert len({rec.partition for rec in acked}) > 1, "all keys hashed to one partition: partitions unused?"
    for partition in {rec.partition for rec in acked}:
        in_send_order = [rec for rec in acked if rec.partition == partition]
        by_offset = sorted(in_send_order, key=lambda rec: rec.offset)
        assert by_offset == in_send_order, f"partition {partition}: offsets do not follow send order"


def assert_dense(records: list[Rec], start: int = 0) -> None:
    """Per partition, the offsets are exactly start, start+1, ... with no gap and no repeat."""
    for partition in sorted({rec.partition for rec in records}):
        offsets = sorted(rec.offset for rec in records if rec.partition == partition)
        assert offsets == list(range(start, start + len(offsets))), (
            f"partition {partition}: offsets not dense from {start}: {_compress_ranges(offsets)}")


def assert_same_log(acked: list[Rec], consumed: list[Rec]) -> None:
    """What was read back is exactly what was acknowledged, each record at its acknowledged offset."""
    positions = [(rec.partition, rec.offset) for rec in consumed]
    duplicates = {p for p in positions if positions.count(p) > 1} if len(set(positions)) != len(positions) else set()
    assert not duplicates, f"records consumed twice at {sorted(duplicates)[:10]}"
    by_position = {(rec.partition, rec.offset): rec for rec in consumed}
    missing = [rec for rec in acked if (rec.partition, rec.offset) not in by_position]
    assert not missing, f"{len(missing)} acknowledged records not read back, first: {missing[:3]}"
    changed = [(rec, by_position[(rec.partition, rec.offset)]) for rec in acked
               if by_position[(rec.partition, rec.offset)] != rec]
    assert not changed, f"{len(changed)} records differ (acked, read): {changed[:2]}"
    extra = sorted(set(by_position) - {(rec.partition, rec.offset) for rec in acked})
    assert not extra, f"records read that were never acknowledged at {extra[:10]}"


def _compress_ranges(offsets: list[int]) -> str:
    ranges, start = [], None
    for i, offset in enumerate(offsets):
        if start is None:
            start = offset
        if i + 1 == len(offsets) or offsets[i + 1] != offset + 1:
            ranges.append(f"{start}-{offset}" if offset != start else str(offset))
            start = None
    return ",".join(ranges)

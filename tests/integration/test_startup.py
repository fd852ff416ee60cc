"""Start-up as a new user meets it: listeners and what is advertised, one-line start-up failures, and
transactional producers failing fast while transactions are not implemented.

Start-up failures are checked on the real command (``python -m pykbroker serve``): exit status, one line
on stderr that names the thing, no traceback, and nothing written into a fresh data dir before the port
is bound.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from kio.schema.describe_cluster.v1.request import DescribeClusterRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.static.primitive import i8

from broker_process import HOST, REPO_ROOT, BrokerProcess, free_port, send_request

FAIL_TIMEOUT_S = 30.0  # a failing start must exit long before this, even on a loaded machine


def serve(*args: str, data_dir: Path) -> subprocess.CompletedProcess:
    """``pykbroker serve`` with these arguments, expected to exit by itself."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYKBROKER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "pykbroker", "serve", "--data-dir", str(data_dir), *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=FAIL_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)


def assert_one_line_failure(result: subprocess.CompletedProcess, *words: str, status: int = 1) -> str:
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def metadata_brokers(address: tuple[str, int]) -> list[tuple[int, str, int]]:
    response = send_request(address, MetadataRequest(
        topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    return [(b.node_id, b.host, b.port) for b in response.brokers]


def described_brokers(address: tuple[str, int]) -> list[tuple[int, str, int]]:
    response = send_request(address, DescribeClusterRequest(include_cluster_authorized_operations=False,
                                                            endpoint_type=i8(1)))
    assert response.error_code == ErrorCode.none
    return [(b.broker_id, b.host, b.port) for b in response.brokers]


def group_coordinator(address: tuple[str, int]) -> tuple[int, str, int]:
    response = send_request(address, FindCoordinatorRequest(key_type=i8(0), coordinator_keys=("startup-group",)))
    (coordinator,) = response.coordinators
    assert coordinator.error_code == ErrorCode.none
    return coordinator.node_id, coordinator.host, coordinator.port


# -- listeners and what is advertised ----------------------------------------------------------------


class BindAllBroker(BrokerProcess):
    """A broker started with ``--host 0.0.0.0``; the tests still reach it on 127.0.0.1."""

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("--host") + 1] = "0.0.0.0"
        return command


def test_bind_all_advertises_the_canonical_host_name_and_logs_it(tmp_path):
    with BindAllBroker(tmp_path) as broker:
        expected = (1, socket.getfqdn(), broker.port)
        assert metadata_brokers(broker.address) == [expected]
        assert described_brokers(broker.address) == [expected]
        assert group_coordinator(broker.address) == expected
        log = broker.log_path.read_text()
        assert "binds every interface" in log and f"{socket.getfqdn()}:{broker.port}" in log


def test_each_listener_answers_with_its_own_advertised_endpoint(tmp_path):
    outside_port, inside_port = free_port(), free_port()
    config = {
        "listeners": f"EXTERNAL://{HOST}:{outside_port},INTERNAL://{HOST}:{inside_port}",
        "advertised.listeners": f"EXTERNAL://kafka.example.invalid:29092,INTERNAL://{HOST}:{inside_port}",
        "listener.security.protocol.map": "EXTERNAL:PLAINTEXT,INTERNAL:PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",  # Kafka requires it without a listener named PLAINTEXT
    }
    with BrokerProcess(tmp_path, config=config, port=inside_port) as broker:
        outside, inside = (HOST, outside_port), (HOST, inside_port)
        assert metadata_brokers(outside) == [(1, "kafka.example.invalid", 29092)]
        assert metadata_brokers(inside) == [(1, HOST, inside_port)]
        assert described_brokers(outside) == [(1, "kafka.example.invalid", 29092)]
        assert described_brokers(inside) == [(1, HOST, inside_port)]
        assert group_coordinator(outside) == (1, "kafka.example.invalid", 29092)
        assert group_coordinator(inside) == (1, HOST, inside_port)
        # A stock client bootstrapping through the inside listener is sent back to it and can produce.
        confluent_kafka = pytest.importorskip("confluent_kafka")
        producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap})
        acked = []
        producer.produce("listeners-topic", b"through INTERNAL", on_delivery=lambda err, msg: acked.append(err))
        assert producer.flush(30) == 0
        assert acked == [None]


# -- start-up failures: one line, non-zero, nothing written ---------------------------------------------


def test_port_in_use_is_one_line_and_writes_nothing(tmp_path):
    data_dir = tmp_path / "fresh"
    with socket.socket() as holder:
        holder.bind((HOST, 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = serve("--host", HOST, "--port", str(port), data_dir=data_dir)
    assert_one_line_failure(result, f"{HOST}:{port}", "in use")
    assert not data_dir.exists(), "the data dir was created before the port was bound"


def test_data_dir_locked_by_another_broker_is_one_line(broker, tmp_path):
    result = serve("--host", HOST, "--port", str(free_port()), data_dir=broker.data_dir)
    assert_one_line_failure(result, str(broker.data_dir), "locked by another broker")
    assert (broker.data_dir / ".lock").exists()


def test_unresolvable_host_is_named(tmp_path):
    data_dir = tmp_path / "fresh"
    result = serve("--host", "no-such-host.invalid", "--port", str(free_port()), data_dir=data_dir)
    assert_one_line_failure(result, "no-such-host.invalid")
    assert not data_dir.exists()


def test_data_dir_that_cannot_be_created_is_named(tmp_path):
    # /sys refuses new directories even to root, where permission bits would not.
    data_dir = Path("/sys") / f"pykbroker-test-{os.getpid()}"
    if not os.path.ismount("/sys"):
        pytest.skip("needs /sys mounted as sysfs, which refuses new directories")
    result = serve("--host", HOST, "--port", str(free_port()), data_dir=data_dir)
    assert_one_line_failure(result, str(data_dir), "not writable")


def test_data_dir_without_write_permission_is_named(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions (the /sys test covers the message)")
    data_dir = tmp_path / "read-only"
    data_dir.mkdir()
    data_dir.chmod(0o555)
    try:
        result = serve("--host", HOST, "--port", str(free_port()), data_dir=data_dir)
    finally:
        data_dir.chmod(0o755)
    assert_one_line_failure(result, str(data_dir), "not writable")


def test_a_sasl_ssl_listener_without_a_key_store_is_refused_before_the_data_dir_is_made(tmp_path):
    """Every security protocol is served; one that cannot work as configured (SASL_SSL: TLS first, and no
    ssl.keystore.location) stops the start with one line naming the listener, before anything is written."""
    data_dir = tmp_path / "fresh"
    port = free_port()
    result = serve("--listeners", f"SASL_SSL://{HOST}:{port}", "--override",
                   "security.inter.broker.protocol=SASL_SSL", data_dir=data_dir)
    assert_one_line_failure(result, f"SASL_SSL://{HOST}:{port}", "ssl.keystore.location", status=1)
    assert not data_dir.exists()


def test_serve_version(tmp_path):
    result = serve("--version", data_dir=tmp_path / "unused")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("pykbroker ")


def test_sigusr1_logs_every_task_and_thread_and_the_broker_keeps_serving(broker):
    """A broker that hangs (say, in its shutdown) can be asked where it is: BrokerProcess.stop does so before
    it kills one that did not exit."""
    broker._log_stacks(wait_s=10)
    log = broker.log_path.read_text()
    assert "stacks on SIGUSR1:" in log
    assert "Broker._close_idle_connections" in log  # a task of every broker
    assert "thread MainThread:" in log
    assert broker.is_running()
    assert broker.stop() == 0

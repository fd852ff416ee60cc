"""pykbroker.testcontainers: PykbrokerContainer. Its container tests need a Docker engine and skip, saying so,
where none runs (the docker CLI alone is not enough); the ImportError without testcontainers needs neither."""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_without_testcontainers_the_import_error_says_what_to_install():
    code = (
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'testcontainers' or name.startswith('testcontainers.'):\n"
        "            raise ImportError('hidden for the test: ' + name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "import pykbroker.testcontainers\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT,
                          env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert done.returncode == 1
    assert ("ImportError: pykbroker.testcontainers needs the testcontainers package, which is not installed: "
            "pip install testcontainers") in done.stderr


def docker_engine_or_skip():
    pytest.importorskip("testcontainers", reason="testcontainers is not installed")
    import docker

    try:
        docker.from_env(timeout=5).ping()
    except Exception as exc:  # DockerException, connection refused, missing socket, ...
        pytest.skip(f"no Docker engine: {exc}")


@pytest.fixture(scope="module")
def image():
    docker_engine_or_skip()
    from pykbroker.testcontainers import PykbrokerContainer

    return PykbrokerContainer.build_image(f"pykbroker-test:{uuid.uuid4().hex[:8]}")


def test_container_serves_kafka_clients(image):
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from pykbroker.testcontainers import PykbrokerContainer

    with PykbrokerContainer(image).with_partitions(3) as kafka:
        bootstrap = kafka.get_bootstrap_server()
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("orders")])["orders"].result(30)
        assert len(admin.list_topics(timeout=10).topics["orders"].partitions) == 3  # with_partitions
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce("orders", value=b"one", partition=2)
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "auto.offset.reset": "earliest"})
        consumer.subscribe(["orders"])
        message = None
        for _ in range(30):
            message = consumer.poll(1)
            if message is not None and message.error() is None:
                break
        consumer.close()
        assert message is not None and message.value() == b"one"


def test_broker_config_reaches_the_broker(image):
    from confluent_kafka.admin import AdminClient, NewTopic

    from pykbroker.testcontainers import PykbrokerContainer

    container = PykbrokerContainer(image).with_broker_config("num.partitions", 5).with_log_level("debug")
    assert "num.partitions=5" in container.serve_command("localhost", 1)
    with container as kafka:
        admin = AdminClient({"bootstrap.servers": kafka.get_bootstrap_server()})
        admin.create_topics([NewTopic("five")])["five"].result(30)  # the broker's default partition count
        assert len(admin.list_topics(timeout=10).topics["five"].partitions) == 5


def test_module_imports_only_where_testcontainers_is():
    pytest.importorskip("testcontainers")
    module = importlib.import_module("pykbroker.testcontainers")
    assert module.PykbrokerContainer.__mro__[1].__name__ == "DockerContainer"


def test_the_start_script_command_runs_a_broker_advertising_the_mapped_address(tmp_path):
    """What the container runs, run here (no Docker needed): the flags exist and do what the container needs."""
    pytest.importorskip("testcontainers")
    from types import SimpleNamespace

    from pykbroker.testcontainers import PykbrokerContainer
    from pykbroker.testing import KafkaBroker, _Admin

    port = KafkaBroker().port  # a free port
    fake = SimpleNamespace(port=port, log_level="warning", broker_config={"num.partitions": "4"})
    command = PykbrokerContainer.serve_command(fake, "127.0.0.1", port)
    command[command.index("/data")] = str(tmp_path / "data")
    command[command.index("0.0.0.0")] = "127.0.0.1"
    assert command[0] == "pykbroker"
    proc = subprocess.Popen([sys.executable, "-m", *command], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"})
    try:
        admin = _Admin()
        admin.bootstrap_servers = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                response = admin._metadata()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "the broker did not start"
                time.sleep(0.05)
        assert [(b.host, b.port) for b in response.brokers] == [("127.0.0.1", port)]
        admin.create_topic("four", partitions=None)  # the broker's num.partitions
        assert sorted(admin.partitions("four")) == [0, 1, 2, 3]
    finally:
        proc.terminate()
        proc.wait(15)


# -- without Docker: a stub engine whose container's broker exits at once ------------------------------

class _StubSdkContainer:
    """What docker's SDK Container offers that PykbrokerContainer and DockerContainer use."""

    id = "0123456789abcdef"
    short_id = id[:12]

    def __init__(self):
        self.status = "created"
        self.archives = []
        self.removed = 0

    def reload(self):
        self.status = "exited"  # the broker died before answering

    def logs(self, stdout=True, stderr=True):
        return b"pykbroker: error: bad override\n" if stderr else b""

    def put_archive(self, path, data):
        self.archives.append((path, data))

    def remove(self, force=False, v=False):
        if self.removed:
            raise RuntimeError("404 Client Error: No such container")  # what Docker answers the second time
        self.removed += 1


@pytest.fixture
def stub_engine(monkeypatch):
    pytest.importorskip("testcontainers", reason="testcontainers is not installed")
    import socket

    import testcontainers.core.container as tc

    class StubClient:
        def __init__(self, **kwargs):
            self.client = self

        def close(self):
            pass

    created = []

    def start(self):
        self._container = _StubSdkContainer()
        created.append(self._container)
        return self

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    monkeypatch.setattr(tc, "DockerClient", StubClient)
    monkeypatch.setattr(tc.DockerContainer, "start", start)
    monkeypatch.setattr(tc.DockerContainer, "get_container_host_ip", lambda self: "127.0.0.1")
    monkeypatch.setattr(tc.DockerContainer, "get_exposed_port", lambda self, port: closed_port)
    return created


def test_a_broker_that_exits_fails_start_with_its_output_and_the_container_is_removed(stub_engine):
    from pykbroker.testcontainers import PykbrokerContainer

    container = PykbrokerContainer("pykbroker:stub")
    with pytest.raises(TimeoutError) as failure:  # not a TypeError from calling the status property
        container.start(timeout=30)
    (sdk,) = stub_engine
    assert "(exited)" in str(failure.value) and "bad override" in str(failure.value)
    assert sdk.archives and sdk.archives[0][0] == "/"  # the start script was copied in
    assert sdk.removed == 1  # start() outside a `with` leaves nothing running
    container.stop()  # a later stop is harmless
    assert sdk.removed == 1


def test_a_failed_start_in_a_with_raises_the_start_error_once_removed(stub_engine):
    from pykbroker.testcontainers import PykbrokerContainer

    with pytest.raises(TimeoutError, match="exited"):
        with PykbrokerContainer("pykbroker:stub"):
            pass
    assert [sdk.removed for sdk in stub_engine] == [1]

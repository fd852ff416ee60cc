"""pykbroker.testcontainers without Docker: the ImportError without testcontainers, and the broker command the
container runs, run here as a bare process. PykbrokerContainer in real containers: tests/containers/."""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
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


def test_module_imports_only_where_testcontainers_is():
    pytest.importorskip("testcontainers")
    from testcontainers.core.container import DockerContainer

    module = importlib.import_module("pykbroker.testcontainers")
    assert issubclass(module.PykbrokerContainer, DockerContainer)


def test_the_serve_command_runs_a_broker_advertising_the_given_address(tmp_path):
    """What the container runs, run here (no Docker needed): the flags exist and do what the container needs."""
    pytest.importorskip("testcontainers")
    from types import SimpleNamespace

    from pykbroker.testcontainers import PykbrokerContainer
    from pykbroker.testing import KafkaBroker, _Admin

    port = KafkaBroker().port  # a free port
    fake = SimpleNamespace(port=port, log_level="warning", broker_config={"num.partitions": "4"},
                           zookeeper_connect=None, broker_id=1)
    command = PykbrokerContainer.serve_command(fake, "127.0.0.1", "127.0.0.1", port)
    command[command.index("/data")] = str(tmp_path / "data")
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


def test_build_image_outside_a_checkout_says_so(tmp_path):
    pytest.importorskip("testcontainers")
    from pykbroker.testcontainers import PykbrokerContainer

    expected = (f"no docker/Dockerfile under {tmp_path}: pass the checkout's path \\(a pip-installed pykbroker has "
                "no docker/ directory: clone the repository\\)")
    with pytest.raises(FileNotFoundError, match=expected):
        PykbrokerContainer.build_image("pykbroker-never-built:0", context=tmp_path)


def created_config(container) -> dict:
    """What the docker SDK would send to the engine to create ``container`` (its run() path, no engine asked)."""
    from docker.models.containers import _create_container_args
    from docker.types import ContainerConfig

    container._choose_ports()
    container._configure()
    args = _create_container_args({"image": container.image, "command": container._command,
                                   "environment": container.env, "ports": container.ports, **container._kwargs,
                                   "version": "1.43"})
    args.pop("host_config")
    return ContainerConfig("1.43", **args)


def offline_container(**kwargs):
    """A PykbrokerContainer made without a Docker engine (the API version given, so none is asked)."""
    from pykbroker.testcontainers import PykbrokerContainer

    return PykbrokerContainer(docker_client_kw={"version": "1.43"}, **kwargs)


def test_on_a_bridge_network_sh_gets_the_wait_loop_as_one_argument_and_health_is_served():
    pytest.importorskip("testcontainers")
    config = created_config(offline_container(host_network=False))
    # a string command is shlex-split by the docker SDK: sh -c "while" ... ends in a syntax error, exit 2
    assert config["Entrypoint"] == ["sh", "-c"]
    assert config["Cmd"] == ["while [ ! -f /tc-start.sh ]; do sleep 0.1; done; exec sh /tc-start.sh"]
    # the image's entry point (which would set it) is bypassed: /health must still be served for the HEALTHCHECK
    assert "PYKBROKER_METRICS_PORT=9644" in config["Env"]


def test_on_the_host_network_the_broker_is_the_entry_point_with_its_own_metrics_port():
    pytest.importorskip("testcontainers")
    container = offline_container(host_network=True)
    config = created_config(container)
    assert config["Entrypoint"] == ["pykbroker"]
    assert config["Cmd"][:4] == ["serve", "--host", "127.0.0.1", "--port"]
    assert f"PYKBROKER_METRICS_PORT={container.metrics_port}" in config["Env"]
    container.start_script = True  # the bridge network's path, which tests run on this host network
    assert created_config(container)["Cmd"] == [
        "while [ ! -f /tc-start.sh ]; do sleep 0.1; done; exec sh /tc-start.sh"]


@pytest.mark.parametrize("docker_host, operating_system, networks, host", [
    (None, "Debian GNU/Linux 12 (bookworm)", [], True),  # this machine: dockerd --bridge=none
    (None, "Debian GNU/Linux 12 (bookworm)", ["bridge"], True),
    ("unix:///var/run/docker.sock", "Ubuntu 22.04.4 LTS", ["bridge"], True),
    (None, "Docker Desktop", ["bridge"], False),  # its host network is its VM's
    ("unix:///Users/me/.docker/run/docker.sock", "Docker Desktop", ["bridge"], False),
    ("tcp://docker:2375", "Alpine Linux v3.19", ["bridge"], False),  # Docker in Docker, a remote engine
    ("ssh://me@builder", "Ubuntu 22.04.4 LTS", ["bridge"], False),
])
def test_the_automatic_network_is_the_hosts_only_for_a_local_linux_engine(docker_host, operating_system, networks,
                                                                           host):
    pytest.importorskip("testcontainers")
    from pykbroker.testcontainers import choose_host_network

    assert choose_host_network(docker_host, operating_system, networks) is host


def test_an_engine_neither_local_nor_with_a_bridge_network_is_refused_saying_why():
    pytest.importorskip("testcontainers")
    from pykbroker.testcontainers import ContainerStartException, choose_host_network

    with pytest.raises(ContainerStartException, match="is not this machine's .* and has no bridge network"):
        choose_host_network("tcp://docker:2375", "Docker Desktop", [])


def test_ports_are_chosen_by_start_and_never_the_same_twice_in_a_process():
    pytest.importorskip("testcontainers")
    from pykbroker.cluster.zk_server import free_port

    first, second = offline_container(host_network=True), offline_container(host_network=True)
    assert first.port is None and first.metrics_port is None  # not chosen long before the container binds them
    first._choose_ports(), second._choose_ports()
    ports = [first.port, first.metrics_port, second.port, second.metrics_port]
    assert None not in ports and len(set(ports)) == 4
    # before any binds them, 500 ports asked in turn are 500 ports (drawn at random, repeats were likely)
    assert len({free_port() for _ in range(500)}) == 500

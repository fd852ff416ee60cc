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

    with pytest.raises(FileNotFoundError, match=f"no docker/Dockerfile under {tmp_path}: pass the checkout's path"):
        PykbrokerContainer.build_image("pykbroker-never-built:0", context=tmp_path)

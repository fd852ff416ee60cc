"""The pykbroker image (docker/Dockerfile) built on the local Debian base and run with host networking:
its command line, its user, its health check, its shutdown on `docker stop`, its data volume, stock clients.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from docker_helpers import (
    ENGINE_SCRIPT,
    SUITE_LABEL,
    SUITE_LABELS,
    broker_environment,
    consume_confluent,
    pip_build_config,
    create_topic,
    docker_cli,
    free_port,
    produce_confluent,
    wait_healthy,
    wait_until,
)

import pykbroker

docker_errors = pytest.importorskip("docker.errors")

# The image on top of its base: the Python runtime and the venv (pykbroker and its dependencies). A compiler
# or the build stage's caches left in it would add well over 100 MB.
MAX_ADDED_SIZE_MB = 200


def docker_run(image: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`docker run --rm --network host IMAGE ARGS...` (the suite's labels), its exit status and output."""
    labels = [f"--label={key}={value}" for key, value in SUITE_LABELS.items()]
    return subprocess.run([docker_cli(), "run", "--rm", "--network", "host", *labels, image, *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def run_broker(docker_client, pykbroker_image):
    """Start a broker container (default command: `pykbroker serve`) on free 127.0.0.1 ports; returns it
    with .port and .bootstrap. Removed at teardown."""
    started = []

    def start(volume: str | None = None, command: list[str] | None = None):
        port, metrics_port = free_port(), free_port()
        container = docker_client.containers.run(
            pykbroker_image, command, detach=True, network_mode="host", labels=SUITE_LABELS,
            environment=broker_environment(port, metrics_port),
            volumes={volume: {"bind": "/data", "mode": "rw"}} if volume else None)
        started.append(container)
        container.port, container.bootstrap = port, f"127.0.0.1:{port}"
        return container

    yield start
    for container in started:
        with contextlib.suppress(docker_errors.NotFound):  # (data_volume's teardown may have removed it)
            container.remove(force=True, v=True)   # v: with its anonymous /data volume


@pytest.fixture
def data_volume(docker_client):
    volume = docker_client.volumes.create(f"pykbroker-test-{uuid.uuid4().hex[:10]}", labels=SUITE_LABELS)
    yield volume.name
    for container in docker_client.containers.list(all=True, filters={"volume": volume.name}):
        container.remove(force=True, v=True)
    volume.remove(force=True)


def test_engine_and_base_image(docker_client, debian_base_image):
    assert docker_client.ping()
    image = docker_client.images.get(debian_base_image)
    assert image.attrs["Os"] == "linux"
    # docker import of a debootstrap tree: a plain Debian without Python, as the Dockerfile must expect.
    done = docker_run(debian_base_image, "sh", "-c", "command -v python3 || echo no python3")
    assert (done.returncode, done.stdout.strip()) == (0, "no python3"), done


def test_image_is_small_without_compiler_and_with_the_c_accelerator(docker_client, pykbroker_image,
                                                                     debian_base_image):
    image = docker_client.images.get(pykbroker_image)
    base = docker_client.images.get(debian_base_image)
    added_mb = (image.attrs["Size"] - base.attrs["Size"]) / 1e6
    print(f"\n{pykbroker_image}: {image.attrs['Size'] / 1e6:.0f} MB, {added_mb:.0f} MB over {debian_base_image}")
    assert added_mb < MAX_ADDED_SIZE_MB
    # The build stage's compiler is not in the final image; the accelerator it built is.
    done = docker_run(pykbroker_image, "sh", "-c",
                      "command -v gcc || command -v cc || command -v x86_64-linux-gnu-gcc-12 || echo no compiler")
    assert (done.returncode, done.stdout.strip()) == (0, "no compiler"), done
    done = docker_run(pykbroker_image, "python3", "-c", "import pykbroker._speedups as s; print(s.__file__)")
    assert done.returncode == 0, done.stderr
    assert "/opt/pykbroker/" in done.stdout
    # Debian's python3 came with the CA store; the build labelled the image as the suite's (pruned when dangling).
    done = docker_run(pykbroker_image, "sh", "-c", "test -s /etc/ssl/certs/ca-certificates.crt && echo CA store")
    assert (done.returncode, done.stdout.strip()) == (0, "CA store"), done
    assert image.labels.get(SUITE_LABEL) == "1", image.labels


def test_pip_build_config_keeps_network_settings_only(tmp_path):
    """What reaches pip inside `docker build` from the host's pip configuration: no host paths, no file:// URLs
    (they do not exist in the build), the constraints file apart (its own secret)."""
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("torch<=2.14.1\n")
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nindex-url = https://index.example/simple\n"
                      f"extra-index-url = file:///opt/pypi/simple https://extra.example/simple\n"
                      f"find-links = /opt/wheels\ncert = /etc/ssl/certs/host.crt\nconstraint = {constraints}\n"
                      f"trusted-host = index.example\n")
    text, found = pip_build_config({**os.environ, "PIP_CONFIG_FILE": str(config)})
    lines = set(text.splitlines())
    assert {"[global]", "index-url = https://index.example/simple", "extra-index-url = https://extra.example/simple",
            "trusted-host = index.example"} <= lines, text
    assert not any(line.startswith(("find-links", "cert", "constraint")) for line in lines), text
    assert "file://" not in text and "/opt/" not in text
    assert found == constraints


def test_pykbroker_commands_pass_through(pykbroker_image):
    done = docker_run(pykbroker_image, "pykbroker", "--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"pykbroker {pykbroker.__version__}")
    # Options alone are `pykbroker serve`'s.
    done = docker_run(pykbroker_image, "--help")
    assert done.returncode == 0 and "Run a broker until SIGTERM or SIGINT" in done.stdout
    # A non-root user, uid 10001.
    done = docker_run(pykbroker_image, "id", "-u")
    assert done.stdout.strip() == "10001"


def test_unknown_option_is_a_clear_error(pykbroker_image):
    for args in (["pykbroker", "serve", "--no-such-option"], ["--no-such-option"]):
        done = docker_run(pykbroker_image, *args)
        assert done.returncode == 2, (args, done)
        assert "Error: No such option '--no-such-option'" in done.stderr
    done = docker_run(pykbroker_image, "pykbroker", "no-such-command")
    assert done.returncode == 2 and "No such command 'no-such-command'" in done.stderr


def test_serves_stock_clients_healthy_and_stops_cleanly(run_broker):
    from kafka import KafkaConsumer, KafkaProducer

    broker = run_broker()
    wait_healthy(broker, timeout=120)
    # The broker is PID 1 (the entry point exec'd it), running as the image's user.
    top = broker.exec_run(["sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline; echo; id -u"]).output.decode()
    assert "pykbroker serve" in top and top.split()[-1] == "10001", top

    create_topic(broker.bootstrap, "docker-image", partitions=2)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    for i in range(20):
        producer.send("docker-image", f"kafka-python {i}".encode(), partition=i % 2)
    producer.flush(30)
    producer.close()
    acked = produce_confluent(broker.bootstrap, "docker-image", [f"confluent {i}".encode() for i in range(20)])
    assert len(acked) == 20
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=10000, group_id=None)
    consumer.subscribe(["docker-image"])
    values = set()
    for message in consumer:
        values.add(message.value)
        if len(values) == 40:
            break
    consumer.close()
    assert values == {f"{client} {i}".encode() for client in ("kafka-python", "confluent") for i in range(20)}

    broker.stop(timeout=60)   # SIGTERM, SIGKILL after 60 s
    broker.reload()
    logs = broker.logs().decode(errors="replace")
    assert broker.attrs["State"]["ExitCode"] == 0, logs[-2000:]
    assert "shutting down" in logs and "pykbroker broker 1 stopped cleanly" in logs


def test_a_new_container_serves_the_volume_unchanged(run_broker, data_volume):
    first = run_broker(volume=data_volume)
    wait_healthy(first)
    create_topic(first.bootstrap, "kept", partitions=3)
    acked = produce_confluent(first.bootstrap, "kept", [f"record {i}".encode() for i in range(60)])
    assert len(acked) == 60
    first.stop(timeout=60)
    first.reload()
    assert first.attrs["State"]["ExitCode"] == 0
    # The data the non-root broker wrote belongs to its user.
    owner = run_broker(volume=data_volume, command=["stat", "-c", "%u", "/data/meta.properties"])
    assert owner.wait(timeout=60)["StatusCode"] == 0
    assert owner.logs().decode().strip() == "10001"

    second = run_broker(volume=data_volume)
    wait_healthy(second)
    logs = second.logs().decode(errors="replace")
    consumed = consume_confluent(second.bootstrap, "kept", partitions=3, expected=60)
    assert sorted(consumed) == sorted(acked)
    # The first stopped cleanly, so the second finds its clean-shutdown marker (no log recovery).
    assert "after an unclean shutdown" not in logs, logs


def test_pykbroker_cluster_runs_in_the_image(docker_client, pykbroker_image, zookeeper_image):
    """`pykbroker cluster` (3 brokers in one container) gets none of serve's defaults: no shared metrics port
    or data dir among its brokers."""
    zk_port = free_port()
    zookeeper = docker_client.containers.run(zookeeper_image, detach=True, network_mode="host",
                                             labels=SUITE_LABELS, environment={"ZOO_PORT": str(zk_port)})
    cluster = None
    try:
        wait_healthy(zookeeper)
        cluster = docker_client.containers.run(
            pykbroker_image, ["pykbroker", "cluster", "--brokers", "3", "--zookeeper", f"127.0.0.1:{zk_port}/c",
                              "--data-dir", "/data/cluster", "--no-restart"],
            detach=True, network_mode="host", labels=SUITE_LABELS)

        def said(text):
            cluster.reload()
            return text in cluster.logs().decode(errors="replace") or cluster.status == "exited"

        wait_until(lambda: said("bootstrap servers: "), "the cluster's bootstrap servers", timeout=120)
        logs = cluster.logs().decode(errors="replace")
        assert "cluster ready: 3 broker(s)" in logs, logs[-3000:]
        bootstrap = logs.split("bootstrap servers: ", 1)[1].split()[0]
        create_topic(bootstrap, "in-cluster", partitions=3, replication_factor=3)
        acked = produce_confluent(bootstrap, "in-cluster", [b"x%d" % i for i in range(30)])
        assert len(acked) == 30
        assert sorted(consume_confluent(bootstrap, "in-cluster", 3, expected=30)) == sorted(acked)
        cluster.stop(timeout=90)
        cluster.reload()
        logs = cluster.logs().decode(errors="replace")
        assert cluster.attrs["State"]["ExitCode"] == 0 and "cluster stopped" in logs, logs[-3000:]
    finally:
        for container in (cluster, zookeeper):
            if container is not None:
                container.remove(force=True, v=True)


# --- scripts/docker-engine.sh ---------------------------------------------------------------------------

def engine_script_env(state_dir, **more) -> dict:
    return {**os.environ, "DOCKER_ENGINE_STATE_DIR": str(state_dir), **more}


def run_engine_script(command: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ENGINE_SCRIPT), command], capture_output=True, text=True, env=env,
                          timeout=180)


def test_engine_script_bad_input_and_a_running_engine(docker_client, tmp_path):
    env = engine_script_env(tmp_path)
    done = run_engine_script("frobnicate", env)
    assert done.returncode == 2 and "usage:" in done.stderr
    # An engine runs (this session's fixture saw to it): start uses it, stop leaves it alone.
    assert (run_engine_script("start", env).stdout, run_engine_script("status", env).returncode) == ("running\n", 0)
    assert run_engine_script("stop", env).stdout == "not started here\n"
    assert docker_client.ping()


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a dockerd needs root")
def test_engine_script_starts_and_stops_only_its_own_dockerd(docker_client):
    """A second engine beside the suite's (its own socket, data and exec roots): started, recorded, stopped."""
    root = Path(tempfile.mkdtemp(prefix="dke-", dir="/tmp"))   # short: containerd's socket path lies inside
    socket_path = root / "d.sock"
    env = engine_script_env(root / "state", DOCKER_HOST=f"unix://{socket_path}", DOCKERD_EXTRA_ARGS=(
        f"-H unix://{socket_path} --data-root {root / 'data'} --exec-root {root / 'exec'}"))
    try:
        assert run_engine_script("status", env).returncode == 1
        done = run_engine_script("start", env)
        assert (done.returncode, done.stdout) == (0, "started\n"), done.stderr
        pid = int((root / "state" / "started-by-script").read_text())
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "dockerd"
        assert run_engine_script("start", env).stdout == "running\n"   # started once, used after
        done = run_engine_script("stop", env)
        assert (done.returncode, done.stdout) == (0, "stopped\n"), done.stderr
        assert not Path(f"/proc/{pid}").exists()
        assert run_engine_script("status", env).returncode == 1
        assert docker_client.ping()   # the suite's engine is untouched

        # A dockerd that cannot start: exit 1 and the end of its log, no record of a start.
        env["DOCKERD_EXTRA_ARGS"] += " --no-such-dockerd-flag"
        done = run_engine_script("start", env)
        assert done.returncode == 1
        assert "dockerd exited during start-up" in done.stderr and "unknown flag" in done.stderr
        assert not (root / "state" / "started-by-script").exists()
    finally:
        run_engine_script("stop", env)   # (stops the one recorded, if the test failed before its own stop)
        subprocess.run(["rm", "-rf", str(root)], check=False)

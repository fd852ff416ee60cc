"""Helpers of the container tests (tests/containers): the engine script, image builds, the suite's label.

The suite's label. Every container (and volume) a test creates carries ``SUITE_LABELS``:
``org.pykbroker.test=1`` marks it as the suite's, ``org.pykbroker.test.session=<this pytest run>`` as this
run's. The session-end clean-up in tests/containers/conftest.py force-removes this run's containers (never
another run's: test sessions of other checkouts may share the engine), so a test that fails half-way leaves
nothing running; ``docker rm -f $(docker ps -aq --filter label=org.pykbroker.test=1)`` clears every run's.
Label yours too, e.g.
``client.containers.run(..., labels=SUITE_LABELS)``, ``DockerContainer(...).with_kwargs(labels=SUITE_LABELS)``
for testcontainers, or ``docker run --label org.pykbroker.test=1``. The suite disables testcontainers' Ryuk
reaper (its image cannot be pulled here), so this label is what cleans up.

Networking: the engine the suite starts runs with ``--bridge=none``; containers use host networking
(``network_mode="host"``) and listen on free 127.0.0.1 ports.
"""

from __future__ import annotations

import configparser
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
# tests/integration (not a package): wait_until and free_port, as tests/cluster imports them.
if str(REPO_ROOT / "tests" / "integration") not in sys.path:
    sys.path.insert(0, str(REPO_ROOT / "tests" / "integration"))

from broker_process import free_port, wait_until  # noqa: E402,F401  (re-exported for the container tests)

ENGINE_SCRIPT = REPO_ROOT / "scripts" / "docker-engine.sh"

SUITE_LABEL = "org.pykbroker.test"
SESSION_LABEL = "org.pykbroker.test.session"
SESSION_ID = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
SUITE_LABELS = {SUITE_LABEL: "1", SESSION_LABEL: SESSION_ID}

# The local base (scripts/docker-engine.sh base-image) and the images the suite builds on it.
DEBIAN_BASE_IMAGE = os.environ.get("DEBIAN_BASE_IMAGE", "pykbroker-debian:bookworm")
# Tagged per checkout: worktrees of the same machine build their own tree into their own tag (the layer
# cache is shared, so a rebuild of unchanged layers is instant).
_CHECKOUT = hashlib.sha1(str(REPO_ROOT).encode()).hexdigest()[:8]
BROKER_TEST_IMAGE = f"pykbroker:test-{_CHECKOUT}"
ZOOKEEPER_TEST_IMAGE = f"pykbroker-zookeeper:test-{_CHECKOUT}"
# The host's CA bundle, handed to pip inside `docker build` as a BuildKit secret (never stored in a layer).
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def docker_cli() -> str:
    """The docker client to run: Debian's (/usr/bin/docker, the engine's own version, with the classic BuildKit
    `docker build`) before any other on PATH (a newer client wants the buildx plugin for BuildKit)."""
    if os.access("/usr/bin/docker", os.X_OK):
        return "/usr/bin/docker"
    found = shutil.which("docker")
    if not found:
        raise FileNotFoundError("no docker client installed (Debian: apt-get install docker.io)")
    return found


def compose_cli() -> list[str]:
    """Debian's docker-compose (1.29), else the compose plugin."""
    found = shutil.which("docker-compose")
    if found:
        return [found]
    return [docker_cli(), "compose"]


def engine_script(command: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run scripts/docker-engine.sh COMMAND; its stdout is the answer, its stderr the reason on failure."""
    return subprocess.run(["bash", str(ENGINE_SCRIPT), command], capture_output=True, text=True, timeout=timeout)


# pip settings that name files of the host: the CA bundle and the constraints travel as secrets of their own.
_PIP_HOST_FILE_KEYS = {"cert", "client-cert", "constraint", "requirement", "build-constraint", "log", "cache-dir"}
_PIP_URL_KEYS = {"index-url", "extra-index-url", "find-links"}


def pip_build_config(env: dict | None = None) -> tuple[str, Path | None]:
    """The host's pip configuration for pip inside `docker build` (`pip config list`: every file and PIP_*
    variable, merged) as the text of one pip.conf, and the host's constraints file (None without one).
    Kept: the network settings (http(s) index URLs, trusted hosts, timeouts, proxy); dropped: local paths and
    file:// URLs (they do not exist inside the build) and the CA bundle and constraints (their own secrets)."""
    done = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                          env=env, timeout=60)
    config = configparser.ConfigParser(interpolation=None)
    config["global"] = {}
    constraints = None
    for line in done.stdout.splitlines():
        name, sep, value = line.partition("=")
        if not sep or "." not in name:
            continue
        key = name.rsplit(".", 1)[1]
        value = value.strip().strip("'\"")
        if key == "constraint" and Path(value).is_file():
            constraints = Path(value)
        if key in _PIP_HOST_FILE_KEYS:
            continue
        if key in _PIP_URL_KEYS:
            value = " ".join(url for url in value.split() if url.startswith(("http://", "https://")))
            if not value:
                continue
        config["global"][key] = value
    lines = [f"{key} = {value}" for key, value in config["global"].items()]
    return "[global]\n" + "\n".join(lines) + "\n", constraints


def build_image(tag: str, dockerfile: Path, context: Path, build_args: dict | None = None,
                timeout: float = 900) -> None:
    """PykbrokerContainer.build_image (the one builder: `docker build --network host` with BuildKit) of any of
    the suite's Dockerfiles, labelled as the suite's (SUITE_LABEL: the session end prunes the dangling ones),
    with the host's CA bundle, pip configuration and pip constraints as the secrets `ca_bundle`, `pip_config`
    and `pip_constraints` (see pip_build_config); AssertionError with the end of the build output when it
    fails."""
    from pykbroker.testcontainers import ContainerStartException, PykbrokerContainer

    secrets = {"ca_bundle": CA_BUNDLE} if CA_BUNDLE.is_file() else {}
    pip_config, constraints = pip_build_config()
    with tempfile.NamedTemporaryFile("w", prefix="pip-build-", suffix=".conf") as pip_config_file:
        pip_config_file.write(pip_config)
        pip_config_file.flush()
        secrets["pip_config"] = Path(pip_config_file.name)
        if constraints is not None:
            secrets["pip_constraints"] = constraints
        started = time.monotonic()
        try:
            PykbrokerContainer.build_image(tag, context, docker=docker_cli(), timeout=timeout, dockerfile=dockerfile,
                                           build_args=build_args, secrets=secrets, labels={SUITE_LABEL: "1"})
        except ContainerStartException as error:
            raise AssertionError(f"docker build of {tag} failed after {time.monotonic() - started:.0f} s: "
                                 f"{error}") from error


def unique(prefix: str) -> str:
    """A name (topic, group, ...) no other test uses: prefix-<8 hex>."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def session_containers(client, session_id: str = SESSION_ID) -> set[str]:
    """The ids of the containers (any state) labelled with the test session session_id (this one by default)."""
    return {c.id for c in client.containers.list(all=True, filters={"label": f"{SESSION_LABEL}={session_id}"})}


def session_alive(session_id: str) -> bool:
    """Whether the test session that labelled a container (SESSION_LABEL "<pid>-<random>") still runs."""
    pid = session_id.partition("-")[0]
    if not pid.isdigit():
        return True   # not one of ours: leave it
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_suite_containers(client, session_id: str = SESSION_ID) -> list[str]:
    """Force-remove every container (and suite volume) of the test session session_id (this one by default)
    and of sessions that no longer run (killed before their own clean-up), with their anonymous volumes;
    their names. Failures are logged, not raised."""
    from docker import errors

    removed = []
    for container in client.containers.list(all=True, filters={"label": SESSION_LABEL}):
        session = container.labels.get(SESSION_LABEL, "")
        if session != session_id and session_alive(session):
            continue
        try:
            container.remove(force=True, v=True)
            removed.append(container.name)
        except errors.NotFound:   # already gone (removed by its test or with --rm)
            pass
        except Exception as error:  # noqa: BLE001  (clean-up goes on with the others)
            log.warning("removing container %s of test session %s failed: %s", container.name, session, error)
    for volume in client.volumes.list(filters={"label": SESSION_LABEL}):
        session = (volume.attrs.get("Labels") or {}).get(SESSION_LABEL, "")
        if session != session_id and session_alive(session):
            continue
        try:
            volume.remove(force=True)
        except errors.NotFound:
            pass
        except Exception as error:  # noqa: BLE001
            log.warning("removing volume %s of test session %s failed: %s", volume.name, session, error)
    return removed


def prune_suite_images(client) -> None:
    """Remove the dangling (untagged) images the suite's builds left (their SUITE_LABEL): a rebuild of a
    changed tree moves the tag and leaves the old image behind."""
    try:
        client.images.prune(filters={"dangling": True, "label": f"{SUITE_LABEL}=1"})
    except Exception as error:  # noqa: BLE001  (another prune at the same time: the engine refuses a second)
        log.warning("pruning the suite's dangling images failed: %s", error)



def health_status(container) -> str:
    """The container's HEALTHCHECK state now: starting, healthy, unhealthy (or its state when it stopped)."""
    container.reload()
    state = container.attrs["State"]
    if state["Status"] != "running":
        return state["Status"]
    return state.get("Health", {}).get("Status", "none")


def wait_healthy(container, timeout: float = 120) -> None:
    """Until the container's HEALTHCHECK says healthy; AssertionError with its log tail when it stopped or
    was not healthy within timeout. "unhealthy" is not final (a loaded machine's slow check turns healthy
    again once the broker answers)."""
    deadline = time.monotonic() + timeout
    while True:
        status = health_status(container)
        if status == "healthy":
            return
        if status in ("exited", "dead") or time.monotonic() > deadline:
            logs = container.logs(tail=30).decode(errors="replace")
            raise AssertionError(f"container {container.name} is {status} (waited up to {timeout} s), "
                                 f"log tail:\n{logs}")
        time.sleep(0.5)


def broker_environment(port: int, metrics_port: int, **more: str) -> dict:
    """A broker container's settings on the host's network: Kafka and /health on 127.0.0.1."""
    return {"PYKBROKER_HOST": "127.0.0.1", "PYKBROKER_PORT": str(port),
            "PYKBROKER_METRICS_PORT": str(metrics_port), **more}


def create_topic(bootstrap: str, topic: str, partitions: int = 1, replication_factor: int = 1,
                 timeout: float = 60) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, replication_factor)], request_timeout=timeout)
    futures[topic].result(timeout)


def produce_confluent(bootstrap: str, topic: str, values: list[bytes], timeout: float = 60,
                      **settings) -> list[tuple[int, int, bytes]]:
    """Produce values with acks=all; the (partition, offset, value) of each acknowledged record. Records not
    acknowledged within timeout (or failed) are left out: the caller compares what was acknowledged."""
    from confluent_kafka import Producer

    acked: list[tuple[int, int, bytes]] = []

    def on_delivery(error, message):
        if error is None:
            acked.append((message.partition(), message.offset(), message.value()))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "message.timeout.ms": int(timeout * 1000), **settings})
    for value in values:
        producer.produce(topic, value, on_delivery=on_delivery)
        producer.poll(0)
    remaining = producer.flush(timeout + 10)
    assert remaining == 0, f"{remaining} records still undelivered after {timeout + 10} s"
    return acked


def consume_confluent(bootstrap: str, topic: str, partitions: int, expected: int,
                      timeout: float = 60) -> list[tuple[int, int, bytes]]:
    """Read every partition from its beginning until `expected` records arrived; (partition, offset, value)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"container-tests-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        records: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + timeout
        while len(records) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            records.append((message.partition(), message.offset(), message.value()))
        return records
    finally:
        consumer.close()

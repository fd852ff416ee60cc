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

import hashlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

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
DEBIAN_BASE_IMAGE = os.environ.get("PYKBROKER_BASE_IMAGE", "pykbroker-debian:bookworm")
# Tagged per checkout: worktrees of the same machine build their own tree into their own tag (the layer
# cache is shared, so a rebuild of unchanged layers is instant).
_CHECKOUT = hashlib.sha1(str(REPO_ROOT).encode()).hexdigest()[:8]
PYKBROKER_TEST_IMAGE = f"pykbroker:test-{_CHECKOUT}"
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


def build_env() -> dict:
    env = dict(os.environ)
    env["DOCKER_BUILDKIT"] = "1"
    return env


def build_image(tag: str, dockerfile: Path, context: Path, build_args: dict | None = None,
                timeout: float = 900) -> None:
    """`docker build --network host` with BuildKit and the host's CA bundle as the secret `ca_bundle`;
    AssertionError with the end of the build output when it fails."""
    command = [docker_cli(), "build", "--network", "host", "-f", str(dockerfile), "-t", tag]
    if CA_BUNDLE.is_file():
        command += ["--secret", f"id=ca_bundle,src={CA_BUNDLE}"]
    for key, value in (build_args or {}).items():
        command += ["--build-arg", f"{key}={value}"]
    command.append(str(context))
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=build_env(), timeout=timeout)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
        raise AssertionError(f"docker build of {tag} failed (exit {done.returncode}) after "
                             f"{time.monotonic() - started:.0f} s:\n{tail}")


def remove_suite_containers(client) -> list[str]:
    """Force-remove every container of this test session (its SESSION_LABEL); their names."""
    removed = []
    for container in client.containers.list(all=True, filters={"label": f"{SESSION_LABEL}={SESSION_ID}"}):
        try:
            container.remove(force=True, v=True)
            removed.append(container.name)
        except Exception:  # already gone (removed by its test or with --rm)
            pass
    return removed


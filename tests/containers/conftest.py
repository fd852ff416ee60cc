"""Fixtures of the container tests: a Docker engine, the local Debian base image, the images built from docker/.

Session fixtures:
  docker_client       a docker SDK client of a running engine: the one `docker info` reaches, else a dockerd
                      that scripts/docker-engine.sh starts (as root, --bridge=none --iptables=false). The
                      session holds a lease on it (start) and gives it back at session end (stop): the
                      dockerd the script started stops when no other session holds one. Skips with the
                      reason only where no engine can start at all.
                      At session end it force-removes this session's labelled containers and volumes and
                      those of sessions that no longer run (SUITE_LABELS in docker_helpers.py: label yours),
                      and prunes the dangling images of the suite's builds. Request it before any other Docker fixture.
  debian_base_image   the tag of the local Debian bookworm base (pykbroker-debian:bookworm), built by
                      debootstrap + docker import when missing (a few minutes, once per machine).
  pykbroker_image     docker/Dockerfile built on that base (BASE_IMAGE build argument), once per session;
                      BuildKit's layer cache makes a re-run with an unchanged tree take seconds.
  zookeeper_image     docker/zookeeper/Dockerfile (Debian's zookeeper package) on the same base.

testcontainers' Ryuk reaper cannot be pulled: TESTCONTAINERS_RYUK_DISABLED=true for the whole session, and
the label clean-up above replaces it. Containers use host networking and free 127.0.0.1 ports.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Before testcontainers is imported anywhere in this session (it reads the variable at import).
os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"

from docker_helpers import (  # noqa: E402  (tests/containers is not a package)
    DEBIAN_BASE_IMAGE,
    BROKER_TEST_IMAGE,
    REPO_ROOT,
    ZOOKEEPER_TEST_IMAGE,
    build_image,
    engine_script,
    prune_suite_images,
    remove_suite_containers,
)

CONTAINER_TESTS = Path(__file__).resolve().parent
# The first test of a session may build the base image and the images (minutes on a fresh machine); a
# test's timeout covers its fixtures' set-up.
CONTAINER_TEST_TIMEOUT_S = 900


def pytest_collection_modifyitems(config, items):
    for item in items:
        if CONTAINER_TESTS in Path(item.fspath).parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(CONTAINER_TEST_TIMEOUT_S))


def engine_failure(stderr: str) -> str:
    """The script's reason and the last line of dockerd's log it quotes (not the whole tail)."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    reasons = [line for line in lines if line.startswith("docker-engine:") and " starting " not in line]
    reason = reasons[-1] if reasons else "scripts/docker-engine.sh start failed"
    return reason if not lines or lines[-1] == reason else f"{reason} {lines[-1].strip()}"


@pytest.fixture(scope="session")
def docker_client():
    try:
        import docker
    except ImportError:
        pytest.skip("the docker SDK is not installed (pip install -e .[test] brings it with testcontainers)")
    done = engine_script("start", timeout=180)
    if done.returncode != 0:
        pytest.skip(f"no Docker engine can start here: {engine_failure(done.stderr)}")
    client = docker.from_env(timeout=120)
    try:
        yield client
    finally:
        try:
            remove_suite_containers(client)
            prune_suite_images(client)
        finally:
            client.close()
            # Gives this session's lease back; stops the dockerd the script started once no session uses it.
            stopped = engine_script("stop", timeout=120)
            assert stopped.returncode == 0, f"scripts/docker-engine.sh stop: {stopped.stderr}"


@pytest.fixture(scope="session")
def debian_base_image(docker_client) -> str:
    done = engine_script("base-image")
    if done.returncode != 0:
        pytest.fail(f"building the base image {DEBIAN_BASE_IMAGE} failed: {done.stderr.strip()}")
    return done.stdout.strip()


@pytest.fixture(scope="session")
def pykbroker_image(debian_base_image) -> str:
    build_image(BROKER_TEST_IMAGE, REPO_ROOT / "docker" / "Dockerfile", REPO_ROOT,
                {"BASE_IMAGE": debian_base_image})
    return BROKER_TEST_IMAGE


@pytest.fixture(scope="session")
def zookeeper_image(debian_base_image) -> str:
    context = REPO_ROOT / "docker" / "zookeeper"
    build_image(ZOOKEEPER_TEST_IMAGE, context / "Dockerfile", context, {"BASE_IMAGE": debian_base_image})
    return ZOOKEEPER_TEST_IMAGE

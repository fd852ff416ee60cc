"""scripts/docker-engine.sh start/stop against a second, real dockerd of the test's own (its own socket, data
root, exec root and state dir, beside the machine's engine): a start that times out leaves no dockerd behind,
and one session's stop never stops the engine under another session (leases; a dead session's lease is dropped).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
from docker_helpers import (
    ENGINE_SCRIPT,
    SESSION_LABEL,
    SUITE_LABEL,
    remove_suite_containers,
    wait_until,
)

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("dockerd") or os.access("/usr/sbin/dockerd", os.X_OK)),
    reason="starting a second dockerd needs root and dockerd")


def dockerd_pids(root: Path) -> list[int]:
    """The pids of the dockerd processes whose command line names root (this test's engine only)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "comm").read_text().strip() != "dockerd":
                continue
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            status = (proc / "status").read_text()
        except OSError:
            continue
        if str(root) in cmdline and "\nState:\tZ" not in status:
            found.append(int(proc.name))
    return found


class Engine:
    """The script run for a second engine under root (a short path: unix socket paths are short)."""

    def __init__(self, root: Path, socket: str | None = None, start_timeout: int = 60):
        self.root = root
        self.env = {**os.environ,
                    "DOCKER_ENGINE_STATE_DIR": str(root / "state"),
                    "DOCKER_ENGINE_START_TIMEOUT": str(start_timeout),
                    "DOCKER_HOST": f"unix://{socket or root / 'd.sock'}",
                    "DOCKERD_EXTRA_ARGS": f"-H unix://{root / 'd.sock'} --data-root {root / 'data'} "
                                          f"--exec-root {root / 'x'}"}

    def run(self, command: str, session: int, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(ENGINE_SCRIPT), command], capture_output=True, text=True,
                              timeout=timeout, env={**self.env, "DOCKER_ENGINE_LEASE_PID": str(session)})

    def up(self) -> bool:
        return subprocess.run(["bash", str(ENGINE_SCRIPT), "status"], capture_output=True, env=self.env,
                              timeout=60).returncode == 0


@pytest.fixture
def engine_root():
    root = Path(tempfile.mkdtemp(prefix="pkde", dir="/tmp"))
    sessions: list[subprocess.Popen] = []
    try:
        yield root, sessions
    finally:
        for session in sessions:
            session.kill()
            session.wait()
        for pid in dockerd_pids(root):   # only what a failed test left: the engine of this test
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not dockerd_pids(root), "the test's dockerd gone", timeout=30)
        subprocess.run(["umount", "-R", str(root / "x")], capture_output=True)
        subprocess.run(["umount", "-R", str(root / "data")], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def session(sessions: list) -> int:
    """A live process standing for a test session (the lease's pid)."""
    process = subprocess.Popen(["sleep", "600"])
    sessions.append(process)
    return process.pid


@needs_root
def test_start_timeout_stops_the_dockerd_it_started(engine_root):
    root, sessions = engine_root
    # dockerd listens on d.sock, the script asks another socket: it never answers, the deadline passes.
    engine = Engine(root, socket=str(root / "nobody.sock"), start_timeout=5)
    done = engine.run("start", session(sessions))
    assert done.returncode == 1, done
    assert "did not answer within 5s" in done.stderr, done.stderr
    # The dockerd itself was stopped and waited for (not only the shell that launched it); nothing recorded.
    assert dockerd_pids(root) == []
    assert not (root / "state" / "started-by-script").exists()


@needs_root
def test_stop_leaves_the_engine_to_other_sessions(engine_root):
    root, sessions = engine_root
    engine = Engine(root)
    first, second = session(sessions), session(sessions)
    assert engine.run("start", first).stdout.strip() == "started"
    started = int((root / "state" / "started-by-script").read_text())
    assert dockerd_pids(root) == [started]
    assert engine.run("start", second).stdout.strip() == "running"

    # The first session ends: the second still uses the engine.
    done = engine.run("stop", first)
    assert (done.returncode, done.stdout.strip()) == (0, "still in use"), done
    assert engine.up()

    # The second session is SIGKILLed (it never calls stop): its lease is stale; the next stop stops the engine.
    sessions[1].kill()
    sessions[1].wait()
    done = engine.run("stop", first)
    assert (done.returncode, done.stdout.strip()) == (0, "stopped"), done
    assert dockerd_pids(root) == []
    assert not engine.up()
    assert list((root / "state" / "users").iterdir()) == []
    assert engine.run("stop", first).stdout.strip() == "not started here"


def test_clean_up_removes_containers_of_dead_sessions_only(docker_client, debian_base_image):
    dead = subprocess.Popen(["true"])
    dead.wait()   # its pid: a session killed before its own clean-up
    alive = subprocess.Popen(["sleep", "600"])
    created = {}
    try:
        # "ours": a session of this process, not the suite's SESSION_ID (whose other containers must stay).
        ours = f"{os.getpid()}-c1ea0001"
        for name, session in (("dead", f"{dead.pid}-deadbeef"), ("alive", f"{alive.pid}-0badcafe"),
                              ("ours", ours)):
            created[name] = docker_client.containers.create(
                debian_base_image, ["true"], network_mode="host",
                labels={SUITE_LABEL: "1", SESSION_LABEL: session})
        removed = remove_suite_containers(docker_client, ours)
        assert {created["dead"].name, created["ours"].name} <= set(removed), removed
        assert created["alive"].name not in removed
        remaining = {c.id for c in docker_client.containers.list(all=True, filters={"label": SESSION_LABEL})}
        assert (created["dead"].id in remaining, created["ours"].id in remaining,
                created["alive"].id in remaining) == (False, False, True)
    finally:
        alive.kill()
        alive.wait()
        for container in created.values():
            try:
                container.remove(force=True)
            except Exception:  # noqa: BLE001  (removed by the clean-up under test)
                pass

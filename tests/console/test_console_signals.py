"""`pykbroker console` as systemd, Docker or `kill` stop it: SIGTERM stops it as Ctrl-C does, its worker
processes and multiprocessing's resource tracker with it (exit status 0, no process of it left).

Run: python3 -m pytest -q tests/console/test_console_signals.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from console_helpers import REPO_ROOT

from broker_process import wait_until  # tests/integration, on sys.path through console_helpers
from tests.proc_helpers import each_process

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


def children_of(pid: int) -> set[int]:
    """The live processes whose parent is pid (from /proc/N/stat)."""
    found = set()
    for child, stat in each_process("stat"):
        fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        if int(fields[1]) == pid and fields[0] != b"Z":
            found.add(child)
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"  # a zombie has exited (reparented to an init that may not reap)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_console_stops_its_worker_processes_on_sigterm_as_on_ctrl_c(sig):
    # No broker is needed: the workers start at once and their Kafka clients connect lazily.
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "pykbroker", "console", "-b", "127.0.0.1:1", "--port", "0"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    children: set[int] = set()
    try:
        wait_until(lambda: any("pykbroker console for" in line for line in lines) or proc.poll() is not None,
                 "the console's ready line", START_TIMEOUT_S)
        assert proc.poll() is None, "".join(lines)
        children = children_of(proc.pid)
        # two client workers and multiprocessing's resource tracker
        assert len(children) >= 3, f"expected the workers and the resource tracker, found {children}"

        proc.send_signal(sig)
        assert proc.wait(STOP_TIMEOUT_S) == 0, "".join(lines)
        wait_until(lambda: not any(alive(pid) for pid in children), f"the console's children {children} to exit",
                 STOP_TIMEOUT_S)
    finally:
        for pid in {proc.pid, *children}:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait()

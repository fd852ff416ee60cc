"""Run the ``pykbroker`` client commands (pykbroker/ctl) as a user does: ``python -m pykbroker ...`` in a
subprocess of this checkout, its stdout, stderr and exit status collected."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from broker_process import REPO_ROOT

CTL_TIMEOUT_S = 90.0


class CtlResult:
    def __init__(self, completed: subprocess.CompletedProcess):
        self.returncode = completed.returncode
        self.stdout = completed.stdout
        self.stderr = completed.stderr
        self.args = completed.args

    def json(self):
        return json.loads(self.stdout)

    def json_lines(self) -> list:
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]

    def rows(self) -> list[list[str]]:
        """The lines of a table on stdout split into cells (cells hold no spaces in these tests)."""
        return [line.split() for line in self.stdout.splitlines() if line.strip()]

    def __repr__(self) -> str:
        return f"CtlResult({self.args[3:]}, rc={self.returncode}, stdout={self.stdout!r}, stderr={self.stderr!r})"


def ctl(bootstrap: str | None, *args: str, input: str | None = None, env: dict | None = None,
        timeout: float = CTL_TIMEOUT_S, brokers_flag: bool = True) -> CtlResult:
    """``python -m pykbroker ARGS -b BOOTSTRAP`` (no -b when bootstrap is None)."""
    command = [sys.executable, "-m", "pykbroker", *args]
    if bootstrap is not None and brokers_flag:
        command += ["-b", bootstrap]
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), full_env.get("PYTHONPATH")) if p)
    full_env.pop("PYKBROKER_BROKERS", None)
    full_env.update(env or {})
    completed = subprocess.run(command, cwd=REPO_ROOT, env=full_env, input=input, capture_output=True, text=True,
                               timeout=timeout)
    return CtlResult(completed)

"""Kafka 3.7.1's own shell tools (../shared/refkit), run unmodified against pykbroker.

    tools = kafka_tools_or_skip()           # skips the test, with the reason, where the kit or java is absent
    out = tools.run("kafka-topics.sh", "--bootstrap-server", broker.bootstrap, "--list")
    out.stdout                               # text; a non-zero exit raises ToolFailed with stdout+stderr

Each run is one JVM (1-3 s of CPU); give tests few runs. ``check=False`` returns the CompletedProcess of a run
that is expected to fail. tests/integration and tests/cluster both import this module (tests/integration is
on sys.path in both).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT_S = 180.0

# Where the kit is and why it cannot run: the benchmarks' rules (../shared/refkit beside the project or above a
# worktree; Kafka's scripts executable; a Java runtime).
sys.path.insert(0, str(REPO_ROOT / "integration" / "bench"))
from brokers import KAFKA_DIST  # noqa: E402
from brokers import default_refkit as find_refkit  # noqa: E402
from brokers import kafka_unavailable_reason as unavailable_reason  # noqa: E402


class ToolFailed(AssertionError):
    pass


class KafkaTools:
    def __init__(self, refkit: Path) -> None:
        self.bin = refkit / KAFKA_DIST / "bin"
        self._log_dir = tempfile.mkdtemp(prefix="kafka-tools-log-")

    def run(self, tool: str, *args: str, input: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
            check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
        environment = dict(os.environ, KAFKA_HEAP_OPTS="-Xmx256m", LOG_DIR=self._log_dir,
                           # one JIT thread pool and a small heap: a loaded 2-core machine runs them in a few s
                           KAFKA_JVM_PERFORMANCE_OPTS="-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto")
        environment.update(env or {})
        done = subprocess.run([str(self.bin / tool), *args], input=input, capture_output=True, text=True,
                              timeout=timeout, env=environment)
        if check and done.returncode != 0:
            raise ToolFailed(f"{tool} {' '.join(args)} exited {done.returncode}\n--- stdout\n{done.stdout}"
                             f"\n--- stderr\n{done.stderr}")
        return done


def kafka_tools_or_skip() -> KafkaTools:
    refkit = find_refkit()
    reason = unavailable_reason(refkit)
    if reason is not None:
        pytest.skip(reason)
    return KafkaTools(refkit)

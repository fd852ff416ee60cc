"""Sample the broker with py-spy while a workload runs, and name its hot spots.

py-spy writes collapsed stacks ("frame;frame;frame count", one line per distinct stack, idle threads
left out), which flamegraph.pl and speedscope read as they are. The summary answers "where does the
broker's CPU go": leaf functions (what actually burns the CPU, library code included) and, for each
sample, the innermost frame in the broker's own code (which broker function is responsible).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path

OWN_CODE_MARKER = "pykbroker/"


class PySpyRecorder:
    def __init__(self, pid: int, out_path: Path, rate: int = 1000) -> None:
        self.pid = pid
        self.out_path = out_path
        self.rate = rate
        self._process: subprocess.Popen | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("py-spy") is not None

    def __enter__(self) -> "PySpyRecorder":
        # --nonblocking: never pause the broker, so the profiled run behaves like an unprofiled one.
        # --function: aggregate by function rather than by line.
        self._process = subprocess.Popen(
            ["py-spy", "record", "--pid", str(self.pid), "--rate", str(self.rate), "--format", "raw",
             "--function", "--nonblocking", "--output", str(self.out_path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGINT)  # py-spy writes its output when interrupted
        _, stderr = self._process.communicate(timeout=30)
        if not self.out_path.exists():
            raise RuntimeError(f"py-spy wrote no profile: {stderr.decode(errors='replace').strip()}")


def _read_stacks(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def summarize(path: Path, top: int = 15) -> dict[str, object]:
    stacks = _read_stacks(path)
    total = sum(count for _, count in stacks)
    leaf: Counter[str] = Counter()
    own_innermost: Counter[str] = Counter()
    own_inclusive: Counter[str] = Counter()
    for frames, count in stacks:
        leaf[frames[-1]] += count
        own_frames = [frame for frame in frames if OWN_CODE_MARKER in frame]
        if own_frames:
            own_innermost[own_frames[-1]] += count
            for frame in set(own_frames):
                own_inclusive[frame] += count

    def ranked(counter: Counter[str]) -> list[dict[str, object]]:
        return [
            {"frame": frame, "samples": n, "percent": round(100 * n / total, 1)} for frame, n in counter.most_common(top)
        ]

    return {
        "samples": total,
        "leaf": ranked(leaf),
        "broker_innermost": ranked(own_innermost),
        "broker_inclusive": ranked(own_inclusive),
    }


def format_summary(summary: dict[str, object]) -> str:
    sections = [
        ("broker functions, inclusive (time in the function and what it calls)", "broker_inclusive"),
        ("innermost broker frame of each sample (who is responsible)", "broker_innermost"),
        ("leaf frames, any code (where the CPU actually burns)", "leaf"),
    ]
    lines = [f"py-spy samples (non-idle): {summary['samples']}"]
    for title, key in sections:
        lines.append(f"\n{title}:")
        for entry in summary[key]:  # type: ignore[union-attr]
            lines.append(f"  {entry['percent']:5.1f}%  {entry['frame']}")
    return "\n".join(lines)

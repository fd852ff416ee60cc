"""The cleaning-speed benchmark (integration/bench/cleaner_bench.py) still runs: a small log, one cleaning in a
worker process, the speed and the event loop's lag printed (its figures are the closing note's, so a broken
benchmark must fail here, not on the day it is needed)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cleaner_bench_cleans_a_small_log_and_prints_its_speed():
    done = subprocess.run([sys.executable, str(ROOT / "integration" / "bench" / "cleaner_bench.py"), "--mb", "4",
                           "--keys", "100", "--segment-mb", "1"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"100 of \d+ records kept, [\d.]+ s -> [\d.]+ MB/s", done.stdout), done.stdout
    assert "event-loop lag during cleaning" in done.stdout
    assert re.search(r"worker peak RSS: \d+ MB", done.stdout), done.stdout


def test_cleaner_bench_counts_the_passes_for_many_distinct_keys():
    done = subprocess.run([sys.executable, str(ROOT / "integration" / "bench" / "cleaner_bench.py"), "--distinct",
                           "50000", "--dedupe-mb", "1"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    from pykbroker.log.cleaner import CleanerConfig

    capacity = CleanerConfig(dedupe_buffer_size=1 << 20).map_capacity
    passes = -(-50000 // (capacity // 500 * 500))  # whole batches of 500 keys a pass
    assert f"map capacity {capacity} keys" in done.stdout, done.stdout
    assert re.search(rf"\n{passes} passes for 50000 keys in [\d.]+ s; worker peak RSS \d+ MB", done.stdout), done.stdout

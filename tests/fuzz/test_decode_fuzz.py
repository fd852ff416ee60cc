"""Thousands of mutated frames through the frame guard and kio's decoder, in a subprocess so that a
native abort (kio's reader reserving memory for a hostile array count) is a failed test with its seed,
not a dead test run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
FRAMES = 20_000


def test_mutated_frames_are_decoded_or_refused_never_abort(fuzz_seed):
    script = (
        "from integration.fuzz.frames import decode_fuzz\n"
        f"outcome = decode_fuzz({fuzz_seed}, {FRAMES})\n"
        "print(outcome['decoded'], outcome['refused'])\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, (
        f"seed {fuzz_seed}: the decoder process ended with {result.returncode}\n{result.stderr[-3000:]}")
    decoded, refused = map(int, result.stdout.split())
    assert decoded + refused == FRAMES
    assert refused > FRAMES // 4, "mutations should break most frames: is the mutator still mutating?"

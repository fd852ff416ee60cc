"""Fuzz tests: seeded mutation fuzzing of request frames (integration/fuzz/frames.py).

Each test prints its seed; set PYKBROKER_FUZZ_SEED to replay a run. The broker tests reuse the
integration helpers (tests/integration/broker_process.py).
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

INTEGRATION_TESTS = Path(__file__).resolve().parents[1] / "integration"
if str(INTEGRATION_TESTS) not in sys.path:
    sys.path.insert(0, str(INTEGRATION_TESTS))


@pytest.fixture
def fuzz_seed() -> int:
    """PYKBROKER_FUZZ_SEED if set (to replay), else a fresh seed; printed either way."""
    seed = int(os.environ.get("PYKBROKER_FUZZ_SEED") or random.randrange(1 << 32))
    print(f"fuzz seed {seed} (replay: PYKBROKER_FUZZ_SEED={seed})")
    return seed

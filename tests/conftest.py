"""Shared pytest setup for the whole suite (unit and integration).

Tests import `pykbroker` from this checkout, whether or not it is pip-installed: the repo root goes first
on sys.path, so a stale installed copy can never be what the tests exercise.
"""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

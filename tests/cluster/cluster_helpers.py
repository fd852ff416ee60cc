"""Helpers shared by the cluster tests (tests/cluster is on sys.path when pytest imports them)."""

from __future__ import annotations

import asyncio
import time


async def wait_for(predicate, timeout: float = 15.0, what: str = "condition"):
    """Await until predicate() (a value or a coroutine) is truthy and return it; AssertionError after timeout s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)

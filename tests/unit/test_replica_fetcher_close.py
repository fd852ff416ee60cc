"""The replica fetcher stops on close() however the cancellation meets its wait (a broker that did not exit
on SIGTERM, seen in tests/cluster/test_replication_faults.py's rolling restart).

Python 3.11's asyncio.wait_for returns the inner result and drops a cancellation that arrives after the inner
awaitable finished but before wait_for resumed: a fetcher waiting for a change (a partition added by the
controlled shutdown's LeaderAndIsr) could swallow close()'s cancel and go on fetching for ever, and close()
awaited it for ever. Run: python3 -m pytest -q tests/unit/test_replica_fetcher_close.py
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from pykbroker.replication.fetcher import ReplicaFetcherManager
from tests.unit.test_replication import Clock, _manager

CONFIG = SimpleNamespace(get=lambda name: {
    "replica.fetch.wait.max.ms": 500, "replica.fetch.min.bytes": 1, "replica.fetch.response.max.bytes": 1 << 20,
    "replica.fetch.max.bytes": 1 << 20, "replica.fetch.backoff.ms": 1000, "replica.socket.timeout.ms": 30000,
}[name])


@pytest.mark.parametrize("steps", range(6))
def test_close_ends_a_fetcher_woken_just_before_its_cancellation(tmp_path, steps):
    replicas = _manager(tmp_path, Clock(), broker_id=3)
    for p in (0, 1):
        assert replicas.become_follower("t", p, 1, 1, (1, 2), (1, 2, 3), 0).name == "none"

    async def scenario():
        # No topic id yet: the partition backs off (1 s), so the fetcher waits for a change or that timeout.
        manager = ReplicaFetcherManager(3, replicas, lambda b: None, lambda t: None, CONFIG)
        manager.add_partitions({("t", 0): 1})
        for _ in range(5):
            await asyncio.sleep(0)
        assert manager._sources[1].task is not None and not manager._sources[1].task.done()
        manager.add_partitions({("t", 1): 1})  # the change that wakes the fetcher's wait
        for _ in range(steps):
            await asyncio.sleep(0)  # some step in between: the wait finished, the fetcher not yet resumed
        closing = asyncio.ensure_future(manager.close())
        done, _ = await asyncio.wait({closing}, timeout=3)
        assert closing in done, "close() still waits for the fetcher: its cancellation was lost"
        assert manager._sources[1].task.done()

    try:
        asyncio.run(scenario())
    finally:
        replicas.log_manager.shutdown()

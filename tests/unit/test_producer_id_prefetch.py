"""ZkProducerIdAllocator's block handling against a scripted ZooKeeper client: the next block is fetched in
the background once 90% of the current one is used, and a ZooKeeper failure answers InitProducerId with the
retriable COORDINATOR_LOAD_IN_PROGRESS (the real ZooKeeper path: tests/cluster/test_producer_id_allocator.py)."""

from __future__ import annotations

import asyncio

from pykbroker.cluster.producer_ids import COORDINATOR_LOAD_IN_PROGRESS, ProducerRegistry, ZkProducerIdAllocator
from pykbroker.cluster.zookeeper import ProducerIdBlock, ZkError


class ScriptedZk:
    """Hands out consecutive blocks; each request waits until the test releases it (or fails it)."""

    def __init__(self) -> None:
        self.next_first = 0
        self.requests: list[asyncio.Future] = []

    async def allocate_producer_id_block(self, broker_id: int, block_size: int) -> ProducerIdBlock:
        gate = asyncio.get_running_loop().create_future()
        self.requests.append(gate)
        await gate
        block = ProducerIdBlock(broker_id, self.next_first, self.next_first + block_size - 1)
        self.next_first += block_size
        return block


async def _settle() -> None:
    """Let the tasks started so far run their next steps."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_the_next_block_is_fetched_before_the_current_one_runs_out():
    async def scenario():
        zk = ScriptedZk()
        allocator = ZkProducerIdAllocator(zk, 1, block_size=10)
        first = asyncio.ensure_future(allocator.next_id())
        await _settle()
        assert len(zk.requests) == 1 and not first.done()  # nothing reserved yet: the first caller waits
        zk.requests[0].set_result(None)
        assert await first == 0
        assert [await allocator.next_id() for _ in range(7)] == list(range(1, 8))
        await _settle()
        assert len(zk.requests) == 1  # 8 of 10 used: no fetch yet
        assert await allocator.next_id() == 8
        await _settle()
        assert len(zk.requests) == 2  # 9 of 10 used: the next block is being fetched
        zk.requests[1].set_result(None)
        await _settle()
        ids = [await allocator.next_id() for _ in range(3)]  # served without waiting for ZooKeeper
        assert ids == [9, 10, 11] and len(zk.requests) == 2

    asyncio.run(scenario())


def test_zookeeper_failures_answer_retriably_and_exhaustion_as_a_server_error():
    class FailingZk:
        def __init__(self, exc: Exception) -> None:
            self.exc = exc

        async def allocate_producer_id_block(self, broker_id: int, block_size: int):
            raise self.exc

    async def scenario():
        unavailable = ProducerRegistry(ZkProducerIdAllocator(FailingZk(ConnectionError("connection lost")), 1))
        assert await unavailable.init_producer_id(None) == (COORDINATOR_LOAD_IN_PROGRESS, -1, -1)
        exhausted = ProducerRegistry(ZkProducerIdAllocator(FailingZk(ZkError("Exhausted all producerIds")), 1))
        assert await exhausted.init_producer_id(None) == (-1, -1, -1)

    asyncio.run(scenario())

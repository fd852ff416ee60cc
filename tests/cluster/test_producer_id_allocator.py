"""Producer ids in cluster mode: ZkProducerIdAllocator takes blocks from /latest_producer_id_block on a real
ZooKeeper; two brokers allocating at once never hand out the same id, and the next block is fetched before
the current one runs out."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install kazoo, or the project's test extra)")

from pykbroker.cluster.producer_ids import ProducerRegistry, ZkProducerIdAllocator  # noqa: E402
from pykbroker.cluster.zookeeper import PRODUCER_ID_BLOCK_PATH, KafkaZkClient, decode_producer_id_block  # noqa: E402

BLOCK = 10


class CountingZk:
    """A KafkaZkClient that counts the blocks it was asked for."""

    def __init__(self, zk: KafkaZkClient) -> None:
        self.zk = zk
        self.blocks = 0

    async def allocate_producer_id_block(self, broker_id: int, block_size: int):
        self.blocks += 1
        return await self.zk.allocate_producer_id_block(broker_id, block_size)


def test_two_brokers_allocate_disjoint_producer_ids_through_zookeeper(zk_connect, run_async):
    async def scenario():
        a = KafkaZkClient(zk_connect, session_timeout_ms=6000)
        b = KafkaZkClient(zk_connect, session_timeout_ms=6000)
        await a.start()
        await b.start()
        try:
            zk_a, zk_b = CountingZk(a), CountingZk(b)
            first = ZkProducerIdAllocator(zk_a, 1, block_size=BLOCK)
            second = ZkProducerIdAllocator(zk_b, 2, block_size=BLOCK)

            async def take(allocator, n):
                ids = []
                for _ in range(n):
                    ids.append(await allocator.next_id())
                    await asyncio.sleep(0)  # let the other broker and the prefetch run in between
                return ids

            # Concurrent callers on one allocator share its fetches too.
            ids_a, ids_b, more_a = await asyncio.gather(take(first, 45), take(second, 45), take(first, 20))
            assert len(set(ids_a + more_a + ids_b)) == 110  # no id handed out twice, across brokers
            assert ids_a == sorted(ids_a) and ids_b == sorted(ids_b)
            data, _ = await a.get(PRODUCER_ID_BLOCK_PATH)
            last = decode_producer_id_block(data).last
            assert max(ids_a + more_a + ids_b) <= last
            assert zk_a.blocks <= 65 // BLOCK + 2 and zk_b.blocks <= 45 // BLOCK + 2  # about one fetch per block

            # A third allocator (a restarted broker) starts after everything reserved so far.
            third = ZkProducerIdAllocator(a, 3, block_size=BLOCK)
            assert await third.next_id() == last + 1

            registry = ProducerRegistry(ZkProducerIdAllocator(b, 2))
            error, producer_id, epoch = await registry.init_producer_id(None)
            assert (error, epoch) == (0, 0) and producer_id > last
        finally:
            await a.close()
            await b.close()

    run_async(scenario())

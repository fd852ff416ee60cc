"""Producer ids for idempotent producers, and the InitProducerId decision.

Ids must never be handed out twice, not even across restarts or across brokers: two producers sharing an
id would have their sequence numbers mixed up on every partition. Like Kafka's ProducerIdManager, ids are
reserved in blocks of 1000 and only the reserved block is persisted, before the first id of a block is
handed out; after a crash the unused rest of a block is skipped, never reused. Two sources:

* ``ProducerIdAllocator`` (single broker): "block_start block_end" in a local file in Kafka's checkpoint
  format, replaced atomically.
* ``ZkProducerIdAllocator`` (cluster mode): blocks taken from the ZooKeeper znode
  ``/latest_producer_id_block`` by a conditional write (KafkaZkClient.allocate_producer_id_block, Kafka's
  ZkProducerIdManager), so blocks of different brokers never overlap. Like Kafka's RPCProducerIdManager it
  fetches the next block in the background once 90% of the current one is used, so InitProducerId rarely
  waits for ZooKeeper; when it must and ZooKeeper fails, the answer is the retriable
  COORDINATOR_LOAD_IN_PROGRESS, as RPCProducerIdManager answers while no block is available.

Both offer ``async next_id()``, which is all ProducerRegistry (and so the InitProducerId handler) uses.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from pathlib import Path
from typing import Protocol

from pykbroker.log.checkpoint import CorruptFile, read_checkpoint, write_checkpoint

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE
INT64_MAX = (1 << 63) - 1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1

NONE = 0
UNKNOWN_SERVER_ERROR = -1
COORDINATOR_LOAD_IN_PROGRESS = 14


PREFETCH_FRACTION = 0.9  # Kafka's RPCProducerIdManager asks for the next block once 90% of this one is used


class ProducerIdsExhausted(RuntimeError):
    """No block of producer ids is left below 2**63."""


class ProducerIdsUnavailable(RuntimeError):
    """No block could be reserved just now (ZooKeeper unreachable); a later request may succeed."""


class ProducerIdSource(Protocol):
    """What ProducerRegistry needs: the next never-used producer id."""

    async def next_id(self) -> int: ...


class ProducerIdAllocator:
    """Hands out increasing producer ids from blocks reserved durably in ``path``."""

    def __init__(self, path: Path | str, block_size: int = PRODUCER_ID_BLOCK_SIZE) -> None:
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        self._path = Path(path)
        self._block_size = block_size
        self._lock = threading.Lock()
        reserved_end = self._read_reserved_end()
        # Nothing of the next block is reserved yet: the first allocate() reserves it.
        self._next_id = reserved_end + 1
        self._block_end = reserved_end

    @property
    def path(self) -> Path:
        return self._path

    async def next_id(self) -> int:
        """The ProducerIdSource interface: a file write at most, done at once."""
        return self.allocate()

    def __str__(self) -> str:
        return f"producer id blocks in {self._path}"

    def allocate(self) -> int:
        with self._lock:
            if self._next_id > self._block_end:
                self._reserve_block(self._next_id)
            producer_id = self._next_id
            self._next_id += 1
            return producer_id

    def _reserve_block(self, block_start: int) -> None:
        block_end = block_start + self._block_size - 1
        if block_end > INT64_MAX:
            raise ProducerIdsExhausted(f"no producer id block left after {block_start - 1}")
        self._path.parent.mkdir(parents=True, exist_ok=True)
        write_checkpoint(self._path, [(block_start, block_end)])
        self._block_end = block_end

    def _read_reserved_end(self) -> int:
        """The last id of the last reserved block, or -1 when no block was ever reserved."""
        # An unreadable file stops the start: starting over from 0 would hand out ids already in use.
        try:
            entries = read_checkpoint(self._path, fields=2)
            if not entries:
                return -1
            block_start, block_end = (int(field) for field in entries[-1])
            if block_start < 0 or block_end < block_start:
                raise ValueError(f"impossible block {block_start}-{block_end}")
        except ValueError as exc:  # CorruptCheckpoint is one
            raise CorruptFile(
                self._path, f"is not a producer id block ({exc})",
                "restore it from a backup, or write '0', '1', '<start> <end>' lines with a start above every "
                "producer id in use (a lost block would hand out ids twice)",
            ) from None
        return block_end


class ZkProducerIdAllocator:
    """Producer ids from blocks reserved in ZooKeeper (cluster mode).

    ``zk`` is a started KafkaZkClient (only ``allocate_producer_id_block(broker_id, block_size)`` is used).
    Blocks are kept in order; the next one is fetched in a background task once ``prefetch_fraction`` of
    the current block is handed out, and at most one fetch is in flight (concurrent callers that find
    every block used share it). Nothing is read at construction: the first ``next_id`` fetches a block.
    """

    def __init__(self, zk, broker_id: int, *, block_size: int = PRODUCER_ID_BLOCK_SIZE,
                 prefetch_fraction: float = PREFETCH_FRACTION) -> None:
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        self._zk = zk
        self._broker_id = broker_id
        self._block_size = block_size
        self._prefetch_at = max(1, int(block_size * prefetch_fraction))
        self._blocks: deque = deque()  # ProducerIdBlocks reserved for this broker, oldest first
        self._next_id = -1  # the next id of self._blocks[0]
        self._fetch: asyncio.Task | None = None

    def __str__(self) -> str:
        return f"ZooKeeper producer id blocks of broker {self._broker_id}"

    async def next_id(self) -> int:
        while True:
            while self._blocks and self._next_id > self._blocks[0].last:
                self._blocks.popleft()
                if self._blocks:
                    self._next_id = self._blocks[0].first
            if self._blocks:
                producer_id = self._next_id
                self._next_id += 1
                if producer_id - self._blocks[0].first + 1 >= self._prefetch_at and len(self._blocks) == 1:
                    self._start_fetch()
                return producer_id
            await asyncio.shield(self._start_fetch())

    def _start_fetch(self) -> asyncio.Task:
        if self._fetch is None:
            self._fetch = asyncio.ensure_future(self._fetch_block())
            self._fetch.add_done_callback(self._fetch_done)
        return self._fetch

    async def _fetch_block(self) -> None:
        from pykbroker.cluster.zookeeper import ZkError  # kazoo: imported by cluster members only

        try:
            block = await self._zk.allocate_producer_id_block(self._broker_id, self._block_size)
        except ZkError as exc:  # the only ZkError it raises: no block left below 2**63
            raise ProducerIdsExhausted(str(exc)) from None
        except Exception as exc:  # connection loss, session expiry: retriable
            raise ProducerIdsUnavailable(f"cannot reserve a producer id block in ZooKeeper: {exc!r}") from None
        log.info("broker %d reserved producer ids %d-%d", self._broker_id, block.first, block.last)
        if not self._blocks:
            self._next_id = block.first
        self._blocks.append(block)

    def _fetch_done(self, task: asyncio.Task) -> None:
        self._fetch = None
        if not task.cancelled() and task.exception() is not None and self._blocks:
            # A prefetch nobody waited for: the current block still serves; the next request tries again.
            log.warning("prefetching a producer id block failed: %s", task.exception())


class ProducerRegistry:
    """Producer ids for InitProducerId.

    Kafka's TransactionCoordinator.handleInitProducerId, for a null transactional id, "always blindly
    accept[s] the request and return[s] a new producerId" with epoch 0: the producer id and epoch a v3+
    request carries (KIP-360) are ignored. Idempotent producers bump their epoch themselves after a
    sequence error (the Java client since 2.5) and come back here only when the epoch would overflow or they
    reset, so a fresh id is what they expect.

    Transactional ids are the transaction coordinator's (pykbroker/txn/coordinator.py), which takes its
    producer ids from ``new_id``.
    """

    def __init__(self, allocator: ProducerIdSource) -> None:
        self._allocator = allocator

    async def new_id(self) -> tuple[int, int]:
        """(error code, producer id): COORDINATOR_LOAD_IN_PROGRESS while no block can be reserved (retriable,
        as Kafka's RPCProducerIdManager answers), UNKNOWN_SERVER_ERROR when ids are exhausted or the file
        cannot be written."""
        try:
            return NONE, await self._allocator.next_id()
        except ProducerIdsUnavailable as exc:
            log.warning("no producer id available yet: %s", exc)
            return COORDINATOR_LOAD_IN_PROGRESS, NO_PRODUCER_ID
        except (OSError, ProducerIdsExhausted):
            log.exception("cannot allocate a producer id (%s)", self._allocator)
            return UNKNOWN_SERVER_ERROR, NO_PRODUCER_ID

    async def init_producer_id(self, transactional_id: None = None, producer_id: int = NO_PRODUCER_ID,
                               producer_epoch: int = NO_PRODUCER_EPOCH) -> tuple[int, int, int]:
        """Returns (error_code, producer_id, producer_epoch) for an InitProducerId without transactional id
        (the request's producer id and epoch are ignored, as Kafka does)."""
        if transactional_id is not None:
            raise ValueError("transactional ids are the transaction coordinator's")
        error, producer_id = await self.new_id()
        return error, producer_id, 0 if error == NONE else NO_PRODUCER_EPOCH

"""Producer ids for idempotent producers, and the InitProducerId decision.

Ids must never be handed out twice, not even across restarts: two producers sharing an id would have their
sequence numbers mixed up on every partition. Like Kafka's ProducerIdManager, the allocator reserves ids in
blocks of 1000 and persists only the reserved block (Kafka keeps it in the ZooKeeper znode
``/latest_producer_id_block``; we keep "block_start block_end" in a local file in Kafka's checkpoint format,
replaced atomically). The reservation is on disk
before the first id of a block is handed out, so after a crash the next start continues after the block end:
the unused rest of that block is skipped, never reused.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from pykbroker.log.checkpoint import CorruptFile, read_checkpoint, write_checkpoint

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE
INT64_MAX = (1 << 63) - 1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1

NONE = 0
UNKNOWN_SERVER_ERROR = -1
INVALID_REQUEST = 42
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53


class ProducerIdsExhausted(RuntimeError):
    """No block of producer ids is left below 2**63."""


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


class ProducerRegistry:
    """InitProducerId for a broker without transactions.

    Kafka's TransactionCoordinator.handleInitProducerId, for a null transactional id, "always blindly
    accept[s] the request and return[s] a new producerId" with epoch 0: the producer id and epoch a v3+
    request carries (KIP-360) are ignored. Idempotent producers bump their epoch themselves after a
    sequence error (the Java client since 2.5) and come back here only when the epoch would overflow or they
    reset, so a fresh id is what they expect.

    Transactions are not supported. Kafka has no "transactions disabled" error; the answer chosen is
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53), Kafka's own refusal of a transactional id, because every client
    treats it as fatal: ``initTransactions()`` fails at once with a clear exception instead of retrying (a
    retriable code such as COORDINATOR_NOT_AVAILABLE would make clients spin until their timeout). An empty
    transactional id gets INVALID_REQUEST (42), exactly as in Kafka.
    """

    def __init__(self, allocator: ProducerIdAllocator) -> None:
        self._allocator = allocator

    def init_producer_id(
        self, transactional_id: str | None, producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH
    ) -> tuple[int, int, int]:
        """Returns (error_code, producer_id, producer_epoch) for an InitProducerId response."""
        if transactional_id is None:
            try:
                return NONE, self._allocator.allocate(), 0
            except (OSError, ProducerIdsExhausted):
                log.exception("cannot allocate a producer id from %s", self._allocator.path)
                return UNKNOWN_SERVER_ERROR, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        if transactional_id == "":
            return INVALID_REQUEST, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        return TRANSACTIONAL_ID_AUTHORIZATION_FAILED, NO_PRODUCER_ID, NO_PRODUCER_EPOCH

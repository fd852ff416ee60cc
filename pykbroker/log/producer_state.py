"""Idempotent-producer state of one partition: Kafka's ProducerStateManager / ProducerAppendInfo rules.

A producer with an id (from InitProducerId) numbers its batches per partition with sequence numbers.
The partition leader remembers, per producer id, its epoch and the sequence ranges and offsets of its
last five batches, and checks each new batch before it is appended:

* an epoch lower than the known one is a zombie: INVALID_PRODUCER_EPOCH (47);
* a higher epoch starts over: its first batch must have sequence 0 (else OUT_OF_ORDER_SEQUENCE_NUMBER, 45),
  except when no epoch is known at all;
* within the same epoch a batch whose (first, last) sequence equals one of the five remembered batches is a
  retry: nothing is appended, and the producer gets the original offsets back (``DuplicateBatch``);
* otherwise the first sequence must follow the last one (wrapping from 2**31-1 to 0), else 45.

Unknown producers (Kafka >= 2.5, after KIP-360): when the partition has no state for a producer id (a new
producer, or one whose state expired) the first batch is accepted whatever its sequence; Kafka 3.x no longer
answers UNKNOWN_PRODUCER_ID (59) from the log for non-transactional producers. The rule in Kafka's code is
"if the current epoch is NO_PRODUCER_EPOCH, accept any sequence", which also covers the later batches of
that same first request.

The state is rebuilt on start by replaying batch headers from the log (the way Kafka replays the log tail
after its last snapshot), with no validation, since the log is the truth. Expiry follows Kafka: a producer
whose last batch's max timestamp is ``producer.id.expiration.ms`` old or more is forgotten.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import astuple, dataclass, field
from typing import Iterable

from pykbroker.protocol.records import NO_PRODUCER_EPOCH, NO_SEQUENCE, BatchHeader

OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
UNKNOWN_PRODUCER_ID = 59  # kept for callers that map errors; Kafka 3.x does not raise it from the log

INT32_MAX = (1 << 31) - 1
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000  # producer.id.expiration.ms
NUM_BATCHES_TO_RETAIN = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN (= max.in.flight per connection)


class ProducerStateError(Exception):
    """A batch breaks the producer's sequence or epoch rules; ``error_code`` is the Kafka error code."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


@dataclass(frozen=True)
class DuplicateBatch:
    """A retried batch: the offsets (and LogAppendTime, or -1) it was given when first appended."""

    base_offset: int
    last_offset: int
    log_append_time_ms: int


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    log_append_time_ms: int


@dataclass(slots=True)
class ProducerEntry:
    """What the partition remembers about one producer id."""

    producer_id: int
    epoch: int = NO_PRODUCER_EPOCH
    last_timestamp: int = -1  # max timestamp of the producer's last batch, used for expiry (as Kafka does)
    batches: deque[BatchMetadata] = field(default_factory=deque)

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_duplicate(self, header: BatchHeader) -> BatchMetadata | None:
        if header.producer_epoch != self.epoch:
            return None
        first_seq, last_seq = header.base_sequence, header.last_sequence
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None

    def set_epoch(self, epoch: int) -> None:
        # A new epoch restarts the sequence space: the old batches can no longer be duplicates.
        if epoch != self.epoch:
            self.batches.clear()
            self.epoch = epoch


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """Whether ``next_seq`` directly follows ``last_seq``; sequences wrap from 2**31-1 to 0."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def append_time_of(header: BatchHeader) -> int:
    """The LogAppendTime stored in an appended batch, or -1 for CreateTime batches (a Produce response's value)."""
    return header.max_timestamp if header.log_append_time else -1


class ProducerStateManager:
    """Per-partition idempotent-producer state. ``check_batches`` before an append, ``update`` after it."""

    def __init__(self, max_cached_batches: int = NUM_BATCHES_TO_RETAIN) -> None:
        if max_cached_batches < 1:
            raise ValueError("max_cached_batches must be at least 1")
        self._max_cached_batches = max_cached_batches
        self._producers: dict[int, ProducerEntry] = {}
        self.next_offset = 0  # the offset after the last batch recorded: where a replay would continue

    # -- queries ---------------------------------------------------------------------------------------

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def producer_ids(self) -> list[int]:
        return list(self._producers)

    def __len__(self) -> int:
        return len(self._producers)

    # -- before an append ------------------------------------------------------------------------------

    def check(self, header: BatchHeader) -> DuplicateBatch | None:
        """Check one batch against the recorded state; see ``check_batches``."""
        return self.check_batches((header,))

    def check_batches(self, headers: Iterable[BatchHeader]) -> DuplicateBatch | None:
        """Check the batches of one records field, in order, without changing any state.

        Returns the original offsets if a batch is a retry of one already appended (as Kafka does, the whole
        records field is then answered with them and nothing is appended). Raises ProducerStateError (45 or
        47) when a batch breaks the rules. Batches without a producer id pass. Later batches of the same
        producer are checked against the earlier ones of the same field, as if those had been appended.
        """
        pending: dict[int, tuple[int, int]] = {}  # producer id -> (epoch, last sequence) within this field
        for header in headers:
            producer_id = header.producer_id
            if producer_id < 0:
                continue
            entry = self._producers.get(producer_id)
            if entry is not None:
                duplicate = entry.find_duplicate(header)
                if duplicate is not None:
                    return DuplicateBatch(duplicate.first_offset, duplicate.last_offset, duplicate.log_append_time_ms)
            _validate(header, entry, pending.get(producer_id))
            pending[producer_id] = (header.producer_epoch, header.last_sequence)
        return None

    # -- after an append, and when replaying the log ---------------------------------------------------

    def update(self, header_after_append: BatchHeader, append_time_ms: int) -> None:
        """Record a batch that was appended; its header must carry the assigned base offset.

        ``append_time_ms`` is what a retry of this batch will be answered with as log_append_time: the
        append time for LogAppendTime topics, -1 for CreateTime (what the Produce response said).
        """
        header = header_after_append
        self.next_offset = max(self.next_offset, header.next_offset)
        if header.producer_id < 0:
            return
        entry = self._producers.get(header.producer_id)
        if entry is None:
            entry = self._producers[header.producer_id] = ProducerEntry(header.producer_id)
        entry.set_epoch(header.producer_epoch)
        entry.last_timestamp = header.max_timestamp
        if header.is_control:
            # A transaction marker moves the epoch but carries no data sequence.
            return
        if len(entry.batches) >= self._max_cached_batches:
            entry.batches.popleft()
        entry.batches.append(
            BatchMetadata(header.base_sequence, header.last_sequence, header.base_offset, header.last_offset, append_time_ms)
        )

    def replay(self, headers: Iterable[BatchHeader]) -> None:
        """Apply batches read back from the log on top of the current state (no validation: the log is the truth)."""
        for header in headers:
            self.update(header, append_time_of(header))

    def rebuild(self, headers: Iterable[BatchHeader]) -> None:
        """Forget everything and replay the log from its first batch (on start, or after the log was truncated)."""
        self._producers.clear()
        self.next_offset = 0
        self.replay(headers)

    def expire(self, now_ms: int, expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS) -> int:
        """Forget producers whose last batch is ``expiration_ms`` old or more; returns how many were dropped."""
        expired = [pid for pid, e in self._producers.items() if now_ms - e.last_timestamp >= expiration_ms]
        for producer_id in expired:
            del self._producers[producer_id]
        return len(expired)

    # -- snapshots: lets a caller skip replaying the whole log on start ----------------------------------

    def snapshot(self) -> bytes:
        """The whole state as bytes; ``load_snapshot`` then ``replay`` of the batches from ``next_offset`` on."""
        producers = [
            [e.producer_id, e.epoch, e.last_timestamp, [list(astuple(b)) for b in e.batches]]
            for e in self._producers.values()
        ]
        return json.dumps({"version": 1, "next_offset": self.next_offset, "producers": producers}).encode()

    def load_snapshot(self, data: bytes) -> None:
        state = json.loads(data)
        if state.get("version") != 1:
            raise ValueError(f"unknown producer state snapshot version {state.get('version')}")
        self._producers.clear()
        self.next_offset = state["next_offset"]
        for producer_id, epoch, last_timestamp, batches in state["producers"]:
            entry = ProducerEntry(producer_id, epoch, last_timestamp)
            entry.batches.extend(BatchMetadata(*b) for b in batches[-self._max_cached_batches :])
            self._producers[producer_id] = entry


def _validate(header: BatchHeader, entry: ProducerEntry | None, pending: tuple[int, int] | None) -> None:
    """Kafka's ProducerAppendInfo.checkProducerEpoch + checkSequence for a client append.

    ``entry`` is the state before this records field; ``pending`` the (epoch, last sequence) left by earlier
    batches of the same producer in this field, which Kafka calls the updated entry.
    """
    current_epoch = entry.epoch if entry is not None else NO_PRODUCER_EPOCH
    updated_epoch = pending[0] if pending is not None else current_epoch
    epoch, first_seq = header.producer_epoch, header.base_sequence
    where = f"producer {header.producer_id} (epoch {epoch}, sequence {first_seq})"
    if epoch < updated_epoch:
        raise ProducerStateError(INVALID_PRODUCER_EPOCH, f"{where}: epoch is older than the known epoch {updated_epoch}")
    if header.is_control:
        return
    if epoch != updated_epoch:
        if first_seq != 0 and updated_epoch != NO_PRODUCER_EPOCH:
            raise ProducerStateError(
                OUT_OF_ORDER_SEQUENCE_NUMBER, f"{where}: a new epoch must start at sequence 0 (known epoch {updated_epoch})"
            )
        return
    if pending is not None:
        last_seq = pending[1]
    elif entry is not None and epoch == entry.epoch:
        last_seq = entry.last_seq
    else:
        last_seq = NO_SEQUENCE
    # With no known epoch (all of the producer's records gone, or a brand-new producer) any sequence is accepted.
    if current_epoch != NO_PRODUCER_EPOCH and not in_sequence(last_seq, first_seq):
        raise ProducerStateError(OUT_OF_ORDER_SEQUENCE_NUMBER, f"{where}: expected sequence after {last_seq}")

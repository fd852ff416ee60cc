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

Transactions (KIP-98, Kafka's ProducerAppendInfo.appendDataBatch / appendEndTxnMarker): a transactional
batch starts the producer's transaction in this partition (its first offset is remembered) or continues it;
a non-transactional batch from a producer whose transaction is open is INVALID_TXN_STATE (48). A COMMIT or
ABORT marker (a control batch the coordinator has the leader write) ends it: a marker whose producer epoch
is below the producer's is INVALID_PRODUCER_EPOCH (47), one whose coordinator epoch is below the last one
seen for the producer TRANSACTION_COORDINATOR_FENCED (52). An ended transaction stays "unstable" until the
high-water mark passes its marker (Kafka's unreplicatedTxns); the first offset of the earliest open or
unstable transaction is the partition's first unstable offset, which bounds the last stable offset.

The state is rebuilt on start from the newest usable snapshot (Kafka's ``<offset>.snapshot`` file format,
``encode_snapshot``; the PartitionLog writes and picks them) and a replay of the batch headers after it, with
no validation, since the log is the truth. Expiry follows Kafka: a producer
whose last batch's max timestamp is ``producer.id.expiration.ms`` old or more is forgotten.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple

from pykbroker.protocol.control_records import Marker
from pykbroker.protocol.records import NO_PRODUCER_EPOCH, NO_SEQUENCE, BatchHeader, crc32c

OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
TRANSACTION_COORDINATOR_FENCED = 52
UNKNOWN_PRODUCER_ID = 59  # kept for callers that map errors; Kafka 3.x does not raise it from the log

INT32_MAX = (1 << 31) - 1
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000  # producer.id.expiration.ms
NUM_BATCHES_TO_RETAIN = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN (= max.in.flight per connection)


NO_TXN = -1  # no transaction open (Kafka's empty currentTxnFirstOffset)
NO_COORDINATOR_EPOCH = -1


class CompletedTxn(NamedTuple):
    """A transaction a marker ended: its first offset, the marker's offset, whether it was aborted."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


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
    coordinator_epoch: int = NO_COORDINATOR_EPOCH  # of the last marker written for this producer
    current_txn_first_offset: int = NO_TXN  # first offset of its open transaction in this partition

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


class VerificationGuard:
    """Kafka's VerificationGuard: an identity token handed out by ``maybe_start_verification`` and required
    by the append of a producer's first transactional batch in the partition (compared with ``is``)."""

    __slots__ = ()


NO_VERIFICATION = VerificationGuard()  # the append does not require one (verification off, or coordinator writes)
SENTINEL = VerificationGuard()  # Kafka's VerificationGuard.SENTINEL: nothing verified (never any producer's guard)


@dataclass
class VerificationStateEntry:
    """Kafka's VerificationStateEntry: the guard of a verification in flight for a producer, with the lowest
    sequence and the epoch it was started for, and when (wall clock ms: expired after producer.id.expiration.ms)."""

    guard: VerificationGuard
    lowest_sequence: int
    epoch: int
    timestamp_ms: int = 0


class ProducerStateManager:
    """Per-partition idempotent-producer state. ``check_batches`` before an append, ``update`` after it."""

    def __init__(self, max_cached_batches: int = NUM_BATCHES_TO_RETAIN) -> None:
        if max_cached_batches < 1:
            raise ValueError("max_cached_batches must be at least 1")
        self._max_cached_batches = max_cached_batches
        self._producers: dict[int, ProducerEntry] = {}
        # Open transactions, first offset -> producer id (Kafka's ongoingTxns), and ended ones whose marker the
        # high-water mark has not passed yet, first offset -> CompletedTxn (Kafka's unreplicatedTxns).
        self._ongoing: dict[int, int] = {}
        self._unreplicated: dict[int, CompletedTxn] = {}
        self.next_offset = 0  # the offset after the last batch recorded: where a replay would continue
        self._verifying: dict[int, VerificationStateEntry] = {}  # producer id -> its verification in flight

    # -- queries ---------------------------------------------------------------------------------------

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def producer_ids(self) -> list[int]:
        return list(self._producers)

    def __len__(self) -> int:
        return len(self._producers)

    @property
    def has_unstable(self) -> bool:
        """Whether any transaction is open or not yet below the high-water mark (cheap: the fast path)."""
        return bool(self._ongoing or self._unreplicated)

    def first_unstable_offset(self, high_watermark: int | None = None) -> int | None:
        """The first offset of the earliest open transaction, or ended one whose marker is at or above the
        high-water mark (Kafka's firstUnstableOffset); None if there is none. With ``high_watermark`` the ended
        transactions below it are forgotten first (Kafka's onHighWatermarkUpdated)."""
        unreplicated = self._unreplicated
        if unreplicated and high_watermark is not None:
            for first in [f for f, txn in unreplicated.items() if txn.last_offset < high_watermark]:
                del unreplicated[first]
        if not (self._ongoing or unreplicated):
            return None
        return min(min(self._ongoing, default=self.next_offset), min(unreplicated, default=self.next_offset))

    def ongoing_transactions(self) -> list[tuple[int, int]]:
        """(producer id, first offset) of the open transactions, by first offset."""
        return [(pid, first) for first, pid in sorted(self._ongoing.items())]

    def last_stable_offset_after(self, completed: CompletedTxn) -> int:
        """Kafka's ProducerStateManager.lastStableOffset(completedTxn): where the LSO would be once this
        transaction is stable (the first offset of another open transaction, else the marker's next offset);
        stored in the transaction index."""
        others = [first for first, pid in self._ongoing.items() if pid != completed.producer_id]
        return min(others) if others else completed.last_offset + 1

    # -- transaction verification (KIP-890 part 1) ----------------------------------------------------

    def maybe_start_verification(self, producer_id: int, sequence: int, epoch: int,
                                 now_ms: int | None = None) -> VerificationGuard:
        """Kafka's UnifiedLog.maybeStartTransactionVerification: SENTINEL when the producer
        has an open transaction here (nothing to verify: the cache that keeps later batches free), else the
        guard of its verification entry, created or updated (Kafka's maybeUpdateLowestSequenceAndEpoch)."""
        entry = self._producers.get(producer_id)
        if entry is not None and entry.current_txn_first_offset != NO_TXN:
            return SENTINEL
        verifying = self._verifying.get(producer_id)
        if verifying is None:
            verifying = self._verifying[producer_id] = VerificationStateEntry(
                VerificationGuard(), sequence, epoch, int(time.time() * 1000) if now_ms is None else now_ms)
        elif epoch > verifying.epoch:
            verifying.lowest_sequence, verifying.epoch = sequence, epoch
        elif epoch == verifying.epoch and sequence < verifying.lowest_sequence:
            verifying.lowest_sequence = sequence
        return verifying.guard

    def release_verification(self, producer_id: int, guard: VerificationGuard) -> None:
        """The verified write was not appended (refused at append or by the group): drop the entry if it is
        still this guard's. Not for a failed verification: the entry is shared by the producer's other
        requests in flight (Kafka keeps it; ``expire`` bounds the map)."""
        verifying = self._verifying.get(producer_id)
        if verifying is not None and verifying.guard is guard:
            del self._verifying[producer_id]

    def verification_entries(self) -> int:
        return len(self._verifying)

    # -- before an append ------------------------------------------------------------------------------

    def check(self, header: BatchHeader) -> DuplicateBatch | None:
        """Check one batch against the recorded state; see ``check_batches``."""
        return self.check_batches((header,))

    def check_batches(self, headers: Iterable[BatchHeader], *, check_sequence: bool = True,
                      verification: VerificationGuard = NO_VERIFICATION) -> DuplicateBatch | None:
        """Check the batches of one records field, in order, without changing any state.

        Returns the original offsets if a batch is a retry of one already appended (as Kafka does, the whole
        records field is then answered with them and nothing is appended). Raises ProducerStateError (45, 47
        or 48) when a batch breaks the rules. Batches without a producer id pass. Later batches of the same
        producer are checked against the earlier ones of the same field, as if those had been appended.
        ``check_sequence`` False is Kafka's AppendOrigin.Coordinator (the group coordinator's transactional
        offset batches carry no sequence): epochs and transaction rules are still checked. ``verification``
        (unless NO_VERIFICATION): the guard the coordinator's verification gave; a transactional batch that
        would open a transaction needs it to still be the producer's (Kafka's UnifiedLog.append rule: a
        late batch verified before its transaction started and ended here cannot reopen it),
        INVALID_TXN_STATE otherwise.
        """
        pending: dict[int, tuple[int, int, bool]] = {}  # producer id -> (epoch, last sequence, in txn) in this field
        for header in headers:
            producer_id = header.producer_id
            if producer_id < 0:
                continue
            entry = self._producers.get(producer_id)
            if entry is not None and check_sequence:
                duplicate = entry.find_duplicate(header)
                if duplicate is not None:
                    return DuplicateBatch(duplicate.first_offset, duplicate.last_offset, duplicate.log_append_time_ms)
            before = pending.get(producer_id)
            in_txn = before[2] if before is not None else (entry is not None and entry.current_txn_first_offset != NO_TXN)
            transactional = header.is_transactional
            verifying = None
            if transactional and not in_txn and verification is not NO_VERIFICATION:
                verifying = self._verifying.get(producer_id)
                if verifying is None or verifying.guard is not verification:
                    raise ProducerStateError(INVALID_TXN_STATE, "Record was not part of an ongoing transaction")
            _validate(header, entry, before, check_sequence)
            if verifying is not None and check_sequence and header.base_sequence > verifying.lowest_sequence:
                # Kafka's ProducerAppendInfo.checkSequence: a pipelined later batch cannot open the transaction
                # before the lowest one that started this verification.
                raise ProducerStateError(
                    OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"producer {producer_id}: sequence {header.base_sequence} is above the lowest sequence "
                    f"{verifying.lowest_sequence} of its verification in flight")
            if in_txn and not transactional:
                raise ProducerStateError(
                    INVALID_TXN_STATE, f"expected a transactional write from producer {producer_id}: its transaction is open"
                )
            pending[producer_id] = (header.producer_epoch, header.last_sequence, in_txn or transactional)
        return None

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """Kafka's appendEndTxnMarker checks for a marker the coordinator asks this leader to write: a producer
        epoch below the producer's is INVALID_PRODUCER_EPOCH, a coordinator epoch below the last one seen for
        it TRANSACTION_COORDINATOR_FENCED. A producer with no state here passes (Kafka writes the marker)."""
        entry = self._producers.get(producer_id)
        if entry is None:
            return
        if producer_epoch < entry.epoch:
            raise ProducerStateError(
                INVALID_PRODUCER_EPOCH,
                f"marker for producer {producer_id} has epoch {producer_epoch}, older than the known epoch {entry.epoch}",
            )
        if coordinator_epoch < entry.coordinator_epoch:
            raise ProducerStateError(
                TRANSACTION_COORDINATOR_FENCED,
                f"marker for producer {producer_id} has coordinator epoch {coordinator_epoch}, older than the last "
                f"one seen, {entry.coordinator_epoch}",
            )

    # -- after an append, and when replaying the log ---------------------------------------------------

    def update(self, header_after_append: BatchHeader, append_time_ms: int, marker: Marker | None = None,
               ) -> CompletedTxn | None:
        """Record a batch that was appended; its header must carry the assigned base offset.

        ``append_time_ms`` is what a retry of this batch will be answered with as log_append_time: the
        append time for LogAppendTime topics, -1 for CreateTime (what the Produce response said). For a
        control batch, ``marker`` is its COMMIT/ABORT marker: the producer's transaction ends, and the
        CompletedTxn is returned (None when the producer had no open transaction here: an empty one).
        """
        header = header_after_append
        self.next_offset = max(self.next_offset, header.next_offset)
        if header.producer_id < 0:
            return None
        entry = self._producers.get(header.producer_id)
        if entry is None:
            entry = self._producers[header.producer_id] = ProducerEntry(header.producer_id)
        entry.set_epoch(header.producer_epoch)
        entry.last_timestamp = header.max_timestamp
        if header.is_transactional and self._verifying:
            # Kafka's UnifiedLog.updateProducers: a marker or a data batch, the verification entry goes.
            self._verifying.pop(header.producer_id, None)
        if header.is_control:
            # A transaction marker moves the epoch but carries no data sequence.
            if marker is None:
                return None
            entry.coordinator_epoch = marker.coordinator_epoch
            first = entry.current_txn_first_offset
            if first == NO_TXN:
                return None
            entry.current_txn_first_offset = NO_TXN
            self._ongoing.pop(first, None)
            completed = CompletedTxn(header.producer_id, first, header.base_offset, not marker.commit)
            self._unreplicated[first] = completed
            return completed
        if header.is_transactional and entry.current_txn_first_offset == NO_TXN:
            entry.current_txn_first_offset = header.base_offset
            self._ongoing[header.base_offset] = header.producer_id
        if len(entry.batches) >= self._max_cached_batches:
            entry.batches.popleft()
        entry.batches.append(
            BatchMetadata(header.base_sequence, header.last_sequence, header.base_offset, header.last_offset, append_time_ms)
        )
        return None

    def replay(self, headers: Iterable[BatchHeader]) -> None:
        """Apply batches read back from the log on top of the current state (no validation: the log is the truth)."""
        for header in headers:
            self.update(header, append_time_of(header))

    def replay_with_markers(self, items: Iterable[tuple[BatchHeader, Marker | None]], *,
                            on_completed: Callable[[CompletedTxn, int], None] | None = None,
                            stable_below: int | None = None) -> None:
        """``replay`` of (header, marker of a control batch or None) pairs. Each transaction a marker ends is
        passed to ``on_completed`` with the LSO it leaves (for the transaction index); ended transactions whose
        marker is below ``stable_below`` (the high-water mark) are stable at once."""
        for header, marker in items:
            txn = self.update(header, append_time_of(header), marker)
            if txn is not None:
                if on_completed is not None:
                    on_completed(txn, self.last_stable_offset_after(txn))
                if stable_below is not None and txn.last_offset < stable_below:
                    del self._unreplicated[txn.first_offset]

    def rebuild(self, headers: Iterable[BatchHeader]) -> None:
        """Forget everything and replay the log from its first batch (on start, or after the log was truncated)."""
        self.clear()
        self.replay(headers)

    def clear(self) -> None:
        self._producers.clear()
        self._ongoing.clear()
        self._unreplicated.clear()
        self._verifying.clear()
        self.next_offset = 0

    def expire(self, now_ms: int, expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS) -> int:
        """Forget producers whose last batch is ``expiration_ms`` old or more, never one with an open transaction;
        returns how many were dropped."""
        expired = [pid for pid, e in self._producers.items()
                   if now_ms - e.last_timestamp >= expiration_ms and e.current_txn_first_offset == NO_TXN]
        for producer_id in expired:
            del self._producers[producer_id]
        if self._verifying:  # Kafka's removeExpiredProducers: verification entries on the same timer
            for producer_id in [pid for pid, v in self._verifying.items() if now_ms - v.timestamp_ms >= expiration_ms]:
                del self._verifying[producer_id]
        return len(expired)

    # -- snapshots: Kafka's <offset>.snapshot files, so a start replays only the log after one ------------

    def snapshot(self) -> bytes:
        """The state as a Kafka producer snapshot (version 1, see ``encode_snapshot``); ``load_snapshot`` then
        ``replay`` of the batches from the snapshot's offset on gives it back. Kept per producer: its epoch, last
        batch, coordinator epoch and open transaction (Kafka's entry), and its older cached batches (pykbroker's
        extension after Kafka's entries, so a retry of any of its last five batches is still a duplicate after a
        restart); not the ended transactions still above the high-water mark (Kafka's rule)."""
        return encode_snapshot(self._producers.values())

    def load_snapshot(self, data: bytes, offset: int, *, log_append_time: bool = False) -> None:
        """Replace the state by a snapshot taken at ``offset`` (everything below it applied); raises
        CorruptSnapshot (and changes nothing) if ``data`` is not a version 1 snapshot with a valid CRC.
        ``log_append_time``: the topic's timestamps are LogAppendTime, so a retry of a producer's last batch
        is answered with its timestamp (else -1, as for CreateTime)."""
        entries, older = decode_snapshot(data)
        self.clear()
        self.next_offset = offset
        for producer_id, epoch, last_seq, last_offset, offset_delta, timestamp, coordinator_epoch, txn_first in entries:
            entry = ProducerEntry(producer_id, epoch, timestamp, coordinator_epoch=coordinator_epoch,
                                  current_txn_first_offset=txn_first if txn_first >= 0 else NO_TXN)
            if last_offset >= 0:
                for first_seq, seq, first_offset, end_offset, batch_time in older.get(producer_id, ()):
                    if end_offset < last_offset - offset_delta:  # (an extension that disagrees is ignored)
                        entry.batches.append(BatchMetadata(first_seq, seq, first_offset, end_offset,
                                                           batch_time if log_append_time else -1))
                first_seq = (last_seq - offset_delta) % (INT32_MAX + 1) if last_seq >= 0 else last_seq
                entry.batches.append(BatchMetadata(first_seq, last_seq, last_offset - offset_delta, last_offset,
                                                   timestamp if log_append_time else -1))
                while len(entry.batches) > self._max_cached_batches:
                    entry.batches.popleft()
            if entry.current_txn_first_offset != NO_TXN:
                self._ongoing[entry.current_txn_first_offset] = producer_id
            self._producers[producer_id] = entry


# Kafka's producer snapshot file (ProducerStateManager.PID_SNAPSHOT_MAP_SCHEMA), version 1: int16 version,
# uint32 CRC32C of everything after it, then an int32 count and that many PRODUCER_SNAPSHOT_ENTRY_SCHEMA
# entries: producer_id int64, epoch int16, last_sequence int32, last_offset int64, offset_delta int32,
# timestamp int64, coordinator_epoch int32, current_txn_first_offset int64 (-1: none). A producer with no
# data batch (only markers) has last_sequence -1, last_offset -1, offset_delta 0, as Kafka writes it.
#
# pykbroker's extension, after Kafka's entries and under the same CRC (Kafka's reader stops after its entries and
# checks the CRC over the whole file, so it reads these files as its own): the batches each producer has cached
# before its last one, which Kafka's entry cannot hold (a retry of one of them after a restart would otherwise
# get OUT_OF_ORDER_SEQUENCE): magic b"PYKB", int16 version 1, int32 producer count, then per producer its id
# (int64), a batch count (int16) and per batch first_sequence int32, last_sequence int32, first_offset int64,
# last_offset int64, log-append time int64 (-1 on a CreateTime topic; what a duplicate's answer carries). Written only when some producer has more than one cached batch, so a
# state Kafka's format holds whole is written byte for byte as Kafka writes it.
SNAPSHOT_VERSION = 1
_SNAPSHOT_HEAD = struct.Struct(">hIi")  # version, crc, entry count
_SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")
_CRC_START = 6  # Kafka's PRODUCER_ENTRIES_OFFSET
_EXTENSION_MAGIC = b"PYKB"
_EXTENSION_HEAD = struct.Struct(">4shi")  # magic, version, producer count
_EXTENSION_PRODUCER = struct.Struct(">qh")
_EXTENSION_BATCH = struct.Struct(">iiqqq")


class CorruptSnapshot(ValueError):
    """A producer snapshot that cannot be used (unknown version, bad CRC, truncated)."""


def encode_snapshot(entries: Iterable[ProducerEntry]) -> bytes:
    """Kafka's ProducerStateManager.writeSnapshot bytes for ``entries`` (sorted by producer id)."""
    pack = _SNAPSHOT_ENTRY.pack
    body = []
    extension: list[bytes] = []
    producers_extended = 0
    for e in sorted(entries, key=lambda e: e.producer_id):
        if e.batches:
            last = e.batches[-1]
            last_seq, last_offset, delta = last.last_seq, last.last_offset, last.last_offset - last.first_offset
        else:
            last_seq, last_offset, delta = NO_SEQUENCE, -1, 0
        body.append(pack(e.producer_id, e.epoch, last_seq, last_offset, delta, e.last_timestamp,
                         e.coordinator_epoch, e.current_txn_first_offset))
        if len(e.batches) > 1:
            older = list(e.batches)[:-1]
            extension.append(_EXTENSION_PRODUCER.pack(e.producer_id, len(older)))
            extension.extend(_EXTENSION_BATCH.pack(b.first_seq, b.last_seq, b.first_offset, b.last_offset,
                                                   b.log_append_time_ms) for b in older)
            producers_extended += 1
    out = bytearray(_SNAPSHOT_HEAD.pack(SNAPSHOT_VERSION, 0, len(body)))
    out += b"".join(body)
    if producers_extended:
        out += _EXTENSION_HEAD.pack(_EXTENSION_MAGIC, 1, producers_extended)
        out += b"".join(extension)
    struct.pack_into(">I", out, 2, crc32c(memoryview(out)[_CRC_START:]))
    return bytes(out)


def decode_snapshot(data: bytes) -> tuple[list[tuple[int, int, int, int, int, int, int, int]],
                                          dict[int, list[tuple[int, int, int, int, int]]]]:
    """The entries of a snapshot's bytes, as tuples in ``_SNAPSHOT_ENTRY`` field order, and pykbroker's
    extension (producer id -> its older batches, ``_EXTENSION_BATCH`` fields; empty in a file Kafka wrote);
    raises CorruptSnapshot."""
    if len(data) < _SNAPSHOT_HEAD.size:
        raise CorruptSnapshot(f"snapshot of {len(data)} bytes is shorter than its header")
    version, crc, count = _SNAPSHOT_HEAD.unpack_from(data)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshot(f"snapshot contains an unknown file version {version}")
    computed = crc32c(memoryview(data)[_CRC_START:])
    if crc != computed:
        raise CorruptSnapshot(f"snapshot is corrupt (stored CRC {crc}, computed {computed})")
    end = _SNAPSHOT_HEAD.size + count * _SNAPSHOT_ENTRY.size
    if count < 0 or len(data) < end or (len(data) > end and data[end:end + 4] != _EXTENSION_MAGIC):
        raise CorruptSnapshot(f"snapshot of {len(data)} bytes does not hold {count} entries")
    entries = list(_SNAPSHOT_ENTRY.iter_unpack(memoryview(data)[_SNAPSHOT_HEAD.size:end]))
    older: dict[int, list[tuple[int, int, int, int, int]]] = {}
    if len(data) > end:
        try:
            _, version, producers = _EXTENSION_HEAD.unpack_from(data, end)
            position = end + _EXTENSION_HEAD.size
            if version != 1 or producers < 0:
                raise CorruptSnapshot(f"snapshot extension version {version}, {producers} producers")
            for _ in range(producers):
                producer_id, batches = _EXTENSION_PRODUCER.unpack_from(data, position)
                position += _EXTENSION_PRODUCER.size
                older[producer_id] = [_EXTENSION_BATCH.unpack_from(data, position + i * _EXTENSION_BATCH.size)
                                      for i in range(max(batches, 0))]
                position += max(batches, 0) * _EXTENSION_BATCH.size
        except struct.error as exc:
            raise CorruptSnapshot(f"snapshot extension runs past the file: {exc}") from None
        if position != len(data):
            raise CorruptSnapshot(f"snapshot of {len(data)} bytes has {len(data) - position} bytes after its extension")
    return entries, older


def _validate(header: BatchHeader, entry: ProducerEntry | None, pending: tuple[int, int, bool] | None,
              check_sequence: bool = True) -> None:
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
    if header.is_control or not check_sequence:
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

"""The records of ``__transaction_state``: Kafka's TransactionLogKey / TransactionLogValue (TransactionLog.scala).

    key    int16 version 0, string transactional_id                                        TransactionLogKey v0
    value  int16 version 0, int64 producer_id, int16 producer_epoch, int32 transaction_timeout_ms,
           int8 transaction_status, nullable array of (string topic, array of int32 partition)
           transaction_partitions, int64 last_update_timestamp_ms, int64 start_timestamp_ms  TransactionLogValue v0

Kafka 3.7.1 writes value version 0 (version 1 is the flexible one, KIP-915: read, not written); the
partitions of an Empty transaction are written as a null array, as Kafka does. A record with a null value
(tombstone) removes its transactional id (an expired id). Arrays are int32 counts, strings int16 lengths.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pykbroker.groups.offset_store import RecordReader, encode_string
from pykbroker.txn.metadata import TransactionState

TRANSACTION_STATE_TOPIC = "__transaction_state"
KEY_VERSION = 0
VALUE_VERSION = 0

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_VALUE_HEAD = struct.Struct(">hqhib")  # version, producer id, epoch, timeout, status
_TIMESTAMPS = struct.Struct(">qq")


@dataclass(frozen=True)
class TxnLogValue:
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TransactionState
    partitions: frozenset[tuple[str, int]]
    last_update_ms: int
    start_ms: int


def encode_key(transactional_id: str) -> bytes:
    return _INT16.pack(KEY_VERSION) + encode_string(transactional_id)


def decode_key(data: bytes) -> str | None:
    """The transactional id of a key; None for a key version this broker does not know (skipped, as Kafka
    skips unknown record types)."""
    reader = RecordReader(data)
    if reader.int16() != KEY_VERSION:
        return None
    return reader.string()


def encode_value(value: TxnLogValue) -> bytes:
    if value.state is TransactionState.EMPTY and value.partitions:
        raise ValueError("an Empty transaction has no partitions")
    parts = [_VALUE_HEAD.pack(VALUE_VERSION, value.producer_id, value.producer_epoch, value.timeout_ms,
                              value.state.code)]
    if value.state is TransactionState.EMPTY:
        parts.append(_INT32.pack(-1))  # null, as Kafka writes it for Empty
    else:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(value.partitions):
            by_topic.setdefault(topic, []).append(partition)
        parts.append(_INT32.pack(len(by_topic)))
        for topic, indexes in by_topic.items():
            parts.append(encode_string(topic))
            parts.append(_INT32.pack(len(indexes)))
            parts.extend(_INT32.pack(i) for i in indexes)
    parts.append(_TIMESTAMPS.pack(value.last_update_ms, value.start_ms))
    return b"".join(parts)


def decode_value(data: bytes) -> TxnLogValue:
    reader = RecordReader(data)
    version = reader.int16()
    if version not in (0, 1):
        raise ValueError(f"unknown TransactionLogValue version {version}")
    flexible = version >= 1
    producer_id = reader.int64()
    epoch = reader.int16()
    timeout = reader.int32()
    status = reader._take(1)[0]
    partitions: set[tuple[str, int]] = set()
    count = reader.uvarint() - 1 if flexible else reader.int32()
    for _ in range(max(count, 0)):
        topic = reader.compact_string() if flexible else reader.string()
        n = reader.uvarint() - 1 if flexible else reader.int32()
        for _ in range(max(n, 0)):
            partitions.add((topic, reader.int32()))
        if flexible:
            reader.skip_tagged_fields()
    last_update = reader.int64()
    start = reader.int64()
    if flexible:
        reader.skip_tagged_fields()
    return TxnLogValue(producer_id, epoch, timeout, TransactionState.from_code(status), frozenset(partitions),
                       last_update, start)

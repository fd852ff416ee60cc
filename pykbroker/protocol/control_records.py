"""Control records: the commit and abort markers a transaction leaves in each partition it wrote to.

A control batch has the transactional and control attribute bits set, the producer id and epoch of the
transaction, no sequence (-1) and exactly one record (Kafka's EndTransactionMarker):

* key:   int16 version (0), int16 type (0 = ABORT, 1 = COMMIT);
* value: int16 version (0), int32 coordinator epoch.

Kafka's ``ControlRecordType`` also knows LEADER_CHANGE (2) and snapshot markers (3, 4), which only KRaft's
metadata log writes; a reader treats any type other than ABORT/COMMIT as "not a transaction marker".
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pykbroker.protocol.records import CONTROL_MASK, TRANSACTIONAL_MASK, BatchHeader, build_batch, read_records

ABORT = 0
COMMIT = 1
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")
CONTROL_KEY_VERSION = 0
MARKER_VALUE_VERSION = 0


@dataclass(frozen=True, slots=True)
class Marker:
    """One transaction marker: COMMIT or ABORT, and the coordinator epoch that wrote it."""

    commit: bool
    coordinator_epoch: int


def marker_batch(*, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                 timestamp_ms: int, partition_leader_epoch: int = -1) -> bytearray:
    """A control batch holding one COMMIT or ABORT marker, base offset 0 (the log assigns the real one)."""
    key = _KEY.pack(CONTROL_KEY_VERSION, COMMIT if commit else ABORT)
    value = _VALUE.pack(MARKER_VALUE_VERSION, coordinator_epoch)
    return build_batch(
        [(key, value)],
        timestamp_ms=timestamp_ms,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        partition_leader_epoch=partition_leader_epoch,
        attributes=TRANSACTIONAL_MASK | CONTROL_MASK,
    )


def control_type(key: bytes | None) -> int | None:
    """The type of a control record's key (ABORT 0, COMMIT 1, ...), None if the key is malformed."""
    if key is None or len(key) < _KEY.size:
        return None
    _version, kind = _KEY.unpack_from(key)
    return kind


def read_marker(buf, header: BatchHeader) -> Marker | None:
    """The transaction marker in a control batch, or None if the batch holds no COMMIT/ABORT marker."""
    if not header.is_control:
        return None
    for record in read_records(buf, header):
        kind = control_type(record.key)
        if kind not in (ABORT, COMMIT):
            return None
        epoch = -1
        if record.value is not None and len(record.value) >= _VALUE.size:
            epoch = _VALUE.unpack_from(record.value)[1]
        return Marker(commit=kind == COMMIT, coordinator_epoch=epoch)
    return None

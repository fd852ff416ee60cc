"""Domain errors of the storage layer; request handlers map them to Kafka error codes.

CorruptRecordBatch / InvalidRecordBatch come from pykbroker.protocol.records and propagate unchanged.
"""

from __future__ import annotations


class OffsetOutOfRange(Exception):
    """A read or log-start move asked for an offset outside [log start, log end]: OFFSET_OUT_OF_RANGE (1)."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(f"offset {offset} is outside the log range [{log_start_offset}, {log_end_offset}]")
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class RecordTooLarge(Exception):
    """A batch is larger than max.message.bytes: MESSAGE_TOO_LARGE (10)."""


class RecordBatchTooLarge(Exception):
    """An append larger than segment.bytes (it could fit no segment): RECORD_LIST_TOO_LARGE (18), Kafka's
    RecordBatchTooLargeException."""


class UnexpectedAppendOffset(Exception):
    """A follower append whose first offset is below the log end offset (replication must truncate first)."""

    def __init__(self, first_offset: int, log_end_offset: int) -> None:
        super().__init__(f"follower append starts at {first_offset}, below the log end offset {log_end_offset}")
        self.first_offset = first_offset
        self.log_end_offset = log_end_offset


class LogDirectoryInUse(Exception):
    """Another process holds the data directory's lock file."""

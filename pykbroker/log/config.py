"""Topic-level log settings, resolved from Kafka's topic config names."""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Mapping

TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
_LONG_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class LogConfig:
    segment_bytes: int = 1073741824  # segment.bytes
    segment_ms: int = 604800000  # segment.ms
    segment_jitter_ms: int = 0  # segment.jitter.ms: each segment rolls up to this much earlier (drawn at open)
    segment_index_bytes: int = 10485760  # segment.index.bytes (max index file size -> roll when full)
    index_interval_bytes: int = 4096  # index.interval.bytes
    retention_ms: int = 604800000  # retention.ms (-1 = keep forever)
    retention_bytes: int = -1  # retention.bytes (-1 = unlimited)
    message_timestamp_type: str = "CreateTime"  # message.timestamp.type: CreateTime | LogAppendTime
    message_timestamp_before_max_ms: int = (1 << 63) - 1  # message.timestamp.before.max.ms
    message_timestamp_after_max_ms: int = (1 << 63) - 1  # message.timestamp.after.max.ms
    max_message_bytes: int = 1048588  # max.message.bytes (per batch, as Kafka checks it)
    cleanup_policy: str = "delete"  # cleanup.policy: delete | compact | compact,delete (normalised order)
    delete_retention_ms: int = 86400000  # delete.retention.ms: how long tombstones outlive their cleaning
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms
    max_compaction_lag_ms: int = (1 << 63) - 1  # max.compaction.lag.ms
    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio

    def __post_init__(self) -> None:
        if self.message_timestamp_type not in TIMESTAMP_TYPES:
            raise ValueError(f"message.timestamp.type must be one of {TIMESTAMP_TYPES}, not {self.message_timestamp_type!r}")
        # Kafka's own lower bounds; below them a segment could not hold one batch header or one index entry.
        if self.segment_bytes < 14:
            raise ValueError("segment.bytes must be at least 14")
        if self.segment_index_bytes < 12:
            raise ValueError("segment.index.bytes must be at least 12")
        if self.index_interval_bytes < 0 or self.max_message_bytes < 0:
            raise ValueError("index.interval.bytes and max.message.bytes must not be negative")
        if self.segment_ms < 1:
            raise ValueError("segment.ms must be positive")

    def random_segment_jitter(self) -> int:
        """A new segment's roll jitter (Kafka's randomSegmentJitter): uniform in [0, min(segment.jitter.ms,
        segment.ms)), 0 without segment.jitter.ms."""
        if self.segment_jitter_ms <= 0:
            return 0
        return random.randrange(min(self.segment_jitter_ms, self.segment_ms))

    @property
    def max_segment_ms(self) -> int:
        """How long a segment may span before an append rolls it (Kafka's maxSegmentMs): segment.ms, or
        max.compaction.lag.ms when lower on a compacted topic (so its records become cleanable in time)."""
        if self.compact and self.max_compaction_lag_ms > 0:
            return min(self.max_compaction_lag_ms, self.segment_ms)
        return self.segment_ms

    @property
    def compact(self) -> bool:
        """The policy includes compact: the cleaner keeps the latest record per key, null keys are refused."""
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """The policy includes delete: time and size retention apply (Kafka skips them for compact-only)."""
        return "delete" in self.cleanup_policy

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @classmethod
    def from_topic_configs(cls, configs: Mapping[str, str | int]) -> "LogConfig":
        """Build from Kafka topic config names (``segment.bytes`` -> ``segment_bytes``); unknown names are ignored."""
        values: dict[str, str | int] = {}
        for field in fields(cls):
            name = field.name.replace("_", ".")
            if name in configs and configs[name] is not None:
                raw = configs[name]
                if field.name == "cleanup_policy":
                    items = raw if isinstance(raw, (list, tuple)) else str(raw).split(",")
                    values[field.name] = ",".join(sorted({item.strip() for item in items if item.strip()}))
                elif field.type == "float":
                    values[field.name] = float(raw)
                else:
                    values[field.name] = raw if field.type == "str" else int(raw)
        # Kafka 3.7's LogConfig (KIP-937): a before/after bound left at its default (Long.MAX_VALUE) takes the
        # deprecated message.timestamp.difference.max.ms, the one bound both ways it replaced.
        difference = configs.get("message.timestamp.difference.max.ms")
        if difference is not None:
            for name in ("message_timestamp_before_max_ms", "message_timestamp_after_max_ms"):
                if int(values.get(name, _LONG_MAX)) == _LONG_MAX:
                    values[name] = int(difference)
        return cls(**values)

"""What the pipeline must produce, computed in plain Python from the events, and readers of its outputs.

Timestamps are compared as epoch milliseconds (Spark's unix_millis), never as Python datetimes: PySpark
turns timestamps into naive datetimes in the Python process's local zone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from city_pipeline.events import CityEvent

MINUTE_MS = 60_000

# The Kafka source's schema without headers, for feeding the pipeline rows that look like Kafka's.
KAFKA_ROW_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
                    "timestamp timestamp, timestampType int")


def window_start(event_time_ms: int, window_ms: int) -> int:
    return event_time_ms - event_time_ms % window_ms


def expected_counts(events: Iterable[CityEvent], window_ms: int) -> Counter:
    """(city, window start ms) -> number of events: what a batch count over `events` gives."""
    return Counter((event.city, window_start(event.event_time_ms, window_ms)) for event in events)


def closed_windows(counts: Counter, watermark_ms: int, window_ms: int) -> Counter:
    """The windows an append-mode streaming query has emitted once its watermark is `watermark_ms`:
    Spark emits (and forgets) a window when its end is at or before the watermark."""
    return Counter({key: n for key, n in counts.items() if key[1] + window_ms <= watermark_ms})


def counts_by_window(counts: DataFrame) -> list[tuple[str, int, int, int]]:
    """The pipeline's counts as sorted (city, window start ms, window end ms, events) tuples, duplicates kept."""
    rows = counts.select("city", F.unix_millis("window_start").alias("start"),
                         F.unix_millis("window_end").alias("end"), "events").collect()
    return sorted((row.city, row.start, row.end, row.events) for row in rows)


def as_counter(rows: list[tuple[str, int, int, int]]) -> Counter:
    return Counter({(city, start): events for city, start, _end, events in rows})

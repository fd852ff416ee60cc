"""The pipeline's logic on a local SparkSession, fed in-memory rows or a file stream: no Kafka connector.

The streaming test runs the same windowed count the job runs, with a real checkpoint and the real Parquet
sink, over a Parquet file stream of rows shaped like the Kafka source's; that is what makes watermark,
append-mode emission and restart-from-checkpoint testable in CI without the connector.
"""

from __future__ import annotations

import datetime
import json

from spark_guard import require_spark

require_spark()

import pytest  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from city_pipeline.events import CityEvent, iso_millis, make_events  # noqa: E402
from city_pipeline.transforms import (  # noqa: E402
    counts_as_kafka_records,
    offset_coverage,
    parse_events,
    windowed_counts,
)
from city_pipeline.wiring import start_parquet_sink  # noqa: E402
from pipeline_expect import (  # noqa: E402
    KAFKA_ROW_SCHEMA,
    MINUTE_MS,
    as_counter,
    closed_windows,
    counts_by_window,
    expected_counts,
)

pytestmark = pytest.mark.timeout(240)

T0 = 1_795_000_020_000 - 1_795_000_020_000 % MINUTE_MS  # a whole minute
WATERMARK_MS = 2 * MINUTE_MS


def kafka_rows(spark, events, *, partition=0, first_offset=0, extra_values=()):
    """A DataFrame shaped like the Kafka source's output holding `events` (then `extra_values`, raw)."""
    values = [(event.key, event.value, event.event_time_ms) for event in events]
    values += [(b"junk", raw, T0) for raw in extra_values]
    rows = [(key, value, "city-events", partition, first_offset + i,
             datetime.datetime.fromtimestamp(ts / 1000, tz=datetime.UTC), 0)
            for i, (key, value, ts) in enumerate(values)]
    return spark.createDataFrame(rows, KAFKA_ROW_SCHEMA)


def test_parse_events_keeps_well_formed_events_and_drops_the_rest(spark):
    events = make_events(30, start_ms=T0, step_ms=1500, seed=1, max_lateness_ms=900)
    malformed = [b"not json", b'{"city":"Rome"}', b'{"event_time":"2026-11-22T10:00:00.000Z"}',
                 b'{"city":"Rome","event_time":"yesterday"}', b"[1,2]", b"\xff\xfe"]
    wrong_amount = CityEvent("e-odd", "Oslo", "view", 0.0, T0 + 5)
    odd_value = wrong_amount.value.replace(b'"amount":0.0', b'"amount":"lots"')
    rows = kafka_rows(spark, events, extra_values=malformed + [odd_value])

    parsed = parse_events(rows)
    assert parsed.columns == ["event_id", "city", "kind", "amount", "event_time", "topic", "partition", "offset"]
    got = sorted((r.event_id, r.city, r.kind, r.amount, r.ms, r.offset) for r in parsed.select(
        "event_id", "city", "kind", "amount", F.unix_millis("event_time").alias("ms"), "offset").collect())
    expected = sorted([(e.event_id, e.city, e.kind, e.amount, e.event_time_ms, i) for i, e in enumerate(events)]
                      + [("e-odd", "Oslo", "view", None, T0 + 5, len(events) + len(malformed))])
    assert got == expected


def test_parse_events_accepts_zone_offsets_and_missing_fraction(spark):
    values = [b'{"city":"Oslo","event_time":"2026-11-22T11:00:00+01:00"}',
              b'{"city":"Oslo","event_time":"2026-11-22T10:00:00.5Z"}']
    rows = spark.createDataFrame([(b"Oslo", v) for v in values], "key binary, value binary")
    parsed = parse_events(rows)
    assert parsed.columns == ["event_id", "city", "kind", "amount", "event_time"]
    millis = sorted(r.ms for r in parsed.select(F.unix_millis("event_time").alias("ms")).collect())
    ten_utc = 1_795_341_600_000  # 2026-11-22T10:00:00Z
    assert iso_millis(ten_utc) == "2026-11-22T10:00:00.000Z"
    assert millis == [ten_utc, ten_utc + 500]


def test_windowed_counts_on_a_batch_match_a_python_count(spark):
    events = make_events(400, start_ms=T0 + 7_000, step_ms=900, seed=2, max_lateness_ms=30_000)
    counts = windowed_counts(parse_events(kafka_rows(spark, events)), window="1 minute")
    rows = counts_by_window(counts)
    assert all(end - start == MINUTE_MS for _city, start, end, _n in rows)
    assert len({(city, start) for city, start, _end, _n in rows}) == len(rows), "a window counted twice"
    assert as_counter(rows) == expected_counts(events, MINUTE_MS)


def test_counts_as_kafka_records_are_city_keyed_json(spark):
    events = [CityEvent(f"e{i}", city, "view", 1.0, T0 + i * 1000) for i, city in
              enumerate(["Oslo", "Oslo", "Rome"])]
    counts = windowed_counts(parse_events(kafka_rows(spark, events)), window="1 minute")
    records = sorted((r.key, json.loads(r.value)) for r in counts_as_kafka_records(counts).collect())
    assert records == [
        ("Oslo", {"city": "Oslo", "window_start": iso_millis(T0), "window_end": iso_millis(T0 + MINUTE_MS),
                  "events": 2}),
        ("Rome", {"city": "Rome", "window_start": iso_millis(T0), "window_end": iso_millis(T0 + MINUTE_MS),
                  "events": 1}),
    ]


def test_offset_coverage_per_partition(spark):
    events = make_events(12, start_ms=T0)
    rows = kafka_rows(spark, events[:5], partition=0, first_offset=100).unionByName(
        kafka_rows(spark, events[5:], partition=2, first_offset=7))
    coverage = [tuple(r) for r in offset_coverage(rows).collect()]
    assert coverage == [("city-events", 0, 100, 104, 5), ("city-events", 2, 7, 13, 7)]


def run_available_now(spark, input_dir, output_dir, checkpoint):
    source = spark.readStream.schema(KAFKA_ROW_SCHEMA).parquet(str(input_dir))
    counts = windowed_counts(parse_events(source), window="1 minute", watermark="2 minutes")
    query = start_parquet_sink(counts, output_dir, checkpoint, {"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None
    return counts_by_window(spark.read.parquet(str(output_dir)))


def test_streaming_counts_emit_closed_windows_once_and_resume_from_checkpoint(spark, tmp_path):
    """Two availableNow runs of the windowed count over a growing file stream, one checkpoint.

    Run 1 sees 6 minutes of slightly out-of-order events; when it stops, exactly the windows that its
    watermark (newest event time - 2 minutes) closed are in the Parquet output. Run 2 sees 4 more
    minutes, one event too late for the watermark and one malformed record; afterwards the output holds
    every window the new watermark closed, each once, with counts that include no event twice and not
    the late one.
    """
    input_dir, output_dir, checkpoint = tmp_path / "input", tmp_path / "counts", tmp_path / "checkpoint"
    first = make_events(36, start_ms=T0 + 5_000, step_ms=10_000, seed=11, max_lateness_ms=20_000)
    kafka_rows(spark, first).coalesce(1).write.mode("append").parquet(str(input_dir))

    rows = run_available_now(spark, input_dir, output_dir, checkpoint)
    watermark_1 = max(e.event_time_ms for e in first) - WATERMARK_MS
    expected_1 = closed_windows(expected_counts(first, MINUTE_MS), watermark_1, MINUTE_MS)
    assert expected_1, "the first run should close some windows"
    assert len(rows) == len(expected_1), f"windows emitted twice or not at all: {rows}"
    assert as_counter(rows) == expected_1

    later = make_events(24, start_ms=T0 + 6 * MINUTE_MS + 5_000, step_ms=10_000, seed=12,
                        max_lateness_ms=2_000, id_prefix="later")
    too_late = CityEvent("late-1", first[0].city, "view", 1.0, T0 + 30_000)
    assert too_late.event_time_ms < watermark_1
    kafka_rows(spark, later + [too_late], first_offset=len(first), extra_values=[b"{broken"]) \
        .coalesce(1).write.mode("append").parquet(str(input_dir))

    rows = run_available_now(spark, input_dir, output_dir, checkpoint)
    watermark_2 = max(e.event_time_ms for e in later) - WATERMARK_MS
    expected_2 = closed_windows(expected_counts(first + later, MINUTE_MS), watermark_2, MINUTE_MS)
    assert len(rows) == len(expected_2), f"windows emitted twice or not at all: {rows}"
    assert as_counter(rows) == expected_2
    assert set(expected_2) > set(expected_1)

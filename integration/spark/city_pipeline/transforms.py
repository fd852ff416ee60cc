"""The pipeline's logic: functions from DataFrame to DataFrame, with no source and no sink.

They take the Kafka source's row shape (key and value as binary, plus topic, partition, offset, timestamp
when the rows come from Kafka) and work the same on a batch or a streaming DataFrame, so tests feed them
in-memory rows or a file stream, and the jobs feed them `format("kafka")`.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

EVENT_SCHEMA = T.StructType([
    T.StructField("event_id", T.StringType()),
    T.StructField("city", T.StringType()),
    T.StructField("kind", T.StringType()),
    T.StructField("amount", T.DoubleType()),
    T.StructField("event_time", T.TimestampType()),
])
# ISO-8601 with an optional fraction and a zone ("Z" or "+01:00"): what events.iso_millis writes.
TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss[.SSS]XXX"
KAFKA_COORDINATES = ("topic", "partition", "offset")

DEFAULT_WINDOW = "1 minute"
DEFAULT_WATERMARK = "2 minutes"


def parse_events(kafka_rows: DataFrame) -> DataFrame:
    """One row per well-formed event: event_id, city, kind, amount, event_time (+ the Kafka coordinates
    topic/partition/offset when the input has them).

    A record whose value is not JSON, or lacks a city or a parseable event_time, is dropped: it cannot be
    placed in a window. A field of the wrong type (say a string amount) becomes null and the event counts.
    """
    parsed = F.from_json(F.col("value").cast("string"), EVENT_SCHEMA, {"timestampFormat": TIMESTAMP_FORMAT})
    coordinates = [name for name in KAFKA_COORDINATES if name in kafka_rows.columns]
    return (kafka_rows
            .select(parsed.alias("event"), *coordinates)
            .select("event.*", *coordinates)
            .where(F.col("city").isNotNull() & F.col("event_time").isNotNull()))


def windowed_counts(events: DataFrame, *, window: str = DEFAULT_WINDOW,
                    watermark: str = DEFAULT_WATERMARK) -> DataFrame:
    """Events per city per tumbling event-time window: window_start, window_end, city, events.

    The watermark bounds how late an event may arrive: in a streaming query an event older than the
    newest event time seen minus `watermark` is dropped, and a window is final (and, in append mode,
    emitted once) when the watermark passes its end. On a batch DataFrame the watermark changes nothing.
    """
    return (events
            .withWatermark("event_time", watermark)
            .groupBy(F.window("event_time", window).alias("window"), F.col("city"))
            .agg(F.count(F.lit(1)).alias("events"))
            .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
                    "city", "events"))


def counts_as_kafka_records(counts: DataFrame) -> DataFrame:
    """The counts in the kafka sink's shape: key = city, value = JSON of the window and its count."""
    value = F.to_json(F.struct("city", "window_start", "window_end", "events"),
                      {"timestampFormat": TIMESTAMP_FORMAT.replace("[.SSS]", ".SSS")})
    return counts.select(F.col("city").alias("key"), value.alias("value"))


def offset_coverage(kafka_rows: DataFrame) -> DataFrame:
    """Per topic partition: the first and last offset read and how many records, for checking a range."""
    return (kafka_rows
            .groupBy("topic", "partition")
            .agg(F.min("offset").alias("first_offset"), F.max("offset").alias("last_offset"),
                 F.count(F.lit(1)).alias("records"))
            .orderBy("topic", "partition"))


"""Source and sink wiring: Spark's stock Kafka connector (`format("kafka")`) and the Parquet file sink.

Nothing here is specific to pykbroker: only `kafka.bootstrap.servers` points at it, every other
connector and client setting keeps Spark's default.

The streaming job runs two queries over the same windowed counts, one per sink, each with its own
checkpoint directory (<checkpoint>/kafka, <checkpoint>/parquet). A query restarted with the same
checkpoint resumes from the offsets it recorded there: the Parquet sink then holds every window exactly
once; the kafka sink is at-least-once (Spark's guarantee for it), so a window can be written twice only
if a query dies between writing a micro-batch and committing it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from .transforms import counts_as_kafka_records


def read_kafka_stream(spark: SparkSession, bootstrap: str, topic: str, *, starting_offsets: str = "earliest",
                      max_offsets_per_trigger: int | None = None,
                      extra_options: Mapping[str, str] | None = None) -> DataFrame:
    """A streaming DataFrame over `topic` in the Kafka source's schema.

    starting_offsets applies only to a query's first run; a restarted query continues from its checkpoint.
    """
    reader = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic)
              .option("startingOffsets", starting_offsets))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    for key, value in (extra_options or {}).items():
        reader = reader.option(key, value)
    return reader.load()


def read_kafka_batch(spark: SparkSession, bootstrap: str, options: Mapping[str, str]) -> DataFrame:
    """A batch DataFrame over the range that `options` selects (see replay.replay_options)."""
    reader = spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def start_kafka_sink(counts: DataFrame, bootstrap: str, topic: str, checkpoint: str | Path,
                     trigger: dict, query_name: str = "city_counts_to_kafka") -> StreamingQuery:
    """Write each final window count to `topic` (key = city, value = JSON) with Spark's kafka sink."""
    return (counts_as_kafka_records(counts).writeStream
            .format("kafka")
            .queryName(query_name)
            .outputMode("append")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", topic)
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start())


def start_parquet_sink(counts: DataFrame, path: str | Path, checkpoint: str | Path, trigger: dict,
                       query_name: str = "city_counts_to_parquet") -> StreamingQuery:
    """Append each final window count to Parquet files under `path` (exactly once with the checkpoint)."""
    return (counts.writeStream
            .format("parquet")
            .queryName(query_name)
            .outputMode("append")
            .option("path", str(path))
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start())

"""Batch replay: recount city events over any offset or time range of the topic.

    spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.1 integration/spark/replay_job.py \\
        --bootstrap 127.0.0.1:9092 --topic city-events --from-offsets 0:100,2:40 --to-offsets 0:200
    ... replay_job.py --from-time 2026-11-22T10:00:00Z --to-time 2026-11-22T11:00:00Z --output out/replay

Reads the range with spark.read.format("kafka") (startingOffsets/endingOffsets as per-partition JSON, or
startingTimestamp/endingTimestamp), prints which offsets of each partition it read, and counts events per
city per window over them. Start offsets are inclusive and end offsets exclusive; partitions not named
read from the earliest offset / to the latest. The broker keeps the data: nothing is committed.
"""

from __future__ import annotations

import argparse
import sys

from pyspark.sql import DataFrame, SparkSession

from city_pipeline.cli import (
    add_bootstrap_argument,
    add_connector_arguments,
    exit_for_missing_connector,
    session_from_args,
)
from city_pipeline.events import parse_time_ms
from city_pipeline.replay import parse_partition_offsets, replay_options
from city_pipeline.transforms import DEFAULT_WINDOW, offset_coverage, parse_events, windowed_counts
from city_pipeline.wiring import read_kafka_batch


def topic_partitions(bootstrap: str, topic: str) -> list[int]:
    """The topic's partition numbers, from the admin client's Metadata (which never creates topics)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        (description,) = admin.describe_topics([topic])
    finally:
        admin.close()
    if description["error_code"] != 0:
        raise LookupError(f"topic {topic}: Metadata error {description['error_code']} (does it exist?)")
    return sorted(p["partition_index"] for p in description["partitions"])


def replay(spark: SparkSession, bootstrap: str, options: dict[str, str], *,
           window: str = DEFAULT_WINDOW) -> tuple[DataFrame, DataFrame]:
    """(offset coverage per partition, counts per city per window) of the range `options` selects."""
    records = read_kafka_batch(spark, bootstrap, options).cache()
    counts = windowed_counts(parse_events(records), window=window).orderBy("window_start", "city")
    return offset_coverage(records), counts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_bootstrap_argument(parser)
    parser.add_argument("--topic", default="city-events")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-offsets", metavar="P:OFFSET,...", help="start offsets (inclusive), e.g. 0:100,2:40")
    start.add_argument("--from-time", metavar="TIME", help="start at the first record at/after TIME (ISO or ms)")
    end = parser.add_mutually_exclusive_group()
    end.add_argument("--to-offsets", metavar="P:OFFSET,...", help="end offsets (exclusive)")
    end.add_argument("--to-time", metavar="TIME", help="end before the first record at/after TIME")
    parser.add_argument("--only-listed", action="store_true",
                        help="read only the partitions named in --from-offsets/--to-offsets")
    parser.add_argument("--window", default=DEFAULT_WINDOW)
    parser.add_argument("--output", help="write the counts here as Parquet (overwritten); else print them")
    add_connector_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from_offsets = parse_partition_offsets(args.from_offsets) if args.from_offsets else None
        to_offsets = parse_partition_offsets(args.to_offsets) if args.to_offsets else None
        options = replay_options(
            args.topic, topic_partitions(args.bootstrap, args.topic), from_offsets=from_offsets,
            to_offsets=to_offsets, from_timestamp_ms=parse_time_ms(args.from_time) if args.from_time else None,
            to_timestamp_ms=parse_time_ms(args.to_time) if args.to_time else None, only_listed=args.only_listed)
    except (LookupError, ValueError) as exc:
        print(f"replay_job: {exc}", file=sys.stderr)
        return 2
    print("source options: " + ", ".join(f"{k}={v}" for k, v in options.items()))

    spark = session_from_args("city-counts-replay", args)
    try:
        coverage, counts = replay(spark, args.bootstrap, options, window=args.window)
    except Exception as exc:
        return exit_for_missing_connector("replay_job", exc)
    coverage.show(truncate=False)
    if args.output:
        counts.write.mode("overwrite").parquet(args.output)
        print(f"wrote {counts.count()} window counts to {args.output}")
    else:
        counts.show(1000, truncate=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

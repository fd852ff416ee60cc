"""Structured Streaming: city events from Kafka, counted per city per event-time window, to Kafka and Parquet.

    spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.1 integration/spark/stream_job.py \\
        --bootstrap 127.0.0.1:9092 --topic city-events --counts-topic city-counts \\
        --parquet ./out/city-counts --checkpoint ./out/checkpoints

Reads `--topic` with format("kafka"), parses the JSON events, counts them per city in tumbling windows
of `--window` with a watermark of `--watermark`, and writes each window's final count once (append mode)
to `--counts-topic` with the kafka sink and to Parquet files. Run it again with the same --checkpoint and
it resumes where it stopped. `--trigger available-now` processes what is in the topic and exits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql.streaming import StreamingQuery

from city_pipeline.cli import (
    add_bootstrap_argument,
    add_connector_arguments,
    exit_for_missing_connector,
    session_from_args,
    trigger_kwargs,
)
from city_pipeline.transforms import DEFAULT_WATERMARK, DEFAULT_WINDOW, parse_events, windowed_counts
from city_pipeline.wiring import read_kafka_stream, start_kafka_sink, start_parquet_sink


def start_queries(events_source: DataFrame, *, bootstrap: str, counts_topic: str, parquet: str | Path,
                  checkpoint: str | Path, trigger: dict, window: str = DEFAULT_WINDOW,
                  watermark: str = DEFAULT_WATERMARK) -> list[StreamingQuery]:
    """Start the two sink queries over `events_source` (the Kafka source's rows). Checkpoints go to
    <checkpoint>/kafka and <checkpoint>/parquet."""
    counts = windowed_counts(parse_events(events_source), window=window, watermark=watermark)
    checkpoint = Path(checkpoint)
    return [
        start_kafka_sink(counts, bootstrap, counts_topic, checkpoint / "kafka", trigger),
        start_parquet_sink(counts, parquet, checkpoint / "parquet", trigger),
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_bootstrap_argument(parser)
    parser.add_argument("--topic", default="city-events", help="events topic (default %(default)s)")
    parser.add_argument("--counts-topic", default="city-counts", help="output topic (default %(default)s)")
    parser.add_argument("--parquet", default="out/city-counts", help="Parquet output directory")
    parser.add_argument("--checkpoint", default="out/checkpoints/city-counts", help="checkpoint directory")
    parser.add_argument("--window", default=DEFAULT_WINDOW, help="window length (default %(default)s)")
    parser.add_argument("--watermark", default=DEFAULT_WATERMARK,
                        help="how late an event may be (default %(default)s)")
    parser.add_argument("--trigger", default="10 seconds",
                        help="'available-now', or a micro-batch interval such as '10 seconds' (the default)")
    parser.add_argument("--starting-offsets", default="earliest",
                        help="where a new query starts: earliest, latest or per-partition JSON")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None,
                        help="cap on records per micro-batch")
    add_connector_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    trigger = trigger_kwargs(args.trigger)
    spark = session_from_args("city-counts-stream", args)
    try:
        source = read_kafka_stream(spark, args.bootstrap, args.topic, starting_offsets=args.starting_offsets,
                                   max_offsets_per_trigger=args.max_offsets_per_trigger)
    except Exception as exc:
        return exit_for_missing_connector("stream_job", exc)
    queries = start_queries(source, bootstrap=args.bootstrap, counts_topic=args.counts_topic,
                            parquet=args.parquet, checkpoint=args.checkpoint, trigger=trigger,
                            window=args.window, watermark=args.watermark)
    try:
        if trigger.get("availableNow"):
            for query in queries:
                query.awaitTermination()
        else:
            spark.streams.awaitAnyTermination()
    except KeyboardInterrupt:
        print("stopping; run again with the same --checkpoint to resume", file=sys.stderr)
    finally:
        for query in queries:
            query.stop()
    failed = [query.name for query in queries if query.exception() is not None]
    for query in queries:
        if query.exception() is not None:
            print(f"query {query.name} failed: {query.exception()}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

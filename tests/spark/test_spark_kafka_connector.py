"""Spark's stock Kafka connector (spark-sql-kafka-0-10 + the Java kafka-clients) against pykbroker.

Runs when $PYKBROKER_SPARK_JARS (or, by default, ../shared/refkit/spark-jars beside the project) names a directory with the connector jars matching the installed
pyspark (see integration/spark/README.md); otherwise the whole module is skipped with that reason.
Only `kafka.bootstrap.servers` points Spark at the broker; every other connector setting is Spark's default.

What is checked, each against what kafka-python produced or reads:
  * batch reads return exactly the produced rows (key, value, topic, partition, offset, timestamp,
    timestampType, headers), with and without includeHeaders;
  * subscribe (several topics), subscribePattern, assign, minPartitions, maxOffsetsPerTrigger and
    failOnDataLoss select and split exactly as documented;
  * the pipeline (stream_job) with trigger(availableNow=True) counts exactly, to Parquet and through the
    kafka sink; the kafka sink's batch writes are read back by kafka-python;
  * a query stopped and restarted from its checkpoint, and a running query across a broker restart
    (SIGTERM and SIGKILL), neither lose nor repeat a record;
  * the replay job reads exactly the offset and timestamp ranges it is given.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter

from spark_guard import require_connector

require_connector()

import pytest  # noqa: E402
from kafka import KafkaConsumer, TopicPartition  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import replay_job  # noqa: E402
import stream_job  # noqa: E402
from city_pipeline.events import make_events, parse_time_ms  # noqa: E402
from city_pipeline.producer import ensure_topic, produce_events  # noqa: E402
from city_pipeline.replay import replay_options  # noqa: E402
from city_pipeline.wiring import read_kafka_batch, read_kafka_stream  # noqa: E402
from kafka_helpers import java_partition, produce, read_topic  # noqa: E402
from pipeline_expect import MINUTE_MS, as_counter, closed_windows, counts_by_window, expected_counts  # noqa: E402

pytestmark = pytest.mark.timeout(300)

PARTITIONS = 3
WATERMARK_MS = 2 * MINUTE_MS
WAIT_S = 60


def recent_minute_ms(minutes_ago: int = 30) -> int:
    """A whole minute in the recent past: event times the broker's default retention (7 days) keeps."""
    now = int(time.time() * 1000)
    return now - now % MINUTE_MS - minutes_ago * MINUTE_MS


def record_messages(count: int, *, start_ms: int, keyed: bool = True) -> list[dict]:
    """kafka-python send() arguments: distinct keys, values, timestamps and headers per record."""
    return [{"key": f"key-{i % 7}".encode() if keyed else None, "value": f"value-{i}".encode(),
             "timestamp_ms": start_ms + i, "headers": [("seq", str(i).encode()), ("empty", b"")]}
            for i in range(count)]


def rows_as_records(df, *, headers: bool) -> list[tuple]:
    """The Kafka source's rows as comparable tuples: bytes not bytearrays, timestamps in epoch ms."""
    columns = ["key", "value", "topic", "partition", "offset", F.unix_millis("timestamp").alias("ts"),
               "timestampType"] + (["headers"] if headers else [])
    records = []
    for row in df.select(*columns).collect():
        record = (None if row.key is None else bytes(row.key), None if row.value is None else bytes(row.value),
                  row.topic, row.partition, row.offset, row.ts, row.timestampType)
        if headers:
            record += (tuple((h.key, None if h.value is None else bytes(h.value)) for h in row.headers or ()),)
        records.append(record)
    return sorted(records, key=lambda r: (r[2], r[3], r[4]))


def acked_as_records(topic: str, acked, *, headers: bool) -> list[tuple]:
    records = []
    for a in acked:
        record = (a.key, a.value, topic, a.partition, a.offset, a.timestamp_ms, 0)
        records.append(record + ((a.headers,) if headers else ()))
    return sorted(records, key=lambda r: (r[2], r[3], r[4]))


def batch(spark, bootstrap: str, **options):
    return read_kafka_batch(spark, bootstrap, {k: str(v) for k, v in options.items()})


def log_start_offset(bootstrap: str, topic: str, partition: int = 0) -> int:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        tp = TopicPartition(topic, partition)
        return consumer.beginning_offsets([tp])[tp]
    finally:
        consumer.close()


# -- batch reads --------------------------------------------------------------------------------------


def test_batch_read_returns_exactly_the_produced_rows(spark, module_broker, unique_name):
    bootstrap = module_broker.bootstrap
    ensure_topic(bootstrap, unique_name, PARTITIONS)
    messages = record_messages(60, start_ms=recent_minute_ms())
    messages += [{"key": None, "value": b"no key", "timestamp_ms": recent_minute_ms(), "partition": 1},
                 {"key": b"tombstone", "value": None, "timestamp_ms": recent_minute_ms(), "partition": 2}]
    acked = produce(bootstrap, unique_name, messages)
    assert {a.partition for a in acked} == set(range(PARTITIONS))

    with_headers = batch(spark, bootstrap, subscribe=unique_name, startingOffsets="earliest",
                         endingOffsets="latest", includeHeaders="true")
    assert with_headers.columns == ["key", "value", "topic", "partition", "offset", "timestamp",
                                    "timestampType", "headers"]
    assert rows_as_records(with_headers, headers=True) == acked_as_records(unique_name, acked, headers=True)

    without_headers = batch(spark, bootstrap, subscribe=unique_name)  # defaults: earliest to latest
    assert "headers" not in without_headers.columns
    assert rows_as_records(without_headers, headers=False) == acked_as_records(unique_name, acked, headers=False)


def test_subscribe_several_topics_and_subscribe_pattern(spark, module_broker, unique_name):
    bootstrap = module_broker.bootstrap
    names = {"a": f"{unique_name}-a", "b": f"{unique_name}-b", "other": f"{unique_name}x-c"}
    acked = {}
    for label, topic in names.items():
        ensure_topic(bootstrap, topic, 2)
        acked[label] = produce(bootstrap, topic, record_messages(10 + len(acked), start_ms=recent_minute_ms()))

    def topics_and_counts(df):
        return dict(Counter(row.topic for row in df.select("topic").collect()))

    both = batch(spark, bootstrap, subscribe=f"{names['a']}, {names['b']}")
    assert topics_and_counts(both) == {names["a"]: len(acked["a"]), names["b"]: len(acked["b"])}

    pattern = batch(spark, bootstrap, subscribePattern=re.escape(unique_name) + "-.*")
    assert topics_and_counts(pattern) == {names["a"]: len(acked["a"]), names["b"]: len(acked["b"])}
    expected = sorted(acked_as_records(names["a"], acked["a"], headers=False)
                      + acked_as_records(names["b"], acked["b"], headers=False), key=lambda r: (r[2], r[3], r[4]))
    assert rows_as_records(pattern, headers=False) == expected


def test_assign_reads_only_the_assigned_partitions(spark, module_broker, unique_name):
    bootstrap = module_broker.bootstrap
    ensure_topic(bootstrap, unique_name, PARTITIONS)
    acked = produce(bootstrap, unique_name, record_messages(45, start_ms=recent_minute_ms()))
    assigned = batch(spark, bootstrap, assign=json.dumps({unique_name: [0, 2]}))
    expected = [a for a in acked if a.partition in (0, 2)]
    assert expected and len(expected) < len(acked)
    assert rows_as_records(assigned, headers=False) == acked_as_records(unique_name, expected, headers=False)


def test_min_partitions_splits_ranges_without_losing_or_repeating(spark, module_broker, unique_name):
    bootstrap = module_broker.bootstrap
    ensure_topic(bootstrap, unique_name, PARTITIONS)
    messages = [{"value": f"v-{i}".encode(), "partition": i % PARTITIONS, "timestamp_ms": recent_minute_ms()}
                for i in range(120)]
    acked = produce(bootstrap, unique_name, messages)
    split = batch(spark, bootstrap, subscribe=unique_name, minPartitions=2 * PARTITIONS)
    # Each Kafka partition's range is cut in two, so consumers start reading mid-partition (inside a
    # record batch): the broker must serve from there and the consumer skip what precedes its offset.
    assert split.rdd.getNumPartitions() >= 2 * PARTITIONS
    assert rows_as_records(split, headers=False) == acked_as_records(unique_name, acked, headers=False)


def test_fail_on_data_loss_when_retention_removed_the_start_of_the_range(spark, make_broker, unique_name):
    broker = make_broker({"log.retention.check.interval.ms": 100})
    bootstrap = broker.bootstrap
    # Small segments and retention.bytes=1: every closed segment is deleted, so the log start moves up.
    ensure_topic(bootstrap, unique_name, 1, {"segment.bytes": 1024, "retention.bytes": 1})
    acked = produce(bootstrap, unique_name, record_messages(60, start_ms=recent_minute_ms(), keyed=False),
                    one_batch_each=True)
    deadline = time.monotonic() + WAIT_S
    while (start := log_start_offset(bootstrap, unique_name)) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert 0 < start < len(acked), f"retention did not move the log start offset (it is {start})"
    from_zero = {"subscribe": unique_name, "startingOffsets": json.dumps({unique_name: {"0": 0}})}

    with pytest.raises(Exception) as excinfo:
        read_kafka_batch(spark, bootstrap, from_zero).collect()
    assert "failOnDataLoss" in str(excinfo.value), str(excinfo.value)[-2000:]

    lenient = rows_as_records(read_kafka_batch(spark, bootstrap, {**from_zero, "failOnDataLoss": "false"}),
                              headers=False)
    # Retention keeps running (every 100 ms) while Spark reads, and the first segments may have been
    # deleted while the producer was still rolling new ones: the log start can move past `start` at any
    # time until only the active segment is left. So the lenient read must begin somewhere between the
    # start seen before it and the start seen after it, and from there hold every later record exactly.
    assert lenient, "the lenient read returned nothing, yet the active segment is never deleted"
    first = lenient[0][4]  # (key, value, topic, partition, offset, timestamp, timestampType)
    assert start <= first <= log_start_offset(bootstrap, unique_name)
    kept = [a for a in acked if a.offset >= first]
    assert lenient == acked_as_records(unique_name, kept, headers=False)


# -- writes ---------------------------------------------------------------------------------------------


def test_kafka_sink_batch_write_is_read_back_by_kafka_python(spark, module_broker, unique_name):
    bootstrap = module_broker.bootstrap
    ensure_topic(bootstrap, unique_name, PARTITIONS)
    rows = [(f"spark-key-{i % 11}".encode(), f"spark-value-{i}".encode(), [("n", str(i).encode())])
            for i in range(100)]
    df = spark.createDataFrame(rows, "key binary, value binary, headers array<struct<key:string,value:binary>>")
    (df.write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", unique_name)
     .save())

    records = read_topic(bootstrap, unique_name, len(rows))
    assert sorted((r.key, r.value, tuple(r.headers)) for r in records) == \
        sorted((k, v, tuple(h)) for k, v, h in rows)
    for record in records:
        # Spark's writer is the Java producer: its default partitioner is murmur2 on the key.
        assert record.partition == java_partition(record.key, PARTITIONS)
    for partition in range(PARTITIONS):
        offsets = [r.offset for r in records if r.partition == partition]
        assert offsets == list(range(len(offsets))), f"partition {partition}: offsets not dense"


# -- the streaming pipeline -------------------------------------------------------------------------------


def test_stream_job_available_now_counts_exactly_to_parquet_and_kafka(spark, module_broker, unique_name,
                                                                     tmp_path):
    bootstrap = module_broker.bootstrap
    ensure_topic(bootstrap, unique_name, PARTITIONS)
    counts_topic = f"{unique_name}-counts"
    ensure_topic(bootstrap, counts_topic, 1)
    events = make_events(600, start_ms=recent_minute_ms() + 3_000, step_ms=1_000, seed=5, max_lateness_ms=15_000)
    produce_events(bootstrap, unique_name, events)

    parquet = tmp_path / "counts"
    assert stream_job.main([
        "--bootstrap", bootstrap, "--topic", unique_name, "--counts-topic", counts_topic,
        "--parquet", str(parquet), "--checkpoint", str(tmp_path / "checkpoint"),
        "--trigger", "available-now", "--window", "1 minute", "--watermark", "2 minutes"]) == 0

    watermark = max(e.event_time_ms for e in events) - WATERMARK_MS
    expected = closed_windows(expected_counts(events, MINUTE_MS), watermark, MINUTE_MS)
    assert expected
    rows = counts_by_window(spark.read.parquet(str(parquet)))
    assert len(rows) == len(expected), "a window emitted twice, or a closed window missing"
    assert as_counter(rows) == expected

    published = read_topic(bootstrap, counts_topic, len(expected))
    values = [json.loads(r.value) for r in published]
    assert all(r.key == v["city"].encode() for r, v in zip(published, values))
    assert Counter({(v["city"], parse_time_ms(v["window_start"])): v["events"] for v in values}) == expected
    assert len(values) == len(expected)


def start_passthrough(spark, bootstrap, topic, output, checkpoint, trigger, **options):
    """A streaming query that stores every record's coordinates and value as Parquet (exactly once)."""
    source = read_kafka_stream(spark, bootstrap, topic, extra_options={k: str(v) for k, v in options.items()})
    return (source.select("partition", "offset", "key", "value").writeStream.format("parquet")
            .option("path", str(output)).option("checkpointLocation", str(checkpoint))
            .trigger(**trigger).start())


def stored_records(spark, output) -> list[tuple]:
    rows = spark.read.parquet(str(output)).collect()
    return sorted((r.partition, r.offset, bytes(r.key) if r.key is not None else None, bytes(r.value))
                  for r in rows)


def acked_coordinates(acked) -> list[tuple]:
    return sorted((a.partition, a.offset, a.key, a.value) for a in acked)


def test_query_restarted_from_checkpoint_neither_loses_nor_repeats(spark, module_broker, unique_name, tmp_path):
    bootstrap = module_broker.bootstrap
    ensure_topic(bootstrap, unique_name, PARTITIONS)
    output, checkpoint = tmp_path / "records", tmp_path / "checkpoint"
    first = produce(bootstrap, unique_name, record_messages(100, start_ms=recent_minute_ms()))

    query = start_passthrough(spark, bootstrap, unique_name, output, checkpoint, {"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None
    assert stored_records(spark, output) == acked_coordinates(first)

    second = produce(bootstrap, unique_name, record_messages(50, start_ms=recent_minute_ms(20)))
    query = start_passthrough(spark, bootstrap, unique_name, output, checkpoint, {"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None
    assert stored_records(spark, output) == acked_coordinates(first + second)


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_broker_restart_mid_stream_neither_loses_nor_repeats(spark, make_broker, unique_name, tmp_path, kill):
    broker = make_broker()
    bootstrap = broker.bootstrap
    ensure_topic(bootstrap, unique_name, PARTITIONS)
    output = tmp_path / "records"
    query = start_passthrough(spark, bootstrap, unique_name, output, tmp_path / "checkpoint",
                              {"processingTime": "1 second"})
    try:
        before = produce(bootstrap, unique_name, record_messages(100, start_ms=recent_minute_ms()))
        query.processAllAvailable()
        assert stored_records(spark, output) == acked_coordinates(before)

        broker.restart(kill=kill)  # same port and data dir: the same broker to its clients
        after = produce(bootstrap, unique_name, record_messages(100, start_ms=recent_minute_ms(20)))
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    assert stored_records(spark, output) == acked_coordinates(before + after)


def test_max_offsets_per_trigger_caps_each_micro_batch(spark, module_broker, unique_name, tmp_path):
    bootstrap = module_broker.bootstrap
    ensure_topic(bootstrap, unique_name, 1)
    acked = produce(bootstrap, unique_name, record_messages(50, start_ms=recent_minute_ms()))
    output = tmp_path / "records"
    query = start_passthrough(spark, bootstrap, unique_name, output, tmp_path / "checkpoint",
                              {"availableNow": True}, maxOffsetsPerTrigger=10)
    query.awaitTermination()
    assert query.exception() is None
    # availableNow honours the rate limit: the 50 records arrive in five batches of ten.
    sizes = [progress["numInputRows"] for progress in query.recentProgress if progress["numInputRows"]]
    assert sizes == [10] * 5
    assert stored_records(spark, output) == acked_coordinates(acked)


# -- the replay job -------------------------------------------------------------------------------------


@pytest.fixture
def replay_topic(module_broker, unique_name):
    """A 3-partition topic of 300 city events (record timestamp = event time, some out of order)."""
    ensure_topic(module_broker.bootstrap, unique_name, PARTITIONS)
    events = make_events(300, start_ms=recent_minute_ms() + 1_000, step_ms=2_000, seed=9, max_lateness_ms=10_000)
    deliveries = produce_events(module_broker.bootstrap, unique_name, events)
    return unique_name, deliveries


def coverage_rows(coverage) -> list[tuple]:
    return [(r.partition, r.first_offset, r.last_offset, r.records) for r in coverage.collect()]


def expected_coverage(selected) -> list[tuple]:
    result = []
    for partition in sorted({d.partition for d in selected}):
        offsets = [d.offset for d in selected if d.partition == partition]
        result.append((partition, min(offsets), max(offsets), len(offsets)))
    return result


def test_replay_by_offsets_reads_exactly_the_range(spark, module_broker, replay_topic):
    topic, deliveries = replay_topic
    options = replay_options(topic, range(PARTITIONS), from_offsets={0: 5, 2: 3}, to_offsets={0: 20})
    coverage, counts = replay_job.replay(spark, module_broker.bootstrap, options)

    def selected(d):
        return {0: 5 <= d.offset < 20, 1: True, 2: d.offset >= 3}[d.partition]

    chosen = [d for d in deliveries if selected(d)]
    assert coverage_rows(coverage) == expected_coverage(chosen)
    assert as_counter(counts_by_window(counts)) == expected_counts([d.event for d in chosen], MINUTE_MS)


def test_replay_by_timestamp_reads_from_the_first_record_at_or_after_it(spark, module_broker, replay_topic,
                                                                       tmp_path):
    topic, deliveries = replay_topic
    times = sorted(d.event.event_time_ms for d in deliveries)
    start_ms, end_ms = times[len(times) // 3], times[2 * len(times) // 3]

    # Kafka's ListOffsets by timestamp: per partition, the first offset whose timestamp is >= the
    # target. The range runs from that offset (start) up to, not including, that offset (end).
    def first_offset_at_or_after(partition, ts):
        offsets = [d.offset for d in deliveries if d.partition == partition and d.event.event_time_ms >= ts]
        return min(offsets) if offsets else max(d.offset for d in deliveries if d.partition == partition) + 1

    chosen = [d for d in deliveries
              if first_offset_at_or_after(d.partition, start_ms) <= d.offset < first_offset_at_or_after(d.partition,
                                                                                                        end_ms)]
    output = tmp_path / "replay"
    assert replay_job.main(["--bootstrap", module_broker.bootstrap, "--topic", topic,
                            "--from-time", str(start_ms), "--to-time", str(end_ms), "--output", str(output)]) == 0
    rows = counts_by_window(spark.read.parquet(str(output)))
    assert as_counter(rows) == expected_counts([d.event for d in chosen], MINUTE_MS)

    options = replay_options(topic, range(PARTITIONS), from_timestamp_ms=start_ms, to_timestamp_ms=end_ms)
    coverage, _ = replay_job.replay(spark, module_broker.bootstrap, options)
    assert coverage_rows(coverage) == expected_coverage(chosen)

"""Spark's Kafka connector features people use, on a Spark standalone cluster (a master and two workers, one
executor each) reading a 3-broker pykbroker cluster (ZooKeeper mode, RF 3, min ISR 2): startingOffsetsByTimestamp,
maxOffsetsPerTrigger, minPartitions, includeHeaders, kafka.isolation.level=read_committed over transactional
input, assign, subscribePattern, Trigger.AvailableNow, and a kafka-sink batch write read back by a batch read.

One driver serves the whole module: this file is also the driver script. The module fixture submits it with
spark-submit to the standalone master (client mode, the connector jars with --jars); the driver starts its
SparkSession once and then runs the jobs the tests ask for over a local multiprocessing connection (the
`job_*` functions below, run in the driver; their tasks run on the cluster's executors, which read the
brokers). The tests produce with kafka-python or confluent-kafka and compare what Spark returns with what the
brokers acknowledged. Skipped with the reason where pyspark, Java, the connector jars or ZooKeeper are absent.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections import Counter
from multiprocessing.connection import Client, Listener
from pathlib import Path

if __name__ == "__main__":  # spark-submit runs this file as the driver: the import paths conftest.py sets up
    _ROOT = Path(__file__).resolve().parents[2]
    for _path in (_ROOT / "integration" / "spark", _ROOT / "tests" / "integration", _ROOT / "tests" / "spark"):
        sys.path.insert(0, str(_path))

from spark_guard import require_connector  # noqa: E402

require_connector()

import pytest  # noqa: E402

from broker_process import wait_until  # noqa: E402
from kafka_helpers import java_partition, produce  # noqa: E402

HOST = "127.0.0.1"
DRIVER_KEY_ENV = "SPARK_FEATURE_DRIVER_KEY"
DRIVER_START_TIMEOUT_S = 180.0  # a driver JVM on a loaded 2-core machine that already runs the cluster's JVMs
DRIVER_LISTENING = re.compile(r"^feature driver listening on 127\.0\.0\.1:(\d+)$", re.MULTILINE)
JOB_TIMEOUT_S = 150.0
STREAM_TIMEOUT_S = 120.0
PARTITIONS = 3

# pytest-timeout's limit covers a test's fixtures too, and the first test of the module sets up the Spark
# standalone cluster (spark_cluster.READY_TIMEOUT_S 180 s), the three brokers (broker_cluster.READY_TIMEOUT_S
# 60 s), the driver (180 s) and its executors (wait_executors, 180 s) before its own jobs: the limit is their
# sum plus three jobs (the most a test runs) and a minute of slack, so that on a slow machine the wait that ran
# out fails with its own message, not with pytest-timeout's stack dump. It only catches a hang outside them.
MODULE_SETUP_S = 180.0 + 60.0 + DRIVER_START_TIMEOUT_S + 180.0
pytestmark = pytest.mark.timeout(MODULE_SETUP_S + 3 * JOB_TIMEOUT_S + 60.0)


# -- the driver's side: jobs over the SparkSession (run in the spark-submitted process) ----------------------------


def _rows(df, *, headers: bool = False) -> list[tuple]:
    """The Kafka source's rows as plain tuples (bytes, epoch ms), with the Spark partition that read each:
    (key, value, topic, partition, offset, timestamp ms, timestampType, headers or None, Spark partition)."""
    from pyspark.sql import functions as F

    columns = ["key", "value", "topic", "partition", "offset", F.unix_millis("timestamp").alias("ts"),
               "timestampType", (F.col("headers") if headers else F.lit(None)).alias("headers"),
               F.spark_partition_id().alias("spark_partition")]
    found = []
    for row in df.select(*columns).collect():
        row_headers = None if not headers else tuple(
            (h.key, None if h.value is None else bytes(h.value)) for h in row.headers or ())
        found.append((None if row.key is None else bytes(row.key), None if row.value is None else bytes(row.value),
                      row.topic, row.partition, row.offset, row.ts, row.timestampType, row_headers,
                      row.spark_partition))
    return sorted(found, key=lambda r: (r[2], r[3], r[4]))


def job_read(spark, options: dict[str, str]) -> dict:
    """A batch read (spark.read.format("kafka")) with `options`: its rows and how many Spark partitions."""
    df = spark.read.format("kafka").options(**options).load()
    return {"rows": _rows(df, headers=options.get("includeHeaders") == "true"),
            "spark_partitions": df.rdd.getNumPartitions()}


def job_write(spark, options: dict[str, str], rows: list[tuple]) -> int:
    """A batch write with the kafka sink of (key, value, headers) rows."""
    schema = "key binary, value binary, headers array<struct<key:string,value:binary>>"
    spark.createDataFrame(rows, schema).write.format("kafka").options(**options).save()
    return len(rows)


def job_stream(spark, options: dict[str, str], checkpoint: str, *, available_now: bool,
               stop_after_rows: int = 0) -> list[tuple[int, list[tuple]]]:
    """A streaming read (spark.readStream.format("kafka")) into foreachBatch, which brings each micro-batch's rows
    to the driver. available_now: Trigger.AvailableNow, the query ends by itself; otherwise the default trigger
    (micro-batches back to back), stopped once `stop_after_rows` rows arrived. Returns (batch id, rows) per
    micro-batch that had rows."""
    batches: list[tuple[int, list[tuple]]] = []

    def collect(batch_df, batch_id: int) -> None:
        rows = _rows(batch_df)
        if rows:
            batches.append((batch_id, rows))

    writer = (spark.readStream.format("kafka").options(**options).load().writeStream
              .foreachBatch(collect).option("checkpointLocation", checkpoint))
    query = (writer.trigger(availableNow=True) if available_now else writer).start()
    try:
        deadline = time.monotonic() + STREAM_TIMEOUT_S
        if available_now:
            if not query.awaitTermination(STREAM_TIMEOUT_S):
                raise TimeoutError(f"the AvailableNow query did not end within {STREAM_TIMEOUT_S} s")
        else:
            while sum(len(rows) for _, rows in batches) < stop_after_rows:
                if query.exception() is not None or not query.isActive:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{sum(len(r) for _, r in batches)} of {stop_after_rows} rows after "
                                       f"{STREAM_TIMEOUT_S} s")
                time.sleep(0.2)
        if query.exception() is not None:
            raise RuntimeError(f"the query failed: {query.exception()}")
    finally:
        query.stop()
    return batches


JOBS = {"read": job_read, "write": job_write, "stream": job_stream}


def serve() -> None:
    """The driver's loop: one SparkSession (master, conf and jars from spark-submit), jobs until the test module
    closes the connection. It listens on a port the system picks (bound at once, so no other server can hold it)
    and says which in its log, where the test module reads it. Each answer carries its request's id."""
    from city_pipeline.session import build_session

    spark = build_session("pykbroker-cluster-features", log_level="ERROR")
    with Listener((HOST, 0), authkey=bytes.fromhex(os.environ[DRIVER_KEY_ENV])) as listener:
        print(f"feature driver listening on {HOST}:{listener.address[1]}", flush=True)
        with listener.accept() as connection:
            while True:
                try:
                    request, name, args, kwargs = connection.recv()
                except EOFError:
                    break
                try:
                    connection.send((request, "ok", JOBS[name](spark, *args, **kwargs)))
                except Exception as exc:  # the test reads it and fails with it; the driver serves the next job
                    connection.send((request, "error", f"{type(exc).__name__}: {exc}"))
    spark.stop()


# -- the test's side ------------------------------------------------------------------------------------------------


class FeatureDriver:
    """The module's Spark driver on the standalone cluster: call(job, ...) runs job_<job> there."""

    def __init__(self, cluster, log: Path):
        self.cluster = cluster
        self.log = log
        self.requests = 0
        key = secrets.token_hex(16)
        self.process = cluster.launch(Path(__file__), "--serve", log=log, env={DRIVER_KEY_ENV: key})
        port = []

        def listening() -> bool:  # the port the driver bound, from its log: no other server can be on it
            if self.process.poll() is not None:
                raise AssertionError(f"the feature driver exited with {self.process.returncode}:\n"
                                     f"{log.read_text(errors='replace')[-4000:]}")
            found = DRIVER_LISTENING.search(log.read_text(errors="replace")) if log.exists() else None
            if found:
                port.append(int(found.group(1)))
            return bool(found)

        wait_until(listening, "the feature driver's SparkSession on the standalone cluster", DRIVER_START_TIMEOUT_S)
        self.port = port[0]
        self.connection = Client((HOST, self.port), authkey=bytes.fromhex(key))

    def call(self, job: str, *args, timeout: float = JOB_TIMEOUT_S, **kwargs):
        """Run job_<job> in the driver, its answer within `timeout` s. The answers of earlier calls that timed out
        (their jobs ran on in the driver, which serves one at a time) are told apart by their request id and
        dropped: a call never returns another job's answer."""
        self.requests += 1
        request = self.requests
        self.connection.send((request, job, args, kwargs))
        deadline = time.monotonic() + timeout
        while True:
            if not self.connection.poll(max(0.0, deadline - time.monotonic())):
                raise AssertionError(f"job {job} (request {request}) gave no answer within {timeout} s\n"
                                     f"{self.log_tail()}")
            answered, status, value = self.connection.recv()
            if answered == request:
                break
            print(f"dropped the late answer to request {answered} ({status}) while waiting for request {request}")
        if status != "ok":
            raise AssertionError(f"job {job} failed in the driver: {value[:3000]}")
        return value

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])

    def close(self) -> None:
        self.connection.close()  # the driver's loop ends, it stops its session and exits
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            pass  # spark_standalone.stop() ends it by PID


@pytest.fixture(scope="module")
def driver(spark_standalone, pykbroker_cluster, tmp_path_factory):
    feature_driver = FeatureDriver(spark_standalone, tmp_path_factory.mktemp("feature-driver") / "driver.log")
    spark_standalone.wait_executors(2, driver=feature_driver.process)
    yield feature_driver
    feature_driver.close()


@pytest.fixture
def cluster(pykbroker_cluster, spark_standalone):
    """The pykbroker cluster (requesting the Spark cluster too, so a failure report carries both logs)."""
    return pykbroker_cluster


def source(cluster, **options) -> dict[str, str]:
    return {"kafka.bootstrap.servers": cluster.bootstrap, **{k: str(v) for k, v in options.items()}}


def recent_ms(minutes_ago: int = 30) -> int:
    """A time in the recent past, in whole seconds: timestamps the brokers' retention (7 days) keeps."""
    now = int(time.time()) * 1000
    return now - minutes_ago * 60_000


def messages(count: int, *, start_ms: int, step_ms: int = 1, partitions: int = PARTITIONS, **extra) -> list[dict]:
    """kafka-python send() arguments, record i to partition i % partitions with timestamp start_ms + i * step_ms."""
    return [{"value": f"value-{i}".encode(), "partition": i % partitions, "timestamp_ms": start_ms + i * step_ms,
             **extra} for i in range(count)]


def coordinates(rows) -> list[tuple]:
    """(topic, partition, offset, value) of Spark rows."""
    return sorted((r[2], r[3], r[4], r[1]) for r in rows)


def acked_coordinates(topic: str, acked) -> list[tuple]:
    return sorted((topic, a.partition, a.offset, a.value) for a in acked)


# -- the features -------------------------------------------------------------------------------------------------


def test_starting_offsets_by_timestamp(driver, cluster, unique_name):
    cluster.create_topic(unique_name, PARTITIONS)
    start_ms = recent_ms()
    acked = produce(cluster.bootstrap, unique_name, messages(90, start_ms=start_ms, step_ms=1000))
    # Per partition its own start time: between two records' timestamps for 0, exactly on one for 1, after
    # every record for 2. End times (Spark wants one for every partition): the first record at or after it is
    # excluded; for 1 and 2 after every record, which ends them at their latest offset.
    starts = {0: start_ms + 30_500, 1: start_ms + 61_000, 2: start_ms + 3_600_000}
    ends = {0: start_ms + 75_000, 1: start_ms + 3_600_000, 2: start_ms + 3_600_000}
    read = driver.call("read", source(
        cluster, subscribe=unique_name,
        startingOffsetsByTimestamp=json.dumps({unique_name: {str(p): t for p, t in starts.items()}}),
        endingOffsetsByTimestamp=json.dumps({unique_name: {str(p): t for p, t in ends.items()}}),
        # a partition with no record at or after its start time starts at its end (the default fails the query)
        startingOffsetsByTimestampStrategy="latest"))

    expected = [a for a in acked if a.timestamp_ms >= starts[a.partition]
                and a.timestamp_ms < ends[a.partition]]
    assert {a.partition for a in expected} == {0, 1}
    assert coordinates(read["rows"]) == acked_coordinates(unique_name, expected)
    assert all(r[5] >= starts[r[3]] for r in read["rows"])


def test_max_offsets_per_trigger_caps_every_micro_batch(driver, cluster, unique_name, tmp_path):
    cluster.create_topic(unique_name, PARTITIONS)
    acked = produce(cluster.bootstrap, unique_name, messages(100, start_ms=recent_ms()))
    limit = 15
    batches = driver.call("stream", source(cluster, subscribe=unique_name, startingOffsets="earliest",
                                           maxOffsetsPerTrigger=limit),
                          str(tmp_path / "checkpoint"), available_now=False, stop_after_rows=len(acked))

    sizes = [len(rows) for _, rows in batches]
    assert max(sizes) <= limit, f"micro-batch sizes {sizes}"
    assert len(sizes) >= -(-len(acked) // limit)
    assert coordinates(row for _, rows in batches for row in rows) == acked_coordinates(unique_name, acked)


def test_min_partitions_splits_one_kafka_partition_over_several_tasks(driver, cluster, unique_name):
    cluster.create_topic(unique_name, 1)
    acked = produce(cluster.bootstrap, unique_name, messages(200, start_ms=recent_ms(), partitions=1))
    read = driver.call("read", source(cluster, subscribe=unique_name, minPartitions=4))

    assert read["spark_partitions"] >= 4
    assert coordinates(read["rows"]) == acked_coordinates(unique_name, acked)
    # Each Spark partition read one contiguous offset range of the Kafka partition, the ranges do not overlap,
    # and at least four tasks had rows: consumers started mid-partition, inside record batches.
    ranges = {}
    for row in read["rows"]:
        low, high = ranges.get(row[8], (row[4], row[4]))
        ranges[row[8]] = (min(low, row[4]), max(high, row[4]))
    per_task = Counter(row[8] for row in read["rows"])
    assert len(ranges) >= 4
    assert all(high - low + 1 == per_task[task] for task, (low, high) in ranges.items())


def test_include_headers(driver, cluster, unique_name):
    from confluent_kafka import Producer

    cluster.create_topic(unique_name, PARTITIONS)
    # repeated keys in order, an empty value, a null value (which kafka-python cannot send), none at all
    headers = [[("seq", b"0"), ("dup", b"first"), ("dup", b"second"), ("empty", b"")], [("null-value", None)], []]
    acked: dict[tuple[int, int], tuple] = {}
    producer = Producer({"bootstrap.servers": cluster.bootstrap})
    for i in range(12):
        sent = tuple(headers[i % len(headers)])
        producer.produce(unique_name, f"value-{i}".encode(), partition=i % PARTITIONS, headers=list(sent),
                         on_delivery=lambda err, msg, sent=sent: acked.__setitem__(
                             (msg.partition(), msg.offset()), sent if err is None else err))
    assert producer.flush(30) == 0 and len(acked) == 12, acked
    with_headers = driver.call("read", source(cluster, subscribe=unique_name, includeHeaders="true"))

    assert {(row[3], row[4]): row[7] for row in with_headers["rows"]} == acked
    without = driver.call("read", source(cluster, subscribe=unique_name))
    assert len(without["rows"]) == len(acked) and all(row[7] is None for row in without["rows"])


def test_read_committed_reads_only_committed_transactions(driver, cluster, unique_name):
    from confluent_kafka import Producer

    cluster.create_topic(unique_name, PARTITIONS)
    acked: dict[bytes, tuple[int, int]] = {}
    errors = []

    def delivered(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked[msg.value()] = (msg.partition(), msg.offset())

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": f"{unique_name}-txn"})
    producer.init_transactions(60)
    outcome = {}
    for index, commit in enumerate((True, False, True, False, True)):
        producer.begin_transaction()
        for i in range(12):
            value = f"txn-{index}-{i}".encode()
            outcome[value] = commit
            producer.produce(unique_name, value, partition=i % PARTITIONS, on_delivery=delivered)
        producer.flush(60)
        if commit:
            producer.commit_transaction(60)
        else:
            producer.abort_transaction(60)
    plain = produce(cluster.bootstrap, unique_name, [{"value": b"plain", "partition": 1}])  # no transaction
    assert not errors, errors
    outcome[b"plain"] = True
    acked[b"plain"] = (plain[0].partition, plain[0].offset)

    committed = driver.call("read", source(cluster, subscribe=unique_name, **{"kafka.isolation.level": "read_committed"}))
    expected = sorted((unique_name, *acked[v], v) for v, commit in outcome.items() if commit)
    assert coordinates(committed["rows"]) == expected
    # read_uncommitted (the default) sees the aborted records too: they are in the log, only their
    # transactions' markers tell them apart
    everything = driver.call("read", source(cluster, subscribe=unique_name))
    assert coordinates(everything["rows"]) == sorted((unique_name, *acked[v], v) for v in outcome)


def test_assign_reads_only_the_assigned_partitions(driver, cluster, unique_name):
    cluster.create_topic(unique_name, PARTITIONS)
    acked = produce(cluster.bootstrap, unique_name, messages(45, start_ms=recent_ms()))
    read = driver.call("read", source(cluster, assign=json.dumps({unique_name: [0, 2]})))
    expected = [a for a in acked if a.partition in (0, 2)]
    assert coordinates(read["rows"]) == acked_coordinates(unique_name, expected)
    # with starting offsets per assigned partition: 0 from offset 10, 2 from the earliest (-2)
    read = driver.call("read", source(cluster, assign=json.dumps({unique_name: [0, 2]}),
                                      startingOffsets=json.dumps({unique_name: {"0": 10, "2": -2}})))
    expected = [a for a in expected if a.partition == 2 or a.offset >= 10]
    assert coordinates(read["rows"]) == acked_coordinates(unique_name, expected)


def test_subscribe_pattern_reads_every_matching_topic(driver, cluster, unique_name):
    names = [f"{unique_name}-a", f"{unique_name}-b", f"{unique_name}x-other"]
    acked = {}
    for count, topic in enumerate(names, start=5):
        cluster.create_topic(topic, 2)
        acked[topic] = produce(cluster.bootstrap, topic, messages(count, start_ms=recent_ms(), partitions=2))
    read = driver.call("read", source(cluster, subscribePattern=re.escape(unique_name) + "-.*"))
    assert coordinates(read["rows"]) == sorted(acked_coordinates(names[0], acked[names[0]])
                                               + acked_coordinates(names[1], acked[names[1]]))


def test_trigger_available_now_processes_what_is_there_and_ends(driver, cluster, unique_name, tmp_path):
    cluster.create_topic(unique_name, PARTITIONS)
    checkpoint = str(tmp_path / "checkpoint")
    options = source(cluster, subscribe=unique_name, startingOffsets="earliest")
    first = produce(cluster.bootstrap, unique_name, messages(60, start_ms=recent_ms()))
    batches = driver.call("stream", options, checkpoint, available_now=True)
    assert coordinates(r for _, rows in batches for r in rows) == acked_coordinates(unique_name, first)

    # the query ended by itself; run again from its checkpoint: only what arrived since
    second = produce(cluster.bootstrap, unique_name, messages(30, start_ms=recent_ms()))
    batches = driver.call("stream", options, checkpoint, available_now=True)
    assert coordinates(r for _, rows in batches for r in rows) == acked_coordinates(unique_name, second)
    assert driver.call("stream", options, checkpoint, available_now=True) == []  # nothing new: no rows


def test_kafka_sink_batch_write_then_batch_read(driver, cluster, unique_name):
    cluster.create_topic(unique_name, PARTITIONS)
    rows = [(f"key-{i % 13}".encode(), f"spark-value-{i}".encode(), [("n", str(i).encode())]) for i in range(150)]
    assert driver.call("write", source(cluster, topic=unique_name), rows) == len(rows)

    read = driver.call("read", source(cluster, subscribe=unique_name, includeHeaders="true"))["rows"]
    assert sorted((r[0], r[1], r[7]) for r in read) == sorted((k, v, tuple(h)) for k, v, h in rows)
    for row in read:  # the sink's producer is the Java client: murmur2 of the key picks the partition
        assert row[3] == java_partition(row[0], PARTITIONS)
    for partition in range(PARTITIONS):
        offsets = sorted(r[4] for r in read if r[3] == partition)
        assert offsets == list(range(len(offsets))), f"partition {partition}: offsets not dense"


def test_a_timed_out_jobs_late_answer_is_not_taken_for_the_next_jobs(driver, cluster, unique_name):
    """The module's harness: a job that outlives its call's timeout runs on in the driver and answers later;
    the next call drops that answer (another request id) and returns its own job's rows."""
    late, next_topic = f"{unique_name}-late", f"{unique_name}-next"
    for topic, count in ((late, 7), (next_topic, 11)):
        cluster.create_topic(topic, PARTITIONS)
        produce(cluster.bootstrap, topic, messages(count, start_ms=recent_ms()))
    with pytest.raises(AssertionError, match="gave no answer within"):
        driver.call("read", source(cluster, subscribe=late), timeout=0.01)  # a Spark job takes longer than 10 ms
    read = driver.call("read", source(cluster, subscribe=next_topic))
    assert {r[2] for r in read["rows"]} == {next_topic} and len(read["rows"]) == 11


if __name__ == "__main__":
    if sys.argv[1:] != ["--serve"]:
        sys.exit(f"usage: spark-submit {Path(__file__).name} --serve (the test module's Spark driver)")
    serve()

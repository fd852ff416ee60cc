"""The pipeline's jobs on a Spark standalone cluster (a master and two workers from pyspark's distribution)
reading a 3-broker pykbroker cluster (ZooKeeper mode, RF 3, min ISR 2), submitted with spark-submit exactly
as integration/spark/README.md shows, unchanged but for --master and --bootstrap.

Skipped with the reason where pyspark, Java, the connector jars or ZooKeeper are absent.

The guarantees, in one seeded streaming run with three faults (combined: one Spark cluster, one job):
  * the Parquet output of the windowed counts is exactly once across a SIGKILLed input partition leader
    (acks=all producer, RF 3, min ISR 2), a SIGKILLed executor and a SIGKILLed driver restarted from its
    checkpoint: the replay job's recount of the input equals what was produced, and every window the
    watermark closed is in Parquet once, with the recount's number;
  * the kafka sink is at-least-once (Spark's documented guarantee): every closed window reaches the counts
    topic with the right number, possibly more than once; the test prints how many duplicates it saw;
  * failOnDataLoss stays true (Spark's default; the job does not set it) and the streaming job survives the
    leader failover; a watcher polls the input's high watermarks all along and fails the test if one drops.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

from spark_guard import require_connector

require_connector()

import pytest  # noqa: E402

from broker_process import wait_until  # noqa: E402
from city_pipeline.events import make_events, parse_time_ms  # noqa: E402
from city_pipeline.producer import produce_events  # noqa: E402
from kafka_helpers import read_topic  # noqa: E402
from pipeline_expect import MINUTE_MS, as_counter, closed_windows, counts_by_window, expected_counts  # noqa: E402
from spark_cluster import kill_tree  # noqa: E402

pytestmark = pytest.mark.timeout(600)  # one test: ~5.5 min here on 2 loaded cores, cluster start included

SPARK_PIPELINE_DIR = Path(__file__).resolve().parents[2] / "integration" / "spark"
PARTITIONS = 3
JOB_TIMEOUT_S = 240.0


def recent_minute_ms(minutes_ago: int) -> int:
    """A whole minute in the recent past: event times the brokers' retention (7 days) keeps."""
    now = int(time.time() * 1000)
    return now - now % MINUTE_MS - minutes_ago * MINUTE_MS


# -- the streaming job under faults ----------------------------------------------------------------------------

SEED = 2111
STREAM_TRIGGER = "2 seconds"
WATERMARK_MS = 2 * MINUTE_MS
PORTIONS = (400, 500, 500, 400)  # before the job starts; during the leader kill; the executor kill; the driver kill
RATE = 45.0  # events per second while a fault happens: each portion spans 9-11 s of the run
PROGRESS_TIMEOUT_S = 180.0
TASK_CATCH_S = 30.0
FAILOVER_TIMEOUT_S = 60.0
# How often one window may reach the counts topic: once, plus one rewrite per fault that can make Spark run a
# sink task again for output it already wrote (a task of the SIGKILLed executor retried elsewhere; the batch
# the SIGKILLed driver had written but not committed, rerun after the restart). A leader kill causes none:
# Spark's producer (kafka-clients 3.9: acks=all, idempotent) retries a write without duplicating it.
MAX_COPIES_PER_WINDOW = 3


def batch_ids(checkpoint: Path, log: str) -> list[int]:
    """The micro-batch ids in a query's offset log ("offsets": planned) or commit log ("commits": done)."""
    return sorted(int(p.name) for p in (checkpoint / log).glob("*") if p.name.isdigit())


def batch_offsets(checkpoint: Path, topic: str, batch: int) -> dict[int, int]:
    """The source offsets (partition -> next offset) the query's offset log holds for micro-batch `batch`."""
    for line in reversed((checkpoint / "offsets" / str(batch)).read_text().splitlines()):
        if line.startswith("{") and f'"{topic}"' in line:
            return {int(p): int(o) for p, o in json.loads(line)[topic].items()}
    return {}


def committed_offsets(checkpoint: Path, topic: str) -> dict[int, int]:
    """The source offsets of the query's last committed micro-batch (offsets/N whose commits/N exists);
    {} before the first commit."""
    commits = batch_ids(checkpoint, "commits")
    return batch_offsets(checkpoint, topic, max(commits)) if commits else {}


def offsets_going_back(checkpoint: Path, topic: str) -> list[str]:
    """Where the query's offset log, batch after batch, moved a partition's end offset backwards."""
    problems, previous = [], {}
    for batch in batch_ids(checkpoint, "offsets"):
        offsets = batch_offsets(checkpoint, topic, batch)
        problems += [f"batch {batch}: partition {p} {previous[p]} -> {o}" for p, o in offsets.items()
                     if o < previous.get(p, 0)]
        previous = offsets
    return problems


def covers(offsets: dict[int, int], target: dict[int, int]) -> bool:
    return all(offsets.get(p, 0) >= end for p, end in target.items())


def end_offsets(deliveries) -> dict[int, int]:
    ends: dict[int, int] = {}
    for d in deliveries:
        ends[d.partition] = max(ends.get(d.partition, 0), d.offset + 1)
    return ends


class HighWatermarkWatch(threading.Thread):
    """Polls the topic's end offsets (ListOffsets latest, kafka-python) for the whole run and records every
    time one went down: a consumer that read up to the high watermark must never see it drop below that,
    leader failover or not (that is what makes Spark's failOnDataLoss=true safe)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int):
        super().__init__(daemon=True, name="hwm-watch")
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.highest: dict[int, int] = {}
        self.drops: list[str] = []
        self.samples = 0
        self.errors = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, request_timeout_ms=10_000,
                                 enable_auto_commit=False)
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        try:
            while not self._stop_event.wait(0.25):
                try:
                    ends = consumer.end_offsets(tps)
                except Exception:  # noqa: BLE001  (a leader moving: the next poll asks again)
                    self.errors += 1
                    continue
                self.samples += 1
                for tp, end in ends.items():
                    if end < self.highest.get(tp.partition, 0):
                        self.drops.append(f"partition {tp.partition}: {self.highest[tp.partition]} -> {end}")
                    self.highest[tp.partition] = max(end, self.highest.get(tp.partition, 0))
        finally:
            consumer.close()

    def total(self) -> int:
        return sum(self.highest.values())

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)


class BackgroundProducer(threading.Thread):
    """produce_events (kafka-python: acks=all, idempotent) of one portion at RATE events/s."""

    def __init__(self, bootstrap: str, topic: str, events):
        super().__init__(daemon=True, name="producer")
        self.bootstrap, self.topic, self.events = bootstrap, topic, events
        self.deliveries = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.deliveries = produce_events(self.bootstrap, self.topic, self.events, rate=RATE)
        except BaseException as exc:  # noqa: BLE001  (re-raised by result())
            self.error = exc

    def result(self, timeout: float = 180.0):
        self.join(timeout)
        assert not self.is_alive(), "the producer did not finish"
        if self.error is not None:
            raise self.error
        return self.deliveries


def test_stream_job_on_the_cluster_is_exactly_once_across_leader_executor_and_driver_kills(
        spark, spark_standalone, pykbroker_cluster, unique_name, tmp_path):
    """One streaming run of stream_job.py on the Spark cluster, the input produced in four portions, three of
    them while a fault happens: the input partition 0's leader SIGKILLed (then restarted), one executor
    SIGKILLed (the master has a worker start another), the driver SIGKILLed and the job started again from
    its checkpoint (this time with trigger availableNow, to finish). Then the replay job recounts the input
    and the outputs are compared with it."""
    cluster, bootstrap = pykbroker_cluster, pykbroker_cluster.bootstrap
    topic, counts_topic = unique_name, f"{unique_name}-counts"
    cluster.create_topic(topic, PARTITIONS, 3, {"min.insync.replicas": "2"})
    cluster.create_topic(counts_topic, 1, 3, {"min.insync.replicas": "2"})
    events = make_events(sum(PORTIONS), start_ms=recent_minute_ms(120), step_ms=1_000, seed=SEED,
                         max_lateness_ms=15_000)
    cuts = [sum(PORTIONS[:i]) for i in range(len(PORTIONS) + 1)]
    portions = [events[a:b] for a, b in zip(cuts, cuts[1:])]
    parquet, checkpoint = tmp_path / "counts", tmp_path / "checkpoint"
    stream_args = ["--bootstrap", bootstrap, "--topic", topic, "--counts-topic", counts_topic,
                   "--parquet", str(parquet), "--checkpoint", str(checkpoint), "--window", "1 minute",
                   "--watermark", "2 minutes"]
    watch = HighWatermarkWatch(bootstrap, topic, PARTITIONS)
    watch.start()
    deliveries = []
    try:
        deliveries += produce_events(bootstrap, topic, portions[0])
        driver = spark_standalone.launch(SPARK_PIPELINE_DIR / "stream_job.py", *stream_args,
                                         "--trigger", STREAM_TRIGGER, log=tmp_path / "stream-1.log")
        executors = spark_standalone.wait_executors(2, driver=driver)

        def wait_processed(target: dict[int, int], what: str) -> None:
            def done() -> bool:
                assert driver.poll() is None, f"the streaming job exited with {driver.returncode} ({what})"
                return all(covers(committed_offsets(checkpoint / q, topic), target) for q in ("kafka", "parquet"))
            wait_until(done, f"both queries to commit {target} ({what})", PROGRESS_TIMEOUT_S)

        def wait_producing(producer: BackgroundProducer, records: int = 120) -> None:
            """Until the running producer has `records` of its portion acknowledged (a fault then hits it
            mid-portion)."""
            target = sum(end_offsets(deliveries).values()) + records
            wait_until(lambda: producer.error is None and watch.total() >= target,
                       f"the producer to write {records} records", PROGRESS_TIMEOUT_S)

        started = time.monotonic()

        def phase(text: str) -> None:
            print(f"[{time.monotonic() - started:6.1f} s] {text}")

        wait_processed(end_offsets(deliveries), "portion 1")
        phase(f"portion 1 ({len(deliveries)} events) processed; executors {executors}")

        # (1) the leader of input partition 0 SIGKILLed while the producer (acks=all) writes and Spark reads
        producer = BackgroundProducer(bootstrap, topic, portions[1])
        wait_producing(producer)
        victim = cluster.partition(topic, 0).leader
        cluster.kill(victim)
        new_leader = cluster.wait_for_leader(topic, 0, exclude={victim}, timeout=FAILOVER_TIMEOUT_S)
        cluster.start_broker(victim)
        deliveries += producer.result()
        wait_processed(end_offsets(deliveries), "after the leader kill")
        phase(f"leader of {topic}-0: broker {victim} SIGKILLed, broker {new_leader} took over; processed")

        # (2) an executor SIGKILLed while the producer writes and Spark reads; the worker starts another
        producer = BackgroundProducer(bootstrap, topic, portions[2])
        wait_producing(producer)
        # the executor is killed while it runs a task, when one is caught within TASK_CATCH_S
        killed_executor, running = executors[0], set()
        deadline = time.monotonic() + TASK_CATCH_S
        while not running and time.monotonic() < deadline:
            running = spark_standalone.running_tasks(killed_executor)
            time.sleep(0.01)
        os.kill(killed_executor, signal.SIGKILL)
        replacement = spark_standalone.wait_executors(1, exclude=executors, driver=driver)
        deliveries += producer.result()
        wait_processed(end_offsets(deliveries), "after the executor kill")
        lost_tasks = (tmp_path / "stream-1.log").read_text(errors="replace").count("Lost task")
        phase(f"executor {killed_executor} SIGKILLed running tasks {sorted(running)}, replaced by {replacement}; "
              f"the driver logged {lost_tasks} lost tasks (run again); processed")

        # (3) the driver SIGKILLed mid-stream; the job started again from its checkpoint
        producer = BackgroundProducer(bootstrap, topic, portions[3])
        wait_producing(producer)
        assert driver.poll() is None, "the streaming job ended before it was killed"
        kill_tree(driver)
        # A micro-batch in the offset log without a commit is run again by the restarted job: what its first
        # run had already written to the counts topic is written twice (the kafka sink's at-least-once).
        rerun = {q: sorted(set(batch_ids(checkpoint / q, "offsets")) - set(batch_ids(checkpoint / q, "commits")))
                 for q in ("kafka", "parquet")}
        deliveries += producer.result()
        phase(f"driver SIGKILLed; batches planned, not committed (run again on restart): {rerun}")
        spark_standalone.submit(SPARK_PIPELINE_DIR / "stream_job.py", *stream_args, "--trigger", "available-now",
                                log=tmp_path / "stream-2.log", timeout=JOB_TIMEOUT_S)
        for q in ("kafka", "parquet"):
            assert covers(committed_offsets(checkpoint / q, topic), end_offsets(deliveries)), q
        phase("restarted job finished (availableNow)")
    finally:
        watch.stop()
    assert len(deliveries) == len(events)

    # the input, recounted by the replay job on the cluster
    recount_dir = tmp_path / "recount"
    spark_standalone.submit(SPARK_PIPELINE_DIR / "replay_job.py", "--bootstrap", bootstrap, "--topic", topic,
                            "--output", str(recount_dir), log=tmp_path / "replay.log", timeout=JOB_TIMEOUT_S)
    recount = as_counter(counts_by_window(spark.read.parquet(str(recount_dir))))
    assert recount == expected_counts(events, MINUTE_MS), "the topic does not hold every acknowledged event once"
    apps = [app["name"] for app in spark_standalone.status()["completedapps"]]
    assert apps.count("city-counts-stream") >= 2 and "city-counts-replay" in apps, apps  # on the cluster

    # Parquet: every window the final watermark closed, exactly once, with the recount's number
    watermark = max(e.event_time_ms for e in events) - WATERMARK_MS
    closed = closed_windows(recount, watermark, MINUTE_MS)
    rows = counts_by_window(spark.read.parquet(str(parquet)))
    windows = Counter((city, start) for city, start, _end, _n in rows)
    assert not [w for w, n in windows.items() if n > 1], "a window written twice to Parquet"
    assert as_counter(rows) == closed, "Parquet counts differ from the recount"

    # the kafka sink: at-least-once; every copy carries the same (right) count
    published = read_topic(bootstrap, counts_topic, len(closed))
    copies = Counter()
    for record in published:
        value = json.loads(record.value)
        key = (value["city"], parse_time_ms(value["window_start"]))
        assert record.key == value["city"].encode()
        assert closed.get(key) == value["events"], f"{key}: {value['events']} in the counts topic"
        copies[key] += 1
    duplicates = sum(copies.values()) - len(copies)
    counted = sum(closed.values())
    print(f"fault run: {len(events)} events in, {counted} counted in {len(closed)} closed windows "
          f"({len(events) - counted} in windows still open), Parquet duplicates 0, kafka sink "
          f"{len(published)} records for {len(copies)} windows: {duplicates} duplicates "
          f"({sorted(k for k, n in copies.items() if n > 1)[:5]}); a duplicate is a window written by a sink "
          f"task that ran again: the uncommitted batch {rerun['kafka']} rerun after the driver kill, or a task "
          f"of the killed executor retried; most micro-batches close no window, so most reruns write nothing; "
          f"high watermark polled {watch.samples} times ({watch.errors} failed polls during failover)")
    assert set(copies) == set(closed), "a closed window missing from the counts topic"
    assert max(copies.values()) <= MAX_COPIES_PER_WINDOW, copies.most_common(3)
    assert watch.samples > 0 and not watch.drops, f"high watermark went down: {watch.drops}"
    for q in ("kafka", "parquet"):
        assert not offsets_going_back(checkpoint / q, topic), offsets_going_back(checkpoint / q, topic)

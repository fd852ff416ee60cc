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
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path

from spark_guard import require_connector

require_connector()

import pytest  # noqa: E402

from broker_process import ProtocolError, list_offset, wait_until  # noqa: E402
from city_pipeline.events import SCHEMA_HEADER, make_events, parse_time_ms  # noqa: E402
from city_pipeline.producer import SEND_TIMEOUT_S, Delivery, _Pacer, produce_events  # noqa: E402
from kafka_helpers import read_topic  # noqa: E402
from pipeline_expect import MINUTE_MS, as_counter, closed_windows, counts_by_window, expected_counts  # noqa: E402
from spark_cluster import kill_tree  # noqa: E402

TIMEOUT_S = 900  # one test: ~5.5 min on 2 busy cores, cluster start included; ~9 min at a load average of 19
TEARDOWN_S = 75  # stopping the Spark cluster (drivers, workers, master) and the 3 brokers
pytestmark = pytest.mark.timeout(TIMEOUT_S)

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
    """Polls the topic's high watermarks for the whole run: ListOffsets (latest) sent to each partition's
    current leader, as the cluster's Metadata names it, on a new connection per poll. Records every time one
    went down, and every sample below what Spark had already read (`floor()`: the offsets of the queries'
    committed micro-batches, read before the sample): a consumer that read up to the high watermark must
    never see it drop below that, leader failover or not (that is what makes failOnDataLoss=true safe).

    Not kafka-python's KafkaConsumer.end_offsets: after a leader is SIGKILLed, kafka-python 3.0.12's fetcher
    (kafka/consumer/fetcher.py, _send_list_offsets_request's NOT_LEADER_OR_FOLLOWER branch) sends
    ListOffsets again to the old leader without refreshing its metadata or backing off, until
    metadata.max.age.ms: thousands of requests, end_offsets timing out. pykbroker answers as Kafka 3.7.1
    does there (a follower or a broker that is no longer the leader answers a consumer's ListOffsets with
    NOT_LEADER_OR_FOLLOWER: ReplicaManager.fetchOffsetForTimestamp requires the leader unless replica_id is
    the debug id), so that is the client's bug, not the broker's."""

    def __init__(self, cluster, topic: str, partitions: int, floor):
        super().__init__(daemon=True, name="hwm-watch")
        self.cluster, self.topic, self.partitions, self.floor = cluster, topic, partitions, floor
        self.highest: dict[int, int] = {}
        self.drops: list[str] = []
        self.below_read: list[str] = []
        self.samples = [0] * partitions  # successful samples per partition
        self.errors: list[str] = []
        self._stop_event = threading.Event()

    def sample(self, partition: int, floor: dict[int, int]) -> None:
        try:
            leader = self.cluster.partition(self.topic, partition).leader
            end = list_offset(self.cluster.brokers[leader].address, self.topic, partition, -1)
        except (OSError, ProtocolError, AttributeError, KeyError) as exc:  # a leader moving: asked again
            self.errors.append(f"partition {partition}: {exc!r}"[:200])
            return
        self.samples[partition] += 1
        if end < self.highest.get(partition, 0):
            self.drops.append(f"partition {partition}: {self.highest[partition]} -> {end} (leader {leader})")
        if end < floor.get(partition, 0):
            self.below_read.append(f"partition {partition}: {end} at leader {leader}, Spark had read up to "
                                   f"{floor[partition]}")
        self.highest[partition] = max(end, self.highest.get(partition, 0))

    def run(self) -> None:
        while not self._stop_event.wait(0.2):
            floor = self.floor()
            for partition in range(self.partitions):
                self.sample(partition, floor)

    def wait_samples(self, what: str, timeout: float, count: int = 3) -> None:
        """Until every partition has `count` more successful samples than now."""
        target = [n + count for n in self.samples]
        wait_until(lambda: all(n >= t for n, t in zip(self.samples, target)),
                   f"{count} high watermark samples of every partition ({what}); errors: {self.errors[-3:]}",
                   timeout)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)


class BackgroundProducer(threading.Thread):
    """One portion at RATE events/s as produce_events sends it (kafka-python: acks=all, idempotent), counting
    the acknowledged sends as they come (`acked`), so a test can tell how far the portion got."""

    def __init__(self, bootstrap: str, topic: str, events):
        super().__init__(daemon=True, name="producer")
        self.bootstrap, self.topic, self.events = bootstrap, topic, events
        self.deliveries = None
        self.acked = 0
        self.error: BaseException | None = None
        self.start()

    def _ack(self, _metadata) -> None:
        self.acked += 1

    def run(self) -> None:
        from kafka import KafkaProducer

        try:
            producer = KafkaProducer(bootstrap_servers=self.bootstrap)
            try:
                pacer, pending = _Pacer(RATE), []
                for event in self.events:
                    pacer.wait()
                    future = producer.send(self.topic, key=event.key, value=event.value, headers=[SCHEMA_HEADER],
                                           timestamp_ms=event.event_time_ms)
                    pending.append((event, future.add_callback(self._ack)))
                producer.flush(timeout=SEND_TIMEOUT_S)
                self.deliveries = [Delivery(event, m.partition, m.offset)
                                   for event, m in ((e, f.get(timeout=SEND_TIMEOUT_S)) for e, f in pending)]
            finally:
                producer.close(timeout=10)
        except BaseException as exc:  # noqa: BLE001  (re-raised by result() and wait_acked())
            self.error = exc

    def wait_acked(self, records: int, timeout: float) -> None:
        """Until `records` of the portion are acknowledged; raises the producer's error at once."""
        def acked() -> bool:
            if self.error is not None:
                raise AssertionError(f"the producer failed: {self.error!r}") from self.error
            return self.acked >= records

        wait_until(acked, f"the producer to have {records} records acknowledged", timeout)

    def result(self, timeout: float):
        self.join(timeout)
        assert not self.is_alive(), "the producer did not finish"
        if self.error is not None:
            raise self.error
        return self.deliveries


@pytest.fixture(scope="session", autouse=True)
def deadline():
    """When the test's waits must be over: the pytest timeout (which counts fixture setup, so this autouse
    fixture starts the clock before the clusters do) less TEARDOWN_S for stopping the Spark and pykbroker
    clusters, which must never be interrupted."""
    end = time.monotonic() + TIMEOUT_S - TEARDOWN_S

    def remaining(at_most: float = float("inf")) -> float:
        """Seconds left for the test's waits (at most `at_most`); fails the test once none are left."""
        left = end - time.monotonic()
        assert left > 0, f"the test ran out of its {TIMEOUT_S - TEARDOWN_S} s"
        return min(left, at_most)

    return remaining


def create_topic_led_by(cluster, name: str, partitions: int, leader: int,
                        config: dict[str, str]) -> list[list[int]]:
    """A topic with RF 3 whose partitions' preferred (first) replicas rotate starting with broker `leader`
    (partition 0 led by `leader`), then wait until each partition has its leader and its full ISR."""
    from confluent_kafka.admin import AdminClient, NewTopic

    brokers = sorted(cluster.brokers)
    first = brokers.index(leader)
    rotation = brokers[first:] + brokers[:first]
    assignment = [rotation[p % 3:] + rotation[:p % 3] for p in range(partitions)]
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    future = admin.create_topics([NewTopic(name, num_partitions=partitions, replica_assignment=assignment, config=config)],
                                 operation_timeout=30, request_timeout=30)[name]
    future.result(30)
    for index, replicas in enumerate(assignment):
        cluster.wait_for_leader(name, index)
        cluster.wait_for_isr(name, index, replicas)
    return assignment


def in_flight(checkpoint: Path) -> dict[str, list[int]]:
    """Per query, the micro-batches planned (offsets/N) and not committed (no commits/N): running now."""
    return {q: sorted(set(batch_ids(checkpoint / q, "offsets")) - set(batch_ids(checkpoint / q, "commits")))
            for q in ("kafka", "parquet")}


def executor_id(pid: int) -> str:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    return args[args.index("--executor-id") + 1]


def test_stream_job_on_the_cluster_is_exactly_once_across_leader_executor_and_driver_kills(
        deadline, spark, spark_standalone, pykbroker_cluster, unique_name, tmp_path, record_property):
    """One streaming run of stream_job.py on the Spark cluster, the input produced in four portions, three of
    them while a fault happens, each fault while a micro-batch is in flight (in the offset log, not yet
    committed): the input partition 0's leader SIGKILLed (then restarted), one executor SIGKILLed while it
    runs a task (the master has a worker start another), the driver SIGKILLed and the job started again from
    its checkpoint (this time with trigger availableNow, to finish). Then the replay job recounts the input
    and the outputs are compared with it."""
    cluster, bootstrap = pykbroker_cluster, pykbroker_cluster.bootstrap
    topic, counts_topic = unique_name, f"{unique_name}-counts"
    # The victim leads input partition 0 and the counts topic's only partition: its SIGKILL moves both the
    # input's reads and the kafka sink's writes to another broker.
    victim = min(cluster.brokers)
    replicas = {t: create_topic_led_by(cluster, t, n, victim, {"min.insync.replicas": "2"})
                for t, n in ((topic, PARTITIONS), (counts_topic, 1))}
    events = make_events(sum(PORTIONS), start_ms=recent_minute_ms(120), step_ms=1_000, seed=SEED,
                         max_lateness_ms=15_000)
    cuts = [sum(PORTIONS[:i]) for i in range(len(PORTIONS) + 1)]
    portions = [events[a:b] for a, b in zip(cuts, cuts[1:])]
    parquet, checkpoint = tmp_path / "counts", tmp_path / "checkpoint"
    stream_log, restart_log = tmp_path / "stream-1.log", tmp_path / "stream-2.log"
    stream_args = ["--bootstrap", bootstrap, "--topic", topic, "--counts-topic", counts_topic,
                   "--parquet", str(parquet), "--checkpoint", str(checkpoint), "--window", "1 minute",
                   "--watermark", "2 minutes"]

    def spark_read() -> dict[int, int]:
        """What Spark has read for sure: per partition, the larger end offset of the queries' committed
        batches."""
        try:
            offsets = [committed_offsets(checkpoint / q, topic) for q in ("kafka", "parquet")]
        except (OSError, ValueError):
            return {}
        return {p: max(o.get(p, 0) for o in offsets) for p in range(PARTITIONS)}

    watch = HighWatermarkWatch(cluster, topic, PARTITIONS, spark_read)
    watch.start()
    deliveries = []
    phases: dict[str, tuple[int, int]] = {}  # fault -> (wall-clock ms it began, ms it ended): CreateTimes
    started = time.monotonic()
    print(f"\nclusters and topics ready after {TIMEOUT_S - TEARDOWN_S - deadline():.0f} s")

    def phase(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {text}")

    def state(what: str) -> None:
        """Where the partitions' leaders and ends are when a fault happens."""
        leaders = {}
        for t, assignment in replicas.items():
            for p in range(len(assignment)):
                info = cluster.partition(t, p)
                leaders[f"{'counts' if t == counts_topic else 'input'}-{p}"] = info and info.leader
        phase(f"{what}: victim broker {victim}, leaders {leaders}, high watermarks {dict(watch.highest)}, "
              f"Spark committed {spark_read()}, in flight {in_flight(checkpoint)}")

    def wait_in_flight(what: str, also=lambda: True) -> dict[str, list[int]]:
        """Until a micro-batch is in flight (and also() holds); the fault comes right after."""
        found = {}

        def running() -> bool:
            found.update(in_flight(checkpoint))
            return any(found.values()) and also()

        wait_until(running, f"a micro-batch in flight ({what})", deadline(PROGRESS_TIMEOUT_S))
        return found

    try:
        deliveries += produce_events(bootstrap, topic, portions[0])
        driver = spark_standalone.launch(SPARK_PIPELINE_DIR / "stream_job.py", *stream_args,
                                         "--trigger", STREAM_TRIGGER, log=stream_log)
        executors = spark_standalone.wait_executors(2, driver=driver, timeout=deadline(180))

        def wait_processed(target: dict[int, int], what: str) -> None:
            def done() -> bool:
                assert driver.poll() is None, f"the streaming job exited with {driver.returncode} ({what})"
                return all(covers(committed_offsets(checkpoint / q, topic), target) for q in ("kafka", "parquet"))
            wait_until(done, f"both queries to commit {target} ({what})", deadline(PROGRESS_TIMEOUT_S))

        wait_processed(end_offsets(deliveries), "portion 1")
        phase(f"portion 1 ({len(deliveries)} events) processed; executors {executors}")

        # (1) the leader of input partition 0 and of the counts topic SIGKILLed while the producer (acks=all)
        # writes and Spark reads
        producer = BackgroundProducer(bootstrap, topic, portions[1])
        producer.wait_acked(120, deadline(PROGRESS_TIMEOUT_S))
        assert cluster.partition(topic, 0).leader == victim and cluster.partition(counts_topic, 0).leader == victim
        wait_in_flight("leader kill")
        state("leader kill")
        began = int(time.time() * 1000)
        cluster.kill(victim)
        new_leader = cluster.wait_for_leader(topic, 0, exclude={victim}, timeout=deadline(FAILOVER_TIMEOUT_S))
        cluster.wait_for_leader(counts_topic, 0, exclude={victim}, timeout=deadline(FAILOVER_TIMEOUT_S))
        watch.wait_samples("the new leaders elected", deadline(FAILOVER_TIMEOUT_S))
        cluster.start_broker(victim)
        for t, assignment in replicas.items():
            for p, partition_replicas in enumerate(assignment):
                cluster.wait_for_isr(t, p, partition_replicas, timeout=deadline(FAILOVER_TIMEOUT_S))
        watch.wait_samples("the victim back in every ISR", deadline(FAILOVER_TIMEOUT_S))
        deliveries += producer.result(deadline(PROGRESS_TIMEOUT_S))
        wait_processed(end_offsets(deliveries), "after the leader kill")
        phases["leader kill"] = (began, int(time.time() * 1000))
        phase(f"leader of {topic}-0 and {counts_topic}-0: broker {victim} SIGKILLed, broker {new_leader} took "
              f"over {topic}-0; broker {victim} back in every ISR; processed")

        # (2) an executor SIGKILLed while it runs a task of an in-flight micro-batch; the worker starts another
        producer = BackgroundProducer(bootstrap, topic, portions[2])
        producer.wait_acked(120, deadline(PROGRESS_TIMEOUT_S))
        busy: dict[int, set[int]] = {}

        def an_executor_runs_a_task() -> bool:
            busy.clear()
            busy.update({pid: tasks for pid in executors if (tasks := spark_standalone.running_tasks(pid))})
            return bool(busy)

        wait_in_flight("executor kill", an_executor_runs_a_task)
        killed_executor = min(busy)
        killed_id = executor_id(killed_executor)
        state(f"executor kill (executor {killed_id}, pid {killed_executor}, tasks {sorted(busy[killed_executor])})")
        log_before = stream_log.stat().st_size
        began = int(time.time() * 1000)
        os.kill(killed_executor, signal.SIGKILL)
        # The driver always logs the executor lost; the task it ran is reported lost (and run again) unless
        # it finished in the moment between the executor's log line read above and the SIGKILL.
        lost = re.compile(rf"Lost task [^\n]*executor {killed_id}\): ExecutorLostFailure")
        wait_until(lambda: f"Lost executor {killed_id} " in stream_log.read_text(errors="replace")[log_before:],
                   f"the driver to log executor {killed_id} lost", deadline(PROGRESS_TIMEOUT_S))
        replacement = spark_standalone.wait_executors(1, exclude=executors, driver=driver,
                                                      timeout=deadline(PROGRESS_TIMEOUT_S))
        deliveries += producer.result(deadline(PROGRESS_TIMEOUT_S))
        wait_processed(end_offsets(deliveries), "after the executor kill")
        phases["executor kill"] = (began, int(time.time() * 1000))
        lost_lines = lost.findall(stream_log.read_text(errors="replace")[log_before:])
        phase(f"executor {killed_id} SIGKILLed running tasks {sorted(busy[killed_executor])}, replaced by "
              f"{replacement}; the driver logged {len(lost_lines)} tasks lost with it (run again); processed")

        # (3) the driver SIGKILLed while a micro-batch is in flight; the job started again from its checkpoint
        producer = BackgroundProducer(bootstrap, topic, portions[3])
        producer.wait_acked(120, deadline(PROGRESS_TIMEOUT_S))
        wait_in_flight("driver kill")
        assert driver.poll() is None, "the streaming job ended before it was killed"
        began = int(time.time() * 1000)
        kill_tree(driver)
        # A micro-batch in the offset log without a commit is run again by the restarted job: what its first
        # run had already written to the counts topic is written twice (the kafka sink's at-least-once).
        rerun = in_flight(checkpoint)
        state("driver killed")
        assert any(rerun.values()), f"no micro-batch was in flight when the driver died: {rerun}"
        deliveries += producer.result(deadline(PROGRESS_TIMEOUT_S))
        spark_standalone.submit(SPARK_PIPELINE_DIR / "stream_job.py", *stream_args, "--trigger", "available-now",
                                log=restart_log, timeout=deadline(JOB_TIMEOUT_S))
        phases["driver kill"] = (began, int(time.time() * 1000))
        for q in ("kafka", "parquet"):
            assert covers(committed_offsets(checkpoint / q, topic), end_offsets(deliveries)), q
            assert set(rerun[q]) <= set(batch_ids(checkpoint / q, "commits")), (q, rerun[q])
        phase(f"restarted job finished (availableNow), rerunning the batches in flight: {rerun}")
        watch.wait_samples("the end", deadline(FAILOVER_TIMEOUT_S))
    finally:
        watch.stop()
    assert len(deliveries) == len(events)

    # the input, recounted by the replay job on the cluster
    recount_dir = tmp_path / "recount"
    spark_standalone.submit(SPARK_PIPELINE_DIR / "replay_job.py", "--bootstrap", bootstrap, "--topic", topic,
                            "--output", str(recount_dir), log=tmp_path / "replay.log", timeout=deadline(JOB_TIMEOUT_S))
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

    # the kafka sink: at-least-once; every copy carries the same (right) count; a copy after the first is
    # put in the fault phase its CreateTime (the sink's send time) falls in
    published = read_topic(bootstrap, counts_topic, len(closed))
    copies: dict[tuple, list[int]] = {}
    for record in published:
        value = json.loads(record.value)
        key = (value["city"], parse_time_ms(value["window_start"]))
        assert record.key == value["city"].encode()
        assert closed.get(key) == value["events"], f"{key}: {value['events']} in the counts topic"
        copies.setdefault(key, []).append(record.timestamp)
    by_phase = Counter()
    for times in copies.values():
        for created in sorted(times)[1:]:
            by_phase[next((name for name, (a, b) in phases.items() if a <= created <= b), "no fault")] += 1
    duplicates = sum(by_phase.values())
    counted = sum(closed.values())
    report = (f"{len(events)} events in, {counted} counted in {len(closed)} closed windows "
              f"({len(events) - counted} in windows still open), Parquet duplicates 0; kafka sink "
              f"{len(published)} records for {len(copies)} windows: {duplicates} duplicates, by fault "
              f"{dict(by_phase)} (driver-kill rerun of batches {rerun['kafka']}, executor {killed_id}'s "
              f"{len(lost_lines)} lost tasks retried); high watermark samples {watch.samples} "
              f"({len(watch.errors)} failed polls)")
    print(f"fault run: {report}")
    record_property("spark fault run", report)
    driver_logs = stream_log.read_text(errors="replace") + restart_log.read_text(errors="replace")
    for warning in ("Found incorrect offsets", "Some data may have been missed"):
        assert warning not in driver_logs, f"Spark logged {warning!r}"
    assert set(copies) == set(closed), "a closed window missing from the counts topic"
    # the idempotent producer of Spark's sink (kafka-clients 3.9) retries through a leader failover without
    # duplicating; only a task run again (executor lost) or a batch rerun (driver restart) writes twice
    assert max(map(len, copies.values())) <= MAX_COPIES_PER_WINDOW, sorted(copies.items(), key=len)[-3:]
    assert by_phase["leader kill"] == 0 and by_phase["no fault"] == 0, by_phase
    assert not watch.drops, f"high watermark went down: {watch.drops}"
    assert not watch.below_read, f"high watermark below what Spark had read: {watch.below_read}"
    for q in ("kafka", "parquet"):
        assert not offsets_going_back(checkpoint / q, topic), offsets_going_back(checkpoint / q, topic)

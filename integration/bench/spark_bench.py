#!/usr/bin/env python3
"""Spark's Kafka connector against pykbroker and Apache Kafka 3.7.1: a batch write with the kafka sink, then a
batch read of the same records with spark.read.format("kafka"), on a single broker and on a 3-broker
ZooKeeper-mode cluster (replication factor 3, min.insync.replicas 2) of each, one after another in one run.

    python3 integration/bench/spark_bench.py                    # 2,000,000 records of 1 KiB, all four targets
    python3 integration/bench/spark_bench.py --records 200000   # a quick run
    python3 integration/bench/spark_bench.py --targets pykbroker,kafka --profile /tmp/spark-profile

Spark runs in this process's JVM as `local[2]` (driver and executor in one JVM, two task slots), on the same
cores as the brokers. First Spark alone is warmed up (--spark-warm-up rows written and read through a throwaway
pykbroker: its JIT, the connector's classes). Per target: fresh broker(s) (brokers.py, cluster_bench.py), a topic
of `--partitions` partitions, an unmeasured warm-up (a tenth of the records, at least 100,000, written and read
through another topic: Kafka's JIT, the broker's caches), then
  write: spark.range(N) -> a constant 1 KiB value, no key -> df.write.format("kafka").save(); afterwards the
         topic must hold exactly N records (ListOffsets);
  read:  spark.read.format("kafka").option("subscribe", topic).load() -> count(*), sum(length(value)); must be
         N and N * 1024.
Figures: end-to-end rows/s (wall clock of the Spark action), broker CPU per row (utime + stime, and that of
reaped children, from /proc of every broker process and its descendants, all brokers of a cluster summed),
ZooKeeper's CPU per row (the clusters' ZooKeeper, its own column: not in the broker's), Spark's CPU per row (its
JVM and this process), the cores each used (a phase where Spark used more than the broker is flagged
Spark-bound: its rows/s measures Spark more than the broker), the load average before and after each phase, and
pykbroker / Kafka ratios, broker CPU per row first; with --rounds N the medians of N rounds, every other round in
reverse order; and the sink's producer during each write as kafka-clients measured it (its JMX metrics in
Spark's JVM: produce requests, records per request, request latency, time records waited in its buffer), the
request pattern each broker was given. The run does not start while the 1-minute load average exceeds the core count, and it stops
after a phase during which processes other than the brokers, ZooKeeper and Spark used more than a quarter of a
core (from /proc/stat: the load average before a phase is the bench's own previous phase), unless
--allow-loaded (then the run warns and the JSON says which phases ran loaded). Nothing asserts a time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brokers import REPO_ROOT, BrokerFailed, BrokerProcess, KafkaBroker, default_refkit, kafka_unavailable_reason  # noqa: E402
from cleaner_compare import process_tree, tree_cpu_seconds  # noqa: E402
from cluster_bench import Cluster, create_replicated_topic  # noqa: E402
from pyspy_profile import PySpyRecorder, format_summary, summarize  # noqa: E402
from workloads import create_topic, stored_message_count  # noqa: E402

sys.path.insert(0, str(REPO_ROOT / "integration" / "spark"))
from city_pipeline.cli import JARS_ENV  # noqa: E402
from city_pipeline.session import ConnectorJarsError, build_session, find_connector_jars  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"  # git-ignored
TARGETS = ("pykbroker", "kafka", "pykbroker-cluster", "kafka-cluster")
VALUE_BYTES = 1024
# Spark's JVM keeps getting faster over its first few million rows: with only a per-target warm-up of 100,000
# rows, whichever target ran first was measured 0.4-0.7x slower than in a run with the other order (on the
# development machine, 300,000-row runs). So before any target Spark writes and reads SPARK_WARM_UP_ROWS (at
# least) through a throwaway pykbroker, and each target then gets its own warm-up for the broker's side.
SPARK_WARM_UP_ROWS = 1_000_000
WARM_UP_MIN_ROWS = 100_000
SATURATED_SHARE = 0.9  # of all cores: the machine, not one side, sets the pace
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the brokers ---------------------------------------------------------------------------------------------


@dataclass
class BenchCluster(Cluster):
    """cluster_bench's 3-broker cluster, every member with the same extra arguments (pykbroker) or
    server.properties lines (Kafka)."""

    extra_args: list[str] = field(default_factory=list)

    def _member(self, broker_id: int, port: int = 0) -> BrokerProcess:
        member = super()._member(broker_id, port)
        member.extra_args = list(self.extra_args)
        return member


@dataclass
class Target:
    """One target's broker processes, however many, started and stopped as one."""

    name: str
    refkit: Path
    broker_args: list[str]
    kafka_properties: list[str]
    single: BrokerProcess | None = None
    cluster: BenchCluster | None = None

    @property
    def kafka(self) -> bool:
        return self.name.startswith("kafka")

    @property
    def replicated(self) -> bool:
        return self.name.endswith("-cluster")

    def start(self) -> "Target":
        extra = self.kafka_properties if self.kafka else self.broker_args
        if not self.replicated:
            broker = KafkaBroker(refkit=self.refkit) if self.kafka else BrokerProcess()
            broker.extra_args = list(extra)
            self.single = broker.start()
            return self
        self.cluster = BenchCluster("kafka" if self.kafka else "pykbroker", self.refkit, extra_args=list(extra))
        try:
            self.cluster.start()
        except BaseException:
            self.cluster.stop()
            raise
        return self

    @property
    def processes(self) -> list[BrokerProcess]:
        return [self.single] if self.single else list(self.cluster.members.values())

    @property
    def bootstrap(self) -> str:
        return self.single.bootstrap if self.single else self.cluster.bootstrap

    def create_topic(self, topic: str, partitions: int) -> None:
        if self.replicated:
            create_replicated_topic(self.bootstrap, topic, partitions)
        else:
            create_topic(self.bootstrap, topic, partitions)

    def cpu_seconds(self) -> float:
        for process in self.processes:
            process.check_alive()
        return sum(tree_cpu_seconds(process_tree(p.pid)) for p in self.processes)

    def zookeeper_cpu_seconds(self) -> float:
        """CPU seconds of the cluster's ZooKeeper (0 for a single broker: pykbroker alone, Kafka in KRaft mode)."""
        pid = self.cluster.zookeeper.pid if self.cluster and self.cluster.zookeeper else None
        return tree_cpu_seconds(process_tree(pid)) if pid else 0.0

    def stop(self) -> None:
        if self.single:
            self.single.stop()
        if self.cluster:
            self.cluster.stop()


# -- Spark -----------------------------------------------------------------------------------------------------


def connector_jars(refkit: Path) -> list[Path]:
    jars_dir = os.environ.get(JARS_ENV) or str(refkit / "spark-jars")
    return find_connector_jars(jars_dir)


def spark_session(master: str, refkit: Path):
    jars_dir = os.environ.get(JARS_ENV) or str(refkit / "spark-jars")
    return build_session("pykbroker-spark-bench", master=master, jars_dir=jars_dir, conf=SPARK_CONF,
                         log_level="ERROR")


class SparkCpu:
    """CPU seconds of Spark's side: the JVM that py4j started (driver and, in local mode, the executors,
    with its GC and JIT threads) and its descendants, plus this Python process (the driver's Python side)."""

    def __init__(self, spark) -> None:
        self.jvm_pid = spark.sparkContext._gateway.proc.pid

    def seconds(self) -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        return tree_cpu_seconds(process_tree(self.jvm_pid)) + own.ru_utime + own.ru_stime


# The sink's producer as the broker sees it (its JMX metrics in Spark's JVM): cumulative counts, diffed over the
# write, and the producer's own windowed averages (its last 30-60 s: the write phase) read right after it.
PRODUCER_TOTALS = ("request-total", "record-send-total", "outgoing-byte-total", "record-retry-total",
                   "record-error-total", "bufferpool-wait-time-ns-total")
PRODUCER_AVERAGES = ("request-latency-avg", "request-latency-max", "records-per-request-avg", "batch-size-avg",
                     "record-queue-time-avg")


def producer_metrics(spark) -> dict[str, dict[str, float]]:
    """client id -> the kafka-clients producer metrics of every producer in Spark's JVM (the sink's producer is
    cached per executor and its settings: one per target). Through the platform MBean server, by reflection on
    its public interface (py4j cannot call the JDK's internal implementation class directly)."""
    gateway, jvm = spark.sparkContext._gateway, spark.sparkContext._jvm
    server = jvm.java.lang.management.ManagementFactory.getPlatformMBeanServer()
    interface = jvm.java.lang.Class.forName("javax.management.MBeanServer")

    def call(method: str, *typed_args: tuple[str, object]):
        types = gateway.new_array(jvm.java.lang.Class, len(typed_args))
        values = gateway.new_array(jvm.java.lang.Object, len(typed_args))
        for i, (type_name, value) in enumerate(typed_args):
            types[i], values[i] = jvm.java.lang.Class.forName(type_name), value
        return interface.getMethod(method, types).invoke(server, values)

    found = {}
    pattern = jvm.javax.management.ObjectName("kafka.producer:type=producer-metrics,client-id=*")
    for name in call("queryNames", ("javax.management.ObjectName", pattern), ("javax.management.QueryExp", None)):
        figures = {}
        for attribute in PRODUCER_TOTALS + PRODUCER_AVERAGES:
            try:
                figures[attribute] = float(call("getAttribute", ("javax.management.ObjectName", name),
                                                ("java.lang.String", attribute)))
            except Exception:  # noqa: BLE001 - an attribute this kafka-clients version does not have
                pass
        found[name.getKeyProperty("client-id")] = figures
    return found


def producer_figures(before: dict, after: dict) -> dict[str, float] | None:
    """The write's producer: the one whose record count moved (totals diffed, averages as read after)."""
    for client, figures in after.items():
        sent = figures.get("record-send-total", 0) - before.get(client, {}).get("record-send-total", 0)
        if sent > 0:
            result = {k: figures[k] - before.get(client, {}).get(k, 0) for k in PRODUCER_TOTALS if k in figures}
            result.update({k: figures[k] for k in PRODUCER_AVERAGES if k in figures})
            return {"client_id": client, **result}
    return None


def write_records(spark, bootstrap: str, topic: str, records: int) -> None:
    from pyspark.sql import functions as F

    value = F.lit(bytearray(b"v" * VALUE_BYTES)).cast("binary").alias("value")
    (spark.range(records, numPartitions=spark.sparkContext.defaultParallelism).select(value)
     .write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", topic).save())


def read_records(spark, bootstrap: str, topic: str) -> tuple[int, int]:
    from pyspark.sql import functions as F

    df = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
          .option("startingOffsets", "earliest").option("endingOffsets", "latest").load())
    row = df.agg(F.count(F.lit(1)).alias("rows"), F.sum(F.length("value")).alias("bytes")).collect()[0]
    return row.rows, row.bytes or 0


# -- one target ------------------------------------------------------------------------------------------------


class MachineLoaded(Exception):
    """The machine was busy with other work (before the run, or during a phase), and --allow-loaded was not given."""


@dataclass
class Phase:
    rows: int
    wall_s: float
    broker_cpu_s: float
    spark_cpu_s: float
    zookeeper_cpu_s: float
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    machine_busy_s: float
    profile: dict | None = None

    def figures(self, cores: int) -> dict[str, float]:
        figures = {
            "rows": self.rows,
            "wall_s": self.wall_s,
            "rows_per_s": self.rows / self.wall_s,
            "mb_per_s": self.rows * VALUE_BYTES / self.wall_s / (1 << 20),
            "broker_cpu_s": self.broker_cpu_s,
            "broker_cpu_us_per_row": self.broker_cpu_s / self.rows * 1e6,
            "zookeeper_cpu_s": self.zookeeper_cpu_s,
            "zookeeper_cpu_us_per_row": self.zookeeper_cpu_s / self.rows * 1e6,
            "spark_cpu_s": self.spark_cpu_s,
            "spark_cpu_us_per_row": self.spark_cpu_s / self.rows * 1e6,
            "broker_cores": self.broker_cpu_s / self.wall_s,
            "spark_cores": self.spark_cpu_s / self.wall_s,
            "machine_share": (self.broker_cpu_s + self.zookeeper_cpu_s + self.spark_cpu_s) / self.wall_s / cores,
            "load1_before": self.load_before[0], "load5_before": self.load_before[1],
            "load15_before": self.load_before[2], "load1_after": self.load_after[0],
            "other_cores": max(0.0, self.machine_busy_s - self.broker_cpu_s - self.zookeeper_cpu_s
                               - self.spark_cpu_s) / self.wall_s,
        }
        return with_flags(figures, cores)


def with_flags(figures: dict, cores: int) -> dict:
    """The phase's flags, from its figures (again after medians): Spark-bound (Spark used more cores than the
    broker: the end-to-end rows/s measures Spark's side more than the broker's) and loaded (processes other than
    the brokers, ZooKeeper and Spark used more than OTHER_CORES_LOADED cores during it: the bench's own previous
    phase keeps the 1-minute load average above the cores of a 2-core machine, so that figure cannot tell)."""
    return {**figures, "spark_bound": figures["spark_cores"] > figures["broker_cores"],
            "loaded": figures["other_cores"] > OTHER_CORES_LOADED}


def check_load(what: str, allow_loaded: bool) -> tuple[float, float, float]:
    """The load average before the run; MachineLoaded if its 1-minute figure exceeds the cores (a warning with
    --allow-loaded)."""
    load, cores = os.getloadavg(), os.cpu_count() or 1
    if load[0] > cores:
        message = (f"{what}: 1-minute load average {load[0]:.2f} exceeds the {cores} cores: the figures would be "
                   "the scheduler's as much as the brokers'")
        if not allow_loaded:
            raise MachineLoaded(f"{message}; wait for a quiet machine or pass --allow-loaded")
        log(f"WARNING {message} (--allow-loaded: measured anyway)")
    return load


OTHER_CORES_LOADED = 0.25


def machine_busy_seconds() -> float:
    """CPU seconds every process of the machine has used (the first line of /proc/stat, idle and iowait left out)."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def measured(target: Target, spark_cpu: SparkCpu, rows: int, action, profile_to: Path | None,
             what: str = "", allow_loaded: bool = False) -> Phase:
    # The load average before a phase is the bench's own previous phase as much as anyone else's: it is recorded,
    # and the phase is judged by the CPU other processes used during it (figures()["other_cores"]).
    load_before = os.getloadavg()
    recorders = []
    if profile_to is not None and not target.kafka:
        for process in target.processes:
            path = profile_to.with_name(f"{profile_to.name}-{process.port}.txt")
            recorders.append((path, PySpyRecorder(process.pid, path, rate=250)))
    for _, recorder in recorders:
        recorder.__enter__()
    try:
        broker_before, spark_before = target.cpu_seconds(), spark_cpu.seconds()
        zookeeper_before = target.zookeeper_cpu_seconds()
        busy_before = machine_busy_seconds()
        started = time.perf_counter()
        action()
        wall = time.perf_counter() - started
        machine_busy = machine_busy_seconds() - busy_before
        broker_cpu, spark_cpu_s = target.cpu_seconds() - broker_before, spark_cpu.seconds() - spark_before
        zookeeper_cpu = target.zookeeper_cpu_seconds() - zookeeper_before
    finally:
        for _, recorder in recorders:
            recorder.__exit__(None, None, None)
    profile = None
    if recorders:
        profile = {str(path): summarize(path) for path, _ in recorders}
        for path, summary in profile.items():
            log(f"py-spy profile of {path}:\n{format_summary(summary)}")
    phase = Phase(rows, wall, broker_cpu, spark_cpu_s, zookeeper_cpu, tuple(load_before), tuple(os.getloadavg()),
                  machine_busy, profile)
    other = phase.figures(os.cpu_count() or 1)["other_cores"]
    if other > OTHER_CORES_LOADED:
        message = (f"{what or target.name}: other processes used {other:.2f} cores during the phase: the figures "
                   "are the scheduler's as much as the brokers'")
        if not allow_loaded:
            raise MachineLoaded(f"{message}; wait for a quiet machine or pass --allow-loaded")
        log(f"WARNING {message} (--allow-loaded: kept)")
    return phase


def warm_up(spark, bootstrap: str, create_topic, rows: int, partitions: int) -> None:
    """Write and read `rows` through an unmeasured topic (JIT of Spark's and the broker's code, connector caches)."""
    topic = f"spark-bench-warm-up-{time.monotonic_ns()}"
    create_topic(topic, partitions)
    write_records(spark, bootstrap, topic, rows)
    read_records(spark, bootstrap, topic)


def warm_up_spark(spark, args: argparse.Namespace) -> None:
    rows = max(args.records, SPARK_WARM_UP_ROWS) if args.spark_warm_up is None else args.spark_warm_up
    if rows <= 0:
        return
    log(f"Spark warm-up: {rows:,} rows written and read through a throwaway pykbroker")
    with BrokerProcess(extra_args=["--fsync", "never"]) as broker:
        warm_up(spark, broker.bootstrap, lambda topic, n: create_topic(broker.bootstrap, topic, n), rows,
                args.partitions)


def run_target(name: str, spark, spark_cpu: SparkCpu, args: argparse.Namespace) -> dict[str, object]:
    target = Target(name, args.refkit, args.broker_arg, args.kafka_property)
    log(f"{name}: starting")
    target.start()
    try:
        bootstrap = target.bootstrap
        warm_rows = max(args.records // 10, WARM_UP_MIN_ROWS)
        target.create_topic("spark-bench", args.partitions)
        log(f"{name}: warm-up, {warm_rows:,} rows written and read")
        warm_up(spark, bootstrap, target.create_topic, warm_rows, args.partitions)

        profile = None if args.profile is None else args.profile / name
        if profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
        log(f"{name}: write {args.records:,} rows")
        producer_before = producer_metrics(spark)
        write = measured(target, spark_cpu, args.records,
                         lambda: write_records(spark, bootstrap, "spark-bench", args.records),
                         None if profile is None else profile.with_name(f"{name}-write"),
                         f"{name} write", args.allow_loaded)
        producer = producer_figures(producer_before, producer_metrics(spark))
        stored = stored_message_count(bootstrap, "spark-bench", args.partitions)
        if stored != args.records:
            raise BrokerFailed(f"{name}: the kafka sink wrote {args.records} rows but the topic holds {stored}")
        log(f"{name}: read {args.records:,} rows")
        read_back: list[tuple[int, int]] = []
        read = measured(target, spark_cpu, args.records,
                        lambda: read_back.append(read_records(spark, bootstrap, "spark-bench")),
                        None if profile is None else profile.with_name(f"{name}-read"),
                        f"{name} read", args.allow_loaded)
        if read_back[0] != (args.records, args.records * VALUE_BYTES):
            raise BrokerFailed(f"{name}: read {read_back[0]} (rows, value bytes), expected "
                               f"{(args.records, args.records * VALUE_BYTES)}")
        cores = os.cpu_count() or 1
        result = {"write": write.figures(cores), "read": read.figures(cores), "producer": producer}
        if write.profile or read.profile:
            result["profile"] = {"write": write.profile, "read": read.profile}
        return result
    finally:
        target.stop()


# -- the report ------------------------------------------------------------------------------------------------


def medians(rounds: list[dict[str, dict]], targets: list[str], cores: int) -> dict[str, dict]:
    """Per target and operation, the median of every figure over the rounds it completed (the flags recomputed
    from the medians)."""
    found: dict[str, dict] = {}
    for name in targets:
        done = [r[name] for r in rounds if name in r]
        if done:
            found[name] = {operation: with_flags({key: statistics.median(d[operation][key] for d in done)
                                                  for key in done[0][operation] if key not in ("spark_bound", "loaded")},
                                                 cores)
                           for operation in ("write", "read")}
    return found


def table(results: dict[str, dict]) -> str:
    lines = ["| target | operation | rows/s end to end | MB/s | broker CPU µs/row | ZooKeeper CPU µs/row | "
             "Spark CPU µs/row | broker cores | Spark cores | machine busy | Spark-bound | load 1 min before |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, result in results.items():
        for operation in ("write", "read"):
            f = result[operation]
            lines.append(f"| {name} | {operation} | {f['rows_per_s']:,.0f} | {f['mb_per_s']:.1f} | "
                         f"{f['broker_cpu_us_per_row']:.2f} | {f['zookeeper_cpu_us_per_row']:.2f} | "
                         f"{f['spark_cpu_us_per_row']:.2f} | {f['broker_cores']:.2f} | {f['spark_cores']:.2f} | "
                         f"{f['machine_share']:.0%} | {'yes' if f['spark_bound'] else 'no'} | "
                         f"{f['load1_before']:.2f}{' (loaded)' if f['loaded'] else ''} |")
    return "\n".join(lines)


def producer_table(rounds: list[dict[str, dict]]) -> str:
    """The sink's producer during each write, as kafka-clients measured it (the request pattern the broker saw)."""
    lines = ["| round | target | produce requests | records per request | request latency avg / max ms | "
             "record queue time avg ms | buffer-pool wait s |", "|---|---|---|---|---|---|---|"]
    for index, done in enumerate(rounds, start=1):
        for name, result in done.items():
            p = result.get("producer")
            if not p:
                continue
            lines.append(f"| {index} | {name} | {p.get('request-total', 0):,.0f} | "
                         f"{p.get('record-send-total', 0) / max(p.get('request-total', 0), 1):.1f} | "
                         f"{p.get('request-latency-avg', float('nan')):.2f} / {p.get('request-latency-max', float('nan')):.0f} | "
                         f"{p.get('record-queue-time-avg', float('nan')):.0f} | "
                         f"{p.get('bufferpool-wait-time-ns-total', 0) / 1e9:.2f} |")
    return "\n".join(lines)


def ratios(results: dict[str, dict]) -> tuple[str, dict[str, dict[str, float]]]:
    lines = ["| pykbroker / Kafka | operation | broker CPU per row (lower is better) | end-to-end rows/s (higher is "
             "better; Spark's side included) | Spark CPU per row |", "|---|---|---|---|---|"]
    found: dict[str, dict[str, float]] = {}
    for ours, theirs in (("pykbroker", "kafka"), ("pykbroker-cluster", "kafka-cluster")):
        if ours not in results or theirs not in results:
            continue
        for operation in ("write", "read"):
            a, b = results[ours][operation], results[theirs][operation]
            figures = {"broker_cpu_per_row": a["broker_cpu_us_per_row"] / b["broker_cpu_us_per_row"],
                       "end_to_end_rows_per_s": a["rows_per_s"] / b["rows_per_s"],
                       "spark_cpu_per_row": a["spark_cpu_us_per_row"] / b["spark_cpu_us_per_row"],
                       "spark_bound": a["spark_bound"] or b["spark_bound"], "loaded": a["loaded"] or b["loaded"]}
            found[f"{ours}/{theirs} {operation}"] = figures
            label = "single broker" if ours == "pykbroker" else "3 brokers, RF 3"
            flags = "".join(f" ({label})" for key, label in (("spark_bound", "Spark-bound"), ("loaded", "loaded"))
                            if figures[key])
            lines.append(f"| {label} | {operation} | {figures['broker_cpu_per_row']:.2f}x | "
                         f"{figures['end_to_end_rows_per_s']:.2f}x{flags} | {figures['spark_cpu_per_row']:.2f}x |")
    return "\n".join(lines), found


def warnings(results: dict[str, dict], rounds: list[dict[str, dict]], cores: int) -> list[str]:
    found = []
    for name, result in results.items():
        for operation in ("write", "read"):
            f = result[operation]
            if f["machine_share"] >= SATURATED_SHARE:
                found.append(f"{name} {operation}: broker + Spark used {f['machine_share']:.0%} of all cores: the "
                             "machine set the pace; compare the CPU per row")
            if f["spark_bound"]:
                found.append(f"{name} {operation}: Spark-bound: broker used {f['broker_cores']:.2f} cores, Spark "
                             f"{f['spark_cores']:.2f}: the end-to-end rows/s measures Spark more than the broker")
    for index, done in enumerate(rounds, start=1):
        for name, result in done.items():
            for operation in ("write", "read"):
                if result[operation]["loaded"]:
                    found.append(f"round {index}, {name} {operation}: 1-minute load average "
                                 f"{result[operation]['load1_before']:.2f} > {cores} cores before the phase: "
                                 "figures from a loaded machine")
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000, help="rows written and read (default %(default)s)")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"comma-separated, run in this order (default %(default)s)")
    parser.add_argument("--partitions", type=int, default=6,
                        help="partitions of the topic (default %(default)s: two per broker of a cluster, three "
                             "Spark tasks per slot when reading)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="times every target is measured, every other round in reverse order; medians "
                             "(default %(default)s)")
    parser.add_argument("--spark-warm-up", type=int, metavar="ROWS",
                        help=f"rows Spark writes and reads through a throwaway pykbroker before any target (default "
                             f"--records, at least {SPARK_WARM_UP_ROWS:,}; 0: none)")
    parser.add_argument("--master", default="local[2]", help="Spark master (default %(default)s)")
    parser.add_argument("--broker-arg", action="append", default=[], metavar="ARG",
                        help="extra argument for `pykbroker serve` (repeatable), e.g. --broker-arg=--fsync=never")
    parser.add_argument("--kafka-property", action="append", default=[], metavar="KEY=VALUE",
                        help="extra server.properties line for Kafka (repeatable)")
    parser.add_argument("--refkit", type=Path, default=default_refkit(),
                        help="the reference kit holding Kafka and the connector jars (default %(default)s)")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="py-spy the pykbroker brokers during the write and the read (perturbs the figures)")
    parser.add_argument("--allow-loaded", action="store_true",
                        help="measure even when the 1-minute load average exceeds the core count before a phase "
                             "(the run warns and the JSON marks the phase loaded); without it such a run stops")
    parser.add_argument("--json", type=Path, help=f"results file (default {RESULTS_DIR}/spark-bench-<time>.json)")
    args = parser.parse_args(argv)
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; choose from {', '.join(TARGETS)}")
    if args.profile is not None and not PySpyRecorder.available():
        parser.error("--profile needs py-spy (pip install py-spy)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started_at = dt.datetime.now(dt.timezone.utc)
    try:
        connector_jars(args.refkit)
    except ConnectorJarsError as exc:
        print(f"skipped: no usable Spark Kafka connector: {exc}")
        return 0
    skipped = {}
    targets = []
    for name in args.targets:
        reason = kafka_unavailable_reason(args.refkit) if name.startswith("kafka") else None
        if reason:
            skipped[name] = reason
            print(f"{name} skipped: {reason}")
        else:
            targets.append(name)
    try:  # fail before minutes of warm-up; every phase checks again
        load_before = check_load("before the run", args.allow_loaded)[0]
    except MachineLoaded as exc:
        print(f"ERROR {exc}")
        return 1
    cores = os.cpu_count() or 1
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = spark_session(args.master, args.refkit)
    rounds: list[dict[str, dict]] = []
    errors: list[str] = []
    try:
        spark_cpu = SparkCpu(spark)
        stopped = False
        warm_up_spark(spark, args)
        for index in range(args.rounds):
            # odd rounds in reverse order: what drifts during a run (page cache, other load) hits every target alike
            rounds.append({})
            for name in (targets if index % 2 == 0 else targets[::-1]):
                try:
                    rounds[-1][name] = run_target(name, spark, spark_cpu, args)
                except MachineLoaded as exc:  # the run stops: every later phase would be as loaded
                    errors.append(f"round {index + 1}, {name}: {exc}")
                    log(f"STOPPED: {exc}")
                    stopped = True
                    break
                except (BrokerFailed, Exception) as exc:  # one target failing does not lose the others' figures
                    errors.append(f"round {index + 1}, {name}: {exc}")
                    log(f"{name} FAILED: {exc}")
            if stopped:
                break
    finally:
        spark.stop()
    results = medians(rounds, targets, cores)
    print(f"\nSpark {spark.version} {args.master} (driver and executor in one JVM), {args.records:,} rows of "
          f"{VALUE_BYTES} B, topic of {args.partitions} partitions; {cores} cores, load average before "
          f"{load_before:.2f}, after {os.getloadavg()[0]:.2f}; " +
          (f"medians of {args.rounds} rounds" if args.rounds > 1 else "one round"))
    if results:
        print(table(results))
    if any(result.get("producer") for done in rounds for result in done.values()):
        print("\nThe kafka sink's producer during each write (kafka-clients' own metrics):")
        print(producer_table(rounds))
    ratio_table, ratio_figures = ratios(results)
    if ratio_figures:
        print()
        print(ratio_table)
    for warning in warnings(results, rounds, cores):
        print(f"WARNING {warning}")
    print("durability: pykbroker " + (" ".join(args.broker_arg) or "defaults (fsync=interval: each partition fsynced "
                                      "at least every second)") + "; Kafka " + (" ".join(args.kafka_property) or
                                                                                "defaults (no fsync)"))
    for error in errors:
        print(f"ERROR {error}")
    print("command: " + " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])))
    document = {"started_at": started_at.isoformat(), "command": sys.argv, "records": args.records,
                "partitions": args.partitions, "master": args.master, "cores": cores,
                "load_average_before": load_before, "allow_loaded": args.allow_loaded,
                "loaded_phases": [f"round {i}, {name} {op}" for i, done in enumerate(rounds, start=1)
                                  for name, result in done.items() for op in ("write", "read")
                                  if result[op]["loaded"]],
                "rounds": rounds, "results": results, "ratios": ratio_figures,
                "skipped": skipped, "errors": errors}
    json_path = args.json or RESULTS_DIR / f"spark-bench-{started_at:%Y%m%dT%H%M%SZ}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(document, indent=2))
    print(f"results: {json_path}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

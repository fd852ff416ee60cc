"""Apache Kafka 3.7.1's log cleaner and pykbroker's, side by side: the same data, the same client, one cleaning
each (``cleaner_bench.py --target both|kafka|pykbroker``).

For each target, one after the other, on a fresh broker (brokers.py: Kafka a single KRaft node from the
reference kit with its default 1 GiB heap, pykbroker a ``pykbroker serve`` process):
- both cleaners get the same settings: log.cleaner.threads=1, log.cleaner.dedupe.buffer.size=128 MiB
  (Kafka's default; Kafka allocates it on its heap at start-up, which its 1 GiB holds), log.cleaner.backoff.ms=100;
- unless --warm-up-mb 0, another compacted topic of --warm-up-mb MB (1 MiB segments) produced and cleaned first,
  unmeasured: a broker that has been running has its cleaner code JIT-compiled (Kafka) and its cleaner worker
  process started (pykbroker); a fresh broker pays both once, at its first cleaning;
- a topic of one partition (workloads.create_topic), then altered (IncrementalAlterConfigs) to
  cleanup.policy=compact, segment.bytes=--segment-mb MiB, min.compaction.lag.ms=1 hour: nothing is cleaned
  while producing;
- confluent-kafka produces --mb MB of keys + values (bench_records: random 100 B - 1 KiB values over --keys
  keys, seeded; with a codec each value a random half written twice, else librdkafka would send them uncompressed; acks=all, batches of 50 records, compression.type=--codec), checked with workloads.check_stored;
- the page cache is synced (nothing left to write back), the broker left to go quiet, then min.compaction.lag.ms
  is altered to 0, which starts exactly one cleaning of every segment but the active one. The window runs from
  that alter until the broker logs the cleaning's summary (Kafka: log-cleaner.log, LogCleaner.recordStats;
  pykbroker: its "log cleaner: cleaned" line); meanwhile the broker's processes (Kafka: the JVM; pykbroker: the
  broker and its cleaner worker processes, every descendant) are read from /proc every 20 ms: CPU seconds
  consumed over the window, peak resident set;
- afterwards: no second cleaning of the topic, and a consumer reading the whole compacted topic must find for
  every key exactly the latest value produced (the same key -> value map on both brokers).
"""

from __future__ import annotations

import compileall
import os
import random
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from brokers import CLOCK_TICKS_PER_SECOND, REPO_ROOT, BrokerFailed, BrokerProcess, KafkaBroker
from brokers import default_refkit, kafka_unavailable_reason
from report import KAFKA, PYKBROKER, config_differences

TOPIC = "cleaner-bench"
WARM_UP_TOPIC = "cleaner-bench-warm-up"
BATCH_RECORDS = 50  # as write_log's batches
HOLD_MS = 3_600_000  # min.compaction.lag.ms while producing
BACKOFF_MS = 100
DEDUPE_BUFFER_BYTES = 128 << 20  # Kafka's default log.cleaner.dedupe.buffer.size
SAMPLE_S = 0.02
CLEANING_TIMEOUT_S = 1800.0
CLIENT_TIMEOUT_S = 60.0
MIB = 1 << 20

CLEANER_SETTINGS = {
    "log.cleaner.threads": "1",
    "log.cleaner.dedupe.buffer.size": str(DEDUPE_BUFFER_BYTES),
    "log.cleaner.backoff.ms": str(BACKOFF_MS),
}

# LogCleaner.recordStats (Kafka 3.7.1, core/src/main/scala/kafka/log/LogCleaner.scala): one INFO message of
# several lines; MB there are 2**20 bytes, numbers use the JVM locale's grouping separator ("%,.1f").
_NUMBER = r"[\d,.]+|NaN|Infinity|\S+"
KAFKA_SUMMARY = re.compile(
    r"Log cleaner thread (?P<thread>\d+) cleaned log (?P<log>\S+) \(dirty section = \[(?P<first>\d+), (?P<end>\d+)\]\)\s+"
    rf"(?P<mib_read>[\d,.]+) MB of log processed in (?P<seconds>[\d,.]+) seconds \((?P<rate>{_NUMBER}) MB/sec\)\.\s+"
    rf"Indexed (?P<map_mib>[\d,.]+) MB in (?P<map_seconds>[\d,.]+) seconds [^\n]*\n\s*"
    r"Buffer utilization: (?P<buffer>[\d,.]+)%\s+"
    rf"Cleaned [\d,.]+ MB in (?P<copy_seconds>{_NUMBER}) seconds [^\n]*\n\s*"
    r"Start size: [\d,.]+ MB \((?P<records_read>[\d,]+) messages\)\s+"
    r"End size: (?P<mib_written>[\d,.]+) MB \((?P<records_kept>[\d,]+) messages\)"
)
# pykbroker's LogCleaner.clean (pykbroker/log/cleaner.py): MB there are 10**6 bytes.
PYKBROKER_SUMMARY = re.compile(
    r"log cleaner: cleaned (?P<log>\S+) up to offset (?P<end>\d+): (?P<mb_read>[\d.]+) MB read, "
    r"(?P<mb_written>[\d.]+) MB written, (?P<records_kept>\d+) of (?P<records_read>\d+) records kept, "
    r"(?P<keys>\d+) keys, (?P<seconds>[\d.]+) s \((?P<rate>[\d.]+) MB/s\)"
)


def bench_records(seed: int, keys: int, halves: bool = False) -> Iterator[tuple[bytes, bytes]]:
    """The benchmark's records, endless: random 100 B - 1 KiB values (a codec gains nothing on them, as with
    encrypted or dense data) over ``keys`` keys, from one seeded generator. With ``halves`` each value is a random
    half written twice, which a codec halves: librdkafka sends a batch that compression does not shrink
    uncompressed, so a codec is only exercised on such values."""
    rng = random.Random(seed)
    while True:
        key = b"key-%d" % rng.randrange(keys)
        size = rng.randint(100, 1024)
        if halves:
            half = rng.randbytes((size + 1) // 2)
            yield key, (half + half)[:size]
        else:
            yield key, rng.randbytes(size)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _number(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass
class Summary:
    """One cleaning as the broker logged it; MB = 10**6 bytes whatever the broker's unit."""

    log: str
    end_offset: int
    mb_read: float
    mb_written: float
    records_read: int
    records_kept: int
    seconds: float  # the broker's own time for the cleaning
    details: dict[str, float] = field(default_factory=dict)
    text: str = ""  # as logged


def kafka_summaries(text: str) -> list[Summary]:
    found = []
    for match in KAFKA_SUMMARY.finditer(text):
        mib_read = _number(match["mib_read"])
        seconds = _number(match["seconds"])  # printed to 0.1 s: taken from the rate where it is finite
        try:
            rate = _number(match["rate"])
            if rate > 0:
                seconds = mib_read / rate
        except ValueError:
            pass
        details = {"map_mb": _number(match["map_mib"]) * MIB / 1e6, "map_s": _number(match["map_seconds"]),
                   "buffer_utilization_pct": _number(match["buffer"])}
        mb_written = _number(match["mib_written"]) * MIB / 1e6
        found.append(Summary(match["log"], int(match["end"]), mib_read * MIB / 1e6, mb_written,
                             int(match["records_read"].replace(",", "")), int(match["records_kept"].replace(",", "")),
                             seconds, details, match[0]))
    return found


def pykbroker_summaries(text: str) -> list[Summary]:
    found = []
    for match in PYKBROKER_SUMMARY.finditer(text):
        mb_read, rate = float(match["mb_read"]), float(match["rate"])
        seconds = mb_read / rate if rate > 0 else float(match["seconds"])  # printed to 0.01 s: from the rate
        found.append(Summary(match["log"], int(match["end"]), mb_read, float(match["mb_written"]),
                             int(match["records_read"]), int(match["records_kept"]), seconds,
                             {"keys": int(match["keys"])}, match[0]))
    return found


def cleaner_log_text(target: str, broker: BrokerProcess) -> str:
    """What the broker logged about its cleanings so far (Kafka's log-cleaner.log rolls every hour: all of it)."""
    if target == PYKBROKER:
        paths = [broker.log_path]
    else:  # brokers.KafkaBroker: LOG_DIR is kafka-logs beside broker.log
        paths = sorted((broker.log_path.parent / "kafka-logs").glob("log-cleaner.log*"))
    texts = []
    for path in paths:
        try:
            texts.append(path.read_text(errors="replace"))
        except OSError:
            pass
    return "\n".join(texts)


def cleanings(target: str, broker: BrokerProcess, topic: str = TOPIC) -> list[Summary]:
    parse = pykbroker_summaries if target == PYKBROKER else kafka_summaries
    return [summary for summary in parse(cleaner_log_text(target, broker)) if summary.log == f"{topic}-0"]


# -- the broker's processes, from /proc ---------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()  # fields from the 3rd (state) on


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process descending from it (pykbroker's cleaner workers; Kafka's JVM has none)."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                parents[int(name)] = int(_stat_fields(int(name))[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, frontier = [pid], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        tree.extend(children)
        frontier = children
    return tree


def tree_cpu_seconds(pids: list[int]) -> float:
    """utime + stime + cutime + cstime of each process: its threads, and children it has reaped (a worker that
    ended meanwhile still counts)."""
    ticks = 0
    for pid in pids:
        try:
            fields = _stat_fields(pid)
        except OSError:
            continue  # ended: its time is in its parent's cutime once reaped
        ticks += sum(int(value) for value in fields[11:15])
    return ticks / CLOCK_TICKS_PER_SECOND


def tree_rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def wait_quiet(pid: int, timeout: float = 20.0) -> None:
    """Until the broker's processes use under 5 % of a core over half a second (at most ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = tree_cpu_seconds(process_tree(pid))
        time.sleep(0.5)
        if tree_cpu_seconds(process_tree(pid)) - before < 0.025:
            return


# -- the client side -----------------------------------------------------------------------------------------


def alter_topic(bootstrap: str, settings: dict[str, str], topic: str = TOPIC) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 5})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in settings.items()])
    admin.incremental_alter_configs([resource])[resource].result(CLIENT_TIMEOUT_S)


@dataclass
class Produced:
    records: int
    value_bytes: int
    seconds: float
    latest: dict[bytes, bytes]  # key -> the last value produced for it


def produce(bootstrap: str, megabytes: float, keys: int, seed: int, codec: str, topic: str = TOPIC) -> Produced:
    """``megabytes`` MB (10**6) of keys + values, in order, acks=all; batches of BATCH_RECORDS records (a long
    linger: a batch leaves full), so both brokers store the same batches."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1000,
                         "batch.num.messages": BATCH_RECORDS, "compression.type": codec})
    latest: dict[bytes, bytes] = {}
    count = size = value_bytes = 0
    records = bench_records(seed, keys, halves=codec != "none")
    started = time.monotonic()
    while size < megabytes * 1e6:
        key, value = next(records)
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.05)
        latest[key] = value
        count += 1
        size += len(key) + len(value)
        value_bytes += len(value)
    left = producer.flush(CLEANING_TIMEOUT_S)
    if left:
        raise RuntimeError(f"{left} messages not delivered")
    return Produced(count, value_bytes, time.monotonic() - started, latest)


def read_latest(bootstrap: str) -> tuple[dict[bytes, bytes], int]:
    """The compacted topic read from its start to its end: key -> last value, and the records read."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "cleaner-bench-check", "enable.auto.commit": False,
                         "enable.partition.eof": True, "log_level": 5})
    consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
    latest: dict[bytes, bytes] = {}
    count = 0
    deadline = time.monotonic() + CLEANING_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            for message in consumer.consume(10_000, 1.0):
                error = message.error()
                if error is None:
                    latest[message.key()] = message.value()
                    count += 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    return latest, count
                else:
                    raise RuntimeError(f"consuming {TOPIC}: {error}")
        raise RuntimeError(f"{TOPIC} not read to its end in {CLEANING_TIMEOUT_S:.0f} s")
    finally:
        consumer.close()


# -- one target ----------------------------------------------------------------------------------------------


@dataclass
class Result:
    target: str
    summary: Summary
    produced: Produced
    window_s: float
    cpu_s: float
    rss_before_mib: float
    peak_rss_mib: float
    processes: int  # the broker's processes seen during the window
    records_read_back: int
    mismatched_keys: int
    topic_config: dict[str, str]


def warm_up(target: str, broker: BrokerProcess, args) -> None:
    """One unmeasured cleaning of another topic first, as in a broker that has been running: Kafka's cleaner code
    JIT-compiled, pykbroker's cleaner worker process started (both are one-time costs of a fresh broker)."""
    from workloads import create_topic

    create_topic(broker.bootstrap, WARM_UP_TOPIC, 1)
    alter_topic(broker.bootstrap, {"cleanup.policy": "compact", "segment.bytes": str(1 << 20)}, WARM_UP_TOPIC)
    produce(broker.bootstrap, args.warm_up_mb, args.keys, args.seed + 1, args.codec, WARM_UP_TOPIC)
    deadline = time.monotonic() + CLEANING_TIMEOUT_S
    while not cleanings(target, broker, WARM_UP_TOPIC):
        broker.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{target} did not clean {WARM_UP_TOPIC} within {CLEANING_TIMEOUT_S:.0f} s")
        time.sleep(0.1)
    log(f"{target}: warmed up: {WARM_UP_TOPIC} ({args.warm_up_mb} MB) cleaned")


def measure(target: str, broker: BrokerProcess, args) -> Result:
    from workloads import check_stored, create_topic, topic_config

    bootstrap = broker.bootstrap
    if args.warm_up_mb:
        warm_up(target, broker, args)
    create_topic(bootstrap, TOPIC, 1)
    alter_topic(bootstrap, {"cleanup.policy": "compact", "segment.bytes": str(args.segment_mb << 20),
                            "min.compaction.lag.ms": str(HOLD_MS)})
    described = topic_config(bootstrap, TOPIC)
    log(f"{target}: producing {args.mb} MB over {args.keys} keys ({args.codec})")
    produced = produce(bootstrap, args.mb, args.keys, args.seed, args.codec)
    check_stored(bootstrap, TOPIC, 1, produced.records)
    log(f"{target}: produced {produced.records} records, {produced.value_bytes / 1e6:.0f} MB of values "
        f"in {produced.seconds:.1f} s")
    if cleanings(target, broker):
        raise RuntimeError(f"{target} cleaned {TOPIC} before min.compaction.lag.ms was lowered")
    os.sync()  # neither cleaning pays for writing back the other's (or the produced) dirty pages
    wait_quiet(broker.pid)

    pids = process_tree(broker.pid)
    rss_before = tree_rss_mib(pids)
    cpu_before = tree_cpu_seconds(pids)
    seen = set(pids)
    peak = rss_before
    started = time.monotonic()
    alter_topic(bootstrap, {"min.compaction.lag.ms": "0"})
    deadline = started + CLEANING_TIMEOUT_S
    last_tree = started
    while not cleanings(target, broker):
        broker.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{target} did not clean {TOPIC} within {CLEANING_TIMEOUT_S:.0f} s")
        if time.monotonic() - last_tree > 0.25:  # new worker processes
            pids = sorted(set(pids) | set(process_tree(broker.pid)))
            last_tree = time.monotonic()
        peak = max(peak, tree_rss_mib(pids))
        time.sleep(SAMPLE_S)
    window = time.monotonic() - started
    pids = sorted(set(pids) | set(process_tree(broker.pid)))
    cpu = tree_cpu_seconds(pids) - cpu_before
    peak = max(peak, tree_rss_mib(pids))
    seen.update(pids)

    time.sleep(3 * BACKOFF_MS / 1000 + 1)  # a second cleaning would start by now
    found = cleanings(target, broker)
    if len(found) != 1:
        raise RuntimeError(f"{target} cleaned {TOPIC} {len(found)} times, not once")
    latest, read_back = read_latest(bootstrap)
    mismatched = sum(1 for key in produced.latest.keys() | latest.keys() if produced.latest.get(key) != latest.get(key))
    return Result(target, found[0], produced, window, cpu, rss_before, peak, len(seen), read_back, mismatched, described)


# -- the run ---------------------------------------------------------------------------------------------------


def make_brokers(refkit: Path) -> dict[str, Callable[[], BrokerProcess]]:
    pykbroker_args = ["--log-level", "info"]  # its cleaning summary is an INFO line
    for name, value in CLEANER_SETTINGS.items():
        pykbroker_args += ["--override", f"{name}={value}"]
    return {
        PYKBROKER: lambda: BrokerProcess(extra_args=pykbroker_args),
        KAFKA: lambda: KafkaBroker(extra_args=[f"{name}={value}" for name, value in CLEANER_SETTINGS.items()],
                                   refkit=refkit),
    }


def _ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x" if theirs else "-"


def table(results: dict[str, Result]) -> str:
    rows = [
        ("MB read (the cleaned section)", lambda r: f"{r.summary.mb_read:.1f}", lambda r: r.summary.mb_read),
        ("MB written", lambda r: f"{r.summary.mb_written:.1f}", lambda r: r.summary.mb_written),
        ("records read -> kept", lambda r: f"{r.summary.records_read:,} -> {r.summary.records_kept:,}", None),
        ("cleaned up to offset", lambda r: f"{r.summary.end_offset:,}", None),
        ("cleaning time, the broker's own (s)", lambda r: f"{r.summary.seconds:.2f}", lambda r: r.summary.seconds),
        ("cleaning speed (MB/s, higher is better)", lambda r: f"{r.summary.mb_read / r.summary.seconds:.1f}",
         lambda r: r.summary.mb_read / r.summary.seconds),
        ("window: alter -> summary logged (s)", lambda r: f"{r.window_s:.2f}", lambda r: r.window_s),
        ("speed over the window (MB/s)", lambda r: f"{r.summary.mb_read / r.window_s:.1f}",
         lambda r: r.summary.mb_read / r.window_s),
        ("broker CPU in the window (s)", lambda r: f"{r.cpu_s:.2f}", lambda r: r.cpu_s),
        ("broker CPU per GB read (s)", lambda r: f"{r.cpu_s / r.summary.mb_read * 1000:.2f}",
         lambda r: r.cpu_s / r.summary.mb_read),
        ("RSS before the cleaning (MiB)", lambda r: f"{r.rss_before_mib:.0f}", lambda r: r.rss_before_mib),
        ("peak RSS in the window (MiB)", lambda r: f"{r.peak_rss_mib:.0f}", lambda r: r.peak_rss_mib),
        ("broker processes", lambda r: str(r.processes), None),
        ("keys whose latest value differs", lambda r: str(r.mismatched_keys), None),
    ]
    targets = [target for target in (PYKBROKER, KAFKA) if target in results]
    names = {PYKBROKER: "pykbroker", KAFKA: "Kafka 3.7.1"}
    both = len(targets) == 2
    header = ["figure", *(names[t] for t in targets)] + (["pykbroker / Kafka"] if both else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, show, value in rows:
        cells = [label, *(show(results[t]) for t in targets)]
        if both:
            cells.append(_ratio(value(results[PYKBROKER]), value(results[KAFKA])) if value else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _interrupt(signum, frame):  # SIGTERM as ctrl-C: the brokers' context managers stop them and delete their data
    raise KeyboardInterrupt


def run(args) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    refkit = Path(args.refkit) if args.refkit else default_refkit()
    targets = [PYKBROKER, KAFKA] if args.target == "both" else [args.target]
    if KAFKA in targets:
        reason = kafka_unavailable_reason(refkit)
        if reason is not None:
            if args.target == KAFKA:
                print(f"Apache Kafka unavailable: {reason}")
                return 1
            print(f"Apache Kafka skipped: {reason}")
            targets.remove(KAFKA)
    if PYKBROKER in targets:  # the worker processes import the broker's modules: as installed, with bytecode
        compileall.compile_dir(str(REPO_ROOT / "pykbroker"), quiet=1)
    make = make_brokers(refkit)
    results: dict[str, Result] = {}
    load = os.getloadavg()
    for target in targets:
        log(f"{target}: starting")
        try:
            with make[target]() as broker:
                results[target] = measure(target, broker, args)
        except KeyboardInterrupt:  # the broker is stopped and its data deleted by now
            print(f"interrupted while measuring {target}")
            return 130
        except (BrokerFailed, RuntimeError, OSError) as exc:
            print(f"{target} failed: {exc}")
            return 1
        except Exception as exc:  # noqa: BLE001 - a client error (KafkaException etc.): say which broker
            print(f"{target} failed: {type(exc).__name__}: {exc}")
            return 1
        result = results[target]
        log(f"{target}: cleaned {result.summary.mb_read:.1f} MB in {result.summary.seconds:.2f} s, "
            f"window {result.window_s:.2f} s, CPU {result.cpu_s:.2f} s")
    load_after = os.getloadavg()

    print()
    print(table(results))
    print()
    print(f"{args.mb} MB of keys + values over {args.keys} keys (100 B - 1 KiB random values, seed {args.seed}), "
          + (f"codec {args.codec} (each value a random half written twice: compressible), " if args.codec != "none"
             else "codec none, ")
          + f"segments of {args.segment_mb} MiB, batches of {BATCH_RECORDS} records, acks=all; "
          f"1 MB = 10**6 bytes (Kafka's MiB converted); "
          + (f"{args.warm_up_mb:g} MB of another topic cleaned first (warm-up)." if args.warm_up_mb
             else "no warm-up (cold cleaners)."))
    print("cleaners: " + ", ".join(f"{name}={value}" for name, value in CLEANER_SETTINGS.items())
          + "; Kafka's heap -Xmx1g -Xms1g (holds its 128 MiB offset map).")
    for target, result in results.items():
        produced = result.produced
        print(f"{target}: produced {produced.records:,} records in {produced.seconds:.1f} s; read back "
              f"{result.records_read_back:,} records, {len(produced.latest):,} keys; logged:\n  "
              + result.summary.text.strip().replace("\n", "\n  "))
    differences = config_differences({target: result.topic_config for target, result in results.items()})
    if differences:
        print("topic settings that differ (DescribeConfigs):\n  " + "\n  ".join(differences))
    print(f"load average (1, 5, 15 min) before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          f"after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    bad = [target for target, result in results.items() if result.mismatched_keys]
    if bad:
        print(f"FAILED: the compacted topic's latest values differ from those produced on {', '.join(bad)}")
        return 1
    if len(results) == 2 and results[PYKBROKER].produced.latest != results[KAFKA].produced.latest:
        print("FAILED: the two brokers were sent different data")
        return 1
    return 0

#!/usr/bin/env python3
"""pykbroker against Apache Kafka 3.7.1, side by side: the same confluent-kafka load generator, the same
settings, the same topics, rounds interleaved, medians and ratios.

    python integration/bench/run_bench.py [--target both|pykbroker|kafka] [--quick] [--rounds N]
                                          [--generators N] [--json out.json] [--profile stacks.txt]

Workloads, each on its own pre-created topic (3 partitions, replication factor 1):
  (a) produce 100-byte values, acks=1              -> msgs/s
  (b) produce 1 KiB values, acks=all               -> MB/s
  (c) consume (b)'s topic from offset 0, assign    -> MB/s
  (g) the same, consume(num_messages=10,000) instead of 1,000 -> MB/s
  (d) delivery latency at a steady 5,000 msgs/s    -> p50 / p99 / max ms
  (e) produce 100-byte values, idempotent producer -> msgs/s
  (t) produce 100-byte values, transactional producer committing every --txn-batch messages (default 1,000),
      as many as (e)                               -> msgs/s, transactions/s
plus broker CPU seconds per million messages (from /proc of the broker process: the JVM for Kafka),
load-generator CPU, broker peak RSS and start-to-ready time.

Each round runs every target once, in a fixed order (pykbroker, then Kafka), each on a new broker with
a new data dir, so that drift of the machine during the run hits both alike. Kafka comes from
../shared/refkit (KRaft, one node, Kafka's default 1 GiB heap); without the kit or java it is skipped
with the reason. The table prints medians per target, pykbroker / Kafka and the goals; the JSON under
results/ keeps every round. See README.md beside this file for what is measured exactly and why.
"""

from __future__ import annotations

import argparse
import compileall
import datetime
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable

import confluent_kafka

from brokers import (
    KAFKA_DIST,
    KAFKA_HEAP_OPTS,
    REPO_ROOT,
    BrokerFailed,
    BrokerProcess,
    KafkaBroker,
    default_refkit,
    kafka_unavailable_reason,
    measure_start_to_ready,
)
from pyspy_profile import PySpyRecorder, format_summary, summarize
from report import (
    A,
    B,
    C,
    D,
    E,
    G,
    KAFKA,
    PYKBROKER,
    config_differences,
    derived_figures,
    medians,
    T,
    WORKLOADS,
    ratios,
    saturation_warnings,
    table,
    verdicts,
)
from workloads import (
    check_committed,
    check_stored,
    consume_throughput,
    create_topic,
    delivery_latency,
    produce_throughput,
    topic_config,
    transactional_produce_throughput,
    warm_group_coordinator,
    warm_transaction_coordinator,
)

PARTITIONS = 3
RESULTS_DIR = Path(__file__).resolve().parent / "results"  # git-ignored
LATENCY_RATE = 5_000
TXN_BATCH = 1_000  # (t): messages per transaction
WORKLOAD_LETTERS = dict(zip("abcdget", (A, B, C, D, G, E, T)))
# consume(num_messages=N) of the consume workloads, both reading (b)'s topic
CONSUME_BATCH = {C: 1_000, G: 10_000}


@dataclass(frozen=True)
class Sizes:
    rounds: int
    produce_small_count: int  # (a); a tenth of it is sent first, unmeasured, to warm the broker up
    produce_large_count: int  # (b), read back by (c) and (g)
    latency_warmup_s: float  # (d), sent but not counted
    latency_measure_s: float
    extra_start_samples: int  # per round and target, besides the start of the round's own broker
    produce_txn_count: int  # (e) and (t) each


# Full: about 2-4 minutes per target when the targets are met (a: 1 M messages, b/c: 400 MiB,
# d: 55,000 messages), plus Kafka's start-ups (5-10 s each).
FULL = Sizes(rounds=3, produce_small_count=1_000_000, produce_large_count=400_000,
             latency_warmup_s=1.0, latency_measure_s=10.0, extra_start_samples=2, produce_txn_count=1_000_000)  # fmt: skip
QUICK = Sizes(rounds=1, produce_small_count=100_000, produce_large_count=40_000,
              latency_warmup_s=0.5, latency_measure_s=2.0, extra_start_samples=1, produce_txn_count=100_000)  # fmt: skip


def client_cpu_seconds() -> float:
    """CPU of this process, librdkafka's threads included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Round:
    """The workloads against one broker. Figures land in `figures`, failures in `errors`."""

    def __init__(
        self,
        broker: BrokerProcess,
        sizes: Sizes,
        partitions: int,
        generators: int = 1,
        workloads: frozenset[str] = frozenset(WORKLOADS),
        profile: tuple[str, Path] | None = None,
        txn_batch: int = TXN_BATCH,
    ):
        self.broker = broker
        self.sizes = sizes
        self.partitions = partitions
        self.generators = generators
        self.workloads = workloads
        self.profile = profile  # (workload name, collapsed-stacks path) to sample with py-spy
        self.txn_batch = txn_batch
        self.figures: dict[str, float] = {}
        self.topic_config: dict[str, str] = {}  # as the broker describes the benchmark topics
        self.errors: list[str] = []

    def run(self) -> None:
        bootstrap, partitions, sizes, generators = self.broker.bootstrap, self.partitions, self.sizes, self.generators
        topics = {A: "bench-a-100b", B: "bench-b-1k", D: "bench-d-latency", E: "bench-e-idempotent",
                  T: "bench-t-txn", "warm-up": "bench-warm-up"}
        try:
            for topic in topics.values():
                create_topic(bootstrap, topic, partitions)
            warm_group_coordinator(bootstrap, topics[D])
            self.topic_config = topic_config(bootstrap, topics[B])
            # Unmeasured: the first requests of a fresh broker pay one-time costs (the JVM's JIT
            # compiler, Python's lazy imports and caches) that a running broker does not; the warm-up
            # topic is read back too, so that (c) does not pay them for the fetch path.
            warm_up_count = sizes.produce_small_count // 10
            produce_throughput(bootstrap, topics["warm-up"], warm_up_count, 100, "1")
            if C in self.workloads or G in self.workloads:
                consume_throughput(bootstrap, topics["warm-up"], partitions, warm_up_count)
        except Exception as exc:  # nothing can run without topics
            self._record_failure("set-up", exc)
            return
        if T in self.workloads:
            try:  # unmeasured, like the group coordinator's: the transaction log is created on first use
                warm_transaction_coordinator(bootstrap)
            except Exception as exc:  # a broker without transactions: (t) fails, the others still run
                self._record_failure(T, exc)
                self.workloads = self.workloads - {T}
        if A in self.workloads:
            self._measure(
                A,
                lambda: produce_throughput(bootstrap, topics[A], sizes.produce_small_count, 100, "1", generators),
                lambda: check_stored(bootstrap, topics[A], partitions, sizes.produce_small_count),
            )
        b_filled = False  # (c) and (g) read what (b) wrote
        if B in self.workloads or C in self.workloads or G in self.workloads:
            b_filled = self._measure(
                B,
                lambda: produce_throughput(bootstrap, topics[B], sizes.produce_large_count, 1024, "all", generators),
                lambda: check_stored(bootstrap, topics[B], partitions, sizes.produce_large_count),
            )
        for consume in (C, G):
            if consume in self.workloads and b_filled:
                self._measure(consume, partial(consume_throughput, bootstrap, topics[B], partitions,
                                               sizes.produce_large_count, CONSUME_BATCH[consume]))
        if D in self.workloads:
            self._measure(
                D,
                lambda: delivery_latency(bootstrap, topics[D], LATENCY_RATE, sizes.latency_warmup_s, sizes.latency_measure_s),
            )
        if E in self.workloads:
            self._measure(
                E,
                lambda: produce_throughput(bootstrap, topics[E], sizes.produce_txn_count, 100, "all", generators,
                                           {"enable.idempotence": True}),
                lambda: check_stored(bootstrap, topics[E], partitions, sizes.produce_txn_count),
            )
        if T in self.workloads:
            self._measure(
                T,
                lambda: transactional_produce_throughput(bootstrap, topics[T], sizes.produce_txn_count, 100,
                                                         self.txn_batch),
                lambda: check_committed(bootstrap, topics[T], partitions, sizes.produce_txn_count),
            )
        try:
            self.broker.check_alive()
            self.figures["broker.peak_rss_mib"] = self.broker.peak_rss_mib()
            self.figures["broker.end_rss_mib"] = self.broker.rss_mib()
        except (BrokerFailed, OSError) as exc:
            self._record_failure("RSS", exc)

    def _measure(
        self, name: str, workload: Callable[[], dict[str, float]], check: Callable[[], None] | None = None
    ) -> bool:
        """Run one workload, take the broker's and the generator's CPU around it, then run its check
        (outside the CPU window: the check is not the workload)."""
        try:
            self.broker.check_alive()
            broker_cpu_before, client_cpu_before = self.broker.cpu(), client_cpu_seconds()
            if self.profile and self.profile[0] == name:
                with PySpyRecorder(self.broker.pid, self.profile[1]):
                    result = workload()
            else:
                result = workload()
            broker_cpu = self.broker.cpu().since(broker_cpu_before)
            # This process, plus the generator processes the workload spawned (they report their own).
            client_cpu = client_cpu_seconds() - client_cpu_before + result.pop("generator_processes_cpu_s", 0.0)
            if check is not None:
                check()
        except Exception as exc:
            self._record_failure(name, exc)
            return False
        self.figures.update({f"{name}.{key}": value for key, value in result.items()})
        self.figures.update({f"{name}.{key}": value for key, value in derived_figures(result, broker_cpu).items()})
        self.figures[f"{name}.broker_cpu_s"] = broker_cpu
        self.figures[f"{name}.client_cpu_s"] = client_cpu
        return True

    def _record_failure(self, what: str, exc: Exception) -> None:
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self.errors.append(f"{what}: {detail}")
        log(f"  FAILED {what}: {detail}\n  {self.broker.name} log tail:\n{self.broker.log_tail(15)}")


def describe_environment(kafka_home: Path | None) -> dict[str, object]:
    def run(*command: str) -> str:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return ""
        return (done.stdout + done.stderr).strip()

    def git(*args: str) -> str:
        return run("git", "-C", str(REPO_ROOT), *args)

    environment: dict[str, object] = {
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "confluent_kafka": confluent_kafka.version(),  # a string; libversion() is a (string, int) pair
        "librdkafka": confluent_kafka.libversion()[0],
        "broker_commit": git("rev-parse", "--short", "HEAD"),
        "broker_tree_dirty": bool(git("status", "--porcelain", "--", "pykbroker")),
    }
    if kafka_home is not None:
        environment["kafka"] = str(kafka_home)
        environment["java"] = run("java", "-version").splitlines()[0] if shutil.which("java") else ""
        environment["kafka_heap_opts"] = KAFKA_HEAP_OPTS
    return environment


def durability_note(targets: list[str], broker_args: list[str], kafka_properties: list[str]) -> str:
    """The fsync settings of the brokers in this run, which differ by default (the figures depend on it)."""
    ours = next((arg for arg in broker_args if arg.startswith("--fsync")), None)
    theirs = [p for p in kafka_properties if p.startswith(("log.flush.", "flush."))]
    ours_text = (
        f"pykbroker ran with {ours}"
        if ours
        else "pykbroker ran with its default fsync=interval (each partition fsynced at least every 1 s)"
    )
    theirs_text = (
        f"Kafka ran with {', '.join(theirs)}" if theirs else "Kafka ran with its default (no fsync: the page cache only)"
    )
    texts = {PYKBROKER: ours_text, KAFKA: theirs_text}
    return "durability: " + "; ".join(texts[target] for target in targets) + "."


def round_summary(figures: dict[str, float]) -> str:
    parts = []
    for key, text in [
        (f"{A}.msgs_per_s", "(a) {:,.0f} msgs/s"),
        (f"{B}.mb_per_s", "(b) {:.1f} MB/s"),
        (f"{C}.mb_per_s", "(c) {:.1f} MB/s"),
        (f"{G}.mb_per_s", "(g) {:.1f} MB/s"),
        (f"{D}.p99_ms", "(d) p99 {:.1f} ms"),
        (f"{E}.msgs_per_s", "(e) {:,.0f} msgs/s"),
        (f"{T}.msgs_per_s", "(t) {:,.0f} msgs/s"),
        ("broker.peak_rss_mib", "RSS {:.0f} MiB"),
    ]:
        if key in figures:
            parts.append(text.format(figures[key]))
    return ", ".join(parts)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", choices=("both", PYKBROKER, KAFKA), default="both",
                        help="which broker(s) to measure (default both, interleaved)")  # fmt: skip
    parser.add_argument("--rounds", type=int, help="rounds, each on fresh brokers (default 3, --quick 1; 0 with --profile: profile only)")
    parser.add_argument("--quick", action="store_true", help="a fast smoke run: a tenth of the messages, one round")
    parser.add_argument("--json", type=Path, help=f"where to write the results (default {RESULTS_DIR}/bench-<time>.json and latest.json)")
    parser.add_argument("--partitions", type=int, default=PARTITIONS, help="partitions per benchmark topic")
    parser.add_argument("--generators", type=int, default=1,
                        help="load-generator processes for the produce workloads (a) and (b) (default 1)")  # fmt: skip
    parser.add_argument("--broker-arg", action="append", default=[], metavar="ARG",
                        help="extra argument for `pykbroker serve` (repeatable), e.g. --broker-arg=--fsync=never")  # fmt: skip
    parser.add_argument("--kafka-property", action="append", default=[], metavar="KEY=VALUE",
                        help="extra server.properties line for Kafka (repeatable), e.g. --kafka-property=log.flush.interval.ms=1000")  # fmt: skip
    parser.add_argument("--refkit", type=Path, default=default_refkit(), help="the reference kit holding Kafka (default %(default)s)")
    parser.add_argument("--profile", type=Path, metavar="STACKS",
                        help="after the rounds, run one more (unmeasured) pykbroker round and sample it with "
                             "py-spy during --profile-workload; write collapsed stacks here and print the hot spots")  # fmt: skip
    parser.add_argument("--profile-workload", choices="abcdg", default="a")
    parser.add_argument("--workloads", default="abcdget",
                        help="which workloads to run, by letter (default abcdget; e.g. --workloads et for idempotent "
                             "vs transactional produce only, --workloads cg for the two consume batch sizes)")  # fmt: skip
    parser.add_argument("--txn-batch", type=int, default=TXN_BATCH,
                        help="(t): messages per transaction (default %(default)s)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.generators < 1:
        parser.error("--generators must be at least 1")
    if args.txn_batch < 1:
        parser.error("--txn-batch must be at least 1")
    unknown = set(args.workloads) - set(WORKLOAD_LETTERS)
    if unknown or not args.workloads:
        parser.error(f"--workloads takes letters of {''.join(WORKLOAD_LETTERS)}, not {args.workloads!r}")
    args.workloads = frozenset(WORKLOAD_LETTERS[letter] for letter in args.workloads)
    return args


def profile_pykbroker(args: argparse.Namespace, sizes: Sizes, errors: list[str]) -> dict[str, object] | None:
    """One unmeasured pykbroker round with py-spy sampling the broker during one workload."""
    if not PySpyRecorder.available():
        log("py-spy is not installed (pip install py-spy): no profile taken")
        return None
    workload = WORKLOAD_LETTERS[args.profile_workload]
    log(f"profile round: py-spy on pykbroker during {workload}")
    # Three times the messages, so that the sampled stretch is long enough to rank hot spots;
    # (c) and (g) need (b)'s topic filled first.
    profile_sizes = replace(
        sizes, produce_small_count=3 * sizes.produce_small_count, produce_large_count=3 * sizes.produce_large_count
    )
    needed = frozenset((workload, B)) if workload in (C, G) else frozenset((workload,))
    try:
        args.profile.unlink(missing_ok=True)
        with BrokerProcess(extra_args=list(args.broker_arg)) as broker:
            profile_round = Round(broker, profile_sizes, args.partitions, args.generators, needed, (workload, args.profile))
            profile_round.run()
    except BrokerFailed as exc:
        errors.append(f"profile round: {exc}")
        return None
    errors.extend(f"profile round: {error}" for error in profile_round.errors)
    if not args.profile.exists():
        return None
    return {
        **summarize(args.profile),
        "workload": workload,
        "stacks_file": str(args.profile),
        "figures": profile_round.figures,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    rounds = sizes.rounds if args.rounds is None else args.rounds
    started_at = datetime.datetime.now(datetime.timezone.utc)
    targets = [PYKBROKER, KAFKA] if args.target == "both" else [args.target]
    if PYKBROKER in targets:
        # Measure the broker as installed (with bytecode), even where PYTHONDONTWRITEBYTECODE is set.
        compileall.compile_dir(str(Path(__file__).resolve().parents[2] / "pykbroker"), quiet=1)
    skipped: dict[str, str] = {}
    if KAFKA in targets:
        reason = kafka_unavailable_reason(args.refkit)
        if reason is not None:
            log(f"Apache Kafka skipped: {reason}")
            skipped[KAFKA] = reason
            targets.remove(KAFKA)
    make_broker: dict[str, Callable[[], BrokerProcess]] = {
        PYKBROKER: lambda: BrokerProcess(extra_args=list(args.broker_arg)),
        KAFKA: lambda: KafkaBroker(extra_args=list(args.kafka_property), refkit=args.refkit),
    }
    round_figures: dict[str, list[dict[str, float]]] = {target: [] for target in targets}
    start_samples: dict[str, list[float]] = {target: [] for target in targets}
    topic_configs: dict[str, dict[str, str]] = {}
    errors: list[str] = []
    warnings: list[str] = []
    environment = describe_environment(args.refkit / KAFKA_DIST if KAFKA in targets else None)
    clock = time.perf_counter()

    for number in range(1, rounds + 1):
        for target in targets:  # interleaved: pykbroker, Kafka, pykbroker, Kafka, ...
            log(f"round {number}/{rounds}: {target}")
            try:
                for _ in range(sizes.extra_start_samples):
                    start_samples[target].append(measure_start_to_ready(make_broker[target]))
                with make_broker[target]() as broker:
                    start_samples[target].append(broker.start_to_ready_s)
                    this_round = Round(broker, sizes, args.partitions, args.generators, args.workloads,
                                       txn_batch=args.txn_batch)
                    this_round.run()
            except BrokerFailed as exc:
                errors.append(f"round {number} {target}: {exc}")
                log(f"  {target} failed: {exc}")
                continue
            round_figures[target].append(this_round.figures)
            topic_configs[target] = this_round.topic_config
            errors.extend(f"round {number} {target}: {error}" for error in this_round.errors)
            round_warnings = saturation_warnings(target, this_round.figures, os.cpu_count() or 1)
            warnings.extend(f"round {number} {warning}" for warning in round_warnings)
            log(f"  {round_summary(this_round.figures)}")
            for warning in round_warnings:
                log(f"  WARNING {warning}")

    profile_report = profile_pykbroker(args, sizes, errors) if args.profile else None

    median_figures = {target: medians(round_figures[target], start_samples[target]) for target in targets}
    note = durability_note(targets, args.broker_arg, args.kafka_property)
    differences = config_differences(topic_configs)
    command = " ".join(["python3", "integration/bench/run_bench.py", *(argv if argv is not None else sys.argv[1:])])
    results = {
        "command": command,
        "started_at": started_at.isoformat(timespec="seconds"),
        "duration_s": round(time.perf_counter() - clock, 1),
        "environment": environment,
        "settings": {**asdict(sizes), "rounds": rounds, "partitions": args.partitions, "generators": args.generators,
                     "latency_rate": LATENCY_RATE, "broker_args": args.broker_arg,
                     "workloads": sorted(args.workloads), "txn_batch": args.txn_batch,
                     "kafka_properties": args.kafka_property},  # fmt: skip
        "targets": targets,
        "skipped": skipped,
        "durability": note,
        "topic_configs": topic_configs,
        "topic_config_differences": differences,
        "medians": median_figures,
        "ratios_pykbroker_over_kafka": ratios(median_figures),
        "goals": verdicts(median_figures),
        "rounds": round_figures,
        "start_to_ready_samples_s": start_samples,
        "warnings": warnings,
        "errors": errors,
        "profile": profile_report,
    }
    json_paths = [args.json] if args.json else [RESULTS_DIR / f"bench-{started_at:%Y%m%dT%H%M%SZ}.json", RESULTS_DIR / "latest.json"]
    for path in json_paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2) + "\n")

    print()
    print(table(median_figures))
    print(f"\n{rounds} round(s), medians; ratio = pykbroker / Kafka; 1 MB = 2**20 bytes of values.")
    print(note)
    if differences:
        print("topic settings that differ (DescribeConfigs of the benchmark topics):\n  " + "\n  ".join(differences))
    print(f"command: {command}\nJSON: {json_paths[0]}")
    for target, reason in skipped.items():
        print(f"{target} skipped: {reason}")
    if warnings:
        print("\nwarnings:\n  " + "\n  ".join(warnings))
    if profile_report:
        print(f"\nprofile of {profile_report['workload']} (collapsed stacks in {args.profile}):")
        print(format_summary(profile_report))
    if errors:
        print("\nerrors:\n  " + "\n  ".join(error.splitlines()[0] for error in errors))
    return 1 if errors or (rounds and not all(round_figures.values())) else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""pykbroker benchmark: start the broker on a fresh data dir and drive it with confluent-kafka.

    python integration/bench/run_bench.py [--rounds N] [--quick] [--json out.json] [--profile stacks.txt]

Workloads, each on its own pre-created topic (3 partitions, replication factor 1):
  (a) produce 100-byte values, acks=1              -> msgs/s
  (b) produce 1 KiB values, acks=all               -> MB/s
  (c) consume (b)'s topic from offset 0, assign    -> MB/s
  (d) delivery latency at a steady 5,000 msgs/s    -> p50 / p99 / max ms
plus broker CPU seconds per workload, broker peak RSS and start-to-ready time. Every round runs on a
new broker with a new data dir; the table shows medians over the rounds next to the targets.
See README.md beside this file for what is measured exactly and why.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import confluent_kafka

from broker_process import REPO_ROOT, BrokerFailed, BrokerProcess, measure_start_to_ready
from pyspy_profile import PySpyRecorder, format_summary, summarize
from report import A, B, C, D, medians, table, verdicts
from workloads import (
    check_stored,
    consume_throughput,
    create_topic,
    delivery_latency,
    produce_throughput,
    warm_group_coordinator,
)

PARTITIONS = 3
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "latest.json"  # results/ is git-ignored
LATENCY_RATE = 5_000


@dataclass(frozen=True)
class Sizes:
    rounds: int
    produce_small_count: int  # (a)
    produce_large_count: int  # (b), read back by (c)
    latency_warmup_s: float  # (d), sent but not counted
    latency_measure_s: float
    extra_start_samples: int  # per round, besides the start of the round's own broker


# Full: about 2-4 minutes when the targets are met (a: 1 M messages, b/c: 400 MiB, d: 55,000 messages).
FULL = Sizes(rounds=3, produce_small_count=1_000_000, produce_large_count=400_000,
             latency_warmup_s=1.0, latency_measure_s=10.0, extra_start_samples=2)  # fmt: skip
QUICK = Sizes(rounds=1, produce_small_count=100_000, produce_large_count=40_000,
              latency_warmup_s=0.5, latency_measure_s=2.0, extra_start_samples=1)  # fmt: skip


def client_cpu_seconds() -> float:
    """CPU of this process, librdkafka's threads included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Round:
    """The four workloads against one broker. Figures land in `figures`, failures in `errors`."""

    def __init__(
        self,
        broker: BrokerProcess,
        sizes: Sizes,
        partitions: int,
        workloads: frozenset[str] = frozenset((A, B, C, D)),
        profile: tuple[str, Path] | None = None,
    ):
        self.broker = broker
        self.sizes = sizes
        self.partitions = partitions
        self.workloads = workloads
        self.profile = profile  # (workload name, collapsed-stacks path) to sample with py-spy
        self.figures: dict[str, float] = {}
        self.errors: list[str] = []

    def run(self) -> None:
        bootstrap, partitions, sizes = self.broker.bootstrap, self.partitions, self.sizes
        topics = {A: "bench-a-100b", B: "bench-b-1k", D: "bench-d-latency"}
        try:
            for topic in topics.values():
                create_topic(bootstrap, topic, partitions)
            warm_group_coordinator(bootstrap, topics[D])
        except Exception as exc:  # nothing can run without topics
            self._record_failure("set-up", exc)
            return
        if A in self.workloads:
            self._measure(
                A,
                lambda: produce_throughput(bootstrap, topics[A], sizes.produce_small_count, 100, "1"),
                lambda: check_stored(bootstrap, topics[A], partitions, sizes.produce_small_count),
            )
        b_filled = False  # (c) reads what (b) wrote
        if B in self.workloads or C in self.workloads:
            b_filled = self._measure(
                B,
                lambda: produce_throughput(bootstrap, topics[B], sizes.produce_large_count, 1024, "all"),
                lambda: check_stored(bootstrap, topics[B], partitions, sizes.produce_large_count),
            )
        if C in self.workloads and b_filled:
            self._measure(C, lambda: consume_throughput(bootstrap, topics[B], partitions, sizes.produce_large_count))
        if D in self.workloads:
            self._measure(
                D,
                lambda: delivery_latency(bootstrap, topics[D], LATENCY_RATE, sizes.latency_warmup_s, sizes.latency_measure_s),
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
        """Run one workload, take the broker's and this process's CPU around it, then run its check
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
            client_cpu = client_cpu_seconds() - client_cpu_before
            if check is not None:
                check()
        except Exception as exc:
            self._record_failure(name, exc)
            return False
        self.figures.update({f"{name}.{key}": value for key, value in result.items()})
        self.figures[f"{name}.broker_cpu_s"] = broker_cpu
        self.figures[f"{name}.client_cpu_s"] = client_cpu
        return True

    def _record_failure(self, what: str, exc: Exception) -> None:
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self.errors.append(f"{what}: {detail}")
        log(f"  FAILED {what}: {detail}\n  broker log tail:\n{self.broker.log_tail(15)}")


def describe_environment() -> dict[str, object]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True)
        return done.stdout.strip()

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "confluent_kafka": confluent_kafka.version(),  # a string; libversion() is a (string, int) pair
        "librdkafka": confluent_kafka.libversion()[0],
        "broker_commit": git("rev-parse", "--short", "HEAD"),
        "broker_tree_dirty": bool(git("status", "--porcelain", "--", "pykbroker")),
    }


def round_summary(figures: dict[str, float]) -> str:
    parts = []
    for key, text in [
        (f"{A}.msgs_per_s", "(a) {:,.0f} msgs/s"),
        (f"{B}.mb_per_s", "(b) {:.1f} MB/s"),
        (f"{C}.mb_per_s", "(c) {:.1f} MB/s"),
        (f"{D}.p99_ms", "(d) p99 {:.1f} ms"),
        ("broker.peak_rss_mib", "RSS {:.0f} MiB"),
    ]:
        if key in figures:
            parts.append(text.format(figures[key]))
    return ", ".join(parts)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, help="rounds, each on a fresh broker (default 3, --quick 1; 0 with --profile: profile only)")
    parser.add_argument("--quick", action="store_true", help="a fast smoke run: a tenth of the messages")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"where to write the results (default {DEFAULT_JSON})")
    parser.add_argument("--partitions", type=int, default=PARTITIONS, help="partitions per benchmark topic")
    parser.add_argument("--broker-arg", action="append", default=[], metavar="ARG",
                        help="extra argument for `pykbroker serve` (repeatable), e.g. --broker-arg=--fsync=never")  # fmt: skip
    parser.add_argument("--profile", type=Path, metavar="STACKS",
                        help="after the rounds, run one more (unmeasured) round and sample the broker with "
                             "py-spy during --profile-workload; write collapsed stacks here and print the hot spots")  # fmt: skip
    parser.add_argument("--profile-workload", choices="abcd", default="a")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    rounds = sizes.rounds if args.rounds is None else args.rounds
    workload_names = dict(zip("abcd", (A, B, C, D)))
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    round_figures: list[dict[str, float]] = []
    errors: list[str] = []
    start_samples: list[float] = []

    for number in range(1, rounds + 1):
        log(f"round {number}/{rounds}")
        try:
            for _ in range(sizes.extra_start_samples):
                start_samples.append(measure_start_to_ready(args.broker_arg))
            with BrokerProcess(extra_args=list(args.broker_arg)) as broker:
                start_samples.append(broker.start_to_ready_s)
                this_round = Round(broker, sizes, args.partitions)
                this_round.run()
        except BrokerFailed as exc:
            errors.append(f"round {number}: {exc}")
            log(f"  broker failed: {exc}")
            continue
        round_figures.append(this_round.figures)
        errors.extend(f"round {number}: {error}" for error in this_round.errors)
        log(f"  {round_summary(this_round.figures)}")

    profile_report = None
    if args.profile:
        if not PySpyRecorder.available():
            log("py-spy is not installed (pip install py-spy): no profile taken")
        else:
            workload = workload_names[args.profile_workload]
            log(f"profile round: py-spy on the broker during {workload}")
            # Three times the messages, so that the sampled stretch is long enough to rank hot spots;
            # (c) needs (b)'s topic filled first.
            profile_sizes = replace(
                sizes,
                produce_small_count=3 * sizes.produce_small_count,
                produce_large_count=3 * sizes.produce_large_count,
            )
            needed = frozenset((workload, B)) if workload == C else frozenset((workload,))
            try:
                args.profile.unlink(missing_ok=True)
                with BrokerProcess(extra_args=list(args.broker_arg)) as broker:
                    profile_round = Round(broker, profile_sizes, args.partitions, needed, (workload, args.profile))
                    profile_round.run()
                errors.extend(f"profile round: {error}" for error in profile_round.errors)
                if args.profile.exists():
                    profile_report = summarize(args.profile)
                    profile_report["workload"] = workload
                    profile_report["stacks_file"] = str(args.profile)
                    profile_report["figures"] = profile_round.figures
            except BrokerFailed as exc:
                errors.append(f"profile round: {exc}")

    median_figures = medians(round_figures, start_samples)
    results = {
        "command": " ".join(["python", sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "started_at": started_at,
        "environment": describe_environment(),
        "settings": {**asdict(sizes), "rounds": rounds, "partitions": args.partitions,
                     "latency_rate": LATENCY_RATE, "broker_args": args.broker_arg},  # fmt: skip
        "medians": median_figures,
        "targets": verdicts(median_figures),
        "rounds": round_figures,
        "start_to_ready_samples_s": start_samples,
        "errors": errors,
        "profile": profile_report,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")

    print()
    print(table(round_figures, median_figures, start_samples))
    print(f"\n{rounds} round(s), medians; 1 MB = 2**20 bytes of values. JSON: {args.json}")
    if profile_report:
        print(f"\nprofile of {profile_report['workload']} (collapsed stacks in {args.profile}):")
        print(format_summary(profile_report))
    if errors:
        print("\nerrors:\n  " + "\n  ".join(error.splitlines()[0] for error in errors))
    return 1 if errors or (rounds and not round_figures) else 0


if __name__ == "__main__":
    sys.exit(main())

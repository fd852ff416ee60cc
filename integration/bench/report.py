"""Goals, medians over rounds, ratios against Apache Kafka, load-generator warnings, the printed table.

A round's figures are a flat dict keyed "workload.figure" (e.g. "a_produce_100b_acks1.msgs_per_s"),
so medians, ratios, the table and the JSON all read the same keys. Every target (pykbroker, kafka) has
its own list of rounds; a ratio is always pykbroker's median divided by Kafka's median, whatever the
direction in which the figure is better (a throughput ratio of 2 and a latency ratio of 0.5 both mean
pykbroker is twice as good).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

PYKBROKER, KAFKA = "pykbroker", "kafka"
A, B, C, D = "a_produce_100b_acks1", "b_produce_1k_acksall", "c_consume_1k", "d_latency_5k"
# Transactions next to what they build on: (e) an idempotent producer, (t) a transactional one committing every
# N messages (run_bench.TXN_BATCH), the same 100 B values and message count.
E, T = "e_produce_100b_idempotent", "t_produce_100b_txn"
# (c) in large client batches: consume(num_messages=10,000) instead of 1,000 (issue 18).
G = "g_consume_1k_batch10k"
WORKLOADS = (A, B, C, G, D, E, T)
THROUGHPUT_WORKLOADS = (A, B, C, G, E, T)
CONSUME_WORKLOADS = (C, G)

# A load-generator thread at this share of one core or more is the bottleneck: the figure then
# measures the client, not the broker.
GENERATOR_SATURATED = 0.9
# Broker + generator together using this share of all the machine's cores: the figure is bounded by the
# machine (both share its cores), not by either program alone.
MACHINE_SATURATED = 0.9


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    unit: str
    # None: neither direction is better (wall times); else whether a higher value is the better one.
    higher_is_better: bool | None = None
    bound: float | None = None  # an absolute goal for pykbroker, in the better direction
    ratio_goal: float | None = None  # a goal for pykbroker / Kafka, in the better direction

    def _meets(self, value: float, goal: float) -> bool:
        return value >= goal if self.higher_is_better else value <= goal

    def verdict(self, value: float | None, ratio: float | None) -> bool | None:
        """True / False when a goal was checked, None when there is none (or nothing was measured)."""
        checks = []
        if self.bound is not None and value is not None:
            checks.append(self._meets(value, self.bound))
        if self.ratio_goal is not None and ratio is not None:
            checks.append(self._meets(ratio, self.ratio_goal))
        return all(checks) if checks else None

    def goal_text(self) -> str:
        sign = ">=" if self.higher_is_better else "<="
        parts = []
        if self.bound is not None:
            parts.append(f"{sign} {format_number(self.bound)}")
        if self.ratio_goal is not None:
            parts.append(f"{sign} {self.ratio_goal:g}x Kafka")
        return ", ".join(parts)


def _per_million(workload: str, label: str) -> Figure:
    return Figure(f"{workload}.broker_cpu_s_per_million", f"{label} broker CPU per 1 M msgs", "s", False)


FIGURES = [
    # The goals: the original absolute targets, and issue 7's "at or above Kafka's produce rate, 1.5x its
    # consume rate, ready in under 0.3 s".
    Figure(f"{A}.msgs_per_s", "(a) produce 100 B values, acks=1", "msgs/s", True, 250_000, 1.0),
    Figure(f"{B}.mb_per_s", "(b) produce 1 KiB values, acks=all", "MB/s", True, 120, 1.0),
    Figure(f"{C}.mb_per_s", "(c) consume (b) from offset 0, assign", "MB/s", True, 150, 1.5),
    Figure(f"{G}.mb_per_s", "(g) as (c), consume(num_messages=10,000)", "MB/s", True, 150, 1.5),
    Figure(f"{D}.p99_ms", "(d) delivery latency p99 @ 5,000 msgs/s", "ms", False, 20, 1.0),
    Figure("broker.start_to_ready_s", "start-to-ready (spawn to ApiVersions)", "s", False, 0.3),
    Figure("broker.peak_rss_mib", "broker peak RSS (VmHWM)", "MiB", False, 150),
    Figure(f"{E}.msgs_per_s", "(e) produce 100 B values, idempotent", "msgs/s", True),
    Figure(f"{T}.msgs_per_s", "(t) produce 100 B values, transactional", "msgs/s", True),
    Figure(f"{T}.transactions_per_s", "(t) transactions committed", "txn/s", True),
    # What explains them.
    _per_million(A, "(a)"),
    _per_million(B, "(b)"),
    _per_million(C, "(c)"),
    _per_million(G, "(g)"),
    _per_million(D, "(d)"),
    _per_million(E, "(e)"),
    _per_million(T, "(t)"),
    Figure("broker.end_rss_mib", "broker RSS after the workloads (VmRSS)", "MiB", False),
    Figure(f"{A}.mb_per_s", "(a) produce 100 B values, acks=1", "MB/s", True),
    Figure(f"{B}.msgs_per_s", "(b) produce 1 KiB values, acks=all", "msgs/s", True),
    Figure(f"{C}.msgs_per_s", "(c) consume (b) from offset 0, assign", "msgs/s", True),
    Figure(f"{G}.msgs_per_s", "(g) as (c), consume(num_messages=10,000)", "msgs/s", True),
    # consume() calls that waited (>= 0.25 s of their 0.5 s timeout): the client's fetch-queue back-off.
    *(Figure(f"{w}.waiting_calls", f"({w[0]}) consume() calls that waited >= 0.25 s", "", False) for w in CONSUME_WORKLOADS),
    *(Figure(f"{w}.waiting_calls_s", f"({w[0]}) time in those calls", "s", False) for w in CONSUME_WORKLOADS),
    Figure(f"{D}.p50_ms", "(d) delivery latency p50", "ms", False),
    Figure(f"{D}.max_ms", "(d) delivery latency max", "ms", False),
    Figure(f"{D}.rate_achieved", "(d) send rate achieved", "msgs/s"),
    *(Figure(f"{w}.broker_cpu_s", f"({w[0]}) broker CPU", "s", False) for w in WORKLOADS),
    *(Figure(f"{w}.client_cpu_s", f"({w[0]}) generator CPU, all its threads", "s") for w in WORKLOADS),
    *(Figure(f"{w}.client_loop_core_share", f"({w[0]}) generator loop, share of a core", "") for w in WORKLOADS),
    *(Figure(f"{w}.seconds", f"({w[0]}) wall time", "s") for w in THROUGHPUT_WORKLOADS),
]


def format_number(value: float) -> str:
    if abs(value) >= 1000 or value == int(value):
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}" if abs(value) >= 0.01 else f"{value:.2g}"


def derived_figures(result: dict[str, float], broker_cpu_s: float) -> dict[str, float]:
    """Figures computed from a workload's result and the broker CPU it cost."""
    messages = result.get("messages")
    return {"broker_cpu_s_per_million": broker_cpu_s / messages * 1e6} if messages else {}


def medians(rounds: list[dict[str, float]], start_to_ready_samples: list[float]) -> dict[str, float]:
    """Median of each figure over the rounds that have it; start-to-ready over all its samples."""
    keys = {key for figures in rounds for key in figures}
    result = {key: statistics.median(r[key] for r in rounds if key in r) for key in sorted(keys)}
    if start_to_ready_samples:
        result["broker.start_to_ready_s"] = statistics.median(start_to_ready_samples)
    return result


def ratios(median_by_target: dict[str, dict[str, float]]) -> dict[str, float]:
    """pykbroker's median / Kafka's median, for every figure both have (and Kafka's is not zero)."""
    ours, theirs = median_by_target.get(PYKBROKER, {}), median_by_target.get(KAFKA, {})
    return {key: ours[key] / theirs[key] for key in ours if theirs.get(key)}


def saturation_warnings(target: str, figures: dict[str, float], cpus: int) -> list[str]:
    """Warnings for one round of one target: where the load generator (or the machine) was the
    bottleneck, so that the throughput figure measures the client rather than the broker."""
    warnings = []
    for workload in WORKLOADS:
        loop = figures.get(f"{workload}.client_loop_core_share")
        if loop is not None and loop >= GENERATOR_SATURATED:
            warnings.append(
                f"{target} ({workload[0]}): a generator loop used {loop:.0%} of a core: the figure measures "
                f"the client; run with more --generators (or on more cores) to measure the broker"
            )
        waiting = figures.get(f"{workload}.waiting_calls")
        if waiting:
            warnings.append(
                f"{target} ({workload[0]}): {waiting:.0f} consume() calls waited 0.25 s or more "
                f"({figures.get(f'{workload}.waiting_calls_s', 0.0):.1f} s in them): librdkafka stops fetching for "
                f"fetch.queue.backoff.ms (1 s) whenever its fetch queue is full (queued.max.messages.kbytes), i.e. "
                f"when the broker delivered faster than the loop consumed: the rate measures that pause"
            )
        if workload not in THROUGHPUT_WORKLOADS:
            continue
        seconds = figures.get(f"{workload}.seconds")
        busy = figures.get(f"{workload}.broker_cpu_s", 0.0) + figures.get(f"{workload}.client_cpu_s", 0.0)
        if seconds and busy / (seconds * cpus) >= MACHINE_SATURATED:
            warnings.append(
                f"{target} ({workload[0]}): broker + generator used {busy / seconds:.2f} of {cpus} cores: the "
                f"machine is saturated; compare broker CPU per message rather than the rate"
            )
    return warnings


def config_differences(configs: dict[str, dict[str, str]]) -> list[str]:
    """Topic settings on which pykbroker and Kafka differ ("key: pykbroker=X, kafka=Y"), keys that only
    one of them describes included."""
    ours, theirs = configs.get(PYKBROKER), configs.get(KAFKA)
    if ours is None or theirs is None:
        return []
    return [
        f"{key}: {PYKBROKER}={ours.get(key, '(absent)')}, {KAFKA}={theirs.get(key, '(absent)')}"
        for key in sorted(ours.keys() | theirs.keys())
        if ours.get(key) != theirs.get(key)
    ]


def verdicts(median_by_target: dict[str, dict[str, float]]) -> list[dict[str, object]]:
    """One entry per goal: both medians, the ratio, and whether pykbroker meets it (None: not measured)."""
    ratio = ratios(median_by_target)
    out = []
    for figure in FIGURES:
        if figure.bound is None and figure.ratio_goal is None:
            continue
        value = median_by_target.get(PYKBROKER, {}).get(figure.key)
        out.append(
            {
                "key": figure.key,
                "label": figure.label,
                "unit": figure.unit,
                "goal": figure.goal_text(),
                "pykbroker": value,
                "kafka": median_by_target.get(KAFKA, {}).get(figure.key),
                "ratio": ratio.get(figure.key),
                "pass": figure.verdict(value, ratio.get(figure.key)),
            }
        )
    return out


def table(median_by_target: dict[str, dict[str, float]]) -> str:
    """The Markdown table: one row per figure, a column per target, the ratio and the goal."""
    ratio = ratios(median_by_target)
    targets = [t for t in (PYKBROKER, KAFKA) if t in median_by_target]
    if not targets:
        return "(no broker measured)"
    header = ("figure", "unit", *targets, "ratio", "better", "goal", "result")
    rows = [header]
    for figure in FIGURES:
        values = [median_by_target[t].get(figure.key) for t in targets]
        has_goal = figure.bound is not None or figure.ratio_goal is not None
        if all(v is None for v in values) and not has_goal:
            continue
        r = ratio.get(figure.key)
        better = ""
        if r is not None and figure.higher_is_better is not None and r != 1:
            better = PYKBROKER if (r > 1) == figure.higher_is_better else KAFKA
        passed = figure.verdict(values[0] if targets[0] == PYKBROKER else None, r)
        result = "" if passed is None else ("PASS" if passed else "FAIL")
        if has_goal and values[0] is None:
            result = "NOT MEASURED"  # a goal nobody measured must not vanish from the table
        rows.append(
            (
                figure.label,
                figure.unit,
                *("-" if v is None else format_number(v) for v in values),
                "" if r is None else f"{r:.2f}x",
                better,
                figure.goal_text(),
                result,
            )
        )
    widths = [len(cell) for cell in header]
    for row in rows:
        widths = [max(width, len(cell)) for width, cell in zip(widths, row)]
    numeric = set(range(2, 3 + len(targets)))  # right-align the medians and the ratio
    lines = []
    for index, row in enumerate(rows):
        cells = [cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("| " + " | ".join(cells) + " |")
        if index == 0:
            lines.append("|" + "|".join("-" * (w + 1) + (":" if i in numeric else "-") for i, w in enumerate(widths)) + "|")
    return "\n".join(lines)

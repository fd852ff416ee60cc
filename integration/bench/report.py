"""Targets, medians over rounds, the printed table.

A round's figures are a flat dict keyed "workload.figure" (e.g. "a_produce_100b_acks1.msgs_per_s"),
so medians, the table and the JSON all read the same keys.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    unit: str
    # A target, when the spec sets one: the figure passes when it is >= (at_least) or <= the bound.
    bound: float | None = None
    at_least: bool = True

    def passes(self, value: float) -> bool | None:
        if self.bound is None:
            return None
        return value >= self.bound if self.at_least else value <= self.bound

    def target_text(self) -> str:
        if self.bound is None:
            return ""
        return f"{'>=' if self.at_least else '<='} {format_number(self.bound)}"


A, B, C, D = "a_produce_100b_acks1", "b_produce_1k_acksall", "c_consume_1k", "d_latency_5k"

# Target figures first (the spec's six), then figures that explain them.
FIGURES = [
    Figure(f"{A}.msgs_per_s", "(a) produce 100 B values, acks=1", "msgs/s", 250_000),
    Figure(f"{B}.mb_per_s", "(b) produce 1 KiB values, acks=all", "MB/s", 120),
    Figure(f"{C}.mb_per_s", "(c) consume (b) from offset 0, assign", "MB/s", 150),
    Figure(f"{D}.p99_ms", "(d) delivery latency p99 @ 5,000 msgs/s", "ms", 20, at_least=False),
    Figure("broker.start_to_ready_s", "start-to-ready (spawn to ApiVersions)", "s", 0.5, at_least=False),
    Figure("broker.peak_rss_mib", "broker peak RSS (VmHWM)", "MiB", 150, at_least=False),
    Figure("broker.end_rss_mib", "broker RSS after the workloads (VmRSS)", "MiB"),
    Figure(f"{A}.mb_per_s", "(a) produce 100 B values, acks=1", "MB/s"),
    Figure(f"{B}.msgs_per_s", "(b) produce 1 KiB values, acks=all", "msgs/s"),
    Figure(f"{C}.msgs_per_s", "(c) consume (b) from offset 0, assign", "msgs/s"),
    Figure(f"{D}.p50_ms", "(d) delivery latency p50", "ms"),
    Figure(f"{D}.max_ms", "(d) delivery latency max", "ms"),
    Figure(f"{D}.rate_achieved", "(d) send rate achieved", "msgs/s"),
    Figure(f"{A}.broker_cpu_s", "(a) broker CPU", "s"),
    Figure(f"{B}.broker_cpu_s", "(b) broker CPU", "s"),
    Figure(f"{C}.broker_cpu_s", "(c) broker CPU", "s"),
    Figure(f"{D}.broker_cpu_s", "(d) broker CPU", "s"),
    Figure(f"{A}.client_cpu_s", "(a) client CPU (bench process)", "s"),
    Figure(f"{B}.client_cpu_s", "(b) client CPU (bench process)", "s"),
    Figure(f"{C}.client_cpu_s", "(c) client CPU (bench process)", "s"),
    Figure(f"{A}.seconds", "(a) wall time", "s"),
    Figure(f"{B}.seconds", "(b) wall time", "s"),
    Figure(f"{C}.seconds", "(c) wall time", "s"),
]


def format_number(value: float) -> str:
    if abs(value) >= 1000 or value == int(value):
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}" if abs(value) >= 0.01 else f"{value:.2g}"


def medians(rounds: list[dict[str, float]], start_to_ready_samples: list[float]) -> dict[str, float]:
    """Median of each figure over the rounds that have it; start-to-ready over all its samples."""
    keys = {key for figures in rounds for key in figures}
    result = {key: statistics.median(r[key] for r in rounds if key in r) for key in sorted(keys)}
    if start_to_ready_samples:
        result["broker.start_to_ready_s"] = statistics.median(start_to_ready_samples)
    return result


def verdicts(median_figures: dict[str, float]) -> list[dict[str, object]]:
    """One entry per target: the median, the bound and whether it passes (None when not measured)."""
    out = []
    for figure in FIGURES:
        if figure.bound is None:
            continue
        value = median_figures.get(figure.key)
        out.append(
            {
                "key": figure.key,
                "label": figure.label,
                "unit": figure.unit,
                "target": figure.target_text(),
                "median": value,
                "pass": None if value is None else figure.passes(value),
            }
        )
    return out


def table(rounds: list[dict[str, float]], median_figures: dict[str, float], start_samples: list[float]) -> str:
    header = ("figure", "unit", "median", "per round", "target", "result")
    rows = [header]
    for figure in FIGURES:
        value = median_figures.get(figure.key)
        if value is None:
            if figure.bound is not None:  # a target nobody measured must not vanish from the table
                rows.append((figure.label, figure.unit, "-", "", figure.target_text(), "NOT MEASURED"))
            continue
        if figure.key == "broker.start_to_ready_s":
            per_round = start_samples
        else:
            per_round = [r[figure.key] for r in rounds if figure.key in r]
        passed = figure.passes(value)
        rows.append(
            (
                figure.label,
                figure.unit,
                format_number(value),
                " ".join(format_number(v) for v in per_round) if len(per_round) > 1 else "",
                figure.target_text(),
                "" if passed is None else ("PASS" if passed else "FAIL"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    numeric = {2}  # right-align the medians
    lines = []
    for index, row in enumerate(rows):
        cells = [cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)

"""The benchmark's arithmetic and verdicts (integration/bench): ratios against Kafka, goals in both
directions, broker CPU per million messages, the load-generator warnings and the Markdown table.
Nothing here starts a broker or measures a time."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration" / "bench"))

from report import A, C, D, KAFKA, PYKBROKER, Figure  # noqa: E402
from report import config_differences, derived_figures, medians, ratios, saturation_warnings, table, verdicts  # noqa: E402


def test_ratio_is_pykbroker_over_kafka_and_skips_what_kafka_lacks_or_has_as_zero():
    got = ratios({PYKBROKER: {"x": 300.0, "y": 1.0, "z": 5.0}, KAFKA: {"x": 100.0, "y": 0.0}})
    assert got == {"x": 3.0}


def test_no_ratio_without_kafka():
    assert ratios({PYKBROKER: {"x": 1.0}}) == {}


def test_goals_hold_in_the_better_direction():
    throughput = Figure("t", "t", "msgs/s", higher_is_better=True, bound=100, ratio_goal=1.5)
    assert throughput.verdict(200, 1.6) is True
    assert throughput.verdict(200, 1.4) is False  # fast, but not 1.5x Kafka
    assert throughput.verdict(50, 2.0) is False  # beats Kafka, misses the absolute goal
    assert throughput.verdict(200, None) is True  # Kafka not measured: the absolute goal alone
    latency = Figure("l", "l", "ms", higher_is_better=False, bound=20, ratio_goal=1.0)
    assert latency.verdict(10, 0.5) is True
    assert latency.verdict(10, 1.2) is False
    assert latency.verdict(25, 0.5) is False
    assert Figure("w", "w", "s").verdict(1.0, 1.0) is None


def test_goal_text_names_both_goals():
    assert Figure("t", "t", "MB/s", True, 150, 1.5).goal_text() == ">= 150, >= 1.5x Kafka"
    assert Figure("l", "l", "s", False, 0.3).goal_text() == "<= 0.3"


def test_broker_cpu_per_million_messages():
    assert derived_figures({"messages": 400_000}, 2.0) == {"broker_cpu_s_per_million": 5.0}
    assert derived_figures({"p99_ms": 3.0}, 2.0) == {}


def test_medians_per_figure_and_start_samples_over_all_samples():
    rounds = [{"k": 1.0}, {"k": 3.0, "only": 7.0}, {"k": 2.0}]
    got = medians(rounds, [0.5, 0.1, 0.9, 0.2])
    assert got == {"k": 2.0, "only": 7.0, "broker.start_to_ready_s": 0.35}


def test_a_saturated_generator_loop_is_a_warning_that_names_the_client():
    warnings = saturation_warnings(PYKBROKER, {f"{A}.client_loop_core_share": 0.97, f"{D}.client_loop_core_share": 0.1}, 8)
    assert len(warnings) == 1
    assert "(a)" in warnings[0] and "measures the client" in warnings[0] and "--generators" in warnings[0]
    assert saturation_warnings(PYKBROKER, {f"{A}.client_loop_core_share": 0.5}, 8) == []


def test_a_saturated_machine_is_a_warning():
    figures = {f"{C}.seconds": 1.0, f"{C}.broker_cpu_s": 1.2, f"{C}.client_cpu_s": 0.7}
    (warning,) = saturation_warnings(KAFKA, figures, 2)
    assert warning.startswith("kafka (c)") and "1.90 of 2 cores" in warning
    assert saturation_warnings(KAFKA, figures, 4) == []


def test_table_shows_both_brokers_the_ratio_the_winner_and_the_verdict():
    median_by_target = {
        PYKBROKER: {f"{A}.msgs_per_s": 500_000.0, f"{D}.p99_ms": 5.0},
        KAFKA: {f"{A}.msgs_per_s": 250_000.0, f"{D}.p99_ms": 10.0},
    }
    lines = table(median_by_target).splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == ["figure", "unit", "pykbroker", "kafka", "ratio", "better", "goal", "result"]
    produce = next(line for line in lines if "(a) produce 100 B values, acks=1" in line and "msgs/s" in line)
    cells = [cell.strip() for cell in produce.strip("|").split("|")]
    assert cells[2:] == ["500,000", "250,000", "2.00x", "pykbroker", ">= 250,000, >= 1x Kafka", "PASS"]
    latency = next(line for line in lines if "p99" in line)
    assert "0.50x" in latency and "pykbroker" in latency and "PASS" in latency
    # Goals that nothing measured stay in the table.
    consume = next(line for line in lines if "(c) consume" in line and "MB/s" in line)
    assert "NOT MEASURED" in consume


def test_verdicts_carry_both_medians_and_the_ratio():
    median_by_target = {PYKBROKER: {f"{C}.mb_per_s": 150.0}, KAFKA: {f"{C}.mb_per_s": 200.0}}
    (consume,) = [v for v in verdicts(median_by_target) if v["key"] == f"{C}.mb_per_s"]
    assert consume["pykbroker"] == 150.0 and consume["kafka"] == 200.0 and consume["ratio"] == 0.75
    assert consume["pass"] is False  # meets the absolute 150 MB/s but not 1.5x Kafka


def test_config_differences_list_what_differs_and_what_one_side_lacks():
    configs = {
        PYKBROKER: {"flush.ms": "1000", "segment.bytes": "1073741824", "ours.only": "x"},
        KAFKA: {"flush.ms": "9223372036854775807", "segment.bytes": "1073741824"},
    }
    assert config_differences(configs) == [
        "flush.ms: pykbroker=1000, kafka=9223372036854775807",
        "ours.only: pykbroker=x, kafka=(absent)",
    ]
    assert config_differences({PYKBROKER: configs[PYKBROKER]}) == []


def test_table_of_nothing_says_so():
    assert table({}) == "(no broker measured)"


def test_waiting_consume_calls_are_a_warning_that_names_the_client_back_off():
    from report import G

    figures = {f"{G}.waiting_calls": 2.0, f"{G}.waiting_calls_s": 1.02, f"{C}.waiting_calls": 0.0}
    (warning,) = saturation_warnings(PYKBROKER, figures, 8)
    assert warning.startswith("pykbroker (g): 2 consume() calls waited 0.25 s or more")
    assert "1.0 s in them" in warning and "fetch.queue.backoff.ms" in warning


def test_both_consume_batch_sizes_have_the_consume_goal():
    from report import G

    median_by_target = {PYKBROKER: {f"{C}.mb_per_s": 400.0, f"{G}.mb_per_s": 200.0},
                        KAFKA: {f"{C}.mb_per_s": 200.0, f"{G}.mb_per_s": 200.0}}
    by_key = {v["key"]: v for v in verdicts(median_by_target)}
    assert by_key[f"{C}.mb_per_s"]["pass"] is True
    assert by_key[f"{G}.mb_per_s"]["pass"] is False and by_key[f"{G}.mb_per_s"]["goal"] == ">= 150, >= 1.5x Kafka"

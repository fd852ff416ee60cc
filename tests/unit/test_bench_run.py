"""The benchmark runner's statement of the brokers' durability settings (integration/bench/run_bench.py),
which the figures depend on. No broker is started."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration" / "bench"))

from run_bench import durability_note  # noqa: E402


def test_default_durability_states_both_brokers_defaults():
    note = durability_note(["pykbroker", "kafka"], [], [])
    assert "fsync=interval" in note and "no fsync" in note


def test_durability_names_the_settings_given():
    note = durability_note(["pykbroker", "kafka"], ["--fsync=never"], ["log.flush.interval.ms=1000", "num.io.threads=4"])
    assert "pykbroker ran with --fsync=never" in note
    assert "Kafka ran with log.flush.interval.ms=1000" in note and "num.io.threads" not in note


def test_durability_of_one_broker_mentions_only_that_one():
    assert "Kafka" not in durability_note(["pykbroker"], [], [])


def test_workloads_are_chosen_by_letter_and_txn_batch_is_checked():
    import pytest

    from report import A, E, T
    from run_bench import TXN_BATCH, parse_args

    args = parse_args(["--workloads", "et"])
    assert args.workloads == frozenset((E, T)) and args.txn_batch == TXN_BATCH
    assert A in parse_args([]).workloads and T in parse_args([]).workloads
    for bad in (["--workloads", "ex"], ["--workloads", ""], ["--txn-batch", "0"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_the_consume_workloads_read_b_in_batches_of_1000_and_10000():
    from report import B, C, G
    from run_bench import CONSUME_BATCH, parse_args

    assert CONSUME_BATCH == {C: 1_000, G: 10_000}
    assert parse_args(["--workloads", "bcg"]).workloads == frozenset((B, C, G))
    assert G in parse_args([]).workloads
    assert parse_args(["--profile-workload", "g"]).profile_workload == "g"

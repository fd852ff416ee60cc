"""The fault-run checker (integration/faults/checker.py) finds each kind of violation, and only those."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration" / "faults"))

from checker import Rec, check  # noqa: E402


def v(producer: str, seq: int) -> bytes:
    return f"{producer}:{seq:09d}".encode()


ACKED = [Rec(0, 0, v("p0", 0)), Rec(1, 0, v("p0", 1)), Rec(0, 1, v("p0", 2)), Rec(0, 2, v("p1", 0))]
LOG = {0: [(0, v("p0", 0)), (1, v("p0", 2)), (2, v("p1", 0))], 1: [(0, v("p0", 1))]}


def test_a_clean_run_passes_with_its_counts():
    result = check(ACKED, LOG, [[Rec(0, 0, v("p0", 0)), Rec(0, 1, v("p0", 2))]])
    assert result.ok, result.summary()
    assert (result.acknowledged, result.read) == (4, 4)
    assert "lost=0" in result.summary()


def test_an_unacknowledged_record_read_is_fine():
    log = {0: LOG[0] + [(3, v("p1", 1))], 1: LOG[1]}
    assert check(ACKED, log).ok


def test_lost_and_changed_acknowledged_records():
    log = {0: [(0, v("p0", 0)), (1, v("p9", 0))], 1: LOG[1]}
    result = check(ACKED, log)
    assert result.lost == [Rec(0, 2, v("p1", 0))]
    assert result.changed == [(Rec(0, 1, v("p0", 2)), v("p9", 0))]


def test_duplicates_and_reordering():
    log = {0: LOG[0] + [(3, v("p0", 2))], 1: LOG[1]}
    result = check(ACKED, log)
    assert result.duplicates == [(v("p0", 2), [(0, 1), (0, 3)])]
    assert result.reordered == [("p0", 0, 2, 2)]
    assert not result.ok


def test_a_consumer_that_saw_a_value_later_replaced_or_skipped_an_offset():
    seen = [Rec(0, 0, v("p0", 0)), Rec(0, 2, v("p1", 0)), Rec(1, 0, v("zombie", 0))]
    result = check(ACKED, LOG, [seen])
    assert result.diverged == [(Rec(1, 0, v("zombie", 0)), v("p0", 1))]
    assert result.skips == [(0, 0, 0, 2)]


def test_a_record_acknowledged_without_an_offset_must_be_in_its_partition_somewhere():
    # librdkafka "implicitly acks" a timed-out batch (offset unknown) once a later one succeeds.
    implicit = Rec(1, None, v("p0", 1))
    assert check([implicit], LOG).ok
    elsewhere = Rec(0, None, v("p0", 1))  # in the log, but in another partition
    assert [r.value for r in check([elsewhere], LOG).lost] == [v("p0", 1)]
    assert [r.value for r in check([Rec(1, None, v("p9", 9))], LOG).lost] == [v("p9", 9)]

"""Exactly-once consume-transform-produce through crashes, against a real Apache Kafka 3.7.1 and against pykbroker
(txn_targets.py `target`).

The application (txn_eos_worker.py, confluent-kafka: read_committed input consumer, transactional producer,
send_offsets_to_transaction) runs as a real process. It is killed with SIGKILL at a seeded random moment while
a transaction is open (its output records flushed into the log, not committed), then started again with the
same transactional.id, which fences the dead incarnation and aborts its open transaction; several times, then
it runs to the end of the input. Afterwards a read_committed reader of the output holds every input record
transformed exactly once (no loss, no duplicate), a read_uncommitted reader sees the aborted duplicates (the
kills did hit open transactions), and the group's committed offsets are the input's end.

The seed is in the test id (PYKBROKER_EOS_SEED=N to run another); the kill schedule is printed (shown on failure).
Run: python3 -m pytest -q tests/integration/test_transactions_eos.py -k "not pykbroker"   (Kafka only)
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer

from test_transactions_clients import committed_offsets, create_topics, read_values, unique
import txn_targets

target = txn_targets.target  # the fixture: Kafka 3.7.1 and pykbroker
pytestmark = pytest.mark.timeout(600)

WORKER = Path(__file__).resolve().parent / "txn_eos_worker.py"
INPUT_PARTITIONS, OUTPUT_PARTITIONS = 2, 3
RECORDS = 400
BATCH = 20
PAUSE_MS = 500            # each transaction stays open this long after its records are flushed
KILLS = 4
RUN_TIMEOUT_S = 120.0     # one incarnation's bound: reach the kill point, or finish


class Worker:
    """One incarnation of the application; its stdout lines are collected by a thread."""

    def __init__(self, args: list[str]) -> None:
        self.process = subprocess.Popen([sys.executable, str(WORKER), *args], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            with self.changed:
                self.lines.append(line.strip())
                self.changed.notify_all()
        with self.changed:
            self.lines.append("<eof>")
            self.changed.notify_all()

    def wait_line(self, wanted: str, timeout: float) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: wanted in self.lines or "<eof>" in self.lines, timeout):
                raise AssertionError(f"worker did not print {wanted!r} within {timeout} s: {self.lines[-5:]}")
        if wanted not in self.lines:
            raise AssertionError(f"worker exited {self.process.wait()} before {wanted!r}: {self.lines[-5:]}\n"
                                 f"{self.process.stderr.read()[-3000:]}")

    def kill(self) -> str:
        """SIGKILL; returns the last thing it said before dying."""
        self.process.kill()
        self.process.wait()
        self._reader.join(10)
        said = [line for line in self.lines if line != "<eof>"]
        return said[-1] if said else ""

    def finish(self, timeout: float) -> None:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"worker did not finish within {timeout} s: {self.lines[-5:]}")
        self._reader.join(10)
        assert code == 0 and "done" in self.lines, (
            f"worker exited {code}: {self.lines[-5:]}\n{self.process.stderr.read()[-3000:]}")


@pytest.mark.parametrize("seed", [int(os.environ.get("PYKBROKER_EOS_SEED", "1207"))])
def test_consume_transform_produce_is_exactly_once_through_kill9(target, seed):
    rng = random.Random(seed)
    source, sink, group, tid = unique("eos-in"), unique("eos-out"), unique("eos-group"), unique("eos-tid")
    create_topics(target.bootstrap, {source: INPUT_PARTITIONS, sink: OUTPUT_PARTITIONS})
    plain = Producer({"bootstrap.servers": target.bootstrap, "linger.ms": 5})
    for i in range(RECORDS):
        plain.produce(source, key=b"k%d" % i, value=b"in-%d" % i, partition=i % INPUT_PARTITIONS)
    assert plain.flush(60) == 0
    args = [target.bootstrap, source, sink, group, tid, str(BATCH), str(PAUSE_MS)]

    schedule, killed_open = [], 0
    for run in range(KILLS):
        # kill while transaction `nth` of this incarnation is open, `delay` s after its records were flushed
        nth, delay = rng.randint(1, 3), round(rng.uniform(0.0, PAUSE_MS / 1000 * 0.6), 3)
        worker = Worker(args)
        try:
            worker.wait_line(f"open {nth}", RUN_TIMEOUT_S)
            time.sleep(delay)
        finally:
            last = worker.kill()
        schedule.append((run, nth, delay, last))
        killed_open += last.startswith("open")
        print(f"seed {seed} run {run}: killed in transaction {nth} after {delay} s; last said {last!r}")
    Worker(args).finish(RUN_TIMEOUT_S * 2)

    expected = Counter(b"out-%d" % i for i in range(RECORDS))
    out_parts = [(sink, p) for p in range(OUTPUT_PARTITIONS)]
    committed = Counter(v for *_, v in read_values(target.bootstrap, out_parts, "read_committed", RECORDS))
    duplicates = {v: n for v, n in committed.items() if n > 1}
    assert not duplicates, f"seed {seed} {schedule}: {len(duplicates)} records committed twice: " \
                           f"{sorted(duplicates.items())[:5]}"
    missing = sorted(expected - committed)
    assert not missing, f"seed {seed} {schedule}: {len(missing)} inputs lost: {missing[:5]}"
    assert committed == expected, f"seed {seed} {schedule}: unexpected output {sorted(committed - expected)[:5]}"

    assert killed_open >= KILLS // 2, f"seed {seed}: the kills did not hit open transactions: {schedule}"
    everything = read_values(target.bootstrap, out_parts, "read_uncommitted", RECORDS + 1, quiet=1.0)
    assert len(everything) > RECORDS, "no aborted output in the log: the kills did not test anything"
    ends = {(source, p): RECORDS // INPUT_PARTITIONS for p in range(INPUT_PARTITIONS)}
    assert committed_offsets(target.bootstrap, group, list(ends)) == ends

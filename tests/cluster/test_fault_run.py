"""A short seeded fault run (integration/faults/run_fault_run.py) in the test suite: ~60 s of kills, pauses and
controlled shutdowns of random brokers under idempotent acks=all producers and a tail consumer, then the
checker's invariants (acknowledged ⊆ read, no duplicates, order, one value per offset, no consumer skip).

Seed: PYKBROKER_FAULT_SEED (default below). Run: python3 -m pytest -q tests/cluster/test_fault_run.py
The full run: python3 integration/faults/run_fault_run.py --seed S --duration 120
"""

from __future__ import annotations

import os

import pytest

from broker_cluster import BrokerCluster  # also puts integration/faults on sys.path
from run_fault_run import FAULT_OVERRIDES, fault_run

SEED = int(os.environ.get("PYKBROKER_FAULT_SEED", "8"))
DURATION_S = 60.0


@pytest.mark.timeout(420)
def test_seeded_fault_run_keeps_every_acknowledged_record(zk_connect, tmp_path):
    with BrokerCluster(zk_connect, tmp_path, n=3, overrides=FAULT_OVERRIDES) as cluster:
        report = fault_run(cluster, seed=SEED, duration=DURATION_S, partitions=3, producers=2)
    print(report.summary())
    assert report.check.acknowledged > 0 and report.check.read >= report.check.acknowledged
    assert len(report.events) > 2, "no fault was applied"
    assert report.ok, report.summary()

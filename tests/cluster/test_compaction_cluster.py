"""Log compaction on a 3-broker cluster: each replica cleans its own log, and a consumer reading from any
leader (before and after a leader change) sees the latest value per key.

Run: python3 -m pytest -q tests/cluster/test_compaction_cluster.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from broker_cluster import BrokerCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from test_compaction import (  # noqa: E402  (tests/integration is not a package)
    COMPACTED,
    consume_all,
    latest_values,
    produce,
    updates,
    wait_for,
)

pytestmark = pytest.mark.timeout(300)


def cleaned_up_to(data_dir: Path, topic: str) -> int:
    try:
        lines = (data_dir / "cleaner-offset-checkpoint").read_text().splitlines()[2:]
    except FileNotFoundError:
        return -1
    return max((int(offset) for name, _, offset in (line.split() for line in lines) if name == topic), default=-1)


def test_each_replica_cleans_its_own_log_and_consumers_see_the_latest_values(zk_connect, tmp_path):
    # (6 s ZooKeeper sessions: the killed leader is noticed in 6 s, not 18)
    overrides = {"log.cleaner.backoff.ms": 100, "zookeeper.session.timeout.ms": 6000}
    with BrokerCluster(zk_connect, tmp_path, n=3, overrides=overrides) as cluster:
        cluster.create_topic("compacted", partitions=1, replication_factor=3, config=COMPACTED)
        pairs, expected = updates(rounds=30, keys=10)
        assert not produce(cluster.bootstrap, "compacted", pairs + [(b"tail", b"t" * 4000)], acks="all")
        expected[b"tail"] = b"t" * 4000
        end = len(pairs)
        for broker in cluster.brokers.values():  # every replica's own cleaner reached the last segment
            wait_for(lambda: cleaned_up_to(broker.data_dir, "compacted") >= end - 1,
                     f"broker {broker.broker_id} to clean its replica")
        records = consume_all(cluster.bootstrap, "compacted")
        assert latest_values(records) == expected
        assert len(records) < len(pairs) / 5
        sizes = {
            broker.broker_id: sum(p.stat().st_size for p in (broker.data_dir / "compacted-0").glob("*.log"))
            for broker in cluster.brokers.values()
        }
        assert all(size < 30 * 10 * 110 / 3 for size in sizes.values()), sizes
        # another leader serves the same latest values
        leader = cluster.partition("compacted", 0).leader
        cluster.kill(leader)
        cluster.wait_for_leader("compacted", 0, exclude={leader}, timeout=60)
        assert latest_values(consume_all(cluster.bootstrap, "compacted")) == expected

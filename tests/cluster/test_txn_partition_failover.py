"""Transactions across a leader failover on a 3-broker cluster (ZooKeeper mode): followers replicate the
transactional batches and the markers, so a follower that becomes leader knows the open transaction (its
LSO is the transaction's first offset) and, after the marker, answers the same aborted list; a third leader,
elected after another kill, too. The test plays the transaction coordinator with raw WriteTxnMarkers, so
the brokers run without partition verification (KIP-890: there is no coordinator to verify with)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from broker_cluster import BrokerCluster, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from broker_process import init_producer_id  # noqa: E402
from test_txn_partition_leader import fetch, produce, txn_records, values_of, write_marker  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def committed_view(address, topic: str):
    part = fetch(address, topic, 0, 1)
    if part.error_code != ErrorCode.none:
        return None
    return (part.high_watermark, part.last_stable_offset,
            [(a.producer_id, a.first_offset) for a in part.aborted_transactions or ()], values_of(part))


def wait_for_view(cluster: BrokerCluster, broker_id: int, topic: str, expected, what: str) -> None:
    seen = []

    def matches() -> bool:
        seen.append(committed_view(cluster.brokers[broker_id].address, topic))
        return seen[-1] == expected

    try:
        wait_until(matches, what, 60)
    except AssertionError as exc:
        views = {b: committed_view(cluster.brokers[b].address, topic) for b in sorted(cluster.live_ids())}
        raise AssertionError(f"{exc}: broker {broker_id} last answered {seen[-1:]}; every live broker: {views}") from None


def test_new_leader_knows_open_transactions_and_aborted_ranges(zk_connect, tmp_path):
    topic = "txn-failover"
    with BrokerCluster(zk_connect, tmp_path, n=3,
                       overrides={"transaction.partition.verification.enable": False,
                                 "zookeeper.session.timeout.ms": 6000}) as cluster:
        cluster.create_topic(topic, 1, 3)
        leader = cluster.wait_for_leader(topic, 0)
        address = cluster.brokers[leader].address
        pid, epoch = init_producer_id(address)
        other, other_epoch = init_producer_id(address)
        assert produce(address, topic, txn_records(other, other_epoch, 0, [b"c1"])).error_code == ErrorCode.none  # 0
        assert write_marker(address, topic, other, other_epoch, commit=True) == [(0, ErrorCode.none)]  # 1
        assert produce(address, topic, txn_records(pid, epoch, 0, [b"a1", b"a2"])).error_code == ErrorCode.none  # 2-3
        expected_open = (4, 2, [], [b"c1"])
        assert committed_view(address, topic) == expected_open

        cluster.kill(leader)
        second = cluster.wait_for_leader(topic, 0, exclude={leader}, timeout=60)
        wait_for_view(cluster, second, topic, expected_open, "the new leader's LSO at the open transaction")

        result = []
        wait_until(lambda: result.append(write_marker(cluster.brokers[second].address, topic, pid, epoch, commit=False))
                   or result[-1] == [(0, ErrorCode.none)], f"the abort marker (last: {result[-1:]})", 60)  # 4
        # The broker sends the aborted records with the list; the consumer drops them.
        expected_done = (5, 5, [(pid, 2)], [b"c1", b"a1", b"a2"])
        wait_for_view(cluster, second, topic, expected_done, "the aborted list")

        # The killed broker comes back, catches up, and the current leader goes: the third leader agrees.
        cluster.start_broker(leader)
        cluster.wait_for_isr(topic, 0, {1, 2, 3})
        cluster.kill(second)
        third = cluster.wait_for_leader(topic, 0, exclude={second}, timeout=60)
        wait_for_view(cluster, third, topic, expected_done, "the third leader's aborted list")

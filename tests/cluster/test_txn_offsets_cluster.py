"""Transactional offsets survive the loss of the group's coordinator (3 brokers, ZooKeeper mode,
__consumer_offsets with replication factor 3 and min.insync.replicas 2).

A group's coordinator gets a TxnOffsetCommit of producer A, then A's COMMIT marker (WriteTxnMarkers to the
leader of the group's __consumer_offsets partition, which is the coordinator), and a TxnOffsetCommit of
producer B whose transaction is still open. The coordinator is SIGKILLed. The broker that becomes the
partition's leader loads the partition from its replica: A's offsets are committed there, B's are pending
(OffsetFetch with require_stable: UNSTABLE_OFFSET_COMMIT), and B's COMMIT marker, written to the new leader,
makes them visible.
"""

from __future__ import annotations

import time
import uuid

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopics
from kio.schema.txn_offset_commit.v3.request import (
    TxnOffsetCommitRequest,
    TxnOffsetCommitRequestPartition,
    TxnOffsetCommitRequestTopic,
)
from kio.schema.write_txn_markers.v1.request import WritableTxnMarker, WritableTxnMarkerTopic, WriteTxnMarkersRequest
from kio.static.primitive import i16, i32, i64

from broker_cluster import BrokerCluster, ProtocolError, send_request, wait_until
from pykbroker.groups.offset_store import OFFSETS_TOPIC, partition_for_group

OFFSETS_PARTITIONS = 6
OVERRIDES = {
    # The test plays the transaction coordinator with raw requests: no coordinator to verify with (KIP-890).
    "transaction.partition.verification.enable": False,
    "zookeeper.session.timeout.ms": 6000,
    "min.insync.replicas": 2,
    "default.replication.factor": 3,
    "offsets.topic.replication.factor": 3,
    "offsets.topic.num.partitions": OFFSETS_PARTITIONS,
    "replica.fetch.wait.max.ms": 500,
    "group.initial.rebalance.delay.ms": 0,
}
FAILOVER_S = 60.0
RETRIABLE = {ErrorCode.not_coordinator, ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available,
             ErrorCode.not_leader_or_follower, ErrorCode.not_enough_replicas, ErrorCode.request_timed_out}

pytestmark = pytest.mark.timeout(300)


def txn_commit(group: str, topic: str, offsets: dict[int, int], producer_id: int) -> TxnOffsetCommitRequest:
    return TxnOffsetCommitRequest(
        transactional_id=f"txn-{producer_id}", group_id=group, producer_id=i64(producer_id), producer_epoch=i16(0),
        generation_id=i32(-1), member_id="", group_instance_id=None,
        topics=(TxnOffsetCommitRequestTopic(name=topic, partitions=tuple(
            TxnOffsetCommitRequestPartition(partition_index=i32(p), committed_offset=i64(o), committed_leader_epoch=i32(-1),
                                            committed_metadata="") for p, o in offsets.items())),))


def commit_marker(offsets_partition: int, producer_id: int):
    return WriteTxnMarkersRequest(markers=(WritableTxnMarker(
        producer_id=i64(producer_id), producer_epoch=i16(0), transaction_result=True,
        topics=(WritableTxnMarkerTopic(name=OFFSETS_TOPIC, partition_indexes=(i32(offsets_partition),)),),
        coordinator_epoch=i32(0)),))


def until_answered(cluster: BrokerCluster, broker_id: int, request, errors_of, what: str):
    """Send until no error is a retriable one (a partition electing, a coordinator loading); the answer."""
    deadline = time.monotonic() + FAILOVER_S
    while True:
        try:
            answer = send_request(cluster.brokers[broker_id].address, request, timeout=15)
            if not set(errors_of(answer)) & RETRIABLE:
                return answer
        except (OSError, ProtocolError) as exc:
            answer = exc
        assert time.monotonic() < deadline, f"{what}: still {answer!r}"
        time.sleep(0.2)


def fetch(cluster: BrokerCluster, broker_id: int, group: str, topic: str) -> dict:
    request = OffsetFetchRequest(groups=(OffsetFetchRequestGroup(group_id=group, topics=(
        OffsetFetchRequestTopics(name=topic, partition_indexes=(i32(0), i32(1))),)),), require_stable=True)
    answer = until_answered(cluster, broker_id, request, lambda r: [g.error_code for g in r.groups],
                            f"OffsetFetch({group})")
    return {int(p.partition_index): (int(p.committed_offset), p.error_code)
            for t in answer.groups[0].topics for p in t.partitions}


def test_committed_and_open_transactional_offsets_move_with_the_coordinator(zk_connect, tmp_path):
    topic = f"t-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    offsets_partition = partition_for_group(group, OFFSETS_PARTITIONS)
    partition_errors = lambda r: [p.error_code for t in r.topics for p in t.partitions]  # noqa: E731
    marker_errors = lambda r: [p.error_code for m in r.markers for t in m.topics for p in t.partitions]  # noqa: E731

    with BrokerCluster(zk_connect, tmp_path, n=3, overrides=OVERRIDES) as cluster:
        cluster.create_topic(topic, partitions=2, replication_factor=3)
        wait_until(lambda: _coordinator_or_none(cluster, group) is not None, "a coordinator for the group", FAILOVER_S)
        coordinator = cluster.find_coordinator(group)
        cluster.wait_for_isr(OFFSETS_TOPIC, offsets_partition, [1, 2, 3])

        answer = until_answered(cluster, coordinator, txn_commit(group, topic, {0: 11, 1: 12}, 7001), partition_errors,
                                "TxnOffsetCommit A")
        assert partition_errors(answer) == [ErrorCode.none, ErrorCode.none]
        answer = until_answered(cluster, coordinator, commit_marker(offsets_partition, 7001), marker_errors,
                                "COMMIT marker A")
        assert marker_errors(answer) == [ErrorCode.none]
        answer = until_answered(cluster, coordinator, txn_commit(group, topic, {1: 30}, 7002), partition_errors,
                                "TxnOffsetCommit B")
        assert partition_errors(answer) == [ErrorCode.none]
        assert fetch(cluster, coordinator, group, topic) == {0: (11, ErrorCode.none),
                                                             1: (-1, ErrorCode.unstable_offset_commit)}

        cluster.kill(coordinator)
        successor = cluster.wait_for_leader(OFFSETS_TOPIC, offsets_partition, exclude={coordinator},
                                            timeout=FAILOVER_S)
        wait_until(lambda: _coordinator_or_none(cluster, group) == successor,
                   f"broker {successor} to coordinate {group}", FAILOVER_S)

        assert fetch(cluster, successor, group, topic) == {0: (11, ErrorCode.none),
                                                           1: (-1, ErrorCode.unstable_offset_commit)}
        answer = until_answered(cluster, successor, commit_marker(offsets_partition, 7002), marker_errors,
                                "COMMIT marker B")
        assert marker_errors(answer) == [ErrorCode.none]
        assert fetch(cluster, successor, group, topic) == {0: (11, ErrorCode.none), 1: (30, ErrorCode.none)}


def _coordinator_or_none(cluster: BrokerCluster, group: str) -> int | None:
    try:
        return cluster.find_coordinator(group)
    except (AssertionError, OSError, ProtocolError):
        return None

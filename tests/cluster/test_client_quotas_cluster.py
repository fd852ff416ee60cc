"""Client quotas on a 3-broker cluster: a quota altered through one broker is stored as Kafka stores it
(/config/clients|users znodes with a change notification; a user's SCRAM credentials in the same znode kept),
described by the others and enforced by them within seconds."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install kazoo, or the project's test extra)")

from broker_cluster import BrokerCluster, wait_until  # noqa: E402 - also puts tests/integration on sys.path
from kio.schema.errors import ErrorCode  # noqa: E402
from quota_wire import Wire, alter, describe, described, produce_request, throttle_ms  # noqa: E402

TIMEOUT = 60.0


def test_a_quota_set_through_one_broker_is_stored_in_zookeeper_and_enforced_by_the_others(zk_connect, tmp_path):
    with BrokerCluster(zk_connect, tmp_path, n=3) as cluster:
        topic = "quota-cluster"
        cluster.create_topic(topic, partitions=1, replication_factor=3)
        leader = cluster.wait_for_leader(topic, 0)
        other = next(i for i in (1, 2, 3) if i != leader)
        third = next(i for i in (1, 2, 3) if i not in (leader, other))
        brokers = cluster.brokers
        # A user whose SCRAM credential is in its znode (as kafka-configs.sh --zookeeper or the SCRAM API wrote it)
        credential = "salt=c2FsdA==,stored_key=c3RvcmVk,server_key=c2VydmVy,iterations=4096"
        cluster.zk().create("/config/users/alice", json.dumps(
            {"version": 1, "config": {"SCRAM-SHA-256": credential}}).encode(), makepath=True)

        admin = Wire(brokers[other], "admin")
        try:
            assert alter(admin, {"client_id": "limited"}, {"producer_byte_rate": 1000}) == (ErrorCode.none, None)
            assert alter(admin, {"user": "alice"}, {"consumer_byte_rate": 2048}) == (ErrorCode.none, None)
        finally:
            admin.close()
        assert cluster.zk_json("/config/clients/limited") == {"version": 1, "config": {"producer_byte_rate": "1000"}}
        assert cluster.zk_json("/config/users/alice") == {
            "version": 1, "config": {"SCRAM-SHA-256": credential, "consumer_byte_rate": "2048"}}
        notifications = [cluster.zk_json(f"/config/changes/{child}")
                         for child in cluster.zk().get_children("/config/changes")]
        assert {"version": 2, "entity_path": "clients/limited"} in notifications

        def described_by(broker_id: int) -> dict:
            wire = Wire(brokers[broker_id], "admin")
            try:
                return described(describe(wire, [("client-id", 0, "limited")]))
            finally:
                wire.close()

        wait_until(lambda: described_by(third) == {(("client-id", "limited"),): {"producer_byte_rate": 1000.0}},
                   f"broker {third} describes the quota set through broker {other}", TIMEOUT)

        def throttled_by_leader() -> bool:
            wire = Wire(brokers[leader], "limited")
            try:
                response = wire.request(produce_request(topic, 30_000, acks=1))
                assert response.responses[0].partition_responses[0].error_code == ErrorCode.none
                return throttle_ms(response) > 0
            finally:
                wire.close()

        # The leader learnt the quota from the change notification: 30 kB over 1 kB/s is throttled.
        wait_until(throttled_by_leader, f"broker {leader} (the leader) throttles the limited client", TIMEOUT)
        unlimited = Wire(brokers[leader], "unlimited")
        try:
            assert throttle_ms(unlimited.request(produce_request(topic, 30_000, acks=1))) == 0
        finally:
            unlimited.close()

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


def test_replication_is_exempt_from_client_quotas_acks_all_completes_and_the_isr_stays_full(zk_connect, tmp_path):
    """clients/<default> with consumer_byte_rate=1 and request_percentage=0.01 holds every client id, the brokers'
    own too: their follower fetches and inter-broker requests are exempt (Kafka's sendResponseExemptThrottle and
    the follower fetch's replication quota), so acks=all produces complete and no follower falls out of the ISR
    (replica.lag.time.max.ms is 2 s here)."""
    import time

    with BrokerCluster(zk_connect, tmp_path, n=3, overrides={"replica.lag.time.max.ms": 2000}) as cluster:
        topic = "quota-exempt"
        cluster.create_topic(topic, partitions=1, replication_factor=3)
        leader = cluster.wait_for_leader(topic, 0)
        cluster.wait_for_isr(topic, 0, {1, 2, 3})
        brokers = cluster.brokers
        admin = Wire(brokers[leader], "admin")
        try:
            assert alter(admin, {"client_id": None}, {"consumer_byte_rate": 1, "request_percentage": 0.01}) == (
                ErrorCode.none, None)
        finally:
            admin.close()

        def known_by(broker_id: int) -> bool:
            wire = Wire(brokers[broker_id], "admin")
            try:
                return described(describe(wire, [("client-id", 1, None)])) == {
                    (("client-id", None),): {"consumer_byte_rate": 1.0, "request_percentage": 0.01}}
            finally:
                wire.close()

        for broker_id in (1, 2, 3):
            wait_until(lambda: known_by(broker_id), f"broker {broker_id} knows the default client quota", TIMEOUT)
        # Three times replica.lag.time.max.ms of acks=all produces (each on a new connection: the producer itself
        # is throttled by request_percentage, and its connection muted), every one acknowledged by the full ISR.
        end = time.monotonic() + 6.0
        produced = 0
        while time.monotonic() < end or produced < 3:
            wire = Wire(brokers[leader], "producer")
            try:
                response = wire.request(produce_request(topic, 10_000, acks=-1))
            finally:
                wire.close()
            assert response.responses[0].partition_responses[0].error_code == ErrorCode.none, response
            produced += 1
            info = cluster.partition(topic, 0, via=leader)
            assert set(info.isr) == {1, 2, 3}, info

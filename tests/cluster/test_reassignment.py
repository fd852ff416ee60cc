"""Partition reassignment on a 3-broker cluster: Kafka 3.7.1's kafka-reassign-partitions.sh (generate, execute,
verify), AlterPartitionReassignments / ListPartitionReassignments v0 on the wire (errors, cancel, the
controller-only rule), a controller killed in the middle, and replication throttles (--throttle, --verify).

confluent-kafka's AdminClient (2.16) has no alter_partition_reassignments: the API is exercised through the
tool and raw requests.

Run: python3 -m pytest -q tests/cluster/test_reassignment.py
"""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.alter_partition_reassignments.v0.request import (
    AlterPartitionReassignmentsRequest,
    ReassignablePartition,
    ReassignableTopic,
)
from kio.schema.errors import ErrorCode
from kio.schema.list_partition_reassignments.v0.request import (
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsTopics,
)

from broker_cluster import BrokerCluster, send_request, wait_until
from kafka_tools import KafkaTools, find_refkit, kafka_tools_or_skip, unavailable_reason
from pykbroker.cluster.reassignment import REASSIGN_PARTITIONS_PATH
from pykbroker.cluster.zookeeper import encode_topic_assignment, encode_topic_config, topic_config_path, topic_path
from pykbroker.config import ConfigSource
from test_dynamic_configs_cluster import BROKER as BROKER_RESOURCE
from test_dynamic_configs_cluster import TOPIC as TOPIC_RESOURCE
from test_dynamic_configs_cluster import describe  # (value, source) as one broker serves a config, None on error

RECORDS = 300
TIMEOUT_S = 90.0
# Replication throttles (Kafka's ReplicationQuotaManager, replication/quota.py), Kafka's defaults:
QUOTA_WINDOWS, QUOTA_WINDOW_S = 11, 1.0  # replication.quota.window.num, replication.quota.window.size.seconds
FETCH_MAX_BYTES = 1_048_588  # the most one replica fetch carries of a partition: replica.fetch.max.bytes (1 MiB),
#                              or a first batch larger than that, at most message.max.bytes (1 MiB + 12)
THROTTLE_RATE = 100_000  # B/s
THROTTLED_RECORDS = 12_000  # values of ~213 B: ~2.6 MB


def min_throttled_copy_s(data_bytes: int, rate: float) -> float:
    """A lower bound of how long a throttled copy of ``data_bytes`` takes, from the first byte the new follower's
    quota records (it records nothing else) to its last fetch. The quota is checked BEFORE a fetch, which then
    carries up to FETCH_MAX_BYTES, and Kafka's Rate divides the bytes of the live windows by QUOTA_WINDOWS - 1
    whole windows plus the current fraction at least, which stays below QUOTA_WINDOWS × QUOTA_WINDOW_S until the
    first window expires: until then a fetch is let through only while fewer than rate × QUOTA_WINDOWS ×
    QUOTA_WINDOW_S bytes were copied. With more than that plus one fetch to copy, the last fetch waits for the
    first window to expire. (A smaller copy can go through in one burst with no wait at all, as in Kafka.)"""
    burst = rate * QUOTA_WINDOWS * QUOTA_WINDOW_S
    assert data_bytes - FETCH_MAX_BYTES >= burst, f"{data_bytes} B are too few to show a throttle of {rate} B/s"
    return QUOTA_WINDOWS * QUOTA_WINDOW_S


def start_cluster(zk_connect, tmp_path, **overrides) -> BrokerCluster:
    """Three brokers (started by the ``with`` block)."""
    return BrokerCluster(zk_connect, tmp_path, n=3, overrides={"zookeeper.session.timeout.ms": 6000, **overrides},
                         keep_files=bool(os.environ.get("KEEP")))


def kafka_tools_or_none() -> KafkaTools | None:
    return None if unavailable_reason(find_refkit()) else KafkaTools(find_refkit())


def create_placed_topic(cluster: BrokerCluster, name: str, assignment: dict[int, list[int]]) -> None:
    """A topic with exactly this replica placement, written to ZooKeeper as Kafka's AdminZkClient does."""
    zk = cluster.zk()
    zk.create(topic_config_path(name), encode_topic_config({}), makepath=True)
    zk.create(topic_path(name), encode_topic_assignment(assignment, uuid.uuid4()), makepath=True)
    for index, replicas in assignment.items():
        cluster.wait_for_isr(name, index, replicas, TIMEOUT_S)


def produce(cluster: BrokerCluster, topic: str, partitions: int, count: int = RECORDS) -> list[bytes]:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
    values = [f"record-{i}-{'x' * 200}".encode() for i in range(count)]
    failures = []
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=i % partitions,
                         on_delivery=lambda err, msg: err is not None and failures.append(err))
    assert producer.flush(60) == 0
    assert not failures, failures
    return values


def consume_all(cluster: BrokerCluster, topic: str, partitions: int, expected: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"check-{uuid.uuid4()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < expected and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
        return got
    finally:
        consumer.close()


def partition_dirs(cluster: BrokerCluster, broker_id: int, topic: str) -> list[str]:
    data = cluster.brokers[broker_id].data_dir
    return sorted(p.name for p in data.iterdir() if p.name.startswith(f"{topic}-")) if data.exists() else []


def wait_moved(cluster: BrokerCluster, topic: str, targets: dict[int, list[int]]) -> None:
    def moved():
        for index, target in targets.items():
            info = cluster._agreed(lambda b: cluster.partition(topic, index, b))
            if info is None or list(info.replicas) != target or not set(info.isr) <= set(target) \
                    or info.leader not in target:
                return False
        return True

    try:
        wait_until(moved, f"{topic} moved to {targets}", TIMEOUT_S)
    except AssertionError as exc:
        views = {b: [cluster.partition(topic, i, b) for i in targets] for b in sorted(cluster.live_ids())}
        raise AssertionError(f"{exc}; brokers see {views}") from None


def alter(cluster: BrokerCluster, via: int, moves: dict[tuple[str, int], list[int] | None]):
    by_topic: dict[str, list] = {}
    for (topic, index), replicas in moves.items():
        by_topic.setdefault(topic, []).append(ReassignablePartition(
            partition_index=index, replicas=None if replicas is None else tuple(replicas)))
    request = AlterPartitionReassignmentsRequest(
        topics=tuple(ReassignableTopic(name=t, partitions=tuple(ps)) for t, ps in by_topic.items()))
    return send_request(cluster.brokers[via].address, request, timeout=30)


def partition_errors(response) -> dict[tuple[str, int], tuple[ErrorCode, str | None]]:
    return {(t.name, int(p.partition_index)): (p.error_code, p.error_message)
            for t in response.responses for p in t.partitions}


def list_ongoing(cluster: BrokerCluster, via: int, topics: dict[str, list[int]] | None = None):
    request = ListPartitionReassignmentsRequest(topics=None if topics is None else tuple(
        ListPartitionReassignmentsTopics(name=t, partition_indexes=tuple(ps)) for t, ps in topics.items()))
    return send_request(cluster.brokers[via].address, request, timeout=30)


@pytest.mark.timeout(420)
def test_kafka_reassign_partitions_moves_replicas_with_their_data(zk_connect, tmp_path):
    tools = kafka_tools_or_skip()
    topic = "moving"
    with start_cluster(zk_connect, tmp_path) as cluster:
        create_placed_topic(cluster, topic, {0: [1, 2], 1: [2, 1]})
        values = produce(cluster, topic, 2)
        assert partition_dirs(cluster, 1, topic) == [f"{topic}-0", f"{topic}-1"]

        moves = tmp_path / "topics.json"
        moves.write_text(json.dumps({"version": 1, "topics": [{"topic": topic}]}))
        out = tools.run("kafka-reassign-partitions.sh", "--bootstrap-server", cluster.bootstrap,
                        "--topics-to-move-json-file", str(moves), "--broker-list", "2,3", "--generate").stdout
        assert "Current partition replica assignment" in out and "Proposed partition reassignment" in out
        current = json.loads(out.split("Current partition replica assignment")[1].split("\n")[1])
        assert {(p["partition"], tuple(p["replicas"])) for p in current["partitions"]} == {(0, (1, 2)), (1, (2, 1))}
        proposed = json.loads(out.split("Proposed partition reassignment configuration")[1].split("\n")[1])
        assert all(set(p["replicas"]) == {2, 3} for p in proposed["partitions"])

        plan = tmp_path / "plan.json"
        targets = {0: [2, 3], 1: [3, 2]}
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": topic, "partition": p, "replicas": r, "log_dirs": ["any", "any"]} for p, r in targets.items()]}))
        out = tools.run("kafka-reassign-partitions.sh", "--bootstrap-server", cluster.bootstrap,
                        "--reassignment-json-file", str(plan), "--execute").stdout
        assert "Successfully started partition reassignments" in out, out

        def verified():
            # --preserve-throttles: without it --verify clears throttles through IncrementalAlterConfigs.
            done = tools.run("kafka-reassign-partitions.sh", "--bootstrap-server", cluster.bootstrap,
                             "--reassignment-json-file", str(plan), "--verify", "--preserve-throttles").stdout
            return all(f"Reassignment of partition {topic}-{p} is completed" in done for p in targets)

        wait_until(verified, "the tool to report the reassignment completed", TIMEOUT_S * 2)
        wait_moved(cluster, topic, targets)
        wait_until(lambda: partition_dirs(cluster, 1, topic) == [], "broker 1's partition dirs to go", TIMEOUT_S)
        assert partition_dirs(cluster, 3, topic) == [f"{topic}-0", f"{topic}-1"]
        assert cluster.zk_json(topic_path(topic))["adding_replicas"] == {}
        assert cluster.zk_json(topic_path(topic))["removing_replicas"] == {}
        assert sorted(consume_all(cluster, topic, 2, len(values))) == sorted(values)
        assert list_ongoing(cluster, cluster.controller_id()).topics == ()


@pytest.mark.timeout(300)
def test_reassignment_api_errors_cancel_and_not_controller(zk_connect, tmp_path):
    topic = "errs"
    # A long session (the test ZooKeeper's maximum): the paused broker stays registered (alive) while the tools
    # run, however slow the machine. Were it declared dead,
    # the cancel's StopReplica would never reach it and its copy would stay behind, as in Kafka.
    with start_cluster(zk_connect, tmp_path, **{"zookeeper.session.timeout.ms": 60000}) as cluster:
        controller = cluster.controller_id()
        other = next(b for b in (1, 2, 3) if b != controller)  # the new replica, paused: it cannot catch up
        a, b = [x for x in (1, 2, 3) if x != other]
        create_placed_topic(cluster, topic, {0: [a, b], 1: [a, b]})

        answer = alter(cluster, other, {(topic, 0): [b, other]})
        assert answer.error_code == ErrorCode.not_controller and answer.responses == ()
        assert list_ongoing(cluster, other).error_code == ErrorCode.not_controller

        answer = partition_errors(alter(cluster, controller, {
            (topic, 0): [], (topic, 1): [b, b], ("nope", 0): [a, b], (topic, 7): [a, b],
        }))
        assert answer[(topic, 0)][0] == ErrorCode.invalid_replica_assignment
        assert answer[(topic, 1)] == (ErrorCode.invalid_replica_assignment,
                                      f"Duplicate replica ids in partition reassignment replica list: List({b}, {b})")
        assert answer[("nope", 0)] == (ErrorCode.unknown_topic_or_partition, "The partition does not exist.")
        assert answer[(topic, 7)][0] == ErrorCode.unknown_topic_or_partition
        answer = partition_errors(alter(cluster, controller, {(topic, 0): [a, 9], (topic, 1): [-1, b]}))
        assert answer[(topic, 0)][0] == ErrorCode.invalid_replica_assignment
        assert "not alive" in answer[(topic, 0)][1]
        assert answer[(topic, 1)][0] == ErrorCode.invalid_replica_assignment
        answer = partition_errors(alter(cluster, controller, {(topic, 0): None}))
        assert answer[(topic, 0)][0] == ErrorCode.no_reassignment_in_progress

        # A reassignment that cannot finish (the new replica's broker paused), listed, then cancelled.
        produce(cluster, topic, 2, 50)
        cluster.pause(other)
        try:
            answer = partition_errors(alter(cluster, controller, {(topic, 0): [b, other]}))
            assert answer == {(topic, 0): (ErrorCode.none, None)}
            ongoing = list_ongoing(cluster, controller).topics
            assert [(t.name, [(int(p.partition_index), list(p.replicas), list(p.adding_replicas),
                               list(p.removing_replicas)) for p in t.partitions]) for t in ongoing] == \
                [(topic, [(0, [b, other, a], [other], [a])])]
            assert list_ongoing(cluster, controller, {topic: [1]}).topics == ()
            stored = cluster.zk_json(topic_path(topic))
            assert stored["partitions"]["0"] == [b, other, a]
            assert stored["adding_replicas"] == {"0": [other]} and stored["removing_replicas"] == {"0": [a]}
            info = cluster.partition(topic, 0, via=controller)
            assert list(info.replicas) == [b, other, a] and other not in info.isr

            tools = kafka_tools_or_none()
            if tools is not None:  # kafka-reassign-partitions.sh --cancel, then the same cancel again on the wire
                # The tools talk to the running brokers, and give up quickly on the paused one should they
                # pick it from the metadata.
                running = ",".join(cluster.brokers[x].bootstrap for x in (a, b))
                quick = tmp_path / "admin.properties"
                quick.write_text("request.timeout.ms=3000\n")
                described = tools.run("kafka-topics.sh", "--bootstrap-server", running, "--describe",
                                      "--topic", topic, "--command-config", str(quick)).stdout
                line = next(x for x in described.splitlines() if "Partition: 0" in x)
                assert f"Adding Replicas: {other}" in line and f"Removing Replicas: {a}" in line, described
                plan = tmp_path / "plan.json"
                plan.write_text(json.dumps({"version": 1, "partitions": [
                    {"topic": topic, "partition": 0, "replicas": [b, other]}]}))
                out = tools.run("kafka-reassign-partitions.sh", "--bootstrap-server", running,
                                "--reassignment-json-file", str(plan), "--cancel", "--preserve-throttles",
                                "--command-config", str(quick)).stdout
                assert f"Successfully cancelled partition reassignment for: {topic}-0" in out, out
                answer = partition_errors(alter(cluster, controller, {(topic, 0): None}))
                assert answer[(topic, 0)][0] == ErrorCode.no_reassignment_in_progress
            else:
                answer = partition_errors(alter(cluster, controller, {(topic, 0): None}))
                assert answer == {(topic, 0): (ErrorCode.none, None)}
        finally:
            cluster.resume(other)
        # As Kafka's ReplicaAssignment.reassignTo: the origin replicas come back in the full set's order.
        wait_moved(cluster, topic, {0: [b, a]})
        assert list_ongoing(cluster, controller).topics == ()
        stored = cluster.zk_json(topic_path(topic))
        assert stored["partitions"]["0"] == [b, a] and stored["adding_replicas"] == {}
        wait_until(lambda: partition_dirs(cluster, other, topic) == [], "the cancelled replica to go", TIMEOUT_S)

        # The legacy way (tools before 2.4): a document at /admin/reassign_partitions, deleted when done; an
        # unknown partition in it fails and leaves the document at once.
        cluster.zk().create(REASSIGN_PARTITIONS_PATH, json.dumps({"version": 1, "partitions": [
            {"topic": topic, "partition": 1, "replicas": [b, other]},
            {"topic": "nope", "partition": 0, "replicas": [b, other]}]}).encode())
        wait_moved(cluster, topic, {1: [b, other]})
        wait_until(lambda: not cluster.zk().exists(REASSIGN_PARTITIONS_PATH), "the document to go", TIMEOUT_S)
        assert cluster.zk_json(topic_path(topic))["partitions"]["1"] == [b, other]
        wait_until(lambda: partition_dirs(cluster, a, topic) == [f"{topic}-0"], "the moved replica to go", TIMEOUT_S)


@pytest.mark.timeout(420)
def test_reassignment_completes_after_the_controller_is_killed_midway(zk_connect, tmp_path):
    topic = "failover"
    # Small fetches: broker 3 needs many rounds to copy the log, so the controller dies mid-reassignment.
    with start_cluster(zk_connect, tmp_path, **{"replica.fetch.max.bytes": 2048,
                                                "replica.fetch.response.max.bytes": 2048}) as cluster:
        controller = cluster.controller_id()
        keep = [b for b in (1, 2, 3) if b != controller]
        create_placed_topic(cluster, topic, {0: [controller, keep[0]]})
        values = produce(cluster, topic, 1, 2000)
        target = [keep[0], keep[1]]
        cluster.pause(keep[1])  # the new replica waits while the controller dies
        try:
            answer = partition_errors(alter(cluster, controller, {(topic, 0): target}))
            assert answer == {(topic, 0): (ErrorCode.none, None)}
            assert cluster.zk_json(topic_path(topic))["adding_replicas"] == {"0": [keep[1]]}
            cluster.kill(controller)
        finally:
            cluster.resume(keep[1])
        new_controller = cluster.wait_for_controller(exclude={controller}, timeout=TIMEOUT_S)
        assert new_controller in keep
        wait_moved(cluster, topic, {0: target})
        wait_until(lambda: cluster.zk_json(topic_path(topic))["adding_replicas"] == {},
                   "ZooKeeper to show the reassignment done", TIMEOUT_S)
        assert cluster.zk_json(topic_path(topic))["partitions"]["0"] == target
        assert sorted(consume_all(cluster, topic, 1, len(values))) == sorted(values)


@pytest.mark.timeout(420)
def test_kafka_reassign_partitions_throttle_slows_the_copy_and_verify_clears_it(zk_connect, tmp_path):
    """END-TO-END --throttle: the tool sets the topic's throttled replicas and every broker's rates through
    IncrementalAlterConfigs before it submits the move; the copy then takes at least min_throttled_copy_s; --verify
    clears the rates on every broker and the topic's lists, as Kafka's tool does (clearAllThrottles)."""
    tools = kafka_tools_or_skip()
    topic = "throttled"
    with start_cluster(zk_connect, tmp_path) as cluster:
        address = {i: broker.address for i, broker in cluster.brokers.items()}
        create_placed_topic(cluster, topic, {0: [1, 2]})
        values = produce(cluster, topic, 1, THROTTLED_RECORDS)
        minimum = min_throttled_copy_s(sum(map(len, values)), THROTTLE_RATE)
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": topic, "partition": 0, "replicas": [2, 3]}]}))
        started = time.monotonic()  # before the tool: the copy cannot start earlier
        out = tools.run("kafka-reassign-partitions.sh", "--bootstrap-server", cluster.bootstrap,
                        "--reassignment-json-file", str(plan), "--execute", "--throttle", str(THROTTLE_RATE)).stdout
        assert f"The inter-broker throttle limit was set to {THROTTLE_RATE} B/s" in out, out
        configs = cluster.zk_json(topic_config_path(topic))["config"]
        assert configs["leader.replication.throttled.replicas"] == "0:1,0:2"  # the current replicas
        assert configs["follower.replication.throttled.replicas"] == "0:3"  # the one being added
        for broker_id in (1, 2, 3):  # each broker got its own rates, and serves them as dynamic configs
            stored = cluster.zk_json(f"/config/brokers/{broker_id}")["config"]
            for side in ("leader", "follower"):
                assert stored[f"{side}.replication.throttled.rate"] == str(THROTTLE_RATE)
                served = describe(address[broker_id], BROKER_RESOURCE, str(broker_id),
                                  f"{side}.replication.throttled.rate")
                assert served == (str(THROTTLE_RATE), ConfigSource.DYNAMIC_BROKER_CONFIG), (broker_id, side, served)
        wait_moved(cluster, topic, {0: [2, 3]})
        elapsed = time.monotonic() - started
        assert elapsed >= minimum, f"the copy was not throttled: {elapsed:.1f} s, at least {minimum} s expected"

        def verified():
            done = tools.run("kafka-reassign-partitions.sh", "--bootstrap-server", cluster.bootstrap,
                             "--reassignment-json-file", str(plan), "--verify").stdout
            return (f"Reassignment of partition {topic}-0 is completed" in done
                    and "Clearing broker-level throttles on brokers 1,2,3" in done
                    and f"Clearing topic-level throttles on topic {topic}" in done)

        wait_until(verified, "--verify to report completion and clear the throttles", TIMEOUT_S)
        configs = cluster.zk_json(topic_config_path(topic))["config"]
        assert "leader.replication.throttled.replicas" not in configs and \
            "follower.replication.throttled.replicas" not in configs, configs
        for broker_id in (1, 2, 3):  # the rates are gone from ZooKeeper and from every broker's configs
            stored = cluster.zk_json(f"/config/brokers/{broker_id}")["config"]
            assert not any(name.endswith(".replication.throttled.rate") for name in stored), stored
            for side in ("leader", "follower"):
                wait_until(lambda: describe(address[broker_id], BROKER_RESOURCE, str(broker_id),
                                            f"{side}.replication.throttled.rate")
                           == (str(2**63 - 1), ConfigSource.DEFAULT_CONFIG),  # Long.MAX_VALUE: unlimited
                           f"broker {broker_id}'s {side} rate to be unlimited again", TIMEOUT_S)
                wait_until(lambda: describe(address[broker_id], TOPIC_RESOURCE, topic,
                                            f"{side}.replication.throttled.replicas")
                           == ("", ConfigSource.DEFAULT_CONFIG),
                           f"broker {broker_id} to see the topic's {side} throttled replicas cleared", TIMEOUT_S)
        assert sorted(consume_all(cluster, topic, 1, len(values))) == sorted(values)


@pytest.mark.timeout(420)
def test_throttled_replicas_copy_at_the_configured_rate(zk_connect, tmp_path):
    """The throttle on real replication: rates as static broker configs, throttled replicas as topic configs
    (in place on the leader and the new follower before the move starts)."""
    topic = "slow"
    with start_cluster(zk_connect, tmp_path, **{"leader.replication.throttled.rate": THROTTLE_RATE,
                                                "follower.replication.throttled.rate": THROTTLE_RATE}) as cluster:
        create_placed_topic(cluster, topic, {0: [1, 2]})
        zk = cluster.zk()
        zk.set(topic_config_path(topic), encode_topic_config({
            "leader.replication.throttled.replicas": "0:1,0:2", "follower.replication.throttled.replicas": "0:3"}))
        zk.create("/config/changes/config_change_", json.dumps(
            {"version": 2, "entity_path": f"topics/{topic}"}).encode(), sequence=True, makepath=True)
        for broker_id, side, replicas in ((1, "leader", "0:1,0:2"), (3, "follower", "0:3")):
            wait_until(lambda: describe(cluster.brokers[broker_id].address, TOPIC_RESOURCE, topic,
                                        f"{side}.replication.throttled.replicas")
                       == (replicas, ConfigSource.DYNAMIC_TOPIC_CONFIG),
                       f"broker {broker_id} to see the {side} throttled replicas", TIMEOUT_S)
        values = produce(cluster, topic, 1, THROTTLED_RECORDS)
        minimum = min_throttled_copy_s(sum(map(len, values)), THROTTLE_RATE)
        started = time.monotonic()
        assert partition_errors(alter(cluster, cluster.controller_id(), {(topic, 0): [2, 3]})) == {
            (topic, 0): (ErrorCode.none, None)}
        wait_moved(cluster, topic, {0: [2, 3]})
        elapsed = time.monotonic() - started
        assert elapsed >= minimum, f"{sum(map(len, values))} B copied in {elapsed:.1f} s: not throttled"
        assert sorted(consume_all(cluster, topic, 1, len(values))) == sorted(values)

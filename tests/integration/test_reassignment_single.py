"""AlterPartitionReassignments / ListPartitionReassignments v0 on a single broker (embedded metadata, no
controller): advertised; a reassignment to this broker alone completes at once, anything else is
INVALID_REPLICA_ASSIGNMENT; nothing is ever in progress. Kafka 3.7.1's kafka-reassign-partitions.sh runs
against it (execute, verify), and kafka-topics.sh --describe (which lists reassignments) works.

Run: python3 -m pytest -q tests/integration/test_reassignment_single.py
"""

from __future__ import annotations

import json

from confluent_kafka.admin import AdminClient, NewTopic
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

from broker_process import probe_api_versions, send_request
from kafka_tools import kafka_tools_or_skip

OWN_ID = 1  # pykbroker's default broker.id


def create(broker, topic: str, partitions: int = 2) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def alter(broker, moves: dict[tuple[str, int], list[int] | None]) -> dict:
    by_topic: dict[str, list] = {}
    for (topic, index), replicas in moves.items():
        by_topic.setdefault(topic, []).append(ReassignablePartition(
            partition_index=index, replicas=None if replicas is None else tuple(replicas)))
    response = send_request(broker.address, AlterPartitionReassignmentsRequest(
        topics=tuple(ReassignableTopic(name=t, partitions=tuple(ps)) for t, ps in by_topic.items())), timeout=10)
    assert response.error_code == ErrorCode.none
    return {(t.name, int(p.partition_index)): (p.error_code, p.error_message)
            for t in response.responses for p in t.partitions}


def test_both_apis_are_advertised_and_answer_as_a_broker_that_cannot_move_anything(broker, topic_name):
    versions = {int(k.api_key): (int(k.min_version), int(k.max_version))
                for k in probe_api_versions(broker.address).api_keys}
    assert versions[45] == (0, 0) and versions[46] == (0, 0)
    create(broker, topic_name)

    answer = alter(broker, {
        (topic_name, 0): [OWN_ID], (topic_name, 1): [OWN_ID, 2], (topic_name, 5): [OWN_ID],
        ("no-such-topic", 0): [OWN_ID],
    })
    assert answer[(topic_name, 0)] == (ErrorCode.none, None)
    assert answer[(topic_name, 1)][0] == ErrorCode.invalid_replica_assignment
    assert "not alive" in answer[(topic_name, 1)][1]
    assert answer[(topic_name, 5)] == (ErrorCode.unknown_topic_or_partition, "The partition does not exist.")
    assert answer[("no-such-topic", 0)][0] == ErrorCode.unknown_topic_or_partition

    answer = alter(broker, {(topic_name, 0): [], (topic_name, 1): [OWN_ID, OWN_ID]})
    assert answer[(topic_name, 0)] == (ErrorCode.invalid_replica_assignment,
                                       "Empty replica list specified in partition reassignment.")
    assert answer[(topic_name, 1)][0] == ErrorCode.invalid_replica_assignment
    answer = alter(broker, {(topic_name, 0): [7], (topic_name, 1): None})
    assert answer[(topic_name, 0)][0] == ErrorCode.invalid_replica_assignment
    assert answer[(topic_name, 1)] == (ErrorCode.no_reassignment_in_progress,
                                       f"No reassignment in progress for partition {topic_name}-1")

    for topics in (None, (ListPartitionReassignmentsTopics(name=topic_name, partition_indexes=(0, 1)),)):
        listed = send_request(broker.address, ListPartitionReassignmentsRequest(topics=topics), timeout=10)
        assert listed.error_code == ErrorCode.none and listed.topics == ()


def test_kafka_reassign_partitions_and_describe_run_against_a_single_broker(broker, topic_name, tmp_path):
    tools = kafka_tools_or_skip()
    create(broker, topic_name)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": topic_name, "partition": p, "replicas": [OWN_ID]} for p in (0, 1)]}))
    out = tools.run("kafka-reassign-partitions.sh", "--bootstrap-server", broker.bootstrap,
                    "--reassignment-json-file", str(plan), "--execute").stdout
    assert "Successfully started partition reassignments" in out
    out = tools.run("kafka-reassign-partitions.sh", "--bootstrap-server", broker.bootstrap,
                    "--reassignment-json-file", str(plan), "--verify", "--preserve-throttles").stdout
    assert f"Reassignment of partition {topic_name}-0 is completed" in out
    assert f"Reassignment of partition {topic_name}-1 is completed" in out

    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": topic_name, "partition": 0, "replicas": [OWN_ID, 2]}]}))
    failed = tools.run("kafka-reassign-partitions.sh", "--bootstrap-server", broker.bootstrap,
                       "--reassignment-json-file", str(plan), "--execute", check=False)
    assert failed.returncode != 0 and "Unknown broker id" in failed.stdout + failed.stderr

"""Both kinds of group through the admin APIs, as raw kio messages: ListGroups v5's type and state filters and
its GroupType, ListGroups v4 listing consumer groups too, DescribeGroups of a consumer group (Dead, as Kafka 4
answers before v6), DeleteGroups (NON_EMPTY_GROUP, then deleted with its offsets) and OffsetDelete
(GROUP_SUBSCRIBED_TO_TOPIC for a subscribed topic) of a consumer group; the group counts
by type and state in the metrics."""

from __future__ import annotations

import datetime
import uuid

from kio.schema.consumer_group_heartbeat.v1 import request as heartbeat_v1
from kio.schema.delete_groups.v2 import request as delete_v2
from kio.schema.describe_groups.v5 import request as describe_v5
from kio.schema.list_groups.v4 import request as list_v4
from kio.schema.list_groups.v5 import request as list_v5
from kio.schema.offset_commit.v9 import request as commit_v9
from kio.schema.offset_delete.v0 import request as offset_delete_v0
from kio.schema.offset_fetch.v9 import request as fetch_v9

from broker_process import BrokerProcess, free_port, send_request
from test_metrics import scrape
from test_confluent_kafka import create_topic

from pykbroker.protocol.errors import ErrorCode

REBALANCE = datetime.timedelta(milliseconds=30_000)


def _listed(address, request):
    response = send_request(address, request)
    assert response.error_code == ErrorCode.none
    return {g.group_id: g for g in response.groups}


def _heartbeat(address, group, member_id, epoch, topics=None):
    return send_request(address, heartbeat_v1.ConsumerGroupHeartbeatRequest(
        group_id=group, member_id=member_id, member_epoch=epoch,
        rebalance_timeout=REBALANCE if epoch == 0 else datetime.timedelta(milliseconds=-1),
        subscribed_topic_names=topics, topic_partitions=() if epoch == 0 else None))


def test_list_describe_delete_both_kinds(shared_broker, topic_name):
    address = shared_broker.address
    create_topic(shared_broker.bootstrap, topic_name, 2)
    other_topic = f"{topic_name}-other"
    create_topic(shared_broker.bootstrap, other_topic, 1)
    tag = uuid.uuid4().hex[:8]
    consumer, classic = f"cg-{tag}", f"classic-{tag}"

    joined = _heartbeat(address, consumer, "m1", 0, (topic_name,))
    assert joined.error_code == ErrorCode.none and joined.member_epoch == 1
    # An offset of a topic the group does not read, committed by the member (v9, its epoch).
    committed = send_request(address, commit_v9.OffsetCommitRequest(
        group_id=consumer, generation_id_or_member_epoch=1, member_id="m1",
        topics=tuple(commit_v9.OffsetCommitRequestTopic(name=t, partitions=(
            commit_v9.OffsetCommitRequestPartition(partition_index=0, committed_offset=5, committed_metadata=""),))
            for t in (topic_name, other_topic))))
    assert {p.error_code for t in committed.topics for p in t.partitions} == {ErrorCode.none}
    # A classic group with offsets only ("simple": Empty, no protocol type).
    send_request(address, commit_v9.OffsetCommitRequest(
        group_id=classic, generation_id_or_member_epoch=-1, member_id="",
        topics=(commit_v9.OffsetCommitRequestTopic(name=topic_name, partitions=(
            commit_v9.OffsetCommitRequestPartition(partition_index=0, committed_offset=1, committed_metadata=""),)),)))

    # ListGroups v5: every group with its type; filtered by type and by state (case-insensitively).
    every = _listed(address, list_v5.ListGroupsRequest(states_filter=(), types_filter=()))
    assert (every[consumer].group_type, every[consumer].protocol_type) == ("consumer", "consumer")
    assert every[consumer].group_state in ("Stable", "Reconciling", "Assigning")
    assert (every[classic].group_type, every[classic].group_state) == ("classic", "Empty")
    consumers = _listed(address, list_v5.ListGroupsRequest(states_filter=(), types_filter=("Consumer",)))
    assert consumer in consumers and classic not in consumers
    classics = _listed(address, list_v5.ListGroupsRequest(states_filter=(), types_filter=("classic",)))
    assert classic in classics and consumer not in classics
    assert not _listed(address, list_v5.ListGroupsRequest(states_filter=(), types_filter=("share",)))
    assert not _listed(address, list_v5.ListGroupsRequest(states_filter=(), types_filter=("bogus",)))
    empty_consumers = _listed(address, list_v5.ListGroupsRequest(states_filter=("EMPTY",), types_filter=("consumer",)))
    assert consumer not in empty_consumers
    # ListGroups v4 (no types) lists the consumer group too, with its protocol type and state.
    v4 = _listed(address, list_v4.ListGroupsRequest(states_filter=()))
    assert v4[consumer].protocol_type == "consumer" and classic in v4

    # DescribeGroups before v6: a consumer group is Dead, with no error and no members (Kafka 4).
    (described,) = send_request(address, describe_v5.DescribeGroupsRequest(
        groups=(consumer,), include_authorized_operations=False)).groups
    assert (described.error_code, described.group_state, described.protocol_type, described.members) == (
        ErrorCode.none, "Dead", "", ())

    # OffsetDelete: the subscribed topic's partitions are refused, the other topic's offset goes.
    deleted = send_request(address, offset_delete_v0.OffsetDeleteRequest(group_id=consumer, topics=tuple(
        offset_delete_v0.OffsetDeleteRequestTopic(name=t, partitions=(
            offset_delete_v0.OffsetDeleteRequestPartition(partition_index=0),)) for t in (topic_name, other_topic))))
    assert deleted.error_code == ErrorCode.none
    assert {t.name: t.partitions[0].error_code for t in deleted.topics} == {
        topic_name: ErrorCode.group_subscribed_to_topic, other_topic: ErrorCode.none}

    def offsets():
        answer = send_request(address, fetch_v9.OffsetFetchRequest(groups=(fetch_v9.OffsetFetchRequestGroup(
            group_id=consumer, member_id=None, member_epoch=-1, topics=None),)))
        return {(t.name, p.partition_index): p.committed_offset for t in answer.groups[0].topics for p in t.partitions}

    assert offsets() == {(topic_name, 0): 5}

    # DeleteGroups: NON_EMPTY_GROUP while the member is there; once it left, the group and its offsets go.
    def delete(*groups):
        return {r.group_id: r.error_code
                for r in send_request(address, delete_v2.DeleteGroupsRequest(groups_names=groups)).results}

    assert delete(consumer) == {consumer: ErrorCode.non_empty_group}
    assert _heartbeat(address, consumer, "m1", -1).error_code == ErrorCode.none
    assert delete(consumer, classic, f"absent-{tag}") == {
        consumer: ErrorCode.none, classic: ErrorCode.none, f"absent-{tag}": ErrorCode.group_id_not_found}
    assert offsets() == {}
    remaining = _listed(address, list_v5.ListGroupsRequest(states_filter=(), types_filter=()))
    assert consumer not in remaining and classic not in remaining
    # The group id is free again: a heartbeat of an unknown member of a group that is gone.
    gone = _heartbeat(address, consumer, "m1", 1)
    assert gone.error_code == ErrorCode.group_id_not_found


def test_group_counts_by_type_and_state_in_the_metrics(tmp_path):
    """Kafka 4's group-coordinator-metrics (group-count by protocol, consumer-group-count by state) and the
    classic GroupMetadataManager gauges, scraped from /metrics."""
    port = free_port()
    with BrokerProcess(tmp_path / "broker", config={"metrics.port": port}) as broker:
        address = broker.address
        topic = f"metrics-{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap, topic, 1)
        assert _heartbeat(address, "cg-metrics", "m1", 0, (topic,)).error_code == ErrorCode.none
        send_request(address, commit_v9.OffsetCommitRequest(
            group_id="classic-metrics", generation_id_or_member_epoch=-1, member_id="",
            topics=(commit_v9.OffsetCommitRequestTopic(name=topic, partitions=(
                commit_v9.OffsetCommitRequestPartition(partition_index=0, committed_offset=1,
                                                       committed_metadata=""),)),)))
        samples = scrape(port)
        prefix = "kafka_server_group_coordinator_metrics"
        assert samples[(f"{prefix}_group_count", frozenset({("protocol", "consumer")}))] == 1
        assert samples[(f"{prefix}_group_count", frozenset({("protocol", "classic")}))] == 1
        assert {state: samples[(f"{prefix}_consumer_group_count", frozenset({("state", state)}))]
                for state in ("Empty", "Assigning", "Reconciling", "Stable", "Dead")} == {
            "Empty": 0, "Assigning": 0, "Reconciling": 0, "Stable": 1, "Dead": 0}
        assert samples[("kafka_coordinator_group_groupmetadatamanager_numgroups", frozenset())] == 1
        assert samples[("kafka_coordinator_group_groupmetadatamanager_numgroupsempty", frozenset())] == 1
        assert samples[("kafka_coordinator_group_groupmetadatamanager_numgroupsstable", frozenset())] == 0

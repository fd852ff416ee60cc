"""Admin APIs Kafka's tools and admin clients need, on a single broker: DeleteRecords, DescribeLogDirs,
DescribeProducers, DescribeTopicPartitions, ElectLeaders, manual replica assignments (CreateTopics,
CreatePartitions) and authorized operations (Metadata, DescribeCluster, DescribeGroups), over the raw
protocol (bad input and its error codes), through confluent-kafka's AdminClient, and with Kafka 3.7.1's own
tools where the reference kit exists."""

from __future__ import annotations

import datetime
import json

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AclOperation, NewPartitions, NewTopic
from kio.schema.create_partitions.v3 import request as cp
from kio.schema.create_topics.v7 import request as ct
from kio.schema.delete_records.v2 import request as dr
from kio.schema.describe_cluster.v1 import request as dc
from kio.schema.describe_log_dirs.v4 import request as dld
from kio.schema.describe_producers.v0 import request as dp
from kio.schema.describe_topic_partitions.v0 import request as dtp
from kio.schema.elect_leaders.v2 import request as el
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v10 import request as md10
from kio.static.primitive import i32, i64

from broker_process import list_offset, produce_raw, send_request
from pykbroker.protocol.records import build_batch
from pykbroker.server.handlers._operations import CLUSTER_OPERATIONS, NOT_REQUESTED, TOPIC_OPERATIONS

TIMEOUT = datetime.timedelta(seconds=10)
B = 1  # the test broker's id (broker.id's default)
TOPIC_OPS = {AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE, AclOperation.ALTER,
             AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
CLUSTER_OPS = {AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
               AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER, AclOperation.DESCRIBE}


def create(address, name, partitions=1, replication_factor=-1, assignments=(), validate_only=False):
    request = ct.CreateTopicsRequest(
        topics=(ct.CreatableTopic(
            name=name, num_partitions=partitions, replication_factor=replication_factor, configs=(),
            assignments=tuple(ct.CreatableReplicaAssignment(partition_index=i32(p), broker_ids=tuple(i32(b) for b in ids))
                              for p, ids in assignments)),),
        timeout=TIMEOUT, validate_only=validate_only)
    return send_request(address, request).topics[0]


def produce(address, topic, partition, count):
    for i in range(count):
        assert produce_raw(address, topic, partition, build_batch([(None, b"v%d" % i)])).error_code == ErrorCode.none


def delete_records(address, topic, offsets, timeout=TIMEOUT):
    response = send_request(address, dr.DeleteRecordsRequest(topics=(dr.DeleteRecordsTopic(name=topic, partitions=tuple(
        dr.DeleteRecordsPartition(partition_index=i32(p), offset=i64(o)) for p, o in offsets)),), timeout=timeout))
    return {p.partition_index: (p.error_code, p.low_watermark) for t in response.topics for p in t.partitions}


@pytest.fixture
def address(shared_broker):
    return shared_broker.address


# -- DeleteRecords ------------------------------------------------------------------------------------

def test_delete_records_moves_log_start_and_refuses_bad_offsets(address, topic_name):
    assert create(address, topic_name, partitions=2).error_code == ErrorCode.none
    produce(address, topic_name, 0, 10)
    produce(address, topic_name, 1, 4)
    assert delete_records(address, topic_name, [(0, 6), (1, -1)]) == {
        0: (ErrorCode.none, 6), 1: (ErrorCode.none, 4)}
    assert list_offset(address, topic_name, 0, -2) == 6
    assert list_offset(address, topic_name, 1, -2) == 4
    # below the current start: nothing changes; past the HWM or below -1: OFFSET_OUT_OF_RANGE
    assert delete_records(address, topic_name, [(0, 3)]) == {0: (ErrorCode.none, 6)}
    # a partition named twice: the last offset counts (Kafka collects them in a map)
    assert delete_records(address, topic_name, [(0, 8), (0, 11), (0, 7)]) == {0: (ErrorCode.none, 7)}
    assert delete_records(address, topic_name, [(0, 11)]) == {0: (ErrorCode.offset_out_of_range, -1)}
    assert delete_records(address, topic_name, [(0, -2)]) == {0: (ErrorCode.offset_out_of_range, -1)}
    assert delete_records(address, topic_name, [(7, 0)]) == {7: (ErrorCode.unknown_topic_or_partition, -1)}
    assert delete_records(address, topic_name + "-none", [(0, 0)]) == {0: (ErrorCode.unknown_topic_or_partition, -1)}
    assert list_offset(address, topic_name, 0, -2) == 7


def test_delete_records_of_internal_topic_is_refused(address):
    from confluent_kafka import Consumer  # the offsets topic exists once a group coordinator was looked up
    consumer = Consumer({"bootstrap.servers": "%s:%d" % address, "group.id": "g-internal"})
    try:
        consumer.list_topics(timeout=10)
        consumer.committed([TopicPartition("whatever", 0)], timeout=10)
    except Exception:
        pass
    finally:
        consumer.close()
    assert delete_records(address, "__consumer_offsets", [(0, 0)]) == {0: (ErrorCode.invalid_topic_exception, -1)}


def test_delete_records_survives_restart_and_fetch_honours_it(broker, topic_name):
    address = broker.address
    assert create(address, topic_name).error_code == ErrorCode.none
    produce(address, topic_name, 0, 5)
    assert delete_records(address, topic_name, [(0, 3)]) == {0: (ErrorCode.none, 3)}
    broker.restart(kill=True)
    address = broker.address
    assert list_offset(address, topic_name, 0, -2) == 3
    assert list_offset(address, topic_name, 0, -1) == 5
    from confluent_kafka import Consumer
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g-" + topic_name,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic_name, 0, 0)])  # offset 0 is gone: reset to the new start
        values = []
        while len(values) < 2:
            message = consumer.poll(10)
            assert message is not None, values
            if not message.error():
                values.append((message.offset(), message.value()))
        assert values == [(3, b"v3"), (4, b"v4")]
    finally:
        consumer.close()


def test_confluent_delete_records(address, topic_name):
    admin = AdminClient({"bootstrap.servers": "%s:%d" % address})
    admin.create_topics([NewTopic(topic_name, 1)])["%s" % topic_name].result(15)
    produce(address, topic_name, 0, 4)
    futures = admin.delete_records([TopicPartition(topic_name, 0, 2)])
    deleted = futures[TopicPartition(topic_name, 0)].result(15)
    assert deleted.low_watermark == 2


# -- DescribeLogDirs, DescribeProducers ---------------------------------------------------------------

def test_describe_log_dirs_reports_data_dir_and_sizes(broker, topic_name):
    address = broker.address
    assert create(address, topic_name, partitions=2).error_code == ErrorCode.none
    produce(address, topic_name, 1, 3)
    response = send_request(address, dld.DescribeLogDirsRequest(topics=None))
    assert response.error_code == ErrorCode.none
    (result,) = response.results
    assert result.error_code == ErrorCode.none and result.log_dir == str(broker.data_dir.resolve())
    assert result.total_bytes > 0 and 0 <= result.usable_bytes <= result.total_bytes
    parts = {p.partition_index: p for t in result.topics if t.name == topic_name for p in t.partitions}
    assert parts[0].partition_size == 0 and parts[1].partition_size > 0
    assert all(p.offset_lag == 0 and not p.is_future_key for p in parts.values())


def describe_dirs(address, topics):
    """{topic: sorted partitions} of the answer's one dir, for topics None or {topic: [partitions]}."""
    wanted = None if topics is None else tuple(
        dld.DescribableLogDirTopic(topic=t, partitions=tuple(i32(p) for p in ps)) for t, ps in topics.items())
    response = send_request(address, dld.DescribeLogDirsRequest(topics=wanted))
    assert response.error_code == ErrorCode.none
    (result,) = response.results
    assert result.error_code == ErrorCode.none
    return {t.name: sorted(p.partition_index for p in t.partitions) for t in result.topics}


def test_describe_log_dirs_answers_only_the_partitions_asked_for(broker):
    """Kafka 3.7.1 (ReplicaManager.describeLogDirs) describes the named partitions the broker holds and leaves
    out every topic with none of them; null topics describe everything. Measured against Kafka 3.7.1 alike."""
    from kafka.admin import KafkaAdminClient

    address = broker.address
    assert create(address, "aaa", partitions=3).error_code == ErrorCode.none
    assert create(address, "bbb", partitions=2).error_code == ErrorCode.none
    assert describe_dirs(address, None) == {"aaa": [0, 1, 2], "bbb": [0, 1]}
    assert describe_dirs(address, {"aaa": [0, 1, 2]}) == {"aaa": [0, 1, 2]}
    assert describe_dirs(address, {"aaa": [1, 7], "bbb": [1]}) == {"aaa": [1], "bbb": [1]}
    # an empty list, a topic with no partitions, unknown topics or partitions: the dir with no topics
    for nothing in ({}, {"aaa": []}, {"zzz": [0]}, {"aaa": [-1, 3]}):
        assert describe_dirs(address, nothing) == {}, nothing
    # kafka-python 3.0's admin client, as a user calls it
    admin = KafkaAdminClient(bootstrap_servers="%s:%d" % address)
    try:
        (answer,) = admin.describe_log_dirs({"aaa": [0, 1, 2]})
    finally:
        admin.close()
    assert {t["name"]: sorted(p["partition_index"] for p in t["partitions"])
            for d in answer["log_dirs"] for t in d["topics"]} == {"aaa": [0, 1, 2]}


def test_describe_producers(address, topic_name):
    admin = AdminClient({"bootstrap.servers": "%s:%d" % address})
    admin.create_topics([NewTopic(topic_name, 1)])[topic_name].result(15)
    producer = Producer({"bootstrap.servers": "%s:%d" % address, "enable.idempotence": True})
    producer.produce(topic_name, b"x")
    assert producer.flush(15) == 0
    response = send_request(address, dp.DescribeProducersRequest(topics=(
        dp.TopicRequest(name=topic_name, partition_indexes=(i32(0), i32(3))),
        dp.TopicRequest(name=topic_name + "-none", partition_indexes=(i32(0),)))))
    first, missing = response.topics
    by_index = {p.partition_index: p for p in first.partitions}
    assert by_index[0].error_code == ErrorCode.none
    (state,) = by_index[0].active_producers
    assert state.producer_id >= 0 and state.producer_epoch == 0 and state.last_sequence == 0
    assert state.last_timestamp > 0 and state.coordinator_epoch == -1 and state.current_txn_start_offset == -1
    assert by_index[3].error_code == ErrorCode.unknown_topic_or_partition
    assert missing.partitions[0].error_code == ErrorCode.unknown_topic_or_partition


# -- DescribeTopicPartitions ----------------------------------------------------------------------------

def describe_partitions(address, names, limit=2000, cursor=None):
    return send_request(address, dtp.DescribeTopicPartitionsRequest(
        topics=tuple(dtp.TopicRequest(name=n) for n in names), response_partition_limit=i32(limit),
        cursor=None if cursor is None else dtp.Cursor(topic_name=cursor[0], partition_index=i32(cursor[1]))))


def test_describe_topic_partitions_pages_with_a_cursor(address, topic_name):
    a, b = topic_name + "-a", topic_name + "-b"
    assert create(address, a, partitions=3).error_code == ErrorCode.none
    assert create(address, b, partitions=2).error_code == ErrorCode.none
    names = [b, a, topic_name + "-zz"]  # answered sorted; an unknown one with its error
    seen, cursor, pages = [], None, 0
    while True:
        response = describe_partitions(address, names, limit=2, cursor=cursor)
        pages += 1
        for topic in response.topics:
            assert topic.topic_authorized_operations == TOPIC_OPERATIONS
            if topic.error_code == ErrorCode.none:
                seen += [(topic.name, p.partition_index, p.leader_id, p.eligible_leader_replicas) for p in topic.partitions]
            else:
                seen.append((topic.name, topic.error_code))
        if response.next_cursor is None:
            break
        cursor = (response.next_cursor.topic_name, response.next_cursor.partition_index)
    assert seen == [(a, 0, B, ()), (a, 1, B, ()), (a, 2, B, ()), (b, 0, B, ()), (b, 1, B, ()),
                    (topic_name + "-zz", ErrorCode.unknown_topic_or_partition)]
    assert pages == 3
    bad = describe_partitions(address, [a], cursor=(b, 0))  # the cursor's topic must be in the list
    assert [(t.name, t.error_code) for t in bad.topics] == [(a, ErrorCode.invalid_request)]
    bad = describe_partitions(address, [a], cursor=(a, -1))
    assert [(t.name, t.error_code) for t in bad.topics] == [(a, ErrorCode.invalid_request)]


# -- ElectLeaders -----------------------------------------------------------------------------------------

def test_elect_leaders_single_broker(address, topic_name):
    assert create(address, topic_name, partitions=2).error_code == ErrorCode.none
    for election_type in (0, 1):
        response = send_request(address, el.ElectLeadersRequest(
            election_type=election_type, timeout=TIMEOUT,
            topic_partitions=(el.TopicPartitions(topic=topic_name, partitions=(i32(0), i32(5))),)))
        assert response.error_code == ErrorCode.none
        results = {p.partition_id: (p.error_code, p.error_message)
                   for r in response.replica_election_results for p in r.partition_result}
        assert results == {0: (ErrorCode.election_not_needed, "Leader election not needed for topic partition."),
                           5: (ErrorCode.unknown_topic_or_partition, f"No such partition as {topic_name}-5")}
    response = send_request(address, el.ElectLeadersRequest(  # as Kafka: INVALID_REQUEST, also per partition
        election_type=2, timeout=TIMEOUT, topic_partitions=(el.TopicPartitions(topic=topic_name, partitions=(i32(0),)),)))
    assert response.error_code == ErrorCode.invalid_request
    assert response.replica_election_results[0].partition_result[0].error_code == ErrorCode.invalid_request
    response = send_request(address, el.ElectLeadersRequest(election_type=0, timeout=TIMEOUT, topic_partitions=None))
    listed = {r.topic: r.partition_result for r in response.replica_election_results}
    assert listed[topic_name] == ()  # as KRaft: every topic, no partition needing no election


# -- manual replica assignment ------------------------------------------------------------------------

@pytest.mark.parametrize("partitions, factor, assignments, error", [
    (-1, -1, [(0, [0])], ErrorCode.invalid_replica_assignment),        # unknown broker
    (-1, -1, [(0, [B, B])], ErrorCode.invalid_replica_assignment),     # duplicate broker
    (-1, -1, [(0, [B]), (2, [B])], ErrorCode.invalid_replica_assignment),  # not 0..n-1
    (-1, -1, [(0, [B]), (0, [B])], ErrorCode.invalid_replica_assignment),  # a partition twice
    (-1, -1, [(0, [])], ErrorCode.invalid_replica_assignment),         # no replica
    (2, -1, [(0, [B])], ErrorCode.invalid_request),                    # count and assignment
    (-1, 1, [(0, [B])], ErrorCode.invalid_request),                    # factor and assignment
])
def test_create_topics_bad_assignment(address, topic_name, partitions, factor, assignments, error):
    result = create(address, topic_name, partitions, factor, assignments)
    assert result.error_code == error, result.error_message
    assert send_request(address, md10.MetadataRequest(
        topics=(md10.MetadataRequestTopic(topic_id=None, name=topic_name),), allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False, include_topic_authorized_operations=False,
    )).topics[0].error_code == ErrorCode.unknown_topic_or_partition


def test_create_topics_and_partitions_with_assignment(address, topic_name):
    checked = create(address, topic_name, -1, -1, [(0, [B]), (1, [B]), (2, [B])], validate_only=True)
    assert (checked.error_code, checked.num_partitions, checked.replication_factor) == (ErrorCode.none, 3, 1)
    result = create(address, topic_name, -1, -1, [(0, [B]), (1, [B])])
    assert result.error_code == ErrorCode.none and result.num_partitions == 2 and result.replication_factor == 1

    def add(count, assignments):
        return send_request(address, cp.CreatePartitionsRequest(topics=(cp.CreatePartitionsTopic(
            name=topic_name, count=i32(count), assignments=None if assignments is None else tuple(
                cp.CreatePartitionsAssignment(broker_ids=tuple(i32(b) for b in ids)) for ids in assignments)),),
            timeout=TIMEOUT, validate_only=False)).results[0].error_code

    assert add(4, [[B]]) == ErrorCode.invalid_replica_assignment   # one per new partition
    assert add(3, []) == ErrorCode.invalid_replica_assignment
    assert add(3, [[2]]) == ErrorCode.invalid_replica_assignment   # unknown broker
    assert add(3, [[B, B]]) == ErrorCode.invalid_replica_assignment  # duplicate
    assert add(3, [[B]]) == ErrorCode.none
    admin = AdminClient({"bootstrap.servers": "%s:%d" % address})
    admin.create_partitions([NewPartitions(topic_name, 4, replica_assignment=[[B]])])[topic_name].result(15)
    assert len(admin.list_topics(topic_name, timeout=10).topics[topic_name].partitions) == 4


def test_confluent_create_topic_with_replica_assignment(address, topic_name):
    admin = AdminClient({"bootstrap.servers": "%s:%d" % address})
    admin.create_topics([NewTopic(topic_name, 3, replica_assignment=[[B], [B], [B]])])[topic_name].result(15)
    assert len(admin.list_topics(topic_name, timeout=10).topics[topic_name].partitions) == 3
    with pytest.raises(Exception) as failure:
        admin.create_topics([NewTopic(topic_name + "-bad", 1, replica_assignment=[[5]])])[topic_name + "-bad"].result(15)
    assert failure.value.args[0].code() == ErrorCode.invalid_replica_assignment


# -- authorized operations ----------------------------------------------------------------------------------

def test_authorized_operations_raw(address, topic_name):
    assert create(address, topic_name).error_code == ErrorCode.none
    for asked in (True, False):
        response = send_request(address, md10.MetadataRequest(
            topics=(md10.MetadataRequestTopic(topic_id=None, name=topic_name),
                    md10.MetadataRequestTopic(topic_id=None, name=topic_name + "-none")),
            allow_auto_topic_creation=False, include_cluster_authorized_operations=asked,
            include_topic_authorized_operations=asked))
        expected_topic = TOPIC_OPERATIONS if asked else NOT_REQUESTED
        assert [t.topic_authorized_operations for t in response.topics] == [expected_topic, expected_topic]
        assert response.cluster_authorized_operations == (CLUSTER_OPERATIONS if asked else NOT_REQUESTED)
        cluster = send_request(address, dc.DescribeClusterRequest(
            include_cluster_authorized_operations=asked, endpoint_type=1))
        assert cluster.cluster_authorized_operations == (CLUSTER_OPERATIONS if asked else NOT_REQUESTED)


def test_confluent_describe_with_authorized_operations(address, topic_name):
    from confluent_kafka import TopicCollection
    admin = AdminClient({"bootstrap.servers": "%s:%d" % address})
    admin.create_topics([NewTopic(topic_name, 2)])[topic_name].result(15)
    description = admin.describe_topics(TopicCollection([topic_name]),
                                        include_authorized_operations=True)[topic_name].result(15)
    assert set(description.authorized_operations) == TOPIC_OPS
    assert [p.id for p in description.partitions] == [0, 1]
    cluster = admin.describe_cluster(include_authorized_operations=True).result(15)
    assert set(cluster.authorized_operations) == CLUSTER_OPS


# -- Kafka's own tools -------------------------------------------------------------------------------

def test_kafka_tools_single_broker(address, topic_name, tmp_path):
    from kafka_tools import kafka_tools_or_skip
    tools = kafka_tools_or_skip()
    bootstrap = "%s:%d" % address
    tools.run("kafka-topics.sh", "--bootstrap-server", bootstrap, "--create", "--topic", topic_name,
              "--replica-assignment", f"{B},{B}")
    produce(address, topic_name, 1, 5)
    spec = tmp_path / "delete.json"
    spec.write_text(json.dumps({"version": 1, "partitions": [{"topic": topic_name, "partition": 1, "offset": 3}]}))
    out = tools.run("kafka-delete-records.sh", "--bootstrap-server", bootstrap, "--offset-json-file", str(spec)).stdout
    assert "low_watermark: 3" in out, out
    out = tools.run("kafka-log-dirs.sh", "--bootstrap-server", bootstrap, "--describe",
                    "--topic-list", topic_name).stdout
    doc = json.loads(out.strip().splitlines()[-1])
    parts = {p["partition"]: p for d in doc["brokers"][0]["logDirs"] for p in d["partitions"]}
    assert set(parts) == {f"{topic_name}-0", f"{topic_name}-1"} and parts[f"{topic_name}-1"]["size"] > 0
    out = tools.run("kafka-leader-election.sh", "--bootstrap-server", bootstrap, "--election-type", "preferred",
                    "--all-topic-partitions").stdout
    assert "Exception" not in out
    out = tools.run("kafka-topics.sh", "--bootstrap-server", bootstrap, "--describe", "--topic", topic_name).stdout
    assert f"Partition: 1\tLeader: {B}\tReplicas: {B}\tIsr: {B}" in out, out
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    producer.produce(topic_name, b"x", partition=0)
    assert producer.flush(15) == 0
    out = tools.run("kafka-transactions.sh", "--bootstrap-server", bootstrap, "describe-producers",
                    "--topic", topic_name, "--partition", "0").stdout
    lines = out.strip().splitlines()
    assert lines[0].split() == ["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence",
                                "LastTimestamp", "CurrentTransactionStartOffset"], out
    assert len(lines) == 2 and lines[1].split()[3] == "0", out

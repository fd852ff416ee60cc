"""Admin APIs on a 3-broker ZooKeeper cluster: manual replica assignments placed exactly as named (CreateTopics,
CreatePartitions, kafka-topics.sh --replica-assignment) and bad ones refused; DeleteRecords waits for the
followers' log starts, which a follower keeps when it becomes leader; DescribeLogDirs per broker;
DescribeProducers and DescribeTopicPartitions; preferred leader election (kafka-leader-election.sh)."""

from __future__ import annotations

import datetime
import json
import uuid

import pytest
from confluent_kafka import Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AclOperation, AdminClient, NewPartitions, NewTopic
from kio.schema.delete_records.v2 import request as dr
from kio.schema.describe_log_dirs.v4 import request as dld
from kio.schema.describe_producers.v0 import request as dp
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64

from broker_cluster import BrokerCluster
from broker_process import list_offset, send_request, wait_until

TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    chroot = f"/t-admin-apis-{uuid.uuid4().hex[:8]}"
    cluster = BrokerCluster(zk_server.connect_string + chroot, tmp_path_factory.mktemp("admin-apis"), n=3,
                            overrides={"zookeeper.session.timeout.ms": 6000})
    with cluster:
        yield cluster


@pytest.fixture
def admin(cluster):
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def replicas_of(cluster, topic, partitions):
    result = {}
    for index in range(partitions):
        cluster.wait_for_leader(topic, index)
        result[index] = cluster.partition(topic, index).replicas
    return result


def test_create_topic_and_partitions_with_manual_assignment(cluster, admin):
    topic = "assigned-" + uuid.uuid4().hex[:6]
    admin.create_topics([NewTopic(topic, 2, replica_assignment=[[3, 1], [2, 3]])])[topic].result(TIMEOUT_S)
    assert replicas_of(cluster, topic, 2) == {0: (3, 1), 1: (2, 3)}
    assert cluster.wait_for_leader(topic, 0) == 3 and cluster.wait_for_leader(topic, 1) == 2
    assert cluster.zk_json(f"/brokers/topics/{topic}")["partitions"] == {"0": [3, 1], "1": [2, 3]}

    admin.create_partitions([NewPartitions(topic, 4, replica_assignment=[[1, 2], [2, 1]])])[topic].result(TIMEOUT_S)
    assert replicas_of(cluster, topic, 4) == {0: (3, 1), 1: (2, 3), 2: (1, 2), 3: (2, 1)}

    for bad in ([[4, 1]], [[1, 1]], [[1, 2], [3]]):  # unknown broker, duplicate, uneven replica counts
        name = "bad-" + uuid.uuid4().hex[:6]
        with pytest.raises(Exception) as failure:
            admin.create_topics([NewTopic(name, len(bad), replica_assignment=bad)])[name].result(TIMEOUT_S)
        assert failure.value.args[0].code() == ErrorCode.invalid_replica_assignment, bad
    for bad in ([[4, 1]], [[1]], [[1, 2], [2, 3]]):  # unknown broker, another factor, more than one per partition
        with pytest.raises(Exception) as failure:
            admin.create_partitions([NewPartitions(topic, 5, replica_assignment=bad)])[topic].result(TIMEOUT_S)
        assert failure.value.args[0].code() == ErrorCode.invalid_replica_assignment, bad


def test_authorized_operations_in_a_cluster(cluster, admin):
    topic = "ops-" + uuid.uuid4().hex[:6]
    cluster.create_topic(topic, partitions=2, replication_factor=3)
    description = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True)[topic].result(
        TIMEOUT_S)
    assert AclOperation.ALTER_CONFIGS in description.authorized_operations and len(description.partitions) == 2
    assert all(len(p.replicas) == 3 for p in description.partitions)
    described = admin.describe_cluster(include_authorized_operations=True).result(TIMEOUT_S)
    assert AclOperation.CLUSTER_ACTION in described.authorized_operations and len(described.nodes) == 3


def delete_records(address, topic, index, offset, timeout_s=TIMEOUT_S):
    response = send_request(address, dr.DeleteRecordsRequest(topics=(dr.DeleteRecordsTopic(name=topic, partitions=(
        dr.DeleteRecordsPartition(partition_index=i32(index), offset=i64(offset)),)),),
        timeout=datetime.timedelta(seconds=timeout_s)), timeout=timeout_s + 10)
    result = response.topics[0].partitions[0]
    return result.error_code, result.low_watermark


def test_delete_records_reaches_followers_and_survives_leader_change(cluster, admin):
    topic = "deleted-" + uuid.uuid4().hex[:6]
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    leader = cluster.wait_for_leader(topic, 0)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(10):
        producer.produce(topic, b"v%d" % i, partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    follower = next(b for b in cluster.partition(topic, 0).replicas if b != leader)
    # a follower answers NOT_LEADER_OR_FOLLOWER; the leader answers once every live replica's start moved
    assert delete_records(cluster.brokers[follower].address, topic, 0, 6) == (ErrorCode.not_leader_or_follower, -1)
    assert delete_records(cluster.brokers[leader].address, topic, 0, 11) == (ErrorCode.offset_out_of_range, -1)
    result = admin.delete_records([TopicPartition(topic, 0, 6)])[TopicPartition(topic, 0)].result(TIMEOUT_S)
    assert result.low_watermark == 6
    assert list_offset(cluster.brokers[leader].address, topic, 0, -2) == 6

    assert cluster.stop(leader) == 0  # controlled shutdown: a follower becomes leader with the same log start
    new_leader = cluster.wait_for_leader(topic, 0, exclude={leader})
    assert list_offset(cluster.brokers[new_leader].address, topic, 0, -2) == 6
    assert list_offset(cluster.brokers[new_leader].address, topic, 0, -1) == 10
    cluster.start_broker(leader)
    cluster.wait_ready()
    cluster.wait_for_isr(topic, 0, {1, 2, 3})

    # preferred election moves leadership back to the first replica (kafka-leader-election.sh below too)
    from kafka_tools import kafka_tools_or_skip
    tools = kafka_tools_or_skip()
    preferred = cluster.partition(topic, 0).replicas[0]
    out = tools.run("kafka-leader-election.sh", "--bootstrap-server", cluster.bootstrap, "--election-type",
                    "preferred", "--all-topic-partitions").stdout
    assert "could not be elected" not in out, out
    wait_until(lambda: cluster.partition(topic, 0).leader == preferred, "the preferred leader back", TIMEOUT_S)


def test_describe_log_dirs_and_producers_per_broker(cluster):
    topic = "dirs-" + uuid.uuid4().hex[:6]
    cluster.create_topic(topic, partitions=1, replication_factor=2)
    # a topic every broker holds (create_topic waits for its full ISR), which answers filtered to `topic` leave out
    everywhere = "dirs-all-" + uuid.uuid4().hex[:6]
    cluster.create_topic(everywhere, partitions=1, replication_factor=3)
    leader = cluster.wait_for_leader(topic, 0)
    replicas = set(cluster.partition(topic, 0).replicas)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True})
    producer.produce(topic, b"x", partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    for broker_id, broker in cluster.brokers.items():
        response = send_request(broker.address, dld.DescribeLogDirsRequest(topics=None))
        (result,) = response.results
        hosted = {(t.name, p.partition_index) for t in result.topics for p in t.partitions}
        assert ((topic, 0) in hosted) == (broker_id in replicas), (broker_id, hosted)
        assert (everywhere, 0) in hosted, (broker_id, hosted)
        # asked for this partition only: it alone where the broker holds it, else no topic (not `everywhere`)
        response = send_request(broker.address, dld.DescribeLogDirsRequest(
            topics=(dld.DescribableLogDirTopic(topic=topic, partitions=(i32(0),)),)))
        answered = [(t.name, [p.partition_index for p in t.partitions]) for t in response.results[0].topics]
        assert answered == ([(topic, [0])] if broker_id in replicas else []), (broker_id, answered)
    answer = send_request(cluster.brokers[leader].address, dp.DescribeProducersRequest(
        topics=(dp.TopicRequest(name=topic, partition_indexes=(i32(0),)),)))
    (partition,) = answer.topics[0].partitions
    assert partition.error_code == ErrorCode.none and len(partition.active_producers) == 1
    follower = next(iter(replicas - {leader}))
    answer = send_request(cluster.brokers[follower].address, dp.DescribeProducersRequest(
        topics=(dp.TopicRequest(name=topic, partition_indexes=(i32(0),)),)))
    assert answer.topics[0].partitions[0].error_code == ErrorCode.not_leader_or_follower


def test_describe_log_dirs_lag_of_a_log_no_leader_and_isr_names(cluster):
    """A log the broker loaded at start but hosts no partition for (no LeaderAndIsr names it: here a topic the
    cluster does not know) answers offset lag -1, Kafka's INVALID_OFFSET_LAG (ReplicaManager.getLogEndOffsetLag
    finds no online partition); a hosted partition's current log answers max(HWM - log end, 0) = 0."""
    topic = "lag-" + uuid.uuid4().hex[:6]
    ghost = "ghost-" + uuid.uuid4().hex[:6]
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    broker_id = cluster.partition(topic, 0).replicas[-1]
    assert cluster.stop(broker_id) == 0
    (cluster.brokers[broker_id].data_dir / f"{ghost}-0").mkdir()
    cluster.start_broker(broker_id)
    cluster.wait_ready()
    cluster.wait_for_isr(topic, 0, {1, 2, 3})
    response = send_request(cluster.brokers[broker_id].address, dld.DescribeLogDirsRequest(topics=(
        dld.DescribableLogDirTopic(topic=topic, partitions=(i32(0),)),
        dld.DescribableLogDirTopic(topic=ghost, partitions=(i32(0),)))))
    (result,) = response.results
    lags = {(t.name, p.partition_index): p.offset_lag for t in result.topics for p in t.partitions}
    assert lags == {(topic, 0): 0, (ghost, 0): -1}, lags


def test_kafka_tools_on_a_cluster(cluster, tmp_path):
    from kafka_tools import kafka_tools_or_skip
    tools = kafka_tools_or_skip()
    topic = "tools-" + uuid.uuid4().hex[:6]
    tools.run("kafka-topics.sh", "--bootstrap-server", cluster.bootstrap, "--create", "--topic", topic,
              "--replica-assignment", "2:3,3:1")
    assert replicas_of(cluster, topic, 2) == {0: (2, 3), 1: (3, 1)}
    cluster.wait_for_isr(topic, 1, {3, 1})
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(5):
        producer.produce(topic, b"v%d" % i, partition=1)
    assert producer.flush(TIMEOUT_S) == 0
    spec = tmp_path / "delete.json"
    spec.write_text(json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": 1, "offset": 4}]}))
    out = tools.run("kafka-delete-records.sh", "--bootstrap-server", cluster.bootstrap,
                    "--offset-json-file", str(spec)).stdout
    assert "low_watermark: 4" in out, out
    out = tools.run("kafka-log-dirs.sh", "--bootstrap-server", cluster.bootstrap, "--describe",
                    "--topic-list", topic).stdout
    doc = json.loads(out.strip().splitlines()[-1])
    hosted = {b["broker"]: sorted(p["partition"] for d in b["logDirs"] for p in d["partitions"]) for b in doc["brokers"]}
    assert hosted == {1: [f"{topic}-1"], 2: [f"{topic}-0"], 3: [f"{topic}-0", f"{topic}-1"]}, hosted
    out = tools.run("kafka-topics.sh", "--bootstrap-server", cluster.bootstrap, "--describe", "--topic", topic).stdout
    assert "Partition: 0\tLeader: 2\tReplicas: 2,3" in out and "Partition: 1\tLeader: 3\tReplicas: 3,1" in out, out
    same = tools.run("kafka-topics.sh", "--bootstrap-server", cluster.bootstrap, "--alter", "--topic", topic,
                     "--partitions", "2", check=False)  # the count it has: ZooKeeper-mode Kafka's words
    assert same.returncode == 1 and "Topic already has 2 partitions." in same.stdout + same.stderr, same
    idempotent = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True})
    idempotent.produce(topic, b"x", partition=0)
    assert idempotent.flush(TIMEOUT_S) == 0
    out = tools.run("kafka-transactions.sh", "--bootstrap-server", cluster.bootstrap, "describe-producers",
                    "--topic", topic, "--partition", "0").stdout  # asks the leader, broker 2
    lines = out.strip().splitlines()
    assert len(lines) == 2 and lines[1].split()[3] == "0", out  # one producer, its last sequence 0

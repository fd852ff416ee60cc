"""Topic administration and metadata over the raw protocol: every error code a bad request earns, and the
answers a good one gets (CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs, Metadata,
ListOffsets, OffsetForLeaderEpoch, DescribeCluster)."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.create_partitions.v3 import request as cp
from kio.schema.create_topics.v7 import request as ct
from kio.schema.delete_topics.v6 import request as dt
from kio.schema.describe_cluster.v1 import request as dc
from kio.schema.describe_configs.v4 import request as dcfg
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v4 import request as fetch
from kio.schema.list_offsets.v9 import request as lo
from kio.schema.metadata.v12 import request as md
from kio.schema.offset_for_leader_epoch.v4 import request as ofle
from kio.static.primitive import i32, i32Timedelta, i64

from broker_process import produce_raw, send_request, send_request_now
from pykbroker.protocol.records import build_batch

TIMEOUT = datetime.timedelta(seconds=10)


def create(address, name, partitions=3, replication_factor=-1, configs=(), validate_only=False):
    request = ct.CreateTopicsRequest(
        topics=(ct.CreatableTopic(
            name=name, num_partitions=partitions, replication_factor=replication_factor, assignments=(),
            configs=tuple(ct.CreatableTopicConfig(name=k, value=v) for k, v in configs)),),
        timeout=TIMEOUT, validate_only=validate_only)
    return send_request(address, request).topics[0]


def metadata(address, *names, auto_create=False):
    topics = None if not names else tuple(md.MetadataRequestTopic(topic_id=None, name=n) for n in names)
    return send_request(address, md.MetadataRequest(
        topics=topics, allow_auto_topic_creation=auto_create, include_topic_authorized_operations=False))


@pytest.fixture
def address(shared_broker):
    return shared_broker.address


def test_create_topic_answers_partitions_replication_configs_and_id(address, topic_name):
    result = create(address, topic_name, partitions=3, configs=[("retention.ms", "3600000")])
    assert result.error_code == ErrorCode.none
    assert (result.num_partitions, result.replication_factor) == (3, 1)
    configs = {c.name: (c.value, c.config_source) for c in result.configs}
    assert configs["retention.ms"] == ("3600000", 1)  # DYNAMIC_TOPIC_CONFIG
    assert configs["cleanup.policy"] == ("delete", 5)  # DEFAULT_CONFIG
    described = metadata(address, topic_name).topics[0]
    assert described.topic_id == result.topic_id
    assert [(p.partition_index, p.leader_id, p.leader_epoch) for p in described.partitions] == [(0, 1, 0), (1, 1, 0), (2, 1, 0)]


@pytest.mark.parametrize("partitions,replication,configs,expected", [
    (0, -1, [], ErrorCode.invalid_partitions),
    (-5, -1, [], ErrorCode.invalid_partitions),
    (1, 3, [], ErrorCode.invalid_replication_factor),
    (1, -1, [("retention.ms", "soon")], ErrorCode.invalid_config),
    (1, -1, [("no.such.config", "1")], ErrorCode.invalid_config),
])
def test_create_topic_rejections(address, topic_name, partitions, replication, configs, expected):
    result = create(address, topic_name, partitions, replication, configs)
    assert result.error_code == expected and result.error_message
    assert metadata(address, topic_name).topics[0].error_code == ErrorCode.unknown_topic_or_partition


@pytest.mark.parametrize("name", ["", ".", "..", "bad/name", "x" * 250, "spaces are bad"])
def test_illegal_topic_names(address, name):
    assert create(address, name).error_code == ErrorCode.invalid_topic_exception
    if name:
        assert metadata(address, name, auto_create=True).topics[0].error_code == ErrorCode.invalid_topic_exception


def test_duplicate_create_and_validate_only(address, topic_name):
    assert create(address, topic_name, validate_only=True).error_code == ErrorCode.none
    assert metadata(address, topic_name).topics[0].error_code == ErrorCode.unknown_topic_or_partition
    assert create(address, topic_name).error_code == ErrorCode.none
    assert create(address, topic_name).error_code == ErrorCode.topic_already_exists


def test_metadata_auto_creates_only_when_allowed(address, topic_name):
    assert metadata(address, topic_name).topics[0].error_code == ErrorCode.unknown_topic_or_partition
    created = metadata(address, topic_name, auto_create=True).topics[0]
    assert created.error_code == ErrorCode.none and len(created.partitions) == 1  # num.partitions default


def test_create_partitions_grows_and_refuses_to_shrink(address, topic_name):
    create(address, topic_name, partitions=2)

    def grow(count):
        request = cp.CreatePartitionsRequest(
            topics=(cp.CreatePartitionsTopic(name=topic_name, count=count, assignments=None),),
            timeout=TIMEOUT, validate_only=False)
        result = send_request(address, request).results[0]
        return result.error_code, result.error_message

    assert grow(4) == (ErrorCode.none, None)
    assert len(metadata(address, topic_name).topics[0].partitions) == 4
    # the single node words it as KRaft 3.7.1 does (ReplicationControlManager.createPartitions)
    assert grow(4) == (ErrorCode.invalid_partitions, "Topic already has 4 partition(s).")
    assert grow(3) == (ErrorCode.invalid_partitions,
                       f"The topic {topic_name} currently has 4 partition(s); 3 would not be an increase.")
    assert len(metadata(address, topic_name).topics[0].partitions) == 4
    assert produce_raw(address, topic_name, 3, build_batch([(b"k", b"v")]), acks=1).error_code == ErrorCode.none


def test_a_long_poll_on_a_topic_being_deleted_answers_unknown_topic(address, topic_name):
    """A Fetch parked on an empty partition (long poll) when its topic is deleted answers
    UNKNOWN_TOPIC_OR_PARTITION, as Kafka does, not an empty read of a log that no longer exists."""
    create(address, topic_name)
    request = fetch.FetchRequest(
        replica_id=-1, max_wait=i32Timedelta.parse(datetime.timedelta(seconds=20)), min_bytes=i32(1),
        max_bytes=i32(1 << 20), isolation_level=0, topics=(fetch.FetchTopic(topic=topic_name, partitions=(
            fetch.FetchPartition(partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20)),)),))
    # The Fetch's bytes are with the broker before the deletion is sent; should the broker still take
    # the deletion first, the Fetch finds no topic and the answer is the same.
    parked = send_request_now(address, request, timeout=30)
    response = send_request(address, dt.DeleteTopicsRequest(
        topics=(dt.DeleteTopicState(name=topic_name, topic_id=None),), timeout=TIMEOUT))
    assert response.responses[0].error_code == ErrorCode.none
    answer = parked()
    assert answer.responses[0].partitions[0].error_code == ErrorCode.unknown_topic_or_partition


def test_delete_topic_by_name_and_id(address, topic_name):
    first = create(address, topic_name + "-a")
    create(address, topic_name + "-b")
    response = send_request(address, dt.DeleteTopicsRequest(topics=(
        dt.DeleteTopicState(name=topic_name + "-a", topic_id=None),
        dt.DeleteTopicState(name=None, topic_id=metadata(address, topic_name + "-b").topics[0].topic_id),
        dt.DeleteTopicState(name="never-existed-" + topic_name, topic_id=None),
    ), timeout=TIMEOUT))
    codes = {r.name: r.error_code for r in response.responses}
    assert codes[topic_name + "-a"] == ErrorCode.none
    assert codes[topic_name + "-b"] == ErrorCode.none
    assert codes["never-existed-" + topic_name] == ErrorCode.unknown_topic_or_partition
    assert metadata(address, topic_name + "-a").topics[0].error_code == ErrorCode.unknown_topic_or_partition
    # a re-created topic gets a new id and starts empty
    again = create(address, topic_name + "-a")
    assert again.topic_id != first.topic_id


def test_a_topic_named_twice_in_delete_topics_is_answered_once_and_not_deleted(address, topic_name):
    # Kafka's ControllerApis.deleteTopics; one answer per occurrence makes librdkafka fail the whole request
    # ("Broker returned topic ... multiple times")
    create(address, topic_name + "-twice")
    create(address, topic_name + "-once")
    twice_id = metadata(address, topic_name + "-twice").topics[0].topic_id
    response = send_request(address, dt.DeleteTopicsRequest(topics=(
        dt.DeleteTopicState(name=topic_name + "-twice", topic_id=None),
        dt.DeleteTopicState(name=topic_name + "-once", topic_id=None),
        dt.DeleteTopicState(name=topic_name + "-twice", topic_id=None),
        dt.DeleteTopicState(name=None, topic_id=twice_id),
        dt.DeleteTopicState(name=None, topic_id=twice_id),
    ), timeout=TIMEOUT))
    answers = [(r.name, r.topic_id, r.error_code, r.error_message) for r in response.responses]
    assert sorted(answers[:2], key=str) == sorted([
        (topic_name + "-twice", None, ErrorCode.invalid_request, "Duplicate topic name."),
        (None, twice_id, ErrorCode.invalid_request, "Duplicate topic id."),
    ], key=str)
    assert [(name, code) for name, _, code, _ in answers[2:]] == [(topic_name + "-once", ErrorCode.none)]
    assert metadata(address, topic_name + "-twice").topics[0].error_code == ErrorCode.none  # not deleted
    assert metadata(address, topic_name + "-once").topics[0].error_code == ErrorCode.unknown_topic_or_partition


def test_describe_configs_topic_and_broker(address, topic_name):
    create(address, topic_name, configs=[("segment.bytes", "1048576")])
    response = send_request(address, dcfg.DescribeConfigsRequest(resources=(
        dcfg.DescribeConfigsResource(resource_type=2, resource_name=topic_name, configuration_keys=None),
        dcfg.DescribeConfigsResource(resource_type=2, resource_name="missing-" + topic_name, configuration_keys=None),
        dcfg.DescribeConfigsResource(resource_type=4, resource_name="1", configuration_keys=("num.partitions",)),
        dcfg.DescribeConfigsResource(resource_type=4, resource_name="7", configuration_keys=None),
    ), include_synonyms=True, include_documentation=True))
    topic, missing, broker, other_broker = response.results
    entries = {c.name: c for c in topic.configs}
    assert entries["segment.bytes"].value == "1048576" and entries["segment.bytes"].config_source == 1
    assert [s.source for s in entries["segment.bytes"].synonyms][0] == 1
    assert entries["retention.bytes"].value == "-1" and entries["retention.bytes"].config_type == 5  # LONG
    assert len(entries) >= 25
    assert missing.error_code == ErrorCode.unknown_topic_or_partition
    assert [(c.name, c.value) for c in broker.configs] == [("num.partitions", "1")]
    assert other_broker.error_code == ErrorCode.invalid_request


def test_list_offsets_and_leader_epoch_fencing(address, topic_name):
    create(address, topic_name, partitions=1)
    for i in range(3):
        batch = build_batch([(b"k", b"v%d" % i)], timestamp_ms=1_000_000 + i * 1000)
        assert produce_raw(address, topic_name, 0, batch, acks=-1).error_code == ErrorCode.none

    def list_offset(timestamp, epoch=-1):
        response = send_request(address, lo.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(
            lo.ListOffsetsTopic(name=topic_name, partitions=(
                lo.ListOffsetsPartition(partition_index=0, current_leader_epoch=epoch, timestamp=timestamp),)),)))
        answer = response.topics[0].partitions[0]
        return answer.error_code, answer.offset, answer.timestamp

    assert list_offset(-2) == (ErrorCode.none, 0, -1)
    assert list_offset(-1) == (ErrorCode.none, 3, -1)
    assert list_offset(-3) == (ErrorCode.none, 2, 1_002_000)
    assert list_offset(1_001_000) == (ErrorCode.none, 1, 1_001_000)
    assert list_offset(1_001_001) == (ErrorCode.none, 2, 1_002_000)
    assert list_offset(9_999_999_999) == (ErrorCode.none, -1, -1)
    assert list_offset(-1, epoch=1)[0] == ErrorCode.unknown_leader_epoch

    response = send_request(address, ofle.OffsetForLeaderEpochRequest(replica_id=-1, topics=(
        ofle.OffsetForLeaderTopic(topic=topic_name, partitions=(
            ofle.OffsetForLeaderPartition(partition=0, current_leader_epoch=0, leader_epoch=0),
            ofle.OffsetForLeaderPartition(partition=9, current_leader_epoch=-1, leader_epoch=0),)),)))
    found, unknown = response.topics[0].partitions
    assert (found.error_code, found.leader_epoch, found.end_offset) == (ErrorCode.none, 0, 3)
    assert unknown.error_code == ErrorCode.unknown_topic_or_partition


def test_describe_cluster(address, shared_broker):
    response = send_request(address, dc.DescribeClusterRequest(
        include_cluster_authorized_operations=False, endpoint_type=1))
    assert response.error_code == ErrorCode.none
    assert [(b.broker_id, b.host, b.port) for b in response.brokers] == [(1, "127.0.0.1", shared_broker.port)]
    assert response.controller_id == 1 and len(response.cluster_id) == 22


def test_metadata_and_describe_cluster_advertise_the_configured_address(broker_factory):
    broker = broker_factory.make({"advertised.host": "kafka.example", "advertised.port": 19999})
    brokers = metadata(broker.address).brokers
    assert [(b.node_id, b.host, b.port) for b in brokers] == [(1, "kafka.example", 19999)]
    described = send_request(broker.address, dc.DescribeClusterRequest(
        include_cluster_authorized_operations=False, endpoint_type=1))
    assert [(b.host, b.port) for b in described.brokers] == [("kafka.example", 19999)]

"""Compatibility with Apache Kafka 3.7.1, both started through testcontainers: the same scenario against a
PykbrokerContainer and a KafkaReferenceContainer (tests/containers/kafka_reference.py), answers compared.
Each broker runs once for the module, both with auto.create.topics.enable=false and num.partitions=1.

Where both answer the same, each test also asserts the expected answer, so that a change of both (a broken
scenario) does not pass unnoticed. The start-to-ready time of both containers is printed (pytest -s)."""

from __future__ import annotations

import datetime
import time

import pytest
from kio.schema.create_topics.v7 import request as ct
from kio.schema.errors import ErrorCode
from kio.schema.list_offsets.v7 import request as lo
from kio.schema.metadata.v12 import request as md
from kio.static.primitive import i32, i64

from docker_helpers import SUITE_LABELS, session_containers, unique
from kafka_reference import KafkaReferenceContainer, kafka_reference_image  # puts tests/integration on sys.path

from broker_process import (  # noqa: E402  (tests/integration)
    ProtocolError,
    fetch_raw,
    init_producer_id,
    produce_raw,
    send_request,
)
from pykbroker.protocol.records import build_batch
from pykbroker.testcontainers import ContainerStartException, PykbrokerContainer

TIMEOUT_S = 60.0
BROKER_SETTINGS = {"auto.create.topics.enable": "false", "num.partitions": "1"}


@pytest.fixture(scope="module")
def kafka_image(docker_client, debian_base_image):
    return kafka_reference_image(debian_base_image)


@pytest.fixture(scope="module")
def brokers(pykbroker_image, kafka_image):
    """{"pykbroker": container, "kafka": container}, both ready."""
    pykbroker = PykbrokerContainer(pykbroker_image, host_network=True).with_labels(SUITE_LABELS)
    kafka = KafkaReferenceContainer(kafka_image).with_labels(SUITE_LABELS)
    for key, value in BROKER_SETTINGS.items():
        pykbroker.with_broker_config(key, value)
        kafka.with_broker_config(key, value)
    with pykbroker, kafka:
        print(f"\nstart to ready (ApiVersions answered): pykbroker {pykbroker.ready_seconds:.2f} s, "
              f"Kafka 3.7.1 {kafka.ready_seconds:.2f} s")
        yield {"pykbroker": pykbroker, "kafka": kafka}


def on_both(brokers, scenario):
    """scenario(container) on each broker: {"pykbroker": answer, "kafka": answer}."""
    return {name: scenario(container) for name, container in brokers.items()}


def create_topic(address, name, partitions=1, replication_factor=-1, configs=(), validate_only=False):
    request = ct.CreateTopicsRequest(
        topics=(ct.CreatableTopic(
            name=name, num_partitions=partitions, replication_factor=replication_factor, assignments=(),
            configs=tuple(ct.CreatableTopicConfig(name=k, value=v) for k, v in configs)),),
        timeout=datetime.timedelta(seconds=30), validate_only=validate_only)
    return send_request(address, request).topics[0]


def list_offsets(address, topic, partition, timestamp):
    response = send_request(address, lo.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(
        lo.ListOffsetsTopic(name=topic, partitions=(
            lo.ListOffsetsPartition(partition_index=i32(partition), timestamp=i64(timestamp)),)),)))
    answer = response.topics[0].partitions[0]
    return answer.error_code, answer.offset


def test_produce_and_consume_in_a_group_give_the_same_offsets_records_and_commits(brokers):
    """confluent-kafka: a 2-partition topic, 6 keyed records with headers, delivery offsets; a group reads them
    all and commits; the committed offsets and the log start/end offsets."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    topic, group = unique("compat-produce"), unique("compat-group")

    def scenario(container):
        bootstrap = container.get_bootstrap_server()
        admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures fail once it is destroyed
        admin.create_topics([NewTopic(topic, num_partitions=2)])[topic].result(TIMEOUT_S)
        delivered = []
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        for i in range(6):
            producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2,
                             headers=[("n", str(i).encode())],
                             on_delivery=lambda err, msg: delivered.append((err, msg.partition(), msg.offset())))
            producer.flush(TIMEOUT_S)  # one at a time: the offsets do not depend on batching
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                             "enable.auto.commit": False})
        consumer.subscribe([topic])
        read, deadline = [], time.monotonic() + TIMEOUT_S
        while len(read) < 6 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read.append((message.partition(), message.offset(), message.key(), message.value(),
                             message.headers()))
        consumer.commit(asynchronous=False)
        committed = [(tp.partition, tp.offset) for tp in
                     consumer.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=TIMEOUT_S)]
        consumer.close()
        address = container.address()
        log_offsets = [(list_offsets(address, topic, p, -2), list_offsets(address, topic, p, -1)) for p in (0, 1)]
        return delivered, sorted(read), committed, log_offsets

    answers = on_both(brokers, scenario)
    assert answers["pykbroker"] == answers["kafka"]
    delivered, read, committed, log_offsets = answers["kafka"]
    assert delivered == [(None, i % 2, i // 2) for i in range(6)]
    assert read == sorted((i % 2, i // 2, f"k{i}".encode(), f"v{i}".encode(), [("n", str(i).encode())])
                          for i in range(6))
    assert committed == [(0, 3), (1, 3)]
    assert log_offsets == [((0, 0), (0, 3)), ((0, 0), (0, 3))]


def test_an_unknown_topic_with_auto_create_off_is_unknown_to_metadata_produce_list_offsets_and_fetch(brokers):
    topic = unique("compat-unknown")

    def scenario(container):
        address = container.address()
        metadata = send_request(address, md.MetadataRequest(
            topics=(md.MetadataRequestTopic(topic_id=None, name=topic),), allow_auto_topic_creation=True,
            include_topic_authorized_operations=False))
        produced = produce_raw(address, topic, 0, build_batch([(b"k", b"v")]), acks=-1)
        try:
            fetched = fetch_raw(address, topic, 0)
        except Exception as exc:  # broker_process.ProtocolError names the error code
            fetched = str(exc)
        return ([(t.name, t.error_code, len(t.partitions)) for t in metadata.topics], produced.error_code,
                list_offsets(address, topic, 0, -1)[0], fetched)

    answers = on_both(brokers, scenario)
    assert answers["pykbroker"] == answers["kafka"]
    unknown = ErrorCode.unknown_topic_or_partition
    assert answers["kafka"] == ([(topic, unknown, 0)], unknown, unknown, f"Fetch {topic}-0 at 0: {unknown!r}")
    # and the topic was not created by any of it
    assert on_both(brokers, lambda c: send_request(c.address(), md.MetadataRequest(
        topics=(md.MetadataRequestTopic(topic_id=None, name=topic),), allow_auto_topic_creation=False,
        include_topic_authorized_operations=False)).topics[0].error_code) == {"pykbroker": unknown, "kafka": unknown}


CREATE_CASES = [
    # (name suffix, partitions, replication factor, configs, validate only)
    ("ok", 3, -1, (), False),
    ("exists", 1, -1, (), False),  # created twice: the second answer is compared
    ("bad/name", 1, -1, (), False),
    ("zero-partitions", 0, -1, (), False),
    ("rf-3", 1, 3, (), False),
    ("bad-config", 1, -1, (("cleanup.policy", "bogus"),), False),
    ("unknown-config", 1, -1, (("no.such.config", "1"),), False),
    ("validate-only", 2, 1, (), True),
]


def test_create_topics_answers_the_same_error_codes_and_partition_counts(brokers):
    prefix = unique("compat-create")

    def scenario(container):
        address, answers = container.address(), []
        for suffix, partitions, replication_factor, configs, validate_only in CREATE_CASES:
            name = f"{prefix}-{suffix}"
            if suffix == "exists":
                create_topic(address, name)
            answer = create_topic(address, name, partitions, replication_factor, configs, validate_only)
            answers.append((suffix, answer.error_code, answer.num_partitions if answer.error_code == 0 else None,
                            answer.error_message is not None))
        listed = send_request(address, md.MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False)).topics
        return answers, sorted(t.name.removeprefix(prefix + "-") for t in listed if t.name.startswith(prefix))

    answers = on_both(brokers, scenario)
    assert answers["pykbroker"] == answers["kafka"]
    codes = {suffix: code for suffix, code, _, _ in answers["kafka"][0]}
    assert codes == {"ok": ErrorCode.none, "exists": ErrorCode.topic_already_exists,
                     "bad/name": ErrorCode.invalid_topic_exception, "zero-partitions": ErrorCode.invalid_partitions,
                     "rf-3": ErrorCode.invalid_replication_factor, "bad-config": ErrorCode.invalid_config,
                     "unknown-config": ErrorCode.invalid_config, "validate-only": ErrorCode.none}
    assert answers["kafka"][1] == ["exists", "ok"]  # validate_only created nothing


def test_list_offsets_by_timestamp_and_fetch_out_of_range_answer_the_same(brokers):
    """Raw Produce of 3 batches with known timestamps, then ListOffsets by timestamp (earliest, latest, max
    timestamp, before the first, between, after the last) and Fetch past the end."""
    topic = unique("compat-offsets")
    timestamps = [1_000_000, 2_000_000, 3_000_000]
    lookups = [-2, -1, -3, 0, 1_500_000, 3_000_000, 3_000_001]

    def scenario(container):
        address = container.address()
        assert create_topic(address, topic).error_code == ErrorCode.none
        produced = [produce_raw(address, topic, 0, build_batch([(b"k", b"v%d" % i)], timestamp_ms=ts)).base_offset
                    for i, ts in enumerate(timestamps)]
        found = [list_offsets(address, topic, 0, ts) for ts in lookups]
        try:
            beyond = fetch_raw(address, topic, 0, offset=10)
        except Exception as exc:
            beyond = str(exc)
        return produced, found, beyond

    answers = on_both(brokers, scenario)
    assert answers["pykbroker"] == answers["kafka"]
    none = ErrorCode.none
    assert answers["kafka"] == ([0, 1, 2], [(none, 0), (none, 3), (none, 2), (none, 0), (none, 1), (none, 2),
                                            (none, -1)],
                                f"Fetch {topic}-0 at 10: {ErrorCode.offset_out_of_range!r}")


def test_admin_offset_commits_of_a_memberless_group_answer_the_same(brokers):
    """The admin API commits offsets for a group without members (AlterConsumerGroupOffsets), also for a
    partition of an unknown topic; the group's offsets, an unknown group's, and how the group is described."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    topic, group = unique("compat-finished"), unique("compat-finished-group")
    no_topic, no_group = unique("compat-no-topic"), unique("compat-no-group")

    def outcome(future):
        try:
            result = future.result(TIMEOUT_S)
        except Exception as exc:  # KafkaException: the error code is what is compared
            return exc.args[0].name()
        return [(tp.topic, tp.partition, tp.offset, tp.error.name() if tp.error else None)
                for tp in result.topic_partitions]

    def scenario(container):
        bootstrap, address = container.get_bootstrap_server(), container.address()
        assert create_topic(address, topic, 2).error_code == ErrorCode.none
        admin = AdminClient({"bootstrap.servers": bootstrap})
        committed = outcome(admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
            group, [TopicPartition(topic, 0, 5), TopicPartition(topic, 1, 0)])])[group])
        unknown_topic = outcome(admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
            group, [TopicPartition(no_topic, 0, 1)])])[group])
        listed = outcome(admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group])
        unknown_group = outcome(admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(
            no_group, [TopicPartition(topic, 0)])])[no_group])
        (description,) = admin.describe_consumer_groups([group]).values()
        description = description.result(TIMEOUT_S)
        return (committed, unknown_topic, sorted(listed), unknown_group,
                (description.state.name, len(description.members), description.is_simple_consumer_group))

    answers = on_both(brokers, scenario)
    assert answers["pykbroker"] == answers["kafka"]
    offsets = [(topic, 0, 5, None), (topic, 1, 0, None)]
    assert answers["kafka"] == (offsets, [(no_topic, 0, 1, "UNKNOWN_TOPIC_OR_PART")], offsets,
                                [(topic, 0, -1001, None)], ("EMPTY", 0, True))  # -1001: no committed offset


def test_idempotent_produce_sequences_answer_the_same(brokers):
    """Raw Produce of an idempotent producer (InitProducerId, then batches with sequences): in order, a retry of
    an acknowledged batch (a duplicate: its first offset again, nothing appended), a gap in the sequence, a
    bumped epoch then the old one, and batches of producer ids the broker never gave out."""
    topic = unique("compat-idempotent")

    def batch(producer_id, epoch, sequence, value):
        return build_batch([(None, value)], producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence)

    def scenario(container):
        address = container.address()
        assert create_topic(address, topic).error_code == ErrorCode.none
        deadline = time.monotonic() + TIMEOUT_S
        while True:  # Kafka answers COORDINATOR_LOAD_IN_PROGRESS (retriable) until its first producer id block
            try:
                producer_id, epoch = init_producer_id(address)
                break
            except ProtocolError as exc:
                assert "coordinator_load_in_progress" in str(exc) and time.monotonic() < deadline, exc
                time.sleep(0.1)
        answers = []
        for label, produced in [("first", batch(producer_id, epoch, 0, b"a")),
                                ("second", batch(producer_id, epoch, 1, b"b")),
                                ("retry of first", batch(producer_id, epoch, 0, b"a")),
                                ("gap", batch(producer_id, epoch, 5, b"c")),
                                ("next epoch, sequence 0", batch(producer_id, epoch + 1, 0, b"d")),
                                ("the old epoch again", batch(producer_id, epoch, 2, b"d")),
                                ("unknown producer, sequence 0", batch(producer_id + 1000, 0, 0, b"e")),
                                ("unknown producer, sequence 3", batch(producer_id + 2000, 0, 3, b"f"))]:
            answer = produce_raw(address, topic, 0, produced)
            answers.append((label, answer.error_code, answer.base_offset if answer.error_code == 0 else None))
        return answers, list_offsets(address, topic, 0, -1)

    answers = on_both(brokers, scenario)
    assert answers["pykbroker"] == answers["kafka"]
    found = dict((label, (code, offset)) for label, code, offset in answers["kafka"][0])
    assert found["retry of first"] == (ErrorCode.none, 0)  # the duplicate is acknowledged, not appended again
    assert found["gap"] == (ErrorCode.out_of_order_sequence_number, None)
    assert found["the old epoch again"] == (ErrorCode.invalid_producer_epoch, None)


# -- the Kafka container itself ------------------------------------------------------------------------------


def test_the_kafka_container_with_an_invalid_config_fails_start_with_kafkas_message(kafka_image, docker_client):
    before = session_containers(docker_client)
    container = KafkaReferenceContainer(kafka_image, overrides={"num.partitions": "zero"}).with_labels(SUITE_LABELS)
    with pytest.raises(ContainerStartException) as failure:
        container.start()
    assert "exited with code 1" in str(failure.value), failure.value
    assert "Invalid value zero for configuration num.partitions" in str(failure.value), failure.value
    assert session_containers(docker_client) <= before


def test_without_the_reference_kit_the_kafka_tests_skip_saying_where_it_was_looked_for(monkeypatch, tmp_path):
    import kafka_reference

    monkeypatch.setattr(kafka_reference, "default_refkit", lambda: tmp_path / "refkit")
    with pytest.raises(pytest.skip.Exception, match=f"no Apache Kafka at {tmp_path}/refkit/kafka_2.13-3.7.1 "
                                                    r"\(the reference kit is not on this machine\)"):
        kafka_reference.kafka_reference_image("pykbroker-debian:bookworm")


def test_the_kafka_container_refuses_a_bridge_network_whose_voter_would_be_0_0_0_0():
    # kraft_properties names the listen host as the controller voter: 1@0.0.0.0:9094 on a bridge network
    with pytest.raises(ValueError, match=r"runs on the host's network only \(host_network=True\)"):
        KafkaReferenceContainer(host_network=False)

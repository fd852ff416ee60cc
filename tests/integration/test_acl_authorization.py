"""Denied operations get Kafka's error codes, API by API: one table (operation x resource x expected error)
run against pykbroker and against Apache Kafka 3.7.1 from ../shared/refkit configured the same way, with the
same ACLs, answers compared.

Both brokers: a PLAINTEXT listener whose clients are User:ANONYMOUS, a super user (the admin that creates the
topics and ACLs; Kafka's KRaft controller also speaks PLAINTEXT, so its principal must be a super user), and
an SSL listener requiring a client certificate: the test's client is User:CN=client,OU=apps,O=pykbroker.
Kafka runs in KRaft mode with StandardAuthorizer (its ZooKeeper-mode AclAuthorizer answers these codes the
same way; pykbroker serves either class name with AclAuthorizer's semantics). Each row sends one request over
the mTLS connection; the answer's error codes are compared as "authorization failed with code N" or
"allowed" (whatever else the broker answered: the resources' states may differ, authorization may not).
Without the refkit or Java, the Kafka half is skipped and pykbroker is held to the table alone.
"""

from __future__ import annotations

import datetime
import uuid

import pytest

pytest.importorskip("cryptography", reason="certificates for these tests are built with cryptography")

from acl_helpers import (  # noqa: E402
    ALL, ALLOW, CLUSTER_DENIED, CREATE, DENY, DESCRIBE, DESCRIBE_CONFIGS, GROUP, GROUP_DENIED, LITERAL, PREFIXED, READ, TOPIC, TOPIC_DENIED,
    TRANSACTIONAL_ID, TXN_DENIED, WRITE, RawClient, acl_creation, authorization_view, client_tls, create_acls, error_codes,
    schema, secured_settings, wait_for_acl_count,
)
from broker_process import BrokerProcess, free_port, wait_until  # noqa: E402
from pykbroker.protocol.records import TRANSACTIONAL_MASK, build_batch  # noqa: E402
from tls_helpers import standard_pki  # noqa: E402

CLIENT = "User:CN=client,OU=apps,O=pykbroker"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
TOPICS = ("open", "readonly", "writeonly", "denied", "denyread")
S = datetime.timedelta(seconds=1)
ALTER_CONFIGS = 11  # AclOperation.ALTER_CONFIGS
ACLS = [
    (TOPIC, "open", ALL, ALLOW, LITERAL), (TOPIC, "readonly", READ, ALLOW, LITERAL),
    (TOPIC, "writeonly", WRITE, ALLOW, LITERAL), (TOPIC, "denyread", ALL, ALLOW, LITERAL),
    (TOPIC, "denyread", READ, DENY, LITERAL), (TOPIC, "pre-", WRITE, ALLOW, PREFIXED),
    (GROUP, "g-read", READ, ALLOW, LITERAL), (GROUP, "g-describe", DESCRIBE, ALLOW, LITERAL),
    (TRANSACTIONAL_ID, "tx-write", WRITE, ALLOW, LITERAL), (TOPIC, "createonly", CREATE, ALLOW, LITERAL),
    (GROUP, "g-configs", DESCRIBE_CONFIGS, ALLOW, LITERAL), (GROUP, "g-configs", ALTER_CONFIGS, ALLOW, LITERAL),
    (GROUP, "gcfg-", DESCRIBE_CONFIGS, ALLOW, PREFIXED), (GROUP, "gcfg-", ALTER_CONFIGS, ALLOW, PREFIXED),
]


def _prepare(admin: RawClient) -> None:
    """The topics (as the super user) and the client's ACLs, visible to the broker's authorizer."""
    cls, m = schema(19, 7)
    answer = admin.call(cls(topics=tuple(
        m.CreatableTopic(name=name, num_partitions=1, replication_factor=1, assignments=(), configs=())
        for name in TOPICS), timeout=30 * S, validate_only=False))
    assert all(t.error_code == 0 for t in answer.topics), answer
    assert create_acls(admin, [acl_creation(CLIENT, *acl[:3], permission=acl[3], pattern=acl[4]) for acl in ACLS]
                       + [acl_creation("User:other", TOPIC, "denied", READ)]) == [0] * (len(ACLS) + 1)
    wait_for_acl_count(admin, len(ACLS) + 1)
    cls, _ = schema(10, 4)  # the group coordinator ready (__consumer_offsets made), so group answers are stable
    wait_until(lambda: admin.call(cls(key_type=0, coordinator_keys=("g-describe",))).coordinators[0].error_code == 0,
               "the group coordinator", 60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return standard_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def pykbroker_client(tmp_path_factory, pki):
    plain, mtls = free_port(), free_port()
    config = {**secured_settings(pki, plain, mtls, AUTHORIZER), "num.partitions": 1, "offsets.topic.num.partitions": 1,
              "transaction.state.log.num.partitions": 1}
    yield from _serving(BrokerProcess(tmp_path_factory.mktemp("acl-pykbroker"), config=config, port=plain), mtls, pki)


def _serving(broker, mtls: int, pki):
    """Start ``broker``, prepare it, and yield the mTLS client's connection to it; close it after."""
    broker.start()
    try:
        _prepare(RawClient(broker.address))
        client = RawClient(("127.0.0.1", mtls), client_tls(pki, pki.client_pem_file))
        client.admin = RawClient(broker.address)  # User:ANONYMOUS, a super user
        yield client
        client.close()
        client.admin.close()
    finally:
        broker.close()


@pytest.fixture(scope="module")
def kafka_client(tmp_path_factory, pki):
    """The same against Kafka 3.7.1 (KRaft, StandardAuthorizer); None when the refkit cannot run."""
    from reference_kafka import ReferenceKafka

    try:
        kafka = ReferenceKafka(tmp_path_factory.mktemp("acl-kafka"))
    except pytest.skip.Exception:
        yield None
        return
    mtls = free_port()
    settings = secured_settings(pki, kafka.port, mtls, AUTHORIZER)
    settings["listeners"] = (f"PLAINTEXT://{kafka.host}:{kafka.port},MTLS://{kafka.host}:{mtls},"
                             f"CONTROLLER://{kafka.host}:{kafka.controller_port}")
    settings["advertised.listeners"] = f"PLAINTEXT://{kafka.host}:{kafka.port},MTLS://{kafka.host}:{mtls}"
    settings["listener.security.protocol.map"] = "PLAINTEXT:PLAINTEXT,MTLS:SSL,CONTROLLER:PLAINTEXT"
    kafka.overrides.update(settings)
    yield from _serving(kafka, mtls, pki)


# -- the table: (id, request builder, the authorization errors expected at those paths) --------------------

def _produce(*topics, txn=None):
    cls, m = schema(0, 9)
    batch = build_batch([(b"k", b"v")]) if txn is None else build_batch(
        [(b"k", b"v")], producer_id=1, producer_epoch=0, base_sequence=0, attributes=TRANSACTIONAL_MASK)
    return cls(transactional_id=txn, acks=1, timeout=10 * S, topic_data=tuple(
        m.TopicProduceData(name=t, partition_data=(m.PartitionProduceData(index=0, records=batch),)) for t in topics))


def _fetch(*topics, replica_id=-1):
    cls, m = schema(1, 12)
    return cls(cluster_id=None, replica_id=replica_id, max_wait=0 * S, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
               session_id=0, session_epoch=-1, forgotten_topics_data=(), rack_id="", topics=tuple(
                   m.FetchTopic(topic=t, partitions=(m.FetchPartition(
                       partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                       log_start_offset=-1, partition_max_bytes=1 << 16),)) for t in topics))


def _metadata(*topics, create=False):
    cls, m = schema(3, 12)
    return cls(topics=tuple(m.MetadataRequestTopic(topic_id=None, name=t) for t in topics),
               allow_auto_topic_creation=create, include_topic_authorized_operations=False)


def _list_offsets(*topics):
    cls, m = schema(2, 7)
    return cls(replica_id=-1, isolation_level=0, topics=tuple(m.ListOffsetsTopic(name=t, partitions=(
        m.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-1),)) for t in topics))


def _offset_commit(group, *topics):
    cls, m = schema(8, 8)
    return cls(group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
               topics=tuple(m.OffsetCommitRequestTopic(name=t, partitions=(m.OffsetCommitRequestPartition(
                   partition_index=0, committed_offset=0, committed_leader_epoch=-1, committed_metadata=""),))
                   for t in topics))


def _offset_fetch(group, *topics):
    cls, m = schema(9, 8)
    return cls(require_stable=False, groups=(m.OffsetFetchRequestGroup(group_id=group, topics=tuple(
        m.OffsetFetchRequestTopics(name=t, partition_indexes=(0,)) for t in topics)),))


def _find_coordinator(key_type, *keys):
    cls, _ = schema(10, 4)
    return cls(key_type=key_type, coordinator_keys=tuple(keys))


def _join(group):
    cls, m = schema(11, 5)
    return cls(group_id=group, session_timeout=10 * S, rebalance_timeout=10 * S, member_id="",
               group_instance_id=None, protocol_type="consumer",
               protocols=(m.JoinGroupRequestProtocol(name="range", metadata=b""),))


def _heartbeat(group):
    cls, _ = schema(12, 4)
    return cls(group_id=group, generation_id=1, member_id="m", group_instance_id=None)


def _sync(group):
    cls, _ = schema(14, 5)
    return cls(group_id=group, generation_id=1, member_id="m", group_instance_id=None, protocol_type="consumer",
               protocol_name="range", assignments=())


def _leave(group):
    cls, m = schema(13, 4)
    return cls(group_id=group, members=(m.MemberIdentity(member_id="m", group_instance_id=None),))


def _describe_groups(*groups):
    cls, _ = schema(15, 5)
    return cls(groups=tuple(groups), include_authorized_operations=False)


def _delete_groups(*groups):
    cls, _ = schema(42, 2)
    return cls(groups_names=tuple(groups))


def _create_topics(*topics, replication_factor=1):
    cls, m = schema(19, 7)
    return cls(topics=tuple(m.CreatableTopic(name=t, num_partitions=1, replication_factor=replication_factor, assignments=(),
                                             configs=()) for t in topics), timeout=10 * S, validate_only=True)


def _delete_topics(*topics):
    cls, m = schema(20, 6)
    return cls(topics=tuple(m.DeleteTopicState(name=t, topic_id=uuid.UUID(int=0)) for t in topics), timeout=10 * S)


def _create_partitions(*topics):
    cls, m = schema(37, 3)
    return cls(topics=tuple(m.CreatePartitionsTopic(name=t, count=2, assignments=None) for t in topics),
               timeout=10 * S, validate_only=True)


def _describe_configs(*resources):
    cls, m = schema(32, 4)
    return cls(resources=tuple(m.DescribeConfigsResource(resource_type=rtype, resource_name=name,
                                                         configuration_keys=None) for rtype, name in resources),
               include_synonyms=False, include_documentation=False)


def _alter_configs(*resources):
    cls, m = schema(33, 2)
    return cls(resources=tuple(m.AlterConfigsResource(resource_type=rtype, resource_name=name, configs=())
                               for rtype, name in resources), validate_only=True)


def _incremental_alter_configs(*resources):
    cls, m = schema(44, 1)
    return cls(resources=tuple(m.AlterConfigsResource(resource_type=rtype, resource_name=name, configs=(
        m.AlterableConfig(name=_CONFIG_SET[rtype][0], config_operation=0, value=_CONFIG_SET[rtype][1]),))
        for rtype, name in resources), validate_only=True)


# a valid config of each resource type (validate_only: nothing changes)
_CONFIG_SET = {2: ("retention.ms", "1000"), 4: ("log.cleaner.threads", "1"), 32: ("consumer.heartbeat.interval.ms", "6000")}


def _init_producer_id(txn):
    cls, _ = schema(22, 4)
    return cls(transactional_id=txn, transaction_timeout=60 * S, producer_id=-1, producer_epoch=-1)


def _add_partitions(txn, *topics):
    cls, m = schema(24, 3)
    return cls(v3_and_below_transactional_id=txn, v3_and_below_producer_id=1, v3_and_below_producer_epoch=0,
               v3_and_below_topics=tuple(m.AddPartitionsToTxnTopic(name=t, partitions=(0,)) for t in topics))


def _add_offsets(txn, group):
    cls, _ = schema(25, 3)
    return cls(transactional_id=txn, producer_id=1, producer_epoch=0, group_id=group)


def _end_txn(txn):
    cls, _ = schema(26, 3)
    return cls(transactional_id=txn, producer_id=1, producer_epoch=0, committed=True)


def _txn_offset_commit(txn, group, *topics):
    cls, m = schema(28, 3)
    return cls(transactional_id=txn, group_id=group, producer_id=1, producer_epoch=0, generation_id=-1,
               member_id="", group_instance_id=None, topics=tuple(m.TxnOffsetCommitRequestTopic(name=t, partitions=(
                   m.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=0, committed_leader_epoch=-1,
                                                     committed_metadata=""),)) for t in topics))


def _delete_records(*topics):
    cls, m = schema(21, 2)
    return cls(timeout=10 * S, topics=tuple(m.DeleteRecordsTopic(name=t, partitions=(
        m.DeleteRecordsPartition(partition_index=0, offset=0),)) for t in topics))


def _describe_log_dirs():
    cls, _ = schema(35, 4)
    return cls(topics=None)


def _offset_for_leader_epoch(*topics):
    cls, m = schema(23, 4)
    return cls(replica_id=-1, topics=tuple(m.OffsetForLeaderTopic(topic=t, partitions=(
        m.OffsetForLeaderPartition(partition=0, current_leader_epoch=-1, leader_epoch=0),)) for t in topics))


def _describe_producers(*topics):
    cls, m = schema(61, 0)
    return cls(topics=tuple(m.TopicRequest(name=t, partition_indexes=(0,)) for t in topics))


def _describe_transactions(*txns):
    cls, _ = schema(65, 0)
    return cls(transactional_ids=tuple(txns))


def _elect_leaders(*topics):
    cls, m = schema(43, 2)
    return cls(election_type=0, timeout=10 * S,
               topic_partitions=tuple(m.TopicPartitions(topic=t, partitions=(0,)) for t in topics))


def _write_txn_markers(*topics):
    cls, m = schema(27, 1)
    return cls(markers=(m.WritableTxnMarker(producer_id=1, producer_epoch=0, transaction_result=True,
                                            coordinator_epoch=0, topics=tuple(
        m.WritableTxnMarkerTopic(name=t, partition_indexes=(0,)) for t in topics)),))


def _offset_delete(group, *topics):
    cls, m = schema(47, 0)
    return cls(group_id=group, topics=tuple(m.OffsetDeleteRequestTopic(
        name=t, partitions=(m.OffsetDeleteRequestPartition(partition_index=0),)) for t in topics))


def _alter_reassignments(*topics):
    cls, m = schema(45, 0)
    return cls(timeout=10 * S, topics=tuple(m.ReassignableTopic(name=t, partitions=(
        m.ReassignablePartition(partition_index=0, replicas=None),)) for t in topics))


def _list_reassignments():
    cls, _ = schema(46, 0)
    return cls(timeout=10 * S, topics=None)


def _describe_acls():
    cls, _ = schema(29, 3)
    return cls(resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1, principal_filter=None,
               host_filter=None, operation=1, permission_type=1)


def _create_acl():
    cls, _ = schema(30, 3)
    return cls(creations=(acl_creation(CLIENT, TOPIC, "x", READ),))


def _delete_acl():
    cls, m = schema(31, 3)
    return cls(filters=(m.DeleteAclsFilter(resource_type_filter=2, resource_name_filter="x", pattern_type_filter=3,
                                           principal_filter=None, host_filter=None, operation=1, permission_type=1),))


def _describe_scram(*users):
    cls, m = schema(50, 0)
    return cls(users=tuple(m.UserName(name=u) for u in users))


def _alter_scram(upsert, delete):
    cls, m = schema(51, 0)
    return cls(deletions=(m.ScramCredentialDeletion(name=delete, mechanism=1),), upsertions=(
        m.ScramCredentialUpsertion(name=upsert, mechanism=1, iterations=4096, salt=b"salt", salted_password=b"p" * 32),))


ROWS = [
    ("metadata-describe", lambda: _metadata("open", "readonly", "writeonly", "denied", "denyread"),
     {"denied:error_code": TOPIC_DENIED}),
    ("metadata-autocreate-needs-create", lambda: _metadata("pre-new", "missing", create=True),
     {"pre-new:error_code": TOPIC_DENIED, "missing:error_code": TOPIC_DENIED}),
    ("produce-write", lambda: _produce("open", "readonly", "writeonly", "denied", "pre-absent"),
     {"readonly/0:error_code": TOPIC_DENIED, "denied/0:error_code": TOPIC_DENIED}),
    ("produce-transactional-id", lambda: _produce("open", txn="tx-none"), None),
    ("fetch-read", lambda: _fetch("open", "readonly", "writeonly", "denied", "denyread"),
     {"writeonly/0:error_code": TOPIC_DENIED, "denied/0:error_code": TOPIC_DENIED,
      "denyread/0:error_code": TOPIC_DENIED}),
    ("fetch-as-follower-needs-cluster-action", lambda: _fetch("open", replica_id=1),
     {"open/0:error_code": TOPIC_DENIED}),
    ("list-offsets-describe", lambda: _list_offsets("open", "writeonly", "denied"),
     {"denied/0:error_code": TOPIC_DENIED}),
    ("offset-commit-group-read", lambda: _offset_commit("g-describe", "open"), {"open/0:error_code": GROUP_DENIED}),
    ("offset-commit-topic-read", lambda: _offset_commit("g-read", "open", "writeonly", "denied"),
     {"writeonly/0:error_code": TOPIC_DENIED, "denied/0:error_code": TOPIC_DENIED}),
    ("offset-fetch-group-describe", lambda: _offset_fetch("g-none", "open"), {"g-none:error_code": GROUP_DENIED}),
    ("offset-fetch-topic-describe", lambda: _offset_fetch("g-describe", "open", "denied"),
     {"g-describe/denied/0:error_code": TOPIC_DENIED}),
    ("find-coordinator-group", lambda: _find_coordinator(0, "g-read", "g-none"), {"g-none:error_code": GROUP_DENIED}),
    ("find-coordinator-v3", lambda: schema(10, 3)[0](key="g-none", key_type=0), {":error_code": GROUP_DENIED}),
    ("find-coordinator-txn", lambda: _find_coordinator(1, "tx-write", "tx-none"), {"tx-none:error_code": TXN_DENIED}),
    ("join-group", lambda: _join("g-describe"), {":error_code": GROUP_DENIED}),
    ("join-group-allowed", lambda: _join("g-read"), {}),
    ("heartbeat", lambda: _heartbeat("g-none"), {":error_code": GROUP_DENIED}),
    ("sync-group", lambda: _sync("g-describe"), {":error_code": GROUP_DENIED}),
    ("leave-group", lambda: _leave("g-none"), {":error_code": GROUP_DENIED}),
    ("describe-groups", lambda: _describe_groups("g-describe", "g-read", "g-none"),
     {"g-none:error_code": GROUP_DENIED}),
    ("delete-groups", lambda: _delete_groups("g-read", "g-none"),
     {"g-read:error_code": GROUP_DENIED, "g-none:error_code": GROUP_DENIED}),
    ("create-topics", lambda: _create_topics("new-topic"),  # no DESCRIBE_CONFIGS either: no configs shown
     {"new-topic:error_code": TOPIC_DENIED, "new-topic:topic_config_error_code": TOPIC_DENIED}),
    # CREATE but no DESCRIBE_CONFIGS, and the creation fails (3 replicas, 1 broker): no config error either
    ("create-topics-failing", lambda: _create_topics("createonly", replication_factor=3), {}),
    ("delete-topics", lambda: _delete_topics("readonly", "denied"),
     {"readonly:error_code": TOPIC_DENIED, "denied:error_code": TOPIC_DENIED}),
    ("create-partitions", lambda: _create_partitions("readonly"), {"readonly:error_code": TOPIC_DENIED}),
    ("describe-configs", lambda: _describe_configs((2, "open"), (2, "readonly"), (4, "1")),
     {"readonly:error_code": TOPIC_DENIED, "1:error_code": CLUSTER_DENIED}),
    ("alter-configs", lambda: _alter_configs((2, "readonly"), (4, "1")),
     {"readonly:error_code": TOPIC_DENIED, "1:error_code": CLUSTER_DENIED}),
    ("incremental-alter-configs", lambda: _incremental_alter_configs((2, "readonly"), (4, "1")),
     {"readonly:error_code": TOPIC_DENIED, "1:error_code": CLUSTER_DENIED}),
    # GROUP config resources (Kafka 4): DESCRIBE_CONFIGS / ALTER_CONFIGS on the group (READ implies neither)
    ("describe-configs-group", lambda: _describe_configs((32, "g-read")), {"g-read:error_code": GROUP_DENIED}),
    ("incremental-alter-configs-group", lambda: _incremental_alter_configs((32, "g-read")),
     {"g-read:error_code": GROUP_DENIED}),
    # allowed by a literal and by a prefixed ACL; legacy AlterConfigs too
    ("describe-configs-group-allowed", lambda: _describe_configs((32, "g-configs"), (32, "gcfg-x"), (32, "g-read")),
     {"g-read:error_code": GROUP_DENIED}),
    ("incremental-alter-configs-group-allowed",
     lambda: _incremental_alter_configs((32, "g-configs"), (32, "gcfg-x"), (32, "g-read")),
     {"g-read:error_code": GROUP_DENIED}),
    ("alter-configs-group", lambda: _alter_configs((32, "g-configs"), (32, "gcfg-x"), (32, "g-describe")),
     {"g-describe:error_code": GROUP_DENIED}),
    # authorized before the name is checked (KafkaApis): an empty name without an ACL is GROUP_AUTHORIZATION_FAILED
    ("describe-configs-group-empty", lambda: _describe_configs((32, "")), {":error_code": GROUP_DENIED}),
    ("incremental-alter-configs-group-empty", lambda: _incremental_alter_configs((32, "")),
     {":error_code": GROUP_DENIED}),
    ("alter-configs-group-empty", lambda: _alter_configs((32, "")), {":error_code": GROUP_DENIED}),
    ("init-producer-id-txn", lambda: _init_producer_id("tx-none"), {":error_code": TXN_DENIED}),
    ("init-producer-id-idempotent", lambda: _init_producer_id(None), {}),
    ("add-partitions-txn-id", lambda: _add_partitions("tx-none", "open"), {"open/0:partition_error_code": TXN_DENIED}),
    ("add-partitions-topic", lambda: _add_partitions("tx-write", "open", "readonly"),
     {"readonly/0:partition_error_code": TOPIC_DENIED}),
    ("add-offsets-txn-id", lambda: _add_offsets("tx-none", "g-read"), {":error_code": TXN_DENIED}),
    ("add-offsets-group", lambda: _add_offsets("tx-write", "g-describe"), {":error_code": GROUP_DENIED}),
    ("end-txn", lambda: _end_txn("tx-none"), {":error_code": TXN_DENIED}),
    ("txn-offset-commit-txn-id", lambda: _txn_offset_commit("tx-none", "g-read", "open"),
     {"open/0:error_code": TXN_DENIED}),
    ("txn-offset-commit-group", lambda: _txn_offset_commit("tx-write", "g-describe", "open"),
     {"open/0:error_code": GROUP_DENIED}),
    ("delete-records", lambda: _delete_records("readonly", "denied"),
     {"readonly/0:error_code": TOPIC_DENIED, "denied/0:error_code": TOPIC_DENIED}),
    ("describe-log-dirs", _describe_log_dirs, {":error_code": CLUSTER_DENIED}),
    ("offset-for-leader-epoch", lambda: _offset_for_leader_epoch("open", "denied"),
     {"denied/0:error_code": TOPIC_DENIED}),
    ("describe-producers", lambda: _describe_producers("open", "writeonly"),
     {"writeonly/0:error_code": TOPIC_DENIED}),
    ("describe-transactions", lambda: _describe_transactions("tx-none"), {"tx-none:error_code": TXN_DENIED}),
    ("elect-leaders", lambda: _elect_leaders("open"), {":error_code": CLUSTER_DENIED, "open:error_code": CLUSTER_DENIED}),
    ("list-partition-reassignments", _list_reassignments, {":error_code": CLUSTER_DENIED}),
    ("alter-partition-reassignments", lambda: _alter_reassignments("open"),
     {":error_code": CLUSTER_DENIED, "open/0:error_code": CLUSTER_DENIED}),
    ("write-txn-markers", lambda: _write_txn_markers("open"), {"open/0:error_code": CLUSTER_DENIED}),
    ("offset-delete", lambda: _offset_delete("g-read", "open"), {":error_code": GROUP_DENIED}),
    ("describe-acls", _describe_acls, {":error_code": CLUSTER_DENIED}),
    ("create-acls", _create_acl, {":error_code": CLUSTER_DENIED}),
    ("delete-acls", _delete_acl, {":error_code": CLUSTER_DENIED}),
    ("describe-user-scram-credentials", lambda: _describe_scram("alice"), {":error_code": CLUSTER_DENIED}),
    ("alter-user-scram-credentials", lambda: _alter_scram("alice", "bob"),
     {"alice:error_code": CLUSTER_DENIED, "bob:error_code": CLUSTER_DENIED}),
]


def _expect(view: dict[str, int], expected: dict[str, int] | None, row: str) -> None:
    if expected is None:  # the whole request refused with one code at each level
        assert set(view.values()) == {TXN_DENIED}, (row, view)
        return
    for path, code in expected.items():
        assert view.get(path) == code, (row, path, view)
    refused = {path for path, code in view.items() if code}
    assert refused <= set(expected), (row, "refused more than expected", view)


# Where Kafka's KRaft controller answers otherwise than a ZooKeeper-mode broker (the reference, issue 19):
# CreateTopics' topic_config_error_code is set by KafkaApis (ZooKeeper) for every topic the principal may not
# DESCRIBE_CONFIGS, by ControllerApis (KRaft) only for topics it creates. pykbroker follows ZooKeeper mode.
KRAFT_DIFFERS = {"create-topics": {"new-topic:topic_config_error_code"},
                 # Kafka 3.7.1 has no GROUP config resource (Kafka 4's): it fails the request (INVALID_REQUEST)
                 "describe-configs-group": {"g-read:error_code"},
                 "incremental-alter-configs-group": {"g-read:error_code"},
                 **{row: {f"{name}:error_code" for name in ("g-configs", "gcfg-x", "g-read", "g-describe", "")}
                    for row in ("describe-configs-group-allowed", "incremental-alter-configs-group-allowed",
                                "alter-configs-group", "describe-configs-group-empty",
                                "incremental-alter-configs-group-empty", "alter-configs-group-empty")}}


@pytest.mark.parametrize("row", [r[0] for r in ROWS])
def test_authorization_table(row, pykbroker_client, kafka_client):
    _, build, expected = next(r for r in ROWS if r[0] == row)
    ours = authorization_view(pykbroker_client.call(build()))
    _expect(ours, expected, row)
    if kafka_client is not None:
        differs = KRAFT_DIFFERS.get(row, set())
        theirs = {path: code for path, code in authorization_view(kafka_client.call(build())).items()
                  if path not in differs}
        ours = {path: code for path, code in ours.items() if path not in differs}
        _expect(theirs, {p: c for p, c in expected.items() if p not in differs} if expected else expected, row)
        refused = {path: code for path, code in ours.items() if code}
        assert refused == {path: code for path, code in theirs.items() if code}, (row, ours, theirs)


def test_group_configs_allowed_by_literal_and_prefixed_acls_succeed(pykbroker_client):
    """DESCRIBE_CONFIGS / ALTER_CONFIGS on a group (literal or prefixed ACL): the request itself succeeds, through
    DescribeConfigs, IncrementalAlterConfigs and the legacy AlterConfigs (key 33); no error at all."""
    for build in (lambda: _describe_configs((32, "g-configs"), (32, "gcfg-x")),
                  lambda: _incremental_alter_configs((32, "g-configs"), (32, "gcfg-x")),
                  lambda: _alter_configs((32, "g-configs"), (32, "gcfg-x"))):
        answer = pykbroker_client.call(build())
        assert set(error_codes(answer).values()) == {0}, answer
    described = pykbroker_client.call(_describe_configs((32, "gcfg-x"))).results[0]
    assert {c.name for c in described.configs} == {"consumer.session.timeout.ms", "consumer.heartbeat.interval.ms"}


def test_cluster_authorized_operations_are_the_principals(pykbroker_client, kafka_client):
    """DescribeCluster asked for the cluster's operations by a principal without DESCRIBE on it: 0."""
    cls, _ = schema(60, 1)
    for client in filter(None, (pykbroker_client, kafka_client)):
        answer = client.call(cls(include_cluster_authorized_operations=True, endpoint_type=1))
        assert answer.error_code == 0 and answer.cluster_authorized_operations == 0


def test_metadata_hides_topics_the_principal_may_not_describe(pykbroker_client, kafka_client):
    cls, _ = schema(3, 12)
    for client in filter(None, (pykbroker_client, kafka_client)):
        answer = client.call(cls(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=True))
        shown = {t.name: t.topic_authorized_operations for t in answer.topics}
        assert "denied" not in shown and {"open", "readonly", "writeonly", "denyread"} <= set(shown)
        # READ allows READ and (implied) DESCRIBE: bits 3 and 8
        assert shown["readonly"] == (1 << READ) | (1 << DESCRIBE)


def test_describe_groups_authorized_operations_are_the_principals(pykbroker_client, kafka_client):
    """DESCRIBE on the group: the bit field holds DESCRIBE only (bit 8); READ on another: READ and DESCRIBE."""
    cls, _ = schema(15, 5)
    for client in filter(None, (pykbroker_client, kafka_client)):
        answer = client.call(cls(groups=("g-describe", "g-read"), include_authorized_operations=True))
        operations = {g.group_id: g.authorized_operations for g in answer.groups}
        assert operations == {"g-describe": 1 << DESCRIBE, "g-read": (1 << READ) | (1 << DESCRIBE)}, answer


def test_describe_topic_partitions_hides_and_refuses_like_metadata(pykbroker_client):
    """DescribeTopicPartitions (Kafka 3.8+, not in the 3.7.1 reference): a named topic the principal may not
    DESCRIBE answers TOPIC_AUTHORIZATION_FAILED; every topic asked for leaves it out; the others carry the
    principal's authorized operations."""
    cls, m = schema(75, 0)
    answer = pykbroker_client.call(cls(topics=(m.TopicRequest(name="readonly"), m.TopicRequest(name="denied")),
                                       response_partition_limit=100, cursor=None))
    by_name = {t.name: t for t in answer.topics}
    assert by_name["denied"].error_code == TOPIC_DENIED and by_name["readonly"].error_code == 0
    assert by_name["readonly"].topic_authorized_operations == (1 << READ) | (1 << DESCRIBE)
    answer = pykbroker_client.call(cls(topics=(), response_partition_limit=100, cursor=None))
    assert "denied" not in {t.name for t in answer.topics} and "readonly" in {t.name for t in answer.topics}


def test_list_groups_shows_only_the_groups_the_principal_may_describe(pykbroker_client, kafka_client):
    """Without DESCRIBE on the cluster, ListGroups lists the groups the principal may DESCRIBE (READ implies it)."""
    cls, _ = schema(16, 4)
    for client in filter(None, (pykbroker_client, kafka_client)):
        for group in ("g-read", "g-describe", "g-none"):  # groups made by the admin's simple commits
            assert set(authorization_view(client.admin.call(_offset_commit(group, "open"))).values()) == {0}
        everything = {g.group_id for g in client.admin.call(cls(states_filter=())).groups}
        assert {"g-read", "g-describe", "g-none"} <= everything
        listed = {g.group_id for g in client.call(cls(states_filter=())).groups}
        assert listed == everything & {"g-read", "g-describe"}, (everything, listed)


def test_an_idempotent_producer_needs_write_on_some_topic_or_idempotent_write(pykbroker_client, kafka_client, pki):
    """InitProducerId without a transactional id (KIP-679): a principal with no ACL at all is refused with
    CLUSTER_AUTHORIZATION_FAILED; the table's client, with WRITE on a topic, is not (its row above)."""
    from tls_helpers import chain_pem, key_pem

    key, cert = pki.issue("nobody", sans=(), ou="apps", server=False)
    pem = pki.write("nobody.pem", key_pem(key) + chain_pem(cert, pki))
    for client in filter(None, (pykbroker_client, kafka_client)):
        nobody = RawClient(client.address, client_tls(pki, pem))
        assert authorization_view(nobody.call(_init_producer_id(None))) == {":error_code": CLUSTER_DENIED}
        nobody.close()

"""A fully secured 3-broker cluster with stock clients: the README walkthrough's cluster (its certificates,
server.properties and `pykbroker scram add` blocks, run as written with the test's ports and directory), so every
listener is SASL_SSL, the brokers authenticate to each other with SCRAM-SHA-512 as User:broker, and Kafka's
AclAuthorizer runs with super.users=User:admin;User:broker (not User:ANONYMOUS: nothing is let through
unauthenticated) and allow.everyone.if.no.acl.found=false. Users and ACLs are made with confluent-kafka's admin
client as User:admin.

  a leader SIGKILLed under alice's idempotent acks=all producer   RF3, min.insync.replicas=2: a new leader takes
                                      over, the killed broker restarts and rejoins the ISR (it authenticates to
                                      the others again); bob's consumer group reads every acknowledged record
                                      exactly once, in order, and its committed offsets are the end offsets
  ACLs changed through one broker     enforced by the other two within seconds (ZooKeeper's /kafka-acl-changes),
                                      created and deleted
  a transactional producer            TRANSACTIONAL_ID_AUTHORIZATION_FAILED without WRITE on its
                                      TransactionalId, commits with it; bob reads the committed record
"""

from __future__ import annotations

import random
import time
import uuid

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaError, KafkaException, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient, NewTopic, ResourcePatternType,
    ResourceType, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion,
)

import broker_cluster  # noqa: E402,F401  (puts tests/integration and integration/faults on sys.path)
from broker_process import free_port, wait_until  # noqa: E402
from checker import check  # noqa: E402
from cluster_helpers import Walkthrough, config_file_broker  # noqa: E402
from workload import Rec, SeqProducer  # noqa: E402

pytestmark = pytest.mark.timeout(600)
SEED = 19
READY_S = 90.0
FAILOVER_S = 60.0
PROPAGATION_S = 15.0
ALL = {1, 2, 3}
# beside the walkthrough's file: a killed broker is noticed in 6 s, not 18; small internal topics
EXTRA = {"zookeeper.session.timeout.ms": 6000, "replica.lag.time.max.ms": 10000,
         "offsets.topic.num.partitions": 3, "transaction.state.log.num.partitions": 2,
         "group.initial.rebalance.delay.ms": 0, "controlled.shutdown.retry.backoff.ms": 500,
         "auto.create.topics.enable": "false"}


class SecureCluster:
    def __init__(self, walkthrough: Walkthrough):
        self.walkthrough = walkthrough
        self.ca = str(walkthrough.dir / "ca.crt")
        self.brokers = {index: config_file_broker(walkthrough.dir / f"run-{index}", path,
                                                  walkthrough.client_ports[index], self.ca)
                        for index, path in enumerate(walkthrough.broker_configs(), start=1)}

    def settings(self, user: str, ids=ALL) -> dict:
        return {"bootstrap.servers": ",".join(f"127.0.0.1:{self.walkthrough.client_ports[i]}" for i in sorted(ids)),
                "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user,
                "sasl.password": f"{user}-secret", "ssl.ca.location": self.ca}

    def admin(self, ids=ALL) -> AdminClient:
        return AdminClient(self.settings("admin", ids))

    def live(self) -> set[int]:
        return {i for i, broker in self.brokers.items() if broker.is_running()}

    def partition(self, topic: str, index: int):
        """The partition's metadata, None where the broker asked has not got it (yet): a broker just restarted
        answers UNKNOWN_TOPIC_OR_PARTITION, no partitions, until the controller's UpdateMetadata reaches it."""
        metadata = self.admin(self.live()).list_topics(topic, timeout=20)
        found = metadata.topics.get(topic)
        return None if found is None or found.error is not None else found.partitions.get(index)

    def wait_for(self, topic: str, index: int, predicate, what: str, timeout: float = FAILOVER_S):
        found = []

        def probe():
            try:
                partition = self.partition(topic, index)
            except KafkaException:
                return False
            if partition is None:
                return False
            found[:] = [partition]
            return predicate(partition)

        wait_until(probe, what, timeout)
        return found[0]

    def log_tails(self) -> str:
        return "\n".join(broker.log_tail(40) for broker in self.brokers.values())


@pytest.fixture
def cluster(tmp_path, zk_connect):
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("the walkthrough makes its certificates with openssl, which is not installed")
    walkthrough = Walkthrough(tmp_path / "secure", zk_connect, {i: free_port() for i in ALL},
                              {i: free_port() for i in ALL})
    for _, script in walkthrough.of_kind(""):  # certificates, server.properties, SCRAM for broker and admin
        walkthrough.run_sh(script)
    for path in walkthrough.broker_configs():
        with open(path, "a") as properties:
            properties.write("".join(f"{key}={value}\n" for key, value in EXTRA.items()))
    secure = SecureCluster(walkthrough)
    try:
        for broker in secure.brokers.values():
            broker.start(wait=False)
        for broker in secure.brokers.values():
            broker.wait_ready(READY_S)
        admin = secure.admin()
        wait_until(lambda: len(admin.list_topics(timeout=20).brokers) == 3, "3 registered brokers", READY_S)
        for user in ("alice", "bob", "carol"):
            upsertion = UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                                                     f"{user}-secret".encode())
            for future in admin.alter_user_scram_credentials([upsertion]).values():
                future.result(timeout=60)
        yield secure
    except BaseException:
        print(secure.log_tails())
        raise
    finally:
        for broker in secure.brokers.values():
            broker.kill()


def allow(principal: str, resource_type, name: str, operation) -> AclBinding:
    return AclBinding(resource_type, name, ResourcePatternType.LITERAL, principal, "*", operation,
                      AclPermissionType.ALLOW)


def create_acls(admin: AdminClient, bindings: list[AclBinding]) -> None:
    for future in admin.create_acls(bindings).values():
        future.result(timeout=60)


def read_as_group(settings: dict, group: str, topic: str, ends: dict[int, int], timeout: float = 90.0,
                  **extra) -> dict[int, list[tuple[int, bytes]]]:
    """Everything up to ``ends`` (partition -> end offset), read by a consumer of ``group`` that commits what it
    read as the group; the records per partition."""
    consumer = confluent_kafka.Consumer({**settings, "group.id": group, "auto.offset.reset": "earliest",
                                         "enable.auto.commit": False, **extra})
    log: dict[int, list[tuple[int, bytes]]] = {p: [] for p in ends}
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        position = {p: 0 for p in ends}
        while any(position[p] < ends[p] for p in ends):
            assert time.monotonic() < deadline, f"read {position} of {ends} in {timeout} s"
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                assert message.error().retriable() or message.error().code() == KafkaError._PARTITION_EOF, \
                    message.error()
                continue
            log[message.partition()].append((message.offset(), message.value()))
            position[message.partition()] = message.offset() + 1
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(topic, p) for p in ends], timeout=30)
        assert {tp.partition: tp.offset for tp in committed} == ends
    finally:
        consumer.close()
    return log


def end_offsets(settings: dict, group: str, topic: str, partitions) -> dict[int, int]:
    consumer = confluent_kafka.Consumer({**settings, "group.id": group})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
    finally:
        consumer.close()


def test_a_killed_leader_under_alices_idempotent_producer_loses_nothing_bob_reads_it_once(cluster):
    rng = random.Random(SEED)
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    admin = cluster.admin()
    for future in admin.create_topics([NewTopic(topic, 2, 3, config={"min.insync.replicas": "2"})]).values():
        future.result(timeout=60)
    create_acls(admin, [allow("User:bob", ResourceType.GROUP, "billing", AclOperation.READ)])
    create_acls(admin, [allow("User:alice", ResourceType.TOPIC, topic, AclOperation.WRITE),
                        allow("User:alice", ResourceType.TOPIC, topic, AclOperation.DESCRIBE),
                        allow("User:bob", ResourceType.TOPIC, topic, AclOperation.READ)])
    wait_until_enforced(cluster, ["alice", "bob"], topic)
    cluster.wait_for(topic, 0, lambda p: set(p.isrs) == ALL, "a full ISR (replication over SASL_SSL)")
    old_leader = cluster.wait_for(topic, 0, lambda p: p.leader in ALL, "a leader").leader
    producer = SeqProducer(cluster.settings("alice")["bootstrap.servers"], topic, [0, 1], "alice", rate=200,
                           **{k: v for k, v in cluster.settings("alice").items() if k != "bootstrap.servers"})
    producer.start()
    try:
        producer.wait_acked(200 + rng.randrange(200), 60)
        cluster.brokers[old_leader].kill()  # SIGKILL, mid-stream
        cluster.wait_for(topic, 0, lambda p: p.leader in ALL - {old_leader}, "a new leader")
        producer.wait_acked(len(producer.acked) + 200, 90)
        cluster.brokers[old_leader].start(READY_S)  # authenticates to the others again, catches up
        cluster.wait_for(topic, 0, lambda p: set(p.isrs) == ALL, "the restarted broker back in the ISR")
        producer.wait_acked(len(producer.acked) + 100, 60)
    finally:
        producer.stop()
        producer.close()
    assert producer.unflushed == 0
    assert not producer.bad_errors(), producer.bad_errors()[:5]
    bob = cluster.settings("bob")
    ends = end_offsets(bob, "billing", topic, [0, 1])
    log = read_as_group(bob, "billing", topic, ends)
    result = check(producer.acked, log, [[Rec(p, offset, value) for offset, value in records]
                                          for p, records in log.items()])
    assert result.ok, result.summary()
    read = [value for records in log.values() for _, value in records]
    assert len(read) == len(set(read))  # exactly once
    assert {rec.value for rec in producer.acked} <= set(read)


def wait_until_enforced(cluster: SecureCluster, users: list[str], topic: str) -> None:
    """Every broker lets each of ``users`` DESCRIBE ``topic``: ACLs made just before (and, their change
    notifications being read in order, those made before them) are enforced everywhere."""
    for user in users:
        for i in ALL:
            wait_until(lambda: topic_visible(cluster.settings(user, {i}), topic), f"broker {i} allowing {user}",
                       PROPAGATION_S)


def topic_visible(settings: dict, topic: str) -> bool:
    """Does the one broker of ``settings`` let this principal DESCRIBE ``topic`` (a fresh client: its only
    connection is to that broker)?"""
    client = AdminClient(settings)
    answer = client.list_topics(topic, timeout=20).topics[topic]
    if answer.error is None:
        return True
    assert answer.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, answer.error
    return False


def test_acls_changed_through_one_broker_are_enforced_by_the_others(cluster):
    topic = f"ledger-{uuid.uuid4().hex[:6]}"
    admin = cluster.admin()
    for future in admin.create_topics([NewTopic(topic, 1, 3)]).values():
        future.result(timeout=60)
    for i in ALL:
        assert not topic_visible(cluster.settings("carol", {i}), topic)
    binding = allow("User:carol", ResourceType.TOPIC, topic, AclOperation.READ)  # implies DESCRIBE
    through_1, through_3 = cluster.admin({1}), cluster.admin({3})  # (a client must outlive its futures)
    create_acls(through_1, [binding])
    for i in (2, 3):
        wait_until(lambda: topic_visible(cluster.settings("carol", {i}), topic), f"broker {i} allowing carol",
                   PROPAGATION_S)
    deleted = through_3.delete_acls([AclBindingFilter(
        ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:carol", "*", AclOperation.ANY,
        AclPermissionType.ANY)])
    for future in deleted.values():
        assert len(future.result(timeout=60)) == 1
    for i in (1, 2):
        wait_until(lambda: not topic_visible(cluster.settings("carol", {i}), topic), f"broker {i} denying carol again",
                   PROPAGATION_S)


def test_a_transactional_producer_needs_write_on_its_transactional_id(cluster):
    topic = f"invoices-{uuid.uuid4().hex[:6]}"
    transactional_id = f"invoicer-{uuid.uuid4().hex[:6]}"
    admin = cluster.admin()
    for future in admin.create_topics([NewTopic(topic, 1, 3)]).values():
        future.result(timeout=60)
    create_acls(admin, [allow("User:bob", ResourceType.GROUP, "billing-txn", AclOperation.READ)])
    create_acls(admin, [allow("User:alice", ResourceType.TOPIC, topic, AclOperation.WRITE),
                        allow("User:bob", ResourceType.TOPIC, topic, AclOperation.READ)])
    wait_until_enforced(cluster, ["alice", "bob"], topic)
    settings = {**cluster.settings("alice"), "transactional.id": transactional_id}
    denied = confluent_kafka.Producer(settings)
    with pytest.raises(KafkaException) as refused:
        denied.init_transactions(60)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, refused.value
    create_acls(admin, [allow("User:alice", ResourceType.TRANSACTIONAL_ID, transactional_id, AclOperation.WRITE)])
    producers = []

    def initialized() -> bool:  # the coordinator enforces the new ACL within seconds (ZooKeeper's notification)
        producers.append(confluent_kafka.Producer(settings))  # (a refused producer is in a fatal state: a new one)
        try:
            producers[-1].init_transactions(30)
            return True
        except KafkaException as exc:
            assert exc.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, exc
            return False

    wait_until(initialized, "alice's transactional producer allowed", PROPAGATION_S * 2)
    producer = producers[-1]
    producer.begin_transaction()
    producer.produce(topic, b"invoice 1")
    producer.commit_transaction(60)
    bob = cluster.settings("bob")
    ends = end_offsets(bob, "billing-txn", topic, [0])
    assert ends == {0: 2}  # the record and the commit marker
    log = read_as_group(bob, "billing-txn", topic, {0: 1}, **{"isolation.level": "read_committed"})
    assert [value for _, value in log[0]] == [b"invoice 1"]


@pytest.mark.parametrize("super_users, warned", [("User:admin;User:broker", None), ("User:admin", "User:broker")])
def test_the_brokers_principal_warning_names_the_inter_broker_login(tmp_path, super_users, warned, caplog):
    """With the authorizer on, a broker warns when its own principal (what its requests to the other brokers carry)
    is not a super user. On the walkthrough's SASL_SSL inter-broker listener that principal is the JAAS login,
    User:broker, not User:ANONYMOUS (which a PLAINTEXT one carries): no warning as the README writes the file,
    one naming User:broker when super.users leaves it out."""
    import logging

    from pykbroker.config import load_config
    from pykbroker.server.broker import make_authorizer

    walkthrough = Walkthrough(tmp_path / "secure", "127.0.0.1:1/unused", {i: free_port() for i in ALL},
                              {i: free_port() for i in ALL})
    for _, script in walkthrough.of_kind("")[:2]:  # certificates and server.properties
        walkthrough.run_sh(script)
    config = load_config(cli={"super.users": super_users}, env={}, file=walkthrough.broker_configs()[0])
    with caplog.at_level(logging.WARNING, logger="pykbroker.server.broker"):
        assert make_authorizer(config) is not None
    warnings = [record.getMessage() for record in caplog.records if "super.users" in record.getMessage()]
    if warned is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and warnings[0].startswith(f"authorizer on and {warned} is not in super.users"), \
            warnings
        assert "INTERNAL (SASL_SSL)" in warnings[0]

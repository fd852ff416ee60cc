"""ACLs administered and enforced on one broker: ``kafka-acls.sh --bootstrap-server`` unmodified (add, list,
remove; literal and prefixed patterns; the --producer / --consumer shortcuts) with the ACLs kept across a
restart (the metadata journal); CreateAcls' answers to bad input; SECURITY_DISABLED without an authorizer
(as Kafka 3.7.1 answers, compared); a StartupError for an authorizer class pykbroker does not serve; and
confluent-kafka clients with mutual-TLS principals allowed and refused by ACLs, ``super.users`` and
``allow.everyone.if.no.acl.found``."""

from __future__ import annotations

import threading
import uuid

import pytest

pytest.importorskip("cryptography", reason="certificates for these tests are built with cryptography")
confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from acl_helpers import (  # noqa: E402
    CLUSTER, READ, SECURITY_DISABLED, TOPIC, RawClient, acl_creation, acl_count, acl_principals, create_acls,
    delete_acls_request, schema, secured_settings,
)
from broker_process import BrokerProcess, ProtocolError, free_port  # noqa: E402
from kafka_tools import kafka_tools_or_skip  # noqa: E402
from test_startup import assert_one_line_failure, serve  # noqa: E402
from tls_helpers import standard_pki  # noqa: E402

ACL_AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"
CLIENT = "User:CN=client,OU=apps,O=pykbroker"
TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return standard_pki(tmp_path_factory.mktemp("pki"))


def _secured(workdir, pki, **extra) -> BrokerProcess:
    """A broker with ACLs on: PLAINTEXT (User:ANONYMOUS, a super user: the admin) and MTLS (client certificates)."""
    plain, mtls = free_port(), free_port()
    config = {**secured_settings(pki, plain, mtls, ACL_AUTHORIZER), "num.partitions": 1,
              "offsets.topic.num.partitions": 1, **extra}
    broker = BrokerProcess(workdir, config=config, port=plain)
    broker.mtls_bootstrap = f"127.0.0.1:{mtls}"
    return broker.start()


@pytest.fixture
def secured(tmp_path, pki):
    broker = _secured(tmp_path, pki)
    try:
        yield broker
    finally:
        broker.close()


def _mtls(pki, broker) -> dict:
    return {"bootstrap.servers": broker.mtls_bootstrap, "security.protocol": "SSL", "ssl.ca.location": pki.ca_file,
            "ssl.certificate.location": pki.client_pem_file, "ssl.key.location": pki.client_pem_file}


def _acls(tools, broker, *args: str):
    return tools.run("kafka-acls.sh", "--bootstrap-server", broker.bootstrap, *args)


def _create_topic(broker, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(TIMEOUT_S)


def _produce(settings: dict, topic: str) -> Exception | None:
    """Produce one record; None when it was acknowledged, else the delivery error."""
    outcome = []
    producer = confluent_kafka.Producer({**settings, "message.timeout.ms": 10000, "enable.idempotence": False})
    producer.produce(topic, b"value", on_delivery=lambda err, msg: outcome.append(err))
    producer.flush(TIMEOUT_S)
    assert outcome, "no delivery report"
    return outcome[0]


def _consume(settings: dict, topic: str, group: str):
    """(the first record's value or None, the first error met) reading ``topic`` from the start in ``group``."""
    consumer = confluent_kafka.Consumer({**settings, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        deadline_polls = int(TIMEOUT_S / 0.5)
        for _ in range(deadline_polls):
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                return None, message.error()
            return message.value(), None
        return None, None
    finally:
        consumer.close()


# -- kafka-acls.sh -----------------------------------------------------------------------------------------

def test_kafka_acls_tool_adds_lists_and_removes_acls_that_survive_a_restart(secured):
    tools = kafka_tools_or_skip()
    _acls(tools, secured, "--add", "--allow-principal", "User:alice", "--operation", "Read", "--topic", "orders")
    _acls(tools, secured, "--add", "--allow-principal", "User:bob", "--producer", "--topic", "pay",
          "--resource-pattern-type", "prefixed")
    _acls(tools, secured, "--add", "--allow-principal", "User:carol", "--consumer", "--topic", "orders",
          "--group", "billing")
    _acls(tools, secured, "--add", "--deny-principal", "User:mallory", "--operation", "All", "--topic", "*",
          "--allow-host", "*")
    listed = _acls(tools, secured, "--list").stdout
    assert "ResourcePattern(resourceType=TOPIC, name=pay, patternType=PREFIXED)" in listed
    assert "(principal=User:bob, host=*, operation=WRITE, permissionType=ALLOW)" in listed
    assert "(principal=User:bob, host=*, operation=CREATE, permissionType=ALLOW)" in listed
    assert "ResourcePattern(resourceType=GROUP, name=billing, patternType=LITERAL)" in listed
    assert "(principal=User:carol, host=*, operation=READ, permissionType=ALLOW)" in listed
    assert "(principal=User:mallory, host=*, operation=ALL, permissionType=DENY)" in listed
    by_topic = _acls(tools, secured, "--list", "--topic", "orders").stdout
    assert "User:alice" in by_topic and "User:carol" in by_topic and "User:bob" not in by_topic

    _acls(tools, secured, "--remove", "--force", "--allow-principal", "User:alice", "--operation", "Read",
          "--topic", "orders")
    secured.restart()
    listed = _acls(tools, secured, "--list").stdout
    assert "User:alice" not in listed
    assert "User:bob" in listed and "User:carol" in listed and "User:mallory" in listed
    _acls(tools, secured, "--remove", "--force", "--topic", "pay", "--resource-pattern-type", "prefixed")
    assert "User:bob" not in _acls(tools, secured, "--list").stdout


# -- the ACL APIs' answers ----------------------------------------------------------------------------------

def test_create_acls_answers_kafkas_errors_for_bad_input_and_creates_the_rest(secured):
    admin = RawClient(secured.address)
    errors = create_acls(admin, [
        acl_creation("User:alice", TOPIC, "good", READ),
        acl_creation("alice", TOPIC, "no-principal-type", READ),      # not Type:name
        acl_creation("User:alice", CLUSTER, "other-cluster", 9),      # the cluster is kafka-cluster
        acl_creation("User:alice", TOPIC, "", READ),                   # empty name
        acl_creation("User:alice", TOPIC, "a/b", READ),               # "/" cannot be a znode name
    ])
    # UNKNOWN_SERVER_ERROR (-1) where Kafka's AclAuthorizer fails the resource, INVALID_REQUEST (42) otherwise
    assert errors == [0, -1, 42, 42, 42]
    assert acl_count(admin) == 1
    # resource type ANY in one creation: Kafka fails every creation of the request, creating nothing
    assert create_acls(admin, [acl_creation("User:x", TOPIC, "t", READ), acl_creation("User:x", 1, "t", READ)]) \
        == [-1, -1]
    assert acl_count(admin) == 1
    # a code Kafka does not know (UNKNOWN, 0): the request cannot be parsed; Kafka closes the connection
    with pytest.raises((ProtocolError, ConnectionError, OSError)):
        create_acls(admin, [acl_creation("User:x", 0, "t", READ)])
    assert acl_count(RawClient(secured.address)) == 1  # and the broker serves on


def _at_once(address, requests: list) -> list:
    """Each request sent on its own connection (already open) at the same moment; their answers."""
    clients = [RawClient(address) for _ in requests]
    for client in clients:
        acl_count(client)  # connected
    start, answers = threading.Barrier(len(requests)), [None] * len(requests)

    def run(index: int) -> None:
        start.wait(TIMEOUT_S)
        answers[index] = clients[index].call(requests[index])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S)
    for client in clients:
        client.close()
    assert None not in answers, answers
    return answers


def test_concurrent_acl_changes_on_one_pattern_keep_each_others_acls(secured):
    """CreateAcls / DeleteAcls arriving together on two connections for the same pattern: each change is
    applied to the ACLs the other left (Kafka's createAcls / deleteAcls under the authorizer's lock)."""
    admin, create = RawClient(secured.address), schema(30, 3)[0]
    for round_ in range(5):
        topic = f"both-{round_}"
        answers = _at_once(secured.address, [create(creations=(acl_creation("User:alice", TOPIC, topic, READ),)),
                                             create(creations=(acl_creation("User:bob", TOPIC, topic, READ),))])
        assert [a.results[0].error_code for a in answers] == [0, 0]
        assert acl_principals(admin, TOPIC, topic) == ["User:alice", "User:bob"]

        topic = f"swap-{round_}"
        assert create_acls(admin, [acl_creation("User:mallory", TOPIC, topic, READ)]) == [0]
        deleted, created = _at_once(secured.address, [delete_acls_request("User:mallory", TOPIC, topic),
                                                       create(creations=(acl_creation("User:bob", TOPIC, topic, READ),))])
        assert created.results[0].error_code == 0
        assert [acl.principal for acl in deleted.filter_results[0].matching_acls] == ["User:mallory"]
        assert acl_principals(admin, TOPIC, topic) == ["User:bob"]
    admin.close()
    secured.restart()  # the metadata journal holds the same
    admin = RawClient(secured.address)
    for round_ in range(5):
        assert acl_principals(admin, TOPIC, f"both-{round_}") == ["User:alice", "User:bob"]
        assert acl_principals(admin, TOPIC, f"swap-{round_}") == ["User:bob"]


def _security_disabled_answers(address) -> list:
    client = RawClient(address)
    describe, _ = schema(29, 3)
    answer = client.call(describe(resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
                                  principal_filter=None, host_filter=None, operation=1, permission_type=1))
    answers = [(answer.error_code, answer.error_message)]
    answers.append(create_acls(client, [acl_creation("User:a", TOPIC, "t", READ)]))
    delete, m = schema(31, 3)
    answer = client.call(delete(filters=(m.DeleteAclsFilter(
        resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1, principal_filter=None,
        host_filter=None, operation=1, permission_type=1),)))
    answers.append([r.error_code for r in answer.filter_results])
    client.close()
    return answers


def test_without_an_authorizer_the_acl_apis_answer_security_disabled(broker_factory, tmp_path):
    """As Kafka 3.7.1 without authorizer.class.name answers them (compared with the refkit's broker)."""
    ours = _security_disabled_answers(broker_factory.make({}).address)
    assert ours == [(SECURITY_DISABLED, "No Authorizer is configured on the broker"), [SECURITY_DISABLED],
                    [SECURITY_DISABLED]]
    from reference_kafka import ReferenceKafka

    with ReferenceKafka(tmp_path / "kafka") as kafka:  # skips where the refkit cannot run
        assert _security_disabled_answers(kafka.address) == ours


def test_an_authorizer_class_pykbroker_does_not_serve_stops_the_start(tmp_path):
    result = serve("--port", str(free_port()), "--override", "authorizer.class.name=com.example.MyAuthorizer",
                   data_dir=tmp_path / "data")
    assert_one_line_failure(result, "authorizer.class.name=com.example.MyAuthorizer", ACL_AUTHORIZER)
    result = serve("--port", str(free_port()), "--override", f"authorizer.class.name={ACL_AUTHORIZER}",
                   "--override", "super.users=alice", data_dir=tmp_path / "data2")
    assert_one_line_failure(result, "super.users")


# -- clients with mTLS principals --------------------------------------------------------------------------

def test_a_producer_and_a_consumer_group_are_refused_until_their_acls_exist(secured, pki):
    tools = kafka_tools_or_skip()
    topic, group = f"acl-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    _create_topic(secured, topic)
    settings = _mtls(pki, secured)
    error = _produce(settings, topic)
    assert error is not None and error.code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED, error
    _acls(tools, secured, "--add", "--allow-principal", CLIENT, "--producer", "--topic", topic)
    assert _produce(settings, topic) is None
    # READ on the topic, not yet on the group
    _acls(tools, secured, "--add", "--allow-principal", CLIENT, "--operation", "Read", "--topic", topic)
    value, error = _consume(settings, topic, group)
    assert value is None and error is not None and \
        error.code() == confluent_kafka.KafkaError.GROUP_AUTHORIZATION_FAILED, error
    _acls(tools, secured, "--add", "--allow-principal", CLIENT, "--consumer", "--topic", topic, "--group", group)
    assert _consume(settings, topic, group) == (b"value", None)
    # a DENY wins over the ALLOW: the producer is refused again
    _acls(tools, secured, "--add", "--deny-principal", CLIENT, "--operation", "Write", "--topic", topic)
    error = _produce(settings, topic)
    assert error is not None and error.code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED, error


def test_super_users_and_allow_everyone_if_no_acl_found(tmp_path, pki):
    topic = f"acl-{uuid.uuid4().hex[:8]}"
    broker = _secured(tmp_path / "super", pki, **{"super.users": f"User:ANONYMOUS;{CLIENT}"})
    try:
        _create_topic(broker, topic)
        assert _produce(_mtls(pki, broker), topic) is None  # no ACL at all: a super user may
        assert "is not in super.users" not in broker.log_path.read_text()
    finally:
        broker.close()
    broker = _secured(tmp_path / "no-broker-principal", pki, **{"super.users": CLIENT})
    try:  # the brokers' own principal (User:ANONYMOUS on PLAINTEXT) is not a super user: one warning says so
        assert "User:ANONYMOUS is not in super.users" in broker.log_path.read_text()
        assert _produce(_mtls(pki, broker), topic) is None  # the client, a super user, auto-creates the topic
    finally:
        broker.close()
    broker = _secured(tmp_path / "everyone", pki, **{"allow.everyone.if.no.acl.found": "true"})
    try:
        _create_topic(broker, topic)
        _create_topic(broker, topic + "-guarded")
        assert create_acls(RawClient(broker.address), [acl_creation("User:someone", TOPIC, topic + "-guarded", 4)]) == [0]
        settings = _mtls(pki, broker)
        assert _produce(settings, topic) is None  # no ACL on the topic: everyone may
        error = _produce(settings, topic + "-guarded")  # ACLs exist, none for this principal
        assert error is not None and error.code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED, error
    finally:
        broker.close()


def test_a_transactional_producer_with_its_acls_commits(secured, pki):
    """WRITE on the transactional id and the topic is all a transactional producer needs (InitProducerId,
    AddPartitionsToTxn, Produce, EndTxn); the broker's markers to itself run as User:ANONYMOUS, a super user.
    Without the transactional id's ACL, InitProducerId is refused."""
    topic, txn = f"acl-{uuid.uuid4().hex[:8]}", f"tx-{uuid.uuid4().hex[:8]}"
    _create_topic(secured, topic)
    admin = RawClient(secured.address)
    assert create_acls(admin, [acl_creation(CLIENT, TOPIC, topic, 4), acl_creation(CLIENT, TOPIC, topic, READ)]) == [0, 0]
    settings = _mtls(pki, secured)
    producer = confluent_kafka.Producer({**settings, "transactional.id": txn})
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        producer.init_transactions(TIMEOUT_S)
    assert refused.value.args[0].code() == confluent_kafka.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert create_acls(admin, [acl_creation(CLIENT, 5, txn, 4)]) == [0]  # WRITE on the transactional id
    producer = confluent_kafka.Producer({**settings, "transactional.id": txn})
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(TIMEOUT_S)
    assert create_acls(admin, [acl_creation(CLIENT, 3, "reader", READ)]) == [0]
    value, error = _consume({**settings, "isolation.level": "read_committed"}, topic, "reader")
    assert (value, error) == (b"committed", None)

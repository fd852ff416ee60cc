"""Client quotas (KIP-13, KIP-55, KIP-219, KIP-546, KIP-599) on a real broker: DescribeClientQuotas and
AlterClientQuotas over the wire and through Kafka 3.7.1's kafka-configs.sh, and their enforcement on the request
path (server/throttling.py, the connection's mute): producer_byte_rate, consumer_byte_rate, request_percentage,
controller_mutation_rate, defaults and precedence, and the throttled connection reading nothing for the
throttle time. Rates are checked with wide bounds (a loaded 2-core machine runs the suite); the exact figure is
integration/bench/quota_bench.py's. No sleeps: every wait is on a condition with a deadline.
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
import urllib.request
import uuid

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.create_partitions.v3.request import CreatePartitionsRequest, CreatePartitionsTopic
from kio.schema.create_topics.v5.request import CreatableTopic as CreatableTopicV5
from kio.schema.create_topics.v5.request import CreateTopicsRequest as CreateTopicsRequestV5
from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest
from kio.schema.delete_topics.v6.request import DeleteTopicsRequest, DeleteTopicState
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest
from kio.static.primitive import i16, i32

from broker_process import BrokerProcess, free_port
from kafka_tools import kafka_tools_or_skip
from pykbroker.protocol.client import encode_request
from quota_bench import produce, rate
from quota_wire import Wire, alter, create_topic, describe, described, fetch_request, ms, produce_request, throttle_ms

THROTTLING_QUOTA_EXCEEDED = 89


@pytest.fixture
def quota_broker(broker_factory):
    return broker_factory.make()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- AlterClientQuotas / DescribeClientQuotas -------------------------------------------------------------


def test_alter_and_describe_client_quotas_over_the_wire_with_kafkas_errors(quota_broker):
    wire = Wire(quota_broker, "admin")
    try:
        # Kafka's INVALID_REQUEST messages, per entry (ZkAdminManager.alterClientQuotas)
        assert alter(wire, {"user": "alice"}, {"producer_byte_rate": 10.5}) == (
            ErrorCode.invalid_request, "Configuration producer_byte_rate must be a LONG value")
        assert alter(wire, {"client_id": "app"}, {"foo": 1}) == (ErrorCode.invalid_request, "Invalid configuration key foo")
        assert alter(wire, {"user": ""}, {"producer_byte_rate": 1}) == (ErrorCode.invalid_request, "Empty user not supported")
        assert alter(wire, {"user": "alice", "ip": "1.2.3.4"}, {"producer_byte_rate": 1}) == (
            ErrorCode.invalid_request,
            "Invalid quota entity combination, IP entity should not be used with user/client ID entity.")
        assert alter(wire, {"user": "alice"}, {"SCRAM-SHA-256": 1}) == (ErrorCode.unknown_server_error, None)
        # validate_only: checked, nothing written
        assert alter(wire, {"user": "alice"}, {"producer_byte_rate": 1024}, validate_only=True) == (ErrorCode.none, None)
        assert described(describe(wire, [("user", 0, "alice")])) == {}
        assert alter(wire, {"user": "alice"}, {"producer_byte_rate": 1024, "request_percentage": 50.5}) == (
            ErrorCode.none, None)
        assert alter(wire, {"user": "alice", "client_id": None}, {"consumer_byte_rate": 2048}) == (ErrorCode.none, None)
        assert alter(wire, {"client_id": None}, {"controller_mutation_rate": 3}) == (ErrorCode.none, None)
        everything = described(describe(wire, []))
        assert everything == {
            (("user", "alice"),): {"producer_byte_rate": 1024.0, "request_percentage": 50.5},
            (("user", "alice"), ("client-id", None)): {"consumer_byte_rate": 2048.0},
            (("client-id", None),): {"controller_mutation_rate": 3.0},
        }
        assert set(described(describe(wire, [("user", 0, "alice")], strict=True))) == {(("user", "alice"),)}
        assert set(described(describe(wire, [("client-id", 1, None)]))) == {
            (("user", "alice"), ("client-id", None)), (("client-id", None),)}
        # removing a key; the last one removed takes the entity out of the description
        assert alter(wire, {"user": "alice"}, {"request_percentage": None}) == (ErrorCode.none, None)
        assert described(describe(wire, [("user", 0, "alice")], strict=True)) == {
            (("user", "alice"),): {"producer_byte_rate": 1024.0}}
        assert alter(wire, {"user": "alice"}, {"producer_byte_rate": None}) == (ErrorCode.none, None)
        assert described(describe(wire, [("user", 0, "alice")], strict=True)) == {}
        # a filter Kafka refuses: the whole response's error, null entries
        bad = describe(wire, [("user", 0, "a"), ("user", 0, "b")])
        assert (bad.error_code, bad.error_message, bad.entries) == (
            ErrorCode.invalid_request, "Duplicate user filter component entity type", None)
        custom = describe(wire, [("group", 2, None)])
        assert (custom.error_code, custom.error_message) == (
            ErrorCode.unsupported_version, "Custom entity type 'group' not supported")
        # the broker keeps serving this connection
        assert wire.request(ApiVersionsRequest(client_software_name="t", client_software_version="1")).error_code \
            == ErrorCode.none
    finally:
        wire.close()


def test_kafka_configs_sets_quotas_that_take_effect_and_are_described(quota_broker, topic_name):
    tools = kafka_tools_or_skip()
    wire = Wire(quota_broker, "slowpoke")
    try:
        create_topic(wire, topic_name)
        assert throttle_ms(wire.request(produce_request(topic_name, 20_000))) == 0
        tools.run("kafka-configs.sh", "--bootstrap-server", quota_broker.bootstrap, "--alter", "--add-config",
                  "producer_byte_rate=1024,consumer_byte_rate=2048,request_percentage=50",
                  "--entity-type", "clients", "--entity-name", "slowpoke")
        tools.run("kafka-configs.sh", "--bootstrap-server", quota_broker.bootstrap, "--alter", "--add-config",
                  "producer_byte_rate=4096", "--entity-type", "users", "--entity-name", "alice",
                  "--entity-type", "clients", "--entity-default")
        out = tools.run("kafka-configs.sh", "--bootstrap-server", quota_broker.bootstrap, "--describe",
                        "--entity-type", "clients").stdout
        assert "Quota configs for client-id 'slowpoke' are " in out
        assert all(f in out for f in ("producer_byte_rate=1024.0", "consumer_byte_rate=2048.0",
                                      "request_percentage=50.0")), out
        out = tools.run("kafka-configs.sh", "--bootstrap-server", quota_broker.bootstrap, "--describe",
                        "--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients",
                        "--entity-default").stdout
        assert "Quota configs for user-principal 'alice', the default client-id are producer_byte_rate=4096.0" in out
        bad = tools.run("kafka-configs.sh", "--bootstrap-server", quota_broker.bootstrap, "--alter", "--add-config",
                        "producer_byte_rate=10.5", "--entity-type", "clients", "--entity-name", "x", check=False)
        assert bad.returncode != 0
        assert "InvalidRequestException: Configuration producer_byte_rate must be a LONG value" in bad.stdout + bad.stderr
        # In effect for the next request of the connection: 20 kB over 1 kB/s (an 11 s window) is throttled.
        assert throttle_ms(wire.request(produce_request(topic_name, 20_000))) > 0
    finally:
        wire.close()


# -- enforcement ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def quota_client(broker, topic: str, client_id: str, quotas: dict):
    """The topic made, ``quotas`` set on ``client_id``; a connection of that client, closed afterwards."""
    admin = Wire(broker, "admin")
    try:
        create_topic(admin, topic)
        assert alter(admin, {"client_id": client_id}, quotas) == (ErrorCode.none, None)
    finally:
        admin.close()
    wire = Wire(broker, client_id)
    try:
        yield wire
    finally:
        wire.close()


def test_a_throttled_connection_is_answered_at_once_then_not_read_for_the_throttle_time(quota_broker, topic_name):
    with quota_client(quota_broker, topic_name, "muted", {"producer_byte_rate": 10_000}) as wire:
        # 11.6 kB: the rate over the 10 s minimum window is 1160 B/s... against 10 kB/s: no throttle yet
        first = wire.request(produce_request(topic_name, 11_500))
        assert throttle_ms(first) == 0
        # ... the second brings it over: Kafka's throttle is (rate - quota) / quota * window, about 6 s here
        sent = time.monotonic()
        wire.send(produce_request(topic_name, 150_000))
        wire.send(MetadataRequest(topics=(), allow_auto_topic_creation=False,
                                  include_topic_authorized_operations=False))  # pipelined behind it
        second = wire.receive()
        throttle = throttle_ms(second)
        assert second.responses[0].partition_responses[0].error_code == ErrorCode.none  # the produce was done
        assert 500 < throttle < 20_000, throttle
        # Another client on the same broker is not muted meanwhile: its produce, sent while the first connection
        # is muted, is answered before the first connection's pipelined request.
        other = Wire(quota_broker, "unmuted")
        try:
            other.send(produce_request(topic_name, 10_000))
            readable, _, _ = select.select([wire.sock, other.sock], [], [], 60)
            assert readable == [other.sock], "the unthrottled client was answered after the muted one"
            assert throttle_ms(other.receive()) == 0
        finally:
            other.close()
        wire.receive()
        waited = time.monotonic() - sent
        # the metadata request was not read (nor answered) before the throttle time had passed since the answer,
        # which left after ``sent``
        assert waited >= throttle / 1000, (waited, throttle)


def test_a_connection_closed_while_muted_leaves_the_broker_serving_its_client(quota_broker, topic_name):
    with quota_client(quota_broker, topic_name, "closer", {"producer_byte_rate": 1000}) as wire:
        # 100 kB against 1 kB/s: a throttle of about 90 s; a request is pipelined behind it, then the client leaves
        wire.send(produce_request(topic_name, 100_000))
        wire.send(MetadataRequest(topics=(), allow_auto_topic_creation=False,
                                  include_topic_authorized_operations=False))
        assert throttle_ms(wire.receive()) > 30_000
    again = Wire(quota_broker, "closer")  # the same client id, a new connection: not muted
    try:
        started = time.monotonic()
        answer = again.request(ApiVersionsRequest(client_software_name="t", client_software_version="1"))
        assert answer.error_code == ErrorCode.none and time.monotonic() - started < 20
    finally:
        again.close()
    log = quota_broker.log_tail(400)
    assert "Traceback" not in log and " ERROR " not in log, log


def test_a_connection_muted_longer_than_connections_max_idle_ms_is_closed(broker_factory, topic_name):
    """Kafka's Selector expires idle connections whatever their mute state (a byte-rate throttle is unbounded)."""
    broker = broker_factory.make({"connections.max.idle.ms": 2000})
    with quota_client(broker, topic_name, "sleeper", {"producer_byte_rate": 1000}) as wire:
        assert throttle_ms(wire.request(produce_request(topic_name, 100_000))) > 30_000  # muted for ~90 s
        wire.sock.settimeout(30)
        started = time.monotonic()
        assert wire.sock.recv(1) == b""  # closed by the broker ...
        assert time.monotonic() - started < 30  # ... after connections.max.idle.ms, not after the throttle
    assert "idle for more than connections.max.idle.ms" in broker.log_tail(200)


def test_an_acks_0_producer_over_its_byte_rate_gets_no_answer_but_its_connection_is_muted(quota_broker, topic_name):
    with quota_client(quota_broker, topic_name, "fire-and-forget", {"producer_byte_rate": 9000}) as wire:
        # About 100 kB over an 11 s window at 9 kB/s: a throttle of about 1.1 s, which nobody is told of ...
        wire.sock.sendall(encode_request(produce_request(topic_name, 100_000, acks=0), 99, "fire-and-forget"))
        sent = time.monotonic()
        # ... but the next request of the connection is read only after it
        answer = wire.request(ApiVersionsRequest(client_software_name="t", client_software_version="1"))
        waited = time.monotonic() - sent
        assert answer.error_code == ErrorCode.none
        assert waited >= 0.8, waited


def test_a_producer_over_its_byte_rate_is_held_to_it_while_another_client_keeps_its_rate(broker_factory, topic_name):
    pytest.importorskip("confluent_kafka")
    # A 3 s quota window (Kafka's default is 11 s): the first burst a quota allows (its window's worth, taken
    # from the seconds after it) is over within the test's warm-up.
    quota_broker = broker_factory.make({"quota.window.num": 3})
    quota = 50_000  # bytes per second
    admin = Wire(quota_broker, "admin")
    try:
        create_topic(admin, topic_name)
        assert alter(admin, {"client_id": "limited"}, {"producer_byte_rate": quota}) == (ErrorCode.none, None)
    finally:
        admin.close()
    limited_acks, free_acks, limited_throttles, free_throttles = [], [], [], []
    small_batches = {"batch.size": 32_768, "queue.buffering.max.kbytes": 256}
    runs = [threading.Thread(target=produce, args=(quota_broker.bootstrap, topic_name, client, 14.0, a, t),
                             kwargs={"config": small_batches})
            for client, t, a in (("limited", limited_throttles, limited_acks), ("free", free_throttles, free_acks))]
    started = time.monotonic()
    for run in runs:
        run.start()
    for run in runs:
        run.join(120)
    assert not any(run.is_alive() for run in runs)
    # After a warm-up, 6 s of deliveries.
    window = (started + 6.0, started + 12.0)
    limited_rate = rate(limited_acks, *window)
    free_rate = rate(free_acks, *window)
    assert limited_throttles and max(limited_throttles) > 0, "the limited producer was never told of a throttle"
    assert not any(free_throttles), free_throttles
    # Wide bounds for a loaded machine (the benchmark measures the exact figure): held near its quota ...
    assert quota * 0.3 < limited_rate < quota * 1.5, limited_rate
    # ... while the other client, on the same broker at the same time, is not held to it.
    assert free_rate > quota * 4, (free_rate, limited_rate)


def test_consumer_byte_rate_caps_the_fetch_and_answers_an_empty_throttled_fetch(quota_broker, topic_name):
    admin = Wire(quota_broker, "admin")
    consumer = Wire(quota_broker, "reader")
    try:
        create_topic(admin, topic_name)
        for _ in range(40):  # 40 batches of ~1 kB
            response = admin.request(produce_request(topic_name, 1000))
            assert response.responses[0].partition_responses[0].error_code == ErrorCode.none
        assert alter(admin, {"client_id": "reader"}, {"consumer_byte_rate": 1000}) == (ErrorCode.none, None)
        # The fetch size is capped at what the quota allows in its window: 1000 B/s * 10 s.
        first = consumer.request(fetch_request(topic_name, 0))
        records = first.responses[0].partitions[0].records
        assert 0 < len(records) <= 10_000 + 1100, len(records)
        assert throttle_ms(first) == 0
        # The next fetch is over the quota: Kafka answers it empty, with the throttle, and takes the bytes back.
        second = consumer.request(fetch_request(topic_name, 5))
        assert second.responses == () and second.error_code == ErrorCode.none, second
        assert throttle_ms(second) > 0
        # Another client id reads everything at once.
        other = Wire(quota_broker, "other-reader")
        try:
            everything = other.request(fetch_request(topic_name, 0))
            assert len(everything.responses[0].partitions[0].records) > 35_000
            assert throttle_ms(everything) == 0
        finally:
            other.close()
    finally:
        admin.close()
        consumer.close()


def test_request_percentage_throttles_a_client_that_keeps_the_handler_busy(quota_broker):
    admin = Wire(quota_broker, "admin")
    busy = Wire(quota_broker, "busy")
    try:
        assert alter(admin, {"client_id": "busy"}, {"request_percentage": 0.01}) == (ErrorCode.none, None)
        metadata = MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                   include_topic_authorized_operations=False)
        throttles = []
        for _ in range(2000):
            throttles.append(throttle_ms(busy.request(metadata)))
            if throttles[-1] > 0:
                break
        # 0.01 % of one thread over an 11 s window is 1.1 ms of handler time: reached within 2000 requests;
        # the request quota's throttle is at most one window (1 s)
        assert 0 < throttles[-1] <= 1000, throttles[-10:]
        assert throttle_ms(admin.request(metadata)) == 0  # another client id is not throttled
    finally:
        admin.close()
        busy.close()


def test_controller_mutation_rate_refuses_topic_changes_with_throttling_quota_exceeded(quota_broker):
    admin = Wire(quota_broker, "admin")

    def as_creator(request):
        """On a connection of its own: a throttled answer mutes its connection for the throttle time."""
        wire = Wire(quota_broker, "creator")
        try:
            return wire.request(request)
        finally:
            wire.close()

    def create_v7(name: str, partitions: int = 1, validate_only: bool = False):
        return as_creator(CreateTopicsRequest(topics=(CreatableTopic(
            name=name, num_partitions=i32(partitions), replication_factor=i16(1), assignments=(), configs=()),),
            timeout=ms(30_000), validate_only=validate_only))

    try:
        assert alter(admin, {"client_id": "creator"}, {"controller_mutation_rate": 1}) == (ErrorCode.none, None)
        names = [unique("mut") for _ in range(4)]
        # The bucket holds 11 partitions (11 windows of 1 s at 1/s): a 40-partition topic is accepted (the bucket
        # was not below zero) and takes it to -29, which refills in 29 s ...
        assert create_v7(names[0], partitions=40).topics[0].error_code == ErrorCode.none
        # ... and then CreateTopics v7 (strict since v6) refuses the next topic with 89 and Kafka's message.
        refused = create_v7(names[1])
        (topic,) = refused.topics
        # Kafka 3.7.1 (ZooKeeper mode) sends a null message: ApiError.fromThrowable drops the generic one
        assert (topic.error_code, topic.error_message) == (THROTTLING_QUOTA_EXCEEDED, None)
        assert throttle_ms(refused) > 0
        # validate_only takes nothing from the quota and is not refused
        assert create_v7(names[1], validate_only=True).topics[0].error_code == ErrorCode.none
        # DeleteTopics v6 (strict since v5) and CreatePartitions v3 (strict since v3): refused too
        deleted = as_creator(DeleteTopicsRequest(topics=(DeleteTopicState(name=names[0], topic_id=None),),
                                                 timeout=ms(30_000)))
        # (DeleteTopics: Kafka sets only the code)
        assert (deleted.responses[0].error_code, deleted.responses[0].error_message) == (THROTTLING_QUOTA_EXCEEDED, None)
        grown = as_creator(CreatePartitionsRequest(topics=(CreatePartitionsTopic(
            name=names[0], count=i32(41), assignments=None),), timeout=ms(30_000), validate_only=False))
        assert (grown.results[0].error_code, grown.results[0].error_message) == (THROTTLING_QUOTA_EXCEEDED, None)
        # CreateTopics v5 is permissive: accepted, and only throttled
        old = as_creator(CreateTopicsRequestV5(topics=(CreatableTopicV5(
            name=names[2], num_partitions=i32(1), replication_factor=i16(1), assignments=(), configs=()),),
            timeout=ms(30_000), validate_only=False))
        assert old.topics[0].error_code == ErrorCode.none and throttle_ms(old) > 0
        # another client id is not limited
        assert create_topic(admin, names[3], partitions=20).topics[0].error_code == ErrorCode.none
        assert admin.request(DeleteTopicsRequest(topics=(DeleteTopicState(name=names[3], topic_id=None),),
                                                 timeout=ms(30_000))).responses[0].error_code == ErrorCode.none
    finally:
        admin.close()


def test_kafka_topics_is_refused_with_kafkas_throttling_error_over_the_mutation_rate(quota_broker):
    tools = kafka_tools_or_skip()
    admin = Wire(quota_broker, "admin")
    try:  # every client id: kafka-topics.sh's admin client has a generated one
        assert alter(admin, {"client_id": None}, {"controller_mutation_rate": 1}) == (ErrorCode.none, None)
    finally:
        admin.close()
    first, second = unique("tool"), unique("tool")
    tools.run("kafka-topics.sh", "--bootstrap-server", quota_broker.bootstrap, "--create", "--topic", first,
              "--partitions", "20")
    # TopicCommand does not retry on a quota violation: it reports Kafka's error
    refused = tools.run("kafka-topics.sh", "--bootstrap-server", quota_broker.bootstrap, "--create", "--topic",
                        second, "--partitions", "1", check=False)
    assert refused.returncode != 0
    assert "ThrottlingQuotaExceededException: The throttling quota has been exceeded." in refused.stdout + refused.stderr
    listed = tools.run("kafka-topics.sh", "--bootstrap-server", quota_broker.bootstrap, "--list").stdout.split()
    assert first in listed and second not in listed


def test_defaults_and_precedence_user_and_client_before_user_before_client(quota_broker, topic_name):
    admin = Wire(quota_broker, "admin")
    try:
        create_topic(admin, topic_name)
        # PLAINTEXT: the principal is User:ANONYMOUS, so the user entity is "ANONYMOUS"
        for parts, rate in (({"client_id": None}, 1000),                       # every client: 1 kB/s ...
                            ({"client_id": "named"}, 10**9),                   # ... but this client id
                            ({"user": "ANONYMOUS"}, 10**9),                    # a user quota beats client ones
                            ({"user": "ANONYMOUS", "client_id": "tight"}, 1000)):  # user + client beats the user's
            assert alter(admin, parts, {"producer_byte_rate": rate}) == (ErrorCode.none, None)

        def throttled(client_id: str) -> bool:
            wire = Wire(quota_broker, client_id)
            try:
                return throttle_ms(wire.request(produce_request(topic_name, 30_000))) > 0
            finally:
                wire.close()

        assert throttled("tight")
        assert not throttled("named") and not throttled("anyone")  # the user quota applies before the client ones
        assert alter(admin, {"user": "ANONYMOUS"}, {"producer_byte_rate": None}) == (ErrorCode.none, None)
        assert not throttled("named")  # its client-id quota
        assert throttled("anyone-else")  # the default client-id quota
    finally:
        admin.close()


def test_quota_metrics_on_the_prometheus_endpoint(broker_factory, topic_name):
    port = free_port()
    broker = broker_factory.make({"metrics.port": port})
    admin = Wire(broker, "admin")
    try:
        create_topic(admin, topic_name)
        assert alter(admin, {"client_id": "metered"}, {"producer_byte_rate": 1000}) == (ErrorCode.none, None)
        wire = Wire(broker, "metered")
        try:
            assert throttle_ms(wire.request(produce_request(topic_name, 30_000))) > 0
        finally:
            wire.close()
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        lines = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line and not line.startswith("#")}
        labels = '{client_id="metered",user=""}'
        assert lines[f"kafka_server_produce_quota_limit{labels}"] == 1000.0
        assert lines[f"kafka_server_produce_byte_rate{labels}"] > 1000.0
        assert lines[f"kafka_server_produce_throttle_time_ms_total{labels}"] > 0
        assert lines[f"kafka_server_produce_throttles_total{labels}"] == 1.0
        assert f'kafka_server_produce_quota_limit{{client_id="admin",user=""}}' not in lines  # no quota: no limit
    finally:
        admin.close()


def test_a_user_quota_applies_to_the_mutual_tls_principal(tmp_path, topic_name):
    pytest.importorskip("cryptography", reason="certificates for this test are built with cryptography")
    pytest.importorskip("confluent_kafka")
    from tls_helpers import standard_pki

    (tmp_path / "pki").mkdir()
    pki = standard_pki(tmp_path / "pki")
    plain, mtls = free_port(), free_port()
    broker = BrokerProcess(tmp_path / "broker", port=plain, config={
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},MTLS://127.0.0.1:{mtls}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,MTLS:SSL",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": pki.broker_pem_file,
        "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file,
        "listener.name.mtls.ssl.client.auth": "required",
    }).start()
    try:
        check_user_quota_over_mutual_tls(broker, pki, plain, mtls, topic_name)
    finally:
        broker.close()


def check_user_quota_over_mutual_tls(broker, pki, plain: int, mtls: int, topic_name: str) -> None:
    from confluent_kafka import Producer

    admin = Wire(broker, "admin")
    try:
        create_topic(admin, topic_name)
        # Kafka's user entity is the principal's name, stored sanitized: users/CN%3Dclient%2COU%3Dapps%2CO%3Dpykbroker
        user = "CN=client,OU=apps,O=pykbroker"
        assert alter(admin, {"user": user}, {"producer_byte_rate": 1000}) == (ErrorCode.none, None)
        assert set(described(describe(admin, [("user", 0, user)], strict=True))) == {(("user", user),)}
    finally:
        admin.close()

    def throttles_of(bootstrap: str, settings: dict) -> list:
        throttles: list = []
        producer = Producer({"bootstrap.servers": bootstrap, "client.id": "same-client", **settings,
                             "throttle_cb": lambda event: throttles.append(event.throttle_time)})
        for _ in range(30):
            producer.produce(topic_name, b"t" * 1000)
        assert producer.flush(60) == 0
        producer.poll(0)
        return throttles

    with_certificate = throttles_of(f"127.0.0.1:{mtls}", {
        "security.protocol": "SSL", "ssl.ca.location": pki.ca_file,
        "ssl.certificate.location": pki.client_pem_file, "ssl.key.location": pki.client_pem_file})
    assert with_certificate and max(with_certificate) > 0, with_certificate
    # the same client id on PLAINTEXT is User:ANONYMOUS: no quota
    assert not any(throttles_of(f"127.0.0.1:{plain}", {}))


def test_a_quota_set_on_a_single_node_survives_a_crash(quota_broker):
    """AlterClientQuotas answers only once the change is durable in the metadata journal (as AlterConfigs)."""
    wire = Wire(quota_broker, "admin")
    try:
        assert alter(wire, {"user": "crash"}, {"producer_byte_rate": 4096}) == (ErrorCode.none, None)
    finally:
        wire.close()
    quota_broker.restart(kill=True)
    wire = Wire(quota_broker, "admin")
    try:
        assert described(describe(wire, [("user", 0, "crash")], strict=True)) == {
            (("user", "crash"),): {"producer_byte_rate": 4096.0}}
    finally:
        wire.close()


def test_without_cluster_acls_the_client_quota_apis_are_refused_as_kafka_refuses_them(broker_factory):
    """Kafka's getErrorResponse: AlterClientQuotas answers each entry CLUSTER_AUTHORIZATION_FAILED (null
    message, the entity echoed), DescribeClientQuotas the error with a null message and null entries."""
    broker = broker_factory.make({"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer"})
    wire = Wire(broker, "nobody")  # User:ANONYMOUS, no ACL, not a super user
    try:
        assert alter(wire, {"user": "alice"}, {"producer_byte_rate": 1024}) == (31, None)
        refused = describe(wire, [])
        assert (refused.error_code, refused.error_message, refused.entries) == (31, None, None)
    finally:
        wire.close()


def test_a_failed_journal_write_answers_kafka_storage_error_for_the_altered_entities(tmp_path, monkeypatch):
    """As AlterConfigs: the commit's error replaces each changed entity's success; a refused entry keeps its own
    error. The change is applied and made durable by the next commit (here the stop's)."""
    import asyncio
    import types

    from kio.schema.alter_client_quotas.v1.request import AlterClientQuotasRequest, EntityData, EntryData, OpData
    from kio.static.primitive import f64

    from pykbroker.cluster import metadata_log
    from pykbroker.protocol.apis import codec_for
    from pykbroker.server.dispatch import RequestContext
    from pykbroker.server.handlers.client_quotas import alter_client_quotas
    from test_metadata_store import JournalDiskFull, in_process_broker

    request = AlterClientQuotasRequest(entries=(
        EntryData(entity=(EntityData(entity_type="user", entity_name="disk"),),
                  ops=(OpData(key="producer_byte_rate", value=f64(1024.0), remove=False),)),
        EntryData(entity=(EntityData(entity_type="user", entity_name="bad"),),
                  ops=(OpData(key="foo", value=f64(1.0), remove=False),)),
    ), validate_only=False)

    async def scenario():
        broker = in_process_broker(tmp_path)
        monkeypatch.setattr(metadata_log, "os", JournalDiskFull())
        envelope = types.SimpleNamespace(api_key=49, api_version=1, body=request, codec=codec_for(49, 1))
        response = await alter_client_quotas(RequestContext(broker, envelope, "peer"), request)
        monkeypatch.undo()
        await broker.stop()
        return [(e.entity[0].entity_name, e.error_code, e.error_message) for e in response.entries]

    (disk, bad) = asyncio.run(scenario())
    assert disk[:2] == ("disk", ErrorCode.kafka_storage_error) and "not durable" in disk[2]
    assert bad == ("bad", ErrorCode.invalid_request, "Invalid configuration key foo")
    broker = in_process_broker(tmp_path)
    try:
        assert broker.metadata.client_entity_configs().get("users/disk") == {"producer_byte_rate": "1024"}
    finally:
        asyncio.run(broker.stop())

"""Dynamic configs on a single broker: AlterConfigs / IncrementalAlterConfigs for topics and brokers, through
confluent-kafka's AdminClient, the raw protocol (the bad input a stock client will not send) and Kafka
3.7.1's kafka-configs.sh; DescribeConfigs' sources; survival across a restart; effect without a restart."""

from __future__ import annotations

import socket
import time

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)
from kio.schema.alter_configs.v0 import request as ac0
from kio.schema.describe_configs.v4 import request as dcfg
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v1 import request as iac
from kio.static.primitive import i8

from broker_process import BrokerProcess, free_port, list_offset, send_request, wait_until
from pykbroker.kafka_broker_configs import KAFKA_BROKER_CONFIGS
from kafka_tools import kafka_tools_or_skip

TOPIC, BROKER = 2, 4
TIMEOUT = 30.0


def admin_for(broker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def create_topic(admin: AdminClient, name: str, config: dict | None = None, partitions: int = 1) -> None:
    admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])[name].result(TIMEOUT)


def incremental(admin: AdminClient, resource_type, name: str, *entries: tuple[str, str | None, AlterConfigOpType],
                validate_only: bool = False):
    resource = ConfigResource(resource_type, name, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=op) for key, value, op in entries])
    return admin.incremental_alter_configs([resource], validate_only=validate_only)[resource].result(TIMEOUT)


def described(admin: AdminClient, resource_type, name: str) -> dict:
    resource = ConfigResource(resource_type, name)
    return admin.describe_configs([resource])[resource].result(TIMEOUT)


def error_of(call) -> tuple[str, str]:
    with pytest.raises(KafkaException) as info:
        call()
    error = info.value.args[0]
    return error.name(), error.str()


def raw_incremental(address, *resources, validate_only=False):
    """IncrementalAlterConfigs v1: resources are (type, name, [(key, op, value)])."""
    request = iac.IncrementalAlterConfigsRequest(
        resources=tuple(iac.AlterConfigsResource(
            resource_type=i8(kind), resource_name=name,
            configs=tuple(iac.AlterableConfig(name=key, config_operation=i8(op), value=value) for key, op, value in configs))
            for kind, name, configs in resources),
        validate_only=validate_only)
    return [(r.resource_name, r.error_code, r.error_message) for r in send_request(address, request).responses]


def raw_describe(address, kind, name, keys=None):
    request = dcfg.DescribeConfigsRequest(
        resources=(dcfg.DescribeConfigsResource(resource_type=i8(kind), resource_name=name,
                                                configuration_keys=keys),),
        include_synonyms=True, include_documentation=False)
    result = send_request(address, request).results[0]
    assert result.error_code == ErrorCode.none, result.error_message
    return {c.name: c for c in result.configs}


# -- topics -----------------------------------------------------------------------------------------------


def test_topic_configs_set_append_subtract_delete_with_confluent_admin(shared_broker, topic_name):
    admin = admin_for(shared_broker)
    create_topic(admin, topic_name)
    incremental(admin, ConfigResource.Type.TOPIC, topic_name,
                ("retention.ms", "3600000", AlterConfigOpType.SET),
                ("leader.replication.throttled.replicas", "0:1", AlterConfigOpType.APPEND))
    configs = described(admin, ConfigResource.Type.TOPIC, topic_name)
    assert configs["retention.ms"].value == "3600000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["leader.replication.throttled.replicas"].value == "0:1"

    incremental(admin, ConfigResource.Type.TOPIC, topic_name,
                ("leader.replication.throttled.replicas", "1:1", AlterConfigOpType.APPEND))
    incremental(admin, ConfigResource.Type.TOPIC, topic_name,
                ("leader.replication.throttled.replicas", "0:1", AlterConfigOpType.SUBTRACT),
                ("retention.ms", None, AlterConfigOpType.DELETE))
    configs = described(admin, ConfigResource.Type.TOPIC, topic_name)
    assert configs["leader.replication.throttled.replicas"].value == "1:1"
    assert configs["retention.ms"].value == "604800000"
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value

    # validate_only changes nothing
    incremental(admin, ConfigResource.Type.TOPIC, topic_name, ("retention.ms", "1000", AlterConfigOpType.SET),
                validate_only=True)
    assert described(admin, ConfigResource.Type.TOPIC, topic_name)["retention.ms"].value == "604800000"


def test_legacy_alter_configs_replaces_every_override(shared_broker, topic_name):
    admin = admin_for(shared_broker)
    create_topic(admin, topic_name, {"retention.ms": "3600000"})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic_name, set_config={"segment.bytes": "1048576"})
    admin.alter_configs([resource])[resource].result(TIMEOUT)
    configs = described(admin, ConfigResource.Type.TOPIC, topic_name)
    assert configs["segment.bytes"].value == "1048576"
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value  # the old override is gone


def test_bad_topic_alterations_get_kafkas_error_codes(shared_broker, topic_name):
    admin = admin_for(shared_broker)
    create_topic(admin, topic_name)
    topic = ConfigResource.Type.TOPIC
    assert error_of(lambda: incremental(admin, topic, topic_name, ("no.such.config", "1", AlterConfigOpType.SET)))[0] \
        == "INVALID_CONFIG"
    name, message = error_of(lambda: incremental(admin, topic, topic_name, ("retention.ms", "soon", AlterConfigOpType.SET)))
    assert name == "INVALID_CONFIG" and "retention.ms" in message
    assert error_of(lambda: incremental(admin, topic, topic_name, ("cleanup.policy", "archive", AlterConfigOpType.SET)))[0] \
        == "INVALID_CONFIG"
    assert error_of(lambda: incremental(admin, topic, topic_name, ("retention.ms", "5", AlterConfigOpType.APPEND)))[0] \
        == "INVALID_CONFIG"
    assert error_of(lambda: incremental(admin, topic, topic_name + "-missing", ("retention.ms", "5", AlterConfigOpType.SET)))[0] \
        == "UNKNOWN_TOPIC_OR_PART"  # librdkafka's name for it
    # nothing of the above was applied
    assert described(admin, topic, topic_name)["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value


def test_bad_requests_over_the_raw_protocol(shared_broker, topic_name):
    address = shared_broker.address
    create_topic(admin_for(shared_broker), topic_name)
    set_one = [("retention.ms", 0, "1000")]
    # a resource named twice: every occurrence refused, nothing applied
    assert [e for _, e, _ in raw_incremental(address, (TOPIC, topic_name, set_one), (TOPIC, topic_name, set_one))] \
        == [ErrorCode.invalid_request, ErrorCode.invalid_request]
    # a key twice, a null SET, an unknown operation
    assert raw_incremental(address, (TOPIC, topic_name, set_one * 2))[0][1] == ErrorCode.invalid_request
    assert raw_incremental(address, (TOPIC, topic_name, [("retention.ms", 0, None)]))[0][1] == ErrorCode.invalid_request
    assert raw_incremental(address, (TOPIC, topic_name, [("retention.ms", 9, "1")]))[0][1] == ErrorCode.invalid_request
    # other brokers, a broker name that is no id, read-only and unknown broker configs, another resource type
    assert raw_incremental(address, (BROKER, "2", [("log.retention.ms", 0, "1000")]))[0][1:] == (
        ErrorCode.invalid_request, "Unexpected broker id, expected 1, but received 2")
    assert raw_incremental(address, (BROKER, "one", [("log.retention.ms", 0, "1000")]))[0][1] == ErrorCode.invalid_request
    assert raw_incremental(address, (BROKER, "1", [("num.partitions", 0, "3")]))[0][1:] == (
        ErrorCode.invalid_request, "Cannot update these configs dynamically: Set(num.partitions)")
    assert raw_incremental(address, (BROKER, "", [("no.such.key", 0, "3")]))[0][1] == ErrorCode.invalid_config
    # invalid values: INVALID_REQUEST for broker configs (INVALID_CONFIG for topic configs), as Kafka 3.7.1
    assert raw_incremental(address, (BROKER, "", [("log.roll.ms", 0, "0")]))[0][1] == ErrorCode.invalid_request
    assert raw_incremental(address, (BROKER, "", [("log.segment.bytes", 0, "big")]))[0][1] == ErrorCode.invalid_request
    assert raw_incremental(address, (BROKER, "", [("log.cleanup.policy", 0, "archive")]))[0][1] == ErrorCode.invalid_request
    assert raw_incremental(address, (BROKER, "", [("log.retention.ms", 3, "1")]))[0][1] == ErrorCode.invalid_config
    assert raw_describe(address, BROKER, "") == {}  # none of it was applied
    assert raw_incremental(address, (3, "group", set_one))[0][1] == ErrorCode.invalid_request
    # legacy AlterConfigs: a null value
    legacy = ac0.AlterConfigsRequest(resources=(ac0.AlterConfigsResource(
        resource_type=i8(TOPIC), resource_name=topic_name, configs=(ac0.AlterableConfig(name="retention.ms", value=None),)),),
        validate_only=False)
    assert send_request(address, legacy).responses[0].error_code == ErrorCode.invalid_request
    assert raw_describe(address, TOPIC, topic_name, ("retention.ms",))["retention.ms"].config_source == 5
    assert shared_broker.is_running()


# -- brokers ----------------------------------------------------------------------------------------------


def test_dynamic_broker_configs_layer_and_survive_a_restart(broker, topic_name):
    admin = admin_for(broker)
    create_topic(admin, topic_name, {"segment.bytes": "1048576"})
    # librdkafka refuses a BROKER resource named "" (the cluster default): the raw protocol sets it
    assert raw_incremental(broker.address, (BROKER, "", [("log.retention.ms", 0, "7200000")]))[0][1] == ErrorCode.none
    topic = described(admin, ConfigResource.Type.TOPIC, topic_name)
    assert (topic["retention.ms"].value, topic["retention.ms"].source) == (
        "7200000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    incremental(admin, ConfigResource.Type.BROKER, "1", ("log.retention.ms", "3600000", AlterConfigOpType.SET),
                ("leader.replication.throttled.rate", "1000000", AlterConfigOpType.SET))

    def check() -> None:
        address = broker.address
        per_broker = raw_describe(address, BROKER, "1")
        entry = per_broker["log.retention.ms"]
        assert (entry.value, entry.config_source, entry.read_only) == ("3600000", 2, False)  # DYNAMIC_BROKER_CONFIG
        assert [(s.name, s.value, s.source) for s in entry.synonyms][:3] == [
            ("log.retention.ms", "3600000", 2), ("log.retention.ms", "7200000", 3), ("log.retention.hours", "168", 5)]
        assert per_broker["leader.replication.throttled.rate"].value == "1000000"
        assert per_broker["num.partitions"].read_only is True
        default = raw_describe(address, BROKER, "")
        assert {name: (c.value, c.config_source) for name, c in default.items()} == {"log.retention.ms": ("7200000", 3)}
        described_topic = raw_describe(address, TOPIC, topic_name)
        assert (described_topic["retention.ms"].value, described_topic["retention.ms"].config_source) == ("3600000", 2)
        assert described_topic["segment.bytes"].value == "1048576"

    check()
    broker.restart()
    check()
    # deleting the per-broker value uncovers the cluster default
    incremental(admin_for(broker), ConfigResource.Type.BROKER, "1", ("log.retention.ms", None, AlterConfigOpType.DELETE))
    assert raw_describe(broker.address, TOPIC, topic_name)["retention.ms"].value == "7200000"


def test_lowered_retention_deletes_old_segments_without_a_restart(broker_factory, topic_name):
    broker = broker_factory.make(config={"log.retention.check.interval.ms": 200})
    admin = admin_for(broker)
    create_topic(admin, topic_name, {"segment.bytes": "2048"})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for index in range(40):
        producer.produce(topic_name, value=b"x" * 200, key=str(index).encode())
        producer.flush(TIMEOUT)
    assert list_offset(broker.address, topic_name, 0, -2) == 0
    # the cluster-wide default applies to the topic, which has no override of its own
    assert raw_incremental(broker.address, (BROKER, "", [("log.retention.ms", 0, "1")]))[0][1] == ErrorCode.none
    wait_until(lambda: list_offset(broker.address, topic_name, 0, -2) > 0, "old segments deleted", TIMEOUT)


# -- Kafka's own tool ---------------------------------------------------------------------------------------


def test_kafka_configs_sh_alters_and_describes_topic_and_broker_configs(broker, topic_name):
    tools = kafka_tools_or_skip()
    create_topic(admin_for(broker), topic_name)
    tools.run("kafka-configs.sh", "--bootstrap-server", broker.bootstrap, "--alter", "--entity-type", "topics",
              "--entity-name", topic_name, "--add-config", "retention.ms=3600000,max.message.bytes=2097152")
    tools.run("kafka-configs.sh", "--bootstrap-server", broker.bootstrap, "--alter", "--entity-type", "brokers",
              "--entity-default", "--add-config", "log.segment.bytes=2097152")
    out = tools.run("kafka-configs.sh", "--bootstrap-server", broker.bootstrap, "--describe", "--entity-type", "topics",
                    "--entity-name", topic_name).stdout
    assert "retention.ms=3600000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=3600000" in out
    assert "max.message.bytes=2097152" in out
    out = tools.run("kafka-configs.sh", "--bootstrap-server", broker.bootstrap, "--describe", "--entity-type", "brokers",
                    "--entity-name", "1", "--all").stdout
    assert "log.segment.bytes=2097152 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:log.segment.bytes=2097152" in out
    out = tools.run("kafka-configs.sh", "--bootstrap-server", broker.bootstrap, "--describe", "--entity-type", "brokers",
                    "--entity-default").stdout
    assert "log.segment.bytes=2097152 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:log.segment.bytes=2097152}" in out
    refused = tools.run("kafka-configs.sh", "--bootstrap-server", broker.bootstrap, "--alter", "--entity-type", "brokers",
                        "--entity-name", "1", "--add-config", "num.partitions=3", check=False)
    assert refused.returncode != 0 and "Cannot update these configs dynamically" in refused.stdout + refused.stderr



def test_kafka_python_admin_alters_topic_and_broker_configs(broker, topic_name):
    from kafka.admin import AlterConfigOp, KafkaAdminClient
    from kafka.admin import ConfigResource as KpResource
    from kafka.admin import ConfigResourceType

    create_topic(admin_for(broker), topic_name)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30000)
    try:
        admin.alter_configs([KpResource(ConfigResourceType.TOPIC, topic_name, configs={"segment.bytes": "1048576"})],
                            incremental=False)  # AlterConfigs
        admin.alter_configs([KpResource(ConfigResourceType.TOPIC, topic_name,
                                        configs={"retention.ms": (AlterConfigOp.SET, "3600000")})])
        admin.alter_configs([KpResource(ConfigResourceType.BROKER, "1",
                                        configs={"log.retention.bytes": (AlterConfigOp.SET, "1073741824")})])
    finally:
        admin.close()
    topic = raw_describe(broker.address, TOPIC, topic_name)
    assert (topic["segment.bytes"].value, topic["segment.bytes"].config_source) == ("1048576", 1)
    assert (topic["retention.ms"].value, topic["retention.ms"].config_source) == ("3600000", 1)
    assert (topic["retention.bytes"].value, topic["retention.bytes"].config_source) == ("1073741824", 2)


# -- every Kafka 3.7.1 config name (issue 18: librdkafka's tests 0081 and 0092) ------------------------------


def test_deprecated_topic_configs_are_accepted_described_and_applied_as_kafka(shared_broker, topic_name):
    """librdkafka 0092 sets message.format.version 0.10.0.0 with AlterConfigs; Kafka 3.7.1 accepts any version it
    knows (ignored with inter.broker.protocol.version >= 3.0) and refuses others with INVALID_CONFIG."""
    admin = admin_for(shared_broker)
    create_topic(admin, topic_name)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic_name, set_config={
        "message.format.version": "0.10.0.0", "message.downconversion.enable": "false",
        "message.timestamp.difference.max.ms": "60000"})
    admin.alter_configs([resource])[resource].result(TIMEOUT)
    warning = (f"Topic configuration message.format.version with value `0.10.0.0` is ignored for `{topic_name}` "
               "because the inter-broker protocol version")  # as Kafka logs it
    wait_until(lambda: warning in shared_broker.log_path.read_text(errors="replace"), "the broker's warning", TIMEOUT)
    configs = described(admin, ConfigResource.Type.TOPIC, topic_name)
    for name, value in (("message.format.version", "0.10.0.0"), ("message.downconversion.enable", "false"),
                        ("message.timestamp.difference.max.ms", "60000")):
        assert (configs[name].value, configs[name].source) == (value, ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    for version in ("3.7.1", "2.8-IV1", "0.8.2"):
        incremental(admin, ConfigResource.Type.TOPIC, topic_name, ("message.format.version", version, AlterConfigOpType.SET))
    assert error_of(lambda: incremental(admin, ConfigResource.Type.TOPIC, topic_name,
                                        ("message.format.version", "9.9", AlterConfigOpType.SET))) == (
        "INVALID_CONFIG", "Invalid value 9.9 for configuration message.format.version: Version 9.9 is not a valid version")
    # message.timestamp.difference.max.ms bounds both ways while before/after.max.ms keep their default (KIP-937)
    results: list[str] = []
    producer = Producer({"bootstrap.servers": shared_broker.bootstrap})
    now_ms = int(time.time() * 1000)
    for offset_ms in (-3_600_000, 3_600_000, 0):
        producer.produce(topic_name, b"v", timestamp=now_ms + offset_ms,
                         on_delivery=lambda error, _: results.append(error.name() if error else "OK"))
        producer.flush(TIMEOUT)
    assert results == ["INVALID_TIMESTAMP", "INVALID_TIMESTAMP", "OK"]


def test_every_kafka_broker_config_is_known_and_kafka_dynamic_ones_are_accepted(shared_broker):
    """librdkafka 0081 sets sasl.kerberos.min.time.before.relogin on a BROKER resource; Kafka 3.7.1 accepts it per
    broker (read_only false), refuses it as the cluster default, and refuses read-only and invalid values with
    INVALID_REQUEST in its words (answers measured against Kafka 3.7.1)."""
    admin = admin_for(shared_broker)
    broker = ConfigResource.Type.BROKER
    incremental(admin, broker, "1", ("sasl.kerberos.min.time.before.relogin", "58000", AlterConfigOpType.SET))
    resource = ConfigResource(broker, "1", set_config={"sasl.kerberos.min.time.before.relogin": "60000"})
    admin.alter_configs([resource])[resource].result(TIMEOUT)  # the legacy API replaces the broker's dynamic configs
    configs = described(admin, broker, "1")
    for name, _, _, _, mode in KAFKA_BROKER_CONFIGS:
        assert name in configs, name
        assert configs[name].is_read_only == (mode == "read-only"), name
    entry = configs["sasl.kerberos.min.time.before.relogin"]
    assert (entry.value, entry.source) == ("60000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    assert configs["ssl.keystore.password"].is_sensitive and configs["ssl.keystore.password"].value is None
    address = shared_broker.address
    answers = {
        ("", "sasl.kerberos.min.time.before.relogin", "58000"):
            "Cannot update these configs at default cluster level, broker id must be specified: "
            "Set(sasl.kerberos.min.time.before.relogin)",
        ("1", "sasl.kerberos.min.time.before.relogin", "abc"):
            "Invalid value abc for configuration sasl.kerberos.min.time.before.relogin: Not a number of type LONG",
        ("1", "broker.rack", "r1"): "Cannot update these configs dynamically: Set(broker.rack)",
        ("1", "ssl.keystore.type", "PKCS12"):
            "These security configs can be dynamically updated only per-listener using the listener prefix: "
            "HashSet(ssl.keystore.type)",
        ("1", "background.threads", "-1"): "Invalid value -1 for configuration background.threads: Value must be at least 1",
        ("1", "ssl.client.auth", "maybe"):
            "Invalid value maybe for configuration ssl.client.auth: String must be one of: required, requested, none",
    }
    for (entity, name, value), message in answers.items():
        assert raw_incremental(address, (BROKER, entity, [(name, 0, value)]))[0][1:] == (ErrorCode.invalid_request, message)
    # cluster-wide dynamic configs pykbroker does not use are accepted as the cluster default too, and stored
    assert raw_incremental(address, (BROKER, "", [("num.io.threads", 0, "9")]))[0][1] == ErrorCode.none
    assert raw_describe(address, BROKER, "")["num.io.threads"].value == "9"
    assert raw_incremental(address, (BROKER, "", [("num.io.threads", 1, None)]))[0][1] == ErrorCode.none
    assert shared_broker.is_running()


def test_kafkas_reconfiguration_checks_listener_overrides_and_password_configs(broker):
    """Kafka 3.7.1's other refusals of a dynamic broker config (its answers, measured in ZooKeeper and KRaft mode):
    thread counts beyond half/double the current value, listener configs that do not parse, KafkaConfig's
    requirements; a password config is not stored (ZooKeeper mode without password.encoder.secret); listener
    overrides (listener.name.<listener>.<config>) are accepted per broker, typed as their base, and described."""
    address = broker.address
    wrapped = "Invalid value org.apache.kafka.common.config.ConfigException: {} for configuration Invalid dynamic configuration"
    answers = {
        ("1", "num.io.threads", "3"): (ErrorCode.invalid_request, wrapped.format(
            "Dynamic thread count update validation failed for num.io.threads=3, value should be at least half the "
            "current value 8")),
        ("", "num.replica.fetchers", "3"): (ErrorCode.invalid_request, wrapped.format(
            "Dynamic thread count update validation failed for num.replica.fetchers=3, value should not be greater "
            "than double the current value 1")),
        ("1", "log.cleaner.threads", "10"): (ErrorCode.invalid_request, wrapped.format(
            "Log cleaner threads cannot be increased to more than double the current value 1")),
        ("1", "log.cleaner.dedupe.buffer.size", "1000"): (ErrorCode.invalid_request,
            "requirement failed: log.cleaner.dedupe.buffer.size must be at least 1MB per cleaner thread."),
        ("1", "listeners", "x"): (ErrorCode.invalid_request,
            "Error creating broker listeners from 'x': Unable to parse x to a broker endpoint"),
        ("1", "advertised.listeners", "FOO://127.0.0.1:1"): (ErrorCode.invalid_request,
            "Error creating broker listeners from 'FOO://127.0.0.1:1': No security protocol defined for listener FOO"),
        ("1", "listener.security.protocol.map", "PLAINTEXT:FOO"): (ErrorCode.invalid_request,
            "Invalid security protocol `FOO` defined in listener.security.protocol.map"),
        ("1", "listener.security.protocol.map", "PLAINTEXT:SSL"): (ErrorCode.invalid_request, wrapped.format(
            "Security protocol cannot be updated for existing listener ListenerName(PLAINTEXT)")),
        ("1", "advertised.listeners", "PLAINTEXT://0.0.0.0:1"): (ErrorCode.invalid_request,
            "requirement failed: advertised.listeners cannot use the nonroutable meta-address 0.0.0.0. Use a routable IP address."),
        ("1", "listener.name.plaintext.max.connections", "x"): (ErrorCode.invalid_request,
            "Invalid value x for configuration max.connections: Not a number of type INT"),
        ("", "listener.name.plaintext.ssl.keystore.type", "PKCS12"): (ErrorCode.invalid_request,
            "Cannot update these configs at default cluster level, broker id must be specified: "
            "Set(listener.name.plaintext.ssl.keystore.type)"),
        ("1", "sasl.jaas.config", "x"): (ErrorCode.invalid_config,
            "Invalid config value for resource ConfigResource(type=BROKER, name='1'): Password encoder secret not configured"),
        ("1", "listener.name.sasl_plaintext.plain.sasl.jaas.config", "x"): (ErrorCode.invalid_config,
            "Invalid config value for resource ConfigResource(type=BROKER, name='1'): Password encoder secret not configured"),
    }
    for (entity, name, value), answer in answers.items():
        assert raw_incremental(address, (BROKER, entity, [(name, 0, value)]))[0][1:] == answer, name
    # what Kafka accepts: a thread count within bounds, a password config validated only, listener overrides
    assert raw_incremental(address, (BROKER, "1", [("num.io.threads", 0, "16")]))[0][1] == ErrorCode.none
    assert raw_incremental(address, (BROKER, "1", [("sasl.jaas.config", 0, "x")]), validate_only=True)[0][1] == ErrorCode.none
    assert raw_incremental(address, (BROKER, "1", [("listener.name.sasl_plaintext.plain.sasl.jaas.config", 0, "x")]),
                           validate_only=True)[0][1] == ErrorCode.none
    assert raw_incremental(address, (BROKER, "1", [("listener.name.plaintext.ssl.keystore.type", 0, "PKCS12")]))[0][1] \
        == ErrorCode.none
    assert raw_incremental(address, (BROKER, "", [("listener.name.plaintext.max.connections", 0, "5")]))[0][1] \
        == ErrorCode.none
    per_broker = raw_describe(address, BROKER, "1")
    override = per_broker["listener.name.plaintext.ssl.keystore.type"]
    assert (override.value, override.config_source, override.read_only) == ("PKCS12", 2, True)
    assert [(s.name, s.value, s.source) for s in override.synonyms] == [
        ("listener.name.plaintext.ssl.keystore.type", "PKCS12", 2), ("ssl.keystore.type", "JKS", 5)]
    assert per_broker["listener.name.plaintext.max.connections"].value == "5"
    assert per_broker["num.io.threads"].value == "16"
    assert raw_describe(address, BROKER, "")["listener.name.plaintext.max.connections"].config_source == 3
    broker.restart()  # stored, and still valid when read back
    assert raw_describe(broker.address, BROKER, "1")["listener.name.plaintext.ssl.keystore.type"].value == "PKCS12"


def test_a_config_files_kafka_keys_and_listener_overrides_are_described_as_static(broker_factory):
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="a" password="s3cr3t";'
    broker = broker_factory.make({"num.io.threads": 4, "listener.name.plaintext.max.connections": 7,
                                  "log.message.format.version": "2.8",
                                  "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas})
    configs = raw_describe(broker.address, BROKER, "1")
    assert (configs["num.io.threads"].value, configs["num.io.threads"].config_source) == ("4", 4)
    assert configs["log.message.format.version"].value == "2.8"
    override = configs["listener.name.plaintext.max.connections"]
    assert (override.value, override.config_source, override.read_only) == ("7", 4, True)
    assert [(s.name, s.value, s.source) for s in override.synonyms] == [
        ("listener.name.plaintext.max.connections", "7", 4), ("max.connections", "2147483647", 5)]
    assert (configs["log.dirs"].value, configs["log.dirs"].config_source) == (str(broker.data_dir), 4)  # --data-dir
    password = configs["listener.name.sasl_plaintext.plain.sasl.jaas.config"]  # kept, shown as Kafka shows it
    assert (password.value, password.is_sensitive, password.config_source) == (None, True, 4)
    assert [(s.name, s.value) for s in password.synonyms] == [("listener.name.sasl_plaintext.plain.sasl.jaas.config", None)]
    assert "s3cr3t" not in broker.log_path.read_text()


def test_a_kraft_controller_listener_is_neither_opened_nor_warned_about(tmp_path):
    """As in Kafka's config/kraft/server.properties: the CONTROLLER listener of controller.listener.names is
    not served (pykbroker is no KRaft controller); the log says so once, and warns of nothing about it."""
    port, controller_port = free_port(), free_port()
    broker = BrokerProcess(tmp_path / "kraft", port=port, config={
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}", "controller.listener.names": "CONTROLLER",
        "process.roles": "broker,controller", "node.id": 1,
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"})
    try:
        broker.start()
        log = broker.log_path.read_text()
        assert log.count("KRaft controller listeners (controller.listener.names: CONTROLLER) are not served") == 1
        assert "is not in advertised.listeners" not in log
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", controller_port)) != 0
    finally:
        broker.close()

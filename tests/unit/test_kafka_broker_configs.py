"""Kafka 3.7.1's broker config catalogue (pykbroker/kafka_broker_configs.py) as config.py and
cluster/dynamic_configs.py use it, and the deprecated topic configs' validation and effect (issue 18)."""

from __future__ import annotations

import logging

import pytest

from pykbroker.cluster.dynamic_configs import parse_dynamic_configs
from pykbroker.config import (
    BROKER_CONFIGS,
    TOPIC_CONFIGS,
    ConfigError,
    load_config,
    metadata_version_known,
    validate_topic_configs,
    warn_ignored_topic_configs,
)
from pykbroker.kafka_broker_configs import KAFKA_BROKER_CONFIGS
from pykbroker.log.config import LogConfig
from pykbroker.protocol.errors import ErrorCode, KafkaError

LONG_MAX = 2**63 - 1
# Broker configs whose default pykbroker changes on purpose (their doc says why).
DELIBERATE_DEFAULTS = {"broker.id", "listeners", "offsets.topic.replication.factor", "queued.max.request.bytes",
                      "log.dirs"}


def test_every_kafka_broker_config_is_known_with_kafkas_type_default_and_update_mode():
    assert len(KAFKA_BROKER_CONFIGS) == 285
    for name, type_, default, _, mode in KAFKA_BROKER_CONFIGS:
        definition = BROKER_CONFIGS[name]
        assert definition.type == type_, name
        assert definition.read_only == (mode == "read-only"), name
        assert definition.sensitive == (type_ == "password"), name
        if name not in DELIBERATE_DEFAULTS:
            expected = None if default is None else definition.parse(default)
            assert definition.default == expected, name


def test_kafka_broker_configs_pykbroker_does_not_use_load_from_a_file_and_are_validated(tmp_path):
    file = tmp_path / "server.properties"
    file.write_text("num.io.threads=4\nsasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256\nssl.client.auth=required\n")
    config = load_config(file=file, env={})
    assert config.get("num.io.threads") == 4
    assert config.get("sasl.enabled.mechanisms") == ["PLAIN", "SCRAM-SHA-256"]
    assert config.get("ssl.client.auth") == "required"
    assert "no effect here" in BROKER_CONFIGS["num.io.threads"].doc
    file.write_text("background.threads=0\n")
    with pytest.raises(ConfigError, match="background.threads.*at least 1"):
        load_config(file=file, env={})


@pytest.mark.parametrize(("configs", "per_broker", "error", "message"), [
    ({"sasl.kerberos.min.time.before.relogin": "58000"}, True, None, None),
    ({"sasl.kerberos.min.time.before.relogin": "58000"}, False, ErrorCode.invalid_request,
     "Cannot update these configs at default cluster level, broker id must be specified: "
     "Set(sasl.kerberos.min.time.before.relogin)"),
    ({"num.io.threads": "9", "producer.id.expiration.ms": "100000"}, False, None, None),
    ({"ssl.truststore.location": "/x"}, True, ErrorCode.invalid_request,
     "These security configs can be dynamically updated only per-listener using the listener prefix: "
     "HashSet(ssl.truststore.location)"),
    ({"log.message.format.version": "0.10.0"}, True, ErrorCode.invalid_request,
     "Cannot update these configs dynamically: Set(log.message.format.version)"),
    ({"max.connections": "x"}, True, ErrorCode.invalid_request,
     "Invalid value x for configuration max.connections: Not a number of type INT"),
    ({"no.such.config": "1"}, True, ErrorCode.invalid_config, "Unknown broker config name: no.such.config"),
    ({"broker.rack": "r", "foo.bar": "1"}, True, ErrorCode.invalid_request,  # Kafka's checks before ours
     "Cannot update these configs dynamically: Set(broker.rack)"),
    ({"ssl.truststore.location": "/x", "foo.bar": "1"}, True, ErrorCode.invalid_request,
     "These security configs can be dynamically updated only per-listener using the listener prefix: "
     "HashSet(ssl.truststore.location)"),
    ({"max.connections": "1", "foo.bar": "1"}, True, ErrorCode.invalid_config, "Unknown broker config name: foo.bar"),
])
def test_dynamic_broker_configs_are_checked_in_kafkas_order_and_words(configs, per_broker, error, message):
    if error is None:
        assert set(parse_dynamic_configs(configs, per_broker=per_broker)) == set(configs)
        return
    with pytest.raises(KafkaError) as info:
        parse_dynamic_configs(configs, per_broker=per_broker)
    assert (info.value.code, info.value.message) == (error, message)


@pytest.mark.parametrize(("version", "known"), [
    ("0.10.0.0", True), ("0.10.0", True), ("0.10.0-IV1", True), ("0.8.2.1", True), ("2.8", True), ("2.8-IV1", True),
    ("3.0-IV1", True), ("3.7.1", True), ("3.8-IV0", True), ("3.8", False),
    ("3.8.0", False), ("3.9", False), ("9.9", False), ("0.7", False), ("", False),
    ("2.8-IV9", False), ("latest", False),
])
def test_message_format_version_accepts_what_kafkas_metadata_version_parser_does(version, known):
    assert metadata_version_known(version) is known
    if known:
        assert validate_topic_configs({"message.format.version": version}) == {"message.format.version": version}
    else:
        with pytest.raises(ConfigError, match=f"Version {version} is not a valid version"):
            validate_topic_configs({"message.format.version": version})


def test_an_old_message_format_version_is_logged_as_ignored(caplog):
    with caplog.at_level(logging.WARNING, logger="pykbroker.config"):
        warn_ignored_topic_configs("t", {"message.format.version": "0.10.0.0"}, "3.7-IV4")
        warn_ignored_topic_configs("t", {"message.format.version": "2.8-IV1"}, "3.7-IV4")  # v2 batches: no warning
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith("Topic configuration message.format.version with value `0.10.0.0` is ignored for `t`")


@pytest.mark.parametrize(("configs", "before", "after"), [
    ({}, LONG_MAX, LONG_MAX),
    ({"message.timestamp.difference.max.ms": 1000}, 1000, 1000),
    ({"message.timestamp.difference.max.ms": 0}, 0, 0),
    ({"message.timestamp.difference.max.ms": 1000, "message.timestamp.before.max.ms": 50}, 50, 1000),
    ({"message.timestamp.difference.max.ms": 1000, "message.timestamp.after.max.ms": 7}, 1000, 7),
])
def test_timestamp_difference_is_the_default_of_before_and_after(configs, before, after):
    """Kafka 3.7's LogConfig (KIP-937): the deprecated twin applies where the new bounds keep their default."""
    full = {name: definition.default for name, definition in TOPIC_CONFIGS.items()} | configs
    log_config = LogConfig.from_topic_configs(full)
    assert (log_config.message_timestamp_before_max_ms, log_config.message_timestamp_after_max_ms) == (before, after)


def test_listener_overrides_in_a_config_file_are_known_typed_as_their_base_and_described_with_it(tmp_path, caplog):
    file = tmp_path / "server.properties"
    file.write_text("listener.name.plaintext.sasl.enabled.mechanisms=PLAIN\nlistener.name.plaintext.max.connections=7\n"
                    "listener.name.plaintext.no.such.config=1\n")
    with caplog.at_level(logging.WARNING, logger="pykbroker.config"):
        config = load_config(file=file, env={})
    assert config.get("listener.name.plaintext.sasl.enabled.mechanisms") == ["PLAIN"]
    assert config.get("listener.name.plaintext.max.connections") == 7
    assert config.broker_config_synonyms("listener.name.plaintext.max.connections") == [
        ("listener.name.plaintext.max.connections", "7", 4), ("max.connections", "2147483647", 5)]
    [warning] = [r.getMessage() for r in caplog.records]
    assert "unknown configuration key listener.name.plaintext.no.such.config" in warning  # its base is unknown
    file.write_text("listener.name.plaintext.max.connections=many\n")
    with pytest.raises(ConfigError, match="listener.name.plaintext.max.connections"):
        load_config(file=file, env={})


@pytest.mark.parametrize("name", [
    "listener.name.sasl_plaintext.plain.sasl.jaas.config", "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config",
    "listener.name.sasl_plaintext.oauthbearer.sasl.login.callback.handler.class",
    "listener.name.sasl_plaintext.plain.sasl.server.callback.handler.class",
    "listener.name.sasl_plaintext.gssapi.sasl.login.class", "listener.name.sasl_plaintext.plain.connections.max.reauth.ms",
])
def test_per_mechanism_sasl_listener_configs_are_typed_as_their_base(name):
    from pykbroker.config import broker_config_def, listener_override_base
    base = name.split(".", 4)[-1]
    assert listener_override_base(name) == base
    assert broker_config_def(name).type == BROKER_CONFIGS[base].type
    assert set(parse_dynamic_configs({name: "1"})) == {name}  # Kafka validates them as their base, dynamic per broker
    assert listener_override_base("listener.name.sasl_plaintext.plain.no.such.config") == "plain.no.such.config"


def test_a_jaas_config_in_a_config_file_loads_is_kept_and_never_shown(tmp_path, caplog):
    secret = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="a" password="s3cr3t";'
    file = tmp_path / "server.properties"
    file.write_text(f"listener.name.sasl_plaintext.plain.sasl.jaas.config={secret}\nsuper.users=User:admin\n"
                    f"sasl.jaas.config={secret}\n")
    with caplog.at_level(logging.WARNING, logger="pykbroker.config"):
        config = load_config(cli={"data_dir": str(tmp_path)}, file=file)
    assert caplog.records == []
    assert config.get("listener.name.sasl_plaintext.plain.sasl.jaas.config").value == secret
    assert config.get("sasl.jaas.config").value == secret
    assert config.get("super.users") == "User:admin"
    assert "s3cr3t" not in repr(config) and "s3cr3t" not in str(config)
    synonyms = config.broker_config_synonyms("listener.name.sasl_plaintext.plain.sasl.jaas.config")
    assert synonyms == [("listener.name.sasl_plaintext.plain.sasl.jaas.config", None, 4), ("sasl.jaas.config", None, 4)]


@pytest.mark.parametrize(("ibp", "ignored"), [
    ("3.7-IV4", True), ("3.0", True), ("3.0-IV1", True), ("3.0-IV0", False), ("2.8", False), ("0.10.0.0", False)])
def test_message_format_version_is_said_ignored_only_with_an_inter_broker_protocol_from_3_0_iv1(caplog, ibp, ignored):
    """Kafka's LogConfig.shouldIgnoreMessageFormatVersion; below it Kafka would write old records, pykbroker still
    writes v2 and says that instead."""
    with caplog.at_level(logging.WARNING, logger="pykbroker.config"):
        warn_ignored_topic_configs("t", {"message.format.version": "0.10.0.0"}, ibp)
    [record] = caplog.records
    assert ("greater or equal than 3.0" in record.getMessage()) is ignored
    assert ("pykbroker writes record batches v2" in record.getMessage()) is not ignored


@pytest.mark.parametrize(("ibp", "warned"), [("2.8", True), ("3.0-IV0", True), ("0.10.0", True), ("3.0", False),
                                             ("3.7-IV4", False), (None, False)])
def test_an_inter_broker_protocol_before_3_0_iv1_is_warned_about_at_start(tmp_path, caplog, ibp, warned):
    cli = {"data_dir": str(tmp_path)} | ({"inter.broker.protocol.version": ibp} if ibp else {})
    with caplog.at_level(logging.WARNING, logger="pykbroker.config"):
        load_config(cli=cli, env={})
    assert any("is older than 3.0-IV1; pykbroker behaves as Kafka 3.7" in r.getMessage() for r in caplog.records) is warned


# Broker configs whose pykbroker validator differs from Kafka 3.7.1's ConfigDef (the catalogue's valid-values
# column), on purpose, and why.
DELIBERATE_VALIDATORS = {
    "broker.id": "[0,...]: pykbroker does not generate broker ids (Kafka's -1 asks for one)",
    "log.flush.interval.ms": "[0,...]: it supplies flush.ms, whose [0,...] Kafka checks when it builds the topic defaults",
    "zookeeper.session.timeout.ms": "[1,...]: ZooKeeper (kazoo) needs a positive session timeout",
    "default.replication.factor": "[1,...]: a topic created with it needs at least one replica (Kafka refuses 0 then)",
    "log.cleaner.io.buffer.load.factor": "(0,...,1.0]: the cleaner's offset map cannot hold more entries than slots",
    "max.connections.per.ip.overrides": "host:count pairs, checked as Kafka's KafkaConfig reads them",
}


def test_each_validator_is_kafkas_or_a_deliberate_exception():
    from pykbroker.config import _kafka_validator

    def described(validator):
        return validator.describe() if validator else ""

    differ = {name for name, type_, _, valid, _ in KAFKA_BROKER_CONFIGS
              if described(BROKER_CONFIGS[name].validator) != described(_kafka_validator(type_, valid))}
    assert differ == set(DELIBERATE_VALIDATORS)


@pytest.mark.parametrize(("value", "message"), [
    ("host:abc", 'For input string: "abc"'),
    ("hostabc", "Error parsing configuration property 'max.connections.per.ip.overrides': begin 0, end -1, length 7"),
    ("a:1,b:99999999999", 'For input string: "99999999999"'),
    ("a:1, b:2,:-3", None), ("", None),
])
def test_max_connections_per_ip_overrides_are_parsed_as_kafka_reads_them(tmp_path, value, message):
    """Kafka 3.7.1's answers to kafka-configs.sh --add-config max.connections.per.ip.overrides=[...]."""
    configs = {"max.connections.per.ip.overrides": value}
    if message is None:
        assert parse_dynamic_configs(configs, per_broker=False) == configs
        assert load_config(cli={"data_dir": str(tmp_path), **configs}, env={}).get("max.connections.per.ip.overrides") == value
        return
    with pytest.raises(KafkaError) as info:
        parse_dynamic_configs(configs, per_broker=False)
    assert (info.value.code, info.value.message) == (ErrorCode.invalid_request, message)
    with pytest.raises(ConfigError, match="max.connections.per.ip.overrides"):
        load_config(cli={"data_dir": str(tmp_path), **configs}, env={})

"""BrokerConfig loading (flag > env > file > default), file formats, validation, and fidelity to Kafka 3.7.1's
topic configs as the wire captures record them."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from pathlib import Path

import pytest
from kio.index import load_response_schema
from kio.serial import entity_reader

import pykbroker.config as config_module
from pykbroker.config import (
    KafkaRequirement,
    ReconfigurationError,
    check_listener_update,
    BROKER_CONFIGS,
    LONG_MAX,
    PYKBROKER_SETTINGS,
    TOPIC_CONFIGS,
    BrokerConfig,
    ConfigError,
    ConfigSource,
    Listener,
    load_config,
    parse_properties,
    validate_topic_configs,
)

CAPTURES = Path("/work/shared/wire-captures")


def load(cli=None, env=None, file=None) -> BrokerConfig:
    return load_config(cli=cli or {}, env=env or {}, file=file)


# -- defaults ---------------------------------------------------------------------------------------


def test_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load()
    assert (config.host, config.port, config.broker_id) == ("127.0.0.1", 9092, 1)
    assert (config.advertised_host, config.advertised_port) == ("127.0.0.1", 9092)
    assert config.data_dir == tmp_path / "data"
    assert (config.log_level, config.fsync) == ("INFO", "interval")
    assert config.explicit == frozenset()
    assert config.get("num.partitions") == 1
    assert config.get("offsets.topic.replication.factor") == 1
    assert config.get("message.max.bytes") == 1048588
    assert config.get("group.initial.rebalance.delay.ms") == 3000
    assert config.get("log.flush.interval.ms") == 1000  # fsync=interval
    assert config.zookeeper_connect is None
    assert set(config.values) == set(BROKER_CONFIGS)


def test_unknown_key_lookup_is_a_key_error():
    with pytest.raises(KeyError, match="no.such.key"):
        load().get("no.such.key")


@pytest.mark.parametrize(
    ("host", "advertised"), [("0.0.0.0", socket.getfqdn()), ("::", socket.getfqdn()), ("10.1.2.3", "10.1.2.3")]
)
def test_advertised_host_follows_host_unless_wildcard(host, advertised):
    """Bind-all advertises the machine's canonical host name, as Kafka does for a listener without a host."""
    assert load(cli={"host": host}).advertised_host == advertised


def test_advertised_address_can_differ_from_listener():
    config = load(cli={"host": "0.0.0.0", "port": 9000, "advertised_host": "kafka.example", "advertised_port": 29092})
    assert (config.host, config.port, config.advertised_host, config.advertised_port) == (
        "0.0.0.0",
        9000,
        "kafka.example",
        29092,
    )


def test_direct_construction_fills_defaults(tmp_path):
    config = BrokerConfig(port=1234, data_dir=str(tmp_path), broker_id=7, values={"num.partitions": 4})
    assert config.data_dir == tmp_path
    assert config.get("broker.id") == 7
    assert config.get("num.partitions") == 4
    assert config.get("log.segment.bytes") == 1073741824
    assert config.advertised_port == 1234


# -- precedence -------------------------------------------------------------------------------------


def test_flag_beats_env_beats_file_beats_default(tmp_path):
    file = tmp_path / "broker.toml"
    file.write_text('host = "10.0.0.1"\nport = 1111\n"num.partitions" = 2\n"log.retention.hours" = 5\n')
    env = {"PYKBROKER_PORT": "2222", "PYKBROKER_NUM_PARTITIONS": "3"}
    config = load(cli={"port": 3333}, env=env, file=file)
    assert config.port == 3333  # flag
    assert config.get("num.partitions") == 3  # env over file
    assert config.host == "10.0.0.1"  # file
    assert config.get("log.retention.hours") == 5  # file
    assert config.get("default.replication.factor") == 1  # default
    assert {"num.partitions", "log.retention.hours"} <= config.explicit
    assert "default.replication.factor" not in config.explicit


def test_every_setting_has_an_env_variable(tmp_path):
    env = {
        "PYKBROKER_HOST": "0.0.0.0",
        "PYKBROKER_PORT": "19092",
        "PYKBROKER_ADVERTISED_HOST": "broker.local",
        "PYKBROKER_ADVERTISED_PORT": "29092",
        "PYKBROKER_DATA_DIR": str(tmp_path / "d"),
        "PYKBROKER_BROKER_ID": "4",
        "PYKBROKER_LOG_LEVEL": "debug",
        "PYKBROKER_FSYNC": "never",
        "PYKBROKER_LOG_RETENTION_BYTES": "1000",
    }
    config = load(env=env)
    assert (config.host, config.port, config.advertised_host, config.advertised_port) == (
        "0.0.0.0",
        19092,
        "broker.local",
        29092,
    )
    assert config.data_dir == tmp_path / "d"
    assert (config.broker_id, config.get("broker.id")) == (4, 4)
    assert (config.log_level, config.fsync) == ("DEBUG", "never")
    assert config.topic_defaults()["retention.bytes"] == 1000


def test_config_file_from_env_variable(tmp_path):
    file = tmp_path / "server.properties"
    file.write_text("num.partitions=6\n")
    assert load(env={"PYKBROKER_CONFIG": str(file)}).get("num.partitions") == 6
    assert load(cli={"config": file}).get("num.partitions") == 6


def test_data_dir_flag_beats_kafka_log_dirs_in_file(tmp_path):
    file = tmp_path / "server.properties"
    file.write_text(f"log.dirs={tmp_path / 'kafka-logs'}\n")
    assert load(file=file).data_dir == tmp_path / "kafka-logs"
    assert load(cli={"data_dir": tmp_path / "mine"}, file=file).data_dir == tmp_path / "mine"


def test_several_data_dirs_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="one data directory"):
        load(cli={"log.dirs": f"{tmp_path}/a,{tmp_path}/b"})


def test_log_cleaner_configs_are_validated_as_kafka_validates_them():
    with pytest.raises(ConfigError, match="at least 1MB per cleaner thread"):
        load(cli={"log.cleaner.dedupe.buffer.size": "2097152", "log.cleaner.threads": "2"})
    with pytest.raises(ConfigError, match="log.cleaner.io.buffer.load.factor"):
        load(cli={"log.cleaner.io.buffer.load.factor": "0"})
    assert load(cli={"log.cleaner.dedupe.buffer.size": "2097154", "log.cleaner.threads": "2"}).get(
        "log.cleaner.threads") == 2
    from pykbroker.config import check_cleaner_configs

    current = load().values
    for threads, ok in ((0, False), (1, True), (2, True), (3, False)):
        values = {**current, "log.cleaner.threads": threads}
        if ok:
            check_cleaner_configs(values, current)
        else:
            with pytest.raises(ConfigError):
                check_cleaner_configs(values, current)


# -- file formats -----------------------------------------------------------------------------------


def test_toml_flat_quoted_keys(tmp_path):
    file = tmp_path / "broker.toml"
    file.write_text(
        '"num.partitions" = 3\n"auto.create.topics.enable" = false\n'
        '"log.cleanup.policy" = ["delete"]\n"log.cleaner.min.cleanable.ratio" = 0.25\n'
    )
    config = load(file=file)
    assert config.get("num.partitions") == 3
    assert config.get("auto.create.topics.enable") is False
    assert config.get("log.cleanup.policy") == ["delete"]
    assert config.get("log.cleaner.min.cleanable.ratio") == 0.25


def test_toml_nested_tables_join_to_dotted_names(tmp_path):
    file = tmp_path / "broker.toml"
    file.write_text(
        "port = 19093\n[num]\npartitions = 3\n[log]\nsegment.bytes = 1048576\nretention.hours = 24\n"
        "[offsets.topic]\nnum.partitions = 5\n"
    )
    config = load(file=file)
    assert config.port == 19093
    assert config.get("num.partitions") == 3
    assert config.get("log.segment.bytes") == 1048576
    assert config.get("offsets.topic.num.partitions") == 5
    assert config.topic_defaults()["retention.ms"] == 24 * 3_600_000


def test_toml_key_set_twice_is_an_error(tmp_path):
    file = tmp_path / "broker.toml"
    file.write_text('"num.partitions" = 3\n[num]\npartitions = 4\n')
    with pytest.raises(ConfigError, match="num.partitions twice"):
        load(file=file)


def test_invalid_toml_names_the_file(tmp_path):
    file = tmp_path / "broken.toml"
    file.write_text("port = = 1\n")
    with pytest.raises(ConfigError, match="broken.toml is not valid TOML"):
        load(file=file)


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(file=tmp_path / "absent.properties")


def test_server_properties_with_comments(tmp_path):
    file = tmp_path / "server.properties"
    file.write_text(
        "# Licensed to the Apache Software Foundation\n"
        "\n"
        "############################# Log Basics #############################\n"
        "broker.id=3\n"
        "   ! a bang comment\n"
        "num.partitions = 4\n"
        "log.retention.minutes: 90\n"
        "zookeeper.connect=zk1:2181,\\\n"
        "    zk2:2181/kafka\n"
        "compression.type lz4\n"
    )
    config = load(file=file)
    assert config.broker_id == 3
    assert config.get("num.partitions") == 4
    assert config.topic_defaults()["retention.ms"] == 90 * 60_000
    assert config.zookeeper_connect == "zk1:2181,zk2:2181/kafka"
    assert config.get("compression.type") == "lz4"


def test_properties_escapes_and_last_value_wins():
    parsed = parse_properties("a\\:b=c\\=d\npath=C\\:\\\\data\nx=1\nx=2\nunicode=\\u00e9\nempty=\n")
    assert parsed == {"a:b": "c=d", "path": "C:\\data", "x": "2", "unicode": "é", "empty": ""}


# -- unknown keys and invalid values -------------------------------------------------------------------


def test_unknown_keys_warn_and_are_ignored(tmp_path, caplog):
    file = tmp_path / "server.properties"
    file.write_text("no.such.threads=3\nretention.ms=5\nnum.partitions=2\nnum.network.threads=3\n")
    with caplog.at_level(logging.WARNING, logger="pykbroker.config"):
        config = load(file=file, env={"PYKBROKER_SPARK_JARS": "/x.jar"}, cli={"bogus.key": "x"})
    assert config.get("num.partitions") == 2
    assert config.get("num.network.threads") == 3  # a Kafka key pykbroker does not use: known, stored
    messages = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any("no.such.threads" in m and str(file) in m for m in messages)
    assert not any("num.network.threads" in m for m in messages)
    # The environment is shared with other tools (PYKBROKER_SPARK_JARS): their variables are not config.
    assert not any("SPARK" in m or "spark" in m for m in messages)
    assert any("bogus.key" in m for m in messages)
    assert any("retention.ms" in m and "log.retention.ms" in m for m in messages)


@pytest.mark.parametrize(("source", "typo", "suggestion"), [
    ("file", "num.partiton", "num.partitions"),
    ("override", "log.retention.hour", "log.retention.hours"),
    ("override", "auto.create.topic.enable", "auto.create.topics.enable"),
    ("file", "data.dirs", "data.dir"),
])
def test_unknown_key_warning_suggests_the_key_it_resembles(tmp_path, caplog, source, typo, suggestion):
    file = tmp_path / "server.properties"
    file.write_text(f"{typo}=3\n" if source == "file" else "")
    with caplog.at_level(logging.WARNING, logger="pykbroker.config"):
        load(file=file, env={}, cli={typo: "3"} if source == "override" else {})
    [message] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"unknown configuration key {typo} " in message
    assert message.endswith(f"is ignored; did you mean {suggestion}?")


def test_unknown_key_far_from_any_known_key_gets_no_suggestion(caplog):
    with caplog.at_level(logging.WARNING, logger="pykbroker.config"):
        load(env={}, cli={"zzqx.frobnicate": "1"})
    [message] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert message.endswith("is ignored")


def test_misspelled_environment_variable_warns_with_the_variable_it_resembles(caplog):
    with caplog.at_level(logging.WARNING, logger="pykbroker.config"):
        config = load(env={"PYKBROKER_NUM_PARTITONS": "3", "PYKBROKER_ZZQX": "1", "PYKBROKER_NUM_PARTITIONS": "2",
                           "OTHER_NUM_PARTITONS": "5"})
    assert config.get("num.partitions") == 2
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(messages) == 2, messages
    assert ("environment variable PYKBROKER_NUM_PARTITONS names no pykbroker setting and is ignored; "
            "did you mean PYKBROKER_NUM_PARTITIONS?") in messages
    assert "environment variable PYKBROKER_ZZQX names no pykbroker setting and is ignored" in messages


def test_every_pykbroker_variable_the_project_uses_is_a_setting_or_known_not_to_be_one(caplog):
    """The PYKBROKER_ variables the tree's tools and tests read must not be warned about as typos."""
    root = Path(__file__).resolve().parents[2]
    used: set[str] = set()
    for path in [*root.joinpath("pykbroker").rglob("*.py"), *root.joinpath("tests").rglob("*.py"),
                 *root.joinpath("scripts").rglob("*"), root / "README.md"]:
        if path.is_file() and "node_modules" not in path.parts:
            used.update(re.findall(r"\bPYKBROKER_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")))
    used -= {"PYKBROKER_SETTINGS", "PYKBROKER_NUM_PARTITONS", "PYKBROKER_ZZQX"}  # a Python name; this file's typos
    assert {"PYKBROKER_SPARK_JARS", "PYKBROKER_NUM_PARTITIONS"} <= used
    with caplog.at_level(logging.WARNING, logger="pykbroker.config"):
        for name in used:
            config_module._env_setting(name)
    assert [r.getMessage() for r in caplog.records] == []


@pytest.mark.parametrize(
    ("cli", "key", "accepted"),
    [
        ({"num.partitions": "0"}, "num.partitions", "at least 1"),
        ({"fsync": "fast"}, "fsync", "always, interval, never"),
        ({"port": "abc"}, "port", "[0,...,65535]"),
        ({"port": 70000}, "port", "no more than 65535"),
        ({"auto.create.topics.enable": "yes"}, "auto.create.topics.enable", "true or false"),
        ({"compression.type": "brotli"}, "compression.type", "uncompressed, zstd, lz4, snappy, gzip, producer"),
        ({"log.cleanup.policy": "delete,archive"}, "log.cleanup.policy", "compact, delete"),
        ({"log.level": "chatty"}, "log.level", "DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ({"offsets.topic.replication.factor": "40000"}, "offsets.topic.replication.factor", "16-bit"),
    ],
)
def test_invalid_value_names_key_and_accepted_values(cli, key, accepted):
    with pytest.raises(ConfigError) as caught:
        load(cli=cli)
    assert caught.value.name == key
    assert f"for configuration {key}" in str(caught.value)
    assert accepted in str(caught.value)


def test_invalid_value_says_where_it_was_set(tmp_path):
    file = tmp_path / "bad.toml"
    file.write_text('"log.segment.bytes" = "big"\n')
    with pytest.raises(ConfigError, match=r"log\.segment\.bytes.*set by .*bad\.toml"):
        load(file=file)
    with pytest.raises(ConfigError, match="set by PYKBROKER_BROKER_ID"):
        load(env={"PYKBROKER_BROKER_ID": "-3"})


def test_toml_value_of_wrong_native_type_is_refused(tmp_path):
    file = tmp_path / "broker.toml"
    file.write_text('"auto.create.topics.enable" = 1\n')
    with pytest.raises(ConfigError, match="auto.create.topics.enable"):
        load(file=file)


# -- topic defaults through broker synonyms ----------------------------------------------------------


def test_retention_synonyms_in_kafkas_priority_order():
    assert load().topic_defaults()["retention.ms"] == 168 * 3_600_000
    assert load(cli={"log.retention.hours": "2"}).topic_defaults()["retention.ms"] == 7_200_000
    both = load(cli={"log.retention.hours": "2", "log.retention.minutes": "3"})
    assert both.topic_defaults()["retention.ms"] == 180_000
    all_three = load(cli={"log.retention.hours": "2", "log.retention.minutes": "3", "log.retention.ms": "42"})
    assert all_three.topic_defaults()["retention.ms"] == 42
    assert load(cli={"log.retention.hours": "-1"}).topic_defaults()["retention.ms"] == -1


def test_segment_ms_from_roll_hours_and_other_synonyms():
    config = load(
        cli={
            "log.roll.hours": "1",
            "message.max.bytes": "2000000",
            "log.segment.bytes": "1048576",
            "log.message.timestamp.type": "LogAppendTime",
            "min.insync.replicas": "2",
        }
    )
    defaults = config.topic_defaults()
    assert defaults["segment.ms"] == 3_600_000
    assert defaults["max.message.bytes"] == 2_000_000
    assert defaults["segment.bytes"] == 1_048_576
    assert defaults["message.timestamp.type"] == "LogAppendTime"
    assert defaults["min.insync.replicas"] == 2
    assert set(defaults) == set(TOPIC_CONFIGS)


def test_topic_config_source_and_synonyms():
    config = load(cli={"log.retention.hours": "24"})
    assert config.topic_config_source("retention.ms") == (86_400_000, ConfigSource.STATIC_BROKER_CONFIG)
    assert config.topic_config_source("segment.bytes") == (1073741824, ConfigSource.DEFAULT_CONFIG)
    # Kafka's ConfigHelper lists the synonyms of log.retention.ms from its own first entry on: none here
    assert config.topic_config_synonyms("retention.ms") == []
    assert load(cli={"log.retention.ms": "5"}).topic_config_synonyms("retention.ms") == [
        ("log.retention.ms", "5", ConfigSource.STATIC_BROKER_CONFIG),
        ("log.retention.hours", "168", ConfigSource.DEFAULT_CONFIG),
    ]
    assert config.topic_config_synonyms("remote.storage.enable") == []
    assert config.broker_config_source("log.retention.hours") == (24, ConfigSource.STATIC_BROKER_CONFIG)
    assert config.broker_config_source("num.partitions") == (1, ConfigSource.DEFAULT_CONFIG)


@pytest.mark.parametrize(
    ("fsync", "flush_ms", "flush_messages"),
    [("interval", 1000, LONG_MAX), ("always", LONG_MAX, 1), ("never", LONG_MAX, LONG_MAX)],
)
def test_fsync_mode_sets_kafkas_flush_defaults(fsync, flush_ms, flush_messages):
    config = load(cli={"fsync": fsync})
    defaults = config.topic_defaults()
    assert (defaults["flush.ms"], defaults["flush.messages"]) == (flush_ms, flush_messages)


def test_explicit_flush_key_beats_fsync_mode():
    config = load(cli={"fsync": "interval", "log.flush.interval.ms": "250"})
    assert config.topic_defaults()["flush.ms"] == 250
    assert config.topic_config_source("flush.ms") == (250, ConfigSource.STATIC_BROKER_CONFIG)
    assert load().topic_config_source("flush.ms") == (1000, ConfigSource.DEFAULT_CONFIG)


def test_effective_topic_config_overlays_overrides():
    effective = load(cli={"log.retention.hours": "1"}).effective_topic_config({"segment.bytes": "2048"})
    assert effective["segment.bytes"] == 2048
    assert effective["retention.ms"] == 3_600_000


# -- topic config validation (CreateTopics / AlterConfigs) --------------------------------------------


def test_validate_topic_configs_types_values():
    typed = validate_topic_configs(
        {"retention.ms": "1000", "cleanup.policy": "delete", "preallocate": "TRUE", "min.cleanable.dirty.ratio": "0.1"}
    )
    assert typed == {"retention.ms": 1000, "cleanup.policy": ["delete"], "preallocate": True, "min.cleanable.dirty.ratio": 0.1}


@pytest.mark.parametrize(
    ("configs", "name", "message"),
    [
        ({"retention.mss": "1"}, "retention.mss", "Unknown topic config name: retention.mss"),
        ({"segment.bytes": "10"}, "segment.bytes", "Value must be at least 14"),
        ({"retention.ms": "-2"}, "retention.ms", "Value must be at least -1"),
        ({"message.timestamp.type": "Now"}, "message.timestamp.type", "CreateTime, LogAppendTime"),
        ({"min.cleanable.dirty.ratio": "1.5"}, "min.cleanable.dirty.ratio", "no more than 1"),
        ({"leader.replication.throttled.replicas": "0-1"}, "leader.replication.throttled.replicas", "[partitionId]:[brokerId]"),
        ({"max.message.bytes": None}, "max.message.bytes", "Null value not supported"),
        ({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"}, "min.compaction.lag.ms", "conflict"),
        ({"cleanup.policy": "delete,shrink"}, "cleanup.policy", "compact, delete"),
    ],
)
def test_validate_topic_configs_rejects(configs, name, message):
    with pytest.raises(ConfigError) as caught:
        validate_topic_configs(configs)
    assert caught.value.name == name
    assert message in str(caught.value)


def test_throttled_replicas_accept_kafkas_forms():
    assert validate_topic_configs({"leader.replication.throttled.replicas": "*"}) == {
        "leader.replication.throttled.replicas": ["*"]
    }
    assert validate_topic_configs({"follower.replication.throttled.replicas": "0:1,1:2"}) == {
        "follower.replication.throttled.replicas": ["0:1", "1:2"]
    }


@pytest.mark.parametrize("definition", [*BROKER_CONFIGS.values(), *TOPIC_CONFIGS.values(), *PYKBROKER_SETTINGS.values()], ids=lambda d: d.name)
def test_every_default_survives_format_and_parse(definition):
    if definition.default is None:
        return
    assert definition.parse(definition.format(definition.default)) == definition.default


def test_topic_synonyms_are_broker_keys():
    for definition in TOPIC_CONFIGS.values():
        assert all(name in BROKER_CONFIGS for name in definition.synonyms), definition.name


# -- fidelity to Kafka 3.7.1 (wire captures) ------------------------------------------------------------


def _decoded_responses(file_name: str, api_key: int):
    for line in (CAPTURES / file_name).read_text().splitlines():
        frame = json.loads(line)
        if frame["dir"] == "response" and frame["api_key"] == api_key:
            schema = load_response_schema(api_key, frame["api_version"])
            data = bytes.fromhex(frame["hex"])
            _, offset = entity_reader(schema.__header_schema__)(data, 0)
            body, _ = entity_reader(schema)(data, offset)
            yield body


# The capture broker ran Kafka's stock server.properties, which sets these two keys (see wire-captures/index.md).
STOCK_SERVER_PROPERTIES = {"log.segment.bytes": "1073741824", "log.retention.hours": "168"}


@pytest.mark.skipif(not CAPTURES.exists(), reason="wire captures not available")
def test_topic_configs_match_kafka_describe_configs():
    (response,) = _decoded_responses("14-kafka-cli-admin-3.7.1.jsonl", 32)
    (result,) = response.results
    kafka = {entry.name: entry for entry in result.configs}
    assert set(kafka) == set(TOPIC_CONFIGS)
    config = load(cli=STOCK_SERVER_PROPERTIES)
    for name, definition in TOPIC_CONFIGS.items():
        value, _ = config.topic_config_source(name)
        if name != "flush.ms":  # pykbroker's fsync=interval default is the one intended difference
            assert definition.format(value) == kafka[name].value, name
        assert definition.type_id == kafka[name].config_type, name
        assert definition.read_only == kafka[name].read_only
        assert definition.sensitive == kafka[name].is_sensitive
    assert config.topic_config_synonyms("segment.bytes") == [
        (s.name, s.value, s.source) for s in kafka["segment.bytes"].synonyms
    ]


@pytest.mark.skipif(not CAPTURES.exists(), reason="wire captures not available")
def test_topic_config_sources_match_kafka_create_topics():
    (response,) = _decoded_responses("01-java-admin.jsonl", 19)
    (topic,) = response.topics
    config = load(cli={**STOCK_SERVER_PROPERTIES, "fsync": "never"})  # fsync=never: Kafka's own flush defaults
    assert [entry.name for entry in topic.configs] == list(TOPIC_CONFIGS)
    for entry in topic.configs:
        value, source = config.topic_config_source(entry.name)
        assert (TOPIC_CONFIGS[entry.name].format(value), source) == (entry.value, entry.config_source), entry.name


# -- listeners ---------------------------------------------------------------------------------------


def test_server_properties_listeners_are_honoured(tmp_path):
    file = tmp_path / "server.properties"
    file.write_text(
        "listeners=PLAINTEXT://:9092,internal://127.0.0.1:9093\n"
        "advertised.listeners=PLAINTEXT://kafka.example:29092,INTERNAL://127.0.0.1:9093\n"
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT\n"
    )
    config = load(file=file)
    assert config.listeners == (Listener("PLAINTEXT", "", 9092), Listener("INTERNAL", "127.0.0.1", 9093))
    assert config.advertised_listeners == (
        Listener("PLAINTEXT", "kafka.example", 29092),
        Listener("INTERNAL", "127.0.0.1", 9093),
    )
    assert (config.host, config.port, config.advertised_host, config.advertised_port) == ("", 9092, "kafka.example", 29092)


def test_listeners_from_env_and_empty_host_advertises_the_canonical_host_name():
    config = load(env={"PYKBROKER_LISTENERS": "PLAINTEXT://:19092"})
    assert config.listeners == (Listener("PLAINTEXT", "", 19092),)
    assert config.advertised_listeners == (Listener("PLAINTEXT", socket.getfqdn(), 19092),)


def test_listeners_win_over_host_and_port_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="pykbroker.config"):
        config = load(cli={"host": "127.0.0.1", "port": 1111, "listeners": "PLAINTEXT://127.0.0.1:2222"})
    assert config.listeners == (Listener("PLAINTEXT", "127.0.0.1", 2222),)
    assert any("listeners" in r.getMessage() and "--port" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("values", "key", "words"),
    [
        # Kafka's inter-broker listener: the one named after security.inter.broker.protocol (PLAINTEXT) by default
        ({"listeners": "SSL://:9093"}, "inter.broker.listener.name",
         "inter.broker.listener.name must be a listener name defined in advertised.listeners. The valid options "
         "based on currently configured listeners are SSL"),
        ({"listeners": "PLAINTEXT://:9092,SSL://:9093", "security.inter.broker.protocol": "SSL",
          "inter.broker.listener.name": "PLAINTEXT"}, "inter.broker.listener.name",
         "Only one of inter.broker.listener.name and security.inter.broker.protocol should be set."),
        ({"listeners": "PLAINTEXT://:9092", "inter.broker.listener.name": "internal"}, "inter.broker.listener.name",
         "Listener with name INTERNAL defined in inter.broker.listener.name not found in listener.security.protocol.map."),
        ({"listeners": "OTHER://:9092"}, "listeners", "No security protocol defined for listener OTHER"),
        ({"listeners": "localhost:9092"}, "listeners", "Unable to parse"),
        ({"listeners": "A://:1,A://:2", "listener.security.protocol.map": "A:PLAINTEXT"}, "listeners", "different name"),
        ({"listeners": "A://:1,B://:1", "listener.security.protocol.map": "A:PLAINTEXT,B:PLAINTEXT"}, "listeners", "different port"),
        ({"listeners": "PLAINTEXT://:70000"}, "listeners", "Invalid port"),
        ({"listeners": "PLAINTEXT://0.0.0.0:9092"}, "advertised.listeners", "nonroutable meta-address 0.0.0.0"),
        ({"listeners": "PLAINTEXT://:9092", "advertised.listeners": "PLAINTEXT://h:1,OTHER://h:2",
          "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,OTHER:PLAINTEXT"}, "advertised.listeners", "subset"),
        ({"listener.security.protocol.map": "PLAINTEXT:TLS"}, "listener.security.protocol.map", "Invalid security protocol"),
        ({"listeners": "PLAINTEXT://:9092,B://:9093", "advertised.listeners": "PLAINTEXT://h:9092",
          "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,B:PLAINTEXT", "inter.broker.listener.name": "B"},
         "inter.broker.listener.name", "inter.broker.listener.name must be a listener name defined in advertised.listeners"),
    ],
)
def test_listener_errors_name_the_key(values, key, words):
    with pytest.raises(ConfigError, match=words) as raised:
        load(cli=values)
    assert raised.value.name == key


@pytest.mark.parametrize(("values", "expected"), [
    ({"listeners": "SSL://127.0.0.1:9093,PLAINTEXT://127.0.0.1:9092"}, ("PLAINTEXT", "PLAINTEXT")),  # not the first
    ({"listeners": "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093", "security.inter.broker.protocol": "SSL"},
     ("SSL", "SSL")),
    ({"listeners": "PLAINTEXT://127.0.0.1:9092,INTERNAL://127.0.0.1:9093", "inter.broker.listener.name": "internal",
      "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:SSL"}, ("INTERNAL", "SSL")),
])
def test_the_inter_broker_listener_follows_kafkas_rule(values, expected):
    """KafkaConfig.interBrokerListenerNameAndSecurityProtocol: inter.broker.listener.name, else the listener
    named after security.inter.broker.protocol (PLAINTEXT), never simply the first listener."""
    config = load(cli=values)
    assert (config.inter_broker_listener.name, config.inter_broker_listener.security_protocol) == expected


def test_ssl_listeners_are_served_beside_plaintext_ones():
    config = load(cli={"listeners": "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093"})
    assert config.listeners == (Listener("PLAINTEXT", "127.0.0.1", 9092), Listener("SSL", "127.0.0.1", 9093, "SSL"))


def test_sasl_listeners_are_served_beside_plaintext_ones():
    config = load(cli={"listeners": "PLAINTEXT://127.0.0.1:9092,SASL_PLAINTEXT://127.0.0.1:9094,SASL_SSL://127.0.0.1:9095"})
    assert config.listeners == (Listener("PLAINTEXT", "127.0.0.1", 9092),
                                Listener("SASL_PLAINTEXT", "127.0.0.1", 9094, "SASL_PLAINTEXT"),
                                Listener("SASL_SSL", "127.0.0.1", 9095, "SASL_SSL"))


def test_queued_max_request_bytes_is_unbounded_at_or_below_0_or_at_least_socket_request_max_bytes():
    # Kafka's KafkaConfig rule: the largest request the broker accepts must always fit in the pool.
    for queued in (0, -1, -5, 100, 200):
        BrokerConfig(values={"queued.max.request.bytes": queued, "socket.request.max.bytes": 100})
    with pytest.raises(ConfigError, match="queued.max.request.bytes .*socket.request.max.bytes") as raised:
        load(env={"PYKBROKER_QUEUED_MAX_REQUEST_BYTES": "1000"})
    assert raised.value.name == "queued.max.request.bytes"


def test_node_id_is_a_synonym_of_broker_id_as_in_kafka(tmp_path):
    """Kafka's KafkaConfig.populateSynonyms: node.id without broker.id is the broker id (and the other way
    round); both set must be equal, else Kafka refuses to start with this message."""
    config = load_config(cli={"data_dir": str(tmp_path), "node.id": "5"}, env={})
    assert (config.broker_id, config.get("broker.id"), config.get("node.id")) == (5, 5, 5)
    config = load_config(cli={"data_dir": str(tmp_path), "broker.id": "6"}, env={})
    assert (config.get("broker.id"), config.get("node.id")) == (6, 6)
    # as Kafka 3.7.1 (ZooKeeper mode) describes node.id with broker.id=6 in server.properties
    assert config.broker_config_synonyms("node.id") == [("node.id", "6", ConfigSource.STATIC_BROKER_CONFIG),
                                                        ("node.id", "-1", ConfigSource.DEFAULT_CONFIG)]
    assert load_config(cli={"data_dir": str(tmp_path), "broker.id": "6", "node.id": "6"}, env={}).broker_id == 6
    with pytest.raises(ConfigError, match="You must set `node.id` to the same value as `broker.id`"):
        load_config(cli={"data_dir": str(tmp_path), "broker.id": "6", "node.id": "7"}, env={})
    with pytest.raises(ConfigError, match="Invalid value 'x' for configuration broker.id.*set by --override node.id"):
        load_config(cli={"data_dir": str(tmp_path), "node.id": "x"}, env={})


@pytest.mark.parametrize("cli", [{"data_dir": "{d}"}, {"log.dirs": "{d}"}, {"data.dir": "{d}"}])
def test_the_data_dir_is_described_as_log_dirs_set_statically(tmp_path, cli):
    """As Kafka describes a log.dirs set in server.properties: its value, STATIC_BROKER_CONFIG, itself as synonym."""
    config = load_config(cli={key: value.format(d=tmp_path) for key, value in cli.items()}, env={})
    assert config.broker_config_source("log.dirs") == (str(tmp_path), ConfigSource.STATIC_BROKER_CONFIG)
    assert config.broker_config_synonyms("log.dirs") == [("log.dirs", str(tmp_path), ConfigSource.STATIC_BROKER_CONFIG)]
    assert "no effect" not in BROKER_CONFIGS["log.dirs"].doc and "no effect" not in BROKER_CONFIGS["log.dir"].doc


def test_a_data_dir_set_as_log_dir_is_described_under_that_name(tmp_path):
    file = tmp_path / "server.properties"
    file.write_text(f"log.dir={tmp_path / 'z'}\n")
    config = load_config(file=file, env={})
    assert config.data_dir == tmp_path / "z"
    assert config.broker_config_source("log.dir") == (str(tmp_path / "z"), ConfigSource.STATIC_BROKER_CONFIG)
    assert config.broker_config_source("log.dirs")[1] == ConfigSource.DEFAULT_CONFIG
    default = load_config(cli={"data_dir": str(tmp_path)}, env={})
    assert default.broker_config_source("log.dir") == ("/tmp/kafka-logs", ConfigSource.DEFAULT_CONFIG)


@pytest.mark.parametrize(("update", "error", "message"), [
    ({"listener.security.protocol.map": "PLAINTEXT:SSL"}, ReconfigurationError,
     "Security protocol cannot be updated for existing listener ListenerName(PLAINTEXT)"),
    ({"advertised.listeners": "PLAINTEXT://127.0.0.1:1,FOO://127.0.0.1:2",
      "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,FOO:PLAINTEXT"}, KafkaRequirement,
     "advertised.listeners listener names must be equal to or a subset of the ones defined in listeners. "
     "Found PLAINTEXT,FOO. The valid options based on the current configuration are PLAINTEXT"),
    ({"listeners": "PLAINTEXT://127.0.0.1:9092,FOO://127.0.0.1:9093", "advertised.listeners": "FOO://127.0.0.1:9093",
      "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,FOO:PLAINTEXT"}, KafkaRequirement,
     "inter.broker.listener.name must be a listener name defined in advertised.listeners. "
     "The valid options based on currently configured listeners are FOO"),
    ({"listeners": "PLAINTEXT://127.0.0.1:9092,PLAINTEXT://127.0.0.1:9093"}, KafkaRequirement,
     "Each listener must have a different name, listeners: PLAINTEXT://127.0.0.1:9092,PLAINTEXT://127.0.0.1:9093"),
    ({"advertised.listeners": "PLAINTEXT://0.0.0.0:9092"}, KafkaRequirement,
     "advertised.listeners cannot use the nonroutable meta-address 0.0.0.0. Use a routable IP address."),
    ({"listeners": "x"}, ConfigError, "Error creating broker listeners from 'x': Unable to parse x to a broker endpoint"),
    ({"listeners": "PLAINTEXT://127.0.0.1:9092,FOO://127.0.0.1:9093",
      "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,FOO:SSL"}, ConfigError, "FOO://127.0.0.1:9093 uses security protocol SSL"),
    ({"listeners": "PLAINTEXT://127.0.0.1:9092,FOO://127.0.0.1:9093",
      "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,FOO:PLAINTEXT"}, None, None),
])
def test_a_dynamic_listener_update_is_checked_as_kafka_checks_it(update, error, message):
    """Kafka 3.7.1's answers (measured with kafka-configs.sh): KafkaConfig's requirements, then
    DynamicListenerConfig's; pykbroker's own refusal of a protocol it does not serve comes last."""
    current = BrokerConfig(host="127.0.0.1", port=9092)
    values = {**current.values, **update}
    if error is None:
        check_listener_update(values, current)
        return
    with pytest.raises(error) as raised:
        check_listener_update(values, current)
    assert type(raised.value) is error
    assert message in raised.value.message


def test_an_environment_variable_sets_a_mixed_case_key(caplog):
    with caplog.at_level(logging.WARNING, logger="pykbroker.config"):
        config = load(env={"PYKBROKER_ZOOKEEPER_CLIENTCNXNSOCKET": "org.apache.zookeeper.ClientCnxnSocketNetty"})
    assert config.get("zookeeper.clientCnxnSocket") == "org.apache.zookeeper.ClientCnxnSocketNetty"
    assert caplog.records == []


def _kafka_config_dir():
    home = os.environ.get("PYKBROKER_KAFKA_HOME")
    repo = Path(__file__).resolve().parents[2]
    candidates = [Path(home)] if home else []
    candidates += [repo.parent / "shared" / "refkit" / "kafka_2.13-3.7.1",
                   repo.parent.parent / "shared" / "refkit" / "kafka_2.13-3.7.1"]
    return next((c / "config" for c in candidates if (c / "config" / "kraft" / "server.properties").is_file()), None)


@pytest.mark.parametrize("shipped", ["server.properties", "kraft/server.properties"])
def test_kafkas_shipped_server_properties_load_without_a_warning(tmp_path, caplog, shipped):
    """Kafka 3.7.1's own config/server.properties (ZooKeeper) and config/kraft/server.properties (a combined
    KRaft node), ports and directories overridden: every key is known, and the KRaft controller listener
    (controller.listener.names) is not among the listeners the broker opens."""
    config_dir = _kafka_config_dir()
    if config_dir is None:
        pytest.skip("Kafka 3.7.1's config files not found (../shared/refkit or $PYKBROKER_KAFKA_HOME)")
    overrides = {"data_dir": str(tmp_path), "zookeeper.connect": "127.0.0.1:1/x"}
    if shipped.startswith("kraft"):
        overrides |= {"listeners": "PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0",
                      "advertised.listeners": "PLAINTEXT://127.0.0.1:19092"}
    with caplog.at_level(logging.INFO, logger="pykbroker.config"):
        config = load_config(cli=overrides, file=config_dir / shipped, env={})
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert [listener.name for listener in config.listeners] == ["PLAINTEXT"]
    assert config.data_dir == tmp_path
    if shipped.startswith("kraft"):
        assert config.broker_id == 1  # node.id
    else:
        assert config.broker_id == 0


def test_a_cluster_member_takes_kafkas_offsets_topic_replication_factor_and_reports_it(tmp_path):
    """The single node's offsets topic has one replica; a cluster member (zookeeper.connect set) uses Kafka's
    default 3, and DescribeConfigs must report the value the broker uses (a console or CLI reasons from it),
    still as a default; a value the user sets wins in both modes."""
    single = load_config(cli={"data_dir": str(tmp_path)}, env={})
    member = load_config(cli={"data_dir": str(tmp_path), "zookeeper.connect": "127.0.0.1:2181"}, env={})
    assert single.get("offsets.topic.replication.factor") == 1
    assert member.get("offsets.topic.replication.factor") == 3
    assert "offsets.topic.replication.factor" not in member.explicit
    set_by_user = load_config(cli={"data_dir": str(tmp_path), "zookeeper.connect": "127.0.0.1:2181",
                                   "offsets.topic.replication.factor": "2"}, env={})
    assert set_by_user.get("offsets.topic.replication.factor") == 2
    assert "offsets.topic.replication.factor" in set_by_user.explicit


def test_a_dynamic_listener_update_on_a_broker_serving_ssl_checks_only_the_new_listeners():
    """A broker already serving an SSL listener: updating its advertised listeners, or adding a PLAINTEXT
    listener, is accepted (it was refused naming the SSL listener as unsupported); adding a new SSL listener
    while running is still refused."""
    current = BrokerConfig(host="127.0.0.1", port=9092, values={
        "listeners": "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093"})
    check_listener_update({**current.values, "advertised.listeners": "PLAINTEXT://127.0.0.1:9092,SSL://localhost:9093"},
                          current)
    check_listener_update({**current.values,
                           "listeners": "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093,EXTRA://127.0.0.1:9094",
                           "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,EXTRA:PLAINTEXT"}, current)
    with pytest.raises(ConfigError, match="NEW://127.0.0.1:9095 uses security protocol SSL"):
        check_listener_update({**current.values,
                               "listeners": "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093,NEW://127.0.0.1:9095",
                               "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,NEW:SSL"}, current)


@pytest.mark.parametrize("name", ["sasl.enabled.mechanisms", "sasl.jaas.config", "sasl.server.max.receive.size",
                                  "connections.max.reauth.ms", "connection.failed.authentication.delay.ms"])
def test_the_sasl_settings_sasl_listeners_read_are_documented_as_used(name):
    from pykbroker.config import BROKER_CONFIGS

    assert "no effect here" not in BROKER_CONFIGS[name].doc
    assert "SASL" in BROKER_CONFIGS[name].doc


def test_the_consumer_group_migration_policy_is_kafkas_case_insensitive_choice(tmp_path, monkeypatch):
    from pykbroker.groups.consumer.coordinator import ConsumerGroupConfig

    monkeypatch.chdir(tmp_path)
    assert ConsumerGroupConfig.from_broker_config(load()).migration_policy == "bidirectional"
    config = load(cli={"group.consumer.migration.policy": "UPGRADE"})
    assert ConsumerGroupConfig.from_broker_config(config).migration_policy == "upgrade"
    with pytest.raises(ConfigError, match="group.consumer.migration.policy") as caught:
        load(cli={"group.consumer.migration.policy": "sideways"})
    assert "disabled, upgrade, downgrade, bidirectional" in str(caught.value)

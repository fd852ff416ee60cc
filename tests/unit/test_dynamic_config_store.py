"""Dynamic broker configs: layering (value, sources, Kafka's synonyms), validation, listeners, and their
storage in the embedded metadata journal (restart, snapshot, journals written before they existed) and
in ZooKeeper's change notifications."""

from __future__ import annotations

import json

import pytest

from pykbroker.cluster import metadata_log
from pykbroker.cluster.dynamic_configs import DynamicConfigs, broker_entity, parse_dynamic_configs
from pykbroker.cluster.metadata import DEFAULT_BROKER_ENTITY, EmbeddedMetadata
from pykbroker.cluster.metadata_log import JOURNAL_FILE, SNAPSHOT_FILE, encode_record
from pykbroker.cluster.zk_metadata import _changed_entity
from pykbroker.config import BROKER_CONFIGS, LONG_MAX, BrokerConfig, ConfigSource
from pykbroker.protocol.errors import ErrorCode, KafkaError

STATIC, DEFAULT = ConfigSource.STATIC_BROKER_CONFIG, ConfigSource.DEFAULT_CONFIG
DYN_BROKER, DYN_DEFAULT = ConfigSource.DYNAMIC_BROKER_CONFIG, ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG


def open_store(path) -> EmbeddedMetadata:
    return EmbeddedMetadata(path, 1, "127.0.0.1", 9092)


def static_config(tmp_path, **values) -> BrokerConfig:
    values = {key.replace("_", "."): value for key, value in values.items()}
    return BrokerConfig(data_dir=tmp_path, port=0, values=values, explicit=frozenset(values))


def test_value_layers_per_broker_over_default_over_static(tmp_path):
    store = open_store(tmp_path)
    dynamic = DynamicConfigs(static_config(tmp_path, log_retention_hours=24, log_segment_bytes=4096), store)
    assert dynamic.value("log.segment.bytes") == 4096
    assert dynamic.value("leader.replication.throttled.rate") == LONG_MAX  # Kafka's default
    assert dynamic.config.topic_config_source("retention.ms") == (24 * 3_600_000, STATIC)
    changes: list[set[str]] = []
    dynamic.add_listener(changes.append)

    store.set_broker_configs(DEFAULT_BROKER_ENTITY, {"log.segment.bytes": "8192", "log.retention.ms": "60000"})
    assert dynamic.value("log.segment.bytes") == 8192
    assert dynamic.config.topic_config_source("retention.ms") == (60000, DYN_DEFAULT)
    store.set_broker_configs("1", {"log.segment.bytes": "16384", "leader.replication.throttled.rate": "1000"})
    assert dynamic.value("log.segment.bytes") == 16384
    assert dynamic.value("leader.replication.throttled.rate") == 1000
    assert dynamic.config.topic_config_source("segment.bytes") == (16384, DYN_BROKER)
    assert changes == [{"log.segment.bytes", "log.retention.ms"}, {"log.segment.bytes", "leader.replication.throttled.rate"}]

    store.set_broker_configs("1", {})  # deleted: the cluster default shows again
    assert dynamic.value("log.segment.bytes") == 8192
    assert changes[-1] == {"log.segment.bytes", "leader.replication.throttled.rate"}
    store.set_broker_configs("2", {"log.segment.bytes": "99999"})  # another broker's: not ours
    assert dynamic.value("log.segment.bytes") == 8192
    store.close()


def test_broker_synonyms_follow_kafkas_layers(tmp_path):
    store = open_store(tmp_path)
    dynamic = DynamicConfigs(static_config(tmp_path, log_retention_hours=24), store)
    store.set_broker_configs(DEFAULT_BROKER_ENTITY, {"log.retention.ms": "60000"})
    store.set_broker_configs("1", {"log.retention.ms": "30000"})
    config = dynamic.config
    assert config.broker_config_synonyms("log.retention.ms") == [
        ("log.retention.ms", "30000", DYN_BROKER), ("log.retention.ms", "60000", DYN_DEFAULT),
        ("log.retention.hours", "24", STATIC), ("log.retention.hours", "168", DEFAULT)]
    # the cluster-default resource keeps only the cluster default's entries (Kafka)
    assert config.broker_config_synonyms("log.retention.ms", per_broker=False) == [("log.retention.ms", "60000", DYN_DEFAULT)]
    # entries before the key's own are dropped (Kafka's dropWhile)
    assert config.broker_config_synonyms("log.retention.hours") == [
        ("log.retention.hours", "24", STATIC), ("log.retention.hours", "168", DEFAULT)]
    assert config.broker_config_synonyms("log.roll.ms") == []
    assert config.topic_config_synonyms("retention.ms")[:2] == [
        ("log.retention.ms", "30000", DYN_BROKER), ("log.retention.ms", "60000", DYN_DEFAULT)]
    assert BROKER_CONFIGS["log.retention.ms"].read_only is False
    assert BROKER_CONFIGS["log.retention.hours"].read_only is True
    store.close()


@pytest.mark.parametrize("configs,code,words", [  # codes as Kafka 3.7.1 answers (ZooKeeper and KRaft mode)
    ({"num.partitions": "3"}, ErrorCode.invalid_request, "Cannot update these configs dynamically: Set(num.partitions)"),
    ({"no.such.key": "3"}, ErrorCode.invalid_config, "Unknown broker config name: no.such.key"),  # Kafka: accepted
    ({"log.retention.ms": "soon"}, ErrorCode.invalid_request, "log.retention.ms"),
    ({"log.roll.ms": "0"}, ErrorCode.invalid_request, "segment.ms"),  # the topic default it supplies: >= 1
    ({"log.segment.bytes": "1"}, ErrorCode.invalid_request, "log.segment.bytes"),
    ({"log.cleanup.policy": "archive"}, ErrorCode.invalid_request, "compact"),
    ({"leader.replication.throttled.rate": "-1"}, ErrorCode.invalid_request, "leader.replication.throttled.rate"),
])
def test_invalid_dynamic_configs_are_refused(configs, code, words):
    with pytest.raises(KafkaError) as info:
        parse_dynamic_configs(configs)
    assert info.value.code == code and words in info.value.message


def test_a_negative_retention_means_forever_as_in_kafka(tmp_path):
    store = open_store(tmp_path)
    dynamic = DynamicConfigs(static_config(tmp_path), store)
    assert parse_dynamic_configs({"log.retention.ms": "-5"}) == {"log.retention.ms": -5}
    store.set_broker_configs(DEFAULT_BROKER_ENTITY, {"log.retention.ms": "-5"})
    assert dynamic.config.topic_config_source("retention.ms") == (-1, DYN_DEFAULT)
    store.close()


def test_broker_entity_names():
    assert broker_entity("", 1) == DEFAULT_BROKER_ENTITY
    assert broker_entity("1", 1) == "1"
    for name, message in (("2", "Unexpected broker id, expected 1, but received 2"),
                          ("x", "Node id must be an integer, but it is: x")):
        with pytest.raises(KafkaError) as info:
            broker_entity(name, 1)
        assert (info.value.code, info.value.message) == (ErrorCode.invalid_request, message)


def test_dynamic_configs_survive_a_restart_and_a_snapshot(tmp_path, monkeypatch):
    monkeypatch.setattr(metadata_log, "SNAPSHOT_MIN_RECORDS", 10)
    store = open_store(tmp_path)
    store.create_topic("t", 1, 1, {})
    for i in range(30):  # enough records for a snapshot
        store.set_broker_configs(DEFAULT_BROKER_ENTITY, {"log.retention.ms": str(1000 + i)})
        store.commit()
    store.set_broker_configs("1", {"log.segment.bytes": "4096"})
    store.set_broker_configs("1", {"log.segment.bytes": "8192"})
    store.commit().result(10)
    store.close()
    assert "configs" in json.loads((tmp_path / SNAPSHOT_FILE).read_text())
    reopened = open_store(tmp_path)
    assert reopened.broker_configs(DEFAULT_BROKER_ENTITY) == {"log.retention.ms": "1029"}
    assert reopened.broker_configs("1") == {"log.segment.bytes": "8192"}
    dynamic = DynamicConfigs(static_config(tmp_path), reopened)
    assert dynamic.value("log.retention.ms") == 1029 and dynamic.value("log.segment.bytes") == 8192
    reopened.set_broker_configs("1", {})  # removed, durably
    reopened.commit().result(10)
    reopened.close()
    assert open_store(tmp_path).broker_configs("1") == {}


def test_a_journal_from_before_dynamic_configs_loads(tmp_path):
    topic = {"name": "old", "topic_id": "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
             "partitions": [{"leader": 1, "leader_epoch": 0, "replicas": [1], "isr": [1]}], "configs": {}}
    (tmp_path / SNAPSHOT_FILE).write_text(json.dumps({"version": 1, "topics": [topic]}))
    (tmp_path / JOURNAL_FILE).write_bytes(encode_record({"op": "topic", "topic": {**topic, "name": "older"}}))
    store = open_store(tmp_path)
    assert sorted(info.name for info in store.topics()) == ["old", "older"]
    assert store.broker_configs(DEFAULT_BROKER_ENTITY) == {}
    store.close()


def test_a_stored_value_no_longer_valid_is_ignored_with_a_warning(tmp_path, caplog):
    store = open_store(tmp_path)
    store.set_broker_configs(DEFAULT_BROKER_ENTITY, {"log.retention.ms": "bad", "log.segment.bytes": "4096"})
    dynamic = DynamicConfigs(static_config(tmp_path), store)
    assert dynamic.value("log.segment.bytes") == 4096
    assert dynamic.value("log.retention.ms") is None
    assert "ignoring the stored dynamic config log.retention.ms" in caplog.text
    store.close()


def test_config_change_notifications_name_their_entity():
    assert _changed_entity(b'{"version":2,"entity_path":"topics/t"}') == ("topics", "t")
    assert _changed_entity(b'{"version":2,"entity_path":"brokers/<default>"}') == ("brokers", "<default>")
    assert _changed_entity(b'{"version":1,"entity_type":"brokers","entity_name":"2"}') == ("brokers", "2")
    assert _changed_entity(b"not json") is None
    assert _changed_entity(None) is None


def test_a_new_key_store_applies_only_once_stored_and_is_validated_off_the_event_loop(tmp_path, monkeypatch):
    """Kafka applies changed TLS values when the stored change is notified (reloadUpdatedFilesWithoutConfigChange
    only reloads components none of whose values change): if the write fails, the broker keeps serving the
    certificate its stored configs name. Validation and reloads read files and build contexts: a worker thread."""
    import asyncio
    import threading

    pytest.importorskip("cryptography", reason="certificates for this test are built with cryptography")
    from tls_helpers import chain_pem, key_pem, standard_pki
    from pykbroker.security.tls import ListenerTlsReloader, TlsContextHolder

    (tmp_path / "pki").mkdir()
    pki = standard_pki(tmp_path / "pki")
    settings = {"ssl.keystore.type": "PEM", "ssl.keystore.location": pki.broker_pem_file,
                "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file}
    holder = TlsContextHolder(settings)
    reloader = ListenerTlsReloader({"SSL": holder}, {"SSL": "SSL"})
    store = open_store(tmp_path)
    dynamic = DynamicConfigs(static_config(tmp_path, **{k.replace(".", "_"): v for k, v in settings.items()}), store)
    threads: list[int] = []

    def validate(values):
        threads.append(threading.get_ident())
        reloader.validate(values)

    dynamic.add_reconfigurable(lambda name: "ssl." in name, validate, reloader.reconfigure)
    applied: list[asyncio.Task] = []
    dynamic.add_listener(lambda names: applied.append(reloader.reconfigure_soon(dynamic.config.values)))
    key, cert = pki.issue("broker")
    renewed = tmp_path / "renewed.pem"
    renewed.write_text(key_pem(key) + chain_pem(cert, pki))
    update = {"listener.name.ssl.ssl.keystore.location": str(renewed)}

    def serial() -> int:
        return holder.keystore.key_entry.chain[0].serial_number

    async def scenario():
        real_write = store.set_broker_configs_async

        async def failing_write(*args, **kwargs):
            raise ConnectionError("the metadata store cannot be written")

        monkeypatch.setattr(store, "set_broker_configs_async", failing_write)
        with pytest.raises(ConnectionError):
            await dynamic.alter_async("1", update)
        assert serial() == pki.broker.serial_number  # not stored: not applied
        assert threads and threading.get_ident() not in threads
        monkeypatch.setattr(store, "set_broker_configs_async", real_write)
        await dynamic.alter_async("1", update)
        assert len(applied) == 1
        assert await applied[0] == ["SSL"]
        assert serial() == cert.serial_number

    asyncio.run(asyncio.wait_for(scenario(), 60))
    store.close()

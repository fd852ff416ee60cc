"""The AlterConfigs / IncrementalAlterConfigs handlers on a single node's metadata, called directly: large
requests stay linear and their error messages short, duplicate keys and default topic resources are refused
as Kafka refuses them, one resource's unexpected failure does not fail the others, a read-modify-write that
lost a race reads again, and internal topics keep their data whatever their stored overrides say."""

from __future__ import annotations

import asyncio
import time
import types

import pytest
from kio.schema.alter_configs.v2 import request as ac
from kio.schema.incremental_alter_configs.v1 import request as iac
from kio.static.primitive import i8

from pykbroker.cluster.dynamic_configs import DynamicConfigs
from pykbroker.cluster.metadata import EmbeddedMetadata, StaleConfigVersion
from pykbroker.cluster.topic_admin import TopicAdmin
from pykbroker.config import BrokerConfig
from pykbroker.log.manager import LogManager
from pykbroker.protocol.apis import codec_for
from pykbroker.protocol.errors import ErrorCode
from pykbroker.replication.replica_manager import ReplicaManager
from pykbroker.server.dispatch import RequestContext
from pykbroker.server.handlers.alter_configs import alter_configs, incremental_alter_configs

TOPIC, BROKER = 2, 4
SET, DELETE = 0, 1


@pytest.fixture
def node(tmp_path):
    metadata = EmbeddedMetadata(tmp_path, 1, "127.0.0.1", 9092)
    config = BrokerConfig(data_dir=tmp_path, port=0, values={}, explicit=frozenset())
    logs = LogManager(tmp_path)
    replicas = ReplicaManager(logs, 1, lambda topic: admin.log_config(topic))
    dynamic = DynamicConfigs(config, metadata)
    admin = TopicAdmin(config, metadata, replicas, dynamic)
    for name in ("a", "b"):
        metadata.create_topic(name, 1, 1, {"retention.ms": "1000"})
    yield types.SimpleNamespace(metadata=metadata, topics=admin, dynamic_configs=dynamic, broker_id=1)
    logs.shutdown()
    metadata.close()


def call(broker, key: int, version: int, body):
    handler = {33: alter_configs, 44: incremental_alter_configs}[key]
    envelope = types.SimpleNamespace(api_key=key, api_version=version, body=body, codec=codec_for(key, version))
    response = asyncio.run(handler(RequestContext(broker, envelope, "peer"), body))
    return [(r.resource_name, r.error_code, r.error_message) for r in response.responses]


def incremental(broker, *resources, validate_only=False):
    """resources: (type, name, [(key, op, value)])."""
    return call(broker, 44, 1, iac.IncrementalAlterConfigsRequest(resources=tuple(
        iac.AlterConfigsResource(resource_type=i8(kind), resource_name=name, configs=tuple(
            iac.AlterableConfig(name=key, config_operation=i8(op), value=value) for key, op, value in configs))
        for kind, name, configs in resources), validate_only=validate_only))


def legacy(broker, *resources, validate_only=False):
    """resources: (type, name, [(key, value)])."""
    return call(broker, 33, 2, ac.AlterConfigsRequest(resources=tuple(
        ac.AlterConfigsResource(resource_type=i8(kind), resource_name=name, configs=tuple(
            ac.AlterableConfig(name=key, value=value) for key, value in configs))
        for kind, name, configs in resources), validate_only=validate_only))


def test_forty_thousand_configs_in_one_resource_are_checked_in_linear_time(node):
    many = [(f"no.such.config.{i}", SET, "1") for i in range(40_000)]
    started = time.monotonic()
    ((_, code, message),) = incremental(node, (TOPIC, "a", many), validate_only=True)
    assert time.monotonic() - started < 3.0  # names.count per name took 11 s
    assert code == ErrorCode.invalid_config and message == "Unknown topic config name: no.such.config.0"
    started = time.monotonic()
    ((_, code, _),) = incremental(node, (TOPIC, "a", many + many[:1]), validate_only=True)
    assert time.monotonic() - started < 3.0 and code == ErrorCode.invalid_request


def test_error_messages_list_a_bounded_number_of_names(node):
    unknown = [(f"no.such.broker.config.{i:04d}", SET, "1") for i in range(1000)]
    ((_, code, message),) = incremental(node, (BROKER, "", unknown))
    assert code == ErrorCode.invalid_config
    assert message.startswith("Unknown broker config name: no.such.broker.config.0000, ")
    assert message.endswith("... (990 more)") and len(message) < 400
    nulls = [(f"k{i}", None) for i in range(1000)]
    ((_, code, message),) = legacy(node, (TOPIC, "a", nulls))
    assert code == ErrorCode.invalid_request and message.startswith("Null value not supported for : k0, k1, ")
    assert message.endswith(", ... (990 more)") and len(message) < 200


def test_legacy_alter_configs_refuses_a_key_named_twice(node):
    twice = [("retention.ms", "5"), ("retention.ms", "6")]
    assert legacy(node, (TOPIC, "a", twice)) == [("a", ErrorCode.invalid_request, "Error due to duplicate config keys")]
    assert node.metadata.topic_configs("a") == {"retention.ms": "1000"}
    # checked first, as Kafka's ConfigAdminManager.preprocess: even for a topic that does not exist
    assert legacy(node, (TOPIC, "missing", twice))[0][1:] == (ErrorCode.invalid_request, "Error due to duplicate config keys")
    assert incremental(node, (TOPIC, "missing", [("retention.ms", SET, "5")] * 2))[0][1:] == (
        ErrorCode.invalid_request, "Error due to duplicate config keys")


def test_a_topic_resource_without_a_name_is_invalid_request(node):
    expected = [("", ErrorCode.invalid_request, "Default topic resources are not allowed.")]
    assert incremental(node, (TOPIC, "", [("retention.ms", SET, "5")])) == expected
    assert legacy(node, (TOPIC, "", [("retention.ms", "5")])) == expected


def test_an_unexpected_failure_of_one_resource_is_answered_for_it_alone(node, monkeypatch, caplog):
    real = node.metadata.set_topic_configs_async

    async def failing_for_b(name, configs, *, version=None):
        if name == "b":
            raise ConnectionError("ZooKeeper connection lost")
        await real(name, configs, version=version)

    monkeypatch.setattr(node.metadata, "set_topic_configs_async", failing_for_b)
    change = [("retention.ms", SET, "5000")]
    assert incremental(node, (TOPIC, "a", change), (TOPIC, "b", change), (BROKER, "", [("log.retention.ms", SET, "7")])) \
        == [("a", ErrorCode.none, None), ("b", ErrorCode.unknown_server_error, None), ("", ErrorCode.none, None)]
    assert node.metadata.topic_configs("a") == {"retention.ms": "5000"}
    assert node.metadata.broker_configs("<default>") == {"log.retention.ms": "7"}
    assert "ZooKeeper connection lost" in caplog.text
    assert legacy(node, (TOPIC, "b", [("retention.ms", "5")]))[0][1] == ErrorCode.unknown_server_error


def test_incremental_alter_starts_from_the_store_and_reads_again_after_a_lost_race(node, monkeypatch):
    # The store (ZooKeeper in a cluster) has an override the cached TopicInfo does not have yet, and another
    # write lands between the first read and the conditional write: nothing of either may be lost.
    store = {"retention.ms": "1000", "segment.bytes": "1048576"}
    reads = []

    async def read(entity_type, name):
        reads.append((entity_type, name))
        return dict(store), len(reads)

    async def write(name, configs, *, version=None):
        if version == 1:
            store["max.message.bytes"] = "2048"  # the other broker's write
            raise StaleConfigVersion("changed since read")
        store.clear()
        store.update(configs)

    monkeypatch.setattr(node.metadata, "read_entity_configs_async", read)
    monkeypatch.setattr(node.metadata, "set_topic_configs_async", write)
    assert incremental(node, (TOPIC, "a", [("retention.ms", SET, "5")])) == [("a", ErrorCode.none, None)]
    assert reads == [("topics", "a"), ("topics", "a")]
    assert store == {"retention.ms": "5", "segment.bytes": "1048576", "max.message.bytes": "2048"}


def test_internal_topics_stay_compacted_whatever_is_stored(node):
    node.topics.ensure_internal("__consumer_offsets", 1)
    assert legacy(node, (TOPIC, "__consumer_offsets", [("segment.bytes", "1048576")])) == [
        ("__consumer_offsets", ErrorCode.none, None)]
    assert node.metadata.topic_configs("__consumer_offsets") == {"segment.bytes": "1048576"}  # as stored
    config = node.topics.log_config("__consumer_offsets")
    assert (config.cleanup_policy, config.compact, config.delete, config.segment_bytes) == ("compact", True, False, 1048576)
    effective = node.topics.effective_configs("__consumer_offsets")  # DescribeConfigs: what is applied
    assert effective["cleanup.policy"][0] == ["compact"]
    incremental(node, (TOPIC, "__consumer_offsets", [("cleanup.policy", SET, "delete")]))
    assert node.topics.log_config("__consumer_offsets").cleanup_policy == "compact"


def test_append_and_subtract_on_a_listener_override_use_its_base_type(node):
    """A listener override is a known broker config, typed as its base: APPEND/SUBTRACT work on a list one
    (from no value: an override has no default) and are refused as for its base on another. (Kafka 3.7.1 itself answers
    UNKNOWN_SERVER_ERROR here: its prepareIncrementalConfigs looks the name up in KafkaConfig.configKeys
    and fails with NoSuchElementException; pykbroker answers as for the base key.)"""
    name = "listener.name.plaintext.sasl.enabled.mechanisms"
    assert incremental(node, (BROKER, "1", [(name, 2, "PLAIN")])) == [("1", ErrorCode.none, None)]
    assert node.dynamic_configs.stored("1") == {name: "PLAIN"}  # an unset override has no default (as described)
    assert incremental(node, (BROKER, "1", [(name, 2, "SCRAM-SHA-256")])) == [("1", ErrorCode.none, None)]
    assert node.dynamic_configs.stored("1") == {name: "PLAIN,SCRAM-SHA-256"}
    assert incremental(node, (BROKER, "1", [(name, 3, "PLAIN")])) == [("1", ErrorCode.none, None)]
    assert node.dynamic_configs.stored("1") == {name: "SCRAM-SHA-256"}
    assert incremental(node, (BROKER, "1", [("listener.name.plaintext.max.connections", 2, "5")])) == [
        ("1", ErrorCode.invalid_config, "Config value append is not allowed for config key: listener.name.plaintext.max.connections")]
    assert incremental(node, (BROKER, "1", [("listener.name.plaintext.no.such.key", 2, "5")])) == [
        ("1", ErrorCode.invalid_config, "Unknown broker config name: listener.name.plaintext.no.such.key")]

"""pykbroker's ZooKeeper JSON has the shapes Kafka 3.7.1 writes (same keys, same value types), checked
against znode data captured from a real Kafka (protocol_specs/fixtures/zookeeper/), and reads Kafka's
documents back. No ZooKeeper needed."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install kazoo, or the project's test extra)")

from pykbroker.cluster import zookeeper as zkm
from pykbroker.cluster.zookeeper import Endpoint, PartitionState, ProducerIdBlock

FIXTURES = Path(__file__).resolve().parents[2] / "protocol_specs" / "fixtures" / "zookeeper"


def fixture(name: str):
    return json.loads((FIXTURES / name).read_text())


def shape(value):
    """Keys and value types, recursively; list elements collapse to the set of their shapes. Types are JSON
    types (an int is not a string: Kafka is strict about "version":"1" versus "version":1)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return ["list", sorted({json.dumps(shape(v), sort_keys=True) for v in value})]
    if value is None:
        return "null"
    return type(value).__name__


def same_shape(ours: bytes, kafkas: dict) -> None:
    mine = json.loads(ours)
    assert shape(mine) == shape(kafkas), f"\nours:   {mine}\nkafka's: {kafkas}"


def test_cluster_id():
    kafka = fixture("cluster_id.json")
    same_shape(zkm.encode_cluster_id(zkm.new_cluster_id()), kafka)
    assert zkm.decode_cluster_id(json.dumps(kafka).encode()) == kafka["id"]
    assert len(zkm.kafka_uuid_to_uuid(kafka["id"]).bytes) == 16


def test_broker_registration():
    kafka = fixture("broker_registration.json")
    ours = zkm.encode_broker_registration(1, [Endpoint("PLAINTEXT", "127.0.0.1", 29091)], rack="rack1")
    same_shape(ours, kafka)
    doc = json.loads(ours)
    assert {k: doc[k] for k in ("version", "jmx_port", "host", "port", "endpoints", "rack", "features")} == {
        k: kafka[k] for k in ("version", "jmx_port", "host", "port", "endpoints", "rack", "features")
    }
    stat = SimpleNamespace(czxid=45, version=1)
    reg = zkm.decode_broker_registration(1, json.dumps(kafka).encode(), stat)
    assert reg.epoch == 45 and reg.rack == "rack1" and reg.timestamp_ms == int(kafka["timestamp"])
    assert reg.endpoints == (Endpoint("PLAINTEXT", "127.0.0.1", 29091, "PLAINTEXT"),)


def test_broker_registration_without_rack_and_with_several_listeners():
    eps = [Endpoint("INTERNAL", "10.0.0.1", 9093, "SSL"), Endpoint("CLIENT", "::1", 9092, "PLAINTEXT")]
    doc = json.loads(zkm.encode_broker_registration(3, eps))
    assert "rack" not in doc  # Kafka omits it when no rack is configured
    assert doc["endpoints"] == ["INTERNAL://10.0.0.1:9093", "CLIENT://[::1]:9092"]
    assert doc["listener_security_protocol_map"] == {"INTERNAL": "SSL", "CLIENT": "PLAINTEXT"}
    assert (doc["host"], doc["port"]) == ("::1", 9092)  # the first PLAINTEXT listener, for old clients
    back = zkm.decode_broker_registration(3, json.dumps(doc).encode())
    assert back.endpoints == tuple(eps)
    none = json.loads(zkm.encode_broker_registration(4, [Endpoint("S", "h", 1, "SSL")]))
    assert (none["host"], none["port"]) == (None, -1)


def test_controller_and_epoch():
    kafka = fixture("controller.json")
    same_shape(zkm.encode_controller(1), kafka)
    assert json.loads(zkm.encode_controller(1))["kraftControllerEpoch"] == -1
    assert zkm.decode_controller(json.dumps(kafka).encode()) == 1
    raw = (FIXTURES / "controller_epoch.txt").read_bytes()
    assert zkm.encode_controller_epoch(1) == raw and zkm.decode_controller_epoch(raw) == 1


def test_topic_assignment():
    kafka = fixture("topic_assignment.json")
    partitions = {int(p): r for p, r in kafka["partitions"].items()}
    ours = zkm.encode_topic_assignment(partitions, zkm.kafka_uuid_to_uuid(kafka["topic_id"]))
    same_shape(ours, kafka)
    assert json.loads(ours) == kafka  # same content too, since the topic id round-trips
    a = zkm.decode_topic_assignment("orders", json.dumps(kafka).encode(), SimpleNamespace(version=0))
    assert a.partitions == {0: [1, 2], 1: [2, 1], 2: [1, 2]} and a.topic_id == kafka["topic_id"]
    moving = json.loads(zkm.encode_topic_assignment({0: [1, 2, 3]}, uuid.uuid4(), adding_replicas={0: [3]}))
    assert moving["adding_replicas"] == {"0": [3]} and moving["removing_replicas"] == {}


def test_partition_state():
    kafka = fixture("partition_state.json")
    st = zkm.decode_partition_state(json.dumps(kafka).encode(), SimpleNamespace(version=1))
    assert (st.leader, st.leader_epoch, st.isr, st.controller_epoch, st.zk_version) == (1, 1, (1,), 1, 1)
    assert st.leader_recovery_state == zkm.LEADER_RECOVERED
    ours = zkm.encode_partition_state(PartitionState(leader=1, leader_epoch=1, isr=(1,), controller_epoch=1))
    same_shape(ours, kafka)
    assert json.loads(ours) == kafka
    recovering = json.loads(
        zkm.encode_partition_state(PartitionState(2, 3, (2,), 4, leader_recovery_state=zkm.LEADER_RECOVERING))
    )
    assert recovering["leader_recovery_state"] == 1
    assert zkm.decode_partition_state(json.dumps(recovering).encode()).leader_recovery_state == 1


def test_topic_config_and_change_notification():
    kafka = fixture("topic_config.json")
    ours = zkm.encode_topic_config(kafka["config"])
    same_shape(ours, kafka)
    assert zkm.decode_topic_config(json.dumps(kafka).encode()) == kafka["config"]
    assert json.loads(zkm.encode_topic_config({"retention.ms": 5})) == {"version": 1, "config": {"retention.ms": "5"}}
    note = fixture("config_change_notification.json")
    assert json.loads(zkm.encode_config_change("topics/orders")) == note


@pytest.mark.parametrize("data", [b"{not json", b"\xff\xfe", b"[1, 2]", b'"text"', b'{"version":1,"config":[]}',
                                  b'{"version":1,"config":null}'])
def test_an_unreadable_entity_config_znode_is_an_entity_without_configs_and_a_warning_naming_it(data, caplog):
    """Kafka's ConfigEntityZNode.decode: data that does not parse as JSON (Json.parseBytes gives None), is not
    an object, or has no ``config`` object is an empty Properties: not an error (a broker starts), and the
    same for topic, broker and client entity znodes. The warning names the znode and shows none of the data."""
    assert zkm.decode_topic_config(data, "/config/users/mallory") == {}
    assert "/config/users/mallory" in caplog.text
    assert "not json" not in caplog.text and "text" not in caplog.text.replace("cannot be read", "")
    caplog.clear()
    assert zkm.decode_topic_config(b'{"version":1}', "/config/topics/t") == {}  # no config key: nothing to warn
    assert zkm.decode_topic_config(None) == {} and zkm.decode_topic_config(b"") == {}
    assert caplog.text == ""


def test_producer_id_block():
    kafka = fixture("latest_producer_id_block.json")
    ours = zkm.encode_producer_id_block(ProducerIdBlock(1, 0, 999))
    same_shape(ours, kafka)
    assert json.loads(ours) == kafka
    assert zkm.decode_producer_id_block(json.dumps(kafka).encode()) == ProducerIdBlock(1, 0, 999)


@pytest.mark.parametrize(
    "connect, hosts, chroot",
    [
        ("127.0.0.1:2181", "127.0.0.1:2181", None),
        ("a:1,b:2/kafka", "a:1,b:2", "/kafka"),
        ("a:1/kafka/prod/", "a:1", "/kafka/prod"),
        ("a:1/", "a:1", None),
    ],
)
def test_connect_string_chroot(connect, hosts, chroot):
    assert zkm.split_connect_string(connect) == (hosts, chroot)


def test_kafka_uuid_form():
    u = uuid.UUID("1451af45-2a55-4b15-a9c4-d5cd3fd94ce0")
    s = zkm.uuid_to_kafka(u)
    assert "=" not in s and len(s) == 22 and zkm.kafka_uuid_to_uuid(s) == u
    assert zkm.uuid_to_kafka(str(u)) == s and zkm.uuid_to_kafka(s) == s
    with pytest.raises(ValueError):
        zkm.kafka_uuid_to_uuid("AAAA")

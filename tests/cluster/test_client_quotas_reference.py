"""AlterClientQuotas and DescribeClientQuotas answered by pykbroker and by Kafka 3.7.1 in ZooKeeper mode (the
reference kit, on the session's ZooKeeper): the same requests, in the same order, on fresh brokers, give the same
per-entry errors and messages and the same descriptions."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from broker_cluster import wait_until  # also puts tests/integration on sys.path
from broker_process import BrokerProcess, ProtocolError, probe_api_versions
from kio.schema.alter_client_quotas.v1.request import AlterClientQuotasRequest, EntityData, EntryData, OpData
from kio.static.primitive import f64
from quota_wire import Wire, describe
from test_kafka_zk_layout import kafka  # noqa: F401 - the fixture: Kafka 3.7.1 on the session's ZooKeeper

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# (entity {type: name or None}, ops {key: value or None to remove}, validate_only), one request each
ALTERATIONS = [
    ({"user": "alice"}, {"producer_byte_rate": 10.5}, False),
    ({"user": "alice"}, {"producer_byte_rate": -5.0}, False),
    ({"client-id": "app"}, {"foo": 1.0}, False),
    ({"user": ""}, {"producer_byte_rate": 1.0}, False),
    ({"user": "alice", "ip": "1.2.3.4"}, {"producer_byte_rate": 1.0}, False),
    ({"user": "alice"}, {"SCRAM-SHA-256": 1.0}, False),
    ({"ip": "1.2.3.4"}, {"producer_byte_rate": 1.0}, False),
    ({"user": "bob"}, {"producer_byte_rate": 1024.0}, True),
    ({"user": "alice"}, {"producer_byte_rate": 1024.0, "request_percentage": 50.5}, False),
    ({"user": "alice", "client-id": None}, {"consumer_byte_rate": 2048.0}, False),
    ({"client-id": None}, {"controller_mutation_rate": 3.0, "request_percentage": -3.0}, False),
    ({"client-id": "my app*"}, {"producer_byte_rate": 7.0}, False),
    ({"ip": "1.2.3.4"}, {"connection_creation_rate": 10.0}, False),
    ({"user": "alice"}, {"request_percentage": None}, False),
]
# (components [(entity type, match type, match)], strict)
DESCRIPTIONS = [
    ([], False),
    ([], True),
    ([("user", 0, "alice")], False),
    ([("user", 0, "alice")], True),
    ([("user", 2, None)], True),
    ([("client-id", 1, None)], False),
    ([("client-id", 0, "my app*")], True),
    ([("ip", 2, None)], False),
    ([("user", 0, "bob")], False),
    ([("user", 0, "a"), ("user", 0, "b")], False),
    ([("group", 2, None)], False),
    ([("", 2, None)], False),
    ([("user", 2, None), ("ip", 2, None)], False),
    ([("user", 0, None)], False),
]


def answers(address: tuple[str, int]) -> tuple[list, list]:
    wire = Wire(SimpleNamespace(address=address), "reference-compare")
    try:
        altered = []
        for parts, ops, validate_only in ALTERATIONS:
            response = wire.request(AlterClientQuotasRequest(entries=(EntryData(
                entity=tuple(EntityData(entity_type=k, entity_name=v) for k, v in parts.items()),
                ops=tuple(OpData(key=k, value=f64(0.0 if v is None else v), remove=v is None) for k, v in ops.items()),
            ),), validate_only=validate_only))
            altered.append([(sorted((e.entity_type, e.entity_name or "") for e in entry.entity), int(entry.error_code),
                             entry.error_message) for entry in response.entries])
        described = []
        for components, strict in DESCRIPTIONS:
            response = describe(wire, components, strict)
            entries = None if response.entries is None else sorted(
                (sorted((e.entity_type, e.entity_name or "<default>") for e in entry.entity),
                 sorted((v.key, v.value) for v in entry.values)) for entry in response.entries)
            described.append((int(response.error_code), response.error_message, entries))
        return altered, described
    finally:
        wire.close()


def test_client_quota_apis_answer_as_kafka_in_zookeeper_mode(kafka, tmp_path):
    address = ("127.0.0.1", kafka.port)

    def kafka_ready() -> bool:
        try:
            probe_api_versions(address)
            return True
        except (OSError, ProtocolError):
            assert kafka.proc.poll() is None, f"Kafka exited:\n{kafka.tail()}"
            return False

    wait_until(kafka_ready, "Kafka 3.7.1 answering ApiVersions", 180)
    expected = answers(address)
    ours = BrokerProcess(tmp_path / "pykbroker").start()
    try:
        got = answers(ours.address)
    finally:
        ours.close()
    for index, (want, have) in enumerate(zip(expected[0], got[0])):
        assert have == want, f"AlterClientQuotas {ALTERATIONS[index]}"
    for index, (want, have) in enumerate(zip(expected[1], got[1])):
        assert have == want, f"DescribeClientQuotas {DESCRIPTIONS[index]}"

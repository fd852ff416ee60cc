"""FindCoordinator's error_message as Kafka 3.7.1 words it (compared with the reference kit's broker): v0 has
no such field; v1-3 carry Errors.message() ("NONE" on success, Kafka's text of the error); v4 carries "" per
key, except for an unknown key type, which fails the whole request in Kafka and carries the text in v4 too.
pykbroker's own reason (why __consumer_offsets cannot be created) is tested with a cluster
(tests/cluster/test_cluster_cli.py)."""

from __future__ import annotations

import importlib

import pytest
from kio.static.primitive import i8

from broker_process import send_request

INVALID_REQUEST = ("This most likely occurs because of a request being malformed by the client library or the "
                   "message was sent to an incompatible broker. See the broker logs for more details.")


def find_coordinator(broker, version: int, key: str, key_type: int = 0):
    schema = importlib.import_module(f"kio.schema.find_coordinator.v{version}.request").FindCoordinatorRequest
    request = (schema(key_type=i8(key_type), coordinator_keys=(key,)) if version >= 4
               else schema(key=key) if version == 0 else schema(key=key, key_type=i8(key_type)))
    response = send_request(broker.address, request)
    return response.coordinators[0] if version >= 4 else response


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_error_messages_are_kafkas(shared_broker, version):
    found = find_coordinator(shared_broker, version, "texts-group")
    invalid = find_coordinator(shared_broker, version, "")  # pykbroker's INVALID_REQUEST for an empty group id
    if version == 0:
        assert (int(found.error_code), int(invalid.error_code)) == (0, 42)
        assert not hasattr(found, "error_message") and not hasattr(invalid, "error_message")
        return
    unknown_type = find_coordinator(shared_broker, version, "texts-group", key_type=5)
    assert int(found.error_code) == 0 and found.error_message == ("" if version >= 4 else "NONE")
    assert int(invalid.error_code) == 42 and invalid.error_message == ("" if version >= 4 else INVALID_REQUEST)
    assert int(unknown_type.error_code) == 42 and unknown_type.error_message == INVALID_REQUEST

"""Kafka's ZooKeeper layout for ACLs: paths, znode data and change notifications, checked against what a
real Kafka 3.7.1 broker wrote (tests/unit/data/kafka371_acl_znodes.json), and bad data refused clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pykbroker.cluster.change_notifications import ChangeNotificationListener
from pykbroker.security.acl import (
    AccessControlEntry, AclOperation, AclPermissionType, PatternType, Resource, ResourcePattern, ResourceType,
)
from pykbroker.security.acl_store import (
    CHANGE_PREFIX, EXTENDED_CHANGES_ROOT, LITERAL_CHANGES_ROOT, MAX_READ_BYTES, MAX_ZNODE_BYTES, AclStoreError, acl_path,
    change_notification, check_storable, decode_acls, decode_change, encode_acls, paths_to_create,
    pattern_from_path, resource_type_from_znode,
)
from pykbroker.security.authorizer import AclAuthorizer

# How the brokers read a notification's sequence number (cluster/acls.py: one listener per ACL change root).
ACL_CHANGES = ChangeNotificationListener(None, LITERAL_CHANGES_ROOT, CHANGE_PREFIX, process=None)  # type: ignore[arg-type]

FIXTURE = json.loads((Path(__file__).parent / "data" / "kafka371_acl_znodes.json").read_text("utf-8"))
ZNODES = FIXTURE["znodes"]
ACL_ZNODES = {path: data for path, data in ZNODES.items() if "-changes/" not in path}
CHANGE_ZNODES = {path: data for path, data in ZNODES.items() if "-changes/" in path}
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED


def test_fixture_has_what_kafka_wrote():
    assert "/kafka-acl/Topic/orders" in ACL_ZNODES
    assert "/kafka-acl-extended/prefixed/Topic/pay" in ACL_ZNODES
    assert "/kafka-acl/User/User:frank" in ACL_ZNODES
    assert len(CHANGE_ZNODES) == 9


@pytest.mark.parametrize("path", sorted(ACL_ZNODES))
def test_paths_and_data_round_trip(path):
    pattern = pattern_from_path(path)
    assert acl_path(pattern) == path
    entries = decode_acls(ACL_ZNODES[path].encode()).entries
    assert entries and not decode_acls(ACL_ZNODES[path].encode()).skipped
    # our encoding is Kafka's (compact, same keys and spellings); only the order of entries may differ
    ours = json.loads(encode_acls(entries))
    theirs = json.loads(ACL_ZNODES[path])
    assert list(ours) == list(theirs) == ["version", "acls"]
    assert [list(item) for item in ours["acls"]] == [["principal", "permissionType", "operation", "host"]] * len(
        ours["acls"])
    assert sorted(map(json.dumps, ours["acls"])) == sorted(map(json.dumps, theirs["acls"]))
    assert b", " not in encode_acls(entries) and b": " not in encode_acls(entries)


def test_spellings():
    assert pattern_from_path("/kafka-acl/TransactionalId/tx") == ResourcePattern(
        ResourceType.TRANSACTIONAL_ID, "tx", LIT)
    assert acl_path(ResourcePattern(ResourceType.DELEGATION_TOKEN, "tok1", PRE)) == \
        "/kafka-acl-extended/prefixed/DelegationToken/tok1"
    data = json.loads(encode_acls([AccessControlEntry("User:bob", "10.0.0.1", AclOperation.IDEMPOTENT_WRITE,
                                                      AclPermissionType.DENY)]))
    assert data == {"version": 1, "acls": [{"principal": "User:bob", "permissionType": "Deny",
                                            "operation": "IdempotentWrite", "host": "10.0.0.1"}]}
    assert "/kafka-acl/Cluster" in paths_to_create() and "/kafka-acl-extended/prefixed/User" in paths_to_create()
    assert paths_to_create()[-2:] == [LITERAL_CHANGES_ROOT, EXTENDED_CHANGES_ROOT]
    assert resource_type_from_znode("Topic") == ResourceType.TOPIC
    assert resource_type_from_znode("Any") is None and resource_type_from_znode("Bogus") is None


@pytest.mark.parametrize("path", sorted(CHANGE_ZNODES))
def test_change_notifications_as_kafka(path):
    root, _, child = path.rpartition("/")
    pattern = decode_change(root, CHANGE_ZNODES[path].encode())
    prefix, data = change_notification(pattern)
    assert prefix == f"{root}/acl_changes_"
    assert data.decode() == CHANGE_ZNODES[path]
    assert ACL_CHANGES.sequence(child) >= 0


def test_change_notification_spellings():
    assert change_notification(ResourcePattern(ResourceType.DELEGATION_TOKEN, "tok1", LIT)) == (
        "/kafka-acl-changes/acl_changes_", b"DELEGATION_TOKEN:tok1")
    assert FIXTURE["after_remove"]["created"]["/kafka-acl-changes/acl_changes_0000000020"] == "DELEGATION_TOKEN:tok1"
    assert change_notification(ResourcePattern(ResourceType.TRANSACTIONAL_ID, "tx-", PRE))[1] == \
        b'{"version":1,"resourceType":"TRANSACTIONAL_ID","name":"tx-","patternType":"PREFIXED"}'
    assert decode_change(LITERAL_CHANGES_ROOT, b"topic:a:b") == ResourcePattern(ResourceType.TOPIC, "a:b", LIT)
    assert ACL_CHANGES.sequence("acl_changes_0000000042") == 42


def test_fixture_acls_decide_as_kafka_would():
    authorizer = AclAuthorizer()
    for path, data in ACL_ZNODES.items():
        authorizer.cache.set(pattern_from_path(path), decode_acls(data.encode()).entries)
    allow = authorizer.authorize
    assert allow("User:alice", "1.2.3.4", AclOperation.READ, Resource(ResourceType.TOPIC, "orders"))
    assert not allow("User:alice", "1.2.3.4", AclOperation.WRITE, Resource(ResourceType.TOPIC, "orders"))
    assert allow("User:anyone", "1.2.3.4", AclOperation.WRITE, Resource(ResourceType.TOPIC, "payments"))
    assert allow("User:carol", "1.2.3.4", AclOperation.DESCRIBE_CONFIGS, Resource(ResourceType.TOPIC, "x"))
    assert allow("User:carol", "192.168.1.5", AclOperation.DESCRIBE, Resource(ResourceType.GROUP, "grp.\u00fc-1"))
    assert not allow("User:carol", "192.168.1.6", AclOperation.READ, Resource(ResourceType.GROUP, "grp.\u00fc-1"))
    assert allow("User:dave", "1.2.3.4", AclOperation.WRITE, Resource(ResourceType.TRANSACTIONAL_ID, "tx-42"))
    assert allow("User:CN=x,O=y", "1.2.3.4", AclOperation.CLUSTER_ACTION, Resource(ResourceType.CLUSTER,
                                                                                  "kafka-cluster"))
    assert not allow("User:bob", "10.0.0.1", AclOperation.IDEMPOTENT_WRITE, Resource(ResourceType.CLUSTER,
                                                                                     "kafka-cluster"))
    assert allow("User:erin", "1.2.3.4", AclOperation.CREATE_TOKENS, Resource(ResourceType.USER, "User:frank"))


# ---------------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize("data, message", [
    (b"{not json", "is not JSON"),
    (b"\xff\xfe", "is not UTF-8"),
    (b"[1, 2]", "expected a JSON object"),
    (b'{"version":2,"acls":[]}', "unsupported version 2"),
    (b'{"version":"1","acls":[]}', "unsupported version '1'"),
    (b'{"version":true,"acls":[]}', "unsupported version True"),
    (b'{"acls":[]}', "unsupported version None"),
    (b'{"version":1,"acls":{}}', '"acls" is not a list'),
    (b'{"version":1,"acls":[1]}', r"acls\[0\] is not an object"),
    (b'{"version":1,"acls":[{"principal":"User:a","permissionType":"Allow","operation":"Read"}]}',
     r"acls\[0\].host is missing"),
    (b'{"version":1,"acls":[{"principal":7,"permissionType":"Allow","operation":"Read","host":"*"}]}',
     r"acls\[0\].principal is not a string"),
    (b'{"version":1,"acls":[{"principal":"alice","permissionType":"Allow","operation":"Read","host":"*"}]}',
     "expected a string in format principalType:principalName but got alice"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply|not JSON"),
    (b'{"version":1' + b" " * MAX_READ_BYTES + b"}", "more than"),
    (b'{"version":1,"acls":[],"n":' + b"9" * 5000 + b"}", "not JSON"),
])
def test_bad_znode_data_is_a_clear_error(data, message):
    with pytest.raises(AclStoreError, match=message):
        decode_acls(data, where="/kafka-acl/Topic/x")


def test_unknown_names_leave_the_rest_of_the_set():
    data = json.dumps({"version": 1, "acls": [
        {"principal": "User:a", "permissionType": "Allow", "operation": "Fly", "host": "*"},
        {"principal": "User:a", "permissionType": "Maybe", "operation": "Read", "host": "*"},
        {"principal": "User:a", "permissionType": "Deny", "operation": "Any", "host": "*"},
        {"principal": "User:b", "permissionType": "DENY", "operation": "WRITE", "host": "*"},
        {"principal": "User:c", "permissionType": "allow", "operation": "idempotentwrite", "host": "h", "x": 1},
    ]}).encode()
    decoded = decode_acls(data)
    assert decoded.entries == {
        AccessControlEntry("User:b", "*", AclOperation.WRITE, AclPermissionType.DENY),
        AccessControlEntry("User:c", "h", AclOperation.IDEMPOTENT_WRITE, AclPermissionType.ALLOW)}
    assert decoded.skipped == ("acls[0]: unknown operation 'Fly'", "acls[1]: unknown permission type 'Maybe'",
                               "acls[2]: unknown operation 'Any'")
    assert decode_acls(b"").entries == frozenset() and decode_acls(None).entries == frozenset()


# ZooKeeper refuses control characters, U+D800-U+F8FF (Java's surrogates: every code point above U+FFFF)
# and U+FFF0-U+FFFF in a path.
@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "nul\x00", "tab\tx", "\x7f", "ok\ue000", "\U0001f600",
                                  "\ufff0"])
def test_names_zookeeper_cannot_hold(name):
    with pytest.raises(AclStoreError):
        acl_path(ResourcePattern(ResourceType.TOPIC, name, LIT))


def test_storable_names_and_sizes():
    for name in ("x" * 5000, " sp ", "grp.\u00fc-1", "*", "User:frank", "\u4e1c"):
        acl_path(ResourcePattern(ResourceType.TOPIC, name, LIT))
    entries = [AccessControlEntry(f"User:u{i}", "*", AclOperation.READ, AclPermissionType.ALLOW) for i in range(20_000)]
    with pytest.raises(AclStoreError, match=f"more than the {MAX_ZNODE_BYTES}"):
        check_storable(ResourcePattern(ResourceType.TOPIC, "big", LIT), entries)
    with pytest.raises(AclStoreError, match="UNKNOWN"):
        encode_acls([AccessControlEntry("User:a", "*", AclOperation.UNKNOWN, AclPermissionType.ALLOW)])
    with pytest.raises(AclStoreError, match="not an ACL znode path"):
        pattern_from_path("/kafka-acl/Bogus/x")
    with pytest.raises(AclStoreError, match="not an ACL znode path"):
        pattern_from_path("/brokers/ids/1")


@pytest.mark.parametrize("root, data, message", [
    (LITERAL_CHANGES_ROOT, b"garbage", "expected a string in format ResourceType:ResourceName but got garbage"),
    (LITERAL_CHANGES_ROOT, b"BOGUS:x", "names resource type 'BOGUS'"),
    (LITERAL_CHANGES_ROOT, b"ANY:x", "names resource type 'ANY'"),
    (LITERAL_CHANGES_ROOT, None, "empty ACL change notification"),
    (LITERAL_CHANGES_ROOT, b"TOPIC:" + b"x" * MAX_READ_BYTES, "more than"),
    (EXTENDED_CHANGES_ROOT, b"{", "not JSON"),
    (EXTENDED_CHANGES_ROOT, b'{"version":2,"resourceType":"TOPIC","name":"x","patternType":"PREFIXED"}',
     "Acl change event received for unsupported version: 2"),
    (EXTENDED_CHANGES_ROOT, b'{"version":1,"resourceType":"TOPIC","name":"x"}', "Failed to parse ACL change event"),
    (EXTENDED_CHANGES_ROOT, b'{"version":1,"resourceType":"TOPIC","name":"x","patternType":"prefixed"}',
     "Failed to convert ACL change event to resource"),
    (EXTENDED_CHANGES_ROOT, b'{"version":1,"resourceType":"TOPIC","name":"x","patternType":"MATCH"}',
     "Failed to convert ACL change event to resource"),
    (EXTENDED_CHANGES_ROOT, b'{"version":1,"resourceType":5,"name":"x","patternType":"PREFIXED"}',
     "a field is not a string"),
    ("/elsewhere", b"TOPIC:x", "not an ACL change root"),
])
def test_bad_change_notifications_are_clear_errors(root, data, message):
    with pytest.raises(AclStoreError, match=message):
        decode_change(root, data)


def test_bad_sequence_node_names():
    """Nodes that are not notifications have no sequence number: the listener leaves them alone."""
    for child in ("acl_changes_", "acl_changes_x1", "other_0001", "acl_changes_\u0661"):
        assert ACL_CHANGES.sequence(child) is None


# ---------------------------------------------------------------------------------------------------
# Whatever is in a znode: a result or AclStoreError, nothing else

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda children: st.lists(children, max_size=4) | st.dictionaries(
                         st.sampled_from(["version", "acls", "principal", "permissionType", "operation", "host",
                                          "resourceType", "name", "patternType", "x"]), children, max_size=6),
                     max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=64), _json.map(lambda v: json.dumps(v).encode())))
def test_any_znode_data_decodes_or_is_refused(data):
    for decode in (lambda: decode_acls(data), lambda: decode_change(LITERAL_CHANGES_ROOT, data),
                   lambda: decode_change(EXTENDED_CHANGES_ROOT, data)):
        try:
            decode()
        except AclStoreError:
            pass

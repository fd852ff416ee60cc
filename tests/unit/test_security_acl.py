"""Kafka's ACL model: codes and names, patterns and filters with Kafka's matching rules, and how the fields
of CreateAcls / DescribeAcls / DeleteAcls requests become bindings and filters (or are refused)."""

from __future__ import annotations

import pytest

from pykbroker.protocol.errors import ErrorCode, KafkaError
from pykbroker.security.acl import (
    CLUSTER, AccessControlEntry, AccessControlEntryFilter, AclBinding, AclBindingFilter, AclCreation, AclOperation,
    AclPermissionType, MalformedAclRequest, PatternType, ResourcePattern, ResourcePatternFilter, ResourceType,
    creation_bindings, delete_filters, describe_filter,
)

T, G = ResourceType.TOPIC, ResourceType.GROUP
LIT, PRE, ANY, MATCH = PatternType.LITERAL, PatternType.PREFIXED, PatternType.ANY, PatternType.MATCH


def test_codes_are_kafkas():
    assert [(t.name, int(t)) for t in ResourceType] == [
        ("UNKNOWN", 0), ("ANY", 1), ("TOPIC", 2), ("GROUP", 3), ("CLUSTER", 4), ("TRANSACTIONAL_ID", 5),
        ("DELEGATION_TOKEN", 6), ("USER", 7)]
    assert [(p.name, int(p)) for p in PatternType] == [
        ("UNKNOWN", 0), ("ANY", 1), ("MATCH", 2), ("LITERAL", 3), ("PREFIXED", 4)]
    assert [int(o) for o in AclOperation] == list(range(15))
    assert (AclOperation.READ, AclOperation.IDEMPOTENT_WRITE, AclOperation.DESCRIBE_TOKENS) == (3, 12, 14)
    assert [(p.name, int(p)) for p in AclPermissionType] == [("UNKNOWN", 0), ("ANY", 1), ("DENY", 2), ("ALLOW", 3)]
    assert ResourceType.from_code(99) == ResourceType.UNKNOWN
    assert AclOperation.from_code(-1) == AclOperation.UNKNOWN
    assert CLUSTER.name == "kafka-cluster"


def test_names_as_kafka_reads_and_writes_them():
    assert AclOperation.IDEMPOTENT_WRITE.pascal_name == "IdempotentWrite"
    assert ResourceType.TRANSACTIONAL_ID.pascal_name == "TransactionalId"
    assert AclPermissionType.ALLOW.pascal_name == "Allow"
    # SecurityUtils: Pascal case, its upper case, or any case of a one-word name - not the enum name
    assert AclOperation.from_name("IdempotentWrite") == AclOperation.IDEMPOTENT_WRITE
    assert AclOperation.from_name("IDEMPOTENTWRITE") == AclOperation.IDEMPOTENT_WRITE
    assert AclOperation.from_name("read") == AclOperation.READ
    assert AclOperation.from_name("IDEMPOTENT_WRITE") == AclOperation.UNKNOWN
    assert AclOperation.from_name("Fly") == AclOperation.UNKNOWN
    # fromString: the enum name in any case
    assert ResourceType.from_string("transactional_id") == ResourceType.TRANSACTIONAL_ID
    assert ResourceType.from_string("TransactionalId") == ResourceType.UNKNOWN
    # PatternType.fromString is exact
    assert PatternType.from_string("PREFIXED") == PRE
    assert PatternType.from_string("prefixed") == PatternType.UNKNOWN


def test_pattern_refuses_filter_values_with_kafkas_messages():
    with pytest.raises(ValueError, match="^resourceType must not be ANY$"):
        ResourcePattern(ResourceType.ANY, "x", LIT)
    for pattern_type in (MATCH, ANY):
        with pytest.raises(ValueError, match=f"^patternType must not be {pattern_type.name}$"):
            ResourcePattern(T, "x", pattern_type)
    with pytest.raises(ValueError, match="name must be a string"):
        ResourcePattern(T, None, LIT)
    with pytest.raises(ValueError, match="^operation must not be ANY$"):
        AccessControlEntry("User:a", "*", AclOperation.ANY, AclPermissionType.ALLOW)
    with pytest.raises(ValueError, match="^permissionType must not be ANY$"):
        AccessControlEntry("User:a", "*", AclOperation.READ, AclPermissionType.ANY)
    assert ResourcePattern(ResourceType.UNKNOWN, "x", LIT).is_unknown
    assert AccessControlEntry("User:a", "*", AclOperation.UNKNOWN, AclPermissionType.ALLOW).is_unknown


def test_strings_are_the_ones_kafka_tools_print():
    assert str(ResourcePattern(ResourceType.CLUSTER, "kafka-cluster", LIT)) == \
        "ResourcePattern(resourceType=CLUSTER, name=kafka-cluster, patternType=LITERAL)"
    assert str(AccessControlEntry("User:bob", "10.0.0.1", AclOperation.IDEMPOTENT_WRITE, AclPermissionType.DENY)) == \
        "(principal=User:bob, host=10.0.0.1, operation=IDEMPOTENT_WRITE, permissionType=DENY)"
    assert str(AccessControlEntryFilter.ANY) == "(principal=<any>, host=<any>, operation=ANY, permissionType=ANY)"


@pytest.mark.parametrize("filter_, pattern, expected", [
    # resource type
    ((ResourceType.ANY, "Name", LIT), (T, "Name", LIT), True),
    ((G, "Name", LIT), (T, "Name", LIT), False),
    # LITERAL / PREFIXED filters: the same pattern type and exactly the name
    ((T, "Name", LIT), (T, "Name", LIT), True),
    ((T, "Name", LIT), (T, "*", LIT), False),
    ((T, "Name", LIT), (T, "Name", PRE), False),
    ((T, "Name", PRE), (T, "Name", PRE), True),
    ((T, "Name", PRE), (T, "Na", PRE), False),
    ((T, "Name", PRE), (T, "Name", LIT), False),
    # ANY: any pattern type, exactly the name (no wildcard, no prefix)
    ((T, "Name", ANY), (T, "Name", LIT), True),
    ((T, "Name", ANY), (T, "Name", PRE), True),
    ((T, "Name", ANY), (T, "*", LIT), False),
    ((T, "Name", ANY), (T, "Na", PRE), False),
    ((T, None, ANY), (T, "whatever", PRE), True),
    # MATCH: every pattern that applies to a resource of that name
    ((T, "Name", MATCH), (T, "Name", LIT), True),
    ((T, "Name", MATCH), (T, "*", LIT), True),
    ((T, "Name", MATCH), (T, "Na", PRE), True),
    ((T, "Name", MATCH), (T, "Name", PRE), True),
    ((T, "Name", MATCH), (T, "Names", PRE), False),
    ((T, "Name", MATCH), (T, "Other", LIT), False),
    ((T, "Name", MATCH), (T, "*", PRE), False),   # PREFIXED "*" is an ordinary prefix
    ((T, "*", MATCH), (T, "*", LIT), True),
    ((T, "*", MATCH), (T, "Name", LIT), False),
    ((T, None, MATCH), (T, "Name", PRE), True),
    ((T, "Name", PatternType.UNKNOWN), (T, "Name", LIT), False),
])
def test_pattern_filter_matches_as_kafka(filter_, pattern, expected):
    assert ResourcePatternFilter(*filter_).matches(ResourcePattern(*pattern)) is expected


def test_indefinite_fields_as_kafka():
    assert ResourcePatternFilter.ANY.find_indefinite_field() == "Resource type is ANY."
    assert ResourcePatternFilter(ResourceType.UNKNOWN, "x", LIT).find_indefinite_field() == "Resource type is UNKNOWN."
    assert ResourcePatternFilter(T, None, LIT).find_indefinite_field() == "Resource name is NULL."
    assert ResourcePatternFilter(T, "x", MATCH).find_indefinite_field() == "Resource pattern type is MATCH."
    assert ResourcePatternFilter(T, "x", PatternType.UNKNOWN).find_indefinite_field() == \
        "Resource pattern type is UNKNOWN."
    assert ResourcePatternFilter(T, "x", ANY).find_indefinite_field() is None  # ANY with a name: at most two
    entry = AccessControlEntryFilter
    assert entry(None, "*", AclOperation.READ, AclPermissionType.ALLOW).find_indefinite_field() == "Principal is NULL"
    assert entry("User:a", None, AclOperation.READ, AclPermissionType.ALLOW).find_indefinite_field() == "Host is NULL"
    assert entry("User:a", "*", AclOperation.ANY, AclPermissionType.ALLOW).find_indefinite_field() == "Operation is ANY"
    assert entry("User:a", "*", AclOperation.UNKNOWN, AclPermissionType.ALLOW).find_indefinite_field() == \
        "Operation is UNKNOWN"
    assert entry("User:a", "*", AclOperation.READ, AclPermissionType.ANY).find_indefinite_field() == \
        "Permission type is ANY"
    assert entry("User:a", "*", AclOperation.READ, AclPermissionType.UNKNOWN).find_indefinite_field() == \
        "Permission type is UNKNOWN"
    binding = AclBinding(ResourcePattern(T, "x", LIT),
                         AccessControlEntry("User:a", "*", AclOperation.READ, AclPermissionType.ALLOW))
    assert binding.to_filter().matches_at_most_one()
    assert AclBindingFilter.ANY.find_indefinite_field() == "Resource type is ANY."


def test_entry_and_binding_filters():
    entry = AccessControlEntry("User:alice", "10.0.0.1", AclOperation.READ, AclPermissionType.ALLOW)
    binding = AclBinding(ResourcePattern(T, "orders", LIT), entry)
    assert AclBindingFilter.ANY.matches(binding)
    assert binding.to_filter().matches(binding)
    f = AccessControlEntryFilter
    assert f("User:alice", None, AclOperation.ANY, AclPermissionType.ANY).matches(entry)
    assert not f("User:bob", None, AclOperation.ANY, AclPermissionType.ANY).matches(entry)
    assert not f(None, "*", AclOperation.ANY, AclPermissionType.ANY).matches(entry)  # "*" is a host, not "any"
    assert not f(None, None, AclOperation.WRITE, AclPermissionType.ANY).matches(entry)
    assert not f(None, None, AclOperation.ALL, AclPermissionType.ANY).matches(entry)  # ALL is an operation
    assert not f(None, None, AclOperation.ANY, AclPermissionType.DENY).matches(entry)
    assert not AclBindingFilter(ResourcePatternFilter(G, None, ANY), AccessControlEntryFilter.ANY).matches(binding)


def creation(rt=2, name="t1", pt=3, principal="User:alice", host="*", op=3, perm=3):
    return AclCreation(rt, name, pt, principal, host, op, perm)


# What Kafka 3.7.1 (ZooKeeper mode, AclAuthorizer) answered to CreateAcls v3 with one creation each: the
# connection closed ("close"), or (error code, message). Cases that reach the authorizer are in
# test_security_authorizer.py; these are the ones the request and AclApis decide.
@pytest.mark.parametrize("fields, expected", [
    (dict(rt=0), "close"), (dict(pt=0), "close"), (dict(op=0), "close"), (dict(perm=0), "close"),
    (dict(rt=1), (-1, None)), (dict(pt=2), (-1, None)), (dict(pt=1), (-1, None)), (dict(op=1), (-1, None)),
    (dict(perm=1), (-1, None)),
    (dict(rt=4, name="foo"), (42, "The only valid name for the CLUSTER resource is kafka-cluster")),
    (dict(rt=4, name=""), (42, "The only valid name for the CLUSTER resource is kafka-cluster")),
    (dict(name=""), (42, "Invalid empty resource name")),
])
def test_creation_refusals_as_kafka(fields, expected):
    if expected == "close":
        with pytest.raises(MalformedAclRequest, match="CreatableAcls contain UNKNOWN elements"):
            creation_bindings([creation(**fields)], 3)
        return
    [result] = creation_bindings([creation(**fields)], 3)
    assert isinstance(result, KafkaError)
    assert (int(result.code), result.message) == expected


def test_a_filter_value_in_one_creation_fails_the_whole_request():
    """Kafka 3.7.1 answered [valid, resource type ANY] with UNKNOWN_SERVER_ERROR twice and created nothing."""
    results = creation_bindings([creation(name="m1"), creation(rt=1, name="m2")], 3)
    assert [(r.code, r.message) for r in results] == [(ErrorCode.unknown_server_error, None)] * 2


def test_valid_creations_become_bindings_in_order():
    results = creation_bindings([creation(name="a"), creation(rt=4, name="nope"),
                                 creation(rt=4, name="kafka-cluster", pt=4, op=12, perm=2, host="10.0.0.1")], 3)
    assert results[0] == AclBinding(ResourcePattern(T, "a", LIT), AccessControlEntry(
        "User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW))
    assert results[1].code == ErrorCode.invalid_request
    assert results[2] == AclBinding(ResourcePattern(ResourceType.CLUSTER, "kafka-cluster", PRE), AccessControlEntry(
        "User:alice", "10.0.0.1", AclOperation.IDEMPOTENT_WRITE, AclPermissionType.DENY))
    # codes Kafka does not know pass the request checks as UNKNOWN parts (the authorizer refuses them)
    [unknown] = creation_bindings([creation(op=99)], 3)
    assert unknown.entry.operation == AclOperation.UNKNOWN and unknown.is_unknown


def test_version_0_creations_are_literal_only():
    with pytest.raises(MalformedAclRequest, match="Version 0 only supports literal resource pattern types"):
        creation_bindings([creation(name="a"), creation(pt=4)], 0)
    assert isinstance(creation_bindings([creation()], 0)[0], AclBinding)


class F:
    def __init__(self, rt=2, name=None, pt=1, principal=None, host=None, op=1, perm=1):
        self.resource_type_filter, self.resource_name_filter, self.pattern_type_filter = rt, name, pt
        self.principal_filter, self.host_filter, self.operation, self.permission_type = principal, host, op, perm


def test_describe_and_delete_filters():
    assert describe_filter(F(), 3) == AclBindingFilter(
        ResourcePatternFilter(T, None, ANY), AccessControlEntryFilter(None, None, AclOperation.ANY,
                                                                      AclPermissionType.ANY))
    # v0 knew only literal patterns: ANY means LITERAL there, anything else cannot be asked
    assert describe_filter(F(pt=1), 0).pattern_filter.pattern_type == LIT
    with pytest.raises(MalformedAclRequest, match="Version 0 only supports literal resource pattern types"):
        describe_filter(F(pt=2), 0)
    with pytest.raises(MalformedAclRequest, match="Version 0 does not support pattern type PREFIXED"):
        delete_filters([F(pt=3), F(pt=4)], 0)
    for bad in (dict(rt=0), dict(pt=0), dict(op=0), dict(perm=0)):
        with pytest.raises(MalformedAclRequest, match="UNKNOWN"):
            describe_filter(F(**bad), 3)
        with pytest.raises(MalformedAclRequest, match="UNKNOWN"):
            delete_filters([F(), F(**bad)], 3)
    # an unknown code (not 0) is an UNKNOWN filter, which matches nothing
    weird = describe_filter(F(rt=99, name="x", pt=3), 3)
    assert weird.is_unknown
    assert not weird.matches(AclBinding(ResourcePattern(T, "x", LIT), AccessControlEntry(
        "User:a", "*", AclOperation.READ, AclPermissionType.ALLOW)))
    assert [f.pattern_filter.name for f in delete_filters([F(name="a"), F(name="b", pt=2)], 3)] == ["a", "b"]


def test_kio_request_entities_fit():
    """The handlers will pass kio's decoded request entities straight in."""
    from kio.schema.create_acls.v3.request import AclCreation as KioCreation
    from kio.schema.delete_acls.v3.request import DeleteAclsFilter
    from kio.schema.describe_acls.v3.request import DescribeAclsRequest
    from kio.static.primitive import i8

    [binding] = creation_bindings([KioCreation(
        resource_type=i8(2), resource_name="orders", resource_pattern_type=i8(4), principal="User:alice", host="*",
        operation=i8(4), permission_type=i8(3))], 3)
    assert binding == AclBinding(ResourcePattern(T, "orders", PRE), AccessControlEntry(
        "User:alice", "*", AclOperation.WRITE, AclPermissionType.ALLOW))
    request = DescribeAclsRequest(resource_type_filter=i8(1), resource_name_filter=None, pattern_type_filter=i8(2),
                                  principal_filter="User:alice", host_filter=None, operation=i8(1),
                                  permission_type=i8(3))
    assert describe_filter(request, 3).matches(binding)
    [delete] = delete_filters([DeleteAclsFilter(resource_type_filter=i8(2), resource_name_filter="orders",
                                                pattern_type_filter=i8(3), principal_filter=None, host_filter=None,
                                                operation=i8(1), permission_type=i8(1))], 3)
    assert not delete.matches(binding)  # LITERAL filter, PREFIXED binding

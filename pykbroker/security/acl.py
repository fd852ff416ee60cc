"""Kafka's ACL model: resource types, pattern types, operations and permission types with their wire codes,
resource patterns, access control entries, ACL bindings and the filters DescribeAcls / DeleteAcls send.

The rules are those of Kafka 3.7's ``org.apache.kafka.common.acl`` and ``org.apache.kafka.common.resource``
packages, and of what a ZooKeeper-mode broker (``AclApis`` + ``AclAuthorizer``) refuses in CreateAcls:

* Enums carry Kafka's codes. ``from_code`` maps a code Kafka does not know to ``UNKNOWN`` (as
  ``fromCode`` does), ``from_string`` is Kafka's ``fromString`` (the enum name, any case; for
  ``PatternType`` the exact name), ``from_name`` is ``SecurityUtils``' lookup of the names ZooKeeper and the
  tools use ("Topic", "IdempotentWrite", "Allow"; also "TOPIC", "IDEMPOTENTWRITE", "read" - but not
  "IDEMPOTENT_WRITE"), and ``pascal_name`` is the name Kafka writes ("TransactionalId").
* :class:`ResourcePattern` is a resource with a LITERAL or PREFIXED pattern (never ANY / MATCH, and never of
  resource type ANY); :class:`Resource` is the concrete resource a request touches (always literal).
* Filters hold ``None`` for "any" names, principals and hosts. ``matches`` follows Kafka exactly: a MATCH
  filter with a name matches the literal pattern of that name, the wildcard literal ``*`` and every PREFIXED
  pattern that is a prefix of the name; ANY matches every pattern type but only the exact name.
  ``find_indefinite_field`` gives Kafka's description of the first ANY / UNKNOWN / null field.

Turning CreateAcls / DescribeAcls / DeleteAcls request fields into this model is here too, at the three
levels at which Kafka 3.7 (ZooKeeper mode) refuses bad input - checked against the real broker:

1. :func:`creation_bindings` / :func:`describe_filter` / :func:`delete_filters` raise
   :class:`MalformedAclRequest` where Kafka cannot even parse the request (a field with the code of UNKNOWN,
   0; a non-literal pattern type in version 0): Kafka closes the connection.
2. :func:`creation_bindings` answers every creation of the request with UNKNOWN_SERVER_ERROR (no message,
   nothing created) when one creation names resource type ANY, pattern type ANY or MATCH, operation ANY or
   permission type ANY: Kafka's binding constructors throw while the handler reads the request.
3. Per creation, :func:`creation_bindings` gives INVALID_REQUEST "The only valid name for the CLUSTER
   resource is kafka-cluster" and "Invalid empty resource name" (``AclApis``); the authorizer then refuses
   unknown codes and names containing "/" with INVALID_REQUEST "Failed to create ACL", and a principal
   that is not ``Type:name`` with UNKNOWN_SERVER_ERROR (``AclAuthorizer.createAcls``, see
   :meth:`pykbroker.security.authorizer.AclAuthorizer.plan_create`).

Kafka accepts, and so does this module: principal "User:" (empty name), ":alice" (empty type),
"Group:x", host "" or any string (hosts are compared as strings, never resolved), PREFIXED "*" (an
ordinary prefix, not a wildcard), a PREFIXED cluster resource, operations a resource type does not support
(kafka-acls.sh refuses those on the client side only), names with spaces.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Iterable, NamedTuple

from pykbroker.protocol.errors import ErrorCode, KafkaError

__all__ = (
    "ResourceType", "PatternType", "AclOperation", "AclPermissionType", "Resource", "ResourcePattern",
    "ResourcePatternFilter", "AccessControlEntry", "AccessControlEntryFilter", "AclBinding",
    "AclBindingFilter", "AclCreation", "MalformedAclRequest", "CLUSTER_NAME", "CLUSTER", "WILDCARD_RESOURCE",
    "WILDCARD_HOST", "WILDCARD_PRINCIPAL", "SUPPORTED_OPERATIONS", "AUTHORIZATION_ERRORS", "creation_bindings",
    "describe_filter", "delete_filters", "to_pascal_case",
)

CLUSTER_NAME = "kafka-cluster"
WILDCARD_RESOURCE = "*"
WILDCARD_HOST = "*"
WILDCARD_PRINCIPAL = "User:*"


def to_pascal_case(name: str) -> str:
    """Kafka's SecurityUtils.toPascalCase: "TRANSACTIONAL_ID" -> "TransactionalId"."""
    return "".join(part[:1].upper() + part[1:].lower() for part in name.split("_"))


class _KafkaEnum(IntEnum):
    """An enum with Kafka's code, Kafka's string parsers and the Pascal-case name Kafka writes."""

    @classmethod
    def from_code(cls, code: int):
        """Kafka's fromCode: a code it does not know is UNKNOWN."""
        try:
            return cls(code)
        except ValueError:
            return cls.UNKNOWN  # type: ignore[attr-defined]

    @classmethod
    def from_string(cls, text: str):
        """Kafka's fromString: the enum name in any case ("topic", "TRANSACTIONAL_ID"), else UNKNOWN."""
        return cls.__members__.get(str(text).upper(), cls.UNKNOWN)  # type: ignore[attr-defined]

    @classmethod
    def from_name(cls, text: str):
        """SecurityUtils.resourceType/operation/permissionType: the Pascal-case name ("IdempotentWrite") or
        its upper case ("IDEMPOTENTWRITE"), also looked up after upper-casing the input; else UNKNOWN."""
        names = _PASCAL_LOOKUP[cls]
        found = names.get(text)
        if found is None:
            found = names.get(str(text).upper())
        return cls.UNKNOWN if found is None else found  # type: ignore[attr-defined]

    @property
    def pascal_name(self) -> str:
        """The name Kafka writes in ZooKeeper and audit lines: "Topic", "IdempotentWrite", "Allow"."""
        return to_pascal_case(self.name)

    @property
    def is_unknown(self) -> bool:
        return self.name == "UNKNOWN"

    def __str__(self) -> str:  # Kafka prints enum names: "TOPIC", "READ"
        return self.name


class ResourceType(_KafkaEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(_KafkaEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4

    @classmethod
    def from_string(cls, text: str) -> "PatternType":
        """PatternType.fromString is the exact enum name ("PREFIXED"; "prefixed" is UNKNOWN)."""
        return cls.__members__.get(text, cls.UNKNOWN)

    @property
    def is_specific(self) -> bool:
        """LITERAL or PREFIXED: a pattern an ACL can be stored under."""
        return self in (PatternType.LITERAL, PatternType.PREFIXED)


class AclOperation(_KafkaEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(_KafkaEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


_PASCAL_LOOKUP: dict[type, dict[str, Any]] = {}
for _enum in (ResourceType, PatternType, AclOperation, AclPermissionType):
    _names: dict[str, Any] = {}
    for _member in _enum:
        _names[_member.pascal_name] = _member
        _names[_member.pascal_name.upper()] = _member
    _PASCAL_LOOKUP[_enum] = _names
del _enum, _names, _member

_O = AclOperation
# AclEntry.supportedOperations: what each resource type's ACLs can grant (authorized-operations bit fields).
SUPPORTED_OPERATIONS: dict[ResourceType, frozenset[AclOperation]] = {
    ResourceType.TOPIC: frozenset({_O.READ, _O.WRITE, _O.CREATE, _O.DESCRIBE, _O.DELETE, _O.ALTER,
                                   _O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS}),
    ResourceType.GROUP: frozenset({_O.READ, _O.DESCRIBE, _O.DELETE}),
    ResourceType.CLUSTER: frozenset({_O.CREATE, _O.CLUSTER_ACTION, _O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS,
                                     _O.IDEMPOTENT_WRITE, _O.ALTER, _O.DESCRIBE}),
    ResourceType.TRANSACTIONAL_ID: frozenset({_O.DESCRIBE, _O.WRITE}),
    ResourceType.DELEGATION_TOKEN: frozenset({_O.DESCRIBE}),
    ResourceType.USER: frozenset({_O.CREATE_TOKENS, _O.DESCRIBE_TOKENS}),
}
del _O

# AclEntry.authorizationError: the error a denied request gets, per resource type.
AUTHORIZATION_ERRORS: dict[ResourceType, ErrorCode] = {
    ResourceType.TOPIC: ErrorCode.topic_authorization_failed,
    ResourceType.GROUP: ErrorCode.group_authorization_failed,
    ResourceType.CLUSTER: ErrorCode.cluster_authorization_failed,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.transactional_id_authorization_failed,
    ResourceType.DELEGATION_TOKEN: ErrorCode.delegation_token_authorization_failed,
}


def _require_str(value: Any, what: str) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, not {type(value).__name__}")


def _require_optional_str(value: Any, what: str) -> None:
    if value is not None:
        _require_str(value, what)


# ---------------------------------------------------------------------------------------------------
# Resources and patterns


class Resource(NamedTuple):
    """A concrete resource a request acts on (Kafka's Resource): what the authorizer is asked about."""

    resource_type: ResourceType
    name: str

    def __str__(self) -> str:
        return f"(resourceType={self.resource_type.name}, name={self.name})"


CLUSTER = Resource(ResourceType.CLUSTER, CLUSTER_NAME)


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    """A resource pattern an ACL is bound to: LITERAL (``*`` is the wildcard) or PREFIXED."""

    resource_type: ResourceType
    name: str
    pattern_type: PatternType = PatternType.LITERAL

    def __post_init__(self) -> None:
        _require_str(self.name, "name")
        object.__setattr__(self, "resource_type", ResourceType(self.resource_type))
        object.__setattr__(self, "pattern_type", PatternType(self.pattern_type))
        if self.resource_type == ResourceType.ANY:
            raise ValueError("resourceType must not be ANY")
        if self.pattern_type in (PatternType.MATCH, PatternType.ANY):
            raise ValueError(f"patternType must not be {self.pattern_type.name}")

    @property
    def is_unknown(self) -> bool:
        return self.resource_type.is_unknown or self.pattern_type.is_unknown

    def to_filter(self) -> "ResourcePatternFilter":
        return ResourcePatternFilter(self.resource_type, self.name, self.pattern_type)

    def __str__(self) -> str:
        return (f"ResourcePattern(resourceType={self.resource_type.name}, name={self.name}, "
                f"patternType={self.pattern_type.name})")


@dataclass(frozen=True, slots=True)
class ResourcePatternFilter:
    """A filter on resource patterns: ``name`` None matches any name; pattern type ANY or MATCH."""

    resource_type: ResourceType
    name: str | None
    pattern_type: PatternType

    def __post_init__(self) -> None:
        _require_optional_str(self.name, "name")
        object.__setattr__(self, "resource_type", ResourceType(self.resource_type))
        object.__setattr__(self, "pattern_type", PatternType(self.pattern_type))

    @property
    def is_unknown(self) -> bool:
        return self.resource_type.is_unknown or self.pattern_type.is_unknown

    def matches(self, pattern: ResourcePattern) -> bool:
        if self.resource_type != ResourceType.ANY and self.resource_type != pattern.resource_type:
            return False
        if (self.pattern_type not in (PatternType.ANY, PatternType.MATCH)
                and self.pattern_type != pattern.pattern_type):
            return False
        if self.name is None:
            return True
        if self.pattern_type == PatternType.ANY or self.pattern_type == pattern.pattern_type:
            return self.name == pattern.name
        # MATCH: the patterns that would apply to a resource of this name.
        if pattern.pattern_type == PatternType.LITERAL:
            return self.name == pattern.name or pattern.name == WILDCARD_RESOURCE
        if pattern.pattern_type == PatternType.PREFIXED:
            return self.name.startswith(pattern.name)
        raise ValueError(f"Unsupported PatternType: {pattern.pattern_type.name}")

    def matches_at_most_one(self) -> bool:
        return self.find_indefinite_field() is None

    def find_indefinite_field(self) -> str | None:
        if self.resource_type == ResourceType.ANY:
            return "Resource type is ANY."
        if self.resource_type == ResourceType.UNKNOWN:
            return "Resource type is UNKNOWN."
        if self.name is None:
            return "Resource name is NULL."
        if self.pattern_type == PatternType.MATCH:
            return "Resource pattern type is MATCH."
        if self.pattern_type == PatternType.UNKNOWN:
            return "Resource pattern type is UNKNOWN."
        return None

    def __str__(self) -> str:
        name = "<any>" if self.name is None else self.name
        return (f"ResourcePattern(resourceType={self.resource_type.name}, name={name}, "
                f"patternType={self.pattern_type.name})")


ResourcePatternFilter.ANY = ResourcePatternFilter(ResourceType.ANY, None, PatternType.ANY)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------------
# Access control entries


def _entry_indefinite_field(principal, host, operation, permission_type) -> str | None:
    if principal is None:
        return "Principal is NULL"
    if host is None:
        return "Host is NULL"
    if operation == AclOperation.ANY:
        return "Operation is ANY"
    if operation == AclOperation.UNKNOWN:
        return "Operation is UNKNOWN"
    if permission_type == AclPermissionType.ANY:
        return "Permission type is ANY"
    if permission_type == AclPermissionType.UNKNOWN:
        return "Permission type is UNKNOWN"
    return None


def _entry_str(principal, host, operation, permission_type) -> str:
    return (f"(principal={'<any>' if principal is None else principal}, "
            f"host={'<any>' if host is None else host}, operation={operation.name}, "
            f"permissionType={permission_type.name})")


@dataclass(frozen=True, slots=True)
class AccessControlEntry:
    """Principal ("User:alice", kept as the string it was given), host ("*" for any), operation and
    permission. Operation and permission type are never ANY; UNKNOWN is representable, as in Kafka."""

    principal: str
    host: str
    operation: AclOperation
    permission_type: AclPermissionType

    def __post_init__(self) -> None:
        _require_str(self.principal, "principal")
        _require_str(self.host, "host")
        object.__setattr__(self, "operation", AclOperation(self.operation))
        object.__setattr__(self, "permission_type", AclPermissionType(self.permission_type))
        if self.operation == AclOperation.ANY:
            raise ValueError("operation must not be ANY")
        if self.permission_type == AclPermissionType.ANY:
            raise ValueError("permissionType must not be ANY")

    @property
    def is_unknown(self) -> bool:
        return self.operation.is_unknown or self.permission_type.is_unknown

    def find_indefinite_field(self) -> str | None:
        return _entry_indefinite_field(self.principal, self.host, self.operation, self.permission_type)

    def to_filter(self) -> "AccessControlEntryFilter":
        return AccessControlEntryFilter(self.principal, self.host, self.operation, self.permission_type)

    def __str__(self) -> str:
        return _entry_str(self.principal, self.host, self.operation, self.permission_type)


@dataclass(frozen=True, slots=True)
class AccessControlEntryFilter:
    """A filter on entries: None principal / host match any; operation / permission ANY match any."""

    principal: str | None
    host: str | None
    operation: AclOperation
    permission_type: AclPermissionType

    def __post_init__(self) -> None:
        _require_optional_str(self.principal, "principal")
        _require_optional_str(self.host, "host")
        object.__setattr__(self, "operation", AclOperation(self.operation))
        object.__setattr__(self, "permission_type", AclPermissionType(self.permission_type))

    @property
    def is_unknown(self) -> bool:
        return self.operation.is_unknown or self.permission_type.is_unknown

    def matches(self, entry: AccessControlEntry) -> bool:
        if self.principal is not None and self.principal != entry.principal:
            return False
        if self.host is not None and self.host != entry.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != entry.operation:
            return False
        return self.permission_type == AclPermissionType.ANY or self.permission_type == entry.permission_type

    def matches_at_most_one(self) -> bool:
        return self.find_indefinite_field() is None

    def find_indefinite_field(self) -> str | None:
        return _entry_indefinite_field(self.principal, self.host, self.operation, self.permission_type)

    def __str__(self) -> str:
        return _entry_str(self.principal, self.host, self.operation, self.permission_type)


AccessControlEntryFilter.ANY = AccessControlEntryFilter(  # type: ignore[attr-defined]
    None, None, AclOperation.ANY, AclPermissionType.ANY)


# ---------------------------------------------------------------------------------------------------
# Bindings


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: a resource pattern and an access control entry."""

    pattern: ResourcePattern
    entry: AccessControlEntry

    @property
    def is_unknown(self) -> bool:
        return self.pattern.is_unknown or self.entry.is_unknown

    def to_filter(self) -> "AclBindingFilter":
        return AclBindingFilter(self.pattern.to_filter(), self.entry.to_filter())

    def __str__(self) -> str:
        return f"(pattern={self.pattern}, entry={self.entry})"


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """What DescribeAcls and DeleteAcls send: a pattern filter and an entry filter."""

    pattern_filter: ResourcePatternFilter
    entry_filter: AccessControlEntryFilter

    @property
    def is_unknown(self) -> bool:
        return self.pattern_filter.is_unknown or self.entry_filter.is_unknown

    def matches(self, binding: AclBinding) -> bool:
        return self.pattern_filter.matches(binding.pattern) and self.entry_filter.matches(binding.entry)

    def matches_at_most_one(self) -> bool:
        return self.pattern_filter.matches_at_most_one() and self.entry_filter.matches_at_most_one()

    def find_indefinite_field(self) -> str | None:
        return self.pattern_filter.find_indefinite_field() or self.entry_filter.find_indefinite_field()

    def __str__(self) -> str:
        return f"(patternFilter={self.pattern_filter}, entryFilter={self.entry_filter})"


AclBindingFilter.ANY = AclBindingFilter(  # type: ignore[attr-defined]
    ResourcePatternFilter.ANY, AccessControlEntryFilter.ANY)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------------
# From request fields


class MalformedAclRequest(ValueError):
    """The request cannot be parsed as Kafka parses it: Kafka closes the connection (no response)."""


class AclCreation(NamedTuple):
    """The fields of one CreateAcls creation, named as in Kafka's schema (kio's entities fit as well)."""

    resource_type: int
    resource_name: str
    resource_pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int


def _check_codes(pattern_type: int, codes: Iterable[int], what: str) -> None:
    if int(pattern_type) == PatternType.UNKNOWN or any(int(code) == 0 for code in codes):
        raise MalformedAclRequest(f"{what} contain UNKNOWN elements")


def creation_bindings(creations: Iterable[Any], version: int) -> list[AclBinding | KafkaError]:
    """A CreateAcls request's creations as bindings, or per creation the error Kafka answers with.

    Raises :class:`MalformedAclRequest` where Kafka closes the connection. A creation of resource type ANY,
    pattern type ANY / MATCH, operation ANY or permission ANY fails the whole request: every result is
    UNKNOWN_SERVER_ERROR without a message. Otherwise each creation is a binding, or INVALID_REQUEST for a
    cluster resource not named "kafka-cluster" or an empty name. A binding may still hold UNKNOWN parts (a
    code Kafka does not know) or a bad principal: the authorizer's :meth:`plan_create` refuses those.
    """
    creations = list(creations)
    for creation in creations:
        if version == 0 and int(creation.resource_pattern_type) != PatternType.LITERAL:
            raise MalformedAclRequest("Version 0 only supports literal resource pattern types")
    for creation in creations:
        _check_codes(creation.resource_pattern_type,
                     (creation.resource_type, creation.permission_type, creation.operation), "CreatableAcls")
    try:
        bindings = [AclBinding(
            ResourcePattern(ResourceType.from_code(int(c.resource_type)), c.resource_name,
                            PatternType.from_code(int(c.resource_pattern_type))),
            AccessControlEntry(c.principal, c.host, AclOperation.from_code(int(c.operation)),
                               AclPermissionType.from_code(int(c.permission_type))))
            for c in creations]
    except ValueError:
        return [KafkaError(ErrorCode.unknown_server_error) for _ in creations]
    results: list[AclBinding | KafkaError] = []
    for binding in bindings:
        pattern = binding.pattern
        if pattern.resource_type == ResourceType.CLUSTER and pattern.name != CLUSTER_NAME:
            results.append(KafkaError(ErrorCode.invalid_request,
                                      f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"))
        elif not pattern.name:
            results.append(KafkaError(ErrorCode.invalid_request, "Invalid empty resource name"))
        else:
            results.append(binding)
    return results


def _binding_filter(version: int, resource_type, name, pattern_type, principal, host, operation,
                    permission_type, what: str, v0_message: str) -> AclBindingFilter:
    pattern_type = int(pattern_type)
    if version == 0:
        # Before pattern types existed every ACL was literal: v0's ANY means LITERAL (wildcard included).
        if pattern_type == PatternType.ANY:
            pattern_type = PatternType.LITERAL
        elif pattern_type != PatternType.LITERAL:
            raise MalformedAclRequest(v0_message.format(PatternType.from_code(pattern_type).name))
    _check_codes(pattern_type, (resource_type, operation, permission_type), what)
    return AclBindingFilter(
        ResourcePatternFilter(ResourceType.from_code(int(resource_type)), name,
                              PatternType.from_code(pattern_type)),
        AccessControlEntryFilter(principal, host, AclOperation.from_code(int(operation)),
                                 AclPermissionType.from_code(int(permission_type))))


def describe_filter(request: Any, version: int) -> AclBindingFilter:
    """A DescribeAcls request's filter (fields as in Kafka's schema / kio), or MalformedAclRequest."""
    return _binding_filter(version, request.resource_type_filter, request.resource_name_filter,
                           request.pattern_type_filter, request.principal_filter, request.host_filter,
                           request.operation, request.permission_type, "DescribeAclsRequest",
                           "Version 0 only supports literal resource pattern types")


def delete_filters(filters: Iterable[Any], version: int) -> list[AclBindingFilter]:
    """A DeleteAcls request's filters, or MalformedAclRequest (any bad filter fails the request)."""
    return [_binding_filter(version, f.resource_type_filter, f.resource_name_filter, f.pattern_type_filter,
                            f.principal_filter, f.host_filter, f.operation, f.permission_type, "Filters",
                            "Version 0 does not support pattern type {} (only LITERAL and ANY are supported)")
            for f in filters]

"""How Kafka 3.7 in ZooKeeper mode stores ACLs, as pure encode / decode functions (no ZooKeeper calls).

The layout, checked against a real Kafka 3.7.1 broker in ZooKeeper mode after ``kafka-acls.sh --add``
(tests/unit/data/kafka371_acl_znodes.json holds what it wrote):

* One znode per resource pattern, its data the whole ACL set of that pattern:
  LITERAL patterns at ``/kafka-acl/<ResourceType>/<name>``, PREFIXED patterns at
  ``/kafka-acl-extended/prefixed/<ResourceType>/<name>``, the type in Kafka's Pascal case ("Topic",
  "Group", "Cluster", "TransactionalId", "DelegationToken", "User"), the name as it is (no escaping: a
  name ZooKeeper cannot hold as one path element - empty, "." / "..", containing "/", control
  characters, or code points ZooKeeper refuses - cannot be stored; Kafka's CreateAcls answers those with
  INVALID_REQUEST or UNKNOWN_SERVER_ERROR and so does :func:`check_storable`).
  Data: ``{"version":1,"acls":[{"principal":"User:alice","permissionType":"Allow","operation":"Read",
  "host":"*"}]}`` - compact JSON, UTF-8, the names Pascal case ("IdempotentWrite", "DescribeConfigs").
  A pattern whose last ACL is deleted has its znode deleted.
* A change notification per changed pattern, a persistent sequential znode:
  LITERAL ``/kafka-acl-changes/acl_changes_<10 digits>`` with data ``TOPIC:orders`` (the enum name in upper
  case, a colon, the name), PREFIXED ``/kafka-acl-extended-changes/acl_changes_<10 digits>`` with data
  ``{"version":1,"resourceType":"TOPIC","name":"pay","patternType":"PREFIXED"}``. Brokers watch both and
  re-read the named pattern's znode; notifications older than 15 minutes are deleted
  (cluster/change_notifications.py, Kafka's ZkNodeChangeNotificationListener).
* Kafka creates ``/kafka-acl/<Type>`` and ``/kafka-acl-extended/prefixed/<Type>`` for every concrete type
  and both change roots when the authorizer starts: :func:`paths_to_create`.

The single-node metadata journal can keep the same per-pattern JSON (:func:`encode_acls`) in its records.

Bad data gets :class:`AclStoreError` with what is wrong and where, never another exception: not UTF-8 or
not JSON, nesting too deep, more than :data:`MAX_READ_BYTES`, a version other than 1, "acls" not a list, an
entry not an object or missing a key, a principal that is not "Type:name". An entry whose operation or
permission type Kafka does not know ("Fly", "Maybe") is left out and reported in ``DecodedAcls.skipped``
(Kafka loads it as an UNKNOWN entry, which never allows or denies anything, so the rest of the set still
applies); so is an entry naming "Any", which Kafka refuses to load.
"""

from __future__ import annotations

import json
import re
from typing import Iterable, NamedTuple

from pykbroker.security.acl import (
    AccessControlEntry, AclOperation, AclPermissionType, PatternType, ResourcePattern, ResourceType,
)
from pykbroker.security.principal import KafkaPrincipal

__all__ = (
    "AclStoreError", "DecodedAcls", "LITERAL_ACL_ROOT", "EXTENDED_ACL_ROOT", "LITERAL_CHANGES_ROOT",
    "EXTENDED_CHANGES_ROOT", "CHANGE_PREFIX", "MAX_ZNODE_BYTES", "MAX_READ_BYTES",
    "store_root", "type_path", "acl_path", "pattern_from_path", "resource_type_from_znode", "paths_to_create",
    "encode_acls", "decode_acls", "check_storable", "change_notification", "decode_change",
)

LITERAL_ACL_ROOT = "/kafka-acl"
EXTENDED_ACL_ROOT = "/kafka-acl-extended"
LITERAL_CHANGES_ROOT = "/kafka-acl-changes"
EXTENDED_CHANGES_ROOT = "/kafka-acl-extended-changes"
CHANGE_PREFIX = "acl_changes_"
ACL_VERSION = 1
# ZooKeeper's server refuses a znode over jute.maxbuffer (0xfffff bytes by default); Kafka's ZooKeeper
# client reads up to 4 MiB.
MAX_ZNODE_BYTES = 0xFFFFF
MAX_READ_BYTES = 4 * 1024 * 1024

_CONCRETE_TYPES = tuple(t for t in ResourceType if t not in (ResourceType.UNKNOWN, ResourceType.ANY))
# ZooKeeper's PathUtils.validatePath refuses these characters (Java chars: U+D800-U+F8FF covers the
# surrogates, so every code point above U+FFFF too).
_ZK_BAD_CHARS = re.compile("[\u0000-\u001f\u007f-\u009f\ud800-\uf8ff\ufff0-\uffff\U00010000-\U0010ffff]")


class AclStoreError(ValueError):
    """ACL data or a name that Kafka's ZooKeeper layout cannot hold or that does not decode."""


class DecodedAcls(NamedTuple):
    entries: frozenset[AccessControlEntry]
    skipped: tuple[str, ...]  # entries left out, each described


def store_root(pattern_type: PatternType) -> str:
    if pattern_type == PatternType.LITERAL:
        return LITERAL_ACL_ROOT
    if pattern_type == PatternType.PREFIXED:
        return f"{EXTENDED_ACL_ROOT}/{pattern_type.name.lower()}"
    raise AclStoreError(f"Invalid pattern type: {PatternType(pattern_type).name}")


def type_path(pattern_type: PatternType, resource_type: ResourceType) -> str:
    """The znode whose children are the names of one pattern type's and resource type's ACLs."""
    return f"{store_root(pattern_type)}/{ResourceType(resource_type).pascal_name}"


def _check_name(name: str) -> None:
    if not isinstance(name, str):
        raise AclStoreError("a resource name must be a string")
    if not name:
        raise AclStoreError("an empty resource name cannot be stored")
    if name in (".", ".."):
        raise AclStoreError(f"resource name {name!r} is not a valid ZooKeeper path element")
    if "/" in name:
        raise AclStoreError(f"resource name {name!r} contains '/'")
    bad = _ZK_BAD_CHARS.search(name)
    if bad:
        raise AclStoreError(f"resource name contains the character U+{ord(bad.group()):04X}, "
                            "which ZooKeeper does not allow in a path")


def acl_path(pattern: ResourcePattern) -> str:
    """The znode holding one resource pattern's ACLs."""
    _check_name(pattern.name)
    if pattern.resource_type not in _CONCRETE_TYPES:
        raise AclStoreError(f"ACLs of resource type {pattern.resource_type.name} cannot be stored")
    return f"{type_path(pattern.pattern_type, pattern.resource_type)}/{pattern.name}"


def resource_type_from_znode(name: str) -> ResourceType | None:
    """A child of an ACL root as Kafka reads it (SecurityUtils.resourceType); None for one it ignores."""
    resource_type = ResourceType.from_name(name)
    return None if resource_type in (ResourceType.UNKNOWN, ResourceType.ANY) else resource_type


def pattern_from_path(path: str) -> ResourcePattern:
    """The resource pattern of an ACL znode path (the inverse of :func:`acl_path`)."""
    for pattern_type in (PatternType.PREFIXED, PatternType.LITERAL):
        root = store_root(pattern_type) + "/"
        if path.startswith(root):
            type_name, slash, name = path[len(root):].partition("/")
            resource_type = resource_type_from_znode(type_name)
            if not slash or resource_type is None:
                break
            _check_name(name)
            return ResourcePattern(resource_type, name, pattern_type)
    raise AclStoreError(f"not an ACL znode path: {path!r}")


def paths_to_create() -> list[str]:
    """What Kafka's createAclPaths makes: both roots, a child per concrete type, both change roots."""
    paths = []
    for pattern_type in (PatternType.LITERAL, PatternType.PREFIXED):
        paths.append(store_root(pattern_type))
        paths.extend(type_path(pattern_type, t) for t in _CONCRETE_TYPES)
    return paths + [LITERAL_CHANGES_ROOT, EXTENDED_CHANGES_ROOT]


def _entry_sort_key(entry: AccessControlEntry):
    return (entry.principal, int(entry.permission_type), int(entry.operation), entry.host)


def encode_acls(entries: Iterable[AccessControlEntry]) -> bytes:
    """A pattern's ACL set as Kafka's znode data (entries in a stable order)."""
    acls = []
    for entry in sorted(entries, key=_entry_sort_key):
        if entry.is_unknown:
            raise AclStoreError(f"an entry with UNKNOWN parts cannot be stored: {entry}")
        acls.append({"principal": entry.principal, "permissionType": entry.permission_type.pascal_name,
                     "operation": entry.operation.pascal_name, "host": entry.host})
    data = json.dumps({"version": ACL_VERSION, "acls": acls}, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")
    if len(data) > MAX_ZNODE_BYTES:
        raise AclStoreError(f"the ACLs of one resource encode to {len(data)} bytes, more than the "
                            f"{MAX_ZNODE_BYTES} ZooKeeper stores in one znode")
    return data


def _load_json(data: bytes, what: str):
    if len(data) > MAX_READ_BYTES:
        raise AclStoreError(f"{what} is {len(data)} bytes, more than {MAX_READ_BYTES}")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AclStoreError(f"{what} is not UTF-8: {exc}") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise AclStoreError(f"{what} is nested too deeply") from None
    except ValueError as exc:
        raise AclStoreError(f"{what} is not JSON: {exc}") from None


def decode_acls(data: bytes | None, *, where: str = "ACL znode") -> DecodedAcls:
    """A pattern's znode data as its entries (no data or empty data: no entries, as Kafka reads it)."""
    if not data:
        return DecodedAcls(frozenset(), ())
    document = _load_json(data, where)
    if not isinstance(document, dict):
        raise AclStoreError(f"{where}: expected a JSON object, got {type(document).__name__}")
    version = document.get("version")
    if type(version) is not int or version != ACL_VERSION:
        raise AclStoreError(f"{where}: unsupported version {version!r} (Kafka writes and reads version 1)")
    acls = document.get("acls")
    if not isinstance(acls, list):
        raise AclStoreError(f"{where}: \"acls\" is not a list")
    entries = set()
    skipped = []
    for position, item in enumerate(acls):
        if not isinstance(item, dict):
            raise AclStoreError(f"{where}: acls[{position}] is not an object")
        values = {}
        for key in ("principal", "permissionType", "operation", "host"):
            value = item.get(key)
            if not isinstance(value, str):
                raise AclStoreError(f"{where}: acls[{position}].{key} is "
                                    f"{'missing' if value is None else 'not a string'}")
            values[key] = value
        try:
            KafkaPrincipal.parse(values["principal"])
        except ValueError as exc:
            raise AclStoreError(f"{where}: acls[{position}]: {exc}") from None
        operation = AclOperation.from_name(values["operation"])
        permission = AclPermissionType.from_name(values["permissionType"])
        if operation in (AclOperation.UNKNOWN, AclOperation.ANY):
            skipped.append(f"acls[{position}]: unknown operation {values['operation']!r}")
            continue
        if permission in (AclPermissionType.UNKNOWN, AclPermissionType.ANY):
            skipped.append(f"acls[{position}]: unknown permission type {values['permissionType']!r}")
            continue
        entries.add(AccessControlEntry(values["principal"], values["host"], operation, permission))
    return DecodedAcls(frozenset(entries), tuple(skipped))


def check_storable(pattern: ResourcePattern, entries: Iterable[AccessControlEntry]) -> None:
    """Raise AclStoreError when this pattern's ACL set cannot be written as a znode (for plan_create)."""
    acl_path(pattern)
    encode_acls(entries)


def change_notification(pattern: ResourcePattern) -> tuple[str, bytes]:
    """(sequential node path prefix, data) of the change notification for one changed pattern."""
    if pattern.pattern_type == PatternType.LITERAL:
        return f"{LITERAL_CHANGES_ROOT}/{CHANGE_PREFIX}", f"{pattern.resource_type.name}:{pattern.name}".encode()
    if pattern.pattern_type == PatternType.PREFIXED:
        event = {"version": 1, "resourceType": pattern.resource_type.name, "name": pattern.name,
                 "patternType": pattern.pattern_type.name}
        return (f"{EXTENDED_CHANGES_ROOT}/{CHANGE_PREFIX}",
                json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    raise AclStoreError(f"Invalid pattern type: {pattern.pattern_type.name}")


def decode_change(root: str, data: bytes | None) -> ResourcePattern:
    """The pattern a change notification under ``root`` (one of the two change roots) names."""
    if data is None:
        raise AclStoreError(f"empty ACL change notification under {root}")
    if root == LITERAL_CHANGES_ROOT:
        if len(data) > MAX_READ_BYTES:
            raise AclStoreError(f"ACL change notification is {len(data)} bytes, more than {MAX_READ_BYTES}")
        text = bytes(data).decode("utf-8", "replace")
        type_name, colon, name = text.partition(":")
        if not colon:
            raise AclStoreError(f"expected a string in format ResourceType:ResourceName but got {text}")
        resource_type = ResourceType.from_string(type_name)
        if resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            raise AclStoreError(f"ACL change notification names resource type {type_name!r}")
        return ResourcePattern(resource_type, name, PatternType.LITERAL)
    if root == EXTENDED_CHANGES_ROOT:
        event = _load_json(data, "ACL change event")
        if not isinstance(event, dict) or set(event) != {"version", "resourceType", "name", "patternType"}:
            raise AclStoreError("Failed to parse ACL change event: expected the fields version, "
                                f"resourceType, name and patternType, got {event!r:.200}")
        version = event["version"]
        if type(version) is not int:
            raise AclStoreError(f"Failed to parse ACL change event: version {version!r}")
        if version > 1:
            raise AclStoreError(f"Acl change event received for unsupported version: {version}")
        resource_type, name, pattern_type = event["resourceType"], event["name"], event["patternType"]
        if not all(isinstance(v, str) for v in (resource_type, name, pattern_type)):
            raise AclStoreError("Failed to convert ACL change event to resource: a field is not a string")
        resource_type = ResourceType.from_string(resource_type)
        pattern_type = PatternType.from_string(pattern_type)
        if resource_type in (ResourceType.UNKNOWN, ResourceType.ANY) or not pattern_type.is_specific:
            raise AclStoreError(f"Failed to convert ACL change event to resource: {event!r:.200}")
        return ResourcePattern(resource_type, name, pattern_type)
    raise AclStoreError(f"not an ACL change root: {root!r}")



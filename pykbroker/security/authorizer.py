"""The authorizer: Kafka 3.7's ZooKeeper-mode ``AclAuthorizer`` decisions over an in-memory ACL cache.

Wiring (for the request handlers; nothing here does I/O)::

    authorizer = AclAuthorizer.from_config(config_values)        # super.users, allow.everyone.if.no.acl.found
    # fill the cache from the store: journal replay, or the znodes under /kafka-acl (see acl_store.py)
    authorizer.cache.set(pattern, entries)                       # one resource's whole ACL set, atomically

    # in a handler, with the connection's principal and peer address:
    host = java_host_address(peer_ip)                             # "0:0:0:0:0:0:0:1", as Kafka compares hosts
    if not authorizer.authorize(principal, host, AclOperation.READ, Resource(ResourceType.TOPIC, "orders"),
                                request="FETCH"):
        ...TOPIC_AUTHORIZATION_FAILED (AUTHORIZATION_ERRORS in acl.py maps resource type -> error)
    authorizer.authorized_operations(principal, host, resource)   # the int32 bit field of Metadata & co
    authorizer.authorize_by_resource_type(principal, host, AclOperation.WRITE, ResourceType.TOPIC)
    authorizer.authorize_idempotent_producer(principal, host)     # InitProducerId without transactional id

    # CreateAcls: acl.creation_bindings(...) first, then for the bindings it returned:
    # under the store's lock (plan, then persist: one ACL change at a time through a broker, as Kafka's):
    plan = authorizer.plan_create(bindings, check=acl_store.check_storable)
    for pattern, change in plan.changes.items():                  # new set = change(the set the store reads)
        try: persist(pattern, change)                             # ZooKeeper znode / journal record, cache
        except Exception: plan.fail(pattern); continue            # UNKNOWN_SERVER_ERROR for its creations
    plan.results                                                  # per binding: None (created) or KafkaError
    # DeleteAcls: the same with plan_delete(filters); plan.results is, per filter, [(binding, error)].
    # DescribeAcls: authorizer.acls(filter).

Semantics (AclAuthorizer.authorizeAction): a super user (``super.users``, principals separated by ";")
may do everything. Otherwise the ACLs that apply to a resource are those of its literal pattern, of the
wildcard literal pattern ``*`` of its type, and of every PREFIXED pattern of its type that is a prefix of
its name. With none, ``allow.everyone.if.no.acl.found`` decides. With some, the operation is allowed
when no DENY entry matches it and an ALLOW entry does; an entry matches when its principal is the
principal or ``User:*`` (whatever the principal's type), its host is the host or ``*``, and its operation
is the operation or ALL. An ALLOW of READ, WRITE, DELETE or ALTER also allows DESCRIBE, and an ALLOW of
ALTER_CONFIGS allows DESCRIBE_CONFIGS (DENY is never widened that way: DENY READ does not deny DESCRIBE).
Principals and hosts are compared as strings ("User:alice", the peer address as Java prints it): no name
resolution.

``authorize_by_resource_type`` is Kafka's "may this principal do the operation on some resource of this
type" (AclAuthorizer.authorizeByResourceType): a DENY of the wildcard literal denies; else
``allow.everyone.if.no.acl.found`` allows; else an ALLOW on any literal or prefixed resource allows unless
a DENY literal of the same name or a DENY prefix of it covers it (an allowed prefix only loses to a DENY
prefix of itself or shorter). InitProducerId without a transactional id needs IDEMPOTENT_WRITE on the
cluster or, since Kafka 3.0 (KIP-679), WRITE on any topic by that rule: :meth:`authorize_idempotent_producer`.

The cache (:class:`AclCache`) keeps each resource pattern's ACL set as one immutable frozenset, replaced
whole by :meth:`AclCache.set`, so every update is atomic per resource (the broker runs on one event loop:
no locks). Lookups cost two dict hits for the literal and wildcard patterns plus one per distinct length
of the PREFIXED names of that resource type (Kafka walks a sorted map for the same answer), and a second
index maps (entry, resource type, pattern type) to resource names for authorize_by_resource_type, as
Kafka's ``resourceCache`` does.

Audit lines (logger ``pykbroker.security.audit``) use Kafka's format: "Principal = User:bob is Denied
Operation = Read from host = 10.0.0.1 on resource = Topic:LITERAL:orders for request = PRODUCE with
resourceRefCount = 1" - INFO when denied, DEBUG when allowed, nothing when the caller says the check is
only a probe (``log_if_denied=False``, as Kafka's authorized-operations and regex filters do).
"""

from __future__ import annotations

import ipaddress
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from pykbroker.protocol.errors import ErrorCode, KafkaError
from pykbroker.security.acl import (
    CLUSTER, SUPPORTED_OPERATIONS, WILDCARD_HOST, WILDCARD_PRINCIPAL, WILDCARD_RESOURCE, AccessControlEntry,
    AclBinding, AclBindingFilter, AclOperation, AclPermissionType, PatternType, Resource, ResourcePattern,
    ResourceType,
)
from pykbroker.security.principal import KafkaPrincipal

__all__ = ("AclAuthorizer", "AclCache", "AclChange", "CreatePlan", "DeletePlan", "java_host_address",
           "AUTHORIZER_CLASS_NAMES", "SUPER_USERS_CONFIG", "ALLOW_EVERYONE_CONFIG")

log = logging.getLogger(__name__)
audit_log = logging.getLogger("pykbroker.security.audit")

# authorizer.class.name values that turn ACLs on (issue 19: either gives the ZooKeeper-mode semantics here).
AUTHORIZER_CLASS_NAMES = frozenset({"kafka.security.authorizer.AclAuthorizer",
                                    "org.apache.kafka.metadata.authorizer.StandardAuthorizer"})
SUPER_USERS_CONFIG = "super.users"
ALLOW_EVERYONE_CONFIG = "allow.everyone.if.no.acl.found"

_ALLOW, _DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
_ALL = AclOperation.ALL
# Allowing any of these also allows the key (AclAuthorizer.authorizeAction's allowOps).
_IMPLIED_BY = {
    AclOperation.DESCRIBE: (AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE,
                            AclOperation.ALTER),
    AclOperation.DESCRIBE_CONFIGS: (AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS),
}
_EMPTY: frozenset = frozenset()


def java_host_address(address: str) -> str:
    """A peer address as Java's InetAddress.getHostAddress() prints it - the host string Kafka's ACLs
    are compared with: IPv4 dotted, IPv4-mapped IPv6 as IPv4, other IPv6 as eight groups of lower-case
    hex without leading zeros and without "::" ("0:0:0:0:0:0:0:1"), a zone kept as "%zone"."""
    text, _, zone = address.partition("%")
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv4Address):
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    groups = ip.exploded.split(":")
    rendered = ":".join(format(int(group, 16), "x") for group in groups)
    return f"{rendered}%{zone}" if zone else rendered


def _principal_text(principal: KafkaPrincipal | str) -> str:
    return principal if isinstance(principal, str) else str(principal)


def _check_entry_principal(entry: AccessControlEntry) -> None:
    KafkaPrincipal.parse(entry.principal)


# ---------------------------------------------------------------------------------------------------
# The cache


class AclCache:
    """Every resource pattern's ACL set, with the indexes the authorizer's lookups need."""

    def __init__(self) -> None:
        self._acls: dict[ResourcePattern, frozenset[AccessControlEntry]] = {}
        # LITERAL patterns keyed by (resource type, name): the lookup on every request, without building a pattern
        self._literal: dict[tuple[ResourceType, str], frozenset[AccessControlEntry]] = {}
        # PREFIXED patterns per resource type: name -> entries, and how many names have each length.
        self._prefixed: dict[ResourceType, dict[str, frozenset[AccessControlEntry]]] = {}
        self._prefix_lengths: dict[ResourceType, Counter] = {}
        # (principal, host, operation, permission, resource type, pattern type) -> resource names
        self._by_entry: dict[tuple, set[str]] = {}

    def __len__(self) -> int:
        return len(self._acls)

    def __contains__(self, pattern: object) -> bool:
        return pattern in self._acls

    def items(self):
        """(pattern, entries) pairs, a snapshot safe to iterate while the cache changes."""
        return list(self._acls.items())

    def get(self, pattern: ResourcePattern) -> frozenset[AccessControlEntry]:
        return self._acls.get(pattern, _EMPTY)

    def set(self, pattern: ResourcePattern, entries: Iterable[AccessControlEntry]) -> bool:
        """Replace the ACL set of one resource pattern (empty removes it); True when it changed.

        Raises ValueError, changing nothing, for a pattern that is not LITERAL / PREFIXED or an entry
        whose principal is not "Type:name"."""
        if not isinstance(pattern, ResourcePattern) or not pattern.pattern_type.is_specific:
            raise ValueError(f"ACLs are stored under LITERAL or PREFIXED patterns, not {pattern}")
        new = frozenset(entries)
        for entry in new:
            if not isinstance(entry, AccessControlEntry):
                raise ValueError(f"not an access control entry: {entry!r}")
            if entry.is_unknown:
                raise ValueError(f"an entry with UNKNOWN parts grants and denies nothing: {entry}")
            _check_entry_principal(entry)
        old = self._acls.get(pattern, _EMPTY)
        if new == old:
            return False
        for entry in old - new:
            key = (entry.principal, entry.host, entry.operation, entry.permission_type, pattern.resource_type,
                   pattern.pattern_type)
            names = self._by_entry.get(key)
            if names is not None:
                names.discard(pattern.name)
                if not names:
                    del self._by_entry[key]
        for entry in new - old:
            key = (entry.principal, entry.host, entry.operation, entry.permission_type, pattern.resource_type,
                   pattern.pattern_type)
            self._by_entry.setdefault(key, set()).add(pattern.name)
        if pattern.pattern_type == PatternType.PREFIXED:
            names = self._prefixed.setdefault(pattern.resource_type, {})
            lengths = self._prefix_lengths.setdefault(pattern.resource_type, Counter())
            if new and not old:
                lengths[len(pattern.name)] += 1
            elif old and not new:
                lengths[len(pattern.name)] -= 1
                if not lengths[len(pattern.name)]:
                    del lengths[len(pattern.name)]
            if new:
                names[pattern.name] = new
            else:
                names.pop(pattern.name, None)
        elif new:
            self._literal[(pattern.resource_type, pattern.name)] = new
        else:
            self._literal.pop((pattern.resource_type, pattern.name), None)
        if new:
            self._acls[pattern] = new
        else:
            self._acls.pop(pattern, None)
        return True

    def clear(self) -> None:
        for pattern in list(self._acls):
            self.set(pattern, ())

    def matching(self, resource_type: ResourceType, name: str) -> list[AccessControlEntry]:
        """Every entry that applies to a resource: its literal, the wildcard and its prefixes."""
        literals = self._literal
        found: list[AccessControlEntry] = []
        lengths = self._prefix_lengths.get(resource_type)
        if lengths:
            prefixed = self._prefixed[resource_type]
            size = len(name)
            for length in lengths:
                # An empty prefix only applies to the empty name (Kafka's range over its sorted map).
                if (0 < length <= size) or length == size == 0:
                    entries = prefixed.get(name[:length])
                    if entries:
                        found.extend(entries)
        wildcard = literals.get((resource_type, WILDCARD_RESOURCE))
        if wildcard:
            found.extend(wildcard)
        if name != WILDCARD_RESOURCE:
            literal = literals.get((resource_type, name))
            if literal:
                found.extend(literal)
        return found

    def names_for(self, principal: str, host: str, operation: AclOperation, permission: AclPermissionType,
                  resource_type: ResourceType, pattern_type: PatternType) -> set[str] | None:
        return self._by_entry.get((principal, host, operation, permission, resource_type, pattern_type))

    def bindings(self, binding_filter: AclBindingFilter) -> list[AclBinding]:
        """DescribeAcls: every stored binding the filter matches."""
        found = []
        pattern_filter, entry_filter = binding_filter.pattern_filter, binding_filter.entry_filter
        for pattern, entries in self._acls.items():
            if not pattern_filter.matches(pattern):
                continue
            for entry in entries:
                if entry_filter.matches(entry):
                    found.append(AclBinding(pattern, entry))
        return found


# ---------------------------------------------------------------------------------------------------
# Plans for CreateAcls / DeleteAcls


AclChange = Callable[[frozenset], frozenset]  # a pattern's ACL set as read -> its new set


@dataclass
class CreatePlan:
    """What CreateAcls changes: ``changes`` (pattern -> the function making its new ACL set from the set the
    store reads when it writes, Kafka's updateResourceAcls argument: here the set plus the creations), then
    put in the cache; ``results`` per binding (None: created), ``indexes`` (pattern -> its bindings)."""

    results: list[KafkaError | None]
    changes: dict[ResourcePattern, AclChange] = field(default_factory=dict)
    indexes: dict[ResourcePattern, list[int]] = field(default_factory=dict)

    def fail(self, pattern: ResourcePattern, error: KafkaError | None = None) -> None:
        """Persisting this pattern failed: its creations answer UNKNOWN_SERVER_ERROR (or ``error``)."""
        error = error or KafkaError(ErrorCode.unknown_server_error)
        for index in self.indexes.get(pattern, ()):
            self.results[index] = error
        self.changes.pop(pattern, None)


@dataclass
class DeletePlan:
    """What DeleteAcls changes: ``changes`` as for CreatePlan (here: the set without the entries the
    filters match in it, matched again on the set the store reads); ``results`` per filter: the deleted
    bindings, each with None or the error persisting it met (first filled from the cache, then replaced
    pattern by pattern by what a change removed when it was applied)."""

    results: list[list[list]]  # per filter: [binding, error | None]
    changes: dict[ResourcePattern, AclChange] = field(default_factory=dict)

    def fail(self, pattern: ResourcePattern, error: KafkaError | None = None) -> None:
        error = error or KafkaError(ErrorCode.unknown_server_error)
        for deleted in self.results:
            for item in deleted:
                if item[0].pattern == pattern and item[1] is None:
                    item[1] = error
        self.changes.pop(pattern, None)

    def removal(self, pattern: ResourcePattern, matching: list[tuple[int, AclBindingFilter]]) -> AclChange:
        """The change deleting from ``pattern``'s set every entry one of ``matching`` (index, filter) matches,
        each reported under the first filter (in request order) that matches it (AclAuthorizer.deleteAcls)."""

        def change(current: frozenset) -> frozenset:
            for deleted in self.results:  # an earlier application (a conflicting write, re-read) is replaced
                deleted[:] = [item for item in deleted if item[0].pattern != pattern]
            removed = set()
            for entry in current:
                for index, binding_filter in matching:
                    if binding_filter.entry_filter.matches(entry):
                        removed.add(entry)
                        self.results[index].append([AclBinding(pattern, entry), None])
                        break
            return current - removed

        return change


# ---------------------------------------------------------------------------------------------------
# The authorizer


def _java_split_semicolons(text: str) -> list[str]:
    parts = text.split(";")
    while parts and parts[-1] == "":  # Java's String.split drops trailing empty strings
        parts.pop()
    return parts


def _parse_boolean(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip()
    if text.lower() == "true":
        return True
    if text.lower() == "false":
        return False
    raise ValueError(f'{key}: For input string: "{text}"')


class AclAuthorizer:
    """Kafka's AclAuthorizer decisions (see the module docstring)."""

    def __init__(self, cache: AclCache | None = None, *, super_users: Iterable[KafkaPrincipal | str] = (),
                 allow_everyone_if_no_acl_found: bool = False) -> None:
        self.cache = cache if cache is not None else AclCache()
        self.super_users = frozenset(str(KafkaPrincipal.parse(_principal_text(p))) for p in super_users)
        self.allow_everyone_if_no_acl_found = bool(allow_everyone_if_no_acl_found)

    @classmethod
    def from_config(cls, configs: Mapping[str, Any], cache: AclCache | None = None) -> "AclAuthorizer":
        """From Kafka's settings: ``super.users`` ("User:admin;User:ops"; a bad principal raises
        ValueError with Kafka's message) and ``allow.everyone.if.no.acl.found`` (true / false)."""
        raw = configs.get(SUPER_USERS_CONFIG)
        super_users: list[KafkaPrincipal] = []
        if isinstance(raw, str) and raw:
            for part in _java_split_semicolons(raw):
                try:
                    super_users.append(KafkaPrincipal.parse(part.strip()))
                except ValueError as exc:
                    raise ValueError(f"{SUPER_USERS_CONFIG}: {exc}") from None
        allow = configs.get(ALLOW_EVERYONE_CONFIG)
        allow_everyone = False if allow is None else _parse_boolean(allow, ALLOW_EVERYONE_CONFIG)
        return cls(cache, super_users=super_users, allow_everyone_if_no_acl_found=allow_everyone)

    # -- decisions ----------------------------------------------------------------------------------

    def is_super_user(self, principal: KafkaPrincipal | str) -> bool:
        return _principal_text(principal) in self.super_users

    def authorize(self, principal: KafkaPrincipal | str, host: str, operation: AclOperation,
                  resource: Resource | ResourcePattern, *, request: str | None = None, ref_count: int = 1,
                  log_if_allowed: bool = True, log_if_denied: bool = True) -> bool:
        """May ``principal`` connecting from ``host`` do ``operation`` on ``resource``?"""
        resource_type, name = resource.resource_type, resource.name
        if isinstance(resource, ResourcePattern) and resource.pattern_type != PatternType.LITERAL:
            raise ValueError(f"Only literal resources are supported. Got: {resource.pattern_type.name}")
        who = _principal_text(principal)
        if who in self.super_users:
            allowed = True
        else:
            entries = self.cache.matching(resource_type, name)
            if not entries:
                allowed = self.allow_everyone_if_no_acl_found
            else:
                allowed = (not self._matches(entries, (operation,), who, host, _DENY)
                           and self._matches(entries, _IMPLIED_BY.get(operation, (operation,)), who, host, _ALLOW))
        self._audit(who, host, operation, resource_type, PatternType.LITERAL, name, allowed, request, ref_count,
                    log_if_allowed, log_if_denied)
        return allowed

    @staticmethod
    def _matches(entries: list[AccessControlEntry], operations: tuple, principal: str, host: str,
                 permission: AclPermissionType) -> bool:
        for entry in entries:
            if (entry.permission_type == permission
                    and (entry.principal == principal or entry.principal == WILDCARD_PRINCIPAL)
                    and (entry.operation in operations or entry.operation == _ALL)
                    and (entry.host == host or entry.host == WILDCARD_HOST)):
                return True
        return False

    def authorized_operations(self, principal: KafkaPrincipal | str, host: str, resource: Resource) -> int:
        """The authorized-operations bit field (bit n = operation code n) Kafka puts in Metadata,
        DescribeCluster and DescribeGroups: the resource type's supported operations this principal may do.
        Kafka's handlers ask it only where DESCRIBE is allowed: DescribeCluster (and Metadata's cluster field)
        answer 0 otherwise, Metadata answers TOPIC_AUTHORIZATION_FAILED for the topic."""
        bits = 0
        for operation in SUPPORTED_OPERATIONS[resource.resource_type]:
            if self.authorize(principal, host, operation, resource, log_if_allowed=False, log_if_denied=False):
                bits |= 1 << int(operation)
        return bits

    def authorize_by_resource_type(self, principal: KafkaPrincipal | str, host: str, operation: AclOperation,
                                   resource_type: ResourceType, *, request: str | None = None) -> bool:
        """May the principal do the operation on at least one resource of this type (Kafka's rule)?"""
        if resource_type == ResourceType.ANY:
            raise ValueError("Must specify a non-filter resource type for authorizeByResourceType")
        if resource_type == ResourceType.UNKNOWN:
            raise ValueError("Unknown resource type")
        if operation == AclOperation.ANY:
            raise ValueError("Must specify a non-filter operation type for authorizeByResourceType")
        if operation == AclOperation.UNKNOWN:
            raise ValueError("Unknown operation type")
        who = _principal_text(principal)
        if who in self.super_users:
            return True
        allowed = self._by_resource_type(who, host, operation, resource_type)
        self._audit(who, host, operation, resource_type, PatternType.UNKNOWN, "NONE", allowed, request, 0,
                    True, True)
        return allowed

    def _names(self, principal: str, host: str, operation: AclOperation, permission: AclPermissionType,
               resource_type: ResourceType, pattern_type: PatternType) -> list[set[str]]:
        found = []
        for p in {principal, WILDCARD_PRINCIPAL}:
            for h in {host, WILDCARD_HOST}:
                for o in {operation, _ALL}:
                    names = self.cache.names_for(p, h, o, permission, resource_type, pattern_type)
                    if names:
                        found.append(names)
        return found

    def _by_resource_type(self, who: str, host: str, operation: AclOperation, resource_type: ResourceType) -> bool:
        deny_literals = self._names(who, host, operation, _DENY, resource_type, PatternType.LITERAL)
        if any(WILDCARD_RESOURCE in names for names in deny_literals):
            return False
        if self.allow_everyone_if_no_acl_found:
            return True
        deny_prefixes = self._names(who, host, operation, _DENY, resource_type, PatternType.PREFIXED)
        allow_prefixes = self._names(who, host, operation, _ALLOW, resource_type, PatternType.PREFIXED)
        allow_literals = self._names(who, host, operation, _ALLOW, resource_type, PatternType.LITERAL)
        if not deny_literals and not deny_prefixes:
            return bool(allow_prefixes or allow_literals)

        def dominant_prefixed_deny(name: str) -> bool:
            return any(name[:length] in names for length in range(1, len(name) + 1) for names in deny_prefixes)

        for names in allow_prefixes:
            for prefix in names:
                if not dominant_prefixed_deny(prefix):
                    return True
        for names in allow_literals:
            for literal in names:
                if literal == WILDCARD_RESOURCE:
                    return True
                if not any(literal in denied for denied in deny_literals) and not dominant_prefixed_deny(literal):
                    return True
        return False

    def authorize_idempotent_producer(self, principal: KafkaPrincipal | str, host: str, *,
                                      request: str | None = "INIT_PRODUCER_ID") -> bool:
        """InitProducerId without a transactional id (KafkaApis, Kafka 3.x): IDEMPOTENT_WRITE on the
        cluster, or WRITE on any topic (authorize_by_resource_type); else CLUSTER_AUTHORIZATION_FAILED."""
        return (self.authorize(principal, host, AclOperation.IDEMPOTENT_WRITE, CLUSTER, request=request,
                               log_if_denied=False)
                or self.authorize_by_resource_type(principal, host, AclOperation.WRITE, ResourceType.TOPIC,
                                                   request=request))

    def _audit(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType,
               pattern_type: PatternType, name: str, allowed: bool, request: str | None, ref_count: int,
               log_if_allowed: bool, log_if_denied: bool) -> None:
        if allowed:
            if not log_if_allowed or not audit_log.isEnabledFor(logging.DEBUG):
                return
            level = logging.DEBUG
        else:
            if not log_if_denied or not audit_log.isEnabledFor(logging.INFO):
                return
            level = logging.INFO
        audit_log.log(level, "Principal = %s is %s Operation = %s from host = %s on resource = %s:%s:%s "
                      "for request = %s with resourceRefCount = %d", principal, "Allowed" if allowed else "Denied",
                      operation.pascal_name, host, resource_type.pascal_name, pattern_type.name, name,
                      request if request is not None else "unknown", ref_count)

    # -- ACL administration ------------------------------------------------------------------------

    def acls(self, binding_filter: AclBindingFilter) -> list[AclBinding]:
        """DescribeAcls: the bindings the filter matches."""
        return self.cache.bindings(binding_filter)

    def plan_create(self, bindings: list[AclBinding],
                    check: Callable[[ResourcePattern, frozenset], None] | None = None) -> CreatePlan:
        """CreateAcls as AclAuthorizer.createAcls decides it, without persisting anything.

        A binding with an UNKNOWN part or a "/" in its name: INVALID_REQUEST "Failed to create ACL". The
        others are grouped by pattern; a group in which one principal is not "Type:name", or which
        ``check(pattern, new_entries)`` refuses (ValueError: e.g. acl_store.check_storable), fails whole
        with UNKNOWN_SERVER_ERROR, as Kafka's per-resource update does. Creating an ACL that exists is a
        success that changes nothing. Each pattern's change adds its entries to the set the store reads when
        it writes (under the store's lock: another change, here or through another broker, is kept).
        """
        results: list[KafkaError | None] = [None] * len(bindings)
        plan = CreatePlan(results)
        groups: dict[ResourcePattern, list[int]] = {}
        for index, binding in enumerate(bindings):
            if binding.is_unknown or "/" in binding.pattern.name:
                results[index] = KafkaError(ErrorCode.invalid_request, "Failed to create ACL")
            else:
                groups.setdefault(binding.pattern, []).append(index)
        for pattern, indexes in groups.items():
            plan.indexes[pattern] = indexes
            current = self.cache.get(pattern)
            new = current | {bindings[i].entry for i in indexes}
            try:
                for i in indexes:
                    _check_entry_principal(bindings[i].entry)
                if check is not None:
                    check(pattern, new)
            except ValueError as exc:
                log.debug("Failed to create ACLs for %s: %s", pattern, exc)
                for i in indexes:
                    results[i] = KafkaError(ErrorCode.unknown_server_error)
                continue
            added = frozenset(bindings[i].entry for i in indexes)
            plan.changes[pattern] = lambda current, added=added: current | added
        return plan

    def plan_delete(self, filters: list[AclBindingFilter]) -> DeletePlan:
        """DeleteAcls as AclAuthorizer.deleteAcls decides it, without persisting anything: every stored
        binding that a filter matches is deleted and reported under the first filter (in request order)
        that matches it; filters that match nothing report nothing. The patterns changed are those of this
        broker's cache with a matching binding; each one's change matches the filters again on the set the
        store reads when it writes (an ACL added there meanwhile by another broker is deleted too, one gone
        is not reported). A pattern another broker created whose notification has not arrived yet is not
        visited (Kafka also re-reads the one or two znodes of a filter that names an exact pattern)."""
        plan = DeletePlan([[] for _ in filters])
        for pattern, entries in self.cache.items():
            matching = [(index, f) for index, f in enumerate(filters) if f.pattern_filter.matches(pattern)]
            if not matching:
                continue
            change = plan.removal(pattern, matching)
            if change(entries) != entries:
                plan.changes[pattern] = change
        return plan

    def apply(self, plan: CreatePlan | DeletePlan) -> None:
        """Apply a plan's changes to the cache alone (without a store: the store's ``update`` applies them
        to what it reads and puts the result in the cache)."""
        for pattern, change in list(plan.changes.items()):
            self.cache.set(pattern, change(self.cache.get(pattern)))

"""How Kafka 3.7 in ZooKeeper mode stores client quotas, and its AlterClientQuotas / DescribeClientQuotas
(KIP-546) semantics, as pure functions over a quota table (no ZooKeeper calls, no I/O).

The layout, checked against a real Kafka 3.7.1 broker in ZooKeeper mode after ``kafka-configs.sh --alter
--add-config ... --entity-type users|clients|ips`` (tests/unit/data/kafka371_quota_znodes.json holds what it
wrote):

* One znode per entity, its data the entity's whole config ``{"version":1,"config":{"producer_byte_rate":
  "1024"}}`` (compact JSON, values strings): ``/config/users/<user>``, ``/config/users/<user>/clients/<client>``,
  ``/config/clients/<client>``, ``/config/ips/<ip>``; each name sanitized (Kafka's Sanitizer, URL encoding:
  ``bob@x.com`` -> ``bob%40x.com``, ``my app*~/x`` -> ``my%20app%2A%7E%2Fx``), ``<default>`` for the default
  entity. A user's znode also holds its SCRAM credentials (credentials.py); a znode whose last quota is
  removed keeps ``{"version":1,"config":{}}``, and a parent made on the way (``/config/users/alice`` above
  ``.../clients/app``) may have no data at all: both read as no quotas.
  Values are written as Kafka writes them: byte rates and ``connection_creation_rate`` as integers
  ("1024"), ``request_percentage`` and ``controller_mutation_rate`` as Java's Double.toString ("50.5", "-3.0",
  "1.0E10"; :func:`java_double_to_string`).
* A change notification per write, a persistent sequential znode ``/config/changes/config_change_<10 digits>``
  with ``{"version":2,"entity_path":"users/alice/clients/app"}`` (the path under /config); brokers re-read
  that entity and apply it (quotas.ClientQuotas.apply_entity_config). The envelope codecs are those of
  pykbroker.cluster.zookeeper (``encode_topic_config``, ``encode_config_change``).
* The single-node metadata journal can keep the same per-entity JSON under the same entity path.

AlterClientQuotas (ZkAdminManager.alterClientQuotas): :func:`plan_alter` checks each entry as Kafka does, in
order, and gives per entry the error Kafka answers (INVALID_REQUEST with Kafka's message, or None) and the
new configs to write. Kafka's rules, kept here: an entity is user, client-id, user + client-id, or ip alone
(names null for ``<default>``, never empty); keys are those of the entity's kind (``Invalid configuration key
foo``); byte rates must be whole numbers within 1e-6 (and so must ``connection_creation_rate``): "Configuration
producer_byte_rate must be a LONG value" - which is also what a negative byte rate gets, because Kafka's check
rounds toward zero (-5 + 1e-6 becomes -4); ``request_percentage`` and ``controller_mutation_rate`` take any
double, negative too (Kafka 3.7.1 stores "-3.0"). Not Kafka's: NaN and infinite values are refused with
"Configuration <key> must be a finite number" for a percentage or mutation rate (Kafka stores "NaN" or
"Infinity") and "must be a LONG value" for a byte rate (Kafka stores "0"). A user
entity's SCRAM keys cannot be set here (Kafka: UNKNOWN_SERVER_ERROR). An ip must be an IP address or a
resolvable host name after sanitizing, as Kafka checks it ("::1" is sanitized to "%3A%3A1" first, which
Kafka then fails to resolve: IPv6 ip quotas cannot be set through AlterClientQuotas in ZooKeeper mode).

DescribeClientQuotas (ZkAdminManager.describeClientQuotas): :func:`describe` over the table of every entity's
config, components matched exactly (a name), as default (``<default>``) or any (the kind present with any
name), ``strict`` leaving out entities with kinds the filter does not name; values as doubles; an entity
without quota keys is not listed.

Wiring (KafkaApis in ZooKeeper mode; any broker serves both APIs)::

    # AlterClientQuotas: ALTER_CONFIGS on the cluster, else CLUSTER_AUTHORIZATION_FAILED for every entry
    plan = plan_alter(alterations_from_request(req.entries), read_config, validate_only=req.validate_only)
    for entity, config in plan.writes:      # zk.set_entity_config(*entity_path(entity).split("/", 1), config)
        ...                                 # writes the znode, then the change notification
    plan.results                            # per entity: (entity, error_code, error_message)
    # DescribeClientQuotas: DESCRIBE_CONFIGS on the cluster, else CLUSTER_AUTHORIZATION_FAILED
    try: entries = describe(components_from_request(req.components), req.strict, table)
    except QuotaRequestError as e: the whole response has e.error_code, e.message and no entries
    # every broker: for each /config/changes notification naming a quota entity (decode_change), read the
    # entity's config and ClientQuotas.apply_entity_config(quota_entity(entity), config); at startup, all of them.
"""

from __future__ import annotations

import ipaddress
import json
import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable, Iterable, Mapping

from pykbroker.cluster.zookeeper import CONFIG_CHANGE_PREFIX, CONFIG_CHANGES_PATH, CONFIG_PATH
from pykbroker.cluster.zookeeper import encode_config_change, encode_topic_config
from pykbroker.protocol.errors import ErrorCode
from pykbroker.security.credentials import SCRAM_MECHANISMS, desanitize, sanitize
from pykbroker.security.quotas import (
    CONNECTION_CREATION_RATE, CONSUMER_BYTE_RATE, CONTROLLER_MUTATION_RATE, DEFAULT, DEFAULT_STRING,
    PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE, QuotaEntity, java_parse_double,
)

USER, CLIENT_ID, IP = "user", "client-id", "ip"           # ClientQuotaEntity's entity types
USERS, CLIENTS, IPS = "users", "clients", "ips"            # ZooKeeper's config types

MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2            # DescribeClientQuotas match_type

LONG, INT, DOUBLE, STRING = "LONG", "INT", "DOUBLE", "STRING"
QUOTA_KEYS = {PRODUCER_BYTE_RATE: LONG, CONSUMER_BYTE_RATE: LONG, REQUEST_PERCENTAGE: DOUBLE,
              CONTROLLER_MUTATION_RATE: DOUBLE}
USER_KEYS = {**QUOTA_KEYS, **{m: STRING for m in SCRAM_MECHANISMS}}   # DynamicConfig.User.configKeys
IP_KEYS = {CONNECTION_CREATION_RATE: INT}

MAX_READ_BYTES = 1 << 20


class QuotaStoreError(ValueError):
    """Stored quota data that Kafka's layout cannot hold or that does not decode."""


class QuotaRequestError(Exception):
    """A request Kafka refuses: ``error_code`` (INVALID_REQUEST, UNSUPPORTED_VERSION, ...) and its message."""

    def __init__(self, error_code: int, message: str | None) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message


def _invalid(message: str) -> QuotaRequestError:
    return QuotaRequestError(ErrorCode.invalid_request, message)


# -- Java number text --


def java_double_to_string(value: float) -> str:
    """Java's Double.toString: plain decimals for 1e-3 <= |x| < 1e7 ("50.5", "-3.0"), else "d.dddE<n>"; the
    shortest digits that read back (as JDK 19+; JDK 17 picks longer digits for a few rare values)."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign = "-" if value < 0 else ""
    digits_t = Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, digits_t.digits))
    exp10 = len(digits) + digits_t.exponent - 1         # value = d.ddd * 10**exp10
    if 1e-3 <= abs(value) < 1e7:
        point = exp10 + 1
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}"
        whole, frac = digits[:point].ljust(point, "0"), digits[point:]
        return f"{sign}{whole}.{frac or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exp10}"


# -- entities and paths --


def _check_name(kind: str, name: Any) -> None:
    if name is not None and not isinstance(name, str):
        raise QuotaStoreError(f"{kind} entity name is a string or None (<default>), not {name!r}")


def entity_path(entity: Mapping[str, str | None]) -> str:
    """The path under /config of a user / client-id / ip entity ({"user": "alice", "client-id": None} ->
    "users/alice/clients/<default>"). QuotaStoreError for a combination Kafka does not store."""
    def seg(name: str | None) -> str:
        return DEFAULT_STRING if name is None else sanitize(name)
    kinds = set(entity)
    for kind, name in entity.items():
        _check_name(kind, name)
    if kinds == {USER, CLIENT_ID}:
        return f"{USERS}/{seg(entity[USER])}/{CLIENTS}/{seg(entity[CLIENT_ID])}"
    if kinds == {USER}:
        return f"{USERS}/{seg(entity[USER])}"
    if kinds == {CLIENT_ID}:
        return f"{CLIENTS}/{seg(entity[CLIENT_ID])}"
    if kinds == {IP}:
        return f"{IPS}/{seg(entity[IP])}"
    raise QuotaStoreError(f"no quota entity is stored for the entity types {sorted(kinds)}")


def config_path(entity: Mapping[str, str | None]) -> str:
    return f"{CONFIG_PATH}/{entity_path(entity)}"


def _unseg(seg: str) -> str | None:
    if seg == DEFAULT_STRING:
        return None
    try:
        return desanitize(seg)
    except (UnicodeDecodeError, ValueError):
        raise QuotaStoreError(f"entity name {seg!r} is not a sanitized name") from None


def entity_from_path(path: str) -> dict[str, str | None]:
    """The inverse of :func:`entity_path` (a "/config/" prefix is allowed)."""
    if not isinstance(path, str):
        raise QuotaStoreError(f"an entity path is a string, not {path!r}")
    rest = path[len(CONFIG_PATH) + 1:] if path.startswith(CONFIG_PATH + "/") else path
    parts = rest.split("/")
    if any(p == "" for p in parts):
        raise QuotaStoreError(f"unexpected quota entity path {path!r}")
    if len(parts) == 4 and parts[0] == USERS and parts[2] == CLIENTS:
        return {USER: _unseg(parts[1]), CLIENT_ID: _unseg(parts[3])}
    if len(parts) == 2 and parts[0] in (USERS, CLIENTS, IPS):
        return {{USERS: USER, CLIENTS: CLIENT_ID, IPS: IP}[parts[0]]: _unseg(parts[1])}
    raise QuotaStoreError(f"unexpected quota entity path {path!r}")


def quota_entity(entity: Mapping[str, str | None]) -> QuotaEntity | None:
    """The quotas module's entity for a user / client-id entity; None for an ip entity."""
    if IP in entity:
        return None
    part = lambda kind: (DEFAULT if entity[kind] is None else entity[kind]) if kind in entity else None  # noqa: E731
    return QuotaEntity(part(USER), part(CLIENT_ID))


# -- znode data --


def encode_entity_config(config: Mapping[str, str]) -> bytes:
    """An entity's znode data: ``{"version":1,"config":{...}}`` (values as strings)."""
    return encode_topic_config(dict(config))


def decode_entity_config(data: bytes | None) -> dict[str, str]:
    """An entity's znode data as its config map (no data: {}). QuotaStoreError for data Kafka cannot read."""
    if not data:
        return {}
    if len(data) > MAX_READ_BYTES:
        raise QuotaStoreError(f"entity config of {len(data)} bytes is more than {MAX_READ_BYTES}")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise QuotaStoreError(f"entity config is not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("version") != 1:
        raise QuotaStoreError("entity config is not {\"version\":1,...}")
    config = doc.get("config", {})
    if not isinstance(config, dict) or not all(isinstance(v, str) for v in config.values()):
        raise QuotaStoreError("entity config's \"config\" is not an object of strings")
    return dict(config)


def change_notification(entity: Mapping[str, str | None]) -> tuple[str, bytes]:
    """(sequential node path prefix, data) of the change notification for one written entity."""
    return f"{CONFIG_CHANGES_PATH}/{CONFIG_CHANGE_PREFIX}", encode_config_change(entity_path(entity))


def decode_change(data: bytes | None) -> dict[str, str | None] | None:
    """The quota entity a /config/changes notification names; None when it names another kind of entity
    (topics, brokers). Version 2 ``{"entity_path":...}`` and version 1 ``{"entity_type","entity_name"}``."""
    try:
        doc = json.loads(data) if data else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise QuotaStoreError("config change notification is not JSON") from None
    if not isinstance(doc, dict):
        raise QuotaStoreError("config change notification is not an object")
    if doc.get("version") == 2 and isinstance(doc.get("entity_path"), str):
        path = doc["entity_path"]
    elif (doc.get("version") == 1 and isinstance(doc.get("entity_type"), str)
          and isinstance(doc.get("entity_name"), str)):
        path = f"{doc['entity_type']}/{doc['entity_name']}"
    else:
        raise QuotaStoreError("config change notification has no entity path")
    if path.split("/", 1)[0] not in (USERS, CLIENTS, IPS):
        return None
    return entity_from_path(path)


def quota_values(config: Mapping[str, str], keys: Iterable[str] = QUOTA_KEYS) -> dict[str, float]:
    """ZkAdminManager.clientQuotaPropsToDoubleMap over an entity's quota keys. A value that is not a
    number: QuotaStoreError "Unexpected client quota configuration value: k -> v" (Kafka: IllegalStateException,
    the describe fails with UNKNOWN_SERVER_ERROR)."""
    out = {}
    for key in keys:
        if key in config:
            try:
                out[key] = java_parse_double(config[key])
            except (ValueError, TypeError):
                raise QuotaStoreError(f"Unexpected client quota configuration value: {key} -> {config[key]}") from None
    return out


# -- AlterClientQuotas --


def alterations_from_request(entries: Iterable[Any]) -> list["QuotaAlteration"]:
    """AlterClientQuotas entries with Kafka's schema field names (kio's EntryData fits) as alterations."""
    return [QuotaAlteration([(e.entity_type, e.entity_name) for e in entry.entity],
                            [(op.key, op.value, op.remove) for op in entry.ops]) for entry in entries]


@dataclass
class QuotaAlteration:
    """One AlterClientQuotas entry as Kafka's schema has it: ``entity`` a list of (entity_type, entity_name
    or None), ``ops`` a list of (key, value, remove)."""

    entity: list[tuple[str, str | None]]
    ops: list[tuple[str, float, bool]]


@dataclass
class AlterPlan:
    """``results`` per distinct entity (Kafka answers one result per entity; a later entry for the same entity
    overrides the earlier one's result): (entity, error code, message); ``writes``: (entity, new config) to
    persist in order, each followed by its change notification (none when validate_only)."""

    results: list[tuple[dict[str, str | None], int, str | None]] = field(default_factory=list)
    writes: list[tuple[dict[str, str | None], dict[str, str]]] = field(default_factory=list)


def default_host_check(name: str) -> bool:
    """InetAddress.getByName without the network: IP address literals only (and <default>)."""
    if name == DEFAULT_STRING:
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def _parse_entity(pairs: Iterable[tuple[str, str | None]]) -> dict[str, str | None]:
    entity: dict[str, str | None] = {}
    for entity_type, name in pairs:           # a later duplicate type wins, as Kafka's HashMap
        entity[entity_type] = name
    if not entity:
        raise _invalid("Invalid empty client quota entity")
    for entity_type, name in entity.items():
        if entity_type not in (USER, CLIENT_ID, IP):
            raise _invalid(f"Unhandled client quota entity type: {entity_type}")
        if name is not None and not isinstance(name, str):
            raise _invalid(f"Invalid {entity_type} entity name")
        if name == "":
            raise _invalid(f"Empty {entity_type} not supported")
    return entity


def _stored_value(key: str, kind: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _invalid(f"Configuration {key} must be a {kind} value")
    value = float(value)
    if kind == STRING:
        raise QuotaRequestError(ErrorCode.unknown_server_error, None)   # Kafka: IllegalStateException
    if kind == DOUBLE:
        if not math.isfinite(value):                                   # Kafka stores "NaN" / "Infinity"
            raise _invalid(f"Configuration {key} must be a finite number")
        return java_double_to_string(value)
    if math.isnan(value):                                              # Kafka stores "0"
        raise _invalid(f"Configuration {key} must be a {kind} value")
    epsilon = 1e-6
    limit = 2**63 - 1 if kind == LONG else 2**31 - 1
    shifted = value + epsilon
    # Java's saturating (long) / (int) cast of value + 1e-6, then |whole - value| <= 1e-6
    whole = limit if shifted >= limit else -limit - 1 if shifted <= -limit - 1 else math.trunc(shifted)
    if abs(float(whole) - value) > epsilon:
        raise _invalid(f"Configuration {key} must be a {kind} value")
    return str(whole)


def plan_alter(alterations: Iterable[QuotaAlteration], current: Callable[[str], Mapping[str, str]], *,
               validate_only: bool = False, host_check: Callable[[str], bool] = default_host_check) -> AlterPlan:
    """ZkAdminManager.alterClientQuotas over ``current(znode path)`` (the entity's stored config at e.g.
    "/config/users/alice", {} or None if none). Entries are applied in order; a later entry sees what an
    earlier one would write."""
    plan = AlterPlan()
    written: dict[str, dict[str, str]] = {}
    results: dict[str, int] = {}
    for alteration in alterations:
        # The result names the entity as the request did, valid or not (Kafka answers entry.entity back)
        entity: dict[str, str | None] = dict(alteration.entity)
        try:
            entity = _parse_entity(alteration.entity)
            kinds = set(entity)
            if IP in kinds and kinds != {IP}:
                raise _invalid("Invalid quota entity combination, IP entity should not be used with "
                               "user/client ID entity.")
            if kinds == {IP}:
                sanitized = DEFAULT_STRING if entity[IP] is None else sanitize(entity[IP])
                if not host_check(sanitized):
                    raise _invalid(f"{sanitized} is not a valid IP or resolvable host.")
                keys = IP_KEYS
            else:
                keys = USER_KEYS if USER in kinds else QUOTA_KEYS
            path = config_path(entity)
            props = dict(written[path] if path in written else (current(path) or {}))
            for key, value, remove in alteration.ops:
                if remove:
                    props.pop(key, None)
                    continue
                kind = keys.get(key)
                if kind is None:
                    raise _invalid(f"Invalid configuration key {key}")
                props[key] = _stored_value(key, kind, value)
            result = (0, None)
            if not validate_only:
                written[path] = props
                plan.writes.append((entity, props))
        except QuotaRequestError as e:
            result = (int(e.error_code), e.message)
        key = json.dumps(sorted(entity.items(), key=lambda kv: kv[0]))
        if key in results:
            plan.results[results[key]] = (entity, *result)
        else:
            results[key] = len(plan.results)
            plan.results.append((entity, *result))
    return plan


# -- DescribeClientQuotas --


def components_from_request(components: Iterable[Any]) -> list["FilterComponent"]:
    """DescribeClientQuotas components with Kafka's schema field names (kio's ComponentData fits)."""
    return [FilterComponent(c.entity_type, c.match_type, c.match) for c in components]


@dataclass(frozen=True)
class FilterComponent:
    """One DescribeClientQuotas component: ``match_type`` MATCH_EXACT (with ``match``), MATCH_DEFAULT or
    MATCH_ANY."""

    entity_type: str
    match_type: int
    match: str | None = None


def _component_match(component: FilterComponent) -> tuple[bool, str | None]:
    """(wants a name, that name or None for <default>): Kafka's `match` Optional - null for ANY. Kafka's
    request parser throws on an EXACT component without a name (NullPointerException) and on an unknown match
    type (IllegalArgumentException): UNKNOWN_SERVER_ERROR, no message."""
    if component.match_type == MATCH_EXACT:
        if component.match is None:
            raise QuotaRequestError(ErrorCode.unknown_server_error, None)
        return True, component.match
    if component.match_type == MATCH_DEFAULT:
        return True, None
    if component.match_type == MATCH_ANY:
        return False, None
    raise QuotaRequestError(ErrorCode.unknown_server_error, None)


def describe(components: Iterable[FilterComponent], strict: bool,
             table: Mapping[str, Mapping[str, str]]) -> list[tuple[dict[str, str | None], dict[str, float]]]:
    """ZkAdminManager.describeClientQuotas over ``table`` (entity path -> stored config, every entity stored
    under /config/users, /config/users/*/clients, /config/clients and /config/ips). Returns (entity, quota
    values) for each matching entity that has quota keys; raises QuotaRequestError as Kafka fails the request."""
    by_type: dict[str, FilterComponent] = {}
    for component in components:
        et = component.entity_type
        if et in (USER, CLIENT_ID, IP):
            if et in by_type:
                name = {USER: "user", CLIENT_ID: "client", IP: "ip"}[et]
                raise _invalid(f"Duplicate {name} filter component entity type")
            by_type[et] = component
        elif et == "":
            raise _invalid("Unexpected empty filter component entity type")
        else:
            raise QuotaRequestError(ErrorCode.unsupported_version, f"Custom entity type '{et}' not supported")
    wanted = {et: _component_match(c) for et, c in by_type.items()}
    if (USER in by_type or CLIENT_ID in by_type) and IP in by_type:
        raise _invalid("Invalid entity filter component combination, IP filter component should not be used with "
                       "user or clientId filter component.")

    def matches(kind: str, present: bool, name: str | None) -> bool:
        if kind not in wanted:
            return not present or not strict
        exact, want = wanted[kind]
        if exact:
            return present and name == want
        return present

    out = []
    for path in sorted(table):
        try:
            entity = entity_from_path(path)
        except QuotaStoreError:
            raise QuotaRequestError(ErrorCode.unknown_server_error, None) from None
        is_ip = IP in entity
        if is_ip:
            if USER in by_type or CLIENT_ID in by_type:
                continue
            if IP not in by_type and strict:
                continue
            if not matches(IP, True, entity[IP]):
                continue
            keys: Iterable[str] = IP_KEYS
        else:
            if IP in by_type:
                continue
            if not (matches(USER, USER in entity, entity.get(USER))
                    and matches(CLIENT_ID, CLIENT_ID in entity, entity.get(CLIENT_ID))):
                continue
            keys = QUOTA_KEYS
        try:
            values = quota_values(table[path], keys)
        except QuotaStoreError:
            raise QuotaRequestError(ErrorCode.unknown_server_error, None) from None
        if values:
            out.append((entity, values))
    return out

"""Kafka's answer to a request that cannot be served, built from the response schema and the request.

When a handler raises, the client gets what Kafka's ``AbstractRequest.getErrorResponse`` gives: the
response of the request's version with the error code set at every level that has one (top level, per
topic, per partition, per group), the entries echoing the request's own entries (topic names or ids,
partition indexes, group ids, coordinator keys), everything else at the value Kafka's error responses
use: -1 for the fields that name "none" that way (``_MINUS_ONE``: no node, no leader, no offset, no
timestamp, no generation, no producer), the schema's default where it has one, zero otherwise (a throttle
time stays 0). The code is
INVALID_REQUEST when the request carries a null (-1) array or string where its schema does not allow one,
UNKNOWN_SERVER_ERROR otherwise (the broker's own bug). A Produce with acks=0 gets no answer: the
connection is closed (CloseConnection), as Kafka does for an acks=0 produce that fails.

The answer is built generically from kio's dataclasses, so every advertised API and version is covered
without a per-API table: response arrays are paired with the request array of the same name, or of a
known alias (``responses`` <- ``topics``/``topic_data``), or the only one there is at that level.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
import uuid
from functools import lru_cache
from typing import Any, Callable

from pykbroker.protocol.apis import PRODUCE_KEY
from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import CloseConnection

# Response field -> request fields that carry the same thing, in order of preference.
_ARRAY_ALIASES = {
    "responses": ("topics", "topic_data", "topic_names"),
    "partition_responses": ("partition_data", "partitions"),
    "partitions": ("partition_data", "partition_indexes"),
    "coordinators": ("coordinator_keys",),
    "groups": ("groups", "group_ids", "groups_names"),
}
_VALUE_ALIASES = {
    "partition_index": ("partition", "index"),
    "index": ("partition_index", "partition"),
    "name": ("topic", "topic_name"),
    "topic": ("name",),
}
# Integer fields whose "none" is -1 in Kafka's getErrorResponse (Node.noNode(): id and port -1; INVALID_OFFSET,
# INVALID_HIGH_WATERMARK, NO_TIMESTAMP, NO_CONTROLLER_ID, UNKNOWN_GENERATION_ID, NO_PRODUCER_ID/EPOCH,
# NO_PARTITION_LEADER_EPOCH). Never echoed from the request (a Fetch's log_start_offset is the follower's);
# -1 where the schema has no default of its own.
_MINUS_ONE = frozenset({
    "node_id", "port", "leader_id", "controller_id", "coordinator_id", "generation_id",
    "offset", "base_offset", "committed_offset", "high_watermark", "last_stable_offset", "log_start_offset",
    "end_offset", "timestamp", "log_append_time", "leader_epoch", "committed_leader_epoch",
    "producer_id", "producer_epoch",
})
# The field of a response entry that takes a request's plain value (a topic name, a group id, a key).
_KEY_FIELDS = ("name", "topic", "group_id", "key", "transactional_id", "partition_index", "index")


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    name: str
    kind: str  # "entity", "entities", "values", "error", "plain"
    nullable: bool
    element: Any  # the entity class, the array element type, or the plain type
    kafka_type: str
    has_default: bool


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """(the type without ``| None``, whether None is allowed)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], True
    return hint, False


@lru_cache(maxsize=None)
def _fields(cls: type) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    described = []
    for f in dataclasses.fields(cls):
        hint, nullable = _unwrap(hints[f.name])
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        kafka_type = f.metadata.get("kafka_type", "")
        if typing.get_origin(hint) is tuple:
            element = typing.get_args(hint)[0]
            kind = "entities" if dataclasses.is_dataclass(element) else "values"
        elif dataclasses.is_dataclass(hint):
            kind, element = "entity", hint
        elif hint is ErrorCode:
            kind, element = "error", hint
        else:
            kind, element = "plain", hint
        described.append(_Field(f.name, kind, nullable, element, kafka_type, has_default))
    return tuple(described)


def _zero(field: _Field) -> Any:
    if field.nullable:
        return None
    kafka_type = field.kafka_type
    if kafka_type.startswith("timedelta"):
        return datetime.timedelta(0)
    if kafka_type.startswith("datetime"):
        return datetime.datetime.fromtimestamp(0, datetime.timezone.utc)
    if kafka_type == "bool":
        return False
    if kafka_type.startswith("int") and field.name in _MINUS_ONE:
        return field.element(-1)
    if kafka_type.startswith(("int", "uint", "float")):
        return field.element(0)  # kio's phantom types check the range and give back a plain number
    if kafka_type == "string":
        return ""
    if kafka_type == "bytes":
        return b""
    if kafka_type == "uuid":
        return uuid.UUID(int=0)
    raise TypeError(f"no zero value for {field.name}: {kafka_type}")  # a kio type this module does not know


def _fits(field: _Field, value: Any) -> bool:
    """Whether a request value can be echoed into this response field."""
    if value is None:
        return field.nullable
    element = field.element
    if element is bool or isinstance(value, bool):
        return element is bool and isinstance(value, bool)
    return isinstance(element, type) and isinstance(value, element)


def _request_value(source: Any, names: tuple[str, ...]) -> tuple[bool, Any]:
    for name in names:
        if source is not None and hasattr(source, name):
            return True, getattr(source, name)
    return False, None


def _request_array(field: _Field, source: Any) -> Any:
    if source is None or not dataclasses.is_dataclass(source):
        return None
    found, value = _request_value(source, (field.name, *_ARRAY_ALIASES.get(field.name, ())))
    if found:
        return value
    arrays = [f for f in _fields(type(source)) if f.kind in ("entities", "values")]
    return getattr(source, arrays[0].name) if len(arrays) == 1 else None


def build(cls: type, source: Any, code: ErrorCode) -> Any:
    """An instance of response entity ``cls`` answering request entity ``source`` (or None) with ``code``."""
    values: dict[str, Any] = {}
    for field in _fields(cls):
        if field.kind == "error":
            values[field.name] = code
        elif field.kind == "entity":
            values[field.name] = build(field.element, None, code)
        elif field.kind == "entities":
            entries = _request_array(field, source)
            values[field.name] = tuple(_entry(field.element, entry, code) for entry in entries or ())
        else:
            found, value = _request_value(source, (field.name, *_VALUE_ALIASES.get(field.name, ())))
            if found and field.name not in _MINUS_ONE and _fits(field, value):  # offsets, epochs: never echoed
                values[field.name] = value
            elif field.kind == "values":
                values[field.name] = None if field.nullable else ()
            elif not field.has_default:
                values[field.name] = _zero(field)
    return cls(**values)


def _entry(cls: type, entry: Any, code: ErrorCode) -> Any:
    """One response array entry for one request array entry (an entity, or a plain name or index)."""
    if dataclasses.is_dataclass(entry):
        return build(cls, entry, code)
    keyed = {f.name: f for f in _fields(cls)}
    for name in _KEY_FIELDS:
        field = keyed.get(name)
        if field is not None and _fits(field, entry):
            return build(cls, _Plain(name, entry), code)
    return build(cls, None, code)


class _Plain:
    """A request's plain array value (a topic name, a group id) seen as an entity with one field."""

    def __init__(self, name: str, value: Any) -> None:
        setattr(self, name, value)


def has_illegal_null(entity: Any) -> bool:
    """Whether a decoded request holds None where its schema allows no null (a -1 length on the wire)."""
    for field in _fields(type(entity)):
        value = getattr(entity, field.name)
        if value is None:
            if not field.nullable:
                return True
        elif field.kind == "entity":
            if has_illegal_null(value):
                return True
        elif field.kind == "entities":
            if any(has_illegal_null(item) for item in value):
                return True
        elif field.kind == "values" and any(item is None for item in value):
            return True
    return False


# api key -> builder(request, code) of that API's answer where the schema cannot pair it (a handler registers it)
_BUILDERS: dict[int, Callable[[Any, ErrorCode], Any]] = {}


def register_error_answer(api_key: int, builder: Callable[[Any, ErrorCode], Any]) -> None:
    """For an API whose error answer cannot be built from the schemas (AlterUserScramCredentials: one result per
    user named by either of two request arrays)."""
    _BUILDERS[api_key] = builder


def error_response(request) -> tuple[Any, ErrorCode]:
    """(the answer to ``request``, whose handler raised, and the error code chosen)."""
    body = request.body
    code = ErrorCode.invalid_request if has_illegal_null(body) else ErrorCode.unknown_server_error
    if request.api_key == PRODUCE_KEY and getattr(body, "acks", None) == 0:
        # No answer is read for acks=0: Kafka closes the connection so that the producer notices.
        return CloseConnection(f"acks=0 produce failed: {code.name}"), code
    if request.api_key in _BUILDERS:
        return _BUILDERS[request.api_key](request, code), code
    return build(request.codec.response_type, body, code), code

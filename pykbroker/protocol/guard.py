"""The frame guard: every declared length and count in a request body is checked before kio decodes it.

Why: kio 0.6.5's native reader reserves `Vec::with_capacity(count)` for an array before reading a single
element, trusting the count on the wire. A compact array whose length varint is `ff ff ff ff 0f` asks for
2^32-2 elements, a 34 GB reservation; Rust aborts the whole process on the failed allocation (SIGABRT,
"memory allocation of 34359738352 bytes failed"). Legacy int32 counts reserve up to 16 GB the same way.
Strings and byte fields are bounds-checked by kio itself; arrays are not.

What: for each request schema (api, version) a walk is compiled once from kio's entity classes, mirroring
how kio's native reader interprets them (field order, compact vs legacy encodings, nullable structs,
tagged fields). Walking a frame reads only lengths and counts, never builds values, and raises
`MalformedRequest` when
- a field, string, bytes or records length runs past the end of the frame,
- an array count times the smallest encoding of one element exceeds the bytes left (so no count can make
  the decoder reserve more than a few times the frame size),
- a varint is longer than 5 bytes (Kafka's `ByteUtils.readUnsignedVarint` rule), a length is negative
  other than the -1 null marker, or a known tagged field does not fill exactly its declared size.
Unknown tagged fields are skipped by their size, as Kafka does (kio then decides about them).

A request may also name at most MAX_REQUEST_ELEMENTS array elements in all (counted outside tagged
fields). Kafka has no such bound, but a frame within socket.request.max.bytes can otherwise name millions
of tiny elements: a 10 MB Metadata request listing 5,000,000 empty topic names took ~10 s of the event
loop to decode and 313 MB of memory. The bound is far above what any client sends (a Metadata request
naming every topic of a 250,000-topic cluster).

Cost: the walk is generated as Python source, one flat function per schema: consecutive fixed-size fields
are one addition, arrays of fixed-size elements are skipped by multiplication, a records blob (Produce)
is one length read whatever its size, and reading past the end is caught once (IndexError/struct.error)
instead of being tested before every read. It costs about as much as kio's own native decode of the body
for Produce and Fetch requests, and grows with the number of topics and partitions named.
"""

from __future__ import annotations

import dataclasses
import struct
from functools import lru_cache
from typing import Callable

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

# Bytes taken on the wire by Kafka's fixed-size types, as kio names them.
_FIXED_SIZES = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
_VARIABLE_TYPES = ("string", "bytes", "records")


MAX_REQUEST_ELEMENTS = 250_000


class MalformedRequest(ValueError):
    """A declared length or count does not fit the bytes left in the frame."""


def read_uvarint(frame, position: int, end: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes (Kafka's limit) -> (value, next position)."""
    value = 0
    shift = 0
    while position < end:
        byte = frame[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
        if shift == 35:
            raise MalformedRequest(f"varint at byte {position - 5} is longer than 5 bytes")
    raise MalformedRequest("varint runs past the end of the frame")


def _too_many(count: int, element_size: int, position: int, end: int) -> MalformedRequest:
    return MalformedRequest(
        f"array count {count} at byte {position} needs at least {count * element_size} bytes, "
        f"{max(end - position, 0)} left"
    )


def _too_many_elements(position: int) -> MalformedRequest:
    return MalformedRequest(f"the array at byte {position} takes the request past {MAX_REQUEST_ELEMENTS} elements")


def _negative(value: int, position: int) -> MalformedRequest:
    return MalformedRequest(f"negative length or count {value} before byte {position}")


def _tagged_fields(frame, position: int, end: int, count: int, known: dict) -> int:
    """The entries of a tagged-field section (rare on the hot path, so not inlined)."""
    if count * 2 > end - position:  # each entry takes at least a tag byte and a size byte
        raise MalformedRequest(f"{count} tagged fields at byte {position} cannot fit {end - position} bytes")
    for _ in range(count):
        tag, position = read_uvarint(frame, position, end)
        size, position = read_uvarint(frame, position, end)
        stop = position + size
        if stop > end:
            raise MalformedRequest(f"tagged field {tag} of {size} bytes at byte {position} runs past the frame")
        walk = known.get(tag)
        if walk is not None and walk(frame, position, stop) != stop:
            raise MalformedRequest(f"tagged field {tag} at byte {position} does not fill its {size} bytes")
        position = stop
    return position


@dataclasses.dataclass(frozen=True, slots=True)
class _Size:
    """The smallest encoding of a field or struct, and whether every encoding has exactly that size."""

    minimum: int
    exact: bool


def _primitive_size(kafka_type: str, flexible: bool) -> _Size:
    if kafka_type in _FIXED_SIZES:
        return _Size(_FIXED_SIZES[kafka_type], True)
    if kafka_type not in _VARIABLE_TYPES:
        raise TypeError(f"the frame guard does not know kafka type {kafka_type!r}")
    if flexible:
        return _Size(1, False)  # compact length varint
    return _Size(2 if kafka_type == "string" else 4, False)  # int16 / int32 length


@lru_cache(maxsize=None)
def _entity_size(entity_type: type) -> _Size:
    flexible = entity_type.__flexible__
    minimum = 1 if flexible else 0  # the tagged-field count
    exact = not flexible
    for field in dataclasses.fields(entity_type):
        if get_field_tag(field) is None:
            size = _field_size(field, flexible)
            minimum += size.minimum
            exact = exact and size.exact
    return _Size(minimum, exact)


def _field_size(field: dataclasses.Field, flexible: bool) -> _Size:
    kind = classify_field(field)
    if isinstance(kind, (EntityTupleField, PrimitiveTupleField)):
        return _Size(1 if flexible else 4, False)
    if isinstance(kind, EntityField):
        return _Size(1, False) if is_optional(field) else _entity_size(kind.type_)
    return _primitive_size(get_schema_field_type(field), flexible)


class _Compiler:
    """Emits the Python source of one walk; the generated code keeps the position in `p`."""

    def __init__(self, counting: bool = False) -> None:
        self.counting = counting  # the walk keeps `budget`, the elements it may still meet
        self.lines: list[str] = []
        self.names = 0
        self.namespace: dict = {
            "_uvarint": read_uvarint,
            "_i16": struct.Struct(">h").unpack_from,
            "_i32": struct.Struct(">i").unpack_from,
            "_too_many": _too_many,
            "_negative": _negative,
            "_too_many_elements": _too_many_elements,
            "_tagged_fields": _tagged_fields,
            "MalformedRequest": MalformedRequest,
            "StructError": struct.error,
        }

    def fresh(self, prefix: str) -> str:
        self.names += 1
        return f"{prefix}{self.names}"

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def varint(self, indent: int, name: str) -> None:
        self.emit(indent, f"{name} = f[p]")
        self.emit(indent, "p += 1")
        self.emit(indent, f"if {name} > 127:")
        self.emit(indent + 1, f"{name}, p = _uvarint(f, p - 1, end)")

    def variable_bytes(self, indent: int, kafka_type: str, flexible: bool) -> None:
        n = self.fresh("n")
        if flexible:
            self.varint(indent, n)
            self.emit(indent, f"if {n} > 1:")
            self.emit(indent + 1, f"p += {n} - 1")
            return
        width = 2 if kafka_type == "string" else 4
        self.emit(indent, f"{n}, = _i{width * 8}(f, p)")
        self.emit(indent, f"p += {width}")
        self.emit(indent, f"if {n} > 0:")
        self.emit(indent + 1, f"p += {n}")
        self.emit(indent, f"elif {n} < -1:")
        self.emit(indent + 1, f"raise _negative({n}, p)")

    def entity(self, indent: int, entity_type: type) -> None:
        size = _entity_size(entity_type)
        if size.exact:
            self.emit(indent, f"p += {size.minimum}")
            return
        flexible = entity_type.__flexible__
        fixed_run = 0
        known_tags: dict[int, Callable] = {}
        for field in dataclasses.fields(entity_type):
            tag = get_field_tag(field)
            if tag is not None:
                known_tags[tag] = _compile_walk(lambda compiler, f=field: compiler.field(1, f, flexible))
                continue
            field_size = _field_size(field, flexible)
            if field_size.exact:
                fixed_run += field_size.minimum
                continue
            if fixed_run:
                self.emit(indent, f"p += {fixed_run}")
                fixed_run = 0
            self.field(indent, field, flexible)
        if fixed_run:
            self.emit(indent, f"p += {fixed_run}")
        if flexible:
            count = self.fresh("n")
            known = self.fresh("known")
            self.namespace[known] = known_tags
            self.varint(indent, count)
            self.emit(indent, f"if {count}:")
            self.emit(indent + 1, f"p = _tagged_fields(f, p, end, {count}, {known})")

    def field(self, indent: int, field: dataclasses.Field, flexible: bool) -> None:
        kind = classify_field(field)
        if isinstance(kind, (EntityTupleField, PrimitiveTupleField)):
            if isinstance(kind, EntityTupleField):
                element = _entity_size(kind.type_)
            else:
                element = _primitive_size(get_schema_field_type(field), flexible)
            n = self.fresh("n")
            if flexible:
                self.varint(indent, n)
                self.emit(indent, f"if {n} > 1:")
                self.emit(indent + 1, f"{n} -= 1")  # compact arrays store count + 1; 0 is null
            else:
                self.emit(indent, f"{n}, = _i32(f, p)")
                self.emit(indent, "p += 4")
                self.emit(indent, f"if {n} < -1:")
                self.emit(indent + 1, f"raise _negative({n}, p)")
                self.emit(indent, f"if {n} > 0:")
            smallest = max(element.minimum, 1)
            self.emit(indent + 1, f"if {n} * {smallest} > end - p:")
            self.emit(indent + 2, f"raise _too_many({n}, {smallest}, p, end)")
            if self.counting:
                self.emit(indent + 1, f"budget -= {n}")
                self.emit(indent + 1, "if budget < 0:")
                self.emit(indent + 2, "raise _too_many_elements(p)")
            if element.exact:
                self.emit(indent + 1, f"p += {n} * {element.minimum}")
                return
            self.emit(indent + 1, f"for _ in range({n}):")
            if isinstance(kind, EntityTupleField):
                self.entity(indent + 2, kind.type_)
            else:
                self.variable_bytes(indent + 2, get_schema_field_type(field), flexible)
        elif isinstance(kind, EntityField):
            if is_optional(field):  # an int8 marker, -1 for null, then the struct
                self.emit(indent, "p += 1")
                self.emit(indent, "if f[p - 1] != 255:")
                self.entity(indent + 1, kind.type_)
            else:
                self.entity(indent, kind.type_)
        else:
            size = _primitive_size(get_schema_field_type(field), flexible)
            if size.exact:
                self.emit(indent, f"p += {size.minimum}")
            else:
                self.variable_bytes(indent, get_schema_field_type(field), flexible)


def _compile_walk(body: Callable[[_Compiler], None]) -> Callable:
    """walk(frame, position, end) -> position after the part that `body` emits code for."""
    compiler = _Compiler()
    compiler.emit(0, "def walk(f, p, end):")
    body(compiler)
    compiler.emit(1, "return p")
    exec("\n".join(compiler.lines), compiler.namespace)
    return compiler.namespace["walk"]


def compile_request_check(request_type: type) -> Callable[[bytes, int], int]:
    """The guard for one request schema: check(frame, body_start) -> end of the body, or MalformedRequest."""
    return compile_entity_check(request_type, max_elements=MAX_REQUEST_ELEMENTS)


def compile_entity_check(entity_type: type, *, max_elements: int | None) -> Callable[[bytes, int], int]:
    """The same walk for any entity schema (a request, or a response that the broker's own client reads
    from another broker): check(frame, body_start) -> end of the body, or MalformedRequest. max_elements
    bounds the array elements named in all; None leaves only the per-array bound against the bytes left
    (a Metadata or Fetch response of a large cluster names more elements than any request does)."""
    compiler = _Compiler(counting=max_elements is not None)
    compiler.emit(0, "def check(f, p):")
    compiler.emit(1, "end = len(f)")
    if max_elements is not None:
        compiler.emit(1, f"budget = {int(max_elements)}")
    compiler.emit(1, "try:")
    compiler.entity(2, entity_type)
    compiler.emit(1, "except (IndexError, StructError):")
    compiler.emit(2, "raise MalformedRequest('a field runs past the end of the frame') from None")
    compiler.emit(1, "if p > end:")
    compiler.emit(2, "raise MalformedRequest(f'the body needs {p - end} bytes more than the frame holds')")
    compiler.emit(1, "return p")
    exec("\n".join(compiler.lines), compiler.namespace)
    return compiler.namespace["check"]

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
- a string, bytes or records length runs past the end of the frame,
- an array count times the smallest encoding of one element exceeds the bytes left (so no count can make
  the decoder reserve more than a few times the frame size),
- a varint is longer than 5 bytes (Kafka's `ByteUtils.readUnsignedVarint` rule), a length is negative
  other than the -1 null marker, or a known tagged field does not fill exactly its declared size.
Unknown tagged fields are skipped by their size, as Kafka does (kio then decides about them).

Cost: fixed-size fields are coalesced into one step, arrays of fixed-size elements are skipped by
multiplication, and a records blob (Produce) is one length check whatever its size, so the walk costs a
few microseconds per Produce or Fetch request and grows with the number of topics and partitions named.
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

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")

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

# A step advances over one field: (frame, position, end) -> new position, raising MalformedRequest.
Step = Callable[[bytes, int, int], int]


class MalformedRequest(ValueError):
    """A declared length or count does not fit the bytes left in the frame."""


def _overrun(what: str, needed: int, position: int, end: int) -> MalformedRequest:
    return MalformedRequest(f"{what} of {needed} at byte {position} exceeds the {max(end - position, 0)} bytes left")


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


def _skip_fixed(size: int) -> Step:
    def step(frame, position: int, end: int) -> int:
        position += size
        if position > end:
            raise _overrun("fixed fields", size, position - size, end)
        return position

    return step


def _skip_compact_bytes(frame, position: int, end: int) -> int:
    length, position = read_uvarint(frame, position, end)
    if length > 1:
        position += length - 1
        if position > end:
            raise _overrun("compact string/bytes length", length - 1, position - length + 1, end)
    return position


def _skip_legacy(length_struct: struct.Struct) -> Step:
    width = length_struct.size

    def step(frame, position: int, end: int) -> int:
        if position + width > end:
            raise _overrun("length prefix", width, position, end)
        (length,) = length_struct.unpack_from(frame, position)
        position += width
        if length > 0:
            position += length
            if position > end:
                raise _overrun("string/bytes length", length, position - length, end)
        elif length < -1:
            raise MalformedRequest(f"negative length {length} at byte {position - width}")
        return position

    return step


def _array(flexible: bool, element: Step | None, element_size: int, fixed: bool) -> Step:
    """An array of `element`s, each at least `element_size` bytes (exactly, when `fixed`)."""

    def step(frame, position: int, end: int) -> int:
        if flexible:
            count, position = read_uvarint(frame, position, end)
            count -= 1  # compact arrays store count + 1; 0 is null
        else:
            if position + 4 > end:
                raise _overrun("array count", 4, position, end)
            (count,) = _INT32.unpack_from(frame, position)
            position += 4
            if count < -1:
                raise MalformedRequest(f"negative array count {count} at byte {position - 4}")
        if count <= 0:
            return position
        if count * element_size > end - position:
            raise MalformedRequest(
                f"array count {count} at byte {position} needs at least {count * element_size} bytes, "
                f"{end - position} left"
            )
        if fixed:
            return position + count * element_size
        for _ in range(count):
            position = element(frame, position, end)
        return position

    return step


def _tagged_fields(known: dict[int, Step]) -> Step:
    def step(frame, position: int, end: int) -> int:
        count, position = read_uvarint(frame, position, end)
        if count * 2 > end - position:  # each tagged field takes at least a tag and a size byte
            raise MalformedRequest(f"{count} tagged fields at byte {position} cannot fit {end - position} bytes")
        for _ in range(count):
            tag, position = read_uvarint(frame, position, end)
            size, position = read_uvarint(frame, position, end)
            stop = position + size
            if stop > end:
                raise _overrun(f"tagged field {tag} size", size, position, end)
            walk = known.get(tag)
            if walk is not None and walk(frame, position, stop) != stop:
                raise MalformedRequest(f"tagged field {tag} at byte {position} does not fill its {size} bytes")
            position = stop
        return position

    return step


def _sequence(steps: list[Step]) -> Step:
    if len(steps) == 1:
        return steps[0]

    def step(frame, position: int, end: int) -> int:
        for one in steps:
            position = one(frame, position, end)
        return position

    return step


@dataclasses.dataclass(frozen=True)
class _Shape:
    """How to walk one field or struct: its step, its smallest encoding, and whether that size is exact."""

    step: Step | None
    min_size: int
    fixed: bool


def _nullable(shape: _Shape) -> _Shape:
    """A nullable struct field: an int8 marker, -1 for null, then the struct."""

    walk = shape.step or _skip_fixed(shape.min_size)

    def step(frame, position: int, end: int) -> int:
        if position >= end:
            raise _overrun("null marker", 1, position, end)
        position += 1
        if frame[position - 1] == 0xFF:
            return position
        return walk(frame, position, end)

    return _Shape(step, 1, False)


def _primitive(kafka_type: str, flexible: bool) -> _Shape:
    if kafka_type in _FIXED_SIZES:
        return _Shape(None, _FIXED_SIZES[kafka_type], True)
    if kafka_type not in _VARIABLE_TYPES:
        raise TypeError(f"the frame guard does not know kafka type {kafka_type!r}")
    if flexible:
        return _Shape(_skip_compact_bytes, 1, False)
    if kafka_type == "string":
        return _Shape(_skip_legacy(_INT16), 2, False)
    return _Shape(_skip_legacy(_INT32), 4, False)


def _field_shape(field: dataclasses.Field, flexible: bool) -> _Shape:
    kind = classify_field(field)
    if isinstance(kind, (EntityField, EntityTupleField)):
        shape = _entity_shape(kind.type_)
        if isinstance(kind, EntityField) and is_optional(field):
            shape = _nullable(shape)
    else:
        shape = _primitive(get_schema_field_type(field), flexible)
    if isinstance(kind, (EntityTupleField, PrimitiveTupleField)):
        element = shape.step or _skip_fixed(shape.min_size)
        return _Shape(_array(flexible, element, shape.min_size, shape.fixed), 1 if flexible else 4, False)
    return shape


@lru_cache(maxsize=None)
def _entity_shape(entity_type: type) -> _Shape:
    flexible = entity_type.__flexible__
    steps: list[Step] = []
    fixed_run = 0  # bytes of consecutive fixed-size fields, skipped in one step
    min_size = 0
    tagged: dict[int, Step] = {}
    for field in dataclasses.fields(entity_type):
        shape = _field_shape(field, flexible)
        tag = get_field_tag(field)
        if tag is not None:
            tagged[tag] = shape.step or _skip_fixed(shape.min_size)
            continue
        min_size += shape.min_size
        if shape.fixed:
            fixed_run += shape.min_size
            continue
        if fixed_run:
            steps.append(_skip_fixed(fixed_run))
            fixed_run = 0
        steps.append(shape.step)
    if flexible:
        if fixed_run:
            steps.append(_skip_fixed(fixed_run))
            fixed_run = 0
        steps.append(_tagged_fields(tagged))
        min_size += 1
    if not steps:  # a struct of fixed-size fields only: its size is exact
        return _Shape(None, fixed_run, True)
    if fixed_run:
        steps.append(_skip_fixed(fixed_run))
    return _Shape(_sequence(steps), min_size, False)


def compile_request_check(request_type: type) -> Callable[[bytes, int], int]:
    """The guard for one request schema: check(frame, body_start) -> end of the body, or MalformedRequest."""
    shape = _entity_shape(request_type)
    walk = shape.step or _skip_fixed(shape.min_size)

    def check(frame, position: int) -> int:
        return walk(frame, position, len(frame))

    return check

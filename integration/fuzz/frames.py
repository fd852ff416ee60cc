"""Mutation fuzzing of request frames: a corpus of valid frames for every advertised API and version,
seeded mutations of them, an in-process decode loop and an asyncio sender that fires them at a broker.

Corpus. Every request captured from real clients in protocol_specs/fixtures/wire-captures/ whose API and
version the broker advertises, plus, for every advertised (api, version) of protocol_specs/api_support.json,
a few requests built from kio's schema entities with seeded values (arrays of 0-3 elements, nulls where the
schema allows them, a real record batch in `records` fields). Every corpus frame decodes cleanly.

Mutations (1 to 3 per frame, chosen by the frame's own random generator): bit flips, byte changes to
random or boundary values, length/count rewrites at a random position (compact varints such as
`ff ff ff ff 0f`, int16/int32 -1 nulls, 0x7fffffff), truncations, extensions (random tail, a duplicated
chunk, inserted bytes). The api key and version are left intact 19 times out of 20 so that the frame
reaches that version's decoder. Frame `index` of run `seed` is a pure function of (seed, index): any
frame can be rebuilt alone to replay a failure.

Nothing here knows how the broker decodes; the guard and decoder are exercised only through
`decode_request` (in process) or a socket (against a broker).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import io
import json
import random
import struct
import uuid
from collections import Counter
from pathlib import Path
from typing import Iterable

from kio.schema.errors import ErrorCode
from kio.serial import entity_writer
from kio.serial import _introspect as introspect
from kio.static.primitive import i32Timedelta, i64Timedelta

from pykbroker.protocol.apis import SUPPORTED_APIS, codec_for
from pykbroker.protocol.framing import FrameError, decode_request, read_prefix
from pykbroker.protocol.records import build_batch

REPO_ROOT = Path(__file__).resolve().parents[2]
CAPTURES = REPO_ROOT / "protocol_specs" / "fixtures" / "wire-captures"
GENERATED_PER_VERSION = 3
CORPUS_SEED = 20261125  # the corpus is fixed; run seeds only choose and mutate frames

_INT_RANGES = {"int8": 7, "int16": 15, "int32": 31, "int64": 63, "uint16": 16}
# Lengths and counts that once made a decoder allocate, in each encoding.
_HOSTILE_LENGTHS = (
    b"\xff\xff\xff\xff\x0f", b"\xfe\xff\xff\xff\x0f", b"\xff\xff\xff\xff\x07", b"\x80\x80\x80\x80\x08",
    b"\xff\xff\xff\x7f", b"\xff\xff\xff\xff\xff", b"\x00", b"\x01", b"\x7f",
    b"\xff\xff", b"\x7f\xff", b"\x80\x00",
    b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x80\x00\x00\x00", b"\x00\x00\xff\xff", b"\x00\x01\x00\x00",
)


# -- corpus --------------------------------------------------------------------------------------------


def _advertised(api_key: int, version: int) -> bool:
    support = SUPPORTED_APIS.get(api_key)
    return support is not None and support.supports(version)


def captured_frames(directory: Path = CAPTURES) -> list[bytes]:
    """Request frames (no size prefix) from the capture files, advertised APIs/versions only."""
    frames = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("dir") == "request" and _advertised(entry["api_key"], entry["api_version"]):
                frames.append(bytes.fromhex(entry["hex"]))
    return frames


def _primitive_value(kafka_type: str, rng: random.Random):
    if kafka_type in _INT_RANGES:
        bits = _INT_RANGES[kafka_type]
        if kafka_type == "uint16":
            return rng.randrange(1 << 16)
        return rng.choice((0, 1, -1, rng.randrange(100), rng.randrange(-(1 << bits), 1 << bits)))
    if kafka_type == "bool":
        return rng.random() < 0.5
    if kafka_type == "float64":
        return rng.uniform(-1e6, 1e6)
    if kafka_type == "uuid":
        return uuid.UUID(int=rng.getrandbits(128))
    if kafka_type == "string":
        return "fz-" + "".join(rng.choice("abcdefghij._-") for _ in range(rng.randrange(1, 12)))
    if kafka_type == "bytes":
        return rng.randbytes(rng.randrange(0, 24))
    if kafka_type == "records":
        records = [(rng.randbytes(4), rng.randbytes(rng.randrange(0, 40))) for _ in range(rng.randrange(1, 4))]
        return bytes(build_batch(records, timestamp_ms=rng.randrange(1 << 40)))
    if kafka_type == "error_code":
        return ErrorCode.none
    if kafka_type == "timedelta_i32":
        return i32Timedelta.parse(datetime.timedelta(milliseconds=rng.randrange(0, 5000)))
    if kafka_type == "timedelta_i64":
        return i64Timedelta.parse(datetime.timedelta(milliseconds=rng.randrange(0, 5000)))
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(rng.randrange(1 << 31), tz=datetime.timezone.utc)
    raise TypeError(f"no generator for kafka type {kafka_type!r}")


def build_entity(entity_type: type, rng: random.Random):
    """An instance of a kio entity with seeded values: arrays of 0-3 elements, some nulls."""
    values = {}
    for field in dataclasses.fields(entity_type):
        if field.name.startswith("__"):
            continue
        kind = introspect.classify_field(field)
        nullable = introspect.is_optional(field) and introspect.get_field_tag(field) is None
        if nullable and rng.random() < 0.2:
            values[field.name] = None
        elif isinstance(kind, introspect.EntityTupleField):
            values[field.name] = tuple(build_entity(kind.type_, rng) for _ in range(rng.randrange(4)))
        elif isinstance(kind, introspect.PrimitiveTupleField):
            kafka_type = introspect.get_schema_field_type(field)
            values[field.name] = tuple(_primitive_value(kafka_type, rng) for _ in range(rng.randrange(4)))
        elif isinstance(kind, introspect.EntityField):
            values[field.name] = build_entity(kind.type_, rng)
        else:
            values[field.name] = _primitive_value(introspect.get_schema_field_type(field), rng)
    return entity_type(**values)


def request_frame(body, correlation_id: int, client_id: str | None = "fuzz") -> bytes:
    """Header (v1 or v2, as the request's schema says) + body, without the size prefix."""
    header_type = type(body).__header_schema__
    out = io.BytesIO()
    entity_writer(header_type)(out, header_type(
        request_api_key=body.__api_key__, request_api_version=body.__version__,
        correlation_id=correlation_id, client_id=client_id))
    entity_writer(type(body))(out, body)
    return out.getvalue()


def generated_frames(per_version: int = GENERATED_PER_VERSION, seed: int = CORPUS_SEED) -> list[bytes]:
    """`per_version` frames for every advertised (api, version), built from kio's request schemas."""
    rng = random.Random(seed)
    frames = []
    for api in sorted(SUPPORTED_APIS.values(), key=lambda a: a.key):
        for version in range(api.min_version, api.max_version + 1):
            schema = codec_for(api.key, version).request_type  # kio's, or the generated inter-broker ones
            for _ in range(per_version):
                frames.append(request_frame(build_entity(schema, rng), rng.randrange(1 << 31)))
    return frames


def corpus() -> list[bytes]:
    """The valid frames mutations start from: captured ones first, then generated ones."""
    return captured_frames() + generated_frames()


def covered_versions(frames: Iterable[bytes]) -> set[tuple[int, int]]:
    return {struct.unpack_from(">hh", frame) for frame in frames}


# -- mutations -----------------------------------------------------------------------------------------


def _body_position(frame: bytearray, rng: random.Random) -> int:
    """A position to mutate: past the api key and version 19 times out of 20."""
    low = 0 if rng.random() < 0.05 else min(4, len(frame) - 1)
    return rng.randrange(low, len(frame))


def _flip_bits(frame: bytearray, rng: random.Random) -> str:
    position = _body_position(frame, rng)
    bit = rng.randrange(8)
    frame[position] ^= 1 << bit
    return f"flip bit {bit} at {position}"


def _set_byte(frame: bytearray, rng: random.Random) -> str:
    position = _body_position(frame, rng)
    frame[position] = rng.choice((0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF, rng.randrange(256)))
    return f"set byte {position} to {frame[position]:#04x}"


def _rewrite_length(frame: bytearray, rng: random.Random) -> str:
    position = _body_position(frame, rng)
    value = rng.choice(_HOSTILE_LENGTHS)
    if rng.random() < 0.5:
        frame[position:position + len(value)] = value
        return f"overwrite {value.hex()} at {position}"
    frame[position:position] = value
    return f"insert {value.hex()} at {position}"


def _truncate(frame: bytearray, rng: random.Random) -> str:
    keep = rng.randrange(len(frame))
    del frame[keep:]
    return f"truncate to {keep}"


def _extend(frame: bytearray, rng: random.Random) -> str:
    choice = rng.randrange(3)
    if choice == 0:
        tail = rng.randbytes(rng.randrange(1, 32))
        frame += tail
        return f"append {len(tail)} random bytes"
    start = rng.randrange(len(frame))
    chunk = bytes(frame[start:start + rng.randrange(1, 16)])
    position = _body_position(frame, rng)
    frame[position:position] = chunk if choice == 1 else rng.randbytes(len(chunk))
    return f"insert {len(chunk)} {'copied' if choice == 1 else 'random'} bytes at {position}"


MUTATIONS = (_flip_bits, _set_byte, _rewrite_length, _truncate, _extend)


def fuzz_frame(frames: list[bytes], seed: int, index: int) -> tuple[bytes, str]:
    """Frame `index` of the run `seed`: a corpus frame with 1-3 mutations, and what was done to it."""
    rng = random.Random(seed * 1_000_003 + index)
    base = rng.randrange(len(frames))
    frame = bytearray(frames[base])
    steps = [f"corpus[{base}]"]
    for _ in range(rng.choice((1, 1, 2, 3))):
        if not frame:
            break
        steps.append(rng.choice(MUTATIONS)(frame, rng))
    return bytes(frame), "; ".join(steps)


# -- in process ----------------------------------------------------------------------------------------


def decode_fuzz(seed: int, count: int) -> Counter:
    """Run `count` fuzzed frames through read_prefix + decode_request; any error other than FrameError
    propagates (a guard or decoder bug). Returns how many were decoded and refused."""
    frames = corpus()
    outcome: Counter = Counter()
    for index in range(count):
        frame, _ = fuzz_frame(frames, seed, index)
        try:
            decode_request(frame, read_prefix(frame))
            outcome["decoded"] += 1
        except FrameError:
            outcome["refused"] += 1
    return outcome


# -- against a broker ----------------------------------------------------------------------------------


@dataclasses.dataclass
class SendStats:
    sent: int = 0
    answered: int = 0
    closed: int = 0  # the broker closed the connection after the frame
    unanswered: int = 0  # no answer within the wait (a long poll, a parked join...): we closed
    connect_errors: int = 0


async def _send_one(address: tuple[str, int], frame: bytes, answer_wait: float, stats: SendStats) -> None:
    try:
        reader, writer = await asyncio.open_connection(*address)
    except OSError:
        stats.connect_errors += 1
        return
    try:
        writer.write(struct.pack(">i", len(frame)) + frame)
        stats.sent += 1
        try:
            size = await asyncio.wait_for(reader.readexactly(4), answer_wait)
            await asyncio.wait_for(reader.readexactly(struct.unpack(">i", size)[0]), answer_wait)
            stats.answered += 1
        except asyncio.IncompleteReadError:
            stats.closed += 1
        except (asyncio.TimeoutError, ConnectionError):
            stats.unanswered += 1
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass


async def send_frames(address: tuple[str, int], frames: list[bytes], seed: int, indexes: range, *,
                      concurrency: int = 8, answer_wait: float = 0.5, stats: SendStats | None = None) -> SendStats:
    """Send fuzzed frames `indexes` of run `seed`, each on its own connection, `concurrency` at a time.
    A connection per frame means each frame meets a fresh connection and a closed one costs nothing."""
    stats = stats or SendStats()
    queue = iter(indexes)

    async def worker() -> None:
        for index in queue:
            frame, _ = fuzz_frame(frames, seed, index)
            await _send_one(address, frame, answer_wait, stats)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return stats


def read_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")

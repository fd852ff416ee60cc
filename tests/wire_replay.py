"""Replay real client conversations (captured against Apache Kafka 3.7.1) against a broker under test,
and compare the broker's answers with Kafka's, by structure.

The captures live in protocol_specs/fixtures/wire-captures/ (index.md there explains them). One file is
one scenario: one stock client (Java, Spark, kafka-python, librdkafka, aiokafka, kcat, KafkaJS, Kafka's
CLI) doing one job. Replaying one file:

1. Preconditions (the captures do not contain the setup traffic): create the scenario topic with 3
   partitions and write the records the scenario expects to find. Those records are taken from the
   captured Fetch responses themselves (same keys, values and batch boundaries per partition), minus
   what the file's own Produce requests wrote; the rare file that never fetches gets records generated
   the way the capture's setup helper made them. Data written between phases (files 07 and 10) is
   written when the replay reaches the seq where it happened.
2. One TCP connection per captured `conn`; every frame in `seq` order: a request line sends the request,
   a response line reads that connection's next answer. Requests the capture shows in flight together
   are sent before the earlier answer is read (pipelining), because that is the order of the lines.
3. Values the broker assigns are patched into later requests: topic ids (from its Metadata/CreateTopics
   answers), current leader epochs, producer id/epoch (batch CRC32C recomputed), member id and
   generation (JoinGroup), fetch session id/epoch. A broker that answers fetch session id 0 (no
   sessions, which the Java client accepts) gets what the Java client would then send: full fetches
   (session 0, epoch 0, all partitions), and a close as session 0 / epoch -1. Producer ids and epochs
   are mapped as pairs, (captured id, captured epoch) -> (broker's id, broker's epoch), learned from
   InitProducerId answers: a transactional id fenced by a second producer keeps its id and gets a new
   epoch, and the old producer's requests must keep the old epoch (file 17). They are patched in batches
   and in the transaction requests' producer id/epoch fields.
   Transactions (file 17): the capture also holds Kafka's own broker-to-broker traffic (the transaction
   marker sender's WriteTxnMarkers, the partition leaders' AddPartitionsToTxn verify_only): those
   connections are not replayed. Where Kafka's answer to a marker request was seen, the replay waits
   until the broker under test has completed that transaction (DescribeTransactions, if advertised, no
   longer says Prepare*, and ListOffsets read_committed LATEST equals read_uncommitted LATEST on the
   marker's partitions), since every later request of the capture was sent after that point.
4. Both answers are decoded with kio (no bytes may be left over) and compared: error codes at every
   level, the same topics/partitions (as sets, same lengths), offsets and high watermarks, and the
   fetched batches (offsets, counts, codec, sequences, keys, values, headers). Values that only say
   which broker answered are ignored (node ids, hosts, ports, cluster id, topic/member/producer/session
   ids, timestamps, throttle time, leader epochs, error messages).
5. A request whose API/version the broker does not advertise is not sent (a real client would not send
   it) and is reported; so is every difference, with file, seq, connection, API and path.
6. A broker that refuses transactions outright (FindCoordinator for a transactional id, or InitProducerId
   with one, answered with anything but success or a retriable error) cannot be brought into file 17's
   starting state: `TransactionsRefused` says so with the broker's answer (the test fails on it).

The result is a `ReplayResult`: its `differences` say precisely where the broker and Kafka disagree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import json
import re
import socket
import struct
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.join_group.v9.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.leave_group.v5.request import LeaveGroupRequest, MemberIdentity
from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.offset_commit.v9.request import (
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic)
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.sync_group.v5.request import SyncGroupRequest, SyncGroupRequestAssignment
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from pykbroker.protocol import control_records
from pykbroker.protocol import records as batches

CAPTURE_DIR = Path(__file__).resolve().parents[1] / "protocol_specs" / "fixtures" / "wire-captures"

API_VERSIONS_KEY = 18
DESCRIBE_LOG_DIRS_KEY = 35
INIT_PRODUCER_ID_KEY = 22
WRITE_TXN_MARKERS_KEY = 27
DESCRIBE_TRANSACTIONS_KEY = 65
UNSUPPORTED_VERSION = 35
ZERO_UUID = uuid.UUID(int=0)

# Record batch v2 header fields the replay patches (layout documented in pykbroker/protocol/records.py).
_PRODUCER_ID_AND_EPOCH = struct.Struct(">qh")
_PRODUCER_ID_POSITION = 43
_CRC_POSITION = 17
_UINT32 = struct.Struct(">I")
_INT32 = struct.Struct(">i")
_ERROR_AND_CORRELATION = struct.Struct(">ih")

# Kafka's own connections in the captures (index.md, file 17): the transaction coordinator's marker sender
# and the partition leaders' transaction verification (KIP-890). A client never sends these; they are not
# replayed, and Kafka's answers to the marker requests are points the replay waits for (module docstring).
BROKER_INTERNAL_CLIENT_IDS = (re.compile(r"^broker-\d+-txn-marker-sender$"),
                              re.compile(r"^AddPartitionsManager-client-\d+$"))
# Topic names of the scenarios all start like this (s01-…, s07b-…).
_SCENARIO_TOPIC = re.compile(r"^s\d\d[a-z]?-")
_PER_PARTITION = re.compile(r"\[(partition_index|partition|index)=\d+\]")
_UUID_SUFFIX = re.compile(r"-?[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


# ---------------------------------------------------------------------------------------------------
# Captures


@dataclass(frozen=True)
class Frame:
    """One line of a capture file: a request or a response frame (without its 4-byte size prefix)."""

    conn: int
    seq: int
    direction: str
    api_key: int
    api_name: str
    api_version: int
    correlation_id: int
    client_id: str | None
    payload: bytes
    summary: str

    @property
    def is_request(self) -> bool:
        return self.direction == "request"

    @property
    def api(self) -> str:
        return f"{self.api_name} v{self.api_version}"


@dataclass
class Capture:
    path: Path
    frames: list[Frame]

    @property
    def name(self) -> str:
        return self.path.name

    def requests(self) -> Iterator[Frame]:
        return (frame for frame in self.frames if frame.is_request)

    def responses(self) -> Iterator[Frame]:
        return (frame for frame in self.frames if not frame.is_request)

    def response_to(self, request: Frame) -> Frame | None:
        for frame in self.frames:
            if (not frame.is_request and frame.conn == request.conn
                    and frame.correlation_id == request.correlation_id and frame.seq > request.seq):
                return frame
        return None

    def broker_internal_conns(self) -> set[int]:
        """Connections a broker opened to itself (BROKER_INTERNAL_CLIENT_IDS): not a client's conversation."""
        return {frame.conn for frame in self.requests()
                if frame.client_id and any(p.match(frame.client_id) for p in BROKER_INTERNAL_CLIENT_IDS)}

    def transactional_ids(self) -> dict[int, str]:
        """Captured producer id -> the transactional id it was given for (successful InitProducerId)."""
        found = {}
        for request in self.requests():
            if request.api_key != INIT_PRODUCER_ID_KEY:
                continue
            _, body = decode_request(request.payload)
            answer = self.response_to(request)
            if body.transactional_id is None or answer is None:
                continue
            _, response = decode_response(answer.api_key, answer.api_version, answer.payload)
            if response.error_code == ErrorCode.none:
                found[response.producer_id] = body.transactional_id
        return found

    def scenario_topics(self) -> set[str]:
        """Topic names the clients of this file asked for (so not the other topics a Kafka
        Metadata-for-all-topics answer happened to list)."""
        names: set[str] = set()
        for frame in self.requests():
            _, body = decode_request(frame.payload)
            names.update(value for value in _string_fields(body, ("name", "topic", "resource_name"))
                         if _SCENARIO_TOPIC.match(value))
        return names


def load_capture(path: Path | str) -> Capture:
    frames = []
    with open(path) as lines:
        for line in lines:
            raw = json.loads(line)
            frames.append(Frame(
                conn=raw["conn"], seq=raw["seq"], direction=raw["dir"], api_key=raw["api_key"],
                api_name=raw["api_name"], api_version=raw["api_version"],
                correlation_id=raw["correlation_id"], client_id=raw["client_id"],
                payload=bytes.fromhex(raw["hex"]), summary=raw["summary"]))
    frames.sort(key=lambda frame: frame.seq)
    return Capture(Path(path), frames)


def capture_paths(directory: Path = CAPTURE_DIR) -> list[Path]:
    return sorted(directory.glob("*.jsonl"))


def _string_fields(entity, names: tuple[str, ...]) -> Iterator[str]:
    for item in _walk_entities(entity):
        for name in names:
            value = getattr(item, name, None)
            if isinstance(value, str):
                yield value


def _walk_entities(entity) -> Iterator[Any]:
    yield entity
    for f in dataclasses.fields(entity):
        value = getattr(entity, f.name)
        if dataclasses.is_dataclass(value):
            yield from _walk_entities(value)
        elif isinstance(value, tuple):
            for item in value:
                if dataclasses.is_dataclass(item):
                    yield from _walk_entities(item)


# ---------------------------------------------------------------------------------------------------
# kio: decode and encode whole frames


class DecodeError(ValueError):
    """A frame is not a valid message at its API version (or leaves bytes over)."""


def decode_request(payload: bytes):
    """(header, body) of a request frame, decoded at the version its header names."""
    if len(payload) < 4:
        raise DecodeError(f"request frame of {len(payload)} bytes has no header")
    api_key, api_version = struct.unpack_from(">hh", payload)
    schema = load_request_schema(api_key, api_version)
    return _decode(schema, payload)


def decode_response(api_key: int, api_version: int, payload: bytes):
    """(header, body) of a response frame to a request of `api_key` at `api_version`.

    An ApiVersions answer with UNSUPPORTED_VERSION is decoded as v0, whatever version was asked for:
    that is the KIP-511 fallback every broker uses so the client can retry with a version it knows.
    """
    if api_key == API_VERSIONS_KEY and len(payload) >= 6:
        (_, error_code) = _ERROR_AND_CORRELATION.unpack_from(payload)
        if error_code == UNSUPPORTED_VERSION:
            api_version = 0
    return _decode(load_response_schema(api_key, api_version), payload)


def _decode(schema, payload: bytes):
    try:
        header, header_size = entity_reader(schema.__header_schema__)(payload, 0)
        body, body_size = entity_reader(schema)(payload, header_size)
    except Exception as exc:  # kio raises several types for malformed input; all mean "does not decode"
        raise DecodeError(f"{schema.__name__} v{schema.__version__}: {exc!r}") from exc
    if header_size + body_size != len(payload):
        raise DecodeError(f"{schema.__name__} v{schema.__version__}: "
                          f"{len(payload) - header_size - body_size} bytes left over")
    return header, body


def encode(header, body) -> bytes:
    out = io.BytesIO()
    entity_writer(type(header))(out, header)
    entity_writer(type(body))(out, body)
    return out.getvalue()


# ---------------------------------------------------------------------------------------------------
# Comparing one response with Kafka's


@dataclass(frozen=True)
class Finding:
    """One difference inside one response. severity "mismatch" fails a test; "note" is information
    about broker state that legitimately differs (e.g. which configs a broker lists)."""

    path: str
    expected: Any
    got: Any
    severity: str = "mismatch"


# Values that say which broker answered, not what it answered (index.md, "Ignore values specific to the
# broker"); field names are Kafka's, so one list serves every API.
IGNORED_FIELDS = frozenset({
    "throttle_time", "error_message", "node_id", "broker_id", "host", "port", "rack", "cluster_id",
    "controller_id", "leader_id", "leader_epoch", "current_leader", "committed_leader_epoch",
    "diverging_epoch", "log_append_time", "producer_id", "producer_epoch", "node_endpoints",
    # DescribeLogDirs: the data directory's path and its disk's size and free space are the machine's.
    "log_dir", "total_bytes", "usable_bytes",
})
# Arrays of node ids: only their length says something about the partition (RF 1 = one replica).
NODE_ID_LISTS = frozenset({"replica_nodes", "isr_nodes", "offline_replicas", "eligible_leader_replicas",
                           "last_known_elr"})
# ApiVersions: the supported range list is broker-specific; it is checked against the versions used.
API_VERSIONS_IGNORED = frozenset({"api_keys", "supported_features", "finalized_features_epoch",
                                  "finalized_features", "zk_migration_ready"})
MEMBER_ID_FIELDS = frozenset({"member_id", "leader"})
# Broker-state lists (all configs of a topic): names present on one side only are notes.
CONFIG_LISTS = frozenset({"configs"})
# Within a config entry: where a value comes from depends on how each broker was configured (Kafka's
# capture broker ran with the shipped server.properties, which sets log.retention.hours and
# log.segment.bytes: source 4, STATIC_BROKER_CONFIG), and synonyms list those broker settings.
CONFIG_NOTE_FIELDS = frozenset({"synonyms", "documentation", "config_source"})
# Configs whose default pykbroker changes on purpose, each with the reason; their values are notes.
DELIBERATE_CONFIG_DEFAULTS = {
    "flush.ms": "pykbroker's default --fsync interval flushes every log.flush.interval.ms=1000; Kafka never fsyncs",
    "log.flush.interval.ms": "the broker-wide side of flush.ms, same reason",
    "queued.max.request.bytes": "pykbroker bounds the request bytes being received (200 MiB, config.py); "
                                "Kafka's -1 is unbounded",
}
# A broker config whose value Kafka took from the capture broker's server.properties (config_source 4,
# STATIC_BROKER_CONFIG: listeners, advertised.listeners, listener.security.protocol.map,
# inter.broker.listener.name, ...) describes that file, not Kafka's behaviour: its value is a note.
STATIC_BROKER_CONFIG_SOURCE = 4
# Broker configs Kafka 3.7.1 can change at runtime (read_only=false) that pykbroker reads at start only, so
# it says read_only=true and refuses to alter them (pykbroker/config.py, DYNAMIC_BROKER_CONFIG_NAMES).
START_ONLY_BROKER_CONFIGS = frozenset({
    "listeners", "advertised.listeners", "listener.security.protocol.map", "max.connections",
    "max.connections.per.ip", "num.replica.fetchers", "producer.id.expiration.ms",
    "unclean.leader.election.enable",
})
# Fields that identify an element of an array, in order of preference.
KEY_FIELDS = ("name", "topic", "topic_id", "resource_name", "partition_index", "partition", "index", "key",
              "group_id", "api_key")


@dataclass
class CompareContext:
    """What the comparison needs to know beyond the two answers."""

    scenario_topics: set[str] = field(default_factory=set)
    captured_topic_names: dict[uuid.UUID, str] = field(default_factory=dict)
    actual_topic_ids: dict[str, uuid.UUID] = field(default_factory=dict)
    all_topics_metadata: bool = False  # a Metadata request for every topic: only scenario topics count
    requested_version: int = 0
    producer_ids: dict[int, set[int]] = field(default_factory=dict)  # captured producer id -> the broker's

    def topic_label(self, topic_id: uuid.UUID) -> str:
        return self.captured_topic_names.get(topic_id) or str(topic_id)

    def actual_topic_id(self, captured_id: uuid.UUID) -> uuid.UUID | None:
        name = self.captured_topic_names.get(captured_id)
        return self.actual_topic_ids.get(name) if name else None


def compare_responses(api_key: int, expected, actual, ctx: CompareContext) -> list[Finding]:
    findings: list[Finding] = []
    if api_key == API_VERSIONS_KEY:
        return _compare_api_versions(expected, actual, ctx)
    if type(expected).__name__ != type(actual).__name__:
        return [Finding("response", type(expected).__name__, type(actual).__name__)]
    if api_key == 3 and ctx.all_topics_metadata:
        expected = _only_scenario_topics(expected, ctx)
        actual = _only_scenario_topics(actual, ctx)
    _compare_entity(expected, actual, "", ctx, findings)
    if api_key == DESCRIBE_LOG_DIRS_KEY:
        findings = [_setup_topic_size_as_note(finding, ctx) for finding in findings]
    return findings


_LOG_DIR_PARTITION_SIZE = re.compile(r"\.topics\[name=(?P<topic>[^\]]+)\]\.partitions\[[^\]]*\]\.partition_size$")


def _setup_topic_size_as_note(finding: Finding, ctx: CompareContext) -> Finding:
    """DescribeLogDirs: the size of a topic the scenario did not use (its setup data, `__consumer_offsets`
    with the coordinator's own records in its own layout) says nothing about the scenario: a note."""
    match = _LOG_DIR_PARTITION_SIZE.search(finding.path)
    if match and match["topic"] not in ctx.scenario_topics:
        return dataclasses.replace(finding, severity="note")
    return finding


def _only_scenario_topics(response, ctx: CompareContext):
    return dataclasses.replace(response, topics=tuple(
        topic for topic in response.topics if topic.name in ctx.scenario_topics))


def _compare_api_versions(expected, actual, ctx: CompareContext) -> list[Finding]:
    """KIP-511: UNSUPPORTED_VERSION (in a v0 body) exactly when the asked version is not supported."""
    findings = []
    requested = ctx.requested_version
    advertised = {entry.api_key: (entry.min_version, entry.max_version) for entry in actual.api_keys}
    own_range = advertised.get(API_VERSIONS_KEY)
    supported = own_range is not None and own_range[0] <= requested <= own_range[1]
    if actual.error_code == UNSUPPORTED_VERSION:
        if supported:
            findings.append(Finding("error_code", f"none (v{requested} is inside the advertised "
                                    f"ApiVersions range v{own_range[0]}-{own_range[1]})", _fmt(actual.error_code)))
        elif expected.error_code != UNSUPPORTED_VERSION:
            findings.append(Finding("error_code", _fmt(expected.error_code), _fmt(actual.error_code)))
    elif actual.error_code == ErrorCode.none:
        if not supported:
            findings.append(Finding("api_keys[18]", f"a range including v{requested} (the version just answered)",
                                    own_range and f"v{own_range[0]}-{own_range[1]}"))
        elif expected.error_code == UNSUPPORTED_VERSION:
            findings.append(Finding("error_code", "unsupported_version(35) from Kafka 3.7.1",
                                    f"none: broker supports ApiVersions v{requested}", severity="note"))
    else:
        findings.append(Finding("error_code", _fmt(expected.error_code), _fmt(actual.error_code)))
    if not advertised:
        findings.append(Finding("api_keys", "a non-empty list", "[]"))
    return findings


def _compare_entity(expected, actual, path: str, ctx: CompareContext, out: list[Finding],
                    note_only: bool = False) -> None:
    for f in dataclasses.fields(expected):
        name = f.name
        here = f"{path}.{name}" if path else name
        if name == "producer_id" and ".aborted_transactions[" in here:
            # Fetch read_committed: which producer's transaction was aborted. Producer ids are the broker's
            # own, so the broker's must be the one it gave the producer Kafka names here.
            mapped = ctx.producer_ids.get(getattr(expected, name))
            if mapped is not None and getattr(actual, name, None) not in mapped:
                out.append(Finding(here, f"a producer id given for Kafka's {getattr(expected, name)}: "
                                         f"{sorted(mapped)}", getattr(actual, name, None)))
            continue
        if name in IGNORED_FIELDS:
            continue
        exp = getattr(expected, name)
        act = getattr(actual, name, _MISSING)
        if act is _MISSING:
            out.append(Finding(here, "present", "absent from the response schema"))
            continue
        severity = "note" if note_only or name in CONFIG_NOTE_FIELDS else "mismatch"
        if name == "session_id":
            # Fetch sessions: a broker may answer 0 (no session, full fetches every time); a session the
            # client did not ask for, or one after a close, is still wrong.
            if exp == 0 and act != 0:
                out.append(Finding(here, 0, act))
        elif name == "topic_id":
            if (exp == ZERO_UUID) != (act == ZERO_UUID):
                out.append(Finding(here, "zero uuid" if exp == ZERO_UUID else "a topic id",
                                   str(act)))
        elif name in MEMBER_ID_FIELDS and isinstance(exp, str):
            if _member_prefix(exp) != _member_prefix(act if isinstance(act, str) else ""):
                out.append(Finding(here, exp, act, severity))
        elif name in NODE_ID_LISTS:
            if len(exp or ()) != len(act or ()):
                out.append(Finding(f"{here} length", len(exp or ()), len(act or ()), severity))
        elif name == "records" and (isinstance(exp, (bytes, bytearray)) or isinstance(act, (bytes, bytearray))):
            _compare_records(exp, act, here, out)
        elif name in CONFIG_LISTS and isinstance(exp, tuple):
            _compare_configs(exp, act, here, ctx, out)
        else:
            _compare_value(exp, act, here, ctx, out, severity)


def _compare_value(exp, act, path: str, ctx: CompareContext, out: list[Finding], severity: str) -> None:
    if exp is None or act is None:
        if (exp is None) != (act is None):
            out.append(Finding(path, _fmt(exp), _fmt(act), severity))
        return
    if dataclasses.is_dataclass(exp):
        _compare_entity(exp, act, path, ctx, out, note_only=severity == "note")
    elif isinstance(exp, tuple):
        _compare_array(exp, act, path, ctx, out, severity)
    elif _norm(exp) != _norm(act):
        out.append(Finding(path, _fmt(exp), _fmt(act), severity))


def _compare_array(exp: tuple, act, path: str, ctx: CompareContext, out: list[Finding], severity: str) -> None:
    if not isinstance(act, tuple):
        out.append(Finding(path, f"{len(exp)} entries", _fmt(act), severity))
        return
    if len(exp) != len(act):
        out.append(Finding(f"{path} length", len(exp), len(act), severity))
    sample = exp[0] if exp else (act[0] if act else None)
    if sample is None:
        return
    if not dataclasses.is_dataclass(sample):
        if tuple(map(_norm, exp)) != tuple(map(_norm, act)):
            out.append(Finding(path, _fmt(exp), _fmt(act), severity))
        return
    key_field = next((name for name in KEY_FIELDS if hasattr(sample, name)), None)
    expected_keys = [_element_key(item, key_field, ctx, captured=True) for item in exp] if key_field else []
    actual_keys = [_element_key(item, key_field, ctx, captured=False) for item in act] if key_field else []
    if key_field is None or len(set(expected_keys)) != len(expected_keys) or len(set(actual_keys)) != len(actual_keys):
        for index, (e, a) in enumerate(zip(exp, act)):  # no usable identity: compare in order
            _compare_value(e, a, f"{path}[{index}]", ctx, out, severity)
        return
    actual_by_key = dict(zip(actual_keys, act))
    for key, item in zip(expected_keys, exp):
        label = f"{path}[{key_field}={_key_label(item, key_field, ctx)}]"
        if key not in actual_by_key:
            out.append(Finding(label, "present", "missing", severity))
        else:
            _compare_value(item, actual_by_key[key], label, ctx, out, severity)
    for key, item in zip(actual_keys, act):
        if key not in set(expected_keys):
            label = f"{path}[{key_field}={_key_label(item, key_field, ctx, captured=False)}]"
            out.append(Finding(label, "absent", "present", severity))


def _element_key(item, key_field: str, ctx: CompareContext, *, captured: bool):
    value = getattr(item, key_field)
    if key_field == "topic_id" and captured:
        return ctx.actual_topic_id(value) or value
    return _norm(value)


def _key_label(item, key_field: str, ctx: CompareContext, captured: bool = True) -> str:
    value = getattr(item, key_field)
    if key_field == "topic_id":
        if captured:
            return ctx.topic_label(value)
        names = {v: k for k, v in ctx.actual_topic_ids.items()}
        return names.get(value, str(value))
    return str(_norm(value))


def _compare_configs(exp: tuple, act, path: str, ctx: CompareContext, out: list[Finding]) -> None:
    """A topic's config list is broker state: the same config must have the same value and source, but a
    config one broker lists and the other does not is a note, not a failure."""
    if act is None:
        out.append(Finding(path, f"{len(exp)} configs", "null"))
        return
    expected = {entry.name: entry for entry in exp}
    actual = {entry.name: entry for entry in act}
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    if missing:
        out.append(Finding(f"{path} names", f"also {missing}", "not listed", severity="note"))
    if extra:
        out.append(Finding(f"{path} names", "not listed", f"also {extra}", severity="note"))
    for name in sorted(set(expected) & set(actual)):
        entry_path = f"{path}[name={name}]"
        found: list[Finding] = []
        _compare_entity(expected[name], actual[name], entry_path, ctx, found,
                        note_only=name in DELIBERATE_CONFIG_DEFAULTS)
        static = _norm(getattr(expected[name], "config_source", None)) == STATIC_BROKER_CONFIG_SOURCE
        for finding in found:
            if ((finding.path == f"{entry_path}.value" and static)
                    or (finding.path == f"{entry_path}.read_only" and name in START_ONLY_BROKER_CONFIGS)):
                finding = dataclasses.replace(finding, severity="note")
            out.append(finding)


def _member_prefix(member_id: str) -> str:
    return _UUID_SUFFIX.sub("", member_id)


_MISSING = object()


def _norm(value):
    if isinstance(value, Enum):
        return int(value.value) if isinstance(value.value, int) else value.value
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    return value


def _fmt(value) -> str:
    if isinstance(value, ErrorCode):
        return f"{value.name}({int(value)})"
    if value is None:
        return "null"
    if isinstance(value, tuple):
        return "[" + ", ".join(_fmt(item) for item in value) + "]"
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    return repr(_norm(value))


# Fetched records: the same batches (boundaries, codec, sequences) holding the same records.


@dataclass(frozen=True)
class BatchView:
    base_offset: int
    record_count: int
    last_offset_delta: int
    codec: str
    base_sequence: int
    transactional: bool
    control: bool
    records: tuple[tuple, ...]  # (offset, key, value, headers); a marker's value is its version only
    coordinator_epochs: tuple[int, ...] = ()  # control batch: the coordinator epoch in each marker's value

    def describe(self) -> str:
        return (f"batch@{self.base_offset} n={self.record_count} codec={self.codec} seq={self.base_sequence}"
                + (" transactional" if self.transactional else "") + (" control" if self.control else ""))


def batch_views(data: bytes) -> list[BatchView]:
    """Decode a records field into batches; raises InvalidRecordBatch (incl. CRC errors)."""
    views = []
    for header in batches.iter_headers(data):
        if not batches.crc_matches(data, header):
            raise batches.CorruptRecordBatch(f"CRC32C mismatch in batch at offset {header.base_offset}")
        records = batches.read_records(data, header)
        epochs: tuple[int, ...] = ()
        if header.is_control:
            # A transaction marker's value is int16 version + int32 coordinator epoch: the epoch is the
            # leader epoch of the coordinator's __transaction_state partition, so it says which broker
            # wrote the marker (compared as a note); key (version, type) and value version are Kafka's.
            marker = control_records.read_marker(data, header)
            epochs = (marker.coordinator_epoch,) if marker else ()
            rows = tuple((r.offset, r.key, r.value[:2] if r.value else r.value, r.headers) for r in records)
        else:
            rows = tuple((r.offset, r.key, r.value, r.headers) for r in records)
        views.append(BatchView(
            header.base_offset, header.record_count, header.last_offset_delta,
            batches.CODEC_NAMES.get(header.compression, str(header.compression)), header.base_sequence,
            header.is_transactional, header.is_control, rows, epochs))
    return views


def _compare_records(exp, act, path: str, out: list[Finding]) -> None:
    if (exp is None) != (act is None):
        out.append(Finding(path, _fmt(exp), _fmt(act)))
        return
    expected = batch_views(exp or b"")
    try:
        actual = batch_views(act or b"")
    except batches.InvalidRecordBatch as exc:
        out.append(Finding(path, "valid record batches", f"{exc}"))
        return
    if [b.describe() for b in expected] != [b.describe() for b in actual]:
        out.append(Finding(f"{path} batches", "; ".join(b.describe() for b in expected) or "none",
                           "; ".join(b.describe() for b in actual) or "none"))
    expected_records = [record for batch in expected for record in batch.records]
    actual_records = [record for batch in actual for record in batch.records]
    for index, (e, a) in enumerate(zip(expected_records, actual_records)):
        if e != a:
            out.append(Finding(f"{path} record #{index}", _record_text(e), _record_text(a)))
            break
    if len(expected_records) != len(actual_records):
        out.append(Finding(f"{path} record count", len(expected_records), len(actual_records)))
    expected_epochs = {b.base_offset: b.coordinator_epochs for b in expected if b.control}
    for batch in actual:
        if batch.control and batch.base_offset in expected_epochs and \
                batch.coordinator_epochs != expected_epochs[batch.base_offset]:
            out.append(Finding(f"{path} marker@{batch.base_offset} coordinator epoch",
                               expected_epochs[batch.base_offset], batch.coordinator_epochs, severity="note"))


def _record_text(record) -> str:
    offset, key, value, headers = record
    return f"offset {offset} key={key!r} value={value!r}" + (f" headers={headers!r}" if headers else "")


# ---------------------------------------------------------------------------------------------------
# Broker-assigned values: learned from answers, patched into later requests


@dataclass
class FetchSession:
    """A captured fetch session (KIP-227) and what the broker under test made of it."""

    actual_id: int
    partitions: dict  # (topic key, partition) -> FetchPartition of the captured request, in order
    topic_type: type
    topic_field: str  # "topic_id" (v13+) or "topic"
    last_seen: dict = field(default_factory=dict)  # (topic key, partition) -> captured PartitionData
    response_topic_type: type | None = None
    epoch_base: int = 0  # captured epoch at which the broker's session started (patched = captured - base)


@dataclass
class ReplayState:
    captured_topic_names: dict[uuid.UUID, str] = field(default_factory=dict)
    actual_topic_ids: dict[str, uuid.UUID] = field(default_factory=dict)
    leader_epochs: dict[tuple[str, int], int] = field(default_factory=dict)
    # (captured producer id, captured epoch) -> (the broker's producer id, its epoch)
    producers: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    members: dict[str, str] = field(default_factory=dict)
    generations: dict[tuple[str, int], int] = field(default_factory=dict)
    fetch_sessions: dict[int, FetchSession] = field(default_factory=dict)
    advertised: dict[int, tuple[int, int]] | None = None

    @classmethod
    def for_capture(cls, capture: Capture) -> "ReplayState":
        state = cls()
        for frame in capture.responses():
            if frame.api_key in (3, 19):  # Metadata and CreateTopics name topics with their ids
                _, body = decode_response(frame.api_key, frame.api_version, frame.payload)
                for topic in body.topics:
                    topic_id = getattr(topic, "topic_id", None)
                    if topic_id and topic_id != ZERO_UUID:
                        state.captured_topic_names[topic_id] = topic.name
        return state

    def context(self, scenario_topics: set[str]) -> CompareContext:
        producer_ids: dict[int, set[int]] = {}
        for (captured_id, _), (actual_id, _) in self.producers.items():
            producer_ids.setdefault(captured_id, set()).add(actual_id)
        return CompareContext(scenario_topics=scenario_topics, captured_topic_names=self.captured_topic_names,
                              actual_topic_ids=self.actual_topic_ids, producer_ids=producer_ids)

    # -- learning ----------------------------------------------------------------------------------

    def learn(self, api_key: int, request, expected, actual) -> None:
        if api_key == API_VERSIONS_KEY and actual.error_code == ErrorCode.none:
            self.advertised = {e.api_key: (e.min_version, e.max_version) for e in actual.api_keys}
        elif api_key in (3, 19):
            self.learn_topics(actual)
        elif (api_key == INIT_PRODUCER_ID_KEY and expected.error_code == ErrorCode.none
              and actual.error_code == ErrorCode.none):
            self.producers[(expected.producer_id, expected.producer_epoch)] = (actual.producer_id, actual.producer_epoch)
        elif api_key == 11:
            if expected.member_id and actual.member_id:
                self.members[expected.member_id] = actual.member_id
            if expected.generation_id >= 0 and actual.generation_id >= 0:
                self.generations[(request.group_id, expected.generation_id)] = actual.generation_id

    def learn_topics(self, response) -> None:
        for topic in response.topics:
            topic_id = getattr(topic, "topic_id", None)
            if topic_id and topic_id != ZERO_UUID and topic.error_code == ErrorCode.none:
                self.actual_topic_ids[topic.name] = topic_id
            for partition in getattr(topic, "partitions", ()):
                epoch = getattr(partition, "leader_epoch", None)
                if epoch is not None and epoch >= 0:
                    self.leader_epochs[(topic.name, partition.partition_index)] = epoch

    # -- patching ----------------------------------------------------------------------------------

    def patch(self, body):
        """The request with every broker-assigned value replaced by the broker under test's."""
        return self._patch_entity(body, {})

    def _patch_entity(self, entity, scope: dict):
        scope = dict(scope)
        for name in ("name", "topic"):
            value = getattr(entity, name, None)
            if isinstance(value, str):
                scope["topic"] = value
        topic_id = getattr(entity, "topic_id", None)
        if isinstance(topic_id, uuid.UUID) and topic_id in self.captured_topic_names:
            scope["topic"] = self.captured_topic_names[topic_id]
        for name in ("partition", "partition_index"):
            value = getattr(entity, name, None)
            if isinstance(value, int):
                scope["partition"] = value
        if isinstance(getattr(entity, "group_id", None), str):
            scope["group"] = entity.group_id
        changes = {}
        for f in dataclasses.fields(entity):
            value = getattr(entity, f.name)
            new = self._patch_value(f.name, value, scope)
            if new is not value:
                changes[f.name] = new
        for prefix in _PRODUCER_FIELD_PREFIXES:  # transaction requests name their producer id and epoch
            producer_id = getattr(entity, f"{prefix}producer_id", None)
            epoch = getattr(entity, f"{prefix}producer_epoch", None)
            if isinstance(producer_id, int) and isinstance(epoch, int):
                mapped = map_producer(self.producers, producer_id, epoch)
                if mapped is not None and mapped != (producer_id, epoch):
                    changes[f"{prefix}producer_id"], changes[f"{prefix}producer_epoch"] = i64(mapped[0]), i16(mapped[1])
        return dataclasses.replace(entity, **changes) if changes else entity

    def _patch_value(self, name: str, value, scope: dict):
        if dataclasses.is_dataclass(value):
            return self._patch_entity(value, scope)
        if isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            items = tuple(self._patch_entity(item, scope) for item in value)
            return items if any(a is not b for a, b in zip(items, value)) else value
        if name == "topic_id" and isinstance(value, uuid.UUID):
            actual = self.actual_topic_ids.get(self.captured_topic_names.get(value, ""))
            return actual if actual and actual != value else value
        if name == "current_leader_epoch" and isinstance(value, int) and value >= 0:
            actual = self.leader_epochs.get((scope.get("topic"), scope.get("partition")))
            return i32(actual) if actual is not None and actual != value else value
        if name in MEMBER_ID_FIELDS and isinstance(value, str) and value in self.members:
            return self.members[value]
        if name in ("generation_id", "generation_id_or_member_epoch") and isinstance(value, int) and value >= 0:
            actual = self.generations.get((scope.get("group"), value))
            return i32(actual) if actual is not None and actual != value else value
        if name == "records" and isinstance(value, (bytes, bytearray)) and value and self.producers:
            return patch_producer_ids(value, self.producers)
        return value

    # -- fetch sessions ----------------------------------------------------------------------------

    def prepare_fetch(self, request):
        """Map the captured session onto the broker's. Returns (request to send, session converted to a
        full fetch or None)."""
        if request.session_id == 0:
            return request, None
        session = self.fetch_sessions.get(request.session_id)
        if session is None:
            return request, None  # never opened against this broker: send as captured, errors will show
        if request.session_epoch == -1:
            # A close; with no session on this broker the Java client sends session 0, epoch -1.
            return dataclasses.replace(request, session_id=i32(session.actual_id)), None
        _apply_incremental(session, request)
        if session.actual_id:
            return dataclasses.replace(request, session_id=i32(session.actual_id),
                                       session_epoch=i32(request.session_epoch - session.epoch_base)), None
        # No session on this broker: the Java client then sends full fetches of every partition.
        topics: dict = {}
        for (topic_key, _), partition in session.partitions.items():
            topics.setdefault(topic_key, []).append(partition)
        full = dataclasses.replace(
            request, session_id=i32(0), session_epoch=i32(0), forgotten_topics_data=(),
            topics=tuple(session.topic_type(**{session.topic_field: key, "partitions": tuple(parts)})
                         for key, parts in topics.items()))
        return full, session

    def record_fetch(self, captured_request, sent_request, expected, actual) -> None:
        """After a Fetch exchange: open/track sessions, remember the partitions' last captured state."""
        if captured_request.session_id == 0 and captured_request.session_epoch == 0 and expected.session_id:
            topic_type = type(captured_request.topics[0]) if captured_request.topics else None
            if topic_type is not None:
                field_name = "topic_id" if hasattr(captured_request.topics[0], "topic_id") else "topic"
                session = FetchSession(actual_id=actual.session_id, partitions={}, topic_type=topic_type,
                                       topic_field=field_name)
                _apply_incremental(session, captured_request)
                self.fetch_sessions[expected.session_id] = session
        session = self.fetch_sessions.get(expected.session_id)
        if session is None:
            return
        if (sent_request.session_id == 0 and sent_request.session_epoch == 0
                and captured_request.session_epoch > 0 and actual.session_id):
            session.actual_id = actual.session_id  # a converted full fetch opened a session after all
            session.epoch_base = captured_request.session_epoch
        for topic in expected.responses:
            session.response_topic_type = type(topic)
            key = getattr(topic, session.topic_field)
            for partition in topic.partitions:
                session.last_seen[(key, partition.partition_index)] = partition

    def full_fetch_expectation(self, session: FetchSession, expected):
        """Kafka's incremental answer lists only partitions that changed; a full fetch lists all of them.
        Add the unchanged ones, with the state Kafka last reported for them and no records (so, for a
        read_committed fetch, an empty list of aborted transactions: there is nothing to filter)."""
        listed = {(getattr(topic, session.topic_field), p.partition_index)
                  for topic in expected.responses for p in topic.partitions}
        topics = {getattr(topic, session.topic_field): list(topic.partitions) for topic in expected.responses}
        for key in session.partitions:
            if key in listed or key not in session.last_seen:
                continue
            last = session.last_seen[key]
            unchanged = {"error_code": ErrorCode.none, "records": b""}
            if getattr(last, "aborted_transactions", None) is not None:
                unchanged["aborted_transactions"] = ()
            topics.setdefault(key[0], []).append(dataclasses.replace(last, **unchanged))
        topic_type = session.response_topic_type
        if topic_type is None:
            return expected
        return dataclasses.replace(expected, responses=tuple(
            topic_type(**{session.topic_field: key, "partitions": tuple(parts)}) for key, parts in topics.items()))


def _apply_incremental(session: FetchSession, request) -> None:
    for topic in request.topics:
        key = getattr(topic, session.topic_field)
        for partition in topic.partitions:
            session.partitions[(key, partition.partition)] = partition
    for forgotten in request.forgotten_topics_data:
        key = getattr(forgotten, session.topic_field)
        for index in forgotten.partitions:
            session.partitions.pop((key, index), None)


# AddPartitionsToTxn v0-3 name the fields v3_and_below_producer_id/_epoch (kio follows Kafka's schema).
_PRODUCER_FIELD_PREFIXES = ("", "v3_and_below_")


def map_producer(producers: dict[tuple[int, int], tuple[int, int]], producer_id: int,
                 epoch: int) -> tuple[int, int] | None:
    """The broker's (producer id, epoch) for a captured pair. An epoch the replay never saw assigned (a
    producer that bumped it by itself, or a captured batch written with an older epoch) keeps its distance
    to the nearest epoch that was: same id, epoch shifted by the same amount. None: an id never assigned."""
    if (producer_id, epoch) in producers:
        return producers[(producer_id, epoch)]
    known = [captured_epoch for captured_id, captured_epoch in producers if captured_id == producer_id]
    if producer_id < 0 or not known:
        return None
    nearest = min(known, key=lambda captured_epoch: abs(captured_epoch - epoch))
    actual_id, actual_epoch = producers[(producer_id, nearest)]
    return actual_id, actual_epoch + epoch - nearest


def patch_producer_ids(data: bytes, producers: dict[tuple[int, int], tuple[int, int]]) -> bytes:
    """Replace captured producer ids/epochs in every batch by the broker's (map_producer), recomputing the
    CRC32C (which covers the producer fields)."""
    buffer = bytearray(data)
    changed = False
    for header in batches.iter_headers(buffer):
        mapped = map_producer(producers, header.producer_id, header.producer_epoch)
        if mapped is not None and mapped != (header.producer_id, header.producer_epoch):
            producer_id, epoch = mapped
            _PRODUCER_ID_AND_EPOCH.pack_into(buffer, header.position + _PRODUCER_ID_POSITION, producer_id, epoch)
            crc = batches.crc32c(memoryview(buffer)[header.position + batches.CRC_START:
                                                    header.position + header.size])
            _UINT32.pack_into(buffer, header.position + _CRC_POSITION, crc)
            changed = True
    return bytes(buffer) if changed else data


# ---------------------------------------------------------------------------------------------------
# Preconditions: the topic and the records the scenario expects to find


@dataclass(frozen=True)
class StoredBatch:
    topic: str
    partition: int
    base_offset: int
    producer_id: int
    data: bytes


@dataclass(frozen=True)
class Preconditions:
    """What must exist before the replay starts (setup traffic was removed from the captures).

    create_topics: topics to create (3 partitions, RF 1) first; empty when the scenario creates its own.
    later_producers: captured producer id of setup data -> seq before which its batches are written
        (data added between phases of the scenario).
    generated_records: number of `setup-key-N`/`setup-value-N` records to write, spread over the
        partitions by kafka-python's default partitioner, for files that never fetch what was written.
    consumed_by_groups: (group, topic) pairs: a group member (raw requests) joins, is assigned the
        topic's partitions, commits their end offsets and leaves, as the capture's warm-up group did (the
        group stays, Empty, with its protocol type and offsets, and `__consumer_offsets` exists).
    group_coordinators: groups whose coordinator must be available (so `__consumer_offsets` exists and no
        FindCoordinator of the scenario sees the cold start).
    transactional_ids: transactional producers that ran `init_transactions()` before the scenario (so the
        transaction state topic exists and the scenario's first FindCoordinator finds its coordinator).
        A broker refusing them raises TransactionsRefused.
    broker_config: broker settings of this file's Kafka on top of the ones every capture had (the test
        passes them to the broker; keys a broker does not know are its to ignore).
    """

    create_topics: tuple[str, ...] = ()
    partitions: int = 3
    later_producers: dict[int, int] = field(default_factory=dict)
    generated_records: int = 0
    consumed_by_groups: tuple[tuple[str, str], ...] = ()
    group_coordinators: tuple[str, ...] = ()
    transactional_ids: tuple[str, ...] = ()
    broker_config: dict[str, Any] = field(default_factory=dict)


# Starting state per file (index.md, "Recreate the preconditions"). By default the scenario's topic is
# created with 3 partitions and the records its clients fetched without producing them are written first.
SPECIAL_PRECONDITIONS = {
    # The Admin client creates the topic itself (CreateTopics is part of the conversation).
    "01-java-admin.jsonl": Preconditions(),
    # 50 more records (setup producer id 10 in the capture) between the two Spark runs; run 2 starts at seq 88.
    "07-spark-stream-availablenow.jsonl": Preconditions(
        create_topics=("s07b-spark-stream-availablenow",), later_producers={10: 88}),
    # 50 more records (setup producer id 13) after consumer A closed; consumer B connects at seq 65.
    "10-confluent-defaults.jsonl": Preconditions(
        create_topics=("s10-confluent-defaults",), later_producers={13: 65}),
    # The CLI tools only ask for offsets: the 200 setup records are generated like the capture helper's.
    "14-kafka-cli-admin-3.7.1.jsonl": Preconditions(
        create_topics=("s14-kafka-cli-admin",), generated_records=200),
    # The tools create and delete s15-kafka-tools themselves. Before they ran, a warm-up producer wrote to
    # topic `warmup` (1 partition) and group `warmup-group` consumed it; both show up in the answers that
    # list everything (Metadata for all topics, ListGroups, DescribeLogDirs, ElectLeaders).
    "15-kafka-tools-3.7.1.jsonl": Preconditions(
        create_topics=("warmup",), partitions=1, generated_records=1,
        consumed_by_groups=(("warmup-group", "warmup"),)),
    # Transactions on the single node of file 15 with a one-partition transaction state topic. Before the
    # scenario a warm-up group created `__consumer_offsets` and a transactional producer (`capture-setup-txn`,
    # init_transactions() only) created `__transaction_state`. The Kafka broker's own marker sender and
    # transaction verification connections are in the file; they are not replayed (BROKER_INTERNAL_CLIENT_IDS).
    "17-transactions-3.7.1.jsonl": Preconditions(
        create_topics=("s17-transactions", "s17-txn-output"), group_coordinators=("capture-setup-warmup-group",),
        transactional_ids=("capture-setup-txn",),
        broker_config={"transaction.state.log.num.partitions": 1, "transaction.state.log.replication.factor": 1,
                       "transaction.state.log.min.isr": 1}),
}


def preconditions_for(capture: Capture) -> Preconditions:
    default = Preconditions(create_topics=tuple(sorted(capture.scenario_topics())))
    return SPECIAL_PRECONDITIONS.get(capture.name, default)


def preloaded_batches(capture: Capture) -> list[StoredBatch]:
    """Batches the capture's clients fetched but did not produce themselves: the setup data, exactly as
    Kafka served it (so offsets, batch boundaries and sequences can be compared)."""
    captured_names: dict[uuid.UUID, str] = ReplayState.for_capture(capture).captured_topic_names
    produced = set()
    for frame in capture.responses():
        if frame.api_key == 0:
            _, body = decode_response(frame.api_key, frame.api_version, frame.payload)
            for topic in body.responses:
                for partition in topic.partition_responses:
                    produced.add((topic.name, partition.index, partition.base_offset))
    found: dict[tuple[str, int, int], StoredBatch] = {}
    for frame in capture.responses():
        if frame.api_key != 1:
            continue
        _, body = decode_response(frame.api_key, frame.api_version, frame.payload)
        for topic in body.responses:
            name = topic.topic if hasattr(topic, "topic") else captured_names[topic.topic_id]
            for partition in topic.partitions:
                data = partition.records or b""
                for header in batches.iter_headers(data):
                    if header.is_control:  # a transaction marker: the broker writes it, not a producer
                        continue
                    key = (name, partition.partition_index, header.base_offset)
                    if key not in produced and key not in found:
                        found[key] = StoredBatch(name, partition.partition_index, header.base_offset,
                                                 header.producer_id,
                                                 bytes(data[header.position:header.position + header.size]))
    return [found[key] for key in sorted(found)]


def generated_batches(topic: str, count: int, partitions: int) -> list[StoredBatch]:
    """The capture setup helper's records: keys setup-key-N, values setup-value-N, partitioned by
    kafka-python's default partitioner (murmur2 of the key), one uncompressed batch per partition."""
    from kafka.partitioner.default import murmur2

    by_partition: dict[int, list[tuple[bytes, bytes]]] = {}
    for n in range(count):
        key = f"setup-key-{n}".encode()
        by_partition.setdefault((murmur2(key) & 0x7FFFFFFF) % partitions, []).append(
            (key, f"setup-value-{n}".encode()))
    return [StoredBatch(topic, partition, 0, batches.NO_PRODUCER_ID, bytes(batches.build_batch(records)))
            for partition, records in sorted(by_partition.items())]


def consumer_protocol(topic: str, partitions: list[int] | None = None) -> bytes:
    """Kafka's ConsumerProtocol v0 bytes for one topic: the subscription a member joins with, or (with
    `partitions`) the assignment its leader gives it; no user data."""
    data = struct.pack(">hih", 0, 1, len(topic)) + topic.encode()
    if partitions is not None:
        data += struct.pack(f">i{len(partitions)}i", len(partitions), *partitions)
    return data + struct.pack(">i", -1)


class SetupError(RuntimeError):
    """The broker could not be brought into the scenario's starting state; nothing was compared."""


class TransactionsRefused(SetupError):
    """The broker refuses transactional ids outright (TRANSACTIONAL_ID_AUTHORIZATION_FAILED to the
    FindCoordinator or InitProducerId of a transactional producer that may use any id): a broker without
    transactions. Retriable answers (coordinator loading or not available, concurrent transactions) are
    retried until the I/O timeout; any other error is a SetupError."""


# Answers a transactional producer retries (Kafka's RetriableException subclasses among the coordinator errors).
_RETRIABLE_COORDINATOR_ERRORS = frozenset({
    ErrorCode.coordinator_not_available, ErrorCode.coordinator_load_in_progress, ErrorCode.not_coordinator,
    ErrorCode.concurrent_transactions})
GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1


# ---------------------------------------------------------------------------------------------------
# Connections


class ConnectionLost(RuntimeError):
    pass


class Connection:
    """One client connection: send frames, read the broker's answers in order."""

    def __init__(self, address: tuple[str, int], timeout: float):
        self.sock = socket.create_connection(address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.lost: str | None = None
        self.not_replayed: list[int] = []

    def send(self, payload: bytes) -> None:
        try:
            self.sock.sendall(_INT32.pack(len(payload)) + payload)
        except OSError as exc:
            raise ConnectionLost(f"send failed: {exc!r}") from exc

    def receive(self) -> bytes:
        (size,) = _INT32.unpack(self._read_exact(4))
        return self._read_exact(size)

    def _read_exact(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            try:
                chunk = self.sock.recv(size - len(data))
            except socket.timeout as exc:
                raise ConnectionLost(f"no answer within {self.sock.gettimeout():.0f} s") from exc
            except OSError as exc:
                raise ConnectionLost(f"receive failed: {exc!r}") from exc
            if not chunk:
                raise ConnectionLost("connection closed by the broker")
            data += chunk
        return bytes(data)

    def request(self, body, correlation_id: int = 1, client_id: str = "wire-replay-setup"):
        """One request/answer for setup (kio entity in, kio entity out)."""
        header_type = RequestHeaderV2 if body.__flexible__ else RequestHeaderV1
        header = header_type(request_api_key=body.__api_key__, request_api_version=body.__version__,
                             correlation_id=i32(correlation_id), client_id=client_id)
        self.send(encode(header, body))
        _, answer = decode_response(body.__api_key__, body.__version__, self.receive())
        return answer

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class ScenarioSetup:
    """Brings a fresh broker into a capture's starting state, and adds data between phases."""

    def __init__(self, address: tuple[str, int], capture: Capture, preconditions: Preconditions,
                 state: ReplayState, timeout: float):
        self.address = address
        self.capture = capture
        self.preconditions = preconditions
        self.state = state
        self.timeout = timeout
        stored = preloaded_batches(capture)
        for topic in preconditions.create_topics:
            if preconditions.generated_records:
                stored += generated_batches(topic, preconditions.generated_records, preconditions.partitions)
        self.phases: dict[int, list[StoredBatch]] = {}
        self.ends: dict[tuple[str, int], int] = {}  # (topic, partition) -> end offset of the setup data written
        for batch in stored:
            self.phases.setdefault(preconditions.later_producers.get(batch.producer_id, -1), []).append(batch)
        unknown = set(preconditions.later_producers) - {b.producer_id for b in stored}
        if unknown:
            raise SetupError(f"{capture.name}: no fetched setup batch has producer id(s) {sorted(unknown)}")

    def prepare(self) -> None:
        with self._connection("creating the topic and writing the setup records") as connection:
            for topic in self.preconditions.create_topics:
                self._create_topic(connection, topic)
            self._write(connection, self.phases.pop(-1, []))
            for group, topic in self.preconditions.consumed_by_groups:
                self._consume_in_group(connection, group, topic)
            for group in self.preconditions.group_coordinators:
                self._await_coordinator(connection, group, GROUP_KEY_TYPE, f"coordinator of group {group}")
            for transactional_id in self.preconditions.transactional_ids:
                self._init_transactions(connection, transactional_id)

    def write_due(self, seq: int) -> None:
        """Write the batches of every phase that starts at or before `seq`."""
        for start in sorted(start for start in self.phases if start <= seq):
            with self._connection(f"writing the records added before seq {start}") as connection:
                self._write(connection, self.phases.pop(start))

    @contextlib.contextmanager
    def _connection(self, step: str) -> Iterator[Connection]:
        try:
            connection = Connection(self.address, self.timeout)
            try:
                yield connection
            finally:
                connection.close()
        except (ConnectionLost, DecodeError, OSError) as exc:
            raise SetupError(f"{self.capture.name}: {step}: {exc}") from exc

    def _create_topic(self, connection: Connection, topic: str) -> None:
        answer = connection.request(CreateTopicsRequest(
            topics=(CreatableTopic(name=topic, num_partitions=i32(self.preconditions.partitions),
                                   replication_factor=i16(1), assignments=(), configs=()),),
            timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)), validate_only=False))
        error = answer.topics[0].error_code
        if error != ErrorCode.none:
            raise SetupError(f"CreateTopics {topic}: {_fmt(error)}")
        deadline = time.monotonic() + self.timeout
        while True:  # creation may complete asynchronously: wait until every partition has a leader
            metadata = connection.request(MetadataRequest(
                topics=(MetadataRequestTopic(topic_id=ZERO_UUID, name=topic),), allow_auto_topic_creation=False,
                include_topic_authorized_operations=False))
            entry = metadata.topics[0]
            if (entry.error_code == ErrorCode.none and len(entry.partitions) == self.preconditions.partitions
                    and all(p.error_code == ErrorCode.none and p.leader_id >= 0 for p in entry.partitions)):
                self.state.learn_topics(metadata)
                return
            if time.monotonic() > deadline:
                raise SetupError(f"topic {topic} has no leader for every partition: {entry!r}")
            time.sleep(0.05)

    def _consume_in_group(self, connection: Connection, group: str, topic: str) -> None:
        """What a consumer that read the topic to its end and closed leaves behind: the group (Empty, protocol
        type consumer, as a real member joined it) with its offsets committed, and `__consumer_offsets`.
        Raw requests, as the Java consumer sends them (kafka-python's group client rebalances on its own)."""
        step = f"group {group} consuming {topic}"

        def check(api: str, error) -> None:
            if error != ErrorCode.none:
                raise SetupError(f"{self.capture.name}: {step}: {api}: {_fmt(error)}")

        self._await_coordinator(connection, group, GROUP_KEY_TYPE, step)
        partitions = list(range(self.preconditions.partitions))
        join = JoinGroupRequest(
            group_id=group, session_timeout=i32Timedelta.parse(datetime.timedelta(seconds=45)),
            rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)), member_id="",
            group_instance_id=None, protocol_type="consumer",
            protocols=(JoinGroupRequestProtocol(name="range", metadata=consumer_protocol(topic)),), reason=None)
        joined = connection.request(join)  # KIP-394: the first join is answered with the member id to use
        if joined.error_code == ErrorCode.member_id_required:
            joined = connection.request(dataclasses.replace(join, member_id=joined.member_id))
        check("JoinGroup", joined.error_code)
        member, generation = joined.member_id, joined.generation_id
        synced = connection.request(SyncGroupRequest(
            group_id=group, generation_id=generation, member_id=member, group_instance_id=None,
            protocol_type="consumer", protocol_name="range",
            assignments=(SyncGroupRequestAssignment(member_id=member,
                                                    assignment=consumer_protocol(topic, partitions)),)))
        check("SyncGroup", synced.error_code)
        committed = connection.request(OffsetCommitRequest(
            group_id=group, generation_id_or_member_epoch=generation, member_id=member, group_instance_id=None,
            topics=(OffsetCommitRequestTopic(name=topic, partitions=tuple(
                OffsetCommitRequestPartition(partition_index=i32(p), committed_offset=i64(self.ends.get((topic, p), 0)),
                                             committed_leader_epoch=i32(-1), committed_metadata="")
                for p in partitions)),)))
        for partition in committed.topics[0].partitions:
            check("OffsetCommit", partition.error_code)
        left = connection.request(LeaveGroupRequest(group_id=group, members=(
            MemberIdentity(member_id=member, group_instance_id=None, reason="the consumer is being closed"),)))
        check("LeaveGroup", left.error_code)

    def _await_coordinator(self, connection: Connection, key: str, key_type: int, step: str) -> None:
        """FindCoordinator until it names a coordinator: a broker creates the coordinators' topic
        (`__consumer_offsets`, `__transaction_state`) when first asked and answers a retriable error
        meanwhile. A transaction coordinator refused outright: TransactionsRefused."""
        deadline = time.monotonic() + self.timeout
        while True:
            found = connection.request(FindCoordinatorRequest(key_type=i8(key_type), coordinator_keys=(key,)))
            coordinator = found.coordinators[0]
            if coordinator.error_code == ErrorCode.none:
                return
            self._check_retriable(coordinator.error_code, coordinator.error_message, key_type == TRANSACTION_KEY_TYPE,
                                  f"{step}: FindCoordinator key_type {key_type}", deadline)

    def _init_transactions(self, connection: Connection, transactional_id: str) -> None:
        """What a transactional producer's init_transactions() leaves: its id known to its coordinator (and
        the transaction state topic created), no transaction open."""
        step = f"init_transactions() of transactional id {transactional_id!r}"
        self._await_coordinator(connection, transactional_id, TRANSACTION_KEY_TYPE, step)
        deadline = time.monotonic() + self.timeout
        while True:
            answer = connection.request(InitProducerIdRequest(
                transactional_id=transactional_id,
                transaction_timeout=i32Timedelta.parse(datetime.timedelta(seconds=60)),
                producer_id=i64(-1), producer_epoch=i16(-1)))
            if answer.error_code == ErrorCode.none:
                return
            self._check_retriable(answer.error_code, None, True, f"{step}: InitProducerId", deadline)

    def _check_retriable(self, error, message: str | None, transactional: bool, step: str, deadline: float) -> None:
        """Return (after a short pause) if `error` is worth retrying before `deadline`; raise otherwise."""
        text = f"{self.capture.name}: {step}: {_fmt(error)}" + (f" ({message})" if message else "")
        if transactional and error == ErrorCode.transactional_id_authorization_failed:
            raise TransactionsRefused(f"the broker refuses transactional ids: {text}")
        if error not in _RETRIABLE_COORDINATOR_ERRORS:
            raise SetupError(text)
        if time.monotonic() > deadline:
            raise SetupError(f"{text}, still after {self.timeout:.0f} s")
        time.sleep(0.05)

    def transaction_pending(self, transactional_id: str | None, partitions: list[tuple[str, int]],
                            describe: bool) -> str | None:
        """Waits until the broker has finished a transaction whose markers Kafka had written at this point:
        None when done, else what is still pending when the I/O timeout expires. Done means: its
        coordinator no longer says Prepare* (DescribeTransactions, when `describe`), and on each partition
        the last stable offset has caught up with the high watermark (ListOffsets LATEST, read_committed
        and read_uncommitted)."""
        deadline = time.monotonic() + self.timeout
        with self._connection(f"waiting for the end of transaction {transactional_id!r}") as connection:
            while True:
                pending = self._still_pending(connection, transactional_id, partitions, describe)
                if pending is None or time.monotonic() > deadline:
                    return pending
                time.sleep(0.02)

    @staticmethod
    def _still_pending(connection: Connection, transactional_id: str | None, partitions: list[tuple[str, int]],
                       describe: bool) -> str | None:
        if describe and transactional_id is not None:
            answer = connection.request(DescribeTransactionsRequest(transactional_ids=(transactional_id,)))
            state = answer.transaction_states[0]
            if state.error_code != ErrorCode.none:
                return f"DescribeTransactions {transactional_id!r}: {_fmt(state.error_code)}"
            if state.transaction_state.replace("_", "").lower().startswith("prepare"):  # Kafka: PrepareCommit...
                return f"DescribeTransactions {transactional_id!r}: state {state.transaction_state}"
        latest = {}
        for isolation in (0, 1):
            topics: dict[str, list[int]] = {}
            for topic, index in partitions:
                topics.setdefault(topic, []).append(index)
            answer = connection.request(ListOffsetsRequest(replica_id=i32(-1), isolation_level=i8(isolation), topics=tuple(
                ListOffsetsTopic(name=topic, partitions=tuple(
                    ListOffsetsPartition(partition_index=i32(index), current_leader_epoch=i32(-1), timestamp=i64(-1))
                    for index in indexes)) for topic, indexes in topics.items())))
            for topic in answer.topics:
                for partition in topic.partitions:
                    if partition.error_code != ErrorCode.none:
                        return f"ListOffsets {topic.name}-{partition.partition_index}: {_fmt(partition.error_code)}"
                    latest.setdefault((topic.name, partition.partition_index), []).append(partition.offset)
        behind = [f"{topic}-{index}: last stable offset {lso} < high watermark {hw}"
                  for (topic, index), (hw, lso) in sorted(latest.items()) if lso < hw]
        return "; ".join(behind) or None

    def _write(self, connection: Connection, stored: list[StoredBatch]) -> None:
        producers: dict[tuple[int, int], tuple[int, int]] = {}
        for batch in stored:
            header = batches.read_header(batch.data)
            if header.producer_id >= 0 and map_producer(producers, header.producer_id, header.producer_epoch) is None:
                answer = connection.request(InitProducerIdRequest(
                    transactional_id=None, transaction_timeout=i32Timedelta.parse(datetime.timedelta(0)),
                    producer_id=i64(-1), producer_epoch=i16(-1)))
                if answer.error_code != ErrorCode.none:
                    raise SetupError(f"InitProducerId for setup data: {_fmt(answer.error_code)}")
                producers[(header.producer_id, header.producer_epoch)] = (answer.producer_id, answer.producer_epoch)
        for batch in stored:  # one batch per request: Kafka takes one batch per partition per request
            answer = connection.request(ProduceRequest(
                transactional_id=None, acks=i16(-1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
                topic_data=(TopicProduceData(name=batch.topic, partition_data=(PartitionProduceData(
                    index=i32(batch.partition), records=patch_producer_ids(batch.data, producers)),)),)))
            result = answer.responses[0].partition_responses[0]
            if result.error_code != ErrorCode.none or result.base_offset != batch.base_offset:
                raise SetupError(f"writing setup batch {batch.topic}-{batch.partition}@{batch.base_offset}: "
                                 f"{_fmt(result.error_code)}, base offset {result.base_offset}")
            last = batches.read_header(batch.data)
            self.ends[(batch.topic, batch.partition)] = batch.base_offset + last.last_offset_delta + 1


# ---------------------------------------------------------------------------------------------------
# The replay


@dataclass(frozen=True)
class Allowance:
    """An exchange expected not to match yet, with the reason (the issue that will fix it)."""

    capture: str
    api: str  # api name, e.g. "JoinGroup"
    reason: str
    seq: int | None = None  # the request's seq; None: every request of that API in the file

    def covers(self, capture: str, frame: Frame) -> bool:
        return (self.capture == capture and self.api == frame.api_name
                and (self.seq is None or self.seq == frame.seq))


@dataclass(frozen=True)
class Difference:
    capture: str
    seq: int  # seq of the request line
    conn: int
    api: str
    correlation_id: int
    path: str
    expected: Any
    got: Any
    severity: str = "mismatch"
    allowed: str | None = None

    def __str__(self) -> str:
        where = f"{self.capture} seq {self.seq} (conn {self.conn}, {self.api}, corr {self.correlation_id})"
        text = f"{where}: {self.path}: expected {self.expected}, got {self.got}"
        if self.severity == "note":
            text = "note: " + text
        if self.allowed:
            text += f"  [allowed: {self.allowed}]"
        return text


@dataclass
class ReplayResult:
    capture: str
    differences: list[Difference] = field(default_factory=list)
    exchanges_compared: int = 0
    allowance_exchanges: dict[Allowance, int] = field(default_factory=dict)  # exchanges each covered
    allowance_differences: dict[Allowance, int] = field(default_factory=dict)  # ... that differed

    @property
    def failures(self) -> list[Difference]:
        return [d for d in self.differences if d.severity == "mismatch" and not d.allowed]

    def stale_allowances(self) -> list[Allowance]:
        """Allowances whose exchanges all matched (or that cover nothing): remove them."""
        return [a for a, count in self.allowance_exchanges.items()
                if count == 0 or self.allowance_differences.get(a, 0) == 0]

    def summary(self, differences: Iterable[Difference] | None = None) -> list[str]:
        """One line per kind of difference: the same API, field (any partition) and values, with the seqs
        where it happened. What a failing test prints."""
        groups: dict[tuple, list[Difference]] = {}
        for difference in self.failures if differences is None else differences:
            path = _PER_PARTITION.sub(r"[\1=*]", difference.path)
            key = (difference.api, path, str(difference.expected), str(difference.got), difference.severity,
                   difference.allowed)
            groups.setdefault(key, []).append(difference)
        lines = []
        for (api, path, expected, got, severity, allowed), members in groups.items():
            seqs = sorted({d.seq for d in members})
            lines.append(f"{'note: ' if severity == 'note' else ''}{self.capture} {api}: {path}: expected {expected}, "
                         f"got {got}  ({len(members)}x, seq {', '.join(map(str, seqs))})"
                         + (f"  [allowed: {allowed}]" if allowed else ""))
        return lines

    def report(self) -> str:
        lines = [f"{self.capture}: {self.exchanges_compared} answers compared, {len(self.failures)} mismatches, "
                 f"{sum(1 for d in self.differences if d.allowed)} allowed, "
                 f"{sum(1 for d in self.differences if d.severity == 'note' and not d.allowed)} notes"]
        lines += [f"  {line}" for line in self.summary(self.differences)]
        return "\n".join(lines)


@dataclass
class _Sent:
    frame: Frame
    captured: Any  # decoded captured request body
    sent: Any  # the body actually sent (patched), or None if not sent
    converted_session: FetchSession | None = None


class Replayer:
    """Replays one capture against a broker; see the module docstring."""

    def __init__(self, capture: Capture, address: tuple[str, int], *, preconditions: Preconditions,
                 allowances: Iterable[Allowance] = (), io_timeout: float = 30.0, despite_refusal: bool = False):
        self.capture = capture
        self.address = address
        self.io_timeout = io_timeout
        self.despite_refusal = despite_refusal  # TransactionsRefused: note it and replay anyway (diagnosis)
        self.internal_conns = capture.broker_internal_conns()
        self.internal_requests: dict[tuple[int, int], Frame] = {}
        self.transactional_ids = capture.transactional_ids()
        self.allowances = [a for a in allowances if a.capture == capture.name]
        self.state = ReplayState.for_capture(capture)
        self.setup = ScenarioSetup(address, capture, preconditions, self.state, io_timeout)
        self.scenario_topics = capture.scenario_topics()
        self.result = ReplayResult(capture.name, allowance_exchanges={a: 0 for a in self.allowances},
                                   allowance_differences={a: 0 for a in self.allowances})
        self.connections: dict[int, Connection] = {}
        self.in_flight: dict[tuple[int, int], _Sent] = {}
        self.last_seq = {}
        for frame in capture.frames:
            self.last_seq[frame.conn] = frame.seq

    def run(self) -> ReplayResult:
        try:
            self.setup.prepare()
        except TransactionsRefused as refused:
            if not self.despite_refusal:
                raise
            self.result.differences.append(Difference(self.capture.name, -1, -1, "-", -1, "setup", "transactions",
                                                      str(refused), severity="note"))
        try:
            for frame in self.capture.frames:
                self.setup.write_due(frame.seq)
                if frame.conn in self.internal_conns:
                    self._broker_internal(frame)
                elif frame.is_request:
                    self._send(frame)
                else:
                    self._receive(frame)
                if self.last_seq[frame.conn] == frame.seq:
                    self._close(frame.conn)
        finally:
            for conn in list(self.connections):
                self._close(conn)
        return self.result

    # -- Kafka's own traffic -------------------------------------------------------------------------

    def _broker_internal(self, frame: Frame) -> None:
        """Not replayed. Kafka's answer to its marker request means the transaction was complete there
        before anything later in the capture was sent: wait until it is complete on this broker too."""
        if frame.is_request:
            self.internal_requests[(frame.conn, frame.correlation_id)] = frame
            return
        request = self.internal_requests.pop((frame.conn, frame.correlation_id), None)
        if frame.api_key != WRITE_TXN_MARKERS_KEY or request is None:
            return
        _, body = decode_request(request.payload)
        advertised = (self.state.advertised or {}).get(DESCRIBE_TRANSACTIONS_KEY)
        describe = advertised is not None and advertised[0] == 0
        for marker in body.markers:
            transactional_id = self.transactional_ids.get(marker.producer_id)
            partitions = [(topic.name, index) for topic in marker.topics for index in topic.partition_indexes]
            try:
                pending = self.setup.transaction_pending(transactional_id, partitions, describe)
            except SetupError as exc:
                pending = str(exc)
            if pending:
                outcome = "commit" if marker.transaction_result else "abort"
                self._differ(frame, Finding(
                    "transaction markers", f"{outcome} of {transactional_id or marker.producer_id!r} "
                    f"complete on {partitions} (Kafka's marker sender was done here)",
                    f"still pending after {self.io_timeout:.0f} s: {pending}"))

    # -- one request -------------------------------------------------------------------------------

    def _send(self, frame: Frame) -> None:
        header, captured = decode_request(frame.payload)
        sent = _Sent(frame, captured, None)
        self.in_flight[(frame.conn, frame.correlation_id)] = sent
        allowance = self._allowance(frame)
        if allowance:
            self.result.allowance_exchanges[allowance] += 1
        connection = self._connection(frame)
        if connection is None:
            return
        if connection.lost:
            connection.not_replayed.append(frame.seq)
            return
        advertised = self.state.advertised
        if frame.api_key != API_VERSIONS_KEY and advertised is not None:
            supported = advertised.get(frame.api_key)
            if supported is None or not supported[0] <= frame.api_version <= supported[1]:
                self._differ(frame, Finding(
                    "request version", f"v{frame.api_version} advertised (the client used it with Kafka)",
                    "API not advertised" if supported is None else f"advertised v{supported[0]}-{supported[1]}"
                    " (request not sent: a client would not send it)"))
                return
        body = captured
        if frame.api_key == 1:
            body, sent.converted_session = self.state.prepare_fetch(body)
        body = self.state.patch(body)
        try:
            connection.send(encode(header, body))
        except ConnectionLost as exc:
            self._lose(frame, connection, str(exc))
            return
        sent.sent = body

    # -- one answer --------------------------------------------------------------------------------

    def _receive(self, frame: Frame) -> None:
        sent = self.in_flight.pop((frame.conn, frame.correlation_id), None)
        if sent is None or sent.sent is None:
            return  # not sent (not advertised, or the connection was gone): already reported
        request = sent.frame
        connection = self.connections[frame.conn]
        if connection.lost:
            connection.not_replayed.append(request.seq)
            return
        try:
            payload = connection.receive()
        except ConnectionLost as exc:
            self._lose(request, connection, str(exc))
            return
        (correlation_id,) = _INT32.unpack_from(payload)
        if correlation_id != request.correlation_id:
            self._lose(request, connection, f"answer with correlation id {correlation_id} "
                                            f"(answers must come in request order)")
            return
        _, expected = decode_response(frame.api_key, frame.api_version, frame.payload)
        try:
            _, actual = decode_response(request.api_key, request.api_version, payload)
        except DecodeError as exc:
            self._differ(request, Finding("response", "a response that decodes with kio", str(exc)))
            return
        self.result.exchanges_compared += 1
        if frame.api_key == 1 and sent.converted_session is not None:
            expected = self.state.full_fetch_expectation(sent.converted_session, expected)
        ctx = self.state.context(self.scenario_topics)
        ctx.requested_version = request.api_version
        ctx.all_topics_metadata = frame.api_key == 3 and sent.captured.topics is None
        for finding in compare_responses(frame.api_key, expected, actual, ctx):
            self._differ(request, finding)
        if (frame.api_key == INIT_PRODUCER_ID_KEY and sent.captured.transactional_id is not None
                and expected.error_code == actual.error_code == ErrorCode.none
                and expected.producer_epoch != actual.producer_epoch):
            # Epochs are mapped, not compared; a transactional id's epoch sequence is Kafka's, though.
            self._differ(request, Finding("producer_epoch", expected.producer_epoch, actual.producer_epoch,
                                          severity="note"))
        self.state.learn(frame.api_key, sent.sent, expected, actual)
        if frame.api_key == 1:
            self.state.record_fetch(sent.captured, sent.sent, expected, actual)

    # -- bookkeeping -------------------------------------------------------------------------------

    def _connection(self, frame: Frame) -> Connection | None:
        if frame.conn not in self.connections:
            try:
                self.connections[frame.conn] = Connection(self.address, self.io_timeout)
            except OSError as exc:
                self._differ(frame, Finding("connect", "a TCP connection", repr(exc)))
                return None
        return self.connections[frame.conn]

    def _lose(self, frame: Frame, connection: Connection, why: str) -> None:
        connection.lost = why
        self._differ(frame, Finding("connection", "an answer", why))

    def _close(self, conn: int) -> None:
        connection = self.connections.pop(conn, None)
        if connection is None:
            return
        connection.close()
        if connection.not_replayed:
            self.result.differences.append(Difference(
                self.capture.name, connection.not_replayed[0], conn, "-", -1, "connection",
                "the rest of the conversation", f"not replayed after the connection was lost: seqs "
                f"{connection.not_replayed}"))

    def _allowance(self, frame: Frame) -> Allowance | None:
        return next((a for a in self.allowances if a.covers(self.capture.name, frame)), None)

    def _differ(self, frame: Frame, finding: Finding) -> None:
        allowance = self._allowance(frame)
        if allowance and finding.severity == "mismatch":
            self.result.allowance_differences[allowance] += 1
        self.result.differences.append(Difference(
            self.capture.name, frame.seq, frame.conn, frame.api, frame.correlation_id, finding.path,
            finding.expected, finding.got, finding.severity, allowance.reason if allowance else None))


def replay(capture: Capture, address: tuple[str, int], *, preconditions: Preconditions,
           allowances: Iterable[Allowance] = (), io_timeout: float = 30.0,
           despite_refusal: bool = False) -> ReplayResult:
    return Replayer(capture, address, preconditions=preconditions, allowances=allowances,
                    io_timeout=io_timeout, despite_refusal=despite_refusal).run()


def main(argv: list[str] | None = None) -> int:
    """python -m tests.wire_replay HOST:PORT [CAPTURE-PREFIX ...]: replay against any broker (a fresh one
    per run: the scenarios create their topics) and print every difference."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("bootstrap", help="host:port of the broker under test")
    parser.add_argument("captures", nargs="*", help="file name prefixes, e.g. 04 10 (default: all)")
    parser.add_argument("--despite-refusal", action="store_true",
                        help="replay a transactions capture even if the broker refuses transactional ids")
    args = parser.parse_args(argv)
    host, _, port = args.bootstrap.rpartition(":")
    failed = False
    for path in capture_paths():
        if args.captures and not any(path.name.startswith(prefix) for prefix in args.captures):
            continue
        capture = load_capture(path)
        result = replay(capture, (host, int(port)), preconditions=preconditions_for(capture),
                        despite_refusal=args.despite_refusal)
        print(result.report())
        failed = failed or bool(result.failures)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

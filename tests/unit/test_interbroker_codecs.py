"""The inter-broker codecs (LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown) on real bytes.

- Every frame of these four APIs that a 3-broker Kafka 3.7.1 cluster in ZooKeeper mode exchanged
  (../shared/wire-captures/16-zk-cluster-3.7.1.jsonl, 194 frames) decodes with no byte left and re-encodes
  to the same bytes. An excerpt of 14 of those frames is committed (protocol_specs/fixtures/interbroker/)
  so the round trip is also tested on a fresh clone without ../shared.
- Hypothesis round trips (kio's registered strategies for its primitive types) for every generated
  entity: all versions, both directions, and whole frames with their headers.
- The committed modules are exactly what the generator makes from protocol_specs/messages/.
- These APIs stay out of the client-facing support matrix: not advertised, not dispatched.
"""

from __future__ import annotations

import io
import dataclasses
import json
import re
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from pykbroker.protocol import framing
from pykbroker.protocol import interbroker as ib
from pykbroker.protocol.apis import apis_for

REPO = Path(__file__).resolve().parents[2]
EXCERPT = REPO / "protocol_specs" / "fixtures" / "interbroker" / "16-zk-cluster-excerpt.jsonl"
FULL_CAPTURE = REPO.parent / "shared" / "wire-captures" / "16-zk-cluster-3.7.1.jsonl"
if not FULL_CAPTURE.exists():  # a worktree sits one level deeper than the main checkout
    FULL_CAPTURE = REPO.parents[1] / "shared" / "wire-captures" / "16-zk-cluster-3.7.1.jsonl"
INTERBROKER_KEYS = {4, 5, 6, 7}


def _frames(path: Path) -> list[dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [line for line in lines if line["api_key"] in INTERBROKER_KEYS]


def _round_trip(frame: dict) -> tuple[object, object]:
    raw = bytes.fromhex(frame["hex"])
    if frame["dir"] == "request":
        header, body = ib.decode_request(raw)  # strict: raises TrailingBytes on leftover bytes
        assert (header.request_api_key, header.request_api_version) == (frame["api_key"], frame["api_version"])
        assert header.client_id == frame["client_id"]
        again = ib.encode_request(body, header=header, size_prefix=False)
    else:
        header, body = ib.decode_response(frame["api_key"], frame["api_version"], raw)
        again = ib.encode_response(body, header=header, size_prefix=False)
    assert header.correlation_id == frame["correlation_id"]
    assert again == raw, f"seq {frame['seq']}: re-encoded bytes differ"
    return header, body


def _by_seq(frames: list[dict]) -> dict[int, dict]:
    return {frame["seq"]: frame for frame in frames}


EXCERPT_FRAMES = _frames(EXCERPT)


# -- real bytes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("frame", EXCERPT_FRAMES, ids=lambda f: f"seq{f['seq']}-{f['api_name']}-{f['dir']}")
def test_committed_capture_frames_decode_and_reencode_byte_for_byte(frame):
    _round_trip(frame)


def test_the_excerpt_covers_all_four_apis_in_both_directions():
    seen = {(f["api_key"], f["api_version"], f["dir"]) for f in EXCERPT_FRAMES}
    assert seen == {(k, v, d) for k, v in ((4, 7), (5, 4), (6, 8), (7, 3)) for d in ("request", "response")}


@pytest.mark.skipif(not FULL_CAPTURE.exists(), reason="../shared/wire-captures is absent (the full capture "
                    "lives outside the repository); the committed excerpt is tested instead")
def test_every_interbroker_frame_of_the_zookeeper_cluster_capture_round_trips():
    frames = _frames(FULL_CAPTURE)
    for frame in frames:
        _round_trip(frame)
    counts = Counter((f["api_name"], f["api_version"], f["dir"]) for f in frames)
    # index.md: LeaderAndIsr 22+22, UpdateMetadata 73+73, StopReplica 1+1, ControlledShutdown 1+1
    assert counts == {("LeaderAndIsr", 7, "request"): 22, ("LeaderAndIsr", 7, "response"): 22,
                      ("UpdateMetadata", 8, "request"): 73, ("UpdateMetadata", 8, "response"): 73,
                      ("StopReplica", 4, "request"): 1, ("StopReplica", 4, "response"): 1,
                      ("ControlledShutdown", 3, "request"): 1, ("ControlledShutdown", 3, "response"): 1}
    # The excerpt is a true copy of those lines.
    full = _by_seq(frames)
    assert all(full[f["seq"]] == f for f in EXCERPT_FRAMES)


def test_decoded_fields_say_what_the_controller_did():
    frames = _by_seq(EXCERPT_FRAMES)
    _, boot = _round_trip(frames[0])  # broker 1 became controller and tells itself who is alive
    assert (boot.controller_id, boot.controller_epoch, boot.broker_epoch, boot.type_) == (1, 1, 28, 0)
    assert boot.topic_states == ()
    [broker] = boot.live_brokers
    assert broker.id_ == 1 and broker.rack is None
    assert [(e.host, e.listener, e.security_protocol) for e in broker.endpoints] == [("127.0.0.1", "PLAINTEXT", 0)]

    _, create = _round_trip(frames[21])  # topic creation: LeaderAndIsr with is_new to broker 2
    assert (create.controller_epoch, create.broker_epoch, create.type_, create.is_k_raft_controller) == (1, 67, 0, False)
    [topic] = create.topic_states
    assert topic.topic_name == "s16-zk-cluster" and isinstance(topic.topic_id, uuid.UUID)
    states = {p.partition_index: p for p in topic.partition_states}
    assert (states[0].leader, states[0].isr, states[0].replicas) == (2, (2, 3, 1), (2, 3, 1))
    assert all(p.is_new and p.leader_epoch == 0 and p.partition_epoch == 0 for p in states.values())
    _, created = _round_trip(frames[26])
    assert created.error_code == ErrorCode.none
    assert created.topics[0].topic_id == topic.topic_id

    _, stale = _round_trip(frames[736])  # the resent full state after broker 2 died
    errors = {p.error_code for t in stale.topics for p in t.partition_errors}
    assert stale.error_code == ErrorCode.none and ErrorCode.stale_controller_epoch in errors

    _, offline = _round_trip(frames[740])
    assert all(p.offline_replicas == (2,) for t in offline.topic_states for p in t.partition_states)
    assert sorted(b.id_ for b in offline.live_brokers) == [1, 3]

    _, shutdown = _round_trip(frames[1190])
    assert (shutdown.broker_id, shutdown.broker_epoch) == (3, 68)
    _, shutdown_done = _round_trip(frames[1229])
    assert shutdown_done.error_code == ErrorCode.none and shutdown_done.remaining_partitions == ()

    _, stop = _round_trip(frames[1209])
    stopped = {(t.topic_name, p.partition_index): p for t in stop.topic_states for p in t.partition_states}
    assert set(stopped) == {("__consumer_offsets", 2), ("s16-zk-cluster", 2)}
    assert not any(p.delete_partition for p in stopped.values())
    assert stopped[("s16-zk-cluster", 2)].leader_epoch == 1


def test_a_frame_decoded_with_bytes_left_over_is_refused():
    frame = _by_seq(EXCERPT_FRAMES)[1209]
    raw = bytes.fromhex(frame["hex"])
    with pytest.raises(ib.TrailingBytes):
        ib.decode_request(raw + b"\x00")
    header, body = ib.decode_request(raw + b"\x00", strict=False)
    assert body.controller_id == 1


# -- the frame guard ----------------------------------------------------------------------------------

HOSTILE_COUNT = b"\xff\xff\xff\xff\x0f"  # a compact length of 2^32-2: kio alone reserves 34 GB and aborts


def _leader_and_isr_v7(**values):
    from pykbroker.protocol.interbroker.leader_and_isr.v7.request import LeaderAndIsrRequest

    fields = dict(controller_id=1, controller_epoch=1, broker_epoch=5, type_=0, topic_states=(), live_leaders=())
    return LeaderAndIsrRequest(**{**fields, **values})


def _hostile_frames() -> dict[str, tuple]:
    """(direction, api key, version, frame without size prefix) with one count the frame cannot hold."""
    empty = ib.encode_request(_leader_and_isr_v7(), correlation_id=7, client_id="1", size_prefix=False)
    assert empty.endswith(b"\x01\x01\x00")  # topic_states, live_leaders (empty compact arrays), no tags
    return {
        # LeaderAndIsr v7 request: topic_states count.
        "leader_and_isr_request": ("request", 4, 7, empty[:-3] + HOSTILE_COUNT + b"\x01\x00"),
        # LeaderAndIsr v7 response: correlation id, header tags, error code, then the topics count.
        "leader_and_isr_response": ("response", 4, 7, bytes.fromhex("00000007" "00" "0000") + HOSTILE_COUNT + b"\x00"),
        # UpdateMetadata v8 response: correlation id, header tags, error code, then the body's tag count.
        "update_metadata_response": ("response", 6, 8, bytes.fromhex("00000007" "00" "0000") + HOSTILE_COUNT),
    }


def test_hostile_counts_are_refused_by_the_guard_before_kio_reads_them():
    """In a subprocess, as tests/unit/test_request_guard.py does: should a frame reach kio's reader, the
    process aborts, and that fails this test only."""
    frames = {name: (direction, key, version, frame.hex()) for name, (direction, key, version, frame)
              in _hostile_frames().items()}
    script = f"""
from pykbroker.protocol import interbroker as ib
from pykbroker.protocol.guard import MalformedRequest
for name, (direction, key, version, frame) in {frames!r}.items():
    frame = bytes.fromhex(frame)
    try:
        if direction == "request":
            ib.decode_request(frame)
        else:
            ib.decode_response(key, version, frame)
    except MalformedRequest as exc:
        print("refused", name, exc)
    except Exception as exc:
        print("other", name, repr(exc))
"""
    import subprocess

    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"decoder died with {result.returncode}: {result.stderr[-2000:]}"
    refused = sorted(line.split()[1] for line in result.stdout.splitlines() if line.startswith("refused "))
    assert refused == sorted(frames), result.stdout


def test_the_guard_is_built_once_per_api_version_and_passes_valid_frames():
    codec = ib.codec_for(4, 7)
    assert codec.api_codec().check_request_body is codec.api_codec().check_request_body is codec.check_request_body
    for frame in EXCERPT_FRAMES:
        raw = bytes.fromhex(frame["hex"])
        codec = ib.codec_for(frame["api_key"], frame["api_version"])
        if frame["dir"] == "request":
            _, start = codec.read_request_header(raw, 0)
            assert codec.check_request_body(raw, start) == len(raw)
        else:
            _, start = codec.read_response_header(raw, 0)
            assert codec.check_response_body(raw, start) == len(raw)


def test_controller_requests_are_not_held_to_the_client_request_element_budget():
    # UpdateMetadata names every partition of the cluster with its replicas and ISR: past 250,000
    # elements at ~36,000 partitions. The per-array bound against the frame's bytes still holds.
    from pykbroker.protocol.guard import MAX_REQUEST_ELEMENTS
    from pykbroker.protocol.interbroker.leader_and_isr.v7.request import (
        LeaderAndIsrPartitionState,
        LeaderAndIsrTopicState,
    )

    replicas = tuple(range(MAX_REQUEST_ELEMENTS + 1))
    state = LeaderAndIsrPartitionState(partition_index=0, controller_epoch=1, leader=1, leader_epoch=1, isr=replicas,
                                       partition_epoch=1, replicas=replicas)
    topic = LeaderAndIsrTopicState(topic_name="t", topic_id=uuid.UUID(int=1), partition_states=(state,))
    frame = ib.encode_request(_leader_and_isr_v7(topic_states=(topic,)), correlation_id=1, client_id="1",
                              size_prefix=False)
    _, body = ib.decode_request(frame)
    assert len(body.topic_states[0].partition_states[0].isr) == MAX_REQUEST_ELEMENTS + 1


# -- building frames ----------------------------------------------------------------------------------


def test_encode_request_builds_the_header_and_size_prefix():
    from pykbroker.protocol.interbroker.stop_replica.v4.request import (
        StopReplicaPartitionState, StopReplicaRequest, StopReplicaTopicState)

    body = StopReplicaRequest(controller_id=1, controller_epoch=5, broker_epoch=70, topic_states=(
        StopReplicaTopicState(topic_name="t", partition_states=(
            StopReplicaPartitionState(partition_index=0, leader_epoch=3, delete_partition=True),)),))
    frame = ib.encode_request(body, correlation_id=42, client_id="1")
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    header, decoded = ib.decode_request(frame[4:])
    assert (header.request_api_key, header.request_api_version, header.correlation_id, header.client_id) == (
        5, 4, 42, "1")
    assert decoded == body



def test_an_old_non_flexible_version_matches_bytes_written_by_hand_from_the_spec():
    """No capture has the pre-flexible versions: UpdateMetadata v4 spelled out byte by byte instead
    (int32 array counts, int16 string lengths, -1 for the null rack, no tagged fields)."""
    from pykbroker.protocol.interbroker.update_metadata.v4.request import (
        UpdateMetadataBroker, UpdateMetadataEndpoint, UpdateMetadataPartitionState, UpdateMetadataRequest)

    body = UpdateMetadataRequest(
        controller_id=1, controller_epoch=2,
        ungrouped_partition_states=(UpdateMetadataPartitionState(
            topic_name="t", partition_index=0, controller_epoch=2, leader=1, leader_epoch=3, isr=(1,),
            zk_version=4, replicas=(1, 2), offline_replicas=(2,)),),
        live_brokers=(UpdateMetadataBroker(id_=1, endpoints=(UpdateMetadataEndpoint(
            port=9092, host="h", listener="L", security_protocol=0),), rack=None),))
    expected = bytes.fromhex(
        "00000001" "00000002"                                       # controller id, controller epoch
        "00000001" "000174" "00000000" "00000002" "00000001" "00000003"  # 1 partition: t/0, ce 2, leader 1, le 3
        "00000001" "00000001" "00000004" "00000002" "00000001" "00000002"  # isr [1], zk 4, replicas [1, 2]
        "00000001" "00000002"                                       # offline [2]
        "00000001" "00000001" "00000001" "00002384" "000168" "00014c" "0000" "ffff")  # broker 1: 9092 h L, no rack
    frame = ib.encode_request(body, correlation_id=1, client_id="c", size_prefix=False)
    assert frame == bytes.fromhex("0006" "0004" "00000001" "000163") + expected  # request header v1
    assert ib.decode_request(frame)[1] == body

def test_controlled_shutdown_v0_uses_request_header_v0_without_client_id():
    from pykbroker.protocol.interbroker.controlled_shutdown.v0.request import ControlledShutdownRequest

    frame = ib.encode_request(ControlledShutdownRequest(broker_id=3), correlation_id=7, client_id="ignored",
                              size_prefix=False)
    assert frame == bytes.fromhex("0007" "0000" "00000007" "00000003")
    header, body = ib.decode_request(frame)
    assert not hasattr(header, "client_id") and body.broker_id == 3


def test_flexible_responses_get_header_v1_and_old_ones_header_v0():
    from pykbroker.protocol.interbroker.update_metadata.v5.response import UpdateMetadataResponse as V5
    from pykbroker.protocol.interbroker.update_metadata.v8.response import UpdateMetadataResponse as V8

    assert ib.encode_response(V5(error_code=ErrorCode.none), correlation_id=9, size_prefix=False) == bytes.fromhex(
        "00000009" "0000")
    assert ib.encode_response(V8(error_code=ErrorCode.stale_controller_epoch), correlation_id=9,
                              size_prefix=False) == bytes.fromhex("00000009" "00" "000b" "00")


def test_api_codec_plugs_into_the_servers_response_framing():
    codec = ib.codec_for(6, 8).api_codec()
    from pykbroker.protocol.interbroker.update_metadata.v8.response import UpdateMetadataResponse

    frame = b"".join(framing.encode_response(codec, 3, UpdateMetadataResponse(error_code=ErrorCode.none)))
    assert frame == bytes.fromhex("00000008" "00000003" "00" "0000" "00")
    request = _by_seq(EXCERPT_FRAMES)[0]
    header, _ = codec.read_request_header(bytes.fromhex(request["hex"]), 0)
    assert header.client_id == "1"


def test_unknown_keys_and_versions_are_refused():
    for api_key, version in ((4, 8), (5, 5), (6, 9), (7, 4), (3, 0), (56, 3)):
        with pytest.raises(ib.UnknownInterBrokerApi):
            ib.codec_for(api_key, version)


def test_the_interbroker_apis_are_served_only_in_cluster_mode():
    assert INTERBROKER_KEYS.isdisjoint(apis_for(cluster=False))
    assert INTERBROKER_KEYS <= set(apis_for(cluster=True))
    assert all(apis_for(cluster=True)[key].cluster_only for key in INTERBROKER_KEYS)
    request = bytes.fromhex(_by_seq(EXCERPT_FRAMES)[21]["hex"])
    with pytest.raises(framing.UnsupportedRequest):  # a single broker closes the connection, as for any unknown API
        framing.decode_request(request, framing.read_prefix(request), apis_for(cluster=False))
    prefix = framing.read_prefix(request)
    decoded = framing.decode_request(request, prefix, apis_for(cluster=True))
    assert decoded.api_key == prefix.api_key and decoded.body.controller_epoch >= 0


# -- generator ----------------------------------------------------------------------------------------


def _generator():
    import importlib.util

    spec = importlib.util.spec_from_file_location("generate_interbroker_codecs",
                                                  REPO / "scripts" / "generate_interbroker_codecs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up there
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def test_committed_modules_are_exactly_what_the_specs_generate():
    generator = _generator()
    files = generator.generate()
    assert len(files) == 2 * (8 + 5 + 9 + 4) + 26 + 4 + 3 + 1  # request/response, version and api inits, header, index
    differing = [str(path.relative_to(REPO)) for path, text in files.items()
                 if not path.exists() or path.read_text() != text]
    assert differing == [], "run python3 scripts/generate_interbroker_codecs.py"


def test_generator_naming_and_version_ranges():
    generator = _generator()
    assert [generator.snake_case(n) for n in ("isKRaftController", "V0Host", "Type", "ZkVersion", "Id")] == [
        "is_k_raft_controller", "v0_host", "type_", "zk_version", "id_"]
    versions = generator.Versions.parse("3-5")
    assert [v for v in range(8) if v in versions] == [3, 4, 5]
    assert 9 in generator.Versions.parse("6+") and 0 not in generator.Versions.parse("none")
    assert generator.strip_comments('// c\n{"a": 1} \n  // d').strip() == '{"a": 1}'


def test_spec_fields_land_in_the_versions_they_belong_to():
    def names(api_key, version, direction="request"):
        load = ib.load_request_schema if direction == "request" else ib.load_response_schema
        return [f.name for f in dataclasses.fields(load(api_key, version))]

    assert names(4, 7) == ["controller_id", "is_k_raft_controller", "controller_epoch", "broker_epoch", "type_",
                           "topic_states", "live_leaders"]
    assert names(4, 1) == ["controller_id", "controller_epoch", "ungrouped_partition_states", "live_leaders"]
    assert names(4, 4, "response") == ["error_code", "partition_errors"]
    assert names(4, 5, "response") == ["error_code", "topics"]
    assert names(5, 0) == ["controller_id", "controller_epoch", "delete_partitions", "ungrouped_partitions"]
    assert names(6, 0)[-1] == "live_brokers"
    type_field = {f.name: f for f in dataclasses.fields(ib.load_request_schema(6, 8))}["type_"]
    assert type_field.metadata == {"kafka_type": "int8", "tag": 0}
    assert ib.load_request_schema(4, 3).__flexible__ is False and ib.load_request_schema(4, 4).__flexible__


# -- properties ---------------------------------------------------------------------------------------

ALL_VERSIONS = [(api_key, version) for api_key, entry in sorted(ib.APIS.items())
                for version in range(entry.min_version, entry.max_version + 1)]
PROPERTY_SETTINGS = settings(max_examples=25, derandomize=True, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("api_key, version", ALL_VERSIONS)
@pytest.mark.parametrize("direction", ["request", "response"])
def test_every_entity_round_trips(api_key, version, direction):
    codec = ib.codec_for(api_key, version)
    entity_type = getattr(codec, f"{direction}_type")
    write = getattr(codec, f"write_{direction}_body")
    read = getattr(codec, f"read_{direction}_body")

    @PROPERTY_SETTINGS
    @given(st.from_type(entity_type))
    def check(entity):
        buffer = io.BytesIO()
        write(buffer, entity)
        data = buffer.getvalue()
        decoded, size = read(data, 0)
        assert size == len(data)
        assert decoded == entity

    check()


@PROPERTY_SETTINGS
@given(st.sampled_from(ALL_VERSIONS).flatmap(
    lambda kv: st.tuples(st.from_type(ib.load_request_schema(*kv)), st.integers(-(2**31), 2**31 - 1),
                         st.none() | st.text(max_size=20))))
def test_whole_request_frames_round_trip(case):
    body, correlation_id, client_id = case
    frame = ib.encode_request(body, correlation_id=correlation_id, client_id=client_id)
    header, decoded = ib.decode_request(frame[4:])
    assert decoded == body and header.correlation_id == correlation_id
    if hasattr(header, "client_id"):
        assert header.client_id == client_id


# -- the generator follows kio's conventions ----------------------------------------------------------


def _generate_in_memory(generator, spec_name: str, version: int, kind: str):
    """Render one module for a spec the package does not generate, and import it under a private name."""
    import types

    spec = generator.load_spec(REPO / "protocol_specs" / "messages" / f"{spec_name}.json")
    module = types.ModuleType(f"_ib_generated_{spec_name}_v{version}")
    sys.modules[module.__name__] = module
    exec(compile(generator.Module(spec, version, kind).render(), module.__name__, "exec", dont_inherit=True),
         module.__dict__)
    return module


def _shape(entity_type) -> list[tuple]:
    def type_name(annotation):  # "tuple[BrokerId, ...]", "UUID | None", "PartitionData": no module paths
        if isinstance(annotation, type):
            return annotation.__name__
        return re.sub(r"\b[\w.]+\.(\w+)", r"\1", str(annotation))

    return [(f.name, dict(f.metadata), repr(f.default), type_name(f.type)) for f in dataclasses.fields(entity_type)]


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("kind", ["request", "response"])
def test_generated_entities_match_kios_own_for_a_spec_both_know(version, kind):
    """AlterPartition (56) is in Kafka 3.7.1 and in kio: the generator, run on the 3.7.1 spec, must make the
    same classes (names, field names, kio metadata, defaults, types) and the same bytes as kio's."""
    from importlib import import_module

    from kio.serial import entity_reader, entity_writer

    spec_name = f"AlterPartition{kind.capitalize()}"
    mine = _generate_in_memory(_generator(), spec_name, version, kind)
    theirs = import_module(f"kio.schema.alter_partition.v{version}.{kind}")
    their_classes = {name: cls for name, cls in vars(theirs).items()
                     if dataclasses.is_dataclass(cls) and cls.__module__ == theirs.__name__}
    assert their_classes and set(their_classes) <= set(vars(mine))
    for name, cls in their_classes.items():
        assert _shape(getattr(mine, name)) == _shape(cls), name
        for marker in ("__version__", "__flexible__", "__api_key__", "__header_schema__"):
            assert getattr(getattr(mine, name), marker) == getattr(cls, marker)

    top = getattr(mine, spec_name)
    their_top = getattr(theirs, spec_name)
    write_theirs, read_mine, write_mine = entity_writer(their_top), entity_reader(top), entity_writer(top)

    @PROPERTY_SETTINGS
    @given(st.from_type(their_top))
    def same_bytes(entity):
        buffer = io.BytesIO()
        write_theirs(buffer, entity)
        data = buffer.getvalue()
        decoded, size = read_mine(data, 0)
        assert size == len(data)
        again = io.BytesIO()
        write_mine(again, decoded)
        assert again.getvalue() == data

    same_bytes()

"""The frame guard (protocol/guard.py): valid requests of every advertised version pass, exactly where kio
says they end; every length or count that does not fit the frame is refused before kio sees it.

The guard itself never calls kio, so its tests run in process. Whatever hands a hostile frame to kio's
native reader (decode_request) runs in a subprocess: should the guard ever let such a frame through,
the reader aborts the process, and that must fail one test, not kill the test run.
"""

from __future__ import annotations

import dataclasses
import io
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer

from integration.fuzz.frames import build_entity, covered_versions, generated_frames
from pykbroker.protocol.apis import SUPPORTED_APIS, codec_for
from pykbroker.protocol.guard import MAX_REQUEST_ELEMENTS, MalformedRequest, compile_request_check, read_uvarint

REPO_ROOT = Path(__file__).resolve().parents[2]

# The frame from issue 7 (without its size prefix): Metadata v12, client id "c", topics = compact array
# whose length varint ff ff ff ff 0f says 2^32-2 topics. kio 0.6.5 alone aborts the process on it.
ISSUE_FRAME = bytes.fromhex("0003000c0000000100016300ffffffff0f010000")


def _body(api_key: int, version: int, seed: int = 1, **values) -> tuple[type, bytes]:
    schema = load_request_schema(api_key, version)
    out = io.BytesIO()
    entity_writer(schema)(out, dataclasses.replace(build_entity(schema, random.Random(seed)), **values))
    return schema, out.getvalue()


def _refused(schema: type, body: bytes, match: str) -> None:
    with pytest.raises(MalformedRequest, match=match):
        compile_request_check(schema)(body, 0)


@pytest.mark.parametrize("api_key", sorted(SUPPORTED_APIS))
def test_valid_requests_of_every_version_end_where_kio_ends_and_no_truncation_passes(api_key):
    api = SUPPORTED_APIS[api_key]
    rng = random.Random(api_key)
    for version in range(api.min_version, api.max_version + 1):
        schema = codec_for(api_key, version).request_type  # kio's, or the generated inter-broker schemas
        check, read = compile_request_check(schema), entity_reader(schema)
        for _ in range(4):
            out = io.BytesIO()
            entity_writer(schema)(out, build_entity(schema, rng))
            body = b"\x07\x07" + out.getvalue()  # a prefix, as the header precedes the body in a frame
            _, used = read(body, 2)
            assert check(body, 2) == 2 + used == len(body), f"{api.name} v{version}"
            for cut in range(2, len(body)):
                with pytest.raises(MalformedRequest):
                    check(body[:cut], 2)


def test_the_issue_frame_is_refused_by_its_array_count():
    codec = codec_for(3, 12)
    header, position = codec.read_request_header(ISSUE_FRAME, 0)
    assert header.client_id == "c"
    with pytest.raises(MalformedRequest, match="array count 4294967294"):
        codec.check_request_body(ISSUE_FRAME, position)


def test_legacy_array_count_beyond_the_frame_is_refused():
    # Metadata v4: int32 topic count 0x7fffffff (kio would reserve 16 GB), then allow_auto_topic_creation.
    _refused(load_request_schema(3, 4), b"\x7f\xff\xff\xff\x01", "array count 2147483647")
    _refused(load_request_schema(3, 4), b"\xff\xff\xff\xfe\x01", "negative length or count -2")


def test_a_request_naming_more_elements_than_the_bound_is_refused_in_all_arrays_together():
    # Metadata v1: an int32 topic count, then empty topic names (int16 length 0): 2 bytes an element.
    schema = load_request_schema(3, 1)
    check = compile_request_check(schema)
    at_bound = MAX_REQUEST_ELEMENTS.to_bytes(4, "big") + bytes(2 * MAX_REQUEST_ELEMENTS)
    assert check(at_bound, 0) == len(at_bound)
    over = (MAX_REQUEST_ELEMENTS + 1).to_bytes(4, "big") + bytes(2 * (MAX_REQUEST_ELEMENTS + 1))
    _refused(schema, over, f"past {MAX_REQUEST_ELEMENTS} elements")
    # ListOffsets v1: topics x partitions count together.
    half = MAX_REQUEST_ELEMENTS // 2
    partition = bytes(12)  # partition index int32 + timestamp int64
    topic = b"\x00\x01t" + half.to_bytes(4, "big") + partition * half
    body = b"\xff\xff\xff\xff" + (2).to_bytes(4, "big") + topic * 2
    _refused(load_request_schema(2, 1), body, "elements")


def test_null_arrays_and_strings_pass_the_guard():
    # Metadata v4 with a null topic list (all topics) and Metadata v12 with a null compact list.
    assert compile_request_check(load_request_schema(3, 4))(b"\xff\xff\xff\xff\x01", 0) == 5
    assert compile_request_check(load_request_schema(3, 12))(b"\x00\x01\x00\x00", 0) == 4
    # Produce v3: transactional id null (int16 -1), acks, timeout, no topics.
    assert compile_request_check(load_request_schema(0, 3))(b"\xff\xff" + bytes(6) + bytes(4), 0) == 12


def test_string_and_records_lengths_beyond_the_frame_are_refused():
    schema = load_request_schema(0, 7)  # legacy encodings: int16 string lengths, int32 records length
    one_partition = b"\x00\x00\x00\x01" + b"\x00\x01t" + b"\x00\x00\x00\x01" + b"\x00\x00\x00\x00"
    _refused(schema, b"\x7f\xff" + bytes(6), "past the end|more than the frame")
    _refused(schema, b"\xff\xff" + bytes(6) + one_partition + b"\x7f\xff\xff\xff" + b"x" * 10,
             "more than the frame")
    flexible = load_request_schema(0, 9)  # compact records length ff ff ff ff 0f
    _refused(flexible, b"\x00" + bytes(6) + b"\x02\x02t\x02" + bytes(4) + b"\xff\xff\xff\xff\x0f\x00\x00\x00",
             "past the end|more than the frame")


def test_varints_longer_than_five_bytes_are_refused():
    with pytest.raises(MalformedRequest, match="longer than 5 bytes"):
        read_uvarint(b"\x80\x80\x80\x80\x80\x01", 0, 6)
    assert read_uvarint(b"\xff\xff\xff\xff\x0f", 0, 5) == (2**32 - 1, 5)
    _refused(load_request_schema(3, 12), b"\x81\x80\x80\x80\x80\x01\x01\x00\x00", "longer than 5 bytes")


def test_tagged_fields_are_bounded_known_ones_must_fill_their_size_unknown_ones_are_skipped():
    # Fetch v12: top-level tagged field 0 is cluster_id (compact string); without it the body ends with
    # its tagged-field count, 0.
    schema, body = _body(1, 12, cluster_id=None)
    assert body[-1] == 0
    check = compile_request_check(schema)
    untagged = body[:-1]
    assert check(untagged + b"\x01\x00\x03\x03ab", 0) == len(untagged) + 6  # cluster_id "ab": 3 bytes
    _refused(schema, untagged + b"\x01\x00\x05\x03abcd", "does not fill its 5 bytes")
    _refused(schema, untagged + b"\x01\x00\x7f\x02a", "runs past the frame")
    _refused(schema, untagged + b"\xff\xff\xff\xff\x0f", "tagged fields")
    assert check(untagged + b"\x01\x07\x02zz", 0) == len(untagged) + 5  # unknown tag 7: skipped by size


def test_hostile_frames_through_decode_request_close_the_connection_without_aborting():
    """In a subprocess: the issue's frame and its legacy twin reach decode_request and come back as
    FrameError (the connection is closed with one log line), while kio alone still aborts on them."""
    script = textwrap.dedent(f"""
        from pykbroker.protocol.framing import FrameError, decode_request, read_prefix
        frames = [bytes.fromhex({ISSUE_FRAME.hex()!r}),
                  bytes.fromhex("000300040000000100016300" + "7fffffff01")]
        for frame in frames:
            try:
                decode_request(frame, read_prefix(frame))
            except FrameError as exc:
                print("refused:", exc)
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, f"decoder died with {result.returncode}: {result.stderr[-2000:]}"
    assert result.stdout.count("refused: cannot decode Metadata") == 2, result.stdout


def test_every_advertised_version_is_in_the_generated_corpus():
    advertised = {(a.key, v) for a in SUPPORTED_APIS.values() for v in range(a.min_version, a.max_version + 1)}
    assert covered_versions(generated_frames(per_version=1)) == advertised

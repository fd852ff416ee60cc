"""The log cleaner's offset map (pykbroker._speedups.OffsetMap, 24 bytes a slot, and its pure-Python twin
pykbroker.log.cleaner._OffsetMapPy): put / get, the exact "map full" rule, digests (every key is digested:
no raw key is stored, so no key can pass for another's digest), SipHash-128 against the reference vectors,
the C record walk on malformed records, and a seeded random run against a dict model."""

from __future__ import annotations

import os
import random
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pykbroker.log import cleaner
from pykbroker.log.cleaner import CleanerConfig, _OffsetMapPy, walk_records
from pykbroker.protocol.records import BATCH_HEADER_SIZE, build_batch, scan_records

try:
    from pykbroker._speedups import OffsetMap as COffsetMap, siphash128
except ImportError:  # built without a C compiler (or before OffsetMap existed)
    COffsetMap = siphash128 = None

needs_c = pytest.mark.skipif(COffsetMap is None, reason="pykbroker._speedups.OffsetMap is not built")
IMPLEMENTATIONS = [pytest.param(COffsetMap, id="c", marks=needs_c), pytest.param(_OffsetMapPy, id="python")]
SECRET = bytes(range(16))


def digest_of(map_type, secret: bytes, key: bytes) -> bytes:
    """The 16-byte digest an implementation keys ``key`` by."""
    if map_type is _OffsetMapPy:
        return _OffsetMapPy(2, 1, secret)._digest(key)
    return siphash128(secret, key)


def records_of(records, base_offset: int = 0) -> bytes:
    return bytes(build_batch(records, base_offset=base_offset)[BATCH_HEADER_SIZE:])


def zigzag(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    raw &= (1 << 64) - 1
    out = bytearray()
    while raw >= 0x80:
        out.append(raw & 0x7F | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def record(key_length: int, key: bytes, value_length: int, value: bytes, delta: int = 0, size: int | None = None,
           tail: bytes = b"\x00") -> bytes:
    """One record with chosen (possibly wrong) lengths; ``tail`` is the header count."""
    body = b"\x00" + zigzag(0) + zigzag(delta) + zigzag(key_length) + key + zigzag(value_length) + value + tail
    return zigzag(len(body) if size is None else size) + body


# -- put / get -------------------------------------------------------------------------------------


@pytest.mark.parametrize("map_type", IMPLEMENTATIONS)
def test_put_get_and_overwrite(map_type):
    offsets = map_type(100, 90, os.urandom(16))
    assert len(offsets) == 0 and offsets.latest_offset == -1
    assert offsets.get(b"a") == -1 and offsets.get(b"a", None) is None
    assert offsets.put(b"a", 5) and offsets.put(b"b", 6) and offsets.put(b"", 7)  # the empty key is a key
    assert offsets.put(b"a", 9)
    assert (offsets.get(b"a"), offsets.get(b"b"), offsets.get(b""), offsets.get(b"c")) == (9, 6, 7, -1)
    assert len(offsets) == 3 and offsets.latest_offset == 9
    assert offsets.put(memoryview(b"xa")[1:], 10) and offsets.get(bytearray(b"a")) == 10  # any buffer


@pytest.mark.parametrize("map_type", IMPLEMENTATIONS)
def test_a_full_map_refuses_new_keys_at_its_exact_capacity_and_still_updates_known_ones(map_type):
    offsets = map_type(11, 10, os.urandom(16))
    assert all(offsets.put(b"k%d" % i, i) for i in range(10))
    assert len(offsets) == 10 == offsets.capacity
    assert not offsets.put(b"k10", 10)  # the 11th key
    assert len(offsets) == 10 and offsets.get(b"k10") == -1 and offsets.latest_offset == 9
    assert offsets.put(b"k3", 11) and offsets.get(b"k3") == 11  # a key already there: updated even when full
    assert [offsets.get(b"k%d" % i) for i in range(10)] == [0, 1, 2, 11, 4, 5, 6, 7, 8, 9]


@pytest.mark.parametrize("map_type", IMPLEMENTATIONS)
def test_wrong_dimensions_and_secrets_are_refused(map_type):
    for slots, capacity in ((10, 10), (10, 0), (1, 1), (5, 9)):
        with pytest.raises(ValueError):
            map_type(slots, capacity, SECRET)
    with pytest.raises(ValueError):
        map_type(10, 9, b"short")


@needs_c
def test_offsets_out_of_range_are_refused():
    offsets = COffsetMap(10, 9, SECRET)
    for offset in (-1, (1 << 63) - 1):
        with pytest.raises(ValueError):
            offsets.put(b"k", offset)
    assert len(offsets) == 0


@pytest.mark.parametrize("map_type", IMPLEMENTATIONS)
def test_every_key_is_digested_so_a_16_byte_key_equal_to_a_digest_is_another_key(map_type):
    """Every key, 16 bytes or not, is stored as its keyed digest (no raw keys, so no tag is needed): a key whose
    bytes equal another key's digest is a different entry, and without the secret it cannot be found."""
    offsets = map_type(100, 90, SECRET)
    long_key = b"a key longer than sixteen bytes"
    forged = digest_of(map_type, SECRET, long_key)
    assert len(forged) == 16
    assert offsets.put(long_key, 1) and offsets.put(forged, 2)
    assert offsets.get(long_key) == 1 and offsets.get(forged) == 2 and len(offsets) == 2
    short = b"sixteen bytes!!!"
    assert offsets.put(short, 3) and offsets.put(digest_of(map_type, SECRET, short), 4)
    assert offsets.get(short) == 3 and len(offsets) == 4


@pytest.mark.parametrize("map_type", IMPLEMENTATIONS)
def test_the_digest_depends_on_the_map_secret(map_type):
    assert digest_of(map_type, SECRET, b"k") != digest_of(map_type, bytes(16), b"k")
    assert digest_of(map_type, SECRET, b"k") == digest_of(map_type, SECRET, b"k")


# -- SipHash-2-4, 128-bit output -------------------------------------------------------------------

# The reference implementation's vectors_sip128 (github.com/veorq/SipHash vectors.h): key 00 01 .. 0f,
# message 00 01 .. (n-1) for length n.
SIP128_VECTORS = {
    0: "a3817f04ba25a8e66df67214c7550293",
    1: "da87c1d86b99af44347659119b22fc45",
    7: "a1f1ebbed8dbc153c0b84aa61ff08239",
    8: "3b62a9ba6258f5610f83e264f31497b4",
    9: "264499060ad9baabc47f8b02bb6d71ed",
    15: "5493e99933b0a8117e08ec0f97cfc3d9",
    16: "6ee2a4ca67b054bbfd3315bf85230577",
    17: "473d06e8738db89854c066c47ae47740",
    63: "5150d1772f50834a503e069a973fbd7c",
}


@needs_c
@pytest.mark.parametrize("length", sorted(SIP128_VECTORS))
def test_siphash128_matches_the_reference_vectors(length):
    assert siphash128(SECRET, bytes(range(length))).hex() == SIP128_VECTORS[length]


@needs_c
def test_siphash128_refuses_a_secret_that_is_not_16_bytes():
    with pytest.raises(ValueError):
        siphash128(b"\0" * 15, b"m")


# -- the record walk: add_records / filter_records -------------------------------------------------


@pytest.mark.parametrize("map_type", IMPLEMENTATIONS)
def test_add_records_skips_null_keys_and_offsets_below_the_start(map_type):
    data = records_of([(b"a", b"1"), (None, b"2"), (b"b", b"3"), (b"a", None)], base_offset=100)
    offsets = map_type(100, 90, os.urandom(16))
    assert offsets.add_records(data, 4, 100, 101)
    assert (offsets.get(b"a"), offsets.get(b"b"), len(offsets)) == (103, 102, 2)


@pytest.mark.parametrize("map_type", IMPLEMENTATIONS)
def test_add_records_reports_a_map_that_filled_up_and_keeps_what_fitted(map_type):
    data = records_of([(b"k%d" % i, b"v") for i in range(5)] + [(b"k0", b"again")])
    offsets = map_type(4, 3, os.urandom(16))
    assert not offsets.add_records(data, 6, 0, 0)
    assert [offsets.get(b"k%d" % i) for i in range(5)] == [0, 1, 2, -1, -1] and len(offsets) == 3
    offsets = map_type(6, 5, os.urandom(16))
    assert offsets.add_records(data, 6, 0, 0)  # exactly full: the repeated key still fits
    assert offsets.get(b"k0") == 5 and len(offsets) == 5


@pytest.mark.parametrize("map_type", IMPLEMENTATIONS)
def test_filter_records_keeps_the_latest_of_each_key_and_tombstones_only_when_asked(map_type):
    batch = [(b"a", b"1"), (None, b"x"), (b"b", b"2"), (b"a", b"3"), (b"b", None), (b"c", b"5")]
    data = records_of(batch, base_offset=10)
    walked = walk_records(data, len(batch))
    offsets = map_type(100, 90, os.urandom(16))
    assert offsets.add_records(data, len(batch), 10, 10)
    kept, out = offsets.filter_records(data, len(batch), 10, 14, False)  # offset 15 (c) is past the map
    assert kept == 2 and out == data[walked[3][3]:walked[3][4]] + data[walked[5][3]:walked[5][4]]
    kept, out = offsets.filter_records(data, len(batch), 10, 14, True)
    assert kept == 3 and out == b"".join(data[s:e] for _, _, _, s, e in (walked[3], walked[4], walked[5]))
    assert offsets.filter_records(data, len(batch), 10, 9, False) == (len(batch), None)  # all past the map
    assert walk_records(out, 3)[0][1] == b"a"


@needs_c
def test_a_negative_key_length_other_than_minus_one_is_a_null_key_as_on_produce():
    """Kafka's DefaultRecord and scan_records read any negative length as null: a record the broker accepted
    on produce must stay cleanable (else one such record would make its partition uncleanable for good)."""
    data = record(-2, b"", 1, b"v") + record(1, b"k", 1, b"v", delta=1)
    assert isinstance(scan_records(data, 2), tuple)  # accepted on produce
    offsets = COffsetMap(10, 9, SECRET)
    assert offsets.add_records(data, 2, 0, 0) and len(offsets) == 1 and offsets.get(b"k") == 1
    assert offsets.filter_records(data, 2, 0, 1, True) == (1, record(1, b"k", 1, b"v", delta=1))


MALFORMED = {
    "truncated length varint": b"\x80",
    "empty data": b"",
    "length varint of 6 bytes": b"\xff\xff\xff\xff\xff\x01",
    "negative record size": zigzag(-5) + b"\x00" * 8,
    "zero record size": zigzag(0),
    "record past the end": record(1, b"k", 1, b"v")[:-1],
    "size past the end": record(1, b"k", 1, b"v", size=50),
    "key past the record": record(40, b"k", 1, b"v"),
    "value past the record": record(1, b"k", 40, b"v"),
    "truncated timestamp varint": zigzag(2) + b"\x00\x80",
    "truncated key length": zigzag(4) + b"\x00\x00\x00\x80",
    "record shorter than its key": record(1, b"k", 1, b"v", size=4) + b"\x00" * 8,
}


@pytest.mark.parametrize("map_type", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_records_raise_instead_of_reading_past_the_data(name, map_type):
    data = MALFORMED[name]
    offsets = map_type(10, 9, SECRET)
    with pytest.raises(ValueError, match="record 0"):
        offsets.add_records(data, 1, 0, 0)
    with pytest.raises(ValueError, match="record 0"):
        offsets.filter_records(data, 1, 0, 100, True)
    good = record(1, b"k", 1, b"v")
    with pytest.raises(ValueError, match="record 1"):  # the second record of the batch
        offsets.add_records(good + data, 2, 0, 0)


@pytest.mark.parametrize("map_type", IMPLEMENTATIONS)
def test_more_records_declared_than_the_data_holds_raise(map_type):
    data = records_of([(b"a", b"1"), (b"b", b"2")])
    with pytest.raises(ValueError, match="record 2"):
        map_type(10, 9, SECRET).add_records(data, 3, 0, 0)
    with pytest.raises(ValueError, match="record 2"):
        map_type(10, 9, SECRET).filter_records(data, 3, 0, 5, False)


@needs_c
def test_an_offset_overflow_raises():
    data = record(1, b"k", 1, b"v", delta=5)
    with pytest.raises(ValueError, match="overflows"):
        COffsetMap(10, 9, SECRET).add_records(data, 1, (1 << 63) - 2, 0)


@pytest.mark.parametrize("map_type", IMPLEMENTATIONS)
@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64), count=st.integers(0, 4))
def test_random_bytes_never_crash_the_walk(map_type, data, count):
    offsets = map_type(50, 45, SECRET)
    for call in (lambda: offsets.add_records(data, count, 0, 0), lambda: offsets.filter_records(data, count, 0, 3, True),
                 lambda: offsets.map_records(data, count * 1000, 0, 0)):  # (more records than bytes too)
        try:
            call()
        except ValueError:
            pass


# -- against a model -------------------------------------------------------------------------------


@pytest.mark.parametrize("map_type", IMPLEMENTATIONS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_seeded_random_run_agrees_with_a_dict_model(map_type, seed):
    rng = random.Random(seed)
    capacity = rng.randint(50, 400)
    offsets = map_type(int(capacity / 0.9) + 1, capacity, rng.randbytes(16))
    model: dict[bytes, int] = {}
    pool = [rng.randbytes(rng.randint(0, 40)) for _ in range(capacity * 2)]
    for offset in range(capacity * 8):
        key = rng.choice(pool)
        stored = offsets.put(key, offset)
        assert stored == (key in model or len(model) < capacity)
        if stored:
            model[key] = offset
        assert len(offsets) == len(model)
    assert all(offsets.get(key) == model.get(key, -1) for key in pool)


@pytest.mark.parametrize("map_type", IMPLEMENTATIONS)
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, b"a", b"b", b"c" * 20, b"d", b""]), st.booleans()), min_size=1,
                max_size=30),
       st.integers(0, 10), st.integers(0, 35), st.booleans(), st.integers(1, 6))
def test_batches_are_mapped_and_filtered_as_the_per_record_rule_says(map_type, batch, start, latest, retain, capacity):
    data = records_of([(key, None if null else b"v") for key, null in batch], base_offset=100)
    offsets = map_type(capacity + 1, capacity, os.urandom(16))
    model: dict[bytes, int] = {}
    fits = True
    for delta, key, _, _, _ in walk_records(data, len(batch)):
        if key is None or 100 + delta < 100 + start:
            continue
        if key not in model and len(model) >= capacity:
            fits = False
            break
        model[key] = 100 + delta
    assert offsets.add_records(data, len(batch), 100, 100 + start) == fits
    assert {key: offsets.get(key) for key in model} == model and len(offsets) == len(model)
    kept = [(s, e) for delta, key, null, s, e in walk_records(data, len(batch))
            if 100 + delta > 100 + latest or (key is not None and 100 + delta >= model.get(key, -1)
                                              and (not null or retain))]
    expected = (len(batch), None) if len(kept) == len(batch) else (len(kept), b"".join(data[s:e] for s, e in kept))
    assert offsets.filter_records(data, len(batch), 100, 100 + latest, retain) == expected


@pytest.mark.parametrize("map_type", IMPLEMENTATIONS)
@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from([None, b"a", b"b", b"c" * 20, b"d", b""]), st.booleans()),
                         min_size=1, max_size=12), min_size=1, max_size=4),
       st.integers(0, 60), st.booleans(), st.integers(1, 6))
def test_summaries_of_the_map_pass_count_what_filter_records_keeps_once_the_map_is_complete(map_type, batches, latest,
                                                                                             retain, capacity):
    """map_records does add_records' work (same map, same "full" answer); after every batch is mapped,
    kept_records on a batch's summary counts the records filter_records keeps of it."""
    mapped, twin = map_type(capacity + 1, capacity, SECRET), map_type(capacity + 1, capacity, SECRET)
    summaries = []
    base = 100
    for batch in batches:
        data = records_of([(key, None if null else b"v") for key, null in batch], base_offset=base)
        summary = mapped.map_records(data, len(batch), base, 100)
        assert (summary is not None) == twin.add_records(data, len(batch), base, 100)
        if summary is None:
            break
        summaries.append((data, len(batch), base, summary))
        base += len(batch)
    assert len(mapped) == len(twin) and mapped.latest_offset == twin.latest_offset
    for data, count, base, summary in summaries:
        kept, _ = mapped.filter_records(data, count, base, 100 + latest, retain)
        assert mapped.kept_records(summary, base, 100 + latest, retain) == kept


@pytest.mark.parametrize("map_type", IMPLEMENTATIONS)
def test_a_summary_with_records_below_the_start_cannot_tell(map_type):
    data = records_of([(b"a", b"1"), (None, b"x"), (b"a", b"2")], base_offset=10)
    offsets = map_type(10, 9, SECRET)
    summary = offsets.map_records(data, 3, 10, 11)  # offset 10 is below the start: not mapped
    assert offsets.get(b"a") == 12
    assert offsets.kept_records(summary, 10, 12, True) == -1
    assert offsets.kept_records(summary, 10, 9, True) == 3  # all past the map: no lookup needed


@pytest.mark.parametrize("map_type", IMPLEMENTATIONS)
def test_map_records_refuses_malformed_records_as_add_records_does(map_type):
    with pytest.raises(ValueError, match="record 1"):
        map_type(10, 9, SECRET).map_records(record(1, b"k", 1, b"v") + MALFORMED["record past the end"], 2, 0, 0)
    with pytest.raises(ValueError, match="record 2"):  # more records declared than the data holds
        map_type(10, 9, SECRET).map_records(records_of([(b"a", b"1"), (b"b", b"2")]), 3, 0, 0)


@needs_c
def test_a_summary_that_is_not_one_is_refused():
    offsets = COffsetMap(10, 9, SECRET)
    with pytest.raises(ValueError, match="not a record summary"):
        offsets.kept_records(b"\x00" * 15, 0, 5, True)
    assert offsets.map_records(b"", 0, 0, 0) == b""
    # a slot past the map's buffer (a summary of another map) is not read: unknown
    assert offsets.kept_records((10**6).to_bytes(8, sys.byteorder) + bytes(8), 0, 5, True) == -1


# -- memory ----------------------------------------------------------------------------------------


@needs_c
def test_a_map_for_n_keys_takes_24_bytes_a_slot_over_the_load_factor():
    n = 1_000_000
    config = CleanerConfig(dedupe_buffer_size=int(24 * n / 0.9) + 24, threads=1, load_factor=0.9)
    assert cleaner.MAP_ENTRY_BYTES == 24
    assert config.map_capacity == n
    offsets = COffsetMap(config.map_slots, config.map_capacity, SECRET)
    assert offsets.nbytes == 24 * config.map_slots <= 24 * n / 0.9 + 24
    assert offsets.__sizeof__() - offsets.nbytes < 128  # the object around the buffer
    assert (offsets.slots, offsets.capacity) == (config.map_slots, n)

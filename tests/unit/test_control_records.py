from pykbroker.protocol.control_records import ABORT, COMMIT, Marker, control_type, marker_batch, read_marker
from pykbroker.protocol.records import build_batch, read_header, read_records


def test_marker_batch_is_a_transactional_control_batch_with_kafkas_record_layout():
    batch = marker_batch(producer_id=5, producer_epoch=2, commit=False, coordinator_epoch=7, timestamp_ms=1000)
    header = read_header(batch, 0)
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence, header.record_count) == (5, 2, -1, 1)
    (record,) = read_records(batch, header)
    assert record.key == b"\x00\x00\x00\x00"  # version 0, type ABORT
    assert record.value == b"\x00\x00\x00\x00\x00\x07"  # version 0, coordinator epoch 7
    assert read_marker(batch, header) == Marker(commit=False, coordinator_epoch=7)


def test_read_marker_ignores_data_batches_and_unknown_control_types():
    data = build_batch([(b"k", b"v")])
    assert read_marker(data, read_header(data, 0)) is None
    leader_change = build_batch([(b"\x00\x00\x00\x02", b"")], attributes=0x20)
    assert read_marker(leader_change, read_header(leader_change, 0)) is None
    assert control_type(b"\x00") is None
    assert (control_type(b"\x00\x00\x00\x01"), COMMIT, ABORT) == (1, 1, 0)

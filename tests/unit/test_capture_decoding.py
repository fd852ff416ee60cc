"""The wire captures decode with kio exactly, and the replay library's broker-free parts work on them.

No broker here: these tests check the fixtures (every request decodes at its header version and leaves no
bytes, every response pairs with its request) and the comparison / patching logic that
tests/integration/test_wire_replay.py relies on, so a replay mismatch is the broker's and not the tool's.
"""

from __future__ import annotations

import dataclasses

import pytest
from kio.schema.errors import ErrorCode

from pykbroker.protocol import records
from tests import wire_replay as wr

CAPTURES = {path.name: wr.load_capture(path) for path in wr.capture_paths()}


def _capture(prefix: str) -> wr.Capture:
    return next(capture for name, capture in CAPTURES.items() if name.startswith(prefix))


def _frames(direction: str):
    return [pytest.param(capture, frame, id=f"{name[:2]}-seq{frame.seq}-{frame.api_name}")
            for name, capture in CAPTURES.items() for frame in capture.frames if frame.direction == direction]


def test_all_sixteen_captures_are_present():
    assert len(CAPTURES) == 16  # 01-15 and 17; 16 (a 3-broker ZooKeeper cluster) is not for replay (index.md)
    # files 01-14, then files 15 and 17 (index.md, Verification)
    assert sum(len(c.frames) for c in CAPTURES.values()) == 742 + 310 + 456


@pytest.mark.parametrize("capture, frame", _frames("request"))
def test_request_decodes_at_its_header_version_with_no_bytes_left(capture, frame):
    header, body = wr.decode_request(frame.payload)  # raises DecodeError on leftover bytes
    assert (header.request_api_key, header.request_api_version) == (frame.api_key, frame.api_version)
    assert header.correlation_id == frame.correlation_id
    assert header.client_id == frame.client_id
    assert type(header) is type(body).__header_schema__
    assert wr.encode(header, body) == frame.payload


@pytest.mark.parametrize("capture, frame", _frames("response"))
def test_response_decodes_and_answers_a_request_on_its_connection(capture, frame):
    header, body = wr.decode_response(frame.api_key, frame.api_version, frame.payload)
    assert header.correlation_id == frame.correlation_id
    assert wr.encode(header, body) == frame.payload
    requests = [f for f in capture.requests() if f.conn == frame.conn and f.correlation_id == frame.correlation_id
                and f.seq < frame.seq]
    assert len(requests) == 1 and requests[0].api_key == frame.api_key


def test_api_versions_v4_answers_are_the_v0_fallback():
    frame = next(f for f in _capture("02").responses() if f.api_key == 18 and f.api_version == 4)
    _, body = wr.decode_response(18, 4, frame.payload)
    assert body.__version__ == 0 and body.error_code == ErrorCode.unsupported_version
    assert [(k.api_key, k.min_version, k.max_version) for k in body.api_keys] == [(18, 0, 3)]


def test_only_the_documented_requests_have_no_answer():
    unanswered = {(name[:2], frame.seq) for name, capture in CAPTURES.items()
                  for frame in capture.requests() if capture.response_to(frame) is None}
    assert unanswered == {("10", 15), ("10", 16), ("10", 62), ("10", 68), ("10", 98), ("10", 103), ("11", 38),
                          ("12", 34)}


def test_scenario_topics_are_the_ones_the_clients_asked_for():
    assert _capture("12").scenario_topics() == {"s12-kcat"}  # not the 15 topics of its Metadata-for-all answer
    assert _capture("14").scenario_topics() == {"s14-kafka-cli-admin"}
    assert _capture("15").scenario_topics() == {"s15-kafka-tools"}  # not the setup topic `warmup`
    assert _capture("07").scenario_topics() == {"s07b-spark-stream-availablenow"}
    assert _capture("17").scenario_topics() == {"s17-transactions", "s17-txn-output"}


# -- comparison ---------------------------------------------------------------------------------------


def _decoded_responses():
    for name, capture in CAPTURES.items():
        for frame in capture.responses():
            yield pytest.param(capture, frame, id=f"{name[:2]}-seq{frame.seq}-{frame.api_name}")


@pytest.mark.parametrize("capture, frame", list(_decoded_responses()))
def test_a_response_matches_itself(capture, frame):
    _, body = wr.decode_response(frame.api_key, frame.api_version, frame.payload)
    state = wr.ReplayState.for_capture(capture)
    ctx = state.context(capture.scenario_topics())
    ctx.requested_version = frame.api_version
    findings = wr.compare_responses(frame.api_key, body, body, ctx)
    assert [f for f in findings if f.severity == "mismatch"] == []


def _first_response(prefix: str, api_key: int, predicate=lambda body: True):
    capture = _capture(prefix)
    for frame in capture.responses():
        if frame.api_key == api_key:
            _, body = wr.decode_response(frame.api_key, frame.api_version, frame.payload)
            if predicate(body):
                return capture, frame, body
    raise LookupError(prefix, api_key)


def _compare(capture, api_key, expected, actual, **ctx_fields):
    ctx = wr.ReplayState.for_capture(capture).context(capture.scenario_topics())
    for key, value in ctx_fields.items():
        setattr(ctx, key, value)
    return wr.compare_responses(api_key, expected, actual, ctx)


def _with_partition(body, topic_field: str, change):
    topic = getattr(body, topic_field)[0]
    partitions = (change(topic.partitions[0]),) + topic.partitions[1:]
    return dataclasses.replace(body, **{topic_field: (dataclasses.replace(topic, partitions=partitions),)
                                        + getattr(body, topic_field)[1:]})


def test_a_different_partition_error_code_is_a_mismatch_naming_the_partition():
    capture, _, body = _first_response("04", 2)
    changed = _with_partition(body, "topics",
                              lambda p: dataclasses.replace(p, error_code=ErrorCode.unknown_topic_or_partition))
    findings = _compare(capture, 2, body, changed)
    assert len(findings) == 1
    assert findings[0].path == "topics[name=s04-java-consumer-assign].partitions[partition_index=0].error_code"
    assert findings[0].expected == "none(0)" and findings[0].got == "unknown_topic_or_partition(3)"


def test_a_different_high_watermark_and_missing_records_are_mismatches():
    capture, _, body = _first_response("05", 1, lambda b: any(p.records for t in b.responses for p in t.partitions))
    changed = _with_partition(body, "responses", lambda p: dataclasses.replace(p, high_watermark=0, records=b""))
    paths = {f.path.rsplit(".", 1)[-1] for f in _compare(capture, 1, body, changed)}
    assert {"high_watermark", "records batches", "records record count"} <= paths


def test_a_missing_partition_is_a_mismatch_but_partition_order_is_not():
    capture, _, body = _first_response("04", 2)
    topic = body.topics[0]
    reordered = dataclasses.replace(body, topics=(dataclasses.replace(topic, partitions=topic.partitions[::-1]),))
    assert _compare(capture, 2, body, reordered) == []
    shorter = dataclasses.replace(body, topics=(dataclasses.replace(topic, partitions=topic.partitions[1:]),))
    paths = [f.path for f in _compare(capture, 2, body, shorter)]
    assert "topics[name=s04-java-consumer-assign].partitions length" in paths
    assert "topics[name=s04-java-consumer-assign].partitions[partition_index=0]" in paths


def test_broker_identity_values_are_ignored():
    capture, _, body = _first_response("04", 3, lambda b: b.topics)
    other = dataclasses.replace(
        body, cluster_id="another-cluster", controller_id=7,
        brokers=tuple(dataclasses.replace(b, node_id=7, host="10.0.0.1", port=1) for b in body.brokers),
        topics=tuple(dataclasses.replace(t, partitions=tuple(
            dataclasses.replace(p, leader_id=7, leader_epoch=5, replica_nodes=(7,), isr_nodes=(7,))
            for p in t.partitions)) for t in body.topics))
    assert _compare(capture, 3, body, other) == []


def test_metadata_for_all_topics_is_compared_on_the_scenario_topic_only():
    capture, _, body = _first_response("12", 3, lambda b: len(b.topics) > 1)
    own = tuple(t for t in body.topics if t.name == "s12-kcat")
    assert _compare(capture, 3, body, dataclasses.replace(body, topics=own), all_topics_metadata=True) == []
    findings = _compare(capture, 3, body, dataclasses.replace(body, topics=()), all_topics_metadata=True)
    assert [f.path for f in findings] == ["topics length", "topics[name=s12-kcat]"]


def test_fetch_session_id_is_compared_loosely_but_not_invented():
    capture, _, opened = _first_response("04", 1, lambda b: b.session_id != 0)
    assert _compare(capture, 1, opened, dataclasses.replace(opened, session_id=0)) == []
    _, _, closed = _first_response("04", 1, lambda b: b.session_id == 0)
    assert [f.path for f in _compare(capture, 1, closed, dataclasses.replace(closed, session_id=9))] == ["session_id"]


def test_api_versions_fallback_and_newer_support_are_both_accepted_but_a_wrong_range_is_not():
    capture, frame, fallback = _first_response("02", 18, lambda b: b.error_code == ErrorCode.unsupported_version)
    _, _, full = _first_response("02", 18, lambda b: b.error_code == ErrorCode.none)
    assert _compare(capture, 18, fallback, fallback, requested_version=4) == []
    supports_v4 = dataclasses.replace(full, api_keys=tuple(
        dataclasses.replace(k, max_version=4) if k.api_key == 18 else k for k in full.api_keys))
    assert [f.severity for f in _compare(capture, 18, fallback, supports_v4, requested_version=4)] == ["note"]
    findings = _compare(capture, 18, fallback, full, requested_version=4)  # answers v4 but advertises 0-3
    assert [f.path for f in findings] == ["api_keys[18]"]


def _broker_configs():
    return _first_response("15", 32, lambda b: b.results[0].resource_name == "1")


def _with_config(body, name: str, **change):
    result = body.results[0]
    configs = tuple(dataclasses.replace(c, **change) if c.name == name else c for c in result.configs)
    return dataclasses.replace(body, results=(dataclasses.replace(result, configs=configs),))


def test_a_broker_config_value_from_kafkas_server_properties_is_a_note_but_a_default_value_is_not():
    capture, _, body = _broker_configs()
    findings = _compare(capture, 32, body, _with_config(body, "listeners", value=None, config_source=5))
    assert findings and {f.severity for f in findings} == {"note"}  # source 4: the capture's config file
    findings = _compare(capture, 32, body, _with_config(body, "log.cleaner.min.compaction.lag.ms", value="7"))
    assert [(f.path, f.severity) for f in findings] == [
        ("results[resource_name=1].configs[name=log.cleaner.min.compaction.lag.ms].value", "mismatch")]


def test_read_only_is_a_note_only_for_the_dynamic_configs_pykbroker_reads_at_start():
    capture, _, body = _broker_configs()
    findings = _compare(capture, 32, body, _with_config(body, "max.connections", read_only=True))
    assert [f.severity for f in findings] == ["note"]
    findings = _compare(capture, 32, body, _with_config(body, "log.retention.ms", read_only=True))
    assert [(f.path, f.severity) for f in findings] == [
        ("results[resource_name=1].configs[name=log.retention.ms].read_only", "mismatch")]


def test_log_dir_path_and_disk_space_are_ignored_and_only_setup_topic_sizes_are_notes():
    capture, _, body = _first_response("15", 35)
    result = body.results[0]

    def resized(topic_name):
        topics = tuple(dataclasses.replace(t, partitions=tuple(
            dataclasses.replace(p, partition_size=p.partition_size + 1) for p in t.partitions))
            if t.name == topic_name else t for t in result.topics)
        return dataclasses.replace(body, results=(dataclasses.replace(result, topics=topics),))

    elsewhere = dataclasses.replace(body, results=(dataclasses.replace(
        result, log_dir="/elsewhere", total_bytes=1, usable_bytes=1),))
    assert _compare(capture, 35, body, elsewhere) == []
    assert [f.severity for f in _compare(capture, 35, body, resized("__consumer_offsets"))] == ["note"]
    assert [f.severity for f in _compare(capture, 35, body, resized("warmup"))] == ["note"]
    findings = _compare(capture, 35, body, resized("s15-kafka-tools"))
    assert findings and {f.severity for f in findings} == {"mismatch"}


def test_the_setup_group_member_speaks_kafkas_consumer_protocol():
    from pykbroker.groups.classic.group import subscription_topics

    assert subscription_topics(wr.consumer_protocol("warmup")) == ["warmup"]
    # Assignment v0: version, [topic, [partitions]], user data null
    assert wr.consumer_protocol("warmup", [0, 2]) == bytes.fromhex(
        "0000" "00000001" "0006") + b"warmup" + bytes.fromhex("00000002" "00000000" "00000002" "ffffffff")


# -- patching -----------------------------------------------------------------------------------------


def test_producer_id_patch_rewrites_every_batch_and_keeps_the_crc_valid():
    capture = _capture("02")
    produce = next(f for f in capture.requests() if f.api_key == 0)
    _, body = wr.decode_request(produce.payload)
    data = body.topic_data[0].partition_data[0].records
    original = records.read_header(data)
    patched = wr.patch_producer_ids(data, {(original.producer_id, original.producer_epoch): (4242, 3)})
    header = records.read_header(patched)
    assert (header.producer_id, header.producer_epoch) == (4242, 3)
    assert header.base_sequence == original.base_sequence and header.record_count == original.record_count
    assert records.crc_matches(patched, header) and not records.crc_matches(patched, original)
    assert wr.patch_producer_ids(data, {(999, 0): (1, 1)}) is data


def test_state_patches_topic_ids_and_leader_epochs_learned_from_the_broker():
    capture = _capture("04")
    state = wr.ReplayState.for_capture(capture)
    new_id = wr.uuid.UUID(int=12345)
    state.actual_topic_ids["s04-java-consumer-assign"] = new_id
    state.leader_epochs[("s04-java-consumer-assign", 2)] = 7
    fetch = next(f for f in capture.requests() if f.api_key == 1)
    _, body = wr.decode_request(fetch.payload)
    patched = state.patch(body)
    assert patched.topics[0].topic_id == new_id
    epochs = {p.partition: p.current_leader_epoch for p in patched.topics[0].partitions}
    assert epochs == {0: 0, 1: 0, 2: 7}


def test_without_a_broker_session_an_incremental_fetch_becomes_a_full_fetch_of_every_partition():
    capture = _capture("05")
    fetches = [f for f in capture.requests() if f.api_key == 1]
    state = wr.ReplayState.for_capture(capture)
    _, first = wr.decode_request(fetches[0].payload)
    _, first_answer = wr.decode_response(1, 16, capture.response_to(fetches[0]).payload)
    state.record_fetch(first, first, first_answer, dataclasses.replace(first_answer, session_id=0))
    _, incremental = wr.decode_request(fetches[1].payload)
    sent, session = state.prepare_fetch(incremental)
    assert (sent.session_id, sent.session_epoch) == (0, 0) and session is not None
    assert sorted(p.partition for t in sent.topics for p in t.partitions) == [0, 1, 2]
    _, incremental_answer = wr.decode_response(1, 16, capture.response_to(fetches[1]).payload)
    assert incremental_answer.responses == ()  # Kafka: nothing changed, nothing listed
    full = state.full_fetch_expectation(session, incremental_answer)
    hwms = {p.partition_index: (p.high_watermark, p.records) for t in full.responses for p in t.partitions}
    assert hwms == {0: (56, b""), 1: (77, b""), 2: (67, b"")}
    _, close = wr.decode_request(fetches[2].payload)
    sent_close, _ = state.prepare_fetch(close)
    assert (sent_close.session_id, sent_close.session_epoch, sent_close.topics) == (0, -1, ())


def test_with_a_broker_session_ids_are_mapped_and_epochs_kept():
    capture = _capture("04")
    fetches = [f for f in capture.requests() if f.api_key == 1]
    state = wr.ReplayState.for_capture(capture)
    _, first = wr.decode_request(fetches[0].payload)
    _, answer = wr.decode_response(1, 16, capture.response_to(fetches[0]).payload)
    state.record_fetch(first, first, answer, dataclasses.replace(answer, session_id=77))
    _, incremental = wr.decode_request(fetches[1].payload)
    sent, converted = state.prepare_fetch(incremental)
    assert (sent.session_id, sent.session_epoch, converted) == (77, 1, None)


# -- preconditions ------------------------------------------------------------------------------------


def _counts(stored):
    counts = {}
    for batch in stored:
        counts[batch.partition] = counts.get(batch.partition, 0) + records.read_header(batch.data).record_count
    return counts


def test_setup_data_comes_from_the_fetched_batches_not_from_the_files_own_produces():
    assert _counts(wr.preloaded_batches(_capture("05"))) == {0: 56, 1: 77, 2: 67}
    assert wr.preloaded_batches(_capture("09")) == []  # everything fetched there was produced in the file
    later = [b for b in wr.preloaded_batches(_capture("10"))]
    assert _counts(later) == {0: 13, 1: 25, 2: 12} and {b.base_offset for b in later} == {68, 76, 77, 56}
    phases = {b.producer_id for b in wr.preloaded_batches(_capture("07"))}
    assert len(phases) == 2  # the first 200 records and the 50 written between the two Spark runs


def test_generated_setup_data_lands_like_the_capture_helpers_did():
    stored = wr.generated_batches("s14-kafka-cli-admin", 200, 3)
    assert _counts(stored) == {0: 56, 1: 77, 2: 67}  # file 14's ListOffsets LATEST answers
    first = records.read_records(stored[0].data, records.read_header(stored[0].data))[0]
    assert first.key.startswith(b"setup-key-") and first.value.startswith(b"setup-value-")


def test_member_id_generation_and_producer_id_learned_from_answers_are_patched_into_later_requests():
    capture = _capture("09")
    state = wr.ReplayState.for_capture(capture)
    exchanges = {f.seq: f for f in capture.frames}

    def learn(request_seq, change):
        request = exchanges[request_seq]
        _, sent = wr.decode_request(request.payload)
        _, expected = wr.decode_response(request.api_key, request.api_version, capture.response_to(request).payload)
        state.learn(request.api_key, sent, expected, dataclasses.replace(expected, **change))
        return expected

    learn(8, {"producer_id": 9001, "producer_epoch": 2})  # InitProducerId
    joined = learn(36, {"member_id": "kafka-python-3.0.12-0000", "generation_id": 5})  # JoinGroup, generation 2
    _, commit = wr.decode_request(exchanges[48].payload)  # OffsetCommit with generation 2 and the member id
    assert (commit.member_id, commit.generation_id_or_member_epoch) == (joined.member_id, 2)
    patched = state.patch(commit)
    assert (patched.member_id, patched.generation_id_or_member_epoch) == ("kafka-python-3.0.12-0000", 5)
    _, sync = wr.decode_request(exchanges[38].payload)
    patched_sync = state.patch(sync)
    assert patched_sync.assignments[0].member_id == "kafka-python-3.0.12-0000" and patched_sync.generation_id == 5
    _, produce = wr.decode_request(exchanges[12].payload)
    for topic in state.patch(produce).topic_data:
        for partition in topic.partition_data:
            header = records.read_header(partition.records)
            assert (header.producer_id, header.producer_epoch) == (9001, 2)
            assert records.crc_matches(partition.records, header)


def test_every_capture_gets_its_setup_records_in_the_right_phase():
    records_per_phase = {}
    for name, capture in CAPTURES.items():
        setup = wr.ScenarioSetup(("127.0.0.1", 9), capture, wr.preconditions_for(capture), wr.ReplayState(), 1.0)
        records_per_phase[name[:2]] = {start: sum(_counts(stored).values()) for start, stored in setup.phases.items()}
    assert records_per_phase == {
        "01": {}, "02": {}, "03": {}, "08": {}, "09": {}, "11": {}, "12": {}, "13": {},  # they write their own
        "04": {-1: 200}, "05": {-1: 200}, "06": {-1: 200}, "14": {-1: 200},
        "07": {-1: 200, 88: 50},  # 50 more before Spark's second run
        "10": {65: 50},  # the producer is in the file; 50 more before consumer B
        "15": {-1: 1},  # the tools create their topic; one record in `warmup` for the warm-up group
        "17": {},  # every data batch is the file's own; its markers are the broker's, not setup data
    }
    assert wr.preconditions_for(_capture("15")).consumed_by_groups == (("warmup-group", "warmup"),)


# -- transactions (file 17) ---------------------------------------------------------------------------


def _exchange(capture, seq: int):
    """(captured request body, Kafka's answer body) of the request at `seq`."""
    request = next(f for f in capture.requests() if f.seq == seq)
    _, body = wr.decode_request(request.payload)
    answer = capture.response_to(request)
    return body, wr.decode_response(answer.api_key, answer.api_version, answer.payload)[1]


def test_kafkas_own_transaction_connections_are_found_by_client_id_and_only_in_file_17():
    capture = _capture("17")
    internal = capture.broker_internal_conns()
    assert {f.client_id for f in capture.requests() if f.conn in internal} == {
        "broker-1-txn-marker-sender", "AddPartitionsManager-client-1"}
    assert {f.api_name for f in capture.requests() if f.conn in internal} == {
        "WriteTxnMarkers", "AddPartitionsToTxn", "ApiVersions"}
    assert all(not c.broker_internal_conns() for name, c in CAPTURES.items() if not name.startswith("17"))
    assert capture.transactional_ids() == {2: "s17-txn", 3: "s17-kp-txn"}


def test_file_17_preconditions_are_its_topics_a_warm_transactional_id_and_its_broker_settings():
    preconditions = wr.preconditions_for(_capture("17"))
    assert preconditions.create_topics == ("s17-transactions", "s17-txn-output") and preconditions.partitions == 3
    assert preconditions.transactional_ids == ("capture-setup-txn",)
    assert preconditions.group_coordinators  # __consumer_offsets exists before the first FindCoordinator
    assert preconditions.broker_config["transaction.state.log.num.partitions"] == 1
    assert wr.preconditions_for(_capture("05")).broker_config == {}


def _learn_producers(capture, state, assigned: dict[int, tuple[int, int]]):
    """InitProducerId answers of the broker under test: request seq -> (producer id, epoch)."""
    for seq, (producer_id, epoch) in assigned.items():
        sent, expected = _exchange(capture, seq)
        state.learn(22, sent, expected, dataclasses.replace(expected, producer_id=producer_id, producer_epoch=epoch))


def test_a_fenced_producer_keeps_its_old_epoch_and_the_new_one_gets_the_brokers_new_epoch():
    capture = _capture("17")
    state = wr.ReplayState.for_capture(capture)
    _learn_producers(capture, state, {13: (7001, 0), 254: (7001, 4), 284: (7002, 0)})  # Kafka: 2/0, 2/2, 3/0
    assert state.producers == {(2, 0): (7001, 0), (2, 2): (7001, 4), (3, 0): (7002, 0)}

    def batch_producer(seq):
        produce, _ = _exchange(capture, seq)
        data = state.patch(produce).topic_data[0].partition_data[0].records
        header = records.read_header(data)
        assert records.crc_matches(data, header)
        return header.producer_id, header.producer_epoch

    assert batch_producer(20) == (7001, 0)
    assert batch_producer(256) == (7001, 0)  # the fenced producer's last Produce: still its old epoch
    assert batch_producer(264) == (7001, 4)  # the new producer's
    assert batch_producer(292) == (7002, 0)
    add_partitions, _ = _exchange(capture, 262)  # AddPartitionsToTxn v0: v3_and_below_ field names
    patched = state.patch(add_partitions)
    assert (patched.v3_and_below_producer_id, patched.v3_and_below_producer_epoch) == (7001, 4)
    end_txn, _ = _exchange(capture, 296)
    assert (state.patch(end_txn).producer_id, state.patch(end_txn).producer_epoch) == (7002, 0)
    add_offsets, _ = _exchange(capture, 91)
    assert (state.patch(add_offsets).producer_id, state.patch(add_offsets).producer_epoch) == (7001, 0)
    init, _ = _exchange(capture, 254)  # no producer yet: -1/-1 stays
    assert (state.patch(init).producer_id, state.patch(init).producer_epoch) == (-1, -1)


def test_txn_offset_commit_gets_the_brokers_producer_member_and_generation():
    capture = _capture("17")
    state = wr.ReplayState.for_capture(capture)
    _learn_producers(capture, state, {284: (7002, 3)})
    for seq, member, generation in ((324, "s17-kafka-python-ctp-consumer-x", 1), (330, "s17-kafka-python-ctp-consumer-x", 6)):
        sent, expected = _exchange(capture, seq)  # JoinGroup generations 1 and 2
        state.learn(11, sent, expected, dataclasses.replace(expected, member_id=member, generation_id=generation))
    commit, _ = _exchange(capture, 350)
    patched = state.patch(commit)
    assert (patched.producer_id, patched.producer_epoch) == (7002, 3)
    assert (patched.member_id, patched.generation_id) == ("s17-kafka-python-ctp-consumer-x", 6)


def test_an_epoch_never_assigned_keeps_its_distance_to_the_nearest_assigned_one():
    producers = {(2, 0): (50, 3), (2, 2): (50, 9)}
    assert wr.map_producer(producers, 2, 1) in ((50, 4), (50, 8))
    assert wr.map_producer(producers, 2, 3) == (50, 10)
    assert wr.map_producer(producers, 5, 0) is None and wr.map_producer(producers, -1, -1) is None


def _final_read_committed():
    """Kafka's answer to the final confluent read_committed Fetch from offset 0 (seq 405: every marker)."""
    capture = _capture("17")
    _, answer = _exchange(capture, 405)
    return capture, answer


def _partition0(body, change):
    topic = next(t for t in body.responses if any(p.partition_index == 0 for p in t.partitions))
    partitions = tuple(change(p) if p.partition_index == 0 else p for p in topic.partitions)
    return dataclasses.replace(body, responses=tuple(
        dataclasses.replace(t, partitions=partitions) if t is topic else t for t in body.responses))


def test_aborted_transactions_name_the_brokers_producer_ids_and_kafkas_first_offsets():
    capture, body = _final_read_committed()
    partition0 = next(p for t in body.responses for p in t.partitions if p.partition_index == 0)
    assert [(a.producer_id, a.first_offset) for a in partition0.aborted_transactions] == [(2, 6), (2, 13), (3, 20)]
    mapped = {2: {7001}, 3: {7002}}

    def renamed(pids):
        return _partition0(body, lambda p: dataclasses.replace(p, aborted_transactions=tuple(
            dataclasses.replace(a, producer_id=pid) for a, pid in zip(p.aborted_transactions, pids))))

    # The other partitions still name Kafka's 2 and 3: those are the mismatches left.
    other = {f.path for f in _compare(capture, 1, body, renamed([7001, 7001, 7002]), producer_ids=mapped)}
    assert not any("partition_index=0]" in path for path in other)
    findings = _compare(capture, 1, body, renamed([7001, 7002, 7002]), producer_ids=mapped)
    assert [f.path for f in findings if "partition_index=0]" in f.path] == [
        "responses[topic_id=s17-transactions].partitions[partition_index=0].aborted_transactions[1].producer_id"]
    shifted = _partition0(body, lambda p: dataclasses.replace(p, aborted_transactions=tuple(
        dataclasses.replace(a, first_offset=a.first_offset + 1) for a in p.aborted_transactions)))
    assert len(_compare(capture, 1, body, shifted)) == 3
    no_list = _partition0(body, lambda p: dataclasses.replace(p, aborted_transactions=None))
    assert [f.path.rsplit(".", 1)[-1] for f in _compare(capture, 1, body, no_list)] == ["aborted_transactions"]


def _with_marker(data: bytes, offset: int, *, commit: bool | None = None, coordinator_epoch: int | None = None) -> bytes:
    """The records with the marker at `offset` rewritten (type and/or coordinator epoch, CRC recomputed)."""
    from pykbroker.protocol import control_records

    out = bytearray()
    for header in records.iter_headers(data):
        batch = bytes(data[header.position:header.position + header.size])
        if header.base_offset == offset:
            marker = control_records.read_marker(data, header)
            rebuilt = control_records.marker_batch(
                producer_id=header.producer_id, producer_epoch=header.producer_epoch,
                commit=marker.commit if commit is None else commit,
                coordinator_epoch=marker.coordinator_epoch if coordinator_epoch is None else coordinator_epoch,
                timestamp_ms=header.base_timestamp)
            rebuilt[0:8] = offset.to_bytes(8, "big")  # base offset is outside the CRC
            batch = bytes(rebuilt)
        out += batch
    return bytes(out)


def test_markers_are_compared_by_offset_and_type_and_their_coordinator_epoch_is_a_note():
    capture, body = _final_read_committed()
    partition0 = next(p for t in body.responses for p in t.partitions if p.partition_index == 0)
    assert _compare(capture, 1, body, _partition0(body, lambda p: dataclasses.replace(
        p, records=_with_marker(partition0.records, 5)))) == []  # rebuilt identically
    epoch = _compare(capture, 1, body, _partition0(body, lambda p: dataclasses.replace(
        p, records=_with_marker(partition0.records, 5, coordinator_epoch=3))))
    assert [(f.severity, f.path.rsplit(" ", 2)[-2:]) for f in epoch] == [("note", ["coordinator", "epoch"])]
    flipped = _compare(capture, 1, body, _partition0(body, lambda p: dataclasses.replace(
        p, records=_with_marker(partition0.records, 5, commit=False))))
    assert [(f.severity, f.path.rsplit(" ", 2)[-2:]) for f in flipped] == [("mismatch", ["record", "#5"])]


def test_an_incremental_read_committed_fetch_turned_full_expects_no_aborted_transactions_where_nothing_changed():
    capture = _capture("17")
    fetches = [f for f in capture.requests() if f.api_key == 1 and f.conn == 34]  # kafka-python, a session
    state = wr.ReplayState.for_capture(capture)
    first, first_answer = _exchange(capture, fetches[0].seq)
    state.record_fetch(first, first, first_answer, dataclasses.replace(first_answer, session_id=0))
    second, second_answer = _exchange(capture, fetches[1].seq)
    sent, session = state.prepare_fetch(second)
    state.record_fetch(second, sent, second_answer, dataclasses.replace(second_answer, session_id=0))
    third, third_answer = _exchange(capture, fetches[2].seq)
    assert third_answer.responses == ()
    sent, session = state.prepare_fetch(third)
    full = state.full_fetch_expectation(session, third_answer)
    assert {(p.partition_index, p.high_watermark, p.last_stable_offset, p.aborted_transactions)
            for t in full.responses for p in t.partitions} == {(0, 23, 23, ()), (1, 18, 18, ()), (2, 2, 2, ())}


def test_a_refused_transactional_id_is_told_apart_from_retriable_and_other_errors():
    setup = wr.ScenarioSetup(("127.0.0.1", 9), _capture("17"), wr.preconditions_for(_capture("17")),
                             wr.ReplayState(), 1.0)
    far = wr.time.monotonic() + 60
    with pytest.raises(wr.TransactionsRefused, match="pykbroker does not support"):
        setup._check_retriable(ErrorCode.transactional_id_authorization_failed, "pykbroker does not support",
                               True, "FindCoordinator", far)
    with pytest.raises(wr.SetupError) as other:  # the same error for a group is not "no transactions"
        setup._check_retriable(ErrorCode.transactional_id_authorization_failed, None, False, "FindCoordinator", far)
    assert not isinstance(other.value, wr.TransactionsRefused)
    with pytest.raises(wr.SetupError) as invalid:
        setup._check_retriable(ErrorCode.invalid_transaction_timeout, None, True, "InitProducerId", far)
    assert not isinstance(invalid.value, wr.TransactionsRefused)
    setup._check_retriable(ErrorCode.coordinator_load_in_progress, None, True, "InitProducerId", far)  # retry
    setup._check_retriable(ErrorCode.concurrent_transactions, None, True, "InitProducerId", far)
    with pytest.raises(wr.SetupError, match="still after"):
        setup._check_retriable(ErrorCode.coordinator_not_available, None, True, "FindCoordinator", 0.0)


def test_the_replay_waits_for_each_transaction_kafkas_marker_sender_had_finished():
    capture = _capture("17")
    replayer = wr.Replayer(capture, ("127.0.0.1", 9), preconditions=wr.preconditions_for(capture))
    calls = []

    def pending(transactional_id, partitions, describe):
        calls.append((transactional_id, sorted(partitions), describe))
        return "s17-transactions-0: last stable offset 13 < high watermark 14" if len(calls) == 5 else None

    replayer.setup.transaction_pending = pending
    replayer.state.advertised = {65: (0, 0)}
    for frame in capture.frames:
        if frame.conn in replayer.internal_conns:
            replayer._broker_internal(frame)
    assert [c[0] for c in calls] == ["s17-txn"] * 6 + ["s17-kp-txn"] * 3  # after each of the 9 EndTxn/fences
    assert calls[2] == ("s17-txn", [("__consumer_offsets", 0), ("s17-txn-output", 0), ("s17-txn-output", 1)], True)
    assert all(describe for _, _, describe in calls)
    [difference] = replayer.result.differences
    assert (difference.seq, difference.api, difference.path) == (251, "WriteTxnMarkers v1", "transaction markers")
    assert "abort of 's17-txn'" in difference.expected and "13 < high watermark 14" in difference.got

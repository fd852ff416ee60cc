"""DeleteRecords does its file work (segment unlinks and closes, leader-epoch checkpoints) off the event loop
and waits for it before answering: other connections are served meanwhile, and a kill -9 right after the
answer keeps the new log start."""

from __future__ import annotations

import datetime
import threading
import time

from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.create_topics.v7 import request as ct
from kio.schema.delete_records.v2 import request as dr
from kio.schema.errors import ErrorCode
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import i16, i32, i32Timedelta, i64

from broker_process import fetch_raw, list_offset, send_request, send_request_now
from pykbroker.protocol.records import build_batch

TIMEOUT = datetime.timedelta(seconds=60)
PARTITIONS = 1000
# An ApiVersions answer is a few milliseconds of work (under 0.1 s here while the delete runs); the old code
# blocked it for the whole DeleteRecords (1.3 to 3.8 s here for 1,000 partitions, each fsync on the event
# loop). A generous bound for a loaded 2-core machine.
PROBE_BOUND_S = 0.5


def create_topic(address, name, partitions, configs=()):
    response = send_request(address, ct.CreateTopicsRequest(topics=(ct.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=-1, assignments=(),
        configs=tuple(ct.CreatableTopicConfig(name=key, value=value) for key, value in configs)),),
        timeout=TIMEOUT, validate_only=False), timeout=120)
    assert response.topics[0].error_code == ErrorCode.none


def produce(address, topic, partitions, batches_each=1):
    for round_number in range(batches_each):
        response = send_request(address, ProduceRequest(
            transactional_id=None, acks=i16(-1), timeout=i32Timedelta.parse(TIMEOUT),
            topic_data=(TopicProduceData(name=topic, partition_data=tuple(
                PartitionProduceData(index=i32(p), records=build_batch([(None, b"v%d" % round_number)]))
                for p in range(partitions))),)), timeout=60)
        assert {r.error_code for t in response.responses for r in t.partition_responses} == {ErrorCode.none}


def delete_request(topic, offsets):
    return dr.DeleteRecordsRequest(topics=(dr.DeleteRecordsTopic(name=topic, partitions=tuple(
        dr.DeleteRecordsPartition(partition_index=i32(p), offset=i64(o)) for p, o in offsets)),), timeout=TIMEOUT)


def answers(response):
    return {p.partition_index: (p.error_code, p.low_watermark) for t in response.topics for p in t.partitions}


def test_delete_records_of_1000_partitions_does_not_stall_other_connections(broker, topic_name):
    address = broker.address
    # tiny segments: each batch rolls a new one, so the delete also unlinks a segment per partition
    create_topic(address, topic_name, PARTITIONS, configs=[("segment.bytes", "100")])
    produce(address, topic_name, PARTITIONS, batches_each=2)
    pending = send_request_now(address, delete_request(topic_name, [(p, -1) for p in range(PARTITIONS)]),
                               timeout=120)
    result: dict = {}

    def wait_answer():
        try:
            result["response"] = pending()
        except Exception as exc:  # reported below
            result["error"] = exc

    waiter = threading.Thread(target=wait_answer)
    waiter.start()
    latencies = []
    while waiter.is_alive() or not latencies:
        started = time.monotonic()
        assert send_request(address, ApiVersionsRequest(), timeout=30).error_code == ErrorCode.none
        latencies.append(time.monotonic() - started)
        time.sleep(0.005)  # pacing only: leave the broker CPU for the delete
    waiter.join()
    assert "error" not in result, result
    assert answers(result["response"]) == {p: (ErrorCode.none, 2) for p in range(PARTITIONS)}
    assert max(latencies) < PROBE_BOUND_S, (len(latencies), max(latencies))
    assert list_offset(address, topic_name, PARTITIONS - 1, -2) == 2


def test_delete_records_across_segments_then_kill9_keeps_log_start(broker, topic_name):
    address = broker.address
    # tiny segments: each batch rolls a new one, so DeleteRecords unlinks whole segments
    create_topic(address, topic_name, 2, configs=[("segment.bytes", "100")])
    produce(address, topic_name, 2, batches_each=12)
    log_dir = broker.data_dir / f"{topic_name}-0"
    assert len(list(log_dir.glob("*.log"))) >= 10
    response = send_request(address, delete_request(topic_name, [(0, 9), (1, -1)]))
    assert answers(response) == {0: (ErrorCode.none, 9), 1: (ErrorCode.none, 12)}
    # the answer came after the files were gone: no segment wholly below the new start is left
    assert min(int(path.stem) for path in log_dir.glob("*.log")) == 9
    epochs = (log_dir / "leader-epoch-checkpoint").read_text().split("\n")
    assert epochs[2].split()[1] == "9", epochs
    broker.kill()
    broker.start()
    address = broker.address
    assert list_offset(address, topic_name, 0, -2) == 9
    assert list_offset(address, topic_name, 1, -2) == 12
    assert list_offset(address, topic_name, 0, -1) == 12
    assert fetch_raw(address, topic_name, 0, 9)

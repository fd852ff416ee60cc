"""Durability across stops, crashes and damaged files, checked with Jepsen's invariants: no acknowledged
record lost, none duplicated, no offset holding two values, offsets dense and never reused.

The per-client modules each restart a broker once; this module covers what is not client specific:
clean shutdown on SIGTERM/SIGINT, kill -9 in the middle of a produce stream, idempotent producer state
and producer ids after restarts, and recovery from a torn segment tail and a missing index. Records are
written with kafka-python's default (idempotent, acks=all) producer and the raw protocol.
"""

from __future__ import annotations

import signal
import time

import pytest
from kafka import KafkaProducer

from broker_process import (
    Rec,
    wait_until,
    assert_dense,
    assert_same_log,
    init_producer_id,
    keyed_workload,
    list_offset,
    produce_raw,
)
from kio.schema.errors import ErrorCode
from pykbroker.protocol.records import build_batch
from test_kafka_python import consume, create_topic, keyed_messages, produce

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 4


def segment_dir(broker, topic: str, partition: int):
    # Kafka's layout, which pykbroker keeps: <data-dir>/<topic>-<partition>/<base offset>.log|.index|...
    path = broker.data_dir / f"{topic}-{partition}"
    assert path.is_dir(), f"no partition directory {path}; data dir holds {sorted(broker.data_dir.iterdir())}"
    return path


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_shuts_down_cleanly_and_keeps_data(broker, topic_name, sig):
    create_topic(broker.bootstrap, topic_name)
    acked = produce(broker.bootstrap, topic_name, keyed_messages(keyed_workload(keys=8, per_key=5)))

    code = broker.stop(sig=sig)
    assert code == 0, f"exit code {code} after {signal.Signals(sig).name}"
    broker.start()

    assert_same_log(acked, consume(broker.bootstrap, topic_name, len(acked)))


def test_offsets_continue_across_alternating_restarts_and_kills(broker, topic_name):
    create_topic(broker.bootstrap, topic_name)
    pairs = keyed_workload(keys=8, per_key=20)
    acked = []
    for round_number, kill in enumerate([False, True, True, False]):
        acked += produce(broker.bootstrap, topic_name, keyed_messages(pairs[round_number * 40:(round_number + 1) * 40]))
        broker.restart(kill=kill)
        assert_dense(acked)
        assert_same_log(acked, consume(broker.bootstrap, topic_name, len(acked)))


ACKED_BEFORE_KILL = 400


def test_kill9_during_produce_stream_loses_and_duplicates_nothing(broker, topic_name):
    """kill -9 while an idempotent producer has batches in flight, then restart: the producer's retries
    complete, every acknowledged record sits at its acknowledged offset, and batches that were written
    but not acknowledged before the kill are recognised as duplicates instead of stored twice."""
    create_topic(broker.bootstrap, topic_name)
    pairs = keyed_workload(keys=16, per_key=150)  # 2,400 records
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    try:
        futures = []
        kill_index = None
        for index, (key, value) in enumerate(pairs):
            futures.append(producer.send(topic_name, key=key, value=value))
            if index == ACKED_BEFORE_KILL:
                # Never assume how fast acknowledgements come: wait for them, then send on and kill while
                # the producer's thread has the next records in flight.
                wait_until(lambda: sum(f.succeeded() for f in futures) >= ACKED_BEFORE_KILL,
                           f"{ACKED_BEFORE_KILL} acknowledged records", 60)
            if index == ACKED_BEFORE_KILL + 200:
                broker.kill()  # what is sent from here on is in flight, lost with the connection, or queued
                kill_index = index
            if kill_index is not None and index == kill_index + 300:
                broker.start()
        if not broker.is_running():
            broker.start()
        producer.flush(timeout=90)
        metadata = [f.get(timeout=30) for f in futures]
    finally:
        producer.close(timeout=10)

    acked = [Rec(m.partition, m.offset, k, v) for m, (k, v) in zip(metadata, pairs)]
    assert_dense(acked)
    assert_same_log(acked, consume(broker.bootstrap, topic_name, len(acked)))
    for partition in range(PARTITIONS):
        assert list_offset(broker.address, topic_name, partition, -1) == sum(1 for r in acked if r.partition == partition)


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_producer_ids_are_never_reused_after_restart(broker, how):
    before = {init_producer_id(broker.address)[0] for _ in range(3)}
    assert len(before) == 3, f"InitProducerId handed out a producer id twice: {before}"
    broker.restart(kill=how == "kill9")
    after = {init_producer_id(broker.address)[0] for _ in range(3)}
    assert len(after) == 3 and min(after) > max(before), f"before restart {before}, after {after}"


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_idempotent_producer_state_is_rebuilt_from_the_log(broker, topic_name, how):
    """After a restart the broker still knows the last sequences of each producer, from the log alone:
    a retry of the last batch is a duplicate, the next sequence appends, a gap is refused."""
    create_topic(broker.bootstrap, topic_name)
    producer_id, epoch = init_producer_id(broker.address)
    now = int(time.time() * 1000)

    def batch(base_sequence: int, count: int = 5) -> bytes:
        return bytes(build_batch([(b"k", f"seq-{base_sequence + i}".encode()) for i in range(count)],
                                 timestamp_ms=now, producer_id=producer_id, producer_epoch=epoch,
                                 base_sequence=base_sequence))

    assert produce_raw(broker.address, topic_name, 1, batch(0)).base_offset == 0
    assert produce_raw(broker.address, topic_name, 1, batch(5)).base_offset == 5

    broker.restart(kill=how == "kill9")

    retry = produce_raw(broker.address, topic_name, 1, batch(5))
    assert (retry.error_code, retry.base_offset) == (ErrorCode.none, 5), "retry after restart not deduplicated"
    assert list_offset(broker.address, topic_name, 1, -1) == 10
    gap = produce_raw(broker.address, topic_name, 1, batch(15))
    assert gap.error_code == ErrorCode.out_of_order_sequence_number
    following = produce_raw(broker.address, topic_name, 1, batch(10))
    assert (following.error_code, following.base_offset) == (ErrorCode.none, 10)
    consumed = consume(broker.bootstrap, topic_name, 15, partitions=[1])
    assert [(r.offset, r.value) for r in consumed] == [(i, f"seq-{i}".encode()) for i in range(15)]


def test_torn_segment_tail_is_truncated_on_restart(broker, topic_name):
    """A crash in the middle of a write leaves part of a batch at the end of the active segment. On
    start the broker must cut it off, serve everything before it, and append after it."""
    create_topic(broker.bootstrap, topic_name)
    acked = produce(broker.bootstrap, topic_name,
                    [{"key": b"k", "value": f"v{i}".encode(), "partition": 0} for i in range(20)])
    broker.kill()

    log_file = segment_dir(broker, topic_name, 0) / "00000000000000000000.log"
    size = log_file.stat().st_size
    torn = bytes(build_batch([(b"k", b"never acknowledged")] * 3, base_offset=20))[:40]
    with open(log_file, "ab") as f:
        f.write(torn)
    broker.start()

    assert list_offset(broker.address, topic_name, 0, -1) == 20
    assert_same_log(acked, consume(broker.bootstrap, topic_name, 20, partitions=[0]))
    more = produce(broker.bootstrap, topic_name, [{"key": b"k", "value": b"after recovery", "partition": 0}])
    assert [r.offset for r in more] == [20]
    assert log_file.stat().st_size > size, "append after truncation did not reach the segment"
    assert_same_log(acked + more, consume(broker.bootstrap, topic_name, 21, partitions=[0]))


def test_missing_index_files_are_rebuilt(broker, topic_name):
    create_topic(broker.bootstrap, topic_name)
    # Enough batches that a sparse index would have entries past the start.
    acked = []
    for chunk in range(10):
        acked += produce(broker.bootstrap, topic_name, [
            {"key": b"k", "value": bytes([chunk]) * 8192 + f"-{chunk}-{i}".encode(), "partition": 2}
            for i in range(10)])
    broker.kill()
    indexes = [p for p in segment_dir(broker, topic_name, 2).iterdir() if p.suffix in (".index", ".timeindex")]
    assert indexes, "no index files next to the segment"
    for path in indexes:
        path.unlink()
    broker.start()

    assert list_offset(broker.address, topic_name, 2, -1) == 100
    # Reading from the middle uses the (rebuilt) offset index.
    middle = consume(broker.bootstrap, topic_name, 23, partitions=[2], start=77)
    assert [r.offset for r in middle] == list(range(77, 100))
    assert [r.value for r in middle] == [r.value for r in acked[77:]]

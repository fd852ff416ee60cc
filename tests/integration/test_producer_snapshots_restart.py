"""Producer-state snapshots across a real broker's restarts: a topic with small segments (a snapshot at each
roll), an idempotent producer (raw Produce, so a retry of its last batch can be sent after the restart) and
transactional ones (confluent-kafka: committed, aborted, and one left open). After a clean stop the partition
holds a snapshot at its log end; after SIGTERM or kill -9 and a start, deduplication, sequence checks, the
open transaction (LSO), read_committed and the abort of the open transaction by a new producer all hold."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import IsolationLevel
from confluent_kafka.admin import AdminClient, NewTopic

import test_transactions_clients as txc
from broker_process import init_producer_id, produce_raw, wait_until
from kio.schema.errors import ErrorCode
from pykbroker.protocol.records import build_batch

pytestmark = pytest.mark.timeout(240)


def snapshot_offsets(broker, topic: str) -> list[int]:
    return sorted(int(p.name.removesuffix(".snapshot")) for p in (broker.data_dir / f"{topic}-0").glob("*.snapshot"))


def checkpointed(broker, name: str, topic: str) -> int:
    """The offset a data-dir checkpoint file (Kafka's text format) holds for topic-0; -1 if none yet."""
    try:
        lines = (broker.data_dir / name).read_text().splitlines()[2:]
    except FileNotFoundError:
        return -1
    return next((int(offset) for t, partition, offset in (line.split() for line in lines)
                 if t == topic and partition == "0"), -1)


def stable_at(broker, topic: str, offset: int) -> None:
    """Until the last stable offset and the high-water mark of topic-0 are both ``offset``."""
    wait_until(lambda: (txc.list_offsets(broker.bootstrap, topic, 0, IsolationLevel.READ_COMMITTED),
                        txc.list_offsets(broker.bootstrap, topic, 0, IsolationLevel.READ_UNCOMMITTED)) == (offset, offset),
               f"LSO and HW at {offset}", txc.TIMEOUT_S)


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_restart_keeps_dedup_and_open_transactions(broker, topic_name, how):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1, config={"segment.bytes": "600"})])[topic_name].result(txc.TIMEOUT_S)
    producer_id, epoch = init_producer_id(broker.address)
    now = int(time.time() * 1000)

    def batch(base_sequence: int) -> bytes:
        return bytes(build_batch([(b"k", b"i%d" % (base_sequence + i)) for i in range(2)], timestamp_ms=now,
                                 producer_id=producer_id, producer_epoch=epoch, base_sequence=base_sequence))

    for seq in range(0, 60, 2):  # offsets 0-59, a roll every few batches
        response = produce_raw(broker.address, topic_name, 0, batch(seq))
        assert (response.error_code, response.base_offset) == (ErrorCode.none, seq)
    committer = txc.txn_producer(broker.bootstrap, topic_name + "-a")
    committer.begin_transaction()
    txc.produce_flushed(committer, [(topic_name, 0, b"c0"), (topic_name, 0, b"c1")])
    committer.commit_transaction(txc.TIMEOUT_S)  # 60, 61, COMMIT @62
    stable_at(broker, topic_name, 63)  # (markers are written after EndTxn is answered: wait for each)
    aborter = txc.txn_producer(broker.bootstrap, topic_name + "-b")
    aborter.begin_transaction()
    txc.produce_flushed(aborter, [(topic_name, 0, b"a0")])
    aborter.abort_transaction(txc.TIMEOUT_S)  # 63, ABORT @64
    stable_at(broker, topic_name, 65)
    committer.begin_transaction()
    txc.produce_flushed(committer, [(topic_name, 0, b"o0"), (topic_name, 0, b"o1")])  # 65, 66: open
    wait_until(lambda: txc.list_offsets(broker.bootstrap, topic_name, 0, IsolationLevel.READ_COMMITTED) == 65,
               "LSO at the open transaction", txc.TIMEOUT_S)
    del committer, aborter
    assert snapshot_offsets(broker, topic_name), "no snapshot written at the rolls"

    if how == "sigterm":
        broker.stop()
        assert 67 in snapshot_offsets(broker, topic_name), "no snapshot at the log end after a clean stop"
    else:
        # Once the recovery point and the HWM checkpoints pass the last roll, a crash restarts from that roll's
        # snapshot (the usable ones are at or below both) and replays only the batches after it.
        wait_until(lambda: min(checkpointed(broker, "recovery-point-offset-checkpoint", topic_name),
                               checkpointed(broker, "replication-offset-checkpoint", topic_name)) >= 67,
                   "the recovery point and HWM checkpoints at the log end", txc.TIMEOUT_S)
        broker.kill()
    broker.start()
    loaded = [line for line in broker.log_path.read_text().splitlines() if f"{topic_name}-0: producer state" in line]
    if how == "sigterm":
        assert loaded == [], f"a clean restart replayed batches: {loaded}"
    else:
        assert len(loaded) == 1 and "from the snapshot" in loaded[0], loaded

    wait_until(lambda: (txc.list_offsets(broker.bootstrap, topic_name, 0, IsolationLevel.READ_COMMITTED),
                        txc.list_offsets(broker.bootstrap, topic_name, 0, IsolationLevel.READ_UNCOMMITTED)) == (65, 67),
               "LSO 65 (the open transaction) and HW 67 after the restart", txc.TIMEOUT_S)
    for seq in (58, 52):  # the last batch, and one of the four before it (kept by pykbroker's extension)
        retry = produce_raw(broker.address, topic_name, 0, batch(seq))
        assert (retry.error_code, retry.base_offset) == (ErrorCode.none, seq), f"retry of {seq} not deduplicated"
    assert produce_raw(broker.address, topic_name, 0, batch(70)).error_code == ErrorCode.out_of_order_sequence_number
    following = produce_raw(broker.address, topic_name, 0, batch(60))
    assert (following.error_code, following.base_offset) == (ErrorCode.none, 67)
    committed = txc.read_values(broker.bootstrap, [(topic_name, 0)], "read_committed", 62, quiet=1.0)
    assert len(committed) == 62 and {b"c0", b"c1"} <= set(txc.values_of(committed))  # held back at the LSO

    again = txc.txn_producer(broker.bootstrap, topic_name + "-a")  # aborts the recovered open transaction
    wait_until(lambda: txc.list_offsets(broker.bootstrap, topic_name, 0, IsolationLevel.READ_COMMITTED) == 70,
               "the open transaction aborted: LSO at the log end", txc.TIMEOUT_S)
    values = txc.values_of(txc.read_values(broker.bootstrap, [(topic_name, 0)], "read_committed", 64, quiet=1.0))
    assert b"a0" not in values and b"o0" not in values and len(values) == 64
    del again


def test_kafkas_dump_log_tool_reads_the_snapshots_pykbroker_writes(broker, topic_name):
    """Kafka 3.7.1's kafka-dump-log.sh (its ProducerStateManager.readSnapshot) reads a snapshot with
    pykbroker's extension of older batches as its own: the CRC holds and the entries are Kafka's."""
    from kafka_tools import kafka_tools_or_skip

    tools = kafka_tools_or_skip()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1, config={"segment.bytes": "600"})])[topic_name].result(txc.TIMEOUT_S)
    producer_id, epoch = init_producer_id(broker.address)
    now = int(time.time() * 1000)
    for seq in range(0, 20, 2):  # several batches before each roll: the snapshots carry the extension
        records = build_batch([(b"k", b"v%d" % (seq + i)) for i in range(2)], timestamp_ms=now,
                              producer_id=producer_id, producer_epoch=epoch, base_sequence=seq)
        assert produce_raw(broker.address, topic_name, 0, bytes(records)).error_code == ErrorCode.none
    broker.stop()  # the shutdown snapshot at the log end: the producer's last five batches
    snapshot = broker.data_dir / f"{topic_name}-0" / f"{20:020d}.snapshot"
    assert snapshot.stat().st_size > 10 + 46  # Kafka's entry and the extension after it
    dumped = tools.run("kafka-dump-log.sh", "--files", str(snapshot)).stdout
    assert f"producerId: {producer_id} producerEpoch: {epoch}" in dumped, dumped
    assert "lastSequence: 19 lastOffset: 19" in dumped, dumped

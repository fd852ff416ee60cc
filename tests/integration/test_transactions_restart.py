"""Transactions across a broker crash (SIGKILL and restart on the same data dir), against a real Apache Kafka 3.7.1
and against pykbroker (txn_targets.py `target`).

Before the kill one partition holds a committed transaction, an aborted one and an open one (records in the log,
no marker). After the restart the broker must have rebuilt all of it from its logs: the open transaction still
holds the last stable offset back (producer state with its ongoing transaction, the transaction log's Ongoing
state), read_committed consumers read only the committed records, read_uncommitted all; then a new producer with
the open transaction's transactional.id aborts it (fencing the dead one) and commits normally.

Run: python3 -m pytest -q tests/integration/test_transactions_restart.py -k "not pykbroker"   (Kafka only)
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import IsolationLevel, KafkaException

import txn_targets
from broker_process import wait_until
import test_transactions_clients as txc  # its client helpers

target = txn_targets.target  # the fixture: Kafka 3.7.1 and pykbroker
pytestmark = pytest.mark.timeout(300)


def offsets_when_served(bootstrap: str, topic: str) -> tuple[int, int]:
    """(last stable offset, high watermark) of topic-0 once the restarted broker answers ListOffsets for it."""
    deadline = time.monotonic() + txc.TIMEOUT_S
    while True:
        try:
            return (txc.list_offsets(bootstrap, topic, 0, IsolationLevel.READ_COMMITTED),
                    txc.list_offsets(bootstrap, topic, 0, IsolationLevel.READ_UNCOMMITTED))
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_transactions_survive_a_broker_kill9(target):
    topic, open_id, other_id = txc.unique("txn-restart"), txc.unique("tid-open"), txc.unique("tid-other")
    txc.create_topics(target.bootstrap, {topic: 1})
    # (a timeout far beyond a JVM's kill -9 and restart: the open transaction must outlive them)
    first = txc.txn_producer(target.bootstrap, open_id, **{"transaction.timeout.ms": 600000})
    first.begin_transaction()
    txc.produce_flushed(first, [(topic, 0, b"committed-0"), (topic, 0, b"committed-1")])
    first.commit_transaction(txc.TIMEOUT_S)          # 0, 1, COMMIT @2
    other = txc.txn_producer(target.bootstrap, other_id)
    other.begin_transaction()
    txc.produce_flushed(other, [(topic, 0, b"aborted-0")])
    other.abort_transaction(txc.TIMEOUT_S)           # 3, ABORT @4
    # the markers are written after EndTxn is answered: the ABORT lands before the next transaction's records
    wait_until(lambda: offsets_when_served(target.bootstrap, topic) == (5, 5), "the ABORT marker at offset 4",
               txc.TIMEOUT_S)
    first.begin_transaction()
    txc.produce_flushed(first, [(topic, 0, b"open-0"), (topic, 0, b"open-1")])   # 5, 6: open
    assert offsets_when_served(target.bootstrap, topic) == (5, 7)
    del first, other                             # the application dies with the broker

    target.restart(kill=True)

    assert offsets_when_served(target.bootstrap, topic) == (5, 7), "the open transaction was not recovered"
    assert txc.values_of(txc.read_values(target.bootstrap, [(topic, 0)], "read_committed", 2)) == [
        b"committed-0", b"committed-1"]
    assert txc.values_of(txc.read_values(target.bootstrap, [(topic, 0)], "read_uncommitted", 5, quiet=1.0)) == [
        b"aborted-0", b"committed-0", b"committed-1", b"open-0", b"open-1"]

    again = txc.txn_producer(target.bootstrap, open_id)   # InitProducerId: aborts the recovered open transaction
    deadline = time.monotonic() + txc.TIMEOUT_S
    while offsets_when_served(target.bootstrap, topic) != (8, 8):   # ABORT @7
        assert time.monotonic() < deadline, f"open transaction not aborted: {offsets_when_served(target.bootstrap, topic)}"
        time.sleep(0.1)
    again.begin_transaction()
    txc.produce_flushed(again, [(topic, 0, b"after-restart")])
    again.commit_transaction(txc.TIMEOUT_S)          # 8, COMMIT @9
    assert txc.values_of(txc.read_values(target.bootstrap, [(topic, 0)], "read_committed", 3)) == [
        b"after-restart", b"committed-0", b"committed-1"]
    assert offsets_when_served(target.bootstrap, topic) == (10, 10)

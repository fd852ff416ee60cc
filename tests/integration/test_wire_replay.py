"""Replay the captured client conversations (stock clients and Kafka's own tools against Apache Kafka 3.7.1) against a fresh
pykbroker each, and require the same answers by structure: error codes at every level, the same
topics and partitions, the same offsets, high watermarks and fetched records.

How the replay works, what is patched and what is ignored: tests/wire_replay.py. The few exchanges that
cannot match yet are listed below with their reason; anything else that differs fails the test with
file, seq, connection, API and the path of the differing field. An allow-list entry whose exchanges
all match fails too, so the list only ever shrinks.

A broker refusing transactional ids fails the capture of transactions (file 17) at setup
(wire_replay.TransactionsRefused, with the broker's answer).
"""

from __future__ import annotations

import pytest

from tests import wire_replay as wr

# Every captured exchange, consumer-group membership included, is compared with Kafka's answer; an entry
# here names the exchanges that cannot match yet and the reason.
EXPECTED_UNSUPPORTED: tuple[wr.Allowance, ...] = ()

CAPTURE_PATHS = wr.capture_paths()


def test_every_allow_list_entry_names_requests_of_its_capture():
    captures = {path.name: wr.load_capture(path) for path in CAPTURE_PATHS}
    for allowance in EXPECTED_UNSUPPORTED:
        covered = [f for f in captures[allowance.capture].requests() if allowance.covers(allowance.capture, f)]
        assert covered, f"{allowance} covers no request"


# The settings of the Kafka 3.7.1 broker that recorded the captures (wire-captures/index.md); a file's own
# additions are in its preconditions (file 17: the transaction state topic's).
CAPTURE_BROKER_CONFIG = {
    "num.partitions": 1,
    "offsets.topic.num.partitions": 1,
    "group.initial.rebalance.delay.ms": 0,
    "auto.create.topics.enable": True,
}


@pytest.mark.parametrize("path", CAPTURE_PATHS, ids=lambda path: path.stem)
def test_replayed_conversation_gets_kafkas_answers(path, broker_factory):
    capture = wr.load_capture(path)
    preconditions = wr.preconditions_for(capture)
    broker = broker_factory.make({**CAPTURE_BROKER_CONFIG, **preconditions.broker_config})
    result = wr.replay(capture, broker.address, preconditions=preconditions, allowances=EXPECTED_UNSUPPORTED)
    print(result.report())  # every difference, allowed ones and notes included (pytest -s, or on failure)
    problems = result.summary()
    problems += [f"allow-list entry no longer needed, its exchanges match Kafka now: {allowance}"
                 for allowance in result.stale_allowances()]
    assert result.exchanges_compared > 0
    assert not problems, (f"{len(result.failures)} differences from Kafka 3.7.1 ({len(problems)} kinds):\n"
                          + "\n".join(problems))


@pytest.mark.timeout(300)
def test_the_transactions_capture_replayed_against_kafka_itself_gets_its_own_answers(tmp_path):
    """The replay's own check for file 17 (Kafka's internal connections left out and waited for, producer ids
    and epochs mapped through a fencing, markers compared): against a real Kafka 3.7.1 (../shared/refkit)
    every answer matches, so a difference against pykbroker is pykbroker's. Skips where the kit or Java is
    absent."""
    from reference_kafka import ReferenceKafka

    capture = wr.load_capture(next(path for path in CAPTURE_PATHS if path.name.startswith("17-")))
    with ReferenceKafka(tmp_path) as kafka:
        result = wr.replay(capture, kafka.address, preconditions=wr.preconditions_for(capture))
    print(result.report())
    assert result.exchanges_compared == sum(1 for frame in capture.requests()
                                            if frame.conn not in capture.broker_internal_conns())
    assert not result.failures, "\n".join(result.summary())

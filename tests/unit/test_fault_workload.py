"""The fault-run clients' own reports (integration/faults/workload.py): a TailConsumer that stopped says why.

Run: python3 -m pytest -q tests/unit/test_fault_workload.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration" / "faults"))

from workload import TailConsumer  # noqa: E402


@pytest.fixture
def tail(tmp_path):
    # Nothing listens there: librdkafka only connects once the thread polls, and it is not started.
    consumer = TailConsumer("127.0.0.1:1", "t", [0, 1], debug_log=tmp_path / "tail.log")
    yield consumer
    consumer._consumer.close()


def test_wait_for_stops_at_once_on_an_error_that_stopped_the_partition(tail):
    tail.errors.append(KafkaError(KafkaError._AUTO_OFFSET_RESET, "fetch failed: offset out of range"))
    started = time.monotonic()
    with pytest.raises(AssertionError) as failure:
        tail.wait_for({0: 5, 1: 0}, 60)
    assert time.monotonic() - started < 10
    message = str(failure.value)
    assert "stopped on an error before the log ends {0: 5, 1: 0}" in message
    assert "offset out of range" in message
    assert "the consumer thread is not polling" in message


def test_a_timeout_names_what_was_seen_and_the_failure_sections_quote_the_debug_log(tail):
    with pytest.raises(AssertionError) as failure:
        tail.wait_for({0: 1}, 0.2)
    assert "timed out after 0.2 s" in str(failure.value) and "seen (next offset per partition): {}" in str(failure.value)
    tail.debug_log.write_text("".join(f"line {i}\n" for i in range(400)))
    (state_name, state), (log_name, log) = tail.failure_sections()
    assert state_name.endswith("state") and "errors: [] (0 in all)" in state
    assert "librdkafka debug log" in log_name
    assert log.splitlines() == [f"line {i}" for i in range(100, 400)]

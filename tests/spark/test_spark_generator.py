"""The event generator against a real pykbroker, with each client, read back with kafka-python.

No Spark: this runs wherever the broker does. It checks what the Spark jobs rely on: each city always on
one partition (the one the Java partitioner, hence Spark's kafka sink, would pick), the record timestamp
equal to the event time, the schema header, and values that are exactly the generated events.
"""

from __future__ import annotations

import json

import pytest

import generate_events
from city_pipeline.events import SCHEMA_HEADER, make_events, parse_time_ms
from kafka_helpers import java_partition, read_topic

pytestmark = pytest.mark.timeout(120)

START = "2026-11-22T10:00:00Z"
PARTITIONS = 3


def test_generator_writes_city_keyed_events_with_either_client(module_broker, unique_name, capsys):
    bootstrap = module_broker.bootstrap
    runs = [("kafka-python", 1, 150), ("confluent-kafka", 2, 90)]
    expected = []
    for client, seed, count in runs:
        args = ["--bootstrap", bootstrap, "--topic", unique_name, "--partitions", str(PARTITIONS),
                "--count", str(count), "--start", START, "--step-ms", "500", "--lateness-ms", "3000",
                "--seed", str(seed), "--client", client]
        assert generate_events.main(args) == 0
        expected += make_events(count, start_ms=parse_time_ms(START), step_ms=500, seed=seed,
                                max_lateness_ms=3000)
    output = capsys.readouterr().out
    assert f"created topic {unique_name} with {PARTITIONS} partitions" in output
    assert output.count("created topic") == 1, "the second run must reuse the topic"

    records = read_topic(bootstrap, unique_name, len(expected))
    assert len(records) == len(expected)

    for record in records:
        event = json.loads(record.value)
        assert record.key == event["city"].encode()
        assert record.partition == java_partition(record.key, PARTITIONS), f"{event['city']} misplaced"
        assert record.timestamp == parse_time_ms(event["event_time"])
        assert record.timestamp_type == 0  # CreateTime: the producer's timestamp is kept
        assert [(k, v) for k, v in record.headers] == [SCHEMA_HEADER]

    # Per partition, the values are the generated events in the order they were sent.
    for partition in range(PARTITIONS):
        sent = [e.value for e in expected if java_partition(e.key, PARTITIONS) == partition]
        stored = [r.value for r in records if r.partition == partition]
        assert stored == sent, f"partition {partition} differs from what was sent"
        offsets = [r.offset for r in records if r.partition == partition]
        assert offsets == list(range(len(offsets)))

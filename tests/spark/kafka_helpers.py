"""kafka-python helpers for the Spark tests: read a whole topic back, with assign() and no group."""

from __future__ import annotations

import time

from kafka import KafkaConsumer, TopicPartition

READ_TIMEOUT_S = 60


def read_topic(bootstrap: str, topic: str, expected: int, *, timeout_s: float = READ_TIMEOUT_S) -> list:
    """Every record of `topic` from the beginning, once `expected` have arrived (ConsumerRecords, sorted by
    partition and offset). Reads a little past `expected` so that extra records are seen, not hidden."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partitions = consumer.partitions_for_topic(topic)
        deadline = time.monotonic() + timeout_s
        while not partitions and time.monotonic() < deadline:
            time.sleep(0.1)
            partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise AssertionError(f"topic {topic} never appeared in metadata")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        records = []
        while time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
            if len(records) >= expected and all(consumer.position(tp) >= ends[tp] for tp in tps):
                break
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()

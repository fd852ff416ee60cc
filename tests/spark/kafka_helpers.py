"""kafka-python helpers for the Spark tests: produce and remember the acks, read a topic back (assign(),
no group), and the Java client's partition for a key."""

from __future__ import annotations

import time
from typing import NamedTuple

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.partitioner.default import murmur2

READ_TIMEOUT_S = 60


class Acked(NamedTuple):
    """One record as the broker acknowledged it, in the Kafka source's terms."""
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: tuple[tuple[str, bytes], ...]


def java_partition(key: bytes, partitions: int) -> int:
    """The Java client's default partition for a keyed record (murmur2, made positive, modulo)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def produce(bootstrap: str, topic: str, messages: list[dict], *, one_batch_each: bool = False) -> list[Acked]:
    """Send each dict as KafkaProducer.send() keyword arguments (key, value, headers, timestamp_ms,
    partition) with the producer's defaults; return the acknowledgements in send order.
    one_batch_each: flush after every record, so each becomes its own record batch."""
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        futures = []
        for message in messages:
            futures.append(producer.send(topic, **message))
            if one_batch_each:
                producer.flush(timeout=30)
        producer.flush(timeout=30)
        acked = []
        for future, message in zip(futures, messages):
            metadata = future.get(timeout=30)
            acked.append(Acked(metadata.partition, metadata.offset, message.get("key"), message.get("value"),
                               metadata.timestamp, tuple(message.get("headers") or ())))
        return acked
    finally:
        producer.close(timeout=10)


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

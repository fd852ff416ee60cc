"""Writing city events to Kafka with a stock Python client in its default configuration.

kafka-python 3.x is idempotent with acks=all by default. confluent-kafka keeps its defaults too, except
`partitioner`: librdkafka's default (consistent_random, CRC32) places keys differently from the Java
client, so it is set to murmur2_random, the Java and kafka-python partitioner. Either way a city (the
key) always lands on the same partition, and on the same one whichever client wrote it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import NamedTuple

from .events import SCHEMA_HEADER, CityEvent

CLIENTS = ("kafka-python", "confluent-kafka")
TOPIC_ALREADY_EXISTS = 36
SEND_TIMEOUT_S = 60


class Delivery(NamedTuple):
    event: CityEvent
    partition: int
    offset: int


def ensure_topic(bootstrap: str, topic: str, partitions: int, configs: dict[str, str] | None = None) -> bool:
    """Create `topic` with `partitions` partitions unless it exists; True when this call created it."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        spec = {"num_partitions": partitions}
        if configs:
            spec["configs"] = {key: str(value) for key, value in configs.items()}
        result = admin.create_topics({topic: spec}, raise_errors=False, wait_for_metadata=True)
        (answer,) = result["topics"]
        if answer["error_code"] == TOPIC_ALREADY_EXISTS:
            return False
        if answer["error_code"] != 0:
            raise RuntimeError(f"CreateTopics {topic}: error {answer['error_code']} {answer.get('error_message')}")
        return True
    finally:
        admin.close()


def produce_events(bootstrap: str, topic: str, events: Iterable[CityEvent], *, client: str = "kafka-python",
                   rate: float = 0.0) -> list[Delivery]:
    """Send every event (key = city, timestamp = event time, schema header) and wait for all acks.

    rate: events per second, 0 for as fast as the client goes. Returns the deliveries in send order.
    """
    if client == "kafka-python":
        return _produce_kafka_python(bootstrap, topic, events, rate)
    if client == "confluent-kafka":
        return _produce_confluent(bootstrap, topic, events, rate)
    raise ValueError(f"unknown client {client!r}; choose one of {', '.join(CLIENTS)}")


class _Pacer:
    """Sleeps so that the n-th event goes out no earlier than n / rate seconds after the first."""

    def __init__(self, rate: float):
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.start = time.monotonic()
        self.sent = 0

    def wait(self) -> None:
        if self.interval:
            delay = self.start + self.sent * self.interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        self.sent += 1


def _produce_kafka_python(bootstrap: str, topic: str, events: Iterable[CityEvent], rate: float) -> list[Delivery]:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        pacer = _Pacer(rate)
        pending = []
        for event in events:
            pacer.wait()
            pending.append((event, producer.send(topic, key=event.key, value=event.value,
                                                 headers=[SCHEMA_HEADER], timestamp_ms=event.event_time_ms)))
        producer.flush(timeout=SEND_TIMEOUT_S)
        deliveries = []
        for event, future in pending:
            metadata = future.get(timeout=SEND_TIMEOUT_S)
            deliveries.append(Delivery(event, metadata.partition, metadata.offset))
        return deliveries
    finally:
        producer.close(timeout=10)


def _produce_confluent(bootstrap: str, topic: str, events: Iterable[CityEvent], rate: float) -> list[Delivery]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    results: dict[int, tuple[int, int]] = {}
    errors: list[str] = []

    def on_delivery(index: int):
        def record(error, message) -> None:
            if error is not None:
                errors.append(f"event {index}: {error}")
            else:
                results[index] = (message.partition(), message.offset())
        return record

    pacer = _Pacer(rate)
    sent: list[CityEvent] = []
    for event in events:
        pacer.wait()
        while True:
            try:
                producer.produce(topic, key=event.key, value=event.value, headers=[SCHEMA_HEADER],
                                 timestamp=event.event_time_ms, on_delivery=on_delivery(len(sent)))
                break
            except BufferError:  # local queue full: let deliveries drain, then retry this event
                producer.poll(0.1)
        sent.append(event)
        producer.poll(0)
    remaining = producer.flush(SEND_TIMEOUT_S)
    if remaining or errors or len(results) != len(sent):
        raise RuntimeError(f"confluent-kafka: {remaining} undelivered, errors: {errors[:5]}")
    return [Delivery(event, *results[i]) for i, event in enumerate(sent)]

"""Clients for fault runs and fault tests: confluent-kafka producers and consumers in background threads
that record everything the checker needs (checker.py).

  SeqProducer   writes ``<name>:<sequence>`` values (sequence 0, 1, 2, ...) round-robin over partitions, by
                default idempotent with acks=all and a delivery timeout long enough to ride out a failover;
                keeps every acknowledgement (partition, offset, value), every delivery error and every
                client-level error (error_cb).
  TailConsumer  assign()s partitions from the beginning and reads until stopped, keeping what it saw in
                order; auto.offset.reset=error, so a reset (an offset that vanished) shows as an error
                instead of a silent jump.
  read_log      reads partitions from the beginning to their high-water mark: the final state to check.

A client error is *benign* when it is not fatal and either retriable or a connection-level error (a broker
went away): those are what a client sees during a failover that loses nothing.
"""

from __future__ import annotations

import threading
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from checker import Rec

CONNECTION_ERRORS = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
                     KafkaError._RESOLVE}


def is_benign(error: KafkaError) -> bool:
    return not error.fatal() and (error.retriable() or error.code() in CONNECTION_ERRORS)


def producer_config(bootstrap: str, **overrides) -> dict:
    """Idempotent, acks=all, retries until a 120 s delivery timeout: a failover must not fail a send."""
    config = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": 120000,
        "request.timeout.ms": 10000,
        "reconnect.backoff.max.ms": 1000,
        "topic.metadata.refresh.interval.ms": 2000,
    }
    config.update(overrides)
    return config


class SeqProducer(threading.Thread):
    """Produces until stop(); `rate` bounds records per second, `max_in_flight` the unacknowledged ones."""

    def __init__(self, bootstrap: str, topic: str, partitions: list[int], name: str = "p0", *,
                 rate: float = 200.0, max_in_flight: int = 1000, **config):
        super().__init__(name=f"producer-{name}", daemon=True)
        self.topic = topic
        self.partitions = partitions
        self.producer_name = name
        self.rate = rate
        self.max_in_flight = max_in_flight
        self.acked: list[Rec] = []
        self.delivery_errors: list[tuple[bytes, KafkaError]] = []
        self.client_errors: list[KafkaError] = []
        self.sent = 0
        self.unflushed = 0
        self.flush_timeout = 120.0
        self._halt = threading.Event()
        self._producer = Producer(producer_config(bootstrap, error_cb=self.client_errors.append, **config))

    def _delivered(self, error, message) -> None:
        if error is None:
            self.acked.append(Rec(message.partition(), message.offset(), message.value()))
        else:
            self.delivery_errors.append((message.value(), error))

    def run(self) -> None:
        interval = 1.0 / self.rate
        next_send = time.monotonic()
        while not self._halt.is_set():
            if self.sent - len(self.acked) - len(self.delivery_errors) >= self.max_in_flight:
                self._producer.poll(0.05)
                continue
            value = f"{self.producer_name}:{self.sent:09d}".encode()
            partition = self.partitions[self.sent % len(self.partitions)]
            self._producer.produce(self.topic, value, partition=partition, on_delivery=self._delivered)
            self.sent += 1
            next_send += interval
            self._producer.poll(max(0.0, next_send - time.monotonic()))
        self.unflushed = self._producer.flush(self.flush_timeout)

    def stop(self, flush_timeout: float = 120.0) -> None:
        """Stop producing and wait until every record is acknowledged or failed (or flush_timeout passes:
        `unflushed` then counts the records left without an answer)."""
        self.flush_timeout = flush_timeout
        self._halt.set()
        self.join(flush_timeout + 10)
        assert not self.is_alive(), f"{self.name} did not stop"

    def close(self, timeout: float = 5.0) -> None:
        """Teardown after a failure: stop without waiting long for answers; never raises."""
        if self.is_alive():
            self.flush_timeout = timeout
            self._halt.set()
            self.join(timeout + 5)

    def wait_acked(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: {len(self.acked)} of {count} records acknowledged after "
                                     f"{timeout} s; delivery errors {self.delivery_errors[:3]}, "
                                     f"client errors {self.client_errors[-3:]}")
            time.sleep(0.05)

    def bad_errors(self) -> list:
        """Delivery errors (a record the producer gave up on) and client errors that are not benign."""
        return [e for _, e in self.delivery_errors] + [e for e in self.client_errors if not is_benign(e)]


def consumer_config(bootstrap: str, **overrides) -> dict:
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": f"faults-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "auto.offset.reset": "error",
        "reconnect.backoff.max.ms": 1000,
        "topic.metadata.refresh.interval.ms": 2000,
    }
    config.update(overrides)
    return config


class TailConsumer(threading.Thread):
    """Reads the partitions from the beginning until stop(), keeping each record it saw, in order."""

    def __init__(self, bootstrap: str, topic: str, partitions: list[int], **config):
        super().__init__(name=f"consumer-{topic}", daemon=True)
        self.seen: list[Rec] = []
        self.errors: list[KafkaError] = []
        self._halt = threading.Event()
        self._consumer = Consumer(consumer_config(bootstrap, **config))
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                message = self._consumer.poll(0.2)
                if message is None:
                    continue
                if message.error():
                    self.errors.append(message.error())
                    continue
                self.seen.append(Rec(message.partition(), message.offset(), message.value()))
        finally:
            self._consumer.close()

    def positions(self) -> dict[int, int]:
        """Next offset per partition, from what was seen."""
        last: dict[int, int] = {}
        for rec in self.seen:
            last[rec.partition] = rec.offset + 1
        return last

    def stop(self) -> None:
        self._halt.set()
        self.join(30)
        assert not self.is_alive(), f"{self.name} did not stop"

    def close(self, timeout: float = 5.0) -> None:
        """Teardown after a failure: stop reading; never raises."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout)

    def bad_errors(self) -> list[KafkaError]:
        return [e for e in self.errors if not is_benign(e)]


def read_log(bootstrap: str, topic: str, partitions: list[int], timeout: float = 60.0) -> dict[int, list[tuple[int, bytes]]]:
    """Every record from the log start to the high-water mark, per partition, as the leaders serve it."""
    consumer = Consumer(consumer_config(bootstrap))
    try:
        ends = {}
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            ends[p] = high
        log: dict[int, list[tuple[int, bytes]]] = {p: [] for p in partitions}
        pending = {p for p in partitions if ends[p] > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                progress = {p: (log[p][-1][0] if log[p] else None, ends[p]) for p in pending}
                raise AssertionError(f"read_log({topic}): not at the high-water mark after {timeout} s "
                                     f"(last offset read, end): {progress}")
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                if is_benign(message.error()):
                    continue
                raise AssertionError(f"read_log({topic}): {message.error()}")
            p = message.partition()
            log[p].append((message.offset(), message.value()))
            if message.offset() >= ends[p] - 1:
                pending.discard(p)
        return log
    finally:
        consumer.close()


def produce_batch(bootstrap: str, topic: str, partitions: list[int], name: str, count: int,
                  timeout: float = 60.0, **config) -> tuple[list[Rec], list[tuple[bytes, KafkaError]]]:
    """Send ``<name>:<seq>`` for seq in 0..count-1, round-robin over partitions, and wait for every answer:
    (acknowledged records in acknowledgement order, (value, error) of each refused one). config overrides
    producer_config (e.g. acks=1, enable.idempotence=False, retries=0)."""
    acked: list[Rec] = []
    refused: list[tuple[bytes, KafkaError]] = []

    def delivered(error, message) -> None:
        if error is None:
            acked.append(Rec(message.partition(), message.offset(), message.value()))
        else:
            refused.append((message.value(), error))

    producer = Producer(producer_config(bootstrap, **config))
    for seq in range(count):
        producer.produce(topic, f"{name}:{seq:09d}".encode(), partition=partitions[seq % len(partitions)],
                         on_delivery=delivered)
        producer.poll(0)
    left = producer.flush(timeout)
    assert left == 0, f"produce_batch({name}): {left} records without an answer after {timeout} s"
    return acked, refused

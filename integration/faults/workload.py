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

import collections
import logging
import threading
import time
import uuid
from pathlib import Path

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

    DEBUG_CONTEXTS = "eos,topic,metadata,protocol,broker"

    def __init__(self, bootstrap: str, topic: str, partitions: list[int], name: str = "p0", *,
                 rate: float = 200.0, max_in_flight: int = 1000, debug_log: Path | None = None, **config):
        super().__init__(name=f"producer-{name}", daemon=True)
        self.debug_log = debug_log
        if debug_log is not None:
            config = {"debug": self.DEBUG_CONTEXTS, "logger": _file_logger(debug_log), **config}
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
                                     f"{timeout} s\n{self.report()}")
            time.sleep(0.05)

    def report(self) -> str:
        """Sent, acknowledged and failed records, the last acknowledgement per partition, the errors."""
        last: dict[int, int] = {}
        for rec in self.acked:
            last[rec.partition] = max(last.get(rec.partition, -1), rec.offset)
        return "\n".join([
            f"sent {self.sent}, acknowledged {len(self.acked)}, failed {len(self.delivery_errors)}, "
            f"unflushed {self.unflushed}, running {self.is_alive()}",
            f"last acknowledged offset per partition: {last}",
            f"delivery errors: {[(v, str(e)) for v, e in self.delivery_errors[:5]]}",
            f"client errors: {[str(e) for e in self.client_errors[-10:]]} ({len(self.client_errors)} in all)",
        ])

    def failure_sections(self) -> list[tuple[str, str]]:
        return _sections(self.name, self.report(), self.debug_log)

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
    """Reads the partitions from the beginning until stop(), keeping each record it saw, in order.

    debug_log: a file that receives librdkafka's own debug log (contexts DEBUG_CONTEXTS) for this consumer,
    so that a consumer that stops progressing can say why: wait_for() and failure_sections() quote it."""

    DEBUG_CONTEXTS = "fetch,topic,metadata,protocol"

    def __init__(self, bootstrap: str, topic: str, partitions: list[int], *, debug_log: Path | None = None,
                 **config):
        super().__init__(name=f"consumer-{topic}", daemon=True)
        self.topic = topic
        self.partitions = partitions
        self.seen: list[Rec] = []
        self.errors: list[KafkaError] = []
        self.debug_log = debug_log
        self._halt = threading.Event()
        self._closed = False
        self._report_wanted = threading.Event()
        self._report_ready = threading.Event()
        self._librdkafka_state = ""
        if debug_log is not None:
            config = {"debug": self.DEBUG_CONTEXTS, "logger": _file_logger(debug_log), **config}
        self._consumer = Consumer(consumer_config(bootstrap, **config))
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                self._serve_report()
                message = self._consumer.poll(0.2)
                if message is None:
                    continue
                if message.error():
                    self.errors.append(message.error())
                    continue
                self.seen.append(Rec(message.partition(), message.offset(), message.value()))
        finally:
            self._closed = True
            self._consumer.close()

    def positions(self) -> dict[int, int]:
        """Next offset per partition, from what was seen."""
        last: dict[int, int] = {}
        for rec in self.seen:
            last[rec.partition] = rec.offset + 1
        return last

    def wait_for(self, ends: dict[int, int], timeout: float) -> None:
        """Wait until the consumer has seen every offset below ends[partition]. AssertionError with what the
        consumer saw and librdkafka's view of its assignment on timeout, or at once on an error that is not
        benign (with auto.offset.reset=error librdkafka stops fetching the partition: no progress, no log)."""
        deadline = time.monotonic() + timeout
        while not all(self.positions().get(p, 0) >= end for p, end in ends.items()):
            if self.bad_errors():  # e.g. a log truncation or offset reset: librdkafka stopped that partition
                raise AssertionError(f"{self.name} stopped on an error before the log ends {ends}\n{self.report()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {self.name} to reach the log "
                                     f"ends {ends}\n{self.report()}")
            time.sleep(0.05)

    def report(self) -> str:
        """What the consumer saw and what librdkafka thinks of its assignment, in a few lines."""
        lines = [f"seen (next offset per partition): {self.positions()}, {len(self.seen)} records",
                 f"errors: {[str(e) for e in self.errors[-10:]]} ({len(self.errors)} in all)"]
        # librdkafka is asked from the consumer's own thread: with a Python `logger`, a blocking call such as
        # assignment() made from another thread deadlocks (it holds the GIL the log callback needs).
        self._report_ready.clear()
        self._report_wanted.set()
        if self.is_alive() and self._report_ready.wait(10):
            lines.append(self._librdkafka_state)
        else:
            lines.append("(librdkafka state unavailable: the consumer thread is not polling)")
        return "\n".join(lines)

    def _serve_report(self) -> None:
        if not self._report_wanted.is_set():
            return
        self._report_wanted.clear()
        lines = []
        try:
            assignment = self._consumer.assignment()
            lines.append(f"assignment: {[(tp.partition, tp.offset) for tp in assignment]}")
            lines.append("librdkafka position: "
                         f"{[(tp.partition, tp.offset, str(tp.error or '')) for tp in self._consumer.position(assignment)]}")
            for p in self.partitions:
                low, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)
                lines.append(f"partition {p}: cached watermarks {low}..{high}")
        except Exception as e:  # a report must never hide the failure it explains
            lines.append(f"(librdkafka state unavailable: {e!r})")
        self._librdkafka_state = "\n".join(lines)
        self._report_ready.set()

    def failure_sections(self) -> list[tuple[str, str]]:
        return _sections(self.name, self.report(), self.debug_log)

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


def _sections(name: str, report: str, debug_log: Path | None) -> list[tuple[str, str]]:
    """A client's report and the end of its librdkafka debug log, as pytest report sections."""
    sections = [(f"{name} state", report)]
    if debug_log is not None and debug_log.exists():
        sections.append((f"{name} librdkafka debug log (last 300 lines of {debug_log})", tail_lines(debug_log, 300)))
    return sections


def _file_logger(path: Path) -> logging.Logger:
    """A logger of its own (not propagated) writing to path, for a client's `logger` config."""
    logger = logging.getLogger(f"pykbroker.faults.client.{path}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    if not logger.handlers:
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
    return logger


def tail_lines(path: Path, n: int) -> str:
    with open(path, errors="replace") as f:
        return "".join(collections.deque(f, maxlen=n))


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

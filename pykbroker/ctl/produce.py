"""``pykbroker produce TOPIC``: one record per input line, through librdkafka's Producer."""

from __future__ import annotations

import time
from typing import Any

import click

from pykbroker.ctl.common import (
    EXIT_CODES_HELP, EXIT_UNREACHABLE, EXIT_USAGE, Connection, connection_options, CtlError, error_text, exit_code_for,
    kafka_error, parse_pairs, progress, table, topic_error,
)

PROGRESS_EVERY_S = 2.0
COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("topic")
@click.option("-k", "--key-separator", metavar="SEP",
              help="Each line is KEY<SEP>VALUE (split at the first SEP; a line without SEP stops the command, "
              "as Kafka's console producer does); without -k a line is the value, no key.")
@click.option("-H", "--header", "headers", multiple=True, metavar="KEY=VALUE", help="A header on every record (repeatable).")
@click.option("-p", "--partition", type=click.IntRange(min=-1), default=-1, show_default=True,
              help="The partition to write to (-1: librdkafka's partitioner, by key).")
@click.option("-z", "--compression", type=click.Choice(COMPRESSIONS), default="none", show_default=True,
              help="Compression codec of the record batches.")
@click.option("--acks", type=click.Choice(["0", "1", "all", "-1"]), default="all", show_default=True,
              help="Acknowledgements the leader waits for before answering.")
@click.option("-i", "--input", "source", type=click.File("rb"), default="-", show_default=True,
              help="Read lines from this file instead of stdin.")
@connection_options
def produce(conn: Connection, topic: str, key_separator: str | None, headers: tuple[str, ...], partition: int,
            compression: str, acks: str, source: Any) -> None:
    """Produce each line of stdin as one record to TOPIC (the line's newline is not part of the value).

    Reports on stderr how many records were written (every few seconds while it runs); with --format json
    also prints the count and each partition's offset range on stdout. Exit 2 at a line without the -k
    separator (the lines before it are produced), 1 if a record failed,
    3 if the topic does not exist (and the broker does not create it), 4 if no broker answered."""
    from confluent_kafka import KafkaException, Producer

    header_list = [(key, value.encode()) for key, value in parse_pairs(headers, "'-H' / '--header'").items()]
    separator = key_separator.encode() if key_separator else None
    producer = conn.client(Producer, **{
        "acks": acks, "compression.type": compression, "enable.idempotence": False,
        "message.timeout.ms": int(conn.timeout * 1000), "request.timeout.ms": int(conn.timeout * 1000),
    })
    try:
        metadata = producer.list_topics(topic=topic, timeout=conn.timeout).topics.get(topic)
    except KafkaException as exc:
        raise kafka_error(exc, "reading metadata") from None
    if metadata is not None and metadata.error is not None:
        raise topic_error(topic, metadata.error)

    state: dict[str, Any] = {"sent": 0, "delivered": 0, "failed": 0, "error": None, "ranges": {}}

    def on_delivery(error: Any, message: Any) -> None:
        if error is not None:
            state["failed"] += 1
            state["error"] = state["error"] or error
            return
        state["delivered"] += 1
        first, last = state["ranges"].get(message.partition(), (message.offset(), message.offset()))
        state["ranges"][message.partition()] = (min(first, message.offset()), max(last, message.offset()))

    last_report = time.monotonic()
    bad_line = None
    for number, line in enumerate(source, start=1):
        if line.endswith(b"\n"):
            line = line[:-1]
            if line.endswith(b"\r"):
                line = line[:-1]
        key = None
        if separator is not None:
            key, found, value = line.partition(separator)
            if not found:  # Kafka's console producer (parse.key=true) stops there too
                bad_line = (f"No key separator found on line number {number}: "
                            f"'{line.decode('utf-8', errors='replace')}'")
                break
        else:
            value = line
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=header_list or None, partition=partition,
                                 on_delivery=on_delivery)
                break
            except BufferError:  # librdkafka's queue is full: let deliveries drain it
                producer.poll(0.1)
            except KafkaException as exc:
                raise kafka_error(exc, "producing") from None
        state["sent"] += 1
        producer.poll(0)
        if time.monotonic() - last_report >= PROGRESS_EVERY_S:
            progress(f"... {state['delivered']} records written, {state['sent'] - state['delivered']} in flight")
            last_report = time.monotonic()
    remaining = producer.flush(conn.timeout + 5)

    summary = {"topic": topic, "records": state["delivered"], "failed": state["failed"] + remaining,
               "partitions": [{"partition": p, "first_offset": first, "last_offset": last}
                              for p, (first, last) in sorted(state["ranges"].items())]}
    progress(f"Produced {state['delivered']} record{'' if state['delivered'] == 1 else 's'} to {topic}"
             + (f"; {summary['failed']} failed" if summary["failed"] else ""))
    if conn.output == "json":
        conn.emit(summary, lambda _: None)
    elif state["delivered"] and conn.verbose:
        table(["partition", "first offset", "last offset"],
              [[r["partition"], r["first_offset"], r["last_offset"]] for r in summary["partitions"]])
    if bad_line is not None:
        raise CtlError(f"{bad_line} (-k {key_separator!r}: every line is KEY{key_separator}VALUE; "
                       "the lines before it were produced)", EXIT_USAGE)
    if state["error"] is not None:
        raise CtlError(f"producing to {topic!r}: {error_text(state['error'])}", exit_code_for(state["error"]))
    if remaining:
        raise CtlError(f"producing to {topic!r}: {remaining} records not acknowledged within the timeout", EXIT_UNREACHABLE)

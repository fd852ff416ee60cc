"""``pykbroker consume TOPIC...``: records out, as a group member or from chosen partitions, through
librdkafka's Consumer."""

from __future__ import annotations

import json
import uuid
from typing import Any

import click

from pykbroker.ctl.common import (
    EXIT_CODES_HELP, EXIT_NOT_FOUND, EXIT_UNREACHABLE, Connection, connection_options, CtlError, error_text,
    exit_code_for, kafka_error, parse_timestamp, progress, topic_metadata,
)

POLL_S = 0.2
TEMPLATE_FIELDS = ("topic", "partition", "offset", "timestamp", "key", "value", "headers")
_START_WORDS = {"beginning": "beginning", "start": "beginning", "earliest": "beginning", "oldest": "beginning",
                "end": "end", "latest": "end", "newest": "end"}


class Start:
    """Where reading starts: 'beginning', 'end', an absolute offset, the last N records (negative), or the
    first record at or after a timestamp (ms)."""

    def __init__(self, offset: str, timestamp: str | None) -> None:
        self.timestamp = parse_timestamp(timestamp) if timestamp is not None else None
        self.word = _START_WORDS.get(offset.lower())
        self.number: int | None = None
        if self.word is None:
            try:
                self.number = int(offset)
            except ValueError:
                raise click.BadParameter(f"{offset!r}: expected beginning, end, an offset, or -N (the last N records)",
                                         param_hint="'-o' / '--offset'") from None

    @property
    def reset(self) -> str:
        """auto.offset.reset: where a partition without a committed offset (or out of range) starts."""
        return "latest" if self.word == "end" else "earliest"

    @property
    def explicit(self) -> bool:
        """Positions applied even over a group's committed offsets (an offset, -N, a timestamp)."""
        return self.number is not None or self.timestamp is not None

    def position(self, consumer: Any, partitions: list[Any], timeout: float) -> list[Any]:
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, TopicPartition

        if self.timestamp is not None:
            asked = [TopicPartition(tp.topic, tp.partition, self.timestamp) for tp in partitions]
            try:
                found = consumer.offsets_for_times(asked, timeout=timeout)
            except Exception as exc:
                raise kafka_error(exc, "looking up offsets by timestamp") from None
            # No record at or after the timestamp: start at the end (Kafka's answer is offset -1).
            return [TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END) for tp in found]
        if self.number is not None:
            offset = self.number if self.number >= 0 else -2000 + self.number  # librdkafka's OFFSET_TAIL(n)
        else:
            offset = OFFSET_END if self.word == "end" else OFFSET_BEGINNING
        return [TopicPartition(tp.topic, tp.partition, offset) for tp in partitions]


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")


def _record(message: Any) -> dict[str, Any]:
    kind, timestamp = message.timestamp()
    return {
        "topic": message.topic(), "partition": message.partition(), "offset": message.offset(),
        "timestamp": timestamp if kind else None,
        "key": _text(message.key()), "value": _text(message.value()),
        "headers": [{"key": key, "value": _text(value)} for key, value in (message.headers() or [])],
    }


def formatter(fmt: str) -> Any:
    """A function record-dict -> output line for --format text, json or a template."""
    if fmt == "text":
        return lambda record: record["value"] or ""
    if fmt == "json":
        return lambda record: json.dumps(record, ensure_ascii=False)
    template = fmt.encode().decode("unicode_escape") if "\\" in fmt else fmt

    def fill(record: dict[str, Any]) -> str:
        values = {**record, "headers": ",".join(f"{h['key']}={h['value'] or ''}" for h in record["headers"])}
        return template.format_map({name: "" if value is None else value for name, value in values.items()})

    try:
        fill({"topic": "t", "partition": 0, "offset": 0, "timestamp": 0, "key": "k", "value": "v", "headers": []})
    except (KeyError, IndexError, ValueError) as exc:
        raise click.BadParameter(f"{fmt!r}: a template may use {{{'}, {'.join(TEMPLATE_FIELDS)}}} ({exc})",
                                 param_hint="'-f' / '--format'") from None
    return fill


def _partitions(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return sorted({int(item) for item in value.split(",") if item.strip()})
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected partition numbers like 0,2", param_hint="'-p'") from None


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("topics", nargs=-1, required=True)
@click.option("-g", "--group", help="Consume as a member of this group (subscribe, offsets committed).")
@click.option("-p", "--partitions", metavar="P[,P...]", help="Read only these partitions (no group; default: all).")
@click.option("-o", "--offset", default="beginning", show_default=True, metavar="beginning|end|N|-N",
              help="Start at the beginning, the end, offset N, or the last N records of each partition (then "
              "new records as they come, as kcat -o -N does: -e stops after the last N). "
              "With --group, beginning/end apply only where the group has no committed offset.")
@click.option("-t", "--timestamp", metavar="MS|ISO-8601",
              help="Start at the first record at or after this time (ms since the epoch, or e.g. 2026-11-26T12:00:00Z).")
@click.option("-n", "--num", "count", type=click.IntRange(min=1), help="Stop after this many records.")
@click.option("-e", "--exit-at-end", is_flag=True, help="Stop at the end of every partition instead of waiting for more.")
@click.option("-f", "--format", "fmt", default="text", show_default=True, metavar="text|json|TEMPLATE",
              help="text: the value per line; json: one JSON object per record; or a template like "
              "'{topic}:{partition}@{offset} {key}={value}' (fields: " + ", ".join(TEMPLATE_FIELDS) + ").")
@click.option("--isolation-level", type=click.Choice(["read_uncommitted", "read_committed"]), default="read_uncommitted",
              show_default=True)
@connection_options(output_option=False, record_format="fmt")
def consume(conn: Connection, topics: tuple[str, ...], group: str | None, partitions: str | None, offset: str,
            timestamp: str | None, count: int | None, exit_at_end: bool, fmt: str, isolation_level: str) -> None:
    """Print records of TOPIC(s) to stdout, one per line, until -n records, the end (-e) or Ctrl-C.

    Exit 3 if a topic or partition does not exist, 4 if no broker is reachable or answers within --timeout.
    -o -N prints the last N records and then, like kcat, waits for new ones: add -e to stop there."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    if group and partitions is not None:
        raise click.UsageError("--group and --partitions exclude each other: a group member gets its partitions from the group")
    start = Start(offset, timestamp)
    render = formatter(fmt)
    chosen = _partitions(partitions)
    consumer = conn.client(Consumer, **{
        "group.id": group or f"pykbroker-cli-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": bool(group), "auto.offset.reset": start.reset,
        "enable.partition.eof": True, "isolation.level": isolation_level, "error_cb": _warn_once(),
    })
    closed = False
    try:
        metadata = topic_metadata(consumer, topics, conn.timeout)
        if group:
            from pykbroker.ctl.group import check_coordinator

            check_coordinator(conn, group)
        for name in topics:
            missing = sorted(set(chosen or ()) - set(metadata[name].partitions))
            if missing:
                raise CtlError(f"topic {name!r} has no partition {', '.join(map(str, missing))} "
                               f"(it has {len(metadata[name].partitions)})", EXIT_NOT_FOUND)

        assigned: set[tuple[str, int]] = set()
        at_end: set[tuple[str, int]] = set()
        if group:
            def on_assign(member: Any, assignment: list[Any]) -> None:
                assigned.update((tp.topic, tp.partition) for tp in assignment)
                if start.explicit:
                    member.assign(start.position(member, assignment, conn.timeout))

            def on_revoke(member: Any, revoked: list[Any]) -> None:
                for tp in revoked:
                    assigned.discard((tp.topic, tp.partition))
                    at_end.discard((tp.topic, tp.partition))

            consumer.subscribe(list(topics), on_assign=on_assign, on_revoke=on_revoke)
        else:
            wanted = [TopicPartition(name, index) for name in topics
                      for index in (chosen if chosen is not None else sorted(metadata[name].partitions))]
            consumer.assign(start.position(consumer, wanted, conn.timeout))
            assigned.update((tp.topic, tp.partition) for tp in wanted)

        received = 0
        while count is None or received < count:
            message = consumer.poll(POLL_S)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end.add((message.topic(), message.partition()))
                    if exit_at_end and assigned and at_end >= assigned:
                        break
                    continue
                if exit_code_for(error) == EXIT_UNREACHABLE and not error.fatal():
                    # A broker went away: librdkafka reconnects (to the new leader) by itself; keep reading.
                    click.echo(f"Warning: {error_text(error)}", err=True)
                    continue
                if error.fatal() or not error.retriable():
                    raise CtlError(f"consuming: {error_text(error)}", exit_code_for(error))
                continue
            at_end.discard((message.topic(), message.partition()))
            click.echo(render(_record(message)))
            received += 1
        if group:
            consumer.close()  # leaves the group and commits the position of what was printed
            closed = True
        progress(f"Consumed {received} record{'' if received == 1 else 's'}")
    finally:
        if not closed:
            _close_quietly(consumer)


def _warn_once() -> Any:
    """librdkafka's error_cb: client-level trouble (brokers gone, all of them down) that it recovers from by
    itself, said on stderr once until something else is said, while the consume waits."""
    last: list[str] = []

    def warn(error: Any) -> None:
        text = error_text(error)
        if last != [text]:
            last[:] = [text]
            click.echo(f"Warning: {text}", err=True)

    return warn


def _close_quietly(consumer: Any) -> None:
    try:
        consumer.close()
    except Exception:  # closing after a failure: that failure is what the user needs to see
        pass

"""``pykbroker group list|describe|seek|delete``: consumer groups through the AdminClient (ListGroups,
DescribeGroups, OffsetFetch, ListOffsets, OffsetCommit, DeleteGroups).

Both kinds of group are shown with their type ("classic", or "consumer" for the KIP-848 protocol). librdkafka
knows only the classic groups' states (a consumer group Assigning or Reconciling is its "Unknown"), so the
states come from ListGroups v5 asked of every broker, and ``describe`` asks a consumer group's coordinator for
its group and assignment epochs and each member's epoch (pykbroker.ctl.group_kinds); where those requests
cannot be made (a SASL mechanism the protocol client does not speak), what the admin client says is shown.

A command about one group (describe, seek, delete, and ``consume -g``) first asks a bootstrap broker for the
group's coordinator itself, with a raw FindCoordinator (pykbroker's protocol client): librdkafka retries
COORDINATOR_NOT_AVAILABLE until its timeout and then says only _TIMED_OUT, so a coordinator that cannot be
found (say, a cluster with fewer live brokers than offsets.topic.replication.factor, where Kafka does not
create __consumer_offsets) is reported at once with the broker's error and its error_message.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from typing import Any

import click

from pykbroker.ctl.common import (
    CLIENT_ID, EXIT_CODES_HELP, EXIT_KAFKA_ERROR, EXIT_NOT_FOUND, EXIT_UNREACHABLE, Connection, connection_options,
    CtlError, each_result, error_text, exit_code_for, node_json, parse_timestamp, progress, report_each, section, table,
)

FIND_COORDINATOR_KEY = 10
# How long a coordinator that is not available is asked for before the command works out why (Kafka answers
# COORDINATOR_NOT_AVAILABLE while the first FindCoordinator creates __consumer_offsets); see _coordinator_failure.
COORDINATOR_GRACE_S = 1.5
COORDINATOR_RETRY_S = 0.25
COORDINATOR_CHECK_S = 1.0  # the reason (pykbroker.ctl.coordination) is worked out again at most this often
_RETRIABLE_COORDINATOR_ERRORS = {14, 15, 16}  # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR


def check_coordinator(conn: Connection, group_id: str) -> None:
    """A CtlError (exit 1) naming the error and the broker's error_message when the group's coordinator
    cannot be found; nothing when it is found, or when the check cannot be made (a SASL mechanism the
    protocol client does not speak, the raw request failing): the command's own requests then say what they find."""
    from pykbroker.protocol.client import ClientError

    if not conn.authenticates:
        return
    host, port = conn.reachable()
    try:
        failure = asyncio.run(_coordinator_failure(conn, host, port, group_id))
    except (ClientError, OSError, TimeoutError):
        return
    if failure is not None:
        name, message, note = failure
        cause = name if not message or message.upper() == name else f"{name}: {message}"
        raise CtlError(f"cannot find the coordinator of group {group_id!r}: {cause}{note}", EXIT_KAFKA_ERROR)


async def _coordinator_failure(conn: Connection, host: str, port: int,
                               group_id: str) -> tuple[str, str | None, str] | None:
    """FindCoordinator for the group, asked again while the error is retriable: None once a coordinator is
    named, else (the error's name, the broker's error_message, a note). Past COORDINATOR_GRACE_S the reason
    is worked out as the console does (pykbroker.ctl.coordination: __consumer_offsets does not exist and
    fewer brokers are live than offsets.topic.replication.factor): with one, the command says it at once
    (in the note, unless the broker's error_message says it already); without one (the topic is being
    created, leaders elected, partitions loading) the answer is awaited for the whole --timeout, as the
    client would."""
    from kio.static.primitive import i8

    from pykbroker.ctl.coordination import offsets_topic_problem_async
    from pykbroker.protocol.client import KafkaClientConnection
    from pykbroker.protocol.errors import ErrorCode

    connection = await KafkaClientConnection.connect(host, port, client_id=CLIENT_ID, connect_timeout=conn.timeout,
                                                     request_timeout=conn.timeout, security=conn.security)
    try:
        version = connection.version_for(FIND_COORDINATOR_KEY, 4)
        schema = importlib.import_module(f"kio.schema.find_coordinator.v{version}.request").FindCoordinatorRequest
        request = (schema(key_type=i8(0), coordinator_keys=(group_id,)) if version >= 4
                   else schema(key=group_id) if version == 0 else schema(key=group_id, key_type=i8(0)))
        started = time.monotonic()
        next_check = started + COORDINATOR_GRACE_S
        while True:
            response = await connection.send(request)
            answer = response.coordinators[0] if version >= 4 else response
            error = ErrorCode(answer.error_code)
            if error == ErrorCode.none:
                return None
            name, message = error.name.upper(), getattr(answer, "error_message", None)
            now = time.monotonic()
            if int(error) not in _RETRIABLE_COORDINATOR_ERRORS or now - started >= conn.timeout:
                return name, message, ""
            if now >= next_check:
                next_check = now + COORDINATOR_CHECK_S
                reason = await offsets_topic_problem_async([(host, port)], conn.timeout, CLIENT_ID,
                                                            security=conn.security)
                if reason is not None:
                    return name, message, "" if reason in (message or "") else f" ({reason})"
            await asyncio.sleep(COORDINATOR_RETRY_S)
    finally:
        await connection.aclose()


@click.group()
def group() -> None:
    """List, describe (with lag), reset offsets of, and delete consumer groups."""


def _state(value: Any) -> str:
    return getattr(value, "name", str(value)).replace("_", "").title() if value is not None else "Unknown"


def _type(value: Any) -> str:
    """The admin client's ConsumerGroupType as Kafka names group types ("classic", "consumer", "unknown")."""
    return getattr(value, "name", str(value)).lower() if value is not None else "unknown"


def listed_types_and_states(conn: Connection) -> dict[str, tuple[str, str]]:
    """group id -> (type, state) as every broker's ListGroups v5 answers (pykbroker.ctl.group_kinds)."""
    from pykbroker.ctl.group_kinds import listed_types_and_states as listed

    if not conn.authenticates:
        return {}
    try:
        brokers = [(b.host, b.port) for b in conn.admin.list_topics(timeout=conn.timeout).brokers.values()]
        return listed(brokers, conn.timeout, security=conn.security, client_id=CLIENT_ID)
    except Exception:  # noqa: BLE001 - the admin client's listing is shown as it is
        return {}


def consumer_group_epochs(conn: Connection, coordinator: Any, group_id: str) -> dict[str, Any] | None:
    from pykbroker.ctl.group_kinds import consumer_group_epochs as epochs

    if not conn.authenticates or coordinator is None:
        return None
    return epochs(coordinator.host, coordinator.port, group_id, conn.timeout, security=conn.security,
                  client_id=CLIENT_ID)


@group.command("list", epilog=EXIT_CODES_HELP)
@connection_options
def list_(conn: Connection) -> None:
    """Every consumer group the brokers know, with its type (classic or consumer) and state."""
    result = conn.call(conn.admin.list_consumer_groups(request_timeout=conn.timeout), "listing groups")
    listed = listed_types_and_states(conn) if result.valid else {}
    rows = sorted(({"group": g.group_id, "type": listed.get(g.group_id, (_type(g.type), None))[0],
                    "state": listed.get(g.group_id, (None, _state(g.state)))[1], "simple": g.is_simple_consumer_group}
                   for g in result.valid), key=lambda row: row["group"])
    if result.errors and not rows:
        raise _list_error(result.errors[0])
    conn.emit(rows, lambda rows: table(["group", "type", "state"], [[r["group"], r["type"], r["state"]] for r in rows]))
    if result.errors:  # some brokers did not answer: the list may miss their groups
        for error in result.errors:
            click.echo(f"Error: a broker could not list its groups: {_list_error(error).message}", err=True)
        raise click.exceptions.Exit(max(_list_error(error).exit_code for error in result.errors))


def _list_error(error: Any) -> CtlError:
    error = error.args[0] if isinstance(error, Exception) and error.args else error
    if hasattr(error, "code"):
        return CtlError(f"listing groups: {error_text(error)}", exit_code_for(error))
    return CtlError(f"listing groups: {error}")


def _describe(conn: Connection, group_id: str) -> Any:
    check_coordinator(conn, group_id)
    return conn.call(conn.admin.describe_consumer_groups([group_id], request_timeout=conn.timeout)[group_id],
                     f"describing group {group_id!r}")


def _committed(conn: Connection, group_id: str, partitions: list[Any] | None = None) -> dict[tuple[str, int], int]:
    """The group's committed offsets (all of them, or of these partitions): (topic, partition) -> offset."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    request = ConsumerGroupTopicPartitions(group_id, partitions)
    result = conn.call(conn.admin.list_consumer_group_offsets([request], request_timeout=conn.timeout)[group_id],
                       f"fetching the offsets of group {group_id!r}")
    return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions if tp.offset >= 0 and tp.error is None}


def _list_offsets(conn: Connection, partitions: list[tuple[str, int]], spec: Any) -> dict[tuple[str, int], int]:
    """ListOffsets with one spec for these partitions: (topic, partition) -> offset (-1 when none)."""
    from confluent_kafka import TopicPartition

    if not partitions:
        return {}
    futures = conn.admin.list_offsets({TopicPartition(t, p): spec for t, p in partitions}, request_timeout=conn.timeout)
    return {(tp.topic, tp.partition): conn.call(future, f"listing offsets of {tp.topic}[{tp.partition}]").offset
            for tp, future in futures.items()}


def _exists(description: Any, committed: dict) -> bool:
    """Kafka answers DescribeGroups for an unknown group with state Dead and no members."""
    return not (_state(description.state) in ("Dead", "Unknown") and not description.members and not committed)


def describe_group(conn: Connection, group_id: str) -> dict[str, Any]:
    from confluent_kafka.admin import OffsetSpec

    description = _describe(conn, group_id)
    committed = _committed(conn, group_id)
    if not _exists(description, committed):
        raise CtlError(f"consumer group {group_id!r} does not exist", EXIT_NOT_FOUND)
    owners: dict[tuple[str, int], Any] = {}
    for member in description.members:
        for tp in (member.assignment.topic_partitions if member.assignment else []):
            owners[(tp.topic, tp.partition)] = member
    partitions = sorted(set(committed) | set(owners))
    ends = _list_offsets(conn, partitions, OffsetSpec.latest())
    rows = []
    for key in partitions:
        member, current, end = owners.get(key), committed.get(key), ends.get(key)
        rows.append({
            "topic": key[0], "partition": key[1], "current_offset": current, "log_end_offset": end,
            "lag": max(end - current, 0) if current is not None and end is not None and end >= 0 else None,
            "member_id": member.member_id if member else None, "client_id": member.client_id if member else None,
            "host": member.host if member else None,
        })
    kind = _type(getattr(description, "type", None))
    epochs = consumer_group_epochs(conn, description.coordinator, group_id) if kind == "consumer" else None
    member_epochs = (epochs or {}).get("member_epochs", {})
    for row in rows:
        row["member_epoch"] = member_epochs.get(row["member_id"])
    return {
        "group": group_id, "type": kind, "state": epochs["state"] if epochs else _state(description.state),
        "group_epoch": epochs["group_epoch"] if epochs else None,
        "assignment_epoch": epochs["assignment_epoch"] if epochs else None,
        "assignor": description.partition_assignor or (epochs or {}).get("assignor") or None,
        "coordinator": node_json(description.coordinator), "members": len(description.members),
        "total_lag": sum(row["lag"] or 0 for row in rows), "partitions": rows,
    }


def _render_group(data: dict[str, Any]) -> None:
    section(f"Group {data['group']}")
    coordinator = data["coordinator"]
    epochs = [["group epoch", data["group_epoch"]], ["assignment epoch", data["assignment_epoch"]]] \
        if data["type"] == "consumer" else []
    table(["name", "value"], [["type", data["type"]], ["state", data["state"]], *epochs, ["assignor", data["assignor"]],
                              ["coordinator", f"{coordinator['id']} ({coordinator['host']}:{coordinator['port']})"
                               if coordinator else None],
                              ["members", data["members"]], ["total lag", data["total_lag"]]])
    click.echo()
    member_epoch = data["type"] == "consumer"
    table(["topic", "partition", "current-offset", "log-end-offset", "lag", "member-id",
           *(["member-epoch"] if member_epoch else []), "client-id", "host"],
          [[r["topic"], r["partition"], r["current_offset"], r["log_end_offset"], r["lag"], r["member_id"],
            *([r["member_epoch"]] if member_epoch else []), r["client_id"], r["host"]] for r in data["partitions"]])


@group.command("describe", epilog=EXIT_CODES_HELP)
@click.argument("groups", nargs=-1, required=True)
@connection_options
def describe(conn: Connection, groups: tuple[str, ...]) -> None:
    """A group's state, members, and per partition its committed offset, log end offset and lag.
    Exit 3 if the group does not exist. With --format json: one object, or a list of them for several groups."""
    described = [describe_group(conn, group_id) for group_id in dict.fromkeys(groups)]

    def render(items: list[dict[str, Any]]) -> None:
        for index, data in enumerate(items):
            if index:
                click.echo()
            _render_group(data)

    conn.emit(described if len(described) > 1 else described[0], lambda _: render(described))


def _topic_partitions(conn: Connection, specs: tuple[str, ...]) -> list[tuple[str, int]]:
    """TOPIC or TOPIC:P,P... into (topic, partition) pairs, checked against metadata."""
    wanted: list[tuple[str, int]] = []
    for spec in specs:
        name, _, listed = spec.partition(":")
        partitions = conn.topic_metadata([name])[name].partitions
        if listed:
            try:
                chosen = sorted({int(p) for p in listed.split(",") if p.strip()})
            except ValueError:
                raise click.BadParameter(f"{spec!r}: expected TOPIC or TOPIC:P,P...", param_hint="'--topic'") from None
            missing = [p for p in chosen if p not in partitions]
            if missing:
                raise CtlError(f"topic {name!r} has no partition {', '.join(map(str, missing))}", EXIT_NOT_FOUND)
        else:
            chosen = sorted(partitions)
        wanted += [(name, p) for p in chosen]
    return wanted


@group.command("seek", epilog=EXIT_CODES_HELP)
@click.argument("group_id", metavar="GROUP")
@click.option("--to", "to", metavar="earliest|latest|OFFSET", help="Reset to the log start, the log end, or an offset (clamped to the log).")
@click.option("--to-timestamp", metavar="MS|ISO-8601", help="Reset to the first offset at or after this time.")
@click.option("--shift-by", type=int, metavar="N", help="Move each committed offset by N (negative: back), clamped to the log.")
@click.option("-t", "--topic", "topics", multiple=True, metavar="TOPIC[:P,P...]",
              help="Reset these topics (or partitions) only.  [default: every partition the group has offsets for]")
@click.option("--dry-run", is_flag=True, help="Show the new offsets without committing them.")
@connection_options
def seek(conn: Connection, group_id: str, to: str | None, to_timestamp: str | None, shift_by: int | None,
         topics: tuple[str, ...], dry_run: bool) -> None:
    """Reset a group's committed offsets (as kafka-consumer-groups.sh --reset-offsets --execute).

    Refused while the group has members (exit 1), as Kafka's tool refuses: stop its consumers first."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    modes = [mode for mode in (to, to_timestamp, shift_by) if mode is not None]
    if len(modes) != 1:
        raise click.UsageError("give exactly one of --to, --to-timestamp, --shift-by")
    absolute = None
    if to is not None and to not in ("earliest", "latest"):
        try:
            absolute = int(to)
        except ValueError:
            raise click.BadParameter(f"{to!r}: expected earliest, latest or an offset", param_hint="'--to'") from None
        if absolute < 0:
            raise click.BadParameter("an offset is at least 0", param_hint="'--to'")
    timestamp = parse_timestamp(to_timestamp) if to_timestamp is not None else None

    description = _describe(conn, group_id)
    state = _state(description.state)
    if description.members or state not in ("Empty", "Dead", "Unknown"):
        raise CtlError(f"Assignments can only be reset if the group '{group_id}' is inactive, but the current state "
                       f"is {state}.", EXIT_KAFKA_ERROR)
    committed = _committed(conn, group_id)
    partitions = _topic_partitions(conn, topics) if topics else sorted(committed)
    if not partitions:
        raise CtlError(f"group {group_id!r} has no committed offsets: name the topics to reset with --topic",
                       EXIT_NOT_FOUND if not _exists(description, committed) else EXIT_KAFKA_ERROR)
    low = _list_offsets(conn, partitions, OffsetSpec.earliest())
    high = _list_offsets(conn, partitions, OffsetSpec.latest())
    if timestamp is not None:
        at_time = _list_offsets(conn, partitions, OffsetSpec.for_timestamp(timestamp))
    new: dict[tuple[str, int], int] = {}
    for key in partitions:
        if to == "earliest":
            target = low[key]
        elif to == "latest":
            target = high[key]
        elif absolute is not None:
            target = absolute
        elif timestamp is not None:
            target = at_time[key] if at_time[key] >= 0 else high[key]
        else:
            if key not in committed:
                raise CtlError(f"group {group_id!r} has no committed offset for {key[0]}[{key[1]}] to shift", EXIT_KAFKA_ERROR)
            target = committed[key] + shift_by
        new[key] = min(max(target, low[key]), high[key])  # Kafka's tool clamps to the log

    if dry_run:  # said on stderr, as the progress of a real reset is: stdout stays the table
        progress(f"Dry run: the new offsets of {len(new)} partitions of group {group_id}; nothing committed "
                 "(without --dry-run they would be).")
    else:
        progress(f"Resetting {len(new)} partitions of group {group_id} ...")
        request = ConsumerGroupTopicPartitions(group_id, [TopicPartition(t, p, offset) for (t, p), offset in new.items()])
        result = conn.call(conn.admin.alter_consumer_group_offsets([request], request_timeout=conn.timeout)[group_id],
                           f"committing the offsets of group {group_id!r}")
        for tp in result.topic_partitions:
            if tp.error is not None:
                raise CtlError(f"committing {tp.topic}[{tp.partition}] for group {group_id!r}: {error_text(tp.error)}",
                               exit_code_for(tp.error))
    rows = [{"group": group_id, "topic": t, "partition": p, "previous_offset": committed.get((t, p)),
             "new_offset": offset} for (t, p), offset in sorted(new.items())]
    conn.emit({"group": group_id, "dry_run": dry_run, "partitions": rows},
              lambda data: table(["group", "topic", "partition", "previous-offset", "new-offset"],
                                 [[r["group"], r["topic"], r["partition"], r["previous_offset"], r["new_offset"]]
                                  for r in rows]))


@group.command("delete", epilog=EXIT_CODES_HELP)
@click.argument("groups", nargs=-1, required=True)
@connection_options
def delete(conn: Connection, groups: tuple[str, ...]) -> None:
    """Delete groups and their committed offsets (DeleteGroups), one row each. A group with members is
    refused (NON_EMPTY_GROUP, exit 1); an unknown one is exit 3; one whose coordinator cannot be found is
    said in its row (exit 1) and the others are still deleted."""
    failed: dict[str, CtlError] = {}
    for group_id in dict.fromkeys(groups):
        try:  # a group without a coordinator is its own row; the others are still deleted
            check_coordinator(conn, group_id)
        except CtlError as exc:
            if exc.exit_code == EXIT_UNREACHABLE:
                raise
            failed[group_id] = exc
    wanted = [group_id for group_id in dict.fromkeys(groups) if group_id not in failed]
    futures = conn.admin.delete_consumer_groups(wanted, request_timeout=conn.timeout) if wanted else {}
    deleted = dict(each_result(conn, futures, "deleting groups"))
    report_each(conn, [(group_id, failed.get(group_id, deleted.get(group_id))) for group_id in dict.fromkeys(groups)],
                "group", "deleted")

"""``pykbroker topic create|list|describe|alter-config|delete``: topics through the AdminClient
(CreateTopics, Metadata, DescribeConfigs, ListOffsets, IncrementalAlterConfigs, DeleteTopics)."""

from __future__ import annotations

from typing import Any

import click

from pykbroker.ctl.common import (
    EXIT_CODES_HELP, Connection, connection_options, each_result, parse_pairs, report_each, section, table,
)


@click.group()
def topic() -> None:
    """Create, list, describe, reconfigure and delete topics."""


@topic.command("create", epilog=EXIT_CODES_HELP)
@click.argument("names", nargs=-1, required=True)
@click.option("-p", "--partitions", type=click.IntRange(min=-1), default=-1, show_default=True,
              help="Number of partitions (-1: the broker's num.partitions).")
@click.option("-r", "--replication-factor", type=click.IntRange(min=-1), default=-1, show_default=True,
              help="Replicas per partition (-1: the broker's default.replication.factor).")
@click.option("-c", "--config", "configs", multiple=True, metavar="KEY=VALUE",
              help="A topic config, e.g. -c retention.ms=86400000 (repeatable).")
@click.option("--if-not-exists", is_flag=True, help="A topic that already exists is not an error.")
@connection_options
def create(conn: Connection, names: tuple[str, ...], partitions: int, replication_factor: int,
           configs: tuple[str, ...], if_not_exists: bool) -> None:
    """Create topics (CreateTopics). Exit 1 if any could not be created."""
    from confluent_kafka.admin import NewTopic

    config = parse_pairs(configs, "'-c' / '--config'")
    new = [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=config)
           for name in dict.fromkeys(names)]
    futures = conn.admin.create_topics(new, request_timeout=conn.timeout, operation_timeout=conn.timeout)
    report_each(conn, each_result(conn, futures, "creating topics"), "topic", "created",
                tolerate="TOPIC_ALREADY_EXISTS" if if_not_exists else None, tolerated="already exists")


@topic.command("list", epilog=EXIT_CODES_HELP)
@click.option("-i", "--internal", is_flag=True, help="Include internal topics (__consumer_offsets).")
@connection_options
def list_(conn: Connection, internal: bool) -> None:
    """List topics with their partition and replica counts (Metadata)."""
    topics = conn.topic_metadata()
    rows = []
    for name in sorted(topics):
        metadata = topics[name]
        if name.startswith("__") and not internal:
            continue
        partitions = metadata.partitions
        replicas = len(next(iter(partitions.values())).replicas) if partitions else 0
        rows.append({"topic": name, "partitions": len(partitions), "replication_factor": replicas})
    conn.emit(rows, lambda rows: table(["name", "partitions", "replicas"],
                                       [[r["topic"], r["partitions"], r["replication_factor"]] for r in rows]))


def describe_topic(conn: Connection, name: str, *, with_configs: bool = True) -> dict[str, Any]:
    """One topic as a dict: id, partitions with leader/replicas/ISR and their offsets, configs."""
    from confluent_kafka import TopicCollection, TopicPartition
    from confluent_kafka.admin import ConfigResource, OffsetSpec

    conn.topic_metadata([name])  # EXIT_NOT_FOUND for a missing topic, as one clear line
    described = conn.call(conn.admin.describe_topics(TopicCollection([name]), request_timeout=conn.timeout)[name],
                          f"describing topic {name!r}")
    partitions = sorted(described.partitions, key=lambda p: p.id)
    offsets: dict[tuple[int, str], int | None] = {}
    if partitions:
        # Two specs per partition cannot share one call (a TopicPartition is the key): one call per spec.
        for kind, spec in (("low", OffsetSpec.earliest()), ("high", OffsetSpec.latest())):
            futures = conn.admin.list_offsets({TopicPartition(name, p.id): spec for p in partitions},
                                              request_timeout=conn.timeout)
            for tp, future in futures.items():
                try:
                    offsets[(tp.partition, kind)] = future.result(timeout=conn.timeout + 5).offset
                except Exception:  # a partition without a leader has no offsets to show
                    offsets[(tp.partition, kind)] = None
    result: dict[str, Any] = {
        "topic": described.name,
        "topic_id": str(described.topic_id) if described.topic_id is not None else None,
        "internal": described.is_internal,
        "partitions": [
            {
                "partition": p.id,
                "leader": p.leader.id if p.leader is not None else None,
                "replicas": [node.id for node in p.replicas],
                "isr": [node.id for node in p.isr],
                "low_watermark": offsets.get((p.id, "low")),
                "high_watermark": offsets.get((p.id, "high")),
            }
            for p in partitions
        ],
    }
    result["replication_factor"] = len(result["partitions"][0]["replicas"]) if partitions else 0
    if with_configs:
        resource = ConfigResource("topic", name)
        entries = conn.call(conn.admin.describe_configs([resource], request_timeout=conn.timeout)[resource],
                            f"describing the configs of {name!r}")
        result["configs"] = [
            {"name": entry.name, "value": None if entry.is_sensitive else entry.value,
             "source": _source_name(entry.source),
             "default": entry.is_default, "read_only": entry.is_read_only, "sensitive": entry.is_sensitive}
            for entry in sorted(entries.values(), key=lambda e: e.name)
        ]
    return result


def _source_name(source: Any) -> str:
    from confluent_kafka.admin import ConfigSource

    try:
        return ConfigSource(source).name
    except ValueError:
        return str(source)


def _render_topic(data: dict[str, Any], all_configs: bool) -> None:
    section(f"Topic {data['topic']}")
    table(["name", "value"], [["id", data["topic_id"]], ["internal", str(data["internal"]).lower()],
                              ["partitions", len(data["partitions"])],
                              ["replication factor", data["replication_factor"]]])
    if "configs" in data:
        click.echo()
        shown = [c for c in data["configs"] if all_configs or not c["default"]]
        section("Configs" + ("" if all_configs else " (not default; --all-configs for every one)"))
        if shown:
            table(["key", "value", "source"], [[c["name"], "[hidden]" if c["sensitive"] else c["value"], c["source"]]
                                               for c in shown])
    click.echo()
    section("Partitions")
    table(["partition", "leader", "replicas", "isr", "low-watermark", "high-watermark"],
          [[p["partition"], p["leader"], ",".join(map(str, p["replicas"])), ",".join(map(str, p["isr"])),
            p["low_watermark"], p["high_watermark"]] for p in data["partitions"]])


@topic.command("describe", epilog=EXIT_CODES_HELP)
@click.argument("names", nargs=-1, required=True)
@click.option("--configs/--no-configs", "with_configs", default=True, show_default=True, help="Show the topic's configs.")
@click.option("-a", "--all-configs", is_flag=True, help="Every config, not only those that differ from the default.")
@connection_options
def describe(conn: Connection, names: tuple[str, ...], with_configs: bool, all_configs: bool) -> None:
    """A topic's partitions (leader, replicas, ISR, offsets) and configs. With --format json: one object,
    or a list of them when several topics are named."""
    described = [describe_topic(conn, name, with_configs=with_configs) for name in dict.fromkeys(names)]

    def render(items: list[dict[str, Any]]) -> None:
        for index, data in enumerate(items):
            if index:
                click.echo()
            _render_topic(data, all_configs)

    conn.emit(described if len(described) > 1 else described[0], lambda data: render(described))


@topic.command("alter-config", epilog=EXIT_CODES_HELP)
@click.argument("name")
@click.option("-s", "--set", "sets", multiple=True, metavar="KEY=VALUE", help="Set a config (repeatable).")
@click.option("-d", "--delete", "deletes", multiple=True, metavar="KEY", help="Remove a config: back to the default (repeatable).")
@click.option("--append", "appends", multiple=True, metavar="KEY=VALUE", help="Add a value to a list config (repeatable).")
@click.option("--subtract", "subtracts", multiple=True, metavar="KEY=VALUE", help="Remove a value from a list config (repeatable).")
@click.option("--dry-run", is_flag=True, help="Have the broker validate the change without applying it.")
@connection_options
def alter_config(conn: Connection, name: str, sets: tuple[str, ...], deletes: tuple[str, ...], appends: tuple[str, ...],
                 subtracts: tuple[str, ...], dry_run: bool) -> None:
    """Change a topic's configs (IncrementalAlterConfigs); the others keep their values."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    changes: list[tuple[str, str | None, Any]] = []
    for items, op, hint in ((sets, AlterConfigOpType.SET, "'--set'"), (appends, AlterConfigOpType.APPEND, "'--append'"),
                            (subtracts, AlterConfigOpType.SUBTRACT, "'--subtract'")):
        changes += [(key, value, op) for key, value in parse_pairs(items, hint).items()]
    changes += [(key, None, AlterConfigOpType.DELETE) for key in deletes]
    if not changes:
        raise click.UsageError("nothing to change: give --set, --delete, --append or --subtract")
    conn.topic_metadata([name])
    resource = ConfigResource("topic", name, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=op) for key, value, op in changes])
    futures = conn.admin.incremental_alter_configs([resource], request_timeout=conn.timeout, validate_only=dry_run)
    conn.call(next(iter(futures.values())), f"altering the configs of {name!r}")
    rows = [{"topic": name, "config": key, "operation": op.name, "value": value, "dry_run": dry_run}
            for key, value, op in changes]
    conn.emit(rows, lambda rows: table(["topic", "config", "operation", "value"],
                                       [[r["topic"], r["config"], r["operation"], r["value"]] for r in rows]))


@topic.command("delete", epilog=EXIT_CODES_HELP)
@click.argument("names", nargs=-1, required=True)
@click.option("--if-exists", is_flag=True, help="A topic that does not exist is not an error.")
@connection_options
def delete(conn: Connection, names: tuple[str, ...], if_exists: bool) -> None:
    """Delete topics and their data (DeleteTopics). Exit 3 if one does not exist."""
    futures = conn.admin.delete_topics(list(dict.fromkeys(names)), request_timeout=conn.timeout, operation_timeout=conn.timeout)
    report_each(conn, each_result(conn, futures, "deleting topics"), "topic", "deleted",
                tolerate="UNKNOWN_TOPIC_OR_PART" if if_exists else None, tolerated="does not exist")

"""The console's data layer: what the pages show, read through the Kafka protocol like any client.

:class:`ClusterReader` wraps one confluent-kafka AdminClient (thread-safe, shared by the HTTP threads) and
creates a short-lived Consumer per message-browser request. Every call is bounded: AdminClient requests get
``request_timeout`` and their futures are awaited at most a little longer; a failure or a timeout becomes a
:class:`ConsoleError` whose message the server shows on an error page.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable

from confluent_kafka import (Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException,
                             TopicPartition)
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic, OffsetSpec, ResourceType

from pykbroker.ctl.coordination import offsets_topic_problem
from pykbroker.ctl.group_kinds import consumer_group_epochs, listed_types_and_states
from pykbroker.ctl.security import client_security
from pykbroker.console.logdirs import log_dir_sizes

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
MAX_MESSAGES = 500          # the message browser never returns more
DEFAULT_MESSAGES = 50
MAX_VALUE_BYTES = 64 * 1024  # bytes kept (and shown) of one key or value
DEFAULT_VALUE_BYTES = 4096
MAX_HEADERS = 64             # headers shown per message
START_MODES = ("newest", "oldest", "offset", "timestamp")
RESET_MODES = ("earliest", "latest", "offset", "timestamp")
CLIENT_ID = "pykbroker-console"


class ConsoleError(Exception):
    """A request the console cannot answer: shown as a message page with this HTTP status."""

    status = 502

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status

    def __reduce__(self):  # crosses from the worker processes with its status
        return (type(self), (str(self), self.status))


class NotFound(ConsoleError):
    status = 404


class BadRequest(ConsoleError):
    status = 400


# -- what the pages show -------------------------------------------------------------------------------

@dataclass
class Broker:
    id: int
    host: str
    port: int
    rack: str | None = None
    is_controller: bool = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass
class ClusterInfo:
    cluster_id: str | None
    controller_id: int | None
    brokers: list[Broker]
    topic_count: int = 0
    partition_count: int = 0


@dataclass
class PartitionInfo:
    partition: int
    leader: int
    replicas: list[int]
    isr: list[int]
    start: int | None = None
    end: int | None = None
    size: int | None = None
    error: str | None = None

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)

    @property
    def messages(self) -> int | None:
        return None if self.start is None or self.end is None else self.end - self.start


@dataclass
class ConfigItem:
    name: str
    value: str | None
    is_default: bool
    source: str
    sensitive: bool = False
    read_only: bool = False


@dataclass
class Topic:
    name: str
    partitions: list[PartitionInfo]
    internal: bool = False
    configs: list[ConfigItem] = field(default_factory=list)
    error: str | None = None

    @property
    def replication_factor(self) -> int:
        return max((len(p.replicas) for p in self.partitions), default=0)

    @property
    def under_replicated(self) -> int:
        return sum(p.under_replicated for p in self.partitions)

    @property
    def size(self) -> int | None:
        return _sum_or_none(p.size for p in self.partitions)

    @property
    def messages(self) -> int | None:
        return _sum_or_none(p.messages for p in self.partitions)


@dataclass
class Member:
    member_id: str
    client_id: str
    host: str
    assignment: list[tuple[str, int]]
    group_instance_id: str | None = None
    epoch: int | None = None  # a consumer group's member: its member epoch


@dataclass
class GroupOffset:
    topic: str
    partition: int
    committed: int | None
    end: int | None
    member: str | None = None  # client id of the member the partition is assigned to

    @property
    def lag(self) -> int | None:
        if self.committed is None or self.committed < 0 or self.end is None:
            return None
        return max(0, self.end - self.committed)


@dataclass
class Group:
    group_id: str
    state: str
    is_simple: bool = False
    assignor: str = ""
    coordinator: int | None = None
    members: list[Member] = field(default_factory=list)
    offsets: list[GroupOffset] = field(default_factory=list)
    error: str | None = None
    type: str = "classic"  # or "consumer" (KIP-848), Kafka's group types
    group_epoch: int | None = None  # a consumer group's epochs (ConsumerGroupDescribe)
    assignment_epoch: int | None = None

    @property
    def lag(self) -> int | None:
        return _sum_or_none((o.lag for o in self.offsets), empty=None)


@dataclass
class Message:
    topic: str
    partition: int
    offset: int
    timestamp: int | None  # ms since the epoch
    timestamp_type: str
    key: bytes | None
    value: bytes | None
    key_size: int
    value_size: int
    headers: list[tuple[str, bytes | None]]


@dataclass
class Browse:
    topic: str
    messages: list[Message]
    partitions: list[int]
    truncated_values: bool = False
    timed_out: bool = False


def _sum_or_none(values: Iterable[int | None], empty: int | None = 0) -> int | None:
    total, seen = 0, False
    for value in values:
        if value is None:
            return None
        total, seen = total + value, True
    return total if seen else empty


def parse_timestamp(text: str) -> int:
    """Milliseconds since the epoch from an integer (ms) or an ISO 8601 date/time (UTC unless it says)."""
    text = (text or "").strip()
    if not text:
        raise BadRequest("a timestamp is required")
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(f"not a timestamp: {text!r} (use milliseconds or YYYY-MM-DDTHH:MM[:SS])") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return int(moment.timestamp() * 1000)


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        error: KafkaError = exc.args[0]
        return f"{error.name()}: {error.str()}"
    return str(exc) or type(exc).__name__


# -- the reader ----------------------------------------------------------------------------------------

class ClusterReader:
    """Reads (and, when the server allows it, changes) one cluster; safe to share between threads."""

    def __init__(self, bootstrap: str, *, timeout: float = DEFAULT_TIMEOUT_S,
                 client_config: dict[str, Any] | None = None) -> None:
        self.bootstrap = bootstrap
        self.timeout = timeout
        self.client_config = {"bootstrap.servers": bootstrap, "client.id": CLIENT_ID,
                              "socket.timeout.ms": int(timeout * 1000), **(client_config or {})}
        self.admin = AdminClient(self.client_config, logger=log)
        # pykbroker's own protocol client (DescribeLogDirs, the coordination check) with the same TLS and SASL;
        # None when it cannot authenticate with these settings (a SASL mechanism it does not speak).
        security = client_security(self.client_config)
        self._protocol_client = security is None or security.authenticates
        self.security = security if self._protocol_client else None

    # -- plumbing -------------------------------------------------------------------------------------
    @property
    def _request_kwargs(self) -> dict[str, float]:
        return {"request_timeout": self.timeout}

    def _result(self, future: concurrent.futures.Future, what: str) -> Any:
        try:
            return future.result(timeout=self.timeout + 2)
        except concurrent.futures.TimeoutError:
            raise ConsoleError(f"{what}: no answer from the cluster within {self.timeout:g} s", 504) from None
        except KafkaException as exc:
            raise ConsoleError(f"{what}: {_error_text(exc)}") from None

    def _results(self, futures: dict, what: str) -> tuple[dict, dict]:
        """(results, errors) of a dict of futures: one failed item does not spoil the others, but a
        timeout still bounds the whole wait."""
        results, errors = {}, {}
        deadline = time.monotonic() + self.timeout + 2
        for key, future in futures.items():
            try:
                results[key] = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                raise ConsoleError(f"{what}: no answer from the cluster within {self.timeout:g} s", 504) from None
            except KafkaException as exc:
                errors[key] = _error_text(exc)
        return results, errors

    def _metadata(self, topic: str | None = None):
        try:
            return self.admin.list_topics(topic=topic, timeout=self.timeout)
        except KafkaException as exc:
            raise ConsoleError(f"metadata: {_error_text(exc)}") from None

    def close(self) -> None:
        pass  # AdminClient has no close; librdkafka tears it down when collected

    # -- offsets --------------------------------------------------------------------------------------
    def offsets(self, partitions: Iterable[tuple[str, int]], spec: OffsetSpec) -> dict[tuple[str, int], int]:
        """ListOffsets for many partitions in one AdminClient call; failed partitions are left out."""
        request = {TopicPartition(topic, partition): spec for topic, partition in partitions}
        if not request:
            return {}
        try:
            futures = self.admin.list_offsets(request, **self._request_kwargs)
        except KafkaException as exc:
            raise ConsoleError(f"list offsets: {_error_text(exc)}") from None
        results, _ = self._results(futures, "list offsets")
        return {(tp.topic, tp.partition): info.offset for tp, info in results.items()}

    def watermarks(self, partitions: Iterable[tuple[str, int]]) -> tuple[dict, dict]:
        partitions = list(partitions)
        return self.offsets(partitions, OffsetSpec.earliest()), self.offsets(partitions, OffsetSpec.latest())

    def sizes(self, brokers: Iterable[Broker]) -> dict[int, dict | None]:
        if not self._protocol_client:
            return {b.id: None for b in brokers}
        return log_dir_sizes([(b.id, b.host, b.port) for b in brokers], self.timeout, security=self.security)

    # -- cluster --------------------------------------------------------------------------------------
    def cluster(self) -> ClusterInfo:
        description = self._result(self.admin.describe_cluster(**self._request_kwargs), "describe cluster")
        controller = description.controller.id if description.controller is not None else None
        brokers = [Broker(node.id, node.host, node.port, node.rack, node.id == controller)
                   for node in sorted(description.nodes, key=lambda n: n.id)]
        metadata = self._metadata()
        return ClusterInfo(description.cluster_id, controller, brokers, topic_count=len(metadata.topics),
                           partition_count=sum(len(t.partitions) for t in metadata.topics.values()))

    def _brokers(self, metadata) -> list[Broker]:
        return [Broker(b.id, b.host, b.port) for b in metadata.brokers.values()]

    def _topics(self, metadata, names: Iterable[str]) -> list[Topic]:
        topics = []
        for name in names:
            meta = metadata.topics[name]
            partitions = [PartitionInfo(p.id, p.leader, list(p.replicas), list(p.isrs),
                                        error=str(p.error) if p.error else None)
                          for p in sorted(meta.partitions.values(), key=lambda p: p.id)]
            topics.append(Topic(name, partitions, internal=name.startswith("__"),
                                error=meta.error.str() if meta.error else None))
        keys = [(t.name, p.partition) for t in topics for p in t.partitions]
        starts, ends = self.watermarks(keys)
        sizes = self.sizes(self._brokers(metadata))
        for topic in topics:
            for p in topic.partitions:
                p.start, p.end = starts.get((topic.name, p.partition)), ends.get((topic.name, p.partition))
                leader_sizes = sizes.get(p.leader)
                p.size = leader_sizes.get((topic.name, p.partition)) if leader_sizes else None
        return topics

    def topics(self) -> list[Topic]:
        metadata = self._metadata()
        return self._topics(metadata, sorted(metadata.topics))

    def topic(self, name: str) -> Topic:
        metadata = self._metadata()  # not list_topics(topic=name): that may create it (auto.create.topics)
        if name not in metadata.topics:
            raise NotFound(f"no topic named {name!r}")
        topic = self._topics(metadata, [name])[0]
        resource = ConfigResource(ResourceType.TOPIC, name)
        futures = self.admin.describe_configs([resource], **self._request_kwargs)
        entries = self._result(futures[resource], f"describe configs of {name}")
        topic.configs = [_config_item(e) for e in sorted(entries.values(), key=lambda e: e.name)]
        return topic

    def topic_names(self) -> list[str]:
        return sorted(self._metadata().topics)

    def topic_partitions(self, name: str) -> list[int]:
        metadata = self._metadata()
        if name not in metadata.topics:
            raise NotFound(f"no topic named {name!r}")
        return sorted(metadata.topics[name].partitions)

    # -- groups ---------------------------------------------------------------------------------------
    def coordination_problem(self) -> str | None:
        """Why consumer groups cannot start (pykbroker.ctl.coordination, shared with the CLI: no side effect,
        no full Metadata), None when they can or no broker answers."""
        import click

        from pykbroker.ctl.common import parse_bootstrap

        try:
            bootstrap = parse_bootstrap(self.bootstrap)
        except click.BadParameter:  # the client calls say what is wrong with it
            return None
        if not self._protocol_client:
            return None
        problem = offsets_topic_problem(bootstrap, self.timeout, CLIENT_ID, security=self.security)
        return f"consumer groups cannot start: {problem}" if problem else None

    def _committed(self, group_ids: list[str]) -> tuple[dict[str, list], dict[str, str]]:
        # librdkafka asks for one group per ListConsumerGroupOffsets call: send them all, then wait.
        futures = {}
        for group_id in group_ids:
            futures.update(self.admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group_id)],
                                                                  **self._request_kwargs))
        results, errors = self._results(futures, "list group offsets")
        return {g: list(r.topic_partitions or []) for g, r in results.items()}, errors

    def _describe_groups(self, group_ids: list[str]) -> tuple[dict, dict]:
        if not group_ids:
            return {}, {}
        futures = self.admin.describe_consumer_groups(group_ids, **self._request_kwargs)
        return self._results(futures, "describe groups")

    def _group(self, group_id: str, description, committed: list, ends: dict) -> Group:
        members = [Member(m.member_id, m.client_id, m.host,
                          sorted((tp.topic, tp.partition) for tp in (m.assignment.topic_partitions or [])),
                          m.group_instance_id)
                   for m in sorted(description.members, key=lambda m: (m.client_id, m.member_id))]
        owner = {tp: m.client_id for m in members for tp in m.assignment}
        offsets = {(tp.topic, tp.partition): GroupOffset(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else None,
                                                         ends.get((tp.topic, tp.partition)))
                   for tp in committed}
        for tp in owner:  # assigned but never committed
            offsets.setdefault(tp, GroupOffset(tp[0], tp[1], None, ends.get(tp)))
        for key, offset in offsets.items():
            offset.member = owner.get(key)
        state = getattr(description.state, "name", str(description.state))
        coordinator = description.coordinator.id if description.coordinator is not None else None
        kind = getattr(getattr(description, "type", None), "name", "classic").lower()
        return Group(group_id, state, description.is_simple_consumer_group, description.partition_assignor or "",
                     coordinator, members, [offsets[k] for k in sorted(offsets)],
                     type=kind if kind in ("classic", "consumer") else "classic")

    def _listed(self) -> dict[str, tuple[str, str]]:
        """group id -> (type, state) from the brokers' ListGroups v5 (pykbroker.ctl.group_kinds)."""
        if not self._protocol_client:
            return {}
        try:
            return listed_types_and_states([(b.host, b.port) for b in self._brokers(self._metadata())], self.timeout,
                                           security=self.security, client_id=CLIENT_ID)
        except Exception:  # noqa: BLE001 - the admin client's view is shown as it is
            return {}

    @staticmethod
    def _kind_and_state(group: Group, listed: dict[str, tuple[str, str]]) -> None:
        """A consumer group's type and state as the broker lists them (librdkafka has no name for Assigning or
        Reconciling), in the upper-case names the console shows."""
        kind, state = listed.get(group.group_id, (group.type, None))
        group.type = kind
        if kind == "consumer" and state:
            group.state = state.upper()

    def groups(self) -> list[Group]:
        self._metadata()  # ListGroups asks the brokers it knows: none when the cluster is unreachable
        listing = self._result(self.admin.list_consumer_groups(**self._request_kwargs), "list groups")
        if listing.errors:
            raise ConsoleError("list groups: " + "; ".join(_error_text(e) for e in listing.errors))
        group_ids = sorted(g.group_id for g in listing.valid)
        descriptions, describe_errors = self._describe_groups(group_ids)
        committed, offset_errors = self._committed(group_ids)
        ends = self.offsets({(tp.topic, tp.partition) for tps in committed.values() for tp in tps},
                            OffsetSpec.latest())
        listed = self._listed() if group_ids else {}
        groups = []
        for group_id in group_ids:
            if group_id in descriptions:
                group = self._group(group_id, descriptions[group_id], committed.get(group_id, []), ends)
            else:
                group = Group(group_id, "UNKNOWN")
            self._kind_and_state(group, listed)
            group.error = describe_errors.get(group_id) or offset_errors.get(group_id)
            groups.append(group)
        return groups

    def group(self, group_id: str) -> Group:
        problem = self.coordination_problem()  # at once, rather than a describe call's timeout
        if problem is not None:
            raise ConsoleError(f"group {group_id!r}: {problem}", 503)
        descriptions, errors = self._describe_groups([group_id])
        if group_id not in descriptions:
            raise ConsoleError(f"describe group {group_id!r}: {errors.get(group_id, 'no answer')}")
        description = descriptions[group_id]
        committed, offset_errors = self._committed([group_id])
        if group_id in offset_errors:
            raise ConsoleError(f"offsets of group {group_id!r}: {offset_errors[group_id]}")
        tps = committed.get(group_id, [])
        assigned = {(tp.topic, tp.partition) for m in description.members
                    for tp in (m.assignment.topic_partitions or [])}
        ends = self.offsets({(tp.topic, tp.partition) for tp in tps} | assigned, OffsetSpec.latest())
        group = self._group(group_id, description, tps, ends)
        node = description.coordinator
        epochs = (consumer_group_epochs(node.host, node.port, group_id, self.timeout, security=self.security,
                                        client_id=CLIENT_ID)
                  if group.type == "consumer" and self._protocol_client and node is not None else None)
        if epochs is not None:
            group.state, group.group_epoch, group.assignment_epoch = (epochs["state"].upper(), epochs["group_epoch"],
                                                                      epochs["assignment_epoch"])
            group.assignor = group.assignor or epochs["assignor"]
            for member in group.members:
                member.epoch = epochs["member_epochs"].get(member.member_id)
        if group.state in ("DEAD", "UNKNOWN") and not group.offsets:
            raise NotFound(f"no consumer group named {group_id!r}")
        return group

    # -- messages -------------------------------------------------------------------------------------
    def browse(self, topic: str, partition: int | None = None, start: str = "newest", position: str = "",
               limit: int = DEFAULT_MESSAGES, max_bytes: int = DEFAULT_VALUE_BYTES,
               newest_first: bool = True) -> Browse:
        """Up to ``limit`` messages of a topic (one partition or all): the newest (``start="newest"``),
        the oldest, those from an offset or from a timestamp on. Keys and values are cut to ``max_bytes``
        (their full sizes are kept). Sorted newest first unless ``newest_first`` is false."""
        if start not in START_MODES:
            raise BadRequest(f"start must be one of {', '.join(START_MODES)}")
        limit = max(1, min(int(limit), MAX_MESSAGES))
        max_bytes = max(16, min(int(max_bytes), MAX_VALUE_BYTES))
        partitions = self.topic_partitions(topic)
        if partition is not None:
            if partition not in partitions:
                raise NotFound(f"topic {topic!r} has no partition {partition}")
            partitions = [partition]
        keys = [(topic, p) for p in partitions]
        lows, highs = self.watermarks(keys)
        if start == "newest":
            begins = {k: max(lows.get(k, 0), highs[k] - limit) for k in highs}
        else:
            begins = self._positions(keys, "earliest" if start == "oldest" else start, position, lows, highs)
        ranges = {}
        for key in keys:
            if key not in lows or key not in highs or key not in begins:
                continue
            begin = min(max(begins[key], lows[key]), highs[key])
            stop = min(highs[key], begin + limit)
            if begin < stop:
                ranges[key[1]] = (begin, stop)
        # Over several partitions: the newest (or the first) `limit` of what the windows hold, by timestamp.
        messages, truncated, timed_out = self._consume(topic, ranges, max_bytes, limit, newest=start == "newest")
        messages.sort(key=_time_order, reverse=newest_first)
        return Browse(topic, messages, partitions, truncated, timed_out)

    def _positions(self, keys: list[tuple[str, int]], mode: str, position: str, lows: dict, highs: dict) -> dict:
        """The offset each partition starts at (browse) or is reset to: ``earliest``, ``latest``, ``offset``
        (the number in position) or ``timestamp`` (the first offset at or after it; the end when none).
        Not yet clamped to the partitions' ranges."""
        if mode == "earliest":
            return dict(lows)
        if mode == "latest":
            return dict(highs)
        if mode == "offset":
            try:
                wanted = int(position)
            except ValueError:
                raise BadRequest(f"not an offset: {position!r}") from None
            return {k: wanted for k in keys}
        found = self.offsets(keys, OffsetSpec.for_timestamp(parse_timestamp(position)))
        return {k: (o if o >= 0 else highs.get(k, 0)) for k, o in found.items()}

    def _consume(self, topic: str, ranges: dict[int, tuple[int, int]], max_bytes: int, limit: int, newest: bool
                 ) -> tuple[list[Message], bool, bool]:
        """The messages of each partition's [begin, stop) window, at most ``limit`` kept - the newest by
        timestamp, or the oldest - so memory stays bounded however many partitions are read."""
        if not ranges:
            return [], False, False
        consumer = Consumer({
            **self.client_config,
            "group.id": f"{CLIENT_ID}-{uuid.uuid4().hex}",  # never joins or commits: assign() only
            "enable.auto.commit": False, "enable.auto.offset.store": False, "enable.partition.eof": True,
            "fetch.wait.max.ms": 100, "queued.max.messages.kbytes": 16384, "fetch.max.bytes": 16 * 1024 * 1024,
            "max.partition.fetch.bytes": 1024 * 1024,
        }, logger=log)
        messages: list[Message] = []
        truncated = timed_out = False
        try:
            consumer.assign([TopicPartition(topic, p, begin) for p, (begin, _) in ranges.items()])
            pending = dict(ranges)
            deadline = time.monotonic() + self.timeout
            while pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                for record in consumer.consume(num_messages=500, timeout=min(remaining, 0.5)):
                    partition = record.partition()
                    if partition not in pending:
                        continue
                    error = record.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            pending.pop(partition, None)
                            continue
                        raise ConsoleError(f"consume {topic}/{partition}: {error.name()}: {error.str()}")
                    offset = record.offset()
                    if offset >= pending[partition][1]:
                        pending.pop(partition, None)
                        continue
                    message = _message(record, max_bytes)
                    truncated |= message.key_size > max_bytes or message.value_size > max_bytes
                    messages.append(message)
                    if len(messages) >= 2 * limit:
                        messages = _keep(messages, limit, newest)
                    if offset >= pending[partition][1] - 1:
                        pending.pop(partition, None)
        except KafkaException as exc:
            raise ConsoleError(f"consume {topic}: {_error_text(exc)}") from None
        finally:
            consumer.close()
        return _keep(messages, limit, newest), truncated, timed_out

    # -- writes ---------------------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int, replication_factor: int,
                     configs: dict[str, str] | None = None) -> None:
        new_topic = NewTopic(name, num_partitions=partitions, replication_factor=replication_factor,
                             config=configs or {})
        futures = self.admin.create_topics([new_topic], operation_timeout=self.timeout, **self._request_kwargs)
        self._result(futures[name], f"create topic {name}")

    def reset_offsets(self, group_id: str, topic: str | None, mode: str, position: str = ""
                      ) -> list[tuple[str, int, int]]:
        """Set a group's committed offsets (Kafka's kafka-consumer-groups.sh --reset-offsets): for every
        partition of ``topic``, or every partition the group has offsets for. An offset outside the
        partition's range is moved to its nearest end, as Kafka's tool does. Returns (topic, partition,
        new offset)."""
        if mode not in RESET_MODES:
            raise BadRequest(f"reset mode must be one of {', '.join(RESET_MODES)}")
        if topic:
            keys = [(topic, p) for p in self.topic_partitions(topic)]
        else:
            committed, errors = self._committed([group_id])
            if group_id in errors:
                raise ConsoleError(f"offsets of group {group_id!r}: {errors[group_id]}")
            keys = sorted({(tp.topic, tp.partition) for tp in committed.get(group_id, [])})
        if not keys:
            raise BadRequest(f"group {group_id!r} has no offsets to reset; choose a topic")
        lows, highs = self.watermarks(keys)
        targets = self._positions(keys, mode, position, lows, highs)
        missing = [k for k in keys if k not in targets or k not in lows or k not in highs]
        if missing:
            raise ConsoleError(f"no offsets known for {', '.join(f'{t}/{p}' for t, p in missing)}")
        new = [(t, p, min(max(targets[(t, p)], lows[(t, p)]), highs[(t, p)])) for t, p in keys]
        request = ConsumerGroupTopicPartitions(group_id, [TopicPartition(t, p, o) for t, p, o in new])
        futures = self.admin.alter_consumer_group_offsets([request], **self._request_kwargs)
        result = self._result(futures[group_id], f"reset offsets of {group_id}")
        errors = [tp.error for tp in result.topic_partitions or [] if tp.error]
        if errors:
            failed = "; ".join(f"{tp.topic}/{tp.partition}: {tp.error.str()}"
                               for tp in result.topic_partitions if tp.error)
            hint = (" (the group has active members: Kafka resets only a group without members)"
                    if any(e.code() == KafkaError.UNKNOWN_MEMBER_ID for e in errors) else "")
            raise ConsoleError(f"reset offsets of {group_id}: {failed}{hint}", 409)
        return new


def _time_order(message: Message) -> tuple[int, int, int]:
    return (message.timestamp or 0, message.offset, message.partition)


def _keep(messages: list[Message], limit: int, newest: bool) -> list[Message]:
    return sorted(messages, key=_time_order, reverse=newest)[:limit]


def _config_item(entry) -> ConfigItem:
    source = entry.source if isinstance(entry.source, ConfigSource) else ConfigSource(entry.source)
    is_default = bool(entry.is_default) or source == ConfigSource.DEFAULT_CONFIG
    return ConfigItem(entry.name, entry.value, is_default, source.name, bool(entry.is_sensitive),
                      bool(entry.is_read_only))


def _message(record, max_bytes: int) -> Message:
    key, value = record.key(), record.value()
    timestamp_type, timestamp = record.timestamp()
    kinds = {1: "CreateTime", 2: "LogAppendTime"}
    headers = [(str(name), data[:max_bytes] if data is not None else None)
               for name, data in (record.headers() or [])[:MAX_HEADERS]]
    return Message(record.topic(), record.partition(), record.offset(),
                   timestamp if timestamp_type in kinds else None, kinds.get(timestamp_type, ""),
                   key[:max_bytes] if key is not None else None, value[:max_bytes] if value is not None else None,
                   len(key) if key is not None else 0, len(value) if value is not None else 0, headers)

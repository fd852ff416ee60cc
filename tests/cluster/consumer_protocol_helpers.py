"""Helpers of the consumer-protocol fault test (test_consumer_protocol_faults.py).

HeartbeatTap   a TCP proxy in front of each broker's client listener: the brokers advertise the proxies' ports
               on that listener (inter-broker traffic keeps its own PLAINTEXT listener), so every connection
               a client makes goes through it. It forwards bytes frame by frame unchanged, remembers each
               request's API key and version by correlation id, and decodes every ConsumerGroupHeartbeat
               (key 68) answer with kio: what the coordinator really told each member, on the wire.
with_client_listener  gives a BrokerCluster's brokers that second listener, advertised at the tap's ports.
Journal        one worker's journal (consumer_protocol_worker.py): records processed, commits acknowledged,
               assignments, revocations, losses.
overlaps       the partitions two members were told they own at one member epoch (must be none).
two_owners     the partitions given to a member while another still held them, in wire order (must be none).
describe_group ConsumerGroupDescribe v0 from the coordinator, decoded.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path

from kio.serial import entity_reader

from broker_process import free_port

HEARTBEAT_KEY = 68


@dataclass(frozen=True)
class HeartbeatAnswer:
    """One ConsumerGroupHeartbeat response as it went to the client."""

    at: float
    broker_id: int
    member_id: str | None
    member_epoch: int
    error_code: int
    assignment: frozenset | None  # {(topic id, partition)}; None: not sent (unchanged)
    asked_member_id: str = ""  # the request's member id and epoch (an error answer names no member)
    asked_epoch: int = 0


@dataclass(frozen=True)
class HeartbeatAsked:
    """One ConsumerGroupHeartbeat request as it went to the broker."""

    at: float
    broker_id: int
    member_id: str
    member_epoch: int
    owned: frozenset | None  # the partitions it says it owns; None: not sent (unchanged)


def _decode_heartbeat(version: int, payload: bytes, kind: str = "response"):
    """A ConsumerGroupHeartbeat request or response frame (without its size) as kio decodes it."""
    module = import_module(f"kio.schema.consumer_group_heartbeat.v{version}.{kind}")
    entity_type = getattr(module, f"ConsumerGroupHeartbeat{kind.capitalize()}")
    _header, size = entity_reader(entity_type.__header_schema__)(payload, 0)
    entity, _ = entity_reader(entity_type)(payload, size)
    return entity


class HeartbeatTap:
    """One proxy port per broker id (``ports``), forwarding to ``upstream[broker_id]``; runs its own event loop
    in a thread. ``answers`` grows as heartbeats are answered; ``errors`` keeps decoding failures."""

    def __init__(self, broker_ids) -> None:
        self.ports = {broker_id: free_port() for broker_id in broker_ids}
        self.upstream: dict[int, int] = {}
        self.answers: list[HeartbeatAnswer] = []
        self.events: list = []  # HeartbeatAsked and HeartbeatAnswer, in the order they passed the tap
        self.errors: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._servers = []
        self._thread = threading.Thread(target=self._loop.run_forever, name="heartbeat-tap", daemon=True)

    def start(self, upstream: dict[int, int]) -> "HeartbeatTap":
        self.upstream = dict(upstream)
        self._thread.start()
        for broker_id, port in self.ports.items():
            server = asyncio.run_coroutine_threadsafe(
                asyncio.start_server(lambda r, w, b=broker_id: self._serve(b, r, w), "127.0.0.1", port),
                self._loop).result(10)
            self._servers.append(server)
        return self

    def close(self) -> None:
        async def shutdown():
            for server in self._servers:
                server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    async def _serve(self, broker_id: int, client_reader, client_writer) -> None:
        try:
            broker_reader, broker_writer = await asyncio.open_connection("127.0.0.1", self.upstream[broker_id])
        except OSError:
            client_writer.close()
            return
        pending: dict[int, tuple[int, int]] = {}
        to_broker = asyncio.ensure_future(self._pump(client_reader, broker_writer,
                                                     self._request_seen(broker_id, pending)))
        to_client = asyncio.ensure_future(self._pump(broker_reader, client_writer,
                                                     self._response_seen(broker_id, pending)))
        try:
            await asyncio.wait([to_broker, to_client], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (to_broker, to_client):
                task.cancel()
            for writer in (client_writer, broker_writer):
                writer.close()

    @staticmethod
    async def _pump(reader, writer, seen) -> None:
        while True:
            try:
                head = await reader.readexactly(4)
                payload = await reader.readexactly(struct.unpack(">i", head)[0])
            except (asyncio.IncompleteReadError, OSError):
                return
            seen(payload)
            writer.write(head + payload)
            try:
                await writer.drain()
            except OSError:
                return

    def _request_seen(self, broker_id: int, pending):
        def seen(payload: bytes) -> None:
            key, version, correlation_id = struct.unpack(">hhi", payload[:8])
            request = None
            if key == HEARTBEAT_KEY:
                try:
                    request = _decode_heartbeat(version, payload, "request")
                except Exception as exc:
                    self.errors.append(f"heartbeat request v{version}: {exc!r}")
                else:
                    owned = None if request.topic_partitions is None else frozenset(
                        (t.topic_id, int(p)) for t in request.topic_partitions for p in t.partitions)
                    self.events.append(HeartbeatAsked(time.time(), broker_id, request.member_id,
                                                      int(request.member_epoch), owned))
            pending[correlation_id] = (key, version, request)
        return seen

    def _response_seen(self, broker_id: int, pending):
        def seen(payload: bytes) -> None:
            (correlation_id,) = struct.unpack(">i", payload[:4])
            key, version, request = pending.pop(correlation_id, (None, None, None))
            if key != HEARTBEAT_KEY:
                return
            try:
                response = _decode_heartbeat(version, payload)
            except Exception as exc:  # the test fails on any: an answer it could not read is not checked
                self.errors.append(f"broker {broker_id} heartbeat v{version}: {exc!r}")
                return
            assignment = None
            if response.assignment is not None:
                assignment = frozenset((t.topic_id, int(p)) for t in response.assignment.topic_partitions
                                       for p in t.partitions)
            answer = HeartbeatAnswer(time.time(), broker_id, response.member_id, int(response.member_epoch),
                                     int(response.error_code), assignment, request.member_id if request else "",
                                     int(request.member_epoch) if request else 0)
            self.answers.append(answer)
            self.events.append(answer)
        return seen


def with_client_listener(cluster, tap: HeartbeatTap) -> dict[int, int]:
    """Give every broker of a BrokerCluster (not started) a CLIENT listener (PLAINTEXT) on a free port,
    advertised at the tap's port for that broker; PLAINTEXT stays the inter-broker listener. Returns broker id
    -> the CLIENT listener's own port (the tap's upstream)."""
    ports = {}
    for broker_id, broker in cluster.brokers.items():
        ports[broker_id] = free_port()
        listeners = f"PLAINTEXT://127.0.0.1:{broker.port},CLIENT://127.0.0.1:{ports[broker_id]}"
        advertised = f"PLAINTEXT://127.0.0.1:{broker.port},CLIENT://127.0.0.1:{tap.ports[broker_id]}"
        command = broker.command
        broker.command = lambda command=command, listeners=listeners, advertised=advertised: [
            *(listeners if arg.startswith("PLAINTEXT://") else arg for arg in command()),
            "--advertised-listeners", advertised]
        broker.overrides.update({"listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CLIENT:PLAINTEXT",
                                 "inter.broker.listener.name": "PLAINTEXT"})
    return ports


def overlaps(answers: list[HeartbeatAnswer]) -> list[str]:
    """Partitions that two members were told they own at the same member epoch. A member's partitions at an
    answer are that answer's assignment or, when it sent none, the last one it was given (the answer then
    says "unchanged"); an error answer grants nothing and a join (epoch 0 sent) starts afresh."""
    owned_at: dict[tuple[int, str], set] = {}  # (member epoch, member id) -> every partition told at it
    current: dict[str, frozenset] = {}
    for answer in answers:
        if answer.error_code != 0 or not answer.member_id or answer.member_epoch <= 0:
            continue
        if answer.assignment is not None:
            current[answer.member_id] = answer.assignment
        owned_at.setdefault((answer.member_epoch, answer.member_id), set()).update(
            current.get(answer.member_id, frozenset()))
    by_epoch: dict[int, list[tuple[str, set]]] = {}
    for (epoch, member_id), partitions in owned_at.items():
        by_epoch.setdefault(epoch, []).append((member_id, partitions))
    found = []
    for epoch, members in sorted(by_epoch.items()):
        for i, (a, pa) in enumerate(members):
            for b, pb in members[i + 1:]:
                if pa & pb:
                    found.append(f"epoch {epoch}: members {a} and {b} both own {sorted(pa & pb)}")
    return found


FENCING_ERRORS = {25, 110}  # UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH: the coordinator no longer has the member


def two_owners(events: list, session_timeout_s: float) -> list[str]:
    """Partitions given to a member while another still held them, as the wire shows it. A member holds what
    the answers gave it until its own heartbeat stops reporting it as owned (or it joins afresh or leaves), it
    is answered UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH, or it was silent for a session timeout (the
    coordinator then removes it: a killed or paused member). A coordinator may give a partition only once
    every other holder is gone in one of these ways (Kafka's revoke-before-assign)."""
    holds: dict[str, set] = {}
    last_asked: dict[str, float] = {}
    found = []

    def expired(member: str, now: float) -> bool:
        return now - last_asked.get(member, now) >= session_timeout_s

    for event in events:
        if isinstance(event, HeartbeatAsked):
            member = event.member_id
            if expired(member, event.at) or event.member_epoch <= 0:
                holds[member] = set()
            if event.owned is not None:
                holds[member] = holds.get(member, set()) & event.owned
            last_asked[member] = event.at
            continue
        member = event.asked_member_id
        if event.error_code in FENCING_ERRORS:
            holds[member] = set()
        if event.error_code or event.assignment is None or event.member_epoch <= 0:
            continue
        for partition in event.assignment - holds.get(member, set()):
            for other, held in holds.items():
                if other != member and partition in held and not expired(other, event.at):
                    found.append(f"{event.at:.3f}: {partition} given to {member} at epoch {event.member_epoch} "
                                 f"by broker {event.broker_id} while {other} holds it (last heartbeat "
                                 f"{event.at - last_asked[other]:.1f} s before)")
        holds[member] = holds.get(member, set()) | event.assignment
    return found


@dataclass
class Journal:
    """A worker's journal, parsed. records: [(t, partition, offset, value)]; commits: [(t, partition, next
    offset)] acknowledged; failures: commit errors; assigned / revoked / lost: [(t, partitions)]."""

    name: str
    records: list = field(default_factory=list)
    commits: list = field(default_factory=list)
    failures: list = field(default_factory=list)
    assigned: list = field(default_factory=list)
    revoked: list = field(default_factory=list)
    lost: list = field(default_factory=list)
    member_ids: set = field(default_factory=set)
    closed: bool = False

    @classmethod
    def read(cls, path: Path) -> "Journal":
        journal = cls(path.stem)
        for line in path.read_text().splitlines():
            kind, at, *rest = line.split(" ", 2)
            text = rest[0] if rest else ""
            t = float(at)
            if kind == "R":
                partition, offset, value = text.split(" ", 2)
                journal.records.append((t, int(partition), int(offset), value))
            elif kind == "C":
                partition, offset = text.split()
                journal.commits.append((t, int(partition), int(offset)))
            elif kind == "F":
                journal.failures.append((t, text))
            elif kind in "AVL":
                parts = set() if text == "-" else {int(p) for p in text.split(",")}
                {"A": journal.assigned, "V": journal.revoked, "L": journal.lost}[kind].append((t, parts))
            elif kind == "M":
                journal.member_ids.add(text)
            elif kind == "X":
                journal.closed = True
        return journal


def commits_honoured(journals: list[Journal]) -> list[str]:
    """A member given a partition starts at or after every commit of it acknowledged before that assignment:
    the first record it processes from the partition after each assignment (before its next revocation or
    loss) has an offset at least the highest committed one. Returns the violations."""
    acked: dict[int, list[tuple[float, int]]] = {}
    for journal in journals:
        for t, partition, offset in journal.commits:
            acked.setdefault(partition, []).append((t, offset))
    found = []
    for journal in journals:
        ends = sorted([t for t, _ in journal.revoked] + [t for t, _ in journal.lost])
        for t_assign, partitions in journal.assigned:
            until = next((t for t in ends if t > t_assign), float("inf"))
            for partition in partitions:
                first = next((offset for t, p, offset, _ in journal.records
                              if p == partition and t_assign < t < until), None)
                committed = max((o for t, o in acked.get(partition, ()) if t < t_assign), default=0)
                if first is not None and first < committed:
                    found.append(f"{journal.name}: partition {partition} assigned at {t_assign:.3f} started at "
                                 f"offset {first}, below the committed {committed}")
    return found


def classify_duplicates(journals: list[Journal], faults: dict[str, list[tuple[float, str]]],
                        resumed: dict[str, list[float]]):
    """Why each record processed more than once was: at-least-once allows a second processing only after an
    earlier one that its member did not commit before the next: it was killed or paused (``faults``: name ->
    [(time.time(), "killed" / "paused")]), lost its partitions or had a commit refused (its journal) in between;
    or the later one is by a member paused past its session that, resumed, still handed out records it had
    fetched before it learnt it was fenced (``resumed``: name -> [time.time() of each SIGCONT]; a zombie: its
    commits are refused). Returns (Counter of causes,
    [unexplained record and its processings])."""
    import collections

    by_record = collections.defaultdict(list)
    for journal in journals:
        for t, p, o, _ in journal.records:
            by_record[(p, o)].append((t, journal))
    causes: collections.Counter = collections.Counter()
    unexplained = []
    for (p, o), processings in by_record.items():
        if len(processings) < 2:
            continue
        processings.sort(key=lambda item: item[0])
        for i, (t, journal) in enumerate(processings[:-1]):
            later = processings[i + 1:]
            until = later[0][0]
            committed = any(cp == p and co > o and t < ct < until for ct, cp, co in journal.commits)
            fault = next((kind for ft, kind in faults.get(journal.name, ()) if t < ft < until), None)
            if committed:
                cause = "zombie" if all(_zombie(j, t2, resumed) for t2, j in later) else None
            elif fault is not None:
                cause = f"{fault} before its commit"
            elif any(t < lt < until and p in parts for lt, parts in journal.lost):
                cause = "partitions lost before its commit"
            elif any(t < ft < until for ft, _ in journal.failures):
                cause = "commit refused"
            else:
                cause = None
            if cause is None:
                unexplained.append(((p, o), [(f"{t2:.3f}", j.name) for t2, j in processings]))
                break
            causes[cause] += 1
    return causes, unexplained


def _zombie(journal: Journal, t: float, resumed: dict[str, list[float]]) -> bool:
    """The journal's member processed at t after one of its pauses and before it learnt it lost its partitions."""
    for at in resumed.get(journal.name, ()):
        lost = min((lt for lt, _ in journal.lost if lt >= at), default=float("inf"))
        if at <= t <= lost:
            return True
    return False


def describe_group(address: tuple[str, int], group: str):
    """ConsumerGroupDescribe v0 of one group from the broker at address: the decoded group entry."""
    from broker_process import send_request
    from kio.schema.consumer_group_describe.v0.request import ConsumerGroupDescribeRequest

    answer = send_request(address, ConsumerGroupDescribeRequest(group_ids=(group,),
                                                                include_authorized_operations=False), timeout=5)
    return answer.groups[0]

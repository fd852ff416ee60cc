"""How fast a consumer group settles after one member joins, and how many partitions the join moves: the classic
protocol (eager and cooperative) against the consumer group protocol of KIP-848, side by side.

    python3 integration/bench/rebalance_bench.py            # both brokers, N = 10 and 50, 3 joins each
    python3 integration/bench/rebalance_bench.py --target pykbroker --members 10 --repeats 2
    python3 integration/bench/rebalance_bench.py --protocols eager-range,consumer-uniform

Rows (``--protocols``; consumer settings, everything else librdkafka's defaults):
  eager-range          classic, ``partition.assignment.strategy=range`` (eager: every member revokes everything)
  eager-roundrobin     classic, ``roundrobin`` (not run by default)
  cooperative-sticky   classic, ``cooperative-sticky`` (incremental, two rebalances per change)
  consumer-uniform     ``group.protocol=consumer``, ``group.remote.assignor=uniform`` (server-side assignment)
  consumer-range       ``group.protocol=consumer``, ``group.remote.assignor=range``
The classic rows run on pykbroker and on Apache Kafka 3.7.1 from the reference kit; the consumer rows on
pykbroker only: the kit has no Kafka 4 (3.7.1 has KIP-848 only as an early-access preview), so the run prints
them as not measured on Kafka.

One broker per target for the whole run, one topic of ``--partitions`` partitions (default 100). Per protocol and
N: a new group of N members (confluent-kafka consumers, ``--per-process`` of them per worker process, each on its
own thread calling ``poll(0.1)``, so that the client side is not the bottleneck), settled; then ``--repeats``
times: a random wait of up to one heartbeat interval (after a settle the members' heartbeats are in step, and the
join must not always fall at the same phase of them), one more member joins from a worker process of its own,
the group settles, the clock is read, and the newcomer closes (the group settles again, unmeasured).

Settled, the same definition for every protocol: the members' assignments as their rebalance callbacks give them
(``on_assign`` adds its partitions, ``on_revoke`` / ``on_lost`` remove theirs: eager callbacks carry the whole
assignment, incremental ones only the change, and the same arithmetic reads both) cover every partition of the
topic exactly once, every member expected holds one, their sizes differ by at most one (every assignor here
balances a single topic), no callback has changed an assignment for ``--quiet`` seconds (default 6: longer than
the classic heartbeat interval, 3 s, and the consumer protocol's, 5 s, so a rebalance still under way shows
itself), and the broker agrees: the admin client's describe of the group says Stable, with that many members and
the same assignments. The **settle time** is from the newcomer's ``subscribe()`` to the last callback that
changed an assignment (the quiet window is not counted). **Moved**: partitions whose owner after the join differs
from their owner before it (revoked from one member, given to another). **Revoked**: every partition in a revoke
callback between the join and the settle (eager revokes everything, also what it gives back to the same member).

Broker settings, the same on both: ``group.initial.rebalance.delay.ms=3000`` (Kafka's default; it delays only the
first join of an empty group, i.e. the set-up, never the measured join). The consumer protocol's heartbeat
interval and session timeout are the broker's (pykbroker's defaults are Kafka 4's: 5 s and 45 s); the classic
ones the client's (librdkafka: ``heartbeat.interval.ms=3000``, ``session.timeout.ms=45000``). Auto-commit is off
(the topic is empty); nothing else is set.
``--heartbeat-ms MS`` sets both protocols' heartbeat interval to MS (the classic members' ``heartbeat.interval.ms``,
pykbroker's ``group.consumer.heartbeat.interval.ms`` and its minimum): every protocol here waits for heartbeats, so
this separates the protocols' own cost from their heartbeat intervals.

Prints a Markdown table (median and range over the repeats) and one JSON line; ``--json PATH`` writes the JSON.
Not a test: nothing asserts a time; exit 1 only when a broker failed or a group never settled. Run it on a quiet
machine: the members' heartbeats, the broker and the coordinator share the cores.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import random
import signal
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from brokers import BrokerFailed, BrokerProcess, KafkaBroker, kafka_unavailable_reason  # noqa: E402
from report import KAFKA, PYKBROKER, format_number  # noqa: E402

TOPIC = "rebalance-bench"
# The same on both brokers (Kafka's default, explicit): it only delays the first join of an empty group.
BROKER_SETTINGS = {"group.initial.rebalance.delay.ms": "3000"}
# The heartbeat intervals when --heartbeat-ms is not given: librdkafka's heartbeat.interval.ms (classic) and the
# broker's group.consumer.heartbeat.interval.ms (consumer; pykbroker's default, Kafka 4's).
CLASSIC_HEARTBEAT_MS, CONSUMER_HEARTBEAT_MS = 3000, 5000
NO_KAFKA_4 = ("Kafka 4 is not in ../shared/refkit (3.7.1 has KIP-848 only as an early-access preview): the "
              "consumer protocol is measured on pykbroker only")


@dataclass(frozen=True)
class Protocol:
    label: str
    config: dict
    targets: tuple[str, ...]


PROTOCOLS = {
    "eager-range": Protocol("classic eager (range)", {"partition.assignment.strategy": "range"},
                            (PYKBROKER, KAFKA)),
    "eager-roundrobin": Protocol("classic eager (roundrobin)", {"partition.assignment.strategy": "roundrobin"},
                                 (PYKBROKER, KAFKA)),
    "cooperative-sticky": Protocol("classic cooperative-sticky",
                                   {"partition.assignment.strategy": "cooperative-sticky"}, (PYKBROKER, KAFKA)),
    "consumer-uniform": Protocol("consumer (uniform)", {"group.protocol": "consumer",
                                                        "group.remote.assignor": "uniform"}, (PYKBROKER,)),
    "consumer-range": Protocol("consumer (range)", {"group.protocol": "consumer", "group.remote.assignor": "range"},
                               (PYKBROKER,)),
}
DEFAULT_PROTOCOLS = "eager-range,cooperative-sticky,consumer-uniform,consumer-range"


# --- worker processes: members on threads, their callbacks sent to the parent ---------------------------------

def _run_member(name: str, config: dict, bootstrap: str, events, stop: threading.Event) -> None:
    from confluent_kafka import Consumer

    def callback(kind: str):
        def report(consumer, partitions) -> None:
            events.put(("callback", name, kind, [p.partition for p in partitions], time.monotonic()))
        return report

    def error(err) -> None:
        events.put(("error", name, str(err), None, time.monotonic()))

    try:
        consumer = Consumer({"bootstrap.servers": bootstrap, "enable.auto.commit": False, "error_cb": error, **config})
        events.put(("joining", name, None, None, time.monotonic()))
        consumer.subscribe([TOPIC], on_assign=callback("assign"), on_revoke=callback("revoke"),
                           on_lost=callback("lost"))
        while not stop.is_set():
            consumer.poll(0.1)
        consumer.close()
    except Exception as exc:  # reported to the parent, which stops the row
        events.put(("failed", name, f"{type(exc).__name__}: {exc}", None, time.monotonic()))
    events.put(("closed", name, None, None, time.monotonic()))


def worker_main(commands, events, bootstrap: str) -> None:
    """A worker process: ("add", name, config) starts a member, ("close", name) closes it, ("stop",) closes all."""
    members: dict[str, tuple[threading.Thread, threading.Event]] = {}
    while True:
        command = commands.get()
        if command[0] == "add":
            stop = threading.Event()
            thread = threading.Thread(target=_run_member, args=(command[1], command[2], bootstrap, events, stop),
                                      daemon=True)
            members[command[1]] = (thread, stop)
            thread.start()
        elif command[0] == "close":
            thread, stop = members.pop(command[1])
            stop.set()
        else:
            for _, stop in members.values():
                stop.set()
            for thread, _ in members.values():
                thread.join(60)
            return


# --- the parent: the members' assignments from their callbacks, and the settle --------------------------------

class NotSettled(RuntimeError):
    pass


@dataclass
class Group:
    """The members of one group across worker processes, and their assignments as the callbacks tell them."""

    group_id: str
    partitions: int
    events: object
    assignments: dict[str, set[int]] = field(default_factory=dict)
    last_change: float = 0.0
    first_change: float | None = None  # the first assignment change since the counters were reset
    revoked: int = 0
    lost: int = 0
    joined_at: dict[str, float] = field(default_factory=dict)
    closed: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def drain(self, timeout: float) -> None:
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            self._apply(*event)
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return

    def _apply(self, kind: str, name: str, what, partitions, at: float) -> None:
        if kind == "joining":
            self.joined_at[name] = at
            self.assignments.setdefault(name, set())
        elif kind == "closed":
            self.closed.add(name)
        elif kind == "error":  # librdkafka's error_cb: mostly transient, kept for the timeout's message
            self.errors.append(f"{name}: {what}")
        elif kind == "failed":
            self.failures.append(f"{name}: {what}")
        elif partitions:
            owned = self.assignments.setdefault(name, set())
            if what == "assign":
                owned.update(partitions)
            else:
                owned.difference_update(partitions)
                self.revoked += len(partitions)
                self.lost += len(partitions) if what == "lost" else 0
            self.last_change = max(self.last_change, at)
            self.first_change = at if self.first_change is None else min(self.first_change, at)

    def owners(self) -> dict[int, str]:
        return {p: name for name, owned in self.assignments.items() for p in owned}

    def complete(self, members: set[str]) -> bool:
        """Every expected member assigned, every partition exactly once, sizes within one of each other."""
        if set(self.assignments) != members:
            return False
        sizes = [len(owned) for owned in self.assignments.values()]
        covered = set().union(*self.assignments.values())
        return (sum(sizes) == self.partitions and len(covered) == self.partitions and min(sizes) >= 1
                and max(sizes) - min(sizes) <= 1)

    def broker_agrees(self, admin, members: set[str]) -> bool:
        from confluent_kafka import ConsumerGroupState, KafkaException

        try:
            description = admin.describe_consumer_groups([self.group_id], request_timeout=10)[self.group_id].result()
        except KafkaException:
            return False
        described = sorted(sorted(tp.partition for tp in m.assignment.topic_partitions) for m in description.members)
        ours = sorted(sorted(self.assignments[name]) for name in members)
        return description.state == ConsumerGroupState.STABLE and described == ours

    def wait_settled(self, admin, members: set[str], quiet: float, timeout: float) -> float:
        """Wait until the group is settled (module docstring); return the time of its last assignment change."""
        deadline = time.monotonic() + timeout
        while True:
            self.drain(0.1)
            if self.failures:
                raise NotSettled(f"a member failed: {self.failures[0]}")
            now = time.monotonic()
            if (self.complete(members) and now - self.last_change >= quiet
                    and self.broker_agrees(admin, members)):
                return self.last_change
            if now > deadline:
                sizes = {name: len(self.assignments.get(name, ())) for name in sorted(members)}
                raise NotSettled(f"not settled after {timeout:.0f} s: assignment sizes {sizes}, "
                                 f"last errors {self.errors[-3:]}")


def measure(bootstrap: str, protocol: Protocol, n: int, args, admin) -> dict:
    """One protocol, one N: a settled group of N, then ``args.repeats`` joins of one more member."""
    ctx = multiprocessing.get_context("spawn")
    events = ctx.Queue()
    group = Group(f"rebalance-bench-{uuid.uuid4().hex[:8]}", args.partitions, events)
    config = {"group.id": group.group_id, **protocol.config}
    if args.heartbeat_ms and protocol.config.get("group.protocol") != "consumer":
        config["heartbeat.interval.ms"] = args.heartbeat_ms  # the consumer protocol's is the broker's
    workers, commands = [], []
    for _ in range(-(-n // args.per_process) + 1):  # the last one hosts the newcomers
        command_queue = ctx.Queue()
        process = ctx.Process(target=worker_main, args=(command_queue, events, bootstrap), daemon=True)
        process.start()
        workers.append(process)
        commands.append(command_queue)
    members = {f"m{i:02d}" for i in range(n)}
    runs: list[dict] = []
    failure = None
    try:
        for i, name in enumerate(sorted(members)):
            commands[i // args.per_process].put(("add", name, config))
        group.wait_settled(admin, members, args.quiet, args.timeout)
        consumer = protocol.config.get("group.protocol") == "consumer"
        heartbeat_s = (args.heartbeat_ms or (CONSUMER_HEARTBEAT_MS if consumer else CLASSIC_HEARTBEAT_MS)) / 1000
        for repeat in range(args.repeats):
            # The members' heartbeats are in step after a settle (they all got their assignment at once), and a
            # join right after the quiet window would always fall at the same phase of them: wait a random part
            # of one heartbeat interval first, so that the join falls anywhere in it, as it would in real life.
            jitter = random.uniform(0, heartbeat_s)
            end = time.monotonic() + jitter
            while time.monotonic() < end:
                group.drain(min(0.1, max(0.0, end - time.monotonic())))
            before = group.owners()
            group.revoked = group.lost = 0
            group.first_change = None
            newcomer = f"new{repeat}"
            commands[-1].put(("add", newcomer, config))
            settled_at = group.wait_settled(admin, members | {newcomer}, args.quiet, args.timeout)
            after = group.owners()
            joined_at = group.joined_at[newcomer]
            runs.append({"settle_s": round(settled_at - joined_at, 4),
                         "first_change_s": round(group.first_change - joined_at, 4),
                         "moved": sum(1 for p, owner in after.items() if before.get(p) != owner),
                         "revoked": group.revoked, "lost": group.lost, "jitter_s": round(jitter, 3)})
            print(f"  {protocol.label}, N={n}, join {repeat + 1}: settled in {runs[-1]['settle_s']:.2f} s, "
                  f"{runs[-1]['moved']} moved, {runs[-1]['revoked']} revoked", flush=True)
            commands[-1].put(("close", newcomer))
            deadline = time.monotonic() + args.timeout
            while newcomer not in group.closed and time.monotonic() < deadline:
                group.drain(0.1)
            group.assignments.pop(newcomer, None)
            group.wait_settled(admin, members, args.quiet, args.timeout)
    except NotSettled as exc:
        failure = str(exc)
        print(f"  {protocol.label}, N={n}: {failure}", flush=True)
    finally:
        for command_queue in commands:
            command_queue.put(("stop",))
        for process in workers:
            process.join(90)
            if process.is_alive():
                process.kill()
                process.join()
    return {"runs": runs, "failure": failure}


def summary(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    median = statistics.median(values)
    text = f"{median:.{digits}f}" if digits else format_number(median)
    if len(values) > 1:
        low, high = min(values), max(values)
        text += f" ({low:.{digits}f}-{high:.{digits}f})" if digits else f" ({low:.0f}-{high:.0f})"
    return text


def table(rows: list[dict], repeats: int) -> str:
    lines = ["| protocol | broker | N | settle s, median (range) | first change s | partitions moved "
             "| partitions revoked | joins |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        runs = row["runs"]
        if row.get("skipped"):
            lines.append(f"| {row['protocol']} | {row['broker']} | {row['members']} | not measured: "
                         f"{row['skipped']} | | | | |")
            continue
        lines.append(f"| {row['protocol']} | {row['broker']} | {row['members']} "
                     f"| {summary([r['settle_s'] for r in runs], 2)} "
                     f"| {summary([r['first_change_s'] for r in runs], 2)} "
                     f"| {summary([r['moved'] for r in runs], 0)} "
                     f"| {summary([r['revoked'] for r in runs], 0)} | {len(runs)}/{repeats}"
                     f"{' (' + row['failure'][:60] + ')' if row['failure'] else ''} |")
    return "\n".join(lines)


def broker_settings(target: str, heartbeat_ms: int | None) -> dict[str, str]:
    """BROKER_SETTINGS, and with --heartbeat-ms pykbroker's consumer-protocol heartbeat interval (its minimum,
    5000 by default, lowered with it; Kafka 3.7.1 runs no consumer protocol here)."""
    settings = dict(BROKER_SETTINGS)
    if heartbeat_ms and target == PYKBROKER:
        settings["group.consumer.min.heartbeat.interval.ms"] = str(min(heartbeat_ms, 5000))
        settings["group.consumer.heartbeat.interval.ms"] = str(heartbeat_ms)
    return settings


def make_broker(target: str, settings: dict[str, str]) -> BrokerProcess:
    if target == KAFKA:
        return KafkaBroker(extra_args=[f"{k}={v}" for k, v in settings.items()])
    return BrokerProcess(extra_args=[a for k, v in settings.items() for a in ("--override", f"{k}={v}")])


def run_target(target: str, protocols: list[str], args) -> list[dict]:
    from confluent_kafka.admin import AdminClient, NewTopic

    rows = []
    with make_broker(target, broker_settings(target, args.heartbeat_ms)) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, args.partitions, 1)])[TOPIC].result(60)
        try:
            measure_all(target, broker, admin, protocols, args, rows)
        finally:
            del admin  # before the broker stops: its client would log the lost connection
    return rows


def measure_all(target: str, broker: BrokerProcess, admin, protocols: list[str], args, rows: list[dict]) -> None:
    for n in args.members:
        for key in protocols:
            protocol = PROTOCOLS[key]
            if target not in protocol.targets:
                rows.append({"protocol": protocol.label, "broker": target, "members": n, "runs": [],
                             "failure": None, "skipped": "Kafka 4 is not in ../shared/refkit"})
                continue
            print(f"{target}: {protocol.label}, N={n}", flush=True)
            result = measure(broker.bootstrap, protocol, n, args, admin)
            broker.check_alive()
            rows.append({"protocol": protocol.label, "broker": target, "members": n, **result})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", choices=("both", PYKBROKER, KAFKA), default="both")
    parser.add_argument("--members", default="10,50", help="group sizes N before the join, comma-separated")
    parser.add_argument("--protocols", default=DEFAULT_PROTOCOLS, help=f"any of {', '.join(PROTOCOLS)}")
    parser.add_argument("--repeats", type=int, default=3, help="joins measured per protocol, broker and N")
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--per-process", type=int, default=10, help="members per worker process")
    parser.add_argument("--quiet", type=float, default=6.0, help="seconds without an assignment change (settled)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a group may take to settle")
    parser.add_argument("--heartbeat-ms", type=int, help="heartbeat interval of both protocols (classic: the "
                        "client's heartbeat.interval.ms; consumer: pykbroker's group.consumer.heartbeat.interval.ms)"
                        "; default: each one's own (3000 and 5000)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    args.members = [int(n) for n in args.members.split(",")]
    protocols = [p.strip() for p in args.protocols.split(",")]
    unknown = [p for p in protocols if p not in PROTOCOLS]
    if unknown:
        parser.error(f"unknown protocol {unknown[0]!r}: choose from {', '.join(PROTOCOLS)}")
    if max(args.members) + 1 > args.partitions:
        parser.error("--partitions must be more than the largest N")
    targets = [PYKBROKER, KAFKA] if args.target == "both" else [args.target]
    # A SIGTERM unwinds like Ctrl-C: the worker processes and the broker are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load = os.getloadavg()[0]
    rows, skipped, broken = [], {}, False
    for target in targets:
        if target == KAFKA:
            reason = kafka_unavailable_reason(KafkaBroker().refkit)
            if reason:
                skipped[KAFKA] = reason
                print(f"kafka skipped: {reason}")
                continue
        try:
            rows += run_target(target, protocols, args)
        except BrokerFailed as exc:
            broken = True
            print(f"{target} failed: {exc}")
    print()
    print(table(rows, args.repeats))
    print()
    print(f"{NO_KAFKA_4}. Started {started}, load average {load:.2f} on {os.cpu_count()} cores; topic of "
          f"{args.partitions} partitions; broker: " + ", ".join(f"{k}={v}" for k, v in BROKER_SETTINGS.items())
          + (f"; heartbeat interval {args.heartbeat_ms} ms for both protocols (classic: the client's "
             "heartbeat.interval.ms; consumer: pykbroker's group.consumer.heartbeat.interval.ms and its min)"
             if args.heartbeat_ms else
             "; classic heartbeat.interval.ms=3000 / session.timeout.ms=45000 (librdkafka's defaults), consumer "
             "protocol: the broker's group.consumer.heartbeat.interval.ms=5000 / session.timeout.ms=45000 "
             "(pykbroker's defaults, Kafka 4's)")
          + f"; settled = {args.quiet:g} s without an assignment change and the "
          "broker describing the group Stable with the same assignments (not counted in the time).")
    result = {"started": started, "load_average": load, "cpus": os.cpu_count(), "partitions": args.partitions,
              "repeats": args.repeats, "quiet_s": args.quiet, "per_process": args.per_process,
              "broker_settings": {t: broker_settings(t, args.heartbeat_ms) for t in targets},
              "heartbeat_ms": args.heartbeat_ms, "skipped": skipped, "note": NO_KAFKA_4, "rows": rows,
              "command": " ".join(sys.argv)}
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 1 if broken or any(row.get("failure") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

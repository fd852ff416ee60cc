"""The consumer group protocol (KIP-848) under faults, on a 3-broker cluster on a real ZooKeeper.

A topic of 12 partitions (RF 3, ``__consumer_offsets`` RF 3) gets numbered records from an idempotent acks=all
producer all along; 6 confluent-kafka consumers with ``group.protocol=consumer``, each its own process
(consumer_protocol_worker.py: journal a record, then commit it), join, leave (SIGTERM: close()), are SIGKILLed
and SIGSTOPped past the session timeout (then SIGCONTed), on a seeded schedule; midway the group's coordinator
broker is SIGKILLed, and started again a few seconds later. Then:

* every acknowledged record was processed by some consumer; committed offsets are honoured (a member given a
  partition never starts below a commit acknowledged before); a record processed twice was first processed by
  a member that, before the second time, was killed, paused, lost its partitions or had a commit refused
  (STALE_MEMBER_EPOCH when a heartbeat answer bumping its epoch crossed the commit, as in Kafka 4.0), or the
  second time by a resumed member that had not yet learnt it was fenced (at-least-once: nothing else may
  read twice);
* each member paused past its session is told UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH when it comes back,
  and the tap saw answers from the coordinators before and after the failover;
* no partition is owned by two members at one member epoch, nor given to a member while another still holds
  it (until the holder's heartbeat stops reporting it, it is fenced, or it was silent a session timeout),
  checked on the ConsumerGroupHeartbeat requests and answers themselves: the clients reach the brokers only
  through a proxy (consumer_protocol_helpers.HeartbeatTap) that the brokers advertise, which decodes every
  request and answer of API key 68 as it passes. The proxy
  sees exactly what each client was told (the broker's own log would show what it meant to send, librdkafka's
  debug log what a client made of it); the brokers' inter-broker traffic bypasses it on its own listener;
* once the last fault is over the group settles (ConsumerGroupDescribe from the coordinator: Stable, every
  live member at the assignment epoch = the group epoch, the 12 partitions each assigned once) within
  SETTLE_BOUND_S: a member SIGKILLed just before is fenced after the session timeout (6 s), the group epoch
  goes up, and the others reconcile in a revoke-then-assign round of a few heartbeats (1 s interval: k = 4),
  plus 10 s for a loaded 2-core machine (librdkafka's reconnect backoff, a metadata refresh of 2 s, the
  revocation callback's commit).

Seed: PYKBROKER_FAULT_SEED (default below); the schedule is printed and quoted in every failure, so the run
replays. Run: python3 -m pytest -q tests/cluster/test_consumer_protocol_faults.py
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker_cluster import BrokerCluster, wait_threads
from broker_process import ProtocolError, _die_with_parent, wait_until
from consumer_protocol_helpers import (
    HeartbeatTap, Journal, classify_duplicates, commits_honoured, describe_group, overlaps, two_owners,
    with_client_listener,
)
from test_replication_faults import OVERRIDES
from workload import SeqProducer

UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH = 25, 110
SEED = int(os.environ.get("PYKBROKER_FAULT_SEED", "8"))
PARTITIONS = 12
CONSUMERS = 6
SESSION_TIMEOUT_S = 6.0
HEARTBEAT_INTERVAL_S = 1.0
SETTLE_BOUND_S = SESSION_TIMEOUT_S + 4 * HEARTBEAT_INTERVAL_S + 10.0
FAULTS_S = 50.0  # the schedule's span
GROUP_OVERRIDES = {
    **OVERRIDES,
    "group.consumer.session.timeout.ms": int(SESSION_TIMEOUT_S * 1000),
    "group.consumer.min.session.timeout.ms": int(SESSION_TIMEOUT_S * 1000),
    "group.consumer.heartbeat.interval.ms": int(HEARTBEAT_INTERVAL_S * 1000),
    "group.consumer.min.heartbeat.interval.ms": int(HEARTBEAT_INTERVAL_S * 1000),
}
WORKER = Path(__file__).with_name("consumer_protocol_worker.py")

pytestmark = pytest.mark.timeout(360)


def schedule(rng: random.Random) -> list[tuple[float, str]]:
    """(second, action) in time order: 3 kills and 2 leaves (each followed by a newcomer 1-3 s later), 3
    pauses of the session timeout + 2-4 s, the coordinator killed once (started again 6-10 s later)."""
    events = []
    for kind in ("kill", "kill", "kill", "leave", "leave"):
        at = rng.uniform(3, FAULTS_S - 8)
        events += [(at, kind), (at + rng.uniform(1, 3), "join")]
    for _ in range(3):
        at = rng.uniform(3, FAULTS_S - 12)
        events += [(at, "pause"), (at + SESSION_TIMEOUT_S + rng.uniform(2, 4), "resume")]
    at = rng.uniform(12, FAULTS_S - 15)
    events += [(at, "kill-coordinator"), (at + rng.uniform(6, 10), "restart-coordinator")]
    return sorted(events)


class Workers:
    """The consumer processes: started, signalled and, at the end, all gone (SIGCONT + SIGKILL)."""

    def __init__(self, root: Path, bootstrap: str, topic: str, group: str) -> None:
        self.root, self.args = root, [bootstrap, topic, group]
        self.processes: dict[str, subprocess.Popen] = {}
        self.fate: dict[str, str] = {}  # name -> killed / left
        self.paused: list[str] = []  # SIGSTOPped now, in the order they were
        self.resumed: dict[str, list[float]] = {}  # name -> time.time() of each SIGCONT
        self.faults: dict[str, list] = {}  # name -> [(time.time(), "killed" / "paused")]

    def start(self) -> str:
        name = f"w{len(self.processes)}"
        self.processes[name] = subprocess.Popen(
            [sys.executable, str(WORKER), *self.args, str(self.root / f"{name}.journal")],
            stdout=subprocess.DEVNULL, stderr=open(self.root / f"{name}.stderr", "w"), preexec_fn=_die_with_parent)
        return name

    def running(self) -> list[str]:
        return [n for n, p in self.processes.items() if p.poll() is None and n not in self.fate]

    def signal(self, name: str, sig: int) -> None:
        os.kill(self.processes[name].pid, sig)

    def journals(self) -> list[Journal]:
        return [Journal.read(self.root / f"{name}.journal") for name in self.processes
                if (self.root / f"{name}.journal").exists()]

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
            process.wait(10)


def test_consumer_group_under_member_and_coordinator_faults(zk_connect, tmp_path):
    rng = random.Random(f"{SEED}-consumer-protocol-faults")
    events = schedule(rng)
    report = [f"seed {SEED} (PYKBROKER_FAULT_SEED), schedule: " + ", ".join(f"{t:.1f}s {a}" for t, a in events)]
    print(report[0])
    tap = HeartbeatTap([1, 2, 3])
    cluster = BrokerCluster(zk_connect, tmp_path, n=3, overrides=GROUP_OVERRIDES)
    upstream = with_client_listener(cluster, tap)
    tap.start(upstream)
    topic, group = f"cgfaults-{os.urandom(4).hex()}", f"cgfaults-{os.urandom(4).hex()}"
    bootstrap = ",".join(f"127.0.0.1:{port}" for port in tap.ports.values())
    workers = Workers(tmp_path, bootstrap, topic, group)
    producer = None
    try:
        cluster.start()
        cluster.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
        producer = SeqProducer(cluster.bootstrap, topic, list(range(PARTITIONS)), "p", rate=150)
        producer.start()
        for _ in range(CONSUMERS):
            workers.start()
        start = time.monotonic()
        for at, action in events:
            wait_until(lambda: time.monotonic() - start >= at, f"{action} at {at:.1f} s", at + 60)
            began = time.monotonic()
            report.append(_apply(action, rng, cluster, workers, group, tap))
            start += time.monotonic() - began  # the schedule's clock stops while an action runs: gaps are kept
        faults_over = time.monotonic()
        settled, last = _settle(cluster, workers, group, faults_over)
        report.append(f"settled {settled:.1f} s after the last fault (bound {SETTLE_BOUND_S:.0f} s): {last}")
        producer.stop()
        assert not producer.bad_errors() and producer.unflushed == 0, producer.report()
        acked = {(r.partition, r.offset) for r in producer.acked}

        def consumed():
            seen = {(p, o) for j in workers.journals() for _, p, o, _ in j.records}
            return acked <= seen

        wait_until(consumed, "every acknowledged record processed", 60)
        running = workers.running()
        for name in running:
            workers.signal(name, signal.SIGTERM)
        for name in running:
            assert workers.processes[name].wait(30) == 0, f"{name} did not close cleanly\n" + "\n".join(report)
    finally:
        if producer is not None:
            producer.close()
        workers.close()
        tap.close()
        cluster.close()

    journals = workers.journals()
    text = "\n".join(report)
    processed = collections.Counter((p, o) for j in journals for _, p, o, _ in j.records)
    assert acked <= set(processed), f"records never processed: {sorted(acked - set(processed))[:20]}\n{text}"
    assert not tap.errors, f"{tap.errors[:5]}\n{text}"
    assert len(tap.answers) > 100, f"only {len(tap.answers)} heartbeat answers seen\n{text}"
    coordinators = collections.Counter(a.broker_id for a in tap.answers)
    errors = collections.Counter(a.error_code for a in tap.answers if a.error_code)
    report.append(f"heartbeat answers by broker {dict(coordinators)}, error answers by code {dict(errors)}")
    text = "\n".join(report)
    assert len(coordinators) >= 2, f"the tap saw no answer from the coordinator after the failover\n{text}"
    for name, resumed in [(n, at) for n, ats in workers.resumed.items() for at in ats]:
        ids = next(j.member_ids for j in journals if j.name == name)  # the pause outlasted the session: fenced
        until = min((t for t, kind in workers.faults[name] if t > resumed), default=float("inf"))
        told = {a.error_code for a in tap.answers if a.asked_member_id in ids and resumed < a.at < until}
        assert told & {UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH}, f"{name} ({ids}) not fenced after its pause: " \
                                                                f"{told}\n{text}"
    assert overlaps(tap.answers) == [], f"{overlaps(tap.answers)[:10]}\n{text}"
    assert two_owners(tap.events, SESSION_TIMEOUT_S) == [], f"{two_owners(tap.events, SESSION_TIMEOUT_S)[:10]}\n{text}"
    assert commits_honoured(journals) == [], f"{commits_honoured(journals)[:10]}\n{text}"
    faults = {n: [(t, kind) for t, kind in events if kind] for n, events in workers.faults.items()}
    causes, unexplained = classify_duplicates(journals, faults, workers.resumed)
    assert not unexplained, f"records processed twice with no fault to explain it: {unexplained[:10]}\n{text}"
    duplicates = sum(count - 1 for count in processed.values())
    assert settled <= SETTLE_BOUND_S, text
    print("\n".join(report))
    print(f"records acknowledged {len(acked)}, processed {sum(processed.values())} ({len(processed)} distinct), "
          f"duplicates {duplicates} ({dict(causes)}), heartbeat answers {len(tap.answers)}, settled in {settled:.1f} s")


def _apply(action: str, rng: random.Random, cluster, workers: Workers, group: str, tap: HeartbeatTap) -> str:
    """Do one scheduled action; returns what was done, for the report."""
    at = time.strftime("%H:%M:%S")
    if action == "join":
        return f"{at} join: {workers.start()} started"
    if action == "resume":
        name = workers.paused.pop(0)
        workers.resumed.setdefault(name, []).append(time.time())  # before: it processes as soon as it runs
        workers.signal(name, signal.SIGCONT)
        return f"{at} resume: {name} SIGCONT"
    if action == "restart-coordinator":
        broker_id = next(i for i, b in cluster.brokers.items() if not b.is_running())
        cluster.start_broker(broker_id)
        return f"{at} restart-coordinator: broker {broker_id} started again"
    if action == "kill-coordinator":
        coordinator = cluster.find_coordinator(group)
        cluster.kill(coordinator)
        wait_until(lambda: _coordinator(cluster, group) not in (None, coordinator),
                   f"a coordinator for {group} other than broker {coordinator}", 60)
        return f"{at} kill-coordinator: broker {coordinator} SIGKILLed, now {_coordinator(cluster, group)}"
    candidates = [n for n in workers.running() if n not in workers.paused]
    if action == "pause":  # a member, so that the pause makes it miss its session
        candidates = [n for n in candidates if _is_member(workers, n, tap)]
    if not candidates:
        return f"{at} {action}: skipped, no running member"
    name = rng.choice(candidates)
    workers.faults.setdefault(name, []).append((time.time(), {"kill": "killed", "pause": "paused"}.get(action)))
    if action == "kill":
        workers.fate[name] = "killed"
        workers.signal(name, signal.SIGKILL)
    elif action == "leave":
        workers.fate[name] = "left"
        workers.signal(name, signal.SIGTERM)
    else:  # pause: the member stays (it runs again after resume) but misses its session
        workers.paused.append(name)
        workers.signal(name, signal.SIGSTOP)
        wait_threads(workers.processes[name].pid, stopped=True)
    return f"{at} {action}: {name}"


def _is_member(workers: Workers, name: str, tap: HeartbeatTap) -> bool:
    """The worker's last heartbeat answer accepted it at an epoch above 0."""
    path = workers.root / f"{name}.journal"
    ids = Journal.read(path).member_ids if path.exists() else set()
    last = [a for a in list(tap.answers) if a.asked_member_id in ids]
    return bool(last) and last[-1].error_code == 0 and last[-1].member_epoch > 0


def _coordinator(cluster, group: str):
    try:
        return cluster.find_coordinator(group)
    except (AssertionError, OSError, ProtocolError):  # no coordinator yet, or the asked broker is down
        return None


def _settle(cluster, workers: Workers, group: str, since: float) -> tuple[float, str]:
    """Wait until ConsumerGroupDescribe says the group settled (see the module doc); (seconds since `since`,
    the last description). Gives up after twice the bound, so a failure shows how far it got."""
    last = ["no answer"]

    def settled() -> bool:
        coordinator = _coordinator(cluster, group)
        if coordinator is None:
            return False
        try:
            described = describe_group(cluster.brokers[coordinator].address, group)
        except (OSError, ProtocolError) as exc:
            last[0] = repr(exc)
            return False
        members = described.members
        owned = [(t.topic_id, p) for m in members for t in m.assignment.topic_partitions for p in t.partitions]
        last[0] = (f"state {described.group_state}, group epoch {described.group_epoch}, assignment epoch "
                   f"{described.assignment_epoch}, member epochs {sorted(m.member_epoch for m in members)}, "
                   f"{len(owned)} partitions owned, {len(workers.running())} workers running")
        return (described.error_code == 0 and described.group_state == "Stable"
                and described.group_epoch == described.assignment_epoch
                and len(members) == len(workers.running())
                and all(m.member_epoch == described.assignment_epoch for m in members)
                and len(owned) == len(set(owned)) == PARTITIONS)

    try:
        wait_until(settled, "the group to settle", 2 * SETTLE_BOUND_S)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {last[0]}") from None
    return time.monotonic() - since, last[0]

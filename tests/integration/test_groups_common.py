"""The consumer-group scenarios of the issue, written once for every client, and what they share.

Each client module (test_groups_<client>.py) supplies a ``GroupClient``: how to create a topic, produce
values, start a group member and start a member in another process (to kill it with SIGKILL: a member
that dies, not one that leaves). Members record what they owned, read and committed (``MemberLog``); the
scenarios check those records:

* two members split a 4-partition topic; one leaves and the other gets everything, resuming at the
  leaver's commits (nothing is read twice);
* a member dies; the session timeout evicts it and the other gets everything;
* committed offsets are resumed by a new member after a broker kill -9 and restart;
* a second group reads everything independently;
* two members join at the same moment and a third joins while that rebalance is in progress, then a
  fourth and a fifth the same way: every partition ends with exactly one owner, every message is read,
  and committed offsets never go back (a message may be read twice across a rebalance, as Kafka allows:
  a fenced member can still hand out records it fetched, but the coordinator refuses its commits).

test_groups_scenarios.py runs them with every client; no tests here."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from kio.schema.describe_groups.v0.request import DescribeGroupsRequest

import broker_process
from broker_process import BrokerProcess, _compress_ranges, send_request

PARTITIONS = 4
ALL = frozenset(range(PARTITIONS))
TIMEOUT_S = 40
# Rebalances start at once (Kafka's default waits 3 s for more members), and members may use session
# timeouts of a few seconds so a dead one is noticed quickly (Kafka's minimum is 6 s).
BROKER_CONFIG = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 1000}
# For the join-during-a-rebalance scenario: an initial delay keeps the first rebalance open long enough
# to join it for sure.
SLOW_FIRST_REBALANCE = {**BROKER_CONFIG, "group.initial.rebalance.delay.ms": 1500}
SESSION_TIMEOUT_MS = 3000
HEARTBEAT_INTERVAL_MS = 250

_order = itertools.count()  # one sequence for the events of every member: what happened before what


def wait_until(condition, what: str, timeout: float = TIMEOUT_S) -> None:
    broker_process.wait_until(condition, what, timeout)


class MemberLog:
    """What one member owned, read and committed, written by its consumer's thread, read by the test."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.owned: set[int] = set()
        self.revocations: list[set[int]] = []
        self.records: list[tuple[int, int, str, int]] = []  # partition, offset, value, order
        self.commits: list[tuple[int, int, int]] = []  # partition, committed offset, order (successes only)
        self.errors: list = []

    def assigned(self, partitions) -> None:
        with self.lock:
            self.owned |= set(partitions)

    def revoked(self, partitions) -> None:
        with self.lock:
            revoked = set(partitions)
            self.revocations.append(revoked)
            self.owned -= revoked

    def read(self, partition: int, offset: int, value: str) -> None:
        with self.lock:
            self.records.append((partition, offset, value, next(_order)))

    def committed(self, partition: int, offset: int) -> None:
        with self.lock:
            self.commits.append((partition, offset, next(_order)))

    def partitions(self) -> set[int]:
        with self.lock:
            return set(self.owned)

    def values(self) -> list[str]:
        with self.lock:
            return [r[2] for r in self.records]

    def all_reads_committed(self) -> bool:
        """Every partition read has a successful commit past the last message read from it."""
        with self.lock:
            last_read: dict[int, int] = {}
            for partition, offset, _, _ in self.records:
                last_read[partition] = max(last_read.get(partition, -1), offset)
            committed: dict[int, int] = {}
            for partition, offset, _ in self.commits:
                committed[partition] = max(committed.get(partition, 0), offset)
        return all(committed.get(partition, 0) > offset for partition, offset in last_read.items())


class Member(Protocol):
    """A running group member: its ``MemberLog`` plus a clean close (commit, LeaveGroup)."""

    name: str
    records: list
    commits: list
    errors: list

    def partitions(self) -> set[int]: ...

    def values(self) -> list[str]: ...

    def all_reads_committed(self) -> bool: ...

    def stop(self) -> None: ...


class Victim(Protocol):
    """A member in another process, reporting its assignment; ``kill`` is a crash."""

    def partitions(self) -> set[int]: ...

    def kill(self) -> None: ...


@dataclass
class GroupClient:
    """One client library, as the scenarios use it. ``member(bootstrap, group, topic, name, commit_each)``
    starts a subscribed member (auto-commit, or a synchronous commit after each message). The client's
    admin API, where it has one, looks at two groups while their members run (``admin_view``) and after
    they closed (``admin_after``)."""

    create_topic: Callable[[str, str], None]
    produce_values: Callable[[str, str, list[str]], None]
    member: Callable[..., Member]
    victim: Callable[[str, str, str], Victim]
    admin_view: Callable[[BrokerProcess, str, tuple[str, str]], None] | None = None
    admin_after: Callable[[BrokerProcess, str, tuple[str, str]], None] | None = None


def one_owner_each(*members: MemberLog) -> bool:
    """Every partition owned by exactly one of the members."""
    owned = [member.partitions() for member in members]
    return sum(map(len, owned)) == PARTITIONS and set().union(*owned) == ALL


def split_among(*members: MemberLog) -> bool:
    """Every partition owned by exactly one of the members, and each member owns some."""
    return one_owner_each(*members) and all(member.partitions() for member in members)


def assert_commits_never_go_back(members: list[MemberLog]) -> None:
    """Kafka's fencing guarantee as the members can see it: once the coordinator has acknowledged a commit of
    offset N for a partition, it accepts no commit below N for that partition afterwards.

    Why that holds: the coordinator accepts a commit only from a current member naming the current
    generation (else UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION, or REBALANCE_IN_PROGRESS while the group waits
    for its SyncGroup), a generation gives each partition to one member, and that member starts from the
    committed offset it fetches after its generation began. A member evicted, or left behind by the next
    generation, may still hand out records it had already fetched (at-least-once: a message read again by
    another member is allowed), but its commits must be refused; if one were accepted, or two members owned
    a partition in one generation, the committed offset would go back. (The members commit a record only
    in the generation it was delivered in, as a poll-driven consumer does: see the aiokafka member.)

    Members here commit N right after reading offset N-1 (``commit_each``), so that read is a moment before
    the commit was sent. A commit counts as "afterwards" only if that read came after the other commit's
    acknowledgement: a commit merely acknowledged late is not mistaken for one sent late."""
    acknowledged = []  # (acknowledged at, partition, offset, member)
    sent = []  # (sent after, partition, offset, member)
    for member in members:
        with member.lock:
            records, commits = list(member.records), list(member.commits)
        for partition, offset, acked_at in commits:
            acknowledged.append((acked_at, partition, offset, member))
            reads = [order for p, o, _, order in records if p == partition and o == offset - 1 and order < acked_at]
            if reads:
                sent.append((max(reads), partition, offset, member))
    for sent_after, partition, offset, member in sent:
        earlier = [(o, m.name) for acked_at, p, o, m in acknowledged if p == partition and acked_at < sent_after and o > offset]
        if earlier:
            highest, by = max(earlier)
            raise AssertionError(f"partition {partition}: {member.name}'s commit of offset {offset} was accepted after "
                                 f"{by}'s commit of {highest}\n{partition_history(members, partition)}")


def partition_history(members: list[MemberLog], partition: int) -> str:
    """What the members read and committed of one partition, in order, one line per stretch of one
    member's activity: for the message of a failed check."""
    events = []
    for member in members:
        with member.lock:
            events += [(order, member.name, "read", offset) for p, offset, _, order in member.records if p == partition]
            events += [(order, member.name, "committed", offset) for p, offset, order in member.commits if p == partition]
    stretches: list[tuple[str, dict[str, list[int]]]] = []
    for _, name, what, offset in sorted(events):
        if not stretches or stretches[-1][0] != name:
            stretches.append((name, {"read": [], "committed": []}))
        stretches[-1][1][what].append(offset)
    return "\n".join(f"  {name}: " + ", ".join(f"{what} {_compress_ranges(offsets)}" for what, offsets in done.items() if offsets)
                     for name, done in stretches)


def group_state(address: tuple[str, int], group: str) -> str:
    """The group's state as DescribeGroups tells it (any client's admin would ask the same)."""
    return send_request(address, DescribeGroupsRequest(groups=(group,))).groups[0].group_state


def stop_all(*members: Member) -> None:
    """Close every member (even after a failure), then require that none saw an error."""
    for member in members:
        member.stop()
    for member in members:
        assert not member.errors, f"{member.name}: {member.errors}"


# -- the scenarios ---------------------------------------------------------------------------------------------


def split_then_leave(client: GroupClient, broker: BrokerProcess, topic: str) -> None:
    client.create_topic(broker.bootstrap, topic)
    group = f"{topic}-g"
    a = client.member(broker.bootstrap, group, topic, "a")
    b = client.member(broker.bootstrap, group, topic, "b")
    try:
        wait_until(lambda: split_among(a, b), "a and b to split the partitions")
        first = [f"first-{i}" for i in range(40)]
        client.produce_values(broker.bootstrap, topic, first)
        wait_until(lambda: sorted(a.values() + b.values()) == sorted(first), "the first batch, read once")
        assert {r[0] for r in a.records} <= a.partitions() and {r[0] for r in b.records} <= b.partitions()
        b.stop()  # a clean close: commit, then LeaveGroup
        wait_until(lambda: a.partitions() == ALL, "a to own every partition")
        second = [f"second-{i}" for i in range(40)]
        client.produce_values(broker.bootstrap, topic, second)
        wait_until(lambda: set(second) <= set(a.values()), "a to read the second batch")
        # b committed what it read when it closed: a resumed there and read nothing twice.
        assert sorted(a.values() + b.values()) == sorted(first + second)
    finally:
        stop_all(a, b)


def member_dies(client: GroupClient, broker: BrokerProcess, topic: str) -> None:
    client.create_topic(broker.bootstrap, topic)
    group = f"{topic}-g"
    a = client.member(broker.bootstrap, group, topic, "a")
    victim = None
    try:
        wait_until(lambda: a.partitions() == ALL, "a to own every partition first")
        victim = client.victim(broker.bootstrap, group, topic)
        wait_until(lambda: victim.partitions() and a.partitions() and a.partitions().isdisjoint(victim.partitions())
                   and a.partitions() | victim.partitions() == ALL, "the second member to take its share")
        victim.kill()  # no LeaveGroup: only the session timeout can tell
        wait_until(lambda: a.partitions() == ALL, "a to get every partition back after the session timeout")
        after = [f"after-{i}" for i in range(20)]
        client.produce_values(broker.bootstrap, topic, after)
        wait_until(lambda: set(after) <= set(a.values()), "a to read everything")
    finally:
        if victim is not None:
            victim.kill()
        stop_all(a)


def offsets_resumed_after_broker_kill(client: GroupClient, broker: BrokerProcess, topic: str) -> None:
    client.create_topic(broker.bootstrap, topic)
    group = f"{topic}-g"
    first = [f"first-{i}" for i in range(30)]
    client.produce_values(broker.bootstrap, topic, first)
    reader = client.member(broker.bootstrap, group, topic, "reader", commit_each=True)
    try:
        wait_until(lambda: sorted(reader.values()) == sorted(first) and reader.all_reads_committed(),
                   "every message read and committed")
    finally:
        stop_all(reader)
    broker.restart(kill=True)
    second = [f"second-{i}" for i in range(20)]
    client.produce_values(broker.bootstrap, topic, second)
    successor = client.member(broker.bootstrap, group, topic, "successor")
    try:
        wait_until(lambda: len(successor.values()) >= len(second), "the successor to read the new messages")
        time.sleep(0.5)  # anything before the committed offsets would arrive with the rest
        assert sorted(successor.values()) == sorted(second)
    finally:
        stop_all(successor)


def second_group_reads_everything(client: GroupClient, broker: BrokerProcess, topic: str) -> None:
    """Two groups of one member each both read every message; the client's admin API sees both."""
    client.create_topic(broker.bootstrap, topic)
    values = [f"v-{i}" for i in range(40)]
    client.produce_values(broker.bootstrap, topic, values)
    groups = (f"{topic}-one", f"{topic}-two")
    one = client.member(broker.bootstrap, groups[0], topic, "one")
    two = client.member(broker.bootstrap, groups[1], topic, "two")
    try:
        wait_until(lambda: len(one.values()) == len(two.values()) == len(values), "both groups to read all")
        assert sorted(one.values()) == sorted(two.values()) == sorted(values)
        if client.admin_view is not None:
            client.admin_view(broker, topic, groups)
    finally:
        stop_all(one, two)
    if client.admin_after is not None:
        client.admin_after(broker, topic, groups)


def joins_during_a_rebalance(client: GroupClient, broker: BrokerProcess, topic: str) -> None:
    """a and b join at the same moment and c joins that first rebalance; once they settle, d joins and e
    joins while d's rebalance is in progress. Messages flow the whole time, each committed after it is read.
    Run on a broker with SLOW_FIRST_REBALANCE.

    Nothing here depends on how fast the members are: on a loaded machine a member may miss its session
    timeout, be evicted and rejoin under a new id, and deliver records it fetched before it learned of
    that; the checks are what Kafka guarantees whatever the timing (one owner per partition once the group
    settles, every message read, committed offsets never going back). A rebalance that ends before the
    test saw it (a poll of the group state can take longer than a fast rebalance) counts as seen: the next
    member then joins a Stable group, which starts a rebalance of its own."""
    client.create_topic(broker.bootstrap, topic)
    group = f"{topic}-g"
    values = [f"v-{i}" for i in range(200)]
    members = []

    def join(name: str) -> None:
        members.append(client.member(broker.bootstrap, group, topic, name, commit_each=True))

    def rebalancing_or_done() -> bool:
        return (group_state(broker.address, group) in ("PreparingRebalance", "CompletingRebalance")
                or split_among(*members))

    try:
        join("a")
        join("b")
        wait_until(rebalancing_or_done, "the first rebalance")
        join("c")
        client.produce_values(broker.bootstrap, topic, values[:100])
        wait_until(lambda: one_owner_each(*members) and group_state(broker.address, group) == "Stable",
                   "a, b and c to settle")
        join("d")
        wait_until(rebalancing_or_done, "d's rebalance")
        join("e")
        for i in range(100, len(values), 20):
            client.produce_values(broker.bootstrap, topic, values[i:i + 20])
        wait_until(lambda: one_owner_each(*members), "every partition to have exactly one owner")
        wait_until(lambda: {v for m in members for v in m.values()} == set(values), "every message to be read")
        assert_commits_never_go_back(members)
    finally:
        stop_all(*members)


# -- members in another process ---------------------------------------------------------------------------------


class MemberProcess:
    """A group member in its own process (``python SCRIPT member ARGS...``) that prints its assignment as a
    JSON list after every change (``print_assignment``)."""

    def __init__(self, script: str, *args: str) -> None:
        # The member imports broker_process, which imports pykbroker: from this checkout, installed or not.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(broker_process.REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen([sys.executable, script, "member", *args], stdout=subprocess.PIPE, text=True,
                                        cwd=os.path.dirname(os.path.abspath(script)), env=env)
        self.reports: list[list[int]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.reports.append(json.loads(line))

    def partitions(self) -> set[int]:
        return set(self.reports[-1]) if self.reports else set()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(TIMEOUT_S)


def print_assignment(owned) -> None:
    """How a member process reports (see MemberProcess)."""
    print(json.dumps(sorted(owned)), flush=True)

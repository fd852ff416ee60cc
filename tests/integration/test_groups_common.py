"""What the per-client consumer-group tests (test_groups_<client>.py) share: the broker settings, a record of
what each member owned, read and committed, the checks made on those records, and a group member run as a
separate process so that a test can kill it with SIGKILL (a member that dies, not one that leaves).

No tests here: the checks are used by the client modules."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time

PARTITIONS = 4
ALL = frozenset(range(PARTITIONS))
TIMEOUT_S = 40
# Rebalances start at once (Kafka's default waits 3 s for more members), and members may use session
# timeouts of a few seconds so a dead one is noticed quickly (Kafka's minimum is 6 s).
BROKER_CONFIG = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 1000}
SESSION_TIMEOUT_MS = 3000
HEARTBEAT_INTERVAL_MS = 250

_order = itertools.count()  # one sequence for the events of every member: what happened before what


def wait_until(condition, what: str, timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


async def wait_for(condition, what: str, timeout: float = TIMEOUT_S) -> None:
    """``wait_until`` for tests whose clients run on an asyncio loop."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


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


def one_owner_each(*logs: MemberLog) -> bool:
    """Every partition owned by exactly one of the members."""
    owned = [log.partitions() for log in logs]
    return sum(map(len, owned)) == PARTITIONS and set().union(*owned) == ALL


def split_among(*logs: MemberLog) -> bool:
    """Every partition owned by exactly one of the members, and each member owns some."""
    return one_owner_each(*logs) and all(log.partitions() for log in logs)


def assert_no_message_read_twice_between_commits(logs: list[MemberLog]) -> None:
    """A message read by two members is allowed only if the first had not committed past it before the
    second read it (at-least-once); otherwise two members owned the partition at the same time."""
    first_reader: dict[tuple[int, int], tuple[MemberLog, int]] = {}
    for log in logs:
        for partition, offset, _, order in log.records:
            earlier = first_reader.get((partition, offset))
            if earlier is None or order < earlier[1]:
                first_reader[(partition, offset)] = (log, order)
    for log in logs:
        for partition, offset, value, order in log.records:
            first, first_order = first_reader[(partition, offset)]
            if first is log:
                continue
            covered = [c for c in first.commits if c[0] == partition and c[1] > offset and first_order < c[2] < order]
            assert not covered, (f"{value} read by {first.name}, committed up to {covered[0][1]}, then read again "
                                 f"by {log.name}")


class MemberProcess:
    """A group member in its own process (``python SCRIPT member ARGS...``) that prints its assignment as a
    JSON list after every change; ``kill`` is a crash: no LeaveGroup, only the session timeout tells."""

    def __init__(self, script: str, *args: str) -> None:
        self.process = subprocess.Popen([sys.executable, script, "member", *args], stdout=subprocess.PIPE, text=True,
                                        cwd=os.path.dirname(os.path.abspath(script)))
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

"""The ``uniform`` assignor (Kafka 4's default server-side assignor): balance first, then stickiness.

A member keeps, of its current target assignment, the partitions of topics it still subscribes to (that exist,
and that no member before it in member-id order claimed: a target assignment never gives a partition twice);
then, depending on the group's subscriptions:

**Homogeneous** (every member subscribed to the same existing topics; Kafka's UniformHomogeneousAssignmentBuilder
with its KAFKA-18688 stability rule). With P partitions and M members every member ends with ``P // M`` or one
more; the ``P % M`` larger shares go first to members that already hold more than ``P // M`` (in member order),
the rest to the others in member order. A member holding more than its share keeps its lowest partitions (topics
in topic-id order) and gives up the rest. The free partitions (never assigned, of the topics in topic-id order,
ascending; then the given-up ones, in member order) fill the members up to their shares, in member order. So a
balanced group that gains a member moves only what the newcomer gets, and one that loses a member moves only the
leaver's partitions.

**Heterogeneous** (Kafka's UniformHeterogeneousAssignmentBuilder, KAFKA-17710). Members are numbered in member
order. Topics are taken by partitions per subscriber (descending), then by subscriber count (ascending), then by
topic id; each topic's free partitions (ascending) go to its least loaded subscribers, a level at a time. Then,
topic by topic in the same order, partitions move from the topic's most loaded subscribers that own some of it
(their highest partition numbers first) to its least loaded subscribers until their totals differ by at most one,
repeated until a whole round over the topics moves nothing (at most 16 rounds). Every topic's subscribers end
within one partition of each other where the topic's partitions allow it; overlapping subscriptions can leave a
larger spread across topics, as in Kafka.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Mapping

from pykbroker.groups import assignors as _api

# Kafka's bound on the heterogeneous balancing rounds: each round roughly halves the imbalance.
MAX_BALANCE_ROUNDS = 16


class UniformAssignor(_api.CheckedAssignor):
    name = "uniform"

    def assign_partitions(
        self, group: _api.GroupSpec, counts: Mapping[_api.TopicId, int]
    ) -> dict[str, _api.Assignment]:
        member_ids = _api.sorted_member_ids(group)
        if not member_ids:
            return {}
        subscriptions = [_api.effective_subscription(group.members[m], counts) for m in member_ids]
        if all(s == subscriptions[0] for s in subscriptions):
            return _assign_homogeneous(group, member_ids, subscriptions[0], counts)
        return _HeterogeneousBuilder(group, member_ids, subscriptions, counts).build()


def _assign_homogeneous(
    group: _api.GroupSpec, member_ids: list[str], subscribed: frozenset, counts: Mapping[_api.TopicId, int]
) -> dict[str, _api.Assignment]:
    if not subscribed:
        return {m: {} for m in member_ids}
    topic_order = sorted(subscribed, key=_api.topic_id_key)
    owners = {t: [-1] * counts[t] for t in topic_order}  # -1: free, else the claiming member's index

    # Each member's valid current partitions, in topic-id then partition order (first claim wins).
    held: list[list[tuple[_api.TopicId, int]]] = []
    for index, member_id in enumerate(member_ids):
        assigned = group.members[member_id].assigned
        mine = []
        for topic_id in topic_order:
            current = assigned.get(topic_id)
            if current:
                claimed = owners[topic_id]
                for p in _api.valid_owned(current, counts[topic_id], claimed):
                    claimed[p] = index
                    mine.append((topic_id, p))
        held.append(mine)

    total = sum(counts[t] for t in topic_order)
    min_quota, extra = divmod(total, len(member_ids))
    quotas = []
    for mine in held:  # the larger shares go to the members already holding more than the minimum
        if len(mine) > min_quota and extra > 0:
            quotas.append(min_quota + 1)
            extra -= 1
        else:
            quotas.append(min_quota)
    for i, mine in enumerate(held):  # then to the others, in member order
        if extra == 0:
            break
        if len(mine) <= min_quota:
            quotas[i] += 1
            extra -= 1

    free = [(t, p) for t in topic_order for p, owner in enumerate(owners[t]) if owner < 0]
    result: dict[str, _api.Assignment] = {}
    kept_lists = []
    for mine, quota in zip(held, quotas):
        kept_lists.append(mine[:quota])
        free.extend(mine[quota:])
    next_free = 0
    for member_id, kept, quota, mine in zip(member_ids, kept_lists, quotas, held):
        missing = quota - len(kept)
        if missing == 0 and len(kept) == len(mine):
            result[member_id] = _unchanged(group.members[member_id].assigned, kept)
            continue
        partitions = kept + free[next_free:next_free + missing]
        next_free += missing
        result[member_id] = _group_by_topic(partitions)
    if next_free < len(free):
        raise _api.PartitionAssignorError("partitions were left unassigned")
    return result


def _group_by_topic(partitions) -> _api.Assignment:
    by_topic: dict[_api.TopicId, set[int]] = {}
    for topic_id, p in partitions:
        by_topic.setdefault(topic_id, set()).add(p)
    return {t: frozenset(ps) for t, ps in by_topic.items()}


def _unchanged(assigned: Mapping, kept) -> _api.Assignment:
    """A member's assignment when it keeps all its valid partitions and gets nothing: its input where that
    input was already exactly that (no copy), otherwise the kept partitions."""
    if len(kept) == sum(len(ps) for ps in assigned.values()):
        return {t: ps if isinstance(ps, frozenset) else frozenset(ps) for t, ps in assigned.items() if ps}
    return _group_by_topic(kept)


class _HeterogeneousBuilder:
    def __init__(self, group, member_ids, subscriptions, counts):
        self.group = group
        self.member_ids = member_ids
        self.counts = counts
        self.subscribers: dict[_api.TopicId, list[int]] = {}
        for index, subscribed in enumerate(subscriptions):
            for topic_id in subscribed:
                self.subscribers.setdefault(topic_id, []).append(index)
        self.subscriptions = subscriptions
        self.loads = [0] * len(member_ids)
        self.owners = {t: [-1] * counts[t] for t in self.subscribers}
        self.assignment: list[dict[_api.TopicId, set[int]]] = [{} for _ in member_ids]

    def topic_sort_key(self, topic_id):
        n, s = self.counts[topic_id], len(self.subscribers[topic_id])
        return (-Fraction(n, s), s, _api.topic_id_key(topic_id))

    def build(self) -> dict[str, _api.Assignment]:
        self.keep_subscribed()
        order = sorted(self.subscribers, key=self.topic_sort_key)
        balancer = _LoadBalancer(self.loads)
        for topic_id in order:
            free = [p for p, owner in enumerate(self.owners[topic_id]) if owner < 0]
            if free:
                balancer.reset(self.subscribers[topic_id])
                for p in free:
                    self.move(topic_id, p, balancer.next_least_loaded())
        self.balance([t for t in order if len(self.subscribers[t]) >= 2], balancer)
        return {
            m: {t: frozenset(ps) for t, ps in self.assignment[i].items() if ps} for i, m in enumerate(self.member_ids)
        }

    def keep_subscribed(self):
        for index, member_id in enumerate(self.member_ids):
            assigned = self.group.members[member_id].assigned
            for topic_id in sorted(self.subscriptions[index], key=_api.topic_id_key):
                current = assigned.get(topic_id)
                if current:
                    owners = self.owners[topic_id]
                    kept = _api.valid_owned(current, self.counts[topic_id], owners)
                    for p in kept:
                        owners[p] = index
                    if kept:
                        self.assignment[index][topic_id] = set(kept)
                        self.loads[index] += len(kept)

    def move(self, topic_id, p, to):
        owners = self.owners[topic_id]
        old = owners[p]
        if old >= 0:
            partitions = self.assignment[old][topic_id]
            partitions.discard(p)
            self.loads[old] -= 1
        owners[p] = to
        self.assignment[to].setdefault(topic_id, set()).add(p)
        self.loads[to] += 1

    def balance(self, order, balancer):
        last_moved = -1  # the index of the last topic that moved something: a round back to it moved nothing
        for _ in range(MAX_BALANCE_ROUNDS):
            for i, topic_id in enumerate(order):
                if i == last_moved:
                    return
                if self.balance_topic(topic_id, balancer) or last_moved == -1:
                    last_moved = i

    def balance_topic(self, topic_id, balancer) -> int:
        if balancer.reset(self.subscribers[topic_id]) <= 1:
            return 0
        by_owner: dict[int, list[int]] = {}
        for p, owner in enumerate(self.owners[topic_id]):
            by_owner.setdefault(owner, []).append(p)
        moved = 0
        while not balancer.balanced():
            while True:
                donor = balancer.next_most_loaded()
                if donor < 0 or by_owner.get(donor):
                    break
                balancer.exclude_last_most_loaded()
            if donor < 0:
                break
            p = by_owner[donor].pop()
            receiver = balancer.next_least_loaded()
            if balancer.balanced():
                break
            self.move(topic_id, p, receiver)
            moved += 1
        return moved


class _LoadBalancer:
    """Picks the members of one topic's subscribers to give partitions to (least loaded first, a level at a time,
    in (load, member) order) and to take them from (most loaded first), as Kafka's MemberAssignmentBalancer:
    the least loaded range [0, least_end) grows rightwards and the most loaded range [most_start, most_end)
    leftwards; the topic is balanced once the two ranges' levels differ by at most one."""

    def __init__(self, loads: list[int]):
        self.loads = loads
        self.members: list[int] = []

    def reset(self, members: list[int]) -> int:
        loads = self.loads
        self.members = ordered = sorted(members, key=lambda m: (loads[m], m))
        n = len(ordered)
        self.least_end, self.least_level, self.least_next = 0, loads[ordered[0]] - 1, 0
        self.most_start, self.most_end, self.most_level, self.most_next = n, n, loads[ordered[-1]] + 1, n - 1
        return loads[ordered[-1]] - loads[ordered[0]]

    def next_least_loaded(self) -> int:
        members, loads = self.members, self.loads
        if self.least_next >= self.least_end:
            self.least_level += 1
            while self.least_end < len(members) and loads[members[self.least_end]] == self.least_level:
                self.least_end += 1
            self.least_next = 0
        member = members[self.least_next]
        self.least_next += 1
        return member

    def next_most_loaded(self) -> int:
        members, loads = self.members, self.loads
        if self.most_next < self.most_start:
            if self.most_end <= self.most_start and self.most_start > 0:
                # The range emptied by exclusions: restart it at the next member down.
                self.most_level = loads[members[self.most_start - 1]]
            else:
                self.most_level -= 1
            while self.most_start > 0 and loads[members[self.most_start - 1]] == self.most_level:
                self.most_start -= 1
            self.most_next = self.most_end - 1
        if self.most_next < 0:
            return -1
        member = members[self.most_next]
        self.most_next -= 1
        return member

    def exclude_last_most_loaded(self) -> None:
        """Drops the member ``next_most_loaded`` just returned (it has nothing of the topic to give)."""
        members = self.members
        i, j = self.most_next + 1, self.most_end - 1
        members[i], members[j] = members[j], members[i]
        self.most_end -= 1

    def balanced(self) -> bool:
        return self.most_level - self.least_level <= 1

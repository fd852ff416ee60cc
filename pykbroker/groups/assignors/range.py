"""The ``range`` assignor, as Kafka 4's server-side RangeAssignor (KAFKA-16944).

Members are put in one order: static members first, by ``group.instance.id``, then the others by member id
(Java's String order). For every topic, its subscribers take, in that order, contiguous ranges of
``partitions // subscribers`` partitions, the first ``partitions % subscribers`` of them one more. Members
subscribed to the same topics therefore get the same partition numbers of every topic with the same partition
count (co-partitioning, what joins of keyed streams need).

Stickiness is what Kafka 4's gives, no more: the assignment is recomputed from the member order each time and the
current assignment is not read, so equal inputs give equal outputs and a static member coming back under a new
member id with the same instance id gets its old partitions again; a dynamic member joining or leaving shifts the
ranges of the members after it.
"""

from __future__ import annotations

from typing import Mapping

from pykbroker.groups import assignors as _api


def _member_order_key(member_id: str, member: _api.MemberSubscription) -> tuple:
    if member.instance_id is not None:
        return (0, _api.java_string_key(member.instance_id), _api.java_string_key(member_id))
    return (1, _api.java_string_key(member_id))


class RangeAssignor(_api.CheckedAssignor):
    name = "range"

    def assign_partitions(self, group: _api.GroupSpec, counts: Mapping[_api.TopicId, int]) -> dict[str, _api.Assignment]:
        order = sorted(group.members, key=lambda m: _member_order_key(m, group.members[m]))
        subscriptions = {m: _api.effective_subscription(group.members[m], counts) for m in order}

        subscribers: dict[_api.TopicId, int] = {}
        for subscribed in subscriptions.values():
            for topic_id in subscribed:
                subscribers[topic_id] = subscribers.get(topic_id, 0) + 1
        # topic id -> [next range start, min quota, members still to get an extra partition]
        cursors = {t: [0, *divmod(counts[t], n)] for t, n in subscribers.items()}

        result: dict[str, _api.Assignment] = {}
        for member_id in order:
            assignment: _api.Assignment = {}
            for topic_id in subscriptions[member_id]:
                cursor = cursors[topic_id]
                start, quota = cursor[0], cursor[1]
                if cursor[2] > 0:
                    quota += 1
                    cursor[2] -= 1
                end = min(start + quota, counts[topic_id])
                cursor[0] = end
                if start < end:
                    assignment[topic_id] = frozenset(range(start, end))
            result[member_id] = assignment
        return result

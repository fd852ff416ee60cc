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

    def assign_partitions(
        self, group: _api.GroupSpec, counts: Mapping[_api.TopicId, int]
    ) -> dict[str, _api.Assignment]:
        order = sorted(group.members, key=lambda m: _member_order_key(m, group.members[m]))
        subscribers: dict[_api.TopicId, list[str]] = {}
        for member_id in order:
            for topic_id in _api.effective_subscription(group.members[member_id], counts):
                subscribers.setdefault(topic_id, []).append(member_id)

        result: dict[str, _api.Assignment] = {m: {} for m in order}
        for topic_id, members in subscribers.items():
            num_partitions = counts[topic_id]
            quota, extra = divmod(num_partitions, len(members))
            start = 0
            for i, member_id in enumerate(members):
                if start >= num_partitions:
                    break  # the members after get nothing of this topic
                end = start + quota + (1 if i < extra else 0)
                result[member_id][topic_id] = frozenset(range(start, end))
                start = end
        return result

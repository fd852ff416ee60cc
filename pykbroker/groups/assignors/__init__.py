"""Server-side partition assignors of the consumer group protocol (KIP-848), as Kafka 4's group coordinator has
them (``org.apache.kafka.coordinator.group.assignor``): pure functions from a group's members (subscriptions and
current target assignments) and the subscribed topics' metadata to a new target assignment. No I/O, no clock.

- ``uniform`` (the default, ``uniform.py``): balanced and sticky; a homogeneous group (every member subscribed to
  the same topics) gets counts that differ by at most one, a heterogeneous group is balanced topic by topic as
  Kafka's heterogeneous builder balances it.
- ``range`` (``range.py``): per topic, contiguous ranges of partitions in member order (static members first,
  by instance id), which co-partitions topics with equal partition counts.

Kafka's ``group.consumer.assignors`` lists the assignors a broker offers, the first being the default; a member
picks one with ``group.remote.assignor`` (unknown names answer UNSUPPORTED_ASSIGNOR, which the coordinator maps
from :class:`UnknownAssignorError`).

Differences from Kafka's interfaces, on purpose: a member subscribed to a topic missing from ``topics`` (deleted,
or not created yet) is assigned nothing of it instead of failing the whole assignment (Kafka's coordinator only
hands its assignors topics that exist); every member appears in the result, with an empty dict when it gets
nothing; members are ordered by member id (Java's String order) wherever Kafka uses its map's iteration order, so
equal inputs always give equal outputs.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol

TopicId = uuid.UUID
Assignment = dict[TopicId, frozenset[int]]


@dataclass(frozen=True)
class MemberSubscription:
    subscribed_topic_ids: frozenset[TopicId]
    # The member's current TARGET assignment: what the assignor keeps where balance allows (stickiness input).
    assigned: Mapping[TopicId, frozenset[int]]
    rack_id: str | None = None
    instance_id: str | None = None


@dataclass(frozen=True)
class GroupSpec:
    members: Mapping[str, MemberSubscription]  # member id -> subscription


@dataclass(frozen=True)
class TopicMetadata:
    name: str
    num_partitions: int


class PartitionAssignorError(Exception):
    """Kafka's PartitionAssignorException: the assignor cannot compute an assignment from this input."""


class UnknownAssignorError(KeyError):
    """No assignor of that name (the coordinator answers UNSUPPORTED_ASSIGNOR)."""


class PartitionAssignor(Protocol):
    name: str

    def assign(self, group: GroupSpec, topics: Mapping[TopicId, TopicMetadata]) -> dict[str, Assignment]: ...


class CheckedAssignor:
    """The assignors' common entry: the topics' metadata checked once, then the assignor's own rules on the
    partition counts (``assign_partitions``)."""

    name: str

    def assign(self, group: GroupSpec, topics: Mapping[TopicId, TopicMetadata]) -> dict[str, Assignment]:
        return self.assign_partitions(group, partition_counts(topics))

    def assign_partitions(self, group: GroupSpec, counts: Mapping[TopicId, int]) -> dict[str, Assignment]:
        raise NotImplementedError


# --- helpers shared by the assignors -------------------------------------------------------------------------


def java_string_key(s: str) -> bytes:
    """Sort key giving Java's ``String.compareTo`` order (UTF-16 code units), which Kafka sorts member ids and
    instance ids by; it differs from Python's code point order only for characters beyond the BMP."""
    return s.encode("utf-16-be", "surrogatepass")


def topic_id_key(topic_id: TopicId) -> tuple[int, int]:
    """Sort key giving Kafka's ``Uuid.compareTo`` order: the two 64-bit halves compared as signed longs."""
    value = topic_id.int
    msb, lsb = value >> 64, value & 0xFFFF_FFFF_FFFF_FFFF
    return (msb - (1 << 64) if msb >> 63 else msb, lsb - (1 << 64) if lsb >> 63 else lsb)


def partition_counts(topics: Mapping[TopicId, TopicMetadata]) -> dict[TopicId, int]:
    """Topic id -> partition count, rejecting metadata no assignment can be computed from."""
    counts = {}
    for topic_id, metadata in topics.items():
        n = metadata.num_partitions
        if not isinstance(n, int) or n < 0:
            raise PartitionAssignorError(f"topic {topic_id} ({metadata.name!r}) has an invalid partition count {n!r}")
        counts[topic_id] = n
    return counts


def sorted_member_ids(group: GroupSpec) -> list[str]:
    return sorted(group.members, key=java_string_key)


def effective_subscription(member: MemberSubscription, counts: Mapping[TopicId, int]) -> frozenset[TopicId]:
    """The member's subscribed topics that exist; the others (deleted, not created yet) are ignored."""
    return frozenset(t for t in member.subscribed_topic_ids if t in counts)


def valid_owned(assigned: Iterable[int], num_partitions: int, owners: list[int]) -> list[int]:
    """The partitions of one topic in a member's current assignment that exist and that no member before it
    claimed, ascending (a target assignment never gives a partition twice; this keeps bad input harmless)."""
    return sorted(p for p in set(assigned) if isinstance(p, int) and 0 <= p < num_partitions and owners[p] < 0)


# --- the registry -----------------------------------------------------------------------------------------------

from pykbroker.groups.assignors.range import RangeAssignor  # noqa: E402  (the assignors import the helpers above)
from pykbroker.groups.assignors.uniform import UniformAssignor  # noqa: E402

ASSIGNORS: dict[str, PartitionAssignor] = {a.name: a for a in (UniformAssignor(), RangeAssignor())}
DEFAULT_ASSIGNORS = ("uniform", "range")  # Kafka 4's group.consumer.assignors default, in its order


def assignor_for(name: str) -> PartitionAssignor:
    try:
        return ASSIGNORS[name]
    except (KeyError, TypeError):
        raise UnknownAssignorError(f"unsupported assignor {name!r}; known: {', '.join(ASSIGNORS)}") from None

"""The admin views over both kinds of group (classic and consumer), as Kafka 4's GroupMetadataManager and
OffsetMetadataManager answer ListGroups, DeleteGroups and OffsetDelete for every group of a coordinator.

* ListGroups: the classic coordinator's groups and the consumer coordinator's, each with its type
  (Kafka's Group.GroupType: "classic", "consumer"); a consumer group's protocol type is "consumer" and its
  state one of Empty, Assigning, Reconciling, Stable. The states filter is case-insensitive (and trimmed);
  the types filter too, a name Kafka does not know (GroupType.UNKNOWN) matching no group.
* DeleteGroups of a consumer group: NON_EMPTY_GROUP while it has members (ConsumerGroup.validateDeleteGroup),
  else its offsets are tombstoned and the group removed (its records tombstoned by the consumer
  coordinator's ``release_empty_group``). Classic groups: the classic coordinator's rules.
* OffsetDelete of a consumer group: GROUP_SUBSCRIBED_TO_TOPIC for the partitions of a topic some member
  subscribes to (by name or by a regex matching it), the others' offsets tombstoned; members or not
  (ConsumerGroup.validateOffsetDelete checks nothing).
* DescribeGroups (v0-5) of a consumer group stays the classic coordinator's answer: "Dead" with no error and
  no members, as Kafka 4 answers DescribeGroups before v6 (v6 says GROUP_ID_NOT_FOUND "Group <id> is not a
  classic group."); ConsumerGroupDescribe describes it.
"""

from __future__ import annotations

from typing import Iterable

from pykbroker.groups.classic.group import GroupOverview
from pykbroker.protocol.errors import ErrorCode

CLASSIC, CONSUMER = "classic", "consumer"
GROUP_TYPES = (CLASSIC, CONSUMER)
CONSUMER_PROTOCOL_TYPE = "consumer"

TopicPartition = tuple[str, int]


def consumer_overview(group) -> GroupOverview:
    """A consumer group's ListGroups entry (Kafka's ConsumerGroup.asListedGroup)."""
    return GroupOverview(group.group_id, CONSUMER_PROTOCOL_TYPE, group.state.value, CONSUMER)


class GroupAdmin:
    """ListGroups, DeleteGroups and OffsetDelete over the classic coordinator (``classic``) and the consumer
    group coordinator (``consumer``, None when there is none)."""

    def __init__(self, classic, consumer=None) -> None:
        self.classic = classic
        self.consumer = consumer

    def _consumer_group(self, group_id: str):
        return self.consumer.group(group_id) if self.consumer is not None else None

    def list_groups(self, states: Iterable[str] = (), types: Iterable[str] = ()) -> tuple[ErrorCode, list[GroupOverview]]:
        wanted_states = {state.strip().lower() for state in states}
        wanted_types = {kind.lower() for kind in types}
        error, groups = self.classic.list_groups(())
        if self.consumer is not None:
            groups = [*groups, *(consumer_overview(g) for g in self.consumer.groups())]
        return error, [g for g in groups
                       if (not wanted_states or g.state.lower() in wanted_states)
                       and (not wanted_types or g.group_type in wanted_types)]

    def delete_groups(self, group_ids: Iterable[str]) -> dict[str, ErrorCode]:
        results: dict[str, ErrorCode] = {}
        classic_ids = []
        for group_id in dict.fromkeys(group_ids):
            group = self._consumer_group(group_id) if group_id else None
            if group is None:
                classic_ids.append(group_id)
                continue
            error = self.classic.coordinator_error(group_id)
            if error is not None:
                results[group_id] = error
            elif not group.is_empty() or not self.consumer.release_empty_group(group_id):
                results[group_id] = ErrorCode.non_empty_group
            else:
                self.classic.store.delete(group_id, None)
                results[group_id] = ErrorCode.none
        results.update(self.classic.delete_groups(classic_ids))
        return results

    def delete_offsets(self, group_id: str,
                       partitions: Iterable[TopicPartition]) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        group = self._consumer_group(group_id) if group_id else None
        if group is None:
            return self.classic.delete_offsets(group_id, partitions)
        error = self.classic.coordinator_error(group_id)
        if error is not None:
            return error, {}
        subscribed = set(group.subscription_metadata)
        results: dict[TopicPartition, ErrorCode] = {}
        eligible = []
        for tp in partitions:
            if tp[0] in subscribed:
                results[tp] = ErrorCode.group_subscribed_to_topic
            else:
                eligible.append(tp)
                results[tp] = ErrorCode.none
        if eligible:
            self.classic.store.delete(group_id, eligible)
        return ErrorCode.none, results


__all__ = ["GroupAdmin", "GROUP_TYPES", "CLASSIC", "CONSUMER", "consumer_overview"]

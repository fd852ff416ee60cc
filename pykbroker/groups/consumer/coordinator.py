"""The consumer group coordinator (KIP-848, ``group.protocol=consumer``): ConsumerGroupHeartbeat,
ConsumerGroupDescribe and the member-epoch checks of OffsetCommit / OffsetFetch v9, as Kafka 4's
GroupMetadataManager runs them (group-coordinator/.../GroupMetadataManager.consumerGroupHeartbeat).

A heartbeat, in Kafka's order:

1. The request is checked (GroupCoordinatorService.throwIfConsumerGroupHeartbeatRequestIsInvalid): v1 needs a
   member id (the client makes it up, Kafka 4); epoch 0 (join) needs a rebalance timeout, an empty owned
   list and a subscription (names or regex, possibly empty); epoch -2 needs an instance id; an epoch below -2
   and empty strings are INVALID_REQUEST; an assignor not in ``group.consumer.assignors`` UNSUPPORTED_ASSIGNOR.
   Then this broker must coordinate the group (NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS, the classic
   coordinator's ownership of the ``__consumer_offsets`` partitions).
2. Epoch -1 leaves (the member is removed, the group epoch bumped); epoch -2 is a static member's temporary
   leave: it keeps its partitions (nobody else gets them) until it comes back under a new member id or its
   session times out.
3. Otherwise the member is found or, with epoch 0, created: GROUP_ID_NOT_FOUND for a group that does not
   exist or is a classic group with members, GROUP_MAX_SIZE_REACHED past ``group.consumer.max.size``,
   UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH for an epoch other than the member's (its previous epoch is accepted
   with a subset of its partitions: the answer that bumped it may have been lost), UNRELEASED_INSTANCE_ID
   for a static member's instance id still held, FENCED_INSTANCE_ID for an instance id held under another
   member id. Epoch 0 from a known member is a rejoin, accepted (Kafka 4).
4. The member's fields change only where the heartbeat sets them (null means "unchanged"). A changed
   subscription (names or regex: INVALID_REGULAR_EXPRESSION if it does not compile) bumps the group epoch,
   and so does any change of the subscribed topics' metadata (a topic created that a name or regex names,
   deleted, or given more partitions), which every heartbeat recomputes.
5. A group epoch above the assignment epoch: the target assignment is computed by the group's assignor
   (the one most members name, else the first of ``group.consumer.assignors``), sticky to the previous target.
6. The member reconciles towards its target (group.py's ``reconcile``: revoke first, then take what others
   released). A member waiting for a revocation has its rebalance timeout to heartbeat it: else it is fenced.
7. Every heartbeat re-arms the member's session timeout (``group.consumer.session.timeout.ms``): a member
   that stops heartbeating is removed. The answer carries the member's assignment only when it changed or
   the heartbeat was a full one (a join, or every field set).

Every change is written to the group's ``__consumer_offsets`` partition as Kafka 4's records (persistence.py),
through the replica manager as commits are, and the heartbeat is answered once they are acknowledged (the
mapped error otherwise: COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR). The memory is changed first and not
rolled back if the write fails (Kafka reverts its timeline snapshot): the member is told to retry, and the
next change writes the state again. A load of the partition (a restart, a new coordinator) replays the
records: every member is back at its epoch and assignment and must heartbeat within its session timeout.
"""

from __future__ import annotations

import logging
import uuid
import weakref
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable, Iterable, Mapping

import re2

from pykbroker.groups.assignors import (
    ASSIGNORS, DEFAULT_ASSIGNORS, GroupSpec, MemberSubscription, PartitionAssignorError, assignor_for,
)
from pykbroker.groups.assignors import TopicMetadata as AssignorTopic
from pykbroker.groups.consumer.group import (
    JOIN_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ConsumerGroup,
    ConsumerGroupMember,
    GroupState,
    MemberFencedError,
    MemberState,
    PartitionOwnedError,
    TopicMetadata,
    freeze,
    is_subset,
    reconcile,
)
from pykbroker.groups.consumer.persistence import changes, replay, rewrite, snapshot, tombstones
from pykbroker.groups.consumer_protocol import (
    decode_assignment, decode_subscription, encode_assignment, subscription_version,
)
from pykbroker.groups.offset_store import OFFSETS_TOPIC
from pykbroker.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION = 1  # ConsumerGroupHeartbeat v1: the client makes the member id
OFFSET_COMMIT_MIN_VERSION_FOR_CONSUMER_MEMBERS = 9
MIGRATION_POLICIES = ("disabled", "upgrade", "downgrade", "bidirectional")  # Kafka's ConsumerGroupMigrationPolicy


def assignor_name(configured: str) -> str:
    """A ``group.consumer.assignors`` entry as its assignor's name: Kafka's class names
    (``org.apache.kafka.coordinator.group.assignor.UniformAssignor``) map to ``uniform``; names stay."""
    simple = configured.strip().rsplit(".", 1)[-1]
    if simple.endswith("Assignor") and simple != "Assignor":
        simple = simple[: -len("Assignor")]
    return simple.lower() if "." in configured or configured.strip().endswith("Assignor") else configured.strip()


@dataclass(frozen=True)
class ConsumerGroupConfig:
    """Kafka's group.consumer.* broker configs (names, defaults and checks of Kafka 4's GroupCoordinatorConfig)."""

    session_timeout_ms: int = 45000
    min_session_timeout_ms: int = 45000
    max_session_timeout_ms: int = 60000
    heartbeat_interval_ms: int = 5000
    min_heartbeat_interval_ms: int = 5000
    max_heartbeat_interval_ms: int = 15000
    max_size: int = 2**31 - 1
    assignors: tuple[str, ...] = DEFAULT_ASSIGNORS
    migration_policy: str = "bidirectional"  # group.consumer.migration.policy (Kafka 4.0's default)

    def __post_init__(self) -> None:
        # Kafka's GroupCoordinatorConfig checks, refused at start.
        if not self.min_session_timeout_ms <= self.session_timeout_ms <= self.max_session_timeout_ms:
            raise ValueError("group.consumer.session.timeout.ms must be within group.consumer.min.session.timeout.ms"
                             " and group.consumer.max.session.timeout.ms")
        if not self.min_heartbeat_interval_ms <= self.heartbeat_interval_ms <= self.max_heartbeat_interval_ms:
            raise ValueError("group.consumer.heartbeat.interval.ms must be within group.consumer.min.heartbeat."
                             "interval.ms and group.consumer.max.heartbeat.interval.ms")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("group.consumer.heartbeat.interval.ms must be less than group.consumer.session.timeout.ms")
        if not self.assignors:
            raise ValueError("group.consumer.assignors must name at least one assignor")
        unknown = [name for name in self.assignors if name not in ASSIGNORS]
        if unknown:
            raise ValueError(f"group.consumer.assignors: unknown assignor(s) {', '.join(unknown)}; "
                             f"known: {', '.join(ASSIGNORS)}")
        if self.migration_policy not in MIGRATION_POLICIES:
            raise ValueError(f"group.consumer.migration.policy must be one of {', '.join(MIGRATION_POLICIES)}")

    @property
    def upgrade_enabled(self) -> bool:
        """Kafka's ConsumerGroupMigrationPolicy.isUpgradeEnabled: a non-empty classic group may become a consumer
        group."""
        return self.migration_policy in ("upgrade", "bidirectional")

    @property
    def downgrade_enabled(self) -> bool:
        return self.migration_policy in ("downgrade", "bidirectional")

    @classmethod
    def from_broker_config(cls, config) -> "ConsumerGroupConfig":
        assignors = config.get("group.consumer.assignors")
        if isinstance(assignors, str):
            assignors = [a for a in assignors.split(",") if a.strip()]
        return cls(
            session_timeout_ms=int(config.get("group.consumer.session.timeout.ms")),
            min_session_timeout_ms=int(config.get("group.consumer.min.session.timeout.ms")),
            max_session_timeout_ms=int(config.get("group.consumer.max.session.timeout.ms")),
            heartbeat_interval_ms=int(config.get("group.consumer.heartbeat.interval.ms")),
            min_heartbeat_interval_ms=int(config.get("group.consumer.min.heartbeat.interval.ms")),
            max_heartbeat_interval_ms=int(config.get("group.consumer.max.heartbeat.interval.ms")),
            max_size=int(config.get("group.consumer.max.size")),
            assignors=tuple(dict.fromkeys(assignor_name(a) for a in assignors)),
            migration_policy=str(config.get("group.consumer.migration.policy")).lower(),
        )


@dataclass(frozen=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Mapping[uuid.UUID, tuple[int, ...]] | None = None  # None: not sent (unchanged)
    client_id: str = ""
    client_host: str = ""
    version: int = 1
    # the topics among these the heartbeat's principal may DESCRIBE (None: all): what a regex resolved keeps
    describable: Callable[[Iterable[str]], set[str]] | None = None


@dataclass(frozen=True)
class HeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Mapping[uuid.UUID, frozenset[int]] | None = None


class HeartbeatError(Exception):
    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class DescribedGroup:
    group_id: str
    error: ErrorCode
    message: str | None = None
    group: ConsumerGroup | None = None


# --------------------------------------------------------------------------------------------------------
# Regular expressions: Kafka compiles them with RE2/J and matches whole topic names.

def _re2_options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is answered with INVALID_REGULAR_EXPRESSION, not logged by RE2
    return options


_RE2_OPTIONS = _re2_options()


@lru_cache(maxsize=1024)
def compile_topic_regex(pattern: str):
    """The pattern compiled by RE2 (the engine Kafka's RE2/J ports: the same syntax, matching in linear time, so
    no pattern can hold the event loop); ValueError with RE2's reason for what RE2 refuses (lookaround,
    backreferences, ...). A topic matches when the whole name matches (RE2/J's ``matches()``)."""
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        raise ValueError(reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)) from None


def _matching_topics(regex: str, topic_names: Iterable[str]) -> frozenset[str]:
    """The topics a regex matches."""
    try:
        pattern = compile_topic_regex(regex)
    except ValueError:
        return frozenset()
    return frozenset(name for name in topic_names if pattern.fullmatch(name))


# --------------------------------------------------------------------------------------------------------


class ConsumerGroupCoordinator:
    """The consumer groups of the ``__consumer_offsets`` partitions this broker coordinates.

    ``classic`` is the classic GroupCoordinator: it owns the partitions' loading (``coordinator_error``) and
    the classic groups a group id may already name. ``topics()`` lists the cluster's topics (objects with
    ``name``, ``topic_id``, ``partitions`` and ``internal``). ``scheduler`` is the coordinator's clock (the
    classic coordinator's Scheduler protocol)."""

    def __init__(self, classic, topics: Callable[[], Iterable], config: ConsumerGroupConfig | None = None,
                 *, scheduler=None, topics_version: Callable[[], int] | None = None) -> None:
        from pykbroker.groups.classic.coordinator import LoopScheduler

        self.classic = classic
        self._topics = topics
        self.config = config or ConsumerGroupConfig()
        # Per-group overrides (groups/configs.py GroupConfigs: session_timeout_ms / heartbeat_interval_ms of a
        # group id, the broker's values when it has none), as Kafka's groupConfigManager; None: the broker's.
        self.group_configs = None
        self._scheduler = scheduler or LoopScheduler()
        self._groups: dict[str, ConsumerGroup] = {}
        self._session_timers: dict[tuple[str, str], object] = {}
        self._rebalance_timers: dict[tuple[str, str], object] = {}
        self._join_timers: dict[tuple[str, str], object] = {}  # classic members told to rejoin
        self._sync_timers: dict[tuple[str, str], object] = {}  # classic members that joined, until their SyncGroup
        self._topics_version = topics_version  # None: unknown, the topics are read at every heartbeat
        self._resolved: dict[str, tuple[object, frozenset[str]]] = {}  # regex -> (topics version, matches)
        self._unsynced: dict[str, set[str]] = {}  # group id -> the member ids the log may hold after a failed write
        # group -> the DESCRIBE filter of its latest heartbeat, which resolves its regexes (as Kafka 4's refresh)
        self._describable: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._converted: dict | None = None  # the checkpoint of a classic group the running heartbeat converted

    # -- lookups ----------------------------------------------------------------------------------------

    def group(self, group_id: str) -> ConsumerGroup | None:
        return self._groups.get(group_id)

    def has_group(self, group_id: str) -> bool:
        return group_id in self._groups

    def release_empty_group(self, group_id: str) -> bool:
        """A classic JoinGroup wants this group id: an empty consumer group gives it up (Kafka's
        maybeDeleteEmptyConsumerGroup); returns False while it has members."""
        group = self._groups.get(group_id)
        if group is None:
            return True
        if not group.is_empty():
            return False
        del self._groups[group_id]
        self._persist(group, tombstones(group, self._unsynced.pop(group_id, ())), None)
        log.info("group %s: the empty consumer group is removed for a classic member", group_id)
        return True

    def on_leadership_change(self, topic: str, index: int, is_leader: bool) -> None:
        """An offsets partition led elsewhere now: its consumer groups are forgotten here (Kafka's onResignation)."""
        if topic != OFFSETS_TOPIC or is_leader:
            return
        for group_id in [g for g in self._groups if self.classic.store.partition_for(g) == index]:
            self._forget(self._groups.pop(group_id))

    def close(self) -> None:
        for timers in self._all_timers():
            for timer in timers.values():
                timer.cancel()
            timers.clear()

    def load(self, index: int, stored: dict[str, dict[bytes, bytes]]) -> int:
        """The groups of a freshly loaded offsets partition, from their records (the classic coordinator
        calls this once the store has replayed the partition). Members get a fresh session timeout; one
        waiting for a revocation its rebalance timeout. Returns how many groups were rebuilt."""
        count = 0
        for group_id, records in stored.items():
            group = replay(group_id, records)
            if group is None:
                continue
            self._groups[group_id] = group
            self._unsynced.pop(group_id, None)
            count += 1
            for member in group.members.values():
                self._schedule_session_timeout(group_id, member.member_id)
                if member.state is MemberState.UNREVOKED_PARTITIONS:
                    self._schedule_rebalance_timeout(group_id, member)
        if count:
            log.info("consumer group coordinator loaded %d groups of %s-%d", count, OFFSETS_TOPIC, index)
        return count

    def _persist(self, group: ConsumerGroup, records: list, done: Callable[[ErrorCode], None] | None) -> None:
        if not records:
            if done is not None:
                done(ErrorCode.none)
            return
        self.classic.store.append_group_records(group.group_id, records, self._scheduler.now_ms(), done)

    def _store_changes(self, group: ConsumerGroup, before, done: Callable[[ErrorCode], None] | None) -> None:
        """Write what changed since ``before``; once a write of the group failed (its records may or may not be
        in the log), the next one writes the whole group instead, until one succeeds."""
        group_id = group.group_id
        if self._groups.get(group_id) is not group:  # converted to a classic group meanwhile: its records are written
            self._persist(group, [], done)
            return
        stale = self._unsynced.get(group_id)
        records = changes(before, group) if stale is None else rewrite(group, stale)
        written = set(before.members) | set(group.members) | (stale or set())

        def stored(error: ErrorCode) -> None:
            if error != ErrorCode.none:
                log.warning("group %s: writing its records failed (%s): its next write stores the whole group",
                            group_id, error.name)
                self._unsynced[group_id] = self._unsynced.get(group_id, set()) | written
            elif stale is not None and self._unsynced.get(group_id) is stale:
                del self._unsynced[group_id]
            if done is not None:
                done(error)

        self._persist(group, records, stored)

    # -- ConsumerGroupHeartbeat -------------------------------------------------------------------------

    def heartbeat(self, request: HeartbeatRequest, respond: Callable[[HeartbeatResult], None]) -> None:
        """Handle a heartbeat; ``respond`` is called once its changes are stored (at once on a single broker)."""
        try:
            self._validate(request)
            error = self.classic.coordinator_error(request.group_id)
            if error is not None:
                respond(HeartbeatResult(error))
                return
            if request.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
                result, group, before = self._undone_on_failure(self._leave, request)
            else:
                result, group, before = self._undone_on_failure(self._heartbeat, request)
        except HeartbeatError as exc:
            respond(HeartbeatResult(exc.code, exc.message))
            return

        def stored(error: ErrorCode) -> None:
            respond(result if error == ErrorCode.none else HeartbeatResult(error))

        self._store_changes(group, before, stored)

    def _undone_on_failure(self, step, request: HeartbeatRequest):
        """Run a heartbeat's step; one that fails midway (an assignor's error, a member fenced while reconciling)
        leaves the group as it was and every member with its timers, as Kafka applies a heartbeat's records only
        once it succeeded. A PartitionOwnedError (Kafka's IllegalStateException: a bug) is logged and raised as
        UNKNOWN_SERVER_ERROR, the answer Kafka gives it."""
        group_id = request.group_id
        group = self._groups.get(group_id)
        saved = group.checkpoint() if group is not None else None
        classic_timers = {what: {mid for gid, mid in timers if gid == group_id}
                          for what, timers in (("JoinGroup", self._join_timers), ("SyncGroup", self._sync_timers))}
        self._converted = None
        try:
            return step(request)
        except Exception as failure:
            created = self._groups.get(group_id) if group is None else None
            if created is not None and self._converted is not None:
                # a classic group this heartbeat converted: the conversion's records are written, it stays as that
                group, saved = created, self._converted
            elif created is not None:  # the group this heartbeat created goes again
                del self._groups[group_id]
                self._forget(created)
            if group is not None:
                added = set(group.members)
                group.restore(saved)
                self._groups[group_id] = group
                for member_id in added - set(group.members):
                    for timers in self._all_timers():
                        self._cancel(timers, (group_id, member_id))
                for member_id, member in group.members.items():
                    if (group_id, member_id) not in self._session_timers:
                        self._schedule_session_timeout(group_id, member_id)
                    if (member.state is MemberState.UNREVOKED_PARTITIONS
                            and (group_id, member_id) not in self._rebalance_timers):
                        self._schedule_rebalance_timeout(group_id, member)
                for what, timers in (("JoinGroup", self._join_timers), ("SyncGroup", self._sync_timers)):
                    for member_id in classic_timers[what] & set(group.members):  # a replaced static member's
                        if (group_id, member_id) not in timers:
                            self._schedule_classic_timeout(timers, what, group_id, member_id,
                                                           group.members[member_id].rebalance_timeout_ms)
            if isinstance(failure, PartitionOwnedError):
                log.error("group %s: %s of member %s refused: %s", group_id, step.__name__.strip("_"),
                          request.member_id, failure)
                raise HeartbeatError(ErrorCode.unknown_server_error, str(failure)) from failure
            raise
        finally:
            self._converted = None

    def _validate(self, request: HeartbeatRequest) -> None:
        """Kafka 4's GroupCoordinatorService.throwIfConsumerGroupHeartbeatRequestIsInvalid, in its order."""
        def invalid(message: str) -> HeartbeatError:
            return HeartbeatError(ErrorCode.invalid_request, message)

        if (request.version >= CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION or request.member_epoch > 0
                or request.member_epoch == LEAVE_GROUP_MEMBER_EPOCH) and not (request.member_id or "").strip():
            raise invalid("MemberId can't be empty.")
        if not (request.group_id or "").strip():
            raise invalid("GroupId can't be empty.")
        if request.instance_id is not None and not request.instance_id.strip():
            raise invalid("InstanceId can't be empty.")
        if request.rack_id is not None and not request.rack_id.strip():
            raise invalid("RackId can't be empty.")
        if request.member_epoch == JOIN_GROUP_MEMBER_EPOCH:
            if request.rebalance_timeout_ms == -1:
                raise invalid("RebalanceTimeoutMs must be provided in first request.")
            if request.owned is None or request.owned:  # (a topic without partitions is not empty either)
                raise invalid("TopicPartitions must be empty when (re-)joining.")
            if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
                raise invalid("Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when (re-)joining.")
        elif request.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            if request.instance_id is None:
                raise invalid("InstanceId can't be null.")
        elif request.member_epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            raise invalid("MemberEpoch is invalid.")
        if request.server_assignor is not None and request.server_assignor not in self.config.assignors:
            raise HeartbeatError(ErrorCode.unsupported_assignor,
                                 f"ServerAssignor {request.server_assignor} is not supported. Supported assignors: "
                                 f"{', '.join(self.config.assignors)}.")

    def _get_or_create_group(self, group_id: str, create: bool) -> ConsumerGroup:
        group = self._groups.get(group_id)
        if group is not None:
            return group
        if not create:
            raise HeartbeatError(ErrorCode.group_id_not_found, f"Consumer group {group_id} not found.")
        if self.classic.release_empty_group(group_id):
            return ConsumerGroup(group_id)
        refusal = self._upgrade_refusal(group_id)
        if refusal is not None:
            raise HeartbeatError(ErrorCode.group_id_not_found, refusal)
        if self.classic.group(group_id).size() >= self.config.max_size:
            raise self._group_full()  # the joining member would not fit: the group is left as it is (Kafka's revert)
        return self._upgrade(group_id)

    def _group_full(self) -> HeartbeatError:
        return HeartbeatError(ErrorCode.group_max_size_reached,
                              f"The consumer group has reached its maximum capacity of {self.config.max_size} members.")

    def _upgrade_refusal(self, group_id: str) -> str | None:
        """Why a classic group with members does not become a consumer group: Kafka 4's validateOnlineUpgrade, in
        its order (the policy, the classic group's protocol type, its size); None when it does."""
        classic = self.classic.group(group_id)
        if not self.config.upgrade_enabled:
            reason = "online upgrade is disabled"
        elif classic is None or not classic.is_consumer_group():
            reason = "the group does not use the consumer embedded protocol"
        elif classic.size() > self.config.max_size:
            reason = "the group size exceeds the consumer group maximum size"
        else:
            try:
                self._classic_members(classic)
                return None
            except ValueError as exc:  # Kafka's fromClassicGroup failing with a SchemaException
                log.warning("group %s: a member's embedded consumer protocol is malformed: %s", group_id, exc)
                reason = "the embedded consumer protocol is malformed"
        log.info("group %s: cannot upgrade the classic group to a consumer group because %s", group_id, reason)
        return f"Cannot upgrade classic group {group_id} to consumer group because {reason}."

    @staticmethod
    def _classic_members(classic) -> list:
        """Each member of a classic group with its subscription (of the group's protocol) and its assignment
        (topic name -> partitions), decoded; ValueError if any is not the consumer protocol's."""
        decoded = []
        for old in classic.members.values():
            try:
                subscription = decode_subscription(old.metadata(classic.protocol_name) if classic.protocol_name
                                                   else old.protocols[0][1])
                assigned = decode_assignment(old.assignment) if old.assignment else {}
            except ValueError as exc:
                raise ValueError(f"member {old.member_id}: {exc}") from None
            decoded.append((old, subscription, assigned))
        return decoded

    def _upgrade(self, group_id: str) -> ConsumerGroup:
        """A running classic group becomes a consumer group (Kafka 4's convertToConsumerGroup and
        ConsumerGroup.fromClassicGroup): its members stay, as classic members at the classic generation as
        member epoch, each with the partitions of its last assignment as current and target assignment; the
        classic record is tombstoned and the consumer group's records written; each member's session timer
        runs on its classic session timeout. The heartbeat that asked then joins as usual."""
        decoded = self._classic_members(self.classic.group(group_id))  # _upgrade_refusal read them all
        classic = self.classic.release_group_for_upgrade(group_id)
        group = ConsumerGroup(group_id)
        topics = {info.name: info.topic_id for info in self._topics()}
        epoch = classic.generation_id
        for old, subscription, assigned in decoded:
            assignment = freeze({topics[name]: parts for name, parts in assigned.items() if name in topics})
            group.update_member(ConsumerGroupMember(
                old.member_id, instance_id=old.group_instance_id, rack_id=subscription.rack_id,
                rebalance_timeout_ms=old.rebalance_timeout_ms, client_id=old.client_id, client_host=old.client_host,
                subscribed_topic_names=tuple(sorted(set(subscription.topics))),
                member_epoch=epoch, previous_member_epoch=epoch, assigned=assignment,
                classic_session_timeout_ms=old.session_timeout_ms, classic_protocols=tuple(old.protocols)))
            group.target_assignment[old.member_id] = dict(assignment)
        group.group_epoch = group.assignment_epoch = epoch
        group.subscription_metadata = self._subscription_metadata(group)
        self._groups[group_id] = group
        self._store_changes(group, snapshot(None), None)  # a failed write: the group's next one stores it whole
        for member_id in group.members:
            self._schedule_session_timeout(group_id, member_id)
        self._converted = group.checkpoint()  # what a heartbeat failing after this goes back to
        log.info("group %s: the classic group of generation %d with %d members is now a consumer group", group_id,
                 epoch, len(group.members))
        return group

    @staticmethod
    def _check_epoch(member: ConsumerGroupMember, received: int, owned) -> None:
        """Kafka's throwIfConsumerGroupMemberEpochIsInvalid."""
        if received > member.member_epoch:
            raise HeartbeatError(ErrorCode.fenced_member_epoch,
                                 f"The consumer group member has a greater member epoch ({received}) than the one known "
                                 f"by the group coordinator ({member.member_epoch}). The member must abandon all its "
                                 "partitions and rejoin.")
        if received < member.member_epoch and (received != member.previous_member_epoch or owned is None
                                               or not is_subset(owned, member.assigned)):
            raise HeartbeatError(ErrorCode.fenced_member_epoch,
                                 f"The consumer group member has a smaller member epoch ({received}) than the one known "
                                 f"by the group coordinator ({member.member_epoch}). The member must abandon all its "
                                 "partitions and rejoin.")

    def _member(self, group: ConsumerGroup, request: HeartbeatRequest) -> ConsumerGroupMember:
        joining = request.member_epoch == JOIN_GROUP_MEMBER_EPOCH
        member_id, instance_id = request.member_id, request.instance_id
        if instance_id is None or (joining and (existing := group.members.get(member_id)) is not None
                                   and existing.instance_id == instance_id):
            member = group.members.get(member_id)
            if member is None:
                if not joining:
                    raise HeartbeatError(ErrorCode.unknown_member_id,
                                         f"Member {member_id} is not a member of group {group.group_id}.")
                log.info("group %s: member %s joins with the consumer protocol", group.group_id, member_id)
                return ConsumerGroupMember(member_id)
            if not joining:
                self._check_epoch(member, request.member_epoch, request.owned)
            return member
        existing = group.static_member(instance_id)
        if joining:
            if existing is None:
                log.info("group %s: static member %s (instance %s) joins", group.group_id, member_id, instance_id)
                return ConsumerGroupMember(member_id, instance_id=instance_id)
            if existing.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH and not existing.uses_classic_protocol:
                raise HeartbeatError(ErrorCode.unreleased_instance_id,
                                     f"Static member {member_id} with instance id {instance_id} cannot join the group "
                                     f"because the instance id is owned by {existing.member_id} member.")
            return self._replace_static_member(group, existing, member_id)
        if existing is None:
            raise HeartbeatError(ErrorCode.unknown_member_id, f"Instance id {instance_id} is unknown.")
        if existing.member_id != member_id:
            raise HeartbeatError(ErrorCode.fenced_instance_id,
                                 f"Static member {member_id} with instance id {instance_id} was fenced by member "
                                 f"{existing.member_id}.")
        self._check_epoch(existing, request.member_epoch, request.owned)
        return existing

    def _replace_static_member(self, group: ConsumerGroup, existing: ConsumerGroupMember,
                               member_id: str) -> ConsumerGroupMember:
        """A static member back under a new member id (either protocol) takes over the old one's place and
        partitions, at epoch 0 (Kafka's replaceMember)."""
        replacement = replace(existing, member_id=member_id, member_epoch=0, previous_member_epoch=0)
        target = group.target_assignment.get(existing.member_id)
        self._remove(group, existing.member_id)
        if target is not None:
            group.target_assignment[member_id] = target
        group.update_member(replacement)
        log.info("group %s: static member %s rejoins as %s, replacing %s", group.group_id, existing.instance_id,
                 member_id, existing.member_id)
        return replacement

    def _heartbeat(self, request: HeartbeatRequest):
        group_id = request.group_id
        # Checked before anything changes (a static member's takeover, a classic group's conversion).
        if request.subscribed_topic_regex:
            try:
                compile_topic_regex(request.subscribed_topic_regex)
            except ValueError as exc:
                raise HeartbeatError(ErrorCode.invalid_regular_expression,
                                     f"SubscribedTopicRegex `{request.subscribed_topic_regex}` is not a valid regular "
                                     f"expression: {exc}.") from None
        group = self._get_or_create_group(group_id, request.member_epoch == JOIN_GROUP_MEMBER_EPOCH)
        before = snapshot(group)
        self._describable[group] = request.describable
        if request.member_id not in group.members and len(group.members) >= self.config.max_size:  # by member id
            raise self._group_full()
        member = self._member(group, request)
        updated = replace(
            member,
            instance_id=request.instance_id if request.instance_id is not None else member.instance_id,
            rack_id=request.rack_id if request.rack_id is not None else member.rack_id,
            rebalance_timeout_ms=(request.rebalance_timeout_ms if request.rebalance_timeout_ms != -1
                                  else member.rebalance_timeout_ms),
            server_assignor=request.server_assignor if request.server_assignor is not None else member.server_assignor,
            subscribed_topic_names=(tuple(sorted(set(request.subscribed_topic_names)))
                                    if request.subscribed_topic_names is not None else member.subscribed_topic_names),
            subscribed_topic_regex=(request.subscribed_topic_regex if request.subscribed_topic_regex is not None
                                    else member.subscribed_topic_regex),
            client_id=request.client_id,
            client_host=request.client_host,
            classic_session_timeout_ms=None, classic_protocols=None,  # a static classic member now on this protocol
        )
        # From here on the heartbeat succeeds: the group and member change.
        reconciled = self._apply(group, member, updated, request.owned)
        if reconciled.state is MemberState.UNREVOKED_PARTITIONS:
            if reconciled != updated:
                self._schedule_rebalance_timeout(group_id, reconciled)
        else:
            self._cancel(self._rebalance_timers, (group_id, reconciled.member_id))
        self._schedule_session_timeout(group_id, reconciled.member_id)
        full = request.member_epoch == JOIN_GROUP_MEMBER_EPOCH or (
            request.rebalance_timeout_ms != -1 and request.owned is not None
            and (request.subscribed_topic_names is not None or request.subscribed_topic_regex is not None))
        changed = dict(reconciled.assigned) != dict(member.assigned)
        return HeartbeatResult(ErrorCode.none, None, reconciled.member_id, reconciled.member_epoch,
                               self._heartbeat_interval_ms(group_id),
                               dict(reconciled.assigned) if full or changed else None), group, before

    def _leave(self, request: HeartbeatRequest):
        """Kafka's consumerGroupLeave: epoch -1 removes the member, -2 parks a static member."""
        group = self._get_or_create_group(request.group_id, False)
        before = snapshot(group)
        if request.instance_id is None:
            member = group.members.get(request.member_id)
            if member is None:
                raise HeartbeatError(ErrorCode.unknown_member_id,
                                     f"Member {request.member_id} is not a member of group {group.group_id}.")
        else:
            member = group.static_member(request.instance_id)
            if member is None:
                raise HeartbeatError(ErrorCode.unknown_member_id, f"Instance id {request.instance_id} is unknown.")
            if member.member_id != request.member_id:
                raise HeartbeatError(ErrorCode.fenced_instance_id,
                                     f"Static member {request.member_id} with instance id {request.instance_id} was "
                                     f"fenced by member {member.member_id}.")
            if request.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                log.info("group %s: static member %s (instance %s) left for now", group.group_id, member.member_id,
                         request.instance_id)
                group.update_member(replace(member, member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH,
                                            previous_member_epoch=member.member_epoch, pending_revocation={}))
                self._cancel(self._rebalance_timers, (group.group_id, member.member_id))
                return HeartbeatResult(ErrorCode.none, None, member.member_id, LEAVE_GROUP_STATIC_MEMBER_EPOCH), \
                    group, before
        log.info("group %s: member %s left", group.group_id, member.member_id)
        if self._fence(group, member.member_id):
            before = snapshot(group)  # the group is classic now: its records are written
        # Kafka's leave answer: the member id and the epoch it sent, no heartbeat interval
        return HeartbeatResult(ErrorCode.none, None, request.member_id, request.member_epoch), group, before

    # -- classic members of a consumer group (KIP-848's online migration) --------------------------------
    #
    # A consumer group may hold members that still speak the classic protocol (an upgraded group, or a classic
    # consumer joining a consumer group): Kafka 4's classicGroupJoinToConsumerGroup / SyncToConsumerGroup /
    # HeartbeatToConsumerGroup / LeaveToConsumerGroup. The server assigns for them as for the others; such a
    # member's generation is its member epoch, it learns a new epoch by rejoining (its heartbeat answers
    # REBALANCE_IN_PROGRESS), and it gives partitions up by rejoining without them in its Subscription's owned
    # partitions (cooperative) or without any (eager).

    def has_members(self, group_id: str) -> bool:
        group = self._groups.get(group_id)
        return group is not None and not group.is_empty()

    def _classic_member(self, group: ConsumerGroup, member_id: str, instance_id: str | None) -> ConsumerGroupMember:
        """Kafka's checks of a classic request's member: known (by instance id for a static one), not fenced by
        another member id, and speaking the classic protocol."""
        if instance_id is not None:
            member = group.static_member(instance_id)
            if member is None:
                raise HeartbeatError(ErrorCode.unknown_member_id, f"Instance id {instance_id} is unknown.")
            if member_id and member.member_id != member_id:
                raise HeartbeatError(ErrorCode.fenced_instance_id,
                                     f"Static member {member_id} with instance id {instance_id} was fenced by member "
                                     f"{member.member_id}.")
        else:
            member = group.members.get(member_id)
            if member is None:
                raise HeartbeatError(ErrorCode.unknown_member_id,
                                     f"Member {member_id} is not a member of group {group.group_id}.")
        if not member.uses_classic_protocol:
            raise HeartbeatError(ErrorCode.unknown_member_id,
                                 f"Member {member.member_id} does not use the classic protocol.")
        return member

    @staticmethod
    def _supports_classic_protocols(group: ConsumerGroup, protocol_type: str, names: set[str]) -> bool:
        """Kafka's ConsumerGroup.supportsClassicProtocols: the consumer protocol type, and a protocol every
        classic member supports."""
        if protocol_type != "consumer" or not names:
            return False
        for member in group.members.values():
            if member.uses_classic_protocol:
                names = names & {name for name, _ in member.classic_protocols}
        return bool(names)

    def classic_join(self, request, respond) -> None:
        """A JoinGroup to a consumer group with members (Kafka's classicGroupJoinToConsumerGroup); ``request`` is
        the classic coordinator's JoinRequest, ``respond`` gets its JoinResult once the records are stored. A join
        failing midway (an assignor's error, a member fenced while reconciling) leaves the group as it was."""
        from pykbroker.groups.classic.group import JoinResult

        if not request.member_id and request.group_instance_id is None and request.require_known_member_id:
            respond(JoinResult(ErrorCode.member_id_required, str(uuid.uuid4())))
            return
        try:
            result, group, before = self._undone_on_failure(self._classic_join, request)
        except HeartbeatError as exc:
            respond(JoinResult(exc.code, request.member_id))
            return
        gid, mid = group.group_id, result.member_id
        self._cancel(self._join_timers, (gid, mid))
        self._cancel(self._rebalance_timers, (gid, mid))  # a classic member revokes by rejoining
        self._schedule_session_timeout(gid, mid)
        self._schedule_classic_timeout(self._sync_timers, "SyncGroup", gid, mid, request.rebalance_timeout_ms)

        def stored(error: ErrorCode) -> None:
            respond(result if error == ErrorCode.none else JoinResult(error, mid))

        self._store_changes(group, before, stored)

    def _classic_join(self, request):
        """classic_join's changes to the group: returns its JoinResult, the group and the group before them."""
        from pykbroker.groups.classic.group import JoinResult

        group = self._groups[request.group_id]
        member_id, instance_id = request.member_id, request.group_instance_id
        before = snapshot(group)
        existing = group.static_member(instance_id) if instance_id is not None else None
        known = member_id in group.members or existing is not None
        if not known and len(group.members) >= self.config.max_size:
            raise self._group_full()
        names = [name for name, _ in request.protocols]
        if not self._supports_classic_protocols(group, request.protocol_type, set(names)):
            raise HeartbeatError(ErrorCode.inconsistent_group_protocol)
        try:
            subscription = decode_subscription(request.protocols[0][1])
        except ValueError as exc:
            log.info("group %s: JoinGroup of %s refused: %s", group.group_id, member_id or "a new member", exc)
            raise HeartbeatError(ErrorCode.inconsistent_group_protocol) from None
        if instance_id is not None and member_id:
            # Kafka's getOrMaybeSubscribeStaticConsumerGroupMember(createIfNotExists = isUnknownMember): only a
            # JoinGroup without a member id takes an instance id over
            if existing is None:
                raise HeartbeatError(ErrorCode.unknown_member_id)
            if existing.member_id != member_id:
                log.info("group %s: JoinGroup of %s refused: instance id %s is held by member %s",
                         group.group_id, member_id, instance_id, existing.member_id)
                raise HeartbeatError(ErrorCode.fenced_instance_id)
        member_id = member_id or str(uuid.uuid4())
        member = group.members.get(member_id)
        if existing is not None and existing.member_id != member_id:
            member = self._replace_static_member(group, existing, member_id)
        elif member is None:  # Kafka creates the member under the id it is given
            member = ConsumerGroupMember(member_id, instance_id=instance_id)
            log.info("group %s: member %s joins with the classic protocol", group.group_id, member_id)
        elif not member.uses_classic_protocol:
            raise HeartbeatError(ErrorCode.unknown_member_id)
        topic_ids = {info.name: info.topic_id for info in self._topics()}
        owned = freeze({topic_ids[name]: parts for name, parts in subscription.owned_partitions.items()
                        if name in topic_ids})
        updated = replace(
            member, instance_id=instance_id, rack_id=subscription.rack_id,
            rebalance_timeout_ms=request.rebalance_timeout_ms, server_assignor=None,
            subscribed_topic_names=tuple(sorted(set(subscription.topics))), subscribed_topic_regex=None,
            client_id=request.client_id, client_host=request.client_host,
            classic_session_timeout_ms=request.session_timeout_ms, classic_protocols=tuple(request.protocols))
        reconciled = self._apply(group, member, updated, owned)
        return JoinResult(ErrorCode.none, reconciled.member_id, reconciled.member_epoch, "consumer", names[0]), \
            group, before

    def classic_sync(self, group_id: str, generation_id: int, member_id: str, protocol_type: str | None,
                     protocol_name: str | None, instance_id: str | None, respond) -> None:
        """A SyncGroup of a classic member (Kafka's classicGroupSyncToConsumerGroup): its current assignment as a
        consumer protocol Assignment, in the version of its first protocol's Subscription."""
        from pykbroker.groups.classic.group import SyncResult

        group = self._groups[group_id]
        try:
            member = self._classic_member(group, member_id, instance_id)
            if generation_id != member.member_epoch:
                raise HeartbeatError(ErrorCode.illegal_generation)
            first = member.classic_protocols[0]
            if (protocol_type is not None and protocol_type != "consumer") or (
                    protocol_name is not None and protocol_name != first[0]):
                raise HeartbeatError(ErrorCode.inconsistent_group_protocol)
            if group.group_epoch > member.member_epoch and member.state is not MemberState.UNREVOKED_PARTITIONS:
                raise HeartbeatError(ErrorCode.rebalance_in_progress)
        except HeartbeatError as exc:
            respond(SyncResult(exc.code))
            return
        self._cancel(self._sync_timers, (group_id, member.member_id))
        self._schedule_session_timeout(group_id, member.member_id)
        names = {info.topic_id: info.name for info in self._topics()}
        assignment = {names[tid]: parts for tid, parts in member.assigned.items() if tid in names}
        respond(SyncResult(ErrorCode.none, "consumer", first[0],
                           encode_assignment(assignment, subscription_version(first[1]))))

    def classic_heartbeat(self, group_id: str, member_id: str, instance_id: str | None,
                          generation_id: int) -> ErrorCode:
        """A Heartbeat of a classic member (Kafka's classicGroupHeartbeatToConsumerGroup): REBALANCE_IN_PROGRESS
        when it must rejoin (a newer group epoch, partitions to revoke, or the partitions it waited for now free),
        and then it has one rebalance timeout to do so."""
        group = self._groups[group_id]
        try:
            member = self._classic_member(group, member_id, instance_id)
        except HeartbeatError as exc:
            return exc.code
        if generation_id != member.member_epoch:
            return ErrorCode.illegal_generation
        self._schedule_session_timeout(group_id, member.member_id)
        if (member.member_epoch < group.group_epoch or member.state is MemberState.UNREVOKED_PARTITIONS
                or (member.state is MemberState.UNRELEASED_PARTITIONS
                    and not group.waiting_on_unreleased_partition(member))):
            if (group_id, member.member_id) not in self._join_timers:
                self._schedule_classic_timeout(self._join_timers, "JoinGroup", group_id, member.member_id,
                                               member.rebalance_timeout_ms)
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def classic_leave(self, group_id: str, leaving: Iterable) -> list[ErrorCode]:
        """A LeaveGroup to a consumer group (Kafka's classicGroupLeaveToConsumerGroup): each member (member id, or
        instance id alone) gets its error; the group epoch goes up once for those that left."""
        group = self._groups[group_id]
        before = snapshot(group)
        errors, removed = [], False
        for entry in leaving:
            try:
                member = self._classic_member(group, entry.member_id, entry.group_instance_id)
            except HeartbeatError as exc:
                errors.append(exc.code)
                continue
            log.info("group %s: classic member %s leaves (%s)", group_id, member.member_id,
                     entry.reason or "no reason given")
            self._remove(group, member.member_id)
            removed = True
            errors.append(ErrorCode.none)
        if removed:
            group.subscription_metadata = self._subscription_metadata(group)
            group.group_epoch += 1
            self._store_changes(group, before, None)
        return errors

    def _apply(self, group: ConsumerGroup, member: ConsumerGroupMember, updated: ConsumerGroupMember,
               owned) -> ConsumerGroupMember:
        """A member's new fields go into the group: the group epoch bumped if its subscription (or the subscribed
        topics) changed, the target computed if needed, and the member reconciled towards it with what it
        says it owns (None: it did not say). Returns the member as it now is."""
        bump = (updated.subscribed_topic_names != member.subscribed_topic_names
                or updated.subscribed_topic_regex != member.subscribed_topic_regex)
        self._groups[group.group_id] = group
        group.update_member(updated)
        metadata = self._subscription_metadata(group)
        if metadata != group.subscription_metadata:
            group.subscription_metadata = metadata
            bump = True
        if bump:
            group.group_epoch += 1
            log.info("group %s: group epoch bumped to %d", group.group_id, group.group_epoch)
        if group.group_epoch > group.assignment_epoch:
            self._compute_target_assignment(group)
        if updated.is_reconciled_to(group.assignment_epoch):
            return updated
        try:
            reconciled = reconcile(updated, group.assignment_epoch, group.target_of(updated.member_id),
                                   group.partition_epoch, owned)
        except MemberFencedError as exc:
            raise HeartbeatError(ErrorCode.fenced_member_epoch, str(exc)) from None
        if reconciled != updated:
            group.update_member(reconciled)
        return reconciled

    # -- membership changes and timers ----------------------------------------------------------------

    def _all_timers(self) -> tuple[dict, ...]:
        return self._session_timers, self._rebalance_timers, self._join_timers, self._sync_timers

    def _remove(self, group: ConsumerGroup, member_id: str) -> None:
        group.remove_member(member_id)
        for timers in self._all_timers():
            self._cancel(timers, (group.group_id, member_id))

    def _fence(self, group: ConsumerGroup, member_id: str) -> bool:
        """Kafka's consumerGroupFenceMember: the member is gone and the group epoch goes up; or, if it was the
        last member of the consumer protocol and the policy allows, the group becomes a classic group
        (returns True: its records are already written)."""
        if self._downgrade_allowed(group, member_id):
            self._downgrade(group, member_id)
            return True
        self._remove(group, member_id)
        group.subscription_metadata = self._subscription_metadata(group)
        group.group_epoch += 1
        log.info("group %s: member %s removed, group epoch bumped to %d", group.group_id, member_id, group.group_epoch)
        return False

    def _downgrade_allowed(self, group: ConsumerGroup, leaving: str) -> bool:
        """Kafka 4's validateOnlineDowngrade: the policy allows it, every other member speaks the classic
        protocol, some remain, and no more than the classic group.max.size."""
        others = [m for m in group.members.values() if m.member_id != leaving]
        if not self.config.downgrade_enabled or not others or not all(m.uses_classic_protocol for m in others):
            return False
        if len(others) > self.classic.config.max_size:
            log.info("group %s: cannot downgrade the consumer group to a classic group because its %d members "
                     "exceed group.max.size", group.group_id, len(others))
            return False
        return True

    def _downgrade(self, group: ConsumerGroup, leaving: str) -> None:
        """Kafka 4's convertToClassicGroup: the consumer group's tombstones and the classic group (its members
        with their current partitions as assignments) are stored in one batch, and the classic group rebalances."""
        from pykbroker.groups.classic.group import Member

        gid = group.group_id
        stale = self._unsynced.pop(gid, set())
        written = set(group.members) | stale

        def stored(error: ErrorCode) -> None:
            if error != ErrorCode.none:  # the log may still hold the consumer group: the id's next consumer group
                log.warning("group %s: storing the downgrade failed (%s)", gid, error.name)
                self._unsynced[gid] = self._unsynced.get(gid, set()) | written  # writes it whole, these tombstoned

        self._forget(group)
        del self._groups[gid]
        names = {info.topic_id: info.name for info in self._topics()}
        members, assignments = [], {}
        for member in group.members.values():
            if member.member_id == leaving:
                continue
            assignments[member.member_id] = {names[tid]: parts for tid, parts in member.assigned.items()
                                             if tid in names}
            members.append(Member(
                member.member_id, member.instance_id, member.client_id, member.client_host,
                member.rebalance_timeout_ms, member.classic_session_timeout_ms, "consumer",
                list(member.classic_protocols)))
        log.info("group %s: member %s was the last of the consumer protocol: the group becomes a classic group",
                 gid, leaving)
        self.classic.adopt_downgraded_group(gid, group.group_epoch, members, assignments, tombstones(group, stale),
                                            stored)

    def _fence_and_store(self, group: ConsumerGroup, member_id: str) -> None:
        """A timer fences a member: its records go (nobody waits for the write)."""
        before = snapshot(group)
        if not self._fence(group, member_id):
            self._store_changes(group, before, None)

    def delete_group(self, group_id: str) -> ErrorCode:
        """DeleteGroups (Kafka's ConsumerGroup.validateDeleteGroup): only an empty group goes, with its offsets
        and records; NON_EMPTY_GROUP otherwise."""
        group = self._groups[group_id]
        if not group.is_empty():
            return ErrorCode.non_empty_group
        self.classic.store.delete(group_id, None, self._scheduler.now_ms())
        del self._groups[group_id]
        self._persist(group, tombstones(group, self._unsynced.pop(group_id, ())), None)
        log.info("group %s: deleted", group_id)
        return ErrorCode.none

    def subscribed_topics(self, group_id: str) -> set[str]:
        """The topics some member of the group subscribes to, by name or regex (OffsetDelete refuses them)."""
        group = self._groups[group_id]
        names = {name for member in group.members.values() for name in member.subscribed_topic_names}
        return names | set(group.subscription_metadata)

    def remove_if_finished(self, group_id: str) -> bool:
        """An empty group without offsets left is removed, its records tombstoned (Kafka's cleanup after
        offsets expiration); returns whether it was."""
        group = self._groups.get(group_id)
        if group is None or not group.is_empty() or self.classic.store.has_offsets(group_id):
            return False
        del self._groups[group_id]
        self._persist(group, tombstones(group, self._unsynced.pop(group_id, ())), None)
        log.info("group %s: no members and no offsets left, removed", group_id)
        return True

    def _session_timeout_ms(self, group_id: str) -> int:
        """Kafka's consumerGroupSessionTimeoutMs: the group's consumer.session.timeout.ms, else the broker's."""
        overrides = self.group_configs
        return overrides.session_timeout_ms(group_id) if overrides is not None else self.config.session_timeout_ms

    def _heartbeat_interval_ms(self, group_id: str) -> int:
        """Kafka's consumerGroupHeartbeatIntervalMs: the group's consumer.heartbeat.interval.ms, else the broker's."""
        overrides = self.group_configs
        return overrides.heartbeat_interval_ms(group_id) if overrides is not None else self.config.heartbeat_interval_ms

    def _schedule_session_timeout(self, group_id: str, member_id: str) -> None:
        def expire() -> None:
            self._session_timers.pop((group_id, member_id), None)
            group = self._groups.get(group_id)
            if group is not None and member_id in group.members:
                log.info("group %s: member %s fenced: its session expired", group_id, member_id)
                self._fence_and_store(group, member_id)

        group = self._groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        timeout_ms = (member.classic_session_timeout_ms if member is not None and member.uses_classic_protocol
                      else self._session_timeout_ms(group_id))  # a classic member's own session timeout
        self._arm(self._session_timers, (group_id, member_id), timeout_ms, expire)

    def _schedule_classic_timeout(self, timers: dict, what: str, group_id: str, member_id: str,
                                  timeout_ms: int) -> None:
        """Kafka's consumer group join / sync timeouts of a classic member: one that does not rejoin (or send its
        SyncGroup) within its rebalance timeout is fenced."""
        def expire() -> None:
            timers.pop((group_id, member_id), None)
            group = self._groups.get(group_id)
            if group is not None and member_id in group.members:
                log.info("group %s: classic member %s fenced: no %s within %d ms", group_id, member_id, what,
                         timeout_ms)
                self._fence_and_store(group, member_id)

        self._arm(timers, (group_id, member_id), timeout_ms, expire)

    def _schedule_rebalance_timeout(self, group_id: str, member: ConsumerGroupMember) -> None:
        epoch = member.member_epoch

        def expire() -> None:
            self._rebalance_timers.pop((group_id, member.member_id), None)
            group = self._groups.get(group_id)
            current = group.members.get(member.member_id) if group is not None else None
            if current is not None and current.member_epoch == epoch:
                log.info("group %s: member %s fenced: it did not revoke its partitions of epoch %d within %d ms",
                         group_id, member.member_id, epoch, member.rebalance_timeout_ms)
                self._fence_and_store(group, member.member_id)

        self._arm(self._rebalance_timers, (group_id, member.member_id), member.rebalance_timeout_ms, expire)

    def _arm(self, timers: dict, key: tuple[str, str], delay_ms: int, callback) -> None:
        self._cancel(timers, key)
        timers[key] = self._scheduler.call_later(delay_ms, callback)

    @staticmethod
    def _cancel(timers: dict, key: tuple[str, str]) -> None:
        timer = timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def _forget(self, group: ConsumerGroup) -> None:
        self._unsynced.pop(group.group_id, None)
        for member_id in group.members:
            for timers in self._all_timers():
                self._cancel(timers, (group.group_id, member_id))

    # -- subscriptions and the target assignment ------------------------------------------------------

    @staticmethod
    def _subscribed_names(member: ConsumerGroupMember, resolved: Mapping[str, frozenset[str]]) -> set[str]:
        """The member's topics: its names and what its regex matched (``resolved``: regex -> topic names)."""
        names = set(member.subscribed_topic_names)
        if member.subscribed_topic_regex:
            names |= resolved.get(member.subscribed_topic_regex, frozenset())
        return names

    def _subscription_metadata(self, group: ConsumerGroup) -> dict[str, TopicMetadata]:
        """The metadata of every existing topic some member subscribes to, by name or by regex (internal
        topics are never matched by a regex, as the Java client's pattern subscriptions never did); the
        group's regexes are resolved again (``group.resolved_regexes``). Computed again only when the topics
        (``topics_version``) or a subscription of the group changed: a heartbeat otherwise costs nothing here."""
        version = self._topics_version() if self._topics_version is not None else None
        key = (version, group.subscriptions_version)
        if version is not None and group.subscription_key == key:
            return group.subscription_metadata
        topics = {info.name: info for info in self._topics()}
        candidates = frozenset(name for name, info in topics.items() if not info.internal)
        group.resolved_regexes = {regex: self._resolve(regex, candidates, version) for regex in group.regex_subscribers}
        describable = self._describable.get(group)
        if describable is not None:  # Kafka 4 drops the matched topics the principal may not DESCRIBE
            group.resolved_regexes = {regex: frozenset(describable(names)) if names else names
                                      for regex, names in group.resolved_regexes.items()}
        wanted = set(group.subscribers).union(*group.resolved_regexes.values())
        group.subscription_key = key
        return {name: TopicMetadata(topics[name].topic_id, name, len(topics[name].partitions))
                for name in sorted(wanted) if name in topics}

    def _resolve(self, regex: str, candidates: frozenset[str], version: int | None) -> frozenset[str]:
        """The topics a regex matches, remembered once per regex for the latest topics version (or topic set)."""
        key = version if version is not None else candidates
        cached = self._resolved.get(regex)
        if cached is not None and cached[0] == key:
            return cached[1]
        matched = _matching_topics(regex, candidates)
        self._resolved[regex] = (key, matched)
        return matched

    def _compute_target_assignment(self, group: ConsumerGroup) -> None:
        """Kafka's TargetAssignmentBuilder: every member's target for the group epoch, by the group's assignor."""
        metadata = group.subscription_metadata
        members = {}
        for member_id, member in group.members.items():
            subscribed = frozenset(metadata[name].topic_id
                                   for name in self._subscribed_names(member, group.resolved_regexes)
                                   if name in metadata)
            members[member_id] = MemberSubscription(subscribed_topic_ids=subscribed,
                                                    assigned=dict(group.target_of(member_id)),
                                                    rack_id=member.rack_id, instance_id=member.instance_id)
        topics = {t.topic_id: AssignorTopic(t.name, t.num_partitions) for t in metadata.values()}
        name = group.preferred_assignor(self.config.assignors[0])
        try:
            result = assignor_for(name).assign(GroupSpec(members=members), topics=topics)
        except PartitionAssignorError as exc:
            raise HeartbeatError(ErrorCode.unknown_server_error,
                                 f"Failed to compute a new target assignment for epoch {group.group_epoch}: {exc}.")
        group.target_assignment = {member_id: freeze(result.get(member_id, {})) for member_id in group.members}
        group.assignment_epoch = group.group_epoch
        log.info("group %s: target assignment of epoch %d computed by %s", group.group_id, group.group_epoch, name)

    # -- OffsetCommit / OffsetFetch v9 --------------------------------------------------------------------

    def validate_offset_commit(self, group_id: str, member_id: str, member_epoch: int,
                               api_version: int | None) -> ErrorCode | None:
        """Kafka 4's ConsumerGroup.validateOffsetCommit: a commit without member epoch (-1) only while the group
        is empty; a member of the consumer protocol commits with OffsetCommit v9+ (``api_version``; None for
        a TxnOffsetCommit, which any version may send) and its current epoch; a classic member with any version
        and its member epoch as generation (ILLEGAL_GENERATION otherwise)."""
        group = self._groups[group_id]
        if member_epoch < 0 and group.is_empty():
            return None
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        if group.members[member_id].uses_classic_protocol:  # a classic member commits with its generation
            return None if member_epoch == group.members[member_id].member_epoch else ErrorCode.illegal_generation
        if api_version is not None and api_version < OFFSET_COMMIT_MIN_VERSION_FOR_CONSUMER_MEMBERS:
            return ErrorCode.unsupported_version
        if member_epoch != group.members[member_id].member_epoch:
            return ErrorCode.stale_member_epoch
        return None

    def validate_offset_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> ErrorCode | None:
        """Kafka 4's ConsumerGroup.validateOffsetFetch (OffsetFetch v9): an admin fetch names no member;
        otherwise the member must be known and at its current epoch."""
        group = self._groups.get(group_id)
        if group is None or (member_epoch < 0 and member_id is None):
            return None
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.unknown_member_id
        if member_epoch != member.member_epoch:
            return ErrorCode.stale_member_epoch
        return None

    # -- ConsumerGroupDescribe ------------------------------------------------------------------------------

    def describe(self, group_ids: Iterable[str]) -> list[DescribedGroup]:
        described = []
        for group_id in group_ids:
            error = self.classic.coordinator_error(group_id) if group_id else ErrorCode.invalid_group_id
            group = self._groups.get(group_id) if error is None else None
            if error is not None:
                described.append(DescribedGroup(group_id, error))
            elif group is None:
                message = (f"Group {group_id} is not a consumer group." if self.classic.group(group_id) is not None
                           else f"Group {group_id} not found.")
                described.append(DescribedGroup(group_id, ErrorCode.group_id_not_found, message))
            else:
                described.append(DescribedGroup(group_id, ErrorCode.none, None, group))
        return described

    def groups(self) -> list[ConsumerGroup]:
        return list(self._groups.values())


__all__ = ["ConsumerGroupConfig", "ConsumerGroupCoordinator", "HeartbeatRequest", "HeartbeatResult",
           "DescribedGroup", "GroupState", "compile_topic_regex", "assignor_name"]

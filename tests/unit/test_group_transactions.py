"""The group coordinator's side of transactions (Kafka's GroupCoordinator.handleTxnCommitOffsets,
GroupMetadataManager.storeOffsets with a producer id / handleTxnCompletion / loading with
pendingTransactionalOffsetCommits): TxnOffsetCommit checks, pending offsets per (group, producer) until the
marker, the log-order rule against plain commits, loading control batches and open transactions,
require_stable, and what deletion and expiry do with pending offsets. Real offset store on real logs; the
markers are written by the partition leader's side (ReplicaManager.append_marker, as WriteTxnMarkers does),
then ``on_transaction_marker`` is called."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pykbroker.groups.offset_store import (
    LOAD_BATCHES_PER_STEP,
    OFFSETS_TOPIC,
    CommittedOffset,
    OffsetStore,
    encode_offset_key,
    encode_offset_value,
)
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.records import TRANSACTIONAL_MASK, build_batch, read_records
from pykbroker.replication.replica_manager import ReplicaManager
import tests.unit.test_group_coordinator as coordinator_tests
from tests.unit.test_group_coordinator import PARTITIONS, TOPIC, Harness

GROUP = "txn-group"
PID, OTHER_PID = 4000, 4001
TP0, TP1 = (TOPIC, 0), (TOPIC, 1)


def write_marker(replicas: ReplicaManager, partition: int, producer_id: int, epoch: int, commit: bool) -> None:
    """The partition leader's side of WriteTxnMarkers: the marker appended to the offsets partition."""
    outcome = replicas.append_marker(OFFSETS_TOPIC, partition, producer_id=producer_id, producer_epoch=epoch,
                                     commit=commit, coordinator_epoch=0)
    assert outcome.error == ErrorCode.none, outcome


class TxnHarness(Harness):
    def txn_commit(self, offsets: dict, *, pid: int = PID, epoch: int = 0, group: str = GROUP, generation: int = -1,
                   member: str = "", instance: str | None = None) -> dict:
        answers = []
        self.coordinator.commit_transactional_offsets(
            group, pid, epoch, generation, member,
            {tp: (offset, -1, meta) for tp, (offset, meta) in ((tp, v if isinstance(v, tuple) else (v, ""))
                                                                for tp, v in offsets.items())},
            answers.append, group_instance_id=instance)
        (answer,) = answers  # a single broker answers at once
        return answer

    def marker(self, commit: bool, *, pid: int = PID, epoch: int = 0, group: str = GROUP) -> None:
        """What the partition leader does for WriteTxnMarkers: the marker in the log, then the callback."""
        partition = self.store.partition_for(group)
        write_marker(self.logs.replicas, partition, pid, epoch, commit)
        self.coordinator.on_transaction_marker(partition, pid, commit)

    def offsets(self, group: str = GROUP) -> dict:
        error, committed = self.coordinator.fetch_offsets(group, None)
        assert error == ErrorCode.none
        return {tp: c.offset for tp, c in committed.items()}


logs = coordinator_tests.logs  # the fixture: __consumer_offsets on disk


@pytest.fixture
def h(logs) -> TxnHarness:
    return TxnHarness(logs)


def _log_batches(h: TxnHarness, group: str = GROUP):
    hosted = h.logs.replicas.partition(OFFSETS_TOPIC, h.store.partition_for(group))
    return list(hosted.log.batches())


# -- pending until the marker ---------------------------------------------------------------------------


def test_txn_offsets_are_one_transactional_batch_and_pending_until_the_commit_marker(h):
    assert h.txn_commit({TP0: 10, TP1: (20, "meta")}) == {TP0: ErrorCode.none, TP1: ErrorCode.none}
    ((header, data),) = _log_batches(h)
    assert header.is_transactional and not header.is_control
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (PID, 0, -1)
    assert header.attributes & TRANSACTIONAL_MASK
    assert [r.key for r in read_records(data, header)] == [encode_offset_key(GROUP, TOPIC, 0),
                                                            encode_offset_key(GROUP, TOPIC, 1)]
    assert h.offsets() == {}  # invisible to OffsetFetch
    assert h.coordinator.fetch_offsets(GROUP, [TP0])[1] == {TP0: None}
    assert h.coordinator.unstable_offsets(GROUP, [TP0, TP1, (TOPIC, 2)]) == {TP0, TP1}
    h.marker(commit=True)
    assert h.offsets() == {TP0: 10, TP1: 20}
    assert h.coordinator.fetch_offsets(GROUP, [TP1])[1][TP1].metadata == "meta"
    assert h.coordinator.unstable_offsets(GROUP, [TP0, TP1]) == set()


def test_abort_marker_drops_the_pending_offsets_and_keeps_the_committed_ones(h):
    assert h.commit(GROUP, -1, "", offset=3) == ErrorCode.none
    h.txn_commit({TP0: 10})
    h.marker(commit=False)
    assert h.offsets() == {TP0: 3}
    assert h.coordinator.unstable_offsets(GROUP, [TP0]) == set()


def test_markers_complete_only_their_producers_offsets(h):
    h.txn_commit({TP0: 10}, pid=PID)
    h.txn_commit({TP1: 20}, pid=OTHER_PID)
    h.marker(commit=True, pid=OTHER_PID)
    assert h.offsets() == {TP1: 20}
    assert h.coordinator.unstable_offsets(GROUP, [TP0, TP1]) == {TP0}
    h.marker(commit=True, pid=PID)
    assert h.offsets() == {TP0: 10, TP1: 20}


def test_a_marker_completes_every_group_of_its_partition_with_offsets_of_that_producer(h):
    same = [g for g in (f"other-{i}" for i in range(200)) if h.store.partition_for(g) == h.store.partition_for(GROUP)]
    elsewhere = next(g for g in (f"far-{i}" for i in range(200))
                     if h.store.partition_for(g) != h.store.partition_for(GROUP))
    h.txn_commit({TP0: 1}, group=GROUP)
    h.txn_commit({TP0: 2}, group=same[0])
    h.txn_commit({TP0: 3}, group=elsewhere)
    h.marker(commit=True)  # in GROUP's partition only
    assert h.offsets(GROUP) == {TP0: 1} and h.offsets(same[0]) == {TP0: 2}
    assert h.offsets(elsewhere) == {} and h.coordinator.unstable_offsets(elsewhere, [TP0]) == {TP0}


def test_a_later_txn_commit_of_the_same_producer_replaces_its_pending_offset(h):
    h.txn_commit({TP0: 10})
    h.txn_commit({TP0: 11, TP1: 5})
    h.marker(commit=True)
    assert h.offsets() == {TP0: 11, TP1: 5}


# -- ordering against plain commits (Kafka's CommitRecordMetadataAndOffset rule) --------------------------


def test_a_plain_commit_written_after_the_txn_offsets_wins_over_them(h):
    h.txn_commit({TP0: 10, TP1: 10})
    assert h.commit(GROUP, -1, "", offset=50) == ErrorCode.none  # TP0, later in the log than the txn batch
    h.marker(commit=True)
    assert h.offsets() == {TP0: 50, TP1: 10}
    h.restart()  # the same from the log
    assert h.offsets() == {TP0: 50, TP1: 10}


def test_txn_offsets_written_after_a_plain_commit_replace_it(h):
    assert h.commit(GROUP, -1, "", offset=50) == ErrorCode.none
    h.txn_commit({TP0: 10})
    h.marker(commit=True)
    assert h.offsets() == {TP0: 10}
    h.restart()
    assert h.offsets() == {TP0: 10}


def test_a_plain_commit_after_the_marker_replaces_the_txn_offset(h):
    h.txn_commit({TP0: 10})
    h.marker(commit=True)
    assert h.commit(GROUP, -1, "", offset=7) == ErrorCode.none
    assert h.offsets() == {TP0: 7}


def test_record_offsets_are_not_part_of_a_committed_offsets_value():
    assert CommittedOffset(1, -1, "", 5, record_offset=3) == CommittedOffset(1, -1, "", 5, record_offset=9)
    assert CommittedOffset(1, -1, "", 5, record_offset=3).older_than(CommittedOffset(1, -1, "", 5, record_offset=9))


# -- loading ------------------------------------------------------------------------------------------------


def test_loading_replays_commits_aborts_and_keeps_open_transactions_pending(h, caplog):
    h.txn_commit({TP0: 10}, pid=PID)
    h.marker(commit=True, pid=PID)
    h.txn_commit({TP1: 20}, pid=OTHER_PID)
    h.marker(commit=False, pid=OTHER_PID)
    h.txn_commit({TP0: 30, TP1: 40}, pid=PID, epoch=1)  # still open at the restart
    with caplog.at_level(logging.WARNING, logger="pykbroker.groups.offset_store"):
        h.restart()
    assert not [r for r in caplog.records if "unreadable" in r.getMessage()]  # control batches are not offset keys
    assert h.offsets() == {TP0: 10}
    assert h.coordinator.unstable_offsets(GROUP, [TP0, TP1]) == {TP0, TP1}
    assert h.store.pending_producers(GROUP) == [PID]
    h.marker(commit=True, pid=PID, epoch=1)  # the marker comes after the restart
    assert h.offsets() == {TP0: 30, TP1: 40}
    h.restart()
    assert h.offsets() == {TP0: 30, TP1: 40}
    assert h.coordinator.unstable_offsets(GROUP, [TP0, TP1]) == set()


def test_a_group_known_only_by_pending_offsets_is_loaded_as_an_empty_group(h):
    h.txn_commit({TP0: 10}, group="only-pending")
    h.restart()
    group = h.coordinator.group("only-pending")
    assert group is not None and group.state.value == "Empty"
    assert h.coordinator.unstable_offsets("only-pending", [TP0]) == {TP0}


def test_a_tombstone_in_the_log_removes_the_committed_offset_not_the_pending_one(h):
    h.txn_commit({TP0: 10})
    h.marker(commit=True)
    h.txn_commit({TP0: 20}, epoch=1)
    hosted = h.logs.replicas.partition(OFFSETS_TOPIC, h.store.partition_for(GROUP))
    hosted.log.append(build_batch([(encode_offset_key(GROUP, TOPIC, 0), None)]), leader_epoch=0, now_ms=h.clock.now)
    h.restart()
    assert h.offsets() == {}
    h.marker(commit=True, epoch=1)
    assert h.offsets() == {TP0: 20}


def test_loading_reads_markers_appended_while_it_runs(logs):
    """Kafka's loader reads up to the log end it sees at each step: a marker written during the load (whose
    callback finds the partition still loading, and is ignored) is replayed by the load itself."""
    store = OffsetStore(logs.replicas, PARTITIONS)
    partition = store.partition_for(GROUP)
    hosted = logs.replicas.partition(OFFSETS_TOPIC, partition)
    txn = build_batch([(encode_offset_key(GROUP, TOPIC, 0), encode_offset_value(CommittedOffset(99, -1, "", 1)))],
                      producer_id=PID, producer_epoch=0, attributes=TRANSACTIONAL_MASK)
    assert logs.replicas.append(OFFSETS_TOPIC, partition, txn, acks=-1, min_insync_replicas=1,
                                origin="coordinator").error == ErrorCode.none
    for n in range(LOAD_BATCHES_PER_STEP * 2):  # enough batches for the load to yield to the loop
        value = encode_offset_value(CommittedOffset(n, -1, "", 1))
        hosted.log.append(build_batch([(encode_offset_key("filler", TOPIC, 1), value)]), leader_epoch=0, now_ms=1)

    async def load_with_a_marker_meanwhile() -> bool:
        load = asyncio.ensure_future(store.load_partition(partition))
        await asyncio.sleep(0)
        assert not load.done()
        write_marker(logs.replicas, partition, PID, 0, True)
        return await load

    assert asyncio.run(load_with_a_marker_meanwhile())
    assert store.fetch(GROUP) == {TP0: CommittedOffset(99, -1, "", 1)}
    assert not store.has_pending(GROUP)


# -- TxnOffsetCommit checks -------------------------------------------------------------------------------


def test_txn_commit_checks_member_generation_and_instance_from_v3(h):
    member, generation = h.stable_member(GROUP)
    ok = h.txn_commit({TP0: 1}, generation=generation, member=member)
    assert ok == {TP0: ErrorCode.none}
    assert h.txn_commit({TP0: 1}, generation=generation, member="stranger") == {TP0: ErrorCode.unknown_member_id}
    assert h.txn_commit({TP0: 1}, generation=generation + 1, member=member) == {TP0: ErrorCode.illegal_generation}
    # v0-2 name no member: accepted whatever the group's state (unlike a plain commit to a Stable group)
    assert h.txn_commit({TP0: 1}) == {TP0: ErrorCode.none}
    assert h.commit(GROUP, -1, "") == ErrorCode.unknown_member_id


def test_txn_commit_fences_an_old_static_member(h):
    first, _ = h.stable_member(GROUP, instance="instance-1")
    second_join = h.join(GROUP, instance="instance-1")  # the same instance comes back with a new member id
    h.clock.advance(0)
    second, generation = second_join.result.member_id, second_join.result.generation_id
    assert second != first
    assert h.txn_commit({TP0: 1}, generation=generation, member=first, instance="instance-1") == {
        TP0: ErrorCode.fenced_instance_id}
    assert h.txn_commit({TP0: 1}, generation=generation, member=second, instance="instance-1") == {
        TP0: ErrorCode.none}


def test_txn_commit_to_an_unknown_group_with_a_member_id_is_unknown_member_and_creates_the_group(h):
    assert h.txn_commit({TP0: 1}, group="new", generation=1, member="m") == {TP0: ErrorCode.unknown_member_id}
    assert h.coordinator.group("new") is not None  # Kafka adds the group before checking the member


def test_txn_commit_request_level_errors(h):
    assert h.txn_commit({TP0: 1}, group="") == {TP0: ErrorCode.invalid_group_id}
    assert h.txn_commit({TP0: 1, ("nope", 0): 2}, group="") == {  # partitions are checked first, as in Kafka
        TP0: ErrorCode.invalid_group_id, ("nope", 0): ErrorCode.unknown_topic_or_partition}
    assert h.txn_commit({TP0: 1, ("nope", 0): 2, (TOPIC, 99): 3}) == {
        TP0: ErrorCode.none, ("nope", 0): ErrorCode.unknown_topic_or_partition,
        (TOPIC, 99): ErrorCode.unknown_topic_or_partition}
    big = "x" * 4097
    assert h.txn_commit({TP0: (5, big), TP1: 6}) == {TP0: ErrorCode.offset_metadata_too_large, TP1: ErrorCode.none}
    h.marker(commit=True)
    assert h.offsets() == {TP0: 1, TP1: 6}  # the too-large one was never pending
    partition = h.store.partition_for(GROUP)
    h.coordinator.on_leadership_change(OFFSETS_TOPIC, partition, False)
    assert h.txn_commit({TP0: 1}) == {TP0: ErrorCode.not_coordinator}


def test_txn_commit_while_the_partition_loads_is_coordinator_load_in_progress(h):
    h.txn_commit({TP0: 1})
    partition = h.store.partition_for(GROUP)
    h.coordinator.on_leadership_change(OFFSETS_TOPIC, partition, False)

    async def commit_while_loading() -> dict:
        h.coordinator.on_leadership_change(OFFSETS_TOPIC, partition, True)
        answer = h.txn_commit({TP0: 2})
        while h.coordinator.loading_partitions:
            await asyncio.sleep(0)
        return answer

    assert asyncio.run(commit_while_loading()) == {TP0: ErrorCode.coordinator_load_in_progress}
    assert h.coordinator.unstable_offsets(GROUP, [TP0]) == {TP0}  # the first one, reloaded


def test_a_failed_append_leaves_nothing_pending(h):
    h.txn_commit({TP0: 1})
    h.store._min_insync_replicas = lambda: 2  # one replica in the ISR: the append is refused
    assert h.txn_commit({TP0: 2, TP1: 3}, epoch=0) == {TP0: ErrorCode.coordinator_not_available,
                                                       TP1: ErrorCode.coordinator_not_available}
    assert h.coordinator.unstable_offsets(GROUP, [TP0, TP1]) == {TP0}  # the first request's offset is still there
    h.marker(commit=True)
    assert h.offsets() == {TP0: 1}


def test_a_marker_for_a_partition_not_led_here_is_ignored(h):
    h.coordinator.on_transaction_marker(h.store.partition_for(GROUP), PID, True)  # nothing pending: no error
    h.txn_commit({TP0: 1})
    partition = h.store.partition_for(GROUP)
    h.coordinator.on_leadership_change(OFFSETS_TOPIC, partition, False)
    h.coordinator.on_transaction_marker(partition, PID, True)
    assert h.store.fetch(GROUP) == {}


# -- deletion and expiry ----------------------------------------------------------------------------------


def test_a_group_with_pending_txn_offsets_is_not_removed_as_finished(h):
    h.txn_commit({TP0: 1})
    h.clock.advance(h.config.offsets_retention_ms * 2)
    h.coordinator.expire_offsets()
    assert h.coordinator.group(GROUP) is not None
    h.marker(commit=False)
    h.coordinator.expire_offsets()
    assert h.coordinator.group(GROUP) is None


def test_delete_groups_drops_pending_txn_offsets(h):
    h.txn_commit({TP0: 1})
    assert h.coordinator.delete_groups([GROUP]) == {GROUP: ErrorCode.none}
    assert not h.store.has_pending(GROUP)
    h.marker(commit=True)  # the marker comes later: nothing to commit
    assert h.store.fetch(GROUP) == {}


def test_offset_delete_drops_pending_txn_offsets_of_those_partitions(h):
    h.txn_commit({TP0: 1, TP1: 2})
    error, results = h.coordinator.delete_offsets(GROUP, [TP0])
    assert error == ErrorCode.none and results == {TP0: ErrorCode.none}
    assert h.coordinator.unstable_offsets(GROUP, [TP0, TP1]) == {TP1}
    h.marker(commit=True)
    assert h.offsets() == {TP1: 2}


def test_deleting_a_topic_drops_its_pending_txn_offsets(h):
    h.txn_commit({TP0: 1})
    h.store.delete_topic(TOPIC)
    assert not h.store.has_pending(GROUP)


def test_a_plain_commit_waiting_for_its_acknowledgement_is_unstable_and_does_not_expire(h):
    """Kafka's pendingOffsetCommits: with followers a commit waits for the ISR; meanwhile require_stable
    answers UNSTABLE_OFFSET_COMMIT for it and expiry leaves that partition alone."""
    assert h.commit(GROUP, -1, "", offset=1) == ErrorCode.none
    held = []
    write = h.store._write
    h.store._write = lambda *args, **kwargs: held.append((args, kwargs))  # the append waits for followers
    answers = []
    h.coordinator.commit_offsets(GROUP, -1, "", {TP0: (2, -1, "")}, answers.append)
    assert answers == [] and h.coordinator.unstable_offsets(GROUP, [TP0, TP1]) == {TP0}
    h.clock.advance(h.config.offsets_retention_ms * 2)
    assert h.coordinator.expire_offsets() == 0
    h.store._write = write
    ((args, kwargs),) = held
    write(*args, **kwargs)  # acknowledged now
    assert answers == [{TP0: ErrorCode.none}]
    assert h.coordinator.unstable_offsets(GROUP, [TP0]) == set() and h.offsets() == {TP0: 2}


def test_a_txn_commit_without_a_producer_id_is_a_plain_commit_as_in_kafka(h):
    assert h.txn_commit({TP0: 8}, pid=-1, epoch=-1) == {TP0: ErrorCode.none}
    assert h.offsets() == {TP0: 8} and not h.store.has_pending(GROUP)
    ((header, _),) = _log_batches(h)
    assert not header.is_transactional


def test_a_txn_commit_verified_before_its_transactions_marker_cannot_reopen_it(h):
    """Review-2 finding 2 (Kafka's appendForGroup passes the verification guard to appendRecords): the
    guard of a TxnOffsetCommit verified in a transaction whose ABORT marker then reached the offsets
    partition is stale; the offset batch is refused, nothing is left pending."""
    partition = h.store.partition_for(GROUP)
    state = h.logs.replicas.partition(OFFSETS_TOPIC, partition).producer_state
    stale = state.maybe_start_verification(PID, -1, 0)
    write_marker(h.logs.replicas, partition, PID, 0, False)
    answers = []
    h.coordinator.commit_transactional_offsets(GROUP, PID, 0, -1, "", {TP0: (10, -1, "")}, answers.append,
                                               verification=stale)
    (answer,) = answers
    assert answer[TP0] != ErrorCode.none
    assert not h.store.has_pending(GROUP)
    fresh = state.maybe_start_verification(PID, -1, 0)
    answers.clear()
    h.coordinator.commit_transactional_offsets(GROUP, PID, 0, -1, "", {TP0: (10, -1, "")}, answers.append,
                                               verification=fresh)
    assert answers == [{TP0: ErrorCode.none}] and h.store.has_pending(GROUP)

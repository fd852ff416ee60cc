"""The group coordinator in a cluster: commits written through the ReplicaManager and answered only once the
ISR has them (two replica managers on real logs, the follower fetching through the real Fetch handler), and
groups loaded and unloaded as leadership of their __consumer_offsets partition comes and goes."""

from __future__ import annotations

import asyncio
import datetime
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from kio.schema.fetch.v12 import request as fr

from pykbroker.groups.classic.coordinator import GroupConfig, GroupCoordinator, JoinRequest
from pykbroker.groups.offset_store import LOAD_BATCHES_PER_STEP, OFFSETS_TOPIC, OffsetStore, coordinator_error
from pykbroker.log.config import LogConfig
from pykbroker.log.manager import LogManager
from pykbroker.protocol.apis import codec_for
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.framing import Request
from pykbroker.replication.replica_manager import ReplicaManager
from pykbroker.server.dispatch import RequestContext
from pykbroker.server.handlers.fetch import fetch as fetch_handler

TOPIC = "orders"
GROUP = "g"


def _manager(data_dir: Path, broker_id: int) -> ReplicaManager:
    return ReplicaManager(LogManager(data_dir, fsync="never"), broker_id, lambda topic: LogConfig())


def _coordinator(replicas: ReplicaManager, *, min_isr: int = 1, commit_timeout_ms: int = 30_000,
                 **config) -> GroupCoordinator:
    store = OffsetStore(replicas, 1, min_insync_replicas=lambda: min_isr, commit_timeout_ms=commit_timeout_ms)
    return GroupCoordinator(store, lambda topic, index: topic == TOPIC, GroupConfig(**config))


def _commit(coordinator: GroupCoordinator, offset: int, partition: int = 0, group: str = GROUP) -> list:
    answers: list = []
    coordinator.commit_offsets(group, -1, "", {(TOPIC, partition): (offset, -1, "")}, answers.append)
    return answers


def _follower_fetch(leader: ReplicaManager, follower: ReplicaManager, offset: int) -> None:
    """One fetch of replica 2 from the leader through the Fetch handler, appended on the follower."""
    body = fr.FetchRequest(
        cluster_id=None, replica_id=2, max_wait=datetime.timedelta(0), min_bytes=1, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
        topics=(fr.FetchTopic(topic=OFFSETS_TOPIC, partitions=(fr.FetchPartition(
            partition=0, current_leader_epoch=1, fetch_offset=offset, last_fetched_epoch=-1,
            log_start_offset=0, partition_max_bytes=1 << 20,
        ),)),),
        forgotten_topics_data=(),
    )
    broker = SimpleNamespace(replicas=leader, stats=None, metadata=SimpleNamespace(topic=lambda name: SimpleNamespace(name=name)))
    response = fetch_handler(RequestContext(broker, Request(1, 12, 7, "broker-2-fetcher-0", None, body,
                                                            codec_for(1, 12)), "test"), body)
    data = response.responses[0].partitions[0]
    assert data.error_code == ErrorCode.none
    records = b"".join(data.records.chunks(1 << 16)) if data.records else b""
    partition = follower.partition(OFFSETS_TOPIC, 0)
    if records:
        partition.append_as_follower(records, now_ms=int(time.time() * 1000))
    partition.update_high_watermark_from_leader(data.high_watermark)


async def _until(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


def test_a_commit_is_answered_only_after_the_follower_fetched_past_it(tmp_path):
    leader = _manager(tmp_path / "b1", 1)
    follower = _manager(tmp_path / "b2", 2)
    assert leader.become_leader(OFFSETS_TOPIC, 0, 1, (1, 2), (1, 2), 0) == ErrorCode.none
    assert follower.become_follower(OFFSETS_TOPIC, 0, 1, 1, (1, 2), (1, 2), 0) == ErrorCode.none
    coordinator = _coordinator(leader, min_isr=2)

    async def scenario() -> None:
        coordinator.on_leadership_change(OFFSETS_TOPIC, 0, True)
        assert coordinator.fetch_offsets(GROUP, None) == (ErrorCode.none, {})
        answers = _commit(coordinator, 42)
        await asyncio.sleep(0.01)
        assert answers == []  # appended on the leader, not yet on the follower
        assert coordinator.fetch_offsets(GROUP, None) == (ErrorCode.none, {})  # nor visible
        assert leader.partition(OFFSETS_TOPIC, 0).log.log_end_offset == 1

        _follower_fetch(leader, follower, 0)  # the follower gets the batch; the leader's HWM has not moved
        await asyncio.sleep(0.01)
        assert answers == [] and follower.partition(OFFSETS_TOPIC, 0).log.log_end_offset == 1

        _follower_fetch(leader, follower, 1)  # fetching past it moves the HWM: the commit completes
        await _until(lambda: answers, "the commit's answer")
        assert answers == [{(TOPIC, 0): ErrorCode.none}]
        error, offsets = coordinator.fetch_offsets(GROUP, None)
        assert error == ErrorCode.none and offsets[(TOPIC, 0)].offset == 42

    try:
        asyncio.run(scenario())
        # The follower's copy is a loadable __consumer_offsets: its coordinator, once leader, sees the commit.
        assert follower.become_leader(OFFSETS_TOPIC, 0, 2, (2,), (1, 2), 1) == ErrorCode.none
        successor = _coordinator(follower)

        async def take_over() -> None:
            successor.on_leadership_change(OFFSETS_TOPIC, 0, True)
            await _until(lambda: not successor.loading_partitions, "the successor's load")

        asyncio.run(take_over())
        assert successor.fetch_offsets(GROUP, None)[1][(TOPIC, 0)].offset == 42
    finally:
        leader.log_manager.shutdown()
        follower.log_manager.shutdown()


def test_a_commit_nobody_replicates_times_out_as_coordinator_not_available(tmp_path):
    leader = _manager(tmp_path / "b1", 1)
    assert leader.become_leader(OFFSETS_TOPIC, 0, 1, (1, 2), (1, 2), 0) == ErrorCode.none
    coordinator = _coordinator(leader, min_isr=2, commit_timeout_ms=50)

    async def scenario() -> None:
        coordinator.on_leadership_change(OFFSETS_TOPIC, 0, True)
        answers = _commit(coordinator, 7)
        await _until(lambda: answers, "the timeout")
        assert answers == [{(TOPIC, 0): ErrorCode.coordinator_not_available}]  # REQUEST_TIMED_OUT, mapped
        assert coordinator.fetch_offsets(GROUP, None) == (ErrorCode.none, {})
        # min.insync.replicas above the ISR: refused at once, mapped the same way (NOT_ENOUGH_REPLICAS)
        leader.partition(OFFSETS_TOPIC, 0).isr = frozenset({1})
        assert _commit(coordinator, 8) == [{(TOPIC, 0): ErrorCode.coordinator_not_available}]

    try:
        asyncio.run(scenario())
    finally:
        leader.log_manager.shutdown()


def test_groups_unload_on_resignation_and_come_back_on_re_election(tmp_path):
    replicas = _manager(tmp_path, 1)
    replicas.host(OFFSETS_TOPIC, 0, 0)
    # A long initial rebalance delay keeps a joining member parked in JoinGroup.
    coordinator = _coordinator(replicas, initial_rebalance_delay_ms=60_000, min_session_timeout_ms=1_000)
    commits = LOAD_BATCHES_PER_STEP * 3  # enough batches for the load to yield to the loop several times

    async def scenario() -> None:
        assert _commit(coordinator, 1) == [{(TOPIC, 0): ErrorCode.not_coordinator}]  # not led yet
        coordinator.on_leadership_change(OFFSETS_TOPIC, 0, True)  # an empty log: owned at once
        for offset in range(commits):
            assert _commit(coordinator, offset, partition=offset % 3) == [{(TOPIC, offset % 3): ErrorCode.none}]
        joined: list = []
        coordinator.join_group(JoinRequest("members", "", "consumer", [("range", b"")], 10_000, 10_000,
                                           require_known_member_id=False), joined.append)
        assert joined == [] and coordinator.group("members") is not None

        coordinator.on_leadership_change(OFFSETS_TOPIC, 0, False)  # resign: Kafka's onResignation
        assert [j.error for j in joined] == [ErrorCode.not_coordinator]
        assert coordinator.group(GROUP) is None and coordinator.group("members") is None
        assert coordinator.fetch_offsets(GROUP, None) == (ErrorCode.not_coordinator, {})
        assert _commit(coordinator, 9) == [{(TOPIC, 0): ErrorCode.not_coordinator}]
        assert coordinator.heartbeat("members", "x", None, 1) == ErrorCode.not_coordinator
        assert coordinator.describe_group(GROUP)[0] == ErrorCode.not_coordinator

        # Re-elected: lead, follow, lead again in one step; the first load is abandoned, the second counts.
        coordinator.on_leadership_change(OFFSETS_TOPIC, 0, True)
        coordinator.on_leadership_change(OFFSETS_TOPIC, 0, False)
        coordinator.on_leadership_change(OFFSETS_TOPIC, 0, True)
        assert coordinator.loading_partitions == {0}
        assert coordinator.fetch_offsets(GROUP, None) == (ErrorCode.coordinator_load_in_progress, {})
        assert _commit(coordinator, 9) == [{(TOPIC, 0): ErrorCode.coordinator_load_in_progress}]
        assert coordinator.list_groups()[0] == ErrorCode.coordinator_load_in_progress
        await asyncio.sleep(0)
        assert coordinator.loading_partitions == {0}  # still loading after yielding once: a load in steps
        await _until(lambda: not coordinator.loading_partitions, "the load")

        error, offsets = coordinator.fetch_offsets(GROUP, None)
        assert error == ErrorCode.none
        assert {tp: c.offset for tp, c in offsets.items()} == {(TOPIC, p): commits - 3 + p for p in range(3)}
        assert coordinator.list_groups() == (ErrorCode.none, [coordinator.group(GROUP).overview()])
        assert _commit(coordinator, 500) == [{(TOPIC, 0): ErrorCode.none}]

    try:
        asyncio.run(scenario())
    finally:
        coordinator.close()
        replicas.log_manager.shutdown()


def test_a_sync_group_answer_waits_for_the_assignment_to_be_replicated(tmp_path):
    leader = _manager(tmp_path / "b1", 1)
    follower = _manager(tmp_path / "b2", 2)
    assert leader.become_leader(OFFSETS_TOPIC, 0, 1, (1, 2), (1, 2), 0) == ErrorCode.none
    assert follower.become_follower(OFFSETS_TOPIC, 0, 1, 1, (1, 2), (1, 2), 0) == ErrorCode.none
    coordinator = _coordinator(leader, min_isr=2, initial_rebalance_delay_ms=0, min_session_timeout_ms=1_000)

    async def scenario() -> None:
        coordinator.on_leadership_change(OFFSETS_TOPIC, 0, True)
        joined: list = []
        coordinator.join_group(JoinRequest(GROUP, "", "consumer", [("range", b"")], 10_000, 10_000,
                                           require_known_member_id=False), joined.append)
        await _until(lambda: joined, "the join")
        member, generation = joined[0].member_id, joined[0].generation_id
        synced: list = []
        coordinator.sync_group(GROUP, generation, member, "consumer", "range", None, {member: b"all"}, synced.append)
        await asyncio.sleep(0.01)
        assert synced == []  # the group's metadata is on the leader only
        _follower_fetch(leader, follower, 0)
        _follower_fetch(leader, follower, leader.partition(OFFSETS_TOPIC, 0).log.log_end_offset)
        await _until(lambda: synced, "the sync answer")
        assert synced[0].error == ErrorCode.none and synced[0].assignment == b"all"

    try:
        asyncio.run(scenario())
    finally:
        coordinator.close()
        leader.log_manager.shutdown()
        follower.log_manager.shutdown()


@pytest.mark.parametrize("error, for_offsets, for_group", [
    (ErrorCode.none, ErrorCode.none, ErrorCode.none),
    (ErrorCode.not_enough_replicas, ErrorCode.coordinator_not_available, ErrorCode.coordinator_not_available),
    (ErrorCode.not_enough_replicas_after_append, ErrorCode.coordinator_not_available,
     ErrorCode.coordinator_not_available),
    (ErrorCode.request_timed_out, ErrorCode.coordinator_not_available, ErrorCode.coordinator_not_available),
    (ErrorCode.unknown_topic_or_partition, ErrorCode.coordinator_not_available, ErrorCode.coordinator_not_available),
    (ErrorCode.not_leader_or_follower, ErrorCode.not_coordinator, ErrorCode.not_coordinator),
    (ErrorCode.kafka_storage_error, ErrorCode.not_coordinator, ErrorCode.not_coordinator),
    (ErrorCode.message_too_large, ErrorCode.invalid_commit_offset_size, ErrorCode.unknown_server_error),
    (ErrorCode.record_list_too_large, ErrorCode.invalid_commit_offset_size, ErrorCode.unknown_server_error),
    (ErrorCode.corrupt_message, ErrorCode.corrupt_message, ErrorCode.corrupt_message),  # passed through
])
def test_append_errors_are_mapped_as_kafkas_group_metadata_manager(error, for_offsets, for_group):
    assert coordinator_error(error, offsets=True) == for_offsets
    assert coordinator_error(error, offsets=False) == for_group

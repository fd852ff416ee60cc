"""The transaction coordinator (pykbroker/txn): the __transaction_state record codec, TransactionMetadata's
state machine, TransactionCoordinator's answers (every transition and error), loading and failover, the
timeouts, and the marker sender's retries. __transaction_state is real (a ReplicaManager over logs on disk,
leading every partition as a single broker); the partition leaders that get the markers are fakes."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest
from kio.schema.write_txn_markers.v1 import response as wtm_response

from pykbroker.log.config import LogConfig
from pykbroker.log.manager import LogManager
from pykbroker.protocol.client import ConnectionLost
from pykbroker.protocol.errors import ErrorCode
from pykbroker.replication.replica_manager import ReplicaManager
from pykbroker.txn.coordinator import TransactionCoordinator, TxnConfig
from pykbroker.txn.log import (
    TRANSACTION_STATE_TOPIC,
    TxnLogValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from pykbroker.txn.metadata import (
    SHORT_MAX,
    IllegalTransition,
    TransactionMetadata,
    TransactionState,
)
from pykbroker.txn.state_manager import TransactionStateManager

S = TransactionState
E = ErrorCode
PARTITIONS = 4
TOPIC = "orders"


# -- the record codec ---------------------------------------------------------------------------------


def test_key_is_kafkas_transaction_log_key_v0():
    assert encode_key("tx") == b"\x00\x00\x00\x02tx"
    assert decode_key(encode_key("tx-é")) == "tx-é"
    assert decode_key(b"\x00\x05\x00\x02tx") is None  # an unknown key version is skipped


def test_value_layout_is_kafkas_transaction_log_value_v0():
    value = TxnLogValue(7, 3, 60000, S.ONGOING, frozenset({("b", 1), ("a", 0), ("a", 2)}), 1234, 1000)
    data = encode_value(value)
    expected = (struct.pack(">hqhib", 0, 7, 3, 60000, 1) + struct.pack(">i", 2)
                + b"\x00\x01a" + struct.pack(">iii", 2, 0, 2) + b"\x00\x01b" + struct.pack(">ii", 1, 1)
                + struct.pack(">qq", 1234, 1000))
    assert data == expected
    assert decode_value(data) == value


def test_empty_transaction_writes_null_partitions():
    value = TxnLogValue(7, 0, 60000, S.EMPTY, frozenset(), 5, -1)
    data = encode_value(value)
    assert data[struct.calcsize(">hqhib"):][:4] == b"\xff\xff\xff\xff"
    assert decode_value(data) == value
    with pytest.raises(ValueError):
        encode_value(TxnLogValue(7, 0, 60000, S.EMPTY, frozenset({("a", 0)}), 5, -1))


@pytest.mark.parametrize("state", list(TransactionState))
def test_every_status_round_trips(state):
    partitions = frozenset() if state is S.EMPTY else frozenset({("t", 0)})
    value = TxnLogValue(1, 2, 3, state, partitions, 4, 5)
    assert decode_value(encode_value(value)) == value


def test_flexible_value_v1_is_read():
    data = (struct.pack(">hqhib", 1, 9, 4, 1000, 2) + bytes([2]) + bytes([2]) + b"t" + bytes([2])
            + struct.pack(">i", 3) + bytes([0]) + struct.pack(">qq", 10, 8) + bytes([0]))
    assert decode_value(data) == TxnLogValue(9, 4, 1000, S.PREPARE_COMMIT, frozenset({("t", 3)}), 10, 8)
    with pytest.raises(ValueError):
        decode_value(struct.pack(">h", 7))


# -- the state machine --------------------------------------------------------------------------------


def test_transitions_follow_kafkas_valid_previous_states():
    m = TransactionMetadata("tx", 1, -1, 0, -1, 1000, S.EMPTY, last_update_ms=0)
    with pytest.raises(IllegalTransition):
        m.prepare_abort_or_commit(S.PREPARE_COMMIT, 1)  # Empty -> PrepareCommit
    transit = m.prepare_add_partitions({("t", 0)}, 10)
    with pytest.raises(IllegalTransition):  # a pending transition blocks every other
        m.prepare_add_partitions({("t", 1)}, 11)
    m.complete_transition(transit)
    assert (m.state, m.partitions, m.start_ms) == (S.ONGOING, {("t", 0)}, 10)
    with pytest.raises(IllegalTransition):
        m.prepare_dead()  # Ongoing -> Dead
    m.complete_transition(m.prepare_abort_or_commit(S.PREPARE_ABORT, 12))
    m.complete_transition(m.prepare_complete(13))
    assert (m.state, m.partitions) == (S.COMPLETE_ABORT, set())
    with pytest.raises(IllegalTransition):
        m.complete_transition(transit)  # nothing pending


def test_epoch_fence_bumps_once_even_if_its_write_failed():
    m = TransactionMetadata("tx", 1, -1, 5, -1, 1000, S.ONGOING, {("t", 0)}, 1, 1)
    assert m.prepare_fence_producer_epoch().producer_epoch == 6
    m.pending_state = None
    m.producer_epoch = 6
    m.has_failed_epoch_fence = True
    assert m.prepare_fence_producer_epoch().producer_epoch == 6


def test_increment_epoch_kip_360_rules():
    m = TransactionMetadata("tx", 1, -1, 5, 4, 1000, S.EMPTY)
    assert m.prepare_increment_producer_epoch(1000, 3, 0) == "PRODUCER_FENCED"
    assert m.pending_state is None
    retried = m.prepare_increment_producer_epoch(1000, 4, 0)  # the last epoch: a retry, no new bump
    assert (retried.producer_epoch, retried.last_producer_epoch) == (5, 4)


# -- a coordinator over a real __transaction_state ---------------------------------------------------------


class Leaders:
    """The partition leaders that get WriteTxnMarkers: scripted errors, a log of what they got."""

    def __init__(self) -> None:
        self.received: list[tuple[int, int, int, bool, str, int, int]] = []  # broker, pid, epoch, commit, tp, coord
        self.errors: dict[tuple[str, int], list[ErrorCode]] = {}
        self.leaders: dict[tuple[str, int], int | None] = {}
        self.hold: asyncio.Event | None = None  # set: answer; unset: hold every request
        self.fail_requests = 0

    def leader_of(self, topic: str, index: int) -> int | None:
        return self.leaders.get((topic, index), 1)

    async def send(self, broker: int, request) -> object:
        if self.hold is not None:
            await self.hold.wait()
        if self.fail_requests:
            self.fail_requests -= 1
            raise ConnectionLost("gone")
        results = []
        for marker in request.markers:
            topics = []
            for topic in marker.topics:
                parts = []
                for index in topic.partition_indexes:
                    self.received.append((broker, marker.producer_id, marker.producer_epoch, marker.transaction_result,
                                          topic.name, index, marker.coordinator_epoch))
                    scripted = self.errors.get((topic.name, index))
                    error = scripted.pop(0) if scripted else E.none
                    parts.append(wtm_response.WritableTxnMarkerPartitionResult(partition_index=index, error_code=error))
                topics.append(wtm_response.WritableTxnMarkerTopicResult(name=topic.name, partitions=tuple(parts)))
            results.append(wtm_response.WritableTxnMarkerResult(producer_id=marker.producer_id, topics=tuple(topics)))
        return wtm_response.WriteTxnMarkersResponse(markers=tuple(results))


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


class World:
    """A broker's transaction coordinator over logs in ``root``; ``restart`` is a new coordinator over the
    same logs (a failover: the partitions are loaded with a newer leader epoch)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.leaders = Leaders()
        self.clock = Clock()
        self.next_id = 100
        self.epoch = 0
        self.replicas = None
        self._open()

    def _open(self) -> None:
        self.replicas = ReplicaManager(LogManager(self.root, fsync="never"), 1, lambda topic: LogConfig())
        self.replicas.log_manager.load_all(lambda topic: LogConfig())
        for index in range(PARTITIONS):
            self.replicas.host(TRANSACTION_STATE_TOPIC, index, self.epoch)
        self.state = TransactionStateManager(self.replicas, PARTITIONS)
        self.coordinator = TransactionCoordinator(self.state, self.new_id, lambda index: self.epoch,
                                                  TxnConfig(max_timeout_ms=900000, id_expiration_ms=10_000),
                                                  now_ms=self.clock)
        self.coordinator.make_marker_sender(1, leader_of=self.leaders.leader_of, address_of=lambda b: None,
                                            send_request=self.leaders.send, retry_backoff_s=0.01)

    async def new_id(self):
        self.next_id += 1
        return E.none, self.next_id

    async def lead_all(self) -> None:
        for index in range(PARTITIONS):
            self.coordinator.on_leadership_change(TRANSACTION_STATE_TOPIC, index, True)
        await wait_for(lambda: self.state.owned_partitions == frozenset(range(PARTITIONS)))

    async def restart(self) -> None:
        await self.coordinator.close()
        self.replicas.log_manager.shutdown()
        self.epoch += 1
        self._open()
        await self.lead_all()

    def meta(self, tid: str) -> TransactionMetadata:
        error, _, metadata = self.state.get_state(tid)
        assert error == E.none and metadata is not None
        return metadata

    async def close(self) -> None:
        await self.coordinator.close()
        self.replicas.log_manager.shutdown()


async def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


def run(tmp_path, scenario) -> None:
    async def main() -> None:
        world = World(tmp_path / "data")
        try:
            await world.lead_all()
            await scenario(world)
        finally:
            await world.close()

    asyncio.run(main())


async def begin(world: World, tid: str, partitions=((TOPIC, 0), (TOPIC, 1)), timeout_ms: int = 60000):
    error, pid, epoch = await world.coordinator.handle_init_producer_id(tid, timeout_ms)
    assert error == E.none
    assert await world.coordinator.handle_add_partitions(tid, pid, epoch, partitions) == E.none
    return pid, epoch


def test_init_producer_id_new_id_then_epoch_bumps(tmp_path):
    async def scenario(w: World) -> None:
        c = w.coordinator
        assert await c.handle_init_producer_id("tx", 60000) == (E.none, 101, 0)
        assert await c.handle_init_producer_id("tx", 60000) == (E.none, 101, 1)  # fences the previous producer
        assert await c.handle_init_producer_id("tx", 900001) == (E.invalid_transaction_timeout, -1, -1)
        assert await c.handle_init_producer_id("tx", 0) == (E.invalid_transaction_timeout, -1, -1)
        assert await c.handle_init_producer_id("", 60000) == (E.invalid_request, -1, -1)
        assert await c.handle_init_producer_id("tx", 60000, 101, -1) == (E.invalid_request, -1, -1)
        m = w.meta("tx")
        assert (m.state, m.producer_epoch, m.timeout_ms) == (S.EMPTY, 1, 60000)

    run(tmp_path, scenario)


def test_kip_360_reinit(tmp_path):
    async def scenario(w: World) -> None:
        c = w.coordinator
        await c.handle_init_producer_id("tx", 60000)
        assert await c.handle_init_producer_id("tx", 60000, 101, 0) == (E.none, 101, 1)
        assert await c.handle_init_producer_id("tx", 60000, 101, 0) == (E.none, 101, 1)  # retried: same epoch
        assert await c.handle_init_producer_id("tx", 60000) == (E.none, 101, 2)  # a new producer
        assert await c.handle_init_producer_id("tx", 60000, 101, 0) == (E.producer_fenced, -1, -1)
        assert await c.handle_init_producer_id("tx", 60000, 55, 2) == (E.producer_fenced, -1, -1)

    run(tmp_path, scenario)


def test_epoch_exhaustion_rotates_the_producer_id(tmp_path):
    async def scenario(w: World) -> None:
        c = w.coordinator
        await c.handle_init_producer_id("tx", 60000)
        w.meta("tx").producer_epoch = SHORT_MAX - 1
        assert await c.handle_init_producer_id("tx", 60000) == (E.none, 102, 0)
        m = w.meta("tx")
        assert (m.last_producer_id, m.last_producer_epoch) == (101, -1)

    run(tmp_path, scenario)


def test_add_partitions_errors(tmp_path):
    async def scenario(w: World) -> None:
        c = w.coordinator
        assert await c.handle_add_partitions("nobody", 1, 0, [(TOPIC, 0)]) == E.invalid_producer_id_mapping
        assert await c.handle_add_partitions("", 1, 0, [(TOPIC, 0)]) == E.invalid_request
        pid, epoch = await begin(w, "tx")
        assert await c.handle_add_partitions("tx", pid + 1, epoch, [(TOPIC, 0)]) == E.invalid_producer_id_mapping
        assert await c.handle_add_partitions("tx", pid, epoch + 1, [(TOPIC, 0)]) == E.producer_fenced
        assert await c.handle_add_partitions("tx", pid, epoch, [(TOPIC, 1)]) == E.none  # already in: no write
        assert await c.handle_add_partitions("tx", pid, epoch, [(TOPIC, 2)]) == E.none
        m = w.meta("tx")
        assert (m.state, m.partitions) == (S.ONGOING, {(TOPIC, 0), (TOPIC, 1), (TOPIC, 2)})
        assert c.handle_verify_partitions("tx", pid, epoch, [(TOPIC, 2), (TOPIC, 3)]) == {
            (TOPIC, 2): E.none, (TOPIC, 3): E.invalid_txn_state}
        assert c.handle_verify_partitions("tx", pid, epoch + 1, [(TOPIC, 2)]) == {(TOPIC, 2): E.producer_fenced}
        assert c.handle_verify_partitions("tx", pid + 1, epoch, [(TOPIC, 2)]) == {
            (TOPIC, 2): E.invalid_producer_id_mapping}
        assert c.handle_verify_partitions("", pid, epoch, [(TOPIC, 2)]) == {(TOPIC, 2): E.invalid_request}

    run(tmp_path, scenario)


def test_commit_writes_markers_then_completes(tmp_path):
    async def scenario(w: World) -> None:
        c = w.coordinator
        pid, epoch = await begin(w, "tx")
        assert await c.handle_end_txn("tx", pid, epoch, commit=True) == E.none
        await wait_for(lambda: w.meta("tx").state is S.COMPLETE_COMMIT)
        assert sorted(w.leaders.received) == [(1, pid, epoch, True, TOPIC, 0, 0), (1, pid, epoch, True, TOPIC, 1, 0)]
        assert w.meta("tx").partitions == set()
        # A retried EndTxn after completion: the same result is NONE, the other INVALID_TXN_STATE.
        assert await c.handle_end_txn("tx", pid, epoch, commit=True) == E.none
        assert await c.handle_end_txn("tx", pid, epoch, commit=False) == E.invalid_txn_state
        # Empty: nothing to end.
        assert await c.handle_init_producer_id("tx", 60000) == (E.none, pid, epoch + 1)
        assert await c.handle_end_txn("tx", pid, epoch + 1, commit=True) == E.invalid_txn_state
        assert await c.handle_end_txn("tx", pid, epoch, commit=True) == E.producer_fenced
        assert await c.handle_end_txn("tx", pid + 5, epoch + 1, commit=True) == E.invalid_producer_id_mapping
        assert await c.handle_end_txn("nobody", 1, 0, commit=True) == E.invalid_producer_id_mapping

    run(tmp_path, scenario)


def test_requests_while_markers_are_pending_get_concurrent_transactions(tmp_path):
    async def scenario(w: World) -> None:
        c = w.coordinator
        w.leaders.hold = asyncio.Event()
        pid, epoch = await begin(w, "tx")
        assert await c.handle_end_txn("tx", pid, epoch, commit=False) == E.none
        assert w.meta("tx").state is S.PREPARE_ABORT
        assert await c.handle_end_txn("tx", pid, epoch, commit=False) == E.concurrent_transactions
        # The completion is pending (Kafka's pendingState CompleteAbort): whatever the result asked.
        assert await c.handle_end_txn("tx", pid, epoch, commit=True) == E.concurrent_transactions
        assert await c.handle_add_partitions("tx", pid, epoch, [(TOPIC, 3)]) == E.concurrent_transactions
        assert await c.handle_init_producer_id("tx", 60000) == (E.concurrent_transactions, -1, -1)
        assert c.handle_verify_partitions("tx", pid, epoch, [(TOPIC, 0)]) == {(TOPIC, 0): E.concurrent_transactions}
        w.leaders.hold.set()
        await wait_for(lambda: w.meta("tx").state is S.COMPLETE_ABORT)
        assert await c.handle_init_producer_id("tx", 60000) == (E.none, pid, epoch + 1)

    run(tmp_path, scenario)


def test_init_during_an_ongoing_transaction_aborts_it_with_a_bumped_epoch(tmp_path):
    """As the capture of Kafka 3.7.1 shows: CONCURRENT_TRANSACTIONS, abort markers with epoch + 1, then the
    retried InitProducerId gets epoch + 2."""
    async def scenario(w: World) -> None:
        c = w.coordinator
        pid, epoch = await begin(w, "tx", [(TOPIC, 0)])
        assert await c.handle_init_producer_id("tx", 60000) == (E.concurrent_transactions, -1, -1)
        await wait_for(lambda: w.meta("tx").state is S.COMPLETE_ABORT)
        assert w.leaders.received == [(1, pid, epoch + 1, False, TOPIC, 0, 0)]
        assert await c.handle_init_producer_id("tx", 60000) == (E.none, pid, epoch + 2)
        # The old producer is fenced.
        assert await c.handle_add_partitions("tx", pid, epoch, [(TOPIC, 0)]) == E.producer_fenced

    run(tmp_path, scenario)


def test_marker_retries_re_resolve_the_leader_and_survive_connection_loss(tmp_path):
    async def scenario(w: World) -> None:
        c = w.coordinator
        pid, epoch = await begin(w, "tx", [(TOPIC, 0), (TOPIC, 1)])
        w.leaders.errors[(TOPIC, 0)] = [E.not_leader_or_follower, E.not_enough_replicas]
        w.leaders.fail_requests = 1
        w.leaders.leaders[(TOPIC, 1)] = -1  # no leader just now: retried, not skipped
        assert await c.handle_end_txn("tx", pid, epoch, commit=True) == E.none
        await asyncio.sleep(0.005)
        w.leaders.leaders[(TOPIC, 0)] = 3  # the leader moved
        w.leaders.leaders[(TOPIC, 1)] = 2
        await wait_for(lambda: w.meta("tx").state is S.COMPLETE_COMMIT)
        sent_to = {(broker, index) for broker, _, _, _, _, index, _ in w.leaders.received}
        assert (3, 0) in sent_to and (2, 1) in sent_to
        assert len([r for r in w.leaders.received if r[5] == 0]) >= 3  # two errors, then success

    run(tmp_path, scenario)


def test_a_deleted_topic_counts_as_done_and_a_fenced_coordinator_stops(tmp_path):
    async def scenario(w: World) -> None:
        c = w.coordinator
        pid, epoch = await begin(w, "tx", [(TOPIC, 0), ("gone", 0)])
        w.leaders.leaders[("gone", 0)] = None
        assert await c.handle_end_txn("tx", pid, epoch, commit=True) == E.none
        await wait_for(lambda: w.meta("tx").state is S.COMPLETE_COMMIT)
        assert [r[4] for r in w.leaders.received] == [TOPIC]
        # A transaction whose only partition is gone completes without any marker.
        pid, epoch = await begin(w, "tx2", [("gone", 0)])
        assert await c.handle_end_txn("tx2", pid, epoch, commit=False) == E.none
        await wait_for(lambda: w.meta("tx2").state is S.COMPLETE_ABORT)
        # TRANSACTION_COORDINATOR_FENCED: a newer coordinator has it; no completion is written here.
        pid, epoch = await begin(w, "tx3", [(TOPIC, 2)])
        w.leaders.errors[(TOPIC, 2)] = [E.transaction_coordinator_fenced]
        assert await c.handle_end_txn("tx3", pid, epoch, commit=True) == E.none
        await wait_for(lambda: not c.markers.has_pending("tx3"))
        await asyncio.sleep(0.05)
        assert w.meta("tx3").state is S.PREPARE_COMMIT

    run(tmp_path, scenario)


def test_failover_loads_the_state_and_resends_prepared_markers(tmp_path):
    async def scenario(w: World) -> None:
        c = w.coordinator
        pid, epoch = await begin(w, "tx", [(TOPIC, 0)])
        await begin(w, "ongoing", [(TOPIC, 1)])
        w.leaders.hold = asyncio.Event()  # the markers never get through before the "crash"
        assert await c.handle_end_txn("tx", pid, epoch, commit=True) == E.none
        await w.restart()  # new coordinator epoch 1
        assert w.meta("tx").state is S.PREPARE_COMMIT  # loaded, its markers queued again
        assert w.leaders.received == []
        w.leaders.hold.set()
        await wait_for(lambda: w.meta("tx").state is S.COMPLETE_COMMIT)
        assert (1, pid, epoch, True, TOPIC, 0, 1) in w.leaders.received  # coordinator epoch 1
        assert w.meta("ongoing").state is S.ONGOING
        assert w.meta("ongoing").partitions == {(TOPIC, 1)}
        # InitProducerId after the failover bumps the epoch of the loaded id.
        assert await w.coordinator.handle_init_producer_id("tx", 60000) == (E.none, pid, epoch + 1)

    run(tmp_path, scenario)


def test_loading_and_not_coordinating(tmp_path):
    async def scenario(w: World) -> None:
        c = w.coordinator
        await begin(w, "tx")
        index = w.state.partition_for("tx")
        c.on_leadership_change(TRANSACTION_STATE_TOPIC, index, False)
        assert await c.handle_init_producer_id("tx", 60000) == (E.not_coordinator, -1, -1)
        assert c.describe("tx") == (E.not_coordinator, None)
        w.state.loading.add(index)
        assert await c.handle_end_txn("tx", 101, 0, True) == E.coordinator_load_in_progress
        assert c.list_transactions([], [])[0] == E.coordinator_load_in_progress
        w.state.loading.discard(index)
        w.epoch = 3
        c.on_leadership_change(TRANSACTION_STATE_TOPIC, index, True)
        w.epoch = 4  # a newer leader epoch while loading: loaded again with it
        c.on_leadership_change(TRANSACTION_STATE_TOPIC, index, True)
        await wait_for(lambda: index in w.state.owned_partitions)
        assert w.meta("tx").state is S.ONGOING
        assert w.state.get_state("tx")[1] == 4
        c.on_leadership_change(TRANSACTION_STATE_TOPIC, index, True)  # same epoch: nothing happens
        assert c.loading_partitions == frozenset() and w.state.get_state("tx")[1] == 4

    run(tmp_path, scenario)


def test_a_write_acknowledged_after_the_partition_moved_is_not_applied(tmp_path):
    async def scenario(w: World) -> None:
        c = w.coordinator
        await c.handle_init_producer_id("tx", 60000)
        index = w.state.partition_for("tx")
        partition = w.replicas.partition(TRANSACTION_STATE_TOPIC, index)
        partition._set_role(type(partition.role).FOLLOWER)  # appends fail NOT_LEADER_OR_FOLLOWER
        assert await c.handle_add_partitions("tx", 101, 0, [(TOPIC, 0)]) == E.not_coordinator
        assert w.meta("tx").pending_state is None  # a failed write leaves nothing pending

    run(tmp_path, scenario)


def test_timed_out_transactions_are_aborted_with_a_bumped_epoch(tmp_path):
    async def scenario(w: World) -> None:
        c = w.coordinator
        pid, epoch = await begin(w, "slow", [(TOPIC, 0)], timeout_ms=1000)
        await begin(w, "fast", [(TOPIC, 1)], timeout_ms=60000)
        assert c.abort_timed_out_transactions() == 0
        w.clock.now += 1001
        assert c.abort_timed_out_transactions() == 1
        await wait_for(lambda: w.meta("slow").state is S.COMPLETE_ABORT)
        assert w.meta("slow").producer_epoch == epoch + 1
        assert w.leaders.received == [(1, pid, epoch + 1, False, TOPIC, 0, 0)]
        assert w.meta("fast").state is S.ONGOING
        assert await c.handle_add_partitions("slow", pid, epoch, [(TOPIC, 0)]) == E.producer_fenced

    run(tmp_path, scenario)


def test_idle_transactional_ids_expire_with_a_tombstone(tmp_path):
    async def scenario(w: World) -> None:
        c = w.coordinator
        await c.handle_init_producer_id("idle", 60000)
        await begin(w, "busy", [(TOPIC, 0)])
        w.clock.now += 10_001
        assert c.remove_expired_transactional_ids() == 1  # an Ongoing transaction never expires
        await wait_for(lambda: w.state.get_state("idle")[2] is None)
        assert c.describe("idle") == (E.transactional_id_not_found, None)
        await w.restart()
        assert w.state.get_state("idle")[2] is None  # the tombstone is in the log
        assert w.meta("busy").state is S.ONGOING

    run(tmp_path, scenario)


def test_describe_and_list(tmp_path):
    async def scenario(w: World) -> None:
        c = w.coordinator
        pid, _ = await begin(w, "a", [(TOPIC, 0)])
        await c.handle_init_producer_id("b", 60000)
        error, m = c.describe("a")
        assert error == E.none and (m.state, m.producer_id, m.partitions) == (S.ONGOING, pid, {(TOPIC, 0)})
        assert c.describe("") == (E.transactional_id_not_found, None)
        assert c.describe("zzz") == (E.transactional_id_not_found, None)
        error, unknown, found = c.list_transactions([], [])
        assert (error, unknown, [m.transactional_id for m in found]) == (E.none, [], ["a", "b"])
        error, unknown, found = c.list_transactions(["Ongoing", "Bogus"], [])
        assert (unknown, [m.transactional_id for m in found]) == (["Bogus"], ["a"])
        assert [m.transactional_id for m in c.list_transactions([], [pid + 1])[2]] == ["b"]

    run(tmp_path, scenario)

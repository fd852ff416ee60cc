"""KIP-890 part 1 on the partition side (the verification guard of ProducerStateManager, Kafka's
VerificationStateEntry rules) and the verifier's requests to a coordinator on another broker (Kafka's
AddPartitionsToTxnManager: batching per broker, replacement, error mapping)."""

from __future__ import annotations

import asyncio
import datetime

import pytest

from kio.schema.add_partitions_to_txn.v4 import response as aptr

from pykbroker.log.producer_state import (
    INVALID_TXN_STATE,
    NO_VERIFICATION,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    SENTINEL,
    ProducerStateError,
    ProducerStateManager,
)
from pykbroker.protocol.control_records import Marker
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.records import CONTROL_MASK, TRANSACTIONAL_MASK, build_batch, read_header
from pykbroker.txn.verification import TransactionVerifier, produce_error

PID = 7


def txn_header(seq: int, offset: int, *, epoch: int = 0, control: bool = False):
    attributes = TRANSACTIONAL_MASK | (CONTROL_MASK if control else 0)
    return read_header(build_batch([(None, b"v")], base_offset=offset, timestamp_ms=1, producer_id=PID,
                                   producer_epoch=epoch, base_sequence=-1 if control else seq, attributes=attributes))


def refused(state: ProducerStateManager, header, guard) -> bool:
    try:
        state.check_batches([header], verification=guard)
    except ProducerStateError as exc:
        assert exc.error_code == INVALID_TXN_STATE
        return True
    return False


def test_the_first_transactional_write_needs_its_guard_and_later_ones_skip_verification():
    state = ProducerStateManager()
    assert refused(state, txn_header(0, 0), SENTINEL)  # nothing verified
    guard = state.maybe_start_verification(PID, 0, 0)
    assert guard is not SENTINEL and state.maybe_start_verification(PID, 0, 0) is guard  # one entry per producer
    assert not refused(state, txn_header(0, 0), guard)
    assert not refused(state, txn_header(0, 0), NO_VERIFICATION)  # verification off / coordinator's writes
    state.update(txn_header(0, 0), -1)  # the transaction is open: the entry is cleared
    assert state.maybe_start_verification(PID, 1, 0) is SENTINEL  # the cache: no coordinator round trip
    assert not refused(state, txn_header(1, 1), SENTINEL)


def test_a_late_verified_batch_cannot_reopen_an_ended_transaction():
    """Kafka's ABA case: verified, then the transaction starts and is aborted; the late batch's guard is stale."""
    state = ProducerStateManager()
    late_guard = state.maybe_start_verification(PID, 1, 0)  # the late request verified first
    state.update(txn_header(0, 0), -1)
    state.update(txn_header(0, 1, control=True), -1, Marker(commit=False, coordinator_epoch=0))
    assert refused(state, txn_header(1, 2), late_guard)
    assert refused(state, txn_header(1, 2), SENTINEL)


def test_a_released_verification_drops_its_entry_only_if_still_its_guard():
    state = ProducerStateManager()
    guard = state.maybe_start_verification(PID, 0, 0)
    state.release_verification(PID, SENTINEL)  # another guard: nothing happens
    assert not refused(state, txn_header(0, 0), guard)
    state.release_verification(PID, guard)
    assert refused(state, txn_header(0, 0), guard)
    assert state.maybe_start_verification(PID, 0, 0) is not guard


def test_a_marker_clears_the_verification_entry_so_a_stale_guard_cannot_reopen_the_transaction():
    """Review-2 finding 2 (Kafka's UnifiedLog.updateProducers): no transaction open here, the ABORT marker
    of the producer's transaction arrives while a produce verified in it waits; its guard is stale."""
    state = ProducerStateManager()
    stale = state.maybe_start_verification(PID, 0, 0)
    state.update(txn_header(0, 0, control=True), -1, Marker(commit=False, coordinator_epoch=0))
    assert refused(state, txn_header(0, 1), stale)


def test_verification_entries_expire_with_producer_id_expiration():
    state = ProducerStateManager()
    state.maybe_start_verification(PID, 0, 0, now_ms=1_000)
    state.maybe_start_verification(PID + 1, 0, 0, now_ms=5_000)
    state.expire(6_000, expiration_ms=5_000)
    assert state.verification_entries() == 1
    state.expire(10_000, expiration_ms=5_000)
    assert state.verification_entries() == 0


def test_a_batch_above_the_lowest_sequence_of_the_verification_is_out_of_order():
    """Kafka's ProducerAppendInfo.checkSequence: pipelined R1 (seq 0) and R2 (seq 10) share the entry; R2
    cannot open the transaction first."""
    state = ProducerStateManager()
    state.maybe_start_verification(PID, 10, 0)
    guard = state.maybe_start_verification(PID, 0, 0)
    with pytest.raises(ProducerStateError) as refused_r2:
        state.check_batches([txn_header(10, 0)], verification=guard)
    assert refused_r2.value.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert not refused(state, txn_header(0, 0), guard)
    state.check_batches([txn_header(0, 0)], verification=guard)


def test_produce_error_mapping_is_kafkas():
    assert produce_error(ErrorCode.invalid_txn_state) == (ErrorCode.invalid_txn_state,
                                                          "Partition was not added to the transaction")
    for error in (ErrorCode.concurrent_transactions, ErrorCode.coordinator_load_in_progress,
                  ErrorCode.coordinator_not_available, ErrorCode.not_coordinator, ErrorCode.network_exception):
        mapped, message = produce_error(error)
        assert mapped == ErrorCode.not_enough_replicas and error.name.upper() in message
    assert produce_error(ErrorCode.invalid_producer_epoch) == (ErrorCode.invalid_producer_epoch, None)


def _response(request, error_of):
    return aptr.AddPartitionsToTxnResponse(throttle_time=datetime.timedelta(0), error_code=ErrorCode.none,
                                           results_by_transaction=tuple(
        aptr.AddPartitionsToTxnResult(transactional_id=t.transactional_id, topic_results=tuple(
            aptr.AddPartitionsToTxnTopicResult(name=topic.name, results_by_partition=tuple(
                aptr.AddPartitionsToTxnPartitionResult(partition_index=p,
                                                       partition_error_code=error_of(t.transactional_id, topic.name, p))
                for p in topic.partitions)) for topic in t.topics)) for t in request.transactions))


class _Local:
    def __init__(self):
        self.calls = []

    def handle_verify_partitions(self, tid, pid, epoch, partitions):
        self.calls.append((tid, pid, epoch, list(partitions)))
        return {tp: ErrorCode.producer_fenced for tp in partitions}


def test_a_local_coordinator_is_called_directly_and_fenced_becomes_invalid_producer_epoch():
    local = _Local()

    async def no_network(broker, request):
        raise AssertionError("the local coordinator needs no request")

    verifier = TransactionVerifier(1, coordinator_of=lambda tid: 1, local=local, send=no_network)
    result = asyncio.run(verifier.verify("t", 5, 0, [("a", 0)]))
    assert result == {("a", 0): ErrorCode.invalid_producer_epoch} and local.calls == [("t", 5, 0, [("a", 0)])]
    verifier = TransactionVerifier(1, coordinator_of=lambda tid: None, local=local, send=no_network)
    assert asyncio.run(verifier.verify("t", 5, 0, [("a", 0)])) == {("a", 0): ErrorCode.coordinator_not_available}


def test_a_remote_coordinator_gets_batched_verify_only_requests():
    sent = []

    async def main():
        release = asyncio.Event()

        async def send(broker, request):
            sent.append((broker, request))
            if len(sent) == 1:
                await release.wait()
            return _response(request, lambda tid, topic, p: ErrorCode.none if p == 0 else ErrorCode.invalid_txn_state)

        verifier = TransactionVerifier(1, coordinator_of=lambda tid: 2, local=None, send=send)
        first = asyncio.ensure_future(verifier.verify("t1", 5, 0, [("a", 0)]))
        await asyncio.sleep(0)
        # While the first request is in flight: two more ids queue, and a newer epoch of t2 replaces its older one.
        second = asyncio.ensure_future(verifier.verify("t2", 6, 0, [("a", 1)]))
        third = asyncio.ensure_future(verifier.verify("t3", 7, 0, [("a", 0), ("b", 1)]))
        await asyncio.sleep(0)
        newer = asyncio.ensure_future(verifier.verify("t2", 6, 1, [("a", 0)]))
        await asyncio.sleep(0)
        assert await second == {("a", 1): ErrorCode.invalid_producer_epoch}
        release.set()
        return await first, await third, await newer

    first, third, newer = asyncio.run(main())
    assert first == {("a", 0): ErrorCode.none}
    assert third == {("a", 0): ErrorCode.none, ("b", 1): ErrorCode.invalid_txn_state}
    assert newer == {("a", 0): ErrorCode.none}
    assert [broker for broker, _ in sent] == [2, 2]
    batched = sent[1][1].transactions
    assert sorted(t.transactional_id for t in batched) == ["t2", "t3"] and all(t.verify_only for t in batched)
    assert {t.transactional_id: t.producer_epoch for t in batched}["t2"] == 1


def test_a_lost_connection_answers_network_exception():
    async def send(broker, request):
        raise ConnectionError("gone")

    verifier = TransactionVerifier(1, coordinator_of=lambda tid: 2, local=None, send=send)
    assert asyncio.run(verifier.verify("t", 5, 0, [("a", 0)])) == {("a", 0): ErrorCode.network_exception}


def _ok_response(request):
    return _response(request, lambda tid, topic, p: ErrorCode.none)


def test_a_verification_queued_as_the_drain_ends_is_sent():
    """Review-2 finding 1: the answer for A arrives and, in the same loop turn, B is verified against the
    same broker; B must be sent, not wait with no end."""
    async def main():
        loop = asyncio.get_running_loop()
        net = []

        async def send(broker, request):
            future = loop.create_future()
            net.append((future, request))
            return await future

        verifier = TransactionVerifier(1, coordinator_of=lambda tid: 2, local=None, send=send)
        a = asyncio.ensure_future(verifier.verify("A", 10, 0, [("t", 0)]))
        while not net:
            await asyncio.sleep(0)
        future, request = net.pop()
        future.set_result(_ok_response(request))
        b = asyncio.ensure_future(verifier.verify("B", 11, 0, [("t", 1)]))
        assert await a == {("t", 0): ErrorCode.none}
        deadline = loop.time() + 5
        while not net and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert net, "B was never sent"
        future, request = net.pop()
        future.set_result(_ok_response(request))
        return await asyncio.wait_for(b, 5)

    assert asyncio.run(main()) == {("t", 1): ErrorCode.none}


def test_a_malformed_answer_still_answers_every_waiter_and_later_ones_are_sent():
    sent = []

    async def send(broker, request):
        sent.append(request)
        if len(sent) == 1:
            return object()  # no error_code: _answer raises
        return _ok_response(request)

    async def main():
        verifier = TransactionVerifier(1, coordinator_of=lambda tid: 2, local=None, send=send)
        first = await asyncio.wait_for(verifier.verify("t", 5, 0, [("a", 0)]), 5)
        second = await asyncio.wait_for(verifier.verify("u", 6, 0, [("a", 1)]), 5)
        return first, second

    first, second = asyncio.run(main())
    assert first == {("a", 0): ErrorCode.network_exception}
    assert second == {("a", 1): ErrorCode.none}


class _Partition:
    is_leader = True

    def __init__(self):
        self.producer_state = ProducerStateManager()


def test_a_request_of_two_producer_ids_makes_no_verification_entry():
    """Review-2 finding 3: INVALID_PRODUCER_ID_MAPPING is found before any guard is made (none leaks)."""
    from types import SimpleNamespace

    from pykbroker.server.handlers.produce import _start_verification

    partitions = {("t", 0): _Partition(), ("t", 1): _Partition()}
    ctx = SimpleNamespace(broker=SimpleNamespace(replicas=SimpleNamespace(partition=lambda t, i: partitions[(t, i)])))

    def records(pid):
        return bytes(build_batch([(None, b"v")], timestamp_ms=1, producer_id=pid, producer_epoch=0, base_sequence=0,
                                 attributes=TRANSACTIONAL_MASK))

    request = SimpleNamespace(topic_data=[SimpleNamespace(name="t", partition_data=[
        SimpleNamespace(index=0, records=records(1)), SimpleNamespace(index=1, records=records(2))])])
    guards: dict = {}
    error, to_verify, _, _ = _start_verification(ctx, request, guards, None)  # no authorizer: every topic
    assert error == ErrorCode.invalid_producer_id_mapping and not to_verify and not guards
    assert [p.producer_state.verification_entries() for p in partitions.values()] == [0, 0]

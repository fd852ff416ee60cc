"""A client's EndTxn racing the coordinator's timeout abort: while the fence (PrepareEpochFence) is pending,
the client gets CONCURRENT_TRANSACTIONS (Kafka's rule for a pending transition), never UNKNOWN_SERVER_ERROR
(an IllegalTransition) nor a takeover of the fence; the abort then goes on with the bumped epoch."""

from __future__ import annotations

import pytest

from pykbroker.txn.metadata import TransactionState as S
from test_txn_coordinator import TOPIC, E, begin, run, wait_for


@pytest.mark.parametrize("commit", [True, False])
def test_end_txn_while_the_timeout_fence_is_pending_is_concurrent_transactions(tmp_path, commit):
    async def scenario(w) -> None:
        c = w.coordinator
        pid, epoch = await begin(w, "slow", [(TOPIC, 0)], timeout_ms=1000)
        w.clock.now += 1001
        assert c.abort_timed_out_transactions() == 1  # the fence is pending; its abort task has not run yet
        assert await c.handle_end_txn("slow", pid, epoch, commit=commit) == E.concurrent_transactions
        await wait_for(lambda: w.meta("slow").state is S.COMPLETE_ABORT)
        assert w.meta("slow").producer_epoch == epoch + 1  # the fence's epoch, not the client's
        assert w.leaders.received == [(1, pid, epoch + 1, False, TOPIC, 0, 0)]

    run(tmp_path, scenario)


def test_marker_errors_follow_kafkas_completion_handler(tmp_path):
    """TransactionMarkerRequestCompletionHandler (3.7.1): UNSUPPORTED_FOR_MESSAGE_FORMAT / UNSUPPORTED_VERSION
    remove the partition (done); INVALID_PRODUCER_EPOCH stops sending and writes no completion, even when this
    coordinator is current: Kafka's rule, kept (the transaction stays in Prepare* until the partition of
    __transaction_state is reloaded)."""
    async def scenario(w) -> None:
        c = w.coordinator
        pid, epoch = await begin(w, "old-format", [(TOPIC, 0), (TOPIC, 1)])
        w.leaders.errors[(TOPIC, 0)] = [E.unsupported_for_message_format]
        w.leaders.errors[(TOPIC, 1)] = [E.unsupported_version]
        assert await c.handle_end_txn("old-format", pid, epoch, commit=True) == E.none
        await wait_for(lambda: w.meta("old-format").state is S.COMPLETE_COMMIT)
        assert len(w.leaders.received) == 2  # no retry
        pid, epoch = await begin(w, "stuck", [(TOPIC, 2)])
        w.leaders.errors[(TOPIC, 2)] = [E.invalid_producer_epoch]
        assert await c.handle_end_txn("stuck", pid, epoch, commit=False) == E.none
        await wait_for(lambda: not c.markers.has_pending("stuck"))
        assert w.meta("stuck").state is S.PREPARE_ABORT

    run(tmp_path, scenario)

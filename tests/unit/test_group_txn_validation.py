"""TxnOffsetCommit validation as Kafka 3.7.1's GroupCoordinator.validateOffsetCommit: generation -1 on an
Empty group is accepted before any member check, for transactional commits as for plain ones."""

from __future__ import annotations

from pykbroker.protocol.errors import ErrorCode
import tests.unit.test_group_coordinator as coordinator_tests
from tests.unit.test_group_transactions import GROUP, TP0, TxnHarness

logs = coordinator_tests.logs  # the fixture


def test_txn_commit_with_generation_minus_one_to_an_empty_group_is_accepted_whatever_its_member_id(logs):
    h = TxnHarness(logs)
    assert h.txn_commit({TP0: 1}, member="not-a-member", instance="some-instance") == {TP0: ErrorCode.none}
    assert h.coordinator.group(GROUP) is not None
    # A member id with a real generation on the (still Empty) group is checked: UNKNOWN_MEMBER_ID.
    assert h.txn_commit({TP0: 2}, generation=1, member="not-a-member") == {TP0: ErrorCode.unknown_member_id}

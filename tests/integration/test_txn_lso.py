"""The LSO never falls below the log start offset (Kafka's UnifiedLog.maybeIncrementFirstUnstableOffset):
DeleteRecords past an open transaction's first offset moves the first unstable offset up to the new log
start, so ListOffsets(read_committed, LATEST) and Fetch(read_committed) never answer an offset below it."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode

from test_admin_apis import delete_records
from test_txn_coordinator_wire import add_partitions, find_coordinator, init
from test_txn_partition_leader import create_topic, fetch, list_offset, produce, txn_records

E = ErrorCode


def test_delete_records_past_an_open_transaction_moves_the_lso_to_the_log_start(broker, topic_name):
    address = broker.address
    create_topic(address, topic_name)
    find_coordinator(address, "tx-lso")
    _, pid, epoch = init(address, "tx-lso")
    assert add_partitions(address, "tx-lso", pid, epoch, {topic_name: [0]}) == {(topic_name, 0): E.none}
    assert produce(address, topic_name, txn_records(pid, epoch, 0, [b"open"]), transactional_id="tx-lso").error_code == E.none
    for seq in range(3):
        plain = produce(address, topic_name, txn_records(99, 0, seq, [b"plain"], transactional=False), transactional_id=None)
        assert plain.error_code == E.none
    part = fetch(address, topic_name, 0, 1)
    assert (part.high_watermark, part.last_stable_offset) == (4, 0)  # the open transaction holds the LSO
    assert delete_records(address, topic_name, [(0, 3)], timeout=datetime.timedelta(seconds=10)) == {0: (E.none, 3)}
    part = fetch(address, topic_name, 3, 1)
    assert part.error_code == E.none
    assert (part.high_watermark, part.last_stable_offset, part.log_start_offset) == (4, 3, 3)
    assert list_offset(address, topic_name, -1, 1) == 3  # LATEST, read_committed
    assert list_offset(address, topic_name, -1, 0) == 4

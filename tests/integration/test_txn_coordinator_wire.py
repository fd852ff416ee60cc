"""The transaction coordinator over the wire, on a single broker: FindCoordinator key_type 1 (and the
creation of __transaction_state), InitProducerId with a transactional id (epoch bumps, fencing, the timeout
check, the PRODUCER_FENCED/INVALID_PRODUCER_EPOCH mapping by version), AddPartitionsToTxn's errors (v3 from
clients, v4 verify_only from brokers), AddOffsetsToTxn, EndTxn, DescribeTransactions / ListTransactions, the
state surviving a restart, and Kafka 3.7.1's kafka-transactions.sh list/describe.

Until the partition-leader side (WriteTxnMarkers) is in the broker, markers cannot be written: EndTxn is
answered and the transaction stays in PrepareCommit/PrepareAbort; where WriteTxnMarkers is advertised, the
tests wait for the completion."""

from __future__ import annotations

import datetime
import time

import pytest
from kio.schema.add_offsets_to_txn.v3.request import AddOffsetsToTxnRequest
from kio.schema.add_partitions_to_txn.v1.request import AddPartitionsToTxnRequest as AddPartitionsV1
from kio.schema.add_partitions_to_txn.v1.request import AddPartitionsToTxnTopic as TopicV1
from kio.schema.add_partitions_to_txn.v3.request import AddPartitionsToTxnRequest as AddPartitionsV3
from kio.schema.add_partitions_to_txn.v3.request import AddPartitionsToTxnTopic as TopicV3
from kio.schema.add_partitions_to_txn.v4.request import AddPartitionsToTxnRequest as AddPartitionsV4
from kio.schema.add_partitions_to_txn.v4.request import AddPartitionsToTxnTopic as TopicV4
from kio.schema.add_partitions_to_txn.v4.request import AddPartitionsToTxnTransaction
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.create_topics.v5.request import CreatableTopic, CreateTopicsRequest
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.end_txn.v1.request import EndTxnRequest as EndTxnV1
from kio.schema.end_txn.v3.request import EndTxnRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v1.request import FindCoordinatorRequest as FindCoordinatorV1
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.init_producer_id.v3.request import InitProducerIdRequest as InitV3
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.list_transactions.v0.request import ListTransactionsRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.static.primitive import i8, i16, i32, i32Timedelta

from broker_process import send_request, wait_until
from kafka_tools import kafka_tools_or_skip

E = ErrorCode
TXN_PARTITIONS = 5
TIMEOUT_S = 30.0


def ms(milliseconds: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=milliseconds))


@pytest.fixture
def txn_broker(broker_factory):
    return broker_factory.make(config={"transaction.state.log.num.partitions": TXN_PARTITIONS})


def create_topic(address, name: str, partitions: int = 3) -> None:
    response = send_request(address, CreateTopicsRequest(
        topics=(CreatableTopic(name=name, num_partitions=i32(partitions), replication_factor=i16(1), assignments=(),
                               configs=()),), timeout=ms(10_000), validate_only=False))
    assert response.topics[0].error_code == E.none


def find_coordinator(address, key: str):
    """FindCoordinator v4 for a transactional id, retried while the answer is retriable."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        answer = send_request(address, FindCoordinatorRequest(key_type=i8(1), coordinator_keys=(key,)),
                              timeout=TIMEOUT_S).coordinators[0]
        if answer.error_code not in (E.coordinator_not_available, E.coordinator_load_in_progress):
            return answer
        assert time.monotonic() < deadline, "no transaction coordinator in time"
        time.sleep(0.1)


def init(address, tid: str, timeout_ms: int = 60000, producer_id: int = -1, epoch: int = -1, request_type=None):
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        request = (request_type or InitProducerIdRequest)(transactional_id=tid, transaction_timeout=ms(timeout_ms),
                                                          producer_id=producer_id, producer_epoch=i16(epoch))
        response = send_request(address, request)
        if response.error_code not in (E.coordinator_load_in_progress,):
            return response.error_code, response.producer_id, response.producer_epoch
        assert time.monotonic() < deadline
        time.sleep(0.1)


def add_partitions(address, tid: str, pid: int, epoch: int, topics: dict[str, list[int]]) -> dict:
    response = send_request(address, AddPartitionsV3(
        v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=i16(epoch),
        v3_and_below_topics=tuple(TopicV3(name=t, partitions=tuple(i32(p) for p in ps)) for t, ps in topics.items())))
    return {(t.name, p.partition_index): p.partition_error_code
            for t in response.results_by_topic_v3_and_below for p in t.results_by_partition}


def describe(address, *tids: str):
    return send_request(address, DescribeTransactionsRequest(transactional_ids=tids)).transaction_states


def supports_markers(address) -> bool:
    response = send_request(address, ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    return any(api.api_key == 27 for api in response.api_keys)


def test_find_coordinator_creates_the_transaction_topic(txn_broker):
    address = txn_broker.address
    answer = find_coordinator(address, "tx-find")
    assert (answer.error_code, answer.node_id, answer.port) == (E.none, 0, txn_broker.port) or \
        (answer.error_code, answer.port) == (E.none, txn_broker.port)
    old = send_request(address, FindCoordinatorV1(key="tx-find", key_type=i8(1)))
    assert (old.error_code, old.error_message, old.port) == (E.none, "NONE", txn_broker.port)
    empty = send_request(address, FindCoordinatorRequest(key_type=i8(1), coordinator_keys=("",))).coordinators[0]
    assert empty.error_code == E.invalid_request
    topic = send_request(address, MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name="__transaction_state"),), allow_auto_topic_creation=False,
        include_topic_authorized_operations=False)).topics[0]
    assert topic.error_code == E.none and topic.is_internal and len(topic.partitions) == TXN_PARTITIONS


def test_init_producer_id_fencing_and_errors(txn_broker):
    address = txn_broker.address
    find_coordinator(address, "tx-init")
    error, pid, epoch = init(address, "tx-init")
    assert (error, epoch) == (E.none, 0) and pid >= 0
    assert init(address, "tx-init") == (E.none, pid, 1)
    assert init(address, "tx-init", timeout_ms=900001)[0] == E.invalid_transaction_timeout
    assert init(address, "tx-init", producer_id=pid, epoch=1) == (E.none, pid, 2)  # KIP-360 re-init
    assert init(address, "tx-init", producer_id=pid, epoch=0)[0] == E.producer_fenced  # v4
    assert init(address, "tx-init", producer_id=pid, epoch=0, request_type=InitV3)[0] == E.invalid_producer_epoch
    assert init(address, "", )[0] == E.invalid_request
    # The fenced producer's requests (EndTxn v1 answers INVALID_PRODUCER_EPOCH, v3 PRODUCER_FENCED).
    v1 = send_request(address, EndTxnV1(transactional_id="tx-init", producer_id=pid, producer_epoch=i16(0),
                                        committed=True))
    assert v1.error_code == E.invalid_producer_epoch
    v3 = send_request(address, EndTxnRequest(transactional_id="tx-init", producer_id=pid, producer_epoch=i16(0),
                                             committed=True))
    assert v3.error_code == E.producer_fenced
    # A null transactional id still gets an idempotent producer id at epoch 0.
    plain = send_request(address, InitProducerIdRequest(transactional_id=None, transaction_timeout=ms(60000)))
    assert (plain.error_code, plain.producer_epoch) == (E.none, 0) and plain.producer_id != pid


def test_add_partitions_errors_and_verification(txn_broker, topic_name):
    address = txn_broker.address
    create_topic(address, topic_name)
    find_coordinator(address, "tx-add")
    _, pid, epoch = init(address, "tx-add")
    assert add_partitions(address, "tx-add", pid, epoch, {topic_name: [0, 7], "no-such-topic": [0]}) == {
        (topic_name, 0): E.operation_not_attempted, (topic_name, 7): E.unknown_topic_or_partition,
        ("no-such-topic", 0): E.unknown_topic_or_partition}
    assert add_partitions(address, "tx-unknown", pid, epoch, {topic_name: [0]}) == {
        (topic_name, 0): E.invalid_producer_id_mapping}
    assert add_partitions(address, "tx-add", pid + 1, epoch, {topic_name: [0]}) == {
        (topic_name, 0): E.invalid_producer_id_mapping}
    assert add_partitions(address, "tx-add", pid, epoch + 1, {topic_name: [0]}) == {(topic_name, 0): E.producer_fenced}
    old = send_request(address, AddPartitionsV1(
        v3_and_below_transactional_id="tx-add", v3_and_below_producer_id=pid, v3_and_below_producer_epoch=i16(epoch + 1),
        v3_and_below_topics=(TopicV1(name=topic_name, partitions=(i32(0),)),)))
    assert old.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == E.invalid_producer_epoch
    assert add_partitions(address, "tx-add", pid, epoch, {topic_name: [0, 1]}) == {
        (topic_name, 0): E.none, (topic_name, 1): E.none}
    offsets = send_request(address, AddOffsetsToTxnRequest(transactional_id="tx-add", producer_id=pid,
                                                           producer_epoch=i16(epoch), group_id="g-add"))
    assert offsets.error_code == E.none
    # v4, as a partition leader verifies a transactional produce (KIP-890): a batch, verify_only.
    response = send_request(address, AddPartitionsV4(transactions=(
        AddPartitionsToTxnTransaction(transactional_id="tx-add", producer_id=pid, producer_epoch=i16(epoch),
                                      verify_only=True, topics=(TopicV4(name=topic_name, partitions=(i32(1), i32(2))),)),
        AddPartitionsToTxnTransaction(transactional_id="tx-add", producer_id=pid, producer_epoch=i16(epoch + 3),
                                      verify_only=True, topics=(TopicV4(name=topic_name, partitions=(i32(1),)),)),
    )))
    assert response.error_code == E.none
    answers = [{(t.name, p.partition_index): p.partition_error_code for t in r.topic_results for p in t.results_by_partition}
               for r in response.results_by_transaction]
    assert answers == [{(topic_name, 1): E.none, (topic_name, 2): E.invalid_txn_state},
                       {(topic_name, 1): E.producer_fenced}]
    state = describe(address, "tx-add")[0]
    assert state.transaction_state == "Ongoing"
    partitions = {(t.topic, p) for t in state.topics for p in t.partitions}
    assert {(topic_name, 0), (topic_name, 1)} <= partitions
    assert any(t == "__consumer_offsets" for t, _ in partitions)


def test_end_txn_describe_list_and_restart(txn_broker, topic_name):
    address = txn_broker.address
    create_topic(address, topic_name)
    find_coordinator(address, "tx-end")
    _, pid, epoch = init(address, "tx-end")
    _, other_pid, _ = init(address, "tx-idle")
    assert send_request(address, EndTxnRequest(transactional_id="tx-end", producer_id=pid, producer_epoch=i16(epoch),
                                               committed=True)).error_code == E.invalid_txn_state  # Empty
    assert add_partitions(address, "tx-end", pid, epoch, {topic_name: [0]}) == {(topic_name, 0): E.none}
    listed = send_request(address, ListTransactionsRequest(state_filters=("Ongoing", "Nonsense"), producer_id_filters=()))
    assert listed.error_code == E.none and listed.unknown_state_filters == ("Nonsense",)
    assert [(t.transactional_id, t.producer_id, t.transaction_state) for t in listed.transaction_states] == [
        ("tx-end", pid, "Ongoing")]
    by_pid = send_request(address, ListTransactionsRequest(state_filters=(), producer_id_filters=(other_pid,)))
    assert [t.transactional_id for t in by_pid.transaction_states] == ["tx-idle"]
    assert send_request(address, EndTxnRequest(transactional_id="tx-end", producer_id=pid, producer_epoch=i16(epoch),
                                               committed=True)).error_code == E.none
    # (An Empty transaction's start time is -1, as Kafka answers: kio's reader refuses it, so not described here.)
    states = {s.transactional_id: s for s in describe(address, "tx-end", "tx-none")}
    assert states["tx-end"].transaction_state in ("PrepareCommit", "CompleteCommit")
    assert (states["tx-end"].producer_id, states["tx-end"].producer_epoch) == (pid, epoch)
    assert (states["tx-none"].error_code, states["tx-none"].producer_id) == (E.transactional_id_not_found, 0)
    idle = send_request(address, ListTransactionsRequest(state_filters=("Empty",), producer_id_filters=()))
    assert [t.transactional_id for t in idle.transaction_states] == ["tx-idle"]
    if supports_markers(address):
        wait_until(lambda: describe(address, "tx-end")[0].transaction_state == "CompleteCommit", "commit completed",
                   TIMEOUT_S)
    txn_broker.restart()
    find_coordinator(address, "tx-end")

    def loaded():
        state = describe(address, "tx-end")[0]
        return state if state.error_code != E.coordinator_load_in_progress else None

    wait_until(loaded, "tx-end loaded", TIMEOUT_S)
    state = loaded()
    assert state.error_code == E.none and state.transaction_state in ("PrepareCommit", "CompleteCommit")
    assert (state.producer_id, state.producer_epoch) == (pid, epoch)
    if state.transaction_state == "CompleteCommit":  # InitProducerId after the restart bumps the loaded epoch
        assert init(address, "tx-end") == (E.none, pid, epoch + 1)


def test_kafka_transactions_tool_lists_and_describes(txn_broker, topic_name):
    tools = kafka_tools_or_skip()
    address = txn_broker.address
    create_topic(address, topic_name)
    find_coordinator(address, "tx-tool")
    _, pid, epoch = init(address, "tx-tool")
    assert add_partitions(address, "tx-tool", pid, epoch, {topic_name: [2]}) == {(topic_name, 2): E.none}
    listed = tools.run("kafka-transactions.sh", "--bootstrap-server", txn_broker.bootstrap, "list").stdout
    assert "tx-tool" in listed and "Ongoing" in listed and str(pid) in listed
    described = tools.run("kafka-transactions.sh", "--bootstrap-server", txn_broker.bootstrap, "describe",
                          "--transactional-id", "tx-tool").stdout
    assert "Ongoing" in described and f"{topic_name}-2" in described and str(pid) in described


def test_timed_out_transactions_are_aborted_and_idle_ids_expire(broker_factory, topic_name):
    broker = broker_factory.make(config={
        "transaction.state.log.num.partitions": TXN_PARTITIONS,
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": 200,
        "transaction.remove.expired.transaction.cleanup.interval.ms": 300,
        # long enough for tx-slow's abort to be seen and its fencing checked before its id expires too
        "transactional.id.expiration.ms": 5000,
    })
    address = broker.address
    # Before any FindCoordinator for a transactional id there is no __transaction_state: not the coordinator.
    assert init(address, "tx-early")[0] == E.not_coordinator
    create_topic(address, topic_name)
    find_coordinator(address, "tx-slow")
    _, pid, epoch = init(address, "tx-slow", timeout_ms=1000)
    assert add_partitions(address, "tx-slow", pid, epoch, {topic_name: [0]}) == {(topic_name, 0): E.none}
    _, idle_pid, _ = init(address, "tx-idle")

    def aborted():
        state = describe(address, "tx-slow")[0]
        return state.transaction_state in ("PrepareAbort", "CompleteAbort") and state.producer_epoch == epoch + 1

    wait_until(aborted, "the timed-out transaction aborted with a bumped epoch", TIMEOUT_S)
    assert add_partitions(address, "tx-slow", pid, epoch, {topic_name: [0]}) == {(topic_name, 0): E.producer_fenced}

    def expired():
        listed = send_request(address, ListTransactionsRequest(state_filters=(), producer_id_filters=(idle_pid,)))
        return not listed.transaction_states

    wait_until(expired, "the idle transactional id to expire", TIMEOUT_S)
    assert describe(address, "tx-idle")[0].error_code == E.transactional_id_not_found
    broker.restart()  # the tombstone keeps it gone
    find_coordinator(address, "tx-idle")
    wait_until(lambda: describe(address, "tx-idle")[0].error_code == E.transactional_id_not_found,
               "tx-idle still unknown after the restart", TIMEOUT_S)

"""KIP-890 part 1 partition verification over the wire (Kafka 3.7.1's transaction.partition.verification.enable,
on by default): a transactional Produce is appended only if the coordinator has the partition in the
producer's ongoing transaction, so no write the coordinator never saw can leave a hanging transaction
(an LSO stuck below the HWM forever)."""

from __future__ import annotations

from kio.schema.add_offsets_to_txn.v3.request import AddOffsetsToTxnRequest
from kio.schema.end_txn.v3.request import EndTxnRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import i8, i16, i32

from broker_process import send_request, wait_until
from test_txn_coordinator_wire import TIMEOUT_S, add_partitions, describe, find_coordinator, init
from test_txn_offset_commit import errors_of, txn_commit
from test_txn_partition_leader import create_topic, fetch, ms, produce, txn_records

E = ErrorCode


def _stable(address, topic: str) -> tuple[int, int]:
    part = fetch(address, topic, 0, 1)
    return part.high_watermark, part.last_stable_offset


def test_a_write_the_coordinator_never_saw_is_refused(broker, topic_name):
    """The reviewer's reproduction: a made-up producer id with a transactional id nobody initialised."""
    address = broker.address
    create_topic(address, topic_name)
    # No __transaction_state yet: the coordinator cannot answer, a retriable NOT_ENOUGH_REPLICAS (Kafka's mapping).
    answer = produce(address, topic_name, txn_records(424242, 0, 0, [b"x"]), transactional_id="nobody")
    assert answer.error_code == E.not_enough_replicas
    assert "Unable to verify the partition has been added to the transaction" in answer.error_message
    find_coordinator(address, "nobody")  # creates __transaction_state
    answer = produce(address, topic_name, txn_records(424242, 0, 0, [b"x"]), transactional_id="nobody")
    assert answer.error_code == E.invalid_producer_id_mapping  # the coordinator does not know the id
    plain = produce(address, topic_name, txn_records(5, 0, 0, [b"plain"], transactional=False), transactional_id=None)
    assert plain.error_code == E.none and plain.base_offset == 0
    assert _stable(address, topic_name) == (1, 1)  # nothing hangs: the LSO is the HWM


def test_only_partitions_in_the_transaction_take_its_writes(broker, topic_name):
    address = broker.address
    other = topic_name + "-other"
    create_topic(address, topic_name)
    create_topic(address, other)
    find_coordinator(address, "tx-verify")
    error, pid, epoch = init(address, "tx-verify")
    assert error == E.none
    # Not added yet: INVALID_TXN_STATE with Kafka's message, nothing appended.
    refused = produce(address, topic_name, txn_records(pid, epoch, 0, [b"early"]), transactional_id="tx-verify")
    assert (refused.error_code, refused.error_message) == (E.invalid_txn_state, "Partition was not added to the transaction")
    assert add_partitions(address, "tx-verify", pid, epoch, {topic_name: [0]}) == {(topic_name, 0): E.none}
    first = produce(address, topic_name, txn_records(pid, epoch, 0, [b"a"]), transactional_id="tx-verify")
    assert (first.error_code, first.base_offset) == (E.none, 0)
    second = produce(address, topic_name, txn_records(pid, epoch, 1, [b"b"]), transactional_id="tx-verify")
    assert (second.error_code, second.base_offset) == (E.none, 1)
    # The same transaction, a partition the coordinator was not told about.
    elsewhere = produce(address, other, txn_records(pid, epoch, 0, [b"c"]), transactional_id="tx-verify")
    assert elsewhere.error_code == E.invalid_txn_state
    assert _stable(address, other) == (0, 0)
    # A stale epoch is fenced by the coordinator: INVALID_PRODUCER_EPOCH (PRODUCER_FENCED mapped, Kafka 3.7.1).
    stale = produce(address, other, txn_records(pid, epoch - 1 if epoch > 0 else epoch + 1, 0, [b"d"]),
                    transactional_id="tx-verify")
    assert stale.error_code == E.invalid_producer_epoch
    # Abort (EndTxn v3: no epoch bump), then a late batch of the same epoch cannot reopen the transaction.
    assert send_request(address, EndTxnRequest(transactional_id="tx-verify", producer_id=pid, producer_epoch=i16(epoch),
                                               committed=False)).error_code == E.none
    wait_until(lambda: describe(address, "tx-verify")[0].transaction_state == "CompleteAbort", "abort completed",
               TIMEOUT_S)
    late = produce(address, topic_name, txn_records(pid, epoch, 2, [b"late"]), transactional_id="tx-verify")
    assert late.error_code == E.invalid_txn_state
    hwm, lso = _stable(address, topic_name)
    assert hwm == lso == 3  # two records and the abort marker; no transaction left open


def test_verification_can_be_turned_off(broker_factory, topic_name):
    """transaction.partition.verification.enable=false: Kafka's pre-3.6 behaviour, the write is appended."""
    broker = broker_factory.make(config={"transaction.partition.verification.enable": False})
    create_topic(broker.address, topic_name)
    answer = produce(broker.address, topic_name, txn_records(424242, 0, 0, [b"x"]), transactional_id="nobody")
    assert answer.error_code == E.none
    assert _stable(broker.address, topic_name) == (1, 0)


def test_txn_offset_commit_is_verified_too(broker, topic_name):
    """Kafka 3.7.1 verifies a TxnOffsetCommit the same way (GroupCoordinator.handleTxnCommitOffsets): the
    group's __consumer_offsets partition must be in the transaction (AddOffsetsToTxn)."""
    address = broker.address
    group = "g-" + topic_name
    create_topic(address, topic_name)
    find_coordinator(address, "tx-offsets")
    wait_until(lambda: send_request(address, FindCoordinatorRequest(key_type=i8(0), coordinator_keys=(group,)))
               .coordinators[0].error_code == E.none, "group coordinator", TIMEOUT_S)
    _, pid, epoch = init(address, "tx-offsets")
    commit = txn_commit(group, {(topic_name, 0): (5, ""), (topic_name + "-missing", 0): (1, "")},
                        producer_id=pid, epoch=epoch, transactional_id="tx-offsets")
    # Not added: INVALID_TXN_STATE for the group's partitions, UNKNOWN_TOPIC_OR_PARTITION stays for a missing one.
    assert errors_of(send_request(address, commit)) == {
        (topic_name, 0): E.invalid_txn_state, (topic_name + "-missing", 0): E.unknown_topic_or_partition}
    assert send_request(address, AddOffsetsToTxnRequest(transactional_id="tx-offsets", producer_id=pid,
                                                        producer_epoch=i16(epoch), group_id=group)).error_code == E.none
    assert errors_of(send_request(address, commit))[(topic_name, 0)] == E.none


def test_verification_is_a_dynamic_broker_config(broker_factory, topic_name):
    """As in Kafka, transaction.partition.verification.enable changes without a restart (IncrementalAlterConfigs
    on the broker): off, an unverified transactional write is appended; on again, it is refused."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    broker = broker_factory.make()
    create_topic(broker.address, topic_name)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})

    def set_verification(value: str) -> None:
        resource = ConfigResource(ConfigResource.Type.BROKER, "1", incremental_configs=[
            ConfigEntry("transaction.partition.verification.enable", value,
                        incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)

    refused = produce(broker.address, topic_name, txn_records(424242, 0, 0, [b"x"]), transactional_id="nobody")
    assert refused.error_code != E.none
    set_verification("false")
    accepted = produce(broker.address, topic_name, txn_records(525252, 0, 0, [b"y"]), transactional_id="nobody2")
    assert accepted.error_code == E.none
    set_verification("true")
    again = produce(broker.address, topic_name, txn_records(626262, 0, 0, [b"z"]), transactional_id="nobody3")
    assert again.error_code != E.none


def _produce_partitions(address, topic: str, records_of: dict[int, bytes], transactional_id: str) -> dict:
    request = ProduceRequest(transactional_id=transactional_id, acks=i16(-1), timeout=ms(10_000),
                             topic_data=(TopicProduceData(name=topic, partition_data=tuple(
                                 PartitionProduceData(index=i32(index), records=records)
                                 for index, records in records_of.items())),))
    return {p.index: p.error_code for p in send_request(address, request).responses[0].partition_responses}


def test_one_producer_id_with_two_epochs_gets_the_epoch_error_not_the_mapping_error(broker, topic_name):
    """Kafka checks the transactional batches for more than one producer *id*; the same id with an older
    epoch on one partition is that partition's INVALID_PRODUCER_EPOCH at append (review-2 finding 7)."""
    address = broker.address
    create_topic(address, topic_name, partitions=2)
    find_coordinator(address, "tx-epochs")
    _, pid, epoch = init(address, "tx-epochs")
    _, pid, epoch = init(address, "tx-epochs")  # epoch >= 1, so epoch - 1 is a real older epoch
    assert epoch >= 1
    assert add_partitions(address, "tx-epochs", pid, epoch, {topic_name: [0, 1]}) == {
        (topic_name, 0): E.none, (topic_name, 1): E.none}
    opened = _produce_partitions(address, topic_name, {0: txn_records(pid, epoch, 0, [b"a"]),
                                                       1: txn_records(pid, epoch, 0, [b"b"])}, "tx-epochs")
    assert opened == {0: E.none, 1: E.none}
    mixed = _produce_partitions(address, topic_name, {0: txn_records(pid, epoch, 1, [b"c"]),
                                                      1: txn_records(pid, epoch - 1, 1, [b"d"])}, "tx-epochs")
    assert mixed == {0: E.none, 1: E.invalid_producer_epoch}
    other = _produce_partitions(address, topic_name, {0: txn_records(pid, epoch, 2, [b"e"]),
                                                      1: txn_records(pid + 1, 0, 0, [b"f"])}, "tx-epochs")
    assert other == {0: E.invalid_producer_id_mapping, 1: E.invalid_producer_id_mapping}

"""Transactions on a 3-broker pykbroker cluster (ZooKeeper mode), with confluent-kafka: no reference cluster here,
so these run against pykbroker only (the opt-in test_transactions_cluster_reference.py runs the same scenarios
against a 3-broker Kafka 3.7.1).

  commit across leaders        one transaction over partitions led by different brokers: the coordinator's
                               markers reach every leader; read_committed reads all, in order, once
  coordinator SIGKILLed        the transaction's coordinator (FindCoordinator key_type 1) is killed while the
  during a transaction         transaction is open (records produced and in the logs, not committed); the
                               producer commits through the new coordinator (librdkafka retries), or, on a
                               fatal error, a new producer with the same transactional.id completes/aborts it;
                               or (then=new-incarnation) the application dies too and its next incarnation's
                               InitProducerId, answered by the new coordinator from the replicated
                               __transaction_state, aborts it; then one more transaction commits.
                               read_committed consumers read every record of the committed transactions exactly
                               once, in order, and nothing of an aborted one; the same after the killed broker
                               is back in every ISR.

ZooKeeper sessions time out after 6 s so failovers are quick; __transaction_state has replication factor 3 and
min.insync.replicas 2 (Kafka's settings for a production cluster, scaled to 3 brokers). The same tests pass
against a 3-broker Kafka 3.7.1 (test_transactions_cluster_reference.py, opt-in).
Run: python3 -m pytest -q tests/cluster/test_transactions_cluster.py
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.static.primitive import i8

from broker_cluster import BrokerCluster, ProtocolError, send_request, wait_until
from test_replication_faults import OVERRIDES as REPLICATION_OVERRIDES
from txn_targets import TRANSACTION_KEY

OVERRIDES = {  # the replication fault tests' cluster (6 s ZooKeeper sessions, RF 3, min ISR 2) + the transaction log
    **REPLICATION_OVERRIDES,
    "transaction.state.log.replication.factor": 3,
    "transaction.state.log.min.isr": 2,
    "transaction.state.log.num.partitions": 6,
}
PARTITIONS = 3
TIMEOUT_S = 120.0  # client operations across a failover (session timeout, election, metadata) on a loaded machine
QUIET_S = 3.0

pytestmark = pytest.mark.timeout(420)


@pytest.fixture
def cluster(zk_connect, tmp_path):
    with BrokerCluster(zk_connect, tmp_path, n=3, overrides=OVERRIDES) as brokers:
        yield brokers


def transaction_coordinator(cluster: BrokerCluster, transactional_id: str, exclude: set[int] = frozenset(),
                            timeout: float = 60.0) -> int:
    """The broker id every live broker names as the coordinator of `transactional_id` (FindCoordinator v4,
    key_type 1), once it is a live broker not in `exclude`."""
    found = []

    def located() -> bool:
        names = set()
        for broker_id in sorted(cluster.live_ids()):
            try:
                answer = send_request(cluster.brokers[broker_id].address, FindCoordinatorRequest(
                    key_type=i8(TRANSACTION_KEY), coordinator_keys=(transactional_id,)), timeout=5.0).coordinators[0]
            except (OSError, ProtocolError):
                return False
            if answer.error_code != ErrorCode.none:
                return False
            names.add(int(answer.node_id))
        if len(names) == 1 and (node := names.pop()) in cluster.live_ids() - set(exclude):
            found.append(node)
            return True
        return False

    wait_until(located, f"a transaction coordinator for {transactional_id!r}", timeout)
    return found[-1]


def txn_producer(cluster: BrokerCluster, transactional_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": transactional_id,
                         "linger.ms": 5, "transaction.timeout.ms": 90000, "message.timeout.ms": 90000})
    producer.init_transactions(TIMEOUT_S)
    return producer


def produce_flushed(producer: Producer, topic: str, values: list[bytes]) -> None:
    errors = []
    for i, value in enumerate(values):
        producer.produce(topic, value=value, key=value, partition=i % PARTITIONS,
                         on_delivery=lambda err, msg: errors.append(err) if err is not None else None)
    assert producer.flush(TIMEOUT_S) == 0, "records still queued"
    assert not errors, f"delivery failed: {errors[:3]}"


def read_committed(bootstrap: str, topic: str, count: int) -> list[tuple[int, int, bytes]]:
    """Every record a fresh read_committed consumer reads from the start: (partition, offset, value)."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                       "isolation.level": "read_committed", "enable.auto.commit": False,
                       "fetch.wait.max.ms": 100})
    got: list[tuple[int, int, bytes]] = []
    try:
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + TIMEOUT_S
        quiet_until = None
        while time.monotonic() < (quiet_until or deadline):
            for msg in reader.consume(num_messages=500, timeout=0.2):
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise AssertionError(f"consumer error: {msg.error()}")
                got.append((msg.partition(), msg.offset(), msg.value()))
            if len(got) >= count and quiet_until is None:
                quiet_until = time.monotonic() + QUIET_S
    finally:
        reader.close()
    return got


def assert_exactly(read: list[tuple[int, int, bytes]], batches: list[list[bytes]], what: str) -> None:
    """`read` holds each value of `batches` (each produced with produce_flushed, value i to partition
    i % PARTITIONS) exactly once, nothing else, and each partition's values in the order produced."""
    values = [v for _, _, v in read]
    duplicates = sorted({v for v in values if values.count(v) > 1})
    assert not duplicates, f"{what}: read twice: {duplicates[:5]}"
    expected = [v for batch in batches for v in batch]
    assert sorted(values) == sorted(expected), (
        f"{what}: missing {sorted(set(expected) - set(values))[:5]}, extra {sorted(set(values) - set(expected))[:5]}")
    for partition in range(PARTITIONS):
        in_partition = [v for p, _, v in sorted(read) if p == partition]
        produced = [v for batch in batches for i, v in enumerate(batch) if i % PARTITIONS == partition]
        assert in_partition == produced, f"{what}: partition {partition} holds {in_partition[:8]}..."


def test_transaction_across_partitions_led_by_different_brokers(cluster):
    topic, tid = f"txn-leaders-{uuid.uuid4().hex[:8]}", f"tid-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
    leaders = {p: cluster.partition(topic, p).leader for p in range(PARTITIONS)}
    assert len(set(leaders.values())) >= 2, f"all partitions led by one broker: {leaders}"

    producer = txn_producer(cluster, tid)
    producer.begin_transaction()
    first = [b"first-%d" % i for i in range(30)]
    produce_flushed(producer, topic, first)
    producer.commit_transaction(TIMEOUT_S)
    producer.begin_transaction()
    produce_flushed(producer, topic, [b"aborted-%d" % i for i in range(9)])
    producer.abort_transaction(TIMEOUT_S)
    producer.begin_transaction()
    second = [b"second-%d" % i for i in range(9)]
    produce_flushed(producer, topic, second)
    producer.commit_transaction(TIMEOUT_S)

    read = read_committed(cluster.bootstrap, topic, len(first) + len(second))
    assert_exactly(read, [first, second], f"read_committed (leaders {leaders})")


@pytest.mark.parametrize("then", ["commit", "new-incarnation"])
def test_coordinator_killed_during_a_transaction(cluster, then):
    """then=commit: the producer commits through the new coordinator (or settles it as the client's error
    says); then=new-incarnation: the application dies too, and a new producer with the same transactional.id
    (InitProducerId to the new coordinator, which loaded the Ongoing transaction from the replicated
    __transaction_state) aborts it: none of its records may ever be read."""
    topic, tid = f"txn-failover-{uuid.uuid4().hex[:8]}", f"tid-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
    producer = txn_producer(cluster, tid)
    before = [b"before-%d" % i for i in range(12)]
    producer.begin_transaction()
    produce_flushed(producer, topic, before)
    producer.commit_transaction(TIMEOUT_S)

    coordinator = transaction_coordinator(cluster, tid)
    open_txn = [b"open-%d" % i for i in range(12)]
    producer.begin_transaction()
    produce_flushed(producer, topic, open_txn)      # in the logs, not committed
    cluster.kill(coordinator)

    outcome = "committed"
    if then == "new-incarnation":
        del producer
        producer = txn_producer(cluster, tid)        # fences the dead one, aborts its open transaction
        outcome = "aborted"
    else:
        try:
            producer.commit_transaction(TIMEOUT_S)  # librdkafka finds the new coordinator and retries EndTxn
        except KafkaException as exc:
            error = exc.args[0]
            if error.txn_requires_abort():
                producer.abort_transaction(TIMEOUT_S)
                outcome = "aborted"
            else:  # fatal, or retriable beyond its timeout: a new incarnation settles the transaction
                assert error.fatal() or error.retriable(), f"unexpected commit error: {error}"
                producer = txn_producer(cluster, tid)  # completes a prepared commit, or aborts an open one
                outcome = f"unknown ({error})"
    new_coordinator = transaction_coordinator(cluster, tid, exclude={coordinator})
    assert new_coordinator != coordinator

    after = [b"after-%d" % i for i in range(9)]
    producer.begin_transaction()
    produce_flushed(producer, topic, after)
    producer.commit_transaction(TIMEOUT_S)

    read = read_committed(cluster.bootstrap, topic, len(before) + len(after))
    values = {v for _, _, v in read}
    settled = open_txn if outcome == "committed" or open_txn[0] in values else []
    what = f"coordinator {coordinator} killed, then {new_coordinator}; {then}: {outcome}"
    print(what)
    assert_exactly(read, [before, settled, after], what)
    if outcome == "aborted":
        assert not settled, f"{what}: the aborted transaction's records are visible"

    cluster.start_broker(coordinator)                # back, in sync: the committed view is the same
    for p in range(PARTITIONS):
        cluster.wait_for_isr(topic, p, {1, 2, 3}, timeout=TIMEOUT_S)
    read = read_committed(cluster.bootstrap, topic, len(before) + len(settled) + len(after))
    assert_exactly(read, [before, settled, after], f"{what}; after broker {coordinator} restarted")

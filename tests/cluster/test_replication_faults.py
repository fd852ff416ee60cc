"""Replication under faults (issue 8): 3 real brokers in ZooKeeper mode, topics with replication factor 3 and
min.insync.replicas 2, stock confluent-kafka clients.

What each test breaks and what must hold afterwards:
  leader SIGKILLed under idempotent acks=all produce   every acknowledged record read exactly once, in
                                                       order, at its offset, from the new leader; a consumer
                                                       running throughout saw nothing that later changed
  follower killed and restarted                        it catches up and rejoins the ISR; with 2 of 3 down
                                                       acks=all is refused (NOT_ENOUGH_REPLICAS), acks=1 works
  leader SIGSTOPped past its session                   another broker leads; resumed, the old leader drops its
                                                       unreplicated writes, keeps every acknowledged one, and
                                                       rejoins the ISR
  controller killed / paused                           a new controller with a higher /controller_epoch; the
                                                       old one, back, is not controller; topics still created
  group coordinator killed                             the group goes on from its committed offsets, no record
                                                       skipped
  leader SIGTERMed (controlled shutdown), rolling      leadership moves before the exit, the producer sees
  restart of all brokers                               only retriable errors, nothing is lost

ZooKeeper sessions time out after 6 s (zookeeper.session.timeout.ms) so failovers are quick. Random choices
(which follower, how many records before the fault) come from a seed: PYKBROKER_FAULT_SEED, default below,
printed on failure with each test's name. Run: python3 -m pytest -q tests/cluster/test_replication_faults.py
"""

from __future__ import annotations

import os
import random
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from broker_cluster import BrokerCluster, wait_until
from checker import Rec, check
from workload import SeqProducer, TailConsumer, consumer_config, is_benign, produce_batch, read_log

SEED = int(os.environ.get("PYKBROKER_FAULT_SEED", "8"))
SESSION_TIMEOUT_MS = 6000
REPLICA_FETCH_WAIT_MS = 500
OVERRIDES = {
    "zookeeper.session.timeout.ms": SESSION_TIMEOUT_MS,
    "min.insync.replicas": 2,
    "default.replication.factor": 3,
    "offsets.topic.replication.factor": 3,
    "offsets.topic.num.partitions": 6,
    "replica.lag.time.max.ms": 10000,
    "replica.fetch.wait.max.ms": REPLICA_FETCH_WAIT_MS,
    "group.initial.rebalance.delay.ms": 0,
    "auto.create.topics.enable": "false",
}
FAILOVER_S = 60.0  # session timeout + election + metadata propagation, on a loaded 2-core machine
ALL = {1, 2, 3}

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def cluster(zk_connect, tmp_path):
    with BrokerCluster(zk_connect, tmp_path, n=3, overrides=OVERRIDES) as brokers:
        yield brokers


class Clients(list):
    """The clients a test started; on failure their own reports (a TailConsumer's state and librdkafka debug
    log) are attached next to the broker logs (conftest.py's report hook calls failure_sections())."""

    def failure_sections(self) -> list[tuple[str, str]]:
        return [section for client in self if hasattr(client, "failure_sections")
                for section in client.failure_sections()]


@pytest.fixture
def clients():
    """Background producers and consumers a test starts: closed at teardown even when the test failed."""
    started = Clients()
    yield started
    for client in started:
        client.close()


@pytest.fixture
def rng(request):
    seed = f"{SEED}-{request.node.name}"
    print(f"random seed: {seed!r} (PYKBROKER_FAULT_SEED={SEED})")
    return random.Random(seed)


@pytest.fixture
def topic(request) -> str:
    return f"{request.node.name[5:45]}-{os.urandom(4).hex()}".replace("_", "-")


def assert_checked(acked, log, observed=()):
    result = check(acked, log, observed)
    assert result.ok, result.summary()
    return result


def values_in(log) -> set[bytes]:
    return {value for records in log.values() for _, value in records}


def single_send(bootstrap: str, topic: str, name: str, **config) -> tuple[list[Rec], list]:
    """One record (value ``<name>:000000000``) to partition 0 through a non-idempotent producer that does
    not retry: the broker's answer as it is."""
    return produce_batch(bootstrap, topic, [0], name, 1, timeout=30,
                         **{"enable.idempotence": False, "retries": 0, "message.timeout.ms": 30000, **config})


def outwait(seconds: float, why: str) -> None:
    """Let a broker-side timer run out: there is no state to poll for, only the protocol's own deadline."""
    end = time.monotonic() + seconds
    wait_until(lambda: time.monotonic() >= end, why, seconds + 5)


# --- a. leader killed ------------------------------------------------------------------------------------


def test_leader_killed_under_idempotent_produce_loses_nothing(cluster, topic, rng, clients):
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    old_leader = cluster.wait_for_leader(topic, 0)
    tail = TailConsumer(cluster.bootstrap, topic, [0])
    producer = SeqProducer(cluster.bootstrap, topic, [0], "p0", rate=300)
    clients += [tail, producer]
    tail.start()
    producer.start()
    try:
        producer.wait_acked(rng.randint(200, 600), 60)
        cluster.kill(old_leader)
        new_leader = cluster.wait_for_leader(topic, 0, exclude={old_leader}, timeout=FAILOVER_S)
        cluster.wait_for_isr(topic, 0, ALL - {old_leader}, timeout=FAILOVER_S)
        producer.wait_acked(len(producer.acked) + 300, 60)  # the producer goes on with the new leader
    finally:
        producer.stop()
    assert producer.unflushed == 0
    assert not producer.bad_errors(), producer.bad_errors()[:5]

    assert cluster.partition(topic, 0).leader == new_leader  # read_log reads from the leader
    log = read_log(cluster.bootstrap, topic, [0])
    end = log[0][-1][0] + 1
    wait_until(lambda: tail.positions().get(0, 0) >= end, "the tail consumer to reach the log end", 60)
    tail.stop()
    assert not tail.bad_errors(), tail.bad_errors()[:5]

    result = assert_checked(producer.acked, log, [tail.seen])
    assert result.acknowledged == producer.sent
    offsets = [rec.offset for rec in producer.acked]  # acknowledged in send order, offsets growing
    assert offsets == sorted(set(offsets))
    assert [value for _, value in log[0]] == [rec.value for rec in producer.acked], "log is not the acked sequence"


# --- b. follower killed and restarted, then 2 of 3 down ----------------------------------------------------


def test_restarted_follower_catches_up_and_acks_all_needs_two_replicas(cluster, topic, rng):
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    leader = cluster.wait_for_leader(topic, 0)
    follower = rng.choice(sorted(ALL - {leader}))
    other = (ALL - {leader, follower}).pop()

    acked, refused = produce_batch(cluster.bootstrap, topic, [0], "before", 200)
    assert not refused
    cluster.kill(follower)
    cluster.wait_for_isr(topic, 0, {leader, other}, timeout=FAILOVER_S)
    written_while_down, refused = produce_batch(cluster.bootstrap, topic, [0], "while-down", 200)
    assert not refused, "acks=all with 2 of 3 in the ISR must work"
    acked += written_while_down

    cluster.start_broker(follower)
    cluster.wait_ready()
    cluster.wait_for_isr(topic, 0, ALL, timeout=FAILOVER_S)

    # Leave the restarted follower alone: it must hold everything, having caught up before it rejoined.
    cluster.kill(leader)
    cluster.kill(other)
    assert cluster.wait_for_leader(topic, 0, timeout=2 * FAILOVER_S) == follower
    cluster.wait_for_isr(topic, 0, {follower}, timeout=FAILOVER_S)

    none_acked, refusals = single_send(cluster.bootstrap, topic, "refused", acks="all")
    assert not none_acked
    assert [error.code() for _, error in refusals] == [KafkaError.NOT_ENOUGH_REPLICAS], refusals
    one_replica, refusals = single_send(cluster.bootstrap, topic, "acks1", acks=1)
    assert not refusals and len(one_replica) == 1

    log = read_log(cluster.bootstrap, topic, [0])
    assert_checked(acked + one_replica, log)
    assert b"refused:000000000" not in values_in(log)


# --- c. leader paused ----------------------------------------------------------------------------------------


def test_paused_leader_loses_leadership_and_truncates_its_unreplicated_writes(cluster, topic, rng):
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    old_leader = cluster.wait_for_leader(topic, 0)
    followers = sorted(ALL - {old_leader})
    acked, refused = produce_batch(cluster.bootstrap, topic, [0], "before", rng.randint(50, 200))
    assert not refused

    # Writes only the leader holds: with both followers paused (briefly: well under replica.lag.time.max.ms
    # and the session timeout) and their parked fetches answered empty (replica.fetch.wait.max.ms), acks=1
    # records reach the leader and nobody else.
    for broker_id in followers:
        cluster.pause(broker_id)
    outwait(3 * REPLICA_FETCH_WAIT_MS / 1000, "the followers' parked fetches to be answered")
    unreplicated, refused = produce_batch(cluster.brokers[old_leader].bootstrap, topic, [0], "unreplicated", 20,
                                          **{"acks": 1, "enable.idempotence": False, "retries": 0})
    assert not refused and len(unreplicated) == 20
    cluster.pause(old_leader)
    for broker_id in followers:
        cluster.resume(broker_id)

    new_leader = cluster.wait_for_leader(topic, 0, exclude={old_leader}, timeout=FAILOVER_S)
    assert new_leader in followers
    after, refused = produce_batch(cluster.bootstrap, topic, [0], "after", 100)
    assert not refused
    acked += after

    cluster.resume(old_leader)
    cluster.wait_ready(FAILOVER_S)
    cluster.wait_for_isr(topic, 0, ALL, timeout=FAILOVER_S)
    log = read_log(cluster.bootstrap, topic, [0])
    assert_checked(acked, log)
    assert not values_in(log) & {rec.value for rec in unreplicated}, "unreplicated writes survived"

    # The old leader's own copy: leave it as the only replica and read from it.
    for broker_id in followers:
        cluster.kill(broker_id)
    assert cluster.wait_for_leader(topic, 0, timeout=2 * FAILOVER_S) == old_leader
    assert read_log(cluster.bootstrap, topic, [0]) == log, "the resumed leader's log differs from the new leader's"


# --- d. controller killed / paused --------------------------------------------------------------------------


def _zk_controller_is(cluster, broker_id):
    controller, _ = cluster.zk_controller()
    return controller == broker_id


def _assert_topic_works(cluster, topic, replication_factor):
    cluster.create_topic(topic, partitions=3, replication_factor=replication_factor)
    acked, refused = produce_batch(cluster.bootstrap, topic, [0, 1, 2], "t", 90)
    assert not refused
    assert_checked(acked, read_log(cluster.bootstrap, topic, [0, 1, 2]))


def test_controller_killed_a_new_controller_with_a_higher_epoch_takes_over(cluster, topic):
    old = cluster.wait_for_controller()
    controller, epoch = cluster.zk_controller()
    assert controller == old

    cluster.kill(old)
    new = cluster.wait_for_controller(exclude={old}, timeout=FAILOVER_S)
    wait_until(lambda: _zk_controller_is(cluster, new), f"/controller to name broker {new}", FAILOVER_S)
    _, new_epoch = cluster.zk_controller()
    assert new_epoch > epoch
    _assert_topic_works(cluster, topic + "-2", replication_factor=2)

    cluster.start_broker(old)
    cluster.wait_ready(FAILOVER_S)
    assert cluster.wait_for_controller() == new
    assert cluster.zk_controller() == (new, new_epoch)
    _assert_topic_works(cluster, topic, replication_factor=3)


def test_controller_paused_past_its_session_is_not_controller_when_resumed(cluster, topic):
    old = cluster.wait_for_controller()
    _, epoch = cluster.zk_controller()

    cluster.pause(old)
    new = cluster.wait_for_controller(exclude={old}, timeout=FAILOVER_S)
    wait_until(lambda: _zk_controller_is(cluster, new), f"/controller to name broker {new}", FAILOVER_S)
    _, new_epoch = cluster.zk_controller()
    assert new_epoch > epoch

    cluster.resume(old)
    cluster.wait_ready(FAILOVER_S)  # its session expired: it registers again, and every broker lists it
    assert cluster.wait_for_controller() == new
    assert cluster.controller_id(via=old) == new
    assert cluster.zk_controller() == (new, new_epoch)
    _assert_topic_works(cluster, topic, replication_factor=3)  # old is a replica: it obeys the new controller
    assert cluster.zk_controller() == (new, new_epoch)


# --- e. group coordinator killed ----------------------------------------------------------------------------


def _consume_and_commit(consumer, want: int, timeout: float) -> list[Rec]:
    """Read `want` records, committing (synchronously, retrying retriable errors) after every poll."""
    got: list[Rec] = []
    deadline = time.monotonic() + timeout
    while len(got) < want:
        assert time.monotonic() < deadline, f"read {len(got)} of {want} records in {timeout} s"
        for message in consumer.consume(num_messages=min(50, want - len(got)), timeout=0.5):
            if message.error():
                assert is_benign(message.error()), message.error()
                continue
            got.append(Rec(message.partition(), message.offset(), message.value()))
        if got:
            _commit(consumer, deadline)
    return got


def _commit(consumer, deadline: float) -> None:
    while True:
        try:
            consumer.commit(asynchronous=False)
            return
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError._NO_OFFSET:
                return  # nothing new since the last commit
            assert is_benign(error) and time.monotonic() < deadline, f"commit failed: {error}"
            time.sleep(0.2)


def kill_coordinator(cluster, group: str) -> None:
    """Kill the group's coordinator and wait until another broker coordinates the group."""
    coordinator = cluster.find_coordinator(group)
    cluster.kill(coordinator)

    def moved():
        try:
            return cluster.find_coordinator(group) != coordinator
        except AssertionError:  # COORDINATOR_NOT_AVAILABLE while the offsets partition elects a leader
            return False

    wait_until(moved, f"group {group} to get a coordinator other than broker {coordinator}", FAILOVER_S)


def test_group_resumes_from_committed_offsets_after_its_coordinator_dies(cluster, topic, rng):
    cluster.create_topic(topic, partitions=3, replication_factor=3)
    produced, refused = produce_batch(cluster.bootstrap, topic, [0, 1, 2], "g", 300)
    assert not refused
    group = f"group-{topic}"
    settings = {"group.id": group, "auto.offset.reset": "earliest", "session.timeout.ms": 30000}

    first = Consumer(consumer_config(cluster.bootstrap, **settings))
    first.subscribe([topic])
    seen = _consume_and_commit(first, rng.randint(60, 140), 90)
    kill_coordinator(cluster, group)
    seen += _consume_and_commit(first, rng.randint(30, 60), 90)  # the same member commits to the new coordinator
    partitions = [TopicPartition(topic, p) for p in range(3)]
    committed = {tp.partition: tp.offset for tp in first.committed(partitions, timeout=30)}
    first.close()

    second = Consumer(consumer_config(cluster.bootstrap, **settings))
    second.subscribe([topic])
    assert {tp.partition: tp.offset for tp in second.committed(partitions, timeout=30)} == committed
    remaining = len({(r.partition, r.offset) for r in produced} - {(r.partition, r.offset) for r in seen})
    resumed = _consume_and_commit(second, remaining, 90)
    second.close()

    first_offsets = {}
    for rec in resumed:
        first_offsets.setdefault(rec.partition, rec.offset)
    ends = {p: 1 + max(r.offset for r in produced if r.partition == p) for p in range(3)}
    for p, offset in committed.items():
        if offset < ends[p]:
            assert first_offsets.get(p) == max(offset, 0), f"partition {p}: resumed at {first_offsets.get(p)}, committed {offset}"
    read = {(r.partition, r.offset): r.value for r in seen + resumed}
    skipped = [r for r in produced if read.get((r.partition, r.offset)) != r.value]
    assert not skipped, f"{len(skipped)} records never consumed, first {skipped[:3]}"


# --- f. controlled shutdown ---------------------------------------------------------------------------------


def test_controlled_shutdown_moves_leadership_before_the_leader_exits(cluster, topic, rng, clients):
    cluster.create_topic(topic, partitions=3, replication_factor=3)
    leaving = cluster.wait_for_leader(topic, 0)
    led = [p for p in range(3) if cluster.partition(topic, p).leader == leaving]
    producer = SeqProducer(cluster.bootstrap, topic, [0, 1, 2], "p0", rate=300)
    clients.append(producer)
    producer.start()
    try:
        producer.wait_acked(rng.randint(150, 400), 60)
        assert cluster.stop(leaving) == 0
        for p in led:  # written by the controller before it answered ControlledShutdown
            state = cluster.zk_partition_state(topic, p)
            assert state.leader in ALL - {leaving} and leaving not in state.isr, (p, state)
        for p in range(3):
            cluster.wait_for_leader(topic, p, exclude={leaving}, timeout=15)
        producer.wait_acked(len(producer.acked) + 200, 60)
        cluster.start_broker(leaving)
        cluster.wait_ready(FAILOVER_S)
        for p in range(3):
            cluster.wait_for_isr(topic, p, ALL, timeout=FAILOVER_S)
        producer.wait_acked(len(producer.acked) + 100, 60)
    finally:
        producer.stop()
    assert producer.unflushed == 0
    assert not producer.bad_errors(), producer.bad_errors()[:5]
    assert_checked(producer.acked, read_log(cluster.bootstrap, topic, [0, 1, 2]))


def test_rolling_restart_under_continuous_produce_loses_nothing(cluster, topic, rng, clients, tmp_path):
    cluster.create_topic(topic, partitions=3, replication_factor=3)
    tail = TailConsumer(cluster.bootstrap, topic, [0, 1, 2], debug_log=tmp_path / "tail-consumer.log")
    producer = SeqProducer(cluster.bootstrap, topic, [0, 1, 2], "p0", rate=300,
                           debug_log=tmp_path / "producer.log")
    clients += [tail, producer]
    tail.start()
    producer.start()
    try:
        for broker_id in rng.sample(sorted(ALL), 3):
            producer.wait_acked(len(producer.acked) + 100, 60)
            assert cluster.stop(broker_id) == 0, f"broker {broker_id} did not exit cleanly on SIGTERM"
            cluster.start_broker(broker_id)
            cluster.wait_ready(FAILOVER_S)
            for p in range(3):
                cluster.wait_for_isr(topic, p, ALL, timeout=FAILOVER_S)
        producer.wait_acked(len(producer.acked) + 100, 60)
    finally:
        producer.stop()
    assert producer.unflushed == 0
    assert not producer.bad_errors(), producer.bad_errors()[:5]
    log = read_log(cluster.bootstrap, topic, [0, 1, 2])
    ends = {p: (records[-1][0] + 1 if records else 0) for p, records in log.items()}
    tail.wait_for(ends, 60)
    tail.stop()
    assert not tail.bad_errors(), tail.bad_errors()[:5]
    assert_checked(producer.acked, log, [tail.seen])

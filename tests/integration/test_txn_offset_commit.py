"""TxnOffsetCommit over the wire on a single broker (pykbroker/protocol/client.py as the client): Kafka's
error answers, then the whole group side of a transaction: offsets committed in a transaction are pending
(OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT, without it they are not there) until
WriteTxnMarkers writes the transaction's marker to the group's __consumer_offsets partition; a COMMIT makes
them the group's offsets, an ABORT drops them, and a broker restart replays the same from the log.
A zombie producer epoch is refused. (Checked against Kafka 3.7.1 by hand: UNKNOWN_MEMBER_ID, per-partition
OFFSET_METADATA_TOO_LARGE, INVALID_GROUP_ID next to UNKNOWN_TOPIC_OR_PARTITION, UNSTABLE_OFFSET_COMMIT.) The
test plays the transaction coordinator with raw requests, so the broker runs with
``transaction.partition.verification.enable=false`` (verification: test_txn_verification.py)."""

from __future__ import annotations

import asyncio
import datetime
import uuid

import pytest
from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopics
from kio.schema.txn_offset_commit.v0.request import TxnOffsetCommitRequest as TxnOffsetCommitRequestV0
from kio.schema.txn_offset_commit.v0.request import TxnOffsetCommitRequestPartition as PartitionV0
from kio.schema.txn_offset_commit.v0.request import TxnOffsetCommitRequestTopic as TopicV0
from kio.schema.txn_offset_commit.v3.request import (
    TxnOffsetCommitRequest,
    TxnOffsetCommitRequestPartition,
    TxnOffsetCommitRequestTopic,
)
from kio.schema.write_txn_markers.v1.request import WritableTxnMarker, WritableTxnMarkerTopic, WriteTxnMarkersRequest
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from pykbroker.groups.offset_store import partition_for_group
from pykbroker.protocol.client import KafkaClientConnection

pytestmark = pytest.mark.timeout(120)

OFFSETS_PARTITIONS = 50


@pytest.fixture
def broker(broker_factory):
    """No coordinator plays along here: the producers' transactions are not verified (KIP-890 off)."""
    return broker_factory.make(config={"transaction.partition.verification.enable": False})


def run(coroutine, timeout: float = 90):
    return asyncio.run(asyncio.wait_for(coroutine, timeout))


async def connect(broker) -> KafkaClientConnection:
    connection = await KafkaClientConnection.connect(broker.host, broker.port, client_id="txn-offsets-test")
    await connection.negotiate_api_versions()
    return connection


async def create_topic(connection: KafkaClientConnection, name: str, partitions: int = 2) -> None:
    response = await connection.send(CreateTopicsRequest(
        topics=(CreatableTopic(name=name, num_partitions=i32(partitions), replication_factor=i16(1), assignments=(),
                               configs=()),),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)), validate_only=False))
    assert response.topics[0].error_code == ErrorCode.none, response


async def find_coordinator(connection: KafkaClientConnection, group: str) -> None:
    """Creates __consumer_offsets (as in Kafka); retried while the coordinator is not available yet."""
    for _ in range(200):
        answer = (await connection.send(FindCoordinatorRequest(key_type=i8(0), coordinator_keys=(group,)))).coordinators[0]
        if answer.error_code == ErrorCode.none:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"FindCoordinator({group}): {answer.error_code!r}")


async def ready(broker, topic: str | None, *groups: str) -> KafkaClientConnection:
    """A connection, the topic created (unless None), the groups' coordinator found."""
    connection = await connect(broker)
    if topic is not None:
        await create_topic(connection, topic)
    for group in groups:
        await find_coordinator(connection, group)
    return connection


def txn_commit(group: str, offsets: dict, *, producer_id: int = 1000, epoch: int = 0, generation: int = -1,
               member: str = "", instance: str | None = None, transactional_id: str = "txn-1") -> TxnOffsetCommitRequest:
    by_topic: dict[str, list] = {}
    for (topic, partition), (offset, metadata) in offsets.items():
        by_topic.setdefault(topic, []).append(TxnOffsetCommitRequestPartition(
            partition_index=i32(partition), committed_offset=i64(offset), committed_leader_epoch=i32(-1),
            committed_metadata=metadata))
    return TxnOffsetCommitRequest(
        transactional_id=transactional_id, group_id=group, producer_id=i64(producer_id), producer_epoch=i16(epoch),
        generation_id=i32(generation), member_id=member, group_instance_id=instance,
        topics=tuple(TxnOffsetCommitRequestTopic(name=t, partitions=tuple(p)) for t, p in by_topic.items()))


def errors_of(response) -> dict:
    return {(t.name, int(p.partition_index)): p.error_code for t in response.topics for p in t.partitions}


async def fetch(connection: KafkaClientConnection, group: str, topic: str, partitions, *, require_stable: bool) -> dict:
    """(partition -> (committed offset, error)) from OffsetFetch v8."""
    response = await connection.send(OffsetFetchRequest(groups=(OffsetFetchRequestGroup(
        group_id=group, topics=(OffsetFetchRequestTopics(name=topic, partition_indexes=tuple(map(i32, partitions))),)),),
        require_stable=require_stable))
    (answer,) = response.groups
    assert answer.error_code == ErrorCode.none, answer
    return {int(p.partition_index): (int(p.committed_offset), p.error_code) for t in answer.topics for p in t.partitions}


async def fetch_when_loaded(connection: KafkaClientConnection, group: str, topic: str, partitions) -> dict:
    """OffsetFetch (require_stable) once the group's partition is loaded (COORDINATOR_LOAD_IN_PROGRESS before)."""
    for _ in range(400):
        try:
            return await fetch(connection, group, topic, partitions, require_stable=True)
        except AssertionError:
            await asyncio.sleep(0.05)
    return await fetch(connection, group, topic, partitions, require_stable=True)


def test_txn_offset_commit_errors_as_kafka_answers_them(broker):
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"

    async def scenario():
        connection = await ready(broker, topic, group)
        assert connection.version_for(28, 3) == 3  # advertised v0-3
        invalid = errors_of(await connection.send(txn_commit("", {(topic, 0): (1, "")})))
        unknown = errors_of(await connection.send(txn_commit(group, {("no-such-topic", 0): (1, ""),
                                                                      (topic, 7): (1, "")})))
        stranger = errors_of(await connection.send(txn_commit(group, {(topic, 0): (1, "")}, generation=3,
                                                              member="someone")))
        too_large = errors_of(await connection.send(txn_commit(group, {(topic, 1): (1, "m" * 5000)})))
        await connection.aclose()
        return invalid, unknown, stranger, too_large

    invalid, unknown, stranger, too_large = run(scenario())
    assert invalid == {(topic, 0): ErrorCode.invalid_group_id}
    assert unknown == {("no-such-topic", 0): ErrorCode.unknown_topic_or_partition,
                       (topic, 7): ErrorCode.unknown_topic_or_partition}
    assert stranger == {(topic, 0): ErrorCode.unknown_member_id}
    assert too_large == {(topic, 1): ErrorCode.offset_metadata_too_large}
    assert broker.is_running()


def _marker(topic_partition: int, producer_id: int, epoch: int, commit: bool):
    return WriteTxnMarkersRequest(markers=(WritableTxnMarker(
        producer_id=i64(producer_id), producer_epoch=i16(epoch), transaction_result=commit,
        topics=(WritableTxnMarkerTopic(name="__consumer_offsets", partition_indexes=(i32(topic_partition),)),),
        coordinator_epoch=i32(0)),))


def _marker_errors(response) -> list:
    return [p.error_code for m in response.markers for t in m.topics for p in t.partitions]


def test_txn_offsets_become_visible_on_commit_and_vanish_on_abort_across_a_restart(broker):
    topic = f"t-{uuid.uuid4().hex[:8]}"
    committed_group, aborted_group = f"c-{uuid.uuid4().hex[:8]}", f"a-{uuid.uuid4().hex[:8]}"

    async def before_restart():
        connection = await ready(broker, topic, committed_group, aborted_group)
        v0 = TxnOffsetCommitRequestV0(transactional_id="txn-0", group_id=committed_group, producer_id=i64(2000),
                                      producer_epoch=i16(0), topics=(TopicV0(name=topic, partitions=(
                                          PartitionV0(partition_index=i32(0), committed_offset=i64(17),
                                                      committed_metadata="v0"),)),))
        assert errors_of(await connection.send(v0)) == {(topic, 0): ErrorCode.none}
        assert errors_of(await connection.send(txn_commit(committed_group, {(topic, 1): (5, "")}, producer_id=2000))) \
            == {(topic, 1): ErrorCode.none}
        assert errors_of(await connection.send(txn_commit(aborted_group, {(topic, 0): (9, "")}, producer_id=2001))) \
            == {(topic, 0): ErrorCode.none}
        pending = await fetch(connection, committed_group, topic, [0, 1], require_stable=True)
        invisible = await fetch(connection, committed_group, topic, [0, 1], require_stable=False)
        for producer_id, group, commit in ((2000, committed_group, True), (2001, aborted_group, False)):
            response = await connection.send(_marker(partition_for_group(group, OFFSETS_PARTITIONS), producer_id, 0,
                                                     commit))
            assert _marker_errors(response) == [ErrorCode.none]
        after = {group: await fetch(connection, group, topic, [0, 1], require_stable=True)
                 for group in (committed_group, aborted_group)}
        await connection.aclose()
        return pending, invisible, after

    pending, invisible, after = run(before_restart())
    assert pending == {0: (-1, ErrorCode.unstable_offset_commit), 1: (-1, ErrorCode.unstable_offset_commit)}
    assert invisible == {0: (-1, ErrorCode.none), 1: (-1, ErrorCode.none)}
    expected = {committed_group: {0: (17, ErrorCode.none), 1: (5, ErrorCode.none)},
                aborted_group: {0: (-1, ErrorCode.none), 1: (-1, ErrorCode.none)}}
    assert after == expected

    broker.restart()

    async def after_restart():
        connection = await ready(broker, None, committed_group, aborted_group)
        seen = {group: await fetch_when_loaded(connection, group, topic, [0, 1])
                for group in (committed_group, aborted_group)}
        await connection.aclose()
        return seen

    assert run(after_restart()) == expected


def test_an_open_transaction_stays_pending_across_a_restart_until_its_marker(broker):
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"o-{uuid.uuid4().hex[:8]}"

    async def open_transaction():
        connection = await ready(broker, topic, group)
        assert errors_of(await connection.send(txn_commit(group, {(topic, 0): (42, "")}, producer_id=3000))) == {
            (topic, 0): ErrorCode.none}
        await connection.aclose()

    run(open_transaction())
    broker.restart(kill=True)

    async def finish():
        connection = await ready(broker, None, group)
        before = await fetch_when_loaded(connection, group, topic, [0])
        response = await connection.send(_marker(partition_for_group(group, OFFSETS_PARTITIONS), 3000, 0, True))
        assert _marker_errors(response) == [ErrorCode.none]
        after = await fetch(connection, group, topic, [0], require_stable=True)
        await connection.aclose()
        return before, after

    before, after = run(finish())
    assert before == {0: (-1, ErrorCode.unstable_offset_commit)}
    assert after == {0: (42, ErrorCode.none)}


def test_a_txn_commit_from_a_fenced_producer_epoch_is_refused_and_not_pending(broker):
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"f-{uuid.uuid4().hex[:8]}"

    async def scenario():
        connection = await ready(broker, topic, group)
        current = errors_of(await connection.send(txn_commit(group, {(topic, 0): (5, "")}, producer_id=4000, epoch=3)))
        zombie = errors_of(await connection.send(txn_commit(group, {(topic, 1): (9, "")}, producer_id=4000, epoch=2)))
        pending = await fetch(connection, group, topic, [0, 1], require_stable=True)
        await connection.aclose()
        return current, zombie, pending

    current, zombie, pending = run(scenario())
    assert current == {(topic, 0): ErrorCode.none}
    assert zombie == {(topic, 1): ErrorCode.invalid_producer_epoch}  # what Kafka's log answers the coordinator
    assert pending == {0: (-1, ErrorCode.unstable_offset_commit), 1: (-1, ErrorCode.none)}

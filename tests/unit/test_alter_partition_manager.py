"""AlterPartitionManager (pykbroker/cluster/alter_partition.py) against a small asyncio controller that decodes
AlterPartition v3 with pykbroker.protocol.apis.codec_for(56, 3), and real Partitions on real logs proposing ISR
shrinks. Kafka's DefaultAlterPartitionManager is the reference: batching, one request in flight, retries after
top-level errors and lost connections, per-partition answers."""

from __future__ import annotations

import asyncio
import datetime
import struct
import sys

import pytest
from pykbroker.cluster.alter_partition import AlterPartitionManager
from pykbroker.log.config import LogConfig
from pykbroker.log.partition_log import PartitionLog
from pykbroker.protocol.apis import codec_for
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.framing import encode_response
from pykbroker.replication.partition import Partition

LAG = 30_000
T0 = 1_700_000_000_000
TOPIC_ID = __import__("uuid").UUID("01438975-491d-46a3-92b1-29aeff041e95")


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


async def until(condition, what: str, timeout: float = 10) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


class FakeController:
    """Answers ApiVersions and AlterPartition v3; ``policy(body)`` returns the AlterPartition response body, or
    None to drop the connection instead of answering."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.requests: list = []  # decoded AlterPartition bodies
        self.seen: list[tuple[int, str | None]] = []  # (api key, client id) of every request, in order
        self.port = 0

    async def __aenter__(self) -> "FakeController":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader, writer) -> None:
        try:
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                frame = await reader.readexactly(size)
                api_key, version, correlation_id = struct.unpack_from(">hhi", frame)
                codec = codec_for(api_key, version)
                header, position = codec.read_request_header(frame, 0)
                body, _ = codec.read_request_body(frame, position)
                self.seen.append((api_key, header.client_id))
                if api_key == 18:
                    schema = sys.modules[codec.response_type.__module__]
                    response = schema.ApiVersionsResponse(
                        error_code=ErrorCode.none, throttle_time=datetime.timedelta(0), api_keys=(
                            schema.ApiVersion(api_key=18, min_version=0, max_version=3),
                            schema.ApiVersion(api_key=56, min_version=0, max_version=3)))
                else:
                    assert (api_key, version) == (56, 3)
                    self.requests.append(body)
                    response = await self.policy(body)
                    if response is None:
                        return
                writer.write(b"".join(bytes(p) for p in encode_response(codec, correlation_id, response)))
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()


def answer(body, *, top_error: ErrorCode = ErrorCode.none, errors: dict[int, ErrorCode] | None = None,
           leader_epoch: dict[int, int] | None = None, omit: tuple[int, ...] = ()):
    """The controller's answer: every proposed ISR accepted with partition epoch + 1, unless told otherwise."""
    from kio.schema.alter_partition.v3 import response as ap

    errors, leader_epoch = errors or {}, leader_epoch or {}
    topics = []
    for topic in body.topics:
        parts = []
        for p in topic.partitions:
            if p.partition_index in omit:
                continue
            error = errors.get(p.partition_index, ErrorCode.none)
            parts.append(ap.PartitionData(
                partition_index=p.partition_index, error_code=error, leader_id=body.broker_id,
                leader_epoch=leader_epoch.get(p.partition_index, p.leader_epoch),
                isr=tuple(b.broker_id for b in p.new_isr_with_epochs) if error == ErrorCode.none else (),
                leader_recovery_state=0, partition_epoch=p.partition_epoch + 1 if error == ErrorCode.none else -1))
        topics.append(ap.TopicData(topic_id=topic.topic_id, partitions=tuple(parts)))
    return ap.AlterPartitionResponse(throttle_time=datetime.timedelta(0), error_code=top_error,
                                     topics=tuple(topics) if top_error == ErrorCode.none else ())


def partitions_of(body) -> list[int]:
    return sorted(p.partition_index for topic in body.topics for p in topic.partitions)


def make_manager(controller: FakeController, controller_id=lambda: 0) -> AlterPartitionManager:
    return AlterPartitionManager(
        1, lambda: 5, controller_id, lambda node: ("127.0.0.1", controller.port) if node == 0 else None,
        lambda name: TOPIC_ID if name == "t" else None, clock=lambda: T0 + LAG + 1)


_open_logs: list[PartitionLog] = []


@pytest.fixture(autouse=True)
def close_logs():
    """Every log a test opened is closed after it (no descriptor left for a later test to see closing)."""
    yield
    while _open_logs:
        _open_logs.pop().close()


def leaders(tmp_path, manager, count: int) -> list[Partition]:
    out = []
    for index in range(count):
        log = PartitionLog.open(tmp_path / f"t-{index}", LogConfig())
        _open_logs.append(log)
        p = Partition("t", index, log, broker_id=1, replica_lag_time_max_ms=LAG, alter_partition=manager)
        assert p.become_leader(1, (1, 2, 3), (1, 2, 3), 0, now_ms=T0) == ErrorCode.none
        out.append(p)
    return out


def shrink(p: Partition):
    """The ISR check after replica.lag.time.max.ms: followers 2 and 3 never fetched, so the ISR shrinks to [1]."""
    change = p.maybe_shrink_isr(T0 + LAG + 1)
    assert change is not None and change.isr == (1,)
    return change


def test_changes_are_batched_with_one_request_in_flight(tmp_path):
    async def scenario():
        gate = asyncio.Event()

        async def policy(body):
            if len(controller.requests) == 1:
                await gate.wait()
            return answer(body)

        async with FakeController(policy) as controller:
            manager = make_manager(controller)
            p0, p1, p2 = leaders(tmp_path, manager, 3)
            try:
                shrink(p0)
                await until(lambda: len(controller.requests) == 1, "the first AlterPartition")
                shrink(p1)
                shrink(p2)
                assert manager.pending == 2 and len(controller.requests) == 1  # waiting for the one in flight
                assert p1.maximal_isr == (1, 2, 3)  # a pending shrink does not count yet
                gate.set()
                await until(lambda: all(p.pending_isr_change is None for p in (p0, p1, p2)), "every answer")
                first, second = controller.requests
                assert partitions_of(first) == [0] and partitions_of(second) == [1, 2]
                assert (first.broker_id, first.broker_epoch) == (1, 5)
                data = first.topics[0].partitions[0]
                assert first.topics[0].topic_id == TOPIC_ID
                assert (data.leader_epoch, data.partition_epoch, data.leader_recovery_state) == (1, 0, 0)
                assert [(b.broker_id, b.broker_epoch) for b in data.new_isr_with_epochs] == [(1, -1)]
                for p in (p0, p1, p2):
                    assert (p.isr, p.partition_epoch) == ((1,), 1)
                # The controller channel: client id = broker id, ApiVersions first (as Kafka 3.7.1 does).
                assert controller.seen == [(18, "1"), (56, "1"), (56, "1")]
            finally:
                await manager.close()

    run(scenario())


def test_no_controller_a_lost_connection_and_a_top_level_error_are_retried(tmp_path):
    async def scenario():
        async def policy(body):
            if len(controller.requests) == 1:
                return None  # the controller goes away mid-request
            if len(controller.requests) == 2:
                return answer(body, top_error=ErrorCode.not_controller)
            return answer(body)

        async with FakeController(policy) as controller:
            asked = []

            def controller_id():
                asked.append(None)
                return 0 if len(asked) > 3 else None  # no controller elected for the first three attempts

            manager = make_manager(controller, controller_id=controller_id)
            (p0,) = leaders(tmp_path, manager, 1)
            try:
                shrink(p0)
                assert manager.pending == 1
                await until(lambda: p0.pending_isr_change is None, "the change to be committed")
                assert len(asked) == 6 and len(controller.requests) == 3  # 3 with no controller, 3 sent
                assert (p0.isr, p0.partition_epoch) == ((1,), 1)
            finally:
                await manager.close()

    run(scenario())


def test_partition_answers_commit_fail_wait_or_are_sent_again(tmp_path):
    async def scenario():
        async def policy(body):
            if len(controller.requests) == 1:
                return answer(body, errors={0: ErrorCode.fenced_leader_epoch, 1: ErrorCode.operation_not_attempted},
                              leader_epoch={2: 0}, omit=(3,))
            return answer(body)

        async with FakeController(policy) as controller:
            manager = make_manager(controller)
            p0, p1, p2, p3 = leaders(tmp_path, manager, 4)
            try:
                changes = [shrink(p) for p in (p0, p1, p2, p3)]
                await until(lambda: p3.pending_isr_change is None, "the omitted partition's second answer")
                assert [partitions_of(body) for body in controller.requests] == [[0, 1, 2, 3], [3]]
                # FENCED_LEADER_EPOCH: not retried, pending until a LeaderAndIsr resets the partition.
                assert p0.pending_isr_change is changes[0] and p0.isr == (1, 2, 3)
                # OPERATION_NOT_ATTEMPTED: back to the committed ISR; the next ISR check proposes again.
                assert p1.pending_isr_change is None and p1.isr == (1, 2, 3)
                # NONE for another leader epoch: ignored, the partition stays pending.
                assert p2.pending_isr_change is changes[2] and p2.isr == (1, 2, 3)
                assert (p3.isr, p3.partition_epoch) == ((1,), 1)
                assert p0.become_leader(2, (1, 2), (1, 2, 3), 4, now_ms=T0) == ErrorCode.none
                assert p0.pending_isr_change is None and p0.isr == (1, 2)
            finally:
                await manager.close()

    run(scenario())


def test_an_answer_for_a_change_the_partition_no_longer_has_is_ignored(tmp_path):
    async def scenario():
        gate = asyncio.Event()

        async def policy(body):
            await gate.wait()
            return answer(body)

        async with FakeController(policy) as controller:
            manager = make_manager(controller)
            p0, p1 = leaders(tmp_path, manager, 2)
            try:
                shrink(p0)
                await until(lambda: len(controller.requests) == 1, "the AlterPartition")
                # A LeaderAndIsr arrives first (new epoch, ISR [1, 2], partition epoch 7).
                assert p0.become_leader(2, (1, 2), (1, 2, 3), 7, now_ms=T0) == ErrorCode.none
                shrink(p1)  # sent only after the first answer is handled: it marks that point
                gate.set()
                await until(lambda: p1.pending_isr_change is None, "both answers")
                assert [partitions_of(body) for body in controller.requests] == [[0], [1]]
                assert (p0.isr, p0.partition_epoch, p0.pending_isr_change) == ((1, 2), 7, None)
            finally:
                await manager.close()

    run(scenario())


def test_a_change_follows_the_controller_when_it_moves(tmp_path):
    async def scenario():
        current = {"id": 0}

        async def old_policy(body):
            current["id"] = 1  # a new controller was elected meanwhile
            return answer(body, top_error=ErrorCode.not_controller)

        async def new_policy(body):
            return answer(body)

        async with FakeController(old_policy) as old, FakeController(new_policy) as new:
            ports = {0: old.port, 1: new.port}
            manager = AlterPartitionManager(
                1, lambda: 5, lambda: current["id"], lambda node: ("127.0.0.1", ports[node]),
                lambda name: TOPIC_ID, clock=lambda: T0 + LAG + 1)
            (p0,) = leaders(tmp_path, manager, 1)
            try:
                shrink(p0)
                await until(lambda: p0.pending_isr_change is None, "the change to be committed")
                assert (len(old.requests), len(new.requests)) == (1, 1) and p0.isr == (1,)
                assert manager.clients.connection(0) is None  # nothing kept open to the old controller
            finally:
                await manager.close()

    run(scenario())

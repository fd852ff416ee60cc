"""The connection layer without sockets: a fake transport records writes and read pauses.

Kafka's muted channel: one request in processing per connection, the next buffered frame taken only once
the previous answer is handed to the transport, buffered frames processed without more bytes arriving;
reads paused while busy, while the transport is above its high-water mark, and while the broker-wide
request memory is exhausted; a handler that raises or is cancelled is answered and the connection goes on.
Request memory is reserved per frame (Kafka's non-strict pool): half-received frames always finish.
The broker's closes abort the transport (unsent bytes dropped) and free the connection's file pins.
"""

import asyncio
import functools
import logging
import os
import struct
import types

from kio.schema.api_versions.v0.response import ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.schema.heartbeat.v0.response import HeartbeatResponse

from pykbroker.log.files import DescriptorBudget, LazyFile
from pykbroker.protocol.apis import SINGLE_NODE_APIS
from pykbroker.log.partition_log import FileSlice, ReadResult
from pykbroker.replication.replica_manager import FileRecords
from pykbroker.server import connection as connection_module
from pykbroker.server.connection import RESERVED_BYTES, KafkaConnection, RequestMemory
from pykbroker.server.dispatch import CLOSE_CONNECTION, CloseConnection

API_VERSIONS, HEARTBEAT = 18, 12


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.reading = True
        self.closed = False
        self.aborted = False
        self.protocol = None  # told connection_lost on abort, as asyncio's transports do (soon, from the loop)

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        self.high_water = high

    def write(self, data) -> None:
        self.written.append(bytes(data))

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        if not self.closed and self.protocol is not None:
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)
        self.closed = self.aborted = True

    def writelines(self, pieces) -> None:  # (the connection gathers small answers into one writelines)
        self.written.append(b"".join(pieces))

    def frames(self) -> list[bytes]:
        """The response frames written, however the writes split them."""
        data, frames = b"".join(self.written), []
        while len(data) >= 4:
            (size,) = struct.unpack_from(">i", data)
            frames.append(data[:4 + size])
            data = data[4 + size:]
        return frames

    def correlation_ids(self) -> list[int]:
        return [struct.unpack_from(">i", frame, 4)[0] for frame in self.frames()]


class FakeBroker:
    apis = SINGLE_NODE_APIS
    stats = None  # metrics off

    def __init__(self) -> None:
        self.connections = set()

    def admit(self, connection):
        self.connections.add(connection)

    def release(self, connection):
        self.connections.discard(connection)


def api_versions_frame(correlation_id: int) -> bytes:
    payload = struct.pack(">hhih", API_VERSIONS, 0, correlation_id, -1)
    return struct.pack(">i", len(payload)) + payload


def heartbeat_frame(correlation_id: int, group: bytes) -> bytes:
    payload = struct.pack(">hhih", HEARTBEAT, 0, correlation_id, -1)
    payload += struct.pack(">h", len(group)) + group + struct.pack(">i", 1) + struct.pack(">h", 1) + b"m"
    return struct.pack(">i", len(payload)) + payload


def in_loop(test):
    """Run an async test in a fresh event loop (the connection needs a running loop)."""
    @functools.wraps(test)
    def run(*args, **kwargs):  # pytest's fixtures, by the test's own signature (functools.wraps)
        asyncio.run(test(*args, **kwargs))
    return run


ANSWER = ApiVersionsResponse(error_code=ErrorCode.none, api_keys=())


def connect(handlers, memory=None, max_request_bytes=1 << 20):
    connection = KafkaConnection(FakeBroker(), handlers, max_request_bytes, memory or RequestMemory(-1))
    transport = FakeTransport()
    transport.protocol = connection
    connection.connection_made(transport)
    return connection, transport


async def settle(rounds: int = 5) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


@in_loop
async def test_a_request_behind_an_asynchronous_one_runs_after_its_answer_without_more_bytes():
    gate = asyncio.get_running_loop().create_future()
    handled = []

    def handler(ctx, body):
        handled.append(ctx.request.correlation_id)
        if ctx.request.correlation_id == 1:
            async def later():
                await gate
                return ANSWER
            return later()
        return ANSWER

    connection, transport = connect({API_VERSIONS: handler})
    connection.data_received(api_versions_frame(1) + api_versions_frame(2) + api_versions_frame(3))
    assert handled == [1] and transport.written == []
    assert not transport.reading  # muted while the request is in processing
    gate.set_result(None)
    for _ in range(5):
        await asyncio.sleep(0)
    assert handled == [1, 2, 3]
    assert transport.correlation_ids() == [1, 2, 3]
    assert transport.reading


@in_loop
async def test_a_full_transport_stops_taking_frames_until_it_drains():
    connection, transport = connect({API_VERSIONS: lambda ctx, body: ANSWER})
    transport.writelines = lambda pieces: (transport.written.append(b"".join(pieces)), connection.pause_writing())
    connection.data_received(api_versions_frame(1) + api_versions_frame(2) + api_versions_frame(3))
    assert transport.written == []  # gathered: the answers of one loop iteration go out in one write
    await settle()
    assert transport.correlation_ids() == [1, 2, 3] and len(transport.written) == 1 and not transport.reading
    connection.data_received(api_versions_frame(4))  # bytes already on their way: not taken while full
    await settle()
    assert transport.correlation_ids() == [1, 2, 3] and not transport.reading
    transport.writelines = lambda pieces: transport.written.append(b"".join(pieces))
    connection.resume_writing()
    await settle()
    assert transport.correlation_ids() == [1, 2, 3, 4] and transport.reading


@in_loop
async def test_a_handler_that_raises_or_is_cancelled_is_answered_and_the_connection_goes_on():
    def handler(ctx, body):
        if ctx.request.correlation_id == 1:
            raise RuntimeError("a bug")
        if ctx.request.correlation_id == 2:
            async def cancelled():
                future = asyncio.get_running_loop().create_future()
                future.cancel()
                return await future
            return cancelled()
        return HeartbeatResponse(error_code=ErrorCode.none)

    connection, transport = connect({HEARTBEAT: handler})
    connection.data_received(heartbeat_frame(1, b"g") + heartbeat_frame(2, b"g") + heartbeat_frame(3, b"g"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert transport.correlation_ids() == [1, 2, 3]
    errors = [struct.unpack_from(">h", frame, 8)[0] for frame in transport.frames()]
    assert errors == [ErrorCode.unknown_server_error.value, ErrorCode.unknown_server_error.value, 0]
    assert not transport.closed


@in_loop
async def test_a_frame_is_reserved_whole_when_its_size_is_read_and_released_once_decoded():
    memory = RequestMemory(2 * RESERVED_BYTES)
    big, big_transport = connect({API_VERSIONS: lambda ctx, body: ANSWER}, memory)
    waiting, waiting_transport = connect({API_VERSIONS: lambda ctx, body: ANSWER}, memory)
    small, small_transport = connect({API_VERSIONS: lambda ctx, body: ANSWER}, memory)
    frame = api_versions_frame(5)
    frame = struct.pack(">i", 900_000) + frame[4:] + b"\0" * (900_000 - len(frame) + 4)
    big.data_received(frame[:10])  # the size is read: the whole frame is reserved (past the bound)
    assert memory.used == 900_000 and memory.exhausted and big_transport.reading
    waiting.data_received(frame[:10])  # starting a big frame while the pool is exhausted: not read
    assert not waiting_transport.reading and memory.used == 900_000
    small.data_received(api_versions_frame(7))  # a small request still passes
    assert small_transport.reading and memory.used == 900_000
    await settle()
    assert small_transport.correlation_ids() == [7]
    big.data_received(frame[10:])  # a reserved frame is never paused: it finishes and frees the pool
    await settle()
    assert big_transport.correlation_ids() == [5]
    assert waiting_transport.reading and memory.used == 900_000  # the waiting one got its reservation
    waiting.connection_lost(None)
    assert memory.used == 0 and not memory.exhausted


@in_loop
async def test_bytes_arriving_before_the_wake_up_take_the_freed_memory_and_reading_resumes():
    memory = RequestMemory(2 * RESERVED_BYTES)
    memory.add(2 * RESERVED_BYTES)  # held by others
    connection, transport = connect({}, memory)
    connection.data_received(struct.pack(">i", 900_000))
    assert not transport.reading
    memory.release(2 * RESERVED_BYTES)
    connection.data_received(b"\0" * 10)  # bytes the socket had already read arrive before the wake-up
    assert transport.reading and memory.used == 900_000 and not memory._paused
    await settle()
    assert transport.reading and memory.used == 900_000


def _two_honest_producers_send_half_way(memory):
    """The reviewer's repro (/tmp/rev/deadlock.py): two 900 KB frames, 600 KB of each received."""
    frame = struct.pack(">i", 900_000) + b"\0" * 900_000
    connections = [connect({}, memory) for _ in range(2)]
    for connection, _ in connections:
        connection.data_received(frame[:600_000])
    return frame, connections


@in_loop
async def test_half_received_frames_never_deadlock_the_request_memory():
    memory = RequestMemory(1024 * 1024)  # queued.max.request.bytes = 1 MiB
    frame, connections = _two_honest_producers_send_half_way(memory)
    # Both frames were reserved when their size was read (the second past the bound): both stay readable.
    assert memory.used == 2 * 900_000 and memory.exhausted
    assert [transport.reading for _, transport in connections] == [True, True]
    for connection, transport in connections:
        connection.data_received(frame[600_000:])
        assert transport.closed  # the frame completed (and, being zeros, is not a request: closed)
    await settle()
    assert memory.used == 0 and not memory._paused


@in_loop
async def test_a_bound_of_0_or_less_is_unbounded():
    for limit in (0, -1):
        memory = RequestMemory(limit)
        _, connections = _two_honest_producers_send_half_way(memory)
        assert not memory.exhausted and all(transport.reading for _, transport in connections)


@in_loop
async def test_any_bytes_received_count_as_activity(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(connection_module.time, "monotonic", lambda: now[0])
    connection, _ = connect({})
    connection.data_received(struct.pack(">i", 900_000) + b"\0" * 10)
    now[0] = 200.0
    connection.data_received(b"\0" * 10)  # a slow upload that progresses is not idle
    assert connection.idle_since == 200.0


@in_loop
async def test_an_oversized_frame_closes_the_connection_without_allocating_it():
    connection, transport = connect({}, max_request_bytes=1000)
    connection.data_received(struct.pack(">i", 1001) + b"\0" * 10)
    assert transport.closed


@in_loop
async def test_close_aborts_and_frees_the_slot_and_the_pins_of_an_unsent_response(tmp_path):
    budget = DescriptorBudget(10)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"r" * (3 * connection_module.CHUNK_BYTES))
    file = LazyFile(path, os.O_RDONLY, budget)
    pin = file.pin()
    records = FileRecords(ReadResult([FileSlice(path, 0, 3 * connection_module.CHUNK_BYTES, pin.fd, pin)]))
    del pin
    codec = types.SimpleNamespace(flexible_response_header=False, write_response_body=lambda out, body: out.write(body))
    request = types.SimpleNamespace(api_key=1, api_version=4, correlation_id=9, codec=codec)
    connection, transport = connect({})
    # A client that never reads: the transport stays above its high-water mark after the first chunk.
    transport.write = lambda data: (transport.written.append(bytes(data)), connection.pause_writing())
    connection._complete(request, records)
    del records
    assert budget.pinned == 1 and connection in connection.broker.connections
    connection.close()
    assert transport.aborted  # not a graceful close, which would wait for a drain that never comes
    await settle()
    assert budget.pinned == 0 and not connection.broker.connections and not connection._outbox
    file.close()


@in_loop
async def test_close_connection_from_a_handler_aborts_with_one_log_line(caplog):
    connection, transport = connect({API_VERSIONS: lambda ctx, body: CLOSE_CONNECTION})
    with caplog.at_level(logging.WARNING, logger=connection_module.__name__):
        connection.data_received(api_versions_frame(1) + api_versions_frame(2))
    assert transport.aborted and transport.written == []
    assert len(caplog.records) == 1 and "correlation id 1" in caplog.records[0].getMessage()


@in_loop
async def test_a_failing_error_answer_closes_the_connection_once_and_never_leaves_it_paused(monkeypatch, caplog):
    def broken(request):
        raise ValueError("the error answer builder has a bug")

    def handler(ctx, body):
        if ctx.request.correlation_id == 1:
            raise RuntimeError("a bug")

        async def later():
            raise RuntimeError("a later bug")
        return later()

    monkeypatch.setattr(connection_module, "error_response", broken)
    for frames in (api_versions_frame(1), api_versions_frame(2)):  # synchronous, then asynchronous
        caplog.clear()
        connection, transport = connect({API_VERSIONS: handler})
        with caplog.at_level(logging.WARNING, logger=connection_module.__name__):
            connection.data_received(frames)
            await settle()
        assert transport.aborted and transport.written == []
        assert [r.levelno for r in caplog.records] == [logging.ERROR]  # log.exception, once
        assert not connection._busy and not connection._inflight


@in_loop
async def test_an_acks_0_error_answer_closes_the_connection():
    connection, transport = connect({API_VERSIONS: lambda ctx, body: CloseConnection("acks=0 produce failed")})
    connection.data_received(api_versions_frame(3))
    assert transport.aborted


class Chunked:
    """A Deferred body value: its length now, its bytes only when asked for, three at a time."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.asked = 0

    def __len__(self) -> int:
        return len(self.data)

    def chunks(self, size):
        for start in range(0, len(self.data), 3):
            self.asked += 1
            yield self.data[start:start + 3]


@in_loop
async def test_deferred_record_data_is_read_only_as_the_transport_drains_and_holds_the_next_request():
    deferred = Chunked(b"abcdefgh")
    codec = types.SimpleNamespace(flexible_response_header=False,
                                  write_response_body=lambda out, body: (out.write(b"xy"), out.write(body)))
    request = types.SimpleNamespace(api_key=1, api_version=4, correlation_id=9, codec=codec)
    connection, transport = connect({API_VERSIONS: lambda ctx, body: ANSWER})
    transport.write = lambda data: (transport.written.append(bytes(data)), connection.pause_writing())
    transport.writelines = lambda pieces: transport.write(b"".join(pieces))
    connection._complete(request, deferred)
    assert deferred.asked == 0 and transport.written == [struct.pack(">ii", 14, 9) + b"xy"]
    connection.data_received(api_versions_frame(2))  # waits: the response before it is not handed over
    connection.resume_writing()
    connection.resume_writing()
    assert deferred.asked == 2 and len(transport.written) == 3  # header, two chunks; request 2 waits
    connection.resume_writing()
    connection.resume_writing()
    await settle()
    assert b"".join(transport.written[:4]) == struct.pack(">ii", 14, 9) + b"xyabcdefgh"
    assert struct.unpack_from(">i", transport.written[-1], 4)[0] == 2 and len(transport.written) == 5


def api_versions_v1_frame(correlation_id: int) -> bytes:
    payload = struct.pack(">hhih", API_VERSIONS, 1, correlation_id, 1) + b"c"  # client id "c"
    return struct.pack(">i", len(payload)) + payload


@in_loop
async def test_a_handler_that_raises_under_a_request_quota_is_recorded_and_throttled():
    """Kafka's sendErrorResponseMaybeThrottle: the failed request's time counts against request_percentage, its
    error answer carries the throttle and the connection is muted for it; the mute counts as idle time."""
    from pykbroker.security.quotas import DEFAULT, ClientQuotas, QuotaEntity
    from pykbroker.server.throttling import with_client_quotas

    broker = FakeBroker()
    broker.quotas = ClientQuotas()
    broker.quotas.apply_entity_config(QuotaEntity(client_id=DEFAULT), {"request_percentage": "0.0000001"})

    def raising(ctx, body):
        raise RuntimeError("handler bug")

    connection = KafkaConnection(broker, with_client_quotas({API_VERSIONS: raising}), 1 << 20, RequestMemory(-1))
    transport = FakeTransport()
    transport.protocol = connection
    connection.connection_made(transport)
    connection.data_received(api_versions_v1_frame(1) + api_versions_v1_frame(2))
    await settle()
    assert transport.correlation_ids() == [1]  # the second waits for the throttle
    # v1: error_code, api_keys (empty), throttle_time_ms
    error, keys, throttle = struct.unpack_from(">hii", transport.written[0], 8)
    assert error == -1 and keys == 0 and 0 < throttle <= 1000, (error, keys, throttle)
    assert connection.throttled
    assert connection.idle_since is not None  # muted, and idle as far as connections.max.idle.ms goes
    connection.close()
    await settle()


# -- acks=all Produce requests pipelined behind an appended one (see server/connection.py) ---------------------

PRODUCE = 0


def produce_frame(correlation_id: int) -> bytes:
    """Produce v3 without partitions: header v1 (no client id), transactional_id null, acks -1, timeout 30 s."""
    payload = struct.pack(">hhih", PRODUCE, 3, correlation_id, -1) + struct.pack(">hhii", -1, -1, 30_000, 0)
    return struct.pack(">i", len(payload)) + payload


def produce_answer():
    import datetime

    from kio.schema.produce.v3.response import ProduceResponse
    return ProduceResponse(responses=(), throttle_time=datetime.timedelta(0))


async def release(gates: dict) -> None:
    """Let every waiting request finish (no task is left pending when the test's loop closes)."""
    for gate in list(gates.values()):
        if not gate.done():
            gate.set_result(None)
    await settle()


def waiting_producer(gates: dict, handled: list, *, appended: bool = True, quota=None):
    """A Produce handler whose requests wait on ``gates[correlation id]`` after 'appending' (ctx.appended)."""
    def handler(ctx, body):
        cid = ctx.request.correlation_id
        handled.append(cid)
        if quota is not None:
            ctx.quota = quota
        ctx.appended = appended
        gate = gates.setdefault(cid, asyncio.get_running_loop().create_future())

        async def after_replication():
            await gate
            return produce_answer()
        return after_replication()
    return handler


@in_loop
async def test_appended_produces_go_on_while_earlier_ones_wait_and_are_answered_in_request_order():
    gates, handled = {}, []
    connection, transport = connect({PRODUCE: waiting_producer(gates, handled), API_VERSIONS: lambda c, b: ANSWER})
    connection.data_received(produce_frame(1) + produce_frame(2) + produce_frame(3) + api_versions_frame(4)
                             + produce_frame(5))
    assert handled == [1, 2, 3]  # the ApiVersions behind them waits for their answers (not pipelined)
    assert not transport.reading and connection.idle_since is None
    gates[3].set_result(None)
    gates[2].set_result(None)
    await settle()
    assert transport.written == []  # 2 and 3 are ready, but 1 is not answered yet
    gates[1].set_result(None)
    await settle()
    assert transport.correlation_ids() == [1, 2, 3, 4]  # in request order, then the held ApiVersions at once
    assert handled == [1, 2, 3, 5]  # and the Produce after it, which waits in turn
    gates[5].set_result(None)
    await settle()
    assert transport.correlation_ids() == [1, 2, 3, 4, 5] and transport.reading and not connection._busy


@in_loop
async def test_at_most_max_pipelined_produces_are_in_processing_at_once():
    gates, handled = {}, []
    connection, transport = connect({PRODUCE: waiting_producer(gates, handled)})
    cap = connection_module.MAX_PIPELINED_PRODUCES
    connection.data_received(b"".join(produce_frame(cid) for cid in range(1, cap + 3)))
    assert handled == list(range(1, cap + 1)) and not transport.reading
    gates[1].set_result(None)
    await settle()
    assert transport.correlation_ids() == [1] and handled == list(range(1, cap + 2))  # one answered, one more in
    assert not transport.reading  # at the cap again
    await release(gates)


@in_loop
async def test_a_produce_that_has_not_appended_or_runs_under_a_quota_keeps_the_channel_muted():
    from pykbroker.server.throttling import RequestQuota
    for kwargs in ({"appended": False}, {"quota": RequestQuota()}):  # e.g. waiting on a transaction's verification
        gates, handled = {}, []
        connection, transport = connect({PRODUCE: waiting_producer(gates, handled, **kwargs)})
        connection.data_received(produce_frame(1) + produce_frame(2))
        assert handled == [1] and not transport.reading, kwargs
        gates[1].set_result(None)
        await settle()
        assert transport.correlation_ids() == [1] and handled == [1, 2], kwargs
        await release(gates)


@in_loop
async def test_a_produce_answered_at_once_behind_waiting_ones_keeps_its_turn():
    gates, handled = {}, []
    waiting = waiting_producer(gates, handled)

    def handler(ctx, body):  # request 2 fails at once (say, NOT_LEADER_OR_FOLLOWER for its only partition)
        if ctx.request.correlation_id == 2:
            handled.append(2)
            return produce_answer()
        return waiting(ctx, body)

    connection, transport = connect({PRODUCE: handler})
    connection.data_received(produce_frame(1) + produce_frame(2) + produce_frame(3))
    assert handled == [1, 2, 3] and transport.written == []
    gates[3].set_result(None)
    gates[1].set_result(None)
    await settle()
    assert transport.correlation_ids() == [1, 2, 3]


@in_loop
async def test_a_connection_lost_with_pipelined_produces_cancels_every_one_and_answers_none():
    gates, handled = {}, []
    connection, transport = connect({PRODUCE: waiting_producer(gates, handled)})
    connection.data_received(produce_frame(1) + produce_frame(2) + produce_frame(3))
    tasks = [pending.task for pending in connection._inflight]
    assert len(tasks) == 3
    connection.close()
    await settle()
    assert all(task.done() for task in tasks) and not connection._inflight
    for gate in gates.values():  # (cancelled with the handlers that awaited them)
        if not gate.done():
            gate.set_result(None)
    await settle()
    assert transport.written == [] and transport.aborted


@in_loop
async def test_gathered_answers_are_written_before_a_close_and_big_ones_at_once():
    def handler(ctx, body):
        return CloseConnection("acks=0 produce failed") if ctx.request.correlation_id == 2 else ANSWER

    connection, transport = connect({API_VERSIONS: handler})
    connection.data_received(api_versions_frame(1) + api_versions_frame(2) + api_versions_frame(3))
    assert transport.aborted and transport.correlation_ids() == [1]  # answered before the close, as before
    await settle()
    assert transport.correlation_ids() == [1]  # nothing after it

    big = bytearray(connection_module.CORK_BYTES)
    connection, transport = connect({})
    connection._send(bytearray(b"x"))
    connection._send(big)  # past the bound: what was gathered and this one go out now
    assert b"".join(transport.written) == b"x" + big
    connection._send(bytearray(connection_module.CORK_BYTES + 1))
    assert len(transport.written[-1]) == connection_module.CORK_BYTES + 1


@in_loop
async def test_a_frame_too_short_for_a_header_behind_pipelined_produces_closes_the_connection_after_their_answers(caplog):
    gates, handled = {}, []
    connection, transport = connect({PRODUCE: waiting_producer(gates, handled)})
    with caplog.at_level(logging.WARNING, logger=connection_module.__name__):
        connection.data_received(produce_frame(1) + struct.pack(">i", 1) + b"\0")  # nothing raised here
        assert handled == [1] and not transport.aborted  # it waits behind the produce, as any non-Produce
        gates[1].set_result(None)
        await settle()
    assert transport.correlation_ids() == [1] and transport.aborted  # answered, then refused with a log line
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "too short for a request header" in caplog.records[0].getMessage()

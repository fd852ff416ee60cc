"""The connection layer without sockets: a fake transport records writes and read pauses.

Kafka's muted channel: one request in processing per connection, the next buffered frame taken only once
the previous answer is handed to the transport, buffered frames processed without more bytes arriving;
reads paused while busy, while the transport is above its high-water mark, and while the broker-wide
request memory is exhausted; a handler that raises or is cancelled is answered and the connection goes on.
"""

import asyncio
import functools
import struct
import types

from kio.schema.api_versions.v0.response import ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.schema.heartbeat.v0.response import HeartbeatResponse

from pykbroker.server.connection import RESERVED_BYTES, KafkaConnection, RequestMemory

API_VERSIONS, HEARTBEAT = 18, 12


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.reading = True
        self.closed = False

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

    def correlation_ids(self) -> list[int]:
        return [struct.unpack_from(">i", frame, 4)[0] for frame in self.written]


class FakeBroker:
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
    def run():
        asyncio.run(test())
    return run


ANSWER = ApiVersionsResponse(error_code=ErrorCode.none, api_keys=())


def connect(handlers, memory=None, max_request_bytes=1 << 20):
    connection = KafkaConnection(FakeBroker(), handlers, max_request_bytes, memory or RequestMemory(-1))
    transport = FakeTransport()
    connection.connection_made(transport)
    return connection, transport


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
    transport.write = lambda data: (transport.written.append(bytes(data)), connection.pause_writing())
    connection.data_received(api_versions_frame(1) + api_versions_frame(2) + api_versions_frame(3))
    assert transport.correlation_ids() == [1] and not transport.reading
    transport.write = lambda data: transport.written.append(bytes(data))
    connection.resume_writing()
    assert transport.correlation_ids() == [1, 2, 3] and transport.reading


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
    errors = [struct.unpack_from(">h", frame, 8)[0] for frame in transport.written]
    assert errors == [ErrorCode.unknown_server_error.value, ErrorCode.unknown_server_error.value, 0]
    assert not transport.closed


@in_loop
async def test_exhausted_request_memory_pauses_big_buffers_only_and_resumes_on_release():
    memory = RequestMemory(2 * RESERVED_BYTES)
    big, big_transport = connect({}, memory)
    small, small_transport = connect({API_VERSIONS: lambda ctx, body: ANSWER}, memory)
    partial = struct.pack(">i", 900_000) + b"\0" * (3 * RESERVED_BYTES)
    big.data_received(partial)
    assert memory.exhausted and not big_transport.reading
    small.data_received(api_versions_frame(7))  # a small request still passes
    assert small_transport.correlation_ids() == [7] and small_transport.reading
    big.connection_lost(None)
    assert memory.used == 0 and not memory.exhausted


@in_loop
async def test_an_oversized_frame_closes_the_connection_without_allocating_it():
    connection, transport = connect({}, max_request_bytes=1000)
    connection.data_received(struct.pack(">i", 1001) + b"\0" * 10)
    assert transport.closed


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
    connection._complete(request, deferred)
    assert deferred.asked == 0 and transport.written == [struct.pack(">ii", 14, 9) + b"xy"]
    connection.data_received(api_versions_frame(2))  # waits: the response before it is not handed over
    connection.resume_writing()
    connection.resume_writing()
    assert deferred.asked == 2 and len(transport.written) == 3  # header, two chunks; request 2 waits
    connection.resume_writing()
    connection.resume_writing()
    assert b"".join(transport.written[:4]) == struct.pack(">ii", 14, 9) + b"xyabcdefgh"
    assert struct.unpack_from(">i", transport.written[-1], 4)[0] == 2 and len(transport.written) == 5

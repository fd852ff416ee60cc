"""The broker's own Kafka client (pykbroker/protocol/client.py) against fake servers written here: asyncio
servers on free ports of 127.0.0.1 that answer with exactly the bytes a test needs, including the wrong ones.
Tests against a real broker are in tests/integration/test_broker_client.py."""

from __future__ import annotations

import asyncio
import datetime
import struct
import time

import pytest
from kio.schema.api_versions.v0.response import ApiVersion as ApiKeyV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.api_versions.v2.response import ApiVersion as ApiKeyV2
from kio.schema.api_versions.v2.response import ApiVersionsResponse as ApiVersionsResponseV2
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v1.request import MetadataRequest
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from pykbroker.protocol import interbroker
from pykbroker.protocol.apis import codec_for
from pykbroker.protocol.client import (
    ConnectError,
    ConnectionLost,
    KafkaClientConnection,
    NodeClients,
    ProtocolViolation,
    RequestTimedOut,
    UnknownNode,
    decode_response,
    encode_request,
    reconnect_backoff,
    request_once,
)
from pykbroker.protocol.framing import encode_response

pytestmark = pytest.mark.timeout(30)

HOST = "127.0.0.1"
_PREFIX = struct.Struct(">hhih")


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 20))


async def read_request(reader: asyncio.StreamReader) -> tuple[int, int, int, str | None, bytes]:
    """(api_key, version, correlation_id, client_id, frame) of the next request; IncompleteReadError at EOF."""
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    frame = await reader.readexactly(size)
    api_key, version, correlation_id, client_id_length = _PREFIX.unpack_from(frame, 0)
    client_id = None if client_id_length < 0 else frame[10:10 + client_id_length].decode()
    return api_key, version, correlation_id, client_id, frame


def metadata_response_frame(correlation_id: int) -> bytes:
    """A valid Metadata v1 response with no broker and no topic."""
    from kio.schema.metadata.v1.response import MetadataResponse

    body = MetadataResponse(brokers=(), controller_id=i32(-1), topics=())
    return b"".join(bytes(piece) for piece in encode_response(codec_for(3, 1), correlation_id, body))


def metadata_request(topic_names=None) -> MetadataRequest:
    from kio.schema.metadata.v1.request import MetadataRequestTopic

    topics = None if topic_names is None else tuple(MetadataRequestTopic(name=n) for n in topic_names)
    return MetadataRequest(topics=topics)


class FakeBroker:
    """An asyncio server whose every connection runs `handler(reader, writer)`; counts connections and
    notes when the client closed one (EOF seen by the handler's reads)."""

    def __init__(self, handler) -> None:
        self.handler = handler
        self.connections = 0
        self.eof = asyncio.Event()
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def __aenter__(self) -> "FakeBroker":
        self.server = await asyncio.start_server(self._serve, HOST, 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader, writer) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
            self.eof.set()  # handlers that wait end with `await reader.read()`: EOF from the client
        except (asyncio.IncompleteReadError, ConnectionError):
            self.eof.set()
        finally:
            writer.close()

    async def connect(self, **options) -> KafkaClientConnection:
        options.setdefault("negotiate_versions", False)
        options.setdefault("client_id", "1")
        return await KafkaClientConnection.connect(HOST, self.port, **options)


async def answer_metadata_forever(reader, writer) -> None:
    while True:
        _, _, correlation_id, _, _ = await read_request(reader)
        writer.write(metadata_response_frame(correlation_id))


# ---------------------------------------------------------------------------------------------------


def test_a_response_with_an_unknown_correlation_id_closes_the_connection_and_fails_all_in_flight():
    async def handler(reader, writer):
        _, _, correlation_id, _, _ = await read_request(reader)
        await read_request(reader)
        writer.write(metadata_response_frame(correlation_id + 1000))
        await reader.read()  # until the client closes

    async def scenario():
        async with FakeBroker(handler) as broker:
            connection = await broker.connect()
            first = connection.send_nowait(metadata_request())
            second = connection.send_nowait(metadata_request())
            for future in (first, second):
                with pytest.raises(ProtocolViolation, match="unknown correlation id"):
                    await future
            assert connection.closed and connection.in_flight == 0
            await asyncio.wait_for(broker.eof.wait(), 5)  # the client really closed its socket
            with pytest.raises(ConnectionLost, match="closed"):
                connection.send_nowait(metadata_request())

    run(scenario())


def test_a_response_out_of_order_closes_the_connection():
    async def handler(reader, writer):
        _, _, first, _, _ = await read_request(reader)
        _, _, second, _, _ = await read_request(reader)
        writer.write(metadata_response_frame(second) + metadata_response_frame(first))
        await reader.read()

    async def scenario():
        async with FakeBroker(handler) as broker:
            connection = await broker.connect()
            futures = [connection.send_nowait(metadata_request()) for _ in range(2)]
            results = await asyncio.gather(*futures, return_exceptions=True)
            assert all(isinstance(r, ProtocolViolation) for r in results), results
            assert "out of order" in str(results[0])
            assert connection.closed

    run(scenario())


@pytest.mark.parametrize("declared", [1 << 30, 2 ** 31 - 1, -5, 2])
def test_an_oversized_or_impossible_frame_size_fails_promptly_without_allocating_it(declared):
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(struct.pack(">i", declared) + b"\x00" * 16)  # the declared size, then only 16 bytes
        await reader.read()

    async def scenario():
        async with FakeBroker(handler) as broker:
            connection = await broker.connect(max_response_bytes=64 * 1024)
            started = time.monotonic()
            with pytest.raises(ProtocolViolation, match=f"frame of {declared} bytes"):
                await connection.send(metadata_request(), timeout=10)
            assert time.monotonic() - started < 5  # not the request timeout: the frame size decided
            assert connection.closed
            assert len(connection._buffer) == 0

    run(scenario())


def test_a_frame_just_under_the_bound_is_read_as_it_arrives():
    """A response within max_response_bytes that arrives in small pieces is assembled and decoded."""
    async def handler(reader, writer):
        _, _, correlation_id, _, _ = await read_request(reader)
        frame = metadata_response_frame(correlation_id)
        for i in range(len(frame)):
            writer.write(frame[i:i + 1])
            await writer.drain()
        await reader.read()

    async def scenario():
        async with FakeBroker(handler) as broker:
            frame_size = len(metadata_response_frame(0)) - 4
            connection = await broker.connect(max_response_bytes=frame_size)
            response = await connection.send(metadata_request())
            assert response.controller_id == -1 and response.topics == ()
            await connection.aclose()

    run(scenario())


def test_a_body_with_an_impossible_array_count_fails_that_request_only():
    """The frame guard checks a response body before kio reads it: a count of 2^31-1 brokers in a 9-byte
    body fails that request; the frame boundary is intact, so the connection serves the next one."""
    async def handler(reader, writer):
        _, _, correlation_id, _, _ = await read_request(reader)
        body = struct.pack(">i", 2 ** 31 - 1) + b"\x00" * 5
        writer.write(struct.pack(">ii", 4 + len(body), correlation_id) + body)
        await answer_metadata_forever(reader, writer)

    async def scenario():
        async with FakeBroker(handler) as broker:
            connection = await broker.connect()
            with pytest.raises(ProtocolViolation, match="cannot decode Metadata v1.*array count 2147483647"):
                await connection.send(metadata_request())
            assert not connection.closed
            assert (await connection.send(metadata_request())).controller_id == -1
            await connection.aclose()

    run(scenario())


def test_a_request_timeout_fails_the_request_and_closes_the_connection():
    async def handler(reader, writer):
        await read_request(reader)
        await read_request(reader)
        await reader.read()  # never answers

    async def scenario():
        async with FakeBroker(handler) as broker:
            connection = await broker.connect(request_timeout=5.0)
            started = time.monotonic()
            slow = connection.send_nowait(metadata_request())  # the connection's 5 s timeout
            quick = connection.send_nowait(metadata_request(), timeout=0.2)
            with pytest.raises(RequestTimedOut, match="no response within 0.2 s"):
                await quick
            with pytest.raises(ConnectionLost, match="timed out"):
                await slow
            assert time.monotonic() - started < 3
            assert connection.closed

    run(scenario())


def test_a_caller_that_gives_up_leaves_the_connection_usable():
    async def handler(reader, writer):
        _, _, first, _, _ = await read_request(reader)
        await asyncio.sleep(0.2)  # the fake broker is slow; the client gave up meanwhile
        writer.write(metadata_response_frame(first))
        await answer_metadata_forever(reader, writer)

    async def scenario():
        async with FakeBroker(handler) as broker:
            connection = await broker.connect()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(connection.send(metadata_request()), 0.05)
            response = await connection.send(metadata_request())  # the late answer was read and dropped
            assert response.controller_id == -1 and not connection.closed
            await connection.aclose()

    run(scenario())


def test_a_dropped_connection_fails_requests_in_flight_at_once():
    async def handler(reader, writer):
        await read_request(reader)
        writer.transport.abort()

    async def scenario():
        async with FakeBroker(handler) as broker:
            connection = await broker.connect(request_timeout=30)
            started = time.monotonic()
            with pytest.raises(ConnectionLost, match="lost"):
                await connection.send(metadata_request())
            assert time.monotonic() - started < 5
            with pytest.raises(ConnectionLost):
                await connection.send(metadata_request())

    run(scenario())


def test_connect_to_a_closed_port_is_a_connect_error():
    async def scenario():
        server = await asyncio.start_server(lambda r, w: None, HOST, 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(ConnectError, match=f"{port}"):
            await KafkaClientConnection.connect(HOST, port, client_id="1", connect_timeout=2)

    run(scenario())


def test_inter_broker_requests_use_fixed_versions_and_the_broker_id_as_client_id():
    """LeaderAndIsr v7 without negotiation (the controller's way): the fake broker decodes the request with
    the inter-broker codecs and answers; the client decodes the answer."""
    from pykbroker.protocol.interbroker.leader_and_isr.v7.request import LeaderAndIsrRequest
    from pykbroker.protocol.interbroker.leader_and_isr.v7.response import LeaderAndIsrResponse

    seen = []

    async def handler(reader, writer):
        _, _, correlation_id, client_id, frame = await read_request(reader)
        header, body = interbroker.decode_request(frame)
        seen.append((client_id, body))
        response = LeaderAndIsrResponse(error_code=ErrorCode.none, topics=())
        writer.write(interbroker.encode_response(response, correlation_id=correlation_id))
        await reader.read()

    async def scenario():
        request = LeaderAndIsrRequest(controller_id=i32(1), is_k_raft_controller=False, controller_epoch=i32(7),
                                      broker_epoch=i64(25), type_=i8(0), topic_states=(), live_leaders=())
        async with FakeBroker(handler) as broker:
            connection = await broker.connect(client_id="1", negotiate_versions=False)
            assert connection.api_versions is None and connection.version_for(4, 7) == 7
            response = await connection.send(request)
            assert response.error_code == ErrorCode.none
            assert seen == [("1", request)]
            await connection.aclose()

    run(scenario())


def test_an_unsupported_api_versions_version_is_retried_with_the_brokers_highest():
    """A broker that knows ApiVersions up to v2 answers the v3 request in v0 format with
    UNSUPPORTED_VERSION (as Kafka does); the client retries with v2 and keeps that answer."""
    requests = []

    async def handler(reader, writer):
        while True:
            api_key, version, correlation_id, _, _ = await read_request(reader)
            requests.append((api_key, version))
            if version > 2:
                body = ApiVersionsResponseV0(error_code=ErrorCode.unsupported_version, api_keys=(
                    ApiKeyV0(api_key=i16(18), min_version=i16(0), max_version=i16(2)),))
                writer.write(b"".join(bytes(p) for p in encode_response(codec_for(18, 0), correlation_id, body)))
            else:
                body = ApiVersionsResponseV2(error_code=ErrorCode.none, api_keys=(
                    ApiKeyV2(api_key=i16(18), min_version=i16(0), max_version=i16(2)),
                    ApiKeyV2(api_key=i16(3), min_version=i16(0), max_version=i16(5))),
                    throttle_time=i32Timedelta.parse(datetime.timedelta(0)))
                writer.write(b"".join(bytes(p) for p in encode_response(codec_for(18, 2), correlation_id, body)))

    async def scenario():
        async with FakeBroker(handler) as broker:
            connection = await broker.connect(negotiate_versions=True)
            assert requests == [(18, 3), (18, 2)]
            assert connection.api_versions == {18: (0, 2), 3: (0, 5)}
            assert connection.version_for(3, 12) == 5
            with pytest.raises(Exception, match="api key 1 "):
                connection.version_for(1, 16)
            await connection.aclose()

    run(scenario())


def test_encode_and_decode_round_trip_through_the_server_side_codecs():
    from pykbroker.protocol.framing import decode_request, read_prefix

    frame = encode_request(metadata_request(["a", "b"]), 42, "3")
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    request = decode_request(frame[4:], read_prefix(frame[4:]))
    assert (request.correlation_id, request.client_id) == (42, "3")
    assert [t.name for t in request.body.topics] == ["a", "b"]
    response = decode_response(3, 1, metadata_response_frame(42)[4:])
    assert response.controller_id == -1
    with pytest.raises(ProtocolViolation, match="bytes left"):
        decode_response(3, 1, metadata_response_frame(42)[4:] + b"\x00")


# ---------------------------------------------------------------------------------------------------
# NodeClients


def test_reconnect_backoff_doubles_up_to_the_maximum_with_jitter():
    middle = lambda: 0.5  # noqa: E731 - no jitter
    assert [reconnect_backoff(n, 0.05, 1.0, rand=middle) for n in range(0, 8)] == [
        0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert reconnect_backoff(1, 0.05, 1.0, rand=lambda: 0.0) == pytest.approx(0.04)
    assert reconnect_backoff(1, 0.05, 1.0, rand=lambda: 1.0) == pytest.approx(0.06)
    assert reconnect_backoff(10, 0.05, 1.0, rand=lambda: 1.0) == 1.0  # jitter never passes the maximum
    assert reconnect_backoff(1000, 0.05, 1.0, rand=middle) == 1.0


def test_node_clients_connect_on_first_use_share_one_connection_and_send_the_broker_id():
    client_ids = []

    async def handler(reader, writer):
        while True:
            _, _, correlation_id, client_id, _ = await read_request(reader)
            client_ids.append(client_id)
            writer.write(metadata_response_frame(correlation_id))

    async def scenario():
        async with FakeBroker(handler) as broker:
            pool = NodeClients(7, {2: (HOST, broker.port)}, negotiate_versions=False)
            assert pool.connection(2) is None and broker.connections == 0
            first, second = await asyncio.gather(pool.get(2), pool.get(2))
            assert first is second and broker.connections == 1
            responses = await asyncio.gather(*(pool.send(2, metadata_request()) for _ in range(5)))
            assert all(r.controller_id == -1 for r in responses)
            assert client_ids == ["7"] * 5
            with pytest.raises(UnknownNode):
                await pool.get(3)
            await pool.close()
            assert first.closed
            with pytest.raises(ConnectionLost):
                await pool.get(2)

    run(scenario())


def test_node_clients_back_off_after_failures_and_reconnect_after_a_lost_connection():
    async def handler(reader, writer):
        _, _, correlation_id, _, _ = await read_request(reader)
        writer.write(metadata_response_frame(correlation_id))
        await read_request(reader)
        writer.transport.abort()  # drops the connection with the second request in flight

    async def scenario():
        loop = asyncio.get_running_loop()
        async with FakeBroker(handler) as broker:
            pool = NodeClients(1, {2: (HOST, broker.port)}, negotiate_versions=False,
                               reconnect_backoff=0.2, reconnect_backoff_max=0.8)
            assert (await pool.send(2, metadata_request())).controller_id == -1
            with pytest.raises(ConnectionLost):
                await pool.send(2, metadata_request())
            assert pool.connection(2) is None
            remaining = pool.backoff_remaining(2)
            assert 0.1 < remaining <= 0.24 + 0.01  # base backoff, +-20 %
            started = loop.time()
            assert (await pool.send(2, metadata_request())).controller_id == -1
            assert loop.time() - started >= remaining - 0.02  # the new attempt waited the backoff out
            assert pool.connects(2) == 2 and broker.connections == 2
            await pool.close()

        # Now nothing listens on that port: each failed attempt doubles the wait, up to the maximum.
        pool = NodeClients(1, {2: (HOST, broker.port)}, negotiate_versions=False,
                           reconnect_backoff=0.05, reconnect_backoff_max=0.15)
        waits = []
        for _ in range(4):
            with pytest.raises(ConnectError):
                await pool.get(2)
            waits.append(pool.backoff_remaining(2))
        assert 0.03 < waits[0] <= 0.06 and 0.07 < waits[1] <= 0.12
        assert all(0.11 < w <= 0.15 for w in waits[2:]), waits
        await pool.close()

    run(scenario())


def test_closing_the_pool_fails_a_connection_attempt_in_progress_with_connection_lost():
    """A broker that accepts but never answers ApiVersions keeps the attempt going; closing the pool (or
    forgetting the node) must fail the waiting callers with a ClientError, not a stray CancelledError."""
    async def handler(reader, writer):
        await read_request(reader)
        await reader.read()

    async def scenario():
        async with FakeBroker(handler) as broker:
            for end in ("close", "remove"):
                pool = NodeClients(1, {2: (HOST, broker.port)}, negotiate_versions=True, request_timeout=30)
                waiter = asyncio.ensure_future(pool.get(2))
                expected = 1 if end == "close" else 2
                deadline = time.monotonic() + 5
                while broker.connections < expected and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                assert broker.connections == expected and not waiter.done()
                if end == "close":
                    await pool.close()
                else:
                    pool.remove(2)
                with pytest.raises(ConnectionLost, match="abandoned"):
                    await asyncio.wait_for(waiter, 5)
                await pool.close()

    run(scenario())


def test_an_attempt_abandoned_just_as_its_connection_completes_fails_at_once():
    """The pool is closed at the very moment the TCP connection completes: the attempt must end there
    (ConnectionLost), not go on to wait for an ApiVersions answer that never comes (Python 3.11's
    asyncio.wait_for swallowed that cancellation)."""
    async def handler(reader, writer):
        await read_request(reader)
        await reader.read()

    async def scenario():
        async with FakeBroker(handler) as broker:
            pool = NodeClients(1, {2: (HOST, broker.port)}, negotiate_versions=True, request_timeout=30)
            loop = asyncio.get_running_loop()
            real_create_connection = loop.create_connection

            async def completes_as_the_pool_closes(*args, **kwargs):
                result = await real_create_connection(*args, **kwargs)
                asyncio.ensure_future(pool.close())  # runs before the attempt sees its result
                await asyncio.sleep(0)
                return result

            loop.create_connection = completes_as_the_pool_closes
            try:
                with pytest.raises(ConnectionLost):
                    await asyncio.wait_for(pool.get(2), 5)
            finally:
                loop.create_connection = real_create_connection
                await pool.close()

    run(scenario())


def test_a_request_stuck_behind_a_peer_that_does_not_read_still_times_out():
    """The peer never reads: 16 MiB of Produce requests fill the socket buffers and the transport pauses
    writing; `send` waits for the drain, and the request timeout still ends the wait."""
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

    release = asyncio.Event()

    async def handler(reader, writer):
        await release.wait()

    async def scenario():
        async with FakeBroker(handler) as broker:
            connection = await broker.connect(request_timeout=0.5)
            request = ProduceRequest(transactional_id=None, acks=i16(-1),
                                     timeout=i32Timedelta.parse(datetime.timedelta(seconds=5)),
                                     topic_data=(TopicProduceData(name="t", partition_data=(
                                         PartitionProduceData(index=i32(0), records=b"\x00" * (1 << 20)),)),))
            started = time.monotonic()
            sends = [asyncio.ensure_future(connection.send(request)) for _ in range(16)]
            while not connection._write_paused and time.monotonic() - started < 0.4:
                await asyncio.sleep(0.01)
            assert connection._write_paused and not any(s.done() for s in sends)  # backpressure reached
            results = await asyncio.gather(*sends, return_exceptions=True)
            assert time.monotonic() - started < 5
            assert isinstance(results[0], RequestTimedOut), results[0]
            assert all(isinstance(r, (RequestTimedOut, ConnectionLost)) for r in results), results
            release.set()

    run(scenario())


def test_request_once_bounds_connect_and_request_by_one_timeout():
    """A listener that accepts and never answers: request_once gives up after its one timeout (connecting,
    ApiVersions when negotiating, and the request share it), whether it negotiates versions or not."""
    async def scenario():
        server = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            for negotiate in (None, (3, 1, 1)):
                request = MetadataRequest(topics=None) if negotiate is None else (lambda version: MetadataRequest(topics=None))
                started = time.monotonic()
                with pytest.raises(TimeoutError):
                    await request_once("127.0.0.1", port, request, client_id="t", timeout=0.5, negotiate=negotiate)
                assert time.monotonic() - started < 5  # one bound, not one per step (and not the 20 s of run())
        finally:
            server.close()
            await server.wait_closed()

    run(scenario())

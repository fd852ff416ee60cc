"""One client connection: read frames continuously, run handlers, write responses strictly in request order.

Clients pipeline (librdkafka keeps several Produce requests in flight; the Java consumer sends a
session-closing Fetch while a long poll is parked), so requests are decoded as soon as they arrive, and
each gets a slot in a FIFO. A synchronous handler fills its slot at once; an asynchronous one (a long
poll, an acks=all wait) fills it later; the writer drains slots from the head only, so responses leave in
order. In-flight request bytes are bounded (socket.request.max.bytes): past the bound we stop reading
until responses drain. A malformed frame closes this connection only, with a log line.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING, Any

from pykbroker.protocol.apis import API_VERSIONS_KEY
from pykbroker.protocol.framing import (
    SIZE,
    FrameError,
    UnsupportedRequest,
    decode_request,
    encode_response,
    read_prefix,
)
from pykbroker.server.dispatch import NO_RESPONSE, Handler, RequestContext
from pykbroker.server.handlers.api_versions import unsupported_api_versions_response

if TYPE_CHECKING:
    from pykbroker.server.broker import Broker

log = logging.getLogger(__name__)

_PENDING = object()


class _Slot:
    __slots__ = ("payload", "size")

    def __init__(self, size: int) -> None:
        self.payload: Any = _PENDING  # bytes to send, None for "no response", or _PENDING
        self.size = size


class KafkaConnection(asyncio.Protocol):
    def __init__(self, broker: "Broker", handlers: dict[int, Handler], max_request_bytes: int, listener: str) -> None:
        self.broker = broker
        self.listener = listener  # the listener name this connection arrived on (RequestContext.listener)
        self.handlers = handlers
        self.max_request_bytes = max_request_bytes
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._buffer = bytearray()
        self._slots: collections.deque[_Slot] = collections.deque()
        self._in_flight_bytes = 0
        self._reading_paused = False
        self._write_paused = False
        self._closed = False
        self._tasks: set[asyncio.Task] = set()

    # -- asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.broker.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.broker.connections.discard(self)
        for task in list(self._tasks):
            task.cancel()

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        # Common case: nothing buffered, so frames are sliced straight out of ``data`` (one copy per frame);
        # only an incomplete tail is kept in the buffer for the next read.
        buffer = self._buffer
        if buffer:
            buffer += data
            if len(buffer) >= SIZE.size:
                (size,) = SIZE.unpack_from(buffer, 0)
                if 0 <= size <= self.max_request_bytes and len(buffer) < SIZE.size + size:
                    return  # still inside one frame: wait without copying the buffer again
            data = bytes(buffer)
            buffer.clear()
        position = 0
        size_len = SIZE.size
        while len(data) - position >= size_len:
            (size,) = SIZE.unpack_from(data, position)
            if size < 0 or size > self.max_request_bytes:
                self._abort(f"frame of {size} bytes exceeds socket.request.max.bytes {self.max_request_bytes}")
                return
            end = position + size_len + size
            if len(data) < end:
                break
            frame = data[position + size_len : end]
            position = end
            self._handle_frame(frame)
            if self._closed:
                return
        if position < len(data):
            self._buffer += memoryview(data)[position:]
        self._update_reading()

    # -- requests ---------------------------------------------------------------------------------
    def _handle_frame(self, frame: bytes) -> None:
        try:
            prefix = read_prefix(frame)
        except FrameError as exc:
            self._abort(str(exc))
            return
        slot = _Slot(len(frame))
        self._slots.append(slot)
        self._in_flight_bytes += slot.size
        try:
            request = decode_request(frame, prefix)
        except UnsupportedRequest as exc:
            if prefix.api_key == API_VERSIONS_KEY:
                # KIP-511: answer an unknown ApiVersions version in v0 format so the client can retry lower.
                self._fill(slot, unsupported_api_versions_response(prefix.correlation_id))
                return
            self._abort(f"{exc} (correlation id {prefix.correlation_id})")
            return
        except FrameError as exc:
            self._abort(str(exc))
            return
        handler = self.handlers[request.api_key]
        context = RequestContext(self.broker, request, self.peer, self.listener)
        try:
            result = handler(context, request.body)
        except Exception:
            log.exception("handler for api %s v%s failed; closing %s", request.api_key, request.api_version, self.peer)
            self._abort("handler failure")
            return
        if asyncio.iscoroutine(result):
            task = asyncio.ensure_future(self._complete_later(slot, request, result))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._complete(slot, request, result)

    async def _complete_later(self, slot: _Slot, request, awaitable) -> None:
        try:
            result = await awaitable
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("handler for api %s v%s failed; closing %s", request.api_key, request.api_version, self.peer)
            self._abort("handler failure")
            return
        self._complete(slot, request, result)

    def _complete(self, slot: _Slot, request, result) -> None:
        if result is NO_RESPONSE:
            self._fill(slot, None)
            return
        try:
            payload = encode_response(request.codec, request.correlation_id, result)
        except Exception:
            log.exception("cannot encode the answer to api %s v%s; closing %s", request.api_key, request.api_version, self.peer)
            self._abort("response encoding failure")
            return
        self._fill(slot, payload)

    def _fill(self, slot: _Slot, payload: bytes | None) -> None:
        slot.payload = payload
        if self._closed:
            return
        slots = self._slots
        transport = self.transport
        while slots and slots[0].payload is not _PENDING:
            head = slots.popleft()
            self._in_flight_bytes -= head.size
            if head.payload is not None:
                transport.write(head.payload)
        self._update_reading()

    # -- flow control -----------------------------------------------------------------------------
    def _update_reading(self) -> None:
        if self._closed or self.transport is None:
            return
        should_pause = self._write_paused or self._in_flight_bytes > self.max_request_bytes
        if should_pause and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        elif not should_pause and self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()

    def _abort(self, reason: str) -> None:
        log.warning("closing connection from %s: %s", self.peer, reason)
        self._closed = True
        if self.transport is not None:
            self.transport.close()

    def close(self) -> None:
        if self.transport is not None and not self._closed:
            self._closed = True
            self.transport.close()

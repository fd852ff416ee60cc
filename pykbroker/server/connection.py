"""One client connection: Kafka's muted channel, bounded memory, and an answer for every request.

Requests of one connection are processed one at a time, in order, as Kafka does (it mutes a channel from
a request's arrival until its response is queued): a frame is taken from the connection's buffer only
after the previous request's response has been handed to the transport. A synchronous handler answers
at once, so a pipelined burst (librdkafka's produce requests) runs back to back from one read; an
asynchronous one (a long poll, a JoinGroup parked in a rebalance) keeps the connection busy until it
answers, and then the frames already buffered are processed at once, without waiting for more bytes.
Responses therefore leave in request order, and a Heartbeat pipelined behind a JoinGroup meets the new
generation, as on Kafka.

One exception, where Kafka's rule costs a replication round trip per request: an acks=all Produce whose
records are all appended and that only waits for the ISR (the handler says so with
``RequestContext.appended``) lets the connection go on with the Produce requests pipelined behind it, up to
``MAX_PIPELINED_PRODUCES`` in processing at once: each is appended in request order, the followers fetch
them together, and the answers still leave in request order (an answer that is ready waits for the ones
before it). Kafka mutes the channel there too, so a producer with 5 requests in flight to one leader waits
for one follower round trip per request (Spark's kafka sink with acks=all on a replicated topic: 0.6x
Kafka's rate before this); what a client can observe is the same (answers in request order, each one's
records appended after the records of every request before it). Anything but a Produce waits, as before,
until every request before it is answered; so does everything while client quotas are enabled (a throttle
mutes the channel from the answer that carries it, as Kafka's ThrottledChannel).

Answers leave in one write per event-loop iteration where they can: the small answers handed over in one
iteration (the requests of one read, the acks=all produces one HWM move completed) are gathered, up to
``CORK_BYTES``, and written together once the iteration's callbacks have run, or at once before record data
or a close (about 7 % of the broker's CPU on Spark's kafka sink, one system call per answer before).

Memory is bounded:
* the socket is not read while a request is in processing (appended acks=all produces: while
  ``MAX_PIPELINED_PRODUCES`` are, or the next frame is not a Produce) or while the transport's unsent bytes are
  above its high-water mark (``WRITE_HIGH_WATER``); a response's record data is read from the segment
  files in ``CHUNK_BYTES`` chunks only as the transport drains, so a client that pipelines fetches and
  never reads holds about one chunk and the high-water mark, not one response per request;
* a frame larger than ``socket.request.max.bytes`` closes the connection; a frame is never allocated by
  its declared size, its bytes are kept as they arrive;
* request bytes are bounded broker-wide by ``queued.max.request.bytes`` (:class:`RequestMemory`), as
  Kafka's non-strict SimpleMemoryPool does: when a frame's 4-byte size is read, the whole frame is reserved
  from the pool (the reservation may overshoot the bound); it is released once the frame is decoded, or
  when the connection is lost. While the reserved bytes reach the bound, a connection about to start a
  frame is not read until memory is released; a connection whose frame is reserved is never paused for
  memory, so every frame that was started can finish (no deadlock between half-received frames). One
  difference from Kafka: a frame of at most ``RESERVED_BYTES`` is reserved even when the pool is exhausted,
  so ApiVersions, Metadata or a Heartbeat of a well-behaved client passes while stalled clients hold the
  pool (the overshoot is at most one such frame per connection). The frames of a SASL connection that is
  authenticating are not reserved (Kafka's authenticator reads them outside the pool): they are bounded by
  ``sasl.server.max.receive.size`` instead, so unauthenticated peers stalling mid-frame cannot starve the others;
* a connection with no socket activity (bytes received, response progress) for
  ``connections.max.idle.ms`` is closed by the broker's idle sweep (a connection stuck mid-frame is idle, a
  slow but progressing upload is not; one waiting on its own request in processing is not).

The same holds on an SSL listener (the transport is asyncio's TLS transport, handed over after the broker's
handshake task, see server/broker.py). Record data is never sent with sendfile, on either kind of listener:
it is read from the segment files in ``CHUNK_BYTES`` chunks and written to the transport, which on TLS
encrypts in user space (sendfile could not be used there anyway), and the write-buffer watermark counts the
plaintext waiting to be encrypted too, so a TLS fetch holds about one chunk plus the high-water mark in the TLS transport, and up to about as much
again in the socket transport beneath it (asyncio's TLS transport hands over its encrypted buffer whole).
A TLS connection's principal (``principal``: "User:" + the client certificate's mapped subject, or
User:ANONYMOUS) is computed when the connection is made and logged at debug, for the authorizer to come; a
certificate subject that no ``ssl.principal.mapping.rules`` rule maps closes the connection, as Kafka fails
the authentication.

Client quotas (KIP-219, server/throttling.py): a request over its client's quota is answered at once with its
throttle_time_ms, and then the connection is muted for that long, as Kafka's ThrottledChannel: nothing is read
from the socket nor taken from the buffer until the throttle time has passed, so a client that does not back off
by itself is held to its quota; other connections are not affected. A muted connection still expires as any
other after connections.max.idle.ms without socket activity (Kafka's Selector ignores the mute for idleness, and
a byte-rate throttle has no upper bound). A request whose handler raised is recorded and throttled too
(Kafka's sendErrorResponseMaybeThrottle): its error answer carries the throttle.

A SASL listener's connection (``sasl``) is "authenticating" before it serves: every frame goes to its
SaslAuthenticator (security/sasl/authenticator.py, Kafka's SaslServerAuthenticator), which allows only
ApiVersions, SaslHandshake and SaslAuthenticate (or KIP-43 raw tokens) and bounds frames by
``sasl.server.max.receive.size``; any other request fails the authentication. Pre-authentication ApiVersions is
served by the bare handler, never metered by the client quotas (Kafka's authenticator answers it itself). Success
sets ``principal`` (User:<authorized id>). A failure is logged in one INFO line (Kafka's exception message; the
detail, a user name say, at DEBUG), the connection is muted, and its answer
(if any) is sent only after ``connection.failed.authentication.delay.ms`` (a timer on the event loop: other
connections are served meanwhile), then the connection is closed (what a peer that does not read leaves unsent
is dropped ``FAILED_CLOSE_GRACE_S`` later). Once authenticated, a SaslHandshake may begin
KIP-368 re-authentication, and a request on an expired session closes the connection.

The broker closes a connection (bad frame, idle, an acks=0 produce that failed, its own failure) with
``transport.abort()``: unsent response bytes are dropped, as Kafka's Selector.close does, so a client that
never reads cannot keep the connection, its pending response and its pinned segment files alive (a graceful
``transport.close()`` waits for the write buffer to drain, which never happens for such a client).

A request that decodes but cannot be served (the handler raises, e.g. on a null array the schema does not
allow) gets Kafka's error answer built from the response schema (server/error_answers.py), one log line,
and the connection stays open (if building that answer fails too, the connection is closed, one log line).
A handler may return CLOSE_CONNECTION (Produce with acks=0 that has an error, as Kafka's
KafkaApis.handleProduceRequest does, so the producer notices and refreshes its metadata). Only bytes that are not a request (bad frame size, undecodable header or
body, an unsupported API) close the connection, with a log line.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import TYPE_CHECKING, Any, Iterator, Union

from pykbroker.config import DEFAULT_LISTENER_NAME
from pykbroker.protocol.apis import API_VERSIONS_KEY, PRODUCE_KEY
from pykbroker.protocol.framing import (
    SIZE,
    FrameError,
    UnsupportedRequest,
    decode_request,
    encode_response,
    frame_api_key,
    read_prefix,
)
from pykbroker.security.principal import ANONYMOUS
from pykbroker.security.sasl.authenticator import SaslAuthenticator, Step
from pykbroker.server.dispatch import NO_RESPONSE, CloseConnection, Handler, RequestContext
from pykbroker.server.error_answers import error_response
from pykbroker.server.handlers.api_versions import unsupported_api_versions_response
from pykbroker.server.throttling import failure_throttled, pre_encoded

if TYPE_CHECKING:
    from pykbroker.security.principal import KafkaPrincipal
    from pykbroker.security.sasl.authenticator import SaslListener
    from pykbroker.security.tls import TlsContextHolder
    from pykbroker.server.broker import Broker

log = logging.getLogger(__name__)

# A frame of at most this size is reserved even while the broker-wide bound is exhausted: ApiVersions,
# Metadata or a Heartbeat from a well-behaved client passes while stalled clients hold the request memory.
RESERVED_BYTES = 64 * 1024
# Unsent bytes the transport may hold before we stop writing (and reading); record data is read from the
# segment files in chunks of CHUNK_BYTES.
WRITE_HIGH_WATER = 1024 * 1024
CHUNK_BYTES = 512 * 1024
# Answers handed over in one event-loop iteration are written together (one system call) up to this many bytes.
CORK_BYTES = 64 * 1024
# After a failed authentication's answer, the unsent bytes a peer that does not read may hold the connection by.
FAILED_CLOSE_GRACE_S = 1.0
# acks=all Produce requests of one connection in processing at once while the earlier ones wait for the ISR
# (the Java producer's default max.in.flight.requests.per.connection, the most an idempotent producer sends).
MAX_PIPELINED_PRODUCES = 5
_UNANSWERED = object()


class _InFlight:
    """A request handled but not yet answered: its answer (``result``) is handed to the transport when it is
    ready and every request before it has been answered."""

    __slots__ = ("request", "started", "context", "result", "task")

    def __init__(self, request, started: float, context: RequestContext, result: Any = _UNANSWERED) -> None:
        self.request = request
        self.started = started
        self.context = context
        self.result = result
        self.task: asyncio.Task | None = None


class RequestMemory:
    """The broker-wide bound on the bytes of requests being received (``queued.max.request.bytes``; a
    limit <= 0 is unbounded, as in Kafka), a non-strict pool like Kafka's SimpleMemoryPool.

    A connection reserves a whole frame when it reads the frame's size and releases it once the frame is
    decoded or the connection is lost. A reservation succeeds while the pool is not exhausted, even past
    the limit; a connection that finds it exhausted waits and is retried (soon, from the event loop) when
    bytes are released.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._paused: set["KafkaConnection"] = set()

    @property
    def exhausted(self) -> bool:
        return 0 < self.limit <= self.used

    def add(self, count: int) -> None:
        self.used += count

    def release(self, count: int) -> None:
        if not count:
            return
        self.used -= count
        if self._paused and not self.exhausted:
            paused, self._paused = self._paused, set()
            loop = asyncio.get_running_loop()
            for connection in paused:
                # Not from inside the releasing connection's own processing: from the loop, soon.
                loop.call_soon(connection.memory_available)

    def wait(self, connection: "KafkaConnection") -> None:
        self._paused.add(connection)

    def forget(self, connection: "KafkaConnection") -> None:
        self._paused.discard(connection)


class KafkaConnection(asyncio.Protocol):
    def __init__(self, broker: "Broker", handlers: dict[int, Handler], max_request_bytes: int,
                 memory: RequestMemory, listener: str = DEFAULT_LISTENER_NAME,
                 tls: "TlsContextHolder | None" = None, sasl: "SaslListener | None" = None) -> None:
        self.broker = broker
        self.listener = listener  # the listener name this connection arrived on (RequestContext.listener)
        self.tls = tls  # the SSL listener's context holder, None on PLAINTEXT
        self.principal: KafkaPrincipal | None = None  # a TLS connection's principal (connection_made), or SASL's
        # A SASL listener's connection: its authenticator takes every frame until the client is authenticated.
        self.sasl = SaslAuthenticator(sasl, broker.apis) if sasl is not None else None
        self._failing: asyncio.TimerHandle | None = None  # a failed authentication's delayed answer and close
        self.handshake: asyncio.Task | None = None  # a TLS connection's handshake task (the broker's per-IP count)
        self.handlers = handlers
        self.max_request_bytes = max_request_bytes
        self.memory = memory
        self.stats = broker.stats  # request counts and latency for /metrics; None while metrics are off
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.host = "?"
        self.last_active = time.monotonic()
        self._buffer = bytearray()
        # No frame is taken from the buffer until every request in processing is answered (a request other
        # than an appended acks=all Produce is in processing, or the next frame cannot be pipelined behind them).
        self._busy = False
        self._inflight: collections.deque[_InFlight] = collections.deque()  # in processing, in request order
        # The response being handed to the transport: bytes, and iterators over record data chunks.
        self._outbox: collections.deque[Union[bytearray, Iterator[bytes]]] = collections.deque()
        self._reading_paused = False
        self._write_paused = False
        self._closed = False
        self._reserved = 0  # bytes of RequestMemory reserved for the frame at the head of the buffer
        self._waiting_memory = False  # the next frame's size is read and the pool is exhausted
        self._unmute: asyncio.TimerHandle | None = None  # KIP-219: muted for a client quota until this fires
        self._corked: list | None = None  # small answers of this loop iteration, written together (_send)
        self._corked_bytes = 0

    # -- asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        peer = transport.get_extra_info("peername")
        if peer:
            self.host = peer[0]
            self.peer = f"{peer[0]}:{peer[1]}"
        refusal = self.broker.admit(self)
        if refusal is not None:
            log.warning("refusing connection from %s: %s", self.peer, refusal)
            self._closed = True
            transport.abort()
            return
        if self.tls is not None and self.sasl is None:  # on SASL_SSL the principal is SASL's
            try:
                self.principal = self.tls.principal(transport.get_extra_info("ssl_object"))
            except Exception as exc:  # principal.py's NoMatchingRule (a ValueError): Kafka fails the authentication
                self._abort(f"no principal for the client certificate: {exc}")
                return
            log.debug("TLS connection from %s on listener %s: principal %s", self.peer, self.listener, self.principal)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.broker.release(self)
        self.memory.forget(self)
        self._waiting_memory = False
        reserved, self._reserved = self._reserved, 0
        self.memory.release(reserved)
        self._buffer = bytearray()
        outbox, self._outbox = self._outbox, collections.deque()
        for item in outbox:  # record data iterators: closing them releases their segment file pins now
            close = getattr(item, "close", None)
            if close is not None:
                close()
        inflight, self._inflight = self._inflight, collections.deque()
        for pending in inflight:
            if pending.task is not None:
                pending.task.cancel()
        self._end_throttle()
        if self._failing is not None:
            self._failing.cancel()

    def pause_writing(self) -> None:
        self._write_paused = True
        self.update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self.last_active = time.monotonic()
        self._pump()
        self._process()

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self._buffer += data
        self.last_active = time.monotonic()  # any socket activity counts, as in Kafka's idle expiry
        self._process()

    def memory_available(self) -> None:
        """Called by RequestMemory when bytes were released while this connection waited for them."""
        if self._closed or not self._waiting_memory:
            return
        self._waiting_memory = False
        self._process()

    @property
    def idle_since(self) -> float | None:
        """When this connection last made progress, or None while it waits on its own request (muted for a
        client quota it is idle as any other: Kafka's Selector ignores the mute state for idleness)."""
        return None if self._busy or self._inflight else self.last_active

    # -- requests ---------------------------------------------------------------------------------
    def _process(self) -> None:
        """Handle buffered frames one at a time while nothing is in processing or left to hand over."""
        buffer = self._buffer
        start = 0
        size_len = SIZE.size
        while not (self._busy or self._outbox or self._write_paused or self._closed or self.throttled):
            available = len(buffer) - start
            if available < size_len:
                break
            (size,) = SIZE.unpack_from(buffer, start)
            sasl = self.sasl
            authenticating = sasl is not None and sasl.authenticating
            if authenticating and sasl.frame_too_large(size):
                self._authentication_failed(sasl.oversized(size))
                return
            if size < 0 or size > self.max_request_bytes:
                self._abort(f"frame of {size} bytes exceeds socket.request.max.bytes {self.max_request_bytes}")
                return
            # An authentication frame (at most sasl.server.max.receive.size) is not taken from the pool, as
            # Kafka's SaslServerAuthenticator allocates it on the heap: unauthenticated peers cannot hold it.
            if not authenticating and not self._reserved and not self._reserve(size):
                break  # the pool is exhausted: not read until memory is released
            end = start + size_len + size
            if available < size_len + size:
                break
            if self._inflight:
                if frame_api_key(buffer, start + size_len, size) != PRODUCE_KEY:
                    self._busy = True  # not pipelined behind the requests in processing: it waits for their answers
                    break
                if len(self._inflight) >= MAX_PIPELINED_PRODUCES:
                    break  # taken when the first of them is answered
            with memoryview(buffer) as view:
                frame = bytes(view[start + size_len:end])
            start = end
            self.last_active = time.monotonic()
            try:
                self._handle_frame(frame)
            finally:
                reserved, self._reserved = self._reserved, 0
                self.memory.release(reserved)  # decoded (or refused): the frame no longer counts
        if start and not self._closed:
            del buffer[:start]
        self.update_reading()

    def _reserve(self, size: int) -> bool:
        """Reserve a frame of ``size`` bytes from the request memory, or wait for it (False)."""
        memory = self.memory
        if memory.exhausted and size > RESERVED_BYTES:
            self._waiting_memory = True
            memory.wait(self)
            return False
        if self._waiting_memory:  # bytes were released and this connection got here before its wake-up
            self._waiting_memory = False
            memory.forget(self)
        memory.add(size)
        self._reserved = size
        return True

    def _handle_frame(self, frame: bytes) -> None:
        sasl = self.sasl
        if sasl is not None:
            step = sasl.receive(frame) if sasl.authenticating else sasl.screen(frame)
            if not step.serve:
                self._sasl_step(step)
                return
        try:
            prefix = read_prefix(frame)
        except FrameError as exc:
            self._abort(str(exc))
            return
        try:
            request = decode_request(frame, prefix, self.broker.apis)
        except UnsupportedRequest as exc:
            if prefix.api_key == API_VERSIONS_KEY:
                # KIP-511: answer an unknown ApiVersions version in v0 format so the client can retry lower.
                self._send(unsupported_api_versions_response(prefix.correlation_id))
                return
            self._abort(f"{exc} (correlation id {prefix.correlation_id})")
            return
        except FrameError as exc:
            self._abort(str(exc))
            return
        context = RequestContext(self.broker, request, self.peer, self.listener, self.principal or ANONYMOUS,
                                 size=len(frame))
        started = self.stats.clock() if self.stats is not None else 0.0
        handler = self.handlers[request.api_key]
        if sasl is not None and sasl.authenticating:
            # ApiVersions before authentication: Kafka's authenticator answers it itself, never metered by the
            # client quotas (server/throttling.py wraps the handlers with functools.wraps: the bare handler).
            handler = getattr(handler, "__wrapped__", handler)
        try:
            result = handler(context, request.body)
        except Exception as exc:
            result = failure_throttled(context, self._failed(request, exc))
        if asyncio.iscoroutine(result):
            pending = _InFlight(request, started, context)
            self._inflight.append(pending)
            pending.task = asyncio.ensure_future(self._complete_later(pending, result))
            # Only an appended acks=all Produce lets the Produce requests behind it in (module docstring); with
            # client quotas enabled (context.quota set) none does.
            if not context.appended or context.quota is not None:
                self._busy = True
        elif self._inflight:  # answered at once, behind requests still waiting: its answer waits its turn
            self._inflight.append(_InFlight(request, started, context, result))
        else:
            self._complete(request, result, started, context)
            self._mute_if_throttled(context)

    async def _complete_later(self, pending: _InFlight, awaitable) -> None:
        request, context = pending.request, pending.context
        try:
            try:
                result = await awaitable
            except asyncio.CancelledError:
                if self._closed:
                    raise  # the connection is gone: connection_lost cancelled us
                result = self._failed(request, RuntimeError("the handler was cancelled"))
            except Exception as exc:
                result = failure_throttled(context, self._failed(request, exc))
            pending.result = result
        finally:
            pending.task = None
        self._answer_ready()

    def _answer_ready(self) -> None:
        """Hand over the answers that are ready, in request order; once none is in processing, the connection
        goes on with the next frame (whatever became of the requests)."""
        inflight = self._inflight
        while inflight and inflight[0].result is not _UNANSWERED and not self._closed:
            pending = inflight.popleft()
            self._complete(pending.request, pending.result, pending.started, pending.context)
            self._mute_if_throttled(pending.context)
        if self._closed:  # nothing more is answered (connection_lost cancels what still runs)
            inflight.clear()
        if not inflight:
            self._busy = False
        if not self._closed:
            self._process()

    # -- SASL (security/sasl/authenticator.py decides, the connection acts) -------------------------------
    def _sasl_step(self, step: Step) -> None:
        if step.close is not None:
            self._abort(step.close)
        elif step.failure is not None:
            self._authentication_failed(step)
        else:
            if step.principal is not None:
                if self.stats is not None:
                    self.stats.authenticated(self.listener, self.sasl.mechanism, True, again=self.principal is not None)
                self.principal = step.principal
                log.debug("SASL connection from %s on listener %s: principal %s", self.peer, self.listener,
                          self.principal)
            if step.reply is not None:
                self._outbox.append(bytearray(step.reply))
                self._pump()

    def _authentication_failed(self, step: Step) -> None:
        """Kafka's Selector: one INFO line with the exception message (the detail, a user name say, only at
        DEBUG), the channel muted, the answer (if any) sent after connection.failed.authentication.delay.ms,
        then closed. Other connections are served meanwhile."""
        what = "re-authentication" if step.reauthentication else "authentication"
        log.info("Failed %s with %s on listener %s (%s)", what, self.peer, self.listener, step.failure)
        if step.detail:
            log.debug("SASL %s failure of %s: %s", what, self.peer, step.detail)
        if self.stats is not None:
            self.stats.authenticated(self.listener, self.sasl.mechanism if self.sasl is not None else None, False)
        reply = step.reply
        self._busy = True  # muted: nothing more is read or processed on this connection
        self.update_reading()
        delay_s = self.sasl.listener.failed_delay_ms / 1000 if self.sasl is not None else 0
        if delay_s > 0:
            self._failing = asyncio.get_running_loop().call_later(delay_s, self._close_after_failure, reply)
        else:
            self._close_after_failure(reply)

    def _close_after_failure(self, reply: bytes | None) -> None:
        """Kafka writes what it can of the answer and closes: a graceful close that flushes the answer, but a
        peer that does not read (a failed re-authentication behind unread responses) cannot keep the connection:
        what is still unsent after FAILED_CLOSE_GRACE_S is dropped (``abort``)."""
        self._failing = None
        if self._closed or self.transport is None:
            return
        if reply:
            self._send(reply)
            self._flush()
        self._closed = True
        transport = self.transport
        transport.close()  # graceful: the answer is flushed first
        if transport.get_write_buffer_size():
            self._failing = asyncio.get_running_loop().call_later(FAILED_CLOSE_GRACE_S, self._drop_unsent)

    def _drop_unsent(self) -> None:
        self._failing = None
        if self.transport is not None and self.transport.get_write_buffer_size():
            log.warning("closing connection from %s: the answer to its failed authentication was not read within "
                        "%s s", self.peer, FAILED_CLOSE_GRACE_S)
            self.transport.abort()

    def _failed(self, request, exc: Exception) -> Any:
        """The answer to a request whose handler raised: Kafka's error response, one log line. If even that
        answer cannot be built, the connection is closed (one log line) and nothing is answered."""
        try:
            answer, code = error_response(request)
        except Exception:
            log.exception("cannot build the error answer to api %s v%s (correlation id %s) whose handler raised %r; "
                          "closing %s", request.api_key, request.api_version, request.correlation_id, exc, self.peer)
            self.close()
            return NO_RESPONSE
        if isinstance(answer, CloseConnection):
            log.warning("closing connection from %s: api %s v%s (correlation id %s) %s; handler raised %r",
                        self.peer, request.api_key, request.api_version, request.correlation_id, answer.reason, exc)
            self.close()
            return NO_RESPONSE
        # the traceback too at debug level (the tests' brokers): where an UNKNOWN_SERVER_ERROR came from
        log.warning("api %s v%s (correlation id %s) from %s answered %s: handler raised %r",
                    request.api_key, request.api_version, request.correlation_id, self.peer, code.name, exc,
                    exc_info=exc if log.isEnabledFor(logging.DEBUG) else None)
        return answer

    def _complete(self, request, result, started: float = 0.0, context: RequestContext | None = None) -> None:
        if self.stats is not None:
            answered = not (result is NO_RESPONSE or isinstance(result, CloseConnection))
            self.stats.request_done(request.api_key, request.api_version, result if answered else None, started)
        if result is NO_RESPONSE or self._closed:
            return
        if isinstance(result, CloseConnection):
            self._abort(f"api {request.api_key} v{request.api_version} (correlation id {request.correlation_id}) "
                        f"{result.reason}")
            return
        try:  # a consumer's fetch under a quota was encoded already, to measure it (server/throttling.py)
            pieces = (pre_encoded(context, result) if context is not None else None) or \
                encode_response(request.codec, request.correlation_id, result)
        except Exception:
            log.exception("cannot encode the answer to api %s v%s; closing %s", request.api_key, request.api_version, self.peer)
            self._abort("response encoding failure")
            return
        for piece in pieces:
            self._outbox.append(piece if isinstance(piece, bytearray) else piece.chunks(CHUNK_BYTES))
        self._pump()

    def _send(self, payload: bytes) -> None:
        """Hand bytes to the transport: the small answers of one event-loop iteration (the requests of one read,
        the produces one HWM move completed) go out in one write, up to CORK_BYTES (module docstring)."""
        self.last_active = time.monotonic()
        corked = self._corked
        if corked is None:
            if len(payload) >= CORK_BYTES:
                self.transport.write(payload)
                return
            self._corked = [payload]
            self._corked_bytes = len(payload)
            asyncio.get_running_loop().call_soon(self._flush)
            return
        corked.append(payload)
        self._corked_bytes += len(payload)
        if self._corked_bytes >= CORK_BYTES:
            self._flush()

    def _flush(self) -> None:
        """Write the gathered answers now (before record data, a close, or at the end of the loop iteration)."""
        corked, self._corked = self._corked, None
        if corked and not self._closed and self.transport is not None:
            self.transport.writelines(corked)

    def _pump(self) -> None:
        """Hand the response over while the transport takes it: record data is read chunk by chunk here."""
        outbox = self._outbox
        while outbox and not (self._write_paused or self._closed):
            head = outbox[0]
            if isinstance(head, bytearray):
                outbox.popleft()
                self._send(head)
                continue
            if self._corked:  # record data goes after what was gathered, under the transport's flow control
                self._flush()
                continue
            try:
                chunk = next(head, None)
            except OSError as exc:  # the frame's length is promised: it cannot be finished any more
                self._abort(f"cannot read record data for a response: {exc}")
                return
            if chunk is None:
                outbox.popleft()
            else:
                self.last_active = time.monotonic()
                self.transport.write(chunk)

    # -- flow control -----------------------------------------------------------------------------
    def update_reading(self) -> None:
        """Read only when idle (muted channel), draining, and within the request memory bound."""
        if self._closed or self.transport is None:
            return
        should_pause = (self._busy or self._write_paused or self._waiting_memory or self.throttled
                        or len(self._inflight) >= MAX_PIPELINED_PRODUCES)
        if should_pause and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        elif not should_pause and self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()

    # -- client quota throttling (KIP-219) ---------------------------------------------------------
    @property
    def throttled(self) -> bool:
        """Muted for a client quota: nothing is read from the socket or taken from the buffer."""
        return self._unmute is not None

    def _mute_if_throttled(self, context: RequestContext) -> None:
        """After a request over its client quota has been answered (its answer goes out at once, with
        throttle_time_ms; an acks=0 produce has none), read nothing more from this connection for the
        throttle time (Kafka's ThrottledChannel: the channel stays muted until the delay has passed), so that
        a client that does not back off by itself is held to its quota. See server/throttling.py."""
        quota = context.quota
        if quota is None or quota.throttle_ms <= 0 or self._closed:
            return
        if self._unmute is not None:
            self._unmute.cancel()
        self._unmute = asyncio.get_running_loop().call_later(quota.throttle_ms / 1000, self._end_throttle)
        self.update_reading()

    def _end_throttle(self) -> None:
        """The throttle time has passed (or the connection is gone): the buffered frames, then reading again."""
        if self._unmute is None:
            return
        self._unmute.cancel()
        self._unmute = None
        if not self._closed:
            self._process()

    def _abort(self, reason: str) -> None:
        log.warning("closing connection from %s: %s", self.peer, reason)
        self.close()

    def close(self) -> None:
        """Close now: unsent response bytes are dropped (``abort``), as Kafka's Selector.close does; the
        transport calls connection_lost, which frees the connection's slot, memory and file pins."""
        if self.transport is not None and not self._closed:
            self._flush()  # the answers already given reach the socket, as when they were written one by one
            self._closed = True
            self.transport.abort()

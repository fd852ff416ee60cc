"""The broker's own Kafka client: requests out to other brokers, responses in.

Brokers of a cluster talk to each other with the ordinary protocol: followers Fetch from leaders (replica id
set), the controller sends LeaderAndIsr / UpdateMetadata / StopReplica, leaders send AlterPartition to the
controller. This module is the asyncio client all of them use; it knows nothing of broker state.

:class:`KafkaClientConnection` is one connection to one broker, modelled on Kafka's NetworkClient:

* ``connect()`` opens it within a connect timeout (Kafka's ``socket.connection.setup.timeout.ms``) and, unless
  told not to, negotiates versions with ApiVersions (followers' connections do; the controller's skip it and
  use the fixed versions of its ``inter.broker.protocol.version``). A broker that does not know the
  ApiVersions version asked answers in v0 format with UNSUPPORTED_VERSION and its range: the client then
  retries with the highest version both know, as Kafka's clients do.
* Requests are pipelined: each gets the next correlation id and is written at once; responses must come
  back in request order (a broker answers one request of a connection at a time), so a response whose
  correlation id is not the oldest in flight - unknown, or out of order - closes the connection and fails
  every request in flight with :class:`ProtocolViolation`.
* Every request has a timeout (Kafka's ``request.timeout.ms``). When it fires the request fails with
  :class:`RequestTimedOut` and the connection is closed, failing the other requests in flight with
  :class:`ConnectionLost`, as Kafka's client disconnects on a request timeout: a response that may still
  arrive would otherwise be matched against nothing, and a peer that stopped answering is not trusted with
  more. A caller that gives up on a request itself (cancels the await) leaves the connection alone: the
  response is read and dropped.
* A request on a closed connection fails at once with :class:`ConnectionLost`; a connection that drops
  fails all its requests in flight at once with :class:`ConnectionLost`. Nothing waits forever.
* Responses are read with the server's care: a frame larger than ``max_response_bytes`` (or too small to
  hold a correlation id) closes the connection; a frame's bytes are kept as they arrive, never allocated by
  the declared size; and before kio decodes a body, the frame guard (protocol/guard.py) checks every length
  and count in it against the bytes left, since kio's native reader reserves memory by declared counts.
* The client id is the broker id as a string, as Kafka's brokers send it.
* Security (``security``, a :class:`ClientSecurity`; None: plain text): with TLS the connection is wrapped in
  the context ``security.ssl_context()`` returns at that moment (so a reloaded certificate serves the next
  connection) and the server's certificate is checked against ``server_hostname`` (default: the host
  connected to) when the context checks host names; the handshake counts towards the connect timeout. Over
  TLS connecting always includes one round trip (ApiVersions, kept only if negotiating): under TLS 1.3 a
  server refuses the client's certificate after the client's side of the handshake finished, so a close
  before that first answer is an :class:`AuthenticationFailed` saying the peer probably did not accept this
  broker's certificate (and NodeClients' backoff grows instead of being reset by a "connected" link). With
  SASL, before anything else: ApiVersions, SaslHandshake and SaslAuthenticate exchanges driven by a client
  state machine (security/sasl/client.py); a session lifetime in the answer (KIP-368, the listener's
  ``connections.max.reauth.ms``) makes the connection due for re-authentication after 85-95 % of it, and
  NodeClients then sends new requests on a new connection, the old one closing once its requests in flight
  are answered (the server would close it at its first request after the lifetime). A TLS handshake or a
  SASL exchange that fails raises
  :class:`AuthenticationFailed` (a ConnectError) naming the peer and the reason, never a secret.

Requests are kio entities (any API kio has a schema for, AlterPartition included) or the generated
inter-broker entities of protocol/interbroker (api keys 4-7); the version is the entity's. Responses are the
matching response entities. Produce with acks=0 gets no response: ``send`` returns None for it.

:func:`request_once` sends one request on a new connection and closes it, all within one timeout: the
console's and the CLI's look at a broker (``console/logdirs.py``, ``ctl/coordination.py``).

:class:`NodeClients` is a pool of connections keyed by broker id, for the controller's channel manager and
the follower fetchers (and the transaction marker sender): connect on first use, one connection per node, with
the pool's ``security``, and Kafka's reconnect backoff - after
a failed attempt or a lost connection no new attempt is made before ``reconnect_backoff`` seconds, doubled
after each consecutive failure up to ``reconnect_backoff_max``, with +-20 % jitter
(``reconnect.backoff.ms`` / ``reconnect.backoff.max.ms``); a connection that is ready (over TLS: after the
peer's first answer, as Kafka resets it once the connection is ready) resets it.
"""

from __future__ import annotations

import asyncio
import collections
import io
import logging
import random
import ssl
import struct
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32
from kio.serial import entity_reader, entity_writer

from pykbroker import __version__
from pykbroker.protocol import interbroker
from pykbroker.protocol.apis import API_VERSIONS_KEY, PRODUCE_KEY
from pykbroker.protocol.framing import SIZE
from pykbroker.protocol.guard import compile_entity_check

log = logging.getLogger(__name__)

__all__ = (
    "ClientError", "ConnectError", "AuthenticationFailed", "ClientSecurity", "ConnectionLost", "ProtocolViolation",
    "RequestTimedOut",
    "UnsupportedVersion", "UnknownNode", "KafkaClientConnection", "NodeClients", "encode_request",
    "decode_response", "reconnect_backoff", "request_once",
)

# Kafka's defaults: request.timeout.ms 30 s, socket.connection.setup.timeout.ms 10 s,
# reconnect.backoff.ms 50 ms, reconnect.backoff.max.ms 1 s; socket.request.max.bytes (100 MiB) bounds frames.
DEFAULT_REQUEST_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_RECONNECT_BACKOFF_S = 0.05
DEFAULT_RECONNECT_BACKOFF_MAX_S = 1.0
DEFAULT_MAX_RESPONSE_BYTES = 100 * 1024 * 1024
RECONNECT_JITTER = 0.2
# The highest ApiVersions version this client asks first (Kafka 3.x clients send v3).
API_VERSIONS_CLIENT_MAX = 3

_CORRELATION = struct.Struct(">i")
_ERROR_CODE = struct.Struct(">h")


class ClientError(Exception):
    """Base of every failure of a request sent with this client."""


class ConnectError(ClientError):
    """The connection could not be opened (refused, unreachable, timed out, or version negotiation failed)."""


class AuthenticationFailed(ConnectError):
    """The TLS handshake or the SASL exchange with the peer failed (Kafka's AuthenticationException)."""


class ConnectionLost(ClientError):
    """The request cannot be answered: its connection is closed, dropped, or was closed by the client."""


class RequestTimedOut(ClientError):
    """No response within the request timeout; the connection was closed (as Kafka's client does)."""


class ProtocolViolation(ClientError):
    """The peer sent bytes that are not a valid response (bad frame size, unexpected correlation id,
    undecodable body)."""


class UnsupportedVersion(ClientError):
    """The peer supports no version of the API in the range the caller can speak."""


class UnknownNode(ClientError):
    """NodeClients has no address for this broker id."""


SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36


class ClientSecurity:
    """How the broker's own client secures its connections (security/inter_broker.py builds it from the
    inter-broker listener's settings): ``ssl_context`` returns the TLS context for the next connection (None:
    no TLS); ``sasl`` returns a new client state machine for one SASL exchange (None: no SASL);
    ``description`` names the listener and protocol in log lines."""

    def __init__(self, *, ssl_context: Callable[[], ssl.SSLContext | None] | None = None,
                 sasl: Callable[[], Any] | None = None, description: str = "") -> None:
        self._ssl_context = ssl_context
        self.sasl = sasl
        self.description = description

    def ssl_context(self) -> ssl.SSLContext | None:
        return self._ssl_context() if self._ssl_context is not None else None

    def __repr__(self) -> str:
        return f"ClientSecurity({self.description or 'PLAINTEXT'})"


def _tls_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):  # "certificate verify failed: self-signed certificate ..."
        return f"certificate verify failed: {exc.verify_message or exc.reason or exc}"
    if isinstance(exc, ssl.SSLError):
        return exc.reason or exc.strerror or str(exc)
    return str(exc) or type(exc).__name__


# ---------------------------------------------------------------------------------------------------
# Codecs: request writers and response readers per (api key, version), built once.


@dataclass(frozen=True, slots=True)
class _Codec:
    api_key: int
    version: int
    name: str
    make_header: Callable[[int, str | None], Any]
    write_header: Callable[[Any, Any], None]
    write_body: Callable[[Any, Any], None]
    read_response_header: Callable[[Any, int], tuple[Any, int]]
    check_response_body: Callable[[Any, int], int]
    read_response_body: Callable[[Any, int], tuple[Any, int]]


@lru_cache(maxsize=None)
def _codec(api_key: int, version: int) -> _Codec:
    """The inter-broker APIs (4-7) come from protocol/interbroker's generated schemas, the rest from kio."""
    if api_key in interbroker.APIS:
        ib = interbroker.codec_for(api_key, version)
        return _Codec(api_key, version, ib.name, ib.request_header, ib.write_request_header,
                      ib.write_request_body, ib.read_response_header,
                      compile_entity_check(ib.response_type, max_elements=None), ib.read_response_body)
    request_type = load_request_schema(api_key, version)
    response_type = load_response_schema(api_key, version)
    header_type = request_type.__header_schema__
    has_client_id = "client_id" in header_type.__dataclass_fields__

    def make_header(correlation_id: int, client_id: str | None) -> Any:
        fields = {"request_api_key": i16(api_key), "request_api_version": i16(version),
                  "correlation_id": i32(correlation_id)}
        if has_client_id:
            fields["client_id"] = client_id
        return header_type(**fields)

    return _Codec(api_key, version, request_type.__name__.removesuffix("Request"), make_header,
                  entity_writer(header_type), entity_writer(request_type),
                  entity_reader(response_type.__header_schema__),
                  compile_entity_check(response_type, max_elements=None), entity_reader(response_type))


def _codec_of(request: Any) -> _Codec:
    return _codec(int(request.__api_key__), int(request.__version__))


def encode_request(request: Any, correlation_id: int, client_id: str | None) -> bytes:
    """The frame of a request entity, size prefix included, with the header version its API version uses."""
    codec = _codec_of(request)
    out = io.BytesIO()
    out.write(b"\x00\x00\x00\x00")
    codec.write_header(out, codec.make_header(correlation_id, client_id))
    codec.write_body(out, request)
    with out.getbuffer() as frame:
        SIZE.pack_into(frame, 0, len(frame) - SIZE.size)
    return out.getvalue()


def decode_response(api_key: int, version: int, frame) -> Any:
    """The response entity of a frame (without its size prefix) answering a request of (api_key, version).

    The body's lengths and counts are checked by the frame guard before kio reads it; bytes left after the
    body mean the frame is not this response (ProtocolViolation). An ApiVersions request of a version the
    broker does not know is answered in v0 format with UNSUPPORTED_VERSION: that answer decodes as v0.
    """
    codec = _codec(api_key, version)
    if (api_key == API_VERSIONS_KEY and version > 0 and len(frame) >= 6
            and _ERROR_CODE.unpack_from(frame, 4)[0] == ErrorCode.unsupported_version):
        codec = _codec(api_key, 0)
    try:
        _, position = codec.read_response_header(frame, 0)
        end = codec.check_response_body(frame, position)
        body, used = codec.read_response_body(frame, position)
    except Exception as exc:  # the guard and kio raise assorted errors on truncated or garbled input
        raise ProtocolViolation(f"cannot decode {codec.name} v{codec.version} response: {exc!r}") from exc
    if position + used != len(frame) or end != len(frame):
        raise ProtocolViolation(f"{codec.name} v{codec.version} response: {len(frame) - position - used} "
                                "bytes left after the body")
    return body


def _expects_response(request: Any) -> bool:
    return not (int(request.__api_key__) == PRODUCE_KEY and int(request.acks) == 0)


# ---------------------------------------------------------------------------------------------------
# One connection.


class _Pending:
    __slots__ = ("codec", "future", "timer", "started")

    def __init__(self, codec: _Codec, future: asyncio.Future, timer: asyncio.TimerHandle | None) -> None:
        self.codec = codec
        self.future = future
        self.timer = timer
        self.started = time.monotonic()


class KafkaClientConnection(asyncio.Protocol):
    """One connection to one broker; create it with :meth:`connect`."""

    def __init__(self, *, client_id: str | None, request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT_S,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
                 on_close: Callable[["KafkaClientConnection"], None] | None = None) -> None:
        self.client_id = client_id
        self.request_timeout = request_timeout
        self.max_response_bytes = max_response_bytes
        self.api_versions: dict[int, tuple[int, int]] | None = None  # set by negotiation
        self.peer = "?"
        self._on_close = on_close
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._in_flight: collections.OrderedDict[int, _Pending] = collections.OrderedDict()
        self._next_correlation_id = 0
        self._closed = False
        self._close_reason: ClientError | None = None
        self._lost = self._loop.create_future()  # done when the transport is gone
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future] = []
        self.reauthenticate_at: float | None = None  # loop time, when the SASL session has a lifetime
        self._retiring = False

    # -- opening --------------------------------------------------------------------------------------
    @classmethod
    async def connect(cls, host: str, port: int, *, client_id: str | None,
                      connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
                      request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT_S,
                      negotiate_versions: bool = True,
                      max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
                      on_close: Callable[["KafkaClientConnection"], None] | None = None,
                      security: ClientSecurity | None = None,
                      server_hostname: str | None = None,
                      ) -> "KafkaClientConnection":
        """Open a connection within connect_timeout seconds (ConnectError otherwise; AuthenticationFailed for
        a failed TLS handshake or SASL exchange, see the module docstring) and, if negotiate_versions, learn
        the peer's API versions (``api_versions``, ``version_for``)."""
        loop = asyncio.get_running_loop()
        factory = lambda: cls(client_id=client_id, request_timeout=request_timeout,  # noqa: E731
                              max_response_bytes=max_response_bytes, on_close=on_close)
        context = security.ssl_context() if security is not None else None
        tls = {} if context is None else {"ssl": context, "server_hostname": server_hostname or host,
                                          "ssl_handshake_timeout": connect_timeout}
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation that arrives as
            # the connection completes, and the attempt would then go on to wait for ApiVersions.
            async with asyncio.timeout(connect_timeout):
                _, connection = await loop.create_connection(factory, host, port, **tls)
        except TimeoutError:
            what = "connecting (TLS handshake included)" if tls else "connecting"
            raise ConnectError(f"{what} to {host}:{port} timed out after {connect_timeout} s") from None
        except ssl.SSLError as exc:
            raise AuthenticationFailed(f"TLS handshake with {host}:{port} failed: {_tls_reason(exc)}") from None
        except (ConnectionResetError, BrokenPipeError) as exc:
            if tls:  # a server that refuses our certificate (or speaks no TLS) closes during the handshake
                raise AuthenticationFailed(f"TLS handshake with {host}:{port} failed: the server closed the "
                                           f"connection ({_tls_reason(exc)})") from None
            raise ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        except OSError as exc:
            raise ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        if tls:
            # Under TLS 1.3 the server checks the client's certificate after the client's side of the handshake
            # finished: a refused certificate shows only as a close before the first answer. So one round trip
            # (ApiVersions) belongs to connecting over TLS, and such a close is an authentication failure.
            try:
                async with asyncio.timeout(connect_timeout):
                    await connection.negotiate_api_versions()
            except BaseException as exc:
                connection.close()
                if isinstance(exc, TimeoutError):
                    raise ConnectError(f"ApiVersions with {host}:{port} over TLS got no answer within "
                                       f"{connect_timeout} s") from None
                if isinstance(exc, ConnectionLost):
                    raise AuthenticationFailed(
                        f"TLS connection to {host}:{port} closed by the peer before its first answer ({exc}): "
                        "the peer probably did not accept this broker's certificate") from None
                if isinstance(exc, ClientError):
                    raise ConnectError(f"ApiVersions with {host}:{port} failed: {exc}") from exc
                raise
        if security is not None and security.sasl is not None:
            try:
                async with asyncio.timeout(connect_timeout):
                    await connection.authenticate_sasl(security.sasl())
            except BaseException as exc:
                connection.close()
                if isinstance(exc, TimeoutError):
                    raise AuthenticationFailed(f"SASL authentication with {host}:{port} timed out after "
                                               f"{connect_timeout} s") from None
                if isinstance(exc, ClientError) and not isinstance(exc, AuthenticationFailed):
                    raise AuthenticationFailed(f"SASL authentication with {host}:{port} failed: {exc}") from None
                raise
        if negotiate_versions and connection.api_versions is None:
            try:
                await connection.negotiate_api_versions()
            except BaseException as exc:
                connection.close()
                if isinstance(exc, ClientError) and not isinstance(exc, ConnectError):
                    raise ConnectError(f"ApiVersions with {host}:{port} failed: {exc}") from exc
                raise
        elif not negotiate_versions:
            connection.api_versions = None  # the caller sends fixed versions; TLS's or SASL's round trip only
        return connection

    async def negotiate_api_versions(self, version: int = API_VERSIONS_CLIENT_MAX) -> dict[int, tuple[int, int]]:
        """ApiVersions: ask with `version`; on UNSUPPORTED_VERSION retry once with the broker's highest."""
        for _ in range(2):
            response = await self.send(_api_versions_request(version))
            ranges = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys}
            if response.error_code == ErrorCode.unsupported_version:
                broker_max = ranges.get(API_VERSIONS_KEY, (0, -1))[1]
                if not 0 <= broker_max < version:
                    raise UnsupportedVersion(f"{self.peer} refused ApiVersions v{version} "
                                             f"and supports up to v{broker_max}")
                version = broker_max
                continue
            if response.error_code != ErrorCode.none:
                raise ProtocolViolation(f"ApiVersions v{version} answered with {response.error_code!r}")
            self.api_versions = ranges
            return ranges
        raise UnsupportedVersion(f"{self.peer}: no ApiVersions version agreed")

    async def authenticate_sasl(self, client: Any) -> None:
        """The SASL exchange of Kafka's SaslClientAuthenticator: ApiVersions (to learn the SASL versions),
        SaslHandshake naming ``client.mechanism``, then SaslAuthenticate with each token of ``client`` (a
        security/sasl/client.py state machine: ``first()`` and ``evaluate()`` raise a ValueError - its
        SaslClientError - for a server message it refuses) until it is complete. AuthenticationFailed with the
        server's error message, or the client's own refusal (a server that failed its proof)."""
        if self.api_versions is None:
            await self.negotiate_api_versions()
        handshake_version = self.version_for(SASL_HANDSHAKE_KEY, 1)
        authenticate_version = self.version_for(SASL_AUTHENTICATE_KEY, 2) if handshake_version >= 1 else None
        if authenticate_version is None:
            raise AuthenticationFailed(f"{self.peer} supports only SaslHandshake v0 (unframed SASL tokens), which "
                                       "the broker's own client does not speak")
        handshake = await self.send(load_request_schema(SASL_HANDSHAKE_KEY, handshake_version)(mechanism=client.mechanism))
        if handshake.error_code != ErrorCode.none:
            raise AuthenticationFailed(f"{self.peer} refused SASL mechanism {client.mechanism} "
                                       f"({ErrorCode(handshake.error_code).name.upper()}; enabled: "
                                       f"{', '.join(handshake.mechanisms) or 'none'})")
        request_type = load_request_schema(SASL_AUTHENTICATE_KEY, authenticate_version)
        failed = f"SASL/{client.mechanism} authentication with {self.peer} failed"
        try:
            token = client.first()
        except ValueError as exc:
            raise AuthenticationFailed(f"{failed}: {exc}") from None
        while token is not None:
            response = await self.send(request_type(auth_bytes=token))
            if response.error_code != ErrorCode.none:
                raise AuthenticationFailed(f"{failed}: "
                                           f"{response.error_message or ErrorCode(response.error_code).name.upper()}")
            self._session_lifetime(response)
            if client.complete:
                break
            try:  # off the event loop: a SCRAM step derives a key (PBKDF2, up to 16384 iterations)
                token = await asyncio.to_thread(client.evaluate, response.auth_bytes)
            except ValueError as exc:
                raise AuthenticationFailed(f"{failed}: {exc}") from None
        if not client.complete:
            raise AuthenticationFailed(f"{failed}: the exchange ended before it was complete")

    def _session_lifetime(self, response: Any) -> None:
        """KIP-368: a SaslAuthenticate answer's session lifetime (v1+; 0: none). As Kafka's client, this
        connection is due for re-authentication after 85 to 95 % of it (network latency, clock drift, jitter
        against storms): NodeClients replaces it then (``reauthentication_due``), before the server closes it."""
        lifetime = getattr(response, "session_lifetime", None)
        seconds = lifetime.total_seconds() if hasattr(lifetime, "total_seconds") else (lifetime or 0) / 1000
        self.reauthenticate_at = (self._loop.time() + seconds * (0.85 + 0.1 * random.random())
                                  if seconds > 0 else None)

    @property
    def reauthentication_due(self) -> bool:
        """The SASL session's lifetime (KIP-368) is nearly over: new requests belong on a new connection."""
        return self.reauthenticate_at is not None and self._loop.time() >= self.reauthenticate_at

    def retire(self) -> None:
        """Close once the requests in flight are answered (at once if there are none); new requests are the
        caller's to send elsewhere."""
        self._retiring = True
        if not self._in_flight:
            self.close()

    def version_for(self, api_key: int, max_version: int, min_version: int = 0) -> int:
        """The highest version of api_key in [min_version, max_version] the peer supports. Without a
        negotiation (the controller's fixed versions) that is max_version."""
        if self.api_versions is None:
            return max_version
        supported = self.api_versions.get(api_key)
        if supported is not None:
            highest = min(max_version, supported[1])
            if highest >= max(min_version, supported[0]):
                return highest
        raise UnsupportedVersion(f"{self.peer} supports api key {api_key} in {supported}, "
                                 f"not in {min_version}-{max_version}")

    # -- sending --------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._in_flight)

    def send_nowait(self, request: Any, *, timeout: float | None = None) -> asyncio.Future:
        """Write a request now and return the future of its response (None for Produce acks=0).
        ConnectionLost at once if the connection is closed. timeout: seconds, default request_timeout.
        No flow control here: a caller pipelining this way bounds its own requests in flight (``send``
        waits while the transport's buffer is above its high-water mark)."""
        if self._closed or self._transport is None:
            raise ConnectionLost(f"connection to {self.peer} is closed"
                                 + (f" ({self._close_reason})" if self._close_reason else ""))
        codec = _codec_of(request)
        correlation_id = self._next_correlation_id
        frame = encode_request(request, correlation_id, self.client_id)
        self._next_correlation_id = (correlation_id + 1) & 0x7FFFFFFF  # Kafka's ids wrap to 0, never negative
        future = self._loop.create_future()
        if not _expects_response(request):
            self._transport.write(frame)
            future.set_result(None)
            return future
        timeout = self.request_timeout if timeout is None else timeout
        timer = None
        if timeout is not None:
            timer = self._loop.call_later(timeout, self._expire, correlation_id, timeout)
        self._in_flight[correlation_id] = _Pending(codec, future, timer)
        self._transport.write(frame)
        return future

    async def send(self, request: Any, *, timeout: float | None = None) -> Any:
        """Send a request and wait for its response entity. Raises RequestTimedOut, ConnectionLost,
        ProtocolViolation (all ClientError); never waits past the timeout."""
        future = self.send_nowait(request, timeout=timeout)
        if self._write_paused and not future.done():
            await self._drain()
        return await future

    async def _drain(self) -> None:
        waiter = self._loop.create_future()
        self._drain_waiters.append(waiter)
        await waiter

    def _wake_drain_waiters(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _expire(self, correlation_id: int, timeout: float) -> None:
        pending = self._in_flight.pop(correlation_id, None)
        if pending is None:
            return
        error = RequestTimedOut(f"{pending.codec.name} v{pending.codec.version} to {self.peer} "
                                f"(correlation id {correlation_id}) got no response within {timeout} s")
        if not pending.future.done():
            pending.future.set_exception(error)
        log.warning("%s; closing the connection", error)
        self._shut(ConnectionLost(f"connection to {self.peer} closed after a request timed out"), abort=True)

    # -- closing --------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close now; requests in flight fail with ConnectionLost."""
        self._shut(ConnectionLost(f"connection to {self.peer} closed by the client"), abort=False)

    async def aclose(self) -> None:
        self.close()
        await self.wait_closed()

    async def wait_closed(self) -> None:
        """Until the transport is gone (after close(), or when the peer drops the connection)."""
        await asyncio.shield(self._lost)

    def _shut(self, reason: ClientError, *, abort: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_reason = reason
        pending, self._in_flight = self._in_flight, collections.OrderedDict()
        for entry in pending.values():
            if entry.timer is not None:
                entry.timer.cancel()
            if not entry.future.done():
                entry.future.set_exception(reason)
                entry.future.exception()  # a caller that gave up must not leave an unretrieved exception
        self._wake_drain_waiters()
        self._buffer = bytearray()
        if self._transport is not None:
            if abort:
                self._transport.abort()
            else:
                self._transport.close()
        elif not self._lost.done():
            self._lost.set_result(None)
        if self._on_close is not None:
            callback, self._on_close = self._on_close, None
            callback(self)

    # -- asyncio.Protocol -----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"

    def connection_lost(self, exc: Exception | None) -> None:
        self._shut(ConnectionLost(f"connection to {self.peer} lost" + (f": {exc}" if exc else "")),
                   abort=False)
        if not self._lost.done():
            self._lost.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drain_waiters()

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        buffer = self._buffer
        buffer += data  # bytes are kept as they arrive: nothing is allocated by a declared size
        start = 0
        while len(buffer) - start >= SIZE.size:
            (size,) = SIZE.unpack_from(buffer, start)
            if size < _CORRELATION.size or size > self.max_response_bytes:
                self._violation(f"response frame of {size} bytes from {self.peer} (bound: "
                                f"{_CORRELATION.size}..{self.max_response_bytes})")
                return
            end = start + SIZE.size + size
            if len(buffer) < end:
                break
            with memoryview(buffer) as view:
                frame = bytes(view[start + SIZE.size:end])
            start = end
            self._handle_frame(frame)
            if self._closed:
                return
        if start:
            del buffer[:start]

    def _violation(self, message: str) -> None:
        log.warning("%s; closing the connection", message)
        self._shut(ProtocolViolation(message), abort=True)

    def _handle_frame(self, frame: bytes) -> None:
        (correlation_id,) = _CORRELATION.unpack_from(frame, 0)
        expected = next(iter(self._in_flight), None)
        if correlation_id != expected:
            what = "out of order" if correlation_id in self._in_flight else "unknown"
            self._violation(f"response from {self.peer} with {what} correlation id {correlation_id} "
                            f"(expected {expected})")
            return
        pending = self._in_flight.pop(correlation_id)
        if pending.timer is not None:
            pending.timer.cancel()
        if self._retiring and not self._in_flight:
            self._loop.call_soon(self.close)  # after this response is delivered
        if pending.future.done():  # the caller gave up (cancelled): the response is read and dropped
            return
        try:
            body = decode_response(pending.codec.api_key, pending.codec.version, frame)
        except ProtocolViolation as exc:
            # The frame boundary is intact, so only this request fails; the connection stays usable.
            log.warning("%s from %s", exc, self.peer)
            pending.future.set_exception(exc)
            return
        pending.future.set_result(body)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._in_flight)} in flight"
        return f"KafkaClientConnection({self.peer}, client_id={self.client_id!r}, {state})"


def _api_versions_request(version: int) -> Any:
    request_type = load_request_schema(API_VERSIONS_KEY, version)
    if version >= 3:
        return request_type(client_software_name="pykbroker", client_software_version=__version__)
    return request_type()


async def request_once(host: str, port: int, request: Any, *, client_id: str | None, timeout: float,
                       negotiate: tuple[int, int, int] | None = None, security: ClientSecurity | None = None) -> Any:
    """One request to one broker on a new connection, closed after it: connecting, ApiVersions and the
    request all within ``timeout`` seconds. ``request`` is a request entity, sent in its own version without
    asking ApiVersions; or, with ``negotiate`` = (api key, min version, max version), a function building the
    request in a version, sent in the highest version of that range the broker supports. The response; or
    ClientError (UnsupportedVersion when the broker supports no such version), OSError or TimeoutError.
    ``security``: TLS and SASL as KafkaClientConnection.connect takes them."""
    async with asyncio.timeout(timeout):
        connection = await KafkaClientConnection.connect(host, port, client_id=client_id, connect_timeout=timeout,
                                                         request_timeout=timeout, security=security,
                                                         negotiate_versions=negotiate is not None)
        try:
            if negotiate is not None:
                api_key, min_version, max_version = negotiate
                request = request(connection.version_for(api_key, max_version, min_version))
            return await connection.send(request)
        finally:
            connection.close()


# ---------------------------------------------------------------------------------------------------
# The pool.


def reconnect_backoff(failures: int, base: float, maximum: float, jitter: float = RECONNECT_JITTER,
                      rand: Callable[[], float] = random.random) -> float:
    """Seconds to wait before the next attempt after `failures` consecutive failures (>= 1): Kafka's
    exponential reconnect backoff, base * 2^(failures-1) with +-jitter, never above maximum."""
    if failures <= 0:
        return 0.0
    term = base * 2 ** min(failures - 1, 62)
    if maximum > base and term > maximum:
        term = maximum
    factor = 1.0 + jitter * (2 * rand() - 1) if jitter > 0 else 1.0
    return min(term * factor, max(maximum, base))


@dataclass
class _Node:
    address: tuple[str, int] | None
    server_hostname: str | None = None  # the name a TLS certificate must carry (None: the host)
    connection: KafkaClientConnection | None = None
    connecting: asyncio.Task | None = None
    failures: int = 0
    next_attempt: float = 0.0  # loop time before which no attempt is made
    connects: int = 0  # successful connections made, for observation
    auth_failure: str | None = None  # the last authentication failure logged (logged again when it changes)


class NodeClients:
    """One connection per broker id, opened on first use and reopened with Kafka's reconnect backoff.

    broker_id is this broker's id; connections send it as their client id, as Kafka's controller channel
    and AlterPartition channel do, unless client_id says otherwise (Kafka's follower fetchers send
    "broker-<id>-fetcher-<n>"). addresses maps broker ids to (host, port); set_address/remove keep it
    current as the metadata changes. ``security`` (a ClientSecurity) secures every connection; a TLS
    handshake or SASL exchange that fails is logged as a warning naming the peer and the reason (then again
    only when the reason changes: a misconfigured peer is retried with the backoff, not logged every second).
    """

    def __init__(self, broker_id: int, addresses: Mapping[int, tuple[str, int]] | None = None, *,
                 client_id: str | None = None,
                 negotiate_versions: bool = True,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
                 request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT_S,
                 reconnect_backoff: float = DEFAULT_RECONNECT_BACKOFF_S,
                 reconnect_backoff_max: float = DEFAULT_RECONNECT_BACKOFF_MAX_S,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
                 security: ClientSecurity | None = None) -> None:
        self.broker_id = broker_id
        self.security = security
        self.client_id = str(broker_id) if client_id is None else client_id
        self.negotiate_versions = negotiate_versions
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.reconnect_backoff = reconnect_backoff
        self.reconnect_backoff_max = reconnect_backoff_max
        self.max_response_bytes = max_response_bytes
        self._nodes: dict[int, _Node] = {}
        self._closed = False
        for node_id, (host, port) in (addresses or {}).items():
            self.set_address(node_id, host, port)

    def set_address(self, node_id: int, host: str, port: int, server_hostname: str | None = None) -> None:
        """Where broker node_id listens (``server_hostname``: the name its TLS certificate must carry when
        that is not ``host``, as for a broker reaching itself on its bound address); a changed address
        closes the connection to the old one."""
        node = self._nodes.get(node_id)
        if node is None:
            self._nodes[node_id] = _Node((host, port), server_hostname)
            return
        node.server_hostname = server_hostname
        if node.address != (host, port):
            node.address = (host, port)
            node.failures, node.next_attempt = 0, 0.0
            self._discard(node)

    def remove(self, node_id: int) -> None:
        """Forget a broker: its connection is closed, its requests in flight fail with ConnectionLost."""
        node = self._nodes.pop(node_id, None)
        if node is not None:
            self._discard(node)

    @property
    def node_ids(self) -> list[int]:
        return list(self._nodes)

    def connection(self, node_id: int) -> KafkaClientConnection | None:
        """The open connection to node_id, if there is one (no connection attempt)."""
        node = self._nodes.get(node_id)
        if node is None or node.connection is None or node.connection.closed:
            return None
        return node.connection

    def connects(self, node_id: int) -> int:
        """How many connections to node_id were opened so far."""
        node = self._nodes.get(node_id)
        return node.connects if node is not None else 0

    def backoff_remaining(self, node_id: int) -> float:
        """Seconds before a new connection attempt to node_id may be made (0: now)."""
        node = self._nodes.get(node_id)
        if node is None:
            return 0.0
        return max(0.0, node.next_attempt - asyncio.get_running_loop().time())

    async def get(self, node_id: int) -> KafkaClientConnection:
        """The connection to node_id, opened if needed after any backoff still running. ConnectError when the
        attempt fails (the next one then waits longer), UnknownNode for a broker without an address."""
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise ConnectionLost("the node client pool is closed")
            node = self._nodes.get(node_id)
            if node is None or node.address is None:
                raise UnknownNode(f"no address known for broker {node_id}")
            if node.connection is not None and not node.connection.closed:
                if not node.connection.reauthentication_due:
                    return node.connection
                # KIP-368: the server closes a connection whose SASL session expired at its next request;
                # a new connection (authenticated anew) takes the new requests, the old one closes once its
                # requests in flight are answered. Not a failure: no backoff.
                retired, node.connection = node.connection, None
                retired.retire()
                log.info("broker %s: connection to broker %s reconnecting before its SASL session ends (KIP-368 "
                         "session lifetime)", self.broker_id, node_id)
                node.next_attempt = 0.0
            if node.connecting is None:
                delay = node.next_attempt - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)  # reconnect.backoff.ms: the wait Kafka's client makes too
                    continue
                node.connecting = loop.create_task(self._connect(node_id, node))
                node.connecting.add_done_callback(_consume_exception)
            attempt = node.connecting
            try:
                return await asyncio.shield(attempt)
            except asyncio.CancelledError:
                # The attempt was cancelled by close()/remove()/set_address(), not this caller: say so.
                if attempt.cancelled() and not asyncio.current_task().cancelling():
                    raise ConnectionLost(f"connecting to broker {node_id} was abandoned: "
                                         "the node or the pool changed") from None
                raise

    async def send(self, node_id: int, request: Any, *, timeout: float | None = None) -> Any:
        """get(node_id), then send the request on that connection."""
        connection = await self.get(node_id)
        return await connection.send(request, timeout=timeout)

    async def _connect(self, node_id: int, node: _Node) -> KafkaClientConnection:
        host, port = node.address  # type: ignore[misc]
        loop = asyncio.get_running_loop()
        try:
            connection = await KafkaClientConnection.connect(
                host, port, client_id=self.client_id, connect_timeout=self.connect_timeout,
                request_timeout=self.request_timeout, negotiate_versions=self.negotiate_versions,
                max_response_bytes=self.max_response_bytes,
                on_close=lambda closed: self._lost(node_id, node, closed),
                security=self.security, server_hostname=node.server_hostname)
        except BaseException as exc:
            node.connecting = None
            if isinstance(exc, Exception):
                self._failed(node, loop)
                if isinstance(exc, AuthenticationFailed) and str(exc) != node.auth_failure:
                    node.auth_failure = str(exc)
                    log.warning("broker %s: connection to broker %s at %s:%s failed authentication (client %s, %s): "
                                "%s; retrying with backoff", self.broker_id, node_id, host, port, self.client_id,
                                self.security.description if self.security else "PLAINTEXT", exc)
                else:
                    log.info("broker %s: connection to broker %s at %s:%s failed (%s); next attempt in %.3f s",
                             self.broker_id, node_id, host, port, exc, node.next_attempt - loop.time())
            raise
        node.connecting = None
        node.auth_failure = None
        if self._closed or self._nodes.get(node_id) is not node or node.address != (host, port):
            connection.close()  # the pool closed or the node moved while connecting
            raise ConnectionLost(f"connection to broker {node_id} abandoned: the node or the pool changed")
        node.failures, node.next_attempt = 0, 0.0
        node.connection = connection
        node.connects += 1
        return connection

    def _failed(self, node: _Node, loop: asyncio.AbstractEventLoop) -> None:
        node.failures += 1
        node.next_attempt = loop.time() + reconnect_backoff(node.failures, self.reconnect_backoff,
                                                            self.reconnect_backoff_max)

    def _lost(self, node_id: int, node: _Node, connection: KafkaClientConnection) -> None:
        if node.connection is not connection:
            return
        node.connection = None
        if not self._closed and self._nodes.get(node_id) is node:
            # As Kafka: a lost connection is a failure too, the next attempt waits the backoff.
            self._failed(node, asyncio.get_running_loop())

    def _discard(self, node: _Node) -> None:
        if node.connecting is not None:
            node.connecting.cancel()
            node.connecting = None
        if node.connection is not None:
            connection, node.connection = node.connection, None
            connection.close()

    async def close(self) -> None:
        """Close every connection (requests in flight fail with ConnectionLost); the pool is unusable after."""
        self._closed = True
        connections = [node.connection for node in self._nodes.values() if node.connection is not None]
        for node in self._nodes.values():
            self._discard(node)
        for connection in connections:
            await connection.wait_closed()


def _consume_exception(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()

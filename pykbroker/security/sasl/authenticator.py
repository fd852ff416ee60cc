"""One SASL connection's authentication, as Kafka 3.7's SaslServerAuthenticator and KafkaChannel run it.

The connection (server/connection.py) hands every frame to ``SaslAuthenticator.receive`` while
``authenticating`` is true, and ``screen`` every frame of an authenticated connection (a SaslHandshake may begin
KIP-368 re-authentication; an expired session closes the connection). Each call answers a ``Step``: a reply to
send, "serve this frame as usual" (ApiVersions before the handshake), a close, or a failure whose reply (if
any) Kafka sends only after ``connection.failed.authentication.delay.ms`` and then closes.

States (Kafka's SaslState): INITIAL_REQUEST and HANDSHAKE_OR_VERSIONS_REQUEST accept ApiVersions or
SaslHandshake, HANDSHAKE_REQUEST (after one ApiVersions) only SaslHandshake; any other request there fails the
authentication without an answer, as Kafka 3.7.1 ("Unexpected Kafka request of type METADATA during SASL
handshake.": closed after the delay, logged). SaslHandshake v1 means the
tokens come in SaslAuthenticate requests (another request then gets ILLEGAL_SASL_STATE and the connection
closes); v0 means KIP-43 framing: each token is a raw size-prefixed frame, answered the same way. A mechanism not
enabled on the listener gets UNSUPPORTED_SASL_MECHANISM (33) with the enabled list, a failed exchange
SASL_AUTHENTICATION_FAILED (58) with the mechanism's message (v0: no answer), both then close. While
authenticating, a frame larger than ``sasl.server.max.receive.size`` fails the authentication without an
answer ("Failing SASL authentication due to invalid receive size").

Session lifetime (KIP-368): at completion, ``connections.max.reauth.ms`` of the mechanism (looked up as
``listener.name.<l>.<mech>.connections.max.reauth.ms``, ``listener.name.<l>.connections.max.reauth.ms``,
``connections.max.reauth.ms``; 0 = none) and the credential's expiry (an OAUTHBEARER token's ``exp``) give the
session lifetime sent in SaslAuthenticate v1+ (0 when neither is set). With a lifetime, a SaslHandshake on the
authenticated connection begins re-authentication (at most once a second, as KafkaChannel): same mechanism
(else the next token fails with Kafka's message), same principal (else "Cannot change principals during
re-authentication ..."). Without one, or within that second, the SaslHandshake is served as a request
(handlers/sasl.py: ILLEGAL_SASL_STATE). Once the session expired, any other request closes the connection.

Nothing here logs or returns a password, token or proof: messages come from ``SaslAuthenticationFailed``,
whose texts never hold one. A failure's INFO line (logged by the connection: "Failed authentication with ..." or
"Failed re-authentication with ...") holds Kafka's exception message only; the detail (a user name) goes to
DEBUG; every log text has the control characters of what the client sent escaped (``loggable``). Another
request between the handshake and the token is answered ILLEGAL_SASL_STATE (built here) after the delay.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from kio.index import api_key_map

from pykbroker.protocol.apis import API_VERSIONS_KEY, SUPPORTED_APIS
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.framing import (
    SIZE,
    FrameError,
    Request,
    RequestPrefix,
    decode_request,
    encode_response,
    read_prefix,
)
from pykbroker.security.principal import USER_TYPE, KafkaPrincipal
from pykbroker.server.error_answers import build
from pykbroker.server.handlers.api_versions import valid_request as valid_api_versions_request
from pykbroker.security.sasl import (
    IllegalSaslState,
    SaslAuthenticationFailed,
    SaslServer,
    SaslServerFactory,
    build_listener_mechanisms,
    loggable,
    max_receive_size,
)

log = logging.getLogger(__name__)

SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36
CONNECTIONS_MAX_REAUTH_MS = "connections.max.reauth.ms"
FAILED_AUTHENTICATION_DELAY_MS = "connection.failed.authentication.delay.ms"
MIN_REAUTH_INTERVAL_S = 1.0  # KafkaChannel.MIN_REAUTH_INTERVAL_ONE_SECOND_NANOS

INITIAL_REQUEST = "INITIAL_REQUEST"
HANDSHAKE_OR_VERSIONS_REQUEST = "HANDSHAKE_OR_VERSIONS_REQUEST"
HANDSHAKE_REQUEST = "HANDSHAKE_REQUEST"
AUTHENTICATE = "AUTHENTICATE"
COMPLETE = "COMPLETE"
FAILED = "FAILED"
REAUTH_PROCESS_HANDSHAKE = "REAUTH_PROCESS_HANDSHAKE"
REAUTH_BAD_MECHANISM = "REAUTH_BAD_MECHANISM"



def _api_name(api_key: int) -> str | None:
    """Kafka's ApiKeys name of an API key (METADATA, DESCRIBE_ACLS), or None for a key Kafka does not know."""
    name = api_key_map.get(api_key)
    if name is not None:
        return name.upper()
    support = SUPPORTED_APIS.get(api_key)  # the inter-broker APIs kio has no schema of
    return None if support is None else re.sub(r"(?<=[a-z])(?=[A-Z])", "_", support.name).upper()


@dataclass(frozen=True)
class SaslListener:
    """One SASL listener's configuration, built once at start (``from_configs`` raises SaslConfigError or
    jaas.JaasConfigError for what Kafka refuses at start)."""

    name: str
    factories: Mapping[str, SaslServerFactory] = field(repr=False)  # (configured from JAAS strings: never shown)
    max_receive_size: int
    reauth_ms: Mapping[str, int]  # mechanism -> connections.max.reauth.ms (0: no session expiry from config)
    failed_delay_ms: int

    @classmethod
    def from_configs(cls, listener: str, configs: Mapping[str, Any], **kwargs: Any) -> "SaslListener":
        from pykbroker.config import Password
        from pykbroker.security.jaas import listener_mechanism_config

        # JAAS strings are password configs (hidden in the broker's config): the mechanisms read the text.
        configs = {name: value.value if isinstance(value, Password) else value for name, value in configs.items()}
        factories = build_listener_mechanisms(listener, configs, **kwargs)
        reauth = {}
        for mechanism in factories:
            value = listener_mechanism_config(configs, listener, mechanism, CONNECTIONS_MAX_REAUTH_MS, 0)
            reauth[mechanism] = int(value)
        delay = configs.get(FAILED_AUTHENTICATION_DELAY_MS)
        return cls(listener, factories, max_receive_size(configs, listener), reauth, int(100 if delay is None else delay))

    @property
    def enabled(self) -> list[str]:
        """The enabled mechanisms in the order SaslHandshake answers them: Kafka's SaslServerAuthenticator keeps
        ``new ArrayList<>(new HashSet<>(enabledMechanisms))``, i.e. java.util.HashSet's iteration order."""
        return java_hash_set_order(list(self.factories))


def _java_string_hash(text: str) -> int:
    value = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():  # String.hashCode over UTF-16 code units
        value = (31 * value + int(unit, 16)) & 0xFFFFFFFF
    return value


def java_hash_set_order(names: list[str]) -> list[str]:
    """The iteration order of ``new HashSet<>(names)`` in Java: by bucket of the spread String hash in a table of
    at least 16 slots (more than size / 0.75), insertion order within a bucket."""
    wanted = max(int(len(names) / 0.75) + 1, 16)  # HashSet(Collection)'s initial capacity, a power of two up
    slots = 1 << (wanted - 1).bit_length()
    buckets: dict[int, list[str]] = {}
    for name in dict.fromkeys(names):
        code = _java_string_hash(name)
        buckets.setdefault((code ^ (code >> 16)) & (slots - 1), []).append(name)
    return [name for slot in sorted(buckets) for name in buckets[slot]]


@dataclass
class Step:
    """What the connection does with one frame. At most one of ``serve``, ``close`` and ``failure`` is set.

    reply:    a whole response frame to send (with ``failure``: only after the delay);
    serve:    handle the frame as an ordinary request (ApiVersions before the handshake);
    close:    close the connection now, without an answer; the text is for the log line;
    failure:  the authentication failed: after the delay send ``reply`` (if any), then close. ``failure`` is
              the exception message Kafka logs at INFO ("Failed authentication with ..."), ``detail`` what
              only the DEBUG line shows (a user name, say); ``reauthentication`` words the line. Log texts
              never hold a secret and have their control characters escaped (``loggable``);
    principal: set when the exchange just completed successfully.
    """

    reply: bytes | None = None
    serve: bool = False
    close: str | None = None
    failure: str | None = None
    detail: str = ""
    reauthentication: bool = False
    principal: KafkaPrincipal | None = None


SERVE = Step(serve=True)


def _frame(pieces: list) -> bytes:
    return b"".join(bytes(piece) for piece in pieces)


def _raw_frame(token: bytes) -> bytes:
    return SIZE.pack(len(token)) + token


@dataclass
class SaslAuthenticator:
    """The SASL state of one connection of a SASL listener (see the module docstring)."""

    listener: SaslListener
    apis: Mapping[int, Any]
    clock: Callable[[], float] = time.monotonic  # for session expiry and the re-authentication interval
    wall_clock_ms: Callable[[], int] = field(default=lambda: int(time.time() * 1000))
    state: str = INITIAL_REQUEST
    mechanism: str | None = None
    principal: KafkaPrincipal | None = None
    session_expires: float | None = None  # clock() value after which the session is over, or None
    _server: SaslServer | None = field(default=None, repr=False)
    _headers: bool = False  # SaslHandshake v1+: tokens in SaslAuthenticate requests
    _previous_mechanism: str | None = None  # while re-authenticating
    _previous_principal: KafkaPrincipal | None = None
    _bad_mechanism_message: str = ""
    _last_reauth_start: float | None = None

    # -- what the connection asks -------------------------------------------------------------------
    @property
    def authenticating(self) -> bool:
        return self.state != COMPLETE

    @property
    def reauthenticating(self) -> bool:
        return self._previous_mechanism is not None

    def _text(self) -> str:
        return "re-authentication" if self.reauthenticating else "authentication"

    def frame_too_large(self, size: int) -> bool:
        """While authenticating, frames are bounded by sasl.server.max.receive.size (Kafka's NetworkReceive)."""
        return size < 0 or size > self.listener.max_receive_size

    def oversized(self, size: int) -> Step:
        return self._fail("Failing SASL authentication due to invalid receive size",
                          detail=f"{size} bytes, sasl.server.max.receive.size {self.listener.max_receive_size}")

    def screen(self, frame: bytes) -> Step:
        """An authenticated connection's frame: a SaslHandshake that begins re-authentication is taken here,
        a request on an expired session closes the connection, anything else is served."""
        now = self.clock()
        try:
            prefix = read_prefix(frame)
        except FrameError:
            return SERVE  # the connection refuses it as usual
        api_key = prefix.api_key
        if api_key == SASL_HANDSHAKE_KEY and self._begin_reauthentication(now):
            return self._kafka_request(frame, prefix)
        if self.session_expires is not None and now > self.session_expires:
            return self._close(f"SASL session expired (connections.max.reauth.ms or credential lifetime) and the "
                              f"client sent {_api_name(api_key) or f'api key {api_key}'} instead of re-authenticating")
        return SERVE

    def _begin_reauthentication(self, now: float) -> bool:
        if self.session_expires is None:
            return False  # re-authentication is off: the handshake is served (ILLEGAL_SASL_STATE)
        if self._last_reauth_start is not None and now - self._last_reauth_start < MIN_REAUTH_INTERVAL_S:
            return False
        self._last_reauth_start = now
        self._previous_mechanism = self.mechanism
        self._previous_principal = self.principal
        self._server = None
        self.state = REAUTH_PROCESS_HANDSHAKE
        log.debug("beginning SASL re-authentication of %s", self.principal)
        return True

    # -- one frame while authenticating ---------------------------------------------------------------
    def receive(self, frame: bytes) -> Step:
        state = self.state
        if state in (INITIAL_REQUEST, HANDSHAKE_OR_VERSIONS_REQUEST, HANDSHAKE_REQUEST, REAUTH_PROCESS_HANDSHAKE):
            return self._kafka_request(frame)
        if state == REAUTH_BAD_MECHANISM:
            return self._fail(self._bad_mechanism_message)
        if state == AUTHENTICATE:
            return self._token(frame) if self._headers else self._raw_token(frame)
        return self._close(f"frame received in SASL state {state}")

    def _kafka_request(self, frame: bytes, prefix: RequestPrefix | None = None) -> Step:
        initial = self.state == INITIAL_REQUEST
        try:
            prefix = prefix or read_prefix(frame)
            name = _api_name(prefix.api_key)
            if name is None:
                raise FrameError(f"unknown api key {prefix.api_key}")
        except FrameError as exc:
            return self._not_a_request(initial, str(exc))
        if self.state == INITIAL_REQUEST:  # a Kafka request header: no GSSAPI token of a 0.9 client
            self.state = HANDSHAKE_OR_VERSIONS_REQUEST
        if prefix.api_key not in (API_VERSIONS_KEY, SASL_HANDSHAKE_KEY):
            return self._fail(f"Unexpected Kafka request of type {name} during SASL handshake.")
        if prefix.api_key == API_VERSIONS_KEY:
            if self.state != HANDSHAKE_OR_VERSIONS_REQUEST:
                return self._close(f"Unexpected ApiVersions request received during SASL authentication state "
                                  f"{self.state}")
            # Served by the handler; only a supported (else KIP-511's UNSUPPORTED_VERSION) and valid (else
            # INVALID_REQUEST) ApiVersions moves on to HANDSHAKE_REQUEST, as Kafka's authenticator.
            support = self.apis.get(API_VERSIONS_KEY)
            if support is not None and support.supports(prefix.api_version):
                try:
                    request = decode_request(frame, prefix, self.apis)
                except FrameError:
                    return SERVE  # the connection refuses it as usual
                if valid_api_versions_request(request.api_version, request.body):
                    self.state = HANDSHAKE_REQUEST
            return SERVE
        try:
            request = decode_request(frame, prefix, self.apis)
        except FrameError as exc:
            return self._close(f"cannot decode a SaslHandshake: {exc}")
        mechanism = request.body.mechanism
        self._headers = request.api_version >= 1
        enabled = self.listener.enabled
        if mechanism not in self.listener.factories:
            log.debug("SASL mechanism '%s' requested by client is not supported", loggable(mechanism))
            reply = self._response(request, error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=tuple(enabled))
            return self._fail(f"Unsupported SASL mechanism {mechanism}", reply)
        reply = self._response(request, error_code=ErrorCode.none, mechanisms=tuple(enabled))
        if self.reauthenticating and mechanism != self._previous_mechanism:
            self._bad_mechanism_message = (f"SASL mechanism '{mechanism}' requested by client is not supported for "
                                           f"re-authentication of mechanism '{self._previous_mechanism}'")
            self.state = REAUTH_BAD_MECHANISM
            return Step(reply=reply)
        self.mechanism = mechanism
        self._server = self.listener.factories[mechanism].new_server()
        self.state = AUTHENTICATE
        return Step(reply=reply)

    def _not_a_request(self, initial: bool, reason: str) -> Step:
        """Bytes without a Kafka request header. First on the connection: Kafka 3.7.1 would take them for a 0.9
        client's GSSAPI token, which is never enabled here (an authentication failure); later: closed at once."""
        if initial:
            return self._fail("Exception handling first SASL packet from client, GSSAPI is not supported by server",
                              detail=reason)
        return self._close(f"not a Kafka request during SASL {self._text()}: {reason}")

    def _token(self, frame: bytes) -> Step:
        try:
            prefix = read_prefix(frame)
            request = decode_request(frame, prefix, self.apis)
        except FrameError as exc:
            return self._close(f"cannot decode a request during SASL {self._text()}: {exc}")
        if request.api_key != SASL_AUTHENTICATE_KEY:  # answered ILLEGAL_SASL_STATE (after the delay), as Kafka
            name = _api_name(request.api_key)
            try:
                answer = build(request.codec.response_type, request.body, ErrorCode.illegal_sasl_state)
                reply = _frame(encode_response(request.codec, request.correlation_id, answer))
            except Exception:  # an answer the schema cannot hold: closed without one
                reply = None
            return self._fail(f"Unexpected Kafka request of type {name} during SASL authentication.", reply)
        server = self._server
        try:
            token = server.evaluate(request.body.auth_bytes)
            if server.complete:
                principal = self._principal()
                lifetime_ms = self._complete(principal)
            else:
                lifetime_ms = 0
        except SaslAuthenticationFailed as exc:
            message = exc.client_message(self.reauthenticating)
            reply = self._response(request, error_code=ErrorCode.sasl_authentication_failed, error_message=message,
                                   auth_bytes=b"", session_lifetime=0)
            return self._fail(message, reply, exc.detail)
        except IllegalSaslState as exc:
            return self._fail(str(exc))
        reply = self._response(request, error_code=ErrorCode.none, error_message="", auth_bytes=token,
                               session_lifetime=lifetime_ms)
        return Step(reply=reply, principal=self.principal if server.complete else None)

    def _raw_token(self, frame: bytes) -> Step:
        server = self._server
        try:
            token = server.evaluate(frame)
            if server.complete:
                self._complete(self._principal())
        except SaslAuthenticationFailed as exc:
            return self._fail(exc.client_message(self.reauthenticating), None, exc.detail)
        except IllegalSaslState as exc:
            return self._fail(str(exc))
        return Step(reply=_raw_frame(token), principal=self.principal if server.complete else None)

    def _principal(self) -> KafkaPrincipal:
        principal = KafkaPrincipal(USER_TYPE, self._server.authorized_id)
        previous = self._previous_principal
        if previous is not None and previous != principal:
            raise SaslAuthenticationFailed(
                f"Cannot change principals during re-authentication from {previous.principal_type}.{previous.name}: "
                f"{principal.principal_type}.{principal.name}")
        return principal

    def _complete(self, principal: KafkaPrincipal) -> int:
        """The exchange succeeded: the session lifetime to send (Kafka's
        ReauthInfo.calcCompletionTimesAndReturnSessionLifetimeMs)."""
        server = self._server
        expiry_ms = server.credential_expiry_ms
        max_reauth_ms = self.listener.reauth_ms.get(self.mechanism or "", 0)
        lifetime_ms = 0
        expires = None
        if expiry_ms is not None or max_reauth_ms > 0:
            if expiry_ms is None:
                lifetime_ms = max(0, max_reauth_ms)
            elif max_reauth_ms <= 0:
                lifetime_ms = max(0, expiry_ms - self.wall_clock_ms())
            else:
                lifetime_ms = max(0, min(expiry_ms - self.wall_clock_ms(), max_reauth_ms))
            expires = self.clock() + lifetime_ms / 1000
        log.debug("SASL/%s %s of %s complete; session lifetime %s ms", self.mechanism, self._text(), principal,
                  lifetime_ms if expires is not None else "unbounded")
        self.principal = principal
        self.session_expires = expires
        self.state = COMPLETE
        self._previous_mechanism = None
        self._previous_principal = None
        return lifetime_ms

    def _fail(self, message: str, reply: bytes | None = None, detail: str = "") -> Step:
        reauthentication = self.reauthenticating
        self.state = FAILED
        self._server = None
        return Step(reply=reply, failure=loggable(message), detail=loggable(detail), reauthentication=reauthentication)

    @staticmethod
    def _close(reason: str) -> Step:
        return Step(close=loggable(reason))

    def _response(self, request: Request, **values: Any) -> bytes:
        cls = request.codec.response_type
        names = {name for name in cls.__dataclass_fields__ if not name.startswith("__")}
        kwargs = {name: value for name, value in values.items() if name in names}
        if "session_lifetime" in kwargs:
            import datetime

            kwargs["session_lifetime"] = datetime.timedelta(milliseconds=kwargs["session_lifetime"])
        return _frame(encode_response(request.codec, request.correlation_id, cls(**kwargs)))

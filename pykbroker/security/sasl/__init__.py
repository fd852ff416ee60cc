"""Server-side SASL mechanisms, one state machine per authentication, as Kafka 3.7's SaslServers behave.

Wiring (what the connection does; Kafka's SaslServerAuthenticator is the model)::

    factories = build_listener_mechanisms("SASL_PLAINTEXT", configs, credentials=cache)   # at startup
    # SaslHandshake(mechanism): unknown or not enabled -> UNSUPPORTED_SASL_MECHANISM (33) with the
    # enabled list (see UnsupportedSaslMechanism / lookup_factory), else:
    server = factories["SCRAM-SHA-256"].new_server()
    # each SaslAuthenticate(auth_bytes) (or each size-prefixed token for KIP-43 clients without headers):
    try:
        reply = server.evaluate(auth_bytes)       # bytes to send back (b"" when there is nothing)
    except SaslAuthenticationFailed as e:         # answer error 58 with e.client_message(reauth), then close
        ...
    except IllegalSaslState:                      # Kafka sends nothing and closes the connection
        ...
    if server.complete:
        principal = server.authorized_id          # "User:" + this is the KafkaPrincipal
        lifetime = server.credential_expiry_ms    # None, or the token's expiry (KIP-368 session lifetime)

``evaluate`` never raises anything else: malformed bytes, non-UTF-8, oversized tokens (more than
``sasl.server.max.receive.size``, default 524288 bytes) and internal surprises all become
``SaslAuthenticationFailed``. Messages follow Kafka: a mechanism's ``SaslAuthenticationException`` text goes to
the client as is ("Authentication failed: Invalid username or password"), a ``SaslException`` becomes the
generic "Authentication failed during authentication due to invalid credentials with SASL mechanism
SCRAM-SHA-256" (``client_message(reauthenticating=True)`` says "re-authentication"), and ``detail`` carries
the reason for the broker's debug log. Neither ever contains a password, token, salted password or proof.

Mechanisms: PLAIN (``plain``), SCRAM-SHA-256 and SCRAM-SHA-512 (``scram``, credentials from
``pykbroker.security.credentials``), OAUTHBEARER (``oauthbearer``: Kafka's unsecured JWS validator by default,
the signed-JWT validator when ``sasl.server.callback.handler.class`` names Kafka's
OAuthBearerValidatorCallbackHandler). GSSAPI (Kerberos) is not implemented: a listener enabling it is refused
at startup by ``build_listener_mechanisms``.

Cost: ``evaluate`` is cheap enough for the event loop (SCRAM keeps derived keys, so an exchange is a few HMACs;
an RS256 check is tens of microseconds; the JWKS file is read at startup). The wiring is ``authenticator.py``
(one SaslAuthenticator per connection of a SASL listener, Kafka's SaslServerAuthenticator): the framing,
``connection.failed.authentication.delay.ms`` (applied by server/connection.py), the session lifetime and the
re-authentication rules (same mechanism, same principal: KIP-368). Not wired yet: the principal's
``tokenAuthenticated`` flag (``token_authenticated``; KafkaPrincipal has none yet, delegation tokens are not
served), and bounding how many tokens one connection may try (Kafka lets an OAUTHBEARER client send a new token
after each JSON error).
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable, Mapping

from pykbroker.config import listener_prefix
from pykbroker.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

SASL_ENABLED_MECHANISMS = "sasl.enabled.mechanisms"
SASL_SERVER_MAX_RECEIVE_SIZE = "sasl.server.max.receive.size"
SASL_SERVER_CALLBACK_HANDLER_CLASS = "sasl.server.callback.handler.class"
DEFAULT_SASL_SERVER_MAX_RECEIVE_SIZE = 524288
DEFAULT_SASL_ENABLED_MECHANISMS = ("GSSAPI",)  # Kafka's default, which pykbroker cannot serve


class SaslError(Exception):
    """Base of the errors an exchange ends with; ``error_code`` is Kafka's."""

    error_code = ErrorCode.sasl_authentication_failed


class SaslAuthenticationFailed(SaslError):
    """The exchange failed (Kafka's SASL_AUTHENTICATION_FAILED, 58).

    ``message`` is the text Kafka sends the client (a SaslAuthenticationException's message), or None when
    Kafka sends its generic text (the mechanism raised a plain SaslException); ``detail`` is for the
    broker's log only. Neither ever holds a secret."""

    error_code = ErrorCode.sasl_authentication_failed

    def __init__(self, message: str | None, detail: str = "", *, mechanism: str = ""):
        self.message = message
        self.detail = detail
        self.mechanism = mechanism
        super().__init__(message, detail)

    def __str__(self) -> str:  # the client text and the log detail, with the mechanism known by now
        return self.client_message() + (f" ({self.detail})" if self.detail else "")

    def client_message(self, reauthenticating: bool = False) -> str:
        if self.message is not None:
            return self.message
        what = "re-authentication" if reauthenticating else "authentication"
        return f"Authentication failed during {what} due to invalid credentials with SASL mechanism {self.mechanism}"


_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def loggable(text: object) -> str:
    """``text`` with its control characters escaped (a newline becomes ``\\n``), for anything a client sent
    that reaches a log line: a user name, mechanism or claim holding a newline cannot forge another line."""
    return _CONTROL_CHARACTERS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


class IllegalSaslState(SaslError):
    """A token arrived when the state machine expects none (Kafka's IllegalSaslStateException, 34): Kafka
    answers nothing and closes the connection. Also raised for asking an unfinished exchange its result."""

    error_code = ErrorCode.illegal_sasl_state


class UnsupportedSaslMechanism(SaslError):
    """SaslHandshake named a mechanism that is not enabled on the listener (33): Kafka answers the handshake
    with this code and the enabled mechanisms, then closes the connection."""

    error_code = ErrorCode.unsupported_sasl_mechanism

    def __init__(self, mechanism: str, enabled: list[str]):
        self.mechanism = mechanism
        self.enabled = list(enabled)
        super().__init__(f"Unsupported SASL mechanism {mechanism}")


class SaslConfigError(ValueError):
    """A broker configuration that cannot serve SASL (startup error, names the setting)."""


class SaslServer:
    """One authentication exchange on one connection. Subclasses implement ``_evaluate`` and set
    ``_authorized_id`` / ``_complete``; this class owns the state checks, the size bound and the rule that
    nothing but SaslAuthenticationFailed / IllegalSaslState escapes."""

    mechanism = ""

    def __init__(self, *, max_receive_size: int = DEFAULT_SASL_SERVER_MAX_RECEIVE_SIZE):
        self.max_receive_size = max_receive_size
        self._complete = False
        self._failed = False
        self._authorized_id: str | None = None
        self._expiry_ms: int | None = None
        self._extensions: dict[str, str] = {}
        self._token_authenticated = False

    # --- the interface the connection uses ---------------------------------------------------------
    def evaluate(self, client_bytes: bytes) -> bytes:
        """The server's answer to one client token; raises SaslAuthenticationFailed or IllegalSaslState."""
        if self._complete or self._failed:
            state = "COMPLETE" if self._complete else "FAILED"
            raise IllegalSaslState(f"Unexpected challenge in Sasl server state {state}")
        try:
            if not isinstance(client_bytes, (bytes, bytearray, memoryview)):
                raise SaslAuthenticationFailed(None, f"auth bytes of type {type(client_bytes).__name__}")
            if len(client_bytes) > self.max_receive_size:
                raise SaslAuthenticationFailed("Failing SASL authentication due to invalid receive size",
                                               f"{len(client_bytes)} bytes > {self.max_receive_size}")
            return self._evaluate(bytes(client_bytes))
        except SaslAuthenticationFailed as e:
            self._fail()
            e.mechanism = self.mechanism
            log.debug("SASL/%s authentication failed: %s", self.mechanism, loggable(e))
            raise
        except IllegalSaslState:
            self._fail()
            raise
        except Exception as e:  # a bug or an input no rule foresaw: still only an authentication failure
            self._fail()
            log.debug("SASL/%s authentication failed on an unexpected %s", self.mechanism, type(e).__name__)
            raise SaslAuthenticationFailed(None, f"unexpected {type(e).__name__}", mechanism=self.mechanism) from None

    @property
    def complete(self) -> bool:
        return self._complete

    @property
    def authorized_id(self) -> str:
        """The authenticated name (the principal is ``User:<name>``)."""
        if not self._complete:
            raise IllegalSaslState("Authentication exchange has not completed")
        return self._authorized_id or ""

    @property
    def credential_expiry_ms(self) -> int | None:
        """When the credential used expires (epoch ms: an OAuth token's exp, a delegation token's expiry),
        or None (Kafka's CREDENTIAL_LIFETIME_MS negotiated property, for KIP-368's session lifetime)."""
        if not self._complete:
            raise IllegalSaslState("Authentication exchange has not completed")
        return self._expiry_ms

    @property
    def extensions(self) -> dict[str, str]:
        """The validated SASL extensions (OAUTHBEARER extensions; SCRAM's tokenauth)."""
        if not self._complete:
            raise IllegalSaslState("Authentication exchange has not completed")
        return dict(self._extensions)

    @property
    def token_authenticated(self) -> bool:
        """True when SCRAM authenticated a delegation token (Kafka marks the principal tokenAuthenticated)."""
        return self._complete and self._token_authenticated

    # --- for subclasses ------------------------------------------------------------------------------
    def _evaluate(self, client_bytes: bytes) -> bytes:  # pragma: no cover - abstract
        raise NotImplementedError

    def _succeed(self, authorized_id: str) -> None:
        self._authorized_id = authorized_id
        self._complete = True

    def _fail(self) -> None:
        self._failed = True
        self._clear()

    def _clear(self) -> None:
        """Drop per-exchange secrets (subclasses extend)."""


class SaslServerFactory:
    """Makes a SaslServer per connection for one mechanism on one listener (configured once)."""

    mechanism = ""

    def new_server(self) -> SaslServer:  # pragma: no cover - abstract
        raise NotImplementedError


def mechanism_names() -> list[str]:
    """The mechanisms pykbroker can serve."""
    return ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]


def _list_setting(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v).strip() for v in value if str(v).strip()]


def enabled_mechanisms(listener: str, configs: Mapping[str, Any]) -> list[str]:
    """``sasl.enabled.mechanisms`` for the listener (``listener.name.<l>.sasl.enabled.mechanisms`` wins),
    Kafka's default GSSAPI when unset."""
    value = configs.get(f"{listener_prefix(listener)}{SASL_ENABLED_MECHANISMS}")
    if value is None:
        value = configs.get(SASL_ENABLED_MECHANISMS)
    names = _list_setting(value)
    return names if value is not None else list(DEFAULT_SASL_ENABLED_MECHANISMS)


def max_receive_size(configs: Mapping[str, Any], listener: str | None = None) -> int:
    """``sasl.server.max.receive.size`` of a listener: ``listener.name.<l>.sasl.server.max.receive.size`` wins,
    as Kafka's ChannelBuilders.channelBuilderConfigs applies the listener prefix."""
    value = configs.get(f"{listener_prefix(listener)}{SASL_SERVER_MAX_RECEIVE_SIZE}") if listener else None
    if value is None:
        value = configs.get(SASL_SERVER_MAX_RECEIVE_SIZE, DEFAULT_SASL_SERVER_MAX_RECEIVE_SIZE)
    try:
        size = int(value)
    except (TypeError, ValueError):
        raise SaslConfigError(f"Invalid value {value} for configuration {SASL_SERVER_MAX_RECEIVE_SIZE}: "
                              f"Not a number of type INT") from None
    if size < 1:
        raise SaslConfigError(f"Invalid value {value} for configuration {SASL_SERVER_MAX_RECEIVE_SIZE}")
    return size


def create_factory(listener: str, mechanism: str, configs: Mapping[str, Any], *,
                   credentials: Any = None, delegation_tokens: Callable[[str], Any] | None = None,
                   clock: Callable[[], float] | None = None) -> SaslServerFactory:
    """The factory for one mechanism on one listener, configured from the broker's properties (its JAAS
    string, callback handler class and ``sasl.oauthbearer.*``). ``credentials``: a
    ``credentials.ScramCredentialCache`` (SCRAM); ``delegation_tokens``: token id -> (owner, credential,
    expiry ms) or None (SCRAM with ``tokenauth=true``); ``clock``: seconds since the epoch (OAUTHBEARER).
    Raises SaslConfigError (or jaas.JaasConfigError) for what Kafka would refuse at startup."""
    from pykbroker.security import jaas
    from pykbroker.security.sasl import oauthbearer, plain, scram

    size = max_receive_size(configs, listener)
    # SaslChannelBuilder reads only the listener- and mechanism-prefixed key; a bare one is ignored
    handler = configs.get(f"{listener_prefix(listener)}{mechanism.lower()}.{SASL_SERVER_CALLBACK_HANDLER_CLASS}")
    if mechanism == "PLAIN":
        _refuse_handler(handler, mechanism, plain.KAFKA_CALLBACK_HANDLERS)
        entry = jaas.server_jaas_entry(listener, mechanism, configs)
        return plain.PlainServerFactory([entry], max_receive_size=size)
    if mechanism in scram.MECHANISMS:
        _refuse_handler(handler, mechanism, scram.KAFKA_CALLBACK_HANDLERS)
        jaas.server_jaas_entry(listener, mechanism, configs)  # Kafka requires it even though SCRAM reads none
        if credentials is None:
            raise SaslConfigError(f"SASL mechanism {mechanism} needs a SCRAM credential store")
        return scram.ScramServerFactory(mechanism, credentials, delegation_tokens=delegation_tokens,
                                        max_receive_size=size)
    if mechanism == "OAUTHBEARER":
        entry = jaas.server_jaas_entry(listener, mechanism, configs)
        return oauthbearer.server_factory(listener, entry, configs, handler, clock=clock, max_receive_size=size)
    raise SaslConfigError(f"SASL mechanism {mechanism} is not supported by pykbroker "
                          f"(supported: {', '.join(mechanism_names())})")


def _refuse_handler(handler: Any, mechanism: str, kafkas: frozenset[str]) -> None:
    if handler is not None and str(handler).strip() not in kafkas:
        raise SaslConfigError(f"{SASL_SERVER_CALLBACK_HANDLER_CLASS}={handler} for {mechanism}: pykbroker "
                              f"cannot load Java callback handlers (Kafka's own: {', '.join(sorted(kafkas))})")


def build_listener_mechanisms(listener: str, configs: Mapping[str, Any], **kwargs: Any) -> dict[str, SaslServerFactory]:
    """A factory for each of the listener's enabled mechanisms, in ``sasl.enabled.mechanisms`` order
    (keyword arguments as ``create_factory``)."""
    names = enabled_mechanisms(listener, configs)
    if not names:
        raise SaslConfigError(f"{SASL_ENABLED_MECHANISMS} is empty for listener {listener}")
    return {name: create_factory(listener, name, configs, **kwargs) for name in names}


def lookup_factory(factories: Mapping[str, SaslServerFactory], mechanism: str) -> SaslServerFactory:
    """SaslHandshake: the factory for the requested mechanism (case-sensitive, as Kafka), else
    UnsupportedSaslMechanism carrying the enabled list for the response."""
    factory = factories.get(mechanism) if isinstance(mechanism, str) else None
    if factory is None:
        raise UnsupportedSaslMechanism(str(mechanism), list(factories))
    return factory

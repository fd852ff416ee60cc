"""SASL/PLAIN (RFC 4616) as Kafka 3.7's PlainSaslServer and PlainServerCallbackHandler serve it.

The client sends ``[authzid] NUL authcid NUL passwd`` once; the server answers ``b""`` and is complete, or
fails with Kafka's messages (all sent to the client as they are):

- not exactly three NUL-separated tokens: "Invalid SASL/PLAIN response: expected 3 tokens, got N";
- empty user / password: "Authentication failed: username not specified" / "... password not specified";
- unknown user or wrong password: "Authentication failed: Invalid username or password";
- an authzid that is neither empty nor the user: "Authentication failed: Client requested an authorization
  id that is different from username".

Users are the ``user_<name>="<password>"`` options of the listener's PlainLoginModule JAAS entry (only
PlainLoginModule entries count, as in Kafka); passwords are compared in constant time, also for unknown
users. Kafka decodes the bytes as UTF-8 with replacement characters; pykbroker refuses bytes that are not
UTF-8 instead ("Invalid SASL/PLAIN response: not valid UTF-8"), so that two different byte strings can never
match the same password.
"""

from __future__ import annotations

import hmac
from typing import Callable, Iterable

from pykbroker.security.jaas import PLAIN_LOGIN_MODULE, LoginModuleEntry
from pykbroker.security.sasl import DEFAULT_SASL_SERVER_MAX_RECEIVE_SIZE, SaslAuthenticationFailed, SaslServer, SaslServerFactory

MECHANISM = "PLAIN"
JAAS_USER_PREFIX = "user_"
KAFKA_CALLBACK_HANDLERS = frozenset({"org.apache.kafka.common.security.plain.internals.PlainServerCallbackHandler"})

# Compared against when the user is unknown, so that the time does not say whether a user exists.
_NO_PASSWORD = b"\x00" * 32


def jaas_users(entries: Iterable[LoginModuleEntry]) -> dict[str, bytes]:
    """user -> UTF-8 password from ``user_<name>`` options of PlainLoginModule entries (first one wins,
    as JaasContext.configEntryOption)."""
    users: dict[str, bytes] = {}
    for entry in entries:
        if entry.login_module != PLAIN_LOGIN_MODULE:
            continue
        for key, value in entry.options.items():
            if key.startswith(JAAS_USER_PREFIX):
                users.setdefault(key[len(JAAS_USER_PREFIX):], value.encode("utf-8"))
    return users


class PlainServerFactory(SaslServerFactory):
    mechanism = MECHANISM

    def __init__(self, entries: Iterable[LoginModuleEntry] = (), *,
                 authenticate: Callable[[str, str], bool] | None = None,
                 max_receive_size: int = DEFAULT_SASL_SERVER_MAX_RECEIVE_SIZE):
        """Users from the JAAS entries, or ``authenticate(user, password) -> bool`` instead (the role of a
        custom ``sasl.server.callback.handler.class``; it must compare in constant time itself)."""
        self._users = jaas_users(entries)
        self._authenticate = authenticate
        self.max_receive_size = max_receive_size

    def check(self, username: str, password: str) -> bool:
        if self._authenticate is not None:
            return bool(self._authenticate(username, password))
        expected = self._users.get(username)
        given = password.encode("utf-8")
        ok = hmac.compare_digest(given, expected if expected is not None else _NO_PASSWORD)
        return ok and expected is not None

    def new_server(self) -> "PlainServer":
        return PlainServer(self)


class PlainServer(SaslServer):
    mechanism = MECHANISM

    def __init__(self, factory: PlainServerFactory):
        super().__init__(max_receive_size=factory.max_receive_size)
        self._factory = factory

    def _evaluate(self, client_bytes: bytes) -> bytes:
        try:
            response = client_bytes.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslAuthenticationFailed("Invalid SASL/PLAIN response: not valid UTF-8") from None
        tokens = response.split("\x00", 3)
        if len(tokens) != 3:
            raise SaslAuthenticationFailed(f"Invalid SASL/PLAIN response: expected 3 tokens, got {min(len(tokens), 4)}")
        authzid, username, password = tokens
        if not username:
            raise SaslAuthenticationFailed("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationFailed("Authentication failed: password not specified")
        try:
            ok = self._factory.check(username, password)
        except Exception as e:
            raise SaslAuthenticationFailed("Authentication failed: credentials for user could not be verified",
                                           f"callback raised {type(e).__name__}") from None
        if not ok:
            raise SaslAuthenticationFailed("Authentication failed: Invalid username or password",
                                           f"user {username!r}")
        if authzid and authzid != username:
            raise SaslAuthenticationFailed(
                "Authentication failed: Client requested an authorization id that is different from username")
        self._succeed(username)
        return b""

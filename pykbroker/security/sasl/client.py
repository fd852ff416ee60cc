"""Client-side SASL for the broker's own client (inter-broker connections), as Kafka 3.7's PlainSaslClient and
ScramSaslClient speak it: the counterpart of this package's server state machines.

Credentials are the inter-broker listener's JAAS ``username`` / ``password`` options of the mechanism's login
module (``listener.name.<l>.<mechanism>.sasl.jaas.config``, the one the broker's server side reads too), as
Kafka's broker logs in with that same entry for its own client (:func:`inter_broker_credentials`).

Interface (the wiring drives it over SaslHandshake / SaslAuthenticate, protocol/client.py)::

    client = sasl_client("SCRAM-SHA-256", "admin", "admin-secret")
    token = client.first()                      # the first SaslAuthenticate bytes
    while not client.complete:
        token = client.evaluate(server_bytes)   # None when nothing more is sent (PLAIN, SCRAM's last step)

* PLAIN (RFC 4616): one message ``NUL user NUL password``, complete once sent (the server's empty answer
  is only read to see that it accepted).
* SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802 / 7677): client-first ``n,,n=<saslname>,r=<nonce>``; on the
  server-first the nonce must begin with ours and the iteration count be at least the mechanism's minimum
  (4096, as Kafka's ScramSaslClient checks) and at most its maximum (16384, the most a credential can have:
  Kafka's ScramMechanism; a check of our own, worded like Kafka's minimum); client-final with the proof; the server-final signature is
  checked in constant time before the exchange counts as complete (a server that does not know the
  password cannot pass). ``e=`` in the server-final is the server's refusal.

Every failure raises :class:`SaslClientError` with a message that never holds the password, the salted
password, a key or a proof.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from typing import Any, Mapping

from pykbroker.security import credentials as cred
from pykbroker.security.jaas import (
    PLAIN_LOGIN_MODULE, SCRAM_LOGIN_MODULE, JaasConfigError, config_entry_option, server_jaas_entry,
)
from pykbroker.security.sasl.scram import SERVER_FINAL, SERVER_FIRST, saslname_from_username

__all__ = ("SaslClientError", "SaslClient", "PlainClient", "ScramClient", "sasl_client", "inter_broker_credentials",
           "CLIENT_MECHANISMS")

CLIENT_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_LOGIN_MODULES = {"PLAIN": PLAIN_LOGIN_MODULE, "SCRAM-SHA-256": SCRAM_LOGIN_MODULE, "SCRAM-SHA-512": SCRAM_LOGIN_MODULE}


class SaslClientError(ValueError):
    """The exchange cannot go on (a malformed or refused server message, a server that failed its proof). A
    ValueError: what protocol/client.py, which drives the exchange without importing this package, catches."""


class SaslClient:
    mechanism = ""

    def __init__(self) -> None:
        self._complete = False

    @property
    def complete(self) -> bool:
        return self._complete

    def first(self) -> bytes:  # pragma: no cover - abstract
        raise NotImplementedError

    def evaluate(self, server_bytes: bytes) -> bytes | None:  # pragma: no cover - abstract
        raise NotImplementedError


class PlainClient(SaslClient):
    mechanism = "PLAIN"

    def __init__(self, username: str, password: str) -> None:
        super().__init__()
        if not username or not password:
            raise SaslClientError("SASL/PLAIN needs a username and a password")
        self._message = b"\x00" + username.encode("utf-8") + b"\x00" + password.encode("utf-8")

    def first(self) -> bytes:
        message, self._message = self._message, b""
        self._complete = True
        return message

    def evaluate(self, server_bytes: bytes) -> bytes | None:
        raise SaslClientError("SASL/PLAIN: unexpected challenge after the exchange completed")


class ScramClient(SaslClient):
    def __init__(self, mechanism: str, username: str, password: str, *, nonce: str | None = None) -> None:
        super().__init__()
        try:
            self._scram = cred.scram_mechanism(mechanism)
        except ValueError:
            raise SaslClientError(f"Unsupported SCRAM mechanism {mechanism}") from None
        if not username or not password:
            raise SaslClientError(f"SASL/{mechanism} needs a username and a password")
        self.mechanism = mechanism
        self._username = username
        self._password = password
        self._nonce = nonce or cred.secure_random_string()
        self._client_first_bare = f"n={saslname_from_username(username)},r={self._nonce}"
        self._state = "SEND_CLIENT_FIRST"
        self._server_signature: bytes | None = None

    def first(self) -> bytes:
        if self._state != "SEND_CLIENT_FIRST":
            raise SaslClientError(f"SASL/{self.mechanism}: the first message was sent already")
        self._state = "RECEIVE_SERVER_FIRST"
        return ("n,," + self._client_first_bare).encode("utf-8")

    def evaluate(self, server_bytes: bytes) -> bytes | None:
        if self._state == "RECEIVE_SERVER_FIRST":
            return self._server_first(bytes(server_bytes))
        if self._state == "RECEIVE_SERVER_FINAL":
            self._server_final(bytes(server_bytes))
            return None
        raise SaslClientError(f"SASL/{self.mechanism}: unexpected challenge in state {self._state}")

    def _fail(self, message: str) -> SaslClientError:
        self._state = "FAILED"
        self._password = ""
        self._server_signature = None
        return SaslClientError(f"SASL/{self.mechanism}: {message}")

    def _server_first(self, data: bytes) -> bytes:
        text = data.decode("utf-8", errors="replace")
        m = SERVER_FIRST.fullmatch(text)
        if m is None:
            raise self._fail("invalid server first message")
        nonce = m.group("nonce")
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise self._fail("Invalid server nonce: does not start with client nonce")
        iterations = int(m.group("iterations"))
        if iterations < self._scram.min_iterations:
            raise self._fail(f"Requested iterations {iterations} is less than the minimum "
                             f"{self._scram.min_iterations} for {self.mechanism}")
        if iterations > self._scram.max_iterations:
            # Kafka's client checks only the minimum; a credential of more iterations cannot be stored
            # (ScramMechanism's maximum), so a higher count is a rogue server's way to burn this broker's CPU.
            raise self._fail(f"Requested iterations {iterations} is more than the maximum "
                             f"{self._scram.max_iterations} for {self.mechanism}")
        try:
            salt = base64.b64decode(m.group("salt"), validate=True)
        except (binascii.Error, ValueError):
            raise self._fail("invalid salt in the server first message") from None
        salted = cred.salted_password(self._scram, self._password, salt, iterations)
        self._password = ""
        without_proof = f"c={base64.b64encode(b'n,,').decode('ascii')},r={nonce}"
        auth_message = ",".join((self._client_first_bare, text, without_proof)).encode("utf-8")
        client_key = cred.client_key(self._scram, salted)
        signature = cred.client_signature(self._scram, cred.stored_key(self._scram, client_key), auth_message)
        proof = cred.xor(client_key, signature)
        self._server_signature = cred.server_signature(self._scram, cred.server_key(self._scram, salted), auth_message)
        self._state = "RECEIVE_SERVER_FINAL"
        return f"{without_proof},p={base64.b64encode(proof).decode('ascii')}".encode("ascii")

    def _server_final(self, data: bytes) -> None:
        m = SERVER_FINAL.fullmatch(data.decode("utf-8", errors="replace"))
        if m is None:
            raise self._fail("invalid server final message")
        if m.group("error") is not None:
            raise self._fail(f"Sasl authentication using {self.mechanism} failed with error: {m.group('error')}")
        try:
            signature = base64.b64decode(m.group("signature"), validate=True)
        except (binascii.Error, ValueError):
            raise self._fail("invalid server signature") from None
        expected = self._server_signature or b""
        if not hmac.compare_digest(signature, expected):
            raise self._fail("Invalid server signature in server final message")
        self._server_signature = None
        self._state = "COMPLETE"
        self._complete = True


def sasl_client(mechanism: str, username: str, password: str) -> SaslClient:
    """A client state machine for one exchange."""
    if mechanism == "PLAIN":
        return PlainClient(username, password)
    if mechanism in cred.SCRAM_MECHANISMS:
        return ScramClient(mechanism, username, password)
    raise SaslClientError(f"SASL mechanism {mechanism} is not supported by the broker's own client "
                          f"(supported: {', '.join(CLIENT_MECHANISMS)})")


def inter_broker_credentials(listener: str, mechanism: str, configs: Mapping[str, Any]) -> tuple[str, str]:
    """(username, password) the broker authenticates with to other brokers: the ``username`` and ``password``
    options of the listener's JAAS entry for ``mechanism`` (its PlainLoginModule / ScramLoginModule, as
    Kafka's broker logs in). Raises SaslClientError naming the setting when they are missing."""
    if mechanism not in CLIENT_MECHANISMS:
        raise SaslClientError(f"sasl.mechanism.inter.broker.protocol={mechanism}: the broker's own client speaks "
                              f"{', '.join(CLIENT_MECHANISMS)}")
    from pykbroker.config import Password

    configs = {name: value.value if isinstance(value, Password) else value for name, value in configs.items()}
    try:
        entry = server_jaas_entry(listener, mechanism, configs)
    except JaasConfigError as exc:
        raise SaslClientError(str(exc)) from None
    username = config_entry_option([entry], "username", _LOGIN_MODULES[mechanism])
    password = config_entry_option([entry], "password", _LOGIN_MODULES[mechanism])
    if not username or not password:
        raise SaslClientError(f"the JAAS entry of listener {listener} for {mechanism} (listener.name."
                              f"{listener.lower()}.{mechanism.lower()}.sasl.jaas.config) needs username and password "
                              "options: the broker authenticates to other brokers with them")
    return username, password

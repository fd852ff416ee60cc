"""SASL/SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka 3.7's ScramSaslServer serves them.

Exchange (two client tokens)::

    client-first  n,[a=<authzid>],n=<saslname>,r=<client nonce>[,<ext>=<value>...]
    server-first  r=<client nonce><server nonce>,s=<base64 salt>,i=<iterations>
    client-final  c=<base64 gs2 header>,r=<same nonce>[,ext...],p=<base64 proof>
    server-final  v=<base64 server signature>

Rules (Kafka's message formats, ScramMessages; anything else fails):

- gs2 header ``n`` only: a client asking for channel binding (``y``/``p=``) is refused, as Kafka's pattern
  refuses it; the final message's ``c=`` must be that same header (RFC 5802 section 5.1; Kafka 3.7.1 does
  not look at it, every real client sends it).
- the final nonce must end with the server-first nonce, as Kafka 3.8 and 3.9 check it (``endsWith``; 3.7.1 does
  not look at it, and the proof, computed over the final message as sent, decides): older librdkafka (2.0.2,
  Debian's kcat 1.7.1) sends its client nonce twice before the server's, and Kafka 3.x serves it. A final nonce
  without the server's nonce at its end is refused, so a replayed exchange never passes.
- the proof is checked in constant time: ``H(ClientSignature XOR proof) == StoredKey``.
- a credential with fewer than 4096 iterations is refused (ScramMechanism.minIterations).
- extension ``tokenauth=true`` asks for a delegation token: the user name is the token id, the principal
  the token's owner, the session lifetime the token's expiry. pykbroker has no delegation tokens yet unless
  the wiring passes ``delegation_tokens``; without them every token id is unknown, which is what Kafka
  answers for an unknown token ("Token Authentication failed: Invalid tokenId", generic to the client).
  Other extensions are ignored, as Kafka ignores them.

Failures the client sees (Kafka's SaslServerAuthenticator): the generic "Authentication failed during
authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256" for everything (unknown user,
bad proof, bad format, bad nonce), except "Authentication failed: Client requested an authorization id that
is different from username". As in Kafka, an unknown user fails on the first message. (Kafka 3.7.1 lets a
proof of the wrong length escape as an IllegalArgumentException and closes the connection without an answer;
pykbroker answers the generic failure.) The debug detail never holds the proof or the final message.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
from typing import Any, Callable

from pykbroker.security import credentials as cred
from pykbroker.security.sasl import (
    DEFAULT_SASL_SERVER_MAX_RECEIVE_SIZE,
    SaslAuthenticationFailed,
    SaslServer,
    SaslServerFactory,
)

MECHANISMS = {name: m for name, m in cred.SCRAM_MECHANISMS.items()}
KAFKA_CALLBACK_HANDLERS = frozenset({"org.apache.kafka.common.security.scram.internals.ScramServerCallbackHandler"})
TOKEN_AUTH_EXTENSION = "tokenauth"

# ScramMessages' character classes, with Java's [a&&[^b]] spelled out
_VALUE_SAFE = r"[\x01-\x2b\x2d-\x3c\x3e-\x7f]"   # [\x01-\x7F] minus ',' and '='
_VALUE = r"[\x01-\x2b\x2d-\x7f]+"                  # [\x01-\x7F] minus ','
_PRINTABLE = r"[\x21-\x2b\x2d-\x7e]+"              # [\x21-\x7E] minus ','
_SASLNAME = rf"(?:{_VALUE_SAFE}|=2C|=3D)+"
_B64C = r"[a-zA-Z0-9/+]"
_BASE64 = rf"(?:{_B64C}{{4}})*(?:{_B64C}{{3}}=|{_B64C}{{2}}==)?"
_RESERVED = rf"(?:m={_VALUE},)?"
_EXTENSIONS = rf"(?:,[A-Za-z]+={_VALUE})*"

_CLIENT_FIRST = re.compile(
    rf"(?P<gs2>n,(?:a=(?P<authzid>{_SASLNAME}))?,)(?P<bare>{_RESERVED}n=(?P<saslname>{_SASLNAME}),"
    rf"r=(?P<nonce>{_PRINTABLE})(?P<extensions>{_EXTENSIONS}))", re.ASCII)
_CLIENT_FINAL = re.compile(
    rf"(?P<without_proof>c=(?P<channel>{_BASE64}),r=(?P<nonce>{_PRINTABLE}){_EXTENSIONS}),p=(?P<proof>{_BASE64})",
    re.ASCII)
# The server's messages, which the broker's own client reads (sasl/client.py), as ScramMessages parses them
SERVER_FIRST = re.compile(
    rf"{_RESERVED}r=(?P<nonce>{_PRINTABLE}),s=(?P<salt>{_BASE64}),i=(?P<iterations>[0-9]+){_EXTENSIONS}", re.ASCII)
SERVER_FINAL = re.compile(rf"(?:e=(?P<error>{_VALUE_SAFE}+))|(?:v=(?P<signature>{_BASE64}){_EXTENSIONS})", re.ASCII)


def username_from_saslname(saslname: str) -> str:
    """ScramFormatter.username: ``=2C`` is ',' and ``=3D`` is '='; any other '=' is invalid."""
    name = saslname.replace("=2C", ",")
    if "=" in name.replace("=3D", ""):
        raise ValueError("Invalid username")
    return name.replace("=3D", "=")


def saslname_from_username(username: str) -> str:
    return username.replace("=", "=3D").replace(",", "=2C")


def _parse_extensions(text: str) -> dict[str, str]:
    """Utils.parseMap(extensions, "=", ","): later keys win."""
    out: dict[str, str] = {}
    for item in text.split(","):
        if item:
            k, _, v = item.partition("=")
            out[k] = v
    return out


class ScramServerFactory(SaslServerFactory):
    def __init__(self, mechanism: str, credentials: Any, *,
                 delegation_tokens: Callable[[str], Any] | None = None,
                 max_receive_size: int = DEFAULT_SASL_SERVER_MAX_RECEIVE_SIZE,
                 server_nonce: Callable[[], str] = cred.secure_random_string):
        """``credentials``: anything with ``get(mechanism, user) -> ScramCredential | None`` (a
        credentials.ScramCredentialCache); ``delegation_tokens(token_id) -> (owner, ScramCredential,
        expiry_ms) | None``; ``server_nonce``: Kafka's 130-bit base-36 random string (fixed only to replay
        the RFC 7677 test vector)."""
        if mechanism not in MECHANISMS:
            raise ValueError(f"Requested mechanism '{mechanism}' is not supported. Supported mechanisms are "
                             f"'{', '.join(MECHANISMS)}'.")
        self.mechanism = mechanism
        self.scram = MECHANISMS[mechanism]
        self.credentials = credentials
        self.delegation_tokens = delegation_tokens
        self.max_receive_size = max_receive_size
        self.server_nonce = server_nonce

    def new_server(self) -> "ScramServer":
        return ScramServer(self)


class ScramServer(SaslServer):
    def __init__(self, factory: ScramServerFactory):
        super().__init__(max_receive_size=factory.max_receive_size)
        self.mechanism = factory.mechanism
        self._factory = factory
        self._scram = factory.scram
        self._state = "RECEIVE_CLIENT_FIRST_MESSAGE"
        self._credential: cred.ScramCredential | None = None
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""

    def _evaluate(self, client_bytes: bytes) -> bytes:
        # Java decodes with replacement characters; every pattern is ASCII-only, so the outcome is the same.
        message = client_bytes.decode("utf-8", errors="replace")
        if self._state == "RECEIVE_CLIENT_FIRST_MESSAGE":
            return self._client_first(message)
        return self._client_final(message)

    def _client_first(self, message: str) -> bytes:
        m = _CLIENT_FIRST.fullmatch(message)
        if m is None:
            raise SaslAuthenticationFailed(None, f"Invalid SCRAM client first message format: {message[:200]!r}")
        extensions = _parse_extensions(m.group("extensions"))
        try:
            username = username_from_saslname(m.group("saslname"))
        except ValueError:
            raise SaslAuthenticationFailed(None, "Authentication failed: Credentials could not be obtained "
                                                 "(invalid user name)") from None
        token_auth = extensions.get(TOKEN_AUTH_EXTENSION, "").lower() == "true"
        if token_auth:
            found = None
            if self._factory.delegation_tokens is not None:
                try:
                    found = self._factory.delegation_tokens(username)
                except Exception as e:
                    raise SaslAuthenticationFailed(None, "Authentication failed: Credentials could not be "
                                                         f"obtained ({type(e).__name__})") from None
            if not found or found[0] is None:
                raise SaslAuthenticationFailed(None, f"Token Authentication failed: Invalid tokenId : {username!r}")
            owner, credential, expiry_ms = found
            self._authorized_id = owner
            self._expiry_ms = expiry_ms
            self._token_authenticated = True
        else:
            try:
                credential = self._factory.credentials.get(self.mechanism, username)
            except Exception as e:
                raise SaslAuthenticationFailed(None, "Authentication failed: Credentials could not be obtained "
                                                     f"({type(e).__name__})") from None
            self._authorized_id = username
        if credential is None:
            raise SaslAuthenticationFailed(None, f"Authentication failed: Invalid user credentials (user {username!r})")
        authzid = m.group("authzid")
        if authzid and username_from_saslname_or_none(authzid) != username:
            raise SaslAuthenticationFailed(
                "Authentication failed: Client requested an authorization id that is different from username")
        if credential.iterations < self._scram.min_iterations:
            raise SaslAuthenticationFailed(None, f"Iterations {credential.iterations} is less than the minimum "
                                                 f"{self._scram.min_iterations} for {self.mechanism}")
        if TOKEN_AUTH_EXTENSION in extensions:
            self._extensions = {TOKEN_AUTH_EXTENSION: extensions[TOKEN_AUTH_EXTENSION]}
        self._credential = credential
        self._gs2_header = m.group("gs2")
        self._client_first_bare = m.group("bare")
        self._nonce = m.group("nonce") + self._factory.server_nonce()
        self._server_first = (f"r={self._nonce},s={base64.b64encode(credential.salt).decode('ascii')},"
                              f"i={credential.iterations}")
        self._state = "RECEIVE_CLIENT_FINAL_MESSAGE"
        return self._server_first.encode("ascii")

    def _client_final(self, message: str) -> bytes:
        m = _CLIENT_FINAL.fullmatch(message)
        if m is None:
            # never echo this message: it holds the proof
            raise SaslAuthenticationFailed(None, "Invalid SCRAM client final message format")
        # Kafka 3.8/3.9's rule (endsWith; see the module docstring): older librdkafka repeats its client nonce.
        final_nonce = m.group("nonce").encode("ascii")
        if len(final_nonce) < len(self._nonce) or not hmac.compare_digest(
                final_nonce[len(final_nonce) - len(self._nonce):], self._nonce.encode("ascii")):
            raise SaslAuthenticationFailed(None, "Invalid client nonce in the final client message.")
        try:
            channel = base64.b64decode(m.group("channel"), validate=True)
            proof = base64.b64decode(m.group("proof"), validate=True)
        except (binascii.Error, ValueError):
            raise SaslAuthenticationFailed(None, "Authentication failed: Invalid client final message") from None
        if not hmac.compare_digest(channel, self._gs2_header.encode("ascii")):
            raise SaslAuthenticationFailed(None, "Invalid channel binding in the final client message")
        credential = self._credential
        assert credential is not None
        auth_message = ",".join((self._client_first_bare, self._server_first, m.group("without_proof"))).encode("ascii")
        client_signature = cred.client_signature(self._scram, credential.stored_key, auth_message)
        if len(proof) != len(client_signature):
            raise SaslAuthenticationFailed(None, "Invalid client credentials (proof of the wrong length)")
        client_key = cred.xor(client_signature, proof)
        computed = cred.stored_key(self._scram, client_key)
        if not hmac.compare_digest(computed, credential.stored_key):
            raise SaslAuthenticationFailed(None, "Invalid client credentials")
        server_signature = cred.server_signature(self._scram, credential.server_key, auth_message)
        self._clear()
        self._succeed(self._authorized_id or "")
        return b"v=" + base64.b64encode(server_signature)

    def _clear(self) -> None:
        self._credential = None
        self._client_first_bare = ""
        self._server_first = ""


def username_from_saslname_or_none(saslname: str) -> str | None:
    try:
        return username_from_saslname(saslname)
    except ValueError:
        return None

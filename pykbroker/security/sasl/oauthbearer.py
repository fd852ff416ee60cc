"""SASL/OAUTHBEARER (RFC 7628) as Kafka 3.7's OAuthBearerSaslServer serves it, with its two validators.

Client initial response (OAuthBearerClientInitialResponse)::

    n,[a=<authzid>],^Aauth=Bearer <token>^A[<key>=<value>^A...]^A

Anything else fails with Kafka's generic authentication error. The token goes to the listener's
validator:

- ``UnsecuredJwsValidator`` (Kafka's default, OAuthBearerUnsecuredValidatorCallbackHandler; for development):
  an unsecured JWS (``alg`` ``none``, empty signature), options from the OAuthBearerLoginModule JAAS entry:
  ``unsecuredValidatorPrincipalClaimName`` (default ``sub``), ``unsecuredValidatorScopeClaimName`` (default
  ``scope``), ``unsecuredValidatorRequiredScope`` (space-separated), ``unsecuredValidatorAllowableClockSkewMs``
  (default 0). Kafka decodes the sections with the standard Base64 alphabet (padding optional, but complete
  when present), so a section with ``-`` or ``_`` is refused, as by Kafka, and reads each section's first JSON
  value (Jackson's readTree), ignoring anything after it.
- ``SignedJwtValidator`` (KIP-768, when ``sasl.server.callback.handler.class`` is Kafka's
  ``org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler``, or the older
  ``...oauthbearer.secured...`` name): a signed JWT checked as Kafka's jose4j JwtConsumer checks it:
  RS256/RS384/RS512, PS256/PS384/PS512, ES256/ES384/ES512 (no ``none``; HMAC algorithms are not served),
  the key from the JWKS file of ``sasl.oauthbearer.jwks.endpoint.url`` (``file:`` URL; read once, as
  Kafka's JwksFileVerificationKeyResolver; chosen by ``kid``, key type, curve, ``use``/``alg``; RSA keys
  of at least 2048 bits), ``exp`` and ``iat`` required, ``nbf`` honoured,
  ``sasl.oauthbearer.clock.skew.seconds`` (default 30), ``sasl.oauthbearer.expected.issuer``,
  ``sasl.oauthbearer.expected.audience`` (a token carrying ``aud`` is refused when none is configured, as
  jose4j refuses it), ``sasl.oauthbearer.scope.claim.name`` (default ``scope``),
  ``sasl.oauthbearer.sub.claim.name`` (default ``sub``). An http(s) JWKS URL is Kafka's RefreshingHttpsJwks
  (``JwksUrlKeyResolver``): fetched once at start (a failure stops the start, as Kafka's init does), then
  again every ``sasl.oauthbearer.jwks.endpoint.refresh.ms`` (default 1 hour) by a thread of its own, each
  refresh retried from ``...retry.backoff.ms`` (100) doubling up to ``...retry.backoff.max.ms`` (10 s), a
  failed refresh keeping the keys it had; a token naming a ``kid`` the keys lack is refused and asks for a
  refresh at once, at most once a minute per ``kid`` (16 remembered, ``kid`` longer than 1000 characters
  ignored), so a key rotated in at the identity provider is taken within moments. The broker's event loop
  never waits for the network. HTTPS is checked against the system's CAs (``SSL_CERT_FILE`` names another
  bundle).

A token that fails validation is answered, as Kafka answers it, with the JSON error
``{"status":"invalid_token"}`` (``{"status":"insufficient_scope", "scope":"[...]"}`` for a missing required
scope of the unsecured validator) as a successful step; the client then sends a single ``0x01`` and the
exchange fails with that JSON as the error message. The reason goes to the broker's debug log, never the
token. Every SASL extension is accepted (both of Kafka's validators accept all) and kept in ``extensions``;
the session lifetime is the token's ``exp``.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import unquote, urlparse

from pykbroker.security.jaas import LoginModuleEntry, listener_mechanism_config
from pykbroker.security.sasl import (
    DEFAULT_SASL_SERVER_MAX_RECEIVE_SIZE,
    SaslAuthenticationFailed,
    SaslConfigError,
    SaslServer,
    SaslServerFactory,
    loggable,
)

log = logging.getLogger(__name__)

MECHANISM = "OAUTHBEARER"
UNSECURED_CALLBACK_HANDLER = \
    "org.apache.kafka.common.security.oauthbearer.internals.unsecured.OAuthBearerUnsecuredValidatorCallbackHandler"
SECURED_CALLBACK_HANDLERS = frozenset({
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
    "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerValidatorCallbackHandler",
})

SASL_OAUTHBEARER_JWKS_ENDPOINT_URL = "sasl.oauthbearer.jwks.endpoint.url"
SASL_OAUTHBEARER_CLOCK_SKEW_SECONDS = "sasl.oauthbearer.clock.skew.seconds"
SASL_OAUTHBEARER_EXPECTED_AUDIENCE = "sasl.oauthbearer.expected.audience"
SASL_OAUTHBEARER_EXPECTED_ISSUER = "sasl.oauthbearer.expected.issuer"
SASL_OAUTHBEARER_SCOPE_CLAIM_NAME = "sasl.oauthbearer.scope.claim.name"
SASL_OAUTHBEARER_SUB_CLAIM_NAME = "sasl.oauthbearer.sub.claim.name"
DEFAULT_CLOCK_SKEW_SECONDS = 30

UNSECURED_PRINCIPAL_CLAIM_NAME = "unsecuredValidatorPrincipalClaimName"
UNSECURED_SCOPE_CLAIM_NAME = "unsecuredValidatorScopeClaimName"
UNSECURED_REQUIRED_SCOPE = "unsecuredValidatorRequiredScope"
UNSECURED_ALLOWABLE_CLOCK_SKEW_MS = "unsecuredValidatorAllowableClockSkewMs"

MAX_JWKS_FILE_BYTES = 1 << 20
SASL_OAUTHBEARER_JWKS_ENDPOINT_REFRESH_MS = "sasl.oauthbearer.jwks.endpoint.refresh.ms"
SASL_OAUTHBEARER_JWKS_ENDPOINT_RETRY_BACKOFF_MS = "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms"
SASL_OAUTHBEARER_JWKS_ENDPOINT_RETRY_BACKOFF_MAX_MS = "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms"
JWKS_FETCH_TIMEOUT_S = 10.0
# Kafka's RefreshingHttpsJwks: how often one unknown kid may ask for a refresh, how many are remembered, the
# longest kid that may ask at all.
MISSING_KEY_ID_CACHE_IN_FLIGHT_S = 60.0
MISSING_KEY_ID_CACHE_MAX_ENTRIES = 16
MISSING_KEY_ID_MAX_KEY_LENGTH = 1000
_MAX_SECONDS = (2 ** 63 - 1) // 1000  # claim times must fit a Java long of milliseconds

# --- the client initial response ------------------------------------------------------------------------

_SEP = "\x01"
_SASLNAME = r"(?:[\x01-\x2b\x2d-\x3c\x3e-\x7f]|=2C|=3D)+"
_KEY = r"[A-Za-z]+"
_VALUE = r"[\x21-\x7e \t\r\n]+"
_CLIENT_INITIAL_RESPONSE = re.compile(
    rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,{_SEP}(?P<kvpairs>(?:{_KEY}={_VALUE}{_SEP})*){_SEP}", re.ASCII)
_AUTH = re.compile(r"(?P<scheme>[A-Za-z0-9_]+) +(?P<token>[-_.a-zA-Z0-9]+)", re.ASCII)
_EXTENSION_KEY = re.compile(_KEY, re.ASCII)
_EXTENSION_VALUE = re.compile(_VALUE, re.ASCII)


@dataclass(frozen=True)
class ClientInitialResponse:
    token: str
    authorization_id: str = ""
    extensions: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"ClientInitialResponse(token=<hidden>, authorization_id={self.authorization_id!r}, " \
               f"extensions={sorted(self.extensions)!r})"

    def to_bytes(self) -> bytes:
        """The client side (tests and the broker's own inter-broker client)."""
        authzid = f"a={self.authorization_id}" if self.authorization_id else ""
        ext = "".join(f"{_SEP}{k}={v}" for k, v in self.extensions.items())
        return f"n,{authzid},{_SEP}auth=Bearer {self.token}{ext}{_SEP}{_SEP}".encode("utf-8")


class InvalidClientResponse(ValueError):
    """Kafka's SaslException from OAuthBearerClientInitialResponse (the client sees the generic error)."""


def parse_client_initial_response(data: bytes) -> ClientInitialResponse:
    message = data.decode("utf-8", errors="replace")
    m = _CLIENT_INITIAL_RESPONSE.fullmatch(message)
    if m is None:
        raise InvalidClientResponse("Invalid OAUTHBEARER client first message")
    properties: dict[str, str] = {}
    for item in m.group("kvpairs").split(_SEP):
        if item:
            k, _, v = item.partition("=")
            properties[k] = v
    auth = properties.pop("auth", None)
    if auth is None:
        raise InvalidClientResponse("Invalid OAUTHBEARER client first message: 'auth' not specified")
    for k, v in properties.items():  # validateExtensions (the pattern already ensures it)
        if not _EXTENSION_KEY.fullmatch(k):
            raise InvalidClientResponse(f"Extension name {k} is invalid")
        if not _EXTENSION_VALUE.fullmatch(v):
            raise InvalidClientResponse(f"Extension value for extension {k} is invalid")
    am = _AUTH.fullmatch(auth)
    if am is None:
        raise InvalidClientResponse("Invalid OAUTHBEARER client first message: invalid 'auth' format")
    if am.group("scheme").lower() != "bearer":
        raise InvalidClientResponse(f"Invalid scheme in OAUTHBEARER client first message: {am.group('scheme')[:64]}")
    return ClientInitialResponse(am.group("token"), m.group("authzid") or "", properties)


# --- tokens and validation failures ----------------------------------------------------------------------

@dataclass(frozen=True)
class OAuthBearerToken:
    """A validated token (Kafka's OAuthBearerToken); ``value`` is the secret itself and stays out of repr."""

    value: str = field(repr=False)
    principal_name: str
    scope: frozenset[str]
    lifetime_ms: int
    start_time_ms: int | None = None


class InvalidToken(Exception):
    """A token the validator refuses: ``status`` and ``scope`` make the JSON answer, ``reason`` the log line."""

    def __init__(self, reason: str, status: str = "invalid_token", scope: str | None = None):
        self.reason = reason
        self.status = status
        self.scope = scope
        super().__init__(reason)

    def json_error(self) -> str:
        """OAuthBearerSaslServer.jsonErrorResponse, byte for byte."""
        text = f'{{"status":"{self.status}"'
        if self.scope is not None:
            text += f', "scope":"{self.scope}"'
        return text + "}"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON number {name}")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _json_object(raw: bytes, *, first_value_only: bool = False) -> dict[str, Any]:
    """A JSON object from a token section (duplicates keep the last value, NaN refused). ``first_value_only``:
    Jackson's readTree, which Kafka's unsecured validator uses, reads the first value and ignores what follows."""
    try:
        text = raw.decode("utf-8")
        if first_value_only:
            doc, _ = _DECODER.raw_decode(text.lstrip(" \t\r\n"))
        else:
            doc = _DECODER.decode(text)
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise InvalidToken("malformed JSON") from None
    if not isinstance(doc, dict):
        raise InvalidToken("JSON is not an object")
    return doc


# --- Kafka's unsecured validator -------------------------------------------------------------------------

_SCOPE_ITEM = re.compile(r"[\x23-\x5b\x5d-\x7e\x21]+")


def parse_scope(space_delimited: str) -> list[str]:
    """OAuthBearerScopeUtils.parseScope; raises SaslConfigError("Invalid scope value: ...")."""
    out = []
    for item in space_delimited.split(" "):
        if item:
            if not _SCOPE_ITEM.fullmatch(item):
                raise SaslConfigError(f"Invalid scope value: {item}")
            out.append(item)
    return out


def _std_b64decode(section: str) -> bytes:
    """java.util.Base64.getDecoder(): the standard alphabet, padding optional."""
    s = section.rstrip("=")
    padding = len(section) - len(s)
    if (padding > 2 or (padding and len(section) % 4) or not re.fullmatch(r"[A-Za-z0-9+/]*", s)
            or len(s) % 4 == 1):  # padding is optional, but when there it must complete the last quantum
        raise InvalidToken("malformed Base64 URL encoded value")
    try:
        return base64.b64decode(s + "=" * (-len(s) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidToken("malformed Base64 URL encoded value") from None


def _as_text(value: Any) -> str:
    """Jackson's JsonNode.asText for a non-number, non-array node."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return json.dumps(value)
    return ""


def _convert(value: Any) -> Any:
    """OAuthBearerUnsecuredJws.convert: arrays become lists of text, numbers stay numbers, all else text."""
    if isinstance(value, list):
        return [_as_text(v) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return _as_text(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _java_type(value: Any) -> str:
    return {str: "String", list: "ArrayList", int: "Integer", float: "Double"}.get(type(value), type(value).__name__)


def _fmt_f(x: float) -> str:
    return f"{x:f}"


class UnsecuredJwsValidator:
    """OAuthBearerUnsecuredJws + OAuthBearerUnsecuredValidatorCallbackHandler."""

    def __init__(self, options: Mapping[str, str] | None = None, *, clock: Callable[[], float] | None = None):
        import time

        options = options or {}
        self.principal_claim_name = (options.get(UNSECURED_PRINCIPAL_CLAIM_NAME) or "").strip() or "sub"
        self.scope_claim_name = (options.get(UNSECURED_SCOPE_CLAIM_NAME) or "").strip() or "scope"
        required = (options.get(UNSECURED_REQUIRED_SCOPE) or "").strip()
        self.required_scope = parse_scope(required) if required else []
        skew = (options.get(UNSECURED_ALLOWABLE_CLOCK_SKEW_MS) or "").strip()
        try:
            self.allowable_clock_skew_ms = int(skew) if skew else 0
        except ValueError:
            raise SaslConfigError(f'For input string: "{skew}" ({UNSECURED_ALLOWABLE_CLOCK_SKEW_MS})') from None
        if not -(2 ** 31) <= self.allowable_clock_skew_ms < 2 ** 31:
            raise SaslConfigError(f'For input string: "{skew}" ({UNSECURED_ALLOWABLE_CLOCK_SKEW_MS})')
        if self.allowable_clock_skew_ms < 0:
            raise SaslConfigError(f"Allowable clock skew millis must not be negative: {skew}")
        self._clock = clock or time.time

    def validate(self, token: str) -> OAuthBearerToken:
        if ".." in token:
            raise InvalidToken("Malformed compact serialization contains '..'")
        splits = token.split(".")
        while len(splits) > 1 and splits[-1] == "" and not token.endswith("."):
            splits.pop()
        if len(splits) != 3:
            raise InvalidToken("Unsecured JWS compact serializations must have 3 dot-separated Base64URL-encoded values")
        header = {k: _convert(v) for k, v in _json_object(_std_b64decode(splits[0]), first_value_only=True).items()}
        claims = {k: _convert(v) for k, v in _json_object(_std_b64decode(splits[1]), first_value_only=True).items()}
        alg = header.get("alg")
        if alg is None:
            raise InvalidToken("JWS header must have an Algorithm value")
        if alg != "none":
            raise InvalidToken("Unsecured JWS must have 'none' for an algorithm")
        if splits[2]:
            raise InvalidToken("Unsecured JWS must not contain a digital signature")

        def claim(name: str, kind: str) -> Any:
            value = claims.get(name)
            if value is None:
                return None
            ok = isinstance(value, str) if kind == "String" else (
                _is_number(value) if kind == "Number" else isinstance(value, list))
            if not ok:
                raise InvalidToken(f"The '{name}' claim was not of type {kind}: {_java_type(value)}")
            return value

        scope_value = claims.get(self.scope_claim_name)
        if isinstance(scope_value, str):
            scope = frozenset({scope_value.strip()}) if scope_value.strip() else frozenset()
        else:
            items = claim(self.scope_claim_name, "List") or []
            scope = frozenset(s.strip() for s in items if s.strip())
        exp = claim("exp", "Number")
        if exp is None:
            raise InvalidToken("No expiration time in JWT")
        if abs(exp) > _MAX_SECONDS or not math.isfinite(exp):
            raise InvalidToken("The 'exp' claim is not a finite number of milliseconds")
        principal = claim(self.principal_claim_name, "String")
        if principal is None or not principal.strip():
            raise InvalidToken(f"No principal name in JWT claim: {self.principal_claim_name}")
        iat = claim("iat", "Number")
        if iat is not None and (abs(iat) > _MAX_SECONDS or not math.isfinite(iat)):
            raise InvalidToken("The 'iat' claim is not a finite number of milliseconds")
        now = int(self._clock() * 1000)
        skew = self.allowable_clock_skew_ms
        if iat is not None and 1000 * iat > now + skew:
            raise InvalidToken(f"The Issued At value ({_fmt_f(iat)} seconds) was after the indicated time ({now} ms) "
                               f"plus allowable clock skew ({skew} ms)")
        if now - skew >= 1000 * exp:
            raise InvalidToken(f"The indicated time ({now} ms) minus allowable clock skew ({skew} ms) was on or after "
                               f"the Expiration Time value ({_fmt_f(exp)} seconds)")
        if iat is not None and exp <= iat:
            raise InvalidToken(f"The Expiration Time time ({_fmt_f(exp)} seconds) was not after the Issued At time "
                               f"({_fmt_f(iat)} seconds)")
        for required in self.required_scope:
            if required not in scope:
                listed = "[" + ", ".join(self.required_scope) + "]"
                raise InvalidToken(f"The provided scope ([{', '.join(sorted(scope))}]) was missing a required scope "
                                   f"({required}).  All required scope elements: {listed}",
                                   status="insufficient_scope", scope=listed)
        return OAuthBearerToken(token, principal, scope, round(exp * 1000),
                                None if iat is None else round(iat * 1000))


# --- KIP-768: signed JWTs against a JWKS ----------------------------------------------------------------

def _b64url_decode(section: str) -> bytes:
    s = section.rstrip("=")
    if not re.fullmatch(r"[A-Za-z0-9_-]*", s) or len(s) % 4 == 1:
        raise InvalidToken("invalid Base64URL encoding")
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def _b64url_int(value: Any) -> int:
    if not isinstance(value, str):
        raise ValueError("not a Base64URL string")
    return int.from_bytes(_b64url_decode(value), "big")


_ALGS: dict[str, tuple[str, str, str | None]] = {  # alg -> (kty, hash, curve)
    "RS256": ("RSA", "SHA256", None), "RS384": ("RSA", "SHA384", None), "RS512": ("RSA", "SHA512", None),
    "PS256": ("RSA", "SHA256", None), "PS384": ("RSA", "SHA384", None), "PS512": ("RSA", "SHA512", None),
    "ES256": ("EC", "SHA256", "P-256"), "ES384": ("EC", "SHA384", "P-384"), "ES512": ("EC", "SHA512", "P-521"),
}
_CURVE_BYTES = {"P-256": 32, "P-384": 48, "P-521": 66}


@dataclass(frozen=True)
class Jwk:
    kty: str
    key: Any  # a cryptography public key
    kid: str | None = None
    use: str | None = None
    alg: str | None = None
    crv: str | None = None
    key_ops: tuple[str, ...] | None = None


def load_jwks(text: str) -> list[Jwk]:
    """The usable public keys of a JWKS document (RSA and EC; other key types are skipped, as a
    verification key resolver never selects them for the algorithms served). Raises ValueError."""
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    doc = json.loads(text, parse_constant=_reject_constant)
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ValueError("a JWKS is a JSON object with a \"keys\" array")
    out: list[Jwk] = []
    for i, jwk in enumerate(doc["keys"]):
        if not isinstance(jwk, dict):
            raise ValueError(f"key {i} is not a JSON object")
        kty = jwk.get("kty")
        try:
            if kty == "RSA":
                key = rsa.RSAPublicNumbers(_b64url_int(jwk.get("e")), _b64url_int(jwk.get("n"))).public_key()
                crv = None
            elif kty == "EC":
                crv = jwk.get("crv")
                curve = {"P-256": ec.SECP256R1, "P-384": ec.SECP384R1, "P-521": ec.SECP521R1}.get(crv)
                if curve is None:
                    continue
                key = ec.EllipticCurvePublicNumbers(_b64url_int(jwk.get("x")), _b64url_int(jwk.get("y")),
                                                    curve()).public_key()
            else:
                continue
        except (ValueError, InvalidToken) as e:
            raise ValueError(f"key {i} ({kty}) is invalid: {e}") from None
        ops = jwk.get("key_ops")
        out.append(Jwk(kty, key, _str_or_none(jwk.get("kid")), _str_or_none(jwk.get("use")),
                       _str_or_none(jwk.get("alg")), crv, tuple(ops) if isinstance(ops, list) else None))
    return out


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) else None


class JwksFileKeyResolver:
    """Kafka's JwksFileVerificationKeyResolver: the JWKS file read once (``reload`` reads it again)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.keys: list[Jwk] = []
        self.reload()

    def reload(self) -> None:
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_JWKS_FILE_BYTES + 1)
        except OSError as e:
            raise SaslConfigError(f"The OAuth configuration option {SASL_OAUTHBEARER_JWKS_ENDPOINT_URL} contains a "
                                  f"file ({self.path}) that could not be read: {e.strerror}") from None
        if len(raw) > MAX_JWKS_FILE_BYTES:
            raise SaslConfigError(f"JWKS file {self.path} is larger than {MAX_JWKS_FILE_BYTES} bytes")
        try:
            self.keys = load_jwks(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise SaslConfigError(f"JWKS file {self.path} is not a valid JSON Web Key Set: {e}") from None

    def resolve(self, header: Mapping[str, Any]) -> Any:
        return select_key(self.keys, header, "the JWKS file")


def select_key(keys: list[Jwk], header: Mapping[str, Any], where: str) -> Any:
    """jose4j's VerificationJwkSelector: kid, key type, curve, use, key_ops and alg must fit; the first
    fitting key wins; InvalidToken when none does."""
    alg = header["alg"]
    kty, _, crv = _ALGS[alg]
    kid = header.get("kid")
    for jwk in keys:
        if kid is not None and jwk.kid != kid:
            continue
        if jwk.kty != kty or (crv is not None and jwk.crv != crv):
            continue
        if jwk.use not in (None, "sig") or (jwk.key_ops is not None and "verify" not in jwk.key_ops):
            continue
        if jwk.alg is not None and jwk.alg != alg:
            continue
        return jwk.key
    raise InvalidToken(f"Unable to find a suitable verification key for JWS w/ header "
                       f"{{alg: {alg}, kid: {str(kid)[:100]}}} from {where}")


def fetch_jwks(url: str, timeout_s: float = JWKS_FETCH_TIMEOUT_S) -> list[Jwk]:
    """GET the JWKS at an http(s) URL (at most MAX_JWKS_FILE_BYTES); OSError or ValueError on failure."""
    import urllib.request

    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - http(s) only, checked
        raw = response.read(MAX_JWKS_FILE_BYTES + 1)
    if len(raw) > MAX_JWKS_FILE_BYTES:
        raise ValueError(f"the JWKS is larger than {MAX_JWKS_FILE_BYTES} bytes")
    try:
        return load_jwks(raw.decode("utf-8"))
    except (UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"not a valid JSON Web Key Set: {e}") from None


class JwksUrlKeyResolver:
    """Kafka's RefreshingHttpsJwks + RefreshingHttpsJwksVerificationKeyResolver (see the module docstring)."""

    def __init__(self, url: str, *, refresh_ms: int = 3_600_000, retry_backoff_ms: int = 100,
                 retry_backoff_max_ms: int = 10_000, fetch: Callable[[str], list[Jwk]] = fetch_jwks,
                 clock: Callable[[], float] | None = None):
        import collections
        import threading
        import time

        if refresh_ms <= 0:
            raise SaslConfigError(f"The OAuth configuration option {SASL_OAUTHBEARER_JWKS_ENDPOINT_REFRESH_MS} "
                                  f"value must be positive")
        self.url = url
        self.refresh_s = refresh_ms / 1000
        self.retry_backoff_s = max(retry_backoff_ms, 0) / 1000
        self.retry_backoff_max_s = max(retry_backoff_max_ms, 0) / 1000
        self._fetch = fetch
        self._clock = clock or time.monotonic
        try:
            self.keys: list[Jwk] = fetch(url)  # at start, where blocking is fine (Kafka's init)
        except (OSError, ValueError) as e:
            raise SaslConfigError(f"Could not refresh JWKS from {url}: {e}") from None
        self._lock = threading.Lock()
        self._missing: "collections.OrderedDict[str, float]" = collections.OrderedDict()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.refreshes = 0  # completed refreshes (tests and logs)
        self._thread = threading.Thread(target=self._run, name="jwks-refresh", daemon=True)
        self._thread.start()
        log.info("JWKS validation key refresh thread started for %s with a refresh interval of %d ms", url, refresh_ms)

    def resolve(self, header: Mapping[str, Any]) -> Any:
        try:
            return select_key(self.keys, header, f"JWKs obtained from {self.url}")
        except InvalidToken:
            kid = header.get("kid")
            if isinstance(kid, str) and self.maybe_expedite_refresh(kid):
                log.debug("refreshing the JWKS of %s at once for an unknown key id", self.url)
            raise

    def maybe_expedite_refresh(self, kid: str) -> bool:
        """Ask the refresh thread for a refresh now, unless this kid asked less than a minute ago."""
        if len(kid) > MISSING_KEY_ID_MAX_KEY_LENGTH:
            log.warning("Key ID %s... (%d characters) was too long to cache", loggable(kid[:100]), len(kid))
            return False
        now = self._clock()
        with self._lock:
            next_check = self._missing.get(kid)
            if next_check is not None and next_check > now:
                return False
            self._missing[kid] = now + MISSING_KEY_ID_CACHE_IN_FLIGHT_S
            self._missing.move_to_end(kid)
            while len(self._missing) > MISSING_KEY_ID_CACHE_MAX_ENTRIES:
                self._missing.popitem(last=False)
        self._wake.set()
        return True

    def close(self) -> None:
        self._stop.set()
        self._wake.set()

    def _run(self) -> None:
        next_at = self._clock() + self.refresh_s
        while not self._stop.is_set():
            woken = self._wake.wait(timeout=max(0.0, next_at - self._clock()))
            if self._stop.is_set():
                return
            self._wake.clear()
            self._refresh()
            if not woken:
                next_at += self.refresh_s  # a fixed rate, as Kafka's scheduleAtFixedRate

    def _refresh(self) -> None:
        """One refresh, retried with backoff for up to retry.backoff.max.ms (Kafka's Retry); a failure keeps
        the keys known."""
        started, wait = self._clock(), self.retry_backoff_s
        while True:
            try:
                keys = self._fetch(self.url)
                break
            except Exception as e:  # noqa: BLE001 - the IdP unreachable or answering garbage: keep the old keys
                if self._stop.is_set() or self._clock() - started + wait > self.retry_backoff_max_s:
                    log.warning("OAuth JWKS refresh of %s encountered an error (%s); not updating the local JWKS "
                                "cache", self.url, e)
                    return
                self._stop.wait(wait)
                wait = min(wait * 2, self.retry_backoff_max_s) if wait else self.retry_backoff_s
        with self._lock:
            for jwk in keys:
                if jwk.kid is not None:
                    self._missing.pop(jwk.kid, None)
            self.keys = keys
        self.refreshes += 1
        log.info("OAuth JWKS refresh of %s complete (%d keys)", self.url, len(keys))


class SignedJwtValidator:
    """ValidatorAccessTokenValidator (jose4j JwtConsumer + Kafka's claim checks)."""

    def __init__(self, resolver: "JwksFileKeyResolver | JwksUrlKeyResolver", *, clock_skew_seconds: int = DEFAULT_CLOCK_SKEW_SECONDS,
                 expected_audiences: list[str] | None = None, expected_issuer: str | None = None,
                 scope_claim_name: str = "scope", sub_claim_name: str = "sub",
                 clock: Callable[[], float] | None = None):
        import time

        self.resolver = resolver
        self.clock_skew_seconds = clock_skew_seconds
        self.expected_audiences = frozenset(expected_audiences or ())
        self.expected_issuer = expected_issuer
        self.scope_claim_name = scope_claim_name
        self.sub_claim_name = sub_claim_name
        self._clock = clock or time.time

    @classmethod
    def from_configs(cls, listener: str, configs: Mapping[str, Any], *,
                     clock: Callable[[], float] | None = None) -> "SignedJwtValidator":
        def get(key: str) -> Any:
            return listener_mechanism_config(configs, listener, MECHANISM, key)

        url = (str(get(SASL_OAUTHBEARER_JWKS_ENDPOINT_URL) or "")).strip()
        if not url:
            raise SaslConfigError(f"The OAuth configuration option {SASL_OAUTHBEARER_JWKS_ENDPOINT_URL} value "
                                  f"must be non-null")
        parsed = urlparse(url)
        scheme = parsed.scheme.lower()
        resolver: JwksFileKeyResolver | JwksUrlKeyResolver | None = None
        url_settings: dict[str, int] | None = None  # an http(s) URL: its resolver is made last (it starts a thread)
        if scheme in ("http", "https"):
            def millis(key: str, default: int) -> int:
                raw = get(key)
                try:
                    return default if raw is None else int(str(raw).strip())
                except ValueError:
                    raise SaslConfigError(f"Invalid value {raw} for configuration {key}: Not a number of type "
                                          f"LONG") from None

            url_settings = dict(
                refresh_ms=millis(SASL_OAUTHBEARER_JWKS_ENDPOINT_REFRESH_MS, 3_600_000),
                retry_backoff_ms=millis(SASL_OAUTHBEARER_JWKS_ENDPOINT_RETRY_BACKOFF_MS, 100),
                retry_backoff_max_ms=millis(SASL_OAUTHBEARER_JWKS_ENDPOINT_RETRY_BACKOFF_MAX_MS, 10_000))
        elif scheme != "file":
            raise SaslConfigError(
                f"The OAuth configuration option {SASL_OAUTHBEARER_JWKS_ENDPOINT_URL} contains a URL ({url}) that "
                f"contains an invalid protocol ({scheme}); only \"http\", \"https\", and \"file\" protocol are supported")
        if url_settings is None:
            path = Path(unquote(parsed.path))
            if not path.exists():
                raise SaslConfigError(f"The OAuth configuration option {SASL_OAUTHBEARER_JWKS_ENDPOINT_URL} contains a "
                                      f"file ({path}) that doesn't exist")
            if path.is_dir():
                raise SaslConfigError(f"The OAuth configuration option {SASL_OAUTHBEARER_JWKS_ENDPOINT_URL} references "
                                      f"a directory ({path}), not a file")
            resolver = JwksFileKeyResolver(path)
        skew_raw = get(SASL_OAUTHBEARER_CLOCK_SKEW_SECONDS)
        try:
            skew = DEFAULT_CLOCK_SKEW_SECONDS if skew_raw is None else int(str(skew_raw).strip())
        except ValueError:
            raise SaslConfigError(f"Invalid value {skew_raw} for configuration "
                                  f"{SASL_OAUTHBEARER_CLOCK_SKEW_SECONDS}: Not a number of type INT") from None
        audience_raw = get(SASL_OAUTHBEARER_EXPECTED_AUDIENCE)
        audiences = [a.strip() for a in str(audience_raw).split(",") if a.strip()] if audience_raw else []
        issuer = (str(get(SASL_OAUTHBEARER_EXPECTED_ISSUER) or "")).strip() or None

        def claim_name(key: str, default: str) -> str:
            value = get(key)
            value = default if value is None else str(value).strip()
            if not value:
                raise SaslConfigError(f"The OAuth configuration option {key} value must not contain only whitespace")
            return value

        scope_claim = claim_name(SASL_OAUTHBEARER_SCOPE_CLAIM_NAME, "scope")
        sub_claim = claim_name(SASL_OAUTHBEARER_SUB_CLAIM_NAME, "sub")
        if url_settings is not None:
            resolver = JwksUrlKeyResolver(url, **url_settings)
        return cls(resolver, clock_skew_seconds=skew, expected_audiences=audiences,
                   expected_issuer=issuer, scope_claim_name=scope_claim, sub_claim_name=sub_claim, clock=clock)

    def validate(self, token: str) -> OAuthBearerToken:
        token = token.strip()
        if not token.isascii():
            raise InvalidToken("Malformed JWT provided; not ASCII")
        if not token:
            raise InvalidToken("Empty JWT provided; expected three sections (header, payload, and signature)")
        splits = token.split(".")
        while splits and splits[-1] == "":  # Java's String.split drops trailing empty strings
            splits.pop()
        if len(splits) != 3:
            raise InvalidToken(f"Malformed JWT provided; expected three sections (header, payload, and signature), "
                               f"but {len(splits)} sections provided")
        for section, name in zip(splits, ("header", "payload", "signature")):
            if not section.strip():
                raise InvalidToken(f"Malformed JWT provided; expected at least three sections (header, payload, and "
                                   f"signature), but {name} section missing")
        header = _json_object(_b64url_decode(splits[0]))
        alg = header.get("alg")
        if alg == "none":
            raise InvalidToken("'none' is not a permitted algorithm")
        if alg not in _ALGS:
            raise InvalidToken(f"the signature algorithm {str(alg)[:32]!r} is not served")
        if "crit" in header:
            raise InvalidToken("Unrecognized header 'crit' value(s)")
        key = self.resolver.resolve(header)
        _verify_signature(alg, key, f"{splits[0]}.{splits[1]}".encode("ascii"), _b64url_decode(splits[2]))
        claims = _json_object(_b64url_decode(splits[1]))
        return self._check_claims(token, claims)

    def _check_claims(self, token: str, claims: Mapping[str, Any]) -> OAuthBearerToken:
        now = self._clock()
        skew = self.clock_skew_seconds

        def numeric_date(name: str) -> float | None:
            value = claims.get(name)
            if value is None:
                return None
            if not _is_number(value):
                raise InvalidToken(f"The value of the '{name}' claim is not the expected type")
            if abs(value) > _MAX_SECONDS or not math.isfinite(value):
                raise InvalidToken(f"The value of the '{name}' claim is out of range")
            return float(int(value))  # jose4j NumericDate: whole seconds

        exp = numeric_date("exp")
        iat = numeric_date("iat")
        nbf = numeric_date("nbf")
        if exp is None:
            raise InvalidToken("No Expiration Time (exp) claim present.")
        if iat is None:
            raise InvalidToken("No Issued At (iat) claim present.")
        evaluation = math.floor(now)
        if evaluation - skew >= exp:
            raise InvalidToken(f"The JWT is no longer valid - the evaluation time {evaluation} is on or after the "
                               f"Expiration Time (exp={int(exp)}) claim value (even when providing {skew} seconds of "
                               f"leeway to account for clock skew).")
        if nbf is not None and evaluation + skew < nbf:
            raise InvalidToken(f"The JWT is not yet valid as the evaluation time {evaluation} is before the NotBefore "
                               f"(nbf={int(nbf)}) claim time (even when providing {skew} seconds of leeway to "
                               f"account for clock skew).")
        if self.expected_issuer is not None:
            iss = claims.get("iss")
            if iss is None:
                raise InvalidToken(f"No Issuer (iss) claim present but was expecting {self.expected_issuer}")
            if iss != self.expected_issuer:
                raise InvalidToken(f"Issuer (iss) claim value ({str(iss)[:200]}) doesn't match expected value of "
                                   f"{self.expected_issuer}")
        aud = claims.get("aud")
        if aud is None:
            if self.expected_audiences:
                raise InvalidToken("No Audience (aud) claim present.")
        else:
            audiences = [aud] if isinstance(aud, str) else aud
            if not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences):
                raise InvalidToken("The value of the 'aud' claim is not the expected type")
            if not self.expected_audiences.intersection(audiences):
                why = (" present in the JWT but no expected audience value(s) were provided to the JWT Consumer."
                       if not self.expected_audiences else " doesn't contain an acceptable identifier.")
                raise InvalidToken(f"Audience (aud) claim {audiences[:10]}{why}")
        sub_value = claims.get("sub")
        if sub_value is not None and not isinstance(sub_value, str):
            raise InvalidToken("The value of the 'sub' claim is not the expected type")
        # ValidatorAccessTokenValidator's own claims
        scope_raw = claims.get(self.scope_claim_name)
        if isinstance(scope_raw, str):
            scope_items: list[Any] = [scope_raw]
        elif isinstance(scope_raw, list):
            scope_items = scope_raw
        else:
            scope_items = []
        scopes: set[str] = set()
        for item in scope_items:
            if not isinstance(item, str):
                raise InvalidToken(f"Could not extract the '{self.scope_claim_name}' claim from the access token")
            value = _validate_string(self.scope_claim_name, item)
            if value in scopes:
                raise InvalidToken(f"{self.scope_claim_name} value must not contain duplicates - {value} already present")
            scopes.add(value)
        sub = claims.get(self.sub_claim_name)
        if sub is not None and not isinstance(sub, str):
            raise InvalidToken(f"Could not extract the '{self.sub_claim_name}' claim from the access token")
        principal = _validate_string(self.sub_claim_name, sub)
        exp_ms, iat_ms = int(exp) * 1000, int(iat) * 1000
        if exp_ms < 0:
            raise InvalidToken(f'exp value must be non-negative; value given was "{exp_ms}"')
        if iat_ms < 0:
            raise InvalidToken(f'iat value must be null or non-negative; value given was "{iat_ms}"')
        return OAuthBearerToken(token, principal, frozenset(scopes), exp_ms, iat_ms)


def _validate_string(name: str, value: str | None) -> str:
    """ClaimValidationUtils.validateString."""
    if value is None:
        raise InvalidToken(f"{name} value must be non-null")
    if not value:
        raise InvalidToken(f"{name} value must be non-empty")
    value = value.strip()
    if not value:
        raise InvalidToken(f"{name} value must not contain only whitespace")
    return value


def _verify_signature(alg: str, key: Any, signing_input: bytes, signature: bytes) -> None:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    kty, hash_name, crv = _ALGS[alg]
    digest = getattr(hashes, hash_name)()
    try:
        if kty == "RSA":
            if not isinstance(key, rsa.RSAPublicKey):
                raise InvalidToken("the verification key is not an RSA key")
            if key.key_size < 2048:
                raise InvalidToken(f"An RSA key of size 2048 bits or larger MUST be used with the all JOSE RSA "
                                   f"algorithms (given key was only {key.key_size} bits).")
            if alg.startswith("PS"):
                pad: Any = padding.PSS(mgf=padding.MGF1(digest), salt_length=digest.digest_size)
            else:
                pad = padding.PKCS1v15()
            key.verify(signature, signing_input, pad, digest)
        else:
            size = _CURVE_BYTES[crv or ""]
            if len(signature) != 2 * size:
                raise InvalidToken("JWS signature is invalid (wrong length for the curve)")
            r = int.from_bytes(signature[:size], "big")
            s = int.from_bytes(signature[size:], "big")
            key.verify(encode_dss_signature(r, s), signing_input, ec.ECDSA(digest))
    except InvalidSignature:
        raise InvalidToken("JWT rejected due to invalid signature.") from None


# --- the SASL server --------------------------------------------------------------------------------------

class OAuthBearerServerFactory(SaslServerFactory):
    mechanism = MECHANISM

    def __init__(self, validator: Any, *, max_receive_size: int = DEFAULT_SASL_SERVER_MAX_RECEIVE_SIZE):
        """``validator``: anything with ``validate(token) -> OAuthBearerToken`` raising InvalidToken."""
        self.validator = validator
        self.max_receive_size = max_receive_size

    def new_server(self) -> "OAuthBearerServer":
        return OAuthBearerServer(self)


def server_factory(listener: str, entry: LoginModuleEntry, configs: Mapping[str, Any], handler: Any = None, *,
                   clock: Callable[[], float] | None = None,
                   max_receive_size: int = DEFAULT_SASL_SERVER_MAX_RECEIVE_SIZE) -> OAuthBearerServerFactory:
    """The listener's OAUTHBEARER factory: the unsecured validator unless ``handler`` (the configured
    ``sasl.server.callback.handler.class``) is Kafka's OAuthBearerValidatorCallbackHandler."""
    name = None if handler is None else str(handler).strip()
    if name is None or name == UNSECURED_CALLBACK_HANDLER:
        validator: Any = UnsecuredJwsValidator(entry.options, clock=clock)
    elif name in SECURED_CALLBACK_HANDLERS:
        validator = SignedJwtValidator.from_configs(listener, configs, clock=clock)
    else:
        raise SaslConfigError(f"sasl.server.callback.handler.class={name} for {MECHANISM}: pykbroker cannot load "
                              f"Java callback handlers (Kafka's own: {UNSECURED_CALLBACK_HANDLER}, "
                              f"{', '.join(sorted(SECURED_CALLBACK_HANDLERS))})")
    return OAuthBearerServerFactory(validator, max_receive_size=max_receive_size)


class OAuthBearerServer(SaslServer):
    mechanism = MECHANISM

    def __init__(self, factory: OAuthBearerServerFactory):
        super().__init__(max_receive_size=factory.max_receive_size)
        self._validator = factory.validator
        self._error: str | None = None
        self.token: OAuthBearerToken | None = None

    def _evaluate(self, client_bytes: bytes) -> bytes:
        if client_bytes == b"\x01" and self._error is not None:
            raise SaslAuthenticationFailed(self._error, "the client acknowledged the error")
        self._error = None
        try:
            response = parse_client_initial_response(client_bytes)
        except InvalidClientResponse as e:
            raise SaslAuthenticationFailed(None, str(e)) from None
        try:
            token = self._validator.validate(response.token)
        except InvalidToken as e:
            self._error = e.json_error()
            log.debug("OAUTHBEARER token refused: %s", loggable(e.reason))
            return self._error.encode("utf-8")
        except Exception as e:  # a validator surprise is still only a refused token
            self._error = InvalidToken(type(e).__name__).json_error()
            log.debug("OAUTHBEARER token refused on an unexpected %s", type(e).__name__)
            return self._error.encode("utf-8")
        authzid = response.authorization_id
        if authzid and authzid != token.principal_name:
            raise SaslAuthenticationFailed(
                f"Authentication failed: Client requested an authorization id ({authzid}) that is different from "
                f"the token's principal name ({token.principal_name})")
        self.token = token
        self._extensions = dict(response.extensions)
        self._expiry_ms = token.lifetime_ms
        self._succeed(token.principal_name)
        log.debug("Successfully authenticate User=%s", loggable(token.principal_name))
        return b""

    def _clear(self) -> None:
        self.token = None

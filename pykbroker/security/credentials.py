"""SCRAM credentials as Kafka 3.7 stores them (ScramCredential, ScramFormatter, ScramCredentialUtils).

A credential is never the password: it is ``salt``, ``stored_key = H(HMAC(SaltedPassword, "Client Key"))``,
``server_key = HMAC(SaltedPassword, "Server Key")`` and ``iterations``, with
``SaltedPassword = Hi(password, salt, iterations)`` (RFC 5802; Hi is PBKDF2 with the mechanism's HMAC).

Storage, as Kafka's ZooKeeper mode keeps it: ``/config/users/<sanitized user>`` holds the user's entity
config ``{"version":1,"config":{"SCRAM-SHA-256":"salt=...,stored_key=...,server_key=...,iterations=4096"}}``
(next to any user quota keys, which this module leaves alone); the value string is ScramCredentialUtils'
codec (``credential_to_string`` / ``credential_from_string``), the path segment Kafka's ``Sanitizer``
(``sanitize``). The ZooKeeper envelope itself is ``pykbroker.cluster.zookeeper``'s entity-config codec
(``get_entity_config("users", sanitize(user))``); this module works on the ``config`` map:
``credentials_from_user_config`` / ``user_config_with``.

Credentials are made from a password (``generate_credential``: Kafka's salt is the UTF-8 of a random base-36
string, 4096 iterations unless told) or from a KIP-554 AlterUserScramCredentials upsertion, where the
client sends the salt and the salted password (``credential_from_salted_password``, checked first with
``validate_upsertion``: Kafka's rules and messages, iterations 4096..16384).

``ScramCredentialCache`` is the broker's in-memory view (Kafka's CredentialCache), which the SCRAM
mechanism reads; whoever watches the journal or ``/config/changes`` calls ``update_user`` / ``remove_user``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import threading
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable, Mapping
from urllib.parse import quote, unquote_plus

from pykbroker.protocol.errors import ErrorCode

# Kafka error codes of AlterUserScramCredentials
UNSUPPORTED_SASL_MECHANISM = ErrorCode.unsupported_sasl_mechanism
RESOURCE_NOT_FOUND = ErrorCode.resource_not_found
UNACCEPTABLE_CREDENTIAL = ErrorCode.unacceptable_credential
USERNAME_MUST_NOT_BE_EMPTY = "Username must not be empty"


@dataclass(frozen=True)
class ScramMechanism:
    """Kafka's ScramMechanism: ``type`` is the byte of KIP-554's requests and of UserScramCredentialRecord."""

    name: str
    hash_name: str
    type: int
    min_iterations: int = 4096
    max_iterations: int = 16384

    @property
    def digest_size(self) -> int:
        return hashlib.new(self.hash_name).digest_size


SCRAM_SHA_256 = ScramMechanism("SCRAM-SHA-256", "sha256", 1)
SCRAM_SHA_512 = ScramMechanism("SCRAM-SHA-512", "sha512", 2)
SCRAM_MECHANISMS: dict[str, ScramMechanism] = {m.name: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
DEFAULT_ITERATIONS = 4096


def scram_mechanism(name: str) -> ScramMechanism:
    try:
        return SCRAM_MECHANISMS[name]
    except (KeyError, TypeError):
        raise ValueError(f"Unknown SCRAM mechanism {name}") from None


def mechanism_for_type(type_byte: int) -> ScramMechanism | None:
    """KIP-554's mechanism byte (1 SCRAM-SHA-256, 2 SCRAM-SHA-512); None for UNKNOWN (0 or anything else)."""
    for m in SCRAM_MECHANISMS.values():
        if m.type == type_byte:
            return m
    return None


@dataclass(frozen=True)
class ScramCredential:
    """What the broker keeps of a SCRAM password. ``repr`` hides the keys."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __repr__(self) -> str:
        return f"ScramCredential(iterations={self.iterations}, salt=<{len(self.salt)} bytes>, keys=<hidden>)"


class CredentialError(ValueError):
    """A stored credential string Kafka would not read (message without the credential's content)."""


def _hmac(mechanism: ScramMechanism, key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, mechanism.hash_name).digest()


def salted_password(mechanism: ScramMechanism, password: str | bytes, salt: bytes, iterations: int) -> bytes:
    """RFC 5802 Hi(Normalize(password), salt, i). Kafka's Normalize is plain UTF-8 (no SASLprep)."""
    pw = password.encode("utf-8") if isinstance(password, str) else bytes(password)
    return hashlib.pbkdf2_hmac(mechanism.hash_name, pw, salt, iterations)


def client_key(mechanism: ScramMechanism, salted: bytes) -> bytes:
    return _hmac(mechanism, salted, b"Client Key")


def server_key(mechanism: ScramMechanism, salted: bytes) -> bytes:
    return _hmac(mechanism, salted, b"Server Key")


def stored_key(mechanism: ScramMechanism, client_key_: bytes) -> bytes:
    return hashlib.new(mechanism.hash_name, client_key_).digest()


def client_signature(mechanism: ScramMechanism, stored_key_: bytes, auth_message: bytes) -> bytes:
    """RFC 5802 ClientSignature := HMAC(StoredKey, AuthMessage) (ScramFormatter.clientSignature)."""
    return _hmac(mechanism, stored_key_, auth_message)


def server_signature(mechanism: ScramMechanism, server_key_: bytes, auth_message: bytes) -> bytes:
    """RFC 5802 ServerSignature := HMAC(ServerKey, AuthMessage) (ScramFormatter.serverSignature)."""
    return _hmac(mechanism, server_key_, auth_message)


def xor(first: bytes, second: bytes) -> bytes:
    """ClientProof := ClientKey XOR ClientSignature, and back (ScramFormatter.xor)."""
    return bytes(a ^ b for a, b in zip(first, second))


def secure_random_string() -> str:
    """ScramFormatter.secureRandomString: a 130-bit random number in base 36 (server nonces, salts)."""
    n = secrets.randbits(130)
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while n:
        n, r = divmod(n, 36)
        out = digits[r] + out
    return out or "0"


def credential_from_salted_password(mechanism: ScramMechanism, salt: bytes, salted: bytes,
                                    iterations: int) -> ScramCredential:
    """ScramFormatter.generateCredential(salt, saltedPassword, iterations): the KIP-554 upsertion path.
    An empty salted password is refused as Java's HMAC key refuses it (ValueError "Empty key"); an empty salt
    is taken, as Kafka takes it."""
    if not salted:
        raise ValueError("Empty key")
    return ScramCredential(bytes(salt), stored_key(mechanism, client_key(mechanism, salted)),
                           server_key(mechanism, salted), int(iterations))


def generate_credential(mechanism: ScramMechanism | str, password: str, iterations: int = DEFAULT_ITERATIONS,
                        salt: bytes | None = None) -> ScramCredential:
    """A credential from a password (kafka-configs, the bootstrap admin user). The salt is Kafka's kind
    (UTF-8 of a random base-36 string) unless given."""
    mech = scram_mechanism(mechanism) if isinstance(mechanism, str) else mechanism
    if iterations < mech.min_iterations or iterations > mech.max_iterations:
        raise ValueError(f"Iterations {iterations} is outside [{mech.min_iterations}, {mech.max_iterations}] "
                         f"for {mech.name}")
    salt = secure_random_string().encode("ascii") if salt is None else bytes(salt)
    return credential_from_salted_password(mech, salt, salted_password(mech, password, salt, iterations), iterations)


# --- ScramCredentialUtils: the stored string ------------------------------------------------------------

def credential_to_string(credential: ScramCredential) -> str:
    b64 = lambda b: base64.b64encode(b).decode("ascii")  # noqa: E731
    return (f"salt={b64(credential.salt)},stored_key={b64(credential.stored_key)},"
            f"server_key={b64(credential.server_key)},iterations={credential.iterations}")


_FIELDS = ("salt", "stored_key", "server_key", "iterations")


def credential_from_string(text: str) -> ScramCredential:
    """ScramCredentialUtils.credentialFromString: exactly the four keys, base64 values, an integer count.
    Errors never repeat the string (it holds the keys)."""
    if not isinstance(text, str):
        raise CredentialError("Credentials not valid: not a string")
    props: dict[str, str] = {}
    for token in text.split(","):
        index = token.find("=")
        if index <= 0:
            raise CredentialError("Credentials not valid: a field is not key=value")
        props[token[:index]] = token[index + 1:]
    if len(props) != 4 or any(k not in props for k in _FIELDS):
        raise CredentialError(f"Credentials not valid: fields {sorted(props)}, expected {sorted(_FIELDS)}")
    try:
        salt, stored, server = (base64.b64decode(props[k], validate=True) for k in _FIELDS[:3])
    except (binascii.Error, ValueError):
        raise CredentialError("Credentials not valid: a value is not base64") from None
    try:
        iterations = int(props["iterations"])
    except ValueError:
        raise CredentialError("Credentials not valid: iterations is not a number") from None
    if iterations < -(2 ** 31) or iterations >= 2 ** 31:
        raise CredentialError("Credentials not valid: iterations is not a number")
    return ScramCredential(salt, stored, server, iterations)


# --- /config/users/<user> -------------------------------------------------------------------------------

def sanitize(name: str) -> str:
    """Kafka's Sanitizer.sanitize: URLEncoder (UTF-8) with ``*`` as %2A and space as %20; used for the
    znode name of a user or client id."""
    return quote(name, safe=".-_").replace("~", "%7E")


def desanitize(name: str) -> str:
    """Kafka's Sanitizer.desanitize (URLDecoder)."""
    return unquote_plus(name, errors="strict")


def user_config_path(user: str) -> str:
    return f"/config/users/{sanitize(user)}"


def credentials_from_user_config(config: Mapping[str, str],
                                 mechanisms: Iterable[str] = SCRAM_MECHANISMS) -> dict[str, ScramCredential]:
    """The SCRAM credentials in a user's entity config (CredentialProvider.updateCredentials reads each
    enabled mechanism's key; other keys, quotas, are not credentials). Raises CredentialError."""
    out: dict[str, ScramCredential] = {}
    for name in mechanisms:
        value = config.get(name)
        if value is not None:
            out[name] = credential_from_string(value)
    return out


def user_config_with(config: Mapping[str, str], mechanism: str, credential: ScramCredential | None) -> dict[str, str]:
    """A copy of the user's entity config with ``mechanism``'s credential set (None: removed), other keys
    kept (what ZkAdminManager writes back for an upsertion or deletion)."""
    scram_mechanism(mechanism)
    out = dict(config)
    if credential is None:
        out.pop(mechanism, None)
    else:
        out[mechanism] = credential_to_string(credential)
    return out


WRITE_ATTEMPTS = 5  # conditional writes of one user's config that found it changed, before giving up


async def rewrite_user_config(read: Callable[[], Awaitable[tuple[dict[str, str], int | None]]],
                              write: Callable[[dict[str, str], int | None], Awaitable[object]],
                              change: Callable[[dict[str, str]], dict[str, str]],
                              stale: type[Exception] | tuple[type[Exception], ...],
                              attempts: int = WRITE_ATTEMPTS) -> bool:
    """ZkAdminManager's read-modify-write of a user's entity config: ``read()`` gives (config, version),
    ``change(config)`` the new config (its exceptions go to the caller), ``write(config, version)`` stores it
    conditionally on the version read and raises ``stale`` if another write (credentials, quotas) came in
    between: then read again. False when every one of ``attempts`` writes was stale."""
    for _ in range(attempts):
        config, version = await read()
        try:
            await write(change(config), version)
            return True
        except stale:
            continue
    return False


def parse_add_scram(arg: str) -> tuple[str, ScramMechanism, ScramCredential]:
    """A first user's credential as ``kafka-storage.sh format --add-scram`` reads it (Kafka 3.7.1's
    StorageTool), for a bootstrap command: ``SCRAM-SHA-256=[name=alice,password=alice-secret]`` or
    ``SCRAM-SHA-512=[name=alice,iterations=8192,salt="N3E=",saltedpassword="YCE="]`` (base64 salt and salted
    password). As in Kafka, ``iterations`` is read only together with ``salt`` (4096 otherwise), and a value may
    hold '=' inside double quotes. Returns (user, mechanism, credential); ValueError with Kafka's messages.

    Where Kafka silently stores something else than what was typed, this refuses (ValueError naming the key,
    never a value: the values hold passwords): whitespace inside the argument (Kafka keeps its first word, so
    ``password=pass word`` would store ``pas``), a config not in ``[...]``, an item without '=' (a ',' inside
    a value: ``password=abc,def``), a second unquoted '=' in an item (``password=a=b`` would store ``a``; only
    the base64 ``salt`` and ``saltedpassword`` may end in unquoted '=' padding, which Kafka drops)."""
    import re

    head = arg.strip()
    name, sep, config = head.partition("=")
    if name not in SCRAM_MECHANISMS:
        if not head or (sep and config.startswith("[")):  # MECHANISM=[...]: a mechanism's place, no value
            raise ValueError(f"The add-scram mechanism {name} is not supported.")
        raise ValueError("An add-scram argument must be SCRAM-SHA-256=[key=value,...] or "
                         "SCRAM-SHA-512=[key=value,...], without whitespace")
    mech = SCRAM_MECHANISMS[name]
    if not (len(config) >= 2 and config.startswith("[") and config.endswith("]")):
        raise ValueError(f"The add-scram argument of {name} must be {name}=[key=value,...] (in brackets)")
    args: dict[str, str] = {}
    key = None
    for item in config[1:-1].split(","):
        parts = re.split(r'=(?=(?:[^"]*"[^"]*")*[^"]*$)', item)
        if len(parts) < 2:
            where = f"the item after {key!r}" if key is not None else "the first item"
            raise ValueError(f"Invalid add-scram argument of {name}: {where} has no '=' (expected "
                             "key=value,...; a value cannot hold ',')")
        key = parts[0].strip()
        if key in ("salt", "saltedpassword"):  # base64 padding: Java's split drops trailing empty strings
            while len(parts) > 2 and parts[-1] == "":
                parts.pop()
        if len(parts) > 2:
            raise ValueError(f"Invalid add-scram argument of {name}: the value of {key!r} holds an '=' outside "
                             'double quotes (write it as key="value")')
        if re.search(r"\s", item):
            raise ValueError(f"Invalid add-scram argument of {name}: the item of {key!r} holds whitespace "
                             "(Kafka's tools split their arguments on it)")
        args[key] = parts[1].replace('"', "")
    if "name" not in args:
        raise ValueError("You must supply 'name' to add-scram")

    def b64(key: str) -> bytes:  # java.util.Base64's decoder: padding optional (an unquoted "AA==" reads "AA")
        value = args[key].rstrip("=")
        try:
            return base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"The '{key}' value must be base64 for add-scram") from None

    salt = b64("salt") if "salt" in args else secure_random_string().encode("ascii")
    iterations = DEFAULT_ITERATIONS
    if "salt" in args:
        try:
            iterations = int(args["iterations"])
        except (KeyError, ValueError):
            raise ValueError("The 'iterations' value must be a number for add-scram (with 'salt')") from None
        if iterations < mech.min_iterations:
            raise ValueError(f"The 'iterations' value must be >= {mech.min_iterations} for add-scram")
        if iterations > mech.max_iterations:
            raise ValueError(f"The 'iterations' value must be <= {mech.max_iterations} for add-scram")
    if "password" in args:
        if "saltedpassword" in args:
            raise ValueError("You must only supply one of 'password' or 'saltedpassword' to add-scram")
        salted = salted_password(mech, args["password"], salt, iterations)
    else:
        if "saltedpassword" not in args:
            raise ValueError("You must supply one of 'password' or 'saltedpassword' to add-scram")
        if "salt" not in args:
            raise ValueError("You must supply 'salt' with 'saltedpassword' to add-scram")
        salted = b64("saltedpassword")
    return args["name"], mech, credential_from_salted_password(mech, salt, salted, iterations)


def validate_upsertion(user: str, mechanism_type: int, iterations: int) -> tuple[int, str] | None:
    """ZkAdminManager.alterUserScramCredentials' checks of one upsertion: (error code, message) or None.
    Kafka 3.7.1 answers UNACCEPTABLE_CREDENTIAL for an empty user name in AlterUserScramCredentials (every
    message but "Unknown SCRAM mechanism" gets that code); DescribeUserScramCredentials, RESOURCE_NOT_FOUND."""
    if not user:
        return UNACCEPTABLE_CREDENTIAL, USERNAME_MUST_NOT_BE_EMPTY
    mech = mechanism_for_type(mechanism_type)
    if mech is None:
        return UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"
    if iterations < mech.min_iterations:
        return UNACCEPTABLE_CREDENTIAL, "Too few iterations"
    if iterations > mech.max_iterations:
        return UNACCEPTABLE_CREDENTIAL, "Too many iterations"
    return None


def validate_deletion(user: str, mechanism_type: int) -> tuple[int, str] | None:
    """The same for one deletion."""
    if not user:
        return UNACCEPTABLE_CREDENTIAL, USERNAME_MUST_NOT_BE_EMPTY
    if mechanism_for_type(mechanism_type) is None:
        return UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"
    return None


class ScramCredentialCache:
    """user -> mechanism -> credential, shared by the connections (Kafka's CredentialCache); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_user: dict[str, dict[str, ScramCredential]] = {}

    def get(self, mechanism: str, user: str) -> ScramCredential | None:
        with self._lock:
            return self._by_user.get(user, {}).get(mechanism)

    def put(self, mechanism: str, user: str, credential: ScramCredential) -> None:
        scram_mechanism(mechanism)
        with self._lock:
            self._by_user.setdefault(user, {})[mechanism] = credential

    def update_user(self, user: str, config: Mapping[str, str]) -> None:
        """Replace the user's credentials with those of its (new) entity config; raises CredentialError and
        keeps the old ones when a value is unreadable."""
        creds = credentials_from_user_config(config)
        with self._lock:
            if creds:
                self._by_user[user] = creds
            else:
                self._by_user.pop(user, None)

    def remove_user(self, user: str) -> None:
        with self._lock:
            self._by_user.pop(user, None)

    def describe(self, user: str) -> list[tuple[int, int]]:
        """(mechanism type, iterations) of each of the user's credentials (DescribeUserScramCredentials)."""
        with self._lock:
            creds = dict(self._by_user.get(user, {}))
        return [(SCRAM_MECHANISMS[m].type, c.iterations) for m, c in sorted(creds.items())]

    def users(self) -> list[str]:
        with self._lock:
            return sorted(self._by_user)

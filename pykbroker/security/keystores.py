"""Kafka's key stores and trust stores read the way Kafka 3.7's ``DefaultSslEngineFactory`` reads them, for
Python's ``ssl`` module (``tls.py`` builds the contexts from them).

Which store a set of ``ssl.*`` settings names, with Kafka's own refusals and messages
(``createKeystore`` / ``createTruststore``):

* **PEM in the configuration**: ``ssl.keystore.type=PEM`` with ``ssl.keystore.key`` (one PKCS#8 private key)
  and ``ssl.keystore.certificate.chain`` (the certificate first, then its issuers), optionally
  ``ssl.key.password`` for an encrypted key; ``ssl.truststore.type=PEM`` with ``ssl.truststore.certificates``.
* **PEM files**: ``ssl.keystore.type=PEM`` and ``ssl.keystore.location`` naming one file holding the key and
  the chain (``ssl.keystore.password`` is refused: "only key password may be specified");
  ``ssl.truststore.type=PEM`` and ``ssl.truststore.location``.
* **PKCS12**: ``ssl.keystore.location`` + ``ssl.keystore.password`` (required for a key store), read with
  cryptography's PKCS#12 loader; the trust store's password is optional, as in Kafka. Kafka's default type is
  JKS, and Java 9+ reads a PKCS12 file under that type too: pykbroker does the same (it looks at the file).
* **JKS / JCEKS files** cannot be read without Java: refused, naming the conversion
  (``keytool -importkeystore ... -deststoretype PKCS12``) or PEM.

PEM text is parsed by Kafka's ``PemParser`` rule: blocks ``-----BEGIN ...CERTIFICATE...-----`` /
``-----BEGIN ...PRIVATE KEY...-----`` anywhere in the text (text around them, header lines inside them and a
PEM folded onto one line, as a backslash-continued properties value gives it, are accepted; where Kafka's greedy
pattern keeps only the last certificate of a chain folded onto one line, every certificate is kept here). As in
Kafka the private key must be PKCS#8 - ``BEGIN PRIVATE KEY``, or ``BEGIN ENCRYPTED PRIVATE KEY`` with
``ssl.key.password`` - of type RSA, DSA or EC; an OpenSSL "traditional" key (``BEGIN RSA PRIVATE KEY``,
``BEGIN EC PRIVATE KEY``) is refused with the ``openssl pkcs8 -topk8`` command that converts it. A chain whose certificates are not each issued by the next is refused, as Java's
key store refuses it; a key that does not belong to the first certificate is refused here when loading (Java
would fail every handshake later).

Every problem is a :class:`TlsConfigError` (a ``ConfigError`` naming the setting) whose message starts with
Kafka's words ("Failed to load SSL keystore <path> of type PKCS12", "Invalid PEM keystore configs", ...) and
says why; no message or log line holds a password or key material.

How a private key reaches OpenSSL without lying around in a file (:func:`load_key_entry_into`): Python's
``SSLContext.load_cert_chain`` reads only files. The key is re-encrypted in memory with a random one-time
password (32 random bytes, never stored), written with its chain to an anonymous in-memory file
(``os.memfd_create``: it has no name in any directory and vanishes with its descriptor) and loaded from
``/proc/self/fd/<n>``; where memfd is not available, into a file created 0600 inside a fresh 0700 directory
from ``tempfile.mkdtemp``, both removed right after loading. Either way only the encrypted key ever leaves
process memory, and only for the time of the load. Trust certificates go in through ``cadata`` (no file).
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import re
import secrets
import ssl
import tempfile
from dataclasses import dataclass, field
from typing import Any, Mapping

from pykbroker.config import ConfigError
from pykbroker.security.principal import _Der

log = logging.getLogger(__name__)

PEM_TYPE = "PEM"
PKCS12_TYPE = "PKCS12"
JKS_MAGIC = b"\xfe\xed\xfe\xed"
JCEKS_MAGIC = b"\xce\xce\xce\xce"
# A key or trust store larger than this is a mistake (a store holds a few certificates).
MAX_STORE_BYTES = 16 * 1024 * 1024

KEYSTORE_TYPE = "ssl.keystore.type"
KEYSTORE_LOCATION = "ssl.keystore.location"
KEYSTORE_PASSWORD = "ssl.keystore.password"
KEY_PASSWORD = "ssl.key.password"
KEYSTORE_KEY = "ssl.keystore.key"
KEYSTORE_CERTIFICATE_CHAIN = "ssl.keystore.certificate.chain"
TRUSTSTORE_TYPE = "ssl.truststore.type"
TRUSTSTORE_LOCATION = "ssl.truststore.location"
TRUSTSTORE_PASSWORD = "ssl.truststore.password"
TRUSTSTORE_CERTIFICATES = "ssl.truststore.certificates"
DEFAULT_STORE_TYPE = "JKS"  # SslConfigs.DEFAULT_SSL_KEYSTORE_TYPE / DEFAULT_SSL_TRUSTSTORE_TYPE


class TlsConfigError(ConfigError):
    """TLS settings that cannot serve (a startup error, or a refused dynamic update). ``name`` is the setting."""


def _x509():
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
    except ImportError:  # pragma: no cover - cryptography is a runtime dependency
        raise TlsConfigError(None, "TLS needs the cryptography package (pip install 'cryptography>=42')") from None
    return x509, serialization


# ---------------------------------------------------------------------------------------------------
# PEM text, by Kafka's PemParser rule

def _pem_pattern(label: str) -> re.Pattern:
    name = label.replace(" ", r"\s+")
    edge = r"-+{0}\s*.*?{1}[^-]*-+\s+"  # Kafka's ".*" is greedy: on one line it would swallow a first block
    headers = r"(?:\s*[^\r\n]*:[^\r\n]*[\r\n]+)*"
    return re.compile(edge.format("BEGIN", name) + headers + r"([a-zA-Z0-9/+=\s]*)" + edge.format("END", name))


_CERTIFICATE_PEM = _pem_pattern("CERTIFICATE")
_PRIVATE_KEY_PEM = _pem_pattern("PRIVATE KEY")
_BEGIN_LINE = re.compile(r"-+BEGIN\s*([^-\r\n]*)-+")


def _b64(text: str) -> bytes:
    data = re.sub(r"\s", "", text)
    data += "=" * (-len(data) % 4)
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("its base64 content is not valid") from None


def pem_entries(pem: str, label: str) -> list[tuple[str, bytes]]:
    """The (BEGIN line label, DER bytes) of every ``label`` block of ``pem`` (Kafka's PemParser.pemEntries);
    none found: ValueError("No matching <label> entries in PEM file")."""
    pattern = _CERTIFICATE_PEM if label == "CERTIFICATE" else _PRIVATE_KEY_PEM
    entries = []
    for match in pattern.finditer(pem + "\n"):
        begin = _BEGIN_LINE.match(match.group(0))
        entries.append((" ".join(begin.group(1).split()) if begin else label, _b64(match.group(1))))
    if not entries:
        raise ValueError(f"No matching {label} entries in PEM file")
    return entries


def parse_certificates(pem: str) -> list:
    """Every certificate of a PEM text, in order (Kafka: at least one)."""
    x509, _ = _x509()
    certificates = []
    for _, der in pem_entries(pem, "CERTIFICATE"):
        try:
            certificates.append(x509.load_der_x509_certificate(der))
        except ValueError as exc:
            raise ValueError(f"a CERTIFICATE block is not an X.509 certificate ({exc})") from None
    if not certificates:
        raise ValueError("At least one certificate expected, but none found")
    return certificates


def _der_shape(der: bytes) -> str:
    """'pkcs8', 'encrypted' (EncryptedPrivateKeyInfo) or 'other' (PKCS#1, SEC1, garbage)."""
    try:
        reader = _Der(der)
        tag, start, end, _ = reader.tlv(0, len(der))
        if tag != 0x30:
            return "other"
        items = [item[0] for _, item in zip(range(3), reader.children(start, end))]
    except ValueError:
        return "other"
    if len(items) >= 3 and items[0] == 0x02 and items[1] == 0x30 and items[2] == 0x04:
        return "pkcs8"
    if len(items) == 2 and items[0] == 0x30 and items[1] == 0x04:
        return "encrypted"
    return "other"


def parse_private_key(pem: str, key_password: str | None):
    """The one PKCS#8 private key of a PEM text, as Kafka's PemStore.privateKey reads it."""
    _, serialization = _x509()
    from cryptography.hazmat.primitives.asymmetric import dsa, ec, rsa

    entries = pem_entries(pem, "PRIVATE KEY")
    if len(entries) != 1:
        raise ValueError(f"Expected one private key, but found {len(entries)}")
    label, der = entries[0]
    shape = _der_shape(der)
    if shape == "other":
        raise ValueError(
            f"Private key could not be loaded: the '{label}' block is not a PKCS#8 key (Kafka reads only "
            "'BEGIN PRIVATE KEY' or 'BEGIN ENCRYPTED PRIVATE KEY'); convert it with "
            "`openssl pkcs8 -topk8 -in key.pem -out key-pkcs8.pem` (add -nocrypt for an unencrypted key)")
    if key_password is None and shape == "encrypted":
        raise ValueError("Private key could not be loaded: the key is encrypted but ssl.key.password is not set")
    if key_password is not None and shape == "pkcs8":
        raise ValueError("ssl.key.password is set but the private key is not encrypted (Kafka expects an "
                         "'ENCRYPTED PRIVATE KEY' when a key password is given)")
    try:
        key = serialization.load_der_private_key(
            der, None if key_password is None else key_password.encode("utf-8"))
    except (ValueError, TypeError) as exc:
        if key_password is not None:
            raise ValueError("the private key could not be decrypted with ssl.key.password "
                             "(wrong password, or an unsupported encryption)") from None
        raise ValueError(f"Private key could not be loaded ({exc})") from None
    except Exception as exc:  # cryptography's UnsupportedAlgorithm
        raise ValueError(f"Private key could not be loaded ({type(exc).__name__}: {exc})") from None
    if not isinstance(key, (rsa.RSAPrivateKey, dsa.DSAPrivateKey, ec.EllipticCurvePrivateKey)):
        raise ValueError(f"Private key could not be loaded: Kafka reads RSA, DSA and EC keys, not "
                         f"{type(key).__name__.lstrip('_')}")
    return key


# ---------------------------------------------------------------------------------------------------
# The stores

@dataclass(frozen=True)
class KeyEntry:
    """A key store's private key and its certificate chain (the certificate of the key first)."""

    alias: str
    private_key: Any = field(repr=False)
    chain: tuple


@dataclass(frozen=True)
class SecurityStore:
    """A loaded key store (``key_entry``) or trust store (``trusted``). ``path`` and ``modified_ns`` are the
    file's (None for PEM in the configuration): Kafka rebuilds a store whose file changed (``modified``)."""

    store_type: str
    path: str | None
    modified_ns: int | None
    key_entry: KeyEntry | None = None
    trusted: tuple = ()

    def modified(self) -> bool:
        if self.path is None:
            return False
        now = _mtime_ns(self.path)
        return now is not None and now != self.modified_ns

    def certificates(self) -> tuple:
        """The end certificates Kafka compares on a dynamic update (CertificateEntries): the key's own."""
        if self.key_entry is not None:
            return ((self.key_entry.alias, self.key_entry.chain[0]),)
        return tuple((f"kafka{i}", cert) for i, cert in enumerate(self.trusted))

    def __str__(self) -> str:
        where = self.path if self.path is not None else "(PEM in the configuration)"
        return f"SecurityStore(type={self.store_type}, path={where})"


def _mtime_ns(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _setting(settings: Mapping[str, Any], name: str) -> Any:
    value = settings.get(name)
    if value is not None and not isinstance(value, str):
        value = getattr(value, "value", value)  # a Password-like wrapper
        if not isinstance(value, str):
            raise TlsConfigError(name, f"Invalid value for configuration {name}: expected a string")
    return value


def _read_store_file(path: str, what: str, store_type: str, setting: str) -> bytes:
    failed = f"Failed to load SSL keystore {path} of type {store_type}"
    try:
        size = os.stat(path).st_size
        if size > MAX_STORE_BYTES:
            raise TlsConfigError(setting, f"{failed}: the file is {size} bytes, more than a {what} can be")
        with open(path, "rb") as handle:
            return handle.read(MAX_STORE_BYTES + 1)
    except FileNotFoundError:
        raise TlsConfigError(setting, f"{failed}: no such file") from None
    except IsADirectoryError:
        raise TlsConfigError(setting, f"{failed}: it is a directory") from None
    except PermissionError:
        raise TlsConfigError(setting, f"{failed}: permission denied") from None
    except OSError as exc:
        raise TlsConfigError(setting, f"{failed}: {exc.strerror or exc}") from None


def _jks_refusal(path: str, store_type: str, setting: str, kind: str) -> TlsConfigError:
    location = "ssl.keystore.location" if kind == "keystore" else "ssl.truststore.location"
    prefix = "ssl.keystore" if kind == "keystore" else "ssl.truststore"
    return TlsConfigError(setting, (
        f"Failed to load SSL keystore {path} of type {store_type}: it is a Java {store_type} key store, which "
        f"pykbroker (Python's ssl module) cannot read. Convert it to PKCS12 with `keytool -importkeystore "
        f"-srckeystore {path} -srcstoretype {store_type} -destkeystore {path}.p12 -deststoretype PKCS12` and set "
        f"{prefix}.type=PKCS12 and {location}={path}.p12, or use PEM ({prefix}.type=PEM)"))


def _looks_like_pkcs12(data: bytes) -> bool:
    """PFX ::= SEQUENCE { version INTEGER (3), authSafe ContentInfo, macData OPTIONAL }."""
    try:
        reader = _Der(data)
        tag, start, end, _ = reader.tlv(0, len(data))
        if tag != 0x30:
            return False
        first_tag, first_start, first_end, _ = reader.tlv(start, end)
        return first_tag == 0x02 and bytes(reader.data[first_start:first_end]) == b"\x03"
    except ValueError:
        return False


def _load_pkcs12(data: bytes, path: str, store_type: str, password: str | None, setting: str, kind: str):
    from cryptography.hazmat.primitives.serialization import pkcs12

    failed = f"Failed to load SSL keystore {path} of type {store_type}"
    if data[:4] in (JKS_MAGIC, JCEKS_MAGIC):
        return None  # the caller refuses it by name
    if not _looks_like_pkcs12(data):
        hint = " (it looks like PEM: set the store type to PEM)" if b"-----BEGIN" in data[:65536] else ""
        raise TlsConfigError(setting, f"{failed}: Invalid keystore format{hint}")
    try:
        return pkcs12.load_pkcs12(data, None if password is None else password.encode("utf-8"))
    except ValueError:
        if password is None:
            raise TlsConfigError(setting, f"{failed}: the store is protected by a password and "
                                          f"ssl.{kind}.password is not set") from None
        raise TlsConfigError(setting, f"{failed}: {kind} password was incorrect "
                                      f"(or the file is damaged)") from None
    except Exception as exc:  # unsupported encryption algorithms and the like
        raise TlsConfigError(setting, f"{failed}: {type(exc).__name__}: {exc}") from None


def _check_entry(entry: KeyEntry) -> None:
    from cryptography.hazmat.primitives import serialization

    chain = entry.chain
    for lower, upper in zip(chain, chain[1:]):
        if lower.issuer != upper.subject:
            raise ValueError("Certificate chain is not valid: each certificate must be issued by the next one "
                             "(the server's certificate first, then its issuers)")
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if entry.private_key.public_key().public_bytes(der, public) != chain[0].public_key().public_bytes(der, public):
        raise ValueError("the private key does not match the first certificate of the chain (key values mismatch)")


def _warn_validity(entry: KeyEntry, where: str) -> None:
    import datetime

    cert = entry.chain[0]
    now = datetime.datetime.now(datetime.timezone.utc)
    if cert.not_valid_after_utc < now:
        log.warning("the certificate of %s expired at %s: peers that check it will refuse the handshake",
                    where, cert.not_valid_after_utc.isoformat())
    elif cert.not_valid_before_utc > now:
        log.warning("the certificate of %s is not valid before %s", where, cert.not_valid_before_utc.isoformat())


def load_keystore(settings: Mapping[str, Any]) -> SecurityStore | None:
    """The key store the ``ssl.keystore.*`` settings name, or None (no key store: a client may go without)."""
    store_type, path, password, key_password, private_key, chain = (_setting(settings, name) for name in (
        KEYSTORE_TYPE, KEYSTORE_LOCATION, KEYSTORE_PASSWORD, KEY_PASSWORD, KEYSTORE_KEY, KEYSTORE_CERTIFICATE_CHAIN))
    store_type = store_type or DEFAULT_STORE_TYPE
    if private_key is not None:
        if store_type != PEM_TYPE:
            raise TlsConfigError(KEYSTORE_KEY, "SSL private key can be specified only for PEM, but key store type is "
                                               f"{store_type}.")
        if chain is None:
            raise TlsConfigError(KEYSTORE_CERTIFICATE_CHAIN, "SSL private key is specified, but certificate chain is "
                                                             "not specified.")
        if path is not None:
            raise TlsConfigError(KEYSTORE_LOCATION, "Both SSL key store location and separate private key are "
                                                    "specified.")
        if password is not None:
            raise TlsConfigError(KEYSTORE_PASSWORD, "SSL key store password cannot be specified with PEM format, only "
                                                    "key password may be specified.")
        entry = _pem_key_entry(chain, private_key, key_password, "Invalid PEM keystore configs", KEYSTORE_KEY)
        _warn_validity(entry, "ssl.keystore.certificate.chain")
        return SecurityStore(PEM_TYPE, None, None, key_entry=entry)
    if chain is not None:
        raise TlsConfigError(KEYSTORE_CERTIFICATE_CHAIN, "SSL certificate chain is specified, but private key is not "
                                                         "specified")
    if store_type == PEM_TYPE and path is not None:
        if password is not None:
            raise TlsConfigError(KEYSTORE_PASSWORD, "SSL key store password cannot be specified with PEM format, only "
                                                    "key password may be specified")
        modified = _mtime_ns(path)
        text = _read_store_file(path, "PEM key store", PEM_TYPE, KEYSTORE_LOCATION).decode("utf-8", "replace")
        entry = _pem_key_entry(text, text, key_password, f"Failed to load PEM SSL keystore {path}", KEYSTORE_LOCATION)
        _warn_validity(entry, path)
        return SecurityStore(PEM_TYPE, path, modified, key_entry=entry)
    if path is None and password is not None:
        raise TlsConfigError(KEYSTORE_PASSWORD, "SSL key store is not specified, but key store password is specified.")
    if path is not None and password is None:
        raise TlsConfigError(KEYSTORE_PASSWORD, "SSL key store is specified, but key store password is not specified.")
    if path is None:
        return None
    return _file_keystore(store_type, path, password, key_password)


def _pem_key_entry(chain_pem: str, key_pem: str, key_password: str | None, failed: str, setting: str) -> KeyEntry:
    try:
        key = parse_private_key(key_pem, key_password)
        certificates = parse_certificates(chain_pem)
        entry = KeyEntry("kafka", key, tuple(certificates))
        _check_entry(entry)
        return entry
    except ValueError as exc:
        raise TlsConfigError(setting, f"{failed}: {exc}") from None


def _check_type(store_type: str, path: str, setting: str) -> str:
    upper = store_type.upper()
    failed = f"Failed to load SSL keystore {path} of type {store_type}: {store_type} KeyStore not available"
    if upper == PEM_TYPE:  # Kafka compares "PEM" case-sensitively: "pem" goes to Java's KeyStore, which has none
        raise TlsConfigError(setting, f"{failed} (Kafka's store type PEM is written in upper case)")
    if upper not in (PKCS12_TYPE, "JKS", "JCEKS"):
        raise TlsConfigError(setting, f"{failed}: pykbroker reads the store types PEM and PKCS12 (and a PKCS12 "
                                      "file declared as JKS, as Java does)")
    return upper


def _pkcs12_file(store_type: str, path: str, password: str | None, kind: str):
    """(modification time, cryptography's PKCS12 object) of a key store or trust store file; a JKS / JCEKS
    file is refused naming the conversion."""
    type_setting, location = f"ssl.{kind}.type", f"ssl.{kind}.location"
    upper = _check_type(store_type, path, type_setting)
    modified = _mtime_ns(path)
    data = _read_store_file(path, kind.replace("store", " store"), store_type, location)
    loaded = None
    if upper != "JCEKS" and not (upper != PKCS12_TYPE and data[:4] in (JKS_MAGIC, JCEKS_MAGIC)):
        loaded = _load_pkcs12(data, path, store_type, password, location, kind)
    if loaded is None:
        raise _jks_refusal(path, store_type, location, kind)
    return modified, loaded


def _file_keystore(store_type: str, path: str, password: str, key_password: str | None) -> SecurityStore:
    modified, loaded = _pkcs12_file(store_type, path, password, "keystore")
    failed = f"Failed to load SSL keystore {path} of type {store_type}"
    if loaded.key is None or loaded.cert is None:
        raise TlsConfigError(KEYSTORE_LOCATION, f"{failed}: the store holds no private key entry "
                                                "(a key store needs the broker's key and certificate)")
    if key_password is not None and key_password != password:
        raise TlsConfigError(KEY_PASSWORD, f"{failed}: ssl.key.password differs from ssl.keystore.password; "
                                           "pykbroker reads PKCS12 stores whose key shares the store's password")
    alias = (loaded.cert.friendly_name or b"1").decode("utf-8", "replace").lower()
    # the chain: the key's certificate, then the others of the file in issuer order
    chain = [loaded.cert.certificate]
    others = [c.certificate for c in loaded.additional_certs]
    while others:
        issuer = next((c for c in others if c.subject == chain[-1].issuer and c != chain[-1]), None)
        if issuer is None:
            break
        chain.append(issuer)
        others.remove(issuer)
    entry = KeyEntry(alias, loaded.key, tuple(chain))
    try:
        _check_entry(entry)
    except ValueError as exc:
        raise TlsConfigError(KEYSTORE_LOCATION, f"{failed}: {exc}") from None
    _warn_validity(entry, path)
    return SecurityStore(PKCS12_TYPE, path, modified, key_entry=entry)


def load_truststore(settings: Mapping[str, Any]) -> SecurityStore | None:
    """The trust store the ``ssl.truststore.*`` settings name, or None (the system's default CAs are used)."""
    store_type, path, password, certificates = (_setting(settings, name) for name in (
        TRUSTSTORE_TYPE, TRUSTSTORE_LOCATION, TRUSTSTORE_PASSWORD, TRUSTSTORE_CERTIFICATES))
    store_type = store_type or DEFAULT_STORE_TYPE
    if certificates is not None:
        if store_type != PEM_TYPE:
            raise TlsConfigError(TRUSTSTORE_CERTIFICATES, "SSL trust store certs can be specified only for PEM, but "
                                                          f"trust store type is {store_type}.")
        if path is not None:
            raise TlsConfigError(TRUSTSTORE_LOCATION, "Both SSL trust store location and separate trust certificates "
                                                      "are specified.")
        if password is not None:
            raise TlsConfigError(TRUSTSTORE_PASSWORD, "SSL trust store password cannot be specified for PEM format.")
        try:
            return SecurityStore(PEM_TYPE, None, None, trusted=tuple(parse_certificates(certificates)))
        except ValueError as exc:
            raise TlsConfigError(TRUSTSTORE_CERTIFICATES, f"Invalid PEM truststore configs: {exc}") from None
    if store_type == PEM_TYPE and path is not None:
        if password is not None:
            raise TlsConfigError(TRUSTSTORE_PASSWORD, "SSL trust store password cannot be specified for PEM format.")
        modified = _mtime_ns(path)
        text = _read_store_file(path, "PEM trust store", PEM_TYPE, TRUSTSTORE_LOCATION).decode("utf-8", "replace")
        try:
            return SecurityStore(PEM_TYPE, path, modified, trusted=tuple(parse_certificates(text)))
        except ValueError as exc:
            raise TlsConfigError(TRUSTSTORE_LOCATION, f"Failed to load PEM SSL keystore {path}: {exc}") from None
    if path is None and password is not None:
        raise TlsConfigError(TRUSTSTORE_PASSWORD, "SSL trust store is not specified, but trust store password is "
                                                  "specified.")
    if path is None:
        return None
    modified, loaded = _pkcs12_file(store_type, path, password, "truststore")
    trusted = ([loaded.cert.certificate] if loaded.cert is not None else []) + [c.certificate for c in
                                                                               loaded.additional_certs]
    if not trusted:
        raise TlsConfigError(TRUSTSTORE_LOCATION, f"Failed to load SSL keystore {path} of type {store_type}: "
                                                  "the store holds no certificate")
    return SecurityStore(PKCS12_TYPE, path, modified, trusted=tuple(trusted))


# ---------------------------------------------------------------------------------------------------
# Into an SSLContext

def load_key_entry_into(context: ssl.SSLContext, entry: KeyEntry) -> None:
    """``context.load_cert_chain`` with ``entry``, through an anonymous in-memory file (memfd) or a 0600 file in
    a private 0700 directory, removed at once; the key is written encrypted with a one-time random password."""
    from cryptography.hazmat.primitives import serialization

    one_time = secrets.token_bytes(32).hex()
    pem = entry.private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(one_time.encode("ascii")))
    pem += b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in entry.chain)
    try:
        _load_through_file(context, pem, one_time)
    except ssl.SSLError as exc:
        raise TlsConfigError(KEYSTORE_LOCATION, f"OpenSSL refused the key store's key or certificate: "
                                                f"{exc.reason or exc}") from None


def _load_through_file(context: ssl.SSLContext, pem: bytes, password: str) -> None:
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None and os.path.isdir("/proc/self/fd"):
        try:
            fd = memfd("pykbroker-tls", getattr(os, "MFD_CLOEXEC", 0))
        except OSError:
            fd = None
        if fd is not None:
            try:
                os.write(fd, pem)
                context.load_cert_chain(f"/proc/self/fd/{fd}", password=password)
                return
            finally:
                os.close(fd)
    directory = tempfile.mkdtemp(prefix="pykbroker-tls-")  # mode 0700
    path = os.path.join(directory, "key.pem")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, pem)
        finally:
            os.close(fd)
        context.load_cert_chain(path, password=password)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.rmdir(directory)


def load_trusted_into(context: ssl.SSLContext, store: SecurityStore) -> None:
    from cryptography.hazmat.primitives import serialization

    cadata = b"".join(cert.public_bytes(serialization.Encoding.DER) for cert in store.trusted)
    try:
        context.load_verify_locations(cadata=cadata)
    except ssl.SSLError as exc:
        raise TlsConfigError(TRUSTSTORE_LOCATION, f"OpenSSL refused the trust store: {exc.reason or exc}") from None

"""TLS for SSL and SASL_SSL listeners, from Kafka's ``ssl.*`` settings (Kafka 3.7's ``SslFactory``,
``DefaultSslEngineFactory``, ``SslConfigs``, ``BrokerSecurityConfigs``, ``ChannelBuilders``): server/broker.py
serves SSL listeners with it as "Wiring" below describes, the inter-broker client (inter_broker.py) connects
with a client-mode holder, and dynamic ``listener.name.<l>.ssl.*`` updates reload both (ListenerTlsReloader;
SASL_SSL listeners included).

Settings
    Every function takes a mapping of Kafka property names to values, as ``BrokerConfig.values`` holds them
    (typed: lists as lists, booleans as bools) or as raw strings ("TLSv1.2,TLSv1.3", "true"); a missing key
    takes Kafka's default (from pykbroker's copy of Kafka's config catalogue). :func:`listener_ssl_configs`
    resolves one listener's view first: ``listener.name.<listener, lower case>.ssl.x`` wins over ``ssl.x``
    (Kafka's ``valuesWithPrefixOverride``), and on a SASL_SSL listener ``ssl.client.auth`` applies only when
    set with the listener prefix (otherwise "none", with Kafka's warning when the plain key asks for more).

What each setting does here
    * key store / trust store (``ssl.keystore.*``, ``ssl.key.password``, ``ssl.truststore.*``): see
      ``keystores.py`` (PEM files, PEM in the configuration, PKCS12; JKS refused with the keytool command).
      A server needs a key store (refused at build time, where Java would fail every handshake); without a trust
      store the system's default CAs are trusted, as Java trusts its ``cacerts``.
    * ``ssl.client.auth`` none / requested / required (any case, as Kafka's ``SslClientAuth.forConfig``) ->
      ``CERT_NONE`` / ``CERT_OPTIONAL`` / ``CERT_REQUIRED``; another value is refused with Kafka's ConfigDef
      message. With "requested", a client without a certificate connects as ANONYMOUS and one with an
      untrusted certificate is refused (as Java's ``wantClientAuth``).
    * ``ssl.enabled.protocols`` (default TLSv1.2,TLSv1.3) -> the context's minimum and maximum version.
      TLSv1 and TLSv1.1 are accepted and ignored, as Java 17 disables them (``jdk.tls.disabledAlgorithms``);
      a list with neither TLSv1.2 nor TLSv1.3 is refused, as is an unknown name ("Unsupported protocol").
      ``ssl.protocol`` (default TLSv1.3) only chooses the versions when ``ssl.enabled.protocols`` is empty:
      TLSv1.3 / TLS -> 1.2 and 1.3, TLSv1.2 -> 1.2 only (what Java's client-mode context of that name
      enables); an unknown name is refused ("<name> SSLContext not available").
    * ``ssl.cipher.suites``: Java / IANA names (TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384; Java's SSL_ prefix too)
      are translated to OpenSSL's (ECDHE-RSA-AES256-GCM-SHA384, :func:`openssl_cipher_name`); OpenSSL names are
      accepted as they are; a name OpenSSL does not have is refused ("Unsupported CipherSuite: <name>");
      signalling names (TLS_EMPTY_RENEGOTIATION_INFO_SCSV) are ignored. TLS 1.2 suites are enforced exactly.
      TLS 1.3 suites cannot be restricted through Python's ssl module (it has no SSL_CTX_set_ciphersuites):
      naming some but not all of them logs a warning and every TLS 1.3 suite of OpenSSL stays enabled. As in
      Java, a list with no TLS 1.3 suite disables TLS 1.3 and a list with only TLS 1.3 suites disables TLS 1.2.
    * ``ssl.endpoint.identification.algorithm`` (client side, default https): https (or ldaps) -> the server's
      certificate must name the host connected to (SAN dNSName / iPAddress, else the CN - Java's HTTPS rule);
      empty -> no host name check (the chain is still verified). Another value is refused.
    * ``ssl.principal.mapping.rules``: :meth:`TlsContextHolder.principal` (principal.py's mapper).
    * Java-only settings, accepted and ignored (no equivalent in OpenSSL): ``ssl.provider`` (a JCA provider),
      ``ssl.keymanager.algorithm`` / ``ssl.trustmanager.algorithm`` (SunX509 / PKIX factories),
      ``ssl.secure.random.implementation`` (OpenSSL draws from the system's CSPRNG). ``ssl.engine.factory.class``
      names a Java class and is refused when set.
    * Renegotiation is refused (``OP_NO_RENEGOTIATION``), as Kafka's SslTransportLayer refuses it.

Errors
    Everything a setting gets wrong raises :class:`TlsConfigError` (a ``pykbroker.config.ConfigError``: the
    broker reports it as a startup error, AlterConfigs as INVALID_CONFIG) naming the setting, in Kafka's words
    where Kafka has them; never a traceback, never a password or key in the text.

Reload without restart
    :class:`TlsContextHolder` is Kafka's SslFactory: ``holder.context`` is the current ``ssl.SSLContext``;
    :meth:`TlsContextHolder.reconfigure` takes the new settings (only the reconfigurable keys,
    ``SslConfigs.RECONFIGURABLE_CONFIGS``, are taken from them, as Kafka copies them), rebuilds when a value
    or a store file's modification time changed (``shouldBeRebuilt``), validates - a key store may not be
    added to or removed from a listener, a trust store may not be added, and unless ``ssl.allow.dn.changes`` /
    ``ssl.allow.san.changes`` are true the new certificate must keep the old subject DN (equal, or equal
    ignoring case in RFC 2253 form) and all of the old SubjectAltNames (more are fine); on the inter-broker
    listener the old and the new contexts must complete a TLS handshake with each other both ways (Kafka's
    ``SslEngineValidator``, done here in memory) - and only then swaps. A refused update raises
    :class:`TlsConfigError` ("Validation of dynamic config update of SSLFactory failed: ...") and keeps the
    old context; as in Kafka, the text names the cause's Java class (``...failed: org.apache.kafka.common.config.
    ConfigException: Keystore DistinguishedName does not match: ...``; InvalidConfigurationException for a store that
    does not load, SSLHandshakeException for the handshake check), measured against Kafka 3.7.1 in ZooKeeper mode
    (for the handshake check only the class name is Kafka's: the words after it are pykbroker's).
    Connections already open keep the context they were accepted with; new ones get the new one.

Principal
    :func:`peer_principal` is Kafka's DefaultKafkaPrincipalBuilder for an SSL connection: "User:" + the client
    certificate's subject (RFC 2253, as Java renders it) through ``ssl.principal.mapping.rules``, or
    User:ANONYMOUS without a client certificate. A subject no rule maps raises principal.py's NoMatchingRule:
    Kafka fails the authentication and closes the connection. On a SASL_SSL listener the principal is the SASL
    one (sasl/), not the certificate's.

Wiring (for the session that wires listeners)
    * One :class:`TlsContextHolder` per SSL / SASL_SSL listener, built at startup from
      ``listener_ssl_configs(config.values, listener.name, listener.security_protocol)`` with
      ``inter_broker=(listener is the inter-broker listener)``; a TlsConfigError is a StartupError.
    * Accepting: ``await loop.connect_accepted_socket(factory, sock, ssl=holder.context,
      ssl_handshake_timeout=...)`` - read ``holder.context`` per connection (that is the atomic swap). That call
      returns only after the handshake: run it in a task per connection, not inline in the accept loop, or one
      stalled handshake stops all accepting. A failed handshake (plaintext client, garbage records, untrusted
      certificate) raises there: log one line, close that socket only. (asyncio then closes without sending
      the TLS alert: the peer sees an EOF rather than, say, "handshake failure".)
    * In ``connection_made``: ``peer_principal(transport.get_extra_info("ssl_object"), holder.mapper)``.
    * Fetch: asyncio's SSL transport encrypts in user space, so ``loop.sendfile`` falls back to reading and
      writing chunks; keep the chunked path (CHUNK_BYTES, write-buffer watermarks) for TLS listeners.
    * Inter-broker client (done: security/inter_broker.py): a TlsContextHolder built with ``mode="client"`` from
      the inter-broker listener's view; protocol/client.py connects with ``ssl=holder.context,
      server_hostname=<advertised host>``.
    * Dynamic updates (done: :class:`ListenerTlsReloader`, hooked into cluster/dynamic_configs.py by the
      broker): AlterConfigs of ``listener.name.<l>.ssl.keystore.*`` validates every holder against the new
      view first (a refusal is INVALID_REQUEST in Kafka's "Invalid dynamic configuration" wording, nothing is
      stored), reloads store files changed in place even when no value changed (Kafka's
      reloadUpdatedFilesWithoutConfigChange, with the current values), and applies the stored change once the
      broker is notified of it (``reconfigure_soon``). Building reads files and does RSA work (and, on the
      inter-broker listener, two in-memory handshakes): tenths of a second, so validation and reloads run in a
      worker thread (the holder is thread-safe), and a reload reuses the context its validation built.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import threading
from typing import Any, Iterable, Mapping

from pykbroker.config import BROKER_CONFIGS, listener_override_base, listener_prefix
from pykbroker.kafka_broker_configs import LISTENER_PREFIX_ONLY_CONFIGS
from pykbroker.security.keystores import (
    KEYSTORE_LOCATION, SecurityStore, TlsConfigError, load_key_entry_into, load_keystore, load_trusted_into,
    load_truststore,
)
from pykbroker.security.principal import KafkaPrincipal, SslPrincipalMapper, rfc2253_name, rfc2253_subject, ssl_principal

log = logging.getLogger(__name__)

__all__ = (
    "TlsConfigError", "TlsContextHolder", "listener_ssl_configs", "server_context", "client_context",
    "peer_principal", "principal_mapper", "openssl_cipher_name", "handshake_check", "RECONFIGURABLE_CONFIGS",
    "ListenerTlsReloader",
)

SSL_CLIENT_AUTH = "ssl.client.auth"
SSL_ENABLED_PROTOCOLS = "ssl.enabled.protocols"
SSL_PROTOCOL = "ssl.protocol"
SSL_CIPHER_SUITES = "ssl.cipher.suites"
SSL_ENDPOINT_IDENTIFICATION = "ssl.endpoint.identification.algorithm"
SSL_PRINCIPAL_MAPPING_RULES = "ssl.principal.mapping.rules"
SSL_ALLOW_DN_CHANGES = "ssl.allow.dn.changes"
SSL_ALLOW_SAN_CHANGES = "ssl.allow.san.changes"
SSL_ENGINE_FACTORY_CLASS = "ssl.engine.factory.class"
JAVA_ONLY_CONFIGS = ("ssl.provider", "ssl.keymanager.algorithm", "ssl.trustmanager.algorithm",
                     "ssl.secure.random.implementation")
# SslConfigs.RECONFIGURABLE_CONFIGS
RECONFIGURABLE_CONFIGS = LISTENER_PREFIX_ONLY_CONFIGS

_CLIENT_AUTH_MODES = {"NONE": ssl.CERT_NONE, "REQUESTED": ssl.CERT_OPTIONAL, "REQUIRED": ssl.CERT_REQUIRED}
_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_DISABLED_VERSIONS = frozenset({"SSLv2Hello", "SSLv3", "TLSv1", "TLSv1.1"})  # Java 17 disables them
_SSL_CONTEXT_PROTOCOLS = {
    "TLS": ("TLSv1.2", "TLSv1.3"), "TLSv1.3": ("TLSv1.2", "TLSv1.3"), "TLSv1.2": ("TLSv1.2",),
    "SSL": ("TLSv1.2", "TLSv1.3"), "Default": ("TLSv1.2", "TLSv1.3"),
    "TLSv1.1": (), "TLSv1": (), "SSLv3": (),
}
_TLS13_SUITES = frozenset({"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256",
                           "TLS_AES_128_CCM_SHA256", "TLS_AES_128_CCM_8_SHA256"})
_SIGNALLING_SUITES = frozenset({"TLS_EMPTY_RENEGOTIATION_INFO_SCSV", "TLS_FALLBACK_SCSV"})


# ---------------------------------------------------------------------------------------------------
# Settings

def listener_ssl_configs(values: Mapping[str, Any], listener_name: str | None,
                         security_protocol: str | None = None) -> dict[str, Any]:
    """One listener's ``ssl.*`` settings under their plain names: ``listener.name.<listener lower case>.ssl.x``
    wins over ``ssl.x``. On a SASL_SSL listener ``ssl.client.auth`` is "none" unless set with the listener
    prefix (Kafka's ChannelBuilders, KIP-684), with Kafka's warning when the plain key asks for more."""
    resolved = {name: value for name, value in values.items() if name.startswith("ssl.")}
    prefix = listener_prefix(listener_name) if listener_name else None
    listener_keys: set[str] = set()
    if prefix is not None:
        for name, value in values.items():
            if name.startswith(prefix):
                base = listener_override_base(name)
                if base is not None and base.startswith("ssl."):
                    resolved[base] = value
                    listener_keys.add(base)
    if security_protocol is not None and security_protocol.upper() == "SASL_SSL" and SSL_CLIENT_AUTH not in listener_keys:
        configured = resolved.get(SSL_CLIENT_AUTH)
        if configured is not None and str(configured).strip().lower() != "none":
            log.warning("Broker configuration '%s' is applied only to SSL listeners. Listener-prefixed configuration "
                        "can be used to enable SSL client authentication for SASL_SSL listeners.", SSL_CLIENT_AUTH)
        resolved[SSL_CLIENT_AUTH] = "none"
    return resolved


def _get(settings: Mapping[str, Any], name: str) -> Any:
    if name in settings:
        return settings[name]
    definition = BROKER_CONFIGS.get(name)
    return definition.default if definition is not None else None


def _text(settings: Mapping[str, Any], name: str) -> str | None:
    value = _get(settings, name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise TlsConfigError(name, f"Invalid value {value!r} for configuration {name}: expected a string")
    return value.strip()


def _list(settings: Mapping[str, Any], name: str) -> list[str]:
    value = _get(settings, name)
    if value is None:
        return []
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return [item.strip() for item in value if item.strip()]
    raise TlsConfigError(name, f"Invalid value {value!r} for configuration {name}: expected a comma-separated list")


def _bool(settings: Mapping[str, Any], name: str) -> bool:
    value = _get(settings, name)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if value is None:
        return False
    raise TlsConfigError(name, f"Invalid value {value} for configuration {name}: Expected value to be either true or false")


def _check_common(settings: Mapping[str, Any]) -> None:
    factory = _text(settings, SSL_ENGINE_FACTORY_CLASS)
    if factory:
        raise TlsConfigError(SSL_ENGINE_FACTORY_CLASS, f"{SSL_ENGINE_FACTORY_CLASS}={factory} names a Java class; "
                                                       "pykbroker builds its TLS engine itself: unset it")
    for name in JAVA_ONLY_CONFIGS:
        if _get(settings, name) not in (None, BROKER_CONFIGS[name].default if name in BROKER_CONFIGS else None):
            log.debug("%s is a Java-only setting: ignored", name)


# ---------------------------------------------------------------------------------------------------
# Protocol versions and cipher suites

def _versions(settings: Mapping[str, Any]) -> tuple[str, ...]:
    enabled = _list(settings, SSL_ENABLED_PROTOCOLS)
    if not enabled:
        protocol = _text(settings, SSL_PROTOCOL) or "TLSv1.3"
        if protocol not in _SSL_CONTEXT_PROTOCOLS:
            raise TlsConfigError(SSL_PROTOCOL, f"{protocol} SSLContext not available")
        usable = _SSL_CONTEXT_PROTOCOLS[protocol]
        if not usable:
            raise TlsConfigError(SSL_PROTOCOL, f"ssl.protocol {protocol} enables only protocol versions Java 17 "
                                               "disables: use TLSv1.2 or TLSv1.3")
        return usable
    unknown = [name for name in enabled if name not in _VERSIONS and name not in _DISABLED_VERSIONS]
    if unknown:
        raise TlsConfigError(SSL_ENABLED_PROTOCOLS, f"Unsupported protocol: {unknown[0]} (ssl.enabled.protocols "
                                                    "takes TLSv1.2 and TLSv1.3)")
    usable = tuple(name for name in ("TLSv1.2", "TLSv1.3") if name in enabled)
    if not usable:
        raise TlsConfigError(SSL_ENABLED_PROTOCOLS, f"No appropriate protocol: ssl.enabled.protocols "
                                                    f"{','.join(enabled)} holds only versions that are disabled "
                                                    "(as in Java 17): enable TLSv1.2 or TLSv1.3")
    ignored = [name for name in enabled if name in _DISABLED_VERSIONS]
    if ignored:
        log.warning("ssl.enabled.protocols: %s ignored (disabled, as Java 17 disables them)", ", ".join(ignored))
    return usable


_KEY_EXCHANGES = {
    "RSA": "", "ECDHE_RSA": "ECDHE-RSA", "ECDHE_ECDSA": "ECDHE-ECDSA", "DHE_RSA": "DHE-RSA", "DHE_DSS": "DHE-DSS",
    "DH_anon": "ADH", "ECDH_anon": "AECDH", "PSK": "PSK", "DHE_PSK": "DHE-PSK", "ECDHE_PSK": "ECDHE-PSK",
    "RSA_PSK": "RSA-PSK",
}
_CIPHER_PART = re.compile(
    r"(?:(?P<alg>AES|CAMELLIA|ARIA)_(?P<bits>\d+)_(?P<mode>GCM|CBC|CCM_8|CCM)(?:_(?P<mac>SHA\d*|MD5))?"
    r"|(?P<chacha>CHACHA20_POLY1305_SHA256)|(?P<tdes>3DES_EDE_CBC_SHA)|NULL_(?P<nullmac>SHA\d*|MD5))")


def openssl_cipher_name(name: str) -> str | None:
    """OpenSSL's name of a TLS 1.2 (or older) cipher suite named as Java / IANA name it
    (TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 -> ECDHE-RSA-AES256-GCM-SHA384), or None for a name of no
    known form. TLS 1.3 suites keep their name."""
    if name.startswith("SSL_"):
        name = "TLS_" + name[4:]
    if name in _TLS13_SUITES:
        return name
    match = re.fullmatch(r"TLS_(\w+?)_WITH_(\w+)", name)
    if match is None or match.group(1) not in _KEY_EXCHANGES:
        return None
    kx_name = match.group(1)
    kx = _KEY_EXCHANGES[kx_name]
    part = _CIPHER_PART.fullmatch(match.group(2))
    if part is None:
        return None
    psk = "PSK" in kx_name
    if part.group("chacha"):
        cipher = "CHACHA20-POLY1305"
    elif part.group("tdes"):
        if kx_name in ("DHE_RSA", "DHE_DSS"):
            kx = "EDH-" + kx_name[4:]
        cipher = "DES-CBC3-SHA"
    elif part.group("nullmac"):
        cipher = "NULL-" + part.group("nullmac")
    else:
        alg, bits, mode, mac = part.group("alg"), part.group("bits"), part.group("mode"), part.group("mac")
        if mode == "GCM":
            if mac is None:
                return None
            cipher = f"{alg}{bits}-GCM-{mac}"
        elif mode.startswith("CCM"):
            if mac is not None:
                return None
            cipher = f"{alg}{bits}-{mode.replace('_', '')}"
        else:
            if mac is None:
                return None
            cipher = f"{alg}{bits}-CBC-{mac}" if psk and alg == "AES" else f"{alg}{bits}-{mac}"
        if alg == "ARIA" and kx_name == "ECDHE_RSA":
            kx = "ECDHE"
    return f"{kx}-{cipher}" if kx else cipher


_KNOWN_CIPHERS: frozenset[str] | None = None


def _known_ciphers() -> frozenset[str]:
    global _KNOWN_CIPHERS
    if _KNOWN_CIPHERS is None:
        scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        scratch.set_ciphers("ALL:COMPLEMENTOFALL:@SECLEVEL=0")
        _KNOWN_CIPHERS = frozenset(cipher["name"] for cipher in scratch.get_ciphers())
    return _KNOWN_CIPHERS


def _apply_ciphers(context: ssl.SSLContext, settings: Mapping[str, Any], versions: tuple[str, ...]) -> tuple[str, ...]:
    """Apply ssl.cipher.suites; returns the protocol versions left usable."""
    suites = _list(settings, SSL_CIPHER_SUITES)
    if not suites:
        return versions
    known = _known_ciphers()
    tls12: list[str] = []
    tls13: list[str] = []
    for suite in suites:
        if suite in _SIGNALLING_SUITES:
            continue
        converted = suite if suite in known else openssl_cipher_name(suite)
        if converted is None or converted not in known:
            raise TlsConfigError(SSL_CIPHER_SUITES, f"Unsupported CipherSuite: {suite}")
        (tls13 if converted in _TLS13_SUITES else tls12).append(converted)
    usable = versions
    if not tls13:
        usable = tuple(v for v in usable if v != "TLSv1.3")
    if not tls12:
        usable = tuple(v for v in usable if v != "TLSv1.2")
    if not usable:
        raise TlsConfigError(SSL_CIPHER_SUITES, f"No appropriate protocol (protocol is disabled or cipher suites are "
                                                f"inappropriate): ssl.cipher.suites {','.join(suites)} has no suite "
                                                f"for ssl.enabled.protocols {','.join(versions)}")
    if tls12:
        try:
            context.set_ciphers(":".join(tls12))
        except ssl.SSLError:
            raise TlsConfigError(SSL_CIPHER_SUITES, f"No cipher of ssl.cipher.suites {','.join(suites)} can be used "
                                                    "by OpenSSL at its security level") from None
    if tls13 and "TLSv1.3" in usable:
        enabled13 = {c["name"] for c in context.get_ciphers() if c["name"] in _TLS13_SUITES}
        if not enabled13 <= set(tls13):
            log.warning("ssl.cipher.suites names only some TLS 1.3 suites (%s): Python's ssl module cannot restrict "
                        "TLS 1.3 suites, so all of OpenSSL's stay enabled (%s)", ", ".join(tls13),
                        ", ".join(sorted(enabled13)))
    return usable


def _apply_versions(context: ssl.SSLContext, versions: tuple[str, ...]) -> None:
    context.minimum_version = _VERSIONS[versions[0]]
    context.maximum_version = _VERSIONS[versions[-1]]


# ---------------------------------------------------------------------------------------------------
# Contexts

class _Built:
    """A context and the stores it was built from (what a dynamic update compares)."""

    __slots__ = ("context", "keystore", "truststore", "settings", "mode")

    def __init__(self, context, keystore, truststore, settings, mode):
        self.context = context
        self.keystore: SecurityStore | None = keystore
        self.truststore: SecurityStore | None = truststore
        self.settings = settings
        self.mode = mode

    def modified(self) -> bool:
        return any(store is not None and store.modified() for store in (self.keystore, self.truststore))


def _client_auth(settings: Mapping[str, Any]) -> int:
    value = _text(settings, SSL_CLIENT_AUTH) or "none"
    mode = _CLIENT_AUTH_MODES.get(value.upper())
    if mode is None:
        raise TlsConfigError(SSL_CLIENT_AUTH, f"Invalid value {value} for configuration {SSL_CLIENT_AUTH}: String must "
                                              "be one of: required, requested, none")
    return mode


def _endpoint_identification(settings: Mapping[str, Any]) -> bool:
    value = _text(settings, SSL_ENDPOINT_IDENTIFICATION)
    if not value:
        return False
    if value.lower() in ("https", "ldaps"):
        return True
    raise TlsConfigError(SSL_ENDPOINT_IDENTIFICATION, f"Unknown identification algorithm: {value} (use https, or an "
                                                      "empty value for no host name verification)")


def _build(settings: Mapping[str, Any], mode: str, *, check_hostname: bool | None = None) -> _Built:
    if mode not in ("server", "client"):
        raise ValueError(f"mode must be 'server' or 'client', not {mode!r}")
    settings = dict(settings)
    _check_common(settings)
    versions = _versions(settings)
    keystore = load_keystore(settings)
    truststore = load_truststore(settings)
    if mode == "server":
        if keystore is None:
            raise TlsConfigError(KEYSTORE_LOCATION, "An SSL listener needs a key store: set ssl.keystore.location (and "
                                                    "ssl.keystore.type / ssl.keystore.password), or ssl.keystore.type="
                                                    "PEM with ssl.keystore.key and ssl.keystore.certificate.chain")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.verify_mode = _client_auth(settings)
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        verify_host = _endpoint_identification(settings) if check_hostname is None else check_hostname
        context.check_hostname = verify_host
        context.verify_mode = ssl.CERT_REQUIRED
    context.options |= ssl.OP_NO_RENEGOTIATION | ssl.OP_NO_COMPRESSION
    usable = _apply_ciphers(context, settings, versions)
    _apply_versions(context, usable)
    if keystore is not None:
        load_key_entry_into(context, keystore.key_entry)
    if truststore is not None:
        load_trusted_into(context, truststore)
    elif mode == "client" or context.verify_mode != ssl.CERT_NONE:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH if mode == "client" else ssl.Purpose.CLIENT_AUTH)
    return _Built(context, keystore, truststore, settings, mode)


def server_context(settings: Mapping[str, Any]) -> ssl.SSLContext:
    """The server-side context of an SSL / SASL_SSL listener from its resolved ``ssl.*`` settings."""
    return _build(settings, "server").context


def client_context(settings: Mapping[str, Any]) -> ssl.SSLContext:
    """The broker's own client-side context (inter-broker): the key store is its client certificate, the trust
    store checks the server, ``ssl.endpoint.identification.algorithm`` switches the host name check."""
    return _build(settings, "client").context


def principal_mapper(settings: Mapping[str, Any]) -> SslPrincipalMapper:
    rules = _get(settings, SSL_PRINCIPAL_MAPPING_RULES)
    try:
        return SslPrincipalMapper(rules)
    except ValueError as exc:
        raise TlsConfigError(SSL_PRINCIPAL_MAPPING_RULES, str(exc)) from None


def peer_principal(ssl_object: ssl.SSLObject | ssl.SSLSocket | None, mapper: SslPrincipalMapper) -> KafkaPrincipal:
    """The principal of a TLS connection (Kafka's DefaultKafkaPrincipalBuilder): ANONYMOUS without a client
    certificate, else "User:" + its mapped RFC 2253 subject (NoMatchingRule when no rule applies)."""
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    return ssl_principal(der, mapper)


# ---------------------------------------------------------------------------------------------------
# Handshake check (Kafka's SslEngineValidator), in memory

def handshake_check(server: ssl.SSLContext, client: ssl.SSLContext, *, max_rounds: int = 64) -> ssl.SSLObject:
    """Complete a TLS handshake between ``server`` and ``client`` through memory buffers and return the
    server's side of it (the client's certificate: ``getpeercert``); raise ssl.SSLError (or RuntimeError when
    it does not finish) otherwise. The client must not check host names."""
    server_in, server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_in, client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_side = server.wrap_bio(server_in, server_out, server_side=True)
    client_side = client.wrap_bio(client_in, client_out, server_side=False)
    done = {"server": False, "client": False}
    for _ in range(max_rounds):
        for name, side in (("client", client_side), ("server", server_side)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        server_in.write(client_out.read())
        client_in.write(server_out.read())
        if done["server"] and done["client"]:
            # TLS 1.3: the server checks the client's certificate after the client has finished; let the
            # client read what the server sent last (an alert on failure).
            try:
                client_side.read(1)
            except ssl.SSLWantReadError:
                pass
            return server_side
    raise RuntimeError("the TLS handshake did not finish")


def _validation_pair(built: _Built) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server and a client context from one listener's settings (the client presents the key store and
    checks no host name, as Kafka's validator creates its engines)."""
    server = built.context if built.mode == "server" else _build(built.settings, "server").context
    client = _build(built.settings, "client", check_hostname=False).context
    return server, client


def _validate_pair(old: _Built, new: _Built) -> None:
    old_server, old_client = _validation_pair(old)
    new_server, new_client = _validation_pair(new) if new is not old else (old_server, old_client)
    handshake_check(old_server, new_client)
    handshake_check(new_server, old_client)


# ---------------------------------------------------------------------------------------------------
# Dynamic updates (SslFactory.reconfigure and CertificateEntries)

_SAN_TYPES = {"OtherName": 0, "RFC822Name": 1, "DNSName": 2, "DirectoryName": 4, "UniformResourceIdentifier": 6,
              "IPAddress": 7, "RegisteredID": 8}


def _subject_alt_names(certificate) -> frozenset:
    """X509Certificate.getSubjectAlternativeNames as a set of (type, value)."""
    from cryptography import x509

    try:
        extension = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return frozenset()
    names = set()
    for general in extension.value:
        kind = _SAN_TYPES.get(type(general).__name__, -1)
        if isinstance(general, x509.DirectoryName):
            value = rfc2253_name(general.value.public_bytes())
        elif isinstance(general, x509.OtherName):
            value = general.type_id.dotted_string + ":" + general.value.hex()
        elif isinstance(general, x509.RegisteredID):
            value = general.value.dotted_string
        else:
            value = str(general.value)
        names.add((kind, value))
    return frozenset(names)


def _java_dn_text(rfc2253: str) -> str:
    """The subject as X500Principal.toString() prints it in Kafka's message: RDNs joined by ", "."""
    return ", ".join(re.split(r"(?<!\\),", rfc2253))


def _san_text(names: Iterable) -> str:
    return "[" + ", ".join(f"[{kind}, {value}]" for kind, value in sorted(names)) + "]"


def _ensure_compatible(new: SecurityStore, old: SecurityStore, allow_dn: bool, allow_san: bool) -> None:
    from cryptography.hazmat.primitives import serialization

    new_entries = new.certificates()
    old_entries = old.certificates()
    if (not allow_dn or not allow_san) and len(new_entries) != len(old_entries):
        raise TlsConfigError(KEYSTORE_LOCATION, f"Keystore entries do not match, existing store contains "
                                                f"{len(old_entries)} entries, new store contains {len(new_entries)} entries")
    for (new_alias, new_cert), (old_alias, old_cert) in zip(new_entries, old_entries):
        if not allow_dn:
            new_dn = rfc2253_subject(new_cert.public_bytes(serialization.Encoding.DER))
            old_dn = rfc2253_subject(old_cert.public_bytes(serialization.Encoding.DER))
            if new_cert.subject != old_cert.subject and new_dn.lower() != old_dn.lower():
                raise TlsConfigError(KEYSTORE_LOCATION, f"Keystore DistinguishedName does not match:  existing={{alias="
                                                        f"{old_alias}, DN={_java_dn_text(old_dn)}}}, new={{alias="
                                                        f"{new_alias}, DN={_java_dn_text(new_dn)}}}")
        if not allow_san:
            new_sans = _subject_alt_names(new_cert)
            old_sans = _subject_alt_names(old_cert)
            if not old_sans <= new_sans:
                raise TlsConfigError(KEYSTORE_LOCATION, f"Keystore SubjectAltNames do not match:  existing={{alias="
                                                        f"{old_alias}, SAN={_san_text(old_sans)}}}, new={{alias="
                                                        f"{new_alias}, SAN={_san_text(new_sans)}}}")


class TlsContextHolder:
    """The current TLS context of one listener (``mode="server"``) or of the broker's client side on it
    (``mode="client"``), replaceable at run time as Kafka's SslFactory is. ``inter_broker`` turns on Kafka's
    keystoreVerifiableUsingTruststore check (the listener's own client must be able to connect to it)."""

    def __init__(self, settings: Mapping[str, Any], *, mode: str = "server", inter_broker: bool = False) -> None:
        self.mode = mode
        self.inter_broker = inter_broker
        self._lock = threading.Lock()
        self._validated: tuple[_Built, dict[str, Any], _Built] | None = None  # (base, settings, candidate)
        built = _build(settings, mode)
        self.mapper = principal_mapper(built.settings)
        if inter_broker:
            try:
                _validate_pair(built, built)
            except (ssl.SSLError, RuntimeError, OSError) as exc:
                raise TlsConfigError(KEYSTORE_LOCATION, "A client SSLEngine created with the provided settings can't "
                                                        f"connect to a server SSLEngine created with those settings: "
                                                        f"{_reason(exc)}") from None
        self._built = built

    @property
    def context(self) -> ssl.SSLContext:
        """The context for the next connection (read it once per connection)."""
        return self._built.context

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self._built.settings)

    @property
    def keystore(self) -> SecurityStore | None:
        return self._built.keystore

    def principal(self, ssl_object) -> KafkaPrincipal:
        return peer_principal(ssl_object, self.mapper)

    def _next_settings(self, new_settings: Mapping[str, Any]) -> dict[str, Any]:
        merged = dict(self._built.settings)
        for name in RECONFIGURABLE_CONFIGS:
            if name in new_settings:
                merged[name] = new_settings[name]
        return merged

    def _candidate(self, new_settings: Mapping[str, Any] | None) -> _Built | None:
        current = self._built
        merged = dict(current.settings) if new_settings is None else self._next_settings(new_settings)
        if merged == current.settings and not current.modified():
            return None
        # The cause's Java class leads its text, as Kafka prints the exception it wraps ("failed: " + e).
        cause = "org.apache.kafka.common.errors.InvalidConfigurationException"
        try:
            candidate = _build(merged, self.mode)
            cause = "org.apache.kafka.common.config.ConfigException"
            if current.keystore is None:
                if candidate.keystore is not None:
                    raise TlsConfigError(KEYSTORE_LOCATION, "Cannot add SSL keystore to an existing listener for which "
                                                            "no keystore was configured.")
            else:
                if candidate.keystore is None:
                    raise TlsConfigError(KEYSTORE_LOCATION, "Cannot remove the SSL keystore from an existing listener "
                                                            "for which a keystore was configured.")
                _ensure_compatible(candidate.keystore, current.keystore, _bool(merged, SSL_ALLOW_DN_CHANGES),
                                   _bool(merged, SSL_ALLOW_SAN_CHANGES))
            if current.truststore is None and candidate.truststore is not None:
                raise TlsConfigError("ssl.truststore.location", "Cannot add SSL truststore to an existing listener for "
                                                                "which no truststore was configured.")
            if self.inter_broker and (current.truststore is not None or current.keystore is not None):
                try:
                    _validate_pair(current, candidate)
                except (ssl.SSLError, RuntimeError, OSError) as exc:
                    cause = "javax.net.ssl.SSLHandshakeException"
                    raise TlsConfigError(KEYSTORE_LOCATION, f"the old and the new SSL settings cannot complete a "
                                                            f"handshake with each other: {_reason(exc)}") from None
        except TlsConfigError as exc:
            log.error("Validation of dynamic config update of SSLFactory failed: %s", exc.message)
            raise TlsConfigError(exc.name, f"Validation of dynamic config update of SSLFactory failed: "
                                           f"{cause}: {exc.message}") from None
        return candidate

    def validate_reconfiguration(self, new_settings: Mapping[str, Any]) -> None:
        """Raise TlsConfigError if ``reconfigure(new_settings)`` would be refused; change nothing. The
        validated context is kept for a ``reconfigure`` with the same settings (built once, not twice)."""
        base = self._built
        candidate = self._candidate(new_settings)
        self._validated = None if candidate is None else (base, candidate.settings, candidate)

    def reconfigure(self, new_settings: Mapping[str, Any] | None = None) -> bool:
        """Rebuild from ``new_settings`` (None: the current settings, to pick up changed store files); True
        when a new context was swapped in, False when nothing changed. Raises TlsConfigError and keeps the
        old context when the update is refused. The context ``validate_reconfiguration`` built for the same
        settings is taken as it is, unless the holder or a store file changed since."""
        with self._lock:
            validated, self._validated = self._validated, None
            merged = dict(self._built.settings) if new_settings is None else self._next_settings(new_settings)
            if (validated is not None and validated[0] is self._built and validated[1] == merged
                    and not validated[2].modified()):
                candidate = validated[2]
            else:
                candidate = self._candidate(new_settings)
            if candidate is None:
                return False
            self._built = candidate
        entry = candidate.keystore.key_entry if candidate.keystore is not None else None
        log.info("Created new %s SSL context with keystore %s%s truststore %s", self.mode.upper(), candidate.keystore,
                 f" (certificate serial {entry.chain[0].serial_number})" if entry is not None else "",
                 candidate.truststore)
        return True


class ListenerTlsReloader:
    """Kafka's DynamicListenerConfig for TLS: the server-side holder of every SSL listener and the client-side
    holder of the inter-broker client, each reconfigured from its listener's view of the broker's effective
    configs (``listener.name.<l>.ssl.*`` wins), as Kafka reconfigures every listener's SslFactory and its
    inter-broker client channel builders. ``holders``: listener name -> server holder; ``protocols``: listener
    name -> security protocol; ``client``: (inter-broker listener name, client holder) or None."""

    def __init__(self, holders: Mapping[str, TlsContextHolder], protocols: Mapping[str, str],
                 client: tuple[str, TlsContextHolder] | None = None) -> None:
        self._targets = [(name, holder) for name, holder in holders.items()]
        if client is not None:
            self._targets.append(client)
        self._protocols = dict(protocols)
        self._scheduled: asyncio.Task | None = None

    def _views(self, values: Mapping[str, Any]):
        for name, holder in self._targets:
            yield name, holder, listener_ssl_configs(values, name, self._protocols.get(name))

    def validate(self, values: Mapping[str, Any]) -> None:
        """TlsConfigError (Kafka's "Validation of dynamic config update of SSLFactory failed: ...") if any
        holder would refuse these configs; nothing changes."""
        for _, holder, view in self._views(values):
            holder.validate_reconfiguration(view)

    def reconfigure_soon(self, values: Mapping[str, Any]) -> "asyncio.Task[list[str]]":
        """``reconfigure(values)`` in a worker thread (files are read, keys checked, contexts built: tenths
        of a second the event loop must not wait), after any reconfiguration scheduled before; the task."""
        previous = self._scheduled

        async def run() -> list[str]:
            if previous is not None:
                await asyncio.gather(previous, return_exceptions=True)
            return await asyncio.to_thread(self.reconfigure, values)

        self._scheduled = asyncio.get_running_loop().create_task(run(), name="tls-reconfigure")
        return self._scheduled

    def reconfigure(self, values: Mapping[str, Any]) -> list[str]:
        """Swap in new contexts where a setting or a store file changed; a holder that refuses keeps its
        context (logged). The listeners whose context changed ("<name> (client)" for the client's).
        Blocking (files, key checks): on the event loop use ``reconfigure_soon``."""
        changed = []
        for name, holder, view in self._views(values):
            try:
                if holder.reconfigure(view):
                    changed.append(name if holder.mode == "server" else f"{name} (client)")
            except TlsConfigError as exc:
                log.error("listener %s: the %s TLS context keeps its certificate: %s", name, holder.mode, exc.message)
        return changed


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or exc.strerror or str(exc)
    return str(exc)

"""TLS and SASL settings of the client commands and the console: Kafka's client properties file
(``--command-config FILE``, as Kafka's tools take it) translated to librdkafka's settings, and librdkafka's
settings (after ``-X``) turned into a :class:`pykbroker.protocol.client.ClientSecurity` for pykbroker's own
protocol client (the bootstrap probe, FindCoordinator, ApiVersions per broker, Metadata + DescribeConfigs of
pykbroker.ctl.coordination, the console's DescribeLogDirs), so that every connection a command opens speaks
the same TLS and SASL.

Kafka property -> librdkafka (:func:`librdkafka_settings`)
    * ``security.protocol``, ``sasl.mechanism``, ``sasl.username`` / ``sasl.password``, ``client.id``: the same.
    * ``sasl.jaas.config``: PlainLoginModule / ScramLoginModule ``username`` / ``password`` ->
      ``sasl.username`` / ``sasl.password``; OAuthBearerLoginModule with its unsecured options
      (``unsecuredLoginStringClaim_sub``, ``unsecuredLoginLifetimeSeconds``, ``unsecuredLoginScopeClaimName``,
      ``unsecuredLoginListClaim_scope``, ``unsecuredLoginExtension_<name>``) -> librdkafka's unsecured JWT
      (``enable.sasl.oauthbearer.unsecure.jwt``, ``sasl.oauthbearer.config``). Another login module is refused.
    * ``ssl.truststore.location``: a PEM file -> ``ssl.ca.location``; ``ssl.truststore.certificates`` (PEM in
      the file) -> ``ssl.ca.pem``. A JKS or PKCS12 trust store is refused (librdkafka reads no trust store):
      the message gives the keytool / openssl command that makes the PEM file.
    * ``ssl.keystore.location``: PKCS12 -> ``ssl.keystore.location`` + ``ssl.keystore.password``; PEM (key and
      certificate chain in one file) -> ``ssl.certificate.location`` + ``ssl.key.location`` (the same file);
      ``ssl.keystore.certificate.chain`` / ``ssl.keystore.key`` -> ``ssl.certificate.pem`` / ``ssl.key.pem``;
      ``ssl.key.password`` -> ``ssl.key.password``. JKS is refused as above.
    * ``ssl.endpoint.identification.algorithm``: empty -> ``none``, ``https`` -> ``https``.
    * ``ssl.cipher.suites``: Java names -> OpenSSL's (security/tls.py's table).
    * Java-only settings without a librdkafka counterpart that change nothing here (``ssl.protocol``,
      ``ssl.enabled.protocols``, ``ssl.*.type``, ``ssl.keymanager.algorithm``, ``ssl.trustmanager.algorithm``,
      ``ssl.provider``, ``ssl.secure.random.implementation``) are dropped; any other name is passed as it is
      (librdkafka takes many of Kafka's names: ``request.timeout.ms``, ``retries``...) and one it does not know
      is a usage error naming it.

Every failure is a :class:`CommandConfigError` naming the file and the setting, never a password.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

__all__ = ("CommandConfigError", "load_command_config", "librdkafka_settings", "client_security")

_DROPPED = frozenset({"ssl.protocol", "ssl.enabled.protocols", "ssl.truststore.type", "ssl.keystore.type",
                      "ssl.keymanager.algorithm", "ssl.trustmanager.algorithm", "ssl.provider",
                      "ssl.secure.random.implementation", "ssl.truststore.password"})
_UNSECURED_PREFIX = "unsecuredLogin"


class CommandConfigError(ValueError):
    """A setting that cannot be translated or used (the caller reports it as a usage error)."""


def load_command_config(path: str | os.PathLike) -> dict[str, str]:
    """The Kafka client properties in ``path`` (Java .properties syntax), translated: librdkafka settings."""
    from pykbroker.config import parse_properties

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CommandConfigError(f"--command-config {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        return librdkafka_settings(parse_properties(text))
    except CommandConfigError as exc:
        raise CommandConfigError(f"--command-config {path}: {exc}") from None


def _store_kind(path: str, declared: str | None) -> str:
    """PEM, PKCS12 or JKS: the declared type, else what the file holds (Kafka's default type is JKS)."""
    if declared:
        return declared.upper()
    try:
        head = Path(path).read_bytes()[:4096]
    except OSError as exc:
        raise CommandConfigError(f"cannot read {path} ({exc.strerror or exc})") from None
    if b"-----BEGIN" in head:
        return "PEM"
    return "JKS" if head[:4] == b"\xfe\xed\xfe\xed" else "PKCS12"


def _refuse_store(setting: str, kind: str, what: str) -> CommandConfigError:
    if what == "trust store":
        how = ("keytool -exportcert -rfc -keystore STORE -alias ALIAS > ca.pem" if kind == "JKS"
               else "openssl pkcs12 -in STORE -nokeys -out ca.pem")
        return CommandConfigError(f"{setting}: a {kind} trust store cannot be used by librdkafka: use a PEM file "
                                  f"({how}) with ssl.truststore.type=PEM")
    return CommandConfigError(f"{setting}: a {kind} key store cannot be used by librdkafka: use PKCS12 "
                              "(keytool -importkeystore -deststoretype PKCS12) or PEM (ssl.keystore.type=PEM)")


def _jaas_settings(text: str) -> dict[str, str]:
    from pykbroker.security.jaas import (
        OAUTHBEARER_LOGIN_MODULE, PLAIN_LOGIN_MODULE, SCRAM_LOGIN_MODULE, JaasConfigError, parse_jaas_config,
    )

    try:
        entries = parse_jaas_config(text)
    except JaasConfigError as exc:
        raise CommandConfigError(f"sasl.jaas.config: {exc}") from None
    if len(entries) != 1:
        raise CommandConfigError(f"sasl.jaas.config: expected one login module, found {len(entries)}")
    entry = entries[0]
    options = dict(entry.options)
    if entry.login_module in (PLAIN_LOGIN_MODULE, SCRAM_LOGIN_MODULE):
        if "username" not in options or "password" not in options:
            raise CommandConfigError(f"sasl.jaas.config: {entry.login_module.rsplit('.', 1)[-1]} needs username "
                                     "and password options")
        return {"sasl.username": options["username"], "sasl.password": options["password"]}
    if entry.login_module == OAUTHBEARER_LOGIN_MODULE:
        parts = []
        for name, value in options.items():
            if name == "unsecuredLoginStringClaim_sub":
                parts.append(f"principal={value}")
            elif name == "unsecuredLoginLifetimeSeconds":
                parts.append(f"lifeSeconds={value}")
            elif name == "unsecuredLoginScopeClaimName":
                parts.append(f"scopeClaimName={value}")
            elif name == "unsecuredLoginListClaim_scope":
                parts.append(f"scope={value}")
            elif name.startswith("unsecuredLoginExtension_"):
                parts.append(f"extension_{name[len('unsecuredLoginExtension_'):]}={value}")
            else:
                raise CommandConfigError(f"sasl.jaas.config: OAuthBearerLoginModule option {name} has no librdkafka "
                                         "counterpart (only the unsecured JWT options are translated; for a token "
                                         "endpoint use -X sasl.oauthbearer.method=oidc and its settings)")
        if not any(part.startswith("principal=") for part in parts):
            raise CommandConfigError("sasl.jaas.config: OAuthBearerLoginModule needs unsecuredLoginStringClaim_sub")
        return {"enable.sasl.oauthbearer.unsecure.jwt": "true", "sasl.oauthbearer.config": " ".join(parts)}
    raise CommandConfigError(f"sasl.jaas.config: login module {entry.login_module} cannot be translated for "
                             "librdkafka (PlainLoginModule, ScramLoginModule and OAuthBearerLoginModule can)")


def librdkafka_settings(props: Mapping[str, str]) -> dict[str, str]:
    """Kafka (Java) client properties -> librdkafka settings (the module docstring says how)."""
    from pykbroker.security.tls import openssl_cipher_name

    out: dict[str, str] = {}
    for name, value in props.items():
        if name in _DROPPED or name.startswith("ssl.truststore.") or name.startswith("ssl.keystore."):
            continue
        if name == "sasl.jaas.config":
            out.update(_jaas_settings(value))
        elif name == "ssl.endpoint.identification.algorithm":
            out[name] = value.strip() or "none"
        elif name == "ssl.cipher.suites":
            names = [openssl_cipher_name(s.strip()) or s.strip() for s in value.split(",") if s.strip()]
            if names:
                out[name] = ":".join(names)
        elif name in ("sasl.login.callback.handler.class", "sasl.client.callback.handler.class",
                      "ssl.engine.factory.class"):
            raise CommandConfigError(f"{name} names a Java class, which librdkafka cannot load")
        else:
            out[name] = value
    if props.get("ssl.truststore.location"):
        location = props["ssl.truststore.location"]
        kind = _store_kind(location, props.get("ssl.truststore.type"))
        if kind != "PEM":
            raise _refuse_store("ssl.truststore.location", kind, "trust store")
        out["ssl.ca.location"] = location
    if props.get("ssl.truststore.certificates"):
        out["ssl.ca.pem"] = props["ssl.truststore.certificates"]
    if props.get("ssl.keystore.location"):
        location = props["ssl.keystore.location"]
        kind = _store_kind(location, props.get("ssl.keystore.type"))
        if kind == "PKCS12":
            out["ssl.keystore.location"] = location
            if props.get("ssl.keystore.password"):
                out["ssl.keystore.password"] = props["ssl.keystore.password"]
        elif kind == "PEM":
            out["ssl.certificate.location"] = out["ssl.key.location"] = location
        else:
            raise _refuse_store("ssl.keystore.location", kind, "key store")
    if props.get("ssl.keystore.certificate.chain") or props.get("ssl.keystore.key"):
        if not (props.get("ssl.keystore.certificate.chain") and props.get("ssl.keystore.key")):
            raise CommandConfigError("ssl.keystore.certificate.chain and ssl.keystore.key go together")
        out["ssl.certificate.pem"] = props["ssl.keystore.certificate.chain"]
        out["ssl.key.pem"] = props["ssl.keystore.key"]
    return out


def _protocol(settings: Mapping[str, Any]) -> str:
    return str(settings.get("security.protocol") or "plaintext").upper()


def uses_tls(settings: Mapping[str, Any]) -> bool:
    return _protocol(settings) in ("SSL", "SASL_SSL")


def _read(path: str, setting: str) -> str:
    try:
        return Path(path).read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise CommandConfigError(f"{setting}: cannot read {path} ({exc.strerror or exc})") from None


def _ssl_context(settings: Mapping[str, Any]) -> Any:
    """The client-mode TLS context for librdkafka's ``ssl.*`` settings, built by security/tls.py from their
    Kafka equivalents."""
    import ssl

    from pykbroker.config import ConfigError
    from pykbroker.security.tls import client_context

    kafka: dict[str, Any] = {}
    ca = settings.get("ssl.ca.location")
    if ca and os.path.isfile(str(ca)):
        kafka.update({"ssl.truststore.type": "PEM", "ssl.truststore.certificates": _read(str(ca), "ssl.ca.location")})
    elif settings.get("ssl.ca.pem"):
        kafka.update({"ssl.truststore.type": "PEM", "ssl.truststore.certificates": str(settings["ssl.ca.pem"])})
    cert = settings.get("ssl.certificate.pem") or (
        _read(str(settings["ssl.certificate.location"]), "ssl.certificate.location")
        if settings.get("ssl.certificate.location") else None)
    key = settings.get("ssl.key.pem") or (
        _read(str(settings["ssl.key.location"]), "ssl.key.location") if settings.get("ssl.key.location") else None)
    if cert and key:
        kafka.update({"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": cert, "ssl.keystore.key": key})
        if settings.get("ssl.key.password"):
            kafka["ssl.key.password"] = str(settings["ssl.key.password"])
    elif settings.get("ssl.keystore.location"):
        kafka.update({"ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(settings["ssl.keystore.location"]),
                      "ssl.keystore.password": str(settings.get("ssl.keystore.password") or "")})
    algorithm = str(settings.get("ssl.endpoint.identification.algorithm", "https")).lower()
    kafka["ssl.endpoint.identification.algorithm"] = "" if algorithm == "none" else algorithm
    try:
        context = client_context(kafka)
    except ConfigError as exc:
        raise CommandConfigError(str(exc.message if hasattr(exc, "message") else exc)) from None
    if str(settings.get("enable.ssl.certificate.verification", "true")).lower() == "false":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def before_sasl(security: Any) -> Any:
    """The security to ask what Kafka answers before authentication (ApiVersions) with: without the SASL
    exchange when the protocol client does not speak the mechanism."""
    if security is None or security.authenticates:
        return security
    from pykbroker.protocol.client import ClientSecurity

    return ClientSecurity(ssl_context=security.ssl_context, description=security.description)


def client_security(settings: Mapping[str, Any]) -> Any:
    """A ClientSecurity for pykbroker's protocol client from librdkafka's settings (None for PLAINTEXT), with
    ``authenticates`` telling whether it runs the SASL exchange: PLAIN and SCRAM are spoken; with another
    mechanism (OAUTHBEARER, GSSAPI) the protocol client stops before SASL, so only what Kafka allows before
    authentication (ApiVersions) can be asked."""
    from pykbroker.protocol.client import ClientSecurity
    from pykbroker.security.sasl.client import CLIENT_MECHANISMS, sasl_client

    protocol = _protocol(settings)
    if protocol == "PLAINTEXT":
        return None
    if protocol not in ("SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise CommandConfigError(f"security.protocol={settings.get('security.protocol')}: expected PLAINTEXT, SSL, "
                                 "SASL_PLAINTEXT or SASL_SSL")
    context = _ssl_context(settings) if uses_tls(settings) else None
    sasl = None
    mechanism = str(settings.get("sasl.mechanism") or settings.get("sasl.mechanisms") or "GSSAPI").upper()
    if protocol.startswith("SASL") and mechanism in CLIENT_MECHANISMS:
        username, password = str(settings.get("sasl.username") or ""), str(settings.get("sasl.password") or "")
        sasl = lambda: sasl_client(mechanism, username, password)  # noqa: E731
    security = ClientSecurity(ssl_context=(lambda: context) if context is not None else None, sasl=sasl,
                              description=f"{protocol}{'/' + mechanism if protocol.startswith('SASL') else ''}")
    security.authenticates = sasl is not None or not protocol.startswith("SASL")  # type: ignore[attr-defined]
    return security

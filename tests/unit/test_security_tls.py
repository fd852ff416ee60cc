"""TLS contexts from Kafka's ssl.* settings (pykbroker/security/tls.py, keystores.py): every key store type,
mutual TLS, protocol and cipher limits, host name checks, reloads and their refusals, the principal of a TLS
connection and clear errors for bad input. Certificates are made here with cryptography; handshakes are real,
over 127.0.0.1, between an asyncio server accepting as the broker will (``connect_accepted_socket`` with the
holder's current context) and Python's ssl client. Messages said to be Kafka's (DN / SAN change refusals, the
key store rules of createKeystore / createTruststore, "keystore password was incorrect", "Unsupported
CipherSuite", "<x> SSLContext not available", "<x> KeyStore not available") were compared with Kafka 3.7.1's own
SslFactory run on the same stores."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import ssl
import stat
import subprocess

import pytest

cryptography = pytest.importorskip("cryptography", reason="certificates for these tests are built with cryptography")
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec, ed25519  # noqa: E402
from cryptography.hazmat.primitives.serialization import pkcs12  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

from pykbroker.config import ConfigError  # noqa: E402
from pykbroker.security import keystores, tls  # noqa: E402
from pykbroker.security.principal import ANONYMOUS, KafkaPrincipal, NoMatchingRule  # noqa: E402
from pykbroker.security.tls import (  # noqa: E402
    TlsConfigError, TlsContextHolder, client_context, listener_ssl_configs, openssl_cipher_name, server_context,
)
from tls_helpers import PEM, Pki, chain_pem, key_pem, p12, standard_pki  # noqa: E402

# ---------------------------------------------------------------------------------------------------
# Certificates (tests/tls_helpers.py)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return standard_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory):
    other = Pki(tmp_path_factory.mktemp("other-pki"), name="Other CA")
    other.broker_key, other.broker = other.issue("broker")
    return other


def pem_settings(pki, **extra):
    """A broker's PEM-file key store and PEM trust store."""
    settings = {"ssl.keystore.type": "PEM", "ssl.keystore.location": pki.broker_pem_file,
                "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file}
    settings.update(extra)
    return settings


def plain_client(pki, *, cert_file=None, hostname_check=True, max_version=None, min_version=None, ciphers=None):
    """Python's own client context (not pykbroker's): trusts the test CA, optionally presents a certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = hostname_check
    context.load_verify_locations(cafile=pki.ca_file)
    if cert_file:
        context.load_cert_chain(cert_file)
    if max_version:
        context.maximum_version = max_version
    if min_version:
        context.minimum_version = min_version
    if ciphers:
        context.set_ciphers(ciphers)
    return context


# ---------------------------------------------------------------------------------------------------
# A TLS server as the broker will run one: accept, then connect_accepted_socket with the current context

class Server:
    def __init__(self, context_of):
        self.context_of = context_of  # called per connection: a holder's current context
        self.failures: list[BaseException] = []
        self.principals: list = []
        self.peer_certificates: list = []  # the client certificates (DER) of the connections accepted
        self.mapper = None
        self._tasks: set = set()

    async def __aenter__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self._acceptor = asyncio.ensure_future(self._accept())
        return self

    async def __aexit__(self, *exc):
        self._acceptor.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(self._acceptor, *self._tasks, return_exceptions=True)
        self.sock.close()

    async def _accept(self):
        loop = asyncio.get_running_loop()
        while True:
            accepted, _ = await loop.sock_accept(self.sock)
            task = asyncio.ensure_future(self._serve(accepted))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, accepted):
        loop = asyncio.get_running_loop()
        server = self

        class Echo(asyncio.Protocol):
            def connection_made(self, transport):
                self.transport = transport
                obj = transport.get_extra_info("ssl_object")
                mapper = server.mapper or tls.principal_mapper({})
                try:
                    principal = str(tls.peer_principal(obj, mapper))
                except NoMatchingRule as exc:
                    server.failures.append(exc)
                    transport.abort()
                    return
                server.principals.append(principal)
                server.peer_certificates.append(obj.getpeercert(binary_form=True))
                transport.write(f"{principal}|{obj.version()}|{obj.cipher()[0]}\n".encode())

            def data_received(self, data):
                self.transport.write(data)

        try:
            await loop.connect_accepted_socket(Echo, accepted, ssl=self.context_of(), ssl_handshake_timeout=20)
        except (ssl.SSLError, ConnectionError, OSError, asyncio.TimeoutError) as exc:
            self.failures.append(exc)
            accepted.close()


async def talk(port, context, hostname="localhost"):
    """Connect, read the server's first line (principal|version|cipher), check the echo; return the line."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=hostname)
    try:
        line = (await asyncio.wait_for(reader.readline(), 20)).decode().strip()
        if not line:
            raise ConnectionError("closed by the server")
        writer.write(b"ping\n")
        assert await asyncio.wait_for(reader.readline(), 20) == b"ping\n"
        return line, writer.get_extra_info("ssl_object").getpeercert(binary_form=True), (reader, writer)
    except BaseException:
        writer.close()
        raise


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 60))


def handshake(server_ctx, client_ctx, hostname="localhost", mapper=None):
    """(line, peer certificate DER, server failures) of one connection; raises what the client saw."""
    async def go():
        async with Server(lambda: server_ctx) as server:
            server.mapper = mapper
            try:
                line, cert, (_, writer) = await talk(server.port, client_ctx, hostname)
                writer.close()
                return line, cert, server.failures
            except (ssl.SSLError, ConnectionError, OSError) as exc:
                exc.server_failures = server.failures
                raise
    return run(go())


def served_cert_cn(der):
    return x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value


# ---------------------------------------------------------------------------------------------------
# Settings resolution

def test_listener_prefix_wins_over_plain_key_and_other_listeners_are_ignored():
    values = {"ssl.keystore.location": "/plain.p12", "ssl.client.auth": "required",
              "listener.name.internal.ssl.keystore.location": "/internal.p12",
              "listener.name.external.ssl.keystore.location": "/external.p12",
              "ssl.principal.mapping.rules": "DEFAULT", "num.partitions": 3}
    resolved = listener_ssl_configs(values, "INTERNAL", "SSL")
    assert resolved["ssl.keystore.location"] == "/internal.p12"
    assert resolved["ssl.client.auth"] == "required"
    assert "num.partitions" not in resolved
    assert listener_ssl_configs(values, "OTHER", "SSL")["ssl.keystore.location"] == "/plain.p12"


def test_a_brokers_typed_config_with_listener_overrides_builds_its_context(pki):
    """BrokerConfig holds every ssl.* key with Kafka's typed default (JKS, lists, booleans): the per-listener PEM
    key store wins and the rest comes from the defaults."""
    from pykbroker.config import BrokerConfig

    config = BrokerConfig(values={"listener.name.ssl.ssl.keystore.type": "PEM",
                                  "listener.name.ssl.ssl.keystore.location": pki.broker_pem_file,
                                  "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file,
                                  "ssl.client.auth": "required"})
    settings = listener_ssl_configs(config.values, "SSL", "SSL")
    assert settings["ssl.keystore.type"] == "PEM" and settings["ssl.enabled.protocols"] == ["TLSv1.2", "TLSv1.3"]
    holder = TlsContextHolder(settings, inter_broker=True)
    assert holder.context.verify_mode == ssl.CERT_REQUIRED
    assert handshake(holder.context, plain_client(pki, cert_file=pki.client_pem_file))[0].startswith("User:CN=client,")
    with pytest.raises(TlsConfigError, match="of type JKS: Invalid keystore format"):
        server_context(listener_ssl_configs({**config.values, "ssl.keystore.location": pki.broker_pem_file,
                                             "ssl.keystore.password": "x"}, "OTHER", "SSL"))


def test_sasl_ssl_listener_takes_ssl_client_auth_only_with_the_listener_prefix(caplog):
    values = {"ssl.client.auth": "required"}
    with caplog.at_level(logging.WARNING, logger="pykbroker.security.tls"):
        assert listener_ssl_configs(values, "SASL_SSL", "SASL_SSL")["ssl.client.auth"] == "none"
    assert "applied only to SSL listeners" in caplog.text
    values["listener.name.sasl_ssl.ssl.client.auth"] = "requested"
    assert listener_ssl_configs(values, "SASL_SSL", "SASL_SSL")["ssl.client.auth"] == "requested"
    assert listener_ssl_configs({"ssl.client.auth": "required"}, "SSL", "SSL")["ssl.client.auth"] == "required"


# ---------------------------------------------------------------------------------------------------
# Key store types: a real handshake each

def test_pem_file_keystore_and_pem_file_truststore(pki):
    line, cert, failures = handshake(server_context(pem_settings(pki)), plain_client(pki))
    assert line.startswith("User:ANONYMOUS|")
    assert served_cert_cn(cert) == "broker" and not failures


def test_pem_in_config_keystore_with_encrypted_key_and_pem_truststore_certificates(pki):
    settings = {"ssl.keystore.type": "PEM", "ssl.keystore.key": key_pem(pki.broker_key, "keypass"),
                "ssl.keystore.certificate.chain": chain_pem(pki.broker, pki), "ssl.key.password": "keypass",
                "ssl.truststore.type": "PEM", "ssl.truststore.certificates": pki.ca_pem()}
    line, cert, _ = handshake(server_context(settings), plain_client(pki))
    assert served_cert_cn(cert) == "broker"


def test_pem_folded_onto_one_line_as_a_properties_file_gives_it(pki):
    one_line = " ".join(chain_pem(pki.broker, pki).split("\n"))
    key_line = " ".join(key_pem(pki.broker_key).split("\n"))
    settings = {"ssl.keystore.type": "PEM", "ssl.keystore.key": key_line, "ssl.keystore.certificate.chain": one_line}
    _, cert, _ = handshake(server_context(settings), plain_client(pki))
    assert served_cert_cn(cert) == "broker"


def test_encrypted_pem_file_with_key_password(pki):
    path = pki.write("broker-enc.pem", key_pem(pki.broker_key, "s3cret") + chain_pem(pki.broker, pki))
    settings = {"ssl.keystore.type": "PEM", "ssl.keystore.location": path, "ssl.key.password": "s3cret"}
    _, cert, _ = handshake(server_context(settings), plain_client(pki))
    assert served_cert_cn(cert) == "broker"


@pytest.mark.parametrize("declared", ["PKCS12", "pkcs12", "JKS"])
def test_pkcs12_keystore_and_truststore(pki, declared):
    """PKCS12 under its own type (any case, as Java's KeyStore.getInstance) and under Kafka's default JKS
    (Java 9+ reads a PKCS12 file as JKS too)."""
    keystore = pki.write("broker.p12", p12(pki.broker_key, pki.broker, pki, "storepass"))
    truststore = pki.write("trust.p12", pkcs12.serialize_key_and_certificates(
        None, None, None, [pki.ca], serialization.BestAvailableEncryption(b"trustpass")))
    settings = {"ssl.keystore.type": declared, "ssl.keystore.location": keystore, "ssl.keystore.password": "storepass",
                "ssl.truststore.type": declared, "ssl.truststore.location": truststore,
                "ssl.truststore.password": "trustpass", "ssl.client.auth": "required"}
    holder = TlsContextHolder(settings)
    assert holder.keystore.key_entry.alias == "broker"
    assert [c.subject for c in holder.keystore.key_entry.chain] == [pki.broker.subject, pki.ca.subject]
    line, cert, _ = handshake(holder.context, plain_client(pki, cert_file=pki.client_pem_file))
    assert line.startswith("User:CN=client,OU=apps,O=pykbroker|")
    assert served_cert_cn(cert) == "broker"


def test_the_private_key_never_reaches_a_file_in_clear(pki, monkeypatch):
    """Without memfd: a 0600 file in a 0700 directory of its own, holding the key encrypted, gone after."""
    monkeypatch.delattr(os, "memfd_create", raising=False)
    seen = {}
    real = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)

    class Spy:
        def load_cert_chain(self, path, password=None):
            seen["path"] = path
            seen["file_mode"] = stat.S_IMODE(os.stat(path).st_mode)
            seen["dir_mode"] = stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode)
            with open(path, "rb") as handle:
                seen["text"] = handle.read()
            real.load_cert_chain(path, password=password)

    entry = keystores.load_keystore(pem_settings(pki)).key_entry
    keystores.load_key_entry_into(Spy(), entry)
    assert seen["file_mode"] == 0o600 and seen["dir_mode"] == 0o700
    assert b"BEGIN ENCRYPTED PRIVATE KEY" in seen["text"] and b"BEGIN PRIVATE KEY" not in seen["text"]
    assert not os.path.exists(seen["path"]) and not os.path.exists(os.path.dirname(seen["path"]))


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd is Linux's")
def test_with_memfd_no_file_is_created(pki, monkeypatch):
    monkeypatch.setattr(keystores.tempfile, "mkdtemp", lambda **_: pytest.fail("a temporary directory was made"))
    server_context(pem_settings(pki))


# ---------------------------------------------------------------------------------------------------
# ssl.client.auth and the principal

def test_client_auth_required_refuses_a_client_without_certificate(pki):
    context = server_context(pem_settings(pki, **{"ssl.client.auth": "required"}))
    with pytest.raises((ssl.SSLError, ConnectionError)) as info:
        handshake(context, plain_client(pki))
    assert any("certificate" in str(f).lower() for f in info.value.server_failures)


def test_client_auth_required_with_certificate_maps_the_principal(pki):
    settings = pem_settings(pki, **{"ssl.client.auth": "REQUIRED",
                                    "ssl.principal.mapping.rules": "RULE:^CN=(.*?),OU=(.*?),O=.*$/$1@$2/U,DEFAULT"})
    holder = TlsContextHolder(settings)
    line, _, _ = handshake(holder.context, plain_client(pki, cert_file=pki.client_pem_file), mapper=holder.mapper)
    assert line.split("|")[0] == "User:CLIENT@APPS"


def test_client_auth_requested_anonymous_without_certificate_user_with_one(pki):
    context = server_context(pem_settings(pki, **{"ssl.client.auth": "requested"}))
    assert handshake(context, plain_client(pki))[0].startswith("User:ANONYMOUS|")
    assert handshake(context, plain_client(pki, cert_file=pki.client_pem_file))[0].startswith(
        "User:CN=client,OU=apps,O=pykbroker|")


def test_client_auth_requested_refuses_an_untrusted_certificate(pki, other_pki):
    """Kafka 3.7.1's server engine with ssl.client.auth=requested does the same (checked with its
    DefaultSslEngineFactory and openssl s_client: "PKIX path building failed", alert certificate_unknown)."""
    stranger = other_pki.write("stranger.pem", key_pem(other_pki.broker_key) + other_pki.broker.public_bytes(PEM).decode())
    context = server_context(pem_settings(pki, **{"ssl.client.auth": "requested"}))
    with pytest.raises((ssl.SSLError, ConnectionError)) as info:
        handshake(context, plain_client(pki, cert_file=stranger))
    assert any("certificate verify failed" in str(f) or "unknown ca" in str(f).lower()
               for f in info.value.server_failures)


def test_client_auth_none_does_not_ask_for_the_certificate(pki):
    context = server_context(pem_settings(pki, **{"ssl.client.auth": "none"}))
    assert handshake(context, plain_client(pki, cert_file=pki.client_pem_file))[0].startswith("User:ANONYMOUS|")


def test_peer_principal_without_tls_object_or_certificate_is_anonymous(pki):
    mapper = tls.principal_mapper({})
    assert tls.peer_principal(None, mapper) == ANONYMOUS
    mapper = tls.principal_mapper({"ssl.principal.mapping.rules": "RULE:^CN=(.*?),.*$/$1/L"})

    class Obj:
        def getpeercert(self, binary_form=False):
            return pki.client.public_bytes(serialization.Encoding.DER)
    assert tls.peer_principal(Obj(), mapper) == KafkaPrincipal("User", "client")


def test_a_subject_no_rule_maps_fails_the_connection(pki):
    holder = TlsContextHolder(pem_settings(pki, **{"ssl.client.auth": "required",
                                                   "ssl.principal.mapping.rules": "RULE:^CN=admin,.*$/admin/"}))
    with pytest.raises((ssl.SSLError, ConnectionError)) as info:
        handshake(holder.context, plain_client(pki, cert_file=pki.client_pem_file), mapper=holder.mapper)
    assert any(isinstance(f, NoMatchingRule) for f in info.value.server_failures)


# ---------------------------------------------------------------------------------------------------
# Protocols and cipher suites

def test_tls12_only_client_fails_against_tls13_only_server(pki):
    context = server_context(pem_settings(pki, **{"ssl.enabled.protocols": "TLSv1.3"}))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        handshake(context, plain_client(pki, max_version=ssl.TLSVersion.TLSv1_2))
    assert "|TLSv1.3|" in handshake(context, plain_client(pki))[0]


def test_default_protocols_are_kafkas_tls12_and_tls13(pki):
    context = server_context(pem_settings(pki))
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2 and context.maximum_version == ssl.TLSVersion.TLSv1_3
    assert "|TLSv1.2|" in handshake(context, plain_client(pki, max_version=ssl.TLSVersion.TLSv1_2))[0]
    assert "|TLSv1.3|" in handshake(context, plain_client(pki))[0]


def test_disabled_old_versions_are_ignored_and_a_list_of_only_them_refused(pki):
    context = server_context(pem_settings(pki, **{"ssl.enabled.protocols": ["TLSv1.1", "TLSv1.2"]}))
    assert context.maximum_version == ssl.TLSVersion.TLSv1_2
    with pytest.raises(TlsConfigError, match="No appropriate protocol"):
        server_context(pem_settings(pki, **{"ssl.enabled.protocols": "TLSv1,TLSv1.1"}))
    with pytest.raises(TlsConfigError, match="Unsupported protocol: TLSv9"):
        server_context(pem_settings(pki, **{"ssl.enabled.protocols": "TLSv1.2,TLSv9"}))


def test_ssl_protocol_chooses_versions_only_when_enabled_protocols_is_empty(pki):
    context = server_context(pem_settings(pki, **{"ssl.enabled.protocols": "", "ssl.protocol": "TLSv1.2"}))
    assert context.maximum_version == ssl.TLSVersion.TLSv1_2
    context = server_context(pem_settings(pki, **{"ssl.protocol": "TLSv1.2"}))  # the default list wins
    assert context.maximum_version == ssl.TLSVersion.TLSv1_3
    with pytest.raises(TlsConfigError, match="Nope SSLContext not available"):
        server_context(pem_settings(pki, **{"ssl.enabled.protocols": [], "ssl.protocol": "Nope"}))


def test_cipher_suites_restrict_tls12_by_java_names(pki):
    context = server_context(pem_settings(pki, **{"ssl.cipher.suites": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"}))
    # no TLS 1.3 suite listed: TLS 1.3 is off, as in Java
    assert context.maximum_version == ssl.TLSVersion.TLSv1_2
    line = handshake(context, plain_client(pki))[0]
    assert line.endswith("|TLSv1.2|ECDHE-RSA-AES128-GCM-SHA256")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        handshake(context, plain_client(pki, ciphers="ECDHE-RSA-AES256-GCM-SHA384"))


def test_cipher_suites_with_both_versions_and_tls13_limits_warned(pki, caplog):
    suites = "TLS_AES_256_GCM_SHA384,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,TLS_EMPTY_RENEGOTIATION_INFO_SCSV"
    with caplog.at_level(logging.WARNING, logger="pykbroker.security.tls"):
        context = server_context(pem_settings(pki, **{"ssl.cipher.suites": suites}))
    assert "cannot restrict TLS 1.3 suites" in caplog.text
    assert handshake(context, plain_client(pki))[0].split("|")[1] == "TLSv1.3"
    line = handshake(context, plain_client(pki, max_version=ssl.TLSVersion.TLSv1_2))[0]
    assert line.endswith("|ECDHE-RSA-AES256-GCM-SHA384")


def test_only_tls13_suites_turn_tls12_off(pki):
    context = server_context(pem_settings(pki, **{"ssl.cipher.suites": ["TLS_AES_128_GCM_SHA256"]}))
    assert context.minimum_version == ssl.TLSVersion.TLSv1_3
    with pytest.raises(TlsConfigError, match="No appropriate protocol"):
        server_context(pem_settings(pki, **{"ssl.cipher.suites": "TLS_AES_128_GCM_SHA256",
                                            "ssl.enabled.protocols": "TLSv1.2"}))


def test_unknown_cipher_suite_is_refused_by_name(pki):
    with pytest.raises(TlsConfigError) as info:
        server_context(pem_settings(pki, **{"ssl.cipher.suites": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_BOGUS"}))
    assert info.value.name == "ssl.cipher.suites" and str(info.value) == "Unsupported CipherSuite: TLS_BOGUS"


@pytest.mark.parametrize("java, openssl", [
    ("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "ECDHE-ECDSA-AES256-GCM-SHA384"),
    ("TLS_RSA_WITH_AES_128_CBC_SHA", "AES128-SHA"),
    ("SSL_RSA_WITH_3DES_EDE_CBC_SHA", "DES-CBC3-SHA"),
    ("TLS_DHE_RSA_WITH_3DES_EDE_CBC_SHA", "EDH-RSA-DES-CBC3-SHA"),
    ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", "ECDHE-RSA-CHACHA20-POLY1305"),
    ("TLS_DHE_RSA_WITH_AES_256_CBC_SHA256", "DHE-RSA-AES256-SHA256"),
    ("TLS_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256"),
    ("TLS_NOT_A_SUITE", None),
])
def test_openssl_cipher_names(java, openssl):
    assert openssl_cipher_name(java) == openssl


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_openssl_cipher_names_agree_with_openssl_stdname_for_every_suite():
    """OpenSSL's own table of IANA names: each translated name must be OpenSSL's (SRP suites, which Java lacks,
    and two names OpenSSL misspells are not translated)."""
    out = subprocess.run(["openssl", "ciphers", "-stdname", "ALL:COMPLEMENTOFALL:@SECLEVEL=0"],
                         capture_output=True, text=True, check=True).stdout
    untranslated = []
    for line in out.splitlines():
        standard, _, name = line.split()[:3]
        got = openssl_cipher_name(standard)
        if got is None:
            untranslated.append(standard)
        else:
            assert got == name, standard
    assert all("SRP" in name or name.startswith("TLS_PSK_DHE_") for name in untranslated), untranslated
    assert len(out.splitlines()) - len(untranslated) > 100


# ---------------------------------------------------------------------------------------------------
# The broker's own client side: host name verification

def test_client_context_checks_host_names_with_https(pki):
    server = server_context(pem_settings(pki))
    client = client_context({"ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file})
    assert client.check_hostname and client.verify_mode == ssl.CERT_REQUIRED
    assert handshake(server, client, hostname="localhost")[0]
    assert handshake(server, client, hostname="127.0.0.1")[0]
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch|IP address mismatch"):
        handshake(server, client, hostname="broker.example.com")


def test_client_context_without_identification_skips_the_name_but_not_the_chain(pki, other_pki):
    settings = {"ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file,
                "ssl.endpoint.identification.algorithm": ""}
    client = client_context(settings)
    assert not client.check_hostname
    assert handshake(server_context(pem_settings(pki)), client, hostname="broker.example.com")[0]
    stranger = other_pki.write("other-broker.pem", key_pem(other_pki.broker_key) + chain_pem(other_pki.broker, other_pki))
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        handshake(server_context({"ssl.keystore.type": "PEM", "ssl.keystore.location": stranger}), client)
    with pytest.raises(TlsConfigError, match="Unknown identification algorithm: kerberos"):
        client_context({"ssl.endpoint.identification.algorithm": "kerberos"})


def test_client_context_presents_its_keystore_for_mutual_tls(pki):
    server = TlsContextHolder(pem_settings(pki, **{"ssl.client.auth": "required"}))
    client = client_context({"ssl.keystore.type": "PEM", "ssl.keystore.location": pki.client_pem_file,
                             "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file})
    assert handshake(server.context, client)[0].startswith("User:CN=client,OU=apps,O=pykbroker|")


def test_expired_server_certificate_is_refused_by_the_client(pki):
    path = pki.write("expired.pem", key_pem(pki.expired_key) + chain_pem(pki.expired, pki))
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate has expired"):
        handshake(server_context({"ssl.keystore.type": "PEM", "ssl.keystore.location": path}), plain_client(pki))


def test_expired_client_certificate_is_refused_by_the_server(pki):
    key, cert = pki.issue("old-client", sans=(), expired=True, server=False)
    path = pki.write("expired-client.pem", key_pem(key) + chain_pem(cert, pki))
    context = server_context(pem_settings(pki, **{"ssl.client.auth": "required"}))
    with pytest.raises((ssl.SSLError, ConnectionError)) as info:
        handshake(context, plain_client(pki, cert_file=path))
    assert any("certificate" in str(f) for f in info.value.server_failures)


# ---------------------------------------------------------------------------------------------------
# Reload without restart

def _renewed(pki, filename, cn="broker", sans=("localhost", "127.0.0.1")):
    key, cert = pki.issue(cn, sans=sans)
    return pki.write(filename, key_pem(key) + chain_pem(cert, pki)), cert


def test_reload_serves_the_new_certificate_to_new_connections_only(pki):
    holder = TlsContextHolder(pem_settings(pki))
    renewed, cert = _renewed(pki, "renewed.pem")

    async def go():
        async with Server(lambda: holder.context) as server:
            _, before, (reader, writer) = await talk(server.port, plain_client(pki))
            assert holder.reconfigure(pem_settings(pki, **{"ssl.keystore.location": renewed})) is True
            _, after, (_, writer2) = await talk(server.port, plain_client(pki))
            writer2.close()
            # the connection opened before the swap still works, on its old context
            writer.write(b"still here\n")
            assert await asyncio.wait_for(reader.readline(), 20) == b"still here\n"
            writer.close()
            return before, after

    before, after = run(go())
    assert x509.load_der_x509_certificate(before).serial_number == pki.broker.serial_number
    assert x509.load_der_x509_certificate(after).serial_number == cert.serial_number


def test_a_listener_reload_reaches_the_inter_broker_client_which_presents_the_new_certificate(pki, monkeypatch):
    """ListenerTlsReloader: the inter-broker listener's server holder and the broker's own client holder both
    take the new key store; a validated update is not built a second time when applied; the client's next
    connection presents the new certificate to a server that requires one."""
    settings = pem_settings(pki, **{"ssl.client.auth": "required"})
    server = TlsContextHolder(settings, inter_broker=True)
    client = TlsContextHolder(settings, mode="client", inter_broker=True)
    reloader = tls.ListenerTlsReloader({"INTERNAL": server}, {"INTERNAL": "SSL"}, ("INTERNAL", client))
    renewed, cert = _renewed(pki, "renewed-inter-broker.pem")
    values = dict(settings, **{"listener.name.internal.ssl.keystore.location": renewed})
    reloader.validate(values)
    assert server.keystore.key_entry.chain[0].serial_number == pki.broker.serial_number  # nothing changed yet
    builds = []
    real_build = tls._build
    monkeypatch.setattr(tls, "_build", lambda *a, **k: builds.append(a) or real_build(*a, **k))
    assert reloader.reconfigure(values) == ["INTERNAL", "INTERNAL (client)"]
    assert builds == []  # the contexts validate() built were swapped in
    assert client.keystore.key_entry.chain[0].serial_number == cert.serial_number

    async def go():
        async with Server(lambda: server.context) as listener:
            _, _, (_, writer) = await talk(listener.port, client.context)
            writer.close()
            return listener.peer_certificates

    (presented,) = run(go())
    assert x509.load_der_x509_certificate(presented).serial_number == cert.serial_number
    # applied again: nothing changed, nothing built
    assert reloader.reconfigure(values) == [] and builds == []


def test_reload_of_unchanged_settings_is_a_no_op_but_a_rewritten_file_is_picked_up(pki):
    path, _ = _renewed(pki, "rotating.pem")
    holder = TlsContextHolder(pem_settings(pki, **{"ssl.keystore.location": path}))
    first = holder.context
    assert holder.reconfigure(pem_settings(pki, **{"ssl.keystore.location": path})) is False
    assert holder.context is first
    _, cert = pki.issue("broker")
    key = _
    with open(path, "w") as handle:
        handle.write(key_pem(key) + chain_pem(cert, pki))
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10_000_000_000))
    assert holder.reconfigure() is True
    assert holder.context is not first
    _, served, _ = handshake(holder.context, plain_client(pki))
    assert x509.load_der_x509_certificate(served).serial_number == cert.serial_number


def test_reload_with_another_dn_is_refused_and_the_old_context_kept(pki, caplog):
    holder = TlsContextHolder(pem_settings(pki))
    first = holder.context
    other, _ = _renewed(pki, "other-dn.pem", cn="impostor")
    with pytest.raises(TlsConfigError) as info, caplog.at_level(logging.ERROR):
        holder.reconfigure(pem_settings(pki, **{"ssl.keystore.location": other}))
    # Kafka 3.7.1's text (measured in ZooKeeper mode: kafka-configs against an SSL listener with PEM stores)
    assert str(info.value) == ("Validation of dynamic config update of SSLFactory failed: org.apache.kafka.common."
                               "config.ConfigException: Keystore DistinguishedName "
                               "does not match:  existing={alias=kafka, DN=CN=broker, O=pykbroker}, "
                               "new={alias=kafka, DN=CN=impostor, O=pykbroker}")
    assert holder.context is first
    with pytest.raises(TlsConfigError):
        holder.validate_reconfiguration(pem_settings(pki, **{"ssl.keystore.location": other}))
    allowed = TlsContextHolder(pem_settings(pki, **{"ssl.allow.dn.changes": "true"}))
    assert allowed.reconfigure(pem_settings(pki, **{"ssl.keystore.location": other})) is True


def test_reload_must_keep_every_old_subject_alt_name(pki):
    holder = TlsContextHolder(pem_settings(pki))
    fewer, _ = _renewed(pki, "fewer-sans.pem", sans=("localhost",))
    with pytest.raises(TlsConfigError) as info:
        holder.reconfigure(pem_settings(pki, **{"ssl.keystore.location": fewer}))
    assert "Keystore SubjectAltNames do not match:  existing={alias=kafka, SAN=[[2, localhost], [7, 127.0.0.1]]}" \
           in str(info.value)
    more, _ = _renewed(pki, "more-sans.pem", sans=("localhost", "127.0.0.1", "broker.example.com"))
    assert holder.reconfigure(pem_settings(pki, **{"ssl.keystore.location": more})) is True
    assert TlsContextHolder(pem_settings(pki, **{"ssl.allow.san.changes": True})).reconfigure(
        pem_settings(pki, **{"ssl.keystore.location": fewer})) is True


def test_reload_takes_only_reconfigurable_settings_and_refuses_adding_a_truststore(pki):
    holder = TlsContextHolder({"ssl.keystore.type": "PEM", "ssl.keystore.location": pki.broker_pem_file})
    # ssl.client.auth is not reconfigurable: ignored, as Kafka ignores it here
    assert holder.reconfigure({"ssl.keystore.type": "PEM", "ssl.keystore.location": pki.broker_pem_file,
                               "ssl.client.auth": "required"}) is False
    with pytest.raises(TlsConfigError, match="Cannot add SSL truststore to an existing listener"):
        holder.reconfigure({"ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file})
    with pytest.raises(TlsConfigError, match="failed: .*: An SSL listener needs a key store"):
        holder.reconfigure({"ssl.keystore.location": None})
    client = TlsContextHolder({"ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file}, mode="client")
    with pytest.raises(TlsConfigError, match="Cannot add SSL keystore to an existing listener for which no keystore"):
        client.reconfigure({"ssl.keystore.type": "PEM", "ssl.keystore.location": pki.client_pem_file})
    client = TlsContextHolder({"ssl.keystore.type": "PEM", "ssl.keystore.location": pki.client_pem_file}, mode="client")
    with pytest.raises(TlsConfigError, match="Cannot remove the SSL keystore from an existing listener"):
        client.reconfigure({"ssl.keystore.location": None})


def test_reload_with_a_broken_store_is_refused_with_its_reason(pki, tmp_path):
    holder = TlsContextHolder(pem_settings(pki))
    with pytest.raises(TlsConfigError, match="Validation of dynamic config update of SSLFactory failed: org.apache."
                                             "kafka.common.errors.InvalidConfigurationException: Failed to load "
                                             "SSL keystore .* no such file"):
        holder.reconfigure({"ssl.keystore.location": str(tmp_path / "gone.pem")})


def test_inter_broker_listener_refuses_a_keystore_its_truststore_cannot_verify(pki, other_pki):
    holder = TlsContextHolder(pem_settings(pki, **{"ssl.client.auth": "required"}), inter_broker=True)
    stranger = other_pki.write("stranger-broker.pem", key_pem(other_pki.broker_key) + chain_pem(other_pki.broker, other_pki))
    with pytest.raises(TlsConfigError, match="failed: javax.net.ssl.SSLHandshakeException: the old and the new SSL "
                                             "settings cannot complete a handshake with each other"):
        holder.reconfigure(pem_settings(pki, **{"ssl.keystore.location": stranger, "ssl.allow.dn.changes": True,
                                                "ssl.allow.san.changes": True}))
    renewed, _ = _renewed(pki, "ib-renewed.pem")
    assert holder.reconfigure(pem_settings(pki, **{"ssl.keystore.location": renewed})) is True
    with pytest.raises(TlsConfigError, match="A client SSLEngine created with the provided settings can't connect"):
        TlsContextHolder({"ssl.keystore.type": "PEM", "ssl.keystore.location": stranger, "ssl.truststore.type": "PEM",
                          "ssl.truststore.location": pki.ca_file}, inter_broker=True)


# ---------------------------------------------------------------------------------------------------
# Bad input: a clear TlsConfigError naming the setting, never a traceback

def _error(settings, mode="server"):
    with pytest.raises(TlsConfigError) as info:
        (server_context if mode == "server" else client_context)(settings)
    assert isinstance(info.value, ConfigError)
    return info.value


def test_wrong_pkcs12_password(pki):
    path = pki.write("pw.p12", p12(pki.broker_key, pki.broker, pki, "right"))
    error = _error({"ssl.keystore.type": "PKCS12", "ssl.keystore.location": path, "ssl.keystore.password": "wrong"})
    assert str(error) == f"Failed to load SSL keystore {path} of type PKCS12: keystore password was incorrect (or the file is damaged)"
    assert "wrong" not in str(error).replace("wrong", "", 0) or True
    assert error.name == "ssl.keystore.location"


def test_missing_files(pki, tmp_path):
    missing = str(tmp_path / "nope.p12")
    error = _error({"ssl.keystore.type": "PKCS12", "ssl.keystore.location": missing, "ssl.keystore.password": "x"})
    assert str(error) == f"Failed to load SSL keystore {missing} of type PKCS12: no such file"
    error = _error(pem_settings(pki, **{"ssl.truststore.location": missing}))
    assert error.name == "ssl.truststore.location" and "no such file" in str(error)


def test_garbage_pem(pki):
    error = _error({"ssl.keystore.type": "PEM", "ssl.keystore.key": "not a key",
                    "ssl.keystore.certificate.chain": chain_pem(pki.broker, pki)})
    assert str(error) == "Invalid PEM keystore configs: No matching PRIVATE KEY entries in PEM file"
    error = _error({"ssl.keystore.type": "PEM", "ssl.keystore.key": key_pem(pki.broker_key),
                    "ssl.keystore.certificate.chain": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"})
    assert str(error).startswith("Invalid PEM keystore configs: a CERTIFICATE block is not an X.509 certificate")
    error = _error(pem_settings(pki, **{"ssl.truststore.location": pki.write("junk.pem", "hello")}))
    assert str(error) == f"Failed to load PEM SSL keystore {pki.tmp / 'junk.pem'}: No matching CERTIFICATE entries in PEM file"
    error = _error({"ssl.keystore.type": "PEM", "ssl.keystore.location": pki.write("bad64.pem", "-----BEGIN PRIVATE KEY-----\n"
                                                                                               "@@@@\n-----END PRIVATE KEY-----\n")})
    assert "No matching PRIVATE KEY entries" in str(error) or "base64" in str(error)


def test_key_that_does_not_match_the_certificate(pki):
    error = _error({"ssl.keystore.type": "PEM", "ssl.keystore.key": key_pem(pki.client_key),
                    "ssl.keystore.certificate.chain": chain_pem(pki.broker, pki)})
    assert str(error) == ("Invalid PEM keystore configs: the private key does not match the first certificate of the "
                          "chain (key values mismatch)")


def test_chain_in_the_wrong_order(pki):
    error = _error({"ssl.keystore.type": "PEM", "ssl.keystore.key": key_pem(pki.broker_key),
                    "ssl.keystore.certificate.chain": pki.ca_pem() + pki.broker.public_bytes(PEM).decode()})
    assert "key values mismatch" in str(error) or "Certificate chain is not valid" in str(error)
    unrelated = pki.broker.public_bytes(PEM).decode() + pki.client.public_bytes(PEM).decode()
    error = _error({"ssl.keystore.type": "PEM", "ssl.keystore.key": key_pem(pki.broker_key),
                    "ssl.keystore.certificate.chain": unrelated})
    assert "Certificate chain is not valid" in str(error)


def test_encrypted_key_passwords(pki):
    base = {"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": chain_pem(pki.broker, pki)}
    error = _error({**base, "ssl.keystore.key": key_pem(pki.broker_key, "pw")})
    assert "the key is encrypted but ssl.key.password is not set" in str(error)
    error = _error({**base, "ssl.keystore.key": key_pem(pki.broker_key, "pw"), "ssl.key.password": "Xyzzy-42"})
    assert "could not be decrypted with ssl.key.password" in str(error) and "Xyzzy-42" not in str(error)
    error = _error({**base, "ssl.keystore.key": key_pem(pki.broker_key), "ssl.key.password": "pw"})
    assert "ssl.key.password is set but the private key is not encrypted" in str(error)


def test_traditional_and_unsupported_keys_are_refused_with_the_conversion(pki):
    traditional = pki.broker_key.private_bytes(PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                               serialization.NoEncryption()).decode()
    error = _error({"ssl.keystore.type": "PEM", "ssl.keystore.key": traditional,
                    "ssl.keystore.certificate.chain": chain_pem(pki.broker, pki)})
    assert "'RSA PRIVATE KEY' block is not a PKCS#8 key" in str(error) and "openssl pkcs8 -topk8" in str(error)
    ed_key = ed25519.Ed25519PrivateKey.generate()
    error = _error({"ssl.keystore.type": "PEM", "ssl.keystore.key": key_pem(ed_key),
                    "ssl.keystore.certificate.chain": chain_pem(pki.broker, pki)})
    assert "Kafka reads RSA, DSA and EC keys" in str(error)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    key, cert = pki.issue("ec-broker", key=ec_key)
    server_context({"ssl.keystore.type": "PEM", "ssl.keystore.key": key_pem(key),
                    "ssl.keystore.certificate.chain": chain_pem(cert, pki)})


def test_jks_files_are_refused_naming_keytool(pki):
    path = pki.write("broker.jks", b"\xfe\xed\xfe\xed\x00\x00\x00\x02" + b"\x00" * 64)
    error = _error({"ssl.keystore.location": path, "ssl.keystore.password": "x"})  # Kafka's default type JKS
    assert "it is a Java JKS key store" in str(error)
    assert f"keytool -importkeystore -srckeystore {path} -srcstoretype JKS -destkeystore {path}.p12 " \
           "-deststoretype PKCS12" in str(error)
    assert "ssl.keystore.type=PKCS12" in str(error) and "PEM" in str(error)
    error = _error(pem_settings(pki, **{"ssl.truststore.type": "JKS", "ssl.truststore.location": path}))
    assert error.name == "ssl.truststore.location" and "ssl.truststore.type=PKCS12" in str(error)


def test_a_pem_file_declared_as_jks_or_pkcs12(pki):
    error = _error({"ssl.keystore.location": pki.broker_pem_file, "ssl.keystore.password": "x"})
    assert str(error) == (f"Failed to load SSL keystore {pki.broker_pem_file} of type JKS: Invalid keystore format "
                          "(it looks like PEM: set the store type to PEM)")


@pytest.mark.parametrize("settings, name, message", [
    ({"ssl.keystore.type": "PEM", "ssl.keystore.location": "/x.pem", "ssl.keystore.password": "p"},
     "ssl.keystore.password", "SSL key store password cannot be specified with PEM format, only key password may be specified"),
    ({"ssl.keystore.type": "PKCS12", "ssl.keystore.location": "/x.p12"},
     "ssl.keystore.password", "SSL key store is specified, but key store password is not specified."),
    ({"ssl.keystore.password": "p"}, "ssl.keystore.password",
     "SSL key store is not specified, but key store password is specified."),
    ({"ssl.keystore.type": "PKCS12", "ssl.keystore.key": "k", "ssl.keystore.certificate.chain": "c"},
     "ssl.keystore.key", "SSL private key can be specified only for PEM, but key store type is PKCS12."),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.key": "k"}, "ssl.keystore.certificate.chain",
     "SSL private key is specified, but certificate chain is not specified."),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": "c"}, "ssl.keystore.certificate.chain",
     "SSL certificate chain is specified, but private key is not specified"),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.key": "k", "ssl.keystore.certificate.chain": "c",
      "ssl.keystore.location": "/x"}, "ssl.keystore.location",
     "Both SSL key store location and separate private key are specified."),
    ({"ssl.truststore.type": "PKCS12", "ssl.truststore.certificates": "c"}, "ssl.truststore.certificates",
     "SSL trust store certs can be specified only for PEM, but trust store type is PKCS12."),
    ({"ssl.truststore.type": "PEM", "ssl.truststore.location": "/x", "ssl.truststore.password": "p"},
     "ssl.truststore.password", "SSL trust store password cannot be specified for PEM format."),
    ({"ssl.truststore.password": "p"}, "ssl.truststore.password",
     "SSL trust store is not specified, but trust store password is specified."),
    ({"ssl.keystore.type": "pem", "ssl.keystore.location": "/x", "ssl.keystore.password": "p"}, "ssl.keystore.type",
     "Failed to load SSL keystore /x of type pem: pem KeyStore not available (Kafka's store type PEM is written in "
     "upper case)"),
    ({"ssl.keystore.type": "BCFKS", "ssl.keystore.location": "/x", "ssl.keystore.password": "p"}, "ssl.keystore.type",
     "Failed to load SSL keystore /x of type BCFKS: BCFKS KeyStore not available: pykbroker reads the store types "
     "PEM and PKCS12 (and a PKCS12 file declared as JKS, as Java does)"),
    ({"ssl.client.auth": "maybe"}, "ssl.client.auth",
     "Invalid value maybe for configuration ssl.client.auth: String must be one of: required, requested, none"),
    ({"ssl.engine.factory.class": "com.example.Factory"}, "ssl.engine.factory.class",
     "ssl.engine.factory.class=com.example.Factory names a Java class; pykbroker builds its TLS engine itself: unset it"),
])
def test_kafkas_refusals_with_kafkas_messages(pki, settings, name, message):
    full = {"ssl.keystore.type": "PEM", "ssl.keystore.location": pki.broker_pem_file}
    if any(key.startswith("ssl.keystore.") for key in settings):
        full = {}
    full.update(settings)
    error = _error(full)
    assert (error.name, str(error)) == (name, message)


def test_a_server_without_keystore_is_refused(pki):
    error = _error({"ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file})
    assert error.name == "ssl.keystore.location" and "An SSL listener needs a key store" in str(error)


def test_bad_principal_mapping_rules_are_a_config_error(pki):
    with pytest.raises(TlsConfigError) as info:
        TlsContextHolder(pem_settings(pki, **{"ssl.principal.mapping.rules": "RULE:broken"}))
    assert info.value.name == "ssl.principal.mapping.rules" and "Invalid rule" in str(info.value)


def test_java_only_settings_are_accepted(pki):
    settings = pem_settings(pki, **{"ssl.provider": "SunJSSE", "ssl.keymanager.algorithm": "PKIX",
                                    "ssl.trustmanager.algorithm": "SunX509",
                                    "ssl.secure.random.implementation": "SHA1PRNG"})
    assert handshake(server_context(settings), plain_client(pki))[0]


def test_expired_keystore_certificate_loads_with_a_warning(pki, caplog):
    path = pki.write("expired2.pem", key_pem(pki.expired_key) + chain_pem(pki.expired, pki))
    with caplog.at_level(logging.WARNING, logger="pykbroker.security.keystores"):
        server_context({"ssl.keystore.type": "PEM", "ssl.keystore.location": path})
    assert "expired" in caplog.text


# ---------------------------------------------------------------------------------------------------
# openssl s_client against the same server, and connections that fail cost only themselves

OPENSSL = shutil.which("openssl")
needs_openssl = pytest.mark.skipif(OPENSSL is None, reason="needs the openssl command")


async def s_client(port, *args):
    """Run openssl s_client; return (first line the server sent or None, s_client's stdout+stderr, exit code)."""
    process = await asyncio.create_subprocess_exec(
        OPENSSL, "s_client", "-connect", f"127.0.0.1:{port}", "-servername", "localhost", "-verify_return_error",
        "-brief", "-ign_eof", *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    output = []
    first = None
    try:
        async def read():
            nonlocal first
            while True:
                line = await process.stdout.readline()
                if not line:
                    return
                text = line.decode(errors="replace").rstrip("\n")
                output.append(text)
                if text.startswith("User:"):
                    first = text
                    return
        await asyncio.wait_for(read(), 30)
    except asyncio.TimeoutError:
        raise AssertionError("s_client: no line from the server in 30 s:\n" + "\n".join(output)) from None
    finally:
        if process.returncode is None:
            process.kill()
        code = await process.wait()
    return first, "\n".join(output), code


@needs_openssl
def test_openssl_s_client_verifies_the_broker_and_presents_a_client_certificate(pki):
    holder = TlsContextHolder(pem_settings(pki, **{"ssl.client.auth": "requested"}))

    async def go():
        async with Server(lambda: holder.context) as server:
            anonymous = await s_client(server.port, "-CAfile", pki.ca_file)
            mutual = await s_client(server.port, "-CAfile", pki.ca_file, "-cert", pki.client_pem_file,
                                    "-key", pki.client_pem_file)
            return anonymous, mutual
    (line, output, _), (mutual_line, _, _) = run(go())
    assert line.startswith("User:ANONYMOUS|TLSv1.3|"), output
    assert "Verification: OK" in output
    assert mutual_line.startswith("User:CN=client,OU=apps,O=pykbroker|TLSv1.3|")


@needs_openssl
def test_openssl_s_client_tls12_cipher_limits(pki):
    context = server_context(pem_settings(pki, **{"ssl.cipher.suites": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                                                  "ssl.client.auth": "required"}))

    async def go():
        async with Server(lambda: context) as server:
            ok = await s_client(server.port, "-CAfile", pki.ca_file, "-tls1_2", "-cert", pki.client_pem_file,
                                "-key", pki.client_pem_file)
            wrong_cipher = await s_client(server.port, "-CAfile", pki.ca_file, "-tls1_2", "-cipher",
                                          "ECDHE-RSA-AES256-GCM-SHA384", "-cert", pki.client_pem_file,
                                          "-key", pki.client_pem_file)
            tls13 = await s_client(server.port, "-CAfile", pki.ca_file, "-tls1_3")
            no_cert = await s_client(server.port, "-CAfile", pki.ca_file, "-tls1_2")
            return ok, wrong_cipher, tls13, no_cert, server.failures
    ok, wrong_cipher, tls13, no_cert, failures = run(go())
    assert ok[0] == "User:CN=client,OU=apps,O=pykbroker|TLSv1.2|ECDHE-RSA-AES128-GCM-SHA256", ok[1]
    assert wrong_cipher[0] is None and wrong_cipher[2] != 0
    assert tls13[0] is None and tls13[2] != 0
    assert no_cert[0] is None and no_cert[2] != 0
    reasons = [str(f) for f in failures]
    assert len(reasons) == 3, reasons
    assert "NO_SHARED_CIPHER" in reasons[0] and "UNSUPPORTED_PROTOCOL" in reasons[1], reasons
    assert "PEER_DID_NOT_RETURN_A_CERTIFICATE" in reasons[2], reasons


def test_plaintext_and_stalled_clients_cost_only_their_connection(pki):
    """A Kafka request in plaintext on the TLS port and a client that never starts its handshake fail alone;
    a good client connecting meanwhile is served."""
    context = server_context(pem_settings(pki))
    api_versions = bytes.fromhex("0000001a0012000300000001000a6b61666b612d746573740000")

    async def go():
        loop = asyncio.get_running_loop()
        async with Server(lambda: context) as server:
            stalled = socket.create_connection(("127.0.0.1", server.port))
            plain = socket.create_connection(("127.0.0.1", server.port))
            plain.setblocking(False)
            try:
                await loop.sock_sendall(plain, api_versions)
                answer = await asyncio.wait_for(loop.sock_recv(plain, 100), 20)  # b"" (closed) or an alert
                line, _, (_, writer) = await talk(server.port, plain_client(pki))
                writer.close()
                deadline = loop.time() + 20
                while not server.failures and loop.time() < deadline:
                    await asyncio.sleep(0.05)
                return answer, line, list(server.failures)
            finally:
                stalled.close()
                plain.close()
    answer, line, failures = run(go())
    assert line.startswith("User:ANONYMOUS|")
    assert not answer.startswith(b"\x00\x00")  # no Kafka answer, just the end of that connection
    assert any(isinstance(f, ssl.SSLError) for f in failures)


# ---------------------------------------------------------------------------------------------------
# Stores made by Java's keytool, as Kafka users make them

KEYTOOL = shutil.which("keytool")


@pytest.mark.skipif(KEYTOOL is None, reason="needs Java's keytool")
def test_keytool_jks_is_refused_and_the_suggested_conversion_works(tmp_path):
    jks = str(tmp_path / "broker.jks")
    subprocess.run([KEYTOOL, "-genkeypair", "-alias", "Broker", "-keyalg", "RSA", "-keysize", "2048",
                    "-dname", "CN=broker,O=pykbroker", "-ext", "SAN=dns:localhost,ip:127.0.0.1", "-validity", "30",
                    "-storetype", "JKS", "-keystore", jks, "-storepass", "changeit", "-keypass", "changeit"],
                   check=True, capture_output=True, timeout=120)
    crt = tmp_path / "broker.crt"
    crt.write_bytes(subprocess.run([KEYTOOL, "-exportcert", "-rfc", "-alias", "broker", "-keystore", jks,
                                    "-storepass", "changeit"], check=True, capture_output=True, timeout=120).stdout)
    with pytest.raises(TlsConfigError) as info:
        server_context({"ssl.keystore.location": jks, "ssl.keystore.password": "changeit"})
    command = str(info.value).split("`")[1]
    assert command.startswith("keytool -importkeystore")
    subprocess.run(command.split() + ["-srcstorepass", "changeit", "-deststorepass", "changeit", "-noprompt"],
                   check=True, capture_output=True, timeout=120)
    # a PKCS12 trust store made by keytool, protected by its password
    trust = str(tmp_path / "trust.p12")
    subprocess.run([KEYTOOL, "-importcert", "-noprompt", "-alias", "broker", "-file", str(crt), "-storetype", "PKCS12",
                    "-keystore", trust, "-storepass", "trustpass"], check=True, capture_output=True, timeout=120)
    holder = TlsContextHolder({"ssl.keystore.type": "PKCS12", "ssl.keystore.location": jks + ".p12",
                               "ssl.keystore.password": "changeit"})
    assert holder.keystore.key_entry.alias == "broker"
    client = client_context({"ssl.truststore.type": "PKCS12", "ssl.truststore.location": trust,
                             "ssl.truststore.password": "trustpass"})
    line, cert, _ = handshake(holder.context, client)
    assert line.startswith("User:ANONYMOUS|") and served_cert_cn(cert) == "broker"
    with pytest.raises(TlsConfigError, match="ssl.truststore.password is not set"):
        client_context({"ssl.truststore.type": "PKCS12", "ssl.truststore.location": trust})


@pytest.mark.skipif(OPENSSL is None, reason="needs the openssl command")
def test_openssl_made_pkcs12_and_traditional_key_conversion(pki, tmp_path):
    """`openssl pkcs12 -export` output loads; the `openssl pkcs8 -topk8` the refusal names makes a key Kafka reads."""
    key_file = tmp_path / "key.pem"
    key_file.write_text(pki.broker_key.private_bytes(PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                                     serialization.NoEncryption()).decode())
    cert_file = tmp_path / "cert.pem"
    cert_file.write_text(chain_pem(pki.broker, pki))
    bundle = str(tmp_path / "broker.p12")
    subprocess.run([OPENSSL, "pkcs12", "-export", "-in", str(cert_file), "-inkey", str(key_file), "-name", "kafka",
                    "-out", bundle, "-passout", "pass:p12pass"], check=True, capture_output=True, timeout=60)
    context = server_context({"ssl.keystore.type": "PKCS12", "ssl.keystore.location": bundle,
                              "ssl.keystore.password": "p12pass"})
    assert served_cert_cn(handshake(context, plain_client(pki))[1]) == "broker"
    with pytest.raises(TlsConfigError) as info:
        server_context({"ssl.keystore.type": "PEM", "ssl.keystore.key": key_file.read_text(),
                        "ssl.keystore.certificate.chain": cert_file.read_text()})
    command = str(info.value).split("`")[1].replace("key.pem", str(key_file)).replace("key-pkcs8.pem",
                                                                                      str(tmp_path / "k8.pem"))
    subprocess.run(command.split() + ["-nocrypt"], check=True, capture_output=True, timeout=60)
    server_context({"ssl.keystore.type": "PEM", "ssl.keystore.key": (tmp_path / "k8.pem").read_text(),
                    "ssl.keystore.certificate.chain": cert_file.read_text()})

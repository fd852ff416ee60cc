"""pykbroker.ctl.security: Kafka's client properties (--command-config) translated to librdkafka's settings, and
librdkafka's settings turned into the protocol client's TLS and SASL."""

from __future__ import annotations

import ssl

import pytest

pytest.importorskip("cryptography")

from pykbroker.ctl.security import (  # noqa: E402
    CommandConfigError, client_security, librdkafka_settings, load_command_config,
)
from tls_helpers import key_pem, p12, standard_pki, chain_pem  # noqa: E402

JAAS = "org.apache.kafka.common.security.{}"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return standard_pki(tmp_path_factory.mktemp("pki"))


def test_scram_jaas_and_pem_truststore(pki):
    settings = librdkafka_settings({
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": JAAS.format('scram.ScramLoginModule required username="u" password="p w\\"q";'),
        "ssl.truststore.location": pki.ca_file, "ssl.truststore.type": "PEM",
        "ssl.endpoint.identification.algorithm": "", "ssl.enabled.protocols": "TLSv1.2,TLSv1.3",
    })
    assert settings == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u",
                        "sasl.password": 'p w"q', "ssl.ca.location": pki.ca_file,
                        "ssl.endpoint.identification.algorithm": "none"}


def test_key_stores_pem_file_pem_in_config_and_pkcs12(pki, tmp_path):
    assert librdkafka_settings({"ssl.keystore.location": pki.client_pem_file, "ssl.keystore.type": "PEM",
                                "ssl.key.password": "k"}) == {
        "ssl.certificate.location": pki.client_pem_file, "ssl.key.location": pki.client_pem_file,
        "ssl.key.password": "k"}
    store = tmp_path / "client.p12"
    store.write_bytes(p12(pki.client_key, pki.client, pki, "store-pw"))
    assert librdkafka_settings({"ssl.keystore.location": str(store), "ssl.keystore.password": "store-pw"}) == {
        "ssl.keystore.location": str(store), "ssl.keystore.password": "store-pw"}
    chain, key = chain_pem(pki.client, pki), key_pem(pki.client_key)
    assert librdkafka_settings({"ssl.keystore.certificate.chain": chain, "ssl.keystore.key": key}) == {
        "ssl.certificate.pem": chain, "ssl.key.pem": key}


def test_oauthbearer_unsecured_options():
    settings = librdkafka_settings({"sasl.mechanism": "OAUTHBEARER", "sasl.jaas.config": JAAS.format(
        'oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="carol" '
        'unsecuredLoginLifetimeSeconds="60" unsecuredLoginExtension_traceId="123";')})
    assert settings["enable.sasl.oauthbearer.unsecure.jwt"] == "true"
    assert settings["sasl.oauthbearer.config"] == "principal=carol lifeSeconds=60 extension_traceId=123"


@pytest.mark.parametrize("props, words", [
    ({"ssl.truststore.location": "{p12}"}, ["PKCS12 trust store", "openssl pkcs12"]),
    ({"ssl.truststore.location": "{jks}"}, ["JKS trust store", "keytool -exportcert"]),
    ({"ssl.keystore.location": "{jks}"}, ["JKS key store", "PKCS12"]),
    ({"sasl.jaas.config": JAAS.format("oauthbearer.OAuthBearerLoginModule required;")},
     ["unsecuredLoginStringClaim_sub"]),
    ({"sasl.login.callback.handler.class": "com.example.Handler"}, ["Java class"]),
    ({"sasl.jaas.config": "not a jaas string"}, ["sasl.jaas.config"]),
    ({"ssl.truststore.location": "/no/such/file"}, ["cannot read /no/such/file"]),
])
def test_what_cannot_be_translated_is_refused_naming_it(pki, tmp_path, props, words):
    jks, store = tmp_path / "t.jks", tmp_path / "t.p12"
    jks.write_bytes(b"\xfe\xed\xfe\xed" + bytes(16))
    store.write_bytes(p12(pki.client_key, pki.client, pki, "pw"))
    props = {k: v.format(jks=jks, p12=store) for k, v in props.items()}
    with pytest.raises(CommandConfigError) as caught:
        librdkafka_settings(props)
    assert all(word in str(caught.value) for word in words), caught.value


def test_a_password_is_never_in_an_error(tmp_path):
    path = tmp_path / "c.properties"
    path.write_text('sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required '
                    'password="hunter2-secret";\n')
    with pytest.raises(CommandConfigError) as caught:
        load_command_config(path)
    assert "hunter2-secret" not in str(caught.value) and str(path) in str(caught.value)


def test_client_security_for_the_protocol_client(pki):
    assert client_security({}) is None and client_security({"security.protocol": "plaintext"}) is None
    tls = client_security({"security.protocol": "SSL", "ssl.ca.location": pki.ca_file})
    context = tls.ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname and tls.sasl is None
    mtls = client_security({"security.protocol": "SSL", "ssl.ca.location": pki.ca_file,
                            "ssl.certificate.location": pki.client_pem_file, "ssl.key.location": pki.client_pem_file,
                            "ssl.endpoint.identification.algorithm": "none"})
    assert not mtls.ssl_context().check_hostname
    unverified = client_security({"security.protocol": "SSL", "enable.ssl.certificate.verification": "false"})
    assert unverified.ssl_context().verify_mode == ssl.CERT_NONE
    scram = client_security({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                             "sasl.username": "u", "sasl.password": "p"})
    assert scram.ssl_context() is None and scram.sasl().mechanism == "SCRAM-SHA-256" and scram.authenticates
    oauth = client_security({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"})
    assert oauth.sasl is None and not oauth.authenticates
    with pytest.raises(CommandConfigError, match="expected PLAINTEXT, SSL"):
        client_security({"security.protocol": "TLS"})
    with pytest.raises(CommandConfigError):
        client_security({"security.protocol": "SSL", "ssl.ca.pem": "not a certificate"})

"""The broker's own SASL client (security/sasl/client.py) against this package's server state machines: PLAIN
and SCRAM-SHA-256/512 exchanges complete with the right password and fail with a wrong one; the RFC 7677 test
vector replayed as the client; a server that does not know the password cannot pass the client's check of its
signature; malformed or hostile server messages end in SaslClientError without any secret in its text; the
inter-broker credentials come from the listener's JAAS entry."""

from __future__ import annotations

import base64

import pytest

from pykbroker.security import credentials as cred
from pykbroker.security.sasl import SaslAuthenticationFailed
from pykbroker.security.sasl.client import (
    PlainClient, SaslClientError, ScramClient, inter_broker_credentials, sasl_client,
)
from pykbroker.security.sasl.plain import PlainServerFactory
from pykbroker.security.jaas import parse_jaas_config
from pykbroker.security.sasl.scram import ScramServerFactory

MECHANISMS = ["SCRAM-SHA-256", "SCRAM-SHA-512"]
SECRET = "broker-secret-xyz"


def scram_cache(user: str, password: str, iterations: int = 4096) -> cred.ScramCredentialCache:
    cache = cred.ScramCredentialCache()
    for mechanism in MECHANISMS:
        cache.put(mechanism, user, cred.generate_credential(mechanism, password, iterations))
    return cache


def run(client, server) -> None:
    """Drive one exchange as the wire would: each client token to the server, each answer back."""
    token = client.first()
    while True:
        answer = server.evaluate(token)
        if server.complete and client.complete:
            return
        token = client.evaluate(answer)
        if token is None:
            assert client.complete and server.complete
            return


def test_plain_client_authenticates_against_the_plain_server():
    entries = parse_jaas_config(f'org.apache.kafka.common.security.plain.PlainLoginModule required '
                                f'username="broker" password="{SECRET}" user_broker="{SECRET}";')
    server = PlainServerFactory(entries).new_server()
    client = sasl_client("PLAIN", "broker", SECRET)
    run(client, server)
    assert server.authorized_id == "broker"


def test_plain_client_with_a_wrong_password_is_refused_by_the_server():
    entries = parse_jaas_config(f'org.apache.kafka.common.security.plain.PlainLoginModule required user_broker="{SECRET}";')
    server = PlainServerFactory(entries).new_server()
    with pytest.raises(SaslAuthenticationFailed, match="Invalid username or password"):
        server.evaluate(PlainClient("broker", "wrong").first())


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_scram_client_authenticates_and_checks_the_server_signature(mechanism):
    server = ScramServerFactory(mechanism, scram_cache("broker,1=x", SECRET)).new_server()
    client = sasl_client(mechanism, "broker,1=x", SECRET)  # ',' and '=' travel as =2C and =3D
    run(client, server)
    assert client.complete and server.authorized_id == "broker,1=x"


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_scram_client_with_a_wrong_password_fails_at_the_server(mechanism):
    server = ScramServerFactory(mechanism, scram_cache("broker", SECRET)).new_server()
    client = ScramClient(mechanism, "broker", "not-the-password")
    final = client.evaluate(server.evaluate(client.first()))
    with pytest.raises(SaslAuthenticationFailed):
        server.evaluate(final)
    assert not client.complete


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_server_that_does_not_know_the_password_cannot_complete_the_client(mechanism):
    """The server-final signature proves the server holds the credential: one made from another password
    (an impostor broker) is refused by the client, which stays incomplete."""
    impostor = ScramServerFactory(mechanism, scram_cache("broker", "other-password")).new_server()
    honest = ScramServerFactory(mechanism, scram_cache("broker", SECRET)).new_server()
    client = ScramClient(mechanism, "broker", SECRET)
    first = client.first()
    server_first = honest.evaluate(first)
    final = client.evaluate(server_first)
    honest.evaluate(final)  # the honest answer, which we replace by the impostor's signature
    impostor_key = cred.server_key(cred.scram_mechanism(mechanism), b"x" * cred.scram_mechanism(mechanism).digest_size)
    forged = b"v=" + base64.b64encode(impostor_key)
    with pytest.raises(SaslClientError, match="Invalid server signature") as raised:
        client.evaluate(forged)
    assert not client.complete
    assert SECRET not in str(raised.value)


def test_rfc7677_client_side_replayed_exactly():
    """RFC 7677 section 3: user "user", password "pencil", the RFC's client nonce: the client's messages are
    the RFC's bytes."""
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = client.evaluate(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert final == (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                     b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert client.evaluate(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=") is None
    assert client.complete


@pytest.mark.parametrize(("server_first", "words"), [
    (b"r=someoneelsesnonce,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096", "does not start with client nonce"),
    (b"r=cnonce,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096", "does not start with client nonce"),  # no server part
    (b"r=cnonceSRV,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=1000", "less than the minimum 4096"),
    (b"r=cnonceSRV,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=16385", "more than the maximum 16384 for SCRAM-SHA-256"),
    (b"r=cnonceSRV,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=999999999", "more than the maximum 16384"),
    (b"r=cnonceSRV,s=!!!,i=4096", "invalid server first message"),
    (b"r=cnonceSRV,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,not an extension", "invalid server first message"),
    (b"r=cnonceSRV,s=W22ZaJ0SNY7soEsUEjb6gQ,i=4096", "invalid server first message"),  # not base64
    (b"garbage", "invalid server first message"),
    (b"\xff\xfe", "invalid server first message"),
])
def test_hostile_server_first_messages_fail_cleanly(server_first, words):
    client = ScramClient("SCRAM-SHA-256", "broker", SECRET, nonce="cnonce")
    client.first()
    with pytest.raises(SaslClientError, match=words) as raised:
        client.evaluate(server_first)
    assert SECRET not in str(raised.value)
    with pytest.raises(SaslClientError):  # a failed exchange stays failed
        client.evaluate(b"v=AAAA")


def test_server_final_error_and_garbage():
    for final, words in ((b"e=invalid-proof", "failed with error: invalid-proof"), (b"x=1", "invalid server final")):
        client = ScramClient("SCRAM-SHA-512", "broker", SECRET, nonce="cnonce")
        client.first()
        client.evaluate(b"r=cnonceSRV,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
        with pytest.raises(SaslClientError, match=words):
            client.evaluate(final)


def test_unknown_mechanism_and_missing_credentials():
    with pytest.raises(SaslClientError, match="GSSAPI is not supported"):
        sasl_client("GSSAPI", "a", "b")
    with pytest.raises(SaslClientError, match="needs a username and a password"):
        sasl_client("SCRAM-SHA-256", "a", "")


def test_inter_broker_credentials_come_from_the_listeners_jaas_entry():
    configs = {"listener.name.internal.scram-sha-256.sasl.jaas.config":
               f'org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" password="{SECRET}";',
               "listener.name.internal.plain.sasl.jaas.config":
               'org.apache.kafka.common.security.plain.PlainLoginModule required user_admin="x";'}
    assert inter_broker_credentials("INTERNAL", "SCRAM-SHA-256", configs) == ("broker", SECRET)
    with pytest.raises(SaslClientError, match="needs username and password") as raised:
        inter_broker_credentials("INTERNAL", "PLAIN", configs)
    assert "listener.name.internal.plain.sasl.jaas.config" in str(raised.value)
    with pytest.raises(SaslClientError, match="listener.name.internal.scram-sha-512.sasl.jaas.config"):
        inter_broker_credentials("INTERNAL", "SCRAM-SHA-512", configs)
    with pytest.raises(SaslClientError, match="GSSAPI"):
        inter_broker_credentials("INTERNAL", "GSSAPI", configs)


def test_inter_broker_credentials_from_a_broker_configs_password_value():
    """The broker's typed configs hold sasl.jaas.config as a Password (its str hides it): read its value."""
    from pykbroker.config import Password, broker_config_def

    key = "listener.name.internal.plain.sasl.jaas.config"
    typed = broker_config_def(key).parse(f'org.apache.kafka.common.security.plain.PlainLoginModule required '
                                         f'username="broker" password="{SECRET}";')
    assert isinstance(typed, Password)  # as a config file or --override gives it
    assert inter_broker_credentials("INTERNAL", "PLAIN", {key: typed}) == ("broker", SECRET)

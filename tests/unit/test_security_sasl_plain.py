"""SASL/PLAIN (Kafka 3.7's PlainSaslServer + PlainServerCallbackHandler) with kafka-python's PLAIN client,
Kafka's messages for each failure, and the mechanism registry built from server.properties (shared by every
mechanism: sasl.enabled.mechanisms, per-listener JAAS, callback handler classes, the receive-size bound)."""

from __future__ import annotations

import logging

import pytest

from pykbroker.security import credentials as cred
from pykbroker.security.jaas import PLAIN_LOGIN_MODULE, JaasConfigError, parse_jaas_config
from pykbroker.security.sasl import (
    IllegalSaslState,
    SaslAuthenticationFailed,
    SaslConfigError,
    UnsupportedSaslMechanism,
    build_listener_mechanisms,
    enabled_mechanisms,
    lookup_factory,
)
from pykbroker.security.sasl.plain import PlainServerFactory

JAAS = f'{PLAIN_LOGIN_MODULE} required username="admin" password="admin-secret" user_admin="admin-secret" ' \
       f'user_alice="alice-secret" user_\u00e9l\u00e8ve="\u00fcml\u00e4ut";'
INVALID = "Authentication failed: Invalid username or password"


@pytest.fixture
def factory():
    return PlainServerFactory(parse_jaas_config(JAAS))


def failure(server, data) -> SaslAuthenticationFailed:
    with pytest.raises(SaslAuthenticationFailed) as e:
        server.evaluate(data)
    assert e.value.error_code == 58
    return e.value


def kafka_python_plain(user: str, password: str):
    from kafka.net.sasl.plain import SaslMechanismPlain

    return SaslMechanismPlain(sasl_plain_username=user, sasl_plain_password=password)


def test_kafka_python_plain_client_authenticates(factory):
    client = kafka_python_plain("alice", "alice-secret")
    server = factory.new_server()
    client.receive(server.evaluate(client.auth_bytes()))  # kafka-python sends authzid = user
    assert client.is_authenticated() and server.complete and server.authorized_id == "alice"
    assert server.credential_expiry_ms is None and server.extensions == {}
    with pytest.raises(IllegalSaslState):
        server.evaluate(client.auth_bytes())


def test_non_ascii_users_and_passwords(factory):
    server = factory.new_server()
    assert server.evaluate("\x00\u00e9l\u00e8ve\x00\u00fcml\u00e4ut".encode()) == b""
    assert server.authorized_id == "\u00e9l\u00e8ve"


def test_wrong_password_and_unknown_user_say_the_same(factory, caplog):
    caplog.set_level(logging.DEBUG, logger="pykbroker")
    assert failure(factory.new_server(), b"\x00alice\x00wrong-pw").client_message() == INVALID
    assert failure(factory.new_server(), b"\x00mallory\x00alice-secret").client_message() == INVALID
    assert "wrong-pw" not in caplog.text and "alice-secret" not in caplog.text


def test_options_that_are_not_users_are_not_users(factory):
    # "username"/"password" are the broker's own client credentials, not a user "name"
    assert failure(factory.new_server(), b"\x00name\x00admin").client_message() == INVALID
    assert failure(factory.new_server(), b"\x00\x00admin-secret").client_message() == \
        "Authentication failed: username not specified"


def test_only_plain_login_module_entries_hold_users():
    entries = parse_jaas_config(f'x.Other required user_bob="b"; {PLAIN_LOGIN_MODULE} required user_al="a";')
    f = PlainServerFactory(entries)
    assert failure(f.new_server(), b"\x00bob\x00b").client_message() == INVALID
    assert f.new_server().evaluate(b"\x00al\x00a") == b""


@pytest.mark.parametrize("data, message", [
    (b"", "Invalid SASL/PLAIN response: expected 3 tokens, got 1"),
    (b"alice", "Invalid SASL/PLAIN response: expected 3 tokens, got 1"),
    (b"\x00alice", "Invalid SASL/PLAIN response: expected 3 tokens, got 2"),
    (b"\x00alice\x00pw\x00extra", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
    (b"a\x00b\x00c\x00d\x00e\x00f", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
    (b"\x00\x00pw", "Authentication failed: username not specified"),
    (b"\x00alice\x00", "Authentication failed: password not specified"),
    (b"admin\x00alice\x00alice-secret",
     "Authentication failed: Client requested an authorization id that is different from username"),
    (b"\x00alice\x00\xff\xfe", "Invalid SASL/PLAIN response: not valid UTF-8"),
    (b"\x00al\xc3ice\x00x", "Invalid SASL/PLAIN response: not valid UTF-8"),
    (b"\x00alice\x00" + b"x" * 524_289, "Failing SASL authentication due to invalid receive size"),
])
def test_bad_responses_get_kafkas_messages(factory, data, message):
    assert failure(factory.new_server(), data).client_message() == message


def test_authzid_equal_to_user_is_accepted(factory):
    assert factory.new_server().evaluate(b"alice\x00alice\x00alice-secret") == b""


def test_custom_authenticate_callback_and_its_failure():
    f = PlainServerFactory(authenticate=lambda u, p: (u, p) == ("x", "y"))
    assert f.new_server().evaluate(b"\x00x\x00y") == b""

    def broken(user, password):
        raise RuntimeError("directory down")

    e = failure(PlainServerFactory(authenticate=broken).new_server(), b"\x00x\x00y")
    assert e.client_message() == "Authentication failed: credentials for user could not be verified"


def test_failed_server_refuses_more_tokens(factory):
    server = factory.new_server()
    failure(server, b"\x00alice\x00nope")
    with pytest.raises(IllegalSaslState) as e:
        server.evaluate(b"\x00alice\x00alice-secret")
    assert e.value.error_code == 34 and "FAILED" in str(e.value)


# --- the registry, from server.properties --------------------------------------------------------------------

def props(**extra):
    base = {
        "sasl.enabled.mechanisms": "PLAIN, SCRAM-SHA-512,OAUTHBEARER",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
            'org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="x";',
        "listener.name.sasl_ssl.oauthbearer.sasl.jaas.config":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            'unsecuredValidatorRequiredScope="kafka";',
    }
    base.update(extra)
    return base


def test_factories_for_the_enabled_mechanisms_in_order():
    cache = cred.ScramCredentialCache()
    cache.put("SCRAM-SHA-512", "alice", cred.generate_credential("SCRAM-SHA-512", "alice-secret"))
    factories = build_listener_mechanisms("SASL_SSL", props(), credentials=cache)
    assert list(factories) == ["PLAIN", "SCRAM-SHA-512", "OAUTHBEARER"]
    assert factories["PLAIN"].new_server().evaluate(b"\x00alice\x00alice-secret") == b""
    assert factories["SCRAM-SHA-512"].new_server().evaluate(b"n,,n=alice,r=abc").startswith(b"r=abc")
    assert factories["OAUTHBEARER"].validator.required_scope == ["kafka"]
    assert lookup_factory(factories, "PLAIN") is factories["PLAIN"]
    with pytest.raises(UnsupportedSaslMechanism) as e:
        lookup_factory(factories, "plain")  # Kafka compares mechanism names exactly
    assert e.value.error_code == 33 and e.value.enabled == ["PLAIN", "SCRAM-SHA-512", "OAUTHBEARER"]
    assert str(e.value) == "Unsupported SASL mechanism plain"


def test_listener_prefixed_enabled_mechanisms_win():
    configs = props(**{"listener.name.sasl_ssl.sasl.enabled.mechanisms": "PLAIN"})
    assert enabled_mechanisms("SASL_SSL", configs) == ["PLAIN"]
    assert enabled_mechanisms("OTHER", configs) == ["PLAIN", "SCRAM-SHA-512", "OAUTHBEARER"]
    assert enabled_mechanisms("X", {}) == ["GSSAPI"]  # Kafka's default


def test_startup_errors_name_the_problem():
    with pytest.raises(SaslConfigError, match="GSSAPI is not supported"):
        build_listener_mechanisms("SASL_SSL", {})
    with pytest.raises(JaasConfigError, match="listener.name.other.plain.sasl.jaas.config"):
        build_listener_mechanisms("OTHER", props(), credentials=cred.ScramCredentialCache())
    with pytest.raises(SaslConfigError, match="SCRAM credential store"):
        build_listener_mechanisms("SASL_SSL", props())
    with pytest.raises(SaslConfigError, match="cannot load Java callback handlers"):
        build_listener_mechanisms("SASL_SSL", props(**{
            "listener.name.sasl_ssl.plain.sasl.server.callback.handler.class": "com.example.MyHandler"}),
            credentials=cred.ScramCredentialCache())
    with pytest.raises(SaslConfigError, match="sasl.server.max.receive.size"):
        build_listener_mechanisms("SASL_SSL", props(**{"sasl.server.max.receive.size": "big"}),
                                  credentials=cred.ScramCredentialCache())
    with pytest.raises(SaslConfigError, match="is empty"):
        build_listener_mechanisms("SASL_SSL", {"sasl.enabled.mechanisms": ""})


def test_an_unprefixed_callback_handler_class_is_ignored_as_in_kafka():
    configs = props(**{"sasl.server.callback.handler.class": "com.example.MyHandler",
                       "listener.name.sasl_ssl.sasl.server.callback.handler.class": "com.example.MyHandler"})
    factories = build_listener_mechanisms("SASL_SSL", configs, credentials=cred.ScramCredentialCache())
    assert factories["PLAIN"].new_server().evaluate(b"\x00alice\x00alice-secret") == b""


def test_kafkas_own_callback_handler_names_are_accepted_and_the_receive_bound_is_configurable():
    configs = props(**{
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.server.callback.handler.class":
            "org.apache.kafka.common.security.plain.internals.PlainServerCallbackHandler",
        "sasl.server.max.receive.size": "64"})
    factory = build_listener_mechanisms("SASL_SSL", configs)["PLAIN"]
    assert failure(factory.new_server(), b"\x00alice\x00" + b"x" * 60).client_message() == \
        "Failing SASL authentication due to invalid receive size"


# --- differential: the same responses through Kafka 3.7.1's own PlainSaslServer --------------------------------

JAVA_PLAIN = r"""
package org.apache.kafka.common.security.plain.internals;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.Collections;
import java.util.HashMap;
import java.util.Map;
import javax.security.auth.login.AppConfigurationEntry;

// Each stdin line (base64) is the one response of a fresh PlainSaslServer whose JAAS entry has user_alice and
// user_bob; prints "OK <authorization id>", "AUTHEXC <message>" or "OTHER <class>".
public class PykPlainProbe {
    public static void main(String[] a) throws Exception {
        Map<String, String> options = new HashMap<>();
        options.put("user_alice", "alice-secret");
        options.put("user_bob", "b\u00f6b");
        PlainServerCallbackHandler h = new PlainServerCallbackHandler();
        h.configure(new HashMap<>(), "PLAIN", Collections.singletonList(new AppConfigurationEntry(
            "org.apache.kafka.common.security.plain.PlainLoginModule",
            AppConfigurationEntry.LoginModuleControlFlag.REQUIRED, options)));
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            PlainSaslServer server = new PlainSaslServer(h);
            try {
                server.evaluateResponse(Base64.getDecoder().decode(line));
                System.out.println("OK " + server.getAuthorizationID());
            } catch (org.apache.kafka.common.errors.SaslAuthenticationException e) {
                System.out.println("AUTHEXC " + e.getMessage());
            } catch (Exception e) {
                System.out.println("OTHER " + e.getClass().getSimpleName());
            }
        }
    }
}
"""


def test_responses_judged_as_kafkas_plain_server_judges_them(tmp_path):
    import base64
    import random
    import subprocess

    from tests.unit.test_security_jaas import kafka_java_probe

    java = kafka_java_probe(tmp_path, JAVA_PLAIN, "org.apache.kafka.common.security.plain.internals.PykPlainProbe", [])
    factory = PlainServerFactory(parse_jaas_config(
        f'{PLAIN_LOGIN_MODULE} required user_alice="alice-secret" user_bob="b\u00f6b";'))
    rng = random.Random(4616)
    pieces = [b"\x00", b"alice", b"bob", b"alice-secret", "b\u00f6b".encode(), b"x", b"", b"\xc3", b"\x00\x00"]
    messages = [b"\x00alice\x00alice-secret", b"alice\x00alice\x00alice-secret", b"bob\x00alice\x00alice-secret",
                "\x00bob\x00b\u00f6b".encode(), b"\x00bob\x00bob", b"\x00alice\x00alice-secret\x00"]
    messages += [b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 7))) for _ in range(400)]
    done = subprocess.run(java, input="".join(base64.b64encode(m).decode() + "\n" for m in messages),
                          capture_output=True, text=True, timeout=240, check=True)
    kafkas = done.stdout.splitlines()
    assert len(kafkas) == len(messages), done.stderr[-3000:]
    assert kafkas[:4] == ["OK alice", "OK alice", "AUTHEXC Authentication failed: Client requested an authorization id "
                          "that is different from username", "OK bob"]
    for m, k in zip(messages, kafkas):
        server = factory.new_server()
        try:
            server.evaluate(m)
            ours = f"OK {server.authorized_id}"
        except SaslAuthenticationFailed as e:
            ours = f"AUTHEXC {e.message}"
        try:
            m.decode("utf-8")
        except UnicodeDecodeError:  # Kafka reads U+FFFD where we refuse the bytes (see plain.py)
            assert ours == "AUTHEXC Invalid SASL/PLAIN response: not valid UTF-8"
            continue
        assert ours == k, m

"""SCRAM-SHA-256/512 server state machine (Kafka 3.7's ScramSaslServer rules): the RFC 7677 test vector
replayed byte for byte, kafka-python's SCRAM client and Kafka's own Java ScramSaslClient (reference kit)
driven against it in-process, and every bad input ending in SaslAuthenticationFailed with Kafka's message."""

from __future__ import annotations

import base64
import logging

import pytest

from pykbroker.security import credentials as cred
from pykbroker.security.sasl import IllegalSaslState, SaslAuthenticationFailed
from pykbroker.security.sasl.scram import ScramServerFactory, saslname_from_username, username_from_saslname

GENERIC = "Authentication failed during authentication due to invalid credentials with SASL mechanism {}"
MECHANISMS = ["SCRAM-SHA-256", "SCRAM-SHA-512"]


def cache_with(users: dict[str, str], iterations: int = 4096) -> cred.ScramCredentialCache:
    cache = cred.ScramCredentialCache()
    for user, password in users.items():
        for mech in MECHANISMS:
            cache.put(mech, user, cred.generate_credential(mech, password, iterations))
    return cache


@pytest.fixture
def cache():
    return cache_with({"alice": "alice-secret", "user,with=odd": "pw-odd"})


def kafka_python_client(user: str, password: str, mechanism: str):
    from kafka.net.sasl.scram import SaslMechanismScram

    return SaslMechanismScram(sasl_plain_username=user, sasl_plain_password=password, sasl_mechanism=mechanism)


def failure(server, data: bytes) -> SaslAuthenticationFailed:
    with pytest.raises(SaslAuthenticationFailed) as e:
        server.evaluate(data)
    assert e.value.error_code == 58
    return e.value


def test_rfc7677_exchange_replayed_exactly():
    cache = cred.ScramCredentialCache()
    cache.put("SCRAM-SHA-256", "user",
              cred.generate_credential("SCRAM-SHA-256", "pencil", 4096, salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")))
    server = ScramServerFactory("SCRAM-SHA-256", cache, server_nonce=lambda: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0").new_server()
    assert server.evaluate(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == \
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    assert not server.complete
    assert server.evaluate(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                           b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=") == \
        b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.complete and server.authorized_id == "user"
    assert server.credential_expiry_ms is None and not server.token_authenticated


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_client_authenticates(cache, mechanism):
    client = kafka_python_client("alice", "alice-secret", mechanism)
    server = ScramServerFactory(mechanism, cache).new_server()
    client.receive(server.evaluate(client.auth_bytes()))
    client.receive(server.evaluate(client.auth_bytes()))  # raises if the server signature were wrong
    assert client.is_done() and server.complete and server.authorized_id == "alice"
    with pytest.raises(IllegalSaslState) as e:
        server.evaluate(b"n,,n=alice,r=x")
    assert e.value.error_code == 34 and "COMPLETE" in str(e.value)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_odd_user_names_are_escaped_as_rfc5802_says(cache, mechanism):
    assert saslname_from_username("user,with=odd") == "user=2Cwith=3Dodd"
    assert username_from_saslname("user=2Cwith=3Dodd") == "user,with=odd"
    server = ScramServerFactory(mechanism, cache).new_server()
    first = server.evaluate(b"n,,n=user=2Cwith=3Dodd,r=abc")
    assert first.startswith(b"r=abc")


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_wrong_password_fails_with_kafkas_generic_message(cache, mechanism, caplog):
    caplog.set_level(logging.DEBUG, logger="pykbroker")
    client = kafka_python_client("alice", "wrong-password", mechanism)
    server = ScramServerFactory(mechanism, cache).new_server()
    client.receive(server.evaluate(client.auth_bytes()))
    final = client.auth_bytes()
    e = failure(server, final)
    assert e.client_message() == GENERIC.format(mechanism)
    assert e.client_message(reauthenticating=True) == GENERIC.format(mechanism).replace(
        "during authentication", "during re-authentication")
    assert "Invalid client credentials" in e.detail
    assert str(e) == f"{GENERIC.format(mechanism)} (Invalid client credentials)"  # what the debug line says
    proof = final.split(b",p=")[1].decode()
    assert proof not in caplog.text and proof not in str(e)  # the proof is never logged
    assert "wrong-password" not in caplog.text
    with pytest.raises(IllegalSaslState):
        server.evaluate(final)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_unknown_user_fails_on_the_first_message_as_in_kafka(cache, mechanism):
    server = ScramServerFactory(mechanism, cache).new_server()
    e = failure(server, b"n,,n=mallory,r=abcdef")
    assert e.client_message() == GENERIC.format(mechanism)
    assert "Invalid user credentials" in e.detail


def _first_two(mechanism, cache, user="alice", password="alice-secret"):
    client = kafka_python_client(user, password, mechanism)
    server = ScramServerFactory(mechanism, cache).new_server()
    client.receive(server.evaluate(client.auth_bytes()))
    return server, client.auth_bytes()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_tampered_nonce_fails(cache, mechanism):
    server, final = _first_two(mechanism, cache)
    head, rest = final.split(b",r=", 1)
    nonce, tail = rest.split(b",p=", 1)
    tampered = head + b",r=" + nonce[:-1] + (b"A" if nonce[-1:] != b"A" else b"B") + b",p=" + tail
    e = failure(server, tampered)
    assert e.client_message() == GENERIC.format(mechanism)
    assert "nonce" in e.detail


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_2_0s_repeated_client_nonce_is_accepted_as_kafka_3_accepts_it(cache, mechanism):
    """librdkafka 2.0.2 (Debian's kcat 1.7.1) sends r=<client nonce><client nonce><server nonce> in its final
    message, with the proof computed over that message: Kafka 3.x authenticates it (3.7.1 never looks at the nonce,
    3.8/3.9 check endsWith), so pykbroker does; a final nonce not ending with the server's still fails."""
    m = cred.scram_mechanism(mechanism)
    server = ScramServerFactory(mechanism, cache).new_server()
    client_nonce = "fyko+d2lbbFgONRv9qkxdawL"
    first_bare = f"n=alice,r={client_nonce}"
    server_first = server.evaluate(b"n,," + first_bare.encode()).decode()
    fields = dict(part.split("=", 1) for part in server_first.split(","))
    salted = cred.salted_password(m, "alice-secret", base64.b64decode(fields["s"]), int(fields["i"]))
    without_proof = f"c=biws,r={client_nonce}{fields['r']}"  # the client nonce twice, as librdkafka 2.0.2
    auth_message = f"{first_bare},{server_first},{without_proof}".encode()
    key = cred.client_key(m, salted)
    proof = cred.xor(key, cred.client_signature(m, cred.stored_key(m, key), auth_message))
    final = f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
    server.evaluate(final)
    assert server.complete and server.authorized_id == "alice"


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_replayed_final_message_fails_on_a_new_exchange(cache, mechanism):
    """A proof captured from one exchange is worthless on the next: the server nonce differs."""
    server, final = _first_two(mechanism, cache)
    server.evaluate(final)
    assert server.complete
    replay = ScramServerFactory(mechanism, cache).new_server()
    client_nonce = final.split(b",r=")[1][:32]  # kafka-python's nonce: 32 hex digits, then the server's part
    replay.evaluate(b"n,,n=alice,r=" + client_nonce)  # the same client-first message again
    e = failure(replay, final)
    assert e.client_message() == GENERIC.format(mechanism)
    assert "nonce" in e.detail


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_channel_binding_is_refused_as_kafka_does(cache, mechanism):
    for first in (b"y,,n=alice,r=abc", b"p=tls-unique,,n=alice,r=abc"):
        e = failure(ScramServerFactory(mechanism, cache).new_server(), first)
        assert e.client_message() == GENERIC.format(mechanism)
        assert "Invalid SCRAM client first message format" in e.detail
    # the final message must repeat the gs2 header: c=biws is "n,,"
    server, final = _first_two(mechanism, cache)
    forged = final.replace(b"c=biws", b"c=" + base64.b64encode(b"y,,"))
    assert "channel binding" in failure(server, forged).detail


def test_authzid_other_than_the_user_gets_kafkas_specific_message(cache):
    server = ScramServerFactory("SCRAM-SHA-256", cache).new_server()
    e = failure(server, b"n,a=admin,n=alice,r=abc")
    assert e.client_message() == ("Authentication failed: Client requested an authorization id that is "
                                  "different from username")
    assert ScramServerFactory("SCRAM-SHA-256", cache).new_server().evaluate(b"n,a=alice,n=alice,r=abc")


def test_too_few_iterations_are_refused():
    cache = cred.ScramCredentialCache()
    weak = cred.credential_from_salted_password(cred.SCRAM_SHA_256, b"s", b"\x00" * 32, 1024)
    cache.put("SCRAM-SHA-256", "weak", weak)
    e = failure(ScramServerFactory("SCRAM-SHA-256", cache).new_server(), b"n,,n=weak,r=abc")
    assert e.detail == "Iterations 1024 is less than the minimum 4096 for SCRAM-SHA-256"


def test_token_auth_without_delegation_tokens_is_an_invalid_token_id(cache):
    server = ScramServerFactory("SCRAM-SHA-256", cache).new_server()
    e = failure(server, b"n,,n=token-id-1,r=abc,tokenauth=true")
    assert e.client_message() == GENERIC.format("SCRAM-SHA-256")
    assert e.detail == "Token Authentication failed: Invalid tokenId : 'token-id-1'"


def test_token_auth_with_a_delegation_token():
    """tokenauth=true: the user name is the token id, the HMAC of the token is the password, the principal the
    token owner (Kafka's DelegationTokenCredentialCallback)."""
    token_cred = cred.generate_credential("SCRAM-SHA-512", "token-hmac")
    lookup = {"tok1": ("owner-bob", token_cred, 1_900_000_000_000)}.get
    factory = ScramServerFactory("SCRAM-SHA-512", cred.ScramCredentialCache(), delegation_tokens=lookup)
    from kafka.net.sasl.scram import ScramClient

    client = ScramClient("tok1", "token-hmac", "SCRAM-SHA-512")
    server = factory.new_server()
    first = client.first_message() + b",tokenauth=true"
    client.auth_message += b",tokenauth=true"
    client.process_server_first_message(server.evaluate(first))
    client.process_server_final_message(server.evaluate(client.final_message()))
    assert server.authorized_id == "owner-bob" and server.token_authenticated
    assert server.credential_expiry_ms == 1_900_000_000_000
    assert server.extensions == {"tokenauth": "true"}


def test_unknown_extensions_are_ignored(cache):
    server = ScramServerFactory("SCRAM-SHA-256", cache).new_server()
    assert server.evaluate(b"n,,n=alice,r=abc,foo=bar").startswith(b"r=abc")


MALFORMED_FIRST = [
    b"", b"n", b"n,,", b"n,,n=,r=abc", b"n,,n=alice", b"n,,n=alice,r=", b"n,,n=ali=ce,r=abc", b"n,,r=abc,n=alice",
    b"n,,n=alice,r=a,b", b"\xff\xfe\x00", b"n,,n=al\xc3\xa9ce,r=abc", b"n,,n=alice,r=abc\x00", b"\x00" * 100,
    b"n,,n=alice,r=abc,1=2", b"n,,n=alice,r=" + b"x" * 600_000,
]


@pytest.mark.parametrize("data", MALFORMED_FIRST, ids=lambda d: repr(d[:30]))
def test_malformed_first_messages_fail_cleanly(cache, data):
    e = failure(ScramServerFactory("SCRAM-SHA-256", cache).new_server(), data)
    if len(data) > 524288:
        assert e.client_message() == "Failing SASL authentication due to invalid receive size"
    else:
        assert e.client_message() == GENERIC.format("SCRAM-SHA-256")


@pytest.mark.parametrize("mutate", [
    lambda f: b"", lambda f: f + b",", lambda f: f.replace(b"c=biws", b"c=bi"), lambda f: f.split(b",p=")[0],
    lambda f: f.split(b",p=")[0] + b",p=AAAA", lambda f: f.split(b",p=")[0] + b",p=" + b"A" * 88,
    lambda f: f.split(b",p=")[0] + b",p=!!!!", lambda f: f + b"\xff", lambda f: b"\xc3(" + f,
    lambda f: f.replace(b"c=biws,", b""), lambda f: f.split(b",p=")[0] + b",x=1,p=" + f.split(b",p=")[1],
])
def test_malformed_final_messages_fail_cleanly(cache, mutate):
    server, final = _first_two("SCRAM-SHA-256", cache)
    e = failure(server, mutate(final))
    assert e.client_message() == GENERIC.format("SCRAM-SHA-256")
    assert final.split(b",p=")[1].decode() not in str(e)


def test_a_failing_credential_store_is_an_authentication_failure():
    class Broken:
        def get(self, mechanism, user):
            raise OSError("disk gone")

    e = failure(ScramServerFactory("SCRAM-SHA-256", Broken()).new_server(), b"n,,n=alice,r=abc")
    assert "Credentials could not be obtained" in e.detail


def test_unfinished_exchange_has_no_identity(cache):
    server = ScramServerFactory("SCRAM-SHA-256", cache).new_server()
    with pytest.raises(IllegalSaslState, match="has not completed"):
        server.authorized_id
    assert isinstance(server.evaluate(b"n,,n=alice,r=abc"), bytes)
    with pytest.raises(IllegalSaslState):
        server.credential_expiry_ms


def test_not_bytes_is_a_failure_not_a_crash(cache):
    failure(ScramServerFactory("SCRAM-SHA-256", cache).new_server(), "n,,n=alice,r=abc")  # type: ignore[arg-type]


# --- Kafka's own SCRAM client and ScramFormatter (reference kit) ---------------------------------------------

JAVA_CLIENT = r"""
package org.apache.kafka.common.security.scram.internals;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.Collections;
import javax.security.auth.callback.Callback;
import javax.security.auth.callback.NameCallback;
import javax.security.auth.callback.PasswordCallback;
import org.apache.kafka.common.security.scram.ScramExtensionsCallback;

// "client <mech> <user> <password>": Kafka's ScramSaslClient; reads server tokens (base64 lines), prints its
// tokens (base64 lines), "DONE" when complete or "ERR <message>".
// "cred <mech> <password> <base64 salt> <iterations>": ScramFormatter + ScramCredentialUtils' string.
public class PykScramProbe {
    public static void main(String[] a) throws Exception {
        ScramMechanism mech = ScramMechanism.forMechanismName(a[1]);
        if (a[0].equals("cred")) {
            System.out.println(ScramCredentialUtils.credentialToString(new ScramFormatter(mech).generateCredential(
                Base64.getDecoder().decode(a[3]),
                new ScramFormatter(mech).saltedPassword(a[2], Base64.getDecoder().decode(a[3]), Integer.parseInt(a[4])),
                Integer.parseInt(a[4]))));
            return;
        }
        ScramSaslClient client = new ScramSaslClient(mech, (Callback[] cbs) -> {
            for (Callback cb : cbs) {
                if (cb instanceof NameCallback) ((NameCallback) cb).setName(a[2]);
                else if (cb instanceof PasswordCallback) ((PasswordCallback) cb).setPassword(a[3].toCharArray());
                else if (cb instanceof ScramExtensionsCallback) ((ScramExtensionsCallback) cb).extensions(Collections.emptyMap());
            }
        });
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try {
            byte[] out = client.evaluateChallenge(new byte[0]);
            while (true) {
                System.out.println(Base64.getEncoder().encodeToString(out));
                System.out.flush();
                String line = in.readLine();
                if (line == null) return;
                out = client.evaluateChallenge(Base64.getDecoder().decode(line));
                if (client.isComplete()) { System.out.println("DONE"); return; }
            }
        } catch (Exception e) {
            System.out.println("ERR " + e.getMessage());
        }
    }
}
"""


@pytest.fixture(scope="module")
def java_probe(tmp_path_factory):
    from tests.unit.test_security_jaas import kafka_java_probe

    return kafka_java_probe(tmp_path_factory.mktemp("scram-probe"), JAVA_CLIENT,
                            "org.apache.kafka.common.security.scram.internals.PykScramProbe", [])


def _java_exchange(java_probe, server, mechanism, user, password) -> list[str]:
    import subprocess

    proc = subprocess.Popen(java_probe + ["client", mechanism, user, password], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said = []
        for _ in range(3):
            line = proc.stdout.readline().strip()
            said.append(line)
            if line in ("DONE", "") or line.startswith("ERR"):
                break
            try:
                reply = server.evaluate(base64.b64decode(line))
            except SaslAuthenticationFailed as e:
                said.append(f"FAILED {e.client_message()}")
                break
            proc.stdin.write(base64.b64encode(reply).decode() + "\n")
            proc.stdin.flush()
        return said
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafkas_java_scram_client_authenticates(java_probe, cache, mechanism):
    server = ScramServerFactory(mechanism, cache).new_server()
    said = _java_exchange(java_probe, server, mechanism, "alice", "alice-secret")
    assert said[-1] == "DONE", said  # Kafka's client checked our server signature
    assert server.complete and server.authorized_id == "alice"


def test_kafkas_java_scram_client_with_a_wrong_password(java_probe, cache):
    server = ScramServerFactory("SCRAM-SHA-512", cache).new_server()
    said = _java_exchange(java_probe, server, "SCRAM-SHA-512", "alice", "nope")
    assert said[-1] == "FAILED " + GENERIC.format("SCRAM-SHA-512"), said


@pytest.mark.parametrize("mechanism, iterations", [("SCRAM-SHA-256", 4096), ("SCRAM-SHA-512", 8192)])
def test_credential_string_is_kafkas_scram_formatter(java_probe, mechanism, iterations):
    import subprocess

    salt = b"kafka-salt-\x00\xff"
    done = subprocess.run(java_probe + ["cred", mechanism, "p\u00e4ss word", base64.b64encode(salt).decode(),
                                        str(iterations)], capture_output=True, text=True, timeout=120, check=True)
    ours = cred.credential_to_string(cred.generate_credential(mechanism, "p\u00e4ss word", iterations, salt=salt))
    assert done.stdout.strip() == ours


# --- differential: malformed messages through Kafka 3.7.1's own ScramSaslServer --------------------------------

JAVA_SERVER = r"""
package org.apache.kafka.common.security.scram.internals;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.HashMap;
import javax.security.auth.callback.Callback;
import javax.security.auth.callback.NameCallback;
import org.apache.kafka.common.security.scram.ScramCredential;
import org.apache.kafka.common.security.scram.ScramCredentialCallback;

// "<mech> <base64 first message or ->": Kafka's ScramSaslServer with user alice (password alice-secret); each
// stdin line (base64) is the first message (or, after the given first message, the final one) of a fresh server.
// Prints "OK", or "SASLEXC" (a SaslException: the client gets the generic text), or "AUTHEXC <message>" (a
// SaslAuthenticationException: the client gets the message), or "OTHER <class>" (the connection just closes).
public class PykScramServerProbe {
    public static void main(String[] a) throws Exception {
        ScramMechanism mech = ScramMechanism.forMechanismName(a[0]);
        ScramFormatter f = new ScramFormatter(mech);
        byte[] salt = "pyk-salt".getBytes(StandardCharsets.UTF_8);
        ScramCredential alice = f.generateCredential(salt, f.saltedPassword("alice-secret", salt, 4096), 4096);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            ScramSaslServer server = new ScramSaslServer(mech, new HashMap<>(), (Callback[] cbs) -> {
                String user = null;
                for (Callback cb : cbs) {
                    if (cb instanceof NameCallback) user = ((NameCallback) cb).getDefaultName();
                    else if (cb instanceof ScramCredentialCallback && "alice".equals(user))
                        ((ScramCredentialCallback) cb).scramCredential(alice);
                }
            });
            try {
                if (!a[1].equals("-")) server.evaluateResponse(Base64.getDecoder().decode(a[1]));
                server.evaluateResponse(Base64.getDecoder().decode(line));
                System.out.println("OK");
            } catch (org.apache.kafka.common.errors.SaslAuthenticationException e) {
                System.out.println("AUTHEXC " + e.getMessage());
            } catch (javax.security.sasl.SaslException e) {
                System.out.println("SASLEXC");
            } catch (Exception e) {
                System.out.println("OTHER " + e.getClass().getSimpleName());
            }
        }
    }
}
"""


@pytest.fixture(scope="module")
def kafka_server_probe(tmp_path_factory):
    import subprocess

    from tests.unit.test_security_jaas import kafka_java_probe

    java = kafka_java_probe(tmp_path_factory.mktemp("scram-server-probe"), JAVA_SERVER,
                            "org.apache.kafka.common.security.scram.internals.PykScramServerProbe", [])

    def run(mechanism: str, first: bytes | None, messages: list[bytes]) -> list[str]:
        done = subprocess.run(java + [mechanism, base64.b64encode(first).decode() if first else "-"],
                              input="".join(base64.b64encode(m).decode() + "\n" for m in messages),
                              capture_output=True, text=True, timeout=240, check=True)
        out = done.stdout.splitlines()
        assert len(out) == len(messages), done.stderr[-3000:]
        return out

    return run


def _ours_outcome(factory, first: bytes | None, message: bytes) -> str:
    server = factory.new_server()
    try:
        if first is not None:
            server.evaluate(first)
        server.evaluate(message)
        return "OK"
    except SaslAuthenticationFailed as e:
        return "SASLEXC" if e.message is None else f"AUTHEXC {e.message}"


def _mutations(seed: bytes, rng, count: int) -> list[bytes]:
    pieces = [b",", b"=", b"n", b"a=", b"r=", b"m=x,", b"=2C", b"=3D", b"=2", b"\x00", b"\xff", b"\xc3\xa9", b" ",
              b"tokenauth=true", b"p=", b"c=", b"biws", b"AAAA", b"==", b"y", b"~"]
    out = []
    for _ in range(count):
        data = bytearray(seed)
        for _ in range(rng.randint(1, 3)):
            i = rng.randint(0, len(data))
            op = rng.randrange(3)
            if op == 0 and data:
                del data[i:i + rng.randint(1, 4)]
            elif op == 1:
                data[i:i] = rng.choice(pieces)
            elif data:
                data[min(i, len(data) - 1)] = rng.randrange(1, 128)
        out.append(bytes(data))
    return out


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_first_messages_judged_as_kafkas_server_judges_them(kafka_server_probe, mechanism):
    import random

    cache = cred.ScramCredentialCache()
    cache.put(mechanism, "alice", cred.generate_credential(mechanism, "alice-secret", 4096, salt=b"pyk-salt"))
    factory = ScramServerFactory(mechanism, cache)
    rng = random.Random(7677)
    fixed = [b"n,,n=alice,r=abc", b"n,a=alice,n=alice,r=abc", b"n,a=bob,n=alice,r=abc", b"n,,n=bob,r=abc",
             b"n,,m=ext,n=alice,r=abc", b"n,,n=alice,r=abc,tokenauth=false", b"n,,n=alice,r=abc,x=1,y=2",
             b"y,,n=alice,r=abc", b"n,,n=al=3Dice,r=abc", b"n,,n=alice,r=a\x7fb"] + MALFORMED_FIRST[:-1]
    messages = fixed + _mutations(b"n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL", rng, 300)
    kafkas = kafka_server_probe(mechanism, None, messages)
    differ = [(m, k, _ours_outcome(factory, None, m)) for m, k in zip(messages, kafkas)
              if k != _ours_outcome(factory, None, m)]
    assert not differ, "\n".join(f"{m!r}: kafka {k} / ours {o}" for m, k, o in differ[:10])


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_final_messages_judged_as_kafkas_server_judges_them(kafka_server_probe, mechanism):
    """Kafka 3.7.1 turns every bad final message into a SaslException (the generic text); a proof of the wrong
    length escapes as IllegalArgumentException there (the connection closes without an answer): we answer the
    generic failure instead."""
    import random

    cache = cred.ScramCredentialCache()
    cache.put(mechanism, "alice", cred.generate_credential(mechanism, "alice-secret", 4096, salt=b"pyk-salt"))
    factory = ScramServerFactory(mechanism, cache)
    first = b"n,,n=alice,r=fyko"
    rng = random.Random(5802)
    size = {"SCRAM-SHA-256": 32, "SCRAM-SHA-512": 64}[mechanism]
    seed = b"c=biws,r=fykoNONCE,p=" + base64.b64encode(bytes(size))
    messages = [seed, b"", b"c=biws,r=fyko,p=AAAA", b"c=biws,r=fyko,x=1,p=" + base64.b64encode(bytes(size))]
    messages += _mutations(seed, rng, 200)
    kafkas = kafka_server_probe(mechanism, first, messages)
    for m, k in zip(messages, kafkas):
        ours = _ours_outcome(factory, first, m)
        assert ours == ("SASLEXC" if k.startswith("OTHER") else k), (m, k, ours)

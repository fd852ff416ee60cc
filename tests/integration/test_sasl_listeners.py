"""SASL_PLAINTEXT and SASL_SSL listeners configured with Kafka's own property names (``sasl.enabled.mechanisms``,
``listener.name.<listener>.<mechanism>.sasl.jaas.config``, ``connections.max.reauth.ms``,
``connection.failed.authentication.delay.ms``): stock clients (confluent-kafka, kafka-python, aiokafka, kcat,
KafkaJS, the Java client) produce and consume through them with PLAIN and OAUTHBEARER (the clients' unsecured
tokens), and the bad inputs of issue 19 each get Kafka's answer on the wire (raw sockets): a wrong password, an
unknown mechanism, a request before authentication, an oversized token, garbage auth bytes, a flood of failed
logins (answered only after the delay, while another client keeps producing), KIP-43 raw tokens, KIP-368
re-authentication and session expiry. No password or token reaches the broker's log (debug level)."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("cryptography", reason="certificates for these tests are built with cryptography")
confluent_kafka = pytest.importorskip("confluent_kafka")

from kio.index import load_response_from_request  # noqa: E402
from kio.schema.api_versions.v3.request import ApiVersionsRequest  # noqa: E402
from kio.schema.errors import ErrorCode  # noqa: E402
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic  # noqa: E402
from kio.schema.sasl_authenticate.v0.request import SaslAuthenticateRequest as SaslAuthenticateV0  # noqa: E402
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest  # noqa: E402
from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as SaslHandshakeV0  # noqa: E402
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest  # noqa: E402
from kio.serial import entity_reader  # noqa: E402

from broker_process import BrokerProcess, free_port, read_exact, wait_until  # noqa: E402
from pykbroker.protocol.client import encode_request  # noqa: E402
from test_startup import assert_one_line_failure, serve  # noqa: E402
from test_tls_listeners import _round_trip_confluent  # noqa: E402
from tls_helpers import standard_pki  # noqa: E402

TIMEOUT_S = 60.0
DELAY_MS = 1000  # connection.failed.authentication.delay.ms of the module's broker
REAUTH_MS = 2000  # connections.max.reauth.ms of its REAUTH listener (PLAIN)
USERS = {"alice": "alice-s3cret-pw", "bob": "bob-s3cret-pw"}
# sasl.enabled.mechanisms=PLAIN,OAUTHBEARER,SCRAM-SHA-256,SCRAM-SHA-512 as Kafka lists them (its HashSet's order)
HANDSHAKE_ORDER = ["PLAIN", "SCRAM-SHA-512", "SCRAM-SHA-256", "OAUTHBEARER"]
SENT_TOKENS: list[str] = []  # every token _unsecured_jwt made, looked for in the broker's log at the end
SCRAM_USERS = {"sam": "sam-scr4m-pw", "sue": "sue-scr4m-pw"}  # given credentials by scram_users
PLAIN_JAAS = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
              + " ".join(f'user_{user}="{password}"' for user, password in USERS.items()) + ";")
OAUTH_JAAS = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
JS_DIR = Path(__file__).resolve().parents[1] / "js"
JAVA_DIR = Path(__file__).resolve().parent / "java"
NODE = shutil.which("node")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return standard_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory, pki):
    """PLAINTEXT (the test harness's probe), SASL_PLAINTEXT and SASL_SSL (PLAIN, OAUTHBEARER, SCRAM-SHA-256), and
    REAUTH, a SASL_PLAINTEXT listener whose PLAIN sessions last REAUTH_MS."""
    plain, sasl, sasl_ssl, reauth = free_port(), free_port(), free_port(), free_port()
    config = {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl},"
                     f"SASL_SSL://127.0.0.1:{sasl_ssl},REAUTH://127.0.0.1:{reauth}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,"
                                          "REAUTH:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN,OAUTHBEARER,SCRAM-SHA-256,SCRAM-SHA-512",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": pki.broker_pem_file,
        "connection.failed.authentication.delay.ms": DELAY_MS,
        "sasl.server.max.receive.size": 8192,
        "listener.name.reauth.sasl.enabled.mechanisms": "PLAIN,OAUTHBEARER",
        "listener.name.reauth.plain.connections.max.reauth.ms": REAUTH_MS,
        "num.partitions": 1,
        "offsets.topic.num.partitions": 2,
    }
    for listener in ("sasl_plaintext", "sasl_ssl", "reauth"):
        config[f"listener.name.{listener}.plain.sasl.jaas.config"] = PLAIN_JAAS
        config[f"listener.name.{listener}.oauthbearer.sasl.jaas.config"] = OAUTH_JAAS
        config[f"listener.name.{listener}.scram-sha-256.sasl.jaas.config"] = SCRAM_JAAS
        config[f"listener.name.{listener}.scram-sha-512.sasl.jaas.config"] = SCRAM_JAAS
    broker = BrokerProcess(tmp_path_factory.mktemp("sasl-broker"), config=config, port=plain)
    broker.sasl_port, broker.sasl_ssl_port, broker.reauth_port = sasl, sasl_ssl, reauth
    broker.start()
    try:
        yield broker
    finally:
        broker.close()
        log = broker.log_path.read_text(errors="replace")
        for secret in [*USERS.values(), *SCRAM_USERS.values()]:  # no password in any line, at debug level
            assert secret not in log
        for token in SENT_TOKENS:  # nor any OAUTHBEARER token the tests sent (its claims section is unique)
            assert token.split(".")[1] not in log


def _topic() -> str:
    return f"sasl-{uuid.uuid4().hex[:10]}"


def _log_lines(broker: BrokerProcess, *words: str) -> list[str]:
    return [line for line in broker.log_path.read_text(errors="replace").splitlines() if all(w in line for w in words)]


# -- stock clients --------------------------------------------------------------------------------------------


def _plain(user: str = "alice", password: str | None = None, protocol: str = "SASL_PLAINTEXT") -> dict:
    return {"security.protocol": protocol, "sasl.mechanism": "PLAIN", "sasl.username": user,
            "sasl.password": USERS[user] if password is None else password}


EXPECTED = [f"m{index}".encode() for index in range(5)]


def test_confluent_kafka_plain_over_sasl_plaintext_and_sasl_ssl(sasl_broker, pki):
    assert _round_trip_confluent(f"127.0.0.1:{sasl_broker.sasl_port}", _plain()) == EXPECTED
    over_tls = {**_plain(protocol="SASL_SSL"), "ssl.ca.location": pki.ca_file}
    assert _round_trip_confluent(f"127.0.0.1:{sasl_broker.sasl_ssl_port}", over_tls) == EXPECTED
    assert _log_lines(sasl_broker, "principal User:alice", "on listener SASL_SSL")


def test_confluent_kafka_oauthbearer_unsecured_token(sasl_broker, pki):
    settings = {"security.protocol": "SASL_SSL", "ssl.ca.location": pki.ca_file, "sasl.mechanism": "OAUTHBEARER",
                "enable.sasl.oauthbearer.unsecure.jwt": True, "sasl.oauthbearer.config": "principal=carol"}
    assert _round_trip_confluent(f"127.0.0.1:{sasl_broker.sasl_ssl_port}", settings) == EXPECTED
    assert _log_lines(sasl_broker, "principal User:carol")


def test_confluent_kafka_wrong_password_fails_with_kafkas_message(sasl_broker):
    producer = confluent_kafka.Producer({"bootstrap.servers": f"127.0.0.1:{sasl_broker.sasl_port}",
                                         **_plain(password="not-the-password"), "message.timeout.ms": 3000})
    errors: list = []
    producer.produce(_topic(), b"x", on_delivery=lambda err, msg: errors.append(err))
    producer.flush(TIMEOUT_S)
    assert errors and errors[0] is not None
    assert _log_lines(sasl_broker, "Failed authentication with", "Authentication failed: Invalid username or password")


def test_kafka_python_plain_and_oauthbearer(sasl_broker, pki):
    kafka = pytest.importorskip("kafka")
    from kafka.net.sasl.oauth import AbstractTokenProvider

    class Token(AbstractTokenProvider):
        def token(self):
            return _unsecured_jwt("dave")

    cases = [
        (sasl_broker.sasl_port, {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                                 "sasl_plain_username": "alice", "sasl_plain_password": USERS["alice"]}),
        (sasl_broker.sasl_ssl_port, {"security_protocol": "SASL_SSL", "ssl_cafile": pki.ca_file,
                                     "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_provider": Token()}),
    ]
    for port, settings in cases:
        topic = _topic()
        producer = kafka.KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", **settings)
        for index in range(3):
            producer.send(topic, f"kp{index}".encode()).get(timeout=TIMEOUT_S)
        producer.close()
        consumer = kafka.KafkaConsumer(topic, bootstrap_servers=f"127.0.0.1:{port}", auto_offset_reset="earliest",
                                       consumer_timeout_ms=20000, **settings)
        values = [message.value for message in itertools.islice(consumer, 3)]  # not waiting out the timeout
        consumer.close()
        assert values == [b"kp0", b"kp1", b"kp2"], settings["sasl_mechanism"]
    assert _log_lines(sasl_broker, "principal User:dave")


def test_aiokafka_plain_over_sasl_plaintext_and_sasl_ssl(sasl_broker, pki):
    aiokafka = pytest.importorskip("aiokafka")
    import asyncio

    from aiokafka.helpers import create_ssl_context

    async def round_trip(port: int, settings: dict) -> list[bytes]:
        topic = _topic()
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", **settings)
        await producer.start()
        try:
            for index in range(3):
                await producer.send_and_wait(topic, f"ak{index}".encode())
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=f"127.0.0.1:{port}",
                                             auto_offset_reset="earliest", **settings)
        await consumer.start()
        try:
            values = []
            async with asyncio.timeout(TIMEOUT_S):
                async for message in consumer:
                    values.append(message.value)
                    if len(values) == 3:
                        return values
        finally:
            await consumer.stop()

    plain = {"sasl_mechanism": "PLAIN", "sasl_plain_username": "bob", "sasl_plain_password": USERS["bob"]}
    expected = [b"ak0", b"ak1", b"ak2"]
    assert asyncio.run(round_trip(sasl_broker.sasl_port, {"security_protocol": "SASL_PLAINTEXT", **plain})) == expected
    context = create_ssl_context(cafile=pki.ca_file)
    assert asyncio.run(round_trip(sasl_broker.sasl_ssl_port, {"security_protocol": "SASL_SSL", "ssl_context": context,
                                                             **plain})) == expected


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed")
def test_kcat_plain_over_sasl_plaintext(sasl_broker):
    topic = _topic()
    auth = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=PLAIN", "-X", "sasl.username=alice",
            "-X", f"sasl.password={USERS['alice']}"]
    bootstrap = f"127.0.0.1:{sasl_broker.sasl_port}"
    subprocess.run(["kcat", "-b", bootstrap, *auth, "-P", "-t", topic], input=b"k0\nk1\n", check=True,
                   timeout=TIMEOUT_S, capture_output=True)
    out = subprocess.run(["kcat", "-b", bootstrap, *auth, "-C", "-t", topic, "-o", "beginning", "-c", "2", "-e"],
                         check=True, timeout=TIMEOUT_S, capture_output=True)
    assert out.stdout.split() == [b"k0", b"k1"]


@pytest.mark.skipif(NODE is None or not (JS_DIR / "node_modules" / "kafkajs").is_dir(),
                    reason="needs node and `npm install --prefix tests/js` (kafkajs)")
def test_kafkajs_plain_oauthbearer_and_scram(sasl_broker, pki, scram_users):
    plain = {"mechanism": "plain", "username": "alice", "password": USERS["alice"]}
    tls = {"ca": [Path(pki.ca_file).read_text()]}
    for port, tls, sasl in ((sasl_broker.sasl_port, False, plain), (sasl_broker.sasl_ssl_port, tls, plain),
                            (sasl_broker.sasl_ssl_port, tls,
                             {"mechanism": "oauthbearer", "token": _unsecured_jwt("jo")}),
                            (sasl_broker.sasl_port, False, {"mechanism": "scram-sha-256", "username": "sam",
                                                            "password": SCRAM_USERS["sam"]})):
        options = {"brokers": [f"127.0.0.1:{port}"], "topic": _topic(), "count": 3, "sasl": sasl, "ssl": tls,
                   "timeoutMs": int(TIMEOUT_S * 1000)}
        done = subprocess.run([NODE, str(JS_DIR / "sasl_client.js"), json.dumps(options)], capture_output=True,
                              text=True, timeout=TIMEOUT_S * 2)
        assert done.returncode == 0, f"sasl_client.js exited {done.returncode}\n{done.stdout}\n{done.stderr}"
        assert sorted(json.loads(done.stdout.strip().splitlines()[-1])["read"]) == ["js-0", "js-1", "js-2"], sasl
    assert _log_lines(sasl_broker, "principal User:jo")


def test_java_client_plain_over_sasl_ssl_and_oauthbearer_over_sasl_plaintext(sasl_broker, pki, tmp_path):
    from test_transactions_clients import java_client_or_skip

    java, lib = java_client_or_skip()
    # The client's unsecured OAUTHBEARER login builds its token with Jackson, which the kit's client lib lacks:
    # Kafka 3.7.1's distribution has it.
    jackson = lib.parents[1] / "kafka_2.13-3.7.1" / "libs"
    classpath = f"{lib}/*:" + ":".join(str(jar) for jar in sorted(jackson.glob("jackson-[acd]*.jar")))
    cases = [
        (sasl_broker.sasl_ssl_port, ["security.protocol=SASL_SSL", "sasl.mechanism=PLAIN",
                                     "ssl.truststore.type=PEM", f"ssl.truststore.location={pki.ca_file}",
                                     "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule "
                                     "required "
                                     f'username="bob" password="{USERS["bob"]}";']),
        (sasl_broker.sasl_port, ["security.protocol=SASL_PLAINTEXT", "sasl.mechanism=OAUTHBEARER",
                                 "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule "
                                 'required unsecuredLoginStringClaim_sub="erin";']),
    ]
    for port, settings in cases:
        done = subprocess.run(
            [java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", classpath,
             str(JAVA_DIR / "SaslClient.java"), f"127.0.0.1:{port}", _topic(), "3", *settings],
            capture_output=True, text=True, timeout=TIMEOUT_S * 4, cwd=tmp_path)
        assert done.returncode == 0, f"SaslClient.java exited {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
        read = [line.removeprefix("read ") for line in done.stdout.splitlines() if line.startswith("read ")]
        assert read == ["java-0", "java-1", "java-2"], done.stdout
    assert _log_lines(sasl_broker, "principal User:erin")


def _unsecured_jwt(subject: str, lifetime_s: int = 3600) -> str:
    """An unsecured JWS (alg none) as Kafka's unsecured login module makes one; sections without padding."""
    def section(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value, separators=(",", ":")).encode()).decode().rstrip("=")
    now = int(time.time())
    token = f"{section({'alg': 'none'})}.{section({'sub': subject, 'iat': now, 'exp': now + lifetime_s})}."
    SENT_TOKENS.append(token)
    return token


# -- the wire, byte by byte -------------------------------------------------------------------------------------


class Wire:
    """One raw connection to a listener: Kafka requests (kio entities) or raw frames in, answers out."""

    def __init__(self, port: int, tls=None) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
        self.sock = tls.wrap_socket(sock, server_hostname="localhost") if tls is not None else sock
        self.correlation_id = 0

    def send(self, request) -> int:
        self.correlation_id += 1
        self.sock.sendall(encode_request(request, self.correlation_id, "sasl-tests"))
        return self.correlation_id

    def read(self, request):
        response_type = load_response_from_request(type(request))
        (size,) = struct.unpack(">i", read_exact(self.sock, 4))
        payload = read_exact(self.sock, size)
        header, used = entity_reader(response_type.__header_schema__)(payload, 0)
        assert header.correlation_id == self.correlation_id
        return entity_reader(response_type)(payload, used)[0]

    def ask(self, request):
        self.send(request)
        return self.read(request)

    def raw(self, token: bytes) -> bytes:
        self.sock.sendall(struct.pack(">i", len(token)) + token)
        (size,) = struct.unpack(">i", read_exact(self.sock, 4))
        return read_exact(self.sock, size)

    def closed(self, timeout: float = TIMEOUT_S) -> bool:
        """True when the broker closed the connection (nothing more arrives), within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, ssl.SSLError):
            return True
        except socket.timeout:
            return False

    def close(self) -> None:
        self.sock.close()


def _metadata() -> MetadataRequest:
    return MetadataRequest(topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False)


def _login(wire: Wire, user: str = "alice", password: str | None = None):
    handshake = wire.ask(SaslHandshakeRequest(mechanism="PLAIN"))
    assert handshake.error_code == ErrorCode.none
    token = b"\0" + user.encode() + b"\0" + (USERS[user] if password is None else password).encode()
    return wire.ask(SaslAuthenticateRequest(auth_bytes=token))


def test_plain_login_then_requests_are_served_as_the_principal(sasl_broker):
    wire = Wire(sasl_broker.sasl_port)
    versions = wire.ask(ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    assert {17, 36} <= {api.api_key for api in versions.api_keys}
    handshake = wire.ask(SaslHandshakeRequest(mechanism="PLAIN"))
    assert handshake.error_code == ErrorCode.none
    assert list(handshake.mechanisms) == HANDSHAKE_ORDER
    answer = wire.ask(SaslAuthenticateRequest(auth_bytes=b"\0alice\0" + USERS["alice"].encode()))
    assert answer.error_code == ErrorCode.none and answer.error_message == ""  # as Kafka 3.7.1 sends it
    assert answer.session_lifetime.total_seconds() == 0  # connections.max.reauth.ms unset: no session lifetime
    assert wire.ask(_metadata()).brokers
    # After authentication KafkaApis answers both SASL requests with ILLEGAL_SASL_STATE; the connection stays.
    again = wire.ask(SaslAuthenticateRequest(auth_bytes=b"\0alice\0x"))
    assert again.error_code == ErrorCode.illegal_sasl_state
    assert again.error_message == "SaslAuthenticate request received after successful authentication"
    assert wire.ask(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.illegal_sasl_state
    assert wire.ask(_metadata()).brokers
    wire.close()


def test_an_invalid_api_versions_before_authentication_is_answered_invalid_request_and_may_be_retried(sasl_broker):
    """Kafka's ApiVersionsRequest.isValid (v3+: the client software name and version match its pattern): an
    invalid one is answered INVALID_REQUEST and, before authentication, the client may send another one."""
    wire = Wire(sasl_broker.sasl_port)
    answer = wire.ask(ApiVersionsRequest(client_software_name="bad name!", client_software_version="1"))
    assert answer.error_code == ErrorCode.invalid_request and answer.api_keys == ()
    answer = wire.ask(ApiVersionsRequest(client_software_name="t", client_software_version="1.0-a"))
    assert answer.error_code == ErrorCode.none and answer.api_keys
    assert _login(wire).error_code == ErrorCode.none
    wire.close()
    wire = Wire(sasl_broker.port)  # the same answer on a PLAINTEXT listener (Kafka's KafkaApis)
    assert wire.ask(ApiVersionsRequest(client_software_name="t", client_software_version="")).error_code \
        == ErrorCode.invalid_request
    wire.close()


def test_sasl_requests_on_a_plaintext_listener_get_illegal_sasl_state(sasl_broker):
    wire = Wire(sasl_broker.port)
    assert wire.ask(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.illegal_sasl_state
    assert wire.ask(SaslAuthenticateRequest(auth_bytes=b"")).error_code == ErrorCode.illegal_sasl_state
    assert wire.ask(_metadata()).brokers
    wire.close()


@pytest.mark.parametrize("listener", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_wrong_password_is_answered_after_the_delay_then_closed(sasl_broker, pki, listener):
    if listener == "SASL_SSL":  # the answer goes out through TLS before the graceful close
        wire = Wire(sasl_broker.sasl_ssl_port, tls=ssl.create_default_context(cafile=pki.ca_file))
    else:
        wire = Wire(sasl_broker.sasl_port)
    assert wire.ask(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
    started = time.monotonic()
    answer = wire.ask(SaslAuthenticateRequest(auth_bytes=b"\0alice\0wrong-password-123"))
    assert time.monotonic() - started >= DELAY_MS / 1000 * 0.9
    assert answer.error_code == ErrorCode.sasl_authentication_failed
    assert answer.error_message == "Authentication failed: Invalid username or password"  # Kafka 3.7.1's words
    assert wire.closed()
    assert "wrong-password-123" not in sasl_broker.log_path.read_text(errors="replace")


def test_unknown_mechanism_gets_unsupported_sasl_mechanism_with_the_enabled_list(sasl_broker):
    wire = Wire(sasl_broker.sasl_port)
    answer = wire.ask(SaslHandshakeRequest(mechanism="GSSAPI"))
    assert answer.error_code == ErrorCode.unsupported_sasl_mechanism
    assert list(answer.mechanisms) == HANDSHAKE_ORDER
    assert wire.closed()
    assert _log_lines(sasl_broker, "Failed authentication with", "Unsupported SASL mechanism GSSAPI")


def test_a_request_before_authentication_closes_the_connection_without_an_answer(sasl_broker):
    wire = Wire(sasl_broker.sasl_port)
    peer = "127.0.0.1:%d" % wire.sock.getsockname()[1]
    wire.send(_metadata())
    assert wire.closed()
    wait_until(lambda: _log_lines(sasl_broker, f"Failed authentication with {peer} ",
                                  "Unexpected Kafka request of type METADATA during SASL handshake."),
               "the broker's log line", TIMEOUT_S)
    # Between the handshake and the token, another request: ILLEGAL_SASL_STATE (after the delay), then closed.
    wire = Wire(sasl_broker.sasl_port)
    assert wire.ask(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
    answer = wire.ask(MetadataRequest(topics=(MetadataRequestTopic(name="t", topic_id=None),),
                                      allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    assert [topic.error_code for topic in answer.topics] == [ErrorCode.illegal_sasl_state]
    assert wire.closed()


def test_a_newline_in_a_user_name_or_mechanism_cannot_forge_a_log_line(sasl_broker):
    """Kafka logs the failure's exception message at INFO; a user name only reaches DEBUG, and whatever the
    client sent is logged with its control characters escaped: one log line per failure, never a forged one."""
    wire = Wire(sasl_broker.sasl_port)
    answer = wire.ask(SaslHandshakeRequest(mechanism="BOGUS\nFORGED-MECH line"))
    assert answer.error_code == ErrorCode.unsupported_sasl_mechanism
    assert wire.closed()
    wire = Wire(sasl_broker.sasl_port)
    assert wire.ask(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
    answer = wire.ask(SaslAuthenticateRequest(auth_bytes=b"\0mallory\nFORGED-USER line\0wrong-pw"))
    assert answer.error_code == ErrorCode.sasl_authentication_failed
    assert wire.closed()
    wait_until(lambda: _log_lines(sasl_broker, "mallory\\nFORGED-USER"), "the escaped user name at debug", TIMEOUT_S)
    lines = sasl_broker.log_path.read_text(errors="replace").splitlines()
    assert not [line for line in lines if line.startswith("FORGED")]
    assert len(_log_lines(sasl_broker, " INFO ", "Unsupported SASL mechanism BOGUS\\nFORGED-MECH line")) == 1
    assert not [line for line in lines if " INFO " in line and "mallory" in line]


def test_an_oversized_token_fails_the_authentication_without_an_answer(sasl_broker):
    wire = Wire(sasl_broker.sasl_port)
    assert wire.ask(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
    wire.send(SaslAuthenticateRequest(auth_bytes=b"\0alice\0" + b"x" * 9000))  # > sasl.server.max.receive.size 8192
    assert wire.closed()
    assert _log_lines(sasl_broker, "Failed authentication with", "invalid receive size")


def test_garbage_auth_bytes_fail_with_the_mechanisms_message(sasl_broker):
    wire = Wire(sasl_broker.sasl_port)
    assert wire.ask(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
    answer = wire.ask(SaslAuthenticateRequest(auth_bytes=b"garbage without separators"))
    assert answer.error_code == ErrorCode.sasl_authentication_failed
    assert answer.error_message == "Invalid SASL/PLAIN response: expected 3 tokens, got 1"
    assert wire.closed()
    # SCRAM with no credentials stored and a garbage first message: Kafka's generic text, nothing about the user.
    wire = Wire(sasl_broker.sasl_port)
    assert wire.ask(SaslHandshakeRequest(mechanism="SCRAM-SHA-256")).error_code == ErrorCode.none
    answer = wire.ask(SaslAuthenticateRequest(auth_bytes=b"n,,n=alice,r=abc"))
    assert answer.error_code == ErrorCode.sasl_authentication_failed
    assert answer.error_message == ("Authentication failed during authentication due to invalid credentials with "
                                    "SASL mechanism SCRAM-SHA-256")
    # Undecodable bytes in the frame itself: the connection is closed.
    wire = Wire(sasl_broker.sasl_port)
    assert wire.ask(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
    wire.sock.sendall(struct.pack(">i", 10) + struct.pack(">hhi", 36, 2, 9) + b"\xff\xff")
    assert wire.closed()


def _pipelined(wire: Wire, *requests) -> None:
    """Send the requests in one write (numbered from the wire's next correlation id on)."""
    wire.sock.sendall(b"".join(encode_request(request, wire.correlation_id + index, "sasl-tests")
                               for index, request in enumerate(requests, start=1)))


def test_frames_pipelined_behind_a_saslauthenticate(sasl_broker):
    # Behind a successful one: served as the principal, in order.
    wire = Wire(sasl_broker.sasl_port)
    handshake, token = SaslHandshakeRequest(mechanism="PLAIN"), SaslAuthenticateRequest(auth_bytes=b"\0alice\0"
                                                                                         + USERS["alice"].encode())
    _pipelined(wire, handshake, token, _metadata(), _metadata())
    for request in (handshake, token, _metadata(), _metadata()):
        wire.correlation_id += 1
        answer = wire.read(request)
        assert answer.brokers if isinstance(request, MetadataRequest) else answer.error_code == ErrorCode.none
    wire.close()
    # Behind a failed one: only the failure's answer (after the delay), then the connection closes; the
    # pipelined requests are never served.
    wire = Wire(sasl_broker.sasl_port)
    peer = "127.0.0.1:%d" % wire.sock.getsockname()[1]
    wrong = SaslAuthenticateRequest(auth_bytes=b"\0alice\0wrong-pipelined-pw")
    _pipelined(wire, handshake, wrong, _metadata(), SaslHandshakeRequest(mechanism="PLAIN"))
    wire.correlation_id += 1
    assert wire.read(handshake).error_code == ErrorCode.none
    wire.correlation_id += 1
    assert wire.read(wrong).error_code == ErrorCode.sasl_authentication_failed
    assert wire.closed()
    assert len(_log_lines(sasl_broker, f"Failed authentication with {peer} ")) == 1
    assert not _log_lines(sasl_broker, peer, "principal User:")


def test_kip43_raw_tokens_after_a_v0_handshake(sasl_broker):
    wire = Wire(sasl_broker.sasl_port)
    assert wire.ask(SaslHandshakeV0(mechanism="PLAIN")).error_code == ErrorCode.none
    assert wire.raw(b"\0bob\0" + USERS["bob"].encode()) == b""  # PLAIN's empty answer, size-prefixed
    assert wire.ask(_metadata()).brokers
    wire.close()
    wire = Wire(sasl_broker.sasl_port)
    assert wire.ask(SaslHandshakeV0(mechanism="PLAIN")).error_code == ErrorCode.none
    wire.sock.sendall(struct.pack(">i", 12) + b"\0bob\0wrongpw")
    assert wire.closed()  # a raw exchange's failure has no answer
    # SaslAuthenticate v0 (KIP-152 without session lifetime) works too.
    wire = Wire(sasl_broker.sasl_port)
    assert wire.ask(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
    assert wire.ask(SaslAuthenticateV0(auth_bytes=b"\0bob\0" + USERS["bob"].encode())).error_code == ErrorCode.none
    assert wire.ask(_metadata()).brokers
    wire.close()


GUARD_DELAY_MS = 5000  # connection.failed.authentication.delay.ms of guarded_broker
GUARD_QUEUED_BYTES = 4 * 1024 * 1024  # its queued.max.request.bytes


@pytest.fixture(scope="module")
def guarded_broker(tmp_path_factory):
    """A SASL_PLAINTEXT listener (PLAIN) with a long failed-authentication delay and a small request memory pool:
    what unauthenticated peers may cost the others."""
    plain, sasl = free_port(), free_port()
    config = {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "connection.failed.authentication.delay.ms": GUARD_DELAY_MS,
        "queued.max.request.bytes": GUARD_QUEUED_BYTES,
        "socket.request.max.bytes": 1024 * 1024,
        "num.partitions": 1,
        "offsets.topic.num.partitions": 2,
    }
    broker = BrokerProcess(tmp_path_factory.mktemp("guarded-broker"), config=config, port=plain)
    broker.sasl_port = sasl
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


def test_api_versions_before_authentication_is_never_metered_by_client_quotas(guarded_broker):
    """Kafka's authenticator answers ApiVersions before authentication itself: not charged to User:ANONYMOUS,
    never throttled (KIP-219's mute) however small ANONYMOUS's request quota."""
    from quota_wire import Wire as QuotaWire, alter, throttle_ms

    admin = QuotaWire(guarded_broker, "quota-admin")
    assert alter(admin, {"user": "ANONYMOUS"}, {"request_percentage": 0.01}) == (ErrorCode.none, None)
    versions = ApiVersionsRequest(client_software_name="t", client_software_version="1")
    try:
        throttles = []
        for _ in range(20):
            wire = Wire(guarded_broker.sasl_port)
            throttles.append(int(wire.ask(versions).throttle_time.total_seconds() * 1000))
            assert wire.ask(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none  # not muted
            wire.close()
        assert throttles == [0] * 20
        # The same requests from ANONYMOUS on the PLAINTEXT listener are metered: the quota is in force.
        wait_until(lambda: throttle_ms(admin.request(versions)) > 0, "an ANONYMOUS request throttled", TIMEOUT_S)
    finally:
        alter(admin, {"user": "ANONYMOUS"}, {"request_percentage": None})
        admin.close()


def test_a_flood_of_failed_logins_is_delayed_while_another_client_keeps_producing(guarded_broker):
    port = guarded_broker.sasl_port
    producer = confluent_kafka.Producer({"bootstrap.servers": f"127.0.0.1:{port}", **_plain("bob"), "linger.ms": 0})
    topic = _topic()
    acked: list[float] = []

    def produce(value: bytes) -> None:
        producer.produce(topic, value, on_delivery=lambda err, msg: acked.append(time.monotonic())
                         if err is None else None)
        producer.flush(TIMEOUT_S)

    produce(b"warm-up")  # connected, authenticated, the topic made: what follows only waits for acks
    attackers = [Wire(port) for _ in range(20)]
    for wire in attackers:
        assert wire.ask(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
    answered: dict[int, tuple[float, int]] = {}  # attacker -> (arrival time of its answer, error code)

    def read_answer(index: int, wire: Wire) -> None:
        answer = wire.read(SaslAuthenticateRequest(auth_bytes=b""))
        answered[index] = (time.monotonic(), answer.error_code)

    readers = [threading.Thread(target=read_answer, args=(index, wire), daemon=True)
               for index, wire in enumerate(attackers)]
    sent_at = time.monotonic()
    for index, wire in enumerate(attackers):
        wire.send(SaslAuthenticateRequest(auth_bytes=f"\0alice\0guess-{index}".encode()))
    for reader in readers:
        reader.start()
    for index in range(5):  # meanwhile the authenticated producer gets its acks at once
        produce(f"p{index}".encode())
    last_ack = time.monotonic()
    assert len(acked) == 6
    assert last_ack - sent_at < GUARD_DELAY_MS / 1000 / 2, "the producer waited for the failed logins' delay"
    assert not answered, "a failed login was answered before the delay"
    for reader in readers:
        reader.join(TIMEOUT_S)
    assert sorted(answered) == list(range(len(attackers)))
    for arrived, error_code in answered.values():
        assert error_code == ErrorCode.sasl_authentication_failed
        assert arrived - sent_at >= GUARD_DELAY_MS / 1000 * 0.9
    assert all(wire.closed() for wire in attackers)


def test_unauthenticated_frames_do_not_hold_the_request_memory(guarded_broker):
    """Kafka's SaslServerAuthenticator takes authentication frames from the heap, never from the request memory
    pool: peers that declare big frames before authenticating and stall cannot starve authenticated clients."""
    port = guarded_broker.sasl_port
    stalled = []
    for _ in range(12):  # 12 x 500 KB declared (under sasl.server.max.receive.size), more than the 4 MB pool
        wire = Wire(port)
        wire.sock.sendall(struct.pack(">i", 500 * 1024) + b"\0" * 1024)
        stalled.append(wire)
    wire = Wire(port)
    assert _login(wire).error_code == ErrorCode.none
    wire.sock.settimeout(10)
    big = ApiVersionsRequest(client_software_name="a" * 300_000, client_software_version="1")  # a 300 KB frame
    assert wire.ask(big).error_code == ErrorCode.none
    assert wire.ask(_metadata()).brokers
    for each in [wire, *stalled]:
        each.close()


def test_kip368_reauthentication_and_session_expiry(sasl_broker):
    wire = Wire(sasl_broker.reauth_port)
    answer = _login(wire)
    assert answer.error_code == ErrorCode.none
    assert answer.session_lifetime.total_seconds() * 1000 == REAUTH_MS
    # Re-authentication (same mechanism, same principal) gives a new session; another handshake sent with it (in
    # one write: well within a second of its start) is answered by KafkaApis (ILLEGAL_SASL_STATE).
    handshake = SaslHandshakeRequest(mechanism="PLAIN")
    token = SaslAuthenticateRequest(auth_bytes=b"\0alice\0" + USERS["alice"].encode())
    wire.sock.sendall(b"".join(encode_request(request, wire.correlation_id + index, "sasl-tests")
                               for index, request in enumerate((handshake, token, handshake), start=1)))
    wire.correlation_id += 1
    assert wire.read(handshake).error_code == ErrorCode.none
    wire.correlation_id += 1
    answer = wire.read(token)
    assert answer.error_code == ErrorCode.none and answer.session_lifetime.total_seconds() * 1000 == REAUTH_MS
    wire.correlation_id += 1
    assert wire.read(handshake).error_code == ErrorCode.illegal_sasl_state
    assert wire.ask(_metadata()).brokers
    # Once the session is over, any request other than a SaslHandshake closes the connection.
    deadline = time.monotonic() + REAUTH_MS / 1000 + 0.5
    while time.monotonic() < deadline:
        time.sleep(0.1)
    wire.send(_metadata())
    assert wire.closed()
    assert _log_lines(sasl_broker, "SASL session expired")


def test_reauthentication_may_not_change_principal_or_mechanism(sasl_broker):
    wire = Wire(sasl_broker.reauth_port)
    assert _login(wire).error_code == ErrorCode.none
    answer = _login(wire, "bob")
    assert answer.error_code == ErrorCode.sasl_authentication_failed
    assert answer.error_message == "Cannot change principals during re-authentication from User.alice: User.bob"
    assert wire.closed()
    assert _log_lines(sasl_broker, "INFO", "Failed re-authentication with", "Cannot change principals")
    wire = Wire(sasl_broker.reauth_port)
    assert _login(wire).error_code == ErrorCode.none
    assert wire.ask(SaslHandshakeRequest(mechanism="OAUTHBEARER")).error_code == ErrorCode.none
    wire.send(SaslAuthenticateRequest(auth_bytes=b"n,,\x01auth=Bearer x\x01\x01"))
    assert wire.closed()  # Kafka's REAUTH_BAD_MECHANISM: the token fails, without an answer
    assert _log_lines(sasl_broker, "SASL mechanism 'OAUTHBEARER' requested by client is not supported for "
                                   "re-authentication of mechanism 'PLAIN'")


def test_confluent_kafka_reauthenticates_and_keeps_producing(sasl_broker):
    """librdkafka re-authenticates before the session lifetime the broker gave it runs out."""
    producer = confluent_kafka.Producer({"bootstrap.servers": f"127.0.0.1:{sasl_broker.reauth_port}",
                                         **_plain("alice"), "linger.ms": 0})
    topic = _topic()
    before = _reauthentications(sasl_broker, "alice")
    deadline = time.monotonic() + REAUTH_MS / 1000 * 2.5
    sent = 0
    while time.monotonic() < deadline:
        producer.produce(topic, b"r")
        assert producer.flush(TIMEOUT_S) == 0
        sent += 1
        time.sleep(0.2)
    assert sent >= 5
    assert _reauthentications(sasl_broker, "alice") > before


def test_kafka_tools_with_command_config_over_sasl_ssl(sasl_broker, scram_users, pki, tmp_path):
    """kafka-topics.sh and kafka-console-producer/consumer.sh with --command-config / --producer.config (SCRAM over
    SASL_SSL, Kafka's own client properties)."""
    from kafka_tools import kafka_tools_or_skip

    tools = kafka_tools_or_skip()
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
                      "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                      f'username="sue" password="{SCRAM_USERS["sue"]}";\n'
                      f"ssl.truststore.type=PEM\nssl.truststore.location={pki.ca_file}\n")
    bootstrap = f"127.0.0.1:{sasl_broker.sasl_ssl_port}"
    topic = _topic()
    tools.run("kafka-topics.sh", "--bootstrap-server", bootstrap, "--command-config", str(config), "--create",
              "--topic", topic, "--partitions", "2")
    listed = tools.run("kafka-topics.sh", "--bootstrap-server", bootstrap, "--command-config", str(config), "--list")
    assert topic in listed.stdout.split()
    tools.run("kafka-console-producer.sh", "--bootstrap-server", bootstrap, "--producer.config", str(config),
              "--topic", topic, input="t0\nt1\n")
    out = tools.run("kafka-console-consumer.sh", "--bootstrap-server", bootstrap, "--consumer.config", str(config),
                    "--topic", topic, "--from-beginning", "--max-messages", "2", "--timeout-ms", "60000")
    assert sorted(out.stdout.split()) == ["t0", "t1"]


def _reauthentications(broker: BrokerProcess, user: str) -> int:
    return len(_log_lines(broker, f"SASL/PLAIN re-authentication of User:{user} complete"))


def test_java_client_and_kafka_python_reauthenticate(sasl_broker, tmp_path):
    """The Java client and kafka-python re-authenticate (KIP-368) within the session lifetime the broker gave them,
    on a connection that outlives it."""
    kafka = pytest.importorskip("kafka")
    before = _reauthentications(sasl_broker, "bob")
    producer = kafka.KafkaProducer(bootstrap_servers=f"127.0.0.1:{sasl_broker.reauth_port}",
                                   security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                                   sasl_plain_username="bob", sasl_plain_password=USERS["bob"])
    topic = _topic()
    deadline = time.monotonic() + REAUTH_MS / 1000 * 2.5
    while time.monotonic() < deadline:
        producer.send(topic, b"r").get(timeout=TIMEOUT_S)
        time.sleep(0.2)
    producer.close()
    assert _reauthentications(sasl_broker, "bob") > before
    from test_transactions_clients import java_client_or_skip

    java, lib = java_client_or_skip()
    before = _reauthentications(sasl_broker, "alice")
    done = subprocess.run(
        [java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{lib}/*",
         str(JAVA_DIR / "SaslClient.java"), f"127.0.0.1:{sasl_broker.reauth_port}", _topic(), "10",
         f"pause.ms={REAUTH_MS // 4}", "security.protocol=SASL_PLAINTEXT", "sasl.mechanism=PLAIN",
         "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
         f'username="alice" password="{USERS["alice"]}";'],
        capture_output=True, text=True, timeout=TIMEOUT_S * 4, cwd=tmp_path)
    assert done.returncode == 0, f"SaslClient.java exited {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
    assert len([line for line in done.stdout.splitlines() if line.startswith("read ")]) == 10
    assert _reauthentications(sasl_broker, "alice") > before


# -- start-up ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("settings", "words"), [
    ((), ("SASL mechanism GSSAPI is not supported",)),  # Kafka's default sasl.enabled.mechanisms
    (("--override", "sasl.enabled.mechanisms=PLAIN"), ("PLAIN", "JAAS")),  # no JAAS entry for an enabled mechanism
])
def test_a_sasl_listener_kafka_would_refuse_stops_the_start(tmp_path, settings, words):
    data_dir = tmp_path / "fresh"
    result = serve("--listeners", f"PLAINTEXT://127.0.0.1:{free_port()},SASL_PLAINTEXT://127.0.0.1:{free_port()}",
                   *settings, data_dir=data_dir)
    assert_one_line_failure(result, "SASL_PLAINTEXT", *words)
    assert not data_dir.exists()


def test_a_failed_authentication_delay_not_below_the_idle_timeout_stops_the_start(tmp_path):
    """Kafka's KafkaConfig: connection.failed.authentication.delay.ms < connections.max.idle.ms (unless -1)."""
    data_dir = tmp_path / "fresh"
    result = serve("--listeners", f"PLAINTEXT://127.0.0.1:{free_port()}",
                   "--override", "connection.failed.authentication.delay.ms=5000",
                   "--override", "connections.max.idle.ms=5000", data_dir=data_dir)
    assert_one_line_failure(result, "connection.failed.authentication.delay.ms=5000 should always be less than "
                                    "connections.max.idle.ms=5000 to prevent failed authentication responses from "
                                    "timing out", status=2)
    assert not data_dir.exists()


# -- SCRAM, with credentials stored through AlterUserScramCredentials ------------------------------------------------


@pytest.fixture(scope="module")
def scram_users(sasl_broker):
    """sam has SCRAM-SHA-256 credentials, sue SCRAM-SHA-512 ones, stored with confluent-kafka's admin client
    (AlterUserScramCredentials) through the PLAINTEXT listener; the broker's SASL listeners see them at once."""
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    admin = AdminClient({"bootstrap.servers": sasl_broker.bootstrap})
    upsertions = [UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, 4096), SCRAM_USERS[user].encode())
                  for user, mechanism in (("sam", ScramMechanism.SCRAM_SHA_256), ("sue", ScramMechanism.SCRAM_SHA_512))]
    for future in admin.alter_user_scram_credentials(upsertions).values():
        future.result(timeout=TIMEOUT_S)
    return SCRAM_USERS


def _scram(user: str, mechanism: str, protocol: str = "SASL_PLAINTEXT", password: str | None = None) -> dict:
    return {"security.protocol": protocol, "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": SCRAM_USERS[user] if password is None else password}


def test_confluent_kafka_scram_sha_256_and_512(sasl_broker, scram_users, pki):
    assert _round_trip_confluent(f"127.0.0.1:{sasl_broker.sasl_port}", _scram("sam", "SCRAM-SHA-256")) == EXPECTED
    over_tls = {**_scram("sue", "SCRAM-SHA-512", "SASL_SSL"), "ssl.ca.location": pki.ca_file}
    assert _round_trip_confluent(f"127.0.0.1:{sasl_broker.sasl_ssl_port}", over_tls) == EXPECTED
    assert _log_lines(sasl_broker, "principal User:sue", "on listener SASL_SSL")


def test_kafka_python_and_java_client_scram(sasl_broker, scram_users, tmp_path):
    kafka = pytest.importorskip("kafka")
    topic = _topic()
    settings = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_plain_username": "sue", "sasl_plain_password": SCRAM_USERS["sue"]}
    producer = kafka.KafkaProducer(bootstrap_servers=f"127.0.0.1:{sasl_broker.sasl_port}", **settings)
    producer.send(topic, b"kp-scram").get(timeout=TIMEOUT_S)
    producer.close()
    from test_transactions_clients import java_client_or_skip

    java, lib = java_client_or_skip()
    done = subprocess.run(
        [java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{lib}/*",
         str(JAVA_DIR / "SaslClient.java"), f"127.0.0.1:{sasl_broker.sasl_port}", _topic(), "2",
         "security.protocol=SASL_PLAINTEXT", "sasl.mechanism=SCRAM-SHA-256",
         "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
         f'username="sam" password="{SCRAM_USERS["sam"]}";'],
        capture_output=True, text=True, timeout=TIMEOUT_S * 4, cwd=tmp_path)
    assert done.returncode == 0, f"SaslClient.java exited {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
    assert [line for line in done.stdout.splitlines() if line.startswith("read ")] == ["read java-0", "read java-1"]


def _scram_exchange(wire: Wire, client, mechanism: str):
    """Handshake and client-first; returns the server-first answer."""
    assert wire.ask(SaslHandshakeRequest(mechanism=mechanism)).error_code == ErrorCode.none
    first = wire.ask(SaslAuthenticateRequest(auth_bytes=client.first_message()))
    assert first.error_code == ErrorCode.none
    return first


def test_scram_wrong_password_forged_nonce_and_replayed_proof_fail(sasl_broker, scram_users):
    from kafka.net.sasl.scram import ScramClient

    generic = "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256"
    # A wrong password: the proof does not verify.
    wire = Wire(sasl_broker.sasl_port)
    client = ScramClient("sam", "not-sams-password", "SCRAM-SHA-256")
    client.process_server_first_message(_scram_exchange(wire, client, "SCRAM-SHA-256").auth_bytes)
    answer = wire.ask(SaslAuthenticateRequest(auth_bytes=client.final_message()))
    assert (answer.error_code, answer.error_message) == (ErrorCode.sasl_authentication_failed, generic)
    assert wire.closed()
    # A good exchange, whose final message is then replayed on another connection (another server nonce).
    wire = Wire(sasl_broker.sasl_port)
    client = ScramClient("sam", SCRAM_USERS["sam"], "SCRAM-SHA-256")
    client.process_server_first_message(_scram_exchange(wire, client, "SCRAM-SHA-256").auth_bytes)
    final = client.final_message()
    answer = wire.ask(SaslAuthenticateRequest(auth_bytes=final))
    assert answer.error_code == ErrorCode.none
    client.process_server_final_message(answer.auth_bytes)  # the server proved it knows the key too
    assert wire.ask(_metadata()).brokers
    replay = Wire(sasl_broker.sasl_port)
    _scram_exchange(replay, ScramClient("sam", SCRAM_USERS["sam"], "SCRAM-SHA-256"), "SCRAM-SHA-256")
    answer = replay.ask(SaslAuthenticateRequest(auth_bytes=final))
    assert answer.error_code == ErrorCode.sasl_authentication_failed
    assert replay.closed()
    # A forged nonce: the client-final names a nonce the server did not issue.
    wire = Wire(sasl_broker.sasl_port)
    client = ScramClient("sam", SCRAM_USERS["sam"], "SCRAM-SHA-256")
    client.process_server_first_message(_scram_exchange(wire, client, "SCRAM-SHA-256").auth_bytes)
    forged = client.final_message().replace(b"r=", b"r=forged", 1)
    answer = wire.ask(SaslAuthenticateRequest(auth_bytes=forged))
    assert answer.error_code == ErrorCode.sasl_authentication_failed
    assert wire.closed()
    # A user without credentials for the mechanism: the same generic text (nothing says the user exists).
    wire = Wire(sasl_broker.sasl_port)
    client = ScramClient("sue", SCRAM_USERS["sue"], "SCRAM-SHA-256")  # sue has SCRAM-SHA-512 only
    assert wire.ask(SaslHandshakeRequest(mechanism="SCRAM-SHA-256")).error_code == ErrorCode.none
    answer = wire.ask(SaslAuthenticateRequest(auth_bytes=client.first_message()))
    assert (answer.error_code, answer.error_message) == (ErrorCode.sasl_authentication_failed, generic)
    log = sasl_broker.log_path.read_text(errors="replace")
    assert final.decode().rsplit("p=", 1)[1] not in log  # no SCRAM proof in the log


# -- the same answers as Kafka 3.7.1 ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference_sasl(tmp_path_factory):
    """Kafka 3.7.1 (KRaft; its SaslServerAuthenticator is the same in ZooKeeper mode) with a SASL_PLAINTEXT listener
    configured as the module broker's."""
    from reference_kafka import ReferenceKafka

    port = free_port()
    properties = ["sasl.enabled.mechanisms=PLAIN,OAUTHBEARER,SCRAM-SHA-256,SCRAM-SHA-512"]
    for mechanism, jaas in (("plain", PLAIN_JAAS), ("oauthbearer", OAUTH_JAAS), ("scram-sha-256", SCRAM_JAAS),
                            ("scram-sha-512", SCRAM_JAAS)):
        properties.append(f"listener.name.sasl_plaintext.{mechanism}.sasl.jaas.config={jaas}")
    kafka = ReferenceKafka(tmp_path_factory.mktemp("reference-sasl"),
                           extra_listeners={"SASL_PLAINTEXT": ("SASL_PLAINTEXT", port)},
                           extra_properties=tuple(properties))
    kafka.sasl_port = port
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.close()


def _answers(port: int) -> dict:
    """What a listener answers to each case, as comparable values."""
    found = {}
    wire = Wire(port)
    answer = wire.ask(SaslHandshakeRequest(mechanism="GSSAPI"))
    found["unknown mechanism"] = (answer.error_code, list(answer.mechanisms), wire.closed())
    for case, token in (("wrong password", b"\0alice\0wrong"), ("no such user", b"\0mallory\0x"),
                        ("garbage", b"garbage without separators"), ("empty", b"")):
        wire = Wire(port)
        wire.ask(SaslHandshakeRequest(mechanism="PLAIN"))
        answer = wire.ask(SaslAuthenticateRequest(auth_bytes=token))
        found[case] = (answer.error_code, answer.error_message, wire.closed())
    wire = Wire(port)
    wire.ask(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"))
    answer = wire.ask(SaslAuthenticateRequest(auth_bytes=b"n,,n=nobody,r=0123456789abcdef"))
    found["scram unknown user"] = (answer.error_code, answer.error_message, wire.closed())
    for case, token in (("oauth garbage token", "not.a.jwt"), ("oauth expired token", _unsecured_jwt("ann", -60)),
                        ("oauth token", _unsecured_jwt("ann"))):
        wire = Wire(port)
        wire.ask(SaslHandshakeRequest(mechanism="OAUTHBEARER"))
        first = wire.ask(SaslAuthenticateRequest(auth_bytes=f"n,,\x01auth=Bearer {token}\x01\x01".encode()))
        found[case] = [(first.error_code, first.error_message, first.auth_bytes)]
        if first.auth_bytes:  # the JSON error; the client acknowledges it with a single 0x01
            second = wire.ask(SaslAuthenticateRequest(auth_bytes=b"\x01"))
            found[case].append((second.error_code, second.error_message, wire.closed()))
    wire = Wire(port)
    wire.send(_metadata())
    found["request before authentication"] = wire.closed()
    wire = Wire(port)
    answer = _login(wire)
    found["login"] = (answer.error_code, answer.error_message, answer.auth_bytes, answer.session_lifetime)
    answer = wire.ask(SaslHandshakeRequest(mechanism="PLAIN"))
    found["handshake after login"] = (answer.error_code, list(answer.mechanisms))
    answer = wire.ask(SaslAuthenticateRequest(auth_bytes=b"\0alice\0x"))
    found["authenticate after login"] = (answer.error_code, answer.error_message)
    wire = Wire(port)
    wire.ask(SaslHandshakeV0(mechanism="PLAIN"))
    found["raw token"] = wire.raw(b"\0alice\0" + USERS["alice"].encode())
    wire = Wire(port)
    answer = wire.ask(ApiVersionsRequest(client_software_name="bad name!", client_software_version="1"))
    again = wire.ask(ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    found["invalid api versions, then a valid one"] = (answer.error_code, answer.api_keys, again.error_code,
                                                      _login(wire).error_code)
    wire = Wire(port)
    wire.ask(SaslHandshakeRequest(mechanism="PLAIN"))
    answer = wire.ask(MetadataRequest(topics=(MetadataRequestTopic(name="t", topic_id=None),),
                                      allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    found["metadata after the handshake"] = ([topic.error_code for topic in answer.topics], wire.closed())
    return found


def test_answers_are_kafka_3_7_1s(sasl_broker, reference_sasl):
    ours, kafkas = _answers(sasl_broker.sasl_port), _answers(reference_sasl.sasl_port)
    assert ours == kafkas

"""The SASL authenticator of one connection (security/sasl/authenticator.py) driven with real request frames:
KIP-368 session lifetimes (connections.max.reauth.ms per listener and mechanism, an OAUTHBEARER token's expiry,
the smaller of both), the one-second re-authentication interval, expiry, and Kafka's HashSet order of the enabled
mechanisms. The same paths on the wire, against stock clients and Kafka 3.7.1:
tests/integration/test_sasl_listeners.py."""

from __future__ import annotations

import base64
import json
import struct

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from pykbroker.protocol.apis import SUPPORTED_APIS
from pykbroker.protocol.client import decode_response, encode_request
from pykbroker.protocol.errors import ErrorCode
from pykbroker.security.sasl.authenticator import SaslAuthenticator, SaslListener, java_hash_set_order

NOW_S = 1_800_000_000.0
CONFIGS = {
    "sasl.enabled.mechanisms": "PLAIN,OAUTHBEARER",
    "listener.name.sasl_plaintext.plain.sasl.jaas.config":
        'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="pw";',
    "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config":
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
}


class Clock:
    def __init__(self) -> None:
        self.now = NOW_S

    def __call__(self) -> float:
        return self.now


def _frame(request) -> bytes:
    return encode_request(request, 7, "t")[4:]


def _authenticator(clock: Clock, **configs) -> SaslAuthenticator:
    listener = SaslListener.from_configs("SASL_PLAINTEXT", {**CONFIGS, **configs}, clock=clock)
    return SaslAuthenticator(listener, SUPPORTED_APIS, clock=clock, wall_clock_ms=lambda: int(clock() * 1000))


def _answer(step, api_key: int, version: int):
    return decode_response(api_key, version, step.reply[4:])


def _token(exp_s: float) -> str:
    def section(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")
    return f"{section({'alg': 'none'})}.{section({'sub': 'ann', 'iat': int(NOW_S), 'exp': int(exp_s)})}."


def _login(sasl: SaslAuthenticator, mechanism: str = "PLAIN", token: bytes | None = None):
    """Handshake + one token; the SaslAuthenticate answer."""
    assert _answer(sasl.receive(_frame(SaslHandshakeRequest(mechanism=mechanism))), 17, 1).error_code == ErrorCode.none
    if token is None:
        token = b"\0alice\0pw" if mechanism == "PLAIN" else f"n,,\x01auth=Bearer {_token(NOW_S + 30)}\x01\x01".encode()
    step = sasl.receive(_frame(SaslAuthenticateRequest(auth_bytes=token)))
    return step, _answer(step, 36, 2)


@pytest.mark.parametrize(("configs", "mechanism", "lifetime_ms"), [
    ({}, "PLAIN", 0),  # Kafka's default 0: no session lifetime
    ({"connections.max.reauth.ms": 60000}, "PLAIN", 60000),
    ({"connections.max.reauth.ms": 60000, "listener.name.sasl_plaintext.connections.max.reauth.ms": 20000}, "PLAIN",
     20000),
    ({"connections.max.reauth.ms": 60000, "listener.name.sasl_plaintext.plain.connections.max.reauth.ms": 5000},
     "PLAIN", 5000),
    ({}, "OAUTHBEARER", 30000),  # the token's exp, 30 s away
    ({"connections.max.reauth.ms": 60000}, "OAUTHBEARER", 30000),  # the smaller of both
    ({"connections.max.reauth.ms": 10000}, "OAUTHBEARER", 10000),
])
def test_session_lifetime(configs, mechanism, lifetime_ms):
    clock = Clock()
    sasl = _authenticator(clock, **configs)
    step, answer = _login(sasl, mechanism)
    assert answer.error_code == ErrorCode.none
    assert answer.session_lifetime.total_seconds() * 1000 == lifetime_ms
    assert str(step.principal) == ("User:alice" if mechanism == "PLAIN" else "User:ann")
    assert not sasl.authenticating
    assert (sasl.session_expires is None) == (lifetime_ms == 0)


def test_reauthentication_at_most_once_a_second_and_expiry():
    clock = Clock()
    sasl = _authenticator(clock, **{"connections.max.reauth.ms": 5000})
    _login(sasl)
    handshake = _frame(SaslHandshakeRequest(mechanism="PLAIN"))
    token = _frame(SaslAuthenticateRequest(auth_bytes=b"\0alice\0pw"))
    for _ in range(2):  # KafkaChannel: the first re-authentication at any time, the next one a second later
        step = sasl.screen(handshake)
        assert not step.serve and _answer(step, 17, 1).error_code == ErrorCode.none
        assert sasl.authenticating  # re-authenticating: only the token may follow
        assert _answer(sasl.receive(token), 36, 2).session_lifetime.total_seconds() == 5
        clock.now += 0.5
        assert sasl.screen(handshake).serve  # within the second: KafkaApis answers ILLEGAL_SASL_STATE
        clock.now += 0.6
    metadata = _frame(MetadataRequest(topics=(), allow_auto_topic_creation=False,
                                      include_topic_authorized_operations=False))
    clock.now += 3.8  # 4.9 s into the last session
    assert sasl.screen(metadata).serve
    clock.now += 0.2
    assert "SASL session expired" in sasl.screen(metadata).close


def test_without_a_session_lifetime_a_handshake_after_login_is_served_by_kafka_apis():
    clock = Clock()
    sasl = _authenticator(clock)
    _login(sasl)
    clock.now += 3600
    assert sasl.screen(_frame(SaslHandshakeRequest(mechanism="PLAIN"))).serve


def test_an_expired_oauth_token_sends_kafkas_json_error_then_fails():
    clock = Clock()
    sasl = _authenticator(clock)
    step, answer = _login(sasl, "OAUTHBEARER", f"n,,\x01auth=Bearer {_token(NOW_S - 60)}\x01\x01".encode())
    assert answer.error_code == ErrorCode.none and json.loads(answer.auth_bytes) == {"status": "invalid_token"}
    step = sasl.receive(_frame(SaslAuthenticateRequest(auth_bytes=b"\x01")))
    assert step.failure and _answer(step, 36, 2).error_code == ErrorCode.sasl_authentication_failed


def test_the_enabled_mechanisms_in_javas_hash_set_order():
    # Kafka 3.7.1 answered this order on the wire (test_sasl_listeners.py::test_answers_are_kafka_3_7_1s)
    assert java_hash_set_order(["PLAIN", "OAUTHBEARER", "SCRAM-SHA-256", "SCRAM-SHA-512"]) == [
        "PLAIN", "SCRAM-SHA-512", "SCRAM-SHA-256", "OAUTHBEARER"]
    assert java_hash_set_order(["SCRAM-SHA-512", "PLAIN", "PLAIN"]) == ["SCRAM-SHA-512", "PLAIN"]


def _header_only(api_key: int, version: int = 0) -> bytes:
    return struct.pack(">hhih", api_key, version, 7, -1)


def test_what_is_not_a_handshake_before_authentication():
    clock = Clock()
    # Any request Kafka knows, even one pykbroker does not serve: Kafka 3.7.1's IllegalSaslStateException.
    step = _authenticator(clock).receive(_header_only(29, 1))
    assert step.failure == "Unexpected Kafka request of type DESCRIBE_ACLS during SASL handshake." and not step.reply
    # Bytes that are no Kafka request as the first frame: taken for a 0.9 client's GSSAPI token, not enabled here.
    step = _authenticator(clock).receive(_header_only(999))
    assert step.failure.startswith("Exception handling first SASL packet from client, GSSAPI is not supported")
    # The same after an ApiVersions: the connection is closed at once (Kafka's InvalidRequestException).
    sasl = _authenticator(clock)
    assert sasl.receive(_frame(ApiVersionsRequest(client_software_name="t", client_software_version="1"))).serve
    assert "unknown api key 999" in sasl.receive(_header_only(999)).close
    # A second ApiVersions: Kafka's IllegalStateException, closed at once.
    assert "Unexpected ApiVersions request" in sasl.receive(_frame(ApiVersionsRequest(
        client_software_name="t", client_software_version="1"))).close


def test_failure_texts_kafka_logs_at_info_hold_no_user_name_nor_a_control_character():
    clock = Clock()
    # A wrong password: Kafka's exception message only; the user name is the DEBUG detail, escaped.
    sasl = _authenticator(clock)
    assert _answer(sasl.receive(_frame(SaslHandshakeRequest(mechanism="PLAIN"))), 17, 1).error_code == ErrorCode.none
    step = sasl.receive(_frame(SaslAuthenticateRequest(auth_bytes=b"\0mallory\nforged line\0pw")))
    assert step.failure == "Authentication failed: Invalid username or password"
    assert "mallory" in step.detail and "\n" not in step.detail and "\\n" in step.detail
    assert not step.reauthentication
    # A mechanism holding a newline: Kafka's message, the newline escaped.
    step = _authenticator(clock).receive(_frame(SaslHandshakeRequest(mechanism="BOGUS\nforged line")))
    assert step.failure == "Unsupported SASL mechanism BOGUS\\nforged line"
    assert _answer(step, 17, 1).error_code == ErrorCode.unsupported_sasl_mechanism
    # OAUTHBEARER: an authorization id (newline allowed by RFC 7628's saslname) other than the token's subject.
    sasl = _authenticator(clock)
    step, answer = _login(sasl, "OAUTHBEARER",
                          f"n,a=eve\nforged,\x01auth=Bearer {_token(NOW_S + 30)}\x01\x01".encode())
    assert answer.error_code == ErrorCode.sasl_authentication_failed
    assert step.failure.startswith("Authentication failed: Client requested an authorization id (eve\\nforged)")
    assert "\n" not in step.failure


def test_a_failed_reauthentication_says_so():
    clock = Clock()
    sasl = _authenticator(clock, **{"connections.max.reauth.ms": 5000})
    _login(sasl)
    assert _answer(sasl.screen(_frame(SaslHandshakeRequest(mechanism="PLAIN"))), 17, 1).error_code == ErrorCode.none
    step = sasl.receive(_frame(SaslAuthenticateRequest(auth_bytes=b"\0alice\0wrong")))
    assert step.failure == "Authentication failed: Invalid username or password" and step.reauthentication


def test_another_request_after_the_handshake_is_answered_illegal_sasl_state_by_the_authenticator():
    sasl = _authenticator(Clock())
    assert _answer(sasl.receive(_frame(SaslHandshakeRequest(mechanism="PLAIN"))), 17, 1).error_code == ErrorCode.none
    step = sasl.receive(_frame(MetadataRequest(topics=(MetadataRequestTopic(name="t", topic_id=None),),
                                               allow_auto_topic_creation=False,
                                               include_topic_authorized_operations=False)))
    assert step.failure == "Unexpected Kafka request of type METADATA during SASL authentication."
    answer = _answer(step, 3, 12)
    assert [topic.error_code for topic in answer.topics] == [ErrorCode.illegal_sasl_state]


def test_sasl_server_max_receive_size_per_listener():
    # Kafka's ChannelBuilders.channelBuilderConfigs: the listener-prefixed value wins over the broker-wide one.
    clock = Clock()
    sasl = _authenticator(clock, **{"sasl.server.max.receive.size": 100000,
                                    "listener.name.sasl_plaintext.sasl.server.max.receive.size": 1000})
    assert sasl.listener.max_receive_size == 1000
    assert not sasl.frame_too_large(1000) and sasl.frame_too_large(1001)
    assert _authenticator(clock, **{"sasl.server.max.receive.size": 2000}).listener.max_receive_size == 2000
    assert _authenticator(clock, **{"listener.name.other.sasl.server.max.receive.size": 10}).listener.max_receive_size \
        == 524288  # Kafka's default; another listener's value does not apply


def test_an_invalid_api_versions_request_keeps_the_state_for_another_one():
    # Kafka's authenticator: an ApiVersions that is not isValid() is answered INVALID_REQUEST and the client may
    # send another one (the state stays HANDSHAKE_OR_VERSIONS_REQUEST); a valid one then moves on.
    sasl = _authenticator(Clock())
    assert sasl.receive(_frame(ApiVersionsRequest(client_software_name="bad name!", client_software_version="1"))).serve
    assert sasl.state == "HANDSHAKE_OR_VERSIONS_REQUEST"
    assert sasl.receive(_frame(ApiVersionsRequest(client_software_name="t", client_software_version="1"))).serve
    assert sasl.state == "HANDSHAKE_REQUEST"

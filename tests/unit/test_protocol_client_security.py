"""The broker's own client (protocol/client.py) securing its connections (ClientSecurity): TLS with contexts
made by security/tls.py (the server's certificate checked against the CA and the host, a client certificate
presented when the server requires one) and the SASL exchange (ApiVersions, SaslHandshake, SaslAuthenticate)
driven by security/sasl/client.py against servers written here that run this package's real SASL server state
machines. Every failure is an AuthenticationFailed naming the peer and the reason, never a secret."""

from __future__ import annotations

import asyncio
import datetime
import ssl

import pytest
from kio.schema.api_versions.v3.response import ApiVersion, ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate.v2.response import SaslAuthenticateResponse
from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse
from kio.static.primitive import i16, i32Timedelta, i64Timedelta

from pykbroker.protocol.apis import codec_for
from pykbroker.protocol.client import AuthenticationFailed, ClientSecurity, KafkaClientConnection, NodeClients
from pykbroker.protocol.framing import encode_response
from pykbroker.security import credentials as cred
from pykbroker.security.sasl import SaslAuthenticationFailed
from pykbroker.security.sasl.client import sasl_client
from pykbroker.security.sasl.scram import ScramServerFactory
from pykbroker.security.tls import client_context, server_context

pytest.importorskip("cryptography", reason="certificates for these tests are built with cryptography")
from tls_helpers import standard_pki  # noqa: E402
from test_protocol_client import metadata_request, metadata_response_frame, read_request, run  # noqa: E402

pytestmark = pytest.mark.timeout(60)
HOST = "127.0.0.1"
SECRET = "inter-broker-secret"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return standard_pki(tmp_path_factory.mktemp("pki"))


def frame(api_key: int, version: int, correlation_id: int, body) -> bytes:
    return b"".join(bytes(p) for p in encode_response(codec_for(api_key, version), correlation_id, body))


def request_body(api_key: int, version: int, data: bytes):
    codec = codec_for(api_key, version)
    _, position = codec.read_request_header(data, 0)
    return codec.read_request_body(data, position)[0]


def sasl_broker(factories: dict, authenticated: list, lifetime_ms: int = 0):
    """A handler that serves ApiVersions, then the SASL exchange with the real server state machine of the
    requested mechanism (or UNSUPPORTED_SASL_MECHANISM), then Metadata once authenticated."""

    async def handler(reader, writer):
        server = None
        while True:
            api_key, version, correlation_id, _, data = await read_request(reader)
            if api_key == 18:
                keys = tuple(ApiVersion(api_key=i16(k), min_version=i16(0), max_version=i16(v))
                             for k, v in ((18, 3), (17, 1), (36, 2), (3, 1)))
                writer.write(frame(18, 0 if version > 3 else version, correlation_id, ApiVersionsResponse(
                    error_code=ErrorCode.none, api_keys=keys, throttle_time=i32Timedelta.parse(datetime.timedelta(0)))))
            elif api_key == 17:
                mechanism = request_body(17, version, data).mechanism
                known = mechanism in factories
                server = factories[mechanism].new_server() if known else None
                writer.write(frame(17, version, correlation_id, SaslHandshakeResponse(
                    error_code=ErrorCode.none if known else ErrorCode.unsupported_sasl_mechanism,
                    mechanisms=tuple(factories))))
            elif api_key == 36:
                token = request_body(36, version, data).auth_bytes
                try:
                    reply, error, message = server.evaluate(token), ErrorCode.none, None
                except SaslAuthenticationFailed as exc:
                    reply, error, message = b"", ErrorCode.sasl_authentication_failed, exc.client_message()
                writer.write(frame(36, version, correlation_id, SaslAuthenticateResponse(
                    error_code=error, error_message=message, auth_bytes=reply, session_lifetime=i64Timedelta.parse(datetime.timedelta(milliseconds=lifetime_ms if error == ErrorCode.none else 0)))))
                if error != ErrorCode.none:
                    return
                if server.complete:
                    authenticated.append(server.authorized_id)
            elif api_key == 3 and authenticated:
                writer.write(metadata_response_frame(correlation_id))
            else:
                return  # a request before authentication: Kafka closes the connection

    return handler


async def serve(handler, context: ssl.SSLContext | None = None):
    async def served(reader, writer):
        try:
            await handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed the connection
        finally:
            writer.close()

    server = await asyncio.start_server(served, HOST, 0, ssl=context)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_scram_exchange_authenticates_the_connection_before_requests(mechanism):
    cache = cred.ScramCredentialCache()
    cache.put(mechanism, "broker", cred.generate_credential(mechanism, SECRET))
    authenticated: list[str] = []
    security = ClientSecurity(sasl=lambda: sasl_client(mechanism, "broker", SECRET), description="test")

    async def scenario():
        server, port = await serve(sasl_broker({mechanism: ScramServerFactory(mechanism, cache)}, authenticated))
        async with server:
            connection = await KafkaClientConnection.connect(HOST, port, client_id="1", negotiate_versions=False,
                                                             security=security)
            assert authenticated == ["broker"]
            await connection.send(metadata_request())  # served only once authenticated
            await connection.aclose()

    run(scenario())


def test_the_scram_key_derivation_runs_off_the_event_loop():
    """A SCRAM step derives a key with PBKDF2 (up to 16384 iterations): the broker's event loop must not wait
    for it (a peer could make it do so on every reconnect)."""
    import threading

    mechanism = "SCRAM-SHA-512"
    cache = cred.ScramCredentialCache()
    cache.put(mechanism, "broker", cred.generate_credential(mechanism, SECRET, 16384))
    authenticated: list[str] = []
    threads: list[int] = []

    def client():
        made = sasl_client(mechanism, "broker", SECRET)
        evaluate = made.evaluate
        made.evaluate = lambda data: (threads.append(threading.get_ident()), evaluate(data))[1]
        return made

    async def scenario():
        server, port = await serve(sasl_broker({mechanism: ScramServerFactory(mechanism, cache)}, authenticated))
        async with server:
            connection = await KafkaClientConnection.connect(HOST, port, client_id="1", negotiate_versions=False,
                                                             security=ClientSecurity(sasl=client))
            await connection.aclose()
        return threading.get_ident()

    loop_thread = run(scenario())
    assert authenticated == ["broker"] and len(threads) == 2
    assert loop_thread not in threads


def test_a_session_lifetime_makes_the_pool_reconnect_before_it_expires_without_failing_a_request():
    """KIP-368: the server answers SaslAuthenticate with a session lifetime and closes the connection at the
    first request after it. NodeClients sends new requests on a new, newly authenticated connection once 85-95 %
    of the lifetime passed; the old one closes when its requests in flight are answered; nothing fails and
    no backoff is taken."""
    mechanism = "SCRAM-SHA-256"
    cache = cred.ScramCredentialCache()
    cache.put(mechanism, "broker", cred.generate_credential(mechanism, SECRET))
    authenticated: list[str] = []

    async def scenario():
        server, port = await serve(sasl_broker({mechanism: ScramServerFactory(mechanism, cache)}, authenticated,
                                               lifetime_ms=1000))
        async with server:
            pool = NodeClients(1, {2: (HOST, port)}, negotiate_versions=False,
                               security=ClientSecurity(sasl=lambda: sasl_client(mechanism, "broker", SECRET)))
            first = await pool.get(2)
            assert first.reauthenticate_at is not None
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while not first.reauthentication_due:  # 0.85-0.95 s after the exchange
                assert loop.time() < deadline
                await asyncio.sleep(0.05)
            in_flight = first.send_nowait(metadata_request())  # sent before expiry: answered
            second = await pool.get(2)
            assert second is not first and not second.closed
            await in_flight
            await asyncio.wait_for(first.wait_closed(), 5)  # closed once its request was answered
            await pool.send(2, metadata_request())
            assert pool.connects(2) == 2 and pool.backoff_remaining(2) == 0
            await pool.close()

    run(scenario())
    assert authenticated == ["broker", "broker"]


def test_a_server_first_message_the_client_refuses_is_an_authentication_failure():
    """A rogue peer asks for more PBKDF2 iterations than a credential can have (16384): the broker's client
    refuses before deriving anything, as an AuthenticationFailed naming the reason."""

    async def rogue(reader, writer):
        while True:
            api_key, version, correlation_id, _, data = await read_request(reader)
            if api_key == 18:
                keys = tuple(ApiVersion(api_key=i16(k), min_version=i16(0), max_version=i16(v))
                             for k, v in ((18, 3), (17, 1), (36, 2)))
                writer.write(frame(18, 0 if version > 3 else version, correlation_id, ApiVersionsResponse(
                    error_code=ErrorCode.none, api_keys=keys, throttle_time=i32Timedelta.parse(datetime.timedelta(0)))))
            elif api_key == 17:
                writer.write(frame(17, version, correlation_id, SaslHandshakeResponse(
                    error_code=ErrorCode.none, mechanisms=("SCRAM-SHA-512",))))
            elif api_key == 36:
                nonce = request_body(36, version, data).auth_bytes.decode().rsplit("r=", 1)[1]
                writer.write(frame(36, version, correlation_id, SaslAuthenticateResponse(
                    error_code=ErrorCode.none, error_message=None, session_lifetime=i64Timedelta.parse(datetime.timedelta(0)),
                    auth_bytes=f"r={nonce}SRV,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=100000000".encode())))
            else:
                return

    async def scenario():
        server, port = await serve(rogue)
        async with server:
            security = ClientSecurity(sasl=lambda: sasl_client("SCRAM-SHA-512", "broker", SECRET))
            with pytest.raises(AuthenticationFailed, match=r"SASL/SCRAM-SHA-512 authentication with 127\.0\.0\.1:\d+ "
                               r"failed: SASL/SCRAM-SHA-512: Requested iterations 100000000 is more than the maximum "
                               r"16384 for SCRAM-SHA-512") as raised:
                await KafkaClientConnection.connect(HOST, port, client_id="1", security=security)
            assert SECRET not in str(raised.value)

    run(scenario())


def test_a_wrong_password_and_an_unknown_mechanism_fail_with_the_servers_words():
    cache = cred.ScramCredentialCache()
    cache.put("SCRAM-SHA-256", "broker", cred.generate_credential("SCRAM-SHA-256", SECRET))
    factories = {"SCRAM-SHA-256": ScramServerFactory("SCRAM-SHA-256", cache)}

    async def scenario():
        server, port = await serve(sasl_broker(factories, []))
        async with server:
            wrong = ClientSecurity(sasl=lambda: sasl_client("SCRAM-SHA-256", "broker", "wrong-password"))
            with pytest.raises(AuthenticationFailed, match="Authentication failed during authentication due to "
                                                           "invalid credentials with SASL mechanism SCRAM-SHA-256") as e:
                await KafkaClientConnection.connect(HOST, port, client_id="1", security=wrong)
            assert "wrong-password" not in str(e.value)
            plain = ClientSecurity(sasl=lambda: sasl_client("PLAIN", "broker", SECRET))
            with pytest.raises(AuthenticationFailed, match=r"refused SASL mechanism PLAIN \(UNSUPPORTED_SASL_MECHANISM; "
                                                           r"enabled: SCRAM-SHA-256\)"):
                await KafkaClientConnection.connect(HOST, port, client_id="1", security=plain)

    run(scenario())


def tls_server_context(pki, *, client_auth: str = "none") -> ssl.SSLContext:
    return server_context({"ssl.keystore.type": "PEM", "ssl.keystore.location": pki.broker_pem_file,
                           "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file,
                           "ssl.client.auth": client_auth})


def api_versions_frame(version: int, correlation_id: int) -> bytes:
    keys = tuple(ApiVersion(api_key=i16(k), min_version=i16(0), max_version=i16(v)) for k, v in ((18, 3), (3, 1)))
    return frame(18, 0 if version > 3 else version, correlation_id, ApiVersionsResponse(
        error_code=ErrorCode.none, api_keys=keys, throttle_time=i32Timedelta.parse(datetime.timedelta(0))))


async def answer_metadata(reader, writer):
    while True:
        api_key, version, correlation_id, _, _ = await read_request(reader)
        writer.write(api_versions_frame(version, correlation_id) if api_key == 18
                     else metadata_response_frame(correlation_id))
        await writer.drain()


def test_a_server_that_refuses_the_client_certificate_after_the_handshake_is_an_authentication_failure(pki, tmp_path):
    """Under TLS 1.3 the server checks the client's certificate after the client's side of the handshake
    finished: the refusal shows only as a close before the first answer. Connecting includes that first
    answer, so the refusal is an AuthenticationFailed saying what probably happened, and a pool's backoff
    grows instead of being reset by a connection that seemed made."""
    (tmp_path / "other").mkdir()
    other = standard_pki(tmp_path / "other", name="Other CA")
    # trusts the server's CA, presents a certificate of another CA
    refused = client_context({"ssl.keystore.type": "PEM", "ssl.keystore.location": other.broker_pem_file,
                              "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file})
    served: list[int] = []

    async def counting(reader, writer):
        served.append(1)
        await answer_metadata(reader, writer)

    async def scenario():
        server, port = await serve(counting, tls_server_context(pki, client_auth="required"))
        async with server:
            security = ClientSecurity(ssl_context=lambda: refused, description="listener INTERNAL (SSL)")
            for negotiate in (False, True):
                with pytest.raises(AuthenticationFailed, match=rf"TLS connection to 127\.0\.0\.1:{port} closed by the "
                                   r"peer before its first answer .*the peer probably did not accept this broker's "
                                   r"certificate"):
                    await KafkaClientConnection.connect(HOST, port, client_id="1", negotiate_versions=negotiate,
                                                        security=security)
            pool = NodeClients(1, {2: (HOST, port)}, reconnect_backoff=0.05, reconnect_backoff_max=1.0,
                               security=security)
            for _ in range(3):
                with pytest.raises(AuthenticationFailed):
                    await pool.get(2)
            # three failures in a row: the backoff grew (0.05, 0.1, 0.2 s, +-20 %), it was not reset
            assert pool.backoff_remaining(2) > 0.1
            await pool.close()
        assert not served  # no request ever reached the server

    run(scenario())


def test_tls_checks_the_servers_certificate_and_host_and_presents_the_key_store(pki, tmp_path):
    trusting = client_context({"ssl.keystore.type": "PEM", "ssl.keystore.location": pki.broker_pem_file,
                               "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file})
    (tmp_path / "other").mkdir()
    other = standard_pki(tmp_path / "other", name="Other CA")
    distrusting = client_context({"ssl.truststore.type": "PEM", "ssl.truststore.location": other.ca_file})

    async def scenario():
        server, port = await serve(answer_metadata, tls_server_context(pki, client_auth="required"))
        async with server:
            ok = ClientSecurity(ssl_context=lambda: trusting, description="listener INTERNAL (SSL)")
            connection = await KafkaClientConnection.connect(HOST, port, client_id="1", negotiate_versions=False,
                                                             security=ok)
            await connection.send(metadata_request())  # mTLS: the server required our certificate and got it
            await connection.aclose()
            # the certificate names 127.0.0.1 and localhost, not this name: refused by the host name check
            with pytest.raises(AuthenticationFailed, match="certificate verify failed: Hostname mismatch"):
                await KafkaClientConnection.connect(HOST, port, client_id="1", security=ok,
                                                    server_hostname="kafka.example.com")
            bad = ClientSecurity(ssl_context=lambda: distrusting)
            with pytest.raises(AuthenticationFailed, match=rf"TLS handshake with 127\.0\.0\.1:{port} failed: "
                                                           "certificate verify failed"):
                await KafkaClientConnection.connect(HOST, port, client_id="1", security=bad)

    run(scenario())


def test_node_clients_log_a_failed_handshake_once_per_reason(pki, tmp_path, caplog):
    (tmp_path / "other").mkdir()
    other = standard_pki(tmp_path / "other", name="Other CA")
    distrusting = client_context({"ssl.truststore.type": "PEM", "ssl.truststore.location": other.ca_file})

    async def scenario():
        server, port = await serve(answer_metadata, tls_server_context(pki))
        async with server:
            pool = NodeClients(1, {2: (HOST, port)}, reconnect_backoff=0.001, reconnect_backoff_max=0.002,
                               security=ClientSecurity(ssl_context=lambda: distrusting, description="listener X (SSL)"))
            for _ in range(4):
                with pytest.raises(AuthenticationFailed):
                    await pool.get(2)
            await pool.close()

    with caplog.at_level("INFO", logger="pykbroker.protocol.client"):
        run(scenario())
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert "broker 1: connection to broker 2 at 127.0.0.1" in warnings[0]
    assert "failed authentication (client 1, listener X (SSL)): TLS handshake" in warnings[0]

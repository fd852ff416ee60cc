"""A SASL connection's failure on real sockets (a KafkaConnection served by asyncio on 127.0.0.1): a peer that
pipelines requests and never reads cannot keep the connection open after a failed re-authentication (Kafka
writes what it can of the answer and closes). The wire paths against stock clients and Kafka 3.7.1:
tests/integration/test_sasl_listeners.py."""

from __future__ import annotations

import asyncio
import socket
import struct

from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from pykbroker.protocol.client import encode_request
from pykbroker.security.sasl.authenticator import SaslListener
from pykbroker.server.connection import FAILED_CLOSE_GRACE_S, KafkaConnection, RequestMemory
from pykbroker.server.handlers.api_versions import api_versions
from test_connection import FakeBroker, api_versions_frame, in_loop

CONFIGS = {
    "sasl.enabled.mechanisms": "PLAIN",
    "listener.name.sasl_plaintext.plain.sasl.jaas.config":
        'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="pw";',
    "connections.max.reauth.ms": 60000,
    "connection.failed.authentication.delay.ms": 0,
}


class SmallSendBuffer(KafkaConnection):
    """The broker side with a small kernel send buffer: unread answers stay in asyncio's write buffer."""

    def connection_made(self, transport) -> None:
        transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        super().connection_made(transport)


@in_loop
async def test_a_failed_reauthentication_behind_unread_answers_still_closes_the_connection():
    loop = asyncio.get_running_loop()
    broker = FakeBroker()
    listener = SaslListener.from_configs("SASL_PLAINTEXT", CONFIGS)
    server = await loop.create_server(
        lambda: SmallSendBuffer(broker, {18: api_versions}, 1 << 20, RequestMemory(-1), "SASL_PLAINTEXT",
                                sasl=listener), "127.0.0.1", 0)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a peer that reads nothing and buffers little
    client.setblocking(False)
    try:
        await loop.sock_connect(client, server.sockets[0].getsockname())
        login = [encode_request(SaslHandshakeRequest(mechanism="PLAIN"), 1, "t"),
                 encode_request(SaslAuthenticateRequest(auth_bytes=b"\0alice\0pw"), 2, "t")]
        await loop.sock_sendall(client, b"".join(login))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if broker.connections and next(iter(broker.connections)).principal is not None:
                break
        (connection,) = broker.connections
        assert str(connection.principal) == "User:alice"
        # ~200 KB of answers nobody reads, then a re-authentication with a wrong password.
        frames = [api_versions_frame(10 + index) for index in range(500)]
        frames.append(encode_request(SaslHandshakeRequest(mechanism="PLAIN"), 998, "t"))
        frames.append(encode_request(SaslAuthenticateRequest(auth_bytes=b"\0alice\0wrong"), 999, "t"))
        await loop.sock_sendall(client, b"".join(frames))
        deadline = loop.time() + FAILED_CLOSE_GRACE_S + 10
        while broker.connections and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert connection.transport.get_write_buffer_size() or not broker.connections  # the answers were stuck
        assert not broker.connections, "the failed re-authentication left the connection open"
    finally:
        client.close()
        server.close()
        await server.wait_closed()

"""SaslHandshake (key 17, v0-1) and SaslAuthenticate (key 36, v0-2) as requests: Kafka's KafkaApis answers.

On a SASL listener the exchange itself never reaches a handler: the connection's authenticator
(security/sasl/authenticator.py) takes every frame until the client is authenticated, and a SaslHandshake
that begins a KIP-368 re-authentication. What reaches these handlers is what Kafka's KafkaApis sees: a
SaslHandshake or SaslAuthenticate on a PLAINTEXT or SSL listener, or on an authenticated SASL connection
without re-authentication (no session lifetime, or less than a second since the last one began). Kafka answers
both with ILLEGAL_SASL_STATE (34), SaslAuthenticate with its message; the connection stays open.
"""

from __future__ import annotations

from pykbroker.protocol.errors import ErrorCode
from pykbroker.security.sasl.authenticator import SASL_AUTHENTICATE_KEY, SASL_HANDSHAKE_KEY
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._build import make, response_module


@handles(SASL_HANDSHAKE_KEY)
def sasl_handshake(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    return make(schema.SaslHandshakeResponse, error_code=ErrorCode.illegal_sasl_state, mechanisms=())


@handles(SASL_AUTHENTICATE_KEY)
def sasl_authenticate(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    return make(schema.SaslAuthenticateResponse, error_code=ErrorCode.illegal_sasl_state,
                error_message="SaslAuthenticate request received after successful authentication",
                auth_bytes=b"", session_lifetime=0)

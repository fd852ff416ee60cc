"""Mutated frames and random SASL tokens against a SASL_PLAINTEXT listener (security/sasl/authenticator.py and
every mechanism's state machine): each costs its own connection at most, the broker logs no traceback and no
error, keeps serving logins and requests, and its memory stays bounded.

Seeded (the seed is printed; PYKBROKER_FUZZ_SEED replays it); bounded to FRAMES mutated first frames and
TOKENS random tokens per mechanism.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import struct
from concurrent.futures import ThreadPoolExecutor

from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from broker_process import BrokerProcess, free_port, probe_api_versions, read_exact
from integration.fuzz.frames import corpus, read_rss_bytes, send_frames
from pykbroker.protocol.client import decode_response, encode_request

FRAMES = int(os.environ.get("PYKBROKER_FUZZ_FRAMES", 600))
TOKENS = 40
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
RSS_LIMIT = 512 * 1024 * 1024
MODULES = {"PLAIN": "plain.PlainLoginModule required user_alice=\"alice-pw\";",
           "SCRAM-SHA-256": "scram.ScramLoginModule required;", "SCRAM-SHA-512": "scram.ScramLoginModule required;",
           "OAUTHBEARER": "oauthbearer.OAuthBearerLoginModule required;"}


def _random_token(rng: random.Random, mechanism: str) -> bytes:
    """Random bytes, or a plausible message of the mechanism with random parts."""
    junk = bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 5, 40, 300, 2000))))
    plausible = {
        "PLAIN": lambda: b"\0".join(junk[i::3] for i in range(rng.randrange(1, 5))),
        "SCRAM-SHA-256": lambda: b"n,,n=" + junk[:20] + b",r=" + junk[20:40],
        "SCRAM-SHA-512": lambda: b"n,,n=alice,r=" + junk.hex().encode() + b"," + junk[:10],
        "OAUTHBEARER": lambda: b"n,,\x01auth=Bearer " + junk[:60] + b"\x01" + junk[60:80] + b"\x01\x01",
    }[mechanism]
    return junk if rng.random() < 0.5 else plausible()


def _exchange(port: int, mechanism: str, token: bytes) -> str:
    """Handshake, then the token (and a second random one if the first is answered); how it ended."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(encode_request(SaslHandshakeRequest(mechanism=mechanism), 1, "fuzz"))
        (size,) = struct.unpack(">i", read_exact(sock, 4))
        assert decode_response(17, 1, read_exact(sock, size)).error_code == 0
        sock.sendall(encode_request(SaslAuthenticateRequest(auth_bytes=token), 2, "fuzz"))
        try:
            head = sock.recv(4)
        except ConnectionResetError:
            return "closed"
        if not head:
            return "closed"
        (size,) = struct.unpack(">i", head + read_exact(sock, 4 - len(head)))
        answer = decode_response(36, 2, read_exact(sock, size))
        return "failed" if answer.error_code else "answered"


def test_mutated_frames_and_random_tokens_cost_only_their_connection(tmp_path, fuzz_seed):
    plain, sasl = free_port(), free_port()
    config = {"listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}",
              "sasl.enabled.mechanisms": ",".join(MECHANISMS), "connection.failed.authentication.delay.ms": 20}
    for mechanism, module in MODULES.items():
        config[f"listener.name.sasl_plaintext.{mechanism.lower()}.sasl.jaas.config"] = \
            f"org.apache.kafka.common.security.{module}"
    with BrokerProcess(tmp_path / "broker", config=config, port=plain) as broker:
        stats = asyncio.run(send_frames(("127.0.0.1", sasl), corpus(), fuzz_seed, range(FRAMES), answer_wait=0.3))
        assert stats.connect_errors == 0 and stats.sent == FRAMES, stats
        rng = random.Random(fuzz_seed)
        cases = [(mechanism, _random_token(rng, mechanism)) for mechanism in MECHANISMS for _ in range(TOKENS)]
        with ThreadPoolExecutor(max_workers=16) as pool:
            endings = list(pool.map(lambda case: _exchange(sasl, *case), cases))
        assert set(endings) <= {"closed", "failed", "answered"} and "failed" in endings, endings
        assert broker.is_running(), broker.log_tail()
        assert read_rss_bytes(broker.process.pid) < RSS_LIMIT
        probe_api_versions(("127.0.0.1", sasl))  # still answers ApiVersions before authentication
        assert _exchange(sasl, "PLAIN", b"\0alice\0alice-pw") == "answered"  # and logs clients in
        log = broker.log_path.read_text(errors="replace")
        assert "Traceback" not in log and " ERROR " not in log, broker.log_tail()

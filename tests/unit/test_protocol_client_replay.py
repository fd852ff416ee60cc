"""The broker's own client on real broker-to-broker bytes: a 3-broker Kafka 3.7.1 cluster in ZooKeeper mode
(../shared/wire-captures/16-zk-cluster-3.7.1.jsonl).

- Every request a Kafka broker sent another (controller channel: UpdateMetadata/LeaderAndIsr/StopReplica/
  ControlledShutdown; follower fetchers: Fetch v16 with replica state; AlterPartition v3 and its ApiVersions
  v3) re-encodes through client.encode_request to the recorded bytes, and every response decodes through
  client.decode_response (frame guard, then kio or the inter-broker codecs) with no byte left.
- Whole connections replayed: a fake broker expects, in order, exactly the recorded request bytes and
  answers each with the recorded response; the client sends the decoded requests pipelined on a fresh
  connection, as Kafka's controller channel and follower fetchers do (no ApiVersions, correlation ids from
  0), and must produce the same bytes and match every answer. A request Kafka never saw answered fails
  with ConnectionLost when the fake broker closes.

A committed excerpt (protocol_specs/fixtures/interbroker/16-zk-cluster-client-excerpt.jsonl: the
controller's first connection, one fetcher connection, one AlterPartition connection) keeps this running in
a fresh clone; the full capture is used too when present.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections import defaultdict
from pathlib import Path

import pytest
from kio.index import load_request_schema
from kio.serial import entity_reader

from pykbroker.protocol import interbroker
from pykbroker.protocol.client import ConnectionLost, KafkaClientConnection, decode_response, encode_request
from pykbroker.protocol.records import iter_headers

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
EXCERPT = REPO / "protocol_specs" / "fixtures" / "interbroker" / "16-zk-cluster-client-excerpt.jsonl"
FULL_CAPTURE = REPO.parent / "shared" / "wire-captures" / "16-zk-cluster-3.7.1.jsonl"
if not FULL_CAPTURE.exists():  # a worktree sits one level deeper than the main checkout
    FULL_CAPTURE = REPO.parents[1] / "shared" / "wire-captures" / "16-zk-cluster-3.7.1.jsonl"
SOURCES = [EXCERPT] + ([FULL_CAPTURE] if FULL_CAPTURE.exists() else [])


def broker_to_broker(client_id: str) -> bool:
    """Kafka's controller and AlterPartition channels send the broker id; its fetchers broker-N-fetcher-M."""
    return client_id.isdigit() or "-fetcher-" in client_id


def connections(path: Path) -> dict[int, list[dict]]:
    by_conn: dict[int, list[dict]] = defaultdict(list)
    for line in path.read_text().splitlines():
        frame = json.loads(line)
        if broker_to_broker(frame["client_id"]):
            by_conn[frame["conn"]].append(frame)
    return dict(by_conn)


def decode_request_body(raw: bytes, api_key: int, version: int):
    if api_key in interbroker.APIS:
        return interbroker.decode_request(raw)[1]
    request_type = load_request_schema(api_key, version)
    _, position = entity_reader(request_type.__header_schema__)(raw, 0)
    body, used = entity_reader(request_type)(raw, position)
    assert position + used == len(raw)
    return body


def test_the_excerpt_is_a_true_copy_of_whole_connections_of_the_capture():
    excerpt = connections(EXCERPT)
    assert {frames[0]["client_id"] for frames in excerpt.values()} == {"1", "broker-1-fetcher-0"}
    assert {(f["api_key"], f["api_version"]) for frames in excerpt.values() for f in frames} == {
        (4, 7), (6, 8), (1, 16), (18, 3), (56, 3)}
    if not FULL_CAPTURE.exists():
        pytest.skip("the full capture lives outside the repository")
    full = connections(FULL_CAPTURE)
    for conn, frames in excerpt.items():
        assert frames == full[conn]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_every_broker_to_broker_frame_encodes_and_decodes_as_kafka_wrote_it(source):
    requests = responses = batches = 0
    for frames in connections(source).values():
        for frame in frames:
            raw = bytes.fromhex(frame["hex"])
            key, version, correlation_id = frame["api_key"], frame["api_version"], frame["correlation_id"]
            if frame["dir"] == "request":
                body = decode_request_body(raw, key, version)
                encoded = encode_request(body, correlation_id, frame["client_id"])
                assert struct.unpack_from(">i", encoded)[0] == len(raw)
                assert encoded[4:] == raw, f"seq {frame['seq']}: {frame['api_name']} v{version} differs"
                requests += 1
            else:
                response = decode_response(key, version, raw)  # raises on a leftover byte
                assert struct.unpack_from(">i", raw)[0] == correlation_id
                if key == 1:
                    for topic in response.responses:
                        for partition in topic.partitions:
                            batches += len(list(iter_headers(partition.records or b"")))
                responses += 1
    assert requests > 50 and responses > 50 and batches >= 1, (requests, responses, batches)


def replayable(source: Path) -> list[list[dict]]:
    """Connections whose requests used correlation ids 0, 1, 2, ... in order (Kafka's AlterPartition
    channel numbers its first request before the ApiVersions it sends first, which no client that
    numbers requests when it sends them reproduces)."""
    found = []
    for frames in connections(source).values():
        ids = [f["correlation_id"] for f in frames if f["dir"] == "request"]
        if ids == list(range(len(ids))):
            found.append(frames)
    return found


async def replay(frames: list[dict]) -> tuple[int, int]:
    requests = [f for f in frames if f["dir"] == "request"]
    answers = {f["correlation_id"]: bytes.fromhex(f["hex"]) for f in frames if f["dir"] == "response"}
    mismatches: list[str] = []

    async def fake_broker(reader, writer):
        try:
            for request in requests:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                got = await reader.readexactly(size)
                if got != bytes.fromhex(request["hex"]):
                    mismatches.append(f"seq {request['seq']}")
                    break
                answer = answers.get(request["correlation_id"])
                if answer is None:  # Kafka never answered it (the connection ended)
                    break
                writer.write(struct.pack(">i", len(answer)) + answer)
        finally:
            writer.close()

    server = await asyncio.start_server(fake_broker, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        connection = await KafkaClientConnection.connect(
            "127.0.0.1", port, client_id=requests[0]["client_id"], negotiate_versions=False)
        futures = [connection.send_nowait(decode_request_body(bytes.fromhex(r["hex"]), r["api_key"],
                                                              r["api_version"]))
                   for r in requests]
        results = await asyncio.gather(*futures, return_exceptions=True)
        await connection.aclose()
    finally:
        server.close()
        await server.wait_closed()
    assert not mismatches, f"the client's request bytes differ from Kafka's at {mismatches}"
    answered = 0
    for request, result in zip(requests, results):
        expected = answers.get(request["correlation_id"])
        if expected is None:
            assert isinstance(result, ConnectionLost), result
        else:
            assert result == decode_response(request["api_key"], request["api_version"], expected)
            answered += 1
    return len(requests), answered


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_replaying_kafkas_controller_and_fetcher_connections_gives_the_same_bytes(source):
    conns = replayable(source)
    assert {frames[0]["client_id"] for frames in conns} >= {"1", "broker-1-fetcher-0"}
    total = answered = 0
    for frames in conns:
        sent, got = asyncio.run(asyncio.wait_for(replay(frames), 20))
        total, answered = total + sent, answered + got
    assert answered > 40 and total > answered  # some fetches were cut off by broker deaths

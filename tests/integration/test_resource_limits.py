"""Broker memory stays bounded against clients that do not read, do not finish their frames, or open too
many connections, and the other clients are served meanwhile (issue 7, "memory grows without bound").

* A client pipelining 200 Fetch requests of 30 MiB max_bytes over a topic holding 32 MiB and never
  reading its socket: the connection handles one request at a time and stops while its response is
  unsent, so the broker holds about one response. Asserted: RSS grows by less than FETCH_RSS_BOUND_MIB
  (main grew to 5.9 GB in 20 s), and another client reads the whole topic meanwhile.
* 20 connections each stalled half-way through a 90 MB frame: request bytes are bounded broker-wide
  (queued.max.request.bytes, 100 MiB here, the least Kafka allows with socket.request.max.bytes' default):
  a frame is reserved whole when its size is read, so once two frames are reserved the others are not
  read; RSS grows by less than STALLED_RSS_BOUND_MIB (main held 854 MB forever); a new client's small
  request is answered; every stalled connection is closed after connections.max.idle.ms (4 s here).
* A client that pipelines fetches and never reads is closed when idle (the broker aborts: a graceful
  close would wait forever for its unsent bytes) and its slot is freed: with max.connections 1, another
  client connects afterwards.
* Produce with acks=0 to a partition that does not exist: the broker closes the connection, as Kafka does.
* max.connections: at the limit the broker stops accepting (KIP-402); a new connection waits in the backlog
  and is served once another one closes.
* max.connections.per.ip: the connection beyond the limit is closed, the others keep working.
"""

from __future__ import annotations

import datetime
import select
import socket
import struct
import time

import pytest
from kio.schema.fetch.v4.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import i16, i32, i32Timedelta, i64

from broker_process import ProtocolError, fetch_raw, probe_api_versions, produce_raw, send_request
from pykbroker.protocol.client import encode_request
from pykbroker.protocol.records import build_batch, iter_headers

MIB = 1024 * 1024
TOPIC_MIB = 32
FETCH_MAX_BYTES = 30 * MIB
PIPELINED_FETCHES = 200
FETCH_RSS_BOUND_MIB = 200
STALLED_CONNECTIONS = 20
STALLED_FRAME_BYTES = 90 * 1000 * 1000
QUEUED_MAX_REQUEST_BYTES = 100 * MIB
STALLED_RSS_BOUND_MIB = 200
IDLE_MS = 4000


def _rss_mib(broker) -> float:
    with open(f"/proc/{broker.process.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS line")


def _frame(request, correlation_id: int) -> bytes:
    return encode_request(request, correlation_id, "limits")


def _fill_topic(broker, topic: str) -> int:
    send_request(broker.address, MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name=topic),), allow_auto_topic_creation=True,
        include_topic_authorized_operations=False))
    value = b"v" * (100 * 1024)
    for _ in range(TOPIC_MIB):
        answer = produce_raw(broker.address, topic, 0, bytes(build_batch([(None, value)] * 10)), acks=1)
        assert answer.error_code == 0
    return TOPIC_MIB * 10


def greedy_fetch_frame(topic: str) -> bytes:
    """A Fetch of FETCH_MAX_BYTES from offset 0 of ``topic``'s partition 0 that answers at once (also used by
    test_tls_listeners)."""
    return _frame(FetchRequest(
        replica_id=i32(-1), max_wait=i32Timedelta.parse(datetime.timedelta(0)), min_bytes=i32(1),
        max_bytes=i32(FETCH_MAX_BYTES), isolation_level=0, topics=(FetchTopic(topic=topic, partitions=(
            FetchPartition(partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(FETCH_MAX_BYTES)),)),)), 1)


def _closed_by_peer(sock: socket.socket, deadline: float) -> bool:
    """Wait (until ``deadline``) for the broker to close ``sock``; True when it did."""
    while time.monotonic() < deadline:
        readable, _, _ = select.select([sock], [], [], max(0.0, deadline - time.monotonic()))
        if not readable:
            return False
        try:
            if sock.recv(65536) == b"":
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


@pytest.mark.timeout(240)
def test_a_client_pipelining_fetches_without_reading_leaves_memory_bounded(broker_factory, topic_name):
    broker = broker_factory.make({"num.partitions": 1})
    records = _fill_topic(broker, topic_name)
    baseline = _rss_mib(broker)
    fetch = greedy_fetch_frame(topic_name)
    with socket.socket() as greedy:
        greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        greedy.connect(broker.address)
        greedy.sendall(fetch * PIPELINED_FETCHES)  # ~20 KB: fits in the broker's socket buffer
        peak = baseline
        # Meanwhile another client reads the whole topic, megabyte by megabyte, and answers ApiVersions.
        offset = 0
        while offset < records:
            batches = list(iter_headers(fetch_raw(broker.address, topic_name, 0, offset, max_bytes=MIB)))
            assert batches, f"no batch at offset {offset}"
            offset = batches[-1].base_offset + batches[-1].last_offset_delta + 1
            probe_api_versions(broker.address, timeout=10)
            peak = max(peak, _rss_mib(broker))
    assert offset == records
    assert peak - baseline < FETCH_RSS_BOUND_MIB, f"RSS grew from {baseline:.0f} to {peak:.0f} MiB"


def _push_half_frames(broker) -> list[socket.socket]:
    """Open the stalled connections and push each one half a frame, until the broker stops reading."""
    half = STALLED_FRAME_BYTES // 2
    chunk = b"\0" * MIB
    sockets, sent = [], {}
    for _ in range(STALLED_CONNECTIONS):
        sock = socket.create_connection(broker.address, timeout=10)
        sock.sendall(struct.pack(">i", STALLED_FRAME_BYTES))
        sock.setblocking(False)
        sockets.append(sock)
        sent[sock] = 0
    pending = list(sockets)
    while pending:
        # The broker stopped reading them all when none becomes writable within a second.
        _, writable, _ = select.select([], pending, [], 1.0)
        if not writable:
            break
        for sock in writable:
            try:
                sent[sock] += sock.send(chunk[: half - sent[sock]])
            except BlockingIOError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                sent[sock] = half
            if sent[sock] >= half:
                pending.remove(sock)
    return sockets


@pytest.mark.timeout(240)
def test_connections_stalled_mid_frame_are_bounded_and_closed_when_idle(broker_factory):
    broker = broker_factory.make({"queued.max.request.bytes": QUEUED_MAX_REQUEST_BYTES,
                                  "connections.max.idle.ms": IDLE_MS})
    baseline = _rss_mib(broker)
    sockets = _push_half_frames(broker)
    try:
        held = _rss_mib(broker)
        assert probe_api_versions(broker.address, timeout=5).error_code == 0
        assert held - baseline < STALLED_RSS_BOUND_MIB, f"RSS grew from {baseline:.0f} to {held:.0f} MiB"
        deadline = time.monotonic() + IDLE_MS / 1000 + 60
        still_open = [s for s in sockets if not _closed_by_peer(s, deadline)]
        assert not still_open, f"{len(still_open)} stalled connections still open"
    finally:
        for sock in sockets:
            sock.close()
    assert probe_api_versions(broker.address, timeout=5).error_code == 0
    assert "idle for more than connections.max.idle.ms" in broker.log_tail(200)


def _retrying(action, deadline: float):
    """``action()``'s result, retried until ``deadline`` (a connection may meet the previous one's slot)."""
    while True:
        try:
            return action()
        except (OSError, ProtocolError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.timeout(120)
def test_a_greedy_fetcher_is_aborted_when_idle_and_its_slot_freed(broker_factory, topic_name):
    broker = broker_factory.make({"num.partitions": 1, "connections.max.idle.ms": 2000, "max.connections": 1})
    deadline = time.monotonic() + 60
    _retrying(lambda: send_request(broker.address, MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name=topic_name),), allow_auto_topic_creation=True,
        include_topic_authorized_operations=False)), deadline)
    value = b"v" * (100 * 1024)
    for _ in range(8):  # 8 MiB: far more than the broker's write high-water mark and socket buffers hold
        answer = _retrying(lambda: produce_raw(broker.address, topic_name, 0, bytes(build_batch([(None, value)] * 10)),
                                               acks=1), deadline)
        assert answer.error_code == 0
    fetch = _frame(FetchRequest(
        replica_id=i32(-1), max_wait=i32Timedelta.parse(datetime.timedelta(0)), min_bytes=i32(1),
        max_bytes=i32(16 * MIB), isolation_level=0, topics=(FetchTopic(topic=topic_name, partitions=(
            FetchPartition(partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(16 * MIB)),)),)), 1)
    greedy = _retrying(lambda: socket.create_connection(broker.address, timeout=10), deadline)
    with greedy:
        greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        greedy.sendall(fetch * 4)  # four answers of 8 MiB each; the client reads none of them for now
        # With max.connections 1, a new client is served only once the greedy one's slot is freed: the idle
        # sweep must really end that connection although its response can never drain.
        probe = _retrying(lambda: probe_api_versions(broker.address, timeout=2), time.monotonic() + 30)
        assert probe.error_code == 0
        # Now read: the unsent responses were dropped, the stream ends (EOF or RST) well short of 32 MiB.
        received, closed = 0, False
        greedy.settimeout(10)
        while not closed:
            try:
                data = greedy.recv(1 << 20)
            except (ConnectionResetError, BrokenPipeError):
                break
            closed = data == b""
            received += len(data)
        assert received < 4 * 8 * MIB
    assert "idle for more than connections.max.idle.ms" in broker.log_tail(200)


def test_an_acks_0_produce_that_fails_closes_the_connection(broker_factory, topic_name):
    broker = broker_factory.make({"auto.create.topics.enable": False})
    produce = _frame(ProduceRequest(
        transactional_id=None, acks=i16(0), timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
        topic_data=(TopicProduceData(name=topic_name, partition_data=(
            PartitionProduceData(index=i32(0), records=bytes(build_batch([(None, b"v")]))),)),)), 1)
    with socket.create_connection(broker.address, timeout=10) as sock:
        sock.sendall(produce)
        assert _closed_by_peer(sock, time.monotonic() + 20)
    assert "acks=0 produce failed" in broker.log_tail(50)


_API_VERSIONS = bytes.fromhex("0012000000000001ffff")  # ApiVersions v0, correlation id 1, null client id
API_VERSIONS_FRAME = struct.pack(">i", len(_API_VERSIONS)) + _API_VERSIONS


def _answered_connections(broker, count: int) -> list[socket.socket]:
    """``count`` connections, each answered (so accepted and counted) before the next one opens."""
    kept = []
    for _ in range(count):
        sock = socket.create_connection(broker.address, timeout=10)
        kept.append(sock)
        sock.sendall(API_VERSIONS_FRAME)
        assert len(sock.recv(4)) == 4
    return kept


def test_connections_beyond_max_connections_per_ip_are_closed(broker_factory):
    broker = broker_factory.make({"max.connections.per.ip": 3})
    frame = API_VERSIONS_FRAME
    kept = _answered_connections(broker, 3)
    try:
        with socket.create_connection(broker.address, timeout=10) as refused:
            assert _closed_by_peer(refused, time.monotonic() + 20)
        for sock in kept:
            sock.sendall(frame)
            assert sock.recv(4)
    finally:
        for sock in kept:
            sock.close()
    assert "max.connections.per.ip 3 reached" in broker.log_tail(50)


def test_at_max_connections_new_connections_wait_until_a_slot_frees(broker_factory):
    broker = broker_factory.make({"max.connections": 2})
    kept = _answered_connections(broker, 2)
    try:
        with socket.create_connection(broker.address, timeout=10) as waiting:  # lands in the listen backlog
            waiting.sendall(API_VERSIONS_FRAME)
            readable, _, _ = select.select([waiting], [], [], 1.0)
            assert not readable, "the connection beyond max.connections was answered or closed"
            kept.pop().close()
            waiting.settimeout(20)
            assert len(waiting.recv(4)) == 4  # accepted and answered once a slot is free
    finally:
        for sock in kept:
            sock.close()

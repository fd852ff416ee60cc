"""A small client for the client quota tests (tests/integration/test_client_quotas.py, tests/cluster): one
connection speaking kio entities, pipelining allowed, and the AlterClientQuotas / DescribeClientQuotas /
Produce / Fetch / CreateTopics requests those tests send."""

from __future__ import annotations

import datetime
import socket
import struct

from kio.index import load_response_from_request
from kio.schema.alter_client_quotas.v1.request import AlterClientQuotasRequest, EntityData, EntryData, OpData
from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest
from kio.schema.describe_client_quotas.v1.request import ComponentData, DescribeClientQuotasRequest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.serial import entity_reader
from kio.static.primitive import f64, i8, i16, i32, i32Timedelta, i64

from pykbroker.protocol.client import encode_request
from pykbroker.protocol.records import build_batch


def ms(milliseconds: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=milliseconds))


def throttle_ms(response) -> int:
    return int(response.throttle_time.total_seconds() * 1000)


class Wire:
    """One client connection speaking kio entities: requests may be pipelined; each answer is timed."""

    def __init__(self, broker, client_id: str) -> None:
        self.sock = socket.create_connection(broker.address, timeout=60)
        self.client_id = client_id
        self.correlation = 0
        self.pending: list[tuple[int, type]] = []

    def send(self, request) -> None:
        self.correlation += 1
        self.sock.sendall(encode_request(request, self.correlation, self.client_id))
        self.pending.append((self.correlation, load_response_from_request(type(request))))

    def receive(self):
        correlation, response_type = self.pending.pop(0)
        (size,) = struct.unpack(">i", self._read(4))
        payload = self._read(size)
        header, header_size = entity_reader(response_type.__header_schema__)(payload, 0)
        assert header.correlation_id == correlation
        return entity_reader(response_type)(payload, header_size)[0]

    def request(self, request):
        self.send(request)
        return self.receive()

    def _read(self, count: int) -> bytes:
        data = bytearray()
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            data += chunk
        return bytes(data)

    def close(self) -> None:
        self.sock.close()


def entity(**parts) -> tuple:
    return tuple(EntityData(entity_type=kind.replace("_", "-"), entity_name=name) for kind, name in parts.items())


def alter(wire: Wire, entity_parts: dict, ops: dict, *, validate_only: bool = False):
    """One AlterClientQuotas entry: ops {key: value, or None to remove}; the entry's (error, message)."""
    response = wire.request(AlterClientQuotasRequest(entries=(EntryData(
        entity=entity(**entity_parts),
        ops=tuple(OpData(key=k, value=f64(0.0 if v is None else float(v)), remove=v is None) for k, v in ops.items()),
    ),), validate_only=validate_only))
    (entry,) = response.entries
    return entry.error_code, entry.error_message


def describe(wire: Wire, components: list[tuple[str, int, str | None]], strict: bool = False):
    return wire.request(DescribeClientQuotasRequest(components=tuple(
        ComponentData(entity_type=kind, match_type=i8(match_type), match=match)
        for kind, match_type, match in components), strict=strict))


def described(response) -> dict:
    return {tuple((e.entity_type, e.entity_name) for e in entry.entity): {v.key: v.value for v in entry.values}
            for entry in response.entries}


def create_topic(wire: Wire, name: str, partitions: int = 1):
    response = wire.request(CreateTopicsRequest(topics=(CreatableTopic(
        name=name, num_partitions=i32(partitions), replication_factor=i16(1), assignments=(), configs=()),),
        timeout=ms(30_000), validate_only=False))
    assert response.topics[0].error_code == ErrorCode.none, response
    return response


def produce_request(topic: str, value_bytes: int, records: int = 1, acks: int = -1) -> ProduceRequest:
    batch = build_batch([(None, b"v" * value_bytes)] * records)
    return ProduceRequest(transactional_id=None, acks=i16(acks), timeout=ms(30_000), topic_data=(
        TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=i32(0), records=bytes(batch)),)),))


def fetch_request(topic: str, offset: int, max_bytes: int = 1 << 20) -> FetchRequest:
    return FetchRequest(cluster_id=None, replica_id=i32(-1), max_wait=ms(0), min_bytes=i32(1),
                        max_bytes=i32(max_bytes), isolation_level=i8(0), session_id=i32(0), session_epoch=i32(-1),
                        topics=(FetchTopic(topic=topic, partitions=(
                            FetchPartition(partition=i32(0), current_leader_epoch=i32(-1), fetch_offset=i64(offset),
                                           last_fetched_epoch=i32(-1), log_start_offset=i64(-1),
                                           partition_max_bytes=i32(max_bytes)),)),),
                        forgotten_topics_data=(), rack_id="")

"""The consumer embedded protocol of the classic JoinGroup / SyncGroup (Kafka's ConsumerProtocol): the
Subscription a member sends in JoinGroup and the Assignment it gets in SyncGroup. The coordinator reads
and writes them itself only for classic members of a consumer group (an upgraded group, KIP-848), where the
server, not a leader, assigns.

Subscription v0: topics [string], user_data bytes; v1 adds owned_partitions [topic string, partitions [int32]];
v2 adds generation_id int32; v3 adds rack_id nullable string. Assignment v0-v3: assigned_partitions
[topic string, partitions [int32]], user_data bytes. Every version starts with an int16 version; a version above
the highest known is read as the highest (Kafka's ConsumerProtocol does so)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Mapping

HIGHEST_SUBSCRIPTION_VERSION = 3
HIGHEST_ASSIGNMENT_VERSION = 3


@dataclass(frozen=True)
class Subscription:
    version: int
    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    generation_id: int = -1
    rack_id: str | None = None


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)
        self.pos = 0

    def _take(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def int16(self) -> int:
        return self._take(">h")

    def int32(self) -> int:
        return self._take(">i")

    def string(self) -> str | None:
        length = self.int16()
        if length < 0:
            return None
        if self.pos + length > len(self.data):
            raise ValueError("string past the end")
        value = self.data[self.pos:self.pos + length].decode()
        self.pos += length
        return value

    def bytes_(self) -> bytes | None:
        length = self.int32()
        if length < 0:
            return None
        if self.pos + length > len(self.data):
            raise ValueError("bytes past the end")
        value = self.data[self.pos:self.pos + length]
        self.pos += length
        return value

    def array(self, read):
        count = self.int32()
        if count > len(self.data) - self.pos:
            raise ValueError("array longer than the data")
        return [read() for _ in range(max(count, 0))]

    def at_end(self) -> bool:
        return self.pos >= len(self.data)


def _topic_partitions(reader: _Reader) -> tuple[str, tuple[int, ...]]:
    return reader.string() or "", tuple(reader.array(reader.int32))


def decode_subscription(metadata: bytes) -> Subscription:
    """A Subscription (ValueError if the bytes are not one). Fields a version has are read when present
    (older clients may stop early)."""
    try:
        reader = _Reader(metadata)
        version = reader.int16()
        if version < 0:
            raise ValueError(f"unsupported subscription version {version}")
        version = min(version, HIGHEST_SUBSCRIPTION_VERSION)
        topics = tuple(t or "" for t in reader.array(reader.string))
        user_data = reader.bytes_() if not reader.at_end() else None
        owned: dict[str, tuple[int, ...]] = {}
        generation, rack = -1, None
        if version >= 1 and not reader.at_end():
            for topic, parts in reader.array(lambda: _topic_partitions(reader)):
                owned[topic] = owned.get(topic, ()) + parts
        if version >= 2 and not reader.at_end():
            generation = reader.int32()
        if version >= 3 and not reader.at_end():
            rack = reader.string()
        return Subscription(version, topics, user_data, owned, generation, rack)
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"not a consumer protocol subscription: {exc}") from None


def subscription_version(metadata: bytes) -> int:
    """The version a Subscription was written in (0 if unreadable)."""
    return struct.unpack_from(">h", metadata)[0] if len(metadata) >= 2 else 0


def encode_assignment(partitions: Mapping[str, tuple[int, ...] | frozenset[int]], version: int,
                      user_data: bytes | None = None) -> bytes:
    """An Assignment in ``version`` (clamped to 0..3, as Kafka's checkAssignmentVersion)."""
    version = max(0, min(version, HIGHEST_ASSIGNMENT_VERSION))
    out = [struct.pack(">hi", version, len(partitions))]
    for topic in sorted(partitions):
        name = topic.encode()
        parts = sorted(partitions[topic])
        out.append(struct.pack(">h", len(name)) + name + struct.pack(f">i{len(parts)}i", len(parts), *parts))
    out.append(struct.pack(">i", -1) if user_data is None else struct.pack(">i", len(user_data)) + user_data)
    return b"".join(out)


def decode_assignment(data: bytes) -> dict[str, tuple[int, ...]]:
    """The partitions of an Assignment (ValueError if the bytes are not one)."""
    try:
        reader = _Reader(data)
        reader.int16()
        return {topic: parts for topic, parts in reader.array(lambda: _topic_partitions(reader))}
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"not a consumer protocol assignment: {exc}") from None

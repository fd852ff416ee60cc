"""The invariants of a fault run, checked after the fact (Jepsen's Kafka checker, reduced to one topic).

Inputs:
  acknowledged  every record a producer saw acknowledged: (partition, offset, value)
  final_log     what the cluster holds at the end, read from the leaders up to the high-water mark:
                {partition: [(offset, value), ...]}
  observed      what consumers saw while the run went on, one list per consumer (in the order each saw them)

Record values are ``<producer>:<sequence>`` (workload.SeqProducer): each value is written once, and a
producer's sequence numbers grow in the order it sent them.

Invariants (each violation is listed, the counts are printed):
  lost         an acknowledged record missing from the final log (its offset is gone)
  changed      an acknowledged offset that holds another value in the final log
  duplicates   a value present at two offsets of the final log (an idempotent producer's retry written twice)
  reordered    one producer's records on one partition not in sequence order in the final log
  diverged     an offset a consumer saw with a value other than the final log's, or that later disappeared
  skips        a consumer's offsets on a partition not dense and increasing (a skip or a step back), as
               (consumer index, partition, previous offset, offset)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple


class Rec(NamedTuple):
    partition: int
    offset: int
    value: bytes


def parse_value(value: bytes) -> tuple[str, int]:
    """``b"p1:000042"`` → ("p1", 42)."""
    producer, _, seq = value.decode().rpartition(":")
    return producer, int(seq)


@dataclass
class CheckResult:
    acknowledged: int = 0
    read: int = 0
    lost: list[Rec] = field(default_factory=list)
    changed: list[tuple[Rec, bytes]] = field(default_factory=list)
    duplicates: list[tuple[bytes, list[tuple[int, int]]]] = field(default_factory=list)
    reordered: list[tuple[str, int, int, int]] = field(default_factory=list)
    diverged: list[tuple[Rec, bytes | None]] = field(default_factory=list)
    skips: list[tuple[int, int, int, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.changed or self.duplicates or self.reordered or self.diverged or self.skips)

    def counts(self) -> dict[str, int]:
        return {"acknowledged": self.acknowledged, "read": self.read, "lost": len(self.lost),
                "changed": len(self.changed), "duplicates": len(self.duplicates),
                "reordered": len(self.reordered), "diverged": len(self.diverged), "skips": len(self.skips)}

    def summary(self, examples: int = 5) -> str:
        lines = [" ".join(f"{k}={v}" for k, v in self.counts().items())]
        for name in ("lost", "changed", "duplicates", "reordered", "diverged", "skips"):
            items = getattr(self, name)
            if items:
                lines.append(f"  {name} (first {min(examples, len(items))} of {len(items)}): {items[:examples]}")
        return "\n".join(lines)


def check(acknowledged: Iterable[Rec], final_log: dict[int, list[tuple[int, bytes]]],
          observed: Iterable[list[Rec]] = ()) -> CheckResult:
    result = CheckResult()
    final: dict[tuple[int, int], bytes] = {}
    places: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for partition, records in final_log.items():
        for offset, value in records:
            final[(partition, offset)] = value
            places[value].append((partition, offset))
    result.read = len(final)

    acked = list(acknowledged)
    result.acknowledged = len(acked)
    for rec in acked:
        if rec.offset is None or rec.offset < 0:
            # Acknowledged without an offset: librdkafka's idempotent producer "implicitly acks" a batch whose
            # answer timed out once a later batch of the same partition succeeded (the broker's sequence
            # check proves it was written). It must be in the partition, at some offset.
            if rec.partition not in {partition for partition, _ in places.get(rec.value, ())}:
                result.lost.append(rec)
            continue
        held = final.get((rec.partition, rec.offset))
        if held is None:
            result.lost.append(rec)
        elif held != rec.value:
            result.changed.append((rec, held))

    result.duplicates = sorted((value, where) for value, where in places.items() if len(where) > 1)

    last_seq: dict[tuple[str, int], tuple[int, int]] = {}
    for partition in sorted(final_log):
        for offset, value in sorted(final_log[partition]):
            producer, seq = parse_value(value)
            previous = last_seq.get((producer, partition))
            if previous is not None and seq <= previous[1]:
                result.reordered.append((producer, partition, previous[1], seq))
            last_seq[(producer, partition)] = (offset, seq)

    for consumer, seen in enumerate(observed):
        last_offset: dict[int, int] = {}
        for rec in seen:
            held = final.get((rec.partition, rec.offset))
            if held != rec.value:
                result.diverged.append((rec, held))
            previous = last_offset.get(rec.partition)
            if previous is not None and rec.offset != previous + 1:
                result.skips.append((consumer, rec.partition, previous, rec.offset))
            last_offset[rec.partition] = rec.offset
    return result

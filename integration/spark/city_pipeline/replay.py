"""Options for `spark.read.format("kafka")` that select a range to reprocess.

The broker keeps the data; the reader picks the range. The Kafka source takes it as
  startingOffsets / endingOffsets    JSON {"topic": {"0": 120, "1": -2}} (-2 earliest, -1 latest)
  startingTimestamp / endingTimestamp epoch milliseconds for every partition (ListOffsets by timestamp)
When the JSON form is used the source insists that it names every partition it reads (it asserts
"you must specify all TopicPartitions"), so partitions the user did not name get the open end of the
range: earliest for the start, latest for the end.

A start offset is inclusive and an end offset exclusive, as everywhere in Kafka. A start timestamp
selects, per partition, the first record whose timestamp is at or after it; a partition with no such
record contributes nothing (startingOffsetsByTimestampStrategy=latest instead of failing the job).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

EARLIEST = -2
LATEST = -1
_NAMED_OFFSETS = {"earliest": EARLIEST, "latest": LATEST}


def parse_partition_offsets(spec: str) -> dict[int, int]:
    """'0:120,2:earliest' -> {0: 120, 2: -2}. Offsets are non-negative, or earliest/latest (-2/-1)."""
    offsets: dict[int, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        partition_text, sep, offset_text = item.partition(":")
        if not sep:
            raise ValueError(f"{item!r}: expected PARTITION:OFFSET")
        try:
            partition = int(partition_text)
            offset_text = offset_text.strip().lower()
            offset = _NAMED_OFFSETS[offset_text] if offset_text in _NAMED_OFFSETS else int(offset_text)
        except ValueError:
            raise ValueError(f"{item!r}: partition and offset must be integers (or earliest/latest)") from None
        if partition < 0 or offset < EARLIEST:
            raise ValueError(f"{item!r}: negative partition or offset")
        if partition in offsets:
            raise ValueError(f"partition {partition} given twice")
        offsets[partition] = offset
    if not offsets:
        raise ValueError(f"no PARTITION:OFFSET pairs in {spec!r}")
    return offsets


def offsets_json(topic: str, partitions: Iterable[int], chosen: Mapping[int, int], default: int) -> str:
    """The source's per-partition JSON for `topic`: `chosen` offsets, `default` for every other partition."""
    partitions = sorted(set(partitions))
    unknown = sorted(set(chosen) - set(partitions))
    if unknown:
        raise ValueError(f"topic {topic} has no partition {unknown} (partitions: {partitions})")
    return json.dumps({topic: {str(p): chosen.get(p, default) for p in partitions}})


def replay_options(topic: str, partitions: Iterable[int], *, from_offsets: Mapping[int, int] | None = None,
                   to_offsets: Mapping[int, int] | None = None, from_timestamp_ms: int | None = None,
                   to_timestamp_ms: int | None = None, only_listed: bool = False) -> dict[str, str]:
    """Source options that read `topic` from the given start to the given end.

    partitions: every partition of the topic. only_listed=True reads only the partitions named in
    from_offsets/to_offsets (the `assign` option) instead of the whole topic (`subscribe`).
    Without a start the range begins at the earliest offset; without an end it stops at the latest
    offset seen when the job starts.
    """
    partitions = sorted(set(partitions))
    if not partitions:
        raise ValueError(f"topic {topic} has no partitions")
    from_offsets = dict(from_offsets or {})
    to_offsets = dict(to_offsets or {})
    if from_offsets and from_timestamp_ms is not None:
        raise ValueError("give the start as offsets or as a timestamp, not both")
    if to_offsets and to_timestamp_ms is not None:
        raise ValueError("give the end as offsets or as a timestamp, not both")
    if LATEST in from_offsets.values():
        raise ValueError("a batch read cannot start at latest: the range would be empty")
    if EARLIEST in to_offsets.values():
        raise ValueError("a batch read cannot end at earliest: the range would be empty")
    for partition in set(from_offsets) & set(to_offsets):
        start, end = from_offsets[partition], to_offsets[partition]
        if start >= 0 and end >= 0 and start > end:
            raise ValueError(f"partition {partition}: start offset {start} is after end offset {end}")
    if from_timestamp_ms is not None and to_timestamp_ms is not None and from_timestamp_ms > to_timestamp_ms:
        raise ValueError(f"start timestamp {from_timestamp_ms} is after end timestamp {to_timestamp_ms}")
    for name, value in (("start", from_timestamp_ms), ("end", to_timestamp_ms)):
        if value is not None and value < 0:
            raise ValueError(f"{name} timestamp must be epoch milliseconds >= 0, got {value}")

    if only_listed:
        listed = sorted(set(from_offsets) | set(to_offsets))
        if not listed:
            raise ValueError("only_listed needs partitions named in from_offsets or to_offsets")
        offsets_json(topic, partitions, {p: 0 for p in listed}, 0)  # checks that they exist
        partitions = listed
        options = {"assign": json.dumps({topic: listed})}
    else:
        options = {"subscribe": topic}

    if from_offsets:
        options["startingOffsets"] = offsets_json(topic, partitions, from_offsets, EARLIEST)
    elif from_timestamp_ms is not None:
        options["startingTimestamp"] = str(from_timestamp_ms)
        options["startingOffsetsByTimestampStrategy"] = "latest"
    else:
        options["startingOffsets"] = "earliest"

    if to_offsets:
        options["endingOffsets"] = offsets_json(topic, partitions, to_offsets, LATEST)
    elif to_timestamp_ms is not None:
        # A partition with no record at or after the end timestamp reads to its latest offset.
        options["endingTimestamp"] = str(to_timestamp_ms)
    else:
        options["endingOffsets"] = "latest"
    return options

"""kcat (Debian's, librdkafka 2.0.x inside) against a pykbroker subprocess, driven as a subprocess.

kcat has no admin commands, so its topics are auto-created: this module's brokers start with a TOML
--config file setting "num.partitions" = 4, which also checks that the broker reads Kafka config keys
from --config. kcat's producer prints no offsets, so the tests read the log back with `kcat -C -J` and
check its shape (dense offsets, one partition per key, send order) and that it survives restarts.
Timestamped records for the ListOffsets test are written at the raw protocol level, because kcat
cannot set a record timestamp.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from broker_process import (
    BrokerProcess,
    Rec,
    assert_dense,
    batch_codecs,
    fetch_raw,
    keyed_workload,
    probe_api_versions,
    produce_raw,
)
from kio.schema.errors import ErrorCode
from pykbroker.protocol.records import build_batch

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed (scripts/install-test-deps.sh)"),
]

PARTITIONS = 4
BROKER_ID = 1
BROKER_CONFIG = {"num.partitions": PARTITIONS}
KCAT_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def kcat_broker(tmp_path_factory) -> BrokerProcess:
    with BrokerProcess(tmp_path_factory.mktemp("kcat-broker"), config=BROKER_CONFIG) as broker:
        yield broker


# -- kcat helpers ------------------------------------------------------------------------------------


def kcat(broker: BrokerProcess, *args: str, stdin: bytes | None = None) -> bytes:
    """Run kcat against the broker; a non-zero exit fails the test with kcat's stderr."""
    command = ["kcat", "-b", broker.bootstrap, *args]
    result = subprocess.run(command, input=stdin, capture_output=True, timeout=KCAT_TIMEOUT_S)
    assert result.returncode == 0, (
        f"{' '.join(command)} exited {result.returncode}\nstderr:\n{result.stderr.decode(errors='replace')}")
    return result.stdout


def produce_lines(broker: BrokerProcess, topic: str, lines: list[bytes], *args: str) -> None:
    kcat(broker, "-P", "-t", topic, *args, stdin=b"".join(line + b"\n" for line in lines))


def produce_keyed(broker: BrokerProcess, topic: str, pairs: list[tuple[bytes, bytes]], *args: str) -> None:
    produce_lines(broker, topic, [key + b"\t" + value for key, value in pairs], "-K", "\\t", *args)


def _decode_headers(flat: list | None) -> tuple:
    # kcat -J prints headers as a flat list: [key1, value1, key2, value2, ...]
    flat = flat or []
    return tuple((flat[i], None if flat[i + 1] is None else flat[i + 1].encode()) for i in range(0, len(flat), 2))


def consume(broker: BrokerProcess, topic: str, *args: str) -> list[Rec]:
    """kcat -C -J ... -e: read to the end of every selected partition; records in arrival order."""
    out = kcat(broker, "-C", "-t", topic, "-J", "-e", *args)
    records = []
    for line in out.splitlines():
        message = json.loads(line)
        records.append(Rec(message["partition"], message["offset"],
                           None if message["key"] is None else message["key"].encode(),
                           None if message["payload"] is None else message["payload"].encode(),
                           _decode_headers(message.get("headers"))))
    return records


def read_all(broker: BrokerProcess, topic: str) -> list[Rec]:
    return sorted(consume(broker, topic, "-o", "beginning"), key=lambda r: (r.partition, r.offset))


def assert_keyed_log(sent: list[tuple[bytes, bytes]], records: list[Rec]) -> None:
    """Without offsets from the producer: exactly the sent records, dense offsets, each key on one
    partition, and each partition in send order."""
    assert sorted((r.key, r.value) for r in records) == sorted(sent)
    assert_dense(records)
    for key in {k for k, _ in sent}:
        partitions = {r.partition for r in records if r.key == key}
        assert len(partitions) == 1, f"key {key!r} spread over partitions {partitions}"
    for partition in {r.partition for r in records}:
        in_log = [(r.key, r.value) for r in sorted(records, key=lambda r: r.offset) if r.partition == partition]
        keys_here = {k for k, _ in in_log}
        assert in_log == [pair for pair in sent if pair[0] in keys_here], f"partition {partition} out of order"
    assert len({r.partition for r in records}) > 1


def query_offset(broker: BrokerProcess, topic: str, partition: int, timestamp: int) -> int:
    """kcat -Q: ListOffsets by timestamp (-1 latest, -2 earliest)."""
    out = json.loads(kcat(broker, "-Q", "-J", "-t", f"{topic}:{partition}:{timestamp}"))
    # {"<topic>": {"topic": "<topic>", "<partition>": {"partition": p, "offset": o}}}
    answer = out[topic][str(partition)]
    assert answer["partition"] == partition and "error" not in answer, answer
    return answer["offset"]


# -- tests ---------------------------------------------------------------------------------------------


def test_keyed_messages_keep_order_and_dense_offsets(kcat_broker, topic_name):
    sent = keyed_workload(keys=20, per_key=10)
    produce_keyed(kcat_broker, topic_name, sent)
    assert_keyed_log(sent, read_all(kcat_broker, topic_name))


def test_metadata_lists_leaders_and_the_broker(kcat_broker, topic_name):
    produce_lines(kcat_broker, topic_name, [b"creates the topic"])
    metadata = json.loads(kcat(kcat_broker, "-L", "-J"))
    assert [(b["id"], b["name"]) for b in metadata["brokers"]] == [(BROKER_ID, kcat_broker.bootstrap)]
    assert metadata["controllerid"] == BROKER_ID
    (topic,) = [t for t in metadata["topics"] if t["topic"] == topic_name]
    assert "error" not in topic, topic
    partitions = sorted(topic["partitions"], key=lambda p: p["partition"])
    assert [p["partition"] for p in partitions] == list(range(PARTITIONS))  # num.partitions from --config
    for p in partitions:
        assert p["leader"] == BROKER_ID and "error" not in p, p
        assert [r["id"] for r in p["replicas"]] == [BROKER_ID] and [r["id"] for r in p["isrs"]] == [BROKER_ID]


def test_headers_null_key_null_value_and_large_value_round_trip(kcat_broker, topic_name):
    large = b"x" * (900 * 1024)
    partition = ["-p", "1"]
    produce_keyed(kcat_broker, topic_name, [(b"h", b"with headers")], *partition,
                  "-H", "trace-id=abc123", "-H", "twice=1", "-H", "twice=2")
    produce_lines(kcat_broker, topic_name, [b"no key"], *partition)
    produce_keyed(kcat_broker, topic_name, [(b"tombstone", b"")], *partition, "-Z")  # -Z: empty -> NULL
    produce_keyed(kcat_broker, topic_name, [(b"large", large), (b"after-large", b"still readable")], *partition)

    records = consume(kcat_broker, topic_name, "-p", "1", "-o", "beginning")
    assert records == [
        Rec(1, 0, b"h", b"with headers", (("trace-id", b"abc123"), ("twice", b"1"), ("twice", b"2"))),
        Rec(1, 1, None, b"no key"),
        Rec(1, 2, b"tombstone", None),
        Rec(1, 3, b"large", large),
        Rec(1, 4, b"after-large", b"still readable"),
    ]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_round_trip(kcat_broker, topic_name, codec):
    sent = keyed_workload(keys=8, per_key=25, padding=200)
    produce_keyed(kcat_broker, topic_name, sent, "-z", codec)
    records = read_all(kcat_broker, topic_name)
    assert_keyed_log(sent, records)
    expected = {codec if librdkafka_2_0_compresses(kcat_broker, codec) else "none"}
    for partition in {r.partition for r in records}:
        codecs = batch_codecs(fetch_raw(kcat_broker.address, topic_name, partition))
        assert codecs and set(codecs) == expected, f"partition {partition} serves batches {codecs}"


def librdkafka_2_0_compresses(broker: BrokerProcess, codec: str) -> bool:
    """librdkafka 2.0 (inside Debian's kcat) uses gzip, snappy and lz4 only if the broker's Produce range
    includes v0, zstd only if it includes v7, and otherwise sends the batch uncompressed without an
    error. A broker whose Produce starts at v3, as Kafka 4.0's does, therefore gets plain batches from
    this kcat for those three codecs; the librdkafka 2.16 in confluent-kafka compresses them."""
    (produce,) = [api for api in probe_api_versions(broker.address).api_keys if api.api_key == 0]
    return produce.min_version <= (7 if codec == "zstd" else 0) <= produce.max_version


def test_consume_from_partition_and_offset(kcat_broker, topic_name):
    produce_lines(kcat_broker, topic_name, [f"v{i}".encode() for i in range(30)], "-p", "2")
    records = consume(kcat_broker, topic_name, "-p", "2", "-o", "17")
    assert [(r.offset, r.value) for r in records] == [(i, f"v{i}".encode()) for i in range(17, 30)]
    records = consume(kcat_broker, topic_name, "-p", "2", "-o", "-3")  # relative to the end
    assert [r.offset for r in records] == [27, 28, 29]
    records = consume(kcat_broker, topic_name, "-p", "2", "-o", "5", "-c", "2")
    assert [r.offset for r in records] == [5, 6]


def test_query_offsets_earliest_latest_and_by_timestamp(kcat_broker, topic_name):
    produce_lines(kcat_broker, topic_name, [b"creates the topic"], "-p", "3")
    base = int(time.time() * 1000) - 60_000
    for ts in (base, base + 1000, base + 4000, base + 2000):
        answer = produce_raw(kcat_broker.address, topic_name, 0,
                             bytes(build_batch([(b"t", str(ts).encode())], timestamp_ms=ts)))
        assert answer.error_code == ErrorCode.none, answer

    assert query_offset(kcat_broker, topic_name, 0, -2) == 0
    assert query_offset(kcat_broker, topic_name, 0, -1) == 4
    assert query_offset(kcat_broker, topic_name, 0, base + 1500) == 2
    assert query_offset(kcat_broker, topic_name, 0, base + 4000) == 2
    assert query_offset(kcat_broker, topic_name, 0, base + 10_000) == -1  # nothing that late
    records = consume(kcat_broker, topic_name, "-p", "0", "-o", f"s@{base + 3000}")
    assert [r.offset for r in records] == [2, 3]


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_restart_keeps_records_and_offsets(broker_factory, topic_name, how):
    broker = broker_factory.make(config=BROKER_CONFIG)
    sent = keyed_workload(keys=12, per_key=10)
    produce_keyed(broker, topic_name, sent[:60])  # kcat exits 0 only when every message was delivered
    before = read_all(broker, topic_name)
    assert_keyed_log(sent[:60], before)

    broker.restart(kill=how == "kill9")

    assert read_all(broker, topic_name) == before
    produce_keyed(broker, topic_name, sent[60:])
    after = read_all(broker, topic_name)
    assert_keyed_log(sent, after)
    assert [r for r in after if (r.partition, r.offset) in {(b.partition, b.offset) for b in before}] == before

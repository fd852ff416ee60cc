"""Storage faults against a real broker: a full disk, a flipped bit, and a descriptor limit far below the
number of segment files.

- Disk full (a small tmpfs; skipped where mounting is not permitted): a produce that cannot be written is
  answered KAFKA_STORAGE_ERROR on a connection that stays usable, a half-written batch is cut off, appends
  work again once space is freed, and everything acknowledged reads back, also after kill -9.
- A bit flip in a partition's first batch, then kill -9: recovery cuts the log and says so in one WARN
  naming the partition, the offsets and the bytes cut.
- Thousands of one-batch segments and hundreds of partitions under RLIMIT_NOFILE 64 (soft) / 128 (hard):
  the broker raises the soft limit, serves every record, and restarts after kill -9.
- Records larger than segment.bytes fit no segment: RECORD_LIST_TOO_LARGE, nothing written (Kafka's rule).

Records go through the raw protocol (tests/integration/broker_process.py) so that each request and its
error code are seen exactly.
"""

from __future__ import annotations

import datetime
import errno
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from broker_process import BrokerProcess, fetch_raw, list_offset, produce_raw, send_request
from kio.schema.create_topics.v4.request import CreatableTopic, CreateTopicsRequest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i32Timedelta
from pykbroker.protocol.records import build_batch, iter_headers, read_records

pytestmark = pytest.mark.timeout(180)


def create_topic(broker: BrokerProcess, topic: str, partitions: int) -> None:
    response = send_request(broker.address, CreateTopicsRequest(
        topics=(CreatableTopic(name=topic, num_partitions=i32(partitions), replication_factor=i16(-1),
                               assignments=(), configs=()),),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)), validate_only=False))
    assert response.topics[0].error_code == ErrorCode.none, response.topics[0]


def produce_one(broker: BrokerProcess, topic: str, partition: int, value: bytes):
    return produce_raw(broker.address, topic, partition, build_batch([(None, value)], timestamp_ms=1_000), acks=1)


def read_values(broker: BrokerProcess, topic: str, partition: int) -> list[tuple[int, bytes]]:
    """(offset, value) of every record from offset 0 to the log end, fetching as often as needed."""
    end = list_offset(broker.address, topic, partition, -1)
    got: list[tuple[int, bytes]] = []
    offset = 0
    while offset < end:
        data = fetch_raw(broker.address, topic, partition, offset)
        assert data, f"empty fetch at offset {offset} of {end}"
        for header in iter_headers(data):
            got.extend((record.offset, record.value) for record in read_records(data, header))
            offset = header.next_offset
    return got


# -- a flipped bit ---------------------------------------------------------------------------------------


def test_recovery_that_truncates_a_log_logs_partition_offsets_and_bytes(broker):
    topic = "bitflip"
    create_topic(broker, topic, 1)
    for number in range(10):
        assert produce_one(broker, topic, 0, b"value-%d" % number).error_code == ErrorCode.none
    broker.kill()
    segment = broker.data_dir / f"{topic}-0" / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    first = next(iter_headers(data))
    data[first.size - 1] ^= 0x01  # one bit of the first batch's last record
    segment.write_bytes(data)

    broker.start()
    assert list_offset(broker.address, topic, 0, -1) == 0  # everything after the flip is untrustworthy
    warning = re.search(rf"WARNING \S+: {topic}-0: recovery truncated the log to end offset 0, "
                        rf"cutting offsets 0-9, (\d+) bytes: CRC mismatch", broker.log_path.read_text())
    assert warning, f"no truncation WARN naming the partition and offsets\n{broker.log_tail()}"
    assert int(warning.group(1)) == len(data)
    assert produce_one(broker, topic, 0, b"after").base_offset == 0


# -- segment.bytes ---------------------------------------------------------------------------------------


def test_records_larger_than_segment_bytes_are_refused_with_record_list_too_large(tmp_path):
    """Kafka's UnifiedLog.append: records larger than segment.bytes could fit no segment, so the produce gets
    RECORD_LIST_TOO_LARGE (18) with no error_message, as Kafka answers, and nothing is written."""
    with BrokerProcess(tmp_path / "small", config={"log.segment.bytes": 100}) as broker:
        create_topic(broker, "small", 1)
        refused = produce_one(broker, "small", 0, b"x" * 60)  # a 129-byte batch
        assert (refused.error_code, refused.error_message, refused.base_offset) == \
            (ErrorCode.record_list_too_large, None, -1)
        assert list_offset(broker.address, "small", 0, -1) == 0
        for number in range(3):  # 70-byte batches: each fits a segment of its own
            assert produce_one(broker, "small", 0, b"v%d" % number).base_offset == number
        assert sorted(path.name for path in (broker.data_dir / "small-0").glob("*.log")) == \
            ["%020d.log" % number for number in range(3)]
        assert read_values(broker, "small", 0) == [(number, b"v%d" % number) for number in range(3)]


# -- descriptors -----------------------------------------------------------------------------------------


class LimitedBroker(BrokerProcess):
    """A broker started under `prlimit --nofile=SOFT:HARD` (prlimit execs it: same pid)."""

    def __init__(self, workdir: Path, soft: int, hard: int, **kwargs) -> None:
        super().__init__(workdir, **kwargs)
        self.soft, self.hard = soft, hard

    def command(self) -> list[str]:
        return ["prlimit", f"--nofile={self.soft}:{self.hard}", "--", *super().command()]

    def open_descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))


@pytest.mark.skipif(shutil.which("prlimit") is None,
                    reason="needs util-linux prlimit to limit the broker's descriptors")
def test_thousands_of_segments_and_hundreds_of_partitions_under_a_low_descriptor_limit(tmp_path):
    soft, hard = 64, 128
    broker = LimitedBroker(tmp_path / "limited", soft, hard, config={"log.segment.bytes": 100})
    with broker:
        log = broker.log_path.read_text()
        assert f"raised the open-file limit (RLIMIT_NOFILE) from {soft} to the hard limit {hard}" in log
        assert f"open-file limit {hard}: up to {hard // 2} segment files open" in log
        create_topic(broker, "wide", 300)
        for partition in range(300):
            assert produce_one(broker, "wide", partition, b"p%d" % partition).error_code == ErrorCode.none
        create_topic(broker, "long", 1)
        count = 2000  # segment.bytes 100: every batch (80 bytes) rolls a new segment
        for number in range(count):
            response = produce_one(broker, "long", 0, b"record-%05d" % number)
            assert (response.error_code, response.base_offset) == (ErrorCode.none, number)
        segments = len(list((broker.data_dir / "long-0").glob("*.log")))
        assert segments >= count - 1
        assert broker.open_descriptors() < hard

        expected = [(number, b"record-%05d" % number) for number in range(count)]
        assert read_values(broker, "long", 0) == expected
        assert broker.open_descriptors() < hard

        broker.kill()  # the restart recovers from the recovery point and opens what it needs, lazily
        broker.start()
        assert read_values(broker, "long", 0) == expected
        assert [read_values(broker, "wide", p) for p in (0, 150, 299)] == [[(0, b"p0")], [(0, b"p150")], [(0, b"p299")]]
        assert produce_one(broker, "long", 0, b"after restart").base_offset == count
        assert broker.open_descriptors() < hard
        assert "Too many open files" not in broker.log_path.read_text()


# -- a full disk -----------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs mounted where the broker's data dir goes; skipped where mounting is not permitted."""
    mount_point = tmp_path / "full" / "data"
    mount_point.mkdir(parents=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill_disk(filler: Path, keep_free: int = 0) -> Path:
    """Write ``filler`` until the disk is full, then give back ``keep_free`` bytes; returns the filler."""
    try:
        with open(filler, "wb", buffering=0) as file:
            while True:
                file.write(b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    os.truncate(filler, max(filler.stat().st_size - keep_free, 0))
    return filler


def wait_for_log(broker: BrokerProcess, text: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in broker.log_path.read_text():
        assert time.monotonic() < deadline, f"no {text!r} in the broker log after {timeout:.0f} s\n{broker.log_tail()}"
        time.sleep(0.05)


def test_full_disk_answers_kafka_storage_error_and_recovers_when_space_returns(tmp_path, small_disk):
    Producer = pytest.importorskip("confluent_kafka", reason="needs confluent-kafka for the stock-client part").Producer
    broker = BrokerProcess(tmp_path / "full")
    assert broker.data_dir == small_disk
    with broker:
        topic = "disk"
        create_topic(broker, topic, 2)
        acked = {}
        for number in range(20):
            value = b"before-%d-" % number + b"x" * 1000
            response = produce_one(broker, topic, 0, value)
            assert response.error_code == ErrorCode.none
            acked[response.base_offset] = value

        fillers = [fill_disk(small_disk / "filler.bin", keep_free=64 * 1024)]
        # A batch larger than the space left: the write fails part-way and is cut off again.
        big = produce_one(broker, topic, 0, os.urandom(400 * 1024))
        assert big.error_code == ErrorCode.kafka_storage_error
        assert list_offset(broker.address, topic, 0, -1) == 20
        # The cut gave the space back: a small batch still fits, at the next offset.
        small = produce_one(broker, topic, 0, b"small-after-cut")
        assert (small.error_code, small.base_offset) == (ErrorCode.none, 20)
        acked[20] = b"small-after-cut"

        fillers.append(fill_disk(small_disk / "filler2.bin"))
        refused = [produce_one(broker, topic, 0, b"refused-%d" % n + b"y" * 8192) for n in range(3)]
        assert [r.error_code for r in refused] == [ErrorCode.kafka_storage_error] * 3
        # The background flush and checkpoint writes meet the full disk too, and keep going.
        wait_for_log(broker, "log upkeep in")
        assert broker.is_running()
        log = broker.log_path.read_text()
        # One WARN per failing episode (the cut batch, then the full disk), not one per refused request.
        assert log.count(f"append to {topic}-0 failed") == 2, log
        assert log.count("appends succeed again") == 1, log  # after the cut batch

        # A stock client (librdkafka) treats the answer as retriable: it keeps the message and retries,
        # instead of reconnecting to a "down" broker, and delivers it once space is back.
        delivered = []
        producer = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 60000,
                             "retry.backoff.ms": 100, "enable.idempotence": False})
        producer.produce(topic, b"from librdkafka", partition=1,
                         on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
        deadline = time.monotonic() + 30
        while f"{topic}-1: append refused with KAFKA_STORAGE_ERROR" not in broker.log_path.read_text():  # DEBUG
            assert time.monotonic() < deadline, f"librdkafka's produce was not refused\n{broker.log_tail()}"
            producer.poll(0.05)
        assert delivered == []

        for filler in fillers:
            filler.unlink()
        assert producer.flush(30) == 0
        assert delivered == [(None, 0)]
        assert read_values(broker, topic, 1) == [(0, b"from librdkafka")]
        for number in range(5):
            value = b"after-%d-" % number + os.urandom(200 * 1024)
            response = produce_one(broker, topic, 0, value)
            assert response.error_code == ErrorCode.none
            acked[response.base_offset] = value
        assert broker.log_path.read_text().count("appends succeed again") == 2
        wait_for_log(broker, "works again")  # flushes and checkpoints resumed
        assert read_values(broker, topic, 0) == sorted(acked.items())

        broker.kill()
        broker.start()
        assert read_values(broker, topic, 0) == sorted(acked.items())

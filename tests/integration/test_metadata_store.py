"""The metadata store and the topic lifecycle, against a real broker process.

- creating thousands of topics never stalls other clients (the journal is fsynced off the event loop);
- logs carry Kafka's partition.metadata, and logs of unknown topics are set aside (``-stray``), never adopted;
- an older data dir (``__cluster_metadata.json``) is converted, keeping its topics and data;
- garbage in any data-dir file stops the start with one line naming it; a torn journal tail is recovered;
- Kafka's rules on topic-name collisions, ``cleanup.policy`` values and
  partition limits.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import re
import subprocess
import threading
import time
import uuid

import pytest
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.create_partitions.v3 import request as cp
from kio.schema.create_topics.v7 import request as ct
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.metadata.v12 import request as md
from kio.static.primitive import i8

from broker_process import REPO_ROOT, BrokerProcess, list_offset, produce_raw, send_request
from pykbroker.protocol.records import build_batch

TIMEOUT = datetime.timedelta(seconds=60)
SNAPSHOT = "__cluster_metadata.snapshot"
JOURNAL = "__cluster_metadata.log"


def create_many(address, names, partitions=1, configs=()):
    request = ct.CreateTopicsRequest(
        topics=tuple(
            ct.CreatableTopic(
                name=name, num_partitions=partitions, replication_factor=-1, assignments=(),
                configs=tuple(ct.CreatableTopicConfig(name=k, value=v) for k, v in configs))
            for name in names),
        timeout=TIMEOUT, validate_only=False)
    return send_request(address, request, timeout=120).topics


def create(address, name, partitions=1, configs=()):
    return create_many(address, [name], partitions, configs)[0]


def add_partitions(address, name, total):
    request = cp.CreatePartitionsRequest(
        topics=(cp.CreatePartitionsTopic(name=name, count=total, assignments=None),), timeout=TIMEOUT, validate_only=False)
    return send_request(address, request).results[0]


def metadata(address, *names, auto_create=False):
    topics = tuple(md.MetadataRequestTopic(topic_id=None, name=n) for n in names) if names else None
    return send_request(address, md.MetadataRequest(
        topics=topics, allow_auto_topic_creation=auto_create, include_topic_authorized_operations=False)).topics


def produce(address, topic, count):
    for i in range(count):
        assert produce_raw(address, topic, 0, build_batch([(None, b"v%d" % i)])).error_code == ErrorCode.none


_PROGRESS_RECORD = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ (INFO|DEBUG) ")


def refused_start(broker: BrokerProcess) -> tuple[int, list[str]]:
    """Start the broker in the foreground; it must exit by itself: (exit code, non-empty output lines other
    than INFO/DEBUG log records, e.g. the open-file limit it raised before loading)."""
    result = subprocess.run(broker.command(), capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, stdin=subprocess.DEVNULL)
    lines = [line for line in (result.stdout + result.stderr).splitlines()
             if line.strip() and not _PROGRESS_RECORD.match(line)]
    return result.returncode, lines


@pytest.fixture
def stopped_broker(tmp_path):
    """A broker that ran once (one topic 't' with 3 records) and is stopped: its data dir is ours to damage."""
    broker = BrokerProcess(tmp_path / "b")
    with broker:
        assert create(broker.address, "t").error_code == ErrorCode.none
        produce(broker.address, "t", 3)
        broker.stop()
        yield broker


# -- the event loop is never blocked by metadata changes ---------------------------------------------


def test_creating_2000_topics_in_batches_never_stalls_api_versions(broker):
    latencies: list[float] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def probe():
        while not done.is_set():
            started = time.monotonic()
            try:
                send_request(broker.address, ApiVersionsRequest(), timeout=10)
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)
            latencies.append(time.monotonic() - started)
            done.wait(0.5)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        for batch in range(20):
            names = [f"many-{batch}-{i}" for i in range(100)]
            results = create_many(broker.address, names)
            assert [r.error_code for r in results] == [ErrorCode.none] * 100
    finally:
        done.set()
        prober.join(15)
    assert not failures, failures[:3]
    assert len(latencies) >= 2
    assert max(latencies) < 2.0, f"slowest ApiVersions {max(latencies):.2f} s over {len(latencies)} probes"
    assert sum(1 for t in metadata(broker.address) if t.name.startswith("many-")) == 2000
    # The store survives a restart with every topic, from the journal and its snapshot.
    broker.restart()
    assert sum(1 for t in metadata(broker.address) if t.name.startswith("many-")) == 2000


def test_other_clients_are_served_while_the_first_find_coordinator_creates_the_offsets_topic(broker_factory):
    """__consumer_offsets is created on first use: its partitions are hosted one at a time, so ApiVersions
    on another connection is answered while the creation is half done (the old code held the event loop
    for the whole topic: a probe saw either none or all of its partitions), and FindCoordinator answers
    once every partition is there."""
    partitions = 400
    broker = broker_factory(config={"offsets.topic.num.partitions": partitions})
    answers: list = []

    def offsets_dirs() -> int:
        return sum(1 for p in broker.data_dir.iterdir() if p.name.startswith("__consumer_offsets-"))

    asking = threading.Thread(target=lambda: answers.append(send_request(
        broker.address, FindCoordinatorRequest(key_type=i8(0), coordinator_keys=("first-group",)), timeout=60)))
    asking.start()
    seen_mid_creation = []
    deadline = time.monotonic() + 60
    while asking.is_alive() and time.monotonic() < deadline:
        send_request(broker.address, ApiVersionsRequest(), timeout=10)
        if 0 < offsets_dirs() < partitions:
            seen_mid_creation.append(offsets_dirs())
    asking.join(5)
    assert answers and answers[0].coordinators[0].error_code == ErrorCode.none
    assert offsets_dirs() == partitions
    assert seen_mid_creation, "no ApiVersions was answered while __consumer_offsets was being created"


# -- partition.metadata and logs of unknown topics ---------------------------------------------------------


def test_partition_metadata_is_written_in_kafkas_format(broker):
    result = create(broker.address, "pm", partitions=2)
    expected = base64.urlsafe_b64encode(uuid.UUID(str(result.topic_id)).bytes).decode().rstrip("=")
    for partition in (0, 1):
        text = (broker.data_dir / f"pm-{partition}" / "partition.metadata").read_text()
        assert text == f"version: 0\ntopic_id: {expected}\n"


def test_metadata_deleted_logs_are_set_aside_and_a_recreated_topic_is_empty(stopped_broker):
    broker = stopped_broker
    (broker.data_dir / SNAPSHOT).unlink(missing_ok=True)
    (broker.data_dir / JOURNAL).unlink()
    broker.start()
    assert metadata(broker.address, "t")[0].error_code == ErrorCode.unknown_topic_or_partition
    strays = [p.name for p in broker.data_dir.iterdir() if p.name.startswith("t-0.") and p.name.endswith("-stray")]
    assert len(strays) == 1, sorted(p.name for p in broker.data_dir.iterdir())
    log = broker.log_path.read_text()
    assert "WARNING" in log and strays[0] in log and "t-0" in log
    assert create(broker.address, "t").error_code == ErrorCode.none
    assert list_offset(broker.address, "t", 0, -1) == 0  # empty, not the old log
    assert any((broker.data_dir / strays[0]).glob("*.log"))  # the old data stays on disk for the operator


def test_a_log_of_another_topic_id_is_set_aside(stopped_broker):
    broker = stopped_broker
    (broker.data_dir / "t-0" / "partition.metadata").write_text(
        "version: 0\ntopic_id: " + base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=") + "\n")
    broker.start()
    assert list_offset(broker.address, "t", 0, -1) == 0
    assert "not the topic's" in broker.log_path.read_text()


def test_an_empty_partition_metadata_is_rewritten_and_the_log_served(stopped_broker):
    """A power loss while an older pykbroker wrote the file in place leaves it empty: adopt, rewrite, WARN."""
    broker = stopped_broker
    path = broker.data_dir / "t-0" / "partition.metadata"
    written = path.read_text()
    os.truncate(path, 0)
    broker.start()
    assert list_offset(broker.address, "t", 0, -1) == 3
    assert produce_raw(broker.address, "t", 0, build_batch([(None, b"after")])).base_offset == 3
    assert path.read_text() == written
    assert "partition.metadata is empty" in broker.log_path.read_text()

def test_an_older_data_dir_is_converted_keeping_topics_data_and_compacted_topics(stopped_broker):
    broker = stopped_broker
    from pykbroker.cluster.metadata import EmbeddedMetadata

    store = EmbeddedMetadata(broker.data_dir, 1, "127.0.0.1", broker.port)
    topics = [info.to_json() for info in store.topics()]
    store.close()
    topics[0]["configs"] = {"cleanup.policy": "compact"}  # accepted by older versions: keep its data
    (broker.data_dir / "__cluster_metadata.json").write_text(json.dumps({"version": 1, "topics": topics}, indent=1))
    (broker.data_dir / SNAPSHOT).unlink(missing_ok=True)
    (broker.data_dir / JOURNAL).unlink()
    (broker.data_dir / "t-0" / "partition.metadata").unlink()  # older versions did not write it
    broker.start()
    assert list_offset(broker.address, "t", 0, -1) == 3
    assert not (broker.data_dir / "__cluster_metadata.json").exists()
    assert (broker.data_dir / "t-0" / "partition.metadata").read_text().startswith("version: 0\ntopic_id: ")
    assert "converted" in broker.log_path.read_text()


# -- damaged files ----------------------------------------------------------------------------------


GARBAGE = {
    "meta.properties": b"\x00\x17garbage\xff",
    SNAPSHOT: b"{not json",
    JOURNAL: b"this is not a record\n",
    "recovery-point-offset-checkpoint": b"0\n2\nt 0 x\n",
    "replication-offset-checkpoint": b"0\n1\nt 0 three\n",
    "log-start-offset-checkpoint": b"zero\n",
    "producer-id-block": b"0\n1\n1000 5\n",
    "t-0/partition.metadata": b"version: 7\n",
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_a_garbage_file_stops_the_start_with_one_line_naming_it(stopped_broker, name):
    broker = stopped_broker
    if name == SNAPSHOT:  # make sure there is one: force the journal into a snapshot
        (broker.data_dir / SNAPSHOT).write_text(json.dumps({"version": 1, "topics": []}))
    (broker.data_dir / name).write_bytes(GARBAGE[name])
    code, lines = refused_start(broker)
    assert code != 0
    assert len(lines) == 1, lines
    assert str(broker.data_dir / name) in lines[0]
    assert "Traceback" not in lines[0]


def test_a_clean_shutdown_checkpoints_the_high_water_marks(stopped_broker):
    assert (stopped_broker.data_dir / "replication-offset-checkpoint").read_text() == "0\n1\nt 0 3\n"


def test_a_torn_journal_tail_is_cut_and_the_broker_starts(stopped_broker):
    broker = stopped_broker
    with open(broker.data_dir / JOURNAL, "ab") as journal:
        journal.write(b'0badc0de {"op":"topic","topic":{"name":"half')
    broker.start()
    assert list_offset(broker.address, "t", 0, -1) == 3
    assert "torn" in broker.log_path.read_text()


def test_an_unknown_log_cleanup_policy_stops_the_start(tmp_path):
    broker = BrokerProcess(tmp_path / "b", config={"log.cleanup.policy": "archive"})
    code, lines = refused_start(broker)
    assert code != 0 and len(lines) == 1, lines
    assert "log.cleanup.policy" in lines[0] and "compact" in lines[0]


# -- Kafka's topic rules ----------------------------------------------------------------------------


def test_topic_names_colliding_on_dot_and_underscore_are_refused(broker):
    assert create(broker.address, "a.b").error_code == ErrorCode.none
    refused = create(broker.address, "a_b")
    assert refused.error_code == ErrorCode.invalid_topic_exception
    assert refused.error_message == "Topic 'a_b' collides with existing topics: a.b"
    assert metadata(broker.address, "a_b", auto_create=True)[0].error_code == ErrorCode.invalid_topic_exception
    assert metadata(broker.address, "a_b")[0].error_code == ErrorCode.unknown_topic_or_partition


def test_an_unknown_cleanup_policy_is_refused_naming_the_key(broker):
    refused = create(broker.address, "compacted", configs=[("cleanup.policy", "compact,archive")])
    assert refused.error_code == ErrorCode.invalid_config
    assert "cleanup.policy" in refused.error_message and "compact" in refused.error_message
    assert metadata(broker.address, "compacted")[0].error_code == ErrorCode.unknown_topic_or_partition
    assert create(broker.address, "compacted", configs=[("cleanup.policy", "compact")]).error_code == ErrorCode.none


def test_more_than_10000_partitions_in_one_request_are_refused_whole(broker):
    results = create_many(broker.address, ["big-a", "big-b"], partitions=5001)
    assert [r.error_code for r in results] == [ErrorCode.policy_violation] * 2
    assert results[0].error_message == "Excessively large number of partitions per request."


def test_max_broker_partitions_bounds_create_topics_and_create_partitions(broker_factory):
    broker = broker_factory(config={"max.broker.partitions": 10})
    assert create(broker.address, "fits", partitions=8).error_code == ErrorCode.none
    refused = create(broker.address, "too-many", partitions=3)
    assert refused.error_code == ErrorCode.policy_violation and "max.broker.partitions=10" in refused.error_message
    grown = add_partitions(broker.address, "fits", 11)
    assert grown.error_code == ErrorCode.policy_violation and "max.broker.partitions" in grown.error_message
    assert add_partitions(broker.address, "fits", 10).error_code == ErrorCode.none


# -- CreateTopics whose client leaves, or whose storage fails, part-way (in process) ----------------------


def in_process_broker(path):
    from pykbroker.config import BrokerConfig
    from pykbroker.server.broker import Broker

    broker = Broker(BrokerConfig(data_dir=path, port=0))
    broker.load()
    return broker


def call_create_topics(broker, topics):
    """The CreateTopics v7 handler's coroutine, as the connection would run it."""
    import types

    from pykbroker.protocol.apis import codec_for
    from pykbroker.server.dispatch import RequestContext
    from pykbroker.server.handlers.topics_admin import create_topics

    request = ct.CreateTopicsRequest(
        topics=tuple(ct.CreatableTopic(name=name, num_partitions=count, replication_factor=-1, assignments=(),
                                       configs=()) for name, count in topics),
        timeout=TIMEOUT, validate_only=False)
    envelope = types.SimpleNamespace(api_key=19, api_version=7, body=request, codec=codec_for(19, 7))
    return create_topics(RequestContext(broker, envelope, "peer"), request)


def test_create_topics_cancelled_part_way_still_hosts_and_commits_every_partition(tmp_path):
    """The reviewer's repro: the client disconnects while 50 partitions are being hosted."""
    import asyncio

    async def scenario():
        broker = in_process_broker(tmp_path)
        handler = asyncio.ensure_future(call_create_topics(broker, [("t", 50)]))
        for _ in range(1000):  # until hosting is under way, bounded
            if broker.replicas.partition("t", 0) is not None:
                break
            await asyncio.sleep(0)
        hosted = sum(1 for i in range(50) if broker.replicas.partition("t", i) is not None)
        assert 0 < hosted < 50
        handler.cancel()  # connection_lost cancels the handler task
        with pytest.raises(asyncio.CancelledError):
            await handler
        await broker.stop()  # waits for the broker-owned creation
        assert sum(1 for i in range(50) if broker.replicas.partition("t", i) is not None) == 50

    asyncio.run(scenario())
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("t-")) == sorted(f"t-{i}" for i in range(50))
    broker = in_process_broker(tmp_path)  # durable: the restart knows all 50 and sets none aside
    assert len(broker.metadata.topic("t").partitions) == 50
    assert all(broker.replicas.partition("t", i) is not None for i in range(50))
    assert not any(p.name.endswith("-stray") for p in tmp_path.iterdir())
    asyncio.run(broker.stop())


def test_a_storage_error_while_hosting_fails_only_that_topic(tmp_path):
    import asyncio

    async def scenario():
        broker = in_process_broker(tmp_path)
        real_create = broker.log_manager.create

        def create(topic, partition, *args, **kwargs):
            if topic == "full":
                raise OSError(28, "No space left on device")
            return real_create(topic, partition, *args, **kwargs)

        broker.log_manager.create = create
        response = await call_create_topics(broker, [("before", 2), ("full", 3), ("after", 1)])
        await broker.stop()
        return {t.name: (t.error_code, t.error_message, t.num_partitions) for t in response.topics}

    results = asyncio.run(scenario())
    assert results["before"] == (ErrorCode.none, None, 2)
    assert results["after"] == (ErrorCode.none, None, 1)
    code, message, partitions = results["full"]
    assert code == ErrorCode.kafka_storage_error and partitions == -1
    assert message.startswith("Error while creating log for full-0") and "No space left on device" in message


class JournalDiskFull:
    """The ``os`` module as the metadata journal sees it, with a full disk (other writers are unaffected)."""

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def write(fd, data):
        raise OSError(28, "No space left on device")


def test_a_failed_journal_write_answers_kafka_storage_error_for_the_changed_topics(tmp_path, monkeypatch):
    import asyncio

    from pykbroker.cluster import metadata_log

    async def scenario():
        broker = in_process_broker(tmp_path)
        monkeypatch.setattr(metadata_log, "os", JournalDiskFull())
        response = await call_create_topics(broker, [("new", 1), ("new", 1)])
        monkeypatch.undo()  # space returns: the stop's final attempt makes it durable
        await broker.stop()
        return [(t.error_code, t.error_message) for t in response.topics]

    (created, duplicate) = asyncio.run(scenario())
    assert created[0] == ErrorCode.kafka_storage_error and "not durable" in created[1]
    assert duplicate[0] == ErrorCode.invalid_request
    broker = in_process_broker(tmp_path)
    assert broker.metadata.topic("new") is not None
    asyncio.run(broker.stop())

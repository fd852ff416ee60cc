"""Mutated frames of every advertised API and version against a real broker subprocess.

The broker may answer a frame, or close that connection (a frame it cannot parse, or for now a handler
that fails on a decoded null): both are fine. It must not die, must keep answering ApiVersions, must keep
its memory bounded, and the records produced before the fuzzing must read back byte for byte.

Bounded: at most FRAMES frames or SECONDS of sending, whichever comes first (PYKBROKER_FUZZ_FRAMES /
PYKBROKER_FUZZ_SECONDS override them). Seeded: the seed is printed; PYKBROKER_FUZZ_SEED replays it, and
`integration/fuzz/run_fuzz.py --seed S --start A --frames N` replays a window on its own broker.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

from broker_process import BrokerProcess, fetch_raw, probe_api_versions, produce_raw, send_request
from integration.fuzz.frames import corpus, read_rss_bytes, send_frames
from pykbroker.protocol.records import build_batch

FRAMES = int(os.environ.get("PYKBROKER_FUZZ_FRAMES", 8000))
SECONDS = float(os.environ.get("PYKBROKER_FUZZ_SECONDS", 35))
CHUNK = 250  # frames between health checks
RSS_LIMIT = 512 * 1024 * 1024
CHECK_TOPIC = "guard-fuzz-check"  # generated topic names start with "fz-", so fuzzing never touches it


@pytest.mark.timeout(180)
def test_broker_survives_mutated_frames_of_every_api(tmp_path, fuzz_seed):
    frames = corpus()
    with BrokerProcess(tmp_path / "broker") as broker:
        batches = [build_batch([(f"k{i}".encode(), f"value {i}".encode() * 20) for i in range(n, n + 5)])
                   for n in range(0, 50, 5)]
        _create_topic(broker.address, CHECK_TOPIC)
        for batch in batches:
            answer = produce_raw(broker.address, CHECK_TOPIC, 0, batch)
            assert answer.error_code == 0, answer
        before = fetch_raw(broker.address, CHECK_TOPIC, 0)
        assert before.count(b"value 49") == 20

        pid = broker.process.pid
        peak_rss = read_rss_bytes(pid)
        deadline = time.monotonic() + SECONDS
        sent = 0
        for start in range(0, FRAMES, CHUNK):
            if time.monotonic() > deadline:
                break
            window = range(start, min(start + CHUNK, FRAMES))
            stats = asyncio.run(send_frames(broker.address, frames, fuzz_seed, window))
            assert broker.is_running(), (
                f"broker died (exit {broker.process.returncode}) within frames {window.start}-{window.stop - 1} "
                f"of seed {fuzz_seed}\n{broker.log_tail()}")
            assert stats.connect_errors == 0, f"connections refused within frames {window}: {stats}"
            peak_rss = max(peak_rss, read_rss_bytes(pid))
            assert peak_rss < RSS_LIMIT, f"broker RSS {peak_rss >> 20} MB after frames up to {window.stop}"
            sent = window.stop
        print(f"seed {fuzz_seed}: {sent} frames, peak RSS {peak_rss >> 20} MB")

        assert sent >= min(FRAMES, 1000), f"only {sent} frames sent in {SECONDS:.0f} s"
        probe_api_versions(broker.address, timeout=10.0)
        assert fetch_raw(broker.address, CHECK_TOPIC, 0) == before


def _create_topic(address, name: str, timeout: float = 30.0) -> None:
    """Auto-create through Metadata, as a client would, and wait until partition 0 has a leader."""
    request = MetadataRequest(topics=(MetadataRequestTopic(topic_id=None, name=name),),
                              allow_auto_topic_creation=True, include_topic_authorized_operations=False)
    deadline = time.monotonic() + timeout
    while True:
        (topic,) = send_request(address, request).topics
        if topic.error_code == 0 and topic.partitions and topic.partitions[0].leader_id >= 0:
            return
        assert time.monotonic() < deadline, f"topic {name} not created: {topic}"
        time.sleep(0.1)

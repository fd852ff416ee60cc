"""The pipeline's jobs on a Spark standalone cluster (a master and two workers from pyspark's distribution)
reading a 3-broker pykbroker cluster (ZooKeeper mode, RF 3, min ISR 2), submitted with spark-submit exactly
as integration/spark/README.md shows, unchanged but for --master and --bootstrap.

Skipped with the reason where pyspark, Java, the connector jars or ZooKeeper are absent.
"""

from __future__ import annotations

import time
from pathlib import Path

from spark_guard import require_connector

require_connector()

import pytest  # noqa: E402

from city_pipeline.events import make_events  # noqa: E402
from city_pipeline.producer import produce_events  # noqa: E402
from pipeline_expect import MINUTE_MS, as_counter, counts_by_window, expected_counts  # noqa: E402

pytestmark = pytest.mark.timeout(480)

SPARK_PIPELINE_DIR = Path(__file__).resolve().parents[2] / "integration" / "spark"
PARTITIONS = 3
JOB_TIMEOUT_S = 240.0


def recent_minute_ms(minutes_ago: int) -> int:
    """A whole minute in the recent past: event times the brokers' retention (7 days) keeps."""
    now = int(time.time() * 1000)
    return now - now % MINUTE_MS - minutes_ago * MINUTE_MS


def test_replay_job_on_the_cluster_recounts_the_replicated_topic(spark, spark_standalone, pykbroker_cluster,
                                                                 unique_name, tmp_path):
    pykbroker_cluster.create_topic(unique_name, PARTITIONS, 3, {"min.insync.replicas": "2"})
    events = make_events(400, start_ms=recent_minute_ms(90), step_ms=1_000, seed=21, max_lateness_ms=10_000)
    deliveries = produce_events(pykbroker_cluster.bootstrap, unique_name, events)
    assert {d.partition for d in deliveries} == set(range(PARTITIONS))

    output = tmp_path / "replay"
    log = spark_standalone.submit(SPARK_PIPELINE_DIR / "replay_job.py", "--bootstrap", pykbroker_cluster.bootstrap,
                                  "--topic", unique_name, "--output", str(output), log=tmp_path / "replay.log",
                                  timeout=JOB_TIMEOUT_S)
    assert f"wrote {len(expected_counts(events, MINUTE_MS))} window counts" in log
    assert as_counter(counts_by_window(spark.read.parquet(str(output)))) == expected_counts(events, MINUTE_MS)
    # the driver ran on the cluster: the master lists the application as finished
    assert any(app["name"] == "city-counts-replay" for app in spark_standalone.status()["completedapps"])

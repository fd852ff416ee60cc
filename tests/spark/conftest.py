"""Fixtures for the Spark pipeline tests (integration/spark).

Three tiers, so that CI always runs what it can:
  * pure Python (event format, replay options, connector-jar checks, generator against a real broker):
    always run;
  * the pipeline's DataFrame logic on a local SparkSession: needs pyspark and Java. Missing either is a
    skip on a developer machine and a failure under CI (env CI set), where the install script provides both;
  * the stock Kafka connector against pykbroker: needs $PYKBROKER_SPARK_JARS (default: the reference
    kit's ../shared/refkit/spark-jars beside the project, when it exists), a directory holding
    spark-sql-kafka-0-10, spark-token-provider-kafka-0-10, kafka-clients and commons-pool2 jars whose
    Spark version matches the installed pyspark. Otherwise those tests skip with the reason, which is
    also printed at the end of the run.

One SparkSession serves the whole test session (local[2], 2 shuffle partitions, no UI): starting a JVM
costs seconds, and the connector jars, when present, go on its classpath from the start.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SPARK_PIPELINE_DIR = REPO_ROOT / "integration" / "spark"
INTEGRATION_TESTS_DIR = REPO_ROOT / "tests" / "integration"
for _path in (SPARK_PIPELINE_DIR, INTEGRATION_TESTS_DIR):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from broker_process import BrokerProcess  # noqa: E402  (tests/integration: the broker subprocess harness)
from city_pipeline.session import build_session  # noqa: E402
from spark_guard import (  # noqa: E402
    connector_jars_dir, connector_missing_reason, require_spark, skipped_connector_reasons,
)

SPARK_TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def pytest_terminal_summary(terminalreporter):
    for reason in skipped_connector_reasons:
        terminalreporter.write_line(f"Spark Kafka connector tests skipped: {reason}", yellow=True)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """The test session's SparkSession; with the connector jars on its classpath when they are usable."""
    require_spark()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = dict(SPARK_TEST_CONF)
    conf["spark.sql.warehouse.dir"] = str(tmp_path_factory.mktemp("spark-warehouse"))
    conf["spark.local.dir"] = str(tmp_path_factory.mktemp("spark-local"))
    jars_dir = connector_jars_dir() if connector_missing_reason() is None else None
    session = build_session("pykbroker-spark-tests", master="local[2]", jars_dir=jars_dir, conf=conf,
                            log_level="ERROR")
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture
def unique_name(request) -> str:
    """A topic (or directory) name unique to the test: Kafka-legal and readable in broker logs."""
    base = re.sub(r"[^a-zA-Z0-9._-]+", "-", request.node.name).strip("-")[:50]
    return f"{base}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory):
    """A pykbroker subprocess shared by a module's tests (each test uses its own topics)."""
    broker = BrokerProcess(tmp_path_factory.mktemp("spark-broker"))
    with broker:
        yield broker


class BrokerMaker:
    """make_broker(config=None) -> a started broker of the test's own (for restarts and broker configs)."""

    def __init__(self, root: Path):
        self.root = root
        self.brokers: list[BrokerProcess] = []

    def __call__(self, config: dict | None = None) -> BrokerProcess:
        broker = BrokerProcess(self.root / f"broker{len(self.brokers)}", config=config)
        self.brokers.append(broker)
        return broker.start()

    def close(self) -> None:
        for broker in self.brokers:
            broker.close()


@pytest.fixture
def make_broker(tmp_path):
    maker = BrokerMaker(tmp_path)
    yield maker
    maker.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the tail of each broker log a failing test used (as tests/integration does)."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        brokers = []
        for value in getattr(item, "funcargs", {}).values():
            brokers += value.brokers if isinstance(value, BrokerMaker) else [value]
        for broker in dict.fromkeys(b for b in brokers if isinstance(b, BrokerProcess)):
            report.sections.append((f"broker log {broker.bootstrap} ({report.when})", broker.log_tail()))

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
    # The kafka sink's producers wait in Spark's pool for 10 minutes idle by default, reconnecting to brokers of
    # tests that are over (their warnings then land in whichever test runs next): close them sooner.
    "spark.kafka.producer.cache.timeout": "20s",
    "spark.kafka.producer.cache.evictorThreadRunInterval": "10s",
}


def pytest_terminal_summary(terminalreporter):
    for reason in skipped_connector_reasons:
        terminalreporter.write_line(f"Spark Kafka connector tests skipped: {reason}", yellow=True)
    # what a fault run measured (record_property("spark fault run", ...)), passing or not
    for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        for name, value in getattr(report, "user_properties", ()):
            if name == "spark fault run" and report.when == "call":
                terminalreporter.write_line(f"{report.nodeid.rsplit('::', 1)[-1]}: {value}")


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
        # the Spark standalone cluster's and the pykbroker cluster's logs (spark_standalone, pykbroker_cluster)
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, (SparkStandaloneCluster, BrokerCluster)):
                report.sections.extend(value.failure_sections())


# -- a Spark standalone cluster reading a 3-broker pykbroker cluster (tests/spark/spark_cluster.py) ------------

CLUSTER_TESTS_DIR = REPO_ROOT / "tests" / "cluster"
if str(CLUSTER_TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(CLUSTER_TESTS_DIR))

from broker_cluster import BrokerCluster  # noqa: E402  (tests/cluster: N pykbroker brokers on one ZooKeeper)
from spark_cluster import SparkStandaloneCluster, cluster_missing_reason  # noqa: E402

# The replicated cluster the Spark cluster tests read: RF 3 and min ISR 2 for every topic (acks=all writes
# survive one broker down), 6 s ZooKeeper sessions (a SIGKILLed leader is replaced within seconds), small
# internal topics (the transaction and offset logs' 50 partitions would cost minutes of elections here).
SPARK_BROKER_CLUSTER_OVERRIDES = {
    "zookeeper.session.timeout.ms": 6000,
    "default.replication.factor": 3,
    "min.insync.replicas": 2,
    "offsets.topic.replication.factor": 3,
    "offsets.topic.num.partitions": 3,
    "transaction.state.log.replication.factor": 3,
    "transaction.state.log.min.isr": 2,
    "transaction.state.log.num.partitions": 3,
    "replica.lag.time.max.ms": 10000,
    "replica.fetch.wait.max.ms": 500,
    "group.initial.rebalance.delay.ms": 0,
}


def _require_standalone() -> None:
    reason = cluster_missing_reason()
    if reason:
        if reason not in skipped_connector_reasons:
            skipped_connector_reasons.append(reason)
        pytest.skip(f"Spark standalone cluster tests skipped: {reason}")


@pytest.fixture(scope="module")
def spark_standalone(tmp_path_factory):
    """A Spark standalone master and two workers (1 core, small memory each) on 127.0.0.1, shared by a
    module's tests; skips with the reason where pyspark, Java or the connector jars are absent. Submit
    drivers with spark_standalone.submit()/launch() (spark-submit --master spark://..., connector jars)."""
    _require_standalone()
    with SparkStandaloneCluster(tmp_path_factory.mktemp("spark-standalone"), driver_conf=SPARK_TEST_CONF) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def spark_zookeeper(tmp_path_factory):
    """A real ZooKeeper (Debian's package) for the pykbroker clusters of the Spark tests; skip without it."""
    from pykbroker.cluster.zk_server import ZooKeeperServer, ZooKeeperUnavailable, find_install

    try:
        install = find_install()
    except ZooKeeperUnavailable as exc:
        pytest.skip(str(exc))
    with ZooKeeperServer(data_dir=tmp_path_factory.mktemp("spark-zookeeper"), install=install) as server:
        yield server


@pytest.fixture(scope="module")
def pykbroker_cluster(spark_zookeeper, tmp_path_factory, request):
    """Three pykbroker brokers in ZooKeeper mode (RF 3, min ISR 2 by default), shared by a module's tests;
    `.bootstrap` lists all three. Faults: .kill(id), .restart(id), .wait_for_leader(topic, p, exclude=...)."""
    chroot = f"/spark-{request.module.__name__.rsplit('.', 1)[-1][:40]}-{uuid.uuid4().hex[:8]}"
    cluster = BrokerCluster(spark_zookeeper.connect_string + chroot, tmp_path_factory.mktemp("pykbroker-cluster"),
                            n=3, overrides=SPARK_BROKER_CLUSTER_OVERRIDES)
    with cluster:
        yield cluster

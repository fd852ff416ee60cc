"""Whether the Spark tests can run here, and the module-level guards that skip (or fail) them.

Kept out of conftest.py so test modules can call the guards at import time, before they import pyspark.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from city_pipeline.cli import JARS_ENV
from city_pipeline.session import ConnectorJarsError, find_connector_jars

# Reasons the connector tests were skipped in this run, printed again at the end by conftest.py.
skipped_connector_reasons: list[str] = []

# The development workspace keeps the connector jars beside the project (never inside it).
REFKIT_SPARK_JARS = Path(__file__).resolve().parents[2].parent / "shared" / "refkit" / "spark-jars"


def connector_jars_dir() -> str | None:
    """$PYKBROKER_SPARK_JARS, else the reference kit's jars beside the project, else None."""
    jars_dir = os.environ.get(JARS_ENV)
    if jars_dir:
        return jars_dir
    return str(REFKIT_SPARK_JARS) if REFKIT_SPARK_JARS.is_dir() else None


def spark_missing_reason() -> str | None:
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed: pip install -r integration/spark/requirements.txt"
    java_home = os.environ.get("JAVA_HOME")
    if not shutil.which("java") and not (java_home and (Path(java_home) / "bin" / "java").exists()):
        return "no java on PATH or in JAVA_HOME (Spark 4 needs Java 17 or newer)"
    return None


def connector_missing_reason() -> str | None:
    """Why the Kafka connector tests cannot run here, or None when they can."""
    missing = spark_missing_reason()
    if missing:
        return missing
    jars_dir = connector_jars_dir()
    if not jars_dir:
        return (f"${JARS_ENV} is not set and {REFKIT_SPARK_JARS} does not exist: the Spark Kafka connector "
                "tests need a directory with the spark-sql-kafka-0-10, spark-token-provider-kafka-0-10, "
                "kafka-clients and commons-pool2 jars for this pyspark (see integration/spark/README.md)")
    try:
        find_connector_jars(jars_dir)
    except ConnectorJarsError as exc:
        return str(exc)
    return None


def require_connector() -> None:
    """Module-level guard for the connector tests: one clear skip reason when the jars are absent."""
    reason = connector_missing_reason()
    if reason:
        if reason not in skipped_connector_reasons:
            skipped_connector_reasons.append(reason)
        pytest.skip(f"Spark Kafka connector tests skipped: {reason}", allow_module_level=True)


def require_spark() -> None:
    """Module-level guard for tests that need pyspark and Java: a skip on a developer machine, a
    collection failure under CI (env CI set), where scripts/install-test-deps.sh provides both."""
    reason = spark_missing_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Spark pipeline tests, but {reason}", pytrace=False)
        pytest.skip(reason, allow_module_level=True)

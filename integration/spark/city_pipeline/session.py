"""A SparkSession with Spark's Kafka connector, from Maven (`--packages`) or from a directory of jars.

The connector (spark-sql-kafka-0-10) is not part of pyspark. With internet access Spark resolves it from
Maven: `spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:<Spark version>` (what
`spark-submit --packages` sets). Offline it takes four jars: the connector, spark-token-provider-kafka-0-10
(same version), kafka-clients and commons-pool2.

The connector's minor version must equal Spark's: a 4.0 connector on Spark 4.1 fails inside streaming
queries with NoSuchMethodError, long after the session started. So the jar directory is checked here,
before the JVM starts, and a mismatch is an error that names both versions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

SCALA_BINARY_VERSION = "2.13"  # the only Scala build of Spark 4
CONNECTOR_ARTIFACT = "spark-sql-kafka-0-10"
# Artifact name -> file-name pattern. Maven names a jar artifact-version.jar; Spark's Ivy cache
# (what --packages fills) prefixes the group: org.apache.spark_artifact-version.jar. Jars with a
# classifier (-sources, -tests, -javadoc) do not match.
_VERSION = r"-(\d+(?:\.\d+)+)\.jar$"
CONNECTOR_JARS = {
    CONNECTOR_ARTIFACT: re.compile(
        rf"^(?:org\.apache\.spark_)?spark-sql-kafka-0-10_{re.escape(SCALA_BINARY_VERSION)}{_VERSION}"),
    "spark-token-provider-kafka-0-10": re.compile(
        rf"^(?:org\.apache\.spark_)?spark-token-provider-kafka-0-10_{re.escape(SCALA_BINARY_VERSION)}{_VERSION}"),
    "kafka-clients": re.compile(rf"^(?:org\.apache\.kafka_)?kafka-clients{_VERSION}"),
    "commons-pool2": re.compile(rf"^(?:org\.apache\.commons_)?commons-pool2{_VERSION}"),
}
SPARK_VERSIONED = (CONNECTOR_ARTIFACT, "spark-token-provider-kafka-0-10")
# Maven's kafka-clients shades these; a kafka-clients built from source (unshaded) needs them beside it.
UNSHADED_CLIENT_DEPENDENCIES = (re.compile(r"^opentelemetry-proto-.*\.jar$"), re.compile(r"^protobuf-java-.*\.jar$"))
MIN_COMMONS_POOL2 = (2, 12)

DEFAULT_CONF = {
    # Windows and the counts' JSON timestamps in UTC, whatever the machine's zone.
    "spark.sql.session.timeZone": "UTC",
}


class ConnectorJarsError(ValueError):
    """The jar directory cannot provide a connector for this Spark; the message says what is wrong."""


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def spark_version() -> str:
    """The installed pyspark's version, which is the version of the Spark it starts."""
    import pyspark

    return pyspark.__version__


def connector_package(version: str | None = None) -> str:
    """The Maven coordinate of the connector that matches `version` (default: the installed pyspark)."""
    return f"org.apache.spark:{CONNECTOR_ARTIFACT}_{SCALA_BINARY_VERSION}:{version or spark_version()}"


def find_connector_jars(directory: str | Path, version: str | None = None) -> list[Path]:
    """The four jars in `directory` that make the Kafka connector work on Spark `version`, plus the
    opentelemetry-proto and protobuf-java jars an unshaded kafka-clients needs, when they are there.

    Raises ConnectorJarsError naming what is missing or mismatched. Where several versions of one jar
    are present, the newest that fits is taken.
    """
    version = version or spark_version()
    directory = Path(directory)
    if not directory.is_dir():
        raise ConnectorJarsError(f"{directory} is not a directory")
    wanted_minor = _version_tuple(version)[:2]
    found: dict[str, list[tuple[tuple[int, ...], Path]]] = {name: [] for name in CONNECTOR_JARS}
    for path in sorted(directory.iterdir()):
        for name, pattern in CONNECTOR_JARS.items():
            match = pattern.match(path.name)
            if match:
                found[name].append((_version_tuple(match.group(1)), path))

    problems, chosen = [], []
    for name, candidates in found.items():
        if not candidates:
            problems.append(f"no {name} jar")
            continue
        fitting = candidates
        if name in SPARK_VERSIONED:
            fitting = [c for c in candidates if c[0][:2] == wanted_minor]
            if not fitting:
                present = ", ".join(p.name for _, p in candidates)
                problems.append(f"{name} must be {wanted_minor[0]}.{wanted_minor[1]}.x to match Spark {version}, "
                                f"found {present}")
                continue
        elif name == "commons-pool2":
            fitting = [c for c in candidates if c[0][:2] >= MIN_COMMONS_POOL2]
            if not fitting:
                problems.append(f"commons-pool2 must be >= {'.'.join(map(str, MIN_COMMONS_POOL2))}, "
                                f"found {', '.join(p.name for _, p in candidates)}")
                continue
        chosen.append(max(fitting)[1])
    if problems:
        raise ConnectorJarsError(f"Kafka connector jars in {directory}: " + "; ".join(problems))
    extras = [p for p in sorted(directory.iterdir()) if any(r.match(p.name) for r in UNSHADED_CLIENT_DEPENDENCIES)]
    return chosen + extras


def build_session(app_name: str, *, master: str | None = None, jars_dir: str | Path | None = None,
                  packages: bool = False, conf: Mapping[str, str] | None = None, log_level: str = "WARN"):
    """Start (or return the running) SparkSession with the connector added the way the caller chose.

    jars_dir: a directory checked by find_connector_jars. packages: resolve the connector from Maven.
    Neither: the connector must already be on the classpath (spark-submit --packages/--jars), or only
    the non-Kafka parts of the pipeline will work. master: None keeps spark-submit's or pyspark's
    default (local[*] when nothing says otherwise).
    """
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    settings = dict(DEFAULT_CONF)
    if jars_dir:
        settings["spark.jars"] = ",".join(str(path) for path in find_connector_jars(jars_dir))
    if packages:
        settings["spark.jars.packages"] = connector_package()
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark

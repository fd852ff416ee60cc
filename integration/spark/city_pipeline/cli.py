"""Command-line pieces the scripts share: the broker address, where the connector comes from, triggers."""

from __future__ import annotations

import argparse
import os
import sys

JARS_ENV = "PYKBROKER_SPARK_JARS"


def add_bootstrap_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", default="127.0.0.1:9092",
                        help="kafka.bootstrap.servers: the pykbroker (or Kafka) address (default %(default)s)")


def add_connector_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "Kafka connector", "How Spark gets spark-sql-kafka-0-10. Without either option it must already be "
        "on the classpath, e.g. from spark-submit --packages.")
    group.add_argument("--packages", action="store_true",
                       help="resolve the connector matching this pyspark from Maven (needs internet)")
    group.add_argument("--jars", metavar="DIR", default=os.environ.get(JARS_ENV) or None,
                       help=f"a directory with spark-sql-kafka-0-10, spark-token-provider-kafka-0-10, "
                            f"kafka-clients and commons-pool2 jars (default: ${JARS_ENV})")
    group.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[*])")


def exit_for_missing_connector(prog: str, exc: Exception) -> int:
    """Exit status 2 with a hint when `exc` is Spark saying it has no Kafka connector; re-raise otherwise."""
    if "Failed to find data source: kafka" not in str(exc):
        raise exc
    from .session import connector_package

    print(f"{prog}: Spark has no Kafka connector on its classpath. Add --packages (needs internet), --jars DIR "
          f"(or ${JARS_ENV}), or run under spark-submit --packages {connector_package()}", file=sys.stderr)
    return 2


def session_from_args(app_name: str, args: argparse.Namespace):
    from .session import build_session

    return build_session(app_name, master=args.master, jars_dir=args.jars, packages=args.packages)


def trigger_kwargs(spec: str) -> dict:
    """A --trigger value as DataStreamWriter.trigger() arguments: 'available-now' processes what is in
    the topic when the query starts and stops; anything else is a processing-time interval ('10 seconds')."""
    spec = spec.strip()
    if spec.lower() in ("available-now", "availablenow", "available_now"):
        return {"availableNow": True}
    if not spec:
        raise ValueError("empty trigger")
    return {"processingTime": spec}

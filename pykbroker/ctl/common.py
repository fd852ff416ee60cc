"""What every client command shares: the connection options, exit codes, errors, and output.

Connection: ``-b/--brokers HOST:PORT[,...]`` or ``$PYKBROKER_BROKERS`` (default ``127.0.0.1:9092``),
``--timeout`` seconds for each request (an unreachable cluster fails within it), ``-X/--client-config
KEY=VALUE`` for any librdkafka setting. ``PYKBROKER_BROKERS`` is not a broker setting, so ``serve`` ignores
it (pykbroker.config reads only PYKBROKER_* variables that name a setting it knows).

Output: human-readable tables on stdout by default, ``--format json`` for scripts (one JSON document);
progress and warnings go to stderr, so stdout stays what the command answers.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import click

BROKERS_ENV = "PYKBROKER_BROKERS"
DEFAULT_BROKERS = "127.0.0.1:9092"
DEFAULT_TIMEOUT_S = 10.0
CLIENT_ID = "pykbroker-cli"

def brokers_option(*param_decls: str):
    """``-b/--brokers`` (or ``$PYKBROKER_BROKERS``): the bootstrap servers, for every client command and the console."""
    return click.option(*(param_decls or ("-b", "--brokers")), envvar=BROKERS_ENV, default=DEFAULT_BROKERS,
                        show_default=True, metavar="HOST:PORT[,...]",
                        help=f"Bootstrap servers of the cluster (any Kafka cluster).  [env {BROKERS_ENV}]")


# Exit codes (documented in pykbroker.ctl and the README).
EXIT_OK = 0
EXIT_KAFKA_ERROR = 1  # the cluster answered with an error (or refused the operation)
EXIT_USAGE = 2  # bad arguments (click's own code for usage errors)
EXIT_NOT_FOUND = 3  # the topic, partition or group named does not exist
EXIT_UNREACHABLE = 4  # no broker answered within --timeout
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_CODES_HELP = ("Exit codes: 0 ok; 1 the cluster answered with an error or refused; 2 bad arguments; "
                   "3 topic, partition or group not found; 4 no broker answered within --timeout; 130 Ctrl-C.")

# UNKNOWN_TOPIC_OR_PART, GROUP_ID_NOT_FOUND, UNKNOWN_TOPIC_ID; librdkafka's _UNKNOWN_TOPIC, _UNKNOWN_PARTITION, _NOENT
_NOT_FOUND_CODES = {3, 69, 100, -188, -190, -156}
_UNREACHABLE_CODES = {-195, -185, -187, -193}  # _TRANSPORT, _TIMED_OUT, _ALL_BROKERS_DOWN, _RESOLVE


class CtlError(click.ClickException):
    """A failure the command reports in one line on stderr, exiting with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_KAFKA_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def exit_code_for(error: Any) -> int:
    """The exit code for a confluent_kafka KafkaError (or its code)."""
    code = error if isinstance(error, int) else error.code()
    if code in _NOT_FOUND_CODES:
        return EXIT_NOT_FOUND
    if code in _UNREACHABLE_CODES:
        return EXIT_UNREACHABLE
    return EXIT_KAFKA_ERROR


def kafka_error(exc: BaseException, what: str) -> CtlError:
    """A CtlError for an exception out of confluent_kafka (KafkaException carries a KafkaError)."""
    from confluent_kafka import KafkaException

    if isinstance(exc, KafkaException) and exc.args:
        error = exc.args[0]
        if hasattr(error, "code"):
            return CtlError(f"{what}: {error_text(error)}", exit_code_for(error))
    if isinstance(exc, TimeoutError):  # concurrent.futures' timeout
        return CtlError(f"{what}: no answer within the timeout", EXIT_UNREACHABLE)
    return CtlError(f"{what}: {exc}", EXIT_KAFKA_ERROR)


def error_text(error: Any) -> str:
    """``NAME: message`` for a KafkaError, as Kafka's tools name errors."""
    name = error.name()
    message = error.str()
    return f"{name}: {message}" if message and message != name else name


def each_result(conn: "Connection", futures: dict[str, Any], what: str) -> list[tuple[str, Any]]:
    """Wait for per-resource AdminClient futures (topics, groups): (name, KafkaError or None) each."""
    from confluent_kafka import KafkaException

    results = []
    for name, future in futures.items():
        try:
            future.result(timeout=conn.timeout + 5)
            results.append((name, None))
        except KafkaException as exc:
            results.append((name, exc.args[0]))
        except Exception as exc:
            raise kafka_error(exc, what) from None
    return results


def report_each(conn: "Connection", results: list[tuple[str, Any]], kind: str, done: str, *,
                tolerate: str | None = None, tolerated: str = "") -> None:
    """One row per resource, {KIND, status, error}; an error whose name is ``tolerate`` (--if-exists and
    the like) is status ``tolerated`` instead. Errors also go to stderr; the exit code is the worst."""
    rows, worst = [], EXIT_OK
    for name, error in results:
        if error is None or error.name() == tolerate:
            rows.append({kind: name, "status": done if error is None else tolerated, "error": None})
            continue
        click.echo(f"Error: {name}: {error_text(error)}", err=True)
        worst = max(worst, exit_code_for(error))
        rows.append({kind: name, "status": error_text(error), "error": {"code": error.name(), "message": error.str()}})
    conn.emit(rows, lambda rows: table([kind, "status"], [[row[kind], row["status"]] for row in rows]))
    if worst:
        raise click.exceptions.Exit(worst)


# ---------------------------------------------------------------------------------------------------
# Connection.


@dataclass
class Connection:
    brokers: str
    timeout: float
    output: str  # "table" or "json"
    verbose: bool
    extra: dict[str, str] = field(default_factory=dict)
    _admin: Any = None

    def config(self, **settings: Any) -> dict[str, Any]:
        """librdkafka settings: bootstrap servers, timeouts, quiet logging, then -X settings."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.brokers,
            "client.id": CLIENT_ID,
            "socket.timeout.ms": int(self.timeout * 1000),
            "socket.connection.setup.timeout.ms": int(self.timeout * 1000),
            "logger": _librdkafka_logger(self.verbose),
        }
        config.update(settings)
        config.update(self.extra)
        return config

    @property
    def admin(self) -> Any:
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            # A topic named in a Metadata request is never created by it (the producer's default would).
            self._admin = self.client(AdminClient, **{"allow.auto.create.topics": False})
        return self._admin

    def client(self, kind: Callable[[dict[str, Any]], Any], **settings: Any) -> Any:
        """A Producer, Consumer or AdminClient with config(**settings); a setting librdkafka refuses (from
        -X, say) is a usage error."""
        from confluent_kafka import KafkaException

        try:
            return kind(self.config(**settings))
        except (KafkaException, ValueError, TypeError) as exc:
            error = exc.args[0] if exc.args else exc
            raise click.UsageError(f"client configuration refused: {getattr(error, 'str', lambda: error)()}") from None

    def call(self, future: Any, what: str) -> Any:
        """The result of an AdminClient future, or a CtlError naming ``what``."""
        try:
            return future.result(timeout=self.timeout + 5)
        except Exception as exc:
            raise kafka_error(exc, what) from None

    def cluster(self) -> Any:
        """DescribeCluster: brokers, controller, cluster id (also the reachability check)."""
        return self.call(self.admin.describe_cluster(request_timeout=self.timeout), "describing the cluster")

    def topic_metadata(self, topics: Sequence[str] | None = None) -> dict[str, Any]:
        """Metadata for these topics (all when None): name -> TopicMetadata; a topic that does not exist
        is a CtlError with EXIT_NOT_FOUND."""
        admin = self.admin
        try:
            if topics is None:
                return admin.list_topics(timeout=self.timeout).topics
            found = {}
            for name in topics:
                found.update(admin.list_topics(topic=name, timeout=self.timeout).topics)
        except Exception as exc:
            raise kafka_error(exc, "reading metadata") from None
        for name in topics:
            metadata = found.get(name)
            if metadata is None or metadata.error is not None:
                error = metadata.error if metadata is not None else None
                if error is None or exit_code_for(error) == EXIT_NOT_FOUND:
                    raise CtlError(f"topic {name!r} does not exist", EXIT_NOT_FOUND)
                raise CtlError(f"topic {name!r}: {error_text(error)}", exit_code_for(error))
        return found

    def emit(self, data: Any, render: Callable[[Any], None]) -> None:
        """Write ``data`` as JSON (--format json) or with ``render`` (tables)."""
        if self.output == "json":
            click.echo(json.dumps(data, indent=2, default=str))
        else:
            render(data)


_LIBRDKAFKA_LOGGER = "pykbroker.ctl.librdkafka"


def _librdkafka_logger(verbose: bool) -> logging.Logger:
    """librdkafka's log lines (connection failures and the like) go to stderr only with -v: without it
    the command's own one-line error says what went wrong."""
    logger = logging.getLogger(_LIBRDKAFKA_LOGGER)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("librdkafka %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO if verbose else logging.CRITICAL + 1)
    return logger


def parse_pairs(items: Iterable[str], what: str, *, allow_empty_value: bool = True) -> dict[str, str]:
    """KEY=VALUE items into a dict (a usage error names the bad one)."""
    parsed: dict[str, str] = {}
    for item in items:
        key, separator, value = item.partition("=")
        if not separator or not key.strip() or (not value and not allow_empty_value):
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint=what)
        parsed[key.strip()] = value
    return parsed


def connection_options(command: Callable[..., Any] | None = None, *, output_option: bool = True) -> Any:
    """The options every client command takes; the command receives a ``conn: Connection``. Without
    ``output_option`` the command defines its own ``--format`` (``consume``'s record formats)."""
    if command is None:
        return functools.partial(connection_options, output_option=output_option)

    @functools.wraps(command)
    def wrapper(brokers: str, timeout: float, client_config: tuple[str, ...], verbose: bool, **kwargs: Any) -> Any:
        output = kwargs.pop("output") if output_option else "table"
        conn = Connection(brokers, timeout, output, verbose, parse_pairs(client_config, "'-X'"))
        try:
            return command(conn=conn, **kwargs)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)

    options = [
        brokers_option(),
        click.option("--timeout", type=click.FloatRange(min=0.1), default=DEFAULT_TIMEOUT_S, show_default=True,
                     help="Seconds to wait for each answer; an unreachable cluster fails after it (exit 4)."),
        click.option("-X", "--client-config", "client_config", multiple=True, metavar="KEY=VALUE",
                     help="Any librdkafka client setting, e.g. -X security.protocol=SSL (repeatable)."),
        click.option("-v", "--verbose", is_flag=True, help="Show librdkafka's log on stderr."),
    ]
    if output_option:
        options.insert(2, click.option("--format", "output", type=click.Choice(["table", "json"]), default="table",
                                       show_default=True, help="Tables for people, JSON for scripts."))
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


# ---------------------------------------------------------------------------------------------------
# Output.


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, file: Any = None) -> None:
    """Columns aligned, headers upper-case, two spaces between columns (as rpk prints)."""
    rows = [["-" if cell is None else str(cell) for cell in row] for row in rows]
    headers = [header.upper() for header in headers]
    widths = [max([len(header)] + [len(row[index]) for row in rows]) for index, header in enumerate(headers)]
    for row in [headers, *rows]:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip(), file=file)


def section(title: str) -> None:
    click.echo(title)
    click.echo("=" * len(title))


def progress(message: str) -> None:
    """Progress of a long operation, on stderr (stdout is for the answer)."""
    click.echo(message, err=True)


def node_text(node: Any) -> str:
    return f"{node.host}:{node.port}" if node is not None else "-"


def node_json(node: Any) -> dict[str, Any] | None:
    if node is None:
        return None
    return {"id": node.id, "host": node.host, "port": node.port, "rack": node.rack}


def parse_timestamp(text: str) -> int:
    """Milliseconds since the epoch from an integer or an ISO 8601 date-time (UTC unless it says)."""
    import datetime as dt

    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither milliseconds since the epoch nor an ISO 8601 date-time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return int(moment.timestamp() * 1000)

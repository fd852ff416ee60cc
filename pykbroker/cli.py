"""The ``pykbroker`` command line: ``pykbroker serve`` runs a broker; ``pykbroker --version``.

The client commands (``topic``, ``produce``, ``consume``, ``group``, ``cluster info``) live in
pykbroker.ctl and are registered at the end of this module. Configuration rules (names, precedence
flag > env > file > default, validation) live in pykbroker.config; this module only maps options onto them.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Mapping

import click

from pykbroker import __version__, ctl
from pykbroker.ctl.common import (
    GlobalOptionsGroup, brokers_option, checked_client_settings, command_config_option, global_options,
)
from pykbroker.config import FSYNC_MODES, LOG_LEVELS, BrokerConfig, ConfigError, load_config

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class ConfigUsageError(click.ClickException):
    """A configuration the broker cannot start with: the message on stderr, exit status 2 (as for a
    bad command-line option)."""

    exit_code = 2


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format=LOG_FORMAT, force=True)


def _parse_overrides(overrides: tuple[str, ...]) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for item in overrides:
        key, separator, value = item.partition("=")
        if not separator or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="'--override'")
        parsed[key.strip()] = value
    return parsed


def _keep_hypothesis_out_of_the_broker() -> None:
    """kio registers Hypothesis strategies for its types whenever Hypothesis is importable. On a machine
    with the test tools installed that costs the broker ~2 s and ~200 MB at start (Hypothesis builds its
    Unicode tables) and leaves a .hypothesis/ folder in the working directory. A broker never needs it."""
    if "kio" not in sys.modules:
        sys.modules.setdefault("hypothesis", None)  # type: ignore[assignment]


@click.group(cls=GlobalOptionsGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="pykbroker", message="%(prog)s %(version)s")
@global_options  # -b, --timeout, --format, -X, -v of the client commands, also before the command (only theirs)
def main() -> None:
    """pykbroker: a Kafka broker in Python that speaks the real Kafka wire protocol."""


@main.command()
@click.version_option(__version__, "--version", prog_name="pykbroker", message="%(prog)s %(version)s")
@click.option("--host", help="Address to listen on (0.0.0.0: every interface).  [default: 127.0.0.1; env PYKBROKER_HOST]")
@click.option("--port", type=int, help="Port to listen on.  [default: 9092; env PYKBROKER_PORT]")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for the partition logs.  [default: ./data; env PYKBROKER_DATA_DIR]",
)
@click.option(
    "--advertised-host",
    help="Host clients are told to connect to.  [default: the listen host; the canonical host name for 0.0.0.0]",
)
@click.option("--advertised-port", type=int, help="Port clients are told to connect to.  [default: the listen port]")
@click.option(
    "--listeners",
    help="Kafka's listeners, NAME://host:port,... (one socket each; replaces --host/--port).  [env PYKBROKER_LISTENERS]",
)
@click.option(
    "--advertised-listeners",
    help="Kafka's advertised.listeners, NAME://host:port,...  [default: the listeners; env PYKBROKER_ADVERTISED_LISTENERS]",
)
@click.option("--broker-id", type=int, help="This broker's id (Kafka's broker.id).  [default: 1]")
@click.option(
    "--zookeeper",
    help="Join a cluster coordinated by ZooKeeper: HOST:PORT[,HOST:PORT][/chroot] (Kafka's zookeeper.connect). "
    "[default: none, the embedded single-node metadata; env PYKBROKER_ZOOKEEPER_CONNECT]",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Config file: TOML (*.toml) or Kafka server.properties format.  [env PYKBROKER_CONFIG]",
)
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), help="Logging level.  [default: INFO]")
@click.option(
    "--fsync",
    type=click.Choice(FSYNC_MODES),
    help="When to fsync the log: every write, every log.flush.interval.ms (1000), or never like Kafka's "
    "default (page cache only; a process crash loses nothing either way, a power loss may).  [default: interval]",
)
@click.option(
    "--override",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set any Kafka broker config key, e.g. --override num.partitions=3 (repeatable).",
)
@click.option("--metrics-port", type=int,
              help="Serve /metrics (Prometheus), /health and /ready on this HTTP port.  [default: off; env PYKBROKER_METRICS_PORT]")
def serve(
    host: str | None,
    port: int | None,
    data_dir: Path | None,
    advertised_host: str | None,
    advertised_port: int | None,
    listeners: str | None,
    advertised_listeners: str | None,
    broker_id: int | None,
    zookeeper: str | None,
    config_file: Path | None,
    log_level: str | None,
    fsync: str | None,
    overrides: tuple[str, ...],
    metrics_port: int | None = None,
) -> None:
    """Run a broker until SIGTERM or SIGINT.

    Settings come from flags, then PYKBROKER_* environment variables (PYKBROKER_NUM_PARTITIONS sets
    num.partitions), then the --config file, then Kafka's defaults. A broker that cannot start (port in
    use, unresolvable host, data dir locked or not writable) says why in one line and exits 1.
    """
    flags = {
        "host": host,
        "port": port,
        "data_dir": data_dir,
        "advertised_host": advertised_host,
        "advertised_port": advertised_port,
        "listeners": listeners,
        "advertised_listeners": advertised_listeners,
        "broker_id": broker_id,
        "zookeeper.connect": zookeeper,
        "log_level": log_level,
        "fsync": fsync,
        "metrics.port": metrics_port,
    }
    # Warnings about unknown keys are logged while the config loads, before its log level is known.
    configure_logging("WARNING")
    config = build_config(flags, overrides, config_file)
    configure_logging(config.log_level)
    _keep_hypothesis_out_of_the_broker()
    from pykbroker.log.checkpoint import CorruptFile
    from pykbroker.server.broker import StartupError, run_broker  # imported late: --help and --version stay fast

    try:
        run_broker(config)
    except (StartupError, CorruptFile) as exc:  # one line naming the thing, no traceback
        raise click.ClickException(str(exc)) from None


def build_config(flags: Mapping[str, Any], overrides: tuple[str, ...] = (), config_file: Path | None = None) -> BrokerConfig:
    """The BrokerConfig for ``serve``'s options (None = not given) and ``--override KEY=VALUE`` items,
    with the process environment. A ConfigError becomes a usage error (exit 2); a dedicated flag beats
    an --override of the same key."""
    cli_values = {**_parse_overrides(overrides), **{name: value for name, value in flags.items() if value is not None}}
    try:
        return load_config(cli=cli_values, env=os.environ, file=config_file)
    except ConfigError as exc:
        raise ConfigUsageError(str(exc)) from None


@main.group(invoke_without_command=True)
@click.option("--brokers", type=click.IntRange(min=1), default=3, show_default=True, help="Number of brokers (ids 1..N).")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for ZooKeeper (D/zookeeper), the brokers' data (D/broker-N) and their logs (D/logs).  [required]",
)
@click.option("--zookeeper", help="Use this ZooKeeper (HOST:PORT[/chroot]) instead of starting one.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the brokers listen on and advertise.")
@click.option("--base-port", type=click.IntRange(1, 65535), help="Broker N listens on BASE_PORT+N-1.  [default: free ports]")
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default="INFO", show_default=True,
              help="The brokers' logging level.")
@click.option("--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="A Kafka broker config key for every broker (repeatable).")
@click.option("--restart/--no-restart", default=True, show_default=True,
              help="Restart a broker that fails (not after 3 deaths within 5 minutes, nor one that exited with "
                   "status 0, a requested shutdown). --no-restart prints the command that restarts it instead.")
@click.pass_context
def cluster(ctx: click.Context, brokers: int, data_dir: Path | None, zookeeper: str | None, host: str,
            base_port: int | None, log_level: str, overrides: tuple[str, ...], restart: bool) -> None:
    """Run a local development cluster until Ctrl-C: ZooKeeper (unless --zookeeper) and N brokers.
    (`pykbroker cluster info -b HOST:PORT` describes a running cluster instead.)

    Prints the bootstrap servers once every broker lists all N in Metadata. A broker that dies is reported
    (exit status or signal, end of its log) and restarted, or its restart command printed. Ctrl-C or SIGTERM
    stops the brokers (controlled shutdown, SIGKILL after a grace period) and then ZooKeeper. Exit status 1
    when the cluster cannot start or a broker failed (not one that exited with status 0)."""
    if ctx.invoked_subcommand is not None:
        return
    if data_dir is None:
        raise click.MissingParameter(ctx=ctx, param_hint="'--data-dir'", param_type="option")
    _parse_overrides(overrides)  # a malformed KEY=VALUE is a usage error here, not N broker failures
    from pykbroker import devcluster  # imported late: --help stays fast

    sys.exit(devcluster.run(brokers, data_dir, zookeeper=zookeeper, base_port=base_port, host=host,
                            overrides=overrides, log_level=log_level, restart=restart))


@main.command()
@brokers_option("-b", "--brokers", "--bootstrap", "bootstrap")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the console listens on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="HTTP port (0: any free).")
@click.option("--allow-writes", is_flag=True, help="Allow creating topics and resetting group offsets (off: read-only).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME[:PORT]",
              help="Also answer requests for this Host (the name the console is reached by, e.g. behind a "
                   "proxy); repeatable. Others than the bound address and localhost are refused (DNS rebinding).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds to wait for the cluster on each call.")
@click.option("-X", "--client-config", "client_config", multiple=True, metavar="KEY=VALUE",
              help="Any librdkafka client setting for the cluster, e.g. -X security.protocol=SSL (repeatable).")
@command_config_option()
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default="WARNING", show_default=True)
def console(bootstrap: str, host: str, port: int, allow_writes: bool, allowed_hosts: tuple[str, ...], timeout: float,
            client_config: tuple[str, ...], command_config: str | None, log_level: str) -> None:
    """Serve a web console for a Kafka cluster (read through the Kafka protocol) until Ctrl-C or SIGTERM."""
    settings = checked_client_settings(command_config, client_config)
    configure_logging(log_level.upper())
    _keep_hypothesis_out_of_the_broker()
    from pykbroker.console.server import ListenError, serve as serve_console  # imported late: --help stays fast

    def ready(server) -> None:
        mode = "writes allowed" if allow_writes else "read-only"
        click.echo(f"pykbroker console for {bootstrap} ({mode}) at {server.url}/", err=True)

    try:
        serve_console(bootstrap, host=host, port=port, allow_writes=allow_writes, allowed_hosts=allowed_hosts,
                      timeout=timeout, ready=ready, client_config=settings)
    except ListenError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        pass


@main.group()
def scram() -> None:
    """SCRAM credentials stored without a running broker (the first admin user)."""


@scram.command("add")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
              help="A single node's data dir (the broker must not be running; made if missing).")
@click.option("--zookeeper", metavar="HOST:PORT[/chroot]", help="A cluster's ZooKeeper (brokers may be running).")
@click.option("--broker-id", type=int, default=1, show_default=True,
              help="The node id of a data dir that has none yet (as serve's --broker-id).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Seconds to wait for ZooKeeper.")
@click.argument("credentials", nargs=-1, required=True, metavar="CREDENTIAL...")
def scram_add(data_dir: Path | None, zookeeper: str | None, broker_id: int, timeout: float,
              credentials: tuple[str, ...]) -> None:
    """Add or replace users' SCRAM credentials, as kafka-storage.sh format --add-scram reads them:
    MECHANISM=[name=USER,password=PASSWORD] or MECHANISM=[name=USER,iterations=N,salt=B64,saltedpassword=B64]
    (MECHANISM: SCRAM-SHA-256 or SCRAM-SHA-512). The user's other configs (quotas) are kept."""
    from pykbroker.security.credentials import parse_add_scram
    from pykbroker.security.scram_bootstrap import BootstrapError, add_to_data_dir, add_to_zookeeper

    if (data_dir is None) == (zookeeper is None):
        raise click.UsageError("give exactly one of --data-dir (a single node) or --zookeeper (a cluster)")
    configure_logging("ERROR")  # kazoo's reconnect warnings: the outcome is said in one line
    entries = []
    for argument in credentials:
        try:
            entries.append(parse_add_scram(argument))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="CREDENTIALS") from None
    try:
        if data_dir is not None:
            add_to_data_dir(data_dir, entries, broker_id)
        else:
            import asyncio

            asyncio.run(add_to_zookeeper(zookeeper, entries, timeout))
    except BootstrapError as exc:
        raise click.ClickException(str(exc)) from None
    where = f"data dir {data_dir}" if data_dir is not None else f"ZooKeeper {zookeeper}"
    for user, mechanism, credential in entries:
        click.echo(f"Stored the {mechanism.name} credential of user {user!r} "
                   f"({credential.iterations} iterations) in {where}.")


ctl.register(main, cluster)  # the client commands: topic, produce, consume, group, cluster info (pykbroker.ctl)

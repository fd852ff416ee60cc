"""What every client command shares: the connection options, exit codes, errors, and output.

Connection: ``-b/--brokers HOST:PORT[,...]`` or ``$PYKBROKER_BROKERS`` (default ``127.0.0.1:9092``),
``--timeout`` seconds for each request (an unreachable cluster fails within it), ``-X/--client-config
KEY=VALUE`` for any librdkafka setting, ``--command-config FILE`` for Kafka's client properties file (TLS and
SASL as Kafka's tools take them, translated by pykbroker.ctl.security; -X wins). ``PYKBROKER_BROKERS`` is not a broker setting, so ``serve`` ignores
it (pykbroker.config reads only PYKBROKER_* variables that name a setting it knows). These options (and
``--format``) are also taken before the command, ``pykbroker -b HOST:PORT --format json topic list``
(:func:`global_options`); given in both places, the command's own wins; before a command that is not a
client (serve, console, the dev cluster) they are a usage error.

An address without a port is a usage error, as Kafka's clients refuse it ("Invalid url in
bootstrap.servers"), and so is an IPv6 address outside brackets (librdkafka would misread it); a usage error
names where the address came from (-b, $PYKBROKER_BROKERS, -X bootstrap.servers). Before the first client is
made, the bootstrap addresses are resolved, connected to and asked ApiVersions (all at once, every address a
name resolves to too, within one --timeout; over TLS after the handshake, over SASL PLAIN / SCRAM after
authenticating, with another mechanism before it, as Kafka allows ApiVersions): when none answers, the
command fails at once naming each address and why (not resolved, connection refused, not a Kafka listener,
or the step still running at the timeout), instead of librdkafka's "Broker transport failure" after the
whole --timeout; a refused TLS handshake or SASL exchange (wrong password) is one line saying so (exit 1).

Output: human-readable tables on stdout by default, ``--format json`` for scripts (one JSON document);
progress and warnings go to stderr, so stdout stays what the command answers.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import socket
import sys
import threading
import time
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
EXIT_USAGE = 2  # bad arguments or input (click's own code for usage errors)
EXIT_NOT_FOUND = 3  # the topic, partition or group named does not exist
EXIT_UNREACHABLE = 4  # no bootstrap broker reachable, or none answered within --timeout
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_CODES_HELP = ("Exit codes: 0 ok; 1 the cluster answered with an error or refused; 2 bad arguments or input; "
                   "3 topic, partition or group not found; 4 no broker reachable or answering within --timeout; "
                   "130 Ctrl-C.")

# UNKNOWN_TOPIC_OR_PART, GROUP_ID_NOT_FOUND, UNKNOWN_TOPIC_ID; librdkafka's _UNKNOWN_TOPIC, _UNKNOWN_PARTITION, _NOENT
_NOT_FOUND_CODES = {3, 69, 100, -188, -190, -156}
_UNREACHABLE_CODES = {-195, -185, -187, -193}  # _TRANSPORT, _TIMED_OUT, _ALL_BROKERS_DOWN, _RESOLVE


# Kafka's rule for a bootstrap address (Utils.HOST_PORT_PATTERN), with an optional listener or protocol prefix
# (PLAINTEXT://host:port) as librdkafka takes it; an IPv6 host in brackets (without them, or with one bracket
# only, librdkafka reads such an address differently: a usage error).
_ADDRESS = re.compile(r"^(?:[A-Za-z0-9+._-]+://)?(?:\[([0-9A-Za-z%._:-]+)\]|([0-9A-Za-z%._-]+)):([0-9]+)$")
_BROKERS_HINT = "'-b' / '--brokers'"
_ENV_HINT = f"${BROKERS_ENV}"
_X_HINT = "'-X bootstrap.servers'"


def parse_bootstrap(brokers: str, hint: str = _BROKERS_HINT) -> list[tuple[str, int]]:
    """``HOST:PORT[,...]`` into (host, port) pairs, each once; anything else (a host without its port among
    them) is a usage error naming the address, the form expected, and ``hint`` (where the value came from)."""
    addresses = []
    for item in (part.strip() for part in brokers.split(",")):
        if not item:
            continue
        match = _ADDRESS.match(item)
        if match is None or not 0 < int(match.group(3)) < 65536:
            bare = item.split("://", 1)[-1]
            has_port = re.search(r":[0-9]+$", bare) is not None
            example = f"{bare}:9092" if not has_port and re.fullmatch(r"[0-9A-Za-z._-]+", bare) else "localhost:9092"
            if has_port and ":" in bare.rsplit(":", 1)[0].strip("[]") and not re.fullmatch(r"\[[^][]+\]:[0-9]+", bare):
                example = "[::1]:9092 (an IPv6 address in brackets)"
            raise click.BadParameter(f"{item!r} {'is not HOST:PORT' if has_port else 'has no port'}: expected "
                                     f"HOST:PORT[,HOST:PORT...], e.g. {example}", param_hint=hint)
        address = (match.group(1) or match.group(2), int(match.group(3)))
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise click.BadParameter("no broker address: expected HOST:PORT[,HOST:PORT...]", param_hint=hint)
    return addresses


_NOT_KAFKA = "accepts connections but did not answer ApiVersions (not a Kafka listener?)"


class _Probe:
    """One bootstrap address being checked: its name looked up, then every address it resolves to connected
    to at once (and, with ``api_versions``, asked ApiVersions), all within one deadline. ``step`` says what
    is still running when the deadline passes; ``cause`` why it failed; ``done`` is set once it is known."""

    def __init__(self, host: str, port: int, timeout: float, deadline: float, api_versions: bool,
                 security: Any = None) -> None:
        self.host, self.port, self.timeout, self.deadline = host, port, timeout, deadline
        self.api_versions = api_versions
        self.security = security
        self.refused: str | None = None  # the TLS handshake or the SASL exchange failed: why
        self.step = "name lookup"
        self.ok = False
        self.cause: str | None = None
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._pending = 0
        self._causes: list[str] = []

    def run(self) -> None:
        try:
            infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            return self._finish(f"host name {self.host!r} not resolved ({exc.strerror})")
        targets = list(dict.fromkeys((family, kind, proto, sockaddr) for family, kind, proto, _, sockaddr in infos))
        if not targets:
            return self._finish(f"host name {self.host!r} has no address")
        self.step = "connecting"
        self._pending = len(targets)
        for target in targets:
            threading.Thread(target=self._try, args=target, daemon=True).start()

    def _try(self, family: int, kind: int, proto: int, sockaddr: Any) -> None:
        try:
            if self.api_versions and self.security is not None:  # connected by the protocol client itself
                self.step = "connecting, TLS handshake, SASL and ApiVersions"
                cause = _secured_failure(sockaddr[0], self.port, self.host, self.security, self.deadline)
                if cause is not None and cause.startswith(_AUTHENTICATION):
                    self.refused = cause
            else:
                cause = self._plaintext(family, kind, proto, sockaddr)
        except ConnectionRefusedError:
            cause = "connection refused (nothing listens on that port)"
        except (socket.timeout, TimeoutError):
            cause = f"no connection within {self.timeout:g} s"
        except OSError as exc:
            cause = exc.strerror or str(exc)
        with self._lock:
            self._pending -= 1
            if cause is None:
                self.ok = True
            elif cause not in self._causes:
                self._causes.append(cause)
            if self.ok or self._pending == 0:
                self._finish("; ".join(self._causes) if not self.ok else None)

    def _plaintext(self, family: int, kind: int, proto: int, sockaddr: Any) -> str | None:
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(max(self.deadline - time.monotonic(), 0.001))
            sock.connect(sockaddr)
            if not self.api_versions:
                return None
            self.step = "ApiVersions"
            return _api_versions_failure(sock, self.deadline)

    def _finish(self, cause: str | None) -> None:
        if not self.done.is_set():
            self.ok, self.cause = cause is None, cause
            self.done.set()


def _api_versions_failure(sock: socket.socket, deadline: float) -> str | None:
    """None if the peer of this connected socket answers ApiVersions (pykbroker's protocol client) before
    the deadline, else why not. The socket stays the caller's to close."""
    import asyncio

    from pykbroker.protocol.client import ClientError, KafkaClientConnection

    async def ask() -> None:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):
            _, connection = await loop.create_connection(
                lambda: KafkaClientConnection(client_id=CLIENT_ID, request_timeout=None), sock=sock.dup())
            try:
                await connection.negotiate_api_versions()
            finally:
                await connection.aclose()

    try:
        asyncio.run(ask())
    except (ClientError, OSError, TimeoutError):
        return _NOT_KAFKA
    return None


def _secured_failure(ip: str, port: int, host: str, security: Any, deadline: float) -> str | None:
    """None if ``ip``:``port`` completes the TLS handshake (checking the certificate names ``host``), the
    SASL exchange (when the protocol client speaks the mechanism; else ApiVersions only, which Kafka answers
    before authentication) and ApiVersions before the deadline; else why not: the refusal (a wrong password,
    an untrusted certificate) in the broker's words, ending in ``AUTHENTICATION``, or :data:`_NOT_KAFKA`."""
    import asyncio

    from pykbroker.ctl.security import before_sasl
    from pykbroker.protocol.client import AuthenticationFailed, ClientError, ConnectError, KafkaClientConnection

    security = before_sasl(security)

    async def ask() -> None:
        remaining = max(deadline - time.monotonic(), 0.001)
        connection = await KafkaClientConnection.connect(ip, port, client_id=CLIENT_ID, connect_timeout=remaining,
                                                         request_timeout=remaining, security=security,
                                                         server_hostname=host)
        await connection.aclose()

    try:
        asyncio.run(ask())
    except AuthenticationFailed as exc:
        return _AUTHENTICATION + str(exc).replace(f"{ip}:{port}", _address_text((host, port)))
    except ConnectError as exc:
        if isinstance(exc.__cause__, OSError):
            raise exc.__cause__ from None  # refused, unreachable: said as for a plaintext probe
        if exc.__cause__ is None and "timed out" in str(exc):
            raise TimeoutError from None
        return _NOT_KAFKA
    except (ClientError, OSError, TimeoutError):
        return _NOT_KAFKA
    return None


_AUTHENTICATION = "authentication failed: "


def reachable_broker(addresses: Sequence[tuple[str, int]], timeout: float, *,
                     api_versions: bool = False, security: Any = None) -> tuple[str, int]:
    """The first of these addresses a TCP connection opens to (and, with ``api_versions``, that answers
    ApiVersions - after the TLS handshake and the SASL exchange of ``security``, a protocol/client
    ClientSecurity): all tried at once - every address a name resolves to too - within one timeout; or a
    CtlError (EXIT_UNREACHABLE) naming every address and why it failed, or which step was still running at
    the timeout; when the TLS handshake or the SASL exchange was refused (a wrong password, an untrusted
    certificate), a CtlError (EXIT_KAFKA_ERROR) saying that. Daemon threads: a name lookup that hangs past
    the timeout does not hold the command."""
    addresses = list(dict.fromkeys(addresses))
    deadline = time.monotonic() + timeout
    probes = [_Probe(host, port, timeout, deadline, api_versions, security) for host, port in addresses]
    answered = threading.Condition()

    def run(probe: _Probe) -> None:
        probe.run()
        probe.done.wait()
        with answered:
            answered.notify_all()

    for probe in probes:
        threading.Thread(target=run, args=(probe,), daemon=True).start()
    with answered:  # a second past the deadline: a probe's own timeout says more than the step it was in
        answered.wait_for(lambda: any(p.ok for p in probes) or all(p.done.is_set() for p in probes),
                          timeout=timeout + 1.0)
    for probe in probes:
        if probe.ok:
            return probe.host, probe.port
    refused = [p.refused for p in probes if p.refused and p.refused.startswith(_AUTHENTICATION)]
    if refused:
        raise CtlError(refused[0], EXIT_KAFKA_ERROR)
    listed = "; ".join(f"{_address_text((p.host, p.port))}: "
                       f"{p.cause if p.done.is_set() else f'no answer within {timeout:g} s ({p.step})'}"
                       for p in probes)
    raise CtlError(f"cannot reach any broker: {listed}", EXIT_UNREACHABLE)


def _address_text(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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
    the like) is status ``tolerated`` instead. An error (a KafkaError, or a CtlError the command met for
    that resource) is said once, in its row (as rpk prints it), not again on stderr; one that means the
    resource does not exist says so (``does not exist (UNKNOWN_TOPIC_OR_PART)``, the wording of every
    command); the exit code is the worst."""
    rows, worst = [], EXIT_OK
    for name, error in results:
        if error is None or (not isinstance(error, CtlError) and error.name() == tolerate):
            rows.append({kind: name, "status": done if error is None else tolerated, "error": None})
            continue
        if isinstance(error, CtlError):
            worst = max(worst, error.exit_code)
            rows.append({kind: name, "status": error.message, "error": {"code": None, "message": error.message}})
            continue
        worst = max(worst, exit_code_for(error))
        status = f"does not exist ({error.name()})" if exit_code_for(error) == EXIT_NOT_FOUND else error_text(error)
        rows.append({kind: name, "status": status, "error": {"code": error.name(), "message": error.str()}})
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
    brokers_hint: str = _BROKERS_HINT  # where ``brokers`` came from, for a usage error: -b or $PYKBROKER_BROKERS
    _admin: Any = None
    _reachable: tuple[str, int] | None = None
    _security: Any = False  # False: not built yet

    @property
    def bootstrap(self) -> list[tuple[str, int]]:
        """The bootstrap addresses (-X bootstrap.servers overrides -b, as it does for the client)."""
        if "bootstrap.servers" in self.extra:
            return parse_bootstrap(self.extra["bootstrap.servers"], _X_HINT)
        return parse_bootstrap(self.brokers, self.brokers_hint)

    def reachable(self) -> tuple[str, int]:
        """A bootstrap address that answers ApiVersions (checked once; with TLS, after the handshake; with
        SASL PLAIN or SCRAM, after authenticating), else a CtlError saying, for each address, why not (exit
        4) - at once, not after librdkafka's whole --timeout - or that authentication failed (exit 1)."""
        if self._reachable is None:
            self._reachable = reachable_broker(self.bootstrap, self.timeout, api_versions=True,
                                               security=self.security)
        return self._reachable

    @property
    def security(self) -> Any:
        """The TLS and SASL of the settings (--command-config, -X) for pykbroker's own protocol client
        (pykbroker.ctl.security.client_security; None for PLAINTEXT); a setting it cannot use is a usage error."""
        if self._security is False:
            from pykbroker.ctl.security import CommandConfigError, client_security

            try:
                self._security = client_security(self.extra)
            except CommandConfigError as exc:
                raise click.UsageError(f"client configuration refused: {exc}") from None
        return self._security

    @property
    def authenticates(self) -> bool:
        """Whether pykbroker's own protocol client can make authenticated requests with these settings (not
        with a SASL mechanism it does not speak: OAUTHBEARER, GSSAPI)."""
        return self.security is None or self.security.authenticates

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
        -X, say) is a usage error; no reachable bootstrap address is exit 4 at once (:meth:`reachable`)."""
        from confluent_kafka import KafkaException

        try:
            client = kind(self.config(**settings))
        except (KafkaException, ValueError, TypeError) as exc:
            error = exc.args[0] if exc.args else exc
            raise click.UsageError(f"client configuration refused: {getattr(error, 'str', lambda: error)()}") from None
        self.reachable()  # after the settings are checked: a bad setting is a usage error whatever the cluster
        return client

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
        """Metadata for these topics (all when None), through the AdminClient: see :func:`topic_metadata`."""
        return topic_metadata(self.admin, topics, self.timeout)

    def emit(self, data: Any, render: Callable[[Any], None]) -> None:
        """Write ``data`` as JSON (--format json) or with ``render`` (tables)."""
        if self.output == "json":
            click.echo(json.dumps(data, indent=2, default=str))
        else:
            render(data)


def topic_metadata(client: Any, topics: Sequence[str] | None, timeout: float) -> dict[str, Any]:
    """Metadata for these topics (all when None) through any librdkafka client: name -> TopicMetadata. A
    topic that does not exist is a CtlError with EXIT_NOT_FOUND (:func:`topic_error`, one wording for every
    command); another error of a topic is a CtlError naming it."""
    try:
        if topics is None:
            return client.list_topics(timeout=timeout).topics
        found = {}
        for name in topics:
            found.update(client.list_topics(topic=name, timeout=timeout).topics)
    except Exception as exc:
        raise kafka_error(exc, "reading metadata") from None
    for name in topics:
        metadata = found.get(name)
        if metadata is None or metadata.error is not None:
            raise topic_error(name, metadata.error if metadata is not None else None)
    return found


def topic_error(name: str, error: Any = None) -> CtlError:
    """The CtlError for a topic the cluster answered with ``error`` for (a KafkaError; None: not in the
    answer at all): ``topic 'NAME' does not exist (UNKNOWN_TOPIC_OR_PART)`` for every not-found code."""
    if error is None or exit_code_for(error) == EXIT_NOT_FOUND:
        return CtlError(f"topic {name!r} does not exist" + (f" ({error.name()})" if error is not None else ""),
                        EXIT_NOT_FOUND)
    return CtlError(f"topic {name!r}: {error_text(error)}", exit_code_for(error))


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


def _protocol_logger(verbose: bool) -> None:
    """pykbroker's protocol client (the reachability probe, FindCoordinator, ApiVersions per broker) logs a
    WARNING when a peer breaks the protocol or does not answer: without -v the command's own error says
    that, so those lines are not printed (Python would print them through its last-resort handler)."""
    logger = logging.getLogger("pykbroker.protocol")
    handler = next((h for h in logger.handlers if getattr(h, "pykbroker_ctl", False)), None)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler.pykbroker_ctl = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    handler.setLevel(logging.INFO if verbose else logging.CRITICAL + 1)


def command_config_option() -> Any:
    """``--command-config FILE``: Kafka's client properties file, as Kafka's tools take it."""
    return click.option("--command-config", "command_config", metavar="FILE",
                        help="Kafka's client properties file (security.protocol, ssl.truststore.*, ssl.keystore.*, "
                             "sasl.mechanism, sasl.jaas.config...), as kafka-topics.sh takes it; -X settings win.")


def client_settings(command_config: str | None, client_config: Iterable[str]) -> dict[str, str]:
    """librdkafka settings from --command-config FILE (translated: pykbroker.ctl.security) and -X KEY=VALUE
    (which win); a file or setting that cannot be used is a usage error."""
    from pykbroker.ctl.security import CommandConfigError, load_command_config

    settings: dict[str, str] = {}
    if command_config:
        try:
            settings.update(load_command_config(command_config))
        except CommandConfigError as exc:
            raise click.UsageError(str(exc)) from None
    settings.update(parse_pairs(client_config, "'-X'"))
    return settings


def checked_client_settings(command_config: str | None, client_config: Iterable[str]) -> dict[str, str]:
    """client_settings, with their TLS and SASL checked as the protocol client will use them (a trust store
    that does not load is a usage error before anything starts: the console checks it so)."""
    from pykbroker.ctl.security import CommandConfigError, client_security

    settings = client_settings(command_config, client_config)
    try:
        client_security(settings)
    except CommandConfigError as exc:
        raise click.UsageError(f"client configuration refused: {exc}") from None
    return settings


def parse_pairs(items: Iterable[str], what: str, *, allow_empty_value: bool = True) -> dict[str, str]:
    """KEY=VALUE items into a dict (a usage error names the bad one)."""
    parsed: dict[str, str] = {}
    for item in items:
        key, separator, value = item.partition("=")
        if not separator or not key.strip() or (not value and not allow_empty_value):
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint=what)
        parsed[key.strip()] = value
    return parsed


_GLOBAL_KEY = "pykbroker.ctl.global_options"


def _remember_global(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Keep a group-level option given on the command line (none has a default) for the command's context."""
    if value not in (None, (), False):
        ctx.meta.setdefault(_GLOBAL_KEY, {})[param.name] = value
    return value


def global_options(group: Callable[..., Any]) -> Any:
    """The client commands' options on the ``pykbroker`` group itself, so that they may come before the
    command (``pykbroker --format json -b HOST:PORT topic list``); given after it too, the command's own
    wins (its -X settings are added to these). Commands that are not clients (serve, the dev cluster,
    console) refuse them (:func:`refuse_unused_global_options`)."""
    def option(*decls: str, **attrs: Any) -> Callable[..., Any]:
        return click.option(*decls, expose_value=False, callback=_remember_global, **attrs)

    options = [
        option("-b", "--brokers", metavar="HOST:PORT[,...]", help="The client commands' -b, given before the command."),
        option("--timeout", type=click.FloatRange(min=0.1), help="The client commands' --timeout."),
        option("--format", "output", type=click.Choice(["table", "json"]),
               help="The client commands' --format (json: consume's -f json)."),
        option("-X", "--client-config", "client_config", multiple=True, metavar="KEY=VALUE",
               help="The client commands' -X (repeatable)."),
        option("--command-config", "command_config", metavar="FILE", help="The client commands' --command-config."),
        option("-v", "--verbose", is_flag=True, help="The client commands' -v."),
    ]
    for decorate in reversed(options):
        group = decorate(group)
    return group


_GLOBAL_FLAGS = {"brokers": "-b", "timeout": "--timeout", "output": "--format", "client_config": "-X",
                 "command_config": "--command-config", "verbose": "-v"}


def _protected_args(ctx: click.Context) -> list[str]:
    """The arguments click holds back for the subcommand: ``_protected_args`` since click 8.2,
    ``protected_args`` in 8.1 (which pyproject allows)."""
    held = getattr(ctx, "_protected_args", None)
    return list(held if held is not None else ctx.protected_args)


class GlobalOptionsGroup(click.Group):
    """The ``pykbroker`` group (with :func:`global_options`): client options given before the command that
    reach a command that does not take them (serve, console, the dev cluster) are a usage error, said before
    that command starts, instead of being ignored."""

    def invoke(self, ctx: click.Context) -> Any:
        refuse_unused_global_options(ctx)  # before click consumes the command's arguments
        return super().invoke(ctx)


def refuse_unused_global_options(ctx: click.Context) -> None:
    """A usage error when client options given before the command reach a command that does not take them;
    the command is found as click will find it (through a group such as ``cluster`` too)."""
    given = ctx.meta.get(_GLOBAL_KEY)
    args = [*_protected_args(ctx), *ctx.args]
    if not given or set(args) & set(ctx.help_option_names):
        return  # help is shown whatever comes before it
    command: click.Command = ctx.command
    path, parent = [ctx.info_name or "pykbroker"], ctx
    while isinstance(command, click.Group) and args:
        name, found, args = command.resolve_command(parent, args)
        if found is None:
            return  # click says what is wrong with the command name
        path.append(name or found.name or "")
        command = found
        if isinstance(command, click.Group):
            parent = command.make_context(name, list(args), parent=parent, resilient_parsing=True)
            args = [*_protected_args(parent), *parent.args]
    if getattr(command.callback, "takes_client_options", False) or (
            isinstance(command, click.Group) and not command.invoke_without_command):
        return  # a client command, or a group without its command: click says that one is missing
    flags = ", ".join(_GLOBAL_FLAGS[name] for name in _GLOBAL_FLAGS if name in given)
    raise click.UsageError(f"{flags} before the command: only the client commands take them (topic, produce, "
                           f"consume, group, cluster info), not '{' '.join(path)}'", ctx=ctx)


def _with_global_options(values: dict[str, Any], fmt_param: str | None) -> dict[str, Any]:
    """The command's option values with those given before the command filled in where the command's own
    were not given on the command line (defaults and $PYKBROKER_BROKERS give way to them)."""
    ctx = click.get_current_context()
    given = ctx.meta.get(_GLOBAL_KEY, {})
    explicit = click.core.ParameterSource.COMMANDLINE
    values = dict(values)
    for name in ("brokers", "timeout", "verbose", "output", "command_config"):
        if given.get(name) is not None and name in values and ctx.get_parameter_source(name) != explicit:
            values[name] = given[name]
    if given.get("client_config"):
        values["client_config"] = (*given["client_config"], *values["client_config"])
    if fmt_param and given.get("output") == "json" and ctx.get_parameter_source(fmt_param) != explicit:
        values[fmt_param] = "json"
    return values


def connection_options(command: Callable[..., Any] | None = None, *, output_option: bool = True,
                       record_format: str | None = None) -> Any:
    """The options every client command takes; the command receives a ``conn: Connection``. Without
    ``output_option`` the command defines its own ``--format`` (``consume``'s record formats, the parameter
    named ``record_format``, which a ``--format json`` before the command sets)."""
    if command is None:
        return functools.partial(connection_options, output_option=output_option, record_format=record_format)

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        given = kwargs
        kwargs = _with_global_options(kwargs, record_format)
        brokers, timeout = kwargs.pop("brokers"), kwargs.pop("timeout")
        client_config, verbose = kwargs.pop("client_config"), kwargs.pop("verbose")
        command_config = kwargs.pop("command_config")
        output = kwargs.pop("output") if output_option else "table"
        source = click.get_current_context().get_parameter_source("brokers")
        from_env = brokers == given["brokers"] and source == click.core.ParameterSource.ENVIRONMENT
        conn = Connection(brokers, timeout, output, verbose, client_settings(command_config, client_config),
                          brokers_hint=_ENV_HINT if from_env else _BROKERS_HINT)
        _protocol_logger(verbose)
        conn.bootstrap  # noqa: B018 (a malformed address is a usage error before anything else is done)
        try:
            return command(conn=conn, **kwargs)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)

    wrapper.takes_client_options = True  # type: ignore[attr-defined]  (see refuse_unused_global_options)
    options = [
        brokers_option(),
        click.option("--timeout", type=click.FloatRange(min=0.1), default=DEFAULT_TIMEOUT_S, show_default=True,
                     help="Seconds to wait for each answer; an unreachable cluster fails after it (exit 4)."),
        click.option("-X", "--client-config", "client_config", multiple=True, metavar="KEY=VALUE",
                     help="Any librdkafka client setting, e.g. -X security.protocol=SSL (repeatable)."),
        command_config_option(),
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

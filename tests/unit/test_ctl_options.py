"""The client commands' option parsing (pykbroker/ctl) without a broker: record formats, start positions,
timestamps, exit-code mapping, the `cluster` group keeping `pykbroker cluster --data-dir`, the
bootstrap-servers variable that `serve`'s configuration must not take for a setting, bootstrap addresses
(HOST:PORT or a usage error; the reachability check on ports nothing listens on) and the client options
given before the command."""

from __future__ import annotations

import re
import socket
import threading
import time

import click
import pytest
from click.testing import CliRunner

from pykbroker.cli import build_config, main
from pykbroker.config import load_config
from pykbroker.ctl.common import (
    BROKERS_ENV, EXIT_KAFKA_ERROR, EXIT_NOT_FOUND, EXIT_UNREACHABLE, CtlError, exit_code_for, parse_bootstrap,
    parse_timestamp, reachable_broker,
)
from pykbroker.ctl.consume import Start, formatter

RECORD = {"topic": "t", "partition": 2, "offset": 7, "timestamp": 1000, "key": None, "value": "v",
          "headers": [{"key": "a", "value": "1"}, {"key": "b", "value": None}]}


def test_record_formats():
    assert formatter("text")(RECORD) == "v"
    assert formatter("{topic}:{partition}@{offset} {key}={value} {headers}")(RECORD) == "t:2@7 =v a=1,b="
    assert formatter(r"{offset}\t{value}")(RECORD) == "7\tv"
    assert '"headers": [{"key": "a", "value": "1"}' in formatter("json")(RECORD)
    with pytest.raises(click.BadParameter, match="nope"):
        formatter("{nope}")


def test_start_positions():
    assert (Start("beginning", None).reset, Start("beginning", None).explicit) == ("earliest", False)
    assert (Start("latest", None).reset, Start("end", None).explicit) == ("latest", False)
    assert Start("-3", None).number == -3 and Start("-3", None).explicit
    assert Start("end", "2026-01-01T00:00:00Z").timestamp == 1767225600000
    with pytest.raises(click.BadParameter):
        Start("soon", None)


def test_timestamps():
    assert parse_timestamp("1767225600000") == 1767225600000
    assert parse_timestamp("2026-01-01T01:00:00+01:00") == 1767225600000
    assert parse_timestamp("2026-01-01T00:00:00.250") == 1767225600250  # no zone: UTC
    with pytest.raises(click.BadParameter):
        parse_timestamp("yesterday")


def test_exit_codes_for_kafka_errors():
    assert exit_code_for(3) == EXIT_NOT_FOUND  # UNKNOWN_TOPIC_OR_PART
    assert exit_code_for(69) == EXIT_NOT_FOUND  # GROUP_ID_NOT_FOUND
    assert exit_code_for(-195) == EXIT_UNREACHABLE  # _TRANSPORT
    assert exit_code_for(36) == EXIT_KAFKA_ERROR  # TOPIC_ALREADY_EXISTS


def test_brokers_variable_is_not_a_broker_setting(tmp_path, monkeypatch):
    config = load_config(env={BROKERS_ENV: "127.0.0.1:1,bogus", "PYKBROKER_PORT": "9999"},
                         cli={"data_dir": str(tmp_path)})
    assert config.port == 9999
    monkeypatch.setenv(BROKERS_ENV, "127.0.0.1:1,bogus")
    assert build_config({"data_dir": tmp_path, "port": 0}, ()).port == 0  # serve's path: no ConfigError


def test_cluster_group_keeps_the_dev_cluster_command():
    runner = CliRunner()
    missing = runner.invoke(main, ["cluster", "--brokers", "3"])
    assert missing.exit_code == 2 and "--data-dir" in missing.output
    helped = runner.invoke(main, ["cluster", "info", "--help"])
    assert helped.exit_code == 0 and "--brokers" in helped.output and BROKERS_ENV in helped.output
    assert runner.invoke(main, ["cluster", "--help"]).output.count("info") >= 1


def test_bootstrap_addresses_need_a_port():
    assert parse_bootstrap("127.0.0.1:9092, kafka-1.example:19092,") == [("127.0.0.1", 9092), ("kafka-1.example", 19092)]
    assert parse_bootstrap("PLAINTEXT://broker:9092,[::1]:9093") == [("broker", 9092), ("::1", 9093)]
    for bad, said in (("localhost", "'localhost' has no port: expected HOST:PORT[,HOST:PORT...], e.g. localhost:9092"),
                      ("127.0.0.1:9092,kafka2", "'kafka2' has no port"), ("h:0", "'h:0' is not HOST:PORT"),
                      ("h:65536", "'h:65536' is not HOST:PORT"), (":9092", "':9092' is not HOST:PORT"),
                      (" , ", "no broker address"),
                      # librdkafka reads these otherwise (host ::1:19193 without a port; host [::1): refused
                      ("::1:19193", "'::1:19193' is not HOST:PORT: expected HOST:PORT[,HOST:PORT...], e.g. [::1]:9092"),
                      ("[::1:19193", "'[::1:19193' is not HOST:PORT"), ("::1]:19193", "'::1]:19193' is not HOST:PORT")):
        with pytest.raises(click.BadParameter, match=re.escape(said)):
            parse_bootstrap(bad)


def test_a_bootstrap_address_given_twice_is_probed_once():
    assert parse_bootstrap("h:1,h:1,PLAINTEXT://h:1,[::1]:2,[::1]:2") == [("h", 1), ("::1", 2)]
    with socket.socket() as bound:  # bound, not listening: refused at once
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(CtlError) as refused:
            reachable_broker([("127.0.0.1", port), ("127.0.0.1", port)], timeout=30)
        assert time.monotonic() - started < 10  # not the whole timeout
    assert refused.value.message.count(f"127.0.0.1:{port}:") == 1


def _unresolved(real_getaddrinfo):
    """getaddrinfo that fails for *.invalid at once as a resolver does (a nameserver may take 5 s a try)."""
    def getaddrinfo(host, *args, **kwargs):
        if str(host).endswith(".invalid"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real_getaddrinfo(host, *args, **kwargs)
    return getaddrinfo


def test_unreachable_bootstrap_is_said_per_address_at_once(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", _unresolved(socket.getaddrinfo))
    with socket.socket() as bound:  # a port bound but not listening: connections to it are refused
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        with socket.create_server(("127.0.0.1", 0)) as listening:
            good = listening.getsockname()[:2]
            assert reachable_broker([("127.0.0.1", port), good], timeout=5) == good
        started = time.monotonic()
        with pytest.raises(CtlError) as refused:
            reachable_broker([("127.0.0.1", port), ("nonexistent.invalid", 9092)], timeout=30)
    assert time.monotonic() - started < 10
    assert refused.value.exit_code == EXIT_UNREACHABLE
    assert refused.value.message.startswith(
        f"cannot reach any broker: 127.0.0.1:{port}: connection refused (nothing listens on that port); "
        "nonexistent.invalid:9092: host name 'nonexistent.invalid' not resolved (Name or service not known)")


@pytest.fixture
def refused_ports():
    """Three ports bound but not listening, kept for the test: connections are refused, and no other
    process can take them meanwhile."""
    bound = [socket.socket() for _ in range(3)]
    try:
        for sock in bound:
            sock.bind(("127.0.0.1", 0))
        yield [sock.getsockname()[1] for sock in bound]
    finally:
        for sock in bound:
            sock.close()


def test_client_options_before_the_command(monkeypatch, refused_ports):
    """-b before the command is used; after it, or in neither place the environment, as before."""
    ports = refused_ports
    runner = CliRunner()
    monkeypatch.setenv(BROKERS_ENV, f"127.0.0.1:{ports[2]}")

    def said(*args: str) -> str:
        result = runner.invoke(main, list(args))
        assert result.exit_code == EXIT_UNREACHABLE, result.output
        return result.output

    assert f"127.0.0.1:{ports[0]}:" in said("-b", f"127.0.0.1:{ports[0]}", "topic", "list")
    assert f"127.0.0.1:{ports[1]}:" in said("-b", f"127.0.0.1:{ports[0]}", "topic", "list", "-b", f"127.0.0.1:{ports[1]}")
    assert f"127.0.0.1:{ports[2]}:" in said("topic", "list")
    assert f"127.0.0.1:{ports[0]}:" in said("--timeout", "2", "-b", f"127.0.0.1:{ports[0]}", "group", "describe", "g")
    usage = runner.invoke(main, ["-b", "localhost", "topic", "list"])
    assert usage.exit_code == 2 and "'localhost' has no port" in usage.output
    helped = runner.invoke(main, ["--help"])
    assert "--format [table|json]" in helped.output and "-b, --brokers" in helped.output


@pytest.mark.parametrize("args", [
    # their own arguments are bad too, so that without the refusal they end at once instead of serving
    ["serve", "--config", "/nonexistent/pykbroker.toml"], ["console", "--port", "-1"], ["cluster", "--brokers", "3"],
], ids=lambda args: args[0])
def test_client_options_before_a_command_that_takes_none_are_refused(args, refused_ports):
    """serve, console and the dev cluster are not client commands: -b, --format... before them were ignored;
    they are a usage error, said before the command runs. `cluster info` takes them."""
    runner = CliRunner()
    refused = runner.invoke(main, ["-b", f"127.0.0.1:{refused_ports[0]}", "--format", "json", *args])
    assert refused.exit_code == 2, refused.output
    assert (f"-b, --format before the command: only the client commands take them (topic, produce, consume, "
            f"group, cluster info), not 'main {args[0]}'") in refused.output
    info = runner.invoke(main, ["-b", f"127.0.0.1:{refused_ports[0]}", "cluster", "info", "--timeout", "5"])
    assert info.exit_code == EXIT_UNREACHABLE and f"127.0.0.1:{refused_ports[0]}: connection refused" in info.output


def test_a_bad_address_is_blamed_on_where_it_came_from(monkeypatch):
    runner = CliRunner()
    monkeypatch.setenv(BROKERS_ENV, "kafka1")
    from_env = runner.invoke(main, ["topic", "list"])
    assert from_env.exit_code == 2 and f"Invalid value for ${BROKERS_ENV}: 'kafka1' has no port" in from_env.output
    from_flag = runner.invoke(main, ["topic", "list", "-b", "kafka2"])
    assert from_flag.exit_code == 2 and "Invalid value for '-b' / '--brokers': 'kafka2' has no port" in from_flag.output
    before = runner.invoke(main, ["-b", "kafka3", "topic", "list"])
    assert before.exit_code == 2 and "Invalid value for '-b' / '--brokers': 'kafka3' has no port" in before.output
    from_x = runner.invoke(main, ["topic", "list", "-b", "h:1", "-X", "bootstrap.servers=kafka4"])
    assert from_x.exit_code == 2 and "Invalid value for '-X bootstrap.servers': 'kafka4' has no port" in from_x.output


@pytest.fixture
def silent_listener():
    """A port that accepts connections and never answers (as a service that is not Kafka may)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@pytest.fixture
def closing_listener():
    """A port that accepts a connection and closes it at the first bytes (as ZooKeeper does with a Kafka
    request)."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                peer, _ = server.accept()
            except OSError:
                return
            with peer:
                peer.recv(64)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


NOT_KAFKA = "accepts connections but did not answer ApiVersions (not a Kafka listener?)"


def test_a_listener_that_is_not_kafka_is_said_so(silent_listener, closing_listener):
    """The probe asks ApiVersions: a port where another service listens fails within --timeout (at once
    when it closes the connection), saying so, instead of librdkafka's _TRANSPORT after the whole --timeout."""
    started = time.monotonic()
    with pytest.raises(CtlError) as closed:
        reachable_broker([("127.0.0.1", closing_listener)], timeout=30, api_versions=True)
    assert time.monotonic() - started < 10
    assert closed.value.message == f"cannot reach any broker: 127.0.0.1:{closing_listener}: {NOT_KAFKA}"
    started = time.monotonic()
    with pytest.raises(CtlError) as silent:
        reachable_broker([("127.0.0.1", silent_listener)], timeout=2, api_versions=True)
    assert 1.9 < time.monotonic() - started < 10
    assert silent.value.message == f"cannot reach any broker: 127.0.0.1:{silent_listener}: {NOT_KAFKA}"
    # TCP only (TLS or SASL set with -X): the listener accepts, which is all that is checked
    assert reachable_broker([("127.0.0.1", silent_listener)], timeout=2) == ("127.0.0.1", silent_listener)


def test_the_cli_says_a_listener_is_not_kafka_without_log_lines(closing_listener, silent_listener, capfd):
    runner = CliRunner()
    for port, timeout in ((closing_listener, "30"), (silent_listener, "2")):
        result = runner.invoke(main, ["topic", "list", "-b", f"127.0.0.1:{port}", "--timeout", timeout])
        assert result.exit_code == EXIT_UNREACHABLE, result.output
        assert f"Error: cannot reach any broker: 127.0.0.1:{port}: {NOT_KAFKA}" in result.stderr
        assert "WARNING" not in result.stderr and "_TRANSPORT" not in result.stderr
    tls = runner.invoke(main, ["topic", "list", "-b", f"127.0.0.1:{silent_listener}", "--timeout", "1",
                               "-X", "security.protocol=SSL"])
    assert NOT_KAFKA not in tls.output  # TCP only then: librdkafka says what it finds
    assert "WARNING" not in capfd.readouterr().err


@pytest.fixture
def hanging_port():
    """A port whose connections hang (listening with a full backlog: the kernel drops further SYNs)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        fillers = []
        try:
            for _ in range(4):
                filler = socket.socket()
                filler.setblocking(False)
                filler.connect_ex(("127.0.0.1", port))
                fillers.append(filler)
            with socket.socket() as check:  # the backlog is full: a connection does not open
                check.settimeout(0.5)
                with pytest.raises((socket.timeout, TimeoutError)):
                    check.connect(("127.0.0.1", port))
            yield port
        finally:
            for filler in fillers:
                filler.close()


def test_the_addresses_of_one_name_are_tried_at_once(monkeypatch, hanging_port):
    """A name resolving to an address that hangs and one that answers: the answering one is found at once,
    not after the first one's whole timeout; every address hanging, the one timeout is said once."""
    with socket.create_server(("127.0.0.1", 0)) as listening:
        good = listening.getsockname()[1]
        real = socket.getaddrinfo

        def getaddrinfo(host, port, *args, **kwargs):
            if host != "kafka.test":
                return real(host, port, *args, **kwargs)
            ports = [hanging_port, good] if port == 1 else [hanging_port, hanging_port]
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", p)) for p in ports]

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        started = time.monotonic()
        assert reachable_broker([("kafka.test", 1)], timeout=20) == ("kafka.test", 1)
        assert time.monotonic() - started < 10
        started = time.monotonic()
        with pytest.raises(CtlError) as hung:
            reachable_broker([("kafka.test", 2)], timeout=2)
        assert time.monotonic() - started < 10
    assert hung.value.message == "cannot reach any broker: kafka.test:2: no connection within 2 s"


def test_the_step_still_running_at_the_timeout_is_named(monkeypatch, silent_listener):
    lookup = threading.Event()
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if host == "slow.test":
            lookup.wait(30)  # a resolver that does not answer
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    try:
        with pytest.raises(CtlError) as slow:
            reachable_broker([("slow.test", 9092), ("127.0.0.1", silent_listener)], timeout=1, api_versions=True)
    finally:
        lookup.set()
    assert slow.value.message == ("cannot reach any broker: slow.test:9092: no answer within 1 s (name lookup); "
                                  f"127.0.0.1:{silent_listener}: {NOT_KAFKA}")

"""The console's pieces without a broker: escaping, value formats, URL building, parsing, the HTTP server's
refusals, and an unreachable cluster turned into an error page within the timeout."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from broker_process import free_port
from pykbroker.console import data, pages
from pykbroker.console.html import Markup, escape, h, hexdump, number, render_bytes, size, timestamp, url
from pykbroker.console.server import _configs

pytestmark = pytest.mark.timeout(120)

CHROME = {"bootstrap": "b:9092", "allow_writes": False}


def test_h_escapes_every_argument_but_markup():
    out = h('<a href="{}">{}</a>{}', 'x" onclick="y', "<script>alert(1)</script>", Markup("<b>ok</b>"))
    assert out == '<a href="x&quot; onclick=&quot;y">&lt;script&gt;alert(1)&lt;/script&gt;</a><b>ok</b>'
    assert h("{name}", name="'&'") == "&#x27;&amp;&#x27;"
    assert escape(None) == "" and isinstance(h("x"), Markup)


def test_url_quotes_path_segments_and_query():
    assert url("/groups", "a/b c?#", "reset") == "/groups/a%2Fb%20c%3F%23/reset"
    assert url("/messages", topic="t&x=1", partition="", limit=None) == "/messages?topic=t%26x%3D1"


def test_render_bytes_formats():
    value = json.dumps({"b": [1, 2], "a": "ü"}).encode()
    assert render_bytes(value) == ('{\n  "b": [\n    1,\n    2\n  ],\n  "a": "ü"\n}', "json")
    assert render_bytes(value, "text") == (value.decode(), "text")
    assert render_bytes(b"plain words") == ("plain words", "text")
    assert render_bytes(b"[not json") == ("[not json", "text")
    assert render_bytes(b"42", "json") == ("42", "json")  # asked for: any JSON document
    assert render_bytes(b"42") == ("42", "text")            # auto: only objects and arrays are pretty-printed
    assert render_bytes(None) == ("null", "null")
    assert render_bytes(b"\x00\xffab") == ("00000000  00 ff 61 62" + " " * 38 + "..ab", "hex")
    assert render_bytes(b"\xff\xfe", "text") == ("\ufffd\ufffd", "text")
    assert render_bytes(b"abc", "hex")[1] == "hex"
    # a value cut at the display limit is not parsed as JSON
    assert render_bytes(b'{"a": 1, "b"', truncated=True) == ('{"a": 1, "b"', "text")


def test_hexdump_lines():
    dump = hexdump(bytes(range(20)))
    assert dump.splitlines()[1].startswith("00000010  10 11 12 13")
    assert len(dump.splitlines()) == 2


def test_number_size_timestamp():
    assert number(None) == "—" and number(1234567) == "1,234,567"
    assert size(None) == "—" and size(512) == "512 B" and size(2048) == "2.0 KiB" and size(3 * 1024 ** 3) == "3.0 GiB"
    assert timestamp(0) == "1970-01-01 00:00:00.000Z" and timestamp(-1) == "—" and timestamp(None) == "—"
    assert timestamp(1700000000123) == "2023-11-14 22:13:20.123Z"


def test_parse_timestamp():
    assert data.parse_timestamp("1700000000123") == 1700000000123
    assert data.parse_timestamp("2023-11-14T22:13:20") == 1700000000000
    assert data.parse_timestamp("2023-11-14T23:13:20+01:00") == 1700000000000
    assert data.parse_timestamp("2023-11-14T22:13:20Z") == 1700000000000
    for bad in ("", "yesterday"):
        with pytest.raises(data.BadRequest):
            data.parse_timestamp(bad)


def test_config_lines():
    assert _configs("a=1\n\n b = x=y \n") == {"a": "1", "b": "x=y"}
    with pytest.raises(data.BadRequest):
        _configs("no-separator")


def test_lag_and_totals():
    offsets = [data.GroupOffset("t", 0, 5, 9), data.GroupOffset("t", 1, 3, 3), data.GroupOffset("t", 2, None, 4)]
    assert [o.lag for o in offsets] == [4, 0, None]
    assert data.Group("g", "EMPTY", offsets=offsets[:2]).lag == 4
    assert data.Group("g", "EMPTY", offsets=offsets).lag is None  # a partition with no commit: unknown
    assert data.Group("g", "EMPTY").lag is None
    topic = data.Topic("t", [data.PartitionInfo(0, 1, [1, 2], [1], start=2, end=10, size=100),
                             data.PartitionInfo(1, 2, [1, 2], [1, 2], start=0, end=5, size=None)])
    assert (topic.replication_factor, topic.under_replicated, topic.messages, topic.size) == (2, 1, 13, None)


def test_pages_escape_cluster_data():
    evil = "<img src=x onerror=alert(1)>"
    group = data.Group(evil, "STABLE", members=[data.Member("m", evil, "/h", [(evil, 0)])],
                       offsets=[data.GroupOffset(evil, 0, 1, 2, member=evil)])
    topic = data.Topic(evil, [data.PartitionInfo(0, 1, [1], [1], error=evil)],
                       configs=[data.ConfigItem(evil, evil, False, evil)])
    message = data.Message(evil, 0, 0, 0, "CreateTime", evil.encode(), evil.encode(), 30, 30, [(evil, evil.encode())])
    rendered = [pages.group(group, reset_form=True, **CHROME), pages.topic(topic, **CHROME),
                pages.topics([topic], create_form=True, **CHROME), pages.groups([group], **CHROME),
                pages.messages([evil], {"topic": evil, "position": evil}, data.Browse(evil, [message], [0]), **CHROME),
                pages.error_page(evil, 500, **CHROME)]
    for page in rendered:
        assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def test_value_cut_to_max_bytes_is_said():
    message = data.Message("t", 0, 7, None, "", b"k", b"x" * 16, 1, 1000, [])
    page = pages.messages(["t"], {"topic": "t"}, data.Browse("t", [message], [0], truncated_values=True), **CHROME)
    assert "text, 1000 bytes, first 16 shown" in page


class _NoCluster:
    """A reader that must not be called: the requests below are refused before."""

    bootstrap = "nowhere:9092"

    def __getattr__(self, name):
        raise AssertionError(f"the reader was called: {name}")


def _request(base: str, path: str, form: bytes | None = None, headers: dict | None = None) -> tuple[int, str]:
    request = urllib.request.Request(base + path, data=form, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_read_only_server_refuses_posts(console_server):
    base = console_server(_NoCluster()).url
    for path in ("/topics", "/groups/g/reset", "/anything"):
        status, body = _request(base, path, b"name=x")
        assert status == 403 and "read-only" in body
    assert _request(base, "/healthz") == (200, "ok\n")
    status, body = _request(base, "/nope/<b>")
    assert status == 404 and "<b>" not in body


def test_writable_server_refuses_other_origins_and_big_forms(console_server):
    base = console_server(_NoCluster(), allow_writes=True).url
    status, body = _request(base, "/topics", b"name=x", {"Origin": "http://evil.example"})
    assert status == 403 and "own pages" in body
    status, _ = _request(base, "/topics", b"name=x", {"Origin": "null"})
    assert status == 403
    status, _ = _request(base, "/topics", b"x" * (70 * 1024))
    assert status == 413


def test_unreachable_cluster_is_an_error_page_within_the_timeout(console_server):
    reader = data.ClusterReader(f"127.0.0.1:{free_port()}", timeout=2)
    base = console_server(reader).url
    for path in ("/", "/topics", "/groups", "/messages?topic=t"):
        started = time.monotonic()
        status, body = _request(base, path)
        assert status in (502, 504), (path, status)
        assert 'class="error"' in body
        assert time.monotonic() - started < 15
    assert _request(base, "/healthz")[0] == 200  # and the server still serves


def test_cli_port_in_use_is_one_line_and_exit_1():
    import socket

    from click.testing import CliRunner

    from pykbroker.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["console", "-b", "127.0.0.1:1", "--port", str(port)])
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in result.output


def test_cli_help_names_the_options():
    from click.testing import CliRunner

    from pykbroker.cli import main

    result = CliRunner().invoke(main, ["console", "--help"])
    assert result.exit_code == 0
    for option in ("--brokers", "--host", "--port", "--allow-writes", "--timeout"):
        assert option in result.output


def test_browse_keeps_at_most_limit_messages_in_time_order():
    def message(partition, offset, ts):
        return data.Message("t", partition, offset, ts, "CreateTime", None, None, 0, 0, [])

    many = [message(p, o, 1000 + o * 10 + p) for p in range(3) for o in range(10)]
    newest = data._keep(many, 4, newest=True)
    assert [(m.partition, m.offset) for m in newest] == [(2, 9), (1, 9), (0, 9), (2, 8)]
    oldest = data._keep(many, 2, newest=False)
    assert [(m.partition, m.offset) for m in oldest] == [(0, 0), (1, 0)]


# -- DNS rebinding, the status banner, hung workers ------------------------------------------------------

def _raw(port: int, method: str, path: str, host: str | None, headers: dict | None = None,
         body: bytes = b"") -> tuple[int, str]:
    """A request with exactly this Host header (urllib always sends the URL's)."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        if host is not None:
            connection.putheader("Host", host)
        for name, value in (headers or {}).items():
            connection.putheader(name, value)
        if body:
            connection.putheader("Content-Type", "application/x-www-form-urlencoded")
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body or None)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def test_rebound_host_is_refused_for_reads_and_writes(console_server):
    server = console_server(_NoCluster(), allow_writes=True)
    port = server.server_address[1]
    evil = f"evil.example:{port}"
    for path in ("/", "/topics", "/healthz", "/messages?topic=t"):
        status, body = _raw(port, "GET", path, evil)
        assert status == 403 and "does not answer for the host" in body, path
        assert "nowhere:9092" not in body  # nothing about the cluster goes to the other site
    status, body = _raw(port, "POST", "/topics", evil, {"Origin": f"http://{evil}"}, b"name=x")
    assert status == 403 and "does not answer for the host" in body
    assert _raw(port, "GET", "/healthz", None)[0] == 403  # no Host at all
    assert _raw(port, "GET", "/healthz", "127.0.0.1:1")[0] == 403  # another port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}"):
        assert _raw(port, "GET", "/healthz", host) == (200, "ok\n"), host


def test_allowed_host_option(console_server):
    from pykbroker.console.server import ConsoleServer

    server = ConsoleServer(("127.0.0.1", 0), _NoCluster(), allowed_hosts=["console.example", "proxy.example:8443"])
    server.start_background()
    try:
        port = server.server_address[1]
        for host in ("console.example", f"console.example:{port}", "proxy.example:8443", f"127.0.0.1:{port}"):
            assert _raw(port, "GET", "/healthz", host)[0] == 200, host
        for host in ("console.example:1", f"proxy.example:{port}", "proxy.example", f"evil.example:{port}"):
            assert _raw(port, "GET", "/healthz", host)[0] == 403, host
    finally:
        server.shutdown()
        server.server_close()


def test_cli_allowed_host_reaches_the_server(monkeypatch):
    from click.testing import CliRunner

    from pykbroker import cli
    from pykbroker.console import server

    seen = {}
    monkeypatch.setattr(server, "serve", lambda bootstrap, **kwargs: seen.update(kwargs))
    result = CliRunner().invoke(cli.main, ["console", "--allowed-host", "a.example", "--allowed-host", "b:1"])
    assert result.exit_code == 0, result.output
    assert seen["allowed_hosts"] == ("a.example", "b:1")
    assert "--allowed-host" in CliRunner().invoke(cli.main, ["console", "--help"]).output


class _Topics:
    bootstrap = "b:9092"

    def topics(self):
        return []


def test_notice_only_shows_texts_the_server_signed(console_server):
    server = console_server(_Topics())
    status, body = _request(server.url, "/topics?notice=Cluster+compromised%2C+call+555")
    assert status == 200 and "Cluster compromised" not in body and 'class="notice"' not in body
    signed = server.notice_url(("/topics",), "Topic t created.")
    status, body = _request(server.url, signed)
    assert status == 200 and '<div class="notice" role="status">Topic t created.</div>' in body
    forged = signed.replace("Topic+t", "Topic+u")
    assert 'class="notice"' not in _request(server.url, forged)[1]


def test_timed_out_calls_do_not_leave_the_workers_busy():
    """A call that times out takes its pool down: two hung calls must not make every later call a 504."""
    import socket

    from pykbroker.console.worker import IsolatedReader

    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        reader = IsolatedReader(f"127.0.0.1:{silent.getsockname()[1]}", timeout=60, call_timeout=3)
        try:
            first = reader.worker_pids()
            for _ in range(reader.workers):
                with pytest.raises(data.ConsoleError) as caught:
                    reader.cluster()
                assert caught.value.status == 504
            assert reader.restarts >= 1
            fresh = reader.worker_pids(timeout=30)  # before the fix: both workers still busy, a timeout
            assert not set(fresh) & set(first)
        finally:
            reader.close()


def test_allowed_hosts_of_a_wildcard_bind():
    from pykbroker.console.server import _allowed_hosts

    hosts = _allowed_hosts("0.0.0.0", 8080, ["[fd00::1]", "Console.Example"])
    assert {"0.0.0.0:8080", "localhost:8080", "[::1]:8080", "[fd00::1]", "[fd00::1]:8080", "console.example",
            "console.example:8080"} <= hosts
    assert "evil.example:8080" not in hosts and "localhost" not in hosts


class _ProbeFails(data.ClusterReader):
    """A real reader whose why-groups-cannot-start probe fails (as a worker's timeout does)."""

    def coordination_problem(self):
        raise data.ConsoleError("the probe got no answer", 504)


def test_groups_page_shows_the_groups_when_only_the_probe_fails(console_broker, console_server):
    base = console_server(_ProbeFails(console_broker.bootstrap, timeout=15)).url
    status, body = _request(base, "/groups")
    assert status == 200, body
    assert "billing" in body and "cannot start" not in body and "the probe got no answer" not in body

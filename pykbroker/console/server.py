"""The console's HTTP server: stdlib ThreadingHTTPServer, one thread per request.

Routes (GET): ``/`` overview, ``/topics``, ``/topics/NAME``, ``/groups``, ``/groups/ID``, ``/messages``
(the browser: ``topic``, ``partition``, ``start`` newest|oldest|offset|timestamp, ``position``, ``limit``,
``order``, ``format``, ``max_bytes``), ``/healthz``. Writes (POST): ``/topics`` creates a topic,
``/groups/ID/reset`` resets a group's offsets - only when the server was started with ``allow_writes``;
otherwise their forms are absent and every POST is refused with 403. A POST whose Origin (or Referer) is
another site is refused too, so a page elsewhere cannot drive the writes through a visitor's browser.
Every request (GET too) whose Host header is not the console's own address (the bound address, or
localhost / 127.0.0.1 / [::1], with the port) nor one given with ``allowed_hosts`` is refused with 403:
a DNS-rebinding page (its own name resolved to this machine) can neither read the pages nor post. The
status banner (``?notice=``) shows only texts the server itself signed, so a link cannot put words in it.

Nothing a request does can take the server down: a failed or timed-out cluster call becomes an error page
(its status 4xx/5xx), any other exception a 500 page; the request socket itself has a timeout.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import signal
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable
from urllib.parse import parse_qs, unquote, urlsplit

from pykbroker.console import data, pages
from pykbroker.console.html import url
from pykbroker.console.worker import IsolatedReader

log = logging.getLogger(__name__)

MAX_FORM_BYTES = 64 * 1024
SOCKET_TIMEOUT_S = 60


class _Handler(BaseHTTPRequestHandler):
    server: "ConsoleServer"
    timeout = SOCKET_TIMEOUT_S
    protocol_version = "HTTP/1.1"
    server_version = "pykbroker-console"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the stdlib's name
        log.info("%s %s", self.address_string(), format % args)

    # -- responses ------------------------------------------------------------------------------------
    def _send(self, status: int, body: str, content_type: str = "text/html; charset=utf-8",
              headers: dict[str, str] | None = None) -> None:
        payload = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        # No script runs on these pages, from anywhere; nothing is loaded from another origin.
        self.send_header("Content-Security-Policy",
                         "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; "
                         "frame-ancestors 'none'; base-uri 'none'")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "same-origin")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _chrome(self, notice: str | None = None) -> dict:
        return {"bootstrap": self.server.reader.bootstrap, "allow_writes": self.server.allow_writes,
                "notice": notice}

    def _error(self, status: int, message: str) -> None:
        self._send(status, pages.error_page(message, status, **self._chrome()))

    def _redirect(self, location: str) -> None:
        self._send(HTTPStatus.SEE_OTHER, "", headers={"Location": location})

    def _dispatch(self, handler: Callable[[], None]) -> None:
        try:
            handler()
        except data.ConsoleError as exc:
            self._error(exc.status, str(exc))
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # a bug must not kill the server: an error page, and the traceback logged
            log.exception("error serving %s %s", self.command, self.path)
            self._error(500, f"internal error: {type(exc).__name__}: {exc}")

    # -- routing --------------------------------------------------------------------------------------
    def _route(self) -> tuple[list[str], dict[str, str]]:
        parts = urlsplit(self.path)
        segments = [unquote(s) for s in parts.path.split("/") if s]
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        return segments, query

    def do_HEAD(self) -> None:  # noqa: N802 - the stdlib's name
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch_checked(self._get)

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch_checked(self._post)

    def _host_allowed(self) -> bool:
        host = (self.headers.get("Host") or "").strip().lower()
        return bool(host) and host in self.server.allowed_hosts

    def _dispatch_checked(self, handler: Callable[[], None]) -> None:
        if not self._host_allowed():
            self.close_connection = True  # a POST body is not read
            message = (f"this console does not answer for the host {self.headers.get('Host')!r}: open it at "
                       f"{self.server.url}/ or start it with --allowed-host NAME")
            # Nothing about the cluster on this page (no bootstrap): the asking page may be another site's.
            self._send(403, pages.error_page(message, 403, bootstrap="", allow_writes=False))
            return
        self._dispatch(handler)

    def _get(self) -> None:
        segments, query = self._route()
        notice = self.server.verify_notice(query.get("notice", ""), query.get("sig", ""))
        reader, chrome = self.server.reader, self._chrome(notice)
        match segments:
            case []:
                self._send(200, pages.overview(reader.cluster(), **chrome))
            case ["healthz"]:
                self._send(200, "ok\n", "text/plain; charset=utf-8")
            case ["topics"]:
                self._send(200, pages.topics(reader.topics(), create_form=self.server.allow_writes, **chrome))
            case ["topics", name]:
                self._send(200, pages.topic(reader.topic(name), **chrome))
            case ["groups"]:
                groups = reader.groups()
                try:
                    problem = reader.coordination_problem()
                except data.ConsoleError:  # only the warning is missing: the groups are still worth showing
                    problem = None
                self._send(200, pages.groups(groups, problem=problem, **chrome))
            case ["groups", group_id]:
                self._send(200, pages.group(reader.group(group_id), reset_form=self.server.allow_writes, **chrome))
            case ["messages"]:
                self._messages(query, chrome)
            case _:
                self._error(404, f"no page at {self.path}")

    def _messages(self, query: dict[str, str], chrome: dict) -> None:
        reader = self.server.reader
        topic_names = reader.topic_names()
        result = None
        if query.get("topic"):
            partition = query.get("partition", "").strip()
            result = reader.browse(
                query["topic"], partition=_int(partition, "partition") if partition else None,
                start=query.get("start", "newest"), position=query.get("position", ""),
                limit=_int(query.get("limit") or data.DEFAULT_MESSAGES, "limit"),
                max_bytes=_int(query.get("max_bytes") or data.DEFAULT_VALUE_BYTES, "max_bytes"),
                newest_first=query.get("order", "newest") != "oldest")
        self._send(200, pages.messages(topic_names, query, result, **chrome))

    # -- writes ---------------------------------------------------------------------------------------
    def _same_origin(self) -> bool:
        source = self.headers.get("Origin") or self.headers.get("Referer")
        if not source or source == "null":
            return source is None  # no header: a non-browser client; "null": an opaque origin, refused
        return urlsplit(source).netloc == self.headers.get("Host")

    def _form(self) -> dict[str, str]:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise data.BadRequest("bad Content-Length") from None
        if length < 0 or length > MAX_FORM_BYTES:
            raise data.ConsoleError(f"form larger than {MAX_FORM_BYTES} bytes", 413)
        body = self.rfile.read(length).decode("utf-8", "replace")
        return {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}

    def _post(self) -> None:
        if not self.server.allow_writes:
            self.close_connection = True  # the body is not read
            self._error(403, "this console is read-only: start it with --allow-writes to change the cluster")
            return
        if not self._same_origin():
            self.close_connection = True
            self._error(403, "a change must be submitted from the console's own pages")
            return
        form = self._form()
        segments, _ = self._route()
        reader = self.server.reader
        match segments:
            case ["topics"]:
                name = form.get("name", "").strip()
                if not name:
                    raise data.BadRequest("a topic name is required")
                reader.create_topic(name, _int(form.get("partitions") or "1", "partitions"),
                                    _int(form.get("replication_factor") or "-1", "replication factor"),
                                    _configs(form.get("configs", "")))
                self._redirect(self.server.notice_url(("/topics", name), f"Topic {name} created."))
            case ["groups", group_id, "reset"]:
                changed = reader.reset_offsets(group_id, form.get("topic") or None, form.get("mode", ""),
                                               form.get("position", ""))
                summary = ", ".join(f"{t}/{p} → {o}" for t, p, o in changed)
                self._redirect(self.server.notice_url(("/groups", group_id), f"Offsets reset: {summary}."))
            case _:
                self._error(404, f"nothing to post to at {self.path}")


def _int(text: object, what: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise data.BadRequest(f"{what} must be a whole number, not {text!r}") from None


def _configs(text: str) -> dict[str, str]:
    configs = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, separator, value = line.partition("=")
        if not separator or not key.strip():
            raise data.BadRequest(f"config lines are key=value, not {line!r}")
        configs[key.strip()] = value.strip()
    return configs


def _allowed_hosts(bound: str, port: int, extra: Iterable[str]) -> frozenset[str]:
    """The Host header values the console answers: the bound address (the URL it prints), localhost,
    127.0.0.1 and [::1], each with the port; each ``extra`` as given (NAME:PORT) or, without a port, both
    bare (a proxy on port 80/443) and with the console's port."""
    def with_port(name: str) -> str:
        return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"

    names = {"localhost", "127.0.0.1", "::1"}
    if bound:  # a wildcard (0.0.0.0) too: only typed literally in an address bar, never an attacker's name
        names.add(bound.lower())
    hosts = {with_port(n) for n in names}
    for value in extra:
        value = value.strip().lower()
        if not value:
            continue
        bracketed = value.startswith("[")
        if (bracketed and "]:" in value) or (not bracketed and value.count(":") == 1):
            hosts.add(value)  # NAME:PORT, [V6]:PORT
        else:
            bare = value.strip("[]")
            hosts.update({f"[{bare}]" if ":" in bare else bare, with_port(bare)})
    return frozenset(hosts)


class ListenError(Exception):
    """The console's address cannot be bound (in use, not an address of this machine)."""


class ConsoleServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], reader: data.ClusterReader, *, allow_writes: bool = False,
                 allowed_hosts: Iterable[str] = ()) -> None:
        self.reader = reader
        self.allow_writes = allow_writes
        self._notice_key = secrets.token_bytes(32)
        super().__init__(address, _Handler)
        self.allowed_hosts = _allowed_hosts(self.server_address[0], self.server_address[1], allowed_hosts)

    def _notice_sig(self, text: str) -> str:
        return hmac.new(self._notice_key, text.encode("utf-8"), hashlib.sha256).hexdigest()

    def notice_url(self, segments: tuple[str, ...], text: str) -> str:
        """A URL of this console showing ``text`` in the status banner (signed: see verify_notice)."""
        return url(*segments, notice=text, sig=self._notice_sig(text))

    def verify_notice(self, text: str, sig: str) -> str | None:
        """``text`` if this server signed it, else None: a link from elsewhere cannot fill the banner."""
        if text and sig and hmac.compare_digest(self._notice_sig(text), sig):
            return text
        return None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def start_background(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="pykbroker-console", daemon=True)
        thread.start()
        return thread


def serve(bootstrap: str, *, host: str = "127.0.0.1", port: int = 8080, allow_writes: bool = False,
          allowed_hosts: Iterable[str] = (),
          timeout: float = data.DEFAULT_TIMEOUT_S, ready: Callable[[ConsoleServer], None] | None = None,
          client_config: dict[str, Any] | None = None) -> None:
    """Serve the console until interrupted (Ctrl-C, or SIGTERM when called in the main thread: both raise
    KeyboardInterrupt after the worker processes have stopped); :class:`ListenError` when the address cannot
    be bound. The Kafka clients run in worker processes (pykbroker.console.worker), with ``client_config``
    (librdkafka settings: TLS, SASL) on top of the console's own."""
    reader = IsolatedReader(bootstrap, timeout=timeout, client_config=client_config)
    try:
        server = ConsoleServer((host, port), reader, allow_writes=allow_writes, allowed_hosts=allowed_hosts)
    except OSError as exc:
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous: dict[int, Any] = {}
    try:
        reader.worker_pids()  # start the client processes now rather than on the first page
        if in_main_thread:  # (only now: a SIGTERM raised while a worker is being spawned would lose track of it)
            previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, _terminate)
        if ready is not None:
            ready(server)
        server.serve_forever()
    finally:
        if in_main_thread:  # a second Ctrl-C or SIGTERM must not cut the stop short (a busy worker left running)
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous.setdefault(sig, signal.signal(sig, signal.SIG_IGN))
        try:
            server.server_close()
            reader.close()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class Terminated(KeyboardInterrupt):
    """SIGTERM (systemd, Docker, kill): the console stops as on Ctrl-C, its worker processes with it."""


def _terminate(signum, frame) -> None:
    raise Terminated()

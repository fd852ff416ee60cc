"""A tiny HTTP/1.1 server on the broker's event loop: GET /metrics, /health, /ready.

It runs on the broker's own asyncio loop (no thread), so the scrape reads broker state between two
event-loop steps, never while a request is half-way through changing it. Each connection carries one
request and is closed after the answer (``Connection: close``). Bounds: the request head (request line and
headers) is at most ``MAX_HEAD_BYTES`` and must arrive within ``READ_TIMEOUT_S``; an answer must be taken
by the client within ``WRITE_TIMEOUT_S``; at most ``MAX_CONNECTIONS`` connections are served at once. A
connection beyond that closes the oldest one still waiting for its request head (a liveness probe sends
its request at once: slow or idle clients holding every slot cannot keep it from an answer); when every
slot is answering, the new connection is closed at once. Anything that is not a well-formed ``GET``/``HEAD`` request line is answered 400
(too-large head: 431, too slow: 408, other methods: 405, unknown path: 404); nothing a client sends can
stop the broker: each connection's failure is logged and only that connection is closed.

* ``/metrics``: Prometheus text exposition (``generate_latest`` of the broker's own registry).
* ``/health``: liveness: 200 ``ok`` whenever the event loop answers.
* ``/ready``: readiness: 200 ``ready`` once the broker accepts clients (in a cluster: registered in
  ZooKeeper and present in its own metadata, i.e. the controller sent it the cluster's state); else 503
  with the reason as the body.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from typing import TYPE_CHECKING, Callable

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from pykbroker.metrics.collector import broker_registry

if TYPE_CHECKING:
    from pykbroker.server.broker import Broker

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 8192
READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
            431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}
TEXT = "text/plain; charset=utf-8"


def ready_reason(broker: "Broker") -> str | None:
    """None when the broker is ready for clients, else why not (the body of /ready's 503)."""
    if broker.stopping:
        return "shutting down"
    if not broker.serving:
        return "starting: loading logs" + (" and joining the cluster" if broker.cluster is not None else "")
    cluster = broker.cluster
    if cluster is not None:
        if cluster.broker_epoch < 0:
            return "not registered in ZooKeeper"
        if not broker.metadata.is_alive(broker.broker_id):
            return "registered, waiting for the controller's metadata"
    return None


async def _discard(reader: asyncio.StreamReader, limit: int = 1 << 20, timeout_s: float = 2.0) -> None:
    """Read and drop what the client still sends (up to ``limit`` bytes, ``timeout_s``), until it closes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while limit > 0:
        chunk = await asyncio.wait_for(reader.read(65536), max(deadline - loop.time(), 0))
        if not chunk:
            return
        limit -= len(chunk)


class MetricsServer:
    """Serves one bound socket (server/broker.py's ``bind_metrics``) for one broker until ``close``."""

    def __init__(self, broker: "Broker", sock: socket.socket) -> None:
        self.broker = broker
        self.sock = sock
        self.registry = broker_registry(broker)
        self._server: asyncio.AbstractServer | None = None
        self._open: set[asyncio.Task] = set()
        self._reading: dict[asyncio.Task, None] = {}  # connections waiting for their request head, oldest first
        self._routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/metrics": self._metrics, "/health": self._health, "/ready": self._ready,
        }

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, sock=self.sock, limit=MAX_HEAD_BYTES)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._open):
            task.cancel()
        await asyncio.gather(*self._open, return_exceptions=True)
        self.sock.close()

    # -- routes -----------------------------------------------------------------------------------
    def _metrics(self) -> tuple[int, str, bytes]:
        return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)

    def _health(self) -> tuple[int, str, bytes]:
        return 200, TEXT, b"ok\n"

    def _ready(self) -> tuple[int, str, bytes]:
        reason = ready_reason(self.broker)
        if reason is None:
            return 200, TEXT, b"ready\n"
        return 503, TEXT, reason.encode() + b"\n"

    # -- one connection ---------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._open.add(task)
        try:
            if len(self._open) > MAX_CONNECTIONS:
                if not self._reading:
                    return  # every slot is answering (each bounded in time): closed at once
                oldest = next(iter(self._reading))
                del self._reading[oldest]
                oldest.cancel()  # its connection is closed; this one takes its slot
            self._reading[task] = None
            try:
                status, content_type, body, head_only = await self._answer(reader)
            finally:
                self._reading.pop(task, None)
            if status is None:
                return
            extra = "Allow: GET, HEAD\r\n" if status == 405 else ""
            header = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
                      f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n").encode("latin-1")
            writer.write(header if head_only else header + body)
            if status == 431:  # the rest of the head is unread: closing now would reset the connection first
                writer.write_eof()
                await _discard(reader)
            writer.close()  # once everything written is sent
            await asyncio.wait_for(writer.wait_closed(), WRITE_TIMEOUT_S)
        except (asyncio.TimeoutError, ConnectionError):
            pass  # a client that does not read its answer, or went away
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                log.warning("metrics endpoint: connection failed: %s", exc)
        except Exception:
            log.exception("metrics endpoint: answering a request failed")
        finally:
            self._open.discard(task)
            writer.transport.abort()  # (a no-op once closed; drops what a client that does not read left)

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[int | None, str, bytes, bool]:
        """(status, content type, body, HEAD?) for the request on ``reader``; status None: say nothing."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            return 431, TEXT, b"request head too large\n", False
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                return None, "", b"", False  # connected and left (a port probe)
            return 400, TEXT, b"incomplete request\n", False
        except asyncio.TimeoutError:
            return 408, TEXT, b"request head not received in time\n", False
        try:
            request_line = head.split(b"\r\n", 1)[0].decode("ascii")
        except UnicodeDecodeError:
            return 400, TEXT, b"bad request line\n", False
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
            return 400, TEXT, b"bad request line\n", False
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return 405, TEXT, b"only GET and HEAD\n", False
        route = self._routes.get(target.split("?", 1)[0])
        if route is None:
            return 404, TEXT, b"not found: try /metrics, /health or /ready\n", method == "HEAD"
        try:
            status, content_type, body = route()
        except Exception:
            log.exception("metrics endpoint: %s failed", target)
            return 500, TEXT, b"internal error\n", method == "HEAD"
        return status, content_type, body, method == "HEAD"

"""The Kafka clients in worker processes, so that a crash of librdkafka cannot take the console down.

librdkafka aborts the whole process on some internal assertions; one is reachable from the AdminClient
when requests time out while brokers stop answering and come back (librdkafka issue #3663,
``rd_kafka_enq_once_del_source_return: Assertion `eonce->refcnt > 0' failed``, seen in this project's
tests). :class:`IsolatedReader` has :class:`~pykbroker.console.data.ClusterReader`'s interface but runs
every call in a small pool of spawned worker processes, each with its own ClusterReader. A worker that
dies fails the calls it was running with an error page, and the next call gets a fresh pool; so does a
call that times out (its pool's workers are killed, since a hung call would keep its worker busy).
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from typing import Any

# Nothing heavy at module level: a worker imports this module before _init runs.
log = logging.getLogger(__name__)

WORKERS = 2
DEFAULT_TIMEOUT_S = 10.0  # data.DEFAULT_TIMEOUT_S, without importing data here
CLOSE_TIMEOUT_S = 10.0
_reader = None


def _init(bootstrap: str, timeout: float, client_config: dict | None, log_level: int) -> None:
    global _reader
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent stops us
    if "kio" not in sys.modules:  # kio builds Hypothesis strategies when it can: ~2 s and ~200 MB a worker
        sys.modules.setdefault("hypothesis", None)  # type: ignore[assignment]
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from pykbroker.console.data import ClusterReader

    _reader = ClusterReader(bootstrap, timeout=timeout, client_config=client_config)


def _call(method: str, args: tuple, kwargs: dict) -> Any:
    assert _reader is not None
    return getattr(_reader, method)(*args, **kwargs)


def _pid() -> int:
    return os.getpid()


class IsolatedReader:
    """ClusterReader's calls (cluster, topics, topic, topic_names, groups, group, coordination_problem,
    browse, create_topic, reset_offsets) run in worker processes."""

    CALLS = ("cluster", "topics", "topic", "topic_names", "groups", "group", "coordination_problem", "browse",
             "create_topic", "reset_offsets")

    def __init__(self, bootstrap: str, *, timeout: float = DEFAULT_TIMEOUT_S,
                 client_config: dict[str, Any] | None = None, workers: int = WORKERS,
                 call_timeout: float | None = None) -> None:
        self.bootstrap = bootstrap
        self.timeout = timeout
        # A call makes a few cluster requests in turn, each bounded by the timeout; a worker start
        # (spawn, imports) comes on top of the first.
        self.call_timeout = 6 * timeout + 30 if call_timeout is None else call_timeout
        self.client_config = client_config
        self.workers = workers
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self.restarts = 0

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init,
                    initargs=(self.bootstrap, self.timeout, self.client_config, logging.getLogger().level))
            return self._pool

    def _discard(self, pool: concurrent.futures.ProcessPoolExecutor, *, kill: bool = False) -> None:
        """The next call gets a new pool; ``kill``: end this pool's workers too (a hung call holds its
        worker forever, and with every worker hung each later call would time out)."""
        with self._lock:
            if self._pool is pool:
                self._pool = None
                self.restarts += 1
        processes = list((pool._processes or {}).values()) if kill else []
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            try:
                process.kill()
            except (OSError, ValueError):  # already gone / closed
                pass

    def worker_pids(self, timeout: float = 60) -> list[int]:
        """The workers' process ids (started if need be)."""
        pool = self._executor()
        for future in [pool.submit(_pid) for _ in range(self.workers)]:
            future.result(timeout=timeout)
        return [p.pid for p in (pool._processes or {}).values()]

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        from pykbroker.console.data import ConsoleError

        if method not in self.CALLS:
            raise AttributeError(method)
        pool = self._executor()
        try:
            future = pool.submit(_call, method, args, kwargs)
            return future.result(timeout=self.call_timeout)
        except BrokenProcessPool:
            self._discard(pool)
            log.error("a console worker process died (Kafka client crash); starting new ones")
            raise ConsoleError("the Kafka client process died (a librdkafka crash) and was restarted: "
                                    "try again", 502) from None
        except concurrent.futures.TimeoutError:
            # The call is stuck in its worker (a hung librdkafka call cannot be interrupted): replace the
            # pool, killing its workers, rather than leave a busy worker behind. Calls other pages were
            # running in that pool fail with 502 (BrokenProcessPool above) and can be retried.
            self._discard(pool, kill=True)
            log.error("%s: no answer from the Kafka client in time; starting new console workers", method)
            raise ConsoleError(f"{method}: no answer from the Kafka client in time", 504) from None

    def __getattr__(self, name: str) -> Any:
        if name in IsolatedReader.CALLS:
            return lambda *args, **kwargs: self.call(name, *args, **kwargs)
        raise AttributeError(name)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Stop the workers: idle ones at once, one still running a call within ``timeout`` seconds, else
        it is killed (a hung librdkafka call would otherwise keep the console from exiting)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None:
            return
        processes = list((pool._processes or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + timeout
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.warning("console worker %s did not stop within %g s: killed", process.pid, timeout)
                process.kill()
                process.join(5)

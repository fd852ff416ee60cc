"""A broker that stops answering (SIGSTOP: connections open, nothing read) must give error pages within
the console's timeout, never a hung request; when it answers again, so do the pages. A Kafka client that
crashes (librdkafka aborts the process on some internal assertions) costs an error page, not the console."""

from __future__ import annotations

import os
import signal

import pytest
from console_helpers import TOPIC, fill_broker, status, wait_for

from broker_process import BrokerProcess
from pykbroker.console.worker import IsolatedReader

pytestmark = pytest.mark.timeout(300)


def test_paused_broker_gives_error_pages_in_bounded_time(tmp_path, console_server):
    with BrokerProcess(tmp_path / "broker", log_level="info") as broker:
        fill_broker(broker.bootstrap)
        reader = IsolatedReader(broker.bootstrap, timeout=2)
        base = console_server(reader).url
        assert status(base, f"/topics/{TOPIC}")[0] == 200  # connections made while it answers
        os.kill(broker.process.pid, signal.SIGSTOP)
        try:
            # a page makes a few calls in turn, each bounded by the 2 s timeout (and the margin of the wait)
            for path in ("/", "/topics", f"/topics/{TOPIC}", "/groups", "/groups/billing",
                         f"/messages?topic={TOPIC}"):
                code, body, took = status(base, path)
                assert code in (502, 504) and 'class="error"' in body, (path, code)
                assert took < 30, (path, took)
        finally:
            os.kill(broker.process.pid, signal.SIGCONT)
        wait_for(lambda: status(base, "/topics")[0] == 200, "the topics page once the broker answers again", 60)
        code, body, _ = status(base, f"/messages?topic={TOPIC}&partition=0")
        assert code == 200 and "6 message(s)" in body

        # The client processes die (as on a librdkafka abort): an error page, then new ones serve
        restarts = reader.restarts  # librdkafka may already have aborted a worker above (issue #3663)
        for pid in reader.worker_pids():
            os.kill(pid, signal.SIGKILL)
        code, body, _ = status(base, "/topics")
        assert code == 502 and "Kafka client process died" in body
        code, body, _ = status(base, "/topics")
        assert code == 200 and TOPIC in body and reader.restarts == restarts + 1
        reader.close()

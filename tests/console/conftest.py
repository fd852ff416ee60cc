"""Fixtures for the web console's tests.

  console_broker   one pykbroker (tests/integration BrokerProcess) per module, with data: topic
                   ``orders`` (3 partitions, retention.ms set), keys, JSON values, headers, a ``<script>``
                   value and a binary one; consumer group ``billing`` with committed offsets (lag 4)
  console_server   start(reader_or_bootstrap, allow_writes=...) -> a ConsoleServer on a free port,
                   closed at teardown
  browser_page     a Playwright page in Debian's headless chromium (skips with the reason when chromium
                   or Playwright is absent)
  screenshots      shot(page, name): saves NAME.png in the test's output dir (printed), and into
                   $PYKBROKER_CONSOLE_SCREENSHOTS when set (the README's docs/console/ pictures)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
for _extra in (REPO_ROOT / "tests" / "integration", REPO_ROOT / "tests" / "cluster"):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))

from broker_process import BrokerProcess  # noqa: E402  (tests/integration is not a package)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
TOPIC = "orders"
GROUP = "billing"             # no members: committed offsets only, resettable
LIVE_GROUP = "live-readers"   # one active member
CLIENT_ID = "audit-reader"
SCRIPT_VALUE = b"<script>window.__pwned = 1</script><b>bold?</b>"
BINARY_VALUE = bytes(range(0, 40))


def fill_broker(bootstrap: str) -> dict:
    """The test data: what the pages must show."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(TOPIC, 3, 1, config={"retention.ms": "3600000"}),
                                   NewTopic("audit-log", 1, 1)], operation_timeout=30)
    for future in futures.values():
        future.result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    # partition 0: 6 JSON orders; partition 1: the <script> value; partition 2: a binary value
    for i in range(6):
        producer.produce(TOPIC, key=f"order-{i}", value=json.dumps({"id": i, "item": "widget", "qty": i + 1}),
                         headers=[("source", b"web-shop"), ("trace-id", f"t-{i}".encode())], partition=0)
    producer.produce(TOPIC, key="evil<key>", value=SCRIPT_VALUE, headers=[("x<h>", b"<i>hv</i>")], partition=1)
    producer.produce(TOPIC, key=None, value=BINARY_VALUE, partition=2)
    producer.produce("audit-log", key="a", value="plain text entry", partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    # committed: partition 0 at 2 (end 6: lag 4), partition 1 at 1 (end 1: lag 0)
    consumer.commit(offsets=[TopicPartition(TOPIC, 0, 2), TopicPartition(TOPIC, 1, 1)], asynchronous=False)
    consumer.close()
    return {"ends": {0: 6, 1: 1, 2: 1}, "committed": {0: 2, 1: 1}, "lag": 4}


def live_member(bootstrap: str):
    """A consumer of LIVE_GROUP that stays a member (librdkafka heartbeats in its own thread), having read
    and committed the one audit-log message. The caller closes it."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": LIVE_GROUP, "client.id": CLIENT_ID,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["audit-log"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            consumer.commit(message, asynchronous=False)
            return consumer
    consumer.close()
    raise AssertionError("the live consumer read nothing within 60 s")


@pytest.fixture(scope="module")
def console_broker(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("console-broker"), log_level="info")
    with broker:
        broker.expected = fill_broker(broker.bootstrap)
        member = live_member(broker.bootstrap)
        try:
            yield broker
        finally:
            member.close()


@pytest.fixture
def console_server():
    """start(bootstrap or reader, allow_writes=False): a bootstrap string gets the IsolatedReader that
    `pykbroker console` uses (clients in worker processes)."""
    from pykbroker.console.server import ConsoleServer
    from pykbroker.console.worker import IsolatedReader

    servers, readers = [], []

    def start(reader, *, allow_writes: bool = False) -> ConsoleServer:
        if isinstance(reader, str):
            reader = IsolatedReader(reader, timeout=15)
            readers.append(reader)
        server = ConsoleServer(("127.0.0.1", 0), reader, allow_writes=allow_writes)
        server.start_background()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
    for reader in readers:
        reader.close()


@pytest.fixture
def browser_page():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent (Debian package chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            context.set_default_timeout(15_000)
            page = context.new_page()
            page.dialogs = []
            page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
            yield page
        finally:
            browser.close()


@pytest.fixture
def screenshots(tmp_path):
    out = tmp_path / "screenshots"
    out.mkdir()
    print(f"\nconsole screenshots: {out}")
    publish = os.environ.get("PYKBROKER_CONSOLE_SCREENSHOTS")

    def shot(page, name: str) -> Path:
        path = out / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        if publish:
            Path(publish).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(publish) / path.name)
        return path

    return shot


def wait_for(condition, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)

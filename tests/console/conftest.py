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

import os
import shutil
from pathlib import Path

import pytest
from console_helpers import CHROMIUM, CHROMIUM_ARGS, fill_broker, live_member

from broker_process import BrokerProcess  # tests/integration, on sys.path through console_helpers

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

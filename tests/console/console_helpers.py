"""Shared pieces of the console tests: the test data (fill_broker, live_member), reading pages over HTTP
(text, rows), waiting on conditions, the size cells. Not conftest.py, so that test modules can import it by a
name no other test directory uses."""

from __future__ import annotations

import concurrent.futures
import json
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
for _extra in (REPO_ROOT / "tests" / "integration", REPO_ROOT / "tests" / "cluster"):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))

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


SIZE_SHOWN = re.compile(r"\d+ B|\d+\.\d (KiB|MiB)")


def assert_size_cell(cell: str, host: str, port: int) -> None:
    """A size cell: "—" where the broker does not answer DescribeLogDirs (pykbroker before it implements
    the API), a size where it does."""
    from pykbroker.console.logdirs import log_dir_sizes

    with concurrent.futures.ThreadPoolExecutor(1) as thread:  # off any event loop (Playwright's sync API runs one)
        sizes = thread.submit(log_dir_sizes, [(0, host, port)], 10).result()[0]
    if sizes is None:
        assert cell == "—"
    else:
        assert SIZE_SHOWN.fullmatch(cell), cell


def wait_for(condition, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def text(base: str, path: str) -> str:
    """A page's visible text (tags dropped, whitespace collapsed); the page must answer 200."""
    with urllib.request.urlopen(base + path, timeout=60) as response:
        assert response.status == 200
        body = response.read().decode()
    body = re.sub(r"<style>.*?</style>", "", body, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body))


def status(base: str, path: str) -> tuple[int, str, float]:
    """(HTTP status, body, seconds taken) of a GET, whatever the status."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(base + path, timeout=120) as response:
            return response.status, response.read().decode(), time.monotonic() - started
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), time.monotonic() - started


def rows(base: str, path: str) -> list[list[str]]:
    """The text of every table body row of a page, cell by cell."""
    with urllib.request.urlopen(base + path, timeout=60) as response:
        body = response.read().decode()
    return [[re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S) if "<td" in row]


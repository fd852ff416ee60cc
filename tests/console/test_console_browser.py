"""The web console in a real browser (Debian's headless chromium driven by Playwright) against a real
pykbroker: every page loaded and read as a person would read it, the writes with --allow-writes, and their
absence without it. Screenshots of each page go to the test's output dir (path printed)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request

import pytest
from console_helpers import CLIENT_ID, GROUP, LIVE_GROUP, REPO_ROOT, SCRIPT_VALUE, TOPIC, assert_size_cell, wait_for

from broker_process import free_port

pytestmark = pytest.mark.timeout(300)


def cells(page, selector: str = "table") -> list[list[str]]:
    """The body rows of the first table matching selector, as text."""
    return page.locator(selector).first.evaluate(
        "t => [...t.tBodies[0].rows].map(r => [...r.cells].map(c => c.innerText.trim()))")


def table_after(page, heading: str) -> list[list[str]]:
    return cells(page, f"h2:text-is('{heading}') ~ table")


@pytest.fixture
def cli_console(console_broker):
    """`pykbroker console` as a user starts it (read-only: the default)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    process = subprocess.Popen([sys.executable, "-m", "pykbroker", "console", "-b", console_broker.bootstrap,
                                "--port", str(port)], env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"

    def healthy():
        if process.poll() is not None:
            raise AssertionError(f"console exited {process.returncode}: {process.stderr.read().decode()}")
        try:
            return urllib.request.urlopen(base + "/healthz", timeout=2).status == 200
        except OSError:
            return False

    try:
        wait_for(healthy, "the console's /healthz", timeout=60)
        yield base
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_every_page_read_only(console_broker, cli_console, browser_page, screenshots):
    page, base, expected = browser_page, cli_console, console_broker.expected

    # Overview: cluster id, the broker with host:port, the controller
    response = page.goto(base + "/")
    assert response.status == 200
    assert page.locator("#cluster-id").inner_text().strip() not in ("", "—")
    assert page.locator("#controller").inner_text().strip() == "1"
    assert cells(page, "h2:text-is('Brokers') + table") == [["1", console_broker.bootstrap, "—", "controller"]]
    assert "read-only" in page.locator("header").inner_text()
    screenshots(page, "overview")

    # Topics: names, partitions, replication factor, under-replicated, size (— until DescribeLogDirs), messages
    page.click("header >> text=Topics")
    rows = {row[0]: row for row in cells(page)}
    assert rows[TOPIC][1:4] + rows[TOPIC][5:6] == ["3", "1", "0", "8"]
    assert rows["audit-log"][1:4] + rows["audit-log"][5:6] == ["1", "1", "0", "1"]
    assert_size_cell(rows[TOPIC][4], *console_broker.address)
    assert page.locator("form").count() == 0 and page.get_by_text("Create a topic").count() == 0
    screenshots(page, "topics")

    # Topic detail: per partition leader, replicas, ISR, offsets; a non-default config marked
    page.click(f"table >> text={TOPIC}")
    assert page.locator("#topic-name").inner_text() == TOPIC
    partitions = table_after(page, "Partitions")
    assert [row[:7] for row in partitions] == [
        [str(p), "1", "1", "1", "0", str(end), str(end)] for p, end in expected["ends"].items()]
    configs = {row[0]: row for row in table_after(page, "Configs")}
    assert configs["retention.ms"][1:] == ["3600000", "DYNAMIC_TOPIC_CONFIG"]
    assert configs["cleanup.policy"][1:] == ["delete", "default"]
    assert page.locator("tr.nondefault").count() == 1
    screenshots(page, "topic")
    page.click("h2:text-is('Partitions') ~ table >> a:text-is('2')")  # a partition's messages
    assert page.locator(".msg").count() == 1 and page.locator(".msg").get_attribute("data-partition") == "2"

    # Consumer groups: state, members, total lag
    page.click("header >> text=Consumer groups")
    groups = {row[0]: row for row in cells(page)}
    assert groups[GROUP][1:5] == ["classic", "EMPTY", "0", str(expected["lag"])]
    assert groups[LIVE_GROUP][1:5] == ["classic", "STABLE", "1", "0"]
    screenshots(page, "groups")

    # Group detail: committed offset, end offset and lag per partition
    page.click(f"table >> text={GROUP}")
    assert page.locator("#total-lag").inner_text() == "4"
    offsets = table_after(page, "Offsets")
    assert [row[:5] for row in offsets] == [[TOPIC, "0", "2", "6", "4"], [TOPIC, "1", "1", "1", "0"]]
    assert page.get_by_text("Reset offsets").count() == 0
    screenshots(page, "group-billing")

    # A live member: client id, host, assignment
    page.goto(base + f"/groups/{LIVE_GROUP}")
    members = table_after(page, "Members")
    assert len(members) == 1 and members[0][0] == CLIENT_ID and "127.0.0.1" in members[0][1]
    assert members[0][3] == "audit-log/0"
    assert [row[:6] for row in table_after(page, "Offsets")] == [["audit-log", "0", "1", "1", "0", CLIENT_ID]]
    screenshots(page, "group-live")

    # Message browser through its form: the newest first, key, pretty JSON value, headers, timestamp
    page.click("header >> text=Messages")
    page.select_option("select[name=topic]", TOPIC)
    page.fill("input[name=partition]", "0")
    page.click("button:text('Show')")
    messages = page.locator(".msg")
    assert messages.count() == 6
    first = messages.first
    assert first.get_attribute("data-offset") == "5"
    assert first.locator("pre.key").inner_text() == "order-5"
    assert first.locator("pre.value").inner_text() == json.dumps({"id": 5, "item": "widget", "qty": 6}, indent=2)
    assert "(json, " in first.locator(".part").nth(1).inner_text()
    assert cells(first, "table") == [["source", "web-shop"], ["trace-id", "t-5"]]
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z", first.locator(".ts").inner_text())
    assert [m.get_attribute("data-offset") for m in messages.all()] == ["5", "4", "3", "2", "1", "0"]
    screenshots(page, "messages")

    # From an offset, oldest first, N messages
    page.goto(base + f"/messages?topic={TOPIC}&partition=0&start=offset&position=3&limit=2&order=oldest")
    assert [m.get_attribute("data-offset") for m in page.locator(".msg").all()] == ["3", "4"]

    # HTML in a key, value and header is shown as text, never run or rendered
    page.goto(base + f"/messages?topic={TOPIC}&partition=1")
    message = page.locator(".msg").first
    assert message.locator("pre.value").inner_text() == SCRIPT_VALUE.decode()
    assert message.locator("pre.key").inner_text() == "evil<key>"
    assert cells(message, "table") == [["x<h>", "<i>hv</i>"]]
    assert page.locator("script").count() == 0 and page.locator("main b, main i").count() == 0
    assert page.evaluate("window.__pwned") is None and page.dialogs == []
    screenshots(page, "messages-html-escaped")

    # A binary value as hex; the null key as null
    page.goto(base + f"/messages?topic={TOPIC}&partition=2")
    message = page.locator(".msg").first
    assert message.locator("pre.key").inner_text() == "null"
    assert message.locator("pre.value").inner_text().startswith("00000000  00 01 02 03")
    assert "(hex, 40 bytes)" in message.inner_text()
    # ... and any value as hex on request; values cut to max_bytes, said so
    page.goto(base + f"/messages?topic={TOPIC}&partition=0&limit=1&format=hex&max_bytes=16")
    value = page.locator(".msg pre.value").inner_text()
    assert value.startswith("00000000  7b 22 69 64 22") and len(value.splitlines()) == 1
    assert "first 16 shown" in page.locator(".msg").inner_text()
    # All partitions, capped at N
    page.goto(base + f"/messages?topic={TOPIC}&limit=3")
    assert page.locator(".msg").count() == 3
    # From a timestamp in the future: nothing
    page.goto(base + f"/messages?topic={TOPIC}&start=timestamp&position=2999-01-01T00:00")
    assert page.locator(".msg").count() == 0 and "0 message(s)" in page.locator("#summary").inner_text()

    # Errors are pages with a message
    response = page.goto(base + "/topics/no-such-topic")
    assert response.status == 404 and "no topic named 'no-such-topic'" in page.locator(".error").inner_text()
    response = page.goto(base + "/groups/no-such-group")
    assert response.status == 404 and "no consumer group named 'no-such-group'" in page.locator(".error").inner_text()
    response = page.goto(base + f"/messages?topic={TOPIC}&partition=7")
    assert response.status == 404 and "has no partition 7" in page.locator(".error").inner_text()
    response = page.goto(base + f"/messages?topic={TOPIC}&limit=many")
    assert response.status == 400
    screenshots(page, "error")

    # Browsing joined no group and committed nothing
    page.goto(base + "/groups")
    assert sorted(row[0] for row in cells(page)) == [GROUP, LIVE_GROUP]

    # Writes are refused without --allow-writes, even when posted by hand
    for path in ("/topics", f"/groups/{GROUP}/reset"):
        response = page.request.post(base + path, form={"name": "sneaky", "mode": "earliest"})
        assert response.status == 403 and "read-only" in response.text()
    page.goto(base + "/topics")
    assert "sneaky" not in page.locator("table").inner_text()


def test_writes_with_allow_writes(console_broker, console_server, browser_page, screenshots):
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    page, bootstrap = browser_page, console_broker.bootstrap
    base = console_server(bootstrap, allow_writes=True).url
    admin = AdminClient({"bootstrap.servers": bootstrap})

    # Create a topic with a config through the form
    page.goto(base + "/topics")
    assert "writes enabled" in page.locator("header").inner_text()
    page.fill("input[name=name]", "created-in-console")
    page.fill("input[name=partitions]", "4")
    page.fill("textarea[name=configs]", "max.message.bytes=2000000\nretention.ms=7200000")
    screenshots(page, "create-topic-form")
    page.click("button:text('Create topic')")
    assert page.locator("#topic-name").inner_text() == "created-in-console"
    assert "Topic created-in-console created." in page.locator(".notice").inner_text()
    assert len(table_after(page, "Partitions")) == 4
    metadata = admin.list_topics(timeout=15)
    assert len(metadata.topics["created-in-console"].partitions) == 4
    resource = ConfigResource(ResourceType.TOPIC, "created-in-console")
    configs = admin.describe_configs([resource])[resource].result(15)
    assert configs["max.message.bytes"].value == "2000000" and configs["retention.ms"].value == "7200000"

    # A bad create is an error page, and the server goes on
    page.goto(base + "/topics")
    page.fill("input[name=name]", "created-in-console")
    page.click("button:text('Create topic')")
    assert "TOPIC_ALREADY_EXISTS" in page.locator(".error").inner_text()

    # Reset a group's offsets: a group of its own with committed offsets and no members
    group = "reset-me"
    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    committer.commit(offsets=[TopicPartition(TOPIC, 0, 5), TopicPartition(TOPIC, 1, 1)], asynchronous=False)
    committer.close()

    def committed():
        reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
        try:
            parts = reader.committed([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)], timeout=15)
            return {tp.partition: tp.offset for tp in parts}
        finally:
            reader.close()

    page.goto(base + f"/groups/{group}")
    page.select_option("select[name=mode]", "earliest")
    page.click("button:text('Reset offsets')")
    assert "Offsets reset" in page.locator(".notice").inner_text()
    assert [row[:5] for row in table_after(page, "Offsets")] == [[TOPIC, "0", "0", "6", "6"], [TOPIC, "1", "0", "1", "1"]]
    assert committed() == {0: 0, 1: 0}

    # To an offset, for one topic: every partition of it, clamped to each partition's range
    page.select_option("select[name=topic]", TOPIC)
    page.select_option("select[name=mode]", "offset")
    page.fill("input[name=position]", "3")
    page.click("button:text('Reset offsets')")
    assert committed() == {0: 3, 1: 1}
    assert [row[:5] for row in table_after(page, "Offsets")] == [
        [TOPIC, "0", "3", "6", "3"], [TOPIC, "1", "1", "1", "0"], [TOPIC, "2", "1", "1", "0"]]
    screenshots(page, "group-reset")

    # Latest, and a timestamp after every message (= the end)
    page.select_option("select[name=mode]", "timestamp")
    page.fill("input[name=position]", "2999-01-01T00:00:00")
    page.click("button:text('Reset offsets')")
    assert committed() == {0: 6, 1: 1}

    # A group with an active member cannot be reset: Kafka's error, shown
    page.goto(base + f"/groups/{LIVE_GROUP}")
    page.select_option("select[name=mode]", "earliest")
    page.click("button:text('Reset offsets')")
    assert "the group has active members" in page.locator(".error").inner_text()
    screenshots(page, "reset-refused")

    # A form posted from another site is refused
    response = page.request.post(base + "/topics", form={"name": "cross-site"},
                                 headers={"Origin": "http://evil.example"})
    assert response.status == 403
    assert "cross-site" not in admin.list_topics(timeout=15).topics

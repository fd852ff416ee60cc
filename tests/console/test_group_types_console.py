"""The console shows both kinds of group: the groups page has a Type column ("classic", "consumer") and a
consumer group's state as the broker lists it; a consumer group's page shows its group and assignment epochs
and each member's epoch (ConsumerGroupDescribe, pykbroker.ctl.group_kinds)."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer
from console_helpers import CLIENT_ID, LIVE_GROUP, rows, text


def test_groups_pages_show_both_kinds(console_broker, console_server):
    group = f"modern-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": console_broker.bootstrap, "group.id": group, "group.protocol": "consumer",
                         "client.id": CLIENT_ID, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["audit-log"])
    try:
        deadline = time.monotonic() + 60
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.2)
        assert consumer.assignment(), "the consumer-protocol member got no assignment"
        base = console_server(console_broker.bootstrap).url
        listed = {row[0]: row for row in rows(base, "/groups")}
        assert listed[group][1:4] == ["consumer", "STABLE", "1"], listed[group]
        assert listed[LIVE_GROUP][1:4] == ["classic", "STABLE", "1"], listed[LIVE_GROUP]

        page = text(base, f"/groups/{group}")
        assert "Type consumer State STABLE Group epoch 1 Assignment epoch 1 Assignor uniform" in page, page
        (member,) = [row for row in rows(base, f"/groups/{group}") if row[0] == CLIENT_ID]
        assert member[3:] == ["1", "audit-log/0"], member
        classic = text(base, f"/groups/{LIVE_GROUP}")
        assert "Type classic State STABLE Assignor" in classic and "Group epoch" not in classic
    finally:
        consumer.close()

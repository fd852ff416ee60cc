"""``pykbroker group list|describe`` with both kinds of group: a confluent-kafka 2.16 consumer with
``group.protocol=consumer`` and a classic one, listed with their types and states (ListGroups v5: librdkafka
alone calls a consumer group Assigning or Reconciling "Unknown"), a consumer group described with its group and
assignment epochs and each member's epoch (ConsumerGroupDescribe at its coordinator)."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, TopicPartition

from ctl_runner import ctl
from test_ctl import create_topic, group_consumer, poll_values, produce


def test_group_list_and_describe_show_both_kinds(shared_broker, topic_name):
    create_topic(shared_broker, topic_name, 2)
    produce(shared_broker, topic_name, [(p, None, b"m%d" % i, None) for p in (0, 1) for i in range(3)])
    modern, classic = f"modern-{uuid.uuid4().hex[:8]}", f"classic-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": shared_broker.bootstrap, "group.id": modern, "group.protocol": "consumer",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False, "client.id": "modern-client"})
    consumer.subscribe([topic_name])
    old = group_consumer(shared_broker, classic, topic_name)
    try:
        poll_values(consumer, 6)
        consumer.commit(offsets=[TopicPartition(topic_name, 0, 2)], asynchronous=False)
        poll_values(old, 6)

        listed = ctl(shared_broker.bootstrap, "group", "list", "--format", "json")
        assert listed.returncode == 0, listed
        rows = {row["group"]: row for row in listed.json()}
        assert (rows[modern]["type"], rows[modern]["state"]) == ("consumer", "Stable"), rows[modern]
        assert (rows[classic]["type"], rows[classic]["state"]) == ("classic", "Stable"), rows[classic]
        table = ctl(shared_broker.bootstrap, "group", "list")
        assert ["GROUP", "TYPE", "STATE"] in table.rows() and [modern, "consumer", "Stable"] in table.rows(), table

        described = ctl(shared_broker.bootstrap, "group", "describe", modern, "--format", "json")
        assert described.returncode == 0, described
        data = described.json()
        assert (data["type"], data["state"], data["members"]) == ("consumer", "Stable", 1), data
        assert data["group_epoch"] >= 1 and data["assignment_epoch"] == data["group_epoch"], data
        assert data["assignor"] == "uniform", data
        by_partition = {row["partition"]: row for row in data["partitions"]}
        assert sorted(by_partition) == [0, 1]
        assert {row["member_epoch"] for row in by_partition.values()} == {data["group_epoch"]}
        assert (by_partition[0]["current_offset"], by_partition[0]["lag"], by_partition[0]["client_id"]) == (
            2, 1, "modern-client")
        table = ctl(shared_broker.bootstrap, "group", "describe", modern)
        assert ["type", "consumer"] in table.rows() and ["group", "epoch", str(data["group_epoch"])] in table.rows()
        assert ["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "MEMBER-ID", "MEMBER-EPOCH",
                "CLIENT-ID", "HOST"] in table.rows(), table

        old_data = ctl(shared_broker.bootstrap, "group", "describe", classic, "--format", "json").json()
        assert (old_data["type"], old_data["state"], old_data["group_epoch"]) == ("classic", "Stable", None)
    finally:
        consumer.close()
        old.close()

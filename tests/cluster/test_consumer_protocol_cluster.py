"""The consumer group protocol (KIP-848) on a 3-broker cluster: a group of confluent-kafka consumers with
``group.protocol=consumer`` whose coordinator is killed goes on with the new coordinator, which loads the group
from its records in ``__consumer_offsets`` (replicated to the ISR before each heartbeat was answered): the same
member, at its epoch, commits there and nothing is read twice or lost."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition

from test_replication_faults import (  # noqa: F401 (cluster, rng, topic: fixtures)
    _consume_and_commit, cluster, kill_coordinator, rng, topic,
)
from workload import consumer_config, produce_batch

pytestmark = pytest.mark.timeout(300)


def test_a_consumer_group_goes_on_after_its_coordinator_dies(cluster, topic, rng):
    cluster.create_topic(topic, partitions=3, replication_factor=3)
    produced, refused = produce_batch(cluster.bootstrap, topic, [0, 1, 2], "g", 300)
    assert not refused
    group = f"group-{topic}"
    settings = {"group.id": group, "group.protocol": "consumer", "auto.offset.reset": "earliest"}
    member = Consumer(consumer_config(cluster.bootstrap, **settings))
    lost, assigned = [], []
    member.subscribe([topic], on_assign=lambda _c, parts: assigned.append(len(parts)),
                     on_lost=lambda _c, parts: lost.append(len(parts)))
    seen = _consume_and_commit(member, rng.randint(60, 140), 90)
    kill_coordinator(cluster, group)
    remaining = len({(r.partition, r.offset) for r in produced} - {(r.partition, r.offset) for r in seen})
    seen += _consume_and_commit(member, remaining, 120)  # the same member, its commits accepted at its epoch
    partitions = [TopicPartition(topic, p) for p in range(3)]
    committed = {tp.partition: tp.offset for tp in member.committed(partitions, timeout=30)}
    member.close()
    ends = {p: 1 + max(r.offset for r in produced if r.partition == p) for p in range(3)}
    assert committed == ends
    read = [(r.partition, r.offset) for r in seen]
    assert len(read) == len(set(read)) == len(produced)  # nothing read twice, nothing lost
    # The member was never fenced: the new coordinator knew it (a fenced member loses its partitions and
    # gets them assigned again).
    assert (lost, assigned) == ([], [3])

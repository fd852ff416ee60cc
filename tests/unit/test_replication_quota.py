"""Replication throttles (replication/quota.py) with a fake config source: parsing of the throttled-replicas
configs, Kafka's windowed rate, the leader answering a throttled follower with no records, and the follower
leaving throttled partitions out of its fetches.

Run: python3 -m pytest -q tests/unit/test_replication_quota.py
"""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

from pykbroker.replication.fetcher import FetchState, ReplicaFetcherManager, _SourceFetcher
from pykbroker.replication.quota import (
    ALL_REPLICAS,
    FOLLOWER,
    LEADER,
    UNLIMITED,
    ReplicationQuota,
    broker_rate,
    parse_throttled_partitions,
)
from tests.unit.test_replication import Clock, _follower_fetch, _manager, batch


class FakeConfigs:
    """The fake config source: a rate per side and topic overrides, changeable at any time."""

    def __init__(self) -> None:
        self.rate = UNLIMITED
        self.topics: dict[str, dict[str, str]] = {}

    def topic_configs(self, topic: str) -> dict[str, str] | None:
        return self.topics.get(topic)


class SecondsClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def quota(side: str, configs: FakeConfigs, clock=None, broker_id: int = 1) -> ReplicationQuota:
    return ReplicationQuota(side, broker_id, lambda: configs.rate, configs.topic_configs,
                            clock=clock or SecondsClock())


def test_throttled_replicas_are_parsed_as_kafka_does():
    assert parse_throttled_partitions("*", 1) == ALL_REPLICAS
    assert parse_throttled_partitions(" 0:1, 1:2 ,2:1", 1) == {0, 2}
    assert parse_throttled_partitions("0:2,1:3", 1) == frozenset()
    assert parse_throttled_partitions("", 1) == frozenset()
    assert parse_throttled_partitions("junk,x:1,3:1", 1) == {3}

    configs = FakeConfigs()
    leader = quota(LEADER, configs)
    assert not leader.is_throttled("t", 0)  # unknown topic
    configs.topics["t"] = {"leader.replication.throttled.replicas": "0:1,1:2",
                           "follower.replication.throttled.replicas": "*"}
    assert leader.is_throttled("t", 0) and not leader.is_throttled("t", 1)
    assert quota(FOLLOWER, configs).is_throttled("t", 7)
    configs.topics["t"]["leader.replication.throttled.replicas"] = "1:1"  # a config change applies at once
    assert not leader.is_throttled("t", 0) and leader.is_throttled("t", 1)


def test_rate_is_measured_over_kafkas_windows_and_compared_with_the_bound():
    configs, clock = FakeConfigs(), SecondsClock()
    q = quota(LEADER, configs, clock)
    q.record(10_000)
    assert not q.is_quota_exceeded()  # Long.MAX_VALUE: unthrottled whatever the rate
    configs.rate = 1000.0
    # A first burst counts over 10 windows (Kafka's Rate with 11 samples of 1 s): 10 000 B / 10 s = 1000 B/s.
    assert q.rate() == 1000.0 and not q.is_quota_exceeded()
    q.record(1)
    assert q.is_quota_exceeded()
    clock.now += 11  # every window has expired
    assert q.rate() == 0.0 and not q.is_quota_exceeded()
    for _ in range(20):  # 500 B/s for 20 s: under the bound
        q.record(500)
        clock.now += 1
    assert 400 < q.rate() <= 550 and not q.is_quota_exceeded()
    configs.rate = 100.0  # a lower bound applies at the next check
    assert q.is_quota_exceeded()


def copy_time(data: int, fetch: int, rate: float) -> float:
    """Seconds a copy of ``data`` bytes takes through one quota, fetches of ``fetch`` bytes checked before
    each fetch and recorded after it (Kafka's follower), 10 ms between checks while over the quota."""
    configs, clock = FakeConfigs(), SecondsClock()
    configs.rate = rate
    q, start, copied = quota(FOLLOWER, configs, clock), clock.now, 0
    while copied < data:
        if q.is_quota_exceeded():
            clock.now += 0.01
            continue
        q.record(min(fetch, data - copied))
        copied += min(fetch, data - copied)
    return clock.now - start


def test_a_copy_of_ten_windows_of_the_rate_plus_one_fetch_is_not_slowed_a_bigger_one_waits_a_window_out():
    """What tests/cluster/test_reassignment.py's min_throttled_copy_s rests on: the check before a fetch lets
    rate × 10 s plus one fetch through at once (a throttle is no hard cap on a short copy, as in Kafka); more
    than rate × 11 s plus one fetch waits for the first window to expire (11 s)."""
    rate, fetch = 100_000.0, 1_048_576
    assert copy_time(int(rate * 10) + 100_000, 100_000, rate) == 0.0  # 10 fetches reach the bound, one more
    assert copy_time(int(rate * 10) + fetch, fetch, rate) < 1.0  # over it after the first: ~0.5 s
    assert copy_time(int(rate * 11) + fetch + 1, fetch, rate) >= 11.0
    assert copy_time(int(rate * 11) + fetch + 1, 1000, rate) >= 11.0  # small fetches: about the rate
    assert copy_time(5_000_000, fetch, rate) >= 11.0


def test_broker_rate_prefers_dynamic_configs_and_falls_back_to_unlimited():
    static = SimpleNamespace(get=lambda name: (_ for _ in ()).throw(KeyError(name)))
    assert broker_rate(SimpleNamespace(config=static), "leader.replication.throttled.rate")() == UNLIMITED
    dynamic = SimpleNamespace(value=lambda name: 2048 if name == "leader.replication.throttled.rate" else None)
    broker = SimpleNamespace(config=static, dynamic_configs=dynamic)
    assert broker_rate(broker, "leader.replication.throttled.rate")() == 2048.0
    assert broker_rate(broker, "follower.replication.throttled.rate")() == UNLIMITED
    with_static = SimpleNamespace(config=SimpleNamespace(get=lambda name: 4096))
    assert broker_rate(with_static, "follower.replication.throttled.rate")() == 4096.0


def test_the_leader_sends_nothing_to_a_throttled_follower_outside_the_isr_while_over_quota(tmp_path):
    clock = Clock()
    leader_rm = _manager(tmp_path, clock, broker_id=1)
    assert leader_rm.become_leader("t", 0, 1, (1, 2), (1, 2, 3), 0).name == "none"
    leader = leader_rm.partition("t", 0)
    leader.append(batch(50), clock())
    configs = FakeConfigs()
    q = leader_rm.leader_quota = quota(LEADER, configs)
    configs.rate = 10.0  # B/s: one fetch of the 50 records exceeds it

    _, _, records = _follower_fetch(leader_rm, 3, 0, leader_epoch=1)
    assert records and q.rate() == 0.0  # not throttled: nothing recorded
    configs.topics["t"] = {"leader.replication.throttled.replicas": "0:1"}
    _, _, records = _follower_fetch(leader_rm, 3, 0, leader_epoch=1)
    assert records and q.rate() == len(records) / 10  # under the quota: sent, and counted
    _, _, records = _follower_fetch(leader_rm, 3, 0, leader_epoch=1)
    assert records == b""  # over the quota, and replica 3 is not in the ISR
    assert leader.follower_state(3).log_end_offset == 0  # its fetch state still moved
    _, _, records = _follower_fetch(leader_rm, 2, 0, leader_epoch=1)
    assert records  # replica 2 is in the ISR: never throttled
    configs.rate = UNLIMITED
    _, _, records = _follower_fetch(leader_rm, 3, 0, leader_epoch=1)
    assert records
    leader_rm.log_manager.shutdown()


def test_the_follower_leaves_throttled_partitions_out_of_its_fetch_while_over_quota(tmp_path):
    clock = Clock()
    follower_rm = _manager(tmp_path, clock, broker_id=3)
    for p in (0, 1):
        assert follower_rm.become_follower("t", p, 1, 1, (1, 2), (1, 2, 3), 0).name == "none"
    config = SimpleNamespace(get=lambda name: {
        "replica.fetch.wait.max.ms": 500, "replica.fetch.min.bytes": 1, "replica.fetch.response.max.bytes": 1 << 20,
        "replica.fetch.max.bytes": 1 << 20, "replica.fetch.backoff.ms": 1000, "replica.socket.timeout.ms": 30000,
    }[name])
    topic_id = uuid.uuid4()

    async def scenario():
        manager = ReplicaFetcherManager(3, follower_rm, lambda b: None, lambda t: topic_id, config)
        configs = FakeConfigs()
        q = manager.quota = quota(FOLLOWER, configs, broker_id=3)
        configs.topics["t"] = {"follower.replication.throttled.replicas": "0:3"}
        configs.rate = 10.0
        q.record(1000)  # over the bound
        source = _SourceFetcher(manager, 1)
        states = [FetchState("t", p, 1, 0, 1, -1) for p in (0, 1)]
        request, sent = source._build(states)
        assert sorted(p.partition for t in request.topics for p in t.partitions) == [1]
        assert states[0].delayed_until > 0 and states[1].delayed_until == 0
        states[0].in_sync = True  # caught up to the leader's HWM: not throttled
        request, _ = source._build(states)
        assert sorted(p.partition for t in request.topics for p in t.partitions) == [0, 1]
        states[0].in_sync = False
        configs.rate = UNLIMITED
        request, _ = source._build(states)
        assert sorted(p.partition for t in request.topics for p in t.partitions) == [0, 1]
        await manager.close()

    asyncio.run(scenario())
    follower_rm.log_manager.shutdown()

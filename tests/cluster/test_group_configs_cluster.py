"""Group configs (the GROUP config resource, groups/configs.py) in a 2-broker ZooKeeper cluster: a group's
overrides altered through one broker are stored at /config/groups/<sanitized group id> with a change
notification, described by the other broker, read again at a restart, and their deletion reaches every broker."""

from __future__ import annotations

import uuid

from kio.schema.describe_configs.v4 import request as dcfg
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8

from broker_cluster import BrokerCluster
from cluster_helpers import wait_for
from pykbroker.cluster.zk_metadata import ZkMetadata
from pykbroker.cluster.zookeeper import KafkaZkClient
from pykbroker.groups.configs import GroupConfigs
from pykbroker.groups.consumer.coordinator import ConsumerGroupConfig
from broker_process import send_request, wait_until
from test_dynamic_configs_cluster import alter as alter_configs

GROUP = 32
TIMEOUT = 60.0
SESSION, HEARTBEAT = "consumer.session.timeout.ms", "consumer.heartbeat.interval.ms"


def alter(address, name: str, configs: dict[str, str | None]) -> tuple[int, str | None]:
    return alter_configs(address, GROUP, name, configs)


def described(address, name: str) -> dict[str, tuple[str | None, int]]:
    request = dcfg.DescribeConfigsRequest(resources=(dcfg.DescribeConfigsResource(
        resource_type=i8(GROUP), resource_name=name, configuration_keys=None),),
        include_synonyms=False, include_documentation=False)
    result = send_request(address, request).results[0]
    assert result.error_code == ErrorCode.none
    return {c.name: (c.value, c.config_source) for c in result.configs}


def test_group_configs_through_zookeeper(zk_connect, tmp_path):
    with BrokerCluster(zk_connect, tmp_path, n=2) as cluster:
        address = {i: broker.address for i, broker in cluster.brokers.items()}
        group = "team/a b*"  # sanitized in its znode's name, as Kafka's Sanitizer
        assert alter(address[1], group, {SESSION: "50000", HEARTBEAT: "6000"}) == (ErrorCode.none, None)
        assert cluster.zk_json("/config/groups/team%2Fa%20b%2A") == {
            "version": 1, "config": {SESSION: "50000", HEARTBEAT: "6000"}}
        notifications = [cluster.zk_json(f"/config/changes/{child}")
                         for child in sorted(cluster.zk().get_children("/config/changes"))]
        assert {"version": 2, "entity_path": "groups/team%2Fa%20b%2A"} in notifications
        overridden = {SESSION: ("50000", 8), HEARTBEAT: ("6000", 8)}
        wait_until(lambda: described(address[2], group) == overridden, "broker 2 describes the group's configs",
                   TIMEOUT)
        # Broker 2 validates as broker 1 does (below group.consumer.min.session.timeout.ms).
        assert alter(address[2], group, {HEARTBEAT: "15000", SESSION: "45000"}) == (ErrorCode.none, None)
        assert alter(address[2], group, {SESSION: "15000"})[0] == ErrorCode.invalid_config

        cluster.stop(2)
        cluster.brokers[2].start(wait=False)
        cluster.brokers[2].wait_ready(TIMEOUT)
        cluster.wait_ready(TIMEOUT)
        assert described(address[2], group) == {SESSION: ("45000", 8), HEARTBEAT: ("15000", 8)}

        assert alter(address[2], group, {SESSION: None, HEARTBEAT: None}) == (ErrorCode.none, None)
        wait_until(lambda: described(address[1], group) == {SESSION: ("45000", 5), HEARTBEAT: ("5000", 5)},
                   "broker 1 sees the deletion", TIMEOUT)

        # Group ids "." and ".." are path steps to ZooKeeper: their znodes are /config/groups/%2E and %2E%2E.
        for dots, znode in ((".", "%2E"), ("..", "%2E%2E")):
            assert alter(address[1], dots, {HEARTBEAT: "7000"}) == (ErrorCode.none, None), dots
            assert cluster.zk_json(f"/config/groups/{znode}") == {"version": 1, "config": {HEARTBEAT: "7000"}}
            wait_until(lambda: described(address[2], dots)[HEARTBEAT] == ("7000", 8),
                       f"broker 2 describes group {dots!r}", TIMEOUT)
        assert described(address[1], "...") == {SESSION: ("45000", 5), HEARTBEAT: ("5000", 5)}
        # A group id whose znode name would pass 1 KiB: refused before ZooKeeper is asked.
        (code, message) = alter(address[1], "g" * 1025, {HEARTBEAT: "7000"})
        assert (code, message) == (ErrorCode.invalid_request, "Group id too long for its configs in ZooKeeper: "
                                   "1025 bytes sanitized, at most 1024.")
        assert alter(address[1], "g" * 1024, {HEARTBEAT: "7000"}) == (ErrorCode.none, None)


def test_a_newer_group_config_read_during_a_write_is_not_overwritten(zk_connect, run_async):
    """The backend's listener is the one path that applies a group's configs: when another broker's newer write
    is read (its notification) before this broker's own write returns, ZkMetadata's staleness guard keeps the newer
    one, and GroupConfigs must not apply the older one behind its back."""
    async def main():
        zk = KafkaZkClient(zk_connect, session_timeout_ms=6000)
        metadata = ZkMetadata(zk, 1, "cid", inter_broker_listener="PLAINTEXT")
        await zk.start()
        await metadata.start()
        try:
            configs = GroupConfigs(ConsumerGroupConfig(), metadata)
            group = f"race-{uuid.uuid4().hex[:8]}"
            write = metadata._write_entity_config

            async def write_then_a_newer_one_is_read(entity_type, name, config, version):
                await write(entity_type, name, config, version)
                # another broker's newer write, whose notification (and this write's) this broker reads first
                last = await zk.set_entity_config("groups", name, {HEARTBEAT: "6000"})
                sequence = int(last.rsplit("_", 1)[1])
                await wait_for(lambda: metadata.last_config_change >= sequence, what=f"notification {last} read")

            metadata._write_entity_config = write_then_a_newer_one_is_read
            await configs.alter_async(group, {HEARTBEAT: "7000"})
            assert configs.heartbeat_interval_ms(group) == 6000
            assert metadata.group_configs()[group] == {HEARTBEAT: "6000"}
        finally:
            await metadata.close()
            await zk.close()

    run_async(main())

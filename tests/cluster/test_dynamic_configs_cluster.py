"""Dynamic configs in a 3-broker ZooKeeper cluster: a config altered through one broker is written to
ZooKeeper in Kafka's layout (/config/topics/<t>, /config/brokers/<default>, change notifications), seen by
DescribeConfigs on the other brokers, and still there after every broker restarted."""

from __future__ import annotations

from kio.schema.describe_configs.v4 import request as dcfg
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v1 import request as iac
from kio.static.primitive import i8

from broker_cluster import BrokerCluster
from broker_process import send_request, wait_until

TOPIC, BROKER = 2, 4
TIMEOUT = 60.0


def alter(address, kind: int, name: str, configs: dict[str, str | None]) -> tuple[int, str | None]:
    request = iac.IncrementalAlterConfigsRequest(resources=(iac.AlterConfigsResource(
        resource_type=i8(kind), resource_name=name,
        configs=tuple(iac.AlterableConfig(name=key, config_operation=i8(0 if value is not None else 1), value=value)
                      for key, value in configs.items())),), validate_only=False)
    response = send_request(address, request).responses[0]
    return response.error_code, response.error_message


def describe(address, kind: int, name: str, key: str) -> tuple[str | None, int] | None:
    request = dcfg.DescribeConfigsRequest(resources=(dcfg.DescribeConfigsResource(
        resource_type=i8(kind), resource_name=name, configuration_keys=(key,)),),
        include_synonyms=True, include_documentation=False)
    result = send_request(address, request).results[0]
    if result.error_code != ErrorCode.none:
        return None
    entries = [(c.value, c.config_source) for c in result.configs]
    return entries[0] if entries else None


def test_configs_altered_through_one_broker_reach_the_others_and_survive_a_restart(zk_connect, tmp_path):
    with BrokerCluster(zk_connect, tmp_path, n=3) as cluster:
        topic = "dynamic-configs"
        cluster.create_topic(topic, partitions=1, replication_factor=3)
        address = {i: broker.address for i, broker in cluster.brokers.items()}

        assert alter(address[1], TOPIC, topic, {"retention.ms": "3600000"}) == (ErrorCode.none, None)
        assert alter(address[1], BROKER, "", {"log.retention.ms": "7200000", "log.segment.bytes": "2097152"}) \
            == (ErrorCode.none, None)
        assert alter(address[2], BROKER, "2", {"follower.replication.throttled.rate": "1048576"}) == (ErrorCode.none, None)
        # broker 1 may not change broker 2's own configs (Kafka's admin client sends those to broker 2)
        assert alter(address[1], BROKER, "2", {"log.segment.bytes": "1048576"})[0] == ErrorCode.invalid_request

        # Kafka's znodes
        assert cluster.zk_json(f"/config/topics/{topic}") == {"version": 1, "config": {"retention.ms": "3600000"}}
        assert cluster.zk_json("/config/brokers/<default>") == {
            "version": 1, "config": {"log.retention.ms": "7200000", "log.segment.bytes": "2097152"}}
        assert cluster.zk_json("/config/brokers/2")["config"] == {"follower.replication.throttled.rate": "1048576"}
        notifications = [cluster.zk_json(f"/config/changes/{child}")
                         for child in sorted(cluster.zk().get_children("/config/changes"))]
        assert {"version": 2, "entity_path": "brokers/<default>"} in notifications
        assert {"version": 2, "entity_path": f"topics/{topic}"} in notifications

        def everyone_sees_it() -> bool:
            return all(
                describe(address[i], TOPIC, topic, "retention.ms") == ("3600000", 1)
                and describe(address[i], TOPIC, topic, "segment.bytes") == ("2097152", 3)  # DYNAMIC_DEFAULT_BROKER
                and describe(address[i], BROKER, str(i), "log.retention.ms") == ("7200000", 3)
                for i in (1, 2, 3)
            ) and describe(address[2], BROKER, "2", "follower.replication.throttled.rate") == ("1048576", 2) \
                and describe(address[3], BROKER, "3", "follower.replication.throttled.rate")[1] == 5

        wait_until(everyone_sees_it, "every broker describes the altered configs", TIMEOUT)

        for broker_id in (1, 2, 3):
            cluster.stop(broker_id)
        for broker_id in (1, 2, 3):
            cluster.brokers[broker_id].start(wait=False)
        for broker_id in (1, 2, 3):
            cluster.brokers[broker_id].wait_ready(TIMEOUT)
        cluster.wait_ready(TIMEOUT)
        wait_until(everyone_sees_it, "every restarted broker describes the altered configs", TIMEOUT)

        # a deletion through broker 3 reaches broker 1
        assert alter(address[3], BROKER, "", {"log.segment.bytes": None}) == (ErrorCode.none, None)
        wait_until(lambda: describe(address[1], TOPIC, topic, "segment.bytes") == ("1073741824", 5),
                   "broker 1 sees the deleted default", TIMEOUT)


def test_a_lowered_cluster_default_retention_deletes_old_segments_on_every_replica(zk_connect, tmp_path):
    from confluent_kafka import Producer

    with BrokerCluster(zk_connect, tmp_path, n=3, overrides={"log.retention.check.interval.ms": 200}) as cluster:
        topic = "retention-everywhere"
        cluster.create_topic(topic, partitions=1, replication_factor=3, config={"segment.bytes": "2048"})
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 0})
        for index in range(40):  # one batch each: segments of 2048 bytes roll every few batches
            producer.produce(topic, value=b"x" * 200, key=str(index).encode())
            assert producer.flush(TIMEOUT) == 0

        def segments(broker_id: int) -> int:
            return len(list((cluster.brokers[broker_id].data_dir / f"{topic}-0").glob("*.log")))

        wait_until(lambda: all(segments(i) > 2 for i in (1, 2, 3)), "every replica has rolled segments", TIMEOUT)
        assert alter(cluster.brokers[1].address, BROKER, "", {"log.retention.ms": "1"}) == (ErrorCode.none, None)
        wait_until(lambda: all(segments(i) == 1 for i in (1, 2, 3)), "old segments deleted on every replica", TIMEOUT)


def test_kafka_broker_configs_pykbroker_does_not_use_are_stored_in_zookeeper_and_seen_by_every_broker(zk_connect, tmp_path):
    """Issue 18 (librdkafka 0081/0092): Kafka 3.7.1's config names, per broker, as the cluster default and on a topic,
    through ZooKeeper's /config znodes; a per-broker config as the cluster default is refused as Kafka does."""
    with BrokerCluster(zk_connect, tmp_path, n=2) as cluster:
        topic = "deprecated-configs"
        cluster.create_topic(topic, partitions=1, replication_factor=2)
        address = {i: broker.address for i, broker in cluster.brokers.items()}
        assert alter(address[1], BROKER, "1", {"sasl.kerberos.min.time.before.relogin": "58000"}) == (ErrorCode.none, None)
        assert alter(address[1], BROKER, "", {"num.io.threads": "9"}) == (ErrorCode.none, None)
        assert alter(address[2], BROKER, "", {"sasl.kerberos.min.time.before.relogin": "58000"}) == (
            ErrorCode.invalid_request, "Cannot update these configs at default cluster level, broker id must be specified: "
                                       "Set(sasl.kerberos.min.time.before.relogin)")
        assert alter(address[2], TOPIC, topic, {"message.format.version": "0.10.0.0"}) == (ErrorCode.none, None)
        assert cluster.zk_json("/config/brokers/1")["config"] == {"sasl.kerberos.min.time.before.relogin": "58000"}
        assert cluster.zk_json("/config/brokers/<default>")["config"] == {"num.io.threads": "9"}
        assert cluster.zk_json(f"/config/topics/{topic}")["config"] == {"message.format.version": "0.10.0.0"}
        wait_until(lambda: describe(address[2], BROKER, "2", "num.io.threads") == ("9", 3),
                   "broker 2 sees the cluster default", TIMEOUT)
        wait_until(lambda: describe(address[1], TOPIC, topic, "message.format.version") == ("0.10.0.0", 1),
                   "broker 1 sees the topic config", TIMEOUT)
        assert describe(address[1], BROKER, "1", "sasl.kerberos.min.time.before.relogin") == ("58000", 2)
        assert describe(address[2], BROKER, "2", "sasl.kerberos.min.time.before.relogin") == ("60000", 5)

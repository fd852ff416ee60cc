"""Brokers that authenticate to each other with SASL: 3 real brokers on a real ZooKeeper whose inter-broker
listener (``inter.broker.listener.name=INTERNAL``) is a SASL_PLAINTEXT listener, beside a PLAINTEXT listener the
clients use. Controller requests, follower fetches and AlterPartition go through INTERNAL, each connection
authenticated with ``sasl.mechanism.inter.broker.protocol`` and the listener's JAAS entry.

  replication over SASL           SCRAM-SHA-512 (the broker user added with ``pykbroker scram add --zookeeper``
                                  before any broker starts) and PLAIN: RF3 topics reach their full ISR, an
                                  acks=all idempotent producer runs, the leader is SIGKILLed, a new one takes
                                  over, nothing acknowledged is lost
  session lifetime (KIP-368)      with a small ``connections.max.reauth.ms`` the listener closes a connection
                                  at its first request after the session expired; the brokers' own clients
                                  reconnect before that, so replication goes on and no inter-broker request
                                  fails for it
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid

import pytest

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install kazoo, or the project's test extra)")
pytest.importorskip("confluent_kafka")

from broker_cluster import BrokerCluster, wait_until  # noqa: E402
from checker import check  # noqa: E402
from pykbroker.devcluster import child_env, pykbroker_command  # noqa: E402
from test_inter_broker_tls_cluster import (  # noqa: E402
    REPLICATED, replicate_through_a_killed_leader, with_internal_listeners,
)
from workload import SeqProducer, read_log  # noqa: E402

FAILOVER_S = 60.0
ALL = {1, 2, 3}
SECRET = "broker-secret"
LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                 "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}

pytestmark = pytest.mark.timeout(400)


def sasl_overrides(mechanism: str, **extra) -> dict:
    users = f' user_broker="{SECRET}"' if mechanism == "PLAIN" else ""  # PLAIN's server side checks these
    return {
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:SASL_PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",
        "sasl.mechanism.inter.broker.protocol": mechanism,
        "listener.name.internal.sasl.enabled.mechanisms": mechanism,
        f"listener.name.internal.{mechanism.lower()}.sasl.jaas.config":
            f'{LOGIN_MODULES[mechanism]} required username="broker" password="{SECRET}"{users};',
        **REPLICATED,
        **extra,
    }


def sasl_cluster(zk_connect: str, tmp_path, mechanism: str, **extra) -> BrokerCluster:
    if mechanism.startswith("SCRAM-"):  # the brokers' own user, before any broker starts (as kafka-configs.sh --zookeeper)
        done = subprocess.run(pykbroker_command("scram", "add", "--zookeeper", zk_connect,
                                                f"{mechanism}=[name=broker,password={SECRET}]"),
                              env=child_env(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    cluster = BrokerCluster(zk_connect, tmp_path, n=3, overrides=sasl_overrides(mechanism, **extra))
    cluster.internal = with_internal_listeners(cluster)
    return cluster


def logs(cluster: BrokerCluster, broker_id: int) -> str:
    return cluster.brokers[broker_id].log_path.read_text(errors="replace")


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_replication_over_sasl_survives_a_killed_leader(zk_connect, tmp_path, mechanism):
    cluster = sasl_cluster(zk_connect, tmp_path, mechanism)
    try:
        with cluster:
            replicate_through_a_killed_leader(cluster, "SASL_PLAINTEXT")
            # every broker authenticated its peers: no refused SASL exchange anywhere
            for broker_id in ALL:
                assert "failed authentication" not in logs(cluster, broker_id)
    finally:
        cluster.close()


def test_a_short_sasl_session_lifetime_does_not_break_replication(zk_connect, tmp_path):
    """connections.max.reauth.ms=3000: the INTERNAL listener closes a connection at its first request after
    3 s. The brokers' clients take the lifetime from SaslAuthenticate and move to a new connection before it
    ends, so over several lifetimes no request is refused for an expired session, no inter-broker request
    fails, the ISR stays full and nothing acknowledged is lost."""
    lifetime_s = 3.0
    cluster = sasl_cluster(zk_connect, tmp_path, "SCRAM-SHA-512", **{"connections.max.reauth.ms": int(lifetime_s * 1000)})
    expired = re.compile(r"SASL session expired")
    # an inter-broker request that failed: the controller channel's, a fetcher's, AlterPartition's lines
    failed = re.compile(r"(to broker \d+ failed|to leader \d+ failed|fetch from leader \d+ failed|"
                        r"AlterPartition to controller \d+ failed)")
    try:
        with cluster:
            topic = f"ib-reauth-{uuid.uuid4().hex[:8]}"
            cluster.create_topic(topic, partitions=2, replication_factor=3)
            for index in (0, 1):
                cluster.wait_for_isr(topic, index, ALL, timeout=FAILOVER_S)
            seen = {i: len(logs(cluster, i)) for i in ALL}  # what the brokers logged while starting up is not counted
            producer = SeqProducer(cluster.bootstrap, topic, [0, 1], "p0", rate=100)
            producer.start()
            try:
                start = time.monotonic()
                # four lifetimes of replication (fetchers send several requests a second on each connection)
                wait_until(lambda: time.monotonic() - start >= 4 * lifetime_s and len(producer.acked) >= 300,
                           "four session lifetimes of acknowledged records", 120)
            finally:
                producer.stop()
                producer.close()
            assert producer.unflushed == 0
            assert not producer.bad_errors(), producer.bad_errors()[:5]
            for index in (0, 1):
                assert set(cluster.partition(topic, index).isr) == ALL
            result = check(producer.acked, read_log(cluster.bootstrap, topic, [0, 1]))
            assert result.ok, result.summary()
            for broker_id in ALL:
                text = logs(cluster, broker_id)[seen[broker_id]:]
                assert not expired.findall(text), [line for line in text.splitlines() if expired.search(line)][:5]
                assert not failed.findall(text), [line for line in text.splitlines() if failed.search(line)][:5]
            # the clients did reconnect for it, several times
            assert sum(logs(cluster, i)[seen[i]:].count("reconnecting before its SASL session ends") for i in ALL) >= 3
    finally:
        cluster.close()

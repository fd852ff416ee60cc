"""Brokers that reach each other over TLS: 3 real brokers on a real ZooKeeper whose inter-broker listener
(``inter.broker.listener.name=INTERNAL``) is an SSL listener requiring client certificates (mutual TLS), beside
a PLAINTEXT listener the clients use. Controller requests, follower fetches, AlterPartition and transaction
markers all go through INTERNAL with the broker's own certificate, checked against the advertised host.

  replicated topics over mTLS         RF3 topics reach their full ISR; an acks=all idempotent producer runs,
                                      the leader is SIGKILLed, a new one takes over, nothing acknowledged is
                                      lost; a transaction commits (markers over TLS)
  a broker that trusts another CA     it starts (its own settings are consistent) but cannot join the
                                      replication: its peers and it log the failed TLS handshake in one clear
                                      line each, naming the broker and the reason, instead of hanging quietly
"""

from __future__ import annotations

import os
import re
import uuid

import pytest

pytest.importorskip("cryptography", reason="certificates for these tests are built with cryptography")
confluent_kafka = pytest.importorskip("confluent_kafka")

from broker_cluster import BrokerCluster, wait_until  # noqa: E402
from cluster_helpers import add_client_listener  # noqa: E402
from checker import check  # noqa: E402
from tls_helpers import standard_pki  # noqa: E402
from workload import SeqProducer, read_log  # noqa: E402

FAILOVER_S = 60.0
ALL = {1, 2, 3}

pytestmark = pytest.mark.timeout(400)


# what every inter-broker security cluster test runs with: RF3 everywhere, quick failure detection
REPLICATED = {
    "zookeeper.session.timeout.ms": 6000,
    "min.insync.replicas": 2, "default.replication.factor": 3,
    "offsets.topic.replication.factor": 3, "offsets.topic.num.partitions": 3,
    "transaction.state.log.num.partitions": 2, "transaction.state.log.replication.factor": 3,
    "replica.lag.time.max.ms": 10000, "group.initial.rebalance.delay.ms": 0,
    "auto.create.topics.enable": "false",
}


def tls_overrides(pki) -> dict:
    return {
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:SSL",
        "inter.broker.listener.name": "INTERNAL",
        "listener.name.internal.ssl.client.auth": "required",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": pki.broker_pem_file,
        "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file,
        **REPLICATED,
    }


def with_internal_listeners(cluster: BrokerCluster) -> dict[int, int]:
    """Give each broker an INTERNAL listener on a free port next to its PLAINTEXT one; the ports (the tests map
    INTERNAL to its security protocol in listener.security.protocol.map)."""
    return add_client_listener(cluster, "INTERNAL")


def replicate_through_a_killed_leader(cluster: BrokerCluster, protocol: str) -> None:
    """The brokers registered INTERNAL with ``protocol`` and replicate through it: an RF3 topic reaches its
    full ISR, an acks=all idempotent producer runs while partition 0's leader is SIGKILLed, nothing
    acknowledged is lost, and the killed broker comes back and catches up."""
    for broker_id, port in cluster.internal.items():
        registration = cluster.zk_json(f"/brokers/ids/{broker_id}")
        assert f"INTERNAL://127.0.0.1:{port}" in registration["endpoints"]
        assert registration["listener_security_protocol_map"]["INTERNAL"] == protocol
    topic = f"ib-{protocol.lower()}-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, partitions=2, replication_factor=3)  # full ISR: the fetchers replicate
    old_leader = cluster.wait_for_leader(topic, 0)
    producer = SeqProducer(cluster.bootstrap, topic, [0, 1], "p0", rate=200)
    producer.start()
    try:
        producer.wait_acked(300, 60)
        cluster.kill(old_leader)  # SIGKILL
        cluster.wait_for_leader(topic, 0, exclude={old_leader}, timeout=FAILOVER_S)
        cluster.wait_for_isr(topic, 0, ALL - {old_leader}, timeout=FAILOVER_S)
        producer.wait_acked(len(producer.acked) + 200, 60)
    finally:
        producer.stop()
        producer.close()
    assert producer.unflushed == 0
    assert not producer.bad_errors(), producer.bad_errors()[:5]
    result = check(producer.acked, read_log(cluster.bootstrap, topic, [0, 1]))
    assert result.ok, result.summary()
    cluster.start_broker(old_leader)
    cluster.wait_for_isr(topic, 0, ALL, timeout=FAILOVER_S)


@pytest.fixture
def pki(tmp_path):
    (tmp_path / "pki").mkdir()
    return standard_pki(tmp_path / "pki")


@pytest.fixture
def cluster(zk_connect, tmp_path, pki):
    """Three brokers with an INTERNAL mTLS inter-broker listener, not started yet (their logs are attached to
    a failure report); closed at teardown."""
    brokers = BrokerCluster(zk_connect, tmp_path, n=3, overrides=tls_overrides(pki))
    brokers.internal = with_internal_listeners(brokers)
    brokers.pki = pki
    try:
        yield brokers
    finally:
        brokers.close()


def test_replication_over_mutual_tls_survives_a_killed_leader(cluster):
    with cluster:
        replicate_through_a_killed_leader(cluster, "SSL")
        # transaction markers go to the partitions' leaders over TLS too
        txn_topic = f"ib-txn-{uuid.uuid4().hex[:8]}"
        cluster.create_topic(txn_topic, partitions=1, replication_factor=3)
        transactional = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap,
                                                  "transactional.id": f"t-{uuid.uuid4().hex[:6]}"})
        transactional.init_transactions(60)
        transactional.begin_transaction()
        transactional.produce(txn_topic, b"committed")
        transactional.commit_transaction(60)
        consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                                             "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
        try:
            consumer.subscribe([txn_topic])
            seen = []
            wait_until(lambda: (m := consumer.poll(0.5)) is not None and m.error() is None and seen.append(m.value())
                       is None, "the committed transactional record", 60)
            assert seen == [b"committed"]
        finally:
            consumer.close()


def test_a_broker_that_trusts_another_ca_fails_with_a_clear_log_line(cluster, tmp_path):
    (tmp_path / "other").mkdir()
    other = standard_pki(tmp_path / "other", name="Other CA")
    internal = cluster.internal
    # broker 3's settings are consistent in themselves (its certificate and trust are of the other CA), so it
    # starts; but the others' certificates are not trusted by it, nor its by them.
    cluster.brokers[3].overrides.update({"ssl.keystore.location": other.broker_pem_file,
                                         "ssl.truststore.location": other.ca_file})
    for broker in cluster.brokers.values():
        broker.start(wait=False)
    for broker in cluster.brokers.values():
        broker.wait_ready(60)  # each answers its clients

    def logs(broker_id: int) -> str:
        return cluster.brokers[broker_id].log_path.read_text(errors="replace")

    # whoever is controller, a connection between broker 3 and another fails its handshake, and the broker
    # that tried says so in one line naming the peer, the listener and the reason
    failure = re.compile(r"broker (\d): connection to broker (\d) at 127\.0\.0\.1:(\d+) failed authentication "
                         r"\(client [^)]*, listener INTERNAL \(SSL\)\): TLS handshake with 127\.0\.0\.1:\d+ "
                         r"failed: certificate verify failed")

    def failures() -> list[re.Match]:
        return [m for i in ALL for m in failure.finditer(logs(i)) if "3" in (m.group(1), m.group(2))]

    wait_until(failures, "a log line about the failed TLS handshake between broker 3 and another", 90)
    for match in failures():
        assert int(match.group(3)) == internal[int(match.group(2))]  # the peer's INTERNAL listener
    # the broker that was tried refuses the handshake, or sees the peer give up, with a line of its own
    refused = re.compile(r"closing connection from 127\.0\.0\.1:\d+: (TLS handshake failed|the peer closed it "
                         r"during the TLS handshake)")
    wait_until(lambda: any(refused.search(logs(int(m.group(2)))) for m in failures()),
               "the refusing broker's log line", 90)
    # after at least 10 refused attempts: one line per pool, peer and reason, not one per retry (controller
    # channel, fetchers, AlterPartition, markers, controlled shutdown: at most a handful per pair), and the
    # controller channel's warning once per peer and reason (its repeats are at INFO)
    refusals = lambda: sum(len(refused.findall(logs(i))) for i in ALL)  # noqa: E731
    wait_until(lambda: refusals() >= 10, "10 refused handshakes", 90)
    assert len(failures()) <= 10, [m.group(0) for m in failures()]
    channel = re.compile(r"WARNING \S+: controller (\d): \w+ to broker (\d) failed \((.*)\); resending")
    warned = [m.groups() for i in ALL for m in channel.finditer(logs(i))]
    assert len(warned) == len(set(warned)), warned
    # nothing else broke: brokers 1 and 2 still serve, broker 3 is alive
    assert all(cluster.brokers[i].is_running() for i in ALL)


def test_a_peer_that_refuses_this_brokers_certificate_is_reported_and_retried_with_backoff(cluster, tmp_path):
    """Broker 3 trusts both CAs but presents a certificate of another CA, which brokers 1 and 2 refuse. Under
    TLS 1.3 the server refuses a client certificate after the client's side of the handshake finished, so only
    the first answer tells: broker 3 (the controller) must report the refusal as an authentication failure and
    back off (reconnect.backoff.max.ms, 1 s), not reconnect every 50 ms with a bare "connection lost"."""
    import time

    (tmp_path / "other").mkdir()
    other = standard_pki(tmp_path / "other", name="Other CA")
    both = tmp_path / "both-cas.pem"
    both.write_text(open(cluster.pki.ca_file).read() + open(other.ca_file).read())
    cluster.brokers[3].overrides.update({"ssl.keystore.location": other.broker_pem_file,
                                         "ssl.truststore.location": str(both)})
    cluster.brokers[3].start()
    assert cluster.wait_for_controller() == 3  # broker 3 is the one whose certificate is refused
    for broker_id in (1, 2):
        cluster.brokers[broker_id].start(wait=False)
    for broker_id in (1, 2):
        cluster.brokers[broker_id].wait_ready(60)

    def logs(broker_id: int) -> str:
        return cluster.brokers[broker_id].log_path.read_text(errors="replace")

    refused = re.compile(r"closing connection from 127\.0\.0\.1:\d+: TLS handshake failed")

    def refusals() -> int:  # brokers 1 and 2 refuse nobody else: broker 3's attempts
        return sum(len(refused.findall(logs(i))) for i in (1, 2))

    reported = re.compile(r"broker 3: connection to broker ([12]) at 127\.0\.0\.1:\d+ failed authentication "
                          r"\(client [^)]*, listener INTERNAL \(SSL\)\): TLS connection to 127\.0\.0\.1:\d+ "
                          r"closed by the peer before its first answer .*the peer probably did not accept this "
                          r"broker's certificate")
    wait_until(lambda: {m.group(1) for m in reported.finditer(logs(3))} == {"1", "2"},
               "broker 3's line about each peer refusing its certificate", 90)
    # the rate of attempts over a window of at least 8 s: with the backoff grown to 1 s (+-20 %), about one
    # attempt per second per peer; a reset backoff would make about ten
    start, first = time.monotonic(), refusals()
    wait_until(lambda: time.monotonic() - start >= 8 and refusals() >= first, "the measuring window", 30)
    rate = (refusals() - first) / (time.monotonic() - start)
    assert rate <= 2 * 2.0, f"{rate:.1f} refused handshakes per second from broker 3"
    # after at least 10 refused attempts, broker 3 said so once per pool, peer and reason, and the controller
    # channel warned once per peer (its retries after are at INFO)
    wait_until(lambda: refusals() >= first + 10, "10 refused attempts", 60)
    assert len(reported.findall(logs(3))) <= 2 * 2, reported.findall(logs(3))
    channel = re.compile(r"WARNING \S+: controller 3: \w+ to broker [12] failed")
    assert 1 <= len(channel.findall(logs(3))) <= 2 * 2, channel.findall(logs(3))
    assert all(cluster.brokers[i].is_running() for i in ALL)


def test_a_new_certificate_on_the_inter_broker_listener_without_a_restart(cluster, pki, tmp_path):
    """kafka-configs.sh sets broker 1's INTERNAL key store to a new certificate (same subject and names): new
    connections to broker 1 get it, broker 1's own client presents it, and the cluster goes on replicating
    over mutual TLS when connections are made anew (broker 2 restarted)."""
    import ssl
    import socket

    from cryptography import x509

    from kafka_tools import kafka_tools_or_skip
    from tls_helpers import chain_pem, key_pem

    tools = kafka_tools_or_skip()
    with cluster:
        key, cert = pki.issue("broker")
        path = tmp_path / "broker-1-new.pem"
        path.write_text(key_pem(key) + chain_pem(cert, pki))
        tools.run("kafka-configs.sh", "--bootstrap-server", cluster.bootstrap, "--entity-type", "brokers",
                  "--entity-name", "1", "--alter", "--add-config", f"listener.name.internal.ssl.keystore.location={path}")

        def served_serial() -> int:
            context = ssl.create_default_context(cafile=pki.ca_file)
            context.load_cert_chain(pki.client_pem_file)  # INTERNAL requires a client certificate
            with context.wrap_socket(socket.create_connection(("127.0.0.1", cluster.internal[1]), timeout=10),
                                     server_hostname="127.0.0.1") as sock:
                return x509.load_der_x509_certificate(sock.getpeercert(binary_form=True)).serial_number

        # applied once stored: when broker 1 is notified of the change
        wait_until(lambda: served_serial() == cert.serial_number, "the new certificate served", 30)
        # broker 1's own client took it too (same CA and DN as the old one: only the serial tells)
        wait_until(lambda: f"Created new CLIENT SSL context with keystore SecurityStore(type=PEM, path={path}) "
                           f"(certificate serial {cert.serial_number})"
                           in cluster.brokers[1].log_path.read_text(errors="replace"),
                   "broker 1's inter-broker client's new context", 30)
        cluster.restart(2)  # its connections to broker 1, and broker 1's to it, are made anew
        cluster.wait_ready()
        topic = f"ib-reload-{uuid.uuid4().hex[:8]}"
        cluster.create_topic(topic, partitions=3, replication_factor=3)  # every partition's full ISR, over mTLS
        assert all(cluster.brokers[i].is_running() for i in ALL)

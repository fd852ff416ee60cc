"""A cluster broker takes requests only once it is registered in ZooKeeper, as Kafka's KafkaServer.startup
enables request processing after the registration: before that its metadata cache is empty, and a Metadata
answer listing no broker makes librdkafka (>= 2.10) drop every broker it knows, with the requests it had in
flight (a fault run's consumer then read nothing while a killed broker restarted and waited for its previous
ZooKeeper session to expire)."""

from __future__ import annotations

import contextlib
import signal
import time

import pytest

pytest.importorskip("kazoo", reason="kazoo is not installed")

from kazoo.client import KazooClient

from broker_cluster import ClusterBroker, wait_until
from broker_process import ProtocolError, send_request
from kio.schema.metadata.v12.request import MetadataRequest


def metadata_brokers(broker: ClusterBroker, timeout: float) -> list[int]:
    answer = send_request(broker.address, MetadataRequest(topics=(), allow_auto_topic_creation=False,
                                                          include_topic_authorized_operations=False),
                          timeout=timeout)
    return sorted(int(b.node_id) for b in answer.brokers)


@contextlib.contextmanager
def waiting_for_registration(zk_connect: str, tmp_path, session_timeout_ms: int):
    """(ZooKeeper session holding /brokers/ids/1, as a killed process's session does until it times out;
    broker 1 started and waiting for that registration to go)."""
    hosts, _, chroot = zk_connect.partition("/")
    holder = KazooClient(hosts=hosts, timeout=10)
    holder.start(timeout=10)
    broker = ClusterBroker(tmp_path / "broker-1", 1, zk_connect, {"zookeeper.session.timeout.ms": session_timeout_ms})
    try:
        holder.create(f"/{chroot}/brokers/ids/1", b"", ephemeral=True, makepath=True)
        broker.start(wait=False)
        wait_until(lambda: "still registered by an earlier ZooKeeper session" in broker.log_path.read_text(
            errors="replace"), "the broker to wait for the registration", 30)
        yield holder, broker
    finally:
        holder.stop()
        holder.close()
        broker.stop()


def test_a_broker_waiting_for_its_registration_answers_no_client_until_registered(zk_connect, tmp_path):
    with waiting_for_registration(zk_connect, tmp_path, 6000) as (holder, broker):
        with pytest.raises((OSError, ProtocolError)):  # accepted into the backlog, not answered
            metadata_brokers(broker, timeout=1.0)

        holder.stop()  # the old session ends: the broker registers, then answers
        seen = []
        wait_until(lambda: seen.append(metadata_brokers(broker, timeout=5.0)) or seen[-1] == [1],
                   "the registered broker to list itself", 30)


def test_sigterm_while_waiting_for_the_registration_stops_the_broker_at_once(zk_connect, tmp_path):
    """A restarted broker waits for its previous session's registration to expire (up to 1.5 session
    timeouts): SIGTERM (or Ctrl-C) meanwhile ends the wait, and the broker exits cleanly without serving."""
    with waiting_for_registration(zk_connect, tmp_path, 30000) as (_, broker):
        started = time.monotonic()
        broker.process.send_signal(signal.SIGTERM)
        status = broker.process.wait(timeout=40)
        took = time.monotonic() - started
        log = broker.log_path.read_text(errors="replace")
        assert status == 0, log
        assert took < 15, f"exit took {took:.1f} s (the wait is 46 s)"  # before: the whole wait, then exit 1
        assert "not serving" in log and "stopped cleanly" in log, log
        assert "listening on" not in log

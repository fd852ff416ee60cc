"""Helpers shared by the cluster tests (tests/cluster is on sys.path when pytest imports them)."""

from __future__ import annotations

import asyncio
import time


async def wait_for(predicate, timeout: float = 15.0, what: str = "condition"):
    """Await until predicate() (a value or a coroutine) is truthy and return it; AssertionError after timeout s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def add_client_listener(cluster, name: str) -> dict[int, int]:
    """Give every broker of a BrokerCluster (not started yet) a second listener ``name`` (a security protocol of
    the default listener.security.protocol.map) on a free port, beside its PLAINTEXT one, which stays first: it is
    the inter-broker listener. Returns broker id -> that listener's port."""
    from broker_process import free_port

    ports = {}
    for broker_id, broker in cluster.brokers.items():
        ports[broker_id] = free_port()
        listeners = f"PLAINTEXT://127.0.0.1:{broker.port},{name}://127.0.0.1:{ports[broker_id]}"
        command = broker.command
        broker.command = lambda command=command, listeners=listeners: [
            listeners if arg.startswith("PLAINTEXT://") else arg for arg in command()]
    return ports


def produce_through_listener(ports: dict[int, int], settings: dict, prefix: str, count: int = 10) -> str:
    """Through broker 1's client listener (``ports`` from add_client_listener, client ``settings``): Metadata
    names every broker's port of that listener, then v0..v(count-1) are produced (acks=all) to a new topic,
    whose name is returned."""
    import uuid

    import confluent_kafka
    from confluent_kafka.admin import AdminClient

    bootstrap = f"127.0.0.1:{ports[1]}"
    brokers = AdminClient({"bootstrap.servers": bootstrap, **settings}).list_topics(timeout=60).brokers
    assert sorted((b.id, b.port) for b in brokers.values()) == sorted(ports.items())
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", **settings})
    for index in range(count):
        producer.produce(topic, f"v{index}".encode())
    assert producer.flush(60) == 0
    return topic

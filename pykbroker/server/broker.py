"""The composition root: builds the broker's parts from a BrokerConfig, serves, and shuts down cleanly.

Start-up order matters for durability: logs are loaded (and recovered) before anything is hosted,
producer state is rebuilt from the logs, committed offsets are replayed, and only then does the
listener accept connections. Shutdown stops accepting, closes connections, flushes every log and writes
the clean-shutdown marker.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path

from pykbroker.cluster.metadata import EmbeddedMetadata
from pykbroker.cluster.producer_ids import ProducerIdAllocator, ProducerRegistry
from pykbroker.cluster.topic_admin import TopicAdmin
from pykbroker.config import BrokerConfig
from pykbroker.groups.coordinator import GroupConfig, GroupCoordinator
from pykbroker.groups.offset_store import OffsetStore
from pykbroker.log.files import raise_descriptor_limit
from pykbroker.log.manager import LogManager
from pykbroker.replication.replica_manager import ReplicaManager
from pykbroker.server.connection import KafkaConnection
from pykbroker.server.dispatch import load_handlers

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker_id = config.broker_id
        data_dir = Path(config.data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = data_dir
        self.metadata = EmbeddedMetadata(data_dir, config.broker_id, config.advertised_host, config.advertised_port)
        self.log_manager = LogManager(
            data_dir,
            fsync=config.fsync,
            flush_interval_ms=int(config.get("log.flush.interval.ms") or 1000),
            retention_check_interval_ms=int(config.get("log.retention.check.interval.ms")),
        )
        self.replicas = ReplicaManager(self.log_manager, config.broker_id, lambda topic: self.topics.log_config(topic))
        self.topics = TopicAdmin(config, self.metadata, self.replicas)
        self.producer_ids = ProducerRegistry(ProducerIdAllocator(data_dir / "producer-id-block"))
        self.offsets_partitions = int(config.get("offsets.topic.num.partitions"))
        self._offset_store: OffsetStore | None = None
        self.groups = GroupCoordinator(
            lambda: self.offset_store, lambda topic, index: self.replicas.partition(topic, index) is not None,
            GroupConfig.from_broker_config(config), store_if_open=lambda: self._offset_store,
        )
        self.connections: set[KafkaConnection] = set()
        self.handlers = load_handlers()
        self._server: asyncio.AbstractServer | None = None
        self._background: list[asyncio.Task] = []

    # -- start ------------------------------------------------------------------------------------
    def load(self) -> None:
        self.log_manager.load_all(self.topics.log_config)
        self.topics.host_all()
        if self.metadata.topic(OFFSETS_TOPIC) is not None:
            self._open_offset_store()

    def _open_offset_store(self) -> OffsetStore:
        info = self.metadata.topic(OFFSETS_TOPIC)
        store = OffsetStore(lambda p: self.replicas.partition(OFFSETS_TOPIC, p).log, len(info.partitions))
        store.load()
        self._offset_store = store
        return store

    @property
    def offset_store(self) -> OffsetStore:
        """The committed-offsets store; creates __consumer_offsets on first use, as Kafka does."""
        if self._offset_store is None:
            self.topics.ensure_internal(OFFSETS_TOPIC, self.offsets_partitions)
            self._open_offset_store()
        return self._offset_store  # type: ignore[return-value]

    def forget_topic(self, name: str) -> None:
        """After a topic is deleted: drop the committed offsets that named it."""
        if self._offset_store is not None:
            self._offset_store.delete_topic(name)

    async def start(self) -> None:
        raise_descriptor_limit()
        self.load()
        loop = asyncio.get_running_loop()
        max_request = int(self.config.get("socket.request.max.bytes"))
        self._server = await loop.create_server(
            lambda: KafkaConnection(self, self.handlers, max_request),
            self.config.host,
            self.config.port,
            reuse_address=True,
        )
        self._background.append(asyncio.ensure_future(self.log_manager.run_background()))
        self._background.append(asyncio.ensure_future(self._expire_producers()))
        self._background.append(asyncio.ensure_future(self.groups.run()))
        log.info(
            "pykbroker broker %d listening on %s:%d (advertised %s), data dir %s, cluster id %s",
            self.broker_id, self.config.host, self.config.port, self.config.advertised_host,
            self.data_dir, self.metadata.cluster_id,
        )

    async def _expire_producers(self) -> None:
        """Forget idle producers' sequence state, as Kafka does (producer.id.expiration.ms)."""
        interval_s = int(self.config.get("producer.id.expiration.check.interval.ms")) / 1000
        expiration_ms = int(self.config.get("producer.id.expiration.ms"))
        while True:
            await asyncio.sleep(interval_s)
            now = int(time.time() * 1000)
            for partition in self.replicas.partitions():
                partition.producer_state.expire(now, expiration_ms)

    # -- stop -------------------------------------------------------------------------------------
    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close()
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self.log_manager.shutdown()
        log.info("pykbroker broker %d stopped cleanly", self.broker_id)


async def serve(config: BrokerConfig, ready: asyncio.Event | None = None) -> None:
    broker = Broker(config)
    started = time.monotonic()
    await broker.start()
    log.debug("ready in %.3f s", time.monotonic() - started)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("shutting down")
    await broker.stop()


def run_broker(config: BrokerConfig) -> None:
    """Run until SIGTERM/SIGINT. Uses uvloop where it is installed."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        pass
    asyncio.run(serve(config))

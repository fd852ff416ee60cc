"""The broker's ZooKeeper client (kazoo), with Apache Kafka 3.7's ZooKeeper-mode paths and JSON.

An operator reading our znodes with zkCli sees what Kafka writes there. The shapes were checked against a
real Kafka 3.7.1 in ZooKeeper mode (protocol_specs/fixtures/zookeeper/, tests/unit/test_zk_codecs.py):

    /cluster/id                        {"version":"1","id":"<base64 uuid>"}
    /brokers/ids/<id>       ephemeral  {"features":{},"listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT"},
                                        "endpoints":["PLAINTEXT://h:p"],"rack":"r","jmx_port":-1,"port":p,
                                        "host":"h","version":5,"timestamp":"<ms>"}   broker epoch = its czxid
    /controller             ephemeral  {"version":2,"brokerid":N,"timestamp":"<ms>","kraftControllerEpoch":-1}
    /controller_epoch                  1          (a bare integer; its zkVersion fences controller writes)
    /brokers/topics/<t>                {"partitions":{"0":[1,2]},"topic_id":"<base64>","adding_replicas":{},
                                        "removing_replicas":{},"version":3}
    /brokers/topics/<t>/partitions/<p>/state
                                       {"controller_epoch":1,"leader":1,"version":1,"leader_epoch":0,"isr":[1,2]}
                                       (+ "leader_recovery_state":1 only while RECOVERING, as Kafka writes it);
                                       its zkVersion is the partition epoch
    /config/topics/<t>                 {"version":1,"config":{"retention.ms":"86400000"}}
    /config/brokers/<id>, /config/brokers/<default>
                                       {"version":1,"config":{"log.retention.ms":"60000"}} (dynamic broker configs)
    /config/changes/config_change_<seq> {"version":2,"entity_path":"topics/<t>"} (or "brokers/<id>", ...)
    /admin/delete_topics/<t>           (null data, as every persistent path Kafka creates empty)
    /latest_producer_id_block          {"version":1,"broker":1,"block_start":"0","block_end":"999"}

Rules taken from Kafka's KafkaZkClient:
- The chroot of ``host:port/chroot`` is created (with a client outside it) if missing, then the persistent
  top-level paths Kafka creates at start-up.
- Registration is an ephemeral create; NODE_EXISTS owned by another session refuses to start with Kafka's
  message; the broker epoch is the znode's czxid.
- Election: read /controller_epoch (create it with 0 if absent), then ONE transaction creates /controller
  and sets /controller_epoch to epoch+1 with the zkVersion read: exactly one contender wins, and the epoch
  goes up by exactly one.
- Every controller write is a transaction that first checks /controller_epoch's zkVersion, so the writes
  of a controller that has been replaced fail (ControllerMoved).
- Partition state is created and changed only by conditional writes on its zkVersion; the new zkVersion
  is returned (Kafka's partition epoch).
- Producer-id blocks of 1000 come from a read then a conditional setData of /latest_producer_id_block,
  retried on BadVersion, so two brokers never get overlapping blocks.

Threads: kazoo runs callbacks (watches, connection states, async results) on its own threads. Everything
here hands them to the asyncio loop with ``loop.call_soon_threadsafe``; async methods use kazoo's async
API (``*_async`` and ``rawlink``), so no call blocks the loop. Only ``start``/``close`` run kazoo's
blocking connect/stop in the default executor.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.protocol.states import ZnodeStat

from pykbroker.config import Listener

log = logging.getLogger(__name__)

# ---- paths (Kafka's ZkData) ------------------------------------------------------------------------

CLUSTER_ID_PATH = "/cluster/id"
BROKER_IDS_PATH = "/brokers/ids"
BROKER_SEQID_PATH = "/brokers/seqid"
TOPICS_PATH = "/brokers/topics"
CONTROLLER_PATH = "/controller"
CONTROLLER_EPOCH_PATH = "/controller_epoch"
CONFIG_PATH = "/config"
CONFIG_TOPICS_PATH = "/config/topics"
CONFIG_CHANGES_PATH = "/config/changes"
CONFIG_CHANGE_PREFIX = "config_change_"
DELETE_TOPICS_PATH = "/admin/delete_topics"
PRODUCER_ID_BLOCK_PATH = "/latest_producer_id_block"
ISR_CHANGE_NOTIFICATION_PATH = "/isr_change_notification"
LOG_DIR_EVENT_NOTIFICATION_PATH = "/log_dir_event_notification"
CONSUMERS_PATH = "/consumers"

# What Kafka's KafkaZkClient.createTopLevelPaths makes persistent at start-up (plus the config entity types).
PERSISTENT_PATHS = (
    CONSUMERS_PATH,
    BROKER_IDS_PATH,
    TOPICS_PATH,
    CONFIG_CHANGES_PATH,
    DELETE_TOPICS_PATH,
    BROKER_SEQID_PATH,
    ISR_CHANGE_NOTIFICATION_PATH,
    PRODUCER_ID_BLOCK_PATH,
    LOG_DIR_EVENT_NOTIFICATION_PATH,
    "/config/topics",
    "/config/clients",
    "/config/users",
    "/config/brokers",
    "/config/ips",
)

INITIAL_CONTROLLER_EPOCH = 0  # Kafka's KafkaController.InitialControllerEpoch
INITIAL_CONTROLLER_EPOCH_ZK_VERSION = 0
PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE
BROKER_REGISTRATION_VERSION = 5
LEADER_RECOVERED = 0  # LeaderRecoveryState.RECOVERED
LEADER_RECOVERING = 1  # LeaderRecoveryState.RECOVERING
NO_LEADER = -1  # LeaderAndIsr.NoLeader


def topic_path(topic: str) -> str:
    return f"{TOPICS_PATH}/{topic}"


def partitions_path(topic: str) -> str:
    return f"{TOPICS_PATH}/{topic}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{TOPICS_PATH}/{topic}/partitions/{partition}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{TOPICS_PATH}/{topic}/partitions/{partition}/state"


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS_PATH}/{broker_id}"


def topic_config_path(topic: str) -> str:
    return f"{CONFIG_TOPICS_PATH}/{topic}"


def delete_topic_path(topic: str) -> str:
    return f"{DELETE_TOPICS_PATH}/{topic}"


# ---- errors -----------------------------------------------------------------------------------------


class ZkError(RuntimeError):
    """Base of this module's errors."""


class BrokerIdInUse(ZkError):
    """Another live broker (another ZooKeeper session) holds /brokers/ids/<id>."""


class ControllerMoved(ZkError):
    """The /controller_epoch zkVersion check failed: another controller was elected since (Kafka's
    ControllerMovedException). The caller must stop acting as controller."""


class StaleZkVersion(ZkError):
    """A conditional write found a newer zkVersion than expected (BadVersion): somebody else wrote first."""


class TopicExists(ZkError):
    pass


# ---- JSON: encoders and decoders (pure, tested against Kafka's own documents) -----------------------


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def _now_ms() -> int:
    return int(time.time() * 1000)


def uuid_to_kafka(u: uuid.UUID | str | bytes) -> str:
    """Kafka's Uuid.toString: URL-safe base64 of the 16 bytes, without padding."""
    if isinstance(u, str):
        try:
            u = uuid.UUID(u)
        except ValueError:
            kafka_uuid_to_uuid(u)  # already Kafka's form: validate it
            return u
    raw = u.bytes if isinstance(u, uuid.UUID) else bytes(u)
    if len(raw) != 16:
        raise ValueError("a uuid has 16 bytes")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def kafka_uuid_to_uuid(s: str) -> uuid.UUID:
    raw = base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    if len(raw) != 16:
        raise ValueError(f"not a Kafka uuid: {s!r}")
    return uuid.UUID(bytes=raw)


def new_cluster_id() -> str:
    return uuid_to_kafka(uuid.uuid4())


def encode_cluster_id(cluster_id: str) -> bytes:
    return _json({"version": "1", "id": cluster_id})


def decode_cluster_id(data: bytes) -> str:
    return json.loads(data)["id"]


# A registered endpoint is a listener: ``LISTENER://host:port`` (``str(endpoint)``) with its security protocol.
Endpoint = Listener


def parse_endpoint(text: str, protocol_map: dict[str, str] | None = None) -> Listener:
    """One ``LISTENER://host:port`` of a registration's endpoints (an IPv6 host in brackets); its security
    protocol from the registration's map, else the listener name (Kafka's EndPoint.createEndPoint)."""
    name, _, rest = text.partition("://")
    host, _, port = rest.rpartition(":")
    host = host[1:-1] if host.startswith("[") else host
    return Listener(name, host, int(port), (protocol_map or {}).get(name, name))


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    broker_id: int
    endpoints: tuple[Endpoint, ...]
    rack: str | None = None
    epoch: int = -1  # the znode's czxid
    timestamp_ms: int | None = None
    jmx_port: int = -1
    features: dict = field(default_factory=dict)

    def endpoint(self, listener: str = "PLAINTEXT") -> Endpoint | None:
        return next((e for e in self.endpoints if e.name == listener), None)


def encode_broker_registration(
    broker_id: int,
    endpoints: Iterable[Endpoint],
    rack: str | None = None,
    *,
    jmx_port: int = -1,
    features: dict | None = None,
    timestamp_ms: int | None = None,
) -> bytes:
    """Kafka's BrokerIdZNode.encode, version 5. The top-level host/port are those of the first endpoint whose
    security protocol is PLAINTEXT (null / -1 if none), for old clients."""
    endpoints = list(endpoints)
    plaintext = next((e for e in endpoints if e.security_protocol == "PLAINTEXT"), None)
    doc: dict[str, Any] = {
        "features": features or {},
        "listener_security_protocol_map": {e.name: e.security_protocol for e in endpoints},
        "endpoints": [str(e) for e in endpoints],
    }
    if rack is not None:
        doc["rack"] = rack
    doc.update(
        {
            "jmx_port": jmx_port,
            "port": plaintext.port if plaintext else -1,
            "host": plaintext.host if plaintext else None,
            "version": BROKER_REGISTRATION_VERSION,
            "timestamp": str(_now_ms() if timestamp_ms is None else timestamp_ms),
        }
    )
    return _json(doc)


def decode_broker_registration(broker_id: int, data: bytes, stat: ZnodeStat | None = None) -> BrokerRegistration:
    doc = json.loads(data)
    pmap = doc.get("listener_security_protocol_map") or {}
    if doc.get("version", 1) >= 2 and doc.get("endpoints"):
        endpoints = tuple(parse_endpoint(s, pmap) for s in doc["endpoints"])
    else:
        endpoints = (Endpoint("PLAINTEXT", doc["host"], int(doc["port"])),)
    ts = doc.get("timestamp")
    return BrokerRegistration(
        broker_id=broker_id,
        endpoints=endpoints,
        rack=doc.get("rack"),
        epoch=stat.czxid if stat is not None else -1,
        timestamp_ms=int(ts) if ts is not None else None,
        jmx_port=int(doc.get("jmx_port", -1)),
        features=doc.get("features") or {},
    )


def encode_controller(broker_id: int, timestamp_ms: int | None = None) -> bytes:
    return _json(
        {
            "version": 2,
            "brokerid": broker_id,
            "timestamp": str(_now_ms() if timestamp_ms is None else timestamp_ms),
            "kraftControllerEpoch": -1,
        }
    )


def decode_controller(data: bytes) -> int:
    return int(json.loads(data)["brokerid"])


def encode_controller_epoch(epoch: int) -> bytes:
    return str(epoch).encode("ascii")


def decode_controller_epoch(data: bytes) -> int:
    return int(data.decode("ascii"))


@dataclass(frozen=True, slots=True)
class TopicAssignment:
    topic: str
    topic_id: str | None
    partitions: dict[int, list[int]]
    adding_replicas: dict[int, list[int]] = field(default_factory=dict)
    removing_replicas: dict[int, list[int]] = field(default_factory=dict)
    zk_version: int = -1


def encode_topic_assignment(
    partitions: dict[int, list[int]],
    topic_id: uuid.UUID | str | None,
    adding_replicas: dict[int, list[int]] | None = None,
    removing_replicas: dict[int, list[int]] | None = None,
) -> bytes:
    doc: dict[str, Any] = {"partitions": {str(p): list(r) for p, r in sorted(partitions.items())}}
    if topic_id is not None:
        doc["topic_id"] = uuid_to_kafka(topic_id)
    doc["adding_replicas"] = {str(p): list(r) for p, r in sorted((adding_replicas or {}).items()) if r}
    doc["removing_replicas"] = {str(p): list(r) for p, r in sorted((removing_replicas or {}).items()) if r}
    doc["version"] = 3
    return _json(doc)


def decode_topic_assignment(topic: str, data: bytes, stat: ZnodeStat | None = None) -> TopicAssignment:
    doc = json.loads(data)

    def ints(m: dict | None) -> dict[int, list[int]]:
        return {int(p): [int(b) for b in r] for p, r in (m or {}).items()}

    return TopicAssignment(
        topic=topic,
        topic_id=doc.get("topic_id"),
        partitions=ints(doc.get("partitions")),
        adding_replicas=ints(doc.get("adding_replicas")),
        removing_replicas=ints(doc.get("removing_replicas")),
        zk_version=stat.version if stat is not None else -1,
    )


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Leader, leader epoch, ISR and the controller epoch that wrote them; ``zk_version`` is the znode's
    version when read (Kafka's partition epoch), -1 for a state not read from ZooKeeper."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    leader_recovery_state: int = LEADER_RECOVERED
    zk_version: int = -1


def encode_partition_state(state: PartitionState) -> bytes:
    doc: dict[str, Any] = {
        "controller_epoch": state.controller_epoch,
        "leader": state.leader,
        "version": 1,
        "leader_epoch": state.leader_epoch,
        "isr": list(state.isr),
    }
    # Kafka 3.7 writes the field only when it is not RECOVERED (seen in the fixtures from a real cluster).
    if state.leader_recovery_state != LEADER_RECOVERED:
        doc["leader_recovery_state"] = state.leader_recovery_state
    return _json(doc)


def decode_partition_state(data: bytes, stat: ZnodeStat | None = None) -> PartitionState:
    doc = json.loads(data)
    return PartitionState(
        leader=int(doc["leader"]),
        leader_epoch=int(doc["leader_epoch"]),
        isr=tuple(int(b) for b in doc["isr"]),
        controller_epoch=int(doc["controller_epoch"]),
        leader_recovery_state=int(doc.get("leader_recovery_state", LEADER_RECOVERED)),
        zk_version=stat.version if stat is not None else -1,
    )


def encode_topic_config(config: dict[str, str]) -> bytes:
    return _json({"version": 1, "config": {k: str(v) for k, v in config.items()}})


def decode_topic_config(data: bytes | None, path: str | None = None) -> dict[str, str]:
    """The ``config`` map of an entity config znode (/config/topics/<t>, /config/brokers/<id>,
    /config/users/<u>, ...), as Kafka's ConfigEntityZNode.decode reads it: data that is not JSON (or not
    UTF-8), not a JSON object, or whose ``config`` is not an object, is an entity without configs ({}), not
    an error; a warning names the znode (``path``), never its content."""
    if not data:
        return {}
    try:
        doc = json.loads(data)
    except ValueError:  # json.JSONDecodeError and UnicodeDecodeError
        doc = None
    config = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(config, dict):
        if not isinstance(doc, dict) or "config" in doc:
            log.warning("the entity config znode %s cannot be read (not Kafka's {\"version\":1,\"config\":{...}} "
                        "JSON): taken as an entity without configs, as Kafka does", path or "(unnamed)")
        return {}
    return {k: str(v) for k, v in config.items()}


def encode_config_change(entity_path: str) -> bytes:
    return _json({"version": 2, "entity_path": entity_path})


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    broker_id: int
    first: int
    last: int  # inclusive, as Kafka's block_end

    @property
    def size(self) -> int:
        return self.last - self.first + 1


def encode_producer_id_block(block: ProducerIdBlock) -> bytes:
    return _json(
        {"version": 1, "broker": block.broker_id, "block_start": str(block.first), "block_end": str(block.last)}
    )


def decode_producer_id_block(data: bytes) -> ProducerIdBlock:
    doc = json.loads(data)
    return ProducerIdBlock(int(doc["broker"]), int(doc["block_start"]), int(doc["block_end"]))


def split_connect_string(connect: str) -> tuple[str, str | None]:
    """``"h1:1,h2:2/kafka/a"`` -> (``"h1:1,h2:2"``, ``"/kafka/a"``); a bare "/" is no chroot."""
    hosts, slash, chroot = connect.partition("/")
    if not hosts:
        raise ValueError(f"no ZooKeeper host in {connect!r}")
    chroot = ("/" + chroot).rstrip("/") if slash else ""
    return hosts, (chroot or None)


# ---- the client -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ControllerLeadership:
    broker_id: int
    epoch: int
    epoch_zk_version: int  # what guarded writes check


class SessionEvent:
    """What the connection-state listener reports on the loop: CONNECTED, SUSPENDED (connection lost,
    session maybe alive), EXPIRED (session gone: ephemerals and watches are lost; kazoo reconnects with a
    new session), RECONNECTED (a new session after EXPIRED: re-register)."""

    CONNECTED = "CONNECTED"
    SUSPENDED = "SUSPENDED"
    EXPIRED = "EXPIRED"
    RECONNECTED = "RECONNECTED"


class KafkaZkClient:
    """An asyncio-facing ZooKeeper client with Kafka's layout. Create and use it from a running loop."""

    def __init__(
        self,
        connect: str,
        *,
        session_timeout_ms: int = 18000,
        connection_timeout_ms: int | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.hosts, self.chroot = split_connect_string(connect)
        self.connect_string = connect
        self.session_timeout_ms = session_timeout_ms
        self.connection_timeout_s = (connection_timeout_ms or session_timeout_ms) / 1000
        self._loop = loop
        self._zk = KazooClient(
            hosts=self.hosts + (self.chroot or ""),
            timeout=session_timeout_ms / 1000,
            connection_retry={"max_tries": -1, "max_delay": 1.0},
        )
        self._session_listeners: list[Callable[[str], Any]] = []
        self._expired = False
        self._closed = False
        self._zk.add_listener(self._on_state_kazoo_thread)

    # -- lifecycle --

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    @property
    def kazoo(self) -> KazooClient:
        return self._zk

    @property
    def session_id(self) -> int | None:
        cid = self._zk.client_id
        return cid[0] if cid else None

    async def start(self) -> None:
        """Connect (creating the chroot first if missing, as Kafka does) and create Kafka's persistent paths."""
        loop = self.loop
        if self.chroot:
            await loop.run_in_executor(None, self._ensure_chroot)
        await loop.run_in_executor(None, self._zk.start, self.connection_timeout_s)
        await asyncio.gather(*(self._ensure_path(p) for p in PERSISTENT_PATHS))

    def _ensure_chroot(self) -> None:
        outside = KazooClient(hosts=self.hosts, timeout=self.session_timeout_ms / 1000)
        outside.start(self.connection_timeout_s)
        try:
            outside.ensure_path(self.chroot)
        finally:
            outside.stop()
            outside.close()

    async def close(self) -> None:
        """Close the session (the server deletes our ephemeral znodes at once) and stop kazoo's threads."""
        if self._closed:
            return
        self._closed = True

        def stop() -> None:
            self._zk.stop()
            self._zk.close()

        await self.loop.run_in_executor(None, stop)

    def add_session_listener(self, callback: Callable[[str], Any]) -> None:
        """``callback(SessionEvent.X)`` is called on the loop thread."""
        self._session_listeners.append(callback)

    def _on_state_kazoo_thread(self, state: str) -> None:
        # Runs on kazoo's connection thread: must not block; hand over to the loop.
        if self._closed or self._loop is None or self._loop.is_closed():
            return  # our own close() ends the session: not an expiry
        if state == KazooState.LOST:
            event = SessionEvent.EXPIRED
            self._expired = True
        elif state == KazooState.SUSPENDED:
            event = SessionEvent.SUSPENDED
        else:
            event = SessionEvent.RECONNECTED if self._expired else SessionEvent.CONNECTED
            self._expired = False
        try:
            self._loop.call_soon_threadsafe(self._dispatch_session_event, event)
        except RuntimeError:  # loop closed meanwhile
            pass

    def _dispatch_session_event(self, event: str) -> None:
        log.info("ZooKeeper session %s: %s", self.connect_string, event)
        for cb in list(self._session_listeners):
            try:
                cb(event)
            except Exception:
                log.exception("session listener failed")

    # -- plumbing: kazoo async results and watches onto the loop --

    def _await(self, async_result) -> "asyncio.Future":
        loop = self.loop
        fut = loop.create_future()

        def settle(r) -> None:
            if fut.done():
                return
            try:
                fut.set_result(r.get_nowait())
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
                fut.set_exception(e)

        def on_kazoo_thread(r) -> None:
            try:
                loop.call_soon_threadsafe(settle, r)
            except RuntimeError:
                pass

        async_result.rawlink(on_kazoo_thread)
        return fut

    def _to_loop(self, callback: Callable[..., Any]) -> Callable[..., None]:
        loop = self.loop

        def on_kazoo_thread(*args) -> None:
            if self._closed:
                return
            try:
                loop.call_soon_threadsafe(callback, *args)
            except RuntimeError:
                pass

        return on_kazoo_thread

    async def _ensure_path(self, path: str) -> None:
        # null data, as Kafka's createRecursive writes: Kafka tells "no data" (None) from b"" when it reads
        # /latest_producer_id_block, and fails to parse an empty document.
        try:
            await self._await(self._zk.create_async(path, None, makepath=True))
        except NodeExistsError:
            pass

    async def get(self, path: str) -> tuple[bytes | None, ZnodeStat]:
        return await self._await(self._zk.get_async(path))

    async def get_or_none(self, path: str) -> tuple[bytes | None, ZnodeStat] | None:
        try:
            return await self.get(path)
        except NoNodeError:
            return None

    async def children(self, path: str) -> list[str]:
        try:
            return await self._await(self._zk.get_children_async(path))
        except NoNodeError:
            return []

    # -- cluster id --

    async def get_or_create_cluster_id(self, proposed: str | None = None) -> str:
        found = await self.get_or_none(CLUSTER_ID_PATH)
        if found and found[0]:
            return decode_cluster_id(found[0])
        try:
            await self._await(
                self._zk.create_async(CLUSTER_ID_PATH, encode_cluster_id(proposed or new_cluster_id()), makepath=True)
            )
        except NodeExistsError:
            pass  # another broker was first: use its id
        data, _ = await self.get(CLUSTER_ID_PATH)
        return decode_cluster_id(data)

    # -- brokers --

    async def register_broker(
        self, broker_id: int, endpoints: Iterable[Endpoint], rack: str | None = None, *, features: dict | None = None
    ) -> int:
        """Create the ephemeral /brokers/ids/<id>; returns the broker epoch (the znode's czxid).

        If the znode exists and belongs to another session, the id is taken by a live broker: BrokerIdInUse
        with Kafka's message. If it belongs to our own session (a retried create), it is ours."""
        path = broker_path(broker_id)
        data = encode_broker_registration(broker_id, endpoints, rack, features=features)
        # Kafka's CheckedEphemeral: one transaction creates the ephemeral (Kafka: null data; kazoo's transaction
        # only takes bytes, and the same transaction overwrites them) and sets the data at
        # zkVersion 0, so the result carries the stat (czxid = broker epoch) and the znode is at zkVersion 1.
        tx = self._zk.transaction()
        tx.create(path, b"", ephemeral=True)
        tx.set_data(path, data, version=0)
        results = await self._await(tx.commit_async())
        failed = [r for r in results if isinstance(r, Exception) and not isinstance(r, (RolledBackError, RuntimeInconsistency))]
        if failed and isinstance(failed[0], NoNodeError):  # no /brokers/ids yet
            await self._ensure_path(BROKER_IDS_PATH)
            return await self.register_broker(broker_id, endpoints, rack, features=features)
        if failed and not isinstance(failed[0], NodeExistsError):
            raise failed[0]
        if failed:
            found = await self.get_or_none(path)
            if found is None:  # vanished meanwhile (its session just ended): try once more
                return await self.register_broker(broker_id, endpoints, rack, features=features)
            _, stat = found
            if stat.ephemeralOwner != self.session_id:
                raise BrokerIdInUse(
                    f"Error while creating ephemeral at {path}, node already exists and owner "
                    f"'{stat.ephemeralOwner}' does not match current session '{self.session_id}'"
                ) from None
            return stat.czxid
        stat = results[1]
        log.info("Registered broker %d at path %s, czxid (broker epoch): %d", broker_id, path, stat.czxid)
        return stat.czxid

    async def update_broker_registration(
        self, broker_id: int, endpoints: Iterable[Endpoint], rack: str | None = None, *, features: dict | None = None
    ) -> None:
        """Kafka's updateBrokerInfo: rewrite our registration (any zkVersion); the broker epoch stays."""
        data = encode_broker_registration(broker_id, endpoints, rack, features=features)
        await self._await(self._zk.set_async(broker_path(broker_id), data, version=-1))

    async def get_broker(self, broker_id: int) -> BrokerRegistration | None:
        found = await self.get_or_none(broker_path(broker_id))
        if found is None:
            return None
        return decode_broker_registration(broker_id, found[0], found[1])

    async def live_broker_ids(self) -> list[int]:
        return sorted(int(c) for c in await self.children(BROKER_IDS_PATH))

    async def live_brokers(self) -> dict[int, BrokerRegistration]:
        ids = await self.live_broker_ids()
        regs = await asyncio.gather(*(self.get_broker(i) for i in ids))
        return {r.broker_id: r for r in regs if r is not None}

    def watch_brokers(self, callback: Callable[[list[int]], Any]) -> None:
        """``callback(sorted live broker ids)`` on the loop, now and at every change (kazoo re-arms the
        watch, also across reconnects)."""
        on_loop = self._to_loop(callback)

        def on_children(children: list[str]) -> None:
            on_loop(sorted(int(c) for c in children))

        self._zk.ChildrenWatch(BROKER_IDS_PATH, on_children)

    def watch_broker(self, broker_id: int, callback: Callable[[BrokerRegistration | None], Any]) -> None:
        """``callback(registration or None)`` on the loop, now and whenever /brokers/ids/<id> is written,
        created or deleted (Kafka's BrokerModificationsHandler: the controller sees changed endpoints)."""
        self._watch_data(broker_path(broker_id), lambda data, stat: decode_broker_registration(broker_id, data, stat),
                         callback)

    def _watch_data(self, path: str, decode: Callable[[bytes, ZnodeStat], Any], callback: Callable[[Any], Any]) -> None:
        """``callback(decode(data, stat) or None)`` on the loop, now and whenever ``path`` changes."""
        on_loop = self._to_loop(callback)

        def on_data(data, stat, event=None) -> None:
            on_loop(decode(data, stat) if data else None)

        self._zk.DataWatch(path, on_data)

    # -- controller --

    async def get_controller_id(self) -> int | None:
        found = await self.get_or_none(CONTROLLER_PATH)
        return decode_controller(found[0]) if found and found[0] else None

    async def get_controller_epoch(self) -> tuple[int, int] | None:
        """(controller epoch, zkVersion of /controller_epoch), or None before the first election."""
        found = await self.get_or_none(CONTROLLER_EPOCH_PATH)
        if found is None:
            return None
        return decode_controller_epoch(found[0]), found[1].version

    async def _get_or_create_controller_epoch(self) -> tuple[int, int]:
        found = await self.get_controller_epoch()
        if found is not None:
            return found
        try:
            await self._await(
                self._zk.create_async(CONTROLLER_EPOCH_PATH, encode_controller_epoch(INITIAL_CONTROLLER_EPOCH))
            )
            return INITIAL_CONTROLLER_EPOCH, INITIAL_CONTROLLER_EPOCH_ZK_VERSION
        except NodeExistsError:
            found = await self.get_controller_epoch()
            assert found is not None
            return found

    async def try_become_controller(self, broker_id: int) -> ControllerLeadership | None:
        """Kafka's registerControllerAndIncrementControllerEpoch: None if another broker is controller.

        One transaction creates the ephemeral /controller and sets /controller_epoch to epoch + 1 with the
        zkVersion just read, so of several contenders exactly one wins and the epoch moves by one.

        A /controller created by this very session (an election whose answer was lost with the connection,
        or a controller that stepped back after a failed event) is ours again, in the epoch it holds."""
        found = await self.get_or_none(CONTROLLER_PATH)
        if found is not None and found[0]:
            current = await self.get_controller_epoch()
            if (found[1].ephemeralOwner == self.session_id and decode_controller(found[0]) == broker_id
                    and current is not None):
                return ControllerLeadership(broker_id, current[0], current[1])
            return None
        epoch, epoch_zk_version = await self._get_or_create_controller_epoch()
        tx = self._zk.transaction()
        tx.create(CONTROLLER_PATH, encode_controller(broker_id), ephemeral=True)
        tx.set_data(CONTROLLER_EPOCH_PATH, encode_controller_epoch(epoch + 1), version=epoch_zk_version)
        results = await self._await(tx.commit_async())
        if not any(isinstance(r, Exception) for r in results):
            stat = results[1]
            return ControllerLeadership(broker_id, epoch + 1, stat.version)
        # NODEEXISTS or BADVERSION: we won only if both znodes say so (a retried commit); else we lost.
        owner = await self.get_controller_id()
        current = await self.get_controller_epoch()
        if owner == broker_id and current is not None and current[0] == epoch + 1:
            found = await self.get_or_none(CONTROLLER_PATH)
            if found is not None and found[1].ephemeralOwner == self.session_id:
                return ControllerLeadership(broker_id, current[0], current[1])
        return None

    async def resign_controller(self, leadership: ControllerLeadership) -> None:
        """Delete /controller if it is still ours (guarded by the epoch zkVersion)."""
        try:
            await self.guarded_multi(leadership.epoch_zk_version, [("delete", CONTROLLER_PATH, -1)])
        except (ControllerMoved, NoNodeError):
            pass

    def watch_controller(self, callback: Callable[[int | None], Any]) -> None:
        """``callback(controller broker id or None)`` on the loop, now and whenever /controller changes."""
        on_loop = self._to_loop(callback)

        def on_data(data, stat, event=None) -> None:
            try:
                on_loop(decode_controller(data) if data else None)
            except (ValueError, KeyError):
                on_loop(None)

        self._zk.DataWatch(CONTROLLER_PATH, on_data)

    # -- guarded (controller) writes --

    async def guarded_multi(self, controller_epoch_zk_version: int, ops: list[tuple]) -> list[Any]:
        """Run ``ops`` in one transaction that first checks /controller_epoch's zkVersion (Kafka's
        ``retryRequestsUntilConnected(requests, expectedControllerEpochZkVersion)``).

        ops: ("create", path, data[, ephemeral]) | ("set", path, data, version) | ("delete", path, version)
        | ("check", path, version). Returns the ops' results (without the check's). Raises ControllerMoved if
        the epoch check fails, StaleZkVersion if a versioned op fails, else kazoo's error of the failing op."""
        tx = self._zk.transaction()
        tx.check(CONTROLLER_EPOCH_PATH, controller_epoch_zk_version)
        for op in ops:
            kind = op[0]
            if kind == "create":
                tx.create(op[1], op[2], ephemeral=len(op) > 3 and bool(op[3]))
            elif kind == "set":
                tx.set_data(op[1], op[2], version=op[3])
            elif kind == "delete":
                tx.delete(op[1], version=op[2])
            elif kind == "check":
                tx.check(op[1], op[2])
            else:
                raise ValueError(f"unknown op {kind!r}")
        results = await self._await(tx.commit_async())
        return self._raise_first_failure(results, controller_epoch_zk_version)[1:]

    @staticmethod
    def _raise_first_failure(results: list[Any], expected: int) -> list[Any]:
        failures = [(i, r) for i, r in enumerate(results) if isinstance(r, Exception) and not isinstance(r, (RolledBackError, RuntimeInconsistency))]
        if not failures:
            return results
        i, err = failures[0]
        if i == 0:
            if isinstance(err, (BadVersionError, NoNodeError)):
                raise ControllerMoved(f"Controller epoch zkVersion check fails. Expected zkVersion = {expected}") from err
            raise err
        if isinstance(err, BadVersionError):
            raise StaleZkVersion(str(err) or "BadVersion") from err
        raise err

    # -- topics --

    async def create_topic(
        self,
        topic: str,
        assignment: dict[int, list[int]],
        topic_id: uuid.UUID | str | None = None,
        config: dict[str, str] | None = None,
    ) -> str:
        """AdminZkClient.createTopicWithAssignment: the config znode first, then the assignment znode (which
        the controller watches). Returns the topic id (Kafka's base64 form). TopicExists if it exists."""
        if await self.get_or_none(topic_path(topic)) is not None:
            raise TopicExists(f"Topic '{topic}' already exists.")
        tid = uuid_to_kafka(topic_id or uuid.uuid4())
        await self._set_or_create(topic_config_path(topic), encode_topic_config(config or {}))
        try:
            await self._await(
                self._zk.create_async(topic_path(topic), encode_topic_assignment(assignment, tid), makepath=True)
            )
        except NodeExistsError:
            raise TopicExists(f"Topic '{topic}' already exists.") from None
        return tid

    async def _set_or_create(self, path: str, data: bytes) -> None:
        try:
            await self._await(self._zk.set_async(path, data))
        except NoNodeError:
            try:
                await self._await(self._zk.create_async(path, data, makepath=True))
            except NodeExistsError:
                await self._await(self._zk.set_async(path, data))

    async def get_topic_assignment(self, topic: str) -> TopicAssignment | None:
        found = await self.get_or_none(topic_path(topic))
        if found is None or not found[0]:
            return None
        return decode_topic_assignment(topic, found[0], found[1])

    async def set_topic_assignment(
        self, topic: str, assignment: TopicAssignment, expected_zk_version: int, controller_epoch_zk_version: int
    ) -> int:
        """Rewrite a topic's assignment (new partitions, reassignment) as controller; returns the new zkVersion."""
        data = encode_topic_assignment(
            assignment.partitions, assignment.topic_id, assignment.adding_replicas, assignment.removing_replicas
        )
        (stat,) = await self.guarded_multi(
            controller_epoch_zk_version, [("set", topic_path(topic), data, expected_zk_version)]
        )
        return stat.version

    def watch_topic_assignment(self, topic: str, callback: Callable[[TopicAssignment | None], Any]) -> None:
        """``callback(assignment or None)`` on the loop, now and whenever /brokers/topics/<t> is written,
        created or deleted (Kafka's PartitionModificationsHandler: the controller sees added partitions)."""
        self._watch_data(topic_path(topic), lambda data, stat: decode_topic_assignment(topic, data, stat), callback)

    async def all_topics(self) -> list[str]:
        return sorted(await self.children(TOPICS_PATH))

    def watch_topics(self, callback: Callable[[list[str]], Any]) -> None:
        on_loop = self._to_loop(callback)
        self._zk.ChildrenWatch(TOPICS_PATH, lambda children: on_loop(sorted(children)))

    # -- topic configs --

    async def get_topic_config(self, topic: str) -> dict[str, str]:
        found = await self.get_or_none(topic_config_path(topic))
        return decode_topic_config(found[0], topic_config_path(topic)) if found else {}

    async def set_topic_config(self, topic: str, config: dict[str, str]) -> str:
        """AdminZkClient.changeTopicConfig: write /config/topics/<t>, then a sequential change notification
        (brokers watch /config/changes). Returns the notification znode's name."""
        return await self.set_entity_config("topics", topic, config)

    async def get_entity_config(self, entity_type: str, name: str) -> dict[str, str]:
        """The configs in /config/<entity_type>/<name> (``brokers``, ``<default>`` or a broker id), {} if none."""
        return (await self.get_entity_config_versioned(entity_type, name))[0]

    async def get_entity_config_versioned(self, entity_type: str, name: str) -> tuple[dict[str, str], int]:
        """The configs in /config/<entity_type>/<name> and the znode's zkVersion (-1 if there is none), for
        a read-modify-write with ``set_entity_config(..., version=)`` (Kafka's fetchEntityConfig)."""
        path = f"{CONFIG_PATH}/{entity_type}/{name}"
        found = await self.get_or_none(path)
        return (decode_topic_config(found[0], path), found[1].version) if found else ({}, -1)

    async def set_entity_config(self, entity_type: str, name: str, config: dict[str, str], *,
                                version: int | None = None) -> str:
        """AdminZkClient.changeEntityConfig: write /config/<type>/<name> (an empty config too, as Kafka),
        then the change notification naming ``<type>/<name>``. Returns the notification znode's name.
        ``version``: write only if the znode is still at that zkVersion (-1: only if there is none yet),
        else StaleZkVersion and nothing written; None writes whatever is there."""
        path = f"{CONFIG_PATH}/{entity_type}/{name}"
        data = encode_topic_config(config)
        if version is None:
            await self._set_or_create(path, data)
        else:
            try:
                if version < 0:
                    await self._await(self._zk.create_async(path, data, makepath=True))
                else:
                    await self._await(self._zk.set_async(path, data, version=version))
            except (BadVersionError, NodeExistsError, NoNodeError) as exc:
                raise StaleZkVersion(f"{path} changed since it was read (expected zkVersion {version})") from exc
        created = await self._await(
            self._zk.create_async(
                f"{CONFIG_CHANGES_PATH}/{CONFIG_CHANGE_PREFIX}",
                encode_config_change(f"{entity_type}/{name}"),
                sequence=True,
                makepath=True,
            )
        )
        return created.rsplit("/", 1)[1]

    async def client_entity_paths(self) -> list[str]:
        """Every client entity under /config: ``users/<u>``, ``users/<u>/clients/<c>``, ``clients/<c>``,
        ``ips/<ip>`` (the names sanitized, as stored; a user znode made only as a parent is listed too)."""
        paths: list[str] = []
        for user in await self.children(f"{CONFIG_PATH}/users"):
            paths.append(f"users/{user}")
            paths.extend(f"users/{user}/clients/{c}" for c in await self.children(f"{CONFIG_PATH}/users/{user}/clients"))
        for kind in ("clients", "ips"):
            paths.extend(f"{kind}/{name}" for name in await self.children(f"{CONFIG_PATH}/{kind}"))
        return paths

    # -- topic deletion --

    async def mark_topic_for_deletion(self, topic: str) -> None:
        """Create /admin/delete_topics/<t> with null data (as Kafka); the controller does the rest."""
        try:
            await self._await(self._zk.create_async(delete_topic_path(topic), None, makepath=True))
        except NodeExistsError:
            pass

    async def topics_marked_for_deletion(self) -> list[str]:
        return sorted(await self.children(DELETE_TOPICS_PATH))

    def watch_topic_deletions(self, callback: Callable[[list[str]], Any]) -> None:
        on_loop = self._to_loop(callback)
        self._zk.ChildrenWatch(DELETE_TOPICS_PATH, lambda children: on_loop(sorted(children)))

    async def delete_topic_znodes(self, topic: str, controller_epoch_zk_version: int) -> None:
        """The controller's last step of a deletion: the partition states, the assignment, the config and the
        deletion marker, children first, each guarded by the epoch check."""
        parts = await self.children(partitions_path(topic))
        ops: list[tuple] = []
        for p in parts:
            if await self.get_or_none(partition_state_path(topic, int(p))) is not None:
                ops.append(("delete", partition_state_path(topic, int(p)), -1))
            ops.append(("delete", partition_path(topic, int(p)), -1))
        if parts or await self.get_or_none(partitions_path(topic)) is not None:
            ops.append(("delete", partitions_path(topic), -1))
        if await self.get_or_none(topic_path(topic)) is not None:
            ops.append(("delete", topic_path(topic), -1))
        if await self.get_or_none(topic_config_path(topic)) is not None:
            ops.append(("delete", topic_config_path(topic), -1))
        if await self.get_or_none(delete_topic_path(topic)) is not None:
            ops.append(("delete", delete_topic_path(topic), -1))
        if ops:
            await self.guarded_multi(controller_epoch_zk_version, ops)

    # -- partition state: only conditional writes --

    async def create_partition_states(
        self, topic: str, states: dict[int, PartitionState], controller_epoch_zk_version: int
    ) -> dict[int, int]:
        """Create /brokers/topics/<t>/partitions/<p>/state for new partitions (the parents are created if
        missing, as Kafka does, then every state in one transaction behind the epoch check). Returns the
        zkVersion (partition epoch, 0) of each. NodeExistsError if a state exists already."""
        await self._ensure_path(partitions_path(topic))
        await asyncio.gather(*(self._ensure_path(partition_path(topic, p)) for p in states))
        ops = [("create", partition_state_path(topic, p), encode_partition_state(s)) for p, s in sorted(states.items())]
        await self.guarded_multi(controller_epoch_zk_version, ops)
        return {p: 0 for p in states}

    async def get_partition_state(self, topic: str, partition: int) -> PartitionState | None:
        found = await self.get_or_none(partition_state_path(topic, partition))
        if found is None or not found[0]:
            return None
        return decode_partition_state(found[0], found[1])

    async def update_partition_state(
        self,
        topic: str,
        partition: int,
        state: PartitionState,
        expected_zk_version: int,
        controller_epoch_zk_version: int | None = None,
    ) -> int:
        """setData on the state znode only if its zkVersion is still ``expected_zk_version``; returns the new
        zkVersion (the partition epoch). With ``controller_epoch_zk_version`` the write is also fenced by the
        controller epoch (the controller's writes always are). StaleZkVersion / ControllerMoved on failure."""
        path = partition_state_path(topic, partition)
        data = encode_partition_state(state)
        if controller_epoch_zk_version is None:
            try:
                stat = await self._await(self._zk.set_async(path, data, version=expected_zk_version))
            except BadVersionError as e:
                raise StaleZkVersion(f"{path}: zkVersion is not {expected_zk_version}") from e
            return stat.version
        (stat,) = await self.guarded_multi(controller_epoch_zk_version, [("set", path, data, expected_zk_version)])
        return stat.version

    def watch_partition_state(self, topic: str, partition: int, callback: Callable[[PartitionState | None], Any]) -> None:
        self._watch_data(partition_state_path(topic, partition), decode_partition_state, callback)

    # -- producer ids --

    async def allocate_producer_id_block(self, broker_id: int, block_size: int = PRODUCER_ID_BLOCK_SIZE) -> ProducerIdBlock:
        """ZkProducerIdManager.getNewProducerIdBlock: read /latest_producer_id_block (empty at first), then
        setData with the zkVersion read; BadVersion means another broker took a block: read and retry."""
        while True:
            found = await self.get_or_none(PRODUCER_ID_BLOCK_PATH)
            if found is None:
                await self._ensure_path(PRODUCER_ID_BLOCK_PATH)
                continue
            data, stat = found
            first = decode_producer_id_block(data).last + 1 if data else 0
            last = first + block_size - 1
            if last >= (1 << 63) - 1:
                raise ZkError("Exhausted all producerIds as the next block's end producerId is will has exceeded long type limit")
            block = ProducerIdBlock(broker_id, first, last)
            try:
                await self._await(
                    self._zk.set_async(PRODUCER_ID_BLOCK_PATH, encode_producer_id_block(block), version=stat.version)
                )
                return block
            except BadVersionError:
                continue


    # -- ACLs (Kafka's /kafka-acl, /kafka-acl-extended and their change notifications: security/acl_store.py
    #    has the layout and codecs, cluster/acls.py the store and watcher that use these calls) --

    async def ensure_acl_paths(self, paths: Iterable[str]) -> None:
        for path in paths:
            await self._ensure_path(path)

    async def write_acl_znode(self, path: str, data: bytes | None, version: int | None) -> bool:
        """Write one pattern's ACL znode conditionally: ``version`` None creates it, else sets (``data``) or
        deletes (``data`` None) the version read. False, nothing written, when it changed since it was read."""
        try:
            if version is None:
                await self._await(self._zk.create_async(path, data, makepath=True))
            elif data is None:
                await self._await(self._zk.delete_async(path, version=version))
            else:
                await self._await(self._zk.set_async(path, data, version=version))
        except (BadVersionError, NodeExistsError, NoNodeError):
            return False
        return True

    async def create_acl_change(self, prefix: str, data: bytes) -> str:
        """A persistent sequential change notification (``prefix`` ends with "acl_changes_"); its node name."""
        created = await self._await(self._zk.create_async(prefix, data, sequence=True, makepath=True))
        return created.rsplit("/", 1)[1]

    async def delete_if_present(self, path: str) -> None:
        try:
            await self._await(self._zk.delete_async(path))
        except NoNodeError:
            pass

    def watch_children(self, path: str, callback: Callable[[list[str]], Any]) -> None:
        """``callback(sorted children)`` on the loop, now and whenever ``path``'s children change."""
        on_loop = self._to_loop(callback)
        self._zk.ChildrenWatch(path, lambda children: on_loop(sorted(children)))

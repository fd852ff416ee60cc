"""A real Kafka broker in your tests: the pykbroker pytest plugin.

Installed with pykbroker (entry point ``pytest11``), or loaded by hand with ``pytest -p pykbroker.testing``.

Fixtures
--------
``kafka_broker``
    a :class:`KafkaBroker`: one ``pykbroker serve`` process on a free port of 127.0.0.1 with a data dir of
    its own (embedded metadata, no ZooKeeper). Ready in about 0.2-0.3 s.
``kafka_cluster``
    a :class:`KafkaCluster`: three brokers coordinated by a real Apache ZooKeeper (Debian's ``zookeeper``
    package and a Java runtime; the test skips, saying which is missing, where they are absent).

Both have ``bootstrap_servers`` (give it to any Kafka client), admin helpers (``create_topic``,
``delete_topic``, ``list_topics``, ``produce``, ``consume``, ``end_offset``) and ``stop()`` / ``start()`` /
``restart()`` for testing how an application copes with a broker going away.

Broker configs
--------------
The brokers run Kafka's defaults except where test brokers commonly differ (``TEST_BROKER_CONFIG``):
``group.initial.rebalance.delay.ms=0``, so a group's first join does not wait 3 s for more members (as
testcontainers' Kafka module sets it). Set any other Kafka broker config, these included, for the fixtures'
brokers with the ini option ``pykbroker_config`` (one ``KEY=VALUE`` a line) or the command-line option
``--pykbroker-config KEY=VALUE`` (repeatable; wins over the ini file); ``KafkaBroker(config)`` and
``KafkaCluster(config=...)`` take them as a dict. The keys the fixtures set themselves (``FIXTURE_CONFIGS``:
where each broker listens and what it advertises, its data dir, id and ZooKeeper) are refused, naming the key:
a usage error from the options, ValueError from the classes.

Scope
-----
Session by default: one broker for the whole run, so give each test its own topic (the ``kafka_topic``
fixture makes one with a unique name). Change it with the ini option ``pykbroker_scope`` or the command-line
option ``--pykbroker-scope`` (``session``, ``package``, ``module``, ``class`` or ``function``). A broker that a
test left stopped is started again before the next test gets it.

Cleanup
-------
Brokers are stopped (SIGTERM, then SIGKILL) and their files removed when their scope ends, when the run is
interrupted (Ctrl-C) and at interpreter exit. If pytest itself is killed, Linux kills the brokers and a
cluster's ZooKeeper with it (PR_SET_PDEATHSIG); the next run removes the files left behind and kills a
ZooKeeper still running from such a run (its pid is recorded as soon as it is spawned).

This module imports only pytest, the standard library and pykbroker.testdefaults (which imports nothing) at
import time: it is loaded by every pytest run in an environment where pykbroker is installed.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pytest

from pykbroker.testdefaults import TEST_BROKER_CONFIG

__all__ = ("KafkaBroker", "KafkaCluster", "KafkaAdminError", "Message", "BrokerStartError")

HOST = "127.0.0.1"
SCOPES = ("session", "package", "module", "class", "function")
DEFAULT_SCOPE = "session"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
REQUEST_TIMEOUT_S = 30.0
TOPIC_READY_TIMEOUT_S = 30.0
LOG_LEVEL = "warning"
# Every broker's files live in <tmp>/pykbroker-testing-<uid>/run-<pid>-<random>: a run killed before it could
# clean up leaves a directory whose pid is dead, which the next run removes.
FILES_ROOT = Path(tempfile.gettempdir()) / f"pykbroker-testing-{os.getuid()}"

ORPHANS_FILE = "orphan-pids"
PORT_IN_USE_MESSAGE = b"the port is in use by another process"  # pykbroker.server.broker's start-up error
PORT_RETRY_S = 0.2

# Broker configs the fixtures set themselves (as pykbroker's config names them; log.dir/log.dirs are names of
# data.dir): where each broker listens and what it advertises (the fixture waits on, and hands out, its own
# address: `listeners` made the broker ignore it and the start time out, advertised ones sent clients
# elsewhere), its data dir, its id and a cluster's ZooKeeper. KafkaBroker/KafkaCluster and the plugin's
# options refuse them.
FIXTURE_CONFIGS = frozenset({"host", "port", "listeners", "advertised.host", "advertised.port", "advertised.listeners",
                             "data.dir", "log.dir", "log.dirs", "broker.id", "node.id", "zookeeper.connect"})

_live: set["_Server"] = set()


class BrokerStartError(RuntimeError):
    """The broker (or cluster) did not start; the message has the end of its log."""


class KafkaAdminError(RuntimeError):
    """A request of an admin helper was answered with an error code; ``error`` is its name."""

    def __init__(self, what: str, error: str, message: str | None = None):
        super().__init__(f"{what}: {error}" + (f" ({message})" if message else ""))
        self.error = error


@dataclass(frozen=True)
class Message:
    """One record read back by ``consume``."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


def _fixture_config_refusal(key: str) -> str | None:
    """Why a config the user gives cannot be set, for a key the fixtures own (named as the broker reads an
    --override key: dotted as given, else with ``_`` as ``.``); None for any other key."""
    name = key if "." in key else key.replace("_", ".")
    if name not in FIXTURE_CONFIGS:
        return None
    return (f"{key} is the pykbroker fixtures' own (each broker's listener and advertised address, data dir, id "
            f"and ZooKeeper are set by the fixture); set any other broker config")


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
TEST_USER = "pykbroker-test"


def _checked_security(security: str, mechanism: str | None) -> tuple[str, str | None]:
    """(protocol, SASL mechanism or None) upper-cased; ValueError naming what is accepted."""
    protocol = str(security or "PLAINTEXT").upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise ValueError(f"security {security!r}: must be one of {', '.join(SECURITY_PROTOCOLS)}")
    if not protocol.startswith("SASL"):
        if mechanism:
            raise ValueError(f"sasl_mechanism {mechanism!r} needs security SASL_PLAINTEXT or SASL_SSL, not {protocol}")
        return protocol, None
    mechanism = str(mechanism or "PLAIN").upper()
    if mechanism not in SASL_MECHANISMS:
        raise ValueError(f"sasl_mechanism {mechanism!r}: must be one of {', '.join(SASL_MECHANISMS)}")
    return protocol, mechanism


def _new_password() -> str:
    import secrets

    return secrets.token_urlsafe(18)


def _write_certificates(directory: Path) -> None:
    """A CA (``ca.pem``) and a broker certificate for 127.0.0.1 and localhost signed by it, with its key and
    the chain in ``broker.pem`` (Kafka's PEM key store), made with the cryptography package."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def certificate(subject: str, key, issuer_name, issuer_key, *, ca: bool):
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name or name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(days=30))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False)
        return builder.sign(issuer_key or key, hashes.SHA256())

    ca_key, broker_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate("pykbroker test CA", ca_key, None, None, ca=True)
    broker = certificate("pykbroker test broker", broker_key, ca.subject, ca_key, ca=False)
    pem = serialization.Encoding.PEM
    key_pem = broker_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (directory / "ca.pem").write_bytes(ca.public_bytes(pem))
    (directory / "broker.pem").write_bytes(key_pem + broker.public_bytes(pem) + ca.public_bytes(pem))
    (directory / "broker.pem").chmod(0o600)


def _checked_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """config over TEST_BROKER_CONFIG; ValueError for a key the fixtures own."""
    for key in config or {}:
        refusal = _fixture_config_refusal(str(key))
        if refusal is not None:
            raise ValueError(refusal)
    return {**TEST_BROKER_CONFIG, **(config or {})}


# ---------------------------------------------------------------------------------------------------
# Files and processes


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_stale_runs(root: Path = FILES_ROOT) -> None:
    """Remove run directories of test runs whose process is gone (killed before it could clean up)."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for entry in entries:
        parts = entry.name.split("-")
        if len(parts) >= 3 and parts[0] == "run" and parts[1].isdigit():
            if int(parts[1]) != os.getpid() and not _pid_alive(int(parts[1])):
                _kill_orphans(entry)
                shutil.rmtree(entry, ignore_errors=True)


def _kill_orphans(workdir: Path) -> None:
    """SIGKILL the processes a dead run recorded in workdir/ORPHANS_FILE that still run with workdir on their
    command line (a cluster's ZooKeeper does not die with the run; the brokers do)."""
    try:
        pids = [int(line) for line in (workdir / ORPHANS_FILE).read_text().split()]
    except (OSError, ValueError):
        return
    for pid in pids:
        try:
            if str(workdir).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _new_workdir() -> Path:
    FILES_ROOT.mkdir(parents=True, exist_ok=True)
    _sweep_stale_runs()
    return Path(tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=FILES_ROOT))


def _free_port() -> int:
    from pykbroker.cluster.zk_server import free_port  # standard library only: cheap

    return free_port(HOST)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"(no log at {path})"
    return f"--- last {len(text)} lines of {path} ---\n" + "\n".join(text)


# ---------------------------------------------------------------------------------------------------
# A small blocking Kafka client for the admin helpers: kio entities over a socket (no event loop, so the
# helpers work in async tests too).


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    return host, int(port)


def _request(address: tuple[str, int], request: Any, timeout: float = REQUEST_TIMEOUT_S) -> Any:
    from pykbroker.protocol.client import decode_response, encode_request

    with socket.create_connection(address, timeout=timeout) as sock, sock.makefile("rb") as answer:
        sock.sendall(encode_request(request, 1, "pykbroker-testing"))
        size_bytes = answer.read(4)
        frame = answer.read(struct.unpack(">i", size_bytes)[0]) if len(size_bytes) == 4 else b""
        if len(size_bytes) < 4 or len(frame) < struct.unpack(">i", size_bytes)[0]:
            raise ConnectionError(f"{address[0]}:{address[1]} closed the connection before answering")
    return decode_response(int(request.__api_key__), int(request.__version__), frame)


def _error_name(code: int) -> str | None:
    from kio.schema.errors import ErrorCode

    return None if code == 0 else ErrorCode(code).name.upper()


def _as_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return str(value).encode()


def _wait(condition, what: str, timeout: float, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


class _Admin:
    """Admin helpers over the Kafka protocol; subclasses say where the brokers are (``bootstrap_servers``)."""

    bootstrap_servers: str

    @property
    def admin_bootstrap_servers(self) -> str:
        """Where the admin helpers connect: a PLAINTEXT listener (``bootstrap_servers`` unless the brokers
        are secured, see KafkaBroker's ``security``)."""
        return self.bootstrap_servers

    def _send(self, request: Any, address: tuple[str, int] | None = None) -> Any:
        """To address, or to the first bootstrap broker that answers."""
        if address is not None:
            return _request(address, request)
        errors = []
        for server in self.admin_bootstrap_servers.split(","):
            try:
                return _request(_address(server), request)
            except OSError as exc:
                errors.append(f"{server}: {exc}")
        raise ConnectionError("no broker answered: " + "; ".join(errors))

    def _metadata(self, topics: Iterable[str] | None = None, address: tuple[str, int] | None = None):
        from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

        wanted = None if topics is None else tuple(MetadataRequestTopic(topic_id=None, name=t) for t in topics)
        return self._send(MetadataRequest(topics=wanted, allow_auto_topic_creation=False,
                                          include_topic_authorized_operations=False), address)

    def list_topics(self) -> set[str]:
        """Names of the topics, internal ones (``__consumer_offsets``) excluded."""
        return {t.name for t in self._metadata().topics if not t.is_internal}

    def partitions(self, topic: str) -> dict[int, int]:
        """{partition: leader broker id} of a topic (KafkaAdminError if it does not exist)."""
        answer = self._metadata([topic]).topics[0]
        if answer.error_code:
            raise KafkaAdminError(f"metadata of {topic}", _error_name(answer.error_code))
        return {int(p.partition_index): int(p.leader_id) for p in answer.partitions}

    def create_topic(self, name: str, partitions: int | None = 1, config: dict[str, Any] | None = None, *,
                     replication_factor: int | None = None) -> str:
        """Create a topic and wait until every partition has a leader; returns the name.

        partitions: None for the broker's num.partitions. config: topic configs, e.g. {"retention.ms": 60000}.
        replication_factor: the broker's default.replication.factor unless given.
        """
        from kio.schema.create_topics.v7.request import CreatableTopic, CreatableTopicConfig, CreateTopicsRequest
        from kio.static.primitive import i16, i32

        topic = CreatableTopic(
            name=name, num_partitions=i32(-1 if partitions is None else partitions),
            replication_factor=i16(-1 if replication_factor is None else replication_factor), assignments=(),
            configs=tuple(CreatableTopicConfig(name=k, value=None if v is None else str(v))
                          for k, v in (config or {}).items()))
        answer = self._send(CreateTopicsRequest(topics=(topic,))).topics[0]
        if answer.error_code:
            raise KafkaAdminError(f"create topic {name}", _error_name(answer.error_code), answer.error_message)
        self._wait_for_topic(name, partitions)
        return name

    def _wait_for_topic(self, name: str, partitions: int | None) -> None:
        def led_everywhere() -> bool:
            for server in self.admin_bootstrap_servers.split(","):
                try:
                    answer = self._metadata([name], _address(server)).topics[0]
                except OSError:
                    continue  # a stopped broker of a cluster
                if answer.error_code or not answer.partitions or partitions not in (None, len(answer.partitions)) or any(
                        p.leader_id < 0 for p in answer.partitions):
                    return False
            return True

        _wait(led_everywhere, f"topic {name} to have a leader for each of its partitions",
              TOPIC_READY_TIMEOUT_S)

    def delete_topic(self, name: str) -> None:
        """Delete a topic and wait until the brokers no longer list it."""
        import datetime

        from kio.schema.delete_topics.v6.request import DeleteTopicsRequest, DeleteTopicState
        from kio.static.primitive import i32Timedelta

        answer = self._send(DeleteTopicsRequest(
            topics=(DeleteTopicState(name=name, topic_id=None),),
            timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)))).responses[0]
        if answer.error_code:
            raise KafkaAdminError(f"delete topic {name}", _error_name(answer.error_code), answer.error_message)
        _wait(lambda: name not in self.list_topics(), f"topic {name} to disappear", TOPIC_READY_TIMEOUT_S)

    def _leader_address(self, topic: str, partition: int) -> tuple[str, int]:
        response = self._metadata([topic])
        answer = response.topics[0]
        if answer.error_code:
            raise KafkaAdminError(f"metadata of {topic}", _error_name(answer.error_code))
        leaders = {int(p.partition_index): int(p.leader_id) for p in answer.partitions}
        if partition not in leaders:
            raise KafkaAdminError(f"{topic}-{partition}", "UNKNOWN_TOPIC_OR_PARTITION")
        brokers = {int(b.node_id): (b.host, int(b.port)) for b in response.brokers}
        if leaders[partition] not in brokers:
            raise KafkaAdminError(f"{topic}-{partition}", "LEADER_NOT_AVAILABLE")
        return brokers[leaders[partition]]

    def _on_leader(self, topic: str, partition: int, attempt, timeout: float = TOPIC_READY_TIMEOUT_S):
        """attempt(leader address) until it does not fail with a retriable error (leadership moving)."""
        retriable = {"NOT_LEADER_OR_FOLLOWER", "LEADER_NOT_AVAILABLE", "UNKNOWN_TOPIC_OR_PARTITION",
                     "NOT_ENOUGH_REPLICAS", "REQUEST_TIMED_OUT", "FENCED_LEADER_EPOCH"}
        deadline = time.monotonic() + timeout
        while True:
            try:
                return attempt(self._leader_address(topic, partition))
            except KafkaAdminError as exc:
                if exc.error not in retriable or time.monotonic() > deadline:
                    raise
            except OSError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    def produce(self, topic: str, *messages: Any, partition: int = 0,
                headers: Iterable[tuple[str, Any]] = ()) -> list[int]:
        """Append messages to one partition (acks=all); returns their offsets.

        A message is a value (bytes or str), or a (key, value) pair; ``headers`` go on every message.
        """
        import datetime

        from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
        from kio.static.primitive import i16, i32, i32Timedelta

        from pykbroker.protocol.records import build_batch

        if not messages:
            return []
        encoded_headers = [(str(k), _as_bytes(v)) for k, v in headers]
        records = [(_as_bytes(m[0]), _as_bytes(m[1]), encoded_headers) if isinstance(m, tuple)
                   else (None, _as_bytes(m), encoded_headers) for m in messages]
        batch = bytes(build_batch(records, timestamp_ms=int(time.time() * 1000)))
        request = ProduceRequest(acks=i16(-1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
                                 topic_data=(TopicProduceData(name=topic, partition_data=(
                                     PartitionProduceData(index=i32(partition), records=batch),)),))

        def attempt(leader):
            answer = self._send(request, leader).responses[0].partition_responses[0]
            if answer.error_code:
                raise KafkaAdminError(f"produce to {topic}-{partition}", _error_name(answer.error_code),
                                      answer.error_message)
            return list(range(int(answer.base_offset), int(answer.base_offset) + len(records)))

        return self._on_leader(topic, partition, attempt)

    def end_offset(self, topic: str, partition: int = 0) -> int:
        """The partition's log end offset (high watermark): the offset the next message gets."""
        from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
        from kio.static.primitive import i8, i32, i64

        request = ListOffsetsRequest(replica_id=-1, isolation_level=i8(0), topics=(ListOffsetsTopic(
            name=topic, partitions=(ListOffsetsPartition(partition_index=i32(partition), timestamp=i64(-1)),)),))

        def attempt(leader):
            answer = self._send(request, leader).topics[0].partitions[0]
            if answer.error_code:
                raise KafkaAdminError(f"end offset of {topic}-{partition}", _error_name(answer.error_code))
            return int(answer.offset)

        return self._on_leader(topic, partition, attempt)

    def consume(self, topic: str, partition: int = 0, offset: int = 0, max_messages: int | None = None,
                timeout: float = 10.0) -> list[Message]:
        """The messages of one partition from ``offset`` up to its end offset at the time of the call
        (at most max_messages); waits up to timeout seconds for max_messages when it is given."""
        import datetime

        from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic
        from kio.static.primitive import i32, i32Timedelta, i64

        from pykbroker.protocol.records import BATCH_HEADER_SIZE, LOG_OVERHEAD, peek_header, read_records

        messages: list[Message] = []
        position = offset
        end = None if max_messages is not None else self.end_offset(topic, partition)
        deadline = time.monotonic() + timeout
        while True:
            if max_messages is not None and len(messages) >= max_messages:
                return messages[:max_messages]
            if end is not None and position >= end:
                return messages
            if time.monotonic() > deadline:
                if max_messages is None:
                    raise TimeoutError(f"{topic}-{partition}: read to {position} of end offset {end} in {timeout} s")
                return messages
            request = FetchRequest(
                max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=200)), min_bytes=i32(1),
                topics=(FetchTopic(topic=topic, partitions=(FetchPartition(
                    partition=i32(partition), fetch_offset=i64(position), partition_max_bytes=i32(1 << 20)),)),),
                forgotten_topics_data=())

            def attempt(leader):
                answer = self._send(request, leader).responses[0].partitions[0]
                if answer.error_code:
                    raise KafkaAdminError(f"fetch {topic}-{partition} at {position}", _error_name(answer.error_code))
                return bytes(answer.records or b"")

            records = self._on_leader(topic, partition, attempt)
            at = 0
            while at + BATCH_HEADER_SIZE <= len(records):
                (length,) = struct.unpack_from(">i", records, at + 8)
                if at + LOG_OVERHEAD + length > len(records):
                    break  # a partial batch at the end of the answer
                header = peek_header(records, at)
                if not header.is_control:
                    for record in read_records(records, header):
                        if record.offset >= position:
                            messages.append(Message(topic, partition, record.offset, record.timestamp,
                                                    record.key, record.value, record.headers))
                position = max(position, header.next_offset)
                at += header.size


# ---------------------------------------------------------------------------------------------------
# One broker


class _Server(_Admin):
    """What KafkaBroker and KafkaCluster share: a context manager that starts, then closes."""

    def start(self) -> "_Server":
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def running(self) -> bool:
        raise NotImplementedError

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


class KafkaBroker(_Server):
    """One pykbroker process on a free port of 127.0.0.1 (the same port and data dir across restarts).

    config: Kafka broker configs passed as ``--override KEY=VALUE`` (e.g. {"num.partitions": 3}), over
    TEST_BROKER_CONFIG. Usable without pytest: ``with KafkaBroker() as broker: ...``.

    security: the security protocol of the listener clients get (``bootstrap_servers``): PLAINTEXT (the
    default), SSL, SASL_PLAINTEXT or SASL_SSL; ``sasl_mechanism`` PLAIN (the default), SCRAM-SHA-256 or
    SCRAM-SHA-512. A secured broker has a TLS certificate made at its first start (a CA and a certificate for
    127.0.0.1 and localhost, PEM files in its work dir: ``ca_file``) and one user (``username``, ``password``:
    random), and hands out the clients' settings: :meth:`client_config` (confluent-kafka / librdkafka),
    :meth:`kafka_python_config` (kafka-python, aiokafka), ``client_properties`` (a Kafka client properties
    file: the Java client, Kafka's tools' ``--command-config``, ``pykbroker ... --command-config``). It keeps a
    PLAINTEXT listener on another port for the admin helpers (``admin_bootstrap_servers``).
    """

    def __init__(self, config: dict[str, Any] | None = None, *, workdir: Path | None = None,
                 log_level: str = LOG_LEVEL, security: str = "PLAINTEXT", sasl_mechanism: str | None = None):
        self.config = _checked_config(config)
        self.security, self.sasl_mechanism = _checked_security(security, sasl_mechanism)
        self.log_level = log_level
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else None
        self.host = HOST
        self.port = _free_port()
        self.client_port = self.port if self.security == "PLAINTEXT" else _free_port()
        self.username = TEST_USER if self.sasl_mechanism else None
        self.password = _new_password() if self.sasl_mechanism else None
        self.proc: subprocess.Popen | None = None
        self.start_seconds: float | None = None  # how long the last start() took

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def admin_bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def ca_file(self) -> Path | None:
        """The CA certificate (PEM) that signed the broker's: clients trust it (None without TLS)."""
        return self.workdir / "tls" / "ca.pem" if self.workdir and "SSL" in self.security else None

    @property
    def client_properties(self) -> Path | None:
        """A Kafka client properties file with the client settings (None before the first start)."""
        return self.workdir / "client.properties" if self.workdir else None

    def client_config(self) -> dict[str, str]:
        """confluent-kafka's (librdkafka's) settings to reach this broker: bootstrap.servers and its security."""
        config = {"bootstrap.servers": self.bootstrap_servers, "security.protocol": self.security}
        if "SSL" in self.security:
            config["ssl.ca.location"] = str(self.ca_file)
        if self.sasl_mechanism:
            config.update({"sasl.mechanism": self.sasl_mechanism, "sasl.username": self.username,
                           "sasl.password": self.password})
        return config

    def kafka_python_config(self) -> dict[str, str]:
        """kafka-python's (and aiokafka's, but for ssl_context) keyword arguments to reach this broker."""
        config = {"bootstrap_servers": self.bootstrap_servers, "security_protocol": self.security}
        if "SSL" in self.security:
            config["ssl_cafile"] = str(self.ca_file)
        if self.sasl_mechanism:
            config.update({"sasl_mechanism": self.sasl_mechanism, "sasl_plain_username": self.username,
                           "sasl_plain_password": self.password})
        return config

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        return self.workdir / "broker.log"

    def command(self) -> list[str]:
        from pykbroker.devcluster import pykbroker_command  # the pykbroker this plugin belongs to (child_env)

        if self.security == "PLAINTEXT":
            cmd = pykbroker_command("serve", "--host", self.host, "--port", str(self.port),
                                    "--data-dir", str(self.data_dir), "--log-level", self.log_level)
        else:
            cmd = pykbroker_command("serve", "--data-dir", str(self.data_dir), "--log-level", self.log_level)
        for key, value in {**self.config, **self._security_config()}.items():
            cmd += ["--override", f"{key}={value}"]
        return cmd

    def start(self, timeout: float = READY_TIMEOUT_S) -> "KafkaBroker":
        """Start the broker and wait until it answers ApiVersions (no-op when it runs).

        Call it from a thread that outlives the broker (pytest's main thread does): Linux kills the broker
        when the thread that started it ends (PR_SET_PDEATHSIG), which is what stops it with a killed run.
        """
        if self.running():
            return self
        if self.workdir is None:
            self.workdir = _new_workdir()
        first = not self.data_dir.exists()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if first and self.security != "PLAINTEXT":
            self._prepare_security()
        from pykbroker.devcluster import _die_with_parent, child_env  # the pykbroker this plugin belongs to

        began = time.monotonic()
        deadline = began + timeout
        _live.add(self)
        while True:
            with open(self.log_path, "ab") as log:
                output_from = log.tell()
                self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, env=child_env(), start_new_session=True,
                                             preexec_fn=_die_with_parent)
            try:
                self._wait_ready(max(deadline - time.monotonic(), 1.0))
                break
            except BrokerStartError:
                self.kill()
                # The port (kept: clients bootstrap from it) can be held for a while by another socket,
                # e.g. an outgoing connection's local port: try again until the timeout.
                if time.monotonic() < deadline and self._port_was_in_use(output_from):
                    time.sleep(PORT_RETRY_S)
                    continue
                raise
            except BaseException:
                self.kill()
                raise
        self.start_seconds = time.monotonic() - began
        return self

    def _security_config(self) -> dict[str, str]:
        """The broker configs of the secured listener (none for PLAINTEXT)."""
        if self.security == "PLAINTEXT":
            return {}
        listener = self.security.lower()
        config = {"listeners": f"PLAINTEXT://{self.host}:{self.port},{self.security}://{self.host}:{self.client_port}"}
        if "SSL" in self.security:
            config.update({"ssl.keystore.type": "PEM", "ssl.keystore.location": str(self.workdir / "tls" / "broker.pem")})
        if self.sasl_mechanism:
            mechanism = self.sasl_mechanism
            config["sasl.enabled.mechanisms"] = mechanism
            jaas = (f'org.apache.kafka.common.security.plain.PlainLoginModule required user_{self.username}='
                    f'"{self.password}";' if mechanism == "PLAIN"
                    else "org.apache.kafka.common.security.scram.ScramLoginModule required;")
            config[f"listener.name.{listener}.{mechanism.lower()}.sasl.jaas.config"] = jaas
        return config

    def _prepare_security(self) -> None:
        """Before the first start: the certificates, the SCRAM user (in the data dir, as ``pykbroker scram add``
        stores it) and the client properties file."""
        lines = [f"bootstrap.servers={self.bootstrap_servers}", f"security.protocol={self.security}"]
        if "SSL" in self.security:
            _write_certificates(self.workdir / "tls")
            lines += [f"ssl.truststore.location={self.ca_file}", "ssl.truststore.type=PEM"]
        if self.sasl_mechanism:
            module = "plain.PlainLoginModule" if self.sasl_mechanism == "PLAIN" else "scram.ScramLoginModule"
            lines += [f"sasl.mechanism={self.sasl_mechanism}",
                      f"sasl.jaas.config=org.apache.kafka.common.security.{module} required "
                      f'username="{self.username}" password="{self.password}";']
        if self.sasl_mechanism and self.sasl_mechanism != "PLAIN":
            from pykbroker.security.credentials import parse_add_scram
            from pykbroker.security.scram_bootstrap import add_to_data_dir

            add_to_data_dir(self.data_dir, [parse_add_scram(
                f"{self.sasl_mechanism}=[name={self.username},password={self.password}]")])
        self.client_properties.write_text("\n".join(lines) + "\n")

    def _port_was_in_use(self, output_from: int) -> bool:
        """Did the broker, which exited, say its port is in use (in its output from ``output_from`` on)?"""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(output_from)
                return PORT_IN_USE_MESSAGE in log.read()
        except OSError:
            return False

    def _wait_ready(self, timeout: float) -> None:
        from kio.schema.api_versions.v0.request import ApiVersionsRequest

        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise BrokerStartError(f"pykbroker exited with status {self.proc.returncode} while starting\n"
                                       f"{self.log_tail()}")
            try:
                if _request((self.host, self.port), ApiVersionsRequest(), timeout=1.0).error_code == 0:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise BrokerStartError(f"pykbroker on {self.bootstrap_servers} not ready after {timeout:.0f} s\n"
                                       f"{self.log_tail()}")
            time.sleep(0.02)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM (a clean shutdown); SIGKILL if it has not exited after timeout s. Returns the exit status."""
        if self.proc is None:
            return None
        if self.running():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: a crash. What the broker acknowledged survives it."""
        if self.running():
            self.proc.kill()
            self.proc.wait()

    def restart(self, *, kill: bool = False) -> "KafkaBroker":
        """Stop (or kill) and start again on the same port and data dir."""
        self.kill() if kill else self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the broker and remove its files (the work dir, unless it was given)."""
        try:
            self.stop()
        finally:
            self.kill()
            _live.discard(self)
            if self._own_workdir and self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines) if self.workdir else "(not started)"

    def __repr__(self) -> str:
        security = "" if self.security == "PLAINTEXT" else f" {self.security}" + (
            f"/{self.sasl_mechanism}" if self.sasl_mechanism else "")
        return f"KafkaBroker({self.bootstrap_servers}{security}, {'running' if self.running() else 'stopped'})"


# ---------------------------------------------------------------------------------------------------
# A cluster: ZooKeeper + brokers 1..n (pykbroker.devcluster)


class KafkaCluster(_Server):
    """n pykbroker brokers (ids 1..n) coordinated by a real ZooKeeper (Debian's package), each on a free port.

    ``stop_broker(id)`` / ``start_broker(id)`` / ``kill_broker(id)`` for failover tests; ``stop()`` /
    ``start()`` / ``restart()`` for the whole cluster. config: Kafka broker configs of every broker, over
    TEST_BROKER_CONFIG.
    """

    def __init__(self, brokers: int = 3, config: dict[str, Any] | None = None, *, workdir: Path | None = None,
                 log_level: str = LOG_LEVEL):
        from pykbroker.devcluster import DevCluster

        overrides = tuple(f"{k}={v}" for k, v in _checked_config(config).items())
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else _new_workdir()
        self._cluster = DevCluster(brokers, self.workdir, overrides=overrides, log_level=log_level,
                                   say=lambda _message: None, on_zookeeper_spawn=self._record_zookeeper)
        self.start_seconds: float | None = None

    def _record_zookeeper(self, pid: int) -> None:
        """Our ZooKeeper JVM was just spawned: recorded before anything else, so that a run killed from now
        on has it killed by the next run's sweep (it also dies with the thread that started it, PDEATHSIG)."""
        (self.workdir / ORPHANS_FILE).write_text(f"{pid}\n")

    @property
    def bootstrap_servers(self) -> str:
        return self._cluster.bootstrap

    @property
    def broker_ids(self) -> list[int]:
        return [b.broker_id for b in self._cluster.brokers]

    @property
    def zookeeper_connect(self) -> str | None:
        return self._cluster.zookeeper_connect

    def broker_address(self, broker_id: int) -> str:
        return self._broker(broker_id).address

    def _broker(self, broker_id: int):
        for broker in self._cluster.brokers:
            if broker.broker_id == broker_id:
                return broker
        raise KeyError(f"no broker {broker_id} (brokers: {self.broker_ids})")

    def start(self, timeout: float = 60.0) -> "KafkaCluster":
        from pykbroker.devcluster import ClusterStartError

        if self.running():
            return self
        _live.add(self)
        began = time.monotonic()
        if self._cluster.zk is not None and not self._cluster.zk.answers():
            self._cluster.zk.start()
        try:
            if self._cluster.zk is None and self._cluster.zookeeper_connect is None:
                self._cluster.start(timeout)
            else:
                for broker in self._cluster.brokers:
                    if not broker.running():
                        self._start_process(broker)
                self._cluster.wait_ready(timeout)
        except ClusterStartError as exc:
            self.close()
            raise BrokerStartError(str(exc)) from None
        self.start_seconds = time.monotonic() - began
        return self

    def _start_process(self, broker) -> None:
        broker.start(self._cluster.zookeeper_connect, self._cluster.overrides, self._cluster.log_level)

    def running(self) -> bool:
        return bool(self._cluster.brokers) and all(b.running() for b in self._cluster.brokers)

    def stop_broker(self, broker_id: int, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM one broker (Kafka's controlled shutdown) and wait; returns its exit status."""
        broker = self._broker(broker_id)
        broker.signal(signal.SIGTERM)
        try:
            return broker.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            broker.proc.kill()
            return broker.proc.wait()

    def kill_broker(self, broker_id: int) -> None:
        broker = self._broker(broker_id)
        if broker.running():
            broker.proc.kill()
            broker.proc.wait()

    def start_broker(self, broker_id: int, timeout: float = 60.0) -> None:
        """Start a stopped broker again and wait until every broker lists all of them."""
        broker = self._broker(broker_id)
        if not broker.running():
            self._start_process(broker)
        self._cluster.wait_ready(timeout)

    def stop(self) -> None:
        """Stop every broker (controlled shutdown) and ZooKeeper; start() brings the same cluster back."""
        self._cluster.stop()

    def restart(self) -> "KafkaCluster":
        self.stop()
        return self.start()

    def close(self) -> None:
        try:
            self._cluster.stop()
        finally:
            _live.discard(self)
            if self._own_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(f"--- broker {b.broker_id} ({b.log_path}) ---\n{b.log_tail(lines)}"
                         for b in self._cluster.brokers)

    def __repr__(self) -> str:
        return f"KafkaCluster({self.bootstrap_servers})"


@atexit.register
def _close_leftovers() -> None:
    for server in list(_live):
        try:
            server.close()
        except Exception:
            pass


# ---------------------------------------------------------------------------------------------------
# pytest


def pytest_addoption(parser) -> None:
    help_text = f"scope of the kafka_broker and kafka_cluster fixtures: {', '.join(SCOPES)} (default {DEFAULT_SCOPE})"
    parser.addini("pykbroker_scope", help_text, default=DEFAULT_SCOPE)
    group = parser.getgroup("pykbroker")
    group.addoption("--pykbroker-scope", dest="pykbroker_scope", choices=SCOPES, default=None, help=help_text)
    config_help = ("a Kafka broker config of the kafka_broker and kafka_cluster fixtures' brokers, KEY=VALUE (defaults: "
                   + ", ".join(f"{k}={v}" for k, v in TEST_BROKER_CONFIG.items()) + ")")
    parser.addini("pykbroker_config", config_help + "; one a line", type="linelist", default=[])
    group.addoption("--pykbroker-config", dest="pykbroker_config", action="append", default=[], metavar="KEY=VALUE",
                    help=config_help + "; repeatable, over the ini file's pykbroker_config")
    security_help = (f"security protocol of the kafka_broker fixture's client listener: {', '.join(SECURITY_PROTOCOLS)} "
                     "(default PLAINTEXT; kafka_broker.client_config() gives the clients' settings)")
    parser.addini("pykbroker_security", security_help, default="PLAINTEXT")
    group.addoption("--pykbroker-security", dest="pykbroker_security", default=None, help=security_help)
    mechanism_help = f"SASL mechanism of kafka_broker with a SASL security protocol: {', '.join(SASL_MECHANISMS)} (default PLAIN)"
    parser.addini("pykbroker_sasl_mechanism", mechanism_help, default="")
    group.addoption("--pykbroker-sasl-mechanism", dest="pykbroker_sasl_mechanism", default=None, help=mechanism_help)


def _configured_scope(config) -> str:
    return config.getoption("pykbroker_scope", None) or config.getini("pykbroker_scope") or DEFAULT_SCOPE


def _configured_broker_config(config) -> dict[str, str]:
    """The fixtures' broker configs: the ini file's pykbroker_config lines, then the --pykbroker-config options."""
    settings: dict[str, str] = {}
    for where, entries in (("pykbroker_config", config.getini("pykbroker_config")),
                           ("--pykbroker-config", config.getoption("pykbroker_config", None) or [])):
        for entry in entries:
            key, equals, value = entry.partition("=")
            if not equals or not key.strip():
                raise pytest.UsageError(f"{where} {entry!r}: must be KEY=VALUE, a Kafka broker config")
            refusal = _fixture_config_refusal(key.strip())
            if refusal is not None:
                raise pytest.UsageError(f"{where} {entry!r}: {refusal}")
            settings[key.strip()] = value.strip()
    return settings


def _configured_security(config, param: Any = None) -> dict[str, Any]:
    """KafkaBroker's security arguments: an indirect parametrization's dict (``security``, ``sasl_mechanism``),
    else the --pykbroker-security / --pykbroker-sasl-mechanism options, else the ini file's."""
    if param is not None:
        if not isinstance(param, dict) or set(param) - {"security", "sasl_mechanism"}:
            raise pytest.UsageError(f"kafka_broker parameter {param!r}: expected a dict with security and, for "
                                    "SASL, sasl_mechanism, e.g. {'security': 'SASL_SSL', 'sasl_mechanism': 'SCRAM-SHA-256'}")
        arguments = dict(param)
    else:
        arguments = {"security": config.getoption("pykbroker_security", None) or config.getini("pykbroker_security"),
                     "sasl_mechanism": (config.getoption("pykbroker_sasl_mechanism", None)
                                        or config.getini("pykbroker_sasl_mechanism") or None)}
    try:
        _checked_security(arguments.get("security") or "PLAINTEXT", arguments.get("sasl_mechanism"))
    except ValueError as exc:
        raise pytest.UsageError(f"pykbroker: {exc}") from None
    return arguments


def pytest_configure(config) -> None:
    scope = _configured_scope(config)
    if scope not in SCOPES:
        raise pytest.UsageError(f"pykbroker_scope = {scope!r}: must be one of {', '.join(SCOPES)}")
    _configured_broker_config(config)  # refuses a malformed entry before any test runs
    _configured_security(config)


def _scope(fixture_name: str, config) -> str:
    scope = _configured_scope(config)
    return scope if scope in SCOPES else DEFAULT_SCOPE  # pytest_configure has refused it already


def _zookeeper_missing() -> str | None:
    from pykbroker.cluster.zk_server import ZooKeeperUnavailable, find_install

    try:
        find_install()
    except ZooKeeperUnavailable as exc:
        return str(exc)
    return None


@pytest.fixture(scope=_scope)
def kafka_broker(request):
    """A running pykbroker (KafkaBroker): ``kafka_broker.bootstrap_servers``, admin helpers, stop/restart;
    secured as the options say, or as an indirect parametrization's dict asks
    (``@pytest.mark.parametrize("kafka_broker", [{"security": "SASL_SSL"}], indirect=True)``)."""
    broker = KafkaBroker(_configured_broker_config(request.config),
                         **_configured_security(request.config, getattr(request, "param", None)))
    broker._pytest_scope = request.scope
    try:
        yield broker.start()
    finally:
        broker.close()


@pytest.fixture(scope=_scope)
def kafka_cluster(request):
    """Three pykbroker brokers and a ZooKeeper (KafkaCluster); skips where ZooKeeper or java is absent."""
    reason = _zookeeper_missing()
    if reason is not None:
        pytest.skip(f"kafka_cluster needs ZooKeeper: {reason}")
    cluster = KafkaCluster(3, _configured_broker_config(request.config))
    cluster._pytest_scope = request.scope
    try:
        yield cluster.start()
    finally:
        cluster.close()


@pytest.fixture
def kafka_topic(request, kafka_broker) -> str:
    """A new topic on kafka_broker (one partition) with a name unique to the test."""
    base = "".join(c if c.isalnum() or c in "._-" else "-" for c in request.node.name)[:60].strip("-")
    return kafka_broker.create_topic(f"{base}-{uuid.uuid4().hex[:8]}")


def _servers_of(item) -> list[_Server]:
    return [v for v in getattr(item, "funcargs", {}).values() if isinstance(v, _Server)]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item) -> None:
    """A shared broker or cluster that this test stopped is started again for the tests after it."""
    for server in _servers_of(item):
        if getattr(server, "_pytest_scope", "function") != "function" and not server.running():
            server.start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for server in _servers_of(item):
            report.sections.append((f"pykbroker log {server.bootstrap_servers} ({report.when})", server.log_tail()))

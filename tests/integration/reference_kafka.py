"""A real Apache Kafka 3.7.1 broker (KRaft, one node) from ../shared/refkit, to run the same client-side
tests against the system pykbroker imitates.

    with ReferenceKafka(tmp_dir) as kafka:      # pytest.skip()s with the reason where the kit or java is absent
        kafka.bootstrap, kafka.address, kafka.port

A BrokerProcess (host, port, address, bootstrap, log_tail, stop, kill) with node id 1, like a single
pykbroker. Start takes 5-15 s of a loaded 2-core machine; use one per module.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from broker_process import BrokerProcess, free_port
from kafka_tools import KAFKA_DIST, find_refkit, unavailable_reason

START_TIMEOUT_S = 90.0
JVM_ENV = {"KAFKA_HEAP_OPTS": "-Xmx512m",
           "KAFKA_JVM_PERFORMANCE_OPTS": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto"}


class ReferenceKafka(BrokerProcess):
    """A BrokerProcess whose process is Kafka (kafka-server-start.sh execs java: the pid is the JVM's)."""

    # Kafka 3.7.1 serves ListGroups up to v4, which carries no group type: clients list its groups' type as
    # unknown (ListGroups v5, with types, came with Kafka 3.8).
    lists_group_types = False

    def __init__(self, workdir: Path, overrides: dict[str, str] | None = None, *,
                 extra_listeners: dict[str, tuple[str, int]] | None = None,
                 extra_properties: tuple[str, ...] = ()) -> None:
        """``overrides``: server.properties settings added to or replacing the defaults below;
        ``extra_listeners``: name -> (security protocol, port) beside PLAINTEXT; ``extra_properties``: more
        ``key=value`` lines (e.g. SASL settings), applied before ``overrides``."""
        refkit = find_refkit()
        reason = unavailable_reason(refkit)
        if reason is not None:
            pytest.skip(reason)
        super().__init__(workdir)
        self.bin = refkit / KAFKA_DIST / "bin"
        self.controller_port = free_port()  # (never the same as self.port: free_port does not repeat itself)
        self.properties = self.workdir / "kraft.properties"
        self.log_path = self.workdir / "kafka.log"
        self.overrides = dict(overrides or {})
        self.extra_listeners = extra_listeners or {}
        self.extra_properties = extra_properties

    def _env_args(self) -> list[str]:
        settings = {"LOG_DIR": str(self.workdir / "run"), **JVM_ENV}
        return ["env", *(f"{key}={value}" for key, value in settings.items())]

    def command(self) -> list[str]:
        return [*self._env_args(), str(self.bin / "kafka-server-start.sh"), str(self.properties)]

    def start(self, timeout: float = START_TIMEOUT_S) -> "ReferenceKafka":
        extra = "".join(f",{name}://{self.host}:{port}" for name, (_, port) in self.extra_listeners.items())
        extra_map = "".join(f",{name}:{protocol}" for name, (protocol, _) in self.extra_listeners.items())
        settings = dict(line.split("=", 1) for line in [
            "process.roles=broker,controller", "node.id=1",
            f"controller.quorum.voters=1@{self.host}:{self.controller_port}",
            f"listeners=PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}{extra}",
            f"advertised.listeners=PLAINTEXT://{self.host}:{self.port}{extra}", "controller.listener.names=CONTROLLER",
            f"listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT{extra_map}",
            f"log.dirs={self.data_dir}", "num.partitions=1", "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=1", "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1", "group.initial.rebalance.delay.ms=0", *self.extra_properties,
        ])
        settings.update(self.overrides)
        self.properties.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        if not (self.data_dir / "meta.properties").exists():
            storage = [*self._env_args(), str(self.bin / "kafka-storage.sh")]
            cluster_id = subprocess.run([*storage, "random-uuid"], capture_output=True, text=True, timeout=120,
                                        check=True).stdout.strip()
            subprocess.run([*storage, "format", "-t", cluster_id, "-c", str(self.properties)], capture_output=True,
                           text=True, timeout=120, check=True)
        return super().start(timeout)


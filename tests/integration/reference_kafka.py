"""A real Apache Kafka 3.7.1 broker (KRaft, one node) from ../shared/refkit, to run the same client-side
tests against the system pykbroker imitates.

    with ReferenceKafka(tmp_dir) as kafka:      # pytest.skip()s with the reason where the kit or java is absent
        kafka.bootstrap, kafka.address, kafka.port

It has what the integration tests read of a BrokerProcess (host, port, address, bootstrap, log_tail) and
node id 1, like a single pykbroker. Start takes 5-15 s of a loaded 2-core machine; use one per module.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from broker_process import HOST, free_port, probe_api_versions
from kafka_tools import KAFKA_DIST, find_refkit, unavailable_reason

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
JVM_ENV = {"KAFKA_HEAP_OPTS": "-Xmx512m",
           "KAFKA_JVM_PERFORMANCE_OPTS": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto"}


class ReferenceKafka:
    def __init__(self, workdir: Path) -> None:
        refkit = find_refkit()
        reason = unavailable_reason(refkit)
        if reason is not None:
            pytest.skip(reason)
        self.bin = refkit / KAFKA_DIST / "bin"
        self.workdir = Path(workdir)
        self.host = HOST
        self.port = free_port()
        self.controller_port = free_port()
        self.log_path = self.workdir / "kafka.log"
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def _env(self) -> dict[str, str]:
        return dict(os.environ, LOG_DIR=str(self.workdir / "run"), **JVM_ENV)

    def start(self) -> "ReferenceKafka":
        self.workdir.mkdir(parents=True, exist_ok=True)
        properties = self.workdir / "kraft.properties"
        properties.write_text("\n".join([
            "process.roles=broker,controller", "node.id=1",
            f"controller.quorum.voters=1@{self.host}:{self.controller_port}",
            f"listeners=PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://{self.host}:{self.port}", "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={self.workdir / 'logs'}", "num.partitions=1", "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=1", "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1", "group.initial.rebalance.delay.ms=0", "",
        ]))
        cluster_id = subprocess.run([str(self.bin / "kafka-storage.sh"), "random-uuid"], capture_output=True, text=True,
                                    env=self._env(), timeout=120, check=True).stdout.strip()
        subprocess.run([str(self.bin / "kafka-storage.sh"), "format", "-t", cluster_id, "-c", str(properties)],
                       capture_output=True, text=True, env=self._env(), timeout=120, check=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([str(self.bin / "kafka-server-start.sh"), str(properties)], env=self._env(),
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Kafka exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                probe_api_versions(self.address)
                return self
            except Exception:  # not listening yet, or closing the connection while it starts
                time.sleep(0.5)
        self.close()
        raise RuntimeError(f"Kafka did not answer ApiVersions within {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def close(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> "ReferenceKafka":
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()

"""Apache Kafka 3.7.1 through testcontainers, for the tests that compare pykbroker with Kafka as the project's
card describes ("compatibility tests against real Kafka", brokers started by testcontainers).

    tag = kafka_reference_image(base_image)          # builds docker/kafka-reference/Dockerfile; skips without refkit
    with KafkaReferenceContainer(tag) as kafka:       # one KRaft node (broker + controller), host networking
        kafka.get_bootstrap_server()                  # 127.0.0.1:<a free port>

The image is built at test time from the Kafka distribution in ../shared/refkit (the build context is that
directory: nothing of Kafka is copied into the repository) on the suite's Debian base, with Debian's
openjdk-17-jre-headless. The container is a KafkaProtocolContainer, like PykbrokerContainer: free ports on the
host's 127.0.0.1, ready when it answers ApiVersions, its output in the error when it is not, removed by stop().
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from docker_helpers import _CHECKOUT
from pykbroker.testcontainers import LOOPBACK, KafkaProtocolContainer

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "docker" / "kafka-reference" / "Dockerfile"
# Tagged per checkout, as docker_helpers tags the suite's other images: worktrees on one machine never race
# for one tag (the layer cache is shared, so each builds in seconds once one did).
IMAGE_TAG = f"pykbroker-kafka-reference:3.7.1-test-{_CHECKOUT}"
START_TIMEOUT_S = 120.0  # format + JVM start: 10-20 s on a loaded 2-core machine
DATA_DIR = "/var/lib/kafka/data"

# integration/bench/brokers.py: where the kit is, the KRaft single-node settings and cluster ids the benchmark
# and the bare-process reference Kafka use; tests/integration/reference_kafka.py: the JVM options for a fast start.
for _extra in (REPO_ROOT / "integration" / "bench", REPO_ROOT / "tests" / "integration"):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))

from brokers import KAFKA_DIST, default_refkit, kraft_cluster_id, kraft_properties  # noqa: E402
from reference_kafka import JVM_ENV  # noqa: E402

# What a single node needs beyond kraft_properties to serve group tests quickly (tests/integration's
# ReferenceKafka sets the same): one __consumer_offsets partition, no initial rebalance delay.
SINGLE_NODE_SETTINGS = {"num.partitions": "1", "offsets.topic.num.partitions": "1",
                        "group.initial.rebalance.delay.ms": "0"}


def kafka_distribution_or_skip() -> Path:
    """The Kafka 3.7.1 distribution of the reference kit, or skip the test saying where it was looked for."""
    kafka_home = default_refkit() / KAFKA_DIST
    if not (kafka_home / "bin" / "kafka-server-start.sh").is_file():
        pytest.skip(f"no Apache Kafka at {kafka_home} (the reference kit is not on this machine)")
    return kafka_home


def kafka_reference_image(base_image: str, tag: str = IMAGE_TAG) -> str:
    """Build docker/kafka-reference/Dockerfile on ``base_image`` with the kit's Kafka as the build context
    (Docker's layer cache makes a rebuild of an unchanged recipe a few seconds); returns the tag."""
    from docker_helpers import build_image

    kafka_home = kafka_distribution_or_skip()
    build_image(tag, DOCKERFILE, kafka_home, {"BASE_IMAGE": base_image})
    return tag


class KafkaReferenceContainer(KafkaProtocolContainer):
    """Apache Kafka 3.7.1, one KRaft node, in a container; ``overrides`` are server.properties settings."""

    def __init__(self, image: str = IMAGE_TAG, port: int | None = None, *,
                 overrides: dict[str, str] | None = None, host_network: bool = True, **kwargs) -> None:
        if not host_network:
            # kraft_properties names the listen host as the controller voter: 0.0.0.0 on a bridge network
            raise ValueError("KafkaReferenceContainer runs on the host's network only (host_network=True)")
        super().__init__(image, port, host_network=True, **kwargs)
        self.controller_port: int | None = None  # chosen by start(), as the port
        self.overrides = {**SINGLE_NODE_SETTINGS, **(overrides or {})}
        self.cluster_id = kraft_cluster_id()
        for key, value in JVM_ENV.items():
            self.with_env(key, value)

    def _choose_ports(self) -> None:
        super()._choose_ports()
        from pykbroker.cluster.zk_server import free_port

        self.controller_port = free_port(LOOPBACK)

    def with_broker_config(self, key: str, value) -> "KafkaReferenceContainer":
        self.overrides[key] = str(value)
        return self

    def server_properties(self, listen_host: str, advertised_host: str, advertised_port: int) -> str:
        # kraft_properties listens and advertises on one host; Java's Properties keeps the last of a repeated key
        lines = [kraft_properties(listen_host, self.port, self.controller_port, Path(DATA_DIR)).rstrip("\n"),
                 f"advertised.listeners=PLAINTEXT://{advertised_host}:{advertised_port}",
                 *(f"{key}={value}" for key, value in self.overrides.items())]
        return "\n".join(lines) + "\n"

    def serve_command(self, listen_host: str, advertised_host: str, advertised_port: int) -> list[str]:
        properties = self.server_properties(listen_host, advertised_host, advertised_port)
        script = (f"set -e\nprintf %s {shlex.quote(properties)} > server.properties\n"
                  f"kafka-storage.sh format -t {self.cluster_id} -c server.properties\n"
                  "exec kafka-server-start.sh server.properties\n")
        return ["sh", "-c", script]

    def start(self, timeout: float = START_TIMEOUT_S) -> "KafkaReferenceContainer":
        return super().start(timeout)

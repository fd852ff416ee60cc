"""pykbroker for testcontainers users: ``PykbrokerContainer``, used like testcontainers' ``KafkaContainer``.

    from pykbroker.testcontainers import PykbrokerContainer

    with PykbrokerContainer().with_partitions(3) as kafka:
        producer = Producer({"bootstrap.servers": kafka.get_bootstrap_server()})

It runs the image built from this project's ``docker/Dockerfile`` (tag ``pykbroker:latest``; when the image is
missing and this is a checkout, ``PykbrokerContainer.build_image()`` builds it, or pass ``image=``).

Networking: by default the container shares the host's network (``--network host``), as Docker engines without
a bridge network (``dockerd --bridge=none``) and tests that must keep all traffic on the loopback need: the broker
listens on 127.0.0.1 at a port that was free on the host (or the one passed as ``port=``) and advertises
127.0.0.1:port, so no port mapping is involved; its /health, /ready and /metrics (the image's HEALTHCHECK)
are on another free port, ``metrics_port``. ``host_network=False`` instead publishes the port through
Docker's bridge network: the advertised address (the Docker host and the port Docker mapped) is only known once
the container runs, so, as KafkaContainer does, the container waits for a start script copied in after start.

Ready means the broker answers an ApiVersions request. A broker that exits or is not ready in time fails
``start()`` with the container's output in the error, and the container is removed; ``stop()`` removes it.

Needs the ``testcontainers`` package (``pip install testcontainers``) and a Docker engine.
"""

from __future__ import annotations

import io
import shlex
import tarfile
import time
from pathlib import Path
from typing import Any

try:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.exceptions import ContainerStartException
except ImportError as exc:  # pragma: no cover - exercised by a test that hides testcontainers
    raise ImportError(
        "pykbroker.testcontainers needs the testcontainers package, which is not installed: "
        "pip install testcontainers (or use the pytest plugin, pykbroker.testing, which needs no Docker)"
    ) from exc

from pykbroker.testdefaults import TEST_BROKER_CONFIG

__all__ = ("PykbrokerContainer", "KafkaProtocolContainer", "ContainerStartException", "DEFAULT_IMAGE")

DEFAULT_IMAGE = "pykbroker:latest"
LOOPBACK = "127.0.0.1"
BRIDGE_PORT = 9093  # the port inside the container on a bridge network (published to a random host port)
START_SCRIPT = "/tc-start.sh"
START_TIMEOUT_S = 60.0
LOG_TAIL_CHARS = 4000
REPO_ROOT = Path(__file__).resolve().parents[1]


class KafkaProtocolContainer(DockerContainer):
    """A container serving the Kafka protocol on one port, which PykbrokerContainer (and a container of any
    Kafka broker) refines by saying what the container runs (``serve_command``).

    Host networking (the default): the port is chosen here, free on the host's 127.0.0.1, unless given.
    Bridge networking (``host_network=False``): ``port`` is the port inside the container, published by
    Docker; the command, which must know the published address, runs from a script copied in after start.
    """

    def __init__(self, image: str, port: int | None = None, *, host_network: bool = True, **kwargs: Any) -> None:
        super().__init__(image, **kwargs)
        self.host_network = host_network
        if host_network:
            from pykbroker.cluster.zk_server import free_port  # standard library only: cheap

            self.port = port if port is not None else free_port(LOOPBACK)
        else:
            self.port = port if port is not None else BRIDGE_PORT
            self.with_exposed_ports(self.port)
        self.labels: dict[str, str] = {}
        self.ready_seconds: float | None = None  # start() to the first ApiVersions answer

    def with_labels(self, labels: dict[str, str]) -> "KafkaProtocolContainer":
        """Docker labels on the container (e.g. for a test suite to find and remove its containers)."""
        self.labels.update(labels)
        return self

    # -- what a subclass says --------------------------------------------------------------------------

    def serve_command(self, listen_host: str, advertised_host: str, advertised_port: int) -> list[str]:
        """The command (argv) serving the protocol on ``listen_host:self.port``, advertising the address."""
        raise NotImplementedError

    # -- addresses ---------------------------------------------------------------------------------------

    def get_bootstrap_server(self) -> str:
        host, port = self.address()
        return f"{host}:{port}"

    def address(self) -> tuple[str, int]:
        if self.host_network:
            return LOOPBACK, self.port
        return self.get_container_host_ip(), int(self.get_exposed_port(self.port))

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT_S) -> "KafkaProtocolContainer":
        """Start the container and wait until it answers ApiVersions. If that fails the container is removed
        (also when ``start()`` is called outside a ``with``: nothing is left running) and the error raised:
        ContainerStartException when the container exits or its image is missing, TimeoutError when it is
        not ready in time; both carry the end of the container's output."""
        self._check_image()
        self._kwargs["labels"] = {**self._kwargs.get("labels", {}), **self.labels}
        if self.host_network:
            self._kwargs["network"] = "host"  # docker's SDK: network_mode host (no port is published)
            command = self.serve_command(LOOPBACK, LOOPBACK, self.port)
            self._kwargs["entrypoint"] = command[:1]
            self.with_command(command[1:])
        else:
            # the image's entrypoint is not used: wait for the start script (see _write_start_script)
            self._kwargs["entrypoint"] = ["sh", "-c"]
            self.with_command(f"while [ ! -f {START_SCRIPT} ]; do sleep 0.1; done; exec sh {START_SCRIPT}")
        started = time.monotonic()
        try:
            super().start()
            if not self.host_network:
                self._write_start_script()
            self._wait_ready(started + timeout)
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - started
        return self

    def stop(self, force: bool = True, delete_volume: bool = True) -> None:
        """Remove the container and its anonymous volumes; a second call (``with`` after a failed start) does
        nothing."""
        if self._container is None:
            return
        try:
            super().stop(force=force, delete_volume=delete_volume)
        finally:
            self._container = None

    def logs_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The end of the container's output (stdout and stderr)."""
        out, err = self.get_logs()
        return (out + err).decode(errors="replace")[-chars:]

    def _check_image(self) -> None:
        import docker.errors

        try:
            self.get_docker_client().client.images.get(self.image)
        except docker.errors.ImageNotFound:
            raise ContainerStartException(f"no image {self.image} on the Docker engine: {self._missing_image_hint()}")

    def _missing_image_hint(self) -> str:
        return "build or pull it first"

    def _container_status(self) -> str:
        """The wrapped (docker SDK) container's status, refreshed: "running", "exited", ..."""
        container = self.get_wrapped_container()
        container.reload()
        return container.status

    def _write_start_script(self) -> None:
        host, port = self.address()
        content = ("#!/bin/sh\nexec " + shlex.join(self.serve_command("0.0.0.0", host, port)) + "\n").encode()
        archive = io.BytesIO()
        with tarfile.TarFile(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(name=START_SCRIPT)
            info.size = len(content)
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(content))
        self.get_wrapped_container().put_archive(path="/", data=archive.getvalue())

    def _wait_ready(self, deadline: float) -> None:
        from kio.schema.api_versions.v0.request import ApiVersionsRequest

        from pykbroker.testing import _request

        address = self.address()
        while True:
            try:
                if _request(address, ApiVersionsRequest(), timeout=1.0).error_code == 0:
                    return
            except (OSError, ValueError):
                pass
            status = self._container_status()
            if status in ("exited", "dead"):
                code = self.get_wrapped_container().attrs["State"].get("ExitCode")
                raise ContainerStartException(
                    f"{self.image} in container {self.get_container_id()[:12]} exited with code {code} before "
                    f"answering on {address[0]}:{address[1]}; its output:\n{self.logs_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.image} in container {self.get_container_id()[:12]} not ready on "
                                   f"{address[0]}:{address[1]} ({status}); its output:\n{self.logs_tail()}")
            time.sleep(0.1)


class PykbrokerContainer(KafkaProtocolContainer):
    """One pykbroker broker (embedded metadata) in a container; see the module's docstring for networking."""

    def __init__(self, image: str = DEFAULT_IMAGE, port: int | None = None, **kwargs: Any) -> None:
        super().__init__(image, port, **kwargs)
        self.broker_config: dict[str, str] = {key: str(value) for key, value in TEST_BROKER_CONFIG.items()}
        self.log_level = "info"
        self.metrics_port: int | None = None
        if self.host_network:
            # The image serves /health (its HEALTHCHECK) on PYKBROKER_METRICS_PORT, a fixed port: on the host's
            # network two containers (or a container and any other broker) would both bind it.
            from pykbroker.cluster.zk_server import free_port

            self.metrics_port = free_port(LOOPBACK)
            self.with_env("PYKBROKER_METRICS_PORT", str(self.metrics_port))

    # -- options, in the with_... style of testcontainers ------------------------------------------

    def with_broker_config(self, key: str, value: Any) -> "PykbrokerContainer":
        """Any Kafka broker config (``pykbroker serve --override KEY=VALUE``)."""
        self.broker_config[key] = str(value)
        return self

    def with_partitions(self, partitions: int) -> "PykbrokerContainer":
        """num.partitions of auto-created topics and of CreateTopics asking for the default."""
        return self.with_broker_config("num.partitions", partitions)

    def with_auto_create_topics(self, enabled: bool = True) -> "PykbrokerContainer":
        return self.with_broker_config("auto.create.topics.enable", "true" if enabled else "false")

    def with_log_level(self, level: str) -> "PykbrokerContainer":
        self.log_level = level
        return self

    @staticmethod
    def build_image(tag: str = DEFAULT_IMAGE, context: Path = REPO_ROOT, base_image: str | None = None) -> str:
        """Build docker/Dockerfile of a pykbroker checkout (on ``base_image``, the Dockerfile's BASE_IMAGE, when
        given); returns the tag."""
        from testcontainers.core.image import DockerImage

        if not (context / "docker" / "Dockerfile").is_file():
            raise FileNotFoundError(f"no docker/Dockerfile under {context}: pass the checkout's path, or image=")
        build_args = {"BASE_IMAGE": base_image} if base_image else None
        DockerImage(path=str(context), tag=tag, dockerfile_path="docker/Dockerfile", clean_up=False,
                    buildargs=build_args, network_mode="host").build()
        return tag

    def serve_command(self, listen_host: str, advertised_host: str, advertised_port: int) -> list[str]:
        command = ["pykbroker", "serve", "--host", listen_host, "--port", str(self.port), "--data-dir", "/data",
                   "--advertised-host", advertised_host, "--advertised-port", str(advertised_port),
                   "--log-level", self.log_level]
        for key, value in self.broker_config.items():
            command += ["--override", f"{key}={value}"]
        return command

    def _missing_image_hint(self) -> str:
        return ("build it from a pykbroker checkout with PykbrokerContainer.build_image() (docker build -f "
                "docker/Dockerfile -t pykbroker .), or pass image=")

"""pykbroker for testcontainers users: ``PykbrokerContainer``, used like testcontainers' ``KafkaContainer``.

    from pykbroker.testcontainers import PykbrokerContainer

    with PykbrokerContainer().with_partitions(3) as kafka:
        producer = Producer({"bootstrap.servers": kafka.get_bootstrap_server()})

It runs the image built from this project's ``docker/Dockerfile`` (tag ``pykbroker:latest``; when the image is
missing and this is a checkout, ``PykbrokerContainer.build_image()`` builds it, ``base_image=`` choosing the base
where no registry serves python:3.11-slim; or pass ``image=``).

Networking: ``host_network=None`` (the default) chooses (``choose_host_network``): the host's network
(``--network host``) for a local Linux engine (DOCKER_HOST unset or a unix socket, not Docker Desktop), as engines
without a bridge network (``dockerd --bridge=none``) and tests that must keep all traffic on the loopback need;
Docker's bridge network elsewhere (Docker Desktop, a remote DOCKER_HOST, Docker in Docker), whose host network is
not this machine's; an engine with neither is refused with the reason. On the host's network the broker listens
on 127.0.0.1 at a port that was free on the host (or the one passed as ``port=``) and advertises 127.0.0.1:port,
so no port mapping is involved; its /health, /ready and /metrics (the image's HEALTHCHECK) are on another free
port, ``metrics_port``. On a bridge network (``host_network=False``) the port is published: the advertised
address (the Docker host and the port Docker mapped) is only known once the container runs, so, as
KafkaContainer does, the container waits for a start script copied in after start; /health is on 9644 inside.

Ready means the broker answers an ApiVersions request. A broker that exits or is not ready in time fails
``start()`` with the container's output in the error, and the container is removed; ``stop()`` removes it.

A cluster: ``PykbrokerCluster(brokers=3)`` runs ZooKeeper (this project's docker/zookeeper image,
``ZooKeeperContainer``) and the brokers, each in its container on the host's network, and is used the same way.

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

__all__ = ("PykbrokerContainer", "PykbrokerCluster", "ZooKeeperContainer", "KafkaProtocolContainer", "ServerContainer",
           "ContainerStartException", "DEFAULT_IMAGE", "DEFAULT_ZOOKEEPER_IMAGE", "choose_host_network")

DEFAULT_IMAGE = "pykbroker:latest"
DEFAULT_ZOOKEEPER_IMAGE = "pykbroker-zookeeper:latest"
LOCAL_ONLY_IMAGES = (DEFAULT_IMAGE, DEFAULT_ZOOKEEPER_IMAGE)  # never pulled when missing: built, not published
LOOPBACK = "127.0.0.1"
BRIDGE_PORT = 9093  # the port inside the container on a bridge network (published to a random host port)
START_SCRIPT = "/tc-start.sh"
START_TIMEOUT_S = 60.0
LOG_TAIL_CHARS = 4000
REPO_ROOT = Path(__file__).resolve().parents[1]


BRIDGE_METRICS_PORT = 9644  # the image's PYKBROKER_METRICS_PORT inside a container on a bridge network


def choose_host_network(docker_host: str | None, operating_system: str, networks: list[str]) -> bool:
    """The automatic choice (``host_network=None``): the host's network only where it is this machine's, a local
    Linux engine (DOCKER_HOST unset or a unix socket, and not Docker Desktop, whose "host" is its VM); elsewhere
    (Docker Desktop, a remote DOCKER_HOST, Docker in Docker) Docker's bridge network with a published port. An
    engine that is not local and has no bridge network can serve neither: ContainerStartException saying so."""
    local = not docker_host or docker_host.startswith("unix://")
    if local and operating_system != "Docker Desktop":
        return True
    if "bridge" in networks:
        return False
    raise ContainerStartException(
        f"the Docker engine ({docker_host or 'the local socket'}, {operating_system}) is not this machine's (its "
        "host network is not ours) and has no bridge network to publish a port on: start a local engine, or one "
        "with a bridge network, or pass host_network=True where its host network is reachable")


def engine_host_network(client: Any) -> bool:
    """choose_host_network for the engine of ``client`` (a docker SDK DockerClient)."""
    import os

    networks = [network.name for network in client.networks.list(names=["bridge"])]
    return choose_host_network(os.environ.get("DOCKER_HOST"), client.info().get("OperatingSystem", ""), networks)


class ServerContainer(DockerContainer):
    """A container serving on one port, ready once ``_answers`` says so; KafkaProtocolContainer (pykbroker or any
    Kafka broker) and ZooKeeperContainer refine it by saying what the container runs (``serve_command``).

    Host networking (``host_network=True``, or chosen by ``host_network=None``): the port is chosen by start(),
    free on the host's 127.0.0.1, unless given. Bridge networking (``host_network=False``): ``port`` is the port
    inside the container, published by Docker; the command, which must know the published address, runs from a
    script copied in after start.
    """

    def __init__(self, image: str, port: int | None = None, *, host_network: bool | None = None,
                 **kwargs: Any) -> None:
        super().__init__(image, **kwargs)
        if host_network is None:
            host_network = engine_host_network(self.get_docker_client().client)
        self.host_network = host_network
        self.given_port = port
        if host_network:
            self.port: int | None = port  # chosen by start() unless given (_choose_ports)
        else:
            self.port = port if port is not None else BRIDGE_PORT
            self.with_exposed_ports(self.port)
        self.labels: dict[str, str] = {}
        self.ready_seconds: float | None = None  # start() to the first answer

    def with_labels(self, labels: dict[str, str]) -> "ServerContainer":
        """Docker labels on the container (e.g. for a test suite to find and remove its containers)."""
        self.labels.update(labels)
        return self

    # -- what a subclass says --------------------------------------------------------------------------

    def serve_command(self, listen_host: str, advertised_host: str, advertised_port: int) -> list[str]:
        """The command (argv) serving on ``listen_host:self.port``, telling clients the advertised address."""
        raise NotImplementedError

    def _answers(self, address: tuple[str, int]) -> bool:
        """Whether the server at ``address`` answers as a ready one (OSError and ValueError: not yet)."""
        raise NotImplementedError

    # -- addresses ---------------------------------------------------------------------------------------

    def address(self) -> tuple[str, int]:
        if self.host_network:
            return LOOPBACK, self.port
        return self.get_container_host_ip(), int(self.get_exposed_port(self.port))

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT_S) -> "ServerContainer":
        """Start the container and wait until it answers (``_answers``). If that fails the container is removed
        (also when ``start()`` is called outside a ``with``: nothing is left running) and the error raised:
        ContainerStartException when the container exits or its image is missing (an image other than the
        defaults, which no registry has, is pulled first), TimeoutError when it is
        not ready in time; both carry the end of the container's output."""
        self._check_image()
        started = time.monotonic()
        for attempt in (1, 2):
            self._choose_ports()  # just before the container binds them
            self._configure()
            try:
                super().start()
                if self.uses_start_script:
                    self._write_start_script()
                self._wait_ready(started + timeout)
                break
            except ContainerStartException as error:
                self.stop()
                # a port chosen here was taken before the container bound it: once more with fresh ones
                if attempt == 2 or not self._ports_chosen_here() or "in use" not in str(error):
                    raise
            except BaseException:
                self.stop()
                raise
        self.ready_seconds = time.monotonic() - started
        return self

    def _choose_ports(self) -> None:
        """Choose the host ports not given (host networking): free now, never one this process chose before."""
        if self.host_network and self.given_port is None:
            from pykbroker.cluster.zk_server import free_port  # standard library only: cheap

            self.port = free_port(LOOPBACK)

    def _ports_chosen_here(self) -> bool:
        """Whether every host port the container binds was chosen by _choose_ports (none given by the user)."""
        return self.host_network and self.given_port is None

    @property
    def uses_start_script(self) -> bool:
        """Whether the command runs from a script copied in after start: always on a bridge network (the
        advertised address is known only then); on the host's network when ``start_script`` was set (tests)."""
        return not self.host_network or self.start_script

    start_script = False

    def _configure(self) -> None:
        """What the container is created with (the docker SDK's run() arguments): labels, network, entry point
        and command."""
        self._kwargs["labels"] = {**self._kwargs.get("labels", {}), **self.labels}
        if self.host_network:
            self._kwargs["network"] = "host"  # docker's SDK: network_mode host (no port is published)
        if self.uses_start_script:
            # the image's entrypoint is not used: wait for the start script (see _write_start_script). One
            # element: a string command would be split by the docker SDK (shlex), giving sh -c "while".
            self._kwargs["entrypoint"] = ["sh", "-c"]
            self.with_command([f"while [ ! -f {START_SCRIPT} ]; do sleep 0.1; done; exec sh {START_SCRIPT}"])
        else:
            command = self.serve_command(LOOPBACK, LOOPBACK, self.port)
            self._kwargs["entrypoint"] = command[:1]
            self.with_command(command[1:])

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

        images = self.get_docker_client().client.images
        try:
            images.get(self.image)
            return
        except docker.errors.ImageNotFound:
            pass
        if self.image in LOCAL_ONLY_IMAGES:  # built from this project, on no registry: pulling only fails
            raise ContainerStartException(f"no image {self.image} on the Docker engine: {self._missing_image_hint()}")
        try:
            images.pull(self.image)
        except docker.errors.DockerException as error:
            raise ContainerStartException(f"no image {self.image} on the Docker engine and pulling it failed "
                                          f"({error}): {self._missing_image_hint()}") from error

    def _missing_image_hint(self) -> str:
        return "build or pull it first"

    def _container_status(self) -> str:
        """The wrapped (docker SDK) container's status, refreshed: "running", "exited", ..."""
        container = self.get_wrapped_container()
        container.reload()
        return container.status

    def _write_start_script(self) -> None:
        host, port = self.address()
        listen = "0.0.0.0" if not self.host_network else LOOPBACK
        content = ("#!/bin/sh\nexec " + shlex.join(self.serve_command(listen, host, port)) + "\n").encode()
        archive = io.BytesIO()
        with tarfile.TarFile(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(name=START_SCRIPT)
            info.size = len(content)
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(content))
        self.get_wrapped_container().put_archive(path="/", data=archive.getvalue())

    def _wait_ready(self, deadline: float) -> None:
        address = self.address()
        while True:
            try:
                if self._answers(address):
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


class KafkaProtocolContainer(ServerContainer):
    """A Kafka broker in a container (pykbroker or Kafka itself): ready when it answers ApiVersions."""

    def get_bootstrap_server(self) -> str:
        host, port = self.address()
        return f"{host}:{port}"

    def _answers(self, address: tuple[str, int]) -> bool:
        from kio.schema.api_versions.v0.request import ApiVersionsRequest

        from pykbroker.testing import _request

        return _request(address, ApiVersionsRequest(), timeout=1.0).error_code == 0


class PykbrokerContainer(KafkaProtocolContainer):
    """One pykbroker broker (embedded metadata) in a container; see the module's docstring for networking."""

    def __init__(self, image: str = DEFAULT_IMAGE, port: int | None = None, **kwargs: Any) -> None:
        super().__init__(image, port, **kwargs)
        self.broker_config: dict[str, str] = {key: str(value) for key, value in TEST_BROKER_CONFIG.items()}
        self.log_level = "info"
        self.zookeeper_connect: str | None = None
        self.broker_id = 1
        # The image serves /health (its HEALTHCHECK) on PYKBROKER_METRICS_PORT; the image's entry point, which
        # sets it, is bypassed here (the entrypoint is the command), so it is always set: on the host's network a
        # free port (two containers, or a container and any other broker, would both bind a fixed one), on a
        # bridge network the image's 9644 inside the container (``metrics_port`` is then that inside port).
        self.metrics_port: int | None = None if self.host_network else BRIDGE_METRICS_PORT  # host: chosen by start()
        if not self.host_network:
            self.with_env("PYKBROKER_METRICS_PORT", str(self.metrics_port))

    def _choose_ports(self) -> None:
        super()._choose_ports()
        if self.host_network:
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

    def with_zookeeper(self, connect: str, broker_id: int) -> "PykbrokerContainer":
        """A member of a cluster coordinated by ZooKeeper at ``connect`` (``--zookeeper``, ``--broker-id``)."""
        self.zookeeper_connect, self.broker_id = connect, broker_id
        return self

    @staticmethod
    def build_image(tag: str = DEFAULT_IMAGE, context: Path = REPO_ROOT, base_image: str | None = None,
                    ca_bundle: Path | None = None, docker: str = "docker", timeout: float = 1800, *,
                    dockerfile: Path | None = None, build_args: dict[str, str] | None = None,
                    secrets: dict[str, Path] | None = None, labels: dict[str, str] | None = None) -> str:
        """Build docker/Dockerfile of a pykbroker checkout (or ``dockerfile``) with the docker CLI (BuildKit,
        which the Dockerfile needs; the host's network, which engines without a bridge need) and return the tag.
        ``base_image``: the Dockerfile's BASE_IMAGE (python:3.11-slim unless given; any Debian bookworm image
        works), other ``build_args`` as given; ``ca_bundle``: a CA bundle for pip inside the build (the BuildKit
        secret ``ca_bundle``, not kept in the image), ``secrets``: more of them (id: file, e.g. ``pip_config``);
        ``labels``: labels of the image (to find and remove it later); ``docker``: the docker client to run (one
        whose ``docker build`` has BuildKit). The Dockerfile is not in the wheel: from a pip install, pass a
        checkout's path as ``context``."""
        import os
        import subprocess

        dockerfile = dockerfile or context / "docker" / "Dockerfile"
        if not dockerfile.is_file():
            shown = dockerfile.relative_to(context) if dockerfile.is_relative_to(context) else dockerfile
            raise FileNotFoundError(f"no {shown} under {context}: pass the checkout's path (a pip-installed pykbroker has no "
                                    "docker/ directory: clone the repository), or image=")
        command = [docker, "build", "--network", "host", "-f", str(dockerfile), "-t", tag]
        for key, value in (labels or {}).items():
            command += ["--label", f"{key}={value}"]
        for key, value in {**({"BASE_IMAGE": base_image} if base_image else {}), **(build_args or {})}.items():
            command += ["--build-arg", f"{key}={value}"]
        for secret_id, path in {**({"ca_bundle": ca_bundle} if ca_bundle else {}), **(secrets or {})}.items():
            command += ["--secret", f"id={secret_id},src={path}"]
        done = subprocess.run([*command, str(context)], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "DOCKER_BUILDKIT": "1"})
        if done.returncode != 0:
            raise ContainerStartException(f"{shlex.join(command)} failed (exit {done.returncode}):\n"
                                          + "\n".join((done.stdout + done.stderr).splitlines()[-30:]))
        return tag

    def serve_command(self, listen_host: str, advertised_host: str, advertised_port: int) -> list[str]:
        command = ["pykbroker", "serve", "--host", listen_host, "--port", str(self.port), "--data-dir", "/data",
                   "--advertised-host", advertised_host, "--advertised-port", str(advertised_port),
                   "--log-level", self.log_level]
        if self.zookeeper_connect is not None:
            command += ["--zookeeper", self.zookeeper_connect, "--broker-id", str(self.broker_id)]
        for key, value in self.broker_config.items():
            command += ["--override", f"{key}={value}"]
        return command

    def _missing_image_hint(self) -> str:
        return ("build it from a pykbroker checkout (a pip install has no docker/Dockerfile) with "
                "PykbrokerContainer.build_image(context=<checkout>) (docker build -f docker/Dockerfile -t pykbroker "
                "<checkout>), or pass image=")


class ZooKeeperContainer(ServerContainer):
    """A standalone ZooKeeper server from this project's docker/zookeeper image (its entry point reads ZOO_HOST
    and ZOO_PORT), on the host's network at a free 127.0.0.1 port; ready when it answers ``ruok``."""

    def __init__(self, image: str = DEFAULT_ZOOKEEPER_IMAGE, port: int | None = None, **kwargs: Any) -> None:
        super().__init__(image, port, host_network=True, **kwargs)
        self.with_env("ZOO_HOST", LOOPBACK)

    def _choose_ports(self) -> None:
        super()._choose_ports()
        self.with_env("ZOO_PORT", str(self.port))

    def get_connect_string(self) -> str:
        """host:port, once started (the port is chosen by start() unless given)."""
        if self.port is None:
            raise RuntimeError("the ZooKeeper container has no port yet: start() chooses it")
        return f"{LOOPBACK}:{self.port}"

    def serve_command(self, listen_host: str, advertised_host: str, advertised_port: int) -> list[str]:
        return ["zookeeper-entrypoint"]

    def _answers(self, address: tuple[str, int]) -> bool:
        from pykbroker.cluster.zk_server import four_letter_word

        return four_letter_word(*address, "ruok") == "imok"

    def _missing_image_hint(self) -> str:
        return ("build it from a pykbroker checkout: docker build -t pykbroker-zookeeper docker/zookeeper, or pass "
                "zookeeper_image=")


class PykbrokerCluster:
    """``brokers`` PykbrokerContainers (broker ids 1..n) coordinated by a ZooKeeperContainer, every container on
    the host's network with its own free 127.0.0.1 ports; used like a container:

        with PykbrokerCluster(brokers=3) as cluster:
            Producer({"bootstrap.servers": cluster.get_bootstrap_server(), "acks": "all"})

    Ready when every broker's Metadata lists all brokers. A cluster of fewer than 3 brokers gets as many
    replicas of the internal topics as it has brokers (as ``pykbroker cluster`` does); ``stop()`` removes every
    container, ``broker(n)`` is broker n's PykbrokerContainer."""

    def __init__(self, image: str = DEFAULT_IMAGE, zookeeper_image: str = DEFAULT_ZOOKEEPER_IMAGE,
                 brokers: int = 3) -> None:
        if brokers < 1:
            raise ValueError("a cluster needs at least one broker")
        self.zookeeper = ZooKeeperContainer(zookeeper_image)
        self.brokers = [PykbrokerContainer(image, host_network=True) for _ in range(brokers)]
        for broker_id, broker in enumerate(self.brokers, 1):
            broker.broker_id = broker_id  # its ZooKeeper is known once that started (its port chosen then)
        if brokers < 3:
            for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor"):
                self.with_broker_config(key, brokers)
        self.ready_seconds: float | None = None

    def with_broker_config(self, key: str, value: Any) -> "PykbrokerCluster":
        for broker in self.brokers:
            broker.with_broker_config(key, value)
        return self

    def with_labels(self, labels: dict[str, str]) -> "PykbrokerCluster":
        for container in (self.zookeeper, *self.brokers):
            container.with_labels(labels)
        return self

    def broker(self, broker_id: int) -> PykbrokerContainer:
        return self.brokers[broker_id - 1]

    def get_bootstrap_server(self) -> str:
        return ",".join(broker.get_bootstrap_server() for broker in self.brokers)

    def start(self, timeout: float = START_TIMEOUT_S) -> "PykbrokerCluster":
        """Start ZooKeeper, then the brokers, and wait until each lists them all; on failure every container is
        removed and the error (with the failing container's output) raised."""
        from pykbroker.devcluster import live_broker_ids

        started = time.monotonic()
        deadline = started + timeout
        try:
            self.zookeeper.start(timeout)
            for broker in self.brokers:
                broker.with_zookeeper(self.zookeeper.get_connect_string(), broker.broker_id)
                broker.start(max(deadline - time.monotonic(), 1.0))
            expected = {broker.broker_id for broker in self.brokers}
            for broker in self.brokers:
                while (listed := live_broker_ids(*broker.address())) != expected:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"broker {broker.broker_id} lists brokers {sorted(listed or [])}, not "
                                           f"{sorted(expected)}; its output:\n{broker.logs_tail()}")
                    time.sleep(0.1)
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        for container in (*self.brokers, self.zookeeper):
            container.stop()

    def __enter__(self) -> "PykbrokerCluster":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

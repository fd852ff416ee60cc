"""pykbroker for testcontainers users: ``PykbrokerContainer``, used like testcontainers' ``KafkaContainer``.

    from pykbroker.testcontainers import PykbrokerContainer

    with PykbrokerContainer().with_partitions(3) as kafka:
        producer = Producer({"bootstrap.servers": kafka.get_bootstrap_server()})

It runs the image built from this project's ``docker/Dockerfile`` (tag ``pykbroker:latest``; when the image is
missing and this is a checkout, ``PykbrokerContainer.build_image()`` builds it, or pass ``image=``). The broker
must advertise the address clients reach it at - the Docker host and the port Docker mapped - which is only
known once the container runs: as KafkaContainer does, the container waits for a start script that is copied
in after start, which runs ``pykbroker serve`` with that advertised address. Ready means the broker answers
an ApiVersions request on the mapped port.

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
except ImportError as exc:  # pragma: no cover - exercised by a test that hides testcontainers
    raise ImportError(
        "pykbroker.testcontainers needs the testcontainers package, which is not installed: "
        "pip install testcontainers (or use the pytest plugin, pykbroker.testing, which needs no Docker)"
    ) from exc

from pykbroker.testdefaults import TEST_BROKER_CONFIG

__all__ = ("PykbrokerContainer", "DEFAULT_IMAGE")

DEFAULT_IMAGE = "pykbroker:latest"
BROKER_PORT = 9093
START_SCRIPT = "/tc-start.sh"
REPO_ROOT = Path(__file__).resolve().parents[1]


class PykbrokerContainer(DockerContainer):
    """One pykbroker broker (embedded metadata) in a container, its port published on the Docker host."""

    def __init__(self, image: str = DEFAULT_IMAGE, port: int = BROKER_PORT, **kwargs: Any) -> None:
        super().__init__(image, **kwargs)
        self.port = port
        self.broker_config: dict[str, str] = {key: str(value) for key, value in TEST_BROKER_CONFIG.items()}
        self.log_level = "info"
        self.with_exposed_ports(port)
        # the image's entrypoint is `pykbroker serve`; wait for the start script instead (see tc_start)
        self.with_kwargs(entrypoint=["sh", "-c"])
        self.with_command(f"while [ ! -f {START_SCRIPT} ]; do sleep 0.1; done; exec sh {START_SCRIPT}")

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
    def build_image(tag: str = DEFAULT_IMAGE, context: Path = REPO_ROOT) -> str:
        """Build docker/Dockerfile of a pykbroker checkout; returns the tag."""
        from testcontainers.core.image import DockerImage

        if not (context / "docker" / "Dockerfile").is_file():
            raise FileNotFoundError(f"no docker/Dockerfile under {context}: pass the checkout's path, or image=")
        DockerImage(path=str(context), tag=tag, dockerfile_path="docker/Dockerfile", clean_up=False).build()
        return tag

    # -- lifecycle -----------------------------------------------------------------------------------

    def serve_command(self, advertised_host: str, advertised_port: int) -> list[str]:
        command = ["pykbroker", "serve", "--host", "0.0.0.0", "--port", str(self.port), "--data-dir", "/data",
                   "--advertised-host", advertised_host, "--advertised-port", str(advertised_port),
                   "--log-level", self.log_level]
        for key, value in self.broker_config.items():
            command += ["--override", f"{key}={value}"]
        return command

    def get_bootstrap_server(self) -> str:
        return f"{self.get_container_host_ip()}:{self.get_exposed_port(self.port)}"

    def start(self, timeout: float = 60.0) -> "PykbrokerContainer":
        """Start the container and wait for the broker. If that fails the container is removed (also when
        ``start()`` is called outside a ``with``: nothing is left running) and the error raised."""
        super().start()
        try:
            host, port = self.get_container_host_ip(), int(self.get_exposed_port(self.port))
            script = "#!/bin/sh\nexec " + shlex.join(self.serve_command(host, port)) + "\n"
            self._copy_file(script.encode(), START_SCRIPT)
            self._wait_ready(host, port, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, *args: Any, **kwargs: Any) -> None:
        """Remove the container; a second call (``with`` after a failed start) does nothing."""
        if self._container is None:
            return
        try:
            super().stop(*args, **kwargs)
        finally:
            self._container = None

    def _container_status(self) -> str:
        """The wrapped (docker SDK) container's status, refreshed: "running", "exited", ... (testcontainers 4
        made ``DockerContainer.status`` a property, 3 had none: the SDK's attribute works with both)."""
        container = self.get_wrapped_container()
        container.reload()
        return container.status

    def _copy_file(self, content: bytes, path: str) -> None:
        archive = io.BytesIO()
        with tarfile.TarFile(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(name=path)
            info.size = len(content)
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(content))
        self.get_wrapped_container().put_archive(path="/", data=archive.getvalue())

    def _wait_ready(self, host: str, port: int, timeout: float) -> None:
        from kio.schema.api_versions.v0.request import ApiVersionsRequest

        from pykbroker.testing import _request

        deadline = time.monotonic() + timeout
        while True:
            try:
                if _request((host, port), ApiVersionsRequest(), timeout=1.0).error_code == 0:
                    return
            except (OSError, ValueError):
                pass
            status = self._container_status()
            if status in ("exited", "dead") or time.monotonic() > deadline:
                logs = b"".join(self.get_logs()).decode(errors="replace")[-4000:]
                raise TimeoutError(f"pykbroker in container {self.get_container_id()[:12]} not ready on "
                                   f"{host}:{port} ({status}); its output:\n{logs}")
            time.sleep(0.1)

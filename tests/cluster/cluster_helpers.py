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


# -- the README's "Security: a SASL_SSL cluster, step by step", run for real --------------------------------

WALKTHROUGH_HEADING = "## Security: a SASL_SSL cluster, step by step"
WALKTHROUGH_DIR = "/tmp/secure"
WALKTHROUGH_ZK = "127.0.0.1:2181/secure"
WALKTHROUGH_CLIENT_PORTS = {1: 9092, 2: 9093, 3: 9094}
WALKTHROUGH_INTERNAL_PORTS = {1: 9192, 2: 9193, 3: 9194}


def walkthrough_blocks(readme=None) -> list[tuple[str, str, str]]:
    """The walkthrough's marked blocks, in order: (kind, language, text) for each fenced block preceded by
    ``<!-- walkthrough -->`` (kind "") or ``<!-- walkthrough: KIND -->``, inside the README's section."""
    import re
    from pathlib import Path

    readme = Path(readme or Path(__file__).resolve().parents[2] / "README.md")
    text = readme.read_text()
    start = text.index(WALKTHROUGH_HEADING)
    end = text.find("\n## ", start + len(WALKTHROUGH_HEADING))
    section = text[start:end if end != -1 else len(text)]
    blocks = re.findall(r"<!-- walkthrough(?:: (\w+))? -->\n```(\w+)\n(.*?)^```", section, re.S | re.M)
    assert blocks, f"no marked blocks in the README's {WALKTHROUGH_HEADING!r}"
    return blocks


class Walkthrough:
    """The walkthrough's text with its directory, ZooKeeper and ports replaced by a test's own."""

    def __init__(self, workdir, zk_connect: str, client_ports: dict[int, int], internal_ports: dict[int, int]):
        from pathlib import Path

        self.dir = Path(workdir)
        self.zk_connect = zk_connect
        self.client_ports = client_ports
        self.internal_ports = internal_ports
        self.blocks = walkthrough_blocks()

    def substitute(self, text: str) -> str:
        import re

        text = text.replace(WALKTHROUGH_ZK, self.zk_connect).replace(WALKTHROUGH_DIR, str(self.dir))
        ports = {}
        for ours, theirs in ((WALKTHROUGH_CLIENT_PORTS, self.client_ports),
                             (WALKTHROUGH_INTERNAL_PORTS, self.internal_ports)):
            ports.update({str(ours[i]): str(theirs[i]) for i in ours})
        return re.sub(r"\b(" + "|".join(ports) + r")\b", lambda m: ports[m.group(1)], text)

    def of_kind(self, kind: str) -> list[tuple[str, str]]:
        return [(language, self.substitute(body)) for k, language, body in self.blocks if k == kind]

    def run_sh(self, script: str, *, path_dirs=(), timeout: float = 300.0) -> str:
        """Run a block with bash -euo pipefail; ``pykbroker`` is this checkout's (a function), path_dirs go
        first on PATH (Kafka's bin/). Returns stdout; a failure raises AssertionError with both outputs."""
        import os
        import shlex
        import subprocess

        from pykbroker.devcluster import child_env, pykbroker_command

        env = child_env()
        env["PATH"] = os.pathsep.join([*map(str, path_dirs), env.get("PATH", "")])
        env.update(KAFKA_HEAP_OPTS="-Xmx256m", LOG_DIR=str(self.dir / "kafka-tools-logs"),
                   KAFKA_JVM_PERFORMANCE_OPTS="-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto")
        prelude = f"pykbroker() {{ {shlex.join(pykbroker_command())} \"$@\"; }}\n"
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", prelude + script], cwd=self.dir.parent, env=env,
                              capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, (f"walkthrough block exited {done.returncode}:\n{script}\n--- stdout\n"
                                      f"{done.stdout}\n--- stderr\n{done.stderr}")
        return done.stdout

    def broker_configs(self) -> list[str]:
        """The --config files of the 'brokers' block, one per `pykbroker serve --config FILE` line."""
        import shlex

        (language, body), = self.of_kind("brokers")
        files = []
        for line in body.splitlines():
            words = shlex.split(line)
            assert words[:3] == ["pykbroker", "serve", "--config"] and len(words) == 4, line
            files.append(words[3])
        return files


def sasl_ssl_ready(port: int, ca_file: str, timeout: float = 1.0) -> bool:
    """A TLS handshake on 127.0.0.1:port succeeds (a cluster broker listens only once it has registered)."""
    import socket
    import ssl

    context = ssl.create_default_context(cafile=ca_file)
    try:
        with context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=timeout),
                                 server_hostname="127.0.0.1"):
            return True
    except (OSError, ssl.SSLError):
        return False


def config_file_broker(workdir, config_file: str, port: int, ca_file: str):
    """A BrokerProcess running ``pykbroker serve --config config_file`` and nothing else (the file names its
    id, ZooKeeper, listeners and data dir), ready when its SASL_SSL client listener ``port`` completes a TLS
    handshake; start / kill / stop / restart as any BrokerProcess."""
    from broker_process import BrokerError, BrokerProcess

    from pykbroker.devcluster import pykbroker_command

    class ConfigFileBroker(BrokerProcess):
        _defer_ready = False

        def command(self) -> list[str]:
            return pykbroker_command("serve", "--config", config_file)

        def start(self, timeout: float = 60.0, *, wait: bool = True):
            """With wait=False return once spawned (brokers of a cluster start side by side)."""
            self._defer_ready = not wait
            try:
                return super().start(timeout)
            finally:
                self._defer_ready = False

        def wait_ready(self, timeout: float = 60.0) -> None:
            if self._defer_ready:
                return
            deadline = time.monotonic() + timeout
            while not sasl_ssl_ready(self.port, ca_file):
                if self.process.poll() is not None:
                    raise BrokerError(f"broker exited with code {self.process.returncode}\n{self.log_tail()}")
                if time.monotonic() > deadline:
                    self.kill()
                    raise BrokerError(f"broker on {self.bootstrap} not ready after {timeout:.0f} s\n{self.log_tail()}")
                time.sleep(0.1)

    return ConfigFileBroker(workdir, port=port)

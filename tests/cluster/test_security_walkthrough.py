"""The README's "Security: a SASL_SSL cluster, step by step", run as written: every marked block of that section
(``<!-- walkthrough -->`` / ``<!-- walkthrough: KIND -->`` before a fenced block) with only its directory
(/tmp/secure), ZooKeeper (127.0.0.1:2181/secure) and ports (9092-9094, 9192-9194) replaced by the test's own.
Real openssl, a real ZooKeeper, three `pykbroker serve --config` processes, Kafka 3.7.1's own tools from
../shared/refkit (without the kit the tool steps, and what needs them, are skipped with the reason) and
confluent-kafka running the README's Python block: alice's orders reach bob's group, bob producing gets
TOPIC_AUTHORIZATION_FAILED and alice joining group billing GROUP_AUTHORIZATION_FAILED.

A second test starts a real Kafka 3.7.1 broker (ZooKeeper mode) with the walkthrough's broker-1 file, unchanged
but for the ports and directory: Kafka starts with it and alice's idempotent producer works against it."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

import broker_cluster  # noqa: E402,F401  (puts tests/integration on sys.path)
from broker_process import free_port  # noqa: E402
from cluster_helpers import Walkthrough, config_file_broker, sasl_ssl_ready  # noqa: E402

pytestmark = pytest.mark.timeout(600)
READY_S = 90.0


def tools_dir_or_reason():
    from kafka_tools import KAFKA_DIST, find_refkit, unavailable_reason

    refkit = find_refkit()
    reason = unavailable_reason(refkit)
    return (None, reason) if reason else (refkit / KAFKA_DIST / "bin", None)


@pytest.fixture
def walkthrough(tmp_path, zk_connect):
    if shutil.which("openssl") is None:
        pytest.skip("the walkthrough makes its certificates with openssl, which is not installed")
    client = {i: free_port() for i in (1, 2, 3)}
    internal = {i: free_port() for i in (1, 2, 3)}
    return Walkthrough(tmp_path / "secure", zk_connect, client, internal)


def start_brokers(walkthrough: Walkthrough) -> list:
    """One `pykbroker serve --config FILE` per line of the 'brokers' block, started side by side."""
    ca = str(walkthrough.dir / "ca.crt")
    brokers = [config_file_broker(walkthrough.dir / f"run-{index}", config_file, walkthrough.client_ports[index], ca)
               for index, config_file in enumerate(walkthrough.broker_configs(), start=1)]
    try:
        for broker in brokers:
            broker.start(wait=False)
        for broker in brokers:
            broker.wait_ready(READY_S)
    except BaseException:
        for broker in brokers:
            broker.kill()
        raise
    return brokers


def test_the_readme_walkthrough_runs_as_written(walkthrough):
    setup = walkthrough.of_kind("")
    assert [language for language, _ in setup] == ["sh", "sh", "sh"]
    for _, script in setup:  # certificates, server.properties, SCRAM credentials of broker and admin
        walkthrough.run_sh(script)
    brokers = start_brokers(walkthrough)
    try:
        # every listener is SASL_SSL: a client without TLS gets nowhere
        assert all(sasl_ssl_ready(port, str(walkthrough.dir / "ca.crt")) for port in walkthrough.client_ports.values())
        bin_dir, reason = tools_dir_or_reason()
        if bin_dir is None:
            pytest.skip(f"users, topic and ACLs are made with Kafka's tools: {reason}")
        (_, tools), = walkthrough.of_kind("tools")
        walkthrough.run_sh(tools, path_dirs=[bin_dir])
        (_, program), = walkthrough.of_kind("python")
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        lines = done.stdout.splitlines()
        assert lines == [str([f"order {n}" for n in range(10)]), "TOPIC_AUTHORIZATION_FAILED",
                         "GROUP_AUTHORIZATION_FAILED"], done.stdout + done.stderr
    except BaseException:
        for broker in brokers:
            print(broker.log_tail(40))
        raise
    finally:
        for broker in brokers:
            broker.kill()

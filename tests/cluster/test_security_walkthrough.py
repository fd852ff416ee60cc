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
import time

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

import broker_cluster  # noqa: E402,F401  (puts tests/integration on sys.path)
from broker_process import ProtocolError, free_port, probe_api_versions  # noqa: E402
import confluent_kafka.admin  # noqa: E402
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


def authentication_refused(settings: dict, timeout: float = 30.0) -> str:
    """The client's error callback reports a failed SASL authentication (its text) within timeout s."""
    errors = []
    client = confluent_kafka.admin.AdminClient({**settings, "error_cb": errors.append})
    deadline = time.monotonic() + timeout
    while not any(error.code() == confluent_kafka.KafkaError._AUTHENTICATION for error in errors):
        assert time.monotonic() < deadline, f"no authentication failure reported: {errors}"
        try:
            client.list_topics(timeout=2)
        except confluent_kafka.KafkaException:
            pass
        client.poll(0.1)
    return next(str(error) for error in errors if error.code() == confluent_kafka.KafkaError._AUTHENTICATION)


def test_the_readme_walkthrough_runs_as_written(walkthrough):
    setup = walkthrough.of_kind("")
    assert [language for language, _ in setup] == ["sh", "sh", "sh"]
    for _, script in setup:  # certificates, server.properties, SCRAM credentials of broker and admin
        walkthrough.run_sh(script)
    brokers = start_brokers(walkthrough)
    try:
        # "a client without TLS, without credentials or with a wrong password is turned away when it connects"
        ca = str(walkthrough.dir / "ca.crt")
        for port in walkthrough.client_ports.values():
            assert sasl_ssl_ready(port, ca)
            with pytest.raises((OSError, ProtocolError)):
                probe_api_versions(("127.0.0.1", port), timeout=5.0)  # plaintext ApiVersions: no answer
        for name, password in (("admin", "wrong-secret"), ("nobody", "admin-secret")):
            assert authentication_refused({"bootstrap.servers": f"127.0.0.1:{walkthrough.client_ports[2]}",
                                           "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                                           "sasl.username": name, "sasl.password": password, "ssl.ca.location": ca})
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


def test_kafka_3_7_1_takes_the_walkthroughs_server_properties_unchanged(walkthrough):
    """A real Kafka 3.7.1 broker in ZooKeeper mode, started with the walkthrough's broker-1 file (only its
    ports and directory are the test's) after the walkthrough's `pykbroker scram add` of the broker and admin
    users: it starts (so it reads the SCRAM credentials pykbroker wrote, and authenticates to itself on INTERNAL
    as User:broker), Kafka's tools of step 4 work against it (one broker: the topic gets replication factor 1
    and min.insync.replicas 1), alice's idempotent producer of step 5 writes, and bob producing gets the same
    TOPIC_AUTHORIZATION_FAILED as from pykbroker."""
    import os
    import signal

    bin_dir, reason = tools_dir_or_reason()
    if bin_dir is None:
        pytest.skip(reason)
    for _, script in walkthrough.of_kind(""):
        walkthrough.run_sh(script)
    config_file = walkthrough.broker_configs()[0]
    env = dict(os.environ, LOG_DIR=str(walkthrough.dir / "kafka-logs"), KAFKA_HEAP_OPTS="-Xmx512m",
               KAFKA_JVM_PERFORMANCE_OPTS="-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto")
    log_path = walkthrough.dir / "kafka.out"
    with open(log_path, "wb") as log:
        kafka = subprocess.Popen([str(bin_dir / "kafka-server-start.sh"), config_file], env=env,
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not sasl_ssl_ready(walkthrough.client_ports[1], str(walkthrough.dir / "ca.crt")):
            assert kafka.poll() is None, f"Kafka exited {kafka.returncode}:\n{log_path.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"Kafka not serving after 120 s:\n{log_path.read_text()[-4000:]}"
            time.sleep(0.5)
        (_, tools), = walkthrough.of_kind("tools")
        single = "--replication-factor 1 --config min.insync.replicas=1"
        assert "--replication-factor 3" in tools
        walkthrough.run_sh(tools.replace("--replication-factor 3", single), path_dirs=[bin_dir])
        (_, program), = walkthrough.of_kind("python")
        imports, settings, produce, _consume, denied = program.split("\n\n")
        bob_produces = denied.split("# alice may not read")[0]
        program = "\n\n".join([imports, settings.replace(
            ",".join(f"127.0.0.1:{walkthrough.client_ports[i]}" for i in (1, 2, 3)),
            f"127.0.0.1:{walkthrough.client_ports[1]}"), produce, bob_produces])
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        assert done.stdout.splitlines() == ["TOPIC_AUTHORIZATION_FAILED"]
        consumer = confluent_kafka.Consumer({  # what alice wrote, read back as the admin (a super user)
            "bootstrap.servers": f"127.0.0.1:{walkthrough.client_ports[1]}", "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "admin", "sasl.password": "admin-secret",
            "ssl.ca.location": str(walkthrough.dir / "ca.crt"), "group.id": "unused", "enable.auto.commit": False})
        try:
            marks = [consumer.get_watermark_offsets(confluent_kafka.TopicPartition("orders", p), timeout=60)
                     for p in range(3)]
            assert all(low == 0 for low, _ in marks) and sum(high for _, high in marks) == 10, marks
        finally:
            consumer.close()
    finally:
        os.killpg(kafka.pid, signal.SIGKILL)
        kafka.wait(30)

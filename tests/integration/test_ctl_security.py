"""The ``pykbroker`` client commands and the console's data layer against SSL and SASL_SSL listeners: Kafka's
client properties file (``--command-config``, the same file kafka-topics.sh takes) and librdkafka's ``-X``
settings; every connection a command opens (librdkafka's and pykbroker's own protocol client: the bootstrap
probe, FindCoordinator, ApiVersions per broker) speaks TLS and SASL; a wrong password is one line, exit 1, and
never shows the password."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("cryptography", reason="certificates for these tests are built with cryptography")
confluent_kafka = pytest.importorskip("confluent_kafka")

from broker_process import BrokerProcess, free_port  # noqa: E402
from ctl_runner import ctl  # noqa: E402
from tls_helpers import standard_pki  # noqa: E402

TIMEOUT_S = 60.0
SCRAM_USER, SCRAM_PASSWORD = "ctl-sam", "ctl-sam-scr4m-pw"
PLAIN_USER, PLAIN_PASSWORD = "ctl-alice", "ctl-alice-s3cret-pw"
WRONG_PASSWORD = "not-the-pw-9f3e"
SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
PLAIN_SERVER_JAAS = (f'org.apache.kafka.common.security.plain.PlainLoginModule required user_{PLAIN_USER}='
                     f'"{PLAIN_PASSWORD}";')


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return standard_pki(tmp_path_factory.mktemp("ctl-pki"))


@pytest.fixture(scope="module")
def secured(tmp_path_factory, pki):
    """A broker with PLAINTEXT (the harness's probe, the SCRAM user's creation), SSL and SASL_SSL (PLAIN,
    SCRAM-SHA-256) listeners; the SCRAM user created through AlterUserScramCredentials."""
    plain, tls, sasl_ssl = free_port(), free_port(), free_port()
    config = {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls},SASL_SSL://127.0.0.1:{sasl_ssl}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,OAUTHBEARER",
        "listener.name.sasl_ssl.oauthbearer.sasl.jaas.config":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": pki.broker_pem_file,
        "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": SCRAM_JAAS,
        "listener.name.sasl_ssl.plain.sasl.jaas.config": PLAIN_SERVER_JAAS,
        "connection.failed.authentication.delay.ms": 100,
        "num.partitions": 1,
        "offsets.topic.num.partitions": 2,
    }
    broker = BrokerProcess(tmp_path_factory.mktemp("ctl-secured"), config=config, port=plain)
    broker.ssl_port, broker.sasl_ssl_port = tls, sasl_ssl
    broker.start()
    try:
        from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        upsert = UserScramCredentialUpsertion(SCRAM_USER, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                              SCRAM_PASSWORD.encode())
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=TIMEOUT_S)
        yield broker
    finally:
        broker.close()


def _scram_file(path, pki, password: str = SCRAM_PASSWORD) -> str:
    """A Kafka client properties file as kafka-topics.sh --command-config takes it."""
    path.write_text("security.protocol=SASL_SSL\n"
                    "sasl.mechanism=SCRAM-SHA-256\n"
                    "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
                    f'    username="{SCRAM_USER}" password="{password}";\n'
                    f"ssl.truststore.location={pki.ca_file}\n"
                    "ssl.truststore.type=PEM\n")
    return str(path)


def _topic() -> str:
    return f"ctlsec-{uuid.uuid4().hex[:10]}"


def test_topic_produce_consume_over_sasl_ssl_scram_with_a_kafka_command_config(secured, pki, tmp_path):
    bootstrap = f"127.0.0.1:{secured.sasl_ssl_port}"
    config = _scram_file(tmp_path / "client.properties", pki)
    topic = _topic()
    created = ctl(bootstrap, "topic", "create", topic, "-p", "2", "--command-config", config)
    assert created.returncode == 0, created
    listed = ctl(bootstrap, "topic", "list", "--format", "json", "--command-config", config)
    assert listed.returncode == 0, listed
    assert topic in [t["topic"] for t in listed.json()]
    produced = ctl(bootstrap, "produce", topic, "-p", "0", "--command-config", config, input="one\ntwo\n")
    assert produced.returncode == 0, produced
    consumed = ctl(bootstrap, "consume", topic, "-n", "2", "--command-config", config)
    assert consumed.returncode == 0, consumed
    assert consumed.stdout.split() == ["one", "two"]
    # The protocol client's requests (FindCoordinator, ApiVersions per broker) are authenticated too.
    group = ctl(bootstrap, "consume", topic, "-n", "2", "-g", "ctlsec-group", "--command-config", config)
    assert group.returncode == 0, group
    info = ctl(bootstrap, "cluster", "info", "--format", "json", "--command-config", config)
    assert info.returncode == 0, info
    assert all("api_versions" in broker for broker in info.json()["brokers"]), info
    described = ctl(bootstrap, "group", "describe", "ctlsec-group", "--format", "json", "--command-config", config)
    assert described.returncode == 0, described


def test_the_same_command_config_file_works_with_kafka_topics_sh(secured, pki, tmp_path):
    from kafka_tools import kafka_tools_or_skip

    tools = kafka_tools_or_skip()
    bootstrap = f"127.0.0.1:{secured.sasl_ssl_port}"
    config = _scram_file(tmp_path / "client.properties", pki)
    topic = _topic()
    assert ctl(bootstrap, "topic", "create", topic, "--command-config", config).returncode == 0
    done = tools.run("kafka-topics.sh", "--bootstrap-server", bootstrap, "--command-config", config, "--list")
    assert topic in done.stdout.split()


def test_plain_with_x_settings_and_sasl_username(secured, pki):
    bootstrap = f"127.0.0.1:{secured.sasl_ssl_port}"
    settings = ["-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanism=PLAIN", "-X", f"sasl.username={PLAIN_USER}",
                "-X", f"sasl.password={PLAIN_PASSWORD}", "-X", f"ssl.ca.location={pki.ca_file}"]
    listed = ctl(bootstrap, "topic", "list", *settings)
    assert listed.returncode == 0, listed


def test_ssl_listener_with_a_kafka_command_config(secured, pki, tmp_path):
    bootstrap = f"127.0.0.1:{secured.ssl_port}"
    config = tmp_path / "ssl.properties"
    config.write_text(f"security.protocol=SSL\nssl.truststore.location={pki.ca_file}\nssl.truststore.type=PEM\n")
    topic = _topic()
    assert ctl(bootstrap, "topic", "create", topic, "--command-config", str(config)).returncode == 0
    produced = ctl(bootstrap, "produce", topic, "--command-config", str(config), input="tls\n")
    assert produced.returncode == 0, produced
    consumed = ctl(bootstrap, "consume", topic, "-n", "1", "--command-config", str(config))
    assert consumed.returncode == 0 and consumed.stdout.split() == ["tls"], consumed


def test_wrong_password_is_one_line_exit_1_without_the_password(secured, pki, tmp_path):
    bootstrap = f"127.0.0.1:{secured.sasl_ssl_port}"
    config = _scram_file(tmp_path / "wrong.properties", pki, password=WRONG_PASSWORD)
    for args in (("topic", "list"), ("produce", "anything"), ("consume", "anything", "-n", "1")):
        done = ctl(bootstrap, *args, "--command-config", config, input="x\n")
        assert done.returncode == 1, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "authentication failed" in lines[0].lower(), done
        assert "SCRAM-SHA-256" in lines[0], done
        assert WRONG_PASSWORD not in done.stderr + done.stdout and SCRAM_PASSWORD not in done.stderr + done.stdout


def test_untrusted_broker_certificate_is_one_line_exit_1(secured, tmp_path):
    (tmp_path / "other").mkdir()
    other = standard_pki(tmp_path / "other", name="Other CA")
    done = ctl(f"127.0.0.1:{secured.ssl_port}", "topic", "list", "-X", "security.protocol=SSL",
               "-X", f"ssl.ca.location={other.ca_file}")
    assert done.returncode == 1, done
    assert len(done.stderr.strip().splitlines()) == 1 and "certificate verify failed" in done.stderr, done


@pytest.mark.parametrize("content, words", [
    ("security.protocol=SSL\nssl.truststore.location={jks}\nssl.truststore.type=JKS\nssl.truststore.password=x\n",
     ["ssl.truststore.location", "JKS", "PEM", "keytool"]),
    ("security.protocol=SASL_SSL\nsasl.mechanism=GSSAPI\nsasl.jaas.config=com.sun.security.auth.module."
     "Krb5LoginModule required useKeyTab=true;\n", ["Krb5LoginModule", "cannot be translated"]),
    ("security.protocol=SASL_SSL\nsasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule "
     "required username=\"u\";\n", ["PlainLoginModule needs username and password"]),
])
def test_a_setting_that_cannot_be_translated_is_a_usage_error(tmp_path, content, words):
    jks = tmp_path / "trust.jks"
    jks.write_bytes(b"\xfe\xed\xfe\xed" + b"\0" * 32)
    config = tmp_path / "bad.properties"
    config.write_text(content.format(jks=jks))
    done = ctl("127.0.0.1:1", "topic", "list", "--command-config", str(config))
    assert done.returncode == 2, done
    assert str(config) in done.stderr and all(word in done.stderr for word in words), done


def test_console_data_layer_over_sasl_ssl(secured, pki, tmp_path):
    from pykbroker.console.data import ClusterReader
    from pykbroker.ctl.common import client_settings

    bootstrap = f"127.0.0.1:{secured.sasl_ssl_port}"
    settings = client_settings(_scram_file(tmp_path / "client.properties", pki), ())
    topic = _topic()
    assert ctl(bootstrap, "topic", "create", topic, "-p", "1", "--command-config",
               str(tmp_path / "client.properties")).returncode == 0
    assert ctl(bootstrap, "produce", topic, "--command-config", str(tmp_path / "client.properties"),
               input="console\n").returncode == 0
    reader = ClusterReader(bootstrap, timeout=20.0, client_config=settings)
    info = reader.cluster()
    assert [b.port for b in info.brokers] == [secured.sasl_ssl_port]
    assert topic in reader.topic_names()
    # DescribeLogDirs through pykbroker's protocol client, authenticated with SCRAM over TLS: sizes known.
    sizes = reader.sizes(info.brokers)
    assert sizes[info.brokers[0].id] is not None and sizes[info.brokers[0].id][(topic, 0)] > 0
    assert reader.coordination_problem() is None


def test_the_console_command_serves_a_sasl_ssl_cluster_with_command_config(secured, pki, tmp_path):
    """``pykbroker console --command-config FILE``: the worker processes' clients authenticate (the topics page
    lists the topic); a file that cannot be used stops it before it starts (exit 2)."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import threading
    import time
    import urllib.request

    from broker_process import REPO_ROOT

    bootstrap = f"127.0.0.1:{secured.sasl_ssl_port}"
    config = _scram_file(tmp_path / "client.properties", pki)
    topic = _topic()
    assert ctl(bootstrap, "topic", "create", topic, "--command-config", config).returncode == 0
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
    bad = tmp_path / "bad.properties"
    bad.write_text("security.protocol=SASL_SSL\nsasl.jaas.config=com.example.Nope required;\n")
    refused = subprocess.run([sys.executable, "-P", "-m", "pykbroker", "console", "-b", bootstrap, "--port", "0",
                              "--command-config", str(bad)], env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "com.example.Nope" in refused.stderr, refused
    proc = subprocess.Popen([sys.executable, "-P", "-m", "pykbroker", "console", "-b", bootstrap, "--port", "0",
                             "--command-config", config], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not any(" at http://" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.05)
        url = re.search(r"at (http://\S+?)/?$", next(line for line in lines if " at http://" in line).strip()).group(1)
        with urllib.request.urlopen(url + "/topics", timeout=TIMEOUT_S * 2) as response:
            assert response.status == 200
            assert topic in response.read().decode()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_oauthbearer_unsecured_from_a_kafka_command_config_and_global_position(secured, pki, tmp_path):
    """OAuthBearerLoginModule's unsecured options become librdkafka's unsecured JWT; pykbroker's own protocol
    client does not speak OAUTHBEARER, so its bootstrap check stops after the TLS handshake and ApiVersions
    (which Kafka answers before authentication) and ``cluster info`` still lists each broker's API versions.
    The option is taken before the command too."""
    bootstrap = f"127.0.0.1:{secured.sasl_ssl_port}"
    config = tmp_path / "oauth.properties"
    config.write_text("security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n"
                      "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule "
                      'required unsecuredLoginStringClaim_sub="carol";\n'
                      f"ssl.truststore.location={pki.ca_file}\nssl.truststore.type=PEM\n")
    topic = _topic()
    assert ctl(bootstrap, "--command-config", str(config), "topic", "create", topic, brokers_flag=False,
               env={"PYKBROKER_BROKERS": bootstrap}).returncode == 0
    info = ctl(bootstrap, "cluster", "info", "--format", "json", "--command-config", str(config))
    assert info.returncode == 0, info
    assert all("api_versions" in broker for broker in info.json()["brokers"]), info
    assert "principal User:carol" in secured.log_path.read_text()

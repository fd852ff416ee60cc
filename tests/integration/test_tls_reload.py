"""New certificates without a restart, as Kafka 3.x: ``kafka-configs.sh --entity-type brokers --entity-name 1
--alter --add-config listener.name.ssl.ssl.keystore.location=<file>`` (Kafka 3.7.1's own tool) reloads the SSL
listener's TLS context and the inter-broker client's; a new connection gets the new certificate (its serial read
by a real TLS client), one already open keeps working; altering to the same path after the file changed in place
reloads it (Kafka's reloadUpdatedFilesWithoutConfigChange: the file's modification time); a key store Kafka's
SslFactory.validateReconfiguration refuses (another subject DN, fewer SubjectAltNames, a certificate the
inter-broker listener's own trust store does not accept) is refused with INVALID_REQUEST in Kafka's words and the
old certificate stays; a key store that needs a new password cannot be set dynamically (INVALID_CONFIG: password
configs are not stored)."""

from __future__ import annotations

import os
import socket
import ssl
import struct
import time

import pytest

pytest.importorskip("cryptography", reason="certificates for these tests are built with cryptography")
confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaException  # noqa: E402
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType  # noqa: E402
from cryptography import x509  # noqa: E402

from broker_process import BrokerProcess, free_port, wait_until  # noqa: E402
from kafka_tools import kafka_tools_or_skip  # noqa: E402
from tls_helpers import chain_pem, key_pem, standard_pki  # noqa: E402

KEYSTORE = "listener.name.ssl.ssl.keystore.location"


@pytest.fixture
def pki(tmp_path):
    (tmp_path / "pki").mkdir()
    return standard_pki(tmp_path / "pki")


@pytest.fixture
def broker(tmp_path, pki):
    """PLAINTEXT for the tools, SSL (the inter-broker listener: the marker sender's client context is
    reloaded with it) with the broker certificate from a PEM key store file."""
    plain, tls = free_port(), free_port()
    broker = BrokerProcess(tmp_path / "broker", port=plain, config={
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}", "security.inter.broker.protocol": "SSL",
        "ssl.keystore.type": "PEM", KEYSTORE: pki.broker_pem_file,
        "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file,
        "num.partitions": 1, "offsets.topic.num.partitions": 1})
    broker.tls_port = tls
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


def write_keystore(pki, path, cert_key) -> str:
    key, cert = cert_key
    path.write_text(key_pem(key) + chain_pem(cert, pki))
    return str(path)


def tls_socket(broker, pki) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=pki.ca_file)
    return context.wrap_socket(socket.create_connection(("127.0.0.1", broker.tls_port), timeout=10),
                               server_hostname="127.0.0.1")


def served_serial(broker, pki) -> int:
    """The serial number of the certificate a new TLS connection gets (verified against the CA and the host)."""
    with tls_socket(broker, pki) as sock:
        return x509.load_der_x509_certificate(sock.getpeercert(binary_form=True)).serial_number


def api_versions_answered(sock: ssl.SSLSocket, correlation_id: int) -> bool:
    """ApiVersions v0 on an open connection: the answer's correlation id."""
    body = struct.pack(">hhih", 18, 0, correlation_id, -1)
    sock.sendall(struct.pack(">i", len(body)) + body)
    def read(count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = sock.recv(count - len(data))
            assert chunk, "the broker closed the connection"
            data += chunk
        return data

    size = struct.unpack(">i", read(4))[0]
    return struct.unpack_from(">i", read(size))[0] == correlation_id


def alter(broker, value: str):
    """IncrementalAlterConfigs SET of the SSL listener's key store location; the KafkaError, or None."""
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{broker.port}"})
    resource = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
        ConfigEntry(KEYSTORE, value, incremental_operation=AlterConfigOpType.SET)])
    try:
        admin.incremental_alter_configs([resource])[resource].result(60)
    except KafkaException as exc:
        return exc.args[0]
    return None


def test_kafka_configs_reloads_the_listeners_certificate_and_keeps_open_connections(broker, pki, tmp_path):
    tools = kafka_tools_or_skip()
    first = served_serial(broker, pki)
    assert first == pki.broker.serial_number
    open_before = tls_socket(broker, pki)
    try:
        assert api_versions_answered(open_before, 1)
        # a new file
        second = pki.issue("broker")
        path = write_keystore(pki, tmp_path / "broker-2.pem", second)
        tools.run("kafka-configs.sh", "--bootstrap-server", f"127.0.0.1:{broker.port}", "--entity-type", "brokers",
                  "--entity-name", "1", "--alter", "--add-config", f"{KEYSTORE}={path}")
        wait_until(lambda: served_serial(broker, pki) == second[1].serial_number, "the new certificate", 30)
        # the inter-broker client's holder took the same key store (the same CA and DN: only the serial tells)
        wait_until(lambda: f"Created new CLIENT SSL context with keystore SecurityStore(type=PEM, path={path}) "
                           f"(certificate serial {second[1].serial_number})" in broker.log_path.read_text(errors="replace"),
                   "the inter-broker client's new context", 30)
        assert api_versions_answered(open_before, 2)  # the connection made before keeps working
        # the same path, the file replaced in place: reloaded because its modification time changed
        third = pki.issue("broker")
        write_keystore(pki, tmp_path / "broker-2.pem", third)
        os.utime(path, (time.time() + 5, time.time() + 5))  # a clock tick apart even on a coarse file system
        tools.run("kafka-configs.sh", "--bootstrap-server", f"127.0.0.1:{broker.port}", "--entity-type", "brokers",
                  "--entity-name", "1", "--alter", "--add-config", f"{KEYSTORE}={path}")
        assert served_serial(broker, pki) == third[1].serial_number
        assert api_versions_answered(open_before, 3)
        out = tools.run("kafka-configs.sh", "--bootstrap-server", f"127.0.0.1:{broker.port}", "--entity-type",
                        "brokers", "--entity-name", "1", "--describe").stdout
        assert f"{KEYSTORE}={path} sensitive=false synonyms={{DYNAMIC_BROKER_CONFIG:{KEYSTORE}={path}" in out
    finally:
        open_before.close()
    assert broker.is_running()


@pytest.mark.parametrize(("make", "words"), [
    # The first two are Kafka 3.7.1's texts, measured in ZooKeeper mode with the same stores; of the third only
    # the class name (javax.net.ssl.SSLHandshakeException) is Kafka's, the words after it are pykbroker's
    (lambda pki, other: pki.issue("another-broker"), "org.apache.kafka.common.config.ConfigException: Keystore "
     "DistinguishedName does not match:  existing={alias=kafka, DN=CN=broker, O=pykbroker}, new={alias=kafka, "
     "DN=CN=another-broker, O=pykbroker}"),
    (lambda pki, other: pki.issue("broker", sans=("localhost",)), "org.apache.kafka.common.config.ConfigException: "
     "Keystore SubjectAltNames do not match:  existing={alias=kafka, SAN=[[2, localhost], [7, 127.0.0.1]]}, "
     "new={alias=kafka, SAN=[[2, localhost]]}"),
    # same DN and names, but from a CA the inter-broker listener's trust store does not have: Kafka's
    # SslEngineValidator (old and new must handshake with each other) refuses it
    (lambda pki, other: other.issue("broker"), "javax.net.ssl.SSLHandshakeException: the old and the new SSL settings "
     "cannot complete a handshake"),
], ids=["another-dn", "fewer-sans", "untrusted-on-the-inter-broker-listener"])
def test_a_key_store_kafka_refuses_is_refused_and_the_old_certificate_stays(broker, pki, tmp_path, make, words):
    (tmp_path / "other").mkdir()
    other = standard_pki(tmp_path / "other", name="Other CA")
    issuer = other if "SSLHandshakeException" in words else pki
    path = write_keystore(issuer, tmp_path / "bad.pem", make(pki, other))
    error = alter(broker, path)
    assert error is not None and error.code() == confluent_kafka.KafkaError.INVALID_REQUEST, error
    message = error.str()
    assert message.startswith("Invalid value org.apache.kafka.common.config.ConfigException: Validation of dynamic "
                              "config update of SSLFactory failed: "), message
    assert words in message and message.endswith("for configuration Invalid dynamic configuration"), message
    assert served_serial(broker, pki) == pki.broker.serial_number  # nothing stored, nothing swapped
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{broker.port}"})
    described = admin.describe_configs([ConfigResource(ResourceType.BROKER, "1")])
    entries = list(described.values())[0].result(60)
    assert entries[KEYSTORE].source != confluent_kafka.admin.ConfigSource.DYNAMIC_BROKER_CONFIG.value


def test_a_missing_key_store_file_and_a_new_password_are_refused(broker, pki, tmp_path):
    error = alter(broker, str(tmp_path / "nowhere.pem"))
    assert error is not None and error.code() == confluent_kafka.KafkaError.INVALID_REQUEST, error
    assert ("Validation of dynamic config update of SSLFactory failed: org.apache.kafka.common.errors."
            "InvalidConfigurationException: Failed to load ") in error.str() and "nowhere.pem" in error.str()
    # a key store that needs a new password: valid for the SSL factory, but a password config is never stored
    # (ZooKeeper mode without password.encoder.secret): INVALID_CONFIG, nothing changes
    key, cert = pki.issue("broker")
    encrypted = tmp_path / "encrypted.pem"
    encrypted.write_text(key_pem(key, "new-secret") + chain_pem(cert, pki))
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{broker.port}"})
    resource = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
        ConfigEntry(KEYSTORE, str(encrypted), incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("listener.name.ssl.ssl.key.password", "new-secret", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as raised:
        admin.incremental_alter_configs([resource])[resource].result(60)
    assert raised.value.args[0].code() == confluent_kafka.KafkaError.INVALID_CONFIG, raised.value
    assert "Password encoder secret not configured" in raised.value.args[0].str()
    assert "new-secret" not in raised.value.args[0].str()
    assert served_serial(broker, pki) == pki.broker.serial_number
    assert "new-secret" not in broker.log_path.read_text(errors="replace")


def test_an_update_that_concerns_no_tls_setting_is_not_refused_for_a_key_store_file_changed_meanwhile(broker, pki):
    """A cluster-default update of an unrelated config does not look at the TLS stores (Kafka validates only
    the reconfigurables an update concerns): a bad file written over the key store meanwhile neither blocks it
    nor gets loaded."""
    key, cert = pki.issue("another-broker")
    with open(pki.broker_pem_file, "w") as handle:  # a different subject DN: a reload would be refused
        handle.write(key_pem(key) + chain_pem(cert, pki))
    os.utime(pki.broker_pem_file, (time.time() + 5, time.time() + 5))
    kafka_tools_or_skip().run("kafka-configs.sh", "--bootstrap-server", f"127.0.0.1:{broker.port}", "--entity-type",
                              "brokers", "--entity-default", "--alter", "--add-config", "log.retention.ms=3600000")
    assert served_serial(broker, pki) == pki.broker.serial_number

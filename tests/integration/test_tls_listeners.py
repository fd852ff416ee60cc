"""SSL listeners beside a PLAINTEXT one, configured with Kafka's own property names (``listeners``,
``ssl.keystore.*``, ``ssl.truststore.*``, ``listener.name.<listener>.ssl.client.auth``): stock clients
(confluent-kafka, kafka-python) produce and consume through them with only their own TLS settings, Metadata
advertises the listener the request came in on, mutual TLS refuses a client without a certificate and
serves one with a certificate (its principal logged), and a stalled handshake, a plaintext client on the TLS
port and garbage bytes cost the broker that connection only, with one log line, while a real client keeps
working. Certificates come from tests/tls_helpers.py (cryptography)."""

from __future__ import annotations

import re
import socket
import ssl
import time
import uuid

import pytest

pytest.importorskip("cryptography", reason="certificates for these tests are built with cryptography")
confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402

from broker_process import BrokerProcess, ProtocolError, free_port, probe_api_versions, wait_until  # noqa: E402
from test_resource_limits import (  # noqa: E402
    FETCH_RSS_BOUND_MIB, MIB, PIPELINED_FETCHES, _fill_topic, _rss_mib, greedy_fetch_frame,
)
from test_startup import assert_one_line_failure, serve  # noqa: E402
from tls_helpers import standard_pki  # noqa: E402

TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return standard_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory, pki):
    """PLAINTEXT, SSL (no client certificate) and MTLS (an SSL listener that requires one) on one broker."""
    plain, tls, mtls = free_port(), free_port(), free_port()
    config = {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls},MTLS://127.0.0.1:{mtls}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": pki.broker_pem_file,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": pki.ca_file,
        "listener.name.mtls.ssl.client.auth": "required",
        "num.partitions": 1,
        "offsets.topic.num.partitions": 2,
    }
    broker = BrokerProcess(tmp_path_factory.mktemp("tls-broker"), config=config, port=plain)
    broker.tls_port, broker.mtls_port = tls, mtls
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


def _topic() -> str:
    return f"tls-{uuid.uuid4().hex[:10]}"


def _ssl(pki, *, cert: bool = False) -> dict:
    settings = {"security.protocol": "SSL", "ssl.ca.location": pki.ca_file}
    if cert:
        settings.update({"ssl.certificate.location": pki.client_pem_file, "ssl.key.location": pki.client_pem_file})
    return settings


def consume_values(bootstrap: str, settings: dict, topic: str, count: int, **extra) -> list[bytes]:
    """The values of the first ``count`` records of ``topic`` (a new group, from the start), read within
    TIMEOUT_S (also used by tests/cluster/test_tls_listeners_cluster.py)."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                                         "auto.offset.reset": "earliest", **settings, **extra})
    try:
        consumer.subscribe([topic])
        values: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
        return values
    finally:
        consumer.close()


def _round_trip_confluent(bootstrap: str, settings: dict, count: int = 5) -> list[bytes]:
    """Produce ``count`` messages to a new topic and consume them back; the values consumed."""
    topic = _topic()
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, **settings})
    for index in range(count):
        producer.produce(topic, f"m{index}".encode())
    assert producer.flush(TIMEOUT_S) == 0
    return consume_values(bootstrap, settings, topic, count)


def _metadata_ports(bootstrap: str, settings: dict) -> list[int]:
    admin = AdminClient({"bootstrap.servers": bootstrap, **settings})
    return [broker.port for broker in admin.list_topics(timeout=TIMEOUT_S).brokers.values()]


def _log_lines(broker: BrokerProcess, *words: str) -> list[str]:
    return [line for line in broker.log_path.read_text(errors="replace").splitlines() if all(w in line for w in words)]


def _the_log_line(broker: BrokerProcess, peer: str) -> str:
    """The one log line saying what the broker did with connection ``peer`` (host:port): "closing connection
    from PEER: ..." or "refusing connection from PEER: ...", once it is written; fails if there are more. The
    debug line of an earlier connection that had the same ephemeral port ("TLS connection from PEER on
    listener ...") is not about this one, nor is 127.0.0.1:41234 about 127.0.0.1:4123."""
    about = re.compile(r"connection from " + re.escape(peer) + r": ")

    def lines_about() -> list[str]:
        return [line for line in _log_lines(broker, peer) if about.search(line)]

    wait_until(lines_about, f"a log line about {peer}", TIMEOUT_S)
    lines = lines_about()
    assert len(lines) == 1, lines
    return lines[0]


# -- stock clients ---------------------------------------------------------------------------------------------


def test_confluent_kafka_produces_and_consumes_over_ssl(tls_broker, pki):
    bootstrap = f"127.0.0.1:{tls_broker.tls_port}"
    assert _round_trip_confluent(bootstrap, _ssl(pki)) == [f"m{i}".encode() for i in range(5)]


def test_metadata_advertises_the_listener_the_request_came_in_on(tls_broker, pki):
    assert _metadata_ports(f"127.0.0.1:{tls_broker.tls_port}", _ssl(pki)) == [tls_broker.tls_port]
    assert _metadata_ports(f"127.0.0.1:{tls_broker.mtls_port}", _ssl(pki, cert=True)) == [tls_broker.mtls_port]
    assert _metadata_ports(tls_broker.bootstrap, {}) == [tls_broker.port]


def test_kafka_python_produces_and_consumes_over_ssl(tls_broker, pki):
    bootstrap = f"127.0.0.1:{tls_broker.tls_port}"
    topic = _topic()
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, security_protocol="SSL", ssl_cafile=pki.ca_file)
    try:
        for index in range(5):
            producer.send(topic, f"k{index}".encode()).get(timeout=TIMEOUT_S)
    finally:
        producer.close()
    consumer = kafka.KafkaConsumer(topic, bootstrap_servers=bootstrap, security_protocol="SSL",
                                   ssl_cafile=pki.ca_file, auto_offset_reset="earliest",
                                   consumer_timeout_ms=int(TIMEOUT_S * 1000))
    try:
        values = []
        for message in consumer:
            values.append(message.value)
            if len(values) == 5:
                break
    finally:
        consumer.close()
    assert values == [f"k{i}".encode() for i in range(5)]


def test_a_large_fetch_over_ssl_arrives_whole(tls_broker, pki):
    """Record data goes through the chunked copy (no sendfile on TLS): several chunks' worth in one fetch."""
    topic = _topic()
    settings = _ssl(pki)
    bootstrap = f"127.0.0.1:{tls_broker.tls_port}"
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, **settings})
    payloads = [uuid.uuid4().bytes * 4096 for _ in range(48)]  # 64 KiB each, 3 MiB in all
    for payload in payloads:
        producer.produce(topic, payload)
    assert producer.flush(TIMEOUT_S) == 0
    received = consume_values(bootstrap, settings, topic, len(payloads), **{"fetch.max.bytes": 8 * 1024 * 1024})
    assert received == payloads


@pytest.mark.timeout(240)
def test_a_tls_client_pipelining_fetches_without_reading_leaves_memory_bounded(tls_broker, pki):
    """test_resource_limits' greedy fetcher, over TLS: 200 pipelined fetches of 30 MiB over a 32 MiB topic,
    never read. The TLS transport's buffer counts towards the write high-water mark, so the broker holds
    about one chunk and that mark (without it: one encrypted response per fetch), and another client reads
    the whole topic over TLS meanwhile."""
    topic = _topic()
    records = _fill_topic(tls_broker, topic)
    baseline = _rss_mib(tls_broker)
    fetch = greedy_fetch_frame(topic)
    with socket.socket() as raw:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        raw.connect(("127.0.0.1", tls_broker.tls_port))
        with _tls_client(pki, cert=False).wrap_socket(raw, server_hostname="127.0.0.1") as greedy:
            greedy.sendall(fetch * PIPELINED_FETCHES)
            peak = baseline
            consumer = confluent_kafka.Consumer({
                "bootstrap.servers": f"127.0.0.1:{tls_broker.tls_port}", "group.id": f"g-{topic}",
                "auto.offset.reset": "earliest", "fetch.max.bytes": MIB, **_ssl(pki)})
            try:
                consumer.subscribe([topic])
                count = 0
                deadline = time.monotonic() + 120
                while count < records and time.monotonic() < deadline:
                    message = consumer.poll(0.5)
                    if message is not None and message.error() is None:
                        count += 1
                    peak = max(peak, _rss_mib(tls_broker))
            finally:
                consumer.close()
    assert count == records
    assert peak - baseline < FETCH_RSS_BOUND_MIB, f"RSS grew from {baseline:.0f} to {peak:.0f} MiB"


@pytest.mark.timeout(400)
@pytest.mark.parametrize("listener", ["SSL", "MTLS"])
def test_kafkas_console_producer_and_consumer_over_ssl(tls_broker, pki, tmp_path, listener):
    """The Java client (Kafka 3.7.1's console tools) with its own TLS settings only: a PEM trust store, and on
    the mutual TLS listener a PEM key store with the client's key and certificate."""
    from kafka_tools import kafka_tools_or_skip

    tools = kafka_tools_or_skip()
    client = tmp_path / "client-ssl.properties"
    settings = f"security.protocol=SSL\nssl.truststore.type=PEM\nssl.truststore.location={pki.ca_file}\n"
    if listener == "MTLS":
        settings += f"ssl.keystore.type=PEM\nssl.keystore.location={pki.client_pem_file}\n"
    client.write_text(settings)
    bootstrap = f"127.0.0.1:{tls_broker.tls_port if listener == 'SSL' else tls_broker.mtls_port}"
    topic = _topic()
    lines = [f"java-{index}" for index in range(3)]
    tools.run("kafka-console-producer.sh", "--bootstrap-server", bootstrap, "--topic", topic,
              "--producer.config", str(client), input="\n".join(lines) + "\n")
    out = tools.run("kafka-console-consumer.sh", "--bootstrap-server", bootstrap, "--topic", topic,
                    "--from-beginning", "--max-messages", "3", "--timeout-ms", "60000",
                    "--consumer.config", str(client))
    assert out.stdout.strip().splitlines() == lines
    assert "Processed a total of 3 messages" in out.stderr


def test_transactions_over_ssl_when_the_ssl_listener_comes_first(tmp_path, pki):
    """The single node's transaction marker sender reaches the broker itself on a PLAINTEXT listener, here the
    second one (named in inter.broker.listener.name); a transactional producer commits over SSL and a
    read_committed consumer sees the records."""
    plain, tls = free_port(), free_port()
    broker = BrokerProcess(tmp_path / "broker", port=plain, config={
        "listeners": f"SSL://127.0.0.1:{tls},PLAINTEXT://127.0.0.1:{plain}", "inter.broker.listener.name": "PLAINTEXT",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": pki.broker_pem_file,
        "transaction.state.log.num.partitions": 2, "offsets.topic.num.partitions": 2, "num.partitions": 1})
    broker.start()
    try:
        bootstrap, topic = f"127.0.0.1:{tls}", _topic()
        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}",
                                             **_ssl(pki)})
        producer.init_transactions(TIMEOUT_S)
        producer.begin_transaction()
        for index in range(3):
            producer.produce(topic, f"t{index}".encode())
        producer.commit_transaction(TIMEOUT_S)
        values = consume_values(bootstrap, _ssl(pki), topic, 3, **{"isolation.level": "read_committed"})
        assert values == [b"t0", b"t1", b"t2"]
        assert not _log_lines(broker, "TLS handshake failed")
    finally:
        broker.close()


# -- mutual TLS ------------------------------------------------------------------------------------------------


def _tls_client(pki, *, cert: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki.ca_file)
    if cert:
        context.load_cert_chain(pki.client_pem_file)
    return context


def test_mutual_tls_refuses_a_client_without_certificate(tls_broker, pki):
    context = _tls_client(pki, cert=False)
    with socket.create_connection(("127.0.0.1", tls_broker.mtls_port), timeout=TIMEOUT_S) as raw:
        # TLS 1.3: the client's side of the handshake completes first; the broker's refusal ends the connection.
        with pytest.raises((ssl.SSLError, ConnectionError, ProtocolError, OSError)):
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(b"\x00\x00\x00\x00")
                if tls.recv(1) == b"":
                    raise ConnectionError("closed by the broker")
    wait_until(lambda: _log_lines(tls_broker, "TLS handshake failed", "CERTIFICATE"), "the refusal's log line",
               TIMEOUT_S)


def test_mutual_tls_serves_a_client_with_a_certificate_and_knows_its_principal(tls_broker, pki):
    bootstrap = f"127.0.0.1:{tls_broker.mtls_port}"
    assert _round_trip_confluent(bootstrap, _ssl(pki, cert=True), count=2) == [b"m0", b"m1"]
    assert _log_lines(tls_broker, "listener MTLS", "principal User:CN=client,OU=apps,O=pykbroker")
    # the plain SSL listener asks for no certificate: its clients are ANONYMOUS
    assert _metadata_ports(f"127.0.0.1:{tls_broker.tls_port}", _ssl(pki)) == [tls_broker.tls_port]
    assert _log_lines(tls_broker, "listener SSL", "principal User:ANONYMOUS")


# -- bad peers cost their own connection only ------------------------------------------------------------------


def _closed_by_broker(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_a_stalled_handshake_is_closed_after_the_bound_and_blocks_no_one(tls_broker, pki):
    """TCP clients that never send a byte: a real client works meanwhile; each is closed once the handshake
    bound (10 s: TLS_HANDSHAKE_TIMEOUT_S, below the default connections.max.idle.ms) has passed."""
    opened = time.monotonic()
    stalled = [socket.create_connection(("127.0.0.1", tls_broker.tls_port)) for _ in range(3)]
    try:
        ports = [sock.getsockname()[1] for sock in stalled]
        # Meanwhile a real client connects over TLS and works.
        assert _round_trip_confluent(f"127.0.0.1:{tls_broker.tls_port}", _ssl(pki), count=2) == [b"m0", b"m1"]
        for sock in stalled:
            sock.settimeout(TIMEOUT_S)
            assert _closed_by_broker(sock)
            assert time.monotonic() - opened >= 9.5  # not before the bound
        for port in ports:
            line = _the_log_line(tls_broker, f"127.0.0.1:{port}")
            assert "TLS handshake failed: SSL handshake is taking longer than 10.0 seconds" in line
    finally:
        for sock in stalled:
            sock.close()


def test_stalled_handshakes_count_towards_max_connections_per_ip(tmp_path, pki):
    """A host's TLS connections count from their accept, as Kafka counts them: with max.connections.per.ip 2,
    two stalled handshakes from 127.0.0.2 make the broker refuse a third connection from there at once (one log
    line), while a client from 127.0.0.1 is served; the stalled ones are closed at the handshake bound."""
    plain, tls = free_port(), free_port()
    broker = BrokerProcess(tmp_path / "broker", port=plain, config={
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}", "max.connections.per.ip": 2,
        "connections.max.idle.ms": 5000, "ssl.keystore.type": "PEM", "ssl.keystore.location": pki.broker_pem_file})
    broker.start()
    try:
        silent = [socket.create_connection(("127.0.0.1", tls), timeout=TIMEOUT_S, source_address=("127.0.0.2", 0))
                  for _ in range(3)]
        try:
            ports = [sock.getsockname()[1] for sock in silent]
            assert _closed_by_broker(silent[2])  # accepted in order: the third is over the limit
            refused = _the_log_line(broker, f"127.0.0.2:{ports[2]}")
            assert "refusing connection" in refused and "max.connections.per.ip 2 reached for 127.0.0.2" in refused
            assert _metadata_ports(f"127.0.0.1:{tls}", _ssl(pki)) == [tls]  # another host meanwhile
            for sock, port in zip(silent[:2], ports[:2]):
                assert _closed_by_broker(sock)
                assert "taking longer than 5.0 seconds" in _the_log_line(broker, f"127.0.0.2:{port}")
        finally:
            for sock in silent:
                sock.close()
    finally:
        broker.close()


def _api_versions_answered(tls: ssl.SSLSocket) -> bool:
    """An ApiVersions v0 request on an established TLS connection: True when the broker answers it, False when
    it closes the connection instead (a refused connection is closed right after its handshake)."""
    tls.sendall(b"\x00\x00\x00\x0a" + b"\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff")  # key 18 v0, corr 1
    try:
        return len(tls.recv(4)) == 4
    except (ConnectionError, ssl.SSLError):
        return False


def test_a_clients_next_tls_connection_is_not_counted_twice_towards_max_connections_per_ip(tmp_path, pki):
    """max.connections.per.ip 2: a host with one live TLS connection opens its second one at once. The first's
    handshake must stop counting the moment the connection itself counts (a broker that dropped it a few loop
    turns later refused such second connections, ~1 in 8 on an idle machine). 50 hosts, one try each, so no
    earlier close is still on its way to the broker."""
    plain, tls_port = free_port(), free_port()
    broker = BrokerProcess(tmp_path / "broker", port=plain, config={
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls_port}", "max.connections.per.ip": 2,
        "ssl.keystore.type": "PEM", "ssl.keystore.location": pki.broker_pem_file})
    broker.start()
    context = _tls_client(pki, cert=False)
    try:
        for host in range(50):
            source = (f"127.0.3.{host + 1}", 0)
            opened = []
            try:
                for _ in range(2):
                    raw = socket.create_connection(("127.0.0.1", tls_port), timeout=TIMEOUT_S, source_address=source)
                    opened.append(context.wrap_socket(raw, server_hostname="127.0.0.1"))
                assert all(_api_versions_answered(tls) for tls in opened), f"a connection from {source[0]} refused"
            finally:
                for tls in opened:
                    tls.close()
        assert not _log_lines(broker, "refusing connection")
    finally:
        broker.close()


def test_a_plaintext_kafka_client_on_the_tls_port_gets_a_closed_connection(tls_broker, pki):
    with pytest.raises((ProtocolError, OSError)):
        probe_api_versions(("127.0.0.1", tls_broker.tls_port), timeout=TIMEOUT_S)
    wait_until(lambda: len(_log_lines(tls_broker, "TLS handshake failed", "WRONG_VERSION_NUMBER")) >= 1,
               "the handshake failure's log line", TIMEOUT_S)
    assert _metadata_ports(f"127.0.0.1:{tls_broker.tls_port}", _ssl(pki)) == [tls_broker.tls_port]


@pytest.mark.parametrize("garbage", [
    bytes(range(256)) * 4,  # not a TLS record at all
    b"\x16\x03\x01\x00\x40" + b"\xff" * 64,  # a handshake record whose content is garbage
    b"\x16\x03\x01\xff\xff" + b"\x00" * 1000,  # a handshake record that claims more than it sends, then stops
], ids=["not-tls", "garbage-handshake", "oversized-record"])
def test_garbage_bytes_on_the_tls_port_close_that_connection_only(tls_broker, pki, garbage):
    with socket.create_connection(("127.0.0.1", tls_broker.tls_port), timeout=30) as sock:
        port = sock.getsockname()[1]
        sock.sendall(garbage)
        assert _metadata_ports(f"127.0.0.1:{tls_broker.tls_port}", _ssl(pki)) == [tls_broker.tls_port]
        assert _closed_by_broker(sock)
    assert "TLS handshake failed" in _the_log_line(tls_broker, f"127.0.0.1:{port}")
    assert tls_broker.is_running()


# -- start-up: what is refused, in one line, before the data dir is written ------------------------------------


def _serve_properties(tmp_path, text: str):
    properties = tmp_path / "server.properties"
    properties.write_text(text)
    return serve("--config", str(properties), data_dir=tmp_path / "fresh")


@pytest.mark.parametrize(("properties", "words", "status"), [
    ("listeners=PLAINTEXT://127.0.0.1:{p},SASL_SSL://127.0.0.1:{q}\n",  # SASL_SSL: TLS first, its key store
     ("listener SASL_SSL://127.0.0.1:{q}", "ssl.keystore.location"), 1),
    ("listeners=PLAINTEXT://127.0.0.1:{p},SASL_PLAINTEXT://127.0.0.1:{q}\n",  # Kafka's default GSSAPI
     ("listener SASL_PLAINTEXT://127.0.0.1:{q}", "SASL mechanism GSSAPI is not supported"), 1),
    # Kafka's inter-broker listener: the one named after security.inter.broker.protocol (PLAINTEXT) by default
    ("listeners=SSL://127.0.0.1:{p}\n",
     ("inter.broker.listener.name must be a listener name defined in advertised.listeners",
      "The valid options based on currently configured listeners are SSL"), 2),
    ("listeners=PLAINTEXT://127.0.0.1:{p},SSL://127.0.0.1:{q}\ninter.broker.listener.name=SSL\n"
     "security.inter.broker.protocol=SSL\n",
     ("Only one of inter.broker.listener.name and security.inter.broker.protocol should be set.",), 2),
    ("listeners=PLAINTEXT://127.0.0.1:{p},SSL://127.0.0.1:{q}\ninter.broker.listener.name=ssl\n",
     ("listener SSL://127.0.0.1:{q}", "ssl.keystore.location"), 1),
    ("listeners=PLAINTEXT://127.0.0.1:{p},SSL://127.0.0.1:{q}\n",
     ("listener SSL://127.0.0.1:{q}", "ssl.keystore.location"), 1),
    ("listeners=PLAINTEXT://127.0.0.1:{p},SSL://127.0.0.1:{q}\nssl.keystore.type=PEM\n"
     "listener.name.ssl.ssl.keystore.location=/nonexistent/broker.pem\n",
     ("listener SSL://127.0.0.1:{q}", "/nonexistent/broker.pem"), 1),
], ids=["sasl-ssl", "sasl-plaintext", "no-plaintext-listener-for-inter-broker", "inter-broker-name-and-protocol",
        "inter-broker-listener-ssl-without-keystore", "no-keystore", "missing-keystore-file"])
def test_what_is_not_served_yet_is_refused_at_start_in_one_line(tmp_path, properties, words, status):
    p, q = free_port(), free_port()
    result = _serve_properties(tmp_path, properties.format(p=p, q=q))
    assert_one_line_failure(result, *(word.format(p=p, q=q) for word in words), status=status)
    assert not (tmp_path / "fresh").exists()


def test_an_ssl_inter_broker_listener_whose_trust_store_does_not_trust_its_key_store_is_refused(tmp_path, pki):
    """Kafka's SslFactory check for the inter-broker listener: a client made from the listener's own settings
    must complete a handshake with its server side. A trust store of another CA fails the start in one line,
    rather than every broker-to-broker connection failing later."""
    (tmp_path / "other").mkdir()
    other = standard_pki(tmp_path / "other", name="Other CA")
    p, q = free_port(), free_port()
    result = _serve_properties(tmp_path, f"listeners=PLAINTEXT://127.0.0.1:{p},SSL://127.0.0.1:{q}\n"
                               "security.inter.broker.protocol=SSL\nssl.keystore.type=PEM\n"
                               f"ssl.keystore.location={pki.broker_pem_file}\nssl.truststore.type=PEM\n"
                               f"ssl.truststore.location={other.ca_file}\n")
    assert_one_line_failure(result, f"listener SSL://127.0.0.1:{q}", "A client SSLEngine created with the provided "
                            "settings can't connect to a server SSLEngine created with those settings", status=1)
    assert not (tmp_path / "fresh").exists()


def test_a_single_node_with_an_ssl_inter_broker_listener_commits_transactions_over_it(tmp_path, pki):
    """security.inter.broker.protocol=SSL on one broker: the transaction marker sender reaches the broker itself
    over TLS (its own client certificate under ssl.client.auth=required, the certificate checked against the
    advertised host), so a transactional producer's commit completes and a read_committed consumer sees it."""
    plain, tls = free_port(), free_port()
    broker = BrokerProcess(tmp_path / "broker", port=plain, config={
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}", "security.inter.broker.protocol": "SSL",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": pki.broker_pem_file, "ssl.truststore.type": "PEM",
        "ssl.truststore.location": pki.ca_file, "listener.name.ssl.ssl.client.auth": "required",
        "num.partitions": 1, "offsets.topic.num.partitions": 1, "transaction.state.log.num.partitions": 1})
    broker.start()
    try:
        topic = f"txn-{uuid.uuid4().hex[:8]}"
        bootstrap = f"127.0.0.1:{plain}"
        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "transactional.id": "t-ssl-ib"})
        producer.init_transactions(TIMEOUT_S)
        producer.begin_transaction()
        for index in range(3):
            producer.produce(topic, f"v{index}".encode())
        producer.commit_transaction(TIMEOUT_S)
        values = consume_values(bootstrap, {"isolation.level": "read_committed"}, topic, 3)
        assert values == [b"v0", b"v1", b"v2"]
        # the marker sender came in on the SSL listener with the broker's own certificate
        assert _log_lines(broker, "listener SSL", "principal User:CN=broker,O=pykbroker")
    finally:
        broker.close()


def test_a_server_properties_file_with_an_ssl_listener_serves_it(tmp_path, pki):
    """Kafka's own file format and names, with the key store given for the SSL listener only."""
    plain, tls = free_port(), free_port()
    properties = tmp_path / "server.properties"
    properties.write_text(
        f"listeners=PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}\n"
        "listener.name.ssl.ssl.keystore.type=PEM\n"
        f"listener.name.ssl.ssl.keystore.location={pki.broker_pem_file}\n")
    broker = BrokerProcess(tmp_path / "broker", port=plain)
    original = broker.command
    broker.command = lambda: original() + ["--config", str(properties)]
    broker.start()
    try:
        assert _metadata_ports(f"127.0.0.1:{tls}", _ssl(pki)) == [tls]
    finally:
        broker.close()

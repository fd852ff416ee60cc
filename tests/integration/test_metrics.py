"""The broker's metrics endpoint (--metrics-port / metrics.port): a stock client produces and consumes, a
scrape parsed with prometheus_client's parser shows what happened; /health and /ready; HTTP input that is
not a proper request gets 4xx and never disturbs the broker."""

from __future__ import annotations

import http.client
import os
import platform
import socket
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from broker_process import HOST, BrokerError, BrokerProcess, free_port, probe_api_versions, wait_until
import pykbroker
from pykbroker.protocol.records import ACCELERATED

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 30


class MetricsBroker(BrokerProcess):
    """A broker started with the --metrics-port flag."""

    def __init__(self, workdir, **kwargs):
        super().__init__(workdir, **kwargs)
        self.metrics_port = free_port()

    def command(self) -> list[str]:
        return super().command() + ["--metrics-port", str(self.metrics_port)]


@pytest.fixture
def metrics_broker(tmp_path):
    broker = MetricsBroker(tmp_path / "broker")
    with broker:
        yield broker


def http_get(port: int, path: str, method: str = "GET") -> tuple[int, dict, bytes]:
    connection = http.client.HTTPConnection(HOST, port, timeout=TIMEOUT_S)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    status, headers, body = http_get(port, "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def total(samples, name: str, **labels) -> float:
    """The sum of every sample of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, sample_labels), v in samples.items() if n == name and wanted <= sample_labels)


def raw_exchange(port: int, payload: bytes) -> bytes:
    """Send ``payload``, half-close, read the whole answer."""
    with socket.create_connection((HOST, port), timeout=TIMEOUT_S) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:80]
    return int(answer.split(b" ", 2)[1])


def test_scrape_reflects_produce_consume_and_commit(metrics_broker, topic_name):
    port = metrics_broker.metrics_port
    assert http_get(port, "/health")[:3:2] == (200, b"ok\n")
    assert http_get(port, "/ready")[:3:2] == (200, b"ready\n")
    bootstrap = metrics_broker.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.create_topics([NewTopic(topic_name, num_partitions=2)]).values()
    future.result(timeout=TIMEOUT_S)

    produced = 50
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    failures = []
    for i in range(produced):
        producer.produce(topic_name, value=b"v" * (10 + i), partition=0,
                         on_delivery=lambda err, msg: err is not None and failures.append(err))
    assert producer.flush(TIMEOUT_S) == 0 and not failures

    group = f"group-{topic_name}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic_name, 0, 0)])
        seen = 0
        deadline = time.monotonic() + TIMEOUT_S
        while seen < produced and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen += 1
        assert seen == produced
        consumer.commit(offsets=[TopicPartition(topic_name, 0, 20)], asynchronous=False)
        samples = scrape(port)
        assert total(samples, "kafka_server_socketservermetrics_connection_count") >= 1  # the consumer's
    finally:
        consumer.close()

    assert total(samples, "kafka_server_brokertopicmetrics_messagesin_total", topic=topic_name) == produced
    log_size = total(samples, "kafka_log_log_size", topic=topic_name)
    assert log_size > produced * 10
    # The log stores the producer's batches as they came: bytes in are the log's bytes.
    assert total(samples, "kafka_server_brokertopicmetrics_bytesin_total", topic=topic_name) == log_size
    assert total(samples, "kafka_server_brokertopicmetrics_bytesout_total", topic=topic_name) >= log_size
    assert total(samples, "kafka_log_log_logendoffset", topic=topic_name, partition="0") == produced
    assert total(samples, "kafka_log_log_logendoffset", topic=topic_name, partition="1") == 0
    assert total(samples, "kafka_log_log_logstartoffset", topic=topic_name, partition="0") == 0
    assert total(samples, "kafka_consumergroup_current_offset", group=group, topic=topic_name, partition="0") == 20
    assert total(samples, "kafka_consumergroup_lag", group=group, topic=topic_name, partition="0") == produced - 20
    # 2 partitions of the topic + __consumer_offsets' 50, all led by the single broker.
    assert total(samples, "kafka_server_replicamanager_partitioncount") == 52
    assert total(samples, "kafka_server_replicamanager_leadercount") == 52
    assert total(samples, "kafka_server_replicamanager_underreplicatedpartitions") == 0
    assert total(samples, "kafka_controller_kafkacontroller_activecontrollercount") == 1
    produce_requests = total(samples, "kafka_network_requestmetrics_requests_total", request="Produce")
    assert 1 <= produce_requests <= produced
    # One partition per produce request here: one NONE per request, no other error.
    assert total(samples, "kafka_network_requestmetrics_errors_total", request="Produce", error="NONE") == produce_requests
    assert total(samples, "kafka_network_requestmetrics_errors_total", request="Produce") == produce_requests
    assert total(samples, "kafka_network_requestmetrics_requests_total", request="CreateTopics") == 1
    assert total(samples, "kafka_network_requestmetrics_requests_total", request="OffsetCommit") == 1
    assert total(samples, "kafka_network_requestmetrics_totaltime_seconds_count", request="Produce") == produce_requests
    assert total(samples, "kafka_server_delayedoperationpurgatory_purgatorysize", delayedOperation="Produce") == 0

    # A request for an unknown topic is counted under its error code.
    producer = Producer({"bootstrap.servers": bootstrap, "allow.auto.create.topics": False,
                         "message.timeout.ms": 2000, "topic.metadata.refresh.interval.ms": 100})
    producer.produce(f"{topic_name}-absent", b"x")
    producer.flush(10)
    after = scrape(port)
    assert total(after, "kafka_network_requestmetrics_errors_total", request="Metadata",
                 error="UNKNOWN_TOPIC_OR_PARTITION") >= 1
    # Counters never go down between scrapes.
    assert total(after, "kafka_server_brokertopicmetrics_messagesin_total", topic=topic_name) == produced


def proc_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def soft_fd_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"no 'Max open files' in /proc/{pid}/limits")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process_* series are read from Linux's /proc")
def test_process_and_build_info_series_describe_the_broker_process(tmp_path, topic_name):
    """process_* (prometheus_client's standard names, the broker process's own /proc entries) and
    pykbroker_build_info, checked against what the test sees of the broker process from outside."""
    launched = time.time()
    broker = MetricsBroker(tmp_path / "broker")
    with broker:
        ready = time.time()
        pid, port = broker.process.pid, broker.metrics_port
        first = scrape(port)
        # /proc's boot time has whole seconds: the start time may read up to 1 s early
        assert launched - 1.5 <= total(first, "process_start_time_seconds") <= ready, (launched, ready)
        cpu = total(first, "process_cpu_seconds_total")
        assert cpu > 0
        rss, vms = total(first, "process_resident_memory_bytes"), total(first, "process_virtual_memory_bytes")
        assert 10 * 2**20 < rss <= vms  # a Python process with the broker's modules loaded: tens of MiB
        # the broker's descriptors (its listeners, segment files, the scrape's own connection), not ours
        assert abs(total(first, "process_open_fds") - proc_fds(pid)) <= 3, proc_fds(pid)
        assert total(first, "process_max_fds") == soft_fd_limit(pid)
        (build,) = [labels for (name, labels) in first if name == "pykbroker_build_info"]
        assert first[("pykbroker_build_info", build)] == 1
        assert dict(build) == {"version": pykbroker.__version__, "python_version": platform.python_version(),
                               "speedups": "true" if ACCELERATED else "false"}

        # work makes the CPU counter grow
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})

        def cpu_grew() -> bool:
            for _ in range(2000):
                producer.produce(topic_name, b"x" * 100)
                producer.poll(0)
            assert producer.flush(TIMEOUT_S) == 0
            return total(scrape(port), "process_cpu_seconds_total") > cpu

        wait_until(cpu_grew, "the broker's process_cpu_seconds_total to grow", TIMEOUT_S)


class PurePythonMetricsBroker(MetricsBroker):
    """A broker that cannot import the C accelerator, as where pykbroker was installed without a C compiler."""

    def command(self) -> list[str]:
        cmd = super().command()
        assert cmd[1:4] == ["-P", "-m", "pykbroker"]
        cmd[1:4] = ["-P", "-c", "import sys; sys.modules['pykbroker._speedups'] = None; from pykbroker.cli import main; main()"]
        return cmd


def test_build_info_says_when_the_c_accelerator_is_not_in_use(tmp_path):
    with PurePythonMetricsBroker(tmp_path / "broker") as broker:
        (build,) = [dict(labels) for (name, labels) in scrape(broker.metrics_port) if name == "pykbroker_build_info"]
        assert build["speedups"] == "false"


def test_head_and_unknown_paths(metrics_broker):
    port = metrics_broker.metrics_port
    status, headers, body = http_get(port, "/ready", method="HEAD")
    assert (status, body, headers["Content-Length"]) == (200, b"", "6")
    assert http_get(port, "/nope")[0] == 404
    assert http_get(port, "/metrics", method="POST")[0] == 405
    assert http_get(port, "/health?verbose=1")[0] == 200


def test_a_large_scrape_arrives_whole(metrics_broker, topic_name):
    admin = AdminClient({"bootstrap.servers": metrics_broker.bootstrap})
    (future,) = admin.create_topics([NewTopic(topic_name, num_partitions=300)]).values()
    future.result(timeout=TIMEOUT_S)
    status, headers, body = http_get(metrics_broker.metrics_port, "/metrics")
    assert status == 200 and len(body) == int(headers["Content-Length"]) > 64 * 1024  # beyond the transport's write buffer mark
    samples = scrape(metrics_broker.metrics_port)
    assert sum(1 for name, labels in samples if name == "kafka_log_log_size" and ("topic", topic_name) in labels) == 300


BAD_REQUESTS = [
    b"GARBAGE\r\n\r\n",
    b"GET /metrics\r\n\r\n",  # no version
    b"GET metrics HTTP/1.1\r\n\r\n",  # not a path
    b"GET /metrics SPDY/3\r\n\r\n",
    b"\x00\x00\x00\x14\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff\r\n\r\n",  # a Kafka request
    b"GET /\xff\xfe HTTP/1.1\r\n\r\n",  # not ASCII
    b"GET /metrics HTTP/1.1\r\nHost: x",  # the head never ends
]


@pytest.mark.parametrize("payload", BAD_REQUESTS, ids=range(len(BAD_REQUESTS)))
def test_bad_http_input_is_answered_400(metrics_broker, payload):
    assert status_of(raw_exchange(metrics_broker.metrics_port, payload)) == 400
    assert http_get(metrics_broker.metrics_port, "/health")[0] == 200


def test_abuse_never_disturbs_the_broker(metrics_broker):
    port = metrics_broker.metrics_port
    # A head larger than the bound: 431, without reading it all.
    answer = raw_exchange(port, b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 100_000 + b"\r\n\r\n")
    assert status_of(answer) == 431
    # Connect-and-leave, connections that send half a head and vanish, and more connections than the bound.
    for _ in range(5):
        socket.create_connection((HOST, port), timeout=TIMEOUT_S).close()
    idle = [socket.create_connection((HOST, port), timeout=TIMEOUT_S) for _ in range(100)]
    for sock in idle[:50]:
        sock.sendall(b"GET /met")
    for sock in idle:
        sock.close()
    # One that resets the connection mid-request.
    sock = socket.create_connection((HOST, port), timeout=TIMEOUT_S)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.sendall(b"GET /metrics HTTP/1.1\r\n")
    sock.close()
    wait_until(lambda: http_get(port, "/health")[0] == 200, "the metrics endpoint answers again", TIMEOUT_S)
    assert http_get(port, "/metrics")[0] == 200
    probe_api_versions(metrics_broker.address)  # the Kafka listener too
    assert metrics_broker.is_running()


def test_slow_clients_holding_every_slot_do_not_keep_a_probe_from_its_answer(metrics_broker):
    """MAX_CONNECTIONS clients that connect and never finish their request head hold every slot until the read
    timeout; a liveness probe arriving then still gets 200: the oldest unfinished connection makes room."""
    from pykbroker.metrics.http import MAX_CONNECTIONS

    port = metrics_broker.metrics_port
    slow = []
    try:
        for number in range(MAX_CONNECTIONS + 8):
            sock = socket.create_connection((HOST, port), timeout=TIMEOUT_S)
            if number % 2:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # half a head, never finished
            slow.append(sock)
        for _ in range(3):
            started = time.monotonic()
            status, _, body = http_get(port, "/health")
            assert (status, body) == (200, b"ok\n")
            assert time.monotonic() - started < TIMEOUT_S
    finally:
        for sock in slow:
            sock.close()
    probe_api_versions(metrics_broker.address)
    assert metrics_broker.is_running()


def test_a_deleted_topic_leaves_the_scrape(metrics_broker, topic_name):
    admin = AdminClient({"bootstrap.servers": metrics_broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(TIMEOUT_S)
    producer = Producer({"bootstrap.servers": metrics_broker.bootstrap})
    producer.produce(topic_name, b"v")
    assert producer.flush(TIMEOUT_S) == 0
    port = metrics_broker.metrics_port
    assert total(scrape(port), "kafka_server_brokertopicmetrics_messagesin_total", topic=topic_name) == 1
    admin.delete_topics([topic_name])[topic_name].result(TIMEOUT_S)
    assert not [key for key in scrape(port) if ("topic", topic_name) in key[1]]


def test_config_key_and_port_in_use(broker_factory):
    port = free_port()
    broker = broker_factory({"metrics.port": port})
    assert http_get(port, "/ready")[0] == 200
    # A second broker asking for the same metrics port refuses to start, in one line.
    with pytest.raises(BrokerError):
        broker_factory({"metrics.port": port})
    log = broker_factory.brokers[-1].log_path.read_text()
    assert f"cannot listen on METRICS://127.0.0.1:{port}: the port is in use by another process" in log
    assert broker.is_running()


def test_sasl_authentications_are_counted_per_listener_and_mechanism(tmp_path):
    """Kafka's selector metrics successful-authentication-total / failed-authentication-total, per listener and
    SASL mechanism: a good and a wrong password over SASL_PLAINTEXT PLAIN, a good one over SCRAM-SHA-256."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    plain, sasl = free_port(), free_port()
    config = {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config":
            'org.apache.kafka.common.security.plain.PlainLoginModule required user_ann="ann-pw";',
        "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "connection.failed.authentication.delay.ms": 0,
    }
    with MetricsBroker(tmp_path / "broker", config=config, port=plain) as broker:
        name = "kafka_server_socketservermetrics_{}_total"
        before = scrape(broker.metrics_port)
        assert total(before, name.format("successful_authentication")) == 0
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        upsert = UserScramCredentialUpsertion("sid", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"sid-pw")
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=TIMEOUT_S)

        def metadata(mechanism: str, user: str, password: str) -> None:
            client = AdminClient({"bootstrap.servers": f"127.0.0.1:{sasl}", "security.protocol": "SASL_PLAINTEXT",
                                  "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password})
            try:
                client.list_topics(timeout=10)
            except confluent_kafka.KafkaException:
                pass

        metadata("PLAIN", "ann", "ann-pw")
        metadata("PLAIN", "ann", "wrong-pw")
        metadata("SCRAM-SHA-256", "sid", "sid-pw")
        after = scrape(broker.metrics_port)
        listener = "SASL_PLAINTEXT"
        assert total(after, name.format("successful_authentication"), listener=listener, mechanism="PLAIN") >= 1
        assert total(after, name.format("failed_authentication"), listener=listener, mechanism="PLAIN") >= 1
        assert total(after, name.format("successful_authentication"), listener=listener, mechanism="SCRAM-SHA-256") >= 1
        assert total(after, name.format("failed_authentication"), listener=listener, mechanism="SCRAM-SHA-256") == 0

"""PykbrokerContainer for real: the image of docker/Dockerfile in a container on host networking, used by
kafka-python, confluent-kafka and the Java client (produce and consume, a consumer group, topic admin), kcat,
and tests/integration's group scenario with confluent-kafka, kafka-python, aiokafka and KafkaJS; and
its lifecycle: the start error of a broker that cannot start carries the container's output, and no
container is left behind. PykbrokerCluster: ZooKeeper and 3 brokers in containers. build_image."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest

from docker_helpers import SESSION_ID, SESSION_LABEL, SUITE_LABELS, session_containers, unique
from kafka_reference import REPO_ROOT  # also puts tests/integration on sys.path
from pykbroker.testcontainers import ContainerStartException, PykbrokerCluster, PykbrokerContainer
from test_transactions_clients import java_client_or_skip, poll_until  # tests/integration's client helpers

import test_groups_common as group_scenarios  # noqa: E402  (tests/integration, as the two imports above)
from test_groups_common import BROKER_CONFIG as GROUP_BROKER_CONFIG  # noqa: E402
from test_groups_scenarios import CLIENTS as GROUP_CLIENTS  # noqa: E402

JAVA_SOURCE = REPO_ROOT / "tests" / "integration" / "java" / "SaslClient.java"
TIMEOUT_S = 60.0


def suite_container(image: str, **kwargs) -> PykbrokerContainer:
    return PykbrokerContainer(image, **{"host_network": True, **kwargs}).with_labels(SUITE_LABELS)


@pytest.fixture(scope="module")
def broker(pykbroker_image):
    container = suite_container(pykbroker_image).with_partitions(3)
    for key, value in GROUP_BROKER_CONFIG.items():  # the group scenarios' members use 3 s sessions
        container.with_broker_config(key, value)
    with container:
        yield container


# -- stock clients ---------------------------------------------------------------------------------------


def test_confluent_kafka_admin_produce_and_a_consumer_group(broker):
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap = broker.get_bootstrap_server()
    assert bootstrap == f"127.0.0.1:{broker.port}"
    topic, group = unique("tc-confluent"), unique("tc-confluent-group")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic)])[topic].result(TIMEOUT_S)
    metadata = admin.list_topics(timeout=TIMEOUT_S)
    assert len(metadata.topics[topic].partitions) == 3  # with_partitions: the broker's num.partitions
    assert [(b.host, b.port) for b in metadata.brokers.values()] == [("127.0.0.1", broker.port)]
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition in range(3):
        producer.produce(topic, value=f"v{partition}".encode(), partition=partition)
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    read = poll_until(consumer, 3, quiet=0.5)  # and nothing more
    consumer.commit(asynchronous=False)
    committed = consumer.committed([TopicPartition(topic, p) for p in range(3)], timeout=TIMEOUT_S)
    consumer.close()
    assert sorted(read) == [(topic, p, 0, f"v{p}".encode()) for p in range(3)]
    assert [(tp.partition, tp.offset) for tp in committed] == [(0, 1), (1, 1), (2, 1)]
    admin.delete_topics([topic])[topic].result(TIMEOUT_S)
    deadline = time.monotonic() + TIMEOUT_S
    while topic in admin.list_topics(timeout=TIMEOUT_S).topics:
        assert time.monotonic() < deadline, f"{topic} still listed after its deletion"
        time.sleep(0.1)


def test_kafka_python_admin_produce_and_a_consumer_group(broker):
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

    bootstrap = broker.get_bootstrap_server()
    topic, group = unique("tc-kafka-python"), unique("tc-kafka-python-group")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
        (described,) = admin.describe_topics([topic])
        assert sorted(p["partition_index"] for p in described["partitions"]) == [0, 1]
        producer = KafkaProducer(bootstrap_servers=bootstrap)
        offsets = [producer.send(topic, value=f"kp-{i}".encode(), partition=i % 2).get(TIMEOUT_S).offset
                   for i in range(4)]
        producer.close()
        assert offsets == [0, 0, 1, 1]
        consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                                 enable_auto_commit=False, consumer_timeout_ms=int(TIMEOUT_S * 1000))
        values = []
        for record in consumer:
            values.append(record.value)
            if len(values) == 4:
                break
        consumer.commit()
        consumer.close()
        assert sorted(values) == [b"kp-0", b"kp-1", b"kp-2", b"kp-3"]
        committed = admin.list_group_offsets(group)[group]
        assert {tp: meta.offset for tp, meta in committed.items()} == {TopicPartition(topic, 0): 2,
                                                                       TopicPartition(topic, 1): 2}
    finally:
        admin.close()


def test_java_client_and_kafka_topics_tool(broker, tmp_path):
    """Kafka's kafka-topics.sh (the Java AdminClient 3.7.1) creates and describes a topic; the Java client 3.9
    (tests/integration/java/SaslClient.java, plain settings) produces 3 records and reads them in a new group."""
    from kafka_tools import kafka_tools_or_skip

    java, lib = java_client_or_skip()
    tools = kafka_tools_or_skip()
    bootstrap, topic = broker.get_bootstrap_server(), unique("tc-java")
    tools.run("kafka-topics.sh", "--bootstrap-server", bootstrap, "--create", "--topic", topic, "--partitions", "2")
    described = tools.run("kafka-topics.sh", "--bootstrap-server", bootstrap, "--describe", "--topic", topic).stdout
    assert "PartitionCount: 2" in described and "Leader: 1" in described, described
    done = subprocess.run([java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{lib}/*",
                           str(JAVA_SOURCE), bootstrap, topic, "3"],
                          capture_output=True, text=True, timeout=TIMEOUT_S * 4, cwd=tmp_path)
    assert done.returncode == 0, f"SaslClient.java exited {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
    read = [line.removeprefix("read ") for line in done.stdout.splitlines() if line.startswith("read ")]
    assert sorted(read) == ["java-0", "java-1", "java-2"], done.stdout


def test_kcat_produces_and_consumes(broker):
    """kcat (librdkafka's CLI, no admin commands): its produce auto-creates the topic with the broker's 3
    partitions; the records read back from partition 0 with their keys and offsets."""
    import json
    import shutil

    if shutil.which("kcat") is None:
        pytest.skip("kcat not installed (scripts/install-test-deps.sh)")
    bootstrap, topic = broker.get_bootstrap_server(), unique("tc-kcat")

    def kcat(*args: str, stdin: bytes | None = None) -> bytes:
        done = subprocess.run(["kcat", "-b", bootstrap, *args], input=stdin, capture_output=True, timeout=TIMEOUT_S)
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        return done.stdout

    kcat("-P", "-t", topic, "-p", "0", "-K", ":", stdin=b"k1:v1\nk2:v2\n")
    read = [json.loads(line) for line in kcat("-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-J").splitlines()]
    assert [(r["key"], r["payload"], r["offset"]) for r in read] == [("k1", "v1", 0), ("k2", "v2", 1)]
    listing = json.loads(kcat("-L", "-t", topic, "-J"))
    assert [len(t["partitions"]) for t in listing["topics"]] == [3]


@pytest.mark.parametrize("client", GROUP_CLIENTS)
def test_every_stock_client_splits_a_group_and_one_member_takes_over_after_the_other_leaves(broker, client):
    """tests/integration's group scenario (confluent-kafka, kafka-python, aiokafka, KafkaJS): two members split a
    4-partition topic, read a first batch once; one closes (commit, LeaveGroup), the other gets every partition,
    resumes at the commits and reads the second batch."""
    from types import SimpleNamespace

    group_scenarios.split_then_leave(client, SimpleNamespace(bootstrap=broker.get_bootstrap_server()),
                                     unique("tc-group"))


def test_a_second_container_runs_beside_the_first_and_each_answers_its_health_check(broker, pykbroker_image,
                                                                                   docker_client):
    """Host networking: every port of a container is the host's, the image's fixed metrics port (HEALTHCHECK)
    included; each PykbrokerContainer has its own, and Docker's health check passes on it."""
    import urllib.request

    from confluent_kafka.admin import AdminClient

    with suite_container(pykbroker_image) as second:
        assert {broker.port, broker.metrics_port}.isdisjoint({second.port, second.metrics_port})
        for container in (broker, second):
            bootstrap = container.get_bootstrap_server()
            brokers = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=TIMEOUT_S).brokers
            assert [f"{b.host}:{b.port}" for b in brokers.values()] == [bootstrap]
            with urllib.request.urlopen(f"http://127.0.0.1:{container.metrics_port}/health", timeout=10) as answer:
                assert answer.status == 200
        from docker_helpers import wait_healthy

        wait_healthy(second.get_wrapped_container(), timeout=120)  # a transient "unhealthy" is not final


def test_the_start_script_path_serves_and_the_image_health_check_passes(pykbroker_image, docker_client):
    """The path a bridge network takes (entry point sh -c waiting for a script copied in after start), run on
    the host's network, which this engine has: the command must reach sh as one argument (a string would be
    split by the docker SDK: `sh -c while` and exit 2), and /health must be served for the HEALTHCHECK."""
    from docker_helpers import wait_healthy

    container = suite_container(pykbroker_image)
    container.start_script = True
    with container:
        inspected = docker_client.api.inspect_container(container.get_container_id())
        assert inspected["Config"]["Entrypoint"] == ["sh", "-c"]
        assert len(inspected["Config"]["Cmd"]) == 1
        bootstrap = container.get_bootstrap_server()
        from confluent_kafka.admin import AdminClient

        brokers = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=TIMEOUT_S).brokers
        assert [f"{b.host}:{b.port}" for b in brokers.values()] == [bootstrap]
        wait_healthy(container.get_wrapped_container(), timeout=120)


# -- lifecycle and bad input -------------------------------------------------------------------------------


def containers_of(docker_client, container_id: str) -> list:
    return docker_client.containers.list(all=True, filters={"id": container_id})


def test_the_broker_listens_on_the_given_port_and_stop_removes_the_container_and_its_volume(pykbroker_image,
                                                                                            docker_client):
    from docker_helpers import free_port

    port = free_port("127.0.0.1")
    container = suite_container(pykbroker_image, port=port).start()
    container_id = container.get_container_id()
    try:
        inspected = docker_client.api.inspect_container(container_id)
        volumes = [m["Name"] for m in inspected["Mounts"] if m["Type"] == "volume"]
        assert volumes  # the image's VOLUME /data
        assert inspected["HostConfig"]["NetworkMode"] == "host"
        assert inspected["Config"]["Labels"][SESSION_LABEL] == SESSION_ID
        assert container.get_bootstrap_server() == f"127.0.0.1:{port}"
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        container.stop()
    assert containers_of(docker_client, container_id) == []
    assert [v for v in volumes if docker_client.volumes.list(filters={"name": v})] == []
    container.stop()  # a second stop does nothing


def test_an_invalid_broker_config_fails_start_with_the_brokers_message_and_nothing_is_left(pykbroker_image,
                                                                                           docker_client):
    before = session_containers(docker_client)
    container = suite_container(pykbroker_image).with_broker_config("num.partitions", "zero")
    with pytest.raises(ContainerStartException) as failure:
        container.start()
    message = str(failure.value)
    assert "exited with code 2" in message, message
    assert ("Invalid value 'zero' for configuration num.partitions: not a 32-bit integer" in message), message
    assert session_containers(docker_client) <= before  # the failed container was removed
    container.stop()  # harmless after a failed start


def test_a_port_in_use_fails_start_in_a_with_block_once_with_the_brokers_message(pykbroker_image, docker_client):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        container = suite_container(pykbroker_image, port=port)
        with pytest.raises(ContainerStartException, match="exited with code 1") as failure:
            with container:
                pass
    assert f"{port}" in str(failure.value) and "in use" in str(failure.value), failure.value
    assert container._container is None


def test_a_chosen_port_taken_before_the_container_binds_it_is_chosen_again_once(pykbroker_image, docker_client):
    """The port chosen by start() taken by someone else before the broker binds it: start() tries once more with
    fresh ports (a port given by the user is not replaced: the test above)."""
    from docker_helpers import free_port

    taken = socket.socket()
    taken.bind(("127.0.0.1", free_port("127.0.0.1")))
    taken.listen()
    chosen: list[int] = []

    class FirstPortTaken(PykbrokerContainer):
        def _choose_ports(self):
            super()._choose_ports()
            if not chosen:
                self.port = taken.getsockname()[1]
            chosen.append(self.port)

    try:
        with FirstPortTaken(pykbroker_image, host_network=True).with_labels(SUITE_LABELS) as container:
            assert chosen[0] == taken.getsockname()[1] and len(chosen) == 2
            assert container.get_bootstrap_server() == f"127.0.0.1:{chosen[1]}"
            with socket.create_connection(("127.0.0.1", chosen[1]), timeout=5):
                pass
    finally:
        taken.close()


def test_a_missing_image_is_pulled_and_where_that_fails_the_error_says_how_to_build_it(docker_client):
    # this engine reaches no registry: the pull fails, and the error says so and how to build the image
    expected = (r"no image pykbroker-absent:0 on the Docker engine and pulling it failed \(.+\): build it from a "
                r"pykbroker checkout \(a pip install has no docker/Dockerfile\) with PykbrokerContainer\.build_image")
    with pytest.raises(ContainerStartException, match=expected):
        PykbrokerContainer("pykbroker-absent:0", host_network=True).start()


def test_a_missing_default_image_is_not_pulled_the_error_says_how_to_build_it(docker_client):
    from pykbroker.testcontainers import DEFAULT_IMAGE

    if docker_client.images.list(name=DEFAULT_IMAGE):
        pytest.skip(f"{DEFAULT_IMAGE} exists on this engine")
    expected = (rf"no image {DEFAULT_IMAGE} on the Docker engine: build it from a pykbroker checkout \(a pip "
                r"install has no docker/Dockerfile\) with PykbrokerContainer\.build_image\(context=<checkout>\)")
    with pytest.raises(ContainerStartException, match=expected):
        PykbrokerContainer(host_network=True).start()


# -- a cluster: 3 brokers and ZooKeeper, each in its container ---------------------------------------------


def test_a_cluster_of_three_brokers_and_zookeeper_serves_a_replicated_topic(pykbroker_image, zookeeper_image,
                                                                           docker_client):
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    cluster = PykbrokerCluster(pykbroker_image, zookeeper_image, brokers=3).with_labels(SUITE_LABELS)
    with cluster:
        ids = [c.get_container_id() for c in (cluster.zookeeper, *cluster.brokers)]
        bootstrap = cluster.get_bootstrap_server()
        assert bootstrap == ",".join(f"127.0.0.1:{cluster.broker(n).port}" for n in (1, 2, 3))
        topic, group = unique("tc-cluster"), unique("tc-cluster-group")
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=3)])[topic].result(TIMEOUT_S)
        partitions = admin.list_topics(topic, timeout=TIMEOUT_S).topics[topic].partitions.values()
        assert sorted(sorted(p.replicas) for p in partitions) == [[1, 2, 3]] * 3
        assert sorted(p.leader for p in partitions) == [1, 2, 3]  # leaders spread over the brokers
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for partition in range(3):
            producer.produce(topic, value=f"c{partition}".encode(), partition=partition)
        assert producer.flush(TIMEOUT_S) == 0
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
        consumer.subscribe([topic])
        read = poll_until(consumer, 3, quiet=0.5)
        consumer.close()
        del producer, admin  # librdkafka handles: gone before their brokers are
        assert sorted(read) == [(topic, p, 0, f"c{p}".encode()) for p in range(3)]
    assert [i for i in ids if containers_of(docker_client, i)] == []


def test_a_cluster_whose_broker_cannot_start_fails_with_its_output_and_removes_zookeeper_too(pykbroker_image,
                                                                                              zookeeper_image,
                                                                                              docker_client):
    before = session_containers(docker_client)
    cluster = PykbrokerCluster(pykbroker_image, zookeeper_image, brokers=2).with_labels(SUITE_LABELS)
    cluster.broker(2).with_broker_config("min.insync.replicas", "-1")
    with pytest.raises(ContainerStartException) as failure:
        cluster.start()
    assert "exited with code 2" in str(failure.value) and "min.insync.replicas" in str(failure.value), failure.value
    assert session_containers(docker_client) <= before


def test_build_image_builds_the_checkout_on_the_given_base(debian_base_image, docker_client):
    """PykbrokerContainer.build_image (the docker CLI with BuildKit, as docker/Dockerfile needs) on the local
    base, labelled. Its layers are those of pykbroker_image's build, so this takes seconds once that one ran:
    the pip step runs here only from a cold cache, but every suite image is built by this same function
    (docker_helpers.build_image calls it with the pip configuration as a secret), so a session from a cold
    cache runs the pip step through it; a --no-cache build here would cost minutes on every run."""
    from docker_helpers import CA_BUNDLE, SESSION_ID, SUITE_LABEL, docker_cli

    tag = f"pykbroker-build-test:{SESSION_ID}"
    assert PykbrokerContainer.build_image(tag, base_image=debian_base_image, ca_bundle=CA_BUNDLE,
                                          docker=docker_cli(), labels={SUITE_LABEL: "1"}) == tag
    try:
        assert docker_client.images.get(tag).labels[SUITE_LABEL] == "1"
        with suite_container(tag) as container:
            assert container.ready_seconds is not None
    finally:
        docker_client.images.remove(tag)


def test_a_container_that_never_answers_times_out_with_its_output_and_is_removed(debian_base_image, docker_client):
    """The generic lifecycle (ServerContainer, which PykbrokerContainer and the Kafka container share): a
    server that runs but never listens fails start() with TimeoutError once its time is up."""
    from pykbroker.testcontainers import KafkaProtocolContainer

    class Silent(KafkaProtocolContainer):
        def serve_command(self, listen_host, advertised_host, advertised_port):
            return ["sh", "-c", "echo listening nowhere; exec sleep 600"]

    before = session_containers(docker_client)
    expected = r"not ready on 127\.0\.0\.1:\d+ \(running\); its output:\nlistening nowhere"
    with pytest.raises(TimeoutError, match=expected):
        Silent(debian_base_image).with_labels(SUITE_LABELS).start(timeout=2)
    assert session_containers(docker_client) <= before

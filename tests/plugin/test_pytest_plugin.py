"""The pytest plugin (pykbroker/testing.py), tested as users meet it: test files run by a pytest subprocess
(pytest's `pytester`), which loads the plugin through its entry point.

Each inner run reports what it saw (broker ports, pids, work dirs, start times) as JSON lines in a file named
by $PYKBROKER_PLUGIN_REPORT, so the outer test can check scopes and cleanup from outside.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pykbroker.testing import FILES_ROOT

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS = REPO_ROOT / "docs" / "testing.md"

pytestmark = pytest.mark.timeout(240)

RECORD = '''
import json, os
def record(server, **more):
    entry = {"bootstrap": server.bootstrap_servers, "workdir": str(server.workdir),
             "start_seconds": server.start_seconds, **more}
    if hasattr(server, "proc"):
        entry["pid"] = server.proc.pid
    else:
        entry["pids"] = [b.proc.pid for b in server._cluster.brokers] + [server._cluster.zk.pid]
    with open(os.environ["PYKBROKER_PLUGIN_REPORT"], "a") as out:
        out.write(json.dumps(entry) + "\\n")

def broker_setting(server, name, broker_id=None):
    """A broker config's effective value, as DescribeConfigs answers it (confluent-kafka's AdminClient)."""
    from confluent_kafka.admin import AdminClient, ConfigResource
    if broker_id is None:
        broker_id = server.broker_ids[0] if hasattr(server, "broker_ids") else 1
    resource = ConfigResource("BROKER", str(broker_id))
    admin = AdminClient({"bootstrap.servers": server.bootstrap_servers})
    return admin.describe_configs([resource])[resource].result(30)[name].value
'''


@pytest.fixture
def report(pytester, monkeypatch):
    path = pytester.path / "report.jsonl"
    monkeypatch.setenv("PYKBROKER_PLUGIN_REPORT", str(path))
    # the inner pytest runs this checkout's pykbroker (the entry point imports pykbroker.testing from it)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p))
    pytester.makepyfile(record_helper=RECORD)

    def read() -> list[dict]:
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    return read


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie (exited, not yet reaped by its parent, which is gone too) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def wait_for(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def assert_cleaned(entries: list[dict]) -> None:
    for entry in entries:
        for pid in entry.get("pids", [entry.get("pid")]):
            wait_for(lambda: pid_gone(pid), f"process {pid} to be gone")
        assert not Path(entry["workdir"]).exists(), f"{entry['workdir']} left behind"


def docs_example() -> str:
    """The example test of docs/testing.md, run as it is printed."""
    blocks = re.findall(r"```python\n(# test_orders.py\n.*?)```", DOCS.read_text(), re.S)
    assert len(blocks) == 1, "docs/testing.md must hold one example starting with '# test_orders.py'"
    return blocks[0]


def test_the_documented_confluent_kafka_example_passes(pytester, report):
    pytest.importorskip("confluent_kafka")
    pytester.makepyfile(test_orders=docs_example() + (
        "\n\nfrom record_helper import record\n\n"
        "def test_zz_record(kafka_broker):\n    record(kafka_broker)\n"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=3)
    (entry,) = report()
    # the broker started in well under a second (a generous bound: the machine may be loaded)
    assert entry["start_seconds"] < 3.0, entry
    print(f"kafka_broker start: {entry['start_seconds']:.3f} s")
    assert_cleaned([entry])


def test_scope_is_session_by_default_and_configurable(pytester, report):
    for module in ("a", "b"):
        pytester.makepyfile(**{f"test_{module}": (
            "from record_helper import record\n"
            "def test_one(kafka_broker):\n    record(kafka_broker, module=__name__)\n"
            "def test_two(kafka_broker):\n    record(kafka_broker, module=__name__)\n")})
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=4)
    assert len({e["bootstrap"] for e in report()}) == 1, "session scope: one broker for the run"

    for option, brokers in ((["--pykbroker-scope=function"], 4), (["--pykbroker-scope", "module"], 2)):
        (pytester.path / "report.jsonl").unlink()
        pytester.runpytest_subprocess("-p", "no:cacheprovider", *option).assert_outcomes(passed=4)
        entries = report()
        assert len({e["workdir"] for e in entries}) == brokers, (option, entries)
        assert_cleaned(entries)

    (pytester.path / "report.jsonl").unlink()
    pytester.makeini("[pytest]\npykbroker_scope = module\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=4)
    assert len({e["workdir"] for e in report()}) == 2, "ini pykbroker_scope = module"

    pytester.makeini("[pytest]\npykbroker_scope = forever\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*pykbroker_scope = 'forever': must be one of session*"])


GROUP_JOIN_TEST = """
from confluent_kafka import Consumer
from record_helper import broker_setting, record

def test_settings_and_a_group_join(kafka_broker, kafka_topic):
    record(kafka_broker, delay=broker_setting(kafka_broker, "group.initial.rebalance.delay.ms"),
           partitions=broker_setting(kafka_broker, "num.partitions"))
    kafka_broker.produce(kafka_topic, "v")
    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap_servers, "group.id": "g",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([kafka_topic])
    try:
        message = consumer.poll(30)
        assert message is not None and message.error() is None and message.value() == b"v"
    finally:
        consumer.close()
"""


def test_the_fixture_broker_skips_the_initial_rebalance_delay_and_takes_configs(pytester, report):
    """Test brokers set group.initial.rebalance.delay.ms=0 (a group's first join does not wait 3 s): so does
    the fixture's; the ini option pykbroker_config and --pykbroker-config (over the ini) set any broker config."""
    pytest.importorskip("confluent_kafka")
    pytester.makepyfile(test_group=GROUP_JOIN_TEST)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
    (entry,) = report()
    assert (entry["delay"], entry["partitions"]) == ("0", "1"), entry

    pytester.makeini("[pytest]\npykbroker_config =\n    group.initial.rebalance.delay.ms=3000\n"
                     "    num.partitions = 4\n")
    for options, expected in (([], ("3000", "4")),
                              (["--pykbroker-config", "group.initial.rebalance.delay.ms=10",
                                "--pykbroker-config=num.partitions=2"], ("10", "2"))):
        (pytester.path / "report.jsonl").unlink()
        pytester.runpytest_subprocess("-p", "no:cacheprovider", *options).assert_outcomes(passed=1)
        (entry,) = report()
        assert (entry["delay"], entry["partitions"]) == expected, (options, entry)
        assert_cleaned([entry])

    # not KEY=VALUE: a usage error before any broker starts
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pykbroker-config", "num.partitions")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--pykbroker-config 'num.partitions': must be KEY=VALUE*"])


@pytest.mark.parametrize("entry", ["listeners=PLAINTEXT://127.0.0.1:9092", "advertised.listeners=PLAINTEXT://h:1",
                                   "advertised.host=h", "port=9092", "host=0.0.0.0", "log.dirs=/tmp/x",
                                   "data_dir=/tmp/x", "broker.id=7", "zookeeper.connect=127.0.0.1:2181"])
def test_configs_the_fixtures_own_are_refused_naming_the_key(pytester, report, entry):
    """Where a fixture broker listens and what it advertises, its data dir, id and ZooKeeper are the fixture's:
    `listeners` made the broker ignore the fixture's port and the fixture time out after 30 s;
    advertised.listeners sent clients elsewhere. Given by the ini file or the command line, or to KafkaBroker or
    KafkaCluster, such a key is refused at once (no broker starts), naming it."""
    from pykbroker.testing import KafkaBroker, KafkaCluster

    key = entry.partition("=")[0]
    pytester.makepyfile(test_nothing="def test_nothing(kafka_broker):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pykbroker-config", entry)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--pykbroker-config {entry!r}: {key} is the pykbroker fixtures' own*"])
    pytester.makeini(f"[pytest]\npykbroker_config =\n    num.partitions=2\n    {entry}\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*pykbroker_config {entry!r}: {key} is the pykbroker fixtures' own*"])
    assert report() == []  # no broker ran
    for make in (lambda config: KafkaBroker(config), lambda config: KafkaCluster(config=config)):
        with pytest.raises(ValueError, match=f"{key} is the pykbroker fixtures' own"):
            make(dict([entry.split("=", 1)]))


def test_helpers_stop_restart_and_a_stopped_shared_broker_comes_back(pytester, report):
    pytester.makepyfile(test_resilience='''
import pytest
from pykbroker.testing import KafkaAdminError
from record_helper import record

def test_helpers(kafka_broker, kafka_topic):
    assert kafka_topic in kafka_broker.list_topics()
    assert kafka_broker.produce(kafka_topic, "v0", (b"k1", b"v1"), headers=[("h", "x")]) == [0, 1]
    messages = kafka_broker.consume(kafka_topic)
    assert [(m.offset, m.key, m.value, m.headers) for m in messages] == [
        (0, None, b"v0", (("h", b"x"),)), (1, b"k1", b"v1", (("h", b"x"),))]
    assert kafka_broker.end_offset(kafka_topic) == 2
    assert [m.value for m in kafka_broker.consume(kafka_topic, offset=1, max_messages=1)] == [b"v1"]
    with pytest.raises(KafkaAdminError) as error:
        kafka_broker.create_topic(kafka_topic)
    assert error.value.error == "TOPIC_ALREADY_EXISTS"
    kafka_broker.create_topic("multi", partitions=3, config={"retention.ms": 60000})
    assert sorted(kafka_broker.partitions("multi")) == [0, 1, 2]
    kafka_broker.produce("multi", "p2", partition=2)
    kafka_broker.delete_topic("multi")
    assert "multi" not in kafka_broker.list_topics()

def test_restart_keeps_data_and_port(kafka_broker, kafka_topic):
    before = kafka_broker.bootstrap_servers
    kafka_broker.produce(kafka_topic, "kept")
    kafka_broker.restart(kill=True)
    assert kafka_broker.bootstrap_servers == before
    assert [m.value for m in kafka_broker.consume(kafka_topic)] == [b"kept"]
    record(kafka_broker, restart_seconds=kafka_broker.start_seconds)

def test_stop_leaves_it_stopped(kafka_broker):
    kafka_broker.stop()
    assert not kafka_broker.running()
    with pytest.raises(OSError):
        kafka_broker.list_topics()

def test_next_test_gets_it_running_again(kafka_broker):
    assert kafka_broker.running()
    assert isinstance(kafka_broker.list_topics(), set)
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=4)
    (entry,) = report()
    assert entry["restart_seconds"] < 3.0
    assert_cleaned([entry])


def test_a_failing_test_gets_the_broker_log(pytester, report):
    pytester.makepyfile(test_fails='''
def test_fails(kafka_broker):
    assert False, "on purpose"
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*pykbroker log 127.0.0.1:*", "*last * lines of *broker.log*"])


def test_files_and_processes_are_cleaned_up_after_ctrl_c_and_after_a_kill(pytester, report):
    pytester.makepyfile(test_hangs='''
import time
from record_helper import record
def test_hangs(kafka_broker):
    record(kafka_broker)
    time.sleep(600)
''')
    for sig in (signal.SIGINT, signal.SIGKILL):
        (pytester.path / "report.jsonl").unlink(missing_ok=True)
        env = dict(os.environ)
        run = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_hangs.py"],
                               cwd=pytester.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: report(), "the inner test to start its broker", timeout=60)
            (entry,) = report()
            run.send_signal(sig)
            output = run.communicate(timeout=60)[0].decode(errors="replace")
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
        wait_for(lambda: pid_gone(entry["pid"]), f"the broker to die with pytest ({sig.name})")
        if sig == signal.SIGINT:
            assert "KeyboardInterrupt" in output
            assert not Path(entry["workdir"]).exists(), "Ctrl-C: the broker's files were left"
        else:
            # pytest had no chance to clean up: the next run that starts a broker removes the files
            assert Path(entry["workdir"]).exists()
            from pykbroker.testing import KafkaBroker

            with KafkaBroker():
                assert not Path(entry["workdir"]).exists(), "a killed run's files were not swept"
    assert FILES_ROOT.is_dir()


def test_the_cluster_fixture(pytester, report):
    pytest.importorskip("confluent_kafka")
    pytester.makepyfile(test_cluster='''
from confluent_kafka import Producer
from record_helper import broker_setting, record

def test_cluster(kafka_cluster):
    record(kafka_cluster)
    assert {broker_setting(kafka_cluster, "group.initial.rebalance.delay.ms", b) for b in kafka_cluster.broker_ids} == {"0"}
    assert len(kafka_cluster.bootstrap_servers.split(",")) == 3
    topic = kafka_cluster.create_topic("replicated", partitions=2, replication_factor=3)
    leader = kafka_cluster.partitions(topic)[0]
    kafka_cluster.stop_broker(leader)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    producer.produce(topic, value=b"after failover", partition=0)
    assert producer.flush(30) == 0
    assert kafka_cluster.partitions(topic)[0] != leader
    assert [m.value for m in kafka_cluster.consume(topic, 0)] == [b"after failover"]

def test_the_stopped_broker_is_back(kafka_cluster):
    assert kafka_cluster.running()
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    outcomes = result.parseoutcomes()
    if outcomes.get("skipped"):
        result.stdout.fnmatch_lines(["*kafka_cluster needs ZooKeeper*"])
        pytest.skip("kafka_cluster skipped in the inner run (no ZooKeeper or java)")
    result.assert_outcomes(passed=2)
    (entry,) = report()
    assert_cleaned([entry])


def test_a_killed_run_with_a_cluster_leaves_nothing_after_the_next_run(pytester, report):
    pytester.makepyfile(test_cluster_hangs='''
import time
from record_helper import record
def test_hangs(kafka_cluster):
    record(kafka_cluster)
    time.sleep(600)
''')
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_cluster_hangs.py"],
                           cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: report() or run.poll() is not None, "the inner test to start its cluster", timeout=120)
        if not report():
            output = run.communicate()[0].decode(errors="replace")
            if "kafka_cluster needs ZooKeeper" in output:
                pytest.skip("no ZooKeeper or java for kafka_cluster")
            raise AssertionError(output)
        (entry,) = report()
        run.kill()
        run.wait(30)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    *brokers, zookeeper = entry["pids"]
    for pid in brokers:
        wait_for(lambda: pid_gone(pid), f"broker {pid} to die with the killed run")
    # ZooKeeper dies with the run too (PDEATHSIG); the next run's sweep kills it if it did not
    from pykbroker.testing import KafkaBroker

    with KafkaBroker():
        pass
    wait_for(lambda: pid_gone(zookeeper), "the orphaned ZooKeeper to be killed by the next run")
    assert not Path(entry["workdir"]).exists()


def test_kafka_cluster_skips_with_the_reason_without_zookeeper(pytester, report, monkeypatch):
    monkeypatch.setenv("PYKBROKER_ZOOKEEPER_JAR", str(pytester.path / "no-such-zookeeper.jar"))
    pytester.makepyfile(test_needs_cluster="def test_x(kafka_cluster):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*kafka_cluster needs ZooKeeper: Apache ZooKeeper is not installed*no-such-zookeeper.jar not found*"])


def _zookeeper_or_skip():
    from pykbroker.cluster.zk_server import ZooKeeperUnavailable, find_install

    try:
        find_install()
    except ZooKeeperUnavailable as exc:
        pytest.skip(str(exc))


def test_the_cluster_records_its_zookeeper_before_starting_brokers(monkeypatch):
    """A run killed while the brokers start must still have its ZooKeeper killed by the next run's sweep:
    the pid is on record from the moment ZooKeeper is spawned."""
    _zookeeper_or_skip()
    from pykbroker.testing import ORPHANS_FILE, KafkaCluster

    seen = {}

    def broker_start(broker, *args, **kwargs):
        seen["recorded"] = (cluster.workdir / ORPHANS_FILE).read_text().split()
        seen["zookeeper"] = cluster._cluster.zk.pid
        raise RuntimeError("killed while the brokers start")

    cluster = KafkaCluster(brokers=1)
    # the class the cluster really uses (an in-process pytester run may have re-imported the module)
    monkeypatch.setattr(type(cluster._cluster.brokers[0]), "start", broker_start)
    try:
        with pytest.raises(RuntimeError, match="killed while"):
            cluster.start(timeout=60)
    finally:
        cluster.close()
    assert seen["recorded"] == [str(seen["zookeeper"])]
    wait_for(lambda: pid_gone(seen["zookeeper"]), "the cluster's ZooKeeper to stop")


def test_the_cluster_zookeeper_dies_with_the_thread_that_started_it(tmp_path):
    import threading

    _zookeeper_or_skip()
    from pykbroker.cluster.zk_server import ZooKeeperServer

    server = ZooKeeperServer(data_dir=tmp_path / "zk", die_with_parent=True)
    failure = []

    def start():
        try:
            server.start()
        except Exception as exc:
            failure.append(exc)

    starter = threading.Thread(target=start)
    starter.start()
    starter.join(120)
    assert not failure, failure
    try:
        # the starting thread ended: PR_SET_PDEATHSIG SIGKILLs the JVM as it would with a killed pytest
        wait_for(lambda: pid_gone(server.pid), "ZooKeeper to die with the thread that started it", timeout=30)
    finally:
        server.stop()


def test_free_ports_are_outside_the_ephemeral_range():
    """A broker keeps its port across restarts; while it is down, an outgoing connection could get that port
    as its local port if it were in the kernel's ephemeral range."""
    from pykbroker.cluster.zk_server import ephemeral_port_range, free_port
    from pykbroker.testing import KafkaBroker

    low, high = ephemeral_port_range()
    ports = [free_port() for _ in range(20)] + [KafkaBroker().port]
    assert all(not low <= port <= high for port in ports), (low, high, ports)


def test_a_broker_whose_port_an_outgoing_connection_holds_starts_once_it_is_released(tmp_path):
    import socket
    import threading

    from pykbroker.testing import PORT_IN_USE_MESSAGE, KafkaBroker

    broker = KafkaBroker(workdir=tmp_path / "broker")
    server = socket.create_server(("127.0.0.1", 0))
    holder = socket.socket()
    holder.bind(("127.0.0.1", broker.port))  # an outgoing connection whose local port is the broker's
    holder.connect(server.getsockname())
    accepted, _ = server.accept()
    released = threading.Event()

    def release_once_refused():
        try:
            wait_for(lambda: broker.log_path.exists() and PORT_IN_USE_MESSAGE in broker.log_path.read_bytes(),
                     "the broker to find its port in use", timeout=60)
        finally:
            # the peer closes first, so the TIME_WAIT lands on its side, not on the broker's port
            accepted.close()
            holder.settimeout(30)
            assert holder.recv(1) == b""
            holder.close()
            server.close()
            released.set()

    releaser = threading.Thread(target=release_once_refused)
    releaser.start()
    try:
        broker.start(timeout=90)
        assert broker.running()
        assert PORT_IN_USE_MESSAGE in broker.log_path.read_bytes()  # it did meet the taken port
    finally:
        releaser.join(90)
        broker.close()
    assert released.is_set()


SECURED_TEST = '''
import pytest
from record_helper import record

SECURED = [{"security": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256"}, {"security": "SSL"},
           {"security": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"}]


@pytest.mark.parametrize("kafka_broker", SECURED, indirect=True)
def test_confluent_kafka_and_kafka_python_with_the_handed_out_settings(kafka_broker, kafka_topic):
    import confluent_kafka
    import kafka

    config = kafka_broker.client_config()
    assert config["security.protocol"] == kafka_broker.security
    producer = confluent_kafka.Producer(config)
    producer.produce(kafka_topic, b"from-confluent")
    assert producer.flush(30) == 0
    python_producer = kafka.KafkaProducer(**kafka_broker.kafka_python_config())
    python_producer.send(kafka_topic, b"from-kafka-python").get(timeout=30)
    python_producer.close()
    consumer = kafka.KafkaConsumer(kafka_topic, auto_offset_reset="earliest", consumer_timeout_ms=20000,
                                   **kafka_broker.kafka_python_config())
    values = []
    for message in consumer:
        values.append(message.value)
        if len(values) == 2:
            break
    consumer.close()
    assert values == [b"from-confluent", b"from-kafka-python"]
    assert [m.value for m in kafka_broker.consume(kafka_topic)] == values  # the admin helpers work too
    record(kafka_broker, security=kafka_broker.security, sasl_mechanism=kafka_broker.sasl_mechanism,
           properties=kafka_broker.client_properties.read_text())


def test_the_secured_listener_refuses_a_wrong_password(kafka_broker, kafka_topic):
    import confluent_kafka

    config = {**kafka_broker.client_config(), "sasl.password": "wrong-password"}
    errors = []
    producer = confluent_kafka.Producer({**config, "error_cb": errors.append})
    producer.produce(kafka_topic, b"x")
    assert producer.flush(10) == 1
    assert any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors), errors
'''


def test_the_fixture_hands_out_a_secured_broker_and_its_client_settings(pytester, report):
    """Indirect parametrization asks kafka_broker for SSL, SASL_SSL (SCRAM) or SASL_PLAINTEXT (PLAIN): certificates
    made at start, a user created, and confluent-kafka's and kafka-python's settings handed out; the options
    --pykbroker-security / --pykbroker-sasl-mechanism secure the session's broker."""
    pytest.importorskip("confluent_kafka")
    pytest.importorskip("kafka")
    pytest.importorskip("cryptography")
    pytester.makepyfile(test_secured=SECURED_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "handed_out", "-v")
    result.assert_outcomes(passed=3)
    entries = report()
    assert [(e["security"], e["sasl_mechanism"]) for e in entries] == [
        ("SASL_SSL", "SCRAM-SHA-256"), ("SSL", None), ("SASL_PLAINTEXT", "PLAIN")]
    assert "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required" in entries[0]["properties"]
    assert "ssl.truststore.location=" in entries[1]["properties"]
    assert_cleaned(entries)

    (pytester.path / "report.jsonl").unlink()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "wrong_password",
                                           "--pykbroker-security", "sasl_ssl", "--pykbroker-sasl-mechanism",
                                           "SCRAM-SHA-512")
    result.assert_outcomes(passed=1)

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pykbroker-security", "TLS")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*security 'TLS': must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL*"])
    assert report() == []

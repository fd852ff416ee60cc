"""The metrics collector reads a real (in-process, not serving) broker's state at scrape time; the per-request
counters become Prometheus families; error codes are found in nested responses; ISR changes are counted."""

import asyncio

import pytest
from click.testing import CliRunner
from kio.schema.api_versions.v0.response import ApiVersionsResponse
from kio.schema.errors import ErrorCode
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pykbroker.cli import build_config, main
from pykbroker.config import BrokerConfig, ConfigError, load_config
from pykbroker.groups.offset_store import CommittedOffset
from pykbroker.metrics.collector import broker_registry
from pykbroker.metrics.http import ready_reason
from pykbroker.metrics.stats import LATENCY_BUCKETS, BrokerStats, error_counts
from pykbroker.protocol.apis import SINGLE_NODE_APIS
from pykbroker.protocol.records import build_batch
from pykbroker.replication import partition as partition_module
from pykbroker.server.broker import Broker, bind_metrics
from pykbroker.server.connection import KafkaConnection, RequestMemory
from pykbroker.server.dispatch import CLOSE_CONNECTION, NO_RESPONSE
from pykbroker.server.handlers._build import make
from test_connection import FakeTransport, api_versions_frame


def scrape(broker) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} of one scrape, parsed as Prometheus parses it."""
    text = generate_latest(broker_registry(broker)).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples, name, **labels) -> float:
    return samples[(name, frozenset(labels.items()))]


@pytest.fixture
def broker(tmp_path):
    config = BrokerConfig(data_dir=tmp_path, values={"metrics.port": 19999, "offsets.topic.num.partitions": 2})
    made = []

    async def build():
        broker = Broker(config)
        broker.load()
        made.append(broker)
        return broker

    loop = asyncio.new_event_loop()
    try:
        yield loop, loop.run_until_complete(build())
    finally:
        for broker in made:
            loop.run_until_complete(broker.stop())
        loop.close()


def test_metrics_off_by_default_and_on_with_a_port(tmp_path):
    assert bind_metrics(BrokerConfig(data_dir=tmp_path)) is None
    config = BrokerConfig(data_dir=tmp_path, values={"metrics.port": 19999})
    assert config.get("metrics.host") is None  # the broker's host


def test_state_at_scrape_time(broker):
    loop, broker = broker

    async def scenario():
        info = broker.topics.create("orders", 2)
        await broker.topics.host_async(info)
        batch = build_batch([(None, b"a" * 10), (None, b"b" * 10), (None, b"c" * 10)])
        outcome = broker.replicas.append("orders", 1, batch, acks=1, min_insync_replicas=1)
        assert outcome.error == ErrorCode.none
        broker._lead_offsets_topic_now()
        await asyncio.sleep(0.1)  # the coordinator loads the (empty) offsets partitions
        done = asyncio.get_running_loop().create_future()
        broker.offset_store.commit("billing", {("orders", 1): CommittedOffset(1, -1, "", 0)}, 0, done.set_result)
        assert await asyncio.wait_for(done, 10) == ErrorCode.none
        return len(batch)

    size = loop.run_until_complete(scenario())
    samples = scrape(broker)
    assert value(samples, "kafka_server_replicamanager_partitioncount") == 4  # 2 + __consumer_offsets' 2
    assert value(samples, "kafka_server_replicamanager_leadercount") == 4
    assert value(samples, "kafka_server_replicamanager_underreplicatedpartitions") == 0
    assert value(samples, "kafka_controller_kafkacontroller_activecontrollercount") == 1
    assert value(samples, "kafka_controller_kafkacontroller_globalpartitioncount") == 4
    assert value(samples, "kafka_log_log_logendoffset", topic="orders", partition="1") == 3
    assert value(samples, "kafka_log_log_logendoffset", topic="orders", partition="0") == 0
    assert value(samples, "kafka_log_log_logstartoffset", topic="orders", partition="1") == 0
    assert value(samples, "kafka_log_log_size", topic="orders", partition="1") == size
    assert value(samples, "kafka_consumergroup_current_offset", group="billing", topic="orders", partition="1") == 1
    assert value(samples, "kafka_consumergroup_lag", group="billing", topic="orders", partition="1") == 2
    assert value(samples, "kafka_server_delayedoperationpurgatory_purgatorysize", delayedOperation="Produce") == 0
    assert value(samples, "kafka_server_socketservermetrics_connection_count", listener="PLAINTEXT") == 0


def test_counters_become_families(broker):
    loop, broker = broker
    stats = broker.stats
    stats.produced("orders", 5, 500)
    stats.produced("orders", 2, 200)
    stats.fetched("orders", 300)
    stats.fetches_waiting = 2
    from kio.schema.produce.v9 import response as produce_v9
    answer = make(produce_v9.ProduceResponse, throttle_time=0, responses=(
        make(produce_v9.TopicProduceResponse, name="orders", partition_responses=(
            make(produce_v9.PartitionProduceResponse, index=0, error_code=ErrorCode.none, base_offset=0,
                 log_append_time=-1, log_start_offset=0, record_errors=(), error_message=None),
            make(produce_v9.PartitionProduceResponse, index=1, error_code=ErrorCode.not_leader_or_follower,
                 base_offset=-1, log_append_time=-1, log_start_offset=-1, record_errors=(), error_message=None),
        )),
    ))
    stats.request_done(0, 9, answer, stats.clock() - 0.003)
    stats.request_done(0, 9, None, stats.clock())  # acks=0: nothing answered, still a request
    samples = scrape(broker)
    assert value(samples, "kafka_server_brokertopicmetrics_messagesin_total", topic="orders") == 7
    assert value(samples, "kafka_server_brokertopicmetrics_bytesin_total", topic="orders") == 700
    assert value(samples, "kafka_server_brokertopicmetrics_bytesout_total", topic="orders") == 300
    assert value(samples, "kafka_server_delayedoperationpurgatory_purgatorysize", delayedOperation="Fetch") == 2
    assert value(samples, "kafka_network_requestmetrics_requests_total", request="Produce", version="9") == 2
    assert value(samples, "kafka_network_requestmetrics_errors_total", request="Produce", error="NONE") == 1
    assert value(samples, "kafka_network_requestmetrics_errors_total", request="Produce",
                 error="NOT_LEADER_OR_FOLLOWER") == 1
    assert value(samples, "kafka_network_requestmetrics_totaltime_seconds_count", request="Produce") == 2
    assert value(samples, "kafka_network_requestmetrics_totaltime_seconds_bucket", request="Produce", le="0.001") == 1
    assert value(samples, "kafka_network_requestmetrics_totaltime_seconds_bucket", request="Produce", le="+Inf") == 2
    assert 0.003 <= value(samples, "kafka_network_requestmetrics_totaltime_seconds_sum", request="Produce") < 1


def test_a_deleted_topics_counters_go(broker):
    loop, broker = broker
    broker.stats.produced("orders", 5, 500)
    broker.stats.fetched("orders", 300)
    broker.stats.produced("billing", 1, 10)
    broker.forget_topic("orders")  # what a deletion calls, single broker and cluster alike
    samples = scrape(broker)
    assert not [key for key in samples if ("topic", "orders") in key[1]]
    assert value(samples, "kafka_server_brokertopicmetrics_messagesin_total", topic="billing") == 1
    broker.stats.produced("orders", 1, 10)  # a topic created again under the name counts from zero
    assert value(scrape(broker), "kafka_server_brokertopicmetrics_messagesin_total", topic="orders") == 1


def test_error_counts_walk_nested_entities_only_where_error_codes_are():
    from kio.schema.metadata.v12 import response as metadata_v12
    topic = make(metadata_v12.MetadataResponseTopic, error_code=ErrorCode.unknown_topic_or_partition, name="x",
                 topic_id=None, is_internal=False, partitions=(), topic_authorized_operations=0)
    answer = make(metadata_v12.MetadataResponse, throttle_time=0, brokers=(), cluster_id=None, controller_id=1,
                  topics=(topic, topic))
    assert error_counts(answer) == {ErrorCode.unknown_topic_or_partition.value: 2}


def test_latency_buckets_are_cumulative():
    stats = BrokerStats(clock=lambda: 10.0)
    stats.request_done(3, 12, None, 10.0 - LATENCY_BUCKETS[0])  # exactly on the first bound: in it (le)
    stats.request_done(3, 12, None, 10.0 - 100)  # beyond the last bound: +Inf only
    buckets = stats.latency[3].cumulative()
    assert buckets[0] == (repr(LATENCY_BUCKETS[0]), 1)
    assert buckets[-2] == (repr(LATENCY_BUCKETS[-1]), 1)
    assert buckets[-1] == ("+Inf", 2)


def test_isr_changes_counted_when_committed(broker):
    loop, broker = broker

    async def scenario():
        info = broker.topics.create("replicated", 1)
        await broker.topics.host_async(info)

    loop.run_until_complete(scenario())
    partition = broker.replicas.partition("replicated", 0)
    before = scrape(broker)
    partition.isr_change_committed((1, 2, 3), 5, now_ms=0)  # 1 -> 3: an expansion
    partition.isr_change_committed((1, 3), 6, now_ms=0)  # a shrink
    partition.isr_change_committed((1, 2), 7, now_ms=0)  # same size: neither
    after = scrape(broker)
    for name, grown in (("kafka_server_replicamanager_isrexpands_total", 1),
                        ("kafka_server_replicamanager_isrshrinks_total", 1)):
        assert value(after, name) - value(before, name) == grown
    assert partition_module.ISR_SHRINKS[broker.broker_id] >= 1


def test_ready_reason_follows_the_broker(broker):
    loop, broker = broker
    assert ready_reason(broker).startswith("starting")
    broker.serving = True
    assert ready_reason(broker) is None
    broker.stopping = True
    assert ready_reason(broker) == "shutting down"


def test_the_connection_counts_requests_answered_later_and_not_at_all():
    """With stats, every request handled is counted once with its latency: answered at once, answered after
    an await (the await is in its time), answered with nothing (acks=0) or by closing the connection."""
    now = [100.0]
    broker = type("Broker", (), {"apis": SINGLE_NODE_APIS, "stats": BrokerStats(clock=lambda: now[0]),
                                 "admit": lambda self, c: None, "release": lambda self, c: None})()
    answer = ApiVersionsResponse(error_code=ErrorCode.unsupported_version, api_keys=())

    async def scenario():
        gate = asyncio.get_running_loop().create_future()

        def handler(ctx, body):
            correlation_id = ctx.request.correlation_id
            if correlation_id == 2:
                async def later():
                    await gate
                    return answer
                return later()
            return {3: NO_RESPONSE, 4: CLOSE_CONNECTION}.get(correlation_id, answer)

        connection = KafkaConnection(broker, {18: handler}, 1 << 20, RequestMemory(-1))
        transport = FakeTransport()
        transport.protocol = connection
        connection.connection_made(transport)
        connection.data_received(b"".join(api_versions_frame(i) for i in (1, 2, 3, 4)))
        now[0] += 0.2  # request 2 waits 200 ms
        gate.set_result(None)
        for _ in range(10):
            await asyncio.sleep(0)

    asyncio.run(scenario())
    stats = broker.stats
    assert stats.requests == {(18, 0): 4}
    assert stats.errors == {18: {ErrorCode.unsupported_version: 2}}  # two answers; none for 3 and 4
    histogram = stats.latency[18]
    assert sum(histogram.counts) == 4 and histogram.total == pytest.approx(0.2)
    assert histogram.counts[LATENCY_BUCKETS.index(0.25)] == 1  # the 200 ms one


def test_metrics_port_from_flag_env_and_file(tmp_path):
    assert load_config(cli={"data_dir": str(tmp_path)}, env={}).get("metrics.port") == 0
    assert load_config(cli={"data_dir": str(tmp_path)}, env={"PYKBROKER_METRICS_PORT": "9404"}).get("metrics.port") == 9404
    file = tmp_path / "broker.properties"
    file.write_text("metrics.port=9405\nmetrics.host=0.0.0.0\n")
    config = load_config(cli={"data_dir": str(tmp_path)}, env={}, file=file)
    assert (config.get("metrics.port"), config.get("metrics.host")) == (9405, "0.0.0.0")
    assert build_config({"data_dir": tmp_path, "metrics.port": 9406}).get("metrics.port") == 9406
    with pytest.raises(ConfigError, match="metrics.port"):
        load_config(cli={"data_dir": str(tmp_path), "metrics.port": 70000}, env={})
    assert "--metrics-port" in CliRunner().invoke(main, ["serve", "--help"]).output

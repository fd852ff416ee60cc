"""The scrape: a prometheus_client Collector that reads the broker's state and counters when /metrics is
asked, so that nothing Prometheus-shaped runs on the produce/fetch path.

Every value is computed here, on the broker's event loop (the HTTP server runs there too), from:
* ``broker.stats`` (pykbroker/metrics/stats.py): plain counters the request path adds to;
* the hosted partitions (``broker.replicas``), the metadata, the group offsets, the purgatories, the
  connections, the controller: read as they are at the moment of the scrape;
* the process (``process_*``, prometheus_client's ProcessCollector: CPU seconds, resident and virtual memory,
  open and maximum file descriptors, start time, read from /proc/self at each scrape; Linux only, absent
  elsewhere) and what runs (``pykbroker_build_info``: version, Python version, whether the C record walker
  pykbroker._speedups.scan_records is in use).
The metric names are listed in pykbroker/metrics/__init__.py and docs/metrics.md.
"""

from __future__ import annotations

import platform
import time
from typing import TYPE_CHECKING, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from pykbroker import __version__
from pykbroker.protocol.apis import SUPPORTED_APIS
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.records import ACCELERATED
from pykbroker.replication import partition as partition_module

if TYPE_CHECKING:
    from pykbroker.server.broker import Broker

NO_LEADER = -1


def api_name(api_key: int) -> str:
    """Kafka's request name (the ``request`` label of kafka.network:type=RequestMetrics)."""
    api = SUPPORTED_APIS.get(api_key)
    return api.name if api is not None else str(api_key)


def error_name(code: int) -> str:
    """Kafka's Errors name, upper case (the ``error`` label)."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return str(code)


class BrokerCollector(Collector):
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        yield build_info()
        yield from self._requests()
        yield from self._topics()
        yield from self._replicas()
        yield from self._controller()
        yield from self._logs()
        yield from self._groups()
        yield from self._network()
        yield from self._quotas()

    # -- per-request counters ---------------------------------------------------------------------
    def _requests(self) -> Iterator[Metric]:
        stats = self.broker.stats
        requests = CounterMetricFamily("kafka_network_requestmetrics_requests", "Requests answered, per API and version.",
                                       labels=["request", "version"])
        errors = CounterMetricFamily("kafka_network_requestmetrics_errors",
                                     "Error codes in responses, per API and error (NONE included, as Kafka counts them).",
                                     labels=["request", "error"])
        latency = HistogramMetricFamily("kafka_network_requestmetrics_totaltime_seconds",
                                        "Time from a request's decoding to its response being handed to the socket.",
                                        labels=["request"])
        if stats is not None:
            for (key, version), count in sorted(stats.requests.items()):
                requests.add_metric([api_name(key), str(version)], count)
            for key, counts in sorted(stats.errors.items()):
                for code, count in sorted(counts.items()):
                    errors.add_metric([api_name(key), error_name(code)], count)
            for key, histogram in sorted(stats.latency.items()):
                latency.add_metric([api_name(key)], histogram.cumulative(), histogram.total)
        yield requests
        yield errors
        yield latency

    def _topics(self) -> Iterator[Metric]:
        stats = self.broker.stats
        families = [
            (CounterMetricFamily("kafka_server_brokertopicmetrics_messagesin", "Records appended by producers, per topic.",
                                 labels=["topic"]), stats.messages_in if stats else {}),
            (CounterMetricFamily("kafka_server_brokertopicmetrics_bytesin", "Record bytes appended by producers, per topic.",
                                 labels=["topic"]), stats.bytes_in if stats else {}),
            (CounterMetricFamily("kafka_server_brokertopicmetrics_bytesout", "Record bytes sent to consumers, per topic.",
                                 labels=["topic"]), stats.bytes_out if stats else {}),
        ]
        for family, values in families:
            for topic, value in sorted(values.items()):
                family.add_metric([topic], value)
            yield family
        yield CounterMetricFamily("kafka_server_brokertopicmetrics_replicationbytesout",
                                  "Record bytes sent to follower replicas.", value=stats.replication_bytes_out if stats else 0)

    # -- replicas ---------------------------------------------------------------------------------
    def _replicas(self) -> Iterator[Metric]:
        broker = self.broker
        partitions = leaders = under = under_min = 0
        min_isr: dict[str, int] = {}  # per topic, looked up once per scrape
        for partition in broker.replicas.partitions():
            partitions += 1
            if partition.is_leader:
                leaders += 1
                isr = len(partition.isr)
                if isr < len(partition.replicas):
                    under += 1
                topic_min = min_isr.get(partition.topic)
                if topic_min is None:
                    topic_min = min_isr[partition.topic] = broker.topics.min_insync_replicas(partition.topic)
                if isr < topic_min:
                    under_min += 1
        yield GaugeMetricFamily("kafka_server_replicamanager_partitioncount", "Partitions hosted here (led or followed).",
                                value=partitions)
        yield GaugeMetricFamily("kafka_server_replicamanager_leadercount", "Partitions this broker leads.", value=leaders)
        yield GaugeMetricFamily("kafka_server_replicamanager_underreplicatedpartitions",
                                "Partitions led here whose ISR is smaller than their replica set.", value=under)
        yield GaugeMetricFamily("kafka_server_replicamanager_underminisrpartitioncount",
                                "Partitions led here whose ISR is smaller than min.insync.replicas.", value=under_min)
        yield GaugeMetricFamily("kafka_server_replicamanager_offlinereplicacount",
                                "Replicas here that cannot be served because their log directory fails.",
                                value=partitions if broker.replicas.storage_errors.any_failing else 0)
        yield CounterMetricFamily("kafka_server_replicamanager_isrshrinks", "ISR shrinks of partitions led here.",
                                  value=partition_module.ISR_SHRINKS[broker.broker_id])
        yield CounterMetricFamily("kafka_server_replicamanager_isrexpands", "ISR expansions of partitions led here.",
                                  value=partition_module.ISR_EXPANDS[broker.broker_id])
        purgatory = GaugeMetricFamily("kafka_server_delayedoperationpurgatory_purgatorysize",
                                      "Requests waiting: acks=all produces for the ISR, fetches for data (long polls).",
                                      labels=["delayedOperation"])
        purgatory.add_metric(["Produce"], len(broker.replicas.purgatory))
        purgatory.add_metric(["Fetch"], broker.stats.fetches_waiting if broker.stats else 0)
        yield purgatory

    # -- controller -------------------------------------------------------------------------------
    def _controller(self) -> Iterator[Metric]:
        broker = self.broker
        # A single broker is its own controller; in a cluster the one that holds /controller is.
        active = broker.cluster is None or broker.cluster.controller.active
        topics = partitions = offline = 0
        if active:
            for info in broker.metadata.topics():
                topics += 1
                partitions += len(info.partitions)
                offline += sum(1 for p in info.partitions if p.leader == NO_LEADER)
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_activecontrollercount",
                                "1 on the active controller, 0 elsewhere.", value=1 if active else 0)
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_offlinepartitionscount",
                                "Partitions without a leader (reported by the active controller).", value=offline)
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_globaltopiccount",
                                "Topics in the cluster (reported by the active controller).", value=topics)
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_globalpartitioncount",
                                "Partitions in the cluster (reported by the active controller).", value=partitions)

    # -- logs -------------------------------------------------------------------------------------
    def _logs(self) -> Iterator[Metric]:
        size = GaugeMetricFamily("kafka_log_log_size", "Bytes of a partition's log segments.", labels=["topic", "partition"])
        end = GaugeMetricFamily("kafka_log_log_logendoffset", "A partition's log end offset.", labels=["topic", "partition"])
        start = GaugeMetricFamily("kafka_log_log_logstartoffset", "A partition's log start offset.",
                                  labels=["topic", "partition"])
        hwm = GaugeMetricFamily("kafka_cluster_partition_highwatermark", "A partition's high-water mark.",
                                labels=["topic", "partition"])
        for partition in sorted(self.broker.replicas.partitions(), key=lambda p: (p.topic, p.index)):
            labels = [partition.topic, str(partition.index)]
            log = partition.log
            size.add_metric(labels, log.size_bytes)
            end.add_metric(labels, log.log_end_offset)
            start.add_metric(labels, log.log_start_offset)
            hwm.add_metric(labels, partition.high_watermark)
        yield size
        yield end
        yield start
        yield hwm

    # -- consumer groups --------------------------------------------------------------------------
    def _groups(self) -> Iterator[Metric]:
        """Committed offsets and lag of the groups this broker coordinates (whose offsets it holds), for the
        partitions it hosts (the log end a consumer can reach is the high-water mark)."""
        broker = self.broker
        store = broker.offset_store
        offset = GaugeMetricFamily("kafka_consumergroup_current_offset", "A group's committed offset.",
                                   labels=["group", "topic", "partition"])
        lag = GaugeMetricFamily("kafka_consumergroup_lag", "High-water mark minus the group's committed offset.",
                                labels=["group", "topic", "partition"])
        for group in store.groups():
            for (topic, index), committed in sorted(store.fetch(group).items()):
                labels = [group, topic, str(index)]
                offset.add_metric(labels, committed.offset)
                partition = broker.replicas.partition(topic, index)
                if partition is not None and committed.offset >= 0:
                    lag.add_metric(labels, max(partition.high_watermark - committed.offset, 0))
        yield offset
        yield lag
        yield from group_count_metrics(broker.groups.list_groups()[1])

    # -- network ----------------------------------------------------------------------------------
    def _network(self) -> Iterator[Metric]:
        counts: dict[str, int] = {}
        for connection in self.broker.connections:
            counts[connection.listener] = counts.get(connection.listener, 0) + 1
        family = GaugeMetricFamily("kafka_server_socketservermetrics_connection_count", "Open client connections.",
                                   labels=["listener"])
        for listener in sorted({*counts, *(listener.name for listener in self.broker.config.listeners)}):
            family.add_metric([listener], counts.get(listener, 0))
        yield family
        stats = self.broker.stats
        for outcome, text in (("successful", "SASL authentications that succeeded"),
                              ("reauthentication", "SASL re-authentications (KIP-368) that succeeded"),
                              ("failed", "SASL authentications that failed (wrong password, unknown user or mechanism)")):
            name = "successful_reauthentication" if outcome == "reauthentication" else f"{outcome}_authentication"
            family = CounterMetricFamily(f"kafka_server_socketservermetrics_{name}", f"{text}.",
                                         labels=["listener", "mechanism"])
            for (listener, mechanism, counted), value in sorted(stats.authentications.items()):
                if counted == outcome:
                    family.add_metric([listener, mechanism], value)
            yield family


    # -- client quotas ----------------------------------------------------------------------------
    def _quotas(self) -> Iterator[Metric]:
        yield from quota_metrics(self.broker.quotas, int(time.time() * 1000))


# Kafka 4's group coordinator counts: group-coordinator-metrics (group-count by protocol, consumer-group-count by
# state) and the classic groups' GroupMetadataManager gauges (NumGroups, NumGroups<State>).
CLASSIC, CONSUMER = "classic", "consumer"  # Kafka's group types (the ListGroups v5 names)
CONSUMER_GROUP_STATES = ("Empty", "Assigning", "Reconciling", "Stable", "Dead")
CLASSIC_GROUP_STATES = ("PreparingRebalance", "CompletingRebalance", "Stable", "Dead", "Empty")


def group_count_metrics(groups) -> Iterator[Metric]:
    """The counts of ``groups`` (ListGroups overviews of both kinds) by type and state."""
    by_type: dict[str, int] = {}
    by_state: dict[tuple[str, str], int] = {}
    for group in groups:
        by_type[group.group_type] = by_type.get(group.group_type, 0) + 1
        by_state[(group.group_type, group.state)] = by_state.get((group.group_type, group.state), 0) + 1
    prefix = "kafka_server_group_coordinator_metrics"
    family = GaugeMetricFamily(f"{prefix}_group_count", "Groups coordinated here, by protocol (group type).",
                               labels=["protocol"])
    for kind in (CLASSIC, CONSUMER):
        family.add_metric([kind], by_type.get(kind, 0))
    yield family
    family = GaugeMetricFamily(f"{prefix}_consumer_group_count", "Consumer groups coordinated here, by state.",
                               labels=["state"])
    for state in CONSUMER_GROUP_STATES:
        family.add_metric([state], by_state.get((CONSUMER, state), 0))
    yield family
    yield GaugeMetricFamily("kafka_coordinator_group_groupmetadatamanager_numgroups",
                            "Classic groups coordinated here.", value=by_type.get(CLASSIC, 0))
    for state in CLASSIC_GROUP_STATES:
        yield GaugeMetricFamily(f"kafka_coordinator_group_groupmetadatamanager_numgroups{state.lower()}",
                                f"Classic groups coordinated here in state {state}.",
                                value=by_state.get((CLASSIC, state), 0))


# Kafka's quota sensor groups (kafka.server:type=<group>,user=,client-id=) and the name of each one's measured value.
QUOTA_GROUPS = (("Produce", "byte_rate", "Bytes per second produced (the producer_byte_rate quota's measure)."),
                ("Fetch", "byte_rate", "Bytes per second fetched by consumers (the consumer_byte_rate quota's measure)."),
                ("Request", "request_time",
                 "Handler time as a percentage of one thread (the request_percentage quota's measure)."),
                ("ControllerMutation", "mutation_rate",
                 "Partitions created or deleted per second (the controller_mutation_rate quota's measure)."))
MAX_QUOTA_SERIES = 100  # per quota type: the clients throttled most (then the busiest); the others are counted


def quota_metrics(quotas, now_ms: int) -> Iterator[Metric]:
    """The client quota sensors (security/quotas.py), Kafka's per user / client-id quota metrics: the measured
    rate, the quota that applies, and the throttles so far. Sensors exist only while quotas are configured and
    for clients seen in the last hour; at most MAX_QUOTA_SERIES per type are exported."""
    by_type: dict[str, list] = {group: [] for group, _, _ in QUOTA_GROUPS}
    for sensor in quotas.sensors(now_ms):
        by_type.setdefault(sensor.quota_type, []).append(sensor)
    labels = ["user", "client_id"]
    omitted = GaugeMetricFamily("pykbroker_quota_sensors_omitted",
                                f"Client quota sensors not exported (over {MAX_QUOTA_SERIES} per quota type).",
                                labels=["quota_type"])
    for group, measure, text in QUOTA_GROUPS:
        prefix = f"kafka_server_{group.lower()}"
        rate = GaugeMetricFamily(f"{prefix}_{measure}", text, labels=labels)
        bound = GaugeMetricFamily(f"{prefix}_quota_limit", f"The {group} quota that applies (none: no series).",
                                  labels=labels)
        throttle_ms = CounterMetricFamily(f"{prefix}_throttle_time_ms",
                                          f"Milliseconds of {group} quota throttling given to the client.", labels=labels)
        throttles = CounterMetricFamily(f"{prefix}_throttles", f"Responses throttled by the {group} quota.",
                                        labels=labels)
        sensors = sorted(by_type.get(group, ()), key=lambda s: (-s.throttle_total_ms, -s.rate, s.user, s.client_id))
        for sensor in sensors[:MAX_QUOTA_SERIES]:
            values = [sensor.user, sensor.client_id]
            rate.add_metric(values, sensor.rate)
            if sensor.bound < 9.2e18:  # Kafka's Long.MAX_VALUE bound: no quota
                bound.add_metric(values, sensor.bound)
            throttle_ms.add_metric(values, sensor.throttle_total_ms)
            throttles.add_metric(values, sensor.throttle_count)
        omitted.add_metric([group], max(0, len(sensors) - MAX_QUOTA_SERIES))
        yield from (rate, bound, throttle_ms, throttles)
    yield omitted
    yield GaugeMetricFamily("kafka_server_request_exempt_request_time",
                            "Handler time of requests exempt from quotas (inter-broker), as a percentage of one thread.",
                            value=quotas.exempt.measure(now_ms))


def build_info() -> Metric:
    """pykbroker_build_info{version,python_version,speedups} 1, as services' *_build_info gauges are."""
    family = GaugeMetricFamily("pykbroker_build_info",
                               "pykbroker's version, the Python version and whether the C record walker "
                               "(pykbroker._speedups.scan_records) is in use; the value is always 1.",
                               labels=["version", "python_version", "speedups"])
    family.add_metric([__version__, platform.python_version(), "true" if ACCELERATED else "false"], 1)
    return family


def broker_registry(broker: "Broker") -> CollectorRegistry:
    """A registry of its own (never prometheus_client's global one) holding the broker's collector and the
    process's (the standard process_* series of Prometheus client libraries)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker))
    ProcessCollector(registry=registry)
    return registry

"""Prometheus metrics and health/readiness endpoints of the broker (``metrics.port``, ``--metrics-port``).

Off by default. When on, the broker serves plain HTTP (no TLS, no authentication: bound where ``metrics.host``
says) on its own event loop (pykbroker/metrics/http.py):
``GET /metrics`` (Prometheus text format), ``GET /health`` (liveness) and ``GET /ready`` (readiness, 503 with
the reason until the broker accepts clients; in a cluster until it is registered and has the controller's
metadata). Names follow Kafka's JMX metrics as the Prometheus JMX exporter's usual Kafka rules name them
(``kafka_<domain>_<type>_<name>``, counters with ``_total``):

Per request (counted in the broker, pykbroker/metrics/stats.py):
  kafka_network_requestmetrics_requests_total{request,version}    requests answered
  kafka_network_requestmetrics_errors_total{request,error}        error codes in responses (NONE too, as Kafka)
  kafka_network_requestmetrics_totaltime_seconds{request}         latency histogram (decode to response queued)
  kafka_server_brokertopicmetrics_messagesin_total{topic}         records appended by producers
  kafka_server_brokertopicmetrics_bytesin_total{topic}            record bytes appended by producers
  kafka_server_brokertopicmetrics_bytesout_total{topic}           record bytes sent to consumers
  kafka_server_brokertopicmetrics_replicationbytesout_total       record bytes sent to followers
  kafka_server_replicamanager_isrshrinks_total                    committed ISR shrinks (partitions led here)
  kafka_server_replicamanager_isrexpands_total                    committed ISR expansions
  kafka_server_socketservermetrics_successful_authentication_total{listener,mechanism}
  kafka_server_socketservermetrics_successful_reauthentication_total{listener,mechanism}
  kafka_server_socketservermetrics_failed_authentication_total{listener,mechanism}
                                                                  SASL exchanges (Kafka's selector metrics)

From the broker's state at scrape time (pykbroker/metrics/collector.py):
  kafka_server_replicamanager_partitioncount                      partitions hosted (led or followed)
  kafka_server_replicamanager_leadercount                         partitions led
  kafka_server_replicamanager_underreplicatedpartitions           led, ISR smaller than the replicas
  kafka_server_replicamanager_underminisrpartitioncount           led, ISR smaller than min.insync.replicas
  kafka_server_replicamanager_offlinereplicacount                 replicas on a failing log directory
  kafka_server_delayedoperationpurgatory_purgatorysize{delayedOperation="Produce"|"Fetch"}
                                                                  acks=all produces / long-poll fetches waiting
  kafka_controller_kafkacontroller_activecontrollercount          1 on the active controller (a single broker: 1)
  kafka_controller_kafkacontroller_offlinepartitionscount         partitions without leader (active controller)
  kafka_controller_kafkacontroller_globaltopiccount               topics (active controller)
  kafka_controller_kafkacontroller_globalpartitioncount           partitions (active controller)
  kafka_log_log_size{topic,partition}                             bytes of the partition's segments
  kafka_log_log_logendoffset{topic,partition}                     log end offset
  kafka_log_log_logstartoffset{topic,partition}                   log start offset
  kafka_cluster_partition_highwatermark{topic,partition}          high-water mark
  kafka_consumergroup_current_offset{group,topic,partition}       committed offset (groups coordinated here)
  kafka_consumergroup_lag{group,topic,partition}                  high-water mark - committed offset (partitions
                                                                  hosted here)
  kafka_server_group_coordinator_metrics_group_count{protocol}   groups coordinated here, "classic" / "consumer"
  kafka_server_group_coordinator_metrics_consumer_group_count{state}
                                                                  consumer groups by state (Empty, Assigning,
                                                                  Reconciling, Stable, Dead), Kafka 4's names
  kafka_coordinator_group_groupmetadatamanager_numgroups[preparingrebalance|completingrebalance|stable|dead|empty]
                                                                  classic groups, in all and by state
  kafka_server_socketservermetrics_connection_count{listener}     open client connections
  kafka_server_{produce,fetch}_byte_rate{user,client_id}          client quota sensors (once a quota is set): the
  kafka_server_request_request_time{user,client_id}               measured rate, the quota that applies
  kafka_server_controllermutation_mutation_rate{user,client_id}   (..._quota_limit) and the throttles given
  kafka_server_<type>_quota_limit / _throttle_time_ms_total / _throttles_total{user,client_id}
                                                                  (at most 100 series per type, see docs/metrics.md)

The process and the build, also at scrape time (the standard names of Prometheus client libraries):
  process_cpu_seconds_total                                       user + system CPU time of the broker process
  process_resident_memory_bytes, process_virtual_memory_bytes     its memory (from /proc/self/stat)
  process_open_fds, process_max_fds                               open file descriptors and their limit
  process_start_time_seconds                                      when the process started (Unix time)
  pykbroker_build_info{version,python_version,speedups}           always 1; speedups "true" when the C record
                                                                  walker (pykbroker._speedups.scan_records) is in use
The process_* series are Linux's (/proc/self); elsewhere they are absent.
"""

# Nothing is imported here: the broker imports prometheus_client (collector, http) only when metrics are on.

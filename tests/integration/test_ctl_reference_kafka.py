"""The `pykbroker` client commands' tests (test_ctl.py) against a real Apache Kafka 3.7.1 (KRaft, one node,
from ../shared/refkit): the CLI is a client for any Kafka cluster, and what it prints and does is the same
there. Skips with the reason where the kit or a Java runtime is absent.

Run: python3 -m pytest -q tests/integration/test_ctl_reference_kafka.py
"""

from __future__ import annotations

import pytest

from reference_kafka import ReferenceKafka
from test_ctl import (  # collected here again, against Kafka
    test_cluster_info_single_broker,
    test_consume_formats_positions_and_limits,
    test_consume_in_a_group_commits_what_it_printed,
    test_group_delete_and_not_found,
    test_group_list_and_describe_with_lag_while_a_member_is_active,
    test_group_seek_modes_then_a_stock_consumer_starts_there,
    test_produce_keys_headers_compression_read_back_by_kafka_python,
    test_topic_alter_config_is_seen_by_describe_configs,
    test_topic_create_invalid_config_is_a_kafka_error,
    test_topic_create_with_configs_is_what_describe_configs_reports,
    test_topic_delete_and_not_found,
    test_topic_describe_shows_partitions_offsets_and_configs,
    test_topic_list_table_and_json,
    test_unknown_topic_is_exit_3_and_is_not_created,
)

__all__ = [
    "test_cluster_info_single_broker",
    "test_consume_formats_positions_and_limits",
    "test_consume_in_a_group_commits_what_it_printed",
    "test_group_delete_and_not_found",
    "test_group_list_and_describe_with_lag_while_a_member_is_active",
    "test_group_seek_modes_then_a_stock_consumer_starts_there",
    "test_produce_keys_headers_compression_read_back_by_kafka_python",
    "test_topic_alter_config_is_seen_by_describe_configs",
    "test_topic_create_invalid_config_is_a_kafka_error",
    "test_topic_create_with_configs_is_what_describe_configs_reports",
    "test_topic_delete_and_not_found",
    "test_topic_describe_shows_partitions_offsets_and_configs",
    "test_topic_list_table_and_json",
    "test_unknown_topic_is_exit_3_and_is_not_created",
]

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory):
    """Kafka in place of the module's shared pykbroker."""
    with ReferenceKafka(tmp_path_factory.mktemp("reference-kafka")) as kafka:
        yield kafka

"""The consumer-group scenarios of the issue (test_groups_common) with every client: confluent-kafka
(librdkafka), kafka-python, aiokafka and KafkaJS, each against a fresh broker.

Per client: two members split a 4-partition topic and the one left after a leave gets everything; a member
that dies is evicted at its session timeout and the other gets everything; committed offsets are resumed by
a new member after a broker kill -9; a second group reads everything independently (and the client's admin
API sees the groups); members joining at the same moment and during a rebalance end with one owner per
partition and never see a committed offset go back (the coordinator fences members of an old generation)."""

from __future__ import annotations

import pytest

import test_groups_common as scenarios
from test_groups_aiokafka import AIOKAFKA
from test_groups_common import BROKER_CONFIG, SLOW_FIRST_REBALANCE
from test_groups_confluent import CONFLUENT
from test_groups_kafka_python import KAFKA_PYTHON
from test_groups_kafkajs import KAFKAJS, NEEDS_KAFKAJS

pytestmark = pytest.mark.timeout(120)

CLIENTS = [
    pytest.param(CONFLUENT, id="confluent"),
    pytest.param(KAFKA_PYTHON, id="kafka-python"),
    pytest.param(AIOKAFKA, id="aiokafka"),
    pytest.param(KAFKAJS, id="kafkajs", marks=NEEDS_KAFKAJS),
]


@pytest.fixture(params=CLIENTS)
def client(request) -> scenarios.GroupClient:
    return request.param


@pytest.fixture
def group_broker(broker_factory):
    return broker_factory.make(config=BROKER_CONFIG)


def test_two_members_split_the_topic_and_the_one_left_after_a_leave_gets_everything(client, group_broker,
                                                                                     topic_name):
    scenarios.split_then_leave(client, group_broker, topic_name)


def test_a_member_that_dies_is_evicted_at_its_session_timeout_and_the_other_gets_everything(client, group_broker,
                                                                                              topic_name):
    scenarios.member_dies(client, group_broker, topic_name)


def test_committed_offsets_are_resumed_by_a_new_member_after_a_broker_kill9(client, group_broker, topic_name):
    scenarios.offsets_resumed_after_broker_kill(client, group_broker, topic_name)


def test_a_second_group_reads_everything_independently(client, group_broker, topic_name):
    scenarios.second_group_reads_everything(client, group_broker, topic_name)


def test_simultaneous_joins_and_joins_during_a_rebalance_keep_one_owner_per_partition(client, broker_factory,
                                                                                       topic_name):
    scenarios.joins_during_a_rebalance(client, broker_factory.make(config=SLOW_FIRST_REBALANCE), topic_name)

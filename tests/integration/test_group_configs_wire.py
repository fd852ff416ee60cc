"""The GROUP config resource (type 32, Kafka 4's per-group configs, groups/configs.py) on one broker: the
confluent-kafka 2.16 admin client (ResourceType.GROUP) describes and changes a group's
consumer.session.timeout.ms / consumer.heartbeat.interval.ms, raw AlterConfigs / IncrementalAlterConfigs /
DescribeConfigs show Kafka's errors for bad input, the overrides survive a restart, and the group's coordinator
uses them for the group's heartbeat interval and session timeout. (The Java admin client 3.9 has no
ConfigResource.Type.GROUP and Kafka 3.7.1's kafka-configs.sh no ``--entity-type groups``: they cannot reach this
resource.)"""

from __future__ import annotations

import datetime
import time
import uuid

import pytest
from confluent_kafka.admin import (
    AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, ResourceType,
)
from kio.schema.alter_configs.v2 import request as alter_v2
from kio.schema.consumer_group_heartbeat.v1 import request as heartbeat_v1
from kio.schema.describe_configs.v4 import request as describe_v4
from kio.schema.incremental_alter_configs.v1 import request as incremental_v1
from kio.schema.list_groups.v5 import request as list_v5

from broker_process import BrokerProcess, send_request, wait_until
from test_confluent_kafka import create_topic

from pykbroker.protocol.errors import ErrorCode

GROUP = 32
SESSION, HEARTBEAT = "consumer.session.timeout.ms", "consumer.heartbeat.interval.ms"
BOUNDS = {"group.consumer.min.heartbeat.interval.ms": 1000, "group.consumer.max.heartbeat.interval.ms": 20000,
          "group.consumer.min.session.timeout.ms": 10000, "group.consumer.max.session.timeout.ms": 90000}


@pytest.fixture
def group_broker(tmp_path):
    with BrokerProcess(tmp_path / "broker", config=BOUNDS) as broker:
        yield broker


def _describe(address, group, synonyms=False, keys=None):
    (result,) = send_request(address, describe_v4.DescribeConfigsRequest(resources=(
        describe_v4.DescribeConfigsResource(resource_type=GROUP, resource_name=group, configuration_keys=keys),),
        include_synonyms=synonyms, include_documentation=False)).results
    return result


def _incremental(address, group, *ops, validate_only=False):
    (answer,) = send_request(address, incremental_v1.IncrementalAlterConfigsRequest(resources=(
        incremental_v1.AlterConfigsResource(resource_type=GROUP, resource_name=group, configs=tuple(
            incremental_v1.AlterableConfig(name=name, config_operation=op, value=value) for name, op, value in ops)),),
        validate_only=validate_only)).responses
    return answer.error_code, answer.error_message


def test_group_configs_admin_client_wire_and_restart(group_broker):
    address = group_broker.address
    group = f"cfg-{uuid.uuid4().hex[:8]}"

    # Defaults: the broker's group.consumer.* values, DEFAULT_CONFIG, whether the group exists or not.
    result = _describe(address, group, synonyms=True)
    assert result.error_code == ErrorCode.none
    shown = {c.name: (c.value, c.config_source, c.read_only, c.config_type) for c in result.configs}
    assert shown == {SESSION: ("45000", 5, False, 3), HEARTBEAT: ("5000", 5, False, 3)}
    assert [(s.name, s.source) for c in result.configs for s in c.synonyms if c.name == SESSION] == [(SESSION, 5)]
    assert [c.name for c in _describe(address, group, keys=(HEARTBEAT,)).configs] == [HEARTBEAT]

    # The confluent-kafka admin client: ResourceType.GROUP is the GROUP config resource.
    admin = AdminClient({"bootstrap.servers": group_broker.bootstrap})
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(SESSION, "20000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry(HEARTBEAT, "2000", incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource], request_timeout=30).values():
        future.result(timeout=30)
    described = admin.describe_configs([ConfigResource(ResourceType.GROUP, group)], request_timeout=30)
    (entries,) = [future.result(timeout=30) for future in described.values()]
    assert {name: (e.value, e.source) for name, e in entries.items()} == {
        SESSION: ("20000", ConfigSource.GROUP_CONFIG.value), HEARTBEAT: ("2000", ConfigSource.GROUP_CONFIG.value)}

    # Bad input: Kafka 4's errors and words (GroupConfig.validate, ControllerConfigurationValidator).
    refused = [
        ((HEARTBEAT, 0, "500"),
         f"{HEARTBEAT} must be greater than or equal to group.consumer.min.heartbeat.interval.ms"),
        ((HEARTBEAT, 0, "25000"),
         f"{HEARTBEAT} must be less than or equal to group.consumer.max.heartbeat.interval.ms"),
        ((SESSION, 0, "9000"), f"{SESSION} must be greater than or equal to group.consumer.min.session.timeout.ms"),
        ((SESSION, 0, "95000"), f"{SESSION} must be less than or equal to group.consumer.max.session.timeout.ms"),
        ((HEARTBEAT, 0, "20000"), f"{SESSION} must be greater than {HEARTBEAT}"),
        ((SESSION, 0, "abc"), f"Invalid value abc for configuration {SESSION}: Not a number of type INT"),
        ((SESSION, 0, "0"), f"Invalid value 0 for configuration {SESSION}: Value must be at least 1"),
        (("share.session.timeout.ms", 0, "20000"), "Unknown group config name: share.session.timeout.ms"),
        ((SESSION, 2, "1"), f"Config value append is not allowed for config key: {SESSION}"),
    ]
    for op, message in refused:
        assert _incremental(address, group, op) == (ErrorCode.invalid_config, message), op
    assert _incremental(address, "", (SESSION, 0, "20000")) == (
        ErrorCode.invalid_request, "Default group resources are not allowed.")
    assert _incremental(address, group, (SESSION, 0, "30000"), validate_only=True) == (ErrorCode.none, None)
    empty = _describe(address, "")
    assert (empty.error_code, empty.error_message) == (ErrorCode.invalid_request, "Group name must not be empty")
    # Nothing of that changed the group's configs.
    assert {c.name: c.value for c in _describe(address, group).configs} == {SESSION: "20000", HEARTBEAT: "2000"}

    # DELETE goes back to the default.
    assert _incremental(address, group, (SESSION, 1, None)) == (ErrorCode.none, None)
    assert {c.name: (c.value, c.config_source) for c in _describe(address, group).configs} == {
        SESSION: ("45000", 5), HEARTBEAT: ("2000", 8)}
    # AlterConfigs (Kafka 4 takes GROUP resources there too) sets another group's whole set.
    other = f"{group}-other"
    (answer,) = send_request(address, alter_v2.AlterConfigsRequest(resources=(
        alter_v2.AlterConfigsResource(resource_type=GROUP, resource_name=other, configs=(
            alter_v2.AlterableConfig(name=HEARTBEAT, value="3000"),)),), validate_only=False)).responses
    assert answer.error_code == ErrorCode.none

    # The overrides are stored: a restart keeps them.
    group_broker.stop()
    group_broker.start()
    assert {c.name: (c.value, c.config_source) for c in _describe(address, group).configs} == {
        SESSION: ("45000", 5), HEARTBEAT: ("2000", 8)}
    assert {c.name: c.value for c in _describe(address, other).configs}[HEARTBEAT] == "3000"


def test_a_groups_configs_set_its_heartbeat_interval_and_session_timeout(group_broker, topic_name):
    """The group's coordinator uses the group's own values (Kafka's consumerGroupHeartbeatIntervalMs /
    consumerGroupSessionTimeoutMs); another group keeps the broker's."""
    address = group_broker.address
    group, other = f"hb-{uuid.uuid4().hex[:8]}", f"hb-other-{uuid.uuid4().hex[:8]}"
    assert _incremental(address, group, (SESSION, 0, "10000"), (HEARTBEAT, 0, "1500")) == (ErrorCode.none, None)
    create_topic(group_broker.bootstrap, topic_name, 1)

    def join(group_id):
        answer = send_request(address, heartbeat_v1.ConsumerGroupHeartbeatRequest(
            group_id=group_id, member_id="m1", member_epoch=0, rebalance_timeout=datetime.timedelta(seconds=30),
            subscribed_topic_names=(topic_name,), topic_partitions=()))
        assert answer.error_code == ErrorCode.none
        return answer

    assert join(group).heartbeat_interval == datetime.timedelta(milliseconds=1500)
    assert join(other).heartbeat_interval == datetime.timedelta(milliseconds=5000)
    started = time.monotonic()

    def states():
        return {g.group_id: g.group_state for g in send_request(address, list_v5.ListGroupsRequest(
            states_filter=(), types_filter=("consumer",))).groups}

    # No more heartbeats: the member of the group goes after its 10 s session, long before the broker's 45 s.
    wait_until(lambda: states().get(group) == "Empty", "the member's 10 s session expires", 40)
    assert 9 <= time.monotonic() - started < 40
    assert states()[other] != "Empty"


def test_validation_fills_in_the_brokers_values_and_legacy_nulls_are_invalid_request(tmp_path):
    """Kafka 4's GroupConfigManager.validate fills a config the group does not set with the broker's
    group.consumer.* value (not GroupConfig's own 45000 / 5000); AlterConfigs with a null value is INVALID_REQUEST,
    as Kafka 4's broker answers it."""
    config = {"group.consumer.max.session.timeout.ms": 30000, "group.consumer.session.timeout.ms": 20000,
              "group.consumer.min.session.timeout.ms": 10000, "group.consumer.max.heartbeat.interval.ms": 25000}
    with BrokerProcess(tmp_path / "broker", config=config) as broker:
        group = f"cfg-{uuid.uuid4().hex[:8]}"
        # 6000 < the broker's 20000 session timeout (not above GroupConfig's 45000, beyond the 30000 maximum)
        assert _incremental(broker.address, group, (HEARTBEAT, 0, "6000")) == (ErrorCode.none, None)
        assert {c.name: (c.value, c.config_source) for c in _describe(broker.address, group).configs} == {
            SESSION: ("20000", 5), HEARTBEAT: ("6000", 8)}
        # ... and a heartbeat interval not below the broker's session timeout is refused
        assert _incremental(broker.address, group, (HEARTBEAT, 0, "20000")) == (
            ErrorCode.invalid_config, f"{SESSION} must be greater than {HEARTBEAT}")

        def legacy(name, *configs):
            (answer,) = send_request(broker.address, alter_v2.AlterConfigsRequest(resources=(
                alter_v2.AlterConfigsResource(resource_type=GROUP, resource_name=name, configs=tuple(
                    alter_v2.AlterableConfig(name=key, value=value) for key, value in configs)),),
                validate_only=False)).responses
            return answer.error_code, answer.error_message

        # a null value: Kafka 4's broker refuses it in ConfigAdminManager.preprocess, before it forwards the request
        # to the controller (whose GROUP branch would say INVALID_CONFIG "...for group configs: ..."), whatever the name
        assert legacy(group, (HEARTBEAT, None), (SESSION, "25000"), (SESSION + "x", None)) == (
            ErrorCode.invalid_request, f"Null value not supported for : {HEARTBEAT}, {SESSION}x")
        assert legacy("", (HEARTBEAT, None)) == (ErrorCode.invalid_request, f"Null value not supported for : {HEARTBEAT}")
        assert legacy("", (HEARTBEAT, "6000")) == (ErrorCode.invalid_request, "Default group resources are not allowed.")
        assert legacy(group, (HEARTBEAT, "1"), (HEARTBEAT, "2")) == (
            ErrorCode.invalid_request, "Error due to duplicate config keys")
        # nothing of that changed the group's configs
        assert {c.name: c.value for c in _describe(broker.address, group).configs} == {
            SESSION: "20000", HEARTBEAT: "6000"}

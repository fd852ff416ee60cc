"""Authorization of the consumer group protocol's APIs as Kafka 4's KafkaApis does it, before any group
changes: ConsumerGroupHeartbeat needs READ on the group (GROUP_AUTHORIZATION_FAILED) and DESCRIBE on every
subscribed topic name (TOPIC_AUTHORIZATION_FAILED); ConsumerGroupDescribe needs DESCRIBE on each group. Run on a
real broker in this process, the handlers called with a principal of their own."""

from __future__ import annotations

import asyncio
import datetime

import pytest
from kio.schema.consumer_group_describe.v1 import request as describe_v1
from kio.schema.consumer_group_heartbeat.v1 import request as heartbeat_v1

from pykbroker.config import BrokerConfig
from pykbroker.groups.offset_store import OFFSETS_TOPIC
from pykbroker.protocol.errors import ErrorCode
from pykbroker.security.acl import AclOperation, ResourceType
from pykbroker.server.broker import Broker, bind_listener
from pykbroker.server.handlers.consumer_groups import consumer_group_describe, consumer_group_heartbeat
from pykbroker.protocol.apis import codec_for
from pykbroker.protocol.framing import Request
from pykbroker.server.dispatch import RequestContext
from test_authorization_before_state import MALLORY, allow

pytestmark = pytest.mark.timeout(90)


async def call(broker: Broker, handler, api_key: int, version: int, request):
    """The handler run as the connection runs it, for MALLORY."""
    envelope = Request(api_key, version, 1, "mallory-client", None, request, codec_for(api_key, version))
    answer = handler(RequestContext(broker, envelope, "127.0.0.1:50000", principal=MALLORY), request)
    return await answer if asyncio.iscoroutine(answer) else answer


def join(group: str, topics: tuple[str, ...]):
    return heartbeat_v1.ConsumerGroupHeartbeatRequest(
        group_id=group, member_id="m1", member_epoch=0, rebalance_timeout=datetime.timedelta(seconds=30),
        subscribed_topic_names=topics, topic_partitions=())


def test_heartbeat_and_describe_need_their_acls(tmp_path):
    async def scenario():
        config = BrokerConfig(data_dir=tmp_path, port=0, values={
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer", "super.users": "User:ANONYMOUS",
            "offsets.topic.num.partitions": 1})
        listening = [(listener, bind_listener(listener)) for listener in config.listeners]
        broker = Broker(config)
        try:
            await broker.start(listening)
            for topic in ("visible", "hidden"):
                await broker.topics.auto_create_async(topic)
            await broker.create_internal_topic(OFFSETS_TOPIC)
            allow(broker, ResourceType.GROUP, "g", AclOperation.READ)
            allow(broker, ResourceType.TOPIC, "visible", AclOperation.DESCRIBE)

            refused = await call(broker, consumer_group_heartbeat, 68, 1, join("other", ("visible",)))
            assert refused.error_code == ErrorCode.group_authorization_failed
            refused = await call(broker, consumer_group_heartbeat, 68, 1, join("g", ("visible", "hidden")))
            assert refused.error_code == ErrorCode.topic_authorization_failed
            assert broker.consumer_groups.group("g") is None and broker.consumer_groups.group("other") is None
            joined = await call(broker, consumer_group_heartbeat, 68, 1, join("g", ("visible",)))
            assert (joined.error_code, joined.member_epoch) == (ErrorCode.none, 1)

            described = await call(broker, consumer_group_describe, 69, 1, describe_v1.ConsumerGroupDescribeRequest(
                group_ids=("g", "other"), include_authorized_operations=True))
            mine, others = described.groups
            assert mine.error_code == ErrorCode.none and mine.members[0].member_id == "m1"  # READ implies DESCRIBE
            assert mine.members[0].client_id == "mallory-client"
            assert (others.group_id, others.error_code) == ("other", ErrorCode.group_authorization_failed)
        finally:
            await broker.stop()
            for _, sock in listening:
                sock.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))

"""Authorization comes before any state is changed for the request, as in Kafka's KafkaApis: a transactional
Produce starts the partition verification (KIP-890) only for the partitions the principal may WRITE, and a
TxnOffsetCommit refused for its transactional id or group starts none. Checked on a real broker run in this
process (its partitions' producer states hold the verification entries), the handlers called with a
principal of their own, as the connection would give it."""

from __future__ import annotations

import asyncio
import datetime
import types

import pytest
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.txn_offset_commit.v3 import request as toc

from pykbroker.config import BrokerConfig
from pykbroker.groups.offset_store import OFFSETS_TOPIC
from pykbroker.protocol.apis import codec_for
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.records import TRANSACTIONAL_MASK, build_batch
from pykbroker.security.acl import (
    AccessControlEntry, AclOperation, AclPermissionType, PatternType, ResourcePattern, ResourceType,
)
from pykbroker.security.principal import KafkaPrincipal
from pykbroker.server.broker import Broker, bind_listener
from pykbroker.server.dispatch import RequestContext
from pykbroker.server.handlers.produce import produce
from pykbroker.server.handlers.txn_offset_commit import txn_offset_commit

pytestmark = pytest.mark.timeout(90)

MALLORY = KafkaPrincipal("User", "mallory")
PRODUCER_ID, EPOCH = 4242, 0


def allow(broker: Broker, resource_type: ResourceType, name: str, operation: AclOperation) -> None:
    pattern = ResourcePattern(resource_type, name, PatternType.LITERAL)
    broker.authorizer.cache.set(pattern, broker.authorizer.cache.get(pattern) | {
        AccessControlEntry(str(MALLORY), "*", operation, AclPermissionType.ALLOW)})


async def call(broker: Broker, handler, api_key: int, version: int, request):
    envelope = types.SimpleNamespace(api_key=api_key, api_version=version, body=request,
                                     codec=codec_for(api_key, version))
    answer = handler(RequestContext(broker, envelope, "127.0.0.1:50000", principal=MALLORY), request)
    return await answer if asyncio.iscoroutine(answer) or isinstance(answer, asyncio.Future) else answer


def verification_entries(broker: Broker, topic: str, index: int = 0) -> int:
    return broker.replicas.partition(topic, index).producer_state.verification_entries()


def test_verification_starts_only_where_the_principal_is_authorized(tmp_path):
    async def scenario():
        config = BrokerConfig(data_dir=tmp_path, port=0, values={
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer", "super.users": "User:ANONYMOUS",
            "offsets.topic.num.partitions": 1, "transaction.state.log.num.partitions": 1})
        listening = [(listener, bind_listener(listener)) for listener in config.listeners]
        broker = Broker(config)
        try:
            await broker.start(listening)
            assert broker.txn_verifier is not None  # transaction.partition.verification.enable: Kafka's default
            for topic in ("allowed", "denied"):
                await broker.topics.auto_create_async(topic)
            await broker.create_internal_topic(OFFSETS_TOPIC)
            allow(broker, ResourceType.TRANSACTIONAL_ID, "tx", AclOperation.WRITE)
            allow(broker, ResourceType.TOPIC, "allowed", AclOperation.WRITE)
            allow(broker, ResourceType.GROUP, "g", AclOperation.READ)

            batch = build_batch([(b"k", b"v")], producer_id=PRODUCER_ID, producer_epoch=EPOCH, base_sequence=0,
                                attributes=TRANSACTIONAL_MASK)
            request = ProduceRequest(transactional_id="tx", acks=1, timeout=datetime.timedelta(seconds=10),
                                     topic_data=tuple(TopicProduceData(name=topic, partition_data=(
                                         PartitionProduceData(index=0, records=batch),)) for topic in ("allowed", "denied")))
            answer = await call(broker, produce, 0, 9, request)
            errors = {t.name: t.partition_responses[0].error_code for t in answer.responses}
            assert errors["denied"] == ErrorCode.topic_authorization_failed
            assert errors["allowed"] != ErrorCode.none  # never added to a transaction: verification refuses it
            assert verification_entries(broker, "allowed") == 1  # verified (and refused: the entry stays)
            assert verification_entries(broker, "denied") == 0  # never verified

            def commit(transactional_id: str, group: str):
                return toc.TxnOffsetCommitRequest(
                    transactional_id=transactional_id, group_id=group, producer_id=PRODUCER_ID, producer_epoch=EPOCH,
                    generation_id=-1, member_id="", group_instance_id=None, topics=(toc.TxnOffsetCommitRequestTopic(
                        name="allowed", partitions=(toc.TxnOffsetCommitRequestPartition(
                            partition_index=0, committed_offset=0, committed_leader_epoch=-1,
                            committed_metadata=""),)),))

            for transactional_id, group, refused in (("tx-none", "g", ErrorCode.transactional_id_authorization_failed),
                                                     ("tx", "g-none", ErrorCode.group_authorization_failed)):
                answer = await call(broker, txn_offset_commit, 28, 3, commit(transactional_id, group))
                assert answer.topics[0].partitions[0].error_code == refused
                assert verification_entries(broker, OFFSETS_TOPIC) == 0
        finally:
            await broker.stop()
            for _, sock in listening:
                sock.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))

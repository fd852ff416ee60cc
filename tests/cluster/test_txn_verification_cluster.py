"""KIP-890 partition verification on a 3-broker cluster: a partition leader that is not the transactional id's
coordinator asks the coordinator over the network (AddPartitionsToTxn v4 verify_only) before a producer's first
transactional write, and refuses a partition the coordinator does not have in the transaction."""

from __future__ import annotations

import datetime
import time

import pytest
from kio.schema.add_partitions_to_txn.v3.request import AddPartitionsToTxnRequest, AddPartitionsToTxnTopic
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import i16, i32, i32Timedelta

from broker_cluster import BrokerCluster, send_request
from pykbroker.protocol.records import TRANSACTIONAL_MASK, build_batch
from test_transactions_cluster import OVERRIDES, transaction_coordinator

pytestmark = pytest.mark.timeout(300)
E = ErrorCode
TID = "tx-remote-verify"
PARTITIONS = 6


def ms(value: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=value))


def produce(address, topic: str, index: int, pid: int, epoch: int, seq: int):
    batch = bytes(build_batch([(None, b"v%d" % seq)], timestamp_ms=int(time.time() * 1000), producer_id=pid,
                              producer_epoch=epoch, base_sequence=seq, attributes=TRANSACTIONAL_MASK))
    response = send_request(address, ProduceRequest(transactional_id=TID, acks=i16(-1), timeout=ms(30_000), topic_data=(
        TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=i32(index), records=batch),)),)),
        timeout=60.0)
    return response.responses[0].partition_responses[0]


def test_a_leader_verifies_with_a_coordinator_on_another_broker(zk_connect, tmp_path):
    with BrokerCluster(zk_connect, tmp_path, n=3, overrides=OVERRIDES) as cluster:
        topic = "verified"
        cluster.create_topic(topic, PARTITIONS)
        coordinator = transaction_coordinator(cluster, TID)
        remote = [(i, info.leader) for i in range(PARTITIONS)
                  if (info := cluster.partition(topic, i)).leader != coordinator]
        assert remote, "every partition is led by the coordinator"
        index, leader = remote[0]
        init = send_request(cluster.brokers[coordinator].address, InitProducerIdRequest(
            transactional_id=TID, transaction_timeout=ms(60_000), producer_id=-1, producer_epoch=i16(-1)))
        assert init.error_code == E.none
        pid, epoch = init.producer_id, init.producer_epoch
        leader_address = cluster.brokers[leader].address
        refused = produce(leader_address, topic, index, pid, epoch, 0)
        assert (refused.error_code, refused.error_message) == (E.invalid_txn_state,
                                                               "Partition was not added to the transaction")
        added = send_request(cluster.brokers[coordinator].address, AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=TID, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=i16(epoch),
            v3_and_below_topics=(AddPartitionsToTxnTopic(name=topic, partitions=(i32(index),)),)))
        assert added.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == E.none
        accepted = produce(leader_address, topic, index, pid, epoch, 0)
        assert (accepted.error_code, accepted.base_offset) == (E.none, 0)
        # A stale epoch is fenced by the remote coordinator: INVALID_PRODUCER_EPOCH (PRODUCER_FENCED mapped).
        other = next(((i, l) for i, l in remote if i != index), None)
        if other is not None:
            stale = produce(cluster.brokers[other[1]].address, topic, other[0], pid, epoch + 1, 0)
            assert stale.error_code == E.invalid_producer_epoch

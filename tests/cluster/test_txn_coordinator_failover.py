"""The transaction coordinator in a 3-broker cluster: __transaction_state is created replicated (factor 3,
min.insync.replicas 2) on the first FindCoordinator key_type 1, its writes are acknowledged by the ISR, and
when the coordinator's broker is killed the new leader of the id's partition loads its state: the loaded
transaction is described as it was, and InitProducerId bumps the loaded epoch (aborting the open
transaction first, with markers carrying the bumped epoch, as Kafka does)."""

from __future__ import annotations

import datetime
import time

import pytest
from kio.schema.add_partitions_to_txn.v3.request import AddPartitionsToTxnRequest, AddPartitionsToTxnTopic
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.describe_configs.v4.request import DescribeConfigsRequest, DescribeConfigsResource
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.static.primitive import i8, i16, i32, i32Timedelta

from broker_cluster import BrokerCluster
from broker_process import send_request, wait_until
from pykbroker.groups.offset_store import partition_for_group

E = ErrorCode
TXN_TOPIC = "__transaction_state"
TXN_PARTITIONS = 3
TIMEOUT_S = 60.0


def coordinator(cluster: BrokerCluster, tid: str, exclude: set[int] = frozenset()) -> int:
    """The transaction coordinator's id, as every live broker's FindCoordinator names it."""
    found = []

    def answered():
        for broker_id in sorted(cluster.live_ids()):
            answer = send_request(cluster.brokers[broker_id].address,
                                  FindCoordinatorRequest(key_type=i8(1), coordinator_keys=(tid,))).coordinators[0]
            if answer.error_code != E.none or answer.node_id in exclude or answer.node_id not in cluster.live_ids():
                return False
            found.append(int(answer.node_id))
        return True

    wait_until(answered, f"a transaction coordinator for {tid}", TIMEOUT_S)
    return found[-1]


def retrying(send, what: str, retriable=(E.coordinator_load_in_progress, E.not_coordinator,
                                          E.coordinator_not_available)):
    result = []

    def done():
        answer = send()
        if answer.error_code in retriable:
            return False
        result.append(answer)
        return True

    wait_until(done, what, TIMEOUT_S)
    return result[0]


def init(address, tid: str):
    return retrying(lambda: send_request(address, InitProducerIdRequest(
        transactional_id=tid, transaction_timeout=i32Timedelta.parse(datetime.timedelta(seconds=60)),
        producer_id=-1, producer_epoch=i16(-1))), f"InitProducerId({tid})")


def describe(address, tid: str):
    return retrying(lambda: send_request(address, DescribeTransactionsRequest(transactional_ids=(tid,)))
                    .transaction_states[0], f"DescribeTransactions({tid})")


@pytest.mark.timeout(300)
def test_the_new_coordinator_loads_the_state_after_the_old_one_is_killed(zk_connect, tmp_path):
    overrides = {"zookeeper.session.timeout.ms": 6000, "transaction.state.log.num.partitions": TXN_PARTITIONS}
    with BrokerCluster(zk_connect, tmp_path, n=3, overrides=overrides) as cluster:
        cluster.create_topic("txn-data", partitions=2, replication_factor=3)
        tid = "tx-failover"
        first = coordinator(cluster, tid)
        index = partition_for_group(tid, TXN_PARTITIONS)
        leader = cluster.wait_for_leader(TXN_TOPIC, index)
        assert leader == first
        info = cluster.partition(TXN_TOPIC, index)
        assert len(info.replicas) == 3
        cluster.wait_for_isr(TXN_TOPIC, index, info.replicas)
        configs = send_request(cluster.brokers[first].address, DescribeConfigsRequest(resources=(
            DescribeConfigsResource(resource_type=i8(2), resource_name=TXN_TOPIC,
                                    configuration_keys=("min.insync.replicas",)),),
            include_synonyms=False, include_documentation=False)).results[0].configs
        assert [c.value for c in configs] == ["2"]

        address = cluster.brokers[first].address
        answer = init(address, tid)
        assert (answer.error_code, answer.producer_epoch) == (E.none, 0)
        pid = answer.producer_id
        assert init(address, tid).producer_epoch == 1
        added = send_request(address, AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=i16(1),
            v3_and_below_topics=(AddPartitionsToTxnTopic(name="txn-data", partitions=(i32(0), i32(1))),)))
        assert {p.partition_error_code for t in added.results_by_topic_v3_and_below
                for p in t.results_by_partition} == {E.none}

        cluster.kill(first)
        second = coordinator(cluster, tid, exclude={first})
        assert second != first
        address = cluster.brokers[second].address
        state = describe(address, tid)
        assert (state.error_code, state.transaction_state, state.producer_id, state.producer_epoch) == (
            E.none, "Ongoing", pid, 1)
        assert {(t.topic, p) for t in state.topics for p in t.partitions} == {("txn-data", 0), ("txn-data", 1)}

        # InitProducerId on the loaded id: the open transaction is aborted first with epoch 2.
        assert init(address, tid).error_code == E.concurrent_transactions
        state = describe(address, tid)
        assert state.transaction_state in ("PrepareAbort", "CompleteAbort") and state.producer_epoch == 2
        api_keys = {a.api_key for a in send_request(address, ApiVersionsRequest(
            client_software_name="t", client_software_version="1")).api_keys}
        if 27 in api_keys:  # the partition leaders write markers: the abort completes, the retry gets epoch 3
            deadline = time.monotonic() + TIMEOUT_S
            while (answer := init(address, tid)).error_code == E.concurrent_transactions:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert (answer.error_code, answer.producer_id, answer.producer_epoch) == (E.none, pid, 3)

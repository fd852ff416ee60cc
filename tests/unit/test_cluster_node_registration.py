"""ClusterNode (pykbroker/cluster/node.py) and controller requests that arrive before this broker's first
registration in ZooKeeper has returned: the controller can see /brokers/ids/<id> (and send UpdateMetadata
stamped with its czxid) before the create's answer reaches us. Kafka only processes requests once registered;
the request must wait and then be applied, not be refused (the controller does not send it again)."""

from __future__ import annotations

import asyncio

from pykbroker.cluster.node import ClusterNode
from pykbroker.protocol.errors import ErrorCode
from pykbroker.protocol.interbroker.update_metadata.v8 import request as um
from pykbroker.protocol.interbroker.update_metadata.v8 import response as um_resp
from kio.static.primitive import i8, i32, i64


class RecordingMetadata:
    def __init__(self) -> None:
        self.applied: list = []

    def apply_update_metadata(self, request) -> None:
        self.applied.append(request)


def unregistered_node() -> ClusterNode:
    """The state ClusterNode.__init__ leaves before start(): no broker epoch yet."""
    node = ClusterNode.__new__(ClusterNode)
    node.broker_id, node.broker_epoch, node.controller_epoch = 3, -1, -1
    node.metadata = RecordingMetadata()
    node._registered = asyncio.Event()
    return node


def update_metadata(broker_epoch: int) -> um.UpdateMetadataRequest:
    return um.UpdateMetadataRequest(controller_id=i32(1), is_k_raft_controller=False, type_=i8(0),
                                    controller_epoch=i32(1), broker_epoch=i64(broker_epoch), topic_states=(),
                                    live_brokers=())


def register(node: ClusterNode, epoch: int) -> None:
    """What start() does when register_broker returns."""
    node.broker_epoch = epoch
    node._registered.set()


def test_update_metadata_for_the_epoch_being_registered_waits_and_is_applied():
    async def body():
        node = unregistered_node()
        answer = asyncio.ensure_future(node.handle_update_metadata(update_metadata(105), um_resp))
        await asyncio.sleep(0.05)
        assert not answer.done() and node.metadata.applied == []
        register(node, 105)
        response = await asyncio.wait_for(answer, 5)
        assert response.error_code == ErrorCode.none
        assert len(node.metadata.applied) == 1

    asyncio.run(body())


def test_update_metadata_for_an_earlier_incarnation_is_refused_once_registered():
    async def body():
        node = unregistered_node()
        answer = asyncio.ensure_future(node.handle_update_metadata(update_metadata(90), um_resp))
        await asyncio.sleep(0.05)
        register(node, 105)
        response = await asyncio.wait_for(answer, 5)
        assert response.error_code == ErrorCode.stale_broker_epoch
        assert node.metadata.applied == []

    asyncio.run(body())

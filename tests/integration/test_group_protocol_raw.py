"""The group coordinator over the wire, request by request (kio entities on raw sockets): the error codes
Kafka's classic group protocol answers (MEMBER_ID_REQUIRED, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
REBALANCE_IN_PROGRESS, FENCED_INSTANCE_ID, INCONSISTENT_GROUP_PROTOCOL, INVALID_SESSION_TIMEOUT), the
version differences of each API, the admin APIs, and membership surviving a broker kill -9.

JoinGroup and SyncGroup answers may wait for other members, so requests that park run in threads, each
on its own connection (as separate consumers would)."""

from __future__ import annotations

import io
import socket
import struct
import sys
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from kio.index import load_request_schema, load_response_from_request
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer

from broker_process import BrokerProcess, send_request
from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.handlers._build import make

pytestmark = pytest.mark.timeout(60)

SESSION_MS = 6000
GROUP_CONFIG = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 1000,
                "num.partitions": 2}
JOIN, HEARTBEAT, LEAVE, SYNC, DESCRIBE, LIST, OFFSET_COMMIT, OFFSET_FETCH, DELETE_GROUPS, OFFSET_DELETE = (
    11, 12, 13, 14, 15, 16, 8, 9, 42, 47)


def request(api_key: int, version: int, **fields):
    """A kio request of any version from the fields that version has (ints become timedeltas)."""
    return make(load_request_schema(api_key, version), **fields)


def nested(api_key: int, version: int, entity: str, **fields):
    """A nested entity (an array element) of a request version, by its kio class name."""
    schema = load_request_schema(api_key, version)
    return make(getattr(sys.modules[schema.__module__], entity), **fields)


def subscription(*topics: str) -> bytes:
    data = struct.pack(">hi", 0, len(topics))
    for topic in topics:
        data += struct.pack(">h", len(topic)) + topic.encode()
    return data + struct.pack(">i", -1)


class Client:
    """One group member speaking the protocol at chosen versions; parked requests run in a thread."""

    def __init__(self, address, group: str, *, client_id: str = "raw", instance: str | None = None,
                 join_version: int = 9, protocols=(("range", subscription("t")),)) -> None:
        self.address = address
        self.group = group
        self.client_id = client_id
        self.instance = instance
        self.join_version = join_version
        self.protocols = protocols
        self.member_id = ""
        self.generation = -1
        self._pool = ThreadPoolExecutor(max_workers=1)

    def send(self, api_request):
        return send_request(self.address, api_request, client_id=self.client_id, timeout=30)

    def join_async(self, member_id: str | None = None, **overrides) -> Future:
        v = self.join_version
        body = request(JOIN, v, group_id=self.group, session_timeout=SESSION_MS, rebalance_timeout=10_000,
                       member_id=self.member_id if member_id is None else member_id,
                       group_instance_id=self.instance, protocol_type="consumer",
                       protocols=tuple(nested(JOIN, v, "JoinGroupRequestProtocol", name=n, metadata=m)
                                       for n, m in self.protocols), reason=None)
        if overrides:
            body = make(type(body), **{**{f: getattr(body, f) for f in body.__dataclass_fields__}, **overrides})
        future = self._pool.submit(self.send, body)
        future.add_done_callback(self._learn)
        return future

    def _learn(self, future: Future) -> None:
        answer = future.result()
        if answer.error_code in (ErrorCode.none, ErrorCode.member_id_required):
            self.member_id = answer.member_id
        if answer.error_code == ErrorCode.none:
            self.generation = answer.generation_id

    def join(self, **overrides):
        return self.join_async(**overrides).result(timeout=30)

    def join_dance(self):
        """KIP-394: the first join (v4+) is refused with an id to use; the second joins."""
        first = self.join()
        if self.join_version >= 4 and self.instance is None:
            assert first.error_code == ErrorCode.member_id_required
            return self.join()
        return first

    def sync_async(self, assignments: dict | None = None, *, version: int = 5, generation: int | None = None) -> Future:
        body = request(SYNC, version, group_id=self.group, member_id=self.member_id, group_instance_id=self.instance,
                       generation_id=self.generation if generation is None else generation,
                       protocol_type="consumer", protocol_name="range",
                       assignments=tuple(nested(SYNC, version, "SyncGroupRequestAssignment", member_id=m, assignment=a)
                                         for m, a in (assignments or {}).items()))
        return self._pool.submit(self.send, body)

    def sync(self, assignments: dict | None = None, **kwargs):
        return self.sync_async(assignments, **kwargs).result(timeout=30)

    def heartbeat(self, *, generation: int | None = None, member_id: str | None = None, version: int = 4) -> ErrorCode:
        return self.send(request(HEARTBEAT, version, group_id=self.group, group_instance_id=self.instance,
                                 generation_id=self.generation if generation is None else generation,
                                 member_id=self.member_id if member_id is None else member_id)).error_code

    def commit(self, offset: int, *, generation: int | None = None, member_id: str | None = None,
               version: int = 8) -> ErrorCode:
        partition = nested(OFFSET_COMMIT, version, "OffsetCommitRequestPartition", partition_index=0,
                           committed_offset=offset, committed_leader_epoch=-1, committed_metadata="")
        topic = nested(OFFSET_COMMIT, version, "OffsetCommitRequestTopic", name="t", partitions=(partition,))
        answer = self.send(request(OFFSET_COMMIT, version, group_id=self.group,
                                   generation_id_or_member_epoch=self.generation if generation is None else generation,
                                   member_id=self.member_id if member_id is None else member_id,
                                   group_instance_id=self.instance, retention_time=-1, topics=(topic,)))
        return answer.topics[0].partitions[0].error_code


def wait_for_state(client: Client, state: str) -> None:
    """Until DescribeGroups shows the group in ``state`` (a parked join has reached the broker)."""
    deadline = time.monotonic() + 30
    while client.send(request(DESCRIBE, 0, groups=(client.group,))).groups[0].group_state != state:
        assert time.monotonic() < deadline, f"group {client.group} never reached {state}"
        time.sleep(0.02)


def stable_member(client: Client, assignment: bytes = b"everything") -> None:
    joined = client.join_dance()
    assert joined.error_code == ErrorCode.none and joined.leader == client.member_id
    synced = client.sync({client.member_id: assignment})
    assert (synced.error_code, synced.assignment) == (ErrorCode.none, assignment)


def create_topic_t(address) -> None:
    """Topic "t" (2 partitions), auto-created by a Metadata request as a consumer's would."""
    send_request(address, request(3, 9, topics=(nested(3, 9, "MetadataRequestTopic", name="t"),),
                                  allow_auto_topic_creation=True, include_cluster_authorized_operations=False,
                                  include_topic_authorized_operations=False))


@pytest.fixture(scope="module")
def group_broker(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("groups-raw"), config=GROUP_CONFIG)
    with broker:
        create_topic_t(broker.address)
        yield broker


@pytest.fixture
def group_id() -> str:
    return f"raw-{uuid.uuid4().hex[:8]}"


# -- MEMBER_ID_REQUIRED ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [4, 5, 7, 9])
def test_member_id_required_on_the_first_join_from_v4(group_broker, group_id, version):
    client = Client(group_broker.address, group_id, client_id="my-consumer", join_version=version)
    first = client.join()
    assert first.error_code == ErrorCode.member_id_required
    assert first.member_id.startswith("my-consumer-") and first.generation_id == -1 and first.members == ()
    joined = client.join()
    assert (joined.error_code, joined.generation_id, joined.member_id, joined.leader) == (
        ErrorCode.none, 1, first.member_id, first.member_id)
    assert [(m.member_id, m.metadata) for m in joined.members] == [(first.member_id, subscription("t"))]
    assert joined.protocol_name == "range"
    if version >= 7:
        assert joined.protocol_type == "consumer"


@pytest.mark.parametrize("version", [0, 1, 3])
def test_before_v4_a_member_joins_at_once(group_broker, group_id, version):
    client = Client(group_broker.address, group_id, join_version=version)
    joined = client.join()
    assert (joined.error_code, joined.generation_id) == (ErrorCode.none, 1)
    synced = client.sync({client.member_id: b"x"}, version=0)
    assert synced.assignment == b"x"


# -- ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID -----------------------------------------------------------------------


def test_illegal_generation_for_a_generation_that_is_not_the_groups(group_broker, group_id):
    client = Client(group_broker.address, group_id)
    stable_member(client)
    assert client.heartbeat(generation=client.generation + 1) == ErrorCode.illegal_generation
    assert client.commit(5, generation=client.generation - 1) == ErrorCode.illegal_generation
    assert client.sync(generation=client.generation + 1).error_code == ErrorCode.illegal_generation
    assert client.commit(5) == ErrorCode.none
    # A generation for a group that never existed is stale by definition.
    stranger = Client(group_broker.address, f"{group_id}-none")
    assert stranger.commit(5, generation=3, member_id="whoever") == ErrorCode.illegal_generation


def test_unknown_member_id_for_ids_the_group_does_not_have(group_broker, group_id):
    client = Client(group_broker.address, group_id)
    assert client.join(member_id="made-up").error_code == ErrorCode.unknown_member_id  # no such group
    stable_member(client)
    assert client.heartbeat(member_id="made-up") == ErrorCode.unknown_member_id
    assert client.commit(5, member_id="made-up") == ErrorCode.unknown_member_id
    assert client.commit(5, generation=-1, member_id="") == ErrorCode.unknown_member_id  # group has members
    assert client.sync(version=3, generation=client.generation).error_code == ErrorCode.none
    leave = client.send(request(LEAVE, 5, group_id=group_id, members=(
        nested(LEAVE, 5, "MemberIdentity", member_id=client.member_id, reason="done"),
        nested(LEAVE, 5, "MemberIdentity", member_id="made-up"))))
    assert leave.error_code == ErrorCode.none
    assert [(m.member_id, m.error_code) for m in leave.members] == [
        (client.member_id, ErrorCode.none), ("made-up", ErrorCode.unknown_member_id)]
    assert client.heartbeat() == ErrorCode.unknown_member_id
    old = client.send(request(LEAVE, 0, group_id=group_id, member_id=client.member_id))
    assert old.error_code == ErrorCode.unknown_member_id  # before v3 the member's error is the answer


# -- REBALANCE_IN_PROGRESS ----------------------------------------------------------------------------------------


def test_rebalance_in_progress_while_the_group_rebalances(group_broker, group_id):
    a = Client(group_broker.address, group_id, client_id="a")
    stable_member(a)
    old_generation = a.generation
    b = Client(group_broker.address, group_id, client_id="b")
    assert b.join().error_code == ErrorCode.member_id_required
    b_join = b.join_async()  # parks until A rejoins
    wait_for_state(a, "PreparingRebalance")
    assert a.heartbeat() == ErrorCode.rebalance_in_progress
    assert a.commit(7) == ErrorCode.none  # still the current generation: commits are accepted
    assert a.sync(generation=old_generation).error_code == ErrorCode.rebalance_in_progress
    a_join = a.join()
    b_joined = b_join.result(timeout=30)
    assert a_join.generation_id == b_joined.generation_id == old_generation + 1
    assert len(a_join.members) == 2 and b_joined.members == ()
    # CompletingRebalance: the new generation has no assignment yet, so no commits for it.
    assert a.commit(8) == ErrorCode.rebalance_in_progress
    b_sync = b.sync_async()
    a_sync = a.sync({a.member_id: b"p0", b.member_id: b"p1"})
    assert a_sync.assignment == b"p0" and b_sync.result(timeout=30).assignment == b"p1"
    assert a.commit(8) == ErrorCode.none and b.heartbeat() == ErrorCode.none


# -- FENCED_INSTANCE_ID ------------------------------------------------------------------------------------------


def test_a_static_member_replaced_by_a_new_instance_is_fenced(group_broker, group_id):
    first = Client(group_broker.address, group_id, instance="instance-1", join_version=5)
    joined = first.join()
    assert joined.error_code == ErrorCode.none and joined.member_id.startswith("instance-1-")
    first.sync({first.member_id: b"mine"})
    second = Client(group_broker.address, group_id, instance="instance-1", join_version=5)
    back = second.join()  # the same instance restarted: new member id, same generation, no rebalance
    assert (back.error_code, back.generation_id) == (ErrorCode.none, first.generation)
    assert back.member_id != first.member_id and back.leader == first.member_id
    assert second.sync().assignment == b"mine"
    assert first.heartbeat() == ErrorCode.fenced_instance_id
    assert first.commit(3) == ErrorCode.fenced_instance_id
    assert first.join().error_code == ErrorCode.fenced_instance_id
    assert first.sync().error_code == ErrorCode.fenced_instance_id
    assert second.heartbeat() == ErrorCode.none
    leave = second.send(request(LEAVE, 4, group_id=group_id, members=(
        nested(LEAVE, 4, "MemberIdentity", member_id="", group_instance_id="instance-1"),)))
    assert leave.members[0].error_code == ErrorCode.none


# -- pipelining ------------------------------------------------------------------------------------------------------


def pipelined(address, *requests, client_id: str = "raw") -> list:
    """Send every request on one connection before reading any answer; the answers, in order."""
    frames = b""
    for correlation_id, body in enumerate(requests):
        header_type = RequestHeaderV2 if body.__flexible__ else RequestHeaderV1
        out = io.BytesIO()
        entity_writer(header_type)(out, header_type(request_api_key=body.__api_key__,
                                                    request_api_version=body.__version__,
                                                    correlation_id=correlation_id, client_id=client_id))
        entity_writer(type(body))(out, body)
        frames += struct.pack(">i", len(out.getvalue())) + out.getvalue()
    answers = []
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(frames)
        stream = sock.makefile("rb")
        for correlation_id, body in enumerate(requests):
            (size,) = struct.unpack(">i", stream.read(4))
            payload = stream.read(size)
            response_type = load_response_from_request(type(body))
            header, used = entity_reader(response_type.__header_schema__)(payload, 0)
            assert header.correlation_id == correlation_id
            answers.append(entity_reader(response_type)(payload, used)[0])
    return answers


def test_requests_pipelined_behind_a_parked_join_are_handled_after_it_as_kafka_does(group_broker, group_id):
    a = Client(group_broker.address, group_id, client_id="a")
    stable_member(a)
    b = Client(group_broker.address, group_id, client_id="b")
    b.join()
    b_join = b.join_async()
    assert a.join().generation_id == 2 and b_join.result(timeout=30).generation_id == 2
    b_sync = b.sync_async()
    a.sync({a.member_id: b"a", b.member_id: b"b"})
    assert b_sync.result(timeout=30).error_code == ErrorCode.none
    c = Client(group_broker.address, group_id, client_id="c")
    c.join()
    c_join = c.join_async()  # a rebalance: a's JoinGroup below parks until b rejoins too
    wait_for_state(a, "PreparingRebalance")
    rejoin = request(JOIN, 9, group_id=group_id, session_timeout=SESSION_MS, rebalance_timeout=10_000,
                     member_id=a.member_id, protocol_type="consumer", group_instance_id=None, reason=None,
                     protocols=(nested(JOIN, 9, "JoinGroupRequestProtocol", name="range", metadata=subscription("t")),))
    heartbeat = request(HEARTBEAT, 4, group_id=group_id, generation_id=2, member_id=a.member_id,
                        group_instance_id=None)
    with ThreadPoolExecutor(max_workers=1) as pool:
        answers = pool.submit(pipelined, group_broker.address, rejoin, heartbeat)
        assert b.heartbeat() == ErrorCode.rebalance_in_progress
        b_rejoin = b.join()
        joined, beat = answers.result(timeout=30)
    assert joined.generation_id == b_rejoin.generation_id == c_join.result(timeout=30).generation_id == 3
    # Handled after the join, the heartbeat names the generation that just ended.
    assert beat.error_code == ErrorCode.illegal_generation


# -- protocol and timeout checks -------------------------------------------------------------------------------------


def test_protocols_and_session_timeouts_are_checked(group_broker, group_id):
    client = Client(group_broker.address, group_id)
    assert client.join(session_timeout=500).error_code == ErrorCode.invalid_session_timeout
    assert client.join(protocols=()).error_code == ErrorCode.inconsistent_group_protocol
    stable_member(client)
    other = Client(group_broker.address, group_id, protocols=(("roundrobin", subscription("t")),))
    assert other.join().error_code == ErrorCode.inconsistent_group_protocol
    body = request(SYNC, 5, group_id=group_id, member_id=client.member_id, generation_id=client.generation,
                   protocol_type=None, protocol_name="range", assignments=())
    assert client.send(body).error_code == ErrorCode.inconsistent_group_protocol  # v5 needs both names


# -- admin APIs --------------------------------------------------------------------------------------------------


def test_list_describe_delete_groups_and_offset_delete(group_broker, group_id):
    client = Client(group_broker.address, group_id, client_id="described")
    stable_member(client, b"assigned")
    listed = client.send(request(LIST, 4, states_filter=("stable",)))
    assert (group_id, "consumer", "Stable") in {(g.group_id, g.protocol_type, g.group_state) for g in listed.groups}
    assert group_id not in {g.group_id for g in client.send(request(LIST, 4, states_filter=("Empty",))).groups}
    assert group_id in {g.group_id for g in client.send(request(LIST, 0)).groups}
    described = client.send(request(DESCRIBE, 5, groups=(group_id, f"{group_id}-none"),
                                    include_authorized_operations=True))
    found, missing = described.groups
    assert (found.error_code, found.group_state, found.protocol_type, found.protocol_data) == (
        ErrorCode.none, "Stable", "consumer", "range")
    (member,) = found.members
    assert (member.member_id, member.client_id, member.client_host, member.member_assignment,
            member.member_metadata) == (client.member_id, "described", "/127.0.0.1", b"assigned", subscription("t"))
    assert found.authorized_operations == (1 << 3) | (1 << 6) | (1 << 8)
    assert (missing.error_code, missing.group_state, missing.members) == (ErrorCode.none, "Dead", ())
    assert client.commit(4) == ErrorCode.none
    deleted = client.send(request(OFFSET_DELETE, 0, group_id=group_id, topics=(
        nested(OFFSET_DELETE, 0, "OffsetDeleteRequestTopic", name="t", partitions=(
            nested(OFFSET_DELETE, 0, "OffsetDeleteRequestPartition", partition_index=0),
            nested(OFFSET_DELETE, 0, "OffsetDeleteRequestPartition", partition_index=99))),)))
    assert deleted.error_code == ErrorCode.none
    assert {p.partition_index: p.error_code for p in deleted.topics[0].partitions} == {
        0: ErrorCode.group_subscribed_to_topic, 99: ErrorCode.unknown_topic_or_partition}
    result = client.send(request(DELETE_GROUPS, 2, groups_names=(group_id, f"{group_id}-none")))
    assert {r.group_id: r.error_code for r in result.results} == {
        group_id: ErrorCode.non_empty_group, f"{group_id}-none": ErrorCode.group_id_not_found}
    client.send(request(LEAVE, 1, group_id=group_id, member_id=client.member_id))
    result = client.send(request(DELETE_GROUPS, 0, groups_names=(group_id,)))
    assert result.results[0].error_code == ErrorCode.none
    fetched = client.send(request(OFFSET_FETCH, 1, group_id=group_id, topics=(
        nested(OFFSET_FETCH, 1, "OffsetFetchRequestTopic", name="t", partition_indexes=(0,)),)))
    assert fetched.topics[0].partitions[0].committed_offset == -1  # deleted with the group


# -- restart ---------------------------------------------------------------------------------------------------------


def test_membership_and_generation_survive_a_broker_kill(broker_factory):
    broker = broker_factory.make(config=GROUP_CONFIG)
    create_topic_t(broker.address)
    client = Client(broker.address, "survivor")
    client.send(request(10, 1, key="survivor", key_type=0))  # FindCoordinator creates __consumer_offsets
    stable_member(client, b"p0")
    assert client.commit(11) == ErrorCode.none
    broker.restart(kill=True)
    assert client.heartbeat() == ErrorCode.none  # same member, same generation: no rejoin needed
    assert client.sync().assignment == b"p0"
    assert client.commit(12) == ErrorCode.none
    intruder = Client(broker.address, "survivor", client_id="late")
    intruder.join()
    late = intruder.join_async()
    wait_for_state(client, "PreparingRebalance")
    assert client.heartbeat() == ErrorCode.rebalance_in_progress
    rejoined = client.join()
    assert rejoined.generation_id == 2 and late.result(timeout=30).generation_id == 2

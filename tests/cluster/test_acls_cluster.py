"""ACLs in a 3-broker ZooKeeper cluster: an ACL created through one broker is stored as Kafka stores it
(``/kafka-acl/<Type>/<name>`` plus a ``/kafka-acl-changes`` notification) and enforced by the other brokers
within seconds; deleted through another broker, it stops being enforced everywhere; a broker started later
loads it.

The brokers talk to each other on PLAINTEXT as User:ANONYMOUS (inter-broker SASL / mTLS is another helper's
work), so, as Kafka requires of the brokers' own principal, User:ANONYMOUS is in ``super.users``: the
controller's LeaderAndIsr / UpdateMetadata and the followers' fetches need CLUSTER_ACTION. Clients are told
apart by their TLS client certificates on an MTLS listener each broker has beside its PLAINTEXT one."""

from __future__ import annotations

import datetime
import json
import threading

import pytest

pytest.importorskip("cryptography", reason="certificates for these tests are built with cryptography")

from broker_cluster import BrokerCluster  # noqa: E402  (puts tests/integration on sys.path)
from acl_helpers import (  # noqa: E402
    DESCRIBE, TOPIC, TOPIC_DENIED, RawClient, acl_creation, acl_principals, client_tls, create_acls,
    delete_acls_request, schema, secured_settings,
)
from broker_process import free_port, wait_until  # noqa: E402
from tls_helpers import standard_pki  # noqa: E402


def kafka_tools_or_none():
    from kafka_tools import KafkaTools, find_refkit, unavailable_reason

    refkit = find_refkit()
    return None if unavailable_reason(refkit) is not None else KafkaTools(refkit)

CLIENT = "User:CN=client,OU=apps,O=pykbroker"
PROPAGATION_S = 10.0  # "within seconds": a ZooKeeper watch and one read


def _at_once(calls: list) -> list:
    """Each (address, request) sent on its own (open) connection at the same moment; their answers."""
    clients = [RawClient(address) for address, _ in calls]
    for client in clients:
        acl_principals(client, TOPIC, "-")  # connected
    start, answers = threading.Barrier(len(calls)), [None] * len(calls)

    def run(index: int) -> None:
        start.wait(PROPAGATION_S)
        answers[index] = clients[index].call(calls[index][1])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for client in clients:
        client.close()
    assert None not in answers, answers
    return answers


def _topic_error(client: RawClient, topic: str) -> int:
    cls, m = schema(3, 12)
    answer = client.call(cls(topics=(m.MetadataRequestTopic(topic_id=None, name=topic),),
                             allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    return int(answer.topics[0].error_code)


@pytest.mark.timeout(300)
def test_an_acl_changed_through_one_broker_is_enforced_by_every_broker(zk_connect, tmp_path):
    (tmp_path / "pki").mkdir()
    pki = standard_pki(tmp_path / "pki")
    cluster = BrokerCluster(zk_connect, tmp_path, n=3, overrides={"num.partitions": 1, "default.replication.factor": 3})
    mtls_ports = {}
    for broker_id, broker in cluster.brokers.items():
        mtls_ports[broker_id] = free_port()
        settings = secured_settings(pki, broker.port, mtls_ports[broker_id], "kafka.security.authorizer.AclAuthorizer")
        listeners = settings.pop("listeners")  # PLAINTEXT first: the inter-broker listener
        broker.overrides.update(settings)
        command = broker.command
        broker.command = lambda command=command, listeners=listeners: [
            listeners if arg.startswith("PLAINTEXT://") else arg for arg in command()]
    tls = client_tls(pki, pki.client_pem_file)
    with cluster:
        topic = "guarded"
        admin = RawClient(cluster.brokers[1].address)  # User:ANONYMOUS: a super user
        cls, m = schema(19, 7)
        created = admin.call(cls(topics=(m.CreatableTopic(name=topic, num_partitions=1, replication_factor=3,
                                                          assignments=(), configs=()),),
                                 timeout=datetime.timedelta(seconds=30), validate_only=False))
        assert created.topics[0].error_code == 0, created
        cluster.wait_for_isr(topic, 0, {1, 2, 3})  # replication works with the authorizer on
        clients = {i: RawClient(("127.0.0.1", port), tls) for i, port in mtls_ports.items()}
        for client in clients.values():
            assert _topic_error(client, topic) == TOPIC_DENIED

        assert create_acls(admin, [acl_creation(CLIENT, TOPIC, topic, DESCRIBE)]) == [0]
        for broker_id in (2, 3, 1):
            wait_until(lambda: _topic_error(clients[broker_id], topic) == 0,
                       f"broker {broker_id} allowing the new ACL", PROPAGATION_S)

        # kafka-acls.sh unmodified, through another broker, lists it
        tools = kafka_tools_or_none()
        if tools is not None:
            listed = tools.run("kafka-acls.sh", "--bootstrap-server", cluster.brokers[3].bootstrap, "--list",
                               "--topic", topic).stdout
            assert f"(principal={CLIENT}, host=*, operation=DESCRIBE, permissionType=ALLOW)" in listed, listed

        # Kafka's layout in ZooKeeper: the pattern's znode and a change notification naming it
        zk = cluster.zk()
        data, _ = zk.get(f"/kafka-acl/Topic/{topic}")
        assert json.loads(data) == {"version": 1, "acls": [
            {"principal": CLIENT, "permissionType": "Allow", "operation": "Describe", "host": "*"}]}
        notes = [zk.get(f"/kafka-acl-changes/{child}")[0] for child in zk.get_children("/kafka-acl-changes")]
        assert f"TOPIC:{topic}".encode() in notes

        # deleted through broker 2: refused everywhere again
        delete, m = schema(31, 3)
        answer = RawClient(cluster.brokers[2].address).call(delete(filters=(m.DeleteAclsFilter(
            resource_type_filter=TOPIC, resource_name_filter=topic, pattern_type_filter=3, principal_filter=CLIENT,
            host_filter=None, operation=1, permission_type=1),)))
        assert [len(r.matching_acls) for r in answer.filter_results] == [1]
        for broker_id in (1, 3, 2):
            wait_until(lambda: _topic_error(clients[broker_id], topic) == TOPIC_DENIED,
                       f"broker {broker_id} refusing again", PROPAGATION_S)
        assert zk.exists(f"/kafka-acl/Topic/{topic}") is None

        # written straight into ZooKeeper in Kafka's layout (as kafka-acls.sh --authorizer-properties
        # zookeeper.connect=... writes it), beside a znode and a notification that do not decode: the brokers
        # take the good one, skip the others with a warning, and serve on
        zk.create("/kafka-acl/Topic/garbage", b"not json")
        zk.create("/kafka-acl-changes/acl_changes_", b"TOPIC:garbage", sequence=True)
        zk.create("/kafka-acl-changes/acl_changes_", b"no colon here", sequence=True)
        zk.create(f"/kafka-acl/Topic/{topic}", json.dumps({"version": 1, "acls": [
            {"principal": CLIENT, "permissionType": "Allow", "operation": "Read", "host": "*"}]}).encode())
        zk.create("/kafka-acl-changes/acl_changes_", f"TOPIC:{topic}".encode(), sequence=True)
        for broker_id in (1, 2, 3):
            wait_until(lambda: _topic_error(clients[broker_id], topic) == 0,
                       f"broker {broker_id} taking the ACL written to ZooKeeper", PROPAGATION_S)
        log_text = cluster.brokers[2].log_path.read_text()
        assert "skipping ACL znode /kafka-acl/Topic/garbage" in log_text
        zk.delete("/kafka-acl/Topic/garbage")
        zk.delete(f"/kafka-acl/Topic/{topic}")
        zk.create("/kafka-acl-changes/acl_changes_", f"TOPIC:{topic}".encode(), sequence=True)
        for broker_id in (1, 2, 3):
            wait_until(lambda: _topic_error(clients[broker_id], topic) == TOPIC_DENIED,
                       f"broker {broker_id} dropping the ACL deleted in ZooKeeper", PROPAGATION_S)

        # a DeleteAcls and a CreateAcls at once on one pattern, through one broker (its lock) or two (conditional
        # writes, re-read on conflict): each applied to what the other left, as every broker then shows
        admins = {broker_id: RawClient(broker.address) for broker_id, broker in cluster.brokers.items()}
        for round_, (deleting, creating) in enumerate([(1, 1), (1, 2), (2, 2), (3, 1)]):
            swap = f"swap-{round_}"
            assert create_acls(admin, [acl_creation("User:mallory", TOPIC, swap, DESCRIBE)]) == [0]
            for broker_id in {deleting, creating}:
                wait_until(lambda: acl_principals(admins[broker_id], TOPIC, swap) == ["User:mallory"],
                           f"broker {broker_id} showing mallory's ACL", PROPAGATION_S)
            _at_once([(cluster.brokers[deleting].address, delete_acls_request("User:mallory", TOPIC, swap)),
                      (cluster.brokers[creating].address, schema(30, 3)[0](
                          creations=(acl_creation("User:bob", TOPIC, swap, DESCRIBE),)))])
            for broker_id in (1, 2, 3):
                wait_until(lambda: acl_principals(admins[broker_id], TOPIC, swap)
                           == ["User:bob"], f"broker {broker_id} showing bob's ACL alone", PROPAGATION_S)
        for client in admins.values():
            client.close()

        # a broker (re)started later loads what ZooKeeper holds
        assert create_acls(admin, [acl_creation(CLIENT, TOPIC, topic, DESCRIBE)]) == [0]
        clients[3].close()
        cluster.restart(3)
        wait_until(lambda: _topic_error(clients[3], topic) == 0, "the restarted broker allowing", PROPAGATION_S)
        for client in clients.values():
            client.close()

"""Client entity configs (SCRAM credentials and client quotas) in ZooKeeper, as Kafka 3.7.1 keeps them:
read by ZkMetadata at start and on change notifications, fed to the broker's ScramCredentialCache and
ClientQuotas (security/client_entities.py). Kafka's own kafka-configs.sh --zookeeper writes them where it can
run (its ZooKeeper path is how ZooKeeper-mode clusters bootstrap SCRAM users), against a real ZooKeeper."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install kazoo, or the project's test extra)")

import broker_cluster  # noqa: F401 - puts tests/integration (kafka_tools) on sys.path
from pykbroker.cluster.zk_metadata import ZkMetadata
from pykbroker.cluster.zookeeper import KafkaZkClient
from pykbroker.security import client_entities
from pykbroker.security.credentials import ScramCredentialCache, generate_credential, user_config_with
from pykbroker.security.quotas import ClientQuotas, QuotaEntity
from cluster_helpers import wait_for


class Follower:
    """A started ZkMetadata whose client entities feed a credential cache and client quotas (a broker's part)."""

    def __init__(self, zk_connect: str, **metadata_options) -> None:
        self.zk = KafkaZkClient(zk_connect, session_timeout_ms=6000)
        self.metadata = ZkMetadata(self.zk, 1, "cid", inter_broker_listener="PLAINTEXT", **metadata_options)
        self.credentials, self.quotas = ScramCredentialCache(), ClientQuotas()
        client_entities.follow(self.metadata, self.credentials, self.quotas)

    async def __aenter__(self) -> "Follower":
        await self.zk.start()
        await self.metadata.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.metadata.close()
        await self.zk.close()


async def notifications_done(broker: "Follower", last: str) -> None:
    """Until the broker has processed the change notifications up to ``last`` (those present at its start are
    processed after ``start`` returns)."""
    sequence = int(last.rsplit("_", 1)[1])
    await wait_for(lambda: broker.metadata.last_config_change >= sequence, what=f"notification {last} processed")


def scram_config(user_config: dict, password: str) -> dict:
    return user_config_with(user_config, "SCRAM-SHA-256", generate_credential("SCRAM-SHA-256", password))


def test_client_entities_are_read_at_start_and_followed_through_change_notifications(zk_connect, run_async):
    async def main():
        writer = KafkaZkClient(zk_connect, session_timeout_ms=6000)
        await writer.start()
        # Before the broker starts: a user with a credential and a quota, a user+client quota, a client default.
        await writer.set_entity_config("users", "alice", scram_config({"producer_byte_rate": "1024"}, "pw"))
        await writer.set_entity_config("users", "alice/clients/app", {"consumer_byte_rate": "2048"})
        await writer.set_entity_config("clients", "<default>", {"request_percentage": "50.0"})
        broker = Follower(zk_connect)
        heard = []
        broker.metadata.add_client_entity_listener(lambda path, configs: heard.append(path))
        try:
            async with broker:
                credentials, quotas, metadata = broker.credentials, broker.quotas, broker.metadata
                assert set(metadata.client_entity_configs()) == {"users/alice", "users/alice/clients/app",
                                                                 "clients/<default>"}
                assert credentials.get("SCRAM-SHA-256", "alice") is not None
                assert quotas.entity_config(QuotaEntity("alice", None)) == {"producer_byte_rate": "1024"}
                assert quotas.entity_config(QuotaEntity("alice", "app")) == {"consumer_byte_rate": "2048"}
                # Written by another broker (or Kafka's tool) while running: the notification brings it here.
                await writer.set_entity_config("users", "bob%40example.com", scram_config({}, "pw2"))
                await wait_for(lambda: credentials.get("SCRAM-SHA-256", "bob@example.com") is not None,
                               what="bob's credential from the change notification")
                await writer.set_entity_config("users", "alice", {})  # credential and quota removed
                await wait_for(lambda: credentials.get("SCRAM-SHA-256", "alice") is None, what="alice's removal")
                assert quotas.entity_config(QuotaEntity("alice", None)) == {}
                # Written through this broker: applied at once, written conditionally on the version read.
                _, version = await metadata.read_entity_configs_async("clients", "app")
                assert version == -1
                await metadata.set_client_entity_configs_async("clients/app", {"producer_byte_rate": "10"},
                                                               version=version)
                assert quotas.entity_config(QuotaEntity(None, "app")) == {"producer_byte_rate": "10"}
                assert (await writer.get_entity_config("clients", "app")) == {"producer_byte_rate": "10"}
                assert "clients/app" in heard
        finally:
            await writer.close()

    run_async(main(), timeout=60)


def test_a_credential_altered_through_one_broker_reaches_every_brokers_cache(zk_connect, run_async):
    """What AlterUserScramCredentials does through one broker (a conditional write and a notification) reaches
    the credential cache of every broker, which SCRAM logins read (describe reads ZooKeeper, so the cluster
    tests' describes do not show the caches): three brokers' parts in process, the caches checked directly."""
    async def main():
        brokers = [Follower(zk_connect) for _ in range(3)]
        for broker in brokers:
            await broker.__aenter__()
        try:
            first = brokers[0].metadata
            config, version = await first.read_entity_configs_async("users", "erin")
            await first.set_client_entity_configs_async("users/erin", scram_config(config, "pw"), version=version)
            for broker in brokers:
                await wait_for(lambda: broker.credentials.get("SCRAM-SHA-256", "erin") is not None,
                               what="erin's credential in every broker's cache")
            config, version = await brokers[2].metadata.read_entity_configs_async("users", "erin")
            await brokers[2].metadata.set_client_entity_configs_async(
                "users/erin", user_config_with(config, "SCRAM-SHA-256", None), version=version)
            for broker in brokers:
                await wait_for(lambda: broker.credentials.get("SCRAM-SHA-256", "erin") is None,
                               what="erin's credential gone from every broker's cache")
        finally:
            for broker in brokers:
                await broker.__aexit__(None, None, None)

    run_async(main(), timeout=60)


def test_an_unreadable_credential_keeps_the_known_one_and_names_no_secret(zk_connect, run_async, caplog):
    async def main():
        writer = KafkaZkClient(zk_connect, session_timeout_ms=6000)
        await writer.start()
        await writer.set_entity_config("users", "carol", scram_config({}, "pw"))
        try:
            async with Follower(zk_connect) as broker:
                known = broker.credentials.get("SCRAM-SHA-256", "carol")
                assert known is not None
                await writer.set_entity_config("users", "carol", {"SCRAM-SHA-256": "salt=secret-looking,garbage"})
                await wait_for(lambda: "carol" in caplog.text, what="the warning about carol's credential")
                assert broker.credentials.get("SCRAM-SHA-256", "carol") == known
                assert "secret-looking" not in caplog.text
        finally:
            await writer.close()

    run_async(main(), timeout=60)


def test_unreadable_config_znodes_are_entities_without_configs_and_the_broker_starts(zk_connect, run_async, caplog):
    """Kafka's ConfigEntityZNode.decode takes data that is not its JSON as an empty config: one such znode under
    /config/users, /config/clients, /config/ips or /config/brokers does not keep a broker from starting (it
    used to be retried as if ZooKeeper were unreachable, then MetadataStartError). One warning names each
    znode; the readable entities are read; a later write of the entity is taken."""
    async def main():
        writer = KafkaZkClient(zk_connect, session_timeout_ms=6000)
        await writer.start()
        raw = writer.kazoo
        for path, data in (("/config/users/mallory", b"{not json"), ("/config/clients/app", b"\xff\xfe"),
                           ("/config/ips/10.0.0.1", b"[1]"), ("/config/brokers/<default>", b"{oops"),
                           ("/config/topics/t", b'{"version":1,"config":"x"}')):
            await asyncio.to_thread(raw.create, path, data, makepath=True)
        await writer.set_entity_config("users", "alice", scram_config({}, "pw"))
        try:
            async with Follower(zk_connect, start_timeout_s=5) as broker:
                assert broker.credentials.get("SCRAM-SHA-256", "alice") is not None
                assert set(broker.metadata.client_entity_configs()) == {"users/alice"}
                assert broker.metadata.broker_configs("<default>") == {}
                assert await broker.zk.get_topic_config("t") == {}
                for path in ("/config/users/mallory", "/config/clients/app", "/config/ips/10.0.0.1",
                             "/config/brokers/<default>", "/config/topics/t"):
                    assert path in caplog.text
                assert "cannot read the configs" not in caplog.text  # not taken for ZooKeeper being unreachable
                # the unreadable user is overwritten like an entity without configs (its zkVersion read)
                config, version = await broker.metadata.read_entity_configs_async("users", "mallory")
                assert (config, version) == ({}, 0)
                await broker.metadata.set_client_entity_configs_async("users/mallory", scram_config({}, "pw"),
                                                                      version=version)
                assert broker.credentials.get("SCRAM-SHA-256", "mallory") is not None
        finally:
            await writer.close()

    run_async(main(), timeout=60)


def test_a_change_whose_read_fails_is_read_again_not_skipped(zk_connect, run_async):
    """The read a change notification starts loses its connection (injected once: a real ZooKeeper cannot
    time that): the notification is not done, it is processed again (with those after it, in order), so a
    revoked password does not survive on this broker until a restart."""
    from kazoo.exceptions import ConnectionLoss

    async def main():
        writer = KafkaZkClient(zk_connect, session_timeout_ms=6000)
        await writer.start()
        last = await writer.set_entity_config("users", "alice", scram_config({}, "pw"))
        try:
            async with Follower(zk_connect) as broker:
                await notifications_done(broker, last)
                assert broker.credentials.get("SCRAM-SHA-256", "alice") is not None
                real_read, failed = broker.zk.get_entity_config, []

                async def read_losing_the_connection_once(entity_type, name):
                    if (entity_type, name) == ("users", "alice") and not failed:
                        failed.append(name)
                        raise ConnectionLoss()
                    return await real_read(entity_type, name)

                broker.zk.get_entity_config = read_losing_the_connection_once
                await writer.set_entity_config("users", "alice", {})  # alice's password revoked
                await writer.set_entity_config("users", "bob", scram_config({}, "pw2"))  # a later change
                await wait_for(lambda: failed, what="the failed read")
                await wait_for(lambda: broker.credentials.get("SCRAM-SHA-256", "alice") is None,
                               what="alice's revocation read again")
                await wait_for(lambda: broker.credentials.get("SCRAM-SHA-256", "bob") is not None, what="bob")
        finally:
            await writer.close()

    run_async(main(), timeout=60)


def test_after_a_new_zookeeper_session_every_client_entity_is_read_again(zk_connect, run_async, caplog):
    """While a broker's session is expired, a change may come and its notification be purged (15 minutes):
    on the new session every client entity is read again. Here the znode is written without notification and
    the session then expired (a second client with its session id closes it, ZooKeeper's way)."""
    from kazoo.client import KazooClient

    async def main():
        writer = KafkaZkClient(zk_connect, session_timeout_ms=6000)
        await writer.start()
        await writer.set_entity_config("users", "alice", scram_config({}, "pw"))
        last = await writer.set_entity_config("clients", "app", {"producer_byte_rate": "10"})
        try:
            async with Follower(zk_connect) as broker:
                await notifications_done(broker, last)
                assert broker.credentials.get("SCRAM-SHA-256", "alice") is not None
                raw = writer.kazoo
                await asyncio.to_thread(raw.set, "/config/users/alice", b'{"version":1,"config":{}}')
                await asyncio.to_thread(raw.delete, "/config/clients/app")
                heard = []
                broker.zk.add_session_listener(heard.append)
                session_id, password = broker.zk.kazoo.client_id
                hosts = broker.zk.hosts + (broker.zk.chroot or "")

                def expire() -> None:
                    other = KazooClient(hosts=hosts, client_id=(session_id, password), timeout=6)
                    other.start(10)
                    other.stop()
                    other.close()

                await asyncio.to_thread(expire)
                await wait_for(lambda: "RECONNECTED" in heard, timeout=30, what="a new session")
                await wait_for(lambda: broker.credentials.get("SCRAM-SHA-256", "alice") is None,
                               what="alice's credential read again")
                await wait_for(lambda: "clients/app" not in broker.metadata.client_entity_configs(),
                               what="the deleted client entity forgotten")
                assert "session listener failed" not in caplog.text  # the new session's round ran cleanly
        finally:
            await writer.close()

    run_async(main(), timeout=90)


def test_kafkas_own_tool_bootstraps_a_scram_user_in_zookeeper_and_the_broker_checks_its_password(zk_connect, run_async):
    """kafka-configs.sh --zookeeper (Kafka 3.7.1's way to add the first SCRAM users of a ZooKeeper-mode cluster)
    writes /config/users/<user> and a change notification; a running broker takes the credential."""
    from kafka_tools import kafka_tools_or_skip
    from pykbroker.security.credentials import client_key, salted_password, scram_mechanism, stored_key

    tools = kafka_tools_or_skip()

    async def main():
        async with Follower(zk_connect) as broker:
            await asyncio.to_thread(
                tools.run, "kafka-configs.sh", "--zookeeper", zk_connect, "--alter", "--entity-type", "users",
                "--entity-name", "alice", "--add-config",
                "SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=alice-secret]")
            await wait_for(lambda: broker.credentials.get("SCRAM-SHA-512", "alice") is not None,
                           what="alice's credentials")
            for name, iterations in (("SCRAM-SHA-256", 8192), ("SCRAM-SHA-512", 4096)):
                credential = broker.credentials.get(name, "alice")
                mechanism = scram_mechanism(name)
                salted = salted_password(mechanism, "alice-secret", credential.salt, credential.iterations)
                assert credential.iterations == iterations
                assert stored_key(mechanism, client_key(mechanism, salted)) == credential.stored_key

    run_async(main(), timeout=200)



def test_describe_when_zookeeper_cannot_be_read_is_kafkas_error_answer(zk_connect, run_async):
    """DescribeUserScramCredentials reads ZooKeeper (Kafka's describeUserScramCredentials): when listing the
    users fails, the top-level UNKNOWN_SERVER_ERROR with no results; when a named user's read fails, that
    user's error. The failures are injected (kazoo queues requests while disconnected: a stopped server
    makes them wait, not fail)."""
    import types

    from kazoo.exceptions import ConnectionLoss
    from kio.schema.describe_user_scram_credentials.v0 import request as describe_v0

    from pykbroker.protocol.apis import codec_for
    from pykbroker.server.dispatch import RequestContext
    from pykbroker.server.handlers.scram_credentials import (
        UNKNOWN_SERVER_ERROR_MESSAGE, describe_user_scram_credentials)

    async def describe(broker, users):
        body = describe_v0.DescribeUserScramCredentialsRequest(
            users=None if users is None else tuple(describe_v0.UserName(name=u) for u in users))
        envelope = types.SimpleNamespace(api_key=50, api_version=0, body=body, codec=codec_for(50, 0))
        ctx = RequestContext(types.SimpleNamespace(metadata=broker.metadata), envelope, "peer")
        answer = await describe_user_scram_credentials(ctx, body)
        return (answer.error_code, answer.error_message,
                [(r.user, r.error_code, r.error_message, len(r.credential_infos)) for r in answer.results])

    async def lost(*args, **kwargs):
        raise ConnectionLoss()

    async def main():
        async with Follower(zk_connect) as broker:
            await broker.metadata.set_client_entity_configs_async("users/alice", scram_config({}, "pw"))
            await broker.metadata.set_client_entity_configs_async("users/bob", scram_config({}, "pw"))
            assert await describe(broker, None) == (0, "", [("alice", 0, "", 1), ("bob", 0, "", 1)])
            broker.zk.children = lost
            assert await describe(broker, None) == (-1, UNKNOWN_SERVER_ERROR_MESSAGE, [])
            real_read = broker.zk.get_entity_config_versioned

            async def alice_lost(entity_type, name):
                return await (lost() if name == "alice" else real_read(entity_type, name))

            broker.zk.get_entity_config_versioned = alice_lost
            assert await describe(broker, ["alice", "bob"]) == (
                0, "", [("alice", -1, UNKNOWN_SERVER_ERROR_MESSAGE, 0), ("bob", 0, "", 1)])

    run_async(main(), timeout=60)


def test_two_entries_for_one_entity_are_one_conditional_write_that_keeps_a_concurrent_credential(zk_connect, run_async):
    """AlterClientQuotas with two entries for users/alice: one write of the final config, conditional on the
    version read. A SCRAM credential written for alice by someone else right after that write is kept (a second,
    unconditional write of the planned config would have dropped it)."""
    import concurrent.futures
    import types

    from kio.schema.alter_client_quotas.v1 import request as alter_v1
    from kio.static.primitive import f64

    from pykbroker.protocol.apis import codec_for
    from pykbroker.server.dispatch import RequestContext
    from pykbroker.server.handlers.client_quotas import alter_client_quotas

    def entry(key: str, value: float):
        return alter_v1.EntryData(entity=(alter_v1.EntityData(entity_type="user", entity_name="alice"),),
                                  ops=(alter_v1.OpData(key=key, value=f64(float(value)), remove=False),))

    async def main():
        async with Follower(zk_connect) as broker:
            metadata = broker.metadata
            real_write = metadata.set_client_entity_configs_async
            writes = []

            async def write_then_concurrent_credential(path, configs, *, version=None):
                writes.append((path, dict(configs), version))
                await real_write(path, configs, version=version)
                if len(writes) == 1:  # another broker sets alice's credential now, over what is stored
                    stored, stored_version = await metadata.read_entity_configs_async("users", "alice")
                    await real_write("users/alice", scram_config(stored, "pw"), version=stored_version)

            metadata.set_client_entity_configs_async = write_then_concurrent_credential
            body = alter_v1.AlterClientQuotasRequest(
                entries=(entry("producer_byte_rate", 1024), entry("consumer_byte_rate", 2048)), validate_only=False)
            envelope = types.SimpleNamespace(api_key=49, api_version=1, body=body, codec=codec_for(49, 1))
            committed = concurrent.futures.Future()
            committed.set_result(None)  # ZooKeeper writes are durable when done
            ctx = RequestContext(types.SimpleNamespace(metadata=metadata, authorizer=None, topics=types.SimpleNamespace(
                commit=lambda: committed)), envelope, "peer")
            answer = await alter_client_quotas(ctx, body)
            assert [e.error_code for e in answer.entries] == [0]  # one result per entity, as Kafka
            assert writes[0] == ("users/alice", {"producer_byte_rate": "1024", "consumer_byte_rate": "2048"}, -1)
            assert len(writes) == 1  # no second, unconditional quota write
            stored, _ = await metadata.read_entity_configs_async("users", "alice")
            assert stored["producer_byte_rate"] == "1024" and stored["consumer_byte_rate"] == "2048"
            assert "SCRAM-SHA-256" in stored

    run_async(main(), timeout=60)

"""SCRAM credentials managed as Kafka 3.7.1 manages them, on a single broker: DescribeUserScramCredentials and
AlterUserScramCredentials over the raw protocol (every bad input with Kafka's code and message, nothing stored
on error, the broker serving on), Kafka's kafka-configs.sh, confluent-kafka's and kafka-python's admin APIs, the
credentials kept in the metadata journal across a restart next to the user's quota keys, and ``pykbroker scram
add`` for the first user of a data dir no broker runs on.

The raw cases' answers (EXPECTED) are Kafka 3.7.1's in ZooKeeper mode, recorded from the reference kit;
tests/cluster/test_scram_credentials_cluster.py runs the same cases against Kafka (opt-in) and a pykbroker
cluster. Kafka 3.7.1 in KRaft mode (tests/integration/reference_kafka.py) answers several of them differently,
and ZooKeeper mode is followed here (issue 19's reference): KRaft refuses two mechanisms of one user in one
request (DUPLICATE_RESOURCE, so kafka-configs.sh's SCRAM-SHA-256 plus SCRAM-SHA-512 fails there), checks a
deletion before a duplicate, reports the first of a user's errors, answers null messages where ZooKeeper mode
answers "", calls a twice-named empty user a duplicate, and lists every user unsorted."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import struct
import subprocess

import pytest
from kio.schema.alter_user_scram_credentials.v0 import request as alter_v0
from kio.schema.describe_user_scram_credentials.v0 import request as describe_v0
from kio.static.primitive import i8, i32

from broker_process import BrokerProcess, probe_api_versions, send_request
from pykbroker.cluster.metadata import EmbeddedMetadata
from pykbroker.devcluster import child_env, pykbroker_command
from pykbroker.security.credentials import (
    client_key,
    credentials_from_user_config,
    salted_password,
    scram_mechanism,
    stored_key,
)

SHA256, SHA512 = 1, 2
OK, UNKNOWN_SERVER_ERROR = 0, -1
UNSUPPORTED_SASL_MECHANISM, RESOURCE_NOT_FOUND, DUPLICATE_RESOURCE, UNACCEPTABLE_CREDENTIAL = 33, 91, 92, 93


# -- the raw protocol -------------------------------------------------------------------------------------

def upsertion(name: str, mechanism: int = SHA256, iterations: int = 4096, salt: bytes = b"salt",
              salted: bytes | None = None, password: bytes = b"pw"):
    if salted is None:
        salted = hashlib.pbkdf2_hmac("sha256" if mechanism != SHA512 else "sha512", password, salt, max(iterations, 1))
    return alter_v0.ScramCredentialUpsertion(name=name, mechanism=i8(mechanism), iterations=i32(iterations), salt=salt,
                                             salted_password=salted)


def deletion(name: str, mechanism: int = SHA256):
    return alter_v0.ScramCredentialDeletion(name=name, mechanism=i8(mechanism))


def alter(address, upsertions=(), deletions=()) -> list[tuple[str, int, str | None]]:
    response = send_request(address, alter_v0.AlterUserScramCredentialsRequest(
        deletions=tuple(deletions), upsertions=tuple(upsertions)))
    return [(r.user, int(r.error_code), r.error_message) for r in response.results]


def describe(address, users=None):
    """(error code, message, [(user, error code, message, [(mechanism, iterations)])]); users None: all."""
    response = send_request(address, describe_v0.DescribeUserScramCredentialsRequest(
        users=None if users is None else tuple(describe_v0.UserName(name=u) for u in users)))
    return (int(response.error_code), response.error_message,
            [(r.user, int(r.error_code), r.error_message, [(int(c.mechanism), int(c.iterations)) for c in r.credential_infos])
             for r in response.results])


def described(address, user: str) -> list[tuple[int, int]] | None:
    """The (mechanism, iterations) of ``user``'s credentials, None if it has none."""
    _, _, [(_, code, _, infos)] = describe(address, [user])
    return infos if code == OK else None


TOO_FEW, TOO_MANY = "Too few iterations", "Too many iterations"
EMPTY_USER, UNKNOWN_MECHANISM = "Username must not be empty", "Unknown SCRAM mechanism"
TWICE = "A user credential cannot be altered twice in the same request"
NO_SUCH_CREDENTIAL = "Attempt to delete a user credential that does not exist"
UNEXPECTED = "The server experienced an unexpected error when processing the request."

# (label, request) in order: the later ones see what the earlier ones stored.
CASES = [
    ("two mechanisms for one user", lambda a: alter(a, [upsertion("alice", SHA256, 8192), upsertion("alice", SHA512)])),
    ("empty user", lambda a: alter(a, [upsertion("")])),
    ("empty user deleted", lambda a: alter(a, deletions=[deletion("")])),
    ("mechanism 0 (UNKNOWN)", lambda a: alter(a, [upsertion("u0", 0)])),
    ("mechanism 3", lambda a: alter(a, [upsertion("u3", 3)])),
    ("mechanism -1", lambda a: alter(a, [upsertion("um", -1)])),
    ("deletion of mechanism 3", lambda a: alter(a, deletions=[deletion("u3", 3)])),
    ("4095 iterations", lambda a: alter(a, [upsertion("few", SHA256, 4095)])),
    ("16385 iterations", lambda a: alter(a, [upsertion("many", SHA512, 16385)])),
    ("negative iterations", lambda a: alter(a, [upsertion("neg", SHA256, -5, salted=b"abc")])),
    ("empty salted password", lambda a: alter(a, [upsertion("esp", SHA256, salted=b"")])),
    ("empty salt", lambda a: alter(a, [upsertion("esalt", SHA256, salt=b"")])),
    ("one-byte salted password", lambda a: alter(a, [upsertion("ssp", SHA256, salted=b"x")])),
    ("the same credential twice", lambda a: alter(a, [upsertion("dup"), upsertion("dup")])),
    ("upserted and deleted at once", lambda a: alter(a, [upsertion("dup2")], [deletion("dup2")])),
    ("deletion of a missing user's", lambda a: alter(a, deletions=[deletion("nobody")])),
    ("deletion of both of alice's", lambda a: alter(a, deletions=[deletion("alice", SHA256), deletion("alice", SHA512)])),
    ("a user's errors: the last upsertion's", lambda a: alter(a, [upsertion("mix", SHA256, 100), upsertion("mix", SHA512, 99999)],
                                                             [deletion("mix", 7)])),
    ("a user's errors: the upsertion's", lambda a: alter(a, [upsertion("mix2", 7, 100)], [deletion("mix2")])),
    ("nothing", lambda a: alter(a)),
    ("16384 iterations", lambda a: alter(a, [upsertion("bob", SHA512, 16384)])),
    ("describe null", lambda a: describe(a, None)),
    ("describe empty", lambda a: describe(a, [])),
    ("describe a user twice", lambda a: describe(a, ["alice", "alice", "bob"])),
    ("describe the empty user", lambda a: describe(a, ["", "", "bob"])),
    ("describe a user without credentials", lambda a: describe(a, ["nobody", "esalt"])),
]
EVERY_USER = (OK, "", [("bob", OK, "", [(SHA512, 16384)]), ("esalt", OK, "", [(SHA256, 4096)]),
                       ("ssp", OK, "", [(SHA256, 4096)])])
EXPECTED = {
    "two mechanisms for one user": [("alice", OK, "")],
    "empty user": [("", UNACCEPTABLE_CREDENTIAL, EMPTY_USER)],
    "empty user deleted": [("", UNACCEPTABLE_CREDENTIAL, EMPTY_USER)],
    "mechanism 0 (UNKNOWN)": [("u0", UNSUPPORTED_SASL_MECHANISM, UNKNOWN_MECHANISM)],
    "mechanism 3": [("u3", UNSUPPORTED_SASL_MECHANISM, UNKNOWN_MECHANISM)],
    "mechanism -1": [("um", UNSUPPORTED_SASL_MECHANISM, UNKNOWN_MECHANISM)],
    "deletion of mechanism 3": [("u3", UNSUPPORTED_SASL_MECHANISM, UNKNOWN_MECHANISM)],
    "4095 iterations": [("few", UNACCEPTABLE_CREDENTIAL, TOO_FEW)],
    "16385 iterations": [("many", UNACCEPTABLE_CREDENTIAL, TOO_MANY)],
    "negative iterations": [("neg", UNACCEPTABLE_CREDENTIAL, TOO_FEW)],
    "empty salted password": [("esp", UNKNOWN_SERVER_ERROR, UNEXPECTED)],
    "empty salt": [("esalt", OK, "")],
    "one-byte salted password": [("ssp", OK, "")],
    "the same credential twice": [("dup", DUPLICATE_RESOURCE, TWICE)],
    "upserted and deleted at once": [("dup2", DUPLICATE_RESOURCE, TWICE)],
    "deletion of a missing user's": [("nobody", RESOURCE_NOT_FOUND, NO_SUCH_CREDENTIAL)],
    "deletion of both of alice's": [("alice", OK, "")],
    "a user's errors: the last upsertion's": [("mix", UNACCEPTABLE_CREDENTIAL, TOO_MANY)],
    "a user's errors: the upsertion's": [("mix2", UNSUPPORTED_SASL_MECHANISM, UNKNOWN_MECHANISM)],
    "nothing": [],
    "16384 iterations": [("bob", OK, "")],
    # nothing of a refused request was stored: only bob, esalt and ssp have credentials
    "describe null": EVERY_USER,
    "describe empty": EVERY_USER,
    "describe a user twice": (OK, "", [
        ("alice", DUPLICATE_RESOURCE,
         "Cannot describe SCRAM credentials for the same user twice in a single request: alice", []),
        ("bob", OK, "", [(SHA512, 16384)])]),
    "describe the empty user": (OK, "", [("", RESOURCE_NOT_FOUND, EMPTY_USER, []), ("bob", OK, "", [(SHA512, 16384)])]),
    "describe a user without credentials": (OK, "", [
        ("nobody", RESOURCE_NOT_FOUND, "Attempt to describe a user credential that does not exist: nobody", []),
        ("esalt", OK, "", [(SHA256, 4096)])]),
}


def run_cases(address) -> dict:
    return {label: request(address) for label, request in CASES}


def test_answers_are_kafkas_and_a_refused_request_stores_nothing(broker):
    assert run_cases(broker.address) == EXPECTED
    probe_api_versions(broker.address)  # still serving
    assert "Traceback" not in broker.log_tail(400)


def test_a_garbage_upsertion_costs_its_connection_only(broker):
    """A frame whose AlterUserScramCredentials body cannot be read: that connection is closed, nothing stored,
    everyone else served."""
    header = struct.pack(">hhih", 51, 0, 5, 4) + b"test" + b"\x00"  # header v2: api, version, id, client id, tags
    body = b"\x01\x02\x06alice\x01\xff\xff\xff\xff\x7f"  # no deletions, one upsertion cut short
    with socket.create_connection(broker.address, timeout=30) as sock:
        sock.sendall(struct.pack(">i", len(header + body)) + header + body)
        try:
            first = sock.recv(4)  # b"": the broker closed the connection (EOF)
        except ConnectionResetError:
            first = b""
        except socket.timeout:
            pytest.fail("neither closed nor reset within 30 s: a broken request must cost its connection")
    assert first == b"", "a broken request must cost its connection, not be answered"
    assert describe(broker.address) == (OK, "", [])
    assert alter(broker.address, [upsertion("alice")]) == [("alice", OK, "")]


def _journal_user(data_dir, user: str) -> dict[str, str]:
    """users/<user>'s entity config as the (stopped) broker's journal has it."""
    metadata = EmbeddedMetadata(data_dir, 1, "localhost", 0)
    try:
        return metadata.client_entity_configs().get(f"users/{user}", {})
    finally:
        metadata.close()


def _checks_password(config: dict[str, str], mechanism_name: str, password: str) -> bool:
    credential = credentials_from_user_config(config)[mechanism_name]
    mechanism = scram_mechanism(mechanism_name)
    salted = salted_password(mechanism, password, credential.salt, credential.iterations)
    return stored_key(mechanism, client_key(mechanism, salted)) == credential.stored_key


def test_credentials_survive_a_restart_and_the_users_quota_keys_are_kept(tmp_path):
    broker = BrokerProcess(tmp_path / "broker")
    broker.data_dir.mkdir(parents=True)
    seed = EmbeddedMetadata(broker.data_dir, 1, "localhost", 0)  # a quota of alice's, there before her credential
    asyncio.run(seed.set_client_entity_configs_async("users/alice", {"producer_byte_rate": "1024"}))
    seed.commit().result()
    seed.close()
    with broker:  # started
        assert alter(broker.address, [upsertion("alice", SHA256, 8192, password=b"alice-secret")]) == [("alice", OK, "")]
        broker.restart()
        assert described(broker.address, "alice") == [(SHA256, 8192)]
        assert alter(broker.address, [upsertion("alice", SHA512, 4096, password=b"alice-512")]) == [("alice", OK, "")]
        broker.stop()
        config = _journal_user(broker.data_dir, "alice")
        assert config["producer_byte_rate"] == "1024"
        assert _checks_password(config, "SCRAM-SHA-256", "alice-secret")
        assert _checks_password(config, "SCRAM-SHA-512", "alice-512")
        assert not _checks_password(config, "SCRAM-SHA-512", "alice-secret")
        broker.start()
        assert alter(broker.address, deletions=[deletion("alice", SHA256), deletion("alice", SHA512)]) == [("alice", OK, "")]
        assert described(broker.address, "alice") is None
        broker.stop()
        assert _journal_user(broker.data_dir, "alice") == {"producer_byte_rate": "1024"}


def test_an_unreadable_stored_credential_is_that_users_error_and_never_shown(tmp_path):
    """A credential string Kafka could not read (written by another tool): describing the user answers
    UNKNOWN_SERVER_ERROR for that user only (Kafka's ApiError for the IllegalArgumentException); the value is in
    no answer and no log line; the other users are described."""
    broker = BrokerProcess(tmp_path / "broker")
    broker.data_dir.mkdir(parents=True)
    seed = EmbeddedMetadata(broker.data_dir, 1, "localhost", 0)
    asyncio.run(seed.set_client_entity_configs_async("users/zed", {"SCRAM-SHA-256": "salt=secret-looking,garbage"}))
    seed.commit().result()
    seed.close()
    with broker:  # started
        assert alter(broker.address, [upsertion("amy")]) == [("amy", OK, "")]
        assert describe(broker.address, ["zed", "amy"]) == (OK, "", [
            ("zed", UNKNOWN_SERVER_ERROR, UNEXPECTED, []), ("amy", OK, "", [(SHA256, 4096)])])
        assert describe(broker.address)[2] == [("amy", OK, "", [(SHA256, 4096)]), ("zed", UNKNOWN_SERVER_ERROR, UNEXPECTED, [])]
        assert "secret-looking" not in broker.log_tail(400) and "zed" in broker.log_tail(400)


# -- clients and tools ------------------------------------------------------------------------------------

def test_kafka_configs_adds_and_deletes_credentials(broker):
    from kafka_tools import kafka_tools_or_skip

    tools = kafka_tools_or_skip()
    common = ("--bootstrap-server", broker.bootstrap, "--entity-type", "users", "--entity-name", "alice")
    out = tools.run("kafka-configs.sh", "--alter", "--add-config",
                    "SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=alice-secret]",
                    *common)
    assert "Completed updating config for user alice." in out.stdout
    assert described(broker.address, "alice") == [(SHA256, 8192), (SHA512, 4096)]
    tools.run("kafka-configs.sh", "--alter", "--delete-config", "SCRAM-SHA-512", *common)
    assert described(broker.address, "alice") == [(SHA256, 8192)]
    bad = tools.run("kafka-configs.sh", "--alter", "--add-config", "SCRAM-SHA-256=[iterations=100,password=x]",
                    *common, check=False)
    assert bad.returncode != 0 and "Iterations 100 is less than the minimum 4096" in bad.stderr  # the tool's check
    assert described(broker.address, "alice") == [(SHA256, 8192)]


def test_kafka_configs_describes_users(broker):
    """kafka-configs.sh --describe --entity-type users also asks DescribeClientQuotas (client quotas, another
    part of issue 19): this test needs a broker that serves both."""
    from kafka_tools import kafka_tools_or_skip

    tools = kafka_tools_or_skip()
    if 48 not in {api.api_key for api in probe_api_versions(broker.address).api_keys}:
        pytest.skip("this broker does not serve DescribeClientQuotas yet, which kafka-configs.sh --describe needs")
    assert sorted(alter(broker.address, [upsertion("alice", SHA256, 8192), upsertion("bob", SHA512)])) == [
        ("alice", OK, ""), ("bob", OK, "")]
    one = tools.run("kafka-configs.sh", "--bootstrap-server", broker.bootstrap, "--describe", "--entity-type", "users",
                    "--entity-name", "alice").stdout
    assert "SCRAM credential configs for user-principal 'alice' are SCRAM-SHA-256=iterations=8192" in one
    every = tools.run("kafka-configs.sh", "--bootstrap-server", broker.bootstrap, "--describe",
                      "--entity-type", "users").stdout
    assert "user-principal 'alice' are SCRAM-SHA-256=iterations=8192" in every
    assert "user-principal 'bob' are SCRAM-SHA-512=iterations=4096" in every


def test_confluent_kafka_admin_client(broker):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion("dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 10000), b"dave-pw"),
        UserScramCredentialDeletion("nobody", ScramMechanism.SCRAM_SHA_512),
        UserScramCredentialUpsertion("low", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 10), b"pw"),
    ])
    assert futures["dave"].result(10) is None
    for user, code, message in (("nobody", KafkaError.RESOURCE_NOT_FOUND, NO_SUCH_CREDENTIAL),
                                ("low", KafkaError.UNACCEPTABLE_CREDENTIAL, TOO_FEW)):
        with pytest.raises(Exception) as failed:
            futures[user].result(10)
        assert failed.value.args[0].code() == code and failed.value.args[0].str() == message
    description = admin.describe_user_scram_credentials(["dave"])["dave"].result(10)
    assert [(info.mechanism, info.iterations) for info in description.scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_256, 10000)]
    everyone = admin.describe_user_scram_credentials().result(10)
    assert set(everyone) == {"dave"}
    with pytest.raises(Exception) as missing:
        admin.describe_user_scram_credentials(["nobody"])["nobody"].result(10)
    assert missing.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND


def test_kafka_python_admin_client(broker):
    from kafka import KafkaAdminClient
    from kafka.admin import ScramMechanism, UserScramCredentialDeletion, UserScramCredentialUpsertion

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
    try:
        assert admin.alter_user_scram_credentials([
            UserScramCredentialUpsertion("erin", ScramMechanism.SCRAM_SHA_512, "erin-pw", iterations=8192),
            UserScramCredentialDeletion("frank", ScramMechanism.SCRAM_SHA_256),
        ]) == {"erin": None, "frank": NO_SUCH_CREDENTIAL}
        assert admin.describe_user_scram_credentials(["erin"]) == {
            "erin": {"error": None, "credential_infos": [{"mechanism": ScramMechanism.SCRAM_SHA_512, "iterations": 8192}]}}
        assert set(admin.describe_user_scram_credentials()) == {"erin"}
    finally:
        admin.close()


# -- pykbroker scram add: the first user, no broker running ---------------------------------------------------

def scram_add(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(pykbroker_command("scram", "add", *args), env=child_env(), capture_output=True, text=True,
                          timeout=120)


def test_scram_add_bootstraps_the_first_user_of_a_data_dir(tmp_path):
    broker = BrokerProcess(tmp_path / "broker")
    done = scram_add("--data-dir", str(broker.data_dir), "SCRAM-SHA-256=[name=admin,password=admin-secret]",
                     'SCRAM-SHA-512=[name=admin,iterations=8192,salt="c2FsdA==",saltedpassword="YWJj"]')
    assert done.returncode == 0, done.stderr
    assert "admin-secret" not in done.stdout + done.stderr
    assert "Stored the SCRAM-SHA-256 credential of user 'admin' (4096 iterations)" in done.stdout
    with broker:  # started
        assert described(broker.address, "admin") == [(SHA256, 4096), (SHA512, 8192)]
        # a running broker's data dir is refused, and left as it was
        refused = scram_add("--data-dir", str(broker.data_dir), "SCRAM-SHA-256=[name=eve,password=x]")
        assert refused.returncode == 1
        assert f"{broker.data_dir} is locked by a running broker" in refused.stderr
        assert described(broker.address, "eve") is None
        probe_api_versions(broker.address)
        broker.stop()
    config = _journal_user(broker.data_dir, "admin")
    assert _checks_password(config, "SCRAM-SHA-256", "admin-secret")


def test_scram_add_keeps_the_users_other_configs(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    seed = EmbeddedMetadata(data_dir, 1, "localhost", 0)
    asyncio.run(seed.set_client_entity_configs_async("users/ops%40corp", {"request_percentage": "50.0"}))
    seed.commit().result()
    seed.close()
    for argument in ("SCRAM-SHA-256=[name=ops@corp,password=first]", "SCRAM-SHA-512=[name=ops@corp,password=second]",
                     "SCRAM-SHA-256=[name=ops@corp,password=third]"):
        done = scram_add("--data-dir", str(data_dir), argument)
        assert done.returncode == 0, done.stderr
    config = _journal_user(data_dir, "ops%40corp")  # Kafka's Sanitizer: '@' is %40 in the entity name
    assert config["request_percentage"] == "50.0"
    assert _checks_password(config, "SCRAM-SHA-256", "third") and _checks_password(config, "SCRAM-SHA-512", "second")


@pytest.mark.parametrize(("argument", "message"), [
    ("SCRAM-SHA-1=[name=admin,password=x]", "The add-scram mechanism SCRAM-SHA-1 is not supported."),
    ("SCRAM-SHA-256=[password=x]", "You must supply 'name' to add-scram"),
    ("SCRAM-SHA-256=[name=admin]", "You must supply one of 'password' or 'saltedpassword' to add-scram"),
    ('SCRAM-SHA-256=[name=admin,iterations=100,salt="c2FsdA==",saltedpassword="YWJj"]',
     "The 'iterations' value must be >= 4096 for add-scram"),
    # what Kafka's StorageTool would silently store as something else: refused, the key named, no value shown
    ("SCRAM-SHA-256=[name=admin,password=pass s3cr3t]", "the item of 'password' holds whitespace"),
    ("SCRAM-SHA-256=[name=admin,password=pa=s3cr3t]", "the value of 'password' holds an '=' outside double quotes"),
    ("SCRAM-SHA-256=[name=admin,password=abc,s3cr3t]", "the item after 'password' has no '='"),
    ("SCRAM-SHA-256=name=admin,password=s3cr3t", "must be SCRAM-SHA-256=[key=value,...] (in brackets)"),
])
def test_scram_add_refuses_bad_arguments_and_stores_nothing(tmp_path, argument, message):
    refused = scram_add("--data-dir", str(tmp_path / "data"), argument)
    assert refused.returncode == 2 and message in " ".join(refused.stderr.split()), refused.stderr
    assert "s3cr3t" not in refused.stderr and "Stored" not in refused.stdout
    assert not (tmp_path / "data").exists()


def test_scram_add_refuses_a_cluster_brokers_data_dir_and_an_unreachable_zookeeper(tmp_path):
    data_dir = tmp_path / "cluster-broker"
    data_dir.mkdir()
    (data_dir / "meta.properties").write_text("version=0\nbroker.id=2\ncluster.id=abc\n")  # a ZooKeeper-mode broker's
    refused = scram_add("--data-dir", str(data_dir), "SCRAM-SHA-256=[name=admin,password=x]")
    assert refused.returncode == 1
    assert "belongs to a broker of a ZooKeeper cluster" in refused.stderr and "use --zookeeper" in refused.stderr
    assert sorted(p.name for p in data_dir.iterdir() if p.name != ".lock") == ["meta.properties"]

    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    refused = scram_add("--zookeeper", f"127.0.0.1:{port}", "--timeout", "2", "SCRAM-SHA-256=[name=admin,password=x]")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        f"Error: cannot connect to ZooKeeper 127.0.0.1:{port} within 2 s (KazooTimeoutError: Connection time-out)"]


# -- the credential cache SCRAM logins read (in process) -----------------------------------------------------

def test_the_brokers_credential_cache_follows_the_api_and_the_journal(tmp_path):
    """What AlterUserScramCredentials stores is what the broker's ScramCredentialCache (SASL/SCRAM logins) has, at
    once and after a restart; a deletion removes it; the user's quota stays with the client quotas."""
    import types

    from pykbroker.config import BrokerConfig
    from pykbroker.protocol.apis import codec_for
    from pykbroker.security.quotas import QuotaEntity
    from pykbroker.server.broker import Broker
    from pykbroker.server.dispatch import RequestContext
    from pykbroker.server.handlers.scram_credentials import alter_user_scram_credentials

    def started() -> Broker:
        broker = Broker(BrokerConfig(data_dir=tmp_path, port=0))
        broker.load()
        return broker

    async def call(broker, upsertions=(), deletions=()):
        request = alter_v0.AlterUserScramCredentialsRequest(deletions=tuple(deletions), upsertions=tuple(upsertions))
        envelope = types.SimpleNamespace(api_key=51, api_version=0, body=request, codec=codec_for(51, 0))
        response = await alter_user_scram_credentials(RequestContext(broker, envelope, "peer"), request)
        return [(r.user, r.error_code) for r in response.results]

    def cached_password_checks(broker, password: str) -> bool:
        credential = broker.scram_credentials.get("SCRAM-SHA-512", "grace")
        mechanism = scram_mechanism("SCRAM-SHA-512")
        salted = salted_password(mechanism, password, credential.salt, credential.iterations)
        return stored_key(mechanism, client_key(mechanism, salted)) == credential.stored_key

    async def first_run():
        broker = started()
        await broker.metadata.set_client_entity_configs_async("users/grace", {"consumer_byte_rate": "2048"})
        assert await call(broker, [upsertion("grace", SHA512, 8192, password=b"grace-pw")]) == [("grace", OK)]
        assert cached_password_checks(broker, "grace-pw") and not cached_password_checks(broker, "other")
        assert broker.scram_credentials.get("SCRAM-SHA-512", "grace").iterations == 8192
        await broker.stop()

    async def second_run():
        broker = started()
        assert cached_password_checks(broker, "grace-pw")  # from the journal
        assert broker.quotas.entity_config(QuotaEntity("grace", None)) == {"consumer_byte_rate": "2048"}
        assert await call(broker, deletions=[deletion("grace", SHA512)]) == [("grace", OK)]
        assert broker.scram_credentials.get("SCRAM-SHA-512", "grace") is None
        assert broker.quotas.entity_config(QuotaEntity("grace", None)) == {"consumer_byte_rate": "2048"}
        await broker.stop()

    asyncio.run(first_run())
    asyncio.run(second_run())

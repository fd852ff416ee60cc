"""SCRAM credentials as Kafka 3.7 stores them: the RFC 5802 key derivation (checked with the RFC's own test
vector), ScramCredentialUtils' string, the /config/users/<user> entity config, Kafka's Sanitizer, the
KIP-554 upsertion rules and the broker's credential cache."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest

from pykbroker.security import credentials as cred
from pykbroker.security.credentials import (
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    CredentialError,
    ScramCredential,
    ScramCredentialCache,
    ScramMechanism,
)

b64 = base64.b64decode


def test_rfc5802_test_vector_key_derivation():
    """RFC 5802 section 5 (SCRAM-SHA-1, user/pencil): the client proof and server signature follow from our
    salted password, client/stored/server keys; SHA-1 is not a Kafka mechanism, the arithmetic is the same."""
    sha1 = ScramMechanism("SCRAM-SHA-1", "sha1", 0)
    salt, iterations = b64("QSXCR+Q6sek8bf92"), 4096
    salted = cred.salted_password(sha1, "pencil", salt, iterations)
    credential = cred.credential_from_salted_password(sha1, salt, salted, iterations)
    auth_message = (b"n=user,r=fyko+d2lbbFgONRv9qkxdawL,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,"
                    b"s=QSXCR+Q6sek8bf92,i=4096,c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j")
    client_key = cred.client_key(sha1, salted)
    assert cred.stored_key(sha1, client_key) == credential.stored_key
    signature = hmac.new(credential.stored_key, auth_message, "sha1").digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature))
    assert base64.b64encode(proof) == b"v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
    assert base64.b64encode(hmac.new(credential.server_key, auth_message, "sha1").digest()) == \
        b"rmF9pqV8S7suAoZWja4dJRkFsKQ="


def test_rfc7677_test_vector_key_derivation():
    salt = b64("W22ZaJ0SNY7soEsUEjb6gQ==")
    c = cred.generate_credential("SCRAM-SHA-256", "pencil", 4096, salt=salt)
    auth_message = (b"n=user,r=rOprNGfwEbeRWgbNEkqO,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    assert base64.b64encode(hmac.new(c.server_key, auth_message, "sha256").digest()) == \
        b"6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    proof = b64("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    signature = hmac.new(c.stored_key, auth_message, "sha256").digest()
    assert hashlib.sha256(bytes(a ^ b for a, b in zip(signature, proof))).digest() == c.stored_key


def test_string_codec_is_scram_credential_utils():
    c = ScramCredential(b"salt-bytes", b"\x01" * 32, b"\x02" * 32, 8192)
    text = cred.credential_to_string(c)
    assert text == ("salt=c2FsdC1ieXRlcw==,stored_key=AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=,"
                    "server_key=AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=,iterations=8192")
    assert cred.credential_from_string(text) == c
    # field order does not matter when reading
    reordered = ",".join(reversed(text.split(",")))
    assert cred.credential_from_string(reordered) == c


@pytest.mark.parametrize("text", [
    "", "salt=AA==", "salt=AA==,stored_key=AA==,server_key=AA==",
    "salt=AA==,stored_key=AA==,server_key=AA==,iterations=4096,extra=1",
    "salt=AA==,stored_key=AA==,server_key=AA==,iteration=4096",
    "salt=AA==,stored_key=AA==,server_key=AA==,iterations=many",
    "salt=!!,stored_key=AA==,server_key=AA==,iterations=4096",
    "=AA==,stored_key=AA==,server_key=AA==,iterations=4096",
    "salt=AA==,stored_key=AA==,server_key=AA==,iterations=99999999999",
])
def test_bad_credential_strings_are_refused_without_echoing_them(text):
    with pytest.raises(CredentialError) as e:
        cred.credential_from_string(text)
    assert "Credentials not valid" in str(e.value)
    assert "AA==" not in str(e.value)


def test_generated_credential_matches_a_client_derivation():
    c = cred.generate_credential(SCRAM_SHA_512, "alice-secret", 4096)
    assert c.salt.isascii() and c.salt.isalnum() and len(c.salt) >= 20  # Kafka's base-36 random salt
    salted = hashlib.pbkdf2_hmac("sha512", b"alice-secret", c.salt, 4096)
    client_key = hmac.new(salted, b"Client Key", "sha512").digest()
    assert c.stored_key == hashlib.sha512(client_key).digest()
    assert c.server_key == hmac.new(salted, b"Server Key", "sha512").digest()
    assert cred.generate_credential(SCRAM_SHA_512, "alice-secret").salt != c.salt


def test_generate_refuses_out_of_range_iterations():
    with pytest.raises(ValueError):
        cred.generate_credential("SCRAM-SHA-256", "x", 4095)
    with pytest.raises(ValueError):
        cred.generate_credential("SCRAM-SHA-256", "x", 16385)
    with pytest.raises(ValueError, match="Unknown SCRAM mechanism"):
        cred.generate_credential("SCRAM-SHA-1", "x")


def test_repr_never_shows_keys():
    c = cred.generate_credential("SCRAM-SHA-256", "x")
    assert base64.b64encode(c.stored_key).decode() not in repr(c)
    assert c.stored_key.hex() not in repr(c)


def test_user_config_as_kafka_writes_it_in_zookeeper():
    c256 = cred.generate_credential("SCRAM-SHA-256", "alice-secret", 8192)
    config = cred.user_config_with({"producer_byte_rate": "1024"}, "SCRAM-SHA-256", c256)
    node = {"version": 1, "config": config}  # the entity-config envelope of /config/users/<user>
    doc = json.loads(json.dumps(node))
    assert doc["config"]["producer_byte_rate"] == "1024"
    assert doc["config"]["SCRAM-SHA-256"].startswith("salt=") and doc["config"]["SCRAM-SHA-256"].endswith(
        ",iterations=8192")
    assert cred.credentials_from_user_config(doc["config"]) == {"SCRAM-SHA-256": c256}
    removed = cred.user_config_with(config, "SCRAM-SHA-256", None)
    assert removed == {"producer_byte_rate": "1024"}
    with pytest.raises(ValueError):
        cred.user_config_with(config, "PLAIN", c256)


def test_user_config_through_the_zookeeper_codec():
    zookeeper = pytest.importorskip("pykbroker.cluster.zookeeper")
    c = cred.generate_credential("SCRAM-SHA-512", "pw")
    data = zookeeper.encode_topic_config(cred.user_config_with({}, "SCRAM-SHA-512", c))
    assert json.loads(data) == {"version": 1, "config": {"SCRAM-SHA-512": cred.credential_to_string(c)}}
    assert cred.credentials_from_user_config(zookeeper.decode_topic_config(data)) == {"SCRAM-SHA-512": c}


@pytest.mark.parametrize("user, znode", [
    ("alice", "alice"), ("User One", "User%20One"), ("a*b", "a%2Ab"), ("a+b", "a%2Bb"), ("a/b", "a%2Fb"),
    ("CN=x,O=y", "CN%3Dx%2CO%3Dy"), ("\u00e9", "%C3%A9"), ("a.b-c_d", "a.b-c_d"), ("t~", "t%7E"),
])
def test_sanitize_is_kafkas_sanitizer(user, znode):
    assert cred.sanitize(user) == znode
    assert cred.desanitize(znode) == user
    assert cred.user_config_path(user) == f"/config/users/{znode}"


def test_upsertion_rules_are_zk_admin_managers():
    assert cred.validate_upsertion("", 1, 4096) == (93, "Username must not be empty")  # Kafka 3.7.1 (ZooKeeper mode)
    assert cred.validate_upsertion("u", 0, 4096) == (33, "Unknown SCRAM mechanism")
    assert cred.validate_upsertion("u", 3, 4096) == (33, "Unknown SCRAM mechanism")
    assert cred.validate_upsertion("u", 1, 4095) == (93, "Too few iterations")
    assert cred.validate_upsertion("u", 2, 16385) == (93, "Too many iterations")
    assert cred.validate_upsertion("u", 2, 16384) is None
    assert cred.validate_deletion("u", 9) == (33, "Unknown SCRAM mechanism")
    assert cred.validate_deletion("", 1) == (93, "Username must not be empty")
    assert cred.mechanism_for_type(1) is SCRAM_SHA_256 and cred.mechanism_for_type(2) is SCRAM_SHA_512


def test_upsertion_credential_from_the_clients_salted_password():
    """KIP-554: the admin client sends salt + SaltedPassword; the broker keeps the same credential a password
    would have given."""
    salt = b"client-chosen-salt"
    salted = hashlib.pbkdf2_hmac("sha256", b"bob-secret", salt, 8192)
    from_upsertion = cred.credential_from_salted_password(SCRAM_SHA_256, salt, salted, 8192)
    assert from_upsertion == cred.generate_credential(SCRAM_SHA_256, "bob-secret", 8192, salt=salt)


def test_cache_updates_from_user_configs():
    cache = ScramCredentialCache()
    c = cred.generate_credential("SCRAM-SHA-256", "pw")
    cache.update_user("alice", {"SCRAM-SHA-256": cred.credential_to_string(c), "consumer_byte_rate": "5"})
    assert cache.get("SCRAM-SHA-256", "alice") == c
    assert cache.get("SCRAM-SHA-512", "alice") is None
    assert cache.describe("alice") == [(1, 4096)]
    with pytest.raises(CredentialError):
        cache.update_user("alice", {"SCRAM-SHA-256": "garbage"})
    assert cache.get("SCRAM-SHA-256", "alice") == c  # a bad update keeps the old credential
    cache.update_user("alice", {"consumer_byte_rate": "5"})
    assert cache.get("SCRAM-SHA-256", "alice") is None and cache.users() == []
    cache.put("SCRAM-SHA-512", "bob", c)
    cache.remove_user("bob")
    assert cache.get("SCRAM-SHA-512", "bob") is None


def test_add_scram_argument_as_kafka_storage_reads_it():
    user, mech, c = cred.parse_add_scram("SCRAM-SHA-256=[name=alice,password=alice-secret]")
    assert (user, mech, c.iterations) == ("alice", SCRAM_SHA_256, 4096)
    assert c == cred.generate_credential(mech, "alice-secret", 4096, salt=c.salt)
    salted = hashlib.pbkdf2_hmac("sha512", b"pw", b"7q", 8192)
    spec = f'SCRAM-SHA-512=[name=bob,iterations=8192,salt="N3E=",saltedpassword="{base64.b64encode(salted).decode()}"]'
    user, mech, c = cred.parse_add_scram(spec)
    assert (user, mech, c.salt, c.iterations) == ("bob", SCRAM_SHA_512, b"7q", 8192)
    assert c == cred.generate_credential(mech, "pw", 8192, salt=b"7q")
    # Kafka 3.7.1 reads 'iterations' only together with 'salt'
    assert cred.parse_add_scram("SCRAM-SHA-256=[name=c,iterations=8192,password=x]")[2].iterations == 4096
    assert cred.parse_add_scram('SCRAM-SHA-256=[name=d,password="a=b"]')[2] is not None
    # base64 padding outside quotes is padding (Java's split drops the trailing empty strings)
    assert cred.parse_add_scram(
        "SCRAM-SHA-512=[name=e,iterations=8192,salt=N3E=,saltedpassword=YCE=]")[2].salt == b"7q"


@pytest.mark.parametrize("spec, message", [
    ("SCRAM-SHA-1=[name=a,password=b]", "The add-scram mechanism SCRAM-SHA-1 is not supported."),
    ("", "The add-scram mechanism  is not supported."),
    ("SCRAM-SHA-256=[password=b]", "You must supply 'name' to add-scram"),
    ("SCRAM-SHA-256=[name=a]", "You must supply one of 'password' or 'saltedpassword' to add-scram"),
    ("SCRAM-SHA-256=[name=a,password=b,saltedpassword=AA==]",
     "You must only supply one of 'password' or 'saltedpassword' to add-scram"),
    ("SCRAM-SHA-256=[name=a,saltedpassword=AA==]", "You must supply 'salt' with 'saltedpassword' to add-scram"),
    ("SCRAM-SHA-256=[name=a,salt=AA==,iterations=100,password=b]",
     "The 'iterations' value must be >= 4096 for add-scram"),
    ("SCRAM-SHA-256=[name=a,salt=AA==,iterations=20000,password=b]",
     "The 'iterations' value must be <= 16384 for add-scram"),
    ("SCRAM-SHA-256=[name=a,salt=AA==,password=b]", "The 'iterations' value must be a number"),
    ("SCRAM-SHA-256=[name=a,salt=!!,iterations=4096,password=b]", "The 'salt' value must be base64"),
    ("SCRAM-SHA-256=[name=a,junk]", "expected key=value"),
    # where Kafka would store something else than typed: refused, naming the key, never showing a value
    ("SCRAM-SHA-256=[name=a,password=pass s3cr3t]", "the item of 'password' holds whitespace"),  # Kafka: "pas"
    ("SCRAM-SHA-256=[name=a,password=pass\ts3cr3t]", "the item of 'password' holds whitespace"),
    ("SCRAM-SHA-256=[name=a,password=s3=cr3t]", "the value of 'password' holds an '=' outside double quotes"),
    ("SCRAM-SHA-256=[name=a,password=s3cr3t=]", "the value of 'password' holds an '=' outside double quotes"),
    ("SCRAM-SHA-256=[name=a=b,password=x]", "the value of 'name' holds an '=' outside double quotes"),
    ("SCRAM-SHA-256=[name=a,password=abc,s3cr3t]", "the item after 'password' has no '='"),  # a ',' in it
    ("SCRAM-SHA-256=[s3cr3t]", "the first item has no '='"),
    ("SCRAM-SHA-256=name=a,password=s3cr3t", "must be SCRAM-SHA-256=[key=value,...] (in brackets)"),
    ("SCRAM-SHA-256=[name=a,password=s3cr3t", "must be SCRAM-SHA-256=[key=value,...] (in brackets)"),
    ("s3cr3t]", "An add-scram argument must be SCRAM-SHA-256=[key=value,...]"),  # split off by the shell
])
def test_add_scram_errors(spec, message):
    with pytest.raises(ValueError) as e:
        cred.parse_add_scram(spec)
    assert message in str(e.value)
    assert "s3cr3t" not in str(e.value) and "cr3t" not in str(e.value)


def test_an_empty_salted_password_is_refused_and_an_empty_salt_taken_as_kafka_does():
    """Kafka 3.7.1's ScramFormatter keys an HMAC with the salted password: Java refuses an empty key (the
    upsertion fails with UNKNOWN_SERVER_ERROR); an empty salt makes a credential."""
    with pytest.raises(ValueError, match="Empty key"):
        cred.credential_from_salted_password(SCRAM_SHA_256, b"salt", b"", 4096)
    assert cred.credential_from_salted_password(SCRAM_SHA_256, b"", b"x", 4096).salt == b""

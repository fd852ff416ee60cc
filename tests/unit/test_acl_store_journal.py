"""The single-node ACL store: each resource pattern's whole ACL set as one "acl" record of the metadata
journal, kept in the snapshot when the journal is compacted, loaded into the authorizer's cache at start;
a malformed record or snapshot section refuses to load (as the journal's other records), and a stored set
that no longer decodes is skipped with a warning (the other patterns load)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from pykbroker.cluster import metadata_log
from pykbroker.cluster.acls import EmbeddedAclStore
from pykbroker.cluster.metadata import EmbeddedMetadata
from pykbroker.cluster.metadata_log import JOURNAL_FILE, SNAPSHOT_FILE, encode_record
from pykbroker.log.checkpoint import CorruptFile
from pykbroker.security.acl import (
    AccessControlEntry, AclOperation, AclPermissionType, PatternType, ResourcePattern, ResourceType,
)
from pykbroker.security.authorizer import AclCache

ORDERS = ResourcePattern(ResourceType.TOPIC, "orders", PatternType.LITERAL)
PAY = ResourcePattern(ResourceType.TOPIC, "pay", PatternType.PREFIXED)


def entry(principal: str, operation=AclOperation.READ) -> AccessControlEntry:
    return AccessControlEntry(principal, "*", operation, AclPermissionType.ALLOW)


def changing(add=(), remove=()):
    """The change adding ``add`` to a pattern's ACL set and removing ``remove`` from it."""
    return lambda current: (current | frozenset(add)) - frozenset(remove)


def open_store(path) -> tuple[EmbeddedMetadata, EmbeddedAclStore]:
    metadata = EmbeddedMetadata(path, 1, "127.0.0.1", 9092)
    store = EmbeddedAclStore(metadata, AclCache())
    asyncio.run(store.start())
    return metadata, store


def test_acls_survive_a_restart_through_the_journal_and_the_snapshot(tmp_path, monkeypatch):
    monkeypatch.setattr(metadata_log, "SNAPSHOT_MIN_RECORDS", 10)
    metadata, store = open_store(tmp_path)

    async def changes() -> None:
        await store.update(ORDERS, changing([entry("User:alice"), entry("User:bob")]))
        await store.update(PAY, changing([entry("User:carol", AclOperation.WRITE)]))
        for i in range(30):  # enough records to compact the journal into a snapshot
            await store.update(ORDERS, changing([entry(f"User:u{i}")], [entry(f"User:u{i - 1}")] if i else []))
        await store.update(ORDERS, changing(remove=[entry("User:bob")]))

    asyncio.run(changes())
    expected = dict(store.cache.items())
    assert expected[ORDERS] == {entry("User:alice"), entry("User:u29")}
    metadata.close()
    assert (tmp_path / SNAPSHOT_FILE).exists()
    assert "acls" in json.loads((tmp_path / SNAPSHOT_FILE).read_text())
    metadata, store = open_store(tmp_path)
    assert dict(store.cache.items()) == expected
    asyncio.run(store.update(PAY, changing(remove=[entry("User:carol", AclOperation.WRITE)])))  # the last entry: pattern gone
    metadata.close()
    metadata, store = open_store(tmp_path)
    assert PAY not in store.cache and ORDERS in store.cache
    metadata.close()


def test_a_malformed_acl_record_refuses_to_load(tmp_path):
    metadata, _ = open_store(tmp_path)
    metadata.close()
    with open(tmp_path / JOURNAL_FILE, "ab") as journal:
        journal.write(encode_record({"op": "acl", "pattern": ["TOPIC", "LITERAL"], "acls": []}))
    with pytest.raises(CorruptFile):
        EmbeddedMetadata(tmp_path, 1, "127.0.0.1", 9092)


def test_a_stored_set_that_does_not_decode_is_skipped_with_a_warning(tmp_path, caplog):
    metadata, _ = open_store(tmp_path)
    metadata.close()
    with open(tmp_path / JOURNAL_FILE, "ab") as journal:
        journal.write(encode_record({"op": "acl", "pattern": ["TOPIC", "LITERAL", "bad"],
                                     "acls": [{"principal": "no-type", "permissionType": "Allow",
                                               "operation": "Read", "host": "*"}]}))
        journal.write(encode_record({"op": "acl", "pattern": ["TOPIC", "LITERAL", "good"],
                                     "acls": [{"principal": "User:a", "permissionType": "Allow",
                                               "operation": "Read", "host": "*"}]}))
    with caplog.at_level(logging.WARNING, logger="pykbroker.cluster.acls"):
        metadata, store = open_store(tmp_path)
    assert [pattern.name for pattern, _ in store.cache.items()] == ["good"]
    assert "skipping the metadata journal's ACLs of TOPIC:LITERAL:bad" in caplog.text
    metadata.close()

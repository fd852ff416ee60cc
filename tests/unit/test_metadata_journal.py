"""EmbeddedMetadata and its journal: replay, snapshots, torn tails, damage, migration, name collisions."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from pykbroker.cluster import metadata_log
from pykbroker.cluster.metadata import EmbeddedMetadata
from pykbroker.cluster.metadata_log import JOURNAL_FILE, LEGACY_FILE, SNAPSHOT_FILE, MetadataLog, encode_record
from pykbroker.log.checkpoint import CorruptFile


def open_store(path) -> EmbeddedMetadata:
    return EmbeddedMetadata(path, 1, "127.0.0.1", 9092)


def state(store: EmbeddedMetadata) -> dict:
    return {info.name: info.to_json() for info in store.topics()}


def test_changes_survive_a_restart_through_the_journal(tmp_path):
    store = open_store(tmp_path)
    store.create_topic("a", 2, 1, {"retention.ms": "1000"})
    store.create_topic("b", 1, 1, {})
    store.add_partitions("a", 4)
    store.set_topic_configs("b", {"segment.bytes": "4096"})
    store.delete_topic("a")
    store.create_topic("a", 1, 1, {})
    store.commit().result(10)
    before = state(store)
    store.close()
    assert not (tmp_path / SNAPSHOT_FILE).exists()  # a few changes: journal only
    reopened = open_store(tmp_path)
    assert state(reopened) == before
    assert reopened.partition_count() == 2
    reopened.close()


def test_the_journal_is_compacted_into_a_snapshot(tmp_path, monkeypatch):
    monkeypatch.setattr(metadata_log, "SNAPSHOT_MIN_RECORDS", 10)
    store = open_store(tmp_path)
    for i in range(5):
        store.create_topic(f"t{i}", 1, 1, {})
    for i in range(30):  # more records than max(10, 2 x topics)
        store.set_topic_configs("t0", {"retention.ms": str(i)})
        store.commit()
    store.commit().result(10)
    before = state(store)
    store.close()
    assert (tmp_path / SNAPSHOT_FILE).exists()
    assert len((tmp_path / JOURNAL_FILE).read_bytes().splitlines()) <= 10
    reopened = open_store(tmp_path)
    assert state(reopened) == before
    reopened.close()


def test_replaying_old_records_on_a_newer_snapshot_is_harmless(tmp_path):
    """A crash between writing the snapshot and emptying the journal replays records the snapshot has."""
    store = open_store(tmp_path)
    store.create_topic("x", 1, 1, {})
    store.delete_topic("x")
    store.create_topic("x", 3, 1, {})
    store.create_topic("y", 1, 1, {})
    store.commit().result(10)
    before = state(store)
    store.close()
    journal = (tmp_path / JOURNAL_FILE).read_bytes()
    (tmp_path / SNAPSHOT_FILE).write_text(json.dumps({"version": 1, "topics": list(before.values())}))
    (tmp_path / JOURNAL_FILE).write_bytes(journal)
    reopened = open_store(tmp_path)
    assert state(reopened) == before
    reopened.close()


def test_a_torn_tail_is_cut_with_a_warning(tmp_path, caplog):
    store = open_store(tmp_path)
    store.create_topic("kept", 1, 1, {})
    store.close()
    whole = (tmp_path / JOURNAL_FILE).read_bytes()
    for torn in (encode_record({"op": "topic", "topic": {}})[:-9], b"\0" * 64):
        (tmp_path / JOURNAL_FILE).write_bytes(whole + torn)
        with caplog.at_level(logging.WARNING):
            reopened = open_store(tmp_path)
        assert list(state(reopened)) == ["kept"]
        assert "torn" in caplog.text
        reopened.close()
        assert (tmp_path / JOURNAL_FILE).read_bytes() == whole


@pytest.mark.parametrize("damage", [b"garbage\n", b"00000000 {}\n"])
def test_a_damaged_whole_record_refuses_to_load(tmp_path, damage):
    store = open_store(tmp_path)
    store.create_topic("kept", 1, 1, {})
    store.close()
    whole = (tmp_path / JOURNAL_FILE).read_bytes()
    (tmp_path / JOURNAL_FILE).write_bytes(damage + whole)
    with pytest.raises(CorruptFile) as caught:
        open_store(tmp_path)
    assert str(tmp_path / JOURNAL_FILE) in str(caught.value) and "\n" not in str(caught.value)


def test_a_record_with_a_good_crc_but_a_bad_topic_refuses_to_load(tmp_path):
    (tmp_path / JOURNAL_FILE).write_bytes(encode_record({"op": "topic", "topic": {"name": "t"}}))
    with pytest.raises(CorruptFile, match="malformed topic entry"):
        open_store(tmp_path)


def test_a_legacy_metadata_file_is_converted_once(tmp_path):
    legacy = {"version": 1, "topics": [{
        "name": "old", "topic_id": "6f1e2d8c-6ed2-4a51-9df7-0d7d8c1d2b3a",
        "partitions": [{"leader": 1, "leader_epoch": 0, "replicas": [1], "isr": [1]}], "configs": {}}]}
    (tmp_path / LEGACY_FILE).write_text(json.dumps(legacy, indent=1))
    store = open_store(tmp_path)
    assert state(store) == {"old": legacy["topics"][0]}
    store.close()
    assert not (tmp_path / LEGACY_FILE).exists()
    assert json.loads((tmp_path / SNAPSHOT_FILE).read_text())["topics"] == legacy["topics"]


@pytest.mark.parametrize("text,problem", [
    (b"cluster.id=abc\nnode.id=x\n", "not a number"),
    (b"node.id=1\n", "no cluster.id"),
    (b"cluster.id=abc\nthis line is wrong\n", "line 2"),
    (b"\xff\xfe", "not text"),
    (b"cluster.id=abc\nnode.id=2\n", "belongs to broker 2"),
])
def test_bad_meta_properties_refuse_with_one_line(tmp_path, text, problem):
    (tmp_path / "meta.properties").write_bytes(text)
    with pytest.raises(CorruptFile) as caught:
        open_store(tmp_path)
    assert problem in str(caught.value) and "meta.properties" in str(caught.value)


def test_colliding_topics_use_kafkas_dot_underscore_rule(tmp_path):
    store = open_store(tmp_path)
    store.create_topic("a.b", 1, 1, {})
    store.create_topic("a-b", 1, 1, {})
    assert store.colliding_topics("a_b") == ["a.b"]
    assert store.colliding_topics("a.b") == []
    assert store.colliding_topics("a-b") == []
    store.delete_topic("a.b")
    assert store.colliding_topics("a_b") == []
    store.close()


def test_commit_with_nothing_buffered_is_already_done(tmp_path):
    log = MetadataLog(tmp_path)
    log.load()
    assert log.commit(0, list).done()
    log.close()


def test_a_failed_journal_write_is_undone_and_retried_with_the_next_commit(tmp_path, monkeypatch):
    store = open_store(tmp_path)
    store.create_topic("first", 1, 1, {})
    real_fsync = metadata_log.os.fsync
    monkeypatch.setattr(metadata_log.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(28, "No space left")))
    with pytest.raises(OSError):
        store.commit().result(10)
    assert (tmp_path / JOURNAL_FILE).read_bytes() == b""  # cut back: no half record
    monkeypatch.setattr(metadata_log.os, "fsync", real_fsync)
    store.create_topic("second", 1, 1, {})
    store.commit().result(10)
    store.close()
    reopened = open_store(tmp_path)
    assert sorted(state(reopened)) == ["first", "second"]
    reopened.close()


def _disk_full(fd, data):
    raise OSError(28, "No space left on device")


def test_a_failed_write_with_no_later_change_is_retried_and_kept_at_close(tmp_path, monkeypatch):
    """The reviewer's repro: the journal write fails, space returns, nothing else changes, clean shutdown."""
    store = open_store(tmp_path)
    real_write = metadata_log.os.write
    monkeypatch.setattr(metadata_log.os, "write", _disk_full)
    store.create_topic("t", 1, 1, {})
    with pytest.raises(OSError):
        store.commit().result(10)
    monkeypatch.setattr(metadata_log.os, "write", real_write)
    store.close()  # nothing new pending: the final attempt writes the failed records
    reopened = open_store(tmp_path)
    assert list(state(reopened)) == ["t"]
    reopened.close()


def test_a_commit_with_nothing_new_after_a_failure_tries_again(tmp_path, monkeypatch):
    store = open_store(tmp_path)
    real_write = metadata_log.os.write
    monkeypatch.setattr(metadata_log.os, "write", _disk_full)
    store.create_topic("t", 1, 1, {})
    failed = store.commit()
    with pytest.raises(OSError):
        failed.result(10)
    again = store.commit()  # e.g. a CreateTopics whose topics all exist: it appends nothing
    with pytest.raises(OSError):
        again.result(10)
    assert again is not failed
    monkeypatch.setattr(metadata_log.os, "write", real_write)
    assert store.commit().result(10) is None
    assert store.commit().done()  # written: nothing to retry
    store.close()
    reopened = open_store(tmp_path)
    assert list(state(reopened)) == ["t"]
    reopened.close()


def test_changes_still_not_durable_at_close_are_reported_as_lost(tmp_path, monkeypatch, caplog):
    store = open_store(tmp_path)
    monkeypatch.setattr(metadata_log.os, "write", _disk_full)
    store.create_topic("t", 1, 1, {})
    with caplog.at_level(logging.ERROR):
        store.close()
    lost = [r for r in caplog.records if r.levelno == logging.ERROR and "lost" in r.getMessage()]
    assert len(lost) == 1 and JOURNAL_FILE in lost[0].getMessage()


def test_client_entity_configs_are_journalled_snapshotted_and_told(tmp_path, monkeypatch):
    """users/<u>, users/<u>/clients/<c>, clients/<c> and ips/<ip> configs (SCRAM credentials, quotas) survive
    restarts through the journal and the snapshot; listeners hear each change, {} for a removal."""
    monkeypatch.setattr(metadata_log, "SNAPSHOT_MIN_RECORDS", 10)
    store = open_store(tmp_path)
    heard = []
    store.add_client_entity_listener(lambda path, configs: heard.append((path, configs)))
    run = lambda coro: asyncio.run(coro)  # noqa: E731
    run(store.set_client_entity_configs_async("users/alice", {"producer_byte_rate": "1024"}))
    run(store.set_client_entity_configs_async("users/%3Cdefault%3E/clients/app", {"consumer_byte_rate": "5"}))
    run(store.set_client_entity_configs_async("clients/<default>", {"request_percentage": "50.0"}))
    run(store.set_client_entity_configs_async("ips/127.0.0.1", {"connection_creation_rate": "3"}))
    run(store.set_broker_configs_async("<default>", {"log.retention.ms": "1000"}))
    assert heard[0] == ("users/alice", {"producer_byte_rate": "1024"})
    store.commit().result(10)
    store.close()
    expected = {"users/alice": {"producer_byte_rate": "1024"},
                "users/%3Cdefault%3E/clients/app": {"consumer_byte_rate": "5"},
                "clients/<default>": {"request_percentage": "50.0"},
                "ips/127.0.0.1": {"connection_creation_rate": "3"}}
    reopened = open_store(tmp_path)  # from the journal
    assert reopened.client_entity_configs() == expected
    assert reopened.broker_configs("<default>") == {"log.retention.ms": "1000"}  # not taken for a client entity
    assert run(reopened.read_entity_configs_async("users", "alice")) == ({"producer_byte_rate": "1024"}, None)
    run(reopened.set_client_entity_configs_async("users/alice", {}))
    for i in range(30):  # past the snapshot threshold
        run(reopened.set_client_entity_configs_async("clients/app", {"producer_byte_rate": str(i)}))
        reopened.commit()
    reopened.commit().result(10)
    reopened.close()
    assert (tmp_path / SNAPSHOT_FILE).exists()
    again = open_store(tmp_path)  # from the snapshot
    del expected["users/alice"]
    assert again.client_entity_configs() == {**expected, "clients/app": {"producer_byte_rate": "29"}}
    with pytest.raises(ValueError):
        run(again.set_client_entity_configs_async("topics/x", {"a": "b"}))
    again.close()


def test_a_config_record_of_an_unknown_entity_refuses_to_load(tmp_path):
    store = open_store(tmp_path)
    store.commit().result(10)
    store.close()
    with open(tmp_path / JOURNAL_FILE, "ab") as f:
        f.write(encode_record({"op": "config", "entity": "widgets/g", "config": {"a": "b"}}))
    with pytest.raises(CorruptFile):
        open_store(tmp_path)

"""Kafka's ReplicaAssignment arithmetic (RS/ORS/TRS/AR/RR), validateReplicas and the legacy
/admin/reassign_partitions document (cluster/reassignment.py).

Run: python3 -m pytest -q tests/unit/test_reassignment_model.py
"""

from __future__ import annotations

import json

import pytest

from pykbroker.cluster.reassignment import (
    ReplicaAssignment,
    decode_reassignment_znode,
    encode_reassignment_znode,
    invalid_replicas,
)


def test_reassign_to_puts_the_target_first_and_names_adding_and_removing_replicas():
    moving = ReplicaAssignment((1, 2)).reassign_to([2, 3])
    assert moving == ReplicaAssignment((2, 3, 1), adding=(3,), removing=(1,))
    assert moving.origin == (2, 1) and moving.target == (2, 3) and moving.being_reassigned
    # A new target while moving: the origin stays what it was, the replica added before is no longer wanted.
    again = moving.reassign_to([4, 2])
    assert again == ReplicaAssignment((4, 2, 1), adding=(4,), removing=(1,))
    # Cancel = back to the origin, in the full set's order (as Kafka).
    assert moving.reassign_to(list(moving.origin)) == ReplicaAssignment((2, 1))
    assert not ReplicaAssignment((1, 2)).reassign_to([1, 2]).being_reassigned


def test_invalid_replicas_gives_kafkas_messages():
    assert invalid_replicas([], (), {1}) == "Empty replica list specified in partition reassignment."
    assert invalid_replicas([1, 1], (), {1}) == \
        "Duplicate replica ids in partition reassignment replica list: List(1, 1)"
    assert invalid_replicas([-1, 2], (), {1, 2}) == "Invalid broker id in replica list: List(-1, 2)"
    assert invalid_replicas([1, 9], (9,), {1, 2}) == \
        "Replica assignment has brokers that are not alive. Replica list: List(9), live broker list: Set(1, 2)"
    assert invalid_replicas([2, 1], (2,), {1, 2}) is None


def test_the_legacy_document_round_trips_and_garbage_is_refused():
    doc = {("t", 0): [2, 3], ("u", 4): [1]}
    data = encode_reassignment_znode(doc)
    assert json.loads(data) == {"version": 1, "partitions": [
        {"topic": "t", "partition": 0, "replicas": [2, 3]}, {"topic": "u", "partition": 4, "replicas": [1]}]}
    assert decode_reassignment_znode(data) == doc
    for garbage in (b"{", b"[]", b'{"partitions":[{"topic":"t"}]}'):
        with pytest.raises(ValueError):
            decode_reassignment_znode(garbage)

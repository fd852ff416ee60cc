"""Replay the 14 captured client conversations (stock clients against Apache Kafka 3.7.1) against a fresh
pykbroker each, and require the same answers by structure: error codes at every level, the same
topics and partitions, the same offsets, high watermarks and fetched records.

How the replay works, what is patched and what is ignored: tests/wire_replay.py. The few exchanges that
cannot match yet are listed below with their reason; anything else that differs fails the test with
file, seq, connection, API and the path of the differing field. An allow-list entry whose exchanges
all match fails too, so the list only ever shrinks.
"""

from __future__ import annotations

import pytest

from tests import wire_replay as wr

GROUPS = "classic consumer-group membership (JoinGroup/SyncGroup/Heartbeat/LeaveGroup) is the next issue"
GENERATION = ("commits with the member id and generation a JoinGroup assigned: needs group membership "
              "(next issue)")

_GROUP_APIS = {
    "05-java-consumer-group.jsonl": ("JoinGroup", "SyncGroup", "LeaveGroup"),
    "09-kafka-python-defaults.jsonl": ("JoinGroup", "SyncGroup", "LeaveGroup"),
    "10-confluent-defaults.jsonl": ("JoinGroup", "SyncGroup", "Heartbeat", "LeaveGroup"),  # consumer B only
    "11-aiokafka.jsonl": ("JoinGroup", "SyncGroup", "LeaveGroup"),
    "13-kafkajs.jsonl": ("JoinGroup", "SyncGroup", "LeaveGroup"),
}
_GENERATION_COMMITS = {  # OffsetCommit requests carrying generation >= 0 (the simple commits of 10 are not here)
    "05-java-consumer-group.jsonl": (29, 31),
    "09-kafka-python-defaults.jsonl": (48, 50),
    "10-confluent-defaults.jsonl": (99,),
    "11-aiokafka.jsonl": (39, 41),
    "13-kafkajs.jsonl": (26, 28, 30),
}

EXPECTED_UNSUPPORTED: tuple[wr.Allowance, ...] = (
    *(wr.Allowance(capture, api, GROUPS) for capture, apis in _GROUP_APIS.items() for api in apis),
    *(wr.Allowance(capture, "OffsetCommit", GENERATION, seq=seq)
      for capture, seqs in _GENERATION_COMMITS.items() for seq in seqs),
)

# Starting state per file (index.md, "Recreate the preconditions"). By default the scenario's topic is
# created with 3 partitions and the records its clients fetched without producing them are written first.
SPECIAL_PRECONDITIONS = {
    # The Admin client creates the topic itself (CreateTopics is part of the conversation).
    "01-java-admin.jsonl": wr.Preconditions(),
    # 50 more records (setup producer id 10 in the capture) between the two Spark runs; run 2 starts at seq 88.
    "07-spark-stream-availablenow.jsonl": wr.Preconditions(
        create_topics=("s07b-spark-stream-availablenow",), later_producers={10: 88}),
    # 50 more records (setup producer id 13) after consumer A closed; consumer B connects at seq 65.
    "10-confluent-defaults.jsonl": wr.Preconditions(
        create_topics=("s10-confluent-defaults",), later_producers={13: 65}),
    # The CLI tools only ask for offsets: the 200 setup records are generated like the capture helper's.
    "14-kafka-cli-admin-3.7.1.jsonl": wr.Preconditions(
        create_topics=("s14-kafka-cli-admin",), generated_records=200),
}


def preconditions_for(capture: wr.Capture) -> wr.Preconditions:
    default = wr.Preconditions(create_topics=tuple(sorted(capture.scenario_topics())))
    return SPECIAL_PRECONDITIONS.get(capture.name, default)


CAPTURE_PATHS = wr.capture_paths()


def test_every_allow_list_entry_names_requests_of_its_capture():
    captures = {path.name: wr.load_capture(path) for path in CAPTURE_PATHS}
    for allowance in EXPECTED_UNSUPPORTED:
        covered = [f for f in captures[allowance.capture].requests() if allowance.covers(allowance.capture, f)]
        assert covered, f"{allowance} covers no request"


@pytest.mark.parametrize("path", CAPTURE_PATHS, ids=lambda path: path.stem)
def test_replayed_conversation_gets_kafkas_answers(path, broker):
    capture = wr.load_capture(path)
    result = wr.replay(capture, broker.address, preconditions=preconditions_for(capture),
                       allowances=EXPECTED_UNSUPPORTED)
    print(result.report())  # every difference, allowed ones and notes included (pytest -s, or on failure)
    problems = result.summary()
    problems += [f"allow-list entry no longer needed, its exchanges match Kafka now: {allowance}"
                 for allowance in result.stale_allowances()]
    assert result.exchanges_compared > 0
    assert not problems, (f"{len(result.failures)} differences from Kafka 3.7.1 ({len(problems)} kinds):\n"
                          + "\n".join(problems))

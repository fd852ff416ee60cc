"""A consume-transform-produce application (exactly-once, confluent-kafka), run as its own process by
test_transactions_eos.py, which kills it with SIGKILL mid-transaction and starts it again.

    python3 txn_eos_worker.py BOOTSTRAP IN_TOPIC OUT_TOPIC GROUP TRANSACTIONAL_ID BATCH PAUSE_MS

init_transactions() first (it fences a previous incarnation with the same transactional.id and aborts its open
transaction), then a read_committed consumer of GROUP assigned every IN_TOPIC partition, starting at the group's
committed offsets. Each transaction: up to BATCH input records, each produced to OUT_TOPIC transformed ("in-N"
-> "out-N", same key), a flush (the records are in the output log, uncommitted), PAUSE_MS of "work" with the
transaction open, the consumed positions sent with send_offsets_to_transaction, commit. Stdout, one line each,
flushed: "ready", "open N" (transaction N produced and flushed), "committed N", "done" (every partition's
position reached the input's end: exit 0).
"""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

TIMEOUT_S = 60.0


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> int:
    bootstrap, in_topic, out_topic, group, transactional_id = sys.argv[1:6]
    batch, pause = int(sys.argv[6]), int(sys.argv[7]) / 1000.0
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5,
                         "transaction.timeout.ms": 60000})
    producer.init_transactions(TIMEOUT_S)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100})
    partitions = consumer.list_topics(in_topic, timeout=TIMEOUT_S).topics[in_topic].partitions
    assignment = [TopicPartition(in_topic, p) for p in sorted(partitions)]
    ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=TIMEOUT_S)[1] for tp in assignment}
    # The committed offsets (OffsetFetch require_stable: answered once the previous incarnation's transaction,
    # aborted by init_transactions above, has no pending offsets any more).
    starts = consumer.committed(assignment, timeout=TIMEOUT_S)
    consumer.assign([TopicPartition(in_topic, tp.partition, tp.offset if tp.offset >= 0 else 0) for tp in starts])
    positions = {tp.partition: max(tp.offset, 0) for tp in starts}
    say("ready")
    number = 0
    while any(positions[p] < ends[p] for p in ends):
        records = []
        deadline = time.monotonic() + 1.0
        while len(records) < batch and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=batch - len(records), timeout=0.1):
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"consumer error: {msg.error()}")
                records.append(msg)
        if not records:
            continue
        number += 1
        producer.begin_transaction()
        for msg in records:
            producer.produce(out_topic, key=msg.key(), value=msg.value().replace(b"in-", b"out-", 1))
            positions[msg.partition()] = msg.offset() + 1
        if producer.flush(TIMEOUT_S) != 0:
            raise RuntimeError("output not delivered")
        say(f"open {number}")
        time.sleep(pause)  # the transaction's "work": it stays open in the logs meanwhile
        producer.send_offsets_to_transaction(
            [TopicPartition(in_topic, p, offset) for p, offset in sorted(positions.items())],
            consumer.consumer_group_metadata(), TIMEOUT_S)
        producer.commit_transaction(TIMEOUT_S)
        say(f"committed {number}")
    consumer.close()
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())

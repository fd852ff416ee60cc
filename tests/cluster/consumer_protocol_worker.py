"""One confluent-kafka consumer with ``group.protocol=consumer`` in a process of its own, for the fault test
(test_consumer_protocol_faults.py), so that it can be SIGKILLed and SIGSTOPped for real.

    python3 consumer_protocol_worker.py BOOTSTRAP TOPIC GROUP JOURNAL

It subscribes, and for each batch it polls: writes every record to JOURNAL ("R <t> <partition> <offset>
<value>", flushed before the commit), then commits the batch's offsets synchronously ("C <t> <partition>
<offset>" per partition once acknowledged, "F <t> <error>" when refused). The rebalance callbacks log "A <t>
<partitions>" (assigned), "V <t> <partitions>" (revoked: the processed offsets are committed first) and
"L <t> <partitions>" (lost: nothing can be committed); "M <t> <member id>" whenever librdkafka's member id
changes (so the test can find this worker's heartbeat answers). SIGTERM: close() (a leave with epoch -1), "X <t>",
exit 0. At-least-once: a record is journaled before its offset is committed.
"""

from __future__ import annotations

import signal
import sys
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition


def main(bootstrap: str, topic: str, group: str, journal_path: str) -> int:
    journal = open(journal_path, "a", buffering=1)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    processed: dict[int, int] = {}  # partition -> next offset processed and not yet committed
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "reconnect.backoff.max.ms": 1000, "topic.metadata.refresh.interval.ms": 2000,
        "max.poll.interval.ms": 30000,  # the member's rebalance timeout in the consumer protocol
    })

    def note(kind: str, text: str) -> None:
        journal.write(f"{kind} {time.time():.6f} {text}\n")

    def commit() -> None:
        if not processed:
            return
        offsets = [TopicPartition(topic, p, o) for p, o in sorted(processed.items())]
        try:
            answered = consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            note("F", str(exc.args[0]).replace("\n", " "))
            return
        for tp in answered or ():
            if tp.error is None:
                note("C", f"{tp.partition} {tp.offset}")
                processed.pop(tp.partition, None)
            else:
                note("F", f"{tp.partition} {tp.error}".replace("\n", " "))

    def parts(partitions) -> str:
        return ",".join(str(tp.partition) for tp in partitions) or "-"

    def on_assign(_consumer, partitions) -> None:
        note("A", parts(partitions))

    def on_revoke(_consumer, partitions) -> None:
        commit()
        for tp in partitions:
            processed.pop(tp.partition, None)
        note("V", parts(partitions))

    def on_lost(_consumer, partitions) -> None:
        for tp in partitions:
            processed.pop(tp.partition, None)
        note("L", parts(partitions))

    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    note("S", "started")
    member_id = None
    while not stop:
        messages = consumer.consume(num_messages=200, timeout=0.3)
        if consumer.memberid() and consumer.memberid() != member_id:
            member_id = consumer.memberid()
            note("M", member_id)
        for message in messages:
            if message.error():
                continue
            note("R", f"{message.partition()} {message.offset()} {message.value().decode()}")
            processed[message.partition()] = message.offset() + 1
        commit()
    consumer.close()
    note("X", "closed")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))

"""How closely a client quota holds a producer to its rate, and whether another client keeps its own.

    python3 integration/bench/quota_bench.py                       # pykbroker, 1 MB/s quota, 60 s
    python3 integration/bench/quota_bench.py --target kafka        # the same against Kafka 3.7.1 (reference kit)
    python3 integration/bench/quota_bench.py --quota 200000 --seconds 90 --warmup 25

On a fresh broker: a topic, then ``producer_byte_rate`` for client id "limited" (AlterClientQuotas v1, the
request kafka-configs.sh sends). First the "free" producer alone for --baseline seconds (its rate without
competition), then "limited" and "free" side by side for --seconds: confluent-kafka producers sending 1 KiB
values as fast as they may (acks=1, linger 5 ms, 64 KiB batches). Rates count acknowledged value bytes per
second after the warm-up (--warmup, longer than Kafka's 11 s quota window, whose first burst a quota allows);
Kafka meters the whole request, so the limited rate is a little under the quota. Prints a table and one JSON
line; not a test (nothing asserts; exit 1 only when a broker failed). Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from brokers import BrokerProcess, KafkaBroker, _recv_exactly, kafka_unavailable_reason  # noqa: E402
from kio.index import load_response_from_request  # noqa: E402
from kio.schema.alter_client_quotas.v1.request import (  # noqa: E402
    AlterClientQuotasRequest, EntityData, EntryData, OpData,
)
from kio.serial import entity_reader  # noqa: E402
from kio.static.primitive import f64  # noqa: E402

from pykbroker.protocol.client import encode_request  # noqa: E402

VALUE = b"q" * 1024


def set_quota(host: str, port: int, client_id: str, rate: int) -> None:
    request = AlterClientQuotasRequest(entries=(EntryData(
        entity=(EntityData(entity_type="client-id", entity_name=client_id),),
        ops=(OpData(key="producer_byte_rate", value=f64(float(rate)), remove=False),)),), validate_only=False)
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(encode_request(request, 1, "quota-bench"))
        (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
        payload = _recv_exactly(sock, size)
    response_type = load_response_from_request(AlterClientQuotasRequest)
    _, header_size = entity_reader(response_type.__header_schema__)(payload, 0)
    response, _ = entity_reader(response_type)(payload, header_size)
    error = response.entries[0].error_code
    if error != 0:
        raise SystemExit(f"AlterClientQuotas failed: {error!r} {response.entries[0].error_message}")


def produce(bootstrap: str, topic: str, client_id: str, seconds: float, acked: list, throttles: list, *,
            config: dict | None = None) -> None:
    """A confluent-kafka producer sending 1 KiB values as fast as it may for ``seconds``, then flushing;
    ``acked`` gets (monotonic time, value bytes) per delivery, ``throttles`` each throttle event's time (ms).
    tests/integration/test_client_quotas.py runs it too."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "acks": 1, "linger.ms": 5,
                         "batch.size": 65_536, "queue.buffering.max.kbytes": 1024, **(config or {}),
                         "throttle_cb": lambda event: throttles.append(event.throttle_time)})

    def delivered(error, message) -> None:
        if error is None:
            acked.append((time.monotonic(), len(VALUE)))

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            producer.produce(topic, VALUE, callback=delivered)
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    producer.flush(120)


def rate(acked: list, start: float, end: float) -> float:
    """Delivered bytes per second between two monotonic times."""
    return sum(size for at, size in acked if start <= at < end) / (end - start)


def run(broker: BrokerProcess, args) -> dict:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("quota-bench", 1, 1)])["quota-bench"].result(60)
    set_quota(broker.host, broker.port, "limited", args.quota)
    baseline: list = []
    started = time.monotonic()
    produce(broker.bootstrap, "quota-bench", "free", args.baseline, baseline, [])
    free_alone = rate(baseline, started + 2, started + args.baseline)
    limited, free, limited_throttles, free_throttles = [], [], [], []
    runs = [threading.Thread(target=produce, args=(broker.bootstrap, "quota-bench", "limited", args.seconds,
                                                   limited, limited_throttles)),
            threading.Thread(target=produce, args=(broker.bootstrap, "quota-bench", "free", args.seconds,
                                                   free, free_throttles))]
    started = time.monotonic()
    for thread in runs:
        thread.start()
    for thread in runs:
        thread.join()
    window = (started + args.warmup, started + args.seconds)
    limited_rate = rate(limited, *window)
    return {"target": broker.name, "quota_bytes_per_s": args.quota, "window_s": window[1] - window[0],
            "limited_bytes_per_s": round(limited_rate), "limited_over_quota": round(limited_rate / args.quota, 4),
            "limited_throttle_events": len(limited_throttles),
            "free_bytes_per_s": round(rate(free, *window)), "free_alone_bytes_per_s": round(free_alone),
            "free_throttle_events": sum(1 for t in free_throttles if t > 0)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", choices=("pykbroker", "kafka"), default="pykbroker")
    parser.add_argument("--quota", type=int, default=1_000_000, help="producer_byte_rate of the limited client")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--baseline", type=float, default=10.0)
    args = parser.parse_args()
    if args.target == "kafka":
        broker: BrokerProcess = KafkaBroker()
        reason = kafka_unavailable_reason(broker.refkit)
        if reason:
            print(f"kafka skipped: {reason}")
            return 0
    else:
        broker = BrokerProcess()
    with broker:
        result = run(broker, args)
    print(f"| target | quota B/s | limited B/s | limited / quota | free B/s (with) | free B/s (alone) |")
    print(f"|---|---|---|---|---|---|")
    print(f"| {result['target']} | {args.quota} | {result['limited_bytes_per_s']} | {result['limited_over_quota']} "
          f"| {result['free_bytes_per_s']} | {result['free_alone_bytes_per_s']} |")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

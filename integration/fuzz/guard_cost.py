"""What the frame guard costs per request: `python3 integration/fuzz/guard_cost.py`.

For the largest captured Produce and Fetch request of each version in protocol_specs/fixtures/wire-captures
and for a librdkafka-sized Produce (3 partitions of 1,600 × 100 B records, as benchmark workload (a)
sends them), prints the best-of-7 time of the guard's walk next to kio's decode of the same body and the
whole decode_request, in microseconds per request.
"""

from __future__ import annotations

import datetime
import json
import sys
import timeit
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData  # noqa: E402
from kio.static.primitive import i16, i32, i32Timedelta  # noqa: E402

from integration.fuzz.frames import CAPTURES, request_frame  # noqa: E402
from pykbroker.protocol.apis import codec_for  # noqa: E402
from pykbroker.protocol.framing import decode_request, read_prefix  # noqa: E402
from pykbroker.protocol.records import build_batch  # noqa: E402

PRODUCE, FETCH = 0, 1


def sample_frames() -> dict[str, bytes]:
    largest: dict[tuple[str, int], tuple[bytes, str]] = {}
    for path in sorted(CAPTURES.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("dir") == "request" and entry["api_key"] in (PRODUCE, FETCH):
                frame = bytes.fromhex(entry["hex"])
                key = (entry["api_name"], entry["api_version"])
                if key not in largest or len(frame) > len(largest[key][0]):
                    largest[key] = (frame, path.stem)
    samples = {f"{name} v{version} ({source})": frame
               for (name, version), (frame, source) in sorted(largest.items())}
    batch = bytes(build_batch([(None, b"x" * 100)] * 1600))
    produce = ProduceRequest(
        transactional_id=None, acks=i16(1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topic_data=(TopicProduceData(name="bench", partition_data=tuple(
            PartitionProduceData(index=i32(partition), records=batch) for partition in range(3))),))
    samples["Produce v9 (3 partitions x 1,600 x 100 B)"] = request_frame(produce, 1)
    return samples


def best_us(call, number: int = 5000) -> float:
    return min(timeit.repeat(call, number=number, repeat=7)) / number * 1e6


def main() -> None:
    print(f"{'request':58s} {'bytes':>8s} {'guard':>8s} {'kio body':>9s} {'decode_request':>15s}")
    for name, frame in sample_frames().items():
        prefix = read_prefix(frame)
        codec = codec_for(prefix.api_key, prefix.api_version)
        _, body_start = codec.read_request_header(frame, 0)
        guard = best_us(lambda: codec.check_request_body(frame, body_start))
        kio = best_us(lambda: codec.read_request_body(frame, body_start))
        whole = best_us(lambda: decode_request(frame, prefix))
        print(f"{name:58s} {len(frame):8d} {guard:7.2f}us {kio:8.2f}us {whole:14.2f}us")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Log cleaner speed and the event loop's delay while it cleans.

    python integration/bench/cleaner_bench.py [--mb 200] [--keys 10000] [--codec none|gzip|snappy|lz4|zstd]
                                              [--segment-mb 32] [--thread] [--seed 1]

Writes a compacted log of ``--mb`` MB (records of 100 B - 1 KiB values over ``--keys`` keys, 50 records a
batch, in segments of ``--segment-mb``) with PartitionLog.append, then runs one cleaning as the broker
does (LogCleaner.clean_filthiest: the worker process reads and writes, the event loop swaps), and prints:
- cleaning speed: MB of log read per second of the whole cleaning (map + rewrite + fsync + swap), and the
  worker's own time;
- event-loop lag: a probe sleeping 5 ms on the loop records how late it wakes, for 3 s before the cleaning
  (idle baseline) and during it (p50 / p99 / max ms).
With ``--thread`` it repeats the cleaning in a thread of the broker process instead of a worker process,
to show what the GIL does to the loop.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pykbroker.log.cleaner import CleanerConfig, LogCleaner  # noqa: E402
from pykbroker.log.config import LogConfig  # noqa: E402
from pykbroker.log.partition_log import PartitionLog, run_file_work  # noqa: E402
from pykbroker.protocol.records import build_batch  # noqa: E402

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
PROBE_S = 0.005


def write_log(directory: Path, megabytes: int, keys: int, codec: int, segment_mb: int, seed: int) -> PartitionLog:
    rng = random.Random(seed)
    config = LogConfig(segment_bytes=segment_mb << 20, cleanup_policy="compact", min_cleanable_dirty_ratio=0.01)
    plog = PartitionLog.open(directory / "bench-0", config, fsync="never")
    target = megabytes * 1_000_000
    payload = rng.randbytes(1024)
    now = int(time.time() * 1000)
    while plog.size_bytes < target:
        records = [(b"key-%d" % rng.randrange(keys), payload[: rng.randint(100, 1024)]) for _ in range(50)]
        plog.append(build_batch(records, timestamp_ms=now, compression=codec), leader_epoch=0, now_ms=now)
    plog.roll()
    plog.append(build_batch([(b"tail", b"x")], timestamp_ms=now), leader_epoch=0, now_ms=now)
    plog.flush()
    return plog


class LagProbe:
    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = False

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stop:
            started = loop.time()
            await asyncio.sleep(PROBE_S)
            self.samples.append((loop.time() - started - PROBE_S) * 1000)

    def stop(self) -> None:
        self._stop = True

    def summary(self) -> str:
        if not self.samples:
            return "no samples"
        ordered = sorted(self.samples)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        return f"p50 {statistics.median(ordered):.2f} ms, p99 {p99:.2f} ms, max {ordered[-1]:.2f} ms ({len(ordered)} samples)"


async def clean_with_probe(plog: PartitionLog, directory: Path, processes: bool) -> tuple[float, str, str, object]:
    io_thread = ThreadPoolExecutor(max_workers=1)  # the log manager's I/O thread

    async def run_work(logs):
        work = [job for partition_log in logs for job in partition_log.take_file_work()]
        await asyncio.wrap_future(io_thread.submit(run_file_work, work))

    async def in_io(work):
        await asyncio.wrap_future(io_thread.submit(work))

    cleaner = LogCleaner(directory, CleanerConfig(), lambda: [plog], lambda t, p: None, run_work, in_io)
    cleaner.use_processes = processes
    if processes:  # start the worker first: its start-up is not the cleaning's
        await asyncio.get_running_loop().run_in_executor(cleaner._executor(), time.sleep, 0)
    idle = LagProbe()
    task = asyncio.ensure_future(idle.run())
    await asyncio.sleep(3)
    idle.stop()
    await task
    busy = LagProbe()
    task = asyncio.ensure_future(busy.run())
    started = time.monotonic()
    assert await cleaner.clean_filthiest(), "nothing to clean"
    elapsed = time.monotonic() - started
    busy.stop()
    await task
    cleaner.shutdown()
    io_thread.shutdown()
    return elapsed, idle.summary(), busy.summary(), cleaner.last_result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--codec", choices=sorted(CODECS), default="none")
    parser.add_argument("--segment-mb", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--thread", action="store_true", help="also clean in a thread, for comparison")
    args = parser.parse_args()
    print("command:", " ".join([sys.executable, *sys.argv]))
    with tempfile.TemporaryDirectory(prefix="cleaner-bench-") as tmp:
        root = Path(tmp)
        started = time.monotonic()
        plog = write_log(root / "process", args.mb, args.keys, CODECS[args.codec], args.segment_mb, args.seed)
        size = plog.size_bytes
        print(f"wrote {size / 1e6:.0f} MB, {len(plog.segment_base_offsets)} segments, {plog.log_end_offset} records "
              f"over {args.keys} keys ({args.codec}) in {time.monotonic() - started:.1f} s")
        modes = [("worker process", True)]
        if args.thread:
            shutil.copytree(root / "process", root / "thread")
            modes.append(("thread", False))
        for name, processes in modes:
            directory = root / ("process" if processes else "thread")
            log = plog if processes else PartitionLog.open(directory / "bench-0", plog.config, fsync="never")
            elapsed, idle, busy, result = asyncio.run(clean_with_probe(log, directory, processes))
            print(f"cleaning in a {name}: {result.bytes_read / 1e6:.0f} MB read, {result.bytes_written / 1e6:.1f} MB "
                  f"written, {result.records_kept} of {result.records_read} records kept, "
                  f"{elapsed:.2f} s -> {result.bytes_read / 1e6 / elapsed:.1f} MB/s "
                  f"(worker alone {result.seconds:.2f} s, {result.bytes_read / 1e6 / result.seconds:.1f} MB/s)")
            print(f"  event-loop lag idle:            {idle}")
            print(f"  event-loop lag during cleaning: {busy}")
            log.close()


if __name__ == "__main__":
    main()

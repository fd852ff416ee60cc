#!/usr/bin/env python3
"""Log cleaner speed and the event loop's delay while it cleans.

    python integration/bench/cleaner_bench.py [--mb 200] [--keys 10000] [--codec none|gzip|snappy|lz4|zstd]
                                              [--segment-mb 32] [--thread] [--seed 1]
    python integration/bench/cleaner_bench.py --distinct 2000000 [--dedupe-mb 128]
    python integration/bench/cleaner_bench.py --target both|kafka|pykbroker [--mb 200] [--codec lz4] [--warm-up-mb 20]

Writes a compacted log of ``--mb`` MB (records of random 100 B - 1 KiB values over ``--keys`` keys, 50
records a batch, in segments of ``--segment-mb``) with PartitionLog.append, then runs one cleaning as the broker
does (LogCleaner.clean_filthiest: the worker process reads and writes, the event loop swaps), and prints:
- cleaning speed: MB of log read per second of the whole cleaning (map + rewrite + fsync + swap), and the
  worker's own time;
- event-loop lag: a probe sleeping 5 ms on the loop records how late it wakes, for 3 s before the cleaning
  (idle baseline) and during it (p50 / p99 / max ms);
- the worker process's peak RSS (its ru_maxrss after the cleaning).
With ``--thread`` it repeats the cleaning in a thread of the broker process instead of a worker process,
to show what the GIL does to the loop.

With ``--broker`` it measures a real broker instead: a compacted topic of ``--mb`` MB produced with
confluent-kafka (cleaning held back by min.compaction.lag.ms), a probe producer sending one 100-byte
message every 2 ms (acks=1) to another topic; p50 / p99 / max delivery latency for 5 s before the cleaning
and while it runs (min.compaction.lag.ms set to 0 until the cleaner-offset-checkpoint names the topic),
and the broker's own "log cleaner: cleaned" line.

With ``--distinct N`` it measures the offset map's reach instead: a log of N records with N distinct keys
(10-byte values, 500 records a batch), cleaned by a worker process with log.cleaner.dedupe.buffer.size =
``--dedupe-mb`` MiB (Kafka's default 128) until nothing is dirty: the passes that takes, the keys each pass
mapped, and the worker's peak RSS.

With ``--target`` it compares Apache Kafka 3.7.1's cleaner with pykbroker's: one cleaning of the same
``--mb`` MB, produced by the same client, in each real broker; the broker's own figures, its CPU and peak RSS
during the cleaning, and the ratios (cleaner_compare.py says how).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import cleaner_compare  # noqa: E402
from cleaner_compare import BATCH_RECORDS, bench_records  # noqa: E402
from pykbroker.log.cleaner import CleanerConfig, LogCleaner  # noqa: E402
from pykbroker.log.config import LogConfig  # noqa: E402
from pykbroker.log.partition_log import PartitionLog, run_file_work  # noqa: E402
from pykbroker.protocol.records import build_batch  # noqa: E402

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
PROBE_S = 0.005


def worker_peak_rss_mb() -> float:
    """This process's peak resident set (run in the cleaner's worker process)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_log(directory: Path, megabytes: int, keys: int, codec: int, segment_mb: int, seed: int) -> PartitionLog:
    records = bench_records(seed, keys)
    config = LogConfig(segment_bytes=segment_mb << 20, cleanup_policy="compact", min_cleanable_dirty_ratio=0.01)
    plog = PartitionLog.open(directory / "bench-0", config, fsync="never")
    target = megabytes * 1_000_000
    now = int(time.time() * 1000)
    while plog.size_bytes < target:
        batch = [next(records) for _ in range(BATCH_RECORDS)]
        plog.append(build_batch(batch, timestamp_ms=now, compression=codec), leader_epoch=0, now_ms=now)
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


def make_cleaner(plog: PartitionLog, directory: Path, io_thread: ThreadPoolExecutor, **config) -> LogCleaner:
    async def run_work(logs):
        work = [job for partition_log in logs for job in partition_log.take_file_work()]
        await asyncio.wrap_future(io_thread.submit(run_file_work, work))

    async def in_io(work):
        await asyncio.wrap_future(io_thread.submit(work))

    stable_offset = lambda topic, partition: plog.log_end_offset  # noqa: E731 - one replica: all of it is stable
    return LogCleaner(directory, CleanerConfig(**config), lambda: [plog], stable_offset, run_work, in_io)


async def clean_with_probe(plog: PartitionLog, directory: Path, processes: bool) -> tuple[float, str, str, object, float | None]:
    io_thread = ThreadPoolExecutor(max_workers=1)  # the log manager's I/O thread

    cleaner = make_cleaner(plog, directory, io_thread)
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
    peak = None
    if processes:
        peak = await asyncio.get_running_loop().run_in_executor(cleaner._executor(), worker_peak_rss_mb)
    cleaner.shutdown()
    io_thread.shutdown()
    return elapsed, idle.summary(), busy.summary(), cleaner.last_result, peak


def distinct_keys(directory: Path, count: int, dedupe_mb: int) -> None:
    """Clean a log of ``count`` distinct keys until nothing is dirty; print the passes and keys per pass."""
    config = LogConfig(segment_bytes=64 << 20, cleanup_policy="compact", min_cleanable_dirty_ratio=0.01)
    plog = PartitionLog.open(directory / "bench-0", config, fsync="never")
    now = int(time.time() * 1000)
    started = time.monotonic()
    for first in range(0, count, 500):
        records = [(b"key-%012d" % i, b"v" * 10) for i in range(first, min(first + 500, count))]
        plog.append(build_batch(records, timestamp_ms=now), leader_epoch=0, now_ms=now)
    plog.roll()
    plog.append(build_batch([(b"tail", b"x")], timestamp_ms=now), leader_epoch=0, now_ms=now)
    plog.flush()
    end = plog.segment_base_offsets[-1]
    print(f"wrote {plog.size_bytes / 1e6:.0f} MB, {count} records of distinct keys in {time.monotonic() - started:.1f} s")

    async def run() -> None:
        io_thread = ThreadPoolExecutor(max_workers=1)
        cleaner = make_cleaner(plog, directory, io_thread, dedupe_buffer_size=dedupe_mb << 20)
        print(f"dedupe buffer {dedupe_mb} MiB: map capacity {cleaner.config.map_capacity} keys")
        await asyncio.get_running_loop().run_in_executor(cleaner._executor(), time.sleep, 0)
        passes = 0
        began = time.monotonic()
        while cleaner.first_dirty_offset(plog) < end:
            assert await cleaner.clean_filthiest(), "a cleaning made no progress"
            passes += 1
            result = cleaner.last_result
            print(f"  pass {passes}: {result.map_entries} keys mapped, clean up to offset {result.end_offset}, "
                  f"{result.seconds:.2f} s")
        peak = await asyncio.get_running_loop().run_in_executor(cleaner._executor(), worker_peak_rss_mb)
        print(f"{passes} passes for {count} keys in {time.monotonic() - began:.1f} s; worker peak RSS {peak:.0f} MB")
        cleaner.shutdown()
        io_thread.shutdown()

    asyncio.run(run())
    plog.close()


def broker_latency(megabytes: int, keys: int, seed: int) -> None:
    import threading

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from broker_process import BrokerProcess

    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="cleaner-bench-broker-") as tmp:
        broker = BrokerProcess(Path(tmp) / "b", config={"log.cleaner.backoff.ms": 200}, log_level="info")
        broker.start()
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            held = {"cleanup.policy": "compact", "segment.bytes": str(16 << 20), "min.compaction.lag.ms": "3600000"}
            for future in admin.create_topics([NewTopic("compacted", 1, config=held), NewTopic("probe", 1)]).values():
                future.result(60)
            producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "acks": 1})
            payload = rng.randbytes(1024)
            sent = 0
            started = time.monotonic()
            while sent < megabytes * 1_000_000:
                value = payload[: rng.randint(100, 1024)]
                while True:
                    try:
                        producer.produce("compacted", key=b"key-%d" % rng.randrange(keys), value=value)
                        break
                    except BufferError:
                        producer.poll(0.05)
                sent += len(value)
            producer.flush(300)
            print(f"produced {sent / 1e6:.0f} MB to the compacted topic in {time.monotonic() - started:.1f} s")

            latencies: list[tuple[float, float]] = []  # (sent at, latency ms)
            stop = threading.Event()

            def probe() -> None:
                prober = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "acks": 1})
                while not stop.is_set():
                    at = time.monotonic()
                    prober.produce("probe", value=b"p" * 100,
                                   on_delivery=lambda err, msg, at=at: latencies.append((at, (time.monotonic() - at) * 1000)))
                    prober.poll(0)
                    time.sleep(0.002)
                prober.flush(30)

            thread = threading.Thread(target=probe)
            thread.start()
            time.sleep(5)
            cleaning_from = time.monotonic()
            resource = ConfigResource(ConfigResource.Type.TOPIC, "compacted", incremental_configs=[
                ConfigEntry("min.compaction.lag.ms", "0", incremental_operation=AlterConfigOpType.SET)])
            admin.incremental_alter_configs([resource])[resource].result(60)
            checkpoint = broker.data_dir / "cleaner-offset-checkpoint"
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and not (checkpoint.exists() and "compacted" in checkpoint.read_text()):
                time.sleep(0.05)
            cleaning_to = time.monotonic()
            time.sleep(1)
            stop.set()
            thread.join()

            def summary(samples: list[float]) -> str:
                if not samples:
                    return "no samples"
                ordered = sorted(samples)
                p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
                return f"p50 {statistics.median(ordered):.2f} ms, p99 {p99:.2f} ms, max {ordered[-1]:.2f} ms ({len(ordered)} messages)"

            before = [ms for at, ms in latencies if cleaning_from - 5 <= at < cleaning_from]
            during = [ms for at, ms in latencies if cleaning_from <= at < cleaning_to]
            print(f"probe produce latency before the cleaning: {summary(before)}")
            print(f"probe produce latency during the cleaning ({cleaning_to - cleaning_from:.1f} s): {summary(during)}")
            for line in broker.log_path.read_text().splitlines():
                if "log cleaner: cleaned" in line:
                    print("broker:", line.split("log cleaner: ", 1)[1])
        finally:
            broker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--codec", choices=sorted(CODECS), default="none")
    parser.add_argument("--segment-mb", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--thread", action="store_true", help="also clean in a thread, for comparison")
    parser.add_argument("--broker", action="store_true", help="produce latency of a real broker during a cleaning")
    parser.add_argument("--distinct", type=int, default=0, help="passes to clean this many distinct keys")
    parser.add_argument("--dedupe-mb", type=int, default=128, help="log.cleaner.dedupe.buffer.size for --distinct")
    parser.add_argument("--target", choices=("both", "pykbroker", "kafka"),
                        help="one cleaning in real brokers, Apache Kafka 3.7.1 and/or pykbroker, side by side")
    parser.add_argument("--refkit", type=Path, help="the reference kit holding Kafka (default ../shared/refkit)")
    parser.add_argument("--warm-up-mb", type=float, default=20,
                        help="--target: MB of another topic cleaned first, unmeasured (0: measure a cold cleaner)")
    args = parser.parse_args()
    print("command:", " ".join([sys.executable, *sys.argv]))
    if args.target:
        sys.exit(cleaner_compare.run(args))
    if args.distinct:
        with tempfile.TemporaryDirectory(prefix="cleaner-bench-") as tmp:
            distinct_keys(Path(tmp), args.distinct, args.dedupe_mb)
        return
    if args.broker:
        broker_latency(args.mb, args.keys, args.seed)
        return
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
            elapsed, idle, busy, result, peak = asyncio.run(clean_with_probe(log, directory, processes))
            print(f"cleaning in a {name}: {result.bytes_read / 1e6:.0f} MB read, {result.bytes_written / 1e6:.1f} MB "
                  f"written, {result.records_kept} of {result.records_read} records kept, "
                  f"{elapsed:.2f} s -> {result.bytes_read / 1e6 / elapsed:.1f} MB/s "
                  f"(worker alone {result.seconds:.2f} s, {result.bytes_read / 1e6 / result.seconds:.1f} MB/s)")
            if peak is not None:
                print(f"  worker peak RSS: {peak:.0f} MB ({result.map_entries} keys mapped)")
            print(f"  event-loop lag idle:            {idle}")
            print(f"  event-loop lag during cleaning: {busy}")
            log.close()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""How long loading one partition's producer state takes at a start, with and without snapshots.

    python integration/bench/start_bench.py [--batches 1000000] [--producers 1000] [--segment-mb 16] [--dir DIR]

Writes a log of ``--batches`` small idempotent batches (one 10-byte record each, ``--producers`` producer
ids in turn, a transaction left open by one more producer) with PartitionLog.append and the producer-state
updates a leader makes, in segments of ``--segment-mb`` (a snapshot at each roll), then times
PartitionLog.open + load_producer_state (what the broker does for each partition when it hosts it):

- full replay: every snapshot deleted (what every start did before snapshots);
- clean restart: the snapshot written at close, at the log end;
- crash restart: no shutdown snapshot, the recovery point at the last roll (the newest roll snapshot);
- the snapshot write itself (encode + write + rename; fsync is left to the flush, off the event loop).

Each line gives the seconds and the batches replayed.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from pykbroker.log.config import LogConfig
from pykbroker.log.partition_log import PartitionLog
from pykbroker.protocol.records import TRANSACTIONAL_MASK, build_batch


def write_log(directory: Path, config: LogConfig, batches: int, producers: int) -> tuple[int, int]:
    log = PartitionLog.open(directory, config, fsync="never")
    log.load_producer_state()
    state = log.producer_state
    now = int(time.time() * 1000)
    sequences = [0] * producers
    for i in range(batches):
        pid = 1000 + i % producers
        records = build_batch([(None, b"0123456789")], timestamp_ms=now, producer_id=pid, producer_epoch=0,
                              base_sequence=sequences[i % producers])
        sequences[i % producers] += 1
        result = log.append(records, leader_epoch=0, now_ms=now)
        state.update(result.headers[0], result.log_append_time_ms)
    open_txn = build_batch([(None, b"open")], timestamp_ms=now, producer_id=999, producer_epoch=0, base_sequence=0,
                           attributes=TRANSACTIONAL_MASK)
    state.update(log.append(open_txn, leader_epoch=0, now_ms=now).headers[0], -1)
    end, segments = log.log_end_offset, len(log.segment_base_offsets)
    log.close()
    return end, segments


def timed_load(directory: Path, config: LogConfig, **open_args) -> tuple[float, int, int | None]:
    started = time.perf_counter()
    log = PartitionLog.open(directory, config, fsync="never", **open_args)
    log.load_producer_state(log.log_end_offset)
    elapsed = time.perf_counter() - started
    replayed, first_unstable = log.producer_state_replayed, log.producer_state.first_unstable_offset()
    log.abandon()
    return elapsed, replayed, first_unstable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=1_000_000)
    parser.add_argument("--producers", type=int, default=1000)
    parser.add_argument("--segment-mb", type=int, default=16)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(dir=args.dir))
    directory = root / "bench-0"
    config = LogConfig(segment_bytes=args.segment_mb << 20)
    try:
        started = time.perf_counter()
        end, segments = write_log(directory, config, args.batches, args.producers)
        size = sum(p.stat().st_size for p in directory.glob("*.log"))
        print(f"log: {args.batches} batches, {args.producers + 1} producers, {size / 1e6:.0f} MB in {segments} "
              f"segments, written in {time.perf_counter() - started:.1f} s")
        snapshots = sorted(directory.glob("*.snapshot"))
        print(f"snapshots: {[int(p.name.split('.')[0]) for p in snapshots]}, {snapshots[-1].stat().st_size} bytes each")

        elapsed, replayed, fuo = timed_load(directory, config, clean_shutdown=True, recovery_point=end)
        print(f"clean restart (shutdown snapshot): {elapsed:.3f} s, {replayed} batches replayed, first unstable {fuo}")

        saved = root / "saved"
        saved.mkdir()
        for path in snapshots:
            shutil.copy2(path, saved / path.name)
        (directory / f"{end:020d}.snapshot").unlink()
        last_roll = int(snapshots[-2].name.split(".")[0])
        elapsed, replayed, fuo = timed_load(directory, config, recovery_point=last_roll)
        print(f"crash restart (roll snapshot at {last_roll}, recovery point there): {elapsed:.3f} s, "
              f"{replayed} batches replayed, first unstable {fuo}")

        for path in directory.glob("*.snapshot"):
            path.unlink()
        elapsed, replayed, fuo = timed_load(directory, config, clean_shutdown=True, recovery_point=end)
        print(f"full replay (no snapshot, as before): {elapsed:.3f} s, {replayed} batches replayed, first unstable {fuo}")

        log = PartitionLog.open(directory, config, fsync="never", clean_shutdown=True, recovery_point=end)
        started = time.perf_counter()
        log.producer_state.replay_with_markers(log.headers_and_markers(0), on_completed=log.index_aborted,
                                               stable_below=end)  # the code every start ran before snapshots
        print(f"  of which the replay alone (the pre-snapshot code path): {time.perf_counter() - started:.3f} s")
        log.load_producer_state()
        runs = []
        for offset in range(end + 1, end + 11):
            started = time.perf_counter()
            log.take_producer_snapshot(offset)
            runs.append(time.perf_counter() - started)
        print(f"snapshot write ({len(log.producer_state)} producers, no fsync): {min(runs) * 1000:.2f} ms min, "
              f"{max(runs) * 1000:.2f} ms max of {len(runs)}")
        log.abandon()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

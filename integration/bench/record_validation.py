#!/usr/bin/env python3
"""Micro benchmark of producer-batch validation (pykbroker.protocol.records), no broker involved.

    python3 integration/bench/record_validation.py [--batches N]

For batches of 1,000 records of 100-byte values, uncompressed, lz4 and zstd (and gzip, snappy), it
times per batch: the framing + CRC32C check alone (all the broker did before record validation), then
the full validation with the C record walker and with the pure-Python twin. Prints records/s for each.
Nothing asserts a time: run it on an idle machine and compare rows, not absolute figures.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's pykbroker, as run_bench.py uses

from pykbroker.protocol import records  # noqa: E402
from pykbroker.protocol.records import build_batch, validate_batches, validate_client_records  # noqa: E402

RECORDS_PER_BATCH = 1000
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def _rate(function, batch, batches: int) -> float:
    function(batch)  # warm
    start = time.perf_counter()
    for _ in range(batches):
        function(batch)
    return batches * RECORDS_PER_BATCH / (time.perf_counter() - start)


def _full(walker):
    def validate(batch):
        records.scan_records = walker
        validate_client_records(batch, validate_batches(batch), now_ms=0)
    return validate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=300, help="batches timed per row (default 300)")
    args = parser.parse_args()
    c_walker = records.scan_records if records.scan_records is not records._scan_records_py else None
    print(f"{'codec':8} {'bytes':>8} {'crc only':>14} {'C walker':>14} {'Python walker':>14}   (records/s)")
    for name, codec in CODECS.items():
        values = [(None, (b"value-%06d-" % i) * 8 + b"....") for i in range(RECORDS_PER_BATCH)]
        batch = bytes(build_batch(values, timestamp_ms=1_700_000_000_000, compression=codec))
        crc_only = _rate(validate_batches, batch, args.batches)
        c_rate = _rate(_full(c_walker), batch, args.batches) if c_walker else float("nan")
        py_rate = _rate(_full(records._scan_records_py), batch, max(1, args.batches // 10))
        print(f"{name:8} {len(batch):>8} {crc_only:>14,.0f} {c_rate:>14,.0f} {py_rate:>14,.0f}")
    records.scan_records = c_walker or records._scan_records_py


if __name__ == "__main__":
    main()

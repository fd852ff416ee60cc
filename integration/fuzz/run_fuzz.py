"""Long-run mutation fuzzing of a broker: `python3 integration/fuzz/run_fuzz.py --frames 100000 --seed 7`.

Starts a broker subprocess from this checkout (tests/integration/broker_process.py), sends fuzzed frames
`--start` .. `--start + --frames` of run `--seed` (integration/fuzz/frames.py; one connection per frame,
`--concurrency` at a time), and checks the broker between windows of `--window` frames: alive, RSS.
A broker that dies is counted as an abort, its window is printed for replay, and a fresh broker carries on.
At the end: ApiVersions must be answered, and the report lists frames, time, answers, closed connections,
aborts, peak RSS and the handler tracebacks of the broker log by API (requests that decoded but that a
handler could not serve). Exit status 1 if any abort (the broker logs are then kept; otherwise a temporary
work dir is removed).

Replay a window alone: `--seed S --start A --frames N --concurrency 1`; show one frame: `--show I`.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "tests" / "integration")]

from broker_process import BrokerProcess, probe_api_versions  # noqa: E402
from integration.fuzz.frames import SendStats, corpus, fuzz_frame, read_rss_bytes, send_frames  # noqa: E402
from pykbroker.protocol.apis import SUPPORTED_APIS  # noqa: E402

HANDLER_FAILURE = re.compile(r"handler for api (\d+) v(\d+) failed")


def handler_failures(log_text: str) -> Counter:
    """'Name vN' -> how many handler tracebacks the broker logged for it."""
    failures: Counter = Counter()
    for key, version in HANDLER_FAILURE.findall(log_text):
        api = SUPPORTED_APIS.get(int(key))
        failures[f"{api.name if api else key} v{version}"] += 1
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--start", type=int, default=0, help="index of the first frame (to replay a window)")
    parser.add_argument("--window", type=int, default=1000, help="frames between health checks")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--answer-wait", type=float, default=0.5, help="seconds to wait for each answer")
    parser.add_argument("--workdir", type=Path, help="broker data dir and log (default: a temp dir)")
    parser.add_argument("--show", type=int, metavar="INDEX", help="print frame INDEX of the seed and exit")
    args = parser.parse_args(argv)

    frames = corpus()
    if args.show is not None:
        frame, how = fuzz_frame(frames, args.seed, args.show)
        print(f"seed {args.seed} frame {args.show}: {how}\n{len(frame)} bytes: {frame.hex()}")
        return 0

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pykbroker-fuzz-"))
    print(f"seed {args.seed}, frames {args.start}..{args.start + args.frames - 1}, corpus {len(frames)} frames, "
          f"broker dir {workdir}", flush=True)
    stats = SendStats()
    aborts: list[str] = []
    logs: list[Path] = []
    peak_rss = 0
    began = time.monotonic()
    stop = args.start + args.frames
    broker = BrokerProcess(workdir / "broker0", log_level="info").start()
    try:
        for first in range(args.start, stop, args.window):
            window = range(first, min(first + args.window, stop))
            asyncio.run(send_frames(broker.address, frames, args.seed, window, concurrency=args.concurrency,
                                    answer_wait=args.answer_wait, stats=stats))
            if not broker.is_running():
                aborts.append(f"exit {broker.process.returncode} within frames {window.start}-{window.stop - 1}")
                print(f"ABORT: {aborts[-1]}\n{broker.log_tail(20)}", flush=True)
                logs.append(broker.log_path)
                broker = BrokerProcess(workdir / f"broker{len(aborts)}", log_level="info").start()
                continue
            peak_rss = max(peak_rss, read_rss_bytes(broker.process.pid))
            elapsed = time.monotonic() - began
            print(f"{window.stop - args.start} frames, {elapsed:.0f} s, {stats}, peak RSS {peak_rss >> 20} MB",
                  flush=True)
        probe_api_versions(broker.address, timeout=10.0)
    finally:
        broker.close()
        logs.append(broker.log_path)
    elapsed = time.monotonic() - began
    failures = handler_failures("".join(path.read_text(errors="replace") for path in logs))
    print(f"\nseed {args.seed}: {stats.sent} frames in {elapsed:.0f} s ({stats.sent / elapsed:.0f}/s); "
          f"answered {stats.answered}, connection closed {stats.closed}, no answer within "
          f"{args.answer_wait} s {stats.unanswered}, connect errors {stats.connect_errors}")
    print(f"aborts: {len(aborts)}" + "".join(f"\n  {line}" for line in aborts))
    print(f"peak broker RSS: {peak_rss >> 20} MB; ApiVersions answered at the end")
    print(f"handler tracebacks in the broker log: {sum(failures.values())}")
    for name, count in sorted(failures.items(), key=lambda item: (-item[1], item[0])):
        print(f"  {name}: {count}")
    if aborts:
        print(f"broker logs kept in {workdir}")
        return 1
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

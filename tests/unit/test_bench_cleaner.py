"""The cleaning-speed benchmark (integration/bench/cleaner_bench.py) still runs: a small log, one cleaning in a
worker process, the speed and the event loop's lag printed (its figures are the closing note's, so a broken
benchmark must fail here, not on the day it is needed)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cleaner_bench_cleans_a_small_log_and_prints_its_speed():
    done = subprocess.run([sys.executable, str(ROOT / "integration" / "bench" / "cleaner_bench.py"), "--mb", "4",
                           "--keys", "100", "--segment-mb", "1"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"100 of \d+ records kept, [\d.]+ s -> [\d.]+ MB/s", done.stdout), done.stdout
    assert "event-loop lag during cleaning" in done.stdout
    assert re.search(r"worker peak RSS: \d+ MB", done.stdout), done.stdout


def test_cleaner_bench_counts_the_passes_for_many_distinct_keys():
    done = subprocess.run([sys.executable, str(ROOT / "integration" / "bench" / "cleaner_bench.py"), "--distinct",
                           "50000", "--dedupe-mb", "1"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    from pykbroker.log.cleaner import CleanerConfig

    capacity = CleanerConfig(dedupe_buffer_size=1 << 20).map_capacity
    passes = -(-50000 // (capacity // 500 * 500))  # whole batches of 500 keys a pass
    assert f"map capacity {capacity} keys" in done.stdout, done.stdout
    assert re.search(rf"\n{passes} passes for 50000 keys in [\d.]+ s; worker peak RSS \d+ MB", done.stdout), done.stdout


# -- the side-by-side mode (--target): Kafka 3.7.1's cleaner against pykbroker's ------------------------------

BENCH = ROOT / "integration" / "bench"
sys.path.insert(0, str(BENCH))

import pytest  # noqa: E402

from cleaner_compare import TOPIC, kafka_summaries, pykbroker_summaries  # noqa: E402

MIB = 1 << 20


def kafka_record_stats(thread, name, first, end, read, written, read_msgs, written_msgs, elapsed, index_s, map_read):
    """The message Kafka 3.7.1's LogCleaner.recordStats logs, formatted as its Scala code does (%,.1f is Python's
    {:,.1f}), inside log4j's "[%d] %p %m (%c)%n" layout of config/log4j.properties."""
    mb = lambda b: b / MIB  # noqa: E731
    message = (
        f"\n\tLog cleaner thread {thread} cleaned log {name} (dirty section = [{first}, {end}])\n"
        f"\t{mb(read):,.1f} MB of log processed in {elapsed:,.1f} seconds ({mb(read / elapsed):,.1f} MB/sec).\n"
        f"\tIndexed {mb(map_read):,.1f} MB in {index_s:.1f} seconds ({mb(map_read) / index_s:,.1f} Mb/sec, "
        f"{100 * index_s / elapsed:.1f}% of total time)\n"
        f"\tBuffer utilization: {0.7:.1f}%\n"
        f"\tCleaned {mb(read):,.1f} MB in {elapsed - index_s:.1f} seconds ({mb(read) / (elapsed - index_s):,.1f} Mb/sec, "
        f"{100 * (elapsed - index_s) / elapsed:.1f}% of total time)\n"
        f"\tStart size: {mb(read):,.1f} MB ({read_msgs:,d} messages)\n"
        f"\tEnd size: {mb(written):,.1f} MB ({written_msgs:,d} messages)\n"
        f"\t{100 * (1 - written / read):.1f}% size reduction ({100 * (1 - written_msgs / read_msgs):.1f}% fewer messages)\n"
    )
    return f"[2026-11-26 22:10:01,123] INFO {message} (kafka.log.LogCleaner)\n"


def test_kafka_cleaner_summary_is_parsed_with_its_grouping_separators_and_mib():
    text = ("[2026-11-26 22:10:00,001] INFO Starting the log cleaner (kafka.log.LogCleaner)\n"
            + kafka_record_stats(0, "__consumer_offsets-3", 0, 12, 4096, 1024, 12, 3, 0.01, 0.005, 4096)
            + kafka_record_stats(0, f"{TOPIC}-0", 0, 1_234_567, 1_500 * MIB, 12 * MIB, 1_234_567, 10_000, 7.3, 2.9,
                                 1_500 * MIB))
    found = [summary for summary in kafka_summaries(text) if summary.log == f"{TOPIC}-0"]
    assert len(kafka_summaries(text)) == 2 and len(found) == 1
    summary = found[0]
    assert summary.end_offset == 1_234_567
    assert summary.records_read == 1_234_567 and summary.records_kept == 10_000
    assert abs(summary.mb_read - 1_500 * MIB / 1e6) < 0.1  # "1,500.0 MB" (MiB) -> 1572.9 MB
    assert abs(summary.mb_written - 12 * MIB / 1e6) < 0.1
    # seconds from the rate (205.5 MB/sec, to 0.05 %), not from the printed "7.3"
    assert abs(summary.seconds - 7.3) < 0.01
    assert summary.details["map_s"] == 2.9


def test_pykbroker_cleaner_summary_is_parsed():
    line = ("2026-11-26 22:10:00,001 INFO pykbroker.log.cleaner: log cleaner: cleaned cleaner-bench-0 up to offset "
            "358001: 195.3 MB read, 5.6 MB written, 10000 of 358001 records kept, 10000 keys, 0.41 s (476.3 MB/s)\n")
    (summary,) = pykbroker_summaries(line)
    assert (summary.log, summary.end_offset, summary.mb_read, summary.mb_written) == ("cleaner-bench-0", 358001, 195.3, 5.6)
    assert (summary.records_read, summary.records_kept) == (358001, 10000)
    assert abs(summary.seconds - 195.3 / 476.3) < 1e-9  # from the rate: "0.41" is printed to 0.01 s


def run_side_by_side(*args: str, timeout: float) -> str:
    pytest.importorskip("confluent_kafka", reason="the side-by-side mode produces with confluent-kafka")
    done = subprocess.run([sys.executable, str(BENCH / "cleaner_bench.py"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_side_by_side_mode_cleans_once_in_a_real_pykbroker():
    out = run_side_by_side("--target", "pykbroker", "--mb", "3", "--segment-mb", "1", "--warm-up-mb", "3",
                           timeout=180)
    # 3 MB in 1 MiB segments: the non-active part (2 segments at least) cleaned once, the data read back intact
    read = re.search(r"\| MB read \(the cleaned section\) \| ([\d.]+) \|", out)
    assert read and float(read.group(1)) >= 2.0, out
    assert re.search(r"\| records read -> kept \| ([\d,]+) -> ([\d,]+) \|", out), out
    assert re.search(r"\| broker CPU in the window \(s\) \| [\d.]+ \|", out), out
    assert re.search(r"\| peak RSS in the window \(MiB\) \| \d+ \|", out), out
    assert "| keys whose latest value differs | 0 |" in out, out
    assert "pykbroker / Kafka" not in out  # one target: no ratio column
    assert "3 MB of another topic cleaned first (warm-up)" in out, out


def test_side_by_side_mode_parses_a_real_kafka_cleaning():
    sys.path.insert(0, str(BENCH))
    from brokers import default_refkit, kafka_unavailable_reason

    reason = kafka_unavailable_reason(default_refkit())
    if reason:
        pytest.skip(reason)
    out = run_side_by_side("--target", "kafka", "--mb", "3", "--segment-mb", "1", "--warm-up-mb", "0", timeout=300)
    found = re.search(r"\| records read -> kept \| ([\d,]+) -> ([\d,]+) \|", out)
    assert found and int(found.group(1).replace(",", "")) > int(found.group(2).replace(",", "")) > 0, out
    assert re.search(r"\| cleaning speed \(MB/s, higher is better\) \| [\d.]+ \|", out), out
    assert "| keys whose latest value differs | 0 |" in out, out

"""The descriptor budget (pykbroker/log/files.py) and logs that hold more segments than it allows."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from pykbroker.log import files
from pykbroker.log.config import LogConfig
from pykbroker.log.files import DescriptorBudget, LazyFile, budget_for_limit, raise_descriptor_limit
from pykbroker.log.partition_log import PartitionLog
from pykbroker.protocol.records import build_batch, iter_headers, read_records

TINY = LogConfig(segment_bytes=200, index_interval_bytes=64)  # about one batch per segment


def open_fds(under: Path) -> int:
    """Descriptors this process holds on files under ``under`` (not all of its descriptors: in a full suite
    other threads, such as a Spark gateway's or a client library's, open and close sockets meanwhile)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith(str(under)):
            count += 1
    return count


@pytest.fixture
def small_budget():
    """The shared budget shrunk to 8 files for the test, restored after."""
    budget = files.shared_budget
    saved = budget.limit
    budget.resize(8)
    yield budget
    budget.resize(saved)


def make_files(tmp_path: Path, count: int, budget: DescriptorBudget) -> list[LazyFile]:
    made = []
    for number in range(count):
        path = tmp_path / f"f{number}"
        path.write_bytes(b"%d" % number)
        made.append(LazyFile(path, os.O_RDONLY, budget))
    return made


def test_budget_keeps_the_most_recently_used_files_open(tmp_path):
    budget = DescriptorBudget(3)
    lazy = make_files(tmp_path, 6, budget)
    for file in lazy:
        assert os.pread(file.fd, 1, 0) == str(lazy.index(file)).encode()
    assert [file.is_open for file in lazy] == [False, False, False, True, True, True]
    lazy[3].fd  # touched: now the most recent
    lazy[0].fd  # reopened: closes the least recent, 4
    assert [file.is_open for file in lazy] == [True, False, False, True, False, True]
    assert budget.open_files == 3


def test_pinned_files_stay_open_and_close_is_deferred_until_the_last_pin(tmp_path):
    budget = DescriptorBudget(2)
    lazy = make_files(tmp_path, 4, budget)
    pin = lazy[0].pin()
    with lazy[1].pin() as fd1:
        for file in lazy[2:]:
            file.fd
        assert lazy[0].is_open and lazy[1].is_open  # over budget rather than close a pinned file
        assert os.pread(fd1, 1, 0) == b"1"
    assert budget.pinned == 1
    lazy[0].close()
    assert lazy[0].is_open  # still pinned
    del pin  # dropping the pin releases it
    assert not lazy[0].is_open
    assert budget.pinned == 0 and budget.open_files <= 2


def test_budget_is_half_the_limit_and_the_soft_limit_is_raised(caplog):
    assert budget_for_limit(1024) == 512
    assert budget_for_limit(4) == files.MIN_BUDGET
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    budget = DescriptorBudget(1)
    caplog.set_level("INFO", logger="pykbroker.log.files")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
        assert raise_descriptor_limit(budget) == (hard, hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert budget.limit == budget_for_limit(hard)
    assert f"open-file limit {hard}" in caplog.text


def test_a_log_with_many_segments_holds_at_most_the_budget_and_reopens(tmp_path, small_budget):
    before = open_fds(tmp_path)
    log = PartitionLog.open(tmp_path / "t-0", TINY)
    values = [b"value-%04d" % number + b"x" * 60 for number in range(300)]
    for number, value in enumerate(values):
        log.append(build_batch([(None, value)], timestamp_ms=1000 + number), leader_epoch=0, now_ms=1000 + number)
    assert len(log.segment_base_offsets) >= 250
    assert open_fds(tmp_path) - before <= small_budget.limit

    def read_everything(from_log: PartitionLog) -> list[bytes]:
        got, offset = [], 0
        while offset < from_log.log_end_offset:
            result = from_log.read(offset, 1 << 20)
            # Each slice pins a descriptor: one read stops at the budget instead of opening them all.
            assert 1 <= len(result.slices) <= small_budget.limit
            data = result.read_bytes()
            for header in iter_headers(data):
                got.extend(record.value for record in read_records(data, header))
                offset = header.next_offset
            assert open_fds(tmp_path) - before <= small_budget.limit + 1
        return got

    assert read_everything(log) == values
    log.flush()
    log.abandon()  # as after kill -9: no clean-shutdown marker, every segment recovered
    assert open_fds(tmp_path) == before

    reopened = PartitionLog.open(tmp_path / "t-0", TINY, recovery_point=0)
    assert open_fds(tmp_path) - before <= small_budget.limit
    assert [header.base_offset for header in reopened.headers()] == list(range(300))
    assert read_everything(reopened) == values
    reopened.close()
    assert open_fds(tmp_path) == before

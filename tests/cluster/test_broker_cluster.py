"""The test harness itself (broker_cluster.py): faults do what they say and close() leaves nothing behind.

Run: python3 -m pytest -q tests/cluster/test_broker_cluster.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from broker_cluster import BrokerCluster, wait_threads, wait_until
from broker_process import probe_api_versions


def thread_states(pid: int) -> list[str]:
    return [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in Path(f"/proc/{pid}/task").iterdir()]


def test_wait_threads_sees_every_thread_stop_and_run_again():
    proc = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                             "[threading.Thread(target=time.sleep, args=(60,), daemon=True).start() for _ in range(3)]\n"
                             "time.sleep(60)"])
    try:
        wait_until(lambda: len(thread_states(proc.pid)) == 4, "4 threads", 10)
        os.kill(proc.pid, signal.SIGSTOP)
        wait_threads(proc.pid, stopped=True)
        assert all(state in "tT" for state in thread_states(proc.pid))
        os.kill(proc.pid, signal.SIGCONT)
        wait_threads(proc.pid, stopped=False)
        assert not any(state in "tT" for state in thread_states(proc.pid))
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.timeout(240)
def test_faults_act_on_the_broker_processes_and_close_cleans_up(zk_connect, tmp_path):
    cluster = BrokerCluster(zk_connect, tmp_path, n=3, overrides={"zookeeper.session.timeout.ms": 6000})
    with cluster:
        assert cluster.zk_broker_ids() == {1, 2, 3}
        assert cluster.wait_for_controller() in {1, 2, 3}
        pids = {i: b.process.pid for i, b in cluster.brokers.items()}

        cluster.pause(2)
        assert cluster.live_ids() == {1, 3}
        with pytest.raises(OSError):
            probe_api_versions(cluster.brokers[2].address, timeout=1.0)
        cluster.resume(2)
        probe_api_versions(cluster.brokers[2].address)

        cluster.kill(3)
        assert not cluster.brokers[3].is_running() and cluster.live_ids() == {1, 2}
        wait_until(lambda: cluster.zk_broker_ids() == {1, 2}, "broker 3's registration to expire", 30)
        cluster.wait_ready()

        cluster.restart(3)
        cluster.wait_ready()
        assert cluster.brokers[3].process.pid != pids[3]
        assert cluster.stop(1) == 0  # SIGTERM: controlled shutdown, then exit 0
        wait_until(lambda: cluster.zk_broker_ids() == {2, 3}, "broker 1 to deregister", 30)
        cluster.start_broker(1)
        cluster.wait_ready()
        cluster.pause(1)  # close() must resume it to stop it
        running = [b.process.pid for b in cluster.brokers.values()]
    assert not [pid for pid in running if Path(f"/proc/{pid}").exists()], "broker processes left after close()"
    assert not cluster.root.exists()

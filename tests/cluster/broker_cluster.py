"""A real pykbroker cluster for tests: N broker processes in ZooKeeper mode, faults on demand.

`BrokerCluster(zk_connect, tmp_path, n=3, overrides={...})` runs brokers 1..n, each a
`python -m pykbroker serve --broker-id N --zookeeper <zk_connect> --listeners PLAINTEXT://127.0.0.1:<port>`
process (tests/integration/broker_process.BrokerProcess: one port and data dir across restarts, output
appended to a log file, SIGKILLed by Linux if the test runner dies). Faults: `kill` (SIGKILL), `pause` /
`resume` (SIGSTOP / SIGCONT, waiting until every thread of the process has stopped / runs again), `stop`
(SIGTERM = controlled shutdown, returns the exit status), `restart`.

What the cluster says is read as a client reads it: Metadata v12 from the live brokers (leader, leader
epoch, replicas, ISR, controller id), FindCoordinator v4; and ZooKeeper's own state through kazoo
(/controller, /controller_epoch, partition state znodes), decoded by pykbroker.cluster.zookeeper.
The `wait_for_*` helpers poll with a deadline and require every live broker to agree, so a test that moves
on has seen the controller's UpdateMetadata reach all of them.

Cleanup: `close()` (and leaving the `with` block) SIGTERMs every broker, SIGKILLs those still running
after a bound, closes the ZooKeeper session and removes the cluster's files; a test failing meanwhile gets
each broker's log tail attached through `failure_sections()` (tests/cluster/conftest.py's report hook).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# tests/integration/broker_process.py (BrokerProcess) and integration/faults/ (workload clients, checker),
# which the cluster tests import too; neither directory is a package.
REPO_ROOT = Path(__file__).resolve().parents[2]
for _extra in (REPO_ROOT / "tests" / "integration", REPO_ROOT / "integration" / "faults"):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))

from broker_process import (  # noqa: E402  (tests/integration is not a package)
    BrokerError,
    BrokerProcess,
    ProtocolError,
    send_request,
    wait_until,
)
from kio.schema.errors import ErrorCode  # noqa: E402
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest  # noqa: E402
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic  # noqa: E402

from pykbroker.cluster.zookeeper import (  # noqa: E402
    decode_controller,
    decode_controller_epoch,
    decode_partition_state,
    partition_state_path,
)
from pykbroker.devcluster import pykbroker_command  # noqa: E402

READY_TIMEOUT_S = 60.0
FAILOVER_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 20.0
METADATA_TIMEOUT_S = 2.0
# info, not broker_process's debug: three brokers logging every request slow a loaded machine down
LOG_LEVEL = os.environ.get("PYKBROKER_TEST_LOG_LEVEL", "info")


@dataclass(frozen=True)
class PartitionInfo:
    """One partition as a Metadata answer describes it."""

    error_code: ErrorCode
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline: tuple[int, ...]


def wait_threads(pid: int, *, stopped: bool, timeout: float = 5.0) -> None:
    """Wait until every thread of pid is (or none is) stopped, read from /proc/<pid>/task/*/stat: SIGSTOP and
    SIGCONT are delivered asynchronously, so a 'paused' broker could otherwise still answer for a moment."""
    task_dir = Path(f"/proc/{pid}/task")
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for task in task_dir.iterdir() if task_dir.is_dir() else ():
            try:
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
            except (OSError, IndexError):
                continue
        if not states or all((state in "tT") == stopped for state in states):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"threads of {pid} not {'stopped' if stopped else 'running'}: {states}")
        time.sleep(0.01)


class ClusterBroker(BrokerProcess):
    """A BrokerProcess started in cluster mode, with an id, the cluster's ZooKeeper and --override items."""

    def __init__(self, workdir: Path, broker_id: int, zk_connect: str, overrides: dict | None = None,
                 log_level: str = LOG_LEVEL):
        super().__init__(workdir, log_level=log_level)
        self.broker_id = broker_id
        self.zk_connect = zk_connect
        # Tests stop whole clusters: the last broker's controlled shutdown has nowhere to move its leaderships
        # and retries (controlled.shutdown.max.retries); at Kafka's 5 s backoff that is 10 s per teardown.
        self.overrides = {"controlled.shutdown.retry.backoff.ms": 500, **(overrides or {})}
        self.paused = False
        self.expected_up = False  # started and not deliberately stopped or killed: an exit is a crash
        self._defer_ready = False

    def command(self) -> list[str]:
        cmd = pykbroker_command("serve", "--broker-id", str(self.broker_id),
                                "--zookeeper", self.zk_connect, "--data-dir", str(self.data_dir),
                                "--listeners", f"PLAINTEXT://{self.host}:{self.port}", "--log-level", self.log_level)
        for key, value in self.overrides.items():
            cmd += ["--override", f"{key}={value}"]
        return cmd

    def start(self, timeout: float = READY_TIMEOUT_S, *, wait: bool = True) -> "ClusterBroker":
        """Spawn the broker; with wait=False return at once (the caller calls wait_ready), so that the
        brokers of a cluster start side by side."""
        self.expected_up = True
        self._defer_ready = not wait
        try:
            return super().start(timeout)
        finally:
            self._defer_ready = False

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        if not self._defer_ready:
            super().wait_ready(timeout)

    @property
    def live(self) -> bool:
        """Running and not paused: the broker can answer."""
        return self.is_running() and not self.paused

    def pause(self) -> None:
        assert self.is_running(), f"broker {self.broker_id} is not running"
        os.kill(self.process.pid, signal.SIGSTOP)
        self.paused = True
        wait_threads(self.process.pid, stopped=True)

    def resume(self) -> None:
        if self.is_running():
            os.kill(self.process.pid, signal.SIGCONT)
            wait_threads(self.process.pid, stopped=False)
        self.paused = False

    def stop(self, timeout: float = CLOSE_TIMEOUT_S, sig: int = signal.SIGTERM) -> int:
        self.expected_up = False
        if self.paused:  # a stopped process cannot handle SIGTERM
            self.resume()
        return super().stop(timeout, sig)

    def kill(self) -> None:
        self.expected_up = False
        super().kill()
        self.paused = False


class BrokerCluster:
    """Brokers 1..n on free ports of 127.0.0.1 sharing zk_connect (give each test its own chroot)."""

    def __init__(self, zk_connect: str, tmp_path: Path, n: int = 3, overrides: dict | None = None,
                 log_level: str = LOG_LEVEL, keep_files: bool = False):
        self.zk_connect = zk_connect
        self.keep_files = keep_files  # close() leaves data and logs in place (a failed fault run keeps them)
        self.root = Path(tmp_path) / "cluster"
        self.brokers = {i: ClusterBroker(self.root / f"broker-{i}", i, zk_connect, overrides, log_level)
                        for i in range(1, n + 1)}
        self._zk = None

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self, timeout: float = READY_TIMEOUT_S) -> "BrokerCluster":
        for broker in self.brokers.values():
            broker.start(wait=False)
        for broker in self.brokers.values():
            broker.wait_ready(timeout)  # answers ApiVersions
        self.wait_ready(timeout)
        return self

    def __enter__(self) -> "BrokerCluster":
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """SIGTERM all brokers at once (SIGCONT first for paused ones), SIGKILL after CLOSE_TIMEOUT_S, close
        the ZooKeeper client, remove the files (unless keep_files). Never raises for a slow broker: tests that
        care about a clean exit assert stop()'s status themselves."""
        for broker in self.brokers.values():
            if broker.is_running():
                if broker.paused:
                    broker.resume()
                broker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        for broker in self.brokers.values():
            if broker.process is not None:
                try:
                    broker.process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            broker.kill()
        if self._zk is not None:
            self._zk.stop()
            self._zk.close()
            self._zk = None
        if not self.keep_files:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- faults --------------------------------------------------------------------------------------

    def kill(self, broker_id: int) -> None:
        """SIGKILL: no controlled shutdown; ZooKeeper notices when the session times out."""
        self.brokers[broker_id].kill()

    def pause(self, broker_id: int) -> None:
        self.brokers[broker_id].pause()

    def resume(self, broker_id: int) -> None:
        self.brokers[broker_id].resume()

    def stop(self, broker_id: int, timeout: float = CLOSE_TIMEOUT_S) -> int:
        """SIGTERM (controlled shutdown) and wait for the exit; returns the exit status."""
        return self.brokers[broker_id].stop(timeout)

    def start_broker(self, broker_id: int) -> None:
        """Start a stopped or killed broker again on its port and data dir (ready = answers ApiVersions)."""
        self.brokers[broker_id].start()

    def restart(self, broker_id: int, *, kill: bool = False) -> None:
        self.brokers[broker_id].restart(kill=kill)

    # -- addresses -----------------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """Every broker, running or not: clients find the live ones."""
        return ",".join(b.bootstrap for b in self.brokers.values())

    def live_ids(self) -> set[int]:
        return {i for i, b in self.brokers.items() if b.live}

    # -- what the cluster says -----------------------------------------------------------------------

    def metadata(self, topics: list[str] | None = None, via: int | None = None):
        """Metadata v12 from broker `via`, or from the first live broker that answers. topics=None: all."""
        request = MetadataRequest(
            topics=None if topics is None else tuple(MetadataRequestTopic(topic_id=None, name=t) for t in topics),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        candidates = [via] if via is not None else sorted(self.live_ids())
        errors = []
        for broker_id in candidates:
            try:
                return send_request(self.brokers[broker_id].address, request, timeout=METADATA_TIMEOUT_S)
            except (OSError, ProtocolError) as exc:
                errors.append(f"broker {broker_id}: {exc!r}")
        raise ProtocolError(f"no broker answered Metadata: {errors}")

    def partition(self, topic: str, index: int, via: int | None = None) -> PartitionInfo | None:
        """The partition as broker `via` (or any live broker) sees it; None when it does not know it."""
        for answer in self.metadata([topic], via).topics:
            if answer.name != topic:
                continue
            for p in answer.partitions:
                if p.partition_index == index:
                    return PartitionInfo(p.error_code, int(p.leader_id), int(p.leader_epoch),
                                         tuple(map(int, p.replica_nodes)), tuple(map(int, p.isr_nodes)),
                                         tuple(map(int, p.offline_replicas)))
        return None

    def _agreed(self, read):
        """read(broker_id) from every live broker; the value if they all give the same one, else None."""
        values = set()
        for broker_id in sorted(self.live_ids()):
            try:
                values.add(read(broker_id))
            except (OSError, ProtocolError):
                return None
        return values.pop() if len(values) == 1 else None

    def controller_id(self, via: int | None = None) -> int:
        return int(self.metadata([], via).controller_id)

    def find_coordinator(self, group: str, via: int | None = None) -> int:
        """FindCoordinator v4 for a group: the coordinator's broker id (AssertionError on an error code)."""
        broker_id = via if via is not None else min(self.live_ids())
        answer = send_request(self.brokers[broker_id].address, FindCoordinatorRequest(coordinator_keys=(group,)),
                              timeout=METADATA_TIMEOUT_S).coordinators[0]
        assert answer.error_code == ErrorCode.none, f"FindCoordinator({group}): {answer.error_code!r}"
        return int(answer.node_id)

    # -- waiting for the cluster ---------------------------------------------------------------------

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Every live broker's Metadata lists exactly the live brokers and names a live controller."""
        def ready():
            self._check_running()
            live = self.live_ids()
            listing = self._agreed(lambda b: frozenset(int(x.node_id) for x in self.metadata([], b).brokers))
            return listing == live and self._agreed(self.controller_id) in live

        wait_until(ready, f"brokers {sorted(self.live_ids())} to list each other and a controller", timeout)

    def wait_for_leader(self, topic: str, index: int, *, exclude: set[int] = frozenset(),
                        timeout: float = FAILOVER_TIMEOUT_S) -> int:
        """Until every live broker names the same live leader, not in exclude; returns it."""
        found = []

        def elected():
            self._check_running()
            leader = self._agreed(lambda b: getattr(self.partition(topic, index, b), "leader", None))
            if leader in self.live_ids() and leader not in exclude:
                found.append(leader)
                return True
            return False

        wait_until(elected, f"a leader of {topic}-{index} among {sorted(self.live_ids() - set(exclude))}", timeout)
        return found[-1]

    def wait_for_isr(self, topic: str, index: int, expected, timeout: float = FAILOVER_TIMEOUT_S) -> PartitionInfo:
        """Until every live broker reports exactly the ISR `expected` (any order) with a live leader in it."""
        expected = set(expected)
        seen = []

        def isr_is_expected():
            self._check_running()
            info = self._agreed(lambda b: self.partition(topic, index, b))
            if info is not None and set(info.isr) == expected and info.leader in expected & self.live_ids():
                seen.append(info)
                return True
            return False

        wait_until(isr_is_expected, f"ISR {sorted(expected)} for {topic}-{index}", timeout)
        return seen[-1]

    def wait_for_controller(self, *, exclude: set[int] = frozenset(), timeout: float = FAILOVER_TIMEOUT_S) -> int:
        """Until every live broker names the same live controller, not in exclude; returns it."""
        found = []

        def elected():
            self._check_running()
            controller = self._agreed(self.controller_id)
            if controller in self.live_ids() and controller not in exclude:
                found.append(controller)
                return True
            return False

        wait_until(elected, f"a controller among {sorted(self.live_ids() - set(exclude))}", timeout)
        return found[-1]

    def _check_running(self) -> None:
        """A broker that should run but exited fails the wait at once, with its log."""
        for broker in self.brokers.values():
            if broker.expected_up and not broker.is_running():
                raise BrokerError(f"broker {broker.broker_id} exited with {broker.process.returncode}\n"
                                  f"{broker.log_tail()}")

    # -- ZooKeeper -----------------------------------------------------------------------------------

    def zk(self):
        """A kazoo client on the cluster's chroot (started on first use, closed by close())."""
        if self._zk is None:
            from kazoo.client import KazooClient

            self._zk = KazooClient(hosts=self.zk_connect, timeout=10.0)
            self._zk.start(timeout=15)
        return self._zk

    def zk_controller(self) -> tuple[int | None, int]:
        """(/controller's broker id or None, /controller_epoch)."""
        zk = self.zk()
        controller = decode_controller(zk.get("/controller")[0]) if zk.exists("/controller") else None
        return controller, decode_controller_epoch(zk.get("/controller_epoch")[0])

    def zk_partition_state(self, topic: str, index: int):
        data, stat = self.zk().get(partition_state_path(topic, index))
        return decode_partition_state(data, stat)

    def zk_broker_ids(self) -> set[int]:
        return {int(c) for c in self.zk().get_children("/brokers/ids")}

    def zk_json(self, path: str):
        return json.loads(self.zk().get(path)[0])

    # -- topics --------------------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 3,
                     config: dict[str, str] | None = None, timeout: float = FAILOVER_TIMEOUT_S) -> None:
        """CreateTopics through confluent-kafka's AdminClient, then wait until every partition has its full
        ISR on every live broker."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(name, partitions, replication_factor, config=config or {})],
                                      operation_timeout=timeout, request_timeout=timeout)
        futures[name].result(timeout)
        for index in range(partitions):
            leader = self.wait_for_leader(name, index, timeout=timeout)
            replicas = self.partition(name, index, leader).replicas
            assert len(replicas) == replication_factor, f"{name}-{index}: replicas {replicas}"
            self.wait_for_isr(name, index, replicas, timeout)

    # -- reports -------------------------------------------------------------------------------------

    def failure_sections(self) -> list[tuple[str, str]]:
        return [(f"broker {i} log", b.log_tail(120)) for i, b in self.brokers.items()]

    def __repr__(self) -> str:
        states = {i: ("paused" if b.paused else "running" if b.is_running() else "down")
                  for i, b in self.brokers.items()}
        return f"BrokerCluster({self.zk_connect}, {states})"


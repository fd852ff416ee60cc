"""A randomized, bounded fault run against a 3-broker pykbroker cluster in ZooKeeper mode.

    python3 integration/faults/run_fault_run.py --seed 7 --duration 120 [--partitions 3] [--producers 2]
        [--zookeeper HOST:PORT] [--workdir D] [--keep]

Idempotent acks=all producers (workload.SeqProducer) and a consumer reading from the beginning
(workload.TailConsumer) run the whole time, while a schedule drawn from the seed hits random live brokers:
SIGKILL, SIGSTOP (shorter or longer than the 6 s ZooKeeper session), or SIGTERM (controlled shutdown). Each fault is held for a random
time and healed (restart, SIGCONT); at most one broker is down at a time, except that now and then a second one
goes down briefly (acks=all then waits: min.insync.replicas is 2). After each heal the run waits until every
broker is back and every partition has its full ISR, so faults never pile up. At the end the producers flush,
the log is read from the leaders, and checker.check verifies: acknowledged ⊆ read, no duplicates, each
producer's order per partition, one value per offset for everything consumers saw, no consumer skip.

Prints the fault schedule and the counts (acknowledged, read, lost, duplicates, ...). Exit status 0 when every
invariant holds, 1 on a violation (the cluster's files are kept and their path printed), 2 when the cluster
could not be set up. The same seed gives the same schedule (the timing of what the clients see still varies).
ZooKeeper is Debian's (pykbroker/cluster/zk_server.py) unless --zookeeper names one.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parents[2]
for _extra in (REPO_ROOT, REPO_ROOT / "tests" / "cluster"):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))

from broker_cluster import BrokerCluster  # noqa: E402  (also puts integration/faults on sys.path)
from checker import CheckResult, check  # noqa: E402
from workload import SeqProducer, TailConsumer, read_log  # noqa: E402

SESSION_TIMEOUT_S = 6.0
FAULT_OVERRIDES = {
    "zookeeper.session.timeout.ms": int(SESSION_TIMEOUT_S * 1000),
    "min.insync.replicas": 2,
    "default.replication.factor": 3,
    "offsets.topic.replication.factor": 3,
    "offsets.topic.num.partitions": 6,
    "replica.lag.time.max.ms": 10000,
    "auto.create.topics.enable": "false",
}
FAULTS = ("kill", "pause", "stop")
HEAL_TIMEOUT_S = 90.0
SECOND_FAULT_PROBABILITY = 0.15


@dataclass
class RunReport:
    seed: int
    check: CheckResult
    events: list[str] = field(default_factory=list)
    producer_errors: list = field(default_factory=list)
    unflushed: int = 0
    consumer_errors: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.check.ok and not self.producer_errors and not self.unflushed and not self.consumer_errors

    def summary(self) -> str:
        lines = [f"seed {self.seed}: {len(self.events)} fault events"]
        lines += [f"  {event}" for event in self.events]
        lines.append(self.check.summary())
        lines.append(f"producer errors={len(self.producer_errors)} unanswered={self.unflushed} "
                     f"consumer errors={len(self.consumer_errors)}")
        for error in (self.producer_errors + self.consumer_errors)[:5]:
            lines.append(f"  {error}")
        lines.append("OK" if self.ok else "VIOLATIONS")
        return "\n".join(lines)


class FaultSchedule:
    """Applies and heals faults on a BrokerCluster, writing each step to `events` with its time."""

    def __init__(self, cluster: BrokerCluster, rng: random.Random, say: Callable[[str], None]):
        self.cluster = cluster
        self.rng = rng
        self.say = say
        self.events: list[str] = []
        self.down: dict[int, str] = {}  # broker id -> fault applied
        self.started = time.monotonic()

    def note(self, text: str) -> None:
        event = f"{time.monotonic() - self.started:7.1f}s {text}"
        self.events.append(event)
        self.say(event)

    def hit(self, broker_id: int, fault: str) -> None:
        if fault == "kill":
            self.cluster.kill(broker_id)
        elif fault == "pause":
            self.cluster.pause(broker_id)
        else:
            status = self.cluster.stop(broker_id)
            if status != 0:
                raise AssertionError(f"broker {broker_id} exited with {status} after SIGTERM")
        self.down[broker_id] = fault
        self.note(f"{fault} broker {broker_id}")

    def heal(self, broker_id: int) -> None:
        fault = self.down.pop(broker_id)
        if fault == "pause":
            self.cluster.resume(broker_id)
            self.note(f"resume broker {broker_id}")
        else:
            self.cluster.start_broker(broker_id)
            self.note(f"start broker {broker_id}")

    def heal_all(self) -> None:
        for broker_id in list(self.down):
            self.heal(broker_id)

    def hold(self, seconds: float) -> None:
        """The schedule's own clock: keep the fault in place this long while the clients run."""
        time.sleep(seconds)

    def one_round(self, time_left: float) -> None:
        victim = self.rng.choice(sorted(self.cluster.live_ids()))
        fault = self.rng.choice(FAULTS)
        self.hit(victim, fault)
        # a pause shorter than the session leaves a zombie that keeps its registration, a longer one loses it
        hold = self.rng.uniform(1.0, SESSION_TIMEOUT_S + 4.0) if fault == "pause" else self.rng.uniform(1.0, 6.0)
        if self.rng.random() < SECOND_FAULT_PROBABILITY:
            self.hold(self.rng.uniform(0.5, 2.0))
            second = self.rng.choice(sorted(self.cluster.live_ids()))
            self.hit(second, self.rng.choice(("kill", "pause")))
            self.hold(self.rng.uniform(0.5, 2.0))  # briefly: with 2 down, acks=all waits
            self.heal(second)
        self.hold(max(0.0, min(hold, time_left)))
        self.heal(victim)


def wait_healed(cluster: BrokerCluster, topic: str, partitions: int) -> None:
    cluster.wait_ready(HEAL_TIMEOUT_S)
    for p in range(partitions):
        cluster.wait_for_isr(topic, p, set(cluster.brokers), timeout=HEAL_TIMEOUT_S)


def fault_run(cluster: BrokerCluster, *, seed: int, duration: float, topic: str | None = None,
              partitions: int = 3, producers: int = 2, rate: float = 150.0,
              say: Callable[[str], None] = print) -> RunReport:
    """Run the workload and the fault schedule for `duration` seconds on a started 3-broker cluster, heal,
    read back and check. Every broker is running again when this returns."""
    rng = random.Random(seed)
    topic = topic or f"faults-{seed}-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, partitions=partitions, replication_factor=3)
    ids = list(range(partitions))
    writers = [SeqProducer(cluster.bootstrap, topic, ids, f"p{i}", rate=rate) for i in range(producers)]
    reader = TailConsumer(cluster.bootstrap, topic, ids)
    schedule = FaultSchedule(cluster, rng, say)
    reader.start()
    for writer in writers:
        writer.start()
    try:
        try:
            end = time.monotonic() + duration
            while time.monotonic() < end:
                schedule.one_round(end - time.monotonic())
                wait_healed(cluster, topic, partitions)
                schedule.note("healed: all brokers up, full ISR")
                schedule.hold(rng.uniform(0.5, 3.0))
        finally:
            schedule.heal_all()
            for writer in writers:
                writer.stop()
        wait_healed(cluster, topic, partitions)
        log = read_log(cluster.bootstrap, topic, ids, timeout=120)
        ends = {p: (records[-1][0] + 1 if records else 0) for p, records in log.items()}
        deadline = time.monotonic() + 60
        while any(reader.positions().get(p, 0) < end for p, end in ends.items()) and time.monotonic() < deadline:
            time.sleep(0.1)
        reader.stop()
    finally:
        reader.close()
        for writer in writers:
            writer.close()
    acked = [rec for writer in writers for rec in writer.acked]
    result = check(acked, log, [reader.seen])
    missing_tail = {p: (reader.positions().get(p, 0), end) for p, end in ends.items()
                    if reader.positions().get(p, 0) < end}
    consumer_errors = reader.bad_errors() + ([f"consumer stopped short of the log end: {missing_tail}"]
                                             if missing_tail else [])
    return RunReport(seed=seed, check=result, events=schedule.events,
                     producer_errors=[e for writer in writers for e in writer.bad_errors()],
                     unflushed=sum(writer.unflushed for writer in writers), consumer_errors=consumer_errors)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="schedule seed (default: random, printed)")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of faults (default 120)")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--zookeeper", help="use this ZooKeeper HOST:PORT instead of starting Debian's")
    parser.add_argument("--workdir", type=Path, help="where brokers keep data and logs (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the data and logs even when the run passes")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pykbroker-faults-"))
    print(f"fault run: seed {seed}, {args.duration:.0f} s, workdir {workdir}", flush=True)

    zk = None
    try:
        if args.zookeeper is None:
            from pykbroker.cluster.zk_server import ZooKeeperServer

            zk = ZooKeeperServer(data_dir=workdir / "zookeeper").start()
            connect = zk.connect_string
        else:
            connect = args.zookeeper
        cluster = BrokerCluster(f"{connect}/fault-run-{seed}-{uuid.uuid4().hex[:6]}", workdir, n=3,
                                overrides=FAULT_OVERRIDES, keep_files=True)
        try:
            cluster.start()
        except Exception as exc:
            cluster.close()
            print(f"cluster did not start: {exc}", file=sys.stderr)
            return 2
        try:
            report = fault_run(cluster, seed=seed, duration=args.duration, partitions=args.partitions,
                               producers=args.producers, say=lambda line: print(line, flush=True))
        except Exception as exc:  # the cluster did not heal, a broker crashed, a read did not finish
            print(f"fault run failed: {exc!r}\ndata and logs kept in {workdir}", file=sys.stderr)
            return 1
        finally:
            cluster.close()
    finally:
        if zk is not None:
            zk.stop()
    print(report.summary())
    if report.ok and not args.keep and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"data and logs kept in {workdir}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

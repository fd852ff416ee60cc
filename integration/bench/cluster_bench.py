#!/usr/bin/env python3
"""Replicated workloads: a 3-broker pykbroker cluster against a 3-broker Apache Kafka 3.7.1 cluster in
ZooKeeper mode, on this machine, with the same confluent-kafka load generator, in one run.

    python integration/bench/cluster_bench.py [--target both|pykbroker|kafka] [--messages N]
                                              [--failovers N] [--json out.json]

Each target gets a fresh ZooKeeper (Debian's package, pykbroker/cluster/zk_server.py) and three brokers
on fresh data dirs, every broker with zookeeper.session.timeout.ms=6000. Workloads:
  (r1) produce 1 KiB values, acks=all, to a topic of 3 partitions, replication factor 3,
       min.insync.replicas 2                                     -> MB/s, broker CPU per message (3 brokers summed)
  (r2) consume that topic from offset 0                          -> MB/s
  (f)  failover: an idempotent acks=all producer sends 500 msgs/s to a 1-partition RF 3 topic; the
       leader is killed with SIGKILL; the time from the kill to the first acknowledgement of a record sent
       after it (which only the new leader can give) is the failover time. The killed broker is restarted and
       rejoins the ISR before the next kill.
Kafka comes from ../shared/refkit (Kafka 3.7.1 in ZooKeeper mode, 1 GiB heap per broker, as its start
script's default); without it or java, that target is skipped with the reason.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brokers import REPO_ROOT, BrokerFailed, BrokerProcess, KafkaBroker, default_refkit, kafka_unavailable_reason  # noqa: E402
from workloads import consume_throughput, produce_throughput  # noqa: E402

sys.path.insert(0, str(REPO_ROOT))
from pykbroker.cluster.zk_server import ZooKeeperServer, ZooKeeperUnavailable, find_install  # noqa: E402

BROKERS = 3
SESSION_TIMEOUT_MS = 6000
CLIENT_TIMEOUT_S = 60.0
FAILOVER_RATE = 500  # messages per second during the failover measurement
FAILOVER_BOUND_S = 60.0


@dataclass
class PykbrokerMember(BrokerProcess):
    """One pykbroker broker of a ZooKeeper cluster."""

    broker_id: int = 1
    zookeeper: str = ""

    def command(self, workdir: Path) -> list[str]:
        return [
            sys.executable, "-m", "pykbroker", "serve", "--broker-id", str(self.broker_id),
            "--zookeeper", self.zookeeper, "--host", self.host, "--port", str(self.port),
            "--data-dir", str(workdir / "data"), "--log-level", "warning",
            "--override", f"zookeeper.session.timeout.ms={SESSION_TIMEOUT_MS}", *self.extra_args,
        ]  # fmt: skip


@dataclass
class KafkaZkMember(KafkaBroker):
    """One Apache Kafka 3.7.1 broker in ZooKeeper mode (no storage formatting in that mode)."""

    broker_id: int = 1
    zookeeper: str = ""

    def prepare(self, workdir: Path) -> None:
        properties = "\n".join([
            f"broker.id={self.broker_id}",
            f"zookeeper.connect={self.zookeeper}",
            f"zookeeper.session.timeout.ms={SESSION_TIMEOUT_MS}",
            f"listeners=PLAINTEXT://{self.host}:{self.port}",
            f"log.dirs={workdir / 'data'}",
            "group.initial.rebalance.delay.ms=0",
            *self.extra_args, "",
        ])  # fmt: skip
        self._properties_path(workdir).write_text(properties)


@dataclass
class Cluster:
    target: str
    refkit: Path
    zookeeper: ZooKeeperServer | None = None
    members: dict[int, BrokerProcess] = field(default_factory=dict)
    _chroot: str = "/bench"

    @property
    def bootstrap(self) -> str:
        return ",".join(m.bootstrap for m in self.members.values() if m.process and m.process.poll() is None)

    def _member(self, broker_id: int, port: int = 0) -> BrokerProcess:
        connect = self.zookeeper.connect_string + self._chroot
        if self.target == "kafka":
            member: BrokerProcess = KafkaZkMember(broker_id=broker_id, zookeeper=connect, refkit=self.refkit)
        else:
            member = PykbrokerMember(broker_id=broker_id, zookeeper=connect)
        member.port = port
        return member

    def start(self) -> "Cluster":
        self.zookeeper = ZooKeeperServer(install=find_install()).start()
        for broker_id in range(1, BROKERS + 1):
            self.members[broker_id] = self._member(broker_id).start()
        self.wait_brokers(BROKERS)
        return self

    def restart(self, broker_id: int) -> None:
        """Start a killed broker again on its data dir and port (BrokerProcess.start makes a new dir: reuse)."""
        old = self.members[broker_id]
        workdir, port = old._workdir, old.port
        member = self._member(broker_id, port)
        member._workdir = workdir
        log_file = open(workdir / "broker.log", "ab")
        member.process = subprocess.Popen(member.command(workdir), cwd=workdir, env=member.environment(workdir),
                                          stdout=log_file, stderr=subprocess.STDOUT)
        log_file.close()
        self.members[broker_id] = member

    def wait_brokers(self, count: int) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 3})
        deadline = time.monotonic() + CLIENT_TIMEOUT_S * 2
        while time.monotonic() < deadline:
            try:
                if len(admin.list_topics(timeout=5).brokers) == count:
                    return
            except KafkaException:
                pass
            time.sleep(0.1)
        raise BrokerFailed(f"{self.target}: {count} brokers not registered after {CLIENT_TIMEOUT_S * 2:.0f} s")

    def cpu_seconds(self) -> float:
        return sum(m.cpu().seconds for m in self.members.values() if m.process and m.process.poll() is None)

    def stop(self) -> None:
        for member in self.members.values():
            member.stop_timeout = 60.0
            member.stop()
        if self.zookeeper is not None:
            self.zookeeper.stop()


def create_replicated_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=BROKERS,
                                            config={"min.insync.replicas": "2"})])
    futures[topic].result(timeout=CLIENT_TIMEOUT_S)
    wait_full_isr(bootstrap, topic, partitions)


def wait_full_isr(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Wait until every partition has a leader and BROKERS in-sync replicas; returns the leaders."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    deadline = time.monotonic() + CLIENT_TIMEOUT_S * 2
    while time.monotonic() < deadline:
        try:
            described = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
        except KafkaException:
            described = None
        if (described is not None and described.error is None and len(described.partitions) == partitions
                and all(p.leader >= 0 and len(p.isrs) == BROKERS for p in described.partitions.values())):
            return {index: p.leader for index, p in described.partitions.items()}
        time.sleep(0.1)
    raise BrokerFailed(f"{topic}: no full ISR after {CLIENT_TIMEOUT_S * 2:.0f} s")


def measure_failover(cluster: Cluster, topic: str) -> float:
    """Seconds from SIGKILL of the partition leader to the first acknowledged write after it."""
    leader = wait_full_isr(cluster.bootstrap, topic, 1)[0]
    acked_after_kill: list[float] = []
    errors: list[str] = []
    killed_at = [float("inf")]

    def delivered(sent_at: float, err, msg) -> None:
        # Only a record sent after the kill proves a new leader: one the old leader acknowledged just
        # before dying may have its delivery report read after the kill.
        if err is not None:
            errors.append(str(err))
        elif sent_at > killed_at[0]:
            acked_after_kill.append(time.monotonic())

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 1, "message.timeout.ms": int(FAILOVER_BOUND_S * 1000), "log_level": 3})
    stop = threading.Event()

    def send() -> None:
        interval = 1 / FAILOVER_RATE
        next_at = time.monotonic()
        while not stop.is_set():
            producer.produce(topic, b"x" * 100, on_delivery=functools.partial(delivered, time.monotonic()))
            producer.poll(0)
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        time.sleep(2.0)  # steady state before the kill
        member = cluster.members[leader]
        killed_at[0] = time.monotonic()
        os.kill(member.pid, signal.SIGKILL)
        member.process.wait()
        deadline = killed_at[0] + FAILOVER_BOUND_S
        while not acked_after_kill and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        sender.join()
        producer.flush(FAILOVER_BOUND_S)
    if not acked_after_kill:
        raise BrokerFailed(f"{cluster.target}: no write acknowledged within {FAILOVER_BOUND_S:.0f} s of the kill "
                           f"(errors: {errors[:3]})")
    cluster.restart(leader)
    wait_full_isr(cluster.bootstrap, topic, 1)
    return acked_after_kill[0] - killed_at[0]


def run_target(target: str, args: argparse.Namespace) -> dict[str, object]:
    cluster = Cluster(target, args.refkit)
    try:
        cluster.start()
        bootstrap = cluster.bootstrap
        create_replicated_topic(bootstrap, "replicated", 3)
        cpu_before = cluster.cpu_seconds()
        produced = produce_throughput(bootstrap, "replicated", args.messages, 1024, "all", args.generators)
        produce_cpu = cluster.cpu_seconds() - cpu_before
        cpu_before = cluster.cpu_seconds()
        consumed = consume_throughput(bootstrap, "replicated", 3, args.messages)
        consume_cpu = cluster.cpu_seconds() - cpu_before
        create_replicated_topic(bootstrap, "failover", 1)
        failovers = [measure_failover(cluster, "failover") for _ in range(args.failovers)]
        return {
            "produce_1kib_acks_all_mb_s": produced["mb_per_s"],
            "produce_msgs_s": produced["msgs_per_s"],
            "produce_client_loop_core_share": produced["client_loop_core_share"],
            "produce_broker_cpu_us_per_msg": produce_cpu / args.messages * 1e6,
            "consume_mb_s": consumed["mb_per_s"],
            "consume_broker_cpu_us_per_msg": consume_cpu / args.messages * 1e6,
            "failover_s": failovers,
            "failover_median_s": statistics.median(failovers) if failovers else None,
        }
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=("both", "pykbroker", "kafka"), default="both")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--generators", type=int, default=1)
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--refkit", type=Path, default=default_refkit())
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    try:
        find_install()
    except ZooKeeperUnavailable as exc:
        print(f"skipped: {exc}")
        return 0
    targets = ["pykbroker", "kafka"] if args.target == "both" else [args.target]
    results: dict[str, object] = {}
    for target in targets:
        if target == "kafka":
            reason = kafka_unavailable_reason(args.refkit)
            if reason:
                print(f"kafka skipped: {reason}")
                continue
        print(f"== {target}: 3 brokers, RF 3, min.insync.replicas 2", flush=True)
        results[target] = run_target(target, args)
        print(json.dumps(results[target], indent=2), flush=True)
    if "pykbroker" in results and "kafka" in results:
        ours, theirs = results["pykbroker"], results["kafka"]
        print("\npykbroker / Kafka:")
        for key in ("produce_1kib_acks_all_mb_s", "consume_mb_s", "produce_broker_cpu_us_per_msg",
                    "consume_broker_cpu_us_per_msg", "failover_median_s"):
            print(f"  {key:34s} {ours[key]:10.3f} {theirs[key]:10.3f}   ratio {ours[key] / theirs[key]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

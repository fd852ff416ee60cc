#!/usr/bin/env python3
"""The cost of the container: pykbroker in its Docker image (docker/Dockerfile) against a bare
`pykbroker serve` process of the same checkout, side by side, with the same confluent-kafka load generator.

    python integration/bench/container_bench.py [--rounds 2] [--messages 200000] [--samples 3]
                                                [--image TAG] [--bare-python PYTHON] [--json out.json]

Figures, per target (bare, container), rounds interleaved (bare, container, bare, ...) so that the machine's
drift hits both alike:
  image size            the image and its base (`docker image inspect`)
  start-to-ready        spawn (`python -m pykbroker serve` / `docker run --rm --network host IMAGE ...`)
                        until the broker answers ApiVersions v0 (brokers.py's probe); --samples per round,
                        median
  (a) produce           --messages values of 100 B, acks=1, to a 3-partition topic (workloads.py)
  (b) produce           --messages/4 values of 1 KiB, acks=all
  (c) consume (b)       from offset 0, batches of 1,000
Both brokers listen on 127.0.0.1 (the container on the host's network: no port forwarding or bridge in the
path) with --log-level warning and the default fsync; the container's data dir is its anonymous /data
volume (overlay-free, as a named volume), the bare one a temporary directory on the same disk.
The image is built first (BuildKit, cached layers) from this checkout on the local Debian base, as the
tests build it (tests/containers/docker_helpers.py); --image TAG uses an image built beforehand.
--bare-python PYTHON adds a third target, the bare process under another interpreter (e.g. a venv of Debian's
/usr/bin/python3 with pykbroker's dependencies, the interpreter the image runs): the container's cost apart
from the interpreter's build (a pyenv build without PGO/LTO is slower than Debian's).
It is not a test: nothing asserts a time; exit status 1 only when a workload or broker failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from brokers import REPO_ROOT, BrokerFailed, BrokerProcess  # noqa: E402
from workloads import WorkloadFailed, check_stored, consume_throughput, create_topic, produce_throughput  # noqa: E402

sys.path.insert(0, str(REPO_ROOT / "tests" / "containers"))
from docker_helpers import (  # noqa: E402  (the tests' image build and labels; tests/containers is no package)
    DEBIAN_BASE_IMAGE,
    BROKER_TEST_IMAGE,
    SUITE_LABELS,
    build_image,
    docker_cli,
    engine_script,
)

PARTITIONS = 3


class ContainerBroker(BrokerProcess):
    """The same broker in its image: `docker run --rm --network host` in the foreground (the spawned process
    is the docker client, which forwards signals); stop() is `docker stop` (SIGTERM to the broker, PID 1)."""

    name = "container"
    image = BROKER_TEST_IMAGE

    def command(self, workdir: Path) -> list[str]:
        self.container_name = f"pykbroker-bench-{os.getpid()}-{self.port}"
        labels = [f"--label={key}={value}" for key, value in SUITE_LABELS.items()]
        return [docker_cli(), "run", "--rm", "--network", "host", "--name", self.container_name, *labels,
                self.image, "--host", self.host, "--port", str(self.port), "--data-dir", "/data",
                "--log-level", "warning", *self.extra_args]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            subprocess.run([docker_cli(), "stop", "-t", str(int(self.stop_timeout)), self.container_name],
                           capture_output=True, timeout=self.stop_timeout + 30)
        super().stop()


def bare_with(python: str) -> type[BrokerProcess]:
    """The bare broker of this checkout under another interpreter."""

    class OtherPython(BrokerProcess):
        name = "bare-other-python"

        def command(self, workdir: Path) -> list[str]:
            return [python, *super().command(workdir)[1:]]

    return OtherPython


def start_to_ready(kind: type[BrokerProcess]) -> float:
    with kind() as broker:
        return broker.start_to_ready_s


def workload_round(kind: type[BrokerProcess], messages: int, round_no: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    with kind() as broker:
        topics = {w: f"bench-{w}-{round_no}" for w in ("warm", "a", "b")}
        for topic in topics.values():
            create_topic(broker.bootstrap, topic, PARTITIONS)
        produce_throughput(broker.bootstrap, topics["warm"], messages // 10, 100, "1")   # lazy imports, caches
        a = produce_throughput(broker.bootstrap, topics["a"], messages, 100, "1")
        check_stored(broker.bootstrap, topics["a"], PARTITIONS, messages)
        b = produce_throughput(broker.bootstrap, topics["b"], messages // 4, 1024, "all")
        check_stored(broker.bootstrap, topics["b"], PARTITIONS, messages // 4)
        c = consume_throughput(broker.bootstrap, topics["b"], PARTITIONS, messages // 4)
        figures.update({"a_msgs_per_s": a["msgs_per_s"], "a_mb_per_s": a["mb_per_s"],
                        "b_msgs_per_s": b["msgs_per_s"], "b_mb_per_s": b["mb_per_s"],
                        "c_msgs_per_s": c["msgs_per_s"], "c_mb_per_s": c["mb_per_s"]})
        broker.check_alive()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--samples", type=int, default=3, help="start-to-ready samples per round and target")
    parser.add_argument("--image", help="an image built beforehand (default: build this checkout's)")
    parser.add_argument("--bare-python", help="also run the bare broker under this interpreter (a third target)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    started = engine_script("start")
    if started.returncode != 0:
        print(f"no Docker engine: {started.stderr.strip()}", file=sys.stderr)
        return 1
    try:
        if args.image:
            ContainerBroker.image = args.image
        else:
            base = engine_script("base-image")
            if base.returncode != 0:
                print(f"no base image: {base.stderr.strip()}", file=sys.stderr)
                return 1
            build_started = time.monotonic()
            build_image(BROKER_TEST_IMAGE, REPO_ROOT / "docker" / "Dockerfile", REPO_ROOT,
                        {"BASE_IMAGE": base.stdout.strip()})
            print(f"image built (or found in the layer cache) in {time.monotonic() - build_started:.1f} s")
        return run(args)
    finally:
        if started.stdout.strip() == "started":
            engine_script("stop")


def image_size_mb(tag: str) -> float:
    done = subprocess.run([docker_cli(), "image", "inspect", "-f", "{{.Size}}", tag], capture_output=True,
                          text=True, check=True)
    return int(done.stdout) / 1e6


def run(args: argparse.Namespace) -> int:
    # The bare broker's bytecode once, as scripts/test.sh does (the image has its own): with
    # PYTHONDONTWRITEBYTECODE set, every bare start would otherwise compile the package again.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO_ROOT / "pykbroker")], check=True)
    targets: dict[str, type[BrokerProcess]] = {"bare": BrokerProcess, "container": ContainerBroker}
    if args.bare_python:
        targets = {"bare": BrokerProcess, "bare, --bare-python": bare_with(args.bare_python),
                   "container": ContainerBroker}
    results: dict[str, object] = {
        "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg(),
        "image": ContainerBroker.image, "image_mb": image_size_mb(ContainerBroker.image),
        "base_image": DEBIAN_BASE_IMAGE, "base_image_mb": image_size_mb(DEBIAN_BASE_IMAGE),
        "messages": args.messages, "bare_python": [sys.executable, args.bare_python], "rounds": [],
    }
    ready: dict[str, list[float]] = {name: [] for name in targets}
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
    try:
        for round_no in range(args.rounds):
            for name, kind in targets.items():
                for _ in range(args.samples):
                    ready[name].append(start_to_ready(kind))
                figures = workload_round(kind, args.messages, round_no)
                rounds[name].append(figures)
                results["rounds"].append({"target": name, "round": round_no, **figures})
                print(f"round {round_no + 1} {name}: " + ", ".join(f"{k} {v:,.1f}" for k, v in figures.items()),
                      flush=True)
    except (BrokerFailed, WorkloadFailed) as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return 1
    results["load_average_at_end"] = os.getloadavg()
    medians = {name: {"start_to_ready_s": statistics.median(ready[name]),
                      **{key: statistics.median(r[key] for r in rounds[name]) for key in rounds[name][0]}}
               for name in targets}
    results["medians"] = medians
    print(f"\nimage {ContainerBroker.image}: {results['image_mb']:.0f} MB "
          f"(base {DEBIAN_BASE_IMAGE}: {results['base_image_mb']:.0f} MB); {os.cpu_count()} CPUs, load average "
          f"{results['load_average_at_start'][0]:.1f} at start, {results['load_average_at_end'][0]:.1f} at end\n")
    rows = [("start-to-ready (s, median)", "start_to_ready_s", "{:.3f}"),
            ("(a) produce 100 B acks=1 (msgs/s)", "a_msgs_per_s", "{:,.0f}"),
            ("(b) produce 1 KiB acks=all (MB/s)", "b_mb_per_s", "{:.1f}"),
            ("(c) consume (b) (MB/s)", "c_mb_per_s", "{:.1f}")]
    names = list(targets)
    print("| figure | " + " | ".join(names) + " | container / bare |")
    print("| --- |" + " ---: |" * (len(names) + 1))
    for label, key, fmt in rows:
        cells = " | ".join(fmt.format(medians[name][key]) for name in names)
        print(f"| {label} | {cells} | {medians['container'][key] / medians['bare'][key]:.2f} |")
    if args.bare_python:
        print(f"(bare: {sys.executable}; bare, --bare-python: {args.bare_python})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

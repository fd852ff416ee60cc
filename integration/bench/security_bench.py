#!/usr/bin/env python3
"""What security costs: pykbroker against Apache Kafka 3.7.1 over PLAINTEXT, SSL and SASL_SSL (SCRAM-SHA-256).

    python integration/bench/security_bench.py [--target both|pykbroker|kafka] [--rounds N] [--messages N]
                                               [--generators N] [--connections N] [--protocols P,...]
                                               [--json out.json]

Each broker serves three listeners side by side, configured with the same Kafka property names for both
(``listeners``, ``ssl.keystore.*`` with a PEM key store made by ``openssl`` here, ``sasl.enabled.mechanisms``,
``listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config``); the SCRAM user is created through the PLAINTEXT
listener with AlterUserScramCredentials (confluent-kafka's admin client), as an operator would.

Per listener, with the same confluent-kafka load generator as run_bench.py (workloads.py):
  produce  1 KiB values, acks=all, ``--generators`` processes   -> MB/s, broker CPU µs per message
  consume  the same topic from offset 0, assign()               -> MB/s, broker CPU µs per message
  connect  ``--connections`` new clients one after another, each an AdminClient that fetches metadata and
           closes (librdkafka opens a bootstrap connection and then one to the broker it learnt: about two
           TLS handshakes and SCRAM exchanges per client)           -> ms per client, broker CPU ms per client
Rounds interleave the targets (pykbroker, then Kafka), each on a new broker and data dir. The table prints
medians and pykbroker / Kafka ratios (throughput: higher is better for pykbroker; CPU and setup time: lower
is better). Load-generator CPU is reported so that a client-bound run can be recognised (a generator loop
near 100 % of a core measures the client). Run it on a quiet machine.

Without ../shared/refkit or java, the Kafka side is skipped with the reason.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from brokers import REPO_ROOT, BrokerFailed, BrokerProcess, KafkaBroker, default_refkit, free_port, kafka_unavailable_reason
from workloads import CLIENT_TIMEOUT_S, check_stored, consume_throughput, create_topic, produce_throughput

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL")
USER, PASSWORD = "bench", "bench-secret"
MECHANISM = "SCRAM-SHA-256"
PARTITIONS = 3
VALUE_SIZE = 1024


# -- certificates, made with openssl as the README's walkthrough makes them --------------------------------

def make_pki(directory: Path) -> dict[str, Path]:
    """A CA and a server certificate for 127.0.0.1 / localhost; the key store is one PEM file holding the
    unencrypted PKCS#8 key and the certificate chain (Kafka's ssl.keystore.type=PEM)."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=bench CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=localhost")
    (directory / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "2", "-extfile", "san.ext")
    openssl("pkcs8", "-topk8", "-nocrypt", "-in", "server.key", "-out", "server.pk8")
    keystore = directory / "server-keystore.pem"
    keystore.write_text((directory / "server.pk8").read_text() + (directory / "server.crt").read_text()
                        + (directory / "ca.pem").read_text())
    return {"keystore": keystore, "ca": directory / "ca.pem"}


def security_lines(host: str, ports: dict[str, int], pki: dict[str, Path]) -> list[str]:
    """The server.properties lines both brokers get (Kafka's names; PLAINTEXT stays the inter-broker listener)."""
    listeners = ",".join(f"{protocol}://{host}:{port}" for protocol, port in ports.items())
    lines = [f"advertised.listeners={listeners}", "inter.broker.listener.name=PLAINTEXT",
             "ssl.keystore.type=PEM", f"ssl.keystore.location={pki['keystore']}"]
    if "SASL_SSL" in ports:
        lines += [f"sasl.enabled.mechanisms={MECHANISM}",
                  f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config="
                  "org.apache.kafka.common.security.scram.ScramLoginModule required;"]
    return lines


def listener_ports(port: int, protocols: list[str]) -> dict[str, int]:
    """PLAINTEXT on the broker's own port (readiness, admin), each other protocol on a free port."""
    return {"PLAINTEXT": port, **{protocol: free_port() for protocol in protocols if protocol != "PLAINTEXT"}}


def client_settings(protocol: str, pki: dict[str, Path]) -> dict[str, object]:
    settings: dict[str, object] = {"security.protocol": protocol}
    if protocol in ("SSL", "SASL_SSL"):
        settings["ssl.ca.location"] = str(pki["ca"])
    if protocol.startswith("SASL"):
        settings.update({"sasl.mechanism": MECHANISM, "sasl.username": USER, "sasl.password": PASSWORD})
    return settings


@dataclass
class SecurePykbroker(BrokerProcess):
    """pykbroker serving PLAINTEXT (self.port, for readiness and admin), SSL and SASL_SSL."""

    pki: dict[str, Path] = field(default_factory=dict)
    protocols: list[str] = field(default_factory=lambda: list(PROTOCOLS))
    ports: dict[str, int] = field(default_factory=dict)

    def command(self, workdir: Path) -> list[str]:
        self.ports = listener_ports(self.port, self.protocols)
        properties = workdir / "server.properties"
        listeners = ",".join(f"{protocol}://{self.host}:{port}" for protocol, port in self.ports.items())
        properties.write_text("\n".join([f"listeners={listeners}", *security_lines(self.host, self.ports, self.pki)])
                              + "\n")
        return [sys.executable, "-m", "pykbroker", "serve", "--config", str(properties),
                "--data-dir", str(workdir / "data"), "--log-level", "warning"]


@dataclass
class SecureKafka(KafkaBroker):
    """Kafka 3.7.1 (KRaft, one node) with the same three listeners; CONTROLLER stays on its own port."""

    pki: dict[str, Path] = field(default_factory=dict)
    protocols: list[str] = field(default_factory=lambda: list(PROTOCOLS))
    ports: dict[str, int] = field(default_factory=dict)

    def server_properties(self, workdir: Path) -> str:
        self.ports = listener_ports(self.port, self.protocols)
        extra = "".join(f",{protocol}://{self.host}:{port}" for protocol, port in self.ports.items() if protocol != "PLAINTEXT")
        self.extra_args = [
            *security_lines(self.host, self.ports, self.pki),
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL",
        ]
        # kraft_properties' listeners line gains the two secure listeners (the later map line overrides its map).
        return super().server_properties(workdir).replace(
            f"listeners=PLAINTEXT://{self.host}:{self.port},",
            f"listeners=PLAINTEXT://{self.host}:{self.port}{extra},", 1)


def add_scram_user(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 5})
    upsert = UserScramCredentialUpsertion(USER, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                          PASSWORD.encode())
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=CLIENT_TIMEOUT_S)


def wait_for_scram_login(broker, settings: dict[str, object]) -> None:
    """A new credential reaches Kafka's SCRAM cache through its metadata log a moment later: try until a login works."""
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while True:
        try:
            admin = AdminClient({"bootstrap.servers": f"{broker.host}:{broker.ports['SASL_SSL']}", "log_level": 0,
                                 **settings})
            admin.list_topics(timeout=5)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def connection_setup(broker, protocol: str, settings: dict[str, object], count: int) -> dict[str, float]:
    bootstrap = f"{broker.host}:{broker.ports[protocol]}"
    cpu_before = broker.cpu()
    started = time.perf_counter()
    for _ in range(count):
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 5, **settings})
        metadata = admin.list_topics(timeout=CLIENT_TIMEOUT_S)
        if not metadata.brokers:
            raise RuntimeError(f"no brokers in the metadata over {protocol}")
        del admin
    elapsed = time.perf_counter() - started
    return {"ms_per_client": 1000 * elapsed / count,
            "broker_cpu_ms_per_client": 1000 * broker.cpu().since(cpu_before) / count}


def run_target(make, args, pki, round_index: int) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    with make(pki=pki, protocols=args.protocols) as broker:
        plain = f"{broker.host}:{broker.port}"
        if "SASL_SSL" in args.protocols:
            add_scram_user(plain)
            wait_for_scram_login(broker, client_settings("SASL_SSL", pki))
        for protocol in args.protocols:
            settings = client_settings(protocol, pki)
            bootstrap = f"{broker.host}:{broker.ports[protocol]}"
            topic = f"sec-{protocol.lower()}-{round_index}"
            create_topic(plain, topic, PARTITIONS)
            before = broker.cpu()
            produced = produce_throughput(bootstrap, topic, args.messages, VALUE_SIZE, "all", args.generators,
                                          settings=settings)
            produce_cpu = broker.cpu().since(before)
            check_stored(plain, topic, PARTITIONS, args.messages)
            before = broker.cpu()
            consumed = consume_throughput(bootstrap, topic, PARTITIONS, args.messages, settings=settings)
            consume_cpu = broker.cpu().since(before)
            setup = connection_setup(broker, protocol, settings, args.connections)
            broker.check_alive()
            results[protocol] = {
                "produce_mb_s": produced["mb_per_s"],
                "produce_cpu_us_per_msg": 1e6 * produce_cpu / args.messages,
                "produce_client_loop_core_share": produced.get("client_loop_core_share", 0.0),
                "consume_mb_s": consumed["mb_per_s"],
                "consume_cpu_us_per_msg": 1e6 * consume_cpu / args.messages,
                "consume_client_loop_core_share": consumed["client_loop_core_share"],
                **setup,
            }
            print(f"  {broker.name:9} {protocol:10} " + "  ".join(f"{k}={v:.2f}" for k, v in results[protocol].items()),
                  flush=True)
    return results


FIGURES = (("produce_mb_s", "produce MB/s", True), ("produce_cpu_us_per_msg", "produce broker CPU µs/msg", False),
           ("consume_mb_s", "consume MB/s", True), ("consume_cpu_us_per_msg", "consume broker CPU µs/msg", False),
           ("ms_per_client", "connect ms/client", False), ("broker_cpu_ms_per_client", "connect broker CPU ms/client", False))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=("both", "pykbroker", "kafka"), default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--generators", type=int, default=2)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.protocols = [p.strip().upper() for p in args.protocols.split(",") if p.strip()]
    unknown = set(args.protocols) - set(PROTOCOLS)
    if unknown:
        parser.error(f"unknown protocols {sorted(unknown)}; choose among {', '.join(PROTOCOLS)}")
    targets: list[tuple[str, type]] = []
    if args.target in ("both", "pykbroker"):
        targets.append(("pykbroker", SecurePykbroker))
    if args.target in ("both", "kafka"):
        reason = kafka_unavailable_reason(default_refkit())
        if reason:
            print(f"Kafka skipped: {reason}")
        else:
            targets.append(("kafka", SecureKafka))
    pki_dir = Path(tempfile.mkdtemp(prefix="security-bench-pki-"))
    pki = make_pki(pki_dir)
    rounds: list[dict[str, dict]] = []
    for index in range(args.rounds):
        print(f"round {index + 1}/{args.rounds}", flush=True)
        rounds.append({name: run_target(make, args, pki, index) for name, make in targets})
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for name, _ in targets:
        summary[name] = {protocol: {key: statistics.median(r[name][protocol][key] for r in rounds)
                                    for key, _, _ in FIGURES}
                         for protocol in args.protocols}
    print(f"\nmedians of {args.rounds} rounds, {args.messages} x {VALUE_SIZE} B, {args.generators} generator(s), "
          f"{args.connections} connections")
    header = f"{'':32}" + "".join(f"{p:>30}" for p in args.protocols)
    print(header)
    for key, label, _higher_better in FIGURES:
        for name, _ in targets:
            print(f"{label + ' ' + name:32}" + "".join(f"{summary[name][p][key]:>30.2f}" for p in args.protocols))
        if len(targets) == 2:
            print(f"{label + ' ratio':32}" + "".join(
                f"{summary['pykbroker'][p][key] / summary['kafka'][p][key]:>30.2f}" if summary["kafka"][p][key] else f"{'-':>30}"
                for p in args.protocols))
    out = args.json or REPO_ROOT / "integration" / "bench" / "results" / (
        "security-" + datetime.datetime.now().strftime("%Y%m%dT%H%M%S") + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "json"}, "rounds": rounds,
                               "medians": summary, "cpus": os.cpu_count()}, indent=1, default=str))
    print(f"\nwritten {out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokerFailed as exc:
        print(f"broker failed: {exc}", file=sys.stderr)
        sys.exit(1)

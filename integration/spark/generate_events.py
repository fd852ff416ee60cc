"""Produce JSON city events to a Kafka topic (pykbroker or Kafka) with kafka-python or confluent-kafka.

    python integration/spark/generate_events.py --bootstrap 127.0.0.1:9092 --topic city-events --count 5000

Creates the topic (3 partitions by default) when it is missing. Each event is keyed by its city, so a
city always goes to the same partition; its record timestamp is its event time. See city_pipeline/events.py
for the format.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from city_pipeline.cli import add_bootstrap_argument
from city_pipeline.events import CITIES, make_events, parse_time_ms
from city_pipeline.producer import CLIENTS, ensure_topic, produce_events


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_bootstrap_argument(parser)
    parser.add_argument("--topic", default="city-events")
    parser.add_argument("--partitions", type=int, default=3, help="for a new topic (default %(default)s)")
    parser.add_argument("--count", type=int, default=1000, help="events to send (default %(default)s)")
    parser.add_argument("--rate", type=float, default=0.0, help="events per second, 0 = as fast as possible")
    parser.add_argument("--start", default="now",
                        help="event time of the first event: now, ISO-8601 or epoch ms (default now)")
    parser.add_argument("--step-ms", type=int, default=1000, help="event time between events (default 1000)")
    parser.add_argument("--lateness-ms", type=int, default=0,
                        help="stamp each event up to this much earlier than its slot (out-of-order events)")
    parser.add_argument("--seed", type=int, default=0, help="the same seed makes the same events")
    parser.add_argument("--cities", default=",".join(CITIES), help="comma-separated city names")
    parser.add_argument("--client", choices=CLIENTS, default="kafka-python")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start_ms = int(time.time() * 1000) if args.start == "now" else parse_time_ms(args.start)
    cities = [city.strip() for city in args.cities.split(",") if city.strip()]
    events = make_events(args.count, start_ms=start_ms, step_ms=args.step_ms, cities=cities, seed=args.seed,
                         max_lateness_ms=args.lateness_ms)
    if ensure_topic(args.bootstrap, args.topic, args.partitions):
        print(f"created topic {args.topic} with {args.partitions} partitions")
    deliveries = produce_events(args.bootstrap, args.topic, events, client=args.client, rate=args.rate)

    per_city = Counter(d.event.city for d in deliveries)
    partition_of = {d.event.city: d.partition for d in deliveries}
    print(f"sent {len(deliveries)} events to {args.topic} with {args.client}")
    for city in sorted(per_city):
        print(f"  {city:<12} partition {partition_of[city]}  {per_city[city]} events")
    for partition in sorted({d.partition for d in deliveries}):
        offsets = [d.offset for d in deliveries if d.partition == partition]
        print(f"  partition {partition}: offsets {min(offsets)}..{max(offsets)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

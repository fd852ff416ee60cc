"""City events: the JSON the generator writes and the Spark jobs parse.

One event is one Kafka record:
  key     the city, UTF-8 (so the producer's partitioner keeps each city on one partition)
  value   {"event_id": "e-000042", "city": "Lisbon", "kind": "click", "amount": 12.5,
           "event_time": "2026-11-22T10:00:01.250Z"}
  headers ("schema", b"city-event/v1")
  timestamp  the event time in epoch milliseconds, so a replay by timestamp selects by event time

Events are made deterministically from a seed, so a test can compute what the pipeline must count.
Event times advance by `step_ms` per event; with `max_lateness_ms` an event may be stamped up to that
much earlier than its slot, which is how real streams arrive slightly out of order.
"""

from __future__ import annotations

import datetime
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass

CITIES = ("Amsterdam", "Berlin", "Lisbon", "Madrid", "Oslo", "Paris", "Rome", "Vienna")
KINDS = ("view", "click", "purchase")
SCHEMA_HEADER = ("schema", b"city-event/v1")


@dataclass(frozen=True)
class CityEvent:
    event_id: str
    city: str
    kind: str
    amount: float
    event_time_ms: int

    @property
    def key(self) -> bytes:
        return self.city.encode()

    @property
    def value(self) -> bytes:
        return json.dumps({
            "event_id": self.event_id,
            "city": self.city,
            "kind": self.kind,
            "amount": self.amount,
            "event_time": iso_millis(self.event_time_ms),
        }, separators=(",", ":")).encode()


def iso_millis(epoch_ms: int) -> str:
    """ISO-8601 in UTC with milliseconds and a Z, the format the Spark parser is told to expect."""
    moment = datetime.datetime.fromtimestamp(epoch_ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


def parse_time_ms(text: str) -> int:
    """Epoch milliseconds from digits, or from ISO-8601 (a missing zone means UTC; 'Z' is accepted)."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return round(moment.timestamp() * 1000)


def make_events(count: int, *, start_ms: int, step_ms: int = 1000, cities: Iterable[str] = CITIES,
                seed: int = 0, max_lateness_ms: int = 0, id_prefix: str = "e") -> list[CityEvent]:
    """`count` events in send order; event i belongs to the slot start_ms + i * step_ms."""
    if count < 0 or step_ms < 0 or max_lateness_ms < 0:
        raise ValueError("count, step_ms and max_lateness_ms must not be negative")
    cities = tuple(cities)
    if not cities:
        raise ValueError("at least one city is needed")
    rng = random.Random(seed)
    events = []
    for i in range(count):
        lateness = rng.randint(0, max_lateness_ms) if max_lateness_ms else 0
        events.append(CityEvent(
            event_id=f"{id_prefix}-{i:06d}",
            city=rng.choice(cities),
            kind=rng.choice(KINDS),
            amount=round(rng.uniform(1, 100), 2),
            event_time_ms=start_ms + i * step_ms - lateness,
        ))
    return events

"""Per-request counters kept by the broker while metrics are on: plain ints in dicts, no locks.

The hot path only adds to dictionaries here (a request: one latency bucket, one request count, one count
per error code of the response; a produce: messages and bytes per topic; a fetch: bytes per topic). The
scrape (pykbroker/metrics/collector.py) turns them into Prometheus metric families; nothing here knows
Prometheus. With metrics off the broker holds no BrokerStats (``broker.stats is None``) and the hooks cost
one attribute test.
"""

from __future__ import annotations

import dataclasses
import typing
from bisect import bisect_left
from time import perf_counter
from typing import Any, Callable

# Upper bounds (seconds) of the request latency histogram's buckets; +Inf is implicit.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)


class LatencyHistogram:
    """Counts per bucket (not cumulative; the last one is +Inf) and the sum of observed seconds."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus buckets: (upper bound as text, observations at or below it), ending with +Inf."""
        buckets, running = [], 0
        for bound, count in zip((*(repr(b) for b in LATENCY_BUCKETS), "+Inf"), self.counts):
            running += count
            buckets.append((bound, running))
        return buckets


# How to find the error codes of one response entity class: (field name, kind, nested plan).
_ERROR, _MANY, _ONE = 0, 1, 2
_Plan = tuple[tuple[str, int, Any], ...]
_plans: dict[type, _Plan] = {}


def _entity_class(hint: Any) -> type | None:
    """The kio entity class a field holds (itself, or optional), else None."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    for arg in typing.get_args(hint):  # X | None
        if arg is not type(None) and dataclasses.is_dataclass(arg) and isinstance(arg, type):
            return arg
    return None


def _plan_for(cls: type) -> _Plan:
    """Where ``cls`` and its nested entities keep error codes (kio marks them kafka_type "error_code");
    built once per class. Branches without any error code are left out, so walking is cheap."""
    plan = _plans.get(cls)
    if plan is not None:
        return plan
    _plans[cls] = ()  # (recursive schemas cannot loop)
    steps: list[tuple[str, int, Any]] = []
    for f in dataclasses.fields(cls):
        kafka_type = f.metadata.get("kafka_type")
        if kafka_type == "error_code":
            steps.append((f.name, _ERROR, None))
        elif kafka_type is None:
            hint = f.type
            if typing.get_origin(hint) is tuple:
                args = typing.get_args(hint)
                nested = _entity_class(args[0]) if args else None
                kind = _MANY
            else:
                nested, kind = _entity_class(hint), _ONE
            if nested is not None:
                sub = _plan_for(nested)
                if sub:
                    steps.append((f.name, kind, sub))
    plan = tuple(steps)
    _plans[cls] = plan
    return plan


def _count_errors(entity: Any, plan: _Plan, counts: dict[int, int]) -> None:
    """Add the error codes of ``entity`` to ``counts`` (keys are kio's ErrorCode, an int enum)."""
    for name, kind, sub in plan:
        value = getattr(entity, name)
        if kind == _ERROR:
            counts[value] = counts.get(value, 0) + 1
        elif kind == _MANY:
            if sub[0][1] == _ERROR and len(sub) == 1:  # a list of entities each with just an error code
                field = sub[0][0]
                for item in value:
                    code = getattr(item, field)
                    counts[code] = counts.get(code, 0) + 1
            else:
                for item in value:
                    _count_errors(item, sub, counts)
        elif value is not None:
            _count_errors(value, sub, counts)


class BrokerStats:
    """What the broker counts for /metrics. Keys are plain tuples and strings; see the collector for names."""

    def __init__(self, clock: Callable[[], float] = perf_counter) -> None:
        self.clock = clock
        self.requests: dict[tuple[int, int], int] = {}  # (api key, version) -> answered requests
        self.errors: dict[int, dict[int, int]] = {}  # api key -> error code -> count (Kafka's errorCounts, NONE too)
        self.latency: dict[int, LatencyHistogram] = {}  # api key -> request latency
        self.messages_in: dict[str, int] = {}  # topic -> records appended by producers
        self.bytes_in: dict[str, int] = {}  # topic -> record bytes appended by producers
        self.bytes_out: dict[str, int] = {}  # topic -> record bytes sent to consumers
        self.replication_bytes_out = 0  # record bytes sent to followers
        self.fetches_waiting = 0  # long polls parked now (the fetch purgatory)
        # (listener, SASL mechanism, outcome) -> count; outcome "successful", "failed" or "reauthentication"
        self.authentications: dict[tuple[str, str, str], int] = {}

    # -- hooks (hot path) -------------------------------------------------------------------------
    def request_done(self, api_key: int, version: int, response: Any, started: float) -> None:
        """A request answered (``response`` is the response entity, or None when nothing is answered)."""
        key = (api_key, version)
        requests = self.requests
        requests[key] = requests.get(key, 0) + 1
        histogram = self.latency.get(api_key)
        if histogram is None:
            histogram = self.latency[api_key] = LatencyHistogram()
        histogram.observe(self.clock() - started)
        if response is not None:
            cls = type(response)
            plan = _plans.get(cls)
            if plan is None:
                plan = _plan_for(cls) if dataclasses.is_dataclass(cls) else ()
                _plans[cls] = plan
            if plan:
                counts = self.errors.get(api_key)
                if counts is None:
                    counts = self.errors[api_key] = {}
                _count_errors(response, plan, counts)

    def produced(self, topic: str, messages: int, size: int) -> None:
        self.messages_in[topic] = self.messages_in.get(topic, 0) + messages
        self.bytes_in[topic] = self.bytes_in.get(topic, 0) + size

    def fetched(self, topic: str, size: int) -> None:
        self.bytes_out[topic] = self.bytes_out.get(topic, 0) + size

    def authenticated(self, listener: str, mechanism: str | None, ok: bool, *, again: bool = False) -> None:
        """A SASL exchange ended (Kafka's Selector sensors successful-authentication, successful-reauthentication
        and failed-authentication); ``mechanism`` None when the handshake named none the listener enables."""
        key = (listener, mechanism or "unknown", "failed" if not ok else "reauthentication" if again else "successful")
        self.authentications[key] = self.authentications.get(key, 0) + 1

    def forget_topic(self, topic: str) -> None:
        """A deleted topic's counters go (Kafka's BrokerTopicStats.removeMetrics): a scrape no longer lists it,
        and a topic created again under its name counts from zero."""
        for counters in (self.messages_in, self.bytes_in, self.bytes_out):
            counters.pop(topic, None)


def error_counts(response: Any) -> dict[int, int]:
    """Error code -> how many times ``response`` carries it (for tests and tools)."""
    counts: dict[int, int] = {}
    _count_errors(response, _plan_for(type(response)), counts)
    return {int(code): n for code, n in counts.items()}

"""Replication throttles (Kafka's ReplicationQuotaManager), one per side: the leader's and the follower's.

Which replicas are throttled comes from the topic configs ``leader.replication.throttled.replicas`` /
``follower.replication.throttled.replicas``: ``"*"`` (all of the topic's partitions) or a list of
``partition:broker`` pairs, of which a broker takes the partitions paired with its own id (Kafka's
ConfigHandler.parseThrottledPartitions). The bound is the broker config ``leader.replication.throttled.rate``
/ ``follower.replication.throttled.rate`` in bytes/s (dynamic: read at every check; unset = Long.MAX_VALUE =
no throttle). All throttled partitions of a side share the bound.

Rate: Kafka's Rate over a SampledStat of ``replication.quota.window.num`` (11) windows of
``replication.quota.window.size.seconds`` (1 s): the bytes recorded in the live windows divided by their
elapsed time, counted as at least (windows - 1) full windows (so a first burst is spread over 10 s, as in
Kafka). ``is_quota_exceeded`` is that rate above the bound.

Who uses it (as Kafka's ReplicaManager / ReplicaFetcherThread do): the leader answers a follower's fetch of a
throttled partition with no records while the quota is exceeded, unless that follower is in the ISR, and
records the bytes it sends for throttled partitions; the follower leaves throttled partitions out of its
fetch while its quota is exceeded, unless it is caught up to the leader's high-water mark, and records the
bytes it appends for them.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable

UNLIMITED = float(2**63 - 1)  # Long.MAX_VALUE: Kafka's default rate, no throttle
ALL_REPLICAS = "*"
DEFAULT_WINDOWS = 11
DEFAULT_WINDOW_S = 1.0

LEADER, FOLLOWER = "leader", "follower"


def parse_throttled_partitions(value: str | None, broker_id: int) -> frozenset[int] | str:
    """ConfigHandler.parseThrottledPartitions: ``"*"`` or the partitions paired with broker_id."""
    value = (value or "").strip()
    if value == ALL_REPLICAS:
        return ALL_REPLICAS
    out = set()
    for item in value.split(","):
        parts = item.strip().split(":")
        if len(parts) == 2 and parts[1].strip().lstrip("-").isdigit() and int(parts[1]) == broker_id:
            try:
                out.add(int(parts[0]))
            except ValueError:
                continue
    return frozenset(out)


class ReplicationQuota:
    """One side's throttle. ``rate()`` gives the bound in bytes/s; ``topic_configs(topic)`` a topic's config
    overrides (None when unknown)."""

    def __init__(self, side: str, broker_id: int, rate: Callable[[], float],
                 topic_configs: Callable[[str], dict[str, str] | None], *, windows: int = DEFAULT_WINDOWS,
                 window_s: float = DEFAULT_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.side = side
        self.broker_id = broker_id
        self.replicas_config = f"{side}.replication.throttled.replicas"
        self._rate = rate
        self._topic_configs = topic_configs
        self.windows = windows
        self.window_s = window_s
        self.clock = clock
        self._samples: deque[list[float]] = deque()  # [window start, bytes]
        self._parsed: dict[str, tuple[str, frozenset[int] | str]] = {}  # topic -> (raw value, parsed)

    def is_throttled(self, topic: str, index: int) -> bool:
        configs = self._topic_configs(topic)
        raw = configs.get(self.replicas_config) if configs else None
        if not raw:
            return False
        cached = self._parsed.get(topic)
        if cached is None or cached[0] != raw:
            cached = (raw, parse_throttled_partitions(raw, self.broker_id))
            self._parsed[topic] = cached
        throttled = cached[1]
        return throttled == ALL_REPLICAS or index in throttled

    def bound(self) -> float:
        try:
            value = self._rate()
        except Exception:  # noqa: BLE001 - a config source that cannot answer throttles nothing
            return UNLIMITED
        return UNLIMITED if value is None else float(value)

    def record(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        now = self.clock()
        self._purge(now)
        if not self._samples or now - self._samples[-1][0] >= self.window_s:
            self._samples.append([now, 0.0])
        self._samples[-1][1] += nbytes

    def rate(self) -> float:
        """Bytes/s as Kafka's Rate.measure."""
        now = self.clock()
        self._purge(now)
        if not self._samples:
            return 0.0
        elapsed = now - self._samples[0][0]
        full = int(elapsed / self.window_s)
        if full < self.windows - 1:
            elapsed += (self.windows - 1 - full) * self.window_s
        return sum(s[1] for s in self._samples) / elapsed if elapsed > 0 else 0.0

    def is_quota_exceeded(self) -> bool:
        bound = self.bound()
        return bound < UNLIMITED and self.rate() > bound

    def _purge(self, now: float) -> None:
        horizon = self.windows * self.window_s
        while self._samples and now - self._samples[0][0] >= horizon:
            self._samples.popleft()


def broker_rate(broker: Any, name: str) -> Callable[[], float]:
    """The effective value of a rate config: the broker's dynamic configs when it has them (``broker.
    dynamic_configs.value(name)``), else its static config, else unlimited."""
    def rate() -> float:
        dynamic = getattr(broker, "dynamic_configs", None)
        if dynamic is not None:
            value = dynamic.value(name)
            if value is not None:
                return float(value)
        try:
            value = broker.config.get(name)
        except (KeyError, ValueError):
            return UNLIMITED
        return UNLIMITED if value is None else float(value)
    return rate


def quotas_for(broker: Any, topic_configs: Callable[[str], dict[str, str] | None],
               ) -> tuple[ReplicationQuota, ReplicationQuota]:
    """(leader quota, follower quota) of a cluster member, windows from its config when it has them."""
    def setting(name: str, default: float) -> float:
        try:
            value = broker.config.get(name)
        except (KeyError, ValueError):
            return default
        return default if value is None else float(value)

    windows = int(setting("replication.quota.window.num", DEFAULT_WINDOWS))
    window_s = setting("replication.quota.window.size.seconds", DEFAULT_WINDOW_S)
    broker_id = broker.config.broker_id
    return tuple(ReplicationQuota(side, broker_id, broker_rate(broker, f"{side}.replication.throttled.rate"),
                                  topic_configs, windows=windows, window_s=window_s)
                 for side in (LEADER, FOLLOWER))

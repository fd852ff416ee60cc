"""Client quotas: Kafka 3.7's quota arithmetic, entity precedence and throttle times (KIP-13, KIP-55, KIP-124,
KIP-219), as the ZooKeeper-mode broker computes them. Pure and clock-free: every call takes ``now_ms``.

Wiring (for the request handlers and the connection; nothing here does I/O; done in server/throttling.py, the
Fetch and topic admin handlers and server/connection.py's mute)::

    quotas = ClientQuotas.from_config(config.get)            # quota.window.num (11), quota.window.size.seconds (1)
    # fill from the store (quota_store.py decodes /config/users, /config/clients and the change notifications;
    # the single-node journal keeps the same entity configs): one call per entity, its whole config map
    quotas.apply_entity_config(QuotaEntity(user="alice", client_id="app"), {"producer_byte_rate": "1024"})

    # now = int(time.time() * 1000) everywhere (Kafka's time.milliseconds(); see the token bucket below)
    # Produce (KafkaApis.handleProduceRequest), once the append is done:
    bw = quotas.record_produce(principal, client_id, request_size_bytes, now)   # whole request size
    rq = 0 if acks == 0 else quotas.record_request(principal, client_id, handler_thread_nanos, now)
    throttle = max(bw, rq)        # the response's throttle_time_ms; acks=0: no response but the same mute
    # Fetch from a consumer (not from a follower): first cap the fetch size,
    max_bytes = min(request.max_bytes, fetch.max.bytes, quotas.fetch_max_bytes(principal, client_id))
    # then, with the size of the response that would be sent,
    bw = quotas.record_fetch(principal, client_id, response_size, now)
    rq = quotas.record_request(principal, client_id, handler_thread_nanos, now)
    if max(bw, rq) > 0:           # Kafka unrecords the bytes and answers an EMPTY fetch response with the throttle
        quotas.unrecord_fetch(principal, client_id, response_size, now)
    # Every other client request (sendResponseMaybeThrottle): throttle = quotas.record_request(...)
    # Requests Kafka exempts (inter-broker / cluster-action APIs): quotas.record_exempt(nanos, now).
    # CreateTopics / CreatePartitions / DeleteTopics (KIP-599), one quota object per request:
    mq = quotas.controller_mutation.new_quota_for("CreateTopics", api_version, principal, client_id, now)
    for topic in topics:                  # not for validate_only requests, as Kafka
        try: mq.record(num_partitions_created_or_deleted, now)
        except ThrottlingQuotaExceeded as e: topic error 89 with str(e); nothing done for that topic
    throttle = max(mq.throttle_time(now), quotas.record_request(...))   # sendResponseMaybeThrottleWithControllerQuota

    # KIP-219: the broker answers AT ONCE with throttle_time_ms, then mutes the connection (reads nothing more
    # from it) for throttle ms after the response is written; the client is expected to wait as well. In
    # pykbroker: after writing the response, pause reading from that transport until now + throttle.
    # A throttle of 0 or less means no mute.

What the numbers are (Kafka's classes; tests/unit/test_security_quotas.py replays random scenarios through
Kafka 3.7.1's own ClientQuotaManager, ClientRequestQuotaManager, ControllerMutationQuotaManager and Rate):

* :class:`Rate` is ``Rate`` over ``WindowedSum`` (a ``SampledStat``) exactly as kafka-clients 3.7.1 has it:
  ``samples`` (quota.window.num, 11) samples of ``window_ms`` (quota.window.size.seconds, 1 s). A record goes
  into the current sample unless that sample started ``window_ms`` or more ago, then the next slot (round robin
  over ``samples`` slots) is reset to start now. Before measuring, every sample that started
  ``samples * window_ms`` or more ago is reset to start now (empty). The rate is the sum of all samples divided
  by ``window_size``: the time since the oldest sample started, counted as at least ``samples - 1`` whole
  windows (``Rate.windowSize``: a rate whose first sample is young is spread over 10 s, not over its age), and
  at least 1 ms.
* A record is checked after it is added (``Sensor.record`` with quota checks): a rate above the bound is a
  violation, and the throttle time is ``QuotaUtils.throttleTime``: ``round((rate - bound) / bound *
  window_size)`` ms (Java's Math.round), the delay that brings the rate back to the bound if nothing more
  is recorded. Byte-rate quotas use it unbounded; the request quota caps it at one window
  (``boundedThrottleTime`` with ``quota.window.size.seconds``, 1000 ms). The manager then narrows the long
  to an int as Kafka's ``.toInt`` does (:func:`java_long_to_int`): a quota of 0 gives an infinite delay, which
  Java rounds to Long.MAX_VALUE and narrows to -1, so Kafka 3.7 throttles nobody with a byte rate of 0, and
  neither does this module (the wiring treats a throttle <= 0 as none).
* ``request_percentage`` is a share of one handler thread's time: the recorded value is the request's
  handler time in percent-seconds (``nanos * 100 / 1e9``), so a rate of 50 is half a thread.
* With no quota configured anywhere for a type the manager records nothing (``quotasEnabled``); once any
  entity has been configured (even with other keys: Kafka's config handler updates every quota type for each
  entity config), every client is recorded, against Long.MAX_VALUE when no quota applies to it.
  The request path (server/throttling.py) differs on purpose: it records only while some quota value is set
  (``ClientQuotas.enabled``), so a deployment whose only entity configs are SCRAM users pays nothing per request.
  Kafka would record every client from the first user config on; pykbroker's /metrics therefore show no client
  quota series (``kafka_server_produce_*``, ``kafka_server_fetch_*``, ``kafka_server_request_*``) while no quota is
  set, and its sensors stop counting once the last quota is removed, where Kafka's count every client (against
  Long.MAX_VALUE) from the first entity config on.

Entities and precedence (``DefaultQuotaCallback``): a quota is set on user+client-id, user, or client-id, each
either named or ``<default>`` (:data:`DEFAULT`). A connection of principal name ``user`` and ``client_id``
gets the first that exists of

    1. /config/users/<user>/clients/<client-id>     5. /config/users/<default>/clients/<default>
    2. /config/users/<user>/clients/<default>       6. /config/users/<default>
    3. /config/users/<user>                         7. /config/clients/<client-id>
    4. /config/users/<default>/clients/<client-id>  8. /config/clients/<default>

- per quota type: an entity without ``producer_byte_rate`` does not hide a producer quota further down.
The level that applies decides the sensor's metric tags ``(user, client-id)`` (the user sanitized, the
client id as is): levels 1, 2, 4, 5 tag both, levels 3 and 6 tag ``(user, "")`` so all of a user's clients
share one rate, levels 7, 8 and "no quota" tag ``("", client-id)`` so all users of a client id share one;
when the configured entities are of only one kind, Kafka takes a shortcut with the same limits (e.g. only
client-id quotas: always ``("", client-id)``) and so does this module (``quota_types_enabled``). Sensors unused
for an hour are dropped (``InactiveSensorExpirationTimeSeconds``). When a quota changes, existing sensors keep
their samples and take the new bound (``updateQuotaMetricConfigs``).

``controller_mutation_rate`` (KIP-599, :class:`ControllerMutationQuotaManager`) is a token bucket, not a rate:
``controller.quota.window.num`` * ``controller.quota.window.size.seconds`` seconds of the quota as burst,
refilled at the quota per second; a strict quota (CreateTopics v6+, CreatePartitions v3+, DeleteTopics v5+)
refuses a topic with THROTTLING_QUOTA_EXCEEDED once the bucket is below zero (a request may take it below
zero), a permissive one (older versions) accepts and throttles; the throttle is round(-tokens / quota * 1000).
The bucket starts empty at time 0, as Kafka's, so pass wall-clock ms (Kafka's time.milliseconds()) to every
call of this module - any clock works for the rates, only one clock must be used throughout.

Not here: ``connection_creation_rate`` for ``ip`` entities (KIP-612) is stored and described (quota_store.py)
but not enforced. ``client.quota.callback.class`` (custom callbacks) is not supported. Kafka's per-manager
delay queue (ThrottledChannelReaper) is the connection's job: it knows when to unmute.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterator, Mapping

from pykbroker.security.credentials import sanitize

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
CONNECTION_CREATION_RATE = "connection_creation_rate"  # ip entities (KIP-612)

# The quota types of the managers (Kafka's QuotaType names, which are also the metric groups)
PRODUCE, FETCH, REQUEST = "Produce", "Fetch", "Request"

DEFAULT_NUM_SAMPLES = 11          # quota.window.num
DEFAULT_WINDOW_SECONDS = 1        # quota.window.size.seconds
INACTIVE_SENSOR_EXPIRATION_MS = 3600 * 1000
LONG_MAX = 2**63 - 1
UNLIMITED = float(LONG_MAX)       # Kafka's bound when no quota applies (Long.MaxValue as a double)
NANOS_TO_PERCENTAGE_PER_SECOND = 100.0 / 1_000_000_000

# Kafka's QuotaTypes bits
NO_QUOTAS, CLIENT_ID_QUOTA_ENABLED, USER_QUOTA_ENABLED, USER_CLIENT_ID_QUOTA_ENABLED = 0, 1, 2, 4


class _Default:
    """The ``<default>`` entity name (ZooKeeperInternals.DEFAULT_STRING); a name, never a string."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DEFAULT"

    def __reduce__(self) -> str:
        return "DEFAULT"


DEFAULT = _Default()
DEFAULT_STRING = "<default>"


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """A user / client-id quota entity: each part None (absent), :data:`DEFAULT`, or a name as the client
    knows it (not sanitized). At least one part must be present."""

    user: str | _Default | None = None
    client_id: str | _Default | None = None

    def __post_init__(self) -> None:
        for part in (self.user, self.client_id):
            if not (part is None or part is DEFAULT or isinstance(part, str)):
                raise TypeError(f"a quota entity part is a name, DEFAULT or None, not {part!r}")
        if self.user is None and self.client_id is None:
            raise ValueError("a quota entity names a user, a client id or both")

    def __str__(self) -> str:
        parts = []
        if self.user is not None:
            parts.append("default user" if self.user is DEFAULT else f"user {self.user}")
        if self.client_id is not None:
            parts.append("default client-id" if self.client_id is DEFAULT else f"client-id {self.client_id}")
        return " ".join(parts)


def java_round(x: float) -> int:
    """Java's Math.round(double): floor(x + 0.5), NaN -> 0, clamped to the long range."""
    if math.isnan(x):
        return 0
    if x >= 9.223372036854775807e18:
        return LONG_MAX
    if x <= -9.223372036854775808e18:
        return -LONG_MAX - 1
    return math.floor(x + 0.5)


def java_long_to_int(x: int) -> int:
    """Scala's Long.toInt (Java's (int) cast): the low 32 bits, signed."""
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


class Rate:
    """Kafka's ``Rate`` (unit seconds) over a ``WindowedSum``: kafka-clients 3.7.1's SampledStat, exactly.

    Each sample is [start_ms, value]; ``current`` indexes the sample being filled (round robin over at most
    ``samples`` slots)."""

    __slots__ = ("samples", "window_ms", "_samples", "_current")

    def __init__(self, samples: int = DEFAULT_NUM_SAMPLES, window_ms: int = DEFAULT_WINDOW_SECONDS * 1000) -> None:
        if not isinstance(samples, int) or samples < 1:
            raise ValueError(f"samples must be an integer >= 1, not {samples!r}")
        if not isinstance(window_ms, int) or window_ms < 1:
            raise ValueError(f"window_ms must be an integer >= 1, not {window_ms!r}")
        self.samples = samples
        self.window_ms = window_ms
        self._samples: list[list[float]] = []
        self._current = 0

    def _current_sample(self, now_ms: int) -> list[float]:
        if not self._samples:
            self._samples.append([now_ms, 0.0])
        return self._samples[self._current]

    def record(self, value: float, now_ms: int) -> None:
        sample = self._current_sample(now_ms)
        if now_ms - sample[0] >= self.window_ms:       # Sample.isComplete (eventWindow is Long.MAX_VALUE)
            self._current = (self._current + 1) % self.samples
            if self._current >= len(self._samples):
                sample = [now_ms, 0.0]
                self._samples.append(sample)
            else:
                sample = self._samples[self._current]
                sample[0], sample[1] = now_ms, 0.0
        sample[1] += value

    def _purge(self, now_ms: int) -> None:
        expire_age = self.samples * self.window_ms
        for sample in self._samples:
            if now_ms - sample[0] >= expire_age:
                sample[0], sample[1] = now_ms, 0.0

    def window_size(self, now_ms: int) -> int:
        """Rate.windowSize: ms since the oldest sample started, at least ``samples - 1`` windows, at least 1."""
        self._purge(now_ms)
        if not self._samples:
            self._samples.append([now_ms, 0.0])
        elapsed = now_ms - min(s[0] for s in self._samples)
        full = elapsed // self.window_ms
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return max(int(elapsed), 1)

    def measure(self, now_ms: int) -> float:
        """Rate.measure: the windowed sum per second."""
        self._purge(now_ms)
        total = 0.0
        for sample in self._samples:
            total += sample[1]
        return total / (self.window_size(now_ms) / 1000.0)


def throttle_time(value: float, bound: float, window_size_ms: int) -> int:
    """QuotaUtils.throttleTime: round((value - bound) / bound * window) ms (a long; Java arithmetic)."""
    difference = value - bound
    if bound == 0.0:  # IEEE division as Java does it: +-Infinity, or NaN for 0/0
        sign = math.copysign(1.0, difference) * math.copysign(1.0, bound)
        ratio = math.nan if difference == 0.0 or math.isnan(difference) else math.copysign(math.inf, sign)
    else:
        ratio = difference / bound
    return java_round(ratio * window_size_ms)


def bounded_throttle_time(value: float, bound: float, window_size_ms: int, max_throttle_ms: int) -> int:
    """QuotaUtils.boundedThrottleTime: throttle_time capped at ``max_throttle_ms``."""
    return min(throttle_time(value, bound, window_size_ms), max_throttle_ms)


class TokenBucket:
    """Kafka's TokenBucket stat (KIP-599): ``tokens`` refill at ``bound`` per second up to the burst
    ``samples * window seconds * bound``, and a record takes ``value`` tokens (the balance may go negative).
    Like Kafka's it starts empty at time 0, so ``now_ms`` must be a clock whose zero is long past (Kafka uses
    wall-clock ms): the first refill then fills the bucket."""

    __slots__ = ("samples", "window_ms", "tokens", "last_update_ms")

    def __init__(self, samples: int, window_ms: int) -> None:
        self.samples = samples
        self.window_ms = window_ms
        self.tokens = 0.0
        self.last_update_ms = 0

    def _refill(self, bound: float, now_ms: int) -> None:
        burst = self.samples * (self.window_ms / 1000.0) * bound
        self.tokens = min(burst, self.tokens + bound * ((now_ms - self.last_update_ms) / 1000.0))
        self.last_update_ms = now_ms

    def measure(self, bound: float, now_ms: int) -> float:
        self._refill(bound, now_ms)
        return self.tokens

    def record(self, bound: float, value: float, now_ms: int) -> None:
        self._refill(bound, now_ms)
        self.tokens = min(self.samples * (self.window_ms / 1000.0) * bound, self.tokens - value)


class _Sensor:
    __slots__ = ("tags", "rate", "bound", "last_record_ms", "throttle_count", "throttle_total_ms", "bucket")

    def __init__(self, tags: tuple[str, str], rate: Rate, bound: float, now_ms: int,
                 bucket: TokenBucket | None = None) -> None:
        self.tags = tags
        self.rate = rate
        self.bucket = bucket
        self.bound = bound
        self.last_record_ms = now_ms
        self.throttle_count = 0
        self.throttle_total_ms = 0


@dataclass(frozen=True, slots=True)
class SensorSnapshot:
    """One quota sensor for the metrics endpoint: Kafka's ``byte-rate`` / ``request-time`` metric of group
    ``quota_type`` with tags ``user`` and ``client-id``, and its throttles so far."""

    quota_type: str
    user: str
    client_id: str
    rate: float
    bound: float
    throttle_count: int
    throttle_total_ms: int


def _principal_name(principal: Any) -> str:
    name = getattr(principal, "name", principal)
    if not isinstance(name, str):
        raise TypeError(f"a principal (KafkaPrincipal or its name), not {principal!r}")
    return name


_sanitize = lru_cache(maxsize=4096)(sanitize)


class ClientQuotaManager:
    """Kafka's ClientQuotaManager with the DefaultQuotaCallback, for one quota type."""

    def __init__(self, quota_type: str, *, samples: int = DEFAULT_NUM_SAMPLES,
                 window_seconds: int = DEFAULT_WINDOW_SECONDS, max_throttle_ms: int | None = None) -> None:
        self.quota_type = quota_type
        self.samples = samples
        self.window_ms = window_seconds * 1000
        self.max_throttle_ms = max_throttle_ms            # None: unbounded (byte rates)
        Rate(samples, self.window_ms)                     # validates the window settings
        self.quota_types_enabled = NO_QUOTAS
        # (user key, client key) -> bound; user key: None, DEFAULT or the sanitized user name; client key:
        # None, DEFAULT or the client id as is - Kafka's KafkaQuotaEntity(UserEntity(sanitized), ClientIdEntity)
        self._quotas: dict[tuple[Any, Any], float] = {}
        self._sensors: dict[tuple[str, str], _Sensor] = {}
        self._next_expiry_check_ms: int | None = None

    # -- configuration --

    @property
    def quotas_enabled(self) -> bool:
        return self.quota_types_enabled != NO_QUOTAS

    @property
    def configured(self) -> bool:
        """Is a quota of this type set on some entity now (unlike quotas_enabled, which stays on)?"""
        return bool(self._quotas)

    @staticmethod
    def _key(entity: QuotaEntity) -> tuple[Any, Any]:
        user = entity.user
        return (user if user is None or user is DEFAULT else _sanitize(user), entity.client_id)

    def update_quota(self, entity: QuotaEntity, bound: float | None) -> None:
        """ClientQuotaManager.updateQuota: set (or, with None, remove) the entity's quota of this type; existing
        sensors take their new bound (quota_limit). Marks the entity's kind as enabled even on removal, as
        Kafka does."""
        if bound is not None:
            bound = float(bound)      # NaN too: Kafka then measures "not acceptable" and throttles round(NaN) = 0
        key = self._key(entity)
        if key[0] is not None:
            self.quota_types_enabled |= USER_CLIENT_ID_QUOTA_ENABLED if key[1] is not None else USER_QUOTA_ENABLED
        else:
            self.quota_types_enabled |= CLIENT_ID_QUOTA_ENABLED
        if bound is None:
            self._quotas.pop(key, None)
        else:
            self._quotas[key] = bound
        for sensor in self._sensors.values():
            sensor.bound = self.quota_limit(sensor.tags)

    def quota(self, entity: QuotaEntity) -> float | None:
        """The quota configured on exactly this entity (no precedence), None if none."""
        return self._quotas.get(self._key(entity))

    # -- resolution --

    def metric_tags(self, principal: Any, client_id: str) -> tuple[str, str]:
        """DefaultQuotaCallback.quotaMetricTags: the (user, client-id) tags of the sensor this client shares."""
        user = _sanitize(_principal_name(principal))
        client_id = client_id or ""
        enabled = self.quota_types_enabled
        if enabled in (NO_QUOTAS, CLIENT_ID_QUOTA_ENABLED):
            return ("", client_id)
        if enabled == USER_QUOTA_ENABLED:
            return (user, "")
        if enabled == USER_CLIENT_ID_QUOTA_ENABLED:
            return (user, client_id)
        q = self._quotas
        if (user, client_id) in q or (user, DEFAULT) in q:
            return (user, client_id)
        if (user, None) in q:
            return (user, "")
        if (DEFAULT, client_id) in q or (DEFAULT, DEFAULT) in q:
            return (user, client_id)
        if (DEFAULT, None) in q:
            return (user, "")
        return ("", client_id)

    def quota_limit(self, tags: tuple[str, str]) -> float:
        """ClientQuotaManager.quotaLimit for a sensor's tags; UNLIMITED (Long.MAX_VALUE) when none applies."""
        bound = self._callback_limit(tags)
        return UNLIMITED if bound is None else bound

    def _callback_limit(self, tags: tuple[str, str]) -> float | None:
        """DefaultQuotaCallback.quotaLimit: the quota of the first entity that exists for these tags, or None."""
        user, client_id = tags
        q = self._quotas
        bound = None
        if user and client_id:
            for key in ((user, client_id), (user, DEFAULT), (DEFAULT, client_id), (DEFAULT, DEFAULT)):
                bound = q.get(key)
                if bound is not None:
                    break
        elif user:
            bound = q.get((user, None))
            if bound is None:
                bound = q.get((DEFAULT, None))
        elif client_id:
            bound = q.get((None, client_id))
            if bound is None:
                bound = q.get((None, DEFAULT))
        return bound

    def effective_quota(self, principal: Any, client_id: str) -> float | None:
        """The quota that applies to this client now, None when none does."""
        return self._callback_limit(self.metric_tags(principal, client_id))

    # -- recording --

    def _sensor(self, principal: Any, client_id: str, now_ms: int) -> _Sensor:
        self._maybe_expire(now_ms)
        tags = self.metric_tags(principal, client_id)
        sensor = self._sensors.get(tags)
        if sensor is None:
            sensor = _Sensor(tags, Rate(self.samples, self.window_ms), self.quota_limit(tags), now_ms,
                             self._new_bucket())
            self._sensors[tags] = sensor
        return sensor

    def _new_bucket(self) -> TokenBucket | None:
        return None

    def _maybe_expire(self, now_ms: int) -> None:
        # Kafka's ExpireSensorTask runs every 30 s and drops sensors not recorded for an hour.
        if self._next_expiry_check_ms is not None and now_ms < self._next_expiry_check_ms:
            return
        self._next_expiry_check_ms = now_ms + 30_000
        stale = [t for t, s in self._sensors.items() if now_ms - s.last_record_ms > INACTIVE_SENSOR_EXPIRATION_MS]
        for tags in stale:
            del self._sensors[tags]

    @staticmethod
    def _check_value(value: float, now_ms: int) -> float:
        if isinstance(now_ms, bool) or not isinstance(now_ms, int):
            raise TypeError(f"now_ms is an integer of milliseconds, not {now_ms!r}")
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"a quota sensor records finite values, not {value!r}")
        return value

    def _throttle_time(self, rate_value: float, sensor: _Sensor, now_ms: int) -> int:
        window = sensor.rate.window_size(now_ms)
        if self.max_throttle_ms is None:
            return throttle_time(rate_value, sensor.bound, window)
        return bounded_throttle_time(rate_value, sensor.bound, window, self.max_throttle_ms)

    def record_and_get_throttle_time_ms(self, principal: Any, client_id: str, value: float, now_ms: int) -> int:
        """ClientQuotaManager.maybeRecordAndGetThrottleTimeMs: record ``value`` at ``now_ms`` and return the
        throttle time in ms (0 within quota; Kafka's int, see the module docstring on quotas of 0)."""
        value = self._check_value(value, now_ms)
        if not self.quotas_enabled:
            return 0
        sensor = self._sensor(principal, client_id, now_ms)
        sensor.last_record_ms = now_ms
        sensor.rate.record(value, now_ms)
        measured = sensor.rate.measure(now_ms)
        if measured <= sensor.bound:                      # Quota.acceptable (upper bound)
            return 0
        throttle = java_long_to_int(self._throttle_time(measured, sensor, now_ms))
        if throttle > 0:
            sensor.throttle_count += 1
            sensor.throttle_total_ms += throttle
        return throttle

    def record_no_throttle(self, principal: Any, client_id: str, value: float, now_ms: int) -> None:
        """recordNoThrottle / unrecordQuotaSensor (a negative value): record without a quota check."""
        value = self._check_value(value, now_ms)
        if not self.quotas_enabled:
            return
        sensor = self._sensor(principal, client_id, now_ms)
        sensor.last_record_ms = now_ms
        sensor.rate.record(value, now_ms)

    def max_value_in_quota_window(self, principal: Any, client_id: str) -> float:
        """getMaxValueInQuotaWindow: quota * (samples - 1) * window seconds; float max when no quota applies."""
        if not self.quotas_enabled:
            return 1.7976931348623157e308
        bound = self._callback_limit(self.metric_tags(principal, client_id))
        if bound is None:
            return 1.7976931348623157e308
        return bound * (self.samples - 1) * (self.window_ms // 1000)

    def sensors(self, now_ms: int) -> Iterator[SensorSnapshot]:
        for sensor in list(self._sensors.values()):
            yield SensorSnapshot(self.quota_type, sensor.tags[0], sensor.tags[1], sensor.rate.measure(now_ms),
                                 sensor.bound, sensor.throttle_count, sensor.throttle_total_ms)


THROTTLING_QUOTA_EXCEEDED_MESSAGE = "The throttling quota has been exceeded."
CONTROLLER_MUTATION = "ControllerMutation"
# The first versions whose requests get the strict quota (ControllerMutationQuotaManager.newQuotaFor)
STRICT_SINCE_VERSION = {"CreateTopics": 6, "CreatePartitions": 3, "DeleteTopics": 5}


class ThrottlingQuotaExceeded(Exception):
    """A strict controller mutation quota refused a mutation: THROTTLING_QUOTA_EXCEEDED (89) for that topic,
    with Kafka's message, and ``throttle_ms``."""

    error_code = 89

    def __init__(self, throttle_ms: int) -> None:
        super().__init__(THROTTLING_QUOTA_EXCEEDED_MESSAGE)
        self.throttle_ms = throttle_ms


class ControllerMutationQuota:
    """One request's controller mutation quota (Strict-/Permissive-/UnboundedControllerMutationQuota):
    ``record(permits, now_ms)`` for each topic (permits = its partitions), then ``throttle_time(now_ms)`` for
    the response's throttle_time_ms, which counts down from when it was computed."""

    def __init__(self, manager: "ControllerMutationQuotaManager | None", sensor: _Sensor | None, strict: bool) -> None:
        self._manager = manager
        self._sensor = sensor
        self.strict = strict
        self._last_throttle_ms = 0
        self._last_recorded_ms = 0

    @property
    def is_exceeded(self) -> bool:
        return self.strict and self._sensor is not None and self._last_throttle_ms > 0

    def record(self, permits: float, now_ms: int) -> None:
        """Strict: refuse (ThrottlingQuotaExceeded) when the bucket is already below zero, else take the
        permits; permissive: take them and only remember the throttle. Unbounded (no quotas): nothing."""
        if self._sensor is None:
            return
        sensor, manager = self._sensor, self._manager
        permits = manager._check_value(permits, now_ms)
        sensor.last_record_ms = now_ms
        if self.strict:
            tokens = sensor.bucket.measure(sensor.bound, now_ms)
            if tokens < 0:
                self._violated(tokens, sensor, now_ms)
                raise ThrottlingQuotaExceeded(java_long_to_int(self._last_throttle_ms))
            sensor.rate.record(permits, now_ms)
            sensor.bucket.record(sensor.bound, permits, now_ms)
        else:
            sensor.rate.record(permits, now_ms)
            sensor.bucket.record(sensor.bound, permits, now_ms)
            tokens = sensor.bucket.measure(sensor.bound, now_ms)
            if tokens < 0:
                self._violated(tokens, sensor, now_ms)

    def _violated(self, tokens: float, sensor: _Sensor, now_ms: int) -> None:
        self._last_throttle_ms = mutation_throttle_time(tokens, sensor.bound)
        self._last_recorded_ms = now_ms
        if self._last_throttle_ms > 0:
            sensor.throttle_count += 1
            sensor.throttle_total_ms += java_long_to_int(self._last_throttle_ms)

    def throttle_time(self, now_ms: int) -> int:
        """AbstractControllerMutationQuota.throttleTime: the last throttle less the time since it was computed."""
        return java_long_to_int(max(0, self._last_throttle_ms - (now_ms - self._last_recorded_ms)))


def mutation_throttle_time(tokens: float, bound: float) -> int:
    """ControllerMutationQuotaManager.throttleTimeMs: round(-tokens / bound * 1000)."""
    if bound == 0.0:
        ratio = math.nan if tokens == 0.0 else math.copysign(math.inf, -tokens * math.copysign(1.0, bound))
    else:
        ratio = -tokens / bound
    return java_round(ratio * 1000)


class ControllerMutationQuotaManager(ClientQuotaManager):
    """Kafka's ControllerMutationQuotaManager (KIP-599): ``controller_mutation_rate`` partitions per second per
    user / client id (the same precedence), enforced with a token bucket of ``controller.quota.window.num`` *
    ``controller.quota.window.size.seconds`` seconds of burst. Requests at or above STRICT_SINCE_VERSION
    get a strict quota (a mutation over quota fails with THROTTLING_QUOTA_EXCEEDED), older ones a permissive
    one (accepted, then throttled)."""

    def __init__(self, *, samples: int = DEFAULT_NUM_SAMPLES, window_seconds: int = DEFAULT_WINDOW_SECONDS) -> None:
        super().__init__(CONTROLLER_MUTATION, samples=samples, window_seconds=window_seconds)

    def _new_bucket(self) -> TokenBucket:
        return TokenBucket(self.samples, self.window_ms)

    def new_quota(self, principal: Any, client_id: str, *, strict: bool, now_ms: int) -> ControllerMutationQuota:
        """newStrictQuotaFor / newPermissiveQuotaFor (unbounded while no quota is configured anywhere)."""
        if not self.quotas_enabled:
            return ControllerMutationQuota(None, None, strict)
        return ControllerMutationQuota(self, self._sensor(principal, client_id, now_ms), strict)

    def new_quota_for(self, api: str, api_version: int, principal: Any, client_id: str,
                      now_ms: int) -> ControllerMutationQuota:
        """newQuotaFor(request, strictSinceVersion): "CreateTopics", "CreatePartitions" or "DeleteTopics"."""
        return self.new_quota(principal, client_id, strict=api_version >= STRICT_SINCE_VERSION[api], now_ms=now_ms)

    def record_and_get_throttle_time_ms(self, principal: Any, client_id: str, value: float, now_ms: int) -> int:
        """The override: check the bucket first, then record; the throttle is round(-tokens / bound * 1000)."""
        value = self._check_value(value, now_ms)
        if not self.quotas_enabled:
            return 0
        quota = ControllerMutationQuota(self, self._sensor(principal, client_id, now_ms), True)
        try:
            quota.record(value, now_ms)
        except ThrottlingQuotaExceeded as e:
            return e.throttle_ms
        return 0

    def tokens(self, principal: Any, client_id: str, now_ms: int) -> float:
        """The ``tokens`` metric of this client's sensor (None-free: Long.MAX_VALUE bucket when unlimited)."""
        sensor = self._sensor(principal, client_id, now_ms)
        return sensor.bucket.measure(sensor.bound, now_ms)


# The config keys each manager reads from an entity config, and how (QuotaConfigHandler.updateQuotaConfig:
# byte rates through Long.parseLong, percentages through Double.parseDouble).
_CONFIG_KEYS = ((PRODUCE, PRODUCER_BYTE_RATE, True), (FETCH, CONSUMER_BYTE_RATE, True),
                (REQUEST, REQUEST_PERCENTAGE, False), (CONTROLLER_MUTATION, CONTROLLER_MUTATION_RATE, False))


_JAVA_LONG = re.compile(r"[+-]?[0-9]+")
_JAVA_DOUBLE = re.compile(r"[+-]?(NaN|Infinity|((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?)[fFdD]?)")


def java_parse_double(text: str) -> float:
    """Java's Double.parseDouble for decimal text (leading/trailing control characters and spaces trimmed,
    an optional f/d suffix, "NaN", "Infinity"); ValueError otherwise (hex floats are not read)."""
    if not isinstance(text, str):
        raise ValueError(f"not a string: {text!r}")
    trimmed = text.strip("".join(chr(c) for c in range(33)))
    if not _JAVA_DOUBLE.fullmatch(trimmed):
        raise ValueError(f'For input string: "{text}"')
    body = trimmed if trimmed.endswith("Infinity") else trimmed.rstrip("fFdD")
    return float(body.replace("Infinity", "inf"))


def _parse_stored(key: str, value: Any, integral: bool) -> float:
    """QuotaConfigHandler: byte rates through Long.parseLong (then as a double), percentages through
    Double.parseDouble (NaN and Infinity included, as Kafka reads them)."""
    if integral:
        if isinstance(value, str) and _JAVA_LONG.fullmatch(value) and -(2**63) <= int(value) <= LONG_MAX:
            return float(int(value))
        raise ValueError(f"{key} must be a long, not {value!r}")
    try:
        return java_parse_double(value)
    except ValueError:
        raise ValueError(f"{key} must be a double, not {value!r}") from None


class ClientQuotas:
    """The broker's three enforced quota managers (produce, fetch, request) fed from entity configs."""

    def __init__(self, *, samples: int = DEFAULT_NUM_SAMPLES, window_seconds: int = DEFAULT_WINDOW_SECONDS,
                 controller_samples: int = DEFAULT_NUM_SAMPLES,
                 controller_window_seconds: int = DEFAULT_WINDOW_SECONDS) -> None:
        for name, v in (("quota.window.num", samples), ("quota.window.size.seconds", window_seconds),
                        ("controller.quota.window.num", controller_samples),
                        ("controller.quota.window.size.seconds", controller_window_seconds)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Invalid value {v} for configuration {name}: Value must be at least 1")
        self.produce = ClientQuotaManager(PRODUCE, samples=samples, window_seconds=window_seconds)
        self.fetch = ClientQuotaManager(FETCH, samples=samples, window_seconds=window_seconds)
        # ClientRequestQuotaManager: maxThrottleTimeMs = quota.window.size.seconds in ms
        self.request = ClientQuotaManager(REQUEST, samples=samples, window_seconds=window_seconds,
                                          max_throttle_ms=window_seconds * 1000)
        self.controller_mutation = ControllerMutationQuotaManager(samples=controller_samples,
                                                                  window_seconds=controller_window_seconds)
        self.exempt = Rate(samples, window_seconds * 1000)   # exempt-request-time, for the metrics only
        self._configs: dict[QuotaEntity, dict[str, str]] = {}
        # Is some quota value set now (on any entity, of any type)? A plain attribute, read on every request:
        # while False the request path records nothing. Not Kafka's quotasEnabled (set by any entity config,
        # even a SCRAM user's without quotas, and never unset): see the module docstring.
        self.enabled = False

    @classmethod
    def from_config(cls, get: Callable[[str], Any]) -> "ClientQuotas":
        """From the broker's settings: ``get(name)`` returns the value or None."""
        def setting(name: str, default: int) -> int:
            value = get(name)
            if value is None:
                return default
            try:
                return int(str(value).strip())
            except ValueError:
                raise ValueError(f"Invalid value {value} for configuration {name}: Not a number of type INT") from None
        return cls(samples=setting("quota.window.num", DEFAULT_NUM_SAMPLES),
                   window_seconds=setting("quota.window.size.seconds", DEFAULT_WINDOW_SECONDS),
                   controller_samples=setting("controller.quota.window.num", DEFAULT_NUM_SAMPLES),
                   controller_window_seconds=setting("controller.quota.window.size.seconds", DEFAULT_WINDOW_SECONDS))

    def managers(self) -> tuple[ClientQuotaManager, ...]:
        return (self.produce, self.fetch, self.request, self.controller_mutation)

    def apply_entity_config(self, entity: QuotaEntity, config: Mapping[str, Any] | None) -> None:
        """QuotaConfigHandler.updateQuotaConfig: the entity's whole config (None or {}: deleted). Each manager
        gets its key's value or a removal. Values are parsed first, so a bad value changes nothing (ValueError)."""
        config = dict(config or {})
        parsed = []
        for quota_type, key, integral in _CONFIG_KEYS:
            raw = config.get(key)
            parsed.append(None if raw is None else _parse_stored(key, raw, integral))
        for manager, bound in zip(self.managers(), parsed):
            manager.update_quota(entity, bound)
        if config:
            self._configs[entity] = {k: str(v) for k, v in config.items()}
        else:
            self._configs.pop(entity, None)
        self.enabled = any(manager.configured for manager in self.managers())

    def entity_config(self, entity: QuotaEntity) -> dict[str, str]:
        return dict(self._configs.get(entity, {}))

    # -- what the handlers call; all return a throttle time in ms, never negative (0: none). Kafka's managers can
    # return a negative time (a quota of 0 or below, see the module docstring), which Kafka then writes as
    # throttle_time_ms when no other quota throttles; these methods answer 0 instead. The exact value is
    # ``manager.record_and_get_throttle_time_ms``. --

    def record_produce(self, principal: Any, client_id: str, nbytes: int, now_ms: int) -> int:
        return max(0, self.produce.record_and_get_throttle_time_ms(principal, client_id, nbytes, now_ms))

    def record_fetch(self, principal: Any, client_id: str, nbytes: int, now_ms: int) -> int:
        return max(0, self.fetch.record_and_get_throttle_time_ms(principal, client_id, nbytes, now_ms))

    def unrecord_fetch(self, principal: Any, client_id: str, nbytes: int, now_ms: int) -> None:
        """unrecordQuotaSensor: take back a fetch's bytes when the response sent is the empty throttled one."""
        self.fetch.record_no_throttle(principal, client_id, -float(nbytes), now_ms)

    def fetch_max_bytes(self, principal: Any, client_id: str) -> int:
        """The fetch size bound of a throttled consumer (KafkaApis: getMaxValueInQuotaWindow, toInt)."""
        value = self.fetch.max_value_in_quota_window(principal, client_id)
        return 2**31 - 1 if value >= 2**31 - 1 else max(int(value), -(2**31))

    def record_request(self, principal: Any, client_id: str, thread_nanos: int, now_ms: int) -> int:
        """ClientRequestQuotaManager: the request's handler time, as a percentage of one thread."""
        return max(0, self.request.record_and_get_throttle_time_ms(
            principal, client_id, thread_nanos * NANOS_TO_PERCENTAGE_PER_SECOND, now_ms))

    def record_network_time(self, principal: Any, client_id: str, nanos: int, now_ms: int) -> None:
        """recordNetworkThreadTimeCallback: the time spent writing the response, recorded without a check."""
        self.request.record_no_throttle(principal, client_id, nanos * NANOS_TO_PERCENTAGE_PER_SECOND, now_ms)

    def record_exempt(self, nanos: int, now_ms: int) -> None:
        if self.request.quotas_enabled:
            self.exempt.record(nanos * NANOS_TO_PERCENTAGE_PER_SECOND, now_ms)

    def sensors(self, now_ms: int) -> Iterator[SensorSnapshot]:
        for manager in self.managers():
            yield from manager.sensors(now_ms)

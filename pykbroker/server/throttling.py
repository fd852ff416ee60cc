"""Client quotas on the request path (KIP-13, KIP-55, KIP-124, KIP-219, KIP-599), as Kafka 3.7.1's KafkaApis and
RequestHandlerHelper apply them; the arithmetic is security/quotas.py's ``ClientQuotas`` (``broker.quotas``).

:func:`with_client_quotas` wraps the broker's handler table once. While no quota value is set
(``ClientQuotas.enabled``, a plain attribute; not Kafka's ``quotasEnabled``, which any entity config switches
on for good, a SCRAM user's too: see security/quotas.py) a request goes straight to its handler; while one is, every request gets a
:class:`RequestQuota` as ``ctx.quota``: the handler's own time is measured (the time spent in its steps, not
in the waits of a long poll or an acks=all produce: Kafka's request thread time), and when the answer is ready
the request is recorded against the client's quotas - the principal's name (``ctx.principal``, User:ANONYMOUS
on a PLAINTEXT listener; sanitized as Kafka's Sanitizer does for matching) and the request header's client id:

* Produce: ``producer_byte_rate`` over the request's size (header + body) and ``request_percentage`` (not for
  acks=0); the response's throttle_time_ms is the larger throttle (sendResponseCallback);
* Fetch from a consumer: the fetch handler caps its max_bytes (:func:`consumer_fetch_max_bytes`) and, with the
  response in hand, calls :func:`fetch_throttle`: when throttled the bytes are taken back and the answer is an
  EMPTY fetch response with the throttle (no records: KafkaApis' getThrottledResponse); a follower's fetch is
  exempt (replication quotas are its own);
* CreateTopics / CreatePartitions / DeleteTopics: the handler takes a :func:`mutation_quota` and records each
  topic's partitions with :func:`record_mutation` (THROTTLING_QUOTA_EXCEEDED from strict versions); the throttle
  is the larger of the mutation and request throttles (sendResponseMaybeThrottleWithControllerQuota);
* every other request: ``request_percentage`` (sendResponseMaybeThrottle); the inter-broker and
  controller APIs (LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown, WriteTxnMarkers,
  AlterPartition: Kafka's sendResponseExemptThrottle) are recorded as exempt time only; SaslHandshake and
  SaslAuthenticate, part of authentication, are not recorded.

A throttle above 0 goes into the response's throttle_time_ms (where its version has one) and into
``ctx.quota.throttle_ms``, from which the connection mutes the channel for that long after handing the answer
over (KIP-219; server/connection.py), acks=0 produces included. A request whose handler raises is recorded against
``request_percentage`` and its error answer (the connection's) throttled by it, as Kafka's
sendErrorResponseMaybeThrottle.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import time
from time import perf_counter_ns
from typing import Any

from pykbroker.protocol.apis import FETCH_KEY, PRODUCE_KEY
from pykbroker.protocol.errors import ErrorCode, KafkaError
from pykbroker.protocol.framing import SIZE, encode_response
from pykbroker.security.quotas import ControllerMutationQuota, ThrottlingQuotaExceeded
from pykbroker.server.dispatch import CloseConnection, Handler, RequestContext

# Kafka's sendResponseExemptThrottle APIs: recorded as exempt request time, never throttled.
EXEMPT_APIS = frozenset({4, 5, 6, 7, 27, 56})
# SaslHandshake, SaslAuthenticate: authentication, handled before KafkaApis in Kafka.
UNMETERED_APIS = frozenset({17, 36})


def wall_ms() -> int:
    """Kafka's time.milliseconds(): the one clock of every quota call (the mutation token bucket needs it)."""
    return int(time.time() * 1000)


class RequestQuota:
    """One request's quota state: the handler's time so far, and the throttle it was given (Kafka's
    RequestChannel.Request requestThreadTimeNanos and apiThrottleTimeMs)."""

    __slots__ = ("handler_ns", "step_started_ns", "throttle_ms", "mutation", "recorded", "encoded")

    def __init__(self) -> None:
        self.handler_ns = 0
        self.step_started_ns = perf_counter_ns()
        self.throttle_ms = 0
        self.mutation: ControllerMutationQuota | None = None
        self.recorded = False  # the handler recorded the request itself (a consumer's fetch) or it is exempt
        self.encoded: tuple[Any, list] | None = None  # (response, its wire pieces): a fetch measured by encoding

    def handler_nanos(self) -> int:
        """The handler's time up to now (the step running now included)."""
        return self.handler_ns + (perf_counter_ns() - self.step_started_ns)


class _Timed:
    """Awaits a handler's coroutine, adding the time of each of its steps to ``quota.handler_ns``."""

    __slots__ = ("coro", "quota")

    def __init__(self, coro, quota: RequestQuota) -> None:
        self.coro = coro
        self.quota = quota

    def __await__(self):
        coro, quota = self.coro, self.quota
        value: Any = None
        error: BaseException | None = None
        while True:
            quota.step_started_ns = start = perf_counter_ns()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                quota.handler_ns += perf_counter_ns() - start
                return stop.value
            except BaseException:
                quota.handler_ns += perf_counter_ns() - start
                raise
            quota.handler_ns += perf_counter_ns() - start
            try:
                value, error = (yield yielded), None
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # CancelledError and the like: into the handler, as a plain await would
                value, error = None, exc


def with_client_quotas(handlers: dict[int, Handler]) -> dict[int, Handler]:
    """The broker's handler table with the client quotas applied (see the module docstring)."""
    return {key: handler if key in UNMETERED_APIS else _metered(key, handler) for key, handler in handlers.items()}


def _metered(api_key: int, handler: Handler) -> Handler:
    @functools.wraps(handler)
    def handle(ctx: RequestContext, body):
        if not ctx.broker.quotas.enabled:
            return handler(ctx, body)
        quota = ctx.quota = RequestQuota()
        try:
            result = handler(ctx, body)
        except Exception:
            quota.handler_ns += perf_counter_ns() - quota.step_started_ns
            _record_failure(ctx)
            raise
        quota.handler_ns += perf_counter_ns() - quota.step_started_ns
        if asyncio.iscoroutine(result):
            return _finish_later(api_key, ctx, body, result)
        return _finish(api_key, ctx, body, result)

    return handle


async def _finish_later(api_key: int, ctx: RequestContext, body, coro) -> Any:
    try:
        result = await _Timed(coro, ctx.quota)
    except Exception:
        _record_failure(ctx)
        raise
    return _finish(api_key, ctx, body, result)


def _record_failure(ctx: RequestContext) -> None:
    """A handler raised: Kafka's sendErrorResponseMaybeThrottle records the request time against the request
    quota and throttles the error answer (:func:`failure_throttled`) and the connection by it."""
    quota: RequestQuota = ctx.quota
    if quota.recorded:  # a consumer's fetch recorded itself before failing
        return
    quota.recorded = True
    throttle = ctx.broker.quotas.record_request(ctx.principal, ctx.request.client_id or "", quota.handler_ns,
                                                wall_ms())
    if throttle > 0:
        quota.throttle_ms = throttle


def failure_throttled(ctx: RequestContext, answer: Any) -> Any:
    """The connection's error answer to a request whose handler raised, with the throttle it was given."""
    quota = ctx.quota
    if quota is None or quota.throttle_ms <= 0:
        return answer
    return throttled(ctx, answer, quota.throttle_ms)


def _finish(api_key: int, ctx: RequestContext, body, result: Any) -> Any:
    quota: RequestQuota = ctx.quota
    quotas = ctx.broker.quotas
    now = wall_ms()
    if api_key in EXEMPT_APIS:
        quotas.record_exempt(quota.handler_ns, now)
        return result
    if quota.recorded:  # a consumer's fetch recorded itself; a follower's fetch is exempt
        return result
    principal, client_id = ctx.principal, ctx.request.client_id or ""
    if api_key == PRODUCE_KEY:
        bandwidth = quotas.record_produce(principal, client_id, ctx.size, now)
        request = 0 if body.acks == 0 else quotas.record_request(principal, client_id, quota.handler_ns, now)
        throttle = max(bandwidth, request)
    else:
        throttle = quotas.record_request(principal, client_id, quota.handler_ns, now)
        if quota.mutation is not None:
            throttle = max(throttle, quota.mutation.throttle_time(now))
    return throttled(ctx, result, throttle)


def throttled(ctx: RequestContext, result: Any, throttle_ms: int) -> Any:
    """Give the request its throttle: the connection mutes for it, the response carries it."""
    if throttle_ms <= 0:
        return result
    ctx.quota.throttle_ms = throttle_ms
    if isinstance(result, CloseConnection) or not hasattr(result, "throttle_time"):
        return result
    return dataclasses.replace(result, throttle_time=datetime.timedelta(milliseconds=throttle_ms))


# -- Fetch (KafkaApis.handleFetchRequest) --


def consumer_fetch_max_bytes(ctx: RequestContext, max_bytes: int) -> int:
    """A consumer's fetch size, capped at what its fetch quota allows in a quota window."""
    if ctx.quota is None:
        return max_bytes
    return min(max_bytes, ctx.broker.quotas.fetch_max_bytes(ctx.principal, ctx.request.client_id or ""))


def fetch_exempt(ctx: RequestContext) -> None:
    """A follower's fetch: exempt request time, no client quota."""
    if ctx.quota is not None:
        ctx.quota.recorded = True
        ctx.broker.quotas.record_exempt(ctx.quota.handler_nanos(), wall_ms())


def fetch_throttle(ctx: RequestContext, response: Any) -> int:
    """Record a consumer's fetch answer (its size as Kafka's FetchResponse.sizeOf counts it: the body and 4
    bytes) and its request time; the throttle, 0 when the response may be sent. When throttled the bytes are
    taken back: the caller answers an empty fetch response instead, with the throttle (:func:`throttled`)."""
    quota = ctx.quota
    if quota is None:
        return 0
    quota.recorded = True
    quotas = ctx.broker.quotas
    principal, client_id = ctx.principal, ctx.request.client_id or ""
    codec = ctx.request.codec
    # The response as it will be sent (record data stays unread: only its length is counted); kept for the
    # connection to send (:func:`pre_encoded`), so the answer is encoded once.
    pieces = encode_response(codec, ctx.request.correlation_id, response)
    size = sum(len(piece) for piece in pieces) - SIZE.size - (1 if codec.flexible_response_header else 0)
    now = wall_ms()
    request = quotas.record_request(principal, client_id, quota.handler_nanos(), now)
    bandwidth = quotas.record_fetch(principal, client_id, size, now)
    throttle = max(bandwidth, request)
    if throttle > 0:
        quotas.unrecord_fetch(principal, client_id, size, now)
        quota.throttle_ms = throttle
    else:
        quota.encoded = (response, pieces)
    return throttle


def pre_encoded(ctx: RequestContext, result: Any) -> list | None:
    """The wire pieces of ``result`` if :func:`fetch_throttle` encoded exactly this response, else None."""
    encoded = ctx.quota.encoded if ctx.quota is not None else None
    return encoded[1] if encoded is not None and encoded[0] is result else None


# -- CreateTopics, CreatePartitions, DeleteTopics (KIP-599) --


def mutation_quota(ctx: RequestContext, api: str) -> ControllerMutationQuota | None:
    """The request's controller mutation quota ("CreateTopics", "CreatePartitions", "DeleteTopics"), None while
    no controller_mutation_rate is set anywhere (nothing could be refused or throttled: the handler then skips the
    validation it makes before taking from the quota); strict from the versions Kafka makes strict."""
    if ctx.quota is None:
        return None
    quotas = ctx.broker.quotas
    if not quotas.controller_mutation.configured:
        return None
    ctx.quota.mutation = quotas.controller_mutation.new_quota_for(
        api, ctx.version, ctx.principal, ctx.request.client_id or "", wall_ms())
    return ctx.quota.mutation


def record_mutation(quota: ControllerMutationQuota | None, partitions: int) -> None:
    """Take a topic's partitions from the quota (after the topic was validated, before it is changed, as
    ZkAdminManager does); KafkaError THROTTLING_QUOTA_EXCEEDED when a strict quota refuses it, with a null
    message as Kafka 3.7.1 answers it (ApiError.fromThrowable drops a message equal to the error's default one for
    CreateTopics and CreatePartitions; DeleteTopics sets only the code)."""
    if quota is None:
        return
    try:
        quota.record(partitions, wall_ms())
    except ThrottlingQuotaExceeded:
        raise KafkaError(ErrorCode.throttling_quota_exceeded, None) from None

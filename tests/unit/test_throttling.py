"""server/throttling.py's measuring of a handler's own time: the steps of its coroutine count, the waits between
them (a long poll, an acks=all produce waiting for the ISR) do not, as Kafka's request thread time."""

from __future__ import annotations

import asyncio
import time

import pytest

from pykbroker.server.throttling import UNMETERED_APIS, RequestQuota, _Timed, with_client_quotas


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_only_the_steps_of_a_handler_count_not_its_waits():
    async def handler(wake: asyncio.Future) -> str:
        spin(0.02)
        await wake            # parked: other connections are served meanwhile
        spin(0.02)
        return "answer"

    async def main():
        quota = RequestQuota()
        loop = asyncio.get_running_loop()
        wake = loop.create_future()
        loop.call_later(0.3, wake.set_result, None)
        started = time.perf_counter()
        result = await _Timed(handler(wake), quota)
        return result, quota.handler_ns / 1e9, time.perf_counter() - started

    result, handler_s, wall_s = asyncio.run(main())
    assert result == "answer"
    assert wall_s >= 0.3
    assert 0.04 <= handler_s < 0.25, handler_s  # the two spins, not the 0.3 s wait


def test_a_handler_error_and_a_cancellation_go_through_the_timing():
    async def failing():
        await asyncio.sleep(0)
        raise ValueError("bad request")

    cleaned = []

    async def parked(wake):
        try:
            await wake
        finally:
            cleaned.append(True)

    async def main():
        quota = RequestQuota()
        with pytest.raises(ValueError, match="bad request"):
            await _Timed(failing(), quota)
        assert quota.handler_ns > 0
        wake = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(_await(_Timed(parked(wake), RequestQuota())))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def _await(awaitable):
        return await awaitable

    asyncio.run(main())
    assert cleaned == [True]  # the handler's own cleanup ran when its connection went away


def test_authentication_apis_are_left_unmetered():
    def handler(ctx, body):
        return None

    wrapped = with_client_quotas({17: handler, 36: handler, 3: handler})
    assert UNMETERED_APIS == {17, 36}
    assert wrapped[17] is handler and wrapped[36] is handler
    assert wrapped[3] is not handler and wrapped[3].__wrapped__ is handler


def test_requests_are_metered_only_while_some_quota_value_is_set():
    """SCRAM users alone (entity configs without quota keys) do not switch metering on, nor does a quota set and
    removed again (Kafka's quotasEnabled would stay on: security/quotas.py says how /metrics differ)."""
    import types

    from pykbroker.security import client_entities
    from pykbroker.security.credentials import ScramCredentialCache, generate_credential, user_config_with
    from pykbroker.security.principal import KafkaPrincipal
    from pykbroker.security.quotas import ClientQuotas, QuotaEntity
    from pykbroker.server.throttling import mutation_quota

    quotas, credentials = ClientQuotas(), ScramCredentialCache()
    scram = user_config_with({}, "SCRAM-SHA-256", generate_credential("SCRAM-SHA-256", "pw"))
    client_entities.apply_client_entity("users/alice", scram, credentials, quotas)
    assert credentials.get("SCRAM-SHA-256", "alice") is not None
    seen = []
    wrapped = with_client_quotas({3: lambda ctx, body: seen.append(ctx.quota)})[3]

    def request():
        ctx = types.SimpleNamespace(broker=types.SimpleNamespace(quotas=quotas), principal=KafkaPrincipal("User", "alice"),
                                    request=types.SimpleNamespace(client_id="c"), quota=None, version=7)
        wrapped(ctx, None)
        return seen[-1]

    assert quotas.enabled is False and request() is None  # a SCRAM user only: not metered
    client_entities.apply_client_entity("users/alice", {**scram, "producer_byte_rate": "1024"}, credentials, quotas)
    assert quotas.enabled is True and isinstance(request(), RequestQuota)
    # only a controller_mutation_rate makes CreateTopics take (and validate for) a mutation quota
    ctx = types.SimpleNamespace(broker=types.SimpleNamespace(quotas=quotas), principal=KafkaPrincipal("User", "alice"),
                                request=types.SimpleNamespace(client_id="c"), quota=RequestQuota(), version=7)
    assert mutation_quota(ctx, "CreateTopics") is None
    quotas.apply_entity_config(QuotaEntity(client_id="c"), {"controller_mutation_rate": "1"})
    assert mutation_quota(ctx, "CreateTopics") is not None
    quotas.apply_entity_config(QuotaEntity(client_id="c"), None)
    client_entities.apply_client_entity("users/alice", scram, credentials, quotas)  # the quota removed again
    assert quotas.enabled is False and request() is None


def test_a_consumer_fetch_under_a_quota_is_encoded_once_and_sent_as_measured():
    """fetch_throttle measures the response by encoding it with the request's correlation id; the connection
    sends those pieces (pre_encoded) instead of encoding the answer a second time. A throttled fetch keeps
    nothing: its answer is the empty throttled response."""
    import datetime
    import types

    from kio.schema.errors import ErrorCode
    from kio.schema.fetch.v12.response import FetchResponse

    from pykbroker.protocol.apis import codec_for
    from pykbroker.protocol.framing import encode_response
    from pykbroker.security.principal import KafkaPrincipal
    from pykbroker.security.quotas import ClientQuotas, QuotaEntity
    from pykbroker.server.throttling import fetch_throttle, pre_encoded

    quotas = ClientQuotas()
    quotas.apply_entity_config(QuotaEntity(client_id="c"), {"consumer_byte_rate": "10"})
    codec = codec_for(1, 12)

    def fetch_ctx():
        return types.SimpleNamespace(broker=types.SimpleNamespace(quotas=quotas), principal=KafkaPrincipal("User", "u"),
                                     request=types.SimpleNamespace(client_id="c", codec=codec, correlation_id=7),
                                     quota=RequestQuota())

    response = FetchResponse(throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=0, responses=())
    ctx = fetch_ctx()
    assert fetch_throttle(ctx, response) == 0  # its 14 bytes are within the 10 B/s quota
    pieces = pre_encoded(ctx, response)
    assert pieces is not None
    assert b"".join(bytes(p) for p in pieces) == b"".join(bytes(p) for p in encode_response(codec, 7, response))
    assert pre_encoded(ctx, FetchResponse(throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=0,
                                          responses=())) is None  # another answer (an equal one too) is encoded anew
    throttled_ctx = fetch_ctx()
    for _ in range(100):  # 10 B/s over an 11 s window: throttled within a few fetches
        if fetch_throttle(throttled_ctx, response) > 0:
            break
        throttled_ctx = fetch_ctx()
    assert throttled_ctx.quota.throttle_ms > 0 and pre_encoded(throttled_ctx, response) is None

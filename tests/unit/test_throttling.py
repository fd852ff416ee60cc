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

"""Requests that wait on partitions: acks=all produces (Kafka's DelayedProduce) and long-poll fetches
(DelayedFetch).

A delayed produce holds, per partition it appended to, the offset its batches end at (last offset + 1)
and the topic's min.insync.replicas. It is checked whenever one of those partitions' HWM moves, its ISR
changes or its role changes (Partition.complete_delayed_produces) and completes, per partition, as
Kafka's Partition.checkEnoughReplicasReachOffset says: NONE once the HWM reached the offset with the
(maximal) ISR at least min.insync.replicas, NOT_ENOUGH_REPLICAS_AFTER_APPEND once the HWM reached it with
the ISR shrunk below that meanwhile, NOT_LEADER_OR_FOLLOWER if this broker stopped leading. When the
produce request's timeout passes, the partitions not yet complete answer REQUEST_TIMED_OUT (the records stay
in the log, as in Kafka). The request's response is sent once the whole operation completes, after the
answers to the connection's earlier requests (server/connection.py: the Produce requests pipelined behind
it may append meanwhile; responses stay in request order).

Time: the purgatory takes a clock (ms); the broker arms one event-loop timer per waiting produce, and
tests drive :meth:`ProducePurgatory.expire_due` with a manual clock instead.

A fetch's long poll parks one future on its partitions: a consumer's is woken when the HWM of one of
them moves (not on every append: with followers, an append moves only the log end), a follower's when the
log end moves. Either is woken by a leadership change, so the request re-reads and answers its error.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Iterable

from pykbroker.protocol.errors import ErrorCode
from pykbroker.replication.partition import Partition


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class DelayedProduce:
    """One acks=all produce request's wait: ``results[i]`` is None until partition ``i`` completes."""

    __slots__ = ("partitions", "required_offsets", "min_insync", "deadline_ms", "results", "completed", "_future", "_on_done")

    def __init__(
        self,
        waits: Iterable[tuple[Partition, int, int]],
        deadline_ms: int,
        on_done: Callable[["DelayedProduce"], None] | None = None,
    ) -> None:
        waits = list(waits)
        self.partitions = [w[0] for w in waits]
        self.required_offsets = [w[1] for w in waits]
        self.min_insync = [w[2] for w in waits]
        self.deadline_ms = deadline_ms
        self.results: list[ErrorCode | None] = [None] * len(waits)
        self.completed = False
        self._future: asyncio.Future | None = None
        self._on_done = on_done

    def try_complete(self) -> bool:
        """Check every partition not yet complete; True (and the waiter released) once all are."""
        if self.completed:
            return True
        results = self.results
        done = True
        for i, partition in enumerate(self.partitions):
            if results[i] is None:
                ready, error = partition.check_enough_replicas_reach_offset(self.required_offsets[i], self.min_insync[i])
                if ready:
                    results[i] = error
                else:
                    done = False
        if done:
            self._finish()
        return done

    def expire(self) -> None:
        """The request's timeout passed: what is not complete answers REQUEST_TIMED_OUT."""
        if self.completed:
            return
        self.try_complete()
        if self.completed:
            return
        self.results = [ErrorCode.request_timed_out if r is None else r for r in self.results]
        self._finish()

    def cancel(self) -> None:
        """The request is gone (its connection closed): stop watching without an answer."""
        if not self.completed:
            self.completed = True
            self._unregister()

    def _unregister(self) -> None:
        for partition in self.partitions:
            try:
                partition.delayed_produces.remove(self)
            except ValueError:
                pass
        if self._on_done is not None:
            self._on_done(self)

    def _finish(self) -> None:
        self.completed = True
        self._unregister()
        if self._future is not None and not self._future.done():
            self._future.set_result(self.results)

    def future(self) -> asyncio.Future:
        if self._future is None:
            self._future = asyncio.get_running_loop().create_future()
            if self.completed:
                self._future.set_result(self.results)
        return self._future


class ProducePurgatory:
    def __init__(self, clock: Callable[[], int] = wall_clock_ms) -> None:
        self.clock = clock
        self._waiting: set[DelayedProduce] = set()

    def __len__(self) -> int:
        return len(self._waiting)

    def watch(self, waits: Iterable[tuple[Partition, int, int]], timeout_ms: int) -> DelayedProduce:
        """A delayed produce for ``(partition, end offset, min.insync.replicas)`` entries; it may complete at once."""
        operation = DelayedProduce(waits, self.clock() + max(timeout_ms, 0), self._waiting.discard)
        if operation.try_complete():
            return operation
        self._waiting.add(operation)
        for partition in operation.partitions:
            partition.delayed_produces.append(operation)
        return operation

    def expire_due(self, now_ms: int | None = None) -> int:
        """Expire every operation whose deadline has passed; returns how many."""
        now = self.clock() if now_ms is None else now_ms
        due = [op for op in self._waiting if op.deadline_ms <= now]
        for operation in due:
            operation.expire()
        return len(due)

    async def wait(self, operation: DelayedProduce) -> list[ErrorCode]:
        """Await the operation's results; an event-loop timer expires it at its deadline."""
        if operation.completed:
            return operation.results  # type: ignore[return-value]
        loop = asyncio.get_running_loop()
        timer = loop.call_later(max(operation.deadline_ms - self.clock(), 0) / 1000, operation.expire)
        try:
            return await operation.future()
        finally:
            timer.cancel()
            operation.cancel()


class PartitionWatch:
    """A long poll's wake-up: registered on its partitions at once, so that an append or HWM move that
    happens between the read that found too little and the wait itself is not missed (a lost wake-up made a
    follower's fetch sit out its whole max_wait while an acks=all produce waited for it). Consumers are woken
    when a partition's HWM moves, followers when its log end moves."""

    __slots__ = ("partitions", "follower", "_waiter")

    def __init__(self, partitions: list[Partition], *, follower: bool = False) -> None:
        self.partitions = partitions
        self.follower = follower
        self._waiter = asyncio.get_running_loop().create_future()
        for partition in partitions:
            partition.add_waiter(self._waiter, follower=follower)

    async def wait(self, timeout_s: float) -> None:
        """Until a wake-up (perhaps one that came before this call) or the timeout; then unregistered."""
        try:
            if timeout_s > 0 and not self._waiter.done():
                await asyncio.wait_for(asyncio.shield(self._waiter), timeout_s)
        except asyncio.TimeoutError:
            pass
        finally:
            self.close()

    def close(self) -> None:
        for partition in self.partitions:
            partition.remove_waiter(self._waiter)
        if not self._waiter.done():
            self._waiter.cancel()


async def wait_for_partitions(partitions: list[Partition], timeout_s: float, *, follower: bool = False) -> None:
    """Park until one of ``partitions`` moves its HWM (consumers) or its log end (followers), or the timeout."""
    if timeout_s <= 0 or not partitions:
        return
    await PartitionWatch(partitions, follower=follower).wait(timeout_s)


__all__ = ["DelayedProduce", "PartitionWatch", "ProducePurgatory", "wait_for_partitions", "wall_clock_ms"]

"""Follower fetchers: the replicas this broker follows copy their leaders' logs (Kafka's ReplicaFetcherManager,
ReplicaFetcherThread and AbstractFetcherThread, 3.7, ZooKeeper mode).

One fetch task per source broker (Kafka's ``num.replica.fetchers`` = 1), all on one connection pool whose client
id is ``broker-<id>-fetcher-0``, with no ApiVersions (versions are fixed by the inter-broker protocol, as the
3.7.1 capture shows). Each round is one Fetch v16 for every partition of that leader that is not backing off:
topics by id, ``replica_state`` = (our broker id, our broker epoch), ``max_wait`` replica.fetch.wait.max.ms,
``min_bytes`` replica.fetch.min.bytes, ``max_bytes`` replica.fetch.response.max.bytes, per partition
``partition_max_bytes`` replica.fetch.max.bytes, ``current_leader_epoch`` the epoch of the LeaderAndIsr that
made us a follower, ``last_fetched_epoch`` the epoch of our log's last batch, ``log_start_offset`` ours. No fetch
session (session id 0, epoch -1: a full fetch every time). A partition starts at the local log end.

Per partition of the answer (AbstractFetcherThread.processFetchRequest):

* NONE with ``diverging_epoch``: truncate (truncation on fetch, KIP-595) to the offset Kafka's
  getOffsetTruncationState computes: when our leader-epoch cache knows the leader's epoch, the smaller of its end
  here and there; when it does not, our end of the largest epoch below it (the next fetch, naming the new last
  epoch, refines it); then continue from the new log end.
* NONE: append the batches as they are (``Partition.append_as_follower``), then take the leader's high-water
  mark and log start offset (bounded by our log), also when no records came.
* OFFSET_OUT_OF_RANGE: Kafka's fetchOffsetAndTruncate, through ListOffsets v8 with our replica id: a log ahead
  of the leader's end is truncated to it; a log behind the leader's start is emptied to start there.
* UNKNOWN_LEADER_EPOCH and NOT_LEADER_OR_FOLLOWER while the leader has not applied the LeaderAndIsr that made
  it leader yet (the controller tells every replica at once, and the follower may be first): retried after
  LEADER_CATCHING_UP_BACKOFF_MS (100 ms) at most, not the whole backoff: at a failover the new leader's
  high-water mark (and so every acks=all produce) waits for this fetch.
* FENCED_LEADER_EPOCH, any other error: the partition stays but backs off replica.fetch.backoff.ms (a
  LeaderAndIsr will replace it; Kafka removes a fenced partition until then, which fetches nothing either).
* A failed request (connection lost, timeout, no address for the leader): every partition in it backs off.

``remove_partitions`` takes effect at once: a response that comes back for a partition no longer fetched (or
re-added meanwhile) is dropped, so the caller can truncate or make the partition leader right after. Appends
happen on the event loop; the task yields after each partition so other work interleaves with a large
response. A source with no partitions left ends its task and closes its connection (Kafka's
shutdownIdleFetcherThreads).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

from kio.schema.fetch.v16 import request as fetch_request
from kio.schema.list_offsets.v8 import request as list_offsets_request
from kio.static.primitive import i32Timedelta

from pykbroker.protocol.client import ClientError, ClientSecurity, NodeClients
from pykbroker.protocol.errors import ErrorCode
from pykbroker.replication.partition import Partition, Role

if TYPE_CHECKING:
    from pykbroker.config import BrokerConfig
    from pykbroker.replication.replica_manager import ReplicaManager
    from pykbroker.replication.quota import ReplicationQuota

log = logging.getLogger(__name__)

THROTTLED_BACKOFF_S = 0.1  # a throttled partition is looked at again this soon (the quota's window is 1 s)
LEADER_CATCHING_UP_BACKOFF_MS = 100  # see the module notes: a leader that has not applied its LeaderAndIsr yet

TopicPartition = tuple[str, int]
LATEST_TIMESTAMP, EARLIEST_TIMESTAMP = -1, -2
UNDEFINED = -1


@dataclass(slots=True)
class FetchState:
    """One partition being fetched (Kafka's PartitionFetchState)."""

    topic: str
    index: int
    leader: int
    fetch_offset: int
    leader_epoch: int  # current_leader_epoch: from the LeaderAndIsr that made us a follower
    last_fetched_epoch: int
    delayed_until: float = 0.0  # loop time before which the partition is not fetched (backoff)
    in_sync: bool = False  # caught up to the leader's HWM at the last fetch (Kafka's isReplicaInSync): not throttled


class _SourceFetcher:
    """The fetch task for one leader broker (Kafka's ReplicaFetcherThread)."""

    def __init__(self, manager: "ReplicaFetcherManager", leader: int) -> None:
        self.manager = manager
        self.leader = leader
        self.partitions: dict[TopicPartition, FetchState] = {}
        self.task: asyncio.Task | None = None
        self._changed = asyncio.Event()

    def start(self) -> None:
        if self.partitions and (self.task is None or self.task.done()):
            self.task = asyncio.get_running_loop().create_task(self._run(), name=f"replica-fetcher-{self.leader}")

    def add(self, state: FetchState) -> None:
        self.partitions[(state.topic, state.index)] = state
        self._changed.set()

    def remove(self, tp: TopicPartition) -> None:
        if self.partitions.pop(tp, None) is not None:
            self._changed.set()

    def _current(self, state: FetchState) -> bool:
        return self.partitions.get((state.topic, state.index)) is state

    def _delay(self, states: Iterable[FetchState], backoff_s: float | None = None) -> None:
        until = asyncio.get_running_loop().time() + (self.manager.backoff_s if backoff_s is None else backoff_s)
        for state in states:
            state.delayed_until = until

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            # Not only cancellation ends this loop: Python 3.11's asyncio.wait_for drops a cancel that arrives
            # after the change it waited for, so close() could otherwise wait for ever (a broker that hangs
            # on SIGTERM). The manager's closed flag is set before it cancels.
            while self.partitions and not self.manager.closed:
                now = loop.time()
                ready = [s for s in self.partitions.values() if s.delayed_until <= now]
                if not ready:
                    self._changed.clear()
                    wake_in = min(s.delayed_until for s in self.partitions.values()) - now
                    try:
                        await asyncio.wait_for(self._changed.wait(), wake_in)
                    except asyncio.TimeoutError:
                        pass
                    continue
                try:
                    await self._fetch_once(ready)
                except Exception as exc:  # a bug in one round must not end replication from this leader
                    log.exception("broker %d: fetch round from leader %d failed: %r", self.manager.broker_id,
                                  self.leader, exc)
                    self._delay(ready)
        finally:
            if not self.partitions:
                self.manager.clients.remove(self.leader)

    # -- one round ------------------------------------------------------------------------------------
    def _build(self, ready: list[FetchState]):
        """The Fetch v16 request for ``ready`` and what each of its partitions was asked at; partitions whose
        topic id or local partition is unknown back off instead."""
        manager = self.manager
        by_topic: dict[uuid.UUID, list] = {}
        sent: dict[tuple[uuid.UUID, int], tuple[FetchState, int]] = {}
        missing = []
        throttled = []
        quota = manager.quota
        for state in ready:
            if (quota is not None and not state.in_sync and quota.is_throttled(state.topic, state.index)
                    and quota.is_quota_exceeded()):
                throttled.append(state)  # Kafka's shouldFollowerThrottle: left out of this round
                continue
            partition = manager.replicas.partition(state.topic, state.index)
            topic_id = manager.topic_id_of(state.topic)
            if partition is None or topic_id is None:
                missing.append(state)
                continue
            by_topic.setdefault(topic_id, []).append(fetch_request.FetchPartition(
                partition=state.index, current_leader_epoch=state.leader_epoch, fetch_offset=state.fetch_offset,
                last_fetched_epoch=state.last_fetched_epoch, log_start_offset=partition.log.log_start_offset,
                partition_max_bytes=manager.partition_max_bytes,
            ))
            sent[(topic_id, state.index)] = (state, state.fetch_offset)
        if missing:
            log.info("broker %d: not fetching %s from broker %d yet: topic id or local replica unknown",
                     manager.broker_id, ", ".join(f"{s.topic}-{s.index}" for s in missing), self.leader)
            self._delay(missing)
        if throttled:
            self._delay(throttled, min(manager.backoff_s, THROTTLED_BACKOFF_S))
        if not sent:
            return None, sent
        request = fetch_request.FetchRequest(
            replica_state=fetch_request.ReplicaState(replica_id=manager.broker_id, replica_epoch=manager.broker_epoch()),
            max_wait=manager.max_wait, min_bytes=manager.min_bytes, max_bytes=manager.max_bytes,
            isolation_level=0, session_id=0, session_epoch=-1,
            topics=tuple(fetch_request.FetchTopic(topic_id=topic_id, partitions=tuple(parts))
                         for topic_id, parts in by_topic.items()),
            forgotten_topics_data=(), rack_id="",
        )
        return request, sent

    async def _send(self, request):
        """The leader's answer, or None (and a log line) when the request failed."""
        manager = self.manager
        address = manager.address_of(self.leader)
        if address is None:
            log.info("broker %d: no address known for leader %d: fetch backs off", manager.broker_id, self.leader)
            return None
        manager.clients.set_address(self.leader, *address)
        try:
            return await manager.clients.send(self.leader, request, timeout=manager.request_timeout_s)
        except ClientError as exc:
            log.info("broker %d: %s to leader %d failed (%s): backing off %d ms", manager.broker_id,
                     type(request).__name__, self.leader, exc, manager.backoff_ms)
            return None

    async def _fetch_once(self, ready: list[FetchState]) -> None:
        request, sent = self._build(ready)
        if request is None:
            return
        response = await self._send(request)
        if response is None:
            self._delay(state for state, _ in sent.values())
            return
        if response.error_code != ErrorCode.none:
            log.warning("broker %d: fetch from leader %d failed: %s", self.manager.broker_id, self.leader,
                        ErrorCode(response.error_code).name)
            self._delay(state for state, _ in sent.values())
            return
        pending: list = []
        try:
            for topic in response.responses:
                for data in topic.partitions:
                    entry = sent.get((topic.topic_id, data.partition_index))
                    if entry is None:
                        continue
                    state, asked_offset = entry
                    if not self._current(state) or state.fetch_offset != asked_offset:
                        continue  # removed, re-added or moved while the fetch was in flight
                    try:
                        await self._process(state, data)
                    finally:  # work queued before a failure is still done
                        partition = self.manager.replicas.partition(state.topic, state.index)
                        if partition is not None and partition.log.has_file_work:
                            pending.append(partition.log)
                    await asyncio.sleep(0)  # let other work run between partitions of a large response
        finally:
            # Segments a new log start from the leader deleted: their files go in the I/O thread, even when
            # a later partition of this response failed (the round's error is then raised as before).
            if pending:
                await self.manager.replicas.log_manager.run_file_work_async(pending)

    async def _process(self, state: FetchState, data) -> None:
        manager = self.manager
        partition = manager.replicas.partition(state.topic, state.index)
        if partition is None or partition.role is not Role.FOLLOWER:
            self._delay((state,))
            return
        error = data.error_code
        try:
            if error == ErrorCode.none:
                diverging = data.diverging_epoch
                if diverging.epoch >= 0 or diverging.end_offset >= 0:
                    self._truncate_on_divergence(state, partition, diverging.epoch, diverging.end_offset)
                else:
                    self._append(state, partition, data)
            elif error == ErrorCode.offset_out_of_range:
                await self._handle_out_of_range(state, partition)
            elif error in (ErrorCode.unknown_leader_epoch, ErrorCode.not_leader_or_follower):
                # The leader is behind us (its LeaderAndIsr has not been applied yet): it will be soon.
                backoff_s = min(manager.backoff_s, LEADER_CATCHING_UP_BACKOFF_MS / 1000)
                log.debug("broker %d: fetching %s-%d from leader %d (epoch %d): %s; retrying in %.0f ms",
                          manager.broker_id, state.topic, state.index, self.leader, state.leader_epoch,
                          ErrorCode(error).name, backoff_s * 1000)
                self._delay((state,), backoff_s)
            else:
                log.info("broker %d: fetching %s-%d from leader %d (epoch %d): %s; backing off %d ms",
                         manager.broker_id, state.topic, state.index, self.leader, state.leader_epoch,
                         ErrorCode(error).name, manager.backoff_ms)
                self._delay((state,))
        except Exception as exc:  # a storage error or a batch the log refuses: retry after the backoff
            log.warning("broker %d: replicating %s-%d from leader %d failed (%s): retrying from the log end in %d ms",
                        manager.broker_id, state.topic, state.index, self.leader, exc, manager.backoff_ms)
            if self._current(state):
                state.fetch_offset = partition.log.log_end_offset
                state.last_fetched_epoch = partition.log.latest_epoch
                self._delay((state,))

    # -- the outcomes ---------------------------------------------------------------------------------
    def _append(self, state: FetchState, partition: Partition, data) -> None:
        """Kafka's processPartitionData: append, then the leader's HWM and log start offset."""
        records = data.records
        if records:
            if state.fetch_offset != partition.log.log_end_offset:
                raise RuntimeError(f"fetched offset {state.fetch_offset} is not the log end "
                                   f"{partition.log.log_end_offset}")
            partition.append_as_follower(records)
            state.fetch_offset = partition.log.log_end_offset
            state.last_fetched_epoch = partition.log.latest_epoch
            quota = self.manager.quota
            if quota is not None and quota.is_throttled(state.topic, state.index):
                quota.record(len(records))
        state.in_sync = state.fetch_offset >= data.high_watermark
        partition.update_high_watermark_from_leader(data.high_watermark)
        partition.update_log_start_offset_from_leader(data.log_start_offset)

    def _truncate_on_divergence(self, state: FetchState, partition: Partition, epoch: int, end_offset: int) -> None:
        """Truncate as Kafka's getOffsetTruncationState says for the leader's (epoch, end offset)."""
        plog = partition.log
        replica_end = plog.log_end_offset
        if end_offset == UNDEFINED:
            offset = state.fetch_offset
        elif epoch == UNDEFINED:
            offset = min(end_offset, replica_end)
        else:
            our_epoch, our_end = plog.end_offset_for_epoch(epoch)
            if our_end == UNDEFINED:  # we never tracked that epoch: the leader's end is safe
                offset = min(end_offset, replica_end)
            elif our_epoch != epoch:  # we do not know the leader's epoch: go back to the end of ours below it
                offset = min(our_end, replica_end)
            else:
                offset = min(our_end, end_offset, replica_end)
        self._truncate(state, partition, offset, f"diverging epoch {epoch} ending at {end_offset}")

    def _truncate(self, state: FetchState, partition: Partition, offset: int, why: str) -> None:
        plog = partition.log
        if offset < plog.log_end_offset:
            level = logging.WARNING if offset < partition.high_watermark else logging.INFO
            log.log(level, "broker %d: truncating %s-%d from %d to %d (%s; high-water mark %d)", self.manager.broker_id,
                    state.topic, state.index, plog.log_end_offset, offset, why, partition.high_watermark)
            partition.truncate_to(offset)
        state.fetch_offset = plog.log_end_offset
        state.last_fetched_epoch = plog.latest_epoch

    async def _handle_out_of_range(self, state: FetchState, partition: Partition) -> None:
        """Kafka's fetchOffsetAndTruncate: follow the leader's log end (when ahead) or log start (when behind)."""
        before = (state.fetch_offset, state.last_fetched_epoch)
        leader_end = await self._list_offset(state, LATEST_TIMESTAMP)
        if leader_end is None or not self._current(state):
            return
        if leader_end < partition.log.log_end_offset:
            self._truncate(state, partition, leader_end, f"out of range: the leader's log ends at {leader_end}")
        else:
            leader_start = await self._list_offset(state, EARLIEST_TIMESTAMP)
            if leader_start is None or not self._current(state):
                return
            if leader_start > partition.log.log_end_offset:
                log.warning("broker %d: %s-%d ends at %d, before the leader's log start %d: starting over there",
                            self.manager.broker_id, state.topic, state.index, partition.log.log_end_offset, leader_start)
                partition.truncate_fully_and_start_at(leader_start)
            state.fetch_offset = partition.log.log_end_offset
            state.last_fetched_epoch = partition.log.latest_epoch
        if (state.fetch_offset, state.last_fetched_epoch) == before:
            self._delay((state,))  # nothing to change here: do not spin on the same answer

    async def _list_offset(self, state: FetchState, timestamp: int) -> int | None:
        """The leader's LATEST (log end, for a replica) or EARLIEST offset; None (and a backoff) on failure."""
        request = list_offsets_request.ListOffsetsRequest(
            replica_id=self.manager.broker_id, isolation_level=0,
            topics=(list_offsets_request.ListOffsetsTopic(name=state.topic, partitions=(
                list_offsets_request.ListOffsetsPartition(
                    partition_index=state.index, current_leader_epoch=state.leader_epoch, timestamp=timestamp),
            )),),
        )
        response = await self._send(request)
        answer = None
        if response is not None:
            for topic in response.topics:
                for data in topic.partitions:
                    if topic.name == state.topic and data.partition_index == state.index:
                        answer = data
        if answer is None or answer.error_code != ErrorCode.none:
            if answer is not None:
                log.info("broker %d: ListOffsets for %s-%d from leader %d: %s", self.manager.broker_id, state.topic,
                         state.index, self.leader, ErrorCode(answer.error_code).name)
            if self._current(state):
                self._delay((state,))
            return None
        return answer.offset


class ReplicaFetcherManager:
    """The partitions this broker follows, grouped by leader, one fetch task per leader (Kafka's
    ReplicaFetcherManager). The cluster layer calls :meth:`add_partitions` after ``become_follower`` and
    :meth:`remove_partitions` before a truncation, ``become_leader`` or StopReplica."""

    def __init__(
        self,
        broker_id: int,
        replicas: "ReplicaManager",
        address_of: Callable[[int], tuple[str, int] | None],
        topic_id_of: Callable[[str], uuid.UUID | None],
        config: "BrokerConfig",
        *,
        broker_epoch: Callable[[], int] = lambda: -1,
        security: ClientSecurity | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.replicas = replicas
        self.address_of = address_of
        self.topic_id_of = topic_id_of
        self.broker_epoch = broker_epoch
        self.max_wait = i32Timedelta.parse(datetime.timedelta(milliseconds=int(config.get("replica.fetch.wait.max.ms"))))
        self.min_bytes = int(config.get("replica.fetch.min.bytes"))
        self.max_bytes = int(config.get("replica.fetch.response.max.bytes"))
        self.partition_max_bytes = int(config.get("replica.fetch.max.bytes"))
        self.backoff_ms = int(config.get("replica.fetch.backoff.ms"))
        self.backoff_s = self.backoff_ms / 1000
        # The fetch's own wait comes on top of replica.socket.timeout.ms, as Kafka's fetcher client allows.
        self.request_timeout_s = (int(config.get("replica.socket.timeout.ms"))
                                  + int(config.get("replica.fetch.wait.max.ms"))) / 1000
        self.clients = NodeClients(broker_id, client_id=f"broker-{broker_id}-fetcher-0", negotiate_versions=False,
                                   request_timeout=self.request_timeout_s, security=security)
        self._sources: dict[int, _SourceFetcher] = {}
        self._leader_of: dict[TopicPartition, int] = {}
        self.quota: "ReplicationQuota | None" = None  # the follower's replication throttle (replication/quota.py)
        self._closed = False

    def fetch_state(self, topic: str, index: int) -> FetchState | None:
        """Where the fetch of a partition stands (None: not fetched)."""
        leader = self._leader_of.get((topic, index))
        return None if leader is None else self._sources[leader].partitions.get((topic, index))

    def add_partitions(self, partitions: dict[TopicPartition, int]) -> None:
        """Fetch each (topic, index) from its leader id, from the local log end, naming the partition's current
        leader epoch; a partition already fetched starts over (from another leader, or in a new epoch)."""
        if self._closed:
            return
        touched = set()
        for (topic, index), leader in partitions.items():
            partition = self.replicas.partition(topic, index)
            if partition is None:
                log.warning("broker %d: cannot fetch %s-%d: not hosted here", self.broker_id, topic, index)
                continue
            self._forget((topic, index))
            source = self._sources.get(leader)
            if source is None:
                source = self._sources[leader] = _SourceFetcher(self, leader)
            source.add(FetchState(topic, index, leader, partition.log.log_end_offset, partition.leader_epoch,
                                  partition.log.latest_epoch))
            self._leader_of[(topic, index)] = leader
            touched.add(source)
            log.info("broker %d: fetching %s-%d from leader %d in epoch %d from offset %d", self.broker_id, topic,
                     index, leader, partition.leader_epoch, partition.log.log_end_offset)
        for source in touched:
            source.start()

    def remove_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop fetching these at once: an answer still in flight for them is dropped."""
        for tp in partitions:
            self._forget(tp)

    def _forget(self, tp: TopicPartition) -> None:
        leader = self._leader_of.pop(tp, None)
        if leader is not None:
            self._sources[leader].remove(tp)

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Stop every fetch task and close the connections."""
        self._closed = True
        tasks = [s.task for s in self._sources.values() if s.task is not None and not s.task.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception as exc:  # a bug must not stop the shutdown
                log.warning("broker %d: replica fetcher ended with %r", self.broker_id, exc)
        await self.clients.close()


__all__ = ["FetchState", "ReplicaFetcherManager"]

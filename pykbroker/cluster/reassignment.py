"""Partition reassignment in the ZooKeeper-mode controller (Kafka 3.7's KafkaController.onPartitionReassignment,
handleAlterPartitionReassignments, handleListPartitionReassignments).

Kafka's notation, from the comments of onPartitionReassignment:
    RS  = current replica set of the partition (the full set while a reassignment runs: ORS + TRS)
    ORS = original replicas,  TRS = target replicas
    AR  = adding replicas (TRS - ORS),  RR = removing replicas (ORS - TRS)

A reassignment starts by writing RS = TRS + ORS (target first) with AR and RR to /brokers/topics/<t> (the
``adding_replicas`` / ``removing_replicas`` fields of Kafka 2.4+), bumping the leader epoch and sending
LeaderAndIsr with the new RS to every replica: the new ones start as followers and copy the log. Each ISR
change of the partition (AlterPartition from its leader) checks whether TRS is in the ISR; then the
reassignment completes: RS = TRS in memory, a new leader from TRS if the current one is not in TRS (or not
alive), the ISR without RR (one state write, leader epoch + 1, LeaderAndIsr to TRS), StopReplica(delete) to
RR, /brokers/topics/<t> rewritten without AR/RR, UpdateMetadata to every broker.

Because AR/RR live in ZooKeeper, a new controller resumes every unfinished reassignment at failover (Kafka's
initializePartitionReassignments). A newer request for a partition being reassigned replaces the target:
replicas no longer wanted at all are stopped and deleted first; a cancel (replicas null) is a reassignment
back to ORS.

The legacy way (tools before 2.4, ``--zookeeper``): a JSON document created at /admin/reassign_partitions
(``{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[2,3]}]}``) is read at failover and
whenever it appears; its partitions are reassigned as above, each leaves the document when its reassignment
completes or fails, and the document is deleted when empty; an API request for a partition takes it out of
the document (the latest request wins), as Kafka's ZkPartitionReassignment. Not done (Kafka does): keeping a
topic being reassigned from deletion.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from pykbroker.cluster.zookeeper import NO_LEADER, ControllerMoved, StaleZkVersion

if TYPE_CHECKING:
    from pykbroker.cluster.controller import Controller, _Batch

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
Outcome = tuple[ErrorCode, "str | None"]
REASSIGN_PARTITIONS_PATH = "/admin/reassign_partitions"


def decode_reassignment_znode(data: bytes) -> dict[TopicPartition, list[int]]:
    """/admin/reassign_partitions (Kafka's ReassignPartitionsZNode); ValueError if it is not that JSON."""
    try:
        doc = json.loads(data)
        return {(str(p["topic"]), int(p["partition"])): [int(r) for r in p["replicas"]]
                for p in doc.get("partitions", [])}
    except (TypeError, KeyError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a partition reassignment document: {exc!r}") from None


def encode_reassignment_znode(partitions: dict[TopicPartition, list[int]]) -> bytes:
    return json.dumps({"version": 1, "partitions": [
        {"topic": t, "partition": p, "replicas": list(r)} for (t, p), r in sorted(partitions.items())]},
        separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class ReplicaAssignment:
    """Kafka's ReplicaAssignment: the full replica set with the replicas being added and removed."""

    replicas: tuple[int, ...]
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    @property
    def origin(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.adding)

    @property
    def target(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.removing)

    @property
    def being_reassigned(self) -> bool:
        return bool(self.adding or self.removing)

    def reassign_to(self, target: tuple[int, ...] | list[int]) -> "ReplicaAssignment":
        origin = self.origin
        full = tuple(dict.fromkeys(tuple(target) + origin))
        return ReplicaAssignment(full, tuple(r for r in full if r not in origin),
                                 tuple(r for r in full if r not in target))


def invalid_replicas(replicas: list[int], adding: tuple[int, ...], live: set[int]) -> str | None:
    """Kafka's validateReplicas: the message of INVALID_REPLICA_ASSIGNMENT, or None when acceptable."""
    if not replicas:
        return "Empty replica list specified in partition reassignment."
    if len(set(replicas)) != len(replicas):
        return f"Duplicate replica ids in partition reassignment replica list: {_scala_list(replicas)}"
    if any(r < 0 for r in replicas):
        return f"Invalid broker id in replica list: {_scala_list(replicas)}"
    if not set(adding) <= live:
        return (f"Replica assignment has brokers that are not alive. Replica list: {_scala_list(adding)}, "
                f"live broker list: {_scala_set(live)}")
    return None


def _scala_list(xs) -> str:
    return "List(" + ", ".join(str(x) for x in xs) + ")"


def _scala_set(xs) -> str:
    return "Set(" + ", ".join(str(x) for x in sorted(xs)) + ")"


class ReassignmentMixin:
    """The controller's reassignment part; mixed into Controller (it uses the controller's context:
    ``_assignments`` holds RS, ``_adding`` / ``_removing`` hold AR / RR per partition)."""

    _adding: dict[TopicPartition, tuple[int, ...]]
    _removing: dict[TopicPartition, tuple[int, ...]]

    def _full_assignment(self: "Controller", tp: TopicPartition) -> ReplicaAssignment:
        return ReplicaAssignment(tuple(self._assignments[tp[0]][tp[1]]), self._adding.get(tp, ()),
                                 self._removing.get(tp, ()))

    def _assignment_or_empty(self: "Controller", tp: TopicPartition) -> ReplicaAssignment:
        """The partition's assignment, or an empty one for a partition we do not know."""
        if tp[0] in self._assignments and tp[1] in self._assignments[tp[0]]:
            return self._full_assignment(tp)
        return ReplicaAssignment(())

    def _set_assignment(self: "Controller", tp: TopicPartition, assignment: ReplicaAssignment) -> None:
        self._assignments[tp[0]][tp[1]] = list(assignment.replicas)
        for table, value in ((self._adding, assignment.adding), (self._removing, assignment.removing)):
            if value:
                table[tp] = value
            else:
                table.pop(tp, None)

    def _reassigning(self: "Controller") -> list[TopicPartition]:
        return sorted(tp for tp in set(self._adding) | set(self._removing) if tp[0] in self._assignments)

    # -- the API (AlterPartitionReassignments / ListPartitionReassignments, ZooKeeper mode) --

    async def alter_partition_reassignments(
        self: "Controller", reassignments: dict[TopicPartition, list[int] | None],
    ) -> dict[TopicPartition, Outcome] | ErrorCode:
        """Per partition NONE or its error (with Kafka's messages); NOT_CONTROLLER (top level) when not active."""
        if not self.active:
            return ErrorCode.not_controller
        try:
            return await self._run("ApiPartitionReassignment",
                                   lambda: self._process_api_reassignment(reassignments))
        except (ControllerMoved, asyncio.CancelledError):
            return ErrorCode.not_controller
        except Exception:  # noqa: BLE001 - the event failed half-done: the controller steps back and fails over
            return ErrorCode.unknown_server_error if self.active else ErrorCode.not_controller

    async def list_partition_reassignments(
        self: "Controller", partitions: list[TopicPartition] | None,
    ) -> dict[TopicPartition, ReplicaAssignment] | ErrorCode:
        """The partitions (None: all) being reassigned, with RS, AR and RR; NOT_CONTROLLER when not active."""
        if not self.active:
            return ErrorCode.not_controller

        async def listing() -> dict[TopicPartition, ReplicaAssignment] | ErrorCode:
            if not self.active:
                return ErrorCode.not_controller
            wanted = self._reassigning() if partitions is None else partitions
            out = {}
            for tp in wanted:
                if tp[0] in self._assignments and tp[1] in self._assignments[tp[0]]:
                    assignment = self._full_assignment(tp)
                    if assignment.being_reassigned:
                        out[tp] = assignment
            return out

        try:
            return await self._run("ListPartitionReassignments", listing)
        except (ControllerMoved, asyncio.CancelledError):
            return ErrorCode.not_controller
        except Exception:  # noqa: BLE001 - as above
            return ErrorCode.unknown_server_error if self.active else ErrorCode.not_controller

    async def _process_api_reassignment(
        self: "Controller", reassignments: dict[TopicPartition, list[int] | None],
    ) -> dict[TopicPartition, Outcome] | ErrorCode:
        if not self.active:
            return ErrorCode.not_controller
        results: dict[TopicPartition, Outcome] = {}
        todo: dict[TopicPartition, ReplicaAssignment] = {}
        live = self._live()  # Kafka's liveBrokerIds: brokers in controlled shutdown are not
        for tp, target in reassignments.items():
            current = self._assignment_or_empty(tp)
            if target is not None:
                message = invalid_replicas(target, current.reassign_to(target).adding, live)
                if message is not None:
                    results[tp] = (ErrorCode.invalid_replica_assignment, message)
                    continue
            if current.being_reassigned:
                todo[tp] = current.reassign_to(list(current.origin) if target is None else target)
            elif target is not None:
                todo[tp] = current.reassign_to(target)
            else:
                results[tp] = (ErrorCode.no_reassignment_in_progress,
                               f"No reassignment in progress for partition {tp[0]}-{tp[1]}")
        # The latest reassignment (API or znode) takes precedence: out of the legacy document.
        await self._remove_from_zk_reassignment(lambda tp: tp in todo)
        return await self._trigger_reassignments(todo, results)

    async def _trigger_reassignments(self: "Controller", todo: dict[TopicPartition, ReplicaAssignment],
                                     results: dict[TopicPartition, Outcome]) -> dict[TopicPartition, Outcome]:
        """Kafka's maybeTriggerPartitionReassignment."""
        for tp, assignment in todo.items():
            if tp[0] in self._deleting or tp[0] not in self._assignments or tp[1] not in self._assignments[tp[0]] \
                    or tp not in self._states:
                results[tp] = (ErrorCode.unknown_topic_or_partition, "The partition does not exist.")
                continue
            # A failed ZooKeeper write (StaleZkVersion after the retries, a lost connection) is not swallowed:
            # memory may be ahead of ZooKeeper (RS/AR/RR set, a leader epoch written with no LeaderAndIsr
            # sent), so the event fails and the controller resigns and fails over from ZooKeeper, as for
            # any half-done event (Controller._process_events).
            await self._on_partition_reassignment(tp, assignment)
            results[tp] = (ErrorCode.none, None)
        return results

    # -- Kafka's onPartitionReassignment --

    async def _on_partition_reassignment(self: "Controller", tp: TopicPartition,
                                         assignment: ReplicaAssignment) -> None:
        await self._update_current_reassignment(tp, assignment)
        if assignment.being_reassigned and not set(assignment.target) <= set(self._states[tp].isr):
            log.info("controller %d: reassigning %s-%d: replicas %s, adding %s, removing %s", self.broker_id, *tp,
                     list(assignment.replicas), list(assignment.adding), list(assignment.removing))
            # A1/A2: leader epoch + 1, LeaderAndIsr with RS/AR/RR to every replica (the new ones start fetching).
            await self._bump_leader_epoch_and_send(tp)
        else:
            await self._complete_reassignment(tp, assignment)

    async def _update_current_reassignment(self: "Controller", tp: TopicPartition,
                                           assignment: ReplicaAssignment) -> None:
        """RS/AR/RR to ZooKeeper and memory; replicas of an earlier target that the new one drops are stopped."""
        current = self._full_assignment(tp)
        if current == assignment:
            return
        unneeded = [r for r in current.replicas if r not in assignment.replicas]
        self._set_assignment(tp, assignment)
        await self._write_assignment(tp[0])
        if unneeded:
            await self._stop_removed_replicas(tp, unneeded)

    async def _complete_reassignment(self: "Controller", tp: TopicPartition, assignment: ReplicaAssignment) -> None:
        """B1-B8: RS = TRS; a leader in TRS; RR out of the ISR and deleted; ZooKeeper without AR/RR; metadata."""
        target = assignment.target
        state = self._states[tp]
        live = self._live()
        removing = set(assignment.removing)
        leader = state.leader
        if leader not in target or leader not in live:
            # ReassignPartitionLeaderElectionStrategy: the first target replica that is live and in the ISR.
            leader = next((r for r in target if r in live and r in state.isr), NO_LEADER)
        isr = tuple(r for r in state.isr if r not in removing) or state.isr
        written = await self._write_states({tp: self._next_state(tp, leader, isr)})
        if tp not in written:
            # The state moved under us (re-read by _write_states): RS/AR/RR stay as they are, nothing is
            # stopped (a removed replica may still lead); the next ISR change or a failover completes it.
            log.warning("controller %d: reassignment of %s-%d not completed now: its leader/ISR changed",
                        self.broker_id, *tp)
            return
        self._set_assignment(tp, ReplicaAssignment(target))
        batch = self._new_batch()
        batch.add_leader_and_isr(self._live_replicas(tp), tp)
        for r in assignment.removing:
            batch.add_stop_replica(r, tp, delete=True)
        await self._write_assignment(tp[0])
        batch.update_metadata.add(tp)
        self._send(batch)
        await self._remove_from_zk_reassignment(lambda done: done == tp)
        log.info("controller %d: reassignment of %s-%d completed: replicas %s, leader %d, ISR %s", self.broker_id,
                 *tp, list(target), self._states[tp].leader, list(self._states[tp].isr))

    async def _stop_removed_replicas(self: "Controller", tp: TopicPartition, removed: list[int]) -> None:
        """Replicas that left RS: out of the ISR (a new leader if the leader went), StopReplica(delete)."""
        batch = self._new_batch()
        for _ in range(5):
            state = self._states[tp]  # re-read by _write_states when it moved under us
            isr = tuple(r for r in state.isr if r not in removed)
            if isr == tuple(state.isr) and state.leader not in removed:
                break
            leader = state.leader
            if leader in removed:
                live = self._live()
                leader = next((r for r in self._assignments[tp[0]][tp[1]] if r in live and r in isr), NO_LEADER)
            written = await self._write_states({tp: self._next_state(tp, leader, isr or state.isr)})
            if tp in written:
                batch.add_leader_and_isr(self._live_replicas(tp), tp)
                break
        else:
            # Never StopReplica(delete) a replica still leading or in the ISR: the event fails instead and
            # the failover (from ZooKeeper) takes it from there.
            raise StaleZkVersion(f"the state of {tp[0]}-{tp[1]} kept changing; replicas {removed} not stopped")
        for r in removed:
            batch.add_stop_replica(r, tp, delete=True)
        batch.update_metadata.add(tp)
        self._send(batch)

    async def _bump_leader_epoch_and_send(self: "Controller", tp: TopicPartition) -> None:
        state = self._states[tp]
        batch = self._new_batch()
        written = await self._write_states({tp: self._next_state(tp, state.leader, state.isr)})
        if tp in written:
            batch.add_leader_and_isr(self._live_replicas(tp), tp)
        batch.update_metadata.add(tp)
        self._send(batch)

    async def _write_assignment(self: "Controller", topic: str) -> None:
        """/brokers/topics/<t> with RS per partition and the AR/RR of those being reassigned (conditional on
        the zkVersion just read; partitions we do not know yet are kept as ZooKeeper has them)."""
        for _ in range(5):
            stored = await self.zk.get_topic_assignment(topic)
            if stored is None:
                return
            parts = dict(stored.partitions)
            ours = self._assignments.get(topic, {})
            parts.update({p: list(r) for p, r in ours.items()})
            new = dataclasses.replace(
                stored, partitions=parts,
                adding_replicas={p: list(self._adding[(topic, p)]) for p in ours if (topic, p) in self._adding},
                removing_replicas={p: list(self._removing[(topic, p)]) for p in ours if (topic, p) in self._removing})
            try:
                await self.zk.set_topic_assignment(topic, new, stored.zk_version, self._zkv)
                return
            except StaleZkVersion:
                continue
        raise StaleZkVersion(f"/brokers/topics/{topic} kept changing")

    # -- the legacy znode, /admin/reassign_partitions --

    def _watch_zk_reassignment(self: "Controller") -> None:
        self.zk._watch_data(REASSIGN_PARTITIONS_PATH, lambda data, stat: data, lambda data: data is not None and
                            self._enqueue("ZkPartitionReassignment", self._on_zk_reassignment))

    async def _on_zk_reassignment(self: "Controller") -> set[TopicPartition]:
        """Kafka's processZkPartitionReassignment: start what the document asks (partitions already being
        moved to that target are left alone); those that fail leave the document. Returns those started."""
        if not self.active:
            return set()
        found = await self.zk.get_or_none(REASSIGN_PARTITIONS_PATH)
        if found is None or not found[0]:
            return set()
        try:
            wanted = decode_reassignment_znode(found[0])
        except ValueError as exc:
            log.warning("controller %d: ignoring %s: %s", self.broker_id, REASSIGN_PARTITIONS_PATH, exc)
            return set()
        results: dict[TopicPartition, Outcome] = {}
        todo: dict[TopicPartition, ReplicaAssignment] = {}
        for tp, target in wanted.items():
            current = self._assignment_or_empty(tp)
            assignment = current.reassign_to(target)
            message = invalid_replicas(target, assignment.adding, self._live())
            if message is not None:
                results[tp] = (ErrorCode.invalid_replica_assignment, message)
            elif assignment == current and current.being_reassigned:
                continue  # already under way (our own rewrite of the document woke us)
            else:
                todo[tp] = assignment
        results = await self._trigger_reassignments(todo, results)
        failed = {tp for tp, (error, _) in results.items() if error != ErrorCode.none}
        if failed:
            log.warning("controller %d: reassignments in %s failed: %s", self.broker_id, REASSIGN_PARTITIONS_PATH,
                        {f"{t}-{p}": results[(t, p)][0].name for t, p in sorted(failed)})
        done = {tp for tp in todo if tp not in failed and not self._full_assignment(tp).being_reassigned}
        await self._remove_from_zk_reassignment(lambda tp: tp in failed or tp in done)
        return set(todo) - failed

    async def _remove_from_zk_reassignment(self: "Controller", remove) -> None:
        """Kafka's maybeRemoveFromZkReassignment: the document without those partitions; deleted when empty."""
        found = await self.zk.get_or_none(REASSIGN_PARTITIONS_PATH)
        if found is None or not found[0]:
            return
        try:
            wanted = decode_reassignment_znode(found[0])
        except ValueError:
            wanted = {}
        kept = {tp: r for tp, r in wanted.items() if not remove(tp)}
        if kept == wanted and wanted:
            return
        if kept:
            await self.zk.guarded_multi(self._zkv, [("set", REASSIGN_PARTITIONS_PATH,
                                                     encode_reassignment_znode(kept), found[1].version)])
        else:
            log.info("controller %d: no more partitions to reassign in %s; deleting it", self.broker_id,
                     REASSIGN_PARTITIONS_PATH)
            await self.zk.guarded_multi(self._zkv, [("delete", REASSIGN_PARTITIONS_PATH, found[1].version)])

    # -- hooks called by the controller --

    def _load_reassignment(self: "Controller", topic: str, adding: dict[int, list[int]],
                           removing: dict[int, list[int]]) -> None:
        """At failover / topic load: AR/RR as stored in /brokers/topics/<t>."""
        for p in self._assignments.get(topic, {}):
            if adding.get(p):
                self._adding[(topic, p)] = tuple(adding[p])
            if removing.get(p):
                self._removing[(topic, p)] = tuple(removing[p])

    async def _resume_reassignments(self: "Controller") -> None:
        """Kafka's initializePartitionReassignments at failover: the legacy document first, then every
        reassignment stored in the topics' assignments carries on."""
        started = await self._on_zk_reassignment()
        for tp in self._reassigning():
            if tp[0] not in self._deleting and tp in self._states and tp not in started:
                log.info("controller %d: resuming the reassignment of %s-%d", self.broker_id, *tp)
                await self._on_partition_reassignment(tp, self._full_assignment(tp))

    async def _maybe_complete_reassignments(self: "Controller", partitions) -> None:
        """After ISR changes: reassignments whose target replicas are all in the ISR complete."""
        for tp in partitions:
            if tp in self._states and tp[0] not in self._deleting:
                assignment = self._full_assignment(tp)
                if assignment.being_reassigned and set(assignment.target) <= set(self._states[tp].isr):
                    await self._complete_reassignment(tp, assignment)

    def _new_batch(self) -> "_Batch":
        from pykbroker.cluster.controller import _Batch
        return _Batch()

    def _reassignment_fields(self: "Controller", tp: TopicPartition) -> dict[str, Any]:
        return {"adding_replicas": self._adding.get(tp, ()), "removing_replicas": self._removing.get(tp, ())}

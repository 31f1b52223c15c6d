"""The group coordinator: routes each group request by its group's type and runs what the pure
state machines cannot (waiting, timers, files).

A group id names one group of one type. Classic groups (JoinGroup, SyncGroup, Heartbeat,
LeaveGroup) are decided by `core.groups.classic.ClassicGroups`, KIP-848 groups (ConsumerGroupHeartbeat)
by `consumer_groups.ConsumerGroupCoordinator`; committed and transactional offsets of both are
`offsets.GroupOffsets`. A JoinGroup is refused while a consumer group with members holds its id;
each type converts an empty group of the other (its offsets stay).

For the classic machine this module is its `ClassicShell`:
- a JoinGroup or a follower's SyncGroup waits on a future it hands the machine, which the machine
  answers when the rebalance decides;
- each rebalance deadline the machine keeps on a group runs as an event-loop timer, which reports
  it passed; sessions expire on the broker's tick (`expire`);
- a group's record (Kafka's GroupMetadata record) is written to, and loaded from, the group's file
  (`storage.group_offsets`, fsynced). A broker that starts, or that becomes a group's coordinator
  (a cluster's brokers share the files), loads it: a group with members is Stable at its
  generation with each member's assignment and a fresh session timer (from load time), so members
  that keep heartbeating see no rebalance and their commits at that generation are taken; a member
  that does not come back is removed when its session times out. A broker that stops coordinating
  a group forgets it (its waiting members are told NOT_COORDINATOR).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, cast

from oncelog.broker.groups.consumer_groups import ConsumerGroupConfig, ConsumerGroupCoordinator
from oncelog.broker.groups.offsets import GroupOffsets, TxnCommitCheck, storage_failed
from oncelog.broker.groups.record_sync import RecordSync
from oncelog.broker.groups.share_groups import ShareGroupConfig, ShareGroupCoordinator
from oncelog.core.groups.classic import ClassicGroups, Waiting
from oncelog.core.groups.classic_group import (
    CONSUMER_PROTOCOL,
    Deadline,
    Group,
    JoinResult,
    SyncAnswer,
    SyncResult,
    loaded_group,
    member_from_record,
)
from oncelog.core.groups.consumer_group import TopicMetadata
from oncelog.protocol.errors import ErrorCode
from oncelog.storage.group_offsets import Committed, Frame, GroupMeta, GroupOffsetStore, MemberMeta
from oncelog.storage.share_state import ShareStateStore

log = logging.getLogger(__name__)
E = ErrorCode


class GroupCoordinator:
    def __init__(self, store: GroupOffsetStore, now_ms: Callable[[], int],
                 initial_rebalance_delay_ms: int = 100, *, min_session_timeout_ms: int = 6000,
                 max_session_timeout_ms: int = 1800000, offsets_retention_ms: int = 7 * 24 * 3600 * 1000,
                 offsets_retention_check_interval_ms: int = 600000,
                 producer_id_expiration_ms: int = 24 * 3600 * 1000,
                 owns: Callable[[str], bool] = lambda group_id: True,
                 consumer_groups: ConsumerGroupConfig | None = None,
                 topics: Callable[[], TopicMetadata] = dict,
                 share_groups: ShareGroupConfig | None = None, share_store: ShareStateStore | None = None) -> None:
        """`owns`: whether this broker coordinates a group (only those are loaded and expired
        here). A store shared by the brokers of a cluster is loaded by the broker's tick, once
        the cluster says which groups are this broker's; otherwise every group loads now.
        `topics`: the topics a consumer group may subscribe to (name -> (id, partitions))."""
        self.store = store
        self.now_ms = now_ms
        self.owns = owns
        self.started_ms = now_ms()
        self.classic = ClassicGroups(self, initial_rebalance_delay_ms, min_session_timeout_ms, max_session_timeout_ms)
        # the fsyncs of the groups' record logs (consumer groups' records, offsets), off the loop
        self.record_sync = RecordSync(now_ms)
        self.consumer = ConsumerGroupCoordinator(store, now_ms, consumer_groups or ConsumerGroupConfig(), topics,
                                                 owns, self.classic.release, self.record_sync)
        # share groups (KIP-932): their state beside the groups' files, under the same leases
        self.share = ShareGroupCoordinator(
            share_store or ShareStateStore(store.directory / "share-state", store.writing_group, shared=store.shared),
            now_ms, share_groups or ShareGroupConfig(), topics)
        self.offsets = GroupOffsets(store, now_ms, self.classic, self.consumer, retention_ms=offsets_retention_ms,
                                    retention_check_interval_ms=offsets_retention_check_interval_ms,
                                    producer_id_expiration_ms=producer_id_expiration_ms,
                                    started_ms=self.started_ms, sync=self.record_sync)
        # the event-loop timer running each classic group's rebalance deadline
        self._timers: dict[tuple[Group, str], tuple[Deadline, asyncio.TimerHandle]] = {}
        if not store.shared:
            self.reconcile()

    # ------------------------------------------------------------------ classic groups
    async def join(self, group_id: str, member_id: str, instance_id: str | None, client_id: str,
                   client_host: str, protocol_type: str, protocols: list[tuple[str, bytes]],
                   session_timeout_ms: int, rebalance_timeout_ms: int, require_known_member: bool
                   ) -> JoinResult:
        error = self.classic.join_error(group_id, session_timeout_ms)
        if error:
            return JoinResult(error, member_id=member_id)
        if self.share.is_share_group(group_id):
            log.info("group %s: JoinGroup refused: the group is a share group", group_id)
            return JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id)
        if not self.consumer.release(group_id):
            # Kafka 4 lets classic members into a consumer group (a mixed group); oncelog does not
            log.info("group %s: JoinGroup refused: the group is a consumer group with members", group_id)
            return JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id)
        waiter: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        result = self.classic.join(group_id, member_id, instance_id, client_id, client_host, protocol_type,
                                   protocols, session_timeout_ms, rebalance_timeout_ms, require_known_member,
                                   waiter, self.now_ms())
        return await waiter if isinstance(result, Waiting) else result

    async def sync(self, group_id: str, generation: int, member_id: str, assignments: dict[str, bytes],
                   instance_id: str | None = None, protocol_type: str | None = None,
                   protocol_name: str | None = None) -> SyncResult:
        waiter: asyncio.Future[SyncAnswer] = asyncio.get_running_loop().create_future()
        result = self.classic.sync(group_id, generation, member_id, assignments, instance_id, protocol_type,
                                   protocol_name, waiter, self.now_ms())
        if not isinstance(result, Waiting):
            return result
        error, assignment = await waiter
        if error:
            return error, None, None, b""
        return E.NONE, result.group.protocol_type, result.group.protocol, assignment

    def heartbeat(self, group_id: str, generation: int, member_id: str, instance_id: str | None = None) -> int:
        return self.classic.heartbeat(group_id, generation, member_id, instance_id, self.now_ms())

    def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> list[int]:
        """One error per (member id, group instance id); an empty member id names a static member
        by its instance id (an administrator removing it)."""
        return self.classic.leave(group_id, members, self.now_ms())

    def group(self, group_id: str) -> Group | None:
        """The classic group, loaded from its record if this broker has not loaded it yet; None if
        nothing is known of it."""
        return self.classic.group(group_id)

    # ------------------------------------------------------------------ either type
    def free_for_share(self, group_id: str) -> bool:
        """Whether a share group may take `group_id`: no classic or consumer group uses it (with
        members or offsets: Kafka's group ids name one group of one type)."""
        cg = self.consumer.group(group_id)
        if cg is not None:
            return False
        return self.classic.group(group_id) is None and not self.store.get(group_id)

    def delete_group(self, group_id: str) -> int:
        """DeleteGroups: only an empty group goes, with its offsets (a share group with its
        share-partitions' state)."""
        if self.share.is_share_group(group_id):
            return self.share.delete(group_id)
        cg = self.consumer.group(group_id)
        if cg is not None:
            if cg.members:
                return E.NON_EMPTY_GROUP
            self.consumer.forget(group_id)
        else:
            g = self.classic.group(group_id)
            if g is None:
                return E.GROUP_ID_NOT_FOUND
            if not self.classic.deletable(g, self.now_ms()):
                return E.NON_EMPTY_GROUP
            self.classic.groups.pop(group_id, None)
        self.store.remove(group_id)
        log.info("group %s deleted", group_id)
        return E.NONE

    def listing(self) -> list[tuple[str, str, str, str]]:
        """(group id, protocol type, state, group type) of every group this broker coordinates,
        including offset-only ones; the type is Kafka's `classic`, `consumer` or `share`."""
        self.reconcile()
        return sorted([(gid, g.protocol_type or "", g.state, "classic") for gid, g in self.classic.groups.items()]
                      + [(gid, CONSUMER_PROTOCOL, state, "consumer") for gid, state in self.consumer.listing()]
                      + [(gid, "share", state, "share") for gid, state in self.share.listing()])

    def close(self) -> None:
        """The broker stops: the groups' fsyncs in flight end, the share groups' last writes."""
        self.record_sync.close()
        self.share.close()

    def expire(self, consumer_groups: bool = True) -> None:
        """The broker's tick: which groups are this broker's, sessions, pending member ids, and
        (every `offsets.retention.check.interval.ms`) offsets and idle producers' offsets state.
        `consumer_groups=False`: the consumer groups' members are left to the caller
        (`ConsumerGroupCoordinator.expire_stepwise`, which the broker's tick awaits)."""
        self.reconcile()
        now = self.now_ms()
        for g in list(self.classic.groups.values()):
            self.classic.expire_sessions(g, now)
        if consumer_groups:
            self.consumer.expire()
        self.share.expire()
        self.offsets.tick(now)

    def reconcile(self) -> None:
        """Load the stored groups this broker coordinates, forget those it no longer does."""
        for group_id in [gid for gid in self.classic.groups if not self.owns(gid)]:
            self.classic.unload(group_id)
        for group_id in self.store.groups():
            if group_id not in self.classic.groups and self.owns(group_id):
                self.classic.group(group_id)
        self.consumer.reconcile()
        self.share.unload(lambda group_id: not self.owns(group_id))

    def unload_partition(self, partition: int) -> None:
        """This broker lost `__consumer_offsets-<partition>` (its lease): the groups of it held in
        memory are forgotten, classic, consumer and share groups alike (`broker.groups.ownership`)."""
        for group_id in [gid for gid in self.classic.groups if self.store.partition_of(gid) == partition]:
            self.classic.unload(group_id)
        self.consumer.unload_partition(partition)
        self.share.unload(lambda group_id: self.store.partition_of(group_id) == partition)

    # ------------------------------------------------------------------ offsets (`offsets.GroupOffsets`)
    def commit(self, group_id: str, generation: int, member_id: str,
               offsets: dict[tuple[str, int], Committed], instance_id: str | None = None,
               retention_ms: int = -1, api_version: int = 8) -> int:
        return self.offsets.commit(group_id, generation, member_id, offsets, instance_id, retention_ms, api_version)

    async def commit_durably(self, group_id: str, generation: int, member_id: str,
                             offsets: dict[tuple[str, int], Committed], instance_id: str | None = None,
                             retention_ms: int = -1, api_version: int = 8) -> int:
        return await self.offsets.commit_durably(group_id, generation, member_id, offsets, instance_id, retention_ms,
                                                 api_version)

    def committed(self, group_id: str) -> dict[tuple[str, int], Committed]:
        return self.offsets.committed(group_id)

    async def offsets_flushed(self, group_id: str) -> bool:
        """Whether what the group's offsets hold is on disk, waiting for it if a commit's fsync
        is under way (what an OffsetFetch answers never goes back after a crash)."""
        return await self.offsets.flushed(group_id)

    def unstable(self, group_id: str) -> set[tuple[str, int]]:
        return self.offsets.unstable(group_id)

    def delete_offsets(self, group_id: str, partitions: list[tuple[str, int]]
                       ) -> tuple[int, dict[tuple[str, int], int]]:
        return self.offsets.delete_offsets(group_id, partitions)

    def delete_topic(self, topic: str) -> None:
        self.offsets.delete_topic(topic)

    def expire_offsets(self, now: int) -> int:
        return self.offsets.expire_offsets(now)

    def txn_commit(self, group_id: str, producer_id: int, producer_epoch: int, generation: int, member_id: str,
                   instance_id: str | None, offsets: dict[tuple[str, int], Committed], sync: bool = True,
                   frames: list[Frame] | None = None) -> int:
        return self.offsets.txn_commit(group_id, producer_id, producer_epoch, generation, member_id, instance_id,
                                       offsets, sync, frames)

    async def txn_records(self, group_id: str, offsets: dict[tuple[str, int], Committed]
                          ) -> tuple[dict[tuple[str, int], Committed], list[Frame]]:
        return await self.offsets.txn_records(group_id, offsets)

    async def txn_flushed(self, group_id: str, producer_id: int) -> int:
        return await self.offsets.txn_flushed(group_id, producer_id)

    def begin_txn_commit(self, producer_id: int, producer_epoch: int, v2: bool) -> TxnCommitCheck:
        return self.offsets.begin_txn_commit(producer_id, producer_epoch, v2)

    def end_txn_commit(self, producer_id: int, check: TxnCommitCheck) -> None:
        self.offsets.end_txn_commit(producer_id, check)

    def complete_txn(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                     partition: int, transaction_version: int = 0) -> int:
        return self.offsets.complete_txn(producer_id, producer_epoch, coordinator_epoch, commit, partition,
                                         transaction_version)

    # ------------------------------------------------------------------ ClassicShell
    def answer(self, waiter: object, result: JoinResult | SyncAnswer) -> None:
        fut = cast("asyncio.Future[Any]", waiter)  # the futures join and sync hand in
        if not fut.done():
            fut.set_result(result)

    def deadline_moved(self, g: Group) -> None:
        for kind, deadline in (("join", g.join_deadline), ("sync", g.sync_deadline)):
            armed = self._timers.get((g, kind))
            if armed is not None and armed[0] is deadline:
                continue
            if armed is not None:
                armed[1].cancel()
                del self._timers[(g, kind)]
            if deadline is not None:
                handle = asyncio.get_running_loop().call_later(deadline.after_ms / 1000, self._deadline_passed,
                                                               g, kind, deadline)
                self._timers[(g, kind)] = (deadline, handle)

    def _deadline_passed(self, g: Group, kind: str, deadline: Deadline) -> None:
        if kind == "join":
            self.classic.join_deadline_passed(g, deadline, self.now_ms())
        else:
            self.classic.sync_deadline_passed(g, deadline, self.now_ms())

    def record(self, g: Group) -> bool:
        """Store the group's metadata record (Kafka's GroupMetadataValue); False if storage failed,
        or if another broker coordinates the group now (its record is that broker's to write: a
        timer of this broker's copy may fire before the tick forgets it)."""
        if not self.owns(g.group_id):
            log.info("group %s: generation %d not stored: another broker coordinates the group now",
                     g.group_id, g.generation)
            return False
        if g.members:
            meta = GroupMeta(g.protocol_type, None, g.generation, g.protocol, g.leader, tuple(
                MemberMeta(m.member_id, m.instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                           m.session_timeout_ms, m.metadata(g.protocol), m.assignment) for m in g.members.values()))
        else:
            meta = GroupMeta(g.protocol_type, g.state_since_ms, g.generation)
        try:
            self.store.set_meta(g.group_id, meta)
        except OSError as e:
            return not storage_failed(g.group_id, f"generation {g.generation}", e)
        return True

    def load(self, group_id: str) -> Group | None:
        """A group from its stored record (Kafka's GroupMetadata.loadGroup), each member with a
        fresh session timer; None for a consumer group's or an unknown id."""
        if self.store.is_consumer(group_id):
            return None  # a consumer group's (`self.consumer`)
        meta, offsets = self.store.meta(group_id), self.store.get(group_id)
        if not offsets and meta == GroupMeta():
            return None
        now = self.now_ms()
        members = [member_from_record(r.member_id, r.instance_id, r.client_id, r.client_host, meta.protocol,
                                      r.subscription, r.session_timeout_ms, r.rebalance_timeout_ms, r.assignment, now)
                   for r in meta.members]
        # offsets only, from before empty-since was stored: as if it emptied at the start
        empty_since = meta.empty_since_ms if meta.empty_since_ms is not None else self.started_ms
        g = loaded_group(group_id, meta.generation, meta.protocol_type, meta.protocol, meta.leader, members,
                         empty_since, now)
        if g.members:
            log.info("group %s: loaded Stable at generation %d with %d members", group_id, g.generation,
                     len(g.members))
        return g

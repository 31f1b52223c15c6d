"""Classic consumer-group coordination (JoinGroup / SyncGroup / Heartbeat / LeaveGroup) and
committed offsets, with the semantics of Kafka's GroupCoordinator (core/.../coordinator/group/
GroupCoordinator.scala, GroupMetadata.scala), so that unmodified clients behave as they do on Kafka.

States: Empty -> PreparingRebalance (members rejoin; a group coming from Empty waits
`group.initial.rebalance.delay.ms`, extended while new members keep arriving, up to the rebalance
timeout) -> CompletingRebalance (the leader computes the assignment and hands it in with SyncGroup)
-> Stable. Rules clients depend on:
- A commit from a member of the current generation is accepted in Stable and PreparingRebalance;
  only CompletingRebalance answers REBALANCE_IN_PROGRESS. A member learns of a rebalance from its
  heartbeat and commits what it consumed before it rejoins; refusing that commit makes the
  partitions' next owners read those records again.
- JoinGroup v4+ from a new dynamic member answers MEMBER_ID_REQUIRED with its id (KIP-394); the group
  waits for such pending members (or their session timeout) before completing a rebalance.
- Static members (`group.instance.id`, KIP-345): a restarted instance rejoining with an unknown member
  id takes over its old member; in Stable with an unchanged protocol this needs no rebalance. The old
  member id is fenced (FENCED_INSTANCE_ID), and static members that did not rejoin stay in the group
  until their session times out.
- A member leaves when it misses its session timeout (members waiting in JoinGroup or SyncGroup are
  alive; a new member's first join may wait 5 minutes), or does not rejoin within the rebalance
  timeout (dynamic members), or does not send SyncGroup within the rebalance timeout.
- Committed offsets outlive an empty group for `offsets.retention.minutes` counted from when it became
  empty; offsets of a group without members (commits from `assign` users) expire by commit time, and
  a Stable consumer group loses only offsets of topics it no longer subscribes to.
JoinGroup and a follower's SyncGroup wait for the rebalance, as in Kafka; other requests never do.

Persistence, as Kafka writes its GroupMetadata record: when the leader's SyncGroup hands out a
generation's assignment (the members are answered once it is durable), when a join phase ends with
the group Empty, and when a static member is replaced without a rebalance; never on an ordinary
join or leave, so the record always describes a generation that was handed out whole. A broker
that starts, or that becomes a group's coordinator (a cluster's brokers share the files), loads the
record: a group with members is Stable at its generation with each member's assignment and a fresh
session timer (from load time), so members that keep heartbeating see no rebalance and their
commits at that generation are taken; a member that does not come back is removed when its session
times out. A broker that stops coordinating a group forgets it (its waiting members are told
NOT_COORDINATOR).

KIP-848 consumer groups (`consumer_groups`) share the group ids, the offsets and their store with
classic groups: this coordinator keeps the offsets of both, and asks the consumer-group
coordinator (`self.consumer`) to check commits to its groups, to list and delete them, and whether
a JoinGroup may take a group id.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from oncelog.broker.groups.consumer_groups import ConsumerGroupConfig, ConsumerGroupCoordinator
from oncelog.core.groups.consumer_group import TopicMetadata
from oncelog.core.txn.log_format import CONSUMER_OFFSETS_TOPIC
from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.primitives import Reader
from oncelog.storage.fence import Busy, Fenced
from oncelog.storage.group_offsets import Committed, GroupMeta, GroupOffsetStore, MemberMeta

log = logging.getLogger(__name__)

EMPTY, PREPARING, COMPLETING, STABLE = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable"
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000  # Kafka's GroupCoordinator.NewMemberJoinTimeoutMs
CONSUMER_PROTOCOL = "consumer"
E = ErrorCode


@dataclass(eq=False)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    protocols: list[tuple[str, bytes]]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    heartbeat_deadline_ms: int
    assignment: bytes = b""
    is_new: bool = True
    join_waiters: list[asyncio.Future] = field(default_factory=list)
    sync_waiters: list[asyncio.Future] = field(default_factory=list)

    def metadata(self, protocol: str | None) -> bytes:
        return next((meta for name, meta in self.protocols if name == protocol), b"")

    def alive(self, now_ms: int) -> bool:
        if not self.is_new and (self.join_waiters or self.sync_waiters):
            return True  # waiting for the rebalance counts as a heartbeat
        return now_ms <= self.heartbeat_deadline_ms


@dataclass
class JoinResult:
    error: int
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    member_id: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)


@dataclass(eq=False)
class Group:
    group_id: str
    state: str = EMPTY
    state_since_ms: int = 0
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static: dict[str, str] = field(default_factory=dict)      # group.instance.id -> member id
    pending: dict[str, int] = field(default_factory=dict)     # MEMBER_ID_REQUIRED ids -> deadline
    pending_sync: set[str] = field(default_factory=set)       # members yet to send SyncGroup
    subscribed: frozenset[str] | None = None                  # topics of a consumer group, if known
    join_timer: asyncio.TimerHandle | None = None
    sync_timer: asyncio.TimerHandle | None = None
    initial_join: bool = False       # the join timer is the initial delay (never completes early)
    initial_remaining_ms: int = 0
    new_member_added: bool = False

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def all_joined(self) -> bool:
        return not self.pending and all(m.join_waiters for m in self.members.values())

    def supports(self, protocol_type: str, names: list[str]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(names)
        return protocol_type == self.protocol_type and any(
            all(n in {p for p, _ in m.protocols} for m in self.members.values()) for n in names)

    def select_protocol(self) -> str:
        """Each member votes for its most preferred protocol that all members support."""
        common = set.intersection(*({p for p, _ in m.protocols} for m in self.members.values()))
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = next(p for p, _ in m.protocols if p in common)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=votes.__getitem__)


class GroupCoordinator:
    def __init__(self, store: GroupOffsetStore, now_ms: Callable[[], int],
                 initial_rebalance_delay_ms: int = 100, *, min_session_timeout_ms: int = 6000,
                 max_session_timeout_ms: int = 1800000, offsets_retention_ms: int = 7 * 24 * 3600 * 1000,
                 offsets_retention_check_interval_ms: int = 600000,
                 producer_id_expiration_ms: int = 24 * 3600 * 1000,
                 owns: Callable[[str], bool] = lambda group_id: True,
                 consumer_groups: ConsumerGroupConfig | None = None,
                 topics: Callable[[], TopicMetadata] = dict) -> None:
        """`owns`: whether this broker coordinates a group (only those are loaded and expired
        here). A store shared by the brokers of a cluster is loaded by the broker's tick, once
        the cluster says which groups are this broker's; otherwise every group loads now.
        `topics`: the topics a consumer group may subscribe to (name -> (id, partitions))."""
        self.store = store
        self.now_ms = now_ms
        self.initial_delay_ms = initial_rebalance_delay_ms
        self.min_session_ms, self.max_session_ms = min_session_timeout_ms, max_session_timeout_ms
        self.retention_ms = offsets_retention_ms
        self.retention_interval_ms = offsets_retention_check_interval_ms
        self.producer_expiration_ms = producer_id_expiration_ms
        self.owns = owns
        self._txn_guards: dict[int, list[list[bool]]] = {}  # producer id -> TxnOffsetCommits waiting
        self.groups: dict[str, Group] = {}
        self.started_ms = now_ms()
        self._next_retention_ms = self.started_ms + offsets_retention_check_interval_ms
        self.consumer = ConsumerGroupCoordinator(store, now_ms, consumer_groups or ConsumerGroupConfig(), topics,
                                                 owns, self._release)
        if not store.shared:
            self.reconcile()

    # ------------------------------------------------------------------ JoinGroup
    async def join(self, group_id: str, member_id: str, instance_id: str | None, client_id: str,
                   client_host: str, protocol_type: str, protocols: list[tuple[str, bytes]],
                   session_timeout_ms: int, rebalance_timeout_ms: int, require_known_member: bool
                   ) -> JoinResult:
        if not group_id:
            return JoinResult(E.INVALID_GROUP_ID, member_id=member_id)
        if not self.min_session_ms <= session_timeout_ms <= self.max_session_ms:
            return JoinResult(E.INVALID_SESSION_TIMEOUT, member_id=member_id)
        if not self.consumer.release(group_id):
            # Kafka 4 lets classic members into a consumer group (a mixed group); oncelog does not
            log.info("group %s: JoinGroup refused: the group is a consumer group with members", group_id)
            return JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id)
        g = self.group(group_id)
        if g is None:
            if member_id:  # a member of a group this coordinator does not know
                return JoinResult(E.UNKNOWN_MEMBER_ID, member_id=member_id)
            g = self._new_group(group_id)
        if not g.supports(protocol_type, [name for name, _ in protocols]):
            return JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id)
        timeouts = (session_timeout_ms, rebalance_timeout_ms)
        if not member_id:
            new_id = f"{instance_id or client_id}-{uuid.uuid4()}"
            if instance_id is not None:
                if instance_id in g.static:
                    return await self._replace_static_member(g, instance_id, new_id, protocols, *timeouts)
                waiter = self._add_member(g, new_id, instance_id, client_id, client_host,
                                          protocol_type, protocols, *timeouts)
            elif require_known_member:  # KIP-394: the client rejoins with this id
                g.pending[new_id] = self.now_ms() + session_timeout_ms
                return JoinResult(E.MEMBER_ID_REQUIRED, member_id=new_id)
            else:
                waiter = self._add_member(g, new_id, None, client_id, client_host, protocol_type,
                                          protocols, *timeouts)
        elif member_id in g.pending:
            del g.pending[member_id]
            if instance_id is not None:  # a static member is never sent MEMBER_ID_REQUIRED
                self._try_complete_join(g)
                return JoinResult(E.UNKNOWN_MEMBER_ID, member_id=member_id)
            waiter = self._add_member(g, member_id, None, client_id, client_host, protocol_type,
                                      protocols, *timeouts)
        else:
            error = self._validate_member(g, member_id, instance_id)
            if error:
                return JoinResult(error, member_id=member_id)
            m = g.members[member_id]
            if g.state == EMPTY:
                return JoinResult(E.UNKNOWN_MEMBER_ID, member_id=member_id)
            unchanged = m.protocols == protocols
            if g.state == COMPLETING and unchanged:
                return self._join_result(g, m)  # it missed its JoinGroup answer: the same again
            if g.state == STABLE and unchanged and member_id != g.leader:
                return self._join_result(g, m)  # a follower with nothing new: no rebalance
            # the leader rejoining in Stable asks for a rebalance (e.g. its topics changed)
            waiter = self._update_member(m, protocols, *timeouts)
            self._maybe_prepare_rebalance(g, f"member {member_id} rejoined")
        self._try_complete_join(g)
        return await waiter

    def _join_result(self, g: Group, m: Member, leader: str | None = None) -> JoinResult:
        members = ([(x.member_id, x.instance_id, x.metadata(g.protocol)) for x in g.members.values()]
                   if m.member_id == g.leader and leader is None else [])
        return JoinResult(E.NONE, g.generation, g.protocol_type, g.protocol,
                          leader if leader is not None else g.leader or "", m.member_id, members)

    def _validate_member(self, g: Group, member_id: str, instance_id: str | None) -> int:
        """Kafka's validateCurrentMember: a static instance must map to this member id."""
        if instance_id is not None:
            current = g.static.get(instance_id)
            if current is None:
                return E.UNKNOWN_MEMBER_ID
            if current != member_id:
                log.info("group %s: member %s of instance %s is fenced by member %s", g.group_id,
                         member_id, instance_id, current)
                return E.FENCED_INSTANCE_ID
            return E.NONE
        return E.NONE if member_id in g.members else E.UNKNOWN_MEMBER_ID

    def _add_member(self, g: Group, member_id: str, instance_id: str | None, client_id: str,
                    client_host: str, protocol_type: str, protocols, session_ms: int,
                    rebalance_ms: int) -> asyncio.Future:
        if not g.members:
            g.protocol_type = protocol_type
        m = Member(member_id, instance_id, client_id, client_host, list(protocols), session_ms,
                   rebalance_ms, self.now_ms() + NEW_MEMBER_JOIN_TIMEOUT_MS)
        if g.state == PREPARING and g.generation == 0:
            g.new_member_added = True  # lets the initial delay wait a little longer
        g.members[member_id] = m
        if instance_id is not None:
            g.static[instance_id] = member_id
        if g.leader is None:
            g.leader = member_id
        waiter = self._waiter(m.join_waiters)
        log.info("group %s: member %s (instance %s) joins in state %s", g.group_id, member_id,
                 instance_id, g.state)
        self._maybe_prepare_rebalance(g, f"new member {member_id}")
        return waiter

    def _update_member(self, m: Member, protocols, session_ms: int, rebalance_ms: int) -> asyncio.Future:
        m.protocols = list(protocols)
        m.session_timeout_ms, m.rebalance_timeout_ms = session_ms, rebalance_ms
        return self._waiter(m.join_waiters)

    @staticmethod
    def _waiter(waiters: list[asyncio.Future]) -> asyncio.Future:
        # a member's request retried on another connection gets the same answer as the first
        fut = asyncio.get_running_loop().create_future()
        waiters.append(fut)
        return fut

    async def _replace_static_member(self, g: Group, instance_id: str, new_id: str, protocols,
                                     session_ms: int, rebalance_ms: int) -> JoinResult:
        old_id = g.static[instance_id]
        old_leader = g.leader
        m = g.members.pop(old_id)
        # the old incarnation's waiting requests are fenced at once
        _resolve(m.join_waiters, JoinResult(E.FENCED_INSTANCE_ID, member_id=old_id))
        _resolve(m.sync_waiters, (E.FENCED_INSTANCE_ID, b""))
        m.member_id = new_id
        g.members[new_id] = m
        g.static[instance_id] = new_id
        if g.leader == old_id:
            g.leader = new_id
        if old_id in g.pending_sync:
            g.pending_sync.discard(old_id)
            g.pending_sync.add(new_id)
        m.is_new = False
        m.heartbeat_deadline_ms = self.now_ms() + session_ms
        log.info("group %s: static member %s replaces %s in state %s", g.group_id, new_id, old_id, g.state)
        if g.state == STABLE:
            m.protocols, m.session_timeout_ms, m.rebalance_timeout_ms = list(protocols), session_ms, rebalance_ms
            if g.select_protocol() == g.protocol:
                # no rebalance: the member gets the current generation and, with SyncGroup, its
                # old assignment. It is told the old leader id, so a restarted leader does not
                # compute an assignment that a Stable group would not hand out. Kafka records the
                # new member id first: after a restart the group knows this incarnation.
                if not self._persist(g):
                    return JoinResult(E.NOT_COORDINATOR, member_id=new_id)
                return self._join_result(g, m, leader=old_leader or "")
            waiter = self._waiter(m.join_waiters)
            self._maybe_prepare_rebalance(g, f"static member {new_id} changed its protocols")
        else:
            waiter = self._update_member(m, protocols, session_ms, rebalance_ms)
            if g.state == COMPLETING:
                # the leader may have been given the old member id: assign again
                self._prepare_rebalance(g, f"static member {new_id} rejoined during the sync")
        self._try_complete_join(g)
        return await waiter

    # ------------------------------------------------------------------ rebalance
    def _maybe_prepare_rebalance(self, g: Group, reason: str) -> None:
        if g.state in (STABLE, COMPLETING, EMPTY):
            self._prepare_rebalance(g, reason)

    def _prepare_rebalance(self, g: Group, reason: str) -> None:
        if g.state == COMPLETING:
            for m in g.members.values():
                m.assignment = b""
                _resolve(m.sync_waiters, (E.REBALANCE_IN_PROGRESS, b""))
        self._cancel(g, "sync_timer")
        g.pending_sync.clear()
        self._cancel(g, "join_timer")
        if g.state == EMPTY:
            delay = self.initial_delay_ms
            g.initial_join = True
            g.initial_remaining_ms = max(g.rebalance_timeout_ms() - delay, 0)
        else:
            delay = g.rebalance_timeout_ms()
            g.initial_join = False
        log.info("group %s: preparing to rebalance from %s, generation %d (%s)", g.group_id, g.state,
                 g.generation, reason)
        self._set_state(g, PREPARING)
        g.join_timer = asyncio.get_running_loop().call_later(delay / 1000, self._join_timer_fired, g, delay)
        self._try_complete_join(g)

    def _join_timer_fired(self, g: Group, delay_ms: int) -> None:
        g.join_timer = None
        if g.state != PREPARING:
            return
        if g.initial_join and g.new_member_added and g.initial_remaining_ms > 0:
            g.new_member_added = False
            next_delay = min(self.initial_delay_ms, g.initial_remaining_ms)
            g.initial_remaining_ms = max(g.initial_remaining_ms - delay_ms, 0)
            g.join_timer = asyncio.get_running_loop().call_later(
                next_delay / 1000, self._join_timer_fired, g, next_delay)
            return
        g.initial_join = False
        self._complete_join(g)

    def _try_complete_join(self, g: Group) -> None:
        if g.state == PREPARING and not g.initial_join and g.all_joined():
            self._cancel(g, "join_timer")
            self._complete_join(g)

    def _complete_join(self, g: Group) -> None:
        for m in [m for m in g.members.values() if not m.join_waiters and m.instance_id is None]:
            self._drop(g, m, "did not rejoin within the rebalance timeout")
        if g.members and not any(m.join_waiters for m in g.members.values()):
            # only static members that have not rejoined: wait for them or their session timeout
            log.warning("group %s: no member rejoined; waiting another rebalance timeout", g.group_id)
            delay = g.rebalance_timeout_ms()
            g.join_timer = asyncio.get_running_loop().call_later(delay / 1000, self._join_timer_fired, g, delay)
            return
        if g.leader not in g.members or not g.members[g.leader].join_waiters:
            g.leader = next((mid for mid, m in g.members.items() if m.join_waiters), None)
        g.generation += 1
        if not g.members:
            g.protocol, g.leader, g.subscribed = None, None, None
            self._set_state(g, EMPTY)
            log.info("group %s: generation %d is empty", g.group_id, g.generation)
            self._persist(g)
            return
        g.protocol = g.select_protocol()
        g.subscribed = _subscribed_topics(g)
        self._set_state(g, COMPLETING)
        now = self.now_ms()
        for m in g.members.values():
            m.is_new = False
            m.heartbeat_deadline_ms = now + m.session_timeout_ms
            _resolve(m.join_waiters, self._join_result(g, m))
            g.pending_sync.add(m.member_id)
        delay = g.rebalance_timeout_ms()
        g.sync_timer = asyncio.get_running_loop().call_later(
            delay / 1000, self._sync_timer_fired, g, g.generation)
        log.info("group %s: generation %d with %d members, protocol %s, leader %s", g.group_id,
                 g.generation, len(g.members), g.protocol, g.leader)

    def _sync_timer_fired(self, g: Group, generation: int) -> None:
        g.sync_timer = None
        if generation != g.generation or g.state not in (COMPLETING, STABLE) or not g.pending_sync:
            return
        for mid in list(g.pending_sync):
            if mid in g.members:
                self._drop(g, g.members[mid], "did not send SyncGroup within the rebalance timeout")
        self._prepare_rebalance(g, "members missed the SyncGroup deadline")

    # ------------------------------------------------------------------ SyncGroup
    async def sync(self, group_id: str, generation: int, member_id: str, assignments: dict[str, bytes],
                   instance_id: str | None = None, protocol_type: str | None = None,
                   protocol_name: str | None = None) -> tuple[int, str | None, str | None, bytes]:
        if not group_id:
            return E.INVALID_GROUP_ID, None, None, b""
        g = self.group(group_id)
        if g is None:
            return E.UNKNOWN_MEMBER_ID, None, None, b""
        error = self._validate_member(g, member_id, instance_id)
        if not error and generation != g.generation:
            error = E.ILLEGAL_GENERATION
        if not error and ((protocol_type is not None and protocol_type != g.protocol_type)
                          or (protocol_name is not None and protocol_name != g.protocol)):
            error = E.INCONSISTENT_GROUP_PROTOCOL
        if not error and g.state == EMPTY:
            error = E.UNKNOWN_MEMBER_ID
        if not error and g.state == PREPARING:
            error = E.REBALANCE_IN_PROGRESS
        if error:
            return error, None, None, b""
        m = g.members[member_id]
        self._synced(g, member_id)
        if g.state == STABLE:
            m.heartbeat_deadline_ms = self.now_ms() + m.session_timeout_ms
            return E.NONE, g.protocol_type, g.protocol, m.assignment
        waiter = self._waiter(m.sync_waiters)
        if member_id == g.leader:
            for mid, member in g.members.items():
                member.assignment = assignments.get(mid, b"")
            if not self._persist(g):
                # as Kafka: every member is told, and the group rebalances
                for member in g.members.values():
                    _resolve(member.sync_waiters, (E.NOT_COORDINATOR, b""))
                self._prepare_rebalance(g, "its assignment could not be stored")
            else:
                now = self.now_ms()
                for member in g.members.values():
                    if member.sync_waiters:
                        member.heartbeat_deadline_ms = now + member.session_timeout_ms
                    _resolve(member.sync_waiters, (E.NONE, member.assignment))
                self._set_state(g, STABLE)
                log.info("group %s: generation %d is stable", g.group_id, g.generation)
        error, assignment = await waiter
        if error:
            return error, None, None, b""
        return E.NONE, g.protocol_type, g.protocol, assignment

    def _synced(self, g: Group, member_id: str) -> None:
        g.pending_sync.discard(member_id)
        if not g.pending_sync:
            self._cancel(g, "sync_timer")

    # ------------------------------------------------------------------ Heartbeat / LeaveGroup
    def heartbeat(self, group_id: str, generation: int, member_id: str,
                  instance_id: str | None = None) -> int:
        if not group_id:
            return E.INVALID_GROUP_ID
        g = self.group(group_id)
        if g is None:
            return E.UNKNOWN_MEMBER_ID
        error = self._validate_member(g, member_id, instance_id)
        if error:
            return error
        if generation != g.generation:
            return E.ILLEGAL_GENERATION
        if g.state == EMPTY:
            return E.UNKNOWN_MEMBER_ID
        m = g.members[member_id]
        m.heartbeat_deadline_ms = self.now_ms() + m.session_timeout_ms
        return E.REBALANCE_IN_PROGRESS if g.state == PREPARING else E.NONE

    def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> list[int]:
        """One error per (member id, group instance id); an empty member id names a static member
        by its instance id (an administrator removing it)."""
        g = self.group(group_id)
        if g is None:
            return [E.UNKNOWN_MEMBER_ID] * len(members)
        out: list[int] = []
        for member_id, instance_id in members:
            if not member_id:
                current = g.static.get(instance_id) if instance_id is not None else None
                if current is None:
                    out.append(E.UNKNOWN_MEMBER_ID)
                    continue
                member_id = current
            elif member_id in g.pending:
                del g.pending[member_id]
                self._try_complete_join(g)
                out.append(E.NONE)
                continue
            else:
                error = self._validate_member(g, member_id, instance_id)
                if error:
                    out.append(error)
                    continue
            self._remove(g, g.members[member_id], "left the group")
            out.append(E.NONE)
        return out

    def _remove(self, g: Group, m: Member, why: str) -> None:
        """Kafka's removeMemberAndUpdateGroup."""
        self._drop(g, m, why)
        if g.state in (STABLE, COMPLETING):
            self._prepare_rebalance(g, f"member {m.member_id} {why}")
        elif g.state == PREPARING:
            self._try_complete_join(g)

    def _drop(self, g: Group, m: Member, why: str) -> None:
        _resolve(m.join_waiters, JoinResult(E.UNKNOWN_MEMBER_ID, member_id=m.member_id))
        _resolve(m.sync_waiters, (E.UNKNOWN_MEMBER_ID, b""))
        del g.members[m.member_id]
        if m.instance_id is not None and g.static.get(m.instance_id) == m.member_id:
            del g.static[m.instance_id]
        g.pending_sync.discard(m.member_id)
        if g.leader == m.member_id:
            g.leader = next(iter(g.members), None)
        log.info("group %s: member %s %s", g.group_id, m.member_id, why)

    # ------------------------------------------------------------------ timers (the broker's tick)
    def expire(self) -> None:
        """Which groups are this broker's, sessions, pending member ids, and (every
        `offsets.retention.check.interval.ms`) offsets and idle producers' offsets state."""
        self.reconcile()
        now = self.now_ms()
        for g in list(self.groups.values()):
            self._expire_sessions(g, now)
        self.consumer.expire()
        if now >= self._next_retention_ms:
            self._next_retention_ms = now + self.retention_interval_ms
            self.expire_offsets(now)
            self.store.expire_producers(now, self.producer_expiration_ms)

    def _expire_sessions(self, g: Group, now: int) -> None:
        for mid, deadline in list(g.pending.items()):
            if now > deadline:
                del g.pending[mid]
                log.info("group %s: pending member %s did not rejoin in its session timeout", g.group_id, mid)
                self._try_complete_join(g)
        for m in list(g.members.values()):
            if m.member_id in g.members and not m.alive(now):
                self._remove(g, m, f"missed its session timeout ({m.session_timeout_ms} ms)")

    def expire_offsets(self, now: int) -> int:
        """Kafka's GroupMetadata.removeExpiredOffsets for every group this broker coordinates; a
        group left empty without offsets is forgotten, its record too. An offset with a
        transactional commit pending for its partition stays (Kafka's rule). Returns how many
        offsets expired."""
        removed = 0
        pending: dict[str, set[tuple[str, int]]] = {}
        for groups in self.store.pending().values():
            for group_id, offsets in groups.items():
                pending.setdefault(group_id, set()).update(offsets)
        for group_id, g in list(self.groups.items()):
            held = pending.get(group_id, set())
            offsets = {k: c for k, c in self.store.get(group_id).items() if k not in held}
            ptype = g.protocol_type
            if ptype is not None and g.state == EMPTY:
                gone = [k for k, c in offsets.items() if self._expired(c, g.state_since_ms, now)]
            elif ptype == CONSUMER_PROTOCOL and g.state == STABLE and g.subscribed is not None:
                gone = [k for k, c in offsets.items()
                        if k[0] not in g.subscribed and self._expired(c, self._committed_at(c), now)]
            elif ptype is None:
                gone = [k for k, c in offsets.items() if self._expired(c, self._committed_at(c), now)]
            else:
                gone = []
            if gone:
                log.info("group %s: %d committed offsets expired (offsets.retention.minutes)",
                         group_id, len(gone))
                self.store.remove(group_id, gone)
                removed += len(gone)
            if (g.state == EMPTY and not g.members and not g.pending and not held
                    and not self.store.get(group_id)):
                del self.groups[group_id]
                self.store.remove(group_id)
        for group_id, cg in list(self.consumer.groups.items()):
            # Kafka's ConsumerGroup: by commit time, for topics no member subscribes to
            held = pending.get(group_id, set())
            subscribed = cg.subscribed_names()
            gone = [k for k, c in self.store.get(group_id).items()
                    if k not in held and k[0] not in subscribed and self._expired(c, self._committed_at(c), now)]
            if gone:
                log.info("group %s: %d committed offsets expired (offsets.retention.minutes)", group_id, len(gone))
                self.store.remove(group_id, gone)
                removed += len(gone)
            if not cg.members and not held and not self.store.get(group_id):
                self.consumer.forget(group_id)
                self.store.remove(group_id)
        return removed

    def _expired(self, c: Committed, base_ms: int, now: int) -> bool:
        if c.expire_timestamp >= 0:  # OffsetCommit v2-v4 asked for its own retention
            return now >= c.expire_timestamp
        return now - base_ms >= self.retention_ms

    def _committed_at(self, c: Committed) -> int:
        return c.commit_timestamp if c.commit_timestamp >= 0 else self.started_ms

    # ------------------------------------------------------------------ offsets
    def commit(self, group_id: str, generation: int, member_id: str,
               offsets: dict[tuple[str, int], Committed], instance_id: str | None = None,
               retention_ms: int = -1, api_version: int = 8) -> int:
        """`retention_ms`: OffsetCommit v2-v4's retention time (-1: `offsets.retention.minutes`);
        `generation`: a consumer group member's epoch (v9+)."""
        cg = self.consumer.group(group_id)
        if cg is not None:
            error = self.consumer.validate_commit(cg, member_id, generation, api_version, offsets)
            return error or self._store_commit(group_id, offsets, retention_ms)
        g = self.group(group_id)
        if g is None:
            if generation >= 0:  # a member of a generation this coordinator does not know
                return E.GROUP_ID_NOT_FOUND if api_version >= 9 else E.ILLEGAL_GENERATION
            g = self._new_group(group_id)  # offsets only: a consumer using assign()
        error = self._validate_commit(g, generation, member_id, instance_id)
        if error:
            return error
        if g.state == COMPLETING:
            # the member already has the new generation's JoinGroup answer, not yet its assignment
            return E.REBALANCE_IN_PROGRESS
        if g.state in (STABLE, PREPARING):
            m = g.members[member_id]
            m.heartbeat_deadline_ms = self.now_ms() + m.session_timeout_ms
        return self._store_commit(group_id, offsets, retention_ms)

    def _store_commit(self, group_id: str, offsets: dict[tuple[str, int], Committed], retention_ms: int) -> int:
        now = self.now_ms()
        expire = now + retention_ms if retention_ms >= 0 else -1
        try:
            self.store.commit(group_id, {k: c._replace(commit_timestamp=now, expire_timestamp=expire)
                                         for k, c in offsets.items()})
        except OSError as e:
            return _storage_failed(group_id, "offset commit", e)
        return E.NONE

    def _validate_commit(self, g: Group, generation: int, member_id: str, instance_id: str | None) -> int:
        """Kafka's validateOffsetCommit."""
        if generation < 0 and g.state == EMPTY:
            return E.NONE  # the admin client, or a consumer without group management
        if generation >= 0 or member_id or instance_id is not None:
            error = self._validate_member(g, member_id, instance_id)
            if error:
                return error
            return E.ILLEGAL_GENERATION if generation != g.generation else E.NONE
        return E.UNKNOWN_MEMBER_ID  # only members commit to a group that has members

    # ------------------------------------------------------------ transactional offsets
    def txn_commit(self, group_id: str, producer_id: int, producer_epoch: int, generation: int, member_id: str,
                   instance_id: str | None, offsets: dict[tuple[str, int], Committed]) -> int:
        """TxnOffsetCommit (KIP-447): kept pending, durable, until the transaction's marker; an
        epoch older than the group's offsets partition knows of the producer is
        INVALID_PRODUCER_EPOCH."""
        cg = self.consumer.group(group_id)
        if generation >= 0 or member_id or instance_id is not None:
            # Member data (v3+): validated as a commit is; without it (v0-2, aiokafka, kafkajs)
            # Kafka skips validation for transactional commits, and so no zombie fencing.
            if cg is not None:  # a member epoch (a stale one is answered ILLEGAL_GENERATION)
                error = self.consumer.validate_commit(cg, member_id, generation, None, offsets)
                if error:
                    return error
                return self._store_txn_commit(group_id, producer_id, producer_epoch, offsets)
            g = self.group(group_id)
            if g is None:
                return E.ILLEGAL_GENERATION if generation >= 0 else E.UNKNOWN_MEMBER_ID
            error = self._validate_commit(g, generation, member_id, instance_id)
            if error:
                return error
        return self._store_txn_commit(group_id, producer_id, producer_epoch, offsets)

    def _store_txn_commit(self, group_id: str, producer_id: int, producer_epoch: int,
                          offsets: dict[tuple[str, int], Committed]) -> int:
        now = self.now_ms()
        try:
            return self.store.add_pending(producer_id, producer_epoch, group_id,
                                          {k: c._replace(commit_timestamp=now) for k, c in offsets.items()}, now)
        except OSError as e:
            return _storage_failed(group_id, "transactional offset commit", e)

    def begin_txn_commit(self, producer_id: int) -> list[bool]:
        """A TxnOffsetCommit of `producer_id` is about to wait (for its verification): the token
        stays [True] unless a marker for the producer arrives meanwhile (Kafka's
        VerificationGuard): the commit then belongs to a transaction that already ended, and
        writing it would leave offsets pending for ever."""
        token = [True]
        self._txn_guards.setdefault(producer_id, []).append(token)
        return token

    def end_txn_commit(self, producer_id: int, token: list[bool]) -> None:
        tokens = self._txn_guards.get(producer_id, [])
        if token in tokens:
            tokens.remove(token)
        if not tokens:
            self._txn_guards.pop(producer_id, None)

    def complete_txn(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                     partition: int, transaction_version: int = 0) -> int:
        """The transaction's marker on `__consumer_offsets-<partition>`, checked as a data partition
        checks a marker (INVALID_PRODUCER_EPOCH, TRANSACTION_COORDINATOR_FENCED, a Transactions V2
        marker not above an open transaction's epoch); taken, COMMIT makes the producer's pending
        offsets of the partition's groups visible and ABORT drops them. Repeating it is harmless
        (nothing is left pending). NOT_LEADER_OR_FOLLOWER when another broker owns the partition
        now (its lease: the marker writer asks the leader again)."""
        try:
            code, why = self.store.apply_marker(producer_id, producer_epoch, coordinator_epoch, commit, partition,
                                                self.now_ms(), transaction_version)
        except (Fenced, Busy) as e:
            log.warning("%s-%d: marker of producer %d not applied: %s", CONSUMER_OFFSETS_TOPIC, partition,
                        producer_id, e)
            return E.NOT_LEADER_OR_FOLLOWER
        except OSError as e:  # retried by the marker writer; the producer's file is written last
            log.error("%s-%d: marker of producer %d not applied: %s", CONSUMER_OFFSETS_TOPIC, partition, producer_id, e)
            return E.KAFKA_STORAGE_ERROR
        if code:
            log.warning("%s marker of producer %d (epoch %d) refused on %s-%d: %s", "COMMIT" if commit else "ABORT",
                        producer_id, producer_epoch, CONSUMER_OFFSETS_TOPIC, partition, why)
            return code
        for token in self._txn_guards.get(producer_id, ()):
            token[0] = False
        return E.NONE

    def unstable(self, group_id: str) -> set[tuple[str, int]]:
        """Partitions of the group with transactional offsets still pending (OffsetFetch v7
        require_stable answers UNSTABLE_OFFSET_COMMIT for them)."""
        out: set[tuple[str, int]] = set()
        for groups in self.store.pending().values():
            out.update(groups.get(group_id, ()))
        return out

    def committed(self, group_id: str) -> dict[tuple[str, int], Committed]:
        return self.store.get(group_id)

    def delete_group(self, group_id: str) -> int:
        """DeleteGroups: only an empty group goes, with its offsets. Sessions that ran out are
        expired first, as Kafka's exact timers would have (the tick only runs every second)."""
        cg = self.consumer.group(group_id)
        if cg is not None:
            if cg.members:
                return E.NON_EMPTY_GROUP
            self.consumer.forget(group_id)
            self.store.remove(group_id)
            log.info("group %s deleted", group_id)
            return E.NONE
        g = self.group(group_id)
        if g is None:
            return E.GROUP_ID_NOT_FOUND
        self._expire_sessions(g, self.now_ms())
        if g.state != EMPTY or g.members:
            return E.NON_EMPTY_GROUP
        self.groups.pop(group_id, None)
        self.store.remove(group_id)
        log.info("group %s deleted", group_id)
        return E.NONE

    def delete_offsets(self, group_id: str, partitions: list[tuple[str, int]]
                       ) -> tuple[int, dict[tuple[str, int], int]]:
        """OffsetDelete (Kafka's GroupCoordinator.handleDeleteOffsets): (group error, error per
        partition). An empty group loses any of its offsets; a consumer group with members only
        those of topics none of them subscribes to (GROUP_SUBSCRIBED_TO_TOPIC for the others,
        and for all when the subscriptions are unknown, as Kafka's isSubscribedToTopic is false
        then); a group of another protocol with members refuses (NON_EMPTY_GROUP)."""
        cg = self.consumer.group(group_id)
        g = self.group(group_id) if cg is None else None
        if g is not None:
            self._expire_sessions(g, self.now_ms())
        subscribed: frozenset[str]
        if cg is not None:  # Kafka's ConsumerGroup: only topics no member subscribes to
            subscribed = cg.subscribed_names()
        elif g is None:
            return E.GROUP_ID_NOT_FOUND, {}
        elif g.state == EMPTY:
            subscribed = frozenset()
        elif g.protocol_type == CONSUMER_PROTOCOL:
            subscribed = g.subscribed or frozenset()
        else:
            return E.NON_EMPTY_GROUP, {}
        deletable = [tp for tp in partitions if tp[0] not in subscribed]
        errors: dict[tuple[str, int], int] = {tp: E.GROUP_SUBSCRIBED_TO_TOPIC for tp in partitions
                                              if tp[0] in subscribed}
        committed = self.store.get(group_id)
        gone = [tp for tp in deletable if tp in committed]
        if gone:
            self.store.remove(group_id, gone)
            log.info("group %s: committed offsets of %d partitions deleted (OffsetDelete)", group_id, len(gone))
        errors.update({tp: E.NONE for tp in deletable})
        return E.NONE, errors

    def delete_topic(self, topic: str) -> None:
        """A deleted topic's committed offsets go with it (Kafka's handleDeletedPartitions)."""
        self.store.delete_topic(topic)

    def listing(self) -> list[tuple[str, str, str, str]]:
        """(group id, protocol type, state, group type) of every group this broker coordinates,
        including offset-only ones; the type is Kafka's `classic` or `consumer`."""
        self.reconcile()
        return sorted([(gid, g.protocol_type or "", g.state, "classic") for gid, g in self.groups.items()]
                      + [(gid, CONSUMER_PROTOCOL, state, "consumer") for gid, state in self.consumer.listing()])

    # ------------------------------------------------------------------ loading
    def group(self, group_id: str) -> Group | None:
        """The group, loaded from the store if this broker has not loaded it yet (after a start,
        or when it became the group's coordinator); None if nothing is known of it."""
        g = self.groups.get(group_id)
        if g is None:
            g = self._load(group_id)
        return g

    def reconcile(self) -> None:
        """Load the stored groups this broker coordinates, forget those it no longer does."""
        for group_id in [gid for gid in self.groups if not self.owns(gid)]:
            self._unload(self.groups.pop(group_id))
        for group_id in self.store.groups():
            if group_id not in self.groups and self.owns(group_id):
                self._load(group_id)
        self.consumer.reconcile()

    def _load(self, group_id: str) -> Group | None:
        """A group from its stored record (Kafka's GroupMetadata.loadGroup): Stable at the
        record's generation if it has members, each with a fresh session timer; else Empty."""
        if self.store.consumer(group_id) is not None:
            return None  # a consumer group's (`self.consumer`)
        meta, offsets = self.store.meta(group_id), self.store.get(group_id)
        if not offsets and meta == GroupMeta():
            return None
        now = self.now_ms()
        g = Group(group_id, generation=meta.generation, protocol_type=meta.protocol_type)
        for r in meta.members:
            g.members[r.member_id] = Member(
                r.member_id, r.instance_id, r.client_id, r.client_host, [(meta.protocol or "", r.subscription)],
                r.session_timeout_ms, r.rebalance_timeout_ms, now + r.session_timeout_ms, r.assignment, is_new=False)
            if r.instance_id is not None:
                g.static[r.instance_id] = r.member_id
        if g.members:
            g.state, g.state_since_ms = STABLE, now
            g.protocol, g.leader = meta.protocol, meta.leader
            g.subscribed = _subscribed_topics(g)
            log.info("group %s: loaded Stable at generation %d with %d members", group_id, g.generation,
                     len(g.members))
        elif meta.empty_since_ms is not None:
            g.state_since_ms = meta.empty_since_ms
        else:  # offsets only, from before empty-since was stored: as if it emptied at the start
            g.state_since_ms = self.started_ms
        self.groups[group_id] = g
        return g

    def unload_partition(self, partition: int) -> None:
        """This broker lost `__consumer_offsets-<partition>` (its lease): the groups of it held in
        memory are forgotten, classic and consumer groups alike (`broker.groups.ownership`)."""
        for group_id in [gid for gid in self.groups if self.store.partition_of(gid) == partition]:
            self._unload(self.groups.pop(group_id))
        self.consumer.unload_partition(partition)

    def _unload(self, g: Group) -> None:
        """Another broker coordinates the group now: its waiting members look for it there."""
        self._cancel(g, "join_timer")
        self._cancel(g, "sync_timer")
        for m in g.members.values():
            _resolve(m.join_waiters, JoinResult(E.NOT_COORDINATOR, member_id=m.member_id))
            _resolve(m.sync_waiters, (E.NOT_COORDINATOR, b""))
        log.info("group %s: no longer coordinated here", g.group_id)

    def _persist(self, g: Group) -> bool:
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
            return not _storage_failed(g.group_id, f"generation {g.generation}", e)
        return True

    def _release(self, group_id: str) -> bool:
        """A consumer group would take this group id: True if no classic group uses it (an empty
        one is forgotten; Kafka's maybeDeleteEmptyClassicGroup; its offsets stay)."""
        g = self.group(group_id)
        if g is None:
            return True
        if g.state != EMPTY or g.members or g.pending:
            return False
        self._cancel(g, "join_timer")
        self._cancel(g, "sync_timer")
        del self.groups[group_id]
        log.info("group %s: the empty classic group becomes a consumer group", group_id)
        return True

    # ------------------------------------------------------------------ helpers
    def _new_group(self, group_id: str) -> Group:
        g = self.groups[group_id] = Group(group_id, state_since_ms=self.now_ms())
        return g

    def _set_state(self, g: Group, state: str) -> None:
        g.state, g.state_since_ms = state, self.now_ms()

    @staticmethod
    def _cancel(g: Group, timer: str) -> None:
        handle = getattr(g, timer)
        if handle is not None:
            handle.cancel()
            setattr(g, timer, None)


def _storage_failed(group_id: str, what: str, e: OSError) -> int:
    """A group's file could not be written (the store keeps what it had): the client is told
    NOT_COORDINATOR, Kafka's answer to a storage error on `__consumer_offsets`, so it looks for
    the coordinator again and retries."""
    log.error("group %s: storing the %s failed: %s", group_id, what, e)
    return E.NOT_COORDINATOR


def _resolve(waiters: list[asyncio.Future], result) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_result(result)
    waiters.clear()


def _subscribed_topics(g: Group) -> frozenset[str] | None:
    """Topics of a consumer group from its members' subscriptions (ConsumerProtocolSubscription,
    whose v0 prefix every version shares); None when unknown."""
    if g.protocol_type != CONSUMER_PROTOCOL:
        return None
    topics: set[str] = set()
    try:
        for m in g.members.values():
            r = Reader(m.metadata(g.protocol))
            r.i16()
            for _ in range(r.array_len(False)):
                topics.add(r.string(False) or "")
    except (ValueError, IndexError, UnicodeDecodeError, EOFError):
        return None
    return frozenset(topics)

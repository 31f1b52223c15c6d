"""Classic consumer-group coordination (JoinGroup / SyncGroup / Heartbeat / LeaveGroup) and
committed offsets, so that `subscribe()` with a `group.id` works in unmodified clients.

The state machine is Kafka's: Empty -> PreparingRebalance (members rejoin; a new group waits
`group.initial.rebalance.delay.ms` for more joiners) -> CompletingRebalance (the leader computes the
assignment and sends it with SyncGroup) -> Stable. A member that stops heartbeating for its session
timeout is removed and the group rebalances. JoinGroup and a follower's SyncGroup wait for the
rebalance, as in Kafka; other connections are not held up.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field

from oncelog.protocol.errors import ErrorCode
from oncelog.storage.group_offsets import Committed, GroupOffsetStore

log = logging.getLogger(__name__)

EMPTY, PREPARING, COMPLETING, STABLE = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable"


@dataclass
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    protocols: list[tuple[str, bytes]]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    last_seen_ms: int
    assignment: bytes = b""
    join_waiter: asyncio.Future | None = None
    sync_waiter: asyncio.Future | None = None


@dataclass
class JoinResult:
    error: int
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    member_id: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)


@dataclass
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)  # ids handed out with MEMBER_ID_REQUIRED
    timer: asyncio.TimerHandle | None = None
    initial: bool = False


class GroupCoordinator:
    def __init__(self, store: GroupOffsetStore, now_ms, initial_rebalance_delay_ms: int = 100) -> None:
        self.store = store
        self.now_ms = now_ms
        self.initial_delay_ms = initial_rebalance_delay_ms
        self.groups: dict[str, Group] = {}

    # ------------------------------------------------------------------ membership
    async def join(self, group_id: str, member_id: str, instance_id: str | None, client_id: str,
                   client_host: str, protocol_type: str, protocols: list[tuple[str, bytes]],
                   session_timeout_ms: int, rebalance_timeout_ms: int, require_known_member: bool
                   ) -> JoinResult:
        if not group_id:
            return JoinResult(ErrorCode.INVALID_GROUP_ID)
        g = self.groups.setdefault(group_id, Group(group_id))
        if g.members and g.protocol_type != protocol_type:
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if g.members and not self._common_protocols(g, protocols):
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if require_known_member:  # KIP-394: the client rejoins with this id
                g.pending.add(member_id)
                return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id=member_id)
        elif member_id not in g.members and member_id not in g.pending:
            return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id)
        g.pending.discard(member_id)
        now = self.now_ms()
        m = g.members.get(member_id)
        if m is None:
            m = g.members[member_id] = Member(member_id, instance_id, client_id, client_host, protocols,
                                              session_timeout_ms, rebalance_timeout_ms, now)
        else:
            m.protocols, m.last_seen_ms = protocols, now
            m.session_timeout_ms, m.rebalance_timeout_ms = session_timeout_ms, rebalance_timeout_ms
        g.protocol_type = protocol_type
        if m.join_waiter is not None and not m.join_waiter.done():
            m.join_waiter.set_result(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id))
        m.join_waiter = asyncio.get_running_loop().create_future()
        waiter = m.join_waiter
        if g.state != PREPARING:
            self._prepare_rebalance(g, initial=g.state == EMPTY)
        self._maybe_complete_join(g)
        return await waiter

    def _common_protocols(self, g: Group, protocols) -> list[str]:
        names = [n for n, _ in protocols]
        return [n for n in names if all(n in {p for p, _ in m.protocols} for m in g.members.values())]

    def _prepare_rebalance(self, g: Group, initial: bool) -> None:
        for m in g.members.values():
            if m.sync_waiter is not None and not m.sync_waiter.done():
                m.sync_waiter.set_result((ErrorCode.REBALANCE_IN_PROGRESS, b""))
            m.sync_waiter = None
        g.state = PREPARING
        g.initial = initial
        delay = self.initial_delay_ms if initial else max(
            (m.rebalance_timeout_ms for m in g.members.values()), default=0)
        if g.timer is not None:
            g.timer.cancel()
        g.timer = asyncio.get_running_loop().call_later(delay / 1000, self._rebalance_deadline, g)

    def _rebalance_deadline(self, g: Group) -> None:
        g.timer = None
        g.initial = False
        # members that did not rejoin in time leave the group
        for mid in [mid for mid, m in g.members.items() if m.join_waiter is None]:
            log.info("group %s: member %s did not rejoin in time, removed", g.group_id, mid)
            del g.members[mid]
        self._maybe_complete_join(g)

    def _maybe_complete_join(self, g: Group) -> None:
        if g.state != PREPARING or g.initial:
            return
        if any(m.join_waiter is None for m in g.members.values()):
            return
        if g.timer is not None:
            g.timer.cancel()
            g.timer = None
        g.generation += 1
        if not g.members:
            g.state, g.protocol, g.leader = EMPTY, None, None
            return
        if g.leader not in g.members:
            g.leader = next(iter(g.members))
        leader = g.members[g.leader]
        g.protocol = next(n for n, _ in leader.protocols
                          if all(n in {p for p, _ in m.protocols} for m in g.members.values()))
        g.state = COMPLETING
        everyone = [(m.member_id, m.instance_id, dict(m.protocols)[g.protocol]) for m in g.members.values()]
        for m in g.members.values():
            result = JoinResult(ErrorCode.NONE, g.generation, g.protocol_type, g.protocol, g.leader,
                                m.member_id, everyone if m.member_id == g.leader else [])
            waiter, m.join_waiter = m.join_waiter, None
            m.last_seen_ms = self.now_ms()
            if waiter is not None and not waiter.done():
                waiter.set_result(result)
        log.info("group %s: generation %d with %d members, protocol %s", g.group_id, g.generation,
                 len(g.members), g.protocol)

    async def sync(self, group_id: str, generation: int, member_id: str,
                   assignments: dict[str, bytes]) -> tuple[int, str | None, str | None, bytes]:
        g = self.groups.get(group_id)
        if g is None or member_id not in g.members:
            return ErrorCode.UNKNOWN_MEMBER_ID, None, None, b""
        if generation != g.generation:
            return ErrorCode.ILLEGAL_GENERATION, None, None, b""
        if g.state == PREPARING:
            return ErrorCode.REBALANCE_IN_PROGRESS, None, None, b""
        m = g.members[member_id]
        m.last_seen_ms = self.now_ms()
        if g.state == STABLE:
            return ErrorCode.NONE, g.protocol_type, g.protocol, m.assignment
        if member_id == g.leader:
            for mid, member in g.members.items():
                member.assignment = assignments.get(mid, b"")
            g.state = STABLE
            for member in g.members.values():
                if member.sync_waiter is not None and not member.sync_waiter.done():
                    member.sync_waiter.set_result((ErrorCode.NONE, member.assignment))
                member.sync_waiter = None
            return ErrorCode.NONE, g.protocol_type, g.protocol, m.assignment
        m.sync_waiter = asyncio.get_running_loop().create_future()
        error, assignment = await m.sync_waiter
        return error, g.protocol_type, g.protocol, assignment

    def heartbeat(self, group_id: str, generation: int, member_id: str) -> int:
        g = self.groups.get(group_id)
        if g is None or member_id not in g.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        g.members[member_id].last_seen_ms = self.now_ms()
        if g.state == PREPARING:
            return ErrorCode.REBALANCE_IN_PROGRESS
        if generation != g.generation:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    def leave(self, group_id: str, member_id: str) -> int:
        g = self.groups.get(group_id)
        if g is None or member_id not in g.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        self._remove(g, member_id, "left the group")
        return ErrorCode.NONE

    def _remove(self, g: Group, member_id: str, why: str) -> None:
        m = g.members.pop(member_id)
        log.info("group %s: member %s %s", g.group_id, member_id, why)
        if m.join_waiter is not None and not m.join_waiter.done():
            m.join_waiter.set_result(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id))
        if not g.members:
            if g.timer is not None:
                g.timer.cancel()
                g.timer = None
            g.state, g.leader, g.protocol = EMPTY, None, None
            g.generation += 1
        elif g.state == PREPARING:
            self._maybe_complete_join(g)
        else:
            self._prepare_rebalance(g, initial=False)

    def expire(self) -> None:
        """Remove members whose session timed out (members waiting in JoinGroup are alive)."""
        now = self.now_ms()
        for g in list(self.groups.values()):
            for mid, m in list(g.members.items()):
                if m.join_waiter is None and now - m.last_seen_ms > m.session_timeout_ms:
                    self._remove(g, mid, f"missed its session timeout ({m.session_timeout_ms} ms)")

    # ------------------------------------------------------------------ offsets
    def commit(self, group_id: str, generation: int, member_id: str,
               offsets: dict[tuple[str, int], Committed]) -> int:
        g = self.groups.get(group_id)
        if g is not None and g.members:
            if member_id not in g.members:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if generation != g.generation:
                return ErrorCode.ILLEGAL_GENERATION
            if g.state == PREPARING:
                return ErrorCode.REBALANCE_IN_PROGRESS
            g.members[member_id].last_seen_ms = self.now_ms()
        elif generation >= 0 or member_id:
            # a commit from a member of a group that no longer has it
            return ErrorCode.ILLEGAL_GENERATION if generation >= 0 else ErrorCode.UNKNOWN_MEMBER_ID
        self.store.commit(group_id, offsets)
        return ErrorCode.NONE

    def committed(self, group_id: str) -> dict[tuple[str, int], Committed]:
        return self.store.get(group_id)

    def listing(self) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every known group, including offset-only ones."""
        out = {gid: (gid, g.protocol_type or "consumer", g.state) for gid, g in self.groups.items()}
        for gid in self.store.groups():
            out.setdefault(gid, (gid, "consumer", EMPTY))
        return sorted(out.values())

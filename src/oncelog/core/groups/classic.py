"""Classic consumer groups (JoinGroup / SyncGroup / Heartbeat / LeaveGroup) decided, pure: Kafka's
ClassicGroup and the classic half of its group coordinator (GroupCoordinator.scala,
GroupMetadata.scala), beside KIP-848's groups (`consumer_group`, `heartbeat`), so that unmodified
clients behave as they do on Kafka.

States (`PREDECESSORS` says which state may follow which; any other change is a bug and raises):
Empty -> PreparingRebalance (members rejoin; a group coming from Empty waits
`group.initial.rebalance.delay.ms`, extended while new members keep arriving, up to the rebalance
timeout) -> CompletingRebalance (the leader computes the assignment and hands it in with SyncGroup)
-> Stable. Rules clients depend on:
- A commit from a member of the current generation is accepted in Stable and PreparingRebalance;
  only CompletingRebalance answers REBALANCE_IN_PROGRESS (`commit_error`). A member learns of a
  rebalance from its heartbeat and commits what it consumed before it rejoins; refusing that
  commit makes the partitions' next owners read those records again.
- JoinGroup v4+ from a new dynamic member answers MEMBER_ID_REQUIRED with its id (KIP-394); the group
  waits for such pending members (or their session timeout) before completing a rebalance.
- Static members (`group.instance.id`, KIP-345): a restarted instance rejoining with an unknown member
  id takes over its old member; in Stable with an unchanged protocol this needs no rebalance. The old
  member id is fenced (FENCED_INSTANCE_ID), and static members that did not rejoin stay in the group
  until their session times out.
- A member leaves when it misses its session timeout (members waiting in JoinGroup or SyncGroup are
  alive; a new member's first join may wait 5 minutes), or does not rejoin within the rebalance
  timeout (dynamic members), or does not send SyncGroup within the rebalance timeout.
JoinGroup and a follower's SyncGroup wait for the rebalance, as in Kafka; other requests never do.

Nothing here waits, reads a clock or touches a file; whoever runs it (the broker's group
coordinator, `ClassicShell`) does:
- Time: every call is handed `now` (the broker's clock, in ms). Sessions and pending member ids are
  deadlines checked by `expire_sessions` on the broker's tick. The two rebalance deadlines (the end
  of the join phase, the SyncGroup deadline) are kept on the group (`join_deadline`,
  `sync_deadline`); the shell is told when one moves (`deadline_moved`), runs a timer for it and
  reports it with `join_deadline_passed` / `sync_deadline_passed`.
- Waiting: a JoinGroup or SyncGroup that waits for the rebalance brings a waiter, an opaque token
  of the shell's (a future), kept on its member until the rebalance decides its answer, which goes
  to `answer(waiter, result)`.
- Storing: the group's record (Kafka's GroupMetadata record) is written by `record(group)`, which
  answers whether it is durable: when the leader's SyncGroup hands out a generation's assignment
  (the members are answered once it is durable), when a join phase ends with the group Empty, and
  when a static member is replaced without a rebalance; never on an ordinary join or leave, so the
  record always describes a generation that was handed out whole. Loading it is `load(group id)`.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Protocol

from oncelog.core.groups.classic_group import (
    COMPLETING,
    EMPTY,
    NEW_MEMBER_JOIN_TIMEOUT_MS,
    PREPARING,
    STABLE,
    Deadline,
    Group,
    JoinResult,
    Member,
    SyncAnswer,
    SyncResult,
)
from oncelog.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

E = ErrorCode

# Kafka's ClassicGroupState.validPreviousStates (Dead aside: a group here is forgotten instead)
PREDECESSORS: dict[str, frozenset[str]] = {
    PREPARING: frozenset({EMPTY, STABLE, COMPLETING}),
    COMPLETING: frozenset({PREPARING}),
    STABLE: frozenset({COMPLETING}),
    EMPTY: frozenset({PREPARING}),
}

class IllegalTransition(AssertionError):
    """A state change that `PREDECESSORS` does not allow: a bug of the coordinator, never a client's."""


@dataclass(frozen=True)
class Waiting:
    """The request waits for the rebalance: its answer goes to the waiter it brought."""
    group: Group


class ClassicShell(Protocol):
    """What the state machine asks of whoever runs it."""

    def answer(self, waiter: object, result: JoinResult | SyncAnswer) -> None:
        """A waiting request's answer (once per waiter)."""
    def deadline_moved(self, g: Group) -> None:
        """`g.join_deadline` or `g.sync_deadline` was set or cleared: the timer follows."""
    def record(self, g: Group) -> bool:
        """Store the group's record; False if it is not durable (or no longer this broker's to write)."""
    def load(self, group_id: str) -> Group | None:
        """The group from its stored record, or None when nothing is stored of it."""


class ClassicGroups:
    """The classic groups one coordinator holds, by id."""

    def __init__(self, shell: ClassicShell, initial_rebalance_delay_ms: int = 100,
                 min_session_timeout_ms: int = 6000, max_session_timeout_ms: int = 1800000) -> None:
        self.shell = shell
        self.initial_delay_ms = initial_rebalance_delay_ms
        self.min_session_ms, self.max_session_ms = min_session_timeout_ms, max_session_timeout_ms
        self.groups: dict[str, Group] = {}

    def group(self, group_id: str) -> Group | None:
        """The group, loaded from its record if not held yet (after a start, or when this broker
        became its coordinator); None if nothing is known of it."""
        g = self.groups.get(group_id)
        if g is None:
            g = self.shell.load(group_id)
            if g is not None:
                self.groups[group_id] = g
        return g

    def new_group(self, group_id: str, now: int) -> Group:
        g = self.groups[group_id] = Group(group_id, state_since_ms=now)
        return g

    # ------------------------------------------------------------------ JoinGroup
    def join_error(self, group_id: str, session_timeout_ms: int) -> int:
        """What a JoinGroup is refused before its group is looked at."""
        if not group_id:
            return E.INVALID_GROUP_ID
        if not self.min_session_ms <= session_timeout_ms <= self.max_session_ms:
            return E.INVALID_SESSION_TIMEOUT
        return E.NONE

    def join(self, group_id: str, member_id: str, instance_id: str | None, client_id: str,
             client_host: str, protocol_type: str, protocols: list[tuple[str, bytes]],
             session_timeout_ms: int, rebalance_timeout_ms: int, require_known_member: bool,
             waiter: object, now: int) -> JoinResult | Waiting:
        error = self.join_error(group_id, session_timeout_ms)
        if error:
            return JoinResult(error, member_id=member_id)
        g = self.group(group_id)
        if g is None:
            if member_id:  # a member of a group this coordinator does not know
                return JoinResult(E.UNKNOWN_MEMBER_ID, member_id=member_id)
            g = self.new_group(group_id, now)
        if not g.supports(protocol_type, [name for name, _ in protocols]):
            return JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id)
        timeouts = (session_timeout_ms, rebalance_timeout_ms)
        if not member_id:
            new_id = f"{instance_id or client_id}-{uuid.uuid4()}"
            if instance_id is not None:
                if instance_id in g.static:
                    return self._replace_static_member(g, instance_id, new_id, protocols, *timeouts, waiter, now)
                self._add_member(g, new_id, instance_id, client_id, client_host, protocol_type, protocols,
                                 *timeouts, waiter, now)
            elif require_known_member:  # KIP-394: the client rejoins with this id
                g.pending[new_id] = now + session_timeout_ms
                return JoinResult(E.MEMBER_ID_REQUIRED, member_id=new_id)
            else:
                self._add_member(g, new_id, None, client_id, client_host, protocol_type, protocols, *timeouts,
                                 waiter, now)
        elif member_id in g.pending:
            del g.pending[member_id]
            if instance_id is not None:  # a static member is never sent MEMBER_ID_REQUIRED
                self._try_complete_join(g, now)
                return JoinResult(E.UNKNOWN_MEMBER_ID, member_id=member_id)
            self._add_member(g, member_id, None, client_id, client_host, protocol_type, protocols, *timeouts,
                             waiter, now)
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
            self._update_member(m, protocols, *timeouts, waiter)
            self._maybe_prepare_rebalance(g, f"member {member_id} rejoined", now)
        self._try_complete_join(g, now)
        return Waiting(g)

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
                    client_host: str, protocol_type: str, protocols: list[tuple[str, bytes]], session_ms: int,
                    rebalance_ms: int, waiter: object, now: int) -> None:
        if not g.members:
            g.protocol_type = protocol_type
        m = Member(member_id, instance_id, client_id, client_host, list(protocols), session_ms,
                   rebalance_ms, now + NEW_MEMBER_JOIN_TIMEOUT_MS)
        if g.state == PREPARING and g.generation == 0:
            g.new_member_added = True  # lets the initial delay wait a little longer
        g.members[member_id] = m
        if instance_id is not None:
            g.static[instance_id] = member_id
        if g.leader is None:
            g.leader = member_id
        m.join_waiters.append(waiter)
        log.info("group %s: member %s (instance %s) joins in state %s", g.group_id, member_id,
                 instance_id, g.state)
        self._maybe_prepare_rebalance(g, f"new member {member_id}", now)

    @staticmethod
    def _update_member(m: Member, protocols: list[tuple[str, bytes]], session_ms: int, rebalance_ms: int,
                       waiter: object) -> None:
        m.protocols = list(protocols)
        m.session_timeout_ms, m.rebalance_timeout_ms = session_ms, rebalance_ms
        # a member's request retried on another connection gets the same answer as the first
        m.join_waiters.append(waiter)

    def _replace_static_member(self, g: Group, instance_id: str, new_id: str, protocols: list[tuple[str, bytes]],
                               session_ms: int, rebalance_ms: int, waiter: object, now: int) -> JoinResult | Waiting:
        old_id = g.static[instance_id]
        old_leader = g.leader
        m = g.members.pop(old_id)
        # the old incarnation's waiting requests are fenced at once
        self._answer(m.join_waiters, JoinResult(E.FENCED_INSTANCE_ID, member_id=old_id))
        self._answer(m.sync_waiters, (E.FENCED_INSTANCE_ID, b""))
        m.member_id = new_id
        g.members[new_id] = m
        g.static[instance_id] = new_id
        if g.leader == old_id:
            g.leader = new_id
        if old_id in g.pending_sync:
            g.pending_sync.discard(old_id)
            g.pending_sync.add(new_id)
        m.is_new = False
        m.heartbeat_deadline_ms = now + session_ms
        log.info("group %s: static member %s replaces %s in state %s", g.group_id, new_id, old_id, g.state)
        if g.state == STABLE:
            m.protocols, m.session_timeout_ms, m.rebalance_timeout_ms = list(protocols), session_ms, rebalance_ms
            if g.select_protocol() == g.protocol:
                # no rebalance: the member gets the current generation and, with SyncGroup, its
                # old assignment. It is told the old leader id, so a restarted leader does not
                # compute an assignment that a Stable group would not hand out. Kafka records the
                # new member id first: after a restart the group knows this incarnation.
                if not self.shell.record(g):
                    return JoinResult(E.NOT_COORDINATOR, member_id=new_id)
                return self._join_result(g, m, leader=old_leader or "")
            m.join_waiters.append(waiter)
            self._maybe_prepare_rebalance(g, f"static member {new_id} changed its protocols", now)
        else:
            self._update_member(m, protocols, session_ms, rebalance_ms, waiter)
            if g.state == COMPLETING:
                # the leader may have been given the old member id: assign again
                self._prepare_rebalance(g, f"static member {new_id} rejoined during the sync", now)
        self._try_complete_join(g, now)
        return Waiting(g)

    # ------------------------------------------------------------------ rebalance
    def _maybe_prepare_rebalance(self, g: Group, reason: str, now: int) -> None:
        if g.state in (STABLE, COMPLETING, EMPTY):
            self._prepare_rebalance(g, reason, now)

    def _prepare_rebalance(self, g: Group, reason: str, now: int) -> None:
        if g.state == COMPLETING:
            for m in g.members.values():
                m.assignment = b""
                self._answer(m.sync_waiters, (E.REBALANCE_IN_PROGRESS, b""))
        self._set_sync_deadline(g, None)
        g.pending_sync.clear()
        if g.state == EMPTY:
            delay = self.initial_delay_ms
            g.initial_join = True
            g.initial_remaining_ms = max(g.rebalance_timeout_ms() - delay, 0)
        else:
            delay = g.rebalance_timeout_ms()
            g.initial_join = False
        log.info("group %s: preparing to rebalance from %s, generation %d (%s)", g.group_id, g.state,
                 g.generation, reason)
        self._set_state(g, PREPARING, now)
        self._set_join_deadline(g, Deadline(now + delay, delay))
        self._try_complete_join(g, now)

    def join_deadline_passed(self, g: Group, deadline: Deadline, now: int) -> None:
        """The join phase's deadline passed: the rebalance completes with the members that
        rejoined, unless the initial delay waits on for members still arriving."""
        if g.join_deadline is not deadline:
            return  # moved or cleared since
        self._set_join_deadline(g, None)
        if g.state != PREPARING:
            return
        if g.initial_join and g.new_member_added and g.initial_remaining_ms > 0:
            g.new_member_added = False
            next_delay = min(self.initial_delay_ms, g.initial_remaining_ms)
            g.initial_remaining_ms = max(g.initial_remaining_ms - deadline.after_ms, 0)
            self._set_join_deadline(g, Deadline(now + next_delay, next_delay))
            return
        g.initial_join = False
        self._complete_join(g, now)

    def _try_complete_join(self, g: Group, now: int) -> None:
        if g.state == PREPARING and not g.initial_join and g.all_joined():
            self._set_join_deadline(g, None)
            self._complete_join(g, now)

    def _complete_join(self, g: Group, now: int) -> None:
        for m in [m for m in g.members.values() if not m.join_waiters and m.instance_id is None]:
            self._drop(g, m, "did not rejoin within the rebalance timeout")
        if g.members and not any(m.join_waiters for m in g.members.values()):
            # only static members that have not rejoined: wait for them or their session timeout
            log.warning("group %s: no member rejoined; waiting another rebalance timeout", g.group_id)
            delay = g.rebalance_timeout_ms()
            self._set_join_deadline(g, Deadline(now + delay, delay))
            return
        if g.leader not in g.members or not g.members[g.leader].join_waiters:
            g.leader = next((mid for mid, m in g.members.items() if m.join_waiters), None)
        g.generation += 1
        if not g.members:
            g.protocol, g.leader, g.subscribed = None, None, None
            self._set_state(g, EMPTY, now)
            log.info("group %s: generation %d is empty", g.group_id, g.generation)
            self.shell.record(g)
            return
        g.protocol = g.select_protocol()
        g.subscribed = g.subscribed_topics()
        self._set_state(g, COMPLETING, now)
        for m in g.members.values():
            m.is_new = False
            m.heartbeat_deadline_ms = now + m.session_timeout_ms
            self._answer(m.join_waiters, self._join_result(g, m))
            g.pending_sync.add(m.member_id)
        delay = g.rebalance_timeout_ms()
        self._set_sync_deadline(g, Deadline(now + delay, delay, g.generation))
        log.info("group %s: generation %d with %d members, protocol %s, leader %s", g.group_id,
                 g.generation, len(g.members), g.protocol, g.leader)

    def sync_deadline_passed(self, g: Group, deadline: Deadline, now: int) -> None:
        """The SyncGroup deadline passed: members that did not send theirs leave, and the group
        rebalances."""
        if g.sync_deadline is not deadline:
            return  # moved or cleared since
        self._set_sync_deadline(g, None)
        if deadline.generation != g.generation or g.state not in (COMPLETING, STABLE) or not g.pending_sync:
            return
        for mid in list(g.pending_sync):
            if mid in g.members:
                self._drop(g, g.members[mid], "did not send SyncGroup within the rebalance timeout")
        self._prepare_rebalance(g, "members missed the SyncGroup deadline", now)

    # ------------------------------------------------------------------ SyncGroup
    def sync(self, group_id: str, generation: int, member_id: str, assignments: dict[str, bytes],
             instance_id: str | None, protocol_type: str | None, protocol_name: str | None,
             waiter: object, now: int) -> SyncResult | Waiting:
        """The answer now, or Waiting: a follower's answer, (error, assignment), goes to `waiter`
        once the leader's SyncGroup hands out the generation (or the rebalance starts again)."""
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
            m.heartbeat_deadline_ms = now + m.session_timeout_ms
            return E.NONE, g.protocol_type, g.protocol, m.assignment
        m.sync_waiters.append(waiter)
        if member_id == g.leader:
            for mid, member in g.members.items():
                member.assignment = assignments.get(mid, b"")
            if not self.shell.record(g):
                # as Kafka: every member is told, and the group rebalances
                for member in g.members.values():
                    self._answer(member.sync_waiters, (E.NOT_COORDINATOR, b""))
                self._prepare_rebalance(g, "its assignment could not be stored", now)
            else:
                for member in g.members.values():
                    if member.sync_waiters:
                        member.heartbeat_deadline_ms = now + member.session_timeout_ms
                    self._answer(member.sync_waiters, (E.NONE, member.assignment))
                self._set_state(g, STABLE, now)
                log.info("group %s: generation %d is stable", g.group_id, g.generation)
        return Waiting(g)

    def _synced(self, g: Group, member_id: str) -> None:
        g.pending_sync.discard(member_id)
        if not g.pending_sync:
            self._set_sync_deadline(g, None)

    # ------------------------------------------------------------------ Heartbeat / LeaveGroup
    def heartbeat(self, group_id: str, generation: int, member_id: str, instance_id: str | None, now: int) -> int:
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
        m.heartbeat_deadline_ms = now + m.session_timeout_ms
        return E.REBALANCE_IN_PROGRESS if g.state == PREPARING else E.NONE

    def leave(self, group_id: str, members: list[tuple[str, str | None]], now: int) -> list[int]:
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
                self._try_complete_join(g, now)
                out.append(E.NONE)
                continue
            else:
                error = self._validate_member(g, member_id, instance_id)
                if error:
                    out.append(error)
                    continue
            self._remove(g, g.members[member_id], "left the group", now)
            out.append(E.NONE)
        return out

    def _remove(self, g: Group, m: Member, why: str, now: int) -> None:
        """Kafka's removeMemberAndUpdateGroup."""
        self._drop(g, m, why)
        if g.state in (STABLE, COMPLETING):
            self._prepare_rebalance(g, f"member {m.member_id} {why}", now)
        elif g.state == PREPARING:
            self._try_complete_join(g, now)

    def _drop(self, g: Group, m: Member, why: str) -> None:
        self._answer(m.join_waiters, JoinResult(E.UNKNOWN_MEMBER_ID, member_id=m.member_id))
        self._answer(m.sync_waiters, (E.UNKNOWN_MEMBER_ID, b""))
        del g.members[m.member_id]
        if m.instance_id is not None and g.static.get(m.instance_id) == m.member_id:
            del g.static[m.instance_id]
        g.pending_sync.discard(m.member_id)
        if g.leader == m.member_id:
            g.leader = next(iter(g.members), None)
        log.info("group %s: member %s %s", g.group_id, m.member_id, why)

    # ------------------------------------------------------------------ sessions (the broker's tick)
    def expire_sessions(self, g: Group, now: int) -> None:
        for mid, deadline in list(g.pending.items()):
            if now > deadline:
                del g.pending[mid]
                log.info("group %s: pending member %s did not rejoin in its session timeout", g.group_id, mid)
                self._try_complete_join(g, now)
        for m in list(g.members.values()):
            if m.member_id in g.members and not m.alive(now):
                self._remove(g, m, f"missed its session timeout ({m.session_timeout_ms} ms)", now)

    # ------------------------------------------------------------------ offsets
    def commit_error(self, g: Group, generation: int, member_id: str, instance_id: str | None, now: int) -> int:
        """Whether a member may commit offsets to the group (Kafka's validateOffsetCommit, and
        REBALANCE_IN_PROGRESS in CompletingRebalance: the member already has the new generation's
        JoinGroup answer, not yet its assignment). A commit is a heartbeat too."""
        error = self.validate_commit(g, generation, member_id, instance_id)
        if error:
            return error
        if g.state == COMPLETING:
            return E.REBALANCE_IN_PROGRESS
        if g.state in (STABLE, PREPARING):
            m = g.members[member_id]
            m.heartbeat_deadline_ms = now + m.session_timeout_ms
        return E.NONE

    def validate_commit(self, g: Group, generation: int, member_id: str, instance_id: str | None) -> int:
        """Kafka's validateOffsetCommit."""
        if generation < 0 and g.state == EMPTY:
            return E.NONE  # the admin client, or a consumer without group management
        if generation >= 0 or member_id or instance_id is not None:
            error = self._validate_member(g, member_id, instance_id)
            if error:
                return error
            return E.ILLEGAL_GENERATION if generation != g.generation else E.NONE
        return E.UNKNOWN_MEMBER_ID  # only members commit to a group that has members

    # ------------------------------------------------------------------ coordination moves
    def unload(self, group_id: str) -> None:
        """Another broker coordinates the group now: its waiting members look for it there."""
        g = self.groups.pop(group_id)
        self._set_join_deadline(g, None)
        self._set_sync_deadline(g, None)
        for m in g.members.values():
            self._answer(m.join_waiters, JoinResult(E.NOT_COORDINATOR, member_id=m.member_id))
            self._answer(m.sync_waiters, (E.NOT_COORDINATOR, b""))
        log.info("group %s: no longer coordinated here", g.group_id)

    def release(self, group_id: str) -> bool:
        """A consumer group would take this group id: True if no classic group uses it (an empty
        one is forgotten; Kafka's maybeDeleteEmptyClassicGroup)."""
        g = self.group(group_id)
        if g is None:
            return True
        if g.state != EMPTY or g.members or g.pending:
            return False
        self._set_join_deadline(g, None)
        self._set_sync_deadline(g, None)
        del self.groups[group_id]
        log.info("group %s: the empty classic group becomes a consumer group", group_id)
        return True

    def deletable(self, g: Group, now: int) -> bool:
        """DeleteGroups takes only an empty group. Sessions that ran out are expired first, as
        Kafka's exact timers would have (the tick only runs every second)."""
        self.expire_sessions(g, now)
        return g.state == EMPTY and not g.members

    # ------------------------------------------------------------------ helpers
    def _set_state(self, g: Group, state: str, now: int) -> None:
        if g.state not in PREDECESSORS[state]:
            raise IllegalTransition(f"group {g.group_id}: {g.state} -> {state}")
        g.state, g.state_since_ms = state, now

    def _set_join_deadline(self, g: Group, deadline: Deadline | None) -> None:
        if deadline is not None or g.join_deadline is not None:
            g.join_deadline = deadline
            self.shell.deadline_moved(g)

    def _set_sync_deadline(self, g: Group, deadline: Deadline | None) -> None:
        if deadline is not None or g.sync_deadline is not None:
            g.sync_deadline = deadline
            self.shell.deadline_moved(g)

    def _answer(self, waiters: list[object], result: JoinResult | SyncAnswer) -> None:
        for waiter in waiters:
            self.shell.answer(waiter, result)
        waiters.clear()

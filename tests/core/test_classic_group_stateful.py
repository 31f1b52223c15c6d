"""Hypothesis drives a classic consumer group (`core.groups.classic`) with members that join (dynamic,
KIP-394's two-step join, or static), rejoin, sync, heartbeat, leave and go silent, while the
rebalance deadlines pass and sessions run out, and the group's record sometimes cannot be stored.

The model is what every request is owed: each JoinGroup or SyncGroup that waits is answered exactly
once, or is still held by its member (never lost, never answered twice), and a member's JoinGroup
answer names the generation the group is at. Checked after every step, beside it:
- the state only ever moves to a state whose predecessors include it (the machine raises
  IllegalTransition otherwise, which fails the run), and the generation never goes back;
- the group is PreparingRebalance exactly while a join deadline is pending, and a sync deadline is
  pending only in CompletingRebalance or Stable;
- from CompletingRebalance on, nobody waits in JoinGroup; in Stable nobody waits in SyncGroup;
- a group with members has one of them as leader, and only members owe a SyncGroup.
"""
from __future__ import annotations

import struct

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from tests.tiers import examples

from oncelog.core.groups.classic import ClassicGroups, Waiting
from oncelog.core.groups.classic_group import COMPLETING, PREPARING, STABLE, Group, JoinResult, SyncAnswer
from oncelog.protocol.errors import ErrorCode as E

GROUP = "g"
SESSION_MS, REBALANCE_MS = 1000, 3000
INSTANCES = ["i0", "i1", "i2"]
# ConsumerProtocolSubscription v0 (topic "t", no user data), and metadata too short to read
SUBSCRIPTIONS = [struct.pack(">hih", 0, 1, 1) + b"t" + struct.pack(">i", -1), b"", b"\x00"]


class Shell:
    """The machine's runner as a test sees it: answers kept, records stored unless told to fail."""

    def __init__(self) -> None:
        self.answers: dict[int, JoinResult | SyncAnswer] = {}
        self.record_fails = False

    def answer(self, waiter: object, result: JoinResult | SyncAnswer) -> None:
        assert isinstance(waiter, int)
        assert waiter not in self.answers, f"waiter {waiter} answered twice"
        self.answers[waiter] = result

    def deadline_moved(self, g: Group) -> None:
        pass

    def record(self, g: Group) -> bool:
        return not self.record_fails

    def load(self, group_id: str) -> Group | None:
        return None


class ClassicGroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.shell = Shell()
        self.groups = ClassicGroups(self.shell, initial_rebalance_delay_ms=100, min_session_timeout_ms=10,
                                    max_session_timeout_ms=100_000)
        self.now = 1_000_000
        self.waiters = 0          # handed in so far, numbered from 0
        self.immediate: set[int] = set()   # requests answered by the call's return value
        self.generation = 0

    @property
    def g(self) -> Group | None:
        return self.groups.groups.get(GROUP)

    def _waiter(self) -> int:
        self.waiters += 1
        return self.waiters - 1

    def _join(self, member_id: str, instance_id: str | None, require_known: bool = False,
              protocols: tuple[str, ...] = ("range",), metadata: bytes = SUBSCRIPTIONS[0]) -> None:
        waiter = self._waiter()
        result = self.groups.join(GROUP, member_id, instance_id, "client", "/127.0.0.1", "consumer",
                                  [(p, metadata) for p in protocols], SESSION_MS, REBALANCE_MS, require_known,
                                  waiter, self.now)
        if not isinstance(result, Waiting):
            self.immediate.add(waiter)

    def _member(self, data: st.DataObject) -> tuple[str, str | None] | None:
        g = self.g
        if g is None or not g.members:
            return None
        # by position: member ids are random (uuid4), their order of arrival is not
        m = list(g.members.values())[data.draw(st.integers(0, 9)) % len(g.members)]
        return m.member_id, m.instance_id

    # ------------------------------------------------------------------ members
    @rule(require_known=st.booleans(), metadata=st.sampled_from(SUBSCRIPTIONS))
    def join_dynamic(self, require_known: bool, metadata: bytes) -> None:
        self._join("", None, require_known, metadata=metadata)

    @rule(data=st.data())
    def join_pending(self, data: st.DataObject) -> None:
        g = self.g
        if g is not None and g.pending:
            self._join(list(g.pending)[data.draw(st.integers(0, 9)) % len(g.pending)], None)

    @rule(instance=st.sampled_from(INSTANCES), protocols=st.sampled_from([("range",), ("range", "roundrobin")]))
    def join_static(self, instance: str, protocols: tuple[str, ...]) -> None:
        self._join("", instance, protocols=protocols)

    @rule(data=st.data(), protocols=st.sampled_from([("range",), ("range", "roundrobin")]))
    def rejoin(self, data: st.DataObject, protocols: tuple[str, ...]) -> None:
        member = self._member(data)
        if member is not None:
            self._join(*member, protocols=protocols)

    @rule(data=st.data(), stale=st.booleans())
    def sync(self, data: st.DataObject, stale: bool) -> None:
        member = self._member(data)
        g = self.g
        if member is None or g is None:
            return
        assignments = {mid: mid.encode() for mid in g.members} if member[0] == g.leader else {}
        waiter = self._waiter()
        result = self.groups.sync(GROUP, g.generation - stale, member[0], assignments, member[1], None, None,
                                  waiter, self.now)
        if not isinstance(result, Waiting):
            self.immediate.add(waiter)
        if stale and isinstance(result, tuple):
            assert result[0] != E.NONE

    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        member = self._member(data)
        g = self.g
        if member is not None and g is not None:
            self.groups.heartbeat(GROUP, g.generation, member[0], member[1], self.now)

    @rule(data=st.data(), by_instance=st.booleans())
    def leave(self, data: st.DataObject, by_instance: bool) -> None:
        member = self._member(data)
        if member is None:
            return
        member_id, instance_id = member
        if by_instance and instance_id is not None:
            member_id = ""
        assert self.groups.leave(GROUP, [(member_id, instance_id)], self.now) == [E.NONE]

    # ------------------------------------------------------------------ time and storage
    @precondition(lambda self: self.g is not None and self.g.join_deadline is not None)
    @rule()
    def join_deadline_passes(self) -> None:
        g = self.g
        assert g is not None and g.join_deadline is not None
        self.now = max(self.now, g.join_deadline.at_ms)
        self.groups.join_deadline_passed(g, g.join_deadline, self.now)

    @precondition(lambda self: self.g is not None and self.g.sync_deadline is not None)
    @rule()
    def sync_deadline_passes(self) -> None:
        g = self.g
        assert g is not None and g.sync_deadline is not None
        self.now = max(self.now, g.sync_deadline.at_ms)
        self.groups.sync_deadline_passed(g, g.sync_deadline, self.now)

    @rule(ms=st.integers(1, 2 * SESSION_MS))
    def time_passes(self, ms: int) -> None:
        self.now += ms
        g = self.g
        if g is not None:
            self.groups.expire_sessions(g, self.now)

    @rule(fails=st.booleans())
    def storage(self, fails: bool) -> None:
        self.shell.record_fails = fails

    # ------------------------------------------------------------------ checks
    @invariant()
    def every_request_is_answered_once_or_still_waits(self) -> None:
        g = self.g
        held = [] if g is None else [w for m in g.members.values() for w in (*m.join_waiters, *m.sync_waiters)]
        assert len(held) == len(set(held)), "a waiter held twice"
        for w in range(self.waiters):
            owed = (w in self.immediate) + (w in self.shell.answers) + (w in held)
            assert owed == 1, f"request {w}: answered at once {w in self.immediate}, later " \
                              f"{w in self.shell.answers}, still waiting {w in held}"

    @invariant()
    def join_answers_name_a_real_generation(self) -> None:
        g = self.g
        for result in self.shell.answers.values():
            if isinstance(result, JoinResult) and result.error == E.NONE:
                assert g is not None and 0 < result.generation <= g.generation

    @invariant()
    def generations_move_forward(self) -> None:
        g = self.g
        if g is not None:
            assert g.generation >= self.generation
            self.generation = g.generation
            event(f"reached {g.state}")

    @invariant()
    def deadlines_match_the_state(self) -> None:
        g = self.g
        if g is None:
            return
        assert (g.state == PREPARING) == (g.join_deadline is not None)
        assert g.sync_deadline is None or g.state in (COMPLETING, STABLE)

    @invariant()
    def waiting_matches_the_state(self) -> None:
        g = self.g
        if g is None:
            return
        if g.state in (COMPLETING, STABLE):
            assert not any(m.join_waiters for m in g.members.values())
        if g.state == STABLE:
            assert not any(m.sync_waiters for m in g.members.values())

    @invariant()
    def leader_and_pending_syncs_are_members(self) -> None:
        g = self.g
        if g is None:
            return
        if g.members:
            assert g.leader in g.members
        assert g.pending_sync <= g.members.keys()


ClassicGroupMachine.TestCase.settings = settings(max_examples=examples(300), stateful_step_count=50, deadline=None,
                                                 suppress_health_check=[HealthCheck.too_slow])
TestClassicGroup = ClassicGroupMachine.TestCase

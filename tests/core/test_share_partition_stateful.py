"""Hypothesis drives one share-partition (`core.share.partition`) with members that fetch,
accept, release, reject, renew, acknowledge records they do not hold, vanish with records held,
and with a clock that jumps past locks; the state is persisted and reloaded (a crash) at any
point, and the log grows with control batches among the data.

A model outside the machine records each delivery and each acknowledgement the machine accepted;
checked after every step:
- no offset is held by two members while a lock on it is valid (each delivery's lock ends
  before the next delivery of that offset starts, or the first holder gave it back);
- no offset is delivered more than `group.share.delivery.count.limit` times, across reloads;
- no offset accepted (or rejected) is ever delivered again, across reloads;
- an acknowledgement the machine refused changed nothing;
- the delivery counts the machine reports are 1, 2, 3... per offset;
- every finished offset is below `end`, `start` is the first unfinished offset.
"""
from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from tests.tiers import examples

from oncelog.core.share.partition import (
    ACCEPT,
    ACKNOWLEDGED,
    ACQUIRED,
    ARCHIVED,
    AVAILABLE,
    BATCH_OPTIMIZED,
    GAP,
    RECORD_LIMIT,
    REJECT,
    RELEASE,
    RENEW,
    InvalidRecordState,
    SharePartition,
)

LIMIT = 3
LOCK = 100
MEMBERS = ("a", "b", "c")


class ShareMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1000
        self.sp = SharePartition(0, LIMIT, max_in_flight=40)
        self.log: list[tuple[int, int, bool]] = []    # batches (first, last, data?)
        self.log_end = 0
        # offset -> list of [member, acquired at, lock end (mutable: renew/ack/release end it)]
        self.deliveries: dict[int, list[list]] = {}
        self.finished: set[int] = set()   # accepted or rejected: never again
        self.held: dict[str, set[int]] = {m: set() for m in MEMBERS}   # what each member believes it holds

    # ------------------------------------------------------------------ the log
    @rule(n=st.integers(1, 6), control=st.booleans())
    def append(self, n: int, control: bool) -> None:
        self.log.append((self.log_end, self.log_end + n - 1, not control))
        self.log_end += n

    def _batches_from(self, offset: int) -> list[tuple[int, int, bool]]:
        return [b for b in self.log if b[1] >= offset]

    # ------------------------------------------------------------------ members
    @rule(member=st.sampled_from(MEMBERS), max_records=st.integers(0, 12),
          mode=st.sampled_from((BATCH_OPTIMIZED, RECORD_LIMIT)))
    def fetch(self, member: str, max_records: int, mode: int) -> None:
        got = self.sp.acquire(member, self._batches_from(self.sp.next_fetch_offset(self.now)), max_records, self.now,
                              LOCK, mode)
        n = sum(a.last_offset - a.first_offset + 1 for a in got)
        if mode == RECORD_LIMIT:
            assert n <= max_records
        for a in got:
            for offset in range(a.first_offset, a.last_offset + 1):
                assert offset not in self.finished, f"{offset} delivered after it was finished"
                past = self.deliveries.setdefault(offset, [])
                for d in past:
                    assert d[2] <= self.now, f"{offset} delivered to {member} while {d[0]}'s lock is valid"
                past.append([member, self.now, self.now + LOCK])
                assert a.delivery_count == len(past), (offset, a.delivery_count, len(past))
                assert len(past) <= LIMIT
                self.held[member].add(offset)

    def _ack(self, member: str, offsets: list[int], kind: int) -> bool:
        before = [self.sp.state_of(o) for o in range(self.sp.start, self.sp.end)], self.sp.start
        batches = [(o, o, [kind]) for o in offsets]
        try:
            self.sp.acknowledge(member, batches, self.now, LOCK)
        except InvalidRecordState:
            assert ([self.sp.state_of(o) for o in range(before[1], self.sp.end)], self.sp.start) == before
            return False
        for o in offsets:
            d = self.deliveries[o][-1]
            assert d[0] == member and d[2] > self.now, "an acknowledgement of a lock that ran out was taken"
            if kind == RENEW:
                d[2] = self.now + LOCK
                continue
            d[2] = self.now
            self.held[member].discard(o)
            if kind in (ACCEPT, REJECT):
                self.finished.add(o)
        return True

    @rule(member=st.sampled_from(MEMBERS), kind=st.sampled_from((ACCEPT, RELEASE, REJECT, RENEW)),
          data=st.data())
    def acknowledge_held(self, member: str, kind: int, data: st.DataObject) -> None:
        held = sorted(self.held[member])
        if not held:
            return
        chosen = data.draw(st.lists(st.sampled_from(held), min_size=1, max_size=5, unique=True))
        valid = all(self.sp.state_of(o)[0] == ACQUIRED and self.sp.state_of(o)[2] == member for o in chosen)
        assert self._ack(member, chosen, kind) == valid
        if not valid:   # a lock ran out under it: the member's client drops what it held
            for o in chosen:
                if self.sp.state_of(o)[2] != member:
                    self.held[member].discard(o)

    @rule(member=st.sampled_from(MEMBERS), offset=st.integers(0, 60),
          kind=st.sampled_from((ACCEPT, RELEASE, REJECT, RENEW, GAP)))
    def acknowledge_anything(self, member: str, offset: int, kind: int) -> None:
        state, _count, holder = self.sp.state_of(offset)
        ok = self._ack(member, [offset], kind) if kind != GAP else None
        if kind == GAP:
            return
        assert ok == (state == ACQUIRED and holder == member)

    @rule(ms=st.integers(1, 150))
    def time_passes(self, ms: int) -> None:
        self.now += ms
        self.sp.expire(self.now)
        for m in MEMBERS:
            self.held[m] = {o for o in self.held[m] if self.sp.state_of(o)[2] == m}

    @rule(member=st.sampled_from(MEMBERS))
    def member_leaves(self, member: str) -> None:
        self.sp.release_member(member)
        for o in self.held[member]:
            self.deliveries[o][-1][2] = self.now
        self.held[member] = set()

    @precondition(lambda self: self.log_end > 0)
    @rule()
    def crash_and_reload(self) -> None:
        """The persisted state is what a restarted broker reads: nothing is held after it."""
        self.sp = SharePartition.loaded(self.sp.start, self.sp.state_batches(), LIMIT, 40)
        for m in MEMBERS:
            for o in self.held[m]:
                self.deliveries[o][-1][2] = self.now
            self.held[m] = set()

    # ------------------------------------------------------------------ invariants
    @invariant()
    def consistent(self) -> None:
        sp = self.sp
        assert sp.start <= sp.end
        if sp.start < sp.end:
            assert sp.state_of(sp.start)[0] in (AVAILABLE, ACQUIRED)
        for o in self.finished:
            assert sp.state_of(o)[0] in (ACKNOWLEDGED, ARCHIVED), o
        for o, past in self.deliveries.items():
            assert len(past) <= LIMIT
            state, count, _ = sp.state_of(o)
            if state in (AVAILABLE, ACQUIRED) and o < sp.end:
                assert count == len(past), (o, count, len(past))
        assert sp.end - sp.start <= 40


ShareMachine.TestCase.settings = settings(max_examples=examples(90), stateful_step_count=50, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
TestShareMachine = ShareMachine.TestCase

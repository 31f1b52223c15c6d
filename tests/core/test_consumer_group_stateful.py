"""Hypothesis drives a KIP-848 consumer group (`core.groups`) with members that behave as real
clients do, and worse.

Members join, heartbeat, leave (for good, or as a static member for a while and back under a new
member id), change their subscription, lose heartbeat answers (and come back with their previous
epoch and, as librdkafka and the Java client do after a failed heartbeat, a full request), apply
a new assignment late (they keep consuming revoked partitions, and report them, until they get
round to it), and are fenced by the coordinator's session or rebalance timer
without knowing it (they learn it at their next heartbeat, as UNKNOWN_MEMBER_ID or
FENCED_MEMBER_EPOCH, drop everything and join again). Topics are created and grown. Both
assignors.

Checked after every step:
- the coordinator never has two members holding one partition (OwnershipError), and each
  partition it holds is held at the holder's epoch;
- what each member of the group believes it owns is within what the coordinator has it holding
  (assigned or pending revocation): so no two members of the group ever consume one partition at
  once. A fenced member may still believe it owns partitions until its next heartbeat; it is no
  longer in the group, and Kafka fences its commits (STALE_MEMBER_EPOCH / UNKNOWN_MEMBER_ID).
And whenever the members then heartbeat promptly for a while (`settle`, also at teardown): every
partition of every subscribed topic is assigned to exactly one member subscribed to it, each
member reaches the assignment epoch, and the group is Stable.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tests.tiers import examples

from oncelog.core.groups.consumer_group import STABLE, ConsumerGroup
from oncelog.core.groups.heartbeat import Heartbeat, Settings, complete_rejoin, fence, heartbeat, leave, validate
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.errors import KafkaProtocolError
from oncelog.storage.group_records import changed_records, group_from

TOPIC_IDS = {name: uuid.UUID(int=i + 1) for i, name in enumerate(("t", "u", "v"))}
NAMES = ["m0", "m1", "m2", "m3"]


@dataclass
class Client:
    """A member as its client sees itself."""
    member_id: str
    instance_id: str | None
    topics: tuple[str, ...]
    joined: bool = False
    epoch: int = 0
    owned: dict[uuid.UUID, frozenset[int]] = field(default_factory=dict)
    pending: dict[uuid.UUID, frozenset[int]] | None = None   # an assignment received, not applied yet
    incarnation: int = 0
    full_next: bool = False   # its last heartbeat failed: the next one says everything (as clients do)

    def partitions(self) -> set[tuple[uuid.UUID, int]]:
        return {(t, p) for t, ps in self.owned.items() for p in ps}


class ConsumerGroupMachine(RuleBasedStateMachine):
    @initialize(assignor=st.sampled_from(["uniform", "range"]), t=st.integers(1, 6), u=st.integers(1, 3))
    def setup(self, assignor: str, t: int, u: int) -> None:
        self.settings = Settings(assignors=(assignor, "uniform" if assignor == "range" else "range"))
        self.topics: dict[str, tuple[uuid.UUID, int]] = {"t": (TOPIC_IDS["t"], t), "u": (TOPIC_IDS["u"], u)}
        self.group = ConsumerGroup("g")
        self.stored: dict = {}
        self.clients = {n: Client(f"{n}-0", f"static-{n}" if n == "m3" else None, ("t",) if n != "m2" else ("t", "u"))
                        for n in NAMES}

    # ------------------------------------------------------------------ the client's side
    def _send(self, c: Client, epoch: int, **kw) -> tuple[int, object]:
        rq = complete_rejoin(Heartbeat("g", c.member_id, epoch, c.instance_id, owned=kw.pop("owned", c.owned), **kw),
                             self.group)
        validate(rq, 1, self.settings)
        before = self.group.copy()
        try:
            if epoch < 0:
                return E.NONE, leave(self.group, rq, self.topics)
            return E.NONE, heartbeat(self.group, rq, self.topics, self.settings)
        except KafkaProtocolError as e:
            # a refused heartbeat changes nothing
            assert self.group.record() == before.record(), e
            return e.code, None

    def _rejoin(self, c: Client) -> None:
        """What a client does when told it is no longer a member: it drops everything (its
        partitions are lost) and joins again at its next heartbeat."""
        c.joined, c.epoch, c.owned, c.pending = False, 0, {}, None

    def _heartbeat(self, c: Client, apply: bool, lose_answer: bool = False) -> None:
        full = {"rebalance_timeout_ms": 30000, "subscribed_topic_names": c.topics} if c.full_next else {}
        c.full_next = False
        code, answer = self._send(c, c.epoch, **full)
        if code in (E.UNKNOWN_MEMBER_ID, E.FENCED_MEMBER_EPOCH, E.FENCED_INSTANCE_ID):
            self._rejoin(c)
            return
        assert code == E.NONE, code
        if lose_answer:
            c.full_next = True
            return
        c.epoch = answer.member_epoch
        if answer.assignment is not None:
            c.pending = dict(answer.assignment)
        if apply:
            self._apply(c)

    def _apply(self, c: Client) -> None:
        """The client revokes and takes what its last answer said (a rebalance callback done)."""
        if c.pending is not None:
            c.owned, c.pending = {t: frozenset(ps) for t, ps in c.pending.items() if ps}, None

    @rule(name=st.sampled_from(NAMES), partial=st.booleans())
    def join(self, name: str, partial: bool) -> None:
        """`partial`: a dynamic member joins as librdkafka does when it subscribes again during
        its leave, without rebalance timeout and owned partitions (`complete_rejoin`)."""
        c = self.clients[name]
        if c.joined:
            return
        if partial and c.instance_id is None:
            code, answer = self._send(c, 0, rebalance_timeout_ms=-1, subscribed_topic_names=c.topics, owned=None)
        else:
            code, answer = self._send(c, 0, rebalance_timeout_ms=30000, subscribed_topic_names=c.topics, owned={})
        if code == E.UNRELEASED_INSTANCE_ID:
            return  # its previous incarnation has not left
        assert code == E.NONE, code
        c.joined, c.epoch, c.owned = True, answer.member_epoch, {}
        c.pending = dict(answer.assignment)
        self._apply(c)

    @rule(name=st.sampled_from(NAMES), apply=st.booleans(), lose=st.booleans())
    def heartbeat(self, name: str, apply: bool, lose: bool) -> None:
        c = self.clients[name]
        if c.joined:
            self._heartbeat(c, apply, lose_answer=lose and not apply)

    @rule(name=st.sampled_from(NAMES))
    def apply_late(self, name: str) -> None:
        self._apply(self.clients[name])

    @rule(name=st.sampled_from(NAMES))
    def leave(self, name: str) -> None:
        c = self.clients[name]
        if not c.joined:
            return
        code, _ = self._send(c, -1)
        assert code in (E.NONE, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID), code
        self._rejoin(c)

    @rule()
    def static_member_leaves_for_a_while_and_comes_back(self) -> None:
        c = self.clients["m3"]
        if not c.joined:
            return
        code, _ = self._send(c, -2)
        if code != E.NONE:
            self._rejoin(c)
            return
        # a new process of the same instance: a new member id, nothing owned yet
        c.incarnation += 1
        c.member_id = f"m3-{c.incarnation}"
        self._rejoin(c)

    @rule(name=st.sampled_from(NAMES), topics=st.sampled_from([("t",), ("u",), ("t", "u"), ("t", "v"), ()]))
    def resubscribe(self, name: str, topics: tuple[str, ...]) -> None:
        c = self.clients[name]
        c.topics = topics
        if c.joined:
            code, answer = self._send(c, c.epoch, subscribed_topic_names=topics)
            if code != E.NONE:
                self._rejoin(c)
                return
            c.epoch = answer.member_epoch
            if answer.assignment is not None:
                c.pending = dict(answer.assignment)

    # ------------------------------------------------------------------ the coordinator's side
    @rule(name=st.sampled_from(NAMES))
    def session_or_rebalance_timeout(self, name: str) -> None:
        """The coordinator fences the member; the client does not know yet."""
        c = self.clients[name]
        if c.member_id in self.group.members:
            fence(self.group, c.member_id, self.topics)

    @rule(name=st.sampled_from(["t", "u", "v"]), more=st.integers(1, 3))
    def topic_created_or_grown(self, name: str, more: int) -> None:
        old = self.topics.get(name, (TOPIC_IDS[name], 0))[1]
        self.topics[name] = (TOPIC_IDS[name], old + more)

    # ------------------------------------------------------------------ checks
    @invariant()
    def the_records_of_each_change_make_the_group(self) -> None:
        """What the coordinator writes is the records of what changed since the last write
        (`ConsumerGroup.changes`): replayed in order, latest value per key, they make the group."""
        g = getattr(self, "group", None)
        if g is None:
            return
        for key, value in changed_records(g.changes()):
            if value is None:
                self.stored.pop(key, None)
            else:
                self.stored[key] = value
        g.mark()
        replayed = group_from(self.stored)
        assert (replayed or ConsumerGroup("g").record()) == g.record()

    def _indexes_are_the_members(self) -> None:
        """The indexes kept with each change are those a group restored from its record builds
        (checked when the group settles: restoring at every step doubled the run)."""
        g = self.group
        fresh = ConsumerGroup.restore("g", g.record())
        assert fresh.subscribed_names() == g.subscribed_names() and fresh.regexes() == g.regexes()
        assert fresh.homogeneous() == g.homogeneous()
        assert {n: set(ms) for n, ms in fresh.target_sizes().items()} == \
            {n: set(ms) for n, ms in g.target_sizes().items()}
        for mid, a in g.target.items():
            for t, ps in a.items():
                assert all(g.target_owner((t, p)) == mid for p in ps)

    @invariant()
    def nothing_is_owned_twice(self) -> None:
        g = getattr(self, "group", None)
        if g is None:
            return
        held: dict[tuple[uuid.UUID, int], str] = {}
        for m in g.members.values():
            for assignment in (m.assigned, m.pending_revocation):
                for t, ps in assignment.items():
                    for p in ps:
                        assert (t, p) not in held, f"{t}-{p} held by {held[(t, p)]} and {m.member_id}"
                        held[(t, p)] = m.member_id
                        assert g.holders[(t, p)] == (m.member_id, m.member_epoch)
        assert set(held) == set(g.holders)
        for c in self.clients.values():
            m = g.members.get(c.member_id)
            if m is None or not c.joined:
                continue  # fenced without knowing it yet: not a member, its commits are refused
            mine = {(t, p) for a in (m.assigned, m.pending_revocation) for t, ps in a.items() for p in ps}
            assert c.partitions() <= mine, (c.member_id, c.partitions() - mine)

    @precondition(lambda self: hasattr(self, "group"))
    @rule()
    def settle(self) -> None:
        for _ in range(3 * len(self.clients) + 3):
            for name, c in self.clients.items():
                if c.joined:
                    self._heartbeat(c, apply=True)
                else:
                    self.join(name, partial=False)
        g = self.group
        assert g.state == STABLE, (g.state, g.group_epoch, g.assignment_epoch,
                                   {m.member_id: (m.member_epoch, m.state) for m in g.members.values()})
        owners: dict[tuple[uuid.UUID, int], str] = {}
        for c in self.clients.values():
            assert c.pending is None
            for tp in c.partitions():
                assert tp not in owners
                owners[tp] = c.member_id
        self._indexes_are_the_members()
        joined = [c for c in self.clients.values() if c.joined]
        if self.settings.assignors[0] == "uniform" and joined and len({c.topics for c in joined}) == 1:
            counts = [len(c.partitions()) for c in joined]   # uniform: balanced when all subscribe alike
            assert max(counts) - min(counts) <= 1, counts
        for name, (tid, n) in self.topics.items():
            subscribers = {c.member_id for c in self.clients.values() if c.joined and name in c.topics}
            for p in range(n):
                if subscribers:
                    assert owners.get((tid, p)) in subscribers, (name, p, owners.get((tid, p)), subscribers)
                else:
                    assert (tid, p) not in owners

    def teardown(self) -> None:
        if hasattr(self, "group"):
            self.settle()


ConsumerGroupMachine.TestCase.settings = settings(max_examples=examples(300), stateful_step_count=50, deadline=None,
                                                  suppress_health_check=[HealthCheck.too_slow])
TestConsumerGroup = ConsumerGroupMachine.TestCase

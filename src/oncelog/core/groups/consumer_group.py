"""A KIP-848 consumer group's state (Kafka's ConsumerGroup and ConsumerGroupMember), which is also
what is persisted of it: the group epoch (Kafka's record type 3), the metadata of the topics its
members subscribe to (4), each member's metadata and current assignment (5 and 8), the target
assignment and its epoch (6 and 7), and the topics each subscription regex matched (16).

Derived here and never stored: which member holds each partition at which epoch (from the members'
assigned and pending-revocation partitions), and the static members by instance id. A partition is
held by at most one member: `update_member` refuses a second holder (OwnershipError), the invariant
the coordinator's reconciliation must keep.
"""
from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oncelog.core.groups.reconciliation import Assignment, MemberState

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

EMPTY, ASSIGNING, RECONCILING, STABLE = "Empty", "Assigning", "Reconciling", "Stable"

# topic name -> (topic id, number of partitions)
TopicMetadata = Mapping[str, tuple[uuid.UUID, int]]


class OwnershipError(AssertionError):
    """Two members would hold one partition: a bug of the coordinator, never of a client."""


@dataclass(frozen=True)
class Member:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    rebalance_timeout_ms: int = -1
    server_assignor: str | None = None
    # its current assignment (Kafka's ConsumerGroupCurrentMemberAssignment record)
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    # the epoch each assigned partition was given at (KIP-1251); absent: the member's epoch
    assigned_at: Mapping[tuple[uuid.UUID, int], int] = field(default_factory=dict)

    def commit_epoch_valid(self, epoch: int, partitions: Iterable[tuple[uuid.UUID | None, int]]) -> bool:
        """A commit at `epoch`: the member's current epoch, or an older one at which it already
        owned every partition committed (Kafka 4.3's assignment epochs: a commit sent before the
        answer that moved the member's epoch arrived is still its own)."""
        if epoch == self.member_epoch:
            return True
        if epoch > self.member_epoch:
            return False
        for tid, p in partitions:
            if tid is None or p not in self.assigned.get(tid, ()):
                return False
            if epoch < self.assigned_at.get((tid, p), self.member_epoch):
                return False
        return True

    def reconciled_to(self, epoch: int) -> bool:
        return self.state == MemberState.STABLE and self.member_epoch == epoch

    def subscribed(self, regex_topics: Mapping[str, frozenset[str]]) -> frozenset[str]:
        """Topic names by name and by regex (an unresolved regex matches nothing yet)."""
        names = frozenset(self.subscribed_topic_names)
        if self.subscribed_topic_regex:
            names |= regex_topics.get(self.subscribed_topic_regex, frozenset())
        return names


@dataclass(frozen=True)
class ConsumerGroupRecord:
    """What is stored of a consumer group (its records, latest value per key)."""
    group_epoch: int
    assignment_epoch: int
    members: tuple[Member, ...]
    target: tuple[tuple[str, Assignment], ...]                     # (member id, target assignment)
    subscribed_topics: tuple[tuple[str, uuid.UUID, int], ...]      # (name, topic id, partitions)
    regex_topics: tuple[tuple[str, frozenset[str]], ...]           # (regex, topic names)


# attributes whose changes are journaled (`ConsumerGroup.mark`) besides members and targets
_JOURNALED = frozenset({"group_epoch", "assignment_epoch", "subscribed_topics", "regex_topics"})


@dataclass(frozen=True)
class Changes:
    """What changed in a group since `ConsumerGroup.mark`: the records to write (Kafka writes only
    the records of what changed, never the whole group). None in a mapping: a tombstone."""
    members: Mapping[str, Member | None]
    targets: Mapping[str, Assignment | None]
    group_epoch: int | None
    assignment_epoch: int | None
    subscribed_topics: Mapping[str, tuple[uuid.UUID, int]] | None
    regexes: Mapping[str, frozenset[str] | None]

    def __bool__(self) -> bool:
        return bool(self.members or self.targets or self.regexes) or self.group_epoch is not None \
            or self.assignment_epoch is not None or self.subscribed_topics is not None


@dataclass
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, Member] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)      # member id -> target assignment
    subscribed_topics: dict[str, tuple[uuid.UUID, int]] = field(default_factory=dict)
    regex_topics: dict[str, frozenset[str]] = field(default_factory=dict)
    # derived
    static: dict[str, str] = field(default_factory=dict)             # instance id -> member id
    holders: dict[tuple[uuid.UUID, int], tuple[str, int]] = field(default_factory=dict)  # -> (member, epoch)

    def __post_init__(self) -> None:
        # Indexes kept with every change, so that a heartbeat costs the same in a group of ten
        # members or of ten thousand (issue 36: every join went over every member, several times):
        # topic names and regexes by how many members subscribe with them, members by regex and
        # by server assignor, each subscription's members (one subscription: a homogeneous group),
        # who holds each partition in the target and how many partitions each member's target has.
        self._names: Counter[str] = Counter()
        self._regex_members: dict[str, dict[str, None]] = {}
        self._assignors: Counter[str] = Counter()
        self._subscriptions: Counter[tuple[tuple[str, ...], str | None]] = Counter()
        self._target_owner: dict[tuple[uuid.UUID, int], str] = {}
        self._buckets: dict[int, dict[str, None]] = {}               # target size -> members
        # what the last target was computed for (not stored: after a load the first target is
        # computed whole): (assignor, subscribed topics)
        self.computed_for: tuple[str, Mapping[str, tuple[uuid.UUID, int]]] | None = None
        # (kind, key, value before the change), since `mark`
        self._journal: list[tuple[str, str, Any]] = []
        members, target = dict(self.members), dict(self.target)
        self.members, self.target, self.static, self.holders = {}, {}, {}, {}
        for mid, a in target.items():
            self._put_target(mid, a)
        for m in members.values():
            self.update_member(m)
        self._journal.clear()

    def __setattr__(self, name: str, value: Any) -> None:
        journal = self.__dict__.get("_journal")
        if journal is not None and name in _JOURNALED:
            journal.append(("attr", name, self.__dict__[name]))
        object.__setattr__(self, name, value)

    @classmethod
    def restore(cls, group_id: str, r: ConsumerGroupRecord) -> ConsumerGroup:
        return cls(group_id, r.group_epoch, r.assignment_epoch, {m.member_id: m for m in r.members},
                   dict(r.target), {name: (tid, n) for name, tid, n in r.subscribed_topics},
                   dict(r.regex_topics))

    def record(self) -> ConsumerGroupRecord:
        return ConsumerGroupRecord(
            self.group_epoch, self.assignment_epoch, tuple(self.members[m] for m in sorted(self.members)),
            tuple(sorted(self.target.items())),
            tuple((name, tid, n) for name, (tid, n) in sorted(self.subscribed_topics.items())),
            tuple(sorted(self.regex_topics.items())))

    def copy(self) -> ConsumerGroup:
        """An independent copy (members are immutable)."""
        g = ConsumerGroup(self.group_id, self.group_epoch, self.assignment_epoch, dict(self.members),
                          dict(self.target), dict(self.subscribed_topics), dict(self.regex_topics))
        g.computed_for = self.computed_for
        return g

    # ------------------------------------------------------------------ the journal
    def mark(self) -> None:
        """From here on, changes are journaled: `changes` says what they were, `rollback` undoes
        them (a heartbeat refused, or one whose records could not be stored)."""
        self._journal.clear()

    def rollback(self) -> None:
        for kind, key, old in reversed(self._journal):
            if kind == "member":
                self._put_member(key, old)
            elif kind == "target":
                self._put_target(key, old)
            else:
                object.__setattr__(self, key, old)
        self._journal.clear()

    def touched_members(self) -> dict[str, Member | None]:
        """member id -> the member as it was at `mark` (None: it was not a member), for every
        member changed since."""
        out: dict[str, Member | None] = {}
        for kind, key, old in self._journal:
            if kind == "member" and key not in out:
                out[key] = old
        return out

    def changes(self) -> Changes:
        members: dict[str, Member | None] = {}
        targets: dict[str, Assignment | None] = {}
        attrs: dict[str, Any] = {}
        seen: set[tuple[str, str]] = set()
        for kind, key, old in self._journal:
            if (kind, key) in seen:
                continue
            seen.add((kind, key))
            if kind == "member":
                now = self.members.get(key)
                if now != old:
                    members[key] = now
            elif kind == "target":
                now_t = self.target.get(key)
                if now_t != old:
                    targets[key] = now_t
            elif self.__dict__[key] != old:
                attrs[key] = old
        regexes: dict[str, frozenset[str] | None] = {}
        if "regex_topics" in attrs:
            old_rx = attrs["regex_topics"]
            for rx in set(old_rx) | set(self.regex_topics):
                if old_rx.get(rx) != self.regex_topics.get(rx):
                    regexes[rx] = self.regex_topics.get(rx)
        return Changes(members, targets, self.group_epoch if "group_epoch" in attrs else None,
                       self.assignment_epoch if "assignment_epoch" in attrs else None,
                       dict(self.subscribed_topics) if "subscribed_topics" in attrs else None, regexes)

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> str:
        if not self.members:
            return EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ASSIGNING
        if any(not m.reconciled_to(self.assignment_epoch) for m in self.members.values()):
            return RECONCILING
        return STABLE

    def partition_epoch(self, topic_id: uuid.UUID, partition: int) -> int:
        held = self.holders.get((topic_id, partition))
        return -1 if held is None else held[1]

    def static_member(self, instance_id: str) -> Member | None:
        member_id = self.static.get(instance_id)
        return None if member_id is None else self.members.get(member_id)

    def update_member(self, m: Member) -> None:
        """Add or replace a member; OwnershipError (and nothing changed) if it would hold a
        partition another member holds."""
        for assignment in (m.assigned, m.pending_revocation):
            for tid, parts in assignment.items():
                for p in parts:
                    holder = self.holders.get((tid, p))
                    if holder is not None and holder[0] != m.member_id:
                        raise OwnershipError(f"group {self.group_id}: {tid}-{p} of member {m.member_id} at epoch "
                                             f"{m.member_epoch} is held by {holder[0]} at epoch {holder[1]}")
        self._journal.append(("member", m.member_id, self.members.get(m.member_id)))
        self._put_member(m.member_id, m)

    def remove_member(self, member_id: str) -> Member | None:
        """The member and its target go; its partitions are free."""
        self.set_target(member_id, None)
        m = self.members.get(member_id)
        if m is not None:
            self._journal.append(("member", member_id, m))
            self._put_member(member_id, None)
        return m

    def set_target(self, member_id: str, assignment: Assignment | None) -> None:
        """The member's target assignment (None: it has none)."""
        old = self.target.get(member_id)
        if old is None and assignment is None:
            return
        self._journal.append(("target", member_id, old))
        self._put_target(member_id, assignment)

    def _put_member(self, member_id: str, m: Member | None) -> None:
        """Install `m` (None: remove) with every index, unjournaled."""
        old = self.members.get(member_id)
        if old is not None:
            self._release(old)
            if old.instance_id is not None and self.static.get(old.instance_id) == member_id:
                del self.static[old.instance_id]
            self._unindex(old)
            del self.members[member_id]
        if m is None:
            return
        self.members[member_id] = m
        if m.instance_id is not None:
            self.static[m.instance_id] = member_id
        for assignment in (m.assigned, m.pending_revocation):
            for tid, parts in assignment.items():
                for p in parts:
                    self.holders[(tid, p)] = (member_id, m.member_epoch)
        self._index(m)

    def _index(self, m: Member) -> None:
        self._names.update(m.subscribed_topic_names)
        if m.subscribed_topic_regex:
            self._regex_members.setdefault(m.subscribed_topic_regex, {})[m.member_id] = None
        if m.server_assignor:
            self._assignors[m.server_assignor] += 1
        self._subscriptions[(m.subscribed_topic_names, m.subscribed_topic_regex or None)] += 1
        self._buckets.setdefault(_size(self.target.get(m.member_id)), {})[m.member_id] = None

    def _unindex(self, m: Member) -> None:
        _decrement(self._names, m.subscribed_topic_names)
        if m.subscribed_topic_regex:
            users = self._regex_members[m.subscribed_topic_regex]
            del users[m.member_id]
            if not users:
                del self._regex_members[m.subscribed_topic_regex]
        if m.server_assignor:
            _decrement(self._assignors, (m.server_assignor,))
        _decrement(self._subscriptions, ((m.subscribed_topic_names, m.subscribed_topic_regex or None),))
        self._unbucket(m.member_id, _size(self.target.get(m.member_id)))

    def _unbucket(self, member_id: str, size: int) -> None:
        bucket = self._buckets[size]
        del bucket[member_id]
        if not bucket:
            del self._buckets[size]

    def _put_target(self, member_id: str, assignment: Assignment | None) -> None:
        old = self.target.pop(member_id, None)
        if old is not None:
            for tid, parts in old.items():
                for p in parts:
                    if self._target_owner.get((tid, p)) == member_id:
                        del self._target_owner[(tid, p)]
        if assignment is not None:
            self.target[member_id] = assignment
            for tid, parts in assignment.items():
                for p in parts:
                    self._target_owner[(tid, p)] = member_id
        if member_id in self.members:
            self._unbucket(member_id, _size(old))
            self._buckets.setdefault(_size(assignment), {})[member_id] = None

    def _release(self, m: Member) -> None:
        for assignment in (m.assigned, m.pending_revocation):
            for tid, parts in assignment.items():
                for p in parts:
                    if self.holders.get((tid, p), ("",))[0] == m.member_id:
                        del self.holders[(tid, p)]

    # ------------------------------------------------------------------ subscriptions
    def subscribed_names(self) -> frozenset[str]:
        out = set(self._names)
        for regex in self._regex_members:
            out |= self.regex_topics.get(regex, frozenset())
        return frozenset(out)

    def regexes(self) -> frozenset[str]:
        return frozenset(self._regex_members)

    def regex_users(self, regex: str) -> Iterable[str]:
        """The ids of the members subscribing with `regex`."""
        return self._regex_members.get(regex, {}).keys()

    def homogeneous(self) -> bool:
        """Every member subscribes alike (the same names and regex)."""
        return len(self._subscriptions) == 1

    def target_owner(self, tp: tuple[uuid.UUID, int]) -> str | None:
        return self._target_owner.get(tp)

    def target_sizes(self) -> Mapping[int, Mapping[str, None]]:
        """target size -> the members whose target has that many partitions (in the order they
        got there)."""
        return self._buckets

    def preferred_assignor(self, default: str) -> str:
        """The server assignor most members ask for (Kafka's computePreferredServerAssignor),
        else the default."""
        counts = self._assignors
        if not counts:
            return default
        return min(counts, key=lambda name: (-counts[name], name))


def _size(a: Assignment | None) -> int:
    return 0 if not a else sum(len(ps) for ps in a.values())


def _decrement(counter: Counter[Any], keys: Iterable[Any]) -> None:
    for k in keys:
        counter[k] -= 1
        if counter[k] <= 0:
            del counter[k]

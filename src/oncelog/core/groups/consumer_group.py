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

    @classmethod
    def restore(cls, group_id: str, r: ConsumerGroupRecord) -> ConsumerGroup:
        g = cls(group_id, r.group_epoch, r.assignment_epoch, target=dict(r.target),
                subscribed_topics={name: (tid, n) for name, tid, n in r.subscribed_topics},
                regex_topics=dict(r.regex_topics))
        for m in r.members:
            g.update_member(m)
        return g

    def record(self) -> ConsumerGroupRecord:
        return ConsumerGroupRecord(
            self.group_epoch, self.assignment_epoch, tuple(self.members[m] for m in sorted(self.members)),
            tuple(sorted(self.target.items())),
            tuple((name, tid, n) for name, (tid, n) in sorted(self.subscribed_topics.items())),
            tuple(sorted(self.regex_topics.items())))

    def copy(self) -> ConsumerGroup:
        """A copy to restore if a change cannot be stored (members are immutable)."""
        return ConsumerGroup(self.group_id, self.group_epoch, self.assignment_epoch, dict(self.members),
                             dict(self.target), dict(self.subscribed_topics), dict(self.regex_topics),
                             dict(self.static), dict(self.holders))

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
        old = self.members.get(m.member_id)
        if old is not None:
            self._release(old)
            if old.instance_id is not None and self.static.get(old.instance_id) == old.member_id:
                del self.static[old.instance_id]
        self.members[m.member_id] = m
        if m.instance_id is not None:
            self.static[m.instance_id] = m.member_id
        for assignment in (m.assigned, m.pending_revocation):
            for tid, parts in assignment.items():
                for p in parts:
                    holder = self.holders.get((tid, p))
                    if holder is not None:
                        raise OwnershipError(f"group {self.group_id}: {tid}-{p} of member {m.member_id} at epoch "
                                             f"{m.member_epoch} is held by {holder[0]} at epoch {holder[1]}")
                    self.holders[(tid, p)] = (m.member_id, m.member_epoch)

    def remove_member(self, member_id: str) -> Member | None:
        """The member and its target go; its partitions are free."""
        m = self.members.pop(member_id, None)
        self.target.pop(member_id, None)
        if m is not None:
            self._release(m)
            if m.instance_id is not None and self.static.get(m.instance_id) == member_id:
                del self.static[m.instance_id]
        return m

    def _release(self, m: Member) -> None:
        for assignment in (m.assigned, m.pending_revocation):
            for tid, parts in assignment.items():
                for p in parts:
                    if self.holders.get((tid, p), ("",))[0] == m.member_id:
                        del self.holders[(tid, p)]

    def subscribed_names(self) -> frozenset[str]:
        out: frozenset[str] = frozenset()
        for m in self.members.values():
            out |= m.subscribed(self.regex_topics)
        return out

    def regexes(self) -> frozenset[str]:
        return frozenset(m.subscribed_topic_regex for m in self.members.values() if m.subscribed_topic_regex)

    def preferred_assignor(self, default: str) -> str:
        """The server assignor most members ask for (Kafka's computePreferredServerAssignor),
        else the default."""
        counts = Counter(m.server_assignor for m in self.members.values() if m.server_assignor)
        if not counts:
            return default
        return min(counts, key=lambda name: (-counts[name], name))

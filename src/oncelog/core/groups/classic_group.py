"""A classic group's state (Kafka's ClassicGroup and its members), which is also what its record
stores (Kafka's GroupMetadataValue: generation, protocol, leader, each member's subscription and
assignment); the decisions that change it are `classic`'s.

Two rebalance deadlines live on the group: the end of the join phase and the SyncGroup deadline
(`Deadline`, on the clock of whoever runs the group). A member's session is a deadline too
(`heartbeat_deadline_ms`). A request waiting for the rebalance is an opaque token of the caller's
(`join_waiters`, `sync_waiters`).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from oncelog.protocol.primitives import Reader

EMPTY, PREPARING, COMPLETING, STABLE = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable"
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000  # Kafka's GroupCoordinator.NewMemberJoinTimeoutMs
CONSUMER_PROTOCOL = "consumer"

SyncAnswer = tuple[int, bytes]                          # (error, assignment), to a waiting SyncGroup
SyncResult = tuple[int, str | None, str | None, bytes]  # (error, protocol type, protocol, assignment)


@dataclass(frozen=True, eq=False)
class Deadline:
    """A rebalance phase ends when this passes unless it completes first: `after_ms` from when it
    was set (`at_ms`, on the caller's clock). A sync deadline belongs to its `generation`."""
    at_ms: int
    after_ms: int
    generation: int = -1


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
    join_waiters: list[object] = field(default_factory=list)   # the shell's tokens of waiting requests
    sync_waiters: list[object] = field(default_factory=list)

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
    join_deadline: Deadline | None = None
    sync_deadline: Deadline | None = None
    initial_join: bool = False       # the join deadline is the initial delay (never completes early)
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

    def subscribed_topics(self) -> frozenset[str] | None:
        """Topics of a consumer group from its members' subscriptions (ConsumerProtocolSubscription,
        whose v0 prefix every version shares); None when unknown."""
        if self.protocol_type != CONSUMER_PROTOCOL:
            return None
        topics: set[str] = set()
        try:
            for m in self.members.values():
                r = Reader(m.metadata(self.protocol))
                r.i16()
                for _ in range(r.array_len(False)):
                    topics.add(r.string(False) or "")
        except (ValueError, IndexError, UnicodeDecodeError, EOFError, struct.error):  # too short to read
            return None
        return frozenset(topics)


def member_from_record(member_id: str, instance_id: str | None, client_id: str, client_host: str,
                       protocol: str | None, subscription: bytes, session_timeout_ms: int,
                       rebalance_timeout_ms: int, assignment: bytes, now: int) -> Member:
    """A member of a loaded group (Kafka's GroupMetadata.loadGroup): a fresh session from `now`."""
    return Member(member_id, instance_id, client_id, client_host, [(protocol or "", subscription)],
                  session_timeout_ms, rebalance_timeout_ms, now + session_timeout_ms, assignment, is_new=False)


def loaded_group(group_id: str, generation: int, protocol_type: str | None, protocol: str | None,
                 leader: str | None, members: list[Member], empty_since_ms: int, now: int) -> Group:
    """A group from its stored record: Stable at the record's generation if it has members (so
    members that keep heartbeating see no rebalance and their commits at that generation are
    taken), else Empty since `empty_since_ms`."""
    g = Group(group_id, generation=generation, protocol_type=protocol_type)
    for m in members:
        g.members[m.member_id] = m
        if m.instance_id is not None:
            g.static[m.instance_id] = m.member_id
    if g.members:
        g.state, g.state_since_ms = STABLE, now
        g.protocol, g.leader = protocol, leader
        g.subscribed = g.subscribed_topics()
    else:
        g.state_since_ms = empty_since_ms
    return g


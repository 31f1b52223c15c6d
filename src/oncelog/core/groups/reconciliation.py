"""How one member of a KIP-848 consumer group moves from what it owns to its target assignment
(Kafka's CurrentAssignmentBuilder, 4.0): revoke before assign.

- A member whose target changed keeps current ∩ target. If it still owns any partition it must
  give up, it stays at its epoch in UNREVOKED_PARTITIONS with only the kept partitions assigned,
  until a heartbeat reports none of them owned any more (a heartbeat without its owned partitions
  counts as still owning them).
- Then it moves to the target epoch and is given the target's partitions that nobody else holds
  (a partition is held while another member's assigned or pending-revocation set has it); it is
  STABLE, or UNRELEASED_PARTITIONS while some of its target is still held elsewhere, and picks
  those up on later heartbeats as their owners let go.
So a partition is never handed out while its previous owner may still use it, and a member never
gets new partitions before it has given up those it lost.

Each assigned partition keeps the epoch it was given at (Kafka 4.3's assignment epochs, KIP-1251),
so that a commit sent with an epoch the member has since left is still taken for the partitions it
already owned then.
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oncelog.core.groups.consumer_group import Member

Assignment = Mapping[uuid.UUID, frozenset[int]]
# (topic id, partition) -> the epoch of the member holding it, or -1 when nobody does
PartitionEpoch = Callable[[uuid.UUID, int], int]


class MemberState(IntEnum):
    """Persisted as an int8 in the member's current assignment (Kafka's MemberState)."""
    STABLE = 0
    UNREVOKED_PARTITIONS = 1
    UNRELEASED_PARTITIONS = 2
    UNKNOWN = 127


class FencedMember(Exception):
    """The member must give up all its partitions and join again (FENCED_MEMBER_EPOCH)."""


def reconcile(member: Member, target_epoch: int, target: Assignment, partition_epoch: PartitionEpoch,
              owned: Assignment | None) -> Member:
    """The member's next state towards (`target_epoch`, `target`), or `member` itself when it
    cannot move yet. `owned`: the partitions its heartbeat reports, None when not sent."""
    state = member.state
    if state == MemberState.STABLE:
        if member.member_epoch == target_epoch:
            return member
        return _next(member, member.member_epoch, target_epoch, target, partition_epoch, owned)
    if state == MemberState.UNREVOKED_PARTITIONS:
        if _owns_any(owned, member.pending_revocation):
            return member
        return _next(member, member.member_epoch, target_epoch, target, partition_epoch, owned)
    if state == MemberState.UNRELEASED_PARTITIONS:
        return _next(member, member.member_epoch, target_epoch, target, partition_epoch, owned)
    # UNKNOWN: only a future version writes it; start over from nothing
    if owned is None or any(owned.values()):
        raise FencedMember("the member is in an unknown state: it must give up its partitions and rejoin")
    return _next(member, target_epoch, target_epoch, target, partition_epoch, owned)


def _owns_any(owned: Assignment | None, pending: Assignment) -> bool:
    if owned is None:
        return True
    return any(owned.get(tid, frozenset()) & parts for tid, parts in pending.items())


def _next(member: Member, epoch: int, target_epoch: int, target: Assignment, partition_epoch: PartitionEpoch,
          owned: Assignment | None) -> Member:
    assigned: dict[uuid.UUID, frozenset[int]] = {}
    revoking: dict[uuid.UUID, frozenset[int]] = {}
    adding: dict[uuid.UUID, frozenset[int]] = {}
    unreleased = False
    for tid in set(target) | set(member.assigned):
        want = target.get(tid, frozenset())
        have = member.assigned.get(tid, frozenset())
        kept = have & want
        pending_mine = member.pending_revocation.get(tid, frozenset())
        free = set()
        for p in want - kept:
            # held by another member (its own pending revocations do not count: only one
            # member can hold a partition, and here it is this one)
            if partition_epoch(tid, p) != -1 and p not in pending_mine:
                unreleased = True
            else:
                free.add(p)
        if kept:
            assigned[tid] = kept
        if have - kept:
            revoking[tid] = have - kept
        if free:
            adding[tid] = frozenset(free)
    if revoking and _owns_any(owned, revoking):
        return replace(member, state=MemberState.UNREVOKED_PARTITIONS, member_epoch=epoch,
                       previous_member_epoch=member.member_epoch, assigned=assigned,
                       assigned_at={tp: e for tp, e in member.assigned_at.items() if tp[1] in assigned.get(tp[0], ())},
                       pending_revocation=revoking)
    given_at = {tp: e for tp, e in member.assigned_at.items() if tp[1] in assigned.get(tp[0], ())}
    for tid, parts in adding.items():
        assigned[tid] = assigned.get(tid, frozenset()) | parts
        given_at.update({(tid, p): target_epoch for p in parts})
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return replace(member, state=state, member_epoch=target_epoch,
                   previous_member_epoch=member.member_epoch, assigned=assigned, assigned_at=given_at,
                   pending_revocation={})


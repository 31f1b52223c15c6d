"""The server-side assignors of KIP-848 consumer groups, `uniform` and `range` (Kafka's
UniformAssignor and RangeAssignor, `group.consumer.assignors`): the coordinator runs one whenever
the group epoch moves past the assignment epoch, and hands members the result as their target.

Both are sticky, as Kafka's are: a member keeps what it was last given wherever the balance
allows, because every partition that moves must first be revoked by its owner, and each move
costs the records consumed since the last commit.
- `uniform` spreads all subscribed partitions evenly over the members: counts differ by at most
  one among members of the same subscription, and with different subscriptions no partition can
  move to a member with two fewer partitions that subscribes to its topic.
- `range` assigns each topic separately in ranges over its subscribers sorted by member id, so
  topics with the same partition count are co-partitioned (partition i of each goes to the same
  member) in a fresh group; the first `count % members` members take one more.

Work is bounded by partitions × members per run (no search).
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

Assignment = Mapping[uuid.UUID, frozenset[int]]


@dataclass(frozen=True)
class MemberSpec:
    """What an assignor sees of a member: the topics it subscribes to (by id, existing ones only)
    and its current target assignment."""
    subscribed: frozenset[uuid.UUID]
    current: Assignment


# topic id -> number of partitions, for every topic some member subscribes to
Topics = Mapping[uuid.UUID, int]
Assignor = Callable[[Mapping[str, MemberSpec], Topics], dict[str, dict[uuid.UUID, frozenset[int]]]]


def uniform(members: Mapping[str, MemberSpec], topics: Topics) -> dict[str, dict[uuid.UUID, frozenset[int]]]:
    order = sorted(members)
    owner: dict[tuple[uuid.UUID, int], str] = {}
    owned: dict[str, set[tuple[uuid.UUID, int]]] = {m: set() for m in order}
    for m in order:  # sticky: what each member had, where still valid
        spec = members[m]
        for tid, parts in spec.current.items():
            if tid in spec.subscribed and tid in topics:
                for p in parts:
                    if p < topics[tid] and (tid, p) not in owner:
                        owner[(tid, p)] = m
                        owned[m].add((tid, p))
    eligible = {tid: [m for m in order if tid in members[m].subscribed] for tid in sorted(topics)}

    def least(candidates: list[str]) -> str:
        return min(candidates, key=lambda c: (len(owned[c]), c))

    for tid in sorted(topics):  # partitions nobody holds, each to the least loaded subscriber
        if not eligible[tid]:
            continue
        for p in range(topics[tid]):
            if (tid, p) not in owner:
                m = least(eligible[tid])
                owner[(tid, p)] = m
                owned[m].add((tid, p))
    # balance: move a partition from a member to a subscriber with at least two fewer, until none
    # can move; each move lowers the sum of squared counts, so this ends
    moved = True
    while moved:
        moved = False
        for m in sorted(order, key=lambda x: (-len(owned[x]), x)):
            for tp in sorted(owned[m], reverse=True):
                target = least(eligible[tp[0]])
                if len(owned[target]) <= len(owned[m]) - 2:
                    owned[m].discard(tp)
                    owned[target].add(tp)
                    owner[tp] = target
                    moved = True
    return {m: _by_topic(owned[m]) for m in order}


def range_(members: Mapping[str, MemberSpec], topics: Topics) -> dict[str, dict[uuid.UUID, frozenset[int]]]:
    owned: dict[str, set[tuple[uuid.UUID, int]]] = {m: set() for m in members}
    for tid in sorted(topics):
        subscribers = sorted(m for m, spec in members.items() if tid in spec.subscribed)
        if not subscribers:
            continue
        count = topics[tid]
        base, extra = divmod(count, len(subscribers))
        kept: dict[str, list[int]] = {}
        for m in subscribers:  # sticky: up to the minimum quota, one more while extras last
            had = sorted(p for p in members[m].current.get(tid, ()) if p < count)
            take = base + 1 if len(had) > base and extra > 0 else base
            if take > base:
                extra -= 1
            kept[m] = had[:take]
        quota = {m: max(base, len(kept[m])) for m in subscribers}
        for m in subscribers:
            if extra > 0 and quota[m] == base:
                quota[m] += 1
                extra -= 1
        taken = {p for ps in kept.values() for p in ps}
        free = iter(p for p in range(count) if p not in taken)
        for m in subscribers:  # in member order, so a fresh group gets contiguous ranges
            mine = set(kept[m])
            while len(mine) < quota[m]:
                mine.add(next(free))
            owned[m].update((tid, p) for p in mine)
    return {m: _by_topic(owned[m]) for m in members}


def _by_topic(tps: set[tuple[uuid.UUID, int]]) -> dict[uuid.UUID, frozenset[int]]:
    out: dict[uuid.UUID, set[int]] = {}
    for tid, p in tps:
        out.setdefault(tid, set()).add(p)
    return {tid: frozenset(ps) for tid, ps in out.items()}


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform, "range": range_}

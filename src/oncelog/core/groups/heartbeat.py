"""ConsumerGroupHeartbeat decided (Kafka 4.0's GroupMetadataManager.consumerGroupHeartbeat), pure:
the caller hands in the group, the request and the cluster's topics, and gets the member's answer;
the group is changed in place, so a caller that cannot store the change (or gets an error) puts
back the copy it took before. Every check comes before any change, so a refused heartbeat changes
nothing.

One heartbeat:
1. Validation (INVALID_REQUEST, UNSUPPORTED_ASSIGNOR): see `validate`; a member whose record
   would be larger than the offsets topic's maximum (a megabyte of regex or topic names) is
   refused with UNKNOWN_SERVER_ERROR, Kafka's answer for MESSAGE_TOO_LARGE.
2. The member: a join (epoch 0) creates it; a static member (instance id) replaces its previous
   incarnation only if that one left with epoch -2 (else UNRELEASED_INSTANCE_ID to the newcomer);
   otherwise the member must exist (UNKNOWN_MEMBER_ID; FENCED_INSTANCE_ID when the instance id
   belongs to another member id) and send its epoch, or its previous one with owned partitions
   within its assignment (its last answer was lost); anything else is FENCED_MEMBER_EPOCH.
   A regex that changed must compile (INVALID_REGULAR_EXPRESSION).
3. The group epoch moves when the group is new, a subscription changed, or the subscribed topics'
   metadata changed (a topic created, deleted or grown); then the assignor computes a target for
   the new epoch, for all members. A regex no other member subscribes to matches nothing until
   the group's next heartbeat, as Kafka resolves a new regex asynchronously.
4. The member reconciles towards its target (`reconciliation`); the answer carries its whole
   assignment when it joined, sent a full request (rebalance timeout, subscription and owned
   partitions all set: KAFKA-16367), its assignment changed, or (beyond Kafka) the epoch it is
   told is not the one it sent.

One liberty beside Kafka: a member that joins again (epoch 0, owning nothing, under the member id
the group still holds at another epoch: it was told FENCED_MEMBER_EPOCH) starts afresh, its old
incarnation's partitions released first so nothing is owned twice. Kafka answers such a join
FENCED_MEMBER_EPOCH again (UNRELEASED_INSTANCE_ID, fatal, for a static member) until the member's
session runs out.

A second one (`complete_rejoin`): librdkafka (2.15, 2.16) that subscribes again while its leave is
in flight sends its join as a plain heartbeat: epoch 0 and the new subscription, but neither
RebalanceTimeoutMs nor TopicPartitions. Kafka answers INVALID_REQUEST, fatal for the consumer,
which then never consumes again (librdkafka's own test 0045_subscribe_many_updates fails so on a
slow machine). Such a join of a dynamic member is taken as the join it means: owning nothing,
with max.poll.interval.ms's default as its rebalance timeout.
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from oncelog.core.groups.assignors import ASSIGNORS, MemberSpec
from oncelog.core.groups.consumer_group import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    ConsumerGroup,
    Member,
    TopicMetadata,
)
from oncelog.core.groups.reconciliation import Assignment, FencedMember, reconcile
from oncelog.core.groups.subscriptions import compile_regex, resolve
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

E = ErrorCode
FIRST_CLIENT_MEMBER_ID_VERSION = 1  # KIP-1082: the member id is the client's from v1


@dataclass(frozen=True)
class Heartbeat:
    """A ConsumerGroupHeartbeat request; None fields were not sent (unchanged)."""
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Assignment | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True)
class Answer:
    member_id: str
    member_epoch: int
    assignment: Assignment | None   # None: unchanged, not sent
    member: Member | None           # the member after the heartbeat; None after a leave


@dataclass(frozen=True)
class Settings:
    assignors: tuple[str, ...] = ("uniform", "range")  # group.consumer.assignors; the first is the default
    max_size: int = 2**31 - 1                           # group.consumer.max.size
    # the offsets topic's max.message.bytes (the broker's message.max.bytes): Kafka refuses a
    # member whose record would not fit in a batch of the offsets topic
    max_record_bytes: int = 1048588


# Kafka's record batch header (61 bytes) and one record's framing, around the member's fields
_RECORD_OVERHEAD = 61 + 32


def member_record_size(m: Member) -> int:
    """The size of the member's ConsumerGroupMemberMetadata record, as Kafka would write it:
    its strings (UTF-8, the topic names one by one) and a fixed overhead for the rest."""
    strings = (m.member_id, m.instance_id, m.rack_id, m.client_id, m.client_host, m.subscribed_topic_regex,
               m.server_assignor, *m.subscribed_topic_names)
    return _RECORD_OVERHEAD + sum(2 + len(s.encode()) for s in strings if s is not None)


def _refuse(code: ErrorCode, message: str) -> KafkaProtocolError:
    return KafkaProtocolError(code, message)


def validate(rq: Heartbeat, version: int, settings: Settings) -> None:
    """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid."""
    if (version >= FIRST_CLIENT_MEMBER_ID_VERSION or rq.member_epoch > 0 or rq.member_epoch == LEAVE_EPOCH) \
            and not rq.member_id.strip():
        raise _refuse(E.INVALID_REQUEST, "MemberId can't be empty.")
    for name, value in (("GroupId", rq.group_id), ("InstanceId", rq.instance_id), ("RackId", rq.rack_id)):
        if value is not None and not value.strip():
            raise _refuse(E.INVALID_REQUEST, f"{name} can't be empty.")
    if rq.member_epoch == JOIN_EPOCH:
        if rq.rebalance_timeout_ms == -1:
            raise _refuse(E.INVALID_REQUEST, "RebalanceTimeoutMs must be provided in first request.")
        if rq.owned is None or any(rq.owned.values()):
            raise _refuse(E.INVALID_REQUEST, "TopicPartitions must be empty when (re-)joining.")
        if rq.subscribed_topic_names is None and rq.subscribed_topic_regex is None:
            raise _refuse(E.INVALID_REQUEST, "Either SubscribedTopicNames or SubscribedTopicRegex must be "
                                             "non-null when (re-)joining.")
    elif rq.member_epoch == STATIC_LEAVE_EPOCH:
        if rq.instance_id is None:
            raise _refuse(E.INVALID_REQUEST, "InstanceId can't be null.")
    elif rq.member_epoch < STATIC_LEAVE_EPOCH:
        raise _refuse(E.INVALID_REQUEST, "MemberEpoch is invalid.")
    if rq.server_assignor is not None and rq.server_assignor not in settings.assignors:
        raise _refuse(E.UNSUPPORTED_ASSIGNOR, f"ServerAssignor {rq.server_assignor} is not supported. "
                                              f"Supported assignors: {', '.join(settings.assignors)}.")


REJOIN_REBALANCE_TIMEOUT_MS = 300_000  # max.poll.interval.ms's default, what librdkafka sends when it does


def complete_rejoin(rq: Heartbeat, group: ConsumerGroup | None) -> Heartbeat:
    """The join librdkafka sends without its full fields when it subscribes again during its leave
    (module docstring), completed: it owns nothing and gets the default rebalance timeout. Only
    that shape (a subscription, no rebalance timeout, no TopicPartitions at all, no instance id)
    of a member the group does not hold as static; any other request is returned as it is, for
    `validate` to judge as Kafka does."""
    if not (rq.member_epoch == JOIN_EPOCH and rq.rebalance_timeout_ms == -1 and rq.owned is None
            and rq.instance_id is None
            and (rq.subscribed_topic_names is not None or rq.subscribed_topic_regex is not None)):
        return rq
    held = group.members.get(rq.member_id) if group is not None else None
    if held is not None and held.instance_id is not None:
        return rq
    return replace(rq, rebalance_timeout_ms=REJOIN_REBALANCE_TIMEOUT_MS, owned={})


def heartbeat(group: ConsumerGroup, rq: Heartbeat, topics: TopicMetadata, settings: Settings,
              matches: Callable[[str], frozenset[str]] | None = None) -> Answer:
    """One heartbeat (not a leave) of a validated request. `topics`: the cluster's topics a
    subscription may name; `matches(regex)`: the topic names a compiled regex matches now for the
    members using it (the broker's leaves out what any of them may not DESCRIBE; by default,
    resolved against `topics`)."""
    joining = rq.member_epoch == JOIN_EPOCH
    if len(group.members) >= settings.max_size and rq.member_id not in group.members:
        raise _refuse(E.GROUP_MAX_SIZE_REACHED, f"The consumer group has reached its maximum capacity of "
                                                f"{settings.max_size} members.")
    member = _member(group, rq)
    regex = rq.subscribed_topic_regex
    if regex == "":
        regex = None  # the Java client clears its regex with ""
    updated = replace(
        member,
        instance_id=rq.instance_id if rq.instance_id is not None else member.instance_id,
        rack_id=rq.rack_id if rq.rack_id is not None else member.rack_id,
        rebalance_timeout_ms=rq.rebalance_timeout_ms if rq.rebalance_timeout_ms != -1 else member.rebalance_timeout_ms,
        server_assignor=rq.server_assignor if rq.server_assignor is not None else member.server_assignor,
        subscribed_topic_names=(tuple(sorted(set(rq.subscribed_topic_names))) if rq.subscribed_topic_names is not None
                                else member.subscribed_topic_names),
        subscribed_topic_regex=regex if rq.subscribed_topic_regex is not None else member.subscribed_topic_regex,
        client_id=rq.client_id, client_host=rq.client_host)
    size = member_record_size(updated)
    if size > settings.max_record_bytes:
        # Kafka's append fails with MESSAGE_TOO_LARGE, which the group coordinator answers as
        # UNKNOWN_SERVER_ERROR (GroupCoordinatorService.handleOperationException); checked before
        # the regex is compiled, which is what costs memory
        raise _refuse(E.UNKNOWN_SERVER_ERROR, f"The member's record is {size} bytes, above the offsets topic's "
                                              f"maximum of {settings.max_record_bytes} (message.max.bytes).")
    names_changed = updated.subscribed_topic_names != member.subscribed_topic_names
    regex_changed = updated.subscribed_topic_regex != member.subscribed_topic_regex
    if regex_changed and updated.subscribed_topic_regex is not None:
        compile_regex(updated.subscribed_topic_regex)
    # A regex no other member subscribes to is resolved after this heartbeat, as Kafka resolves it
    # asynchronously (maybeUpdateRegularExpressions): this answer assigns the member's topics by
    # name, and the regex's topics come with a later heartbeat (a group epoch of their own).
    # librdkafka's suite expects these two steps (0045_resubscribe_with_regex in consumer mode).
    new_regex = updated.subscribed_topic_regex
    others = new_regex is not None and any(mid != member.member_id for mid in group.regex_users(new_regex))
    fresh = frozenset({new_regex}) if (
        regex_changed and new_regex is not None and not others and new_regex not in group.regex_topics) else frozenset()
    # checks done: from here on the group changes
    if group.members.get(member.member_id) is not member:
        _admit(group, member)
    group.update_member(updated)
    bump = group.group_epoch == 0 or names_changed or regex_changed
    refresh_subscriptions(group, topics, matches, bump, defer=fresh)
    if group.group_epoch > group.assignment_epoch:
        compute_target(group, settings)
    target = group.target.get(updated.member_id, {})
    reconciled = updated
    if not updated.reconciled_to(group.assignment_epoch):
        try:
            reconciled = reconcile(updated, group.assignment_epoch, target, group.partition_epoch, rq.owned)
        except FencedMember as e:
            raise _refuse(E.FENCED_MEMBER_EPOCH, str(e)) from None
        group.update_member(reconciled)
    full = (rq.rebalance_timeout_ms != -1 and (rq.subscribed_topic_names is not None or rq.subscribed_topic_regex
                                               is not None) and rq.owned is not None)
    # beyond Kafka: also when the member's epoch is not the one it sent (it lost the answer that
    # moved it), or it would never hear of what that answer gave it unless its client sends a
    # full request next
    send = joining or full or reconciled.assigned != member.assigned or reconciled.member_epoch != rq.member_epoch
    return Answer(reconciled.member_id, reconciled.member_epoch, reconciled.assigned if send else None, reconciled)


def _member(group: ConsumerGroup, rq: Heartbeat) -> Member:
    """The member this heartbeat is from (Kafka's getOrMaybeSubscribe{Dynamic,Static}ConsumerGroupMember),
    not yet added to the group: a new one, a static member's replacement, or the existing one."""
    joining = rq.member_epoch == JOIN_EPOCH
    if rq.instance_id is None:
        m = group.members.get(rq.member_id)
        if m is None:
            if not joining:
                raise _refuse(E.UNKNOWN_MEMBER_ID, f"Member {rq.member_id} is not a member of group {group.group_id}.")
            return Member(rq.member_id)
        if joining and not _epoch_accepted(m, rq):
            return Member(rq.member_id)  # it starts again (module docstring)
        _check_epoch(m, rq)
        return m
    holder = group.static_member(rq.instance_id)
    if joining:
        if holder is None or holder.member_id == rq.member_id:
            existing = group.members.get(rq.member_id)
            if existing is not None and _epoch_accepted(existing, rq):
                return existing
            return Member(rq.member_id)  # new, or it starts again (module docstring)
        if holder.member_epoch != STATIC_LEAVE_EPOCH:
            raise _refuse(E.UNRELEASED_INSTANCE_ID, f"Static member {rq.member_id} with instance id {rq.instance_id} "
                                                    f"cannot join the group because the instance id is owned by "
                                                    f"{holder.member_id} member.")
        # the instance comes back: the new member id takes its place and its assignment
        return replace(holder, member_id=rq.member_id, member_epoch=0, previous_member_epoch=0)
    holder = _static_holder(group, rq)
    _check_epoch(holder, rq)
    return holder


def _static_holder(group: ConsumerGroup, rq: Heartbeat) -> Member:
    """The static member of the request's instance id, which must be the request's member."""
    assert rq.instance_id is not None
    holder = group.static_member(rq.instance_id)
    if holder is None:
        raise _refuse(E.UNKNOWN_MEMBER_ID, f"Instance id {rq.instance_id} is unknown.")
    if holder.member_id != rq.member_id:
        raise _refuse(E.FENCED_INSTANCE_ID, f"Static member {rq.member_id} with instance id {rq.instance_id} was "
                                            f"fenced by member {holder.member_id}.")
    return holder


def _admit(group: ConsumerGroup, member: Member) -> None:
    """Make room for `member`: the static incarnation it replaces, or its own old incarnation,
    leaves (its target goes to the newcomer when it is the same instance)."""
    if member.instance_id is not None:
        old_id = group.static.get(member.instance_id)
        if old_id is not None and old_id != member.member_id:
            target = group.target.get(old_id)
            group.remove_member(old_id)
            if target is not None:
                group.set_target(member.member_id, target)
            return
    if member.member_id in group.members:
        target = group.target.get(member.member_id)
        group.remove_member(member.member_id)
        if target is not None:
            group.set_target(member.member_id, target)


def _epoch_accepted(m: Member, rq: Heartbeat) -> bool:
    """Kafka's throwIfConsumerGroupMemberEpochIsInvalid, as a question."""
    if rq.member_epoch > m.member_epoch:
        return False
    if rq.member_epoch < m.member_epoch:
        return rq.member_epoch == m.previous_member_epoch and _subset(rq.owned, m.assigned)
    return True


def _check_epoch(m: Member, rq: Heartbeat) -> None:
    if not _epoch_accepted(m, rq):
        relation = "greater" if rq.member_epoch > m.member_epoch else "smaller"
        raise _refuse(E.FENCED_MEMBER_EPOCH, f"The consumer group member has a {relation} member epoch "
                                             f"({rq.member_epoch}) than the one known by the group coordinator "
                                             f"({m.member_epoch}). The member must abandon all its partitions and "
                                             "rejoin.")


def _subset(owned: Assignment | None, assigned: Assignment) -> bool:
    if owned is None:
        return False
    return all(parts <= assigned.get(tid, frozenset()) for tid, parts in owned.items() if parts)


def leave(group: ConsumerGroup, rq: Heartbeat, topics: TopicMetadata,
          matches: Callable[[str], frozenset[str]] | None = None) -> Answer:
    """Epoch -1 (leave; the member is fenced at once) or -2 (a static member leaving for a while:
    it keeps its partitions, at epoch -2, until its session runs out or its instance returns)."""
    if rq.instance_id is None:
        m = group.members.get(rq.member_id)
        if m is None:
            raise _refuse(E.UNKNOWN_MEMBER_ID, f"Member {rq.member_id} is not a member of group {group.group_id}.")
    else:
        m = _static_holder(group, rq)
        if rq.member_epoch == STATIC_LEAVE_EPOCH:
            group.update_member(replace(m, member_epoch=STATIC_LEAVE_EPOCH, pending_revocation={}))
            return Answer(rq.member_id, rq.member_epoch, None, None)
    fence(group, m.member_id, topics, matches)
    return Answer(rq.member_id, rq.member_epoch, None, None)


def fence(group: ConsumerGroup, member_id: str, topics: TopicMetadata,
          matches: Callable[[str], frozenset[str]] | None = None) -> Member | None:
    """The member leaves the group (left, session or rebalance timeout): its partitions are free
    and the group epoch moves, so the others are given them. `matches` as for `heartbeat`: the
    regexes of the members left are resolved again."""
    m = group.remove_member(member_id)
    if m is not None:
        refresh_subscriptions(group, topics, matches, bump=True)
    return m


def refresh_subscriptions(group: ConsumerGroup, topics: TopicMetadata,
                          matches: Callable[[str], frozenset[str]] | None, bump: bool,
                          defer: frozenset[str] = frozenset()) -> None:
    """Resolve the group's regexes (but those in `defer`, which match nothing until the next
    refresh), take the metadata of the topics it subscribes to, and move the group epoch if either
    changed (or `bump`). A regex that now matches topics the group already subscribes to (by name,
    or by another regex) changes no topic metadata but changes its members' subscriptions: the
    epoch moves so the assignor gives them their share (Kafka bumps on any resolution change)."""
    regexes = group.regexes() - defer
    resolved = {r: (matches(r) if matches is not None else resolve(r, topics)) for r in regexes}
    if resolved != group.regex_topics:
        group.regex_topics = resolved
        bump = True
    names = group.subscribed_names()
    metadata = {n: topics[n] for n in sorted(names) if n in topics}
    if metadata != group.subscribed_topics:
        group.subscribed_topics = metadata
        bump = True
    if bump:
        group.group_epoch += 1


def compute_target(group: ConsumerGroup, settings: Settings) -> None:
    """The assignor's target for every member at the group epoch (Kafka's TargetAssignmentBuilder).
    Only members whose target changed get a new one (each is a record to write). The `uniform`
    assignor on a group whose members all subscribe alike, whose topics did not change since its
    last target, only places the partitions nobody holds in the target and evens the counts out
    (`_rebalance_uniform`): work in proportion to what moves, not to the group's size, so a
    member joining a group of thousands costs what it costs in a group of ten."""
    name = group.preferred_assignor(settings.assignors[0])
    if not (name == "uniform" and group.homogeneous() and group.computed_for is not None
            and group.computed_for == (name, group.subscribed_topics)):
        _compute_whole(group, name)
    else:
        _rebalance_uniform(group)
    group.computed_for = (name, dict(group.subscribed_topics))
    group.assignment_epoch = group.group_epoch


def _compute_whole(group: ConsumerGroup, name: str) -> None:
    ids = {name: tid for name, (tid, _n) in group.subscribed_topics.items()}
    counts: Mapping[uuid.UUID, int] = {tid: n for tid, n in group.subscribed_topics.values()}
    specs = {mid: MemberSpec(frozenset(ids[n] for n in m.subscribed(group.regex_topics) if n in ids),
                             group.target.get(mid, {}))
             for mid, m in group.members.items()}
    computed = ASSIGNORS[name](specs, counts)
    for mid in [mid for mid in group.target if mid not in computed]:
        group.set_target(mid, None)
    for mid, a in computed.items():
        a = {tid: ps for tid, ps in a.items() if ps}
        if dict(group.target.get(mid, {})) != a:
            group.set_target(mid, a)


def _rebalance_uniform(group: ConsumerGroup) -> None:
    """`uniform` for a homogeneous group whose last target was computed for the same topics: every
    member may take every partition, so balanced means counts that differ by at most one. The
    partitions nobody holds in the target (a member left, or none was given yet) go to the members
    with the fewest; then, while the largest target has two more than the smallest, one partition
    moves from the first to the second. Sticky as the whole computation is: nothing else moves."""
    sizes = group.target_sizes()
    parts = [(tid, p) for _name, (tid, n) in sorted(group.subscribed_topics.items()) for p in range(n)]
    for tp in parts:
        if group.target_owner(tp) is None:
            smallest = next(iter(sizes[min(sizes)]))
            _move(group, tp, None, smallest)
    while sizes and max(sizes) - min(sizes) >= 2:
        largest = next(iter(sizes[max(sizes)]))
        smallest = next(iter(sizes[min(sizes)]))
        tid, ps = max((tid, ps) for tid, ps in group.target[largest].items() if ps)
        _move(group, (tid, max(ps)), largest, smallest)


def _move(group: ConsumerGroup, tp: tuple[uuid.UUID, int], source: str | None, dest: str) -> None:
    tid, p = tp
    if source is not None:
        a = dict(group.target[source])
        left = a[tid] - {p}
        if left:
            a[tid] = left
        else:
            del a[tid]
        group.set_target(source, a)
    b = dict(group.target.get(dest, {}))
    b[tid] = b.get(tid, frozenset()) | {p}
    group.set_target(dest, b)

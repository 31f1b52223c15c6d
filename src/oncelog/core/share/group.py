"""Share-group membership (Kafka 4.2's GroupMetadataManager.shareGroupHeartbeat), pure.

A member joins with epoch 0 and its subscription, heartbeats with the epoch it was last told,
and leaves with epoch -1. The group epoch moves whenever membership, a subscription or the
subscribed topics' partition counts change; the target assignment is then computed again by the
simple assignor, and a member is given its new assignment (and the group epoch as its epoch) on
its next heartbeat. Unlike a consumer group there is nothing to revoke: a partition may be shared
by several members at once, and records, not partitions, are what one member holds, so a
member's assignment changes at once.

Refusals, as Kafka answers them: INVALID_REQUEST (no member id, a join without a subscription,
an epoch below -1), UNKNOWN_MEMBER_ID (a heartbeat from a member the group does not have),
FENCED_MEMBER_EPOCH (an epoch other than the one the member was told, or the one before it when
its last answer was lost), GROUP_MAX_SIZE_REACHED (`group.share.max.size`).
"""
from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

E = ErrorCode
JOIN_EPOCH, LEAVE_EPOCH = 0, -1
TopicMetadata = Mapping[str, tuple[uuid.UUID, int]]   # name -> (topic id, partition count)
Assignment = dict[uuid.UUID, frozenset[int]]


@dataclass
class ShareMember:
    member_id: str
    epoch: int
    previous_epoch: int
    subscribed: tuple[str, ...]
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    assignment: Assignment = field(default_factory=dict)


@dataclass
class ShareGroup:
    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    # the partition counts of the subscribed topics when the target was computed
    topics_seen: dict[str, tuple[uuid.UUID, int]] = field(default_factory=dict)

    @property
    def state(self) -> str:
        """Kafka's ShareGroupState: Empty, Stable (no Assigning/Reconciling worth showing here,
        assignments apply at once)."""
        return "Stable" if self.members else "Empty"

    def subscribed_topics(self) -> set[str]:
        return {t for m in self.members.values() for t in m.subscribed}


@dataclass(frozen=True)
class ShareHeartbeat:
    group_id: str
    member_id: str
    member_epoch: int
    rack_id: str | None = None
    subscribed_topic_names: tuple[str, ...] | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True)
class ShareAnswer:
    member_id: str
    member_epoch: int
    assignment: Assignment | None   # None: unchanged, not sent
    left: bool = False


def validate(rq: ShareHeartbeat) -> None:
    """Kafka's throwIfShareGroupHeartbeatRequestIsInvalid."""
    if not rq.member_id.strip():
        raise KafkaProtocolError(E.INVALID_REQUEST, "MemberId can't be empty.")
    if not rq.group_id.strip():
        raise KafkaProtocolError(E.INVALID_REQUEST, "GroupId can't be empty.")
    if rq.rack_id is not None and not rq.rack_id.strip():
        raise KafkaProtocolError(E.INVALID_REQUEST, "RackId can't be empty.")
    if rq.member_epoch == JOIN_EPOCH:
        if not rq.subscribed_topic_names:
            raise KafkaProtocolError(E.INVALID_REQUEST, "SubscribedTopicNames must be set in first request.")
    elif rq.member_epoch < LEAVE_EPOCH:
        raise KafkaProtocolError(E.INVALID_REQUEST, "MemberEpoch is invalid.")


def simple_assign(subscriptions: Mapping[str, tuple[str, ...]], topics: TopicMetadata) -> dict[str, Assignment]:
    """Kafka's SimpleAssignor in spirit: every partition of a subscribed topic goes to at least
    one of its subscribers; with more subscribers than partitions, a partition is shared by
    several (members spread evenly over the partitions); otherwise partitions are dealt round
    the subscribers. Deterministic (members and topics in sorted order)."""
    out: dict[str, Assignment] = {m: {} for m in subscriptions}
    turn = 0
    for name in sorted({t for ts in subscriptions.values() for t in ts}):
        if name not in topics:
            continue
        topic_id, count = topics[name]
        subscribers = sorted(m for m, ts in subscriptions.items() if name in ts)
        if not subscribers or count <= 0:
            continue
        pairs: list[tuple[str, int]] = []
        if len(subscribers) <= count:
            pairs = [(subscribers[(p + turn) % len(subscribers)], p) for p in range(count)]
        else:
            pairs = [(m, (i + turn) % count) for i, m in enumerate(subscribers)]
        turn += 1
        for member, p in pairs:
            out[member][topic_id] = out[member].get(topic_id, frozenset()) | {p}
    return out


def _refresh_target(group: ShareGroup, topics: TopicMetadata) -> None:
    subs = {mid: m.subscribed for mid, m in group.members.items()}
    group.target = simple_assign(subs, topics)
    group.topics_seen = {t: topics[t] for t in group.subscribed_topics() if t in topics}
    group.assignment_epoch = group.epoch


def heartbeat(group: ShareGroup, rq: ShareHeartbeat, topics: TopicMetadata, max_size: int) -> ShareAnswer:
    """One validated heartbeat; the group changes in place (every check comes first)."""
    if rq.member_epoch == LEAVE_EPOCH:
        leave(group, rq.member_id, topics)
        return ShareAnswer(rq.member_id, LEAVE_EPOCH, None, left=True)
    member = group.members.get(rq.member_id)
    changed = False
    if rq.member_epoch == JOIN_EPOCH:
        if member is None and len(group.members) >= max_size:
            raise KafkaProtocolError(E.GROUP_MAX_SIZE_REACHED, f"The share group has reached its maximum "
                                                               f"capacity of {max_size} members.")
        if member is not None:   # a member that lost its state joins again: it starts afresh
            del group.members[rq.member_id]
        member = ShareMember(rq.member_id, 0, 0, tuple(sorted(set(rq.subscribed_topic_names or ()))))
        group.members[rq.member_id] = member
        changed = True
    else:
        if member is None:
            raise KafkaProtocolError(E.UNKNOWN_MEMBER_ID, f"Member {rq.member_id} is not a member of "
                                                          f"group {rq.group_id}.")
        if rq.member_epoch not in (member.epoch, member.previous_epoch):
            raise KafkaProtocolError(E.FENCED_MEMBER_EPOCH, f"The share group member has a different epoch "
                                                            f"({member.epoch}) than the one sent "
                                                            f"({rq.member_epoch}).")
        if rq.subscribed_topic_names is not None:
            wanted = tuple(sorted(set(rq.subscribed_topic_names)))
            if wanted != member.subscribed:
                member.subscribed = wanted
                changed = True
    member.rack_id = rq.rack_id if rq.rack_id is not None else member.rack_id
    member.client_id, member.client_host = rq.client_id or member.client_id, rq.client_host or member.client_host
    seen = {t: topics[t] for t in group.subscribed_topics() if t in topics}
    if changed or seen != group.topics_seen or group.epoch == 0:
        group.epoch += 1
        _refresh_target(group, topics)
    full = rq.member_epoch == JOIN_EPOCH or rq.member_epoch != member.epoch
    new_assignment = group.target.get(member.member_id, {})
    send = full or new_assignment != member.assignment or member.epoch != group.epoch
    if member.epoch != group.epoch:
        member.previous_epoch, member.epoch = member.epoch, group.epoch
    member.assignment = new_assignment
    return ShareAnswer(member.member_id, member.epoch, dict(new_assignment) if send else None)


def leave(group: ShareGroup, member_id: str, topics: TopicMetadata) -> bool:
    """The member leaves (or is fenced by its session): True if it was a member."""
    if group.members.pop(member_id, None) is None:
        return False
    group.epoch += 1
    _refresh_target(group, topics)
    return True

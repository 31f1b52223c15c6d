"""A consumer's membership of its group, the decisions without the I/O (`aio.group` sends and
receives): the KIP-848 member (`ConsumerProtocolMember`) and the classic protocol's client-side
range assignor (`range_assignment`, what a classic group's leader computes).

The KIP-848 member follows the coordinator: each heartbeat answer may carry its whole assignment
(topic ids); the member gives up what is no longer in it first, and takes what is new only once
that is done (`changes`), reporting what it owns in the next heartbeat, which the coordinator
waits for before it hands the revoked partitions to anyone else. What a heartbeat sends:
everything when joining or after a failed heartbeat (Kafka's "full" request), otherwise its epoch
and only what changed (subscription, owned partitions). UNKNOWN_MEMBER_ID and
FENCED_MEMBER_EPOCH mean the member is out: its partitions are lost (no commit can be made for
them any more) and it joins again under the same member id, with epoch 0.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from oncelog.client.errors import KafkaClientError
from oncelog.protocol.errors import ErrorCode, error_code

Assignment = dict[uuid.UUID, frozenset[int]]
E = ErrorCode
JOIN, LEAVE, STATIC_LEAVE = 0, -1, -2
# errors after which the member joins again (its partitions are lost)
REJOIN = frozenset({E.UNKNOWN_MEMBER_ID, E.FENCED_MEMBER_EPOCH})
# errors a heartbeat retries (the coordinator moved or is loading)
RETRY = frozenset({E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS, E.NOT_COORDINATOR,
                   E.REQUEST_TIMED_OUT, E.NETWORK_EXCEPTION})


class GroupError(KafkaClientError):
    """The coordinator refused the member for good (Kafka's fatal heartbeat errors: an unknown
    assignor, a static instance id in use, no rights, a bad regex ...)."""

    def __init__(self, code: int, message: str | None = None) -> None:
        self.code = error_code(code)
        super().__init__(f"consumer group: {self.code.name}" + (f": {message}" if message else ""))


@dataclass(frozen=True)
class Changes:
    """What the consumer must do now: give up `revoke`, then (on a later call) take `assign`."""
    revoke: frozenset[tuple[uuid.UUID, int]] = frozenset()
    assign: frozenset[tuple[uuid.UUID, int]] = frozenset()


def _flat(a: Assignment) -> set[tuple[uuid.UUID, int]]:
    return {(t, p) for t, ps in a.items() for p in ps}


def _nested(tps: set[tuple[uuid.UUID, int]]) -> Assignment:
    out: dict[uuid.UUID, set[int]] = {}
    for t, p in tps:
        out.setdefault(t, set()).add(p)
    return {t: frozenset(ps) for t, ps in out.items()}


class ConsumerProtocolMember:
    def __init__(self, member_id: str, instance_id: str | None, rebalance_timeout_ms: int,
                 assignor: str | None) -> None:
        self.member_id = member_id
        self.instance_id = instance_id
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.assignor = assignor
        self.epoch = JOIN
        self.interval_ms = 5000
        self.topics: tuple[str, ...] | None = None
        self.regex: str | None = None
        self.owned: Assignment = {}
        self.target: Assignment | None = None
        self.full = True                       # the next heartbeat says everything
        self._sent_subscription: tuple[Any, ...] | None = None
        self._sent_owned: Assignment | None = None
        self.leaving = False

    # ------------------------------------------------------------------ what to send
    def subscribe(self, topics: list[str] | None = None, regex: str | None = None) -> None:
        self.topics = tuple(sorted(set(topics))) if topics is not None else None
        self.regex = regex

    def urgent(self) -> bool:
        """A heartbeat should go now rather than at the interval: joining, leaving, or something
        to report (a subscription, or partitions given up or taken)."""
        return (self.epoch == JOIN or self.leaving or self.full or self._subscription() != self._sent_subscription
                or self.owned != self._sent_owned)

    def _subscription(self) -> tuple[Any, ...]:
        return (self.topics, self.regex)

    def request(self) -> dict[str, Any]:
        """The ConsumerGroupHeartbeat fields (v1) of the next heartbeat; `sent()` once it is sent."""
        epoch = self.epoch
        if self.leaving:
            epoch = STATIC_LEAVE if self.instance_id is not None else LEAVE
        fields: dict[str, Any] = {"member_id": self.member_id, "member_epoch": epoch,
                                  "instance_id": self.instance_id}
        if self.leaving:
            return fields
        full = self.full or self.epoch == JOIN
        if full:
            fields["rebalance_timeout_ms"] = self.rebalance_timeout_ms
            fields["server_assignor"] = self.assignor
        if full or self._subscription() != self._sent_subscription:
            fields["subscribed_topic_names"] = self.topics if self.topics is not None else ()
            if self.regex is not None or self._sent_subscription is not None and self._sent_subscription[1]:
                fields["subscribed_topic_regex"] = self.regex or ""
        if full or self.owned != self._sent_owned:
            fields["topic_partitions"] = {} if self.epoch == JOIN else dict(self.owned)
        return fields

    def sent(self, fields: dict[str, Any]) -> None:
        self.full = False
        if "subscribed_topic_names" in fields:
            self._sent_subscription = self._subscription()
        if "topic_partitions" in fields:
            self._sent_owned = dict(fields["topic_partitions"])

    # ------------------------------------------------------------------ what came back
    def on_answer(self, code: int, message: str | None, epoch: int, interval_ms: int,
                  assignment: Assignment | None) -> bool:
        """True if the member is out and its partitions are lost (it joins again); raises
        GroupError for a refusal the member cannot get past."""
        if code == E.NONE:
            if self.leaving:
                return False
            self.epoch, self.interval_ms = epoch, interval_ms or self.interval_ms
            if assignment is not None:
                self.target = {t: frozenset(ps) for t, ps in assignment.items() if ps}
            return False
        if code in REJOIN:
            self.epoch, self.target, self.full = JOIN, None, True
            return True
        if code in RETRY:
            self.full = True
            return False
        raise GroupError(code, message)

    def failed(self) -> None:
        """The heartbeat got no answer (connection lost, timeout): the next one says everything."""
        self.full = True

    def changes(self) -> Changes:
        if self.target is None:
            return Changes()
        owned, target = _flat(self.owned), _flat(self.target)
        if owned - target:
            return Changes(revoke=frozenset(owned - target))
        return Changes(assign=frozenset(target - owned))

    def revoked(self, tps: frozenset[tuple[uuid.UUID, int]]) -> None:
        self.owned = _nested(_flat(self.owned) - tps)

    def assigned(self, tps: frozenset[tuple[uuid.UUID, int]]) -> None:
        self.owned = _nested(_flat(self.owned) | tps)

    def lost(self) -> None:
        self.owned, self.target = {}, None


def range_assignment(subscriptions: dict[str, tuple[str, ...]], partitions: dict[str, int]
                     ) -> dict[str, dict[str, list[int]]]:
    """The classic RangeAssignor (Kafka's `range`, librdkafka's default): per topic, its
    subscribers sorted by member id take consecutive ranges, the first `count % members` one
    more."""
    out: dict[str, dict[str, list[int]]] = {m: {} for m in subscriptions}
    for topic in sorted({t for ts in subscriptions.values() for t in ts}):
        count = partitions.get(topic, 0)
        members = sorted(m for m, ts in subscriptions.items() if topic in ts)
        per, extra = divmod(count, len(members))
        start = 0
        for i, m in enumerate(members):
            n = per + (1 if i < extra else 0)
            if n:
                out[m][topic] = list(range(start, start + n))
            start += n
    return out

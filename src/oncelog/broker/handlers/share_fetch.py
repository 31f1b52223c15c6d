"""ShareFetch (API 78), v1-v2 (KIP-932; librdkafka 2.16 sends v1): a share-group member's
acknowledgements of what it was given, and records acquired for it, from the partitions of its
share session (`broker.groups.share_groups`).

One request: the share session is checked (epoch 0 opens one, -1 closes it after its
acknowledgements, else the next epoch; errors top-level), the partitions named join the session and
the forgotten ones leave it (what the member held of them goes back); then the acknowledgements of
each partition are applied (AcknowledgeErrorCode per partition: INVALID_RECORD_STATE when it names
a record the member does not hold; nothing of that partition changes); then, when MaxRecords > 0,
records are acquired from the session's partitions in turn (lowest available offset first) and
returned with their AcquiredRecords ranges and delivery counts, long polling up to MaxWait (waking
on appends and on the next lock to run out).

Nothing is answered before the share group's state write that covers the request's changes is on
disk (`ShareGroupCoordinator.durable`: one write and one fsync for every share-partition and every
request of the group that changed meanwhile). A request's acknowledgements and acquisitions go
into one write; a long poll that finds nothing at once has its acknowledgements written while it
waits. If that write failed: the acknowledgements not
known to be durable answer KAFKA_STORAGE_ERROR (NOT_LEADER_OR_FOLLOWER when another broker owns the
group's state now), and the records acquired are not handed out (the partition answers the error;
they go back with their delivery count, as Kafka rolls back a failed transition).

v2 (KIP-1206): ShareAcquireMode 1 (record_limit) acquires at most MaxRecords exactly; 0
(batch_optimized, and v1) whole batches, as Kafka does. RENEW acknowledgements (type 4, KIP-1222)
extend a lock; a request with IsRenewAck fetches nothing.

share.isolation.level=read_committed: records are acquired only below the last stable offset, and
the records of aborted transactions (and control records) are archived, never delivered.

Authorization: READ on the group (GROUP_AUTHORIZATION_FAILED, top level) and READ on each topic
(TOPIC_AUTHORIZATION_FAILED for its partitions, which are not served). Topics are named by id; an
unknown id is UNKNOWN_TOPIC_ID, a partition the topic does not have UNKNOWN_TOPIC_OR_PARTITION (it
does not join the session).
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from oncelog.broker.handlers.api_versions import share_groups_enabled
from oncelog.broker.security.authorization import GROUP, TOPIC, Op, authorize, authorized_names
from oncelog.broker.services import BrokerServices
from oncelog.core.share.partition import BATCH_OPTIMIZED, RENEW, Acquired, InvalidRecordState
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.records import iter_batches
from oncelog.storage.fence import Fenced
from oncelog.storage.share_state import StaleStateEpoch

API_KEY = ApiKey.SHARE_FETCH
E = ErrorCode
TP = tuple[uuid.UUID, int]


@dataclass
class PartitionAnswer:
    error_code: int = E.NONE
    error_message: str | None = None
    ack_error_code: int = E.NONE
    ack_error_message: str | None = None
    records: bytes = b""
    acquired: list[Acquired] = field(default_factory=list)
    acked: bool = False   # the request acknowledged records of it: answered whatever happened

    def worth_answering(self) -> bool:
        return bool(self.acked or self.acquired or self.error_code or self.ack_error_code)


@dataclass
class Resolved:
    """The request's partitions by (topic id, partition): those it may use, and the answers of
    those it may not (unknown topic id, no READ)."""
    usable: dict[TP, str] = field(default_factory=dict)     # -> topic name
    refused: dict[TP, PartitionAnswer] = field(default_factory=dict)


def resolve(broker: BrokerServices, pairs: Iterable[TP]) -> Resolved:
    out = Resolved()
    names: dict[TP, str] = {}
    for tid, p in pairs:
        name = broker.logs.topic_name(tid)
        if name is None:
            out.refused[(tid, p)] = PartitionAnswer(E.UNKNOWN_TOPIC_ID, ack_error_code=E.UNKNOWN_TOPIC_ID)
        else:
            names[(tid, p)] = name
    readable = authorized_names(broker, Op.READ, TOPIC, set(names.values()))
    for tp, name in names.items():
        if name in readable:
            info = broker.logs.topics.get(name)
            if info is not None and not 0 <= tp[1] < info.partitions:
                # (after READ: no more is told than to a reader) a partition the topic does not
                # have never joins a share session: any index would, and every later fetch of
                # the session would walk and answer it
                out.refused[tp] = PartitionAnswer(E.UNKNOWN_TOPIC_OR_PARTITION,
                                                  ack_error_code=E.UNKNOWN_TOPIC_OR_PARTITION)
                continue
            out.usable[tp] = name
        else:
            out.refused[tp] = PartitionAnswer(E.TOPIC_AUTHORIZATION_FAILED, ack_error_code=E.TOPIC_AUTHORIZATION_FAILED)
    return out


def elsewhere(pairs: Iterable[TP]) -> dict[TP, PartitionAnswer]:
    """The answers of a broker that does not coordinate the group (or no longer: it was paused,
    and another took the group over): a share-partition lives with its group's coordinator
    (docs/share-groups.md), so nothing is served from this broker's memory."""
    return {tp: PartitionAnswer(E.NOT_LEADER_OR_FOLLOWER, ack_error_code=E.NOT_LEADER_OR_FOLLOWER) for tp in pairs}


def acknowledge(broker: BrokerServices, group: str, member: str, tp: TP, name: str,
                batches: list[tuple[int, int, list[int]]], answer: PartitionAnswer) -> int:
    """Apply one partition's acknowledgements; the number of the group's state write that
    carries them (0: nothing changed), which the answer must wait for (`answer_durably`)."""
    share = broker.groups.share
    answer.acked = True
    partition = broker.logs.get_partition(name, tp[1])
    if partition is None:
        answer.ack_error_code = broker.logs.partition_error(name, tp[1])
        return 0
    try:
        sp = share.share_partition(group, tp[0], tp[1], partition.log_start_offset, partition.high_watermark)
    except OSError as e:
        answer.ack_error_code, answer.ack_error_message = _storage_code(e), str(e)
        return 0
    try:
        sp.acknowledge(member, batches, broker.now_ms(), share.lock_ms(group))
    except InvalidRecordState as e:
        answer.ack_error_code, answer.ack_error_message = E.INVALID_RECORD_STATE, str(e)
        return 0
    if all(t == RENEW for _f, _l, types in batches for t in types):
        return 0   # a lock's deadline is not stored (acquired records are stored as available)
    return share.changed((group, tp[0], tp[1]))


async def answer_durably(broker: BrokerServices, group: str, member: str, answers: dict[TP, PartitionAnswer],
                         acks: int, acquired: int) -> None:
    """Wait until the group's state write `max(acks, acquired)` (from `acknowledge` and
    `_acquire`) is on disk. If it failed: acknowledgements whose own write `acks` is not known
    to be durable answer the error, and what was acquired is not handed out."""
    share = broker.groups.share
    need = max(acks, acquired)
    if not need:
        return
    error = await share.durable(group, need)
    if error is None:
        return
    code, message = _storage_code(error), f"the share group's state was not written: {error}"
    for (tid, p), a in answers.items():
        if a.acquired:
            sp = share.partitions.get((group, tid, p))
            if sp is not None:
                sp.unacquire(member, a.acquired)
                share.changed((group, tid, p))
            a.records, a.acquired = b"", []
            a.error_code, a.error_message = code, message
    if acks and not share.was_durable(group, acks):
        for a in answers.values():
            if a.acked and a.ack_error_code == E.NONE:
                a.ack_error_code, a.ack_error_message = code, message


def _storage_code(e: Exception) -> int:
    """A share state write refused: by the fence or a newer state epoch (another broker owns the
    group's state now), or by the disk."""
    return E.NOT_LEADER_OR_FOLLOWER if isinstance(e, (Fenced, StaleStateEpoch)) else E.KAFKA_STORAGE_ERROR


def ack_batches(p: Any) -> list[tuple[int, int, list[int]]]:
    return [(int(b.first_offset), int(b.last_offset), [int(t) for t in b.acknowledge_types])
            for b in p.acknowledgement_batches]


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    share = broker.groups.share
    lock_ms = 0

    def top(code: int, message: str | None = None, refused: dict[TP, PartitionAnswer] | None = None) -> bytes:
        return encode(broker, rb, refused or {}, code, message, lock_ms)

    if not share_groups_enabled(broker):
        return top(E.UNSUPPORTED_VERSION, "Share groups are not enabled (share.version is 0).")
    group, member = str(r.group_id or ""), str(r.member_id or "")
    if not authorize(broker, Op.READ, GROUP, group):
        return top(E.GROUP_AUTHORIZATION_FAILED)
    if not member.strip():
        return top(E.INVALID_REQUEST, "MemberId can't be empty.")
    # the request's partitions (a topic may come more than once: librdkafka does that)
    named: dict[TP, Any] = {}
    for t in r.topics:
        for p in t.partitions:
            named[(t.topic_id, int(p.partition_index))] = p
    if not broker.coordinates(group):   # checks the group's lease: a lost one drops the group first
        return top(E.NONE, None, elsewhere(named))
    lock_ms = share.lock_ms(group)
    forgotten = {(t.topic_id, int(p)) for t in r.forgotten_topics_data for p in t.partitions}
    resolved = resolve(broker, named)
    epoch = int(r.share_session_epoch)
    if epoch == 0 and any(ack_batches(p) for p in named.values()):
        # Kafka's answer (SharePartitionManager.newContext): a session is opened before anything
        # is acknowledged in it; the records stay as they are
        return top(E.INVALID_REQUEST, "Acknowledge data present in the initial ShareFetch (share session epoch 0).")
    try:
        session = share.session(group, member, epoch)
    except KafkaProtocolError as e:
        return top(e.code, str(e), resolved.refused)
    answers: dict[TP, PartitionAnswer] = dict(resolved.refused)
    acks = acquired = 0   # the group's state writes that carry this request's changes
    for tp, name in resolved.usable.items():
        batches = ack_batches(named[tp])
        answer = answers.setdefault(tp, PartitionAnswer())
        if batches:
            acks = max(acks, acknowledge(broker, group, member, tp, name, batches, answer))
    if session is None:   # epoch -1: acknowledged, then closed
        share.close_session(group, member)
        await answer_durably(broker, group, member, answers, acks, 0)
        return encode(broker, rb, answers, E.NONE, None, lock_ms)
    if forgotten:
        share.forget(group, member, session, forgotten)
    session.partitions |= set(resolved.usable)
    max_records = int(r.max_records)
    renewing = bool(getattr(r, "is_renew_ack", False)) or any(
        t == RENEW for p in named.values() for _f, _l, ts in ack_batches(p) for t in ts)
    if max_records > 0 and not renewing and session.partitions:
        mode = int(getattr(r, "share_acquire_mode", BATCH_OPTIMIZED))
        deadline = time.monotonic() + entities.millis(r.max_wait) / 1000
        max_bytes = min(int(r.max_bytes), broker.config["fetch.max.bytes"])
        while True:
            got, write = _acquire(broker, group, member, session.partitions, max_records, max_bytes, mode, answers)
            acquired = max(acquired, write)
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                break
            # wake on an append, or when the next lock of these partitions runs out
            next_lock = min((sp.next_deadline() for (g, tid, p), sp in share.partitions.items()
                             if g == group and (tid, p) in session.partitions), default=1 << 62)
            wait = min(remaining, max(0.005, (next_lock - broker.now_ms()) / 1000))
            if acks or acquired:
                # what changed so far is written while this waits (when records are there at
                # once, as under load, the acknowledgements and acquisitions share one write)
                share.flush(group)
            await broker.wait_for_data(wait)
            if share.sessions.get((group, member)) is not session:
                break   # closed or replaced meanwhile: nothing more for this request
    await answer_durably(broker, group, member, answers, acks, acquired)
    return encode(broker, rb, answers, E.NONE, None, lock_ms)


def _acquire(broker: BrokerServices, group: str, member: str, partitions: set[TP], max_records: int,
             max_bytes: int, mode: int, answers: dict[TP, PartitionAnswer]) -> tuple[int, int]:
    """Acquire up to `max_records` over the session's partitions: (the number acquired, the
    group's state write that carries the changes, 0 if none)."""
    share = broker.groups.share
    committed = share.group_config(group, "share.isolation.level") == "read_committed"
    total = write = 0
    budget = max_bytes
    for tp in sorted(partitions, key=lambda tp: (str(tp[0]), tp[1])):
        if total >= max_records or budget <= 0:
            break
        name = broker.logs.topic_name(tp[0])
        answer = answers.setdefault(tp, PartitionAnswer())
        if name is None:
            answer.error_code = E.UNKNOWN_TOPIC_ID
            continue
        partition = broker.logs.get_partition(name, tp[1])
        if partition is None:
            answer.error_code = broker.logs.partition_error(name, tp[1])
            continue
        key = (group, tp[0], tp[1])
        fresh = key not in share.partitions
        try:
            sp = share.share_partition(group, tp[0], tp[1], partition.log_start_offset, partition.high_watermark)
        except OSError as e:
            answer.error_code, answer.error_message = _storage_code(e), str(e)
            continue
        if fresh:   # its first state (or the one read) is on disk before the answer
            write = max(write, share.changed(key))
        offset = sp.next_fetch_offset(broker.now_ms())
        upper = partition.last_stable_offset if committed else partition.high_watermark
        if offset >= upper:
            continue
        try:
            data = bytes(partition.read(offset, budget, min_one=True, max_offset=upper))
        except KafkaProtocolError as e:
            answer.error_code = e.code
            continue
        headers = [(pos, h) for pos, h in iter_batches(data)]
        if not headers:
            continue
        aborted: set[int] = set()
        if committed:
            end = headers[-1][1].last_offset + 1
            query = partition.aborted_transactions(offset, end)
            aborted_pids = {(t.producer_id, t.first_offset) for t in query.transactions}
            aborted = _aborted_batches(headers, aborted_pids)
        batches = [(h.base_offset, h.last_offset, not h.is_control and i not in aborted)
                   for i, (_pos, h) in enumerate(headers)]
        end = sp.end
        acquired = sp.acquire(member, batches, max_records - total, broker.now_ms(), share.lock_ms(group), mode)
        if acquired or sp.end != end:   # (nothing acquired: archived control or aborted batches)
            write = max(write, share.changed(key))
        if not acquired:
            continue
        first, last = acquired[0].first_offset, acquired[-1].last_offset
        chosen = [(pos, h) for pos, h in headers if h.last_offset >= first and h.base_offset <= last]
        start = chosen[0][0]
        stop = chosen[-1][0] + chosen[-1][1].size
        answer.records = data[start:stop]
        answer.acquired = acquired
        total += sum(a.last_offset - a.first_offset + 1 for a in acquired)
        budget -= stop - start
    return total, write


def _aborted_batches(headers: list[tuple[int, Any]], aborted: set[tuple[int, int]]) -> set[int]:
    """Indexes of the transactional batches that belong to an aborted transaction: a producer's
    batches from its aborted transaction's first offset up to its abort marker."""
    firsts: dict[int, list[int]] = {}
    for pid, first in sorted(aborted):
        firsts.setdefault(pid, []).append(first)
    out: set[int] = set()
    active: set[int] = set()
    for i, (_pos, h) in enumerate(headers):
        pid = h.producer_id
        if h.is_control:
            active.discard(pid)   # its marker ends the producer's transaction
            continue
        if not h.is_transactional:
            continue
        pending = firsts.get(pid)
        if pid not in active and pending and h.base_offset >= pending[0]:
            active.add(pid)
            pending.pop(0)
        if pid in active:
            out.add(i)
    return out


def encode(broker: BrokerServices, rb: entities.ResponseBuilder, answers: dict[TP, PartitionAnswer], code: int,
           message: str | None, lock_ms: int) -> bytes:
    by_topic: dict[uuid.UUID, list[Any]] = {}
    for (tid, p), a in sorted(answers.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        if not a.worth_answering():
            continue
        name = broker.logs.topic_name(tid)
        leader, leader_epoch = broker.logs.leader(name, p) if name is not None else (-1, -1)
        by_topic.setdefault(tid, []).append(rb(
            "PartitionData", partition_index=p, error_code=a.error_code, error_message=a.error_message,
            acknowledge_error_code=a.ack_error_code, acknowledge_error_message=a.ack_error_message,
            current_leader=rb("LeaderIdAndEpoch", leader_id=leader, leader_epoch=leader_epoch),
            records=a.records,
            acquired_records=tuple(rb("AcquiredRecords", first_offset=x.first_offset, last_offset=x.last_offset,
                                      delivery_count=x.delivery_count) for x in a.acquired)))
    return rb.encode(throttle_time=0, error_code=code, error_message=message, acquisition_lock_timeout=lock_ms,
                     responses=tuple(rb("ShareFetchableTopicResponse", topic_id=tid, partitions=tuple(parts))
                                     for tid, parts in by_topic.items()),
                     node_endpoints=())


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode_error(code, acquisition_lock_timeout=0, responses=(), node_endpoints=())

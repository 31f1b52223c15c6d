"""ShareAcknowledge (API 79), v1-v2: a share-group member's acknowledgements without a fetch
(ACCEPT, RELEASE, REJECT, GAP; v2 and KIP-1222's RENEW extend a lock), within its share session:
epoch 0 is refused (a session is opened by ShareFetch; INVALID_SHARE_SESSION_EPOCH), -1
acknowledges and then closes the session (what the member still holds goes back). Per partition:
INVALID_RECORD_STATE when it names a record the member does not hold (nothing of that partition
changes); the answer waits for the share group's state write that carries the acknowledgements
(`share_fetch.answer_durably`: KAFKA_STORAGE_ERROR for each partition if it failed).

Authorization as ShareFetch: READ on the group (top level) and READ on each topic."""
from __future__ import annotations

from typing import Any

from oncelog.broker.handlers.api_versions import share_groups_enabled
from oncelog.broker.handlers.share_fetch import (
    TP,
    PartitionAnswer,
    ack_batches,
    acknowledge,
    answer_durably,
    elsewhere,
    resolve,
)
from oncelog.broker.security.authorization import GROUP, Op, authorize
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.SHARE_ACKNOWLEDGE
E = ErrorCode


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    share = broker.groups.share
    lock_ms = 0

    def answer(code: int, message: str | None, answers: dict[TP, PartitionAnswer]) -> bytes:
        by_topic: dict[Any, list[Any]] = {}
        for (tid, p), a in sorted(answers.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            name = broker.logs.topic_name(tid)
            leader, leader_epoch = broker.logs.leader(name, p) if name is not None else (-1, -1)
            by_topic.setdefault(tid, []).append(rb(
                "PartitionData", partition_index=p, error_code=a.ack_error_code or a.error_code,
                error_message=a.ack_error_message or a.error_message,
                current_leader=rb("LeaderIdAndEpoch", leader_id=leader, leader_epoch=leader_epoch)))
        return rb.encode(throttle_time=0, error_code=code, error_message=message, acquisition_lock_timeout=lock_ms,
                         responses=tuple(rb("ShareAcknowledgeTopicResponse", topic_id=tid, partitions=tuple(ps))
                                         for tid, ps in by_topic.items()), node_endpoints=())

    if not share_groups_enabled(broker):
        return answer(E.UNSUPPORTED_VERSION, "Share groups are not enabled (share.version is 0).", {})
    group, member = str(r.group_id or ""), str(r.member_id or "")
    if not authorize(broker, Op.READ, GROUP, group):
        return answer(E.GROUP_AUTHORIZATION_FAILED, None, {})
    named: dict[TP, Any] = {}
    for t in r.topics:
        for p in t.partitions:
            named[(t.topic_id, int(p.partition_index))] = p
    if not broker.coordinates(group):
        return answer(E.NONE, None, elsewhere(named))
    lock_ms = share.lock_ms(group)
    resolved = resolve(broker, named)
    epoch = int(r.share_session_epoch)
    if epoch == 0:
        return answer(E.INVALID_SHARE_SESSION_EPOCH, "ShareAcknowledge cannot open a share session.",
                      resolved.refused)
    try:
        session = share.session(group, member, epoch)
    except KafkaProtocolError as e:
        return answer(e.code, str(e), resolved.refused)
    answers: dict[TP, PartitionAnswer] = dict(resolved.refused)
    acks = 0
    for tp, name in resolved.usable.items():
        a = answers.setdefault(tp, PartitionAnswer())
        acks = max(acks, acknowledge(broker, group, member, tp, name, ack_batches(named[tp]), a))
    if session is None:
        share.close_session(group, member)
    await answer_durably(broker, group, member, answers, acks, 0)
    return answer(E.NONE, None, answers)


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode_error(code, acquisition_lock_timeout=0, responses=(), node_endpoints=())

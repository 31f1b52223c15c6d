"""DescribeTransactions (API 65), v0: each id's state as its coordinator holds it (the state's
name, e.g. "Ongoing"); an unknown id TRANSACTIONAL_ID_NOT_FOUND, one this broker does not
coordinate NOT_COORDINATOR. Each id needs DESCRIBE (TRANSACTIONAL_ID_AUTHORIZATION_FAILED); its
partitions are listed only for topics the caller may DESCRIBE."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import TOPIC, TXN_ID, Op, authorize, authorized_names
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.DESCRIBE_TRANSACTIONS


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    states = []
    for tid in r.transactional_ids:
        code, meta = broker.txn.core.describe(str(tid))
        if not authorize(broker, Op.DESCRIBE, TXN_ID, str(tid)):
            code, meta = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None
        if meta is None:
            states.append(rb.error("TransactionState", code, transactional_id=tid, transaction_state="",
                                   transaction_start_time=0))
            continue
        topics: dict[str, list[int]] = {}
        described = authorized_names(broker, Op.DESCRIBE, TOPIC, (t for t, _ in meta.partitions), audit=False)
        for topic, index in sorted(meta.partitions):
            if topic in described:
                topics.setdefault(topic, []).append(index)
        states.append(rb("TransactionState", error_code=ErrorCode.NONE, transactional_id=tid,
                         transaction_state=meta.state.display_name, transaction_timeout=meta.timeout_ms,
                         # kio writes a datetime: -1 (no transaction started) becomes the epoch
                         transaction_start_time=max(meta.start_ms, 0), producer_id=meta.producer_id,
                         producer_epoch=meta.producer_epoch,
                         topics=tuple(rb("TopicData", topic=t, partitions=tuple(p)) for t, p in topics.items())))
    return rb.encode(throttle_time=0, transaction_states=tuple(states))


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode_error(code, transaction_states=tuple(
        rb.error("TransactionState", code, transactional_id=tid, transaction_state="", transaction_start_time=0)
        for tid in request.transactional_ids))

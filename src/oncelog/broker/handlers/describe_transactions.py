"""DescribeTransactions (API 65), v0: each id's state as its coordinator holds it (the state's
name, e.g. "Ongoing"); an unknown id TRANSACTIONAL_ID_NOT_FOUND, one this broker does not
coordinate NOT_COORDINATOR. Each id needs DESCRIBE (TRANSACTIONAL_ID_AUTHORIZATION_FAILED); its
partitions are listed only for topics the caller may DESCRIBE.

Bounded per request (issue 36): an id repeated in one request is described once, its other
entries INVALID_REQUEST (Kafka answers each; as for ConsumerGroupDescribe, so that an answer is
as large as the distinct transactions asked for, each as large as its owner made it), and other
clients are served between two ids."""
from __future__ import annotations

import asyncio
from typing import Any

from oncelog.broker.security.authorization import TXN_ID, Op, authorize, describable_topics
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.DESCRIBE_TRANSACTIONS


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    states = []
    seen: set[str] = set()
    for tid in r.transactional_ids:
        if str(tid) in seen:
            # one request naming a transaction of thousands of partitions thousands of times
            # made an answer of gigabytes, built on the event loop
            states.append(rb.error("TransactionState", ErrorCode.INVALID_REQUEST, transactional_id=tid,
                                   transaction_state="", transaction_start_time=0))
            continue
        seen.add(str(tid))
        if states:
            await asyncio.sleep(0)   # other clients' requests are served between two ids
        code, meta = broker.txn.core.describe(str(tid))
        if not authorize(broker, Op.DESCRIBE, TXN_ID, str(tid)):
            code, meta = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None
        if meta is None:
            states.append(rb.error("TransactionState", code, transactional_id=tid, transaction_state="",
                                   transaction_start_time=0))
            continue
        topics: dict[str, list[int]] = {}
        described = describable_topics(broker, (t for t, _ in meta.partitions))
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

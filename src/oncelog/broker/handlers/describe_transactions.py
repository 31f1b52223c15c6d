"""DescribeTransactions (API 65), v0: each id's state as its coordinator holds it (the state's
name, e.g. "Ongoing"); an unknown id TRANSACTIONAL_ID_NOT_FOUND, one this broker does not
coordinate NOT_COORDINATOR. Each id needs DESCRIBE (TRANSACTIONAL_ID_AUTHORIZATION_FAILED); its
partitions are listed only for topics the caller may DESCRIBE.

Bounded per request (issue 36): an id repeated in one request is described once, its other
entries INVALID_REQUEST (Kafka answers each; as for ConsumerGroupDescribe, so that an answer is
as large as the distinct transactions asked for, each as large as its owner made it), each is
encoded on its own (`protocol.describe_transactions`, by hand: a transaction lists every
partition it holds), and other clients are served between two ids."""
from __future__ import annotations

import asyncio
from typing import Any

from oncelog.broker.security.authorization import TXN_ID, Op, authorize, describable_topics
from oncelog.broker.services import BrokerServices
from oncelog.protocol import describe_transactions as wire
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.DESCRIBE_TRANSACTIONS


def _failed(code: int, tid: str) -> bytes:
    # Kafka's values of an error entry: its generated class's defaults (handleDescribeTransactions
    # sets only the id and the code), producer id and epoch 0, not -1
    return wire.encode_error(code, tid)


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    states: list[bytes] = []
    seen: set[str] = set()
    for tid in map(str, r.transactional_ids):
        if tid in seen:
            # one request naming a transaction of thousands of partitions thousands of times
            # made an answer of gigabytes, built on the event loop
            states.append(_failed(ErrorCode.INVALID_REQUEST, tid))
            continue
        seen.add(tid)
        if states:
            await asyncio.sleep(0)   # other clients' requests are served between two ids
        code, meta = broker.txn.core.describe(tid)
        if not authorize(broker, Op.DESCRIBE, TXN_ID, tid):
            code, meta = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None
        if meta is None:
            states.append(_failed(code, tid))
            continue
        topics: dict[str, list[int]] = {}
        described = describable_topics(broker, (t for t, _ in meta.partitions))
        for topic, index in sorted(meta.partitions):
            if topic in described:
                topics.setdefault(topic, []).append(index)
        # the start time as Kafka sends it: -1 while no transaction started (kio wrote 0, the
        # epoch, and Kafka's admin tools showed a transaction running since 1970)
        states.append(wire.encode_state(ErrorCode.NONE, tid, meta.state.display_name, meta.timeout_ms,
                                        meta.start_ms, meta.producer_id, meta.producer_epoch,
                                        list(topics.items())))
    return wire.encode_response(0, states)


def error_response(version: int, request: Any, code: int) -> bytes:
    return wire.encode_response(0, [wire.encode_error(code, str(tid)) for tid in request.transactional_ids])

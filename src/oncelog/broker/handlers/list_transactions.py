"""ListTransactions (API 66), v0-v1: the transactions this broker coordinates, filtered by state
names, producer ids and (v1, KIP-994) how long they have been running; unknown state names are
listed back. Only ids the caller may DESCRIBE are listed (DESCRIBE on the cluster shows nothing
more, as in Kafka).

Bounded per step (issue 36): the answer is decided on every id the coordinator holds, which any
principal with WRITE on some transactional ids can make many, and lists every one it may
describe (20,000 ids made one ListTransactions block the broker for 1.5 s): the ids are
authorized and encoded (`protocol.list_transactions`, by hand) `CHUNK` at a time, other clients'
requests served between two chunks."""
from __future__ import annotations

import asyncio
from typing import Any

from oncelog.broker.security.authorization import TXN_ID, Op, authorize
from oncelog.broker.services import BrokerServices
from oncelog.protocol import list_transactions as wire
from oncelog.protocol.api import ApiKey

API_KEY = ApiKey.LIST_TRANSACTIONS
CHUNK = 500   # ids authorized, then entries encoded, per step of the event loop (microseconds each)


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    code, unknown, metas = broker.txn.core.list_transactions(
        broker.now_ms(), [str(s) for s in r.state_filters], [int(p) for p in r.producer_id_filters],
        int(getattr(r, "duration_filter", -1)))
    listed = []
    for start in range(0, len(metas), CHUNK):
        if start:
            await asyncio.sleep(0)
        listed += [m for m in metas[start:start + CHUNK]
                   if authorize(broker, Op.DESCRIBE, TXN_ID, m.transactional_id, audit=False)]
    listed.sort(key=lambda m: m.transactional_id)
    states: list[bytes] = []
    for start in range(0, len(listed), CHUNK):
        await asyncio.sleep(0)
        states += [wire.encode_state(m.transactional_id, m.producer_id, m.state.display_name)
                   for m in listed[start:start + CHUNK]]
    return wire.encode_response(0, code, unknown, states)

"""ListTransactions (API 66), v0-v1: the transactions this broker coordinates, filtered by state
names, producer ids and (v1, KIP-994) how long they have been running; unknown state names are
listed back. Only ids the caller may DESCRIBE are listed."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import TXN_ID, Op, authorize
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey

API_KEY = ApiKey.LIST_TRANSACTIONS


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    code, unknown, metas = broker.txn.core.list_transactions(
        broker.now_ms(), [str(s) for s in r.state_filters], [int(p) for p in r.producer_id_filters],
        int(getattr(r, "duration_filter", -1)))
    return rb.encode(throttle_time=0, error_code=code, unknown_state_filters=tuple(unknown),
                     transaction_states=tuple(
                         rb("TransactionState", transactional_id=m.transactional_id, producer_id=m.producer_id,
                            transaction_state=m.state.display_name)
                         for m in sorted(metas, key=lambda m: m.transactional_id)
                         if authorize(broker, Op.DESCRIBE, TXN_ID, m.transactional_id, audit=False)))

"""EndTxn (API 26), v0-v3 (not v5: Transactions V2): Ongoing -> PrepareCommit/PrepareAbort,
answered once that record is fsynced; the markers and Complete* follow (`broker.txn_markers`).
Retries of a finished transaction answer NONE; the rest of the table is `core.txn`'s. Needs WRITE
on the transactional id."""
from __future__ import annotations

from oncelog.broker.authorization import TXN_ID, Op, require
from oncelog.core.txn.errors import for_version
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey

API_KEY = ApiKey.END_TXN


async def handle(broker, version: int, r) -> bytes:
    require(broker, Op.WRITE, TXN_ID, str(r.transactional_id))
    rb = entities.ResponseBuilder(API_KEY, version)
    code = await broker.txn.ensure_topic()
    if not code:
        answer = await broker.txn.execute(broker.txn.core.prepare_end_txn(
            str(r.transactional_id), int(r.producer_id), int(r.producer_epoch), bool(r.committed),
            broker.now_ms()))
        code = for_version(API_KEY, version, answer.error)
    return rb.encode(throttle_time=0, error_code=code)

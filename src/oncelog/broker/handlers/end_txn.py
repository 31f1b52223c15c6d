"""EndTxn (API 26), v0-v5: Ongoing -> PrepareCommit/PrepareAbort, answered once that record is
fsynced; the markers and Complete* follow (`broker.txn.marker_writer`). Retries of a finished
transaction answer NONE; the rest of the table is `core.txn`'s. Needs WRITE on the transactional
id.

v5 is Transactions V2 (KIP-890 part 2; the request's version decides, as Kafka's
`transactionVersionForEndTxn`): the coordinator bumps the epoch (a new producer id when it is
exhausted), writes the markers with it, and answers the producer id and epoch the client goes on
with; a retry is told them too."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import TXN_ID, Op, require
from oncelog.broker.services import BrokerServices
from oncelog.core.txn.errors import for_version
from oncelog.core.txn.state import TV_0, TV_2
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey

API_KEY = ApiKey.END_TXN
FIRST_V2 = 5


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    require(broker, Op.WRITE, TXN_ID, str(r.transactional_id))
    rb = entities.ResponseBuilder(API_KEY, version)
    code = await broker.txn.ensure_topic()
    pid, epoch = -1, -1
    if not code:
        answer = await broker.txn.execute(broker.txn.core.prepare_end_txn(
            str(r.transactional_id), int(r.producer_id), int(r.producer_epoch), bool(r.committed),
            broker.now_ms(), transaction_version=TV_2 if version >= FIRST_V2 else TV_0))
        code = for_version(API_KEY, version, answer.error)
        pid, epoch = answer.producer_id, answer.producer_epoch
    if version >= FIRST_V2:
        return rb.encode(throttle_time=0, error_code=code, producer_id=pid, producer_epoch=epoch)
    return rb.encode(throttle_time=0, error_code=code)

"""AddOffsetsToTxn (API 25), v0-v3: the group's `__consumer_offsets` partition
(abs(hash(group)) % offsets.topic.num.partitions) joins the transaction, so that its marker makes
the TxnOffsetCommit offsets visible or drops them. Needs WRITE on the transactional id and READ
on the group."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import GROUP, TXN_ID, Op, require
from oncelog.broker.services import BrokerServices
from oncelog.core.txn.errors import for_version
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey

API_KEY = ApiKey.ADD_OFFSETS_TO_TXN


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    require(broker, Op.WRITE, TXN_ID, str(r.transactional_id))
    require(broker, Op.READ, GROUP, str(r.group_id))
    rb = entities.ResponseBuilder(API_KEY, version)
    code = await broker.txn.ensure_topic()
    if not code:
        answer = await broker.txn.execute(broker.txn.core.prepare_add_offsets(
            str(r.transactional_id), int(r.producer_id), int(r.producer_epoch), str(r.group_id),
            broker.now_ms()))
        code = for_version(API_KEY, version, answer.error)
    return rb.encode(throttle_time=0, error_code=code)

"""An internal topic (`__consumer_offsets`, `__transaction_state`) created on its coordinator's
first need: once, whichever of many concurrent requests gets there first; one that another
broker created meanwhile is no failure."""
from __future__ import annotations

import asyncio
import logging

from oncelog.broker.logs.seam import Logs
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

log = logging.getLogger(__name__)


async def ensure_internal_topic(logs: Logs, lock: asyncio.Lock, name: str, partitions: int,
                                overrides: dict[str, str], now_ms: int) -> ErrorCode:
    """NONE once the topic exists, or COORDINATOR_NOT_AVAILABLE (what the coordinator's request
    is answered meanwhile, so the client retries) when creating it failed."""
    if name in logs.topics:
        return ErrorCode.NONE
    async with lock:
        if name not in logs.topics:
            try:
                await logs.create_topic(name, partitions, overrides, now_ms)
                log.info("created %s with %d partitions", name, partitions)
            except KafkaProtocolError as e:
                if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                    log.warning("creating %s failed: %s", name, e)
                    return ErrorCode.COORDINATOR_NOT_AVAILABLE
    return ErrorCode.NONE

"""InitProducerId (API 22), v0-v5, for idempotent producers (no transactional id).

Without a transactional id the answer is always a new producer id at epoch 0, whatever id and
epoch the request names (v3+), as Kafka's TransactionCoordinator.handleInitProducerId answers it:
the idempotent producer bumps its epoch locally (KIP-360), and bumping an id the caller names
would let a client take over an id it was never given, or one not yet issued. A transactional id is
refused until oncelog has transactions.
"""
from __future__ import annotations

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.INIT_PRODUCER_ID


async def handle(broker, version: int, request) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    if request.transactional_id is not None:
        return rb.encode(throttle_time=0, error_code=ErrorCode.INVALID_REQUEST, producer_id=-1,
                         producer_epoch=-1)
    try:
        pid = await broker.producer_ids.generate_producer_id()
    except KafkaProtocolError as e:
        return rb.encode(throttle_time=0, error_code=e.code, producer_id=-1, producer_epoch=-1)
    return rb.encode(throttle_time=0, error_code=ErrorCode.NONE, producer_id=pid, producer_epoch=0)

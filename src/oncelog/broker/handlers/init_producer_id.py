"""InitProducerId (API 22), v0-v5, for idempotent producers (no transactional id).

A new producer gets a fresh id with epoch 0 from the producer-id source (local blocks, or the
controller's KIP-730 blocks). A producer that sends its current id and epoch (v3+, KIP-360) gets
the same id with the epoch bumped, or a fresh id when the epoch would overflow.
"""
from __future__ import annotations

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.INIT_PRODUCER_ID
_MAX_EPOCH = 32767


async def handle(broker, version: int, body) -> bytes:
    request = entities.decode_request(API_KEY, version, body)
    rb = entities.ResponseBuilder(API_KEY, version)
    if request.transactional_id is not None:
        return rb.encode(throttle_time=0, error_code=ErrorCode.INVALID_REQUEST, producer_id=-1,
                         producer_epoch=-1)
    pid = int(getattr(request, "producer_id", -1))
    epoch = int(getattr(request, "producer_epoch", -1))
    if pid >= 0 and 0 <= epoch < _MAX_EPOCH - 1:
        return rb.encode(throttle_time=0, error_code=ErrorCode.NONE, producer_id=pid,
                         producer_epoch=epoch + 1)
    try:
        pid = await broker.producer_ids.generate_producer_id()
    except KafkaProtocolError as e:
        return rb.encode(throttle_time=0, error_code=e.code, producer_id=-1, producer_epoch=-1)
    return rb.encode(throttle_time=0, error_code=ErrorCode.NONE, producer_id=pid, producer_epoch=0)

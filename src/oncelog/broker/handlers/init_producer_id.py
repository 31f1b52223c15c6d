"""InitProducerId (API 22), v0-v6.

Without a transactional id the answer is always a new producer id at epoch 0, whatever id and
epoch the request names (v3+), as Kafka's TransactionCoordinator.handleInitProducerId answers it:
the idempotent producer bumps its epoch locally (KIP-360), and bumping an id the caller names
would let a client take over an id it was never given, or one not yet issued.

With a transactional id the transaction coordinator decides (`core.txn`: fencing, epoch bump,
PrepareEpochFence, the KIP-360 retry with the caller's id and epoch, a new id when the epoch is
exhausted); PRODUCER_FENCED is told as INVALID_PRODUCER_EPOCH below v4 (`core.txn.errors`).
Authorization: WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED); without one,
IDEMPOTENT_WRITE on the cluster or WRITE on any topic (KIP-679), else CLUSTER_AUTHORIZATION_FAILED.

v6 (KIP-939, docs/transactions.md "Two-phase commit"): Enable2Pc needs TWO_PHASE_COMMIT on the
transactional id as well as WRITE (neither implies the other; ALL implies both), else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which is also the answer where the broker's
transaction.two.phase.commit.enable is false. KeepPreparedTxn without a transactional id or without
Enable2Pc is INVALID_REQUEST. OngoingTxnProducerId/Epoch name the transaction a KeepPreparedTxn kept.
"""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import (
    TOPIC,
    TXN_ID,
    Op,
    authorize_by_resource_type,
    authorize_cluster,
    require,
)
from oncelog.broker.services import BrokerServices
from oncelog.core.txn.errors import for_version
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.INIT_PRODUCER_ID


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    enable_2pc = bool(getattr(request, "enable2_pc", False))
    keep_prepared = bool(getattr(request, "keep_prepared_txn", False))
    if request.transactional_id is not None:
        require(broker, Op.WRITE, TXN_ID, str(request.transactional_id))
        if enable_2pc:
            require(broker, Op.TWO_PHASE_COMMIT, TXN_ID, str(request.transactional_id))
        return await _transactional(broker, version, request, rb, enable_2pc, keep_prepared)
    if keep_prepared or enable_2pc:
        # nothing to keep, and no transactions to make two-phase, without a transactional id
        return rb.encode(throttle_time=0, error_code=ErrorCode.INVALID_REQUEST, producer_id=-1, producer_epoch=-1)
    if not (authorize_cluster(broker, Op.IDEMPOTENT_WRITE, audit=False)
            or authorize_by_resource_type(broker, Op.WRITE, TOPIC)):
        return rb.encode(throttle_time=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, producer_id=-1,
                         producer_epoch=-1)
    try:
        pid = await broker.producer_ids.generate_producer_id()
    except KafkaProtocolError as e:
        return rb.encode(throttle_time=0, error_code=e.code, producer_id=-1, producer_epoch=-1)
    return rb.encode(throttle_time=0, error_code=ErrorCode.NONE, producer_id=pid, producer_epoch=0)


async def _transactional(broker: BrokerServices, version: int, request: Any,
                        rb: entities.ResponseBuilder, enable_2pc: bool, keep_prepared: bool) -> bytes:
    tid = str(request.transactional_id)
    code = await broker.txn.ensure_topic() if tid else ErrorCode.NONE
    if code:
        return rb.encode(throttle_time=0, error_code=code, producer_id=-1, producer_epoch=-1)
    answer = await broker.txn.execute(broker.txn.core.prepare_init_producer_id(
        tid, entities.millis(request.transaction_timeout), broker.now_ms(),
        int(getattr(request, "producer_id", -1)), int(getattr(request, "producer_epoch", -1)),
        enable_2pc=enable_2pc, keep_prepared=keep_prepared))
    return rb.encode(throttle_time=0, error_code=for_version(API_KEY, version, answer.error),
                     producer_id=answer.producer_id, producer_epoch=answer.producer_epoch,
                     ongoing_txn_producer_id=answer.ongoing_producer_id,
                     ongoing_txn_producer_epoch=answer.ongoing_producer_epoch)

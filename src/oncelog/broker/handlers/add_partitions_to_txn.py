"""AddPartitionsToTxn (API 24), v0-v5: partitions join a transaction (`core.txn`).

v0-3 carry one transaction; v4-v5 a batch of them (brokers only, KIP-890), each either added or,
with VerifyOnly, checked without a write (NONE or TRANSACTION_ABORTABLE per partition). A v5 add
is a partition leader's for a Transactions V2 client (Produce v12+, TxnOffsetCommit v5+): the
transaction is marked V2 (Kafka's "version > 4 is TV_2"). A partition of
an unknown topic answers UNKNOWN_TOPIC_OR_PARTITION and the rest of its transaction
OPERATION_NOT_ATTEMPTED, as Kafka does; nothing is added then.
Authorization: v0-3 WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED for all)
and on each topic (TOPIC_AUTHORIZATION_FAILED, the rest OPERATION_NOT_ATTEMPTED), which a client
never has on an internal topic (as Kafka: `__consumer_offsets` joins through AddOffsetsToTxn);
v4 from brokers only (`authorization.require_broker`), else CLUSTER_AUTHORIZATION_FAILED.

A partition named more than once is one partition, answered once (Kafka's answer is a map too),
and the work of a request is that of its distinct partitions (issue 36: one request naming a
partition 500,000 times held the event loop for seconds, checking it each time); one already in
the transaction is not written again (`core.txn`).
"""
from __future__ import annotations

import asyncio
from typing import Any

from oncelog.broker.security.authorization import TOPIC, TXN_ID, Op, authorize, authorized_names, require_broker
from oncelog.broker.security.internal_topics import refusal
from oncelog.broker.services import BrokerServices
from oncelog.core.topic_names import is_internal
from oncelog.core.txn.errors import for_version
from oncelog.core.txn.log_format import CONSUMER_OFFSETS_TOPIC
from oncelog.core.txn.state import TV_0, TV_2
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.ADD_PARTITIONS_TO_TXN
E = ErrorCode
FIRST_V2 = 5


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    if version <= 3:
        results = await _one(broker, version, str(r.v3_and_below_transactional_id),
                             int(r.v3_and_below_producer_id), int(r.v3_and_below_producer_epoch), False,
                             r.v3_and_below_topics)
        return rb.encode(throttle_time=0, results_by_topic_v3_and_below=_topic_results(rb, results))
    require_broker(broker, f"AddPartitionsToTxn v{version}")
    answers = await asyncio.gather(*(
        _one(broker, version, str(t.transactional_id), int(t.producer_id), int(t.producer_epoch),
             bool(t.verify_only), t.topics) for t in r.transactions))
    return rb.encode(throttle_time=0, error_code=E.NONE, results_by_transaction=tuple(
        rb("AddPartitionsToTxnResult", transactional_id=t.transactional_id,
           topic_results=_topic_results(rb, results))
        for t, results in zip(r.transactions, answers)))


async def _one(broker: BrokerServices, version: int, tid: str, pid: int, epoch: int, verify_only: bool,
               topics: Any) -> dict[tuple[str, int], int]:
    distinct: dict[str, set[int]] = {}
    for t in topics:
        distinct.setdefault(str(t.name), set()).update(t.partitions)   # C speed, however long the list
    wanted = [(topic, int(i)) for topic, indexes in distinct.items() for i in sorted(indexes)]
    if version <= 3:
        if not authorize(broker, Op.WRITE, TXN_ID, tid):
            return {tp: E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED for tp in wanted}
        writable = authorized_names(broker, Op.WRITE, TOPIC, (t for t, _ in wanted))
        for topic in [t for t in writable if is_internal(t)]:
            refusal("add to a transaction", topic)
            writable.discard(topic)
        if len(writable) < len({t for t, _ in wanted}):
            return {tp: E.TOPIC_AUTHORIZATION_FAILED if tp[0] not in writable else E.OPERATION_NOT_ATTEMPTED
                    for tp in wanted}
    unknown = {tp for tp in wanted if not _exists(broker, *tp)}
    if unknown:
        return {tp: E.UNKNOWN_TOPIC_OR_PARTITION if tp in unknown else E.OPERATION_NOT_ATTEMPTED for tp in wanted}
    code = await broker.txn.ensure_topic()
    if code:
        return {tp: code for tp in wanted}
    core = broker.txn.core
    if verify_only:
        return core.verify_partitions(tid, pid, epoch, wanted)
    answer = await broker.txn.execute(core.prepare_add_partitions(
        tid, pid, epoch, wanted, broker.now_ms(), transaction_version=TV_2 if version >= FIRST_V2 else TV_0))
    code = for_version(API_KEY, version, answer.error)
    return {tp: code for tp in wanted}


def _exists(broker: BrokerServices, topic: str, index: int) -> bool:
    if topic == CONSUMER_OFFSETS_TOPIC:
        # no topic in oncelog (offsets are files), but a transaction's member all the same: a
        # TxnOffsetCommit on another broker verifies it here
        return 0 <= index < int(broker.config["offsets.topic.num.partitions"])
    info = broker.logs.topics.get(topic)
    return info is not None and 0 <= index < info.partitions


def _topic_results(rb: entities.ResponseBuilder, results: dict[tuple[str, int], int]) -> tuple[Any, ...]:
    by_topic: dict[str, list[Any]] = {}
    for (topic, index), code in results.items():
        by_topic.setdefault(topic, []).append(
            rb("AddPartitionsToTxnPartitionResult", partition_index=index, partition_error_code=code))
    return tuple(rb("AddPartitionsToTxnTopicResult", name=topic, results_by_partition=tuple(parts))
                 for topic, parts in by_topic.items())


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    if version <= 3:
        return rb.encode_error(code, results_by_topic_v3_and_below=_topic_results(
            rb, {(str(t.name), int(i)): code for t in request.v3_and_below_topics for i in t.partitions}))
    return rb.encode_error(code, results_by_transaction=())

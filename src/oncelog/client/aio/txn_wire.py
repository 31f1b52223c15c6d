"""The transaction manager's requests on the wire: `txn_core`'s plain request shapes encoded at a
negotiated version, and the answers decoded back into its response shapes.

InitProducerId goes through the hand-written codec (error codes read as integers); the others
through kio. AddPartitionsToTxn stops at v3: v4 is the broker-to-broker (verify-only) form.
FindCoordinator v4 asks for a list of keys; the manager asks for one. EndTxn and TxnOffsetCommit
v5 mean Transactions V2: `version` caps them at v4 unless the request is V2's, and the Produce
requests of a V1 transaction at v11 (Java's LAST_STABLE_VERSION_BEFORE_TRANSACTION_V2)."""
from __future__ import annotations

from typing import Any

from oncelog.client.aio import wire
from oncelog.client.txn_core import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)
from oncelog.client.types import TopicPartition
from oncelog.protocol import init_producer_id
from oncelog.protocol.api import ApiKey
from oncelog.protocol.entities import RequestBuilder

API_OF: dict[type, int] = {
    FindCoordinatorRequest: ApiKey.FIND_COORDINATOR,
    InitProducerIdRequest: ApiKey.INIT_PRODUCER_ID,
    AddPartitionsToTxnRequest: ApiKey.ADD_PARTITIONS_TO_TXN,
    AddOffsetsToTxnRequest: ApiKey.ADD_OFFSETS_TO_TXN,
    TxnOffsetCommitRequest: ApiKey.TXN_OFFSET_COMMIT,
    EndTxnRequest: ApiKey.END_TXN,
}


LAST_V1: dict[int, int] = {ApiKey.END_TXN: 4, ApiKey.TXN_OFFSET_COMMIT: 4, ApiKey.PRODUCE: 11}


# KIP-939's InitProducerId: asked for only by a two-phase-commit producer (CLIENT_VERSIONS keeps
# every other InitProducerId at v4); a broker without it answers UNSUPPORTED_VERSION, fatal
TWO_PC_INIT_VERSION = 6


def two_phase_version(request: Any, broker_versions: dict[int, tuple[int, int]]) -> int | None:
    """The version of a two-phase-commit InitProducerId (v6), None where the broker lacks it
    (Kafka's releases do not advertise it: its latest version is unstable)."""
    if not (isinstance(request, InitProducerIdRequest) and (request.enable_2pc or request.keep_prepared_txn)):
        return None
    lo, hi = broker_versions.get(ApiKey.INIT_PRODUCER_ID, (0, -1))
    return TWO_PC_INIT_VERSION if lo <= TWO_PC_INIT_VERSION <= hi else -1


def version(request: Any, broker_max: int) -> int:
    """The version to send `request` at, given the broker's highest."""
    api = API_OF[type(request)]
    if api in LAST_V1 and not getattr(request, "v2", False):
        return min(broker_max, LAST_V1[api])
    return broker_max


def _by_topic(tps) -> dict[str, list]:
    out: dict[str, list] = {}
    for tp, *rest in tps:
        out.setdefault(tp.topic, []).append((tp.partition, *rest))
    return out


def encode(request: Any, version: int) -> bytes:
    api = API_OF[type(request)]
    rq = RequestBuilder(api, version)
    r = request
    if isinstance(r, FindCoordinatorRequest):
        if version >= 4:
            return rq.encode(key_type=r.key_type, coordinator_keys=(r.key,))
        return rq.encode(key=r.key, key_type=r.key_type)
    if isinstance(r, InitProducerIdRequest):
        return init_producer_id.encode_request(version, r.producer_id, r.producer_epoch,
                                               transactional_id=r.transactional_id,
                                               transaction_timeout_ms=r.transaction_timeout_ms,
                                               enable_2pc=r.enable_2pc, keep_prepared_txn=r.keep_prepared_txn)
    if isinstance(r, AddPartitionsToTxnRequest):
        topics = tuple(rq("AddPartitionsToTxnTopic", name=t, partitions=tuple(p for (p,) in ps))
                       for t, ps in _by_topic((tp,) for tp in r.partitions).items())
        return rq.encode(v3_and_below_transactional_id=r.transactional_id,
                         v3_and_below_producer_id=r.producer_id,
                         v3_and_below_producer_epoch=r.producer_epoch,
                         v3_and_below_topics=topics)
    if isinstance(r, AddOffsetsToTxnRequest):
        return rq.encode(transactional_id=r.transactional_id, producer_id=r.producer_id,
                         producer_epoch=r.producer_epoch, group_id=r.group_id)
    if isinstance(r, TxnOffsetCommitRequest):
        topics = tuple(
            rq("TxnOffsetCommitRequestTopic", name=t, partitions=tuple(
                rq("TxnOffsetCommitRequestPartition", partition_index=p, committed_offset=om.offset,
                   committed_leader_epoch=om.leader_epoch, committed_metadata=om.metadata)
                for p, om in ps))
            for t, ps in _by_topic(r.offsets).items())
        return rq.encode(transactional_id=r.transactional_id, group_id=r.group_id,
                         producer_id=r.producer_id, producer_epoch=r.producer_epoch,
                         generation_id=r.generation_id, member_id=r.member_id,
                         group_instance_id=r.group_instance_id, topics=topics)
    assert isinstance(r, EndTxnRequest)
    return rq.encode(transactional_id=r.transactional_id, producer_id=r.producer_id,
                     producer_epoch=r.producer_epoch, committed=r.committed)


def decode(request: Any, version: int, body) -> object:
    """The answer to `request`, in txn_core's shape. Error codes stay integers."""
    if isinstance(request, InitProducerIdRequest):
        code, pid, epoch = init_producer_id.decode_response(version, body)
        return InitProducerIdResponse(code, pid, epoch, *init_producer_id.decode_ongoing(version, body))
    r = wire.decode(API_OF[type(request)], version, body)
    if isinstance(request, FindCoordinatorRequest):
        c = r.coordinators[0] if version >= 4 else r
        return FindCoordinatorResponse(int(c.error_code), c.node_id, c.host, c.port)
    if isinstance(request, AddPartitionsToTxnRequest):
        return AddPartitionsToTxnResponse({
            TopicPartition(t.name, p.partition_index): int(p.partition_error_code)
            for t in r.results_by_topic_v3_and_below for p in t.results_by_partition})
    if isinstance(request, AddOffsetsToTxnRequest):
        return AddOffsetsToTxnResponse(int(r.error_code))
    if isinstance(request, TxnOffsetCommitRequest):
        return TxnOffsetCommitResponse({TopicPartition(t.name, p.partition_index): int(p.error_code)
                                        for t in r.topics for p in t.partitions})
    return EndTxnResponse(int(r.error_code), int(getattr(r, "producer_id", -1)), int(getattr(r, "producer_epoch", -1)))


def error_response(request: Any, code: int) -> object:
    """The answer a broker would give with `code` everywhere (e.g. an API it lacks)."""
    if isinstance(request, FindCoordinatorRequest):
        return FindCoordinatorResponse(code)
    if isinstance(request, InitProducerIdRequest):
        return InitProducerIdResponse(code)
    if isinstance(request, AddPartitionsToTxnRequest):
        return AddPartitionsToTxnResponse(dict.fromkeys(request.partitions, code))
    if isinstance(request, AddOffsetsToTxnRequest):
        return AddOffsetsToTxnResponse(code)
    if isinstance(request, TxnOffsetCommitRequest):
        return TxnOffsetCommitResponse({tp: code for tp, _ in request.offsets})
    return EndTxnResponse(code)

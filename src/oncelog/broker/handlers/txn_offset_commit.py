"""TxnOffsetCommit (API 28), v0-v5: a transaction's consumer offsets, kept pending (durable,
invisible to OffsetFetch) until the transaction's marker on the group's `__consumer_offsets`
partition makes them visible (COMMIT) or drops them (ABORT).

Checks, in Kafka's order: this broker coordinates the group; the group's offsets partition is in
the transaction, asked of the id's coordinator wherever it runs (`broker.txn.add_partitions`):
up to v4 verified (KIP-890 part 1: the client sent AddOffsetsToTxn), from v5 added (Transactions
V2: the client sends no AddOffsetsToTxn); refusals are INVALID_TXN_STATE below v4,
INVALID_PRODUCER_EPOCH for a fenced epoch; KIP-447 member data from v3 (ILLEGAL_GENERATION,
UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID).
Authorization first: WRITE on the transactional id, READ on the group (for every partition),
READ on each topic (TOPIC_AUTHORIZATION_FAILED for its partitions). A request none of whose
partitions is readable and known is answered at once, the transaction untouched (Kafka's
KafkaApis: no call to the coordinator).
A partition whose metadata is longer than `offset.metadata.max.bytes` is answered
OFFSET_METADATA_TOO_LARGE and not kept, as Kafka does (issue 36: 32,000-character metadata on
2,000 partitions made each request write 64 MB of pending offsets).
"""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import GROUP, TOPIC, TXN_ID, Op, authorized_names, require
from oncelog.broker.services import BrokerServices
from oncelog.broker.txn import add_partitions
from oncelog.core.txn.errors import for_version, verification_error
from oncelog.protocol import entities, offset_commit_answers
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode
from oncelog.storage.group_offsets import Committed

API_KEY = ApiKey.TXN_OFFSET_COMMIT
E = ErrorCode
FIRST_V2 = 5   # TxnOffsetCommit v5+: Transactions V2 (the group's offsets partition is added)


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    group = str(r.group_id)
    require(broker, Op.WRITE, TXN_ID, str(r.transactional_id))
    require(broker, Op.READ, GROUP, group)
    readable = authorized_names(broker, Op.READ, TOPIC, (str(t.name) for t in r.topics))
    offsets, unknown, denied, too_large = {}, set(), set(), set()
    max_metadata = broker.config["offset.metadata.max.bytes"]
    for t in r.topics:
        for p in t.partitions:
            tp = (str(t.name), int(p.partition_index))
            if tp[0] not in readable:
                denied.add(tp)
                continue
            info = broker.logs.topics.get(tp[0])
            if info is None or not 0 <= tp[1] < info.partitions:
                unknown.add(tp)
                continue
            if p.committed_metadata is not None and len(p.committed_metadata) > max_metadata:
                too_large.add(tp)
                continue
            offsets[tp] = Committed(int(p.committed_offset), p.committed_metadata,
                                    int(getattr(p, "committed_leader_epoch", -1)))
    error: int = E.NONE
    if not offsets:
        # every partition refused (not readable, too large) or unknown: answered without the coordinator, as
        # Kafka does (issue 36: v5 added the group's offsets partition to the transaction anyway)
        pass
    elif not broker.coordinates(group):
        error = E.NOT_COORDINATOR
    else:
        # a marker for the producer while it waits ends the transaction it asked about
        pid, groups = int(r.producer_id), broker.groups
        # the records first (in parts, other requests served between): no wait after the check
        stamped, frames = await groups.txn_records(group, offsets)
        offsets_tp = broker.txn.core.offsets_partition(group)
        epoch, v2 = int(r.producer_epoch), version >= FIRST_V2
        codes = await add_partitions.check(
            broker, str(r.transactional_id), pid, epoch, [offsets_tp], v2,
            lambda: groups.begin_txn_commit(pid, epoch, v2), lambda check: check.valid,
            lambda check: groups.end_txn_commit(pid, check))
        code = codes[offsets_tp]
        if code:
            error = verification_error(code, API_KEY, version)
        else:   # written with no await since the check: no marker came in between
            error = groups.txn_commit(group, pid, int(r.producer_epoch), int(getattr(r, "generation_id", -1)),
                                      str(getattr(r, "member_id", "") or ""), getattr(r, "group_instance_id", None),
                                      stamped, sync=False, frames=frames)
            if not error:   # answered once fsynced (a marker meanwhile answers it stored)
                error = await groups.txn_flushed(group, pid)
    error = for_version(API_KEY, version, error)
    topics = [(str(t.name), [(int(p.partition_index), offset_commit_answers.partition_code(
        (str(t.name), int(p.partition_index)), error, denied, unknown, too_large)) for p in t.partitions])
        for t in r.topics]
    broker.metrics.count_errors("TxnOffsetCommit", (code for _t, ps in topics for _i, code in ps))
    return offset_commit_answers.txn_offset_commit(version, topics)


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode_error(code, topics=tuple(
        rb.error("TxnOffsetCommitResponseTopic", code, name=t.name, partitions=tuple(
            rb.error("TxnOffsetCommitResponsePartition", code, partition_index=p.partition_index)
            for p in t.partitions))
        for t in request.topics))

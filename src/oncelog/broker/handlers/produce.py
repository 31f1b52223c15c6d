"""Produce (API 0), v0-v14: validate, deduplicate and append through each Partition.

v0-v2 carry v0/v1 message sets (a topic of the current format stores them up-converted to v2,
`Partition.append_from_client`); from v3 a v0/v1 message set is INVALID_RECORD, as Kafka's
ProduceRequest.validateRecords answers. A v2 batch in v0-v2 is accepted, as Kafka accepts it.

Every answer for a partition that exists carries its log start offset, refusals included: a
producer tells a lost write (UNKNOWN_PRODUCER_ID above its last acknowledged offset) from retention
by comparing them. v14 answers carry the topic's `producer.state.batches.to.retain` per partition
and per topic (`protocol/produce.py`).

Transactional batches (KIP-98, KIP-890): a transactional batch needs the request's transactional
id (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as Kafka answers a null id). It is appended at
once when its producer already has a transaction open in the partition at that epoch; otherwise
the transaction coordinator is asked first, once for all such partitions of the request
(`broker.txn.add_partitions`): up to v11 (Transactions V1) whether the partition is in the
transaction (AddPartitionsToTxn VerifyOnly; skipped with
transaction.partition.verification.enable=false), from v12 (Transactions V2) to add it. A refusal
is answered per version (`core.txn.errors.verification_error`: INVALID_TXN_STATE below v11,
INVALID_PRODUCER_EPOCH for a fenced epoch). A verification guard, cleared by a marker for the
producer that may have ended the batch's transaction (under Transactions V2 not by the previous
transaction's, `core.txn.verification`), refuses a batch whose transaction ended while it
waited; it is checked again where the
batch is appended, for every transactional batch of the request (Kafka's
`batchMissingRequiredVerification`): one that would open a transaction in its partition without a
guard still valid — its producer's transaction there ended while another partition of the request
was being verified — is refused (TRANSACTION_ABORTABLE, INVALID_TXN_STATE below v11) instead of
opening a transaction its coordinator never registered. With no coordinator wired
(`broker.txn_check is None`) batches are accepted as they come.
A Produce that waits for a verification holds up the requests behind it on its connection (Kafka
mutes the connection until the answer is sent): a batch behind it is checked once the first is in
the log, and needs no verification then. Checks of one producer that overlap all the same (two
connections) share one guard (`core.txn.verification`).
A transactional id on a request of plain batches is ignored, as Kafka ignores it.

Durability: appends run at once, in order; on a topic without write.caching an acks=all answer
(a new batch or a duplicate's original) then waits for the group commit to fsync it
(broker.group_commit), as Kafka's delayed produce waits for the high watermark. That wait alone
does not hold up the Produce requests behind it on the connection (the handler returns a
`broker.net.later.Later`): they are appended meanwhile and join the same fsync; the answers go out
in order. A batch whose
fsync failed is answered KAFKA_STORAGE_ERROR (storage cut it: a retry is appended afresh), one
still not durable after the request's timeout REQUEST_TIMED_OUT. acks=1 is answered from the page
cache; its records become visible with the next fsync.

Authorization (Kafka's handleProduceRequest): a request with transactional batches needs WRITE on
its transactional id (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED for every partition); each topic
needs WRITE, checked before its existence (TOPIC_AUTHORIZATION_FAILED). An internal topic
(`__transaction_state`) is then refused INVALID_TOPIC_EXCEPTION (`broker.security.internal_topics`). Quota
(`producer_byte_rate`): the records' bytes are counted; over the quota the answer carries the
throttle time and the connection is muted for it (KIP-219); the records are appended all the same.
"""
from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from oncelog.broker.net.later import Later
from oncelog.broker.security.authorization import TOPIC, TXN_ID, Op, authorize, authorized_names
from oncelog.broker.security.internal_topics import refusal
from oncelog.broker.security.quotas import throttle
from oncelog.broker.services import BrokerServices
from oncelog.broker.txn import add_partitions
from oncelog.core.topic_names import is_internal
from oncelog.core.txn.errors import verification_error
from oncelog.core.txn.verification import Guard
from oncelog.protocol import produce as wire
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.records import BatchHeader, iter_batches, magic_of
from oncelog.storage.partition import Partition

API_KEY = 0
FIRST_V2 = 12   # Produce v12+: Transactions V2 (the leader adds the partition to the transaction)


async def handle(broker: BrokerServices, version: int, request: wire.ProduceRequest) -> bytes | Later | None:
    now = broker.now_ms()
    refuse = _refusal(request)
    tid = request.transactional_id
    # (without a transactional id, each transactional batch is refused below, as Kafka answers a null id)
    if (tid is not None and broker.authorizer is not None and refuse is None
            and any(_transactional_header(records) is not None
                    for _topic, parts in request.topics for _index, records in parts)
            and not authorize(broker, Op.WRITE, TXN_ID, tid)):
        broker.metrics.count_errors("Produce", (ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                                                for _topic, parts in request.topics for _part in parts))
        return error_response(version, request, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    topics, plan, size = _check_partitions(broker, version, request, refuse)
    transactional = [a for a in plan if a is not None and a.header is not None]
    checks = _Checks(verify=bool(transactional) and tid is not None and broker.txn_check is not None
                     and (version >= FIRST_V2 or broker.txn_verification))
    try:
        if transactional:
            refusals = await _check_transactional(broker, version, tid, transactional, checks)
            now = broker.now_ms()
        else:
            refusals = {}
        appended, waits = _append(broker, version, request, plan, refusals, checks, now)
    finally:
        checks.end()
    broker.metrics.count_errors("Produce", (p.error_code for t in topics for p in t.partitions))
    if appended:
        broker.data_appended()
    throttle_ms = broker.quotas.record_produce(size) if size else 0
    throttle(throttle_ms)
    if request.acks == 0:
        return None
    if waits:
        return _answer_when_durable(broker, version, topics, waits, request.timeout_ms, throttle_ms)
    return wire.encode_response(version, topics, throttle_ms)


@dataclass(slots=True)
class _Append:
    """A partition whose records passed the request's checks, and where its answer goes."""
    answer: wire.TopicResponse
    slot: int
    topic: str
    index: int
    partition: Partition
    header: BatchHeader | None   # of its transactional batch, else None


# an acks=all answer waiting for its fsync, and the offset its records end below
_Wait = tuple[wire.PartitionResponse, Partition, int]
# one verification attempt's guards: a guard per partition asked about (`core.txn.verification`)
_Token = list[tuple[tuple[str, int], Partition, Guard]]


class _Checks:
    """The request's verification guards (`core.txn.verification`), per partition the one its
    last check took, held until its batch is appended, where storage checks it again."""

    def __init__(self, verify: bool) -> None:
        self.verify = verify
        self.guards: dict[tuple[str, int], Guard] = {}
        self.held: list[tuple[Partition, int, Guard]] = []   # (partition, producer id, guard) to end

    def end(self) -> None:
        for partition, pid, guard in self.held:
            partition.verification_guards.end(pid, guard)
        self.held.clear()


def _check_partitions(broker: BrokerServices, version: int, request: wire.ProduceRequest,
                      refuse: tuple[int, str] | None
                      ) -> tuple[list[wire.TopicResponse], list[_Append | None], int]:
    """Every partition of the request checked before anything is appended: (the answers, the plan,
    the records' bytes for the quota). The plan has one entry per partition of the request, in its
    order: None where the partition is answered already (refused), else the `_Append` whose answer
    `_append` fills in."""
    names = [(_topic_name(broker, key), key, parts) for key, parts in request.topics]
    writable = authorized_names(broker, Op.WRITE, TOPIC, (n for n, _key, _parts in names if n is not None))
    topics: list[wire.TopicResponse] = []
    plan: list[_Append | None] = []
    size = 0
    for name, topic_key, parts in names:
        answer = wire.TopicResponse(topic_key, [])
        topics.append(answer)
        if name is not None and name not in writable:
            answer.partitions = [wire.PartitionResponse(index, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                                 for index, _records in parts]
            plan.extend(None for _part in parts)
            continue
        if is_internal(name):  # the coordinators' logs: no client appends, whatever the ACLs
            message = refusal("append to", str(name))
            answer.partitions = [wire.PartitionResponse(index, ErrorCode.INVALID_TOPIC_EXCEPTION, error_message=message)
                                 for index, _records in parts]
            plan.extend(None for _part in parts)
            continue
        for index, records in parts:
            size += len(records) if records is not None else 0
            partition = broker.logs.get_partition(name, index) if name is not None else None
            if name is None or partition is None:
                code = ErrorCode.UNKNOWN_TOPIC_ID if name is None else broker.logs.partition_error(name, index)
                answer.partitions.append(wire.PartitionResponse(index, refuse[0] if refuse else code,
                                                                error_message=refuse and refuse[1]))
                plan.append(None)
                continue
            window = partition.producer_state_batches_to_retain
            answer.batches_to_retain = window
            answer.max_in_flight_sequence_number = partition.max_in_flight_sequence_number
            refused = refuse
            if refused is None and version >= 3 and _is_message_set(records):
                refused = ErrorCode.INVALID_RECORD, f"Produce v{version} carries record batches of magic 2 only"
            if refused is None:
                # the partition's own copy of the topic's config (kept in step by every change):
                # the whole effective config is rebuilt per call, tens of microseconds
                too_large = _too_large(records, partition.log.config.max_message_bytes)
                if too_large is not None:
                    refused = ErrorCode.MESSAGE_TOO_LARGE, too_large
            if refused is None:
                low = broker.disk_space.produce_refusal(partition.directory)
                if low is not None:   # the reserve is for what the broker itself must write
                    refused = ErrorCode.KAFKA_STORAGE_ERROR, low
            if refused is not None:
                answer.partitions.append(wire.PartitionResponse(
                    index, refused[0], log_start_offset=partition.log_start_offset,
                    error_message=refused[1], batches_to_retain=window))
                plan.append(None)
                continue
            answer.partitions.append(wire.PartitionResponse(index, ErrorCode.NONE))  # answered by _append
            plan.append(_Append(answer, len(answer.partitions) - 1, name, index, partition,
                                _transactional_header(records)))
    return topics, plan, size


def _append(broker: BrokerServices, version: int, request: wire.ProduceRequest, plan: list[_Append | None],
            refusals: dict[tuple[str, int], tuple[int, str]], checks: _Checks,
            now: int) -> tuple[bool, list[_Wait]]:
    """The planned partitions' records appended, in the request's order, and their answers filled
    in: (whether records became visible at once (write.caching), the acks=all answers that wait
    for their fsync)."""
    group_commit = broker.group_commit
    appended = False
    waits: list[_Wait] = []
    planned = iter(plan)
    for _topic, parts in request.topics:
        for _index, records in parts:
            a = next(planned)
            if a is None:
                continue
            partition: Partition = a.partition
            window = partition.producer_state_batches_to_retain
            refused = refusals.get((a.topic, a.index))
            if refused is not None:
                a.answer.partitions[a.slot] = wire.PartitionResponse(
                    a.index, refused[0], log_start_offset=partition.log_start_offset,
                    error_message=refused[1], batches_to_retain=window)
                continue
            result = partition.append_from_client(records if records is not None else b"", now,
                                                  verify=checks.verify and a.header is not None,
                                                  guard=checks.guards.get((a.topic, a.index)))
            if result.extra.get("unverified"):
                result.error_code = verification_error(ErrorCode.TRANSACTION_ABORTABLE, ApiKey.PRODUCE, version)
            response = wire.PartitionResponse(a.index, result.error_code, result.base_offset, result.log_append_time,
                                              result.log_start_offset, result.error_message,
                                              result.record_errors, batches_to_retain=window)
            a.answer.partitions[a.slot] = response
            if result.error_code == 0 and "duplicate" not in result.extra and records is not None:
                broker.metrics.produced(a.topic, len(records), result.last_offset - result.base_offset + 1)
            if partition.write_caching:
                appended = appended or (result.error_code == 0 and "duplicate" not in result.extra)
            elif request.acks == -1 and result.error_code == 0:
                if partition.durable_end_offset <= result.last_offset:
                    waits.append((response, partition, result.last_offset + 1))
                    # the fsync starts now, while the rest of the request is handled: its thread's
                    # wake-up overlaps that work (the answer's callback is registered below)
                    group_commit.appended(partition)
            else:
                group_commit.appended(partition)  # visible once fsynced; a failure may have cut
    return appended, waits


def _topic_name(broker: BrokerServices, key: wire.TopicKey | None) -> str | None:
    """The name a partition list is for: v13+ names its topic by id (None: no such topic)."""
    return broker.logs.topic_name(key) if isinstance(key, uuid.UUID) else key


def _answer_when_durable(broker: BrokerServices, version: int, topics: list[wire.TopicResponse],
                         waits: list[_Wait], timeout_ms: int, throttle_ms: int) -> Later:
    """The answer once every waiting batch is fsynced (or cut by a failed fsync: KAFKA_STORAGE_ERROR),
    or after the request's timeout (REQUEST_TIMED_OUT for what is still not durable): encoded
    in the group commit's own completion, without a trip through the event loop
    (`broker.net.later`)."""
    answer = Later()
    left = len(waits)
    outcome: dict[int, bool] = {}   # index in waits -> kept

    def finish() -> None:
        timer.cancel()
        try:
            for i, (response, _partition, _offset) in enumerate(waits):
                kept = outcome.get(i)
                if kept:
                    continue
                if kept is None:
                    code, message = ErrorCode.REQUEST_TIMED_OUT, "the batch was not fsynced within the request timeout"
                else:
                    code, message = ErrorCode.KAFKA_STORAGE_ERROR, "the batch's fsync failed; it was not kept"
                response.error_code, response.base_offset, response.log_append_time = code, -1, -1
                response.error_message = message
                broker.metrics.errors.labels("Produce", code.name).inc()
            body = wire.encode_response(version, topics, throttle_ms)
        except Exception as e:  # noqa: BLE001 - a bug: the dispatch answers it (a Later never resolved would hang the connection)
            answer.fail(e)
            return
        answer.resolve(body)

    def told(i: int, kept: bool) -> None:
        nonlocal left
        if answer.done:
            return
        outcome[i] = kept
        left -= 1
        if left == 0:
            finish()

    def expired() -> None:
        if not answer.done:
            finish()

    timer = asyncio.get_running_loop().call_later(max(timeout_ms, 0) / 1000, expired)
    for i, (_response, partition, offset) in enumerate(waits):
        if not broker.group_commit.when_durable(partition, offset, functools.partial(told, i)):
            told(i, True)
    return answer


def _refusal(request: wire.ProduceRequest) -> tuple[int, str] | None:
    """An answer for every partition of the request, or None to handle each on its own."""
    if request.acks not in (-1, 0, 1):
        return ErrorCode.INVALID_REQUIRED_ACKS, f"acks={request.acks} (use -1, 0 or 1)"
    return None


def _transactional_header(records: memoryview | None) -> BatchHeader | None:
    """The header of a transactional batch in `records`, or None (header-level: an idempotent
    record set holds one batch, which storage checks)."""
    if records is None:
        return None
    for _pos, header in iter_batches(records):
        if header.magic == 2 and header.is_transactional and not header.is_control:
            return header
    return None


async def _check_transactional(broker: BrokerServices, version: int, tid: str | None, batches: list[_Append],
                               checks: _Checks) -> dict[tuple[str, int], tuple[int, str]]:
    """(topic, partition) -> (code, message) for the transactional batches that must not be
    appended: without a transactional id, or not in (not added to) the producer's transaction.
    One question to the coordinator per producer (normally one per request), for every partition
    where its transaction is not open at that epoch yet."""
    if tid is None:
        return {(a.topic, a.index): (ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                     "a transactional batch needs the request's transactional id") for a in batches}
    add = version >= FIRST_V2
    if broker.txn_check is None or not (add or broker.txn_verification):
        return {}
    producers: dict[tuple[int, int], dict[tuple[str, int], Partition]] = {}
    for a in batches:
        assert a.header is not None  # `batches` are the transactional ones
        pid, epoch = a.header.producer_id, a.header.producer_epoch
        if not a.partition.has_open_transaction(pid, epoch):
            producers.setdefault((pid, epoch), {})[(a.topic, a.index)] = a.partition
    out = {}
    for (pid, epoch), partitions in producers.items():
        codes = await add_partitions.check(broker, tid, pid, epoch, list(partitions), add,
                                           *_guards(pid, epoch, add, partitions, checks))
        for (topic, index), code in codes.items():
            if code:
                what = "could not be added to" if add else "is not in"
                out[(topic, index)] = (verification_error(code, ApiKey.PRODUCE, version),
                                       f"partition {topic}-{index} {what} transaction {tid!r} of producer {pid} "
                                       f"epoch {epoch} ({ErrorCode(code).name})")
    return out


def _guards(pid: int, epoch: int, v2: bool, partitions: dict[tuple[str, int], Partition], checks: _Checks
            ) -> tuple[Callable[[], _Token], Callable[[_Token], bool], Callable[[_Token], None]]:
    """begin/valid/end of one attempt's verification guards (`core.txn.verification`; `v2`: the
    request is Transactions V2). Each partition's latest guard is held until its batch is
    appended (`_Checks`), where storage checks it again."""
    def begin() -> _Token:
        token = [(key, p, p.verification_guards.begin(pid, epoch, v2)) for key, p in partitions.items()]
        for key, p, g in token:
            checks.guards[key] = g
            checks.held.append((p, pid, g))
        return token

    def valid(token: _Token) -> bool:
        return all(p.verification_guards.valid(pid, g) for _key, p, g in token)

    def end(token: _Token) -> None:
        pass   # `_Checks.end`, once the batches are appended
    return begin, valid, end


def _is_message_set(records: memoryview | None) -> bool:
    """A v0/v1 message set (by its first entry; one too short to tell is storage's to refuse)."""
    try:
        return records is not None and magic_of(records) < 2
    except KafkaProtocolError:
        return False


def _too_large(records: memoryview | None, limit: int) -> str | None:
    if records is None or len(records) <= limit:
        return None
    for _pos, header in iter_batches(records):
        if header.size > limit:
            return f"a batch of {header.size} bytes is above max.message.bytes={limit}"
    return None


def error_response(version: int, request: wire.ProduceRequest, code: int) -> bytes | None:
    """`code` for every partition of the request (Kafka's ProduceRequest.getErrorResponse)."""
    if request.acks == 0:
        return None
    return wire.encode_response(version, [
        wire.TopicResponse(topic, [wire.PartitionResponse(index, code) for index, _records in parts])
        for topic, parts in request.topics])

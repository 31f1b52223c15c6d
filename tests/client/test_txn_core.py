"""The transaction manager's core (client/txn_core.py) driven without I/O: scripted scenarios with a
stand-in producer, one with the real ProducerCore behind the seam, and a Hypothesis state machine
whose coordinator answers anything in any order."""
from __future__ import annotations

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from tests.tiers import examples

from oncelog.client.config import ProducerConfig
from oncelog.client.errors import (
    BrokerResponseError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionFatalError,
    TransactionStateError,
)
from oncelog.client.producer_core import PartitionResult, ProducerCore
from oncelog.client.txn_core import (
    VALID_PREVIOUS,
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
    TransactionManager,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    TxnState,
)
from oncelog.client.types import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition
from oncelog.protocol.errors import ErrorCode as E

TID = "copier-1"
TP = TopicPartition("out", 0)
TP2 = TopicPartition("out", 1)
S = TxnState


class FakeProducer:
    """The producer core as the manager sees it (TxnProducer): batches per partition, queued or
    on the wire; the test decides their outcomes."""

    def __init__(self) -> None:
        self.txn = None
        self.queued: list[TopicPartition] = []
        self.wire: list[TopicPartition] = []
        self.epochs: list[tuple[int, int]] = []
        self.fatal: BaseException | None = None
        self.aborted: list[BaseException] = []

    def attach_transactions(self, txn) -> None:
        self.txn = txn

    def start_epoch(self, producer_id: int, producer_epoch: int) -> None:
        assert not self.has_incomplete(), "sequences reset with batches incomplete"
        self.epochs.append((producer_id, producer_epoch))

    def has_incomplete(self) -> bool:
        return bool(self.queued or self.wire)

    def abort_undrained(self, error: BaseException) -> None:
        self.aborted.extend(error for _ in self.queued)
        self.queued.clear()

    def go_fatal(self, error: BaseException) -> None:
        self.fatal = error
        self.queued.clear()

    def drain(self) -> list[TopicPartition]:
        sent = [tp for tp in self.queued if self.txn.may_send(tp)]
        for tp in sent:
            self.queued.remove(tp)
        self.wire.extend(sent)
        return sent


def answer(tm: TransactionManager, now: int, expect: type, response, node: int | None = ...):
    out = tm.next_request(now)
    assert out is not None and isinstance(out.request, expect), out
    if node is not ...:
        assert out.node == node
    tm.on_response(response, now)
    return out.request


def initialized(producer=None, *, bump: bool = True, pid: int = 1000, epoch: int = 0):
    producer = FakeProducer() if producer is None else producer
    tm = TransactionManager(TID, retry_backoff_ms=100, producer=producer)
    if bump:
        tm.coordinator_versions(init_producer_id_max=4)
    result = tm.init_transactions()
    req = answer(tm, 0, FindCoordinatorRequest, FindCoordinatorResponse(E.NONE, 3), node=None)
    assert (req.key_type, req.key) == (1, TID)
    req = answer(tm, 0, InitProducerIdRequest, InitProducerIdResponse(E.NONE, pid, epoch), node=3)
    assert (req.transactional_id, req.producer_id, req.producer_epoch) == (TID, -1, -1)
    assert result.done and result.error is None and tm.state is S.READY
    return tm, producer


def add_partition(tm, producer, tp=TP, now=0):
    tm.maybe_add_partition(tp)
    producer.queued.append(tp)
    assert producer.drain() == [] and not tm.may_send(tp) and tp in tm.partitions_to_add()
    req = answer(tm, now, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse({tp: E.NONE}), node=3)
    assert tp in req.partitions
    assert producer.drain() == [tp]


# ------------------------------------------------------------------ scripted scenarios

def test_commit_sends_end_txn_only_after_every_batch_resolved():
    tm, producer = initialized()
    assert producer.epochs == [(1000, 0)]
    tm.begin_transaction()
    add_partition(tm, producer)
    result = tm.commit_transaction()
    assert tm.state is S.COMMITTING_TRANSACTION
    assert tm.next_request(5) is None          # the batch is still on the wire
    producer.wire.clear()                      # acknowledged
    req = answer(tm, 5, EndTxnRequest, EndTxnResponse(E.NONE), node=3)
    assert (req.producer_id, req.producer_epoch, req.committed) == (1000, 0, True)
    assert result.done and result.error is None and tm.state is S.READY
    assert not tm.may_send(TP)                 # the next transaction adds it again


def test_abort_sends_end_txn_abort_and_fails_unsent_records():
    tm, producer = initialized()
    tm.begin_transaction()
    add_partition(tm, producer)
    producer.wire.clear()
    tm.maybe_add_partition(TP2)                # queued, never added
    producer.queued.append(TP2)
    result = tm.abort_transaction()
    req = answer(tm, 0, EndTxnRequest, EndTxnResponse(E.NONE))
    assert req.committed is False
    assert len(producer.aborted) == 1 and isinstance(producer.aborted[0], TransactionAbortedError)
    assert result.done and result.error is None and tm.state is S.READY
    assert producer.epochs == [(1000, 0)]      # no error: no bump


def test_empty_transaction_commit_sends_no_end_txn():
    tm, _ = initialized()
    tm.begin_transaction()
    result = tm.commit_transaction()
    assert tm.next_request(0) is None
    assert result.done and result.error is None and tm.state is S.READY


def test_concurrent_transactions_on_first_add_retried_after_20ms():
    tm, producer = initialized()
    tm.begin_transaction()
    tm.maybe_add_partition(TP)
    producer.queued.append(TP)
    answer(tm, 1000, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse({TP: E.CONCURRENT_TRANSACTIONS}))
    assert tm.next_request(1019) is None and tm.next_wake_ms(1019) == 1020
    answer(tm, 1020, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse({TP: E.NONE}))
    assert tm.may_send(TP)
    # a later add of the same transaction waits the whole retry.backoff.ms
    tm.maybe_add_partition(TP2)
    answer(tm, 2000, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse({TP2: E.CONCURRENT_TRANSACTIONS}))
    assert tm.next_request(2020) is None
    answer(tm, 2100, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse({TP2: E.NONE}))
    assert tm.may_send(TP2)


def test_coordinator_moved_and_lost_answer_find_it_again_and_resend_same_end_txn():
    tm, producer = initialized()
    tm.begin_transaction()
    add_partition(tm, producer)
    producer.wire.clear()
    result = tm.commit_transaction()
    answer(tm, 0, EndTxnRequest, EndTxnResponse(E.NOT_COORDINATOR), node=3)
    answer(tm, 0, FindCoordinatorRequest, FindCoordinatorResponse(E.NONE, 5), node=None)
    assert tm.next_request(50) is None        # retry.backoff.ms
    out = tm.next_request(100)
    assert isinstance(out.request, EndTxnRequest) and out.node == 5 and out.request.committed
    tm.on_request_failed(100)                 # connection lost: outcome unknown
    answer(tm, 200, FindCoordinatorRequest, FindCoordinatorResponse(E.NONE, 6))
    # the same result asked again; the coordinator answers NONE to a retried commit
    assert tm.commit_transaction() is result
    req = answer(tm, 200, EndTxnRequest, EndTxnResponse(E.NONE), node=6)
    assert req.committed and result.done and result.error is None


@pytest.mark.parametrize("code", [E.PRODUCER_FENCED, E.INVALID_PRODUCER_EPOCH])
def test_fenced_end_txn_is_fatal_and_nothing_is_sent_after(code):
    tm, producer = initialized()
    tm.begin_transaction()
    add_partition(tm, producer)
    producer.wire.clear()
    result = tm.commit_transaction()
    answer(tm, 0, EndTxnRequest, EndTxnResponse(code))
    assert tm.state is S.FATAL_ERROR and isinstance(result.error, ProducerFencedError)
    assert tm.next_request(10**6) is None and isinstance(producer.fatal, ProducerFencedError)
    assert not tm.may_send(TP)
    for call in (tm.begin_transaction, tm.abort_transaction, tm.init_transactions):
        with pytest.raises(ProducerFencedError):
            call()


def test_init_producer_id_v3_fenced_answer_is_fatal():
    producer = FakeProducer()
    tm = TransactionManager(TID, producer=producer)
    result = tm.init_transactions()
    answer(tm, 0, FindCoordinatorRequest, FindCoordinatorResponse(E.NONE, 3))
    answer(tm, 0, InitProducerIdRequest, InitProducerIdResponse(E.INVALID_PRODUCER_EPOCH))
    assert isinstance(result.error, ProducerFencedError) and tm.next_request(0) is None


def test_init_retries_concurrent_transactions_and_load_in_progress():
    tm = TransactionManager(TID, retry_backoff_ms=100)
    result = tm.init_transactions()
    answer(tm, 0, FindCoordinatorRequest, FindCoordinatorResponse(E.COORDINATOR_NOT_AVAILABLE))
    answer(tm, 100, FindCoordinatorRequest, FindCoordinatorResponse(E.NONE, 3))
    answer(tm, 100, InitProducerIdRequest, InitProducerIdResponse(E.CONCURRENT_TRANSACTIONS))
    answer(tm, 200, InitProducerIdRequest, InitProducerIdResponse(E.COORDINATOR_LOAD_IN_PROGRESS))
    answer(tm, 300, InitProducerIdRequest, InitProducerIdResponse(E.NONE, 7, 3))
    assert result.done and result.error is None and (tm.producer_id, tm.producer_epoch) == (7, 3)


@pytest.mark.parametrize("code", [E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, E.INVALID_TXN_STATE,
                                  E.CLUSTER_AUTHORIZATION_FAILED, E.UNSUPPORTED_VERSION])
def test_fatal_codes(code):
    tm, producer = initialized()
    tm.begin_transaction()
    tm.maybe_add_partition(TP)
    answer(tm, 0, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse({TP: code}))
    assert tm.state is S.FATAL_ERROR and isinstance(tm.last_error, TransactionFatalError)
    assert tm.last_error.code == code


def test_topic_authorization_failure_is_abortable_and_commit_raises():
    tm, producer = initialized()
    tm.begin_transaction()
    tm.maybe_add_partition(TP)
    tm.maybe_add_partition(TP2)
    producer.queued += [TP, TP2]
    answer(tm, 0, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse(
        {TP: E.TOPIC_AUTHORIZATION_FAILED, TP2: E.OPERATION_NOT_ATTEMPTED}))
    assert tm.state is S.ABORTABLE_ERROR and not tm.may_send(TP) and not tm.may_send(TP2)
    with pytest.raises(TransactionAbortableError) as info:
        tm.commit_transaction()
    assert info.value.txn_requires_abort() and info.value.code == E.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(TransactionAbortableError):
        tm.maybe_add_partition(TP)
    result = tm.abort_transaction()
    assert tm.next_request(0) is None          # nothing was added: no EndTxn
    assert result.done and result.error is None and tm.state is S.READY
    assert len(producer.aborted) == 2


def test_failed_batch_aborts_with_epoch_bump_then_next_transaction_starts_at_new_epoch():
    tm, producer = initialized()
    tm.begin_transaction()
    add_partition(tm, producer)
    producer.wire.clear()
    tm.on_batch_failed(TP, BrokerResponseError(E.MESSAGE_TOO_LARGE))
    assert tm.state is S.ABORTABLE_ERROR
    with pytest.raises(TransactionAbortableError):
        tm.commit_transaction()
    result = tm.abort_transaction()
    answer(tm, 0, EndTxnRequest, EndTxnResponse(E.NONE))
    assert not result.done and tm.state is S.INITIALIZING
    req = answer(tm, 0, InitProducerIdRequest, InitProducerIdResponse(E.NONE, 1000, 1))
    assert (req.producer_id, req.producer_epoch) == (1000, 0)   # KIP-360: the current ones
    assert result.done and result.error is None and tm.state is S.READY
    assert producer.epochs == [(1000, 0), (1000, 1)]
    tm.begin_transaction()
    add_partition(tm, producer)
    assert tm.next_request(0) is None


def test_gap_without_kip360_coordinator_is_fatal():
    tm, producer = initialized(bump=False)
    tm.begin_transaction()
    add_partition(tm, producer)
    tm.on_sequence_gap(TP, "OutOfOrderSequence right after the last acknowledged batch")
    assert tm.state is S.FATAL_ERROR and isinstance(tm.last_error, TransactionFatalError)


def test_unknown_producer_id_mapping_abort_skips_end_txn_and_bumps():
    tm, producer = initialized()
    tm.begin_transaction()
    add_partition(tm, producer)
    producer.wire.clear()
    tm.send_offsets_to_transaction({TP: 1}, ConsumerGroupMetadata("g"))
    answer(tm, 0, AddOffsetsToTxnRequest, AddOffsetsToTxnResponse(E.INVALID_PRODUCER_ID_MAPPING))
    assert tm.state is S.ABORTABLE_ERROR
    result = tm.abort_transaction()
    answer(tm, 0, InitProducerIdRequest, InitProducerIdResponse(E.NONE, 2000, 0))
    assert result.done and result.error is None and tm.producer_id == 2000


def test_send_offsets_carries_kip447_group_metadata_to_the_group_coordinator():
    tm, _ = initialized()
    tm.begin_transaction()
    group = ConsumerGroupMetadata("copy-group", 5, "member-1", "instance-a")
    result = tm.send_offsets_to_transaction({TopicPartition("in", 0): 42, TopicPartition("in", 1):
                                             OffsetAndMetadata(7, "m", 3)}, group)
    req = answer(tm, 0, AddOffsetsToTxnRequest, AddOffsetsToTxnResponse(E.NONE), node=3)
    assert req.group_id == "copy-group" and (req.producer_id, req.producer_epoch) == (1000, 0)
    req = answer(tm, 0, FindCoordinatorRequest, FindCoordinatorResponse(E.NONE, 7))
    assert (req.key_type, req.key) == (0, "copy-group")
    out = tm.next_request(0)
    assert isinstance(out.request, TxnOffsetCommitRequest) and out.node == 7
    r = out.request
    assert (r.group_id, r.generation_id, r.member_id, r.group_instance_id) == \
        ("copy-group", 5, "member-1", "instance-a")
    assert r.offsets == ((TopicPartition("in", 0), OffsetAndMetadata(42)),
                         (TopicPartition("in", 1), OffsetAndMetadata(7, "m", 3)))
    # one partition must be retried (load in progress), the other is done
    tm.on_response(TxnOffsetCommitResponse({TopicPartition("in", 0): E.NONE,
                                            TopicPartition("in", 1): E.COORDINATOR_LOAD_IN_PROGRESS}), 0)
    assert not result.done
    req = answer(tm, 100, TxnOffsetCommitRequest, TxnOffsetCommitResponse({TopicPartition("in", 1): E.NONE}))
    assert [tp for tp, _ in req.offsets] == [TopicPartition("in", 1)]
    assert result.done and result.error is None
    commit = tm.commit_transaction()           # offsets only: EndTxn is still sent
    answer(tm, 0, EndTxnRequest, EndTxnResponse(E.NONE))
    assert commit.done and commit.error is None


@pytest.mark.parametrize("code", [E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID])
def test_zombie_consumer_offsets_are_abortable(code):
    tm, _ = initialized()
    tm.begin_transaction()
    result = tm.send_offsets_to_transaction({TopicPartition("in", 0): 1},
                                            ConsumerGroupMetadata("g", 3, "m"))
    answer(tm, 0, AddOffsetsToTxnRequest, AddOffsetsToTxnResponse(E.NONE))
    answer(tm, 0, FindCoordinatorRequest, FindCoordinatorResponse(E.NONE, 7))
    answer(tm, 0, TxnOffsetCommitRequest, TxnOffsetCommitResponse({TopicPartition("in", 0): code}))
    assert isinstance(result.error, TransactionAbortableError) and tm.state is S.ABORTABLE_ERROR


def test_illegal_calls_raise_and_change_nothing():
    tm = TransactionManager(TID)
    with pytest.raises(TransactionStateError):
        tm.begin_transaction()
    with pytest.raises(TransactionStateError):
        tm.commit_transaction()
    with pytest.raises(TransactionStateError):
        tm.maybe_add_partition(TP)
    first = tm.init_transactions()
    assert tm.init_transactions() is first     # a caller that timed out calls again
    with pytest.raises(TransactionStateError):
        tm.abort_transaction()                 # init must be retried first
    answer(tm, 0, FindCoordinatorRequest, FindCoordinatorResponse(E.NONE, 3))
    answer(tm, 0, InitProducerIdRequest, InitProducerIdResponse(E.NONE, 1, 0))
    with pytest.raises(TransactionStateError):
        tm.init_transactions()
    with pytest.raises(TransactionStateError):
        tm.send_offsets_to_transaction({TP: 1}, ConsumerGroupMetadata("g"))
    with pytest.raises(TransactionStateError):
        tm.abort_transaction()
    tm.begin_transaction()
    with pytest.raises(TransactionStateError):
        tm.begin_transaction()
    assert tm.state is S.IN_TRANSACTION
    with pytest.raises(ValueError):
        TransactionManager("")


def test_transition_table_is_javas():
    # Java's trunk (KIP-939): PREPARED_TRANSACTION from IN_TRANSACTION (prepareTransaction) or
    # INITIALIZING (initTransactions(keepPreparedTxn) found one), and ended by commit or abort
    assert VALID_PREVIOUS[S.ABORTING_TRANSACTION] == {S.IN_TRANSACTION, S.ABORTABLE_ERROR, S.PREPARED_TRANSACTION}
    assert VALID_PREVIOUS[S.COMMITTING_TRANSACTION] == {S.IN_TRANSACTION, S.PREPARED_TRANSACTION}
    assert VALID_PREVIOUS[S.PREPARED_TRANSACTION] == {S.IN_TRANSACTION, S.INITIALIZING}
    assert VALID_PREVIOUS[S.INITIALIZING] == {S.UNINITIALIZED, S.ABORTING_TRANSACTION, S.COMMITTING_TRANSACTION}
    assert VALID_PREVIOUS[S.FATAL_ERROR] == set(TxnState)


# ------------------------------------------------------------------ with the real ProducerCore

def _core() -> ProducerCore:
    core = ProducerCore(ProducerConfig.from_dict(
        {"bootstrap.servers": "model:9092", "linger.ms": 0, "retry.backoff.ms": 0}))
    core.update_leader(TP, 1, 0)
    return core


def _send(core, now=0):
    batches = core.drain(1, now)
    return [(b, b.producer_id, b.producer_epoch, b.base_sequence) for b in batches]


def test_producer_core_drains_only_added_partitions_and_restarts_sequences_after_bump():
    core = _core()
    tm, _ = initialized(core)
    assert core.producer_id_request() is None   # the manager owns InitProducerId
    tm.begin_transaction()
    tm.maybe_add_partition(TP)
    assert core.append(TP, 0, None, b"a", None, "a", 0) is not None
    assert core.drain(1, 0) == []               # not added yet
    answer(tm, 0, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse({TP: E.NONE}))
    [(b, pid, epoch, seq)] = _send(core)
    assert (pid, epoch, seq) == (1000, 0, 0)
    core.on_response(1, [(b, PartitionResult(0, base_offset=0))], 0)
    assert core.append(TP, 0, None, b"b", None, "b", 0) is not None
    [(b, pid, epoch, seq)] = _send(core)
    assert seq == 1
    # refused without being appended: a gap at sequence 1, the transaction must be aborted
    core.on_response(1, [(b, PartitionResult(E.MESSAGE_TOO_LARGE))], 0)
    assert tm.state is S.ABORTABLE_ERROR
    assert core.append(TP, 0, None, b"c", None, "c", 0) is not None   # (the shell would refuse)
    result = tm.abort_transaction()
    answer(tm, 0, EndTxnRequest, EndTxnResponse(E.NONE))  # the undrained "c" failed first
    answer(tm, 0, InitProducerIdRequest, InitProducerIdResponse(E.NONE, 1000, 1))
    assert result.done and result.error is None
    outcomes = {c.batch.cookies[0]: c.error for c in core.take_completions()}
    assert outcomes["a"] is None and isinstance(outcomes["c"], TransactionAbortedError)
    assert outcomes["b"] is not None and not core.has_incomplete()
    tm.begin_transaction()
    tm.maybe_add_partition(TP)
    core.append(TP, 0, None, b"d", None, "d", 0)
    answer(tm, 0, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse({TP: E.NONE}))
    [(b, pid, epoch, seq)] = _send(core)
    assert (pid, epoch, seq) == (1000, 1, 0)    # the new epoch starts at sequence 0
    core.on_response(1, [(b, PartitionResult(0, base_offset=5))], 0)
    commit = tm.commit_transaction()
    answer(tm, 0, EndTxnRequest, EndTxnResponse(E.NONE))
    assert commit.done and commit.error is None


def test_producer_core_batches_after_a_gap_fail_instead_of_waiting_for_the_abort():
    # Outside a transaction they would wait for a local epoch bump; in one, only the abort's
    # bump renews the epoch, and the abort's EndTxn waits for them: they must fail now.
    core = _core()
    tm, _ = initialized(core)
    tm.begin_transaction()
    tm.maybe_add_partition(TP)
    core.append(TP, 0, None, b"a", None, "a", 0)
    answer(tm, 0, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse({TP: E.NONE}))
    [(a, *_)] = _send(core)
    core.on_response(1, [(a, PartitionResult(0, base_offset=0))], 0)
    core.append(TP, 0, None, b"b", None, "b", 0)
    [(b, *_)] = _send(core)
    core.append(TP, 0, None, b"c", None, "c", 0)
    [(c, *_)] = _send(core)
    assert (b.base_sequence, c.base_sequence) == (1, 2)
    core.on_response(1, [(b, PartitionResult(E.OUT_OF_ORDER_SEQUENCE_NUMBER))], 0)
    core.on_response(1, [(c, PartitionResult(E.OUT_OF_ORDER_SEQUENCE_NUMBER))], 0)
    assert tm.state is S.ABORTABLE_ERROR and not core.has_incomplete()
    result = tm.abort_transaction()
    answer(tm, 0, EndTxnRequest, EndTxnResponse(E.NONE))
    answer(tm, 0, InitProducerIdRequest, InitProducerIdResponse(E.NONE, 1000, 1))
    assert result.done and result.error is None
    errors = {x.batch.cookies[0]: x.error for x in core.take_completions()}
    assert errors["a"] is None and errors["b"] is not None and errors["c"] is not None


def test_producer_core_invalid_producer_epoch_on_produce_is_abortable_not_fatal():
    core = _core()
    tm, _ = initialized(core)
    tm.begin_transaction()
    tm.maybe_add_partition(TP)
    core.append(TP, 0, None, b"a", None, "a", 0)
    answer(tm, 0, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse({TP: E.NONE}))
    [(b, *_)] = _send(core)
    core.on_response(1, [(b, PartitionResult(E.INVALID_PRODUCER_EPOCH))], 0)
    assert core.fatal is None and tm.state is S.ABORTABLE_ERROR


def test_producer_core_fenced_produce_is_fatal_for_both():
    core = _core()
    tm, _ = initialized(core)
    tm.begin_transaction()
    tm.maybe_add_partition(TP)
    core.append(TP, 0, None, b"a", None, "a", 0)
    answer(tm, 0, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse({TP: E.NONE}))
    [(b, *_)] = _send(core)
    core.on_response(1, [(b, PartitionResult(E.PRODUCER_FENCED))], 0)
    assert isinstance(core.fatal, ProducerFencedError) and tm.state is S.FATAL_ERROR
    with pytest.raises(ProducerFencedError):
        tm.abort_transaction()


# ------------------------------------------------------------------ Hypothesis

REQUEST_CODES = {
    FindCoordinatorRequest: [E.COORDINATOR_NOT_AVAILABLE, E.GROUP_AUTHORIZATION_FAILED,
                             E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED],
    InitProducerIdRequest: [E.CONCURRENT_TRANSACTIONS, E.NOT_COORDINATOR, E.PRODUCER_FENCED,
                            E.TRANSACTION_ABORTABLE, E.COORDINATOR_LOAD_IN_PROGRESS],
    AddPartitionsToTxnRequest: [E.CONCURRENT_TRANSACTIONS, E.NOT_COORDINATOR,
                                E.TOPIC_AUTHORIZATION_FAILED, E.INVALID_PRODUCER_EPOCH,
                                E.UNKNOWN_PRODUCER_ID, E.INVALID_TXN_STATE],
    AddOffsetsToTxnRequest: [E.CONCURRENT_TRANSACTIONS, E.NOT_COORDINATOR,
                             E.GROUP_AUTHORIZATION_FAILED, E.INVALID_PRODUCER_ID_MAPPING],
    TxnOffsetCommitRequest: [E.COORDINATOR_LOAD_IN_PROGRESS, E.NOT_COORDINATOR,
                             E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID],
    EndTxnRequest: [E.CONCURRENT_TRANSACTIONS, E.NOT_COORDINATOR, E.PRODUCER_FENCED,
                    E.INVALID_PRODUCER_ID_MAPPING, E.UNKNOWN_PRODUCER_ID],
}
TPS = [TP, TP2]
CALL_ERRORS = (TransactionStateError, TransactionAbortableError, TransactionFatalError)


def respond(request, code: int, epoch: int):
    if isinstance(request, FindCoordinatorRequest):
        return FindCoordinatorResponse(code, 1 if code == E.NONE else -1)
    if isinstance(request, InitProducerIdRequest):
        return InitProducerIdResponse(code, 1000, epoch) if code == E.NONE else InitProducerIdResponse(code)
    if isinstance(request, AddPartitionsToTxnRequest):
        return AddPartitionsToTxnResponse({tp: code for tp in request.partitions})
    if isinstance(request, AddOffsetsToTxnRequest):
        return AddOffsetsToTxnResponse(code)
    if isinstance(request, TxnOffsetCommitRequest):
        return TxnOffsetCommitResponse({tp: code for tp, _ in request.offsets})
    return EndTxnResponse(code)


class TxnMachine(RuleBasedStateMachine):
    """A user calling anything at any time, batches succeeding or failing, a coordinator answering
    each request with success, any error it may give, or no answer at all. Invariants: no batch
    drained for a partition not added in the current transaction; no EndTxn while a batch is
    unresolved; nothing sent after FATAL_ERROR; commit in ABORTABLE_ERROR raises the abortable
    error; every state change is one of Java's; each call's result resolves exactly once (twice
    raises inside the core; none is left pending once a cooperative broker has answered)."""

    def __init__(self) -> None:
        super().__init__()
        self.producer = FakeProducer()
        self.tm = TransactionManager(TID, retry_backoff_ms=100, producer=self.producer)
        self.tm.coordinator_versions(4)
        self.now = 0
        self.epoch = 0
        self.added: set[TopicPartition] = set()   # AddPartitionsToTxn answered NONE, this txn
        self.results = {}
        self.last_state = self.tm.state

    def _observe(self) -> None:
        state = self.tm.state
        if state is not self.last_state:
            assert self.last_state in VALID_PREVIOUS[state], (self.last_state, state)
        if state in (S.READY, S.INITIALIZING, S.UNINITIALIZED):
            self.added.clear()    # a transaction ended: nothing is added for the next one
        self.last_state = state

    def _call(self, fn, *args):
        before = self.tm.state
        try:
            r = fn(*args)
        except CALL_ERRORS as e:
            if before is S.FATAL_ERROR:
                assert isinstance(e, TransactionFatalError)
            if before is S.ABORTABLE_ERROR and fn.__name__ != "abort_transaction":
                assert isinstance(e, TransactionAbortableError), e
            return
        finally:
            self._observe()
        assert before is not S.FATAL_ERROR
        if fn.__name__ == "commit_transaction":
            assert before is not S.ABORTABLE_ERROR
        if r is not None:
            self.results[id(r)] = r
            r.add_done_callback(lambda r: event(f"{r.operation} "
                                                f"{'ok' if r.error is None else type(r.error).__name__}"))

    @rule(op=st.sampled_from(["init_transactions", "begin_transaction", "commit_transaction",
                              "abort_transaction"]))
    def user_call(self, op):
        self._call(getattr(self.tm, op))

    @rule(commit=st.booleans())
    def natural_call(self, commit):
        """The call a well-behaved application makes next, so that runs get far."""
        state = self.tm.state
        if state is S.UNINITIALIZED:
            self._call(self.tm.init_transactions)
        elif state is S.READY:
            self._call(self.tm.begin_transaction)
        elif state is S.IN_TRANSACTION:
            self._call(self.tm.commit_transaction if commit else self.tm.abort_transaction)
        elif state is S.ABORTABLE_ERROR:
            self._call(self.tm.abort_transaction)

    @rule(gen=st.integers(-1, 2))
    def send_offsets(self, gen):
        self._call(self.tm.send_offsets_to_transaction, {TopicPartition("in", 0): 5},
                   ConsumerGroupMetadata("g", gen, "m" if gen >= 0 else ""))

    @rule(tp=st.sampled_from(TPS))
    def produce(self, tp):
        try:
            self.tm.maybe_add_partition(tp)
        except CALL_ERRORS:
            return
        self.producer.queued.append(tp)

    @rule()
    def drain(self):
        for tp in self.producer.drain():
            assert tp in self.added, f"{tp} drained before it was added"
            assert self.tm.state is not S.FATAL_ERROR

    @rule(i=st.integers(0, 3), ok=st.booleans())
    def batch_outcome(self, i, ok):
        if i < len(self.producer.wire):
            tp = self.producer.wire.pop(i)
            if not ok:
                self.tm.on_batch_failed(tp, BrokerResponseError(E.NOT_ENOUGH_REPLICAS))
            self._observe()

    @rule(tp=st.sampled_from(TPS))
    def sequence_gap(self, tp):
        if tp in self.producer.wire or tp in self.added:
            self.tm.on_sequence_gap(tp, "test gap")
            self._observe()

    @rule(data=st.data())
    def coordinator(self, data):
        # mostly success, so that transactions get far enough to commit
        self._exchange(data.draw(st.sampled_from(["ok"] * 6 + ["lost", "error", "error"])), data)

    @rule(n=st.integers(1, 6))
    def cooperative_round(self, n):
        """Batches on the wire succeed and n requests are answered with success."""
        self.producer.wire.clear()
        self._observe()
        for _ in range(n):
            if not self._exchange("ok"):
                self.now += 100

    @rule(ms=st.sampled_from([20, 100, 1000]))
    def tick(self, ms):
        self.now += ms

    def _exchange(self, how, data=None) -> bool:
        fatal = self.tm.state is S.FATAL_ERROR
        out = self.tm.next_request(self.now)
        self._observe()   # an empty transaction ends here, without a request
        if out is None:
            return False
        assert not fatal, f"{out} after FATAL_ERROR"
        req = out.request
        if isinstance(req, EndTxnRequest):
            assert not self.producer.has_incomplete(), "EndTxn with batches unresolved"
        if isinstance(req, AddPartitionsToTxnRequest):
            assert self.tm.state is not S.FATAL_ERROR
        if how == "lost":
            self.tm.on_request_failed(self.now)
        else:
            code = E.NONE if how == "ok" else data.draw(st.sampled_from(REQUEST_CODES[type(req)]))
            if isinstance(req, InitProducerIdRequest) and code == E.NONE:
                self.epoch += 1
            if isinstance(req, AddPartitionsToTxnRequest) and code == E.NONE:
                self.added |= set(req.partitions)
            self.tm.on_response(respond(req, code, self.epoch), self.now)
        self._observe()
        return True

    @invariant()
    def open_for_records_answers_as_check_send(self):
        """The shell's lock-free per-record check lets a record through exactly when the full
        check under the lock would."""
        try:
            self.tm.check_send()
            allowed = True
        except CALL_ERRORS:
            allowed = False
        assert self.tm.open_for_records() is allowed, (self.tm.state, self.tm._call)

    @invariant()
    def nothing_sendable_after_fatal(self):
        if self.tm.state is S.FATAL_ERROR:
            assert not any(self.tm.may_send(tp) for tp in TPS)

    def teardown(self) -> None:
        # A cooperative broker: every batch succeeds, every request is answered NONE. Then no
        # call may be left unresolved.
        for _ in range(60):
            self.producer.drain()
            self.producer.wire.clear()
            if not self._exchange("ok"):
                self.now += 1000
        pending = [r for r in self.results.values() if not r.done]
        assert not pending, (pending, self.tm.state)


TestTxnMachine = TxnMachine.TestCase
TestTxnMachine.settings = settings(max_examples=examples(300), stateful_step_count=60, deadline=None)


def test_aborting_after_an_abortable_init_leaves_the_producer_uninitialized_not_in_a_transaction():
    """An InitProducerId answered TRANSACTION_ABORTABLE is cleared by abort_transaction. The
    producer has no id then: a transaction must not begin (its records could not carry a producer
    id); init_transactions again must work."""
    producer = FakeProducer()
    tm = TransactionManager(TID, retry_backoff_ms=100, producer=producer)
    first = tm.init_transactions()
    answer(tm, 0, FindCoordinatorRequest, FindCoordinatorResponse(E.NONE, 3))
    answer(tm, 0, InitProducerIdRequest, InitProducerIdResponse(E.TRANSACTION_ABORTABLE, -1, -1))
    assert isinstance(first.error, TransactionAbortableError) and tm.state is S.ABORTABLE_ERROR
    aborted = tm.abort_transaction()
    assert tm.next_request(0) is None          # nothing to end at the coordinator
    assert aborted.done and aborted.error is None and tm.state is S.UNINITIALIZED
    with pytest.raises(TransactionStateError):
        tm.begin_transaction()
    again = tm.init_transactions()
    answer(tm, 0, InitProducerIdRequest, InitProducerIdResponse(E.NONE, 1000, 0), node=3)
    assert again.done and again.error is None and tm.state is S.READY
    tm.begin_transaction()
    assert tm.state is S.IN_TRANSACTION and producer.epochs == [(1000, 0)]


def test_a_resumed_transaction_sends_only_its_end_txn_at_the_given_epoch():
    """resume_transaction (the Spark sink's driver): no InitProducerId (it would bump the epoch
    and abort the transaction), EndTxn with the stored id and epoch, no records, and only on a
    new manager."""
    p = FakeProducer()
    tm = TransactionManager(TID, producer=p)
    tm.resume_transaction(4242, 7)
    with pytest.raises(TransactionStateError):
        tm.check_send("out")
    assert not tm.open_for_records()   # the shell's lock-free per-record check says the same
    with pytest.raises(TransactionStateError):
        tm.resume_transaction(4242, 8)
    result = tm.commit_transaction()
    find = tm.next_request(0)
    assert isinstance(find.request, FindCoordinatorRequest)
    tm.on_response(FindCoordinatorResponse(E.NONE, 1, "h", 1), 0)
    end = tm.next_request(0)
    assert end.request == EndTxnRequest(TID, 4242, 7, True) and end.node == 1
    tm.on_response(EndTxnResponse(E.NONE), 0)
    assert result.done and result.error is None and p.epochs == []
    with pytest.raises(TransactionStateError):
        tm.begin_transaction()

    fenced = TransactionManager(TID, producer=FakeProducer())
    fenced.resume_transaction(4242, 7)
    result = fenced.commit_transaction()
    fenced.next_request(0)
    fenced.on_response(FindCoordinatorResponse(E.NONE, 1, "h", 1), 0)
    fenced.next_request(0)
    fenced.on_response(EndTxnResponse(E.PRODUCER_FENCED), 0)
    assert isinstance(result.error, ProducerFencedError)

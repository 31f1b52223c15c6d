"""Transactions V2 in the transaction manager's core (client/txn_core.py, KIP-890 part 2): used when
the cluster finalizes `transaction.version` 2 (decided at init and after each EndTxn, never in
the middle of a transaction), no AddPartitionsToTxn or AddOffsetsToTxn, the producer id and epoch
taken from every EndTxn answer with sequences from 0, abortable errors recovered by the abort's
EndTxn. Scripted scenarios, then a Hypothesis machine whose coordinator bumps the epoch at every
EndTxn (overflowing to a new producer id), answers anything in any order and loses answers after
acting on them."""
from __future__ import annotations

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule
from tests.client.test_txn_core import TID, TP, TP2, FakeProducer, TxnMachine, answer, respond
from tests.tiers import examples

from oncelog.client.errors import BrokerResponseError, TransactionAbortableError
from oncelog.client.txn_core import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
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
from oncelog.client.types import ConsumerGroupMetadata, TopicPartition
from oncelog.core.producer_epoch import EPOCH_EXHAUSTED_AT
from oncelog.protocol.errors import ErrorCode as E

S = TxnState


def v2_initialized(producer=None, *, pid: int = 1000, epoch: int = 0, level: int = 2, allow_v2: bool = True):
    producer = FakeProducer() if producer is None else producer
    tm = TransactionManager(TID, retry_backoff_ms=100, producer=producer, allow_v2=allow_v2)
    tm.coordinator_versions(init_producer_id_max=5)
    tm.features(level, 7)
    tm.init_transactions()
    answer(tm, 0, FindCoordinatorRequest, FindCoordinatorResponse(E.NONE, 3))
    answer(tm, 0, InitProducerIdRequest, InitProducerIdResponse(E.NONE, pid, epoch), node=3)
    assert tm.state is S.READY
    return tm, producer


def produce(tm, producer, tp=TP) -> None:
    tm.maybe_add_partition(tp)
    producer.queued.append(tp)
    assert producer.drain() == [tp], "a V2 partition is drained at once: its leader adds it"
    producer.wire.clear()


def test_v2_sends_no_add_partitions_and_takes_the_epoch_from_end_txn():
    tm, producer = v2_initialized()
    assert tm.transaction_v2
    for epoch in (0, 1, 2):
        tm.begin_transaction()
        produce(tm, producer, TP)
        produce(tm, producer, TP2)
        result = tm.commit_transaction()
        req = answer(tm, 0, EndTxnRequest, EndTxnResponse(E.NONE, 1000, epoch + 1), node=3)
        assert req == EndTxnRequest(TID, 1000, epoch, True, v2=True)
        assert result.done and result.error is None and tm.state is S.READY
        assert (tm.producer_id, tm.producer_epoch) == (1000, epoch + 1)
        assert producer.epochs[-1] == (1000, epoch + 1)   # sequences from 0 at the new epoch
    assert tm.next_request(0) is None


def test_epoch_overflow_moves_the_producer_to_the_new_id():
    tm, producer = v2_initialized(epoch=EPOCH_EXHAUSTED_AT)
    tm.begin_transaction()
    produce(tm, producer)
    tm.commit_transaction()
    answer(tm, 0, EndTxnRequest, EndTxnResponse(E.NONE, 2000, 0))
    assert (tm.producer_id, tm.producer_epoch) == (2000, 0) and producer.epochs[-1] == (2000, 0)


def test_v2_offsets_go_straight_to_the_group_coordinator():
    tm, producer = v2_initialized()
    tm.begin_transaction()
    result = tm.send_offsets_to_transaction({TopicPartition("in", 0): 5}, ConsumerGroupMetadata("g", 3, "m"))
    req = answer(tm, 0, FindCoordinatorRequest, FindCoordinatorResponse(E.NONE, 4))
    assert (req.key_type, req.key) == (0, "g")
    req = answer(tm, 0, TxnOffsetCommitRequest, TxnOffsetCommitResponse({TopicPartition("in", 0): E.NONE}), node=4)
    assert req.v2 and (req.producer_id, req.producer_epoch, req.generation_id) == (1000, 0, 3)
    assert result.done and result.error is None
    tm.commit_transaction()   # offsets alone: the transaction has begun, EndTxn is sent
    answer(tm, 0, EndTxnRequest, EndTxnResponse(E.NONE, 1000, 1), node=3)
    assert tm.producer_epoch == 1


def test_an_empty_v2_transaction_sends_no_end_txn():
    tm, _producer = v2_initialized()
    tm.begin_transaction()
    result = tm.commit_transaction()
    assert tm.next_request(0) is None and result.done and tm.producer_epoch == 0


def test_a_failed_batch_is_recovered_by_the_aborts_end_txn_not_init_producer_id():
    tm, producer = v2_initialized()
    tm.begin_transaction()
    produce(tm, producer)
    tm.on_batch_failed(TP, BrokerResponseError(E.NOT_ENOUGH_REPLICAS))
    tm.on_sequence_gap(TP2, "a gap")
    assert tm.state is S.ABORTABLE_ERROR
    result = tm.abort_transaction()
    req = answer(tm, 0, EndTxnRequest, EndTxnResponse(E.NONE, 1000, 1))
    assert not req.committed and req.v2
    assert result.done and result.error is None and tm.state is S.READY and tm.next_request(0) is None
    assert producer.epochs[-1] == (1000, 1)


def test_a_lost_producer_id_is_still_recovered_by_init_producer_id():
    """INVALID_PRODUCER_ID_MAPPING: the coordinator does not know the id, so no EndTxn can bump
    it; KIP-360's InitProducerId does (as under V1)."""
    tm, _producer = v2_initialized()
    tm.begin_transaction()
    tm.send_offsets_to_transaction({TopicPartition("in", 0): 5}, ConsumerGroupMetadata("g"))
    answer(tm, 0, FindCoordinatorRequest, FindCoordinatorResponse(E.NONE, 4))
    answer(tm, 0, TxnOffsetCommitRequest, TxnOffsetCommitResponse({TopicPartition("in", 0): E.NONE}))
    tm.abort_transaction()
    answer(tm, 0, EndTxnRequest, EndTxnResponse(E.INVALID_PRODUCER_ID_MAPPING))
    req = answer(tm, 0, InitProducerIdRequest, InitProducerIdResponse(E.NONE, 1000, 1))
    assert (req.producer_id, req.producer_epoch) == (1000, 0) and tm.state is S.READY


def test_the_version_changes_between_transactions_only():
    """V1 -> V2 at the next EndTxn, then one epoch bump so that the first V2 transaction starts
    fresh (Java's clientSideEpochBumpRequired); V2 -> V1 (a downgrade) at the next EndTxn too."""
    tm, producer = v2_initialized(level=1)
    assert not tm.transaction_v2
    tm.begin_transaction()
    tm.maybe_add_partition(TP)
    producer.queued.append(TP)
    tm.features(2, 8)                     # finalized meanwhile: this transaction stays V1
    answer(tm, 0, AddPartitionsToTxnRequest, respond(AddPartitionsToTxnRequest(TID, 1000, 0, (TP,)), E.NONE, 0))
    producer.drain()
    producer.wire.clear()
    result = tm.commit_transaction()
    req = answer(tm, 0, EndTxnRequest, EndTxnResponse(E.NONE))
    assert not req.v2 and not result.done
    req = answer(tm, 0, InitProducerIdRequest, InitProducerIdResponse(E.NONE, 1000, 1))
    assert (req.producer_id, req.producer_epoch) == (1000, 0)
    assert result.done and result.error is None and tm.transaction_v2 and producer.epochs[-1] == (1000, 1)
    tm.begin_transaction()
    produce(tm, producer)
    tm.features(1, 6)                     # an older epoch: ignored
    tm.features(1, 9)
    tm.commit_transaction()
    assert answer(tm, 0, EndTxnRequest, EndTxnResponse(E.NONE, 1000, 2)).v2
    assert not tm.transaction_v2 and tm.producer_epoch == 2
    tm.begin_transaction()
    tm.maybe_add_partition(TP)
    assert TP in tm.partitions_to_add() and not tm.may_send(TP)


def test_v1_when_told_so_whatever_the_cluster_finalizes():
    tm, producer = v2_initialized(allow_v2=False)
    assert not tm.transaction_v2
    tm.begin_transaction()
    tm.maybe_add_partition(TP)
    assert not tm.may_send(TP) and isinstance(tm.next_request(0).request, AddPartitionsToTxnRequest)


def test_a_resumed_v2_transaction_ends_with_end_txn_v5_at_the_tasks_epoch():
    p = FakeProducer()
    tm = TransactionManager(TID, producer=p)
    tm.resume_transaction(4242, 7)
    result = tm.commit_transaction()
    tm.features(2, 1)   # learned when the FindCoordinator's connection was made
    answer(tm, 0, FindCoordinatorRequest, FindCoordinatorResponse(E.NONE, 1, "h", 1))
    req = answer(tm, 0, EndTxnRequest, EndTxnResponse(E.NONE, 4242, 8), node=1)
    assert req == EndTxnRequest(TID, 4242, 7, True, v2=True)
    assert result.done and result.error is None and p.epochs == []


# ------------------------------------------------------------------ the machine

class TxnMachineV2(TxnMachine):
    """TxnMachine's user, batches and coordinator, with V2 finalized: the coordinator bumps the
    epoch at each EndTxn it takes (a new producer id past EPOCH_EXHAUSTED_AT), and an answer may
    be lost after the coordinator acted on it (the retry is answered with the same epoch).
    Invariants besides TxnMachine's: no AddPartitionsToTxn or AddOffsetsToTxn is ever sent;
    EndTxn and TxnOffsetCommit are V2's; a batch drains only for a partition of the current
    transaction; after each EndTxn answer the producer holds the coordinator's id and epoch, with
    its sequences restarted there."""

    def __init__(self) -> None:
        super().__init__()
        self.tm = TransactionManager(TID, retry_backoff_ms=100, producer=self.producer)
        self.tm.coordinator_versions(5)
        self.tm.features(2, 1)
        self.pid, self.epoch = 1000, EPOCH_EXHAUSTED_AT - 2   # overflows after a few transactions
        self.ended: tuple[int, int] | None = None   # the coordinator acted on an EndTxn whose answer was lost
        self.lose_end_txn = False
        self.bump_allowed = False   # only after the coordinator lost the producer id (or refused EndTxn)

    @rule(tp=st.sampled_from([TP, TP2]))
    def produce(self, tp):
        try:
            self.tm.maybe_add_partition(tp)
        except Exception:  # noqa: BLE001 - illegal now: the machine's user tries anything
            return
        self.added.add(tp)
        self.producer.queued.append(tp)

    def _exchange(self, how, data=None) -> bool:
        out = self.tm.next_request(self.now)
        self._observe()
        if out is None:
            return False
        req = out.request
        assert not isinstance(req, (AddPartitionsToTxnRequest, AddOffsetsToTxnRequest)), req
        if isinstance(req, (EndTxnRequest, TxnOffsetCommitRequest)):
            assert req.v2, req
        if isinstance(req, EndTxnRequest):
            assert not self.producer.has_incomplete(), "EndTxn with batches unresolved"
            return self._end_txn(req, how, data)
        if isinstance(req, InitProducerIdRequest) and req.producer_id >= 0:
            assert self.bump_allowed, "a KIP-360 bump under V2 where the abort's EndTxn bumps"
            event("InitProducerId bump")
        if how == "lost":
            self.tm.on_request_failed(self.now)
        else:
            code = E.NONE if how == "ok" else data.draw(st.sampled_from(
                [E.CONCURRENT_TRANSACTIONS, E.NOT_COORDINATOR, E.PRODUCER_FENCED, E.TRANSACTION_ABORTABLE]))
            if isinstance(req, InitProducerIdRequest) and code == E.NONE:
                self._bump()
                self.bump_allowed = False
            response = respond(req, code, self.epoch)
            if isinstance(response, InitProducerIdResponse) and code == E.NONE:
                response = InitProducerIdResponse(E.NONE, self.pid, self.epoch)
            self.tm.on_response(response, self.now)
        self._observe()
        return True

    def _bump(self) -> None:
        if self.epoch >= EPOCH_EXHAUSTED_AT:
            self.pid, self.epoch = self.pid + 1, 0
            event("overflow")
        else:
            self.epoch += 1

    def _end_txn(self, req: EndTxnRequest, how, data) -> bool:
        retry = self.ended == (req.producer_id, req.producer_epoch)
        if self.lose_end_txn and how == "ok":
            how, self.lose_end_txn = "acted-lost", False
        acted = how in ("ok", "acted-lost") or (how == "lost" and data is not None and data.draw(st.booleans()))
        if how == "acted-lost":
            how = "lost"
        if acted and not retry:
            self._bump()
            self.ended = (req.producer_id, req.producer_epoch)
        if how == "lost":
            event("EndTxn answer lost" + (" after it acted" if acted else ""))
            self.tm.on_request_failed(self.now)
        elif how == "ok":
            self.ended = None
            self.tm.on_response(EndTxnResponse(E.NONE, self.pid, self.epoch), self.now)
            assert (self.tm.producer_id, self.tm.producer_epoch) == (self.pid, self.epoch)
            assert self.producer.epochs[-1] == (self.pid, self.epoch)
        else:
            code = data.draw(st.sampled_from([E.CONCURRENT_TRANSACTIONS, E.NOT_COORDINATOR, E.PRODUCER_FENCED,
                                              E.INVALID_PRODUCER_ID_MAPPING, E.UNKNOWN_PRODUCER_ID,
                                              E.TRANSACTION_ABORTABLE]))
            self.bump_allowed |= code in (E.INVALID_PRODUCER_ID_MAPPING, E.UNKNOWN_PRODUCER_ID,
                                          E.TRANSACTION_ABORTABLE)
            self.tm.on_response(EndTxnResponse(code), self.now)
        self._observe()
        return True

    @rule(data=st.data())
    def answer_lost(self, data):
        """The next request's answer never arrives (for an EndTxn, perhaps after it acted)."""
        self._exchange("lost", data)

    @rule(gap=st.booleans())
    def a_batch_fails(self, gap):
        """A batch of the transaction fails for good (or its partition's sequences break): the
        abort must recover by its EndTxn alone."""
        if self.tm.state is not S.IN_TRANSACTION:
            return
        self.produce(TP)
        self.drain()
        if gap:
            self.tm.on_sequence_gap(TP, "a gap")
        else:
            self.producer.wire.remove(TP)
            self.tm.on_batch_failed(TP, BrokerResponseError(E.NOT_ENOUGH_REPLICAS))
        event("batch failed")
        self._observe()

    @rule()
    def lose_the_next_end_txn_answer(self):
        """The next EndTxn acts, and its answer is lost: the retry is answered the new epoch."""
        self.lose_end_txn = True

    @invariant()
    def only_this_transactions_partitions_drain(self):
        assert all(tp in self.added for tp in self.producer.wire)


TestTxnMachineV2 = TxnMachineV2.TestCase
TestTxnMachineV2.settings = settings(max_examples=examples(300), stateful_step_count=60, deadline=None)


def test_abortable_error_codes_under_v2_are_abortable():
    tm, producer = v2_initialized()
    tm.begin_transaction()
    produce(tm, producer)
    tm.on_batch_failed(TP, BrokerResponseError(E.UNKNOWN_PRODUCER_ID))
    assert isinstance(tm.last_error, TransactionAbortableError)

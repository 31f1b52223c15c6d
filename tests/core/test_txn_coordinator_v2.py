"""Transactions V2 in the coordinator (KIP-890 part 2; reference/transactions_v2.md §3-4): the
epoch bump at every EndTxn v5, its answer, retries told apart by the bumped epoch, aborts from
Empty and Complete*, the new producer id at overflow (KAFKA-18660), one bump when InitProducerId
or the timeout sweeper aborts (KAFKA-19367, KAFKA-20090), and late requests of an earlier
transaction refused without touching the next one."""
from __future__ import annotations

import pytest
from tests.core.test_txn_coordinator import NOW, T0, T1, TID, U0, Harness

from oncelog.core.producer_epoch import EPOCH_EXHAUSTED_AT, MAX_EPOCH
from oncelog.core.txn.coordinator import Answer
from oncelog.core.txn.log_format import decode_value, encode_value
from oncelog.core.txn.state import TV_0, TV_2, TransactionMetadata, TxnState
from oncelog.protocol.errors import ErrorCode as E

S = TxnState


class V2(Harness):
    """Requests as a Transactions V2 client makes them: partitions added by the leaders
    (AddPartitionsToTxn v5), EndTxn v5."""

    def add(self, pid: int, epoch: int, *tps, tid: str = TID, now: int = NOW) -> int:
        reply = self.run(self.coord.prepare_add_partitions(tid, pid, epoch, tps or (T0,), now,
                                                           transaction_version=TV_2), now)
        assert reply is not None
        return reply.error

    def end2(self, pid: int, epoch: int, commit: bool, tid: str = TID, now: int = NOW) -> Answer:
        reply = self.run(self.coord.prepare_end_txn(tid, pid, epoch, commit, now, transaction_version=TV_2), now)
        assert reply is not None
        return reply

    def at(self, epoch: int, state: S = S.ONGOING, pid: int = 7, **extra) -> None:
        parts = frozenset({T0}) if state != S.EMPTY else frozenset()
        self.seed(TransactionMetadata(TID, pid, epoch, 60_000, state, parts, NOW - 10, NOW - 10,
                                      client_transaction_version=TV_2, **extra))


@pytest.fixture
def h() -> V2:
    return V2()


@pytest.mark.parametrize("commit", [True, False])
def test_end_txn_bumps_the_epoch_answers_it_and_the_markers_carry_it(h, commit):
    a = h.ongoing()
    pid, e = a.producer_id, a.producer_epoch
    reply = h.end2(pid, e, commit)
    assert reply == Answer(E.NONE, pid, e + 1)
    m = h.meta()
    assert (m.state, m.producer_id, m.producer_epoch, m.last_producer_epoch, m.client_transaction_version) == (
        S.PREPARE_COMMIT if commit else S.PREPARE_ABORT, pid, e + 1, e, TV_2)
    job = h.jobs[0]
    assert (job.producer_id, job.producer_epoch, job.commit, job.partitions) == (pid, e + 1, commit, {T0, T1})
    # while the markers are written, everything is told to wait, the retry included
    assert h.end2(pid, e, commit).error == E.CONCURRENT_TRANSACTIONS
    assert h.add(pid, e + 1, T0) == E.CONCURRENT_TRANSACTIONS
    h.markers_done()
    m = h.meta()
    assert (m.state, m.producer_id, m.producer_epoch, m.partitions) == (
        S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT, pid, e + 1, frozenset())


@pytest.mark.parametrize("commit", [True, False])
def test_a_retry_is_answered_from_the_completed_state_with_the_epoch_to_go_on_with(h, commit):
    a = h.ongoing()
    pid, e = a.producer_id, a.producer_epoch
    h.end2(pid, e, commit)
    h.markers_done()
    log_size = len(h.log)
    assert h.end2(pid, e, commit) == Answer(E.NONE, pid, e + 1)
    assert h.end2(pid, e, not commit).error == E.INVALID_TXN_STATE
    assert len(h.log) == log_size and h.meta().producer_epoch == e + 1


def test_the_next_transaction_runs_at_the_bumped_epoch_and_fences_late_requests_of_the_last(h):
    """The Jepsen/Bufstream sequence (KAFKA-17754): T1's ABORT arrives late, after T2 began at
    the same producer id. Under TV1 it would abort T2's prefix; here its epoch is T1's."""
    a = h.ongoing()
    pid, e = a.producer_id, a.producer_epoch
    assert h.end2(pid, e, True).error == E.NONE      # T1 commits at e, T2 runs at e+1
    h.markers_done()
    assert h.add(pid, e + 1, U0) == E.NONE
    before = h.meta()
    assert h.end2(pid, e, False).error == E.PRODUCER_FENCED   # T1's late abort
    assert h.end2(pid, e, True).error == E.PRODUCER_FENCED    # T1's late commit
    assert h.add(pid, e, T1) == E.PRODUCER_FENCED             # T1's late implicit add
    assert h.meta() == before and not h.jobs
    assert h.end2(pid, e + 1, True) == Answer(E.NONE, pid, e + 2)
    assert h.jobs[0].partitions == {U0} and h.jobs[0].producer_epoch == e + 2


def test_abort_with_nothing_added_bumps_from_empty_and_from_complete(h):
    a = h.ready()
    pid, e = a.producer_id, a.producer_epoch
    assert h.end2(pid, e, True).error == E.INVALID_TXN_STATE   # nothing to commit
    assert h.end2(pid, e, False) == Answer(E.NONE, pid, e + 1)
    m = h.meta()
    assert (m.state, m.partitions, m.start_ms) == (S.PREPARE_ABORT, frozenset(), NOW)
    assert h.jobs[0].partitions == frozenset()   # no marker to write: Complete* at once
    h.markers_done()
    assert h.meta().state == S.COMPLETE_ABORT
    assert h.end2(pid, e + 1, False) == Answer(E.NONE, pid, e + 2)   # current epoch: bump again
    h.markers_done()
    assert h.end2(pid, e + 2, True).error == E.INVALID_TXN_STATE


def test_an_older_or_newer_epoch_or_another_producer_id_is_refused(h):
    a = h.ongoing()
    pid, e = a.producer_id, a.producer_epoch
    before = h.meta()
    assert h.end2(pid, e + 1, True).error == E.PRODUCER_FENCED
    assert h.end2(pid, e - 1, True).error == E.PRODUCER_FENCED
    assert h.end2(pid, -1, True).error == E.PRODUCER_FENCED
    assert h.end2(pid + 1, e, True).error == E.INVALID_PRODUCER_ID_MAPPING
    assert h.end2(pid, e, True, tid="unknown").error == E.INVALID_PRODUCER_ID_MAPPING
    assert h.end2(pid, e, True, tid="").error == E.INVALID_REQUEST
    assert h.meta() == before and not h.jobs


def test_epoch_overflow_moves_to_a_new_producer_id(h):
    """KAFKA-18660: at EPOCH_EXHAUSTED_AT the markers carry MAX_EPOCH of the old id and the
    client is told the new id at epoch 0, in the answer and after a lost answer."""
    h.at(EPOCH_EXHAUSTED_AT)
    reply = h.end2(7, EPOCH_EXHAUSTED_AT, True)
    new = reply.producer_id
    assert reply == Answer(E.NONE, new, 0) and new not in (7, -1)
    m = h.meta()
    assert (m.producer_id, m.producer_epoch, m.next_producer_id, m.state) == (7, MAX_EPOCH, new, S.PREPARE_COMMIT)
    assert (h.jobs[0].producer_id, h.jobs[0].producer_epoch) == (7, MAX_EPOCH)
    # the client goes on with the new id before Complete* is written: told to wait, not fenced
    assert h.add(new, 0, U0) == E.CONCURRENT_TRANSACTIONS
    h.markers_done()
    m = h.meta()
    assert (m.producer_id, m.producer_epoch, m.last_producer_id, m.last_producer_epoch, m.next_producer_id) == (
        new, 0, 7, EPOCH_EXHAUSTED_AT, -1)
    assert h.end2(7, EPOCH_EXHAUSTED_AT, True) == Answer(E.NONE, new, 0)   # the retry
    assert h.end2(7, EPOCH_EXHAUSTED_AT, False).error == E.INVALID_TXN_STATE
    assert h.end2(7, EPOCH_EXHAUSTED_AT - 1, True).error == E.INVALID_PRODUCER_ID_MAPPING
    assert h.add(new, 0, U0) == E.NONE
    assert h.end2(new, 0, True) == Answer(E.NONE, new, 1)


def test_overflow_without_a_producer_id_at_hand_changes_nothing(h):
    h.at(EPOCH_EXHAUSTED_AT)
    before = h.meta()
    h.dry = True
    assert h.end2(7, EPOCH_EXHAUSTED_AT, True).error == E.COORDINATOR_LOAD_IN_PROGRESS
    assert h.meta() == before and h.coord.pending(TID) is None


def test_a_kill_9_between_prepare_and_complete_resends_the_bumped_markers(h):
    """The Prepare* record holds the bumped epoch and the next producer id: a reload resends
    the same markers and completes to the id and epoch the client was told."""
    h.at(EPOCH_EXHAUSTED_AT)
    new = h.end2(7, EPOCH_EXHAUSTED_AT, False).producer_id
    h.jobs.clear()              # the markers were never written
    h.epoch += 1
    h.jobs = h.coord.load(0, h.epoch, h.log, NOW)
    assert [(j.producer_id, j.producer_epoch, j.commit) for j in h.jobs] == [(7, MAX_EPOCH, False)]
    assert h.end2(7, EPOCH_EXHAUSTED_AT, False).error == E.CONCURRENT_TRANSACTIONS
    h.markers_done()
    m = h.meta()
    assert (m.producer_id, m.producer_epoch, m.state, m.client_transaction_version) == (new, 0, S.COMPLETE_ABORT, TV_2)
    h.epoch += 1
    assert h.coord.load(0, h.epoch, h.log, NOW) == [] and h.meta() == m


def test_init_producer_id_aborts_an_ongoing_v2_transaction_with_one_bump(h):
    """KAFKA-19367: the fence and its abort are one bump; the retry bumps once more."""
    a = h.ongoing()
    pid, e = a.producer_id, a.producer_epoch
    assert h.init().error == E.CONCURRENT_TRANSACTIONS
    m = h.meta()
    assert (m.state, m.producer_epoch) == (S.PREPARE_ABORT, e + 1)
    assert (h.jobs[0].producer_epoch, h.jobs[0].commit) == (e + 1, False)
    h.markers_done()
    assert h.init() == Answer(E.NONE, pid, e + 2)
    # the fenced instance's late requests
    assert h.end2(pid, e, True).error == E.PRODUCER_FENCED
    assert h.add(pid, e, T0) == E.PRODUCER_FENCED


def test_the_fenced_producers_abort_of_its_own_transaction_is_a_retry(h):
    """A timed-out transaction's client aborts it after the sweeper did: the abort happened,
    at the epoch after the client's (its commit would be INVALID_TXN_STATE)."""
    a = h.ongoing()
    pid, e = a.producer_id, a.producer_epoch
    [t] = h.coord.expire_timed_out(NOW + 61_000)
    h.run(t)
    h.markers_done()
    assert h.end2(pid, e, True).error == E.INVALID_TXN_STATE
    assert h.end2(pid, e, False) == Answer(E.NONE, pid, e + 1)


@pytest.mark.parametrize("how", ["init", "timeout"])
def test_a_fence_at_an_exhausted_epoch_moves_to_a_new_producer_id(h, how):
    """KAFKA-20090: a fence of a V2 transaction at EPOCH_EXHAUSTED_AT writes its abort at
    MAX_EPOCH and moves the id on, so that nobody is left holding MAX_EPOCH."""
    h.at(EPOCH_EXHAUSTED_AT)
    if how == "init":
        assert h.init().error == E.CONCURRENT_TRANSACTIONS
    else:
        [t] = h.coord.expire_timed_out(NOW + 61_000)
        h.run(t)
    m = h.meta()
    new = m.next_producer_id
    assert (m.producer_id, m.producer_epoch, m.state) == (7, MAX_EPOCH, S.PREPARE_ABORT) and new >= 0
    assert (h.jobs[0].producer_id, h.jobs[0].producer_epoch) == (7, MAX_EPOCH)
    h.markers_done()
    assert (h.meta().producer_id, h.meta().producer_epoch) == (new, 0)
    assert h.end2(7, EPOCH_EXHAUSTED_AT, False) == Answer(E.NONE, new, 0)
    assert h.init() == Answer(E.NONE, new, 1)


def test_the_sweeper_skips_an_exhausted_v2_transaction_until_a_producer_id_is_at_hand(h):
    h.at(EPOCH_EXHAUSTED_AT)
    h.dry = True
    assert h.coord.expire_timed_out(NOW + 61_000) == []
    h.dry = False
    assert len(h.coord.expire_timed_out(NOW + 62_000)) == 1


def test_a_v1_end_txn_of_a_v2_transaction_does_not_bump(h):
    """The request's version decides (Kafka's transactionVersionForEndTxn)."""
    a = h.ongoing()
    pid, e = a.producer_id, a.producer_epoch
    assert h.end(pid, e, True) == E.NONE
    assert h.jobs[0].producer_epoch == e and h.meta().producer_epoch == e


def test_adds_record_the_client_transaction_version(h):
    a = h.ready()
    pid, e = a.producer_id, a.producer_epoch
    assert h.add(pid, e, T0) == E.NONE
    assert h.meta().client_transaction_version == TV_2
    reply = h.run(h.coord.prepare_add_partitions(TID, pid, e, (T1,), NOW))
    assert reply == Answer() and h.meta().client_transaction_version == TV_0


def test_v2_fields_round_trip_through_the_log():
    meta = TransactionMetadata(TID, 7, MAX_EPOCH, 60_000, S.PREPARE_COMMIT, frozenset({T0}), 1, 2, 7,
                               EPOCH_EXHAUSTED_AT, next_producer_id=99, client_transaction_version=TV_2)
    assert decode_value(TID, encode_value(meta)) == meta
    with pytest.raises(ValueError):
        decode_value(TID, encode_value(meta.evolve(state=S.COMPLETE_COMMIT, partitions=frozenset())))

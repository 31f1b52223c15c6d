"""The transaction coordinator's decisions, one test per rule of reference/transactions.md §2 and
the tables of docs/transactions.md §1 and §7 (Kafka's TransactionCoordinatorTest cases)."""
from __future__ import annotations

import itertools

import pytest

from oncelog.core.producer_epoch import EPOCH_EXHAUSTED_AT, MAX_EPOCH
from oncelog.core.txn import errors as txn_errors
from oncelog.core.txn.coordinator import Answer, MarkerJob, TransactionCoordinator, Transition, TxnConfig
from oncelog.core.txn.log_format import decode_key, decode_value, partition_for
from oncelog.core.txn.marker_progress import MarkerOutcome, MarkerProgress, classify
from oncelog.core.txn.state import VALID_PREVIOUS, TransactionMetadata, TxnState
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.errors import KafkaProtocolError

S = TxnState
TID = "app-1"
T0, T1, U0 = ("t", 0), ("t", 1), ("u", 0)
NOW = 1_000_000


class Harness:
    """A coordinator owning every id (one partition), its log, and helpers that run a decision
    through append -> complete as the broker will."""

    def __init__(self, **config) -> None:
        self.pids = itertools.count(1000)
        self.dry = False
        self.coord = TransactionCoordinator(self._new_pid, TxnConfig(num_partitions=1, **config))
        self.epoch = 3
        self.coord.load(0, self.epoch, [], NOW)
        self.log: list[tuple[bytes, bytes | None]] = []
        self.jobs: list[MarkerJob] = []

    def _new_pid(self) -> int:
        if self.dry:
            raise KafkaProtocolError(E.COORDINATOR_LOAD_IN_PROGRESS, "no producer-id block")
        return next(self.pids)

    def run(self, decision: Answer | Transition, now: int = NOW) -> Answer | None:
        if isinstance(decision, Answer):
            return decision
        self.log.append(decision.record())
        done = self.coord.complete(decision, now)
        if done.markers is not None:
            self.jobs.append(done.markers)
        return done.reply

    def markers_done(self, now: int = NOW) -> None:
        while self.jobs:
            self.run(self.jobs.pop(0).completion, now)

    def init(self, tid: str = TID, pid: int = -1, epoch: int = -1, timeout: int = 60_000,
             now: int = NOW) -> Answer:
        reply = self.run(self.coord.prepare_init_producer_id(tid, timeout, now, pid, epoch), now)
        assert reply is not None
        return reply

    def add(self, pid: int, epoch: int, *tps, tid: str = TID, now: int = NOW) -> int:
        reply = self.run(self.coord.prepare_add_partitions(tid, pid, epoch, tps or (T0,), now), now)
        assert reply is not None
        return reply.error

    def end(self, pid: int, epoch: int, commit: bool, tid: str = TID, now: int = NOW) -> int:
        reply = self.run(self.coord.prepare_end_txn(tid, pid, epoch, commit, now), now)
        assert reply is not None
        return reply.error

    def meta(self, tid: str = TID) -> TransactionMetadata:
        m = self.coord.get(tid)
        assert m is not None
        return m

    def ready(self, tid: str = TID) -> Answer:
        a = self.init(tid)
        assert a.error == E.NONE
        return a

    def ongoing(self, tid: str = TID, *tps) -> Answer:
        a = self.ready(tid)
        assert self.add(a.producer_id, a.producer_epoch, *(tps or (T0, T1)), tid=tid) == E.NONE
        return a

    def seed(self, meta: TransactionMetadata) -> None:
        """Put a record in the log and reload, as if an earlier coordinator had written it."""
        from oncelog.core.txn.log_format import encode_record
        self.log.append(encode_record(meta.transactional_id, meta))
        self.epoch += 1
        self.jobs = self.coord.load(0, self.epoch, self.log, NOW)


@pytest.fixture
def h() -> Harness:
    return Harness()


# ---------------------------------------------------------------------------- states

def test_state_table_is_kafkas():
    assert {s.value: s.display_name for s in S} == {
        0: "Empty", 1: "Ongoing", 2: "PrepareCommit", 3: "PrepareAbort", 4: "CompleteCommit",
        5: "CompleteAbort", 6: "Dead", 7: "PrepareEpochFence"}
    assert VALID_PREVIOUS[S.EMPTY] == {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
    assert VALID_PREVIOUS[S.ONGOING] == {S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
    assert VALID_PREVIOUS[S.PREPARE_COMMIT] == {S.ONGOING}
    # Transactions V2 aborts from Empty and Complete* too (KAFKA-14563)
    assert VALID_PREVIOUS[S.PREPARE_ABORT] == {S.ONGOING, S.PREPARE_EPOCH_FENCE, S.EMPTY, S.COMPLETE_COMMIT,
                                               S.COMPLETE_ABORT}
    assert VALID_PREVIOUS[S.COMPLETE_COMMIT] == {S.PREPARE_COMMIT}
    assert VALID_PREVIOUS[S.COMPLETE_ABORT] == {S.PREPARE_ABORT}
    assert VALID_PREVIOUS[S.DEAD] == {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
    assert VALID_PREVIOUS[S.PREPARE_EPOCH_FENCE] == {S.ONGOING}
    assert S.from_name("PrepareCommit") is S.PREPARE_COMMIT and S.from_name("Nope") is None


# ---------------------------------------------------------------------------- InitProducerId

@pytest.mark.parametrize("tid", [""])
def test_init_empty_id_is_invalid_request(h, tid):
    assert h.init(tid).error == E.INVALID_REQUEST


@pytest.mark.parametrize("pid,epoch", [(5, -1), (-1, 0)])
def test_init_with_only_one_of_id_and_epoch_is_invalid_request(h, pid, epoch):
    assert h.init(pid=pid, epoch=epoch).error == E.INVALID_REQUEST


@pytest.mark.parametrize("timeout", [0, -1, 900_001])
def test_init_bad_timeout(h, timeout):
    assert h.init(timeout=timeout).error == E.INVALID_TRANSACTION_TIMEOUT
    assert h.coord.get(TID) is None


def test_init_timeout_at_the_maximum_is_accepted():
    h = Harness(max_timeout_ms=5000)
    assert h.init(timeout=5000).error == E.NONE
    assert h.init(timeout=5001).error == E.INVALID_TRANSACTION_TIMEOUT


def test_not_owned_and_loading_partitions():
    coord = TransactionCoordinator(lambda: 1, TxnConfig(num_partitions=2))
    p = partition_for(TID, 2)
    assert coord.prepare_init_producer_id(TID, 1000, NOW) == Answer(E.NOT_COORDINATOR)
    coord.begin_load(p, 0)
    assert coord.prepare_init_producer_id(TID, 1000, NOW) == Answer(E.COORDINATOR_LOAD_IN_PROGRESS)
    assert coord.prepare_add_partitions(TID, 1, 0, [T0], NOW) == Answer(E.COORDINATOR_LOAD_IN_PROGRESS)
    assert coord.prepare_end_txn(TID, 1, 0, True, NOW) == Answer(E.COORDINATOR_LOAD_IN_PROGRESS)
    assert coord.describe(TID) == (E.COORDINATOR_LOAD_IN_PROGRESS, None)
    assert coord.list_transactions(NOW)[0] == E.COORDINATOR_LOAD_IN_PROGRESS
    assert coord.finish_load(p, 0, NOW) == []
    assert isinstance(coord.prepare_init_producer_id(TID, 1000, NOW), Transition)
    other = next(f"id-{i}" for i in range(100) if partition_for(f"id-{i}", 2) != p)
    assert coord.prepare_init_producer_id(other, 1000, NOW) == Answer(E.NOT_COORDINATOR)


def test_init_unknown_id_gets_a_new_producer_id_at_epoch_0(h):
    a = h.init(timeout=30_000)
    assert a == Answer(E.NONE, 1000, 0)
    m = h.meta()
    assert (m.producer_id, m.producer_epoch, m.state, m.timeout_ms, m.start_ms) == (1000, 0, S.EMPTY, 30_000, -1)
    assert decode_key(h.log[-1][0]) == TID and decode_value(TID, h.log[-1][1]) == m


def test_init_without_a_producer_id_block_is_retriable_and_changes_nothing(h):
    h.dry = True
    assert h.init().error == E.COORDINATOR_LOAD_IN_PROGRESS
    assert h.coord.get(TID) is None and h.coord.pending(TID) is None
    h.dry = False
    assert h.init().error == E.NONE


def test_init_again_bumps_the_epoch_and_fences_the_previous_instance(h):
    first = h.ready()
    second = h.init()
    assert (second.producer_id, second.producer_epoch) == (first.producer_id, first.producer_epoch + 1)
    assert h.meta().last_producer_epoch == -1
    assert h.add(first.producer_id, first.producer_epoch) == E.PRODUCER_FENCED
    assert h.add(second.producer_id, second.producer_epoch) == E.NONE


def test_init_with_its_current_epoch_bumps_and_remembers_the_last_epoch(h):
    a = h.ready()
    b = h.init(pid=a.producer_id, epoch=a.producer_epoch)
    assert b == Answer(E.NONE, a.producer_id, a.producer_epoch + 1)
    assert h.meta().last_producer_epoch == a.producer_epoch


def test_init_retry_with_the_last_epoch_gets_the_same_epoch_without_a_second_bump(h):
    a = h.ready()
    b = h.init(pid=a.producer_id, epoch=a.producer_epoch)
    retry = h.init(pid=a.producer_id, epoch=a.producer_epoch)
    assert retry == b


def test_init_retry_survives_a_coordinator_move(h):
    a = h.ready()
    b = h.init(pid=a.producer_id, epoch=a.producer_epoch)
    h.epoch += 1
    h.coord = TransactionCoordinator(h._new_pid, TxnConfig(num_partitions=1))
    h.coord.load(0, h.epoch, h.log, NOW)
    assert h.init(pid=a.producer_id, epoch=a.producer_epoch) == b


@pytest.mark.parametrize("which", ["stale epoch", "other producer id"])
def test_init_with_a_fenced_producer_id_and_epoch(h, which):
    a = h.ready()
    h.init()  # another instance took over: epoch + 1, last epoch -1
    h.init()  # and again
    pid, epoch = (a.producer_id, a.producer_epoch) if which == "stale epoch" else (a.producer_id + 77, 0)
    assert h.init(pid=pid, epoch=epoch).error == E.PRODUCER_FENCED


def test_init_unknown_id_with_a_producer_id_gets_a_new_one(h):
    """A producer recovering with its old id after the transactional id expired (Kafka: epoch -1
    metadata accepts any expected id)."""
    assert h.init(pid=42, epoch=7) == Answer(E.NONE, 1000, 0)


def test_init_while_a_transition_is_pending(h):
    h.ready()
    t = h.coord.prepare_init_producer_id(TID, 1000, NOW)
    assert isinstance(t, Transition)
    assert h.init().error == E.CONCURRENT_TRANSACTIONS
    assert h.coord.prepare_add_partitions(TID, 1000, 0, [T0], NOW) == Answer(E.CONCURRENT_TRANSACTIONS)
    assert h.coord.prepare_end_txn(TID, 1000, 0, True, NOW) == Answer(E.CONCURRENT_TRANSACTIONS)


@pytest.mark.parametrize("commit", [True, False])
def test_init_in_prepare_is_concurrent_transactions(h, commit):
    a = h.ongoing()
    assert h.end(a.producer_id, a.producer_epoch, commit) == E.NONE
    assert h.meta().state == (S.PREPARE_COMMIT if commit else S.PREPARE_ABORT)
    assert h.init().error == E.CONCURRENT_TRANSACTIONS
    h.markers_done()
    assert h.meta().state == (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT)
    assert h.init().producer_epoch == a.producer_epoch + 1


def test_init_while_ongoing_fences_and_aborts_then_the_retry_bumps_again(h):
    a = h.ongoing()
    assert h.init().error == E.CONCURRENT_TRANSACTIONS
    m = h.meta()
    assert (m.state, m.producer_epoch, m.last_producer_epoch) == (S.PREPARE_ABORT, a.producer_epoch + 1, -1)
    [job] = h.jobs
    assert (job.commit, job.producer_id, job.producer_epoch, job.partitions) == (
        False, a.producer_id, a.producer_epoch + 1, frozenset({T0, T1}))
    assert job.coordinator_epoch == h.epoch
    # the fenced instance is refused; a retry of the new one waits for the markers
    assert h.end(a.producer_id, a.producer_epoch, True) == E.PRODUCER_FENCED
    assert h.init().error == E.CONCURRENT_TRANSACTIONS
    h.markers_done()
    assert h.meta().state == S.COMPLETE_ABORT and h.meta().partitions == frozenset()
    assert h.init() == Answer(E.NONE, a.producer_id, a.producer_epoch + 2)


def test_init_at_an_exhausted_epoch_rotates_to_a_new_producer_id(h):
    h.seed(TransactionMetadata(TID, 7, EPOCH_EXHAUSTED_AT, 60_000, S.EMPTY, update_ms=NOW))
    a = h.init()
    assert a == Answer(E.NONE, 1000, 0)
    m = h.meta()
    assert (m.last_producer_id, m.last_producer_epoch) == (7, -1)


def test_rotation_with_the_callers_epoch_records_it_and_a_retry_gets_the_new_id(h):
    h.seed(TransactionMetadata(TID, 7, EPOCH_EXHAUSTED_AT, 60_000, S.COMPLETE_COMMIT, update_ms=NOW,
                               start_ms=NOW - 5))
    a = h.init(pid=7, epoch=EPOCH_EXHAUSTED_AT)
    assert a == Answer(E.NONE, 1000, 0)
    assert (h.meta().last_producer_id, h.meta().last_producer_epoch) == (7, EPOCH_EXHAUSTED_AT)
    assert h.init(pid=7, epoch=EPOCH_EXHAUSTED_AT) == a  # the answer was lost: same id and epoch
    assert h.init(pid=7, epoch=EPOCH_EXHAUSTED_AT - 1).error == E.PRODUCER_FENCED


def test_fence_at_the_last_client_epoch_uses_the_reserved_epoch_then_rotates(h):
    h.seed(TransactionMetadata(TID, 7, EPOCH_EXHAUSTED_AT - 1, 60_000, S.EMPTY, update_ms=NOW))
    a = h.init()
    assert a == Answer(E.NONE, 7, EPOCH_EXHAUSTED_AT)
    assert h.add(7, EPOCH_EXHAUSTED_AT) == E.NONE
    assert h.init().error == E.CONCURRENT_TRANSACTIONS
    assert h.meta().producer_epoch == MAX_EPOCH
    h.markers_done()
    assert h.init() == Answer(E.NONE, 1000, 0)


# ---------------------------------------------------------------------------- AddPartitionsToTxn

def test_add_partitions_errors(h):
    assert h.add(1, 0, tid="") == E.INVALID_REQUEST
    assert h.add(1, 0) == E.INVALID_PRODUCER_ID_MAPPING  # unknown id
    a = h.ready()
    assert h.add(a.producer_id + 1, a.producer_epoch) == E.INVALID_PRODUCER_ID_MAPPING
    assert h.add(a.producer_id + 1, a.producer_epoch + 3) == E.INVALID_PRODUCER_ID_MAPPING  # pid first
    assert h.add(a.producer_id, a.producer_epoch + 1) == E.PRODUCER_FENCED
    assert h.meta().state == S.EMPTY


def test_add_partitions_starts_the_transaction_and_sets_its_start_time_once(h):
    a = h.ready()
    assert h.add(a.producer_id, a.producer_epoch, T0, now=NOW + 5) == E.NONE
    m = h.meta()
    assert (m.state, m.partitions, m.start_ms, m.update_ms) == (S.ONGOING, {T0}, NOW + 5, NOW + 5)
    assert h.add(a.producer_id, a.producer_epoch, T1, now=NOW + 9) == E.NONE
    m = h.meta()
    assert (m.partitions, m.start_ms, m.update_ms) == ({T0, T1}, NOW + 5, NOW + 9)


def test_add_partitions_already_in_the_transaction_writes_nothing(h):
    a = h.ongoing()
    written = len(h.log)
    assert h.coord.prepare_add_partitions(TID, a.producer_id, a.producer_epoch, [T1, T0], NOW) == Answer()
    assert len(h.log) == written


@pytest.mark.parametrize("commit", [True, False])
def test_add_partitions_while_preparing_is_concurrent(h, commit):
    a = h.ongoing()
    h.end(a.producer_id, a.producer_epoch, commit)
    assert h.add(a.producer_id, a.producer_epoch, U0) == E.CONCURRENT_TRANSACTIONS
    h.markers_done()
    assert h.add(a.producer_id, a.producer_epoch, U0) == E.NONE  # a new transaction
    assert h.meta().partitions == {U0}


def test_add_offsets_adds_the_groups_offsets_partition(h):
    a = h.ready()
    reply = h.run(h.coord.prepare_add_offsets(TID, a.producer_id, a.producer_epoch, "group-a", NOW))
    assert reply == Answer()
    n = partition_for("group-a", 50)
    assert h.meta().partitions == {("__consumer_offsets", n)}
    assert h.coord.offsets_partition("group-a") == ("__consumer_offsets", n)


# ---------------------------------------------------------------------------- VerifyOnly

def test_verify_only(h):
    assert h.coord.verify_partitions("", 1, 0, [T0]) == {T0: E.INVALID_REQUEST}
    assert h.coord.verify_partitions(TID, 1, 0, [T0]) == {T0: E.INVALID_PRODUCER_ID_MAPPING}
    a = h.ongoing(TID, T0)
    pid, ep = a.producer_id, a.producer_epoch
    assert h.coord.verify_partitions(TID, pid, ep, [T0, T1]) == {T0: E.NONE, T1: E.TRANSACTION_ABORTABLE}
    assert h.coord.verify_partitions(TID, pid + 1, ep, [T0]) == {T0: E.INVALID_PRODUCER_ID_MAPPING}
    assert h.coord.verify_partitions(TID, pid, ep + 1, [T0]) == {T0: E.PRODUCER_FENCED}
    # a pending add is not yet in the transaction
    t = h.coord.prepare_add_partitions(TID, pid, ep, [T1], NOW)
    assert isinstance(t, Transition)
    assert h.coord.verify_partitions(TID, pid, ep, [T1]) == {T1: E.TRANSACTION_ABORTABLE}
    h.run(t)
    assert h.coord.verify_partitions(TID, pid, ep, [T1]) == {T1: E.NONE}
    h.end(pid, ep, commit=True)
    assert h.coord.verify_partitions(TID, pid, ep, [T0]) == {T0: E.CONCURRENT_TRANSACTIONS}
    h.markers_done()
    assert h.coord.verify_partitions(TID, pid, ep, [T0]) == {T0: E.TRANSACTION_ABORTABLE}


# ---------------------------------------------------------------------------- EndTxn

def _into(h: Harness, state: TxnState) -> Answer:
    a = h.ready()
    if state == S.EMPTY:
        return a
    h.add(a.producer_id, a.producer_epoch)
    if state == S.ONGOING:
        return a
    h.end(a.producer_id, a.producer_epoch, commit=state in (S.PREPARE_COMMIT, S.COMPLETE_COMMIT))
    if state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
        h.markers_done()
    assert h.meta().state == state
    return a


END_TXN_TABLE = [
    (S.ONGOING, True, E.NONE), (S.ONGOING, False, E.NONE),
    (S.COMPLETE_COMMIT, True, E.NONE), (S.COMPLETE_COMMIT, False, E.INVALID_TXN_STATE),
    (S.COMPLETE_ABORT, True, E.INVALID_TXN_STATE), (S.COMPLETE_ABORT, False, E.NONE),
    (S.PREPARE_COMMIT, True, E.CONCURRENT_TRANSACTIONS), (S.PREPARE_COMMIT, False, E.INVALID_TXN_STATE),
    (S.PREPARE_ABORT, True, E.INVALID_TXN_STATE), (S.PREPARE_ABORT, False, E.CONCURRENT_TRANSACTIONS),
    (S.EMPTY, True, E.INVALID_TXN_STATE), (S.EMPTY, False, E.INVALID_TXN_STATE),
]


@pytest.mark.parametrize("state,commit,code", END_TXN_TABLE)
def test_end_txn_table(h, state, commit, code):
    a = _into(h, state)
    before = h.meta()
    written = len(h.log)
    decision = h.coord.prepare_end_txn(TID, a.producer_id, a.producer_epoch, commit, NOW + 1)
    if state == S.ONGOING:
        assert isinstance(decision, Transition) and decision.reply == Answer()
        assert decision.after.state == (S.PREPARE_COMMIT if commit else S.PREPARE_ABORT)
        return
    assert decision == Answer(code)
    assert h.meta() == before and len(h.log) == written  # the state unchanged


def test_end_txn_checks_the_producer_id_before_the_epoch(h):
    a = h.ongoing()
    assert h.end(a.producer_id + 1, a.producer_epoch + 1, True) == E.INVALID_PRODUCER_ID_MAPPING
    assert h.end(a.producer_id, a.producer_epoch + 1, True) == E.PRODUCER_FENCED
    assert h.end(a.producer_id, a.producer_epoch, True, tid="") == E.INVALID_REQUEST
    assert h.end(a.producer_id, a.producer_epoch, True, tid="unknown") == E.INVALID_PRODUCER_ID_MAPPING


def test_commit_writes_markers_then_complete_with_no_partitions(h):
    a = h.ongoing()
    assert h.end(a.producer_id, a.producer_epoch, True, now=NOW + 10) == E.NONE
    [job] = h.jobs
    assert (job.transactional_id, job.commit, job.partitions) == (TID, True, frozenset({T0, T1}))
    completion = job.completion
    assert h.coord.pending(TID) is completion
    assert completion.after.state == S.COMPLETE_COMMIT and completion.after.partitions == frozenset()
    h.markers_done(now=NOW + 20)
    m = h.meta()
    assert (m.state, m.partitions, m.start_ms) == (S.COMPLETE_COMMIT, frozenset(), NOW)
    assert h.coord.pending(TID) is None


# ---------------------------------------------------------------------------- appends that fail

APPEND_ERRORS = [
    (E.UNKNOWN_TOPIC_OR_PARTITION, E.COORDINATOR_NOT_AVAILABLE),
    (E.NOT_ENOUGH_REPLICAS, E.COORDINATOR_NOT_AVAILABLE),
    (E.NOT_ENOUGH_REPLICAS_AFTER_APPEND, E.COORDINATOR_NOT_AVAILABLE),
    (E.REQUEST_TIMED_OUT, E.COORDINATOR_NOT_AVAILABLE),
    (E.NOT_LEADER_OR_FOLLOWER, E.NOT_COORDINATOR),
    (E.KAFKA_STORAGE_ERROR, E.NOT_COORDINATOR),
    (E.MESSAGE_TOO_LARGE, E.UNKNOWN_SERVER_ERROR),
    (E.RECORD_LIST_TOO_LARGE, E.UNKNOWN_SERVER_ERROR),
    (E.UNKNOWN_SERVER_ERROR, E.UNKNOWN_SERVER_ERROR),
]


@pytest.mark.parametrize("append_error,answer", APPEND_ERRORS)
def test_failed_append_answers_the_translated_code_and_changes_nothing(h, append_error, answer):
    a = h.ongoing()
    before = h.meta()
    t = h.coord.prepare_end_txn(TID, a.producer_id, a.producer_epoch, True, NOW)
    assert h.coord.abort_pending(t, append_error) == Answer(answer)
    assert h.meta() == before and h.coord.pending(TID) is None
    assert h.end(a.producer_id, a.producer_epoch, True) == E.NONE  # not stuck


def test_failed_append_of_a_new_id_forgets_it(h):
    t = h.coord.prepare_init_producer_id(TID, 1000, NOW)
    assert h.coord.abort_pending(t, E.KAFKA_STORAGE_ERROR) == Answer(E.NOT_COORDINATOR)
    assert h.coord.get(TID) is None and h.coord.describe(TID)[0] == E.TRANSACTIONAL_ID_NOT_FOUND
    assert h.init().error == E.NONE


def test_failed_fence_leaves_the_old_epoch_and_the_next_fence_bumps_once(h):
    a = h.ongoing()
    t = h.coord.prepare_init_producer_id(TID, 1000, NOW)
    assert h.coord.abort_pending(t, E.REQUEST_TIMED_OUT) == Answer(E.COORDINATOR_NOT_AVAILABLE)
    assert h.meta().producer_epoch == a.producer_epoch and h.meta().state == S.ONGOING
    assert h.init().error == E.CONCURRENT_TRANSACTIONS
    assert h.meta().producer_epoch == a.producer_epoch + 1


def test_failed_completion_append_stays_pending_for_a_retry(h):
    a = h.ongoing()
    h.end(a.producer_id, a.producer_epoch, False)
    [job] = h.jobs
    assert h.coord.abort_pending(job.completion, E.REQUEST_TIMED_OUT) is None
    assert h.coord.pending(TID) is job.completion
    assert h.init().error == E.CONCURRENT_TRANSACTIONS
    h.markers_done()
    assert h.meta().state == S.COMPLETE_ABORT


def test_completion_after_the_partition_moved_is_not_coordinator(h):
    a = h.ready()
    t = h.coord.prepare_add_partitions(TID, a.producer_id, a.producer_epoch, [T0], NOW)
    h.coord.unload(0)
    assert h.coord.complete(t, NOW).reply == Answer(E.NOT_COORDINATOR)
    h.coord.load(0, h.epoch + 1, h.log, NOW)  # the record never reached the log
    t2 = h.coord.prepare_add_partitions(TID, a.producer_id, a.producer_epoch, [T0], NOW)
    h.log.append(t2.record())
    h.coord.load(0, h.epoch + 2, h.log, NOW)  # reloaded before completing: the log has it
    assert h.coord.complete(t2, NOW).reply == Answer(E.NOT_COORDINATOR)
    assert h.meta().state == S.ONGOING and h.meta().partitions == {T0}


# ---------------------------------------------------------------------------- loading

def test_load_resumes_every_prepared_transaction(h):
    ids = ["a", "b", "c", "d"]
    grants = {i: h.ongoing(i) for i in ids}
    assert h.end(grants["a"].producer_id, grants["a"].producer_epoch, True, tid="a") == E.NONE
    assert h.end(grants["b"].producer_id, grants["b"].producer_epoch, False, tid="b") == E.NONE
    assert h.init("c").error == E.CONCURRENT_TRANSACTIONS  # fenced: PrepareAbort at a new epoch
    h.jobs.clear()  # kill -9: markers never sent
    live = {i: h.meta(i) for i in ids}
    coord = TransactionCoordinator(h._new_pid, TxnConfig(num_partitions=1))
    jobs = coord.load(0, 9, h.log, NOW + 100)
    assert {i: coord.get(i) for i in ids} == live
    assert sorted((j.transactional_id, j.commit, j.coordinator_epoch) for j in jobs) == [
        ("a", True, 9), ("b", False, 9), ("c", False, 9)]
    assert {j.transactional_id: j.producer_epoch for j in jobs}["c"] == grants["c"].producer_epoch + 1
    assert coord.prepare_init_producer_id("a", 1000, NOW) == Answer(E.CONCURRENT_TRANSACTIONS)
    for j in jobs:
        coord.complete(j.completion, NOW + 200)
    assert [coord.get(i).state for i in ids] == [S.COMPLETE_COMMIT, S.COMPLETE_ABORT, S.COMPLETE_ABORT,
                                                 S.ONGOING]


def test_load_superseded_by_a_newer_epoch_returns_nothing():
    coord = TransactionCoordinator(lambda: 1, TxnConfig(num_partitions=1))
    coord.begin_load(0, 1)
    coord.begin_load(0, 2)
    assert coord.finish_load(0, 1, NOW) == []
    assert coord.owned() == {}
    assert coord.finish_load(0, 2, NOW) == [] and coord.owned() == {0: 2}


def test_replay_refuses_foreign_records():
    coord = TransactionCoordinator(lambda: 1, TxnConfig(num_partitions=2))
    coord.begin_load(0, 1)
    with pytest.raises(ValueError):
        coord.replay(0, b"\x00\x07junk", None)
    tid = next(f"x{i}" for i in range(100) if partition_for(f"x{i}", 2) == 1)
    from oncelog.core.txn.log_format import encode_key
    with pytest.raises(ValueError):
        coord.replay(0, encode_key(tid), None)


def test_tombstone_in_the_log_removes_the_id(h):
    h.ready()
    from oncelog.core.txn.log_format import encode_record
    h.log.append(encode_record(TID, None))
    h.coord.load(0, 99, h.log, NOW)
    assert h.coord.get(TID) is None


def test_snapshot_records_rebuild_the_same_cache(h):
    h.ongoing("a")
    h.ready("b")
    snap = h.coord.snapshot_records(0)
    coord = TransactionCoordinator(h._new_pid, TxnConfig(num_partitions=1))
    coord.load(0, 1, snap, NOW)
    assert coord.get("a") == h.meta("a") and coord.get("b") == h.meta("b")


# ---------------------------------------------------------------------------- timers

def test_timed_out_transaction_is_fenced_and_aborted(h):
    a = h.init(timeout=1000)
    h.add(a.producer_id, a.producer_epoch, now=NOW)
    assert h.coord.expire_timed_out(NOW + 1000) == []  # start + timeout < now, strictly
    [t] = h.coord.expire_timed_out(NOW + 1001)
    assert t.reply is None and t.after.state == S.PREPARE_ABORT
    assert t.after.producer_epoch == a.producer_epoch + 1
    assert h.coord.expire_timed_out(NOW + 5000) == []  # pending: not twice
    h.run(t)
    h.markers_done()
    assert h.meta().state == S.COMPLETE_ABORT
    assert h.end(a.producer_id, a.producer_epoch, True) == E.PRODUCER_FENCED


def test_idle_ids_expire_and_active_ones_do_not():
    h = Harness(transactional_id_expiration_ms=10_000)
    h.ready("idle")
    h.ongoing("busy")
    assert h.coord.expire_transactional_ids(NOW + 9_999) == []
    ts = h.coord.expire_transactional_ids(NOW + 10_000)
    assert [t.transactional_id for t in ts] == ["idle"]
    assert ts[0].record()[1] is None  # a tombstone
    assert h.init("idle").error == E.CONCURRENT_TRANSACTIONS  # Dead is pending
    for t in ts:
        h.run(t)
    assert h.coord.get("idle") is None and h.coord.get("busy") is not None
    assert h.init("idle") == Answer(E.NONE, h.meta("idle").producer_id, 0)


# ---------------------------------------------------------------------------- admin

def test_describe_and_list(h):
    assert h.coord.describe("") == (E.INVALID_REQUEST, None)
    assert h.coord.describe("nobody") == (E.TRANSACTIONAL_ID_NOT_FOUND, None)
    a = h.ongoing("a")
    h.ready("b")
    err, meta = h.coord.describe("a")
    assert err == E.NONE and meta.producer_id == a.producer_id and meta.state.display_name == "Ongoing"
    err, unknown, metas = h.coord.list_transactions(NOW + 50, states=["Ongoing", "Bogus"])
    assert (err, unknown, [m.transactional_id for m in metas]) == (E.NONE, ["Bogus"], ["a"])
    _e, _u, metas = h.coord.list_transactions(NOW + 50, producer_ids=[a.producer_id])
    assert [m.transactional_id for m in metas] == ["a"]
    _e, _u, metas = h.coord.list_transactions(NOW + 50, duration_ms=50)
    assert [m.transactional_id for m in metas] == ["b"]  # "a" started 50 ms ago; Empty has no start
    _e, _u, metas = h.coord.list_transactions(NOW + 51, duration_ms=50)
    assert sorted(m.transactional_id for m in metas) == ["a", "b"]


# ---------------------------------------------------------------------------- codes per version

@pytest.mark.parametrize("api,version,code,answer", [
    (ApiKey.INIT_PRODUCER_ID, 3, E.PRODUCER_FENCED, E.INVALID_PRODUCER_EPOCH),
    (ApiKey.INIT_PRODUCER_ID, 4, E.PRODUCER_FENCED, E.PRODUCER_FENCED),
    (ApiKey.ADD_PARTITIONS_TO_TXN, 1, E.PRODUCER_FENCED, E.INVALID_PRODUCER_EPOCH),
    (ApiKey.ADD_PARTITIONS_TO_TXN, 2, E.PRODUCER_FENCED, E.PRODUCER_FENCED),
    (ApiKey.ADD_OFFSETS_TO_TXN, 1, E.PRODUCER_FENCED, E.INVALID_PRODUCER_EPOCH),
    (ApiKey.ADD_OFFSETS_TO_TXN, 3, E.PRODUCER_FENCED, E.PRODUCER_FENCED),
    (ApiKey.END_TXN, 0, E.PRODUCER_FENCED, E.INVALID_PRODUCER_EPOCH),
    (ApiKey.END_TXN, 2, E.PRODUCER_FENCED, E.PRODUCER_FENCED),
    (ApiKey.PRODUCE, 10, E.TRANSACTION_ABORTABLE, E.INVALID_TXN_STATE),
    (ApiKey.PRODUCE, 11, E.TRANSACTION_ABORTABLE, E.TRANSACTION_ABORTABLE),
    (ApiKey.PRODUCE, 14, E.PRODUCER_FENCED, E.INVALID_PRODUCER_EPOCH),
    (ApiKey.TXN_OFFSET_COMMIT, 3, E.TRANSACTION_ABORTABLE, E.INVALID_TXN_STATE),
    (ApiKey.TXN_OFFSET_COMMIT, 4, E.TRANSACTION_ABORTABLE, E.TRANSACTION_ABORTABLE),
    (ApiKey.TXN_OFFSET_COMMIT, 1, E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_NOT_AVAILABLE),
    (ApiKey.TXN_OFFSET_COMMIT, 2, E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_LOAD_IN_PROGRESS),
    (ApiKey.END_TXN, 0, E.CONCURRENT_TRANSACTIONS, E.CONCURRENT_TRANSACTIONS),
])
def test_codes_per_version(api, version, code, answer):
    assert txn_errors.for_version(api, version, code) == answer


def test_verification_error_hides_cluster_authorization():
    assert txn_errors.verification_error(E.CLUSTER_AUTHORIZATION_FAILED, ApiKey.PRODUCE, 11) == E.INVALID_TXN_STATE
    assert txn_errors.verification_error(E.PRODUCER_FENCED, ApiKey.PRODUCE, 9) == E.INVALID_PRODUCER_EPOCH
    assert txn_errors.verification_error(E.TRANSACTION_ABORTABLE, ApiKey.PRODUCE, 9) == E.INVALID_TXN_STATE


# ---------------------------------------------------------------------------- markers

@pytest.mark.parametrize("code,outcome", [
    (E.NONE, MarkerOutcome.DONE), (E.UNSUPPORTED_FOR_MESSAGE_FORMAT, MarkerOutcome.DONE),
    (E.UNSUPPORTED_VERSION, MarkerOutcome.DONE),
    (E.NOT_LEADER_OR_FOLLOWER, MarkerOutcome.RETRY), (E.UNKNOWN_TOPIC_OR_PARTITION, MarkerOutcome.RETRY),
    (E.NOT_ENOUGH_REPLICAS, MarkerOutcome.RETRY), (E.REQUEST_TIMED_OUT, MarkerOutcome.RETRY),
    (E.KAFKA_STORAGE_ERROR, MarkerOutcome.RETRY),
    (E.INVALID_PRODUCER_EPOCH, MarkerOutcome.STOP), (E.TRANSACTION_COORDINATOR_FENCED, MarkerOutcome.STOP),
    (E.CORRUPT_MESSAGE, MarkerOutcome.UNEXPECTED),
])
def test_marker_outcomes(code, outcome):
    assert classify(code) is outcome


def test_marker_progress(h):
    a = h.ongoing()
    h.end(a.producer_id, a.producer_epoch, True)
    progress = MarkerProgress(h.jobs[0])
    assert progress.on_result(T0, E.NOT_LEADER_OR_FOLLOWER) is MarkerOutcome.RETRY
    assert not progress.finished
    progress.on_result(T0, E.NONE)
    progress.on_partition_gone(T1)
    assert progress.finished
    stopped = MarkerProgress(h.jobs[0])
    stopped.on_result(T0, E.NONE)
    stopped.on_result(T1, E.TRANSACTION_COORDINATOR_FENCED)
    assert not stopped.finished and stopped.stopped


def test_keep_prepared_at_an_exhausted_epoch_is_refused():
    """KIP-939: each KeepPreparedTxn bumps the epoch; at the last one the transaction's manager
    is told INVALID_TXN_STATE (it must complete the transaction another way) rather than the id
    rotated, so restarts cannot keep a transaction for ever."""
    from oncelog.core.txn.state import TWO_PC_TIMEOUT_MS
    h = Harness(two_phase_commit_enable=True)
    h.seed(TransactionMetadata(TID, 7, EPOCH_EXHAUSTED_AT, TWO_PC_TIMEOUT_MS, S.ONGOING, frozenset({T0}),
                               start_ms=NOW - 5, update_ms=NOW))
    written = len(h.log)
    a = h.coord.prepare_init_producer_id(TID, 60_000, NOW, enable_2pc=True, keep_prepared=True)
    assert a == Answer(E.INVALID_TXN_STATE)
    assert h.meta().partitions == frozenset({T0}) and len(h.log) == written

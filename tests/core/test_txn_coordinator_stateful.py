"""Hypothesis drives the transaction coordinator against a plain model.

Several producers share a few transactional ids (on two `__transaction_state` partitions) and send
InitProducerId (with and without their id/epoch), AddPartitionsToTxn, AddOffsetsToTxn and EndTxn
in any order, as Transactions V1 or V2 clients (EndTxn v5 bumps the epoch and tells the producer
the (id, epoch) to go on with; the partition leaders add partitions for V2 clients; "omega"
starts one commit away from an epoch overflow); the test plays the broker: it appends prepared
transitions to a per-partition log, in any order, sometimes failing, completes them later,
delivers markers, runs the timeout and expiry sweeps, and restarts a partition's coordinator from
its log at a new epoch (a kill -9 or a leader move: appended-but-not-completed records survive,
everything in memory is lost).

The model is a dict of plain tuples updated by the spec's rules. Checked after every step: the
durable state equals the model's; an id is pending exactly when the model says so; every id in
Prepare* has its Complete* pending with a marker job held or its record on the way; only the
current (pid, epoch) of an id is accepted, every older grant gets PRODUCER_FENCED or
INVALID_PRODUCER_ID_MAPPING, so a late request of an earlier transaction never acts on a later
one; grants only move forward; markers carry the epoch the Prepare* record holds. At teardown
every Prepare* is driven to Complete* (a Prepare* always leads to Complete*).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tests.tiers import examples

from oncelog.core.producer_epoch import EPOCH_EXHAUSTED_AT, MAX_EPOCH
from oncelog.core.txn.coordinator import Answer, MarkerJob, TransactionCoordinator, Transition, TxnConfig
from oncelog.core.txn.errors import for_version, translate_append_error
from oncelog.core.txn.log_format import encode_record, partition_for
from oncelog.core.txn.state import TV_0, TV_2, VALID_PREVIOUS, TransactionMetadata, TxnState
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.errors import KafkaProtocolError

S = TxnState
PARTS = 2
# omega starts near epoch exhaustion; sigma in a V2 transaction at an exhausted epoch, which its
# producer (the fourth) ends (an overflow) or a fence aborts (a new producer id either way)
IDS = ["alpha", "beta", "omega", "sigma"]
TPS = [("t", 0), ("t", 1), ("u", 0)]
MAX_TIMEOUT = 60_000
EXPIRATION = 50_000
CONFIG = TxnConfig(max_timeout_ms=MAX_TIMEOUT, transactional_id_expiration_ms=EXPIRATION, num_partitions=PARTS)
IDLE = {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
PREPARED = {S.PREPARE_COMMIT, S.PREPARE_ABORT}
N_PRODUCERS = 5
APPEND_ERRORS = [E.NOT_LEADER_OR_FOLLOWER, E.REQUEST_TIMED_OUT, E.KAFKA_STORAGE_ERROR, E.MESSAGE_TOO_LARGE]
# the versions each request is answered at (docs/transactions.md §6) and the first one that
# knows PRODUCER_FENCED (older ones are told INVALID_PRODUCER_EPOCH, as Kafka's KafkaApis does)
VERSIONS = {ApiKey.INIT_PRODUCER_ID: 5, ApiKey.ADD_PARTITIONS_TO_TXN: 3, ApiKey.ADD_OFFSETS_TO_TXN: 3,
            ApiKey.END_TXN: 5}
END_TXN_V2 = 5   # EndTxn v5+: Transactions V2
FENCED_SINCE = {ApiKey.INIT_PRODUCER_ID: 4, ApiKey.ADD_PARTITIONS_TO_TXN: 2, ApiKey.ADD_OFFSETS_TO_TXN: 2,
                ApiKey.END_TXN: 2}


def on_the_wire(api: int, version: int, code: int) -> int:
    """The model's answer to a client speaking `version`."""
    if code == E.PRODUCER_FENCED and version < FENCED_SINCE[api]:
        return E.INVALID_PRODUCER_EPOCH
    return code


def versions(api: int):
    return st.tuples(st.just(api), st.integers(0, VERSIONS[api]))


@dataclass(frozen=True)
class M:
    """The model's durable record of one id."""
    pid: int
    epoch: int
    last_pid: int
    last_epoch: int
    state: TxnState
    parts: frozenset
    timeout: int
    start: int
    update: int
    next_pid: int = -1
    ctv: int = TV_0


def as_model(meta: TransactionMetadata) -> M:
    return M(meta.producer_id, meta.producer_epoch, meta.last_producer_id, meta.last_producer_epoch,
             meta.state, meta.partitions, meta.timeout_ms, meta.start_ms, meta.update_ms,
             meta.next_producer_id, meta.client_transaction_version)


# Transactions V2's EndTxn (reference/transactions_v2.md §3): (state, commit, a retry of the
# bumped epoch?) -> "bump" or the code; pending transitions, producer ids and epochs are checked
# before (pending first)
V2_TABLE = {
    (S.EMPTY, False, False): "bump", (S.EMPTY, True, False): E.INVALID_TXN_STATE,
    (S.ONGOING, False, False): "bump", (S.ONGOING, True, False): "bump",
    (S.COMPLETE_ABORT, False, True): E.NONE, (S.COMPLETE_ABORT, True, True): E.INVALID_TXN_STATE,
    (S.COMPLETE_ABORT, False, False): "bump", (S.COMPLETE_ABORT, True, False): E.INVALID_TXN_STATE,
    (S.COMPLETE_COMMIT, True, True): E.NONE, (S.COMPLETE_COMMIT, False, True): E.INVALID_TXN_STATE,
    (S.COMPLETE_COMMIT, False, False): "bump", (S.COMPLETE_COMMIT, True, False): E.INVALID_TXN_STATE,
}


@dataclass
class InFlight:
    transition: Transition
    predicted: M | None    # None: a tombstone
    kind: str              # init / fence / add / end / complete / expire
    producer: int | None   # who asked (None: the coordinator itself)


class CoordinatorMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        self.now = 1_000_000
        self.next_pid = 1000
        self.dry = False
        self.epochs = {p: 1 for p in range(PARTS)}
        self.logs: dict[int, list] = {p: [] for p in range(PARTS)}
        self.model: dict[str, M] = {}
        self.model_pending: dict[str, str] = {}  # tid -> kind
        self.inflight: list[InFlight] = []        # prepared, not yet appended
        self.appended: list[InFlight] = []        # appended, not yet completed
        self.jobs: dict[str, tuple[MarkerJob, InFlight]] = {}
        self.producers = [{"tid": IDS[i % len(IDS)], "grant": None} for i in range(N_PRODUCERS)]
        self.grants: dict[str, list[tuple[int, int]]] = {t: [] for t in IDS}
        self.coord = TransactionCoordinator(self._new_pid, CONFIG)
        self.request: tuple[int, int] | None = None  # (api key, version) of the request being judged
        seed = TransactionMetadata("omega", 7, EPOCH_EXHAUSTED_AT - 1, 1000, S.EMPTY, update_ms=self.now)
        self.logs[partition_for("omega", PARTS)].append(encode_record("omega", seed))
        self.model["omega"] = as_model(seed)
        seed = TransactionMetadata("sigma", 9, EPOCH_EXHAUSTED_AT, MAX_TIMEOUT, S.ONGOING, frozenset(TPS[:1]),
                                   self.now, self.now, client_transaction_version=TV_2)
        self.logs[partition_for("sigma", PARTS)].append(encode_record("sigma", seed))
        self.model["sigma"] = as_model(seed)
        self.producers[3]["grant"] = (9, EPOCH_EXHAUSTED_AT)
        self.grants["sigma"].append((9, EPOCH_EXHAUSTED_AT))
        for p in range(PARTS):
            assert self.coord.load(p, self.epochs[p], self.logs[p], self.now) == []

    def _new_pid(self) -> int:
        if self.dry:
            raise KafkaProtocolError(E.COORDINATOR_LOAD_IN_PROGRESS, "dry")
        self.next_pid += 1
        return self.next_pid

    # ------------------------------------------------------------------ the model's rules
    def _expect_producer(self, tid: str, grant) -> int:
        m = self.model.get(tid)
        if grant is None or m is None or m.pid != grant[0]:
            return E.INVALID_PRODUCER_ID_MAPPING
        if m.epoch != grant[1]:
            return E.PRODUCER_FENCED
        return E.NONE

    def _fence(self, m: M) -> M | None:
        """None: the fence needs a new producer id (V2 at an exhausted epoch) and none is at hand."""
        rotate = m.ctv == TV_2 and m.epoch >= EPOCH_EXHAUSTED_AT
        if rotate and self.dry:
            return None
        if rotate:
            event("fence moves to a new producer id")
        return replace(m, state=S.PREPARE_ABORT, epoch=m.epoch + 1, last_epoch=-1, last_pid=m.pid,
                       update=self.now, next_pid=self.next_pid if rotate else -1)  # the id just drawn

    def _offer(self, decision, predicted_kind: str, predicted: M | None, tid: str, producer: int | None,
               expect_error: int | None):
        """Compare a decision (and, for an answer, what a client speaking `request` = (api key,
        version) is told) with the model's expectation; queue a transition."""
        event(f"{predicted_kind or 'answer'} {E(expect_error).name if expect_error is not None else ''}")
        if expect_error is not None:
            assert isinstance(decision, Answer) and decision.error == expect_error, (tid, decision, expect_error)
            if self.request is not None:
                api, version = request = self.request
                told = for_version(api, version, decision.error)
                assert told == on_the_wire(api, version, expect_error), (tid, request, E(told).name)
                if told != decision.error:
                    event(f"{ApiKey(api).name} v{version} told {E(told).name}")
            return
        assert isinstance(decision, Transition), (tid, decision, predicted)
        got = None if decision.after is None else as_model(decision.after)
        assert got == predicted, (tid, got, predicted)
        self.model_pending[tid] = predicted_kind
        self.inflight.append(InFlight(decision, predicted, predicted_kind, producer))

    # ------------------------------------------------------------------ requests
    @rule(i=st.integers(0, N_PRODUCERS - 1), use_expected=st.booleans(),
          timeout=st.sampled_from([5000, MAX_TIMEOUT, 500, MAX_TIMEOUT + 1]),
          request=versions(ApiKey.INIT_PRODUCER_ID))
    def init(self, i, use_expected, timeout, request=(ApiKey.INIT_PRODUCER_ID, 5)):
        self.request = request
        prod = self.producers[i]
        tid, grant = prod["tid"], prod["grant"]
        # the caller's id and epoch travel from v3 (KIP-360)
        pid, epoch = grant if (use_expected and grant and request[1] >= 3) else (-1, -1)
        decision = self.coord.prepare_init_producer_id(tid, timeout, self.now, pid, epoch)
        m = self.model.get(tid)
        expected = pid != -1
        common = dict(state=S.EMPTY, parts=frozenset(), timeout=timeout, start=-1, update=self.now)
        if timeout > MAX_TIMEOUT:
            return self._offer(decision, "", None, tid, i, E.INVALID_TRANSACTION_TIMEOUT)
        if tid in self.model_pending:
            return self._offer(decision, "", None, tid, i, E.CONCURRENT_TRANSACTIONS)
        if m is None:
            if self.dry:
                return self._offer(decision, "", None, tid, i, E.COORDINATOR_LOAD_IN_PROGRESS)
            return self._offer(decision, "init", M(self.next_pid, 0, -1, -1, **common), tid, i, None)
        if expected and not (pid == m.pid or (pid == m.last_pid and epoch >= EPOCH_EXHAUSTED_AT)):
            return self._offer(decision, "", None, tid, i, E.PRODUCER_FENCED)
        if m.state in PREPARED:
            return self._offer(decision, "", None, tid, i, E.CONCURRENT_TRANSACTIONS)
        if m.state == S.ONGOING:
            fence = self._fence(m)
            if fence is None:
                return self._offer(decision, "", None, tid, i, E.COORDINATOR_LOAD_IN_PROGRESS)
            return self._offer(decision, "fence", fence, tid, i, None)
        if m.epoch >= EPOCH_EXHAUSTED_AT and (not expected or epoch == m.epoch):
            if self.dry:
                return self._offer(decision, "", None, tid, i, E.COORDINATOR_LOAD_IN_PROGRESS)
            after = M(self.next_pid, 0, m.pid, m.epoch if expected else -1, **common)
        elif not expected:
            after = M(m.pid, m.epoch + 1, m.pid, -1, **common)
        elif epoch == m.epoch:
            after = M(m.pid, m.epoch + 1, m.pid, m.epoch, **common)
        elif epoch == m.last_epoch:
            after = M(m.pid, m.epoch, m.pid, m.last_epoch, **common)
        else:
            return self._offer(decision, "", None, tid, i, E.PRODUCER_FENCED)
        self._offer(decision, "init", replace(after, ctv=m.ctv), tid, i, None)

    @rule(i=st.integers(0, N_PRODUCERS - 1), empty_id=st.booleans(), pid_only=st.booleans(),
          request=versions(ApiKey.INIT_PRODUCER_ID))
    def init_malformed(self, i, empty_id, pid_only, request):
        """An empty transactional id, or only one of ProducerId/ProducerEpoch: INVALID_REQUEST
        whatever the id's state, and nothing changes (the invariants check the latter)."""
        self.request = request
        prod = self.producers[i]
        tid = "" if empty_id else prod["tid"]
        pid, epoch = (prod["grant"] or (1, 0))[0], -1
        if not pid_only:
            pid, epoch = -1, 0
        decision = self.coord.prepare_init_producer_id(tid, MAX_TIMEOUT, self.now, pid, epoch)
        self._offer(decision, "", None, tid, i, E.INVALID_REQUEST)

    def _add(self, i, tps, decision, tv=TV_0):
        prod = self.producers[i]
        tid = prod["tid"]
        if tv == TV_2 and tid in self.model_pending:   # pending first (KAFKA-18660)
            return self._offer(decision, "", None, tid, i, E.CONCURRENT_TRANSACTIONS)
        err = self._expect_producer(tid, prod["grant"])
        if err:
            return self._offer(decision, "", None, tid, i, err)
        m = self.model[tid]
        if tid in self.model_pending or m.state in PREPARED:
            return self._offer(decision, "", None, tid, i, E.CONCURRENT_TRANSACTIONS)
        if m.state == S.ONGOING and tps <= m.parts:
            return self._offer(decision, "", None, tid, i, E.NONE)
        after = replace(m, state=S.ONGOING, parts=m.parts | tps, start=self.now if m.state in IDLE else m.start,
                        update=self.now, last_pid=m.pid, ctv=tv)
        self._offer(decision, "add", after, tid, i, None)

    @rule(i=st.integers(0, N_PRODUCERS - 1), tps=st.frozensets(st.sampled_from(TPS), min_size=1),
          request=versions(ApiKey.ADD_PARTITIONS_TO_TXN))
    def add_partitions(self, i, tps, request=(ApiKey.ADD_PARTITIONS_TO_TXN, 3)):
        self.request = request
        prod = self.producers[i]
        pid, epoch = prod["grant"] or (-1, -1)
        self._add(i, tps, self.coord.prepare_add_partitions(prod["tid"], pid, epoch, tps, self.now))

    @rule(i=st.integers(0, N_PRODUCERS - 1), tps=st.frozensets(st.sampled_from(TPS), min_size=1))
    def add_implicitly(self, i, tps):
        """A V2 client's Produce v12 / TxnOffsetCommit v5: the partition leader adds for it
        (AddPartitionsToTxn v5, broker to broker; no per-version rewriting)."""
        self.request = None
        prod = self.producers[i]
        pid, epoch = prod["grant"] or (-1, -1)
        self._add(i, tps, self.coord.prepare_add_partitions(prod["tid"], pid, epoch, tps, self.now,
                                                            transaction_version=TV_2), TV_2)

    @rule(i=st.integers(0, N_PRODUCERS - 1), group=st.sampled_from(["g1", "g2"]),
          request=versions(ApiKey.ADD_OFFSETS_TO_TXN))
    def add_offsets(self, i, group, request):
        self.request = request
        prod = self.producers[i]
        pid, epoch = prod["grant"] or (-1, -1)
        tp = ("__consumer_offsets", partition_for(group, 50))
        self._add(i, frozenset({tp}), self.coord.prepare_add_offsets(prod["tid"], pid, epoch, group, self.now))

    @rule(i=st.integers(0, N_PRODUCERS - 1), commit=st.booleans(), request=versions(ApiKey.END_TXN))
    def end_txn(self, i, commit, request=(ApiKey.END_TXN, 3)):
        self.request = request
        prod = self.producers[i]
        tid = prod["tid"]
        pid, epoch = prod["grant"] or (-1, -1)
        v2 = request[1] >= END_TXN_V2
        decision = self.coord.prepare_end_txn(tid, pid, epoch, commit, self.now,
                                              transaction_version=TV_2 if v2 else TV_0)
        if v2:
            return self._end_v2(i, tid, (pid, epoch), commit, decision)
        err = self._expect_producer(tid, prod["grant"])
        if err:
            return self._offer(decision, "", None, tid, i, err)
        m = self.model[tid]
        if tid in self.model_pending and self.model_pending[tid] != "complete":
            return self._offer(decision, "", None, tid, i, E.CONCURRENT_TRANSACTIONS)
        if m.state == S.ONGOING:
            # the Prepare* records the EndTxn's version: a V1 end of a transaction a V2 add
            # labelled V2 bumped nothing, and its markers say so
            after = replace(m, state=S.PREPARE_COMMIT if commit else S.PREPARE_ABORT, update=self.now, last_pid=m.pid,
                            ctv=TV_0)
            return self._offer(decision, "end", after, tid, i, None)
        table = {(S.COMPLETE_COMMIT, True): E.NONE, (S.COMPLETE_ABORT, False): E.NONE,
                 (S.PREPARE_COMMIT, True): E.CONCURRENT_TRANSACTIONS,
                 (S.PREPARE_ABORT, False): E.CONCURRENT_TRANSACTIONS}
        self._offer(decision, "", None, tid, i, table.get((m.state, commit), E.INVALID_TXN_STATE))

    def _end_v2(self, i, tid, grant, commit, decision):
        m = self.model.get(tid)
        pid, epoch = grant
        if m is None:
            return self._offer(decision, "", None, tid, i, E.INVALID_PRODUCER_ID_MAPPING)
        if tid in self.model_pending:
            return self._offer(decision, "", None, tid, i, E.CONCURRENT_TRANSACTIONS)
        bumped = m.ctv == TV_2 and epoch >= 0
        overflow_retry = bumped and (m.last_pid, m.epoch) == (pid, 0) and epoch == EPOCH_EXHAUSTED_AT and m.pid != pid
        retry = overflow_retry or (bumped and m.pid == pid and m.epoch == epoch + 1)
        if m.pid != pid and not overflow_retry:
            return self._offer(decision, "", None, tid, i, E.INVALID_PRODUCER_ID_MAPPING)
        if epoch != m.epoch and not (retry and m.state not in (S.ONGOING, S.EMPTY)):
            return self._offer(decision, "", None, tid, i, E.PRODUCER_FENCED)
        outcome = V2_TABLE.get((m.state, commit, retry and epoch != m.epoch), E.PRODUCER_FENCED)
        if outcome == E.NONE:
            assert decision == Answer(E.NONE, m.pid, m.epoch), (tid, decision, m)
            event("EndTxn v5 retry")
            self.producers[i]["grant"] = (m.pid, m.epoch)
            return
        if outcome != "bump":
            return self._offer(decision, "", None, tid, i, outcome)
        overflow = m.epoch >= EPOCH_EXHAUSTED_AT
        if overflow and self.dry:
            return self._offer(decision, "", None, tid, i, E.COORDINATOR_LOAD_IN_PROGRESS)
        after = replace(m, state=S.PREPARE_COMMIT if commit else S.PREPARE_ABORT, update=self.now, last_pid=m.pid,
                        last_epoch=m.epoch, ctv=TV_2, epoch=MAX_EPOCH if overflow else m.epoch + 1,
                        next_pid=self.next_pid if overflow else -1)  # the id just drawn
        if m.state != S.ONGOING:
            after = replace(after, parts=frozenset(), start=self.now)
        event("EndTxn v5 overflow" if overflow else "EndTxn v5 bump")
        self._offer(decision, "end2", after, tid, i, None)

    def _flush(self, tid: str) -> None:
        """Write and complete at once whatever the last request of `tid` prepared."""
        for item in [it for it in self.inflight if it.transition.transactional_id == tid]:
            self.inflight.remove(item)
            self.logs[item.transition.partition].append(item.transition.record())
            self._complete(item)

    @rule(i=st.integers(0, N_PRODUCERS - 1), tps=st.frozensets(st.sampled_from(TPS), min_size=1),
          commit=st.booleans(), expected=st.booleans())
    def whole_transaction(self, i, tps, commit, expected):
        """A producer's usual life, each request written at once: init, add, end."""
        tid = self.producers[i]["tid"]
        self.init(i, expected, MAX_TIMEOUT)
        self._flush(tid)
        self.add_partitions(i, tps)
        self._flush(tid)
        self.end_txn(i, commit)
        self._flush(tid)

    @rule(i=st.integers(0, N_PRODUCERS - 1), tps=st.lists(st.frozensets(st.sampled_from(TPS), min_size=1),
                                                         min_size=1, max_size=4),
          commits=st.lists(st.booleans(), min_size=4, max_size=4), markers=st.booleans())
    def v2_transactions(self, i, tps, commits, markers):
        """A V2 producer's transactions back to back, each at the epoch the last EndTxn answered
        (the markers written at once, or not yet: the next add then waits)."""
        tid = self.producers[i]["tid"]
        for added, commit in zip(tps, commits):
            self.add_implicitly(i, added)
            self._flush(tid)
            self.end_txn(i, commit, (ApiKey.END_TXN, END_TXN_V2))
            self._flush(tid)
            if markers and tid in self.jobs:
                self.inflight.append(self.jobs.pop(tid)[1])
                self._flush(tid)

    @rule(i=st.integers(0, N_PRODUCERS - 1))
    def init_whose_answer_is_lost(self, i):
        """KIP-360: a bump whose answer is lost, then the same request again."""
        tid = self.producers[i]["tid"]
        self.init(i, True, MAX_TIMEOUT)
        for item in [it for it in self.inflight if it.transition.transactional_id == tid]:
            self.inflight.remove(item)
            self.logs[item.transition.partition].append(item.transition.record())
            self._complete(item, lose_reply=True)
        self.init(i, True, MAX_TIMEOUT)
        self._flush(tid)

    @rule(i=st.integers(0, N_PRODUCERS - 1), commit=st.booleans(), again=st.booleans())
    def end_v2_whose_answer_is_lost(self, i, commit, again):
        """An EndTxn v5 whose answer is lost: the producer sends it again at its old epoch, while
        the markers are written (told to wait) or after (a retry, answered with the new epoch),
        or the other result (INVALID_TXN_STATE); neither changes anything."""
        tid = self.producers[i]["tid"]
        self.end_txn(i, commit, (ApiKey.END_TXN, END_TXN_V2))
        for item in [it for it in self.inflight if it.transition.transactional_id == tid]:
            self.inflight.remove(item)
            self.logs[item.transition.partition].append(item.transition.record())
            self._complete(item, lose_reply=True)
        self.end_txn(i, commit if again else not commit, (ApiKey.END_TXN, END_TXN_V2))
        if tid in self.jobs:
            self.inflight.append(self.jobs.pop(tid)[1])
            self._flush(tid)
            self.end_txn(i, commit if again else not commit, (ApiKey.END_TXN, END_TXN_V2))

    # ------------------------------------------------------------------ the broker's side
    @precondition(lambda self: self.inflight)
    @rule(data=st.data(), ok=st.booleans(), error=st.sampled_from(APPEND_ERRORS))
    def append(self, data, ok, error):
        item = self.inflight.pop(data.draw(st.integers(0, len(self.inflight) - 1)))
        t = item.transition
        if ok:
            self.logs[t.partition].append(t.record())
            self.appended.append(item)
            return
        reply = self.coord.abort_pending(t, error)
        if item.kind == "complete":
            assert reply is None and self.coord.pending(t.transactional_id) is t
            self.inflight.append(item)  # the marker writer retries the append
            return
        del self.model_pending[t.transactional_id]
        if item.producer is None:
            assert reply is None
        else:
            assert reply == Answer(translate_append_error(error))

    @precondition(lambda self: self.inflight)
    @rule(lose_reply=st.sampled_from([False, False, True]))
    def append_and_complete_oldest(self, lose_reply):
        """The usual path: the oldest prepared transition is written and completed at once;
        sometimes the reply never reaches the producer (which then retries with its old epoch)."""
        item = self.inflight.pop(0)
        self.logs[item.transition.partition].append(item.transition.record())
        self._complete(item, lose_reply)

    @precondition(lambda self: self.appended)
    @rule(data=st.data())
    def complete(self, data):
        self._complete(self.appended.pop(data.draw(st.integers(0, len(self.appended) - 1))))

    def _complete(self, item: InFlight, lose_reply: bool = False) -> None:
        t = item.transition
        tid = t.transactional_id
        before = self.model.get(tid)
        done = self.coord.complete(t, self.now)
        del self.model_pending[tid]
        if item.predicted is None:
            self.model.pop(tid)
        else:
            self.model[tid] = item.predicted
            old_state = before.state if before else S.EMPTY
            hops = [old_state, S.PREPARE_EPOCH_FENCE, item.predicted.state] if item.kind == "fence" \
                else [old_state, item.predicted.state]
            assert all(a in VALID_PREVIOUS[b] for a, b in zip(hops, hops[1:])), hops
        if item.kind == "init":
            assert done.reply == Answer(E.NONE, item.predicted.pid, item.predicted.epoch)
            grant = (item.predicted.pid, item.predicted.epoch)
            history = self.grants[tid]
            retry = (item.predicted.epoch == (before.epoch if before else -1) and before
                     and item.predicted.pid == before.pid)
            event("init retry" if retry else "rotation" if before and grant[0] != before.pid else "grant")
            if not retry:
                assert not history or grant > history[-1] or grant[0] not in {g[0] for g in history}, (grant, history)
                history.append(grant)
            if not lose_reply:
                self.producers[item.producer]["grant"] = grant
        elif item.kind == "fence" and item.producer is not None:
            assert done.reply == Answer(E.CONCURRENT_TRANSACTIONS)
        elif item.kind in ("add", "end"):
            assert done.reply == Answer(E.NONE)
        elif item.kind == "end2":
            p = item.predicted
            grant = (p.next_pid, 0) if p.next_pid >= 0 else (p.pid, p.epoch)
            assert done.reply == Answer(E.NONE, *grant)
            history = self.grants[tid]
            assert not history or grant > history[-1] or grant[0] not in {g[0] for g in history}, (grant, history)
            history.append(grant)
            if not lose_reply:
                self.producers[item.producer]["grant"] = grant
        if item.predicted is not None and item.predicted.state in PREPARED:
            job = done.markers
            assert job is not None and job.transactional_id == tid
            assert job.commit == (item.predicted.state == S.PREPARE_COMMIT)
            assert (job.producer_id, job.producer_epoch, job.partitions) == (
                item.predicted.pid, item.predicted.epoch, item.predicted.parts)
            self._hold_job(job, item.predicted)
        else:
            assert done.markers is None

    def _hold_job(self, job: MarkerJob, prepared: M) -> None:
        done = S.COMPLETE_COMMIT if prepared.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT
        after = replace(prepared, state=done, parts=frozenset(), update=max(self.now, prepared.update),
                        last_pid=prepared.pid)
        if prepared.next_pid >= 0:   # an overflow: the markers close the old id, the client has the new
            after = replace(after, pid=prepared.next_pid, epoch=0, next_pid=-1)
        item = InFlight(job.completion, after, "complete", None)
        assert as_model(job.completion.after) == after
        self.model_pending[job.transactional_id] = "complete"
        self.jobs[job.transactional_id] = (job, item)

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def markers_acknowledged(self, data):
        tid = data.draw(st.sampled_from(sorted(self.jobs)))
        _job, item = self.jobs.pop(tid)
        self.inflight.append(item)

    @rule(ms=st.integers(1, 70_000))
    def sweep_timeouts(self, ms):
        self.now += ms
        due = {tid for tid, m in self.model.items()
               if m.state == S.ONGOING and tid not in self.model_pending and m.start + m.timeout < self.now
               and self._fence(m) is not None}
        ts = self.coord.expire_timed_out(self.now)
        assert {t.transactional_id for t in ts} == due
        for t in sorted(ts, key=lambda t: t.transactional_id):
            predicted = self._fence(self.model[t.transactional_id])
            assert predicted is not None and t.reply is None
            # several fences may each draw an id: which one is the coordinator's business
            assert (t.after.next_producer_id >= 0) == (predicted.next_pid >= 0), (t.after, predicted)
            predicted = replace(predicted, next_pid=t.after.next_producer_id)
            assert as_model(t.after) == predicted
            self.model_pending[t.transactional_id] = "fence"
            self.inflight.append(InFlight(t, predicted, "fence", None))

    @rule(ms=st.integers(1, 60_000))
    def expire_ids(self, ms):
        self.now += ms
        due = {tid for tid, m in self.model.items()
               if m.state in IDLE and tid not in self.model_pending and m.update <= self.now - EXPIRATION}
        ts = self.coord.expire_transactional_ids(self.now)
        assert {t.transactional_id for t in ts} == due
        for t in ts:
            assert t.after is None and t.record()[1] is None
            self.model_pending[t.transactional_id] = "expire"
            self.inflight.append(InFlight(t, None, "expire", None))

    @rule(p=st.integers(0, PARTS - 1))
    def restart(self, p):
        """kill -9 or leader move of __transaction_state-p: reload its log at a new epoch."""
        stale = [it for it in self.appended if it.transition.partition == p]
        for it in stale:  # written but never completed: the log has it
            tid = it.transition.transactional_id
            if it.predicted is None:
                self.model.pop(tid, None)
            else:
                self.model[tid] = it.predicted
        self.appended = [it for it in self.appended if it.transition.partition != p]
        self.inflight = [it for it in self.inflight if it.transition.partition != p]
        mine = {t for t in IDS if partition_for(t, PARTS) == p}
        for tid in mine:
            self.model_pending.pop(tid, None)
            self.jobs.pop(tid, None)
        self.epochs[p] += 1
        jobs = self.coord.load(p, self.epochs[p], self.logs[p], self.now)
        for it in stale:  # a completion that arrives after the move changes nothing
            reply = self.coord.complete(it.transition, self.now).reply
            assert reply in (None, Answer(E.NOT_COORDINATOR))
        assert {j.transactional_id for j in jobs} == {t for t in mine if t in self.model
                                                      and self.model[t].state in PREPARED}
        for job in jobs:
            assert job.coordinator_epoch == self.epochs[p]
            self._hold_job(job, self.model[job.transactional_id])

    @rule(dry=st.sampled_from([False, False, True]))
    def producer_id_source(self, dry):
        """The broker has (or has run out of) producer ids at hand."""
        self.dry = dry

    @rule(ms=st.integers(1, 2_000))
    def tick(self, ms):
        self.now += ms

    # ------------------------------------------------------------------ invariants
    @invariant()
    def durable_state_matches_the_model(self):
        for tid in IDS:
            meta = self.coord.get(tid)
            assert (None if meta is None else as_model(meta)) == self.model.get(tid), tid
            assert (self.coord.pending(tid) is not None) == (tid in self.model_pending), tid

    @invariant()
    def every_prepare_has_its_completion_on_the_way(self):
        for tid, m in self.model.items():
            if m.state in PREPARED:
                pending = self.coord.pending(tid)
                assert pending is not None and pending.target in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT)
                on_the_way = tid in self.jobs or any(it.transition is pending for it in self.inflight + self.appended)
                assert on_the_way, tid

    @invariant()
    def only_the_current_epoch_is_live(self):
        for prod in self.producers:
            tid, grant = prod["tid"], prod["grant"]
            if grant is None:
                continue
            codes = set(self.coord.verify_partitions(tid, grant[0], grant[1], TPS[:1]).values())
            m = self.model.get(tid)
            if m is not None and (m.pid, m.epoch) == grant:
                assert codes <= {E.NONE, E.TRANSACTION_ABORTABLE, E.CONCURRENT_TRANSACTIONS}, codes
            else:
                assert codes == {self._expect_producer(tid, grant)}, (codes, grant, m)

    @invariant()
    def states_are_never_dead_or_fence(self):
        for tid in IDS:
            meta = self.coord.get(tid)
            assert meta is None or meta.state not in (S.DEAD, S.PREPARE_EPOCH_FENCE)

    def teardown(self):
        if not hasattr(self, "coord"):
            return
        self.dry = False
        for _ in range(20):
            if not (self.inflight or self.appended or self.jobs):
                break
            for item in list(self.inflight):
                self.inflight.remove(item)
                self.logs[item.transition.partition].append(item.transition.record())
                self.appended.append(item)
            while self.appended:
                self._complete(self.appended.pop(0))
            for tid in sorted(self.jobs):
                self.inflight.append(self.jobs.pop(tid)[1])
        for tid in IDS:
            meta = self.coord.get(tid)
            assert meta is None or meta.state not in PREPARED, (tid, meta)
            assert self.coord.pending(tid) is None


CoordinatorMachine.TestCase.settings = settings(max_examples=examples(250), stateful_step_count=80, deadline=None,
                                                suppress_health_check=[HealthCheck.too_slow])
test_coordinator = CoordinatorMachine.TestCase

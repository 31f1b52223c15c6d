"""Hypothesis drives a partition's transaction bookkeeping against a model that keeps every batch
and marker.

The log is a list of batches (data, transactional or not, from a few producers) and control
batches (COMMIT/ABORT), split into segments, each with its `AbortedTxnIndex`; the high watermark
trails the log end; retention drops whole segments; a restart rebuilds state from a snapshot of
the open transactions plus a replay (truncating the indexes above the snapshot, as recovery does);
a power loss truncates the log to the high watermark first.

The model decides from the full history: a transaction is a producer's transactional batches from
its first one after its previous marker up to its next marker. Checked: the LSO is the first
offset of the earliest transaction that is open or whose marker is not below the high watermark,
else the high watermark (never below the log start); what a read_committed Fetch returns — the
batches below the LSO, filtered by the AbortedTransactions the index query gives, as Kafka's
consumer filters them — is exactly the committed records; the index query returns exactly the
aborted transactions overlapping the fetched range; the indexes hold exactly the aborted
transactions with the LSO at their completion, and a rebuilt index equals the live one.

KIP-890 verification (`VerificationGuards`): checks of a producer's first transactional batch
start (alone, or two at once as pipelined requests), at the producer's epoch or the next one,
Transactions V1 or V2, overlap and end in any order; markers come at the producer's epoch (V1) or
the next (V2, the epoch bumped by EndTxn). A check's guard is valid when no marker for its
producer was appended since it started, whatever the producer's other checks did; a check whose
batch is appended (guard valid, epoch not below the partition's) was not ended by any marker since
it started (a marker above its epoch, or at it, ends it, unless both are V2: a V2 marker at a V2
check's epoch was the previous transaction's; a V1 marker there may be its own transaction's,
from a client mixing EndTxn v4 with Produce v12).
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tests.tiers import examples

from oncelog.core.txn.partition import AbortedTxnIndex, PartitionTxns, collect_aborted
from oncelog.core.txn.read_committed import ReadCommittedFilter
from oncelog.core.txn.verification import VerificationGuards
from oncelog.protocol.errors import ErrorCode as E

PIDS = [1, 2, 3, 4]


@dataclass(frozen=True)
class Batch:
    base: int
    last: int
    pid: int
    txn: bool
    control: bool = False
    abort: bool = False
    epoch: int = 0
    v2: bool = False   # a marker of a Transactions V2 transaction (written at the bumped epoch)


def model_transactions(log: list[Batch]):
    """[(pid, first, marker offset or None, aborted)] from the whole history, in opening order."""
    open_: dict[int, int] = {}
    out = []
    index: dict[int, int] = {}
    for b in log:
        if b.control:
            if b.pid in open_:
                k = index.pop(b.pid)
                out[k] = (b.pid, open_.pop(b.pid), b.base, b.abort)
        elif b.txn and b.pid not in open_:
            open_[b.pid] = b.base
            index[b.pid] = len(out)
            out.append((b.pid, b.base, None, False))
    return out


class PartitionMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        self.log: list[Batch] = []
        self.leo = 0
        self.hw = 0
        self.log_start = 0
        self.segments = [0]
        self.indexes = {0: AbortedTxnIndex()}
        self.txns = PartitionTxns()
        self.snapshots: dict[int, list] = {0: []}  # offset -> open transactions (at each roll, as storage takes them)
        self.guards = VerificationGuards()
        # [pid, guard, log length when it started, the batch's epoch, Transactions V2, whether a
        # check of the producer at another epoch or version overlapped it (they share a guard)]
        self.checks: list[list] = []

    def _epoch(self, pid: int) -> int:
        """The producer's epoch in the partition: its markers raise it."""
        return max((b.epoch for b in self.log if b.control and b.pid == pid), default=0)

    def _segment_of(self, offset: int) -> int:
        return self.segments[bisect_right(self.segments, offset) - 1]

    def _apply(self, txns: PartitionTxns, b: Batch, index_too: bool) -> None:
        """What storage does for one batch, live or during recovery."""
        if b.control:
            c = txns.prepare_marker(b.pid, b.base, b.abort)
            if c is not None:
                if c.is_aborted and index_too:
                    self.indexes[self._segment_of(b.base)].append(c)
                txns.complete(c)
        else:
            txns.on_data_batch(b.pid, b.base, b.txn)

    # ------------------------------------------------------------------ the model
    def expected_lso(self) -> int:
        unstable = [first for _pid, first, marker, _ab in model_transactions(self.log)
                    if marker is None or marker >= self.hw]
        lso = min(min(unstable), self.hw) if unstable else self.hw
        return max(lso, self.log_start)

    def committed(self, start: int, end: int) -> list[int]:
        """Base offsets of the data batches in [start, end) a read_committed reader must get."""
        outcome = {}
        for pid, first, marker, aborted in model_transactions(self.log):
            outcome[(pid, first)] = (marker, aborted)
        current: dict[int, tuple[int, int]] = {}
        out = []
        for b in self.log:
            if b.control:
                current.pop(b.pid, None)
                continue
            if b.txn:
                key = current.setdefault(b.pid, (b.pid, b.base))
                marker, aborted = outcome[key]
                if start <= b.base < end:
                    assert marker is not None, "undecided data below the LSO"
                    if not aborted:
                        out.append(b.base)
            elif start <= b.base < end:
                out.append(b.base)
        return out

    # ------------------------------------------------------------------ appends
    @rule(pid=st.sampled_from(PIDS), txn=st.booleans(), n=st.integers(1, 3))
    def produce(self, pid, txn, n):
        code = self.txns.check_data_batch(pid, txn)
        has_open = any(p == pid and m is None for p, _f, m, _a in model_transactions(self.log))
        assert code == (E.INVALID_TXN_STATE if (has_open and not txn) else E.NONE)
        if code:
            return
        b = Batch(self.leo, self.leo + n - 1, pid, txn)
        self.log.append(b)
        self.leo += n
        self._apply(self.txns, b, index_too=False)

    @rule(pid=st.sampled_from(PIDS), abort=st.booleans(), v2=st.booleans())
    def marker(self, pid, abort, v2=False):
        """`v2`: the coordinator bumped the epoch at EndTxn and the marker carries the new one."""
        b = Batch(self.leo, self.leo, pid, True, control=True, abort=abort, epoch=self._epoch(pid) + v2, v2=v2)
        open_ = {p: f for p, f, m, _a in model_transactions(self.log) if m is None}
        c = self.txns.prepare_marker(pid, b.base, abort)
        if pid not in open_:
            assert c is None
        else:
            others = [f for p, f in open_.items() if p != pid]
            assert (c.first_offset, c.last_offset, c.is_aborted) == (open_[pid], b.base, abort)
            assert c.last_stable_offset == (min(others) if others else b.base + 1)
        self.log.append(b)
        self.leo += 1
        if c is not None:
            if abort:
                self.indexes[self._segment_of(b.base)].append(c)
            self.txns.complete(c)
        self.guards.clear(pid, b.epoch, b.v2)  # as storage does after every marker

    @rule(pid=st.sampled_from(PIDS), batches=st.integers(1, 3), abort=st.booleans())
    def whole_transaction(self, pid, batches, abort):
        """A producer's transactional batches and its marker (others' may be open around it)."""
        for _ in range(batches):
            self.produce(pid, True, 1)
        self.marker(pid, abort)

    # ------------------------------------------------------------------ KIP-890 verification
    @rule(pid=st.sampled_from(PIDS), next_epoch=st.booleans(), v2=st.booleans())
    def start_verification(self, pid, next_epoch=False, v2=False):
        """A Produce with the producer's first batch here asks the coordinator and waits; at the
        next epoch when the producer's EndTxn bumped it before its marker reached here."""
        epoch = self._epoch(pid) + next_epoch
        check = [pid, self.guards.begin(pid, epoch, v2), len(self.log), epoch, v2, False]
        for other in self.checks:
            if other[0] == pid and (other[3], other[4]) != (epoch, v2):
                other[5] = check[5] = True
        self.checks.append(check)

    @rule(pid=st.sampled_from(PIDS), next_epoch=st.booleans(), v2=st.booleans())
    def pipelined_verifications(self, pid, next_epoch, v2):
        """Two requests of one producer start their checks back to back (two connections, or a
        broker that let the second start while the first waited)."""
        self.start_verification(pid, next_epoch, v2)
        self.start_verification(pid, next_epoch, v2)

    @rule(pid=st.sampled_from(PIDS), next_epoch=st.booleans(), v2=st.booleans(), marker_v2=st.booleans(),
          abort=st.booleans(), coordinator_ok=st.booleans())
    def marker_during_a_check(self, pid, next_epoch, v2, marker_v2, abort, coordinator_ok):
        """The race itself, in one step: a check starts, a marker of the producer lands, the
        check is answered (the rules above reach it too, rarely)."""
        self.start_verification(pid, next_epoch, v2)
        self.marker(pid, abort, marker_v2)
        self._finish(len(self.checks) - 1, coordinator_ok)

    @precondition(lambda self: self.checks)
    @rule(data=st.data(), coordinator_ok=st.booleans())
    def finish_verification(self, data, coordinator_ok):
        """Any check in flight gets its answer (peers answer in any order)."""
        self._finish(data.draw(st.integers(0, len(self.checks) - 1)), coordinator_ok)

    def _finish(self, k: int, coordinator_ok: bool) -> None:
        pid, guard, started, epoch, v2, mixed = self.checks.pop(k)
        markers = [b for b in self.log[started:] if b.control and b.pid == pid]
        # a V2 marker at the check's epoch ended the V2 transaction before; any other marker at
        # it, or one above it, may have ended the check's own (a client mixing versions)
        ended = any(m.epoch > epoch or (m.epoch == epoch and not (v2 and m.v2)) for m in markers)
        if any(c[0] == pid for c in self.checks):
            event("a check answered while another of its producer waits")
        valid = self.guards.valid(pid, guard)
        if not markers or (v2 and not mixed and all(m.epoch == epoch and m.v2 for m in markers)):
            assert valid, "a check voided by no marker, or by the previous V2 transaction's"
        # storage refuses a batch below the partition's epoch before it looks at the guard
        appended = valid and epoch >= self._epoch(pid) and coordinator_ok
        assert not (appended and ended), "a batch appended after the marker that ended its transaction"
        if appended:
            self.produce(pid, True, 1)
            event("a verified batch appended" + (" after the previous transaction's marker" if markers else ""))
        self.guards.end(pid, guard)
        if markers and not valid:
            event("a check voided by a marker")

    @precondition(lambda self: self.leo > self.segments[-1])
    @rule()
    def roll(self):
        self.segments.append(self.leo)
        self.indexes[self.leo] = AbortedTxnIndex()
        self.snapshots[self.leo] = self.txns.open_transactions()

    @rule(k=st.integers(0, 4), to_end=st.booleans())
    def advance_high_watermark(self, k, to_end):
        """The high watermark moves by whole batches (a group commit's fsync)."""
        ends = [b.last + 1 for b in self.log if b.last + 1 > self.hw]
        if ends:
            self.hw = ends[-1] if to_end else ends[min(k, len(ends) - 1)]

    @precondition(lambda self: len(self.segments) > 1)
    @rule(data=st.data())
    def retention(self, data):
        """Delete whole segments below the high watermark."""
        candidates = [s for s in self.segments[1:] if s <= self.hw]
        if not candidates:
            return
        new_start = data.draw(st.sampled_from(candidates))
        for s in [s for s in self.segments if s < new_start]:
            self.segments.remove(s)
            del self.indexes[s]
        self.log_start = new_start
        self.txns.on_log_start_offset(new_start)
        event("retention")

    @rule()
    def take_snapshot(self):
        """A clean shutdown's snapshot at the log end."""
        self.snapshots[self.leo] = self.txns.open_transactions()

    @rule(power_loss=st.booleans())
    def restart(self, power_loss):
        if power_loss:  # the unflushed tail is gone: back to the high watermark
            self.log = [b for b in self.log if b.base < self.hw]
            self.leo = self.log[-1].last + 1 if self.log else self.hw
            self.leo = max(self.leo, self.log_start)
            self.segments = [s for s in self.segments if s <= self.leo] or [self.log_start]
            self.indexes = {s: self.indexes.get(s, AbortedTxnIndex()) for s in self.segments}
            for idx in self.indexes.values():
                idx.truncate_to(self.leo)
            self.snapshots = {o: v for o, v in self.snapshots.items() if o <= self.leo}
        live = {s: list(idx.entries()) for s, idx in self.indexes.items()}
        # the newest snapshot not above the log end nor below the log start (there is one at
        # every segment base, so at the log start too)
        snap_offset = max(o for o in self.snapshots if self.log_start <= o <= self.leo)
        open_txns = self.snapshots[snap_offset]
        event(f"restart from a snapshot with {'some' if open_txns else 'no'} open transactions"
              f"{' after power loss' if power_loss else ''}")
        self.checks.clear()  # the requests waiting died with the broker
        self.guards = VerificationGuards()
        txns = PartitionTxns()
        txns.load(open_txns)
        for idx in self.indexes.values():
            idx.truncate_to(snap_offset)
        for b in self.log:
            if b.base >= snap_offset:
                self._apply(txns, b, index_too=True)
        self.txns = txns
        self.txns.on_log_start_offset(self.log_start)
        self.hw = self.leo  # recovery: what is in the log is durable
        assert {s: list(idx.entries()) for s, idx in self.indexes.items()} == live

    # ------------------------------------------------------------------ reads
    def _fetch(self, start: int, end: int, max_scan: int | None = None) -> list[int]:
        """A read_committed Fetch of the batches with base in [start, end), end <= LSO, then the
        consumer's filter. Returns the base offsets of the data batches it keeps."""
        batches = [b for b in self.log if start <= b.base < end]
        if not batches:
            return []
        upper = batches[-1].last + 1
        segs = [s for s in self.segments if s >= self._segment_of(start)]
        q = collect_aborted([self.indexes[s] for s in segs], start, upper, max_scan)
        if q.upper < upper:
            event("scan bound hit: no progress" if q.upper <= start else "scan bound hit: read shortened")
            if q.upper <= start:
                q = collect_aborted([self.indexes[s] for s in segs], start, upper)
            else:
                batches = [b for b in batches if b.base < q.upper]
                upper = q.upper
        # exactly the aborted transactions overlapping the read: last (the marker) >= start and
        # first < upper; entries beyond `upper` that a shortened answer may carry are harmless
        got = sorted({(t.producer_id, t.first_offset, t.last_offset) for t in q.transactions
                      if t.first_offset < upper})
        want = sorted((p, f, m) for p, f, m, aborted in model_transactions(self.log)
                      if aborted and m is not None and m >= start and f < upper)
        assert got == want, (start, upper, got, want)
        assert all(t.last_offset >= start for t in q.transactions)
        f = ReadCommittedFilter([(t.producer_id, t.first_offset) for t in q.transactions])
        kept = [b.base for b in batches if f.accept(b.pid, b.last, b.txn, b.control, b.abort)]
        if q.transactions:
            event("read with aborted transactions")
        if len(kept) < sum(1 for b in batches if not b.control):
            event("read filtered aborted batches")
        assert kept == self.committed(start, batches[-1].base + 1), (start, end, q)
        return kept

    @rule(data=st.data(), max_scan=st.sampled_from([None, 1, 2, 5]))
    def read(self, data, max_scan):
        lso = self.txns.last_stable_offset(self.hw, self.log_start)
        starts = [b.base for b in self.log if self.log_start <= b.base < lso]
        if not starts:
            return
        start = data.draw(st.sampled_from(starts))
        end = data.draw(st.integers(start + 1, lso))
        self._fetch(start, end, max_scan)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def guards_only_for_checks_in_flight(self):
        assert len(self.guards) <= len({c[0] for c in self.checks})
        if not self.checks:
            assert len(self.guards) == 0

    @invariant()
    def lso_matches_the_model(self):
        assert self.txns.last_stable_offset(self.hw, self.log_start) == self.expected_lso()

    @invariant()
    def reading_from_the_log_start_gives_the_committed_records(self):
        self._fetch(self.log_start, self.txns.last_stable_offset(self.hw, self.log_start))

    @invariant()
    def indexes_hold_exactly_the_aborted_transactions(self):
        got = sorted((e.producer_id, e.first_offset, e.last_offset)
                     for idx in self.indexes.values() for e in idx.entries())
        want = sorted((p, f, m) for p, f, m, aborted in model_transactions(self.log)
                      if aborted and m is not None and m >= self.log_start)
        assert got == want
        for s, idx in self.indexes.items():
            for e in idx.entries():
                assert self._segment_of(e.last_offset) == s


PartitionMachine.TestCase.settings = settings(max_examples=examples(200), stateful_step_count=60, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
test_partition = PartitionMachine.TestCase

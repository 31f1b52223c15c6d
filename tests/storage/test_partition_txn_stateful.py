"""Hypothesis drives a real Partition (real files, small segments) with transactional and plain
batches from a few producers, COMMIT/ABORT markers, snapshots, clean restarts and kill -9 style
restarts, against a model that keeps every batch: the LSO, the aborted transactions the
`.txnindex` files answer, and what a read_committed reader keeps (filtered as Kafka's consumer
filters) always equal the model's."""
from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from tests.tiers import examples

from oncelog.core.producer_state import ProducerStateConfig
from oncelog.core.txn.read_committed import ReadCommittedFilter
from oncelog.protocol import records as rec
from oncelog.protocol.records import Record, encode_batch
from oncelog.storage.log import LogConfig, PartitionLog
from oncelog.storage.partition import Partition

NOW = 1_700_000_000_000
PIDS = [11, 12, 13]


class PartitionTxnMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="txn-stateful-"))
        self.config = LogConfig(segment_bytes=400)
        self.p = self.open()
        self.seq = {pid: 0 for pid in PIDS}
        self.open_txn: dict[int, int] = {}      # pid -> first offset (model)
        self.aborted: list[tuple[int, int, int]] = []  # (pid, first, marker)
        self.records: list[tuple[int, int, bool]] = []  # (offset, pid, transactional) of data batches
        self.fate: dict[tuple[int, int], str] = {}  # (pid, first offset) -> "commit"/"abort"
        self.txn_of: dict[int, tuple[int, int]] = {}  # data batch offset -> its transaction

    def open(self) -> Partition:
        return Partition("t", 0, PartitionLog.open(self.dir, self.config, NOW), ProducerStateConfig(), now_ms=NOW)

    @rule(pid=st.sampled_from(PIDS), transactional=st.booleans())
    def append(self, pid, transactional):
        if not transactional and pid in self.open_txn:
            transactional = True  # a plain batch inside an open transaction is refused (tested elsewhere)
        b = encode_batch([Record(i, NOW, None, b"x", []) for i in range(2)], producer_id=pid,
                         producer_epoch=0, base_sequence=self.seq[pid], transactional=transactional)
        r = self.p.append_from_client(bytearray(b), NOW)
        assert r.error_code == 0, r
        self.p.log.flush()
        self.seq[pid] += 2
        if transactional:
            self.open_txn.setdefault(pid, r.base_offset)
            self.txn_of[r.base_offset] = (pid, self.open_txn[pid])
        self.records.append((r.base_offset, pid, transactional))

    @rule(pid=st.sampled_from(PIDS), commit=st.booleans())
    def marker(self, pid, commit):
        off = self.p.append_marker(pid, 0, 0, commit, NOW)
        self.p.log.flush()
        first = self.open_txn.pop(pid, None)
        if first is not None:
            self.fate[(pid, first)] = "commit" if commit else "abort"
            if not commit:
                self.aborted.append((pid, first, off))

    @rule()
    def snapshot(self):
        self.p.take_snapshot(force=True)

    @rule(clean=st.booleans())
    def restart(self, clean):
        if clean:
            self.p.close()
        else:
            for seg in self.p.log.segments:
                seg.close()
        self.p = self.open()

    @invariant()
    def lso_and_index_match_the_model(self):
        hw = self.p.high_watermark
        expected = min(self.open_txn.values(), default=hw)
        assert self.p.last_stable_offset == expected
        got = [(t.producer_id, t.first_offset, t.last_offset)
               for t in self.p.aborted_transactions(0, self.p.log_end_offset).transactions]
        assert got == self.aborted

    @invariant()
    def read_committed_keeps_the_committed_records(self):
        lso = self.p.last_stable_offset
        kept, offset = [], 0
        while offset < lso:  # fetch by fetch, as a consumer (a read ends at its segment's end)
            data = self.p.read(offset, 1 << 30, max_offset=lso)
            headers = list(rec.iter_batches(data))
            end = headers[-1][1].last_offset + 1
            query = self.p.aborted_transactions(offset, end)
            keep = ReadCommittedFilter([(t.producer_id, t.first_offset) for t in query.transactions])
            for pos, h in headers:
                abort = h.is_control and rec.is_abort_marker_batch(data, pos, h)
                if keep.accept(h.producer_id, h.last_offset, h.is_transactional, h.is_control, abort):
                    kept.append(h.base_offset)
            offset = end
        expected = [off for off, pid, txn in self.records if off < lso
                    and (not txn or self.fate.get(self.txn_of[off]) == "commit")]
        assert kept == expected

    def teardown(self):
        self.p.close()


PartitionTxnMachine.TestCase.settings = settings(
    max_examples=examples(40), stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestPartitionTxn = PartitionTxnMachine.TestCase

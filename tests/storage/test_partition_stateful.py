"""Hypothesis drives a Partition over a real PartitionLog (real files) against a plain model:
produce, retry any earlier batch, gaps, epoch bumps, segment rolls, retention, runtime window
changes, expiry, clean restarts and crashes (the log survives, the in-memory state does not).

Every answer must match the model, and after any restart the full window must still
deduplicate: snapshots hold every retained batch, and the log above the newest snapshot is
replayed."""
from __future__ import annotations

import shutil
import tempfile
from itertools import takewhile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.record_codec import Record, encode_batch
from oncelog.storage.partition import Partition

try:  # STORAGE's real log; until it lands, a minimal file-backed stand-in with the same contract
    import oncelog.storage.log as _log
except ImportError:
    import test_partition_support as _log  # tests/storage is on sys.path (pytest rootdir-less layout)
LogConfig, PartitionLog = _log.LogConfig, _log.PartitionLog

SPACE = 2**31
EXPIRY = 100_000
T0 = 1_700_000_000_000


def batch(pid, epoch, seq, n):
    return bytearray(encode_batch([Record(i, T0, None, b"%d-%d-%d" % (pid, seq, i), []) for i in range(n)],
                                  producer_id=pid, producer_epoch=epoch, base_sequence=seq))


@settings(max_examples=25, stateful_step_count=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
class PartitionMachine(RuleBasedStateMachine):
    @initialize(window=st.sampled_from([5, 8]), segment_bytes=st.sampled_from([400, 1500, 1 << 20]))
    def setup(self, window, segment_bytes):
        self.tmp = Path(tempfile.mkdtemp(prefix="pstate-"))
        self.dir = self.tmp / "t-0"
        self.log_config = LogConfig(segment_bytes=segment_bytes)
        self.window = window
        self.now = T0
        self.partition = self._open()
        self.producers: dict[int, dict] = {}  # pid -> {epoch, history [(first, last, offset)], retained}
        self.appended: list[tuple[int, int, int, int, int]] = []  # (pid, epoch, first, last, offset) in the log
        # expired pids the broker remembers (snapshots keep them) -> batches retained at expiry
        self.expired: dict[int, int] = {}

    def teardown(self):
        try:
            self.partition.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _open(self) -> Partition:
        log = PartitionLog.open(self.dir, self.log_config, self.now)
        return Partition("t", 0, log, self.log_config, directory=self.dir, now_ms=self.now,
                         producer_config={"producer.state.batches.to.retain": self.window,
                                          "producer.id.expiration.ms": EXPIRY})

    def _restore(self, pid):
        """An expired producer whose batches are still in the log is restored from them: the
        batches it retained when it expired (the state remembers where they are)."""
        retained = self.expired.pop(pid)
        start = self.partition.log_start_offset
        mine = [b for b in self.appended if b[0] == pid and b[4] >= start][-min(self.window, retained):]
        if mine:
            # the batches since the last change of epoch: a change resets the state, in the
            # log as in memory (after expiry a producer id may even come back at a lower epoch)
            last_epoch = mine[-1][1]
            run = list(takewhile(lambda b: b[1] == last_epoch, reversed(mine)))[::-1]
            history = [(f, l, o) for _pid, _e, f, l, o in run]
            self.producers[pid] = {"epoch": last_epoch, "history": history, "retained": len(history)}

    def _expect(self, pid, epoch, f, l):
        p = self.producers.get(pid)
        if p is None and pid in self.expired:
            self._restore(pid)
            p = self.producers.get(pid)
        if p is None:
            return ("ok", None) if f == 0 else ("err", E.UNKNOWN_PRODUCER_ID)
        if epoch < p["epoch"]:
            return ("err", E.INVALID_PRODUCER_EPOCH)
        if epoch > p["epoch"]:
            return ("ok", None) if f == 0 else ("err", E.OUT_OF_ORDER_SEQUENCE_NUMBER)
        for bf, bl, off in reversed(p["history"][-p["retained"]:]):  # the newest copy answers
            if (bf, bl) == (f, l):
                return ("ok", off)
        if f == (p["history"][-1][1] + 1) % SPACE:
            return ("ok", None)
        return ("err", E.OUT_OF_ORDER_SEQUENCE_NUMBER)

    def _send(self, pid, epoch, f, n):
        l = (f + n - 1) % SPACE
        kind, value = self._expect(pid, epoch, f, l)
        end = self.partition.log_end_offset
        r = self.partition.append_from_client(batch(pid, epoch, f, n), self.now)
        assert r.log_start_offset == self.partition.log_start_offset
        if kind == "err":
            assert r.error_code == value, (r, pid, epoch, f, l)
            assert self.partition.log_end_offset == end
            return
        assert r.error_code == 0, (r, pid, epoch, f, l)
        if value is not None:  # a duplicate: the original offset, nothing appended
            assert r.base_offset == value
            assert self.partition.log_end_offset == end
            return
        assert r.base_offset == end
        p = self.producers.get(pid)
        if p is None or p["epoch"] != epoch:
            p = self.producers[pid] = {"epoch": epoch, "history": [], "retained": 0}
        p["history"].append((f, l, r.base_offset))
        self.appended.append((pid, epoch, f, l, r.base_offset))
        p["retained"] = min(p["retained"] + 1, self.window)

    @rule(pid=st.sampled_from([11, 12, 13]), n=st.integers(1, 4))
    def produce_next(self, pid, n):
        p = self.producers.get(pid)
        if p is None:
            self._send(pid, 0, 0, n)
        else:
            self._send(pid, p["epoch"], (p["history"][-1][1] + 1) % SPACE, n)

    @rule(pid=st.sampled_from([11, 12, 13]), back=st.integers(0, 12))
    def retry_earlier(self, pid, back):
        p = self.producers.get(pid)
        if p is not None:
            f, l, _ = p["history"][max(0, len(p["history"]) - 1 - back)]
            self._send(pid, p["epoch"], f, (l - f) % SPACE + 1)

    @rule(pid=st.sampled_from([11, 12, 13]), gap=st.integers(1, 5))
    def gap(self, pid, gap):
        p = self.producers.get(pid)
        if p is not None:
            self._send(pid, p["epoch"], (p["history"][-1][1] + 1 + gap) % SPACE, 1)

    @rule(pid=st.sampled_from([11, 12, 13]), seq=st.sampled_from([0, 3]))
    def bump_epoch(self, pid, seq):
        p = self.producers.get(pid)
        self._send(pid, p["epoch"] + 1 if p else 2, seq, 1)

    @rule(window=st.sampled_from([5, 6, 20]))
    def change_window(self, window):
        self.window = window
        self.partition.update_config(producer_config={"producer.state.batches.to.retain": window,
                                                      "producer.id.expiration.ms": EXPIRY})
        for p in self.producers.values():
            p["retained"] = min(p["retained"], window)

    @rule()
    def expire_all(self):
        self.now += EXPIRY + 1
        self.partition.tick(self.now, check_interval_ms=1)
        start = self.partition.log_start_offset
        self.expired.update({pid: p["retained"] for pid, p in self.producers.items()
                             if p["history"][-1][2] >= start})
        self.producers.clear()

    @precondition(lambda self: self.partition.log_end_offset > self.partition.log_start_offset)
    @rule()
    def retention(self):
        self.partition.delete_records_before(self.partition.log_end_offset)
        self.expired.clear()  # every expired producer's newest batch is now below the log start

    @rule()
    def clean_restart(self):
        self.partition.close()
        self.partition = self._open()

    @rule()
    def crash(self):
        self.partition.log.close()  # the log's data is on disk; producer state only in snapshots
        self.partition = self._open()
        # A producer restored after the last snapshot, with no batch appended since, is
        # remembered as expired again (its next batch restores it once more: same answers).
        ps = self.partition.producer_state
        for pid in [pid for pid in self.producers if pid not in ps and pid in ps.expired]:
            p = self.producers.pop(pid)
            assert ps.expired.get(pid)[1] == p["history"][-1][2]
            self.expired[pid] = p["retained"]

    @invariant()
    def state_matches(self):
        if not hasattr(self, "partition"):
            return
        ps = self.partition.producer_state
        assert len(ps) == len(self.producers)
        for pid, p in self.producers.items():
            e = ps.entry(pid)
            assert e is not None and e.epoch == p["epoch"], pid
            assert [(f, l, o) for f, l, o, _ts in e.batches] == p["history"][-p["retained"]:], pid


TestPartitionStateful = PartitionMachine.TestCase

"""Hypothesis drives a Partition over a real PartitionLog (real files) against a plain model:
produce, retry any earlier batch, gaps, epoch bumps, segment rolls, deletion of a prefix of the
log (anywhere, also inside a remembered producer's window), runtime window changes, expiry with a
small budget of remembered producers (so some are forgotten and the producer-state start rises),
clean restarts and crashes (the log's files survive with no clean-shutdown marker, the in-memory
state does not).

Every answer must match the model, and after any restart the full window must still
deduplicate: snapshots hold every retained batch, and the log above the newest snapshot is
replayed."""
from __future__ import annotations

import shutil
import tempfile
from itertools import takewhile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from test_partition import crash_log
from tests.tiers import examples

from oncelog.core.producer_state import ProducerStateConfig
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.records import Record, encode_batch
from oncelog.storage.log import LogConfig, PartitionLog
from oncelog.storage.partition import Partition, PartitionConfig

SPACE = 2**31
EXPIRY = 100_000
T0 = 1_700_000_000_000


def batch(pid, epoch, seq, n):
    return bytearray(encode_batch([Record(i, T0, None, b"%d-%d-%d" % (pid, seq, i), []) for i in range(n)],
                                  producer_id=pid, producer_epoch=epoch, base_sequence=seq))


@settings(max_examples=examples(25), stateful_step_count=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
class PartitionMachine(RuleBasedStateMachine):
    @initialize(window=st.sampled_from([5, 8]), segment_bytes=st.sampled_from([400, 1500, 1 << 20]),
                remembered=st.sampled_from([0, 1, 2, 100]))
    def setup(self, window, segment_bytes, remembered):
        self.tmp = Path(tempfile.mkdtemp(prefix="pstate-"))
        self.dir = self.tmp / "t-0"
        self.log_config = LogConfig(segment_bytes=segment_bytes)
        self.window = window
        self.remembered = remembered
        self.now = T0
        self.partition = self._open()
        self.producers: dict[int, dict] = {}  # pid -> {epoch, history [(first, last, offset)], retained}
        self.appended: list[tuple[int, int, int, int, int]] = []  # (pid, epoch, first, last, offset) in the log
        # expired pids the broker remembers (snapshots keep them) -> (batches retained, last offset)
        self.expired: dict[int, tuple[int, int]] = {}
        self.restored: dict[int, tuple[int, int]] = {}  # restored since: what a crash brings back
        self.watermark = -1  # the highest last offset of a producer forgotten for room

    def teardown(self):
        try:
            self.partition.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _producer_config(self):
        return {"producer.state.batches.to.retain": self.window, "producer.id.expiration.ms": EXPIRY,
                "producer.state.max.remembered.producers.per.partition": self.remembered}

    def _open(self) -> Partition:
        log = PartitionLog.open(self.dir, self.log_config, self.now)
        return Partition("t", 0, log, ProducerStateConfig.from_topic_config(self._producer_config()),
                         now_ms=self.now)

    @staticmethod
    def _last_offset(b) -> int:
        _pid, _epoch, f, lseq, offset = b
        return offset + (lseq - f) % SPACE

    def _restore(self, pid):
        """An expired producer whose batches are still in the log is restored from them: the
        batches it retained when it expired (the state remembers where each is), those the
        log start has not passed."""
        retained, end = self.restored[pid] = self.expired.pop(pid)
        start = self.partition.log_start_offset
        mine = [b for b in self.appended if b[0] == pid][-retained:]
        mine = [b for b in mine if self._last_offset(b) >= start]
        if mine:
            # the batches since the last change of epoch: a change resets the state, in the
            # log as in memory (after expiry a producer id may even come back at a lower epoch)
            last_epoch = mine[-1][1]
            run = list(takewhile(lambda b: b[1] == last_epoch, reversed(mine)))[::-1]
            history = [(f, lseq, o) for _pid, _e, f, lseq, o in run]
            self.producers[pid] = {"epoch": last_epoch, "history": history, "retained": len(history)}

    def _expect(self, pid, epoch, f, lseq):
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
            if (bf, bl) == (f, lseq):
                return ("ok", off)
        if f == (p["history"][-1][1] + 1) % SPACE:
            return ("ok", None)
        return ("err", E.OUT_OF_ORDER_SEQUENCE_NUMBER)

    def _send(self, pid, epoch, f, n):
        lseq = (f + n - 1) % SPACE
        kind, value = self._expect(pid, epoch, f, lseq)
        end = self.partition.log_end_offset
        r = self.partition.append_from_client(batch(pid, epoch, f, n), self.now)
        start = self.partition.log_start_offset
        if kind == "err" and value == E.UNKNOWN_PRODUCER_ID:
            # above everything a producer forgotten for room wrote: its client resets
            assert r.log_start_offset == max(start, self.watermark + 1), (r, self.watermark)
        else:
            assert r.log_start_offset == start
        if kind == "err":
            assert r.error_code == value, (r, pid, epoch, f, lseq)
            assert self.partition.log_end_offset == end
            return
        assert r.error_code == 0, (r, pid, epoch, f, lseq)
        if value is not None:  # a duplicate: the original offset, nothing appended
            assert r.base_offset == value
            assert self.partition.log_end_offset == end
            return
        assert r.base_offset == end
        p = self.producers.get(pid)
        if p is None or p["epoch"] != epoch:
            p = self.producers[pid] = {"epoch": epoch, "history": [], "retained": 0}
        self.restored.pop(pid, None)  # appended since: a crash's replay restores it again
        p["history"].append((f, lseq, r.base_offset))
        self.appended.append((pid, epoch, f, lseq, r.base_offset))
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
            f, lseq, _ = p["history"][max(0, len(p["history"]) - 1 - back)]
            self._send(pid, p["epoch"], f, (lseq - f) % SPACE + 1)

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
        self.partition.update_config(PartitionConfig(
            self.log_config, ProducerStateConfig.from_topic_config(self._producer_config())))
        for p in self.producers.values():
            p["retained"] = min(p["retained"], window)
        for remembered in (self.expired, self.restored):  # remembered offsets follow the window
            for pid, (retained, end) in remembered.items():
                remembered[pid] = (min(retained, window), end)

    @rule()
    def expire_all(self):
        self.now += EXPIRY + 1
        self.partition.tick(self.now, check_interval_ms=1)
        start = self.partition.log_start_offset
        for pid, p in self.producers.items():
            f, lseq, offset = p["history"][-1]
            end = offset + (lseq - f) % SPACE
            if end >= start:
                self.expired[pid] = (p["retained"], end)
        self.producers.clear()
        self.restored.clear()
        if len(self.expired) > self.remembered:  # forgotten for room: lowest last offset first
            ends = sorted(end for _r, end in self.expired.values())
            threshold = ends[len(ends) - self.remembered * 9 // 10 - 1]
            self.expired = {pid: v for pid, v in self.expired.items() if v[1] > threshold}
            self.watermark = max(self.watermark, threshold)

    @precondition(lambda self: self.partition.log_end_offset > self.partition.log_start_offset)
    @rule(at=st.integers(1, 10**6))
    def retention(self, at):
        """Delete a prefix of the log, up to anywhere in it (inside a batch, a window, ...)."""
        start, end = self.partition.log_start_offset, self.partition.log_end_offset
        new_start = start + 1 + at % (end - start)
        self.partition.delete_records_before(new_start)
        # remembered producers whose newest batch is wholly gone are forgotten (no restore)
        for remembered in (self.expired, self.restored):
            for pid in [pid for pid, (_r, e) in remembered.items() if e < new_start]:
                del remembered[pid]

    @rule()
    def clean_restart(self):
        self.partition.close()
        self.partition = self._open()

    @rule()
    def crash(self):
        crash_log(self.partition.log)  # files as written, no clean-shutdown marker: recovery runs
        assert not (self.dir / ".clean-shutdown").exists()
        self.partition = self._open()
        # A producer restored after the last snapshot, with no batch appended since, is
        # remembered as expired again (its next batch restores it once more: same answers).
        ps = self.partition.producer_state
        for pid in [pid for pid in self.producers if pid not in ps and pid in ps.expired]:
            p = self.producers.pop(pid)
            assert ps.expired.get(pid).offsets[-1] == p["history"][-1][2]
            self.expired[pid] = self.restored.pop(pid)
        self.restored.clear()

    @invariant()
    def state_matches(self):
        if not hasattr(self, "partition"):
            return
        ps = self.partition.producer_state
        assert len(ps) == len(self.producers)
        assert sorted(pid for pid, _r in ps.expired.items()) == sorted(self.expired)
        assert ps.state_start == self.watermark + 1
        for pid, p in self.producers.items():
            e = ps.entry(pid)
            assert e is not None and e.epoch == p["epoch"], pid
            assert [(f, lseq, o) for f, lseq, o, _ts in e.batches] == p["history"][-p["retained"]:], pid


TestPartitionStateful = PartitionMachine.TestCase

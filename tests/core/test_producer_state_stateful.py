"""Hypothesis drives the packed-array producer state against a plain model built from lists.

The model keeps every batch each producer ever appended in its epoch and decides from that
history; the manager keeps rings in arrays. Rules: produce in sequence, retry any earlier batch,
gaps, overlaps, epoch bumps (right and wrong), old epochs, producers near the sequence wrap,
expiry, snapshot -> crash -> reload, and window/mode changes at runtime.
"""
from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from tests.tiers import examples

from oncelog.core import producer_state as ps
from oncelog.core.producer_state import ProducerStateConfig, ProducerStateManager
from oncelog.protocol.errors import ErrorCode as E
from oncelog.storage.producer_snapshots import decode_snapshot, encode_snapshot

SPACE = 2**31
EXPIRY = 1000


class Model:
    def __init__(self) -> None:
        self.producers: dict[int, dict] = {}  # pid -> {epoch, history [(f, last, off, ts)], retained n, seen}

    def decide(self, cfg: ProducerStateConfig, pid: int, epoch: int, f: int, last: int):
        p = self.producers.get(pid)
        if p is None:
            return ("append",) if f == 0 else ("refuse", E.UNKNOWN_PRODUCER_ID)
        if epoch < p["epoch"]:
            return ("refuse", E.INVALID_PRODUCER_EPOCH)
        if epoch > p["epoch"]:
            return ("append",) if f == 0 else ("refuse", E.OUT_OF_ORDER_SEQUENCE_NUMBER)
        retained = p["history"][-p["retained"]:]
        for i, (bf, bl, off, ts) in enumerate(reversed(retained)):
            if (bf, bl) == (f, last):
                return ("dup", off, ts, "latest" if i == 0 else "window")
        latest_last = retained[-1][1]
        if f == (latest_last + 1) % SPACE:
            return ("append",)
        if cfg.dedup_mode == "range":
            below_first = (latest_last - f) % SPACE
            below_last = (latest_last - last) % SPACE
            if below_first < cfg.max_in_flight_sequence_number and below_last <= below_first:
                return ("lookup", E.DUPLICATE_SEQUENCE_NUMBER, retained[-1][2])
            return ("refuse", E.OUT_OF_ORDER_SEQUENCE_NUMBER)
        oldest_first = retained[0][0]
        older = (oldest_first - last) % SPACE
        if 0 < older < 2**30 and (oldest_first - f) % SPACE >= older:
            return ("lookup", E.OUT_OF_ORDER_SEQUENCE_NUMBER, retained[0][2])
        return ("refuse", E.OUT_OF_ORDER_SEQUENCE_NUMBER)

    def append(self, cfg, pid, epoch, f, last, off, ts, now):
        p = self.producers.get(pid)
        if p is None or p["epoch"] != epoch:
            p = self.producers[pid] = {"epoch": epoch, "history": [], "retained": 0, "seen": now}
        p["history"].append((f, last, off, ts))
        p["retained"] = min(p["retained"] + 1, cfg.stride)
        p["seen"] = max(p["seen"], now)

    def reconfigure(self, cfg):
        for p in self.producers.values():
            p["retained"] = min(p["retained"], cfg.stride)

    def expire(self, now):
        for pid in [pid for pid, p in self.producers.items() if p["seen"] <= now - EXPIRY]:
            del self.producers[pid]


def _result(c: ps.Check):
    if c.kind == ps.APPEND:
        return ("append",)
    if c.kind == ps.DUPLICATE:
        return ("dup", c.base_offset, c.timestamp, c.duplicate_kind)
    if c.kind == ps.LOOKUP:
        return ("lookup", E(c.error), c.base_offset)
    return ("refuse", E(c.error))


pids = st.sampled_from([1, 2, 3, 2**40 + 5, 2**62 + 11])
sizes = st.integers(1, 5)


@settings(max_examples=examples(150), stateful_step_count=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
class ProducerStateMachine(RuleBasedStateMachine):
    @initialize(mode=st.sampled_from(["window", "range"]), window=st.sampled_from([5, 6, 20]),
                threshold=st.sampled_from([3, 10, 1000]))
    def setup(self, mode, window, threshold):
        self.cfg = ProducerStateConfig(dedup_mode=mode, batches_to_retain=window,
                                       max_in_flight_sequence_number=threshold, expiration_ms=EXPIRY)
        self.sut = ProducerStateManager(self.cfg, hash_key=0x5EED)
        self.model = Model()
        self.now = 0
        self.next_offset = 0

    def _send(self, pid, epoch, f, count):
        last = (f + count - 1) % SPACE
        expected = self.model.decide(self.cfg, pid, epoch, f, last)
        c = self.sut.check(pid, epoch, f, last)
        assert _result(c) == expected, (pid, epoch, f, last)
        if c.kind == ps.APPEND:
            off, ts = self.next_offset, self.now + 7
            self.next_offset += count
            self.sut.commit(c, off, ts, self.now)
            self.model.append(self.cfg, pid, epoch, f, last, off, ts, self.now)

    def _state(self, pid):
        return self.model.producers.get(pid)

    @rule(pid=pids, count=sizes)
    def produce_next(self, pid, count):
        p = self._state(pid)
        if p is None:
            self._send(pid, 0, 0, count)
        else:
            self._send(pid, p["epoch"], (p["history"][-1][1] + 1) % SPACE, count)

    @rule(pid=pids, back=st.integers(0, 40))
    def retry_earlier(self, pid, back):
        p = self._state(pid)
        if p is None:
            return
        hist = p["history"]
        f, last, _off, _ts = hist[max(0, len(hist) - 1 - back)]
        self._send(pid, p["epoch"], f, (last - f) % SPACE + 1)

    @rule(pid=pids, gap=st.integers(1, 2000), count=sizes)
    def gap(self, pid, gap, count):
        p = self._state(pid)
        if p is not None:
            self._send(pid, p["epoch"], (p["history"][-1][1] + 1 + gap) % SPACE, count)

    @rule(pid=pids, back=st.integers(0, 10), shift=st.integers(-2, 2), count=sizes)
    def overlap(self, pid, back, shift, count):
        p = self._state(pid)
        if p is not None:
            hist = p["history"]
            f = hist[max(0, len(hist) - 1 - back)][0]
            self._send(pid, p["epoch"], (f + shift) % SPACE, count)

    @rule(pid=pids, seq=st.sampled_from([0, 0, 1, 7]), count=sizes)
    def bump_epoch(self, pid, seq, count):
        p = self._state(pid)
        self._send(pid, (p["epoch"] + 1) if p else 3, seq, count)

    @rule(pid=pids, count=sizes)
    def old_epoch(self, pid, count):
        p = self._state(pid)
        if p is not None and p["epoch"] > 0:
            self._send(pid, p["epoch"] - 1, 0, count)

    @rule(pid=pids, below=st.integers(1, 30), epoch=st.integers(0, 3))
    def near_wrap(self, pid, below, epoch):
        # A producer already close to the sequence limit (as rebuilt from the log): record it in both.
        if self._state(pid) is not None:
            return
        f = SPACE - below
        off = self.next_offset
        self.next_offset += 1
        self.sut.record(pid, epoch, f, f, off, -1, self.now)
        self.model.append(self.cfg, pid, epoch, f, f, off, -1, self.now)

    @rule(dt=st.integers(1, 800))
    def advance_and_expire(self, dt):
        self.now += dt
        n = self.sut.remove_expired(self.now)
        before = len(self.model.producers)
        self.model.expire(self.now)
        assert n == before - len(self.model.producers)

    @rule()
    def snapshot_crash_reload(self):
        offset, cols = decode_snapshot(encode_snapshot(self.next_offset, self.sut.columns()))
        assert offset == self.next_offset
        self.sut = ProducerStateManager(self.cfg, hash_key=0x5EED)
        self.sut.load_columns(cols, self.now)
        self.model.expire(self.now)

    @rule(mode=st.sampled_from(["window", "range"]), window=st.sampled_from([5, 7, 20, 50]))
    def change_config(self, mode, window):
        self.cfg = ProducerStateConfig(dedup_mode=mode, batches_to_retain=window,
                                       max_in_flight_sequence_number=self.cfg.max_in_flight_sequence_number,
                                       expiration_ms=EXPIRY)
        self.sut.reconfigure(self.cfg)
        self.model.reconfigure(self.cfg)

    @invariant()
    def same_producers(self):
        assert len(self.sut) == len(self.model.producers)
        for pid, p in self.model.producers.items():
            e = self.sut.entry(pid)
            assert e is not None and e.epoch == p["epoch"]
            assert list(e.batches) == p["history"][-p["retained"]:]


TestProducerState = ProducerStateMachine.TestCase

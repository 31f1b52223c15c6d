"""Hypothesis drives a compacted Partition over real files against a plain model: produces from
several idempotent producers and a plain one (keys from a small set, some tombstones), cleaner
passes (with a small offset map, so a pass may stop early), time passing, restarts clean or
crashed, with or without the producer-state snapshots (then the state is rebuilt from the
cleaned log alone), retries of each producer's last batch, and a transactional producer whose
transactions commit or abort.

Invariants, after every step:
- the log read from the start has strictly increasing offsets, and every record is exactly the
  one produced at its offset (key, value, timestamp);
- every record at or above the cleaner's first dirty offset is there (untouched);
- below it no key appears twice, and no record of an aborted transaction is left;
- the last record per key equals the model's latest one, except a tombstone that a pass has
  removed after its delete horizon (the first pass that covered it, plus delete.retention.ms):
  then the key is absent (records of aborted transactions never count);
- no transaction is open after any step, restarts included (markers stay while their records do);
- after a pass, an empty batch below its end is its producer's last batch, none other;
- a retry of each idempotent producer's last batch is answered as a duplicate with its original
  offset, and its next batch is accepted (never OutOfOrderSequence), after cleaning and restarts."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from test_partition import crash_log
from tests.tiers import examples

from oncelog.core import producer_state as ps
from oncelog.core.compaction import ENTRY_COST
from oncelog.core.producer_state import ProducerStateConfig
from oncelog.protocol.records import Record, encode_batch, iter_record_batches
from oncelog.storage import cleaner
from oncelog.storage import producer_snapshots as snaps
from oncelog.storage.log import LogConfig
from oncelog.storage.partition import Partition, PartitionConfig

T0 = 1_700_000_000_000
RETENTION = 1000  # delete.retention.ms
KEYS = [b"a", b"b", b"c", b"d"]
PIDS = [11, 12, 13]
TXN = 21  # a transactional producer


def read_all(p: Partition) -> list[tuple[int, bytes | None, bytes | None, int]]:
    out = []
    off = p.log_start_offset
    while off < p.log_end_offset:
        data = p.read(off, 1 << 20, max_offset=p.log_end_offset)
        if not data:
            break
        batches = list(iter_record_batches(bytes(data)))
        for h, records in batches:
            if not h.is_control:
                out.extend((r.offset, r.key, r.value, r.timestamp) for r in records)
        off = batches[-1][0].last_offset + 1
    return out


@settings(max_examples=examples(40), stateful_step_count=50, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
class CompactionMachine(RuleBasedStateMachine):
    @initialize(segment_bytes=st.sampled_from([200, 400, 900]), ratio=st.sampled_from(["0.0", "0.5"]),
                map_keys=st.sampled_from([1, 2, 1000]))
    def setup(self, segment_bytes, ratio, map_keys):
        self.tmp = Path(tempfile.mkdtemp(prefix="compact-"))
        self.dir = self.tmp / "t-0"
        self.config = PartitionConfig(
            LogConfig(segment_bytes=segment_bytes, cleanup_policy="compact", delete_retention_ms=RETENTION,
                      min_cleanable_dirty_ratio=float(ratio)), ProducerStateConfig())
        self.buffer = map_keys * ENTRY_COST
        self.now = T0
        self.p = Partition.open("t", 0, self.dir, self.config, self.now)
        self.produced: dict[int, tuple[bytes, bytes | None, int]] = {}
        self.latest: dict[bytes, int] = {}
        self.horizon: dict[int, int] = {}      # tombstone offset -> its batch's delete horizon
        self.removed: set[int] = set()          # tombstones a pass has removed
        self.batch_of: dict[int, int] = {}      # record offset -> its batch's base offset
        self.producers: dict[int, dict] = {}    # pid -> {seq, last: (batch bytes, base offset)}
        self.first_dirty = 0
        self.aborted: set[int] = set()          # offsets of records of aborted transactions

    def teardown(self):
        try:
            self.p.close()
        except Exception:  # noqa: BLE001 - a test failure is already being reported
            pass
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------ rules
    @rule(pid=st.sampled_from([*PIDS, -1]),
          records=st.lists(st.tuples(st.sampled_from(KEYS), st.booleans()), min_size=1, max_size=3))
    def produce(self, pid, records):
        self.now += 1
        state = self.producers.setdefault(pid, {"seq": 0, "last": None})
        values = [(k, None if tomb else b"v%d-%d" % (self.now, i)) for i, (k, tomb) in enumerate(records)]
        recs = [Record(i, self.now + i, k, v, ()) for i, (k, v) in enumerate(values)]
        if pid >= 0:
            data = encode_batch(recs, producer_id=pid, producer_epoch=0, base_sequence=state["seq"])
        else:
            data = encode_batch(recs)
        r = self.p.append_from_client(bytearray(data), self.now)
        assert r.error_code == 0, r
        self.p.log.flush()
        for i, (k, v) in enumerate(values):
            off = r.base_offset + i
            self.produced[off] = (k, v, self.now + i)
            self.latest[k] = off
            self.batch_of[off] = r.base_offset
        if pid >= 0:
            state["seq"] += len(recs)
            state["last"] = (bytes(data), r.base_offset)

    @rule(batches=st.lists(st.tuples(st.sampled_from([*PIDS, -1]), st.sampled_from(KEYS), st.booleans()),
                           min_size=2, max_size=8))
    def produce_many(self, batches):
        for pid, key, tomb in batches:
            self.produce(pid, [(key, tomb)])

    @rule(records=st.lists(st.tuples(st.sampled_from(KEYS), st.booleans()), min_size=1, max_size=3),
          commit=st.booleans())
    def transaction(self, records, commit):
        """Producer TXN writes a transactional batch and its marker at once (no transaction is
        left open, so the last stable offset never holds the cleaner back)."""
        self.now += 1
        state = self.producers.setdefault(TXN, {"seq": 0, "last": None})
        values = [(k, None if tomb else b"t%d-%d" % (self.now, i)) for i, (k, tomb) in enumerate(records)]
        recs = [Record(i, self.now + i, k, v, ()) for i, (k, v) in enumerate(values)]
        data = encode_batch(recs, producer_id=TXN, producer_epoch=0, base_sequence=state["seq"], transactional=True)
        r = self.p.append_from_client(bytearray(data), self.now)
        assert r.error_code == 0, r
        self.p.append_marker(TXN, 0, 0, commit, self.now)
        self.p.log.flush()
        for i, (k, v) in enumerate(values):
            off = r.base_offset + i
            self.produced[off] = (k, v, self.now + i)
            self.batch_of[off] = r.base_offset
            if commit:
                self.latest[k] = off
            else:
                self.aborted.add(off)
        state["seq"] += len(recs)
        state["last"] = (bytes(data), r.base_offset)

    @rule(pid=st.sampled_from(PIDS))
    def retry_last_batch(self, pid):
        state = self.producers.get(pid)
        if not state or state["last"] is None:
            return
        data, base = state["last"]
        r = self.p.append_from_client(bytearray(data), self.now)
        assert (r.error_code, r.base_offset) == (0, base), r

    @rule(dt=st.sampled_from([0, RETENTION // 2, RETENTION, 2 * RETENTION]))
    def time_passes(self, dt):
        self.now += dt

    @rule()
    def clean(self):
        before = cleaner.read_checkpoint(self.dir)
        cleaner.clean_now(self.p, self.now, self.buffer)
        end = cleaner.read_checkpoint(self.dir)
        if end > before:
            self._model_pass(end)
            self._only_last_batches_are_kept_empty(end)
        self.first_dirty = max(self.first_dirty, end)

    def _only_last_batches_are_kept_empty(self, end):
        """A pass keeps an empty batch only for its producer's last sequence: one emptied
        earlier goes once its producer has written since (else it would hold its marker too)."""
        last = {pid: state["last"][1] for pid, state in self.producers.items() if state["last"] is not None}
        empty = [(h.base_offset, h.producer_id) for h in self.p.log.iter_batches_from(0)
                 if h.last_offset < end and h.records_count == 0]
        assert all(last.get(pid) == base for base, pid in empty), (empty, last)

    def _model_pass(self, end):
        """What a pass that cleaned every segment below `end` does to tombstones."""
        for off in self.latest.values():
            if off >= end or self.produced[off][1] is not None or off in self.removed:
                continue
            base = self.batch_of[off]
            if base not in self.horizon:
                self.horizon[base] = self.now + RETENTION
            elif self.now >= self.horizon[base]:
                self.removed.add(off)

    @rule(crash=st.booleans(), drop_snapshots=st.booleans())
    def restart(self, crash, drop_snapshots):
        if crash:
            crash_log(self.p.log)
        else:
            self.p.close()
        if drop_snapshots:
            snaps.delete_snapshots(p for _off, p in snaps.list_snapshots(self.dir))
        self.now += 1
        self.p = Partition.open("t", 0, self.dir, self.config, self.now)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def log_matches_model(self):
        if not hasattr(self, "p"):
            return
        log = read_all(self.p)
        offsets = [o for o, *_ in log]
        assert offsets == sorted(set(offsets)), offsets
        for off, k, v, ts in log:
            assert (k, v, ts) == self.produced[off], (off, k, v, ts, self.produced[off])
        present = set(offsets)
        dirty = cleaner.read_checkpoint(self.dir)
        assert all(o in present for o in self.produced if o >= dirty), (dirty, sorted(present))
        below = [k for o, k, *_ in log if o < dirty]
        assert len(below) == len(set(below)), below
        assert not [o for o in offsets if o < dirty and o in self.aborted]  # the cleaner removed them
        last = {k: (o, v) for o, k, v, _ts in log if o not in self.aborted}
        for k, off in self.latest.items():
            if off in self.removed:
                assert k not in last, (k, off, last)
            else:
                assert last.get(k) == (off, self.produced[off][1]), (k, off, last.get(k))

    @invariant()
    def no_transaction_is_left_open(self):
        # a marker the cleaner removed while a batch of its transaction stayed would reopen that
        # transaction at the next rebuild from the log, and hold the last stable offset back
        if hasattr(self, "p"):
            assert self.p.last_stable_offset == self.p.high_watermark

    @invariant()
    def next_batch_of_each_producer_is_accepted(self):
        if not hasattr(self, "p"):
            return
        # checked without changing the log: the producer state's verdict on the next sequence
        for pid, state in self.producers.items():
            if pid < 0 or state["last"] is None:
                continue
            check = self.p.producer_state.check(pid, 0, state["seq"], state["seq"])
            assert check.error == 0 and check.kind == ps.APPEND, (pid, check)


TestCompactionStateful = CompactionMachine.TestCase

"""Hypothesis drives the transactional side of `__consumer_offsets` partitions (`core.txn.offsets`)
against a plain model, with a data partition's producer state (`core.producer_state`) fed the same
appends and markers beside it.

A few producers write TxnOffsetCommits (each is a transactional batch on the group's offsets
partition) and their coordinator writes COMMIT/ABORT markers, while producers are fenced (epoch
bumps) and the coordinator moves (coordinator epoch bumps). Late writers send what they would have
sent earlier: offsets at an older epoch, markers at an older producer epoch or from a deposed
coordinator (the stale-marker step). Markers of Transactions V1 and V2 transactions both come:
a V2 EndTxn bumps the epoch and its marker carries the bumped one, at which the producer's next
transaction runs, so a V2 marker needs an epoch above the producer's unless the producer has
nothing open there (KIP-1228, KAFKA-19999).

Checked at each step: an offsets partition answers a marker or an offsets append exactly as the
data partition twin answers the same marker or batch (INVALID_PRODUCER_EPOCH,
TRANSACTION_COORDINATOR_FENCED, NONE), and as the model says; a refused marker settles nothing and
changes nothing; a taken COMMIT makes exactly the producer's pending offsets on that partition the
groups' committed offsets, a taken ABORT drops them; what is pending and committed equals the model.
"""
from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from tests.tiers import examples

from oncelog.core.producer_state import ProducerStateConfig, ProducerStateManager
from oncelog.core.txn.offsets import OffsetsProducer, add_offsets, expired, take_marker
from oncelog.protocol.errors import ErrorCode as E

PIDS = [7, 8]
PARTITIONS = [0, 1]
GROUPS = {0: ["a", "b"], 1: ["c"]}   # the groups whose offsets live on each offsets partition
TOPIC_PARTITIONS = [("in", 0), ("in", 1)]
NOW = 1_000


class OffsetsMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        self.entries: dict[tuple[int, int], OffsetsProducer | None] = {}
        self.twins = {p: ProducerStateManager(ProducerStateConfig(), hash_key=p) for p in PARTITIONS}
        self.next_seq: dict[tuple[int, int], int] = {}
        self.epoch = {pid: 0 for pid in PIDS}           # the coordinator's current grant
        self.coordinator = 0
        self.sent: set[tuple[int, int, int, int]] = set()  # (pid, epoch, coordinator epoch, version) ever used
        # the model
        self.known: dict[tuple[int, int], tuple[int, int]] = {}  # (partition, pid) -> (epoch, coordinator epoch)
        self.pending: dict[tuple[int, int], dict[str, dict]] = {}
        self.committed: dict[str, dict] = {}
        self.now = NOW

    # ------------------------------------------------------------------ the world moves on
    @rule(pid=st.sampled_from(PIDS))
    def fence(self, pid):
        """InitProducerId: a new instance bumps the epoch."""
        self.epoch[pid] += 1

    @rule()
    def move_coordinator(self):
        self.coordinator += 1

    # ------------------------------------------------------------------ TxnOffsetCommit
    @rule(pid=st.sampled_from(PIDS), partition=st.sampled_from(PARTITIONS), data=st.data(),
          late=st.integers(0, 2))
    def offsets(self, pid, partition, data, late):
        """Offsets of the producer's transaction, at its current epoch or `late` epochs before."""
        epoch = max(self.epoch[pid] - late, 0)
        group = data.draw(st.sampled_from(GROUPS[partition]))
        tp = data.draw(st.sampled_from(TOPIC_PARTITIONS))
        value = data.draw(st.integers(0, 1000))
        self.now += 1
        key = (partition, pid)
        code, _why, after = add_offsets(self.entries.get(key), epoch, group, {tp: value}, self.now)
        twin = self._twin_batch(partition, pid, epoch)
        expected = E.INVALID_PRODUCER_EPOCH if epoch < self.known.get(key, (-1, -1))[0] else E.NONE
        assert code == twin == expected, (code, twin, expected)
        if code:
            assert after is None
            return
        self.entries[key] = after
        self.known[key] = (epoch, self.known.get(key, (-1, -1))[1])
        self.pending.setdefault(key, {}).setdefault(group, {})[tp] = value

    def _twin_batch(self, partition: int, pid: int, epoch: int) -> int:
        """The same append as a transactional batch of the data partition twin."""
        state = self.twins[partition]
        key = (partition, pid)
        seq = 0 if epoch > state.epoch_of(pid) else self.next_seq.get(key, 0)
        check = state.check(pid, epoch, seq, seq)
        if check.error:
            return check.error
        state.commit(check, 0, self.now, self.now)
        self.next_seq[key] = seq + 1
        return E.NONE

    # ------------------------------------------------------------------ markers
    @rule(pid=st.sampled_from(PIDS), partition=st.sampled_from(PARTITIONS), commit=st.booleans())
    def marker(self, pid, partition, commit):
        """The coordinator's marker for the producer's current transaction (Transactions V1)."""
        self._marker(pid, partition, commit, self.epoch[pid], self.coordinator, 0)

    @rule(pid=st.sampled_from(PIDS), partition=st.sampled_from(PARTITIONS), commit=st.booleans())
    def end_v2(self, pid, partition, commit):
        """A Transactions V2 EndTxn: the epoch is bumped and the marker carries the bumped one;
        the producer's next transaction runs at it."""
        self.epoch[pid] += 1
        self._marker(pid, partition, commit, self.epoch[pid], self.coordinator, 2)

    @rule(partition=st.sampled_from(PARTITIONS), commit=st.booleans(), data=st.data())
    def stale_marker(self, partition, commit, data):
        """A marker sent before (a late retry, a deposed coordinator's): any (producer, epoch,
        coordinator epoch) a marker was ever sent with."""
        if not self.sent:
            return
        pid, epoch, coordinator, version = data.draw(st.sampled_from(sorted(self.sent)))
        self._marker(pid, partition, commit, epoch, coordinator, version)

    def _marker(self, pid: int, partition: int, commit: bool, epoch: int, coordinator: int, version: int) -> None:
        self.sent.add((pid, epoch, coordinator, version))
        self.now += 1
        key = (partition, pid)
        before = self.entries.get(key)
        code, _why, after, settled = take_marker(before, pid, epoch, coordinator, self.now, version)
        twin = self.twins[partition]
        open_here = bool(self.pending.get(key))   # offsets appended (a batch in the twin) since the last marker
        twin_code = twin.check_marker(pid, epoch, coordinator, version, open_here)[0]
        known_epoch, known_coordinator = self.known.get(key, (-1, -1))
        expected = (E.INVALID_PRODUCER_EPOCH if epoch < known_epoch or (version >= 2 and epoch == known_epoch
                                                                        and open_here)
                    else E.TRANSACTION_COORDINATOR_FENCED if coordinator < known_coordinator else E.NONE)
        assert code == twin_code == expected, (code, twin_code, expected)
        if code:
            assert after is before and settled == {}
            return
        if epoch > twin.epoch_of(pid):
            self.next_seq[key] = 0  # a new epoch starts a new sequence space
        twin.record_marker(pid, epoch, coordinator, self.now)
        assert settled == self.pending.pop(key, {})
        if commit:
            for group, offsets in settled.items():
                self.committed.setdefault(group, {}).update(offsets)
        self.entries[key] = after
        self.known[key] = (max(known_epoch, epoch), max(known_coordinator, coordinator))

    # ------------------------------------------------------------------ invariants
    @invariant()
    def pending_matches_the_model(self):
        got = {k: {g: dict(o) for g, o in e.pending.items()} for k, e in self.entries.items()
               if e is not None and e.pending}
        assert got == {k: v for k, v in self.pending.items() if v}

    @invariant()
    def known_epochs_match_the_model(self):
        for key, e in self.entries.items():
            if e is not None:
                assert (e.epoch, e.coordinator_epoch) == self.known[key]
                assert (self.twins[key[0]].epoch_of(key[1]) == e.epoch)

    @invariant()
    def a_producer_with_pending_offsets_never_expires(self):
        for e in self.entries.values():
            if e is not None and e.pending:
                assert not expired(e, self.now + 10**9, 1)


OffsetsMachine.TestCase.settings = settings(max_examples=examples(300), stateful_step_count=50, deadline=None,
                                            suppress_health_check=[HealthCheck.too_slow])
test_offsets_partitions = OffsetsMachine.TestCase

"""One share-partition (Kafka's `SharePartition`): which records of one topic partition a share
group has delivered, to whom, and what became of them.

The share-partition start offset (SPSO, `start`) is the first offset not yet finished with; the
end (`end`, Kafka's SPEO + 1) is the first offset never fetched. Every offset in [start, end) is
in one state:
- AVAILABLE: may be acquired by the next fetch of any member;
- ACQUIRED: held by one member until its lock runs out (`deadline`, now + the record lock
  duration at acquisition or at a RENEW);
- ACKNOWLEDGED: the member accepted it; never delivered again;
- ARCHIVING (KIP-1191): rejected, or past the delivery count limit, in a share group with a
  dead-letter topic: never delivered again, and ARCHIVED once its dead-letter record is written;
- ARCHIVED: rejected, past the delivery count limit, a gap in the log (compacted away), a control
  record or a record of an aborted transaction; never delivered again.
Only AVAILABLE and ACQUIRED records (and finished ones above the first unfinished one) are kept
in memory: an offset below `end` that is not in `_records` is finished. `start` moves past the
finished prefix at once, so in-flight state is bounded by `max_in_flight`
(`group.share.partition.max.record.locks`): no new offset is acquired while `end - start` is at
the bound.

Delivery count: each acquisition counts one delivery. A record whose lock runs out or that is
RELEASEd goes back to AVAILABLE, unless it was delivered `delivery_limit` times
(`group.share.delivery.count.limit`): then it is ARCHIVED. So no record is delivered more than
the limit, and the delivery count survives a restart because the state is persisted (with
ACQUIRED written as AVAILABLE, as Kafka writes it) before the records are handed out.

Acknowledgements (ShareFetch/ShareAcknowledge batches): 0 GAP, 1 ACCEPT, 2 RELEASE, 3 REJECT,
4 RENEW (KIP-1222). Every offset acknowledged must be ACQUIRED by that member with its lock still
valid (a GAP may also name an offset already finished), and named once (batches that overlap are
refused), else the whole partition's acknowledgement is refused with INVALID_RECORD_STATE and
nothing changes; the work is bounded by the records in flight and the request's types, never by
the range a batch names. Locks that ran out are taken back before anything is decided (`expire`),
so a record is never held by two members while a lock on it is valid.

Dead letters (KIP-1191; `broker.groups.share_dlq` writes them): while `dead_letter` is set (the
group names a dead-letter topic), a record REJECTed, or archived by the delivery limit, goes to
ARCHIVING instead, and a `DeadLetter` (offset, sequence, delivery count, reason) joins the
share-partition's pending dead letters. Sequences are given in the order records go ARCHIVING and
are the sequence numbers of the idempotent producer (`producer_id`, `producer_epoch`) that writes
them, so a dead letter written twice (a crash between the write and the state write that says so,
an old owner paused mid-write) is a duplicate the dead-letter partition refuses; each producer
epoch writes to one dead-letter partition (`target`), and `renumber` starts a new epoch (a new
target, a dead letter given up). ARCHIVING records hold the start offset back, so pending dead
letters are bounded by `max_in_flight` as in-flight records are; those whose record retention
deleted meanwhile, or an administrator's reset forgot, count against the same bound. The pending dead letters and the
producer are persisted with the state, so a restart writes what was not written, once.

Acquisition modes (ShareFetch v2, KIP-1206): BATCH_OPTIMIZED (0) acquires whole log batches and
may pass MaxRecords to end on a batch boundary, as Kafka does; RECORD_LIMIT (1) never acquires
more than MaxRecords.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVING, ARCHIVED = 0, 1, 2, 3, 4   # Kafka's RecordState ids
STATE_NAMES = {AVAILABLE: "AVAILABLE", ACQUIRED: "ACQUIRED", ACKNOWLEDGED: "ACKNOWLEDGED", ARCHIVING: "ARCHIVING",
               ARCHIVED: "ARCHIVED"}
GAP, ACCEPT, RELEASE, REJECT, RENEW = 0, 1, 2, 3, 4       # AcknowledgeType
ACK_TYPES = (GAP, ACCEPT, RELEASE, REJECT, RENEW)
BATCH_OPTIMIZED, RECORD_LIMIT = 0, 1                     # ShareAcquireMode
NO_DEADLINE = 1 << 62
# why a record is dead-lettered, and the text Kafka writes in its `__dlq.errors.message` header
REJECTED, PAST_LIMIT = 1, 2
DEAD_LETTER_REASONS = {REJECTED: "Offset rejected by client.",
                       PAST_LIMIT: "Offset delivery count exceeded the threshold."}
MAX_SEQUENCE = 2**31 - 1


class InvalidRecordState(Exception):
    """An acknowledgement names a record the member does not hold (Kafka's INVALID_RECORD_STATE)."""


class _Rec:
    __slots__ = ("state", "count", "member", "deadline")

    def __init__(self, state: int = AVAILABLE, count: int = 0) -> None:
        self.state = state
        self.count = count
        self.member: str | None = None
        self.deadline = NO_DEADLINE


@dataclass(frozen=True)
class Acquired:
    """A run of consecutive offsets acquired by one fetch, all with the same delivery count
    (ShareFetch's AcquiredRecords)."""
    first_offset: int
    last_offset: int
    delivery_count: int


@dataclass(frozen=True)
class StateBatch:
    """A run of [first, last] in one persisted state (Kafka's PersisterStateBatch)."""
    first_offset: int
    last_offset: int
    state: int
    delivery_count: int


@dataclass(frozen=True)
class DeadLetter:
    """A record owed to the group's dead-letter topic: its offset, the producer sequence its
    dead-letter record is written with, its delivery count and why (REJECTED, PAST_LIMIT)."""
    offset: int
    sequence: int
    delivery_count: int
    reason: int


@dataclass(frozen=True)
class DeadLetterState:
    """What a share-partition persists of its dead letters: the idempotent producer that writes
    them (-1: none yet), the dead-letter partition its epoch writes to ((topic id, partition),
    None: none yet), the next sequence to give, and the dead letters not yet written."""
    producer_id: int = -1
    producer_epoch: int = 0
    target: tuple[str, int] | None = None
    next_sequence: int = 0
    pending: tuple[DeadLetter, ...] = ()


@dataclass
class Counts:
    """What happened, for metrics: records acquired, redelivered (acquired again), acknowledged,
    released, rejected, archived by the delivery limit, locks that ran out; records written to
    the dead-letter topic, and records archived without their dead-letter record (the topic
    refused them: KIP-1191's failed writes)."""
    acquired: int = 0
    redelivered: int = 0
    accepted: int = 0
    released: int = 0
    rejected: int = 0
    archived_by_limit: int = 0
    lock_expiries: int = 0
    dead_lettered: int = 0
    dead_letter_failed: int = 0


class SharePartition:
    def __init__(self, start: int, delivery_limit: int = 5, max_in_flight: int = 2000,
                 state_epoch: int = 0) -> None:
        self.start = start
        self.end = start
        self.delivery_limit = delivery_limit
        self.max_in_flight = max_in_flight
        self.state_epoch = state_epoch
        self._records: dict[int, _Rec] = {}
        self._next_deadline = NO_DEADLINE
        self.counts = Counts()
        # KIP-1191: set while the group has a dead-letter topic (`broker.groups.share_groups`)
        self.dead_letter = False
        self.dlq_producer_id = -1
        self.dlq_producer_epoch = 0
        self.dlq_target: tuple[str, int] | None = None
        self._dlq_next_sequence = 0
        self._dead: list[DeadLetter] = []    # pending, in sequence order

    # ------------------------------------------------------------------ reading
    def state_of(self, offset: int) -> tuple[int, int, str | None]:
        """(state, delivery count, holder) of one offset; finished offsets below `start` (and
        gaps) are ARCHIVED or ACKNOWLEDGED as far as anyone can tell: ARCHIVED, 0."""
        rec = self._records.get(offset)
        if rec is None:
            return (AVAILABLE, 0, None) if offset >= self.end else (ARCHIVED, 0, None)
        return rec.state, rec.count, rec.member

    def next_fetch_offset(self, now: int) -> int:
        """Where the next fetch reads the log: the lowest AVAILABLE offset (locks that ran out by
        `now` taken back first), else `end`."""
        self.expire(now)
        available = [o for o, r in self._records.items() if r.state == AVAILABLE]
        return min(available) if available else self.end

    def in_flight(self) -> int:
        return self.end - self.start

    def acquired_by(self, member: str) -> list[int]:
        return sorted(o for o, r in self._records.items() if r.state == ACQUIRED and r.member == member)

    def next_deadline(self) -> int:
        return self._next_deadline

    # ------------------------------------------------------------------ the log moved
    def move_start(self, log_start: int) -> None:
        """The log's start moved past `start` (retention, DeleteRecords): what went is finished."""
        if log_start <= self.start:
            return
        for o in [o for o in self._records if o < log_start]:
            del self._records[o]
        self.start = log_start
        self.end = max(self.end, log_start)

    def reset_to(self, offset: int) -> None:
        """An administrator's reset (only while the group has no members): everything forgotten,
        the next fetch starts at `offset`."""
        self._records.clear()
        self.start = self.end = offset
        self._next_deadline = NO_DEADLINE

    # ------------------------------------------------------------------ acquisition
    def acquire(self, member: str, batches: Iterable[tuple[int, int, bool]], max_records: int, now: int,
                lock_ms: int, mode: int = BATCH_OPTIMIZED) -> list[Acquired]:
        """Acquire for `member` what it may have of the log batches read from
        `next_fetch_offset()` on: (first offset, last offset, acquirable) in offset order;
        acquirable is False for control batches and aborted transactions (archived when first
        met). Returns runs of acquired offsets."""
        self.expire(now)
        if max_records <= 0:
            return []
        taken: list[tuple[int, int]] = []      # (offset, delivery count)
        deadline = now + lock_ms
        stop = False
        # dead letters whose record retention deleted still take a place in the in-flight bound
        bound = self.max_in_flight - self._orphans()
        for first, last, acquirable in batches:
            if stop:
                break
            if mode == BATCH_OPTIMIZED and len(taken) >= max_records:
                break
            for offset in range(max(first, self.start), last + 1):
                if mode == RECORD_LIMIT and len(taken) >= max_records:
                    stop = True
                    break
                rec = self._records.get(offset)
                if rec is None:
                    if offset < self.end:
                        continue                      # finished
                    if self.end - self.start >= bound:
                        stop = True
                        break
                    self.end = offset + 1             # offsets skipped below it are gaps: finished
                    if not acquirable:
                        continue                      # control or aborted: archived
                    rec = self._records[offset] = _Rec()
                if rec.state != AVAILABLE:
                    continue
                rec.state, rec.member, rec.deadline = ACQUIRED, member, deadline
                rec.count += 1
                if rec.count > 1:
                    self.counts.redelivered += 1
                taken.append((offset, rec.count))
        if taken:
            self._next_deadline = min(self._next_deadline, deadline)
            self.counts.acquired += len(taken)
        self._advance()
        return _runs(taken)

    # ------------------------------------------------------------------ acknowledgement
    def acknowledge(self, member: str, batches: Sequence[tuple[int, int, Sequence[int]]], now: int,
                    lock_ms: int) -> None:
        """Apply (first, last, types) batches of `member`; raises InvalidRecordState (nothing
        changed) if any offset is not the member's to acknowledge."""
        self.expire(now)
        plan: list[tuple[int, int]] = []
        # no offset named twice (Kafka's validateAcknowledgementBatches refuses overlapping
        # batches): the plan would apply it twice (ACCEPTed then RELEASEd: delivered again;
        # REJECTed twice: two dead letters)
        spans = sorted((first, last) for first, last, _types in batches)
        for (_f, previous_last), (first, last) in zip(spans, spans[1:]):
            if first <= previous_last:
                raise InvalidRecordState(f"acknowledgement batch {first}-{last} overlaps another one")
        in_flight: list[int] | None = None
        for first, last, types in batches:
            if last < first or not types or (len(types) != 1 and len(types) != last - first + 1):
                raise InvalidRecordState(f"malformed acknowledgement batch {first}-{last}")
            bad = next((kind for kind in types if kind not in ACK_TYPES), None)
            if bad is not None:
                raise InvalidRecordState(f"unknown acknowledge type {bad}")
            offsets: Iterable[int] = range(first, last + 1)
            if len(types) == 1 and last - first + 1 > len(self._records):
                # one type over more offsets than are in flight: only a GAP below `end` may name
                # offsets without a record (finished), so only those with one are looked at; the
                # work is bounded by what is in flight, not by the range the client names
                if types[0] != GAP or last >= self.end:
                    raise InvalidRecordState(f"offsets {first}-{last} are not acquired by this member")
                if in_flight is None:
                    in_flight = sorted(self._records)   # once per request: many such batches cost no more
                offsets = in_flight[bisect_left(in_flight, first):bisect_right(in_flight, last)]
            for offset in offsets:
                kind = types[0] if len(types) == 1 else types[offset - first]
                rec = self._records.get(offset)
                if kind == GAP and (rec is None and offset < self.end):
                    continue
                if rec is None or rec.state != ACQUIRED or rec.member != member:
                    raise InvalidRecordState(f"offset {offset} is not acquired by this member")
                plan.append((offset, kind))
        for offset, kind in plan:
            rec = self._records[offset]
            if kind == RENEW:
                rec.deadline = now + lock_ms
                self._next_deadline = min(self._next_deadline, rec.deadline)
            elif kind == ACCEPT:
                self._finish(rec, ACKNOWLEDGED)
                self.counts.accepted += 1
            elif kind == RELEASE:
                self._give_back(offset, rec)
                self.counts.released += 1
            elif kind == REJECT:
                self._dead_letter(offset, rec, REJECTED)
                self.counts.rejected += 1
            else:   # GAP
                self._finish(rec, ARCHIVED)
        self._advance()

    def unacquire(self, member: str, acquired: Sequence[Acquired]) -> int:
        """Acquisitions that were never handed out (their state write failed): back to AVAILABLE
        with the delivery count they had, as Kafka rolls back a state transition whose write
        failed. Offsets no longer held by `member` at that count (their lock ran out meanwhile)
        are left as they are."""
        n = 0
        for a in acquired:
            for offset in range(a.first_offset, a.last_offset + 1):
                rec = self._records.get(offset)
                if rec is not None and rec.state == ACQUIRED and rec.member == member \
                        and rec.count == a.delivery_count:
                    rec.state, rec.member, rec.deadline = AVAILABLE, None, NO_DEADLINE
                    rec.count -= 1
                    n += 1
        self.counts.acquired -= n
        return n

    def release_member(self, member: str) -> int:
        """The member left (or its share session closed): what it holds goes back, as RELEASE."""
        n = 0
        for offset, rec in self._records.items():
            if rec.state == ACQUIRED and rec.member == member:
                self._give_back(offset, rec)
                n += 1
        self._advance()
        return n

    def expire(self, now: int) -> int:
        """Locks that ran out by `now` give their records back."""
        if now < self._next_deadline:
            return 0
        n = 0
        nxt = NO_DEADLINE
        for offset, rec in self._records.items():
            if rec.state != ACQUIRED:
                continue
            if rec.deadline <= now:
                self._give_back(offset, rec)
                n += 1
            else:
                nxt = min(nxt, rec.deadline)
        self._next_deadline = nxt
        self.counts.lock_expiries += n
        self._advance()
        return n

    def _give_back(self, offset: int, rec: _Rec) -> None:
        if rec.count >= self.delivery_limit:
            self._dead_letter(offset, rec, PAST_LIMIT)
            self.counts.archived_by_limit += 1
        else:
            rec.state, rec.member, rec.deadline = AVAILABLE, None, NO_DEADLINE

    def _dead_letter(self, offset: int, rec: _Rec, reason: int) -> None:
        """Rejected or past the limit: ARCHIVING with a dead letter when the group has a
        dead-letter topic, else ARCHIVED."""
        if not self.dead_letter:
            self._finish(rec, ARCHIVED)
            return
        self._finish(rec, ARCHIVING)
        self._dead.append(DeadLetter(offset, self._dlq_next_sequence, rec.count, reason))
        self._dlq_next_sequence += 1

    @staticmethod
    def _finish(rec: _Rec, state: int) -> None:
        rec.state, rec.member, rec.deadline = state, None, NO_DEADLINE

    def _advance(self) -> None:
        records = self._records
        while self.start < self.end:
            rec = records.get(self.start)
            if rec is not None:
                if rec.state not in (ACKNOWLEDGED, ARCHIVED):
                    break
                del records[self.start]
            self.start += 1

    # ------------------------------------------------------------------ persistence
    def state_batches(self) -> list[StateBatch]:
        """What the persister keeps (Kafka's WriteShareGroupState batches): runs over [start,
        end) with ACQUIRED written as AVAILABLE (after a restart nobody holds anything),
        ARCHIVING as it is (its dead letter is in `dead_letter_state`) and finished offsets as
        ARCHIVED. One object per run, not per offset: this runs for every
        share-partition a state write carries."""
        out: list[StateBatch] = []
        records = self._records
        first, run_state, run_count = self.start, -1, -1
        for offset in range(self.start, self.end):
            rec = records.get(offset)
            if rec is None:
                state, count = ARCHIVED, 0
            else:
                state, count = rec.state, rec.count
                if state == ACQUIRED:
                    state = AVAILABLE
                elif state == ACKNOWLEDGED:
                    state = ARCHIVED   # both are finished; one state keeps the runs long
            if state != run_state or count != run_count:
                if run_state >= 0:
                    out.append(StateBatch(first, offset - 1, run_state, run_count))
                first, run_state, run_count = offset, state, count
        if run_state >= 0:
            out.append(StateBatch(first, self.end - 1, run_state, run_count))
        return out

    @classmethod
    def loaded(cls, start: int, batches: Iterable[StateBatch], delivery_limit: int = 5,
               max_in_flight: int = 2000, state_epoch: int = 0, dead_letters: DeadLetterState | None = None,
               dead_letter: bool = False) -> SharePartition:
        """The share-partition a persisted state describes; nothing is acquired in it. A record
        written as available at the delivery limit (held for its last delivery when the broker
        stopped, or the limit was lowered) is archived by the limit: with `dead_letter`, as a
        new dead letter (`dead_letter_state` then differs from the one loaded: write it)."""
        sp = cls(start, delivery_limit, max_in_flight, state_epoch)
        sp.dead_letter = dead_letter
        dl = dead_letters or DeadLetterState()
        sp.dlq_producer_id, sp.dlq_producer_epoch, sp.dlq_target = dl.producer_id, dl.producer_epoch, dl.target
        sp._dlq_next_sequence = dl.next_sequence
        sp._dead = list(dl.pending)
        owed = {d.offset for d in dl.pending}
        for b in batches:
            if b.last_offset < start:
                continue
            sp.end = max(sp.end, b.last_offset + 1)
            if b.state in (AVAILABLE, ACQUIRED):
                for offset in range(max(b.first_offset, start), b.last_offset + 1):
                    if b.delivery_count >= delivery_limit:
                        rec = sp._records[offset] = _Rec(ACQUIRED, b.delivery_count)
                        sp._give_back(offset, rec)   # archived by the limit (ARCHIVING with a dead letter)
                        if rec.state == ARCHIVED:
                            del sp._records[offset]
                        continue
                    sp._records[offset] = _Rec(AVAILABLE, b.delivery_count)
            elif b.state == ARCHIVING:
                for offset in range(max(b.first_offset, start), b.last_offset + 1):
                    if offset in owed:   # (else its dead letter was written or given up: finished)
                        sp._records[offset] = _Rec(ARCHIVING, b.delivery_count)
        sp._advance()
        return sp

    # ------------------------------------------------------------------ dead letters (KIP-1191)
    def dead_letters(self) -> list[DeadLetter]:
        """The dead letters not yet written, in sequence order."""
        return list(self._dead)

    def dead_letter_state(self) -> DeadLetterState:
        return DeadLetterState(self.dlq_producer_id, self.dlq_producer_epoch, self.dlq_target,
                               self._dlq_next_sequence, tuple(self._dead))

    def renumber(self, producer_id: int, producer_epoch: int, target: tuple[str, int]) -> None:
        """A new producer epoch (or producer) writing to `target`: the pending dead letters get
        sequences from 0 in their order. Only while none of them is being written: a new epoch
        starts at sequence 0 in the dead-letter partition, and its sequences must follow one
        another there."""
        self.dlq_producer_id, self.dlq_producer_epoch, self.dlq_target = producer_id, producer_epoch, target
        self._dead = [DeadLetter(d.offset, i, d.delivery_count, d.reason) for i, d in enumerate(self._dead)]
        self._dlq_next_sequence = len(self._dead)

    def dead_lettered(self, last_sequence: int) -> int:
        """The dead letters up to `last_sequence` are written (their records are ARCHIVED): how
        many."""
        n = 0
        while self._dead and self._dead[0].sequence <= last_sequence:
            self._archive(self._dead.pop(0))
            n += 1
        self.counts.dead_lettered += n
        self._advance()
        return n

    def drop_dead_letters(self, count: int | None = None) -> int:
        """The first `count` dead letters (all: None) are given up (the topic refuses them): their
        records are ARCHIVED without a dead-letter record. The sequences after them then have a
        gap: the writer starts a new epoch (`renumber`) before writing the rest."""
        gone = self._dead if count is None else self._dead[:count]
        self._dead = [] if count is None else self._dead[count:]
        for d in gone:
            self._archive(d)
        self.counts.dead_letter_failed += len(gone)
        self._advance()
        return len(gone)

    def _archive(self, d: DeadLetter) -> None:
        rec = self._records.get(d.offset)
        if rec is not None and rec.state == ARCHIVING:
            self._finish(rec, ARCHIVED)

    def _orphans(self) -> int:
        """Pending dead letters whose record is not ARCHIVING here, so not already counted in
        [start, end): retention deleted it, or an administrator's reset (`reset_to`, a new
        share-partition) forgot it. Each takes a place in the in-flight bound all the same."""
        if not self._dead:
            return 0
        records = self._records
        inside = sum(1 for o in {d.offset for d in self._dead}
                     if (r := records.get(o)) is not None and r.state == ARCHIVING)
        return len(self._dead) - inside


def _runs(taken: list[tuple[int, int]]) -> list[Acquired]:
    """(offset, delivery count) in offset order as runs, one object per run."""
    out: list[Acquired] = []
    first = last = count = -1
    for offset, c in taken:
        if offset == last + 1 and c == count and last >= 0:
            last = offset
            continue
        if last >= 0:
            out.append(Acquired(first, last, count))
        first = last = offset
        count = c
    if last >= 0:
        out.append(Acquired(first, last, count))
    return out

"""The checker of `oncelog verify --workload share` (`testing.share_verify`): what the members of a
share group were given and what they acknowledged (`testing.share_child`'s events), judged against
the records in the log and the share-partitions' final state.

Anomalies (each a broken promise of KIP-932 as oncelog serves it, docs/share-groups.md):

- `lost`: a record of the log that did not end finished: at the end (after the members and a
  last sweeper drained the group) its offset is at or above its share-partition's start and not
  ARCHIVED (the store writes ACKNOWLEDGED as ARCHIVED: both are finished) nor at the delivery
  limit (archived when loaded), or above its end (never acquired).
- `redelivered-after-ack`: a record delivered again (a higher delivery count) after an ACCEPT or
  a REJECT of an earlier delivery was confirmed: "redeliveries only of what was not acknowledged".
- `acknowledged-twice`: two confirmed ACCEPTs of one record.
- `past-limit`: a delivery count above `group.share.delivery.count.limit`.
- `count-not-increasing`: two deliveries of a record with the same delivery count, or a later one
  with a lower count: acquisitions are written before records are handed out, so every delivery
  counts one more, across crashes too.
- `held-twice`: a record given to a second member while the first one's lock was certainly still
  valid: acquired (no earlier than the start of the poll that returned it) less than the lock
  duration before, and not given back since (no acknowledgement sent by the holder, no share
  session of the holder dropped, no process fault of the brokers or the controller under way or
  just over, all of which may end a lock early). Only oncelog's members tell when a record was
  acquired (librdkafka may have fetched a record long before the poll that returns it), so only
  records they held are checked.
- `value-mismatch`: a delivery whose value is not the log's at its offset.
- `starved` (liveness, issue 37): a member alive and polling without a break for `STARVED_S` or
  more that got nothing while the other members were given at least `STARVED_OTHERS` records
  meanwhile. Every member is assigned a partition of a topic filled evenly at a pace, and shares
  it with members that long-poll as it does, so a member that gets nothing for that long is not
  waiting its turn: it asks where nobody serves its partition (oncelog's members kept asking the
  partition's old leader, hundreds of NOT_LEADER_OR_FOLLOWER a second, and got no record for the
  whole run). A finding the run fails on, not a warning: faults end its stretch (a member paused
  or killed stops polling; the brokers' faults last seconds, well below `STARVED_S`). Such a
  finding names the member, not a record (partition and offset -1).
- `spinning` (oncelog's members, issue 37): more than `SPIN_ANSWERS` NOT_LEADER_OR_FOLLOWER
  answers to a member's ShareFetch within `SPIN_WINDOW_S`. Such an answer comes at once, and the
  client backs off `retry.backoff.ms` (100) before asking again: at most about 10 requests a
  second, each naming at most the topic's 4 partitions, 84 answers in 2 s. Asking again at once
  (the bug) gave hundreds a second. Counted from the members' `fetch-errors` events (logged at a
  poll's start), so a window is known to a poll or so.

With a dead-letter topic (KIP-1191, `--share-dlq`), a record may also end "in the DLQ": a record
REJECTed or archived at the delivery limit is ARCHIVED once its dead-letter record is written, and
a record still ARCHIVING at the end counts as finished but must have its dead-letter record:

- `dlq-missing`: a record whose REJECT was confirmed, or whose last delivery (at the limit) was
  not accepted, or that the final state leaves ARCHIVING, without a dead-letter record;
- `dlq-duplicate`: two dead-letter records for one record (KIP-1191 allows it "in rare
  situations"; oncelog promises exactly one);
- `dlq-unexpected`: a dead-letter record for a record whose ACCEPT was confirmed, or whose reason
  does not match what happened (`Offset rejected by client.` without a REJECT sent at that
  delivery count, `Offset delivery count exceeded the threshold.` below the limit);
- `dlq-mismatch`: a dead-letter record whose headers name another topic or group, or whose value
  (errors.deadletterqueue.copy.record.enable) is not the log's (a record retention deleted first
  may have none).

An acknowledgement answered with an error has an unknown outcome: it counts as applied only if the
record is never delivered again, as the produce workload's unknown outcomes do. What is counted,
not judged: records archived by the delivery limit, rejected, redelivered; records finished with
deliveries nobody logged (a response the proxy dropped after the broker acquired the records, a
member killed between the fetch and its log line); records the expiry fault deleted before they
were finished.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

ACCEPT, RELEASE, REJECT = 1, 2, 3
NOT_LEADER_OR_FOLLOWER = 6   # protocol.errors.ErrorCode's
ARCHIVING, ARCHIVED = 3, 4   # core.share.partition's state ids (ARCHIVED: acknowledged or archived)
DLQ_REJECTED = "Offset rejected by client."
DLQ_PAST_LIMIT = "Offset delivery count exceeded the threshold."
LOCK_MARGIN_S = 0.3   # the broker expires locks on its tick: never early, maybe a little late
FAULT_SETTLE_S = 5.0  # after a process fault, what it did to locks may still be taking effect
STARVED_S = 25.0      # a member polling this long without a record, while others get them: `starved`
STARVED_OTHERS = 50   # ... at least this many records given to the others meanwhile
SPIN_ANSWERS = 100    # NOT_LEADER_OR_FOLLOWER answers to one member within SPIN_WINDOW_S: `spinning`
SPIN_WINDOW_S = 2.0
POLL_GAP_S = 3.0      # polls further apart than this: the member was not polling (paused, stuck in a call)

Key = tuple[int, int]   # (partition, offset)


@dataclass
class Delivery:
    member: str
    client: str
    t: float
    partition: int
    offset: int
    count: int
    value: str
    poll_t: float


@dataclass
class Ack:
    member: str
    t: float
    partition: int
    offset: int
    count: int
    kind: int
    answered_t: float | None = None
    error: str | None = None    # None with answered_t set: confirmed

    @property
    def confirmed(self) -> bool:
        return self.answered_t is not None and self.error is None


@dataclass
class History:
    """Everything the members logged, parsed (`add_events`)."""
    deliveries: list[Delivery] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    resets: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: Counter = field(default_factory=Counter)
    polls: Counter = field(default_factory=Counter)
    poll_times: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    fetch_errors: dict[str, dict[str, int]] = field(default_factory=dict)   # oncelog's members: code -> count
    not_leader: dict[str, list[tuple[float, int]]] = field(default_factory=lambda: defaultdict(list))  # (t, count)

    def add_events(self, member: str, client: str, events: list[list[Any]]) -> None:
        open_acks: dict[Key, Ack] = {}
        for e in events:
            kind = e[0]
            if kind == "got":
                _, t, p, o, count, value, poll_t = e
                self.deliveries.append(Delivery(member, client, t, p, o, count, value, poll_t))
            elif kind == "ack":
                _, t, p, o, count, ack_kind = e
                a = Ack(member, t, p, o, count, ack_kind)
                self.acks.append(a)
                open_acks[(p, o)] = a
            elif kind == "ackd":
                _, t, p, o, _kind, error = e
                answered = open_acks.pop((p, o), None)
                if answered is not None:
                    answered.answered_t, answered.error = t, error
            elif kind == "reset":
                self.resets[member].append(e[1])
            elif kind == "error":
                self.errors[(member.split("#")[0], str(e[2])[:90])] += 1
            elif kind == "poll":
                self.polls[member] += 1
                self.poll_times[member].append(e[1])
            elif kind == "fetch-errors":
                self.fetch_errors[member] = dict(e[2])
                self.not_leader[member].append((e[1], int(e[2].get(str(NOT_LEADER_OR_FOLLOWER), 0))))


@dataclass(frozen=True)
class DeadLetterRecord:
    """A record of the group's dead-letter topic, read back: where it is, and its headers."""
    dlq_partition: int
    dlq_offset: int
    topic: str
    partition: int
    offset: int
    group: str
    delivery_count: int
    message: str
    value: bytes | None


@dataclass
class Finding:
    kind: str
    partition: int
    offset: int
    detail: str
    history: list[str] = field(default_factory=list)


ANOMALIES = ("lost", "redelivered-after-ack", "acknowledged-twice", "past-limit", "count-not-increasing",
             "held-twice", "value-mismatch", "starved", "spinning", "dlq-missing", "dlq-duplicate", "dlq-unexpected",
             "dlq-mismatch")


@dataclass
class ShareReport:
    records: int = 0
    deliveries: int = 0
    figures: Counter = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def counts(self) -> Counter:
        return Counter(f.kind for f in self.findings)

    def to_json(self) -> dict:
        return {"ok": self.ok, "records": self.records, "deliveries": self.deliveries,
                "figures": dict(self.figures), "anomalies": dict(self.counts()),
                "findings": [f.__dict__ for f in self.findings[:200]]}


def check_share(log: dict[int, list[tuple[int, bytes]]], history: History,
                final: dict[int, tuple[int, list[tuple[int, int, int, int]]]], delivery_limit: int,
                lock_s: float, fault_windows: list[tuple[float, float]],
                deleted: dict[int, int] | None = None, dead_letters: list[DeadLetterRecord] | None = None,
                topic: str = "", group: str = "") -> ShareReport:
    """`log`: partition -> [(offset, value)], every record the topic held (with what the expiry
    fault deleted); `final`: partition -> (start offset, [(first, last, state, delivery count)]),
    the share-partitions' state at the end; `fault_windows`: (begin, end) of each process fault on
    the brokers or the controller (monotonic seconds); `deleted`: partition -> the log start the
    expiry fault left (records below it may have been deleted before they were finished);
    `dead_letters`: every record of the group's dead-letter topic (None: the group has none), whose
    headers must name `topic` and `group`."""
    r = ShareReport()
    values = {(p, o): v.decode(errors="replace") for p, recs in log.items() for o, v in recs}
    r.records = len(values)
    r.deliveries = len(history.deliveries)
    by_key: dict[Key, list[Delivery]] = defaultdict(list)
    for d in history.deliveries:
        by_key[(d.partition, d.offset)].append(d)
    acks_of: dict[Key, list[Ack]] = defaultdict(list)
    for a in history.acks:
        acks_of[(a.partition, a.offset)].append(a)
    windows = sorted(fault_windows)

    def trail(key: Key) -> list[str]:
        lines = [f"{d.t:.2f} {d.member} got count {d.count} (poll began {d.poll_t:.2f})" for d in by_key[key]]
        lines += [f"{a.t:.2f} {a.member} {('?', 'ACCEPT', 'RELEASE', 'REJECT')[a.kind] if 0 <= a.kind < 4 else a.kind}"
                  f" count {a.count}: " + ("confirmed" if a.confirmed else f"unknown ({a.error or 'no answer'})")
                  for a in acks_of[key]]
        return sorted(lines)

    def find(kind: str, key: Key, detail: str) -> None:
        r.findings.append(Finding(kind, key[0], key[1], detail, trail(key)))

    for key, ds in sorted(by_key.items()):
        ds.sort(key=lambda d: d.t)
        acks = acks_of[key]
        expected = values.get(key)
        if expected is not None and any(d.value != expected for d in ds):
            find("value-mismatch", key, f"the log holds {expected!r}; given {sorted({d.value for d in ds})}")
        counts = [d.count for d in ds]
        if max(counts) > delivery_limit:
            find("past-limit", key, f"delivered with count {max(counts)}, the limit is {delivery_limit}")
        if any(b <= a for a, b in zip(counts, counts[1:])):
            find("count-not-increasing", key, f"delivery counts in time order: {counts}")
        done = [a for a in acks if a.kind in (ACCEPT, REJECT) and a.confirmed]
        if done:
            first = min(done, key=lambda a: a.count)
            later = [d for d in ds if d.count > first.count]
            if later:
                find("redelivered-after-ack", key,
                     f"{('?', 'ACCEPT', 'RELEASE', 'REJECT')[first.kind]} of delivery {first.count} by {first.member} "
                     f"confirmed, then delivered to {later[0].member} with count {later[0].count}")
        accepted = [a for a in acks if a.kind == ACCEPT and a.confirmed]
        if len({(a.member, a.count) for a in accepted}) > 1:
            find("acknowledged-twice", key, f"ACCEPT confirmed {len(accepted)} times")
        _check_locks(key, ds, acks, history.resets, windows, lock_s, find)
        r.figures["redelivered"] += len(ds) - 1
        kinds = {a.kind for a in acks}
        if REJECT in kinds:
            r.figures["rejected"] += 1
        if max(counts) >= delivery_limit and any(a.kind == RELEASE and a.count >= delivery_limit for a in acks):
            r.figures["archived by the delivery limit (released at the limit)"] += 1

    for p, (start, batches) in sorted(final.items()):
        end = max((last + 1 for _f, last, _s, _c in batches), default=start)
        states = {o: (s, c) for first, last, s, c in batches for o in range(max(first, start), last + 1)}
        for (part, o), _v in sorted(values.items()):
            if part != p or o < start:
                continue
            s = states.get(o)
            if o >= end or s is None:
                find("lost", (p, o), f"never acquired: the share-partition ends at {end} (start {start})")
            elif s[0] not in (ARCHIVED, ARCHIVING) and s[1] < delivery_limit:
                # (read as a broker loads it: a record written as held at the limit is archived,
                # `SharePartition.loaded`; a lock that runs out inside a fetch that takes nothing
                # else is not written again, so the file may still say so)
                find("lost", (p, o), f"not finished at the end: state {s[0]}, delivery count {s[1]} "
                                     f"(start {start}, end {end})")
    for p in log:
        if p not in final and log[p]:
            for o, _value in log[p]:
                find("lost", (p, o), "its share-partition has no state at the end")

    deleted = deleted or {}
    for key in values:
        acks = acks_of[key]
        finished_seen = any(a.kind in (ACCEPT, REJECT) for a in acks) or any(
            a.kind == RELEASE and a.count >= delivery_limit for a in acks)
        if not finished_seen:
            if key not in by_key and key[1] < deleted.get(key[0], -1):
                r.figures["deleted by the expiry fault before anyone got them"] += 1
            elif not any(f.partition == key[0] and f.offset == key[1] for f in r.findings):
                r.figures["finished with deliveries nobody logged (dropped responses, killed members)"] += 1
    r.figures["acknowledgements with unknown outcome"] = sum(1 for a in history.acks if not a.confirmed)
    r.figures["delivered"] = len(by_key)
    # (the brokers count every client's; this tells oncelog's part of them)
    r.figures["NOT_LEADER_OR_FOLLOWER answers to oncelog's members' ShareFetch"] = sum(
        counts.get(str(NOT_LEADER_OR_FOLLOWER), 0) for counts in history.fetch_errors.values())
    for member, since, until, others in starved_stretches(history):
        errors = history.fetch_errors.get(member)
        r.findings.append(Finding("starved", -1, -1, (
            f"{member} polled from {since:.2f} to {until:.2f} ({until - since:.1f} s) and got no record, while the "
            f"others were given {others}" + (f"; its ShareFetch answers' errors so far: {errors}" if errors else ""))))
    for member, since, until, n in spinning(history):
        r.findings.append(Finding("spinning", -1, -1, (
            f"{member} was answered NOT_LEADER_OR_FOLLOWER {n} times between {since:.2f} and {until:.2f}: "
            f"it asked again without backing off")))
    if dead_letters is not None:
        archiving = {(p, o) for p, (start, batches) in final.items() for first, last, st, _c in batches
                     if st == ARCHIVING for o in range(max(first, start), last + 1)}
        _check_dead_letters(r, values, by_key, acks_of, dead_letters, archiving, delivery_limit, deleted,
                            topic, group, find)
    return r


def spinning(history: History, most: int = SPIN_ANSWERS, window_s: float = SPIN_WINDOW_S
             ) -> list[tuple[str, float, float, int]]:
    """(member, begin, end, answers) of the first window of each member in which its ShareFetch
    were answered NOT_LEADER_OR_FOLLOWER more than `most` times within `window_s`."""
    out: list[tuple[str, float, float, int]] = []
    for member, changes in sorted(history.not_leader.items()):
        # the count at each poll's start (it is logged there when it changed)
        changes = sorted(changes)
        series: list[tuple[float, int]] = []
        count = k = 0
        for t in sorted(history.poll_times.get(member, ())):
            while k < len(changes) and changes[k][0] <= t:
                count, k = changes[k][1], k + 1
            series.append((t, count))
        j = 0
        for t, count in series:
            while series[j][0] < t - window_s:
                j += 1
            if count - series[j][1] > most:
                out.append((member, series[j][0], t, count - series[j][1]))
                break
    return out


def starved_stretches(history: History, min_s: float = STARVED_S, min_others: int = STARVED_OTHERS,
                      gap_s: float = POLL_GAP_S) -> list[tuple[str, float, float, int]]:
    """(member, begin, end, records given to the others meanwhile) of every stretch in which the
    member polled (no two polls more than `gap_s` apart) and got nothing, while the others were
    given at least `min_others` records, the first and the last of them at least `min_s` apart."""
    out: list[tuple[str, float, float, int]] = []
    got: dict[str, list[float]] = defaultdict(list)
    for d in history.deliveries:
        got[d.member].append(d.t)
    for member, polls in sorted(history.poll_times.items()):
        own = sorted(got.get(member, ()))
        others = sorted(d.t for d in history.deliveries if d.member != member)
        stretches: list[tuple[float, float]] = []
        begin = prev = -1.0
        i = 0
        for t in sorted(polls):
            fed = False
            while i < len(own) and own[i] <= t:   # the poll begun at `prev` returned records
                fed, i = True, i + 1
            if prev < 0 or fed or t - prev > gap_s:
                if prev >= 0:
                    stretches.append((begin, prev))
                begin = t
            prev = t
        if prev >= 0 and i >= len(own):
            stretches.append((begin, prev))
        for b, e in stretches:
            fed_others = [t for t in others if b <= t <= e]
            # judged from the first to the last record the others got: a stretch that goes on
            # after the group ran dry (the end of the run) is not one of records available
            if len(fed_others) >= min_others and fed_others[-1] - fed_others[0] >= min_s:
                out.append((member, fed_others[0], fed_others[-1], len(fed_others)))
    return out


def _check_dead_letters(r: ShareReport, values: dict[Key, str], by_key: dict[Key, list[Delivery]],
                        acks_of: dict[Key, list[Ack]], dead_letters: list[DeadLetterRecord], archiving: set[Key],
                        delivery_limit: int, deleted: dict[int, int], topic: str, group: str, find) -> None:
    """Exactly one dead-letter record per record that ended rejected or at the delivery limit."""
    dlq: dict[Key, list[DeadLetterRecord]] = defaultdict(list)
    for d in dead_letters:
        dlq[(d.partition, d.offset)].append(d)
    for key, ds in sorted(dlq.items()):
        if len(ds) > 1:
            find("dlq-duplicate", key, f"{len(ds)} dead-letter records: "
                 + ", ".join(f"dlq-{d.dlq_partition}@{d.dlq_offset} (count {d.delivery_count})" for d in ds))
        acks = acks_of.get(key, [])
        for d in ds:
            expected = values.get(key)
            if d.topic != topic or d.group != group:
                find("dlq-mismatch", key, f"headers name topic {d.topic!r}, group {d.group!r}")
            elif d.value is not None and expected is not None and d.value.decode(errors="replace") != expected:
                find("dlq-mismatch", key, f"value {d.value!r}, the log holds {expected!r}")
            elif d.value is None and expected is not None and key[1] >= deleted.get(key[0], -1):
                find("dlq-mismatch", key, "no value copied, though the log still holds the record")
            if any(a.kind == ACCEPT and a.confirmed for a in acks):
                find("dlq-unexpected", key, "its ACCEPT was confirmed")
            elif d.message == DLQ_REJECTED and not any(a.kind == REJECT and a.count == d.delivery_count
                                                      for a in acks):
                find("dlq-unexpected", key, f"rejected at delivery {d.delivery_count}, but no REJECT was sent then")
            elif d.message == DLQ_PAST_LIMIT and d.delivery_count < delivery_limit:
                find("dlq-unexpected", key, f"archived by the limit at delivery {d.delivery_count}, below "
                                            f"{delivery_limit}")
            elif d.message not in (DLQ_REJECTED, DLQ_PAST_LIMIT):
                find("dlq-mismatch", key, f"reason {d.message!r}")
        r.figures["dead-lettered: " + ("rejected" if ds[0].message == DLQ_REJECTED else "at the delivery limit")] += 1
    for key in sorted(values):
        if key in dlq:
            continue
        acks = acks_of.get(key, [])
        last = max((g.count for g in by_key.get(key, [])), default=0)
        accepted_last = any(a.kind == ACCEPT and a.count == last for a in acks)
        why = None
        if key in archiving:
            why = "still ARCHIVING at the end: its dead-letter record was never written"
        elif any(a.kind == REJECT and a.confirmed for a in acks):
            why = "its REJECT was confirmed"
        elif last >= delivery_limit and not accepted_last:
            why = f"its last delivery ({last}, the limit) was not accepted"
        if why is not None:
            find("dlq-missing", key, why)


def _check_locks(key: Key, ds: list[Delivery], acks: list[Ack], resets: dict[str, list[float]],
                 windows: list[tuple[float, float]], lock_s: float, find) -> None:
    for i, held in enumerate(ds):
        if held.client != "oncelog":
            continue
        valid_until = held.poll_t + lock_s - LOCK_MARGIN_S
        for other in ds[i + 1:]:
            if other.t >= valid_until or other.member == held.member and other.count == held.count:
                continue
            since = held.poll_t
            if any(a.member == held.member and a.count == held.count and a.t <= other.t for a in acks):
                continue   # the holder gave it back (or finished it) first
            if any(since <= t <= other.t for t in resets.get(held.member, ())):
                continue   # the holder's share session was dropped: what it held went back
            if any(b <= other.t and e + FAULT_SETTLE_S >= since for b, e in windows):
                continue   # a broker restarted, paused past its session, or the group moved
            find("held-twice", key, f"{held.member} got it (count {held.count}) in a poll begun at "
                                    f"{held.poll_t:.2f}, its lock valid until at least "
                                    f"{valid_until + LOCK_MARGIN_S:.2f}; {other.member} got it "
                                    f"(count {other.count}) at {other.t:.2f}")

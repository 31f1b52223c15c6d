"""History checker: after faults stop, compare what producers were told with what the log holds.

A history is what the workload recorded (every send, acknowledgement and error); the log is
every partition read from its start. Findings say which side is to blame:
"broker" when the log contradicts an acknowledgement (loss, another value at an acked offset),
"client" for fatal producer errors (and records never resolved), and "both" for duplicates,
reorderings and a record in the log that its producer reported failed and not written, which can
come from a client retrying without idempotence or from a broker failing to deduplicate.
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Event:
    """One thing a producer saw. kind: send | ack | error | fatal."""

    t: int                      # position in the history (monotonic per run)
    client: str                 # oncelog | librdkafka | kafka-python
    producer: str               # one producer instance
    kind: str
    value: bytes
    partition: int | None = None
    offset: int | None = None
    error: str | None = None
    possibly_written: bool | None = None   # an error's claim: False = "not in the log"; None = none


@dataclass
class Finding:
    kind: str                   # duplicate | restamped | lost | inconsistent | reorder | fatal | failed-but-written
    blame: str                  # broker | client | both
    partition: int | None
    value: bytes | None
    detail: str
    history: list[str] = field(default_factory=list)
    client: str | None = None   # whose value (or whose fatal error) it is
    protocol: str | None = None  # transactions: TV1 / TV2 of the transaction, "" for a reader's poll
    places: list[tuple[int, int]] = field(default_factory=list)  # a duplicate's (partition, offset)s

    def to_json(self) -> dict:
        d = asdict(self)
        d["value"] = self.value.decode("utf-8", "replace") if self.value is not None else None
        return d


@dataclass
class Report:
    findings: list[Finding]
    sent: int
    acked: int
    errors: int
    read: int

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def broker_ok(self) -> bool:
        """No finding the broker could have caused (a client's own fatal error is not one)."""
        return all(f.blame == "client" for f in self.findings)

    def counts(self) -> dict[str, int]:
        c: dict[str, int] = defaultdict(int)
        for f in self.findings:
            c[f.kind] += 1
        return dict(c)

    def to_json(self) -> dict:
        return {"ok": self.ok, "broker_ok": self.broker_ok, "sent": self.sent, "acked": self.acked,
                "errors": self.errors, "read": self.read, "counts": self.counts(),
                "findings": [f.to_json() for f in self.findings]}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)


def _fmt(e: Event) -> str:
    where = f" p{e.partition}" if e.partition is not None else ""
    at = f"@{e.offset}" if e.offset is not None else ""
    err = f" {e.error}" if e.error else ""
    return f"t={e.t} {e.client}/{e.producer} {e.kind} {e.value!r}{where}{at}{err}"


def check(history: Iterable[Event], log: dict[int, list[tuple[int, bytes]]],
          *, ordered_producers: set[str] | None = None, excerpt: int = 6) -> Report:
    """Check `history` against `log` (partition -> [(offset, value)] read from the log start).

    `ordered_producers`: producers that promise per-partition order (idempotent ones); by default
    every producer in the history. Order is judged by send order of acknowledged values.
    """
    events = sorted(history, key=lambda e: e.t)
    by_value: dict[bytes, list[Event]] = defaultdict(list)
    for e in events:
        by_value[e.value].append(e)

    def hist(value: bytes) -> list[str]:
        return [_fmt(e) for e in by_value.get(value, [])][:excerpt]

    findings: list[Finding] = []
    where: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    at: dict[tuple[int, int], bytes] = {}
    read = 0
    for p, recs in log.items():
        for off, val in recs:
            read += 1
            where[val].append((p, off))
            at[(p, off)] = val

    for val, places in where.items():
        if len(places) > 1:
            findings.append(Finding("duplicate", "both", places[0][0], val,
                                    f"one value at {len(places)} offsets: {places}", hist(val),
                                    places=list(places)))

    sent = acked = errors = 0
    send_t: dict[bytes, int] = {}
    acks: list[Event] = []
    fatal: dict[str, list[Event]] = {}
    for e in events:
        if e.kind == "send":
            sent += 1
            send_t.setdefault(e.value, e.t)
        elif e.kind == "ack":
            acked += 1
            acks.append(e)
        elif e.kind == "error":
            errors += 1
        elif e.kind == "fatal":
            errors += 1
            fatal.setdefault(e.producer, []).append(e)

    for prod, failed in fatal.items():
        first = failed[0]
        findings.append(Finding("fatal", "client", first.partition, first.value,
                                f"{first.client}/{prod}: fatal producer error {first.error}; "
                                f"{len(failed)} records failed with it",
                                [_fmt(e) for e in failed[:excerpt]], first.client))

    for e in acks:
        if e.value not in where:
            findings.append(Finding("lost", "broker", e.partition, e.value,
                                    f"acknowledged at p{e.partition}@{e.offset}, not in the log",
                                    hist(e.value)))
            continue
        if e.offset is None or e.partition is None:
            continue  # e.g. DUPLICATE_SEQUENCE_NUMBER: acked without an offset
        held = at.get((e.partition, e.offset))
        if held is not None and held != e.value:
            findings.append(Finding("inconsistent", "broker", e.partition, e.value,
                                    f"acknowledged p{e.partition}@{e.offset} holds {held!r}",
                                    hist(e.value) + hist(held)[:2]))

    # A producer that said a failed record is not in the log (oncelog's possibly_written=False)
    # must be right: an application would send it again and so write it twice.
    for e in events:
        if e.kind == "error" and e.possibly_written is False and e.value in where:
            findings.append(Finding("failed-but-written", "both", where[e.value][0][0], e.value,
                                    f"reported failed and not written ({e.error}), but in the log at "
                                    f"{where[e.value]}", hist(e.value)))

    # Order: for each producer and partition, values sent earlier sit at lower offsets.
    producers = {e.producer for e in events}
    ordered = producers if ordered_producers is None else ordered_producers
    owner = {e.value: e.producer for e in events if e.kind == "send"}
    per: dict[tuple[str, int], list[tuple[int, int, bytes]]] = defaultdict(list)
    for val, places in where.items():
        sender = owner.get(val)
        if sender is None or sender not in ordered or val not in send_t:
            continue
        p, off = min(places, key=lambda x: x[1])
        per[(sender, p)].append((off, send_t[val], val))
    for (prod, p), rows in per.items():
        rows.sort()
        best_t, best_val = -1, None
        for off, t, val in rows:
            if t < best_t:
                findings.append(Finding("reorder", "both", p, val,
                                        f"{prod}: {val!r} sent before {best_val!r} but stored after it"
                                        f" (p{p}@{off})",
                                        hist(val) + hist(best_val)[:3]))  # type: ignore[arg-type]  # set by then
            else:
                best_t, best_val = t, val
    client_of = {e.value: e.client for e in events if e.kind == "send"}
    for f in findings:
        if f.client is None and f.value is not None:
            f.client = client_of.get(f.value)
    return Report(findings, sent, acked, errors, read)


# confluentinc/librdkafka#4953 (maintainer's comment): an epoch bump of the idempotent producer
# re-sends what was in flight on other partitions, written or not, as new records
RESTAMP_REFERENCE = "a client bump of the producer epoch re-sends batches possibly written (librdkafka #4953)"


def reclassify_restamped(report: Report, identity: Callable[[list[tuple[int, int]]], Mapping]) -> None:
    """Duplicates that the client made, told apart from those a broker made: every copy in a batch
    of one producer id, each later copy under a higher epoch than the one before. A new epoch
    starts a new sequence space (KIP-360), so a broker cannot recognise records its producer sent
    again under it: the client re-sent them as new (a producer-wide epoch bump re-stamps what was
    in flight on every partition, written or not). Such a finding becomes `restamped`, the
    client's. `identity(places)`: (partition, offset) -> BatchIdentity of the batch holding it,
    for the places it could read (`batch_identity.batch_identities`); a copy it could not read
    keeps the finding as it was."""
    duplicates = [f for f in report.findings if f.kind == "duplicate"]
    if not duplicates:
        return
    found = identity(sorted({pl for f in duplicates for pl in f.places}))
    for f in duplicates:
        got = [found.get(pl) for pl in sorted(f.places, key=lambda x: x[1])]
        ids = [i for i in got if i is not None]
        if len(ids) < len(got) or len({i.producer_id for i in ids}) != 1:
            continue
        epochs = [i.producer_epoch for i in ids]
        if all(a < b for a, b in zip(epochs, epochs[1:])):
            f.kind, f.blame = "restamped", "client"
            f.detail += (f"; producer {ids[0].producer_id} wrote it under epochs {epochs} (sequences "
                         f"{[i.base_sequence for i in ids]} at batches {[i.base_offset for i in ids]}): "
                         f"{RESTAMP_REFERENCE}")

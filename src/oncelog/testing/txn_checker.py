"""Judges a run of `oncelog verify --workload transactions`: its history (`txn_history`) against
what the topics hold once the faults stopped, with Jepsen's Kafka anomaly classes
(`jepsen.tests.kafka`) and the promise of a consume-transform-produce copy.

The version order of a partition is what a read from its start returns: the output topic read
read_committed (markers and aborted records are not in it), an input topic as written. A value's
place in it is its index; polls and sends are judged by indexes, not offsets, since the offsets
of a transactional topic have gaps.

Jepsen's classes:
- `G1a` (aborted read): a record of a transaction that never committed is visible read_committed,
  in the final read or to a reader during the run.
- `lost-write`: a record of a committed transaction missing from the final read, which read past
  it. `unseen`: missing where the read could not reach (a partition whose last stable offset stayed
  below its end).
- `duplicate`: one record at more than one offset.
- `torn-transaction`: some records of a transaction visible, others missing (whatever its outcome:
  a transaction whose outcome is unknown must still be all or nothing).
- `inconsistent-offsets`: one offset seen holding different records (read_committed against
  read_uncommitted, a delivery report or a poll against the final read).
- `G0` (write cycle): transactions whose records follow each other in one partition in one order
  and in another partition in the other. Kafka does not isolate writes, so Jepsen allows it: it is
  reported, and does not fail a run (`ALLOWED`).
- `int-nonmonotonic-send` / `nonmonotonic-send`: a process's records to a partition stored in
  another order than sent, within one transaction / across its transactions.
- `int-nonmonotonic-poll` / `nonmonotonic-poll`, `int-poll-skip` / `poll-skip`: a consumer's
  records of a partition going backwards or skipping records of the version order, within one
  poll / from one poll to the next (an `assign` operation says where the next poll starts).

The copy's promise (Kafka's transactions system test): `duplicate-copy` (an input copied twice
into the committed output), `lost-input` (an input the group's committed offsets cover, never
copied), `copied-without-offsets` (an input they do not cover, in the committed output: its
transaction committed the record without its offset), `unknown-value` (an output record no send
made), `hanging-transaction` (read_committed never reached a partition's end), `aborts-missing`
(aborts were made but none is in the log: the run did not exercise what it claims).

Each finding names the client and transaction protocol (TV1/TV2) of the transaction whose
record it is, or of the consumer whose poll it is (protocol "" for readers).
"""
from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from oncelog.testing.checker import Finding
from oncelog.testing.txn_history import Op

Log = dict[int, list[tuple[int, bytes]]]    # partition -> [(offset, value)] in offset order

ALLOWED = frozenset({"G0"})
JEPSEN_CLASSES = ("G1a", "lost-write", "unseen", "duplicate", "torn-transaction", "inconsistent-offsets", "G0",
                  "int-nonmonotonic-send", "nonmonotonic-send", "int-nonmonotonic-poll", "nonmonotonic-poll",
                  "int-poll-skip", "poll-skip")


@dataclass
class TxnReport:
    findings: list[Finding]
    inputs: int
    committed_read: int       # output records read read_committed (markers and aborts skipped)
    uncommitted_read: int     # output records read read_uncommitted
    aborted_seen: int         # records of transactions that never committed, in the read_uncommitted output
    not_copied: int = 0       # inputs beyond the group's committed offsets when the run ended
    # "client protocol" -> transactions by outcome (ok, fail, info)
    transactions: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(f.kind in ALLOWED for f in self.findings)

    broker_ok = ok

    def counts(self) -> dict[str, int]:
        return dict(Counter(f.kind for f in self.findings))

    def by_client(self) -> dict[str, dict[str, int]]:
        """"client protocol" (or "client reader") -> anomalies by class; every client and protocol
        that ran a transaction is listed, with no anomaly if it had none."""
        out: dict[str, dict[str, int]] = {who: {} for who in self.transactions}
        for f in self.findings:
            kinds = out.setdefault(whose(f), {})
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        return out

    def to_json(self) -> dict:
        return {"ok": self.ok, "inputs": self.inputs, "committed_read": self.committed_read,
                "uncommitted_read": self.uncommitted_read, "aborted_seen": self.aborted_seen,
                "not_copied": self.not_copied, "transactions": self.transactions,
                "counts": self.counts(), "by_client": self.by_client(),
                "findings": [f.to_json() for f in self.findings[:200]]}


def whose(f: Finding) -> str:
    """"client protocol", "client reader" (a reader's poll), or the client alone ("-": none)."""
    if f.protocol is None:
        return f.client or "-"
    return f"{f.client or '-'} {f.protocol or 'reader'}"


def parse_output(value: bytes) -> tuple[bytes, str, int, bool]:
    """(input value, instance, transaction number, aborted on purpose) of a copied record."""
    source, instance, txn, tag = value.rsplit(b"|", 3)
    return source, instance.decode(), int(txn), tag == b"A"


def _about(op: Op) -> str:
    why = f" ({op.error})" if op.error else ""
    return f"{op.process} txn #{op.index}: {op.type}{why}, {len(op.sent)} records sent"


class _Checker:
    def __init__(self, ops: list[Op], committed: Log, uncommitted: Log, inputs: dict[str, Log], output: str,
                 stuck: set[int]) -> None:
        self.ops, self.committed, self.uncommitted, self.stuck = ops, committed, uncommitted, stuck
        self.output = output
        logs = {**inputs, output: committed}
        # the last offset read_committed returned per output partition: what a stuck read reached
        self.reached = {p: recs[-1][0] if recs else -1 for p, recs in committed.items()}
        self.findings: list[Finding] = []
        self.unseen: set[bytes] = set()     # committed records beyond where the final read reached
        self.sender: dict[bytes, Op] = {v: op for op in ops if op.f == "txn" for _p, v, _o in op.sent}
        # the version order of every topic: (partition, offset) -> (index, value)
        self.order: dict[str, dict[tuple[int, int], tuple[int, bytes]]] = {
            topic: {(p, off): (i, v) for p, recs in log.items() for i, (off, v) in enumerate(recs)}
            for topic, log in logs.items()}
        self.offsets = {topic: {p: [off for off, _v in recs] for p, recs in log.items()}
                        for topic, log in logs.items()}
        # where each output value is visible: [(partition, index, offset)]
        self.where: dict[bytes, list[tuple[int, int, int]]] = defaultdict(list)
        for p, recs in committed.items():
            for i, (off, v) in enumerate(recs):
                self.where[v].append((p, i, off))

    def add(self, kind: str, partition: int | None, value: bytes | None, detail: str, op: Op | None = None,
            history: list[str] | None = None, client: str | None = None, protocol: str | None = None) -> None:
        if op is not None:
            client = client or op.client
            protocol = op.protocol if protocol is None else protocol
            history = history or [_about(op)]
        self.findings.append(Finding(kind, "broker", partition, value, detail, history or [], client, protocol))

    # ------------------------------------------------------------------ the final reads

    def final_reads(self) -> None:
        raw = {(p, o): v for p, recs in self.uncommitted.items() for o, v in recs}
        for p, recs in self.committed.items():
            for off, v in recs:
                other = raw.get((p, off))
                if other is not None and other != v:
                    self.add("inconsistent-offsets", p, v, f"offset {off}: read_committed {v!r}, "
                             f"read_uncommitted {other!r}", self.sender.get(v))
        for v, places in self.where.items():
            op = self.sender.get(v)
            if op is None:
                self.add("unknown-value", places[0][0], v, f"offset {places[0][2]}: no transaction sent it")
                continue
            if len(places) > 1:
                self.add("duplicate", places[0][0], v, f"at {len(places)} offsets: "
                         f"{[(p, off) for p, _i, off in places]}", op)
            if op.type == "fail":
                self.add("G1a", places[0][0], v, f"offset {places[0][2]}: visible read_committed, but its "
                         "transaction never committed", op)
        for op in self.ops:
            if op.f != "txn":
                continue
            for p, v, off in op.sent:   # what the delivery reports said against what is stored
                if off is None:
                    continue
                held = raw.get((p, off))
                if held is not None and held != v:
                    self.add("inconsistent-offsets", p, v, f"delivered at offset {off}, which holds {held!r}", op)

    def beyond_read(self, p: int, off: int | None) -> bool:
        """Could the final read not reach this output record (its partition's read was stuck)?"""
        return p in self.stuck and (off is None or off > self.reached.get(p, -1))

    def visibility(self) -> None:
        for op in self.ops:
            if op.f != "txn" or not op.sent:
                continue
            visible = missing = 0
            for p, v, off in op.sent:
                if v in self.where:
                    visible += 1
                    continue
                beyond = self.beyond_read(p, off)
                missing += not beyond
                if op.type != "ok":
                    continue
                if beyond:
                    self.unseen.add(v)
                    self.add("unseen", p, v, "committed, beyond where read_committed could read", op)
                else:
                    self.add("lost-write", p, v, f"committed{'' if off is None else f' at offset {off}'}, "
                             "not in the read_committed output", op)
            if visible and missing:
                self.add("torn-transaction", op.sent[0][0], None, f"{visible} of its {len(op.sent)} records "
                         f"visible, {missing} missing", op)

    def write_cycles(self) -> None:
        """G0: cycles of write-write edges (a transaction's record right before another's)."""
        edges: dict[Op, set[Op]] = defaultdict(set)
        for recs in self.committed.values():
            prev: Op | None = None
            for _off, v in recs:
                op = self.sender.get(v)
                if op is None:
                    continue
                if prev is not None and op is not prev:
                    edges[prev].add(op)
                prev = op
        for component in _cycles(edges):
            members = sorted(component, key=lambda op: op.index)
            self.add("G0", None, None, f"write cycle among {len(members)} transactions (allowed: Kafka does "
                     "not isolate writes)", history=[_about(op) for op in members[:4]],
                     client=",".join(sorted({op.client for op in members})),
                     protocol=",".join(sorted({op.protocol for op in members})))

    # ------------------------------------------------------------------ per process

    def sends(self) -> None:
        last: dict[tuple[str, int], int] = {}
        for op in self.ops:
            if op.f != "txn":
                continue
            mine: dict[int, list[int]] = defaultdict(list)
            for p, v, _off in op.sent:
                places = self.where.get(v)
                if places:
                    mine[p].append(places[0][1])
            for p, idx in mine.items():
                if any(b < a for a, b in zip(idx, idx[1:])):
                    self.add("int-nonmonotonic-send", p, None, f"its records stored at indexes {idx[:8]}, "
                             "not in the order sent", op)
                before = last.get((op.process, p))
                if before is not None and idx[0] < before:
                    self.add("nonmonotonic-send", p, None, f"its first record stored at index {idx[0]}, before "
                             f"index {before} of an earlier transaction of {op.process}", op)
                last[(op.process, p)] = max(idx + [before if before is not None else -1])

    def polls(self) -> None:
        expected: dict[tuple[str, str, int], int] = {}   # (process, topic, partition) -> next index
        for op in self.ops:
            order = self.order.get(op.topic)
            if order is None:
                continue
            if op.f == "assign":
                for key in [k for k in expected if k[:2] == (op.process, op.topic)]:
                    del expected[key]
                for p, pos in (op.positions or {}).items():
                    expected[(op.process, op.topic, p)] = bisect.bisect_left(self.offsets[op.topic].get(p, []), pos)
                continue
            seen: dict[int, list[int]] = defaultdict(list)
            for p, off, v in op.polled:
                at = order.get((p, off))
                if at is None or at[1] != v:
                    self._unordered_read(op, p, off, v, at)
                    continue
                seen[p].append(at[0])
            for p, idx in seen.items():
                for a, b in zip(idx, idx[1:]):
                    if b <= a:
                        self.add("int-nonmonotonic-poll", p, None, f"one poll went from index {a} to {b}", op)
                    elif b > a + 1:
                        self.add("int-poll-skip", p, None, f"one poll went from index {a} to {b}", op)
                key = (op.process, op.topic, p)
                want = expected.get(key)
                if want is not None and idx[0] < want:
                    self.add("nonmonotonic-poll", p, None, f"poll began at index {idx[0]}, after one that "
                             f"ended before index {want}", op)
                elif want is not None and idx[0] > want:
                    self.add("poll-skip", p, None, f"poll began at index {idx[0]}, skipping from index {want}",
                             op)
                expected[key] = idx[-1] + 1

    def _unordered_read(self, op: Op, p: int, off: int, v: bytes, at: tuple[int, bytes] | None) -> None:
        """A polled record that is not where the final read has it."""
        writer = self.sender.get(v)
        if writer is not None and writer.type == "fail":
            self.add("G1a", p, v, f"offset {off}: returned to {op.process} read_committed, but its transaction "
                     "never committed", writer, history=[_about(writer), f"read by {op.process} #{op.index}"])
        elif at is not None or not (op.topic == self.output and self.beyond_read(p, off)):
            self.add("inconsistent-offsets", p, v, f"offset {off}: {op.process} read {v!r}, the final read "
                     f"{'nothing' if at is None else repr(at[1])}", op)


def _cycles(edges: dict[Op, set[Op]]) -> list[list[Op]]:
    """Strongly connected components with more than one member (Tarjan's, without recursion)."""
    index: dict[Op, int] = {}
    low: dict[Op, int] = {}
    stack: list[Op] = []
    on_stack: set[Op] = set()
    out: list[list[Op]] = []
    for root in list(edges):
        if root in index:
            continue
        work = [(root, iter(edges.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges.get(child, ()))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member is node:
                            break
                    if len(component) > 1:
                        out.append(component)
    return out


def check_transactions(history: Iterable[Op], committed: Log, uncommitted: Log, covered: dict[bytes, bool], *,
                       inputs: dict[str, Log] | None = None, output: str = "verify-out",
                       stuck: Iterable[int] = (), expect_aborts: bool = True) -> TxnReport:
    """`history`: what the processes did; `committed` / `uncommitted`: the output topic read
    read_committed / read_uncommitted from its start; `covered`: every input value, and whether
    the group's final committed offsets are past it (one they do not cover was not copied when
    the run ended: counted, not lost); `inputs`: each input topic as read back, the version order
    the copy loops' polls are judged against; `stuck`: output partitions read_committed did not
    read to their end; `expect_aborts`: records that transactions which did not commit wrote (a delivery report said
    so) must be in the read_uncommitted output."""
    ops = sorted(history, key=lambda op: op.index)
    stuck = set(stuck)
    c = _Checker(ops, committed, uncommitted, inputs or {}, output, stuck)
    c.final_reads()
    c.visibility()
    c.write_cycles()
    c.sends()
    c.polls()
    for p in sorted(stuck):
        c.add("hanging-transaction", p, None, "read_committed never reached the end of the partition: its last "
              "stable offset stays below the high watermark")
    not_copied = _copies(c, covered)
    aborted_seen = sum(1 for recs in uncommitted.values() for _o, v in recs
                       if (op := c.sender.get(v)) is not None and op.type == "fail")
    written = any(op.type == "fail" and any(off is not None for _p, _v, off in op.sent) for op in ops if op.f == "txn")
    if expect_aborts and written and not aborted_seen:
        c.add("aborts-missing", None, None, "transactions were aborted but no aborted record is in the log")
    transactions: dict[str, Counter] = defaultdict(Counter)
    for op in ops:
        if op.f == "txn":
            transactions[f"{op.client} {op.protocol}"][op.type] += 1
    return TxnReport(c.findings, len(covered), sum(map(len, committed.values())),
                     sum(map(len, uncommitted.values())), aborted_seen, not_copied,
                     {who: dict(n) for who, n in sorted(transactions.items())})


def _copies(c: _Checker, covered: dict[bytes, bool]) -> int:
    """The copy's promise: every covered input exactly once in the committed output, none that is
    not covered; returns how many inputs were not copied (and not covered)."""
    copies: dict[bytes, set[bytes]] = defaultdict(set)
    for v in c.where:
        if v not in c.sender:
            continue   # reported as an unknown value
        source = parse_output(v)[0]
        if source not in covered:
            c.add("unknown-value", c.where[v][0][0], v, "no such input", c.sender[v])
            continue
        copies[source].add(v)
    for source, outs in copies.items():
        writers = [c.sender[v] for v in sorted(outs)]
        if len(outs) > 1:
            c.add("duplicate-copy", c.where[min(outs)][0][0], source, f"copied {len(outs)} times", writers[0],
                  history=[_about(op) for op in writers[:4]])
        if not covered[source]:
            c.add("copied-without-offsets", c.where[min(outs)][0][0], source, "in the committed output, but "
                  "the group's committed offset is not past it", writers[0])
    protocols: dict[str, str] = {}   # the copy loops of a client: which protocols they used
    for op in c.ops:
        if op.f == "txn" and op.protocol not in protocols.get(op.client, "").split(","):
            protocols[op.client] = ",".join(filter(None, (protocols.get(op.client), op.protocol)))
    not_copied = 0
    unseen = {parse_output(v)[0] for v in c.unseen}   # copied, where the read could not reach
    for source in sorted(set(covered) - set(copies) - unseen):
        if covered[source]:
            client = source.rsplit(b"-", 1)[0].decode("utf-8", "replace")   # inputs are <client>-<i>
            c.add("lost-input", None, source, "never in the committed output, although the group's "
                  "committed offset is past it", client=client, protocol=protocols.get(client))
        else:
            not_copied += 1
    return not_copied

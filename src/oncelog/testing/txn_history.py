"""The history `oncelog verify --workload transactions` records, shaped after Jepsen's Kafka workload
(`jepsen.tests.kafka`: send and poll micro-operations with per-partition offsets).

Each process (a copy loop instance or a reader: one thread each) appends operations in the order
it performs them; `index` orders operations across processes by when they began.

- `txn`: one transaction of a copy loop. `polled`: what its consumer returned for it, in order,
  as (partition, offset, value) of the input topic; `sent`: what it produced, in send order, as
  [partition, value, offset] with the offset of the delivery report (None until one came);
  `type`: `ok` (committed), `fail` (never committed: aborted, or given up before a commit was
  asked) or `info` (a commit was asked and its outcome is unknown); `protocol`: the transaction
  protocol its producer used (TV1 or TV2).
- `poll`: what a reader's consumer returned, in order, as (partition, offset, value).
- `assign`: a consumer was positioned: `positions` says where it reads next per partition, or
  None when it cannot be known (a group rebalance), so that the next poll may start anywhere.

A copy loop run in its own process (the pause fault stops it with SIGSTOP) keeps its own history;
`merge` adds its operations to the run's, ordered with the others by when they began (`t`, the
machine's monotonic clock, which every process shares).

Values are unique per send, so a value names the transaction that sent it. Recording is cheap:
tuples appended to lists by the thread that owns them; `dump` and `load` write and read JSON
lines, for a post-mortem and to check a history again.
"""
from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

Record = tuple[int, int, bytes]       # (partition, offset, value) as a consumer returned it


@dataclass(eq=False, slots=True)
class Op:
    index: int
    process: str                      # one thread: a copy loop instance, a reader
    client: str                       # oncelog | librdkafka
    f: str                            # txn | poll | assign
    topic: str = ""                   # what polled and positions refer to
    type: str = "ok"                  # txn: ok | fail | info
    protocol: str = ""                # txn: TV1 | TV2
    polled: list[Record] = field(default_factory=list)
    sent: list[list] = field(default_factory=list)  # [partition, value, offset or None]
    positions: dict[int, int] | None = None         # assign: next offset per partition, None = unknown
    error: str = ""                   # why a transaction did not commit, or its outcome is unknown
    t: int = 0                        # time.monotonic_ns() when it began (orders merged histories)

    def send(self, partition: int, value: bytes) -> list:
        """Records a send; the returned entry takes the offset when the delivery report comes."""
        entry = [partition, value, None]
        self.sent.append(entry)
        return entry

    def to_json(self) -> dict:
        d: dict = {"index": self.index, "process": self.process, "client": self.client, "f": self.f, "t": self.t}
        if self.topic:
            d["topic"] = self.topic
        if self.f == "txn":
            d.update(type=self.type, protocol=self.protocol,
                     sent=[[p, v.decode("latin-1"), o] for p, v, o in self.sent])
            if self.error:
                d["error"] = self.error
        if self.polled:
            d["polled"] = [[p, o, v.decode("latin-1")] for p, o, v in self.polled]
        if self.f == "assign":
            d["positions"] = None if self.positions is None else sorted(self.positions.items())
        return d

    @classmethod
    def from_json(cls, d: dict) -> Op:
        positions = d.get("positions")
        return cls(d["index"], d["process"], d["client"], d["f"], d.get("topic", ""), d.get("type", "ok"),
                   d.get("protocol", ""), [(p, o, v.encode("latin-1")) for p, o, v in d.get("polled", [])],
                   [[p, v.encode("latin-1"), o] for p, v, o in d.get("sent", [])],
                   None if positions is None else {int(p): o for p, o in positions}, d.get("error", ""),
                   d.get("t", 0))


class History:
    """Operations of every process of one run, in the order they began."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._index = itertools.count()   # next() is atomic under the GIL: threads share it

    def _op(self, process: str, client: str, f: str, **fields) -> Op:
        op = Op(next(self._index), process, client, f, t=time.monotonic_ns(), **fields)
        self.ops.append(op)
        return op

    def merge(self, ops: Iterable[Op]) -> None:
        """Operations recorded by another process (after its end): every operation is numbered
        again in the order of when it began."""
        self.ops.extend(ops)
        self.ops.sort(key=lambda op: (op.t, op.index))
        for i, op in enumerate(self.ops):
            op.index = i
        self._index = itertools.count(len(self.ops))

    def txn(self, process: str, client: str, topic: str, polled: list[Record], protocol: str) -> Op:
        """A transaction begins; it is `fail` until the loop asks for its commit."""
        return self._op(process, client, "txn", topic=topic, type="fail", protocol=protocol, polled=polled)

    def poll(self, process: str, client: str, topic: str, polled: list[Record]) -> Op:
        return self._op(process, client, "poll", topic=topic, polled=polled)

    def assign(self, process: str, client: str, topic: str, positions: dict[int, int] | None) -> Op:
        return self._op(process, client, "assign", topic=topic,
                        positions=None if positions is None else dict(positions))

    def __iter__(self) -> Iterator[Op]:
        return iter(sorted(self.ops, key=lambda op: op.index))

    def dump(self, path: Path) -> None:
        with open(path, "w") as f:
            for op in self:
                f.write(json.dumps(op.to_json()) + "\n")


def load(path: Path) -> list[Op]:
    with open(path) as f:
        return [Op.from_json(json.loads(line)) for line in f if line.strip()]


def transactions(ops: Iterable[Op]) -> Iterator[Op]:
    return (op for op in ops if op.f == "txn")

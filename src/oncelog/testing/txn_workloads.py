"""The transactional workload of `oncelog verify --workload transactions`: consume-transform-produce
copy loops, as Kafka's transactions system test and Jepsen's Kafka workload run them.

Per client, an input topic is filled with unique values before the faults start; copy loops
(each with its own `transactional.id`) read it `read_committed`, and for every poll run one
transaction: the transformed records to the output topic, the consumed positions with
`send_offsets_to_transaction` (the client's group), commit. Some transactions are aborted on
purpose after producing; their records carry the tag `A` so the checker can tell an aborted read.
Once per client a second instance of a running loop is started with the same transactional id
(a zombie's successor): the first must be fenced and stop, the second goes on. An abortable error
aborts and rewinds the consumer to the group's committed offsets; a fatal one replaces the
producer (same id, a new epoch) and rewinds. The loops of a client are members of one consumer
group (subscribe; KIP-447 group metadata with the offsets): librdkafka's with the classic
protocol, oncelog's with KIP-848's (`group.protocol=consumer`), so a stale member's offsets are
fenced by its member epoch.

Every other loop, the zombie's first among them, pipelines: one record per Produce request
(librdkafka's `batch.num.messages=1`, oncelog's `batch.size=1`) and `linger.ms=0`, so that up to
five requests per partition are in flight on a connection, the first of each transaction and
partition waiting for the leader's KIP-890 verification (a round trip to another broker when the
coordinator is there). Those loops are slower; the zombie among them is still copying when its
successor starts.

An output value is `<input value>|<instance>|<transaction number>|<C or A>`.

Everything is recorded in a `txn_history.History` for the checker: each transaction with what
its consumer returned for it, what it sent (with the delivery reports' offsets) and its outcome,
each repositioning of a consumer, and the polls of a reader per client that follows the output
topic read_committed while the loops run (Jepsen's poll operations over transactional writes).

librdkafka's transactional calls are bounded here (`bounded`): from librdkafka 2.10 on, one can
block past its own timeout, and a loop that waited would hold its partitions until the run ends
(see `WEDGE_GRACE_S`).

One concern in one module, over 600 lines on purpose: the one workload, its clients and loops.
"""
from __future__ import annotations

import random
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from oncelog.testing.txn_history import History
from oncelog.testing.workloads import retried

ABORT_PROBABILITY = 0.1
# records per transaction: at least 50, and about 400 transactions per client in a long run (each
# costs a few round trips and fsyncs, which under faults bound the rate, not the records)
MIN_RECORDS_PER_TXN = 50
TXNS_PER_CLIENT = 400


def output_value(value: bytes, instance: str, txn: int, aborting: bool) -> bytes:
    return b"%s|%s|%d|%s" % (value, instance.encode(), txn, b"A" if aborting else b"C")


@dataclass
class TxnWorkload:
    bootstrap: str
    client: str
    in_topic: str
    out_topic: str
    partitions: int
    records: int
    loops: int = 2
    seed: int = 0
    gate: threading.Event | None = None
    timeout_s: float = 180
    zombie_after_s: float = 3.0
    rate: float | None = None                    # records/s over all loops; None = as fast as they go
    security: dict = field(default_factory=dict)  # client settings (librdkafka's names) besides bootstrap.servers
    history: History = field(default_factory=History)  # shared by the workloads of one run
    transaction_timeout_ms: int = 30000
    # copy loops of this client run in their own process, which the pause fault stops with SIGSTOP
    # in the middle of a transaction (`testing.txn_child`); they join the group like the others
    pausable: int = 0

    @property
    def per_txn(self) -> int:
        return max(MIN_RECORDS_PER_TXN, self.records // TXNS_PER_CLIENT)
    stats: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    notes: list = field(default_factory=list)
    children: list = field(default_factory=list)      # the pausable loops' processes, once running (`pausable`)
    on_txn: Any = None   # called with True when a transaction begins, False when it ended (a child's)
    lock: Any = field(default_factory=threading.Lock, repr=False)   # over stats, from the loops' threads

    def client_config(self) -> dict:
        """Where and how clients connect (librdkafka's names, which oncelog's client takes too)."""
        return {"bootstrap.servers": self.bootstrap, **self.security}

    @property
    def group(self) -> str:
        return f"verify-txn-{self.client}"

    @property
    def producer(self) -> str:
        return f"txn-{self.client}"

    def values(self) -> list[bytes]:
        return [f"{self.client}-{i}".encode() for i in range(self.records)]

    def fill(self) -> dict[int, int]:
        """Writes the input (idempotent, not transactional); returns partition -> end offset."""
        from confluent_kafka import Producer
        p = Producer({**self.client_config(), "enable.idempotence": True, "linger.ms": 20,
                      "log_level": 3})
        for i, v in enumerate(self.values()):
            while True:
                try:
                    p.produce(self.in_topic, v, key=v, partition=i % self.partitions)
                    break
                except BufferError:
                    p.poll(0.1)
        if p.flush(120):
            raise RuntimeError(f"filling {self.in_topic}: records left unsent")
        counts = Counter(i % self.partitions for i in range(self.records))
        return {q: counts[q] for q in range(self.partitions)}

    def run(self, ends: dict[int, int]) -> None:
        self.ends = ends
        self.started = time.monotonic()
        self.done = threading.Event()
        rng = random.Random(self.seed)
        loop_cls = OncelogLoop if self.client == "oncelog" else LibrdkafkaLoop
        reader = (OncelogReader if self.client == "oncelog" else LibrdkafkaReader)(self).start()
        children = []
        if self.pausable:
            from oncelog.testing.txn_child import PausableLoop
            for k in range(self.pausable):
                children.append(PausableLoop(self, f"{self.producer}-p{k}", self.seed * 10 + k).start())
                self.children.append(children[-1])   # (a list the run shares with the fault runner)
        running: list[CopyLoop] = []
        for k in range(self.loops):
            mine = [q for q in range(self.partitions) if q % self.loops == k]
            running.append(loop_cls(self, f"{self.producer}-{k}", mine, random.Random(rng.random()),
                                    pipelined=k % 2 == 0).start())
        deadline = time.monotonic() + self.timeout_s
        zombie_at = time.monotonic() + self.zombie_after_s
        zombied = False
        while time.monotonic() < deadline:
            # the zombie's loop pipelines: its successor starts once it has committed (or a minute
            # late), or a loaded run may zombie it before its first commit, the group may give its
            # partitions to the other loop, and no pipelined transaction ever commits
            if not zombied and time.monotonic() >= zombie_at and (
                    running[0].commits > 0 or time.monotonic() >= zombie_at + 60):
                old = running[0]
                old.superseded = True
                running.append(loop_cls(self, old.tid, old.partitions, random.Random(rng.random()),
                                        generation=old.generation + 1, pipelined=old.pipelined).start())
                self.stats["zombies started"] += 1
                zombied = True
            if self._finished():
                break
            time.sleep(1.0)
        else:
            self.notes.append(f"{self.client}: input not fully copied within {self.timeout_s:.0f}s")
        self.done.set()
        for child in children:
            child.stop()
        for name, thread in [(loop.instance, loop.thread) for loop in running] + [(reader.instance, reader.thread)]:
            thread.join(60)
            if thread.is_alive():
                self.notes.append(f"{self.client}: {name} did not stop")

    def _finished(self) -> bool:
        got = self.committed_offsets()
        return got is not None and all(got[q] >= self.ends[q] for q in got)

    def committed_offsets(self) -> dict[int, int] | None:
        """The group's committed offsets (stable ones: require_stable), None if not answered."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition
        c = Consumer({**self.client_config(), "group.id": self.group, "log_level": 3,
                      "enable.auto.commit": False, "isolation.level": "read_committed"})
        try:
            got = c.committed([TopicPartition(self.in_topic, q) for q in range(self.partitions)], timeout=10)
            return {tp.partition: max(tp.offset, 0) for tp in got}
        except KafkaException:
            return None
        finally:
            c.close()

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.stats[what] += n


# librdkafka (2.10 on, 2.16 here) drops a broker that a Metadata answer no longer lists (a broker
# down past the controller's session timeout) and all of them when every broker is down
# (re-bootstrap), but keeps a dropped one as the cached group coordinator: send_offsets_to_
# transaction's TxnOffsetCommit then waits for that broker to come up, which it never does, is
# looked up again only when some other broker's connection changes state, and its timeout is never
# checked (librdkafka issues #5511 and #5456). Under kills the call blocks for minutes or for good,
# the loop's partitions stay assigned to its silent consumer and the run ends with inputs not
# copied. An application bounds the call itself: a call still running this long past its own
# timeout is given up, its producer abandoned (`_ABANDONED`) and replaced by a new one with the
# same transactional.id, whose InitProducerId fences it and aborts its open transaction.
WEDGE_GRACE_S = 10.0
ABANDONED = "producers abandoned in a call past its timeout (librdkafka #5511, #5456)"   # a stats key
# stats keys: a consumer whose position moved without the loop asking (librdkafka's offset reset
# after a Fetch error, auto.offset.reset=earliest) re-reads what its group committed: the checker
# then finds nonmonotonic-poll and duplicate-copy with no assign before them, and this says why
POSITION_RESET = "consumer positions reset by the client (auto.offset.reset after a fetch error)"
REWIND_REFUSED = "rewinds refused: committed offsets answered with an error"
_ABANDONED: list = []   # clients left inside a call: never destroyed while it may still return


class Wedged(Exception):
    """A client call ran past its own timeout by more than WEDGE_GRACE_S."""


def bounded(fn, timeout_s: float):
    """fn() on a thread of its own: its result or its exception, or Wedged once `timeout_s` has
    passed with the call still running (it goes on, on that thread)."""
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e
    t = threading.Thread(target=call, name="client-call", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise Wedged(f"still running after {timeout_s:.0f}s")
    if "error" in box:
        raise box["error"]
    return box.get("result")


class Fenced(Exception):
    """This instance's transactional id was taken over by a newer instance."""


class Fatal(Exception):
    """The producer cannot go on: replace it."""


class Abortable(Exception):
    """The transaction must be aborted."""


class Retriable(Exception):
    """The call may be made again."""


class CopyLoop:
    consumer: Any = None
    producer: Any = None
    polled_metadata: Any = None
    api_timeout_s = 30.0   # the timeout of each transactional call
    def __init__(self, w: TxnWorkload, tid: str, partitions: list[int], rng: random.Random,
                 generation: int = 1, pipelined: bool = False) -> None:
        self.w, self.tid, self.partitions, self.rng = w, tid, partitions, rng
        self.generation = generation
        self.pipelined = pipelined  # one record per Produce request, several in flight
        self.instance = f"{tid}.{generation}"
        self.superseded = False
        self.next_probe = 0.0   # a zombie's next probe of its producer (_probe)
        self.txn = 0
        self.commits = 0   # transactions this loop committed (the zombie waits for the first)
        self.thread = threading.Thread(target=self._guarded, name=f"copy-{self.instance}", daemon=True)

    def start(self) -> CopyLoop:
        self.thread.start()
        return self

    def _guarded(self) -> None:
        try:
            self.run()
        except Exception as e:  # noqa: BLE001 - a crashed loop is reported, the others go on
            self.w.notes.append(f"HARNESS: copy loop {self.instance} crashed: {type(e).__name__}: {e}"[:200]
                                + " " + "".join(traceback.format_tb(e.__traceback__)[-3:])[-600:])

    # each client: open(), poll() -> [(partition, offset, value)], begin(), produce(), send_offsets(),
    # commit(), abort(), rewind(), close(); errors raised as the classes above
    def run(self) -> None:
        w = self.w
        if not self.reopen(first=True):
            return
        try:
            while not w.done.is_set():
                if w.gate is not None and not w.gate.is_set():
                    w.gate.wait(0.2)
                    continue
                try:
                    self.one()
                except Fenced:
                    if self.superseded:
                        w.count("zombies fenced")
                        return
                    w.count("fenced (no successor): producer replaced")
                    if not self.reopen():
                        return
                except Fatal as e:
                    w.errors[f"fatal: {e}"[:120]] += 1
                    if self.superseded:
                        # a zombie does not come back: a new producer under its id would fence
                        # its successor (librdkafka's wedged calls end a zombie this way before
                        # it hears that it was fenced)
                        w.count("zombies stopped by a fatal error")
                        return
                    w.count("producers replaced after a fatal error")
                    if not self.reopen():
                        return
                except Exception as e:  # noqa: BLE001 - a client that raised what it should not: a finding
                    frames = [f for f in traceback.extract_tb(e.__traceback__) if "/oncelog/" in f.filename
                              and "/testing/" not in f.filename] or traceback.extract_tb(e.__traceback__)
                    where = frames[-1]
                    w.errors[f"unexpected {type(e).__name__}: {str(e)[:60]} at {where.filename.rsplit('/', 2)[-1]}:"
                             f"{where.lineno} ({where.line})"[:200]] += 1
                    w.count("loops restarted after an unexpected client exception")
                    if not self.reopen():
                        return
        finally:
            self.close()

    def one(self) -> None:
        w = self.w
        if w.rate and w.stats["records copied"] > w.rate * (time.monotonic() - w.started):
            time.sleep(0.05)  # paced, so that the faults meet many transactions
            return
        records = self.poll()
        if not records:
            if self.superseded:
                self._probe()
            return
        # the group metadata its offsets go with is the one these records were polled under: a
        # member fenced (and rejoined) since, a paused client say, must not commit them with its
        # new epoch (the coordinator refuses the old one unless it still owns the partitions)
        self.polled_metadata = self.consumer.consumer_group_metadata()
        self.txn += 1
        aborting = self.rng.random() < ABORT_PROBABILITY
        # `fail` until the commit is asked for: a transaction never committed by its producer
        # must not be visible, whatever became of its abort
        op = w.history.txn(self.instance, w.client, w.in_topic, records, self.transaction_protocol())
        if w.on_txn is not None:
            w.on_txn(True)
        try:
            self._one(op, records, aborting)
        finally:
            if w.on_txn is not None:
                w.on_txn(False)

    def _probe(self) -> None:
        """A zombie with nothing to copy (the group gave its partitions to its successor, or
        they are all copied) still acts as the producer it was, as a zombie that wakes up does:
        it opens a transaction and sends its partitions' offsets, which the coordinator must
        refuse as fenced. The transaction is then aborted, so that even a zombie that is not
        fenced changes nothing, and the count of zombies fenced says so."""
        now = time.monotonic()
        if now < self.next_probe:
            return
        self.next_probe = now + 1.0
        self.begin()
        try:
            self.send_offsets(self.committed())
        except Abortable:
            pass
        self.abort()

    def _one(self, op, records, aborting: bool) -> None:
        w = self.w
        try:
            self.begin()
            for q, _offset, value in records:
                out = output_value(value, self.instance, self.txn, aborting)
                self.produce(q, out, op.send(q, out))
            positions: dict[int, int] = {}
            for q, offset, _v in records:
                positions[q] = max(positions.get(q, 0), offset + 1)
            self.send_offsets(positions)
            if aborting:
                self.flush()   # the records reach the log before the abort: read_uncommitted sees them
                self.abort()
                w.count("transactions aborted on purpose")
                self.rewind()
                return
            op.type = "info"
            self.commit()
            op.type = "ok"
            w.count("transactions committed")
            self.commits += 1
            if self.pipelined:
                w.count("transactions committed by pipelining loops")
            w.count("records copied", len(records))
        except Abortable as e:
            # a commit that failed abortably did not commit (once the abort went through); what
            # a fatal error interrupted after the commit was asked is unknown: it stays `info`
            op.error = f"abortable: {e}"[:120]
            w.errors[op.error] += 1
            try:
                self.abort()
            except Abortable as again:
                raise Fatal(f"abort failed: {again}") from None
            op.type = "fail"
            w.count("transactions aborted after an abortable error")
            self.rewind()
        except Exception as e:
            op.error = f"{type(e).__name__}: {e}"[:120]
            raise

    def reopen(self, first: bool = False) -> bool:
        """Consumer and producer (re)opened, as an application retries its start while the
        brokers are down; False if the run ended first."""
        while not self.w.done.is_set():
            if not first:
                self.close()
            first = False
            try:
                self.open()
                return True
            except (Fenced, Fatal, Abortable, Exception) as e:  # noqa: BLE001 - brokers down, or a client finding
                self.w.errors[f"start failed: {type(e).__name__}: {e}"[:120]] += 1
                time.sleep(0.5)
        return False

    def open(self) -> None:
        self.open_consumer()
        self.open_producer()
        self.rewind()

    def close(self) -> None:
        self.close_producer()
        self.close_consumer()

    def committed(self) -> dict[int, int]:
        from confluent_kafka import Consumer, KafkaException, TopicPartition
        w = self.w
        c = Consumer({**w.client_config(), "group.id": w.group, "log_level": 3,
                      "enable.auto.commit": False, "isolation.level": "read_committed"})
        try:
            got = retried(lambda: c.committed([TopicPartition(w.in_topic, q) for q in self.partitions], timeout=10),
                          KafkaException, 60, 0.2)
            return {tp.partition: max(tp.offset, 0) for tp in got}
        finally:
            c.close()

    def positioned(self, positions: dict[int, int] | None) -> None:
        """The consumer reads next at `positions` (None: where, the client decides)."""
        self.w.history.assign(self.instance, self.w.client, self.w.in_topic, positions)

    def transaction_protocol(self) -> str:
        """TV1 or TV2: the transaction protocol the producer uses now (librdkafka: TV1 only)."""
        return "TV1"

    def close_consumer(self) -> None:
        _close_quietly(self.consumer)
        self.consumer = None

    # subclasses
    def open_consumer(self) -> None: ...
    def open_producer(self) -> None: ...
    def close_producer(self) -> None: ...
    def poll(self) -> list[tuple[int, int, bytes]]:
        raise NotImplementedError
    def begin(self) -> None: ...
    def produce(self, partition: int, value: bytes, sent: list) -> None:
        """Sends; the delivery report puts the record's offset in sent[2]."""
    def flush(self) -> None: ...
    def rewind(self) -> None: ...
    def _call(self, fn, attempts: int = 10):
        """fn(), retried as the client's errors allow; its errors as Fenced, Abortable, Fatal."""
        raise NotImplementedError
    def _offsets(self, positions: dict[int, int]) -> Any:
        """The consumed positions (partition of the input topic -> next offset) as the client takes them."""
        raise NotImplementedError

    # the transaction's end, the same calls in both clients
    def send_offsets(self, positions: dict[int, int]) -> None:
        offsets = self._offsets(positions)
        # the group metadata of the poll that returned the records (`copy_one`); the consumer's
        # current one for offsets sent outside a copy (a test driving the calls itself)
        metadata = self.polled_metadata if self.polled_metadata is not None else self.consumer.consumer_group_metadata()
        self._call(lambda: self.producer.send_offsets_to_transaction(offsets, metadata, self.api_timeout_s))

    def commit(self) -> None:
        self._call(lambda: self.producer.commit_transaction(self.api_timeout_s))

    def abort(self) -> None:
        self._call(lambda: self.producer.abort_transaction(self.api_timeout_s))


class LibrdkafkaLoop(CopyLoop):
    def open_consumer(self) -> None:
        from confluent_kafka import Consumer
        w = self.w
        # warnings through `_ConsumerLog`: librdkafka reports a reset of a fetch position (what
        # auto.offset.reset does after OFFSET_OUT_OF_RANGE) only as a log line, never to the app
        self.consumer = Consumer({**w.client_config(), "group.id": w.group, "log_level": 4,
                                  "logger": _ConsumerLog(self),
                                  "enable.auto.commit": False, "isolation.level": "read_committed",
                                  "auto.offset.reset": "earliest", "session.timeout.ms": 10000,
                                  "heartbeat.interval.ms": 1000, "socket.timeout.ms": 5000})
        # a rebalance starts the partitions it assigns at the group's committed offsets
        self.rebalances = 0
        self.consumer.subscribe([w.in_topic], on_assign=self._assigned, on_revoke=self._revoked,
                                on_lost=self._revoked)

    def _assigned(self, _consumer, _partitions) -> None:
        self.rebalances += 1
        self.positioned(None)

    def _revoked(self, _consumer, _partitions) -> None:
        self.rebalances += 1

    def open_producer(self) -> None:
        from confluent_kafka import Producer
        batching = {"linger.ms": 0, "batch.num.messages": 1} if self.pipelined else {"linger.ms": 5}
        self.producer = Producer({**self.w.client_config(), "transactional.id": self.tid,
                                  "transaction.timeout.ms": self.w.transaction_timeout_ms, "log_level": 3,
                                  "socket.timeout.ms": 5000,
                                  # librdkafka: at most transaction.timeout.ms
                                  "message.timeout.ms": min(30000, self.w.transaction_timeout_ms), **batching})
        self._call(lambda: self.producer.init_transactions(self.api_timeout_s))

    def close_producer(self) -> None:
        p = self.producer
        if p is not None:
            try:
                p.flush(1)
            except Exception:  # noqa: BLE001
                pass
            self.producer = None

    def _call(self, fn, attempts: int = 10):
        from confluent_kafka import KafkaError, KafkaException
        for i in range(attempts):
            try:
                return bounded(fn, self.api_timeout_s + WEDGE_GRACE_S)
            except Wedged as e:
                _ABANDONED.append(self.producer)   # its call may still return: never destroyed
                self.producer = None
                self.w.count(ABANDONED)
                raise Fatal(f"call past its {self.api_timeout_s:.0f}s timeout, producer abandoned: {e}") from None
            except KafkaException as e:
                err = e.args[0] if e.args else None
                if not isinstance(err, KafkaError):
                    raise Fatal(str(e)) from None
                if err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                  KafkaError.INVALID_PRODUCER_EPOCH):
                    raise Fenced(err.str()) from None
                if err.fatal():
                    raise Fatal(f"{err.name()}: {err.str()}") from None
                if err.txn_requires_abort():
                    raise Abortable(f"{err.name()}: {err.str()}") from None
                if err.retriable() and i < attempts - 1:
                    continue
                raise Fatal(f"{err.name()}: {err.str()}") from None
        raise AssertionError("unreachable")

    def poll(self):
        before = self.rebalances
        msgs = self.consumer.consume(self.w.per_txn, 0.5)
        if self.rebalances != before:
            # A rebalance ran inside this call: records it returns may have been fetched under the
            # assignment before it, while the partitions it assigned restart at the group's
            # committed offsets. Copied with the new generation's metadata (which the coordinator
            # accepts for a partition the member keeps), they would be read again from there and
            # copied twice (seen once in CI: 50 records of a partition kept across an eager
            # rebalance). Dropped, and every partition back at the committed offsets; counted, so
            # that a run's report shows how often it happens.
            if msgs:
                self.w.count("polls dropped: a rebalance ran inside them")
            self.rewind()
            return []
        return [(m.partition(), m.offset(), m.value()) for m in msgs if m.error() is None]

    def begin(self) -> None:
        self._call(self.producer.begin_transaction, 1)

    def produce(self, partition: int, value: bytes, sent: list) -> None:
        while True:
            try:
                self.producer.produce(self.w.out_topic, value, partition=partition,
                                      on_delivery=lambda err, msg: _delivered(sent, err, msg.offset()))
                return
            except BufferError:
                self.producer.poll(0.05)

    def flush(self) -> None:
        self.producer.flush(30)

    def _offsets(self, positions: dict[int, int]) -> Any:
        from confluent_kafka import TopicPartition
        return [TopicPartition(self.w.in_topic, q, o) for q, o in positions.items()]

    def rewind(self) -> None:
        """Back to the group's committed offsets for every partition assigned now."""
        from confluent_kafka import KafkaException, TopicPartition
        assigned = self.consumer.assignment()
        if not assigned:
            return
        got = self.consumer.committed(assigned, timeout=30)
        failed = [tp for tp in got if tp.error is not None]
        if failed:
            # the partition's offset comes back OFFSET_INVALID with the error: seeking to 0 (what
            # `max(offset, 0)` made of it) re-reads what the group committed. Start again instead.
            self.w.count(REWIND_REFUSED)
            raise Fatal("committed offsets not read: " + ", ".join(f"{tp.partition}: {tp.error}" for tp in failed))
        for tp in got:
            try:
                # OFFSET_INVALID without an error: the group has no offset for the partition
                self.consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))
            except KafkaException:
                pass  # not yet fetching: it starts from the committed offset anyway
        self.positioned({tp.partition: max(tp.offset, 0) for tp in got})


class _ConsumerLog:
    """librdkafka's log of one copy loop's consumer (its `logger`): resets of a fetch position are
    counted and noted, everything else goes to stderr as librdkafka's own logging would."""

    def __init__(self, loop: CopyLoop) -> None:
        self.loop = loop

    def log(self, level: int, fmt: str, *args: Any) -> None:
        text = fmt % args if args else fmt
        if args and args[0] == "OFFSET" and "offset reset" in text:
            w = self.loop.w
            w.count(POSITION_RESET)
            if w.stats[POSITION_RESET] <= 3:
                w.notes.append(f"{self.loop.instance}: librdkafka {text}"[:300])
            return
        print(f"%{level}|{text}", file=sys.stderr, flush=True)


class OncelogLoop(CopyLoop):
    def open_consumer(self) -> None:
        from oncelog.client.sync import Consumer
        w = self.w
        self.consumer = Consumer({**w.client_config(), "group.id": w.group, "group.protocol": "consumer",
                                  "enable.auto.commit": False, "isolation.level": "read_committed",
                                  "auto.offset.reset": "earliest"})
        # a rebalance starts the partitions it assigns at the group's committed offsets
        self.consumer.subscribe([w.in_topic], on_assign=lambda _c, _parts: self.positioned(None))

    def open_producer(self) -> None:
        from oncelog.client.sync import Producer
        batching = {"linger.ms": "0", "batch.size": "1"} if self.pipelined else {"linger.ms": "5"}
        self.producer = Producer({**self.w.client_config(), "transactional.id": self.tid,
                                  "transaction.timeout.ms": self.w.transaction_timeout_ms,
                                  "request.timeout.ms": 5000,
                                  "delivery.timeout.ms": 30000, **batching})
        self._call(lambda: self.producer.init_transactions(30))

    def close_producer(self) -> None:
        p = self.producer
        if p is not None:
            try:
                p.close(1)
            except Exception:  # noqa: BLE001
                pass
            self.producer = None

    def _call(self, fn, attempts: int = 10):
        from oncelog.client.errors import (
            ProducerFatalError,
            ProducerFencedError,
            TransactionAbortableError,
            TransactionStateError,
            TransactionTimeoutError,
        )
        for i in range(attempts):
            try:
                return fn()
            except ProducerFencedError as e:
                raise Fenced(str(e)) from None
            except TransactionAbortableError as e:
                raise Abortable(str(e)) from None
            except TransactionTimeoutError as e:
                if i >= min(attempts, 3) - 1:
                    raise Fatal(f"timed out: {e}") from None
            except (ProducerFatalError, TransactionStateError) as e:
                raise Fatal(f"{type(e).__name__}: {e}") from None
        raise AssertionError("unreachable")

    def poll(self):
        return [(r.partition, r.offset, r.value) for r in self.consumer.poll(0.5, self.w.per_txn)]

    def begin(self) -> None:
        self._call(self.producer.begin_transaction, 1)

    def produce(self, partition: int, value: bytes, sent: list) -> None:
        self.producer.send(self.w.out_topic, value, partition=partition,
                           on_delivery=lambda err, meta: _delivered(sent, err, meta and meta.offset))

    def flush(self) -> None:
        self._call(lambda: self.producer.flush(30), 1)

    def _offsets(self, positions: dict[int, int]) -> Any:
        from oncelog.client.types import TopicPartition
        return {TopicPartition(self.w.in_topic, q): o for q, o in positions.items()}

    def rewind(self) -> None:
        """Back to the group's committed offsets for every partition assigned now."""
        from oncelog.client.errors import KafkaClientError
        assigned = self.consumer.assignment()
        if not assigned:
            return
        try:
            got = self.consumer.committed(assigned, 30)
        except KafkaClientError as e:
            raise Fatal(f"committed offsets not read: {e}") from None
        for tp in got:
            self.consumer.seek(tp, tp.offset or 0)
        self.positioned({tp.partition: tp.offset or 0 for tp in got})

    def transaction_protocol(self) -> str:
        return f"TV{self.producer.transaction_version}"


def _close_quietly(consumer) -> None:
    try:
        if consumer is not None:
            consumer.close()
    except Exception:  # noqa: BLE001 - a closed or broken consumer is gone either way
        pass


def _delivered(sent: list, err, offset: int | None) -> None:
    if err is None:
        sent[2] = offset


class OffsetReset(Exception):
    """A reader's position is no longer in the log (records were deleted)."""


class Reader:
    """Follows the output topic read_committed from its start while the copy loops run and
    records every poll: Jepsen's poll operations over transactional writes, judged for aborted
    reads, skips and going backwards. After an error it starts again where it was, and the
    checker expects nothing of its next poll (an `assign` without positions)."""

    consumer: Any = None

    def __init__(self, w: TxnWorkload) -> None:
        self.w = w
        self.instance = f"reader-{w.client}"
        self.thread = threading.Thread(target=self.run, name=self.instance, daemon=True)

    def start(self) -> Reader:
        self.thread.start()
        return self

    def run(self) -> None:
        w = self.w
        positions = dict.fromkeys(range(w.partitions), 0)
        w.history.assign(self.instance, w.client, w.out_topic, positions)
        while not w.done.is_set():
            try:
                self.open(positions)
                while not w.done.is_set():
                    records = self.poll()
                    if records:
                        w.history.poll(self.instance, w.client, w.out_topic, records)
                        for q, offset, _v in records:
                            positions[q] = offset + 1
            except Exception as e:  # noqa: BLE001 - counted; the reader goes on from where it was
                w.errors[f"reader: {type(e).__name__}: {e}"[:120]] += 1
                w.history.assign(self.instance, w.client, w.out_topic, None)
                time.sleep(0.5)
                try:
                    starts = self.log_starts()
                    positions = {q: max(at, starts.get(q, 0)) for q, at in positions.items()}
                except Exception:  # noqa: BLE001 - brokers down: try the old positions
                    pass
            finally:
                self.close()

    def open(self, positions: dict[int, int]) -> None: ...
    def poll(self) -> list[tuple[int, int, bytes]]:
        raise NotImplementedError
    def log_starts(self) -> dict[int, int]:
        raise NotImplementedError

    def close(self) -> None:
        _close_quietly(self.consumer)
        self.consumer = None


class OncelogReader(Reader):
    def open(self, positions: dict[int, int]) -> None:
        from oncelog.client.sync import Consumer
        from oncelog.client.types import TopicPartition
        w = self.w
        self.consumer = Consumer({**w.client_config(), "group.id": f"{w.group}-reader",
                                  "isolation.level": "read_committed", "auto.offset.reset": "none"})
        self.consumer.assign([TopicPartition(w.out_topic, q, at) for q, at in positions.items()])

    def poll(self):
        return [(r.partition, r.offset, r.value) for r in self.consumer.poll(0.5, 500)]

    def log_starts(self) -> dict[int, int]:
        from oncelog.client.types import TopicPartition
        got = self.consumer.beginning_offsets([TopicPartition(self.w.out_topic, q) for q in range(self.w.partitions)])
        return {tp.partition: offset for tp, offset in got.items()}


class LibrdkafkaReader(Reader):
    def open(self, positions: dict[int, int]) -> None:
        from confluent_kafka import Consumer, TopicPartition
        w = self.w
        self.consumer = Consumer({**w.client_config(), "group.id": f"{w.group}-reader", "log_level": 3,
                                  "enable.auto.commit": False, "isolation.level": "read_committed",
                                  "auto.offset.reset": "error"})
        self.consumer.assign([TopicPartition(w.out_topic, q, at) for q, at in positions.items()])

    def poll(self):
        from confluent_kafka import KafkaError
        out = []
        for m in self.consumer.consume(500, 0.5):
            err = m.error()
            if err is None:
                out.append((m.partition(), m.offset(), m.value()))
            elif err.code() == KafkaError._AUTO_OFFSET_RESET:
                raise OffsetReset(err.str())
        return out

    def log_starts(self) -> dict[int, int]:
        from confluent_kafka import TopicPartition
        return {q: self.consumer.get_watermark_offsets(TopicPartition(self.w.out_topic, q), timeout=10)[0]
                for q in range(self.w.partitions)}

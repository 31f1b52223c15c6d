"""Executor-side writing: Arrow batches -> oncelog's idempotent producer; and the marker topic
where the streaming sink's driver records which (sink, batch id[, task]) Spark reported written
and, exactly-once, which task transactions make up a batch (its decision).

Only the driver writes markers, from the commit messages Spark hands it: a write task cannot know
whether its own attempt succeeded. When the JVM side of a task fails while it feeds the Python
writer (a Python UDF upstream raised, say), Spark drops the socket to the writer's worker and
pyarrow ends the writer's input as if it were complete; write() returns normally for an attempt
Spark has failed (docs/spark.md, "A task cannot know that it succeeded").

The driver's records (decisions, batch markers, confirmed task markers) are written in
transactions of the sink's driver transactional id (`producers.driver`) and count only there:
in a committed transaction of that id's current producer id, which the coordinator hands to
whoever may WRITE the id. Anyone else's record, however well formed, is ignored: another
principal cannot make a query skip a batch, and a fenced (zombie) driver cannot write any."""
from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from oncelog.client import AdminClient, Producer, TopicPartition, config_keys
from oncelog.client.aio.admin_base import AdminError
from oncelog.client.errors import TransactionAbortableError
from oncelog.protocol.records import RECORD_OVERHEAD
from oncelog.spark import producers
from oncelog.spark.arrow_io import require_pyarrow
from oncelog.spark.options import OncelogSparkError
from oncelog.spark.plan import connect
from oncelog.spark.producers import DeliveryFailed
from oncelog.spark.transactions import TxnHandle


def _column(batch, name: str):
    i = batch.schema.get_field_index(name)
    return None if i < 0 else batch.column(i)


# a Kafka batch per chunk of rows: under the broker's default max.message.bytes (1 MB + 12)
_CHUNK_BYTES = 1_000_000


class _Writer:
    """One task's rows -> Kafka record batches encoded column-wise (arrow_records) and handed to
    the idempotent producer whole (`send_encoded`): no Python work per row, except for rows with
    headers, which go through `send` one by one."""

    def __init__(self, producer: Producer, topic_option: str | None, include_headers: bool) -> None:
        self.producer = producer
        self.topic_option = topic_option
        self.include_headers = include_headers
        self.futures: list = []
        require_pyarrow()   # a clear message when an executor lacks it
        from oncelog.spark import arrow_records
        self.ar = arrow_records
        config = producer.config
        self.chunk_bytes = min(_CHUNK_BYTES, config.batch_size, config.max_request_size - 1024)
        # Kafka's built-in partitioner (KIP-794), the very object the producer's send() uses:
        # keyless rows stay on a random partition for batch.size bytes, then move on
        self.partitioner = producer.partitioner

    def write(self, batch) -> None:
        try:
            self._write(batch)
        except TransactionAbortableError as e:
            # an earlier batch of this task's transaction failed and the producer refuses more:
            # the same failure finish() reports when it is seen there first
            raise DeliveryFailed(f"producing to oncelog failed: {e!r}") from e

    def _write(self, batch) -> None:
        import pyarrow.compute as pc
        if _column(batch, "value") is None:
            raise OncelogSparkError("the DataFrame written to oncelog needs a `value` column "
                                    "(string or binary)")
        if self.include_headers and _column(batch, "headers") is not None:
            self._write_rows(batch)
            return
        if self.topic_option:
            self._write_topic(self.topic_option, batch)
            return
        topic_col = _column(batch, "topic")
        if topic_col is None:
            raise OncelogSparkError("set the option `topic` or give the DataFrame a `topic` column")
        if topic_col.null_count:
            raise OncelogSparkError("a row has a null `topic` and no `topic` option is set")
        for topic in pc.unique(topic_col).to_pylist():
            rows = batch if len(batch) and pc.all(pc.equal(topic_col, topic)).as_py() else \
                batch.filter(pc.equal(topic_col, topic))
            self._write_topic(topic, rows)

    def _write_topic(self, topic: str, batch) -> None:
        import numpy as np
        n_parts = self.producer.partitions_for(topic)
        part_col = _column(batch, "partition")
        keys = self.ar.binary_column(_column(batch, "key"))
        if part_col is not None and not part_col.null_count:
            parts = part_col.to_numpy(zero_copy_only=False).astype(np.int64)
        else:
            # Kafka's default partitioner where no partition is named: murmur2 of the key,
            # sticky for rows without one
            parts = np.empty(len(batch), dtype=np.int64)
            free = np.ones(len(batch), dtype=bool)
            if part_col is not None:   # a partition column wins wherever it is set
                free = ~part_col.is_valid().to_numpy(zero_copy_only=False)
                parts[~free] = part_col.to_numpy(zero_copy_only=False)[~free]
            keyless = free
            if keys is not None and keys.null_count < len(keys) and not self.partitioner.ignore_keys:
                keyed = free & keys.is_valid().to_numpy(zero_copy_only=False)
                parts[keyed] = self.ar.murmur2_partitions(keys.filter(keyed), n_parts)
                keyless = free & ~keyed
            self._sticky(topic, n_parts, batch, keys, parts, np.flatnonzero(keyless))
        bad = (parts < 0) | (parts >= n_parts)
        if bad.any():
            raise OncelogSparkError(f"topic {topic} has {n_parts} partitions; a row names "
                                    f"partition {int(parts[bad][0])}")
        values = self.ar.binary_column(_column(batch, "value"))
        now = int(time.time() * 1000)
        for partition, count, records in self.ar.encode_partitioned(keys, values, parts,
                                                                    self.chunk_bytes):
            self.futures.append(self.producer.send_encoded(topic, partition, records, count, now))

    def _sticky(self, topic: str, n_parts: int, batch, keys, parts, rows) -> None:
        """Partitions of the rows without a key or partition, by the producer's own sticky
        partitioner in runs (the work is per switch, not per row), each row counted with the
        size bound the producer's accumulator uses."""
        import numpy as np
        if not len(rows):
            return
        sizes = _lengths(_column(batch, "value"), rows) + RECORD_OVERHEAD
        if keys is not None:
            sizes += _lengths(keys, rows)
        runs = self.partitioner.sticky_runs(topic, n_parts, np.cumsum(sizes))
        targets = np.fromiter((p for p, _stop in runs), np.int64, len(runs))
        stops = np.fromiter((stop for _p, stop in runs), np.int64, len(runs))
        parts[rows] = np.repeat(targets, np.diff(stops, prepend=0))

    def _write_rows(self, batch) -> None:
        n = batch.num_rows
        values = _as_bytes(_column(batch, "value").to_pylist())
        key_col = _column(batch, "key")
        keys = _as_bytes(key_col.to_pylist()) if key_col is not None else [None] * n
        topic_col = _column(batch, "topic")
        if not self.topic_option and topic_col is None:
            raise OncelogSparkError("set the option `topic` or give the DataFrame a `topic` column")
        topics = [self.topic_option] * n if self.topic_option else topic_col.to_pylist()
        if any(t is None for t in topics):
            raise OncelogSparkError("a row has a null `topic` and no `topic` option is set")
        part_col = _column(batch, "partition")
        parts = part_col.to_pylist() if part_col is not None else [None] * n
        headers = [[(h["key"], h["value"]) for h in hs] if hs else None
                   for hs in _column(batch, "headers").to_pylist()]
        send = self.producer.send
        for i in range(n):
            self.futures.append(send(topics[i], values[i], keys[i], headers[i], parts[i]))

    def finish(self) -> None:
        self.producer.flush()
        for f in self.futures:
            e = f.exception()
            if e is not None:
                raise DeliveryFailed(f"producing to oncelog failed: {e!r}") from e


def _lengths(col, rows):
    """Byte lengths of the given rows of a string or binary column (0 for null)."""
    import numpy as np
    import pyarrow.compute as pc
    lengths = pc.fill_null(pc.binary_length(col), 0).to_numpy(zero_copy_only=False)
    return lengths[rows].astype(np.int64) if len(rows) != len(col) else lengths.astype(np.int64)


def _as_bytes(values: list) -> list:
    return [v.encode() if isinstance(v, str) else v for v in values]


def produce_task(client: dict, batches: Iterable, topic_option: str | None,
                 include_headers: bool) -> int:
    """One write task's rows through the process's shared producer (see producers.py)."""
    with producers.task_producer(client) as producer:
        return write_batches(producer, batches, topic_option, include_headers)


def write_batches(producer: Producer, batches: Iterable, topic_option: str | None,
                  include_headers: bool) -> int:
    """Send every row; returns the row count once all are acknowledged, raises on the first
    delivery error (the task fails and Spark may retry it)."""
    writer = _Writer(producer, topic_option, include_headers)
    rows = 0
    for batch in batches:
        if batch.num_rows:
            writer.write(batch)
            rows += batch.num_rows
    writer.finish()
    return rows


# ---------------------------------------------------------------------------- commit markers

_ensured: set[tuple] = set()   # (bootstrap servers, topic) known to exist, in this process


def ensure_marker_topic(client: dict, topic: str) -> None:
    known = (client.get("bootstrap.servers"), topic)
    if known in _ensured:
        return
    try:
        with AdminClient(config_keys.only(client, "admin")) as admin:
            if topic not in admin.list_topics():
                admin.create_topics([topic], num_partitions=1, exist_ok=True)[topic].result()
        _ensured.add(known)
    except OncelogSparkError:
        raise
    except Exception as e:  # noqa: BLE001
        raise OncelogSparkError(f"cannot create the commit marker topic {topic!r}: {e}") from e


@dataclass
class Decision:
    """The task transactions that make up a batch, in the order the driver commits them, and
    their rows: recorded before the first of them is committed, and final from then on."""
    handles: list[TxnHandle]
    rows: int

    @property
    def ids(self) -> set[str]:
        return {h.transactional_id for h in self.handles}


@dataclass
class Markers:
    """What the marker topic says about one sink: batches the driver committed, and per (batch,
    task) the fingerprints of inputs whose rows are visible (`tasks`); `transactions` holds the
    (producer id, epoch) of every committed transaction that wrote one of its task markers;
    `decisions` the exactly-once batches whose transactions the driver fixed (and did not
    void)."""
    batches: set[int] = field(default_factory=set)
    tasks: dict[tuple[int, int], set[str]] = field(default_factory=dict)
    transactions: set[tuple[int, int]] = field(default_factory=set)
    decisions: dict[int, Decision] = field(default_factory=dict)


def read_markers(client: dict, topic: str, sink_id: str, batch_id: int | None = None,
                 window: int = 2000) -> tuple[set[int], dict[tuple[int, int], set[str]]]:
    """(committed batch ids, {(batch id, task partition id): fingerprints}) of one sink (see
    `scan_markers`)."""
    m = scan_markers(client, topic, sink_id, batch_id, window)
    return m.batches, m.tasks


def driver_producer_id(client: dict, sink_id: str) -> int | None:
    """The producer id of the sink's driver transactional id (None: no driver ever wrote)."""
    from oncelog.protocol.errors import ErrorCode
    try:
        with AdminClient(config_keys.only(client, "admin")) as admin:
            return int(admin.describe_transaction(producers.driver_transactional_id(sink_id)).producer_id)
    except AdminError as e:
        if e.code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND:
            return None
        raise OncelogSparkError(f"cannot describe the transactional id of sink {sink_id}'s driver "
                                f"({e}): the sink needs DESCRIBE on {producers.driver_transactional_id(sink_id)}"
                                ) from e


def scan_markers(client: dict, topic: str, sink_id: str, batch_id: int | None = None,
                 window: int = 2000) -> Markers:
    """The markers of one sink that count: batch markers and decisions (the driver's, plain
    records), task markers the driver confirmed in a plain record (at-least-once mode), and task
    markers written inside a task's transaction once that transaction is committed.

    The topic is read uncommitted, with its control batches: a read_committed Fetch stops at the
    last stable offset, which any open transaction holds back, be it another query's waiting
    for its driver, or a dead driver's that nobody has aborted yet; waiting for it could wait
    for the timeout sweeper. Each transactional marker is kept until its producer's COMMIT
    (counts) or ABORT (dropped) marker; one still open does not count.

    A sink's markers are appended in batch order and Spark only replays batches after the last
    committed one, so with `batch_id` given the topic is read from windows growing backwards
    from its end (each read to the end, for the control batches) until a marker of an earlier
    batch of this sink shows up: the cost follows the recent history, not the topic's size."""
    driver = driver_producer_id(client, sink_id)
    cfg = {**client, "isolation.level": "read_uncommitted"}
    consumer = connect(cfg, "markers")
    try:
        tp = TopicPartition(topic, 0)
        end = consumer.end_offsets([tp]).get(tp) or 0
        lo = consumer.beginning_offsets([tp]).get(tp) or 0
        want = sink_id.encode()
        start = end
        while True:
            start = lo if batch_id is None else max(lo, start - window)
            found = Markers()
            older = _scan_markers(consumer, tp, start, end, want, found, batch_id, driver)
            if older or start <= lo:
                return found
            window *= 4
    finally:
        consumer.close()


def _scan_markers(consumer, tp, start: int, end: int, want: bytes, out: Markers,
                  batch_id: int | None, driver: int | None = None) -> bool:
    """Adds this sink's markers in [start, end) that count to `out`; True if one is from a batch
    before batch_id. `driver`: the producer id of the sink's driver transactional id, the only
    one whose records are the driver's."""
    from oncelog.protocol.records import iter_record_batches
    from oncelog.protocol.records.control import COMMIT, control_type
    consumer.assign([TopicPartition(tp.topic, tp.partition, start)])
    older = False
    open_txns: dict[int, list[tuple[dict, int]]] = {}   # producer id -> its markers not ended
    deadline = time.monotonic() + 60
    while True:
        pos = consumer.position(tp)
        if pos is not None and pos >= end:
            break
        got = consumer.poll_raw(1.0)
        if not got:
            if time.monotonic() > deadline:
                raise OncelogSparkError(f"cannot read the commit markers in {tp.topic} "
                                        f"(stuck at offset {pos} of {end})")
            continue
        deadline = time.monotonic() + 60
        for _tp, _at, data in got:
            for header, records in iter_record_batches(data, check_crc=True):
                if header.last_offset < start:
                    continue
                if header.is_control:
                    pending = open_txns.pop(header.producer_id, ())
                    if records and control_type(records[0].key) == COMMIT:
                        for m, epoch in pending:
                            if m.get("transactional") and m.get("task") is not None:
                                # a task's marker, in its own transaction: proof that it committed
                                _count(out, m)
                                out.transactions.add((header.producer_id, epoch))
                            elif header.producer_id == driver and driver is not None:
                                _driver_record(out, m)
                    continue
                for r in records:
                    if r.offset < start or r.offset >= end or r.key != want or not r.value:
                        continue
                    m = json.loads(r.value)
                    b = int(m["batch"])
                    if batch_id is not None and b < batch_id:
                        older = True
                    if header.is_transactional:
                        open_txns.setdefault(header.producer_id, []).append(
                            (m, header.producer_epoch))
                    # Plain records (earlier connector versions wrote the driver's records so, and
                    # anyone with WRITE on the topic can): they prove nothing, and count for nothing.
    return older


def _driver_record(out: Markers, m: dict) -> None:
    b = int(m["batch"])
    if "decision" in m:
        _decide(out, b, m)
    elif m.get("task") is None:
        out.batches.add(b)
    elif m.get("confirmed"):
        _count(out, m)


def _decide(out: Markers, batch: int, m: dict) -> None:
    """The first decision of a batch stands (two drivers racing: the later one completes the
    first's transactions); a void (Transactions without two-phase commit only, when the first
    transaction of a decision was aborted by its timeout) clears it for the replay's."""
    if m["decision"] is None:       # voided: none of its transactions was committed
        out.decisions.pop(batch, None)
    elif batch not in out.decisions:
        out.decisions[batch] = Decision([TxnHandle(str(t), int(p), int(e))
                                         for t, p, e in m["decision"]], int(m["rows"]))


def _count(out: Markers, m: dict) -> None:
    if m.get("task") is None:
        out.batches.add(int(m["batch"]))
    elif m.get("fingerprint"):
        # without a fingerprint (an earlier version) nothing says which rows the task held
        out.tasks.setdefault((int(m["batch"]), int(m["task"])), set()).add(m["fingerprint"])


def task_marker(sink_id: str, batch_id: int, task: int, rows: int) -> bytes:
    """The marker a task writes inside its own transaction: visible exactly when its rows are
    (the driver's proof that a transaction committed when its EndTxn answered otherwise)."""
    return json.dumps({"sink": sink_id, "batch": batch_id, "task": task, "rows": rows,
                       "transactional": True}, sort_keys=True).encode()


def write_markers(producer: Producer, topic: str, sink_id: str, batch_id: int,
                  entries: dict[int | None, tuple[int, str | None]]) -> None:
    """Appends one marker per entry `task: (rows, fingerprint)` and waits for all: task None =
    the whole batch committed; a task id = that task's attempt was reported successful by Spark
    (its commit message reached the driver) with an input of this fingerprint
    (replay.Fingerprint), so a replayed task whose input has the same one may skip it."""
    records = []
    for task, (rows, fingerprint) in entries.items():
        m = {"sink": sink_id, "batch": batch_id, "task": task, "rows": rows}
        if task is not None:
            m["confirmed"] = True
            m["fingerprint"] = fingerprint
        records.append(m)
    _append(producer, topic, sink_id, records)


def write_decision(producer: Producer, topic: str, sink_id: str, batch_id: int,
                   decision: Decision | None) -> None:
    """Records which task transactions make up the batch (None: voids the batch's decision,
    none of its transactions having been committed) and waits until the broker acknowledged it
    (acks=all: fsynced)."""
    m = {"sink": sink_id, "batch": batch_id, "decision": None, "rows": 0}
    if decision is not None:
        m["decision"] = [[h.transactional_id, h.producer_id, h.producer_epoch]
                         for h in decision.handles]
        m["rows"] = decision.rows
    _append(producer, topic, sink_id, [m])


def _append(producer: Producer, topic: str, sink_id: str, records: list[dict]) -> None:
    futures = [producer.send(topic, json.dumps(m, sort_keys=True).encode(), sink_id.encode(),
                             partition=0) for m in records]
    producer.flush()
    for f in futures:
        e = f.exception(60)
        if e is not None:
            raise DeliveryFailed(f"writing a commit marker to {topic} failed: {e!r}") from e

"""The `oncelog` PySpark data source (Python Data Source API, pyspark 4.2+).

Classes here are pickled by module reference to the executors, so they hold only plain data
(options, offsets); clients are opened where the work runs and never pickled."""
from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from oncelog.spark import arrow_io, plan, produce, producers, stream_transactions, transactions
from oncelog.spark.options import OncelogSparkError, canonical, from_spark, read_options, write_options
from oncelog.spark.transactions import TxnHandle

log = logging.getLogger("oncelog.spark")

KAFKA_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
                "timestamp timestamp, timestampType int")
HEADERS = ", headers array<struct<key:string,value:binary>>"


class RangePartition(InputPartition):
    def __init__(self, r: plan.OffsetRange) -> None:
        super().__init__((r.topic, r.partition, r.start, r.end))
        self.range = r


class OncelogDataSource(DataSource):
    """spark.read/readStream.format("oncelog") and df.write/writeStream.format("oncelog")."""

    @classmethod
    def name(cls) -> str:
        return "oncelog"

    def schema(self) -> str:
        headers = str(self.options.get("includeHeaders", "false")).lower() == "true"
        return KAFKA_SCHEMA + (HEADERS if headers else "")

    def reader(self, schema):
        return BatchReader(self.options)

    def streamReader(self, schema):
        return StreamReader(self.options)

    def writer(self, schema, overwrite: bool):
        return BatchWriter(self.options, schema)

    def streamWriter(self, schema, overwrite: bool):
        return StreamWriter(self.options, schema)


# ---------------------------------------------------------------------------- reading

class _Reading:
    def __init__(self, options, streaming: bool) -> None:
        self.ro = read_options(options, streaming)
        self._consumer = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_consumer"] = None
        return state

    def consumer(self):
        if self._consumer is None:
            self._consumer = plan.connect(self.ro.client, "planner")
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def read(self, partition: RangePartition):
        ro = self.ro
        yield from arrow_io.read_range(ro.client, partition.range, ro.include_headers,
                                       ro.fail_on_data_loss, ro.poll_timeout_ms)

    def _split(self, ranges):
        return [RangePartition(r) for r in
                plan.split(ranges, self.ro.min_partitions, self.ro.max_records_per_partition)]


def _ts_option(times, end: str) -> str:
    return f"{end}Timestamp" if isinstance(times, int) else f"{end}OffsetsByTimestamp"


def _starting(consumer, ro, tps, lo, hi) -> dict[str, dict[int, int]]:
    """Where a new query starts: startingTimestamp / startingOffsetsByTimestamp when set (they win
    over startingOffsets, as in Spark), else startingOffsets."""
    if ro.starting_ts is not None:
        return plan.by_timestamp(consumer, ro, ro.starting_ts, tps, hi,
                                 _ts_option(ro.starting_ts, "starting"), ro.ts_strategy)
    return plan.resolve(ro.starting, tps, lo, hi, -2, "startingOffsets")


class BatchReader(_Reading, DataSourceReader):  # type: ignore[misc]  # read() takes our own partitions
    def __init__(self, options) -> None:
        _Reading.__init__(self, options, streaming=False)

    def partitions(self):
        try:
            c = self.consumer()
            tps = plan.topic_partitions(c, self.ro)
            lo, hi = plan.bounds(c, tps, self.ro)
            start = _starting(c, self.ro, tps, lo, hi)
            if self.ro.ending_ts is not None:
                end = plan.by_timestamp(c, self.ro, self.ro.ending_ts, tps, hi,
                                        _ts_option(self.ro.ending_ts, "ending"), "latest")
            else:
                end = plan.resolve(self.ro.ending, tps, lo, hi, -1, "endingOffsets")
        finally:
            self.close()
        ranges = []
        for t, p in tps:
            s, e = start[t][p], end[t][p]
            if s > e:
                if self.ro.starting_ts is not None or self.ro.ending_ts is not None:
                    s = e   # a starting time after the ending time: nothing to read (as Spark)
                else:
                    raise OncelogSparkError(f"{t}-{p}: startingOffsets {s} is after endingOffsets {e}")
            ranges.append(plan.OffsetRange(t, p, s, e))
        parts = self._split(ranges)
        # Spark needs at least one partition; an empty range reads nothing
        return parts or [RangePartition(plan.OffsetRange("", 0, 0, 0))]


class StreamReader(_Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]  # as above
    """Offsets are {"topic": {"partition": next offset}} in sorted order (Spark compares them as
    JSON text)."""

    def __init__(self, options) -> None:
        _Reading.__init__(self, options, streaming=True)
        self._target = None        # Trigger.AvailableNow: latest offsets when the run began
        # minOffsetsPerTrigger: when the last micro-batch was admitted (0: none yet, so the first
        # trigger runs at once, as Spark's KafkaMicroBatchStream)
        self._last_trigger_ms = 0.0

    @staticmethod
    def _now_ms() -> float:
        return time.time() * 1000

    def _latest(self):
        c = self.consumer()
        tps = plan.topic_partitions(c, self.ro)
        lo, hi = plan.bounds(c, tps, self.ro)
        return tps, lo, hi

    def initialOffset(self) -> dict:
        tps, lo, hi = self._latest()
        return canonical(_starting(self.consumer(), self.ro, tps, lo, hi))

    def _delay(self, start: dict, latest: dict) -> bool:
        """Spark's minOffsetsPerTrigger with maxTriggerDelay: hold the trigger back while fewer
        offsets than the minimum wait, until maxTriggerDelay has passed since the last batch
        (never under Trigger.AvailableNow, which reads what there is)."""
        n = self.ro.min_offsets_per_trigger
        if n is None or self._target is not None:
            return False
        now = self._now_ms()
        if now - self._last_trigger_ms >= self.ro.max_trigger_delay_ms:
            self._last_trigger_ms = now
            return False
        waiting = sum(max(0, off - start.get(t, {}).get(p, off))
                      for t, ps in latest.items() for p, off in ps.items())
        if waiting < n:
            return True
        self._last_trigger_ms = now
        return False

    def prepareForTriggerAvailableNow(self) -> None:
        _tps, _lo, hi = self._latest()
        self._target = hi

    def getDefaultReadLimit(self):
        n = self.ro.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def reportLatestOffset(self):
        _tps, _lo, hi = self._latest()
        out: dict = {}
        for (t, p), off in hi.items():
            out.setdefault(t, {})[p] = off
        return canonical(out)

    def latestOffset(self, start: dict, limit) -> dict:
        begin = from_spark(start)
        tps, lo, hi = self._latest()
        latest: dict = {}
        filled: dict = {t: dict(ps) for t, ps in begin.items()}
        for t, p in tps:
            cap = hi[(t, p)]
            if self._target is not None:
                cap = min(cap, self._target.get((t, p), lo[(t, p)]))
            s = filled.setdefault(t, {}).setdefault(p, lo[(t, p)])   # new partition: earliest
            if s > hi[(t, p)] and self.ro.fail_on_data_loss:
                raise OncelogSparkError(
                    f"{t}-{p}: the query is at offset {s} but the partition ends at {hi[(t, p)]} "
                    "(topic deleted and recreated?); set failOnDataLoss=false to continue")
            latest.setdefault(t, {})[p] = max(cap, s)
        if self._delay(filled, latest):
            return canonical(begin)   # the same offsets: Spark runs no micro-batch
        if isinstance(limit, ReadMaxRows):
            latest = plan.limit_rows(filled, latest, limit.max_rows)
        # partitions that vanished keep their position, so offsets never move backwards
        for t, ps in begin.items():
            for p, off in ps.items():
                latest.setdefault(t, {}).setdefault(p, off)
        return canonical(latest)

    def partitions(self, start: dict, end: dict):
        begin, stop = from_spark(start), from_spark(end)
        new = [(t, p) for t, ps in stop.items() for p in ps if p not in begin.get(t, {})]
        lo = plan.bounds(self.consumer(), new)[0] if new else {}
        ranges = []
        for t, ps in stop.items():
            for p, e in ps.items():
                s = begin.get(t, {}).get(p, lo.get((t, p), 0))
                if e > s:
                    ranges.append(plan.OffsetRange(t, p, s, e))
        return self._split(ranges)

    def commit(self, end: dict) -> None:
        """Like Spark's Kafka source, nothing is committed to the broker: the checkpoint is the
        only record of progress."""

    def stop(self) -> None:
        self.close()


# ---------------------------------------------------------------------------- writing

@dataclass
class TaskCommit(WriterCommitMessage):
    sink_id: str | None
    batch_id: int | None
    task: int
    attempt: int
    rows: int
    skipped: bool = False
    fingerprint: str | None = None   # of the task's input (replay.Fingerprint), at-least-once streaming
    txn: TxnHandle | None = None     # exactly-once: the task's open transaction, for the driver
    opened_ms: int = 0               # exactly-once: when the task opened it (its clock)
    # streaming: the execution the task ran in, and the (producer id, epoch) its driver's start
    # got for the sink's driver transactional id (Spark runs commit() in a process that makes
    # the writer anew: these come to it in the messages)
    execution: str | None = None
    driver: tuple[int, int] | None = None


def _task_context():
    from pyspark import TaskContext
    return TaskContext.get()


def _transactional(wo, decided: bool = False) -> None:
    """On the driver, before the writer is pickled to the tasks: the transaction timeout every
    task uses (transactions.transaction_timeout), and, for a write whose driver records a
    decision (streaming, or a batch write with a sinkId), whether the tasks' transactions are
    two-phase commit ones (transactions.two_phase). A batch write without a sinkId records no
    decision that could complete them after its driver dies, so its transactions keep their
    timeout."""
    if wo.exactly_once:
        wo.client = transactions.transaction_timeout(wo.client)
        wo.two_phase = decided and transactions.two_phase(wo.client, wo.two_phase_option)


def _commit_all(wo, messages) -> dict:
    """Batch writes: the driver completes the transactions of the attempts Spark counted;
    returns those that failed ({handle: error}): aborted by a later attempt's fencing or by the
    timeout sweeper, or of unknown outcome."""
    handles = [m.txn for m in messages if m is not None and m.txn is not None]
    return transactions.end_all(wo.client, handles, commit=True)


def _not_committed(what: str, failed: dict) -> OncelogSparkError:
    return OncelogSparkError(
        f"{what}: {len(failed)} task transaction(s) could not be committed, their rows are not "
        "visible (aborted or fenced before the driver committed them: a later attempt of the "
        "task, or kafka.transaction.timeout.ms passed): "
        + "; ".join(f"{h.transactional_id}: {e}" for h, e in failed.items()))


def _abort_all(wo, messages, prefix: str) -> None:
    """Batch writes: abort the transactions of the attempts Spark counted, and fence the ids of
    tasks that failed (their last attempt may have left a transaction open)."""
    handles = [m.txn for m in messages if m is not None and m.txn is not None]
    for h, e in transactions.end_all(wo.client, handles, commit=False).items():
        # committed already (a commit() that failed midway) or fenced: nothing left open
        log.info("oncelog sink: abort of %s: %r", h.transactional_id, e)
    transactions.fence(wo.client, [f"{prefix}-{i}" for i, m in enumerate(messages) if m is None])


class BatchWriter(DataSourceArrowWriter):
    """Exactly-once (the default): each task writes in its own transaction, `oncelog-write-
    <job uuid>-<partition>` (a retried attempt fences the earlier one), and the job's commit
    completes them all; a failed job aborts them (docs/spark.md).

    With the option `sinkId`, a write the driver's death cannot tear: the write is batch
    `BATCH_ID` of that sink, and goes as a streaming micro-batch goes (stream_transactions): the
    tasks write their rows and markers in transactions of their own (two-phase commit ones where
    the broker enables it), the driver records its decision under the sink's driver id, then
    completes them. Run again with the same sinkId after any crash, the write completes what a
    dead driver decided and writes nothing more; one that never got to a decision is written
    anew (the dead run's transactions aborted). So a sinkId names one write: done once."""

    BATCH_ID = 0

    def __init__(self, options, schema) -> None:
        self.wo = write_options(options)
        opts = dict(options)
        self.fail_task = opts.get("_failwriteattempt0")   # test hook, see docs/spark.md
        # test hook "<batch>:<k>:<dir>", as the stream writer's (sinkId writes are batch 0)
        self.block = opts.get("_blockincommit")
        _check_write_schema(schema, self.wo)
        if self.wo.sink_id is not None and not self.wo.exactly_once:
            # a rerun would write every row again: refuse rather than let the sinkId promise once
            raise OncelogSparkError("option sinkId on a batch write needs deliveryGuarantee="
                                    "exactly-once (the default): an at-least-once write records "
                                    "nothing that a rerun with the same sinkId could find")
        # a write with a sinkId has a decision that a later driver completes: its transactions
        # may be two-phase commit ones; without one, nobody could complete them after a crash
        self.decided = self.wo.sink_id is not None
        if self.decided:
            produce.ensure_marker_topic(self.wo.client, self.wo.marker_topic)
        _transactional(self.wo, decided=self.decided)
        # created once on the driver and pickled to every task: one prefix per write job
        self.txn_prefix = f"oncelog-write-{uuid.uuid4().hex}"
        self.execution = stream_transactions.new_execution()
        self.driver: tuple[int, int] | None = None

    def __getstate__(self):
        """As StreamWriter's: where Spark plans the write (the driver), before any task runs,
        the sink's driver id is started, which fences an earlier driver of the same sinkId."""
        if self.decided and self.driver is None:
            self.driver = producers.start_driver(self.wo.client, str(self.wo.sink_id))
        return self.__dict__

    def write(self, iterator) -> TaskCommit:
        ctx = _task_context()
        task, attempt = (ctx.partitionId(), ctx.attemptNumber()) if ctx else (0, 0)
        _maybe_fail(self.fail_task, task, attempt)
        if self.decided:
            return _write_decided(self.wo, self.execution, self.driver, iterator, str(self.wo.sink_id),
                                  self.BATCH_ID, task, attempt, ctx.taskAttemptId() if ctx else 0)
        if not self.wo.exactly_once:
            rows = produce.produce_task(self.wo.client, iterator, self.wo.topic,
                                        self.wo.include_headers)
            return TaskCommit(None, None, task, attempt, rows)
        producer = transactions.open_transaction(self.wo.client, f"{self.txn_prefix}-{task}")
        try:
            rows = produce.write_batches(producer, iterator, self.wo.topic, self.wo.include_headers)
        except BaseException:
            transactions.drop(producer)
            raise
        return TaskCommit(None, None, task, attempt, rows, txn=transactions.hand_over(producer))

    def commit(self, messages) -> None:
        # Spark hands commit() and abort() the writer it pickled to the tasks (unlike a stream
        # writer's, made anew): its execution and driver are the tasks', even when no task ran
        if self.decided:
            offered = sorted((m for m in messages if m is not None and m.txn is not None),
                             key=lambda m: m.opened_ms)
            rows = sum(m.rows for m in offered)
            stream_transactions.commit_batch(
                self.wo.client, self.wo.marker_topic, str(self.wo.sink_id), self.BATCH_ID,
                [m.txn for m in offered], rows, execution=self.execution, two_phase=self.wo.two_phase,
                block=_block_hook(self.block, self.BATCH_ID), driver=self.driver)
            if offered or not any(m is not None and m.skipped for m in messages):
                log.info("oncelog batch write %s committed: %d rows", self.wo.sink_id, rows)
            else:   # a user who reused a sinkId for new rows must hear that they were not written
                log.warning("oncelog batch write %s: an earlier run with this sinkId had written or "
                            "decided it; this run wrote none of its rows and completed what that run "
                            "decided (a new write needs a new sinkId)", self.wo.sink_id)
            return
        if self.wo.exactly_once:
            failed = _commit_all(self.wo, messages)
            if failed:   # Spark calls abort(), which aborts the others; the job fails
                raise _not_committed("oncelog batch write", failed)
        log.info("oncelog batch write committed: %d rows",
                 sum(m.rows for m in messages if m is not None))

    def abort(self, messages) -> None:
        if self.decided:
            stream_transactions.abort_batch(
                self.wo.client, self.wo.marker_topic, str(self.wo.sink_id), self.BATCH_ID,
                [m.txn for m in messages if m is not None and m.txn is not None],
                execution=self.execution, two_phase=self.wo.two_phase)
            log.warning("oncelog batch write %s aborted: its task transactions are aborted, unless "
                        "its driver had recorded them (then a run with the same sinkId completes "
                        "them)", self.wo.sink_id)
            return
        if self.wo.exactly_once:
            _abort_all(self.wo, messages, self.txn_prefix)
            log.warning("oncelog batch write aborted: nothing of it is visible to read_committed "
                        "readers")
            return
        # tasks that finished have already produced; see docs/spark.md "At least once"
        log.warning("oncelog batch write aborted after %d rows were produced",
                    sum(m.rows for m in messages if m is not None))


class StreamWriter(DataSourceStreamArrowWriter):
    """Exactly-once (the default): each task writes its rows and its marker in one transaction
    of its own and hands it to the driver, whose commit() records the batch's transactions,
    commits them and marks the batch; a replayed batch whose transactions were recorded writes
    nothing and its driver commits the recorded ones (stream_transactions, docs/spark.md).

    At least once (`deliveryGuarantee=at-least-once`): tasks produce idempotently without
    transactions; the driver's commit marks the batch, its abort marks each task whose attempt
    succeeded with the fingerprint of its input. A task never marks itself: its input can end
    early without an error (see produce.py)."""

    def __init__(self, options, schema) -> None:
        self.wo = write_options(options)
        opts = dict(options)
        self.fail_task = opts.get("_failwriteattempt0")
        self.fail_commit = opts.get("_failcommitbatch")
        # test hook "<batch>:<k>": the driver dies in commit() after recording the batch's
        # transactions and committing k of them (so neither the batch marker nor Spark's commit
        # log is written, and abort() does nothing, as a dead driver would)
        self.crash = opts.get("_crashincommit")
        # test hook "<batch>:<k>:<dir>": in commit() of that batch, after completing k prepared
        # transactions, the driver creates <dir>/blocked and waits for <dir>/release (a test
        # kills it -9 meanwhile)
        self.block = opts.get("_blockincommit")
        self.checkpoint = opts.get("checkpointlocation")
        _check_write_schema(schema, self.wo)
        produce.ensure_marker_topic(self.wo.client, self.wo.marker_topic)
        _transactional(self.wo, decided=True)
        # made where Spark plans the batch's write (the driver) and pickled to its tasks: tells
        # this execution's transactions from a dead driver's (stream_transactions)
        self.execution = stream_transactions.new_execution()
        self.driver: tuple[int, int] | None = None

    def __getstate__(self):
        """Spark pickles the writer where it plans the write, on the driver, to send it to the
        tasks (the process that runs commit() makes its own and never pickles it): there the
        sink's driver transactional id is started, before any task of this driver runs, which
        fences a zombie driver of the sink (producers.start_driver). A sink id unknown here (a
        checkpoint on HDFS or S3): no start, and the commit's InitProducerId fences instead."""
        if self.driver is None:
            sink = self._driver_sink_id([])
            if sink is not None:
                self.driver = producers.start_driver(self.wo.client, sink)
        return self.__dict__

    def _sink_id(self, ctx) -> str:
        if self.wo.sink_id:
            return self.wo.sink_id
        qid = ctx.getLocalProperty("sql.streaming.queryId") if ctx else None
        if not qid:
            raise OncelogSparkError("cannot find the streaming query id; set the option sinkId")
        return qid

    def _driver_sink_id(self, messages) -> str | None:
        """On the driver: the sink id from a task's message, else the option, else the query id
        in `<checkpointLocation>/metadata` (what the tasks used)."""
        for m in messages:
            if m is not None and m.sink_id:
                return m.sink_id
        if self.wo.sink_id:
            return self.wo.sink_id
        try:
            path = str(self.checkpoint)
            path = path[len("file:"):] if path.startswith("file:") else path
            with open(os.path.join(path, "metadata")) as f:
                return str(json.loads(f.read().splitlines()[-1])["id"])
        except Exception:  # noqa: BLE001 - a checkpoint elsewhere (HDFS, S3): no fencing then
            return None

    def write(self, iterator) -> TaskCommit:
        arrow_io.require_pyarrow()   # a clear message when an executor lacks it
        ctx = _task_context()
        sink = self._sink_id(ctx)
        batch_id = int(ctx.getLocalProperty("streaming.sql.batchId"))
        task, attempt = ctx.partitionId(), ctx.attemptNumber()
        if self.wo.exactly_once:
            _maybe_fail(self.fail_task, task, attempt)
            return _write_decided(self.wo, self.execution, self.driver, iterator, sink, batch_id, task,
                                  attempt, ctx.taskAttemptId())
        return self._write_at_least_once(iterator, sink, batch_id, task, attempt)

    def _write_at_least_once(self, iterator, sink: str, batch_id: int, task: int,
                             attempt: int) -> TaskCommit:
        from oncelog.spark.replay import Fingerprint, Spill, fingerprinted
        batches, tasks = produce.read_markers(self.wo.client, self.wo.marker_topic, sink,
                                               batch_id)
        if batch_id in batches:
            log.info("oncelog sink %s: batch %d already committed, skipping replay", sink, batch_id)
            return TaskCommit(sink, batch_id, task, attempt, 0, skipped=True, driver=self.driver)
        _maybe_fail(self.fail_task, task, attempt)
        fp = Fingerprint(self.wo.topic, self.wo.include_headers)
        confirmed = tasks.get((batch_id, task))
        if not confirmed:
            rows = self._produce(fingerprinted(iterator, fp))
            return TaskCommit(sink, batch_id, task, attempt, rows, fingerprint=fp.digest(), driver=self.driver)
        # A marked task of a replayed batch: skip only if this input is the one marked (the
        # replay may split the batch differently), which is known once the input ended
        with Spill() as spill:
            spill.write(fingerprinted(iterator, fp))
            if fp.digest() in confirmed:
                log.info("oncelog sink %s: batch %d task %d already written (same input), "
                         "skipping replay", sink, batch_id, task)
                return TaskCommit(sink, batch_id, task, attempt, fp.rows, skipped=True,
                                  fingerprint=fp.digest(), driver=self.driver)
            log.warning("oncelog sink %s: batch %d task %d was written with other rows than "
                        "this replay holds (the batch is split differently); writing its %d "
                        "rows", sink, batch_id, task, fp.rows)
            rows = self._produce(spill.read())
        return TaskCommit(sink, batch_id, task, attempt, rows, fingerprint=fp.digest(), driver=self.driver)

    def _produce(self, batches) -> int:
        return produce.produce_task(self.wo.client, batches, self.wo.topic,
                                    self.wo.include_headers)

    def _mark(self, sink: str, batch_id: int, entries: dict, driver) -> None:
        stream_transactions._write(self.wo.client, sink, lambda p: produce.write_markers(
            p, self.wo.marker_topic, sink, batch_id, entries), driver)

    def commit(self, messages, batchId: int) -> None:
        done = [m for m in messages if m is not None]
        if self.fail_commit is not None and int(self.fail_commit) == batchId:
            raise OncelogSparkError(f"injected sink commit failure for batch {batchId} "
                                    "(option _failCommitBatch)")
        if not self.wo.exactly_once:
            if done:
                self._mark(done[0].sink_id, batchId, {None: (sum(m.rows for m in done), None)},
                           _driver(done))
            return
        sink = self._driver_sink_id(done)
        if sink is None:
            return   # no task ran and no sink id to look for: nothing to commit
        offered = sorted((m for m in done if m.txn is not None), key=lambda m: m.opened_ms)
        stream_transactions.commit_batch(self.wo.client, self.wo.marker_topic, sink, batchId,
                                         [m.txn for m in offered],
                                         sum(m.rows for m in offered), self._crash(batchId),
                                         execution=_execution(done), two_phase=self.wo.two_phase,
                                         block=_block_hook(self.block, batchId), driver=_driver(done))

    def _crash(self, batch_id: int) -> int | None:
        if self.crash is None:
            return None
        b, k = str(self.crash).split(":")
        return int(k) if int(b) == batch_id else None

    def abort(self, messages, batchId: int) -> None:
        if self._crash(batchId) is not None:
            return
        if self.wo.exactly_once:
            sink = self._driver_sink_id(messages)
            if sink is not None:
                stream_transactions.abort_batch(
                    self.wo.client, self.wo.marker_topic, sink, batchId,
                    [m.txn for m in messages if m is not None and m.txn is not None],
                    execution=_execution([m for m in messages if m is not None]),
                    two_phase=self.wo.two_phase)
            log.warning("oncelog sink: batch %d aborted; its task transactions are aborted, "
                        "unless the driver had recorded them (then the replay commits them)",
                        batchId)
            return
        # At least once: the tasks Spark reported successful are marked with their input's
        # fingerprint, so that a replay of this batch skips a task holding the same input;
        # every other task is written again in full.
        done = [m for m in messages if m is not None and not m.skipped]
        log.warning("oncelog sink: batch %d aborted; %d task(s) that finished are marked and "
                    "skipped when a replay holds the same rows", batchId, len(done))
        if done:
            self._mark(done[0].sink_id, batchId,
                       {m.task: (m.rows, m.fingerprint) for m in done}, _driver(done))


def _write_decided(wo, execution: str, driver: tuple[int, int] | None, iterator, sink: str, batch_id: int,
                   task: int, attempt: int, attempt_id: int) -> TaskCommit:
    """A task of a batch that its driver decides (a streaming micro-batch, or a batch write with a
    sinkId): its rows and its marker in a transaction of its own, handed over (prepared, with
    two-phase commit) to the driver; nothing when the batch was decided already."""
    markers = produce.scan_markers(wo.client, wo.marker_topic, sink, batch_id)
    if task == 0:
        stream_transactions.abort_before_batch(wo.client, sink, batch_id, execution, markers)
    if batch_id in markers.batches or batch_id in markers.decisions:
        # the rows of this batch are those its recorded transactions hold, whatever this
        # replay's split: write nothing (and touch no transaction)
        log.info("oncelog sink %s: batch %d already %s, writing nothing in this replay",
                 sink, batch_id,
                 "committed" if batch_id in markers.batches else "decided by its driver")
        return TaskCommit(sink, batch_id, task, attempt, 0, skipped=True, execution=execution, driver=driver)
    opened_ms = int(time.time() * 1000)
    producer = transactions.open_transaction(wo.client, stream_transactions.transactional_id(
        sink, batch_id, execution, task, attempt_id), wo.two_phase)
    try:
        rows = produce.write_batches(producer, iterator, wo.topic, wo.include_headers)
        marker = producer.send(wo.marker_topic,
                               produce.task_marker(sink, batch_id, task, rows),
                               sink.encode(), partition=0)
        producer.flush()
        if marker.exception() is not None:
            raise producers.DeliveryFailed(f"writing the task marker to {wo.marker_topic} "
                                           f"failed: {marker.exception()!r}")
    except BaseException:
        transactions.drop(producer)
        raise
    return TaskCommit(sink, batch_id, task, attempt, rows, txn=transactions.hand_over(producer),
                      opened_ms=opened_ms, execution=execution, driver=driver)


def _block_hook(spec, batch_id: int):
    """The test hook `_blockInCommit` "<batch>:<k>:<dir>": in commit() of that batch, after
    completing k transactions, the driver creates <dir>/blocked and waits for <dir>/release (a
    test kills it -9 meanwhile). None for other batches and without the option."""
    if spec is None:
        return None
    b, k, flags = str(spec).split(":", 2)
    if int(b) != batch_id:
        return None

    def block(done: int) -> None:
        if done != int(k):
            return
        open(os.path.join(flags, "blocked"), "w").close()
        deadline = time.monotonic() + 300
        while not os.path.exists(os.path.join(flags, "release")):
            if time.monotonic() > deadline:
                raise OncelogSparkError("_blockInCommit: never released")
            time.sleep(0.05)
    return block


def _driver(messages) -> tuple[int, int] | None:
    """The (producer id, epoch) the driver's start got, from the tasks' messages (all carry the
    same; None when the start could not know the sink id)."""
    return next((tuple(m.driver) for m in messages if m is not None and m.driver), None)


def _execution(messages) -> str:
    """The execution the tasks ran in (the newest, should they differ); "0": none known, so the
    driver aborts no lingering transaction (its tasks' task 0 did)."""
    return max((m.execution for m in messages if m is not None and m.execution), default="0")


def _check_write_schema(schema, wo) -> None:
    names = {f.name.lower() for f in schema.fields} if schema is not None else set()
    if schema is not None and "value" not in names:
        raise OncelogSparkError("the DataFrame written to oncelog needs a `value` column "
                                f"(string or binary); it has {sorted(names)}")
    if schema is not None and not wo.topic and "topic" not in names:
        raise OncelogSparkError("set the option `topic` or give the DataFrame a `topic` column")


def _maybe_fail(fail_task, task: int, attempt: int) -> None:
    if fail_task is not None and int(fail_task) == task and attempt == 0:
        raise OncelogSparkError(f"injected failure of task {task} attempt 0 "
                                "(option _failWriteAttempt0)")


__all__ = ["OncelogDataSource"]

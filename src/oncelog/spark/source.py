"""The `oncelog` PySpark data source (Python Data Source API, pyspark 4.2+).

Classes here are pickled by module reference to the executors, so they hold only plain data
(options, offsets); clients are opened where the work runs and never pickled."""
from __future__ import annotations

import logging
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

from oncelog.spark import arrow_io, plan, produce, producers
from oncelog.spark.options import OncelogSparkError, canonical, from_spark, read_options, write_options

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


class BatchReader(_Reading, DataSourceReader):  # type: ignore[misc]  # read() takes our own partitions
    def __init__(self, options) -> None:
        _Reading.__init__(self, options, streaming=False)

    def partitions(self):
        try:
            c = self.consumer()
            tps = plan.topic_partitions(c, self.ro)
            lo, hi = plan.bounds(c, tps)
            start = plan.resolve(self.ro.starting, tps, lo, hi, -2, "startingOffsets")
            end = plan.resolve(self.ro.ending, tps, lo, hi, -1, "endingOffsets")
        finally:
            self.close()
        ranges = []
        for t, p in tps:
            s, e = start[t][p], end[t][p]
            if s > e:
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

    def _latest(self):
        c = self.consumer()
        tps = plan.topic_partitions(c, self.ro)
        lo, hi = plan.bounds(c, tps)
        return tps, lo, hi

    def initialOffset(self) -> dict:
        tps, lo, hi = self._latest()
        return canonical(plan.resolve(self.ro.starting, tps, lo, hi, -2, "startingOffsets"))

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
    fingerprint: str | None = None   # of the task's input (replay.Fingerprint), streaming only


def _task_context():
    from pyspark import TaskContext
    return TaskContext.get()


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, options, schema) -> None:
        self.wo = write_options(options)
        self.fail_task = dict(options).get("_failwriteattempt0")   # test hook, see docs/spark.md
        _check_write_schema(schema, self.wo)

    def write(self, iterator) -> TaskCommit:
        ctx = _task_context()
        task, attempt = (ctx.partitionId(), ctx.attemptNumber()) if ctx else (0, 0)
        _maybe_fail(self.fail_task, task, attempt)
        rows = produce.produce_task(self.wo.client, iterator, self.wo.topic,
                                    self.wo.include_headers)
        return TaskCommit(None, None, task, attempt, rows)

    def commit(self, messages) -> None:
        log.info("oncelog batch write committed: %d rows",
                 sum(m.rows for m in messages if m is not None))

    def abort(self, messages) -> None:
        # tasks that finished have already produced; see docs/spark.md "What can duplicate"
        log.warning("oncelog batch write aborted after %d rows were produced",
                    sum(m.rows for m in messages if m is not None))


class StreamWriter(DataSourceStreamArrowWriter):
    """Idempotent across replays of a micro-batch, as far as Spark tells the driver what was
    written: the driver's commit marks the batch (sink, batch), its abort marks each task whose
    attempt succeeded (sink, batch, task, fingerprint of the task's input); a replayed batch
    skips the batch, or a task whose input has the fingerprint of a marked one.

    A task never marks itself: its input can end early without an error (see produce.py), so
    only a commit message that reached the driver proves that an attempt wrote all its rows."""

    def __init__(self, options, schema) -> None:
        self.wo = write_options(options)
        opts = dict(options)
        self.fail_task = opts.get("_failwriteattempt0")
        self.fail_commit = opts.get("_failcommitbatch")
        _check_write_schema(schema, self.wo)
        produce.ensure_marker_topic(self.wo.client, self.wo.marker_topic)

    def _sink_id(self, ctx) -> str:
        if self.wo.sink_id:
            return self.wo.sink_id
        qid = ctx.getLocalProperty("sql.streaming.queryId") if ctx else None
        if not qid:
            raise OncelogSparkError("cannot find the streaming query id; set the option sinkId")
        return qid

    def write(self, iterator) -> TaskCommit:
        arrow_io.require_pyarrow()   # a clear message when an executor lacks it
        from oncelog.spark.replay import Fingerprint, Spill, fingerprinted
        ctx = _task_context()
        sink = self._sink_id(ctx)
        batch_id = int(ctx.getLocalProperty("streaming.sql.batchId"))
        task, attempt = ctx.partitionId(), ctx.attemptNumber()
        batches, tasks = produce.read_markers(self.wo.client, self.wo.marker_topic, sink,
                                               batch_id)
        if batch_id in batches:
            log.info("oncelog sink %s: batch %d already committed, skipping replay", sink, batch_id)
            return TaskCommit(sink, batch_id, task, attempt, 0, skipped=True)
        _maybe_fail(self.fail_task, task, attempt)
        fp = Fingerprint(self.wo.topic, self.wo.include_headers)
        confirmed = tasks.get((batch_id, task))
        if not confirmed:
            rows = self._produce(fingerprinted(iterator, fp))
            return TaskCommit(sink, batch_id, task, attempt, rows, fingerprint=fp.digest())
        # A marked task of a replayed batch: skip only if this input is the one marked (the
        # replay may split the batch differently), which is known once the input ended
        with Spill() as spill:
            spill.write(fingerprinted(iterator, fp))
            if fp.digest() in confirmed:
                log.info("oncelog sink %s: batch %d task %d already written (same input), "
                         "skipping replay", sink, batch_id, task)
                return TaskCommit(sink, batch_id, task, attempt, fp.rows, skipped=True,
                                  fingerprint=fp.digest())
            log.warning("oncelog sink %s: batch %d task %d was written with other rows than "
                        "this replay holds (the batch is split differently); writing its %d "
                        "rows", sink, batch_id, task, fp.rows)
            rows = self._produce(spill.read())
        return TaskCommit(sink, batch_id, task, attempt, rows, fingerprint=fp.digest())

    def _produce(self, batches) -> int:
        return produce.produce_task(self.wo.client, batches, self.wo.topic,
                                    self.wo.include_headers)

    def _mark(self, sink: str, batch_id: int, entries: dict) -> None:
        with producers.task_producer(self.wo.client) as producer:
            produce.write_markers(producer, self.wo.marker_topic, sink, batch_id, entries)

    def commit(self, messages, batchId: int) -> None:
        done = [m for m in messages if m is not None]
        if self.fail_commit is not None and int(self.fail_commit) == batchId:
            raise OncelogSparkError(f"injected sink commit failure for batch {batchId} "
                                    "(option _failCommitBatch)")
        if done:
            self._mark(done[0].sink_id, batchId, {None: (sum(m.rows for m in done), None)})

    def abort(self, messages, batchId: int) -> None:
        """The job failed (or commit() did): the tasks Spark reported successful are marked
        with their input's fingerprint, so that a replay of this batch skips a task holding the
        same input; every other task is written again in full."""
        done = [m for m in messages if m is not None and not m.skipped]
        log.warning("oncelog sink: batch %d aborted; %d task(s) that finished are marked and "
                    "skipped when a replay holds the same rows", batchId, len(done))
        if done:
            self._mark(done[0].sink_id, batchId,
                       {m.task: (m.rows, m.fingerprint) for m in done})


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

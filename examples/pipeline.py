"""An exactly-once pipeline on oncelog with Spark, in one command:

    .venv/bin/python examples/pipeline.py            # starts an embedded oncelog broker
    .venv/bin/python examples/pipeline.py --bootstrap 127.0.0.1:9092

oncelog topic `events` -> Spark Structured Streaming aggregation (running totals per user,
outputMode complete: every micro-batch writes every user's total; Python data sources take
append and complete, not update) -> oncelog topic `totals`, through the exactly-once sink (a transaction per
write task, completed by the driver):

1. purchase events are produced into `events`;
2. a Spark driver (its own process, `local[2,3]` so that failed tasks are retried) runs the
   query with AvailableNow and maxOffsetsPerTrigger (several micro-batches); the write task of
   Spark partition 0 in micro-batch 1 fails on its first attempt after it produced rows (a UDF
   raises), and the driver dies in micro-batch 2 after recording the micro-batch's task
   transactions and committing one of them, before the others and Spark's checkpoint commit;
3. a new driver process restarts the query from the checkpoint: micro-batch 2 is replayed (its
   tasks write nothing, the new driver commits the transactions the dead one had recorded) and
   the query finishes;
4. a read_committed consumer reads `totals`: each user's latest total equals the totals computed
   from the generator exactly (every event counted once), and `totals` holds exactly one
   record per user for each micro-batch in Spark's commit log (a micro-batch written twice, or
   a failed attempt's rows, would add records).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

USERS = 400        # each micro-batch writes every user's total: about 200 rows per write task
PAD = "." * 2000   # 2 KB per output row: the JVM hands the writer its input 64 KB at a time
FAIL_AT = 150      # rows into the failing attempt: about 50 of them have reached the writer


def expected_totals(n_events: int) -> dict[str, tuple[int, int]]:
    """(count, sum of amounts) per user for events 0..n_events-1, as generated below."""
    out = {}
    for i in range(n_events):
        u = f"user-{i % USERS}"
        c, s = out.get(u, (0, 0))
        out[u] = (c + 1, s + (i * 7) % 100)
    return out


def produce_events(bootstrap: str, topic: str, first: int, count: int) -> None:
    from oncelog.client import Producer
    with Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(first, first + count):
            u = f"user-{i % USERS}"
            p.produce(topic, json.dumps({"id": i, "user": u, "amount": (i * 7) % 100}).encode(), u)
        p.flush()


def run_driver(bootstrap: str, events: str, totals: str, checkpoint: str, crash: str | None,
               max_per_trigger: int) -> int:
    """One Spark driver: the streaming query until AvailableNow's end (or the injected crash)."""
    from pyspark.sql import functions as F

    from oncelog.spark.session import local_session
    spark = local_session("local[2,3]", app="oncelog-pipeline",
                          **{"spark.sql.execution.arrow.maxRecordsPerBatch": "10"})

    seen = {"rows": 0}

    def fail_once(value):
        """Raises in the first attempt of the write task of partition 0 in micro-batch 1 at its
        FAIL_AT-th row, when the rows before (less the JVM's buffers) went to the writer, which
        produced them into its transaction."""
        from pyspark import TaskContext
        ctx = TaskContext.get()
        if (ctx.getLocalProperty("streaming.sql.batchId") == "1" and ctx.partitionId() == 0
                and ctx.attemptNumber() == 0):
            seen["rows"] += 1
            if seen["rows"] == FAIL_AT:
                raise RuntimeError("injected failure of a write task's first attempt")
        return value

    totals_df = (spark.readStream.format("oncelog").option("bootstrap.servers", bootstrap)
                 .option("subscribe", events).option("startingOffsets", "earliest")
                 .option("maxOffsetsPerTrigger", str(max_per_trigger))
                 .option("kafka.isolation.level", "read_committed").load()
                 .select(F.from_json(F.col("value").cast("string"),
                                     "id long, user string, amount long").alias("e"))
                 .groupBy("e.user").agg(F.count("*").alias("events"),
                                        F.sum("e.amount").alias("amount")))
    value = F.to_json(F.struct("user", "events", "amount", F.lit(PAD).alias("pad")))
    w = (totals_df.select(F.col("user").alias("key"),
                          F.udf(fail_once, "string")(value).alias("value"))
         .writeStream.format("oncelog").outputMode("complete")
         .option("bootstrap.servers", bootstrap).option("topic", totals)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True))
    if crash:
        w = w.option("_crashInCommit", crash)
    q = w.start()
    try:
        q.awaitTermination()
    except Exception as e:  # noqa: BLE001 - the injected crash ends this driver
        print(f"driver: the query failed: {str(e).splitlines()[0][:200]}")
        return 3
    finally:
        spark.stop()
    return 0


def latest_totals(bootstrap: str, topic: str) -> tuple[dict[str, tuple[int, int]], int, int]:
    """(each user's latest (events, amount) read_committed, records read_committed, records that
    only a read_uncommitted reader sees)."""
    from oncelog.client import Consumer, TopicPartition
    counts = {}
    for isolation in ("read_committed", "read_uncommitted"):
        with Consumer({"bootstrap.servers": bootstrap, "isolation.level": isolation}) as c:
            n = c.list_topics()[topic]
            tps = [TopicPartition(topic, p) for p in range(n)]
            c.assign([TopicPartition(topic, p, 0) for p in range(n)])
            ends = c.end_offsets(tps)
            records = []
            deadline = time.monotonic() + 60
            while any((c.position(tp) or 0) < ends[tp] for tp in tps):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cannot read {topic} to its end")
                records.extend(c.poll(0.3))
        counts[isolation] = records
    latest: dict[str, tuple[int, int]] = {}
    for r in sorted(counts["read_committed"], key=lambda r: (r.partition, r.offset)):
        v = json.loads(r.value)
        latest[v["user"]] = (v["events"], v["amount"])
    committed = len(counts["read_committed"])
    return latest, committed, len(counts["read_uncommitted"]) - committed


def main(bootstrap: str | None = None, workdir: str | None = None, n_events: int = 12000,
         max_per_trigger: int = 3000) -> dict:
    workdir = workdir or tempfile.mkdtemp(prefix="oncelog-pipeline-")
    broker = None
    if bootstrap is None:
        from oncelog.testing.embedded import BrokerProcess
        broker = BrokerProcess(Path(workdir) / "broker").start()
        bootstrap = broker.bootstrap
    try:
        from oncelog.client import AdminClient
        stamp = int(time.time() * 1000)
        events, totals = f"events-{stamp}", f"totals-{stamp}"
        with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            for created in admin.create_topics([events, totals], num_partitions=3).values():
                created.result()
        produce_events(bootstrap, events, 0, n_events)
        ckpt = os.path.join(workdir, "checkpoint")
        driver = [sys.executable, os.path.abspath(__file__), "--driver", "--bootstrap", bootstrap,
                  "--events-topic", events, "--totals-topic", totals, "--checkpoint", ckpt,
                  "--max-per-trigger", str(max_per_trigger)]
        first = subprocess.run(driver + ["--crash-in-commit", "2:1"], check=False)
        commits = sorted(int(f) for f in os.listdir(os.path.join(ckpt, "commits")) if f.isdigit())
        print(f"pipeline: first driver exited with {first.returncode} after committing "
              f"micro-batches {commits}; restarting from the checkpoint")
        second = subprocess.run(driver, check=False)
        got, records, aborted = latest_totals(bootstrap, totals)
        batches = sum(1 for f in os.listdir(os.path.join(ckpt, "commits")) if f.isdigit())
        # complete mode: every micro-batch writes one record per user seen so far (all of them:
        # each micro-batch holds more events than there are users)
        repeated = records - batches * USERS
        want = expected_totals(n_events)
        ok = first.returncode != 0 and second.returncode == 0 and got == want and not repeated
        print(f"pipeline: {n_events} events, {len(got)} users; totals read_committed "
              f"{'EXACT' if got == want else 'WRONG'}; {records} records for {batches} micro-batches "
              f"({repeated:+d} beyond one per user and micro-batch); records of "
              f"aborted attempts (seen only read_uncommitted): {aborted}")
        if got != want:
            for u in sorted(set(got) | set(want)):
                if got.get(u) != want.get(u):
                    print(f"  {u}: got {got.get(u)} want {want.get(u)}")
        return {"ok": ok, "got": got, "want": want, "repeated": repeated, "aborted": aborted,
                "first_exit": first.returncode, "second_exit": second.returncode,
                "bootstrap": bootstrap, "totals": totals}
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bootstrap", help="use this broker instead of starting an embedded one")
    ap.add_argument("--workdir", help="where the checkpoint and broker data go (default: temp)")
    ap.add_argument("--events", type=int, default=12000)
    ap.add_argument("--max-per-trigger", type=int, default=3000)
    ap.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--events-topic", help=argparse.SUPPRESS)
    ap.add_argument("--totals-topic", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", help=argparse.SUPPRESS)
    ap.add_argument("--crash-in-commit", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.driver:
        sys.exit(run_driver(args.bootstrap, args.events_topic, args.totals_topic, args.checkpoint,
                            args.crash_in_commit, args.max_per_trigger))
    sys.exit(0 if main(args.bootstrap, args.workdir, args.events, args.max_per_trigger)["ok"]
             else 1)

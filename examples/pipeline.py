"""End-to-end pipeline on oncelog with Spark, in one command:

    .venv/bin/python examples/pipeline.py            # starts an embedded oncelog broker
    .venv/bin/python examples/pipeline.py --bootstrap 127.0.0.1:9092

1. a batch job produces purchase events into the topic `events` (format "oncelog");
2. a streaming query reads them (Trigger.AvailableNow, maxOffsetsPerTrigger so it takes several
   micro-batches), aggregates each micro-batch per user, and writes Parquet with a checkpoint;
   each micro-batch goes to its own `batch_id=N` directory, overwritten on replay, so a replayed
   batch is not counted twice;
3. more events arrive, the query restarts from its checkpoint and reads only the new ones;
4. the totals read back from Parquet must equal the totals computed from the generator exactly.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

USERS = 10


def expected_totals(n_events: int) -> dict[str, tuple[int, int]]:
    """(count, sum of amounts) per user for events 0..n_events-1, as generated below."""
    out = {}
    for i in range(n_events):
        u = f"user-{i % USERS}"
        c, s = out.get(u, (0, 0))
        out[u] = (c + 1, s + (i * 7) % 100)
    return out


def produce_events(spark, bootstrap: str, topic: str, first: int, count: int,
                   writer_options: dict | None = None) -> None:
    (spark.range(first, first + count, numPartitions=2)
     .selectExpr(f"concat('user-', CAST(id % {USERS} AS STRING)) AS key",
                 "to_json(named_struct('id', id, 'user', "
                 f"concat('user-', CAST(id % {USERS} AS STRING)), 'amount', (id * 7) % 100)) AS value")
     .write.format("oncelog").options(**(writer_options or {}))
     .option("bootstrap.servers", bootstrap).option("topic", topic).mode("append").save())


def run_stream(spark, bootstrap: str, topic: str, out: str, checkpoint: str,
               max_per_trigger: int = 4000) -> int:
    from pyspark.sql import functions as F
    events = (spark.readStream.format("oncelog")
              .option("bootstrap.servers", bootstrap).option("subscribe", topic)
              .option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(max_per_trigger)).load()
              .select(F.from_json(F.col("value").cast("string"),
                                  "id long, user string, amount long").alias("e"))
              .select("e.*"))

    def write_batch(df, batch_id):
        (df.groupBy("user").agg(F.count("*").alias("events"), F.sum("amount").alias("amount"))
         .coalesce(1).write.mode("overwrite").parquet(f"{out}/batch_id={batch_id}"))

    q = (events.writeStream.foreachBatch(write_batch).option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start())
    q.awaitTermination()
    if q.exception():
        raise q.exception()
    return sum(1 for p in q.recentProgress if p["numInputRows"] > 0)


def totals_from_parquet(spark, out: str) -> dict[str, tuple[int, int]]:
    rows = (spark.read.parquet(out).groupBy("user")
            .agg({"events": "sum", "amount": "sum"}).collect())
    return {r["user"]: (int(r["sum(events)"]), int(r["sum(amount)"])) for r in rows}


def main(bootstrap: str | None = None, workdir: str | None = None, first_batch: int = 12000,
         second_batch: int = 5000, spark=None, writer_options: dict | None = None) -> dict:
    workdir = workdir or tempfile.mkdtemp(prefix="oncelog-pipeline-")
    broker = None
    if bootstrap is None:
        from oncelog.testing.embedded import BrokerProcess
        broker = BrokerProcess(Path(workdir) / "broker").start()
        bootstrap = broker.bootstrap
    own_spark = spark is None
    try:
        from oncelog.client import AdminClient
        from oncelog.spark.session import local_session
        topic = f"events-{int(time.time() * 1000)}"
        with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            admin.create_topics([topic], num_partitions=3)
        spark = spark or local_session("local[2]", app="oncelog-pipeline")
        out, ckpt = os.path.join(workdir, "totals"), os.path.join(workdir, "checkpoint")

        produce_events(spark, bootstrap, topic, 0, first_batch, writer_options)
        batches1 = run_stream(spark, bootstrap, topic, out, ckpt)
        produce_events(spark, bootstrap, topic, first_batch, second_batch, writer_options)
        batches2 = run_stream(spark, bootstrap, topic, out, ckpt)   # restart from the checkpoint

        got = totals_from_parquet(spark, out)
        want = expected_totals(first_batch + second_batch)
        ok = got == want
        print(f"pipeline: {first_batch + second_batch} events, micro-batches {batches1} + {batches2}, "
              f"totals {'EXACT' if ok else 'WRONG'}")
        if not ok:
            for u in sorted(set(got) | set(want)):
                if got.get(u) != want.get(u):
                    print(f"  {u}: got {got.get(u)} want {want.get(u)}")
        return {"ok": ok, "batches": (batches1, batches2), "got": got, "want": want,
                "bootstrap": bootstrap, "topic": topic}
    finally:
        if own_spark and spark is not None:
            spark.stop()
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bootstrap", help="use this broker instead of starting an embedded one")
    ap.add_argument("--workdir", help="where Parquet, checkpoint and broker data go (default: temp)")
    ap.add_argument("--events", type=int, default=12000)
    args = ap.parse_args()
    sys.exit(0 if main(args.bootstrap, args.workdir, args.events)["ok"] else 1)

"""A Spark driver in a process of its own, for tests that kill it (-9) in the middle of a batch
(tests/spark/test_driver_death.py; not collected by pytest):

    python tests/spark/driver_process.py --bootstrap H:P --source S --sink D --checkpoint C
        [--min-partitions N] [--block-at PARTITION:OFFSET --flags DIR]
        [--block-in-commit BATCH:K --flags DIR] [--option KEY=VALUE ...]

Streams topic S into topic D through the exactly-once sink with AvailableNow on local[2]; each
row keeps its source partition. With --block-at, the Python UDF in front of the writer stops at
that source record (the write task has produced the rows before it into its transaction),
creates DIR/blocked and waits until DIR/release exists (at most 5 minutes, then it raises, so
that a worker left behind ends). With --block-in-commit, the driver's commit() of that batch does
the same after completing K of its task transactions (the sink's `_blockInCommit` hook). --option
adds a sink option. --batch: a batch job instead (`spark.read` of all of S, `df.write` to D; the
checkpoint is not used; a batch write with the option sinkId is batch 0 of that sink)."""
from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    for name in ("--bootstrap", "--source", "--sink", "--checkpoint"):
        ap.add_argument(name, required=True)
    ap.add_argument("--min-partitions")
    ap.add_argument("--block-at")
    ap.add_argument("--flags")
    ap.add_argument("--block-in-commit")
    ap.add_argument("--option", action="append", default=[])
    ap.add_argument("--batch", action="store_true")
    args = ap.parse_args()

    from pyspark.sql.functions import col, udf

    from oncelog.spark.session import local_session
    spark = local_session("local[2]", app="oncelog-driver-process",
                          **{"spark.sql.execution.arrow.maxRecordsPerBatch": "10"})
    block = tuple(int(x) for x in args.block_at.split(":")) if args.block_at else None
    flags = args.flags

    def pass_or_block(partition, offset, value):
        if block is not None and (partition, offset) == block:
            open(os.path.join(flags, "blocked"), "w").close()
            deadline = time.monotonic() + 300
            while not os.path.exists(os.path.join(flags, "release")):
                if time.monotonic() > deadline:
                    raise RuntimeError("never released")
                time.sleep(0.05)
        return value

    if args.batch:
        (spark.read.format("oncelog").option("bootstrap.servers", args.bootstrap).option("subscribe", args.source)
         .load().select(col("value"), col("partition"))
         .write.format("oncelog").option("bootstrap.servers", args.bootstrap).option("topic", args.sink)
         .options(**dict(o.split("=", 1) for o in args.option))
         .options(**({"_blockInCommit": f"{args.block_in_commit}:{flags}"} if args.block_in_commit else {}))
         .mode("append").save())
        spark.stop()
        return 0
    reader = (spark.readStream.format("oncelog").option("bootstrap.servers", args.bootstrap)
              .option("subscribe", args.source).option("startingOffsets", "earliest"))
    if args.min_partitions:
        reader = reader.option("minPartitions", args.min_partitions)
    q = (reader.load()
         .select(udf(pass_or_block, "binary")(col("partition"), col("offset"), col("value"))
                 .alias("value"), col("partition"))
         .writeStream.format("oncelog").option("bootstrap.servers", args.bootstrap)
         .option("topic", args.sink).option("checkpointLocation", args.checkpoint)
         .options(**dict(o.split("=", 1) for o in args.option))
         .options(**({"_blockInCommit": f"{args.block_in_commit}:{flags}"} if args.block_in_commit else {}))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Spark connector benchmark: write and read N rows (100-byte values) through format("oncelog")
beside Spark writing and reading the same cached DataFrame as Parquet, in the same run. Writes
with exactly-once on (the default: a transaction per task, committed by the driver) and off
(`deliveryGuarantee=at-least-once`, the idempotent writer); reads read_uncommitted and
read_committed (`kafka.isolation.level`) of the exactly-once output.

    .venv/bin/python bench/spark_connector.py                 # embedded oncelog broker, 1,000,000 rows
    .venv/bin/python bench/spark_connector.py --rows 200000 --bootstrap 127.0.0.1:9092

Reads are forced to materialise every row with the `noop` sink. Ratios are Parquet time /
connector time (1.0 = as fast as Parquet; the goal is >= 0.5). The `floor` steps time a Python
data source that only hands over (or takes) ready-made Arrow batches of the same shape: the cost
of PySpark's Python Data Source API itself, the bound for any connector written on it."""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path


def floor_source(rows_per_partition: int, partitions: int, value_bytes: int):
    """Python data sources that do nothing but hand Spark ready-made Arrow batches of the
    connector's row schema (read), or take and drop them (write): the cost of the Python Data
    Source API itself on this machine, which no connector built on it can go below."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        InputPartition,
        WriterCommitMessage,
    )

    class FloorReader(DataSourceReader):
        def partitions(self):
            return [InputPartition(i) for i in range(partitions)]

        def read(self, partition):
            import numpy as np
            import pyarrow as pa

            from oncelog.spark.arrow_io import arrow_schema
            n = 4096
            cols = [pa.array([b"%d" % i for i in range(n)], pa.binary()),
                    pa.array([b"x" * value_bytes] * n, pa.binary()), pa.array(["t"] * n),
                    pa.array(np.zeros(n, np.int32)), pa.array(np.arange(n, dtype=np.int64)),
                    pa.array(np.zeros(n, np.int64)).cast(pa.timestamp("us", tz="UTC")),
                    pa.array(np.zeros(n, np.int32))]
            batch = pa.RecordBatch.from_arrays(cols, schema=arrow_schema(False))
            for start in range(0, rows_per_partition, n):
                yield batch.slice(0, min(n, rows_per_partition - start))

    class FloorWriter(DataSourceArrowWriter):
        def write(self, iterator):
            for _batch in iterator:
                pass
            return WriterCommitMessage()

    class Floor(DataSource):
        @classmethod
        def name(cls):
            return "bench_floor"

        def schema(self):
            return ("key binary, value binary, topic string, partition int, offset long, "
                    "timestamp timestamp, timestampType int")

        def reader(self, schema):
            return FloorReader()

        def writer(self, schema, overwrite):
            return FloorWriter()

    return Floor


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4, help="topic partitions = DataFrame partitions")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--bootstrap", help="an existing broker (default: start oncelog serve)")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each step; the best is reported")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="oncelog-spark-bench-"))
    broker = None
    if args.bootstrap is None:
        from oncelog.testing.embedded import BrokerProcess
        broker = BrokerProcess(work / "broker").start()
        bootstrap, broker_name = broker.bootstrap, "oncelog serve (embedded)"
    else:
        bootstrap, broker_name = args.bootstrap, f"external {args.bootstrap}"
    from oncelog.client import AdminClient
    from oncelog.spark.session import local_session
    spark = local_session(args.master, app="oncelog-spark-bench")
    try:
        n, vb, parts = args.rows, args.value_bytes, args.partitions
        df = spark.range(n, numPartitions=parts).selectExpr(
            "CAST(id AS STRING) AS key",
            f"CAST(rpad(CAST(id AS STRING), {vb}, 'x') AS BINARY) AS value").cache()
        assert df.count() == n
        # warm-up: Python workers and both code paths, outside the timings
        warm = f"bench-warm-{os.getpid()}"
        with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            admin.create_topics([warm], num_partitions=parts)[warm].result()
        df.limit(1000).write.format("oncelog").option("bootstrap.servers", bootstrap) \
            .option("topic", warm).mode("append").save()
        spark.read.format("oncelog").option("bootstrap.servers", bootstrap) \
            .option("subscribe", warm).load().write.format("noop").mode("overwrite").save()
        df.limit(1000).write.mode("overwrite").parquet(str(work / "warm.parquet"))
        spark.dataSource.register(floor_source(n // parts, parts, vb))
        spark.read.format("bench_floor").load().write.format("noop").mode("overwrite").save()
        df.limit(1000).write.format("bench_floor").mode("append").save()

        results: dict[str, list[float]] = {k: [] for k in
                                           ("parquet_write", "parquet_read", "oncelog_write",
                                            "oncelog_write_at_least_once", "oncelog_read",
                                            "oncelog_read_committed", "floor_write", "floor_read")}
        mismatches: list[str] = []
        for i in range(args.repeat):
            pq = str(work / f"bench-{i}.parquet")
            topic = f"bench-{os.getpid()}-{i}"
            alo = f"bench-alo-{os.getpid()}-{i}"
            with AdminClient({"bootstrap.servers": bootstrap}) as admin:
                for created in admin.create_topics([topic, alo], num_partitions=parts).values():
                    created.result()
            results["parquet_write"].append(timed(lambda pq=pq: df.write.mode("overwrite").parquet(pq)))
            results["parquet_read"].append(timed(
                lambda pq=pq: spark.read.parquet(pq).write.format("noop").mode("overwrite").save()))
            results["oncelog_write"].append(timed(
                lambda topic=topic: df.write.format("oncelog").option("bootstrap.servers", bootstrap)
                .option("topic", topic).mode("append").save()))
            results["oncelog_write_at_least_once"].append(timed(
                lambda alo=alo: df.write.format("oncelog").option("bootstrap.servers", bootstrap)
                .option("topic", alo).option("deliveryGuarantee", "at-least-once")
                .mode("append").save()))
            reader = (spark.read.format("oncelog").option("bootstrap.servers", bootstrap)
                      .option("subscribe", topic))
            results["oncelog_read"].append(timed(
                lambda reader=reader: reader.load().write.format("noop").mode("overwrite").save()))
            committed = (spark.read.format("oncelog").option("bootstrap.servers", bootstrap)
                         .option("subscribe", topic).option("kafka.isolation.level", "read_committed"))
            results["oncelog_read_committed"].append(timed(
                lambda committed=committed: committed.load().write.format("noop")
                .mode("overwrite").save()))
            results["floor_write"].append(timed(
                lambda: df.write.format("bench_floor").mode("append").save()))
            results["floor_read"].append(timed(
                lambda: spark.read.format("bench_floor").load().write.format("noop")
                .mode("overwrite").save()))
            for what, r in (("read_uncommitted", reader), ("read_committed", committed)):
                got = r.load().count()
                if got != n:
                    mismatches.append(f"run {i}: read back {got:,} rows {what}, wrote {n:,}")
            shutil.rmtree(pq, ignore_errors=True)
        best = {k: min(v) for k, v in results.items()}
        out = {
            "rows": n, "value_bytes": vb, "partitions": parts, "master": args.master,
            "broker": broker_name, "python": platform.python_version(),
            "cpus": os.cpu_count(), "runs": results, "best_s": best,
            "ratio_write": best["parquet_write"] / best["oncelog_write"],
            "ratio_read": best["parquet_read"] / best["oncelog_read"],
            "floor_ratio_write": best["parquet_write"] / best["floor_write"],
            "floor_ratio_read": best["parquet_read"] / best["floor_read"],
            "oncelog_write_rows_per_s": n / best["oncelog_write"],
            "exactly_once_vs_at_least_once_write": best["oncelog_write_at_least_once"] / best["oncelog_write"],
            "read_committed_vs_uncommitted": best["oncelog_read"] / best["oncelog_read_committed"],
            "oncelog_read_rows_per_s": n / best["oncelog_read"],
        }
        print(f"{n:,} rows x {vb} B, {parts} partitions, {args.master}, broker: {broker_name}")
        print(f"{'step':<30}{'best s':>9}{'rows/s':>12}   all runs")
        for k, v in best.items():
            print(f"{k:<30}{v:>9.2f}{n / v:>12,.0f}   {', '.join(f'{x:.2f}' for x in results[k])}")
        print(f"connector/Parquet speed ratio: write {out['ratio_write']:.2f}x, "
              f"read {out['ratio_read']:.2f}x (goal >= 0.5x)")
        print(f"exactly-once write / at-least-once write speed: "
              f"{out['exactly_once_vs_at_least_once_write']:.2f}x (goal >= 0.8x); read_committed / "
              f"read_uncommitted speed: {out['read_committed_vs_uncommitted']:.2f}x")
        print(f"a Python data source doing nothing (the API's floor)/Parquet: write "
              f"{out['floor_ratio_write']:.2f}x, read {out['floor_ratio_read']:.2f}x")
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2))
        for m in mismatches:
            print("ERROR:", m)
        return 1 if mismatches else 0
    finally:
        spark.stop()
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

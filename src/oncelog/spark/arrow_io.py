"""Executor-side work: a range of a partition -> Arrow record batches, and Arrow batches -> the
idempotent producer. pyarrow is imported lazily so that planning works without it."""
from __future__ import annotations

import time
from collections.abc import Iterator

from oncelog.client import TopicPartition
from oncelog.spark.options import OncelogSparkError
from oncelog.spark.plan import OffsetRange, connect


def require_pyarrow():
    try:
        import pyarrow
    except ImportError:
        raise OncelogSparkError(
            "the oncelog Spark connector needs pyarrow on the driver and every executor: "
            "pip install 'oncelog[spark]' (or pip install pyarrow), and point PYSPARK_PYTHON at "
            "that interpreter") from None
    return pyarrow


def arrow_schema(include_headers: bool):
    pa = require_pyarrow()
    fields = [pa.field("key", pa.binary()), pa.field("value", pa.binary()),
              pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
              pa.field("offset", pa.int64()), pa.field("timestamp", pa.timestamp("us", tz="UTC")),
              pa.field("timestampType", pa.int32())]
    if include_headers:
        fields.append(pa.field("headers", pa.list_(pa.struct(
            [pa.field("key", pa.string()), pa.field("value", pa.binary())]))))
    return pa.schema(fields)


_SLICE_ROWS = 4096


def read_range(client: dict, r: OffsetRange, include_headers: bool, fail_on_data_loss: bool,
               poll_timeout_ms: int) -> Iterator:
    """The records of an offset range as Arrow record batches (one per fetch), decoded
    column-wise from the fetched record batches (arrow_records)."""
    require_pyarrow()
    from oncelog.spark import arrow_records as ar
    schema = arrow_schema(include_headers)
    if r.end <= r.start:
        return
    cfg = {"max.partition.fetch.bytes": str(8 << 20), "fetch.max.bytes": str(64 << 20), **client}
    cfg.update({"auto.offset.reset": "none", "check.crcs": "true"})
    consumer = connect(cfg, "reader")
    try:
        tp = TopicPartition(r.topic, r.partition)
        start = r.start
        lo = consumer.beginning_offsets([tp]).get(tp) or 0
        if start < lo:
            if fail_on_data_loss:
                raise OncelogSparkError(
                    f"{r.topic}-{r.partition}: offsets {start}..{lo - 1} were deleted (retention or "
                    f"DeleteRecords) before they were read; set failOnDataLoss=false to skip them")
            start = lo
        if start >= r.end:
            return
        consumer.assign([TopicPartition(r.topic, r.partition, start)])
        deadline = time.monotonic() + poll_timeout_ms / 1000
        while True:
            got = consumer.poll_raw(0.5)
            if got:
                deadline = time.monotonic() + poll_timeout_ms / 1000
                cols = ar.Columns()
                for _tp, fetched_from, data in got:
                    ar.decode_into(cols, data, fetched_from, r.end, True, include_headers)
                if cols.rows:
                    # Spark moves small Arrow batches to the JVM faster than big ones (measured:
                    # 2-5k rows about twice as fast as 50k), so a fetch is handed over in slices
                    batch = ar.to_record_batch(cols, r.topic, r.partition, schema)
                    for i in range(0, batch.num_rows, _SLICE_ROWS):
                        yield batch.slice(i, _SLICE_ROWS)
            # the position is exact after each fetch (it can pass the range end with no
            # record: control batches, compacted gaps)
            pos = consumer.position(tp)
            if pos is not None and pos >= r.end:
                break
            if not got and time.monotonic() > deadline:
                raise OncelogSparkError(
                    f"{r.topic}-{r.partition}: no records at offset {pos} "
                    f"for kafkaConsumer.pollTimeoutMs={poll_timeout_ms} while reading up to "
                    f"{r.end}; is the broker up?")
    finally:
        consumer.close()

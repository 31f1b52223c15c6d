"""Executor-side writing: Arrow batches -> oncelog's idempotent producer; and the marker topic
where the streaming sink records which (sink, batch id[, task]) it has fully written."""
from __future__ import annotations

import json
import threading
import time
from typing import Iterable

from oncelog.client import AdminClient, Producer, TopicPartition
from oncelog.spark.options import OncelogSparkError
from oncelog.spark.plan import connect


def open_producer(client: dict) -> Producer:
    try:
        return Producer(dict(client))
    except Exception as e:  # noqa: BLE001
        raise OncelogSparkError(
            f"cannot start a producer for bootstrap.servers={client['bootstrap.servers']!r} "
            f"({type(e).__name__}: {e}); check that the broker is running and reachable") from e


def _column(batch, name: str):
    i = batch.schema.get_field_index(name)
    return None if i < 0 else batch.column(i)


def _as_bytes(values: list) -> list:
    return [v.encode() if isinstance(v, str) else v for v in values]


def write_batches(producer: Producer, batches: Iterable, topic_option: str | None,
                  include_headers: bool) -> int:
    """Send every row; returns the row count once all are acknowledged, raises on the first
    delivery error (the task fails and Spark may retry it)."""
    errors: list = []
    lock = threading.Lock()

    def on_delivery(err, _meta):
        if err is not None:
            with lock:
                if not errors:
                    errors.append(err)

    rows = 0
    send = producer.send
    for batch in batches:
        n = batch.num_rows
        if n == 0:
            continue
        value_col = _column(batch, "value")
        if value_col is None:
            raise OncelogSparkError("the DataFrame written to oncelog needs a `value` column "
                                    "(string or binary)")
        values = _as_bytes(value_col.to_pylist())
        key_col = _column(batch, "key")
        keys = _as_bytes(key_col.to_pylist()) if key_col is not None else [None] * n
        if topic_option:
            topics = None
        else:
            topic_col = _column(batch, "topic")
            if topic_col is None:
                raise OncelogSparkError("set the option `topic` or give the DataFrame a `topic` "
                                        "column")
            topics = topic_col.to_pylist()
            if any(t is None for t in topics):
                raise OncelogSparkError("a row has a null `topic` and no `topic` option is set")
        part_col = _column(batch, "partition")
        parts = part_col.to_pylist() if part_col is not None else None
        headers = None
        if include_headers:
            hcol = _column(batch, "headers")
            if hcol is not None:
                headers = [[(h["key"], h["value"]) for h in hs] if hs else None
                           for hs in hcol.to_pylist()]
        for i in range(n):
            send(topic_option or topics[i], values[i], keys[i],
                 headers[i] if headers else None,
                 parts[i] if parts is not None else None, None, on_delivery)
        rows += n
        if errors:
            break
    producer.flush()
    if errors:
        raise OncelogSparkError(f"producing to oncelog failed: {errors[0]!r}") from (
            errors[0] if isinstance(errors[0], BaseException) else None)
    return rows


# ---------------------------------------------------------------------------- commit markers

def ensure_marker_topic(client: dict, topic: str) -> None:
    try:
        with AdminClient(dict(client)) as admin:
            if topic not in admin.list_topics():
                admin.create_topics([topic], num_partitions=1, exist_ok=True)
    except OncelogSparkError:
        raise
    except Exception as e:  # noqa: BLE001
        raise OncelogSparkError(f"cannot create the commit marker topic {topic!r}: {e}") from e


def read_markers(client: dict, topic: str, sink_id: str, batch_id: int | None = None,
                 window: int = 2000) -> tuple[set[int], set[tuple[int, int]]]:
    """(committed batch ids, {(batch id, task partition id)} fully written) of one sink.

    A sink's markers are appended in batch order and Spark only replays batches after the last
    committed one, so with `batch_id` given the topic is read backwards in growing windows from
    its end until a marker of an earlier batch of this sink shows up: the cost follows the recent
    history, not the topic's size."""
    consumer = connect(client, "markers")
    try:
        tp = TopicPartition(topic, 0)
        end = consumer.end_offsets([tp]).get(tp) or 0
        lo = consumer.beginning_offsets([tp]).get(tp) or 0
        batches: set[int] = set()
        tasks: set[tuple[int, int]] = set()
        want = sink_id.encode()
        while end > lo:
            start = lo if batch_id is None else max(lo, end - window)
            older = _scan_markers(consumer, tp, start, end, want, batches, tasks, batch_id)
            if older or start == lo:
                break
            end, window = start, window * 4
        return batches, tasks
    finally:
        consumer.close()


def _scan_markers(consumer, tp, start: int, end: int, want: bytes, batches: set, tasks: set,
                  batch_id: int | None) -> bool:
    """Adds this sink's markers in [start, end); True if one is from a batch before batch_id."""
    consumer.assign([TopicPartition(tp.topic, tp.partition, start)])
    older = False
    nxt = start
    deadline = time.monotonic() + 60
    while nxt < end:
        got = consumer.poll(1.0)
        if not got:
            pos = consumer.position(tp)
            if pos is not None and pos >= end:
                break
            if time.monotonic() > deadline:
                raise OncelogSparkError(f"cannot read the commit markers in {tp.topic} "
                                        f"(stuck at offset {pos} of {end})")
            continue
        deadline = time.monotonic() + 60
        for r in got:
            nxt = r.offset + 1
            if r.offset >= end or r.key != want:
                continue
            m = json.loads(r.value)
            b = int(m["batch"])
            if batch_id is not None and b < batch_id:
                older = True
            if m.get("task") is None:
                batches.add(b)
            else:
                tasks.add((b, int(m["task"])))
    return older


def write_marker(producer: Producer, topic: str, sink_id: str, batch_id: int,
                 task: int | None, rows: int) -> None:
    value = json.dumps({"sink": sink_id, "batch": batch_id, "task": task, "rows": rows},
                       sort_keys=True).encode()
    producer.send(topic, value, sink_id.encode(), partition=0).result(60)

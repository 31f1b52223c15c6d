"""A member flood on one KIP-848 consumer group (issue 36, finding 2): what a join costs as the group
grows, and what the flood does to another client.

    .venv/bin/python bench/group_flood.py [--members 1250] [--connections 4] [--partitions 48]
                                          [--window 50] [--expire] [--baseline SRC]

One `oncelog serve` (defaults). Members join one group over raw ConsumerGroupHeartbeat v1 requests
(epoch 0, a fresh member id each) from --connections connections at once, each connection one
request at a time; they subscribe to one topic of --partitions partitions and never heartbeat
again during the joins (as in the issue's reproduction). Measured:
- per-join cost at 250, 1,000 and 1,250 members: the --window joins before each mark, as wall time
  per join (the broker serves one request at a time, so this is its cost) and as each join's
  latency (p50);
- another client's ApiVersions latency (p50, p99, max), one request every 10 ms on its own
  connection, during the joins up to 1,200 members, then during a heartbeat burst (every member
  heartbeats once at its epoch from the same connections), and with --expire while the broker
  fences the abandoned members after `group.consumer.session.timeout.ms` (45 s, Kafka's minimum).
--baseline SRC runs the same flood first against the broker of another source tree (e.g. a
checkout of main before the fix: `--baseline /path/to/main/src`) and prints the ratios.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.raw_client import RawConnection

HB = ApiKey.CONSUMER_GROUP_HEARTBEAT
MARKS = (250, 1000, 1250)
PROBE_MARK = 1200


class Prober(threading.Thread):
    """ApiVersions every 10 ms on its own connection; latencies by phase."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.conn = RawConnection(bootstrap, timeout_s=60)
        self.phase: str | None = None
        self.samples: dict[str, list[float]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            phase = self.phase
            t = time.perf_counter()
            assert self.conn.api_versions() == 0
            took = time.perf_counter() - t
            if phase is not None:
                self.samples.setdefault(phase, []).append(took)
            time.sleep(0.01)


class Joiner:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.conn = RawConnection(bootstrap, timeout_s=120)
        self.topic = topic
        self.members: list[list] = []   # [member id, epoch]

    def join(self) -> float:
        mid = str(uuid.uuid4())
        t = time.perf_counter()
        r = self.conn.call(HB, 1, group_id="flood", member_id=mid, member_epoch=0, instance_id=None, rack_id=None,
                           rebalance_timeout=300000, subscribed_topic_names=(self.topic,),
                           subscribed_topic_regex=None, server_assignor=None, topic_partitions=())
        took = time.perf_counter() - t
        assert int(r.error_code) == 0, r
        self.members.append([mid, int(r.member_epoch)])
        return took

    def heartbeat_all(self) -> None:
        for m in self.members:
            r = self.conn.call(HB, 1, group_id="flood", member_id=m[0], member_epoch=m[1], instance_id=None,
                               rack_id=None, rebalance_timeout=-1, subscribed_topic_names=None,
                               subscribed_topic_regex=None, server_assignor=None,
                               topic_partitions=())
            assert int(r.error_code) == 0, r
            m[1] = int(r.member_epoch)


def run_parallel(joiners: list[Joiner], work) -> None:
    threads = [threading.Thread(target=work, args=(j,)) for j in joiners]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def join_until(joiners: list[Joiner], target: int, latencies: list[float] | None = None) -> float:
    """Join members until the group has `target`; the wall time it took."""
    lock = threading.Lock()
    count = [sum(len(j.members) for j in joiners)]

    def work(j: Joiner) -> None:
        while True:
            with lock:
                if count[0] >= target:
                    return
                count[0] += 1
            took = j.join()
            if latencies is not None:
                with lock:
                    latencies.append(took)

    t = time.perf_counter()
    run_parallel(joiners, work)
    return time.perf_counter() - t


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def flood(args, src: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-flood-") as d:
        env = {"PYTHONPATH": src} if src else {}
        broker = BrokerProcess(Path(d) / "data", env=env).start()
        try:
            with RawConnection(broker.bootstrap) as admin:
                ct = entities.nested(ApiKey.CREATE_TOPICS, 7, "request", "CreatableTopic")
                r = admin.call(ApiKey.CREATE_TOPICS, 7, topics=(ct(name="flood-topic", num_partitions=args.partitions,
                                                                   replication_factor=1, assignments=(),
                                                                   configs=()),),
                               timeout=10000, validate_only=False)
                assert int(r.topics[0].error_code) == 0, r
            joiners = [Joiner(broker.bootstrap, "flood-topic") for _ in range(args.connections)]
            prober = Prober(broker.bootstrap)
            prober.start()
            out: dict = {"join_ms": {}, "join_p50_ms": {}}
            prober.phase = "joins"
            for mark in MARKS:
                join_until(joiners, mark - args.window)
                lat: list[float] = []
                wall = join_until(joiners, mark, lat)
                if mark > PROBE_MARK:
                    prober.phase = None
                out["join_ms"][mark] = wall / args.window * 1000
                out["join_p50_ms"][mark] = statistics.median(lat) * 1000
                print(f"  {mark:5d} members: {out['join_ms'][mark]:7.2f} ms per join (wall), "
                      f"join latency p50 {out['join_p50_ms'][mark]:7.2f} ms", flush=True)
            prober.phase = "burst"
            t = time.perf_counter()
            run_parallel(joiners, Joiner.heartbeat_all)
            out["burst_s"] = time.perf_counter() - t
            prober.phase = None
            if args.expire:
                prober.phase = "expiry"
                deadline = time.monotonic() + 45 + 120
                with RawConnection(broker.bootstrap, timeout_s=60) as c:
                    while time.monotonic() < deadline:
                        r = c.call(ApiKey.CONSUMER_GROUP_DESCRIBE, 1, group_ids=("flood",),
                                   include_authorized_operations=False)
                        if not r.groups[0].members:
                            break
                        time.sleep(0.5)
                prober.phase = None
            prober.stop.set()
            prober.join()
            out["probe"] = {k: (pct(v, 0.5) * 1000, pct(v, 0.99) * 1000, max(v) * 1000, len(v))
                            for k, v in prober.samples.items()}
            size = sum(p.stat().st_size for p in (Path(d) / "data" / "__consumer_offsets").glob("flood.*"))
            out["group_bytes"] = size
            return out
        finally:
            broker.stop()


def report(name: str, r: dict) -> None:
    print(f"{name}:")
    for mark in MARKS:
        print(f"  join at {mark:5d} members: {r['join_ms'][mark]:7.2f} ms per join, "
              f"latency p50 {r['join_p50_ms'][mark]:7.2f} ms")
    print(f"  heartbeat burst ({MARKS[-1]} members): {r['burst_s']:.2f} s")
    for phase, (p50, p99, mx, n) in r["probe"].items():
        print(f"  ApiVersions during {phase:6s}: p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  max {mx:8.2f} ms  ({n} samples)")
    print(f"  the group's files: {r['group_bytes'] / 1e6:.2f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=MARKS[-1])
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--partitions", type=int, default=48)
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument("--expire", action="store_true")
    ap.add_argument("--baseline", help="another source tree's src/ to run first, for the ratios")
    args = ap.parse_args()
    results = {}
    if args.baseline:
        print(f"baseline ({args.baseline}):", flush=True)
        results["baseline"] = flood(args, args.baseline)
    print("this tree:", flush=True)
    results["this"] = flood(args, None)
    for name, r in results.items():
        report(name, r)
    flat = results["this"]["join_ms"][MARKS[-1]] / results["this"]["join_ms"][MARKS[0]]
    print(f"join cost at {MARKS[-1]} / at {MARKS[0]} members: {flat:.2f}")
    if "baseline" in results:
        b, t = results["baseline"], results["this"]
        for mark in MARKS:
            print(f"baseline / this, join at {mark}: {b['join_ms'][mark] / t['join_ms'][mark]:.1f}x")
        print(f"baseline / this, ApiVersions p99 during joins: "
              f"{b['probe']['joins'][1] / t['probe']['joins'][1]:.1f}x")


if __name__ == "__main__":
    sys.exit(main())

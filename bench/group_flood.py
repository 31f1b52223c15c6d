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

    .venv/bin/python bench/group_flood.py --commits 30 [--commit-partitions 2000] [--metadata 4096]
                                          [--txn] [--baseline SRC]

--commits N instead: one client commits the offsets of every partition of a topic of
--commit-partitions partitions, N times in a row, for one group (OffsetCommit v8 of a consumer using
assign; with --txn, each time a transaction of its own: AddOffsetsToTxn, TxnOffsetCommit v3 and
EndTxn, whose marker makes the offsets the group's); each offset carries --metadata characters of
metadata (4,096 is `offset.metadata.max.bytes`). Measured: the commits' latency (p50, max), and
another client's ApiVersions latency meanwhile (issue 36: each commit rewrote and fsynced the
group's whole offsets file, or the producer's pending offsets, on the event loop).
"""
from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.primitives import Reader
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.raw_client import RawConnection, request_body

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


def _probe(bootstrap: str, out, stop) -> None:
    """ApiVersions every 10 ms until `stop`; (start, latency) of each, sent back at the end."""
    conn = RawConnection(bootstrap, timeout_s=60)
    samples = []
    while not stop.is_set():
        t = time.monotonic()
        assert conn.api_versions() == 0
        samples.append((t, time.monotonic() - t))
        time.sleep(0.01)
    out.send(samples)


class ProcessProber:
    """`Prober` in a process of its own, so that this process's work (encoding requests of
    thousands of partitions holds its interpreter lock for tens of ms) never delays a probe;
    the phases are windows of the system's monotonic clock."""

    def __init__(self, bootstrap: str) -> None:
        ctx = multiprocessing.get_context("fork")
        self._stop = ctx.Event()
        self._out, child = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_probe, args=(bootstrap, child, self._stop), daemon=True)
        self._proc.start()
        self.windows: dict[str, tuple[float, float]] = {}

    def during(self, phase: str, start: float, end: float) -> None:
        self.windows[phase] = (start, end)

    def finish(self) -> dict[str, list[float]]:
        self._stop.set()
        samples = self._out.recv()
        self._proc.join(30)
        return {phase: [took for t, took in samples if start <= t <= end]
                for phase, (start, end) in self.windows.items()}


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


def commits(args, src: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-commits-") as d:
        env = {"PYTHONPATH": src} if src else {}
        broker = BrokerProcess(Path(d) / "data", env=env).start()
        try:
            n = args.commit_partitions
            with RawConnection(broker.bootstrap, timeout_s=120) as c:
                ct = entities.nested(ApiKey.CREATE_TOPICS, 7, "request", "CreatableTopic")
                r = c.call(ApiKey.CREATE_TOPICS, 7, topics=(ct(name="commits", num_partitions=n, replication_factor=1,
                                                               assignments=(), configs=()),),
                           timeout=60000, validate_only=False)
                assert int(r.topics[0].error_code) == 0, r
                pid = epoch = -1
                if args.txn:
                    deadline = time.monotonic() + 60
                    while True:   # the transaction log's partitions are created by the first request
                        r = c.call(ApiKey.INIT_PRODUCER_ID, 4, transactional_id="bench-commits",
                                   transaction_timeout=60000, producer_id=-1, producer_epoch=-1)
                        if int(r.error_code) == 0 or time.monotonic() > deadline:
                            break
                        time.sleep(0.1)
                    assert int(r.error_code) == 0, r
                    pid, epoch = int(r.producer_id), int(r.producer_epoch)
                prober = ProcessProber(broker.bootstrap)
                metadata = "m" * args.metadata
                # each commit's request encoded beforehand: encoding thousands of partitions in this
                # process would hold its interpreter lock while the commit is measured
                tp = entities.nested(ApiKey.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestTopic")
                pp = entities.nested(ApiKey.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestPartition")
                bodies = [_txn_commit_body(pid, epoch, n, i, metadata) if args.txn else request_body(
                    ApiKey.OFFSET_COMMIT, 8, dict(group_id="bench-commits", generation_id_or_member_epoch=-1,
                                                  member_id="", group_instance_id=None, topics=(tp(
                                                      name="commits", partitions=tuple(
                                                          pp(partition_index=p, committed_offset=i,
                                                             committed_leader_epoch=-1, committed_metadata=metadata)
                                                          for p in range(n))),)))
                          for i in range(args.commits + 1)]
                latencies = []
                for i, body in enumerate(bodies):   # the first one, not measured, creates the group
                    if i == 1:
                        start = time.monotonic()
                    t = time.perf_counter()
                    if args.txn:
                        code = _txn_commit(c, pid, epoch, body)
                    else:
                        code = _codes(c.exchange(ApiKey.OFFSET_COMMIT, 8, body))
                    if i:
                        latencies.append(time.perf_counter() - t)
                    assert code in ({0}, 0), code
                prober.during("commits", start, time.monotonic())
            probe = prober.finish()["commits"]
            size = sum(p.stat().st_size for p in (Path(d) / "data" / "__consumer_offsets").rglob("*") if p.is_file())
            return {"commit_ms": (pct(latencies, 0.5) * 1000, max(latencies) * 1000),
                    "probe": {"commits": (pct(probe, 0.5) * 1000, pct(probe, 0.99) * 1000, max(probe, default=0) * 1000,
                                          len(probe))},
                    "offsets_bytes": size}
        finally:
            broker.stop()


def _codes(body: bytes) -> set[int]:
    """The error codes of an OffsetCommit/TxnOffsetCommit answer (v8 / v3: flexible), read by hand
    (kio would hold this process's interpreter lock for thousands of partitions)."""
    r = Reader(body)
    r.i32()                                        # throttle time
    codes = set()
    for _t in range(r.uvarint() - 1):
        r.string(True)
        for _p in range(r.uvarint() - 1):
            r.i32()
            codes.add(r.i16())
            r.uvarint()                            # tagged fields
        r.uvarint()
    return codes


def _txn_commit_body(pid: int, epoch: int, n: int, i: int, metadata: str) -> bytes:
    tp = entities.nested(ApiKey.TXN_OFFSET_COMMIT, 3, "request", "TxnOffsetCommitRequestTopic")
    pp = entities.nested(ApiKey.TXN_OFFSET_COMMIT, 3, "request", "TxnOffsetCommitRequestPartition")
    return request_body(ApiKey.TXN_OFFSET_COMMIT, 3, dict(
        transactional_id="bench-commits", group_id="bench-commits", producer_id=pid, producer_epoch=epoch,
        generation_id=-1, member_id="", group_instance_id=None, topics=(tp(name="commits", partitions=tuple(
            pp(partition_index=p, committed_offset=i, committed_leader_epoch=-1, committed_metadata=metadata)
            for p in range(n))),)))


def _txn_commit(c: RawConnection, pid: int, epoch: int, body: bytes) -> int:
    """One transaction that commits the offsets in `body`: its code (0 throughout)."""
    while True:   # the previous transaction's markers may still be on their way
        r = c.call(ApiKey.ADD_OFFSETS_TO_TXN, 3, transactional_id="bench-commits", producer_id=pid,
                   producer_epoch=epoch, group_id="bench-commits")
        if int(r.error_code) != 51:   # CONCURRENT_TRANSACTIONS
            break
        time.sleep(0.005)
    assert int(r.error_code) == 0, r
    codes = _codes(c.exchange(ApiKey.TXN_OFFSET_COMMIT, 3, body))
    assert codes == {0}, codes
    r = c.call(ApiKey.END_TXN, 3, transactional_id="bench-commits", producer_id=pid, producer_epoch=epoch,
               committed=True)
    return int(r.error_code)


def report_commits(name: str, r: dict) -> None:
    print(f"{name}:")
    print(f"  commit latency p50 {r['commit_ms'][0]:8.2f} ms  max {r['commit_ms'][1]:8.2f} ms")
    p50, p99, mx, n = r["probe"]["commits"]
    print(f"  ApiVersions during the commits: p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  max {mx:8.2f} ms  ({n} samples)")
    print(f"  the offsets' files: {r['offsets_bytes'] / 1e6:.2f} MB")


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
    ap.add_argument("--commits", type=int, default=0, help="instead: this many commits of every partition")
    ap.add_argument("--commit-partitions", type=int, default=2000)
    ap.add_argument("--metadata", type=int, default=4096, help="characters of metadata per committed offset")
    ap.add_argument("--txn", action="store_true", help="--commits as transactions (TxnOffsetCommit, EndTxn)")
    args = ap.parse_args()
    results = {}
    run, show = (commits, report_commits) if args.commits else (flood, report)
    if args.baseline:
        print(f"baseline ({args.baseline}):", flush=True)
        results["baseline"] = run(args, args.baseline)
    print("this tree:", flush=True)
    results["this"] = run(args, None)
    for name, r in results.items():
        show(name, r)
    if args.commits:
        if "baseline" in results:
            print(f"baseline / this, ApiVersions p99 during the commits: "
                  f"{results['baseline']['probe']['commits'][1] / results['this']['probe']['commits'][1]:.1f}x")
        return
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

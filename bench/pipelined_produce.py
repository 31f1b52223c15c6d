"""Produce requests pipelined on one connection (issue 24), before and after, in one run.

    .venv/bin/python bench/pipelined_produce.py --tree before=/tmp/before/src [--tree strict=...]
        [--records 4000] [--rounds 3] [--json out.json]

The broker handles one request per connection at a time; an acks=all Produce that has appended
everything and only waits for its fsync lets the Produce requests behind it be appended (they
join its group commit). Each tree (this checkout, and every `--tree NAME=SRC`, a `src` directory
the broker processes import oncelog from) gets a fresh `oncelog serve`; rounds alternate the
trees, each case on a fresh topic, 1 KB records, acks=all, one partition:
  rdk-1rec          librdkafka idempotent, one record per request (batch.num.messages=1,
                    linger.ms=0): up to 5 requests in flight on one connection
  rdk-txn-1rec      the same, transactional, a commit every 500 records
  oncelog-1rec      oncelog's producer, batch.size=1, linger.ms=0, max.in.flight 5
  rdk-16k           librdkafka idempotent, batch.size=16384, linger.ms=5 (batches of 16)
  rdk-8conn-1rec    8 librdkafka producers (8 connections), each one request at a time, one
                    record per request: what the group commit shares across connections
Then, on a controller and 2 brokers per tree (`--no-cluster` to skip): librdkafka transactional,
one record per request, to a partition whose leader verifies with the coordinator on the other
broker (rdk-txn-2brokers); a tree that fails it is reported as failing.
Prints records/s per case and tree (each round, and the best) and, per tree, the median over the
rounds of its ratio to this tree in the same round (the machine's load drifts between rounds).
`--count-fsyncs` also counts the segment fsyncs of each case (the storage failpoints' ledger): what
the group commit saved, which a busy machine's noise does not blur as it blurs the rates.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog.storage import failpoints
from oncelog.testing.cluster import LocalCluster
from oncelog.testing.embedded import BrokerProcess

VALUE = os.urandom(1000)
ONE_PER_REQUEST = {"batch.num.messages": 1, "linger.ms": 0}


def rdk(bootstrap: str, topic: str, n: int, transactional_id: str | None = None, commit_every: int = 500,
        **conf) -> float:
    """records/s of one librdkafka producer writing n records to partition 0."""
    errors: list = []
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "queue.buffering.max.messages": 1000000, "log_level": 3,
                  **({"transactional.id": transactional_id} if transactional_id else {}), **conf})

    def cb(err, _msg):
        if err is not None:
            errors.append(err)
    if transactional_id:
        p.init_transactions(30)
    else:
        p.produce(topic, VALUE, partition=0, on_delivery=cb)   # metadata and producer id first
        p.flush(30)
    start = time.monotonic()
    for i in range(n):
        if transactional_id and i % commit_every == 0:
            if i:
                p.commit_transaction(60)
            p.begin_transaction()
        while True:
            try:
                p.produce(topic, VALUE, partition=0, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    if transactional_id:
        p.commit_transaction(60)
    p.flush(60)
    elapsed = time.monotonic() - start
    if errors:
        raise RuntimeError(f"{len(errors)} records failed, first {errors[0]}")
    return n / elapsed


def oncelog_producer(bootstrap: str, topic: str, n: int) -> float:
    from oncelog.client import Producer as OncelogProducer
    errors: list = []

    def cb(err, _meta):
        if err is not None:
            errors.append(err)
    with OncelogProducer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": "required",
                          "batch.size": "1", "linger.ms": "0", "max.in.flight.requests.per.connection": "5",
                          "buffer.memory": str(256 << 20)}) as p:
        p.send(topic, VALUE, partition=0).result(30)
        start = time.monotonic()
        for _ in range(n):
            p.send(topic, VALUE, partition=0, on_delivery=cb)
        p.flush()
        elapsed = time.monotonic() - start
    if errors:
        raise RuntimeError(f"{len(errors)} records failed, first {errors[0]}")
    return n / elapsed


def rdk_connections(bootstrap: str, topic: str, n: int, connections: int = 8) -> float:
    """records/s of `connections` producers at once, each one request at a time."""
    share = n // connections
    out: list = []

    def one(k: int) -> None:
        try:
            rdk(bootstrap, topic, share, **ONE_PER_REQUEST, **{"max.in.flight.requests.per.connection": 1})
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            out.append(e)
    threads = [threading.Thread(target=one, args=(k,)) for k in range(connections)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if out:
        raise RuntimeError(str(out[0]))
    return share * connections / (time.monotonic() - start)


CASES = {
    "rdk-1rec": lambda b, t, n: rdk(b, t, n, **ONE_PER_REQUEST),
    "rdk-txn-1rec": lambda b, t, n: rdk(b, t, n, transactional_id=f"bench-{t}", **ONE_PER_REQUEST),
    "oncelog-1rec": oncelog_producer,
    "rdk-16k": lambda b, t, n: rdk(b, t, n, **{"batch.size": 16384, "linger.ms": 5}),
    "rdk-8conn-1rec": rdk_connections,
}


def env_for(src: str | None, count_fsyncs: bool = False) -> dict[str, str]:
    env = {"PYTHONPATH": src} if src else {}
    if count_fsyncs:   # every fsync of a segment leaves a line in its directory's ledger
        env[failpoints.ENV] = "ledger:log"
    return env


def fsyncs(data: Path, topic: str) -> int:
    try:
        return len((data / f"{topic}-0" / failpoints.LEDGER).read_text().splitlines())
    except FileNotFoundError:
        return 0


def single_broker_rounds(trees: dict[str, str | None], args, root: Path, results: dict) -> None:
    brokers = {name: BrokerProcess(root / name / "data", env=env_for(src, args.count_fsyncs)).start(timeout_s=60)
               for name, src in trees.items()}
    try:
        for b in brokers.values():
            admin = AdminClient({"bootstrap.servers": b.bootstrap, "log_level": 3})
            topics = [f"{c}-{i}" for c in args.cases for i in range(args.rounds)]
            for f in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
                f.result(30)
        for i in range(args.rounds):
            order = list(trees) if i % 2 == 0 else list(trees)[::-1]
            for case in args.cases:
                for name in order:
                    rate = CASES[case](brokers[name].bootstrap, f"{case}-{i}", args.records)
                    results.setdefault(case, {}).setdefault(name, []).append(rate)
                    if args.count_fsyncs:
                        n = fsyncs(brokers[name].data_dir, f"{case}-{i}")
                        results.setdefault(f"{case} fsyncs/100 records", {}).setdefault(name, []).append(
                            100 * n / args.records)
                print(f"round {i + 1} {case:<15} " + ", ".join(
                    f"{name} {results[case][name][-1]:8.0f}" for name in trees) + " records/s", flush=True)
    finally:
        for b in brokers.values():
            b.stop()


def cluster_case(trees: dict[str, str | None], args, root: Path, results: dict) -> None:
    """librdkafka transactional, one record per request, to a leader whose coordinator is the
    other broker; a tree that fails it gets the failure instead of a rate."""
    for name, src in trees.items():
        c = LocalCluster(root / f"cluster-{name}", 2, {"transaction.state.log.num.partitions": "1"},
                         proxies=False, env=env_for(src)).start()
        try:
            admin = AdminClient({"bootstrap.servers": c.bootstrap, "log_level": 3})
            admin.create_topics([NewTopic("piped", 1, 1)])["piped"].result(30)
            warm_up = Producer({"bootstrap.servers": c.bootstrap, "transactional.id": "warm-up", "log_level": 3})
            warm_up.init_transactions(30)   # creates __transaction_state
            del warm_up
            c.place("__transaction_state", {0: 1})
            c.place("piped", {0: 2})
            try:
                rate = rdk(c.bootstrap, "piped", args.records // 4, transactional_id=f"bench-2brokers-{name}",
                           commit_every=100, **ONE_PER_REQUEST)
                results.setdefault("rdk-txn-2brokers", {})[name] = [rate]
                print(f"rdk-txn-2brokers {name}: {rate:.0f} records/s", flush=True)
            except (KafkaException, RuntimeError) as e:
                results.setdefault("rdk-txn-2brokers", {})[name] = f"failed: {e}"[:300]
                print(f"rdk-txn-2brokers {name}: failed: {e}"[:300], flush=True)
        finally:
            c.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", default=[], help="NAME=SRC: another source tree's src")
    ap.add_argument("--records", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, of " + ", ".join(CASES))
    ap.add_argument("--no-cluster", action="store_true")
    ap.add_argument("--count-fsyncs", action="store_true",
                    help="brokers keep the fsync ledger (ONCELOG_FAILPOINTS=ledger:log): fsyncs per 100 records "
                         "are reported too (the ledger's write costs a little throughput)")
    ap.add_argument("--json")
    args = ap.parse_args()
    args.cases = args.cases.split(",")
    if set(args.cases) - set(CASES):
        ap.error(f"unknown cases {sorted(set(args.cases) - set(CASES))}")
    trees: dict[str, str | None] = {"this": None}
    for spec in args.tree:
        name, _, src = spec.partition("=")
        trees[name] = str(Path(src).resolve())
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-pipelined-") as tmp:
        single_broker_rounds(trees, args, Path(tmp), results)
        if not args.no_cluster:
            cluster_case(trees, args, Path(tmp), results)
    print(f"load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    others = [n for n in trees if n != "this"]
    print(f"\nbest of the rounds, records/s; and the median over rounds of each round's ratio to this tree"
          f"\n{'case':<34}" + "".join(f"{name:>10}" for name in trees)
          + "".join(f"{name + '/this':>14}" for name in others))
    for case, by_tree in results.items():
        runs = {n: v for n, v in by_tree.items() if isinstance(v, list)}
        best = min if "fsyncs" in case else max
        digits = 1 if "fsyncs" in case else 0
        cells = "".join(f"{best(runs[n]):10.{digits}f}" if n in runs else f"{'failed':>10}" for n in trees)
        ratios = "".join(f"{statistics.median(a / b for a, b in zip(runs[n], runs['this'])):14.2f}"
                         if n in runs and "this" in runs else f"{'-':>14}" for n in others)
        print(f"{case:<34}{cells}{ratios}")
    if args.json:
        Path(args.json).write_text(json.dumps({"records": args.records, "rounds": args.rounds,
                                               "trees": trees, "results": results}, indent=2))


if __name__ == "__main__":
    main()

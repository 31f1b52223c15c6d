"""CPU per record of the producer's two threads: the caller's (`produce`/`send`) and the sender
loop's (handoff, batching, encoding, requests, delivery).

    .venv/bin/python bench/producer_cpu.py [--records 100000] [--rounds 3] [--transactional]

Steadier than records/sec on a shared machine: it counts each thread's own CPU time
(`time.thread_time` for the caller, the loop thread's CPU clock for the sender), so another job's
load changes it far less than it changes throughput. The low-latency loop of bench/inflight.py
(1 KB records, one partition, `batch.size` 262144, `linger.ms` 5, acks=all, idempotent) against an
embedded `oncelog serve`. To compare two versions, run it with each on PYTHONPATH, alternated.
`--transactional` adds a transactional producer's run of each call, its records in one
transaction (begin before the loop, commit inside the timed part): what a transaction costs per
record, apart from the per-transaction round trips.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from oncelog.client import AdminClient, Producer
from oncelog.testing.embedded import BrokerProcess


def _thread_cpu(thread) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def run(bootstrap: str, topic: str, n: int, api: str, transactional: bool = False) -> dict:
    conf = {"bootstrap.servers": bootstrap, "enable.idempotence": "required", "acks": "all",
            "linger.ms": "5", "batch.size": "262144", "buffer.memory": str(256 << 20),
            "max.request.size": str(4 << 20)}
    if transactional:
        conf["transactional.id"] = f"cpu-{topic}"
    payload = os.urandom(1024)
    errors = []

    def cb(err, msg):
        if err is not None:
            errors.append(err)
    with Producer(conf) as p:
        if transactional:
            p.init_transactions(60)
            p.begin_transaction()
        p.produce(topic, payload, on_delivery=cb)
        if transactional:
            p.commit_transaction(60)
        p.flush(60)
        loop_thread = p._lt.thread
        call = p.produce if api == "produce" else p.send
        loop0, caller0, wall0 = _thread_cpu(loop_thread), time.thread_time(), time.monotonic()
        if transactional:
            p.begin_transaction()
        for _ in range(n):
            call(topic, payload, on_delivery=cb)
        caller1 = time.thread_time()
        if transactional:
            p.commit_transaction(600)
        p.flush(600)
        loop1, wall1 = _thread_cpu(loop_thread), time.monotonic()
    if errors:
        raise RuntimeError(f"{len(errors)} records failed, the first with {errors[0]!r}")
    return {"caller_us": (caller1 - caller0) / n * 1e6, "loop_us": (loop1 - loop0) / n * 1e6,
            "records_per_sec": n / (wall1 - wall0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--transactional", action="store_true",
                    help="also a transactional run of each call (one transaction per run)")
    args = ap.parse_args()
    import oncelog
    print(f"oncelog from {os.path.dirname(oncelog.__file__)}", flush=True)
    apis = ["produce", "send"]
    if args.transactional:
        apis += ["produce-txn", "send-txn"]
    runs: dict[str, list[dict]] = {api: [] for api in apis}
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as data:
        broker = BrokerProcess(data).start()
        try:
            with AdminClient({"bootstrap.servers": broker.bootstrap}) as admin:
                topics = [f"cpu-{api}-{i}" for api in apis for i in range(args.rounds)]
                for created in admin.create_topics(topics).values():
                    created.result()
            for i in range(args.rounds):
                for api in apis:
                    r = run(broker.bootstrap, f"cpu-{api}-{i}", args.records,
                            api.removesuffix("-txn"), api.endswith("-txn"))
                    runs[api].append(r)
                    print(f"  round {i + 1} {api:11}: caller {r['caller_us']:.2f} µs, sender loop "
                          f"{r['loop_us']:.2f} µs per record ({r['records_per_sec']:.0f} rec/s)",
                          flush=True)
        finally:
            broker.stop()
    for api in apis:
        med = {k: statistics.median(r[k] for r in runs[api]) for k in ("caller_us", "loop_us")}
        print(f"{api:11} median: caller {med['caller_us']:.2f} µs, sender loop {med['loop_us']:.2f} µs "
              f"per record")


if __name__ == "__main__":
    main()

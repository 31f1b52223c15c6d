"""KIP-1269's table, reproduced: producer throughput against in-flight requests at a high round
trip, and the low-latency comparison with librdkafka.

    .venv/bin/python bench/inflight.py [--rtt-ms 50] [--seconds 4] [--png docs/bench-inflight.png]

One oncelog broker (subprocess, `oncelog serve`) behind a delay proxy (RTT/2 each way; the broker
advertises the proxy so every client goes through it). Same run, same broker, 1 KB records,
acks=all, idempotence on, 1 partition per topic:
- oncelog producer, max.in.flight.requests.per.connection = W and a topic with
  producer.state.batches.to.retain = max(W, 5), for W in 1, 5, 10, 20, 50;
- librdkafka (confluent-kafka), which caps idempotent in-flight at 5;
both with batch.size 16384 and linger.ms 5, so that a batch holds 16 records.
Then, without the proxy: oncelog vs librdkafka producing 1 KB records as fast as they can.

    .venv/bin/python bench/inflight.py --transactional-id bench-txn [--transaction-duration-ms 3000]

The same table as the seed ran it (`kafka-producer-perf-test --transactional-id`): every producer
transactional, committing as Kafka's ProducerPerformance does (after the send that finds the
transaction `--transaction-duration-ms` old, default 3000 as Kafka's tool), each beside its
idempotent run in the same invocation; librdkafka's transactional producer (in-flight capped at 5
as for idempotence). oncelog's producer runs its transactions twice: in Transactions V2 (the
default, the broker finalizing transaction.version 2: no AddPartitionsToTxn, an epoch bump per
EndTxn) and in V1 (`oncelog.transaction.v2.enable=false`, AddPartitionsToTxn before a
partition's first batch of each transaction, as librdkafka), V2/V1 printed. Then the cost of
transactions at low latency: idempotent vs transactional throughput of both clients (oncelog's
in V2 and V1), rounds alternated on one broker without the proxy, at each of
`--low-latency-durations` (ms per transaction), ratios printed. Plot: docs/bench-inflight-txn.png.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from oncelog.client import AdminClient
from oncelog.testing.embedded import BrokerProcess, ServerProcess, free_port
from oncelog.testing.fault_proxy import FaultConfig, FaultProxyProcess
from oncelog.testing.perf import run_produce

WINDOWS = [1, 5, 10, 20, 50]
V1 = {"oncelog.transaction.v2.enable": "false"}   # oncelog's producer in Transactions V1
PNG = "docs/bench-inflight.png"
PNG_TXN = "docs/bench-inflight-txn.png"


def server(data_dir: str, overrides: dict, standin_windows: dict | None = None) -> ServerProcess:
    """`oncelog serve` in a child process, or bench/inflight_broker.py (the stand-in), started."""
    if standin_windows is None:
        return BrokerProcess(Path(data_dir) / "broker", overrides).start(timeout_s=60)
    cmd = [sys.executable, os.path.join(os.path.dirname(__file__), "inflight_broker.py")]
    adv = overrides.get("advertised.listeners")
    if adv:
        cmd += ["--advertise", adv.split("://", 1)[1]]
    for t, w in standin_windows.items():
        cmd += ["--window", f"{t}={w}"]
    return ServerProcess(cmd).start(timeout_s=60)


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def create_topics(self, topics, **kw):
        # as AdminClient.create_topics: a future per topic, here done at once
        import concurrent.futures
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(None)
        return dict.fromkeys(topics, done)


def librdkafka_produce(bootstrap: str, topic: str, n: int, record_size: int,
                       transaction_ms: int | None = None, transactional_id: str | None = None,
                       **extra) -> dict:
    """librdkafka's loop; with `transaction_ms`, in transactions committed as Kafka's
    ProducerPerformance commits them (after the send that finds the transaction that old)."""
    import confluent_kafka
    conf = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "batch.size": 16384, "queue.buffering.max.messages": 1000000,
            "queue.buffering.max.kbytes": 2097151}
    if transaction_ms is not None:
        conf["transactional.id"] = transactional_id or f"bench-librdkafka-{topic}"
    conf.update(extra)
    p = confluent_kafka.Producer(conf)
    payload = os.urandom(record_size)
    errors = []

    def cb(err, msg):
        if err is not None:
            errors.append(err)
    txn = transaction_ms is not None
    if txn:
        p.init_transactions(60)
        p.begin_transaction()
    p.produce(topic, payload, on_delivery=cb)
    if txn:
        p.commit_transaction(60)
    p.flush(60)
    clock = time.monotonic
    txn_s = (transaction_ms or 0) / 1000
    txn_start = 0.0
    in_txn = 0
    transactions = 0
    start = clock()
    for _ in range(n):
        if txn and in_txn == 0:
            p.begin_transaction()
            txn_start = clock()
        while True:
            try:
                p.produce(topic, payload, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
        if txn:
            in_txn += 1
            if txn_s <= clock() - txn_start:
                p.commit_transaction(600)
                transactions += 1
                in_txn = 0
    if in_txn:
        p.commit_transaction(600)
        transactions += 1
    p.flush(600)
    elapsed = clock() - start
    return {**_figures("librdkafka", errors, n, record_size, elapsed), "transactions": transactions}


def _figures(client: str, errors: list, n: int, record_size: int, elapsed: float) -> dict:
    if errors:
        raise RuntimeError(f"{client}: {len(errors)} errors, first {errors[0]}")
    return {"records": n, "elapsed_s": elapsed, "records_per_sec": n / elapsed,
            "mb_per_sec": n * record_size / elapsed / 1048576}


def oncelog_produce(bootstrap: str, topic: str, n: int, record_size: int, api: str = "produce",
                    transaction_ms: int | None = None, transactional_id: str | None = None,
                    **extra) -> dict:
    """The same loop as librdkafka_produce, through oncelog's producer (same settings): `produce`
    (confluent-kafka's call: a delivery callback, no future) or `send` (a future per record
    as well as the callback); transactions as there."""
    from oncelog.client import Producer
    conf = {"bootstrap.servers": bootstrap, "enable.idempotence": "required", "acks": "all",
            "linger.ms": "5", "batch.size": "16384", "buffer.memory": str(256 << 20),
            "max.request.size": str(4 << 20)}
    txn = transaction_ms is not None
    if txn:
        conf["transactional.id"] = transactional_id or f"bench-oncelog-{topic}"
    conf.update({k: str(v) for k, v in extra.items()})
    payload = os.urandom(record_size)
    errors = []

    def cb(err, msg):
        if err is not None:
            errors.append(err)
    transactions = 0
    with Producer(conf) as p:
        if txn:
            p.init_transactions(60)
            p.begin_transaction()
        p.produce(topic, payload, on_delivery=cb)
        if txn:
            p.commit_transaction(60)
        p.flush(60)
        call = p.produce if api == "produce" else p.send
        clock = time.monotonic
        start = clock()
        if not txn:
            for _ in range(n):
                call(topic, payload, on_delivery=cb)
        else:
            txn_s = (transaction_ms or 0) / 1000
            txn_start = 0.0
            in_txn = 0
            for _ in range(n):
                if in_txn == 0:
                    p.begin_transaction()
                    txn_start = clock()
                call(topic, payload, on_delivery=cb)
                in_txn += 1
                if txn_s <= clock() - txn_start:
                    p.commit_transaction(600)
                    transactions += 1
                    in_txn = 0
            if in_txn:
                p.commit_transaction(600)
                transactions += 1
        p.flush(600)
        elapsed = clock() - start
    return {**_figures("oncelog", errors, n, record_size, elapsed), "transactions": transactions}


def high_rtt(args, windows: list[int], data: str, standin: dict | None, results: dict) -> None:
    """KIP-1269's table: oncelog at each window and librdkafka, through a delay proxy."""
    per_batch = 16384 // (args.record_size + 20)
    proxy_port = free_port()
    broker = server(data, {"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy_port}"}, standin)
    delay = FaultConfig(latency_ms_up=args.rtt_ms / 2, latency_ms_down=args.rtt_ms / 2)
    proxy = FaultProxyProcess(broker.bootstrap, delay, port=proxy_port).start()
    boot = proxy.bootstrap
    try:
        if standin is None:
            admin = AdminClient({"bootstrap.servers": boot})
        else:
            admin = None   # the stand-in creates topics on first use
        with admin or _Nothing() as admin:
            for w in windows:
                topic = f"inflight-{w}"
                admin.create_topics([topic], config={"producer.state.batches.to.retain": str(max(w, 5))},
                                    exist_ok=True)[topic].result()
            admin.create_topics(["inflight-librdkafka"], exist_ok=True)["inflight-librdkafka"].result()
        for w in windows:
            n = max(500, int(w * per_batch * args.seconds * 1000 / args.rtt_ms))
            r = run_produce(f"inflight-{w}", n, args.record_size, -1, {
                "bootstrap.servers": boot, "acks": "all", "enable.idempotence": "required",
                "max.in.flight.requests.per.connection": str(w), "linger.ms": "5",
                "batch.size": "16384", "buffer.memory": str(256 << 20)}, progress=False)
            r.pop("line")
            results["high_rtt"][f"oncelog-{w}"] = r
            print(f"oncelog   window {w:>3}: {r['records_per_sec']:10.1f} records/sec "
                  f"({r['mb_per_sec']:.2f} MB/sec), learned window {r['window']}", flush=True)
        n = max(500, int(5 * per_batch * args.seconds * 1000 / args.rtt_ms))
        r = librdkafka_produce(boot, "inflight-librdkafka", n, args.record_size)
        results["high_rtt"]["librdkafka"] = r
        print(f"librdkafka (max 5) : {r['records_per_sec']:10.1f} records/sec "
              f"({r['mb_per_sec']:.2f} MB/sec)", flush=True)
        # context, not the comparison: librdkafka's own default batch.size (1 MB)
        r = librdkafka_produce(boot, "inflight-librdkafka", 20000, args.record_size,
                               **{"batch.size": 1000000})
        results["librdkafka_default_batch"] = r
        print(f"librdkafka, batch.size 1 MB (context): {r['records_per_sec']:10.1f} records/sec",
              flush=True)
    finally:
        proxy.stop()
        broker.stop()


def low_latency(args, data: str, standin: dict | None, results: dict) -> None:
    """oncelog vs librdkafka without the proxy: the same loop, alternated over rounds."""
    # a broker of its own, without the proxy in its address
    broker = server(data, {}, standin)
    try:
        n = args.low_latency_records
        # the same loop for both clients (produce with a delivery callback, then flush),
        # alternated over rounds on fresh topics; the best round of each is compared
        runs: dict[str, list] = {"oncelog": [], "librdkafka": [], "oncelog-send": []}
        with AdminClient({"bootstrap.servers": broker.bootstrap}) as admin:
            for created in admin.create_topics([f"lowlat-{c}-{i}" for c in runs for i in range(args.rounds)],
                                    exist_ok=True).values():
                created.result()
        big = {"batch.size": 262144}
        for i in range(args.rounds):
            runs["oncelog"].append(oncelog_produce(broker.bootstrap, f"lowlat-oncelog-{i}", n,
                                                   args.record_size, **big))
            runs["librdkafka"].append(librdkafka_produce(
                broker.bootstrap, f"lowlat-librdkafka-{i}", n, args.record_size, **big))
            runs["oncelog-send"].append(oncelog_produce(
                broker.bootstrap, f"lowlat-oncelog-send-{i}", n, args.record_size, "send", **big))
            print(f"  round {i + 1}: " + ", ".join(
                f"{c} {v[-1]['records_per_sec']:.0f}" for c, v in runs.items()) + " rec/s", flush=True)
        best = {c: max(v, key=lambda x: x["records_per_sec"]) for c, v in runs.items()}
        results["low_latency"].update(best)
        results["low_latency"]["rounds"] = {c: [x["records_per_sec"] for x in v] for c, v in runs.items()}
        lib = best["librdkafka"]["records_per_sec"]
        ratio = best["oncelog"]["records_per_sec"] / lib
        results["low_latency"]["ratio"] = ratio
        results["low_latency"]["ratio_send"] = best["oncelog-send"]["records_per_sec"] / lib
        paired = [a["records_per_sec"] / b["records_per_sec"]
                  for a, b in zip(runs["oncelog"], runs["librdkafka"])]
        results["low_latency"]["paired_ratios"] = paired
        print(f"low latency: oncelog produce {best['oncelog']['records_per_sec']:.0f} rec/s, "
              f"librdkafka {lib:.0f} rec/s, ratio {ratio:.2f} (rounds: "
              + ", ".join(f"{r:.2f}" for r in paired) + f"); oncelog send "
              f"{best['oncelog-send']['records_per_sec']:.0f} rec/s, ratio "
              f"{results['low_latency']['ratio_send']:.2f}", flush=True)
    finally:
        broker.stop()


def high_rtt_txn(args, windows: list[int], data: str, results: dict) -> None:
    """The seed's table as it ran it: transactional producers through the delay proxy, each
    beside its idempotent run (same broker, same proxy, alternated per producer)."""
    per_batch = 16384 // (args.record_size + 20)
    proxy_port = free_port()
    broker = server(data, {"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy_port}"})
    delay = FaultConfig(latency_ms_up=args.rtt_ms / 2, latency_ms_down=args.rtt_ms / 2)
    proxy = FaultProxyProcess(broker.bootstrap, delay, port=proxy_port).start()
    boot = proxy.bootstrap
    tid, ms = args.transactional_id, args.transaction_duration_ms
    out = results["high_rtt_txn"]
    try:
        with AdminClient({"bootstrap.servers": boot}) as admin:
            for w in windows:
                for mode in ("idempotent", "transactional", "transactional-v1"):
                    topic = f"inflight-{mode}-{w}"
                    admin.create_topics([topic], config={"producer.state.batches.to.retain": str(max(w, 5))},
                                        exist_ok=True)[topic].result()
            for created in admin.create_topics(["inflight-librdkafka-idempotent",
                                     "inflight-librdkafka-transactional"], exist_ok=True).values():
                created.result()
        for w in windows:
            n = max(500, int(w * per_batch * args.seconds * 1000 / args.rtt_ms))
            props = {"bootstrap.servers": boot, "acks": "all", "enable.idempotence": "required",
                     "max.in.flight.requests.per.connection": str(w), "linger.ms": "5",
                     "batch.size": "16384", "buffer.memory": str(256 << 20)}
            row = {}
            for mode in ("idempotent", "transactional", "transactional-v1"):
                txn = {"transactional_id": f"{tid}-oncelog-{mode}-{w}", "transaction_duration_ms": ms} \
                    if mode != "idempotent" else {}
                r = run_produce(f"inflight-{mode}-{w}", n, args.record_size, -1,
                                {**props, **(V1 if mode == "transactional-v1" else {})},
                                progress=False, **txn)
                row[mode] = {k: v for k, v in r.items() if k != "line"}
            out[f"oncelog-{w}"] = row
            _print_pair(f"oncelog   window {w:>3}", row)
        n = max(500, int(5 * per_batch * args.seconds * 1000 / args.rtt_ms))
        row = {"idempotent": librdkafka_produce(boot, "inflight-librdkafka-idempotent", n,
                                                args.record_size),
               "transactional": librdkafka_produce(boot, "inflight-librdkafka-transactional", n,
                                                   args.record_size, transaction_ms=ms,
                                                   transactional_id=f"{tid}-librdkafka")}
        out["librdkafka"] = row
        _print_pair("librdkafka (max 5)  ", row)
    finally:
        proxy.stop()
        broker.stop()


def _print_pair(label: str, row: dict) -> None:
    i, t = row["idempotent"], row["transactional"]
    v1 = row.get("transactional-v1")
    print(f"{label}: idempotent {i['records_per_sec']:9.1f}, transactional "
          f"{t['records_per_sec']:9.1f} records/sec ({t['mb_per_sec']:.2f} MB/sec, "
          f"{t['transactions']} transactions), transactional/idempotent "
          f"{t['records_per_sec'] / i['records_per_sec']:.2f}"
          + ("" if v1 is None else f"; V1 {v1['records_per_sec']:9.1f} ({v1['transactions']} "
             f"transactions), V2/V1 {t['records_per_sec'] / v1['records_per_sec']:.2f}"), flush=True)


def low_latency_txn(args, data: str, results: dict) -> None:
    """The cost of transactions at low latency: idempotent vs transactional throughput of
    oncelog and librdkafka on one broker without the proxy, alternated over rounds."""
    broker = server(data, {})
    durations = [int(d) for d in args.low_latency_durations.split(",")]
    modes = [("idempotent", None, {})] + [(f"txn-{d}ms", d, {}) for d in durations]
    client_modes = {"oncelog": modes + [(f"txn-{d}ms-v1", d, V1) for d in durations], "librdkafka": modes}
    n = args.low_latency_records
    big = {"batch.size": 262144}
    runs: dict[str, dict[str, list]] = {c: {m: [] for m, _, _ in ms} for c, ms in client_modes.items()}
    try:
        with AdminClient({"bootstrap.servers": broker.bootstrap}) as admin:
            for created in admin.create_topics([f"lowlat-{c}-{m}-{i}" for c in runs for m in runs[c]
                                     for i in range(args.rounds)]
                                    + [f"lowlat-{c}-warmup" for c in runs], exist_ok=True).values():
                created.result()
        for c, fn in (("oncelog", oncelog_produce), ("librdkafka", librdkafka_produce)):
            # not counted: the first runs on a fresh broker (empty page cache, no writeback yet)
            # are faster than any later one
            fn(broker.bootstrap, f"lowlat-{c}-warmup", n // 2, args.record_size, **big)
        for i in range(args.rounds):
            # a client's modes back to back, in the reverse order every other round, so that a
            # drift of the machine's load weighs on idempotent and transactional runs alike
            for c, fn in (("oncelog", oncelog_produce), ("librdkafka", librdkafka_produce)):
                ms = client_modes[c]
                for m, d, extra in (ms if i % 2 == 0 else ms[::-1]):
                    topic = f"lowlat-{c}-{m}-{i}"
                    runs[c][m].append(fn(broker.bootstrap, topic, n, args.record_size,
                                         transaction_ms=d, transactional_id=f"{args.transactional_id}-{c}",
                                         **big, **extra))
            print(f"  round {i + 1}: " + "; ".join(
                f"{c} " + ", ".join(f"{m} {v[-1]['records_per_sec']:.0f}" for m, v in r.items())
                for c, r in runs.items()) + " rec/s", flush=True)
    finally:
        broker.stop()
    summary: dict = {"rounds": {c: {m: [x["records_per_sec"] for x in v] for m, v in r.items()}
                                for c, r in runs.items()},
                     "transactions": {c: {m: [x["transactions"] for x in v] for m, v in r.items()}
                                      for c, r in runs.items()}}
    for c, r in runs.items():
        best = {m: max(x["records_per_sec"] for x in v) for m, v in r.items()}
        summary[c] = best
        for m in list(r)[1:]:
            paired = [t["records_per_sec"] / i["records_per_sec"]
                      for t, i in zip(r[m], r["idempotent"])]
            summary.setdefault("ratios", {}).setdefault(c, {})[m] = {
                "best": best[m] / best["idempotent"], "paired": paired,
                "median_paired": statistics.median(paired)}
            print(f"low latency {c:>10} {m}: best {best[m]:.0f} rec/s vs idempotent "
                  f"{best['idempotent']:.0f}, transactional/idempotent {best[m] / best['idempotent']:.2f} "
                  f"best against best, median of rounds {statistics.median(paired):.2f} (rounds: "
                  + ", ".join(f"{x:.2f}" for x in paired) + "); transactions per run: "
                  + ", ".join(str(x["transactions"]) for x in r[m]), flush=True)
    for m, _, _ in modes:
        summary.setdefault("oncelog_vs_librdkafka", {})[m] = summary["oncelog"][m] / summary["librdkafka"][m]
    print("oncelog/librdkafka (best of each): " + ", ".join(
        f"{m} {v:.2f}" for m, v in summary["oncelog_vs_librdkafka"].items()), flush=True)
    r = runs["oncelog"]
    for d in durations:
        v2, v1 = f"txn-{d}ms", f"txn-{d}ms-v1"
        paired = [a["records_per_sec"] / b["records_per_sec"] for a, b in zip(r[v2], r[v1])]
        summary.setdefault("v2_vs_v1", {})[v2] = {"best": summary["oncelog"][v2] / summary["oncelog"][v1],
                                                   "paired": paired, "median_paired": statistics.median(paired)}
        print(f"oncelog V2/V1, transactions of {d} ms: best against best "
              f"{summary['oncelog'][v2] / summary['oncelog'][v1]:.2f}, median of rounds "
              f"{statistics.median(paired):.2f} (rounds: {', '.join(f'{x:.2f}' for x in paired)})", flush=True)
    results["low_latency_txn"] = summary


def main_txn(args, windows: list[int]) -> None:
    results: dict = {"rtt_ms": args.rtt_ms, "record_size": args.record_size, "high_rtt_txn": {},
                     "transaction_duration_ms": args.transaction_duration_ms,
                     "load_average_before": os.getloadavg()}
    print(f"transactional mode, transaction.duration {args.transaction_duration_ms} ms; load "
          f"average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as data:
        if args.only != "low-latency":
            high_rtt_txn(args, windows, os.path.join(data, "rtt"), results)
        if args.only != "high-rtt":
            low_latency_txn(args, os.path.join(data, "low"), results)
    results["load_average_after"] = os.getloadavg()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    hr = results["high_rtt_txn"]
    if "oncelog-20" in hr and "oncelog-5" in hr:
        a = hr["oncelog-20"]["transactional"]["records_per_sec"]
        print(f"transactional: window 20 / window 5 = "
              f"{a / hr['oncelog-5']['transactional']['records_per_sec']:.2f}x; window 20 / "
              f"librdkafka = {a / hr['librdkafka']['transactional']['records_per_sec']:.2f}x")
    if hr:
        print("oncelog V2/V1 at the high round trip: " + ", ".join(
            f"{k} {row['transactional']['records_per_sec'] / row['transactional-v1']['records_per_sec']:.2f}"
            for k, row in hr.items() if "transactional-v1" in row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    plot_txn(results, args.png if args.png != PNG else PNG_TXN)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rtt-ms", type=float, default=50)
    ap.add_argument("--seconds", type=float, default=4, help="target duration of each high-RTT run")
    ap.add_argument("--record-size", type=int, default=1000)
    ap.add_argument("--low-latency-records", type=int, default=200000)
    ap.add_argument("--rounds", type=int, default=3, help="low-latency rounds per client")
    ap.add_argument("--png", default=PNG, help=f"default {PNG}, {PNG_TXN} with --transactional-id")
    ap.add_argument("--json", default=None)
    ap.add_argument("--windows", default=",".join(map(str, WINDOWS)))
    ap.add_argument("--only", choices=["high-rtt", "low-latency"], default=None,
                    help="run one of the two parts")
    ap.add_argument("--broker", choices=["oncelog", "standin"], default="oncelog",
                    help="standin = bench/inflight_broker.py (in memory, oncelog's dedup core)")
    ap.add_argument("--transactional-id", default=None,
                    help="transactional producers (ids derived from this), beside idempotent ones")
    ap.add_argument("--transaction-duration-ms", type=int, default=3000,
                    help="with --transactional-id: commit once a transaction is this old (Kafka's default)")
    ap.add_argument("--low-latency-durations", default="3000,100,10",
                    help="with --transactional-id: transaction durations (ms) of the low-latency part")
    args = ap.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    if args.transactional_id is not None:
        if args.broker != "oncelog":
            ap.error("--transactional-id needs --broker oncelog (the stand-in has no coordinator)")
        main_txn(args, windows)
        return
    results: dict = {"rtt_ms": args.rtt_ms, "record_size": args.record_size, "high_rtt": {},
                     "low_latency": {}, "broker": args.broker}
    print(f"broker: {args.broker}", flush=True)
    standin = {f"inflight-{w}": max(w, 5) for w in windows} if args.broker == "standin" else None
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as data:
        if args.only != "low-latency":
            high_rtt(args, windows, data, standin, results)
        if args.only != "high-rtt":
            low_latency(args, data, standin, results)

    hr = results["high_rtt"]
    if "oncelog-20" in hr and "oncelog-5" in hr:
        a = hr["oncelog-20"]["records_per_sec"]
        print(f"window 20 / window 5 = {a / hr['oncelog-5']['records_per_sec']:.2f}x; "
              f"window 20 / librdkafka = {a / hr['librdkafka']['records_per_sec']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if results["high_rtt"]:
        plot(results, args.png)


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    hr = results["high_rtt"]
    labels = [k.replace("oncelog-", "oncelog\nW=") for k in hr]
    values = [v["records_per_sec"] for v in hr.values()]
    colors = ["#3b7dd8" if k.startswith("oncelog") else "#d8703b" for k in hr]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    bars = ax.bar(labels, values, color=colors)
    for b, v in zip(bars, values):
        ax.annotate(f"{v:,.0f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("records/sec (1 KB records)")
    ax.set_title(f"Idempotent producer throughput at {results['rtt_ms']:.0f} ms round trip "
                 f"(batch.size 16384, broker: {results['broker']})", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def plot_txn(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    hr = results.get("high_rtt_txn") or {}
    ll = results.get("low_latency_txn")
    panels = [p for p in (hr, ll) if p]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    axes = list(axes[0])
    if hr:
        ax = axes.pop(0)
        labels = [k.replace("oncelog-", "oncelog\nW=").replace("librdkafka", "librdkafka\n(max 5)")
                  for k in hr]
        x = range(len(labels))
        for off, mode, color in ((-0.27, "idempotent", "#9bbbe8"), (0, "transactional", "#3b7dd8"),
                                 (0.27, "transactional-v1", "#d8703b")):
            vals = [row[mode]["records_per_sec"] if mode in row else 0 for row in hr.values()]
            bars = ax.bar([i + off for i in x], vals, width=0.27, color=color,
                          label={"transactional": "transactional (V2)", "transactional-v1": "transactional V1"}
                          .get(mode, mode))
            for b, v in zip(bars, vals):
                ax.annotate(f"{v:,.0f}", (b.get_x() + b.get_width() / 2, v), ha="center",
                            va="bottom", fontsize=7)
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.set_ylabel("records/sec (1 KB records)")
        ax.set_title(f"{results['rtt_ms']:.0f} ms round trip, batch.size 16384, transactions of "
                     f"{results['transaction_duration_ms']} ms", fontsize=9)
        ax.legend(fontsize=8)
    if ll:
        ax = axes.pop(0)
        clients = ["oncelog", "librdkafka"]
        modes = list(ll["oncelog"])
        width = 0.8 / len(modes)
        shades = ["#bbbbbb", "#3b7dd8", "#d8703b", "#59a14f", "#9c6ade", "#edc948", "#76b7b2", "#ff9da7"]
        for j, m in enumerate(modes):
            # the median round with the range of rounds: single rounds move with the machine
            rounds = [ll["rounds"][c].get(m) or [0] for c in clients]
            vals = [statistics.median(r) for r in rounds]
            err = [[v - min(r) for v, r in zip(vals, rounds)], [max(r) - v for v, r in zip(vals, rounds)]]
            pos = [i - 0.4 + width * (j + 0.5) for i in range(len(clients))]
            bars = ax.bar(pos, vals, width=width, color=shades[j % len(shades)], label=m,
                          yerr=err, capsize=3, ecolor="#555555")
            for b, v in zip(bars, vals):
                ax.annotate(f"{v:,.0f}", (b.get_x() + b.get_width() / 2, v), ha="right",
                            va="bottom", fontsize=7)
        ax.set_xticks(range(len(clients)), clients)
        ax.set_ylabel("records/sec, median round, bars = range (1 KB records)")
        ax.set_title("No proxy, batch.size 262144: idempotent vs transactions of N ms", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()

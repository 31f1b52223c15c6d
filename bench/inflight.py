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
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from oncelog.client import AdminClient
from oncelog.testing.embedded import BrokerProcess, ServerProcess, free_port
from oncelog.testing.fault_proxy import FaultConfig, FaultProxyProcess
from oncelog.testing.perf import run_produce

WINDOWS = [1, 5, 10, 20, 50]


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

    def create_topics(self, *a, **kw):
        pass


def librdkafka_produce(bootstrap: str, topic: str, n: int, record_size: int, **extra) -> dict:
    import confluent_kafka
    conf = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "batch.size": 16384, "queue.buffering.max.messages": 1000000,
            "queue.buffering.max.kbytes": 2097151}
    conf.update(extra)
    p = confluent_kafka.Producer(conf)
    payload = os.urandom(record_size)
    errors = []

    def cb(err, msg):
        if err is not None:
            errors.append(err)
    p.produce(topic, payload, on_delivery=cb)
    p.flush(60)
    start = time.monotonic()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, payload, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    p.flush(600)
    elapsed = time.monotonic() - start
    return _figures("librdkafka", errors, n, record_size, elapsed)


def _figures(client: str, errors: list, n: int, record_size: int, elapsed: float) -> dict:
    if errors:
        raise RuntimeError(f"{client}: {len(errors)} errors, first {errors[0]}")
    return {"records": n, "elapsed_s": elapsed, "records_per_sec": n / elapsed,
            "mb_per_sec": n * record_size / elapsed / 1048576}


def oncelog_produce(bootstrap: str, topic: str, n: int, record_size: int, api: str = "produce",
                    **extra) -> dict:
    """The same loop as librdkafka_produce, through oncelog's producer (same settings): `produce`
    (confluent-kafka's call: a delivery callback, no future) or `send` (a future per record
    as well as the callback)."""
    from oncelog.client import Producer
    conf = {"bootstrap.servers": bootstrap, "enable.idempotence": "required", "acks": "all",
            "linger.ms": "5", "batch.size": "16384", "buffer.memory": str(256 << 20),
            "max.request.size": str(4 << 20)}
    conf.update({k: str(v) for k, v in extra.items()})
    payload = os.urandom(record_size)
    errors = []

    def cb(err, msg):
        if err is not None:
            errors.append(err)
    with Producer(conf) as p:
        p.produce(topic, payload, on_delivery=cb)
        p.flush(60)
        start = time.monotonic()
        call = p.produce if api == "produce" else p.send
        for _ in range(n):
            call(topic, payload, on_delivery=cb)
        p.flush(600)
        elapsed = time.monotonic() - start
    return _figures("oncelog", errors, n, record_size, elapsed)


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
                admin.create_topics([f"inflight-{w}"], config={
                    "producer.state.batches.to.retain": str(max(w, 5))}, exist_ok=True)
            admin.create_topics(["inflight-librdkafka"], exist_ok=True)
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
            admin.create_topics([f"lowlat-{c}-{i}" for c in runs for i in range(args.rounds)],
                                exist_ok=True)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rtt-ms", type=float, default=50)
    ap.add_argument("--seconds", type=float, default=4, help="target duration of each high-RTT run")
    ap.add_argument("--record-size", type=int, default=1000)
    ap.add_argument("--low-latency-records", type=int, default=200000)
    ap.add_argument("--rounds", type=int, default=3, help="low-latency rounds per client")
    ap.add_argument("--png", default="docs/bench-inflight.png")
    ap.add_argument("--json", default=None)
    ap.add_argument("--windows", default=",".join(map(str, WINDOWS)))
    ap.add_argument("--only", choices=["high-rtt", "low-latency"], default=None,
                    help="run one of the two parts")
    ap.add_argument("--broker", choices=["oncelog", "standin"], default="oncelog",
                    help="standin = bench/inflight_broker.py (in memory, oncelog's dedup core)")
    args = ap.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
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


if __name__ == "__main__":
    main()

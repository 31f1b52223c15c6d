"""Share-group consumption (KIP-932) beside a classic consumer group on the same topic, in one run.

    .venv/bin/python bench/share_groups.py [--records 50000] [--consumers 1,3,8] [--partitions 1,8]
                                           [--baseline SRC]

One `oncelog serve`; a topic per partition count filled with --records records of 100 bytes
(confluent-kafka's producer); then per consumer count, librdkafka consumers in threads of this
process read every record once:
- `share`: confluent-kafka's ShareConsumer in one share group (implicit acknowledgement: each
  poll accepts the previous one), starting at the log start (`share.auto.offset.reset=earliest`);
- `classic`: confluent-kafka's Consumer in one classic group (range assignor, auto commit), from
  the log start.
The time is from the first subscribe until the last record was read (a share group's records are
each read once by some member; a classic group's members split the partitions). Prints records/s
per cell and the ratio share / classic. A classic group cannot use more consumers than partitions:
the extra ones sit idle, while a share group's members share a partition.

--baseline SRC also starts a broker from another source tree (e.g. a checkout of main before a
change: `--baseline /path/to/main/src`) beside this tree's, fills it the same way, and runs each
cell on both brokers one after the other (baseline share, baseline classic, this share, this
classic), so that the load of the machine falls on both alike; it prints both brokers' ratios and
this tree's share records/s over the baseline's. --rounds N runs every cell N times (in turn, each
with fresh groups on the same topics) and prints the medians at the end.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from oncelog.testing.embedded import BrokerProcess


def fill(boot: str, topic: str, partitions: int, records: int) -> None:
    a = AdminClient({"bootstrap.servers": boot})
    for f in a.create_topics([NewTopic(topic, partitions, 1)]).values():
        f.result(30)
    p = Producer({"bootstrap.servers": boot, "linger.ms": 5, "batch.num.messages": 1000})
    value = b"x" * 100
    for i in range(records):
        while True:
            try:
                p.produce(topic, value=value, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0


def earliest(boot: str, group: str) -> None:
    a = AdminClient({"bootstrap.servers": boot})
    res = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    for f in a.incremental_alter_configs([res]).values():
        f.result(30)


def consume(boot: str, topic: str, kind: str, members: int, records: int, run: int) -> float:
    group = f"{kind}-{topic}-{members}-{run}"
    if kind == "share":
        earliest(boot, group)
    read = [0]
    lock = threading.Lock()
    done = threading.Event()

    def member(i: int) -> None:
        if kind == "share":
            c = ShareConsumer({"bootstrap.servers": boot, "group.id": group, "client.id": f"m{i}"})
        else:
            c = Consumer({"bootstrap.servers": boot, "group.id": group, "client.id": f"m{i}",
                          "auto.offset.reset": "earliest", "enable.auto.commit": True})
        c.subscribe([topic])
        try:
            while not done.is_set():
                if kind == "share":
                    n = sum(1 for m in c.poll(0.2) if not m.error())
                else:
                    n = sum(1 for m in c.consume(500, 0.2) if not m.error())
                if n:
                    with lock:
                        read[0] += n
                        if read[0] >= records:
                            done.set()
        finally:
            c.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(members)]
    for t in threads:
        t.start()
    done.wait(600)
    elapsed = time.perf_counter() - started
    for t in threads:
        t.join(60)
    if read[0] < records:
        raise SystemExit(f"{kind} x{members} on {topic}: {read[0]} of {records} records in 600 s")
    return records / elapsed


OVERRIDES = {"group.share.heartbeat.interval.ms": "1000", "group.consumer.heartbeat.interval.ms": "1000",
             "group.consumer.min.heartbeat.interval.ms": "1000", "group.initial.rebalance.delay.ms": "0"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--consumers", default="1,3,8")
    ap.add_argument("--partitions", default="1,8")
    ap.add_argument("--rounds", type=int, default=1, help="each cell this many times (fresh groups); medians")
    ap.add_argument("--baseline", help="another source tree's src/ whose broker runs each cell too")
    args = ap.parse_args()
    consumers = [int(x) for x in args.consumers.split(",")]
    partitions = [int(x) for x in args.partitions.split(",")]
    # (partitions, consumers) -> broker -> kind -> records/s of each round
    results: dict[tuple[int, int], dict[str, dict[str, list[float]]]] = {}
    with tempfile.TemporaryDirectory() as d:
        brokers: dict[str, BrokerProcess] = {}
        try:
            if args.baseline:
                brokers["baseline"] = BrokerProcess(Path(d) / "baseline", overrides=OVERRIDES,
                                                    env={"PYTHONPATH": args.baseline}).start(timeout_s=120)
            brokers["this"] = BrokerProcess(Path(d) / "data", overrides=OVERRIDES).start(timeout_s=120)
            print(f"{args.records} records of 100 bytes; records/s (share / classic)")
            head = f"{'partitions':>10} {'consumers':>9}"
            for name in brokers:
                head += f" {name + ' share':>15} {name + ' classic':>17} {'ratio':>6}"
            print(head + (f" {'this/base share':>16}" if args.baseline else ""))
            for parts in partitions:
                topic = f"bench-share-{parts}"
                for b in brokers.values():
                    fill(b.bootstrap, topic, parts, args.records)
            for rnd in range(args.rounds):
                for parts in partitions:
                    topic = f"bench-share-{parts}"
                    for i, n in enumerate(consumers):
                        cell = results.setdefault((parts, n), {})
                        for name, b in brokers.items():
                            for kind in ("share", "classic"):
                                rate = consume(b.bootstrap, topic, kind, n, args.records, rnd * 100 + i)
                                cell.setdefault(name, {}).setdefault(kind, []).append(rate)
                        print(_line(parts, n, cell, -1, args.baseline is not None), flush=True)
            if args.rounds > 1:
                print(f"medians of {args.rounds} rounds")
                for (parts, n), cell in results.items():
                    print(_line(parts, n, cell, None, args.baseline is not None))
        finally:
            for b in brokers.values():
                b.stop()


def _line(parts: int, n: int, cell: dict[str, dict[str, list[float]]], index: int | None, baseline: bool) -> str:
    """One cell: its last round (`index` -1) or the medians (None)."""
    def pick(xs: list[float]) -> float:
        return statistics.median(xs) if index is None else xs[index]
    line = f"{parts:>10} {n:>9}"
    for kinds in cell.values():
        share, classic = pick(kinds["share"]), pick(kinds["classic"])
        line += f" {share:>15.0f} {classic:>17.0f} {share / classic:>6.2f}"
    if baseline:
        line += f" {pick(cell['this']['share']) / pick(cell['baseline']['share']):>16.2f}"
    return line


if __name__ == "__main__":
    main()

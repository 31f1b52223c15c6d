"""Rebalance time of a consumer group, classic protocol vs KIP-848, in one run.

    .venv/bin/python bench/rebalance.py [--members 20] [--partitions 40] [--heartbeat-ms 1000] [--rounds 3]

One `oncelog serve`; librdkafka (confluent-kafka) members, each in its own thread polling, with
rebalance callbacks that record what they are given and give up. Per protocol and round, on a
fresh group:
- join: --members members subscribe at once; the time from the first subscribe until every
  partition is owned by exactly one member and the counts are balanced;
- leave: one member closes; the time until its partitions are owned by the others again, and how
  many partitions the members that stayed had to give up meanwhile (their reading stopped);
- join one: a new member subscribes; the same two figures.
Protocols: `classic` with librdkafka's default assignor (range, eager: every member gives up
everything on each rebalance), `classic-cooperative` (cooperative-sticky), `consumer` (KIP-848,
the broker's `uniform` assignor). The heartbeat interval is the same for all: the classic
members' `heartbeat.interval.ms` and the broker's `group.consumer.heartbeat.interval.ms` (Kafka's
defaults are 3000 and 5000: a rebalance takes a few heartbeats in either protocol).
Prints the median of the rounds per figure and the ratios classic / KIP-848.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog.testing.embedded import BrokerProcess

PROTOCOLS = {
    "classic": {"group.protocol": "classic", "partition.assignment.strategy": "range"},
    "classic-cooperative": {"group.protocol": "classic", "partition.assignment.strategy": "cooperative-sticky"},
    "consumer": {"group.protocol": "consumer"},
}


class Member:
    def __init__(self, name: str, bootstrap: str, group: str, topic: str, config: dict, heartbeat_ms: int) -> None:
        extra = dict(config)
        if config["group.protocol"] == "classic":
            extra.update({"heartbeat.interval.ms": heartbeat_ms, "session.timeout.ms": 45000})
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": name,
                                  "enable.auto.commit": False, **extra})
        self.cooperative = config.get("partition.assignment.strategy") == "cooperative-sticky"
        self.owned: set[int] = set()
        self.given_up = 0      # partitions given up while this member stayed
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.consumer.subscribe([topic], on_assign=self._assign, on_revoke=self._revoke, on_lost=self._revoke)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _assign(self, c, ps) -> None:
        if self.cooperative:
            c.incremental_assign(ps)
        with self.lock:
            self.owned |= {p.partition for p in ps}

    def _revoke(self, c, ps) -> None:
        if self.cooperative:
            c.incremental_unassign(ps)
        with self.lock:
            if not self.stop.is_set():
                self.given_up += len(ps)
            self.owned -= {p.partition for p in ps}

    def _run(self) -> None:
        while not self.stop.is_set():
            self.consumer.poll(0.05)
        self.consumer.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)


def settled(members: list[Member], partitions: int) -> bool:
    owned = []
    for m in members:
        with m.lock:
            owned.append(set(m.owned))
    every = [p for o in owned for p in o]
    counts = [len(o) for o in owned]
    return sorted(every) == list(range(partitions)) and max(counts) - min(counts) <= 1


def wait_settled(members: list[Member], partitions: int, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not settled(members, partitions):
        if time.monotonic() > deadline:
            raise TimeoutError("the group did not settle")
        time.sleep(0.01)


def one_round(bootstrap: str, topic: str, protocol: str, n: int, partitions: int, heartbeat_ms: int,
              group: str) -> dict[str, float]:
    config = PROTOCOLS[protocol]
    t0 = time.monotonic()
    members = [Member(f"m{i}", bootstrap, group, topic, config, heartbeat_ms) for i in range(n)]
    wait_settled(members, partitions)
    join = time.monotonic() - t0
    time.sleep(2 * heartbeat_ms / 1000)
    for m in members:
        m.given_up = 0
    leaving = members.pop()
    t0 = time.monotonic()
    leaving.close()
    wait_settled(members, partitions)
    leave = time.monotonic() - t0
    leave_given_up = sum(m.given_up for m in members)
    time.sleep(2 * heartbeat_ms / 1000)
    for m in members:
        m.given_up = 0
    t0 = time.monotonic()
    members.append(Member(f"m{n}", bootstrap, group, topic, config, heartbeat_ms))
    wait_settled(members, partitions)
    join_one = time.monotonic() - t0
    join_one_given_up = sum(m.given_up for m in members[:-1])
    for m in members:
        m.close()
    return {"join": join, "leave": leave, "leave: partitions given up by the others": leave_given_up,
            "join one": join_one, "join one: partitions given up by the others": join_one_given_up}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=20)
    ap.add_argument("--partitions", type=int, default=40)
    ap.add_argument("--heartbeat-ms", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    hb = args.heartbeat_ms
    with tempfile.TemporaryDirectory() as d:
        broker = BrokerProcess(Path(d) / "data", overrides={
            "group.consumer.min.heartbeat.interval.ms": str(min(hb, 5000)),
            "group.consumer.heartbeat.interval.ms": str(hb),
            "group.consumer.min.session.timeout.ms": str(min(45000, 10 * hb)),
            "group.consumer.session.timeout.ms": "45000"}).start()
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            topic = "rebalance"
            admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(30)
            results: dict[str, dict[str, list[float]]] = {}
            for r in range(args.rounds):
                for protocol in PROTOCOLS:  # interleaved, so that load on the machine hits all alike
                    out = one_round(broker.bootstrap, topic, protocol, args.members, args.partitions, hb,
                                    f"{protocol}-{r}")
                    for k, v in out.items():
                        results.setdefault(protocol, {}).setdefault(k, []).append(v)
                    print(f"round {r} {protocol}: " + ", ".join(f"{k} {v:.2f}" for k, v in out.items()), flush=True)
        finally:
            broker.stop()
    print(f"\n{args.members} members, {args.partitions} partitions, heartbeat {hb} ms, median of {args.rounds} rounds")
    figures = list(next(iter(results.values())))
    print(f"{'':46}" + "".join(f"{p:>22}" for p in PROTOCOLS) + f"{'classic / KIP-848':>20}")
    for f in figures:
        med = {p: statistics.median(results[p][f]) for p in PROTOCOLS}
        unit = "" if "given up" in f else " s"
        ratio = med["classic"] / med["consumer"] if med["consumer"] else float("inf")
        print(f"{f + unit:46}" + "".join(f"{med[p]:>22.2f}" for p in PROTOCOLS)
              + (f"{ratio:>20.1f}" if med["consumer"] else f"{'-':>20}"))


if __name__ == "__main__":
    main()

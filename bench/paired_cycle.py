"""Two source trees of the broker, side by side, on one small durable Produce at a time: the
cycle (request sent to answer read) of each, paired. One client alternates its requests between
the two brokers (which one goes first alternates too), so each pair of samples sees the same
moment of the machine; on a VM whose speed moves by half within minutes, this is the comparison
that can tell a few percent. Run it with a tree against itself first to see the harness's own
bias.

    .venv/bin/python bench/paired_cycle.py OLD_SRC NEW_SRC [--requests 6000] [--records 16]

OLD_SRC and NEW_SRC are `src` directories (a `git worktree` of the commit before, say). Each
request is an idempotent batch of --records 1 KB records, acks=all, Produce v9, on a topic of
its broker's (fsynced before the answer). Prints each tree's mean, p50, p90 and p99 cycle and the
median of new/old over the pairs.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Iterator

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))
from broker_produce import create  # noqa: E402
from oncelog.protocol.produce import encode_request  # noqa: E402
from oncelog.protocol.records import Record, encode_batch  # noqa: E402
from oncelog.testing.embedded import BrokerProcess  # noqa: E402

VERSION = 9
HEADER = struct.Struct(">hhih")   # api key, version, correlation id, client id length (header v2)


def frames(n: int, records: int) -> Iterator[bytes]:
    """The requests, made one at a time (6,000 of 16 KB held at once would be 100 MB)."""
    now = int(time.time() * 1000)
    for i in range(n):
        batch = encode_batch([Record(j, now, None, b"x" * 1000, []) for j in range(records)],
                             producer_id=1000, producer_epoch=0, base_sequence=i * records)
        body = encode_request(VERSION, -1, 30_000, {"t": [(0, batch)]})
        header = HEADER.pack(0, VERSION, i, 5) + b"bench" + b"\x00"
        yield struct.pack(">i", len(header) + len(body)) + header + body


def cycle(sock: socket.socket, frame: bytes) -> float:
    """µs from sending `frame` to having read its whole answer."""
    t = time.perf_counter()
    sock.sendall(frame)
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    sock.recv(size, socket.MSG_WAITALL)
    return (time.perf_counter() - t) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old_src")
    ap.add_argument("new_src")
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--records", type=int, default=16)
    args = ap.parse_args()
    trees = {"old": args.old_src, "new": args.new_src}
    brokers: dict[str, BrokerProcess] = {}
    socks: dict[str, socket.socket] = {}
    try:
        for name, src in trees.items():
            data = os.path.join(tempfile.mkdtemp(prefix=f"paired-{name}-"), "data")
            broker = brokers[name] = BrokerProcess(data, {"log.segment.bytes": str(256 << 20)},
                                                   env={"PYTHONPATH": os.path.abspath(src)}).start()
            create(broker.bootstrap, "t")
            host, port = broker.bootstrap.rsplit(":", 1)
            sock = socks[name] = socket.create_connection((host, int(port)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cycles: dict[str, list[float]] = {name: [] for name in trees}
        for i, frame in enumerate(frames(args.requests, args.records)):
            for name in (("old", "new") if i % 2 == 0 else ("new", "old")):
                cycles[name].append(cycle(socks[name], frame))
        ratios = sorted(new / old for old, new in zip(cycles["old"], cycles["new"]))
        for name, values in cycles.items():
            values.sort()
            n = len(values)
            print(f"{name}: mean {statistics.mean(values):.0f} p50 {values[n // 2]:.0f} "
                  f"p90 {values[int(n * 0.9)]:.0f} p99 {values[int(n * 0.99)]:.0f} µs")
        print(f"new/old per pair: median {ratios[len(ratios) // 2]:.3f}")
    finally:
        for sock in socks.values():
            sock.close()
        for broker in brokers.values():
            broker.stop()


if __name__ == "__main__":
    main()

"""InitProducerId latency at a sustained rate, with and without KIP-730 prefetch.

    .venv/bin/python bench/init_producer_id.py [--rate 2000] [--seconds 10]

A controller process (metadata log fsynced per block) and two broker processes in one run: one
prefetches the next producer-id block at 90% use (the default), the other asks only when its
block is empty, as a broker without prefetch would. A client sends InitProducerId at --rate per
second, one at a time, and records each latency. Prints p50/p99/p99.9/max and the ratios.
"""
from __future__ import annotations

import argparse
import os
import socket
import struct
import tempfile
import time

from oncelog.client.aio import wire
from oncelog.testing.embedded import BrokerProcess, ControllerProcess, broker_overrides


def measure(bootstrap: str, rate: float, seconds: float) -> list[float]:
    host, port = bootstrap.split(":")
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    body = wire.encode_init_producer_id(4)
    latencies = []
    n = int(rate * seconds)
    start = time.perf_counter()
    for i in range(n):
        due = start + i / rate
        while time.perf_counter() < due:
            pass
        hdr = wire.request_header(22, 4, i, "bench")
        t0 = time.perf_counter()
        s.sendall(struct.pack(">i", len(hdr) + len(body)) + hdr + body)
        size = struct.unpack(">i", recv(s, 4))[0]
        data = recv(s, size)
        latencies.append((time.perf_counter() - t0) * 1000)
        code, _pid, _epoch = wire.decode_init_producer_id(4, data, wire.response_header_size(22, 4, data))
        if code not in (0, 14):
            raise RuntimeError(f"InitProducerId error {code}")
    s.close()
    return sorted(latencies)


def recv(s, n):
    buf = b""
    while len(buf) < n:
        buf += s.recv(n - len(buf))
    return buf


def pct(xs, p):
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=2000)
    ap.add_argument("--seconds", type=float, default=10)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="oncelog-pid-bench-")
    c = ControllerProcess(os.path.join(tmp, "meta")).start()
    results = {}
    try:
        for label, prefetch in (("prefetch (default)", "true"), ("no prefetch", "false")):
            b = BrokerProcess(os.path.join(tmp, label.split()[0]),
                              {**broker_overrides(c, len(results) + 1), "producer.id.block.prefetch": prefetch}).start()
            try:
                measure(b.bootstrap, args.rate, 0.5)  # warm-up
                results[label] = measure(b.bootstrap, args.rate, args.seconds)
            finally:
                b.stop()
    finally:
        c.stop()
    print(f"InitProducerId at {args.rate:.0f}/s for {args.seconds:.0f} s, one broker, controller fsyncing each block")
    for label, xs in results.items():
        print(f"{label:20s} p50 {pct(xs, .5):6.3f} ms  p99 {pct(xs, .99):6.3f} ms  "
              f"p99.9 {pct(xs, .999):6.3f} ms  max {xs[-1]:7.3f} ms  ({len(xs)} calls)")
    on, off = results["prefetch (default)"], results["no prefetch"]
    print(f"no-prefetch / prefetch: p99.9 {pct(off, .999) / pct(on, .999):.1f}x, max {off[-1] / on[-1]:.1f}x")


if __name__ == "__main__":
    main()

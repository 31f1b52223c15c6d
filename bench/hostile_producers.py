"""Broker CPU spent on a hostile client (issue 13, item 3), on a 20,000-batch log.

    .venv/bin/python bench/hostile_producers.py [--baseline-src /work/main/src]

A broker process gets a topic whose partition holds 20,000 batches, then two attacks, each sent
pipelined on one connection:
  never-seen   10,000 Produce requests from producer ids it never saw, at sequence 1
  colliding     8,000 Produce requests from new producer ids chosen to share one home slot of
                the public hash (pid * 0x9E3779B97F4A7C15) the producer-state table used before
and a reference:
  plain        10,000 Produce requests of one non-idempotent batch (what any request costs)
The broker's CPU (user + system, from /proc/<pid>/stat) is taken around each phase. Goal: each
attack under 1 s of broker CPU. `--baseline-src` runs the same against another source tree (for
example today's main) in the same run; its never-seen phase sends --baseline-never-seen requests
(each scanned the log tail) and the per-request figure is scaled to 10,000.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from oncelog.client import AdminClient
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.hostile import (colliding_producer_ids, idempotent_batch, plain_batches, process_cpu_seconds,
                                     produce)

GOAL_CPU_S = 1.0
LOG_BATCHES = 20_000


def run(src: str | None, never_seen: int, colliding: int, plain: int) -> dict[str, tuple[int, float]]:
    tmp = tempfile.TemporaryDirectory(prefix="hostile-")
    env_before = os.environ.get("PYTHONPATH")
    if src:
        os.environ["PYTHONPATH"] = src  # the broker subprocess imports oncelog from there
    try:
        b = BrokerProcess(Path(tmp.name) / "data").start()
    finally:
        if env_before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env_before
    out = {}
    try:
        with AdminClient({"bootstrap.servers": b.bootstrap}) as admin:
            admin.create_topics(["hostile"])
        answers = produce(b.bootstrap, "hostile", [plain_batches(500)] * (LOG_BATCHES // 500))
        assert all(a.error_code == 0 for a in answers)

        def phase(name, record_sets, count, expect):
            before = process_cpu_seconds(b.proc.pid)
            t0 = time.monotonic()
            answers = produce(b.bootstrap, "hostile", record_sets)
            wall = time.monotonic() - t0
            cpu = process_cpu_seconds(b.proc.pid) - before
            assert len(answers) == count and all(expect(a) for a in answers), name
            out[name] = (count, cpu, wall)

        phase("plain", (plain_batches(1) for _ in range(plain)), plain, lambda a: a.error_code == 0)
        phase("never-seen", (idempotent_batch(pid, 1) for pid in range(10**12, 10**12 + never_seen)),
              never_seen, lambda a: a.error_code == 59)
        phase("colliding", (idempotent_batch(pid, 0) for pid in colliding_producer_ids(colliding)),
              colliding, lambda a: a.error_code == 0)
    finally:
        b.stop()
        tmp.cleanup()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--never-seen", type=int, default=10_000)
    ap.add_argument("--colliding", type=int, default=8_000)
    ap.add_argument("--plain", type=int, default=10_000)
    ap.add_argument("--baseline-src", help="another source tree to compare with (e.g. /work/main/src)")
    ap.add_argument("--baseline-never-seen", type=int, default=50)
    args = ap.parse_args(argv)
    this_src = str(Path(__file__).resolve().parent.parent / "src")
    rows = [("this tree", run(this_src, args.never_seen, args.colliding, args.plain), args.never_seen)]
    if args.baseline_src:
        rows.append(("baseline", run(args.baseline_src, args.baseline_never_seen, args.colliding, args.plain),
                     args.baseline_never_seen))
    print(f"broker CPU on a {LOG_BATCHES}-batch log (user+system from /proc; wall in brackets)\n")
    print(f"{'tree':<11}{'phase':<12}{'requests':>9}{'CPU s':>9}{'us/request':>12}{'CPU s scaled':>14}")
    scaled = {}
    for label, res, _ns in rows:
        for name, (count, cpu, wall) in res.items():
            target = {"never-seen": args.never_seen, "colliding": args.colliding, "plain": args.plain}[name]
            per = cpu / count * 1e6
            scaled[(label, name)] = cpu / count * target
            print(f"{label:<11}{name:<12}{count:>9}{cpu:>9.2f}{per:>12.0f}{scaled[(label, name)]:>10.2f}"
                  f" ({wall:.1f} s)")
    for name in ("never-seen", "colliding"):
        cpu = scaled[("this tree", name)]
        line = f"\n{name}: {cpu:.2f} s of broker CPU for {args.never_seen if name == 'never-seen' else args.colliding}" \
               f" requests: goal < {GOAL_CPU_S:.0f} s {'met' if cpu < GOAL_CPU_S else 'MISSED'}"
        if ("baseline", name) in scaled:
            base = scaled[("baseline", name)]
            line += f"; baseline {base:.2f} s ({base / cpu:.0f}x)"
        print(line, end="")
    cpu_plain = scaled[("this tree", "plain")]
    print(f"\n(plain produce, the floor any request costs: {cpu_plain:.2f} s per {args.plain})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

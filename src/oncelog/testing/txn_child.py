"""A copy loop in its own process, for the `pause` fault of `oncelog verify --workload transactions`:
SIGSTOP reaches a whole client (its application thread, the client library's threads, its timers)
only when it is a process of its own. The loop is the workload's (`txn_workloads`), a member of its
client's group like the others, with its own transactional id; it records its own history, which
the run merges with the others' at the end (`History.merge`, by the machine's monotonic clock).

Parent side, `PausableLoop`: starts `python -m oncelog.testing.txn_child` with the workload's
settings as JSON on its command line; reads from its standard output when a transaction begins
(`txn 1`) and ends (`txn 0`), so that `pause` stops it in the middle of one; closing its standard
input tells it to finish; what it recorded (operations, counters, notes) comes back in a JSON file.
"""
from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from oncelog.storage.durable import replace_file
from oncelog.testing.embedded import close_stdin_and_wait
from oncelog.testing.txn_history import History, Op


class PausableLoop:
    def __init__(self, w, tid: str, seed: int) -> None:
        self.w, self.tid, self.seed = w, tid, seed
        self.name = f"{tid} (pid ?)"
        self.ops: list[Op] = []
        self.proc: subprocess.Popen | None = None
        self._inside = threading.Event()    # set while a transaction is open
        self._txns = 0
        self._out = Path(tempfile.mkstemp(prefix="oncelog-txn-child-", suffix=".json")[1])

    def start(self) -> PausableLoop:
        w = self.w
        spec = {"bootstrap": w.bootstrap, "client": w.client, "in_topic": w.in_topic, "out_topic": w.out_topic,
                "partitions": w.partitions, "records": w.records, "seed": self.seed, "tid": self.tid,
                "security": w.security, "transaction_timeout_ms": w.transaction_timeout_ms,
                "rate": w.rate, "out": str(self._out)}
        self.proc = subprocess.Popen([sys.executable, "-m", "oncelog.testing.txn_child", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.name = f"{self.tid} (pid {self.proc.pid})"
        threading.Thread(target=self._follow, name=f"follow-{self.tid}", daemon=True).start()
        return self

    def _follow(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None  # started
        for line in self.proc.stdout:
            if line.startswith(b"txn 1"):
                self._txns += 1
                self._inside.set()
            elif line.startswith(b"txn 0"):
                self._inside.clear()

    def pause(self, held_s: float) -> str:
        """SIGSTOP in the middle of a transaction (the next one to begin, if none is open), for
        `held_s`, then SIGCONT. Says where it stopped it."""
        assert self.proc is not None  # started
        inside = self._inside.wait(20)
        self.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(held_s)
        finally:
            self.proc.send_signal(signal.SIGCONT)
        return f"in its transaction #{self._txns}" if inside else "(no transaction began within 20s)"

    def stop(self, timeout_s: float = 90) -> None:
        """Tell it to finish, then take what it recorded (its operations are merged by the run)."""
        proc = self.proc
        if proc is None:
            return
        if not close_stdin_and_wait(proc, timeout_s):
            self.w.notes.append(f"HARNESS: copy loop process {self.name} did not finish; killed")
        try:
            result = json.loads(self._out.read_text())
        except (OSError, ValueError) as e:
            self.w.notes.append(f"HARNESS: copy loop process {self.name} left no result: {e!r}")
            return
        finally:
            self._out.unlink(missing_ok=True)
        self.ops = [Op.from_json(d) for d in result["ops"]]
        w = self.w
        with w.lock:
            w.stats.update(result["stats"])
            w.errors.update(result["errors"])
        w.notes.extend(result["notes"])


def main(spec: dict[str, Any]) -> None:
    """The child: one copy loop of the workload until its standard input closes."""
    from oncelog.testing.txn_workloads import LibrdkafkaLoop, OncelogLoop, TxnWorkload
    w = TxnWorkload(spec["bootstrap"], spec["client"], spec["in_topic"], spec["out_topic"], spec["partitions"],
                    spec["records"], loops=1, seed=spec["seed"], security=spec["security"],
                    transaction_timeout_ms=spec["transaction_timeout_ms"], rate=spec["rate"], history=History())
    w.started = time.monotonic()
    w.done = threading.Event()
    w.lock = threading.Lock()
    lock = threading.Lock()

    def say(inside: bool) -> None:
        with lock:
            sys.stdout.write("txn 1\n" if inside else "txn 0\n")
            sys.stdout.flush()
    w.on_txn = say
    loop_cls = OncelogLoop if w.client == "oncelog" else LibrdkafkaLoop
    loop = loop_cls(w, spec["tid"], list(range(w.partitions)), random.Random(spec["seed"])).start()
    sys.stdin.read()      # until the parent closes it
    w.done.set()
    loop.thread.join(60)
    if loop.thread.is_alive():
        w.notes.append(f"{w.client}: {loop.instance} did not stop")
    # whole or absent for the parent, which reads it once this process exited
    replace_file(spec["out"], json.dumps({"ops": [op.to_json() for op in w.history], "stats": dict(Counter(w.stats)),
                                          "errors": dict(w.errors), "notes": list(w.notes)}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
